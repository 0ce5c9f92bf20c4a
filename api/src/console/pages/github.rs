//! Connect GitHub: the org's App installations, and GitHub's install flow that claims one.
//!
//! "Connect GitHub" (an admin's form) sends the browser to the App's install page with a fresh
//! `state`, kept in the `shopfloor_connect` cookie with the org and a hash of the session it
//! belongs to. GitHub comes back to the App's setup URL (`/github/setup`) with the
//! `installation_id` and that `state`; the console then asks GitHub who the person is (OAuth,
//! back at `/github/setup/callback`) and hands the person's token to the REST claim route,
//! which accepts only an installation GitHub lists for that person (`GET /user/installations`).
//! The token is used for that one request and never stored.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use serde_json::json;

use super::super::oauth::{authorize_url, base_url, exchange_code, random_token};
use super::super::session::{OrgSession, constant_time_eq, cookie, secure, set_cookie};
use super::super::view::{self, Page};
use super::super::{Console, ConsoleError};
use super::{Posted, here, see_other};
use crate::http::auth::Role;
use crate::http::installations::InstallationList;

const CONNECT_COOKIE: &str = "shopfloor_connect";
/// How long the install flow may take, from the button to GitHub's return.
const CONNECT_SECS: i64 = 900;

#[derive(Debug, Deserialize, Default)]
pub(in super::super) struct PageQuery {
    connected: Option<i64>,
}

async fn render(c: &Console, s: &OrgSession, connected: Option<i64>, error: Option<String>, status: StatusCode) -> Result<Response, ConsoleError> {
    let list: InstallationList = c.read(&s.caller, &format!("/orgs/{}/github/installations", s.org)).await?;
    let mut page = Page::of(s, format!("GitHub · {}", s.org), "github");
    page.projects = c.projects(s).await?;
    let cfg = c.cfg();
    let html = c.render(
        "github.html",
        ctx! {
            page => page,
            installations => list.items,
            connected => connected,
            error => error,
            admin => s.can(Role::Admin),
            flow => cfg.github_app_slug.is_some() && cfg.github_client_id.is_some() && cfg.github_client_secret.is_some(),
        },
    )?;
    Ok(view::html(status, html))
}

pub(in super::super) async fn page(
    State(c): State<Console>, Path(org): Path<String>, headers: HeaderMap, uri: Uri, Query(q): Query<PageQuery>,
) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &org, &here(&uri)).await?;
    render(&c, &s, q.connected, None, StatusCode::OK).await
}

/// The button: to the App's install page, with a `state` bound to this session.
pub(in super::super) async fn connect(
    State(c): State<Console>, Path(org): Path<String>, headers: HeaderMap, Posted { s, .. }: Posted,
) -> Result<Response, ConsoleError> {
    if !s.can(Role::Admin) {
        return render(&c, &s, None, Some("Only an admin of the org connects GitHub.".into()), StatusCode::FORBIDDEN).await;
    }
    let Some(slug) = c.cfg().github_app_slug.clone() else {
        let why = "GitHub's install flow is not configured here (SHOPFLOOR_GITHUB_APP_SLUG and the OAuth client); an admin can claim an installation through the REST API with a GitHub token.";
        return render(&c, &s, None, Some(why.into()), StatusCode::UNPROCESSABLE_ENTITY).await;
    };
    let state = random_token();
    let url = format!("{}/apps/{}/installations/new?state={state}", c.cfg().github_oauth_url.trim_end_matches('/'), view::urlencode(&slug));
    let mut response = Redirect::to(&url).into_response();
    let value = format!("{state}|{org}|{}", s.csrf);
    response.headers_mut().append(header::SET_COOKIE, set_cookie(CONNECT_COOKIE, &value, CONNECT_SECS, secure(&c, &headers)));
    Ok(response)
}

/// What the connect cookie holds: the state, the org, the session's CSRF value, and (after the
/// setup URL) the installation.
struct Pending {
    state: String,
    org: String,
    session: String,
    installation: Option<i64>,
}

fn pending(headers: &HeaderMap) -> Option<Pending> {
    let raw = view::urldecode(cookie(headers, CONNECT_COOKIE)?);
    let mut parts = raw.split('|');
    let (state, org, session) = (parts.next()?.to_owned(), parts.next()?.to_owned(), parts.next()?.to_owned());
    let installation = parts.next().and_then(|i| i.parse().ok());
    (state.len() >= 20 && !org.is_empty()).then_some(Pending { state, org, session, installation })
}

/// The state GitHub brought back is the one this browser was given, and the browser is still
/// signed in to the org with the same session.
async fn check(c: &Console, headers: &HeaderMap, state: Option<&str>) -> Result<(Pending, OrgSession), Response> {
    let refused = |why: &str| ConsoleError::BadRequest(why.to_owned()).into_response();
    let Some(p) = pending(headers) else { return Err(refused("This connection was not started here, or it expired. Start again from the org's GitHub page.")) };
    if state.is_none_or(|s| !constant_time_eq(s.as_bytes(), p.state.as_bytes())) {
        return Err(refused("GitHub came back with another state than the one this browser was given. Start again from the org's GitHub page."));
    }
    let s = match c.session(headers, &p.org, &format!("/orgs/{}/github", p.org)).await {
        Ok(s) => s,
        Err(e) => return Err(e.into_response()),
    };
    if !constant_time_eq(s.csrf.as_bytes(), p.session.as_bytes()) {
        return Err(refused("This connection was started by another session. Start again from the org's GitHub page."));
    }
    Ok((p, s))
}

#[derive(Debug, Deserialize)]
pub(in super::super) struct Setup {
    installation_id: Option<i64>,
    setup_action: Option<String>,
    state: Option<String>,
}

/// The App's setup URL: GitHub says which installation; GitHub must now say who the person is.
pub(in super::super) async fn setup(State(c): State<Console>, headers: HeaderMap, Query(q): Query<Setup>) -> Result<Response, ConsoleError> {
    let (p, s) = match check(&c, &headers, q.state.as_deref()).await {
        Ok(ok) => ok,
        Err(refused) => return Ok(refused),
    };
    if q.setup_action.as_deref() == Some("request") {
        // An org member asked the org's owners to install the App: nothing to claim yet.
        let why = "GitHub sent the installation to the account's owners for approval. Once they approve it, connect again.";
        return render(&c, &s, None, Some(why.into()), StatusCode::OK).await;
    }
    let Some(installation) = q.installation_id.filter(|i| *i > 0) else {
        return render(&c, &s, None, Some("GitHub named no installation; nothing was connected.".into()), StatusCode::BAD_REQUEST).await;
    };
    let Some(client_id) = c.cfg().github_client_id.clone().filter(|_| c.cfg().github_client_secret.is_some()) else {
        return Err(ConsoleError::NotFound("sign-in with GitHub is not configured here".into()));
    };
    let redirect = format!("{}/github/setup/callback", base_url(&c, &headers));
    let mut response = Redirect::to(&authorize_url(&c, &client_id, &redirect, "", &p.state)).into_response();
    let value = format!("{}|{}|{}|{installation}", p.state, p.org, p.session);
    response.headers_mut().append(header::SET_COOKIE, set_cookie(CONNECT_COOKIE, &value, CONNECT_SECS, secure(&c, &headers)));
    Ok(response)
}

#[derive(Debug, Deserialize)]
pub(in super::super) struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

/// GitHub's OAuth answer: the person's token goes to the REST claim, which asks GitHub whether
/// they can access the installation.
pub(in super::super) async fn callback(State(c): State<Console>, headers: HeaderMap, Query(q): Query<Callback>) -> Result<Response, ConsoleError> {
    let (p, s) = match check(&c, &headers, q.state.as_deref()).await {
        Ok(ok) => ok,
        Err(refused) => return Ok(refused),
    };
    let clear = set_cookie(CONNECT_COOKIE, "", 0, secure(&c, &headers));
    let done = |mut response: Response| {
        response.headers_mut().append(header::SET_COOKIE, clear.clone());
        Ok(response)
    };
    let (Some(installation), Some(code), None) = (p.installation, q.code.as_deref(), q.error.as_deref()) else {
        return done(render(&c, &s, None, Some("GitHub did not confirm who you are; nothing was connected.".into()), StatusCode::BAD_REQUEST).await?);
    };
    let redirect = format!("{}/github/setup/callback", base_url(&c, &headers));
    let Some(token) = exchange_code(&c, code, &redirect).await? else {
        return done(render(&c, &s, None, Some("GitHub did not confirm who you are; nothing was connected.".into()), StatusCode::BAD_REQUEST).await?);
    };
    let body = json!({ "installation_id": installation, "github_token": token });
    match c.call(&s.caller, Method::POST, &format!("/orgs/{}/github/installations", s.org), Some(body)).await? {
        Ok(_) => done(see_other(&format!("/orgs/{}/github?connected={installation}", s.org))),
        Err(r) => done(render(&c, &s, None, Some(r.detail().to_owned()), r.status).await?),
    }
}

/// An admin gives an installation up.
pub(in super::super) async fn release(
    State(c): State<Console>, Path((org, installation)): Path<(String, i64)>, Posted { s, .. }: Posted,
) -> Result<Response, ConsoleError> {
    match c.call(&s.caller, Method::DELETE, &format!("/orgs/{org}/github/installations/{installation}"), None).await? {
        Ok(_) => Ok(see_other(&format!("/orgs/{org}/github"))),
        Err(r) => render(&c, &s, None, Some(r.detail().to_owned()), r.status).await,
    }
}
