//! Budgets and spend: the org's and each project's limits per UTC day or month, with what was
//! spent in the current period, and spend per project and day. A reached limit holds new runs;
//! a hard one also stops crew steps (`budget_hard_stop`). Raising or removing a limit releases
//! the runs it held. Writes go through `engine::store::budgets`, audited as the caller.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{Datelike as _, Duration, NaiveDate, Utc};
use engine::ids::ProjectId;
use engine::store::budgets::{self, Period};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::Role;
use super::error::ApiError;
use super::extract::{Json, PathId, PathParam, Query, a_usable_year};
use super::tenant::{OrgScope, ProjectScope};

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BudgetList {
    pub items: Vec<budgets::BudgetView>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetBudget {
    /// Dollars per period, 0 to 99,999,999.99.
    #[schema(minimum = 0, maximum = 99_999_999.99)]
    pub usd_limit: f64,
    /// Hard (the default): crew steps stop too. Soft: only new runs are held.
    #[serde(default = "yes")]
    pub hard: bool,
}

fn yes() -> bool {
    true
}

/// The path of a budget's routes, as documented; handlers read it with `PathId<Period>`.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct PeriodPath {
    /// `day` or `month`
    pub period: String,
}

impl PathParam for Period {
    const PARAM: &'static str = "period";
    const NOT_FOUND: &'static str = "a budget period is `day` or `month`";
    fn parse(text: &str) -> Option<Self> {
        Period::parse(text)
    }
}

/// One project's spend on one UTC day.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SpendDay {
    pub project: String,
    pub day: NaiveDate,
    pub usd: f64,
    pub tokens: i64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SpendList {
    pub items: Vec<SpendDay>,
    /// The sum of `usd` over the items.
    pub total_usd: f64,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SpendQuery {
    /// The first day (UTC, `YYYY-MM-DD`); 30 days before `to` by default. After `to`, the
    /// list is empty.
    pub from: Option<NaiveDate>,
    /// The last day (UTC); today by default.
    pub to: Option<NaiveDate>,
    /// A project's slug, to see only its spend.
    pub project: Option<String>,
}

/// Slugs of the org's projects, to name them in answers.
async fn slugs(state: &AppState, org: engine::ids::OrgId) -> Result<std::collections::HashMap<ProjectId, String>, ApiError> {
    let rows: Vec<(ProjectId, String)> = sqlx::query_as("SELECT project_id, slug FROM projects WHERE org_id = $1").bind(org).fetch_all(&state.db).await?;
    Ok(rows.into_iter().collect())
}

async fn list_of(state: &AppState, scope: &OrgScope, project: Option<ProjectId>) -> Result<BudgetList, ApiError> {
    let mut conn = state.db.begin().await?;
    let rows = budgets::list(&mut conn, scope.org, project).await?;
    drop(conn);
    let items = rows
        .into_iter()
        // A token limited to one project sees the org's limits and its project's only.
        .filter(|b| b.project_id.is_none() || scope.caller.project.is_none_or(|p| Some(p) == b.project_id))
        .collect();
    Ok(BudgetList { items })
}

/// The org's limits and every project's, with their spend (viewer).
#[utoipa::path(get, path = "/orgs/{org}/budgets", operation_id = "list_budgets", tag = "budgets",
    params(OrgScope),
    responses((status = 200, body = BudgetList)))]
pub async fn list(State(state): State<AppState>, scope: OrgScope) -> Result<Json<BudgetList>, ApiError> {
    scope.require(Role::Viewer)?;
    Ok(Json(list_of(&state, &scope, None).await?))
}

/// Sets the org's limit for a period (`day` or `month`, UTC) (admin).
#[utoipa::path(put, path = "/orgs/{org}/budgets/{period}", operation_id = "set_org_budget", tag = "budgets",
    params(OrgScope, PeriodPath),
    request_body = SetBudget,
    responses((status = 200, body = BudgetList)))]
pub async fn set_org(
    State(state): State<AppState>, scope: OrgScope, PathId(period): PathId<Period>, Json(body): Json<SetBudget>,
) -> Result<Json<BudgetList>, ApiError> {
    set(&state, &scope, None, period, &body).await
}

/// Removes the org's limit for a period (admin); the runs it held are released.
#[utoipa::path(delete, path = "/orgs/{org}/budgets/{period}", operation_id = "remove_org_budget", tag = "budgets",
    params(OrgScope, PeriodPath),
    responses((status = 204, description = "Removed")))]
pub async fn remove_org(State(state): State<AppState>, scope: OrgScope, PathId(period): PathId<Period>) -> Result<StatusCode, ApiError> {
    remove(&state, &scope, None, period).await
}

/// The project's limits and the org's, with their spend (viewer).
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/budgets", operation_id = "list_project_budgets", tag = "budgets",
    params(ProjectScope),
    responses((status = 200, body = BudgetList)))]
pub async fn list_project(State(state): State<AppState>, scope: ProjectScope) -> Result<Json<BudgetList>, ApiError> {
    scope.require(Role::Viewer)?;
    Ok(Json(list_of(&state, &scope.org, Some(scope.project)).await?))
}

/// Sets the project's limit for a period (admin).
#[utoipa::path(put, path = "/orgs/{org}/projects/{project}/budgets/{period}", operation_id = "set_project_budget", tag = "budgets",
    params(ProjectScope, PeriodPath),
    request_body = SetBudget,
    responses((status = 200, body = BudgetList)))]
pub async fn set_project(
    State(state): State<AppState>, scope: ProjectScope, PathId(period): PathId<Period>, Json(body): Json<SetBudget>,
) -> Result<Json<BudgetList>, ApiError> {
    set(&state, &scope.org, Some(scope.project), period, &body).await
}

/// Removes the project's limit for a period (admin); the runs it held are released.
#[utoipa::path(delete, path = "/orgs/{org}/projects/{project}/budgets/{period}", operation_id = "remove_project_budget", tag = "budgets",
    params(ProjectScope, PeriodPath),
    responses((status = 204, description = "Removed")))]
pub async fn remove_project(State(state): State<AppState>, scope: ProjectScope, PathId(period): PathId<Period>) -> Result<StatusCode, ApiError> {
    remove(&state, &scope.org, Some(scope.project), period).await
}

/// Sets a limit of the org, or of one of its projects (admin), and answers the limits then.
async fn set(state: &AppState, scope: &OrgScope, project: Option<ProjectId>, period: Period, body: &SetBudget) -> Result<Json<BudgetList>, ApiError> {
    scope.require(Role::Admin)?;
    let mut ch = scope.change(state).await?;
    budgets::set(&mut ch, scope.org, project, period, body.usd_limit, body.hard).await?;
    ch.commit().await?;
    Ok(Json(list_of(state, scope, project).await?))
}

/// Removes a limit of the org, or of one of its projects (admin).
async fn remove(state: &AppState, scope: &OrgScope, project: Option<ProjectId>, period: Period) -> Result<StatusCode, ApiError> {
    scope.require(Role::Admin)?;
    let mut ch = scope.change(state).await?;
    budgets::remove(&mut ch, scope.org, project, period).await?;
    ch.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Spend per project and UTC day, newest first, from sessions' cost: the host's estimate while a
/// session runs, the harness's reported cost once it comes (viewer). The window from `from`
/// to `to` may be of any length: the answer holds at most 5,000 days of projects, newest first.
#[utoipa::path(get, path = "/orgs/{org}/spend", operation_id = "list_spend", tag = "budgets",
    params(OrgScope, SpendQuery),
    responses((status = 200, body = SpendList)))]
pub async fn spend(State(state): State<AppState>, scope: OrgScope, Query(q): Query<SpendQuery>) -> Result<Json<SpendList>, ApiError> {
    scope.require(Role::Viewer)?;
    for (field, date) in [("from", q.from), ("to", q.to)] {
        date.map_or(Ok(()), |d| a_usable_year(field, d.year()))?;
    }
    let to = q.to.unwrap_or_else(|| Utc::now().date_naive());
    let from = q.from.unwrap_or(to - Duration::days(30));
    let names = slugs(&state, scope.org).await?;
    let project = match &q.project {
        Some(slug) => Some(
            names
                .iter()
                .find(|(_, s)| *s == slug)
                .map(|(id, _)| *id)
                .ok_or_else(|| ApiError::NotFound(format!("project `{}` not found", engine::store::cap(slug))))?,
        ),
        None => None,
    };
    // A token limited to one project sees only its spend.
    let project = match (scope.caller.project, project) {
        (Some(only), Some(asked)) if only != asked => return Err(ApiError::NotFound("project not found".into())),
        (Some(only), _) => Some(only),
        (None, asked) => asked,
    };
    let mut conn = state.db.begin().await?;
    let rows = budgets::spend(&mut conn, scope.org, project, from, to).await?;
    let total_usd = rows.iter().map(|r| r.usd).sum();
    let items = rows
        .into_iter()
        .map(|r| SpendDay { project: names.get(&r.project_id).cloned().unwrap_or_default(), day: r.day, usd: r.usd, tokens: r.tokens })
        .collect();
    Ok(Json(SpendList { items, total_usd }))
}
