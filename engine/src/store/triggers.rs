//! Trigger writes: GitHub deliveries, item projections, trigger events and the claim rule,
//! revocation, cycle budgets and check results (installations are in `installations.rs`).
//!
//! # The claim rule
//!
//! A new trigger event for an item that already has an open run of the same workflow:
//!
//! - that run has an **attempt running** (a step leased or running, on an engine or a host):
//!   the event is `queued` behind it. A running attempt always finishes. When the run ends,
//!   [`on_run_finished`] judges the newest queued event again (its `if:` over the item's stored
//!   projection, which the webhooks keep current; a failing expression counts as a match) and
//!   opens its run, or marks the events `revoked`.
//! - otherwise (no step yet, parked on its `$start` approval, a crew step waiting for a host, a
//!   wait, a gate, an approval, a backoff between attempts): it is cancelled
//!   `superseded by <event>`, the events queued behind it are superseded too, and a new run
//!   opens. A change that makes the item stop matching revokes such runs the same way.
//! - otherwise a new run opens.
//!
//! A run opens only if the item's cycle budget admits it (`budget.max_cycles` runs per item and
//! workflow between resets). At the limit the event is `blocked` and an ask is recorded for
//! "Needs you"; from then on **no workflow** opens a run on that item until a person resets
//! its budget (their events are `blocked` too, and judged again by the reset). A run cancelled
//! before any attempt began (superseded, revoked) gives its cycle back. A reset bumps the
//! item's generation, which is part of new dedup keys, and judges the blocked events again.
//!
//! # Locks
//!
//! Every claim holds the item's row lock, so two deliveries about one item are judged one
//! after the other. Runs are locked before the item (as engines lock a run before finishing it
//! and re-judging its item), so ingest and engines take locks in one order.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use sqlx::{FromRow, Row};
use uuid::Uuid;

use super::runs::{self, NewRun, RunRow};
use super::{cap, Change, Result, StoreError};
use crate::definition::Definition;
use crate::ids::{ItemId, OrgId, ProjectId, RunId, WorkflowId};
use crate::state::run;
use crate::triggers::judge::{self, Verdict};
use crate::triggers::{self as trig, CATALOG};

// ---------------------------------------------------------------------------------------------
// Routing and deliveries

/// A project a delivery is routed to: its repository is connected through the delivery's
/// installation.
#[derive(Debug, Clone)]
pub struct Route {
    pub org: OrgId,
    pub project: ProjectId,
    pub project_slug: String,
    pub project_name: String,
}

impl Route {
    /// The `project` variable of `if:` conditions.
    pub fn context(&self) -> Value {
        json!({ "slug": self.project_slug, "name": self.project_name })
    }
}

/// The projects of `installation`'s org that connected `repository` through it.
/// The payload's `repository.default_branch`, when given, is what pull requests from the
/// repository go to from now on (written only when it changed: GitHub's word, as a renamed
/// default branch or a `master` repository says it).
pub async fn routes(ch: &mut Change, installation: i64, repository: &str, default_branch: Option<&str>) -> Result<Vec<Route>> {
    let rows = sqlx::query(
        "WITH moved AS (UPDATE repositories SET default_branch = $3 WHERE full_name = $1 AND installation_id = $2 \
                          AND $3::text IS NOT NULL AND default_branch IS DISTINCT FROM $3 RETURNING 1) \
         SELECT r.org_id, r.project_id, p.slug, p.name FROM repositories r JOIN projects p ON p.project_id = r.project_id \
         WHERE r.full_name = $1 AND r.installation_id = $2 ORDER BY r.project_id",
    )
    .bind(repository.to_lowercase())
    .bind(installation)
    .bind(default_branch.filter(|b| !b.is_empty() && b.len() <= 255))
    .fetch_all(&mut *ch.tx)
    .await?;
    Ok(rows.iter().map(route_of).collect())
}

fn route_of(r: &sqlx::postgres::PgRow) -> Route {
    Route { org: r.get("org_id"), project: r.get("project_id"), project_slug: r.get("slug"), project_name: r.get("name") }
}

/// What a delivery said on its envelope.
#[derive(Debug, Clone)]
pub struct DeliveryRow<'a> {
    pub id: &'a str,
    /// None: it names no connected repository or installation (stored all the same).
    pub org: Option<OrgId>,
    pub event: &'a str,
    pub action: Option<&'a str>,
    pub installation: Option<i64>,
    pub repository: Option<&'a str>,
}

/// Records a delivery by its `X-GitHub-Delivery` id. Returns false for a redelivery: the id is
/// already stored, and nothing more is to be done. A concurrent duplicate waits here until the
/// first one commits.
pub async fn record_delivery(ch: &mut Change, d: &DeliveryRow<'_>) -> Result<bool> {
    let inserted = sqlx::query(
        "INSERT INTO github_deliveries (org_id, delivery_id, event, action, outcome, installation_id, repository) \
         VALUES ($1, $2, $3, $4, 'received', $5, $6) ON CONFLICT (delivery_id) DO NOTHING",
    )
    .bind(d.org)
    .bind(cap(d.id))
    .bind(cap(d.event))
    .bind(d.action.map(cap))
    .bind(d.installation)
    .bind(d.repository.map(cap))
    .execute(&mut *ch.tx)
    .await?;
    Ok(inserted.rows_affected() == 1)
}

/// Stores what became of a delivery.
pub async fn finish_delivery(ch: &mut Change, id: &str, outcome: &str, detail: &Value) -> Result<()> {
    sqlx::query("UPDATE github_deliveries SET outcome = $2, detail = $3 WHERE delivery_id = $1")
        .bind(cap(id))
        .bind(cap(outcome))
        .bind(detail)
        .execute(&mut *ch.tx)
        .await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Items

/// An item as stored, locked in the change.
#[derive(Debug, Clone, FromRow)]
pub struct ItemRow {
    pub item_id: ItemId,
    pub project_id: ProjectId,
    pub key: String,
    pub data: Value,
    pub content_hash: Option<String>,
    pub generation: i32,
}

/// The item's id, creating an empty item when it is new.
pub async fn ensure_item(ch: &mut Change, org: OrgId, project: ProjectId, key: &str) -> Result<ItemId> {
    let new: Option<ItemId> = sqlx::query_scalar(
        "INSERT INTO items (org_id, project_id, item_id, key) VALUES ($1, $2, $3, $4) ON CONFLICT (project_id, key) DO NOTHING RETURNING item_id",
    )
    .bind(org)
    .bind(project)
    .bind(ItemId::mint())
    .bind(key)
    .fetch_optional(&mut *ch.tx)
    .await?;
    if let Some(id) = new {
        return Ok(id);
    }
    sqlx::query_scalar("SELECT item_id FROM items WHERE project_id = $1 AND key = $2 AND org_id = $3")
        .bind(project)
        .bind(key)
        .bind(org)
        .fetch_optional(&mut *ch.tx)
        .await?
        .ok_or(StoreError::NotFound("item"))
}

/// Locks an item for judging: first the runs open on it (in id order), then its row.
pub async fn lock_item(ch: &mut Change, org: OrgId, item: ItemId) -> Result<Option<ItemRow>> {
    let open: Vec<RunId> = sqlx::query_scalar("SELECT run_id FROM runs WHERE item_id = $1 AND status = 'running' AND org_id = $2")
        .bind(item)
        .bind(org)
        .fetch_all(&mut *ch.tx)
        .await?;
    if !open.is_empty() {
        ch.lock_runs(&open).await?;
    }
    Ok(sqlx::query_as(
        "SELECT item_id, project_id, key, data, content_hash, generation FROM items WHERE item_id = $1 AND org_id = $2 FOR UPDATE",
    )
    .bind(item)
    .bind(org)
    .fetch_optional(&mut *ch.tx)
    .await?)
}

/// Stores a new projection of a locked item.
pub async fn update_item(ch: &mut Change, item: &ItemRow, data: &Value, node_id: Option<&str>) -> Result<String> {
    let hash = trig::content_hash(data);
    let head_sha = data.pointer("/head/sha").and_then(Value::as_str);
    let org: OrgId = sqlx::query_scalar(
        "UPDATE items SET data = $2, title = $3, state = $4, content_hash = $5, head_sha = $6, \
         node_id = coalesce($7, node_id), updated_at = now() WHERE item_id = $1 RETURNING org_id",
    )
    .bind(item.item_id)
    .bind(data)
    .bind(data.get("title").and_then(Value::as_str).map(cap))
    .bind(data.get("state").and_then(Value::as_str))
    .bind(&hash)
    .bind(head_sha)
    .bind(node_id)
    .fetch_one(&mut *ch.tx)
    .await?;
    // A card that left a board column makes room in it: the runs waiting for that column's
    // WIP limit are woken as this change commits (`admission::release`).
    let column = |d: &Value| d.pointer("/board/column").and_then(Value::as_str).map(crate::admission::column_key);
    if let Some(left) = column(&item.data).filter(|old| column(data).as_ref() != Some(old)) {
        ch.releases.push((org, crate::admission::board_queue(&item.project_id.0.to_string(), &left), false));
    }
    Ok(hash)
}

/// Pull requests of a project whose head is `sha` (check runs and statuses name a commit).
pub async fn items_by_head(ch: &mut Change, org: OrgId, project: ProjectId, repository: &str, sha: &str) -> Result<Vec<ItemId>> {
    Ok(sqlx::query_scalar("SELECT item_id FROM items WHERE project_id = $1 AND head_sha = $2 AND org_id = $3 AND data->>'repository' = $4 ORDER BY item_id")
        .bind(project)
        .bind(sha)
        .bind(org)
        .bind(repository.to_lowercase())
        .fetch_all(&mut *ch.tx)
        .await?)
}

/// Items of an org with a GraphQL node id (a board card names its content by node id only),
/// with the project each belongs to.
pub async fn items_by_node(ch: &mut Change, org: OrgId, node_id: &str) -> Result<Vec<(ItemId, Route)>> {
    let rows = sqlx::query(
        "SELECT i.item_id, i.org_id, i.project_id, p.slug, p.name FROM items i JOIN projects p ON p.project_id = i.project_id \
         WHERE i.org_id = $1 AND i.node_id = $2 ORDER BY i.item_id",
    )
    .bind(org)
    .bind(node_id)
    .fetch_all(&mut *ch.tx)
    .await?;
    Ok(rows.iter().map(|r| (r.get("item_id"), route_of(r))).collect())
}

/// One check result, for gates on checks.
#[derive(Debug, Clone)]
pub struct CheckResult<'a> {
    pub repository: &'a str,
    pub head_sha: &'a str,
    pub name: &'a str,
    pub source: &'a str,
    pub external_id: i64,
    pub status: &'a str,
    pub conclusion: Option<&'a str>,
    pub details_url: Option<&'a str>,
}

/// Stores a check result. Returns false when it was older news than what is stored: a report
/// that the same check run is still in progress after it completed.
pub async fn record_check(ch: &mut Change, org: OrgId, project: ProjectId, c: &CheckResult<'_>) -> Result<bool> {
    let applied = sqlx::query(
        "INSERT INTO github_checks (org_id, project_id, repository, head_sha, name, source, external_id, status, conclusion, details_url) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
         ON CONFLICT (project_id, repository, head_sha, name) DO UPDATE SET \
           source = EXCLUDED.source, external_id = EXCLUDED.external_id, status = EXCLUDED.status, \
           conclusion = EXCLUDED.conclusion, details_url = EXCLUDED.details_url, updated_at = now() \
         WHERE NOT (github_checks.status = 'completed' AND EXCLUDED.status <> 'completed' AND github_checks.external_id = EXCLUDED.external_id)",
    )
    .bind(org)
    .bind(project)
    .bind(c.repository.to_lowercase())
    .bind(c.head_sha)
    .bind(cap(c.name))
    .bind(c.source)
    .bind(c.external_id)
    .bind(c.status)
    .bind(c.conclusion)
    .bind(c.details_url.map(cap))
    .execute(&mut *ch.tx)
    .await?;
    Ok(applied.rows_affected() == 1)
}

// ---------------------------------------------------------------------------------------------
// Workflows

/// A workflow of the project, at its latest version.
#[derive(Debug, Clone)]
pub struct WorkflowInfo {
    pub id: WorkflowId,
    pub name: String,
    pub version: i32,
    pub paused: bool,
    pub def: Arc<Definition>,
}

/// The project's workflows that have an `on.github` trigger, at their latest versions.
pub async fn github_workflows(ch: &mut Change, org: OrgId, project: ProjectId) -> Result<Vec<WorkflowInfo>> {
    let rows: Vec<(WorkflowId, String, i32, bool)> = sqlx::query_as(
        "SELECT workflow_id, name, latest_version, paused FROM workflows WHERE project_id = $1 AND org_id = $2 AND latest_version > 0 ORDER BY name",
    )
    .bind(project)
    .bind(org)
    .fetch_all(&mut *ch.tx)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for (id, name, version, paused) in rows {
        match CATALOG.get(&mut ch.tx, id, version).await {
            Ok(def) if def.on.github.is_some() => out.push(WorkflowInfo { id, name, version, paused, def }),
            Ok(_) => {}
            // One broken stored version must not stop the project's other workflows.
            Err(e) => tracing::warn!(workflow.id = %id, workflow.version = version, error = %e, "workflow skipped by the triggers"),
        }
    }
    Ok(out)
}

async fn workflow(ch: &mut Change, org: OrgId, id: WorkflowId) -> Result<Option<WorkflowInfo>> {
    let row: Option<(String, i32, bool)> =
        sqlx::query_as("SELECT name, latest_version, paused FROM workflows WHERE workflow_id = $1 AND org_id = $2 AND latest_version > 0")
            .bind(id)
            .bind(org)
            .fetch_optional(&mut *ch.tx)
            .await?;
    let Some((name, version, paused)) = row else { return Ok(None) };
    let def = CATALOG.get(&mut ch.tx, id, version).await?;
    Ok(Some(WorkflowInfo { id, name, version, paused, def }))
}

async fn project_context(ch: &mut Change, project: ProjectId) -> Result<Value> {
    let row: Option<(String, String)> = sqlx::query_as("SELECT slug, name FROM projects WHERE project_id = $1")
        .bind(project)
        .fetch_optional(&mut *ch.tx)
        .await?;
    Ok(row.map_or(Value::Null, |(slug, name)| json!({ "slug": slug, "name": name })))
}

// ---------------------------------------------------------------------------------------------
// Trigger events and the claim

/// What became of a trigger event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "claim", rename_all = "snake_case")]
pub enum Claim {
    /// The same workflow already acted on the same item content (its dedup key is stored).
    Duplicate,
    /// A new run, after cancelling the unstarted ones it supersedes.
    Opened { event: Uuid, run: RunId, superseded: Vec<RunId> },
    /// Waits behind an executing run.
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
struct EventRef {
    id: Uuid,
    org: OrgId,
    project: ProjectId,
    item: ItemId,
    generation: i32,
    trigger: Value,
}

/// Records a trigger event under its dedup key and applies the claim rule.
pub async fn submit_event(ch: &mut Change, new: NewEvent<'_>) -> Result<Claim> {
    let hash = new.item.content_hash.clone().unwrap_or_else(|| trig::content_hash(&new.item.data));
    let generation = new.item.generation;
    let key = trig::dedup_key(&new.workflow.name, new.repository, new.number, &hash, generation);
    let id = Uuid::now_v7();
    let payload = json!({ "trigger": new.trigger, "content_hash": hash });
    let inserted: Option<Uuid> = sqlx::query_scalar(
        "INSERT INTO trigger_events (org_id, project_id, event_id, workflow_id, item_id, dedup_key, source, payload, status, generation, delivery_id) \
         VALUES ($1, $2, $3, $4, $5, $6, 'github', $7, 'accepted', $8, $9) \
         ON CONFLICT ON CONSTRAINT trigger_events_dedup DO NOTHING RETURNING event_id",
    )
    .bind(new.org)
    .bind(new.project)
    .bind(id)
    .bind(new.workflow.id)
    .bind(new.item.item_id)
    .bind(&key)
    .bind(&payload)
    .bind(generation)
    .bind(new.delivery)
    .fetch_optional(&mut *ch.tx)
    .await?;
    if inserted.is_none() {
        return Ok(Claim::Duplicate);
    }
    let ev = EventRef { id, org: new.org, project: new.project, item: new.item.item_id, generation, trigger: new.trigger };
    claim(ch, &ev, new.workflow).await
}

/// An open (top-level) run of a workflow on an item, locked.
struct OpenRun {
    run: RunId,
    event: Option<Uuid>,
    /// An attempt is running: a step leased or running, on an engine or a host.
    running: bool,
    /// An attempt ever began (a step was leased or started): its cycle is spent for good.
    attempted: bool,
}

/// Whether a run `r` has an attempt running (the claim rule's "started").
const ATTEMPT_RUNNING: &str = "EXISTS (SELECT 1 FROM steps s WHERE s.run_id = r.run_id AND s.state IN ('leased', 'running'))";
/// Whether any attempt of a run `r` ever began: an engine or a host held one of its steps
/// (steps the engine resolves at once, approvals and waits are held by no one).
const ATTEMPTED: &str = "EXISTS (SELECT 1 FROM steps s WHERE s.run_id = r.run_id AND s.holder IS NOT NULL)";

/// The open runs of `workflow` on `item`, locked, with whether each has an attempt running.
async fn open_runs(ch: &mut Change, org: OrgId, item: ItemId, workflow: WorkflowId) -> Result<Vec<OpenRun>> {
    let ids: Vec<RunId> = sqlx::query_scalar(
        "SELECT run_id FROM runs WHERE item_id = $1 AND workflow_id = $2 AND status = 'running' AND org_id = $3 AND parent_run_id IS NULL ORDER BY run_id",
    )
    .bind(item)
    .bind(workflow)
    .bind(org)
    .fetch_all(&mut *ch.tx)
    .await?;
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    ch.lock_runs(&ids).await?;
    // Read again under the locks: a run may have ended, or leased a step, in between.
    let sql = format!(
        "SELECT r.run_id, r.trigger_event_id, {ATTEMPT_RUNNING} AS running, {ATTEMPTED} AS attempted \
         FROM runs r WHERE r.run_id = ANY($1) AND r.status = 'running' ORDER BY r.run_id"
    );
    let rows = sqlx::query(&sql).bind(ids.iter().map(|r| r.0).collect::<Vec<_>>()).fetch_all(&mut *ch.tx).await?;
    Ok(rows
        .iter()
        .map(|r| OpenRun { run: r.get("run_id"), event: r.get("trigger_event_id"), running: r.get("running"), attempted: r.get("attempted") })
        .collect())
}

async fn claim(ch: &mut Change, ev: &EventRef, wf: &WorkflowInfo) -> Result<Claim> {
    let open = open_runs(ch, ev.org, ev.item, wf.id).await?;
    if let Some(executing) = open.iter().find(|r| r.running) {
        set_event(ch, ev.id, "queued", Some(&format!("behind {}", executing.run)), None).await?;
        return Ok(Claim::Queued { event: ev.id, behind: executing.run });
    }
    let mut superseded = Vec::new();
    if !open.is_empty() {
        // Events queued behind a run that no longer runs an attempt: this newer one wins. They
        // leave the queue before the run ends, whose end would judge them again.
        supersede_queued(ch, ev, wf.id).await?;
    }
    for old in &open {
        cancel_unstarted(ch, ev.org, old, "superseded", &format!("superseded by {}", ev.id)).await?;
        superseded.push(old.run);
    }
    if let Err(Spent { cycles, reason }) = admit(ch, ev, wf).await? {
        set_event(ch, ev.id, "blocked", Some(&reason), None).await?;
        ch.audit(
            ev.org,
            Some(ev.project),
            "trigger.blocked",
            ("item", ev.item.to_string()),
            json!({ "workflow": wf.name, "event": ev.id, "cycles": cycles }),
        )?;
        return Ok(Claim::Blocked { event: ev.id, superseded, cycles });
    }
    let submitted = runs::submit(
        ch,
        NewRun {
            org: ev.org,
            project: ev.project,
            workflow: wf.id,
            version: wf.version,
            input: json!({ "trigger": ev.trigger, "event": ev.id }),
            item: Some(ev.item),
            trigger_event: Some(ev.id),
            parent: None,
            dry_run: false,
            needs_approval: wf.def.approval_required,
            source: None,
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
            set_event(ch, ev.id, "skipped", Some(&reason), None).await?;
            return Ok(Claim::Skipped { event: ev.id, reason });
        }
        Err(e) => return Err(e),
    };
    set_event(ch, ev.id, "started", None, Some(run)).await?;
    Ok(Claim::Opened { event: ev.id, run, superseded })
}

/// The events queued behind `ev`'s workflow on its item, superseded by `ev`.
async fn supersede_queued(ch: &mut Change, ev: &EventRef, workflow: WorkflowId) -> Result<()> {
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

/// Cancels a run with no attempt running (superseded, revoked): its event takes the same
/// status, and its cycle is given back when no attempt of it ever began.
async fn cancel_unstarted(ch: &mut Change, org: OrgId, old: &OpenRun, status: &str, reason: &str) -> Result<()> {
    ch.lock_run(org, old.run).await?;
    runs::finish::<run::Cancelled>(ch, old.run, Some(reason)).await?;
    if let Some(event) = old.event {
        set_event(ch, event, status, Some(reason), None).await?;
        if !old.attempted {
            sqlx::query(
                "UPDATE item_cycle_budgets b SET cycles_used = greatest(b.cycles_used - 1, 0) FROM trigger_events e \
                 WHERE e.event_id = $1 AND b.item_id = e.item_id AND b.workflow_id = e.workflow_id AND b.generation = e.generation",
            )
            .bind(event)
            .execute(&mut *ch.tx)
            .await?;
        }
    }
    Ok(())
}

async fn set_event(ch: &mut Change, event: Uuid, status: &str, reason: Option<&str>, run: Option<RunId>) -> Result<()> {
    sqlx::query("UPDATE trigger_events SET status = $2, reason = $3, run_id = coalesce($4, run_id), decided_at = now() WHERE event_id = $1")
        .bind(event)
        .bind(status)
        .bind(reason.map(cap))
        .bind(run)
        .execute(&mut *ch.tx)
        .await?;
    Ok(())
}

/// Why a claim opened nothing: the cycles the workflow used on the item, and the event's reason.
struct Spent {
    cycles: i32,
    reason: String,
}

/// Takes one cycle of the item's budget for the workflow, under the budget row's lock (and the
/// item's, which every claim holds). `Err` when this budget is spent (the ask is recorded then)
/// or another workflow's budget on the item is spent and waits for a person.
async fn admit(ch: &mut Change, ev: &EventRef, wf: &WorkflowInfo) -> Result<Result<(), Spent>> {
    let max = i32::try_from(wf.def.budget.max_cycles).unwrap_or(i32::MAX);
    sqlx::query(
        "INSERT INTO item_cycle_budgets (org_id, project_id, item_id, workflow_id, generation, cycles_used) VALUES ($1, $2, $3, $4, $5, 0) \
         ON CONFLICT (item_id, workflow_id) DO NOTHING",
    )
    .bind(ev.org)
    .bind(ev.project)
    .bind(ev.item)
    .bind(wf.id)
    .bind(ev.generation)
    .execute(&mut *ch.tx)
    .await?;
    let (generation, used): (i32, i32) =
        sqlx::query_as("SELECT generation, cycles_used FROM item_cycle_budgets WHERE item_id = $1 AND workflow_id = $2 FOR UPDATE")
            .bind(ev.item)
            .bind(wf.id)
            .fetch_one(&mut *ch.tx)
            .await?;
    let current: i32 = sqlx::query_scalar("SELECT generation FROM items WHERE item_id = $1").bind(ev.item).fetch_one(&mut *ch.tx).await?;
    let used = if generation < current { 0 } else { used };
    // An ask open on the item stops every workflow, not only the one that spent its budget.
    let asked: Option<(String, i32, i32)> = sqlx::query_as(
        "SELECT w.name, b.cycles_used, (b.ask->>'max_cycles')::int FROM item_cycle_budgets b JOIN workflows w ON w.workflow_id = b.workflow_id \
         WHERE b.item_id = $1 AND b.workflow_id <> $2 AND b.asked_at IS NOT NULL ORDER BY b.asked_at LIMIT 1",
    )
    .bind(ev.item)
    .bind(wf.id)
    .fetch_optional(&mut *ch.tx)
    .await?;
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

// ---------------------------------------------------------------------------------------------
// Revocation

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

/// The item stopped matching: cancels the workflow's runs on it that have no attempt running
/// (`revoked`) and marks its queued events `revoked`, each judged with the `trigger` that
/// caused it. `still_matches` gets that trigger and says whether the `if:` holds on the item
/// now. The queued events are judged first: a revoked run's end judges what is still queued.
pub async fn revoke_unmatched(ch: &mut Change, org: OrgId, item: ItemId, workflow: WorkflowId, still_matches: &(dyn Fn(&Value) -> bool + Sync)) -> Result<Revoked> {
    let mut out = Revoked::default();
    let open = open_runs(ch, org, item, workflow).await?;
    let queued: Vec<(Uuid, Value)> = sqlx::query_as(
        "SELECT event_id, payload FROM trigger_events WHERE item_id = $1 AND workflow_id = $2 AND org_id = $3 AND status = 'queued' ORDER BY created_at",
    )
    .bind(item)
    .bind(workflow)
    .bind(org)
    .fetch_all(&mut *ch.tx)
    .await?;
    for (event, payload) in queued {
        if !still_matches(payload.get("trigger").unwrap_or(&Value::Null)) {
            set_event(ch, event, "revoked", Some("revoked"), None).await?;
            out.events += 1;
        }
    }
    for open in open {
        let Some(event) = open.event.filter(|_| !open.running) else { continue };
        let payload: Value = sqlx::query_scalar("SELECT payload FROM trigger_events WHERE event_id = $1")
            .bind(event)
            .fetch_optional(&mut *ch.tx)
            .await?
            .unwrap_or(Value::Null);
        if !still_matches(payload.get("trigger").unwrap_or(&Value::Null)) {
            cancel_unstarted(ch, org, &open, "revoked", "revoked").await?;
            out.runs.push(open.run);
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Re-judging queued events

/// Called by `runs::finish` for every run that ends, in its change: when trigger events wait
/// behind this run, the newest is judged again against the item's stored projection (a
/// failing `if:` counts as a match, as GitHub being unreachable would), and opens its run
/// through the claim; the older ones are superseded by it. A false verdict revokes them all.
///
/// Boxed because it recurses: the claim may supersede an unstarted run, whose `finish` calls
/// it again (and finds nothing queued, since the events are taken out of the queue first).
pub(crate) fn on_run_finished<'a>(ch: &'a mut Change, run: &'a RunRow) -> futures::future::BoxFuture<'a, Result<()>> {
    Box::pin(rejudge(ch, run))
}

async fn rejudge(ch: &mut Change, run: &RunRow) -> Result<()> {
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
    // Another executing run of the workflow still holds them.
    if open_runs(ch, run.org_id, item, run.workflow_id).await?.iter().any(|r| r.running) {
        return Ok(());
    }
    // Take them out of the queue first: the claim below may finish other runs, whose own
    // call here must not see these events again.
    for (older, _, _) in waiting.iter().skip(1) {
        set_event(ch, *older, "superseded", Some(&format!("superseded by {newest}")), None).await?;
    }
    set_event(ch, newest, "accepted", Some("judged again"), None).await?;
    let trigger = payload.get("trigger").cloned().unwrap_or(Value::Null);
    let Some(wf) = workflow(ch, run.org_id, run.workflow_id).await? else {
        set_event(ch, newest, "revoked", Some("revoked: the workflow has no version"), None).await?;
        return Ok(());
    };
    let project = project_context(ch, run.project_id).await?;
    let verdict = match &wf.def.on.github {
        Some(t) => judge::verdict(t, &item_row.data, &trigger, &project),
        None => Verdict::DoesNotMatch,
    };
    if verdict == Verdict::DoesNotMatch {
        set_event(ch, newest, "revoked", Some("revoked"), None).await?;
        return Ok(());
    }
    let ev = EventRef { id: newest, org: run.org_id, project: run.project_id, item, generation, trigger };
    claim(ch, &ev, &wf).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Cycle budgets

/// A workflow that reached its cycle budget on an item, waiting for a person ("Needs you").
#[derive(Debug, Clone, Serialize, FromRow)]
pub struct CycleAsk {
    pub item_id: ItemId,
    pub project_id: ProjectId,
    pub item_key: String,
    pub item_title: Option<String>,
    pub workflow_id: WorkflowId,
    pub workflow: String,
    pub generation: i32,
    pub cycles_used: i32,
    pub asked_at: DateTime<Utc>,
    pub ask: Value,
}

/// The open asks of an org, or of one project, oldest first.
pub async fn cycle_asks(conn: &mut sqlx::PgConnection, org: OrgId, project: Option<ProjectId>) -> Result<Vec<CycleAsk>> {
    Ok(sqlx::query_as(
        "SELECT b.item_id, i.project_id, i.key AS item_key, i.title AS item_title, b.workflow_id, w.name AS workflow, \
                b.generation, b.cycles_used, b.asked_at, coalesce(b.ask, '{}') AS ask \
         FROM item_cycle_budgets b JOIN items i ON i.item_id = b.item_id JOIN workflows w ON w.workflow_id = b.workflow_id \
         WHERE b.org_id = $1 AND b.asked_at IS NOT NULL AND ($2::uuid IS NULL OR i.project_id = $2) \
         ORDER BY b.asked_at, b.item_id, b.workflow_id",
    )
    .bind(org)
    .bind(project)
    .fetch_all(conn)
    .await?)
}

/// What a reset did: the item's new generation, and what each blocked workflow's event
/// became when judged again.
#[derive(Debug, Clone, Serialize)]
pub struct Reset {
    pub generation: i32,
    pub claims: Vec<(String, Claim)>,
}

/// Resets an item's cycle budgets: bumps its generation (part of new dedup keys, so the same
/// content may act again), clears its asks, keeps the cycles of runs still unstarted, and
/// judges the events that the budget blocked again, against the item as it is now.
pub async fn reset_cycle_budget(ch: &mut Change, org: OrgId, item: ItemId) -> Result<Reset> {
    let row = lock_item(ch, org, item).await?.ok_or(StoreError::NotFound("item"))?;
    let generation: i32 = sqlx::query_scalar("UPDATE items SET generation = generation + 1 WHERE item_id = $1 RETURNING generation")
        .bind(item)
        .fetch_one(&mut *ch.tx)
        .await?;
    let sql = format!(
        "UPDATE item_cycle_budgets b SET generation = $2, ask = NULL, asked_at = NULL, cycles_used = ( \
           SELECT count(*) FROM runs r WHERE r.item_id = b.item_id AND r.workflow_id = b.workflow_id AND r.status = 'running' \
             AND r.parent_run_id IS NULL AND NOT {ATTEMPTED}) \
         WHERE b.item_id = $1"
    );
    sqlx::query(&sql).bind(item).bind(generation).execute(&mut *ch.tx).await?;
    ch.audit(org, Some(row.project_id), "item.cycle_reset", ("item", item.to_string()), json!({ "key": row.key, "generation": generation }))?;

    // The newest blocked event of each workflow in the generation just closed.
    let blocked: Vec<(WorkflowId, Value)> = sqlx::query_as(
        "SELECT DISTINCT ON (workflow_id) workflow_id, payload FROM trigger_events \
         WHERE item_id = $1 AND org_id = $2 AND status = 'blocked' AND generation = $3 ORDER BY workflow_id, created_at DESC",
    )
    .bind(item)
    .bind(org)
    .bind(generation - 1)
    .fetch_all(&mut *ch.tx)
    .await?;
    let project = project_context(ch, row.project_id).await?;
    let item_row = ItemRow { generation, ..row };
    let (repository, number) = key_parts(&item_row.key);
    let mut claims = Vec::new();
    for (workflow_id, payload) in blocked {
        let Some(wf) = workflow(ch, org, workflow_id).await? else { continue };
        let Some(t) = wf.def.on.github.clone() else { continue };
        let trigger = payload.get("trigger").cloned().unwrap_or(Value::Null);
        if judge::verdict(&t, &item_row.data, &trigger, &project) == Verdict::DoesNotMatch {
            continue;
        }
        let claim = submit_event(
            ch,
            NewEvent { org, project: item_row.project_id, workflow: &wf, item: &item_row, repository: &repository, number, trigger, delivery: None },
        )
        .await?;
        claims.push((wf.name.clone(), claim));
    }
    Ok(Reset { generation, claims })
}

/// The repository and number of an item key (`["github","owner/name",number]`).
fn key_parts(key: &str) -> (String, Option<i64>) {
    let parsed: Value = serde_json::from_str(key).unwrap_or(Value::Null);
    let repository = parsed.get(1).and_then(Value::as_str).unwrap_or_default().to_owned();
    (repository, parsed.get(2).and_then(Value::as_i64))
}
