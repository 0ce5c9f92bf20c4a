//! Recording what the pool's executions came back with: each step's result fenced by its
//! holder and its run advanced, a batch in one transaction, and a batch that fails on one of
//! its runs recorded run by run, so that no run's result waits on another's fault.

use std::sync::Arc;
use std::time::Duration;

use crate::advance::{self, Engine, ToExecute};
use crate::catalog::Catalog;
use crate::db::Db;
use crate::github::Executed;
use crate::ids::RunId;
use crate::store::engine_errors::{self, is_logic_error, run_local};
use crate::store::steps;
use crate::store::{Actor, Change, StoreError};

/// A step execution that ended, to be recorded.
pub(super) struct Done {
    pub(super) job: ToExecute,
    pub(super) result: Executed,
}

/// What a recording transaction came back with: the steps it leased to this engine, or the
/// batch to try again.
pub(super) struct Recorded {
    pub(super) batch: Vec<Done>,
    pub(super) result: Result<Vec<ToExecute>, StoreError>,
}

/// What a recording task needs of its engine.
pub(super) struct RecordCtx {
    pub(super) db: Db,
    pub(super) id: String,
    pub(super) holder: String,
    pub(super) catalog: Arc<Catalog>,
    pub(super) executes: bool,
    pub(super) outputs: bool,
    pub(super) draining: bool,
    pub(super) event_wait_timeout: Duration,
}

/// Records finished executions and advances their runs (see [`record_together`]). When the
/// batch fails on one of its runs, each is recorded alone; one that still fails has its step's
/// result recorded with a wake to advance its run later (which `advance_one_by_one` and
/// `store::engine_errors` then deal with), so that no other run's result waits on it and no
/// step is executed twice. Errors only when the database is away.
pub(super) async fn record(ctx: &RecordCtx, batch: &[Done]) -> Result<Vec<ToExecute>, StoreError> {
    match record_together(ctx, batch, true).await {
        Err(e) if run_local(&e) => tracing::warn!(error = %e, "a batch of results failed on one of its runs; recording them one by one"),
        done => return done,
    }
    let mut jobs = Vec::new();
    for done in batch {
        match record_together(ctx, std::slice::from_ref(done), true).await {
            Ok(more) => jobs.extend(more),
            Err(e) if run_local(&e) => match record_together(ctx, std::slice::from_ref(done), false).await {
                Ok(_) => tracing::error!(run.id = %done.job.run, error = %e, "cannot advance run after its step's result; it is woken to try again"),
                Err(again) if run_local(&again) => {
                    let wake = [(None, "advance".to_owned())];
                    let outcome =
                        engine_errors::record(&ctx.db, Actor::Engine(ctx.id.clone()), done.job.run, &wake, &again.to_string(), is_logic_error(&again)).await?;
                    tracing::error!(run.id = %done.job.run, error = %again, outcome = ?outcome, "cannot record a step's result");
                }
                Err(again) => return Err(again),
            },
            Err(e) => return Err(e),
        }
    }
    Ok(jobs)
}

/// Records finished executions (fenced by holder) and, with `advance`, advances their runs, in
/// one transaction; returns the steps leased to this engine on the way. Without `advance`, each
/// run gets a wake to be advanced by a later claim instead.
async fn record_together(ctx: &RecordCtx, batch: &[Done], advance: bool) -> Result<Vec<ToExecute>, StoreError> {
    let mut ch = Change::begin(&ctx.db, Actor::Engine(ctx.id.clone())).await?;
    let ids: Vec<RunId> = batch.iter().map(|d| d.job.run).collect();
    ch.lock_runs(&ids).await?;
    let mut touched: Vec<RunId> = Vec::new();
    for done in batch {
        let (run, step) = (done.job.run, done.job.step);
        let written = match &done.result {
            Executed::Succeeded(output) => steps::succeed_held(&mut ch, run, step, &ctx.holder, output).await.map(|_| ()),
            Executed::Failed(failure) => steps::fail_held(&mut ch, run, step, &ctx.holder, failure, None).await.map(|_| ()),
            Executed::Deferred { reason, delay } => steps::defer_held(&mut ch, run, step, &ctx.holder, reason, *delay).await.map(|_| ()),
        };
        match written {
            Ok(()) => touched.push(run),
            // A newer holder or a cancel got there first: this result is not ours to record.
            Err(StoreError::Stale(why)) => tracing::info!(step.id = %step, why, "dropping a stale result"),
            Err(e) => return Err(e),
        }
    }
    touched.sort();
    touched.dedup();
    let engine = Engine {
        holder: &ctx.holder,
        catalog: &ctx.catalog,
        executes_leased_steps: ctx.executes,
        executes_outputs: ctx.outputs,
        draining: ctx.draining,
        event_wait_timeout: ctx.event_wait_timeout,
    };
    let mut jobs = Vec::new();
    for run in touched {
        if advance {
            jobs.extend(advance::advance(&mut ch, &engine, run, &[]).await?);
        } else {
            ch.wake(run, None, Duration::ZERO, "advance", true).await?;
        }
    }
    ch.commit().await?;
    Ok(jobs)
}
