//! Operator actions no other part of the store covers: resolving a failed run, which marks it
//! handled (it leaves the console's failures to resolve) without changing its status; the
//! overrides of edit-and-retry (a crew node's prompt, model or harness replaced for the later
//! attempts of that node in the retry, which hosts and the test executor run with); draining a
//! host (its claims take nothing new).

use serde_json::json;

use super::{Change, Result, StoreError, cap};
use crate::definition::{Definition, NodeKind};
use crate::ids::{HostId, OrgId, ProjectId, RunId};

/// Marks a failed run handled, with an optional note; writes `run.resolved`. Resolving one
/// already resolved changes nothing; a run that did not fail is a conflict.
pub async fn resolve(ch: &mut Change, org: OrgId, run: RunId, note: Option<&str>) -> Result<bool> {
    let ctx = ch.lock_run(org, run).await?.ok_or(StoreError::NotFound("run"))?;
    let (status, resolved): (String, bool) =
        sqlx::query_as("SELECT status, resolved_at IS NOT NULL FROM runs WHERE run_id = $1").bind(run).fetch_one(&mut *ch.tx).await?;
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

/// An operator's replacement of a crew node's prompt, model or harness for every later attempt
/// of that node in one run (edit-and-retry). Unset fields keep the node's own.
#[derive(Debug, Clone, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct NodeOverride {
    pub prompt: Option<String>,
    pub model: Option<String>,
    /// `claude-code`, `codex` or `command`.
    pub harness: Option<String>,
}

/// The override of `node` in `run`, if any.
pub async fn node_override(ch: &mut Change, run: RunId, node: &str) -> Result<Option<NodeOverride>> {
    Ok(sqlx::query_as("SELECT prompt, model, harness FROM run_node_overrides WHERE run_id = $1 AND node = $2")
        .bind(run)
        .bind(node)
        .fetch_optional(&mut *ch.tx)
        .await?)
}

/// The harnesses an override may name.
pub const HARNESSES: [&str; 3] = ["claude-code", "codex", "command"];

/// Gives a retry (`run`, locked, just submitted from `source`) the overrides of the run it
/// retries, then sets `edit` for `node` on top of them, with a `run.edited` event and a
/// `run.edit_retry` audit entry naming the acting person. `node` must be a crew node of the
/// run's workflow; a harness must be one of [`HARNESSES`] (`command` only for a node that
/// names its command).
pub async fn edit_retry(ch: &mut Change, org: OrgId, run: RunId, source: RunId, def: &Definition, node: &str, edit: &NodeOverride) -> Result<()> {
    let ctx = ch.locked(run)?.clone();
    let Some(n) = def.node(node) else {
        return Err(StoreError::Invalid(format!("node `{}` is not in this run's workflow", cap(node))));
    };
    let NodeKind::Crew(crew) = &n.kind else {
        return Err(StoreError::Invalid(format!("node `{}` is not a crew node: only a crew node's prompt, model or harness can be edited", cap(node))));
    };
    if edit.prompt.is_none() && edit.model.is_none() && edit.harness.is_none() {
        return Err(StoreError::Invalid("an edit names a prompt, a model or a harness".into()));
    }
    if let Some(p) = &edit.prompt {
        if p.trim().is_empty() || p.len() > 100_000 {
            return Err(StoreError::Invalid("a prompt is 1 to 100000 bytes".into()));
        }
        crate::definition::template::check(p).map_err(|e| StoreError::Invalid(format!("the prompt is not a valid template: {e}")))?;
    }
    if let Some(m) = &edit.model {
        if m.trim().is_empty() || m.chars().count() > 200 || m.chars().any(char::is_control) {
            return Err(StoreError::Invalid("a model is 1 to 200 printable characters".into()));
        }
    }
    if let Some(h) = &edit.harness {
        if !HARNESSES.contains(&h.as_str()) {
            return Err(StoreError::Invalid(format!("harness must be one of {}", HARNESSES.join(", "))));
        }
        if h == "command" && crew.command.is_empty() {
            return Err(StoreError::Invalid(format!("node `{}` names no command for the command harness", cap(node))));
        }
    }
    let by = cap(&ch.actor().label());
    inherit_overrides(ch, org, run, source).await?;
    sqlx::query(
        "INSERT INTO run_node_overrides (org_id, run_id, node, prompt, model, harness, set_by) VALUES ($1, $2, $3, $4, $5, $6, $7) \
         ON CONFLICT (run_id, node) DO UPDATE SET prompt = coalesce(EXCLUDED.prompt, run_node_overrides.prompt), \
           model = coalesce(EXCLUDED.model, run_node_overrides.model), harness = coalesce(EXCLUDED.harness, run_node_overrides.harness), \
           set_by = EXCLUDED.set_by, set_at = now()",
    )
    .bind(org)
    .bind(run)
    .bind(node)
    .bind(&edit.prompt)
    .bind(edit.model.as_deref().map(str::trim))
    .bind(&edit.harness)
    .bind(&by)
    .execute(&mut *ch.tx)
    .await?;
    let attrs = json!({
        "source": source.to_string(),
        "node": node,
        "prompt": edit.prompt.as_deref().map(cap),
        "model": edit.model.as_deref().map(str::trim),
        "harness": edit.harness,
    });
    ch.event(run, "run.edited", None, attrs.clone())?;
    ch.audit(org, Some(ctx.project), "run.edit_retry", ("run", run.to_string()), attrs)?;
    Ok(())
}

/// Copies the overrides of the run a retry retries onto the retry, so later attempts of those
/// nodes run as the operator last edited them.
pub async fn inherit_overrides(ch: &mut Change, org: OrgId, run: RunId, source: RunId) -> Result<()> {
    ch.locked(run)?;
    sqlx::query(
        "INSERT INTO run_node_overrides (org_id, run_id, node, prompt, model, harness, set_by, set_at) \
         SELECT org_id, $2, node, prompt, model, harness, set_by, set_at FROM run_node_overrides WHERE run_id = $3 AND org_id = $1 \
         ON CONFLICT DO NOTHING",
    )
    .bind(org)
    .bind(run)
    .bind(source)
    .execute(&mut *ch.tx)
    .await?;
    Ok(())
}

const HOST_DRAINED_FOR_UPDATE: &str =
    "SELECT drained_at IS NOT NULL FROM hosts WHERE org_id = $1 AND project_id = $2 AND host_id = $3 AND deregistered_at IS NULL FOR UPDATE";

const SET_DRAINED: &str = "UPDATE hosts SET drained_at = CASE WHEN $2 THEN now() END, drained_by = CASE WHEN $2 THEN $3 END WHERE host_id = $1";

/// Drains (`true`) or undrains a host of a project: a drained host's claims take nothing new,
/// while the steps it holds run to their end. Audited; draining one already drained changes
/// nothing.
pub async fn set_host_drained(ch: &mut Change, org: OrgId, project: ProjectId, host: HostId, drained: bool) -> Result<()> {
    let by = cap(&ch.actor().label());
    let before: Option<bool> = sqlx::query_scalar(HOST_DRAINED_FOR_UPDATE).bind(org).bind(project).bind(host).fetch_optional(&mut *ch.tx).await?;
    let before = before.ok_or(StoreError::NotFound("host"))?;
    if before == drained {
        return Ok(());
    }
    sqlx::query(SET_DRAINED).bind(host).bind(drained).bind(&by).execute(&mut *ch.tx).await?;
    let action = if drained { "host.drain" } else { "host.undrain" };
    ch.audit(org, Some(project), action, ("host", host.to_string()), json!({}))?;
    Ok(())
}
