//! Step rows: creation and the typed moves between step states.
//!
//! Each move is `UPDATE … WHERE state = ANY(<sources>)`, with the sources taken from the
//! `MoveTo` bound, so the SQL refuses exactly what the types refuse; a fenced move also names
//! the lease holder. Zero rows updated means the step moved on under the caller (a stale
//! holder, a cancel), and the caller gets `StoreError::Stale`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::FromRow;

use super::{Change, Result, StoreError, cap};
use crate::ids::{OrgId, RunId, StepId};
use crate::state::{MoveTo, State, StepState, step};

/// How long a holder owns a leased step without renewing it. A lease counts from the statement
/// that takes or renews it (`clock_timestamp()`), not from its transaction's start, so time a
/// transaction spent waiting for locks is not taken off the lease; a holder frozen inside the
/// transaction cannot commit one at all: `idle_in_transaction_session_timeout` (`db::GUARDS`)
/// ends its session first, and its work is recovered like any other.
pub const LEASE: Duration = Duration::from_secs(30);
/// After a lease lapses, its holder still has this long to report in before recovery.
pub const LEASE_GRACE: Duration = Duration::from_secs(15);

/// A step as stored.
#[derive(Debug, Clone, FromRow)]
pub struct StepRow {
    pub org_id: OrgId,
    pub run_id: RunId,
    pub step_id: StepId,
    pub node: String,
    pub kind: String,
    pub visit: i32,
    pub attempt: i32,
    pub state: String,
    pub reason: Option<String>,
    pub failure_class: Option<String>,
    pub exit_code: Option<i32>,
    pub requires: Vec<String>,
    pub holder: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub output: Option<Value>,
    pub timed_out: bool,
    pub started_seq: i64,
    pub finished_seq: Option<i64>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
}

impl StepRow {
    pub fn state(&self) -> StepState {
        StepState::parse(&self.state).unwrap_or(StepState::Failed)
    }
}

pub(crate) const STEP_COLUMNS: &str = "org_id, run_id, step_id, node, kind, visit, attempt, state, reason, \
     failure_class, exit_code, requires, holder, lease_expires_at, output, timed_out, started_seq, \
     finished_seq, created_at, started_at, ended_at";

/// The state a step is created in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Initial {
    /// Ready for an executor (after `not_before` when set).
    Pending,
    /// An approval, a wait or a child run: something outside the step will resolve it.
    Waiting,
}

#[derive(Debug, Clone)]
pub struct NewStep<'a> {
    pub node: &'a str,
    pub kind: &'a str,
    pub visit: u32,
    pub attempt: u32,
    pub requires: Vec<String>,
    pub initial: Initial,
    /// A retry's backoff: the step may not be claimed before this.
    pub delay: Duration,
}

/// Why a step failed, for the walker's retry rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureClass {
    Ordinary,
    /// Lease expired, host lost, stalled: retried by itself.
    Infrastructure,
    /// Rejection, `budget_hard_stop`, GitHub 4xx, validation: never retried.
    Final,
}

impl FailureClass {
    pub fn name(self) -> &'static str {
        match self {
            FailureClass::Ordinary => "ordinary",
            FailureClass::Infrastructure => "infrastructure",
            FailureClass::Final => "final",
        }
    }

    pub fn parse(s: &str) -> FailureClass {
        match s {
            "infrastructure" => FailureClass::Infrastructure,
            "final" => FailureClass::Final,
            _ => FailureClass::Ordinary,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Failure {
    pub reason: String,
    pub class: FailureClass,
    pub exit_code: Option<i32>,
}

impl Failure {
    pub fn new(reason: impl Into<String>, class: FailureClass) -> Failure {
        Failure { reason: reason.into(), class, exit_code: None }
    }
}

/// Creates a step of a locked run; writes `step.created`.
pub async fn create(ch: &mut Change, run: RunId, new: NewStep<'_>) -> Result<StepId> {
    let org = ch.locked(run)?.org;
    let step = StepId::mint();
    let seq = ch.peek_seq(run)?;
    let state = match new.initial {
        Initial::Pending => step::Pending::NAME,
        Initial::Waiting => step::Waiting::NAME,
    };
    sqlx::query(
        "INSERT INTO steps (org_id, run_id, step_id, node, kind, visit, attempt, state, requires, not_before, started_seq, started_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now() + $10 * interval '1 millisecond', $11, \
                 CASE WHEN $8 = 'waiting' THEN now() END)",
    )
    .bind(org)
    .bind(run)
    .bind(step)
    .bind(new.node)
    .bind(new.kind)
    .bind(new.visit as i32)
    .bind(new.attempt as i32)
    .bind(state)
    .bind(&new.requires)
    .bind(new.delay.as_millis() as f64)
    .bind(seq)
    .execute(&mut *ch.tx)
    .await?;
    let mut attrs = json!({ "kind": new.kind, "visit": new.visit, "attempt": new.attempt, "state": state });
    if !new.delay.is_zero() {
        attrs["delay_ms"] = json!(new.delay.as_millis() as u64);
    }
    ch.event(run, "step.created", Some((step, new.node)), attrs)?;
    ch.audit_move(org, Some(ch.locked(run)?.project), "step.create", ("step", step.to_string()), json!({ "run": run.to_string(), "node": new.node }))?;
    Ok(step)
}

/// Copies a finished step of an earlier run into `run` as already succeeded, for rerun-from.
pub async fn reuse(ch: &mut Change, run: RunId, from: &StepRow) -> Result<StepId> {
    let org = ch.locked(run)?.org;
    let step = StepId::mint();
    let seq = ch.peek_seq(run)?;
    sqlx::query(
        "INSERT INTO steps (org_id, run_id, step_id, node, kind, visit, attempt, state, output, reused_from, \
                            started_seq, finished_seq, started_at, ended_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'succeeded', $8, $9, $10, $10, now(), now())",
    )
    .bind(org)
    .bind(run)
    .bind(step)
    .bind(&from.node)
    .bind(&from.kind)
    .bind(from.visit)
    .bind(from.attempt)
    .bind(&from.output)
    .bind(from.step_id)
    .bind(seq)
    .execute(&mut *ch.tx)
    .await?;
    ch.event(run, "step.reused", Some((step, &from.node)), json!({ "from": from.step_id.to_string() }))?;
    ch.audit_move(org, Some(ch.locked(run)?.project), "step.reuse", ("step", step.to_string()), json!({ "from": from.step_id.to_string() }))?;
    Ok(step)
}

/// The fields a move sets besides the state.
#[derive(Debug, Default)]
struct Set<'a> {
    holder: Option<&'a str>,
    lease: bool,
    started: bool,
    finished: bool,
    output: Option<&'a Value>,
    failure: Option<&'a Failure>,
    timed_out: bool,
}

/// The one `UPDATE` behind every move. `fence` names the holder that must still hold the step.
async fn apply<F: MoveTo<T>, T: State>(ch: &mut Change, run: RunId, step: StepId, fence: Option<&str>, set: Set<'_>) -> Result<StepRow> {
    let finished_seq = if set.finished { Some(ch.peek_seq(run)?) } else { None };
    let sql = format!(
        "WITH gone AS (DELETE FROM wakes WHERE wake_id = ANY(ARRAY(SELECT wake_id FROM wakes WHERE step_id = $1 AND $8::bigint IS NOT NULL \
                                                      FOR UPDATE SKIP LOCKED))) \
         UPDATE steps SET state = $3, \
           holder = CASE WHEN $4 THEN $5 ELSE holder END, \
           lease_expires_at = CASE WHEN $6 THEN clock_timestamp() + interval '{lease} seconds' \
                                   WHEN $8::bigint IS NOT NULL THEN NULL ELSE lease_expires_at END, \
           started_at = CASE WHEN $7 THEN now() ELSE started_at END, \
           finished_seq = COALESCE($8, finished_seq), \
           ended_at = CASE WHEN $8::bigint IS NOT NULL THEN now() ELSE ended_at END, \
           output = COALESCE($9, output), \
           reason = COALESCE($10, reason), \
           failure_class = COALESCE($11, failure_class), \
           exit_code = COALESCE($12, exit_code), \
           timed_out = timed_out OR $13 \
         WHERE step_id = $1 AND run_id = $2 AND state = ANY($14) AND ($15::text IS NULL OR holder = $15) \
         RETURNING {STEP_COLUMNS}",
        lease = LEASE.as_secs()
    );
    let row: Option<StepRow> = sqlx::query_as(&sql)
        .bind(step)
        .bind(run)
        .bind(T::NAME)
        .bind(set.holder.is_some())
        .bind(set.holder)
        .bind(set.lease)
        .bind(set.started)
        .bind(finished_seq)
        .bind(set.output)
        .bind(set.failure.map(|f| cap(&f.reason)))
        .bind(set.failure.map(|f| f.class.name()))
        .bind(set.failure.and_then(|f| f.exit_code))
        .bind(set.timed_out)
        .bind(F::sources())
        .bind(fence)
        .fetch_optional(&mut *ch.tx)
        .await?;
    let row = row.ok_or_else(|| StoreError::Stale(format!("{step} is no longer {}", F::sources().join(" or "))))?;
    let mut attrs = json!({ "visit": row.visit, "attempt": row.attempt });
    if let Some(f) = set.failure {
        attrs["reason"] = json!(cap(&f.reason));
        attrs["class"] = json!(f.class.name());
        if let Some(code) = f.exit_code {
            attrs["exit_code"] = json!(code);
        }
    }
    if let Some(h) = set.holder {
        attrs["holder"] = json!(h);
    }
    if set.timed_out {
        attrs["timed_out"] = json!(true);
    }
    ch.event(run, &format!("step.{}", T::NAME), Some((step, &row.node)), attrs.clone())?;
    if matches!(T::NAME, "succeeded" | "failed" | "cancelled") {
        // For the event log only: how long the step took, and the git refs its output names.
        let mut extra = set.output.map(crate::event_log::Extra::from_output).unwrap_or_default();
        extra.duration_ms = row.started_at.zip(row.ended_at).map(|(s, e)| (e - s).num_milliseconds());
        ch.event_extra(extra);
    }
    let project = ch.locked(run)?.project;
    ch.audit_move(row.org_id, Some(project), &format!("step.{}", T::NAME), ("step", step.to_string()), attrs)?;
    tally_move(ch, &row, T::NAME, set.failure.map(|f| f.reason.as_str()));
    Ok(row)
}

/// Leases a pending step to `holder` for [`LEASE`], and writes the wake that recovers it if
/// the holder goes silent.
pub async fn lease(ch: &mut Change, run: RunId, step: StepId, holder: &str) -> Result<StepRow> {
    let row = apply::<step::Pending, step::Leased>(ch, run, step, None, Set { holder: Some(holder), lease: true, ..Set::default() }).await?;
    ch.wake(run, Some(step), LEASE + LEASE_GRACE, "lease_expiry", true).await?;
    Ok(row)
}

/// The engine takes a ready step for itself and starts it at once: the two legal moves
/// pending → leased → running in one statement, journalled as one event, `step.running`,
/// which names the holder (`step.leased` is the event of a lease that starts later, a
/// host's). One wake watches the step: at the lease's end plus its grace, or at the step's
/// timeout if sooner.
pub async fn lease_and_start(ch: &mut Change, run: RunId, step: StepId, holder: &str, timeout: Duration) -> Result<StepRow> {
    // Both moves must be legal; the first one's sources guard the statement.
    let from = <step::Pending as MoveTo<step::Leased>>::sources();
    let _checked = <step::Leased as MoveTo<step::Running>>::sources();
    let running = step::Running::NAME;
    // The wake that watches the held step is written by the same statement. Its condition
    // reads the step as the UPDATE does; no one else writes this run's steps meanwhile, since
    // the run is locked.
    let watch = (LEASE + LEASE_GRACE).min(timeout);
    let sql = format!(
        "WITH w AS (INSERT INTO wakes (org_id, run_id, step_id, due_at, reason) \
                    SELECT org_id, run_id, step_id, clock_timestamp() + $6 * interval '1 millisecond', 'lease_expiry' FROM steps \
                    WHERE step_id = $1 AND run_id = $2 AND state = ANY($5)) \
         UPDATE steps SET state = $3, holder = $4, lease_expires_at = clock_timestamp() + interval '{} seconds', started_at = now(), reason = NULL \
         WHERE step_id = $1 AND run_id = $2 AND state = ANY($5) RETURNING {STEP_COLUMNS}",
        LEASE.as_secs()
    );
    let row: StepRow = sqlx::query_as(&sql)
        .bind(step)
        .bind(run)
        .bind(running)
        .bind(holder)
        .bind(&from)
        .bind(watch.as_millis() as f64)
        .fetch_optional(&mut *ch.tx)
        .await?
        .ok_or_else(|| StoreError::Stale(format!("{step} is no longer pending")))?;
    let project = ch.locked(run)?.project;
    let attrs = json!({ "holder": holder, "attempt": row.attempt });
    ch.event(run, &format!("step.{running}"), Some((step, &row.node)), attrs.clone())?;
    ch.audit_move(row.org_id, Some(project), &format!("step.{running}"), ("step", step.to_string()), attrs)?;
    ch.note_wake(watch);
    ch.tally.step_started(&row.kind);
    Ok(row)
}

/// Counts a step's move for the metrics (at commit): a start, or an end with its outcome and
/// how long the step ran; a failure for a lapsed lease is a lease expiry too.
fn tally_move(ch: &mut Change, row: &StepRow, to: &'static str, reason: Option<&str>) {
    match to {
        "running" => ch.tally.step_started(&row.kind),
        "succeeded" | "failed" | "cancelled" => {
            let took = row.started_at.map(|at| (chrono::Utc::now() - at).num_milliseconds() as f64 / 1000.0);
            ch.tally.step_finished(&row.kind, to, took);
            if reason == Some("lease_expired") {
                ch.tally.lease_expired();
            }
        }
        _ => {}
    }
}

/// The holder starts work on a leased step.
pub async fn start(ch: &mut Change, run: RunId, step: StepId, holder: &str) -> Result<StepRow> {
    apply::<step::Leased, step::Running>(ch, run, step, Some(holder), Set { started: true, ..Set::default() }).await
}

/// A fenced success: only the holder of a running step may report it.
pub async fn succeed_held(ch: &mut Change, run: RunId, step: StepId, holder: &str, output: &Value) -> Result<StepRow> {
    apply::<step::Running, step::Succeeded>(ch, run, step, Some(holder), Set { finished: true, output: Some(output), ..Set::default() }).await
}

/// A fenced failure reported by the holder.
pub async fn fail_held(ch: &mut Change, run: RunId, step: StepId, holder: &str, failure: &Failure, output: Option<&Value>) -> Result<StepRow> {
    apply::<(step::Leased, step::Running), step::Failed>(ch, run, step, Some(holder), Set { finished: true, failure: Some(failure), output, ..Set::default() })
        .await
}

/// The holder gives a running step back for later (GitHub rate-limited it or could not serve
/// it): it returns to `pending` at the same attempt, with `reason` (`deferred:<why>`), its
/// lease and the wake watching it gone, and an `execute` wake after `delay` offers it again.
/// Fenced like a completion.
pub async fn defer_held(ch: &mut Change, run: RunId, step: StepId, holder: &str, reason: &str, delay: Duration) -> Result<StepRow> {
    let from = <step::Running as MoveTo<step::Pending>>::sources();
    let sql = format!(
        "WITH gone AS (DELETE FROM wakes WHERE wake_id = ANY(ARRAY(SELECT wake_id FROM wakes WHERE step_id = $1 FOR UPDATE SKIP LOCKED))) \
         UPDATE steps SET state = $3, holder = NULL, lease_expires_at = NULL, reason = $4, \
           not_before = now() + $5 * interval '1 millisecond' \
         WHERE step_id = $1 AND run_id = $2 AND state = ANY($6) AND holder = $7 RETURNING {STEP_COLUMNS}"
    );
    let reason = cap(reason);
    let row: StepRow = sqlx::query_as(&sql)
        .bind(step)
        .bind(run)
        .bind(step::Pending::NAME)
        .bind(&reason)
        .bind(delay.as_millis() as f64)
        .bind(&from)
        .bind(holder)
        .fetch_optional(&mut *ch.tx)
        .await?
        .ok_or_else(|| StoreError::Stale(format!("{step} is no longer running under {holder}")))?;
    let attrs = json!({ "visit": row.visit, "attempt": row.attempt, "reason": reason, "delay_ms": delay.as_millis() as u64 });
    ch.event(run, "step.deferred", Some((step, &row.node)), attrs.clone())?;
    let project = ch.locked(run)?.project;
    ch.audit_move(row.org_id, Some(project), "step.deferred", ("step", step.to_string()), attrs)?;
    ch.wake(run, Some(step), delay, "execute", true).await?;
    Ok(row)
}

/// Recovery takes a step back from a holder that went silent, or the engine fails one past
/// its timeout: no fence, the step's current holder is the one being overruled.
pub async fn fail_leased(ch: &mut Change, run: RunId, step: StepId, failure: &Failure) -> Result<StepRow> {
    apply::<(step::Leased, step::Running), step::Failed>(ch, run, step, None, Set { finished: true, failure: Some(failure), ..Set::default() }).await
}

/// The engine resolves a step it evaluates itself (a decision, a trigger, an end) or one that
/// was waiting (an approval answered, a wait elapsed, a child finished).
pub async fn succeed<F: MoveTo<step::Succeeded>>(ch: &mut Change, run: RunId, step: StepId, output: &Value, timed_out: bool) -> Result<StepRow> {
    apply::<F, step::Succeeded>(ch, run, step, None, Set { finished: true, output: Some(output), timed_out, ..Set::default() }).await
}

pub async fn fail<F: MoveTo<step::Failed>>(ch: &mut Change, run: RunId, step: StepId, failure: &Failure, output: Option<&Value>) -> Result<StepRow> {
    apply::<F, step::Failed>(ch, run, step, None, Set { finished: true, failure: Some(failure), output, ..Set::default() }).await
}

/// Cancels every open step of a run; returns how many.
pub async fn cancel_open(ch: &mut Change, run: RunId, reason: &str) -> Result<usize> {
    // One statement for all of them: each cancelled step takes the sequence number of its
    // event, in creation order.
    let sources = <(step::Pending, step::Leased, step::Running, step::Waiting) as MoveTo<step::Cancelled>>::sources();
    let first_seq = ch.peek_seq(run)?;
    let reason = cap(reason);
    let cancelled: Vec<(StepId, String, i32, i32, i64, String)> = sqlx::query_as(
        // The run's steps are read by run first (a few rows), so that the planner never
        // combines the org-wide index of open steps into the lookup.
        "WITH mine AS MATERIALIZED (SELECT step_id, state, started_seq FROM steps WHERE run_id = $1), \
              open AS (SELECT step_id, row_number() OVER (ORDER BY started_seq) - 1 AS i FROM mine WHERE state = ANY($2)) \
         UPDATE steps s SET state = $3, reason = $4, failure_class = 'final', finished_seq = $5 + open.i, \
                ended_at = now(), lease_expires_at = NULL \
         FROM open WHERE s.step_id = open.step_id \
         RETURNING s.step_id, s.node, s.visit, s.attempt, open.i, s.kind",
    )
    .bind(run)
    .bind(&sources)
    .bind(step::Cancelled::NAME)
    .bind(&reason)
    .bind(first_seq)
    .fetch_all(&mut *ch.tx)
    .await?;
    if cancelled.is_empty() {
        return Ok(0);
    }
    let mut cancelled = cancelled;
    cancelled.sort_by_key(|c| c.4);
    let (org, project) = (ch.locked(run)?.org, ch.locked(run)?.project);
    for (step, node, visit, attempt, _, kind) in &cancelled {
        ch.tally.step_finished(kind, "cancelled", None);
        let attrs = json!({ "visit": visit, "attempt": attempt, "reason": reason, "class": "final" });
        ch.event(run, "step.cancelled", Some((*step, node)), attrs.clone())?;
        ch.audit_move(org, Some(project), "step.cancelled", ("step", step.to_string()), attrs)?;
    }
    let ids: Vec<uuid::Uuid> = cancelled.iter().map(|c| c.0.0).collect();
    // Skip wakes an engine has claimed: it locks wakes before runs (see `runs::finish`).
    sqlx::query("DELETE FROM wakes WHERE wake_id = ANY(ARRAY(SELECT wake_id FROM wakes WHERE step_id = ANY($1) FOR UPDATE SKIP LOCKED))")
        .bind(&ids)
        .execute(&mut *ch.tx)
        .await?;
    Ok(cancelled.len())
}

/// Renews a holder's lease; returns the step's state, so a holder learns at once that its
/// step was cancelled. Not a move and not an event: heartbeats are frequent and say nothing new.
pub async fn heartbeat(pool: &crate::db::Db, org: OrgId, step: StepId, holder: &str) -> Result<StepState> {
    let sql = format!(
        "UPDATE steps SET lease_expires_at = clock_timestamp() + interval '{} seconds' \
         WHERE step_id = $1 AND org_id = $2 AND holder = $3 AND state IN ('leased','running') RETURNING state",
        LEASE.as_secs()
    );
    let renewed: Option<String> = sqlx::query_scalar(&sql).bind(step).bind(org).bind(holder).fetch_optional(pool).await?;
    match renewed {
        Some(s) => Ok(StepState::parse(&s).unwrap_or(StepState::Running)),
        None => {
            let state: Option<String> =
                sqlx::query_scalar("SELECT state FROM steps WHERE step_id = $1 AND org_id = $2").bind(step).bind(org).fetch_optional(pool).await?;
            match state.as_deref().and_then(StepState::parse) {
                Some(s) => Ok(s),
                None => Err(StoreError::NotFound("step")),
            }
        }
    }
}

/// Reads the steps of a run in creation order, inside the change (so it sees its own writes).
pub async fn of_run(ch: &mut Change, run: RunId) -> Result<Vec<StepRow>> {
    let sql = format!("SELECT {STEP_COLUMNS} FROM steps WHERE run_id = $1 ORDER BY started_seq");
    Ok(sqlx::query_as(&sql).bind(run).fetch_all(&mut *ch.tx).await?)
}

pub async fn get(ch: &mut Change, run: RunId, step: StepId) -> Result<Option<StepRow>> {
    let sql = format!("SELECT {STEP_COLUMNS} FROM steps WHERE step_id = $1 AND run_id = $2");
    Ok(sqlx::query_as(&sql).bind(step).bind(run).fetch_optional(&mut *ch.tx).await?)
}
