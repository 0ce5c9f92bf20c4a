//! Admission's settings and an operator's hands on them: the org's cap on running runs (with
//! how many run and wait), pausing a project (its new runs are held; unpausing releases them),
//! a project's retention, and the WIP limits of its board columns. Writes go through `engine::store::admission` and
//! `engine::store::retention`, audited as the caller.

use axum::extract::State;
use engine::admission::{MAX_WAITING, ORG_QUEUE};
use engine::store::{admission, retention};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::auth::Role;
use super::error::ApiError;
use super::extract::Json;
use super::tenant::{OrgScope, ProjectScope};

/// The org's cap on running runs, and where it stands.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Limits {
    /// Runs of the org that may run at once (child runs and dry runs are not counted).
    pub running_cap: i32,
    /// Runs counted against the cap now.
    pub running: i64,
    /// Runs in line for the cap.
    pub waiting: i32,
    /// A submit is refused with 429 when this many already wait.
    pub max_waiting: i32,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetLimits {
    /// 1 to 1,000,000. A raise releases the runs in line it makes room for, in order.
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub running_cap: i32,
}

const LIMITS: &str = "SELECT o.running_cap, \
            (SELECT count(*) FROM concurrency_leases l WHERE l.org_id = o.org_id AND l.group_key = $2), \
            (SELECT q.waiting FROM admission_queues q WHERE q.org_id = o.org_id AND q.queue = $2) \
     FROM orgs o WHERE o.org_id = $1";

async fn limits(state: &AppState, scope: &OrgScope) -> Result<Limits, ApiError> {
    let (running_cap, running, waiting): (i32, i64, Option<i32>) = sqlx::query_as(LIMITS).bind(scope.org).bind(ORG_QUEUE).fetch_one(&state.db).await?;
    Ok(Limits { running_cap, running, waiting: waiting.unwrap_or(0), max_waiting: MAX_WAITING })
}

/// The org's cap on running runs, with how many run and wait (viewer).
#[utoipa::path(get, path = "/orgs/{org}/limits", operation_id = "get_limits", tag = "admission",
    params(OrgScope),
    responses((status = 200, body = Limits)))]
pub async fn get_limits(State(state): State<AppState>, scope: OrgScope) -> Result<Json<Limits>, ApiError> {
    scope.require(Role::Viewer)?;
    Ok(Json(limits(&state, &scope).await?))
}

/// Sets the org's cap on running runs (admin).
#[utoipa::path(put, path = "/orgs/{org}/limits", operation_id = "set_limits", tag = "admission",
    params(OrgScope),
    request_body = SetLimits,
    responses((status = 200, body = Limits)))]
pub async fn set_limits(State(state): State<AppState>, scope: OrgScope, Json(body): Json<SetLimits>) -> Result<Json<Limits>, ApiError> {
    scope.require(Role::Admin)?;
    let mut ch = scope.change(&state).await?;
    admission::set_running_cap(&mut ch, scope.org, body.running_cap).await?;
    ch.commit().await?;
    Ok(Json(limits(&state, &scope).await?))
}

/// A project's admission and retention settings.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ProjectSettings {
    /// New runs of a paused project are held until it is unpaused.
    pub paused: bool,
    /// Finished runs are deleted, with their history, this many days after they end.
    pub retention_days: i32,
    /// The board columns with a WIP limit, by name.
    pub board_limits: Vec<BoardLimitDoc>,
}

/// A board column's WIP limit: while the column is full, new runs of workflows that move
/// cards into it (a `board_move` output) wait in line.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BoardLimitDoc {
    /// The column (Projects v2 `Status`), as named when the limit was set; matched without
    /// regard to case.
    pub column: String,
    pub wip_limit: i32,
    /// Items whose card is in the column, plus admitted runs that will move a card into it.
    pub occupied: i64,
    /// Runs waiting for room in the column.
    pub waiting: i32,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetBoardLimit {
    /// The board column (`In progress`), 1 to 100 printable characters, not all spaces.
    #[schema(min_length = 1, max_length = 100, pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*[^\\s\\x00-\\x1f\\x7f-\\x9f][^\\x00-\\x1f\\x7f-\\x9f]*$")]
    pub column: String,
    /// 1 to 100,000; `null` removes the column's limit. A raise or a removal releases the runs
    /// it makes room for, in the order they arrived.
    #[schema(minimum = 1, maximum = 100_000)]
    pub wip_limit: Option<i32>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetRetention {
    /// 1 to 3650 days.
    #[schema(minimum = 1, maximum = 3650)]
    pub retention_days: i32,
}

const PROJECT_SETTINGS: &str = "SELECT paused, retention_days FROM projects WHERE org_id = $1 AND project_id = $2";

async fn settings(state: &AppState, scope: &ProjectScope) -> Result<ProjectSettings, ApiError> {
    let (paused, retention_days): (bool, i32) = sqlx::query_as(PROJECT_SETTINGS).bind(scope.org.org).bind(scope.project).fetch_one(&state.db).await?;
    let mut conn = state.db.begin().await?;
    let board_limits = admission::board_limits(&mut conn, scope.org.org, scope.project)
        .await?
        .into_iter()
        .map(|b| BoardLimitDoc { column: b.column, wip_limit: b.limit, occupied: b.occupied, waiting: b.waiting })
        .collect();
    Ok(ProjectSettings { paused, retention_days, board_limits })
}

/// Sets or removes the WIP limit of one of the project's board columns (admin).
#[utoipa::path(put, path = "/orgs/{org}/projects/{project}/board-limits", operation_id = "set_board_limit", tag = "admission",
    params(ProjectScope),
    request_body = SetBoardLimit,
    responses((status = 200, body = ProjectSettings), (status = 404, description = "Removing a limit that is not set")))]
pub async fn set_board_limit(State(state): State<AppState>, scope: ProjectScope, Json(body): Json<SetBoardLimit>) -> Result<Json<ProjectSettings>, ApiError> {
    scope.require(Role::Admin)?;
    let mut ch = scope.change(&state).await?;
    admission::set_board_limit(&mut ch, scope.org.org, scope.project, &body.column, body.wip_limit).await?;
    ch.commit().await?;
    Ok(Json(settings(&state, &scope).await?))
}

/// The project's admission and retention settings (viewer).
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/settings", operation_id = "get_project_settings", tag = "admission",
    params(ProjectScope),
    responses((status = 200, body = ProjectSettings)))]
pub async fn get_settings(State(state): State<AppState>, scope: ProjectScope) -> Result<Json<ProjectSettings>, ApiError> {
    scope.require(Role::Viewer)?;
    Ok(Json(settings(&state, &scope).await?))
}

/// Sets how long the project's finished runs are kept (admin). A shorter retention applies at
/// once: the project's sweep runs now.
#[utoipa::path(put, path = "/orgs/{org}/projects/{project}/retention", operation_id = "set_retention", tag = "admission",
    params(ProjectScope),
    request_body = SetRetention,
    responses((status = 200, body = ProjectSettings)))]
pub async fn set_retention(State(state): State<AppState>, scope: ProjectScope, Json(body): Json<SetRetention>) -> Result<Json<ProjectSettings>, ApiError> {
    scope.require(Role::Admin)?;
    let mut ch = scope.change(&state).await?;
    retention::set_days(&mut ch, scope.org.org, scope.project, body.retention_days).await?;
    ch.commit().await?;
    Ok(Json(settings(&state, &scope).await?))
}

async fn set_paused(state: &AppState, scope: &ProjectScope, paused: bool) -> Result<Json<ProjectSettings>, ApiError> {
    scope.require(Role::Admin)?;
    let mut ch = scope.change(state).await?;
    admission::set_project_paused(&mut ch, scope.org.org, scope.project, paused).await?;
    ch.commit().await?;
    Ok(Json(settings(state, scope).await?))
}

/// Pauses the project (admin): new runs of its workflows are held; runs already going carry
/// on.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/pause", operation_id = "pause_project", tag = "admission",
    params(ProjectScope),
    responses((status = 200, body = ProjectSettings)))]
pub async fn pause(State(state): State<AppState>, scope: ProjectScope) -> Result<Json<ProjectSettings>, ApiError> {
    set_paused(&state, &scope, true).await
}

/// Unpauses the project (admin): the runs it held are released.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/unpause", operation_id = "unpause_project", tag = "admission",
    params(ProjectScope),
    responses((status = 200, body = ProjectSettings)))]
pub async fn unpause(State(state): State<AppState>, scope: ProjectScope) -> Result<Json<ProjectSettings>, ApiError> {
    set_paused(&state, &scope, false).await
}
