//! A transcript line as people read it. Hosts report what the harness printed: Claude Code's
//! `stream-json` lines (`system`, `assistant`, `user` with tool results, `result`) and Codex's
//! `exec --json` events (`item.started`/`item.completed` with messages, reasoning, commands,
//! file changes), one JSON object per line; a command step's output is plain text. The page
//! shows the assistant's words, each tool call with what it was called on, a short form of
//! each tool result, and the session's end, never the raw JSON.

use serde_json::Value;

/// What one line shows: its kind (a CSS class: `text`, `tool`, `result`, `thinking`, `info`,
/// `error`, `output`) and its text. Lines with nothing to show have empty text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(super) struct Shown {
    pub kind: &'static str,
    pub text: String,
}

fn shown(kind: &'static str, text: impl Into<String>) -> Shown {
    Shown { kind, text: text.into() }
}

/// The longest text a line shows; the rest is in the step's logs (REST `…/logs`).
const MAX: usize = 2000;
/// The longest a tool result or a tool's argument shows.
const SHORT: usize = 160;

fn clip(text: &str, max: usize) -> String {
    let text = text.trim();
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max - 1).collect();
    out.push('…');
    out
}

/// The first line of a text, with how many more follow.
fn first_line(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    match lines.as_slice() {
        [] => "(empty)".into(),
        [one] => clip(one, SHORT),
        [first, rest @ ..] => format!("{} (+{} lines)", clip(first, SHORT), rest.len()),
    }
}

fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// One reported line in words.
pub(super) fn show(stream: &str, line: &str) -> Shown {
    let Ok(v) = serde_json::from_str::<Value>(line) else {
        let kind = if stream == "stderr" { "error" } else { "output" };
        return shown(kind, clip(line, MAX));
    };
    if !v.is_object() {
        return shown("output", clip(line, MAX));
    }
    match str_at(&v, "type").unwrap_or_default() {
        // Claude Code.
        "system" if str_at(&v, "subtype") == Some("init") => {
            let model = str_at(&v, "model").unwrap_or("a model");
            let tools = v.get("tools").and_then(Value::as_array).map_or(0, Vec::len);
            shown("info", format!("Session started with {model}, {tools} tools"))
        }
        "system" => shown("info", str_at(&v, "subtype").map(|s| format!("System: {}", s.replace('_', " "))).unwrap_or_default()),
        "assistant" => claude_message(&v["message"]),
        "user" => claude_results(&v["message"]),
        "result" => claude_result(&v),
        // Codex.
        "thread.started" => shown("info", "Session started"),
        "turn.started" => shown("info", ""),
        "turn.completed" => {
            let u = &v["usage"];
            let n = |k: &str| u.get(k).and_then(Value::as_i64).unwrap_or(0);
            shown("info", format!("Turn done: {} tokens in, {} out", n("input_tokens"), n("output_tokens")))
        }
        "turn.failed" => shown("error", format!("Turn failed: {}", v.pointer("/error/message").and_then(Value::as_str).unwrap_or("no message"))),
        "error" => shown("error", format!("Error: {}", clip(str_at(&v, "message").unwrap_or("no message"), MAX))),
        "item.started" | "item.updated" | "item.completed" => codex_item(&v["item"], str_at(&v, "type") == Some("item.completed")),
        _ => shown("output", clip(line, MAX)),
    }
}

/// An assistant message: its text, its thinking, and each tool call.
fn claude_message(message: &Value) -> Shown {
    let mut parts: Vec<String> = Vec::new();
    let mut kind = "text";
    for c in message.get("content").and_then(Value::as_array).into_iter().flatten() {
        match str_at(c, "type").unwrap_or_default() {
            "text" => parts.push(clip(str_at(c, "text").unwrap_or_default(), MAX)),
            "thinking" => {
                if parts.is_empty() {
                    kind = "thinking";
                }
                parts.push(format!("(thinking) {}", clip(str_at(c, "thinking").unwrap_or_default(), SHORT)));
            }
            "tool_use" => {
                if parts.is_empty() {
                    kind = "tool";
                }
                parts.push(tool_call(str_at(c, "name").unwrap_or("a tool"), &c["input"]));
            }
            _ => {}
        }
    }
    shown(kind, parts.join("\n"))
}

/// `→ Bash: cargo test`, `→ Edit: src/lib.rs`: a tool and what it was called on.
fn tool_call(name: &str, input: &Value) -> String {
    let on = ["command", "file_path", "path", "pattern", "url", "query", "description", "prompt"]
        .iter()
        .find_map(|k| str_at(input, k))
        .map(|s| clip(s, SHORT))
        .or_else(|| input.as_object().filter(|m| !m.is_empty()).map(|_| clip(&input.to_string(), SHORT)));
    match on {
        Some(on) => format!("→ {name}: {on}"),
        None => format!("→ {name}"),
    }
}

/// A user line of tool results: each result's first line, errors marked.
fn claude_results(message: &Value) -> Shown {
    let mut parts: Vec<String> = Vec::new();
    let mut failed = false;
    let content = message.get("content");
    if let Some(text) = content.and_then(Value::as_str) {
        return shown("text", format!("(to the agent) {}", clip(text, MAX)));
    }
    for c in content.and_then(Value::as_array).into_iter().flatten() {
        match str_at(c, "type").unwrap_or_default() {
            "tool_result" => {
                let text = match c.get("content") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(blocks)) => blocks.iter().filter_map(|b| str_at(b, "text")).collect::<Vec<_>>().join("\n"),
                    _ => String::new(),
                };
                let error = c.get("is_error").and_then(Value::as_bool) == Some(true);
                failed |= error;
                parts.push(format!("{} {}", if error { "← error:" } else { "←" }, first_line(&text)));
            }
            "text" => parts.push(format!("(to the agent) {}", clip(str_at(c, "text").unwrap_or_default(), MAX))),
            _ => {}
        }
    }
    shown(if failed { "error" } else { "result" }, parts.join("\n"))
}

/// The session's end: how it ended, its turns, its cost and its last words.
fn claude_result(v: &Value) -> Shown {
    let subtype = str_at(v, "subtype").unwrap_or("ended").replace('_', " ");
    let mut words = vec![format!("Session ended: {subtype}")];
    if let Some(turns) = v.get("num_turns").and_then(Value::as_i64) {
        words.push(format!("{turns} turns"));
    }
    if let Some(cost) = v.get("total_cost_usd").and_then(Value::as_f64) {
        words.push(format!("${cost:.4}"));
    }
    if let Some(ms) = v.get("duration_ms").and_then(Value::as_f64) {
        words.push(super::view::duration(ms / 1000.0));
    }
    let mut text = words.join(" · ");
    if let Some(result) = str_at(v, "result").filter(|r| !r.trim().is_empty()) {
        text.push('\n');
        text.push_str(&clip(result, MAX));
    }
    let error = v.get("is_error").and_then(Value::as_bool) == Some(true);
    shown(if error { "error" } else { "info" }, text)
}

/// A Codex item: a message, reasoning, a command with its exit code, files changed, a tool.
fn codex_item(item: &Value, completed: bool) -> Shown {
    let kind = str_at(item, "type").or_else(|| str_at(item, "item_type")).unwrap_or_default();
    match kind {
        "agent_message" | "assistant_message" if completed => shown("text", clip(str_at(item, "text").unwrap_or_default(), MAX)),
        "reasoning" if completed => shown("thinking", format!("(thinking) {}", clip(str_at(item, "text").unwrap_or_default(), SHORT))),
        "command_execution" => {
            let command = clip(str_at(item, "command").unwrap_or_default(), SHORT);
            match (completed, item.get("exit_code").and_then(Value::as_i64)) {
                (false, _) => shown("tool", format!("→ $ {command}")),
                (true, Some(0)) => shown("result", format!("← $ {command}: {}", first_line(str_at(item, "aggregated_output").unwrap_or_default()))),
                (true, Some(code)) => shown("error", format!("← $ {command}: exit {code}")),
                (true, None) => shown("result", format!("← $ {command}")),
            }
        }
        "file_change" if completed => {
            let paths: Vec<&str> = item.get("changes").and_then(Value::as_array).into_iter().flatten().filter_map(|c| str_at(c, "path")).collect();
            shown("tool", format!("→ changed {}", if paths.is_empty() { "files".to_owned() } else { paths.join(", ") }))
        }
        "mcp_tool_call" if !completed => shown("tool", format!("→ {}.{}", str_at(item, "server").unwrap_or("mcp"), str_at(item, "tool").unwrap_or("tool"))),
        "web_search" if completed => shown("tool", format!("→ search: {}", clip(str_at(item, "query").unwrap_or_default(), SHORT))),
        "todo_list" => {
            let items: Vec<String> = item
                .get("items")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|t| {
                    format!("{} {}", if t.get("completed").and_then(Value::as_bool) == Some(true) { "☑" } else { "☐" }, str_at(t, "text").unwrap_or_default())
                })
                .collect();
            shown("info", format!("Plan:\n{}", items.join("\n")))
        }
        "error" => shown("error", format!("Warning: {}", clip(str_at(item, "message").unwrap_or_default(), MAX))),
        _ => shown("info", ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines as Claude Code 2.x prints them with `--output-format stream-json --verbose`.
    #[test]
    fn claude_lines_read_as_words_and_tool_calls() {
        let init = r#"{"type":"system","subtype":"init","cwd":"/w","session_id":"s1","tools":["Task","Bash","Read"],"mcp_servers":[],"model":"claude-sonnet-4-5-20250929","permissionMode":"default","apiKeySource":"none"}"#;
        assert_eq!(show("system", init), shown("info", "Session started with claude-sonnet-4-5-20250929, 3 tools"));
        let text = r#"{"type":"assistant","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"I'll run the tests."}],"stop_reason":null,"usage":{"input_tokens":3,"output_tokens":8}},"parent_tool_use_id":null,"session_id":"s1"}"#;
        assert_eq!(show("assistant", text), shown("text", "I'll run the tests."));
        let tool = r#"{"type":"assistant","message":{"id":"msg_2","type":"message","role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"cargo test","description":"Run the tests"}}],"usage":{}},"session_id":"s1"}"#;
        assert_eq!(show("assistant", tool), shown("tool", "→ Bash: cargo test"));
        let result = r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_1","type":"tool_result","content":"running 3 tests\ntest a ... ok\ntest b ... ok","is_error":false}]},"parent_tool_use_id":null,"session_id":"s1"}"#;
        assert_eq!(show("tool_result", result), shown("result", "← running 3 tests (+2 lines)"));
        let failed = r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_2","type":"tool_result","content":[{"type":"text","text":"File does not exist."}],"is_error":true}]}}"#;
        assert_eq!(show("tool_result", failed), shown("error", "← error: File does not exist."));
        let end = r#"{"type":"result","subtype":"success","is_error":false,"duration_ms":65000,"duration_api_ms":60000,"num_turns":4,"result":"Fixed the bug.","session_id":"s1","total_cost_usd":0.1234,"usage":{}}"#;
        assert_eq!(show("result", end), shown("info", "Session ended: success · 4 turns · $0.1234 · 1 min 5 s\nFixed the bug."));
    }

    // Lines as `codex exec --json` prints them.
    #[test]
    fn codex_events_read_as_words_and_commands() {
        let msg = r#"{"type":"item.completed","item":{"id":"item_3","type":"agent_message","text":"Done: the test passes."}}"#;
        assert_eq!(show("assistant", msg), shown("text", "Done: the test passes."));
        let started = r#"{"type":"item.started","item":{"id":"item_1","type":"command_execution","command":"bash -lc 'cargo test'","aggregated_output":"","exit_code":null,"status":"in_progress"}}"#;
        assert_eq!(show("tool", started), shown("tool", "→ $ bash -lc 'cargo test'"));
        let done = r#"{"type":"item.completed","item":{"id":"item_1","type":"command_execution","command":"bash -lc 'cargo test'","aggregated_output":"test result: ok\n","exit_code":0,"status":"completed"}}"#;
        assert_eq!(show("tool", done), shown("result", "← $ bash -lc 'cargo test': test result: ok"));
        let change =
            r#"{"type":"item.completed","item":{"id":"item_2","type":"file_change","changes":[{"path":"src/lib.rs","kind":"update"}],"status":"completed"}}"#;
        assert_eq!(show("tool", change), shown("tool", "→ changed src/lib.rs"));
        let turn = r#"{"type":"turn.completed","usage":{"input_tokens":2400,"cached_input_tokens":1200,"output_tokens":300}}"#;
        assert_eq!(show("turn", turn), shown("info", "Turn done: 2400 tokens in, 300 out"));
    }

    #[test]
    fn plain_output_is_shown_as_it_is() {
        assert_eq!(show("stdout", "compiling widget v0.1.0"), shown("output", "compiling widget v0.1.0"));
        assert_eq!(show("stderr", "warning: unused"), shown("error", "warning: unused"));
        assert_eq!(show("stdout", "42"), shown("output", "42"));
    }
}
