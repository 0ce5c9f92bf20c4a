//! The test executor: what runs crew, gate and output steps inside an engine until hosts and
//! the GitHub integration take them over, and in tests and benchmarks.
//!
//! It does no work. It sleeps `input.test.step_ms`, fails a gate when its visit is listed in
//! `input.test.gate_fail_visits`, and appends one line per execution to an effects file, so a
//! test can prove that no attempt ran twice. Engines only use it when started with
//! `--test-executor`; without it, these steps wait for their real executors.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use crate::advance::ToExecute;
use crate::store::steps::{Failure, FailureClass};

#[derive(Debug, Clone)]
pub struct TestExecutor {
    /// Where each execution is recorded, one line: `<step> <run> <node> <visit> <attempt>`.
    pub effects: Option<PathBuf>,
}

impl TestExecutor {
    pub async fn execute(&self, job: &ToExecute, holder: &str) -> Result<Value, Failure> {
        let test = job.input.get("test").cloned().unwrap_or(Value::Null);
        let ms = test.get("step_ms").and_then(Value::as_u64).unwrap_or(0);
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if let Some(path) = &self.effects {
            let line = format!("{} {} {} {} {}\n", job.step, job.run, job.node, job.visit, job.attempt);
            let written = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| f.write_all(line.as_bytes()));
            if let Err(e) = written {
                return Err(Failure::new(format!("test executor cannot record its effect: {e}"), FailureClass::Infrastructure));
            }
        }
        let fail_visits = test.get("gate_fail_visits").and_then(Value::as_array);
        if job.kind == "gate" && fail_visits.is_some_and(|v| v.iter().any(|x| x.as_i64() == Some(i64::from(job.visit)))) {
            return Err(Failure::new("gate_failed", FailureClass::Ordinary));
        }
        Ok(json!({
            "executed_by": holder,
            "text": format!("{} done", job.node),
            "files_changed": test.get("files_changed").cloned().unwrap_or(json!(1)),
        }))
    }
}
