//! The claim rule (see `store::triggers`): a trigger event is recorded under its dedup key
//! and opens a run, waits behind a started one, supersedes unstarted ones, or is blocked by
//! the item's cycle budget; a change of the item revokes what no longer matches; a run's end
//! judges the events queued behind it again ([`rejudge`]).
//!
//! Opening and cancelling runs stands above this file (`runs`): the claim is handed the two
//! operations it needs, [`RunOps`], so that nothing here calls back into `runs`.

use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::{FromRow as _, Row};
use uuid::Uuid;

use super::items::{ItemRow, WorkflowInfo, lock_item, project_context, workflow};
use crate::ids::{ItemId, OrgId, ProjectId, RunId, WorkflowId};
use crate::item_keys::{content_hash, dedup_key};
use crate::judge::{self, Verdict};
use crate::store::admission::gates::{self, Gates, ReadAhead};
use crate::store::run_rows::{NewRun, RunRow};
use crate::store::{Change, Result, StoreError, cap};

/// What the claim does to runs, handed to it by `runs` (`runs::CLAIM_RUNS`): open one, and
/// cancel an unstarted one with a reason.
pub(crate) struct RunOps {
    pub submit: for<'a> fn(&'a mut Change, NewRun) -> BoxFuture<'a, Result<RunId>>,
    pub cancel: for<'a> fn(&'a mut Change, RunId, &'a str) -> BoxFuture<'a, Result<()>>,
}

/// What became of a trigger event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "claim", rename_all = "snake_case")]
pub enum Claim {
    /// The same workflow already acted on the same item content (its dedup key is stored).
    Duplicate,
    /// A new run, after cancelling the unstarted ones it supersedes.
    Opened { event: Uuid, run: RunId, superseded: Vec<RunId> },
    /// Waits behind a started run.
    Queued { event: Uuid, behind: RunId },
    /// The cycle budget is used up: an ask waits under "Needs you".
    Blocked { event: Uuid, superseded: Vec<RunId>, cycles: i32 },
    /// Judged again when the run it waited behind ended, and no longer matching.
    Revoked { event: Uuid },
    /// Admission refused the run: its concurrency group is full with policy `skip`, or the
    /// org's line is full. Its cycle is given back.
    Skipped { event: Uuid, reason: String },
}

/// A trigger event to record and claim.
#[derive(Debug, Clone)]
pub struct NewEvent<'a> {
    pub org: OrgId,
    pub project: ProjectId,
    pub workflow: &'a WorkflowInfo,
    /// The item, locked in this change (`lock_item`).
    pub item: &'a ItemRow,
    pub repository: &'a str,
    pub number: Option<i64>,
    /// The `trigger` variable, kept so that the event can be judged again.
    pub trigger: Value,
    pub delivery: Option<&'a str>,
}

/// One event as the claim sees it.
pub(crate) struct EventRef {
    pub id: Uuid,
    pub org: OrgId,
    pub project: ProjectId,
    pub item: ItemId,
    pub generation: i32,
    pub trigger: Value,
    /// The item was created by this change: no run is open on it ([`ItemRow::fresh`]).
    pub fresh_item: bool,
}

/// Records a trigger event under its dedup key and applies the claim rule.
pub(crate) async fn submit_event(ch: &mut Change, new: NewEvent<'_>, runs: &RunOps) -> Result<Claim> {
    let hash = new.item.content_hash.clone().unwrap_or_else(|| content_hash(&new.item.data));
    let generation = new.item.generation;
    let key = dedup_key(&new.workflow.name, new.repository, new.number, &hash, generation);
    let id = Uuid::now_v7();
    let payload = json!({ "trigger": new.trigger, "content_hash": hash });
    let insert = "INSERT INTO trigger_events (org_id, project_id, event_id, workflow_id, item_id, dedup_key, source, payload, status, generation, delivery_id) \
         VALUES ($1, $2, $3, $4, $5, $6, 'github', $7, 'accepted', $8, $9) \
         ON CONFLICT ON CONSTRAINT trigger_events_dedup DO NOTHING RETURNING event_id";
    // On an item this change created, the event's insert takes the first cycle of the budget
    // too ([`admit`]): one statement fewer for the first delivery about an issue. Its run is
    // submitted next (no run can be open on the item), so the insert reads admission's gates
    // for it as well, unless a person's approval defers the run before any gate.
    let first_cycle = new.item.fresh && takes_first_cycle(new.workflow);
    let read_gates = first_cycle && !new.workflow.def.approval_required;
    let org_next = gates::org_next(&new.workflow.def, true);
    let sql = if first_cycle {
        // The gates' row is missing when the workflow's is gone: admission then reads, and
        // fails, as it would have.
        let gates = if read_gates { format!(", g.* FROM e LEFT JOIN ({}) g ON true", gates::select("$4", "$1", "$10", "$11")) } else { " FROM e".to_owned() };
        format!(
            "WITH e AS ({insert}, org_id, project_id, item_id, workflow_id, generation), \
                  b AS (INSERT INTO item_cycle_budgets (org_id, project_id, item_id, workflow_id, generation, cycles_used) \
                        SELECT org_id, project_id, item_id, workflow_id, generation, 1 FROM e) \
             SELECT e.event_id{gates}"
        )
    } else {
        insert.to_owned()
    };
    let mut query = sqlx::query(&sql)
        .bind(new.org)
        .bind(new.project)
        .bind(id)
        .bind(new.workflow.id)
        .bind(new.item.item_id)
        .bind(&key)
        .bind(&payload)
        .bind(generation)
        .bind(new.delivery);
    if read_gates {
        query = query.bind(org_next).bind(crate::admission::ORG_QUEUE);
    }
    let Some(row) = query.fetch_optional(&mut *ch.tx).await? else {
        return Ok(Claim::Duplicate);
    };
    if read_gates && row.try_get::<Option<String>, _>("name")?.is_some() {
        ch.gates_ahead = Some(ReadAhead { workflow: new.workflow.id, org_next, gates: Gates::from_row(&row)? });
    }
    let ev = EventRef { id, org: new.org, project: new.project, item: new.item.item_id, generation, trigger: new.trigger, fresh_item: new.item.fresh };
    claim(ch, &ev, new.workflow, runs).await
}

/// An open (top-level) run of a workflow on an item, locked.
pub(crate) struct OpenRun {
    pub run: RunId,
    pub event: Option<Uuid>,
    /// An attempt ever began (a step was leased or started): the claim rule's "started". A
    /// started run is never superseded or revoked, also while it waits between attempts (for
    /// CI, an approval, a retry's backoff): newer events queue behind it, and its cycle is
    /// spent for good.
    pub attempted: bool,
}

/// Whether any attempt of a run `r` ever began: an engine or a host held one of its steps
/// (steps the engine resolves at once, approvals and waits are held by no one).
pub(crate) const ATTEMPTED: &str = "EXISTS (SELECT 1 FROM steps s WHERE s.run_id = r.run_id AND s.holder IS NOT NULL)";

const OPEN_RUN_IDS: &str =
    "SELECT run_id FROM runs WHERE item_id = $1 AND workflow_id = $2 AND status = 'running' AND org_id = $3 AND parent_run_id IS NULL ORDER BY run_id";

/// The open runs of `workflow` on `item`, locked, with whether each has started.
pub(crate) async fn open_runs(ch: &mut Change, org: OrgId, item: ItemId, workflow: WorkflowId) -> Result<Vec<OpenRun>> {
    let ids: Vec<RunId> = sqlx::query_scalar(OPEN_RUN_IDS).bind(item).bind(workflow).bind(org).fetch_all(&mut *ch.tx).await?;
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    ch.lock_runs(&ids).await?;
    // Read again under the locks: a run may have ended, or leased a step, in between.
    let sql = format!(
        "SELECT r.run_id, r.trigger_event_id, {ATTEMPTED} AS attempted \
         FROM runs r WHERE r.run_id = ANY($1) AND r.status = 'running' ORDER BY r.run_id"
    );
    let rows = sqlx::query(&sql).bind(ids.iter().map(|r| r.0).collect::<Vec<_>>()).fetch_all(&mut *ch.tx).await?;
    Ok(rows.iter().map(|r| OpenRun { run: r.get("run_id"), event: r.get("trigger_event_id"), attempted: r.get("attempted") }).collect())
}

pub(crate) async fn claim(ch: &mut Change, ev: &EventRef, wf: &WorkflowInfo, runs: &RunOps) -> Result<Claim> {
    let open = if ev.fresh_item { Vec::new() } else { open_runs(ch, ev.org, ev.item, wf.id).await? };
    if let Some(started) = open.iter().find(|r| r.attempted) {
        set_event(ch, ev.id, "queued", Some(&format!("behind {}", started.run))).await?;
        return Ok(Claim::Queued { event: ev.id, behind: started.run });
    }
    let mut superseded = Vec::new();
    if !open.is_empty() {
        // Events queue only behind a started run, whose end judges them; any still queued here
        // were left by one that ended, and this newer event wins over them.
        supersede_queued(ch, ev, wf.id).await?;
    }
    for old in &open {
        cancel_unstarted(ch, ev.org, old, "superseded", &format!("superseded by {}", ev.id), runs).await?;
        superseded.push(old.run);
    }
    if let Err(Spent { cycles, reason }) = admit(ch, ev, wf).await? {
        set_event(ch, ev.id, "blocked", Some(&reason)).await?;
        ch.audit(ev.org, Some(ev.project), "trigger.blocked", ("item", ev.item.to_string()), json!({ "workflow": wf.name, "event": ev.id, "cycles": cycles }))?;
        return Ok(Claim::Blocked { event: ev.id, superseded, cycles });
    }
    let submitted = (runs.submit)(
        ch,
        NewRun {
            item: Some(ev.item),
            trigger_event: Some(ev.id),
            needs_approval: wf.def.approval_required,
            ..NewRun::of_workflow(ev.org, ev.project, wf.id, wf.version, json!({ "trigger": ev.trigger, "event": ev.id }))
        },
    )
    .await;
    let run = match submitted {
        Ok(run) => run,
        Err(StoreError::Refused(reason) | StoreError::Full(reason)) => {
            sqlx::query("UPDATE item_cycle_budgets SET cycles_used = greatest(cycles_used - 1, 0) WHERE item_id = $1 AND workflow_id = $2")
                .bind(ev.item)
                .bind(wf.id)
                .execute(&mut *ch.tx)
                .await?;
            set_event(ch, ev.id, "skipped", Some(&reason)).await?;
            return Ok(Claim::Skipped { event: ev.id, reason });
        }
        Err(e) => return Err(e),
    };
    // The run's insert marked the event `started` (`runs::submit`).
    Ok(Claim::Opened { event: ev.id, run, superseded })
}

/// The events queued behind `ev`'s workflow on its item, superseded by `ev`.
pub(crate) async fn supersede_queued(ch: &mut Change, ev: &EventRef, workflow: WorkflowId) -> Result<()> {
    sqlx::query(
        "UPDATE trigger_events SET status = 'superseded', reason = $4, decided_at = now() \
         WHERE item_id = $1 AND workflow_id = $2 AND org_id = $3 AND status = 'queued'",
    )
    .bind(ev.item)
    .bind(workflow)
    .bind(ev.org)
    .bind(format!("superseded by {}", ev.id))
    .execute(&mut *ch.tx)
    .await?;
    Ok(())
}

/// Cancels a run that has not started (superseded, revoked): its event takes the same status,
/// and its cycle is given back, since no attempt of it began.
pub(crate) async fn cancel_unstarted(ch: &mut Change, org: OrgId, old: &OpenRun, status: &str, reason: &str, runs: &RunOps) -> Result<()> {
    debug_assert!(!old.attempted, "a started run is never superseded or revoked");
    ch.lock_run(org, old.run).await?;
    (runs.cancel)(ch, old.run, reason).await?;
    if let Some(event) = old.event {
        set_event(ch, event, status, Some(reason)).await?;
        sqlx::query(
            "UPDATE item_cycle_budgets b SET cycles_used = greatest(b.cycles_used - 1, 0) FROM trigger_events e \
             WHERE e.event_id = $1 AND b.item_id = e.item_id AND b.workflow_id = e.workflow_id AND b.generation = e.generation",
        )
        .bind(event)
        .execute(&mut *ch.tx)
        .await?;
    }
    Ok(())
}

pub(crate) async fn set_event(ch: &mut Change, event: Uuid, status: &str, reason: Option<&str>) -> Result<()> {
    sqlx::query("UPDATE trigger_events SET status = $2, reason = $3, decided_at = now() WHERE event_id = $1")
        .bind(event)
        .bind(status)
        .bind(reason.map(cap))
        .execute(&mut *ch.tx)
        .await?;
    Ok(())
}

/// Why a claim opened nothing: the cycles the workflow used on the item, and the event's reason.
pub(crate) struct Spent {
    pub cycles: i32,
    pub reason: String,
}

/// Whether the first claim on an item this change created takes its first cycle by one insert:
/// such an item has no budget rows yet, so no ask waits on it (a budget that allows a cycle)
/// and its generation is the event's.
fn takes_first_cycle(wf: &WorkflowInfo) -> bool {
    wf.def.budget.max_cycles >= 1
}

/// Takes one cycle of the item's budget for the workflow, under the budget row's lock (and the
/// item's, which every claim holds). `Err` when this budget is spent (the ask is recorded then)
/// or another workflow's budget on the item is spent and waits for a person.
pub(crate) async fn admit(ch: &mut Change, ev: &EventRef, wf: &WorkflowInfo) -> Result<Result<(), Spent>> {
    let max = i32::try_from(wf.def.budget.max_cycles).unwrap_or(i32::MAX);
    if ev.fresh_item && takes_first_cycle(wf) {
        // Taken already, by the event's insert (`submit_event`).
        return Ok(Ok(()));
    }
    // The budget row, created when new and locked either way (an upsert's update locks the
    // row as `FOR UPDATE` would), with the item's generation and the first ask open on the item
    // for another workflow (an ask stops every workflow, not only the one that spent its
    // budget): one statement.
    type Row = (i32, i32, i32, Option<String>, Option<i32>, Option<i32>);
    let (generation, used, current, other, other_used, other_max): Row = sqlx::query_as(
        "WITH b AS (INSERT INTO item_cycle_budgets (org_id, project_id, item_id, workflow_id, generation, cycles_used) \
                    VALUES ($3, $4, $1, $2, $5, 0) \
                    ON CONFLICT (item_id, workflow_id) DO UPDATE SET cycles_used = item_cycle_budgets.cycles_used \
                    RETURNING generation, cycles_used) \
         SELECT b.generation, b.cycles_used, (SELECT i.generation FROM items i WHERE i.item_id = $1), a.name, a.cycles_used, a.max_cycles \
         FROM b LEFT JOIN LATERAL (SELECT w.name, o.cycles_used, (o.ask->>'max_cycles')::int AS max_cycles \
                                   FROM item_cycle_budgets o JOIN workflows w ON w.workflow_id = o.workflow_id \
                                   WHERE o.item_id = $1 AND o.workflow_id <> $2 AND o.asked_at IS NOT NULL ORDER BY o.asked_at LIMIT 1) a ON true",
    )
    .bind(ev.item)
    .bind(wf.id)
    .bind(ev.org)
    .bind(ev.project)
    .bind(ev.generation)
    .fetch_one(&mut *ch.tx)
    .await?;
    let used = if generation < current { 0 } else { used };
    let asked = other.map(|name| (name, other_used.unwrap_or_default(), other_max.unwrap_or_default()));
    if let Some((other, other_used, other_max)) = asked {
        return Ok(Err(Spent { cycles: used, reason: format!("cycle budget of {other} spent on this item ({other_used}/{other_max}): waiting for a reset") }));
    }
    if used >= max {
        let ask = json!({ "event": ev.id, "workflow": wf.name, "cycles_used": used, "max_cycles": max, "generation": current });
        sqlx::query(
            "UPDATE item_cycle_budgets SET generation = $3, cycles_used = $4, ask = $5, asked_at = coalesce(asked_at, now()) \
             WHERE item_id = $1 AND workflow_id = $2",
        )
        .bind(ev.item)
        .bind(wf.id)
        .bind(current)
        .bind(used)
        .bind(&ask)
        .execute(&mut *ch.tx)
        .await?;
        return Ok(Err(Spent { cycles: used, reason: format!("cycle budget {used}/{max}") }));
    }
    sqlx::query("UPDATE item_cycle_budgets SET generation = $3, cycles_used = $4 WHERE item_id = $1 AND workflow_id = $2")
        .bind(ev.item)
        .bind(wf.id)
        .bind(current)
        .bind(used + 1)
        .execute(&mut *ch.tx)
        .await?;
    Ok(Ok(()))
}

/// Workflows with something a change of the item may revoke: open runs or queued events.
pub async fn workflows_pending_on(ch: &mut Change, org: OrgId, item: ItemId) -> Result<Vec<WorkflowId>> {
    Ok(sqlx::query_scalar(
        "SELECT workflow_id FROM runs WHERE item_id = $1 AND org_id = $2 AND status = 'running' AND parent_run_id IS NULL \
         UNION SELECT workflow_id FROM trigger_events WHERE item_id = $1 AND org_id = $2 AND status = 'queued'",
    )
    .bind(item)
    .bind(org)
    .fetch_all(&mut *ch.tx)
    .await?)
}

/// What a revocation did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Revoked {
    pub runs: Vec<RunId>,
    pub events: usize,
}

const QUEUED_EVENTS: &str =
    "SELECT event_id, payload FROM trigger_events WHERE item_id = $1 AND workflow_id = $2 AND org_id = $3 AND status = 'queued' ORDER BY created_at";

/// The item stopped matching: cancels the workflow's runs on it that have not started
/// (`revoked`) and marks its queued events `revoked`, each judged with the `trigger` that
/// caused it. `still_matches` gets that trigger and says whether the `if:` holds on the item
/// now. The queued events are judged first: a revoked run's end judges what is still queued.
pub(crate) async fn revoke_unmatched(
    ch: &mut Change, org: OrgId, item: ItemId, workflow: WorkflowId, still_matches: &(dyn Fn(&Value) -> bool + Sync), runs: &RunOps,
) -> Result<Revoked> {
    let mut out = Revoked::default();
    let open = open_runs(ch, org, item, workflow).await?;
    let queued: Vec<(Uuid, Value)> = sqlx::query_as(QUEUED_EVENTS).bind(item).bind(workflow).bind(org).fetch_all(&mut *ch.tx).await?;
    for (event, payload) in queued {
        if !still_matches(payload.get("trigger").unwrap_or(&Value::Null)) {
            set_event(ch, event, "revoked", Some("revoked")).await?;
            out.events += 1;
        }
    }
    for open in open {
        let Some(event) = open.event.filter(|_| !open.attempted) else { continue };
        let payload: Value =
            sqlx::query_scalar("SELECT payload FROM trigger_events WHERE event_id = $1").bind(event).fetch_optional(&mut *ch.tx).await?.unwrap_or(Value::Null);
        if !still_matches(payload.get("trigger").unwrap_or(&Value::Null)) {
            cancel_unstarted(ch, org, &open, "revoked", "revoked", runs).await?;
            out.runs.push(open.run);
        }
    }
    Ok(out)
}

/// Called at the end of every run (`run_ended`, its last step), in its change: when trigger
/// events wait behind this run, the newest is judged again against the item's stored
/// projection (a failing `if:` counts as a match, as GitHub being unreachable would), and
/// opens its run through the claim; the older ones are superseded by it. A false verdict
/// revokes them all. The claim may supersede an unstarted run, whose end comes here again (and
/// finds nothing queued, since the events are taken out of the queue first).
pub(crate) async fn rejudge(ch: &mut Change, run: &RunRow, runs: &RunOps) -> Result<()> {
    let Some(item) = run.item_id else { return Ok(()) };
    if run.parent_run_id.is_some() {
        return Ok(());
    }
    let waiting: Vec<(Uuid, Value, i32)> = sqlx::query_as(
        "SELECT event_id, payload, generation FROM trigger_events \
         WHERE item_id = $1 AND workflow_id = $2 AND org_id = $3 AND status = 'queued' ORDER BY created_at DESC, event_id DESC",
    )
    .bind(item)
    .bind(run.workflow_id)
    .bind(run.org_id)
    .fetch_all(&mut *ch.tx)
    .await?;
    let Some((newest, payload, generation)) = waiting.first().cloned() else { return Ok(()) };
    let Some(item_row) = lock_item(ch, run.org_id, item).await? else { return Ok(()) };
    // Another started run of the workflow still holds them.
    if open_runs(ch, run.org_id, item, run.workflow_id).await?.iter().any(|r| r.attempted) {
        return Ok(());
    }
    // Take them out of the queue first: the claim below may finish other runs, whose own
    // call here must not see these events again.
    for (older, _, _) in waiting.iter().skip(1) {
        set_event(ch, *older, "superseded", Some(&format!("superseded by {newest}"))).await?;
    }
    set_event(ch, newest, "accepted", Some("judged again")).await?;
    let trigger = payload.get("trigger").cloned().unwrap_or(Value::Null);
    let Some(wf) = workflow(ch, run.org_id, run.workflow_id).await? else {
        set_event(ch, newest, "revoked", Some("revoked: the workflow has no version")).await?;
        return Ok(());
    };
    let project = project_context(ch, run.project_id).await?;
    let verdict = match &wf.def.on.github {
        Some(t) => judge::verdict(t, &item_row.data, &trigger, &project),
        None => Verdict::DoesNotMatch,
    };
    if verdict == Verdict::DoesNotMatch {
        set_event(ch, newest, "revoked", Some("revoked")).await?;
        return Ok(());
    }
    let ev = EventRef { id: newest, org: run.org_id, project: run.project_id, item, generation, trigger, fresh_item: false };
    claim(ch, &ev, &wf, runs).await?;
    Ok(())
}
