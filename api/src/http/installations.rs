//! The org's GitHub App installations: list (viewer), claim with proof (admin), give up (admin).
//!
//! An org never takes an installation by naming its id. A claim carries a GitHub user access
//! token of a person (the console's "Connect GitHub" gets one through GitHub's install flow and
//! OAuth; automation passes its own), and is accepted only when GitHub lists the installation
//! among those that person can access (`GET /user/installations`) and GitHub announced it (a
//! signed `installation` webhook, or `GET /app/installations/{id}` as the App when the App is
//! configured here). GitHub is called before the change begins: no transaction waits on it.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use engine::github::CallError;
use engine::store::installations::{self, Announced};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::Role;
use super::error::ApiError;
use super::extract::{Json, Path};
use super::tenant::OrgScope;

#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Installation {
    /// GitHub's installation id.
    pub installation_id: i64,
    /// The GitHub account (organization or user) the App is installed on.
    pub account: String,
    /// The repositories it reaches (`owner/name`, lowercased), as GitHub last said.
    pub repositories: Vec<String>,
    pub suspended: bool,
    pub claimed_at: Option<DateTime<Utc>>,
    /// Who claimed it, as `kind:id`.
    pub claimed_by: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct InstallationList {
    pub items: Vec<Installation>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimInstallation {
    /// GitHub's installation id (the setup URL's `installation_id`).
    #[schema(minimum = 1)]
    pub installation_id: i64,
    /// A GitHub user access token of this App for a person who can access the installation:
    /// it is used once, to ask GitHub, and never stored. Up to 1,000 visible ASCII characters.
    #[schema(value_type = String, min_length = 1, max_length = 1000, pattern = "^[!-~]+$")]
    pub github_token: protocol::Secret,
}

/// The path of an installation's routes.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct InstallationPath {
    /// GitHub's installation id
    installation: i64,
}

/// The org's installations with their repositories, by id.
#[utoipa::path(get, path = "/orgs/{org}/github/installations", operation_id = "list_installations", tag = "repositories",
    params(OrgScope),
    responses((status = 200, body = InstallationList)))]
pub async fn list(State(state): State<AppState>, scope: OrgScope) -> Result<Json<InstallationList>, ApiError> {
    scope.require(Role::Viewer)?;
    let items = rows(&state, &scope, None).await?;
    Ok(Json(InstallationList { items }))
}

const INSTALLATIONS: &str = "SELECT i.installation_id, i.account_login AS account, i.suspended_at IS NOT NULL AS suspended, i.claimed_at, i.claimed_by, \
       coalesce((SELECT array_agg(r.full_name ORDER BY r.full_name) FROM github_installation_repositories r \
                 WHERE r.installation_id = i.installation_id), '{}') AS repositories \
     FROM github_installations i WHERE i.org_id = $1 AND i.deleted_at IS NULL AND ($2::bigint IS NULL OR i.installation_id = $2) \
     ORDER BY i.installation_id LIMIT 200";

async fn rows(state: &AppState, scope: &OrgScope, only: Option<i64>) -> Result<Vec<Installation>, ApiError> {
    Ok(sqlx::query_as(INSTALLATIONS).bind(scope.org).bind(only).fetch_all(&state.db).await?)
}

/// Claims an installation for the org (admin), with proof from GitHub that the token's person
/// can access it. Claiming one the org already has refreshes it.
#[utoipa::path(post, path = "/orgs/{org}/github/installations", operation_id = "claim_installation", tag = "repositories",
    params(OrgScope),
    request_body = ClaimInstallation,
    responses(
        (status = 201, body = Installation),
        (status = 403, description = "The token's person cannot access the installation on GitHub"),
        (status = 404, description = "GitHub never announced the installation"),
        (status = 409, description = "Another org has the installation"),
        (status = 422, description = "GitHub refused the token")))]
pub async fn claim(State(state): State<AppState>, scope: OrgScope, Json(body): Json<ClaimInstallation>) -> Result<Response, ApiError> {
    scope.require(Role::Admin)?;
    if body.installation_id <= 0 {
        return Err(ApiError::Unprocessable("installation_id must be a GitHub installation id".into()));
    }
    // Sent to GitHub as a header: visible ASCII only (GitHub's tokens are `gh?_` and base62).
    let token = body.github_token.expose();
    if token.is_empty() || token.len() > 1_000 || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::Unprocessable("github_token must be a GitHub user access token".into()));
    }
    let id = body.installation_id;
    if !user_installations(&state, token).await?.contains(&id) {
        return Err(ApiError::Forbidden(format!(
            "the GitHub account of this token cannot access installation {id}: sign in on GitHub as someone who can, or install the App there"
        )));
    }
    // The App's own word, when it is configured here: it announces an installation whose
    // webhook has not arrived (or never will) and brings its list of repositories up to date.
    let announced = match state.shared.github.get() {
        Some(app) => Some(from_app(app, id).await?),
        None => None,
    };
    // On the owner's pool: an installation is the App's before it is any org's, so announcing
    // it writes a row no org may hold yet, and a claim must see that another org holds it (409,
    // to a person GitHub has already shown can reach it). The store filters by org itself.
    let mut ch = engine::store::Change::begin(&state.system, scope.caller.actor()).await?;
    if let Some(a) = &announced {
        installations::announce(&mut ch, a).await?;
    }
    match installations::claim(&mut ch, scope.org, id).await {
        Err(engine::store::StoreError::NotFound(_)) => {
            return Err(ApiError::NotFound(format!(
                "GitHub never announced installation {id} here: check that the App's webhook reaches this server, then try again"
            )));
        }
        other => other?,
    };
    ch.commit().await?;
    let installation = rows(&state, &scope, Some(id)).await?.pop().ok_or_else(|| ApiError::internal("a claimed installation is not listed"))?;
    Ok((StatusCode::CREATED, Json(installation)).into_response())
}

/// Gives an installation up (admin): its repositories are detached from the org's projects, and
/// another org may claim it with its own proof.
#[utoipa::path(delete, path = "/orgs/{org}/github/installations/{installation}", operation_id = "release_installation", tag = "repositories",
    params(OrgScope, InstallationPath),
    responses((status = 204, description = "Released"), (status = 404, description = "Not an installation of this org")))]
pub async fn release(State(state): State<AppState>, scope: OrgScope, Path(p): Path<InstallationPath>) -> Result<StatusCode, ApiError> {
    scope.require(Role::Admin)?;
    let mut ch = scope.change(&state).await?;
    installations::release(&mut ch, scope.org, p.installation).await?;
    ch.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}

/// What the App's API says of the installation: its account and repositories.
pub(super) async fn from_app(app: &engine::github::GithubApp, id: i64) -> Result<Announced, ApiError> {
    let about = app.installation(id).await.map_err(|e| github_error(&e, id))?;
    let text = |pointer: &str| about.pointer(pointer).and_then(Value::as_str).map(str::to_owned);
    let repositories = app.installation_repositories(id).await.map_err(|e| github_error(&e, id))?;
    Ok(Announced {
        id,
        account: text("/account/login").unwrap_or_default(),
        account_type: text("/account/type"),
        repository_selection: text("/repository_selection"),
        repositories: Some(repositories),
    })
}

fn github_error(e: &CallError, id: i64) -> ApiError {
    match e {
        CallError::Client { status: 404, .. } => ApiError::NotFound(format!("GitHub knows no installation {id} of this App")),
        CallError::Client { status, message } => ApiError::Unprocessable(format!("GitHub refused to describe installation {id}: {status} {message}")),
        CallError::RateLimited(wait) => ApiError::Unavailable(format!("GitHub rate-limits the App; try again in {} s", wait.as_secs().max(1))),
        CallError::Unavailable(why) => ApiError::Unavailable(format!("GitHub is unreachable: {why}")),
        CallError::Config(why) => ApiError::internal(why),
    }
}

/// The installations of this App that the token's person can access, from
/// `GET /user/installations` (paged, 100 a page).
async fn user_installations(state: &AppState, token: &str) -> Result<Vec<i64>, ApiError> {
    // A person reaches a few installations; this bounds a token that reaches thousands.
    const PAGES: u32 = 10;
    let base = state.github_user_api();
    let mut ids = Vec::new();
    for page in 1..=PAGES {
        let answer = state
            .shared
            .http
            .get(format!("{base}/user/installations?per_page=100&page={page}"))
            .bearer_auth(token)
            .header(axum::http::header::ACCEPT, "application/vnd.github+json")
            .header("X-GitHub-Api-Version", "2022-11-28")
            .send()
            .await
            .map_err(|e| ApiError::Unavailable(format!("GitHub is unreachable: {}", e.without_url())))?;
        let status = answer.status();
        if status == reqwest::StatusCode::UNAUTHORIZED {
            return Err(ApiError::Unprocessable("GitHub refused the token (401): it is not a valid user access token".into()));
        }
        if !status.is_success() {
            return Err(ApiError::Unprocessable(format!(
                "GitHub refused to list the token's installations ({status}): use a user access token of this GitHub App"
            )));
        }
        let body: Value = answer.json().await.map_err(|_| ApiError::Unavailable("GitHub's answer to /user/installations is not JSON".into()))?;
        let list = body.get("installations").and_then(Value::as_array).cloned().unwrap_or_default();
        ids.extend(list.iter().filter_map(|i| i.get("id").and_then(Value::as_i64)));
        let total = body.get("total_count").and_then(Value::as_u64).unwrap_or(0);
        if list.len() < 100 || ids.len() as u64 >= total {
            break;
        }
    }
    Ok(ids)
}
