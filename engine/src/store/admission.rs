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
//! queue ending (`on_finish`, then `release`), a window opening (a wake at that time for the head of a
//! throttle's line), a gate opening (`release_gate`: unpause, a raised budget, a raised cap),
//! or the run ahead of it being admitted while room remains (the chain). Only the head of a
//! line may take room, so runs are released in the order they arrived; a woken run that is
//! not the head stays in line.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use serde_json::json;

use super::{budgets, cap, runs, Change, Result, StoreError};
use crate::admission::{self as rules, ItemRef, QueueKind};
use crate::catalog::Catalog;
use crate::definition::{ConcurrencyPolicy, Definition};
use crate::ids::{ItemId, OrgId, ProjectId, RunId, WorkflowId};
use crate::state::run;

/// Definitions read by admission at submit, cached for the process (versions are immutable).
static CATALOG: LazyLock<Catalog> = LazyLock::new(Catalog::default);

/// A run as admission sees it.
pub(crate) struct Candidate {
    pub org: OrgId,
    pub project: ProjectId,
    pub run: RunId,
    pub workflow: WorkflowId,
    pub item: Option<ItemId>,
    pub def: Arc<Definition>,
    /// `approval: required`: admitted once a person said yes, since waiting for them should
    /// hold no slot.
    pub needs_approval: bool,
    /// At submit, `skip` and a full org line refuse the run, and a throttle is left to the
    /// engine (its window counts admissions in the change that starts the first step).
    pub at_submit: bool,
}

/// Where a run stood before this change: its place in line, the leases it holds, whether a
/// throttle counted it.
#[derive(Debug, Default)]
struct Standing {
    wait: Option<(String, i64)>,
    leases: Vec<String>,
    throttled: bool,
}

/// What admission decided for a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Admitted,
    /// In line (its wait row says where).
    Held,
    /// Left to the engine's first advance (a throttle, an approval to start).
    Deferred,
}

#[derive(Debug)]
struct Hold {
    queue: String,
    hold: &'static str,
    detail: String,
    /// A wake for the run after this delay (a throttle's window, a budget's period).
    wake: Option<Duration>,
}

/// The writes a verdict needs, made once the run's row exists.
#[derive(Debug, Default)]
struct Plan {
    leases: Vec<String>,
    throttle_start: Option<String>,
    /// The queue whose line the run leaves, and whether it took room there.
    leave: Option<(String, bool)>,
    /// Queues with room left and runs in line after this one.
    pokes: Vec<String>,
    /// `drop`: the oldest run in line, cancelled, with the reason.
    victim: Option<(RunId, String)>,
    hold: Option<Hold>,
    deferred: bool,
}

/// Admission at submit, before the run's row is written: locks the queues, decides, and may
/// refuse (`skip`, a full org line). `apply` then makes the writes.
pub(crate) async fn plan_submit(ch: &mut Change, c: &Candidate) -> Result<PlanRef> {
    let plan = plan(ch, c, &Standing::default()).await?;
    Ok(PlanRef(plan))
}

/// A decision taken at submit, to apply once the run exists.
#[derive(Debug)]
pub(crate) struct PlanRef(Plan);

impl PlanRef {
    /// Whether the run may start now (its `advance` wake is written): admitted, or deferred
    /// to the engine.
    pub(crate) fn starts(&self) -> bool {
        self.0.hold.is_none()
    }

    pub(crate) fn admitted(&self) -> bool {
        self.0.hold.is_none() && !self.0.deferred
    }
}

/// Writes what the submit's plan decided, once the run's row exists.
pub(crate) async fn apply_submit(ch: &mut Change, c: &Candidate, plan: PlanRef) -> Result<Verdict> {
    apply(ch, c, &Standing::default(), plan.0).await
}

/// The definition of a run's workflow version, for admission at submit.
pub(crate) async fn definition(ch: &mut Change, workflow: WorkflowId, version: i32) -> Result<Arc<Definition>> {
    CATALOG.get(ch.conn(), workflow, version).await
}

/// Admission at the engine: a run that has not started yet (deferred at submit, or woken in
/// line) is admitted or stays held. Returns whether it was admitted.
pub async fn admit(ch: &mut Change, row: &runs::RunRow, def: &Arc<Definition>) -> Result<bool> {
    ch.locked(row.run_id)?;
    let c = Candidate {
        org: row.org_id,
        project: row.project_id,
        run: row.run_id,
        workflow: row.workflow_id,
        item: row.item_id,
        def: def.clone(),
        needs_approval: row.needs_approval,
        at_submit: false,
    };
    let (queue, seq, leases, throttled): (Option<String>, Option<i64>, Vec<String>, bool) = sqlx::query_as(
        "SELECT w.queue, w.seq, ARRAY(SELECT group_key FROM concurrency_leases WHERE run_id = $1), \
                EXISTS (SELECT 1 FROM admission_starts s WHERE s.org_id = $2 AND s.queue = $3 AND s.run_id = $1) \
         FROM (SELECT 1) one LEFT JOIN admission_waits w ON w.run_id = $1",
    )
    .bind(row.run_id)
    .bind(row.org_id)
    .bind(rules::throttle_queue(&row.workflow_id.0.to_string()))
    .fetch_one(ch.conn())
    .await?;
    let standing = Standing { wait: queue.zip(seq), leases, throttled };
    let was_waiting = standing.wait.is_some();
    let plan = plan(ch, &c, &standing).await?;
    let verdict = apply(ch, &c, &standing, plan).await?;
    if verdict == Verdict::Admitted {
        sqlx::query("UPDATE runs SET admitted_at = now() WHERE run_id = $1").bind(row.run_id).execute(&mut *ch.tx).await?;
        ch.forget_run_row(row.run_id);
        if was_waiting {
            ch.event(row.run_id, "run.admitted", None, json!({}))?;
        }
    }
    Ok(verdict == Verdict::Admitted)
}

/// Locks a queue's row for an admission (creating it), with its current cap; returns the cap
/// and how many wait in line.
async fn lock_queue(ch: &mut Change, org: OrgId, queue: &str, cap: Option<i32>, window_ms: Option<i64>) -> Result<(Option<i32>, i32)> {
    Ok(sqlx::query_as(
        "INSERT INTO admission_queues (org_id, queue, cap, window_ms) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (org_id, queue) DO UPDATE SET cap = EXCLUDED.cap, window_ms = EXCLUDED.window_ms \
         RETURNING cap, waiting",
    )
    .bind(org)
    .bind(queue)
    .bind(cap)
    .bind(window_ms)
    .fetch_one(&mut *ch.tx)
    .await?)
}

/// Locks a queue's row unless another change holds it; false when one does. A queue that does
/// not exist yet is created (and locked).
async fn try_lock_queue(ch: &mut Change, org: OrgId, queue: &str) -> Result<bool> {
    let got: Option<i32> = sqlx::query_scalar("SELECT waiting FROM admission_queues WHERE org_id = $1 AND queue = $2 FOR UPDATE SKIP LOCKED")
        .bind(org)
        .bind(queue)
        .fetch_optional(&mut *ch.tx)
        .await?;
    if got.is_some() {
        return Ok(true);
    }
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM admission_queues WHERE org_id = $1 AND queue = $2)")
        .bind(org)
        .bind(queue)
        .fetch_one(&mut *ch.tx)
        .await?;
    Ok(!exists)
}

/// Runs in line ahead of place `seq`.
async fn ahead_of(ch: &mut Change, org: OrgId, queue: &str, seq: i64) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM admission_waits WHERE org_id = $1 AND queue = $2 AND seq < $3")
        .bind(org)
        .bind(queue)
        .bind(seq)
        .fetch_one(&mut *ch.tx)
        .await?)
}

async fn leases_in(ch: &mut Change, org: OrgId, queue: &str) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM concurrency_leases WHERE org_id = $1 AND group_key = $2")
        .bind(org)
        .bind(queue)
        .fetch_one(&mut *ch.tx)
        .await?)
}

/// What occupies a board column (`queue` is its line): the runs holding a lease in its line,
/// and the items of the project whose stored card is in the column, except those a lease
/// holder is about (counted once) and `except` (the item of the run asking: its card being in
/// the column already is room it holds, not room it takes).
async fn board_occupied(ch: &mut Change, org: OrgId, queue: &str, except: Option<ItemId>) -> Result<i64> {
    let Some((project, column)) = rules::board_of(queue) else { return Ok(0) };
    let project: uuid::Uuid = project.parse().map_err(|_| StoreError::Invalid(format!("bad board line {queue}")))?;
    Ok(sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM concurrency_leases WHERE org_id = $1 AND group_key = $2) \
              + (SELECT count(*) FROM items i WHERE i.project_id = $3 AND i.org_id = $1 \
                   AND lower(i.data #>> '{board,column}') = $4 AND i.item_id IS DISTINCT FROM $5 \
                   AND NOT EXISTS (SELECT 1 FROM concurrency_leases l JOIN runs r ON r.run_id = l.run_id \
                                   WHERE l.org_id = $1 AND l.group_key = $2 AND r.item_id = i.item_id))",
    )
    .bind(org)
    .bind(queue)
    .bind(project)
    .bind(column)
    .bind(except)
    .fetch_one(&mut *ch.tx)
    .await?)
}

/// Whether the run may take room in a line: it is the head, or it is not in line and no one is.
async fn first_in_line(ch: &mut Change, c: &Candidate, s: &Standing, queue: &str, waiting: i32) -> Result<(bool, i64)> {
    let ahead = match &s.wait {
        Some((q, seq)) if q == queue => ahead_of(ch, c.org, queue, *seq).await?,
        _ => i64::from(waiting),
    };
    Ok((ahead == 0, ahead))
}

fn in_line(s: &Standing, queue: &str) -> bool {
    s.wait.as_ref().is_some_and(|(q, _)| q == queue)
}

/// The stages, in order; stops at the first that holds the run.
async fn plan(ch: &mut Change, c: &Candidate, s: &Standing) -> Result<Plan> {
    let mut plan = Plan::default();
    let def = c.def.clone();
    if c.at_submit && c.needs_approval {
        plan.deferred = true;
        return Ok(plan);
    }
    let workflow = c.workflow.0.to_string();
    let project = c.project.0.to_string();

    // Gates. The workflow's and project's rows are read FOR SHARE: a pause or unpause updates
    // them, so it is ordered with this admission.
    let (name, wf_paused, project_paused, has_budgets): (String, bool, bool, bool) = sqlx::query_as(
        "SELECT w.name, w.paused, p.paused, \
                EXISTS (SELECT 1 FROM budgets b WHERE b.org_id = w.org_id AND (b.project_id IS NULL OR b.project_id = w.project_id)) \
         FROM workflows w JOIN projects p ON p.project_id = w.project_id \
         WHERE w.workflow_id = $1 AND w.org_id = $2 FOR SHARE OF w, p",
    )
    .bind(c.workflow)
    .bind(c.org)
    .fetch_one(&mut *ch.tx)
    .await?;
    let gates = [
        (project_paused, rules::project_paused_queue(&project), "the project is paused".to_owned()),
        (wf_paused, rules::paused_queue(&workflow), format!("workflow {name} is paused")),
    ];
    for (closed, queue, detail) in gates {
        if in_line(s, &queue) || closed {
            lock_queue(ch, c.org, &queue, None, None).await?;
        }
        if closed {
            plan.hold = Some(Hold { queue, hold: "paused", detail, wake: None });
            return Ok(plan);
        }
    }
    let spent = if has_budgets { budgets::holding(ch, c.org, c.project).await? } else { None };
    // The gate's row only counts its line: locked by the runs that join or leave it.
    if in_line(s, rules::BUDGET_QUEUE) || spent.is_some() {
        lock_queue(ch, c.org, rules::BUDGET_QUEUE, None, None).await?;
    }
    if let Some(spent) = spent {
        plan.hold = Some(Hold { queue: rules::BUDGET_QUEUE.into(), hold: "budget", detail: spent.scope, wake: Some(spent.until) });
        return Ok(plan);
    }

    // The concurrency group.
    if let Some(conc) = &def.concurrency {
        let item = match c.item {
            Some(item) => sqlx::query_scalar::<_, String>("SELECT key FROM items WHERE item_id = $1")
                .bind(item)
                .fetch_optional(&mut *ch.tx)
                .await?
                .map(ItemRef::from_key),
            None => None,
        };
        let queue = rules::group_queue(&project, &name, conc, item.as_ref());
        if !s.leases.contains(&queue) {
            let limit = i32::try_from(conc.limit).unwrap_or(i32::MAX);
            let (_, waiting) = lock_queue(ch, c.org, &queue, Some(limit), None).await?;
            let room = i64::from(limit) - leases_in(ch, c.org, &queue).await?;
            let (first, _) = first_in_line(ch, c, s, &queue, waiting).await?;
            if room > 0 && first {
                take_room(&mut plan, s, &queue, room - 1, waiting);
                plan.leases.push(queue.clone());
            } else {
                let group = rules::group_name(&queue).to_owned();
                match (c.at_submit, conc.policy) {
                    (true, ConcurrencyPolicy::Skip) => {
                        return Err(StoreError::Refused(format!("skipped: concurrency group {} is full ({} running)", cap(&group), conc.limit)));
                    }
                    (true, ConcurrencyPolicy::Drop) if waiting > 0 => {
                        if let Some(victim) = oldest_in_line(ch, c.org, &queue).await? {
                            plan.victim = Some((victim, format!("dropped: a newer run took its place in concurrency group {}", cap(&group))));
                        }
                    }
                    _ => {}
                }
                plan.hold = Some(Hold { queue, hold: "lease", detail: group, wake: None });
                return Ok(plan);
            }
        }
    }

    // Board columns with a WIP limit that this workflow moves cards into. A run in line at a
    // column whose limit was removed since leaves that line (its row is locked to do so).
    let columns = rules::board_columns(&def);
    let in_board_line = s.wait.as_ref().filter(|(q, _)| rules::queue_kind(q) == QueueKind::Board).map(|(q, _)| q.clone());
    if !columns.is_empty() || in_board_line.is_some() {
        let limits: Vec<(String, String, i32)> = sqlx::query_as(
            "SELECT column_key, column_name, wip_limit FROM board_limits WHERE org_id = $1 AND project_id = $2 AND column_key = ANY($3) \
             ORDER BY column_key FOR SHARE",
        )
        .bind(c.org)
        .bind(c.project)
        .bind(&columns)
        .fetch_all(&mut *ch.tx)
        .await?;
        if let Some(q) = &in_board_line {
            if !limits.iter().any(|(key, _, _)| rules::board_queue(&project, key) == *q) {
                lock_queue(ch, c.org, q, None, None).await?;
            }
        }
        for (key, name, limit) in limits {
            let queue = rules::board_queue(&project, &key);
            if s.leases.contains(&queue) {
                continue;
            }
            let (_, waiting) = lock_queue(ch, c.org, &queue, Some(limit), None).await?;
            let room = i64::from(limit) - board_occupied(ch, c.org, &queue, c.item).await?;
            let (first, _) = first_in_line(ch, c, s, &queue, waiting).await?;
            if room > 0 && first {
                take_room(&mut plan, s, &queue, room - 1, waiting);
                plan.leases.push(queue);
            } else {
                plan.hold = Some(Hold { queue, hold: "board", detail: format!("{name} (WIP limit {limit})"), wake: None });
                return Ok(plan);
            }
        }
    }

    // The throttle: counted by the engine, in the change that starts the first step.
    if let Some(throttle) = &def.throttle {
        if c.at_submit {
            plan.deferred = true;
            return Ok(plan);
        }
        let queue = rules::throttle_queue(&workflow);
        if !s.throttled {
            let limit = i32::try_from(throttle.limit).unwrap_or(i32::MAX);
            let window_ms = i64::try_from(throttle.per.as_millis()).unwrap_or(i64::MAX).max(1);
            let (_, waiting) = lock_queue(ch, c.org, &queue, Some(limit), Some(window_ms)).await?;
            let (count, opens_in) = window(ch, c.org, &queue, window_ms).await?;
            let room = i64::from(limit) - count;
            let (first, _) = first_in_line(ch, c, s, &queue, waiting).await?;
            if room > 0 && first {
                take_room(&mut plan, s, &queue, room - 1, waiting);
                // The next in line wakes when the window has room again, even with none now.
                if !plan.pokes.contains(&queue) && waiting > i32::from(in_line(s, &queue)) {
                    plan.pokes.push(queue.clone());
                }
                plan.throttle_start = Some(queue);
            } else {
                let wake = first.then(|| opens_in.unwrap_or(Duration::ZERO));
                plan.hold = Some(Hold { queue, hold: "throttle", detail: format!("{} per {}", throttle.limit, humantime::format_duration(throttle.per)), wake });
                return Ok(plan);
            }
        }
    }

    // The org's cap on running runs. Every admission in the org takes its row, so a submit
    // whose change cannot take it at once (another change holds it) does not wait behind it:
    // the run is left to the engine's first advance, which waits its turn.
    if !s.leases.iter().any(|l| l == rules::ORG_QUEUE) {
        if c.at_submit && !try_lock_queue(ch, c.org, rules::ORG_QUEUE).await? {
            plan.deferred = true;
            return Ok(plan);
        }
        let cap_now: i32 = sqlx::query_scalar("SELECT running_cap FROM orgs WHERE org_id = $1").bind(c.org).fetch_one(&mut *ch.tx).await?;
        let (_, waiting) = lock_queue(ch, c.org, rules::ORG_QUEUE, Some(cap_now), None).await?;
        let room = i64::from(cap_now) - leases_in(ch, c.org, rules::ORG_QUEUE).await?;
        let (first, _) = first_in_line(ch, c, s, rules::ORG_QUEUE, waiting).await?;
        if room > 0 && first {
            take_room(&mut plan, s, rules::ORG_QUEUE, room - 1, waiting);
            plan.leases.push(rules::ORG_QUEUE.into());
        } else {
            if c.at_submit && waiting >= rules::MAX_WAITING && !in_line(s, rules::ORG_QUEUE) {
                return Err(StoreError::Full(format!("{waiting} runs already wait for the org's cap of {cap_now} running runs")));
            }
            plan.hold = Some(Hold { queue: rules::ORG_QUEUE.into(), hold: "org_cap", detail: cap_now.to_string(), wake: None });
            return Ok(plan);
        }
    }
    Ok(plan)
}

/// The run takes room in `queue`: it leaves that line if it was in it, and the next in line
/// is woken when room remains.
fn take_room(plan: &mut Plan, s: &Standing, queue: &str, room_left: i64, waiting: i32) {
    let mine = in_line(s, queue);
    if mine {
        plan.leave = Some((queue.to_owned(), true));
    }
    if room_left > 0 && waiting > i32::from(mine) {
        plan.pokes.push(queue.to_owned());
    }
}

/// The oldest run in a line whose row no one else holds, locked. The caller holds the queue's
/// row, so it must not wait on a run's: the run's own advance or a cancel of it may hold it
/// and wait for the queue (a run so busy is passed over for the next in line).
async fn oldest_in_line(ch: &mut Change, org: OrgId, queue: &str) -> Result<Option<RunId>> {
    let oldest: Option<RunId> = sqlx::query_scalar(
        "SELECT w.run_id FROM admission_waits w JOIN runs r ON r.run_id = w.run_id WHERE w.org_id = $1 AND w.queue = $2 \
         ORDER BY w.seq LIMIT 1 FOR NO KEY UPDATE OF r SKIP LOCKED",
    )
    .bind(org)
    .bind(queue)
    .fetch_optional(&mut *ch.tx)
    .await?;
    match oldest {
        Some(run) => Ok(ch.lock_run(org, run).await?.map(|_| run)),
        None => Ok(None),
    }
}

/// A throttle's starts in its window, and when the oldest of them leaves it. Starts older
/// than the window are pruned first (by whoever holds the queue's row).
async fn window(ch: &mut Change, org: OrgId, queue: &str, window_ms: i64) -> Result<(i64, Option<Duration>)> {
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

/// Makes the writes of a plan; the run's row exists and is locked.
async fn apply(ch: &mut Change, c: &Candidate, s: &Standing, mut plan: Plan) -> Result<Verdict> {
    if let Some((victim, reason)) = plan.victim.take() {
        match runs::finish::<run::Cancelled>(ch, victim, Some(&reason)).await {
            // It ended meanwhile: its place is free already.
            Ok(_) | Err(StoreError::Conflict(_)) => {}
            Err(e) => return Err(e),
        }
    }
    if !plan.leases.is_empty() {
        sqlx::query(
            "INSERT INTO concurrency_leases (org_id, project_id, group_key, run_id) SELECT $1, $2, g, $3 FROM unnest($4::text[]) AS g \
             ON CONFLICT DO NOTHING",
        )
        .bind(c.org)
        .bind(c.project)
        .bind(c.run)
        .bind(&plan.leases)
        .execute(&mut *ch.tx)
        .await?;
    }
    if let Some(queue) = &plan.throttle_start {
        sqlx::query("INSERT INTO admission_starts (org_id, queue, run_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING")
            .bind(c.org)
            .bind(queue)
            .bind(c.run)
            .execute(&mut *ch.tx)
            .await?;
    }
    // A run leaves its line when it took room there, or when it is now held elsewhere.
    let moved = match (&s.wait, &plan.hold) {
        (Some((q, _)), Some(h)) if *q != h.queue => Some((q.clone(), false)),
        (Some((q, _)), None) if plan.leave.is_none() => Some((q.clone(), false)),
        _ => None,
    };
    if let Some((queue, took_room)) = plan.leave.take().or(moved) {
        sqlx::query("DELETE FROM admission_waits WHERE run_id = $1").bind(c.run).execute(&mut *ch.tx).await?;
        sqlx::query("UPDATE admission_queues SET waiting = waiting - 1 WHERE org_id = $1 AND queue = $2")
            .bind(c.org)
            .bind(&queue)
            .execute(&mut *ch.tx)
            .await?;
        // Room this run was woken for, and did not take, goes to the next in line.
        if !took_room && rules::queue_kind(&queue) != QueueKind::Gate && !plan.pokes.contains(&queue) {
            plan.pokes.push(queue);
        }
    }
    for queue in &plan.pokes {
        poke(ch, c.org, queue).await?;
    }
    if let Some(hold) = plan.hold {
        let stays = in_line(s, &hold.queue);
        let ahead = if stays {
            None
        } else {
            let ahead: i32 = sqlx::query_scalar("UPDATE admission_queues SET waiting = waiting + 1 WHERE org_id = $1 AND queue = $2 RETURNING waiting - 1")
                .bind(c.org)
                .bind(&hold.queue)
                .fetch_one(&mut *ch.tx)
                .await?;
            let line: i64 = sqlx::query_scalar(
                "INSERT INTO admission_waits (org_id, project_id, run_id, queue, hold, detail) VALUES ($1, $2, $3, $4, $5, $6) RETURNING seq",
            )
            .bind(c.org)
            .bind(c.project)
            .bind(c.run)
            .bind(&hold.queue)
            .bind(hold.hold)
            .bind(cap(&hold.detail))
            .fetch_one(&mut *ch.tx)
            .await?;
            Some((ahead, line))
        };
        // A budget's period-end wake is written once, when the run joins the line; a throttle's
        // head needs one each time it finds the window still full.
        if let Some(delay) = hold.wake.filter(|_| !stays || hold.hold == "throttle") {
            ch.wake(c.run, None, delay, "admit", true).await?;
        }
        if let Some((ahead, line)) = ahead {
            // `line` is its ticket: runs of one queue are released in the order of their tickets.
            ch.event(c.run, "run.held", None, json!({ "hold": hold.hold, "detail": cap(&hold.detail), "ahead": ahead, "line": line }))?;
        }
        return Ok(Verdict::Held);
    }
    Ok(if plan.deferred { Verdict::Deferred } else { Verdict::Admitted })
}

/// Wakes the runs that may take room in a queue whose row this change has locked (either
/// way): the first in line, as many as there is room for (at most [`rules::WAKE_AT_ONCE`]);
/// for a throttle with no room now, its head at the time the window has room; for a gate,
/// everyone in line.
async fn poke(ch: &mut Change, org: OrgId, queue: &str) -> Result<()> {
    let (cap_now, window_ms, waiting): (Option<i32>, Option<i64>, i32) =
        sqlx::query_as("SELECT cap, window_ms, waiting FROM admission_queues WHERE org_id = $1 AND queue = $2")
            .bind(org)
            .bind(queue)
            .fetch_optional(&mut *ch.tx)
            .await?
            .unwrap_or((None, None, 0));
    if waiting == 0 {
        return Ok(());
    }
    let (room, later) = match rules::queue_kind(queue) {
        QueueKind::Gate => (i64::from(waiting), None),
        QueueKind::Leases => (i64::from(cap_now.unwrap_or(0)) - leases_in(ch, org, queue).await?, None),
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
    let woken = sqlx::query(
        "INSERT INTO wakes (org_id, run_id, due_at, reason) \
         SELECT org_id, run_id, now() + $4 * interval '1 millisecond', 'admit' FROM admission_waits \
         WHERE org_id = $1 AND queue = $2 ORDER BY seq LIMIT $3",
    )
    .bind(org)
    .bind(queue)
    .bind(n)
    .bind(delay.as_millis() as f64)
    .execute(&mut *ch.tx)
    .await?;
    if woken.rows_affected() > 0 {
        ch.note_wake(delay);
    }
    Ok(())
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

/// Hands on what the runs that ended in this change held, as the change commits: its last
/// statements, so the queue rows are held only for the commit, and a change that admitted a
/// run earlier (`FOR UPDATE`) never asks for a weaker lock it already has the stronger of,
/// nor one that admits after a release waits to upgrade its share (the upgrade two changes
/// would deadlock on). Rows are locked in stage order: `FOR SHARE` where a run held a lease,
/// `FOR UPDATE` where it was in line (`waiting` changes).
pub(super) async fn release(ch: &mut Change, queues: Vec<(OrgId, String, bool)>) -> Result<()> {
    // One statement per queue however many runs ended: how many of them left its line.
    let mut by_queue: std::collections::BTreeMap<(u8, String, uuid::Uuid), (OrgId, i32)> = std::collections::BTreeMap::new();
    for (org, queue, was_in_line) in queues {
        let entry = by_queue.entry((rules::stage(&queue), queue, org.0)).or_insert((org, 0));
        entry.1 += i32::from(was_in_line);
    }
    for ((_, queue, _), (org, left)) in by_queue {
        let queue = queue.as_str();
        let waiting: Option<i32> = if left > 0 {
            sqlx::query_scalar("UPDATE admission_queues SET waiting = waiting - $3 WHERE org_id = $1 AND queue = $2 RETURNING waiting")
                .bind(org)
                .bind(queue)
                .bind(left)
                .fetch_optional(&mut *ch.tx)
                .await?
        } else {
            sqlx::query_scalar("SELECT waiting FROM admission_queues WHERE org_id = $1 AND queue = $2 FOR SHARE")
                .bind(org)
                .bind(queue)
                .fetch_optional(&mut *ch.tx)
                .await?
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
    let done = sqlx::query("UPDATE projects SET paused = $3 WHERE org_id = $1 AND project_id = $2")
        .bind(org)
        .bind(project)
        .bind(paused)
        .execute(&mut *ch.tx)
        .await?;
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
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM projects WHERE org_id = $1 AND project_id = $2").bind(org).bind(project).fetch_optional(&mut *ch.tx).await?;
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
            sqlx::query("DELETE FROM board_limits WHERE org_id = $1 AND project_id = $2 AND column_key = $3")
                .bind(org)
                .bind(project)
                .bind(&key)
                .execute(&mut *ch.tx)
                .await?;
        }
    }
    let action = if limit.is_some() { "board.wip_limit" } else { "board.wip_limit_remove" };
    ch.audit(org, Some(project), action, ("project", project.to_string()), json!({ "column": cap(name), "from": before, "to": limit }))?;
    let queue = rules::board_queue(&project.0.to_string(), &key);
    lock_queue(ch, org, &queue, limit, None).await?;
    poke(ch, org, &queue).await
}
