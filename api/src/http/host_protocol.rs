//! The host protocol: what `shopfloor host` calls, under `/api/v1/host/…`.
//!
//! - `register` — a registration token (shown once to an admin) registers one host and is
//!   revoked by doing so; the answer is the host's credential.
//! - `claim` — a long poll (up to 30 s) with the host's credential: answered at once when a
//!   crew step the host can run is ready (it is leased to the host with its assignment), or
//!   when a step the host runs was cancelled or taken back (`stop`). The replica waits on its
//!   event hub's single `LISTEN` connection (`events::EventHub::ready` and its event feed),
//!   never on a connection or a loop of queries per request. A host keeps one claim open at all
//!   times (with `max: 0` when its slots are full), so a cancel reaches it within a second.
//! - `start`, `heartbeat`, `session` (transcript lines and usage; renews the lease) and
//!   `complete` (the outcome, fenced on the holder) for each step it holds. The answers to
//!   heartbeats and session reports carry the step's undelivered messages (intervene), which
//!   the host acknowledges with `messages/delivered` once it wrote them to the harness.
//! - `token` — a fresh installation token for the repository of a step the host holds, asked
//!   before each fetch and push and after adopting an attempt (the claim's lasts an hour; the
//!   journal keeps none).
//!
//! Every write goes through `engine::store::hosts`. Person tokens get 403 here, as host
//! credentials do on every other route.

use std::time::Duration;

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use engine::hosts::{Assignment, Capability, Usage};
use engine::ids::StepId;
use engine::state::StepState;
use engine::store::hosts::{self as store, Completion, HostRow, LogLine, NewHost};
use engine::store::steps::{Failure, FailureClass};
use engine::store::{cap, Actor, Change, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;
use utoipa::ToSchema;

use super::auth::{Caller, TokenKind};
use super::error::ApiError;
use super::extract::{Json, Path};
use super::AppState;
use crate::auth::issue_host_credential;

/// The longest a claim waits.
pub const MAX_WAIT_SECS: u32 = 30;
/// A host credential's lifetime; deregistering the host revokes it sooner.
const CREDENTIAL_DAYS: i64 = 365;
/// Lines per session report.
const MAX_LINES: usize = 2_000;
/// When a claim passed over a step because an engine held its run, it looks again after this.
const CONTENDED_RETRY: Duration = Duration::from_millis(100);

/// The host a host credential belongs to.
#[derive(Debug, Clone)]
pub struct HostCaller {
    pub caller: Caller,
    pub host: HostRow,
}

impl FromRequestParts<AppState> for HostCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let caller = Caller::from_request_parts(parts, state).await?;
        if caller.kind != TokenKind::Host {
            return Err(ApiError::Forbidden("the host protocol needs a host credential".into()));
        }
        let host = store::by_token(&state.db, caller.org, caller.jti)
            .await?
            .ok_or_else(|| ApiError::Forbidden("this host was deregistered".into()))?;
        store::seen(&state.db, &host).await?;
        Ok(HostCaller { caller, host })
    }
}

fn step_id(text: &str) -> Result<StepId, ApiError> {
    text.parse().map_err(|_| ApiError::NotFound("step not found".into()))
}

#[derive(Debug, Deserialize)]
pub struct StepPath {
    step: String,
}

// ---------------------------------------------------------------------------------------------
// register

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterHost {
    /// The host's name in lists (`build-box-3`).
    pub name: String,
    /// What it offers: `linux`, `arm64`, `gpu`, `harness:claude-code`, …; at most 64.
    #[serde(default)]
    #[schema(max_items = 64)]
    pub capabilities: Vec<String>,
    /// Steps it runs at once, 1 to 64 (1 by default).
    #[schema(minimum = 1, maximum = 64)]
    pub max_concurrent: Option<u32>,
}

/// A host's credential: `token` is shown this once.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HostCredential {
    pub host_id: uuid::Uuid,
    pub token: String,
    pub expires_at: DateTime<Utc>,
    /// The org's slug.
    pub org: String,
}

/// Registers a host with a registration token (which it revokes) and answers its credential.
#[utoipa::path(post, path = "/host/register", operation_id = "register_host", tag = "host-protocol",
    request_body = RegisterHost,
    responses((status = 201, body = HostCredential)))]
pub async fn register(State(state): State<AppState>, caller: Caller, Json(body): Json<RegisterHost>) -> Result<Response, ApiError> {
    if caller.kind != TokenKind::Registration {
        return Err(ApiError::Forbidden("registering a host needs a registration token".into()));
    }
    let project = caller.project.ok_or_else(|| ApiError::Forbidden("this registration token names no project".into()))?;
    let mut caps = Vec::with_capacity(body.capabilities.len());
    for c in &body.capabilities {
        caps.push(Capability::parse(c).map_err(|e| ApiError::Unprocessable(e.to_string()))?);
    }
    if caps.len() > 64 {
        return Err(ApiError::Unprocessable("at most 64 capabilities".into()));
    }
    caps.sort();
    caps.dedup();
    let mut ch = Change::begin(&state.db, Actor::Token(caller.jti)).await?;
    let new = NewHost { org: caller.org, project, name: &body.name, capabilities: &caps, max_concurrent: body.max_concurrent.unwrap_or(1), registration: caller.jti };
    let host = store::register(&mut ch, &new).await?;
    let (_, token, expires_at) = issue_host_credential(&mut ch, state.secret_key(), caller.org, project, host, body.name.trim(), chrono::Duration::days(CREDENTIAL_DAYS)).await?;
    ch.commit().await?;
    Ok((StatusCode::CREATED, Json(HostCredential { host_id: host.0, token, expires_at, org: caller.org_slug })).into_response())
}

// ---------------------------------------------------------------------------------------------
// claim

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// Steps wanted now, 0 to 64 (the host's free slots; the server also counts them against
    /// the host's `max_concurrent`). 0 only watches the held steps.
    #[serde(default)]
    #[schema(maximum = 64)]
    pub max: u32,
    /// Seconds to wait for work, 0 to 30 (30 by default).
    #[schema(maximum = 30)]
    pub wait_secs: Option<u32>,
    /// The steps the host runs now (`step-…`), at most 64: the answer names those it must
    /// stop.
    #[serde(default)]
    #[schema(max_items = 64)]
    pub held: Vec<String>,
}

/// A held step the host must stop, and why (its state now, or `gone`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StopStep {
    pub step: String,
    pub state: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ClaimAnswer {
    pub assignments: Vec<Assignment>,
    pub stop: Vec<StopStep>,
}

/// Claims ready crew steps for this host, waiting up to `wait_secs` for one; answers at once
/// when a held step must stop.
#[utoipa::path(post, path = "/host/claim", operation_id = "claim_steps", tag = "host-protocol",
    request_body = ClaimRequest,
    responses((status = 200, body = ClaimAnswer)))]
pub async fn claim(State(state): State<AppState>, me: HostCaller, Json(body): Json<ClaimRequest>) -> Result<Json<ClaimAnswer>, ApiError> {
    if body.max > store::MAX_SLOTS {
        return Err(ApiError::Unprocessable(format!("max is at most {}", store::MAX_SLOTS)));
    }
    if body.held.len() > store::MAX_SLOTS as usize {
        return Err(ApiError::Unprocessable(format!("held names at most {} steps", store::MAX_SLOTS)));
    }
    let wait_secs = body.wait_secs.unwrap_or(MAX_WAIT_SECS);
    if wait_secs > MAX_WAIT_SECS {
        return Err(ApiError::Unprocessable(format!("wait_secs is at most {MAX_WAIT_SECS}")));
    }
    let wait = Duration::from_secs(u64::from(wait_secs));
    let held: Vec<StepId> = body.held.iter().map(|s| s.parse().map_err(|_| ApiError::BadRequest(format!("`{}` is not a step id", cap(s))))).collect::<Result<_, _>>()?;
    let deadline = tokio::time::Instant::now() + wait;
    // Subscribed before the first look, so nothing that happens meanwhile is missed.
    let mut ready = state.shared.events.ready();
    ready.mark_unchanged();
    let mut feed = state.shared.events.subscribe();
    let closing = state.shared.closing.clone();
    loop {
        let stop = store::to_stop(&state.db, &me.host, &held).await?;
        if !stop.is_empty() {
            let stop = stop.into_iter().map(|(s, state)| StopStep { step: s.to_string(), state }).collect();
            return Ok(Json(ClaimAnswer { assignments: Vec::new(), stop }));
        }
        let mut contended = false;
        if body.max > 0 {
            let claimed = store::claim(&state.db, &state.shared.catalog, &me.host, body.max).await?;
            if !claimed.assignments.is_empty() {
                let mut assignments = claimed.assignments;
                for a in &mut assignments {
                    if let Some(repo) = a.repository.as_mut() {
                        repo.token = installation_token(&state, &me.host, &repo.full_name).await;
                    }
                }
                return Ok(Json(ClaimAnswer { assignments, stop: Vec::new() }));
            }
            contended = claimed.contended;
        }
        // Wait for something that may change the answer.
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return Ok(Json(ClaimAnswer { assignments: Vec::new(), stop: Vec::new() })),
                () = closing.cancelled() => return Ok(Json(ClaimAnswer { assignments: Vec::new(), stop: Vec::new() })),
                () = tokio::time::sleep(CONTENDED_RETRY), if contended => break,
                changed = ready.changed(), if body.max > 0 => {
                    if changed.is_err() {
                        return Err(ApiError::Unavailable("the event hub stopped".into()));
                    }
                    break;
                }
                event = feed.recv() => match event {
                    Ok(e) if e.org == me.host.org_id && e.event.step.is_some_and(|s| held.contains(&s))
                        && matches!(e.event.kind.as_str(), "step.cancelled" | "step.failed" | "step.succeeded") => break,
                    Ok(_) => {}
                    // Fell behind: look at the held steps again rather than guess.
                    Err(RecvError::Lagged(_)) => break,
                    Err(RecvError::Closed) => return Err(ApiError::Unavailable("the event hub stopped".into())),
                },
            }
        }
    }
}

/// A token for this repository alone from the GitHub App's installation, when the App is
/// configured; minted after the claim committed (no transaction waits on GitHub). Without one
/// the host uses its own git credentials, so a failure here is logged, not fatal.
async fn installation_token(state: &AppState, host: &HostRow, repository: &str) -> Option<String> {
    use secrecy::ExposeSecret;
    let app = state.shared.github.get()?;
    let installation: Option<Option<i64>> =
        sqlx::query_scalar("SELECT installation_id FROM repositories WHERE org_id = $1 AND project_id = $2 AND full_name = $3")
            .bind(host.org_id)
            .bind(host.project_id)
            .bind(repository)
            .fetch_optional(&state.db)
            .await
            .ok()?;
    let installation = installation.flatten()?;
    match app.installation_token(installation, repository, engine::github::client::Scope::Push).await {
        Ok(token) => Some(token.expose_secret().to_owned()),
        Err(e) => {
            tracing::warn!(github.repository = repository, error = %e, "cannot mint an installation token for an assignment; the host's own credentials apply");
            None
        }
    }
}

// ---------------------------------------------------------------------------------------------
// start, heartbeat, session, complete

/// Where a held step stands.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StepStanding {
    /// `leased`, `running`, or the state it moved to without the host.
    pub state: String,
    /// The host must stop working on the step (cancelled, taken back, finished).
    pub stop: bool,
    /// Messages from people for the running session, oldest first (heartbeats only): write
    /// each to the harness, then acknowledge it (`messages/delivered`); until then it is
    /// offered again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<StepMessage>,
}

/// A person's message to a running session (intervene).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StepMessage {
    pub id: uuid::Uuid,
    pub text: String,
}

fn standing(state: StepState) -> StepStanding {
    StepStanding { state: state.to_string(), stop: !matches!(state, StepState::Leased | StepState::Running), messages: Vec::new() }
}

/// The messages waiting for a step this host runs (none once it must stop).
async fn waiting_messages(state: &AppState, host: &HostRow, step: StepId, now: StepState) -> Result<Vec<StepMessage>, ApiError> {
    if now != StepState::Running {
        return Ok(Vec::new());
    }
    let pending = engine::store::messages::pending(&state.db, host, step).await?;
    Ok(pending.into_iter().map(|m| StepMessage { id: m.message_id, text: m.text }).collect())
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartStep {
    /// The harness the host runs (`claude-code`, `codex`, `command`).
    pub harness: Option<String>,
}

/// The host starts work on a leased step (`leased → running`). 409 when it no longer holds it.
#[utoipa::path(post, path = "/host/steps/{step}/start", operation_id = "start_step", tag = "host-protocol",
    params(("step" = String, Path, description = "Step id, `step-…`")),
    request_body(content = Option<StartStep>, description = "The harness"),
    responses((status = 200, body = StepStanding)))]
pub async fn start(State(state): State<AppState>, me: HostCaller, Path(p): Path<StepPath>, super::extract::JsonOrEmpty(body): super::extract::JsonOrEmpty<StartStep>) -> Result<Json<StepStanding>, ApiError> {
    let step = step_id(&p.step)?;
    let harness = body.harness.as_deref().map(cap).unwrap_or_default();
    let row = store::start(&state.db, &me.host, step, &harness).await?;
    Ok(Json(standing(row.state())))
}

/// Renews the lease of a held step; the answer says when the host must stop it (cancelled,
/// taken back, failed `budget_hard_stop` because a hard budget is spent, or failed `stalled`
/// because the crew step's session reported nothing for 10 minutes).
#[utoipa::path(post, path = "/host/steps/{step}/heartbeat", operation_id = "heartbeat_step", tag = "host-protocol",
    params(("step" = String, Path, description = "Step id, `step-…`")),
    responses((status = 200, body = StepStanding)))]
pub async fn heartbeat(State(state): State<AppState>, me: HostCaller, Path(p): Path<StepPath>) -> Result<Json<StepStanding>, ApiError> {
    let step = step_id(&p.step)?;
    // A hard budget spent or a silent session stops the step here; the answer says stop.
    let now = store::heartbeat(&state.db, &me.host, step, state.stall_after()).await?;
    let mut answer = standing(now);
    answer.messages = waiting_messages(&state, &me.host, step, now).await?;
    Ok(Json(answer))
}

/// One transcript line.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionLine {
    /// The host's number for the line, from 1; a line sent again is stored once.
    pub seq: i64,
    /// `assistant`, `tool_result`, `result`, `stdout`, `stderr`, …
    pub stream: String,
    pub line: String,
}

/// A session's running totals (cumulative).
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageDoc {
    #[serde(default)]
    pub input_tokens: i64,
    #[serde(default)]
    pub output_tokens: i64,
    /// Null while unknown.
    pub cost_usd: Option<f64>,
    #[serde(default)]
    pub turns: i32,
    #[serde(default)]
    pub tool_calls: i32,
    pub model: Option<String>,
    /// The host's estimate of the cost so far, from each message's token counts and its price
    /// table (Claude Code reports its cost only at the end, Codex never). Budgets count the
    /// larger of this and `cost_usd`.
    #[serde(default)]
    pub estimated_cost_usd: Option<f64>,
    /// `price_table`, or `unknown_model` when a model was priced at the table's dearest row.
    #[serde(default)]
    pub estimate_basis: Option<String>,
    /// The output tokens are a lower bound: no result line counted them.
    #[serde(default)]
    pub output_tokens_lower_bound: bool,
}

impl From<&UsageDoc> for Usage {
    fn from(u: &UsageDoc) -> Usage {
        Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cost_usd: u.cost_usd,
            turns: u.turns,
            tool_calls: u.tool_calls,
            model: u.model.clone(),
            estimated_cost_usd: u.estimated_cost_usd,
            estimate_basis: u.estimate_basis.clone(),
            output_tokens_lower_bound: u.output_tokens_lower_bound,
        }
    }
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionReport {
    pub harness: Option<String>,
    #[serde(default)]
    pub lines: Vec<SessionLine>,
    #[serde(default)]
    pub usage: UsageDoc,
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
    pub messages: Vec<StepMessage>,
}

/// Reports a held step's session: transcript lines and running usage. Renews the lease.
#[utoipa::path(post, path = "/host/steps/{step}/session", operation_id = "report_session", tag = "host-protocol",
    params(("step" = String, Path, description = "Step id, `step-…`")),
    request_body = SessionReport,
    responses((status = 200, body = SessionAnswer)))]
pub async fn session(State(state): State<AppState>, me: HostCaller, Path(p): Path<StepPath>, Json(body): Json<SessionReport>) -> Result<Json<SessionAnswer>, ApiError> {
    let step = step_id(&p.step)?;
    if body.lines.len() > MAX_LINES {
        return Err(ApiError::Unprocessable(format!("at most {MAX_LINES} lines per report")));
    }
    if body.lines.iter().any(|l| l.seq < 1) {
        return Err(ApiError::Unprocessable("line numbers start at 1".into()));
    }
    let lines: Vec<LogLine> = body.lines.into_iter().map(|l| LogLine { seq: l.seq, stream: l.stream, line: l.line }).collect();
    let harness = body.harness.as_deref().map(cap);
    let r = store::report(&state.db, &me.host, step, harness.as_deref(), &lines, &Usage::from(&body.usage), store::RUN_LOG_CAP_BYTES).await?;
    let s = standing(r.state);
    let messages = waiting_messages(&state, &me.host, step, r.state).await?;
    Ok(Json(SessionAnswer { state: s.state, stop: s.stop, stored: r.stored, dropped: r.dropped, messages }))
}

/// How a step ended on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Succeeded,
    Failed,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteStep {
    pub outcome: Outcome,
    /// A failure's short machine reason: `timeout`, `turn cap reached`, `budget cap reached`,
    /// `exit code 1`, `no_changes`, `push_failed`, …
    pub reason: Option<String>,
    /// `ordinary` (the node's `retry:` decides), `infrastructure` (retried by itself) or
    /// `final` (never retried). `ordinary` by default.
    pub class: Option<String>,
    pub exit_code: Option<i32>,
    /// The step's output: `text`, `files_changed`, `files`, `pr_body`, `branch`, `head_sha`,
    /// `commits`, … An object.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub output: Value,
    #[serde(default)]
    pub usage: UsageDoc,
    pub harness: Option<String>,
}

/// Records how a held step ended. 409 when the host no longer holds it (cancelled, taken
/// back after its lease lapsed): the result is dropped.
#[utoipa::path(post, path = "/host/steps/{step}/complete", operation_id = "complete_step", tag = "host-protocol",
    params(("step" = String, Path, description = "Step id, `step-…`")),
    request_body = CompleteStep,
    responses((status = 200, body = StepStanding)))]
pub async fn complete(State(state): State<AppState>, me: HostCaller, Path(p): Path<StepPath>, Json(body): Json<CompleteStep>) -> Result<Json<StepStanding>, ApiError> {
    let step = step_id(&p.step)?;
    let mut output = match body.output {
        Value::Object(map) => map,
        Value::Null => serde_json::Map::new(),
        _ => return Err(ApiError::Unprocessable("output must be a JSON object".into())),
    };
    let usage = Usage::from(&body.usage);
    // The figures are part of the output, so templates and decisions can read them
    // (`nodes.plan.output.usage.cost_usd`).
    output.insert(
        "usage".into(),
        json!({
            "cost_usd": usage.reported(),
            "estimated_cost_usd": usage.estimated(),
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
    let row = store::complete(&state.db, &me.host, step, &completion).await.map_err(|e| match e {
        StoreError::Stale(_) => ApiError::Conflict("this host no longer holds the step: it was cancelled or taken back".into()),
        e => e.into(),
    })?;
    Ok(Json(standing(row.state())))
}

// ---------------------------------------------------------------------------------------------
// messages delivered, token

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveredMessages {
    /// The ids of the messages the host wrote to the harness.
    pub messages: Vec<uuid::Uuid>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeliveredAnswer {
    /// Messages newly marked delivered (one acknowledged twice counts once).
    pub marked: u64,
}

/// Acknowledges messages of a step the host holds as written to its harness: they are not
/// offered again.
#[utoipa::path(post, path = "/host/steps/{step}/messages/delivered", operation_id = "ack_step_messages", tag = "host-protocol",
    params(("step" = String, Path, description = "Step id, `step-…`")),
    request_body = DeliveredMessages,
    responses((status = 200, body = DeliveredAnswer)))]
pub async fn messages_delivered(State(state): State<AppState>, me: HostCaller, Path(p): Path<StepPath>, Json(body): Json<DeliveredMessages>) -> Result<Json<DeliveredAnswer>, ApiError> {
    let step = step_id(&p.step)?;
    if body.messages.len() > 100 {
        return Err(ApiError::Unprocessable("at most 100 messages per acknowledgement".into()));
    }
    let marked = engine::store::messages::delivered(&state.db, &me.host, step, &body.messages).await?;
    Ok(Json(DeliveredAnswer { marked }))
}

/// A fresh installation token for a held step's repository.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StepToken {
    /// `owner/name`: the repository of the step's run, when it is about a connected one.
    pub repository: Option<String>,
    /// A token for that repository alone with `contents: write` (fetch and push); null when
    /// the GitHub App is not configured here or the run is about no connected repository (the
    /// host's own git credentials apply).
    pub token: Option<String>,
}

/// Mints a fresh installation token for the repository of a step this host holds (leased or
/// running), scoped to that one repository with the push permission. The repository is the
/// step's run's, connected to the host's project — never one the caller names. 404 for a step
/// that is not the org's; 409 when this host no longer holds it; 503 when GitHub cannot mint
/// one now (the host keeps the token it has).
#[utoipa::path(post, path = "/host/steps/{step}/token", operation_id = "step_token", tag = "host-protocol",
    params(("step" = String, Path, description = "Step id, `step-…`")),
    responses((status = 200, body = StepToken)))]
pub async fn token(State(state): State<AppState>, me: HostCaller, Path(p): Path<StepPath>) -> Result<Json<StepToken>, ApiError> {
    use secrecy::ExposeSecret;
    let step = step_id(&p.step)?;
    let mut conn = state.db.begin().await?;
    let held: Option<(String, Option<String>, engine::ids::RunId)> = sqlx::query_as(
        "SELECT s.state, s.holder, s.run_id FROM steps s JOIN runs r ON r.run_id = s.run_id AND r.org_id = s.org_id \
         WHERE s.step_id = $1 AND s.org_id = $2 AND r.project_id = $3",
    )
    .bind(step)
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
        Ok(token) => Ok(Json(StepToken { repository: repository.clone(), token: Some(token.expose_secret().to_owned()) })),
        Err(e) => {
            tracing::warn!(github.repository = name, step.id = %step, error = %e, "cannot mint an installation token for a held step");
            Err(ApiError::Unavailable("GitHub cannot mint a token now; try again".into()))
        }
    }
}
