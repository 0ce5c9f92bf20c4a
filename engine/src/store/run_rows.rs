//! Run rows: what a run is as stored (`runs::get` reads one inside a change). Below everything else
//! of the store that touches runs; `runs` (submit, finish, cancel, rerun) stands above it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::FromRow;

use super::{Result, StoreError};
use crate::ids::{ItemId, OrgId, ProjectId, RunId, StepId, WorkflowId};
use crate::state::RunStatus;

/// How long a finished dry run is kept.
pub const DRY_RUN_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// A run as stored.
#[derive(Debug, Clone, FromRow)]
pub struct RunRow {
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub run_id: RunId,
    pub workflow_id: WorkflowId,
    pub workflow_version: i32,
    pub item_id: Option<ItemId>,
    pub parent_run_id: Option<RunId>,
    pub parent_step_id: Option<StepId>,
    pub source_run_id: Option<RunId>,
    pub source_from_node: Option<String>,
    pub status: String,
    pub reason: Option<String>,
    pub needs_approval: bool,
    pub input: Value,
    pub dry_run: bool,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    /// When admission let it start (`store::admission`); `None` while it is held or not yet
    /// looked at by the engine.
    pub admitted_at: Option<DateTime<Utc>>,
    /// The trace of the run (`crate::trace`): its id, and the W3C `traceparent` of the span
    /// that created it, which its steps' spans take as their parent.
    pub trace_id: Option<String>,
    pub traceparent: Option<String>,
}

impl RunRow {
    pub fn status(&self) -> RunStatus {
        RunStatus::parse(&self.status).unwrap_or(RunStatus::Failed)
    }
}

pub(crate) const RUN_COLUMNS: &str = "org_id, project_id, run_id, workflow_id, workflow_version, item_id, \
     parent_run_id, parent_step_id, source_run_id, source_from_node, status, reason, needs_approval, input, \
     dry_run, created_by, created_at, started_at, ended_at, admitted_at, trace_id, traceparent";

/// What a new run is made of.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub org: OrgId,
    pub project: ProjectId,
    pub workflow: WorkflowId,
    pub version: i32,
    pub input: Value,
    pub item: Option<ItemId>,
    pub trigger_event: Option<uuid::Uuid>,
    /// The parent run and its `workflow` step, for a child run.
    pub parent: Option<(RunId, StepId)>,
    pub dry_run: bool,
    /// `approval: required`: park until a person approves.
    pub needs_approval: bool,
    /// The run this one reruns, and the nodes it starts again from.
    pub source: Option<(RunId, Vec<String>)>,
}

impl NewRun {
    /// A run of a workflow version with `input` and nothing else, as a person submits it: no
    /// item, trigger event, parent, approval or rerun (set those with `..` on it, as a trigger,
    /// a schedule, a child run and a rerun do).
    pub fn of_workflow(org: OrgId, project: ProjectId, workflow: WorkflowId, version: i32, input: Value) -> NewRun {
        NewRun { org, project, workflow, version, input, item: None, trigger_event: None, parent: None, dry_run: false, needs_approval: false, source: None }
    }
}

/// A quick check used by tests and `why`: wakes still queued for a run.
pub async fn pending_wakes(pool: &crate::db::Db, run: RunId) -> Result<Vec<(String, DateTime<Utc>)>> {
    Ok(sqlx::query_as("SELECT reason, due_at FROM wakes WHERE run_id = $1 ORDER BY due_at").bind(run).fetch_all(pool).await?)
}

/// Keeps `Value` inputs objects, as the API promises.
pub fn check_input(input: &Value) -> Result<()> {
    if input.is_object() { Ok(()) } else { Err(StoreError::Invalid("run input must be a JSON object".into())) }
}
