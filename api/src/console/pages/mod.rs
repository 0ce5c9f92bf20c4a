//! The console's pages. Each handler reads the session of the org in its path, reads what it
//! shows (its own SQL filtered by org, or the REST API in-process), and renders a template.
//! Forms post back here; the handlers check the CSRF field, then act through the REST API.

mod act;
pub(super) mod audit;
pub(super) mod budgets;
pub(super) mod github;
pub(super) mod host_add;
pub(super) mod hosts;
pub(super) mod members;
pub(super) mod run;
pub(super) mod runs;
pub(super) mod today;
pub(super) mod tokens;
pub(super) mod webhooks;
pub(super) mod workflows;

use std::collections::HashMap;

use axum::extract::{Form, FromRequest, FromRequestParts, Path, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, NaiveDateTime, Utc};
use serde::{Deserialize, Serialize};

use super::session::{OrgSession, entries};
use super::{Console, ConsoleError};

/// `/`: the first org's Today, or the sign-in page.
pub(super) async fn home(headers: HeaderMap) -> Response {
    match entries(&headers).first() {
        Some((slug, _)) => Redirect::to(&format!("/orgs/{slug}")).into_response(),
        None => Redirect::to("/signin").into_response(),
    }
}

/// A list page's time window and the cursor of the page it shows, as its filter form sends
/// them: `since` and `until` as a `datetime-local` field writes them (or RFC 3339), read as UTC.
#[derive(Debug, Deserialize, Serialize, Default)]
pub(super) struct Window {
    #[serde(default)]
    since: String,
    #[serde(default)]
    until: String,
    #[serde(default)]
    cursor: String,
}

/// A `datetime-local` value (or RFC 3339), read as UTC.
fn instant(text: &str) -> Option<DateTime<Utc>> {
    let t = text.trim();
    if t.is_empty() {
        return None;
    }
    DateTime::parse_from_rfc3339(t)
        .map(|d| d.with_timezone(&Utc))
        .ok()
        .or_else(|| NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M").ok().map(|n| n.and_utc()))
        .or_else(|| NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S").ok().map(|n| n.and_utc()))
}

#[derive(Debug, Deserialize)]
pub(super) struct ProjectPath {
    pub org: String,
    pub project: String,
}

/// The session of a form posted to an org's page, once its origin and CSRF token (`csrf`,
/// the form's `_csrf`) are checked.
pub(super) async fn posted(c: &Console, headers: &HeaderMap, org: &str, uri: &Uri, csrf: Option<&String>) -> Result<OrgSession, ConsoleError> {
    let s = c.session(headers, org, &here(uri)).await?;
    s.check(headers, csrf.map(String::as_str))?;
    Ok(s)
}

/// A form posted to a page under an org (`/orgs/{org}/…`): its fields, and the session of the
/// org in its path once `posted` checked the form's origin and CSRF field. It reads the body:
/// the last of a handler's extractors.
pub(super) struct Posted {
    pub s: OrgSession,
    pub form: FormMap,
}

/// The org of a page's path, whatever else the path names.
#[derive(Deserialize)]
struct OrgOf {
    org: String,
}

impl FromRequest<Console> for Posted {
    type Rejection = Response;

    async fn from_request(request: Request, c: &Console) -> Result<Self, Response> {
        let (mut parts, body) = request.into_parts();
        let Path(OrgOf { org }) = Path::<OrgOf>::from_request_parts(&mut parts, c).await.map_err(IntoResponse::into_response)?;
        let (headers, uri) = (parts.headers.clone(), parts.uri.clone());
        let Form(form) = Form::<FormMap>::from_request(Request::from_parts(parts, body), c).await.map_err(IntoResponse::into_response)?;
        let s = posted(c, &headers, &org, &uri, form.get("_csrf")).await.map_err(IntoResponse::into_response)?;
        Ok(Posted { s, form })
    }
}

/// Where a request wants to come back to after signing in.
pub(super) fn here(uri: &Uri) -> String {
    uri.path_and_query().map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned())
}

/// The project's event stream for the page's live updates: the REST stream, as the signed-in
/// person (an `EventSource` cannot send a bearer token, but it sends the cookie).
pub(super) async fn live(State(c): State<Console>, Path(p): Path<ProjectPath>, headers: HeaderMap, uri: Uri) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    let last = headers.get("last-event-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let mut extra: Vec<(&str, &str)> = Vec::new();
    if let Some(last) = &last {
        extra.push(("last-event-id", last.as_str()));
    }
    let path = format!("/orgs/{}/projects/{}/events", p.org, p.project);
    let response = c.dispatch(&s.caller, Method::GET, &path, None, &extra).await?;
    match response.status() {
        StatusCode::OK => Ok(response),
        StatusCode::NOT_FOUND => Err(ConsoleError::NotFound("project not found".into())),
        StatusCode::TOO_MANY_REQUESTS => Err(ConsoleError::Limited("this session has as many live streams open as it may; close a tab".into())),
        status => Err(ConsoleError::BadRequest(format!("the event stream answered {status}"))),
    }
}

/// A posted form as name → value (the last value of a repeated name wins).
pub(super) type FormMap = HashMap<String, String>;

/// A redirect after a post (303, so the browser reloads with GET).
pub(super) fn see_other(to: &str) -> Response {
    Redirect::to(to).into_response()
}
