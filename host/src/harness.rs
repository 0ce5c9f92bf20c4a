//! Harnesses: the command line of each, and the reading of what it prints.
//!
//! - `claude-code`: `claude -p --input-format stream-json --output-format stream-json --verbose`
//!   with the prompt as the first user line on stdin, and people's messages as further ones.
//!   Each line is a JSON object: `system` (init), `assistant` (a message of the model, with its
//!   token counts; a message may come as several lines with one `message.id`), `user` (tool
//!   results), and at the end `result` with `total_cost_usd`, `num_turns`, `usage`, `modelUsage`
//!   and a `subtype` (`success`, `error_max_turns`, `error_max_budget_usd`,
//!   `error_during_execution`). Interrupted with SIGINT, Claude Code stops its tools and still
//!   prints a result line with the cost so far; killed, it prints none, and the session keeps
//!   the tokens its assistant lines counted, with an unknown (null) cost.
//! - `codex`: `codex exec --json -` with the prompt on stdin; `item.completed` lines carry the
//!   agent's messages and its tool calls, `turn.completed` the tokens. Codex reports no cost.
//! - `command`: any program, prompt on stdin; its output is the session and its exit code
//!   decides.

use std::collections::HashMap;

use serde_json::Value;

use crate::client::{Assignment, Usage};

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

/// Reads a harness's output line by line.
#[derive(Debug)]
pub struct Reader {
    kind: Kind,
    /// The model the node asked for: named when `modelUsage` lists several.
    requested_model: Option<String>,
    usage: Usage,
    /// Claude Code: the last token counts of each assistant message, by message id.
    messages: HashMap<String, (i64, i64)>,
    result: Option<Value>,
    /// Codex: the last agent message and the failure it reported.
    last_message: String,
    codex_failure: Option<String>,
    codex_turns_done: bool,
    /// A command's output, for its answer.
    output: String,
}

fn num(v: &Value, k: &str) -> i64 {
    v.get(k).and_then(Value::as_i64).unwrap_or(0)
}

impl Reader {
    pub fn new(kind: Kind, requested_model: Option<String>) -> Reader {
        Reader {
            kind,
            requested_model,
            usage: Usage::default(),
            messages: HashMap::new(),
            result: None,
            last_message: String::new(),
            codex_failure: None,
            codex_turns_done: false,
            output: String::new(),
        }
    }

    pub fn usage(&self) -> &Usage {
        &self.usage
    }

    /// Reads one line; returns the stream it belongs to in the session.
    pub fn line(&mut self, line: &str) -> &'static str {
        match self.kind {
            Kind::ClaudeCode => self.claude(line),
            Kind::Codex => self.codex(line),
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
                let input = num(u, "input_tokens") + num(u, "cache_creation_input_tokens") + num(u, "cache_read_input_tokens");
                self.messages.insert(id, (input, num(u, "output_tokens")));
                if let Some(content) = message.get("content").and_then(Value::as_array) {
                    self.usage.tool_calls += content.iter().filter(|c| c.get("type").and_then(Value::as_str) == Some("tool_use")).count() as i32;
                }
                if self.usage.model.is_none() {
                    self.usage.model = message.get("model").and_then(Value::as_str).map(str::to_owned);
                }
                // Until the result line, the totals are the assistant lines'.
                self.usage.input_tokens = self.messages.values().map(|m| m.0).sum();
                self.usage.output_tokens = self.messages.values().map(|m| m.1).sum();
                self.usage.turns = self.messages.len() as i32;
                "assistant"
            }
            Some("user") => "tool_result",
            Some("system") => "system",
            Some("result") => {
                if let Some(cost) = v.get("total_cost_usd").and_then(Value::as_f64) {
                    self.usage.cost_usd = Some((cost * 1_000_000.0).round() / 1_000_000.0);
                }
                if let Some(turns) = v.get("num_turns").and_then(Value::as_i64) {
                    self.usage.turns = turns as i32;
                }
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    self.usage.input_tokens = num(u, "input_tokens") + num(u, "cache_creation_input_tokens") + num(u, "cache_read_input_tokens");
                    self.usage.output_tokens = num(u, "output_tokens");
                }
                // The result has no top-level model: it is the one key of modelUsage, or the
                // one asked for when a helper model shows up beside it.
                if let Some(models) = v.get("modelUsage").and_then(Value::as_object) {
                    match models.len() {
                        0 => {}
                        1 => self.usage.model = models.keys().next().cloned(),
                        _ => self.usage.model = self.requested_model.clone().or_else(|| self.usage.model.clone()),
                    }
                }
                self.result = Some(v);
                "result"
            }
            _ => "other",
        }
    }

    fn codex(&mut self, line: &str) -> &'static str {
        let Ok(v) = serde_json::from_str::<Value>(line) else { return "stderr" };
        match v.get("type").and_then(Value::as_str) {
            Some("item.completed" | "item.started" | "item.updated") => {
                let item = &v["item"];
                let kind = item.get("type").or_else(|| item.get("item_type")).and_then(Value::as_str).unwrap_or_default();
                let completed = v["type"] == "item.completed";
                match kind {
                    "agent_message" | "assistant_message" => {
                        if completed {
                            self.last_message = item.get("text").and_then(Value::as_str).unwrap_or_default().to_owned();
                        }
                        "assistant"
                    }
                    "reasoning" => "reasoning",
                    _ => {
                        if completed {
                            self.usage.tool_calls += 1;
                        }
                        "tool"
                    }
                }
            }
            Some("turn.completed") => {
                let u = &v["usage"];
                self.usage.input_tokens += num(u, "input_tokens");
                self.usage.output_tokens += num(u, "output_tokens");
                self.usage.turns += 1;
                self.codex_turns_done = true;
                "turn"
            }
            Some("turn.failed") => {
                self.codex_failure = Some(v.pointer("/error/message").and_then(Value::as_str).unwrap_or("turn failed").chars().take(200).collect());
                "turn"
            }
            Some("error") => {
                self.codex_failure = Some(v.get("message").and_then(Value::as_str).unwrap_or("error").chars().take(200).collect());
                "error"
            }
            _ => "other",
        }
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
        match self.kind {
            Kind::ClaudeCode => {
                let subtype = self.result.as_ref().and_then(|r| r.get("subtype")).and_then(Value::as_str).map(str::to_owned);
                let mut text = self.result.as_ref().and_then(|r| r.get("result")).and_then(Value::as_str).unwrap_or_default().to_owned();
                keep_tail(&mut text);
                if let Some(why) = interrupted {
                    return fail(why.to_owned(), "ordinary", text, subtype);
                }
                let is_error = self.result.as_ref().and_then(|r| r.get("is_error")).and_then(Value::as_bool).unwrap_or(false);
                match subtype.as_deref() {
                    Some("success") if !is_error => Ended { success: true, reason: None, class: "ordinary", exit_code: exit.code, text, usage, subtype },
                    Some("error_max_turns") => fail("turn cap reached".into(), "ordinary", text, subtype),
                    Some("error_max_budget_usd") => fail("budget cap reached".into(), "final", text, subtype),
                    Some(_) => fail("harness error".into(), "ordinary", text, subtype),
                    None => fail(format!("no result line ({})", exit_reason(exit)), "ordinary", text, None),
                }
            }
            Kind::Codex => {
                let mut text = self.last_message;
                keep_tail(&mut text);
                if let Some(why) = interrupted {
                    return fail(why.to_owned(), "ordinary", text, None);
                }
                match (self.codex_failure, exit.code) {
                    (Some(_), _) => fail("harness error".into(), "ordinary", text, None),
                    (None, Some(0)) if self.codex_turns_done => Ended { success: true, reason: None, class: "ordinary", exit_code: Some(0), text, usage, subtype: None },
                    (None, Some(0)) => fail("no turn completed".into(), "ordinary", text, None),
                    _ => fail(exit_reason(exit), "ordinary", text, None),
                }
            }
            Kind::Command => {
                let mut text = self.output;
                keep_tail(&mut text);
                if let Some(why) = interrupted {
                    return fail(why.to_owned(), "ordinary", text, None);
                }
                match exit.code {
                    Some(0) => Ended { success: true, reason: None, class: "ordinary", exit_code: Some(0), text, usage, subtype: None },
                    _ => fail(exit_reason(exit), "ordinary", text, None),
                }
            }
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
    format!("\n\n---\nWhen you are done, end your answer with the pull request's description: a line that says exactly {PR_MARKER}, then the description.{closes}{fill}")
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

#[cfg(test)]
mod tests {
    use super::*;

    fn claude_lines(result: &str) -> Vec<String> {
        vec![
            r#"{"type":"system","subtype":"init","cwd":"/w","session_id":"s1","tools":["Edit","Bash"],"model":"claude-sonnet-4-5-20250929","permissionMode":"default"}"#.into(),
            r#"{"type":"assistant","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Editing."}],"usage":{"input_tokens":10,"cache_creation_input_tokens":100,"cache_read_input_tokens":0,"output_tokens":5}},"parent_tool_use_id":null,"session_id":"s1"}"#.into(),
            r#"{"type":"assistant","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"tool_use","id":"toolu_1","name":"Edit","input":{"file_path":"a.txt"}}],"usage":{"input_tokens":10,"cache_creation_input_tokens":100,"cache_read_input_tokens":0,"output_tokens":40}},"parent_tool_use_id":null,"session_id":"s1"}"#.into(),
            r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_1","type":"tool_result","content":"ok"}]},"parent_tool_use_id":null,"session_id":"s1"}"#.into(),
            r#"{"type":"assistant","message":{"id":"msg_2","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Done."}],"usage":{"input_tokens":3,"cache_creation_input_tokens":0,"cache_read_input_tokens":110,"output_tokens":7}},"parent_tool_use_id":null,"session_id":"s1"}"#.into(),
            result.into(),
        ]
    }

    fn read(kind: Kind, lines: &[String]) -> Reader {
        let mut r = Reader::new(kind, Some("claude-sonnet-4-5".into()));
        for l in lines {
            r.line(l);
        }
        r
    }

    const SUCCESS: &str = r#"{"type":"result","subtype":"success","is_error":false,"duration_ms":1200,"duration_api_ms":1100,"num_turns":2,"result":"All done.","session_id":"s1","total_cost_usd":0.36616580000000004,"usage":{"input_tokens":13,"cache_creation_input_tokens":100,"cache_read_input_tokens":110,"output_tokens":47},"modelUsage":{"claude-sonnet-4-5-20250929":{"inputTokens":13,"outputTokens":47,"costUSD":0.3661658}},"permission_denials":[]}"#;

    #[test]
    fn a_claude_session_gives_cost_turns_tokens_and_model() {
        let r = read(Kind::ClaudeCode, &claude_lines(SUCCESS));
        let ended = r.finish(Exit { code: Some(0), signal: None }, None);
        assert!(ended.success, "{ended:?}");
        assert_eq!(ended.text, "All done.");
        assert_eq!(ended.usage.cost_usd, Some(0.366_166));
        assert_eq!((ended.usage.turns, ended.usage.input_tokens, ended.usage.output_tokens), (2, 223, 47));
        assert_eq!(ended.usage.tool_calls, 1);
        assert_eq!(ended.usage.model.as_deref(), Some("claude-sonnet-4-5-20250929"));
    }

    #[test]
    fn assistant_lines_of_one_message_are_counted_once() {
        let lines = claude_lines(SUCCESS);
        let r = read(Kind::ClaudeCode, &lines[..5]);
        // msg_1 counted with its last line's figures (110 in, 40 out), msg_2 (113 in, 7 out).
        assert_eq!((r.usage().input_tokens, r.usage().output_tokens, r.usage().turns), (223, 47, 2));
        assert_eq!(r.usage().cost_usd, None);
    }

    #[test]
    fn caps_have_their_own_reasons() {
        let turns = SUCCESS.replace(r#""subtype":"success","is_error":false"#, r#""subtype":"error_max_turns","is_error":true"#);
        let ended = read(Kind::ClaudeCode, &claude_lines(&turns)).finish(Exit { code: Some(1), signal: None }, None);
        assert_eq!((ended.success, ended.reason.as_deref(), ended.class), (false, Some("turn cap reached"), "ordinary"));
        let budget = SUCCESS.replace(r#""subtype":"success","is_error":false"#, r#""subtype":"error_max_budget_usd","is_error":true"#);
        let ended = read(Kind::ClaudeCode, &claude_lines(&budget)).finish(Exit { code: Some(1), signal: None }, None);
        assert_eq!((ended.reason.as_deref(), ended.class), (Some("budget cap reached"), "final"));
        assert_eq!(ended.usage.cost_usd, Some(0.366_166));
    }

    #[test]
    fn a_killed_claude_keeps_its_tokens_and_has_no_cost() {
        let lines = claude_lines(SUCCESS);
        let ended = read(Kind::ClaudeCode, &lines[..5]).finish(Exit { code: None, signal: Some(9) }, Some("timeout"));
        assert_eq!((ended.success, ended.reason.as_deref()), (false, Some("timeout")));
        assert_eq!((ended.usage.input_tokens, ended.usage.output_tokens, ended.usage.cost_usd), (223, 47, None));
        let ended = read(Kind::ClaudeCode, &lines[..5]).finish(Exit { code: Some(2), signal: None }, None);
        assert_eq!(ended.reason.as_deref(), Some("no result line (exit code 2)"));
        assert_eq!(ended.exit_code, Some(2));
    }

    #[test]
    fn several_models_name_the_one_asked_for() {
        let two = SUCCESS.replace(r#""modelUsage":{"#, r#""modelUsage":{"claude-3-5-haiku-20241022":{"costUSD":0.001},"#);
        let r = read(Kind::ClaudeCode, &claude_lines(&two));
        assert_eq!(r.usage().model.as_deref(), Some("claude-sonnet-4-5"));
    }

    #[test]
    fn codex_lines_give_the_answer_and_tokens() {
        let lines: Vec<String> = [
            r#"{"type":"thread.started","thread_id":"t1"}"#,
            r#"{"type":"turn.started"}"#,
            r#"{"type":"item.completed","item":{"id":"item_0","type":"reasoning","text":"thinking"}}"#,
            r#"{"type":"item.started","item":{"id":"item_1","type":"command_execution","command":"ls","status":"in_progress"}}"#,
            r#"{"type":"item.completed","item":{"id":"item_1","type":"command_execution","command":"ls","exit_code":0,"status":"completed"}}"#,
            r#"{"type":"item.completed","item":{"id":"item_2","type":"agent_message","text":"Changed it."}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":120,"cached_input_tokens":20,"output_tokens":30}}"#,
        ]
        .map(str::to_owned)
        .to_vec();
        let ended = read(Kind::Codex, &lines).finish(Exit { code: Some(0), signal: None }, None);
        assert!(ended.success);
        assert_eq!(ended.text, "Changed it.");
        assert_eq!((ended.usage.input_tokens, ended.usage.output_tokens, ended.usage.tool_calls, ended.usage.cost_usd), (120, 30, 1, None));
    }

    #[test]
    fn a_commands_exit_code_decides() {
        let mut r = Reader::new(Kind::Command, None);
        assert_eq!(r.line("hello"), "output");
        let ended = r.finish(Exit { code: Some(1), signal: None }, None);
        assert_eq!((ended.success, ended.reason.as_deref(), ended.exit_code), (false, Some("exit code 1"), Some(1)));
    }

    #[test]
    fn the_pr_body_follows_the_marker_and_closes_the_issue() {
        let answer = "I changed the parser.\n\nPULL REQUEST\nFix the parser\n\nIt crashed on empty input.";
        assert_eq!(pr_body(answer, Some(7)), "Closes #7\n\nFix the parser\n\nIt crashed on empty input.");
        assert_eq!(pr_body("Closes #7\nDone", Some(7)), "Closes #7\nDone");
        assert_eq!(pr_body("Done", None), "Done");
        assert!(pr_instructions(Some("## What\n## Why"), Some(7)).contains("## What"));
    }
}
