//! Intervene: a person's messages to a live crew session, and their delivery to the host that
//! holds the step.
//!
//! A message is taken only for a crew step that is `running` under a host whose harness can
//! take one (Claude Code, which reads further user lines on its standard input with
//! `--input-format stream-json`; `codex exec` and a command read their prompt to the end of
//! input and cannot). It is written in one `Change` with a `step.message` run event (who sent
//! it and its length, not its text) and an audit entry. The holder learns of undelivered
//! messages from the answers to its heartbeats and session reports ([`pending`]) and marks each
//! delivered once it has written it to the harness ([`delivered`]); until then it is offered
//! again, so a host that restarts or loses an answer does not lose a message.

use crate::db::Db;
use serde_json::json;

use super::hosts::{HostRow, holder};
use super::{Change, Result, StoreError};
use crate::ids::{OrgId, RunId, StepId};

/// The longest message, in characters.
pub const MAX_CHARS: usize = 20_000;

/// Harnesses that take a message while they run.
pub fn takes_messages(harness: &str) -> bool {
    harness == "claude-code"
}

/// A message as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Message {
    pub message_id: uuid::Uuid,
    pub text: String,
}

/// The step a message is for, as `send` reads it.
#[derive(sqlx::FromRow)]
struct Target {
    node: String,
    kind: String,
    state: String,
    holder: Option<String>,
    harness: Option<String>,
}

/// Sends `text` to the session of `step` (of `run`, in `org`): refused (`Conflict`, with the
/// reason) when the step is not a running crew step or its harness cannot take a message.
pub async fn send(ch: &mut Change, org: OrgId, run: RunId, step: StepId, text: &str) -> Result<uuid::Uuid> {
    let text = text.trim();
    if text.is_empty() {
        return Err(StoreError::Invalid("a message has some text".into()));
    }
    if text.chars().count() > MAX_CHARS {
        return Err(StoreError::Invalid(format!("a message is at most {MAX_CHARS} characters")));
    }
    let ctx = ch.lock_run(org, run).await?.ok_or(StoreError::NotFound("run"))?;
    let found: Option<Target> = sqlx::query_as(
        "SELECT s.node, s.kind, s.state, s.holder, ss.harness FROM steps s LEFT JOIN step_sessions ss ON ss.step_id = s.step_id \
         WHERE s.step_id = $1 AND s.run_id = $2 AND s.org_id = $3",
    )
    .bind(step)
    .bind(run)
    .bind(org)
    .fetch_optional(&mut *ch.tx)
    .await?;
    let Target { node, kind, state, holder, harness } = found.ok_or(StoreError::NotFound("step"))?;
    if kind != "crew" {
        return Err(StoreError::Conflict(format!("step `{node}` is a {kind} step, not a crew session: there is no one to tell")));
    }
    if state != "running" || !holder.as_deref().is_some_and(|h| h.starts_with("host:")) {
        return Err(StoreError::Conflict(format!("step `{node}` is {state}, not a live session: a message reaches only a running harness")));
    }
    let harness = harness.unwrap_or_default();
    if !takes_messages(&harness) {
        let name = if harness.is_empty() { "its harness".to_owned() } else { format!("the {harness} harness") };
        return Err(StoreError::Conflict(format!(
            "{name} cannot take messages while it runs (it reads its prompt to the end of its input); only claude-code can"
        )));
    }
    let id = uuid::Uuid::now_v7();
    let by = super::cap(&ch.actor().label());
    sqlx::query("INSERT INTO step_messages (org_id, run_id, step_id, message_id, text, sent_by) VALUES ($1, $2, $3, $4, $5, $6)")
        .bind(org)
        .bind(run)
        .bind(step)
        .bind(id)
        .bind(text)
        .bind(&by)
        .execute(&mut *ch.tx)
        .await?;
    // The text stays in its row (a prompt may hold anything); the event and the audit entry
    // say who sent how much.
    let attrs = json!({ "message": id.to_string(), "by": by, "chars": text.chars().count() });
    ch.event(run, "step.message", Some((step, &node)), attrs.clone())?;
    ch.audit(org, Some(ctx.project), "step.message", ("step", step.to_string()), attrs)?;
    Ok(id)
}

/// The undelivered messages of a step `host` holds, oldest first (none for a step it does not
/// hold, or that is not running).
pub async fn pending(pool: &Db, host: &HostRow, step: StepId) -> Result<Vec<Message>> {
    Ok(sqlx::query_as(
        "SELECT m.message_id, m.text FROM step_messages m JOIN steps s ON s.step_id = m.step_id \
         WHERE m.step_id = $1 AND m.org_id = $2 AND m.delivered_at IS NULL \
           AND s.holder = $3 AND s.state = 'running' \
         ORDER BY m.created_at, m.message_id LIMIT 20",
    )
    .bind(step)
    .bind(host.org_id)
    .bind(holder(host.host_id))
    .fetch_all(pool)
    .await?)
}

/// Marks messages of a step `host` held delivered (it wrote them to the harness); answers how
/// many were newly marked. Messages of another step or another host's are left alone.
pub async fn delivered(pool: &Db, host: &HostRow, step: StepId, ids: &[uuid::Uuid]) -> Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    let done = sqlx::query(
        "UPDATE step_messages m SET delivered_at = now() FROM steps s \
         WHERE s.step_id = m.step_id AND m.step_id = $1 AND m.org_id = $2 AND m.message_id = ANY($3) \
           AND m.delivered_at IS NULL AND s.holder = $4",
    )
    .bind(step)
    .bind(host.org_id)
    .bind(ids)
    .bind(holder(host.host_id))
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}
