//! API tokens: the person's own (everyone's for an admin), a form to make one (shown once),
//! and revoking. Console sessions are tokens too, named `console session`: the page counts the
//! open ones and lists only the others.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};

use super::super::session::{OrgSession, SESSION_TOKEN_NAME};
use super::super::view::{self, Page};
use super::super::{Console, ConsoleError};
use super::{Posted, here, see_other};
use crate::http::tokens::TokenList;

async fn render(c: &Console, s: &OrgSession, created: Option<Value>, error: Option<String>, status: StatusCode) -> Result<Response, ConsoleError> {
    let list: TokenList = c.read(&s.caller, &format!("/orgs/{}/tokens?limit=200", s.org)).await?;
    // Console sessions are tokens the console makes at each sign-in: counted, not listed.
    let (sessions, tokens): (Vec<_>, Vec<_>) = list.items.into_iter().partition(|t| t.name == SESSION_TOKEN_NAME && t.kind == "user");
    let now = chrono::Utc::now();
    let open_sessions = sessions.iter().filter(|t| t.revoked_at.is_none() && t.expires_at > now).count();
    let mut page = Page::of(s, format!("Tokens · {}", s.org), "tokens");
    page.projects = c.projects(s).await?;
    let roles: Vec<&str> =
        ["viewer", "member", "admin", "owner"].into_iter().filter(|r| crate::http::auth::Role::parse(r).is_some_and(|r| r <= s.role())).collect();
    let html =
        c.render("tokens.html", ctx! { page => page, tokens => tokens, open_sessions => open_sessions, created => created, error => error, roles => roles })?;
    Ok(view::html(status, html))
}

pub(in super::super) async fn page(State(c): State<Console>, Path(org): Path<String>, headers: HeaderMap, uri: Uri) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &org, &here(&uri)).await?;
    render(&c, &s, None, None, StatusCode::OK).await
}

pub(in super::super) async fn create(State(c): State<Console>, Path(org): Path<String>, Posted { s, form: f }: Posted) -> Result<Response, ConsoleError> {
    // Empty: the API's default; anything else must be a whole number of days, or the person
    // asking for a short-lived token would get a long one without a word.
    let days = match f.get("days").map(|d| d.trim()).filter(|d| !d.is_empty()) {
        None => None,
        Some(d) => match d.parse::<u32>() {
            Ok(days) => Some(days),
            Err(_) => {
                let error = format!("`{d}` is not a number of days: give a whole number, or leave it empty for the default");
                return render(&c, &s, None, Some(error), StatusCode::UNPROCESSABLE_ENTITY).await;
            }
        },
    };
    let body = json!({ "name": f.get("name").map(|n| n.trim()).unwrap_or_default(), "role": f.get("role").filter(|r| !r.is_empty()), "expires_in_days": days });
    match c.call(&s.caller, Method::POST, &format!("/orgs/{org}/tokens"), Some(body)).await? {
        // The token's text is shown once, on this answer; a reload does not show it again.
        Ok(created) => render(&c, &s, Some(created), None, StatusCode::CREATED).await,
        Err(r) => render(&c, &s, None, Some(r.detail().to_owned()), StatusCode::UNPROCESSABLE_ENTITY).await,
    }
}

#[derive(Debug, Deserialize)]
pub(in super::super) struct TokenPath {
    org: String,
    token: String,
}

pub(in super::super) async fn revoke(State(c): State<Console>, Path(p): Path<TokenPath>, Posted { s, .. }: Posted) -> Result<Response, ConsoleError> {
    match c.call(&s.caller, Method::DELETE, &format!("/orgs/{}/tokens/{}", p.org, view::urlencode(&p.token)), None).await? {
        Ok(_) => Ok(see_other(&format!("/orgs/{}/tokens", p.org))),
        Err(r) => render(&c, &s, None, Some(r.detail().to_owned()), StatusCode::UNPROCESSABLE_ENTITY).await,
    }
}
