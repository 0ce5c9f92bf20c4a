//! The graph walk: a pure function from a workflow definition and a run's step history to the
//! steps to start next and whether the run is finished.
//!
//! The walker stores nothing beside the steps. The engine calls [`walk`] whenever a run wakes,
//! inserts one step for each [`Start`] it returns (in the same transaction as the history it
//! read), and finishes the run when [`Walk::finished`] is set, cancelling whatever is still
//! open. Calling it again on the same history gives the same answer, so a wake that arrives
//! twice does nothing twice.
//!
//! # The history
//!
//! One [`StepRecord`] per step of the run: its node, its visit (a loop back to a node makes a
//! new visit), its attempt within the visit (a retry makes a new attempt), the run event
//! sequence number at which it was created, and its state. A finished step carries the
//! sequence number at which it finished; comparing the two orders "this predecessor finished
//! after that node last started" without clocks. The order of the slice does not matter.
//!
//! # Edges
//!
//! Into a node `n` there are four kinds of edges, each taken by one finished step of its
//! source:
//!
//! - **plain**: `n.after` names a node that is not a decision; taken when that node's step
//!   succeeded (or failed for good with `continue_on_error`).
//! - **route**: from a decision `d` that names `n` in a case, in its `default`, or in
//!   `n.after`; taken only when `d`'s step succeeded with `route == Some(n)`. A decision allows
//!   exactly its chosen target.
//! - **loop**: from a gate whose `on_fail` is `n`; taken when the gate's step failed for good.
//! - **failure**: from a node whose `failure` is `n`; taken as soon as that node's step failed
//!   for good, so the handler starts at once.
//!
//! Plain and route edges are the ones a node *waits on*: their sources are its predecessors.
//!
//! # Retries and failing for good
//!
//! A failed step is retried (same visit, next attempt) while the visit's failures of its kind
//! are fewer than its failure allows ([`allowed_attempts`]): nothing for a
//! [`FailureClass::Final`] failure, [`INFRASTRUCTURE_ATTEMPTS`] (or the node's
//! `retry.attempts` if larger) for an infrastructure failure, and the node's `retry:` for an
//! ordinary one. The two kinds are counted apart: a lost lease uses none of `retry.attempts`,
//! and one on the last of them is still recovered. The delay doubles from `retry.backoff` up
//! to `retry.max_backoff` with each failure of the kind; an infrastructure retry on a node
//! without `retry:` starts at once. A failed step that is not retried has *failed for good*, and then,
//! in this order: a `failure:` handler starts; or `continue_on_error` takes its plain edges as
//! if it had succeeded (a decision takes its `default`); or a gate's `on_fail` loops back; or
//! the failure is *unhandled*: nothing after it starts, other branches go on, and the run
//! fails once they are done.
//!
//! # Which nodes start
//!
//! A *root* is a node with no edge into it but loops back: a gate's `on_fail`, or a route from
//! a decision downstream of it. With an empty history every root starts; a `trigger` node is
//! just a root.
//!
//! A node is *pending* when it is not open and either its latest step waits for a retry, or
//! an edge into it was taken by a step that finished after the node's latest step started
//! (with an empty history, every root is pending). A pending node starts unless one of its
//! predecessors is open or pending itself: a join waits for siblings that are open or about
//! to start, never for branches that were not taken. Inside a cycle of waits (a decision
//! routing back), only the node later in the definition waits, so a cycle cannot deadlock.
//! A new visit whose number would exceed `stop_the_line_attempts` is not started: the run
//! fails with `stopped_line:<node>`.
//!
//! # When the run is finished
//!
//! - An `end` node's step succeeded: at once, with `ended:end_run` and the node's outcome.
//! - A node would exceed `stop_the_line_attempts`: at once, failed.
//! - Nothing is open and nothing starts: failed if a step failed for good unhandled (the
//!   earliest; `attempts_exhausted` when its failure allowed retries and they ran out, else its
//!   own reason), completed otherwise.
//!
//! A cancelled step takes no edge and is no failure: cancelling the run is the engine's
//! decision, not the walker's.

use std::time::Duration;

use crate::definition::edges::EdgeKind;
use crate::definition::{Definition, EndOutcome, Node, NodeId, NodeKind};

mod graph;
#[cfg(test)]
mod tests;

use graph::{Edge, Graph};

/// Infrastructure failures (lease expired, host lost, stalled) are retried by themselves up
/// to this many attempts in total, or the node's `retry.attempts` if larger.
pub const INFRASTRUCTURE_ATTEMPTS: u32 = 3;

/// The reason a run fails with when a node would be visited too often: `stopped_line:<node>`.
pub const STOPPED_LINE_PREFIX: &str = "stopped_line:";

/// The reason a run finishes with when an `end` node's step succeeded.
pub const ENDED: &str = "ended:end_run";

/// The reason a run fails with when its unhandled failure allowed retries and they ran out.
pub const ATTEMPTS_EXHAUSTED: &str = "attempts_exhausted";

/// One step of the run, as the walker needs to see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRecord {
    pub node: NodeId,
    /// 1-based; a loop back to this node makes `visit + 1`.
    pub visit: u32,
    /// 1-based within a visit; a retry makes `attempt + 1`.
    pub attempt: u32,
    /// The run event sequence number when the step was created (monotonic per run).
    pub started_seq: u64,
    pub state: StepState,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepState {
    /// Pending, leased, running or waiting: the step is not done.
    Open,
    Succeeded {
        /// For a decision, the node its chosen case (or default) routes to.
        route: Option<NodeId>,
        finished_seq: u64,
    },
    Failed {
        /// A short machine reason (`gate_failed`, `route:$unknown`, `lease_expired`, …).
        reason: String,
        class: FailureClass,
        exit_code: Option<i32>,
        finished_seq: u64,
    },
    Cancelled,
}

/// How a failure may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureClass {
    /// The step's own failure (an exit code, a timeout, a failed gate): retried only as the
    /// node's `retry:` allows.
    Ordinary,
    /// The step was lost rather than failed (lease expired, host lost, stalled): retried by
    /// itself, see [`INFRASTRUCTURE_ATTEMPTS`].
    Infrastructure,
    /// Retrying cannot help (a person's rejection, `budget_hard_stop`, a GitHub 4xx on an
    /// output, a validation error): never retried.
    Final,
}

/// A step to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    pub node: NodeId,
    pub visit: u32,
    pub attempt: u32,
    /// The retry backoff to wait before the step may run; zero for a first attempt.
    pub delay: Duration,
}

/// How a finished run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Completed { reason: Option<String> },
    Failed { reason: String },
}

/// What the run should do next.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Walk {
    /// Steps to create, at most one per node, in the order of `Definition::nodes`. Empty
    /// when `finished` is set.
    pub start: Vec<Start>,
    /// Set when the run is over; the engine cancels whatever is still open.
    pub finished: Option<Outcome>,
}

/// Works out, from the definition and the whole step history of one run, which steps to
/// start and whether the run is finished. See the module documentation for the rules.
#[must_use]
pub fn walk(def: &Definition, history: &[StepRecord]) -> Walk {
    let graph = Graph::new(def);
    let steps = Steps::new(&graph, history);

    if let Some(outcome) = ended(&graph, &steps) {
        return Walk { start: Vec::new(), finished: Some(outcome) };
    }

    let status: Vec<Status> = (0..graph.len()).map(|n| status(&graph, &steps, n)).collect();
    let mut start = Vec::new();
    for (n, node) in graph.nodes.iter().enumerate() {
        if waits(&graph, &status, n) {
            continue;
        }
        match &status[n] {
            Status::Retry { visit, attempt, delay } => start.push(Start { node: node.id.clone(), visit: *visit, attempt: *attempt, delay: *delay }),
            Status::Triggered => {
                let visit = steps.last_visit(n).saturating_add(1);
                if visit > graph.def.stop_the_line_attempts {
                    let reason = format!("{STOPPED_LINE_PREFIX}{}", node.id);
                    return Walk { start: Vec::new(), finished: Some(Outcome::Failed { reason }) };
                }
                start.push(Start { node: node.id.clone(), visit, attempt: 1, delay: Duration::ZERO });
            }
            Status::Open | Status::Idle => {}
        }
    }

    let finished = (start.is_empty() && !steps.any_open).then(|| settle(&graph, &steps));
    Walk { start, finished }
}

/// How many failures of this kind (infrastructure, or the node's own) a step of `node` may
/// have within one visit: the two are counted apart, so a lost lease does not use up
/// `retry.attempts`, and one on the last of them is still recovered.
#[must_use]
pub fn allowed_attempts(node: &Node, class: FailureClass, exit_code: Option<i32>) -> u32 {
    match class {
        FailureClass::Final => 1,
        FailureClass::Infrastructure => {
            let configured = node.retry.as_ref().map_or(0, |r| r.attempts);
            configured.max(INFRASTRUCTURE_ATTEMPTS)
        }
        FailureClass::Ordinary => match &node.retry {
            Some(r) if r.exit_codes.is_empty() || exit_code.is_some_and(|c| r.exit_codes.contains(&c)) => r.attempts.max(1),
            _ => 1,
        },
    }
}

/// The delay before attempt `failed_attempt + 1`: `backoff · 2^(failed_attempt − 1)`, capped
/// at `max_backoff`; zero for a node without `retry:` (an infrastructure retry).
#[must_use]
pub fn retry_delay(node: &Node, failed_attempt: u32) -> Duration {
    let Some(retry) = &node.retry else {
        return Duration::ZERO;
    };
    // A factor too large for u32 or a product too large for Duration is past any sane cap.
    1u32.checked_shl(failed_attempt.saturating_sub(1))
        .and_then(|factor| retry.backoff.checked_mul(factor))
        .map_or(retry.max_backoff, |delay| delay.min(retry.max_backoff))
}

/// The history grouped by node.
struct Steps<'h> {
    /// Each node's steps, in the order they were created.
    by_node: Vec<Vec<&'h StepRecord>>,
    /// Whether any step, of a known node or not, is still open.
    any_open: bool,
    empty: bool,
}

impl<'h> Steps<'h> {
    fn new(graph: &Graph<'_>, history: &'h [StepRecord]) -> Self {
        let mut by_node: Vec<Vec<&StepRecord>> = vec![Vec::new(); graph.len()];
        for step in history {
            // Steps of a node the definition does not have (it cannot happen with a pinned
            // version) take no part in the walk, but an open one still keeps the run going.
            if let Some(&n) = graph.index.get(step.node.as_str()) {
                by_node[n].push(step);
            }
        }
        for steps in &mut by_node {
            steps.sort_by_key(|s| (s.started_seq, s.visit, s.attempt));
        }
        Steps { by_node, any_open: history.iter().any(|s| s.state == StepState::Open), empty: history.is_empty() }
    }

    fn latest(&self, n: usize) -> Option<&'h StepRecord> {
        self.by_node[n].last().copied()
    }

    fn last_visit(&self, n: usize) -> u32 {
        self.by_node[n].iter().map(|s| s.visit).max().unwrap_or(0)
    }

    fn is_open(&self, n: usize) -> bool {
        self.by_node[n].iter().any(|s| s.state == StepState::Open)
    }
}

/// Where a node stands in this walk.
#[derive(Debug, Clone, PartialEq)]
enum Status {
    /// It has an open step.
    Open,
    /// Its latest step failed and will be retried.
    Retry {
        visit: u32,
        attempt: u32,
        delay: Duration,
    },
    /// An edge into it was taken since its latest step started: it starts a new visit.
    Triggered,
    Idle,
}

impl Status {
    fn is_pending(&self) -> bool {
        matches!(self, Status::Retry { .. } | Status::Triggered)
    }
}

fn status(graph: &Graph<'_>, steps: &Steps<'_>, n: usize) -> Status {
    if steps.is_open(n) {
        return Status::Open;
    }
    let node = &graph.nodes[n];
    let latest = steps.latest(n);
    // `retry` answers only for a failed step, so this is "the latest step failed, retryably".
    if let Some((step, delay)) = latest.and_then(|s| retry(node, s, &steps.by_node[n]).map(|d| (s, d))) {
        return Status::Retry { visit: step.visit, attempt: step.attempt.saturating_add(1), delay };
    }
    if steps.empty && graph.is_root(n) {
        return Status::Triggered;
    }
    // An edge taken before the node's latest step started has been used by that step.
    let since = latest.map(|s| s.started_seq);
    let triggered = graph.incoming[n].iter().any(|edge| {
        let of_from = &steps.by_node[edge.from];
        of_from.iter().any(|step| finished_seq(step).is_some_and(|seq| since.is_none_or(|since| seq > since)) && takes(graph, *edge, n, step, of_from))
    });
    if triggered { Status::Triggered } else { Status::Idle }
}

/// Whether a pending node must wait: one of its predecessors is open, or pending and not
/// after it in a cycle of waits (then the later of the two waits, so neither waits forever).
fn waits(graph: &Graph<'_>, status: &[Status], n: usize) -> bool {
    graph.preds[n].iter().any(|&p| match &status[p] {
        Status::Open => true,
        s if s.is_pending() => p < n || !graph.reaches(n, p),
        _ => false,
    })
}

/// Whether `step`, a finished step of `edge.from` (whose steps are `of_from`), takes that edge
/// into node `to`.
fn takes(graph: &Graph<'_>, edge: Edge, to: usize, step: &StepRecord, of_from: &[&StepRecord]) -> bool {
    let from = &graph.nodes[edge.from];
    let to_id = graph.nodes[to].id.as_str();
    match &step.state {
        StepState::Succeeded { route, .. } => match edge.kind {
            EdgeKind::Plain => true,
            EdgeKind::Route => route.as_deref() == Some(to_id),
            EdgeKind::Loop | EdgeKind::Failure => false,
        },
        StepState::Failed { .. } if retry(from, step, of_from).is_none() => {
            match (handling(from), edge.kind) {
                (Handling::Handler, EdgeKind::Failure) | (Handling::Continue, EdgeKind::Plain) | (Handling::Loop, EdgeKind::Loop) => true,
                // Going on past a failed decision means taking its answer for "no case".
                (Handling::Continue, EdgeKind::Route) => match &from.kind {
                    NodeKind::Decision(d) => d.default.as_deref() == Some(to_id),
                    _ => false,
                },
                _ => false,
            }
        }
        StepState::Failed { .. } | StepState::Open | StepState::Cancelled => false,
    }
}

/// What happens when a step of `node` fails for good, in order of precedence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handling {
    /// Its `failure:` handler starts.
    Handler,
    /// `continue_on_error`: its plain edges are taken as if it had succeeded.
    Continue,
    /// A gate's `on_fail` loops back.
    Loop,
    /// Nothing after it starts, and the run will fail.
    Unhandled,
}

fn handling(node: &Node) -> Handling {
    if node.failure.is_some() {
        Handling::Handler
    } else if node.continue_on_error {
        Handling::Continue
    } else if matches!(&node.kind, NodeKind::Gate(g) if g.on_fail.is_some()) {
        Handling::Loop
    } else {
        Handling::Unhandled
    }
}

/// The backoff before retrying `step`, a failed step of `node` (`of_node` its steps), or `None`
/// when it failed for good.
fn retry(node: &Node, step: &StepRecord, of_node: &[&StepRecord]) -> Option<Duration> {
    let StepState::Failed { class, exit_code, .. } = &step.state else {
        return None;
    };
    let failures = failures_alike(step, of_node);
    (failures < allowed_attempts(node, *class, *exit_code)).then(|| retry_delay(node, failures))
}

/// The failures of `step`'s visit up to it (itself included) of its kind: infrastructure, or
/// the node's own.
fn failures_alike(step: &StepRecord, of_node: &[&StepRecord]) -> u32 {
    let infra = |s: &StepRecord| matches!(s.state, StepState::Failed { class: FailureClass::Infrastructure, .. });
    let alike = of_node
        .iter()
        .filter(|s| s.visit == step.visit && s.attempt <= step.attempt && matches!(s.state, StepState::Failed { .. }) && infra(s) == infra(step))
        .count();
    u32::try_from(alike).unwrap_or(u32::MAX)
}

fn finished_seq(step: &StepRecord) -> Option<u64> {
    match &step.state {
        StepState::Succeeded { finished_seq, .. } | StepState::Failed { finished_seq, .. } => Some(*finished_seq),
        StepState::Open | StepState::Cancelled => None,
    }
}

/// The outcome of the earliest `end` step that succeeded, if any.
fn ended(graph: &Graph<'_>, steps: &Steps<'_>) -> Option<Outcome> {
    graph
        .nodes
        .iter()
        .zip(&steps.by_node)
        .filter_map(|(node, steps)| match &node.kind {
            NodeKind::End(end) => Some((end.outcome, steps)),
            _ => None,
        })
        .flat_map(|(outcome, steps)| {
            steps.iter().filter_map(move |s| match s.state {
                StepState::Succeeded { finished_seq, .. } => Some((finished_seq, outcome)),
                _ => None,
            })
        })
        .min_by_key(|(seq, _)| *seq)
        .map(|(_, outcome)| match outcome {
            EndOutcome::Completed => Outcome::Completed { reason: Some(ENDED.to_owned()) },
            EndOutcome::Failed => Outcome::Failed { reason: ENDED.to_owned() },
        })
}

/// The outcome of a run where nothing is open and nothing more can start.
fn settle(graph: &Graph<'_>, steps: &Steps<'_>) -> Outcome {
    let unhandled = graph
        .nodes
        .iter()
        .zip(&steps.by_node)
        .filter(|(node, _)| handling(node) == Handling::Unhandled)
        .flat_map(|(node, of_node)| of_node.iter().map(move |s| (node, of_node.as_slice(), *s)))
        .filter_map(|(node, of_node, step)| match &step.state {
            StepState::Failed { reason, finished_seq, class, exit_code } if retry(node, step, of_node).is_none() => {
                // Retries ran out only when this failure could be retried, as often as allowed;
                // one never retried (a hard budget stop, an exit code not listed) keeps its reason.
                let exhausted = allowed_attempts(node, *class, *exit_code) > 1;
                Some((*finished_seq, if exhausted { ATTEMPTS_EXHAUSTED } else { reason.as_str() }))
            }
            _ => None,
        })
        .min_by_key(|(seq, _)| *seq);
    match unhandled {
        Some((_, reason)) => Outcome::Failed { reason: reason.to_owned() },
        None => Outcome::Completed { reason: None },
    }
}
