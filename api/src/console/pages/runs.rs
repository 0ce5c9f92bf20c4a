//! The runs of a project, newest first, with filters (status, substate, workflow, item, dry runs
//! apart, a time window) and keyset paging. The list is the REST API's (`GET …/runs`), so its filters,
//! cursors and substates are the API's own; the time window maps onto it: "started before" is
//! a cursor at that instant, "started after" ends the list there.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use engine::ids::RunId;
use serde::Deserialize;

use super::super::view::{Page, urlencode};
use super::super::{Console, ConsoleError};
use super::{ProjectPath, Window, here, instant};
use crate::http::page;
use crate::http::runs::RunList;

#[derive(Debug, Deserialize, Default, serde::Serialize)]
pub(in super::super) struct Filters {
    #[serde(default)]
    status: String,
    #[serde(default)]
    substate: String,
    #[serde(default)]
    workflow: String,
    #[serde(default)]
    item: String,
    /// `dry` lists the dry runs, which are listed apart.
    #[serde(default)]
    kind: String,
    #[serde(flatten)]
    window: Window,
}

pub(in super::super) const STATUSES: [&str; 4] = ["running", "completed", "failed", "cancelled"];
pub(in super::super) const SUBSTATES: [(&str, &str); 9] = [
    ("queued", "queued"),
    ("executing", "running"),
    ("waiting_for_agent", "waiting for a host"),
    ("unroutable", "no host can run this"),
    ("sleeping", "asleep"),
    ("awaiting_signal", "waiting for approval or a signal"),
    ("awaiting_child", "waiting on another run"),
    ("awaiting_lease", "waiting for a lock"),
    ("held", "held"),
];

pub(in super::super) async fn page(
    State(c): State<Console>, Path(p): Path<ProjectPath>, headers: HeaderMap, uri: Uri, Query(f): Query<Filters>,
) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    let mut problems: Vec<String> = Vec::new();
    let mut q: Vec<String> = vec!["limit=50".into()];
    if STATUSES.contains(&f.status.as_str()) {
        q.push(format!("status={}", f.status));
    }
    if SUBSTATES.iter().any(|(k, _)| *k == f.substate) {
        q.push(format!("substate={}", f.substate));
    }
    if !f.workflow.trim().is_empty() {
        q.push(format!("workflow={}", urlencode(f.workflow.trim())));
    }
    if !f.item.trim().is_empty() {
        q.push(format!("item={}", urlencode(f.item.trim())));
    }
    if f.kind == "dry" {
        q.push("dry_run=true".into());
    }
    let since = instant(&f.window.since);
    if !f.window.since.trim().is_empty() && since.is_none() {
        problems.push("\"Started after\" is not a date and time".into());
    }
    let until = instant(&f.window.until);
    if !f.window.until.trim().is_empty() && until.is_none() {
        problems.push("\"Started before\" is not a date and time".into());
    }
    if !f.window.cursor.is_empty() {
        q.push(format!("cursor={}", urlencode(&f.window.cursor)));
    } else if let Some(until) = until {
        // The list's keyset is (created_at, run id) descending: start just before `until`.
        q.push(format!("cursor={}", page::encode(&(until.timestamp_micros(), RunId(uuid::Uuid::nil())))));
    }
    let path = format!("/orgs/{}/projects/{}/runs?{}", p.org, p.project, q.join("&"));
    let mut list: RunList = c.read(&s.caller, &path).await?;
    if let Some(since) = since {
        let before = list.items.len();
        list.items.retain(|r| r.created_at >= since);
        if list.items.len() < before {
            list.next_cursor = None;
        }
    }
    // The next page keeps the filters.
    let next = list.next_cursor.as_ref().map(|cursor| {
        let mut keep: Vec<String> = Vec::new();
        for (k, v) in [
            ("status", &f.status),
            ("substate", &f.substate),
            ("workflow", &f.workflow),
            ("item", &f.item),
            ("kind", &f.kind),
            ("since", &f.window.since),
            ("until", &f.window.until),
        ] {
            if !v.trim().is_empty() {
                keep.push(format!("{k}={}", urlencode(v.trim())));
            }
        }
        keep.push(format!("cursor={}", urlencode(cursor)));
        format!("?{}", keep.join("&"))
    });
    let workflows: Vec<String> = sqlx::query_scalar(
        "SELECT w.name FROM workflows w JOIN projects p ON p.project_id = w.project_id \
         WHERE w.org_id = $1 AND p.org_id = $1 AND p.slug = $2 ORDER BY w.name LIMIT 200",
    )
    .bind(s.caller.org)
    .bind(&p.project)
    .fetch_all(c.db())
    .await?;
    let projects = c.projects(&s).await?;
    let page = Page::of(&s, format!("Runs · {}", p.project), "runs").project(&p.project, projects);
    let filtered = !(f.status.is_empty()
        && f.substate.is_empty()
        && f.workflow.is_empty()
        && f.item.is_empty()
        && f.kind.is_empty()
        && f.window.since.is_empty()
        && f.window.until.is_empty());
    c.page(
        "runs.html",
        ctx! {
            page => page,
            runs => list.items,
            next => next,
            paged => !f.window.cursor.is_empty(),
            filters => f,
            filtered => filtered,
            problems => problems,
            statuses => STATUSES,
            substates => SUBSTATES,
            workflows => workflows,
        },
    )
}
