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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use protocol::Usage;
use serde_json::Value;

use crate::client::Assignment;
use crate::prices::{Basis, Prices, Tokens};

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

/// The command line for an assignment; `claude` and `codex` are the configured commands.
pub fn command_line(kind: Kind, a: &Assignment, claude: &[String], codex: &[String]) -> Result<Vec<String>, String> {
    let mut cmd: Vec<String>;
    match kind {
        Kind::ClaudeCode => {
            cmd = claude.to_vec();
            // The prompt and people's messages come as user lines on stdin (`attempt::converse`).
            cmd.extend(["-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose"].map(str::to_owned));
            if let Some(model) = &a.model {
                cmd.extend(["--model".to_owned(), model.clone()]);
            }
            if let Some(turns) = a.caps.turns {
                cmd.extend(["--max-turns".to_owned(), turns.to_string()]);
            }
            if let Some(usd) = a.caps.usd {
                cmd.extend(["--max-budget-usd".to_owned(), format!("{usd}")]);
            }
        }
        Kind::Codex => {
            cmd = codex.to_vec();
            cmd.extend(["exec", "--json"].map(str::to_owned));
            if let Some(model) = &a.model {
                cmd.extend(["--model".to_owned(), model.clone()]);
            }
            // `-` reads the prompt from stdin.
            cmd.push("-".to_owned());
        }
        Kind::Command => {
            if a.command.is_empty() {
                return Err("the node names no command".into());
            }
            cmd = a.command.clone();
        }
    }
    Ok(cmd)
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

/// The last token counts of one Claude Code message (its assistant lines repeat its id).
#[derive(Debug, Clone, Default)]
struct Message {
    /// The model that answered; `None` for Claude Code's own `<synthetic>` messages.
    model: Option<String>,
    tokens: Tokens,
}

/// The figures of a result line (Claude Code prints one per prompt it answers; with
/// stream-json input, several in one session, each cumulative for the session).
#[derive(Debug, Clone, Default)]
struct Settled {
    cost: Option<f64>,
    input: i64,
    output: i64,
    turns: i32,
    model: Option<String>,
    /// The messages this result line accounts for.
    messages: HashSet<String>,
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
    /// Codex: the last agent message, the failure a turn reported, the turns' token counts and
    /// the last top-level `error` (a warning unless a turn fails).
    last_message: String,
    codex_failure: Option<String>,
    codex_turns_done: bool,
    codex_tokens: Tokens,
    codex_turns: i32,
    /// A command's output, for its answer.
    output: String,
}

fn num(v: &Value, k: &str) -> i64 {
    v.get(k).and_then(Value::as_i64).unwrap_or(0).max(0)
}

/// Claude Code's name for the messages it makes itself (an API error, an interruption).
const SYNTHETIC: &str = "<synthetic>";

fn real_model(m: Option<&str>) -> Option<String> {
    m.map(str::trim).filter(|m| !m.is_empty() && *m != SYNTHETIC).map(str::to_owned)
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

    fn claude(&mut self, line: &str) -> &'static str {
        let Ok(v) = serde_json::from_str::<Value>(line) else { return "stderr" };
        match v.get("type").and_then(Value::as_str) {
            Some("assistant") => {
                let message = &v["message"];
                let id = message.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
                let u = &message["usage"];
                // A 1-hour cache write costs more than a 5-minute one; lines without the split
                // count every write as 5-minute.
                let write = num(u, "cache_creation_input_tokens");
                let write_1h = u.pointer("/cache_creation/ephemeral_1h_input_tokens").and_then(Value::as_i64).unwrap_or(0).clamp(0, write);
                let tokens = Tokens {
                    input: num(u, "input_tokens"),
                    cache_write_5m: write - write_1h,
                    cache_write_1h: write_1h,
                    cache_read: num(u, "cache_read_input_tokens"),
                    output: num(u, "output_tokens"),
                };
                let model = real_model(message.get("model").and_then(Value::as_str));
                if model.is_some() {
                    self.assistant_model.clone_from(&model);
                }
                self.messages.insert(id, Message { model, tokens });
                if let Some(content) = message.get("content").and_then(Value::as_array) {
                    self.tool_calls += content.iter().filter(|c| c.get("type").and_then(Value::as_str) == Some("tool_use")).count() as i32;
                }
                "assistant"
            }
            Some("user") => "tool_result",
            Some("system") => {
                if v.get("subtype").and_then(Value::as_str) == Some("init") {
                    self.init_model = real_model(v.get("model").and_then(Value::as_str));
                }
                "system"
            }
            Some("result") => {
                // A result line without figures (Claude Code interrupted mid-stream prints
                // `error_during_execution` with no cost, usage or modelUsage) settles nothing:
                // what was counted before stays counted, and the messages stay priced.
                let settled = self.settle(&v);
                if settled.cost.is_some() {
                    self.settled = Some(settled);
                }
                self.result = Some(v);
                "result"
            }
            _ => "other",
        }
    }

    /// The figures of a result line: tokens and cost summed over every model of `modelUsage`
    /// when it has any (a budget stop leaves `usage` all zeros; helper models appear only
    /// there), else `usage` and `total_cost_usd`.
    fn settle(&self, v: &Value) -> Settled {
        let models = v.get("modelUsage").and_then(Value::as_object).filter(|m| !m.is_empty());
        let (input, output, model_cost) = match models {
            Some(models) => models.values().fold((0, 0, 0.0), |(i, o, c), m| {
                (
                    i + num(m, "inputTokens") + num(m, "cacheReadInputTokens") + num(m, "cacheCreationInputTokens"),
                    o + num(m, "outputTokens"),
                    c + m.get("costUSD").and_then(Value::as_f64).unwrap_or(0.0),
                )
            }),
            None => {
                let u = &v["usage"];
                (num(u, "input_tokens") + num(u, "cache_creation_input_tokens") + num(u, "cache_read_input_tokens"), num(u, "output_tokens"), 0.0)
            }
        };
        let cost = v
            .get("total_cost_usd")
            .and_then(Value::as_f64)
            .or_else(|| models.map(|_| model_cost))
            .filter(|c| c.is_finite() && *c >= 0.0)
            .map(|c| (c * 1_000_000.0).round() / 1_000_000.0);
        let model = models.and_then(|m| self.main_model(m.iter().map(|(k, u)| (k.as_str(), u.get("costUSD").and_then(Value::as_f64).unwrap_or(0.0)))));
        Settled {
            cost,
            input,
            output,
            turns: v.get("num_turns").and_then(Value::as_i64).unwrap_or(0).clamp(0, i64::from(i32::MAX)) as i32,
            model,
            messages: self.messages.keys().cloned().collect(),
        }
    }

    /// The session's model among `modelUsage`'s: the only one; else the one asked for (a key
    /// that starts with the alias, `claude-sonnet-4-5` → `claude-sonnet-4-5-20250929`, or the
    /// alias's family, `sonnet`); else the init line's; else the one that cost most.
    fn main_model<'a>(&self, models: impl Iterator<Item = (&'a str, f64)>) -> Option<String> {
        let models: Vec<(&str, f64)> = models.filter(|(k, _)| real_model(Some(k)).is_some()).collect();
        if models.len() <= 1 {
            return models.first().map(|(k, _)| (*k).to_owned());
        }
        if let Some(asked) = self.requested_model.as_deref().map(str::to_ascii_lowercase) {
            let exact = models.iter().find(|(k, _)| k.to_ascii_lowercase() == asked || k.to_ascii_lowercase().starts_with(&format!("{asked}-")));
            let family = models.iter().find(|(k, _)| !asked.contains('-') && k.to_ascii_lowercase().split('-').any(|w| w == asked));
            if let Some((k, _)) = exact.or(family) {
                return Some((*k).to_owned());
            }
        }
        if let Some(init) = self.init_model.as_deref() {
            if let Some((k, _)) = models.iter().find(|(k, _)| *k == init) {
                return Some((*k).to_owned());
            }
        }
        models.iter().max_by(|a, b| a.1.total_cmp(&b.1)).map(|(k, _)| (*k).to_owned())
    }

    /// The price of a message: its own model, else the session's.
    fn estimate<'a>(&self, messages: impl Iterator<Item = &'a Message>) -> (f64, Basis) {
        let fallback = self.assistant_model.as_deref().or(self.init_model.as_deref()).or(self.requested_model.as_deref());
        messages.fold((0.0, Basis::PriceTable), |(usd, basis), m| {
            if m.tokens == Tokens::default() {
                return (usd, basis);
            }
            let (c, b) = self.prices.cost(m.model.as_deref().or(fallback), &m.tokens);
            (usd + c, if b == Basis::UnknownModel { b } else { basis })
        })
    }

    /// Claude Code's running totals: the last result line's figures plus the messages that came
    /// after it (all of them before the first result line).
    fn claude_usage(&mut self) {
        let none = Settled::default();
        let settled = self.settled.as_ref().unwrap_or(&none);
        let live: Vec<&Message> = self.messages.iter().filter(|(id, _)| !settled.messages.contains(*id)).map(|(_, m)| m).collect();
        let (estimate, basis) = self.estimate(live.iter().copied());
        let input = settled.input + live.iter().map(|m| m.tokens.input + m.tokens.cache_write_5m + m.tokens.cache_write_1h + m.tokens.cache_read).sum::<i64>();
        let output = settled.output + live.iter().map(|m| m.tokens.output).sum::<i64>();
        let turns = settled.turns + live.len() as i32;
        let any = !self.messages.is_empty() || settled.cost.is_some();
        let estimated = any.then(|| ((settled.cost.unwrap_or(0.0) + estimate) * 1_000_000.0).round() / 1_000_000.0);
        let basis = any.then(|| if live.is_empty() { Basis::PriceTable } else { basis }.name().to_owned());
        let lower_bound = !live.is_empty();
        let cost = settled.cost;
        let model = settled.model.clone().or_else(|| self.assistant_model.clone()).or_else(|| self.init_model.clone()).or_else(|| self.requested_model.clone());
        let u = &mut self.usage;
        (u.input_tokens, u.output_tokens, u.turns, u.tool_calls) = (input, output, turns, self.tool_calls);
        (u.cost_usd, u.estimated_cost_usd, u.estimate_basis, u.output_tokens_lower_bound, u.model) = (cost, estimated, basis, lower_bound, model);
    }

    /// The outcome, once the process is gone. `interrupted` says why the host stopped it, if
    /// it did (`timeout`): that reason stands whatever the harness printed after.
    pub fn finish(self, exit: Exit, interrupted: Option<&str>) -> Ended {
        let usage = self.usage.clone();
        let exit_reason = |exit: Exit| match (exit.code, exit.signal) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            (None, None) => "exited (status unknown after a host restart)".to_owned(),
        };
        let fail = |reason: String, class: &'static str, text: String, subtype: Option<String>| Ended {
            success: false,
            reason: Some(reason),
            class,
            exit_code: exit.code,
            text,
            usage: usage.clone(),
            subtype,
        };
        let (mut text, subtype) = match self.kind {
            Kind::ClaudeCode => {
                let r = self.result.as_ref();
                let text = r.and_then(|r| r.get("result")).and_then(Value::as_str).unwrap_or_default().to_owned();
                (text, r.and_then(|r| r.get("subtype")).and_then(Value::as_str).map(str::to_owned))
            }
            Kind::Codex => (self.last_message, None),
            Kind::Command => (self.output, None),
        };
        keep_tail(&mut text);
        if let Some(why) = interrupted {
            return fail(why.to_owned(), "ordinary", text, subtype);
        }
        match self.kind {
            Kind::ClaudeCode => {
                let Some(r) = self.result.as_ref() else { return fail(format!("no result line ({})", exit_reason(exit)), "ordinary", text, None) };
                // `is_error` fails a `success` (an API error says `success` with it); an
                // `error_…` subtype fails whether or not the line says `is_error`.
                let is_error = r.get("is_error").and_then(Value::as_bool).unwrap_or(false);
                if !is_error && !subtype.as_deref().is_some_and(|s| s.starts_with("error")) {
                    return Ended { success: true, reason: None, class: "ordinary", exit_code: exit.code, text, usage, subtype };
                }
                let api_status = r.get("api_error_status").and_then(Value::as_i64);
                let first_error = r.get("errors").and_then(Value::as_array).and_then(|e| e.iter().find_map(Value::as_str)).map(|e| short(e, 150));
                match (subtype.as_deref(), api_status) {
                    (Some("error_max_turns"), _) => fail("turn cap reached".into(), "ordinary", text, subtype),
                    (Some("error_max_budget_usd"), _) => fail("budget cap reached".into(), "final", text, subtype),
                    // A request the API refuses (an unknown model, a bad key) is refused again:
                    // final. Overload (529), rate limits (429) and 5xx may pass.
                    (_, Some(status)) => {
                        let words = if text.trim().is_empty() { "the API refused the request".to_owned() } else { short(&text, 150) };
                        let class = if (400..500).contains(&status) && status != 429 && status != 408 { "final" } else { "ordinary" };
                        fail(format!("API error {status}: {words}"), class, text, subtype)
                    }
                    (Some("error_during_execution"), _) => fail(
                        first_error.map_or_else(|| "error during execution".to_owned(), |e| format!("error during execution: {e}")),
                        "ordinary",
                        text,
                        subtype,
                    ),
                    _ => {
                        let error = first_error.or_else(|| (!text.trim().is_empty()).then(|| short(&text, 150)));
                        fail(error.map_or_else(|| "harness error".to_owned(), |e| format!("harness error: {e}")), "ordinary", text, subtype)
                    }
                }
            }
            Kind::Codex => match self.codex_failure {
                Some(why) => {
                    let class = codex::failure_class(&why);
                    fail(format!("turn failed: {why}"), class, text, None)
                }
                None if self.codex_turns_done && exit.signal.is_none() => {
                    Ended { success: true, reason: None, class: "ordinary", exit_code: exit.code, text, usage, subtype: None }
                }
                None => fail(format!("no turn completed ({})", exit_reason(exit)), "ordinary", text, None),
            },
            Kind::Command => match exit.code {
                Some(0) => Ended { success: true, reason: None, class: "ordinary", exit_code: Some(0), text, usage, subtype: None },
                _ => fail(exit_reason(exit), "ordinary", text, None),
            },
        }
    }
}

/// The line that comes before the pull request's description in an answer.
pub const PR_MARKER: &str = "PULL REQUEST";

/// What is added to the prompt when a pull request will be opened from the step's work: the
/// agent knows why it made each change, so it writes the description, from the repository's
/// template when there is one.
pub fn pr_instructions(template: Option<&str>, issue: Option<i64>) -> String {
    let closes = issue.map(|n| format!(" Its first line is `Closes #{n}`.")).unwrap_or_default();
    let fill = match template {
        Some(t) if !t.trim().is_empty() => format!(" Fill in the repository's pull request template:\n\n{}\n", t.trim()),
        _ => " Say what changed and why, briefly.".to_owned(),
    };
    format!(
        "\n\n---\nWhen you are done, end your answer with the pull request's description: a line that says exactly {PR_MARKER}, then the description.{closes}{fill}"
    )
}

/// The pull request's description in an answer: what follows the last marker line, or the
/// whole answer; with `Closes #<issue>` as its first line.
pub fn pr_body(answer: &str, issue: Option<i64>) -> String {
    let lines: Vec<&str> = answer.lines().collect();
    let body = match lines.iter().rposition(|l| l.trim().trim_matches(['*', '#', ' ']) == PR_MARKER) {
        Some(i) => lines[i + 1..].join("\n"),
        None => answer.to_owned(),
    };
    let body = body.trim().to_owned();
    match issue {
        Some(n) if !body.lines().next().is_some_and(|l| l.trim().eq_ignore_ascii_case(&format!("closes #{n}"))) => format!("Closes #{n}\n\n{body}"),
        _ => body,
    }
}

mod codex;

#[cfg(test)]
mod tests;
