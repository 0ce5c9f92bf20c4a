//! Today, per org: what needs the person (approvals waiting, with their prompt and deadline;
//! cycle-budget asks; failures no retry or rerun has answered and no one resolved yet), what is running (with its
//! substate in words), and what finished lately. Across every project of the org, each list by
//! its own index (`approvals_open`, `item_cycle_budgets_asks`, `runs_failed_by_org`,
//! `runs_running_by_org`, `runs_ended_by_org`), the substates in `engine::substate`'s three
//! queries for the whole page.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use chrono::{DateTime, Utc};
use engine::db::Db;
use engine::ids::{ItemId, OrgId, RunId};
use engine::substate;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::postgres::PgRow;
use uuid::Uuid;

use super::super::session::OrgSession;
use super::super::view::{self, Page};
use super::super::{Console, ConsoleError};
use super::{Posted, here, see_other};

/// Approvals waiting in the org ($1 org, $2 a project or NULL).
pub(crate) const APPROVALS_SQL: &str = "SELECT a.run_id, a.node, a.prompt, a.deadline, s.created_at AS asked_at, p.slug AS project, w.name AS workflow, \
            r.input, i.key AS item, i.title AS item_title \
     FROM approvals a JOIN steps s ON s.step_id = a.step_id JOIN runs r ON r.run_id = a.run_id \
     JOIN projects p ON p.project_id = r.project_id JOIN workflows w ON w.workflow_id = r.workflow_id \
     LEFT JOIN items i ON i.item_id = r.item_id \
     WHERE a.org_id = $1 AND a.decision IS NULL AND s.state = 'waiting' AND r.status = 'running' \
       AND ($2::uuid IS NULL OR r.project_id = $2) \
     ORDER BY a.deadline ASC NULLS LAST, s.created_at LIMIT 50";

/// Cycle budgets used up, asking for a reset ($1 org, $2 a project or NULL).
pub(crate) const ASKS_SQL: &str = "SELECT i.item_id, i.key AS item, i.title, w.name AS workflow, p.slug AS project, b.cycles_used, b.asked_at \
     FROM item_cycle_budgets b JOIN items i ON i.item_id = b.item_id JOIN workflows w ON w.workflow_id = b.workflow_id \
     JOIN projects p ON p.project_id = w.project_id \
     WHERE b.org_id = $1 AND b.asked_at IS NOT NULL AND ($2::uuid IS NULL OR w.project_id = $2) \
     ORDER BY b.asked_at DESC LIMIT 20";

/// Failures of the last week that no retry or rerun answers and no operator resolved ($1 org,
/// $2 a project or NULL).
pub(crate) const FAILURES_SQL: &str = "SELECT r.run_id, r.reason, r.ended_at, p.slug AS project, w.name AS workflow \
     FROM runs r JOIN projects p ON p.project_id = r.project_id JOIN workflows w ON w.workflow_id = r.workflow_id \
     WHERE r.org_id = $1 AND r.status = 'failed' AND NOT r.dry_run AND r.ended_at > now() - interval '7 days' AND r.resolved_at IS NULL \
       AND ($2::uuid IS NULL OR r.project_id = $2) \
       AND NOT EXISTS (SELECT 1 FROM runs x WHERE x.source_run_id = r.run_id) \
     ORDER BY r.ended_at DESC, r.run_id DESC LIMIT 20";

/// Running runs, newest first ($1 org, $2 a project or NULL); dry runs are listed apart.
pub(crate) const RUNNING_SQL: &str = "SELECT r.run_id, r.created_at, r.started_at, p.slug AS project, w.name AS workflow, i.key AS item \
     FROM runs r JOIN projects p ON p.project_id = r.project_id JOIN workflows w ON w.workflow_id = r.workflow_id \
     LEFT JOIN items i ON i.item_id = r.item_id \
     WHERE r.org_id = $1 AND r.status = 'running' AND NOT r.dry_run AND ($2::uuid IS NULL OR r.project_id = $2) \
     ORDER BY r.created_at DESC, r.run_id DESC LIMIT 50";

/// Finished lately, latest first ($1 org, $2 a project or NULL).
pub(crate) const RECENT_SQL: &str = "SELECT r.run_id, r.status, r.reason, r.created_at, r.ended_at, p.slug AS project, w.name AS workflow \
     FROM runs r JOIN projects p ON p.project_id = r.project_id JOIN workflows w ON w.workflow_id = r.workflow_id \
     WHERE r.org_id = $1 AND r.status <> 'running' AND NOT r.dry_run AND ($2::uuid IS NULL OR r.project_id = $2) \
     ORDER BY r.ended_at DESC, r.run_id DESC LIMIT 20";

#[derive(Debug, Serialize, sqlx::FromRow)]
struct Approval {
    run_id: RunId,
    node: String,
    prompt: String,
    deadline: Option<DateTime<Utc>>,
    asked_at: DateTime<Utc>,
    project: String,
    workflow: String,
    #[serde(skip)]
    input: Value,
    item: Option<String>,
    item_title: Option<String>,
    /// What tells this approval from the others: the run's item, else its input.
    #[sqlx(skip)]
    about: String,
}

#[derive(Debug, Serialize, sqlx::FromRow)]
struct Ask {
    item_id: ItemId,
    item: String,
    title: Option<String>,
    workflow: String,
    project: String,
    cycles_used: i32,
    asked_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, sqlx::FromRow)]
struct Failure {
    run_id: RunId,
    reason: Option<String>,
    ended_at: Option<DateTime<Utc>>,
    project: String,
    workflow: String,
}

#[derive(Debug, Serialize, sqlx::FromRow)]
struct Running {
    run_id: RunId,
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    project: String,
    workflow: String,
    item: Option<String>,
    #[sqlx(skip)]
    words: String,
    #[sqlx(skip)]
    substate: String,
    #[sqlx(skip)]
    why: String,
}

#[derive(Debug, Serialize, sqlx::FromRow)]
struct Recent {
    run_id: RunId,
    status: String,
    reason: Option<String>,
    created_at: DateTime<Utc>,
    ended_at: Option<DateTime<Utc>>,
    project: String,
    workflow: String,
}

/// What tells one approval from another on a card: the item the run is about, else the first
/// few of its inputs.
fn about(a: &Approval) -> String {
    if let Some(key) = &a.item {
        let item = view::item_name(key);
        return match &a.item_title {
            Some(t) => format!("{item}: {t}"),
            None => item,
        };
    }
    let Some(input) = a.input.as_object().filter(|m| !m.is_empty()) else {
        return "no input".into();
    };
    let mut parts: Vec<String> = input
        .iter()
        .take(3)
        .map(|(k, v)| {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            let v: String = if v.chars().count() > 40 { v.chars().take(39).chain(['…']).collect() } else { v };
            format!("{k}: {v}")
        })
        .collect();
    if input.len() > 3 {
        parts.push(format!("and {} more", input.len() - 3));
    }
    parts.join(", ")
}

pub(in super::super) async fn page(State(c): State<Console>, Path(org): Path<String>, headers: HeaderMap, uri: Uri) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &org, &here(&uri)).await?;
    render(&c, &s, None, StatusCode::OK).await
}

#[derive(Debug, Deserialize)]
pub(in super::super) struct TodayRunPath {
    org: String,
    project: String,
    run: String,
}

#[derive(Debug, Deserialize)]
pub(in super::super) struct AskPath {
    org: String,
    project: String,
    item: String,
}

/// "Resolve" on a failure: the run needs nothing more (REST `…/runs/{run}/resolve`).
pub(in super::super) async fn resolve(State(c): State<Console>, Path(p): Path<TodayRunPath>, Posted { s, form: f }: Posted) -> Result<Response, ConsoleError> {
    let note = f.get("note").map(|n| n.trim()).filter(|n| !n.is_empty());
    let path = format!("/orgs/{}/projects/{}/runs/{}/resolve", p.org, p.project, view::urlencode(&p.run));
    act(&c, &s, &path, json!({ "note": note })).await
}

/// "Reset" on a used-up cycle budget (REST `…/cycle-asks/{item}/reset`).
pub(in super::super) async fn reset(State(c): State<Console>, Path(p): Path<AskPath>, Posted { s, .. }: Posted) -> Result<Response, ConsoleError> {
    let path = format!("/orgs/{}/projects/{}/cycle-asks/{}/reset", p.org, p.project, view::urlencode(&p.item));
    act(&c, &s, &path, json!({})).await
}

/// Posts to the REST route; back to Today on success, Today with the refusal on top otherwise.
async fn act(c: &Console, s: &OrgSession, path: &str, body: Value) -> Result<Response, ConsoleError> {
    match c.call(&s.caller, Method::POST, path, Some(body)).await? {
        Ok(_) => Ok(see_other(&format!("/orgs/{}", s.org))),
        Err(r) => render(c, s, Some(r.detail().to_owned()), StatusCode::UNPROCESSABLE_ENTITY).await,
    }
}

/// One of the page's lists: each query takes the org ($1) and the project a token is limited
/// to ($2, NULL for none).
async fn list<T>(db: &Db, sql: &'static str, org: OrgId, only: Option<Uuid>) -> Result<Vec<T>, sqlx::Error>
where
    T: for<'r> sqlx::FromRow<'r, PgRow> + Send + Unpin,
{
    sqlx::query_as(sql).bind(org).bind(only).fetch_all(db).await
}

async fn render(c: &Console, s: &OrgSession, notice: Option<String>, status: StatusCode) -> Result<Response, ConsoleError> {
    let org = s.org.as_str();
    let (org_id, only) = (s.caller.org, s.caller.project.map(|p| p.0));
    let db = c.db();
    let mut approvals: Vec<Approval> = list(db, APPROVALS_SQL, org_id, only).await?;
    for a in &mut approvals {
        a.about = about(a);
    }
    let asks: Vec<Ask> = list(db, ASKS_SQL, org_id, only).await?;
    let failures: Vec<Failure> = list(db, FAILURES_SQL, org_id, only).await?;
    let mut running: Vec<Running> = list(db, RUNNING_SQL, org_id, only).await?;
    let recent: Vec<Recent> = list(db, RECENT_SQL, org_id, only).await?;
    let ids: Vec<RunId> = running.iter().map(|r| r.run_id).collect();
    if !ids.is_empty() {
        for why in substate::whys(db, org_id, &ids).await? {
            if let Some(r) = running.iter_mut().find(|r| r.run_id == why.run) {
                r.words = why.words;
                r.substate = why.substate.as_ref().map(|s| s.name().to_owned()).unwrap_or_default();
                r.why = why.text;
            }
        }
    }
    let projects = c.projects(s).await?;
    let mut page = Page::of(s, format!("Today · {org}"), "today");
    page.streams = projects.iter().map(|p| format!("/orgs/{org}/projects/{p}/live")).collect();
    page.projects = projects;
    let can_act = s.can(crate::http::auth::Role::Member);
    let html = c.render(
        "today.html",
        ctx! {
            page => page,
            approvals => approvals,
            asks => asks,
            failures => failures,
            running => running,
            recent => recent,
            notice => notice,
            can_act => can_act,
        },
    )?;
    Ok(view::html(status, html))
}
