//! Runs of a project. This module holds what a run is as the API shows it (`Run`, `Step`,
//! `RunDetail`) and the lookups every handler shares: the run a path names, proven in this
//! project (`ProjectRun`), a run read with its substates (`load`), and a change retried when
//! the database picked it as a deadlock victim (`retry_busy`). The handlers: `read` (list, get, why), `act` (submit,
//! cancel, retry, rerun), `answers` (approve, reject an approval) and `history` (the run's
//! events and a step's log lines).

pub mod act;
pub mod answers;
pub mod history;
pub mod read;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use chrono::{DateTime, Utc};
use engine::ids::{OrgId, ProjectId, RunId, StepId};
use engine::substate;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgConnection, Postgres, QueryBuilder};
use utoipa::{IntoParams, ToSchema};

use super::error::ApiError;
use super::extract::PathId;
use super::tenant::ProjectScope;
use super::{AppState, page};

/// A run, as lists and the run page show it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Run {
    /// `run-<base32>`.
    #[schema(value_type = String)]
    pub id: RunId,
    /// The full name, `<org>:<project>:run-<base32>`.
    pub name: String,
    pub workflow: String,
    pub version: i32,
    /// `running`, `completed`, `failed` or `cancelled`.
    pub status: String,
    /// While running: `queued`, `executing`, `waiting_for_agent`, `unroutable`, `sleeping`,
    /// `awaiting_signal`, `awaiting_child`, `awaiting_lease` or `held`.
    pub substate: Option<String>,
    /// The console's words for the substate ("waiting for approval"), or the status.
    pub words: String,
    /// Why the run ended, as a short machine string (`rejected at review: too big`).
    pub reason: Option<String>,
    pub input: Value,
    pub dry_run: bool,
    /// The item's key (`["github","owner/name",12]`), when the run is about one.
    pub item: Option<String>,
    /// The run this one reruns or retries.
    #[schema(value_type = Option<String>)]
    pub source_run: Option<RunId>,
    /// The nodes a rerun started again from, comma-separated.
    pub source_from: Option<String>,
    #[schema(value_type = Option<String>)]
    pub parent_run: Option<RunId>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    /// When an operator marked this failed run handled (`…/resolve`).
    pub resolved_at: Option<DateTime<Utc>>,
    /// The run's OpenTelemetry trace (32 hex digits): the webhook delivery or the request that
    /// created it is the root span, and each step a span in it. Absent when the server
    /// exports no traces.
    pub trace_id: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Step {
    #[sqlx(rename = "step_id")]
    #[schema(value_type = String)]
    pub id: StepId,
    pub node: String,
    pub kind: String,
    pub visit: i32,
    pub attempt: i32,
    /// `pending`, `leased`, `running`, `waiting`, `succeeded`, `failed` or `cancelled`.
    pub state: String,
    pub reason: Option<String>,
    pub exit_code: Option<i32>,
    pub output: Option<Value>,
    pub timed_out: bool,
    /// Reused from the source run by a rerun from a node; never executed in this run.
    pub reused: bool,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    /// A crew step's session figures, as its host reported them; absent for other steps and
    /// before the host started it.
    #[sqlx(skip)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionFigures>,
}

/// A crew session's figures. Claude Code reports its cost only at the end and Codex never, so
/// while a session runs its spend is the host's estimate from each message's token counts and
/// a price table; the harness's reported cost replaces it when it comes.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct SessionFigures {
    pub harness: Option<String>,
    pub model: Option<String>,
    pub input_tokens: i64,
    pub output_tokens: i64,
    /// The output tokens are a lower bound: no result line counted them (the session runs,
    /// or was killed before its harness printed one).
    pub output_tokens_lower_bound: bool,
    /// The cost the harness reported; null until it reports one (and for a killed session).
    pub cost_usd: Option<f64>,
    /// The host's estimate from the session's token counts and its price table.
    pub estimated_cost_usd: Option<f64>,
    /// `price_table`, or `unknown_model` when a model was priced at the table's dearest row.
    pub estimate_basis: Option<String>,
    /// What budgets count for this session: the larger of the estimate and the reported cost,
    /// so the reported cost once the harness's last result line came.
    pub spent_usd: f64,
    /// Whether `spent_usd` is (partly) an estimate: no reported cost yet, or messages after the
    /// last one the harness reported.
    pub cost_is_estimate: bool,
    pub turns: i32,
    pub tool_calls: i32,
}

#[derive(sqlx::FromRow)]
struct SessionRow {
    step_id: StepId,
    #[sqlx(flatten)]
    figures: SessionFigures,
}

/// The figures of a run's crew sessions ($1 run, $2 org).
pub(crate) const SESSION_FIGURES_SQL: &str = "SELECT step_id, harness, model, input_tokens, output_tokens, output_tokens_lower_bound, \
            cost_usd::float8 AS cost_usd, estimated_cost_usd::float8 AS estimated_cost_usd, estimate_basis, \
            coalesce(spent_usd, cost_usd, 0)::float8 AS spent_usd, \
            coalesce(coalesce(spent_usd, cost_usd, 0) > cost_usd, estimated_cost_usd IS NOT NULL) AS cost_is_estimate, \
            turns, tool_calls \
     FROM step_sessions WHERE run_id = $1 AND org_id = $2";

/// An approval waiting for a person.
#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct OpenApproval {
    pub node: String,
    #[sqlx(rename = "step_id")]
    #[schema(value_type = String)]
    pub step: StepId,
    pub prompt: String,
    /// The form: field name → `{type, required, options, default, description}`.
    pub fields: Value,
    pub deadline: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: Run,
    /// Every step, in the order they started.
    pub steps: Vec<Step>,
    pub approvals: Vec<OpenApproval>,
}

page::list!(RunList of Run);

/// The path of a run's routes, as documented; handlers read the id with `PathId`.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct RunPath {
    /// Run id, `run-…`
    pub run: String,
}

/// The path of a step's routes, as documented; handlers read the ids with `PathId`.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct StepPath {
    /// Run id, `run-…`
    pub run: String,
    /// Step id, `step-…`
    pub step: String,
}

/// The path of an approval's routes.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ApprovalPath {
    /// Run id, `run-…`
    pub run: String,
    /// The approval's node
    pub node: String,
}

#[derive(sqlx::FromRow)]
struct RunRow {
    run_id: RunId,
    workflow: String,
    workflow_version: i32,
    status: String,
    reason: Option<String>,
    input: Value,
    dry_run: bool,
    item: Option<String>,
    source_run_id: Option<RunId>,
    source_from_node: Option<String>,
    parent_run_id: Option<RunId>,
    created_by: String,
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    ended_at: Option<DateTime<Utc>>,
    resolved_at: Option<DateTime<Utc>>,
    trace_id: Option<String>,
}

/// `SELECT … WHERE r.org_id = <org> AND r.project_id = <project>`, to which filters are added.
fn select_runs(org: OrgId, project: ProjectId) -> QueryBuilder<'static, Postgres> {
    let mut qb = QueryBuilder::new(
        "SELECT r.run_id, w.name AS workflow, r.workflow_version, r.status, r.reason, r.input, \
                r.dry_run, i.key AS item, r.source_run_id, r.source_from_node, r.parent_run_id, r.created_by, \
                r.created_at, r.started_at, r.ended_at, r.resolved_at, r.trace_id \
         FROM runs r JOIN workflows w ON w.workflow_id = r.workflow_id LEFT JOIN items i ON i.item_id = r.item_id \
         WHERE r.org_id = ",
    );
    qb.push_bind(org).push(" AND r.project_id = ").push_bind(project);
    qb
}

impl Run {
    /// The run of a row; its substate is filled in by `with_substates` (or `fresh`).
    fn from_row(scope: &ProjectScope, r: RunRow) -> Run {
        Run {
            id: r.run_id,
            name: format!("{}:{}:{}", scope.org.slug, scope.slug, r.run_id),
            workflow: r.workflow,
            version: r.workflow_version,
            words: r.status.clone(),
            status: r.status,
            substate: None,
            reason: r.reason,
            input: r.input,
            dry_run: r.dry_run,
            item: r.item,
            source_run: r.source_run_id,
            source_from: r.source_from_node,
            parent_run: r.parent_run_id,
            created_by: r.created_by,
            created_at: r.created_at,
            started_at: r.started_at,
            ended_at: r.ended_at,
            resolved_at: r.resolved_at,
            trace_id: r.trace_id,
        }
    }
}

async fn load(conn: &mut PgConnection, scope: &ProjectScope, run: RunId) -> Result<Run, ApiError> {
    let mut qb = select_runs(scope.org.org, scope.project);
    qb.push(" AND r.run_id = ").push_bind(run);
    let row: Option<RunRow> = qb.build_query_as().fetch_optional(conn).await?;
    row.map(|r| Run::from_row(scope, r)).ok_or_else(run_not_found)
}

const AWAITS_START: &str = "SELECT needs_approval AND NOT dry_run FROM runs WHERE org_id = $1 AND run_id = $2";

/// A run read inside the change that just made or ended it: a new run has started nothing
/// yet, so it is queued, or waits for its `$start` approval when its workflow says
/// `approval: required` (`substate::start_approval`); an ended one has no substate.
async fn load_fresh(conn: &mut PgConnection, scope: &ProjectScope, id: RunId) -> Result<Run, ApiError> {
    let mut run = load(conn, scope, id).await?;
    if run.status == "running" {
        let awaits_start: bool = sqlx::query_scalar(AWAITS_START).bind(scope.org.org).bind(id).fetch_one(&mut *conn).await?;
        let substate = if awaits_start { substate::start_approval() } else { substate::Substate::Queued { held_by: None, ahead: None } };
        run.substate = Some(substate.name().to_owned());
        run.words = substate.words();
    }
    Ok(run)
}

/// Fills in each running run's substate and words (`engine::substate`, a few queries for the
/// whole list).
async fn with_substates(state: &AppState, scope: &ProjectScope, runs: &mut [Run]) -> Result<(), ApiError> {
    let running: Vec<RunId> = runs.iter().filter(|r| r.status == "running").map(|r| r.id).collect();
    if running.is_empty() {
        return Ok(());
    }
    let whys = substate::whys(&state.db, scope.org.org, &running).await?;
    for why in whys {
        if let Some(run) = runs.iter_mut().find(|r| r.id == why.run) {
            run.substate = why.substate.as_ref().map(|s| s.name().to_owned());
            run.words = why.words;
        }
    }
    Ok(())
}

fn run_not_found() -> ApiError {
    ApiError::NotFound("run not found".into())
}

const RUN_IN_PROJECT: &str = "SELECT 1 FROM runs WHERE run_id = $1 AND org_id = $2 AND project_id = $3";

/// The run a route's `{run}` names, proven to be of the project its path names (one probe by
/// the `runs` key) before the handler runs: the store's writes check only the org. Text that
/// is no run id, and another project's or org's run, answer 404.
pub struct ProjectRun {
    pub scope: ProjectScope,
    pub run: RunId,
}

impl FromRequestParts<AppState> for ProjectRun {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let scope = ProjectScope::from_request_parts(parts, state).await?;
        let PathId(run) = PathId::<RunId>::from_request_parts(parts, state).await?;
        let found: Option<i32> = sqlx::query_scalar(RUN_IN_PROJECT).bind(run).bind(scope.org.org).bind(scope.project).fetch_optional(&state.db).await?;
        found.ok_or_else(run_not_found)?;
        Ok(ProjectRun { scope, run })
    }
}

/// Runs a change again (three tries in all) when the database rolled it back as a deadlock
/// victim or a serialization failure: nothing of it was written. Ending a run deletes its
/// wakes while an engine may hold one of them and wait for the run, so a cancel or an answer
/// racing an engine's claim can be that victim.
async fn retry_busy<T, F, Fut>(mut attempt: F) -> Result<T, ApiError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ApiError>>,
{
    let mut tries = 1;
    loop {
        match attempt().await {
            Err(ApiError::Busy) if tries < 3 => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(10 * tries)).await;
            }
            other => return other,
        }
    }
}
