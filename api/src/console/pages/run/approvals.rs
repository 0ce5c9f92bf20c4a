//! The approvals of the run page: those it waits on as forms (with the messages and values of
//! a refused answer, `Feedback`) and the decisions already taken, with who took them.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use engine::db::Db;
use engine::ids::{OrgId, RunId};
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::{Feedback, strings};
use crate::console::ConsoleError;
use crate::http::runs::OpenApproval;

/// The run's answered approvals, oldest first ($1 run, $2 org).
pub(crate) const DECISIONS_SQL: &str = "SELECT node, decision, answer, decided_by, decided_at FROM approvals \
     WHERE run_id = $1 AND org_id = $2 AND decision IS NOT NULL ORDER BY decided_at";

/// An answered approval: who decided, how, and what they entered.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct DecisionRow {
    node: String,
    decision: String,
    answer: Option<Value>,
    pub(super) decided_by: Option<String>,
    decided_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize)]
struct FieldView {
    name: String,
    id: String,
    kind: String,
    required: bool,
    options: Vec<String>,
    description: Option<String>,
    value: String,
    checked: bool,
    error: Option<String>,
}

#[derive(Debug, Serialize)]
pub(super) struct ApprovalView {
    pub(super) node: String,
    prompt: String,
    deadline: Option<DateTime<Utc>>,
    fields: Vec<FieldView>,
    error: Option<String>,
    reject_error: Option<String>,
}

pub(super) fn approval_views(approvals: &[OpenApproval], fb: &Feedback) -> Vec<ApprovalView> {
    approvals
        .iter()
        .map(|a| {
            let empty = Map::new();
            let spec = a.fields.as_object().unwrap_or(&empty);
            let typed = fb.values.get(&a.node);
            let errors = fb.fields.get(&a.node);
            let fields = spec
                .iter()
                .map(|(name, f)| {
                    let kind = f.get("type").and_then(Value::as_str).unwrap_or("string").to_owned();
                    let default = f.get("default").filter(|d| !d.is_null());
                    let value = typed.and_then(|t| t.get(name)).cloned().unwrap_or_else(|| match default {
                        Some(Value::String(s)) => s.clone(),
                        Some(v) => v.to_string(),
                        None => String::new(),
                    });
                    let checked = match typed {
                        Some(t) => t.contains_key(name),
                        None => default.and_then(Value::as_bool).unwrap_or(false),
                    };
                    FieldView {
                        id: format!(
                            "f-{}-{}",
                            a.node.replace(|c: char| !c.is_ascii_alphanumeric(), "_"),
                            name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
                        ),
                        name: name.clone(),
                        required: f.get("required").and_then(Value::as_bool).unwrap_or(false),
                        options: strings(f.get("options")),
                        description: f.get("description").and_then(Value::as_str).map(str::to_owned),
                        error: errors.and_then(|e| e.get(name)).cloned(),
                        value,
                        checked,
                        kind,
                    }
                })
                .collect();
            ApprovalView {
                node: a.node.clone(),
                prompt: a.prompt.clone(),
                deadline: a.deadline,
                fields,
                error: fb.forms.get(&format!("approve:{}", a.node)).cloned(),
                reject_error: fb.forms.get(&format!("reject:{}", a.node)).cloned(),
            }
        })
        .collect()
}

/// The run's answered approvals, oldest first.
pub(super) async fn decided(db: &Db, id: RunId, org_id: OrgId) -> Result<Vec<DecisionRow>, ConsoleError> {
    Ok(sqlx::query_as(DECISIONS_SQL).bind(id).bind(org_id).fetch_all(db).await?)
}

/// Who decided each approval (by name) and what they entered.
pub(super) fn decisions(decided: &[DecisionRow], names: &HashMap<String, String>) -> Vec<Value> {
    decided
        .iter()
        .map(|d| {
            let entered: Vec<(String, String)> = match &d.answer {
                Some(Value::Object(m)) => m
                    .iter()
                    .filter(|(k, _)| d.decision == "approved" || k.as_str() == "reason")
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_owned)))
                    .collect(),
                _ => Vec::new(),
            };
            let by = d.decided_by.as_deref().map(|b| names.get(b).cloned().unwrap_or_else(|| b.to_owned()));
            json!({ "node": d.node, "decision": d.decision, "by": by, "at": d.decided_at, "entered": entered })
        })
        .collect()
}
