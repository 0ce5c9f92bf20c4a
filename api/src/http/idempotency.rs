//! `Idempotency-Key` on create-POSTs: the same key with the same request gets the same answer
//! (status and body, with `Idempotent-Replayed: true`); the same key with another request is
//! refused with 422. The key is claimed as the first write of the create's own change and the
//! answer recorded in it, so a create runs at most once per key even under concurrent retries
//! (the second waits on the first's row, then replays its answer).

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use engine::ids::OrgId;
use engine::store::Change;
use engine::store::api_writes::{self, KeyClaim};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::error::ApiError;
use super::extract::{IdempotencyKey, KeyedRequest};

/// What makes two requests "the same": method, path with query, and the parsed body in a
/// canonical form (so key order and whitespace do not matter).
fn fingerprint(request: &KeyedRequest, body: &impl Serialize) -> String {
    let mut hash = Sha256::new();
    hash.update(request.request.as_bytes());
    hash.update(b"\n");
    hash.update(serde_json::to_vec(body).unwrap_or_default());
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Claims the key for this request with this body; `Some` is the earlier answer to send again.
pub async fn claim(ch: &mut Change, org: OrgId, key: &IdempotencyKey, body: &impl Serialize) -> Result<Option<Response>, ApiError> {
    let Some(keyed) = &key.0 else { return Ok(None) };
    match api_writes::claim_key(ch, org, &keyed.key, &fingerprint(keyed, body)).await? {
        KeyClaim::New => Ok(None),
        KeyClaim::Mismatch => Err(ApiError::IdempotencyKeyReused),
        KeyClaim::Replay { status, body } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            let mut response = (status, axum::Json(body)).into_response();
            response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
            Ok(Some(response))
        }
    }
}

/// The answer to a create, recorded under its key when it has one (before the change
/// commits).
pub async fn answer<T: Serialize>(ch: &mut Change, org: OrgId, key: &IdempotencyKey, status: StatusCode, body: &T) -> Result<Response, ApiError> {
    let value = serde_json::to_value(body).map_err(ApiError::internal)?;
    if let Some(keyed) = &key.0 {
        api_writes::record_answer(ch, org, &keyed.key, status.as_u16(), &value).await?;
    }
    Ok((status, axum::Json(value)).into_response())
}

/// A create under its key, in the create's own change `ch`: the earlier answer when this key
/// was used before, else what `create` makes, recorded under the key as the answer (201
/// Created) before the change commits.
pub async fn create<T: Serialize>(
    mut ch: Change, org: OrgId, key: &IdempotencyKey, request: &impl Serialize, create: impl AsyncFnOnce(&mut Change) -> Result<T, ApiError>,
) -> Result<Response, ApiError> {
    if let Some(replay) = claim(&mut ch, org, key, request).await? {
        return Ok(replay);
    }
    let created = create(&mut ch).await?;
    let response = answer(&mut ch, org, key, StatusCode::CREATED, &created).await?;
    ch.commit().await?;
    Ok(response)
}
