//! Reading what `codex exec --json` prints: its thread, turn and item events, and the
//! `{"id", "msg"}` events Codex printed before 0.44.

use serde_json::Value;

use super::{Exit, Reader, exit_reason, num, refused_class, short};
use crate::prices::Tokens;

/// Codex items that are tool calls (not messages, reasoning, plans or warnings).
const CODEX_TOOLS: [&str; 4] = ["command_execution", "file_change", "mcp_tool_call", "web_search"];

impl Reader {
    pub(super) fn codex(&mut self, line: &str) -> &'static str {
        let Ok(v) = serde_json::from_str::<Value>(line) else { return self.stderr(line) };
        match v.get("type").and_then(Value::as_str) {
            Some(event @ ("item.completed" | "item.started" | "item.updated")) => {
                let item = &v["item"];
                let kind = item.get("type").or_else(|| item.get("item_type")).and_then(Value::as_str).unwrap_or_default();
                let completed = event == "item.completed";
                match kind {
                    "agent_message" | "assistant_message" => {
                        if completed {
                            self.last_message = item.get("text").and_then(Value::as_str).unwrap_or_default().to_owned();
                        }
                        "assistant"
                    }
                    "reasoning" => "reasoning",
                    "todo_list" => "plan",
                    // A non-fatal error Codex reports as an item: a warning.
                    "error" => "warning",
                    k if CODEX_TOOLS.contains(&k) => {
                        if completed {
                            self.tool_calls += 1;
                        }
                        "tool"
                    }
                    _ => "other",
                }
            }
            Some("turn.completed") => {
                let u = &v["usage"];
                let input = num(u, "input_tokens");
                let cached = num(u, "cached_input_tokens").min(input);
                // OpenAI counts the cached part in the input, and reasoning in the output.
                self.codex_tokens.input += input - cached;
                self.codex_tokens.cache_read += cached;
                self.codex_tokens.output += num(u, "output_tokens");
                self.codex_turns += 1;
                self.codex_turns_done = true;
                "turn"
            }
            Some("turn.failed") => {
                // Kept whole: a refused request's message is the API's JSON error body.
                self.codex_failure = Some(v.pointer("/error/message").and_then(Value::as_str).unwrap_or("turn failed").to_owned());
                "turn"
            }
            // A top-level error is Codex telling what goes wrong (`Reconnecting... 1/5 …` while
            // it retries): only `turn.failed` ends a turn.
            Some("error") => "error",
            Some("thread.started" | "turn.started") => "system",
            None if v.get("msg").is_some_and(Value::is_object) => self.codex_legacy(&v["msg"]),
            _ => "other",
        }
    }

    /// Codex before 0.44 printed `{"id", "msg"}` events: `token_count` with the session's
    /// totals so far (flat, or later under `info.total_token_usage`), `agent_message`, the tool
    /// calls' `…_end` events, `task_complete` at the end of the turn, `error` when it failed
    /// (`stream_error` is a retry).
    fn codex_legacy(&mut self, msg: &Value) -> &'static str {
        match msg.get("type").and_then(Value::as_str).unwrap_or_default() {
            "token_count" => {
                let u = msg.pointer("/info/total_token_usage").unwrap_or(msg);
                if u.get("input_tokens").is_some() {
                    let input = num(u, "input_tokens");
                    let cached = num(u, "cached_input_tokens").min(input);
                    // Totals, not increments: the last one holds.
                    self.codex_tokens = Tokens { input: input - cached, cache_read: cached, output: num(u, "output_tokens"), ..Tokens::default() };
                    self.codex_turns = self.codex_turns.max(1);
                }
                "turn"
            }
            "agent_message" => {
                self.last_message = msg.get("message").and_then(Value::as_str).unwrap_or_default().to_owned();
                "assistant"
            }
            "agent_reasoning" => "reasoning",
            "exec_command_end" | "patch_apply_end" | "mcp_tool_call_end" => {
                self.tool_calls += 1;
                "tool"
            }
            "task_complete" => {
                if let Some(last) = msg.get("last_agent_message").and_then(Value::as_str) {
                    self.last_message = last.to_owned();
                }
                self.codex_turns_done = true;
                "turn"
            }
            "error" => {
                self.codex_failure = Some(msg.get("message").and_then(Value::as_str).unwrap_or("error").to_owned());
                "error"
            }
            "stream_error" => "warning",
            _ => "other",
        }
    }

    /// Why a Codex session failed, and the class of its failure; `None` for a success.
    pub(super) fn codex_failure(&self, exit: Exit) -> Option<(String, &'static str)> {
        match &self.codex_failure {
            Some(why) => {
                let (words, class) = failure(why);
                Some((format!("turn failed: {words}"), class))
            }
            None if self.codex_turns_done && exit.signal.is_none() => None,
            None => Some((self.with_last_words(format!("no turn completed ({})", exit_reason(exit))), "ordinary")),
        }
    }

    /// Reads one line of Codex's session file (`$CODEX_HOME/sessions/…/rollout-…-<thread>.jsonl`),
    /// which it writes as it goes: a `token_usage_record` right after each model call, with the
    /// thread's running totals (`thread_token_usage`), and a `token_count` event after the
    /// call's tool ran (`info.total_token_usage`). Its standard output counts tokens only at
    /// the end of a turn (`turn.completed`), and not at all when interrupted. The file also
    /// holds each tool call and its output (`response_item`), where a call its sandbox refused
    /// says so; standard output shows no item for it.
    pub fn codex_session(&mut self, line: &str) {
        let Ok(v) = serde_json::from_str::<Value>(line) else { return };
        if v.get("type").and_then(Value::as_str) == Some("response_item") {
            return self.codex_tool_record(&v["payload"]);
        }
        let totals = match v.get("type").and_then(Value::as_str) {
            Some("token_usage_record") => {
                self.codex_calls += 1;
                v.pointer("/payload/thread_token_usage")
            }
            Some("event_msg") if v.pointer("/payload/type").and_then(Value::as_str) == Some("token_count") => v.pointer("/payload/info/total_token_usage"),
            _ => None,
        };
        if let Some(t) = totals.filter(|t| t.is_object()) {
            let t = openai_tokens(t);
            // Totals, not increments: the latest holds, unless an older line came late.
            if t.input + t.cache_read + t.output >= total(&self.codex_file_tokens) {
                self.codex_file_tokens = t;
            }
            self.codex_usage();
        }
    }

    /// Codex's running totals: its completed turns' tokens, or its session file's when those
    /// count more (the turn still runs, or was interrupted); the assignment's model (Codex
    /// never names it); its model calls as turns.
    pub(super) fn codex_usage(&mut self) {
        let t = if total(&self.codex_file_tokens) > total(&self.codex_tokens) { self.codex_file_tokens } else { self.codex_tokens };
        let u = &mut self.usage;
        u.input_tokens = t.input + t.cache_read;
        u.output_tokens = t.output;
        u.turns = self.codex_calls.max(self.codex_turns);
        u.tool_calls = self.tool_calls;
        u.model.clone_from(&self.requested_model);
        if total(&t) > 0 {
            let (usd, basis) = self.prices.cost(self.requested_model.as_deref(), &t);
            u.estimated_cost_usd = Some((usd * 1_000_000.0).round() / 1_000_000.0);
            u.estimate_basis = Some(basis.name().to_owned());
        }
    }
}

impl Reader {
    /// A tool call of the session file, or its output: a call whose output is its sandbox's
    /// refusal (a patch `rejected … read-only sandbox`, a command's `Read-only file system`) is
    /// one the agent was refused.
    fn codex_tool_record(&mut self, item: &Value) {
        let call = item.get("call_id").and_then(Value::as_str).unwrap_or_default().to_owned();
        match item.get("type").and_then(Value::as_str) {
            Some("custom_tool_call" | "function_call") => {
                let name = item.get("name").and_then(Value::as_str).unwrap_or("a tool");
                let input = item.get("input").or_else(|| item.get("arguments")).and_then(Value::as_str).unwrap_or_default();
                self.codex_calls_by_id.insert(call, short(&format!("{name} {}", tool_subject(input)), 120));
            }
            Some("custom_tool_call_output" | "function_call_output") => {
                let output = match &item["output"] {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let refused =
                    ["blocked by read-only sandbox", "rejected by user approval settings", "Read-only file system"].iter().any(|m| output.contains(m));
                let what = self.codex_calls_by_id.remove(&call);
                if refused {
                    self.refused.push(what.unwrap_or_else(|| "a tool call".to_owned()));
                }
            }
            _ => {}
        }
    }
}

/// What a Codex tool call was about: the files of a patch (`*** Add File: NOTES.md`), a
/// command (`{"cmd": …}`), or its input as it is.
fn tool_subject(input: &str) -> String {
    let files: Vec<&str> =
        input.lines().filter_map(|l| ["*** Add File: ", "*** Update File: ", "*** Delete File: "].iter().find_map(|p| l.strip_prefix(p))).collect();
    if !files.is_empty() {
        return files.join(", ");
    }
    match serde_json::from_str::<Value>(input) {
        Ok(v) => v.get("cmd").or_else(|| v.get("command")).map_or_else(|| input.to_owned(), |c| c.as_str().map_or_else(|| c.to_string(), str::to_owned)),
        Err(_) => input.to_owned(),
    }
}

fn total(t: &Tokens) -> i64 {
    t.input + t.cache_write_5m + t.cache_write_1h + t.cache_read + t.output
}

/// OpenAI's token counts: the input counts its cached part, and the output its reasoning.
fn openai_tokens(u: &Value) -> Tokens {
    let input = num(u, "input_tokens");
    let cached = num(u, "cached_input_tokens").min(input);
    Tokens { input: input - cached, cache_read: cached, output: num(u, "output_tokens"), ..Tokens::default() }
}

/// A failed turn's words and class. Codex gives a refused request's JSON error body as its
/// message, without the HTTP status (`{"error": {"type": "invalid_request_error", …}}`): a
/// request the API found wrong, or a key or model it refuses, is refused again, so final. Other
/// messages name a status (`unexpected status 401 …`, `last status: 429 …`), classed as Claude
/// Code's are.
pub(super) fn failure(why: &str) -> (String, &'static str) {
    if let Ok(v) = serde_json::from_str::<Value>(why.trim()) {
        let error = v.get("error").filter(|e| e.is_object()).unwrap_or(&v);
        let words = error.get("message").or_else(|| v.get("detail")).and_then(Value::as_str).unwrap_or(why);
        let kind = error.get("type").and_then(Value::as_str).unwrap_or_default();
        let code = error.get("code").and_then(Value::as_str).unwrap_or_default();
        let refused = matches!(kind, "invalid_request_error" | "authentication_error" | "permission_error" | "not_found_error")
            || matches!(code, "invalid_api_key" | "model_not_found")
            || words.contains("model is not supported");
        return (short(words, 160), if refused { "final" } else { "ordinary" });
    }
    let status = why.split("status").nth(1).map(|rest| rest.trim_start_matches([':', ' '])).and_then(|rest| rest.get(..3)).and_then(|c| c.parse::<i64>().ok());
    let class = match status {
        Some(status) => refused_class(status),
        None if why.contains("model is not supported") => "final",
        None => "ordinary",
    };
    (short(why, 160), class)
}
