//! Jobs: durable timers for work that belongs to no run (an outgoing webhook delivery, a
//! project's retention sweep). Like wakes, they are written in the change that causes them,
//! announced by its `NOTIFY`, and claimed with `SKIP LOCKED`; nothing scans for them.
//!
//! A job is claimed by moving its due time a lease ahead, so that the work, done outside any
//! transaction, comes due again if its engine dies; the change that records the work then
//! reschedules or deletes it.

use std::time::Duration;

use super::{Change, Result};
use crate::ids::OrgId;

/// How long a claimed job is its engine's before it comes due again.
pub const JOB_LEASE: Duration = Duration::from_secs(60);

/// A claimed job.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Job {
    pub org_id: OrgId,
    pub kind: String,
    pub subject: uuid::Uuid,
}

/// Claims due jobs (at most `limit`): each is due again a lease from now. One statement, its
/// own transaction: a claim that finds nothing costs one round trip.
pub async fn claim_due(pool: &crate::db::Db, limit: i64) -> Result<Vec<Job>> {
    let jobs: Vec<Job> = sqlx::query_as(&format!(
        "UPDATE jobs SET due_at = now() + interval '{} seconds' \
         WHERE job_id IN (SELECT job_id FROM jobs WHERE due_at <= now() ORDER BY due_at LIMIT $1 FOR UPDATE SKIP LOCKED) \
         RETURNING org_id, kind, subject",
        JOB_LEASE.as_secs()
    ))
    .bind(limit)
    .fetch_all(pool)
    .await?;
    if !jobs.is_empty() {
        // Every engine's timer must know when these come due again, should this one die.
        sqlx::query("SELECT pg_notify($1, $2)").bind(super::NOTIFY_CHANNEL).bind(format!("w{}", JOB_LEASE.as_millis())).execute(pool).await?;
    }
    Ok(jobs)
}

const SCHEDULE_JOB: &str = "INSERT INTO jobs (org_id, kind, subject, due_at) VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond') \
     ON CONFLICT (kind, subject) DO UPDATE SET due_at = EXCLUDED.due_at";

/// Schedules the job of `kind` for `subject` after `delay` (creating it, or moving it).
pub(crate) async fn schedule(ch: &mut Change, org: OrgId, kind: &str, subject: uuid::Uuid, delay: Duration) -> Result<()> {
    sqlx::query(SCHEDULE_JOB).bind(org).bind(kind).bind(subject).bind(delay.as_millis() as f64).execute(&mut *ch.tx).await?;
    ch.note_wake(delay);
    Ok(())
}

/// Deletes the job of `kind` for `subject`: its work is done.
pub(crate) async fn done(ch: &mut Change, kind: &str, subject: uuid::Uuid) -> Result<()> {
    sqlx::query("DELETE FROM jobs WHERE kind = $1 AND subject = $2").bind(kind).bind(subject).execute(&mut *ch.tx).await?;
    Ok(())
}
