//! A run's template context: the variables expressions and templates see. Read by the engine
//! (decisions, approval prompts, child inputs) and by the host protocol (a crew step's prompt),
//! so it stands below both.

use serde_json::{Map, Value, json};

use crate::state::StepState;
use crate::store::runs::RunRow;
use crate::store::steps::StepRow;
use crate::store::{Change, Result};

/// The variables expressions and templates see: `run`, `input`, `item`, `trigger` (what
/// started the run: the webhook's event, action, sender, label… as `if:` saw it, or
/// `{source: manual}`), `project` (`slug`, `name`), `nodes.<id>.output`. Also what a host's
/// prompt is rendered over (`store::hosts::claim`). One statement.
pub(crate) async fn context(ch: &mut Change, run: &RunRow, history: &[StepRow]) -> Result<Value> {
    let mut nodes = Map::new();
    for s in history.iter().filter(|s| s.state() == StepState::Succeeded) {
        nodes.insert(s.node.clone(), json!({ "output": s.output.clone().unwrap_or(Value::Null) }));
    }
    let (item, trigger, project): (Option<Value>, Option<Value>, Option<Value>) = sqlx::query_as(
        "SELECT (SELECT data FROM items WHERE item_id = $1), \
                (SELECT coalesce(te.payload->'trigger', jsonb_build_object('source', te.source)) FROM runs r \
                   JOIN trigger_events te ON te.event_id = r.trigger_event_id WHERE r.run_id = $2), \
                (SELECT jsonb_build_object('slug', slug, 'name', name) FROM projects WHERE project_id = $3)",
    )
    .bind(run.item_id)
    .bind(run.run_id)
    .bind(run.project_id)
    .fetch_one(ch.conn())
    .await?;
    Ok(json!({
        "run": { "id": run.run_id.to_string(), "input": run.input },
        "input": run.input,
        "item": item.unwrap_or(Value::Null),
        "trigger": trigger.unwrap_or_else(|| json!({ "source": "manual" })),
        "project": project.unwrap_or(Value::Null),
        "nodes": nodes,
    }))
}
