//! Approvals: the waiting step a person answers, its form, and the answer's checks.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::steps::{self, Failure, FailureClass, Initial, NewStep};
use super::{Change, Result, StoreError, cap, runs};
use crate::definition::{Field, FieldType};
use crate::ids::{OrgId, RunId, StepId};
use crate::state::{run, step};

/// The node name of the run-level approval that `approval: required` adds.
pub const RUN_APPROVAL_NODE: &str = "$start";
/// The prompt of the `$start` approval.
pub const START_PROMPT: &str = "Start this run?";

/// Creates a waiting approval step with its form; with a timeout, the wake that resolves it.
pub async fn open(
    ch: &mut Change, run: RunId, node: &str, visit: u32, prompt: &str, fields: &std::collections::BTreeMap<String, Field>, timeout: Option<Duration>,
) -> Result<StepId> {
    let step =
        steps::create(ch, run, NewStep { node, kind: "approval", visit, attempt: 1, requires: vec![], initial: Initial::Waiting, delay: Duration::ZERO })
            .await?;
    let org = ch.locked(run)?.org;
    let form = fields_json(fields);
    let deadline: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
        "INSERT INTO approvals (org_id, step_id, run_id, node, prompt, fields, deadline) \
         VALUES ($1, $2, $3, $4, $5, $6, now() + $7 * interval '1 millisecond') RETURNING deadline",
    )
    .bind(org)
    .bind(step)
    .bind(run)
    .bind(node)
    .bind(prompt)
    .bind(&form)
    .bind(timeout.map(|t| t.as_millis() as f64))
    .fetch_one(&mut *ch.tx)
    .await?;
    if let Some(t) = timeout {
        ch.wake(run, Some(step), t, "timeout", true).await?;
    }
    let mut attrs = json!({ "substate": "awaiting_signal", "waits_on": "person", "prompt": cap(prompt), "fields": form });
    if let Some(deadline) = deadline {
        attrs["deadline"] = json!(deadline);
    }
    ch.event(run, "run.awaiting", Some((step, node)), attrs)?;
    Ok(step)
}

fn fields_json(fields: &std::collections::BTreeMap<String, Field>) -> Value {
    let mut out = Map::new();
    for (name, f) in fields {
        let ty = match f.field_type {
            FieldType::String => "string",
            FieldType::Number => "number",
            FieldType::Boolean => "boolean",
            FieldType::Choice => "choice",
        };
        out.insert(name.clone(), json!({ "type": ty, "required": f.required, "options": f.options, "default": f.default, "description": f.description }));
    }
    Value::Object(out)
}

/// Checks an answer against the stored form: required fields present, types right, choices
/// among the options, no undeclared keys (so a `decision` key can never pass as a reject).
/// Fills in defaults. Returns the answer to record as the step's output.
pub fn check_answer(form: &Value, answer: &Map<String, Value>) -> std::result::Result<Value, String> {
    let empty = Map::new();
    let fields = form.as_object().unwrap_or(&empty);
    for key in answer.keys() {
        if !fields.contains_key(key) {
            return Err(format!("approval field \"{}\" is not in the form", cap(key)));
        }
    }
    let mut out = Map::new();
    for (name, spec) in fields {
        let value = match answer.get(name) {
            Some(Value::Null) | None => spec.get("default").filter(|d| !d.is_null()).cloned(),
            Some(Value::String(s)) if s.is_empty() => None,
            Some(v) => Some(v.clone()),
        };
        let Some(value) = value else {
            if spec.get("required").and_then(Value::as_bool).unwrap_or(false) {
                return Err(format!("approval field \"{name}\" is required"));
            }
            continue;
        };
        let ty = spec.get("type").and_then(Value::as_str).unwrap_or("string");
        let ok = match ty {
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            "choice" => spec.get("options").and_then(Value::as_array).is_some_and(|opts| opts.iter().any(|o| o == &value)),
            _ => value.is_string(),
        };
        if !ok {
            return Err(match ty {
                "choice" => format!("approval field \"{name}\" must be one of its options"),
                _ => format!("approval field \"{name}\" must be a {ty}"),
            });
        }
        out.insert(name.clone(), value);
    }
    Ok(Value::Object(out))
}

struct Open {
    step: StepId,
    fields: Value,
}

/// The open approval of `node` in a locked run (the latest visit).
async fn find_open(ch: &mut Change, run: RunId, node: &str) -> Result<Open> {
    let row: Option<(StepId, Value)> = sqlx::query_as(
        "SELECT a.step_id, a.fields FROM approvals a JOIN steps s USING (step_id) \
         WHERE a.run_id = $1 AND a.node = $2 AND a.decision IS NULL AND s.state = 'waiting' \
         ORDER BY s.started_seq DESC LIMIT 1",
    )
    .bind(run)
    .bind(node)
    .fetch_optional(&mut *ch.tx)
    .await?;
    let (step, fields) = row.ok_or_else(|| StoreError::Conflict(format!("no approval is waiting at `{}`", cap(node))))?;
    Ok(Open { step, fields })
}

async fn record(ch: &mut Change, step: StepId, decision: &str, answer: &Value) -> Result<()> {
    let by = ch.actor.label();
    sqlx::query("UPDATE approvals SET decision = $2, answer = $3, decided_by = $4, decided_at = now() WHERE step_id = $1")
        .bind(step)
        .bind(decision)
        .bind(answer)
        .bind(cap(&by))
        .execute(&mut *ch.tx)
        .await?;
    Ok(())
}

/// A person approves: the answer is checked, recorded, and becomes the node's output.
pub async fn approve(ch: &mut Change, org: OrgId, run: RunId, node: &str, answer: &Map<String, Value>) -> Result<StepId> {
    ch.lock_run(org, run).await?.ok_or(StoreError::NotFound("run"))?;
    let open = find_open(ch, run, node).await?;
    let output = check_answer(&open.fields, answer).map_err(StoreError::Invalid)?;
    record(ch, open.step, "approved", &output).await?;
    steps::succeed::<step::Waiting>(ch, run, open.step, &output, false).await?;
    if node == RUN_APPROVAL_NODE {
        runs::clear_needs_approval(ch, run).await?;
    }
    let project = ch.locked(run)?.project;
    ch.audit(org, Some(project), "approval.approve", ("run", run.to_string()), json!({ "node": node, "answer": output }))?;
    ch.wake(run, None, Duration::ZERO, "advance", true).await?;
    Ok(open.step)
}

/// A person rejects: the run is cancelled with `rejected at <node>: <reason>`.
pub async fn reject(ch: &mut Change, org: OrgId, run: RunId, node: &str, reason: Option<&str>) -> Result<StepId> {
    ch.lock_run(org, run).await?.ok_or(StoreError::NotFound("run"))?;
    let open = find_open(ch, run, node).await?;
    let reason = reason.map(str::trim).filter(|r| !r.is_empty()).unwrap_or("no reason given");
    let answer = json!({ "decision": "reject", "reason": cap(reason) });
    record(ch, open.step, "rejected", &answer).await?;
    let why = format!("rejected at {node}: {reason}");
    steps::fail::<step::Waiting>(ch, run, open.step, &Failure::new(cap(&why), FailureClass::Final), Some(&answer)).await?;
    let project = ch.locked(run)?.project;
    ch.audit(org, Some(project), "approval.reject", ("run", run.to_string()), json!({ "node": node, "reason": cap(reason) }))?;
    runs::finish::<run::Cancelled>(ch, run, Some(&why)).await?;
    Ok(open.step)
}

/// A dry run answers its approvals at once, recorded as approved so that no person is ever
/// asked: with the form's defaults (a required field without one is left out; nothing real
/// reads a dry run's answers).
pub async fn answer_dry(ch: &mut Change, run: RunId, step: StepId) -> Result<Value> {
    ch.locked(run)?;
    let form: Value = sqlx::query_scalar("SELECT fields FROM approvals WHERE step_id = $1 AND run_id = $2").bind(step).bind(run).fetch_one(&mut *ch.tx).await?;
    let defaults: Map<String, Value> = form
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(name, spec)| spec.get("default").filter(|d| !d.is_null()).map(|d| (name.clone(), d.clone())))
        .collect();
    let answer = Value::Object(defaults);
    record(ch, step, "approved", &answer).await?;
    steps::succeed::<step::Waiting>(ch, run, step, &answer, false).await?;
    Ok(answer)
}

/// An approval's deadline passed unanswered: the wait resolves (the step succeeds with
/// `timed_out`), and the run goes on.
pub async fn expire(ch: &mut Change, run: RunId, step: StepId) -> Result<()> {
    let answer = json!({ "timed_out": true });
    record(ch, step, "timed_out", &answer).await?;
    let row = steps::succeed::<step::Waiting>(ch, run, step, &answer, true).await?;
    ch.event(run, "run.wait_expired", Some((step, &row.node)), json!({ "waits_on": "person" }))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form() -> Value {
        json!({
            "ticket": { "type": "string", "required": true },
            "size": { "type": "choice", "options": ["s", "m"], "required": false, "default": "s" },
            "n": { "type": "number", "required": false }
        })
    }

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn a_missing_required_field_is_refused_by_name() {
        assert_eq!(check_answer(&form(), &map(json!({}))).unwrap_err(), "approval field \"ticket\" is required");
        assert_eq!(check_answer(&form(), &map(json!({"ticket": ""}))).unwrap_err(), "approval field \"ticket\" is required");
    }

    #[test]
    fn a_decision_key_is_refused_unless_the_form_declares_it() {
        let err = check_answer(&form(), &map(json!({"ticket": "T-1", "decision": "reject"}))).unwrap_err();
        assert!(err.contains("\"decision\" is not in the form"), "{err}");
    }

    #[test]
    fn types_and_choices_are_checked_and_defaults_filled() {
        assert!(check_answer(&form(), &map(json!({"ticket": 5}))).is_err());
        assert!(check_answer(&form(), &map(json!({"ticket": "a", "size": "xl"}))).is_err());
        assert!(check_answer(&form(), &map(json!({"ticket": "a", "n": "7"}))).is_err());
        let ok = check_answer(&form(), &map(json!({"ticket": "T-1", "n": 3}))).unwrap();
        assert_eq!(ok, json!({"ticket": "T-1", "size": "s", "n": 3}));
    }
}
