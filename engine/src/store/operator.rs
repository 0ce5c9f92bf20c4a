//! Operator actions no other part of the store covers: resolving a failed run, which marks it
//! handled (it leaves the console's failures to resolve) without changing its status.

use serde_json::json;

use super::{cap, Change, Result, StoreError};
use crate::ids::{OrgId, RunId};

/// Marks a failed run handled, with an optional note; writes `run.resolved`. Resolving one
/// already resolved changes nothing; a run that did not fail is a conflict.
pub async fn resolve(ch: &mut Change, org: OrgId, run: RunId, note: Option<&str>) -> Result<bool> {
    let ctx = ch.lock_run(org, run).await?.ok_or(StoreError::NotFound("run"))?;
    let (status, resolved): (String, bool) = sqlx::query_as("SELECT status, resolved_at IS NOT NULL FROM runs WHERE run_id = $1")
        .bind(run)
        .fetch_one(&mut *ch.tx)
        .await?;
    if status != "failed" {
        return Err(StoreError::Conflict(format!("only a failed run is resolved; this one is {status}")));
    }
    if resolved {
        return Ok(false);
    }
    sqlx::query("UPDATE runs SET resolved_at = now(), resolved_by = $2 WHERE run_id = $1")
        .bind(run)
        .bind(cap(&ch.actor().label()))
        .execute(&mut *ch.tx)
        .await?;
    ch.forget_run_row(run);
    let attrs = json!({ "note": note.map(cap) });
    ch.event(run, "run.resolved", None, attrs.clone())?;
    ch.audit(org, Some(ctx.project), "run.resolve", ("run", run.to_string()), attrs)?;
    Ok(true)
}
