//! Workflow schedules (`on.schedule`): one durable row per workflow whose `next_at` is the wake
//! of its next tick.
//!
//! Uploading a version with a schedule writes the row (and tells the engines' timers); a
//! version without one removes it. An engine claims due rows with `SKIP LOCKED` beside its
//! wakes, and for each fires **one** tick, the latest one at or before now, so that a pool that
//! was down for an hour fires the missed 09:00 once rather than sixty times. A tick is a
//! trigger event per connected repository with the dedup key `[workflow, repository,
//! scheduled_at]` (kept forever, like every key), and a run for each new key. Then `next_at`
//! moves to the first tick after now. A paused workflow's ticks pass without firing.

use std::time::Duration;

use crate::db::Db;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use uuid::Uuid;

use super::runs::{self, NewRun};
use super::triggers::items::{CATALOG, ensure_item};
use super::{Actor, Change, Result, StoreError};
use crate::definition::Definition;
use crate::ids::{OrgId, ProjectId, RunId, WorkflowId};
use crate::item_keys::{canonical_json, item_key};
use crate::schedule::Schedule;

/// Writes or removes the schedule of a workflow for its new version `def`, and tells the
/// engines when its next tick falls due.
pub async fn sync(ch: &mut Change, org: OrgId, project: ProjectId, workflow: WorkflowId, def: &Definition) -> Result<()> {
    let Some(trigger) = &def.on.schedule else {
        sqlx::query("DELETE FROM schedules WHERE workflow_id = $1 AND org_id = $2").bind(workflow).bind(org).execute(&mut *ch.tx).await?;
        return Ok(());
    };
    let schedule = Schedule::parse(&trigger.cron, trigger.tz.as_deref()).map_err(super::StoreError::Invalid)?;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(&mut *ch.tx).await?;
    let Some(next) = schedule.next_after(now) else { return Ok(()) };
    let tz = trigger.tz.clone().unwrap_or_else(|| "UTC".to_owned());
    // An unchanged cron keeps its next tick (re-uploading must not skip or repeat one).
    sqlx::query(
        "INSERT INTO schedules (org_id, project_id, workflow_id, cron, tz, next_at) VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (workflow_id) DO UPDATE SET cron = EXCLUDED.cron, tz = EXCLUDED.tz, updated_at = now(), \
           next_at = CASE WHEN schedules.cron = EXCLUDED.cron AND schedules.tz = EXCLUDED.tz THEN schedules.next_at ELSE EXCLUDED.next_at END",
    )
    .bind(org)
    .bind(project)
    .bind(workflow)
    .bind(&trigger.cron)
    .bind(&tz)
    .bind(next)
    .execute(&mut *ch.tx)
    .await?;
    ch.note_wake((next - now).to_std().unwrap_or(Duration::ZERO));
    Ok(())
}

/// A due schedule row, locked.
#[derive(Debug, sqlx::FromRow)]
struct Due {
    org_id: OrgId,
    project_id: ProjectId,
    workflow_id: WorkflowId,
    cron: String,
    tz: String,
}

/// What one firing did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fired {
    /// Schedules claimed.
    pub schedules: usize,
    pub runs: Vec<RunId>,
}

/// Claims up to `limit` due schedules (`SKIP LOCKED`, so engines share them), fires the latest
/// tick of each and moves it to its next one, in one transaction.
pub async fn fire_due(pool: &Db, actor: Actor, limit: i64) -> Result<Fired> {
    // One indexed read outside a transaction: most claims find no tick due, and must not pay
    // for a transaction to learn it.
    let any: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM schedules WHERE next_at <= now())").fetch_one(pool).await?;
    if !any {
        return Ok(Fired::default());
    }
    let mut ch = Change::begin(pool, actor).await?;
    let due: Vec<Due> = sqlx::query_as(
        "SELECT org_id, project_id, workflow_id, cron, tz FROM schedules WHERE next_at <= now() ORDER BY next_at LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(limit)
    .fetch_all(&mut *ch.tx)
    .await?;
    let mut fired = Fired { schedules: due.len(), runs: Vec::new() };
    if due.is_empty() {
        return Ok(fired);
    }
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(&mut *ch.tx).await?;
    for d in &due {
        let schedule = match Schedule::parse(&d.cron, Some(&d.tz)) {
            Ok(s) => s,
            Err(e) => {
                // Validation refuses such a cron; a row that still holds one must not spin.
                tracing::warn!(workflow.id = %d.workflow_id, error = %e, "schedule dropped");
                sqlx::query("DELETE FROM schedules WHERE workflow_id = $1").bind(d.workflow_id).execute(&mut *ch.tx).await?;
                continue;
            }
        };
        if let Some(at) = schedule.latest_at_or_before(now) {
            fired.runs.extend(tick(&mut ch, d, at).await?);
        }
        let next = schedule.next_after(now);
        sqlx::query("UPDATE schedules SET next_at = coalesce($2, 'infinity'), last_tick_at = $3 WHERE workflow_id = $1")
            .bind(d.workflow_id)
            .bind(next)
            .bind(now)
            .execute(&mut *ch.tx)
            .await?;
    }
    ch.commit().await?;
    Ok(fired)
}

/// Fires one tick of one workflow: an event and a run per connected repository (or one with no
/// repository when the project has none), each under its dedup key.
async fn tick(ch: &mut Change, d: &Due, scheduled_at: DateTime<Utc>) -> Result<Vec<RunId>> {
    let row: Option<(String, i32, bool)> =
        sqlx::query_as("SELECT name, latest_version, paused FROM workflows WHERE workflow_id = $1 AND org_id = $2 AND latest_version > 0")
            .bind(d.workflow_id)
            .bind(d.org_id)
            .fetch_optional(&mut *ch.tx)
            .await?;
    let Some((name, version, paused)) = row else { return Ok(Vec::new()) };
    if paused {
        return Ok(Vec::new());
    }
    let def = CATALOG.get(&mut ch.tx, d.workflow_id, version).await?;
    let repositories: Vec<String> = sqlx::query_scalar("SELECT full_name FROM repositories WHERE project_id = $1 AND org_id = $2 ORDER BY full_name")
        .bind(d.project_id)
        .bind(d.org_id)
        .fetch_all(&mut *ch.tx)
        .await?;
    let targets: Vec<Option<String>> = if repositories.is_empty() { vec![None] } else { repositories.into_iter().map(Some).collect() };
    let at = scheduled_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut opened = Vec::new();
    for repository in targets {
        let key = canonical_json(&json!([name, repository, at]), false);
        let item = match &repository {
            Some(r) => Some(ensure_item(ch, d.org_id, d.project_id, &item_key(r, None)).await?),
            None => None,
        };
        let event = Uuid::now_v7();
        let trigger = json!({ "source": "schedule", "scheduled_at": at, "cron": d.cron, "tz": d.tz, "repository": repository });
        let inserted: Option<Uuid> = sqlx::query_scalar(
            "INSERT INTO trigger_events (org_id, project_id, event_id, workflow_id, item_id, dedup_key, source, payload, status) \
             VALUES ($1, $2, $3, $4, $5, $6, 'schedule', $7, 'accepted') \
             ON CONFLICT ON CONSTRAINT trigger_events_dedup DO NOTHING RETURNING event_id",
        )
        .bind(d.org_id)
        .bind(d.project_id)
        .bind(event)
        .bind(d.workflow_id)
        .bind(item)
        .bind(&key)
        .bind(json!({ "trigger": trigger }))
        .fetch_optional(&mut *ch.tx)
        .await?;
        if inserted.is_none() {
            continue;
        }
        let run = runs::submit(
            ch,
            NewRun {
                item,
                trigger_event: Some(event),
                needs_approval: def.approval_required,
                ..NewRun::of_workflow(d.org_id, d.project_id, d.workflow_id, version, json!({ "trigger": trigger, "event": event }))
            },
        )
        .await;
        let run = match run {
            Ok(run) => run,
            // Admission refused it (a full `skip` group, a full org line): the tick is skipped.
            Err(StoreError::Refused(reason) | StoreError::Full(reason)) => {
                sqlx::query("UPDATE trigger_events SET status = 'skipped', reason = $2, decided_at = now() WHERE event_id = $1")
                    .bind(event)
                    .bind(super::cap(&reason))
                    .execute(&mut *ch.tx)
                    .await?;
                continue;
            }
            Err(e) => return Err(e),
        };
        ch.audit(
            d.org_id,
            Some(d.project_id),
            "schedule.tick",
            ("workflow", d.workflow_id.to_string()),
            json!({ "scheduled_at": at, "run": run.to_string() }),
        )?;
        opened.push(run);
    }
    Ok(opened)
}

/// The `trigger` of a scheduled run, for tests and the console.
pub fn scheduled_at(input: &Value) -> Option<DateTime<Utc>> {
    input.pointer("/trigger/scheduled_at").and_then(Value::as_str).and_then(|t| t.parse().ok())
}
