//! Substates: what a running run is doing now, as one word for the API, a few for the console,
//! and a sentence that says what holds it (`why`).
//!
//! A running run has nine substates of a running run. They are derived, never
//! stored, from the run's open steps (with their approvals, wakes and child runs) and the hosts
//! of its project. [`derive`] is a pure function over those facts; [`why`] and [`whys`] load
//! them with at most three queries however many runs they are asked about, and [`explain`]
//! puts the answer in words.
//!
//! # One substate when several apply
//!
//! A run with parallel branches may have a step executing while another waits for a person.
//! The substate names the step that most needs someone's attention, in this order:
//!
//! 1. `unroutable`: no host can take a ready step; until someone starts one or changes the
//!    node's `requires`, that branch never moves.
//! 2. `awaiting_signal`: a person (an approval) or an outside event must act.
//! 3. `executing`: work is in progress on an engine or a host.
//! 4. `waiting_for_agent`: a capable host exists and will take the step when it is free.
//! 5. `awaiting_child`: another run does the work.
//! 6. `sleeping`: the run wakes by itself.
//!
//! Among steps with the same substate the earliest created wins, and for `sleeping` the one
//! that wakes first. `held`, `awaiting_lease` and `queued` describe a run with no open step:
//! held by a pause or a budget, waiting for a concurrency lock, or not (yet) started. A run
//! whose steps all finished but that the engine has not advanced yet is `queued` too, for the
//! moment it takes.
//!
//! What holds a run that has not started comes from admission (`store::admission`): its place
//! in a line (`admission_waits`), with the runs ahead of it; a run not yet looked at by the
//! engine whose project or workflow is paused is shown held, as admission will hold it.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::ids::{RunId, StepId};
use crate::state::{RunStatus, StepState};
use crate::store::approvals::{RUN_APPROVAL_NODE, START_PROMPT};

mod load;
mod why;

pub use load::{QUERIES, why, whys};
pub use why::{Why, answer, explain};

/// A host counts as available when it was seen this recently (in the last day).
pub const HOST_SEEN_WITHIN_HOURS: i64 = 24;

/// Step kinds that a host runs; other ready steps are the engine's or an integration's.
const HOST_KINDS: [&str; 1] = ["crew"];

/// What a running run is doing now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "substate", rename_all = "snake_case")]
pub enum Substate {
    /// Admitted but nothing started, or held back by admission (`held_by` says by what, and
    /// `ahead` how many runs are in line before it).
    Queued { held_by: Option<String>, ahead: Option<i64> },
    /// A step runs on an engine or a host (`holder`, in words), or is ready for the engine or an
    /// integration (`holder` is `None`).
    Executing { node: String, holder: Option<String> },
    /// A host step is ready, a capable host exists, and none has claimed it yet.
    WaitingForAgent { node: String, requires: Vec<String>, capable_hosts: usize },
    /// No host seen in the last day can run the step; `missing` are the capabilities that no
    /// such host advertises (empty when each is advertised, but by no single host).
    Unroutable { node: String, requires: Vec<String>, missing: Vec<String> },
    /// On a timer: a `wait`, a retry's backoff, a throttle.
    Sleeping { node: Option<String>, until: DateTime<Utc>, cause: SleepCause },
    /// An approval (`approval: true`, with its prompt) or an event wait (`signal` is the event).
    AwaitingSignal { node: String, approval: bool, signal: String, prompt: Option<String>, deadline: Option<DateTime<Utc>> },
    /// A `workflow` step waits for its child run.
    AwaitingChild { node: String, child: Option<RunId> },
    /// A concurrency group held by other runs; `ahead` runs are in line before it.
    AwaitingLease { group: String, ahead: i64 },
    /// A paused workflow, a budget.
    Held { by: String },
}

/// Why a run sleeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SleepCause {
    /// A `wait` node with a duration or a time.
    Wait,
    /// A retry's backoff before `attempt`, after the previous attempt failed with `after`
    /// (`exit code 1`, `lease_expired`, …).
    Retry { attempt: i32, after: String },
    /// The workflow's throttle has no room yet; `ahead` runs are in line before it.
    Throttle { ahead: i64 },
}

/// What admission holds a run back by, before it starts, with its place in line (`ahead`: runs
/// in line before it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Its workflow is paused.
    Paused { workflow: String },
    /// Its project is paused.
    ProjectPaused,
    /// A spent budget holds new runs (`scope` names it in words).
    Budget { scope: String },
    /// Its concurrency group is full.
    Lease { group: String, ahead: i64 },
    /// The org is at its cap on running runs.
    OrgCap { cap: i32, ahead: i64 },
    /// The throttle has room again at `until`.
    Throttle { until: DateTime<Utc>, ahead: i64 },
    /// A board column it moves cards into is at its WIP limit (`column` names it and the
    /// limit: `In progress (WIP limit 3)`).
    Board { column: String, ahead: i64 },
}

impl Substate {
    /// The substate's name, as the API returns it.
    pub fn name(&self) -> &'static str {
        match self {
            Substate::Queued { .. } => "queued",
            Substate::Executing { .. } => "executing",
            Substate::WaitingForAgent { .. } => "waiting_for_agent",
            Substate::Unroutable { .. } => "unroutable",
            Substate::Sleeping { .. } => "sleeping",
            Substate::AwaitingSignal { .. } => "awaiting_signal",
            Substate::AwaitingChild { .. } => "awaiting_child",
            Substate::AwaitingLease { .. } => "awaiting_lease",
            Substate::Held { .. } => "held",
        }
    }

    /// The console's words for each substate.
    pub fn words(&self) -> String {
        match self {
            Substate::Queued { .. } => "queued".into(),
            Substate::Executing { .. } => "running".into(),
            Substate::WaitingForAgent { .. } => "waiting for a host".into(),
            Substate::Unroutable { .. } => "no host can run this".into(),
            Substate::Sleeping { .. } => "asleep".into(),
            Substate::AwaitingSignal { approval: true, .. } => "waiting for approval".into(),
            Substate::AwaitingSignal { signal, .. } => format!("waiting for {signal}"),
            Substate::AwaitingChild { .. } => "waiting on another run".into(),
            Substate::AwaitingLease { .. } => "waiting for a lock".into(),
            Substate::Held { .. } => "held".into(),
        }
    }

    /// The place in the documented order (lower wins); only step substates compete.
    fn rank(&self) -> u8 {
        match self {
            Substate::Unroutable { .. } => 0,
            Substate::AwaitingSignal { .. } => 1,
            Substate::Executing { .. } => 2,
            Substate::WaitingForAgent { .. } => 3,
            Substate::AwaitingChild { .. } => 4,
            Substate::Sleeping { .. } => 5,
            Substate::AwaitingLease { .. } | Substate::Held { .. } | Substate::Queued { .. } => 6,
        }
    }
}

/// Everything the derivation reads about one run.
#[derive(Debug, Clone)]
pub struct RunFacts {
    pub run: RunId,
    pub status: RunStatus,
    pub reason: Option<String>,
    pub hold: Option<Hold>,
    /// Whether it has any step at all (succeeded ones are not in `steps`).
    pub started: bool,
    /// An `approval: required` run (not a dry run) whose `$start` approval the engine has not
    /// opened yet: it waits for a person from the moment it is made, as nothing of it can
    /// happen before that approval.
    pub awaits_start: bool,
    /// Its open steps, failed steps and `end` steps, in creation order.
    pub steps: Vec<StepFacts>,
    /// The capabilities of each host of the project that is registered and was seen in the
    /// last day.
    pub hosts: Vec<Vec<String>>,
}

/// One step, as the derivation reads it.
#[derive(Debug, Clone)]
pub struct StepFacts {
    pub step: StepId,
    pub node: String,
    pub kind: String,
    pub visit: i32,
    pub attempt: i32,
    pub state: StepState,
    pub reason: Option<String>,
    pub exit_code: Option<i32>,
    pub requires: Vec<String>,
    /// Who holds it, in words: `engine e1`, `host build-1`.
    pub holder: Option<String>,
    /// A retry's backoff: not to be claimed before this.
    pub not_before: Option<DateTime<Utc>>,
    /// Its earliest wake (a wait's end, a deadline, a timeout).
    pub wake_at: Option<DateTime<Utc>>,
    /// An approval's prompt and deadline.
    pub prompt: Option<String>,
    pub deadline: Option<DateTime<Utc>>,
    /// For a wait on an event, the event's name.
    pub event: Option<String>,
    /// For a `workflow` step, its child run.
    pub child: Option<RunId>,
    pub finished_seq: Option<i64>,
}

impl StepFacts {
    fn is_open(&self) -> bool {
        matches!(self.state, StepState::Pending | StepState::Leased | StepState::Running | StepState::Waiting)
    }
}

/// The substate of a run, or `None` when it has finished.
pub fn derive(facts: &RunFacts, now: DateTime<Utc>) -> Option<Substate> {
    if facts.status.is_terminal() {
        return None;
    }
    let from_steps =
        facts.steps.iter().filter(|s| s.is_open()).map(|s| of_step(facts, s, now)).min_by(|a, b| a.rank().cmp(&b.rank()).then_with(|| wakes_first(a, b)));
    Some(from_steps.unwrap_or_else(|| if facts.awaits_start && !facts.started { start_approval() } else { of_hold(facts.hold.as_ref()) }))
}

/// The `$start` approval of an `approval: required` run, before the engine opens its step
/// (with the prompt it will have).
pub fn start_approval() -> Substate {
    Substate::AwaitingSignal {
        node: RUN_APPROVAL_NODE.to_owned(),
        approval: true,
        signal: "approval".into(),
        prompt: Some(START_PROMPT.into()),
        deadline: None,
    }
}

/// Among sleepers, the one that wakes first; otherwise keep creation order.
fn wakes_first(a: &Substate, b: &Substate) -> std::cmp::Ordering {
    match (a, b) {
        (Substate::Sleeping { until: x, .. }, Substate::Sleeping { until: y, .. }) => x.cmp(y),
        _ => std::cmp::Ordering::Equal,
    }
}

fn of_hold(hold: Option<&Hold>) -> Substate {
    match hold {
        None => Substate::Queued { held_by: None, ahead: None },
        Some(Hold::Paused { workflow }) => Substate::Held { by: format!("workflow {workflow} is paused") },
        Some(Hold::ProjectPaused) => Substate::Held { by: "the project is paused".into() },
        Some(Hold::Budget { scope }) => Substate::Held { by: format!("{scope} is spent") },
        Some(Hold::Lease { group, ahead }) => Substate::AwaitingLease { group: group.clone(), ahead: *ahead },
        Some(Hold::OrgCap { cap, ahead }) => Substate::Queued { held_by: Some(format!("the org's cap of {cap} running runs")), ahead: Some(*ahead) },
        Some(Hold::Board { column, ahead }) => Substate::Queued { held_by: Some(format!("board column {column}, which is full")), ahead: Some(*ahead) },
        Some(Hold::Throttle { until, ahead }) => Substate::Sleeping { node: None, until: *until, cause: SleepCause::Throttle { ahead: *ahead } },
    }
}

/// What one open step makes of the run.
fn of_step(facts: &RunFacts, s: &StepFacts, now: DateTime<Utc>) -> Substate {
    let node = s.node.clone();
    match s.state {
        StepState::Leased | StepState::Running => Substate::Executing { node, holder: s.holder.clone() },
        StepState::Waiting => of_waiting(s, now),
        _ => match s.not_before.filter(|t| *t > now) {
            Some(until) => Substate::Sleeping { node: Some(node), until, cause: retry_cause(facts, s) },
            None if HOST_KINDS.contains(&s.kind.as_str()) => routing(s, &facts.hosts),
            None => Substate::Executing { node, holder: None },
        },
    }
}

fn of_waiting(s: &StepFacts, now: DateTime<Utc>) -> Substate {
    let node = s.node.clone();
    match s.kind.as_str() {
        "approval" => Substate::AwaitingSignal { node, approval: true, signal: "approval".into(), prompt: s.prompt.clone(), deadline: s.deadline },
        "workflow" => Substate::AwaitingChild { node, child: s.child },
        "wait" => match &s.event {
            Some(event) => Substate::AwaitingSignal { node, approval: false, signal: event.clone(), prompt: None, deadline: s.wake_at },
            // A timed wait always has its wake; without one (never seen) it is due now.
            None => Substate::Sleeping { node: Some(node), until: s.wake_at.unwrap_or(now), cause: SleepCause::Wait },
        },
        other => Substate::AwaitingSignal { node, approval: false, signal: other.to_owned(), prompt: None, deadline: s.wake_at },
    }
}

/// A backoff's cause: the failure of the attempt before.
fn retry_cause(facts: &RunFacts, s: &StepFacts) -> SleepCause {
    let before = facts.steps.iter().find(|p| p.node == s.node && p.visit == s.visit && p.attempt == s.attempt - 1 && p.state == StepState::Failed);
    let after = match before {
        Some(StepFacts { exit_code: Some(code), .. }) => format!("exit code {code}"),
        Some(p) => p.reason.clone().unwrap_or_else(|| "a failure".into()),
        None => "a failure".into(),
    };
    SleepCause::Retry { attempt: s.attempt, after }
}

/// A ready host step: waiting for a capable host, or unroutable.
fn routing(s: &StepFacts, hosts: &[Vec<String>]) -> Substate {
    let capable = hosts.iter().filter(|caps| s.requires.iter().all(|r| caps.contains(r))).count();
    if capable > 0 {
        return Substate::WaitingForAgent { node: s.node.clone(), requires: s.requires.clone(), capable_hosts: capable };
    }
    let missing = s.requires.iter().filter(|r| !hosts.iter().any(|caps| caps.contains(r))).cloned().collect();
    Substate::Unroutable { node: s.node.clone(), requires: s.requires.clone(), missing }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::load::holder_words;
    use super::*;
    use crate::ids::HostId;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, 2, 13, 0, 0).unwrap()
    }

    fn step(node: &str, kind: &str, state: StepState) -> StepFacts {
        StepFacts {
            step: StepId::mint(),
            node: node.into(),
            kind: kind.into(),
            visit: 1,
            attempt: 1,
            state,
            reason: None,
            exit_code: None,
            requires: vec![],
            holder: None,
            not_before: None,
            wake_at: None,
            prompt: None,
            deadline: None,
            event: None,
            child: None,
            finished_seq: None,
        }
    }

    fn facts(steps: Vec<StepFacts>) -> RunFacts {
        RunFacts {
            run: RunId::mint(),
            status: RunStatus::Running,
            reason: None,
            hold: None,
            started: !steps.is_empty(),
            awaits_start: false,
            steps,
            hosts: vec![],
        }
    }

    fn caps(c: &[&str]) -> Vec<String> {
        c.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_run_with_nothing_open_is_queued_or_held_by_what_admission_says() {
        let mut f = facts(vec![]);
        assert_eq!(answer(&f, now()).text, "Queued: nothing has started yet");
        f.started = true;
        assert_eq!(answer(&f, now()).text, "Queued: the engine has yet to take the next step");
        f.started = false;
        f.hold = Some(Hold::Paused { workflow: "wf".into() });
        let why = answer(&f, now());
        assert_eq!((why.substate.as_ref().map(Substate::name), why.text.as_str()), (Some("held"), "Held: workflow wf is paused"));
        f.hold = Some(Hold::ProjectPaused);
        assert_eq!(answer(&f, now()).text, "Held: the project is paused");
        f.hold = Some(Hold::Budget { scope: "the project's daily budget of $10.00 (hard)".into() });
        assert_eq!(answer(&f, now()).text, "Held: the project's daily budget of $10.00 (hard) is spent");
        f.hold = Some(Hold::Lease { group: "item".into(), ahead: 2 });
        let why = answer(&f, now());
        assert_eq!((why.words.as_str(), why.text.as_str()), ("waiting for a lock", "Waiting for the lock of concurrency group item (2 ahead in line)"));
        f.hold = Some(Hold::OrgCap { cap: 50, ahead: 0 });
        assert_eq!(answer(&f, now()).text, "Queued: held by the org's cap of 50 running runs (next in line)");
        f.hold = Some(Hold::Throttle { until: now() + chrono::Duration::seconds(65), ahead: 0 });
        assert_eq!(answer(&f, now()).text, "Asleep until 13:01:05 UTC (held by the workflow's throttle)");
        f.hold = Some(Hold::Throttle { until: now() + chrono::Duration::seconds(65), ahead: 3 });
        assert_eq!(answer(&f, now()).text, "Asleep until 13:01:05 UTC (held by the workflow's throttle, 3 ahead in line)");
    }

    #[test]
    fn a_held_step_is_executing_with_its_holder() {
        let mut s = step("build", "crew", StepState::Running);
        s.holder = holder_words(Some("engine:e1"), None);
        let why = answer(&facts(vec![s]), now());
        assert_eq!(why.substate.as_ref().map(Substate::name), Some("executing"));
        assert_eq!((why.words.as_str(), why.text.as_str()), ("running", "Running build on engine e1"));
        let id = HostId::mint().to_string();
        assert_eq!(holder_words(Some(&format!("host:{id}")), Some("build-1")).as_deref(), Some("host build-1"));
    }

    #[test]
    fn a_ready_host_step_waits_for_a_capable_host_or_is_unroutable() {
        let mut s = step("build", "crew", StepState::Pending);
        s.requires = caps(&["linux", "gpu"]);
        let mut f = facts(vec![s]);
        f.hosts = vec![caps(&["linux"]), caps(&["linux", "arm64"])];
        let why = answer(&f, now());
        assert_eq!(why.substate, Some(Substate::Unroutable { node: "build".into(), requires: caps(&["linux", "gpu"]), missing: caps(&["gpu"]) }));
        assert_eq!(why.text, "Waiting for a host with linux, gpu: none online has gpu");
        assert_eq!(why.words, "no host can run this");

        f.hosts = vec![caps(&["linux"]), caps(&["gpu"])];
        assert_eq!(answer(&f, now()).text, "Waiting for a host with linux, gpu: no host seen in the last day has all of them");
        f.hosts = vec![];
        assert_eq!(answer(&f, now()).text, "Waiting for a host with linux, gpu to run build: no host of this project was seen in the last day");

        f.hosts = vec![caps(&["linux", "gpu", "harness:codex"])];
        let why = answer(&f, now());
        assert_eq!(why.substate.as_ref().map(Substate::name), Some("waiting_for_agent"));
        assert_eq!(why.text, "Waiting for a host with linux, gpu to pick up build (1 host online can run it)");
    }

    #[test]
    fn a_retry_backoff_sleeps_until_not_before_and_says_after_what() {
        let mut failed = step("build", "crew", StepState::Failed);
        failed.exit_code = Some(1);
        failed.reason = Some("exit_code:1".into());
        failed.attempt = 2;
        let mut next = step("build", "crew", StepState::Pending);
        next.attempt = 3;
        next.not_before = Some(now() + chrono::Duration::seconds(65));
        let why = answer(&facts(vec![failed, next.clone()]), now());
        assert_eq!(why.words, "asleep");
        assert_eq!(why.text, "Asleep until 13:01:05 UTC (retry 2 of build after exit code 1)");
        // Once the backoff has passed, it is a ready host step again.
        next.not_before = Some(now() - chrono::Duration::seconds(1));
        assert_eq!(answer(&facts(vec![next]), now()).substate.as_ref().map(Substate::name), Some("unroutable"));
    }

    #[test]
    fn waits_sleep_or_await_their_event_and_approvals_show_prompt_and_deadline() {
        let mut nap = step("nap", "wait", StepState::Waiting);
        nap.wake_at = Some(now() + chrono::Duration::days(1));
        assert_eq!(answer(&facts(vec![nap]), now()).text, "Asleep until 2026-03-03 13:00:00 UTC (wait at nap)");

        let mut merged = step("merged", "wait", StepState::Waiting);
        merged.event = Some("pull_request.closed".into());
        let why = answer(&facts(vec![merged]), now());
        assert_eq!((why.words.as_str(), why.text.as_str()), ("waiting for pull_request.closed", "Waiting for pull_request.closed at merged"));

        let mut ask = step("review_plan", "approval", StepState::Waiting);
        ask.prompt = Some("Go ahead with this plan?\nDetails follow.".into());
        ask.deadline = Some(Utc.with_ymd_and_hms(2026, 3, 3, 9, 0, 0).unwrap());
        let why = answer(&facts(vec![ask]), now());
        assert_eq!(why.words, "waiting for approval");
        assert_eq!(why.text, "Waiting for approval at review_plan: Go ahead with this plan? (deadline 2026-03-03 09:00:00 UTC)");

        let mut start = step(RUN_APPROVAL_NODE, "approval", StepState::Waiting);
        start.prompt = Some("Start this run?".into());
        assert_eq!(answer(&facts(vec![start]), now()).text, "Waiting for approval to start: Start this run?");
    }

    #[test]
    fn an_approval_required_run_waits_for_its_start_approval_before_the_engine_opens_it() {
        let mut f = facts(vec![]);
        f.awaits_start = true;
        let why = answer(&f, now());
        assert_eq!(why.substate.as_ref().map(Substate::name), Some("awaiting_signal"));
        assert_eq!(why.words, "waiting for approval");
        assert_eq!(why.text, "Waiting for approval to start: Start this run?");
        // A paused project holds it only after the approval.
        f.hold = Some(Hold::ProjectPaused);
        assert_eq!(answer(&f, now()).words, "waiting for approval");
    }

    #[test]
    fn a_child_run_is_awaited_by_name() {
        let mut child = step("release", "workflow", StepState::Waiting);
        let id = RunId::mint();
        child.child = Some(id);
        let why = answer(&facts(vec![child]), now());
        assert_eq!(why.words, "waiting on another run");
        assert_eq!(why.text, format!("Waiting on run {id} started by release"));
    }

    #[test]
    fn the_step_needing_attention_first_names_the_substate() {
        let mut sleeping_late = step("late", "wait", StepState::Waiting);
        sleeping_late.wake_at = Some(now() + chrono::Duration::hours(2));
        let mut sleeping_soon = step("soon", "wait", StepState::Waiting);
        sleeping_soon.wake_at = Some(now() + chrono::Duration::hours(1));
        let child = step("child", "workflow", StepState::Waiting);
        let mut ready = step("build", "crew", StepState::Pending);
        let running = step("test", "crew", StepState::Running);
        let approval = step("ask", "approval", StepState::Waiting);
        let mut stuck = step("gpu", "crew", StepState::Pending);
        stuck.requires = caps(&["gpu"]);
        ready.requires = caps(&["linux"]);

        let order = [stuck, approval, running, ready, child, sleeping_late, sleeping_soon];
        let expected = ["unroutable", "awaiting_signal", "executing", "waiting_for_agent", "awaiting_child", "sleeping"];
        for (i, name) in expected.iter().enumerate() {
            let mut f = facts(order[i..].to_vec());
            f.hosts = vec![caps(&["linux"])];
            let why = answer(&f, now());
            assert_eq!(why.substate.as_ref().map(Substate::name), Some(*name), "{}", why.text);
        }
        let f = facts(order[5..].to_vec());
        let why = answer(&f, now());
        assert_eq!(why.text, "Asleep until 14:00:00 UTC (wait at soon) (and 1 more open step)");
    }

    #[test]
    fn a_finished_run_says_how_and_where_it_ended() {
        let mut f = facts(vec![]);
        f.status = RunStatus::Completed;
        assert_eq!(answer(&f, now()).text, "Finished: completed");
        assert_eq!(answer(&f, now()).substate, None);

        let mut gate = step("ci", "gate", StepState::Failed);
        gate.reason = Some("gate_failed".into());
        gate.finished_seq = Some(9);
        let mut f = facts(vec![gate]);
        f.status = RunStatus::Failed;
        f.reason = Some("gate_failed".into());
        assert_eq!(answer(&f, now()).text, "Finished: failed at ci: gate_failed");
        f.reason = Some("stopped_line:left".into());
        assert_eq!(answer(&f, now()).text, "Finished: failed at left: stopped_line:left");
        f.reason = Some("attempts_exhausted".into());
        f.steps[0].attempt = 3;
        assert_eq!(answer(&f, now()).text, "Finished: failed at ci: attempts_exhausted");

        let mut f = facts(vec![]);
        f.status = RunStatus::Cancelled;
        f.reason = Some("parent run-x is no longer running".into());
        assert_eq!(answer(&f, now()).text, "Finished: cancelled: parent run-x is no longer running");
    }

    #[test]
    fn the_substate_serializes_with_its_name_as_tag() {
        let s = Substate::Unroutable { node: "b".into(), requires: caps(&["gpu"]), missing: caps(&["gpu"]) };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v, serde_json::json!({ "substate": "unroutable", "node": "b", "requires": ["gpu"], "missing": ["gpu"] }));
    }
}
