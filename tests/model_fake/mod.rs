//! Stand-ins for the model APIs the real agent CLIs call, on `127.0.0.1:0`: the Anthropic
//! Messages API (`anthropic`, for Claude Code) and the OpenAI Responses API (`openai`, for
//! Codex), each answering in its published wire format (streamed events, usage fields, error
//! bodies). Behind both is one scripted model: a marker in the conversation's first user text
//! picks a [`Script`], and the number of the model's earlier replies in the conversation picks
//! the step of it. Every request is recorded, with what was answered.

use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::task::JoinHandle;

pub mod anthropic;
pub mod openai;

/// What the scripted model does in a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    /// `@EDIT@`: writes `NOTES.md`, then runs `wc -l NOTES.md > COUNT.txt`, then answers.
    Edit,
    /// `@FOREVER@`: runs `echo turn N` every call, for at most [`FOREVER_CALLS`] calls.
    Forever,
    /// `@BAD@`: every call is refused with a 400 (`invalid_request_error`).
    Bad,
    /// `@LISTEN@`: runs `sleep 1` each call until a user text holds `@STOP@` (a person's
    /// message), then answers `heard`; at most [`FOREVER_CALLS`] calls.
    Listen,
    /// Anything else: answers at once, in words, with no tool.
    Answer,
}

/// The most calls a conversation that keeps working makes before it answers.
pub const FOREVER_CALLS: usize = 200;

/// How long the model takes over a call before it answers: a conversation that keeps working
/// spends at a model's pace (a second a call), not as fast as loopback answers.
pub fn thinking(script: Script) -> std::time::Duration {
    match script {
        Script::Forever => std::time::Duration::from_secs(1),
        _ => std::time::Duration::ZERO,
    }
}

/// The words of the 400 that [`Script::Bad`] answers.
pub const BAD_REQUEST: &str = "temperature: Input should be less than or equal to 1";

impl Script {
    /// The script a conversation's text asks for.
    pub fn of(text: &str) -> Script {
        if text.contains("@EDIT@") {
            Script::Edit
        } else if text.contains("@FOREVER@") {
            Script::Forever
        } else if text.contains("@BAD@") {
            Script::Bad
        } else if text.contains("@LISTEN@") {
            Script::Listen
        } else {
            Script::Answer
        }
    }
}

/// What the model does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Creates a file (relative to the agent's working directory) with this content.
    Write { path: &'static str, content: String },
    /// Runs a shell command in the agent's working directory.
    Run { command: String },
    /// Answers in words and ends its turn.
    Text(String),
    /// Refuses the request: the HTTP status and the error's words.
    Refuse { status: u16, message: &'static str },
}

/// The next reply of `script` after `replied` earlier replies of the model in the
/// conversation; `texts` is every user text of the conversation so far.
pub fn next(script: Script, replied: usize, texts: &str) -> Reply {
    match script {
        Script::Edit => match replied {
            0 => Reply::Write { path: "NOTES.md", content: "hello from the model\n".to_owned() },
            1 => Reply::Run { command: "wc -l NOTES.md > COUNT.txt".to_owned() },
            _ => Reply::Text("Wrote NOTES.md and counted its lines.\n\nPULL REQUEST\nAdd NOTES.md".to_owned()),
        },
        Script::Forever if replied < FOREVER_CALLS => Reply::Run { command: format!("echo turn {replied}") },
        Script::Listen if replied < FOREVER_CALLS && !texts.contains("@STOP@") => Reply::Run { command: "sleep 1".to_owned() },
        Script::Listen => Reply::Text("heard".to_owned()),
        Script::Bad => Reply::Refuse { status: 400, message: BAD_REQUEST },
        Script::Forever | Script::Answer => Reply::Text("Nothing to change.".to_owned()),
    }
}

/// The tokens the model reports for one call: a large prompt (the first call writes the
/// cache, later ones read it), so that a session that keeps working spends visibly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tokens {
    pub input: u64,
    pub cache_write: u64,
    pub cache_read: u64,
    pub output: u64,
}

/// The usage of the call after `replied` earlier replies.
pub fn tokens(replied: usize) -> Tokens {
    let replied = replied as u64;
    if replied == 0 {
        Tokens { input: 2_000, cache_write: 18_000, cache_read: 0, output: 300 }
    } else {
        Tokens { input: 1_500 + 100 * replied, cache_write: 500, cache_read: 18_000 + 500 * replied, output: 250 }
    }
}

/// One request the stand-in received and what it answered.
#[derive(Debug, Clone)]
pub struct Call {
    pub path: String,
    pub body: Value,
    /// The status answered.
    pub status: u16,
    /// The script's reply, when the request was a conversation's turn.
    pub reply: Option<Reply>,
    /// The usage reported with it.
    pub tokens: Option<Tokens>,
}

/// A running stand-in; stopped when dropped.
pub struct FakeModel {
    /// `http://127.0.0.1:<port>`, without a path.
    pub url: String,
    calls: Arc<Mutex<Vec<Call>>>,
    task: JoinHandle<()>,
}

impl FakeModel {
    /// Serves `router` (which records into `calls`) on a loopback port.
    pub(crate) async fn serve(router: axum::Router, calls: Arc<Mutex<Vec<Call>>>) -> FakeModel {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.expect("the model stand-in serves");
        });
        FakeModel { url, calls, task }
    }

    /// Every request so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}
