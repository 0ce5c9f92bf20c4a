//! Workflow versions: immutable once written; a run pins one.

use serde_json::json;
use sha2::{Digest, Sha256};

use super::{Change, Result};
use crate::ids::{OrgId, ProjectId, WorkflowId};

const UPSERT_WORKFLOW: &str = "INSERT INTO workflows (org_id, project_id, workflow_id, name) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (project_id, name) DO UPDATE SET name = EXCLUDED.name RETURNING workflow_id";

const INSERT_VERSION: &str = "INSERT INTO workflow_versions (org_id, workflow_id, version, source, sha256, created_by) VALUES ($1, $2, $3, $4, $5, $6)";

/// Stores `source` (already validated by the caller) as the next version of workflow `name`.
/// Uploading the same text as the latest version again returns that version: versions only
/// change when the definition does.
pub async fn put_version(ch: &mut Change, org: OrgId, project: ProjectId, name: &str, source: &str) -> Result<(WorkflowId, i32)> {
    let sha = hex(&Sha256::digest(source.as_bytes()));
    let workflow: WorkflowId = sqlx::query_scalar(UPSERT_WORKFLOW).bind(org).bind(project).bind(WorkflowId::mint()).bind(name).fetch_one(&mut *ch.tx).await?;
    // Lock the workflow row so two uploads never take the same version number.
    let latest: (i32, Option<String>) = sqlx::query_as(
        "SELECT w.latest_version, v.sha256 FROM workflows w \
         LEFT JOIN workflow_versions v ON v.workflow_id = w.workflow_id AND v.version = w.latest_version \
         WHERE w.workflow_id = $1 AND w.org_id = $2 FOR UPDATE OF w",
    )
    .bind(workflow)
    .bind(org)
    .fetch_one(&mut *ch.tx)
    .await?;
    if latest.1.as_deref() == Some(sha.as_str()) {
        return Ok((workflow, latest.0));
    }
    let version = latest.0 + 1;
    let by = ch.actor.label();
    sqlx::query(INSERT_VERSION).bind(org).bind(workflow).bind(version).bind(source).bind(&sha).bind(super::cap(&by)).execute(&mut *ch.tx).await?;
    sqlx::query("UPDATE workflows SET latest_version = $2 WHERE workflow_id = $1").bind(workflow).bind(version).execute(&mut *ch.tx).await?;
    ch.audit(org, Some(project), "workflow.version", ("workflow", workflow.to_string()), json!({ "name": name, "version": version, "sha256": sha }))?;
    // The schedule follows the latest version (callers validated the source; one that does
    // not parse has no schedule to keep).
    if let Ok(def) = crate::definition::parse(source) {
        super::schedules::sync(ch, org, project, workflow, &def).await?;
    }
    Ok((workflow, version))
}

/// Pauses or unpauses a workflow: new runs of a paused workflow are held.
pub async fn set_paused(ch: &mut Change, org: OrgId, workflow: WorkflowId, paused: bool) -> Result<bool> {
    let project: Option<ProjectId> = sqlx::query_scalar("UPDATE workflows SET paused = $3 WHERE workflow_id = $1 AND org_id = $2 RETURNING project_id")
        .bind(workflow)
        .bind(org)
        .bind(paused)
        .fetch_optional(&mut *ch.tx)
        .await?;
    if let Some(project) = project {
        let action = if paused { "workflow.pause" } else { "workflow.unpause" };
        ch.audit(org, Some(project), action, ("workflow", workflow.to_string()), json!({}))?;
        if !paused {
            // The runs it held are admitted again (`store::admission`).
            super::admission::workflow_unpaused(ch, org, workflow).await?;
        }
    }
    Ok(project.is_some())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
