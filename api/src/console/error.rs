//! `ConsoleError`: how a console request fails, as an HTML page (or a redirect to sign-in).
//! As in the REST API, a 5xx never shows its cause: it goes to the log once, here.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

use super::escape::{escape, urlencode};
use crate::http::ApiError;

#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// Not signed in (or the session ended): go to the sign-in page, then back to `next`.
    #[error("sign in first")]
    SignIn { next: String },
    /// Also what another org's anything answers: its existence is not revealed.
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Forbidden(String),
    /// A form without the right CSRF token, or posted from another site.
    #[error("this form has expired or did not come from this console; go back, reload the page and try again")]
    Csrf,
    #[error("{0}")]
    BadRequest(String),
    /// Too many sign-in attempts from this address (`http::limits`); sent with `Retry-After`.
    #[error("too many sign-in attempts from this address; try again in {} s", crate::http::error::retry_after_secs(*.0))]
    TooManyRequests(std::time::Duration),
    /// A limit of the REST route behind the page (a token's open streams, a full queue).
    #[error("{0}")]
    Limited(String),
    /// The database (or another dependency) is away; sent with `Retry-After`.
    #[error("{0}")]
    Unavailable(String),
    /// The cause is logged, never shown.
    #[error("internal error")]
    Internal(String),
}

impl ConsoleError {
    pub fn internal(e: impl std::fmt::Display) -> ConsoleError {
        ConsoleError::Internal(e.to_string())
    }
}

impl From<sqlx::Error> for ConsoleError {
    fn from(e: sqlx::Error) -> Self {
        ConsoleError::from(ApiError::from(e))
    }
}

impl From<engine::store::StoreError> for ConsoleError {
    fn from(e: engine::store::StoreError) -> Self {
        ConsoleError::from(ApiError::from(e))
    }
}

impl From<ApiError> for ConsoleError {
    fn from(e: ApiError) -> Self {
        match e {
            ApiError::NotFound(m) => ConsoleError::NotFound(m),
            ApiError::Forbidden(m) => ConsoleError::Forbidden(m),
            ApiError::Unauthorized(_) => ConsoleError::SignIn { next: "/".into() },
            ApiError::Internal(m) => ConsoleError::Internal(m),
            ApiError::TooManyRequests(m) => ConsoleError::Limited(m),
            ApiError::Unavailable(m) => ConsoleError::Unavailable(m),
            other if other.status().is_server_error() => ConsoleError::Internal(other.to_string()),
            other => ConsoleError::BadRequest(other.to_string()),
        }
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        let (status, title) = match &self {
            ConsoleError::SignIn { next } => {
                let to = format!("/signin?next={}", urlencode(next));
                return Redirect::to(&to).into_response();
            }
            ConsoleError::NotFound(_) => (StatusCode::NOT_FOUND, "Not found"),
            ConsoleError::Forbidden(_) => (StatusCode::FORBIDDEN, "Not allowed"),
            ConsoleError::Csrf => (StatusCode::FORBIDDEN, "Form expired"),
            ConsoleError::BadRequest(_) => (StatusCode::BAD_REQUEST, "Bad request"),
            ConsoleError::TooManyRequests(_) => (StatusCode::TOO_MANY_REQUESTS, "Too many attempts"),
            ConsoleError::Limited(_) => (StatusCode::TOO_MANY_REQUESTS, "Too many requests"),
            ConsoleError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "Unavailable for a moment"),
            ConsoleError::Internal(cause) => {
                tracing::error!(error = %cause, "console request failed");
                (StatusCode::INTERNAL_SERVER_ERROR, "Something went wrong")
            }
        };
        let detail = escape(&self.to_string());
        let body = format!(
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
             <title>{title} · shopfloor</title><link rel=\"stylesheet\" href=\"/static/console.css\"></head>\
             <body><main class=\"narrow\"><h1>{title}</h1><p>{detail}</p><p><a href=\"/\">Back to the console</a></p></main></body></html>"
        );
        let mut response = (status, body).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
        match self {
            ConsoleError::TooManyRequests(wait) => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(crate::http::error::retry_after_secs(wait)));
            }
            ConsoleError::Unavailable(_) => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(crate::http::error::UNAVAILABLE_RETRY_SECS));
            }
            _ => {}
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_while_the_database_is_away_is_a_503_with_retry_after() {
        let response = ConsoleError::from(sqlx::Error::PoolTimedOut).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "5");
        let response = ConsoleError::from(engine::store::StoreError::Sql(sqlx::Error::PoolClosed)).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
