//! Cycle budgets: the asks of workflows that used theirs up on an item ("Needs you"), and a
//! person's reset, which judges the events the budget blocked again. Taking a cycle is part of
//! the claim (`claim.rs`).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::FromRow;

use super::claim::{ATTEMPTED, Claim, NewEvent, RunOps, submit_event};
use super::items::{ItemRow, lock_item, project_context, workflow};
use crate::ids::{ItemId, OrgId, ProjectId, WorkflowId};
use crate::judge::{self, Verdict};
use crate::store::{Change, Result, StoreError};

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
pub(crate) async fn reset_cycle_budget(ch: &mut Change, org: OrgId, item: ItemId, runs: &RunOps) -> Result<Reset> {
    let row = lock_item(ch, org, item).await?.ok_or(StoreError::NotFound("item"))?;
    let generation: i32 =
        sqlx::query_scalar("UPDATE items SET generation = generation + 1 WHERE item_id = $1 RETURNING generation").bind(item).fetch_one(&mut *ch.tx).await?;
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
            runs,
        )
        .await?;
        claims.push((wf.name.clone(), claim));
    }
    Ok(Reset { generation, claims })
}

/// The repository and number of an item key (`["github","owner/name",number]`).
pub(crate) fn key_parts(key: &str) -> (String, Option<i64>) {
    let parsed: Value = serde_json::from_str(key).unwrap_or(Value::Null);
    let repository = parsed.get(1).and_then(Value::as_str).unwrap_or_default().to_owned();
    (repository, parsed.get(2).and_then(Value::as_i64))
}
