//! The answers to a run's approvals (member): approve with the form's fields, or reject with
//! an optional reason.

use axum::extract::State;
use engine::ids::{RunId, StepId};
use engine::store::{approvals, Change};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::http::auth::Role;
use crate::http::error::{ApiError, Problem};
use crate::http::extract::{at_most, Json, JsonOrEmpty, Path};
use crate::http::tenant::ProjectScope;
use crate::http::AppState;
use super::{in_project, retry_busy, run_id, ApprovalPath};

#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RejectApproval {
    /// Why, at most 200 characters.
    #[schema(max_length = 200)]
    pub reason: Option<String>,
}

/// An answered approval.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Decision {
    #[schema(value_type = String)]
    pub run: RunId,
    pub node: String,
    #[schema(value_type = String)]
    pub step: StepId,
    /// `approved` or `rejected`.
    pub decision: String,
    /// The checked answer (the node's output), or `{decision, reason}` for a rejection.
    pub answer: Value,
}

/// The answer recorded for an approval step, read inside the change that recorded it.
async fn recorded_answer(ch: &mut Change, scope: &ProjectScope, step: StepId) -> Result<Value, ApiError> {
    let answer: Option<Value> =
        sqlx::query_scalar("SELECT answer FROM approvals WHERE step_id = $1 AND org_id = $2").bind(step).bind(scope.org.org).fetch_one(ch.conn()).await?;
    Ok(answer.unwrap_or(Value::Null))
}

/// Approves the approval waiting at `{node}` with the form's fields (member). A missing
/// required field, a wrong type, or a key the form does not declare (such as `decision`) is
/// refused with 422 and the run keeps waiting. The run-level approval of `approval: required`
/// is the node `$start`.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/runs/{run}/approvals/{node}", operation_id = "approve", tag = "approvals",
    params(("org" = String, Path, description = "Org slug"), ("project" = String, Path, description = "Project slug"), ("run" = String, Path, description = "Run id, `run-…`"), ("node" = String, Path, description = "The approval's node")),
    request_body(content = Option<Object>, description = "The form's fields"),
    responses((status = 200, body = Decision), (status = 409, description = "No approval waits at that node", body = Problem, content_type = "application/problem+json")))]
pub async fn approve(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<ApprovalPath>, JsonOrEmpty(fields): JsonOrEmpty<Map<String, Value>>) -> Result<Json<Decision>, ApiError> {
    scope.require(Role::Member)?;
    let id = run_id(&p.run)?;
    let (state, scope, node, fields) = (&state, &scope, &p.node, &fields);
    let (step, answer) = retry_busy(move || async move {
        let mut ch = scope.change(state).await?;
        in_project(&mut ch, scope, id).await?;
        let step = approvals::approve(&mut ch, scope.org.org, id, node, fields).await?;
        let answer = recorded_answer(&mut ch, scope, step).await?;
        ch.commit().await?;
        Ok((step, answer))
    })
    .await?;
    Ok(Json(Decision { run: id, node: p.node, step, decision: "approved".into(), answer }))
}

/// Rejects the approval waiting at `{node}` (member): the run is cancelled with
/// `rejected at <node>: <reason>`.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/runs/{run}/approvals/{node}/reject", operation_id = "reject", tag = "approvals",
    params(("org" = String, Path, description = "Org slug"), ("project" = String, Path, description = "Project slug"), ("run" = String, Path, description = "Run id, `run-…`"), ("node" = String, Path, description = "The approval's node")),
    request_body(content = Option<RejectApproval>, description = "Optional reason"),
    responses((status = 200, body = Decision), (status = 409, description = "No approval waits at that node", body = Problem, content_type = "application/problem+json")))]
pub async fn reject(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<ApprovalPath>, JsonOrEmpty(body): JsonOrEmpty<RejectApproval>) -> Result<Json<Decision>, ApiError> {
    scope.require(Role::Member)?;
    let id = run_id(&p.run)?;
    let reason = at_most("reason", body.reason, 200)?;
    let (state, scope, node, reason) = (&state, &scope, &p.node, reason.as_deref());
    let (step, answer) = retry_busy(move || async move {
        let mut ch = scope.change(state).await?;
        in_project(&mut ch, scope, id).await?;
        let step = approvals::reject(&mut ch, scope.org.org, id, node, reason).await?;
        let answer = recorded_answer(&mut ch, scope, step).await?;
        ch.commit().await?;
        Ok((step, answer))
    })
    .await?;
    Ok(Json(Decision { run: id, node: p.node, step, decision: "rejected".into(), answer }))
}
