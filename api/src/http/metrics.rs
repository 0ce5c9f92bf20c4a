//! `GET /metrics` (Prometheus, OpenMetrics text) and the middleware that counts HTTP requests.
//!
//! The metrics themselves are defined in `engine::metrics`, one registry per process, so
//! `shopfloor serve` shows its engine's figures here too. The route is unauthenticated, like
//! `/healthz`, and outside the OpenAPI document (it is for scrapers, not API clients); no
//! label carries tenant data or a secret: requests are counted by the matched route's
//! template (`/api/v1/orgs/{org}/projects/{project}/runs`), never the raw path.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;

/// The path scrapers ask for.
pub const PATH: &str = "/metrics";

/// `GET /metrics` on the API server: the process's metrics, with the database's figures.
pub async fn scrape(State(state): State<AppState>) -> Response {
    answer(engine::metrics::render(Some(&state.system)).await)
}

/// The metrics as a response.
pub fn answer(text: String) -> Response {
    let mut response = text.into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(engine::metrics::CONTENT_TYPE));
    response
}

/// Counts every request by method, matched route and status, and times it to the response's
/// head. A request no route matched is counted as `unmatched`; a method outside HTTP's own as
/// `other` (labels stay few whatever a client sends).
pub async fn track(request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = match *request.method() {
        Method::GET | Method::POST | Method::PUT | Method::PATCH | Method::DELETE | Method::HEAD | Method::OPTIONS => request.method().as_str().to_owned(),
        _ => "other".to_owned(),
    };
    let started = Instant::now();
    let response = next.run(request).await;
    engine::metrics::http_request(&method, &route, response.status().as_u16(), started.elapsed());
    response
}
