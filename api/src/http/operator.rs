//! Operator actions besides the run routes': resolving a failed run (marked handled, its status
//! unchanged), and the items whose cycle budget is spent (an ask under "Needs you") with the
//! reset that lets them open runs again. Each is audited as the caller; resolving writes
//! `run.resolved`, and a reset opens the runs its blocked events still ask for.

use axum::extract::State;
use chrono::{DateTime, Utc};
use engine::ids::{ItemId, RunId};
use engine::store::{operator, triggers};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::Role;
use super::error::ApiError;
use super::extract::{Json, JsonOrEmpty, Path, at_most};
use super::runs::{ProjectRun, RunPath};
use super::tenant::ProjectScope;

#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolveRun {
    /// Why it needs nothing more (kept in the event and the audit log), at most 200
    /// characters.
    #[schema(max_length = 200)]
    pub note: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Resolved {
    #[schema(value_type = String)]
    pub run: RunId,
    pub resolved_at: DateTime<Utc>,
    pub resolved_by: String,
}

/// The path of an item's routes.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ItemPath {
    /// The item's id
    item: String,
}

/// Marks a failed run handled (member): it leaves the failures to resolve; its status stays
/// `failed`. Resolving it again changes nothing.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/runs/{run}/resolve", operation_id = "resolve_run", tag = "runs",
    params(ProjectScope, RunPath),
    request_body(content = Option<ResolveRun>, description = "Optional note"),
    responses((status = 200, body = Resolved), (status = 409, description = "The run did not fail")))]
pub async fn resolve(
    State(state): State<AppState>, ProjectRun { scope, run }: ProjectRun, JsonOrEmpty(body): JsonOrEmpty<ResolveRun>,
) -> Result<Json<Resolved>, ApiError> {
    scope.require(Role::Member)?;
    let mut ch = scope.change(&state).await?;
    let note = at_most("note", body.note, 200)?;
    operator::resolve(&mut ch, scope.org.org, run, note.as_deref()).await?;
    let (resolved_at, resolved_by): (DateTime<Utc>, String) =
        sqlx::query_as("SELECT resolved_at, resolved_by FROM runs WHERE run_id = $1").bind(run).fetch_one(ch.conn()).await?;
    ch.commit().await?;
    Ok(Json(Resolved { run, resolved_at, resolved_by }))
}

/// An item whose cycle budget a workflow has spent: nothing more opens on it until a reset.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CycleAsk {
    /// The item's id, for the reset.
    #[schema(value_type = String)]
    pub item: ItemId,
    /// `["github","owner/name",12]`.
    pub key: String,
    pub title: Option<String>,
    pub workflow: String,
    pub cycles_used: i32,
    pub asked_at: DateTime<Utc>,
    /// The blocked event and the counts, as recorded.
    pub ask: Value,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CycleAskList {
    pub items: Vec<CycleAsk>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CycleReset {
    /// The item's new cycle generation.
    pub generation: i32,
    /// What each workflow's newest blocked event became: usually a new run.
    pub claims: Vec<Value>,
}

/// The project's items whose cycle budget is spent (viewer).
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/cycle-asks", operation_id = "list_cycle_asks", tag = "runs",
    params(ProjectScope),
    responses((status = 200, body = CycleAskList)))]
pub async fn cycle_asks(State(state): State<AppState>, scope: ProjectScope) -> Result<Json<CycleAskList>, ApiError> {
    scope.require(Role::Viewer)?;
    let mut conn = state.db.begin().await?;
    let asks = triggers::cycle_asks(&mut conn, scope.org.org, Some(scope.project)).await?;
    let items = asks
        .into_iter()
        .map(|a| CycleAsk {
            item: a.item_id,
            key: a.item_key,
            title: a.item_title,
            workflow: a.workflow,
            cycles_used: a.cycles_used,
            asked_at: a.asked_at,
            ask: a.ask,
        })
        .collect();
    Ok(Json(CycleAskList { items }))
}

const ITEM_IN_PROJECT: &str = "SELECT 1 FROM items WHERE item_id = $1 AND org_id = $2 AND project_id = $3";

/// Resets an item's cycle budget (member): its generation goes up, its asks are cleared, and
/// the newest blocked event of each workflow is judged again on the item as it is now.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/cycle-asks/{item}/reset", operation_id = "reset_cycle_budget", tag = "runs",
    params(ProjectScope, ItemPath),
    responses((status = 200, body = CycleReset)))]
pub async fn reset(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<ItemPath>) -> Result<Json<CycleReset>, ApiError> {
    scope.require(Role::Member)?;
    let not_found = || ApiError::NotFound("item not found".into());
    let item: ItemId = ItemId(p.item.parse().map_err(|_| not_found())?);
    let mut ch = scope.change(&state).await?;
    let in_project: Option<i32> = sqlx::query_scalar(ITEM_IN_PROJECT).bind(item).bind(scope.org.org).bind(scope.project).fetch_optional(ch.conn()).await?;
    in_project.ok_or_else(not_found)?;
    let reset = triggers::reset_cycle_budget(&mut ch, scope.org.org, item).await?;
    ch.commit().await?;
    let claims = reset.claims.into_iter().map(|(workflow, claim)| serde_json::json!({ "workflow": workflow, "claim": claim })).collect();
    Ok(Json(CycleReset { generation: reset.generation, claims }))
}
