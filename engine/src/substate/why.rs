//! `why` in words: what holds a running run, in one sentence (with the runs ahead of it in
//! line, a deadline, the host it waits for), and how a finished run ended.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::ids::RunId;
use crate::state::{RunStatus, StepState};
use crate::store::approvals::RUN_APPROVAL_NODE;

use super::*;

/// A run's state and substate, with the sentence that says what holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Why {
    pub run: RunId,
    pub status: String,
    pub reason: Option<String>,
    /// `None` once the run has finished.
    pub substate: Option<Substate>,
    /// The console's words: the substate's, or the status once finished.
    pub words: String,
    /// What holds the run, in a sentence.
    pub text: String,
}

/// Builds the answer for one run.
pub fn answer(facts: &RunFacts, now: DateTime<Utc>) -> Why {
    let substate = derive(facts, now);
    let words = substate.as_ref().map_or_else(|| facts.status.name().to_owned(), Substate::words);
    let text = match &substate {
        Some(s) => explain(facts, s, now),
        None => finished(facts),
    };
    Why { run: facts.run, status: facts.status.name().to_owned(), reason: facts.reason.clone(), substate, words, text }
}

/// The sentence for a running run's substate.
pub fn explain(facts: &RunFacts, substate: &Substate, now: DateTime<Utc>) -> String {
    let more = more_open(facts, substate);
    let text = match substate {
        Substate::Queued { held_by: Some(by), ahead } => format!("Queued: held by {by}{}", in_line(*ahead)),
        Substate::Queued { held_by: None, .. } if !facts.started => "Queued: nothing has started yet".into(),
        Substate::Queued { held_by: None, .. } => "Queued: the engine has yet to take the next step".into(),
        Substate::Executing { node, holder: Some(h) } => format!("Running {node} on {h}"),
        Substate::Executing { node, holder: None } => format!("Running {node}: ready, not picked up yet"),
        Substate::WaitingForAgent { node, requires, capable_hosts } => {
            let n = if *capable_hosts == 1 { "1 host".to_owned() } else { format!("{capable_hosts} hosts") };
            format!("Waiting for a host{} to pick up {node} ({n} online can run it)", with(requires))
        }
        Substate::Unroutable { node, requires, missing } => unroutable(node, requires, missing, facts.hosts.is_empty()),
        Substate::Sleeping { node, until, cause } => asleep(node.as_deref(), *until, cause, now),
        Substate::AwaitingSignal { node, approval: true, prompt, deadline, .. } => {
            let place = if node == RUN_APPROVAL_NODE { "to start".to_owned() } else { format!("at {node}") };
            let prompt = prompt.as_deref().map(|p| format!(": {}", first_line(p))).unwrap_or_default();
            format!("Waiting for approval {place}{prompt}{}", deadline_words(*deadline, now))
        }
        Substate::AwaitingSignal { node, signal, deadline, .. } => {
            format!("Waiting for {signal} at {node}{}", deadline_words(*deadline, now))
        }
        Substate::AwaitingChild { node, child: Some(c) } => format!("Waiting on run {c} started by {node}"),
        Substate::AwaitingChild { node, child: None } => format!("Waiting on the child run of {node}"),
        Substate::AwaitingLease { group, ahead } => format!("Waiting for the lock of {}{}", crate::reasons::group_words(group), in_line(Some(*ahead))),
        Substate::Held { by } => format!("Held: {by}"),
    };
    match more {
        0 => text,
        1 => format!("{text} (and 1 more open step)"),
        n => format!("{text} (and {n} more open steps)"),
    }
}

/// Open steps besides the one the substate names.
pub(crate) fn more_open(facts: &RunFacts, substate: &Substate) -> usize {
    let open = facts.steps.iter().filter(|s| s.is_open()).count();
    let named = match substate {
        Substate::Queued { .. } | Substate::AwaitingLease { .. } | Substate::Held { .. } => 0,
        Substate::Sleeping { node: None, .. } => 0,
        _ => 1,
    };
    open.saturating_sub(named)
}

/// A place in line, in words: ` (next in line)`, ` (3 ahead in line)`.
pub(crate) fn in_line(ahead: Option<i64>) -> String {
    match ahead {
        None => String::new(),
        Some(0) => " (next in line)".into(),
        Some(n) => format!(" ({n} ahead in line)"),
    }
}

pub(crate) fn with(requires: &[String]) -> String {
    if requires.is_empty() { String::new() } else { format!(" with {}", requires.join(", ")) }
}

pub(crate) fn unroutable(node: &str, requires: &[String], missing: &[String], no_hosts: bool) -> String {
    if no_hosts {
        return format!("Waiting for a host{} to run {node}: no host of this project was seen in the last day", with(requires));
    }
    if missing.is_empty() {
        return format!("Waiting for a host{}: no host seen in the last day has all of them", with(requires));
    }
    format!("Waiting for a host{}: none online has {}", with(requires), missing.join(", "))
}

pub(crate) fn asleep(node: Option<&str>, until: DateTime<Utc>, cause: &SleepCause, now: DateTime<Utc>) -> String {
    let node = node.unwrap_or("the run");
    let what = match cause {
        SleepCause::Wait => format!("wait at {node}"),
        SleepCause::Retry { attempt, after } => format!("retry {} of {node} after {after}", attempt - 1),
        SleepCause::Throttle { ahead: 0 } => "held by the workflow's throttle".into(),
        SleepCause::Throttle { ahead } => format!("held by the workflow's throttle, {ahead} ahead in line"),
    };
    format!("Asleep until {} ({what})", clock(until, now))
}

pub(crate) fn deadline_words(deadline: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    deadline.map(|d| format!(" (deadline {})", clock(d, now))).unwrap_or_default()
}

/// A time in UTC: the time of day when it falls today, the date too otherwise.
pub(crate) fn clock(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    if t.date_naive() == now.date_naive() { t.format("%H:%M:%S UTC").to_string() } else { t.format("%Y-%m-%d %H:%M:%S UTC").to_string() }
}

/// Prompts may span lines; a sentence shows the first.
pub(crate) fn first_line(s: &str) -> &str {
    s.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("")
}

/// The sentence for a finished run: how it ended and, for a failure, where.
pub(crate) fn finished(facts: &RunFacts) -> String {
    let status = facts.status.name();
    let reason = facts.reason.as_deref();
    let at = match (facts.status, reason) {
        (RunStatus::Failed, Some(r)) => failed_node(facts, r),
        _ => None,
    };
    match (at, reason) {
        (Some(node), Some(r)) => format!("Finished: {status} at {node}: {r}"),
        (None, Some(r)) => format!("Finished: {status}: {r}"),
        (_, None) => format!("Finished: {status}"),
    }
}

/// Where a failed run failed: the node its reason names, the end node that ended it, or the
/// earliest step that failed with its reason (for `attempts_exhausted`, the last attempt).
pub(crate) fn failed_node(facts: &RunFacts, reason: &str) -> Option<String> {
    if let Some(node) = reason.strip_prefix(crate::walk::STOPPED_LINE_PREFIX) {
        return Some(node.to_owned());
    }
    let finished_first = |a: &&StepFacts, b: &&StepFacts| a.finished_seq.cmp(&b.finished_seq);
    if reason == crate::walk::ENDED {
        return facts.steps.iter().filter(|s| s.kind == "end" && s.state == StepState::Succeeded).min_by(finished_first).map(|s| s.node.clone());
    }
    let failed = || facts.steps.iter().filter(|s| s.state == StepState::Failed);
    let exact = failed().filter(|s| s.reason.as_deref() == Some(reason)).min_by(finished_first);
    let retried = || failed().filter(|s| s.attempt > 1).min_by(finished_first);
    let any = || failed().min_by(finished_first);
    exact.or_else(retried).or_else(any).map(|s| s.node.clone())
}
