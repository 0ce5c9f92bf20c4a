//! Trigger writes: GitHub deliveries, item projections, trigger events and the claim rule,
//! revocation, cycle budgets and check results (installations are in `installations.rs`).
//!
//! # The claim rule
//!
//! A new trigger event for an item that already has an open run of the same workflow:
//!
//! - that run has **started** (an engine or a host ever held one of its steps; usine's
//!   "an attempt began", which stays true while the run waits for CI, an approval or a
//!   retry's backoff): the event is `queued` behind it. A started run always finishes. When it
//!   ends, [`on_run_finished`] judges the newest queued event again (its `if:` over the item's
//!   stored projection, which the webhooks keep current; a failing expression counts as a
//!   match) and opens its run, or marks the events `revoked`.
//! - otherwise (no step yet, parked on its `$start` approval, a crew step waiting for a host):
//!   it is cancelled `superseded by <event>`, and a new run opens. A change that makes the
//!   item stop matching revokes such runs the same way.
//! - no open run: a new run opens.
//!
//! A run opens only if the item's cycle budget admits it (`budget.max_cycles` runs per item and
//! workflow between resets). At the limit the event is `blocked` and an ask is recorded for
//! "Needs you"; from then on **no workflow** opens a run on that item until a person resets
//! its budget (their events are `blocked` too, and judged again by the reset). A run cancelled
//! before any attempt began (superseded, revoked) gives its cycle back. A reset bumps the
//! item's generation, which is part of new dedup keys, and judges the blocked events again.
//!
//! # Locks
//!
//! Every claim holds the item's row lock, so two deliveries about one item are judged one
//! after the other. Runs are locked before the item (as engines lock a run before finishing it
//! and re-judging its item), so ingest and engines take locks in one order.

//!
//! # Files
//!
//! `items.rs` deliveries, items, check results and the workflows that listen to GitHub;
//! `claim.rs` trigger events, the claim rule, revocation and re-judging; `cycle_budgets.rs`
//! the asks and resets of cycle budgets. This file stands above `runs` and hands the claim the
//! run operations it needs (`runs::CLAIM_RUNS`); the files under it never call into `runs`.

pub(crate) mod claim;
pub(crate) mod cycle_budgets;
pub(crate) mod items;

use serde_json::Value;

use super::runs::CLAIM_RUNS;
use super::{Change, Result};
use crate::ids::{ItemId, OrgId, WorkflowId};

pub use claim::{Claim, NewEvent, Revoked, workflows_pending_on};
pub use cycle_budgets::{CycleAsk, Reset, cycle_asks};
pub use items::{
    CheckResult, DeliveryRow, ItemRow, Route, RouteAsk, WorkflowInfo, ensure_item, github_workflows, item_for_update, items_by_head, items_by_node, lock_item,
    record_check, record_delivery, update_item,
};

/// Records a trigger event under its dedup key and applies the claim rule.
pub async fn submit_event(ch: &mut Change, new: NewEvent<'_>) -> Result<Claim> {
    claim::submit_event(ch, new, &CLAIM_RUNS).await
}

/// The item stopped matching: cancels the workflow's runs on it that have not started
/// (`revoked`) and marks its queued events `revoked` (`claim::revoke_unmatched`).
pub async fn revoke_unmatched(
    ch: &mut Change, org: OrgId, item: ItemId, workflow: WorkflowId, still_matches: &(dyn Fn(&Value) -> bool + Sync),
) -> Result<Revoked> {
    claim::revoke_unmatched(ch, org, item, workflow, still_matches, &CLAIM_RUNS).await
}

/// Resets an item's cycle budgets and judges the events they blocked again
/// (`cycle_budgets::reset_cycle_budget`).
pub async fn reset_cycle_budget(ch: &mut Change, org: OrgId, item: ItemId) -> Result<Reset> {
    cycle_budgets::reset_cycle_budget(ch, org, item, &CLAIM_RUNS).await
}
