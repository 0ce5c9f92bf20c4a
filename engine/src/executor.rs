//! The test executor: what runs crew, gate and output steps inside an engine until hosts and
//! the GitHub integration take them over, and in tests and benchmarks.
//!
//! It does no work. It sleeps `input.test.step_ms` (a number for every step, or an object
//! from node to milliseconds), fails a gate when its visit is listed in
//! `input.test.gate_fail_visits`, fails the first attempts of a node as a command would
//! (`input.test.fail_attempts: { <node>: <n> }` fails attempts 1 to n of each visit with exit
//! code `input.test.exit_code`, 1 by default, so `retry:` and its `exit_codes` can be
//! exercised), and appends one line per execution to an effects file, so a test can prove that
//! no attempt ran twice. A crew step reports a session's cost as a host would,
//! `input.test.cost_usd` (a number for every crew step, or an object from node to dollars)
//! with `input.test.tokens`, in a change of its own while it runs, so budgets can be exercised.
//! A crew step's output names the harness, model and prompt (as written) it would have run
//! with, after the run's edit-and-retry override of the node.
//! Engines only use it when started with `--test-executor`; without it, these steps wait for
//! their real executors.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::advance::ToExecute;
use crate::store::steps::{Failure, FailureClass};
use crate::store::{Actor, Change, StoreError, budgets};

#[derive(Debug, Clone)]
pub struct TestExecutor {
    /// Where each execution is recorded, one line: `<step> <run> <node> <visit> <attempt>`.
    pub effects: Option<PathBuf>,
}

impl TestExecutor {
    pub async fn execute(&self, db: &crate::db::Db, job: &ToExecute, holder: &str) -> Result<Value, Failure> {
        let test = job.input.get("test").cloned().unwrap_or(Value::Null);
        let ms = step_ms(&test, &job.node);
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if job.kind == "crew" {
            let usd = match test.get("cost_usd") {
                Some(Value::Object(per_node)) => per_node.get(&job.node).and_then(Value::as_f64).unwrap_or(0.0),
                Some(v) => v.as_f64().unwrap_or(0.0),
                None => 0.0,
            };
            let tokens = test.get("tokens").and_then(Value::as_i64).unwrap_or(0);
            if usd > 0.0 || tokens > 0 {
                report_cost(db, job, holder, usd, tokens)
                    .await
                    .map_err(|e| Failure::new(format!("test executor cannot report its cost: {e}"), FailureClass::Infrastructure))?;
            }
        }
        if let Some(path) = &self.effects {
            let line = format!("{} {} {} {} {}\n", job.step, job.run, job.node, job.visit, job.attempt);
            let written = std::fs::OpenOptions::new().create(true).append(true).open(path).and_then(|mut f| f.write_all(line.as_bytes()));
            if let Err(e) = written {
                return Err(Failure::new(format!("test executor cannot record its effect: {e}"), FailureClass::Infrastructure));
            }
        }
        if let Some(failure) = failed_attempt(&test, job) {
            return Err(failure);
        }
        let fail_visits = test.get("gate_fail_visits").and_then(Value::as_array);
        if job.kind == "gate" && fail_visits.is_some_and(|v| v.iter().any(|x| x.as_i64() == Some(i64::from(job.visit)))) {
            return Err(Failure::new("gate_failed", FailureClass::Ordinary));
        }
        let mut output = json!({
            "executed_by": holder,
            "text": format!("{} done", job.node),
            "files_changed": test.get("files_changed").cloned().unwrap_or(json!(1)),
        });
        // What a host would have run: the harness, model and prompt after an edit-and-retry.
        if let Some(crew) = &job.crew {
            output["harness"] = json!(crew.harness);
            output["model"] = json!(crew.model);
            output["prompt"] = json!(crew.prompt);
            output["edited"] = json!(crew.edited);
        }
        Ok(output)
    }
}

/// A session report with a cost, in its own change (as a host's report arrives).
async fn report_cost(db: &crate::db::Db, job: &ToExecute, holder: &str, usd: f64, tokens: i64) -> Result<(), StoreError> {
    let mut ch = Change::begin(db, Actor::Engine(holder.trim_start_matches("engine:").to_owned())).await?;
    ch.lock_run(job.org, job.run).await?.ok_or(StoreError::NotFound("run"))?;
    budgets::record_run_spend(&mut ch, job.run, usd, tokens).await?;
    ch.commit().await
}

/// How long the step pretends to work: `step_ms` for every node, or `step_ms.<node>`.
fn step_ms(test: &Value, node: &str) -> u64 {
    match test.get("step_ms") {
        Some(Value::Object(per_node)) => per_node.get(node).and_then(Value::as_u64).unwrap_or(0),
        Some(ms) => ms.as_u64().unwrap_or(0),
        None => 0,
    }
}

/// The failure `input.test.fail_attempts` asks for on this attempt, if any: an ordinary
/// failure with an exit code, as a harness or command that exited non-zero reports it.
fn failed_attempt(test: &Value, job: &ToExecute) -> Option<Failure> {
    let fail_first = test.get("fail_attempts")?.get(&job.node)?.as_i64()?;
    if i64::from(job.attempt) > fail_first {
        return None;
    }
    let code = test.get("exit_code").and_then(Value::as_i64).and_then(|c| i32::try_from(c).ok()).unwrap_or(1);
    Some(Failure { reason: format!("exit_code:{code}"), class: FailureClass::Ordinary, exit_code: Some(code) })
}
