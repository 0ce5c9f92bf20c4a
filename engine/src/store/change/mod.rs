//! `Change`: one transaction of the write path, with its audit entries, run events, wakes and
//! the single `NOTIFY` sent at commit (`commit.rs`, which stands above what a commit does:
//! admission lines released, outgoing deliveries, the events notice).

mod commit;

use std::collections::HashMap;
use std::time::Duration;

use crate::db::{Db, Tx};
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::admission::gates::ReadAhead;
use super::run_rows::RunRow;
use super::{Result, StoreError};
use crate::event_log::Extra;
use crate::ids::{HostId, OrgId, ProjectId, RunId, StepId, UserId};
use crate::trace::TraceParent;

/// The channel engines and API replicas `LISTEN` on. A payload is one or more words separated
/// by spaces: `w<ms>`, a wake another process must learn of falls due after this delay (`w0`:
/// now); `l<run>`, a session report added transcript lines to a run (live transcripts);
/// `e`, run events were committed (the event streams). Engines act only on `w`.
///
/// At most one NOTIFY per transaction. Notifying commits are serialized cluster-wide, so a
/// change that wrote only run events (most of an engine's) does not notify by itself: the
/// event streams learn of them through `EventsNotice`, at most one `e` per process every
/// `EVENTS_NOTICE_INTERVAL` (50 ms), sent after the commits it covers.
pub const NOTIFY_CHANNEL: &str = "shopfloor_wakes";

/// What a notification says, parsed from its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// A wake falls due after this delay.
    Wake(Duration),
    /// New run events or transcript lines, nothing for engines.
    Events,
}

impl Notice {
    pub fn parse(payload: &str) -> Notice {
        let mut wake: Option<u64> = None;
        for word in payload.split(' ') {
            match word.strip_prefix('w').map(str::parse::<u64>) {
                Some(Ok(ms)) => wake = Some(wake.map_or(ms, |w| w.min(ms))),
                None if word == "e" || word.starts_with('l') => {}
                // An unknown word: look, rather than miss a wake.
                _ => return Notice::Wake(Duration::ZERO),
            }
        }
        wake.map_or(Notice::Events, |ms| Notice::Wake(Duration::from_millis(ms)))
    }

    /// The runs whose transcripts a notification says grew.
    pub fn transcripts(payload: &str) -> impl Iterator<Item = RunId> + '_ {
        payload.split(' ').filter_map(|w| w.strip_prefix('l')).filter_map(|r| r.parse().ok())
    }
}

/// Who makes a change, for the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    User(UserId),
    /// A token acting without a user (a bootstrap or automation token), by its `jti`.
    Token(uuid::Uuid),
    Host(HostId),
    /// An engine process, by its id.
    Engine(String),
    Github,
    System,
}

impl Actor {
    /// `kind:id`, as recorded in `created_by`/`decided_by` columns.
    pub fn label(&self) -> String {
        format!("{}:{}", self.kind(), self.id())
    }

    fn kind(&self) -> &'static str {
        match self {
            Actor::User(_) => "user",
            Actor::Token(_) => "token",
            Actor::Host(_) => "host",
            Actor::Engine(_) => "engine",
            Actor::Github => "github",
            Actor::System => "system",
        }
    }

    fn id(&self) -> String {
        match self {
            Actor::User(id) => id.to_string(),
            Actor::Token(jti) => jti.to_string(),
            Actor::Host(id) => id.to_string(),
            Actor::Engine(id) => id.clone(),
            Actor::Github => "github".into(),
            Actor::System => "system".into(),
        }
    }
}

/// A run's next event number before it was read (numbers start at 1).
const SEQ_UNREAD: i64 = 0;

fn unread(run: RunId) -> StoreError {
    StoreError::Invalid(format!("event on {run} locked by `lock_run_quietly`: lock it with `lock_run` first"))
}

/// A run locked in this change, with the sequence number its next event takes.
#[derive(Debug, Clone)]
pub struct RunCtx {
    pub org: OrgId,
    pub project: ProjectId,
    pub run: RunId,
    /// The run's `created_at`: its journal's partition key.
    created_at: DateTime<Utc>,
    /// [`SEQ_UNREAD`] until read: a change that writes no event of the run never reads it.
    next_seq: i64,
    /// The run's workflow version and stored trace context, for the event log.
    version: Option<i32>,
    traceparent: Option<String>,
}

/// One transaction of the write path.
pub struct Change {
    pub(super) tx: Tx,
    /// For the trailing events notice after commit (`EventsNotice`).
    pool: Db,
    /// Runs whose transcripts grew (`l<run>` in the notification).
    transcripts: Vec<RunId>,
    pub(super) actor: Actor,
    runs: HashMap<RunId, RunCtx>,
    /// The smallest delay of a wake written for another process to see.
    notify_delay: Option<Duration>,
    events: Vec<PendingEvent>,
    audits: Vec<PendingAudit>,
    /// Rows of runs locked by `lock_runs`, until this change writes them.
    rows: HashMap<RunId, RunRow>,
    /// Admission lines that runs ended in this change free room in or leave (org, queue,
    /// whether the run was in that line), handed on at commit (`admission::release`).
    pub(super) releases: Vec<(OrgId, String, bool)>,
    /// The trace context of what makes this change (a webhook delivery, an API request): runs
    /// it creates store it (`runs::submit`).
    pub(super) trace: Option<TraceParent>,
    /// The events written, kept after the insert for the event log (`event_log::emit`).
    written: Vec<PendingEvent>,
    /// What metrics count of this change, counted once it has committed.
    pub(super) tally: crate::metrics::Tally,
    /// What became of the webhook delivery this change ingests, written by the commit's last
    /// statement (`finish_delivery`).
    delivery_outcome: Option<DeliveryOutcome>,
    /// Admission's gates, read by a trigger event's insert for the run it opens next.
    pub(super) gates_ahead: Option<ReadAhead>,
}

/// A delivery's outcome and detail, for `github_deliveries`.
struct DeliveryOutcome {
    id: String,
    outcome: String,
    detail: Value,
}

struct PendingEvent {
    org: OrgId,
    project: ProjectId,
    run: RunId,
    run_created_at: DateTime<Utc>,
    seq: i64,
    kind: String,
    step: Option<StepId>,
    node: Option<String>,
    attrs: Value,
    version: Option<i32>,
    traceparent: Option<String>,
    extra: Extra,
}

struct PendingAudit {
    org: OrgId,
    project: Option<ProjectId>,
    action: String,
    target_kind: String,
    target_id: String,
    detail: Value,
}

impl Change {
    pub async fn begin(pool: &Db, actor: Actor) -> Result<Change> {
        Ok(Change {
            tx: pool.begin().await?,
            pool: pool.clone(),
            transcripts: Vec::new(),
            actor,
            runs: HashMap::new(),
            notify_delay: None,
            events: Vec::new(),
            audits: Vec::new(),
            rows: HashMap::new(),
            releases: Vec::new(),
            trace: None,
            written: Vec::new(),
            tally: crate::metrics::Tally::default(),
            delivery_outcome: None,
            gates_ahead: None,
        })
    }

    /// Stores what became of the webhook delivery this change ingests (recorded by
    /// `triggers::record_delivery`). Written at commit, in the statement that inserts the
    /// change's events when it has any: a round trip fewer for a delivery that opens a run.
    pub fn finish_delivery(&mut self, id: &str, outcome: &str, detail: Value) {
        self.delivery_outcome = Some(DeliveryOutcome { id: super::cap(id), outcome: super::cap(outcome), detail });
    }

    pub fn actor(&self) -> &Actor {
        &self.actor
    }

    /// Gives the trace context of what makes this change (the current span of a webhook
    /// delivery or an API request): the runs it creates store it, and their steps' spans join
    /// that trace.
    pub fn set_trace(&mut self, trace: Option<TraceParent>) {
        self.trace = trace;
    }

    /// Locks the run's row for the rest of the transaction. Returns `None` when it does not
    /// exist in `org` (tenancy: a run of another org is simply not found).
    ///
    /// Run locks are `FOR NO KEY UPDATE`: they exclude every other writer of the run, but not
    /// the key-share lock a foreign key takes, so a change may write a wake for a run another
    /// change holds (a parent, a child, the head of an admission line) without waiting for it,
    /// and a change holding a queue's lock never waits on a run's (`store::admission`).
    pub async fn lock_run(&mut self, org: OrgId, run: RunId) -> Result<Option<RunCtx>> {
        let Some(ctx) = self.lock_run_quietly(org, run).await? else { return Ok(None) };
        if ctx.next_seq == SEQ_UNREAD {
            self.read_next_seqs(&[run]).await?;
        }
        Ok(self.runs.get(&run).cloned())
    }

    /// Locks the run's row as [`lock_run`](Change::lock_run) does, without reading where its
    /// events stand (a statement that costs more than the lock): for a change that writes none
    /// of its events unless it calls [`lock_run`](Change::lock_run) first, such as a session
    /// report recording spend.
    pub async fn lock_run_quietly(&mut self, org: OrgId, run: RunId) -> Result<Option<RunCtx>> {
        if let Some(ctx) = self.runs.get(&run) {
            return Ok(Some(ctx.clone()));
        }
        let found: Option<(ProjectId, DateTime<Utc>, i32, Option<String>)> =
            sqlx::query_as("SELECT project_id, created_at, workflow_version, traceparent FROM runs WHERE run_id = $1 AND org_id = $2 FOR NO KEY UPDATE")
                .bind(run)
                .bind(org)
                .fetch_optional(&mut *self.tx)
                .await?;
        let Some((project, created_at, version, traceparent)) = found else { return Ok(None) };
        let ctx = RunCtx { org, project, run, created_at, next_seq: SEQ_UNREAD, version: Some(version), traceparent };
        self.runs.insert(run, ctx.clone());
        Ok(Some(ctx))
    }

    /// Locks many runs at once, in id order so that two batches never deadlock. Runs of
    /// unknown ids are left out.
    pub async fn lock_runs(&mut self, runs: &[RunId]) -> Result<Vec<RunCtx>> {
        self.lock_runs_with(runs, "FOR NO KEY UPDATE").await
    }

    /// As [`Change::lock_runs`], but skips runs another transaction holds (an engine advancing
    /// them): a host's claim takes what it can now rather than queue behind an engine.
    pub async fn try_lock_runs(&mut self, runs: &[RunId]) -> Result<Vec<RunCtx>> {
        self.lock_runs_with(runs, "FOR NO KEY UPDATE SKIP LOCKED").await
    }

    async fn lock_runs_with(&mut self, runs: &[RunId], lock: &str) -> Result<Vec<RunCtx>> {
        let ids: Vec<uuid::Uuid> = runs.iter().filter(|r| !self.runs.contains_key(r)).map(|r| r.0).collect();
        let sql = format!("SELECT {} FROM runs WHERE run_id = ANY($1) ORDER BY run_id {lock}", super::run_rows::RUN_COLUMNS);
        let rows: Vec<RunRow> = sqlx::query_as(&sql).bind(&ids).fetch_all(&mut *self.tx).await?;
        let locked: Vec<RunId> = rows.iter().map(|r| r.run_id).collect();
        for row in rows {
            let run = row.run_id;
            let (version, traceparent) = (Some(row.workflow_version), row.traceparent.clone());
            self.runs.insert(run, RunCtx { org: row.org_id, project: row.project_id, run, created_at: row.created_at, next_seq: 1, version, traceparent });
            self.rows.insert(run, row);
        }
        self.read_next_seqs(&locked).await?;
        Ok(runs.iter().filter_map(|r| self.runs.get(r).cloned()).collect())
    }

    /// The row of a run as `lock_runs` read it, while no write of this change has changed it.
    pub(super) fn run_row(&self, run: RunId) -> Option<&RunRow> {
        self.rows.get(&run)
    }

    /// Called by every write to a run's row, so `run_row` never answers with a stale copy.
    pub(super) fn forget_run_row(&mut self, run: RunId) {
        self.rows.remove(&run);
    }

    /// Reads where each locked run's event sequence stands. Every writer of a run's events
    /// holds its row lock, and this statement's snapshot is taken after the lock was granted,
    /// so it sees the last holder's events and the next number is free.
    async fn read_next_seqs(&mut self, runs: &[RunId]) -> Result<()> {
        if runs.is_empty() {
            return Ok(());
        }
        let ids: Vec<uuid::Uuid> = runs.iter().map(|r| r.0).collect();
        // One primary-key probe per run (its last event, in its run's partition), whatever the
        // table's statistics say: `run_id = ANY($1) GROUP BY run_id` was planned as a scan of
        // every event.
        let last: Vec<(RunId, Option<i64>)> = sqlx::query_as(
            "SELECT r.run_id, (SELECT seq FROM run_events e WHERE e.run_id = r.run_id AND e.run_created_at = r.created_at ORDER BY seq DESC LIMIT 1) \
             FROM runs r WHERE r.run_id = ANY($1::uuid[])",
        )
        .bind(&ids)
        .fetch_all(&mut *self.tx)
        .await?;
        for (run, seq) in last {
            if let Some(ctx) = self.runs.get_mut(&run) {
                ctx.next_seq = seq.map_or(1, |s| s + 1);
            }
        }
        Ok(())
    }

    /// Registers a run created in this transaction as locked (its row is new, so no one else
    /// can see it until commit).
    pub(super) fn adopt_new_run(
        &mut self, org: OrgId, project: ProjectId, run: RunId, created_at: DateTime<Utc>, version: i32, traceparent: Option<String>,
    ) -> RunCtx {
        let ctx = RunCtx { org, project, run, created_at, next_seq: 1, version: Some(version), traceparent };
        self.runs.insert(run, ctx.clone());
        ctx
    }

    /// The stored trace context of a run this change holds.
    pub(super) fn traceparent_of(&self, run: RunId) -> Option<&str> {
        self.runs.get(&run).and_then(|c| c.traceparent.as_deref())
    }

    pub(super) fn locked(&self, run: RunId) -> Result<&RunCtx> {
        self.runs.get(&run).ok_or_else(|| StoreError::Invalid(format!("write to {run} without its row lock")))
    }

    /// The sequence number the next event of `run` will take.
    pub(super) fn peek_seq(&self, run: RunId) -> Result<i64> {
        let ctx = self.locked(run)?;
        if ctx.next_seq == SEQ_UNREAD {
            return Err(unread(run));
        }
        Ok(ctx.next_seq)
    }

    /// Appends a run event; returns its sequence number. Events are written together at
    /// commit (one statement for all of them), since nothing reads them back in the change.
    pub(super) fn event(&mut self, run: RunId, kind: &str, step: Option<(StepId, &str)>, attrs: Value) -> Result<i64> {
        let ctx = self.runs.get_mut(&run).ok_or_else(|| StoreError::Invalid(format!("event on {run} without its row lock")))?;
        if ctx.next_seq == SEQ_UNREAD {
            return Err(unread(run));
        }
        let seq = ctx.next_seq;
        ctx.next_seq += 1;
        let (org, project, run_created_at) = (ctx.org, ctx.project, ctx.created_at);
        let (version, traceparent) = (ctx.version, ctx.traceparent.clone());
        self.events.push(PendingEvent {
            org,
            project,
            run,
            run_created_at,
            seq,
            kind: kind.to_owned(),
            step: step.map(|s| s.0),
            node: step.map(|s| s.1.to_owned()),
            attrs,
            version,
            traceparent,
            extra: Extra::default(),
        });
        Ok(seq)
    }

    /// Adds facts the event log carries but the stored event does not (a duration, the git refs
    /// of a step's output) to the event just appended.
    pub(super) fn event_extra(&mut self, extra: Extra) {
        if let Some(e) = self.events.last_mut() {
            e.extra = extra;
        }
    }

    /// Writes an audit entry for this change's actor (at commit, with the others).
    pub(super) fn audit(&mut self, org: OrgId, project: Option<ProjectId>, action: &str, target: (&str, String), detail: Value) -> Result<()> {
        self.audits.push(PendingAudit { org, project, action: action.to_owned(), target_kind: target.0.to_owned(), target_id: target.1, detail });
        Ok(())
    }

    /// The audit entry of a move of a step or a run, which the move's run event also records.
    /// An engine's moves are not copied into the audit log: the event names the engine
    /// (`run_events.actor`), and the audit view reads them from the journal
    /// (`run_events_engine_moves`). Every other actor's move is audited here as any action is.
    pub(super) fn audit_move(&mut self, org: OrgId, project: Option<ProjectId>, action: &str, target: (&str, String), detail: Value) -> Result<()> {
        if matches!(self.actor, Actor::Engine(_)) {
            return Ok(());
        }
        self.audit(org, project, action, target, detail)
    }

    /// Writes a wake for `run` (and `step`) due after `delay`. `tell_others` says whether
    /// another process must learn of it: false only when this process will act on it itself
    /// right after commit.
    pub(crate) async fn wake(&mut self, run: RunId, step: Option<StepId>, delay: Duration, reason: &str, tell_others: bool) -> Result<()> {
        let org = self.locked(run)?.org;
        sqlx::query(
            "INSERT INTO wakes (org_id, run_id, step_id, due_at, reason) \
             VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond', $5)",
        )
        .bind(org)
        .bind(run)
        .bind(step)
        .bind(delay.as_millis() as f64)
        .bind(reason)
        .execute(&mut *self.tx)
        .await?;
        if tell_others {
            self.notify_delay = Some(self.notify_delay.map_or(delay, |d| d.min(delay)));
        }
        Ok(())
    }

    /// Records that a statement of the store wrote a wake another process must learn of.
    pub(super) fn note_wake(&mut self, delay: Duration) {
        self.notify_delay = Some(self.notify_delay.map_or(delay, |d| d.min(delay)));
    }

    /// Writes a wake for a run this change has not locked (a parent or child run), which is
    /// always for another process to act on.
    pub(super) async fn wake_other(&mut self, org: OrgId, run: RunId, reason: &str) -> Result<()> {
        sqlx::query("INSERT INTO wakes (org_id, run_id, due_at, reason) VALUES ($1, $2, now(), $3)")
            .bind(org)
            .bind(run)
            .bind(reason)
            .execute(&mut *self.tx)
            .await?;
        self.notify_delay = Some(Duration::ZERO);
        Ok(())
    }

    /// Asks every listener to look again without writing a wake (a host may claim a step
    /// that became ready).
    pub(crate) fn notify_now(&mut self) {
        self.notify_delay = Some(Duration::ZERO);
    }

    /// Tells the live transcripts that `run`'s grew, in this change's notification.
    pub(crate) fn notify_transcript(&mut self, run: RunId) {
        if !self.transcripts.contains(&run) {
            self.transcripts.push(run);
        }
    }

    /// The transaction, for reads that must see this change's own writes.
    pub fn conn(&mut self) -> &mut sqlx::PgConnection {
        &mut self.tx
    }
}
