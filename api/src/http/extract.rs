//! Extractors whose rejection is an [`ApiError`], so malformed input gets our problem shape
//! rather than axum's plain-text answers: JSON bodies (unknown fields refused where the type
//! says `deny_unknown_fields`), optional JSON bodies, workflow sources (YAML or JSON), path
//! and query parameters, and the `Idempotency-Key` header.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, RawPathParams, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use engine::ids::{RunId, StepId, UserId};
use serde::Serialize;
use serde::de::DeserializeOwned;
use utoipa::IntoParams;
use utoipa::openapi::Required;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};

use super::error::ApiError;

fn body_error(rejection: BytesRejection) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::PayloadTooLarge
    } else {
        ApiError::BadRequest(format!("cannot read the request body: {}", rejection.body_text()))
    }
}

fn content_type(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    Some(value.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
}

fn is_json(ct: &str) -> bool {
    ct == "application/json" || (ct.starts_with("application/") && ct.ends_with("+json"))
}

/// Parses JSON, naming what is wrong (with its line and column) in a 400. Every body of
/// this API is an object (serde would also fill a struct from an array), and no text in it
/// may hold NUL (`\u0000`), which PostgreSQL cannot store.
fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()).is_some_and(|b| *b != b'{') {
        return Err(ApiError::BadRequest("invalid JSON body: it must be an object, `{…}`".into()));
    }
    if has_nul_escape(bytes) {
        return Err(ApiError::BadRequest("invalid JSON body: text may not contain NUL (\\u0000)".into()));
    }
    let refused = match serde_json::from_slice(bytes) {
        Ok(v) => return Ok(v),
        Err(e) => ApiError::BadRequest(format!("invalid JSON body: {e}")),
    };
    // JSON has one number type: `52.0` is the integer 52 to a JSON Schema, and so to the API
    // document. A body refused while it holds whole numbers written with a fraction or an
    // exponent is read again with those as integers; otherwise the first error stands.
    let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(bytes) else { return Err(refused) };
    if !whole_numbers_as_integers(&mut value) {
        return Err(refused);
    }
    serde_json::from_value(value).map_err(|_| refused)
}

/// Rewrites each number with no fraction (`52.0`, `1e3`) as an integer, where one holds it;
/// whether any was.
fn whole_numbers_as_integers(value: &mut serde_json::Value) -> bool {
    match value {
        serde_json::Value::Number(n) => match n.as_f64().filter(|f| n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15) {
            Some(f) => {
                *n = serde_json::Number::from(f as i64);
                true
            }
            None => false,
        },
        serde_json::Value::Array(items) => items.iter_mut().map(whole_numbers_as_integers).fold(false, std::ops::BitOr::bitor),
        serde_json::Value::Object(fields) => fields.values_mut().map(whole_numbers_as_integers).fold(false, std::ops::BitOr::bitor),
        _ => false,
    }
}

/// Whether JSON text holds the escape `\u0000`. A backslash in valid JSON only starts an
/// escape inside a string, so the bytes after each one say which; `\\u0000` (an escaped
/// backslash, then text) is not one.
fn has_nul_escape(bytes: &[u8]) -> bool {
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            if bytes.get(i + 1) == Some(&b'u') && bytes.get(i + 2..i + 6) == Some(b"0000") {
                return true;
            }
            i += 2;
        } else {
            i += 1;
        }
    }
    false
}

/// Refuses a request whose path or query holds NUL (`%00`), which no id, name or filter can
/// contain and PostgreSQL cannot compare: a 400, before any handler reads it.
pub async fn refuse_nul(req: Request, next: axum::middleware::Next) -> Response {
    if has_nul(req.uri()) {
        return ApiError::BadRequest(NUL.into()).into_response();
    }
    next.run(req).await
}

pub const NUL: &str = "the path and query may not contain NUL (%00)";

/// Whether a request's path or query holds an encoded NUL, which no name, id or filter can.
pub fn has_nul(uri: &axum::http::Uri) -> bool {
    uri.path().contains("%00") || uri.query().is_some_and(|q| q.contains("%00"))
}

/// A JSON request body.
pub struct Json<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match content_type(req.headers()) {
            Some(ct) if is_json(&ct) => {}
            Some(ct) => return Err(ApiError::UnsupportedMediaType(format!("expected application/json, got `{}`", engine::store::cap(&ct)))),
            None => return Err(ApiError::UnsupportedMediaType("expected a JSON body with Content-Type: application/json".into())),
        }
        let bytes = Bytes::from_request(req, state).await.map_err(body_error)?;
        parse_json(&bytes).map(Json)
    }
}

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// A JSON body that may be left out: an empty body reads as `T::default()`.
pub struct JsonOrEmpty<T>(pub T);

impl<T: DeserializeOwned + Default, S: Send + Sync> FromRequest<S> for JsonOrEmpty<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let ct = content_type(req.headers());
        let bytes = Bytes::from_request(req, state).await.map_err(body_error)?;
        // No body, or JSON's `null` (what a client sends for an optional body it leaves out).
        if bytes.iter().all(u8::is_ascii_whitespace) || bytes.trim_ascii() == b"null" {
            return Ok(JsonOrEmpty(T::default()));
        }
        match ct {
            Some(ct) if is_json(&ct) => parse_json(&bytes).map(JsonOrEmpty),
            _ => Err(ApiError::UnsupportedMediaType("a request body must be JSON (Content-Type: application/json)".into())),
        }
    }
}

/// A workflow definition's text: a YAML body (`application/yaml`, `text/yaml`, …) or JSON
/// `{"source": "<yaml>"}`.
pub struct WorkflowSource(pub String);

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceBody {
    source: String,
}

impl<S: Send + Sync> FromRequest<S> for WorkflowSource {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let ct = content_type(req.headers()).unwrap_or_default();
        let bytes = Bytes::from_request(req, state).await.map_err(body_error)?;
        if is_json(&ct) {
            let body: SourceBody = parse_json(&bytes)?;
            return Ok(WorkflowSource(body.source));
        }
        let yaml = matches!(ct.as_str(), "application/yaml" | "application/x-yaml" | "text/yaml" | "text/x-yaml" | "text/plain");
        if !yaml {
            return Err(ApiError::UnsupportedMediaType("send the workflow as application/yaml, or as JSON {\"source\": \"…\"}".into()));
        }
        let text = String::from_utf8(bytes.to_vec())
            .map_err(|e| ApiError::BadRequest(format!("the workflow is not valid UTF-8 (byte {})", e.utf8_error().valid_up_to())))?;
        if text.contains('\0') {
            return Err(ApiError::BadRequest("the workflow may not contain NUL characters".into()));
        }
        Ok(WorkflowSource(text))
    }
}

/// Path parameters.
pub struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| Path(p.0))
            .map_err(|e| ApiError::BadRequest(format!("bad path parameter: {}", e.body_text())))
    }
}

/// What a path names (`{run}`, `{step}`, `{user}`, a budget's `{period}`), parsed. Text that
/// cannot be one names nothing in any org, so it answers 404, as another org's id does. The
/// routes document their path parameters with a struct of their own (`RunPath`, …).
pub struct PathId<T>(pub T);

/// What a path parameter can name: the parameter, and what its 404 says.
pub trait PathParam: Sized {
    const PARAM: &'static str;
    const NOT_FOUND: &'static str;
    fn parse(text: &str) -> Option<Self>;
}

impl PathParam for RunId {
    const PARAM: &'static str = "run";
    const NOT_FOUND: &'static str = "run not found";
    fn parse(text: &str) -> Option<Self> {
        text.parse().ok()
    }
}

impl PathParam for StepId {
    const PARAM: &'static str = "step";
    const NOT_FOUND: &'static str = "step not found";
    fn parse(text: &str) -> Option<Self> {
        text.parse().ok()
    }
}

/// A member is named by the user's UUID.
impl PathParam for UserId {
    const PARAM: &'static str = "user";
    const NOT_FOUND: &'static str = "member not found";
    fn parse(text: &str) -> Option<Self> {
        text.parse().ok().map(UserId)
    }
}

impl<T: PathParam, S: Send + Sync> FromRequestParts<S> for PathId<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let text = path_param(parts, T::PARAM).await?.ok_or_else(|| ApiError::internal(format!("route without {{{}}} uses PathId", T::PARAM)))?;
        T::parse(&text).map(PathId).ok_or_else(|| ApiError::NotFound(T::NOT_FOUND.into()))
    }
}

/// The path parameter `name`, as the route matched it (percent-decoded); `None` when the route
/// has none of that name.
pub(super) async fn path_param(parts: &mut Parts, name: &str) -> Result<Option<String>, ApiError> {
    let raw = RawPathParams::from_request_parts(parts, &()).await.map_err(|e| ApiError::BadRequest(format!("bad path parameter: {}", e.body_text())))?;
    Ok(raw.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_owned()))
}

/// Query parameters; unknown ones are refused where the type says `deny_unknown_fields`.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Query(q.0))
            .map_err(|e| ApiError::BadRequest(format!("bad query parameter: {}", e.body_text())))
    }
}

/// A date or time of a query, refused outside the years 1 to 9999: chrono reads years
/// PostgreSQL cannot hold, which it would answer with an error of its own.
pub fn a_usable_year(field: &str, year: i32) -> Result<(), ApiError> {
    if (1..=9999).contains(&year) { Ok(()) } else { Err(ApiError::BadRequest(format!("{field} must be in the years 1 to 9999"))) }
}

/// A list of a body, refused past `max` items: "at most {max} {what}".
pub fn at_most_items<T>(items: &[T], max: usize, what: &str) -> Result<(), ApiError> {
    if items.len() > max { Err(ApiError::Unprocessable(format!("at most {max} {what}"))) } else { Ok(()) }
}

/// A short text field of a body, refused (never cut) past `max` characters, as the
/// document's `maxLength` for it says.
pub fn at_most(field: &str, value: Option<String>, max: usize) -> Result<Option<String>, ApiError> {
    match value {
        Some(v) if v.chars().count() > max => Err(ApiError::Unprocessable(format!("{field} must be at most {max} characters"))),
        other => Ok(other),
    }
}

/// The `Idempotency-Key` header of a create-POST, when given: 1 to 255 visible ASCII
/// characters.
pub struct IdempotencyKey(pub Option<KeyedRequest>);

/// A request that came with a key. A retry must repeat its method and path as well as its
/// body, so they are taken with the key.
pub struct KeyedRequest {
    pub key: String,
    /// `METHOD /path?query`.
    pub request: String,
}

pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let Some(value) = parts.headers.get(IDEMPOTENCY_HEADER) else { return Ok(IdempotencyKey(None)) };
        let bad = || ApiError::BadRequest("Idempotency-Key must be 1 to 255 visible ASCII characters".into());
        let text = value.to_str().map_err(|_| bad())?;
        if text.is_empty() || text.len() > 255 || !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad());
        }
        let request = format!("{} {}", parts.method, parts.uri.path_and_query().map_or(parts.uri.path(), |p| p.as_str()));
        Ok(IdempotencyKey(Some(KeyedRequest { key: text.to_owned(), request })))
    }
}

/// The header in the document of a keyed route, named in its `params(...)`.
impl IntoParams for IdempotencyKey {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let schema = ObjectBuilder::new()
            .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
            .min_length(Some(1))
            .max_length(Some(255))
            .pattern(Some("^[!-~]+$"));
        vec![
            ParameterBuilder::new()
                .name("Idempotency-Key")
                .parameter_in(ParameterIn::Header)
                .required(Required::False)
                .description(Some("Makes a retried request safe; 1 to 255 visible ASCII characters"))
                .schema(Some(schema))
                .build(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::{has_nul_escape, parse_json};

    #[test]
    fn a_nul_escape_is_told_from_an_escaped_backslash_before_the_same_text() {
        assert!(has_nul_escape(br#"{"a": "x\u0000"}"#));
        assert!(has_nul_escape(br#"{"a": "\\\u0000"}"#));
        assert!(!has_nul_escape(br#"{"a": "\\u0000"}"#));
        assert!(has_nul_escape(br#"{"a": "\u00001"}"#), "NUL, then the text 1");
        assert!(!has_nul_escape(br#"{"a": "\u0001 \n \\"}"#));
    }

    #[test]
    fn a_whole_number_written_as_a_float_is_an_integer_and_a_fraction_is_not() {
        #[derive(serde::Deserialize)]
        struct Cap {
            running_cap: u32,
        }
        assert_eq!(parse_json::<Cap>(br#"{"running_cap": 52.0}"#).unwrap().running_cap, 52);
        assert_eq!(parse_json::<Cap>(br#"{"running_cap": 1e2}"#).unwrap().running_cap, 100);
        assert!(parse_json::<Cap>(br#"{"running_cap": 52.5}"#).is_err());
        assert!(parse_json::<Cap>(br#"{"running_cap": -1.0}"#).is_err());
    }
}
