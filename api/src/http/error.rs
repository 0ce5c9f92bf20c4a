//! `ApiError`: every way a request can fail, in one enum with one `match` that gives the
//! status and the problem `type`. Bodies are RFC 9457 `application/problem+json`.
//!
//! A 5xx never shows its cause: the client reads "internal error" and the cause travels in a
//! response extension to the `log_failures` middleware, which logs it once with the request.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use engine::store::StoreError;
use serde::Serialize;
use utoipa::ToSchema;

/// Request bodies above this are refused with 413 (webhooks, which get GitHub's 25 MB, are
/// routed apart).
pub const BODY_LIMIT: usize = 1 << 20;

/// The base of every problem `type` URI; the kind follows it.
pub const PROBLEM_BASE: &str = "https://shopfloor.dev/problems/";

/// An RFC 9457 problem.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
pub struct Problem {
    /// A stable URI per kind of error, e.g. `https://shopfloor.dev/problems/not-found`.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the kind of error; the same for every occurrence.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong with this request.
    pub detail: String,
    /// For an invalid workflow: every problem found, with its place in the YAML.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problems: Option<Vec<WorkflowProblem>>,
}

/// One problem of a workflow definition.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema, PartialEq, Eq)]
pub struct WorkflowProblem {
    /// 1-based line; 0 when the problem is about the whole file.
    pub line: usize,
    /// 1-based column.
    pub col: usize,
    /// Where in the document, e.g. `nodes.build.after[0]`.
    pub path: String,
    pub message: String,
}

impl From<&engine::definition::Problem> for WorkflowProblem {
    fn from(p: &engine::definition::Problem) -> Self {
        WorkflowProblem { line: p.line, col: p.col, path: p.path.clone(), message: p.message.clone() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed input: a body that is not the JSON we expect, a bad query or path parameter.
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    /// Also what an id of another org gets: its existence is not revealed.
    #[error("{0}")]
    NotFound(String),
    #[error("this route does not accept that method")]
    MethodNotAllowed,
    #[error("{0}")]
    Conflict(String),
    #[error("the request body is larger than {} bytes", BODY_LIMIT)]
    PayloadTooLarge,
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// Well-formed input that the domain refuses.
    #[error("{0}")]
    Unprocessable(String),
    #[error("the workflow does not validate: {} problem(s)", .0.len())]
    InvalidWorkflow(Vec<WorkflowProblem>),
    #[error("this Idempotency-Key was used with another request")]
    IdempotencyKeyReused,
    /// Admission's line is full (the org's cap, with 1,000 runs waiting), or a token holds
    /// as many event streams as it may.
    #[error("{0}")]
    TooManyRequests(String),
    /// Over a rate limit (`limits`): sent with `Retry-After`, the wait in whole seconds.
    #[error("too many requests from this token or address; try again in {} s", retry_after_secs(*.0))]
    RateLimited(std::time::Duration),
    /// The handler took longer than its bound and was stopped. What it was doing may or may not
    /// have been committed: read before writing again, or repeat a create with its
    /// `Idempotency-Key`.
    #[error("the request took longer than {} s and was stopped; it may or may not have taken effect", .0.as_secs())]
    TimedOut(std::time::Duration),
    /// A dependency is away (the database unreachable, its pool exhausted, a failover under
    /// way): nothing was written; sent with `Retry-After`.
    #[error("{0}")]
    Unavailable(String),
    /// A transient database refusal (deadlock, serialization failure): nothing was written,
    /// and the same request may be sent again.
    #[error("the change collided with another one and was rolled back; send it again")]
    Busy,
    /// The cause is logged, never sent.
    #[error("internal error")]
    Internal(String),
}

/// The cause of a 5xx, carried to the logging middleware in the response's extensions.
#[derive(Debug, Clone)]
pub struct InternalCause(pub String);

impl ApiError {
    pub fn internal(e: impl std::fmt::Display) -> ApiError {
        ApiError::Internal(e.to_string())
    }

    /// Status, problem kind and title: the one match.
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad-request", "Bad request"),
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden", "Forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            ApiError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed", "Method not allowed"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict", "Conflict"),
            ApiError::PayloadTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large", "Payload too large"),
            ApiError::UnsupportedMediaType(_) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type", "Unsupported media type"),
            ApiError::Unprocessable(_) => (StatusCode::UNPROCESSABLE_ENTITY, "unprocessable", "Unprocessable request"),
            ApiError::InvalidWorkflow(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid-workflow", "Invalid workflow"),
            ApiError::IdempotencyKeyReused => (StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused", "Idempotency key reused"),
            ApiError::TooManyRequests(_) => (StatusCode::TOO_MANY_REQUESTS, "too-many-requests", "Too many requests"),
            ApiError::RateLimited(_) => (StatusCode::TOO_MANY_REQUESTS, "rate-limited", "Rate limited"),
            // 503, not 408: 408 says the client was too slow to send its request; here the
            // server was too slow to answer it.
            ApiError::TimedOut(_) => (StatusCode::SERVICE_UNAVAILABLE, "timeout", "Request timed out"),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable", "Service unavailable"),
            ApiError::Busy => (StatusCode::SERVICE_UNAVAILABLE, "busy", "Busy, retry"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal error"),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    pub fn problem(&self) -> Problem {
        let (status, kind, title) = self.parts();
        let problems = match self {
            ApiError::InvalidWorkflow(p) => Some(p.clone()),
            _ => None,
        };
        Problem {
            kind: format!("{PROBLEM_BASE}{kind}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail: engine::store::cap(&self.to_string()),
            problems,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let problem = self.problem();
        let status = self.status();
        let body = serde_json::to_vec(&problem).unwrap_or_else(|_| b"{}".to_vec());
        let mut response = (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"))], body).into_response();
        match self {
            ApiError::Internal(cause) => {
                response.extensions_mut().insert(InternalCause(cause));
            }
            ApiError::Unauthorized(_) => {
                response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ApiError::RateLimited(wait) => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs(wait)));
            }
            ApiError::Busy => {
                tracing::warn!("a change was rolled back by a deadlock or serialization failure");
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            ApiError::Unavailable(_) => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(UNAVAILABLE_RETRY_SECS));
            }
            _ => {}
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(what) => ApiError::NotFound(format!("{what} not found")),
            StoreError::Stale(m) | StoreError::Conflict(m) | StoreError::Refused(m) => ApiError::Conflict(m),
            StoreError::Full(m) => ApiError::TooManyRequests(m),
            StoreError::Invalid(m) => ApiError::Unprocessable(m),
            StoreError::Sealed(e) => ApiError::Internal(e.to_string()),
            StoreError::Sql(e) => e.into(),
        }
    }
}

/// What a client is told to wait while the database is away: a failover takes seconds.
pub const UNAVAILABLE_RETRY_SECS: u64 = 5;

/// What a client is told while the database is away.
pub const DATABASE_AWAY: &str = "the database is unreachable for now; nothing was changed, try again shortly";

/// Whether a database error says the database is away rather than that the request was wrong:
/// no connection to be had (refused, reset, timed out waiting for the pool), or the server
/// shutting down, starting, or out of connections (SQLSTATE classes 08 and 53, and 57P01-03).
pub fn database_away(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| c.starts_with("08") || c.starts_with("53") || matches!(&*c, "57P01" | "57P02" | "57P03")),
        _ => false,
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        if database_away(&e) {
            tracing::warn!(error = %e, "the database is away");
            return ApiError::Unavailable(DATABASE_AWAY.into());
        }
        // Constraint violations are races the checks before them could not see (two creates
        // with one name): the client's conflict, not our failure.
        if let sqlx::Error::Database(db) = &e {
            match db.code().as_deref() {
                Some("23505") => return ApiError::Conflict("it already exists".into()),
                Some("23503") => return ApiError::Conflict("it refers to something that no longer exists".into()),
                Some("40P01" | "40001" | "55P03") => return ApiError::Busy,
                _ => {}
            }
        }
        ApiError::Internal(e.to_string())
    }
}

/// An RFC 9457 problem response, for callers outside the REST API (health checks).
pub fn problem(status: StatusCode, kind: &str, title: &str, detail: &str) -> Response {
    let body = Problem { kind: format!("{PROBLEM_BASE}{kind}"), title: title.to_owned(), status: status.as_u16(), detail: detail.to_owned(), problems: None };
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"))], bytes).into_response()
}

/// Logs the cause of each 5xx once, with the request it answered.
pub async fn log_failures(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    if let Some(InternalCause(cause)) = response.extensions().get::<InternalCause>() {
        tracing::error!(http.method = %method, http.path = %path, error = %cause, "request failed");
    }
    response
}

/// Answers a route that exists with the wrong method.
pub async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Answers a path that names no route.
pub async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

/// Whole seconds to wait, rounded up and at least 1: the `Retry-After` of a refusal (a rate
/// limit's, `limits`).
pub fn retry_after_secs(wait: std::time::Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_5xx_never_shows_its_cause_but_carries_it_to_the_log() {
        let response = ApiError::Internal("connection to 10.0.0.7 refused; password=hunter2".into()).into_response();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let cause = response.extensions().get::<InternalCause>().map(|c| c.0.clone());
        assert_eq!(cause.as_deref(), Some("connection to 10.0.0.7 refused; password=hunter2"));
        let body = axum::body::to_bytes(response.into_body(), 4096).await.unwrap();
        let text = String::from_utf8_lossy(&body);
        assert!(!text.contains("hunter2") && !text.contains("10.0.0.7"), "{text}");
        let p: Problem = serde_json::from_slice(&body).unwrap();
        assert_eq!((p.kind.as_str(), p.detail.as_str()), ("https://shopfloor.dev/problems/internal", "internal error"));
    }

    #[test]
    fn store_errors_map_to_client_statuses() {
        assert_eq!(ApiError::from(StoreError::NotFound("run")).status(), StatusCode::NOT_FOUND);
        assert_eq!(ApiError::from(StoreError::Conflict("x".into())).status(), StatusCode::CONFLICT);
        assert_eq!(ApiError::from(StoreError::Stale("x".into())).status(), StatusCode::CONFLICT);
        assert_eq!(ApiError::from(StoreError::Invalid("x".into())).status(), StatusCode::UNPROCESSABLE_ENTITY);
    }

    #[tokio::test]
    async fn a_database_that_is_away_is_a_503_with_retry_after() {
        let refused = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        for e in [StoreError::Sql(sqlx::Error::PoolTimedOut), StoreError::Sql(refused)] {
            let response = ApiError::from(e).into_response();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(response.headers()[header::RETRY_AFTER], "5");
            let body = axum::body::to_bytes(response.into_body(), 4096).await.unwrap();
            let p: Problem = serde_json::from_slice(&body).unwrap();
            assert_eq!(p.kind, "https://shopfloor.dev/problems/unavailable");
        }
        assert_eq!(ApiError::from(sqlx::Error::RowNotFound).status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
