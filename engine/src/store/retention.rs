//! Retention: a project's finished runs are deleted with their history (steps, logs, events,
//! approvals, wakes: the foreign keys cascade) once they ended longer ago than the project's
//! `retention_days` (90 by default); its webhook deliveries after 7 days; its lifecycle events
//! (`run_events`, the project's bus) after 30 days, except those of runs still running, which
//! are kept until the run ends (a run's event numbers continue from its last one). Dry runs go
//! a day after they end, by a wake of their own (`runs::finish`).
//!
//! Each project has one `retention` job. Its sweep deletes in batches of [`BATCH`] runs, each
//! batch a transaction of its own that locks only the runs it deletes (`SKIP LOCKED`), so run
//! creation never waits on it; then it schedules the next sweep for when the oldest finished
//! run left comes of age (or a retention period from now, when there is none). Running runs
//! are never deleted, however old.

use std::time::Duration;

use serde_json::json;

use super::{jobs, Actor, Change, Result};
use crate::ids::{OrgId, ProjectId};

/// The job kind of a project's sweep.
pub const JOB: &str = "retention";

/// Runs deleted per transaction.
pub const BATCH: i64 = 200;

/// How long webhook deliveries are kept.
pub const DELIVERY_DAYS: i32 = 7;

/// How long lifecycle events are kept.
pub const EVENT_DAYS: i32 = 30;

/// What one sweep deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    pub runs: u64,
    pub deliveries: u64,
    pub events: u64,
    pub batches: u32,
}

/// Schedules the first sweep of a new project, one retention period ahead.
pub(crate) async fn start(ch: &mut Change, org: OrgId, project: ProjectId) -> Result<()> {
    let days: i32 = sqlx::query_scalar("SELECT retention_days FROM projects WHERE project_id = $1").bind(project).fetch_one(&mut *ch.tx).await?;
    jobs::schedule(ch, org, JOB, project.0, Duration::from_secs(u64::try_from(days).unwrap_or(90) * 86_400)).await
}

/// Sets a project's retention; the next sweep is due now, so a shorter one applies at once.
pub async fn set_days(ch: &mut Change, org: OrgId, project: ProjectId, days: i32) -> Result<()> {
    if !(1..=3650).contains(&days) {
        return Err(super::StoreError::Invalid("retention_days must be between 1 and 3650".into()));
    }
    let before: Option<i32> = sqlx::query_scalar("SELECT retention_days FROM projects WHERE org_id = $1 AND project_id = $2 FOR UPDATE")
        .bind(org)
        .bind(project)
        .fetch_optional(&mut *ch.tx)
        .await?;
    let before = before.ok_or(super::StoreError::NotFound("project"))?;
    sqlx::query("UPDATE projects SET retention_days = $2 WHERE project_id = $1").bind(project).bind(days).execute(&mut *ch.tx).await?;
    ch.audit(org, Some(project), "project.retention", ("project", project.to_string()), json!({ "from": before, "to": days }))?;
    jobs::schedule(ch, org, JOB, project.0, Duration::ZERO).await
}

/// Sweeps one project: deletes what is past retention, a batch per transaction, then
/// schedules the next sweep.
pub async fn sweep(pool: &crate::db::Db, actor: Actor, org: OrgId, project: ProjectId, batch: i64) -> Result<Swept> {
    let mut swept = Swept::default();
    loop {
        let mut ch = Change::begin(pool, actor.clone()).await?;
        let deleted = sqlx::query(
            "DELETE FROM runs WHERE run_id IN ( \
                SELECT run_id FROM runs WHERE project_id = $1 AND org_id = $2 AND status <> 'running' \
                  AND ended_at < now() - make_interval(days => (SELECT retention_days FROM projects WHERE project_id = $1)) \
                ORDER BY ended_at LIMIT $3 FOR UPDATE SKIP LOCKED)",
        )
        .bind(project)
        .bind(org)
        .bind(batch)
        .execute(ch.conn())
        .await?
        .rows_affected();
        if deleted > 0 {
            ch.audit(org, Some(project), "retention.delete", ("project", project.to_string()), json!({ "runs": deleted }))?;
        }
        ch.commit().await?;
        swept.runs += deleted;
        swept.batches += 1;
        if deleted < u64::try_from(batch).unwrap_or(0) {
            break;
        }
    }
    loop {
        let mut ch = Change::begin(pool, actor.clone()).await?;
        let deleted = sqlx::query(
            "DELETE FROM webhook_deliveries WHERE delivery_id IN ( \
                SELECT delivery_id FROM webhook_deliveries WHERE project_id = $1 AND created_at < now() - make_interval(days => $2) \
                ORDER BY created_at LIMIT $3)",
        )
        .bind(project)
        .bind(DELIVERY_DAYS)
        .bind(batch * 5)
        .execute(ch.conn())
        .await?
        .rows_affected();
        ch.commit().await?;
        swept.deliveries += deleted;
        if deleted < u64::try_from(batch * 5).unwrap_or(0) {
            break;
        }
    }
    loop {
        // Events of runs still running are skipped (and looked at again by a later sweep); the
        // runs whose events go are locked, so no change of theirs appends meanwhile.
        let mut ch = Change::begin(pool, actor.clone()).await?;
        let deleted = sqlx::query(
            "DELETE FROM run_events WHERE (run_id, seq) IN ( \
                SELECT e.run_id, e.seq FROM run_events e JOIN runs r ON r.run_id = e.run_id \
                WHERE e.project_id = $1 AND e.at < now() - make_interval(days => $2) AND r.status <> 'running' \
                ORDER BY e.at LIMIT $3 FOR NO KEY UPDATE OF r SKIP LOCKED)",
        )
        .bind(project)
        .bind(EVENT_DAYS)
        .bind(batch * 5)
        .execute(ch.conn())
        .await?
        .rows_affected();
        if deleted > 0 {
            ch.audit(org, Some(project), "retention.delete_events", ("project", project.to_string()), json!({ "events": deleted }))?;
        }
        ch.commit().await?;
        swept.events += deleted;
        if deleted < u64::try_from(batch * 5).unwrap_or(0) {
            break;
        }
    }
    // The next sweep: when the oldest finished run, delivery or event left comes of age. Events
    // already of age that were kept (their run still runs) do not count: the sweep after that
    // run's end takes them. Events come all the time, so their sweep is at most hourly. The
    // next event to come of age is the first young one in commit order (`run_events_by_project`),
    // close enough to the youngest by time for an hourly sweep.
    let mut ch = Change::begin(pool, actor).await?;
    let next_ms: Option<f64> = sqlx::query_scalar(
        "SELECT ceil(extract(epoch FROM least( \
                    coalesce((SELECT min(ended_at) FROM runs WHERE project_id = $1 AND status <> 'running'), now()) \
                        + make_interval(days => p.retention_days), \
                    coalesce((SELECT min(created_at) FROM webhook_deliveries WHERE project_id = $1), now() + interval '3650 days') \
                        + make_interval(days => $2), \
                    greatest(coalesce((SELECT at FROM run_events WHERE org_id = $4 AND project_id = $1 AND at >= now() - make_interval(days => $3) \
                                       ORDER BY xid, event_id LIMIT 1), \
                                      now() + interval '3650 days') + make_interval(days => $3), now() + interval '1 hour')) \
                    - now()) * 1000)::float8 \
         FROM projects p WHERE p.project_id = $1",
    )
    .bind(project)
    .bind(DELIVERY_DAYS)
    .bind(EVENT_DAYS)
    .bind(org)
    .fetch_optional(ch.conn())
    .await?
    .flatten();
    match next_ms {
        // A second's slack, so a run that comes of age is past it when the sweep looks.
        Some(ms) => jobs::schedule(&mut ch, org, JOB, project.0, Duration::from_millis(ms.max(0.0) as u64 + 1_000)).await?,
        // The project is gone.
        None => jobs::done(&mut ch, JOB, project.0).await?,
    }
    ch.commit().await?;
    Ok(swept)
}
