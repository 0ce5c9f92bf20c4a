//! The project's outgoing webhooks: each subscription with its recent deliveries (state, the
//! last answer) and a replay button per delivery, a form to subscribe a URL (its signing
//! secret shown once, in the answer), and deleting. All of it is the REST API's
//! (`webhooks_out`), which is for admins: anyone else sees its refusal.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use engine::store::webhooks_out::{Delivery, Subscription};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::super::session::OrgSession;
use super::super::view::{self, Page};
use super::super::{Console, ConsoleError};
use super::act::shown;
use super::{Posted, ProjectPath, here, see_other};
use crate::http::webhooks_out::{CreatedWebhook, DeliveryList, WebhookList};

/// The deliveries shown per subscription, newest first.
const RECENT: u32 = 10;

#[derive(Debug, Serialize)]
struct WebhookView {
    #[serde(flatten)]
    webhook: Subscription,
    deliveries: Vec<Delivery>,
    more: bool,
}

/// What the page shows after a post: the new subscription with its secret, or a refusal
/// beside the form it answers (`create`, or a subscription's or delivery's id), and what was
/// asked, to fill the form again.
#[derive(Debug, Default, Serialize)]
struct Outcome {
    created: Option<CreatedWebhook>,
    refused_at: Option<String>,
    refusal: Option<String>,
    url: String,
    events: String,
}

async fn render(c: &Console, s: &OrgSession, project: &str, outcome: Outcome, status: StatusCode) -> Result<Response, ConsoleError> {
    let base = format!("/orgs/{}/projects/{project}/webhooks", s.org);
    let projects = c.projects(s).await?;
    let page = Page::of(s, format!("Webhooks · {project}"), "webhooks").project(project, projects);
    // The list is for admins: anyone else is told so, with the REST API's words.
    let (webhooks, denied) = match c.call(&s.caller, Method::GET, &base, None).await? {
        Ok(v) => {
            let list: WebhookList = serde_json::from_value(v).map_err(ConsoleError::internal)?;
            let mut views = Vec::with_capacity(list.items.len());
            for webhook in list.items {
                let d: DeliveryList = c.read(&s.caller, &format!("{base}/{}/deliveries?limit={RECENT}", webhook.subscription_id)).await?;
                views.push(WebhookView { webhook, more: d.next_cursor.is_some(), deliveries: d.items });
            }
            (views, None)
        }
        Err(r) => (Vec::new(), Some(shown(r)?.detail)),
    };
    let html = c.render("webhooks.html", ctx! { page => page, webhooks => webhooks, denied => denied, outcome => outcome })?;
    Ok(view::html(status, html))
}

pub(in super::super) async fn page(State(c): State<Console>, Path(p): Path<ProjectPath>, headers: HeaderMap, uri: Uri) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    render(&c, &s, &p.project, Outcome::default(), StatusCode::OK).await
}

pub(in super::super) async fn create(State(c): State<Console>, Path(p): Path<ProjectPath>, Posted { s, form: f }: Posted) -> Result<Response, ConsoleError> {
    let url = f.get("url").map(|u| u.trim().to_owned()).unwrap_or_default();
    let events_text = f.get("events").map(|e| e.trim().to_owned()).unwrap_or_default();
    let events: Vec<&str> = events_text.split([',', ' ', '\n']).map(str::trim).filter(|e| !e.is_empty()).collect();
    let body = json!({ "url": url, "events": Some(events).filter(|e| !e.is_empty()) });
    match c.call(&s.caller, Method::POST, &format!("/orgs/{}/projects/{}/webhooks", p.org, p.project), Some(body)).await? {
        // The secret is in this answer only; a reload shows the list without it.
        Ok(v) => {
            let created: CreatedWebhook = serde_json::from_value(v).map_err(ConsoleError::internal)?;
            render(&c, &s, &p.project, Outcome { created: Some(created), ..Outcome::default() }, StatusCode::CREATED).await
        }
        Err(r) => {
            let r = shown(r)?;
            let outcome = Outcome { refused_at: Some("create".into()), refusal: Some(r.detail), url, events: events_text, ..Outcome::default() };
            render(&c, &s, &p.project, outcome, r.status).await
        }
    }
}

/// The org of the path is `Posted`'s.
#[derive(Debug, Deserialize)]
pub(in super::super) struct WebhookPath {
    project: String,
    webhook: String,
}

#[derive(Debug, Deserialize)]
pub(in super::super) struct DeliveryPath {
    project: String,
    webhook: String,
    delivery: String,
}

/// A post about one subscription or delivery (`rest`, below the list's path), through its
/// REST route; back to the list, or the refusal beside the form of `at`.
async fn act(c: &Console, s: &OrgSession, project: &str, at: &str, rest: &str, method: Method) -> Result<Response, ConsoleError> {
    let base = format!("/orgs/{}/projects/{project}/webhooks", s.org);
    match c.call(&s.caller, method, &format!("{base}/{rest}"), None).await? {
        Ok(_) => Ok(see_other(&base)),
        Err(r) => {
            let r = shown(r)?;
            render(c, s, project, Outcome { refused_at: Some(at.to_owned()), refusal: Some(r.detail), ..Outcome::default() }, r.status).await
        }
    }
}

pub(in super::super) async fn delete(State(c): State<Console>, Path(p): Path<WebhookPath>, Posted { s, .. }: Posted) -> Result<Response, ConsoleError> {
    act(&c, &s, &p.project, &p.webhook, &view::urlencode(&p.webhook), Method::DELETE).await
}

pub(in super::super) async fn replay(State(c): State<Console>, Path(p): Path<DeliveryPath>, Posted { s, .. }: Posted) -> Result<Response, ConsoleError> {
    let rest = format!("{}/deliveries/{}/replay", view::urlencode(&p.webhook), view::urlencode(&p.delivery));
    act(&c, &s, &p.project, &p.delivery, &rest, Method::POST).await
}
