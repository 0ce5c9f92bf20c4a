//! Reading what `codex exec --json` prints: its thread, turn and item events, and the
//! `{"id", "msg"}` events Codex printed before 0.44.

use serde_json::Value;

use super::{Reader, num, short};
use crate::prices::Tokens;

/// Codex items that are tool calls (not messages, reasoning, plans or warnings).
const CODEX_TOOLS: [&str; 4] = ["command_execution", "file_change", "mcp_tool_call", "web_search"];

impl Reader {
    pub(super) fn codex(&mut self, line: &str) -> &'static str {
        let Ok(v) = serde_json::from_str::<Value>(line) else { return "stderr" };
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
                let why = v.pointer("/error/message").and_then(Value::as_str).unwrap_or("turn failed");
                self.codex_failure = Some(short(&unwrap_json_message(why), 160));
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
                self.codex_failure = Some(short(msg.get("message").and_then(Value::as_str).unwrap_or("error"), 160));
                "error"
            }
            "stream_error" => "warning",
            _ => "other",
        }
    }

    /// Codex's running totals: its turns' tokens, the assignment's model (Codex never names it).
    pub(super) fn codex_usage(&mut self) {
        let t = self.codex_tokens;
        let u = &mut self.usage;
        u.input_tokens = t.input + t.cache_read;
        u.output_tokens = t.output;
        u.turns = self.codex_turns;
        u.tool_calls = self.tool_calls;
        u.model.clone_from(&self.requested_model);
        if self.codex_turns > 0 {
            let (usd, basis) = self.prices.cost(self.requested_model.as_deref(), &t);
            u.estimated_cost_usd = Some((usd * 1_000_000.0).round() / 1_000_000.0);
            u.estimate_basis = Some(basis.name().to_owned());
        }
    }
}

/// The words of a Codex error message that is itself the API's JSON answer
/// (`{"detail": "…"}`, `{"error": {"message": "…"}}`); any other message as it is.
fn unwrap_json_message(message: &str) -> String {
    let Ok(v) = serde_json::from_str::<Value>(message.trim()) else { return message.to_owned() };
    let words = v.get("detail").or_else(|| v.pointer("/error/message")).or_else(|| v.get("message")).and_then(Value::as_str);
    words.map_or_else(|| message.to_owned(), str::to_owned)
}

/// A request the API refuses (a 4xx other than 408/429: a bad key, a model the account may not
/// use) is refused again: final, as for Claude Code. Anything else may pass on a later try.
pub(super) fn failure_class(why: &str) -> &'static str {
    let status = why.split("status ").nth(1).and_then(|rest| rest.get(..3)).and_then(|code| code.parse::<u16>().ok());
    let refused = status.is_some_and(|s| (400..500).contains(&s) && s != 408 && s != 429);
    if refused || why.contains("model is not supported") { "final" } else { "ordinary" }
}
