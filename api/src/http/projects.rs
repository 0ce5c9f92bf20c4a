//! Projects of an org: list and get (viewer), create (admin, `Idempotency-Key` honoured).

use axum::extract::State;
use axum::response::Response;
use chrono::{DateTime, Utc};
use engine::ids::Slug;
use engine::store::tenants;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::Role;
use super::error::ApiError;
use super::extract::{IdempotencyKey, Json, Query};
use super::page::{self, PageQuery};
use super::tenant::{OrgScope, ProjectScope};
use super::{AppState, idempotency};

#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Project {
    /// The project's slug: its name in URLs.
    pub slug: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

page::list!(ProjectList of Project);

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProject {
    /// 1-63 lowercase letters, digits and dashes, not starting with a dash.
    #[schema(min_length = 1, max_length = 63, pattern = "^[a-z0-9][a-z0-9-]*$")]
    pub slug: String,
    /// Display name (the slug by default), at most 200 characters.
    #[schema(max_length = 200)]
    pub name: Option<String>,
}

/// The org's projects, by slug.
#[utoipa::path(get, path = "/orgs/{org}/projects", operation_id = "list_projects", tag = "projects",
    params(OrgScope, PageQuery),
    responses((status = 200, body = ProjectList)))]
pub async fn list(State(state): State<AppState>, scope: OrgScope, Query(q): Query<PageQuery>) -> Result<Json<ProjectList>, ApiError> {
    scope.require(Role::Viewer)?;
    // A token limited to one project sees only it.
    let (rows, limit) = page::by_name(&state.db, "SELECT slug, name, created_at FROM projects", scope.org, scope.caller.project, "slug", &q).await?;
    Ok(Json(ProjectList::page(rows, limit, |p| p.slug.clone())))
}

const PROJECT_BY_ID: &str = "SELECT slug, name, created_at FROM projects WHERE org_id = $1 AND project_id = $2";

/// Creates a project (admin).
#[utoipa::path(post, path = "/orgs/{org}/projects", operation_id = "create_project", tag = "projects",
    params(OrgScope, IdempotencyKey),
    request_body = CreateProject,
    responses((status = 201, body = Project), (status = 409, description = "The slug is taken")))]
pub async fn create(State(state): State<AppState>, scope: OrgScope, key: IdempotencyKey, Json(body): Json<CreateProject>) -> Result<Response, ApiError> {
    scope.require(Role::Admin)?;
    let slug = Slug::parse(&body.slug).map_err(|e| ApiError::Unprocessable(e.to_string()))?;
    let name = body.name.as_deref().map(str::trim).filter(|n| !n.is_empty()).unwrap_or(slug.as_str()).to_owned();
    if body.name.as_deref().unwrap_or_default().chars().count() > 200 {
        return Err(ApiError::Unprocessable("name must be at most 200 characters".into()));
    }
    let ch = scope.change(&state).await?;
    idempotency::create(ch, scope.org, &key, &body, async |ch| {
        let id = tenants::create_project(ch, scope.org, &slug, &name).await?;
        let project: Project = sqlx::query_as(PROJECT_BY_ID).bind(scope.org).bind(id).fetch_one(ch.conn()).await?;
        Ok(project)
    })
    .await
}

/// One project.
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}", operation_id = "get_project", tag = "projects",
    params(ProjectScope),
    responses((status = 200, body = Project)))]
pub async fn get(State(state): State<AppState>, scope: ProjectScope) -> Result<Json<Project>, ApiError> {
    scope.require(Role::Viewer)?;
    let project: Project = sqlx::query_as(PROJECT_BY_ID).bind(scope.org.org).bind(scope.project).fetch_one(&state.db).await?;
    Ok(Json(project))
}
