//! Who is calling: the bearer-token extractor and the roles.
//!
//! A token is an HS256 JWT whose header names its signing key (`kid`). Verification accepts
//! HS256 only (so `alg: none` and every other algorithm are refused before any key is
//! looked at), finds the key by `kid` among all keys ever issued (a rotated-out key still
//! verifies the tokens it signed, so rotation logs no one out; a retired one only until its
//! grace ends), checks the signature and `exp`, then
//! checks the token's row: it exists in the org the claims name, is neither revoked nor
//! expired, was signed by that key, and, for a person's token, its holder is still a member.
//! A person's effective role is the lower of the token's role and their current membership's,
//! so a demotion takes effect on live tokens at once. Every failure is the same 401 to the
//! client; the log says which check failed.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use engine::ids::{OrgId, ProjectId, UserId};
use engine::store::Actor;
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::error::ApiError;
use super::keys::refuse;
use crate::auth::Claims;

/// A person's role in an org; each includes the ones below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads everything in the org.
    Viewer,
    /// Also uploads workflows, submits runs, cancels, retries, approves and rejects.
    Member,
    /// Also manages members, projects and other people's tokens, and reads the audit log.
    Admin,
    /// Also grants and removes the owner role.
    Owner,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "viewer" => Some(Role::Viewer),
            "member" => Some(Role::Member),
            "admin" => Some(Role::Admin),
            "owner" => Some(Role::Owner),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Member => "member",
            Role::Admin => "admin",
            Role::Owner => "owner",
        }
    }
}

/// What a token is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// A person's token: the REST API.
    User,
    /// A host credential: the host routes only.
    Host,
    /// Registers one host: the registration route only.
    Registration,
}

/// The verified caller of a request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub jti: uuid::Uuid,
    pub org: OrgId,
    pub org_slug: String,
    pub kind: TokenKind,
    pub user: Option<UserId>,
    /// A person's effective role; `None` for host and registration tokens.
    pub role: Option<Role>,
    /// A token limited to one project.
    pub project: Option<ProjectId>,
    /// A console session's token ([`CONSOLE_SESSION`]): good for the console, which verifies
    /// it itself, never as a bearer token of the REST API (a stolen cookie must not mint
    /// long-lived tokens from outside the console).
    pub console_session: bool,
}

/// The name of the tokens the console issues as sessions, which no API token may take.
pub const CONSOLE_SESSION: &str = "console session";

impl Caller {
    /// Who the audit log names for this caller's changes.
    pub fn actor(&self) -> Actor {
        match self.user {
            Some(user) => Actor::User(user),
            None => Actor::Token(self.jti),
        }
    }
}

#[derive(sqlx::FromRow)]
struct TokenRow {
    kind: String,
    role: String,
    user_id: Option<UserId>,
    project_id: Option<ProjectId>,
    kid: String,
    expired: bool,
    revoked: bool,
    member_role: Option<String>,
    slug: String,
    name: String,
}

const TOKEN_FACTS: &str = "SELECT t.kind, t.role, t.name, t.user_id, t.project_id, t.kid, t.expires_at <= now() AS expired, \
            t.revoked_at IS NOT NULL AS revoked, m.role AS member_role, o.slug \
     FROM api_tokens t JOIN orgs o ON o.org_id = t.org_id \
     LEFT JOIN memberships m ON m.org_id = t.org_id AND m.user_id = t.user_id \
     WHERE t.jti = $1 AND t.org_id = $2";

/// Verifies a bearer token's text.
pub async fn verify(state: &AppState, token: &str) -> Result<Caller, ApiError> {
    let header = decode_header(token).map_err(|_| refuse("malformed header or unknown algorithm"))?;
    if header.alg != Algorithm::HS256 {
        return Err(refuse("algorithm is not HS256"));
    }
    let kid = header.kid.ok_or_else(|| refuse("no kid"))?;
    if kid.len() > 100 {
        return Err(refuse("kid too long"));
    }
    let secret = state.shared.keys.get(&state.system, state.secret_key(), &kid).await?;
    let mut validation = Validation::new(Algorithm::HS256);
    validation.leeway = 0;
    validation.set_required_spec_claims(&["exp"]);
    let claims = decode::<Claims>(token, &DecodingKey::from_secret(secret.expose_secret()), &validation).map_err(|e| refuse(&e.to_string()))?.claims;
    let jti: uuid::Uuid = claims.jti.parse().map_err(|_| refuse("jti is not a uuid"))?;
    let org = OrgId(claims.org.parse().map_err(|_| refuse("org is not a uuid"))?);
    let row: Option<TokenRow> = sqlx::query_as(TOKEN_FACTS).bind(jti).bind(org).fetch_optional(&state.system).await?;
    let row = row.ok_or_else(|| refuse("no token row in that org"))?;
    if row.revoked {
        return Err(refuse("revoked"));
    }
    if row.expired {
        return Err(refuse("expired"));
    }
    if row.kid != kid {
        return Err(refuse("signed by another key than recorded"));
    }
    let (kind, role) = match row.kind.as_str() {
        "user" => {
            let granted = Role::parse(&row.role).ok_or_else(|| refuse("token role unknown"))?;
            let member = row.member_role.as_deref().and_then(Role::parse).ok_or_else(|| refuse("no longer a member"))?;
            (TokenKind::User, Some(granted.min(member)))
        }
        "host" => (TokenKind::Host, None),
        "registration" => (TokenKind::Registration, None),
        _ => return Err(refuse("unknown token kind")),
    };
    // The request acts for this org from now on: the tenant pool shows it only its rows.
    engine::tenancy::act_for(org);
    let console_session = kind == TokenKind::User && row.name == CONSOLE_SESSION;
    Ok(Caller { jti, org, org_slug: row.slug, kind, user: row.user_id, role, project: row.project_id, console_session })
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if let Some(caller) = parts.extensions.get::<Caller>() {
            // Verified already (the console's in-process calls attach the signed-in caller).
            engine::tenancy::act_for(caller.org);
            return Ok(caller.clone());
        }
        let value = parts.headers.get(header::AUTHORIZATION).ok_or_else(|| refuse("no Authorization header"))?;
        let text = value.to_str().map_err(|_| refuse("Authorization is not ASCII"))?;
        let (scheme, token) = text.split_once(' ').ok_or_else(|| refuse("no scheme"))?;
        if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() || token.len() > 8192 {
            return Err(refuse("not a bearer token"));
        }
        let caller = verify(state, token.trim()).await?;
        if caller.console_session {
            return Err(ApiError::Unauthorized(
                "a console session is not an API token: make one on the org's tokens page (or POST /api/v1/orgs/{org}/tokens)".into(),
            ));
        }
        parts.extensions.insert(caller.clone());
        Ok(caller)
    }
}
