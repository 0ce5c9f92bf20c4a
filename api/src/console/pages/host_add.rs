//! "Add a host": a form that makes a registration token through the REST API and answers the
//! command to paste on the machine, token included, shown this once (a reload shows the form
//! again, not the token). The command is the CLI's own (`cli::host_command`), aimed at
//! the console's public address.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;

use super::super::oauth::base_url;
use super::super::session::OrgSession;
use super::super::view::{self, Page};
use super::super::{Console, ConsoleError};
use super::act::shown;
use super::{Posted, ProjectPath, here};
use cli::host_command;

use crate::http::hosts::Registration;

/// What was asked, to fill the form again after a refusal.
#[derive(Debug, Default, Serialize)]
struct Asked {
    name: String,
    capabilities: String,
    hours: String,
}

/// The answer to a made registration: the command, and until when its token works.
#[derive(Debug, Serialize)]
struct Made {
    command: String,
    expires_at: DateTime<Utc>,
}

async fn render(
    c: &Console, s: &OrgSession, project: &str, asked: Asked, made: Option<Made>, error: Option<String>, status: StatusCode,
) -> Result<Response, ConsoleError> {
    let projects = c.projects(s).await?;
    if !projects.iter().any(|p| p == project) {
        return Err(ConsoleError::NotFound(format!("project `{}` not found", engine::store::cap(project))));
    }
    let page = Page::of(s, format!("Add a host · {project}"), "hosts").project(project, projects);
    let html = c.render("host_add.html", ctx! { page => page, asked => asked, made => made, error => error })?;
    Ok(view::html(status, html))
}

pub(in super::super) async fn page(State(c): State<Console>, Path(p): Path<ProjectPath>, headers: HeaderMap, uri: Uri) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    let asked = Asked { hours: "24".into(), ..Asked::default() };
    render(&c, &s, &p.project, asked, None, None, StatusCode::OK).await
}

/// Capabilities as the host's `--capabilities` takes them: comma-separated, each checked as the
/// host will check it, so the command given is one that starts.
fn capabilities(text: &str) -> Result<Option<String>, String> {
    let words: Vec<&str> = text.split([',', ' ']).map(str::trim).filter(|w| !w.is_empty()).collect();
    for w in &words {
        engine::hosts::Capability::parse(w).map_err(|_| {
            format!("`{}` is not a capability: lowercase letters, digits and `:._-`, like `linux` or `harness:claude-code`", engine::store::cap(w))
        })?;
    }
    Ok(Some(words.join(",")).filter(|w| !w.is_empty()))
}

pub(in super::super) async fn create(
    State(c): State<Console>, Path(p): Path<ProjectPath>, headers: HeaderMap, Posted { s, form: f }: Posted,
) -> Result<Response, ConsoleError> {
    let text = |k: &str| f.get(k).map(|v| v.trim().to_owned()).unwrap_or_default();
    let asked = Asked { name: text("name"), capabilities: text("capabilities"), hours: text("hours") };
    let caps = match capabilities(&asked.capabilities) {
        Ok(caps) => caps,
        Err(e) => return render(&c, &s, &p.project, asked, None, Some(e), StatusCode::UNPROCESSABLE_ENTITY).await,
    };
    let Ok(hours) = asked.hours.parse::<u32>() else {
        return render(&c, &s, &p.project, asked, None, Some("the expiry is a whole number of hours".into()), StatusCode::UNPROCESSABLE_ENTITY).await;
    };
    let body = json!({ "name": asked.name, "expires_in_hours": hours });
    let path = format!("/orgs/{}/projects/{}/host-registrations", p.org, p.project);
    match c.call(&s.caller, Method::POST, &path, Some(body)).await? {
        Ok(v) => {
            let r: Registration = serde_json::from_value(v).map_err(ConsoleError::internal)?;
            let name = Some(asked.name.as_str()).filter(|n| !n.is_empty());
            let made = Made { command: host_command(&base_url(&c, &headers), &r.token, name, caps.as_deref()), expires_at: r.expires_at };
            // The token is in this answer only: the page a reload brings is the empty form.
            render(&c, &s, &p.project, Asked { hours: "24".into(), ..Asked::default() }, Some(made), None, StatusCode::CREATED).await
        }
        Err(r) => {
            let r = shown(r)?;
            render(&c, &s, &p.project, asked, None, Some(r.detail), r.status).await
        }
    }
}
