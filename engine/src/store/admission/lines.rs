//! Admission's lines in the store: the queue rows runs wait in, what occupies them, and the
//! writes that let runs through when room frees (`poke`, `release` as a change commits,
//! `release_gate` when a gate opens). The locks and the order they are taken in are described
//! in `store::admission`.

use std::time::Duration;

use crate::admission::{self as rules, QueueKind};
use crate::ids::{ItemId, OrgId};
use crate::store::{Change, Result, StoreError};

const LOCK_QUEUE: &str = "INSERT INTO admission_queues (org_id, queue, cap, window_ms) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (org_id, queue) DO UPDATE SET cap = EXCLUDED.cap, window_ms = EXCLUDED.window_ms \
     RETURNING cap, waiting";

/// Locks a queue's row for an admission (creating it), with its current cap; returns the cap
/// and how many wait in line.
pub(crate) async fn lock_queue(ch: &mut Change, org: OrgId, queue: &str, cap: Option<i32>, window_ms: Option<i64>) -> Result<(Option<i32>, i32)> {
    Ok(sqlx::query_as(LOCK_QUEUE).bind(org).bind(queue).bind(cap).bind(window_ms).fetch_one(&mut *ch.tx).await?)
}

/// The leases held in a queue whose row this change has locked (`lock_queue`): the releases
/// that ended runs left are taken and counted off the row's count (migration 0024 says why).
/// A statement of its own, after the lock: only the row's holder takes releases, so two
/// admissions never wait on each other's release rows, and its snapshot sees what the
/// previous holder took.
pub(crate) async fn held_in(ch: &mut Change, org: OrgId, queue: &str) -> Result<i64> {
    let held: i32 = sqlx::query_scalar(
        "WITH released AS (DELETE FROM lease_releases WHERE org_id = $1 AND queue = $2 RETURNING 1) \
         UPDATE admission_queues SET held = held - (SELECT count(*) FROM released) WHERE org_id = $1 AND queue = $2 RETURNING held",
    )
    .bind(org)
    .bind(queue)
    .fetch_one(&mut *ch.tx)
    .await?;
    Ok(i64::from(held))
}

/// Locks a queue's row unless another change holds it; false when one does. True also for a
/// queue with no row yet: nothing holds it, and the caller's `lock_queue` creates it.
pub(crate) async fn try_lock_queue(ch: &mut Change, org: OrgId, queue: &str) -> Result<bool> {
    // One statement, one snapshot: the row locked now, or no row to lock.
    let (locked, exists): (bool, bool) = sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM admission_queues WHERE org_id = $1 AND queue = $2 FOR UPDATE SKIP LOCKED), \
                EXISTS (SELECT 1 FROM admission_queues WHERE org_id = $1 AND queue = $2)",
    )
    .bind(org)
    .bind(queue)
    .fetch_one(&mut *ch.tx)
    .await?;
    Ok(locked || !exists)
}

const AHEAD_OF: &str = "SELECT count(*) FROM admission_waits WHERE org_id = $1 AND queue = $2 AND seq < $3";

/// Runs in line ahead of place `seq`.
pub(crate) async fn ahead_of(ch: &mut Change, org: OrgId, queue: &str, seq: i64) -> Result<i64> {
    Ok(sqlx::query_scalar(AHEAD_OF).bind(org).bind(queue).bind(seq).fetch_one(&mut *ch.tx).await?)
}

const BOARD_OCCUPIED: &str = "SELECT (SELECT count(*) FROM concurrency_leases WHERE org_id = $1 AND group_key = $2) \
     + (SELECT count(*) FROM items i WHERE i.project_id = $3 AND i.org_id = $1 \
          AND lower(i.data #>> '{board,column}') = $4 AND i.item_id IS DISTINCT FROM $5 \
          AND NOT EXISTS (SELECT 1 FROM concurrency_leases l JOIN runs r ON r.run_id = l.run_id \
                          WHERE l.org_id = $1 AND l.group_key = $2 AND r.item_id = i.item_id))";

/// What occupies a board column (`queue` is its line): the runs holding a lease in its line,
/// and the items of the project whose stored card is in the column, except those a lease
/// holder is about (counted once) and `except` (the item of the run asking: its card being in
/// the column already is room it holds, not room it takes).
pub(crate) async fn board_occupied(ch: &mut Change, org: OrgId, queue: &str, except: Option<ItemId>) -> Result<i64> {
    let Some((project, column)) = rules::board_of(queue) else { return Ok(0) };
    let project: uuid::Uuid = project.parse().map_err(|_| StoreError::Invalid(format!("bad board line {queue}")))?;
    Ok(sqlx::query_scalar(BOARD_OCCUPIED).bind(org).bind(queue).bind(project).bind(column).bind(except).fetch_one(&mut *ch.tx).await?)
}

/// A throttle's starts in its window, and when the oldest of them leaves it. Starts older
/// than the window are pruned first (by whoever holds the queue's row).
pub(crate) async fn window(ch: &mut Change, org: OrgId, queue: &str, window_ms: i64) -> Result<(i64, Option<Duration>)> {
    sqlx::query("DELETE FROM admission_starts WHERE org_id = $1 AND queue = $2 AND at <= now() - $3 * interval '1 millisecond'")
        .bind(org)
        .bind(queue)
        .bind(window_ms as f64)
        .execute(&mut *ch.tx)
        .await?;
    let (count, opens_ms): (i64, Option<f64>) = sqlx::query_as(
        "SELECT count(*), ceil(extract(epoch FROM min(at) + $3 * interval '1 millisecond' - now()) * 1000)::float8 \
         FROM admission_starts WHERE org_id = $1 AND queue = $2",
    )
    .bind(org)
    .bind(queue)
    .bind(window_ms as f64)
    .fetch_one(&mut *ch.tx)
    .await?;
    Ok((count, opens_ms.map(|ms| Duration::from_millis(ms.max(0.0) as u64))))
}

const WAKE_WAITERS: &str = "INSERT INTO wakes (org_id, run_id, due_at, reason) \
     SELECT org_id, run_id, now() + $4 * interval '1 millisecond', 'admit' FROM admission_waits \
     WHERE org_id = $1 AND queue = $2 ORDER BY seq LIMIT $3";

/// Wakes the runs that may take room in a queue whose row this change has locked (either
/// way): the first in line, as many as there is room for (at most [`rules::WAKE_AT_ONCE`]);
/// for a throttle with no room now, its head at the time the window has room; for a gate,
/// everyone in line.
pub(crate) async fn poke(ch: &mut Change, org: OrgId, queue: &str) -> Result<()> {
    // Leases held: the row's count less the releases not yet counted off (this change's own
    // among them), which only an admission holding the row FOR UPDATE may take.
    let (cap_now, window_ms, waiting, held): (Option<i32>, Option<i64>, i32, i64) = sqlx::query_as(
        "SELECT cap, window_ms, waiting, held - (SELECT count(*) FROM lease_releases r WHERE r.org_id = $1 AND r.queue = $2) \
         FROM admission_queues WHERE org_id = $1 AND queue = $2",
    )
    .bind(org)
    .bind(queue)
    .fetch_optional(&mut *ch.tx)
    .await?
    .unwrap_or((None, None, 0, 0));
    if waiting == 0 {
        return Ok(());
    }
    let (room, later) = match rules::queue_kind(queue) {
        QueueKind::Gate => (i64::from(waiting), None),
        QueueKind::Leases => (i64::from(cap_now.unwrap_or(0)) - held, None),
        // A column whose limit was removed lets everyone in line go.
        QueueKind::Board if cap_now.is_none() => (i64::from(waiting), None),
        QueueKind::Board => (i64::from(cap_now.unwrap_or(0)) - board_occupied(ch, org, queue, None).await?, None),
        QueueKind::Throttle => {
            let (count, opens_in) = window(ch, org, queue, window_ms.unwrap_or(1)).await?;
            (i64::from(cap_now.unwrap_or(0)) - count, opens_in)
        }
    };
    let (n, delay) = match (rules::queue_kind(queue), room > 0, later) {
        (QueueKind::Gate, _, _) => (room, Duration::ZERO),
        (_, true, _) => (room.min(rules::WAKE_AT_ONCE), Duration::ZERO),
        (_, false, Some(later)) => (1, later),
        (_, false, None) => return Ok(()),
    };
    let woken = sqlx::query(WAKE_WAITERS).bind(org).bind(queue).bind(n).bind(delay.as_millis() as f64).execute(&mut *ch.tx).await?;
    if woken.rows_affected() > 0 {
        ch.note_wake(delay);
    }
    Ok(())
}

/// The common table expressions by which a run (`$1`) leaves admission, for the statement
/// that ends it: `l`, its leases dropped, each leaving a release for its queue's count
/// (`held_in`); `q`, its place in line. `guard` is a condition each must meet (`true`, or
/// that the run was running).
pub(crate) fn leaving_ctes(guard: &str) -> String {
    format!(
        "l AS (DELETE FROM concurrency_leases WHERE run_id = $1 AND {guard} RETURNING org_id, group_key), \
         r AS (INSERT INTO lease_releases (org_id, queue) SELECT org_id, group_key FROM l), \
         q AS (DELETE FROM admission_waits WHERE run_id = $1 AND {guard} RETURNING queue)"
    )
}

/// A run ended (`runs::finish`): the room its leases held, and its place in line if it was
/// waiting, go to the runs in line, at commit (`release`).
pub(crate) fn on_finish(ch: &mut Change, org: OrgId, leases: &[String], left: Option<&str>) {
    for lease in leases.iter().filter(|l| Some(l.as_str()) != left) {
        ch.releases.push((org, lease.clone(), false));
    }
    if let Some(q) = left {
        ch.releases.push((org, q.to_owned(), true));
    }
}

const TAKE_WAITING: &str = "UPDATE admission_queues SET waiting = waiting - $3 WHERE org_id = $1 AND queue = $2 RETURNING waiting";

const WAITING_FOR_SHARE: &str = "SELECT waiting FROM admission_queues WHERE org_id = $1 AND queue = $2 FOR SHARE";

/// Hands on what the runs that ended in this change held, as the change commits: its last
/// statements, so the queue rows are held only for the commit, and a change that admitted a
/// run earlier (`FOR UPDATE`) never asks for a weaker lock it already has the stronger of,
/// nor one that admits after a release waits to upgrade its share (the upgrade two changes
/// would deadlock on). Rows are locked in stage order: `FOR SHARE` where a run held a lease,
/// `FOR UPDATE` where it was in line (`waiting` changes).
pub(crate) async fn release(ch: &mut Change, queues: Vec<(OrgId, String, bool)>) -> Result<()> {
    // One statement per queue however many runs ended: how many of them left its line.
    let mut by_queue: std::collections::BTreeMap<(u8, String, uuid::Uuid), (OrgId, i32)> = std::collections::BTreeMap::new();
    for (org, queue, was_in_line) in queues {
        let entry = by_queue.entry((rules::stage(&queue), queue, org.0)).or_insert((org, 0));
        entry.1 += i32::from(was_in_line);
    }
    for ((_, queue, _), (org, left)) in by_queue {
        let queue = queue.as_str();
        let waiting: Option<i32> = if left > 0 {
            sqlx::query_scalar(TAKE_WAITING).bind(org).bind(queue).bind(left).fetch_optional(&mut *ch.tx).await?
        } else {
            sqlx::query_scalar(WAITING_FOR_SHARE).bind(org).bind(queue).fetch_optional(&mut *ch.tx).await?
        };
        if waiting.unwrap_or(0) > 0 && rules::queue_kind(queue) != QueueKind::Gate {
            poke(ch, org, queue).await?;
        }
    }
    Ok(())
}

/// A gate opened (a workflow or project unpaused, a budget raised or removed, a new period):
/// every run in its line is woken to be admitted again. Called after the change that opened it
/// updated the row admissions read `FOR SHARE`, so a run put in line before sees it open.
pub async fn release_gate(ch: &mut Change, org: OrgId, queue: &str) -> Result<()> {
    let locked: Option<i32> = sqlx::query_scalar("SELECT waiting FROM admission_queues WHERE org_id = $1 AND queue = $2 FOR UPDATE")
        .bind(org)
        .bind(queue)
        .fetch_optional(&mut *ch.tx)
        .await?;
    if locked.unwrap_or(0) > 0 {
        poke(ch, org, queue).await?;
    }
    Ok(())
}
