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
//!
//! # The order of dependencies
//!
//! Files import each other in one direction. `tests/e2e/structure.rs` (part of `make test`)
//! reads the `use` declarations and paths of `engine/src` and `api/src` and fails on any circle
//! between files, printing it (`a.rs → b.rs → a.rs`); it also fails on a source file over 600
//! lines outside tests. Its doc comment says how paths become edges: a re-export is none itself,
//! and a path through one is an edge to the file that defines the item (`crate::store::Change`
//! is `store/change/mod.rs`).
//!
//! Layout is rustfmt's (`rustfmt.toml`, checked by `make lint`). A statement that would make
//! its call chain wrap may be a named `const` above the function that runs it (`DELETE_BUDGET`),
//! so that `sqlx::query(CONST).bind(..)…` reads on one line; a statement two functions run is
//! written once (`ITEM_BY_KEY`, `PROJECT_BY_ID`).
//!
//! In `api/src`, a `mod.rs` declares its children, re-exports and wires the routes; it defines
//! nothing its children use. What the handlers share sits in a file of its own below them:
//! `http/state.rs` (`AppState`), `console/state.rs` (`Console`), `console/pages/run/mod.rs`'s
//! paths and `Feedback` below `page.rs`, which the forms' handlers call to show the page again.
//!
//! **Architecture Invariant:** the store stands below everything that uses it: `store/`
//! imports nothing from `advance`, `pool`, `github` or `triggers` (checked by the same test).
//! What both need lives below both: a run's template context (`run_context.rs`), a node's
//! timeouts (`definition/timeouts.rs`), the trigger `if:` (`judge.rs`) and item keys
//! (`item_keys.rs`).
//!
//! Inside the store, from the bottom: `admission/gates.rs` (the gates' read: its row and its
//! SQL), `change/mod.rs` (a `Change`: the transaction and what it buffers), `run_rows.rs` and `steps.rs`; above what a commit calls (the admission lines'
//! `release`, the outgoing deliveries' statement of `webhooks_out.rs`, the events notice),
//! `change/commit.rs` (`Change::commit`); the admission
//! lines and decision (`admission/lines.rs`, `admission/plan.rs`), `budgets.rs`, `github.rs` and
//! the trigger writes (`triggers/items.rs`, `triggers/claim.rs`, `triggers/cycle_budgets.rs`);
//! `run_ended.rs`; `runs.rs` (submit, finish, cancel, rerun); and above `runs`, what ends or
//! submits runs for its own reasons: `admission.rs` (admission at the engine), `approvals.rs` (a
//! rejection cancels its run), `triggers.rs` (the claim's entry points), `schedules.rs`,
//! `engine_errors.rs`. Nothing below `runs` calls back into it: admission hands a `drop`
//! group's victim to its caller (`runs::drop_victim`), and the trigger claim is handed the two
//! run operations it needs (`runs::CLAIM_RUNS`: submit, cancel).
//!
//! **A run ends** in one place. `runs::finish` moves it with one statement (its status, its
//! wakes, concurrency leases and place in line dropped, its running children listed), then
//! `run_ended::run_ended` does, in this order:
//!
//! 1. the room its leases held and its place in line go to the runs in line, as the change
//!    commits (`admission::lines::on_finish`, then `release`);
//! 2. its open steps are cancelled; if there were any, its open approvals are withdrawn and so
//!    are its event waits (`store::github::withdraw_waits`), each with `run.wait_withdrawn`;
//! 3. its parent is woken (`child_done`), and each child still running (`parent_gone`);
//! 4. a dry run gets its `retention` wake, a day later;
//! 5. `run.<status>` is written with its duration, with an audit entry and the metrics' tally;
//! 6. the newest trigger event queued behind it is judged again (`triggers::claim::rejudge`),
//!    which may cancel unstarted runs and open one, each of whose ends goes through these
//!    steps too.

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
