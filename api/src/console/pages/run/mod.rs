//! The run page: a headline in words, the forecast of the time left, the steps as a journal, a
//! waterfall and the graph, the live transcript of a crew step, and the forms that act on the
//! run (approve, reject, cancel, retry, rerun, rerun from a node, and a message to a running
//! crew session).
//!
//! The run, its steps with their sessions' figures, open approvals, `why` and events come from
//! the REST API in-process; the forecast, the transcript and the graph's definition are read
//! here, each with one indexed statement. Every form posts back here and acts through the REST
//! route of the same name; an approval's answer is checked field by field first (with the
//! store's own `check_answer`) so that every message shows at once beside its field.
//!
//! Here: what the page's requests name (`RunPath`, …) and what a refused form leaves on it
//! (`Feedback`). `page.rs` is the page itself (`render`); `headline.rs` puts the run in words,
//! `forecast.rs` the time left, `timeline.rs` the steps, waterfall and journal, `tail.rs` the
//! transcript, `approvals.rs` the approvals and decisions, `decide.rs` the approval forms'
//! handlers, `act.rs` the other forms.

mod act;
mod approvals;
mod decide;
mod forecast;
mod headline;
mod page;
mod tail;
mod timeline;

use std::collections::HashMap;

use engine::ids::RunId;
use serde::Deserialize;
use serde_json::Value;

pub(in super::super) use act::{cancel, rerun, retry, say};
pub(in super::super) use decide::{approve, reject};
pub(in super::super) use page::page;
pub(in super::super) use tail::transcript;

use crate::console::ConsoleError;

#[derive(Debug, Deserialize)]
pub(in super::super) struct RunPath {
    org: String,
    project: String,
    run: String,
}

#[derive(Debug, Deserialize)]
pub(in super::super) struct NodePath {
    org: String,
    project: String,
    run: String,
    node: String,
}

#[derive(Debug, Deserialize)]
pub(in super::super) struct StepPath {
    org: String,
    project: String,
    run: String,
    step: String,
}

impl NodePath {
    /// The run the approval is in.
    fn run(&self) -> RunPath {
        RunPath { org: self.org.clone(), project: self.project.clone(), run: self.run.clone() }
    }
}

impl StepPath {
    /// The run the step is in.
    fn run(&self) -> RunPath {
        RunPath { org: self.org.clone(), project: self.project.clone(), run: self.run.clone() }
    }
}

/// The strings of a JSON array (a field's options, the capabilities no host has); none for
/// anything else.
fn strings(value: Option<&Value>) -> Vec<String> {
    value.and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect()).unwrap_or_default()
}

/// What a failed form leaves on the page: messages per approval field, the values typed, and
/// one message per form.
#[derive(Debug, Default)]
struct Feedback {
    /// node → field → message
    fields: HashMap<String, HashMap<String, String>>,
    /// node → field → value typed
    values: HashMap<String, HashMap<String, String>>,
    /// form → message (`approve:<node>`, `reject:<node>`, `cancel`, `retry`, `rerun`)
    forms: HashMap<String, String>,
}

fn run_id(text: &str) -> Result<RunId, ConsoleError> {
    text.parse().map_err(|_| ConsoleError::NotFound("run not found".into()))
}
