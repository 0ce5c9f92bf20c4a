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
//!
//! # The write path, step by step
//!
//! A change (submit a run, an engine's advance, a host's completion, an approval) is:
//!
//! 1. `Change::begin` — a transaction.
//! 2. `lock_run` / `lock_runs` — `SELECT … FOR NO KEY UPDATE` on the runs it touches, in id
//!    order (it excludes every other writer of the run, but not the key-share lock of a foreign
//!    key, so a wake for a run another change holds is written without waiting for it).
//! 3. Typed operations write rows; each appends a run event (`seq` is the run's last event's
//!    plus one, read once after the lock is granted and counted in memory; `actor` the change's
//!    actor, `kind:id`) and an audit entry, and may write wakes. Events and audit entries are
//!    buffered and inserted at commit, one statement each for the whole change. The audit log
//!    is who did what: every action of a person, a token, a host, GitHub or the system has its
//!    entry. An engine's own moves of steps and runs (`Change::audit_move`) have none: their
//!    events name the engine, and the audit view (`http::audit`) reads them back from the
//!    journal through the partial index `run_events_engine_moves`, merged into the same order
//!    (their ids are the event's less 2^52, so negative). An engine's lease-and-start of a step
//!    it runs itself is one statement and one event, `step.running` with the holder.
//! 4. `commit` — inserts the buffered events and audit entries in one statement (with, in it, a
//!    webhook delivery and its job for each subscription of the project whose filters name an
//!    event), sends at most one `NOTIFY shopfloor_wakes` (its words: `w<ms>`, the delay of
//!    the earliest wake written for another process; `l<run>`, a transcript that grew) from
//!    that same statement when there are rows to insert (`w0` when it made a delivery), and
//!    commits. Notifying commits are serialized cluster-wide, so a change that wrote only run
//!    events does not notify by itself: the streams learn of them from an `e` that each process
//!    sends at most every 50 ms, carried by the change when one is due, otherwise sent after
//!    the commit by a trailing task (`EventsNotice`, `events_notice.rs`, called by `change/commit.rs`).
//!
//! A failure anywhere rolls back everything: row, event, audit entry and wake come together or
//! not at all (tested by a trigger that fails the audit insert).
//!
//! The event hub of an API replica (`http::events`) reads new events only while someone
//! follows them (an event stream, a host's claim): on a notification with no subscriber it
//! forgets its place, and the next subscriber sets it to the horizon before reading its own
//! backlog, under one lock, so nothing falls between the two.

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

/// Caps a string for an event or reason (at most 500 characters).
pub fn cap(s: &str) -> String {
    if s.chars().count() <= 500 {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(497).collect();
        out.push_str("...");
        out
    }
}
