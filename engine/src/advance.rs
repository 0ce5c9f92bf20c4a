//! Advancing one run: what the engine does with a run it has locked.
//!
//! It handles the step-level wakes that came due (a lease that lapsed, a timeout, a wait's
//! end, a backoff), settles steps that waited on a child run, then asks the walker what to
//! start and starts it. Nodes the engine resolves itself (trigger, decision, end) are
//! resolved at once and the walk asked again, so one advance takes a run as far as it can go
//! without waiting for anything outside. Every write goes through the store.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::catalog::Catalog;
use crate::definition::timeouts::{OUTPUT_TIMEOUT, step_timeout};
use crate::definition::{self, Definition, Node, NodeKind, Wait};
use crate::ids::{RunId, StepId, WorkflowId};
use crate::run_context::context;
use crate::state::{StepState, run, step};
use crate::store::steps::{self, Failure, FailureClass, Initial, LEASE_GRACE, NewStep, StepRow};
use crate::store::{Change, Result, StoreError, admission, approvals, budgets, runs};
use crate::walk::{self, Outcome, StepRecord};

/// How long a `wait: { event: … }` waits without its own `timeout:`; then it resolves with
/// `timed_out: true`, like other waits.
pub const EVENT_WAIT_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// A wake claimed for a run.
#[derive(Debug, Clone)]
pub struct Wake {
    pub step: Option<StepId>,
    pub reason: String,
}

/// A step the engine leased to itself in this change, to execute after commit.
#[derive(Debug, Clone)]
pub struct ToExecute {
    pub org: crate::ids::OrgId,
    pub run: RunId,
    pub step: StepId,
    pub node: String,
    pub kind: String,
    pub visit: i32,
    pub attempt: i32,
    pub input: Value,
    /// For a crew step: the harness, model and prompt (as written, not rendered) it runs with,
    /// after the run's edit-and-retry override of the node (`store::operator::NodeOverride`).
    pub crew: Option<CrewSpec>,
    /// The run's trace context: the step's span is its child (`crate::trace::step_span`).
    pub traceparent: Option<String>,
    /// The node's timeout: past it the step has failed (its wake records that), and the
    /// execution is stopped rather than left to finish its effects.
    pub timeout: Duration,
}

/// What a crew step runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrewSpec {
    pub harness: String,
    pub model: Option<String>,
    pub prompt: String,
    /// An operator's edit-and-retry replaced something of the node's.
    pub edited: bool,
}

/// What an engine process can do itself.
pub struct Engine<'a> {
    pub holder: &'a str,
    pub catalog: &'a Catalog,
    /// Whether this engine executes crew, gate and output steps itself (the test executor);
    /// otherwise they wait for hosts and integrations.
    pub executes_leased_steps: bool,
    /// Whether this engine executes output steps itself, through the GitHub App
    /// (`github::outputs`); otherwise they go to the test executor or wait.
    pub executes_outputs: bool,
    /// A draining engine takes no new work: a step it would execute itself is left pending
    /// with an `execute` wake, for another engine to take.
    pub draining: bool,
    /// How long an event wait without a `timeout:` waits ([`EVENT_WAIT_TIMEOUT`] unless the
    /// operator shortens it).
    pub event_wait_timeout: Duration,
}

/// Advances a run locked in `ch`. Returns the steps leased to this engine.
pub async fn advance(ch: &mut Change, engine: &Engine<'_>, run_id: RunId, wakes: &[Wake]) -> Result<Vec<ToExecute>> {
    let mut out = Vec::new();
    let Some(run) = runs::get(ch, run_id).await? else { return Ok(out) };
    if run.status().is_terminal() {
        if run.dry_run && wakes.iter().any(|w| w.reason == "retention") {
            runs::delete_dry(ch, run_id).await?;
        }
        return Ok(out);
    }
    if let Some(parent) = run.parent_run_id {
        let status: Option<String> = sqlx::query_scalar("SELECT status FROM runs WHERE run_id = $1").bind(parent).fetch_optional(ch.conn()).await?;
        if status.as_deref() != Some("running") {
            runs::finish::<run::Cancelled>(ch, run_id, Some(&format!("parent {parent} is no longer running"))).await?;
            return Ok(out);
        }
    }
    let def = engine.catalog.get(ch.conn(), run.workflow_id, run.workflow_version).await?;

    let mut history = steps::of_run(ch, run_id).await?;
    let mut changed = false;
    for wake in wakes {
        if let Some(step) = wake.step {
            on_step_wake(ch, engine, &run, &def, step, &wake.reason, &mut out).await?;
            changed = true;
        }
    }
    if history.iter().any(|s| s.kind == "workflow" && s.state() == StepState::Waiting) {
        settle_children(ch, run_id).await?;
        changed = true;
    }
    if changed {
        history = steps::of_run(ch, run_id).await?;
    }

    if run.needs_approval {
        match history.iter().rev().find(|s| s.node == approvals::RUN_APPROVAL_NODE) {
            None => {
                let step = approvals::open(ch, run_id, approvals::RUN_APPROVAL_NODE, 1, approvals::START_PROMPT, &BTreeMap::new(), None).await?;
                if run.dry_run {
                    approvals::answer_dry(ch, run_id, step).await?;
                    history = steps::of_run(ch, run_id).await?;
                } else {
                    return Ok(out);
                }
            }
            Some(s) if s.state() == StepState::Waiting => return Ok(out),
            Some(s) if s.state() != StepState::Succeeded => return Ok(out),
            Some(_) => {}
        }
    }
    // Admission (`store::admission`): a run that has not started is admitted before its first
    // step (in this change, so a throttle counts real starts), or stays in line.
    if run.admitted_at.is_none() && history.iter().all(|s| s.node == approvals::RUN_APPROVAL_NODE) && !admission::admit(ch, &run, &def).await? {
        return Ok(out);
    }

    // Each pass resolves what the engine can resolve itself; a bound keeps a bad definition
    // from spinning (validation already refuses cycles without a gate or decision).
    for _ in 0..1_000 {
        let records: Vec<StepRecord> = history.iter().filter(|s| s.node != approvals::RUN_APPROVAL_NODE).map(record).collect();
        let walked = with_rerun_starts(&def, &run, &history, walk::walk(&def, &records));
        if let Some(outcome) = walked.finished {
            match outcome {
                Outcome::Completed { reason } => runs::finish::<run::Completed>(ch, run_id, reason.as_deref()).await?,
                Outcome::Failed { reason } => runs::finish::<run::Failed>(ch, run_id, Some(&reason)).await?,
            };
            out.retain(|e| e.run != run_id);
            return Ok(out);
        }
        let mut resolved_any = false;
        for start in &walked.start {
            let Some(node) = def.node(&start.node) else {
                return Err(StoreError::Invalid(format!("walker started unknown node {}", start.node)));
            };
            resolved_any |= start_node(ch, engine, &run, node, start, &history, &mut out).await?;
        }
        if !resolved_any {
            return Ok(out);
        }
        history = steps::of_run(ch, run_id).await?;
    }
    Err(StoreError::Invalid(format!("{run_id} did not settle after 1000 passes")))
}

/// A rerun from a node starts that node even where the walker would not: the walker starts a
/// first node (one with no edge into it) only on an empty history, and a rerun's history opens
/// with the steps it reused. A `from` node is started when it has no step yet and none of its
/// predecessors is to run again (one that is still comes first, through the walker). What
/// follows it waits for it: a join after it and a reused sibling would otherwise start now,
/// and again once it is done.
fn with_rerun_starts(def: &Definition, run: &runs::RunRow, history: &[StepRow], mut walked: walk::Walk) -> walk::Walk {
    let Some(from) = run.source_from_node.as_deref() else { return walked };
    if !matches!(walked.finished, None | Some(Outcome::Completed { reason: None })) {
        return walked;
    }
    let from: Vec<String> = from.split(',').map(str::to_owned).collect();
    let again = def.downstream(&from);
    let extra: Vec<walk::Start> = from
        .iter()
        .filter(|f| !history.iter().any(|s| &s.node == *f) && !walked.start.iter().any(|s| &s.node == *f))
        .filter(|f| def.node(f).is_some_and(|n| !n.after.iter().any(|p| again.contains(p))))
        .map(|f| walk::Start { node: f.clone(), visit: 1, attempt: 1, delay: Duration::ZERO })
        .collect();
    if !extra.is_empty() {
        let names: Vec<String> = extra.iter().map(|s| s.node.clone()).collect();
        let behind = def.downstream(&names);
        walked.finished = None;
        walked.start.retain(|s| !behind.contains(&s.node));
        walked.start.extend(extra);
    }
    walked
}

/// The walker's view of a stored step.
fn record(s: &StepRow) -> StepRecord {
    let finished_seq = s.finished_seq.unwrap_or(s.started_seq) as u64;
    let state = match s.state() {
        StepState::Succeeded => {
            walk::StepState::Succeeded { route: s.output.as_ref().and_then(|o| o.get("route")).and_then(Value::as_str).map(str::to_owned), finished_seq }
        }
        StepState::Failed => walk::StepState::Failed {
            reason: s.reason.clone().unwrap_or_else(|| "failed".into()),
            class: match s.failure_class.as_deref().map(FailureClass::parse) {
                Some(FailureClass::Infrastructure) => walk::FailureClass::Infrastructure,
                Some(FailureClass::Final) => walk::FailureClass::Final,
                _ => walk::FailureClass::Ordinary,
            },
            exit_code: s.exit_code,
            finished_seq,
        },
        StepState::Cancelled => walk::StepState::Cancelled,
        _ => walk::StepState::Open,
    };
    StepRecord { node: s.node.clone(), visit: s.visit as u32, attempt: s.attempt as u32, started_seq: s.started_seq as u64, state }
}

/// Starts one node; returns true when it was resolved at once (the walk may go on).
#[allow(clippy::too_many_arguments)]
async fn start_node(
    ch: &mut Change, engine: &Engine<'_>, run: &runs::RunRow, node: &Node, start: &walk::Start, history: &[StepRow], out: &mut Vec<ToExecute>,
) -> Result<bool> {
    let run_id = run.run_id;
    // A crew step needs a host that runs its harness (edit-and-retry may have changed it).
    let requires = match &node.kind {
        NodeKind::Crew(c) => {
            let edited = match run.source_run_id {
                Some(_) => crate::store::operator::node_override(ch, run_id, &node.id).await?.and_then(|o| o.harness),
                None => None,
            };
            let harness = edited.as_deref().unwrap_or(c.harness.name());
            crate::hosts::crew_requires(&node.requires, harness)
        }
        _ => node.requires.clone(),
    };
    let new = |initial| NewStep {
        node: &node.id,
        kind: node.kind.name(),
        visit: start.visit,
        attempt: start.attempt,
        requires: requires.clone(),
        initial,
        delay: start.delay,
    };
    match &node.kind {
        NodeKind::Trigger | NodeKind::End(_) => {
            let step = steps::create(ch, run_id, new(Initial::Pending)).await?;
            // Resolved here at once: its span covers the resolution.
            let span = crate::trace::step_span(run.traceparent.as_deref(), run_id, step, &node.id, node.kind.name(), start.attempt as i32);
            steps::succeed::<step::Pending>(ch, run_id, step, &json!({}), false).await?;
            crate::trace::record_outcome(&span, "succeeded", None);
            Ok(true)
        }
        NodeKind::Decision(d) => {
            let step = steps::create(ch, run_id, new(Initial::Pending)).await?;
            let ctx = context(ch, run, history).await?;
            let mut chosen = None;
            for case in &d.cases {
                match definition::expr::eval_bool(&case.condition, &ctx) {
                    Ok(true) => {
                        chosen = Some(case.to.clone());
                        break;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        let failure = Failure::new(format!("route:$error: {e}"), FailureClass::Ordinary);
                        steps::fail::<step::Pending>(ch, run_id, step, &failure, None).await?;
                        return Ok(true);
                    }
                }
            }
            match chosen.or_else(|| d.default.clone()) {
                Some(to) => steps::succeed::<step::Pending>(ch, run_id, step, &json!({ "route": to }), false).await?,
                None => steps::fail::<step::Pending>(ch, run_id, step, &Failure::new("route:$unknown", FailureClass::Ordinary), None).await?,
            };
            Ok(true)
        }
        NodeKind::Wait(wait) => {
            let step = steps::create(ch, run_id, new(Initial::Waiting)).await?;
            let due = match wait {
                Wait::For(d) => *d,
                Wait::Until(t) => until(ch, *t).await?,
                // An event that never comes must not hold the run forever unannounced.
                Wait::Event(_) => node.timeout.unwrap_or(engine.event_wait_timeout),
            };
            if run.dry_run {
                steps::succeed::<step::Waiting>(ch, run_id, step, &json!({ "dry_run": true }), false).await?;
                return Ok(true);
            }
            ch_wake(ch, run_id, step, due, "timeout").await?;
            if let Wait::Event(event) = wait {
                crate::store::github::awaiting_event(ch, run_id, step, &node.id, event, due)?;
                // Woken by the webhook of the pull request or issue it watches.
                return crate::github::watch::start_event_wait(ch, run, step, event, history).await;
            }
            Ok(false)
        }
        NodeKind::Approval(a) => {
            // The prompt is rendered over the run's context, like a crew prompt.
            let ctx = context(ch, run, history).await?;
            let prompt = match definition::template::render(&a.prompt, &ctx) {
                Ok(p) => p,
                Err(e) => {
                    let step = steps::create(ch, run_id, new(Initial::Pending)).await?;
                    let failure = Failure::new(crate::store::cap(&format!("template_error: the prompt of {}: {e}", node.id)), FailureClass::Final);
                    steps::fail::<step::Pending>(ch, run_id, step, &failure, None).await?;
                    return Ok(true);
                }
            };
            let step = approvals::open(ch, run_id, &node.id, start.visit, &prompt, &a.fields, a.timeout.or(node.timeout)).await?;
            if run.dry_run {
                approvals::answer_dry(ch, run_id, step).await?;
                return Ok(true);
            }
            Ok(false)
        }
        NodeKind::Workflow(child) => {
            let step = steps::create(ch, run_id, new(Initial::Waiting)).await?;
            let target: Option<(WorkflowId, i32)> =
                sqlx::query_as("SELECT workflow_id, latest_version FROM workflows WHERE project_id = $1 AND org_id = $2 AND name = $3 AND latest_version > 0")
                    .bind(run.project_id)
                    .bind(run.org_id)
                    .bind(&child.name)
                    .fetch_optional(ch.conn())
                    .await?;
            let Some((workflow, version)) = target else {
                let failure = Failure::new(format!("workflow `{}` not found", child.name), FailureClass::Final);
                steps::fail::<step::Waiting>(ch, run_id, step, &failure, None).await?;
                return Ok(true);
            };
            let ctx = context(ch, run, history).await?;
            let mut input = Map::new();
            for (k, tpl) in &child.input {
                match definition::template::render(tpl, &ctx) {
                    Ok(v) => {
                        input.insert(k.clone(), json!(v));
                    }
                    Err(e) => {
                        // Never a silent empty input: the step fails, naming the template.
                        let failure = Failure::new(crate::store::cap(&format!("template_error: input `{k}` of {}: {e}", node.id)), FailureClass::Final);
                        steps::fail::<step::Waiting>(ch, run_id, step, &failure, None).await?;
                        return Ok(true);
                    }
                }
            }
            let child_def = engine.catalog.get(ch.conn(), workflow, version).await?;
            runs::submit(
                ch,
                runs::NewRun {
                    item: run.item_id,
                    parent: Some((run_id, step)),
                    dry_run: run.dry_run,
                    needs_approval: child_def.approval_required,
                    ..runs::NewRun::of_workflow(run.org_id, run.project_id, workflow, version, Value::Object(input))
                },
            )
            .await?;
            Ok(false)
        }
        NodeKind::Crew(_) | NodeKind::Gate(_) | NodeKind::Output(_) => {
            if let NodeKind::Gate(gate) = &node.kind {
                // A gate on checks waits for the webhooks of its commit (`github::watch`).
                if !run.dry_run {
                    let watched = crate::github::watch::start_gate(ch, run, node, gate, start, history, engine.executes_leased_steps).await?;
                    if let Some(resolved) = watched {
                        return Ok(resolved);
                    }
                }
            }
            let step = steps::create(ch, run_id, new(Initial::Pending)).await?;
            if run.dry_run {
                steps::succeed::<step::Pending>(ch, run_id, step, &json!({ "dry_run": true }), false).await?;
                return Ok(true);
            }
            if matches!(node.kind, NodeKind::Crew(_)) {
                // A spent hard budget stops every crew step before it starts; never retried.
                let def = engine.catalog.get(ch.conn(), run.workflow_id, run.workflow_version).await?;
                let per_run = def.budget.usd_per_run.filter(|_| def.budget.hard);
                if budgets::hard_stop(ch.conn(), run.org_id, run.project_id, run_id, per_run).await? {
                    steps::fail::<step::Pending>(ch, run_id, step, &Failure::new(budgets::HARD_STOP, FailureClass::Final), None).await?;
                    return Ok(true);
                }
            }
            if start.delay.is_zero() {
                take_or_offer(ch, engine, run, node, step, out).await?;
            } else {
                ch_wake(ch, run_id, step, start.delay, "execute").await?;
            }
            Ok(false)
        }
    }
}

/// The delay from the database's `now()` (the transaction's start, which the wake adds the
/// delay to) until `t`, in whole milliseconds rounded up as wakes store them: measured on this
/// process's clock, later than that start, the wake would fall due early.
async fn until(ch: &mut Change, t: chrono::DateTime<chrono::Utc>) -> Result<Duration> {
    let ms: f64 =
        sqlx::query_scalar("SELECT ceil(greatest(extract(epoch FROM $1::timestamptz - now()) * 1000, 0))::float8").bind(t).fetch_one(ch.conn()).await?;
    Ok(Duration::from_millis(ms as u64))
}

/// A step that is ready now: this engine executes it, or, draining, leaves it to another
/// engine; without an executor it is offered to the hosts.
async fn take_or_offer(ch: &mut Change, engine: &Engine<'_>, run: &runs::RunRow, node: &Node, step: StepId, out: &mut Vec<ToExecute>) -> Result<()> {
    let executes = match node.kind {
        NodeKind::Output(_) => engine.executes_outputs || engine.executes_leased_steps,
        _ => engine.executes_leased_steps,
    };
    match (executes, engine.draining) {
        (true, false) => lease_to_self(ch, engine, run, node, step, out).await,
        (true, true) => ch_wake(ch, run.run_id, step, Duration::ZERO, "execute").await,
        (false, _) => {
            ch_notify(ch);
            Ok(())
        }
    }
}

/// Leases a ready step to this engine and starts it.
async fn lease_to_self(ch: &mut Change, engine: &Engine<'_>, run: &runs::RunRow, node: &Node, step: StepId, out: &mut Vec<ToExecute>) -> Result<()> {
    let row = steps::lease_and_start(ch, run.run_id, step, engine.holder, step_timeout(node)).await?;
    let crew = match &node.kind {
        NodeKind::Crew(c) => {
            // Only a retry carries overrides: other runs spend no statement on them.
            let edit = match run.source_run_id {
                Some(_) => crate::store::operator::node_override(ch, run.run_id, &node.id).await?,
                None => None,
            };
            let edited = edit.is_some();
            let edit = edit.unwrap_or_default();
            Some(CrewSpec {
                harness: edit.harness.unwrap_or_else(|| c.harness.name().to_owned()),
                model: edit.model.or_else(|| c.model.clone()),
                prompt: edit.prompt.unwrap_or_else(|| c.prompt.clone()),
                edited,
            })
        }
        _ => None,
    };
    out.push(ToExecute {
        org: run.org_id,
        run: run.run_id,
        step,
        node: row.node,
        kind: row.kind,
        visit: row.visit,
        attempt: row.attempt,
        input: run.input.clone(),
        crew,
        traceparent: run.traceparent.clone(),
        timeout: step_timeout(node),
    });
    Ok(())
}

/// A wake that came due for one step.
async fn on_step_wake(
    ch: &mut Change, engine: &Engine<'_>, run: &runs::RunRow, def: &Definition, step_id: StepId, reason: &str, out: &mut Vec<ToExecute>,
) -> Result<()> {
    let run_id = run.run_id;
    let Some(step) = steps::get(ch, run_id, step_id).await? else { return Ok(()) };
    let state = step.state();
    match (reason, state) {
        ("lease_expiry", StepState::Leased | StepState::Running) => {
            // One wake watches a held step for both its lease and its timeout. A host stops
            // its harness at the timeout itself and needs its interrupt grace to collect the
            // result line (cost, tokens): the server's clock only backs it up.
            let timeout = def.node(&step.node).map_or(OUTPUT_TIMEOUT, step_timeout)
                + if step.holder.as_deref().is_some_and(|h| h.starts_with("host:")) { crate::store::hosts::HOST_STOP_GRACE } else { Duration::ZERO };
            let (lapsed_for, ran_for): (Option<f64>, Option<f64>) = sqlx::query_as(
                "SELECT extract(epoch FROM now() - lease_expires_at)::float8, extract(epoch FROM now() - started_at)::float8 FROM steps WHERE step_id = $1",
            )
            .bind(step_id)
            .fetch_one(ch.conn())
            .await?;
            let (lapsed_for, ran_for) = (lapsed_for.unwrap_or(f64::MAX), ran_for.unwrap_or(0.0));
            if lapsed_for >= LEASE_GRACE.as_secs_f64() - 0.001 {
                steps::fail_leased(ch, run_id, step_id, &Failure::new("lease_expired", FailureClass::Infrastructure)).await?;
            } else if ran_for >= timeout.as_secs_f64() - 0.001 {
                steps::fail_leased(ch, run_id, step_id, &Failure::new("timeout", FailureClass::Ordinary)).await?;
            } else {
                // Renewed since: look again when the lease and its grace, or the timeout, run out.
                let again = (LEASE_GRACE.as_secs_f64() - lapsed_for).min(timeout.as_secs_f64() - ran_for);
                ch_wake(ch, run_id, step_id, Duration::from_secs_f64(again.max(0.0)), "lease_expiry").await?;
            }
        }
        ("timeout", StepState::Waiting) => {
            let node = def.node(&step.node);
            match node.map(|n| &n.kind) {
                Some(NodeKind::Approval(_)) => approvals::expire(ch, run_id, step_id).await?,
                Some(NodeKind::Wait(Wait::Event(_))) => {
                    steps::succeed::<step::Waiting>(ch, run_id, step_id, &json!({ "timed_out": true }), true).await?;
                    crate::store::github::event_wait_expired(ch, run_id, step_id, &step.node).await?;
                }
                Some(NodeKind::Gate(_)) => crate::github::watch::gate_timed_out(ch, run, &step).await?,
                Some(NodeKind::Wait(_)) => {
                    steps::succeed::<step::Waiting>(ch, run_id, step_id, &json!({ "timed_out": false }), false).await?;
                }
                _ => {}
            }
        }
        (r, StepState::Waiting) if r.starts_with(crate::store::github::WAKE_PREFIX) => {
            crate::github::watch::on_wake(ch, run, def.node(&step.node), &step, r).await?;
        }
        (r, _) if r.starts_with(crate::store::github::WAKE_PREFIX) => crate::store::github::forget(ch, step_id).await?,
        ("execute", StepState::Pending) => {
            if let Some(node) = def.node(&step.node) {
                take_or_offer(ch, engine, run, node, step_id, out).await?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Resolves `workflow` steps whose child run has ended.
async fn settle_children(ch: &mut Change, run_id: RunId) -> Result<()> {
    let done: Vec<(StepId, RunId, String, Option<String>)> = sqlx::query_as(
        "SELECT s.step_id, c.run_id, c.status, c.reason FROM steps s \
         JOIN runs c ON c.parent_run_id = s.run_id AND c.parent_step_id = s.step_id \
         WHERE s.run_id = $1 AND s.state = 'waiting' AND s.kind = 'workflow' AND c.status <> 'running'",
    )
    .bind(run_id)
    .fetch_all(ch.conn())
    .await?;
    for (step, child, status, reason) in done {
        let output = json!({ "run": child.to_string(), "status": status, "reason": reason });
        if status == "completed" {
            steps::succeed::<step::Waiting>(ch, run_id, step, &output, false).await?;
        } else {
            let failure = Failure::new(format!("child {child} {status}"), FailureClass::Ordinary);
            steps::fail::<step::Waiting>(ch, run_id, step, &failure, Some(&output)).await?;
        }
    }
    Ok(())
}

/// A wake for one of this run's steps; every engine's timer must learn of it.
async fn ch_wake(ch: &mut Change, run: RunId, step: StepId, delay: Duration, reason: &str) -> Result<()> {
    ch.wake(run, Some(step), delay, reason, true).await
}

/// A step became ready for a host: wake the replicas holding hosts' claims.
fn ch_notify(ch: &mut Change) {
    ch.notify_now();
}
