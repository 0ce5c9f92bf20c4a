//! What a run left behind, paged by sequence number: its events and a step's log lines.

use axum::extract::State;
use chrono::{DateTime, Utc};
use engine::ids::StepId;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{ProjectRun, RunPath, StepPath};
use crate::http::auth::Role;
use crate::http::error::ApiError;
use crate::http::event_hub::RunEvent;
use crate::http::extract::{Json, PathId, Query};
use crate::http::tenant::ProjectScope;
use crate::http::{AppState, page};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Events after this sequence number (0 by default: from the first).
    pub after: Option<i64>,
    /// Page size, 1 to 200 (50 by default).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
}

page::list!(RunEventList of RunEvent, by seq);

const EVENTS_AFTER: &str = "SELECT run_id AS run, seq, kind, node, step_id AS step, at, attrs FROM run_events \
     WHERE run_id = $1 AND org_id = $2 AND seq > $3 ORDER BY seq LIMIT $4";

/// The run's events, by sequence number.
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/runs/{run}/events", operation_id = "list_run_events", tag = "events",
    params(ProjectScope, RunPath, EventsQuery),
    responses((status = 200, body = RunEventList)))]
pub async fn events(
    State(state): State<AppState>, ProjectRun { scope, run: id }: ProjectRun, Query(q): Query<EventsQuery>,
) -> Result<Json<RunEventList>, ApiError> {
    scope.require(Role::Viewer)?;
    let limit = page::limit(q.limit)?;
    let items: Vec<RunEvent> =
        sqlx::query_as(EVENTS_AFTER).bind(id).bind(scope.org.org).bind(q.after.unwrap_or(0)).bind(limit + 1).fetch_all(&state.db).await?;
    Ok(Json(RunEventList::page(items, limit)))
}

/// One line a step's executor logged.
#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct LogLine {
    pub seq: i64,
    pub at: DateTime<Utc>,
    /// `stdout`, `stderr`, `session`, …
    pub stream: String,
    pub line: String,
}

page::list!(LogPage of LogLine, by seq);

const STEP_OF_RUN: &str = "SELECT 1 FROM steps WHERE step_id = $1 AND run_id = $2 AND org_id = $3";

const LOG_LINES_AFTER: &str = "SELECT seq, at, stream, line FROM step_logs WHERE step_id = $1 AND org_id = $2 AND seq > $3 ORDER BY seq LIMIT $4";

/// A step's log lines, by sequence number.
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/runs/{run}/steps/{step}/logs", operation_id = "list_step_logs", tag = "runs",
    params(ProjectScope, StepPath, EventsQuery),
    responses((status = 200, body = LogPage)))]
pub async fn step_logs(
    State(state): State<AppState>, ProjectRun { scope, run }: ProjectRun, PathId(step): PathId<StepId>, Query(q): Query<EventsQuery>,
) -> Result<Json<LogPage>, ApiError> {
    scope.require(Role::Viewer)?;
    let limit = page::limit(q.limit)?;
    let found: Option<i32> = sqlx::query_scalar(STEP_OF_RUN).bind(step).bind(run).bind(scope.org.org).fetch_optional(&state.db).await?;
    found.ok_or_else(|| ApiError::NotFound("step not found".into()))?;
    let items: Vec<LogLine> =
        sqlx::query_as(LOG_LINES_AFTER).bind(step).bind(scope.org.org).bind(q.after.unwrap_or(0)).bind(limit + 1).fetch_all(&state.db).await?;
    Ok(Json(LogPage::page(items, limit)))
}
