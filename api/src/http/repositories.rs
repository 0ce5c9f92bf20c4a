//! Repositories of a project: list (viewer) and connect (admin).
//!
//! A repository is connected to a project through an installation of the GitHub App that the
//! org claimed (`installations.rs`) and that reaches the repository. The `installation` and
//! `installation_repositories` webhooks keep the connection current afterwards (an uninstalled
//! App or a removed repository detaches it; added back, it is attached again), but only a
//! person connects a repository to a project: a webhook alone never routes a repository's
//! events to a project no one chose.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use engine::store::installations;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::auth::Role;
use super::error::ApiError;
use super::extract::{Json, Query};
use super::page::{self, PageQuery};
use super::tenant::ProjectScope;

#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Repository {
    /// `owner/name`, lowercased.
    pub full_name: String,
    /// The App installation it is reached through; null when the App lost access to it.
    pub installation_id: Option<i64>,
    /// The branch pull requests are opened against.
    pub default_branch: String,
    pub created_at: DateTime<Utc>,
}

page::list!(RepositoryList of Repository);

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConnectRepository {
    /// The GitHub App installation that can reach the repository.
    #[schema(minimum = 1)]
    pub installation_id: i64,
    /// `owner/name`: each 1 to 100 letters, digits, `-`, `_` or `.`.
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$")]
    pub repository: String,
    /// The branch pull requests are opened against (`main` by default): 1 to 250 characters,
    /// no space or control character.
    #[schema(pattern = "^[^\\x00-\\x20\\x7f-\\x9f]{1,250}$")]
    pub default_branch: Option<String>,
}

/// The project's repositories, by name.
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/repositories", operation_id = "list_repositories", tag = "repositories",
    params(ProjectScope, PageQuery),
    responses((status = 200, body = RepositoryList)))]
pub async fn list(State(state): State<AppState>, scope: ProjectScope, Query(q): Query<PageQuery>) -> Result<Json<RepositoryList>, ApiError> {
    scope.require(Role::Viewer)?;
    let select = "SELECT full_name, installation_id, default_branch, created_at FROM repositories";
    let (rows, limit) = page::by_name(&state.db, select, scope.org.org, Some(scope.project), "full_name", &q).await?;
    Ok(Json(RepositoryList::page(rows, limit, |r| r.full_name.clone())))
}

/// `owner/name` with GitHub's characters only.
fn valid_name(name: &str) -> bool {
    let ok = |part: &str| !part.is_empty() && part.len() <= 100 && part.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    matches!(name.split_once('/'), Some((owner, repo)) if ok(owner) && ok(repo) && !repo.contains('/'))
}

/// Connects a repository to the project through an App installation of the org (admin).
/// Connecting it again updates the installation and default branch. An installation the org
/// has not claimed (another org's included) is not found; a repository the installation does
/// not reach is refused.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/repositories", operation_id = "connect_repository", tag = "repositories",
    params(ProjectScope),
    request_body = ConnectRepository,
    responses((status = 201, body = Repository),
        (status = 404, description = "The org has no such installation"),
        (status = 422, description = "The installation does not reach the repository")))]
pub async fn connect(State(state): State<AppState>, scope: ProjectScope, Json(body): Json<ConnectRepository>) -> Result<Response, ApiError> {
    scope.require(Role::Admin)?;
    if !valid_name(&body.repository) {
        return Err(ApiError::Unprocessable("repository must be owner/name".into()));
    }
    if body.installation_id <= 0 {
        return Err(ApiError::Unprocessable("installation_id must be a GitHub installation id".into()));
    }
    let branch = body.default_branch.as_deref().unwrap_or("main");
    if branch.is_empty() || branch.chars().count() > 250 || branch.chars().any(|c| c.is_control() || c == ' ') {
        return Err(ApiError::Unprocessable("default_branch is not a branch name".into()));
    }
    refresh_if_unreached(&state, &scope, body.installation_id, &body.repository).await?;
    let mut ch = scope.change(&state).await?;
    installations::connect_repository(&mut ch, scope.org.org, scope.project, body.installation_id, &body.repository).await?;
    engine::store::github::set_default_branch(&mut ch, scope.org.org, scope.project, &body.repository, branch).await?;
    let row: Repository = sqlx::query_as(
        "SELECT full_name, installation_id, default_branch, created_at FROM repositories WHERE org_id = $1 AND project_id = $2 AND full_name = $3",
    )
    .bind(scope.org.org)
    .bind(scope.project)
    .bind(body.repository.to_lowercase())
    .fetch_one(ch.conn())
    .await?;
    ch.commit().await?;
    Ok((StatusCode::CREATED, Json(row)).into_response())
}

/// A repository the stored list lacks may have been added since GitHub last said (an
/// installation on all repositories sends no webhook for a new one): when the App is configured
/// here, its API gives the list again before the connect decides.
async fn refresh_if_unreached(state: &AppState, scope: &ProjectScope, installation: i64, repository: &str) -> Result<(), ApiError> {
    let Some(app) = state.shared.github.get() else { return Ok(()) };
    let mut conn = state.db.begin().await?;
    let ours = installations::find(&mut conn, installation).await?.is_some_and(|i| i.org == Some(scope.org.org));
    if !ours || installations::reaches(&mut conn, installation, repository).await? {
        return Ok(());
    }
    drop(conn);
    let announced = super::installations::from_app(app, installation).await?;
    let mut ch = scope.change(state).await?;
    installations::announce(&mut ch, &announced).await?;
    ch.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn repository_names_are_owner_slash_name() {
        assert!(super::valid_name("Acme/widgets.rs"));
        assert!(!super::valid_name("acme"));
        assert!(!super::valid_name("acme/"));
        assert!(!super::valid_name("a/b/c"));
        assert!(!super::valid_name("acme/wid gets"));
    }
}
