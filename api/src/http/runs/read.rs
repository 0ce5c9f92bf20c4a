//! Reading runs: the project's list with filters and a keyset cursor (a substate filter
//! reads on past the runs it passes over), one run with its steps and open approvals, and
//! `why` (what holds it, from `engine::substate`).

use axum::extract::State;
use engine::ids::RunId;
use engine::substate;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::{OpenApproval, ProjectRun, Run, RunDetail, RunList, RunPath, RunRow, SESSION_FIGURES_SQL, SessionRow, Step, load, select_runs, with_substates};
use crate::http::auth::Role;
use crate::http::error::ApiError;
use crate::http::extract::{Json, Query};
use crate::http::tenant::ProjectScope;
use crate::http::{AppState, page};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// `running`, `completed`, `failed` or `cancelled`.
    #[param(pattern = "^(running|completed|failed|cancelled)$")]
    pub status: Option<String>,
    /// A running run's substate: `queued`, `executing`, `waiting_for_agent`, `unroutable`,
    /// `sleeping`, `awaiting_signal`, `awaiting_child`, `awaiting_lease` or `held`.
    #[param(pattern = "^(queued|executing|waiting_for_agent|unroutable|sleeping|awaiting_signal|awaiting_child|awaiting_lease|held)$")]
    pub substate: Option<String>,
    /// A workflow's name.
    pub workflow: Option<String>,
    /// An item's key, e.g. `["github","owner/name",12]`.
    pub item: Option<String>,
    /// Dry runs are listed apart: `true` lists only them, `false` (the default) none of them.
    pub dry_run: Option<bool>,
    /// Page size, 1 to 200 (50 by default).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

const SUBSTATES: [&str; 9] =
    ["queued", "executing", "waiting_for_agent", "unroutable", "sleeping", "awaiting_signal", "awaiting_child", "awaiting_lease", "held"];

/// Rows examined at most for one page filtered by substate (which is derived, not stored):
/// past this, the page ends short with a cursor, and the client reads on.
const SUBSTATE_SCAN: i64 = 2_000;

/// The project's runs, newest first. Dry runs are listed apart (`dry_run=true`).
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/runs", operation_id = "list_runs", tag = "runs",
    params(ProjectScope, ListQuery),
    responses((status = 200, body = RunList)))]
pub async fn list(State(state): State<AppState>, scope: ProjectScope, Query(q): Query<ListQuery>) -> Result<Json<RunList>, ApiError> {
    scope.require(Role::Viewer)?;
    let (limit, mut after) = page::start::<(i64, RunId)>(q.limit, q.cursor.as_deref())?;
    if let Some(status) = &q.status {
        if !["running", "completed", "failed", "cancelled"].contains(&status.as_str()) {
            return Err(ApiError::BadRequest("status must be running, completed, failed or cancelled".into()));
        }
    }
    if let Some(substate) = &q.substate {
        if !SUBSTATES.contains(&substate.as_str()) {
            return Err(ApiError::BadRequest(format!("substate must be one of {}", SUBSTATES.join(", "))));
        }
    }
    let mut items: Vec<Run> = Vec::new();
    let mut scanned = 0;
    loop {
        let mut qb = select_runs(scope.org.org, scope.project);
        // A substate belongs to running runs only.
        match (&q.status, &q.substate) {
            (_, Some(_)) => qb.push(" AND r.status = 'running'"),
            (Some(status), None) => qb.push(" AND r.status = ").push_bind(status.clone()),
            (None, None) => &mut qb,
        };
        if let Some(workflow) = &q.workflow {
            qb.push(" AND w.name = ").push_bind(workflow.clone());
        }
        if let Some(item) = &q.item {
            qb.push(" AND i.key = ").push_bind(item.clone());
        }
        qb.push(" AND r.dry_run = ").push_bind(q.dry_run.unwrap_or(false));
        if let Some((micros, run)) = after {
            qb.push(" AND (r.created_at, r.run_id) < (").push_bind(page::time(micros)?).push(", ").push_bind(run).push(")");
        }
        let want = limit + 1 - items.len() as i64;
        let batch = if q.substate.is_some() { want.max(50) } else { want };
        qb.push(" ORDER BY r.created_at DESC, r.run_id DESC LIMIT ").push_bind(batch);
        let rows: Vec<RunRow> = qb.build_query_as().fetch_all(&state.db).await?;
        let exhausted = (rows.len() as i64) < batch;
        scanned += rows.len() as i64;
        let mut runs: Vec<Run> = rows.into_iter().map(|r| Run::from_row(&scope, r)).collect();
        with_substates(&state, &scope, &mut runs).await?;
        for run in runs {
            after = Some((run.created_at.timestamp_micros(), run.id));
            if q.substate.is_none() || run.substate == q.substate {
                items.push(run);
                if items.len() as i64 > limit {
                    break;
                }
            }
        }
        if items.len() as i64 > limit || exhausted {
            break;
        }
        if scanned >= SUBSTATE_SCAN {
            // A short page: its cursor is the last run examined.
            let next_cursor = after.map(|k| page::encode(&k));
            return Ok(Json(RunList { items, next_cursor }));
        }
    }
    Ok(Json(RunList::page(items, limit, |r| (r.created_at.timestamp_micros(), r.id))))
}

const STEPS_OF_RUN: &str = "SELECT step_id, node, kind, visit, attempt, state, reason, exit_code, output, timed_out, reused_from IS NOT NULL AS reused, \
     created_at, started_at, ended_at FROM steps WHERE run_id = $1 AND org_id = $2 ORDER BY started_seq, created_at";

const OPEN_APPROVALS: &str = "SELECT a.node, a.step_id, a.prompt, a.fields, a.deadline FROM approvals a JOIN steps s USING (step_id) \
     WHERE a.run_id = $1 AND a.org_id = $2 AND a.decision IS NULL AND s.state = 'waiting' ORDER BY s.started_seq";

/// A run with its steps and the approvals it waits on.
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/runs/{run}", operation_id = "get_run", tag = "runs",
    params(ProjectScope, RunPath),
    responses((status = 200, body = RunDetail)))]
pub async fn get(State(state): State<AppState>, ProjectRun { scope, run: id }: ProjectRun) -> Result<Json<RunDetail>, ApiError> {
    scope.require(Role::Viewer)?;
    let mut conn = state.db.begin().await?;
    let mut run = load(&mut conn, &scope, id).await?;
    let mut steps: Vec<Step> = sqlx::query_as(STEPS_OF_RUN).bind(id).bind(scope.org.org).fetch_all(&mut *conn).await?;
    let approvals: Vec<OpenApproval> = sqlx::query_as(OPEN_APPROVALS).bind(id).bind(scope.org.org).fetch_all(&mut *conn).await?;
    let sessions: Vec<SessionRow> = sqlx::query_as(SESSION_FIGURES_SQL).bind(id).bind(scope.org.org).fetch_all(&mut *conn).await?;
    drop(conn);
    for row in sessions {
        if let Some(step) = steps.iter_mut().find(|s| s.id == row.step_id) {
            step.session = Some(row.figures);
        }
    }
    with_substates(&state, &scope, std::slice::from_mut(&mut run)).await?;
    Ok(Json(RunDetail { run, steps, approvals }))
}

/// What holds a run, in words.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Why {
    pub status: String,
    pub reason: Option<String>,
    /// The substate's name while running.
    pub substate: Option<String>,
    /// The console's words: "waiting for approval", "asleep", or the status once finished.
    pub words: String,
    /// What holds the run, in a sentence.
    pub text: String,
    /// The substate with its particulars (node, prompt, deadline, wake time, missing
    /// capabilities, …), tagged by `substate`.
    pub detail: Option<Value>,
}

impl Why {
    /// The answer of `engine::substate::why`, as the API says it.
    pub fn of(why: substate::Why) -> Result<Why, serde_json::Error> {
        Ok(Why {
            detail: why.substate.as_ref().map(serde_json::to_value).transpose()?,
            substate: why.substate.as_ref().map(|s| s.name().to_owned()),
            status: why.status,
            reason: why.reason,
            words: why.words,
            text: why.text,
        })
    }
}

/// What the run is doing or waiting for, in words.
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/runs/{run}/why", operation_id = "why_run", tag = "runs",
    params(ProjectScope, RunPath),
    responses((status = 200, body = Why)))]
pub async fn why(State(state): State<AppState>, ProjectRun { scope, run: id }: ProjectRun) -> Result<Json<Why>, ApiError> {
    scope.require(Role::Viewer)?;
    let why = substate::why(&state.db, scope.org.org, id).await?;
    Ok(Json(Why::of(why).map_err(ApiError::internal)?))
}
