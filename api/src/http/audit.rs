//! The audit log: who did what to which object, newest first, filtered by actor, action,
//! target and time, for the org or one project (admin).
//!
//! Two tables hold it. `audit_log` has every action of people, tokens, hosts, GitHub and the
//! system; the engine's own moves of steps and runs are read from the runs' journal, where each
//! event names the engine that made it (`run_events.actor`, migration 0023), rather than
//! written twice. A page is the newest of both, merged: a journal entry's id is its event's id
//! less 2^52 (negative, and in the same order), so the order (time, then id, newest first) is
//! one total order over both.

use axum::extract::State;
use chrono::{DateTime, Datelike as _, Utc};
use engine::ids::{OrgId, ProjectId};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::auth::Role;
use super::error::ApiError;
use super::extract::{Json, Query, a_usable_year};
use super::tenant::{OrgScope, ProjectScope};
use super::{AppState, page};

#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct AuditEntry {
    /// The entry's id; an engine's move, read from the run's journal, has a negative one.
    #[sqlx(rename = "audit_id")]
    pub id: i64,
    pub at: DateTime<Utc>,
    /// `user`, `token`, `host`, `engine`, `github` or `system`.
    pub actor_kind: String,
    pub actor_id: String,
    /// `run.submit`, `approval.approve`, `member.add`, …
    pub action: String,
    pub target_kind: String,
    pub target_id: String,
    pub detail: Value,
}

page::list!(AuditList of AuditEntry);

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// The actor's id, or `kind:id` (e.g. `user:0190…`, `engine:e1`).
    pub actor: Option<String>,
    /// An action (`run.cancelled`), or a prefix ending in `*` (`run.*`).
    pub action: Option<String>,
    /// The target's id, or `kind:id` (e.g. `run:run-…`).
    pub target: Option<String>,
    /// Entries at or after this time (RFC 3339).
    pub since: Option<DateTime<Utc>>,
    /// Entries before this time (RFC 3339).
    pub until: Option<DateTime<Utc>>,
    /// Page size, 1 to 200 (50 by default).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// `kind:id` or `id`. Ids may contain `:` themselves only after a kind.
fn kind_and_id(text: &str, kinds: &[&str]) -> (Option<String>, String) {
    match text.split_once(':') {
        Some((kind, id)) if kinds.contains(&kind) => (Some(kind.to_owned()), id.to_owned()),
        _ => (None, text.to_owned()),
    }
}

const ACTOR_KINDS: [&str; 6] = ["user", "token", "host", "engine", "github", "system"];
const TARGET_KINDS: [&str; 9] = ["run", "step", "workflow", "project", "org", "user", "token", "host", "repository"];

async fn read(state: &AppState, org: OrgId, project: Option<ProjectId>, q: AuditQuery) -> Result<AuditList, ApiError> {
    let limit = page::limit(q.limit)?;
    let after: Option<(i64, i64)> = page::decode(q.cursor.as_deref())?;
    let after = match after {
        Some((micros, id)) => Some((page::time(micros)?, id)),
        None => None,
    };
    let mut rows = audited(state, org, project, &q, after, limit).await?;
    rows.extend(journal::moves(state, org, project, &q, after, limit).await?);
    rows.sort_by_key(|e| std::cmp::Reverse((e.at, e.id)));
    Ok(AuditList::page(rows, limit, |e| (e.at.timestamp_micros(), e.id)))
}

/// The page's rows of `audit_log`.
async fn audited(
    state: &AppState, org: OrgId, project: Option<ProjectId>, q: &AuditQuery, after: Option<(DateTime<Utc>, i64)>, limit: i64,
) -> Result<Vec<AuditEntry>, ApiError> {
    let mut qb = sqlx::QueryBuilder::<sqlx::Postgres>::new(
        "SELECT audit_id, at, actor_kind, actor_id, action, target_kind, target_id, detail FROM audit_log WHERE org_id = ",
    );
    qb.push_bind(org);
    if let Some(project) = project {
        qb.push(" AND project_id = ").push_bind(project);
    }
    if let Some(actor) = &q.actor {
        let (kind, id) = kind_and_id(actor, &ACTOR_KINDS);
        qb.push(" AND actor_id = ").push_bind(id);
        if let Some(kind) = kind {
            qb.push(" AND actor_kind = ").push_bind(kind);
        }
    }
    if let Some(action) = &q.action {
        push_action(&mut qb, "action", action);
    }
    if let Some(target) = &q.target {
        let (kind, id) = kind_and_id(target, &TARGET_KINDS);
        qb.push(" AND target_id = ").push_bind(id);
        if let Some(kind) = kind {
            qb.push(" AND target_kind = ").push_bind(kind);
        }
    }
    push_window(&mut qb, q)?;
    if let Some((at, id)) = after {
        qb.push(" AND (at, audit_id) < (").push_bind(at).push(", ").push_bind(id).push(")");
    }
    qb.push(" ORDER BY at DESC, audit_id DESC LIMIT ").push_bind(limit + 1);
    Ok(qb.build_query_as().fetch_all(&state.db).await?)
}

/// `AND <column> = action`, or `LIKE` its prefix when it ends in `*`.
fn push_action(qb: &mut sqlx::QueryBuilder<'_, sqlx::Postgres>, column: &str, action: &str) {
    match action.strip_suffix('*') {
        Some(prefix) => {
            // A LIKE pattern with the prefix's own wildcards escaped.
            let escaped = prefix.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_");
            qb.push(format!(" AND {column} LIKE ")).push_bind(format!("{escaped}%"));
        }
        None => {
            qb.push(format!(" AND {column} = ")).push_bind(action.to_owned());
        }
    }
}

/// `since` and `until`.
fn push_window(qb: &mut sqlx::QueryBuilder<'_, sqlx::Postgres>, q: &AuditQuery) -> Result<(), ApiError> {
    if let Some(since) = q.since {
        a_usable_year("since", since.year())?;
        qb.push(" AND at >= ").push_bind(since);
    }
    if let Some(until) = q.until {
        a_usable_year("until", until.year())?;
        qb.push(" AND at < ").push_bind(until);
    }
    Ok(())
}

mod journal {
    //! The engine's moves, as audit entries, from the runs' journal.

    use chrono::{DateTime, Utc};
    use engine::ids::{OrgId, ProjectId, RunId, StepId};
    use serde_json::{Value, json};

    use super::{ACTOR_KINDS, AuditEntry, AuditQuery, TARGET_KINDS, kind_and_id, push_action, push_window};
    use crate::http::AppState;
    use crate::http::error::ApiError;

    /// A journal entry's id is its event's id less this: negative, below every id of
    /// `audit_log`, in the events' order, and exact as a JSON number.
    const OFFSET: i64 = 1 << 52;

    /// The event kinds that are moves, which the audit log had an entry of when the engine made
    /// them; the rest of the engine's journal (a run awaiting an event, …) was never audited.
    const MOVES: [&str; 13] = [
        "step.created",
        "step.reused",
        "step.pending",
        "step.leased",
        "step.running",
        "step.waiting",
        "step.succeeded",
        "step.failed",
        "step.cancelled",
        "step.deferred",
        "run.completed",
        "run.failed",
        "run.cancelled",
    ];

    /// An event's kind as the audit log names the act (`step.created` was `step.create`).
    const ACTION: &str = "CASE kind WHEN 'step.created' THEN 'step.create' WHEN 'step.reused' THEN 'step.reuse' ELSE kind END";

    #[derive(sqlx::FromRow)]
    struct Move {
        event_id: i64,
        at: DateTime<Utc>,
        actor: String,
        action: String,
        run_id: RunId,
        step_id: Option<StepId>,
        node: Option<String>,
        attrs: Value,
    }

    impl Move {
        fn entry(self) -> AuditEntry {
            let (target_kind, target_id) = match self.step_id {
                Some(step) => ("step", step.to_string()),
                None => ("run", self.run_id.to_string()),
            };
            // A step's creation was audited with its run and node, not the event's own facts.
            let detail = if self.action == "step.create" { json!({ "run": self.run_id.to_string(), "node": self.node }) } else { self.attrs };
            AuditEntry {
                id: self.event_id - OFFSET,
                at: self.at,
                actor_kind: "engine".into(),
                actor_id: self.actor.strip_prefix("engine:").unwrap_or(&self.actor).to_owned(),
                action: self.action,
                target_kind: target_kind.into(),
                target_id,
                detail,
            }
        }
    }

    /// The page's engine moves (at most `limit + 1`), under the same filters as the audit log.
    pub(super) async fn moves(
        state: &AppState, org: OrgId, project: Option<ProjectId>, q: &AuditQuery, after: Option<(DateTime<Utc>, i64)>, limit: i64,
    ) -> Result<Vec<AuditEntry>, ApiError> {
        let mut qb = sqlx::QueryBuilder::<sqlx::Postgres>::new(format!(
            "SELECT event_id, at, actor, {ACTION} AS action, run_id, step_id, node, attrs FROM run_events WHERE org_id = "
        ));
        qb.push_bind(org);
        // The partial index `run_events_engine_moves` holds exactly these rows.
        qb.push(" AND actor LIKE 'engine:%' AND kind = ANY(").push_bind(&MOVES[..]).push(")");
        if let Some(project) = project {
            qb.push(" AND project_id = ").push_bind(project);
        }
        if let Some(actor) = &q.actor {
            match kind_and_id(actor, &ACTOR_KINDS) {
                (Some(kind), _) if kind != "engine" => return Ok(Vec::new()),
                (_, id) => {
                    qb.push(" AND actor = ").push_bind(format!("engine:{id}"));
                }
            }
        }
        if let Some(target) = &q.target {
            let (kind, id) = kind_and_id(target, &TARGET_KINDS);
            let run = id.parse::<RunId>().ok().filter(|_| kind.as_deref().is_none_or(|k| k == "run"));
            let step = id.parse::<StepId>().ok().filter(|_| kind.as_deref().is_none_or(|k| k == "step"));
            match (run, step) {
                (Some(run), _) => {
                    qb.push(" AND run_id = ").push_bind(run).push(" AND step_id IS NULL");
                }
                (None, Some(step)) => {
                    // By its run first: the journal's key.
                    qb.push(" AND run_id = (SELECT run_id FROM steps WHERE step_id = ").push_bind(step).push(") AND step_id = ").push_bind(step);
                }
                (None, None) => return Ok(Vec::new()),
            }
        }
        if let Some(action) = &q.action {
            push_action(&mut qb, &format!("({ACTION})"), action);
        }
        push_window(&mut qb, q)?;
        if let Some((at, id)) = after {
            qb.push(" AND (at, event_id) < (").push_bind(at).push(", ").push_bind(id.saturating_add(OFFSET)).push(")");
        }
        qb.push(" ORDER BY at DESC, event_id DESC LIMIT ").push_bind(limit + 1);
        let rows: Vec<Move> = qb.build_query_as().fetch_all(&state.db).await?;
        Ok(rows.into_iter().map(Move::entry).collect())
    }
}

/// The org's audit log (admin).
#[utoipa::path(get, path = "/orgs/{org}/audit", operation_id = "list_org_audit", tag = "audit",
    params(OrgScope, AuditQuery),
    responses((status = 200, body = AuditList)))]
pub async fn org_log(State(state): State<AppState>, scope: OrgScope, Query(q): Query<AuditQuery>) -> Result<Json<AuditList>, ApiError> {
    scope.require(Role::Admin)?;
    // A token limited to one project reads that project's entries only.
    Ok(Json(read(&state, scope.org, scope.caller.project, q).await?))
}

/// One project's audit log (admin).
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/audit", operation_id = "list_project_audit", tag = "audit",
    params(ProjectScope, AuditQuery),
    responses((status = 200, body = AuditList)))]
pub async fn project_log(State(state): State<AppState>, scope: ProjectScope, Query(q): Query<AuditQuery>) -> Result<Json<AuditList>, ApiError> {
    scope.require(Role::Admin)?;
    Ok(Json(read(&state, scope.org.org, Some(scope.project), q).await?))
}
