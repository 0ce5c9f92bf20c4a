//! The gates' read at admission: whether the workflow or its project is paused, whether any
//! budget applies, and (at submit, for a run nothing but the gates and the org's cap can hold)
//! whether the org's line is free, taking its row when it is. One statement, which the insert of
//! a new item's trigger event carries too (`triggers::claim::submit_event`), so that a webhook
//! delivery's run is admitted a round trip sooner.

use crate::admission as rules;
use crate::definition::Definition;
use crate::ids::WorkflowId;

/// What the gates' read answers.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Gates {
    pub name: String,
    pub workflow_paused: bool,
    pub project_paused: bool,
    pub has_budgets: bool,
    /// Whether the org's line was free (its row now locked by this change), when asked.
    pub org_free: Option<bool>,
}

/// Gates read by an earlier statement of the change, for the admission of `workflow`'s run.
#[derive(Debug)]
pub(crate) struct ReadAhead {
    pub workflow: WorkflowId,
    /// Whether the read tried the org's line.
    pub org_next: bool,
    pub gates: Gates,
}

/// Whether a run of `def` tries the org's line in the gates' read: at submit, when no
/// concurrency group, throttle or board column could hold it (the lock `try_lock_queue` would
/// take next, a round trip sooner).
pub(crate) fn org_next(def: &Definition, at_submit: bool) -> bool {
    at_submit && def.concurrency.is_none() && def.throttle.is_none() && rules::board_columns(def).is_empty()
}

/// The read, with its parameters named by the caller: the workflow's id, the org's id, whether
/// to try the org's line ([`org_next`]) and that line's name (`admission::ORG_QUEUE`). The
/// workflow's and project's rows are locked `FOR SHARE`: a pause or unpause updates them, so it
/// is ordered with this admission.
pub(crate) fn select(workflow: &str, org: &str, org_next: &str, org_queue: &str) -> String {
    format!(
        "SELECT w.name, w.paused AS workflow_paused, p.paused AS project_paused, b.any AS has_budgets, \
                CASE WHEN {org_next} AND NOT w.paused AND NOT p.paused AND NOT b.any THEN \
                     EXISTS (SELECT 1 FROM admission_queues q WHERE q.org_id = {org} AND q.queue = {org_queue} FOR UPDATE SKIP LOCKED) \
                     OR NOT EXISTS (SELECT 1 FROM admission_queues q WHERE q.org_id = {org} AND q.queue = {org_queue}) END AS org_free \
         FROM workflows w JOIN projects p ON p.project_id = w.project_id \
         CROSS JOIN LATERAL (SELECT EXISTS (SELECT 1 FROM budgets b WHERE b.org_id = w.org_id \
                                            AND (b.project_id IS NULL OR b.project_id = w.project_id)) AS any) b \
         WHERE w.workflow_id = {workflow} AND w.org_id = {org} FOR SHARE OF w, p"
    )
}
