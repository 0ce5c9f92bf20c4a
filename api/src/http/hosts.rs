//! Hosts of a project: list (viewer), registration tokens (admin: a token, shown once, that
//! registers one host through the host protocol), deregistration (admin: the host takes
//! no more steps and its credentials are revoked), and draining (admin: the host claims
//! nothing new while the steps it holds run to their end; undrain lets it claim again).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Duration, Utc};
use engine::ids::HostId;
use engine::store::{api_writes, operator};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::Role;
use super::error::ApiError;
use super::extract::{Json, JsonOrEmpty, Path, Query};
use super::tenant::ProjectScope;
use super::{AppState, page};
use crate::auth::issue_registration_token;

/// Lifetime of a registration token when none is asked for, and the longest allowed.
const DEFAULT_HOURS: u32 = 24;
const MAX_HOURS: u32 = 7 * 24;

#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Host {
    #[sqlx(rename = "host_id")]
    pub id: uuid::Uuid,
    pub name: String,
    /// What it advertises: `linux`, `arm64`, `harness:claude-code`, …
    pub capabilities: Vec<String>,
    pub max_concurrent: i32,
    pub last_seen_at: Option<DateTime<Utc>>,
    pub deregistered_at: Option<DateTime<Utc>>,
    /// When an operator drained it: it claims nothing new, and the steps it holds run on.
    pub drained_at: Option<DateTime<Utc>>,
    /// Who drained it (`user:<id>`).
    pub drained_by: Option<String>,
    pub created_at: DateTime<Utc>,
}

page::list!(HostList of Host);

#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRegistration {
    /// What the token is for (`build-box-3`), at most 100 printable characters; `host
    /// registration` by default.
    #[schema(max_length = 100)]
    pub name: Option<String>,
    /// 1 to 168 hours (24 by default).
    #[schema(minimum = 1, maximum = 168)]
    pub expires_in_hours: Option<u32>,
}

/// A registration token: `token` is shown this once.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Registration {
    pub id: uuid::Uuid,
    pub token: String,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Also list deregistered hosts.
    #[serde(default)]
    pub include_deregistered: bool,
    /// Page size, 1 to 200 (50 by default).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// The path of a host's routes.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct HostPath {
    /// The host's id
    host: String,
}

/// The project's hosts, by name.
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/hosts", operation_id = "list_hosts", tag = "hosts",
    params(ProjectScope, ListQuery),
    responses((status = 200, body = HostList)))]
pub async fn list(State(state): State<AppState>, scope: ProjectScope, Query(q): Query<ListQuery>) -> Result<Json<HostList>, ApiError> {
    scope.require(Role::Viewer)?;
    let (limit, after) = page::start::<(String, uuid::Uuid)>(q.limit, q.cursor.as_deref())?;
    let mut qb = sqlx::QueryBuilder::<sqlx::Postgres>::new(
        "SELECT host_id, name, capabilities, max_concurrent, last_seen_at, deregistered_at, drained_at, drained_by, created_at FROM hosts WHERE org_id = ",
    );
    qb.push_bind(scope.org.org).push(" AND project_id = ").push_bind(scope.project);
    if !q.include_deregistered {
        qb.push(" AND deregistered_at IS NULL");
    }
    if let Some((name, id)) = after {
        qb.push(" AND (name, host_id) > (").push_bind(name).push(", ").push_bind(id).push(")");
    }
    qb.push(" ORDER BY name, host_id LIMIT ").push_bind(limit + 1);
    let rows: Vec<Host> = qb.build_query_as().fetch_all(&state.db).await?;
    Ok(Json(HostList::page(rows, limit, |h| (h.name.clone(), h.id))))
}

/// Creates a token that registers one host in this project (admin).
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/host-registrations", operation_id = "create_host_registration", tag = "hosts",
    params(ProjectScope),
    request_body(content = Option<CreateRegistration>, description = "Optional name and lifetime"),
    responses((status = 201, body = Registration)))]
pub async fn register(State(state): State<AppState>, scope: ProjectScope, JsonOrEmpty(body): JsonOrEmpty<CreateRegistration>) -> Result<Response, ApiError> {
    scope.require(Role::Admin)?;
    let hours = body.expires_in_hours.unwrap_or(DEFAULT_HOURS);
    if !(1..=MAX_HOURS).contains(&hours) {
        return Err(ApiError::Unprocessable(format!("expires_in_hours must be between 1 and {MAX_HOURS}")));
    }
    let given = body.name.as_deref().unwrap_or_default();
    let name = Some(given.trim()).filter(|n| !n.is_empty()).unwrap_or("host registration").to_owned();
    if given.chars().count() > 100 || name.chars().any(char::is_control) {
        return Err(ApiError::Unprocessable("name must be at most 100 printable characters".into()));
    }
    let mut ch = scope.change(&state).await?;
    let (id, token, expires_at) =
        issue_registration_token(&mut ch, state.secret_key(), scope.org.org, scope.project, &name, Duration::hours(i64::from(hours))).await?;
    ch.commit().await?;
    Ok((StatusCode::CREATED, Json(Registration { id, token, expires_at })).into_response())
}

/// Deregisters a host (admin): it takes no more steps and its credentials are revoked.
#[utoipa::path(delete, path = "/orgs/{org}/projects/{project}/hosts/{host}", operation_id = "deregister_host", tag = "hosts",
    params(ProjectScope, HostPath),
    responses((status = 204, description = "Deregistered")))]
pub async fn deregister(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<HostPath>) -> Result<Response, ApiError> {
    scope.require(Role::Admin)?;
    let host = HostId(p.host.parse().map_err(|_| ApiError::NotFound("host not found".into()))?);
    let mut ch = scope.change(&state).await?;
    api_writes::deregister_host(&mut ch, scope.org.org, scope.project, host).await?;
    ch.commit().await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

const HOST_BY_ID: &str = "SELECT host_id, name, capabilities, max_concurrent, last_seen_at, deregistered_at, drained_at, drained_by, created_at FROM hosts \
     WHERE host_id = $1 AND org_id = $2 AND project_id = $3";

async fn set_drained(state: &AppState, scope: &ProjectScope, host: &str, drained: bool) -> Result<Json<Host>, ApiError> {
    scope.require(Role::Admin)?;
    let not_found = || ApiError::NotFound("host not found".into());
    let host = HostId(host.parse().map_err(|_| not_found())?);
    let mut ch = scope.change(state).await?;
    operator::set_host_drained(&mut ch, scope.org.org, scope.project, host, drained).await?;
    let row: Host = sqlx::query_as(HOST_BY_ID).bind(host).bind(scope.org.org).bind(scope.project).fetch_optional(ch.conn()).await?.ok_or_else(not_found)?;
    ch.commit().await?;
    Ok(Json(row))
}

/// Drains a host (admin): its claims take nothing new; the steps it holds run to their end.
/// Draining a drained host changes nothing.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/hosts/{host}/drain", operation_id = "drain_host", tag = "hosts",
    params(ProjectScope, HostPath),
    responses((status = 200, body = Host)))]
pub async fn drain(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<HostPath>) -> Result<Json<Host>, ApiError> {
    set_drained(&state, &scope, &p.host, true).await
}

/// Lets a drained host claim steps again (admin).
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/hosts/{host}/undrain", operation_id = "undrain_host", tag = "hosts",
    params(ProjectScope, HostPath),
    responses((status = 200, body = Host)))]
pub async fn undrain(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<HostPath>) -> Result<Json<Host>, ApiError> {
    set_drained(&state, &scope, &p.host, false).await
}
