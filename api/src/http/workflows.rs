//! Workflows of a project: upload a version from YAML (`application/yaml`, or JSON
//! `{"source": …}`), answered 422 with every validation problem and its place; list, read,
//! list versions, read a version; validate without saving; pause and unpause. Versions are
//! immutable, and uploading the latest version's text again changes nothing.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use engine::ids::WorkflowId;
use engine::store::{cap, workflows as store};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::Role;
use super::error::{ApiError, WorkflowProblem};
use super::extract::{IdempotencyKey, Json, Path, Query, WorkflowSource};
use super::page::{self, PageQuery};
use super::tenant::ProjectScope;
use super::{AppState, idempotency};

#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Workflow {
    pub name: String,
    pub latest_version: i32,
    /// New runs of a paused workflow are held.
    pub paused: bool,
    pub created_at: DateTime<Utc>,
}

page::list!(WorkflowList of Workflow);

#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Version {
    pub version: i32,
    pub sha256: String,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    /// The YAML text (only when one version is read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

page::list!(VersionList of Version);

/// The workflow with its latest version's text.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkflowDetail {
    #[serde(flatten)]
    pub workflow: Workflow,
    pub latest: Option<Version>,
}

/// What an upload did.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Uploaded {
    pub name: String,
    pub version: i32,
    /// False when the text was the latest version's already.
    pub created: bool,
}

/// What validation found: `valid` is true when `problems` is empty.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Validation {
    pub valid: bool,
    /// The workflow's name, when the text is valid.
    pub name: Option<String>,
    pub problems: Vec<WorkflowProblem>,
}

/// The request body of an upload or a validation: YAML, or JSON `{"source": "<yaml>"}`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SourceBody {
    pub source: String,
}

/// The path of a workflow's routes.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct NamePath {
    /// Workflow name
    name: String,
}

/// The path of a workflow version's routes.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct VersionPath {
    /// Workflow name
    name: String,
    /// Version number
    #[param(value_type = i32)]
    version: String,
}

fn parse(source: &str) -> Result<engine::definition::Definition, ApiError> {
    engine::definition::parse(source).map_err(|problems| ApiError::InvalidWorkflow(problems.iter().map(WorkflowProblem::from).collect()))
}

const WORKFLOW_BY_NAME: &str =
    "SELECT workflow_id, name, latest_version, paused, created_at FROM workflows WHERE org_id = $1 AND project_id = $2 AND name = $3";

async fn find(state: &AppState, scope: &ProjectScope, name: &str) -> Result<(WorkflowId, Workflow), ApiError> {
    let row: Option<(WorkflowId, String, i32, bool, DateTime<Utc>)> =
        sqlx::query_as(WORKFLOW_BY_NAME).bind(scope.org.org).bind(scope.project).bind(name).fetch_optional(&state.db).await?;
    let (id, name, latest_version, paused, created_at) = row.ok_or_else(|| ApiError::NotFound(format!("workflow `{}` not found", cap(name))))?;
    Ok((id, Workflow { name, latest_version, paused, created_at }))
}

const LATEST_VERSION: &str = "SELECT latest_version FROM workflows WHERE org_id = $1 AND project_id = $2 AND name = $3";

/// Stores a validated source as the next version; the same text as the latest is no change.
async fn upload(state: &AppState, scope: &ProjectScope, key: &IdempotencyKey, name: &str, source: &str, status_new: StatusCode) -> Result<Response, ApiError> {
    let mut ch = scope.change(state).await?;
    if let Some(replay) = idempotency::claim(&mut ch, scope.org.org, key, &source).await? {
        return Ok(replay);
    }
    let before: Option<i32> = sqlx::query_scalar(LATEST_VERSION).bind(scope.org.org).bind(scope.project).bind(name).fetch_optional(ch.conn()).await?;
    let (_, version) = store::put_version(&mut ch, scope.org.org, scope.project, name, source).await?;
    let created = before != Some(version);
    let status = if created { status_new } else { StatusCode::OK };
    let response = idempotency::answer(&mut ch, scope.org.org, key, status, &Uploaded { name: name.to_owned(), version, created }).await?;
    ch.commit().await?;
    Ok(response)
}

/// The project's workflows, by name.
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/workflows", operation_id = "list_workflows", tag = "workflows",
    params(ProjectScope, PageQuery),
    responses((status = 200, body = WorkflowList)))]
pub async fn list(State(state): State<AppState>, scope: ProjectScope, Query(q): Query<PageQuery>) -> Result<Json<WorkflowList>, ApiError> {
    scope.require(Role::Viewer)?;
    let select = "SELECT name, latest_version, paused, created_at FROM workflows";
    let (rows, limit) = page::by_name(&state.db, select, scope.org.org, Some(scope.project), "name", &q).await?;
    Ok(Json(WorkflowList::page(rows, limit, |w| w.name.clone())))
}

/// Uploads a version of the workflow its `name:` names (member). 201 for a new version, 200
/// when the text is the latest version's already; 422 lists every problem.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/workflows", operation_id = "create_workflow_version", tag = "workflows",
    params(ProjectScope, IdempotencyKey),
    request_body(content((serde_json::Value = "application/yaml"), (SourceBody = "application/json")), description = "The workflow's YAML (any YAML document: one that is not a workflow is answered with its problems)"),
    responses((status = 201, body = Uploaded), (status = 200, description = "Unchanged", body = Uploaded),
              (status = 422, description = "Every validation problem")))]
pub async fn create(
    State(state): State<AppState>, scope: ProjectScope, key: IdempotencyKey, WorkflowSource(source): WorkflowSource,
) -> Result<Response, ApiError> {
    scope.require(Role::Member)?;
    let def = parse(&source)?;
    upload(&state, &scope, &key, &def.name, &source, StatusCode::CREATED).await
}

/// Validates a workflow without saving it (member).
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/validate-workflow", operation_id = "validate_workflow", tag = "workflows",
    params(ProjectScope),
    request_body(content((serde_json::Value = "application/yaml"), (SourceBody = "application/json")), description = "The workflow's YAML (any YAML document: one that is not a workflow is answered with its problems)"),
    responses((status = 200, body = Validation)))]
pub async fn validate(scope: ProjectScope, WorkflowSource(source): WorkflowSource) -> Result<Json<Validation>, ApiError> {
    scope.require(Role::Member)?;
    Ok(Json(match engine::definition::parse(&source) {
        Ok(def) => Validation { valid: true, name: Some(def.name), problems: vec![] },
        Err(problems) => Validation { valid: false, name: None, problems: problems.iter().map(WorkflowProblem::from).collect() },
    }))
}

const VERSION_WITH_SOURCE: &str =
    "SELECT version, sha256, created_by, created_at, source FROM workflow_versions WHERE org_id = $1 AND workflow_id = $2 AND version = $3";

/// A workflow with its latest version.
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/workflows/{name}", operation_id = "get_workflow", tag = "workflows",
    params(ProjectScope, NamePath),
    responses((status = 200, body = WorkflowDetail)))]
pub async fn get(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<NamePath>) -> Result<Json<WorkflowDetail>, ApiError> {
    scope.require(Role::Viewer)?;
    let (id, workflow) = find(&state, &scope, &p.name).await?;
    let latest: Option<Version> =
        sqlx::query_as(VERSION_WITH_SOURCE).bind(scope.org.org).bind(id).bind(workflow.latest_version).fetch_optional(&state.db).await?;
    Ok(Json(WorkflowDetail { workflow, latest }))
}

/// Uploads a version of the workflow `{name}`, whose `name:` must agree (member). Same answers
/// as the POST.
#[utoipa::path(put, path = "/orgs/{org}/projects/{project}/workflows/{name}", operation_id = "put_workflow_version", tag = "workflows",
    params(ProjectScope, NamePath),
    request_body(content((serde_json::Value = "application/yaml"), (SourceBody = "application/json")), description = "The workflow's YAML (any YAML document: one that is not a workflow is answered with its problems)"),
    responses((status = 201, body = Uploaded), (status = 200, description = "Unchanged", body = Uploaded),
              (status = 422, description = "Every validation problem")))]
pub async fn put(
    State(state): State<AppState>, scope: ProjectScope, Path(p): Path<NamePath>, WorkflowSource(source): WorkflowSource,
) -> Result<Response, ApiError> {
    scope.require(Role::Member)?;
    let def = parse(&source)?;
    if def.name != p.name {
        return Err(ApiError::Unprocessable(format!("the workflow says `name: {}` but the path names `{}`", cap(&def.name), cap(&p.name))));
    }
    upload(&state, &scope, &IdempotencyKey(None), &def.name, &source, StatusCode::CREATED).await
}

/// The workflow's versions, newest first.
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/workflows/{name}/versions", operation_id = "list_workflow_versions", tag = "workflows",
    params(ProjectScope, NamePath, PageQuery),
    responses((status = 200, body = VersionList)))]
pub async fn versions(
    State(state): State<AppState>, scope: ProjectScope, Path(p): Path<NamePath>, Query(q): Query<PageQuery>,
) -> Result<Json<VersionList>, ApiError> {
    scope.require(Role::Viewer)?;
    let (limit, before) = q.start::<i32>()?;
    let (id, _) = find(&state, &scope, &p.name).await?;
    let rows: Vec<Version> = sqlx::query_as(
        "SELECT version, sha256, created_by, created_at, NULL::text AS source FROM workflow_versions \
         WHERE org_id = $1 AND workflow_id = $2 AND version < $3 ORDER BY version DESC LIMIT $4",
    )
    .bind(scope.org.org)
    .bind(id)
    .bind(before.unwrap_or(i32::MAX))
    .bind(limit + 1)
    .fetch_all(&state.db)
    .await?;
    Ok(Json(VersionList::page(rows, limit, |v| v.version)))
}

/// One version, with its text.
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/workflows/{name}/versions/{version}", operation_id = "get_workflow_version", tag = "workflows",
    params(ProjectScope, VersionPath),
    responses((status = 200, body = Version)))]
pub async fn version(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<VersionPath>) -> Result<Json<Version>, ApiError> {
    scope.require(Role::Viewer)?;
    let not_found = || ApiError::NotFound(format!("version `{}` not found", cap(&p.version)));
    let number: i32 = p.version.parse().map_err(|_| not_found())?;
    let (id, _) = find(&state, &scope, &p.name).await?;
    let row: Option<Version> = sqlx::query_as(VERSION_WITH_SOURCE).bind(scope.org.org).bind(id).bind(number).fetch_optional(&state.db).await?;
    Ok(Json(row.ok_or_else(not_found)?))
}

async fn set_paused(state: &AppState, scope: &ProjectScope, name: &str, paused: bool) -> Result<Json<Workflow>, ApiError> {
    scope.require(Role::Member)?;
    let (id, _) = find(state, scope, name).await?;
    let mut ch = scope.change(state).await?;
    store::set_paused(&mut ch, scope.org.org, id, paused).await?;
    ch.commit().await?;
    Ok(Json(find(state, scope, name).await?.1))
}

/// Pauses a workflow: its new runs are held (member).
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/workflows/{name}/pause", operation_id = "pause_workflow", tag = "workflows",
    params(ProjectScope, NamePath),
    responses((status = 200, body = Workflow)))]
pub async fn pause(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<NamePath>) -> Result<Json<Workflow>, ApiError> {
    set_paused(&state, &scope, &p.name, true).await
}

/// Unpauses a workflow (member).
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/workflows/{name}/unpause", operation_id = "unpause_workflow", tag = "workflows",
    params(ProjectScope, NamePath),
    responses((status = 200, body = Workflow)))]
pub async fn unpause(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<NamePath>) -> Result<Json<Workflow>, ApiError> {
    set_paused(&state, &scope, &p.name, false).await
}
