//! What a host does with a step it holds: `start`, `heartbeat`, `session` (transcript lines
//! and usage), `complete` (fenced on the holder), `messages/delivered` and `token` (a fresh
//! installation token for the step's repository).

use axum::extract::State;
use engine::ids::StepId;
use engine::state::StepState;
use engine::store::hosts::{self as store, Completion, HostRow, LogLine};
use engine::store::steps::{Failure, FailureClass};
use engine::store::{StoreError, cap};
use protocol::{Complete, DeliveredMessages, Message, Outcome, Secret, SessionLine, Standing, StartStep, StepToken, Usage};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::{HostStep, MAX_LINES, StepPath};
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::http::extract::{Json, JsonOrEmpty, at_most_items};

fn standing(state: StepState) -> Standing {
    Standing { state: state.to_string(), stop: !matches!(state, StepState::Leased | StepState::Running), messages: Vec::new() }
}

/// The messages waiting for a step this host runs (none once it must stop).
async fn waiting_messages(state: &AppState, host: &HostRow, step: StepId, now: StepState) -> Result<Vec<Message>, ApiError> {
    if now != StepState::Running {
        return Ok(Vec::new());
    }
    let pending = engine::store::messages::pending(&state.db, host, step).await?;
    Ok(pending.into_iter().map(|m| Message { id: m.message_id, text: m.text }).collect())
}

/// The host starts work on a leased step (`leased → running`). 409 when it no longer holds it.
#[utoipa::path(post, path = "/host/steps/{step}/start", operation_id = "start_step", tag = "host-protocol",
    params(StepPath),
    request_body(content = Option<StartStep>, description = "The harness"),
    responses((status = 200, body = Standing)))]
pub async fn start(State(state): State<AppState>, me: HostStep, JsonOrEmpty(body): JsonOrEmpty<StartStep>) -> Result<Json<Standing>, ApiError> {
    let harness = body.harness.as_deref().map(cap).unwrap_or_default();
    let row = store::start(&state.db, &me.host, me.step, &harness, body.unwalled).await?;
    Ok(Json(standing(row.state())))
}

/// Renews the lease of a held step; the answer says when the host must stop it (cancelled,
/// taken back, failed `budget_hard_stop` because a hard budget is spent, or failed `stalled`
/// because the crew step's session reported nothing for 10 minutes).
#[utoipa::path(post, path = "/host/steps/{step}/heartbeat", operation_id = "heartbeat_step", tag = "host-protocol",
    params(StepPath),
    responses((status = 200, body = Standing)))]
pub async fn heartbeat(State(state): State<AppState>, me: HostStep) -> Result<Json<Standing>, ApiError> {
    // A hard budget spent or a silent session stops the step here; the answer says stop.
    let now = store::heartbeat(&state.db, &me.host, me.step, state.stall_after()).await?;
    let mut answer = standing(now);
    answer.messages = waiting_messages(&state, &me.host, me.step, now).await?;
    Ok(Json(answer))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionReport {
    pub harness: Option<String>,
    #[serde(default)]
    pub lines: Vec<SessionLine>,
    #[serde(default)]
    pub usage: Usage,
    /// Destinations the step's proxy refused, `host:port`, each once; at most 32.
    #[serde(default)]
    #[schema(max_items = 32)]
    pub egress_refused: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionAnswer {
    pub state: String,
    pub stop: bool,
    /// Lines stored by this report.
    pub stored: usize,
    /// Lines dropped because the run's transcript reached its cap.
    pub dropped: usize,
    /// Messages from people for the session, as in a heartbeat's answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<Message>,
}

/// Reports a held step's session: transcript lines and running usage. Renews the lease.
#[utoipa::path(post, path = "/host/steps/{step}/session", operation_id = "report_session", tag = "host-protocol",
    params(StepPath),
    request_body = SessionReport,
    responses((status = 200, body = SessionAnswer)))]
pub async fn session(State(state): State<AppState>, me: HostStep, Json(body): Json<SessionReport>) -> Result<Json<SessionAnswer>, ApiError> {
    at_most_items(&body.lines, MAX_LINES, "lines per report")?;
    if body.lines.iter().any(|l| l.seq < 1) {
        return Err(ApiError::Unprocessable("line numbers start at 1".into()));
    }
    let lines: Vec<LogLine> = body.lines.into_iter().map(|l| LogLine { seq: l.seq, stream: l.stream, line: l.line }).collect();
    let harness = body.harness.as_deref().map(cap);
    at_most_items(&body.egress_refused, protocol::MAX_EGRESS_REFUSED, "refused destinations per report")?;
    let report = store::Report { harness: harness.as_deref(), lines: &lines, usage: &body.usage, egress_refused: &body.egress_refused };
    let r = store::report(&state.db, &me.host, me.step, report, store::RUN_LOG_CAP_BYTES).await?;
    let s = standing(r.state);
    let messages = waiting_messages(&state, &me.host, me.step, r.state).await?;
    Ok(Json(SessionAnswer { state: s.state, stop: s.stop, stored: r.stored, dropped: r.dropped, messages }))
}

/// Records how a held step ended. A step the server ended while this host held it (cancelled,
/// stopped by a hard budget) keeps its end and answers its state: the result is dropped, the
/// session's final figures are recorded (what it spent). 409 when another host holds it.
#[utoipa::path(post, path = "/host/steps/{step}/complete", operation_id = "complete_step", tag = "host-protocol",
    params(StepPath),
    request_body = Complete,
    responses((status = 200, body = Standing)))]
pub async fn complete(State(state): State<AppState>, me: HostStep, Json(body): Json<Complete>) -> Result<Json<Standing>, ApiError> {
    let mut output = match body.output {
        Value::Object(map) => map,
        Value::Null => serde_json::Map::new(),
        _ => return Err(ApiError::Unprocessable("output must be a JSON object".into())),
    };
    let usage = body.usage;
    // The figures are part of the output, so templates and decisions can read them
    // (`nodes.plan.output.usage.cost_usd`).
    output.insert(
        "usage".into(),
        json!({
            "cost_usd": engine::hosts::reported(&usage),
            "estimated_cost_usd": engine::hosts::estimated(&usage),
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "turns": usage.turns,
            "tool_calls": usage.tool_calls,
            "model": usage.model,
        }),
    );
    let failure = match body.outcome {
        Outcome::Succeeded => None,
        Outcome::Failed => {
            let class = match body.class.as_deref().unwrap_or("ordinary") {
                "ordinary" => FailureClass::Ordinary,
                "infrastructure" => FailureClass::Infrastructure,
                "final" => FailureClass::Final,
                other => return Err(ApiError::Unprocessable(format!("`{}` is not a failure class (ordinary, infrastructure, final)", cap(other)))),
            };
            let reason = body.reason.as_deref().map(str::trim).filter(|r| !r.is_empty()).unwrap_or("failed");
            if reason.chars().count() > 200 {
                return Err(ApiError::Unprocessable("a reason is a short machine string (at most 200 characters); text belongs in the session".into()));
            }
            Some(Failure { reason: reason.to_owned(), class, exit_code: body.exit_code })
        }
    };
    let completion = Completion { output: Value::Object(output), failure, usage, harness: body.harness.as_deref().map(cap) };
    let row = store::complete(&state.db, &me.host, me.step, &completion).await.map_err(|e| match e {
        StoreError::Stale(_) => ApiError::Conflict("this host no longer holds the step: it was cancelled or taken back".into()),
        e => e.into(),
    })?;
    Ok(Json(standing(row.state())))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeliveredAnswer {
    /// Messages newly marked delivered (one acknowledged twice counts once).
    pub marked: u64,
}

/// Acknowledges messages of a step the host holds as written to its harness: they are not
/// offered again.
#[utoipa::path(post, path = "/host/steps/{step}/messages/delivered", operation_id = "ack_step_messages", tag = "host-protocol",
    params(StepPath),
    request_body = DeliveredMessages,
    responses((status = 200, body = DeliveredAnswer)))]
pub async fn messages_delivered(State(state): State<AppState>, me: HostStep, Json(body): Json<DeliveredMessages>) -> Result<Json<DeliveredAnswer>, ApiError> {
    at_most_items(&body.messages, 100, "messages per acknowledgement")?;
    let marked = engine::store::messages::delivered(&state.db, &me.host, me.step, &body.messages).await?;
    Ok(Json(DeliveredAnswer { marked }))
}

/// Mints a fresh installation token for the repository of a step this host holds (leased or
/// running), scoped to that one repository with the push permission. The repository is the
/// step's run's, connected to the host's project — never one the caller names. 404 for a step
/// that is not the org's; 409 when this host no longer holds it; 503 when GitHub cannot mint
/// one now (the host keeps the token it has).
#[utoipa::path(post, path = "/host/steps/{step}/token", operation_id = "step_token", tag = "host-protocol",
    params(StepPath),
    responses((status = 200, body = StepToken)))]
pub async fn token(State(state): State<AppState>, me: HostStep) -> Result<Json<StepToken>, ApiError> {
    use secrecy::ExposeSecret;
    let mut conn = state.db.begin().await?;
    let held: Option<(String, Option<String>, engine::ids::RunId)> = sqlx::query_as(
        "SELECT s.state, s.holder, s.run_id FROM steps s JOIN runs r ON r.run_id = s.run_id AND r.org_id = s.org_id \
         WHERE s.step_id = $1 AND s.org_id = $2 AND r.project_id = $3",
    )
    .bind(me.step)
    .bind(me.host.org_id)
    .bind(me.host.project_id)
    .fetch_optional(&mut *conn)
    .await?;
    let (now, holder, run) = held.ok_or_else(|| ApiError::NotFound("step not found".into()))?;
    if !matches!(now.as_str(), "leased" | "running") || holder.as_deref() != Some(store::holder(me.host.host_id).as_str()) {
        return Err(ApiError::Conflict(format!("this host no longer holds the step (it is {now})")));
    }
    // The repository the claim's assignment named, never one the caller names.
    let found = store::run_repository(&mut conn, me.host.org_id, run).await?;
    drop(conn);
    let (repository, installation) = (found.as_ref().map(|r| r.full_name.clone()), found.and_then(|r| r.installation_id));
    let (Some(app), Some(name), Some(installation)) = (state.shared.github.get(), repository.as_deref(), installation) else {
        return Ok(Json(StepToken { repository, token: None }));
    };
    match app.installation_token(installation, name, engine::github::client::Scope::Push).await {
        Ok(token) => Ok(Json(StepToken { repository: repository.clone(), token: Some(Secret::new(token.expose_secret())) })),
        Err(e) => {
            tracing::warn!(github.repository = name, step.id = %me.step, error = %e, "cannot mint an installation token for a held step");
            Err(ApiError::Unavailable("GitHub cannot mint a token now; try again".into()))
        }
    }
}
