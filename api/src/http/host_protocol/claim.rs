//! `claim`: a long poll for ready crew steps (each leased to the host with its assignment)
//! and for the held steps the host must stop.

use std::time::Duration;

use axum::extract::State;
use engine::hosts::Assignment;
use engine::ids::StepId;
use engine::store::cap;
use engine::store::hosts::{self as store, HostRow};
use protocol::{ClaimRequest, Secret, StopStep};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;
use utoipa::ToSchema;

use super::{CONTENDED_RETRY, HostCaller};
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::http::extract::{Json, at_most_items};
use crate::http::limits::MAX_WAIT_SECS;

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
    at_most_items(&body.held, store::MAX_SLOTS as usize, "held steps")?;
    let wait_secs = body.wait_secs.unwrap_or(MAX_WAIT_SECS);
    if wait_secs > MAX_WAIT_SECS {
        return Err(ApiError::Unprocessable(format!("wait_secs is at most {MAX_WAIT_SECS}")));
    }
    let wait = Duration::from_secs(u64::from(wait_secs));
    let held: Vec<StepId> =
        body.held.iter().map(|s| s.parse().map_err(|_| ApiError::BadRequest(format!("`{}` is not a step id", cap(s))))).collect::<Result<_, _>>()?;
    let deadline = tokio::time::Instant::now() + wait;
    // Subscribed before the first look, so nothing that happens meanwhile is missed.
    let mut ready = state.shared.events.ready();
    ready.mark_unchanged();
    let mut feed = state.shared.events.subscribe().await?;
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

const INSTALLATION_OF_REPOSITORY: &str = "SELECT installation_id FROM repositories WHERE org_id = $1 AND project_id = $2 AND full_name = $3";

/// A token for this repository alone from the GitHub App's installation, when the App is
/// configured; minted after the claim committed (no transaction waits on GitHub). Without one
/// the host uses its own git credentials, so a failure here is logged, not fatal.
async fn installation_token(state: &AppState, host: &HostRow, repository: &str) -> Option<Secret> {
    use secrecy::ExposeSecret;
    let app = state.shared.github.get()?;
    let installation: Option<Option<i64>> =
        sqlx::query_scalar(INSTALLATION_OF_REPOSITORY).bind(host.org_id).bind(host.project_id).bind(repository).fetch_optional(&state.db).await.ok()?;
    let installation = installation.flatten()?;
    match app.installation_token(installation, repository, engine::github::client::Scope::Push).await {
        Ok(token) => Some(Secret::new(token.expose_secret())),
        Err(e) => {
            tracing::warn!(github.repository = repository, error = %e, "cannot mint an installation token for an assignment; the host's own credentials apply");
            None
        }
    }
}
