//! Harnesses: the command line of each, and the reading of what it prints.
//!
//! - `claude-code`: `claude -p --input-format stream-json --output-format stream-json --verbose`
//!   with the prompt as the first user line on stdin, and people's messages as further ones.
//!   Each line is a JSON object (the Agent SDK's message types): `system` (`init`: session id,
//!   tools, model, permission mode), `assistant` (a message of the model with its token counts;
//!   a message comes as several lines with one `message.id`, each with the counts so far),
//!   `user` (tool results), and `result` with `total_cost_usd`, `num_turns`, `usage`,
//!   `modelUsage` (per model: `inputTokens`, `outputTokens`, `cacheReadInputTokens`,
//!   `cacheCreationInputTokens`, `costUSD`), `is_error`, and a `subtype` (`success`,
//!   `error_max_turns`, `error_max_budget_usd`, `error_during_execution`). Tokens and cost
//!   come from `modelUsage` summed over its models when it has any: on a budget stop `usage`
//!   is all zeros, and helper models (a haiku for small tasks) appear only in `modelUsage`.
//!   An `error_…` subtype fails, and so does `is_error` whatever the subtype: an API error
//!   is `success` with `is_error` and `api_error_status` (a 4xx other than 408/429 is final:
//!   the same request is refused again), after an assistant line whose model is
//!   `<synthetic>`, which is never the session's model. Reading stream-json input, Claude Code prints a result line per
//!   prompt, each cumulative for the session: the last one with a cost counts (one without,
//!   as printed when interrupted while streaming, settles nothing). Until a result line, the
//!   session's figures are its messages' last snapshots, its output tokens a lower bound, and
//!   its cost an estimate from the price table (`prices`); killed, it prints none, and the
//!   session keeps those, with an unknown (null) reported cost.
//! - `codex`: `codex exec --json -` with the prompt on stdin; `item.*` lines carry the agent's
//!   messages, reasoning, plans (`todo_list`), warnings (`error` items) and its tool calls
//!   (`command_execution`, `file_change`, `mcp_tool_call`, `web_search`), `turn.completed` the
//!   tokens. Only `turn.failed`, or an exit with no `turn.completed`, fails: a top-level
//!   `error` is Codex saying what it retries (`Reconnecting... 1/5`). Codex names no model and
//!   reports no cost: the model is the assignment's, the cost an estimate. Codex before 0.44
//!   printed `{"id", "msg"}` events instead (`token_count` totals, `task_complete`, `error`):
//!   read too.
//! - `command`: any program, prompt on stdin; its output is the session and its exit code
//!   decides.

use std::collections::HashMap;
use std::sync::Arc;

use protocol::Usage;
use serde_json::Value;

use crate::prices::{Prices, Tokens};

use claude::{Message, Settled};

/// Which harness, from the assignment's word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    ClaudeCode,
    Codex,
    Command,
}

impl Kind {
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "claude-code" => Some(Kind::ClaudeCode),
            "codex" => Some(Kind::Codex),
            "command" => Some(Kind::Command),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::ClaudeCode => "claude-code",
            Kind::Codex => "codex",
            Kind::Command => "command",
        }
    }
}

/// The reason of a session stopped for what it spent: the caps' `usd` (the least of the node's
/// cap and what its run, project and org may still spend), reached by the CLI's own count
/// (Claude Code's `--max-budget-usd`) or the host's. Final: another attempt would spend again.
pub const BUDGET_CAP: &str = "budget cap reached";

/// What budgets count of a session so far: the larger of the host's estimate and the cost the
/// harness reported (as the server counts it).
pub fn spend(u: &Usage) -> f64 {
    u.estimated_cost_usd.unwrap_or(0.0).max(u.cost_usd.unwrap_or(0.0))
}

/// How a harness run ended, read from its output and exit.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    pub success: bool,
    /// A failure's short reason.
    pub reason: Option<String>,
    /// Whether the failure may be retried: `ordinary`, or `final` for a cap.
    pub class: &'static str,
    pub exit_code: Option<i32>,
    /// The answer: Claude Code's `result`, Codex's last message, a command's output.
    pub text: String,
    pub usage: Usage,
    /// The result line's subtype, when there was one.
    pub subtype: Option<String>,
    /// The tool calls the agent was refused (its permissions or tools forbid them), each in
    /// short words: `Write NOTES.md`.
    pub refused: Vec<String>,
}

/// How the process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// The exit code, when it exited by itself.
    pub code: Option<i32>,
    /// The signal that killed it.
    pub signal: Option<i32>,
}

/// The longest answer text kept in the step's output (the transcript has everything).
const TEXT_MAX: usize = 256 << 10;

fn keep_tail(text: &mut String) {
    if text.len() > TEXT_MAX {
        let mut start = text.len() - TEXT_MAX;
        while !text.is_char_boundary(start) {
            start += 1;
        }
        *text = text[start..].to_owned();
    }
}

/// Reads a harness's output line by line.
#[derive(Debug)]
pub struct Reader {
    kind: Kind,
    /// The model the node asked for: named when `modelUsage` lists several, and Codex's model
    /// (Codex never prints it).
    requested_model: Option<String>,
    prices: Arc<Prices>,
    usage: Usage,
    /// Claude Code: the last snapshot of each assistant message, by message id.
    messages: HashMap<String, Message>,
    /// Claude Code: the model of the init line and of the last real assistant line.
    init_model: Option<String>,
    assistant_model: Option<String>,
    tool_calls: i32,
    /// Claude Code: the last result line, and its figures.
    result: Option<Value>,
    settled: Option<Settled>,
    /// Codex: the last agent message, the failure a turn reported (its JSON error body when the
    /// API refused), and the token counts of its completed turns and of its session file's
    /// model calls (each call's as it comes, with the thread's running totals).
    last_message: String,
    codex_failure: Option<String>,
    codex_turns_done: bool,
    codex_tokens: Tokens,
    codex_turns: i32,
    codex_file_tokens: Tokens,
    codex_calls: i32,
    /// Codex: its session file's tool calls by id, in short words, until their output comes.
    codex_calls_by_id: HashMap<String, String>,
    /// The last line the harness wrote that is not JSON (its standard error): its own words
    /// when it ends before doing anything.
    last_words: Option<String>,
    /// Tool calls the agent was refused, in short words.
    refused: Vec<String>,
    /// A command's output, for its answer.
    output: String,
}

fn num(v: &Value, k: &str) -> i64 {
    v.get(k).and_then(Value::as_i64).unwrap_or(0).max(0)
}

/// How a process ended, in words.
fn exit_reason(exit: Exit) -> String {
    match (exit.code, exit.signal) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => "exited (status unknown after a host restart)".to_owned(),
    }
}

/// A request the model API refused with `status` is refused again when it is a 4xx other than
/// 408 (timeout) and 429 (rate limit): final. Anything else may pass on a later try.
fn refused_class(status: i64) -> &'static str {
    if (400..500).contains(&status) && status != 408 && status != 429 { "final" } else { "ordinary" }
}

fn short(text: &str, max: usize) -> String {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default();
    if line.chars().count() <= max { line.to_owned() } else { format!("{}…", line.chars().take(max).collect::<String>()) }
}

impl Reader {
    pub fn new(kind: Kind, requested_model: Option<String>, prices: Arc<Prices>) -> Reader {
        Reader {
            kind,
            requested_model,
            prices,
            usage: Usage::default(),
            messages: HashMap::new(),
            init_model: None,
            assistant_model: None,
            tool_calls: 0,
            result: None,
            settled: None,
            last_message: String::new(),
            codex_failure: None,
            codex_turns_done: false,
            codex_tokens: Tokens::default(),
            codex_turns: 0,
            codex_file_tokens: Tokens::default(),
            codex_calls: 0,
            codex_calls_by_id: HashMap::new(),
            last_words: None,
            refused: Vec::new(),
            output: String::new(),
        }
    }

    pub fn usage(&self) -> &Usage {
        &self.usage
    }

    /// Reads one line; returns the stream it belongs to in the session.
    pub fn line(&mut self, line: &str) -> &'static str {
        match self.kind {
            Kind::ClaudeCode => {
                let stream = self.claude(line);
                self.claude_usage();
                stream
            }
            Kind::Codex => {
                let stream = self.codex(line);
                self.codex_usage();
                stream
            }
            Kind::Command => {
                if self.output.len() <= TEXT_MAX * 2 {
                    self.output.push_str(line);
                    self.output.push('\n');
                }
                "output"
            }
        }
    }

    /// Keeps a line that is not JSON as the harness's last words (blank ones aside).
    fn stderr(&mut self, line: &str) -> &'static str {
        if !line.trim().is_empty() {
            self.last_words = Some(short(line, 300));
        }
        "stderr"
    }

    /// The outcome, once the process is gone. `interrupted` says why the host stopped it, if
    /// it did (`timeout`): that reason stands whatever the harness printed after.
    pub fn finish(self, exit: Exit, interrupted: Option<&str>) -> Ended {
        let (text, subtype) = match self.kind {
            Kind::ClaudeCode => {
                let r = self.result.as_ref();
                let text = r.and_then(|r| r.get("result")).and_then(Value::as_str).unwrap_or_default().to_owned();
                (text, r.and_then(|r| r.get("subtype")).and_then(Value::as_str).map(str::to_owned))
            }
            Kind::Codex => (self.last_message.clone(), None),
            Kind::Command => (self.output.clone(), None),
        };
        let mut ended = Ended {
            success: false,
            reason: None,
            class: "ordinary",
            exit_code: exit.code,
            text,
            usage: self.usage.clone(),
            subtype,
            refused: self.refused.clone(),
        };
        keep_tail(&mut ended.text);
        let failure = match interrupted {
            Some(BUDGET_CAP) => Some((BUDGET_CAP.to_owned(), "final")),
            Some(why) => Some((why.to_owned(), "ordinary")),
            None => match self.kind {
                Kind::ClaudeCode => self.claude_failure(exit, &ended.text),
                Kind::Codex => self.codex_failure(exit),
                Kind::Command => (exit.code != Some(0)).then(|| (exit_reason(exit), "ordinary")),
            },
        };
        match failure {
            Some((reason, class)) => (ended.reason, ended.class) = (Some(reason), class),
            None => ended.success = true,
        }
        ended
    }

    /// A reason followed by the harness's last words, when it said any.
    fn with_last_words(&self, reason: String) -> String {
        match &self.last_words {
            Some(words) => short(&format!("{reason}: {words}"), 190),
            None => reason,
        }
    }
}

mod claude;
mod codex;
mod command_line;
mod pull_request;

pub use command_line::command_line;
pub use pull_request::{PR_MARKER, pr_body, pr_instructions};

#[cfg(test)]
mod tests;
