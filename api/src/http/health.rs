//! `GET /healthz` (the process is up) and `GET /readyz` (the database answers and holds this
//! binary's schema). Neither needs a token. (`GET /api/v1/openapi.json` is served beside the
//! routes it describes, in `http/mod.rs`.)

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::error::ApiError;

#[derive(Serialize, ToSchema)]
pub struct Health {
    /// `ok` or `ready`.
    pub status: String,
    /// The schema version this binary holds (readiness only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema: Option<i64>,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", operation_id = "healthz", tag = "health", security(()), responses((status = 200, body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok".into(), schema: None })
}

/// The database answers and holds this binary's schema.
#[utoipa::path(get, path = "/readyz", operation_id = "readyz", tag = "health", security(()), responses((status = 200, body = Health), (status = 503, description = "Not ready")))]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    match engine::db::check_schema(&state.system).await {
        Ok(()) => Ok(Json(Health { status: "ready".into(), schema: Some(engine::db::code_version()) })),
        Err(e) => {
            tracing::warn!(error = %e, "not ready");
            Err(ApiError::Unavailable(e.to_string()))
        }
    }
}
