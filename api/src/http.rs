//! The axum router and the server loop.
//!
//! Errors leave as `application/problem+json` (RFC 9457). So far: `GET /healthz` (the process
//! is up) and `GET /readyz` (the database answers and holds this binary's schema).

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use sqlx::PgPool;

#[derive(Clone)]
pub struct AppState {
    pub db: PgPool,
}

pub fn router(state: AppState) -> Router {
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz)).with_state(state)
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

async fn readyz(State(state): State<AppState>) -> Response {
    match engine::db::check_schema(&state.db).await {
        Ok(()) => Json(json!({ "status": "ready", "schema": engine::db::code_version() })).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "not ready");
            problem(StatusCode::SERVICE_UNAVAILABLE, "not-ready", "Not ready", &e.to_string())
        }
    }
}

/// An RFC 9457 problem response.
pub fn problem(status: StatusCode, kind: &str, title: &str, detail: &str) -> Response {
    let body = json!({
        "type": format!("https://shopfloor.dev/problems/{kind}"),
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    (status, [(header::CONTENT_TYPE, "application/problem+json")], body.to_string()).into_response()
}
