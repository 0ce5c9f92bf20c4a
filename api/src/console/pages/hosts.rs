//! The project's hosts: online or offline, capabilities, slots in use and the step each runs.
//! The list is the REST API's; the steps held are one indexed read (`steps_by_holder`) for the
//! whole page.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use chrono::{DateTime, Utc};
use engine::ids::{RunId, StepId};
use serde::Serialize;

use super::super::view::Page;
use super::super::{Console, ConsoleError};
use super::{here, ProjectPath};
use crate::http::hosts::HostList;

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

#[derive(Debug, Serialize)]
struct HostView {
    name: String,
    online: bool,
    capabilities: Vec<String>,
    max_concurrent: i32,
    last_seen_at: Option<DateTime<Utc>>,
    steps: Vec<Held>,
}

pub(in super::super) async fn page(State(c): State<Console>, Path(p): Path<ProjectPath>, headers: HeaderMap, uri: Uri) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    let list: HostList = c.read(&s.caller, &format!("/orgs/{}/projects/{}/hosts?limit=200", p.org, p.project)).await?;
    let holders: Vec<String> = list.items.iter().map(|h| format!("host:{}", h.id)).collect();
    let mut held: Vec<Held> = if holders.is_empty() {
        Vec::new()
    } else {
        sqlx::query_as(HELD_SQL).bind(s.caller.org).bind(&holders).fetch_all(c.db()).await?
    };
    let now = Utc::now();
    let hosts: Vec<HostView> = list
        .items
        .into_iter()
        .map(|h| {
            let me = format!("host:{}", h.id);
            let (mine, rest): (Vec<Held>, Vec<Held>) = std::mem::take(&mut held).into_iter().partition(|s| s.holder == me);
            held = rest;
            HostView {
                online: h.last_seen_at.is_some_and(|t| (now - t).num_seconds() < ONLINE_SECS),
                name: h.name,
                capabilities: h.capabilities,
                max_concurrent: h.max_concurrent,
                last_seen_at: h.last_seen_at,
                steps: mine,
            }
        })
        .collect();
    let projects = c.projects(&s).await?;
    let page = Page::of(&s, format!("Hosts · {}", p.project), "hosts").project(&p.project, projects);
    c.page("hosts.html", ctx! { page => page, hosts => hosts })
}
