//! The engine pool: one process's loop that claims due wakes and advances runs.
//!
//! Nothing polls. The loop sleeps until one of: a notification on the `LISTEN` connection
//! (payload: milliseconds until the wake it announces), the timer for the earliest future wake
//! it knows of, the completion of a step it executes, or a signal. When woken it claims due
//! wakes with `FOR UPDATE SKIP LOCKED` in batches, locks their runs in id order, advances each
//! in the same transaction and commits once. After a batch that was not full it asks for the
//! earliest future wake and sets its timer, so an idle pool sends no statement at all.
//!
//! **Invariant:** no transaction is open while a step executes; a step's work is bracketed by
//! a lease taken in one commit and a fenced completion in another.
//!
//! # Wakes and leases
//!
//! A wake is "look at run R (step S) at or after T". Causes: a run created (`advance`), an
//! approval answered, a step ready after a backoff (`execute`), a lease that may have lapsed
//! (`lease_expiry`, 30 s lease + 15 s grace), a timeout or a wait's end (`timeout`), a child run
//! ended (`child_done`), a parent gone (`parent_gone`), a dry run's retention (`retention`), a
//! webhook that may decide a waiting gate or event wait (`github:checks`,
//! `github:pull_request.closed`, … written by the ingest for the steps in `github_watches`).
//! A run in an admission line is woken (`admit`) by what frees room for it: a run of its queue
//! ending, the run ahead of it admitted with room left, a gate opening, its throttle's window
//! (a wake at that time for the head of the line), or a budget's period ending.
//! A schedule's next tick is not a wake row (a wake names a run): it is the `next_at` of its
//! `schedules` row, which engines claim and time exactly like wakes. Nor is a job (a webhook
//! delivery, a project's retention sweep): a `jobs` row, claimed by moving its due time a lease
//! (60 s) ahead, worked outside any transaction, then rescheduled or deleted.
//! Claimed wakes are deleted in the transaction that acts on them. Heartbeats only move
//! `lease_expires_at` (a host's session reports do too); when the `lease_expiry` wake fires on a
//! renewed lease it is written again for the new expiry.
//!
//! Fencing: a holder's completion is `UPDATE … WHERE step_id = $1 AND state = 'running' AND
//! holder = $me`; zero rows means the step was recovered or cancelled and the result is dropped.
//! A recovered step fails with `lease_expired` (an infrastructure failure) and the walker starts
//! a new attempt as a new step row.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::db::Db;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::advance::{self, Engine, ToExecute, Wake};
use crate::catalog::Catalog;
use crate::executor::TestExecutor;
use crate::github::{Executed, OutputExecutor};
use crate::ids::{RunId, StepId};
use crate::listen::{Backoff, Listener, Target};
use crate::state::StepState;
use crate::store::engine_errors::{is_logic_error, run_local};
use crate::store::steps::{self, Failure};
use crate::store::{Actor, Change, NOTIFY_CHANNEL, Notice, StoreError, engine_errors};

mod record;

use record::{Done, RecordCtx, Recorded, record};

/// How often a holder renews the lease of a step it executes.
pub const HEARTBEAT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// This process's id in leases and audit entries.
    pub id: String,
    /// Where the `LISTEN` connection goes, with its keepalives: a direct URL (a transaction
    /// pooler cannot `LISTEN`).
    pub listen: Target,
    /// Wakes claimed per transaction.
    pub batch: i64,
    /// Steps executed at once by this process.
    pub max_in_flight: usize,
    /// How long the first SIGTERM waits for held work before exiting.
    pub drain: Duration,
    pub test_executor: Option<TestExecutor>,
    /// Executes output steps on GitHub (the GitHub App is configured).
    pub outputs: Option<OutputExecutor>,
    /// Sends outgoing webhook deliveries, to the targets its policy allows.
    pub webhooks: crate::jobs::WebhookClient,
    /// How long an event wait without a `timeout:` waits (`advance::EVENT_WAIT_TIMEOUT`).
    pub event_wait_timeout: Duration,
}

/// Recording transactions in flight at once.
const RECORDERS: usize = 4;

struct Pool {
    db: Db,
    cfg: PoolConfig,
    holder: String,
    catalog: Arc<Catalog>,
    tasks: JoinSet<()>,
    done_tx: mpsc::UnboundedSender<Done>,
    /// Completions that could not be recorded yet (the database was away).
    unrecorded: Vec<Done>,
    /// Transactions recording completions, run side by side: round trips, not the
    /// database, bound one transaction's pace, and completions that arrive while these are
    /// in flight gather into the next batch.
    recorders: JoinSet<Recorded>,
    /// Set on the first drain signal: recording what it holds must not lease it more work.
    draining: bool,
    /// Cancelled when the drain begins; a claim checks it before it commits.
    drain: CancellationToken,
}

/// Runs the loop until `drain` is cancelled and held work is done (or the drain time is up),
/// or until `abort` is cancelled.
pub async fn run(db: Db, cfg: PoolConfig, drain: CancellationToken, abort: CancellationToken) -> Result<(), StoreError> {
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let holder = format!("engine:{}", cfg.id);
    let mut pool = Pool {
        db,
        cfg,
        holder,
        catalog: Arc::new(Catalog::default()),
        tasks: JoinSet::new(),
        done_tx,
        unrecorded: Vec::new(),
        recorders: JoinSet::new(),
        draining: false,
        drain: drain.clone(),
    };
    let mut listener = Listener::new(&pool.cfg.listen, NOTIFY_CHANNEL);
    let mut backoff = Backoff::default();
    let mut scan = true;
    let mut timer: Option<Instant> = None;
    // A failed claim is tried again at this time, while the loop goes on listening: a lost
    // `LISTEN` is noticed and subscribed again at once, not after the claims' backoff.
    let mut claim_retry: Option<Instant> = None;
    let mut drain_deadline: Option<Instant> = None;

    loop {
        while pool.tasks.try_join_next().is_some() {}
        if drain_deadline.is_none() && drain.is_cancelled() {
            tracing::info!(held = pool.tasks.len(), drain_s = pool.cfg.drain.as_secs(), "draining: no new claims");
            drain_deadline = Some(Instant::now() + pool.cfg.drain);
            pool.draining = true;
        }
        let draining = drain_deadline.is_some();
        if !listener.is_subscribed() && !draining {
            // Subscribe before looking for work, so nothing committed meanwhile is missed.
            match listener.subscribe().await {
                // Then one look for what was missed, at once.
                Ok(()) => {
                    scan = true;
                    claim_retry = None;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "engine cannot LISTEN; retrying");
                    if backoff.pause(&abort).await {
                        return Ok(());
                    }
                    continue;
                }
            }
        }
        if !pool.unrecorded.is_empty() && pool.recorders.len() < RECORDERS {
            let batch = std::mem::take(&mut pool.unrecorded);
            pool.start_recording(batch);
        }
        if scan && claim_retry.is_none() && !draining && pool.tasks.len() < pool.cfg.max_in_flight {
            match pool.claim_due().await {
                Ok((next, more)) => {
                    // Stopped because every slot is taken: look again when one frees.
                    scan = more;
                    backoff.reset();
                    timer = next.map(|d| Instant::now() + d);
                }
                Err(e) => {
                    let wait = backoff.wait();
                    tracing::warn!(error = %e, retry_in_s = wait.as_secs(), "cannot claim wakes; retrying");
                    claim_retry = Some(Instant::now() + wait);
                }
            }
        }
        if draining && pool.tasks.is_empty() && pool.unrecorded.is_empty() && pool.recorders.is_empty() {
            tracing::info!("drained; exiting");
            return Ok(());
        }

        tokio::select! {
            biased;
            () = abort.cancelled() => return Ok(()),
            // Wakes the loop, whose top marks the drain.
            () = drain.cancelled(), if !draining => {}
            () = sleep_until(drain_deadline), if draining => {
                tracing::warn!(held = pool.tasks.len(), "drain time is up; leases will be recovered");
                return Ok(());
            }
            Some(done) = done_rx.recv(), if pool.recorders.len() < RECORDERS => {
                let mut batch = vec![done];
                while batch.len() < pool.cfg.batch as usize {
                    match done_rx.try_recv() {
                        Ok(d) => batch.push(d),
                        Err(_) => break,
                    }
                }
                pool.start_recording(batch);
            }
            Some(joined) = pool.recorders.join_next(), if !pool.recorders.is_empty() => match joined {
                Ok(Recorded { result: Ok(jobs), .. }) => {
                    backoff.reset();
                    pool.spawn(jobs);
                }
                Ok(Recorded { batch, result: Err(e) }) => {
                    tracing::warn!(error = %e, "cannot record step completions; retrying");
                    pool.unrecorded.extend(batch);
                    if backoff.pause(&abort).await {
                        return Ok(());
                    }
                }
                Err(e) => tracing::error!(error = %e, "a recording task panicked; its steps will be recovered by lease expiry"),
            },
            Some(_) = pool.tasks.join_next(), if !pool.tasks.is_empty() => {}
            n = listener.recv() => match n {
                Ok(payload) => match Notice::parse(&payload) {
                    Notice::Wake(delay) if delay.is_zero() => scan = true,
                    Notice::Wake(delay) => {
                        let at = Instant::now() + delay;
                        timer = Some(timer.map_or(at, |t| t.min(at)));
                    }
                    Notice::Events => {}
                },
                Err(e) => {
                    // Notifications may have been missed: the loop subscribes again first, then
                    // rescans once.
                    tracing::warn!(error = %e, "LISTEN connection lost; reconnecting, then rescanning once");
                    scan = true;
                }
            },
            () = sleep_until(timer), if timer.is_some() => {
                timer = None;
                scan = true;
            }
            () = sleep_until(claim_retry), if claim_retry.is_some() => {
                claim_retry = None;
                scan = true;
            }
        }
    }
}

impl Pool {
    fn engine(&self) -> Engine<'_> {
        Engine {
            holder: &self.holder,
            catalog: &self.catalog,
            executes_leased_steps: self.cfg.test_executor.is_some(),
            executes_outputs: self.cfg.outputs.is_some(),
            draining: self.draining,
            event_wait_timeout: self.cfg.event_wait_timeout,
        }
    }

    /// Claims and handles due wakes until a batch comes back short or every execution slot is
    /// taken; returns the delay until the earliest future wake, and whether it stopped for
    /// want of slots (so more may be due).
    async fn claim_due(&mut self) -> Result<(Option<Duration>, bool), StoreError> {
        // Wakes first, so that nothing stands between a notification and the claim of the wake
        // it announces; then schedule ticks (the runs they open announce their own wakes) and
        // jobs, on every scan, so that a busy pool still fires them.
        let more = self.claim_wakes().await?;
        if self.drain.is_cancelled() {
            // A draining engine starts nothing new.
            return Ok((None, false));
        }
        loop {
            let fired = crate::store::schedules::fire_due(&self.db, Actor::Engine(self.cfg.id.clone()), self.cfg.batch).await?;
            if fired.schedules < self.cfg.batch as usize {
                break;
            }
        }
        self.claim_jobs().await?;
        Ok(if more { (None, true) } else { (self.next_due().await?, false) })
    }

    /// Claims and advances due wakes in batches until one comes back short (false) or every
    /// execution slot is taken (true: more may be due).
    async fn claim_wakes(&mut self) -> Result<bool, StoreError> {
        loop {
            // Finished executions stay in the set until reaped; they hold no slot.
            while self.tasks.try_join_next().is_some() {}
            let room = (self.cfg.max_in_flight.saturating_sub(self.tasks.len())).max(1) as i64;
            let limit = self.cfg.batch.min(room);
            let mut ch = Change::begin(&self.db, Actor::Engine(self.cfg.id.clone())).await?;
            // With each wake, how late it is claimed (seconds past its due time), for the metrics.
            let claimed: Vec<(RunId, Option<StepId>, String, f64, i64)> = sqlx::query_as(
                "DELETE FROM wakes w USING (SELECT wake_id FROM wakes WHERE due_at <= now() ORDER BY due_at LIMIT $1 FOR UPDATE SKIP LOCKED) d \
                 WHERE w.wake_id = d.wake_id RETURNING w.run_id, w.step_id, w.reason, extract(epoch FROM clock_timestamp() - w.due_at)::float8, w.wake_id",
            )
            .bind(limit)
            .fetch_all(ch.conn())
            .await?;
            let n = claimed.len() as i64;
            let mut by_run: BTreeMap<RunId, Vec<Wake>> = BTreeMap::new();
            let mut wake_ids: BTreeMap<RunId, Vec<i64>> = BTreeMap::new();
            let lateness: Vec<f64> = claimed.iter().map(|c| c.3).collect();
            for (run, step, reason, _, id) in claimed {
                by_run.entry(run).or_default().push(Wake { step, reason });
                wake_ids.entry(run).or_default().push(id);
            }
            let advanced = self.advance_all(&mut ch, &by_run).await;
            let Some(advanced) = self.commit_advance(ch, advanced).await else { return Ok(false) };
            let jobs = match advanced {
                Ok(jobs) => {
                    crate::metrics::wakes_claimed(&lateness);
                    jobs
                }
                Err(e) if run_local(&e) => {
                    // One run's trouble: the batch's claim was undone with it, and each run is
                    // claimed and advanced again on its own.
                    tracing::warn!(error = %e, "a batch failed on one of its runs; advancing them one by one");
                    self.advance_one_by_one(&by_run, &wake_ids).await?
                }
                Err(e) => return Err(e),
            };
            self.spawn(jobs);
            if self.tasks.len() >= self.cfg.max_in_flight && n == limit {
                return Ok(true);
            }
            if n < limit {
                return Ok(false);
            }
        }
    }

    /// Commits the change an advance wrote, or drops it (`None`) when the drain began while the
    /// advance ran (SIGTERM, or the loop had not looked yet): what it took goes back untouched,
    /// for another engine, since a draining engine starts nothing new. The commit is part of the
    /// advance: the journal's rows are written by it, and a run whose rows the database refuses
    /// there is one run's trouble like any other. A failed advance's change is dropped (rolled
    /// back) here, before the caller deals with the error.
    async fn commit_advance(&self, ch: Change, advanced: Result<Vec<ToExecute>, StoreError>) -> Option<Result<Vec<ToExecute>, StoreError>> {
        match advanced {
            Ok(_) if self.drain.is_cancelled() => None,
            Ok(jobs) => Some(ch.commit().await.map(|()| jobs)),
            Err(e) => Some(Err(e)),
        }
    }

    async fn advance_all(&self, ch: &mut Change, by_run: &BTreeMap<RunId, Vec<Wake>>) -> Result<Vec<ToExecute>, StoreError> {
        let ids: Vec<RunId> = by_run.keys().copied().collect();
        ch.lock_runs(&ids).await?;
        let engine = self.engine();
        let mut jobs = Vec::new();
        for (run, wakes) in by_run {
            jobs.extend(advance::advance(ch, &engine, *run, wakes).await?);
        }
        Ok(jobs)
    }

    /// After a batch failed on one run, each run is claimed again (its wakes, unless another
    /// engine took them meanwhile) and advanced alone; a run that fails alone is recorded by
    /// `store::engine_errors` (its wakes back with a backoff, or the run failed `engine_error`)
    /// and the others go on.
    async fn advance_one_by_one(&self, by_run: &BTreeMap<RunId, Vec<Wake>>, wake_ids: &BTreeMap<RunId, Vec<i64>>) -> Result<Vec<ToExecute>, StoreError> {
        let mut jobs = Vec::new();
        for (run, wakes) in by_run {
            let ids = wake_ids.get(run).map(Vec::as_slice).unwrap_or_default();
            let mut ch = Change::begin(&self.db, Actor::Engine(self.cfg.id.clone())).await?;
            let taken: i64 = sqlx::query_scalar(
                "WITH d AS (DELETE FROM wakes WHERE wake_id IN (SELECT wake_id FROM wakes WHERE wake_id = ANY($1) FOR UPDATE SKIP LOCKED) \
                 RETURNING 1) SELECT count(*) FROM d",
            )
            .bind(ids)
            .fetch_one(ch.conn())
            .await?;
            if taken == 0 {
                continue;
            }
            let advanced = async {
                ch.lock_runs(&[*run]).await?;
                advance::advance(&mut ch, &self.engine(), *run, wakes).await
            }
            .await;
            let Some(advanced) = self.commit_advance(ch, advanced).await else { return Ok(jobs) };
            match advanced {
                Ok(more) => jobs.extend(more),
                Err(e) if run_local(&e) => {
                    let wakes: Vec<(Option<StepId>, String)> = wakes.iter().map(|w| (w.step, w.reason.clone())).collect();
                    let outcome = engine_errors::record(&self.db, Actor::Engine(self.cfg.id.clone()), *run, &wakes, &e.to_string(), is_logic_error(&e)).await?;
                    tracing::error!(run.id = %run, error = %e, outcome = ?outcome, "cannot advance run");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(jobs)
    }

    /// Claims due jobs (webhook deliveries, retention sweeps: `crate::jobs`) and runs them
    /// beside the steps, outside any transaction.
    async fn claim_jobs(&mut self) -> Result<(), StoreError> {
        for job in crate::store::jobs::claim_due(&self.db, self.cfg.batch).await? {
            let (db, id, webhooks) = (self.db.clone(), self.cfg.id.clone(), self.cfg.webhooks.clone());
            self.tasks.spawn(async move { crate::jobs::run(&db, &webhooks, &id, job).await });
        }
        Ok(())
    }

    /// The delay until the earliest wake, schedule tick or job falls due: one statement, each
    /// minimum read from its table's due-time index.
    async fn next_due(&self) -> Result<Option<Duration>, StoreError> {
        let ms: Option<f64> = sqlx::query_scalar(
            "SELECT (extract(epoch FROM least((SELECT min(due_at) FROM wakes), \
                                              (SELECT min(next_at) FROM schedules WHERE next_at < 'infinity'), \
                                              (SELECT min(due_at) FROM jobs)) - now()) * 1000)::float8",
        )
        .fetch_one(&self.db)
        .await?;
        Ok(ms.map(|ms| Duration::from_millis(ms.max(0.0).ceil() as u64)))
    }

    /// Runs each leased step outside any transaction, renewing its lease while it runs.
    fn spawn(&mut self, jobs: Vec<ToExecute>) {
        for job in jobs {
            let (db, holder, tx) = (self.db.clone(), self.holder.clone(), self.done_tx.clone());
            // Outputs go to GitHub when the App is configured; everything else (and outputs
            // without it) to the test executor. A step neither can run was not leased.
            let outputs = self.cfg.outputs.clone().filter(|_| job.kind == "output");
            let test = self.cfg.test_executor.clone();
            let catalog = self.catalog.clone();
            if outputs.is_none() && test.is_none() {
                continue;
            }
            // The execution's span, child of the run's trace (`crate::trace`).
            let span = crate::trace::step_span(job.traceparent.as_deref(), job.run, job.step, &job.node, &job.kind, job.attempt);
            let in_span = span.clone();
            self.tasks.spawn(tracing::Instrument::instrument(
                async move {
                    let work = {
                        let (job, holder, db) = (job.clone(), holder.clone(), db.clone());
                        async move {
                            match (outputs, test) {
                                (Some(out), _) => out.execute(&db, &catalog, &job).await,
                                (None, Some(test)) => Executed::from(test.execute(&db, &job, &holder).await),
                                (None, None) => Executed::Failed(Failure::new("no executor", steps::FailureClass::Infrastructure)),
                            }
                        }
                    };
                    tokio::pin!(work);
                    let mut beat = tokio::time::interval_at(Instant::now() + HEARTBEAT, HEARTBEAT);
                    let past_timeout = tokio::time::sleep(job.timeout);
                    tokio::pin!(past_timeout);
                    let result = loop {
                        tokio::select! {
                            r = &mut work => break r,
                            // The step's timeout wake fails it; its work stops here, so that a
                            // retry never runs beside it.
                            () = &mut past_timeout => {
                                tracing::info!(step.id = %job.step, "step past its timeout; stopping");
                                return;
                            }
                            _ = beat.tick() => {
                                match steps::heartbeat(&db, job.org, job.step, &holder).await {
                                    Ok(StepState::Leased | StepState::Running) => {}
                                    Ok(state) => {
                                        tracing::info!(step.id = %job.step, %state, "step moved on under its holder; stopping");
                                        return;
                                    }
                                    Err(e) => tracing::warn!(step.id = %job.step, error = %e, "lease renewal failed"),
                                }
                            }
                        }
                    };
                    let (outcome, reason) = match &result {
                        Executed::Succeeded(_) => ("succeeded", None),
                        Executed::Failed(f) => ("failed", Some(f.reason.as_str())),
                        Executed::Deferred { reason, .. } => ("deferred", Some(reason.as_str())),
                    };
                    crate::trace::record_outcome(&span, outcome, reason);
                    // The receiver only goes away when the loop exits; then recovery takes over.
                    let _ = tx.send(Done { job, result });
                },
                in_span,
            ));
        }
    }

    /// Records finished executions in a transaction of their own, beside the loop.
    fn start_recording(&mut self, batch: Vec<Done>) {
        let ctx = RecordCtx {
            db: self.db.clone(),
            id: self.cfg.id.clone(),
            holder: self.holder.clone(),
            catalog: self.catalog.clone(),
            executes: self.cfg.test_executor.is_some(),
            outputs: self.cfg.outputs.is_some(),
            draining: self.draining,
            event_wait_timeout: self.cfg.event_wait_timeout,
        };
        self.recorders.spawn(async move {
            let result = record(&ctx, &batch).await;
            Recorded { batch, result }
        });
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
