//! The project's hosts: online, offline or drained, capabilities, slots in use and the step
//! each runs, with drain, undrain and deregister forms (the REST routes decide who may). The
//! list is the REST API's; the steps held are one indexed read (`steps_by_holder`) for the
//! whole page.

use std::collections::HashMap;

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use chrono::{DateTime, Utc};
use engine::ids::{RunId, StepId};
use serde::{Deserialize, Serialize};

use super::super::session::OrgSession;
use super::super::view::{self, Page};
use super::super::{Console, ConsoleError};
use super::act::shown;
use super::{FormMap, ProjectPath, here, see_other};
use crate::http::hosts::{Host, HostList};

/// A host counts as online when it reported this recently (it reports every 10 s at most).
const ONLINE_SECS: i64 = 60;

/// The steps the hosts hold ($1 org, $2 holder strings `host:<id>`).
pub(crate) const HELD_SQL: &str = "SELECT holder, step_id, run_id, node, state FROM steps \
     WHERE holder = ANY($2) AND state IN ('leased', 'running') AND org_id = $1 ORDER BY created_at";

#[derive(Debug, Serialize, sqlx::FromRow)]
struct Held {
    holder: String,
    step_id: StepId,
    run_id: RunId,
    node: String,
    state: String,
}

/// A host as the page shows it: the API's host, with its status and the steps it holds.
#[derive(Debug, Serialize)]
struct HostView {
    #[serde(flatten)]
    host: Host,
    /// `drained` (it claims nothing new, whether or not it reports), `online` or `offline`.
    status: &'static str,
    steps: Vec<Held>,
}

fn status(last_seen_at: Option<DateTime<Utc>>, drained: bool, now: DateTime<Utc>) -> &'static str {
    if drained {
        "drained"
    } else if last_seen_at.is_some_and(|t| (now - t).num_seconds() < ONLINE_SECS) {
        "online"
    } else {
        "offline"
    }
}

/// The page, with a REST refusal shown beside the form of the host it was about.
async fn render(c: &Console, s: &OrgSession, project: &str, refused: Option<(String, String)>, code: StatusCode) -> Result<Response, ConsoleError> {
    let list: HostList = c.read(&s.caller, &format!("/orgs/{}/projects/{project}/hosts?limit=200", s.org)).await?;
    let holders: Vec<String> = list.items.iter().map(|h| format!("host:{}", h.id)).collect();
    let held: Vec<Held> = if holders.is_empty() { Vec::new() } else { sqlx::query_as(HELD_SQL).bind(s.caller.org).bind(&holders).fetch_all(c.db()).await? };
    let mut by_holder: HashMap<String, Vec<Held>> = HashMap::new();
    for h in held {
        by_holder.entry(h.holder.clone()).or_default().push(h);
    }
    let now = Utc::now();
    let hosts: Vec<HostView> = list
        .items
        .into_iter()
        .map(|host| HostView {
            steps: by_holder.remove(&format!("host:{}", host.id)).unwrap_or_default(),
            status: status(host.last_seen_at, host.drained_at.is_some(), now),
            host,
        })
        .collect();
    let projects = c.projects(s).await?;
    let page = Page::of(s, format!("Hosts · {project}"), "hosts").project(project, projects);
    let (refused_host, refusal) = refused.unzip();
    let html = c.render("hosts.html", ctx! { page => page, hosts => hosts, refused_host => refused_host, refusal => refusal })?;
    Ok(view::html(code, html))
}

pub(in super::super) async fn page(State(c): State<Console>, Path(p): Path<ProjectPath>, headers: HeaderMap, uri: Uri) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    render(&c, &s, &p.project, None, StatusCode::OK).await
}

#[derive(Debug, Deserialize)]
pub(in super::super) struct HostPath {
    org: String,
    project: String,
    host: String,
}

/// Drain, undrain or deregister, through the REST route; back to the list.
async fn act(c: &Console, p: &HostPath, headers: &HeaderMap, uri: &Uri, f: &FormMap, method: Method, verb: Option<&str>) -> Result<Response, ConsoleError> {
    let s = c.session(headers, &p.org, &here(uri)).await?;
    s.check(headers, f.get("_csrf").map(String::as_str))?;
    let base = format!("/orgs/{}/projects/{}/hosts/{}", p.org, p.project, view::urlencode(&p.host));
    let path = verb.map_or_else(|| base.clone(), |v| format!("{base}/{v}"));
    match c.call(&s.caller, method, &path, None).await? {
        Ok(_) => Ok(see_other(&format!("/orgs/{}/projects/{}/hosts", p.org, p.project))),
        Err(r) => {
            let r = shown(r)?;
            render(c, &s, &p.project, Some((p.host.clone(), r.detail)), r.status).await
        }
    }
}

pub(in super::super) async fn drain(
    State(c): State<Console>, Path(p): Path<HostPath>, headers: HeaderMap, uri: Uri, Form(f): Form<FormMap>,
) -> Result<Response, ConsoleError> {
    act(&c, &p, &headers, &uri, &f, Method::POST, Some("drain")).await
}

pub(in super::super) async fn undrain(
    State(c): State<Console>, Path(p): Path<HostPath>, headers: HeaderMap, uri: Uri, Form(f): Form<FormMap>,
) -> Result<Response, ConsoleError> {
    act(&c, &p, &headers, &uri, &f, Method::POST, Some("undrain")).await
}

pub(in super::super) async fn deregister(
    State(c): State<Console>, Path(p): Path<HostPath>, headers: HeaderMap, uri: Uri, Form(f): Form<FormMap>,
) -> Result<Response, ConsoleError> {
    act(&c, &p, &headers, &uri, &f, Method::DELETE, None).await
}
