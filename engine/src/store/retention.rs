//! Retention: a project's finished runs are deleted (with their steps, approvals and wakes:
//! the foreign keys cascade) once they ended longer ago than the project's `retention_days`
//! (90 by default); its webhook deliveries after 7 days. Dry runs go a day after they end, by a
//! wake of their own (`runs::finish`).
//!
//! Journals (`run_events`, `step_logs`) are partitioned by month of their run's creation
//! (migration 0022): a run's journal lives as long as the run, and a partition is dropped
//! whole once no run created in its month is left (`shopfloor_journal_maintain`, which also
//! makes the months ahead). Every sweep calls it. What the project's event stream replays is
//! limited to [`EVENT_DAYS`] (`api::http::events`), not a kept run's history.
//!
//! Each project has one `retention` job. Its sweep deletes in batches of [`BATCH`] runs, each
//! batch a transaction of its own that locks only the runs it deletes (`SKIP LOCKED`), so run
//! creation never waits on it; then it schedules the next sweep for when the oldest finished
//! run left comes of age, a day from now at the latest (the journals' partitions are made
//! ahead by then). Running runs are never deleted, however old.

use std::time::Duration;

use serde_json::json;

use super::{Actor, Change, Result, jobs};
use crate::ids::{OrgId, ProjectId};

/// The job kind of a project's sweep.
pub const JOB: &str = "retention";

/// Runs deleted per transaction.
pub const BATCH: i64 = 200;

/// How long webhook deliveries are kept.
pub const DELIVERY_DAYS: i32 = 7;

/// How far back the project's event stream replays (`Last-Event-ID`).
pub const EVENT_DAYS: i32 = 30;

/// What one sweep deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    pub runs: u64,
    pub deliveries: u64,
    /// Journal partitions dropped.
    pub partitions: u64,
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
    // Journal partitions: the months ahead made, those of no remaining run dropped. Dropping
    // one waits for the journals' lock; when it cannot have it in time, the next sweep tries.
    match sqlx::query_scalar::<_, i32>("SELECT shopfloor_journal_maintain()").fetch_one(pool).await {
        Ok(n) => swept.partitions = u64::try_from(n).unwrap_or(0),
        Err(e) => tracing::warn!(error = %e, "journal partitions not maintained this sweep"),
    }
    // The next sweep: when the oldest finished run or delivery left comes of age, and within a
    // day, so that the journals' partitions are made ahead of their months.
    let mut ch = Change::begin(pool, actor).await?;
    let next_ms: Option<f64> = sqlx::query_scalar(
        "SELECT ceil(extract(epoch FROM least( \
                    coalesce((SELECT min(ended_at) FROM runs WHERE project_id = $1 AND status <> 'running'), now()) \
                        + make_interval(days => p.retention_days), \
                    coalesce((SELECT min(created_at) FROM webhook_deliveries WHERE project_id = $1), now() + interval '3650 days') \
                        + make_interval(days => $2), \
                    now() + interval '1 day') \
                    - now()) * 1000)::float8 \
         FROM projects p WHERE p.project_id = $1",
    )
    .bind(project)
    .bind(DELIVERY_DAYS)
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
