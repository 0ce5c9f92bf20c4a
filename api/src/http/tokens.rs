//! API tokens of an org: a member creates tokens for themselves (at most their own role; the
//! signed token is in the answer once and never again), lists them and revokes them; an admin
//! lists and revokes everyone's.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Duration, Utc};
use engine::store::api_writes;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::Role;
use super::error::ApiError;
use super::extract::{Json, Path, Query};
use super::page::{self, PageQuery};
use super::tenant::OrgScope;
use crate::auth::{UserToken, issue_user_token_with_id};

/// Lifetime of a token when none is asked for.
const DEFAULT_DAYS: u32 = 90;
const MAX_DAYS: u32 = 365;

/// A token's record; the signed token itself is never stored.
#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Token {
    #[sqlx(rename = "jti")]
    pub id: uuid::Uuid,
    pub name: String,
    /// `user`, `host` or `registration`.
    pub kind: String,
    pub role: String,
    #[sqlx(rename = "user_id")]
    pub user: Option<uuid::Uuid>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

page::list!(TokenList of Token);

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// What the token is for, e.g. `ci`: 1 to 100 printable characters, not all spaces.
    #[schema(min_length = 1, max_length = 100, pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*[^\\s\\x00-\\x1f\\x7f-\\x9f][^\\x00-\\x1f\\x7f-\\x9f]*$")]
    pub name: String,
    /// At most the caller's own role, which is the default.
    pub role: Option<Role>,
    /// 1 to 365 days (90 by default).
    #[schema(minimum = 1, maximum = 365)]
    pub expires_in_days: Option<u32>,
}

/// A new token: `token` is the signed bearer token, shown this once.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CreatedToken {
    pub token: String,
    #[serde(flatten)]
    pub record: Token,
}

/// The path of a token's routes.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TokenPath {
    /// The token's id
    token: String,
}

const COLUMNS: &str = "jti, name, kind, role, user_id, created_at, expires_at, revoked_at";

/// Tokens of the org, newest first: everyone's for an admin, the caller's own otherwise.
#[utoipa::path(get, path = "/orgs/{org}/tokens", operation_id = "list_tokens", tag = "tokens",
    params(OrgScope, PageQuery),
    responses((status = 200, body = TokenList)))]
pub async fn list(State(state): State<AppState>, scope: OrgScope, Query(q): Query<PageQuery>) -> Result<Json<TokenList>, ApiError> {
    scope.require(Role::Viewer)?;
    let (limit, after) = q.start::<(i64, uuid::Uuid)>()?;
    // Not an admin: only the caller's own tokens (a person token always has a user).
    let only = if scope.role() >= Role::Admin { None } else { Some(scope.caller.user.map_or(uuid::Uuid::nil(), |u| u.0)) };
    let mut qb = sqlx::QueryBuilder::<sqlx::Postgres>::new(format!("SELECT {COLUMNS} FROM api_tokens WHERE org_id = "));
    qb.push_bind(scope.org);
    if let Some(user) = only {
        qb.push(" AND user_id = ").push_bind(user);
    }
    page::newest_first(&mut qb, "jti", after, limit)?;
    let rows: Vec<Token> = qb.build_query_as().fetch_all(&state.db).await?;
    Ok(Json(TokenList::page(rows, limit, |t| page::newest_key(t.created_at, t.id))))
}

/// Creates a token for the caller, with at most the caller's role.
#[utoipa::path(post, path = "/orgs/{org}/tokens", operation_id = "create_token", tag = "tokens",
    params(OrgScope),
    request_body = CreateToken,
    responses((status = 201, body = CreatedToken)))]
pub async fn create(State(state): State<AppState>, scope: OrgScope, Json(body): Json<CreateToken>) -> Result<Response, ApiError> {
    scope.require(Role::Member)?;
    let role = body.role.unwrap_or(scope.role());
    if role > scope.role() {
        return Err(ApiError::Forbidden(format!("a token cannot have a higher role ({}) than its creator's ({})", role.as_str(), scope.role().as_str())));
    }
    let name = body.name.trim();
    if name.is_empty() || body.name.chars().count() > 100 || name.chars().any(char::is_control) {
        return Err(ApiError::Unprocessable("name must be 1 to 100 printable characters".into()));
    }
    if name.eq_ignore_ascii_case(crate::http::auth::CONSOLE_SESSION) {
        return Err(ApiError::Unprocessable(format!("`{}` names the console's sessions; choose another name", crate::http::auth::CONSOLE_SESSION)));
    }
    let days = body.expires_in_days.unwrap_or(DEFAULT_DAYS);
    if !(1..=MAX_DAYS).contains(&days) {
        return Err(ApiError::Unprocessable(format!("expires_in_days must be between 1 and {MAX_DAYS}")));
    }
    let user = scope.caller.user.ok_or_else(|| ApiError::Forbidden("only a person's token can create tokens".into()))?;
    let mut ch = scope.change(&state).await?;
    let (jti, token) = issue_user_token_with_id(
        &mut ch,
        state.secret_key(),
        // A token limited to one project makes tokens limited to it too.
        UserToken { org: scope.org, user, project: scope.caller.project, role: role.as_str(), name, ttl: Duration::days(i64::from(days)) },
    )
    .await?;
    let record: Token =
        sqlx::query_as(&format!("SELECT {COLUMNS} FROM api_tokens WHERE org_id = $1 AND jti = $2")).bind(scope.org).bind(jti).fetch_one(ch.conn()).await?;
    ch.commit().await?;
    Ok((StatusCode::CREATED, Json(CreatedToken { token, record })).into_response())
}

/// Revokes a token: the caller's own, or anyone's for an admin (an owner's only for an owner).
/// The console sessions made by pasting it end with it.
///
/// Revoking twice is fine.
#[utoipa::path(delete, path = "/orgs/{org}/tokens/{token}", operation_id = "revoke_token", tag = "tokens",
    params(OrgScope, TokenPath),
    responses((status = 204, description = "Revoked")))]
pub async fn revoke(State(state): State<AppState>, scope: OrgScope, Path(p): Path<TokenPath>) -> Result<Response, ApiError> {
    scope.require(Role::Member)?;
    let not_found = || ApiError::NotFound("token not found".into());
    let jti: uuid::Uuid = p.token.parse().map_err(|_| not_found())?;
    let token: Option<(Option<uuid::Uuid>, String)> =
        sqlx::query_as("SELECT user_id, role FROM api_tokens WHERE org_id = $1 AND jti = $2").bind(scope.org).bind(jti).fetch_optional(&state.db).await?;
    let (owner, role) = token.ok_or_else(not_found)?;
    // Someone else's token is not there for a non-admin, as in their list.
    if scope.role() < Role::Admin && owner != scope.caller.user.map(|u| u.0) {
        return Err(not_found());
    }
    // Only an owner may touch the owner role (as with members): an admin cannot lock the
    // org's owners out.
    if role == "owner" {
        scope.require(Role::Owner)?;
    }
    let mut ch = scope.change(&state).await?;
    api_writes::revoke_token(&mut ch, scope.org, jti).await?;
    ch.commit().await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
