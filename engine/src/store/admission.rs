//! Admission in the store: the lines runs wait in, the leases they hold, and the changes that
//! admit them or let them through (the rules are in `crate::admission`).
//!
//! **Locks.** Every queue has a row in `admission_queues`. A change that admits a run or puts
//! one in line locks the rows of the queues it reads `FOR UPDATE`, in stage order (gates,
//! group, throttle, org), after the run's own row; a change that frees room (a run ending)
//! locks them `FOR SHARE` in the same order as it commits (`release`: its last statements, so
//! it never waits on a run's lock while holding a queue's, nor upgrades a share it took
//! earlier) and reads `waiting` from the row it locked. So an
//! admission and a release are ordered: either the release commits first and the admission
//! counts the room it freed, or the admission commits its place in line first and the release
//! sees it waiting and wakes it. Finishing runs share the lock, so they do not wait on each
//! other. Counts (leases, starts in a window, runs in line ahead) are read in statements of
//! their own, after the lock is granted, so they see every change committed before it.
//!
//! **Nothing polls.** A run in line has no wake until something frees room: a run of its
//! queue ending (`lines::on_finish`, then `lines::release`), a window opening (a wake at that time for the head of a
//! throttle's line), a gate opening (`release_gate`: unpause, a raised budget, a raised cap),
//! or the run ahead of it being admitted while room remains (the chain). Only the head of a
//! line may take room, so runs are released in the order they arrived; a woken run that is
//! not the head stays in line.

//!
//! The decision is in `plan.rs` (the stages and the writes that apply them; the gates' read,
//! which a trigger event's insert may carry, in `gates.rs`), the lines and
//! what lets runs through in `lines.rs`; this file holds admission at the engine, which may
//! end a `drop` group's victim (`runs::drop_victim`), and the operator's settings.

pub(crate) mod gates;
pub(crate) mod lines;
pub(crate) mod plan;

use std::sync::Arc;

use serde_json::json;

use super::run_rows::RunRow;
use super::{Change, Result, StoreError, cap, runs};
use crate::admission as rules;
use crate::definition::Definition;
use crate::ids::{OrgId, ProjectId, RunId, WorkflowId};

pub(super) use lines::release;
pub use lines::release_gate;
use lines::{lock_queue, poke};

/// Admission at the engine: a run that has not started yet (deferred at submit, or woken in
/// line) is admitted or stays held. Returns whether it was admitted. A `drop` group's victim
/// ends first, as at submit.
pub async fn admit(ch: &mut Change, row: &RunRow, def: &Arc<Definition>) -> Result<bool> {
    let (candidate, standing, mut plan) = plan::at_engine(ch, row, def).await?;
    if let Some((victim, reason)) = plan.take_victim() {
        runs::drop_victim(ch, victim, &reason).await?;
    }
    plan::admit_at_engine(ch, &candidate, &standing, plan).await
}

/// Sets the org's cap on running runs; a raise wakes the runs in line it makes room for.
pub async fn set_running_cap(ch: &mut Change, org: OrgId, running_cap: i32) -> Result<()> {
    if !(1..=1_000_000).contains(&running_cap) {
        return Err(StoreError::Invalid("running_cap must be between 1 and 1000000".into()));
    }
    let before: Option<i32> = sqlx::query_scalar("SELECT running_cap FROM orgs WHERE org_id = $1 FOR UPDATE").bind(org).fetch_optional(&mut *ch.tx).await?;
    let before = before.ok_or(StoreError::NotFound("org"))?;
    sqlx::query("UPDATE orgs SET running_cap = $2 WHERE org_id = $1").bind(org).bind(running_cap).execute(&mut *ch.tx).await?;
    lock_queue(ch, org, rules::ORG_QUEUE, Some(running_cap), None).await?;
    poke(ch, org, rules::ORG_QUEUE).await?;
    ch.audit(org, None, "org.running_cap", ("org", org.to_string()), json!({ "from": before, "to": running_cap }))?;
    Ok(())
}

/// Pauses or unpauses a project: new runs of its workflows are held while it is paused, and
/// released when it is unpaused. Runs already admitted carry on.
pub async fn set_project_paused(ch: &mut Change, org: OrgId, project: ProjectId, paused: bool) -> Result<()> {
    let done =
        sqlx::query("UPDATE projects SET paused = $3 WHERE org_id = $1 AND project_id = $2").bind(org).bind(project).bind(paused).execute(&mut *ch.tx).await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound("project"));
    }
    let action = if paused { "project.pause" } else { "project.unpause" };
    ch.audit(org, Some(project), action, ("project", project.to_string()), json!({}))?;
    if !paused {
        release_gate(ch, org, &rules::project_paused_queue(&project.0.to_string())).await?;
    }
    Ok(())
}

/// A workflow was unpaused (`workflows::set_paused`): its held runs are released.
pub async fn workflow_unpaused(ch: &mut Change, org: OrgId, workflow: WorkflowId) -> Result<()> {
    release_gate(ch, org, &rules::paused_queue(&workflow.0.to_string())).await
}

/// Where a held run stands, for `why` and the API.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Waiting {
    pub run_id: RunId,
    pub hold: String,
    pub detail: String,
    pub queue: String,
    /// Runs in line ahead of it.
    pub ahead: i64,
    /// For a throttle: when its window next has room.
    pub until: Option<chrono::DateTime<chrono::Utc>>,
}

/// The statement `why` reads holds with ($1 org, $2 run ids), served by `admission_waits`'
/// key and line index.
pub const WAITING_SQL: &str = "SELECT w.run_id, w.hold, w.detail, w.queue, \
        (SELECT count(*) FROM admission_waits a WHERE a.org_id = w.org_id AND a.queue = w.queue AND a.seq < w.seq) AS ahead, \
        CASE WHEN w.hold = 'throttle' THEN \
            (SELECT min(s.at) + q.window_ms * interval '1 millisecond' FROM admission_starts s \
              WHERE s.org_id = w.org_id AND s.queue = w.queue AND s.at > now() - q.window_ms * interval '1 millisecond') END AS until \
     FROM admission_waits w JOIN admission_queues q ON q.org_id = w.org_id AND q.queue = w.queue \
     WHERE w.org_id = $1 AND w.run_id = ANY($2)";

/// A board column's WIP limit, with what occupies the column now.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct BoardLimit {
    /// The column as it was named when the limit was set (`In progress`).
    pub column: String,
    pub limit: i32,
    /// Items whose card is in the column, and admitted runs that will move a card into it.
    pub occupied: i64,
    /// Runs waiting for room in the column.
    pub waiting: i32,
}

/// The WIP limits of a project's board columns.
pub async fn board_limits(conn: &mut sqlx::PgConnection, org: OrgId, project: ProjectId) -> Result<Vec<BoardLimit>> {
    let rows: Vec<(String, String, i32, Option<i32>)> = sqlx::query_as(
        "SELECT b.column_key, b.column_name, b.wip_limit, q.waiting FROM board_limits b \
         LEFT JOIN admission_queues q ON q.org_id = b.org_id AND q.queue = 'board:' || b.project_id::text || ':' || b.column_key \
         WHERE b.org_id = $1 AND b.project_id = $2 ORDER BY b.column_key",
    )
    .bind(org)
    .bind(project)
    .fetch_all(&mut *conn)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for (key, column, limit, waiting) in rows {
        let queue = rules::board_queue(&project.0.to_string(), &key);
        let occupied: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM concurrency_leases WHERE org_id = $1 AND group_key = $2) \
                  + (SELECT count(*) FROM items i WHERE i.project_id = $3 AND i.org_id = $1 AND lower(i.data #>> '{board,column}') = $4 \
                       AND NOT EXISTS (SELECT 1 FROM concurrency_leases l JOIN runs r ON r.run_id = l.run_id \
                                       WHERE l.org_id = $1 AND l.group_key = $2 AND r.item_id = i.item_id))",
        )
        .bind(org)
        .bind(&queue)
        .bind(project)
        .bind(&key)
        .fetch_one(&mut *conn)
        .await?;
        out.push(BoardLimit { column, limit, occupied, waiting: waiting.unwrap_or(0) });
    }
    Ok(out)
}

const DELETE_BOARD_LIMIT: &str = "DELETE FROM board_limits WHERE org_id = $1 AND project_id = $2 AND column_key = $3";

/// Sets (`Some`) or removes (`None`) the WIP limit of a project's board column. A raise or a
/// removal wakes the runs in the column's line it makes room for, in order; removing a limit
/// that is not set is not found.
pub async fn set_board_limit(ch: &mut Change, org: OrgId, project: ProjectId, column: &str, limit: Option<i32>) -> Result<()> {
    let name = column.trim();
    if name.is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control) {
        return Err(StoreError::Invalid("a board column is 1 to 100 printable characters".into()));
    }
    if limit.is_some_and(|l| !(1..=100_000).contains(&l)) {
        return Err(StoreError::Invalid("a WIP limit is between 1 and 100000".into()));
    }
    let key = rules::column_key(name);
    let exists: Option<i32> =
        sqlx::query_scalar("SELECT 1 FROM projects WHERE org_id = $1 AND project_id = $2").bind(org).bind(project).fetch_optional(&mut *ch.tx).await?;
    exists.ok_or(StoreError::NotFound("project"))?;
    // The old limit, locked: admissions read it FOR SHARE.
    let before: Option<i32> = sqlx::query_scalar("SELECT wip_limit FROM board_limits WHERE org_id = $1 AND project_id = $2 AND column_key = $3 FOR UPDATE")
        .bind(org)
        .bind(project)
        .bind(&key)
        .fetch_optional(&mut *ch.tx)
        .await?;
    match limit {
        Some(l) => {
            sqlx::query(
                "INSERT INTO board_limits (org_id, project_id, column_key, column_name, wip_limit) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (project_id, column_key) DO UPDATE SET column_name = EXCLUDED.column_name, wip_limit = EXCLUDED.wip_limit",
            )
            .bind(org)
            .bind(project)
            .bind(&key)
            .bind(cap(name))
            .bind(l)
            .execute(&mut *ch.tx)
            .await?;
        }
        None if before.is_none() => return Err(StoreError::NotFound("board limit")),
        None => {
            sqlx::query(DELETE_BOARD_LIMIT).bind(org).bind(project).bind(&key).execute(&mut *ch.tx).await?;
        }
    }
    let action = if limit.is_some() { "board.wip_limit" } else { "board.wip_limit_remove" };
    ch.audit(org, Some(project), action, ("project", project.to_string()), json!({ "column": cap(name), "from": before, "to": limit }))?;
    let queue = rules::board_queue(&project.0.to_string(), &key);
    lock_queue(ch, org, &queue, limit, None).await?;
    poke(ch, org, &queue).await
}
