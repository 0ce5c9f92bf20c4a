//! The run lifecycle against a real engine in this process: retries and their backoff,
//! infrastructure failures, timeouts, stop-the-line, decisions, failure handling, `end`,
//! child runs, approvals (run-level and timed out), waits until a time, dry runs, reruns,
//! cancel, drain; and the substate and `why` of runs in each of those states.

use std::path::PathBuf;
use std::time::Duration;

use engine::db::Db;
use engine::ids::{HostId, OrgId, RunId, StepId};
use engine::state::StepState;
use engine::store::runs::{self, NewRun};
use engine::store::steps;
use engine::store::{Actor, Change, StoreError, approvals, workflows};
use engine::substate::{self, Substate, Why};
use engine::testkit::{Engine, TestDb, test_db};
use serde_json::{Value, json};

use crate::fixtures::{
    Seed, add_workflow, approve, cancel, finish, new_run, reject, rerun, scalar, seed, seeded, started, submit_new, submitted, until, until_done, with_input,
};

/// Approves the run's start (a workflow with `approval: required`).
async fn approve_start(pool: &Db, org: OrgId, run: RunId) {
    approve(pool, org, run, approvals::RUN_APPROVAL_NODE, json!({})).await;
}

/// One line per step, in creation order: `node:visit.attempt:state[:reason]`.
async fn steps_of(pool: &Db, run: RunId) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT node || ':' || visit || '.' || attempt || ':' || state || coalesce(':' || reason, '') \
         FROM steps WHERE run_id = $1 ORDER BY started_seq",
    )
    .bind(run)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Polls until `pred` holds for the run's steps; panics after 15 s.
async fn until_steps(pool: &Db, run: RunId, what: &str, pred: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let steps = steps_of(pool, run).await;
        if pred(&steps) {
            return steps;
        }
        assert!(tokio::time::Instant::now() < deadline, "never reached {what}: {steps:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn has(steps: &[String], prefix: &str) -> bool {
    steps.iter().any(|s| s.starts_with(prefix))
}

async fn why(pool: &Db, org: OrgId, run: RunId) -> Why {
    substate::why(pool, org, run).await.unwrap()
}

/// Polls until `pred` holds for the run's steps, then asks why the run is where it is.
async fn why_once(pool: &Db, org: OrgId, run: RunId, what: &str, pred: impl Fn(&[String]) -> bool) -> Why {
    until_steps(pool, run, what, pred).await;
    why(pool, org, run).await
}

/// An engine on `source` and a run of it for each of `inputs`, submitted in turn.
async fn started_runs<const N: usize>(source: &str, inputs: [Value; N]) -> (TestDb, Seed, Engine, [RunId; N]) {
    let (db, s, eng) = started(source).await;
    let mut runs = Vec::new();
    for input in inputs {
        runs.push(submit_new(&db.pool, with_input(&s, input)).await);
    }
    (db, s, eng, runs.try_into().unwrap())
}

/// An engine on `source` and a run of it with no input, once the run has a step `step`
/// (`node:visit.attempt:state`), with why it is where it is.
async fn started_until(source: &str, what: &str, step: &str) -> (TestDb, Seed, Engine, RunId, Why) {
    let (db, s, eng, [run]) = started_runs(source, [json!({})]).await;
    let w = why_once(&db.pool, s.org, run, what, |steps| has(steps, step)).await;
    (db, s, eng, run, w)
}

fn name(why: &Why) -> Option<&'static str> {
    why.substate.as_ref().map(Substate::name)
}

async fn status(pool: &Db, run: RunId) -> (String, Option<String>) {
    until_done(pool, run, Duration::from_secs(20)).await
}

/// Waits for the run to end, then checks its status and reason, and its steps.
async fn assert_ended(pool: &Db, run: RunId, ended: (&str, Option<&str>), steps: &[&str]) {
    let (status, reason) = status(pool, run).await;
    assert_eq!((status.as_str(), reason.as_deref()), ended, "the status and reason of {run}");
    assert_eq!(steps_of(pool, run).await, steps, "the steps of {run}");
}

/// The file the test executor records each execution in, in a directory kept as long as this.
struct Effects {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Effects {
    /// The run's executions, `<node> <visit> <attempt>`, from the file's lines
    /// `<step> <run> <node> <visit> <attempt>`.
    fn of(&self, run: RunId) -> Vec<String> {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        let run = run.to_string();
        text.lines().filter(|l| l.split(' ').nth(1) == Some(run.as_str())).map(|l| l.split(' ').skip(2).collect::<Vec<_>>().join(" ")).collect()
    }
}

/// As [`started`], with the test executor recording each execution in [`Effects`].
async fn started_recording(source: &str) -> (TestDb, Seed, Engine, Effects) {
    let (db, s) = seeded(source).await;
    let dir = tempfile::tempdir().unwrap();
    let effects = Effects { path: dir.path().join("effects"), _dir: dir };
    let eng = Engine::executing(&db, "e1", Some(&effects.path));
    (db, s, eng, effects)
}

/// Makes a wake of the run due now, as if its time had come, and tells the engines.
async fn fire(pool: &Db, run: RunId, reason: &str) {
    let moved = sqlx::query("UPDATE wakes SET due_at = now() - interval '1 second' WHERE run_id = $1 AND reason = $2")
        .bind(run)
        .bind(reason)
        .execute(pool)
        .await
        .unwrap();
    assert!(moved.rows_affected() > 0, "no {reason} wake for {run}");
    sqlx::query("SELECT pg_notify('shopfloor_wakes', 'w0')").execute(pool).await.unwrap();
}

const RETRY: &str = include_str!("../../../tests/workflows/retry.yaml");

#[tokio::test]
async fn a_failed_step_retries_with_doubling_backoff_and_only_on_listed_exit_codes() {
    let (db, s, eng, [recovers, wrong_code, exhausted]) = started_runs(
        RETRY,
        [
            json!({ "test": { "fail_attempts": { "build": 2 } } }),
            json!({ "test": { "fail_attempts": { "build": 1 }, "exit_code": 2 } }),
            json!({ "test": { "fail_attempts": { "build": 9 } } }),
        ],
    )
    .await;

    // While the backoff runs the run is asleep, and says after what.
    let w = why_once(&db.pool, s.org, recovers, "the second attempt", |s| has(s, "build:1.2:pending")).await;
    assert_eq!(name(&w), Some("sleeping"), "{}", w.text);
    assert!(w.text.starts_with("Asleep until ") && w.text.ends_with(" UTC (retry 1 of build after exit code 1)"), "{}", w.text);

    assert_ended(&db.pool, recovers, ("completed", None), &["build:1.1:failed:exit_code:1", "build:1.2:failed:exit_code:1", "build:1.3:succeeded"]).await;
    // The backoff doubles: at least 1 s before attempt 2, at least 2 s before attempt 3 (how
    // much later a loaded machine starts them is `make bench`'s to measure).
    let gaps: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM n.started_at - p.ended_at)::float8 FROM steps p JOIN steps n \
           ON n.run_id = p.run_id AND n.node = p.node AND n.attempt = p.attempt + 1 \
         WHERE p.run_id = $1 ORDER BY p.attempt",
    )
    .bind(recovers)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(gaps[0] >= 1.0 && gaps[1] >= 2.0, "{gaps:?}");

    // Exit code 2 is not listed: no retry, the run fails with the step's reason.
    assert_ended(&db.pool, wrong_code, ("failed", Some("exit_code:2")), &["build:1.1:failed:exit_code:2"]).await;
    assert_eq!(why(&db.pool, s.org, wrong_code).await.text, "Finished: failed at build: exit_code:2");

    assert_eq!(status(&db.pool, exhausted).await, ("failed".into(), Some("attempts_exhausted".into())));
    assert_eq!(steps_of(&db.pool, exhausted).await.len(), 3);
    assert_eq!(why(&db.pool, s.org, exhausted).await.text, "Finished: failed at build: attempts_exhausted");
    finish(eng, db).await;
}

const HOST_STEP: &str = include_str!("../../../tests/workflows/host_step.yaml");

/// Plays a host: leases and starts the step, as the host protocol will.
async fn host_takes(pool: &Db, org: OrgId, run: RunId, step: StepId, host: HostId) {
    let holder = format!("host:{host}");
    let mut ch = Change::begin(pool, Actor::Host(host)).await.unwrap();
    ch.lock_run(org, run).await.unwrap().unwrap();
    steps::lease(&mut ch, run, step, &holder).await.unwrap();
    steps::start(&mut ch, run, step, &holder).await.unwrap();
    ch.commit().await.unwrap();
}

/// The host goes silent: its lease and the grace after it run out now.
async fn host_dies(pool: &Db, step: StepId) {
    sqlx::query("UPDATE steps SET lease_expires_at = now() - interval '16 seconds' WHERE step_id = $1").bind(step).execute(pool).await.unwrap();
    sqlx::query("UPDATE wakes SET due_at = now() WHERE step_id = $1 AND reason = 'lease_expiry'").bind(step).execute(pool).await.unwrap();
    sqlx::query("SELECT pg_notify('shopfloor_wakes', 'w0')").execute(pool).await.unwrap();
}

async fn open_step(pool: &Db, run: RunId) -> StepId {
    sqlx::query_scalar("SELECT step_id FROM steps WHERE run_id = $1 AND state = 'pending'").bind(run).fetch_one(pool).await.unwrap()
}

#[tokio::test]
async fn a_host_step_is_routed_and_a_lost_host_is_retried_by_itself_three_times() {
    let (db, s) = seeded(HOST_STEP).await;
    let eng = Engine::start(&db.pool, engine::testkit::pool_config("e1", &db.url, None));
    let run = submit_new(&db.pool, new_run(&s)).await;
    until_steps(&db.pool, run, "a ready step", |s| has(s, "build:1.1:pending")).await;

    // No host at all, then one without the gpu, then a deregistered one: nobody can run it.
    // The step requires its harness too, though the node does not say so.
    let w = why(&db.pool, s.org, run).await;
    assert_eq!(
        (name(&w), w.text.as_str()),
        (Some("unroutable"), "Waiting for a host with linux, gpu, harness:claude-code to run build: no host of this project was seen in the last day")
    );
    let host = HostId::mint();
    let add_host = |id: HostId, name: &'static str, caps: &'static [&'static str], gone: bool| {
        let pool = db.pool.clone();
        let (org, project) = (s.org, s.project);
        async move {
            sqlx::query(
                "INSERT INTO hosts (org_id, project_id, host_id, name, capabilities, last_seen_at, deregistered_at) \
                 VALUES ($1, $2, $3, $4, $5, now(), CASE WHEN $6 THEN now() END)",
            )
            .bind(org)
            .bind(project)
            .bind(id)
            .bind(name)
            .bind(caps.iter().map(|c| (*c).to_owned()).collect::<Vec<_>>())
            .bind(gone)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    add_host(HostId::mint(), "cpu-1", &["linux", "harness:claude-code"], false).await;
    add_host(HostId::mint(), "old-gpu", &["linux", "gpu", "harness:claude-code"], true).await;
    let w = why(&db.pool, s.org, run).await;
    assert_eq!(
        w.substate,
        Some(Substate::Unroutable {
            node: "build".into(),
            requires: vec!["linux".into(), "gpu".into(), "harness:claude-code".into()],
            missing: vec!["gpu".into()]
        })
    );
    assert_eq!(w.text, "Waiting for a host with linux, gpu, harness:claude-code: none online has gpu");
    // A host last seen two days ago does not count either.
    add_host(HostId::mint(), "stale-gpu", &["linux", "gpu", "harness:claude-code"], false).await;
    sqlx::query("UPDATE hosts SET last_seen_at = now() - interval '2 days' WHERE name = 'stale-gpu'").execute(&db.pool).await.unwrap();
    assert_eq!(name(&why(&db.pool, s.org, run).await), Some("unroutable"));

    add_host(host, "gpu-1", &["linux", "gpu", "arm64", "harness:claude-code"], false).await;
    let w = why(&db.pool, s.org, run).await;
    assert_eq!((name(&w), w.words.as_str()), (Some("waiting_for_agent"), "waiting for a host"));
    assert_eq!(w.text, "Waiting for a host with linux, gpu, harness:claude-code to pick up build (1 host online can run it)");

    for attempt in 1..=3 {
        let step = open_step(&db.pool, run).await;
        host_takes(&db.pool, s.org, run, step, host).await;
        let w = why(&db.pool, s.org, run).await;
        assert_eq!((name(&w), w.text.as_str()), (Some("executing"), "Running build on host gpu-1"));
        host_dies(&db.pool, step).await;
        if attempt < 3 {
            // Retried at once, with no backoff: the node has no `retry:`.
            until_steps(&db.pool, run, "the next attempt", |s| has(s, &format!("build:1.{}:pending", attempt + 1))).await;
        }
    }
    assert_ended(
        &db.pool,
        run,
        ("failed", Some("attempts_exhausted")),
        &["build:1.1:failed:lease_expired", "build:1.2:failed:lease_expired", "build:1.3:failed:lease_expired"],
    )
    .await;
    let classes: Vec<String> = sqlx::query_scalar("SELECT failure_class FROM steps WHERE run_id = $1").bind(run).fetch_all(&db.pool).await.unwrap();
    assert_eq!(classes, ["infrastructure"; 3]);
    finish(eng, db).await;
}

const TIMEOUT: &str = include_str!("../../../tests/workflows/timeout.yaml");

#[tokio::test]
async fn a_step_past_its_timeout_fails_and_its_execution_stops() {
    let (db, s, eng, effects) = started_recording(TIMEOUT).await;
    // Work of 5 s (less than a heartbeat, which would see the step failed) past a 1 s timeout.
    let run = submit_new(&db.pool, with_input(&s, json!({ "test": { "step_ms": 5000 } }))).await;
    assert_eq!(status(&db.pool, run).await, ("failed".into(), Some("timeout".into())));
    // A draining pool waits for its executions and records their results before it returns:
    // the execution was stopped at its timeout, so it recorded no effect and no success.
    eng.drain.cancel();
    let returned = tokio::time::timeout(Duration::from_secs(60), eng.task).await;
    assert!(matches!(returned, Ok(Ok(Ok(())))), "the pool did not drain: {returned:?}");
    assert_eq!(effects.of(run), Vec::<String>::new(), "the timed-out execution went on to its effect");
    assert_eq!(steps_of(&db.pool, run).await, ["build:1.1:failed:timeout"]);
    let output: Option<Value> = scalar(&db.pool, "SELECT output FROM steps WHERE run_id = $1", run).await;
    assert_eq!(output, None);
    db.finish().await;
}

const LOOP: &str = include_str!("../../../tests/workflows/loop.yaml");

#[tokio::test]
async fn a_node_past_stop_the_line_attempts_fails_the_run_naming_it() {
    let (db, s, eng, [run]) = started_runs(LOOP, [json!({ "test": { "gate_fail_visits": [1, 2, 3] } })]).await;
    assert_ended(
        &db.pool,
        run,
        ("failed", Some("stopped_line:build")),
        &["plan:1.1:succeeded", "build:1.1:succeeded", "ci:1.1:failed:gate_failed", "build:2.1:succeeded", "ci:2.1:failed:gate_failed"],
    )
    .await;
    assert_eq!(why(&db.pool, s.org, run).await.text, "Finished: failed at build: stopped_line:build");
    finish(eng, db).await;
}

const ROUTE: &str = include_str!("../../../tests/workflows/route.yaml");

#[tokio::test]
async fn a_decision_takes_the_first_true_case_or_fails_with_route_unknown() {
    let (db, s, eng, [big, medium, none]) = started_runs(ROUTE, [json!({ "size": 10 }), json!({ "size": 3 }), json!({ "size": 1 })]).await;
    assert_ended(&db.pool, big, ("completed", None), &["size:1.1:succeeded", "big:1.1:succeeded"]).await;
    assert_ended(&db.pool, medium, ("completed", None), &["size:1.1:succeeded", "medium:1.1:succeeded"]).await;
    assert_ended(&db.pool, none, ("failed", Some("route:$unknown")), &["size:1.1:failed:route:$unknown"]).await;
    assert_eq!(why(&db.pool, s.org, none).await.text, "Finished: failed at size: route:$unknown");
    finish(eng, db).await;
}

const CONTINUE: &str = include_str!("../../../tests/workflows/continue.yaml");

#[tokio::test]
async fn continue_on_error_goes_on_and_a_failure_handler_runs_instead_of_what_follows() {
    let (db, _, eng, [lint_fails, build_fails]) =
        started_runs(CONTINUE, [json!({ "test": { "fail_attempts": { "lint": 1 } } }), json!({ "test": { "fail_attempts": { "build": 1 } } })]).await;
    assert_ended(&db.pool, lint_fails, ("completed", None), &["lint:1.1:failed:exit_code:1", "build:1.1:succeeded", "ship:1.1:succeeded"]).await;
    // The handler takes the failure: the run completes, and `ship` never starts.
    assert_ended(&db.pool, build_fails, ("completed", None), &["lint:1.1:succeeded", "build:1.1:failed:exit_code:1", "notify:1.1:succeeded"]).await;
    finish(eng, db).await;
}

const END: &str = include_str!("../../../tests/workflows/end.yaml");

#[tokio::test]
async fn an_end_node_finishes_the_run_at_once_and_cancels_what_is_still_open() {
    let (db, s, eng, [run]) = started_runs(END, [json!({})]).await;
    assert_ended(&db.pool, run, ("failed", Some("ended:end_run")), &["slow:1.1:cancelled:run ended", "quick:1.1:succeeded", "stop:1.1:succeeded"]).await;
    assert_eq!(scalar::<i64>(&db.pool, "SELECT count(*) FROM wakes WHERE run_id = $1", run).await, 0);
    assert_eq!(why(&db.pool, s.org, run).await.text, "Finished: failed at stop: ended:end_run");
    finish(eng, db).await;
}

const PARENT: &str = include_str!("../../../tests/workflows/parent_of_middle.yaml");
const MIDDLE: &str = include_str!("../../../tests/workflows/middle.yaml");
const LEAF_QUICK: &str = include_str!("../../../tests/workflows/one_crew_step.yaml");
const LEAF_WAITS: &str = include_str!("../../../tests/workflows/leaf_asks.yaml");

async fn child_of(pool: &Db, parent: RunId) -> RunId {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let child: Option<RunId> = sqlx::query_scalar("SELECT run_id FROM runs WHERE parent_run_id = $1").bind(parent).fetch_optional(pool).await.unwrap();
        if let Some(child) = child {
            return child;
        }
        assert!(tokio::time::Instant::now() < deadline, "{parent} started no child");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_parent_awaits_its_child_and_cancelling_it_cancels_the_waiting_tree() {
    let (db, s) = seeded(PARENT).await;
    add_workflow(&db.pool, &s, "middle", MIDDLE).await;
    add_workflow(&db.pool, &s, "leaf", LEAF_QUICK).await;
    let eng = Engine::executing(&db, "e1", None);

    // A child that completes lets its parent go on, with the child's outcome as output.
    let parent = submit_new(&db.pool, new_run(&s)).await;
    assert_eq!(status(&db.pool, parent).await, ("completed".into(), None));
    let middle = child_of(&db.pool, parent).await;
    let output: Value = scalar(&db.pool, "SELECT output FROM steps WHERE run_id = $1 AND node = 'spawn'", parent).await;
    assert_eq!(output["run"], json!(middle.to_string()));
    assert_eq!(output["status"], json!("completed"));
    let input: Value = scalar(&db.pool, "SELECT input FROM runs WHERE run_id = $1", middle).await;
    assert_eq!(input, json!({ "from": parent.to_string() }));

    // Now the leaf waits for a person: the tree waits on it.
    add_workflow(&db.pool, &s, "leaf", LEAF_WAITS).await;
    let parent = submit_new(&db.pool, new_run(&s)).await;
    let middle = child_of(&db.pool, parent).await;
    let leaf = child_of(&db.pool, middle).await;
    until_steps(&db.pool, leaf, "the leaf's approval", |s| has(s, "ask:1.1:waiting")).await;
    let w = why(&db.pool, s.org, parent).await;
    assert_eq!((name(&w), w.words.as_str()), (Some("awaiting_child"), "waiting on another run"));
    assert_eq!(w.text, format!("Waiting on run {middle} started by spawn"));
    assert_eq!(name(&why(&db.pool, s.org, leaf).await), Some("awaiting_signal"));

    cancel(&db.pool, s.org, parent, "not needed").await;
    assert_eq!(status(&db.pool, parent).await, ("cancelled".into(), Some("not needed".into())));
    assert_eq!(status(&db.pool, middle).await, ("cancelled".into(), Some(format!("parent {parent} is no longer running"))));
    assert_eq!(status(&db.pool, leaf).await, ("cancelled".into(), Some(format!("parent {middle} is no longer running"))));
    assert_eq!(steps_of(&db.pool, leaf).await, [format!("ask:1.1:cancelled:parent {middle} is no longer running")]);
    // The leaf's approval is withdrawn, so no one is asked to answer it any more.
    let decision: Option<String> = scalar(&db.pool, "SELECT decision FROM approvals WHERE run_id = $1", leaf).await;
    assert_eq!(decision.as_deref(), Some("withdrawn"));
    assert_eq!(why(&db.pool, s.org, middle).await.text, format!("Finished: cancelled: parent {parent} is no longer running"));
    finish(eng, db).await;
}

const GUARDED: &str = include_str!("../../../tests/workflows/guarded.yaml");

#[tokio::test]
async fn a_workflow_requiring_approval_parks_each_new_run_until_approved() {
    let (db, s) = seeded(GUARDED).await;
    let def = engine::definition::parse(GUARDED).unwrap();
    let eng = Engine::executing(&db, "e1", None);
    let new = || NewRun { needs_approval: def.approval_required, ..new_run(&s) };
    let run = submit_new(&db.pool, new()).await;
    let w = why_once(&db.pool, s.org, run, "the run's approval", |s| s == ["$start:1.1:waiting"]).await;
    assert_eq!((name(&w), w.words.as_str()), (Some("awaiting_signal"), "waiting for approval"));
    assert_eq!(w.text, "Waiting for approval to start: Start this run?");
    // Parked means parked: nothing else starts while it waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(steps_of(&db.pool, run).await, ["$start:1.1:waiting"]);

    approve_start(&db.pool, s.org, run).await;
    assert_ended(&db.pool, run, ("completed", None), &["$start:1.1:succeeded", "build:1.1:succeeded"]).await;

    // Rejected at the start, the run is cancelled before any work.
    let run = submit_new(&db.pool, new()).await;
    until_steps(&db.pool, run, "the run's approval", |s| s == ["$start:1.1:waiting"]).await;
    reject(&db.pool, s.org, run, approvals::RUN_APPROVAL_NODE, "no").await;
    assert_eq!(status(&db.pool, run).await, ("cancelled".into(), Some("rejected at $start: no".into())));
    finish(eng, db).await;
}

const EXPIRES: &str = include_str!("../../../tests/workflows/expires.yaml");

#[tokio::test]
async fn an_unanswered_approval_with_a_timeout_resolves_with_timed_out() {
    let (db, _, eng, run, w) = started_until(EXPIRES, "the approval", "ask:1.1:waiting").await;
    assert!(w.text.starts_with("Waiting for approval at ask: Ship it? (deadline ") && w.text.ends_with(" UTC)"), "{}", w.text);
    match &w.substate {
        Some(Substate::AwaitingSignal { approval: true, prompt, deadline: Some(_), .. }) => assert_eq!(prompt.as_deref(), Some("Ship it?")),
        other => panic!("{other:?}"),
    }
    assert_ended(&db.pool, run, ("completed", None), &["ask:1.1:succeeded", "late:1.1:succeeded", "unanswered:1.1:succeeded"]).await;
    let (output, timed_out): (Value, bool) =
        sqlx::query_as("SELECT output, timed_out FROM steps WHERE run_id = $1 AND node = 'ask'").bind(run).fetch_one(&db.pool).await.unwrap();
    assert_eq!((output, timed_out), (json!({ "timed_out": true }), true));
    let decision: String = scalar(&db.pool, "SELECT decision FROM approvals WHERE run_id = $1", run).await;
    assert_eq!(decision, "timed_out");
    assert_eq!(scalar::<i64>(&db.pool, "SELECT count(*) FROM run_events WHERE run_id = $1 AND kind = 'run.wait_expired'", run).await, 1);
    finish(eng, db).await;
}

#[tokio::test]
async fn a_wait_until_a_time_sleeps_until_then_and_one_in_the_past_does_not() {
    let db = test_db().await;
    // The time as the definition states it, to the millisecond.
    let text = (chrono::Utc::now() + chrono::Duration::milliseconds(2500)).to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let until = chrono::DateTime::parse_from_rfc3339(&text).unwrap().to_utc();
    let source = format!(
        "name: until
nodes:
  nap:
    wait: {{ until: \"{text}\" }}
  past:
    wait: {{ until: \"2020-01-01T00:00:00Z\" }}
"
    );
    let s = seed(&db.pool, "acme", &source).await;
    let eng = Engine::executing(&db, "e1", None);
    let run = submit_new(&db.pool, new_run(&s)).await;
    let w = why_once(&db.pool, s.org, run, "the waits", |s| has(s, "nap:1.1:waiting") && has(s, "past:1.1:succeeded")).await;
    assert_eq!(name(&w), Some("sleeping"));
    assert_eq!(w.text, format!("Asleep until {} (wait at nap)", until.format("%H:%M:%S UTC")));
    assert_eq!(status(&db.pool, run).await.0, "completed");
    let ended: chrono::DateTime<chrono::Utc> = scalar(&db.pool, "SELECT ended_at FROM steps WHERE run_id = $1 AND node = 'nap'", run).await;
    let late = ended - until;
    assert!(late >= chrono::Duration::zero(), "woke {late} before its time");
    finish(eng, db).await;
}

const EVENT: &str = include_str!("../../../tests/workflows/event.yaml");

#[tokio::test]
async fn an_event_wait_awaits_its_event_until_its_deadline() {
    let (db, s, eng, run, w) = started_until(EVENT, "the wait", "merged:1.1:waiting").await;
    assert_eq!(w.words, "waiting for pull_request.closed");
    match &w.substate {
        Some(Substate::AwaitingSignal { approval: false, signal, deadline: Some(_), .. }) => assert_eq!(signal, "pull_request.closed"),
        other => panic!("{other:?}"),
    }
    assert!(w.text.starts_with("Waiting for pull_request.closed at merged (deadline "), "{}", w.text);
    cancel(&db.pool, s.org, run, "done looking").await;
    finish(eng, db).await;
}

const DRY: &str = include_str!("../../../tests/workflows/dry.yaml");

#[tokio::test]
async fn a_dry_run_stubs_effects_answers_approvals_and_is_deleted_a_day_after_it_ends() {
    let (db, s, eng, effects) = started_recording(DRY).await;
    add_workflow(&db.pool, &s, "leaf", LEAF_QUICK).await;
    let run = submit_new(&db.pool, NewRun { dry_run: true, needs_approval: true, ..new_run(&s) }).await;
    assert_eq!(status(&db.pool, run).await, ("completed".into(), None));
    let child = child_of(&db.pool, run).await;
    assert_eq!(status(&db.pool, child).await.0, "completed");
    assert!(scalar::<bool>(&db.pool, "SELECT dry_run FROM runs WHERE run_id = $1", child).await);
    // Nothing was executed, and the approvals were answered at once, with the form's defaults.
    assert!(effects.of(run).is_empty() && effects.of(child).is_empty());
    let answers: Vec<(String, String, Value)> =
        sqlx::query_as("SELECT node, decision, answer FROM approvals WHERE run_id = $1 ORDER BY node").bind(run).fetch_all(&db.pool).await.unwrap();
    assert_eq!(answers, [("$start".into(), "approved".into(), json!({})), ("ask".into(), "approved".into(), json!({ "size": "m" }))]);
    assert_eq!(scalar::<Value>(&db.pool, "SELECT output FROM steps WHERE run_id = $1 AND node = 'build'", run).await, json!({ "dry_run": true }));

    // A rerun of a dry run is dry, and keeps its source's id while the source exists.
    let again = rerun(&db.pool, s.org, run, &engine::definition::parse(DRY).unwrap(), &[]).await;
    assert_eq!(status(&db.pool, again).await.0, "completed");
    assert!(scalar::<bool>(&db.pool, "SELECT dry_run FROM runs WHERE run_id = $1", again).await);

    // Each is kept for a day after it ends.
    let due: f64 = scalar(&db.pool, "SELECT extract(epoch FROM due_at - now())::float8 FROM wakes WHERE run_id = $1 AND reason = 'retention'", run).await;
    assert!((86_000.0..86_400.0).contains(&due), "retention due in {due} s");
    // A day later: the parent and its child go in one batch, the source of a rerun too.
    fire(&db.pool, child, "retention").await;
    fire(&db.pool, run, "retention").await;
    until("the dry run was not deleted", Duration::from_secs(10), async || {
        scalar::<i64>(&db.pool, "SELECT count(*) FROM runs WHERE run_id = $1", run).await == 0
    })
    .await;
    for table in ["runs", "steps", "run_events", "approvals", "wakes"] {
        let n: i64 =
            sqlx::query_scalar(&format!("SELECT count(*) FROM {table} WHERE run_id = ANY($1)")).bind(vec![run.0, child.0]).fetch_one(&db.pool).await.unwrap();
        assert_eq!(n, 0, "{table} kept rows of deleted runs");
    }
    let source: Option<RunId> = scalar(&db.pool, "SELECT source_run_id FROM runs WHERE run_id = $1", again).await;
    assert_eq!(source, None, "the rerun outlives its source");
    finish(eng, db).await;
}

const RERUN: &str = include_str!("../../../tests/workflows/rerun.yaml");

#[tokio::test]
async fn a_rerun_runs_everything_again_and_a_rerun_from_a_node_reuses_what_came_before() {
    let (db, s, eng, effects) = started_recording(RERUN).await;
    let input = json!({ "ticket": "T-7" });
    let first = submit_new(&db.pool, with_input(&s, input.clone())).await;
    assert_eq!(status(&db.pool, first).await.0, "completed");

    // A rerun is a new run with the same input that does everything again.
    let def = engine::definition::parse(RERUN).unwrap();
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    let err = runs::rerun(&mut ch, s.org, RunId::mint(), &def, &[]).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound("run")), "{err}");
    drop(ch);
    let again = rerun(&db.pool, s.org, first, &def, &[]).await;
    assert_eq!(status(&db.pool, again).await.0, "completed");
    assert_eq!(scalar::<Value>(&db.pool, "SELECT input FROM runs WHERE run_id = $1", again).await, input);
    let mut done = effects.of(again);
    done.sort();
    assert_eq!(done, ["build 1 1", "docs 1 1", "plan 1 1", "ship 1 1"]);

    // From `build`: plan and docs are reused with their outputs, not executed.
    let from_build = rerun(&db.pool, s.org, first, &def, &["build"]).await;
    assert_eq!(status(&db.pool, from_build).await.0, "completed");
    assert_eq!(effects.of(from_build), ["build 1 1", "ship 1 1"]);
    let reused: Vec<(String, Value)> = sqlx::query_as(
        "SELECT n.node, n.output FROM steps n JOIN steps o ON o.step_id = n.reused_from \
         WHERE n.run_id = $1 AND o.run_id = $2 AND o.output = n.output ORDER BY n.node",
    )
    .bind(from_build)
    .bind(first)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(reused.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["docs", "plan"]);

    // From `plan`, a first node beside another: docs is reused, plan starts anyway.
    let from_plan = rerun(&db.pool, s.org, first, &def, &["plan"]).await;
    assert_eq!(status(&db.pool, from_plan).await.0, "completed");
    assert_eq!(effects.of(from_plan), ["plan 1 1", "build 1 1", "ship 1 1"]);
    assert_eq!(steps_of(&db.pool, from_plan).await, ["docs:1.1:succeeded", "plan:1.1:succeeded", "build:1.1:succeeded", "ship:1.1:succeeded"]);
    finish(eng, db).await;
}

const CANCEL: &str = include_str!("../../../tests/workflows/cancel.yaml");

#[tokio::test]
async fn cancel_removes_pending_steps_and_refuses_the_holders_later_completion() {
    let (db, s, eng, effects) = started_recording(CANCEL).await;
    let input = json!({ "test": { "step_ms": { "slow": 1500 }, "fail_attempts": { "flaky": 1 } } });
    let run = submit_new(&db.pool, with_input(&s, input)).await;
    let w = why_once(&db.pool, s.org, run, "a running step and a backoff", |s| has(s, "slow:1.1:running") && has(s, "flaky:1.2:pending")).await;
    assert_eq!(w.text, "Running slow on engine e1 (and 1 more open step)");

    cancel(&db.pool, s.org, run, "superseded").await;
    assert_eq!(steps_of(&db.pool, run).await, ["slow:1.1:cancelled:superseded", "flaky:1.1:failed:exit_code:1", "flaky:1.2:cancelled:superseded"]);
    assert_eq!(scalar::<i64>(&db.pool, "SELECT count(*) FROM wakes WHERE run_id = $1", run).await, 0);
    // The holder learns of it at its next heartbeat.
    let slow: StepId = scalar(&db.pool, "SELECT step_id FROM steps WHERE run_id = $1 AND node = 'slow'", run).await;
    assert_eq!(steps::heartbeat(&db.pool, s.org, slow, "engine:e1").await.unwrap(), StepState::Cancelled);
    // Its work ends anyway; the completion it reports is refused and nothing moves.
    until("the slow step never finished", Duration::from_secs(10), async || effects.of(run).contains(&"slow 1 1".to_owned())).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(steps_of(&db.pool, run).await[0], "slow:1.1:cancelled:superseded");
    let last: String = scalar(&db.pool, "SELECT kind FROM run_events WHERE run_id = $1 ORDER BY seq DESC LIMIT 1", run).await;
    assert_eq!(last, "run.cancelled");
    finish(eng, db).await;
}

const TWO_CREW: &str = include_str!("../../../tests/workflows/two_crew.yaml");

#[tokio::test]
async fn a_draining_engine_stops_claiming_finishes_what_it_holds_and_returns_in_time() {
    let (db, s, draining, effects) = started_recording(TWO_CREW).await;
    let input = json!({ "test": { "step_ms": 1500 } });
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(submit_new(&db.pool, with_input(&s, input.clone())).await);
    }
    for &run in &held {
        until_steps(&db.pool, run, "the first step held", |s| has(s, "first:1.1:running")).await;
    }
    draining.drain.cancel();
    // Submitted after the drain began: the draining engine must not take it.
    let late = submit_new(&db.pool, with_input(&s, input.clone())).await;
    let returned = tokio::time::timeout(Duration::from_secs(60), draining.task).await;
    assert!(matches!(returned, Ok(Ok(Ok(())))), "the pool did not return within the drain time: {returned:?}");

    // What it held finished and was recorded; what came next was left for others, unleased.
    for &run in &held {
        assert_eq!(steps_of(&db.pool, run).await, ["first:1.1:succeeded", "second:1.1:pending"]);
        assert_eq!(effects.of(run), ["first 1 1"]);
    }
    assert!(steps_of(&db.pool, late).await.is_empty());
    assert_eq!(name(&why(&db.pool, s.org, late).await), Some("queued"));
    let leased: i64 = sqlx::query_scalar("SELECT count(*) FROM steps WHERE state IN ('leased', 'running')").fetch_one(&db.pool).await.unwrap();
    assert_eq!(leased, 0);

    // Another engine picks everything up.
    let other = Engine::executing(&db, "e2", Some(&effects.path));
    for &run in held.iter().chain([&late]) {
        assert_eq!(status(&db.pool, run).await.0, "completed");
    }
    other.stop();
    draining.abort.cancel();
    db.finish().await;
}

#[tokio::test]
async fn why_reports_queued_and_held_runs_and_only_for_the_runs_org() {
    let (db, s) = seeded(TWO_CREW).await;
    // No engine runs: the run has started nothing.
    let run = submit_new(&db.pool, new_run(&s)).await;
    let w = why(&db.pool, s.org, run).await;
    assert_eq!((name(&w), w.words.as_str(), w.text.as_str()), (Some("queued"), "queued", "Queued: nothing has started yet"));
    // A pause holds the runs submitted after it (admission); the one admitted before goes on.
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    workflows::set_paused(&mut ch, s.org, s.workflow, true).await.unwrap();
    ch.commit().await.unwrap();
    let held = submit_new(&db.pool, new_run(&s)).await;
    let w = why(&db.pool, s.org, held).await;
    assert_eq!((name(&w), w.text.as_str()), (Some("held"), "Held: workflow wf is paused"));
    assert_eq!(why(&db.pool, s.org, run).await.text, "Queued: nothing has started yet");

    let err = substate::why(&db.pool, OrgId::mint(), run).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound("run")), "{err}");
    let other = submit_new(&db.pool, new_run(&s)).await;
    let both = substate::whys(&db.pool, s.org, &[other, RunId::mint(), run]).await.unwrap();
    assert_eq!(both.iter().map(|w| w.run).collect::<Vec<_>>(), [other, run]);
    db.discard().await;
}

#[tokio::test]
async fn the_queries_behind_why_are_served_by_indexes() {
    let (db, s, run) = submitted(TWO_CREW).await;
    let mut conn = db.pool.pool().acquire().await.unwrap();
    // Tables this small are read whole whatever the indexes; forbid that to see which exist.
    sqlx::query("SET enable_seqscan = off").execute(&mut *conn).await.unwrap();
    for (what, sql) in substate::QUERIES {
        let ids = if what == "hosts" { vec![s.project.0] } else { vec![run.0] };
        let explain = format!("EXPLAIN {sql}");
        let mut query = sqlx::query_scalar(&explain).bind(s.org).bind(ids);
        if what == "hosts" {
            query = query.bind(24);
        }
        let plan: Vec<String> = query.fetch_all(&mut *conn).await.unwrap_or_else(|e| panic!("EXPLAIN {what}: {e}"));
        let plan = plan.join("\n");
        assert!(!plan.contains("Seq Scan"), "{what} reads a table whole:\n{plan}");
    }
    drop(conn);
    db.discard().await;
}

const VERSIONED_V1: &str = include_str!("../../../tests/workflows/versioned_v1.yaml");
const VERSIONED_V2: &str = include_str!("../../../tests/workflows/versioned_v2.yaml");

#[tokio::test]
async fn a_running_run_keeps_its_version_when_a_new_one_is_uploaded() {
    let (db, s, eng, [old]) = started_runs(VERSIONED_V1, [json!({})]).await;
    until_steps(&db.pool, old, "the approval waiting", |s| has(s, "ask:1.1:waiting")).await;

    let (_, version) = add_workflow(&db.pool, &s, "wf", VERSIONED_V2).await;
    assert_eq!(version, 2);
    let new = submit_new(&db.pool, NewRun { version, ..new_run(&s) }).await;
    for run in [old, new] {
        until_steps(&db.pool, run, "the approval waiting", |s| has(s, "ask:1.1:waiting")).await;
        approve(&db.pool, s.org, run, "ask", json!({})).await;
    }
    assert_eq!(until_done(&db.pool, old, Duration::from_secs(30)).await.0, "completed");
    assert_eq!(until_done(&db.pool, new, Duration::from_secs(30)).await.0, "completed");
    // The run started on version 1 walked version 1's graph to its end; the new one version 2's.
    assert_eq!(steps_of(&db.pool, old).await, ["ask:1.1:succeeded", "first:1.1:succeeded"]);
    assert_eq!(steps_of(&db.pool, new).await, ["ask:1.1:succeeded", "second:1.1:succeeded"]);
    let versions: Vec<i32> = sqlx::query_scalar("SELECT workflow_version FROM runs WHERE run_id = ANY($1) ORDER BY created_at")
        .bind(vec![old.0, new.0])
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(versions, [1, 2]);
    finish(eng, db).await;
}

const PROMPTED: &str = include_str!("../../../tests/workflows/prompted.yaml");

#[tokio::test]
async fn an_approval_prompt_is_rendered_and_its_deadline_is_a_time() {
    let (db, _, eng, [run]) = started_runs(PROMPTED, [json!({ "title": "the widget" })]).await;
    until_steps(&db.pool, run, "the approval waiting", |s| has(s, "ask:1.1:waiting")).await;
    let (prompt, deadline): (String, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("SELECT prompt, deadline FROM approvals WHERE run_id = $1").bind(run).fetch_one(&db.pool).await.unwrap();
    assert_eq!(prompt, "Ship the widget?");
    let attrs: Value =
        sqlx::query_scalar("SELECT attrs FROM run_events WHERE run_id = $1 AND kind = 'run.awaiting'").bind(run).fetch_one(&db.pool).await.unwrap();
    assert_eq!(attrs["prompt"], "Ship the widget?");
    let said: chrono::DateTime<chrono::Utc> = serde_json::from_value(attrs["deadline"].clone()).unwrap_or_else(|e| panic!("{attrs}: {e}"));
    assert_eq!(said, deadline, "the event names when the approval times out");
    finish(eng, db).await;
}

const BAD_CHILD_INPUT: &str = include_str!("../../../tests/workflows/bad_input.yaml");

#[tokio::test]
async fn a_child_input_that_does_not_render_fails_its_step_naming_it() {
    let (db, s) = seeded(BAD_CHILD_INPUT).await;
    add_workflow(&db.pool, &s, "leaf", LEAF_QUICK).await;
    let eng = Engine::executing(&db, "e1", None);
    let run = submit_new(&db.pool, new_run(&s)).await;
    let (status, _) = until_done(&db.pool, run, Duration::from_secs(30)).await;
    assert_eq!(status, "failed");
    let reason: Option<String> = scalar(&db.pool, "SELECT reason FROM steps WHERE run_id = $1 AND node = 'spawn'", run).await;
    let reason = reason.unwrap_or_default();
    assert!(reason.starts_with("template_error: input `big` of spawn"), "{reason}");
    assert_eq!(scalar::<i64>(&db.pool, "SELECT count(*) FROM runs WHERE parent_run_id = $1", run).await, 0, "no child with an empty input");
    finish(eng, db).await;
}

#[tokio::test]
async fn a_rerun_of_a_workflow_that_requires_approval_waits_for_it_again() {
    let (db, s, eng) = started(GUARDED).await;
    let run = submit_new(&db.pool, NewRun { needs_approval: true, ..new_run(&s) }).await;
    until_steps(&db.pool, run, "the run parked", |s| has(s, "$start:1.1:waiting")).await;
    approve_start(&db.pool, s.org, run).await;
    assert_eq!(until_done(&db.pool, run, Duration::from_secs(30)).await.0, "completed");

    // Rerun whole, and retried from its node: both park at `$start` until a person approves.
    let def = engine::definition::parse(GUARDED).unwrap();
    for from in [&[][..], &["build"]] {
        let again = rerun(&db.pool, s.org, run, &def, from).await;
        until_steps(&db.pool, again, "the rerun parked", |s| has(s, "$start:1.1:waiting")).await;
        assert_eq!(name(&why(&db.pool, s.org, again).await), Some("awaiting_signal"));
        assert!(!steps_of(&db.pool, again).await.iter().any(|s| s.starts_with("build:")), "nothing ran before the approval");
    }
    finish(eng, db).await;
}

const EVENT_WAIT_SHORT: &str = include_str!("../../../tests/workflows/short.yaml");
const EVENT_WAIT: &str = include_str!("../../../tests/workflows/patient.yaml");

/// The kinds of a run's lifecycle events, in order.
async fn lifecycle(pool: &Db, run: RunId) -> Vec<String> {
    sqlx::query_scalar("SELECT kind FROM run_events WHERE run_id = $1 AND kind LIKE 'run.%' ORDER BY seq").bind(run).fetch_all(pool).await.unwrap()
}

#[tokio::test]
async fn an_event_wait_announces_itself_expires_and_is_withdrawn() {
    let (db, s) = seeded(EVENT_WAIT_SHORT).await;
    let (patient, version) = add_workflow(&db.pool, &s, "patient", EVENT_WAIT).await;
    let eng = Engine::executing(&db, "e1", None);

    // Its own timeout passes: the wait resolves timed out, and says so.
    let short = submit_new(&db.pool, new_run(&s)).await;
    assert_eq!(until_done(&db.pool, short, Duration::from_secs(30)).await.0, "completed");
    assert_eq!(lifecycle(&db.pool, short).await, ["run.started", "run.awaiting", "run.wait_expired", "run.completed"]);
    let output: Value = scalar(&db.pool, "SELECT output FROM steps WHERE run_id = $1", short).await;
    assert_eq!(output["timed_out"], true);

    // Without a timeout it waits a day at most, and its deadline says when; a cancel withdraws it.
    let waiting = submit_new(&db.pool, NewRun { workflow: patient, version, ..new_run(&s) }).await;
    until_steps(&db.pool, waiting, "the wait", |s| has(s, "merged:1.1:waiting")).await;
    let due_h: f64 =
        scalar(&db.pool, "SELECT extract(epoch FROM due_at - now())::float8 / 3600 FROM wakes WHERE run_id = $1 AND reason = 'timeout'", waiting).await;
    assert!((23.9..=24.0).contains(&due_h), "due in {due_h} h");
    let attrs: Value = scalar(&db.pool, "SELECT attrs FROM run_events WHERE run_id = $1 AND kind = 'run.awaiting'", waiting).await;
    assert_eq!((attrs["waits_on"].as_str(), attrs["event"].as_str()), (Some("github"), Some("pull_request.closed")), "{attrs}");
    assert!(attrs["deadline"].is_string(), "{attrs}");
    cancel(&db.pool, s.org, waiting, "not needed").await;
    assert_eq!(lifecycle(&db.pool, waiting).await, ["run.started", "run.awaiting", "run.wait_withdrawn", "run.cancelled"]);
    finish(eng, db).await;
}
