//! Tests of the graph walk: one unit test per rule on small hand-built graphs (the shape of
//! the issue-to-pull-request example), then property tests that drive random graphs through random step
//! outcomes and check every rule against an oracle written from the other side: from what
//! each finished step releases, rather than from what each node waits for.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::definition::{Approval, Budget, Caps, Case, Crew, Decision, End, EndOutcome, Gate, Harness, Output, OutputKind, Retry, Triggers};

// ---------------------------------------------------------------------------------------------
// Building definitions by hand.

fn def(stop_the_line_attempts: u32, nodes: Vec<Node>) -> Definition {
    Definition {
        name: "test".into(),
        on: Triggers::default(),
        concurrency: None,
        throttle: None,
        budget: Budget::default(),
        approval_required: false,
        stop_the_line_attempts,
        nodes,
    }
}

fn node(id: &str, after: &[&str], kind: NodeKind) -> Node {
    Node {
        id: id.into(),
        after: after.iter().map(|s| (*s).to_owned()).collect(),
        kind,
        requires: Vec::new(),
        retry: None,
        timeout: None,
        continue_on_error: false,
        failure: None,
    }
}

fn crew(id: &str, after: &[&str]) -> Node {
    node(
        id,
        after,
        NodeKind::Crew(Crew {
            harness: Harness::ClaudeCode,
            model: None,
            prompt: format!("do {id}"),
            command: Vec::new(),
            caps: Caps::default(),
            expect_changes: None,
            policy: protocol::Policy::default(),
        }),
    )
}

fn approval(id: &str, after: &[&str]) -> Node {
    node(id, after, NodeKind::Approval(Approval { prompt: "ok?".into(), fields: BTreeMap::new(), timeout: None }))
}

fn output(id: &str, after: &[&str]) -> Node {
    node(
        id,
        after,
        NodeKind::Output(Output { kind: OutputKind::PullRequest, draft: false, body: None, labels: Vec::new(), remove_labels: Vec::new(), column: None }),
    )
}

fn gate(id: &str, after: &[&str], on_fail: Option<&str>) -> Node {
    node(id, after, NodeKind::Gate(Gate { checks: vec!["test".into()], timeout: None, on_fail: on_fail.map(str::to_owned) }))
}

fn decision(id: &str, after: &[&str], cases: &[&str], default: Option<&str>) -> Node {
    node(
        id,
        after,
        NodeKind::Decision(Decision {
            cases: cases.iter().map(|to| Case { condition: "true".into(), to: (*to).to_owned() }).collect(),
            default: default.map(str::to_owned),
        }),
    )
}

fn end(id: &str, after: &[&str], outcome: EndOutcome) -> Node {
    node(id, after, NodeKind::End(End { outcome }))
}

fn with_retry(mut n: Node, attempts: u32, backoff: u64, max_backoff: u64, exit_codes: &[i32]) -> Node {
    n.retry = Some(Retry { attempts, backoff: Duration::from_secs(backoff), max_backoff: Duration::from_secs(max_backoff), exit_codes: exit_codes.to_vec() });
    n
}

fn with_failure(mut n: Node, handler: &str) -> Node {
    n.failure = Some(handler.into());
    n
}

fn continuing(mut n: Node) -> Node {
    n.continue_on_error = true;
    n
}

/// The issue-to-pull-request example: `plan` → `review_plan` → `build` (retry on exit 1) → `ci` (gate,
/// `on_fail: build`) → `route` (decision) → `big_change_review` | `open_pr`, where `open_pr`
/// joins both.
fn example() -> Definition {
    def(
        3,
        vec![
            crew("plan", &[]),
            approval("review_plan", &["plan"]),
            with_retry(crew("build", &["review_plan"]), 3, 30, 600, &[1]),
            gate("ci", &["build"], Some("build")),
            decision("route", &["ci"], &["big_change_review"], Some("open_pr")),
            approval("big_change_review", &["route"]),
            output("open_pr", &["route", "big_change_review"]),
        ],
    )
}

// ---------------------------------------------------------------------------------------------
// Driving a run by hand: the engine's part, with a sequence number per event.

struct Sim {
    def: Definition,
    history: Vec<StepRecord>,
    seq: u64,
}

impl Sim {
    fn new(def: Definition) -> Self {
        Sim { def, history: Vec::new(), seq: 0 }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Walks, creates the steps the walk asks for, and returns the walk.
    fn tick(&mut self) -> Walk {
        let w = walk(&self.def, &self.history);
        for s in &w.start {
            let started_seq = self.next_seq();
            self.history.push(StepRecord { node: s.node.clone(), visit: s.visit, attempt: s.attempt, started_seq, state: StepState::Open });
        }
        w
    }

    /// Ticks and returns the nodes started, as `node` or `node#visit.attempt` past the first.
    fn started(&mut self) -> Vec<String> {
        let w = self.tick();
        assert_eq!(w.finished, None, "the run finished early: {w:?}");
        w.start.iter().map(|s| if (s.visit, s.attempt) == (1, 1) { s.node.clone() } else { format!("{}#{}.{}", s.node, s.visit, s.attempt) }).collect()
    }

    fn open_index(&self, node: &str) -> usize {
        let open: Vec<usize> = (0..self.history.len()).filter(|&i| self.history[i].node == node && self.history[i].state == StepState::Open).collect();
        assert_eq!(open.len(), 1, "{node} should have exactly one open step: {:?}", self.history);
        open[0]
    }

    fn succeed(&mut self, node: &str) {
        self.route(node, None);
    }

    fn route(&mut self, node: &str, to: Option<&str>) {
        let i = self.open_index(node);
        let finished_seq = self.next_seq();
        self.history[i].state = StepState::Succeeded { route: to.map(str::to_owned), finished_seq };
    }

    fn fail(&mut self, node: &str, reason: &str, class: FailureClass, exit_code: Option<i32>) {
        let i = self.open_index(node);
        let finished_seq = self.next_seq();
        self.history[i].state = StepState::Failed { reason: reason.into(), class, exit_code, finished_seq };
    }

    fn cancel(&mut self, node: &str) {
        let i = self.open_index(node);
        self.history[i].state = StepState::Cancelled;
    }

    /// Ticks and expects the run to be over.
    fn finish(&mut self) -> Outcome {
        let w = self.tick();
        assert!(w.start.is_empty(), "{w:?}");
        w.finished.unwrap_or_else(|| panic!("the run should be finished: {:?}", self.history))
    }

    /// A run of `def` whose first walk starts `roots`.
    fn start(def: Definition, roots: &[&str]) -> Self {
        let mut sim = Sim::new(def);
        assert_eq!(sim.started(), roots);
        sim
    }

    /// Succeeds each `(node, then)` in turn, checking that the walk then starts `then`.
    fn succeed_each(&mut self, script: &[(&str, &[&str])]) {
        for &(node, then) in script {
            self.succeed(node);
            assert_eq!(self.started(), then, "after {node} succeeded");
        }
    }

    /// Succeeds `node`, the last step open, and expects the run to complete.
    fn complete(&mut self, node: &str) {
        self.succeed(node);
        assert_eq!(self.finish(), completed());
    }
}

fn completed() -> Outcome {
    Outcome::Completed { reason: None }
}

fn failed(reason: &str) -> Outcome {
    Outcome::Failed { reason: reason.into() }
}

/// Runs the example along its main line, each node succeeding, until `open` is open.
fn example_up_to(open: &str) -> Sim {
    let line = ["plan", "review_plan", "build", "ci", "route"];
    let mut sim = Sim::start(example(), &["plan"]);
    for pair in line.windows(2).take_while(|pair| pair[0] != open) {
        sim.succeed_each(&[(pair[0], &[pair[1]])]);
    }
    sim
}

/// The start of `node`'s `attempt` on its first visit, after `delay`.
fn retry(node: &str, attempt: u32, delay: Duration) -> Start {
    Start { node: node.into(), visit: 1, attempt, delay }
}

/// `a`, then `b` and `c` after it (`c` as given), then `rest`: walked until `b` and `c` are
/// open.
fn branched(c: Node, rest: Vec<Node>) -> Sim {
    let mut nodes = vec![crew("a", &[]), crew("b", &["a"]), c];
    nodes.extend(rest);
    let mut sim = Sim::start(def(3, nodes), &["a"]);
    sim.succeed_each(&[("a", &["b", "c"])]);
    sim
}

/// [`branched`] into the join `j` after `b` and `c`.
fn diamond() -> Sim {
    branched(crew("c", &["a"]), vec![crew("j", &["b", "c"])])
}

// ---------------------------------------------------------------------------------------------
// Unit tests, one rule each.

#[test]
fn roots_start_when_the_history_is_empty_and_never_again() {
    let mut sim = Sim::start(def(3, vec![node("t", &[], NodeKind::Trigger), crew("a", &[]), crew("b", &["t", "a"])]), &["t", "a"]);
    sim.succeed("t");
    assert_eq!(sim.started(), Vec::<String>::new(), "b waits for its open sibling a");
    sim.succeed_each(&[("a", &["b"])]);
    sim.complete("b");
}

#[test]
fn a_node_only_looped_back_to_is_still_a_root() {
    let d = def(3, vec![crew("build", &[]), gate("ci", &["build"], Some("build"))]);
    assert_eq!(Sim::new(d).started(), ["build"]);
    let d = def(3, vec![crew("x", &[]), decision("d", &["x"], &["x"], Some("z")), crew("z", &[])]);
    assert_eq!(Sim::new(d).started(), ["x"], "d routes back to x; z is only d's forward target");
}

#[test]
fn handlers_and_route_targets_are_not_roots() {
    let d = def(3, vec![with_failure(crew("a", &[]), "h"), crew("h", &[]), decision("d", &[], &["t"], None), crew("t", &[])]);
    assert_eq!(Sim::new(d).started(), ["a", "d"]);
}

#[test]
fn an_empty_definition_completes_at_once() {
    assert_eq!(walk(&def(3, vec![]), &[]), Walk { start: vec![], finished: Some(completed()) });
}

#[test]
fn the_example_runs_straight_through_on_the_default_route() {
    let mut sim = example_up_to("route");
    sim.route("route", Some("open_pr"));
    assert_eq!(sim.started(), ["open_pr"], "the join does not wait for the branch not taken");
    sim.complete("open_pr");
}

#[test]
fn a_decision_allows_exactly_its_chosen_target() {
    let mut sim = example_up_to("route");
    sim.route("route", Some("big_change_review"));
    assert_eq!(sim.started(), ["big_change_review"], "open_pr lists route in `after` but was not chosen");
    sim.succeed_each(&[("big_change_review", &["open_pr"])]);
    sim.complete("open_pr");
}

#[test]
fn a_failed_gate_loops_back_and_reruns_what_follows_as_new_visits() {
    let mut sim = example_up_to("ci");
    sim.fail("ci", "gate_failed", FailureClass::Ordinary, None);
    assert_eq!(sim.started(), ["build#2.1"]);
    sim.succeed_each(&[("build", &["ci#2.1"]), ("ci", &["route"])]);
    sim.route("route", Some("open_pr"));
    assert_eq!(sim.started(), ["open_pr"]);
    sim.succeed("open_pr");
    assert_eq!(sim.finish(), completed(), "a failure the gate handled does not fail the run");
}

#[test]
fn a_node_past_stop_the_line_attempts_stops_the_line() {
    let mut sim = example_up_to("ci");
    for visit in 2..=3 {
        sim.fail("ci", "gate_failed", FailureClass::Ordinary, None);
        assert_eq!(sim.started(), [format!("build#{visit}.1")]);
        sim.succeed("build");
        assert_eq!(sim.started(), [format!("ci#{visit}.1")]);
    }
    sim.fail("ci", "gate_failed", FailureClass::Ordinary, None);
    assert_eq!(sim.finish(), failed("stopped_line:build"));
}

#[test]
fn stop_the_line_finishes_at_once_even_with_steps_open() {
    let mut sim = Sim::start(def(1, vec![crew("a", &[]), crew("slow", &[]), gate("g", &["a"], Some("a"))]), &["a", "slow"]);
    sim.succeed_each(&[("a", &["g"])]);
    sim.fail("g", "gate_failed", FailureClass::Ordinary, None);
    assert_eq!(sim.finish(), failed("stopped_line:a"));
}

#[test]
fn an_ordinary_failure_retries_as_the_node_allows_with_doubling_backoff() {
    let mut sim = example_up_to("build");
    for (attempt, secs) in [(2, 30), (3, 60)] {
        sim.fail("build", "exit_code:1", FailureClass::Ordinary, Some(1));
        let w = sim.tick();
        assert_eq!(w.start, [retry("build", attempt, Duration::from_secs(secs))]);
    }
    sim.fail("build", "exit_code:1", FailureClass::Ordinary, Some(1));
    assert_eq!(sim.finish(), failed("attempts_exhausted"), "build has no handler; three attempts in all");
}

#[test]
fn the_exit_code_filter_limits_ordinary_retries() {
    let mut sim = example_up_to("build");
    sim.fail("build", "exit_code:2", FailureClass::Ordinary, Some(2));
    assert_eq!(sim.finish(), failed("exit_code:2"), "exit code 2 is not in exit_codes: [1]");

    let mut sim = example_up_to("build");
    sim.fail("build", "timeout", FailureClass::Ordinary, None);
    assert_eq!(sim.finish(), failed("timeout"), "no exit code matches no filter");
}

#[test]
fn backoff_is_capped_at_max_backoff() {
    let mut sim = Sim::start(def(3, vec![with_retry(crew("a", &[]), 6, 10, 25, &[])]), &["a"]);
    let mut delays = Vec::new();
    for _ in 1..6 {
        sim.fail("a", "exit_code:7", FailureClass::Ordinary, Some(7));
        let w = sim.tick();
        delays.push(w.start[0].delay.as_secs());
    }
    assert_eq!(delays, [10, 20, 25, 25, 25]);
    sim.fail("a", "exit_code:7", FailureClass::Ordinary, Some(7));
    assert_eq!(sim.finish(), failed("attempts_exhausted"));
}

#[test]
fn a_huge_attempt_number_saturates_the_backoff_instead_of_overflowing() {
    let n = with_retry(crew("a", &[]), 100, 1, 3600, &[]);
    assert_eq!(retry_delay(&n, 40), Duration::from_secs(3600));
    assert_eq!(retry_delay(&n, u32::MAX), Duration::from_secs(3600));
    assert_eq!(retry_delay(&crew("b", &[]), 2), Duration::ZERO);
}

#[test]
fn infrastructure_failures_retry_by_themselves_three_times_at_once() {
    let mut sim = Sim::start(def(3, vec![crew("a", &[])]), &["a"]);
    for attempt in 2..=3 {
        sim.fail("a", "lease_expired", FailureClass::Infrastructure, None);
        let w = sim.tick();
        assert_eq!(w.start, [retry("a", attempt, Duration::ZERO)]);
    }
    sim.fail("a", "host_lost", FailureClass::Infrastructure, None);
    assert_eq!(sim.finish(), failed("attempts_exhausted"));
}

#[test]
fn infrastructure_failures_and_the_nodes_own_are_counted_apart() {
    let mut sim = Sim::start(def(3, vec![with_retry(crew("a", &[]), 3, 1, 60, &[])]), &["a"]);
    // A lost lease uses none of the node's three attempts, which it then has in full, each
    // backoff counting failures of its own kind.
    let script = [
        (FailureClass::Infrastructure, 1),
        (FailureClass::Ordinary, 1),
        (FailureClass::Ordinary, 2),
        // A lease lost on the last of them is still recovered.
        (FailureClass::Infrastructure, 2),
    ];
    for (attempt, (class, delay)) in (2..).zip(script) {
        sim.fail(
            "a",
            if class == FailureClass::Ordinary { "exit_code:1" } else { "lease_expired" },
            class,
            Some(1).filter(|_| class == FailureClass::Ordinary),
        );
        assert_eq!(sim.tick().start, [retry("a", attempt, Duration::from_secs(delay))], "attempt {attempt}");
    }
    sim.fail("a", "exit_code:1", FailureClass::Ordinary, Some(1));
    assert_eq!(sim.finish(), failed("attempts_exhausted"));
}

#[test]
fn a_final_failure_after_retries_keeps_its_own_reason() {
    let d = def(3, vec![with_retry(crew("a", &[]), 3, 1, 60, &[1])]);
    // A final failure, and an exit code the filter does not retry, are no exhaustion either.
    for (reason, class, exit_code) in [("budget_hard_stop", FailureClass::Final, None), ("exit_code:2", FailureClass::Ordinary, Some(2))] {
        let mut sim = Sim::start(d.clone(), &["a"]);
        sim.fail("a", "exit_code:1", FailureClass::Ordinary, Some(1));
        sim.tick();
        sim.fail("a", reason, class, exit_code);
        assert_eq!(sim.finish(), failed(reason));
    }
}

#[test]
fn infrastructure_failures_use_a_larger_retry_config() {
    let n = with_retry(crew("a", &[]), 5, 1, 10, &[1]);
    assert_eq!(allowed_attempts(&n, FailureClass::Infrastructure, None), 5);
    let n = with_retry(crew("a", &[]), 2, 1, 10, &[1]);
    assert_eq!(allowed_attempts(&n, FailureClass::Infrastructure, None), 3);
    assert_eq!(allowed_attempts(&n, FailureClass::Ordinary, Some(1)), 2);
    assert_eq!(allowed_attempts(&n, FailureClass::Ordinary, Some(3)), 1);
}

#[test]
fn a_final_failure_is_never_retried() {
    let mut sim = Sim::start(def(3, vec![with_retry(crew("a", &[]), 5, 1, 10, &[])]), &["a"]);
    sim.fail("a", "budget_hard_stop", FailureClass::Final, None);
    assert_eq!(sim.finish(), failed("budget_hard_stop"));
}

#[test]
fn a_failure_handler_starts_at_once_and_handles_the_failure() {
    let d =
        def(3, vec![crew("start", &[]), with_failure(crew("a", &["start"]), "cleanup"), crew("b", &["start"]), crew("after_a", &["a"]), crew("cleanup", &[])]);
    let mut sim = Sim::start(d, &["start"]);
    sim.succeed_each(&[("start", &["a", "b"])]);
    sim.fail("a", "boom", FailureClass::Final, None);
    assert_eq!(sim.started(), ["cleanup"], "the handler does not wait for b; after_a does not start");
    sim.succeed_each(&[("b", &[])]);
    sim.complete("cleanup");
}

#[test]
fn continue_on_error_goes_on_as_if_the_step_had_succeeded() {
    let mut sim = Sim::start(def(3, vec![continuing(crew("a", &[])), crew("b", &["a"])]), &["a"]);
    sim.fail("a", "boom", FailureClass::Ordinary, Some(1));
    assert_eq!(sim.started(), ["b"]);
    sim.complete("b");
}

#[test]
fn a_failure_handler_takes_precedence_over_continue_on_error_and_on_fail() {
    let d = def(3, vec![crew("a", &[]), with_failure(continuing(gate("g", &["a"], Some("a"))), "h"), crew("next", &["g"]), crew("h", &[])]);
    let mut sim = Sim::start(d, &["a"]);
    sim.succeed_each(&[("a", &["g"])]);
    sim.fail("g", "gate_failed", FailureClass::Ordinary, None);
    assert_eq!(sim.started(), ["h"]);
    sim.complete("h");
}

#[test]
fn an_unhandled_failure_stops_its_branch_and_fails_the_run_once_the_others_are_done() {
    let mut sim = branched(crew("c", &["a"]), vec![crew("b2", &["b"]), crew("c2", &["c"])]);
    sim.fail("b", "first", FailureClass::Final, None);
    assert_eq!(sim.started(), Vec::<String>::new(), "b2 does not start, and c goes on");
    sim.succeed_each(&[("c", &["c2"])]);
    sim.fail("c2", "second", FailureClass::Final, None);
    assert_eq!(sim.finish(), failed("first"), "the earliest unhandled failure names the run's");
}

#[test]
fn a_join_waits_for_every_open_branch_and_starts_once() {
    let mut sim = diamond();
    sim.succeed_each(&[("c", &[]), ("b", &["j"])]);
    sim.complete("j");
}

#[test]
fn a_join_goes_on_when_the_other_branch_failed_unhandled() {
    let mut sim = diamond();
    sim.succeed_each(&[("b", &[])]);
    sim.fail("c", "boom", FailureClass::Final, None);
    assert_eq!(sim.started(), ["j"], "the edge from b was taken, and nothing is open before j");
    sim.succeed("j");
    assert_eq!(sim.finish(), failed("boom"));
}

#[test]
fn a_join_waits_for_a_sibling_that_starts_in_the_same_walk() {
    // a → b → j and a → j: when a succeeds, b and j are both released, but j must wait for b
    // rather than run now and again after b.
    let mut sim = Sim::start(def(3, vec![crew("a", &[]), crew("b", &["a"]), crew("j", &["a", "b"])]), &["a"]);
    sim.succeed_each(&[("a", &["b"]), ("b", &["j"])]);
    sim.complete("j");
}

#[test]
fn a_join_waits_for_a_sibling_whose_retry_is_pending() {
    let mut sim = branched(with_retry(crew("c", &["a"]), 2, 5, 5, &[]), vec![crew("j", &["b", "c"])]);
    sim.succeed_each(&[("b", &[])]);
    sim.fail("c", "flaky", FailureClass::Ordinary, Some(1));
    assert_eq!(sim.started(), ["c#1.2"], "j does not start beside c's retry");
    sim.succeed_each(&[("c", &["j"])]);
    sim.complete("j");
}

#[test]
fn a_cycle_through_a_decision_does_not_deadlock() {
    // x and d wait on each other (d routes back to x): y releases both; x, earlier in the
    // definition, goes first and d waits for it.
    let d = def(3, vec![crew("y", &[]), crew("x", &["y"]), decision("d", &["x", "y"], &["x"], Some("z")), crew("z", &[])]);
    let mut sim = Sim::start(d, &["y"]);
    sim.succeed_each(&[("y", &["x"]), ("x", &["d"])]);
    sim.route("d", Some("x"));
    assert_eq!(sim.started(), ["x#2.1"]);
    sim.succeed_each(&[("x", &["d#2.1"])]);
    sim.route("d", Some("z"));
    assert_eq!(sim.started(), ["z"]);
    sim.complete("z");
}

#[test]
fn an_end_node_finishes_the_run_at_once() {
    for (outcome, expected) in
        [(EndOutcome::Completed, Outcome::Completed { reason: Some("ended:end_run".into()) }), (EndOutcome::Failed, failed("ended:end_run"))]
    {
        let d = def(3, vec![crew("a", &[]), crew("slow", &[]), end("stop", &["a"], outcome), crew("never", &["stop"])]);
        let mut sim = Sim::start(d, &["a", "slow"]);
        sim.succeed_each(&[("a", &["stop"])]);
        sim.succeed("stop");
        assert_eq!(sim.finish(), expected, "slow is still open; the engine cancels it");
    }
}

#[test]
fn a_decision_that_cannot_route_is_an_ordinary_failure() {
    let mut sim = Sim::start(def(3, vec![decision("d", &[], &["a"], None), crew("a", &[])]), &["d"]);
    sim.fail("d", "route:$unknown", FailureClass::Ordinary, None);
    assert_eq!(sim.finish(), failed("route:$unknown"));
}

#[test]
fn a_failed_decision_with_continue_on_error_takes_its_default() {
    let mut sim = Sim::start(def(3, vec![continuing(decision("d", &[], &["a"], Some("b"))), crew("a", &["d"]), crew("b", &["d"])]), &["d"]);
    sim.fail("d", "route:$unknown", FailureClass::Ordinary, None);
    assert_eq!(sim.started(), ["b"]);
    sim.complete("b");
}

#[test]
fn a_cancelled_step_takes_no_edge_and_is_no_failure() {
    let mut sim = Sim::start(def(3, vec![crew("a", &[]), crew("b", &["a"])]), &["a"]);
    sim.cancel("a");
    assert_eq!(sim.finish(), completed());
}

#[test]
fn walking_is_idempotent_and_ignores_the_order_of_the_history() {
    let mut sim = example_up_to("ci");
    sim.fail("ci", "gate_failed", FailureClass::Ordinary, None);
    let first = walk(&sim.def, &sim.history);
    assert_eq!(first, walk(&sim.def, &sim.history));
    let mut reversed = sim.history.clone();
    reversed.reverse();
    assert_eq!(first, walk(&sim.def, &reversed));
    assert_eq!(sim.started(), ["build#2.1"]);
    assert_eq!(sim.started(), Vec::<String>::new(), "an open step is never started again");
}

// ---------------------------------------------------------------------------------------------
// The oracle: the rules restated from a finished step's side.

/// Attempts a failure allows, restated from the retry rules (`walk.rs`).
fn oracle_allowed(node: &Node, class: FailureClass, exit_code: Option<i32>) -> u32 {
    match (class, &node.retry) {
        (FailureClass::Final, _) => 1,
        (FailureClass::Infrastructure, None) => 3,
        (FailureClass::Infrastructure, Some(r)) => r.attempts.max(3),
        (FailureClass::Ordinary, None) => 1,
        (FailureClass::Ordinary, Some(r)) => {
            let matches = r.exit_codes.is_empty() || exit_code.is_some_and(|c| r.exit_codes.contains(&c));
            if matches { r.attempts.max(1) } else { 1 }
        }
    }
}

/// The failures of the step's visit so far (itself included) of its kind: infrastructure
/// failures and the node's own are counted apart.
fn oracle_failures(step: &StepRecord, history: &[StepRecord]) -> u32 {
    let infra = |s: &StepRecord| matches!(s.state, StepState::Failed { class: FailureClass::Infrastructure, .. });
    let n = history
        .iter()
        .filter(|s| {
            s.node == step.node && s.visit == step.visit && s.attempt <= step.attempt && matches!(s.state, StepState::Failed { .. }) && infra(s) == infra(step)
        })
        .count();
    u32::try_from(n).unwrap()
}

fn oracle_retryable(node: &Node, step: &StepRecord, history: &[StepRecord]) -> bool {
    match &step.state {
        StepState::Failed { class, exit_code, .. } => oracle_failures(step, history) < oracle_allowed(node, *class, *exit_code),
        _ => false,
    }
}

fn plain_successors(def: &Definition, id: &str) -> Vec<NodeId> {
    def.nodes.iter().filter(|n| n.after.iter().any(|a| a == id)).map(|n| n.id.clone()).collect()
}

fn is_unhandled(node: &Node) -> bool {
    node.failure.is_none() && !node.continue_on_error && !matches!(&node.kind, NodeKind::Gate(g) if g.on_fail.is_some())
}

/// The nodes a finished step releases, and when.
fn released(def: &Definition, step: &StepRecord, history: &[StepRecord]) -> (Vec<NodeId>, u64) {
    let Some(node) = def.node(&step.node) else {
        return (Vec::new(), 0);
    };
    match &step.state {
        StepState::Succeeded { route, finished_seq } => match &node.kind {
            NodeKind::Decision(_) => (route.iter().cloned().collect(), *finished_seq),
            _ => (plain_successors(def, &node.id), *finished_seq),
        },
        StepState::Failed { finished_seq, .. } if !oracle_retryable(node, step, history) => {
            let targets = if let Some(h) = &node.failure {
                vec![h.clone()]
            } else if node.continue_on_error {
                match &node.kind {
                    NodeKind::Decision(d) => d.default.iter().cloned().collect(),
                    _ => plain_successors(def, &node.id),
                }
            } else if let NodeKind::Gate(Gate { on_fail: Some(to), .. }) = &node.kind {
                vec![to.clone()]
            } else {
                Vec::new()
            };
            (targets, *finished_seq)
        }
        _ => (Vec::new(), 0),
    }
}

/// The nodes a node waits on: those in its `after`, and decisions that may route to it.
fn oracle_preds(def: &Definition, id: &str) -> BTreeSet<NodeId> {
    let mut preds: BTreeSet<NodeId> = def.node(id).map(|n| n.after.iter().cloned().collect()).unwrap_or_default();
    for n in &def.nodes {
        let routes_here = match &n.kind {
            NodeKind::Decision(d) => d.cases.iter().any(|c| c.to == id) || d.default.as_deref() == Some(id),
            _ => false,
        };
        if routes_here {
            preds.insert(n.id.clone());
        }
    }
    preds.remove(id);
    preds
}

fn steps_of<'h>(history: &'h [StepRecord], id: &str) -> Vec<&'h StepRecord> {
    let mut steps: Vec<&StepRecord> = history.iter().filter(|s| s.node == id).collect();
    steps.sort_by_key(|s| s.started_seq);
    steps
}

fn is_open(history: &[StepRecord], id: &str) -> bool {
    history.iter().any(|s| s.node == id && s.state == StepState::Open)
}

/// Whether the node has a released edge it has not used, or a retry to make.
fn oracle_pending(def: &Definition, history: &[StepRecord], node: &Node) -> bool {
    if is_open(history, &node.id) {
        return false;
    }
    let mine = steps_of(history, &node.id);
    if mine.last().is_some_and(|s| oracle_retryable(node, s, history)) {
        return true;
    }
    let since = mine.last().map(|s| s.started_seq);
    history.iter().any(|s| {
        let (targets, at) = released(def, s, history);
        targets.contains(&node.id) && since.is_none_or(|since| at > since)
    }) || (history.is_empty() && is_root(def, &node.id))
}

/// A root has no `after`, is no handler and no decision's target; a gate may loop back to it.
fn is_root(def: &Definition, id: &str) -> bool {
    def.node(id).is_some_and(|n| n.after.is_empty())
        && def.nodes.iter().all(|n| {
            let routed_here = match &n.kind {
                NodeKind::Decision(d) => d.cases.iter().any(|c| c.to == id) || d.default.as_deref() == Some(id),
                _ => false,
            };
            n.failure.as_deref() != Some(id) && !routed_here
        })
}

fn oracle_blocked(def: &Definition, history: &[StepRecord], id: &str) -> bool {
    oracle_preds(def, id).iter().any(|p| is_open(history, p) || def.node(p).is_some_and(|pn| oracle_pending(def, history, pn)))
}

fn earliest_unhandled(def: &Definition, history: &[StepRecord]) -> Option<String> {
    history
        .iter()
        .filter_map(|s| {
            let node = def.node(&s.node)?;
            match &s.state {
                StepState::Failed { reason, finished_seq, class, exit_code } if !oracle_retryable(node, s, history) && is_unhandled(node) => {
                    // Retries ran out only for a failure that allows them.
                    let reason = if oracle_allowed(node, *class, *exit_code) > 1 { "attempts_exhausted".to_owned() } else { reason.clone() };
                    Some((*finished_seq, reason))
                }
                _ => None,
            }
        })
        .min()
        .map(|(_, reason)| reason)
}

// ---------------------------------------------------------------------------------------------
// Random definitions.

#[derive(Debug, Clone)]
struct NodeSpec {
    kind: u8,
    has_after: bool,
    after_mask: u16,
    targets: (u8, u8, u8),
    default: bool,
    on_fail: Option<u8>,
    retry: Option<(u32, u64, u64, u8)>,
    continue_on_error: bool,
    failure: Option<u8>,
}

fn node_spec() -> impl Strategy<Value = NodeSpec> {
    (
        (0u8..10, prop::bool::weighted(0.85), any::<u16>(), (any::<u8>(), any::<u8>(), 1u8..=2), any::<bool>()),
        (
            prop::option::weighted(0.6, any::<u8>()),
            prop::option::weighted(0.3, (1u32..=4, 0u64..=10, 0u64..=30, 0u8..4)),
            prop::bool::weighted(0.1),
            prop::option::weighted(0.1, any::<u8>()),
        ),
    )
        .prop_map(|((kind, has_after, after_mask, targets, default), (on_fail, retry, continue_on_error, failure))| NodeSpec {
            kind,
            has_after,
            after_mask,
            targets,
            default,
            on_fail,
            retry,
            continue_on_error,
            failure,
        })
}

/// Builds a definition whose plain and route edges all point forward (so the waits form no
/// cycle, as validation requires of a graph without a decision looping back), with gates
/// that loop back to earlier nodes and handlers later in the definition.
fn build_def(stop_the_line_attempts: u32, specs: &[NodeSpec]) -> Definition {
    let count = specs.len();
    let id = |i: usize| format!("n{i}");
    let nodes = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let mut after: Vec<String> = (0..i.min(16)).filter(|j| spec.after_mask & (1 << j) != 0).map(id).take(3).collect();
            if after.is_empty() && spec.has_after && i > 0 {
                after.push(id(usize::from(spec.targets.0) % i));
            }
            let after: Vec<&str> = after.iter().map(String::as_str).collect();
            let later = count - i - 1;
            let mut n = match spec.kind {
                6 if i > 0 => {
                    let on_fail = spec.on_fail.map(|j| id(usize::from(j) % i));
                    gate(&id(i), &after, on_fail.as_deref())
                }
                7 | 8 if later > 0 => {
                    let pick = |x: u8| id(i + 1 + usize::from(x) % later);
                    let mut cases = vec![pick(spec.targets.0)];
                    if spec.targets.2 == 2 {
                        cases.push(pick(spec.targets.1));
                    }
                    let default = spec.default.then(|| pick(spec.targets.1.wrapping_add(1)));
                    let cases: Vec<&str> = cases.iter().map(String::as_str).collect();
                    decision(&id(i), &after, &cases, default.as_deref())
                }
                9 if i > 0 => end(&id(i), &after, if spec.default { EndOutcome::Completed } else { EndOutcome::Failed }),
                0 if i == 0 => node(&id(i), &after, NodeKind::Trigger),
                _ => crew(&id(i), &after),
            };
            if let Some((attempts, backoff, max_backoff, codes)) = spec.retry {
                let codes: &[i32] = match codes {
                    0 => &[],
                    1 => &[1],
                    2 => &[2],
                    _ => &[1, 2],
                };
                n = with_retry(n, attempts, backoff, max_backoff, codes);
            }
            n.continue_on_error = spec.continue_on_error;
            if let (Some(j), true) = (spec.failure, later > 0) {
                n.failure = Some(id(i + 1 + usize::from(j) % later));
            }
            n
        })
        .collect();
    def(stop_the_line_attempts, nodes)
}

fn def_strategy() -> impl Strategy<Value = Definition> {
    (1u32..=4, prop::collection::vec(node_spec(), 5..=12)).prop_map(|(stl, specs)| build_def(stl, &specs))
}

// ---------------------------------------------------------------------------------------------
// The random run and the checks at each walk.

/// Random choices, then all zeros (success, the first open step) so every run can end.
struct Choices {
    bytes: Vec<u8>,
    next: usize,
}

impl Choices {
    fn take(&mut self) -> usize {
        let b = self.bytes.get(self.next).copied().unwrap_or(0);
        self.next += 1;
        usize::from(b)
    }
}

/// More steps than any run of these definitions can make: 12 nodes × 4 visits × 4 attempts.
const STEP_BOUND: usize = 12 * 4 * 4;

fn simulate(def: &Definition, choices: Vec<u8>) -> Result<Outcome, TestCaseError> {
    let mut choices = Choices { bytes: choices, next: 0 };
    let mut sim = Sim::new(def.clone());
    for _ in 0..=2 * STEP_BOUND {
        let w = walk(def, &sim.history);
        check_walk(def, &sim.history, &w)?;
        if let Some(outcome) = w.finished {
            check_outcome(def, &sim.history, &outcome)?;
            return Ok(outcome);
        }
        let opened = sim.tick();
        prop_assert_eq!(&opened, &w);
        check_after_start(def, &sim.history, &w)?;

        // Finish one open step, chosen at random, with a random outcome.
        let open: Vec<usize> = (0..sim.history.len()).filter(|&i| sim.history[i].state == StepState::Open).collect();
        prop_assert!(!open.is_empty(), "not finished, but nothing open or started");
        let i = open[choices.take() % open.len()];
        let finished_seq = sim.next_seq();
        let node = def.node(&sim.history[i].node).expect("steps are of known nodes");
        sim.history[i].state = random_outcome(node, &mut choices, finished_seq);
    }
    Err(TestCaseError::fail(format!("the run did not end within {} walks: {:?}", 2 * STEP_BOUND, sim.history)))
}

fn random_outcome(node: &Node, choices: &mut Choices, finished_seq: u64) -> StepState {
    let fail = |reason: &str, class, exit_code| StepState::Failed { reason: reason.into(), class, exit_code, finished_seq };
    match choices.take() % 10 {
        0..=5 => match &node.kind {
            NodeKind::Decision(d) => {
                let targets: Vec<&NodeId> = d.cases.iter().map(|c| &c.to).chain(&d.default).collect();
                if targets.is_empty() {
                    fail("route:$unknown", FailureClass::Ordinary, None)
                } else {
                    let to = targets[choices.take() % targets.len()];
                    StepState::Succeeded { route: Some(to.clone()), finished_seq }
                }
            }
            _ => StepState::Succeeded { route: None, finished_seq },
        },
        6 | 7 => {
            let exit_code = [None, Some(1), Some(2), Some(3)][choices.take() % 4];
            fail("exit_code", FailureClass::Ordinary, exit_code)
        }
        8 => fail("lease_expired", FailureClass::Infrastructure, None),
        _ => fail("rejected", FailureClass::Final, None),
    }
}

/// Checks one walk against the history it was given, before its starts are applied.
fn check_walk(def: &Definition, history: &[StepRecord], w: &Walk) -> Result<(), TestCaseError> {
    // Deterministic, idempotent, and blind to the order of the history.
    prop_assert_eq!(w, &walk(def, history));
    let mut shuffled = history.to_vec();
    shuffled.reverse();
    shuffled.rotate_left(history.len() / 3);
    prop_assert_eq!(w, &walk(def, &shuffled));

    if w.finished.is_some() {
        prop_assert!(w.start.is_empty(), "a finished walk starts nothing: {:?}", w);
        return Ok(());
    }
    prop_assert!(!w.start.is_empty() || history.iter().any(|s| s.state == StepState::Open), "not finished, but nothing open and nothing started");

    // At most once per node, in the definition's order.
    let positions: Vec<usize> = w.start.iter().map(|s| def.nodes.iter().position(|n| n.id == s.node).expect("known node")).collect();
    prop_assert!(positions.windows(2).all(|p| p[0] < p[1]), "starts out of order or repeated: {:?}", w.start);

    for s in &w.start {
        let node = def.node(&s.node).expect("known node");
        let mine = steps_of(history, &s.node);
        prop_assert!(!is_open(history, &s.node), "{} started while open", s.node);
        prop_assert!(!oracle_blocked(def, history, &s.node), "{} started while a predecessor is open or pending", s.node);
        let last = mine.last();
        if s.attempt > 1 {
            // A retry: of the node's latest step, which failed, retryably.
            let last = last.expect("a retry follows a step");
            prop_assert_eq!((last.visit, last.attempt + 1), (s.visit, s.attempt));
            prop_assert!(oracle_retryable(node, last, history), "{} retried past what it allows", s.node);
            let expected = match &node.retry {
                Some(r) => (r.backoff * 2u32.pow(oracle_failures(last, history) - 1)).min(r.max_backoff),
                None => Duration::ZERO,
            };
            prop_assert_eq!(s.delay, expected);
        } else {
            // A new visit: released by a step that finished after the node last started.
            prop_assert_eq!(s.attempt, 1);
            prop_assert_eq!(s.delay, Duration::ZERO);
            prop_assert!(!last.is_some_and(|l| oracle_retryable(node, l, history)), "{} has a retry to make instead", s.node);
            prop_assert_eq!(s.visit, mine.iter().map(|m| m.visit).max().unwrap_or(0) + 1);
            prop_assert!(s.visit <= def.stop_the_line_attempts);
            prop_assert!(oracle_pending(def, history, node), "{} started without a taken edge", s.node);
        }
    }

    // Complete: every pending node that nothing blocks starts now.
    for n in &def.nodes {
        if oracle_pending(def, history, n) && !oracle_blocked(def, history, &n.id) {
            prop_assert!(w.start.iter().any(|s| s.node == n.id), "{} should start: {:?}", n.id, history);
        }
    }
    Ok(())
}

/// Checks the history once a walk's starts are applied.
fn check_after_start(def: &Definition, history: &[StepRecord], w: &Walk) -> Result<(), TestCaseError> {
    // What was just started is open, so it is not started again.
    let again = walk(def, history);
    for s in &again.start {
        prop_assert!(!w.start.iter().any(|t| t.node == s.node), "{} started twice", s.node);
    }
    for n in &def.nodes {
        let mine = steps_of(history, &n.id);
        prop_assert!(mine.iter().filter(|s| s.state == StepState::Open).count() <= 1, "two open steps of {}", n.id);
        prop_assert!(mine.iter().all(|s| s.visit <= def.stop_the_line_attempts), "{} visited too often", n.id);
        // Attempts stay within what the failure before them allowed.
        for pair in mine.windows(2) {
            if pair[1].visit == pair[0].visit {
                prop_assert_eq!(pair[1].attempt, pair[0].attempt + 1);
                prop_assert!(oracle_retryable(n, pair[0], history), "{} retried past what it allows", n.id);
            } else {
                prop_assert_eq!(pair[1].attempt, 1);
                prop_assert_eq!(pair[1].visit, pair[0].visit + 1);
            }
        }
    }
    Ok(())
}

/// Checks the outcome of a finished run.
fn check_outcome(def: &Definition, history: &[StepRecord], outcome: &Outcome) -> Result<(), TestCaseError> {
    let reason = match outcome {
        Outcome::Completed { reason } => reason.clone(),
        Outcome::Failed { reason } => Some(reason.clone()),
    };
    if reason.as_deref() == Some(ENDED) {
        let ended: Vec<EndOutcome> = history
            .iter()
            .filter(|s| matches!(s.state, StepState::Succeeded { .. }))
            .filter_map(|s| match &def.node(&s.node)?.kind {
                NodeKind::End(e) => Some(e.outcome),
                _ => None,
            })
            .collect();
        prop_assert_eq!(ended.len(), 1, "the run ends at the first end step");
        prop_assert_eq!(matches!(outcome, Outcome::Completed { .. }), ended[0] == EndOutcome::Completed);
        return Ok(());
    }
    if let Some(stopped) = reason.as_deref().and_then(|r| r.strip_prefix(STOPPED_LINE_PREFIX)) {
        prop_assert!(matches!(outcome, Outcome::Failed { .. }), "stopping the line fails the run");
        let node = def.node(stopped).expect("stopped at a known node");
        prop_assert!(oracle_pending(def, history, node) && !oracle_blocked(def, history, stopped), "{} stopped the line without being about to start", stopped);
        let visits = steps_of(history, stopped).iter().map(|s| s.visit).max().unwrap_or(0);
        prop_assert_eq!(visits, def.stop_the_line_attempts, "{} stopped before its last visit", stopped);
        return Ok(());
    }
    // Nothing open and nothing more can start.
    prop_assert!(!history.iter().any(|s| s.state == StepState::Open));
    for n in &def.nodes {
        prop_assert!(!oracle_pending(def, history, n), "{} could still start", n.id);
    }
    match earliest_unhandled(def, history) {
        Some(expected) => prop_assert_eq!(outcome, &failed(&expected)),
        None => prop_assert_eq!(outcome, &completed()),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn random_runs_keep_every_rule(def in def_strategy(), choices in prop::collection::vec(any::<u8>(), 0..600)) {
        simulate(&def, choices)?;
    }

    #[test]
    fn a_join_starts_once_after_all_its_open_branches(
        branches in 2usize..=4,
        order in Just((0..4).collect::<Vec<usize>>()).prop_shuffle(),
        succeeds in prop::collection::vec(any::<bool>(), 4),
    ) {
        let ids: Vec<String> = (0..branches).map(|i| format!("b{i}")).collect();
        let after: Vec<&str> = ids.iter().map(String::as_str).collect();
        let mut nodes = vec![crew("a", &[])];
        nodes.extend(ids.iter().map(|id| crew(id, &["a"])));
        nodes.push(crew("join", &after));
        let mut sim = Sim::new(def(3, nodes));
        prop_assert_eq!(sim.started(), ["a"]);
        sim.succeed("a");
        prop_assert_eq!(sim.started(), ids.clone());

        let mut joins = 0;
        for (k, &b) in order.iter().filter(|&&b| b < branches).enumerate() {
            if succeeds[b] {
                sim.succeed(&ids[b]);
            } else {
                sim.fail(&ids[b], "boom", FailureClass::Final, None);
            }
            let w = sim.tick();
            let started = w.start.iter().filter(|s| s.node == "join").count();
            if k + 1 < branches {
                prop_assert_eq!(started, 0, "the join started with a branch open");
            }
            joins += started;
        }
        let any_succeeded = succeeds[..branches].iter().any(|&s| s);
        prop_assert_eq!(joins, usize::from(any_succeeded));
        if any_succeeded {
            sim.succeed("join");
        }
        let w = sim.tick();
        let expected = if succeeds[..branches].iter().all(|&s| s) { completed() } else { failed("boom") };
        prop_assert_eq!(w.finished, Some(expected));
    }
}

/// Random runs end in every kind of outcome, so the properties above are not vacuous.
#[test]
fn random_runs_reach_every_kind_of_outcome() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = (def_strategy(), prop::collection::vec(any::<u8>(), 0..600));
    let mut seen = BTreeSet::new();
    for _ in 0..500 {
        let (def, choices) = strategy.new_tree(&mut runner).expect("a value").current();
        let outcome = simulate(&def, choices).expect("the properties hold");
        let kind = match &outcome {
            Outcome::Completed { reason: None } => "completed",
            Outcome::Completed { reason: Some(_) } => "ended completed",
            Outcome::Failed { reason } if reason.starts_with(STOPPED_LINE_PREFIX) => "stopped_line",
            Outcome::Failed { reason } if reason == ENDED => "ended failed",
            Outcome::Failed { reason } if reason == ATTEMPTS_EXHAUSTED => "attempts_exhausted",
            Outcome::Failed { .. } => "failed",
        };
        seen.insert(kind);
    }
    assert_eq!(seen, BTreeSet::from(["completed", "ended completed", "stopped_line", "ended failed", "attempts_exhausted", "failed"]));
}
