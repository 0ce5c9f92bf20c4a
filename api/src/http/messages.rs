//! Intervene: a person's message to a live crew session (`POST …/steps/{step}/messages`).
//!
//! Member or above. The step must be a crew step running on a host with a harness that takes
//! messages while it runs (Claude Code); otherwise 409 says why. The message is stored
//! (`engine::store::messages`), audited as the caller, and noted by a `step.message` run event
//! (who and how long, not the text); the host that holds the step receives it in the answer to
//! its next heartbeat or session report and writes it to the harness's standard input.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use engine::ids::{RunId, StepId};
use engine::store::messages as store;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::auth::Role;
use super::error::ApiError;
use super::extract::{Json, PathId};
use super::runs::{ProjectRun, StepPath};
use super::tenant::ProjectScope;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SendMessage {
    /// What to tell the agent, 1 to 20,000 characters.
    #[schema(min_length = 1, max_length = 20_000)]
    pub text: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SentMessage {
    pub id: uuid::Uuid,
    #[schema(value_type = String)]
    pub run: RunId,
    #[schema(value_type = String)]
    pub step: StepId,
    pub chars: usize,
    pub sent_at: DateTime<Utc>,
    /// Set once the host wrote it to the harness.
    pub delivered_at: Option<DateTime<Utc>>,
}

/// Sends a message to a running crew session (member): the host holding the step writes it
/// to the harness as a user turn. 409 when the step is not a live session or its harness
/// cannot take messages (`codex`, `command`).
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/runs/{run}/steps/{step}/messages", operation_id = "send_step_message", tag = "runs",
    params(ProjectScope, StepPath),
    request_body = SendMessage,
    responses((status = 201, body = SentMessage),
              (status = 409, description = "Not a live session, or its harness cannot take messages")))]
pub async fn send(
    State(state): State<AppState>, ProjectRun { scope, run }: ProjectRun, PathId(step): PathId<StepId>, Json(body): Json<SendMessage>,
) -> Result<(StatusCode, Json<SentMessage>), ApiError> {
    scope.require(Role::Member)?;
    let mut ch = scope.change(&state).await?;
    let id = store::send(&mut ch, scope.org.org, run, step, &body.text).await?;
    let (chars, sent_at): (i32, DateTime<Utc>) =
        sqlx::query_as("SELECT length(text), created_at FROM step_messages WHERE message_id = $1").bind(id).fetch_one(ch.conn()).await?;
    ch.commit().await?;
    Ok((StatusCode::CREATED, Json(SentMessage { id, run, step, chars: chars.max(0) as usize, sent_at, delivered_at: None })))
}
