//! Members of an org: list (viewer), add by email with a role, change a role, remove (admin;
//! only an owner grants, changes or removes the owner role). Removing a member revokes their
//! tokens in the same change.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use engine::ids::UserId;
use engine::store::api_writes;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::Role;
use super::error::ApiError;
use super::extract::{IdempotencyKey, Json, PathId, Query};
use super::page::{self, PageQuery};
use super::tenant::OrgScope;
use super::{AppState, idempotency};

#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Member {
    #[sqlx(rename = "user_id")]
    pub user: uuid::Uuid,
    pub email: String,
    pub role: String,
    pub github_login: Option<String>,
    /// When they joined the org.
    pub created_at: DateTime<Utc>,
}

page::list!(MemberList of Member);

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddMember {
    /// An address with an `@`, at most 254 characters, no control character.
    #[schema(pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*@[^\\x00-\\x1f\\x7f-\\x9f]*$", max_length = 254)]
    pub email: String,
    pub role: Role,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChangeRole {
    pub role: Role,
}

/// The path of a member's routes, as documented; handlers read the id with `PathId`.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct MemberPath {
    /// The member's user id
    pub user: String,
}

const SELECT: &str = "SELECT u.user_id, u.email, m.role, u.github_login, m.created_at \
     FROM memberships m JOIN users u ON u.user_id = m.user_id AND u.org_id = m.org_id WHERE m.org_id = $1";

async fn load(state: &AppState, scope: &OrgScope, user: UserId) -> Result<Member, ApiError> {
    sqlx::query_as(&format!("{SELECT} AND m.user_id = $2"))
        .bind(scope.org)
        .bind(user)
        .fetch_optional(&state.db)
        .await?
        .ok_or_else(|| ApiError::NotFound("member not found".into()))
}

/// Only an owner may touch the owner role, given or taken.
fn guard_owner(scope: &OrgScope, roles: &[&str]) -> Result<(), ApiError> {
    if roles.contains(&"owner") { scope.require(Role::Owner) } else { Ok(()) }
}

/// The org's members, by email.
#[utoipa::path(get, path = "/orgs/{org}/members", operation_id = "list_members", tag = "members",
    params(OrgScope, PageQuery),
    responses((status = 200, body = MemberList)))]
pub async fn list(State(state): State<AppState>, scope: OrgScope, Query(q): Query<PageQuery>) -> Result<Json<MemberList>, ApiError> {
    scope.require(Role::Viewer)?;
    let (limit, after) = q.start::<(String, uuid::Uuid)>()?;
    let rows: Vec<Member> = match after {
        Some((email, user)) => {
            sqlx::query_as(&format!("{SELECT} AND (u.email, u.user_id) > ($2, $3) ORDER BY u.email, u.user_id LIMIT $4"))
                .bind(scope.org)
                .bind(email)
                .bind(user)
                .bind(limit + 1)
                .fetch_all(&state.db)
                .await?
        }
        None => sqlx::query_as(&format!("{SELECT} ORDER BY u.email, u.user_id LIMIT $2")).bind(scope.org).bind(limit + 1).fetch_all(&state.db).await?,
    };
    Ok(Json(MemberList::page(rows, limit, |m| (m.email.clone(), m.user))))
}

/// Adds a person by email with a role (admin; owner to add an owner).
#[utoipa::path(post, path = "/orgs/{org}/members", operation_id = "add_member", tag = "members",
    params(OrgScope, IdempotencyKey),
    request_body = AddMember,
    responses((status = 201, body = Member), (status = 409, description = "Already a member")))]
pub async fn add(State(state): State<AppState>, scope: OrgScope, key: IdempotencyKey, Json(body): Json<AddMember>) -> Result<Response, ApiError> {
    scope.require(Role::Admin)?;
    guard_owner(&scope, &[body.role.as_str()])?;
    let ch = scope.change(&state).await?;
    idempotency::create(ch, scope.org, &key, &body, async |ch| {
        let user = api_writes::add_member(ch, scope.org, &body.email, body.role.as_str()).await?;
        let member: Member = sqlx::query_as(&format!("{SELECT} AND m.user_id = $2")).bind(scope.org).bind(user).fetch_one(ch.conn()).await?;
        Ok(member)
    })
    .await
}

/// Changes a member's role (admin; owner when the owner role is given or taken). The last
/// owner keeps the role.
#[utoipa::path(patch, path = "/orgs/{org}/members/{user}", operation_id = "change_member_role", tag = "members",
    params(OrgScope, MemberPath),
    request_body = ChangeRole,
    responses((status = 200, body = Member), (status = 409, description = "The last owner")))]
pub async fn change_role(
    State(state): State<AppState>, scope: OrgScope, PathId(user): PathId<UserId>, Json(body): Json<ChangeRole>,
) -> Result<Json<Member>, ApiError> {
    scope.require(Role::Admin)?;
    let mut ch = scope.change(&state).await?;
    let current = api_writes::member_role(&mut ch, scope.org, user).await?.ok_or_else(|| ApiError::NotFound("member not found".into()))?;
    guard_owner(&scope, &[current.as_str(), body.role.as_str()])?;
    api_writes::set_member_role(&mut ch, scope.org, user, body.role.as_str()).await?;
    ch.commit().await?;
    Ok(Json(load(&state, &scope, user).await?))
}

/// Removes a member and revokes their tokens (admin; owner to remove an owner). The last owner
/// stays.
#[utoipa::path(delete, path = "/orgs/{org}/members/{user}", operation_id = "remove_member", tag = "members",
    params(OrgScope, MemberPath),
    responses((status = 204, description = "Removed"), (status = 409, description = "The last owner")))]
pub async fn remove(State(state): State<AppState>, scope: OrgScope, PathId(user): PathId<UserId>) -> Result<Response, ApiError> {
    scope.require(Role::Admin)?;
    let mut ch = scope.change(&state).await?;
    let current = api_writes::member_role(&mut ch, scope.org, user).await?.ok_or_else(|| ApiError::NotFound("member not found".into()))?;
    guard_owner(&scope, &[current.as_str()])?;
    api_writes::remove_member(&mut ch, scope.org, user).await?;
    ch.commit().await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
