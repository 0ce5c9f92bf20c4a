//! Sign-in state.
//!
//! A console session is one API token per org the person belongs to (kind `user`, named
//! `console session`, the person's role, 12 hours by default), issued at sign-in and revoked at
//! sign-out. The cookie `shopfloor_session` holds them as `<org slug>.<token>` joined by `~`;
//! it is `HttpOnly`, `SameSite=Lax`, and `Secure` when the console is served over TLS. Each
//! request verifies the token of the org in its path exactly as the REST API verifies a bearer
//! token, so revocation, expiry and a changed role take effect at once.
//!
//! CSRF: every form carries `_csrf`, a hash of the session token of the page's org (or of the
//! whole cookie, for sign-out). Another site can make a browser send the cookie but cannot read
//! it, so it cannot compute the field. Posts whose `Origin` names another host are refused too.
//! Before sign-in, a random `shopfloor_pre` cookie plays the same part (double submit), and it
//! carries the OAuth `state`.

use axum::http::{HeaderMap, HeaderValue, header};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

use super::{Console, ConsoleError};
use crate::http::auth::{Caller, Role, TokenKind, verify};

pub(super) const SESSION_COOKIE: &str = "shopfloor_session";
pub(super) const PRE_COOKIE: &str = "shopfloor_pre";
/// The name of console tokens in `api_tokens`.
pub(super) const SESSION_TOKEN_NAME: &str = crate::http::auth::CONSOLE_SESSION;

/// A cookie's value from the request.
pub(super) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        (k == name).then_some(v)
    })
}

/// The entries of the session cookie: `(org slug, token)`.
pub(super) fn entries(headers: &HeaderMap) -> Vec<(String, String)> {
    cookie(headers, SESSION_COOKIE)
        .unwrap_or_default()
        .split('~')
        .filter_map(|e| e.split_once('.').map(|(slug, token)| (slug.to_owned(), token.to_owned())))
        .filter(|(slug, token)| !slug.is_empty() && !token.is_empty())
        .take(50)
        .collect()
}

pub(super) fn join_entries(entries: &[(String, String)]) -> String {
    entries.iter().map(|(s, t)| format!("{s}.{t}")).collect::<Vec<_>>().join("~")
}

/// Whether the request reached us over TLS (directly configured, or through a proxy that says
/// so).
pub(super) fn secure(console: &Console, headers: &HeaderMap) -> bool {
    console.cfg().public_url.as_deref().is_some_and(|u| u.starts_with("https://"))
        || headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()).is_some_and(|p| p.eq_ignore_ascii_case("https"))
}

/// A `Set-Cookie` value; `max_age` 0 removes the cookie.
pub(super) fn set_cookie(name: &str, value: &str, max_age: i64, secure: bool) -> HeaderValue {
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!("{name}={value}; Path=/; HttpOnly; SameSite=Lax; Max-Age={max_age}{secure}"))
        .unwrap_or_else(|_| HeaderValue::from_static("invalid=1; Max-Age=0"))
}

/// The CSRF field's value for a secret (a session token, or the pre-sign-in cookie).
pub(super) fn csrf_for(secret: &str) -> String {
    let digest = Sha256::digest(format!("shopfloor console csrf\n{secret}").as_bytes());
    URL_SAFE_NO_PAD.encode(&digest[..24])
}

pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Refuses a post from another origin. Browsers send `Origin` on every cross-site post; when it
/// is there, its host must be ours.
pub(super) fn same_origin(headers: &HeaderMap) -> Result<(), ConsoleError> {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else { return Ok(()) };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let origin_host = origin.split_once("://").map_or(origin, |(_, h)| h);
    if origin == "null" || origin_host != host {
        return Err(ConsoleError::Csrf);
    }
    Ok(())
}

/// Checks a posted CSRF field against the secret it must be derived from.
pub(super) fn check_csrf(headers: &HeaderMap, secret: &str, posted: Option<&str>) -> Result<(), ConsoleError> {
    same_origin(headers)?;
    let want = csrf_for(secret);
    match posted {
        Some(p) if constant_time_eq(p.as_bytes(), want.as_bytes()) => Ok(()),
        _ => Err(ConsoleError::Csrf),
    }
}

/// A signed-in person on a page of one org.
#[derive(Clone)]
pub(super) struct OrgSession {
    pub caller: Caller,
    pub org: String,
    /// The value every form of this page posts as `_csrf`.
    pub csrf: String,
    /// The orgs this browser is signed in to, for the switcher.
    pub orgs: Vec<String>,
    /// The value sign-out posts as `_csrf`.
    pub signout_csrf: String,
}

impl OrgSession {
    pub(super) fn role(&self) -> Role {
        self.caller.role.unwrap_or(Role::Viewer)
    }

    pub(super) fn can(&self, role: Role) -> bool {
        self.role() >= role
    }

    /// Checks a form posted on this org's pages.
    pub(super) fn check(&self, headers: &HeaderMap, posted: Option<&str>) -> Result<(), ConsoleError> {
        same_origin(headers)?;
        match posted {
            Some(p) if constant_time_eq(p.as_bytes(), self.csrf.as_bytes()) => Ok(()),
            _ => Err(ConsoleError::Csrf),
        }
    }
}

impl Console {
    /// The session for `org`, from the cookie. Not signed in at all: to the sign-in page. Signed
    /// in, but not to this org: not found, as for an org that does not exist.
    pub(super) async fn session(&self, headers: &HeaderMap, org: &str, next: &str) -> Result<OrgSession, ConsoleError> {
        let all = entries(headers);
        if all.is_empty() {
            return Err(ConsoleError::SignIn { next: next.to_owned() });
        }
        let not_found = || ConsoleError::NotFound(format!("org `{}` not found", engine::store::cap(org)));
        let (_, token) = all.iter().find(|(slug, _)| slug == org).ok_or_else(not_found)?;
        let caller = match verify(self.state(), token).await {
            Ok(c) => c,
            // Revoked or expired: sign in again.
            Err(crate::http::ApiError::Unauthorized(_)) => return Err(ConsoleError::SignIn { next: next.to_owned() }),
            Err(e) => return Err(e.into()),
        };
        if caller.kind != TokenKind::User || caller.org_slug != org {
            return Err(not_found());
        }
        let whole = cookie(headers, SESSION_COOKIE).unwrap_or_default();
        Ok(OrgSession { csrf: csrf_for(token), signout_csrf: csrf_for(whole), orgs: all.iter().map(|(s, _)| s.clone()).collect(), org: org.to_owned(), caller })
    }
}
