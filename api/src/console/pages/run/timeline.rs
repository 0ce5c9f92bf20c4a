//! The run's steps as the page shows them: the journal of steps with their sessions' figures,
//! the waterfall and the graph's states, and the journal of events.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};

use crate::console::svg::{self, Bar, symbol};
use crate::http::runs::history::RunEventList;
use crate::http::runs::{RunDetail, Step};

/// A step as the page shows it: the API's step, with its state's symbol and how long it took
/// (or has taken so far).
#[derive(Debug, Serialize)]
pub(super) struct StepView<'a> {
    #[serde(flatten)]
    step: &'a Step,
    symbol: &'static str,
    class: &'static str,
    secs: f64,
}

/// The steps with their sessions' figures, and each node's latest state (for the graph).
pub(super) fn steps(detail: &RunDetail, now: DateTime<Utc>) -> (Vec<StepView<'_>>, HashMap<String, String>) {
    let mut states: HashMap<String, String> = HashMap::new();
    let steps: Vec<StepView<'_>> = detail
        .steps
        .iter()
        .map(|step| {
            states.insert(step.node.clone(), step.state.clone());
            let (symbol, class) = symbol(&step.state);
            let start = step.started_at.unwrap_or(step.created_at);
            let secs = (step.ended_at.unwrap_or(now) - start).num_milliseconds().max(0) as f64 / 1000.0;
            StepView { step, symbol, class, secs }
        })
        .collect();
    (steps, states)
}

/// The waterfall of the run's steps (SVG); empty before any step.
pub(super) fn waterfall(detail: &RunDetail, now: DateTime<Utc>) -> String {
    let bars: Vec<Bar<'_>> = detail
        .steps
        .iter()
        .map(|st| Bar {
            label: if st.attempt > 1 || st.visit > 1 { format!("{} (visit {}, attempt {})", st.node, st.visit, st.attempt) } else { st.node.clone() },
            state: &st.state,
            start: st.started_at.unwrap_or(st.created_at),
            end: st.ended_at,
        })
        .collect();
    let run_end = detail.run.ended_at.unwrap_or(now);
    if bars.is_empty() { String::new() } else { svg::waterfall(&bars, detail.run.created_at, run_end, now) }
}

/// The journal of the run's events, with people's names for the `by` they carry.
pub(super) fn journal(events: &RunEventList, names: &HashMap<String, String>) -> Vec<Value> {
    events
        .items
        .iter()
        .map(|e| {
            let mut attrs = e.attrs.clone();
            if let Some(by) = attrs.get("by").and_then(Value::as_str).and_then(|b| names.get(b)) {
                attrs["by"] = Value::String(by.clone());
            }
            json!({ "seq": e.seq, "at": e.at, "kind": e.kind, "node": e.node, "summary": summary(&attrs) })
        })
        .collect()
}

/// What the run's record says of its steps' walls, in words: each step that ran without them,
/// and each destination a step was refused (the first 20).
pub(super) fn walls(events: &RunEventList) -> Vec<String> {
    let mut out = Vec::new();
    for e in &events.items {
        let node = e.node.as_deref().unwrap_or("a step");
        let attr = |k: &str| e.attrs.get(k).and_then(Value::as_str).unwrap_or("?").to_owned();
        match e.kind.as_str() {
            "step.unwalled" => out.push(format!(
                "{node} ran without walls: its host {} runs --unsandboxed, so the step could read and reach what the host's user can.",
                attr("host")
            )),
            "step.egress_refused" if out.len() < 20 => {
                out.push(format!("{node} was refused a connection to {}: not in its node's network.allow nor its host's --egress-allow.", attr("destination")))
            }
            _ => {}
        }
    }
    out
}

/// A one-line summary of an event's attributes.
fn summary(attrs: &Value) -> String {
    let Some(map) = attrs.as_object() else {
        return String::new();
    };
    let mut parts: Vec<String> = Vec::new();
    for (k, v) in map.iter().take(6) {
        let v = match v {
            Value::String(s) => s.chars().take(80).collect(),
            Value::Null => continue,
            Value::Object(_) | Value::Array(_) => continue,
            other => other.to_string(),
        };
        parts.push(format!("{k}: {v}"));
    }
    parts.join(", ")
}
