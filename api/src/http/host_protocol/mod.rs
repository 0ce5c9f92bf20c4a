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
//! credentials do on every other route. This module holds the host's extractor and `register`;
//! `claim.rs` the claim, `held.rs` the calls about a step the host holds. Every request
//! body, and the answers the host reads as they are (`Standing`, `StopStep`, `StepToken`), are
//! the `protocol` crate's; the answers only the server writes are here, beside their handlers.

pub mod claim;
pub mod held;

use std::time::Duration;

use axum::extract::{FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use engine::hosts::Capability;
use engine::ids::StepId;
use engine::store::hosts::{self as store, HostRow, NewHost};
use engine::store::{Actor, Change};
use protocol::RegisterHost;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::{Caller, TokenKind};
use super::error::ApiError;
use super::extract::{Json, PathId, at_most_items};
use crate::auth::issue_host_credential;

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
        let host = store::by_token(&state.db, caller.org, caller.jti).await?.ok_or_else(|| ApiError::Forbidden("this host was deregistered".into()))?;
        store::seen(&state.db, &host).await?;
        Ok(HostCaller { caller, host })
    }
}

/// A step route's host, by its credential, and the step the path names. Whether the host holds
/// the step is the store's to check, in the statement that acts on it.
pub struct HostStep {
    pub host: HostRow,
    pub step: StepId,
}

impl FromRequestParts<AppState> for HostStep {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let HostCaller { host, .. } = HostCaller::from_request_parts(parts, state).await?;
        let PathId(step) = PathId::from_request_parts(parts, state).await?;
        Ok(HostStep { host, step })
    }
}

/// The path of a held step's routes, as documented; `HostStep` reads it.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct StepPath {
    /// Step id, `step-…`
    pub step: String,
}

// ---------------------------------------------------------------------------------------------
// register

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
    at_most_items(&caps, 64, "capabilities")?;
    caps.sort();
    caps.dedup();
    let mut ch = Change::begin(&state.db, Actor::Token(caller.jti)).await?;
    let new =
        NewHost { org: caller.org, project, name: &body.name, capabilities: &caps, max_concurrent: body.max_concurrent.unwrap_or(1), registration: caller.jti };
    let host = store::register(&mut ch, &new).await?;
    let (_, token, expires_at) =
        issue_host_credential(&mut ch, state.secret_key(), caller.org, project, host, body.name.trim(), chrono::Duration::days(CREDENTIAL_DAYS)).await?;
    ch.commit().await?;
    Ok((StatusCode::CREATED, Json(HostCredential { host_id: host.0, token, expires_at, org: caller.org_slug })).into_response())
}
