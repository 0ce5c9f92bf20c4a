//! Acting on runs (member): submit one (with `Idempotency-Key`), cancel one, retry one (rerun
//! from the failed nodes, with an optional edit), rerun one (from the start or
//! `?from=<node>`).

use axum::extract::State;
use axum::response::Response;
use engine::ids::{RunId, WorkflowId};
use engine::store::runs::{self as store, NewRun};
use engine::store::{cap, operator};
use engine::trace::TraceParent;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use super::{ProjectRun, Run, RunPath, load_fresh, retry_busy};
use crate::http::auth::Role;
use crate::http::error::ApiError;
use crate::http::extract::{IdempotencyKey, Json, JsonOrEmpty, Query, at_most};
use crate::http::tenant::ProjectScope;
use crate::http::{AppState, idempotency};

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRun {
    /// The workflow's name; one the project does not have answers 404.
    pub workflow: String,
    /// A JSON object, available to templates and expressions as `run.input`.
    #[schema(value_type = Option<Object>)]
    pub input: Option<Map<String, Value>>,
    /// A version number; the latest by default. One the workflow does not have answers 404.
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

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RerunQuery {
    /// Start again from this node, reusing the outputs recorded before it; a node the run's
    /// workflow does not have answers 404.
    pub from: Option<String>,
}

const LATEST_OF_WORKFLOW: &str = "SELECT workflow_id, latest_version FROM workflows WHERE org_id = $1 AND project_id = $2 AND name = $3";

const VERSION_EXISTS: &str = "SELECT version FROM workflow_versions WHERE org_id = $1 AND workflow_id = $2 AND version = $3";

/// Submits a run of a workflow (member). `approval: required` workflows park it at `$start`
/// until a person approves. Admission may hold it (`queued`, `awaiting_lease`, `sleeping`,
/// `held`: `why` says by what) or refuse it.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/runs", operation_id = "submit_run", tag = "runs",
    params(ProjectScope, IdempotencyKey),
    request_body = SubmitRun,
    responses((status = 201, body = Run),
              (status = 409, description = "Refused by its concurrency group (policy `skip`, the group is full)"),
              (status = 429, description = "1,000 runs already wait for the org's cap on running runs")))]
pub async fn submit(State(state): State<AppState>, scope: ProjectScope, key: IdempotencyKey, Json(body): Json<SubmitRun>) -> Result<Response, ApiError> {
    scope.require(Role::Member)?;
    // The request's span is the root of the new run's trace (`engine::trace`).
    let span = tracing::info_span!(parent: None, "runs.submit", otel.name = "POST runs", otel.kind = "server", shopfloor.workflow = %cap(&body.workflow));
    let mut ch = scope.change(&state).await?;
    ch.set_trace(TraceParent::of_span(&span));
    idempotency::create(ch, scope.org.org, &key, &body, async |ch| {
        let found: Option<(WorkflowId, i32)> =
            sqlx::query_as(LATEST_OF_WORKFLOW).bind(scope.org.org).bind(scope.project).bind(&body.workflow).fetch_optional(ch.conn()).await?;
        // A name that names nothing is not found, as a path that does is.
        let (workflow, latest) = found.ok_or_else(|| ApiError::NotFound(format!("no workflow `{}` in this project", cap(&body.workflow))))?;
        let version = body.version.unwrap_or(latest);
        let exists: Option<i32> = sqlx::query_scalar(VERSION_EXISTS).bind(scope.org.org).bind(workflow).bind(version).fetch_optional(ch.conn()).await?;
        if exists.is_none() {
            return Err(ApiError::NotFound(format!("workflow `{}` has no version {version}", cap(&body.workflow))));
        }
        let def = state.shared.catalog.get(ch.conn(), workflow, version).await?;
        let run = store::submit(
            ch,
            NewRun {
                dry_run: body.dry_run,
                needs_approval: def.approval_required,
                ..NewRun::of_workflow(scope.org.org, scope.project, workflow, version, Value::Object(body.input.clone().unwrap_or_default()))
            },
        )
        .await?;
        load_fresh(ch.conn(), &scope, run).await
    })
    .await
}

/// Cancels a running run and the children it waits for (member).
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/runs/{run}/cancel", operation_id = "cancel_run", tag = "runs",
    params(ProjectScope, RunPath),
    request_body(content = Option<CancelRun>, description = "Optional reason"),
    responses((status = 200, body = Run), (status = 409, description = "The run already ended")))]
pub async fn cancel(
    State(state): State<AppState>, ProjectRun { scope, run: id }: ProjectRun, JsonOrEmpty(body): JsonOrEmpty<CancelRun>,
) -> Result<Json<Run>, ApiError> {
    scope.require(Role::Member)?;
    let reason = at_most("reason", body.reason, 200)?;
    let reason = match reason.as_deref().map(str::trim).filter(|r| !r.is_empty()) {
        Some(why) => format!("cancelled: {why}"),
        None => "cancelled".to_owned(),
    };
    let (state, scope, reason) = (&state, &scope, &reason);
    let run = retry_busy(move || async move {
        let mut ch = scope.change(state).await?;
        store::cancel(&mut ch, scope.org.org, id, reason).await?;
        let run = load_fresh(ch.conn(), scope, id).await?;
        ch.commit().await?;
        Ok(run)
    })
    .await?;
    Ok(Json(run))
}

const SOURCE_RUN: &str = "SELECT workflow_id, workflow_version, status FROM runs WHERE run_id = $1 AND org_id = $2";

/// Submits a new run from a finished one: from `from` (or the start), reusing earlier outputs.
/// A retry keeps the run's edits (`edit` adds one: edit-and-retry).
async fn rerun_from(
    state: &AppState, scope: &ProjectScope, key: &IdempotencyKey, source: RunId, retry: bool, from: Option<String>, edit: Option<RetryRun>,
) -> Result<Response, ApiError> {
    // The request's span is the root of the new run's trace (`engine::trace`).
    let span = tracing::info_span!(parent: None, "runs.rerun", otel.name = if retry { "POST runs retry" } else { "POST runs rerun" }, otel.kind = "server", shopfloor.source_run = %source);
    let mut ch = scope.change(state).await?;
    ch.set_trace(TraceParent::of_span(&span));
    // The edit is the request's body (a rerun has none), which a replay must repeat.
    idempotency::create(ch, scope.org.org, key, &edit, async |ch| {
        let (workflow, version, status): (WorkflowId, i32, String) = sqlx::query_as(SOURCE_RUN).bind(source).bind(scope.org.org).fetch_one(ch.conn()).await?;
        let mut nodes = if retry {
            match status.as_str() {
                "running" => return Err(ApiError::Conflict("the run is still running; cancel it first or wait for it to end".into())),
                "completed" => return Err(ApiError::Conflict("the run completed: nothing failed to retry (rerun it instead)".into())),
                _ => store::failed_nodes(ch, scope.org.org, source).await?,
            }
        } else {
            from.into_iter().collect()
        };
        let def = state.shared.catalog.get(ch.conn(), workflow, version).await?;
        // A node named that the workflow lacks is not found (a run still running is a conflict
        // first, which the store says).
        if status != "running" {
            let mut named = nodes.iter().filter(|_| !retry).chain(edit.as_ref().map(|e| &e.node));
            if let Some(missing) = named.find(|n| def.node(n).is_none()) {
                return Err(ApiError::NotFound(format!("node `{}` is not in this run's workflow", cap(missing))));
            }
        }
        if let Some(e) = &edit {
            if !nodes.contains(&e.node) {
                nodes.push(e.node.clone());
            }
        }
        let run = store::rerun(ch, scope.org.org, source, &def, &nodes).await?;
        if retry {
            let org = scope.org.org;
            match &edit {
                Some(e) => {
                    let change = operator::NodeOverride { prompt: e.prompt.clone(), model: e.model.clone(), harness: e.harness.clone() };
                    operator::edit_retry(ch, org, run, source, &def, &e.node, &change).await?;
                }
                None => operator::inherit_overrides(ch, org, run, source).await?,
            }
        }
        load_fresh(ch.conn(), scope, run).await
    })
    .await
}

/// Retries a failed or cancelled run: a new run that starts again from the nodes that failed,
/// reusing the outputs before them (member). With a body, edit-and-retry: the new run runs
/// `node` with the prompt, model or harness given, at every attempt of that node (audited as
/// `run.edit_retry`, with a `run.edited` event). A retry keeps the edits of the run it retries.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/runs/{run}/retry", operation_id = "retry_run", tag = "runs",
    params(ProjectScope, RunPath, IdempotencyKey),
    request_body(content = Option<RetryRun>, description = "Optional: a crew node to run with a new prompt, model or harness"),
    responses((status = 201, description = "The new run", body = Run), (status = 409, description = "Running, or completed"),
              (status = 422, description = "No such crew node, or an invalid prompt, model or harness")))]
pub async fn retry(
    State(state): State<AppState>, ProjectRun { scope, run: id }: ProjectRun, key: IdempotencyKey, JsonOrEmpty(body): JsonOrEmpty<Option<RetryRun>>,
) -> Result<Response, ApiError> {
    scope.require(Role::Member)?;
    rerun_from(&state, &scope, &key, id, true, None, body).await
}

/// Reruns a finished run with the same input, from the start or from `?from=<node>` (member).
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/runs/{run}/rerun", operation_id = "rerun_run", tag = "runs",
    params(ProjectScope, RunPath, RerunQuery, IdempotencyKey),
    responses((status = 201, description = "The new run", body = Run), (status = 409, description = "Still running"),
              (status = 422, description = "No such node")))]
pub async fn rerun(
    State(state): State<AppState>, ProjectRun { scope, run: id }: ProjectRun, key: IdempotencyKey, Query(q): Query<RerunQuery>,
) -> Result<Response, ApiError> {
    scope.require(Role::Member)?;
    rerun_from(&state, &scope, &key, id, false, q.from, None).await
}
