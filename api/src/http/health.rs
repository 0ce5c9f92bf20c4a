//! `GET /healthz` (the process is up), `GET /readyz` (the database answers and holds this
//! binary's schema) and `GET /api/v1/openapi.json` (this API's document). None needs a token.

use axum::extract::State;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::ApiError;
use super::AppState;

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
#[utoipa::path(get, path = "/readyz", operation_id = "readyz", tag = "health", security(()), responses((status = 200, body = Health), (status = 503, description = "Not ready", body = super::Problem, content_type = "application/problem+json")))]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    match engine::db::check_schema(&state.system).await {
        Ok(()) => Ok(Json(Health { status: "ready".into(), schema: Some(engine::db::code_version()) })),
        Err(e) => {
            tracing::warn!(error = %e, "not ready");
            Err(ApiError::Unavailable(e.to_string()))
        }
    }
}

/// This API's OpenAPI 3.1 document.
#[utoipa::path(get, path = "/api/v1/openapi.json", operation_id = "openapi", tag = "health", security(()),
    responses((status = 200, description = "The OpenAPI document", body = Object)))]
pub async fn openapi_json() -> Json<serde_json::Value> {
    // Built once per process: the routes do not change while it runs.
    static DOC: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    Json(DOC.get_or_init(|| serde_json::to_value(super::openapi()).unwrap_or_default()).clone())
}
