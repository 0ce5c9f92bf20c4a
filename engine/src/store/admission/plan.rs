//! Admission's decision for one run: the stages in order (gates, the concurrency group, board
//! columns, the throttle, the org's cap), the plan they make, and the writes that apply it.
//! A `drop` group's victim is not cancelled here: the caller ends it before applying the plan
//! (`runs::submit`, `admission::admit`), since ending a run stands above admission.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use serde_json::json;

use super::gates::{self, Gates};
use super::lines::{ahead_of, board_occupied, held_in, lock_queue, poke, try_lock_queue, window};
use crate::admission::{self as rules, ItemRef, QueueKind};
use crate::catalog::Catalog;
use crate::definition::{ConcurrencyPolicy, Definition};
use crate::ids::{ItemId, OrgId, ProjectId, RunId, WorkflowId};
use crate::store::run_rows::RunRow;
use crate::store::{Change, Result, StoreError, budgets, cap};

/// Definitions read by admission at submit, cached for the process (versions are immutable).
pub(crate) static CATALOG: LazyLock<Catalog> = LazyLock::new(Catalog::default);

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
pub(crate) struct Standing {
    pub wait: Option<(String, i64)>,
    pub leases: Vec<String>,
    pub throttled: bool,
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
pub(crate) struct Hold {
    pub queue: String,
    pub hold: &'static str,
    pub detail: String,
    /// A wake for the run after this delay (a throttle's window, a budget's period).
    pub wake: Option<Duration>,
}

/// The writes a verdict needs, made once the run's row exists.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub leases: Vec<String>,
    pub throttle_start: Option<String>,
    /// The queue whose line the run leaves, and whether it took room there.
    pub leave: Option<(String, bool)>,
    /// Queues with room left and runs in line after this one.
    pub pokes: Vec<String>,
    /// `drop`: the oldest run in line, cancelled, with the reason.
    pub victim: Option<(RunId, String)>,
    pub hold: Option<Hold>,
    pub deferred: bool,
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

    /// `drop`: the oldest run in line and the reason it is cancelled, for the caller to end
    /// before the plan is applied.
    pub(crate) fn take_victim(&mut self) -> Option<(RunId, String)> {
        self.0.victim.take()
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

/// Whether the run may take room in a line: it is the head, or it is not in line and no one is.
pub(crate) async fn first_in_line(ch: &mut Change, c: &Candidate, s: &Standing, queue: &str, waiting: i32) -> Result<(bool, i64)> {
    let ahead = match &s.wait {
        Some((q, seq)) if q == queue => ahead_of(ch, c.org, queue, *seq).await?,
        _ => i64::from(waiting),
    };
    Ok((ahead == 0, ahead))
}

pub(crate) fn in_line(s: &Standing, queue: &str) -> bool {
    s.wait.as_ref().is_some_and(|(q, _)| q == queue)
}

/// The stages, in order; stops at the first that holds the run.
pub(crate) async fn plan(ch: &mut Change, c: &Candidate, s: &Standing) -> Result<Plan> {
    let mut plan = Plan::default();
    let def = c.def.clone();
    if c.at_submit && c.needs_approval {
        plan.deferred = true;
        return Ok(plan);
    }
    let workflow = c.workflow.0.to_string();
    let project = c.project.0.to_string();

    // Gates, read by this statement or, for a new item's first trigger event, by its insert.
    let columns = rules::board_columns(&def);
    let org_next = gates::org_next(&def, c.at_submit);
    let read = match ch.gates_ahead.take() {
        Some(ahead) if ahead.workflow == c.workflow && ahead.org_next == org_next => ahead.gates,
        _ => {
            let sql = gates::select("$1", "$2", "$3", "$4");
            sqlx::query_as(&sql).bind(c.workflow).bind(c.org).bind(org_next).bind(rules::ORG_QUEUE).fetch_one(&mut *ch.tx).await?
        }
    };
    let Gates { name, workflow_paused: wf_paused, project_paused, has_budgets, org_free } = read;
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
            Some(item) => {
                sqlx::query_scalar::<_, String>("SELECT key FROM items WHERE item_id = $1").bind(item).fetch_optional(&mut *ch.tx).await?.map(ItemRef::from_key)
            }
            None => None,
        };
        let queue = rules::group_queue(&project, &name, conc, item.as_ref());
        if !s.leases.contains(&queue) {
            let limit = i32::try_from(conc.limit).unwrap_or(i32::MAX);
            let (_, waiting) = lock_queue(ch, c.org, &queue, Some(limit), None).await?;
            let room = i64::from(limit) - held_in(ch, c.org, &queue).await?;
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
                plan.hold =
                    Some(Hold { queue, hold: "throttle", detail: format!("{} per {}", throttle.limit, humantime::format_duration(throttle.per)), wake });
                return Ok(plan);
            }
        }
    }

    // The org's cap on running runs. Every admission in the org takes its row, so a submit
    // whose change cannot take it at once (another change holds it) does not wait behind it:
    // the run is left to the engine's first advance, which waits its turn.
    if !s.leases.iter().any(|l| l == rules::ORG_QUEUE) {
        if c.at_submit {
            let free = match org_free {
                Some(free) => free,
                None => try_lock_queue(ch, c.org, rules::ORG_QUEUE).await?,
            };
            if !free {
                plan.deferred = true;
                return Ok(plan);
            }
        }
        let cap_now: i32 = sqlx::query_scalar("SELECT running_cap FROM orgs WHERE org_id = $1").bind(c.org).fetch_one(&mut *ch.tx).await?;
        let (_, waiting) = lock_queue(ch, c.org, rules::ORG_QUEUE, Some(cap_now), None).await?;
        let room = i64::from(cap_now) - held_in(ch, c.org, rules::ORG_QUEUE).await?;
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
pub(crate) fn take_room(plan: &mut Plan, s: &Standing, queue: &str, room_left: i64, waiting: i32) {
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
pub(crate) async fn oldest_in_line(ch: &mut Change, org: OrgId, queue: &str) -> Result<Option<RunId>> {
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

/// Makes the writes of a plan; the run's row exists and is locked. The victim, if any, has ended already (`PlanRef::take_victim`).
async fn apply(ch: &mut Change, c: &Candidate, s: &Standing, mut plan: Plan) -> Result<Verdict> {
    if !plan.leases.is_empty() {
        // Each queue's count goes up by the leases taken in it (its row is locked FOR UPDATE by
        // this change's `lock_queue`); a lease the run held already is not taken again.
        sqlx::query(
            "WITH taken AS (INSERT INTO concurrency_leases (org_id, project_id, group_key, run_id) \
                            SELECT $1, $2, g, $3 FROM unnest($4::text[]) AS g ON CONFLICT DO NOTHING RETURNING group_key) \
             UPDATE admission_queues SET held = held + 1 WHERE org_id = $1 AND queue IN (SELECT group_key FROM taken)",
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
        sqlx::query("UPDATE admission_queues SET waiting = waiting - 1 WHERE org_id = $1 AND queue = $2").bind(c.org).bind(&queue).execute(&mut *ch.tx).await?;
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

/// Admission at the engine, up to its decision: the run's standing (its place in line, its
/// leases, whether a throttle counted it) and the plan for it. `admit_at_engine` applies it.
pub(crate) async fn at_engine(ch: &mut Change, row: &RunRow, def: &Arc<Definition>) -> Result<(Candidate, Standing, PlanRef)> {
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
    let plan = plan(ch, &c, &standing).await?;
    Ok((c, standing, PlanRef(plan)))
}

/// Applies the engine's plan for a run (its victim ended already); returns whether it was
/// admitted.
pub(crate) async fn admit_at_engine(ch: &mut Change, c: &Candidate, standing: &Standing, plan: PlanRef) -> Result<bool> {
    let was_waiting = standing.wait.is_some();
    let verdict = apply(ch, c, standing, plan.0).await?;
    if verdict == Verdict::Admitted {
        sqlx::query("UPDATE runs SET admitted_at = now() WHERE run_id = $1").bind(c.run).execute(&mut *ch.tx).await?;
        ch.forget_run_row(c.run);
        if was_waiting {
            ch.event(c.run, "run.admitted", None, json!({}))?;
        }
    }
    Ok(verdict == Verdict::Admitted)
}
