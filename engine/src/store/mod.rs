//! The store: the one write path.
//!
//! Every change of a run or step happens inside a [`Change`]: one transaction that locks the
//! runs it touches, writes the rows, an audit entry, run events with gapless per-run sequence
//! numbers and the wakes the change causes, and sends at most one `NOTIFY` at commit. Nothing
//! outside this module issues `INSERT`/`UPDATE`/`DELETE` on runs, steps, step_logs,
//! run_events, audit_log, wakes or approvals.
//!
//! **Invariant:** a step or run row is only written while its run is locked in the same
//! `Change` (`Change::lock_run`), so two writers never interleave on one run and event
//! sequence numbers cannot skip or repeat.

pub mod admission;
pub mod api_writes;
pub mod approvals;
pub mod budgets;
mod change;
pub mod engine_errors;
mod events_notice;
pub mod github;
pub mod hosts;
pub mod installations;
pub mod jobs;
pub mod messages;
pub mod operator;
pub mod retention;
mod run_ended;
mod run_rows;
pub mod runs;
pub mod schedules;
pub mod signing_keys;
pub mod steps;
pub mod tenants;
pub mod triggers;
pub mod webhooks_out;
pub mod workflows;

pub use change::{Actor, Change, NOTIFY_CHANNEL, Notice, RunCtx};
#[cfg(feature = "testkit")]
pub(crate) use events_notice::EventsNotice;

/// What a store operation can refuse, besides a database error.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0} not found")]
    NotFound(&'static str),
    /// The row moved on under us: a newer lease holder, a cancel, a decision already taken.
    #[error("stale: {0}")]
    Stale(String),
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("invalid: {0}")]
    Invalid(String),
    /// Admission refused a new run: its concurrency group is full and its policy is `skip`.
    #[error("{0}")]
    Refused(String),
    /// Admission refused a new run: too many already wait for the org's cap.
    #[error("{0}")]
    Full(String),
    /// A sealed secret (a signing key, a webhook secret) that does not open with the secret key
    /// this process was given.
    #[error(transparent)]
    Sealed(#[from] crate::sealing::OpenError),
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Caps a string for an event or reason (Rule 2: at most 500 characters).
pub fn cap(s: &str) -> String {
    if s.chars().count() <= 500 {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(497).collect();
        out.push_str("...");
        out
    }
}
