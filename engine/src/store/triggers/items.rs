//! What triggers write besides events: GitHub deliveries and where they route, items (the
//! stored projection of an issue, a pull request or a repository) and check results, and the
//! workflows of a project that listen to GitHub.

use std::sync::{Arc, LazyLock};

use serde_json::{Value, json};
use sqlx::{FromRow, Row};

use crate::catalog::Catalog;
use crate::definition::Definition;
use crate::ids::{ItemId, OrgId, ProjectId, RunId, WorkflowId};
use crate::item_keys::content_hash;
use crate::store::github::WAKE_PREFIX;
use crate::store::installations::{INSTALLATION_COLUMNS, Installation, installation_of};
use crate::store::{Change, Result, StoreError, cap};

/// Parsed workflow versions for ingest, re-judging and schedules. Versions are immutable, so
/// one cache per process serves every org.
pub(crate) static CATALOG: LazyLock<Catalog> = LazyLock::new(Catalog::default);

/// A project a delivery is routed to: its repository is connected through the delivery's
/// installation. Read as one JSON value ([`ROUTE`]).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Route {
    pub org: OrgId,
    pub project: ProjectId,
    pub project_slug: String,
    pub project_name: String,
    /// The project's workflows with a version (id, name, latest version, paused), by name:
    /// read with the route, so that judging needs no statement of its own
    /// ([`github_workflows`]).
    workflows: Vec<(WorkflowId, String, i32, bool)>,
}

impl Route {
    /// The `project` variable of `if:` conditions.
    pub fn context(&self) -> Value {
        json!({ "slug": self.project_slug, "name": self.project_name })
    }
}

/// What a delivery said on its envelope.
#[derive(Debug, Clone)]
pub struct DeliveryRow<'a> {
    pub id: &'a str,
    pub event: &'a str,
    pub action: Option<&'a str>,
    pub installation: Option<i64>,
    pub repository: Option<&'a str>,
}

/// A delivery recorded, or found to be a redelivery.
#[derive(Debug)]
pub struct Recorded {
    /// False for a redelivery: the id is already stored, and nothing more is to be done.
    pub fresh: bool,
    /// The delivery's installation as stored (None when unknown).
    pub installation: Option<Installation>,
    /// The projects the delivery is routed to, when it asked ([`RouteAsk`]) and its
    /// installation is claimed and active; none otherwise.
    pub routes: Vec<Route>,
}

/// What a delivery about an issue, a pull request or a check asks of the projects it reaches,
/// read from its payload before it is recorded.
#[derive(Debug, Clone, Copy)]
pub struct RouteAsk<'a> {
    /// The repository's `full_name`.
    pub repository: &'a str,
    /// The payload's `repository.default_branch`: what pull requests from the repository go
    /// to from now on (written only when it changed: GitHub's word, as a renamed default
    /// branch or a `master` repository says it).
    pub default_branch: Option<&'a str>,
    /// An issue's or pull request's number and the event (`pull_request.closed`): the steps of
    /// those projects watching it look again, each with a wake due now with the event as its
    /// reason (a gate re-reads the head commit and its checks; a wait resolves when the event
    /// is the one it waits for). The engine reads the item after this change commits.
    pub watched: Option<(i64, &'a str)>,
}

/// A route as one JSON value, for a query joined to `projects p`, with the project's workflows
/// that have a version (id, name, latest version, paused), by name: judging needs no
/// statement of its own for them ([`github_workflows`]).
const ROUTE: &str = "jsonb_build_object('org', p.org_id, 'project', p.project_id, 'project_slug', p.slug, 'project_name', p.name, 'workflows', \
     (SELECT coalesce(jsonb_agg(jsonb_build_array(w.workflow_id, w.name, w.latest_version, w.paused) ORDER BY w.name), '[]') \
      FROM workflows w WHERE w.project_id = p.project_id AND w.org_id = p.org_id AND w.latest_version > 0))";

/// Records a delivery by its `X-GitHub-Delivery` id, under the org that claimed its
/// installation (none when unknown or unclaimed: stored all the same), and reads that
/// installation, in one statement. A concurrent duplicate waits here until the first one
/// commits. With `ask`, a fresh delivery whose installation is claimed and active is routed by
/// the same statement: to the projects of the installation's org that connected the repository
/// through it, with what `ask` says written for them.
pub async fn record_delivery(ch: &mut Change, d: &DeliveryRow<'_>, ask: Option<&RouteAsk<'_>>) -> Result<Recorded> {
    let row = sqlx::query(&format!(
        "WITH i AS (SELECT {INSTALLATION_COLUMNS} FROM github_installations WHERE installation_id = $4), \
              d AS (INSERT INTO github_deliveries (org_id, delivery_id, event, action, outcome, installation_id, repository) \
                    VALUES ((SELECT org_id FROM i), $1, $2, $3, 'received', $4, $5) ON CONFLICT (delivery_id) DO NOTHING RETURNING 1), \
              r AS (SELECT r.project_id, r.org_id, r.full_name FROM repositories r, i, d \
                    WHERE r.full_name = $6 AND r.installation_id = $4 AND i.org_id IS NOT NULL AND NOT i.suspended AND NOT i.deleted), \
              moved AS (UPDATE repositories m SET default_branch = $7 FROM r \
                        WHERE m.project_id = r.project_id AND m.full_name = r.full_name AND $7::text IS NOT NULL \
                          AND m.default_branch IS DISTINCT FROM $7), \
              woken AS (INSERT INTO wakes (org_id, run_id, step_id, due_at, reason) \
                        SELECT g.org_id, g.run_id, g.step_id, now(), $9 FROM r \
                        JOIN github_watches g ON g.project_id = r.project_id AND g.repository = $6 AND g.number = $8 AND g.org_id = r.org_id \
                        RETURNING 1) \
         SELECT EXISTS (SELECT 1 FROM d) AS fresh, (SELECT count(*) FROM woken) AS woken, \
                (SELECT coalesce(jsonb_agg({ROUTE} ORDER BY r.project_id), '[]') FROM r JOIN projects p ON p.project_id = r.project_id) AS routes, \
                i.* FROM (VALUES (1)) AS one LEFT JOIN i ON true"
    ))
    .bind(cap(d.id))
    .bind(cap(d.event))
    .bind(d.action.map(cap))
    .bind(d.installation)
    .bind(d.repository.map(cap))
    .bind(ask.map(|a| a.repository.to_lowercase()))
    .bind(ask.and_then(|a| a.default_branch).filter(|b| !b.is_empty() && b.len() <= 255))
    .bind(ask.and_then(|a| a.watched).map(|(number, _)| number))
    .bind(ask.and_then(|a| a.watched).map(|(_, event)| cap(&format!("{WAKE_PREFIX}{event}"))))
    .fetch_one(&mut *ch.tx)
    .await?;
    if row.get::<i64, _>("woken") > 0 {
        ch.note_wake(std::time::Duration::ZERO);
    }
    let known: Option<i64> = row.get("installation_id");
    let sqlx::types::Json(routes) = row.try_get("routes")?;
    Ok(Recorded { fresh: row.get("fresh"), installation: known.map(|_| installation_of(&row)), routes })
}

/// An item as stored, locked in the change.
#[derive(Debug, Clone, FromRow)]
pub struct ItemRow {
    pub item_id: ItemId,
    pub project_id: ProjectId,
    pub key: String,
    pub data: Value,
    pub content_hash: Option<String>,
    pub generation: i32,
    /// Created by this change ([`item_for_update`]): locked already, and no run or trigger
    /// event can be on it yet, so the claim need not look for them.
    #[sqlx(skip)]
    pub fresh: bool,
}

const INSERT_ITEM: &str =
    "INSERT INTO items (org_id, project_id, item_id, key) VALUES ($1, $2, $3, $4) ON CONFLICT (project_id, key) DO NOTHING RETURNING item_id";

const ITEM_BY_KEY: &str = "SELECT item_id FROM items WHERE project_id = $1 AND key = $2 AND org_id = $3";

/// The item's id, creating an empty item when it is new.
pub async fn ensure_item(ch: &mut Change, org: OrgId, project: ProjectId, key: &str) -> Result<ItemId> {
    let new: Option<ItemId> = sqlx::query_scalar(INSERT_ITEM).bind(org).bind(project).bind(ItemId::mint()).bind(key).fetch_optional(&mut *ch.tx).await?;
    if let Some(id) = new {
        return Ok(id);
    }
    sqlx::query_scalar(ITEM_BY_KEY).bind(project).bind(key).bind(org).fetch_optional(&mut *ch.tx).await?.ok_or(StoreError::NotFound("item"))
}

/// The item an update is about, locked for judging. A new one is inserted with `data` (the
/// update applied to nothing) and comes back `fresh`; a known one is locked as [`lock_item`]
/// does, for the caller to apply the update to what is stored.
pub async fn item_for_update(ch: &mut Change, org: OrgId, project: ProjectId, key: &str, data: &Value, node_id: Option<&str>) -> Result<Option<ItemRow>> {
    let hash = content_hash(data);
    let fresh: Option<ItemRow> = sqlx::query_as(
        "INSERT INTO items (org_id, project_id, item_id, key, data, title, state, content_hash, head_sha, node_id) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (project_id, key) DO NOTHING \
         RETURNING item_id, project_id, key, data, content_hash, generation",
    )
    .bind(org)
    .bind(project)
    .bind(ItemId::mint())
    .bind(key)
    .bind(data)
    .bind(data.get("title").and_then(Value::as_str).map(cap))
    .bind(data.get("state").and_then(Value::as_str))
    .bind(&hash)
    .bind(data.pointer("/head/sha").and_then(Value::as_str))
    .bind(node_id)
    .fetch_optional(&mut *ch.tx)
    .await?;
    if let Some(item) = fresh {
        return Ok(Some(ItemRow { fresh: true, ..item }));
    }
    let known: Option<ItemId> = sqlx::query_scalar(ITEM_BY_KEY).bind(project).bind(key).bind(org).fetch_optional(&mut *ch.tx).await?;
    match known {
        Some(item) => lock_item(ch, org, item).await,
        None => Ok(None),
    }
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
    Ok(sqlx::query_as("SELECT item_id, project_id, key, data, content_hash, generation FROM items WHERE item_id = $1 AND org_id = $2 FOR UPDATE")
        .bind(item)
        .bind(org)
        .fetch_optional(&mut *ch.tx)
        .await?)
}

/// Stores a new projection of a locked item.
pub async fn update_item(ch: &mut Change, item: &ItemRow, data: &Value, node_id: Option<&str>) -> Result<String> {
    let hash = content_hash(data);
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
    let rows = sqlx::query(&format!(
        "SELECT i.item_id, {ROUTE} AS route FROM items i JOIN projects p ON p.project_id = i.project_id \
         WHERE i.org_id = $1 AND i.node_id = $2 ORDER BY i.item_id"
    ))
    .bind(org)
    .bind(node_id)
    .fetch_all(&mut *ch.tx)
    .await?;
    rows.iter()
        .map(|r| {
            let sqlx::types::Json(route) = r.try_get("route")?;
            Ok((r.get("item_id"), route))
        })
        .collect()
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

/// A workflow of the project, at its latest version.
#[derive(Debug, Clone)]
pub struct WorkflowInfo {
    pub id: WorkflowId,
    pub name: String,
    pub version: i32,
    pub paused: bool,
    pub def: Arc<Definition>,
}

/// The route's workflows that have an `on.github` trigger, at their latest versions (as read
/// with the route).
pub async fn github_workflows(ch: &mut Change, route: &Route) -> Result<Vec<WorkflowInfo>> {
    let mut out = Vec::with_capacity(route.workflows.len());
    for (id, name, version, paused) in &route.workflows {
        let (id, version, paused) = (*id, *version, *paused);
        match CATALOG.get(&mut ch.tx, id, version).await {
            Ok(def) if def.on.github.is_some() => out.push(WorkflowInfo { id, name: name.clone(), version, paused, def }),
            Ok(_) => {}
            // One broken stored version must not stop the project's other workflows.
            Err(e) => tracing::warn!(workflow.id = %id, workflow.version = version, error = %e, "workflow skipped by the triggers"),
        }
    }
    Ok(out)
}

pub(crate) async fn workflow(ch: &mut Change, org: OrgId, id: WorkflowId) -> Result<Option<WorkflowInfo>> {
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

pub(crate) async fn project_context(ch: &mut Change, project: ProjectId) -> Result<Value> {
    let row: Option<(String, String)> =
        sqlx::query_as("SELECT slug, name FROM projects WHERE project_id = $1").bind(project).fetch_optional(&mut *ch.tx).await?;
    Ok(row.map_or(Value::Null, |(slug, name)| json!({ "slug": slug, "name": name })))
}
