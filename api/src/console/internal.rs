//! Calls to the REST API, in-process: a request built here goes through the same router,
//! extractors, role checks and handlers as one from the network. The signed-in caller rides in
//! the request's extensions, where the bearer extractor looks first, so the handler sees the
//! person exactly as it would see their token.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use axum::response::Response;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tower::ServiceExt as _;

use super::{Console, ConsoleError};
use crate::http::Problem;
use crate::http::auth::Caller;

/// A refusal of the REST API (4xx), to show beside the form that caused it.
#[derive(Debug, Clone)]
pub(super) struct Refusal {
    pub status: StatusCode,
    pub problem: Problem,
}

impl Refusal {
    pub(super) fn detail(&self) -> &str {
        &self.problem.detail
    }
}

impl Console {
    /// Sends one request to the REST router as `caller`; `path` is below `/api/v1`.
    pub(super) async fn dispatch(
        &self, caller: &Caller, method: Method, path: &str, body: Option<Value>, headers: &[(&str, &str)],
    ) -> Result<Response, ConsoleError> {
        let mut req = Request::builder().method(method).uri(format!("/api/v1{path}"));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let body = match body {
            Some(v) => {
                req = req.header(header::CONTENT_TYPE, "application/json");
                Body::from(serde_json::to_vec(&v).map_err(ConsoleError::internal)?)
            }
            None => Body::empty(),
        };
        let mut req = req.body(body).map_err(ConsoleError::internal)?;
        req.extensions_mut().insert(caller.clone());
        self.inner.api.clone().oneshot(req).await.map_err(|e| ConsoleError::internal(format!("{e:?}")))
    }

    /// Sends a request and reads its answer: the JSON body on success, the problem on a 4xx.
    pub(super) async fn call(&self, caller: &Caller, method: Method, path: &str, body: Option<Value>) -> Result<Result<Value, Refusal>, ConsoleError> {
        let response = self.dispatch(caller, method, path, body, &[]).await?;
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 16 << 20).await.map_err(ConsoleError::internal)?;
        if status.is_success() {
            if bytes.is_empty() {
                return Ok(Ok(Value::Null));
            }
            return serde_json::from_slice(&bytes).map(Ok).map_err(ConsoleError::internal);
        }
        let problem: Problem = serde_json::from_slice(&bytes).map_err(|e| ConsoleError::internal(format!("{status} without a problem body: {e}")))?;
        if status.is_server_error() {
            // The REST layer has logged the cause already.
            return Err(ConsoleError::Internal(format!("the REST API answered {status}")));
        }
        Ok(Err(Refusal { status, problem }))
    }

    /// A read that must succeed: a refusal becomes the page's error.
    pub(super) async fn read<T: DeserializeOwned>(&self, caller: &Caller, path: &str) -> Result<T, ConsoleError> {
        match self.call(caller, Method::GET, path, None).await? {
            Ok(v) => serde_json::from_value(v).map_err(ConsoleError::internal),
            Err(r) => Err(match r.status {
                StatusCode::NOT_FOUND => ConsoleError::NotFound(r.problem.detail),
                StatusCode::FORBIDDEN => ConsoleError::Forbidden(r.problem.detail),
                StatusCode::UNAUTHORIZED => ConsoleError::SignIn { next: "/".into() },
                _ => ConsoleError::BadRequest(r.problem.detail),
            }),
        }
    }
}
