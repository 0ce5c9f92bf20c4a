//! Runs of a project: submit (with `Idempotency-Key`), list with filters and a keyset cursor,
//! get with steps and open approvals, cancel, retry (rerun from the failed nodes), rerun (from
//! the start or `?from=<node>`), `why` (what holds it, from `engine::substate`), the run's
//! events and a step's log lines paged by sequence number, and the answers to approvals:
//! approve with the form's fields, or reject with an optional reason.

use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::Response;
use chrono::{DateTime, Utc};
use engine::ids::{OrgId, ProjectId, RunId, StepId, WorkflowId};
use engine::store::runs::{self as store, NewRun};
use engine::store::{approvals, cap, operator, Change};
use engine::substate;
use engine::trace::TraceParent;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sqlx::{PgConnection, Postgres, QueryBuilder};
use utoipa::{IntoParams, ToSchema};

use super::auth::Role;
use super::error::{ApiError, Problem};
use super::events::RunEvent;
use super::extract::{at_most, IdempotencyKey, Json, JsonOrEmpty, Path, Query};
use super::tenant::ProjectScope;
use super::{idempotency, page, AppState};

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

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RunList {
    pub items: Vec<Run>,
    pub next_cursor: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRun {
    /// The workflow's name.
    pub workflow: String,
    /// A JSON object, available to templates and expressions as `run.input`.
    #[schema(value_type = Option<Object>)]
    pub input: Option<Map<String, Value>>,
    /// A version number; the latest by default.
    pub version: Option<i32>,
    /// Stub effects and answer approvals at once; deleted a day after it ends.
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelRun {
    /// Why, at most 200 characters.
    #[schema(max_length = 200)]
    pub reason: Option<String>,
}

/// Edit-and-retry: the retry runs `node` (a crew node) with a new prompt, model or harness,
/// kept for every later attempt of that node in the new run (and the retries of it).
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryRun {
    /// The crew node to edit; the retry also starts again from it if it did not fail.
    pub node: String,
    /// The node's prompt template instead of the workflow's.
    pub prompt: Option<String>,
    pub model: Option<String>,
    /// `claude-code`, `codex` or `command`.
    pub harness: Option<String>,
}

#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RejectApproval {
    /// Why, at most 200 characters.
    #[schema(max_length = 200)]
    pub reason: Option<String>,
}

/// An answered approval.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Decision {
    #[schema(value_type = String)]
    pub run: RunId,
    pub node: String,
    #[schema(value_type = String)]
    pub step: StepId,
    /// `approved` or `rejected`.
    pub decision: String,
    /// The checked answer (the node's output), or `{decision, reason}` for a rejection.
    pub answer: Value,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// `running`, `completed`, `failed` or `cancelled`.
    #[param(pattern = "^(running|completed|failed|cancelled)$")]
    pub status: Option<String>,
    /// A running run's substate: `queued`, `executing`, `waiting_for_agent`, `unroutable`,
    /// `sleeping`, `awaiting_signal`, `awaiting_child`, `awaiting_lease` or `held`.
    #[param(pattern = "^(queued|executing|waiting_for_agent|unroutable|sleeping|awaiting_signal|awaiting_child|awaiting_lease|held)$")]
    pub substate: Option<String>,
    /// A workflow's name.
    pub workflow: Option<String>,
    /// An item's key, e.g. `["github","owner/name",12]`.
    pub item: Option<String>,
    /// Dry runs are listed apart: `true` lists only them, `false` (the default) none of them.
    pub dry_run: Option<bool>,
    /// Page size, 1 to 200 (50 by default).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RerunQuery {
    /// Start again from this node, reusing the outputs recorded before it.
    pub from: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Events after this sequence number (0 by default: from the first).
    pub after: Option<i64>,
    /// Page size, 1 to 200 (50 by default).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RunEventList {
    pub items: Vec<RunEvent>,
    /// Pass as `after` for the next page; absent on the last page.
    pub next_after: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub struct RunPath {
    run: String,
}

#[derive(Debug, Deserialize)]
pub struct StepPath {
    run: String,
    step: String,
}

#[derive(Debug, Deserialize)]
pub struct ApprovalPath {
    run: String,
    node: String,
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

const SUBSTATES: [&str; 9] = ["queued", "executing", "waiting_for_agent", "unroutable", "sleeping", "awaiting_signal", "awaiting_child", "awaiting_lease", "held"];

/// `SELECT … WHERE r.org_id = <org> AND r.project_id = <project>`, to which filters are added.
fn select_runs(org: OrgId, project: ProjectId) -> QueryBuilder<'static, Postgres> {
    let mut qb = QueryBuilder::new(
        "SELECT r.run_id, w.name AS workflow, r.workflow_version, r.status, r.reason, r.input, \
                r.dry_run, i.key AS item, r.source_run_id, r.source_from_node, r.parent_run_id, r.created_by, \
                r.created_at, r.started_at, r.ended_at, r.resolved_at, r.trace_id \
         FROM runs r JOIN workflows w ON w.workflow_id = r.workflow_id LEFT JOIN items i ON i.item_id = r.item_id \
         WHERE r.org_id = "
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

/// A run read inside the change that just made or ended it: a new run has started nothing
/// yet, so it is queued, or waits for its `$start` approval when its workflow says
/// `approval: required` (`substate::start_approval`); an ended one has no substate.
async fn load_fresh(conn: &mut PgConnection, scope: &ProjectScope, id: RunId) -> Result<Run, ApiError> {
    let mut run = load(conn, scope, id).await?;
    if run.status == "running" {
        let awaits_start: bool = sqlx::query_scalar("SELECT needs_approval AND NOT dry_run FROM runs WHERE org_id = $1 AND run_id = $2")
            .bind(scope.org.org)
            .bind(id)
            .fetch_one(&mut *conn)
            .await?;
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

/// A run id from the path; text that cannot be one names no run.
fn run_id(text: &str) -> Result<RunId, ApiError> {
    text.parse().map_err(|_| run_not_found())
}

/// Checks, inside a change, that the run is in this project (the store checks the org).
async fn in_project(ch: &mut Change, scope: &ProjectScope, run: RunId) -> Result<(), ApiError> {
    let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM runs WHERE run_id = $1 AND org_id = $2 AND project_id = $3")
        .bind(run)
        .bind(scope.org.org)
        .bind(scope.project)
        .fetch_optional(ch.conn())
        .await?;
    found.map(|_| ()).ok_or_else(run_not_found)
}

/// Rows examined at most for one page filtered by substate (which is derived, not stored):
/// past this, the page ends short with a cursor, and the client reads on.
const SUBSTATE_SCAN: i64 = 2_000;

/// The answer recorded for an approval step, read inside the change that recorded it.
async fn recorded_answer(ch: &mut Change, scope: &ProjectScope, step: StepId) -> Result<Value, ApiError> {
    let answer: Option<Value> =
        sqlx::query_scalar("SELECT answer FROM approvals WHERE step_id = $1 AND org_id = $2").bind(step).bind(scope.org.org).fetch_one(ch.conn()).await?;
    Ok(answer.unwrap_or(Value::Null))
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

/// The project's runs, newest first. Dry runs are listed apart (`dry_run=true`).
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/runs", operation_id = "list_runs", tag = "runs",
    params(("org" = String, Path, description = "Org slug"), ("project" = String, Path, description = "Project slug"), ListQuery),
    responses((status = 200, body = RunList)))]
pub async fn list(State(state): State<AppState>, scope: ProjectScope, Query(q): Query<ListQuery>) -> Result<Json<RunList>, ApiError> {
    scope.require(Role::Viewer)?;
    let (limit, mut after) = page::start::<(i64, RunId)>(q.limit, q.cursor.as_deref())?;
    if let Some(status) = &q.status {
        if !["running", "completed", "failed", "cancelled"].contains(&status.as_str()) {
            return Err(ApiError::BadRequest("status must be running, completed, failed or cancelled".into()));
        }
    }
    if let Some(substate) = &q.substate {
        if !SUBSTATES.contains(&substate.as_str()) {
            return Err(ApiError::BadRequest(format!("substate must be one of {}", SUBSTATES.join(", "))));
        }
    }
    let mut items: Vec<Run> = Vec::new();
    let mut scanned = 0;
    loop {
        let mut qb = select_runs(scope.org.org, scope.project);
        // A substate belongs to running runs only.
        match (&q.status, &q.substate) {
            (_, Some(_)) => qb.push(" AND r.status = 'running'"),
            (Some(status), None) => qb.push(" AND r.status = ").push_bind(status.clone()),
            (None, None) => &mut qb,
        };
        if let Some(workflow) = &q.workflow {
            qb.push(" AND w.name = ").push_bind(workflow.clone());
        }
        if let Some(item) = &q.item {
            qb.push(" AND i.key = ").push_bind(item.clone());
        }
        qb.push(" AND r.dry_run = ").push_bind(q.dry_run.unwrap_or(false));
        if let Some((micros, run)) = after {
            let at = DateTime::from_timestamp_micros(micros).ok_or_else(|| ApiError::BadRequest("invalid cursor".into()))?;
            qb.push(" AND (r.created_at, r.run_id) < (").push_bind(at).push(", ").push_bind(run).push(")");
        }
        let want = limit + 1 - items.len() as i64;
        let batch = if q.substate.is_some() { want.max(50) } else { want };
        qb.push(" ORDER BY r.created_at DESC, r.run_id DESC LIMIT ").push_bind(batch);
        let rows: Vec<RunRow> = qb.build_query_as().fetch_all(&state.db).await?;
        let exhausted = (rows.len() as i64) < batch;
        scanned += rows.len() as i64;
        let mut runs: Vec<Run> = rows.into_iter().map(|r| Run::from_row(&scope, r)).collect();
        with_substates(&state, &scope, &mut runs).await?;
        for run in runs {
            after = Some((run.created_at.timestamp_micros(), run.id));
            if q.substate.is_none() || run.substate == q.substate {
                items.push(run);
                if items.len() as i64 > limit {
                    break;
                }
            }
        }
        if items.len() as i64 > limit || exhausted {
            break;
        }
        if scanned >= SUBSTATE_SCAN {
            // A short page: its cursor is the last run examined.
            let next_cursor = after.map(|k| page::encode(&k));
            return Ok(Json(RunList { items, next_cursor }));
        }
    }
    let (items, next_cursor) = page::finish(items, limit, |r| (r.created_at.timestamp_micros(), r.id));
    Ok(Json(RunList { items, next_cursor }))
}

/// Submits a run of a workflow (member). `approval: required` workflows park it at `$start`
/// until a person approves. Admission may hold it (`queued`, `awaiting_lease`, `sleeping`,
/// `held`: `why` says by what) or refuse it.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/runs", operation_id = "submit_run", tag = "runs",
    params(("org" = String, Path, description = "Org slug"), ("project" = String, Path, description = "Project slug"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retried submit safe; 1 to 255 visible ASCII characters", min_length = 1, max_length = 255, pattern = "^[!-~]+$")),
    request_body = SubmitRun,
    responses((status = 201, body = Run),
              (status = 409, description = "Refused by its concurrency group (policy `skip`, the group is full)", body = Problem, content_type = "application/problem+json"),
              (status = 429, description = "1,000 runs already wait for the org's cap on running runs", body = Problem, content_type = "application/problem+json")))]
pub async fn submit(State(state): State<AppState>, scope: ProjectScope, key: IdempotencyKey, method: Method, uri: Uri, Json(body): Json<SubmitRun>) -> Result<Response, ApiError> {
    scope.require(Role::Member)?;
    // The request's span is the root of the new run's trace (`engine::trace`).
    let span = tracing::info_span!(parent: None, "runs.submit", otel.name = "POST runs", otel.kind = "server", shopfloor.workflow = %cap(&body.workflow));
    let mut ch = scope.change(&state).await?;
    ch.set_trace(TraceParent::of_span(&span));
    if let Some(replay) = idempotency::claim(&mut ch, scope.org.org, &key, &idempotency::fingerprint(method.as_str(), &uri, &body)).await? {
        return Ok(replay);
    }
    let found: Option<(WorkflowId, i32)> =
        sqlx::query_as("SELECT workflow_id, latest_version FROM workflows WHERE org_id = $1 AND project_id = $2 AND name = $3")
            .bind(scope.org.org)
            .bind(scope.project)
            .bind(&body.workflow)
            .fetch_optional(ch.conn())
            .await?;
    let (workflow, latest) = found.ok_or_else(|| ApiError::Unprocessable(format!("no workflow `{}` in this project", cap(&body.workflow))))?;
    let version = body.version.unwrap_or(latest);
    let exists: Option<i32> = sqlx::query_scalar("SELECT version FROM workflow_versions WHERE org_id = $1 AND workflow_id = $2 AND version = $3")
        .bind(scope.org.org)
        .bind(workflow)
        .bind(version)
        .fetch_optional(ch.conn())
        .await?;
    if exists.is_none() {
        return Err(ApiError::Unprocessable(format!("workflow `{}` has no version {version}", cap(&body.workflow))));
    }
    let def = state.shared.catalog.get(ch.conn(), workflow, version).await?;
    let run = store::submit(
        &mut ch,
        NewRun {
            org: scope.org.org,
            project: scope.project,
            workflow,
            version,
            input: Value::Object(body.input.clone().unwrap_or_default()),
            item: None,
            trigger_event: None,
            parent: None,
            dry_run: body.dry_run,
            needs_approval: def.approval_required,
            source: None,
        },
    )
    .await?;
    let created = load_fresh(ch.conn(), &scope, run).await?;
    let response = idempotency::answer(&mut ch, scope.org.org, &key, StatusCode::CREATED, &created).await?;
    ch.commit().await?;
    Ok(response)
}

/// A run with its steps and the approvals it waits on.
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/runs/{run}", operation_id = "get_run", tag = "runs",
    params(("org" = String, Path, description = "Org slug"), ("project" = String, Path, description = "Project slug"), ("run" = String, Path, description = "Run id, `run-…`")),
    responses((status = 200, body = RunDetail)))]
pub async fn get(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<RunPath>) -> Result<Json<RunDetail>, ApiError> {
    scope.require(Role::Viewer)?;
    let id = run_id(&p.run)?;
    let mut conn = state.db.begin().await?;
    let mut run = load(&mut conn, &scope, id).await?;
    let mut steps: Vec<Step> = sqlx::query_as(
        "SELECT step_id, node, kind, visit, attempt, state, reason, exit_code, output, timed_out, reused_from IS NOT NULL AS reused, \
                created_at, started_at, ended_at FROM steps WHERE run_id = $1 AND org_id = $2 ORDER BY started_seq, created_at",
    )
    .bind(id)
    .bind(scope.org.org)
    .fetch_all(&mut *conn)
    .await?;
    let approvals: Vec<OpenApproval> = sqlx::query_as(
        "SELECT a.node, a.step_id, a.prompt, a.fields, a.deadline FROM approvals a JOIN steps s USING (step_id) \
         WHERE a.run_id = $1 AND a.org_id = $2 AND a.decision IS NULL AND s.state = 'waiting' ORDER BY s.started_seq",
    )
    .bind(id)
    .bind(scope.org.org)
    .fetch_all(&mut *conn)
    .await?;
    let sessions: Vec<SessionRow> = sqlx::query_as(SESSION_FIGURES_SQL).bind(id).bind(scope.org.org).fetch_all(&mut *conn).await?;
    drop(conn);
    for row in sessions {
        if let Some(step) = steps.iter_mut().find(|s| s.id == row.step_id) {
            step.session = Some(row.figures);
        }
    }
    with_substates(&state, &scope, std::slice::from_mut(&mut run)).await?;
    Ok(Json(RunDetail { run, steps, approvals }))
}

/// Cancels a running run and the children it waits for (member).
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/runs/{run}/cancel", operation_id = "cancel_run", tag = "runs",
    params(("org" = String, Path, description = "Org slug"), ("project" = String, Path, description = "Project slug"), ("run" = String, Path, description = "Run id, `run-…`")),
    request_body(content = Option<CancelRun>, description = "Optional reason"),
    responses((status = 200, body = Run), (status = 409, description = "The run already ended", body = Problem, content_type = "application/problem+json")))]
pub async fn cancel(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<RunPath>, JsonOrEmpty(body): JsonOrEmpty<CancelRun>) -> Result<Json<Run>, ApiError> {
    scope.require(Role::Member)?;
    let id = run_id(&p.run)?;
    let reason = at_most("reason", body.reason, 200)?;
    let reason = match reason.as_deref().map(str::trim).filter(|r| !r.is_empty()) {
        Some(why) => format!("cancelled: {why}"),
        None => "cancelled".to_owned(),
    };
    let (state, scope, reason) = (&state, &scope, &reason);
    let run = retry_busy(move || async move {
        let mut ch = scope.change(state).await?;
        in_project(&mut ch, scope, id).await?;
        store::cancel(&mut ch, scope.org.org, id, reason).await?;
        let run = load_fresh(ch.conn(), scope, id).await?;
        ch.commit().await?;
        Ok(run)
    })
    .await?;
    Ok(Json(run))
}

/// Submits a new run from a finished one: from `from` (or the start), reusing earlier outputs.
/// A retry keeps the run's edits (`edit` adds one: edit-and-retry).
#[expect(clippy::too_many_arguments, reason = "the retry and rerun handlers' one helper")]
async fn rerun_from(state: &AppState, scope: &ProjectScope, key: &IdempotencyKey, hash: &str, source: RunId, retry: bool, from: Option<String>, edit: Option<RetryRun>) -> Result<Response, ApiError> {
    // The request's span is the root of the new run's trace (`engine::trace`).
    let span = tracing::info_span!(parent: None, "runs.rerun", otel.name = if retry { "POST runs retry" } else { "POST runs rerun" }, otel.kind = "server", shopfloor.source_run = %source);
    let mut ch = scope.change(state).await?;
    ch.set_trace(TraceParent::of_span(&span));
    if let Some(replay) = idempotency::claim(&mut ch, scope.org.org, key, hash).await? {
        return Ok(replay);
    }
    in_project(&mut ch, scope, source).await?;
    let (workflow, version, status): (WorkflowId, i32, String) =
        sqlx::query_as("SELECT workflow_id, workflow_version, status FROM runs WHERE run_id = $1 AND org_id = $2")
            .bind(source)
            .bind(scope.org.org)
            .fetch_one(ch.conn())
            .await?;
    let mut nodes = if retry {
        match status.as_str() {
            "running" => return Err(ApiError::Conflict("the run is still running; cancel it first or wait for it to end".into())),
            "completed" => return Err(ApiError::Conflict("the run completed: nothing failed to retry (rerun it instead)".into())),
            _ => store::failed_nodes(&mut ch, scope.org.org, source).await?,
        }
    } else {
        from.into_iter().collect()
    };
    let def = state.shared.catalog.get(ch.conn(), workflow, version).await?;
    if let Some(e) = &edit {
        if def.node(&e.node).is_none() {
            return Err(ApiError::Unprocessable(format!("node `{}` is not in this run's workflow", cap(&e.node))));
        }
        if !nodes.contains(&e.node) {
            nodes.push(e.node.clone());
        }
    }
    let run = store::rerun(&mut ch, scope.org.org, source, &def, &nodes).await?;
    if retry {
        let org = scope.org.org;
        match &edit {
            Some(e) => {
                let change = operator::NodeOverride { prompt: e.prompt.clone(), model: e.model.clone(), harness: e.harness.clone() };
                operator::edit_retry(&mut ch, org, run, source, &def, &e.node, &change).await?;
            }
            None => operator::inherit_overrides(&mut ch, org, run, source).await?,
        }
    }
    let created = load_fresh(ch.conn(), scope, run).await?;
    let response = idempotency::answer(&mut ch, scope.org.org, key, StatusCode::CREATED, &created).await?;
    ch.commit().await?;
    Ok(response)
}

/// Retries a failed or cancelled run: a new run that starts again from the nodes that failed,
/// reusing the outputs before them (member). With a body, edit-and-retry: the new run runs
/// `node` with the prompt, model or harness given, at every attempt of that node (audited as
/// `run.edit_retry`, with a `run.edited` event). A retry keeps the edits of the run it retries.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/runs/{run}/retry", operation_id = "retry_run", tag = "runs",
    params(("org" = String, Path, description = "Org slug"), ("project" = String, Path, description = "Project slug"), ("run" = String, Path, description = "Run id, `run-…`"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retried request safe; 1 to 255 visible ASCII characters", min_length = 1, max_length = 255, pattern = "^[!-~]+$")),
    request_body(content = Option<RetryRun>, description = "Optional: a crew node to run with a new prompt, model or harness"),
    responses((status = 201, description = "The new run", body = Run), (status = 409, description = "Running, or completed", body = Problem, content_type = "application/problem+json"),
              (status = 422, description = "No such crew node, or an invalid prompt, model or harness", body = Problem, content_type = "application/problem+json")))]
pub async fn retry(State(state): State<AppState>, scope: ProjectScope, key: IdempotencyKey, method: Method, uri: Uri, Path(p): Path<RunPath>, JsonOrEmpty(body): JsonOrEmpty<Option<RetryRun>>) -> Result<Response, ApiError> {
    scope.require(Role::Member)?;
    let id = run_id(&p.run)?;
    let hash = match &body {
        None => idempotency::fingerprint(method.as_str(), &uri, &()),
        Some(edit) => idempotency::fingerprint(method.as_str(), &uri, edit),
    };
    rerun_from(&state, &scope, &key, &hash, id, true, None, body).await
}

/// Reruns a finished run with the same input, from the start or from `?from=<node>` (member).
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/runs/{run}/rerun", operation_id = "rerun_run", tag = "runs",
    params(("org" = String, Path, description = "Org slug"), ("project" = String, Path, description = "Project slug"), ("run" = String, Path, description = "Run id, `run-…`"), RerunQuery,
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retried request safe; 1 to 255 visible ASCII characters", min_length = 1, max_length = 255, pattern = "^[!-~]+$")),
    responses((status = 201, description = "The new run", body = Run), (status = 409, description = "Still running", body = Problem, content_type = "application/problem+json"),
              (status = 422, description = "No such node", body = Problem, content_type = "application/problem+json")))]
pub async fn rerun(State(state): State<AppState>, scope: ProjectScope, key: IdempotencyKey, method: Method, uri: Uri, Path(p): Path<RunPath>, Query(q): Query<RerunQuery>) -> Result<Response, ApiError> {
    scope.require(Role::Member)?;
    let id = run_id(&p.run)?;
    rerun_from(&state, &scope, &key, &idempotency::fingerprint(method.as_str(), &uri, &()), id, false, q.from, None).await
}

/// The run's events, by sequence number.
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/runs/{run}/events", operation_id = "list_run_events", tag = "events",
    params(("org" = String, Path, description = "Org slug"), ("project" = String, Path, description = "Project slug"), ("run" = String, Path, description = "Run id, `run-…`"), EventsQuery),
    responses((status = 200, body = RunEventList)))]
pub async fn events(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<RunPath>, Query(q): Query<EventsQuery>) -> Result<Json<RunEventList>, ApiError> {
    scope.require(Role::Viewer)?;
    let id = run_id(&p.run)?;
    let limit = page::limit(q.limit)?;
    let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM runs WHERE run_id = $1 AND org_id = $2 AND project_id = $3")
        .bind(id)
        .bind(scope.org.org)
        .bind(scope.project)
        .fetch_optional(&state.db)
        .await?;
    found.ok_or_else(run_not_found)?;
    let items: Vec<RunEvent> = sqlx::query_as(
        "SELECT run_id AS run, seq, kind, node, step_id AS step, at, attrs FROM run_events \
         WHERE run_id = $1 AND org_id = $2 AND seq > $3 ORDER BY seq LIMIT $4",
    )
    .bind(id)
    .bind(scope.org.org)
    .bind(q.after.unwrap_or(0))
    .bind(limit + 1)
    .fetch_all(&state.db)
    .await?;
    let (items, next_after) = page::finish_after(items, limit, |e| e.seq);
    Ok(Json(RunEventList { items, next_after }))
}

/// Approves the approval waiting at `{node}` with the form's fields (member). A missing
/// required field, a wrong type, or a key the form does not declare (such as `decision`) is
/// refused with 422 and the run keeps waiting. The run-level approval of `approval: required`
/// is the node `$start`.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/runs/{run}/approvals/{node}", operation_id = "approve", tag = "approvals",
    params(("org" = String, Path, description = "Org slug"), ("project" = String, Path, description = "Project slug"), ("run" = String, Path, description = "Run id, `run-…`"), ("node" = String, Path, description = "The approval's node")),
    request_body(content = Option<Object>, description = "The form's fields"),
    responses((status = 200, body = Decision), (status = 409, description = "No approval waits at that node", body = Problem, content_type = "application/problem+json")))]
pub async fn approve(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<ApprovalPath>, JsonOrEmpty(fields): JsonOrEmpty<Map<String, Value>>) -> Result<Json<Decision>, ApiError> {
    scope.require(Role::Member)?;
    let id = run_id(&p.run)?;
    let (state, scope, node, fields) = (&state, &scope, &p.node, &fields);
    let (step, answer) = retry_busy(move || async move {
        let mut ch = scope.change(state).await?;
        in_project(&mut ch, scope, id).await?;
        let step = approvals::approve(&mut ch, scope.org.org, id, node, fields).await?;
        let answer = recorded_answer(&mut ch, scope, step).await?;
        ch.commit().await?;
        Ok((step, answer))
    })
    .await?;
    Ok(Json(Decision { run: id, node: p.node, step, decision: "approved".into(), answer }))
}

/// Rejects the approval waiting at `{node}` (member): the run is cancelled with
/// `rejected at <node>: <reason>`.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/runs/{run}/approvals/{node}/reject", operation_id = "reject", tag = "approvals",
    params(("org" = String, Path, description = "Org slug"), ("project" = String, Path, description = "Project slug"), ("run" = String, Path, description = "Run id, `run-…`"), ("node" = String, Path, description = "The approval's node")),
    request_body(content = Option<RejectApproval>, description = "Optional reason"),
    responses((status = 200, body = Decision), (status = 409, description = "No approval waits at that node", body = Problem, content_type = "application/problem+json")))]
pub async fn reject(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<ApprovalPath>, JsonOrEmpty(body): JsonOrEmpty<RejectApproval>) -> Result<Json<Decision>, ApiError> {
    scope.require(Role::Member)?;
    let id = run_id(&p.run)?;
    let reason = at_most("reason", body.reason, 200)?;
    let (state, scope, node, reason) = (&state, &scope, &p.node, reason.as_deref());
    let (step, answer) = retry_busy(move || async move {
        let mut ch = scope.change(state).await?;
        in_project(&mut ch, scope, id).await?;
        let step = approvals::reject(&mut ch, scope.org.org, id, node, reason).await?;
        let answer = recorded_answer(&mut ch, scope, step).await?;
        ch.commit().await?;
        Ok((step, answer))
    })
    .await?;
    Ok(Json(Decision { run: id, node: p.node, step, decision: "rejected".into(), answer }))
}

/// What holds a run, in words.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Why {
    pub status: String,
    pub reason: Option<String>,
    /// The substate's name while running.
    pub substate: Option<String>,
    /// The console's words: "waiting for approval", "asleep", or the status once finished.
    pub words: String,
    /// What holds the run, in a sentence.
    pub text: String,
    /// The substate with its particulars (node, prompt, deadline, wake time, missing
    /// capabilities, …), tagged by `substate`.
    pub detail: Option<Value>,
}

/// What the run is doing or waiting for, in words.
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/runs/{run}/why", operation_id = "why_run", tag = "runs",
    params(("org" = String, Path, description = "Org slug"), ("project" = String, Path, description = "Project slug"), ("run" = String, Path, description = "Run id, `run-…`")),
    responses((status = 200, body = Why)))]
pub async fn why(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<RunPath>) -> Result<Json<Why>, ApiError> {
    scope.require(Role::Viewer)?;
    let id = run_id(&p.run)?;
    // The run must be in this project; `substate::why` checks the org.
    let mut conn = state.db.begin().await?;
    load(&mut conn, &scope, id).await?;
    drop(conn);
    let why = substate::why(&state.db, scope.org.org, id).await?;
    let detail = why.substate.as_ref().map(serde_json::to_value).transpose().map_err(ApiError::internal)?;
    Ok(Json(Why {
        status: why.status,
        reason: why.reason,
        substate: why.substate.as_ref().map(|s| s.name().to_owned()),
        words: why.words,
        text: why.text,
        detail,
    }))
}

/// One line a step's executor logged.
#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct LogLine {
    pub seq: i64,
    pub at: DateTime<Utc>,
    /// `stdout`, `stderr`, `session`, …
    pub stream: String,
    pub line: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LogPage {
    pub items: Vec<LogLine>,
    /// Pass as `after` for the next page; absent on the last page.
    pub next_after: Option<i64>,
}

/// A step's log lines, by sequence number.
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/runs/{run}/steps/{step}/logs", operation_id = "list_step_logs", tag = "runs",
    params(("org" = String, Path, description = "Org slug"), ("project" = String, Path, description = "Project slug"), ("run" = String, Path, description = "Run id, `run-…`"),
           ("step" = String, Path, description = "Step id, `step-…`"), EventsQuery),
    responses((status = 200, body = LogPage)))]
pub async fn step_logs(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<StepPath>, Query(q): Query<EventsQuery>) -> Result<Json<LogPage>, ApiError> {
    scope.require(Role::Viewer)?;
    let run = run_id(&p.run)?;
    let not_found = || ApiError::NotFound("step not found".into());
    let step: StepId = p.step.parse().map_err(|_| not_found())?;
    let limit = page::limit(q.limit)?;
    let found: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM steps s JOIN runs r ON r.run_id = s.run_id \
         WHERE s.step_id = $1 AND s.run_id = $2 AND s.org_id = $3 AND r.org_id = $3 AND r.project_id = $4",
    )
    .bind(step)
    .bind(run)
    .bind(scope.org.org)
    .bind(scope.project)
    .fetch_optional(&state.db)
    .await?;
    found.ok_or_else(not_found)?;
    let items: Vec<LogLine> = sqlx::query_as(
        "SELECT seq, at, stream, line FROM step_logs WHERE step_id = $1 AND org_id = $2 AND seq > $3 ORDER BY seq LIMIT $4",
    )
    .bind(step)
    .bind(scope.org.org)
    .bind(q.after.unwrap_or(0))
    .bind(limit + 1)
    .fetch_all(&state.db)
    .await?;
    let (items, next_after) = page::finish_after(items, limit, |l| l.seq);
    Ok(Json(LogPage { items, next_after }))
}
