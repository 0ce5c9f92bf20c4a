//! The tenant extractors: each handler of `/orgs/{org}/…` receives the org its caller may
//! touch, and each handler of `/orgs/{org}/projects/{project}/…` the project too, so no
//! handler can forget the scope. An org or project the caller may not see answers 404, the
//! same as one that does not exist: another tenant's existence is never revealed.

use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;
use engine::ids::{OrgId, ProjectId, Slug};
use engine::store::{Change, cap};
use utoipa::openapi::Required;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::{IntoParams, PartialSchema};

use super::AppState;
use super::auth::{Caller, Role, TokenKind};
use super::error::ApiError;
use super::extract::path_param;

/// An org the caller belongs to, from the `{org}` path parameter.
#[derive(Debug, Clone)]
pub struct OrgScope {
    pub caller: Caller,
    pub org: OrgId,
    pub slug: String,
}

impl OrgScope {
    /// The caller's effective role (only person tokens reach an `OrgScope`).
    pub fn role(&self) -> Role {
        self.caller.role.unwrap_or(Role::Viewer)
    }

    /// Refuses the request with 403 unless the caller has at least `min`.
    pub fn require(&self, min: Role) -> Result<(), ApiError> {
        if self.role() >= min {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!("this needs the {} role or above; the token has {}", min.as_str(), self.role().as_str())))
        }
    }

    /// Starts a change of the write path, audited as this caller.
    pub async fn change(&self, state: &AppState) -> Result<Change, ApiError> {
        Ok(Change::begin(&state.db, self.caller.actor()).await?)
    }
}

impl FromRequestParts<AppState> for OrgScope {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let caller = Caller::from_request_parts(parts, state).await?;
        let slug = path_param(parts, "org").await?.ok_or_else(|| ApiError::internal("route without {org} uses OrgScope"))?;
        if slug != caller.org_slug {
            return Err(ApiError::NotFound(format!("org `{}` not found", cap(&slug))));
        }
        if caller.kind != TokenKind::User {
            return Err(ApiError::Forbidden("host credentials may only use the host routes".into()));
        }
        Ok(OrgScope { org: caller.org, slug, caller })
    }
}

/// A project of the caller's org, from the `{project}` path parameter.
#[derive(Debug, Clone)]
pub struct ProjectScope {
    pub org: OrgScope,
    pub project: ProjectId,
    pub slug: String,
}

impl std::ops::Deref for ProjectScope {
    type Target = OrgScope;

    fn deref(&self) -> &OrgScope {
        &self.org
    }
}

impl FromRequestParts<AppState> for ProjectScope {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let org = OrgScope::from_request_parts(parts, state).await?;
        let slug = path_param(parts, "project").await?.ok_or_else(|| ApiError::internal("route without {project} uses ProjectScope"))?;
        let not_found = || ApiError::NotFound(format!("project `{}` not found", cap(&slug)));
        if Slug::parse(&slug).is_err() {
            return Err(not_found());
        }
        let project: Option<ProjectId> =
            sqlx::query_scalar("SELECT project_id FROM projects WHERE org_id = $1 AND slug = $2").bind(org.org).bind(&slug).fetch_optional(&state.db).await?;
        let project = project.ok_or_else(not_found)?;
        // A token limited to one project sees no other.
        if org.caller.project.is_some_and(|p| p != project) {
            return Err(not_found());
        }
        Ok(ProjectScope { org, project, slug })
    }
}

/// The document's path parameters of the routes under an org: a handler that takes the scope
/// names it in its `params(...)`.
impl IntoParams for OrgScope {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![slug_param("org", "Org slug")]
    }
}

impl IntoParams for ProjectScope {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![slug_param("org", "Org slug"), slug_param("project", "Project slug")]
    }
}

fn slug_param(name: &str, description: &str) -> Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Path)
        .required(Required::True)
        .description(Some(description))
        .schema(Some(String::schema()))
        .build()
}

/// Runs each request in a tenancy scope (`engine::tenancy::scoped`), which its verified caller
/// fills (`auth::verify`): from then on the request's statements on the tenant pool see only
/// that org's rows.
pub async fn scope(request: Request, next: Next) -> Response {
    engine::tenancy::scoped(None, next.run(request)).await
}
