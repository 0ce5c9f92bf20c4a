//! A stand-in for the OpenAI Responses API (`POST /v1/responses`), as the Codex CLI calls it,
//! written from OpenAI's published API reference: the request's `input` items and `tools`,
//! the `Response` object with its `usage`, the server-sent events of a streamed response
//! (`response.created` … `response.completed`, each with `type` and `sequence_number`), and
//! the error body `{"error": {"message", "type", "param", "code"}}`. The scripted model of
//! [`super`] decides each reply; it is answered with whichever tool the request declares.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::Response;
use axum::routing::post;
use serde_json::{Value, json};

use super::{Call, FakeModel, Reply, Script, Tokens};

type Calls = Arc<Mutex<Vec<Call>>>;

/// Starts the stand-in on a loopback port; Codex's provider `base_url` is `<url>/v1`.
pub async fn start() -> FakeModel {
    let calls = Calls::default();
    // Codex 0.169 with a custom provider calls nothing else; anything else (such as the
    // WebSocket upgrade `GET /v1/responses` the built-in provider tries first) is recorded and
    // gets the API's 404, after which Codex falls back to HTTP.
    let router = Router::new().route("/v1/responses", post(responses).fallback(other)).fallback(other).with_state(calls.clone());
    FakeModel::serve(router, calls).await
}

async fn other(State(calls): State<Calls>, uri: Uri) -> Response {
    record(&calls, Call { path: uri.path().to_owned(), body: Value::Null, status: 404, reply: None, tokens: None });
    error(404, &format!("Invalid URL ({})", uri.path()), "invalid_request_error")
}

async fn responses(State(calls): State<Calls>, body: Bytes) -> Response {
    let path = "/v1/responses".to_owned();
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        record(&calls, Call { path, body: Value::Null, status: 400, reply: None, tokens: None });
        return error(400, "We could not parse the JSON body of your request.", "invalid_request_error");
    };
    let Some(input) = body.get("input").and_then(Value::as_array) else {
        record(&calls, Call { path, body, status: 400, reply: None, tokens: None });
        return error(400, "Missing required parameter: 'input'.", "invalid_request_error");
    };
    let texts = user_texts(input);
    // Codex puts its own user messages (AGENTS.md, `<environment_context>`) before the
    // person's prompt, so the script is that of the first user text carrying a marker.
    let script = texts.iter().map(|t| Script::of(t)).find(|s| *s != Script::Answer).unwrap_or(Script::Answer);
    tokio::time::sleep(super::thinking(script)).await;
    let replied = input.iter().filter(|item| is_model_output(item)).count();
    let reply = super::next(script, replied, &texts.join("\n"));
    let tokens = super::tokens(replied);
    let n = calls.lock().unwrap().len();
    let (status, answer) = match &reply {
        Reply::Refuse { status, message } => (*status, error(*status, message, "invalid_request_error")),
        _ => match output_item(&reply, &declared_tools(&body), n) {
            Some(item) => {
                let model = body.get("model").and_then(Value::as_str).unwrap_or("gpt-5").to_owned();
                let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
                (200, if stream { streamed(n, &model, item, tokens) } else { whole(n, &model, item, tokens) })
            }
            None => (400, error(400, "The request declares no tool the scripted reply can be made with.", "invalid_request_error")),
        },
    };
    record(&calls, Call { path, body, status, reply: Some(reply), tokens: Some(tokens) });
    answer
}

fn record(calls: &Calls, call: Call) {
    calls.lock().unwrap().push(call);
}

/// The texts of the `user` messages of `input`, in order: a message's `content` is a string
/// or a list of parts, of which `input_text` ones hold text.
fn user_texts(input: &[Value]) -> Vec<String> {
    let users = input.iter().filter(|i| i["role"] == "user" && i.get("type").is_none_or(|t| t == "message"));
    users
        .map(|m| match &m["content"] {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts.iter().filter(|p| p["type"] == "input_text").filter_map(|p| p["text"].as_str()).collect(),
            _ => String::new(),
        })
        .collect()
}

/// Whether an `input` item is one of the model's earlier outputs (each reply is one item).
fn is_model_output(item: &Value) -> bool {
    match item["type"].as_str() {
        Some("function_call" | "custom_tool_call" | "local_shell_call") => true,
        Some("message") | None => item["role"] == "assistant",
        _ => false,
    }
}

/// The tools a request declares: those of its `tools`, and those Codex's newer models get in
/// an `additional_tools` input item instead, with namespaces flattened.
fn declared_tools(body: &Value) -> Vec<Value> {
    let extra = body["input"].as_array().into_iter().flatten().filter(|i| i["type"] == "additional_tools");
    let mut pending: Vec<Value> = body["tools"].as_array().into_iter().chain(extra.filter_map(|i| i["tools"].as_array())).flatten().cloned().collect();
    let mut tools = Vec::new();
    while let Some(tool) = pending.pop() {
        match tool["tools"].as_array() {
            Some(inner) if tool["type"] == "namespace" => pending.extend(inner.iter().cloned()),
            _ => tools.push(tool),
        }
    }
    tools
}

/// The output item that makes `reply`, with the tool `tools` declares for it.
fn output_item(reply: &Reply, tools: &[Value], n: usize) -> Option<Value> {
    let tool = |names: &[&str]| tools.iter().find(|t| names.iter().any(|n| t["name"] == *n || t["type"] == *n));
    // Codex's "code mode" (its default models) offers one freeform `exec` tool that runs
    // JavaScript, in which its other tools are functions of the global `tools` object.
    let code_mode = |call: String| {
        let input = format!("text(JSON.stringify(await tools.{call}));\n");
        json!({"type": "custom_tool_call", "id": format!("ctc_{n}"), "status": "completed", "call_id": format!("call_{n}"), "name": "exec", "input": input})
    };
    let has_code_mode = tool(&["exec"]).is_some_and(|t| t["type"] == "custom");
    let call_id = format!("call_{n}");
    match reply {
        Reply::Text(text) => Some(json!({
            "type": "message", "id": format!("msg_{n}"), "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        })),
        Reply::Write { path, content } => {
            // Codex's patch format: a file to add, each of its lines prefixed with `+`.
            let lines: String = content.lines().map(|l| format!("+{l}\n")).collect();
            let patch = format!("*** Begin Patch\n*** Add File: {path}\n{lines}*** End Patch\n");
            if tool(&["apply_patch"]).is_none() && has_code_mode {
                return Some(code_mode(format!("apply_patch({})", json!(patch))));
            }
            let tool = tool(&["apply_patch"])?;
            Some(if tool["type"] == "custom" {
                json!({"type": "custom_tool_call", "id": format!("ctc_{n}"), "status": "completed", "call_id": call_id, "name": "apply_patch", "input": patch})
            } else {
                function_call(n, "apply_patch", json!({"input": patch}))
            })
        }
        Reply::Run { command } => {
            let argv = json!(["bash", "-lc", command]);
            let shells = ["exec_command", "shell_command", "shell", "local_shell"];
            if tool(&shells).is_none() && has_code_mode {
                return Some(code_mode(format!("exec_command({})", json!({"cmd": command}))));
            }
            let tool = tool(&shells)?;
            Some(match (tool["type"].as_str(), tool["name"].as_str()) {
                (Some("local_shell"), _) => json!({
                    "type": "local_shell_call", "id": format!("lsh_{n}"), "status": "completed", "call_id": call_id,
                    "action": {"type": "exec", "command": argv, "env": {}},
                }),
                (_, Some("exec_command")) => function_call(n, "exec_command", json!({"cmd": command})),
                (_, Some("shell_command")) => function_call(n, "shell_command", json!({"command": command})),
                (_, name) => function_call(n, name.unwrap_or("shell"), json!({"command": argv})),
            })
        }
        Reply::Refuse { .. } => None,
    }
}

fn function_call(n: usize, name: &str, arguments: Value) -> Value {
    json!({"type": "function_call", "id": format!("fc_{n}"), "status": "completed", "call_id": format!("call_{n}"), "name": name, "arguments": arguments.to_string()})
}

/// The `Response` object: `status` is `in_progress` with no output yet, or `completed`.
fn response_object(n: usize, model: &str, output: Option<&Value>, tokens: Tokens) -> Value {
    let input_tokens = tokens.input + tokens.cache_write + tokens.cache_read;
    let usage = json!({
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": tokens.cache_read},
        "output_tokens": tokens.output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + tokens.output,
    });
    json!({
        "id": format!("resp_{n}"), "object": "response", "created_at": 1_700_000_000 + n as u64, "model": model,
        "status": if output.is_some() { "completed" } else { "in_progress" },
        "error": null, "incomplete_details": null, "parallel_tool_calls": false,
        "output": output.map_or(vec![], |o| vec![o.clone()]),
        "usage": if output.is_some() { usage } else { Value::Null },
    })
}

fn whole(n: usize, model: &str, item: Value, tokens: Tokens) -> Response {
    let body = response_object(n, model, Some(&item), tokens).to_string();
    Response::builder().header(header::CONTENT_TYPE, "application/json").body(Body::from(body)).unwrap()
}

/// The server-sent events of a streamed response, per the streaming reference: lifecycle
/// events around the item's `added`, its deltas and `done` events, and `done`.
fn streamed(n: usize, model: &str, item: Value, tokens: Tokens) -> Response {
    let mut events = vec![
        json!({"type": "response.created", "response": response_object(n, model, None, tokens)}),
        json!({"type": "response.in_progress", "response": response_object(n, model, None, tokens)}),
    ];
    let id = item["id"].clone();
    let mut added = item.clone();
    added["status"] = json!("in_progress");
    let at = json!({"item_id": id, "output_index": 0});
    let with = |mut event: Value, fields: Value| {
        for (k, v) in fields.as_object().into_iter().flatten().chain(at.as_object().into_iter().flatten()) {
            event[k] = v.clone();
        }
        event
    };
    match item["type"].as_str() {
        Some("message") => {
            let text = item["content"][0]["text"].clone();
            added["content"] = json!([]);
            let part = |text: &Value| json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
            events.push(json!({"type": "response.output_item.added", "output_index": 0, "item": added}));
            events.push(with(json!({"type": "response.content_part.added", "content_index": 0}), json!({"part": part(&json!(""))})));
            events.push(with(json!({"type": "response.output_text.delta", "content_index": 0}), json!({"delta": text, "logprobs": []})));
            events.push(with(json!({"type": "response.output_text.done", "content_index": 0}), json!({"text": text, "logprobs": []})));
            events.push(with(json!({"type": "response.content_part.done", "content_index": 0}), json!({"part": part(&text)})));
        }
        Some("function_call") => {
            let arguments = item["arguments"].clone();
            added["arguments"] = json!("");
            events.push(json!({"type": "response.output_item.added", "output_index": 0, "item": added}));
            events.push(with(json!({"type": "response.function_call_arguments.delta"}), json!({"delta": arguments})));
            events.push(with(json!({"type": "response.function_call_arguments.done"}), json!({"arguments": arguments, "name": item["name"]})));
        }
        Some("custom_tool_call") => {
            let input = item["input"].clone();
            added["input"] = json!("");
            events.push(json!({"type": "response.output_item.added", "output_index": 0, "item": added}));
            events.push(with(json!({"type": "response.custom_tool_call_input.delta"}), json!({"delta": input})));
            events.push(with(json!({"type": "response.custom_tool_call_input.done"}), json!({"input": input})));
        }
        _ => events.push(json!({"type": "response.output_item.added", "output_index": 0, "item": added})),
    }
    events.push(json!({"type": "response.output_item.done", "output_index": 0, "item": item}));
    events.push(json!({"type": "response.completed", "response": response_object(n, model, Some(&item), tokens)}));
    let mut body = String::new();
    for (sequence_number, mut event) in events.into_iter().enumerate() {
        event["sequence_number"] = json!(sequence_number);
        body.push_str(&format!("event: {}\ndata: {event}\n\n", event["type"].as_str().unwrap_or_default()));
    }
    Response::builder().header(header::CONTENT_TYPE, "text/event-stream").header(header::CACHE_CONTROL, "no-cache").body(Body::from(body)).unwrap()
}

/// An error in the API's documented shape.
fn error(status: u16, message: &str, kind: &str) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": null}});
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    Response::builder().status(status).header(header::CONTENT_TYPE, "application/json").body(Body::from(body.to_string())).unwrap()
}
