//! Stand-in for the Anthropic Messages API, which Claude Code calls at `ANTHROPIC_BASE_URL`.
//! Written from Anthropic's published API reference: "Messages" (`POST /v1/messages`),
//! "Streaming Messages" (the server-sent events), "Count Message tokens"
//! (`POST /v1/messages/count_tokens`) and "Errors" (the error body and the `request-id` header).
//! The scripted model of [`super`] decides each turn; its writes and commands are calls of
//! Claude Code's own `Write` and `Bash` tools.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// Serves the stand-in on a loopback port.
pub async fn start() -> FakeModel {
    let calls = Calls::default();
    let router = Router::new()
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .fallback(not_found)
        .with_state(calls.clone());
    FakeModel::serve(router, calls).await
}

/// `POST /v1/messages`: one call of the model.
async fn messages(State(calls): State<Calls>, uri: Uri, body: Bytes) -> Response {
    let path = uri.path().to_owned();
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return error(&calls, path, Value::Null, 400, "The request body is not valid JSON.", None);
    };
    let (Some(model), Some(messages)) = (body["model"].as_str(), body["messages"].as_array()) else {
        return error(&calls, path, body, 400, "model: Field required; messages: Field required", None);
    };
    let model = model.to_owned();
    let stream = body["stream"].as_bool() == Some(true);
    let texts = user_texts(messages);
    let replied = messages.iter().filter(|m| m["role"] == "assistant").count();

    // The agent's own turns stream and offer tools (none with `--tools ""`, but they still
    // stream); the CLI's side requests, such as auto mode's safety monitor of a command, ask
    // without tools and without streaming, and are not the script's to answer.
    let turn = stream || body["tools"].as_array().is_some_and(|tools| !tools.is_empty());
    // Claude Code puts its own context (`<system-reminder>` blocks) before the person's words;
    // the script is the one the first of the person's texts asks for.
    let first = texts.iter().find(|text| !text.trim_start().starts_with("<system-reminder>")).or(texts.first());
    let script = Script::of(first.map_or("", String::as_str));
    tokio::time::sleep(super::thinking(script)).await;
    let reply = turn.then(|| super::next(script, replied, &texts.join("\n")));
    let tokens = if turn { super::tokens(replied) } else { SIDE_TOKENS };

    let mut stop = (if matches!(reply, Some(Reply::Write { .. } | Reply::Run { .. })) { "tool_use" } else { "end_turn" }, Value::Null);
    let content = match &reply {
        Some(Reply::Refuse { status, message }) => return error(&calls, path, body, *status, message, reply.clone()),
        Some(Reply::Write { path, content }) => {
            let file_path = match working_directory(&body) {
                Some(dir) => format!("{}/{path}", dir.trim_end_matches('/')),
                None => (*path).to_owned(),
            };
            json!({"type": "tool_use", "id": id("toolu"), "name": "Write", "input": {"file_path": file_path, "content": content}})
        }
        Some(Reply::Run { command }) => {
            json!({"type": "tool_use", "id": id("toolu"), "name": "Bash", "input": {"command": command, "description": "Run the script's command"}})
        }
        Some(Reply::Text(text)) => json!({"type": "text", "text": text}),
        None => {
            let (text, stopped) = side_answer(&body);
            if let Some(sequence) = stopped {
                stop = ("stop_sequence", json!(sequence));
            }
            json!({"type": "text", "text": text})
        }
    };
    calls.lock().expect("calls lock").push(Call { path, body, status: 200, reply, tokens: Some(tokens) });
    let message_id = id("msg");
    let request_id = id("req");
    if !stream {
        let message = json!({
            "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [content],
            "stop_reason": stop.0, "stop_sequence": stop.1, "usage": usage(tokens, tokens.output),
        });
        return respond(StatusCode::OK, "application/json", &request_id, Body::from(message.to_string()));
    }
    let events = stream_events(&message_id, &model, content, stop, tokens);
    let chunks = events.into_iter().map(|(event, data)| Ok::<_, Infallible>(Bytes::from(format!("event: {event}\ndata: {data}\n\n"))));
    respond(StatusCode::OK, "text/event-stream", &request_id, Body::from_stream(futures::stream::iter(chunks)))
}

/// The server-sent events of one streamed message, in the published order: `message_start`
/// (no content yet, the input usage), the one content block (start, deltas, stop),
/// `message_delta` (stop reason, final usage), `message_stop`.
fn stream_events(message_id: &str, model: &str, content: Value, stop: (&str, Value), tokens: Tokens) -> Vec<(&'static str, Value)> {
    let mut events = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {
                "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": null, "stop_sequence": null, "usage": usage(tokens, 1),
            }}),
        ),
        ("ping", json!({"type": "ping"})),
    ];
    // A block starts empty and its content arrives in deltas, split in two to be a real stream;
    // a tool's input arrives as pieces of its JSON text (`input_json_delta`).
    let (start, deltas) = if content["type"] == "tool_use" {
        let input = content["input"].to_string();
        let start = json!({"type": "tool_use", "id": content["id"], "name": content["name"], "input": {}});
        (start, halves(&input).map(|part| json!({"type": "input_json_delta", "partial_json": part})))
    } else {
        let text = content["text"].as_str().unwrap_or_default();
        (json!({"type": "text", "text": ""}), halves(text).map(|part| json!({"type": "text_delta", "text": part})))
    };
    events.push(("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": start})));
    for delta in deltas {
        events.push(("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": delta})));
    }
    events.push(("content_block_stop", json!({"type": "content_block_stop", "index": 0})));
    // `message_delta`'s usage is cumulative: the output tokens of the whole message.
    events.push((
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop.0, "stop_sequence": stop.1}, "usage": usage(tokens, tokens.output)}),
    ));
    events.push(("message_stop", json!({"type": "message_stop"})));
    events
}

/// The usage of a side request: a short prompt, a few words out.
const SIDE_TOKENS: Tokens = Tokens { input: 3_000, cache_write: 0, cache_read: 0, output: 8 };

/// The answer to a side request and the stop sequence it ended on, if any. Auto mode's safety
/// monitor (a system prompt asking for `<block>no</block>` or `<block>yes</block>…`) is told the
/// command may run: the scripted commands touch nothing outside the working directory. When it
/// passes `</block>` as a stop sequence, the API stops there and leaves the sequence out.
fn side_answer(body: &Value) -> (&'static str, Option<&'static str>) {
    if !body["system"].to_string().contains("<block>no</block>") {
        return ("OK", None);
    }
    let stops = body["stop_sequences"].as_array().is_some_and(|s| s.iter().any(|s| s == "</block>"));
    if stops { ("<block>no", Some("</block>")) } else { ("<block>no</block>", None) }
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, here about a token per four bytes.
async fn count_tokens(State(calls): State<Calls>, uri: Uri, body: Bytes) -> Response {
    let path = uri.path().to_owned();
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return error(&calls, path, Value::Null, 400, "The request body is not valid JSON.", None);
    };
    let input_tokens = (body["system"].to_string().len() + body["messages"].to_string().len() + body["tools"].to_string().len()) / 4;
    calls.lock().expect("calls lock").push(Call { path, body, status: 200, reply: None, tokens: None });
    respond(StatusCode::OK, "application/json", &id("req"), Body::from(json!({"input_tokens": input_tokens}).to_string()))
}

/// Anything else the CLI asks for does not exist here.
async fn not_found(State(calls): State<Calls>, uri: Uri) -> Response {
    let message = format!("Not found: {}", uri.path());
    error(&calls, uri.path().to_owned(), Value::Null, 404, &message, None)
}

/// An error in the published shape: `{"type":"error","error":{"type","message"},"request_id"}`,
/// the error type following the status, the same id in the `request-id` header. `reply` is the
/// script's [`Reply::Refuse`] when the script refused; `None` for a request that cannot be read.
fn error(calls: &Calls, path: String, body: Value, status: u16, message: &str, reply: Option<Reply>) -> Response {
    let kind = match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    };
    let request_id = id("req");
    calls.lock().expect("calls lock").push(Call { path, body, status, reply, tokens: None });
    let body = json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id});
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    respond(status, "application/json", &request_id, Body::from(body.to_string()))
}

fn respond(status: StatusCode, content_type: &str, request_id: &str, body: Body) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-cache")
        .header("request-id", request_id)
        .body(body)
        .unwrap_or_default()
}

/// The usage object of the published reference; `output` differs between `message_start` and the end.
fn usage(tokens: Tokens, output: u64) -> Value {
    json!({
        "input_tokens": tokens.input,
        "cache_creation_input_tokens": tokens.cache_write,
        "cache_read_input_tokens": tokens.cache_read,
        "output_tokens": output,
    })
}

/// Every text the person (or the CLI on their behalf) put in the conversation, in order: string
/// contents, `text` blocks and `tool_result` contents (a string or text blocks) of every message
/// that is not the model's. Claude Code 2.1 surfaces a message the person writes mid-turn ("The
/// user sent a new message while you were working: …") inside the next tool result, or as a
/// `system`-role entry of `messages` after it.
fn user_texts(messages: &[Value]) -> Vec<String> {
    fn collect(content: &Value, texts: &mut Vec<String>) {
        match content {
            Value::String(text) => texts.push(text.clone()),
            Value::Array(blocks) => {
                for block in blocks {
                    match block["type"].as_str() {
                        Some("text") => texts.extend(block["text"].as_str().map(str::to_owned)),
                        Some("tool_result") => collect(&block["content"], texts),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let mut texts = Vec::new();
    for message in messages.iter().filter(|m| m["role"] != "assistant") {
        collect(&message["content"], &mut texts);
    }
    texts
}

/// The agent's working directory, as Claude Code states it ("Primary working directory: …"):
/// in `system`, or (2.1.x) in a `system`-role entry of `messages` that carries the environment.
fn working_directory(body: &Value) -> Option<String> {
    let blocks = |content: &Value| match content {
        Value::String(text) => vec![text.clone()],
        Value::Array(blocks) => blocks.iter().filter_map(|b| b["text"].as_str()).map(str::to_owned).collect(),
        _ => Vec::new(),
    };
    let mut texts = blocks(&body["system"]);
    texts.extend(body["messages"].as_array().into_iter().flatten().filter(|m| m["role"] != "assistant").flat_map(|m| blocks(&m["content"])));
    texts
        .iter()
        .flat_map(|text| text.lines())
        .find_map(|line| line.trim().trim_start_matches("- ").strip_prefix("Primary working directory:"))
        .map(|dir| dir.trim().to_owned())
}

/// `text` in two pieces, split at a character boundary.
fn halves(text: &str) -> [&str; 2] {
    let mut middle = text.len() / 2;
    while !text.is_char_boundary(middle) {
        middle += 1;
    }
    [&text[..middle], &text[middle..]]
}

/// A fresh id in the API's style: `msg_…`, `toolu_…`, `req_…`.
fn id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{prefix}_01{:022}", NEXT.fetch_add(1, Ordering::Relaxed))
}
