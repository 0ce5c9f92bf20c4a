//! The answers to a run's approvals (member): approve with the form's fields, or reject with
//! an optional reason.

use axum::extract::State;
use engine::ids::{RunId, StepId};
use engine::store::approvals;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::{ApprovalPath, ProjectRun, retry_busy};
use crate::http::AppState;
use crate::http::auth::Role;
use crate::http::error::ApiError;
use crate::http::extract::{Json, JsonOrEmpty, Path, at_most};
use crate::http::tenant::ProjectScope;

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

/// A person's answer to an approval: the form's fields, or a rejection's reason.
#[derive(Clone, Copy)]
enum Verdict<'a> {
    Approve(&'a Map<String, Value>),
    Reject(Option<&'a str>),
}

/// Records the answer to the approval waiting at `node`, with the answer as it was checked and
/// stored (the node's output), read inside the change that recorded it.
async fn decide(state: &AppState, scope: &ProjectScope, id: RunId, node: &str, verdict: Verdict<'_>) -> Result<Decision, ApiError> {
    let (step, answer) = retry_busy(move || async move {
        let mut ch = scope.change(state).await?;
        let step = match verdict {
            Verdict::Approve(fields) => approvals::approve(&mut ch, scope.org.org, id, node, fields).await?,
            Verdict::Reject(reason) => approvals::reject(&mut ch, scope.org.org, id, node, reason).await?,
        };
        let answer: Option<Value> =
            sqlx::query_scalar("SELECT answer FROM approvals WHERE step_id = $1 AND org_id = $2").bind(step).bind(scope.org.org).fetch_one(ch.conn()).await?;
        ch.commit().await?;
        Ok((step, answer.unwrap_or(Value::Null)))
    })
    .await?;
    let decision = match verdict {
        Verdict::Approve(_) => "approved",
        Verdict::Reject(_) => "rejected",
    };
    Ok(Decision { run: id, node: node.to_owned(), step, decision: decision.into(), answer })
}

/// Approves the approval waiting at `{node}` with the form's fields (member). A missing
/// required field, a wrong type, or a key the form does not declare (such as `decision`) is
/// refused with 422 and the run keeps waiting. The run-level approval of `approval: required`
/// is the node `$start`.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/runs/{run}/approvals/{node}", operation_id = "approve", tag = "approvals",
    params(ProjectScope, ApprovalPath),
    request_body(content = Option<Object>, description = "The form's fields"),
    responses((status = 200, body = Decision), (status = 409, description = "No approval waits at that node")))]
pub async fn approve(
    State(state): State<AppState>, ProjectRun { scope, run: id }: ProjectRun, Path(p): Path<ApprovalPath>, JsonOrEmpty(fields): JsonOrEmpty<Map<String, Value>>,
) -> Result<Json<Decision>, ApiError> {
    scope.require(Role::Member)?;
    Ok(Json(decide(&state, &scope, id, &p.node, Verdict::Approve(&fields)).await?))
}

/// Rejects the approval waiting at `{node}` (member): the run is cancelled with
/// `rejected at <node>: <reason>`.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/runs/{run}/approvals/{node}/reject", operation_id = "reject", tag = "approvals",
    params(ProjectScope, ApprovalPath),
    request_body(content = Option<RejectApproval>, description = "Optional reason"),
    responses((status = 200, body = Decision), (status = 409, description = "No approval waits at that node")))]
pub async fn reject(
    State(state): State<AppState>, ProjectRun { scope, run: id }: ProjectRun, Path(p): Path<ApprovalPath>, JsonOrEmpty(body): JsonOrEmpty<RejectApproval>,
) -> Result<Json<Decision>, ApiError> {
    scope.require(Role::Member)?;
    let reason = at_most("reason", body.reason, 200)?;
    Ok(Json(decide(&state, &scope, id, &p.node, Verdict::Reject(reason.as_deref())).await?))
}
