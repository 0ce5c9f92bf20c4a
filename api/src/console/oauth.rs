//! Signing in and out: with GitHub (the OAuth web flow: authorize, code exchange, `/user` and
//! `/user/emails`), or with an API token pasted into a form.
//!
//! A GitHub account is the people whose `github_login` is its login, or, for people with no
//! login recorded, whose email is one of the account's verified addresses, in every org where
//! they are members. Sign-in issues a console token per such org; a person of no org is told so
//! and gets no session. A pasted token gets a console token of the same person, org, role and
//! project limit (the pasted token itself is never stored in the browser).

use axum::extract::{Form, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, Duration, Utc};
use engine::ids::{OrgId, UserId};
use engine::store::{Actor, Change, StoreError, api_writes};
use rand::RngCore;
use secrecy::ExposeSecret;
use serde::Deserialize;

use super::session::{self, PRE_COOKIE, SESSION_COOKIE, SESSION_TOKEN_NAME, check_csrf, cookie, csrf_for, entries, join_entries, secure, set_cookie};
use super::view::{self, Page};
use super::{Console, ConsoleError};
use crate::auth::{UserToken, issue_session_from, issue_user_token_with_id};
use crate::http::auth::{Role, TokenKind, verify};
use crate::http::limits::Limits;

/// Charges each sign-in attempt (token, GitHub, GitHub's callback) to the client's address;
/// one over the limit is a 429 page with `Retry-After`, before any token is verified or GitHub
/// is called.
pub(super) async fn limit_signins(State(limits): State<std::sync::Arc<Limits>>, request: Request, next: Next) -> Response {
    if let Some(address) = limits.address(&request) {
        if let Err(wait) = limits.charge_signin(address) {
            return ConsoleError::TooManyRequests(wait).into_response();
        }
    }
    next.run(request).await
}

#[derive(Debug, Deserialize, Default)]
pub(super) struct NextQuery {
    next: Option<String>,
    error: Option<String>,
}

/// Only a path of this console may be a place to go back to (never another site). Browsers
/// drop tabs and newlines from a URL before reading it, so `/\t/evil.example` is
/// `//evil.example` to them: a path with any control character or white space is refused, as
/// one that starts `//` or holds a backslash.
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/') && !n.starts_with("//") && !n.contains('\\') && !n.chars().any(|c| c.is_control() || c.is_whitespace()) && n.len() < 2000 =>
        {
            n.to_owned()
        }
        _ => "/".to_owned(),
    }
}

pub(super) fn random_token() -> String {
    let mut bytes = [0u8; 24];
    rand::rng().fill_bytes(&mut bytes);
    base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, bytes)
}

/// The pre-sign-in secret: the one in the cookie when this server made it (`<nonce>.<tag>`,
/// the tag the secret key's), or a new one to set. A value someone else planted in the
/// browser is not taken.
fn pre_secret(c: &Console, headers: &HeaderMap) -> (String, bool) {
    let key = c.inner.app.secret_key();
    let made_here = |v: &&str| v.split_once('.').is_some_and(|(nonce, tag)| nonce.len() >= 20 && key.tag_holds(PRE_LABEL, nonce, tag));
    match cookie(headers, PRE_COOKIE).and_then(|v| v.split('|').next()).filter(made_here) {
        Some(v) => (v.to_owned(), false),
        None => {
            let nonce = random_token();
            let tag = key.tag(PRE_LABEL, &nonce);
            (format!("{nonce}.{tag}"), true)
        }
    }
}

/// The use the pre-sign-in cookie's tag is made for.
const PRE_LABEL: &str = "shopfloor.console.pre_sign_in";

/// The sign-in page: GitHub (when configured) and a token form.
pub(super) async fn signin_page(State(c): State<Console>, headers: HeaderMap, Query(q): Query<NextQuery>) -> Result<Response, ConsoleError> {
    let (secret, fresh) = pre_secret(&c, &headers);
    let next = safe_next(q.next.as_deref());
    let error = q.error.as_deref().map(|e| match e {
        "state" => "The sign-in with GitHub expired or came from elsewhere. Try again.".to_owned(),
        "github" => "GitHub did not confirm who you are. Try again.".to_owned(),
        "nomember" => {
            "That GitHub account is not a member of any org here. Ask an owner of your org to add you (by your GitHub login or your verified email).".to_owned()
        }
        "denied" => "You declined on GitHub.".to_owned(),
        _ => "Sign-in failed. Try again.".to_owned(),
    });
    let page = Page::bare("Sign in");
    let html = c.render(
        "signin.html",
        ctx! {
            page => page,
            next => next,
            github => c.cfg().github_enabled(),
            csrf => csrf_for(&secret),
            error => error,
        },
    )?;
    let mut response = view::html(StatusCode::OK, html);
    if fresh {
        response.headers_mut().append(header::SET_COOKIE, set_cookie(PRE_COOKIE, &secret, 3600, secure(&c, &headers)));
    }
    Ok(response)
}

/// Where a signed-in browser goes: `next`, or the first org's Today.
fn landing(next: &str, orgs: &[(String, String)]) -> String {
    if next != "/" {
        return next.to_owned();
    }
    orgs.first().map_or_else(|| "/".to_owned(), |(slug, _)| format!("/orgs/{slug}"))
}

/// Adds console tokens to the cookie (replacing those of the same orgs) and redirects.
fn signed_in(c: &Console, headers: &HeaderMap, new: Vec<(String, String)>, next: &str) -> Response {
    let mut all = entries(headers);
    all.retain(|(slug, _)| !new.iter().any(|(s, _)| s == slug));
    let mut merged = new.clone();
    merged.extend(all);
    let max_age = i64::from(c.cfg().session_hours) * 3600;
    let mut response = Redirect::to(&landing(next, &new)).into_response();
    let tls = secure(c, headers);
    response.headers_mut().append(header::SET_COOKIE, set_cookie(SESSION_COOKIE, &join_entries(&merged), max_age, tls));
    response.headers_mut().append(header::SET_COOKIE, set_cookie(PRE_COOKIE, "", 0, tls));
    response
}

#[derive(Debug, Deserialize)]
pub(super) struct TokenForm {
    token: String,
    next: Option<String>,
    #[serde(rename = "_csrf")]
    csrf: Option<String>,
}

fn signin_error(next: &str, error: &str) -> Response {
    Redirect::to(&format!("/signin?next={}&error={error}", view::urlencode(next))).into_response()
}

const TOKEN_EXPIRY: &str = "SELECT expires_at FROM api_tokens WHERE jti = $1 AND org_id = $2";

/// Sign-in with a pasted API token of a person.
pub(super) async fn signin_token(State(c): State<Console>, headers: HeaderMap, Form(f): Form<TokenForm>) -> Result<Response, ConsoleError> {
    let (secret, _) = pre_secret(&c, &headers);
    check_csrf(&headers, &secret, f.csrf.as_deref())?;
    let next = safe_next(f.next.as_deref());
    let token = f.token.trim();
    let caller = match verify(c.state(), token).await {
        Ok(caller) if caller.kind == TokenKind::User && caller.user.is_some() => caller,
        Ok(_) | Err(crate::http::ApiError::Unauthorized(_)) => return Ok(signin_error(&next, "token")),
        Err(e) => return Err(e.into()),
    };
    let (Some(user), Some(role)) = (caller.user, caller.role) else { return Ok(signin_error(&next, "token")) };
    let mut ch = Change::begin(c.db(), caller.actor()).await?;
    // The session ends when the token does, if sooner: pasting a token (or a session's own)
    // never makes a longer-lived one.
    let expires: DateTime<Utc> = sqlx::query_scalar(TOKEN_EXPIRY).bind(caller.jti).bind(caller.org).fetch_one(ch.conn()).await.map_err(StoreError::from)?;
    // (A second early: the new row's clock reads later than this one.)
    let ttl = Duration::hours(i64::from(c.cfg().session_hours.max(1))).min(expires - Utc::now() - Duration::seconds(1));
    // Nor does it outlive the token's revocation.
    let session = issue_session_from(
        &mut ch,
        c.state().secret_key(),
        UserToken { org: caller.org, user, project: caller.project, role: role.as_str(), name: SESSION_TOKEN_NAME, ttl },
        caller.jti,
    )
    .await?;
    ch.commit().await?;
    Ok(signed_in(&c, &headers, vec![(caller.org_slug, session)], &next))
}

/// Starts the GitHub flow: a fresh `state` in the pre-sign-in cookie, then GitHub's authorize
/// page.
pub(super) async fn github_start(State(c): State<Console>, headers: HeaderMap, Query(q): Query<NextQuery>) -> Result<Response, ConsoleError> {
    let cfg = c.cfg();
    let Some(client_id) = cfg.github_client_id.as_deref().filter(|_| cfg.github_enabled()) else {
        return Err(ConsoleError::NotFound("sign-in with GitHub is not configured here".into()));
    };
    let (secret, _) = pre_secret(&c, &headers);
    let state = random_token();
    let next = safe_next(q.next.as_deref());
    let url = authorize_url(&c, client_id, &callback_url(&c, &headers), "read:user user:email", &state);
    let mut response = Redirect::to(&url).into_response();
    // The state and where to go afterwards ride in the cookie, for ten minutes.
    let value = format!("{secret}|{state}|{}", view::urlencode(&next));
    response.headers_mut().append(header::SET_COOKIE, set_cookie(PRE_COOKIE, &value, 600, secure(&c, &headers)));
    Ok(response)
}

/// The console's address as people reach it: `SHOPFLOOR_PUBLIC_URL`, or the request's host.
pub(super) fn base_url(c: &Console, headers: &HeaderMap) -> String {
    match &c.cfg().public_url {
        Some(u) => u.trim_end_matches('/').to_owned(),
        None => {
            let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("localhost");
            let scheme = if secure(c, headers) { "https" } else { "http" };
            format!("{scheme}://{host}")
        }
    }
}

fn callback_url(c: &Console, headers: &HeaderMap) -> String {
    format!("{}/auth/github/callback", base_url(c, headers))
}

/// GitHub's authorize page for this console's OAuth client, coming back to `redirect_uri`.
pub(super) fn authorize_url(c: &Console, client_id: &str, redirect_uri: &str, scope: &str, state: &str) -> String {
    format!(
        "{}/login/oauth/authorize?client_id={}&redirect_uri={}&scope={}&state={}",
        c.cfg().github_oauth_url.trim_end_matches('/'),
        view::urlencode(client_id),
        view::urlencode(redirect_uri),
        view::urlencode(scope),
        view::urlencode(state)
    )
}

#[derive(Debug, Deserialize)]
pub(super) struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct AccessToken {
    access_token: Option<protocol::Secret>,
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct GithubUser {
    login: String,
}

#[derive(Debug, Deserialize)]
struct GithubEmail {
    email: String,
    verified: bool,
}

const GITHUB_MEMBERSHIPS: &str = "SELECT u.org_id, u.user_id, m.role, o.slug FROM users u \
     JOIN memberships m ON m.org_id = u.org_id AND m.user_id = u.user_id JOIN orgs o ON o.org_id = u.org_id \
     WHERE (u.github_login IS NOT NULL AND lower(u.github_login) = lower($1)) \
        OR (u.github_login IS NULL AND lower(u.email) = ANY($2)) \
     ORDER BY o.slug LIMIT 20";

/// GitHub sends the browser back here with a code.
pub(super) async fn github_callback(State(c): State<Console>, headers: HeaderMap, Query(q): Query<Callback>) -> Result<Response, ConsoleError> {
    let stored = cookie(&headers, PRE_COOKIE).unwrap_or_default().to_owned();
    let mut parts = stored.splitn(3, '|');
    let (_, expected, next) = (parts.next(), parts.next().unwrap_or_default(), parts.next().unwrap_or("%2F"));
    let next = safe_next(Some(&view::urldecode(next)));
    if q.error.is_some() {
        return Ok(signin_error(&next, "denied"));
    }
    let (Some(code), Some(state)) = (q.code.as_deref(), q.state.as_deref()) else { return Ok(signin_error(&next, "state")) };
    // The cookie must be one this server made.
    let (_, planted) = pre_secret(&c, &headers);
    if planted || expected.is_empty() || expected.len() != state.len() || expected != state {
        return Ok(signin_error(&next, "state"));
    }
    let Some(login) = github_identity(&c, &headers, code).await? else { return Ok(signin_error(&next, "github")) };
    let (login, emails) = login;
    let people: Vec<(OrgId, UserId, String, String)> = sqlx::query_as(GITHUB_MEMBERSHIPS)
        .bind(&login)
        .bind(&emails)
        // Across orgs: the person's memberships, before any org is known.
        .fetch_all(&c.state().system)
        .await?;
    if people.is_empty() {
        tracing::info!(github.login = %login, "GitHub sign-in of an account that is no member");
        return Ok(signin_error(&next, "nomember"));
    }
    let ttl = Duration::hours(i64::from(c.cfg().session_hours.max(1)));
    let mut sessions = Vec::new();
    for (org, user, role, slug) in people {
        let Some(role) = Role::parse(&role) else { continue };
        // Each session token is written as the org it belongs to.
        engine::tenancy::act_for(org);
        let mut ch = Change::begin(c.db(), Actor::User(user)).await?;
        let (_, token) = issue_user_token_with_id(
            &mut ch,
            c.state().secret_key(),
            UserToken { org, user, project: None, role: role.as_str(), name: SESSION_TOKEN_NAME, ttl },
        )
        .await?;
        ch.commit().await?;
        sessions.push((slug, token));
    }
    Ok(signed_in(&c, &headers, sessions, &next))
}

/// Exchanges an OAuth code (given for `redirect_uri`) for the person's access token; None when
/// GitHub refuses it or cannot be reached (logged).
pub(super) async fn exchange_code(c: &Console, code: &str, redirect_uri: &str) -> Result<Option<protocol::Secret>, ConsoleError> {
    let cfg = c.cfg();
    let (Some(id), Some(secret)) = (&cfg.github_client_id, &cfg.github_client_secret) else {
        return Err(ConsoleError::NotFound("sign-in with GitHub is not configured here".into()));
    };
    let exchange = c
        .inner
        .http
        .post(format!("{}/login/oauth/access_token", cfg.github_oauth_url.trim_end_matches('/')))
        .header(header::ACCEPT, "application/json")
        .form(&[("client_id", id.as_str()), ("client_secret", secret.expose_secret()), ("code", code), ("redirect_uri", redirect_uri)]);
    let Some(answer) = accepted(exchange, "the OAuth code exchange").await else { return Ok(None) };
    Ok(match answer.json::<AccessToken>().await {
        Ok(AccessToken { access_token: Some(t), .. }) => Some(t),
        Ok(AccessToken { error, .. }) => {
            tracing::warn!(error = ?error, "GitHub refused the OAuth code");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "GitHub's access token answer is not JSON");
            None
        }
    })
}

/// Sends `request` to GitHub: its answer when GitHub took it, None (logged) when GitHub
/// refused it or could not be reached.
async fn accepted(request: reqwest::RequestBuilder, what: &str) -> Option<reqwest::Response> {
    match request.send().await {
        Ok(r) if r.status().is_success() => Some(r),
        Ok(r) => {
            tracing::warn!(status = %r.status(), "GitHub refused {what}");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot reach GitHub for {what}");
            None
        }
    }
}

/// Exchanges the code and asks GitHub who it is: the login and the verified emails, lowercased.
async fn github_identity(c: &Console, headers: &HeaderMap, code: &str) -> Result<Option<(String, Vec<String>)>, ConsoleError> {
    let Some(token) = exchange_code(c, code, &callback_url(c, headers)).await? else { return Ok(None) };
    let cfg = c.cfg();
    let api = cfg.github_oauth_api_url.trim_end_matches('/');
    let get = |path: &str| {
        c.inner
            .http
            .get(format!("{api}{path}"))
            .bearer_auth(token.expose())
            .header(header::ACCEPT, "application/vnd.github+json")
            .header("X-GitHub-Api-Version", "2022-11-28")
    };
    let Some(answer) = accepted(get("/user"), "/user").await else { return Ok(None) };
    let Ok(user) = answer.json::<GithubUser>().await else { return Ok(None) };
    // Without the user:email scope this is refused; the login alone then decides.
    let emails = match get("/user/emails").send().await {
        Ok(r) if r.status().is_success() => r.json::<Vec<GithubEmail>>().await.unwrap_or_default(),
        _ => Vec::new(),
    };
    let verified = emails.into_iter().filter(|e| e.verified).map(|e| e.email.to_lowercase()).collect();
    Ok(Some((user.login, verified)))
}

#[derive(Debug, Deserialize)]
pub(super) struct SignoutForm {
    #[serde(rename = "_csrf")]
    csrf: Option<String>,
}

/// Revokes every console token of the cookie and clears it.
pub(super) async fn signout(State(c): State<Console>, headers: HeaderMap, Form(f): Form<SignoutForm>) -> Result<Response, ConsoleError> {
    let whole = cookie(&headers, SESSION_COOKIE).unwrap_or_default().to_owned();
    check_csrf(&headers, &whole, f.csrf.as_deref())?;
    for (_, token) in entries(&headers) {
        // A token already revoked or expired has nothing left to end.
        let Ok(caller) = verify(c.state(), &token).await else { continue };
        let mut ch = Change::begin(c.db(), caller.actor()).await?;
        api_writes::revoke_token(&mut ch, caller.org, caller.jti).await?;
        ch.commit().await?;
    }
    let mut response = Redirect::to("/signin").into_response();
    response.headers_mut().append(header::SET_COOKIE, session::set_cookie(SESSION_COOKIE, "", 0, secure(&c, &headers)));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::{AccessToken, safe_next};

    /// GitHub's answer to the code exchange, as its documentation shows it: the person's token
    /// reads as itself where it is sent, and as nothing where it could be logged.
    #[test]
    fn the_persons_github_token_never_shows_in_debug() {
        let answer = r#"{"access_token":"gho_16C7e42F292c6912E7710c838347Ae178B4a","scope":"repo,gist","token_type":"bearer"}"#;
        let token: AccessToken = serde_json::from_str(answer).unwrap();
        assert!(!format!("{token:?}").contains("gho_16C7e42F292c6912E7710c838347Ae178B4a"), "{token:?}");
        assert_eq!(token.access_token.unwrap().expose(), "gho_16C7e42F292c6912E7710c838347Ae178B4a");
    }

    #[test]
    fn only_a_path_of_this_console_is_a_place_to_go_back_to() {
        for ok in ["/", "/orgs/acme/audit", "/orgs/acme/projects/web/runs?status=running&workflow=a%20b"] {
            assert_eq!(safe_next(Some(ok)), ok);
        }
        let elsewhere = ["//evil.example", "/\\evil.example", "/\t/evil.example", "/\n/evil.example", "/\r\n/x", "/ /x", "https://evil.example/", "evil", ""];
        for bad in elsewhere {
            assert_eq!(safe_next(Some(bad)), "/", "{bad:?}");
        }
        assert_eq!(safe_next(None), "/");
    }
}
