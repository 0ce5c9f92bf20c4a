//! Gates on checks and waits on GitHub events, decided by the engine under the run's lock.
//!
//! A gate with `checks:` is created `waiting` and watches one commit: the head of the pull
//! request the run opened (its latest `pull_request` output), or of the run's own item when
//! that is a pull request. It passes when every named check concluded `success`, `neutral` or
//! `skipped`; it fails (`gate_failed`, so `on_fail` loops) as soon as one concluded otherwise;
//! its timeout (1 h by default) fails it with `timeout`. Check results are read from
//! `github_checks`, which the webhooks keep; a push that moves the pull request's head moves
//! the watch to the new commit.
//!
//! A `wait: { event: pull_request.closed }` watches the same pull request (or the run's item)
//! and succeeds when that event arrives, with the item's state as its output (`merged`,
//! `state`, `number`, `url`), so a decision can route on `nodes.<wait>.output.merged`. A pull
//! request no run opened is watched by no step and left alone.
//!
//! Nothing here calls GitHub, and nothing polls: webhooks write the wakes (`store::github`).

use serde_json::{Map, Value, json};

use crate::definition::{Gate, Node, NodeKind, Wait};
use crate::ids::StepId;
use crate::item_keys::item_key;
use crate::state::step;
use crate::store::github::{self as sg, WAKE_PREFIX, Watch};
use crate::store::runs::RunRow;
use crate::store::steps::{self, Failure, FailureClass, Initial, NewStep, StepRow};
use crate::store::{Change, Result};
use crate::walk;

/// Conclusions that let a gate pass.
const PASSING: [&str; 3] = ["success", "neutral", "skipped"];

/// The pull request (or issue) a run's GitHub steps are about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub repository: String,
    pub number: i64,
    pub head_sha: Option<String>,
}

/// What the run is about on GitHub: the latest pull request one of its outputs opened, else
/// its own item (a pull request or an issue).
pub async fn target(ch: &mut Change, run: &RunRow, history: &[StepRow]) -> Result<Option<Target>> {
    let opened = history.iter().rev().filter(|s| s.kind == "output" && s.state() == crate::state::StepState::Succeeded).find_map(|s| {
        let pr = s.output.as_ref()?.get("pull_request")?;
        Some(Target {
            repository: pr.get("repository")?.as_str()?.to_owned(),
            number: pr.get("number")?.as_i64()?,
            head_sha: pr.get("head_sha").and_then(Value::as_str).map(str::to_owned),
        })
    });
    if let Some(mut t) = opened {
        // The webhooks keep the pull request's head; a push since it was opened moved it.
        let head: Option<Option<String>> = sqlx::query_scalar("SELECT head_sha FROM items WHERE project_id = $1 AND key = $2 AND org_id = $3")
            .bind(run.project_id)
            .bind(item_key(&t.repository, Some(t.number)))
            .bind(run.org_id)
            .fetch_optional(ch.conn())
            .await?;
        if let Some(Some(sha)) = head {
            t.head_sha = Some(sha);
        }
        return Ok(Some(t));
    }
    let Some(item) = run.item_id else { return Ok(None) };
    let data: Option<Value> =
        sqlx::query_scalar("SELECT data FROM items WHERE item_id = $1 AND org_id = $2").bind(item).bind(run.org_id).fetch_optional(ch.conn()).await?;
    let Some(data) = data else { return Ok(None) };
    let (Some(repository), Some(number)) = (data.get("repository").and_then(Value::as_str), data.get("number").and_then(Value::as_i64)) else {
        return Ok(None);
    };
    let head_sha = data.pointer("/head/sha").and_then(Value::as_str).map(str::to_owned);
    Ok(Some(Target { repository: repository.to_owned(), number, head_sha }))
}

/// Starts a gate on checks. `None` when the run has no commit to watch and the engine has a
/// test executor, which then takes the gate as before (tests and benchmarks without GitHub);
/// otherwise `Some(resolved at once)`.
pub async fn start_gate(
    ch: &mut Change, run: &RunRow, node: &Node, gate: &Gate, start: &walk::Start, history: &[StepRow], has_test_executor: bool,
) -> Result<Option<bool>> {
    let target = target(ch, run, history).await?.map(|t| with_pushed_head(t, history)).filter(|t| t.head_sha.is_some());
    if target.is_none() && has_test_executor {
        return Ok(None);
    }
    let new = NewStep {
        node: &node.id,
        kind: node.kind.name(),
        visit: start.visit,
        attempt: start.attempt,
        requires: node.requires.clone(),
        initial: Initial::Waiting,
        delay: std::time::Duration::ZERO,
    };
    let step = steps::create(ch, run.run_id, new).await?;
    let Some(target) = target else {
        // Nothing to read checks of: retrying cannot give the gate a commit.
        steps::fail::<step::Waiting>(ch, run.run_id, step, &Failure::new("gate:no_commit", FailureClass::Final), None).await?;
        return Ok(Some(true));
    };
    let watch = Watch { repository: &target.repository, number: Some(target.number), head_sha: target.head_sha.as_deref(), watch: "checks" };
    sg::watch(ch, run.run_id, step, &watch).await?;
    let timeout = node.timeout.or(gate.timeout).unwrap_or(crate::definition::timeouts::GATE_TIMEOUT);
    ch.wake(run.run_id, Some(step), timeout, "timeout", true).await?;
    let sha = target.head_sha.unwrap_or_default();
    decide_gate(ch, run, step, gate, &target.repository, &sha).await.map(Some)
}

/// A gate before any pull request (build → ci → open_pr) watches the commit the latest crew
/// step pushed to its branch: CI runs on the push, and there is no pull request head yet.
fn with_pushed_head(mut t: Target, history: &[StepRow]) -> Target {
    if t.head_sha.is_none() {
        t.head_sha = history
            .iter()
            .rev()
            .filter(|s| s.kind == "crew" && s.state() == crate::state::StepState::Succeeded)
            .find_map(|s| s.output.as_ref()?.get("head_sha")?.as_str().map(str::to_owned));
    }
    t
}

/// Reads the gate's checks on `sha` and resolves the step when they decide it; returns
/// whether it was resolved.
///
/// A gate visited again after its `on_fail` loop reads only results reported since its
/// previous visit ended: the failure that sent the run back must not fail it again before CI
/// has reported on the new work (a new head, or a re-run on the same one).
async fn decide_gate(ch: &mut Change, run: &RunRow, step: StepId, gate: &Gate, repository: &str, sha: &str) -> Result<bool> {
    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT c.name, c.status, c.conclusion FROM github_checks c \
         WHERE c.project_id = $1 AND c.repository = $2 AND c.head_sha = $3 AND c.name = ANY($4) AND c.org_id = $5 \
           AND c.updated_at > coalesce((SELECT max(p.ended_at) FROM steps p JOIN steps s ON s.step_id = $6 \
                                        WHERE p.run_id = s.run_id AND p.node = s.node AND p.visit < s.visit), '-infinity')",
    )
    .bind(run.project_id)
    .bind(repository.to_lowercase())
    .bind(sha)
    .bind(&gate.checks)
    .bind(run.org_id)
    .bind(step)
    .fetch_all(ch.conn())
    .await?;
    let mut checks = Map::new();
    let mut failed = false;
    let mut passed = 0;
    for (name, status, conclusion) in &rows {
        checks.insert(name.clone(), json!({ "status": status, "conclusion": conclusion }));
        if status == "completed" {
            match conclusion.as_deref() {
                Some(c) if PASSING.contains(&c) => passed += 1,
                _ => failed = true,
            }
        }
    }
    let output = json!({ "head_sha": sha, "repository": repository, "checks": checks });
    if failed {
        steps::fail::<step::Waiting>(ch, run.run_id, step, &Failure::new("gate_failed", FailureClass::Ordinary), Some(&output)).await?;
    } else if passed == gate.checks.len() {
        steps::succeed::<step::Waiting>(ch, run.run_id, step, &output, false).await?;
    } else {
        return Ok(false);
    }
    sg::forget(ch, step).await?;
    Ok(true)
}

/// Starts watching for a `wait: { event }` step just created `waiting`; returns true when the
/// event already happened (a pull request closed before the wait began) and the step is
/// resolved.
pub async fn start_event_wait(ch: &mut Change, run: &RunRow, step: StepId, event: &str, history: &[StepRow]) -> Result<bool> {
    let Some(target) = target(ch, run, history).await? else {
        // Nothing on GitHub to watch: only the wait's timeout can resolve it.
        return Ok(false);
    };
    let watch = Watch { repository: &target.repository, number: Some(target.number), head_sha: None, watch: event };
    sg::watch(ch, run.run_id, step, &watch).await?;
    let data = item_data(ch, run, &target).await?;
    let already = matches!(event, "pull_request.closed" | "issues.closed")
        && data.get("state").and_then(Value::as_str) == Some("closed")
        && event.split('.').next() == Some(if data.get("kind").and_then(Value::as_str) == Some("pull_request") { "pull_request" } else { "issues" });
    if already {
        resolve_wait(ch, run, step, event, &target, &data).await?;
    }
    Ok(already)
}

/// A `github:` wake for a waiting step: a gate reads its checks again (on the pull request's
/// current head), a wait resolves when the event is the one it waits for.
pub async fn on_wake(ch: &mut Change, run: &RunRow, node: Option<&Node>, s: &StepRow, reason: &str) -> Result<()> {
    let Some((repository, number, head_sha, watched)) = sg::watch_of(ch, s.step_id).await? else { return Ok(()) };
    if s.state() != crate::state::StepState::Waiting {
        return sg::forget(ch, s.step_id).await;
    }
    let happened = reason.strip_prefix(WAKE_PREFIX).unwrap_or_default();
    match node.map(|n| &n.kind) {
        Some(NodeKind::Gate(gate)) => {
            let mut sha = head_sha.unwrap_or_default();
            if let Some(n) = number {
                let current: Option<Option<String>> = sqlx::query_scalar("SELECT head_sha FROM items WHERE project_id = $1 AND key = $2 AND org_id = $3")
                    .bind(run.project_id)
                    .bind(item_key(&repository, Some(n)))
                    .bind(run.org_id)
                    .fetch_optional(ch.conn())
                    .await?;
                if let Some(Some(head)) = current.filter(|h| h.as_deref().is_some_and(|h| h != sha)) {
                    sg::follow_head(ch, s.step_id, &head).await?;
                    sha = head;
                }
            }
            decide_gate(ch, run, s.step_id, gate, &repository, &sha).await?;
        }
        Some(NodeKind::Wait(Wait::Event(event))) => {
            let wanted = event == happened || happened.split('.').next() == Some(event.as_str());
            if wanted && watched == *event {
                let target = Target { repository, number: number.unwrap_or_default(), head_sha: None };
                let data = item_data(ch, run, &target).await?;
                resolve_wait(ch, run, s.step_id, event, &target, &data).await?;
            }
        }
        _ => sg::forget(ch, s.step_id).await?,
    }
    Ok(())
}

/// A gate's timeout: it fails (`timeout`), and `on_fail` applies as for failed checks.
pub async fn gate_timed_out(ch: &mut Change, run: &RunRow, s: &StepRow) -> Result<()> {
    let output = json!({ "timed_out": true });
    steps::fail::<step::Waiting>(ch, run.run_id, s.step_id, &Failure::new("timeout", FailureClass::Ordinary), Some(&output)).await?;
    sg::forget(ch, s.step_id).await
}

async fn item_data(ch: &mut Change, run: &RunRow, target: &Target) -> Result<Value> {
    Ok(sqlx::query_scalar("SELECT data FROM items WHERE project_id = $1 AND key = $2 AND org_id = $3")
        .bind(run.project_id)
        .bind(item_key(&target.repository, Some(target.number)))
        .bind(run.org_id)
        .fetch_optional(ch.conn())
        .await?
        .unwrap_or(Value::Null))
}

async fn resolve_wait(ch: &mut Change, run: &RunRow, step: StepId, event: &str, target: &Target, data: &Value) -> Result<()> {
    let output = json!({
        "event": event,
        "timed_out": false,
        "repository": target.repository,
        "number": target.number,
        "state": data.get("state"),
        "merged": data.get("merged").and_then(Value::as_bool).unwrap_or(false),
        "url": data.get("url"),
    });
    steps::succeed::<step::Waiting>(ch, run.run_id, step, &output, false).await?;
    sg::forget(ch, step).await
}
