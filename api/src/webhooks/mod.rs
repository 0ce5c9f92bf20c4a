//! `POST /webhooks/github`: GitHub App deliveries in.
//!
//! The order matters. A request from an address that sent too many badly signed ones lately
//! is refused with 429, and one whose `Content-Length` is over GitHub's 25 MB cap with 413,
//! both before its body is read (`guard`). The body is read (a chunked one is cut at the cap:
//! 413), then its
//! `X-Hub-Signature-256` is checked in constant time against the webhook secret **before
//! anything parses it**: an unsigned or badly signed request gets 401 and nothing is stored.
//! Only then is the JSON read, and the whole delivery handled in one transaction by
//! `engine::triggers::ingest`: a redelivery (an `X-GitHub-Delivery` already stored) answers 200
//! and does nothing; everything else is stored with its outcome and answered 202, unknown
//! event types and repositories no project connected included.
//!
//! The handler calls no GitHub API and writes no table itself (the store does), so it answers
//! well within GitHub's 10 s.
//!
//! Deliveries whose signature holds are never rate limited: GitHub sends from a few addresses,
//! in bursts as large as the events behind them, and does not send a refused delivery again.
//! One whose signature fails is a refused credential, charged to its address as a 401 of the
//! REST API is (`http::limits`); the request timeout applies as to the REST API.
//!
//! # A webhook becomes a run
//!
//! 1. GitHub posts `issues.labeled` to `/webhooks/github`. `api::webhooks` reads the body (25 MB
//!    at most), checks `X-Hub-Signature-256` in constant time, and only then hands the headers
//!    and bytes to `engine::triggers::ingest`. No GitHub API call is made on this path.
//! 2. One `Change` begins. The delivery id is inserted into `github_deliveries`; if it is
//!    already there, the change is dropped and the answer is 200 (a redelivery does nothing).
//! 3. The delivery is routed by its installation and `repository.full_name` to every project
//!    that connected the repository. An unknown installation or repository is stored with no
//!    org and answered 202 (`unrouted`; an installation no org has claimed yet: `unclaimed`);
//!    so is an event type the ingest does not know. `installation` and
//!    `installation_repositories` deliveries make the installation known and keep the list of
//!    repositories it reaches (`store/installations.rs`), whoever has claimed it; a
//!    `repository` delivery that renames or transfers a repository moves the list, the projects'
//!    connections and waiting runs' watches to the new name (items keep the name they were made
//!    under).
//! 4. For each project: a new item `["github","acme/widgets",42]` is inserted with the payload
//!    applied to an empty projection (`item_for_update`): this change holds it, and no run or
//!    queued event can be on it, so nothing is looked up for it in steps 5–7. A known item has
//!    its open runs and then its row locked (runs before items, the order engines use), and the
//!    payload is applied to the projection. A payload older than the stored one (`updated_at`)
//!    changes nothing. The content hash is recomputed.
//! 5. Each workflow of the project with `on.github` (latest version, not paused) is judged:
//!    `events` names `issues.labeled`, the sender may trigger, and the `if:` holds. Then a
//!    trigger event is inserted under its dedup key; a key already stored means the workflow
//!    already acted on this content, and nothing happens.
//! 6. The claim (`store::triggers`): an open run of the workflow on the item that has started
//!    (an engine or a host ever held one of its steps; also while it now waits for CI, an
//!    approval or a retry's backoff) → the event is `queued` behind it. An open run that has
//!    not started (no step yet, parked on its `$start` approval, a crew step waiting for a host)
//!    → cancelled `superseded by <event>`, and its cycle is given back. The item's cycle budget
//!    is taken under its row lock; at
//!    `max_cycles` the event is `blocked` and an ask is recorded (`cycle_asks`), and while an
//!    ask is open on the item every other workflow's event is `blocked` too. Otherwise
//!    `runs::submit` opens the run with its wake.
//! 7. A workflow whose `if:` no longer holds for the trigger that opened a run that has not
//!    started revokes it (`revoked`), and revokes its queued events; a started run finishes.
//! 8. The delivery's outcome and per-workflow claims are stored; the change commits with one
//!    `NOTIFY`; the answer is 202. An engine wakes and advances the run.
//! 9. When that run ends, the last step of its run-ended sequence (`store/run_ended.rs`) is
//!    `store::triggers::claim::rejudge`, in the same transaction: the newest event queued behind it is judged again on the stored projection
//!    (a failing `if:` counts as a match) and claimed; older ones are superseded by it.
//! 10. A reset (`reset_cycle_budget`) bumps the item's generation, which new dedup keys carry,
//!     clears its asks, and judges the blocked events again.

mod signature;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use engine::db::Db;
use engine::triggers::ingest::{self, Delivery, IngestError, IngestOutcome};
use secrecy::SecretString;
use serde_json::json;

use crate::http::limits::{LimitArgs, Limits, declared_length, retry_after_secs};

pub use signature::{sign, verify};

/// GitHub's cap on a webhook payload.
pub const BODY_LIMIT: usize = 25 * 1024 * 1024;

/// What the webhook route needs: the database and the App's webhook secret.
#[derive(Clone)]
pub struct WebhookState {
    db: Db,
    /// None: no secret is configured, and every delivery is refused with 503 (`shopfloor
    /// check` says how to set it).
    secret: Option<Arc<SecretString>>,
    /// The replica's abuse limits: addresses refused after bad signatures, the timeout.
    limits: Arc<Limits>,
}

impl WebhookState {
    /// With the default limits; `with_limits` gives it the replica's.
    pub fn new(db: Db, secret: Option<SecretString>) -> WebhookState {
        WebhookState { db, secret: secret.map(Arc::new), limits: Arc::new(Limits::new(&LimitArgs::default())) }
    }

    /// Shares the replica's limits (`AppState::limits`), so that an address refused on the
    /// REST API is refused here too.
    pub fn with_limits(mut self, limits: Arc<Limits>) -> WebhookState {
        self.limits = limits;
        self
    }
}

/// The webhook routes, with their own body limit (the REST API's is far smaller).
pub fn router(state: WebhookState) -> Router {
    Router::new()
        .route("/webhooks/github", post(github))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn_with_state(state.limits.clone(), crate::http::limits::timeout))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// A delivery whose signature holds is never refused by a rate limit: GitHub does not send a
/// refused delivery again, and one sender's bad signatures must not lock out GitHub's sharing
/// its address (behind a proxy, everyone's). So before the body is read only what cannot be a
/// signed delivery is refused from an emptied address (no signature header: 429), and a
/// declared length over the cap 413; after the answer a bad signature is charged to the
/// sender's address, and from an emptied one answered 429.
async fn guard(State(state): State<WebhookState>, request: Request, next: Next) -> Response {
    let address = state.limits.address(&request);
    let refused = address.and_then(|a| state.limits.refused(a));
    if let Some(wait) = refused.filter(|_| !request.headers().contains_key(SIGNATURE)) {
        return WebhookError::RateLimited(wait).into_response();
    }
    if declared_length(request.headers()).is_some_and(|n| n > BODY_LIMIT as u64) {
        return WebhookError::TooLarge.into_response();
    }
    let response = next.run(request).await;
    if let (Some(address), StatusCode::UNAUTHORIZED) = (address, response.status()) {
        // What follows from this address may be refused.
        let charged = state.limits.charge_address(address);
        if let Some(wait) = refused.or(charged.err()) {
            return WebhookError::RateLimited(wait).into_response();
        }
    }
    response
}

/// The header a signed delivery carries.
const SIGNATURE: &str = "x-hub-signature-256";

/// Every way a delivery is refused.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("the X-Hub-Signature-256 header is missing")]
    MissingSignature,
    #[error("the X-Hub-Signature-256 signature does not match the body")]
    BadSignature,
    #[error("the {0} header is missing or not text")]
    MissingHeader(&'static str),
    #[error("{0}")]
    Malformed(String),
    #[error("no webhook secret is configured: set SHOPFLOOR_GITHUB_WEBHOOK_SECRET")]
    NoSecret,
    #[error("the body is larger than GitHub's {BODY_LIMIT} bytes")]
    TooLarge,
    /// Too many badly signed requests came from this address lately.
    #[error("too many badly signed requests from this address; try again in {} s", retry_after_secs(*.0))]
    RateLimited(std::time::Duration),
    /// Logged here, never sent.
    #[error("internal error")]
    Internal(String),
}

impl WebhookError {
    fn status(&self) -> (StatusCode, &'static str) {
        match self {
            WebhookError::MissingSignature | WebhookError::BadSignature => (StatusCode::UNAUTHORIZED, "bad-signature"),
            WebhookError::MissingHeader(_) | WebhookError::Malformed(_) => (StatusCode::BAD_REQUEST, "bad-request"),
            WebhookError::NoSecret => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            WebhookError::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large"),
            WebhookError::RateLimited(_) => (StatusCode::TOO_MANY_REQUESTS, "rate-limited"),
            WebhookError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl IntoResponse for WebhookError {
    fn into_response(self) -> Response {
        let (status, kind) = self.status();
        if let WebhookError::Internal(cause) = &self {
            tracing::error!(error = %cause, "webhook delivery failed");
        }
        let body = json!({
            "type": format!("{}{kind}", crate::http::error::PROBLEM_BASE),
            "title": status.canonical_reason().unwrap_or("error"),
            "status": status.as_u16(),
            "detail": self.to_string(),
        });
        let mut response = (status, axum::Json(body)).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if let WebhookError::RateLimited(wait) = self {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs(wait)));
        }
        response
    }
}

fn text<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, WebhookError> {
    headers.get(name).and_then(|v| v.to_str().ok()).filter(|v| !v.is_empty()).ok_or(WebhookError::MissingHeader(name))
}

/// `POST /webhooks/github`, counted by event and outcome. The event is named only once the
/// signature holds (`unverified` before), so an unsigned request cannot add labels.
async fn github(state: State<WebhookState>, headers: HeaderMap, body: Bytes) -> Response {
    let result = handle(state, &headers, body).await;
    let verified = !matches!(result, Err(WebhookError::MissingSignature | WebhookError::BadSignature | WebhookError::NoSecret));
    let event = if verified { headers.get("x-github-event").and_then(|v| v.to_str().ok()).unwrap_or("none") } else { "unverified" };
    let outcome = match &result {
        Ok(response) if response.status() == StatusCode::OK => "redelivery",
        Ok(_) => "accepted",
        Err(e) => e.status().1,
    };
    engine::metrics::github_webhook(event, outcome);
    result.into_response()
}

async fn handle(State(state): State<WebhookState>, headers: &HeaderMap, body: Bytes) -> Result<Response, WebhookError> {
    let secret = state.secret.as_deref().ok_or(WebhookError::NoSecret)?;
    let signature = headers.get(SIGNATURE).ok_or(WebhookError::MissingSignature)?.to_str().map_err(|_| WebhookError::BadSignature)?;
    if !verify(secret, &body, signature) {
        return Err(WebhookError::BadSignature);
    }
    let id = text(headers, "x-github-delivery")?;
    let event = text(headers, "x-github-event")?;
    // A repository's or an org's webhook may be set to send a form (`payload=` and the JSON,
    // signed as sent); an App's always sends JSON.
    let form = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|t| t.starts_with("application/x-www-form-urlencoded"));
    let payload = if form {
        url::form_urlencoded::parse(&body)
            .find(|(name, _)| name == "payload")
            .map(|(_, json)| Bytes::from(json.into_owned()))
            .ok_or_else(|| WebhookError::Malformed("a form-encoded delivery has no `payload` field".into()))?
    } else {
        body
    };
    let delivery = Delivery { id, event, body: &payload };
    // The delivery's span is the root of the trace of each run it opens (`engine::trace`).
    // It carries the delivery's id and event, never a header's secret or the signature.
    let span =
        tracing::info_span!(parent: None, "webhook", otel.name = "POST /webhooks/github", otel.kind = "server", github.delivery = id, github.event = event);
    let ingested = tracing::Instrument::instrument(ingest::ingest(&state.db, &delivery), span.clone()).await;
    let _in_span = span.enter();
    match ingested {
        Ok(IngestOutcome::Redelivery) => {
            tracing::info!(github.delivery = id, github.event = event, "redelivery ignored");
            Ok((StatusCode::OK, axum::Json(json!({ "delivery": id, "outcome": "redelivery" }))).into_response())
        }
        Ok(IngestOutcome::Accepted { outcome, runs_opened }) => {
            tracing::info!(github.delivery = id, github.event = event, outcome = %outcome, runs_opened, "delivery ingested");
            let body = json!({ "delivery": id, "outcome": outcome, "runs_opened": runs_opened });
            Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response())
        }
        Err(IngestError::Malformed(why)) => Err(WebhookError::Malformed(format!("the payload is not a JSON object: {why}"))),
        Err(IngestError::Store(e)) => Err(WebhookError::Internal(e.to_string())),
    }
}
