//! Runs: submit, finish (the only way a run leaves `running`), cancel, rerun. The rows
//! themselves are in `run_rows.rs`; what a run's end sets off, in order, in `run_ended.rs`.
//!
//! This stands above admission, approvals and the trigger claim: they never end or submit a
//! run by calling back here. Admission hands back the victim of a `drop` group for its caller
//! to end ([`drop_victim`]); the claim rule is handed [`CLAIM_RUNS`].

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use serde_json::json;
use sqlx::{FromRow, Row};

use super::admission::lines::leaving_ctes;
use super::admission::plan as admission;
use super::run_ended::{self, Held};
use super::steps::{self, StepRow};
use super::triggers::claim::RunOps;
use super::{Change, Result, StoreError, cap};
use crate::definition::Definition;
use crate::ids::{OrgId, RunId};
use crate::state::{MoveTo, State, run};

pub(crate) use super::run_rows::RUN_COLUMNS;
pub use super::run_rows::{DRY_RUN_RETENTION, NewRun, RunRow, check_input, pending_wakes};

/// Reads a run inside the change.
pub async fn get(ch: &mut Change, run: RunId) -> Result<Option<RunRow>> {
    if let Some(row) = ch.run_row(run) {
        return Ok(Some(row.clone()));
    }
    let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = $1");
    Ok(sqlx::query_as(&sql).bind(run).fetch_optional(&mut *ch.tx).await?)
}

/// Clears `needs_approval` once the run-level approval was given.
pub(crate) async fn clear_needs_approval(ch: &mut Change, run: RunId) -> Result<()> {
    ch.locked(run)?;
    sqlx::query("UPDATE runs SET needs_approval = false WHERE run_id = $1").bind(run).execute(&mut *ch.tx).await?;
    ch.forget_run_row(run);
    Ok(())
}

/// Creates a run and the wake that starts it. The run stores the trace context the change was
/// given (`Change::set_trace`); a child run without one joins its parent's trace. Admission (`store::admission`) decides first,
/// under the locks of the queues it reads: the run is admitted, put in line (no wake: what
/// frees room wakes it), or refused (`StoreError::Refused` for a `skip` group that is full,
/// `StoreError::Full` when the org's line is full), in which case nothing is written. A run
/// opened for a trigger event marks the event `started` with it, in the run's insert.
pub async fn submit(ch: &mut Change, new: NewRun) -> Result<RunId> {
    let run = RunId::mint();
    let admission = if crate::admission::applies(new.parent.is_some(), new.dry_run) {
        let def = admission::definition(ch, new.workflow, new.version).await?;
        let candidate = admission::Candidate {
            org: new.org,
            project: new.project,
            run,
            workflow: new.workflow,
            item: new.item,
            def,
            needs_approval: new.needs_approval,
            at_submit: true,
        };
        let plan = admission::plan_submit(ch, &candidate).await?;
        Some((candidate, plan))
    } else {
        None
    };
    let (admitted, starts) = admission.as_ref().map_or((true, true), |(_, plan)| (plan.admitted(), plan.starts()));
    let created_by = ch.actor.label();
    // A child run without a trace of its own joins its parent's, which this change holds.
    let traceparent = match (&ch.trace, new.parent) {
        (Some(t), _) => Some(t.clone()),
        (None, Some((parent, _))) => ch.traceparent_of(parent).and_then(crate::trace::TraceParent::parse),
        (None, None) => None,
    };
    // The run's insert also marks its trigger event `started` and, when it may start now, writes
    // its first `advance` wake (the wake's key to the run is checked at the statement's end).
    let created_at: DateTime<Utc> = sqlx::query_scalar(
        "WITH started AS (UPDATE trigger_events SET status = 'started', reason = NULL, run_id = $3, decided_at = now() WHERE event_id = $7), \
              woken AS (INSERT INTO wakes (org_id, run_id, due_at, reason) SELECT $1, $3, now(), 'advance' WHERE $19) \
         INSERT INTO runs (org_id, project_id, run_id, workflow_id, workflow_version, item_id, trigger_event_id, \
                           parent_run_id, parent_step_id, source_run_id, source_from_node, needs_approval, input, \
                           dry_run, created_by, started_at, admitted_at, trace_id, traceparent) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, now(), CASE WHEN $16 THEN now() END, $17, $18) \
         RETURNING created_at",
    )
    .bind(new.org)
    .bind(new.project)
    .bind(run)
    .bind(new.workflow)
    .bind(new.version)
    .bind(new.item)
    .bind(new.trigger_event)
    .bind(new.parent.map(|p| p.0))
    .bind(new.parent.map(|p| p.1))
    .bind(new.source.as_ref().map(|s| s.0))
    .bind(new.source.as_ref().map(|s| s.1.join(",")).filter(|s| !s.is_empty()))
    .bind(new.needs_approval)
    .bind(&new.input)
    .bind(new.dry_run)
    .bind(cap(&created_by))
    .bind(admitted)
    .bind(traceparent.as_ref().map(crate::trace::TraceParent::trace_id))
    .bind(traceparent.as_ref().map(crate::trace::TraceParent::as_str))
    .bind(starts)
    .fetch_one(&mut *ch.tx)
    .await?;
    if starts {
        ch.note_wake(Duration::ZERO);
    }
    ch.adopt_new_run(new.org, new.project, run, created_at, new.version, traceparent.map(|t| t.as_str().to_owned()));
    let attrs = json!({
        "workflow": new.workflow.to_string(),
        "version": new.version,
        "dry_run": new.dry_run,
        "parent": new.parent.map(|p| p.0.to_string()),
    });
    ch.event(run, "run.started", None, attrs.clone())?;
    ch.audit(new.org, Some(new.project), "run.submit", ("run", run.to_string()), attrs)?;
    ch.tally.run_started();
    if let Some((candidate, mut plan)) = admission {
        if let Some((victim, reason)) = plan.take_victim() {
            drop_victim(ch, victim, &reason).await?;
        }
        admission::apply_submit(ch, &candidate, plan).await?;
    }
    Ok(run)
}

/// Ends a running run: cancels its open steps, drops its wakes, releases its concurrency
/// leases, tells its parent and its children, and writes `run.<status>`.
pub async fn finish<T: State>(ch: &mut Change, run_id: RunId, reason: Option<&str>) -> Result<RunRow>
where
    run::Running: MoveTo<T>,
{
    let ctx = ch.locked(run_id)?.clone();
    // One statement: the status, and (only if it was running) the run's wakes and
    // concurrency leases dropped (each lease leaving a release for its queue's count,
    // `admission::lines::held_in`), and the children still running listed. Wakes an engine has
    // claimed meanwhile are skipped, not waited for: the engine locks wakes before runs, so
    // waiting here would deadlock, and its commit deletes them anyway (its advance then finds
    // the run ended).
    let leaving = leaving_ctes("EXISTS (SELECT 1 FROM was)");
    let sql = format!(
        "WITH was AS (SELECT 1 FROM runs WHERE run_id = $1 AND status = 'running'), \
              w AS (DELETE FROM wakes WHERE wake_id = ANY(ARRAY(SELECT wake_id FROM wakes WHERE run_id = $1 FOR UPDATE SKIP LOCKED)) \
                    AND EXISTS (SELECT 1 FROM was)), \
              {leaving}, \
              u AS (UPDATE runs SET status = $2, reason = $3, ended_at = now() WHERE run_id = $1 AND status = 'running' RETURNING {RUN_COLUMNS}) \
         SELECT u.*, ARRAY(SELECT run_id FROM runs WHERE parent_run_id = $1 AND status = 'running') AS children, \
                ARRAY(SELECT group_key FROM l) AS leases, (SELECT queue FROM q) AS left_queue FROM u"
    );
    let found = sqlx::query(&sql)
        .bind(run_id)
        .bind(T::NAME)
        .bind(reason.map(cap))
        .fetch_optional(&mut *ch.tx)
        .await?
        .ok_or_else(|| StoreError::Conflict(format!("{run_id} is not running")))?;
    let row = RunRow::from_row(&found)?;
    let children: Vec<uuid::Uuid> = found.try_get("children")?;
    let leases: Vec<String> = found.try_get("leases")?;
    let left_queue: Option<String> = found.try_get("left_queue")?;
    ch.forget_run_row(run_id);
    run_ended::run_ended(ch, &ctx, &row, T::NAME, reason, Held { children, leases, left_queue }, &CLAIM_RUNS).await?;
    Ok(row)
}

/// Ends the victim of a `drop` group, before the plan that took its place is applied
/// (`admission::plan::PlanRef::take_victim`).
pub(super) async fn drop_victim(ch: &mut Change, victim: RunId, reason: &str) -> Result<()> {
    match finish::<run::Cancelled>(ch, victim, Some(reason)).await {
        // It ended meanwhile: its place is free already.
        Ok(_) | Err(StoreError::Conflict(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// What the trigger claim does to runs: it opens one, and cancels the unstarted ones an event
/// supersedes or revokes. Boxed: a run's end judges the events queued behind it again
/// (`run_ended`), which may submit and cancel runs, whose end may do so in turn.
pub(crate) const CLAIM_RUNS: RunOps = RunOps { submit: submit_boxed, cancel: cancel_boxed };

fn submit_boxed(ch: &mut Change, new: NewRun) -> BoxFuture<'_, Result<RunId>> {
    Box::pin(submit(ch, new))
}

fn cancel_boxed<'a>(ch: &'a mut Change, run: RunId, reason: &'a str) -> BoxFuture<'a, Result<()>> {
    Box::pin(async move { finish::<run::Cancelled>(ch, run, Some(reason)).await.map(drop) })
}

/// An operator's cancel. A run that already ended is a conflict, not a silent success.
pub async fn cancel(ch: &mut Change, org: OrgId, run: RunId, reason: &str) -> Result<RunRow> {
    ch.lock_run(org, run).await?.ok_or(StoreError::NotFound("run"))?;
    let current = get(ch, run).await?.ok_or(StoreError::NotFound("run"))?;
    if current.status().is_terminal() {
        return Err(StoreError::Conflict(format!("run is already {}", current.status)));
    }
    finish::<run::Cancelled>(ch, run, Some(reason)).await
}

/// Submits a finished run again as a new run with the same input. With `from`, the new run
/// reuses the outputs recorded before those nodes (every node not downstream of them).
pub async fn rerun(ch: &mut Change, org: OrgId, source: RunId, def: &Definition, from: &[String]) -> Result<RunId> {
    let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = $1 AND org_id = $2");
    let src: RunRow = sqlx::query_as(&sql).bind(source).bind(org).fetch_optional(&mut *ch.tx).await?.ok_or(StoreError::NotFound("run"))?;
    if !src.status().is_terminal() {
        return Err(StoreError::Conflict("run is still running; cancel it first or wait for it to end".into()));
    }
    for node in from {
        if def.node(node).is_none() {
            return Err(StoreError::Invalid(format!("node `{node}` is not in workflow version {}", src.workflow_version)));
        }
    }
    let new = submit(
        ch,
        NewRun {
            item: src.item_id,
            dry_run: src.dry_run,
            // A rerun or retry of a workflow that requires approval waits for it again.
            needs_approval: def.approval_required,
            source: Some((source, from.to_vec())),
            ..NewRun::of_workflow(org, src.project_id, src.workflow_id, src.workflow_version, src.input.clone())
        },
    )
    .await?;
    if !from.is_empty() {
        let again = def.downstream(from);
        let sql =
            format!("SELECT DISTINCT ON (node) {} FROM steps WHERE run_id = $1 AND state = 'succeeded' ORDER BY node, started_seq DESC", steps::STEP_COLUMNS);
        let mut kept: Vec<StepRow> = sqlx::query_as(&sql).bind(source).fetch_all(&mut *ch.tx).await?;
        kept.sort_by_key(|s| s.started_seq);
        for step in kept.iter().filter(|s| !again.contains(&s.node) && def.node(&s.node).is_some()) {
            steps::reuse(ch, new, step).await?;
        }
    }
    Ok(new)
}

/// The nodes of a failed run to start again from on retry: every node whose latest step
/// failed.
pub async fn failed_nodes(ch: &mut Change, org: OrgId, run: RunId) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT node FROM (SELECT DISTINCT ON (node) node, state FROM steps WHERE run_id = $1 AND org_id = $2 \
         ORDER BY node, started_seq DESC) s WHERE state IN ('failed', 'cancelled') ORDER BY node",
    )
    .bind(run)
    .bind(org)
    .fetch_all(&mut *ch.tx)
    .await?)
}

/// Deletes a finished dry run and its history (events, steps, wakes cascade).
pub async fn delete_dry(ch: &mut Change, run: RunId) -> Result<bool> {
    ch.forget_run_row(run);
    // A dry run is gone a day after it ends, journal and all, with the child runs it made: its
    // few journal rows go with it rather than waiting for their month's partition.
    let done: Option<i32> = sqlx::query_scalar(
        "WITH RECURSIVE tree AS ( \
             SELECT run_id, created_at FROM runs WHERE run_id = $1 AND dry_run AND status <> 'running' \
             UNION ALL SELECT r.run_id, r.created_at FROM runs r JOIN tree t ON r.parent_run_id = t.run_id), \
           events AS (DELETE FROM run_events e USING tree t WHERE e.run_id = t.run_id AND e.run_created_at = t.created_at), \
           logs AS (DELETE FROM step_logs l USING tree t WHERE l.run_id = t.run_id AND l.run_created_at = t.created_at), \
           gone AS (DELETE FROM runs WHERE run_id = $1 AND dry_run AND status <> 'running' RETURNING 1) \
         SELECT 1 FROM gone",
    )
    .bind(run)
    .fetch_optional(&mut *ch.tx)
    .await?;
    Ok(done.is_some())
}
