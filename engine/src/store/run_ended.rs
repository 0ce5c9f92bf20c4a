//! What happens when a run ends, in the order it happens, in the change that ends it
//! (`runs::finish`, after the one statement that sets its status and drops its wakes,
//! concurrency leases and place in line):
//!
//! 1. the room its concurrency leases held, and its place in line, go to the runs in line, as
//!    the change commits (`admission::lines::on_finish`, then `release`);
//! 2. its open steps are cancelled; when there were any, the approvals it still waited for are
//!    withdrawn, and so are its event waits (`github::withdraw_waits`), each with
//!    `run.wait_withdrawn`;
//! 3. its parent is woken (`child_done`), and each child still running (`parent_gone`);
//! 4. a dry run gets the wake that deletes it a day later (`retention`);
//! 5. `run.<status>` is written, with its duration, its audit entry (unless the engine ends
//!    it: the journal audits the engine's moves) and the metrics' tally;
//! 6. the trigger events queued behind it are judged again (`triggers::claim::rejudge`), which
//!    may open a run and cancel unstarted ones: through the [`RunOps`] `runs` hands it.
//!
//! Nothing here calls back into `runs`: what ends or submits a run is passed in.

use serde_json::json;

use super::admission::lines as admission_lines;
use super::run_rows::RunRow;
use super::steps;
use super::triggers::claim::{self, RunOps};
use super::{Change, Result, RunCtx, cap};
use crate::ids::{RunId, StepId};

/// What the ending run held, as the statement that ended it found: the children still
/// running, its concurrency leases, and the line it was waiting in.
pub(super) struct Held {
    pub(super) children: Vec<uuid::Uuid>,
    pub(super) leases: Vec<String>,
    pub(super) left_queue: Option<String>,
}

/// The run-ended sequence for `row`, which just moved to `status` (see the module's header).
pub(super) async fn run_ended(
    ch: &mut Change, ctx: &RunCtx, row: &RunRow, status: &'static str, reason: Option<&str>, held: Held, runs: &RunOps,
) -> Result<()> {
    let run_id = row.run_id;
    // The room it held, or its place in line, goes to the runs waiting.
    if !held.leases.is_empty() || held.left_queue.is_some() {
        admission_lines::on_finish(ch, ctx.org, &held.leases, held.left_queue.as_deref());
    }
    let step_reason = match status {
        "cancelled" => reason.unwrap_or("cancelled").to_owned(),
        _ => "run ended".to_owned(),
    };
    // An open approval always has its waiting step, so a run that ends with no open step
    // (most do) has none to withdraw and spends no statement on it.
    if steps::cancel_open(ch, run_id, &step_reason).await? > 0 {
        withdraw_approvals(ch, run_id).await?;
        super::github::withdraw_waits(ch, run_id).await?;
    }
    if let Some(parent) = row.parent_run_id {
        ch.wake_other(ctx.org, parent, "child_done").await?;
    }
    for child in held.children {
        ch.wake_other(ctx.org, RunId(child), "parent_gone").await?;
    }
    if row.dry_run {
        ch.wake(run_id, None, super::run_rows::DRY_RUN_RETENTION, "retention", true).await?;
    }
    let attrs = json!({ "reason": reason.map(cap) });
    ch.event(run_id, &format!("run.{status}"), None, attrs.clone())?;
    if let (Some(start), Some(end)) = (row.started_at, row.ended_at) {
        ch.event_extra(crate::event_log::Extra { duration_ms: Some((end - start).num_milliseconds()), ..Default::default() });
    }
    ch.audit_move(ctx.org, Some(ctx.project), &format!("run.{status}"), ("run", run_id.to_string()), attrs)?;
    ch.tally.run_finished(status);
    claim::rejudge(ch, row, runs).await
}

/// The approvals the run still waited for are withdrawn, so that no person is asked to answer
/// them any more; each writes `run.wait_withdrawn`.
async fn withdraw_approvals(ch: &mut Change, run: RunId) -> Result<()> {
    ch.locked(run)?;
    let by = ch.actor.label();
    let withdrawn: Vec<(StepId, String)> = sqlx::query_as(
        "UPDATE approvals SET decision = 'withdrawn', decided_by = $2, decided_at = now() \
         WHERE run_id = $1 AND decision IS NULL RETURNING step_id, node",
    )
    .bind(run)
    .bind(cap(&by))
    .fetch_all(&mut *ch.tx)
    .await?;
    for (step, node) in withdrawn {
        ch.event(run, "run.wait_withdrawn", Some((step, &node)), json!({ "waits_on": "person" }))?;
    }
    Ok(())
}
