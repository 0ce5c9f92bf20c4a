//! A run the engine cannot advance: one bad run stays one bad run.
//!
//! When advancing a batch fails on something of one run's own (an SQL error its rows cause, a
//! row that cannot be read, a stored definition that no longer makes sense), the engine goes
//! through the batch run by run, and a run that fails alone is recorded here: its wakes come
//! back later with a backoff of their own (1 s, 4 s), counted on the run, and after
//! [`ENGINE_ERROR_LIMIT`] failures it fails with the reason `engine_error`, with an audit entry
//! that says what went wrong. The other runs keep moving meanwhile.

use std::time::Duration;

use crate::db::Db;
use serde_json::json;

use super::{Actor, Change, Result, StoreError, admission, cap, runs};
use crate::ids::{RunId, StepId};
use crate::state::run;

/// How many times advancing one run may fail before the run fails `engine_error`.
pub const ENGINE_ERROR_LIMIT: i32 = 3;

/// The reason of a run the engine could not advance (a documented failure reason).
pub const ENGINE_ERROR: &str = "engine_error";

/// What became of a run whose advance failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Its wakes are due again after this backoff.
    Retried(Duration),
    /// It failed `engine_error`.
    Failed,
}

/// Errors of a run's own logic (a bad stored definition, an impossible state): no retry mends
/// them.
pub fn is_logic_error(e: &StoreError) -> bool {
    matches!(e, StoreError::Invalid(_) | StoreError::NotFound(_) | StoreError::Conflict(_))
}

/// Whether an error belongs to the runs being advanced (their logic, or an SQL error their rows
/// cause) rather than to the database being away or busy, after which the whole batch is
/// retried later: a lost connection, a pool timeout, and the SQL errors of contention and
/// shutdown (serialization failures and deadlocks, class 40; a lock or statement timeout,
/// 55P03 and 57014; an administrator's shutdown, class 57P; too many connections, class 53;
/// connection errors, class 08).
pub fn run_local(e: &StoreError) -> bool {
    match e {
        StoreError::Sql(sqlx::Error::Database(db)) => {
            let code = db.code().unwrap_or_default();
            !(code.starts_with("40") || code.starts_with("08") || code.starts_with("53") || code.starts_with("57P") || code == "55P03" || code == "57014")
        }
        StoreError::Sql(
            sqlx::Error::ColumnDecode { .. }
            | sqlx::Error::Decode(_)
            | sqlx::Error::RowNotFound
            | sqlx::Error::ColumnNotFound(_)
            | sqlx::Error::TypeNotFound { .. },
        ) => true,
        StoreError::Sql(_) | StoreError::Sealed(_) => false,
        StoreError::Stale(_) | StoreError::Refused(_) | StoreError::Full(_) => true,
        _ => is_logic_error(e),
    }
}

/// The backoff after the `n`th failure (1-based): 1 s, 4 s, 16 s …
fn backoff(n: i32) -> Duration {
    Duration::from_secs(4u64.saturating_pow(n.saturating_sub(1).clamp(0, 8) as u32))
}

/// Records that advancing `run` (for the wakes it had, `wakes`) failed with `error`, and
/// either gives the wakes back with a backoff or, at the limit (or at once when `hopeless`:
/// a failure that no retry mends, such as a definition that cannot be read), fails the run.
pub async fn record(pool: &Db, actor: Actor, run: RunId, wakes: &[(Option<StepId>, String)], error: &str, hopeless: bool) -> Result<Outcome> {
    let detail: String = cap(error).chars().take(300).collect();
    match record_in_words(pool, actor.clone(), run, wakes, &detail, hopeless).await {
        Ok(outcome) => Ok(outcome),
        // Finishing it in words failed too (the same rows are in the way): it is failed
        // without its lifecycle event, so that it holds nothing and is not retried.
        Err(StoreError::Sql(sqlx::Error::Database(_))) | Err(StoreError::Invalid(_) | StoreError::NotFound(_)) => fail_bare(pool, actor, run, &detail).await,
        Err(e) => Err(e),
    }
}

async fn record_in_words(pool: &Db, actor: Actor, run: RunId, wakes: &[(Option<StepId>, String)], detail: &str, hopeless: bool) -> Result<Outcome> {
    let mut ch = Change::begin(pool, actor).await?;
    let Some(ctx) = ch.lock_runs(&[run]).await?.into_iter().next() else { return Ok(Outcome::Failed) };
    let failures: i32 = sqlx::query_scalar("UPDATE runs SET engine_errors = engine_errors + 1 WHERE run_id = $1 RETURNING engine_errors")
        .bind(run)
        .fetch_one(&mut *ch.tx)
        .await?;
    if !hopeless && failures < ENGINE_ERROR_LIMIT {
        let delay = backoff(failures);
        for (step, reason) in wakes {
            ch.wake(run, *step, delay, reason, true).await?;
        }
        ch.commit().await?;
        return Ok(Outcome::Retried(delay));
    }
    ch.audit(ctx.org, Some(ctx.project), "run.engine_error", ("run", run.to_string()), json!({ "error": detail, "failures": failures }))?;
    match runs::finish::<run::Failed>(&mut ch, run, Some(ENGINE_ERROR)).await {
        Ok(_) | Err(StoreError::Conflict(_)) => {
            ch.commit().await?;
            Ok(Outcome::Failed)
        }
        Err(e) => Err(e),
    }
}

/// Fails the run by its row alone: no lifecycle event (its journal may be what cannot be
/// written), its wakes gone, its admission leases and place in line given up, an audit entry.
async fn fail_bare(pool: &Db, actor: Actor, run: RunId, detail: &str) -> Result<Outcome> {
    let mut ch = Change::begin(pool, actor).await?;
    let found: Option<(crate::ids::OrgId, crate::ids::ProjectId)> = sqlx::query_as(
        "UPDATE runs SET status = 'failed', reason = $2, ended_at = now(), engine_errors = engine_errors + 1 \
             WHERE run_id = $1 AND status = 'running' RETURNING org_id, project_id",
    )
    .bind(run)
    .bind(ENGINE_ERROR)
    .fetch_optional(&mut *ch.tx)
    .await?;
    let Some((org, project)) = found else { return Ok(Outcome::Failed) };
    sqlx::query("DELETE FROM wakes WHERE run_id = $1").bind(run).execute(&mut *ch.tx).await?;
    // Its room in admission's queues is handed on as any ended run's is.
    let sql = format!("WITH {} SELECT ARRAY(SELECT group_key FROM l), (SELECT queue FROM q)", admission::lines::leaving_ctes("true"));
    let (leases, left): (Vec<String>, Option<String>) = sqlx::query_as(&sql).bind(run).fetch_one(&mut *ch.tx).await?;
    admission::lines::on_finish(&mut ch, org, &leases, left.as_deref());
    ch.audit(org, Some(project), "run.engine_error", ("run", run.to_string()), json!({ "error": detail, "without_event": true }))?;
    ch.commit().await?;
    Ok(Outcome::Failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_grows_by_four() {
        assert_eq!([1, 2, 3].map(backoff), [1, 4, 16].map(Duration::from_secs));
    }
}
