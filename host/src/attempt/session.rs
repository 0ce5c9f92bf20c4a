//! A running harness's session: the reporter that sends its output to the server in batches
//! (each answer says whether to stop), the tail of its output file, its process, and the
//! conversation on its stdin (the prompt, then people's messages as user lines).

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use protocol::{Message, SessionLine, Usage};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::client::{ClientError, SessionReport};
use crate::harness::{Exit, Reader};
use crate::journal::Entry;
use crate::process;

use super::signal::{Shared, Stop, StopSignal};

/// Lines per session report, and their bytes (the server takes 1 MiB bodies).
pub(crate) const BATCH_LINES: usize = 200;
const BATCH_BYTES: usize = 512 << 10;
/// How often the harness's output file is read while it runs.
pub(crate) const POLL: Duration = Duration::from_millis(200);
/// Refused destinations per session report (the server takes as many).
const MAX_REFUSED_PER_REPORT: usize = protocol::MAX_EGRESS_REFUSED;
/// How often the session is sent while lines arrive.
const REPORT_EVERY: Duration = Duration::from_secs(1);

pub(crate) enum ToReporter {
    Line(SessionLine),
    Usage(Usage),
    /// A destination the step's proxy refused (each once).
    EgressRefused(String),
}

/// Sends an attempt's session and heartbeats, beside its supervision, so that a slow or absent
/// server never holds up a timeout or a kill.
pub(crate) async fn reporter(
    shared: Arc<Shared>, step: String, harness: &'static str, stop: Arc<StopSignal>, mut rx: mpsc::UnboundedReceiver<ToReporter>,
    stdin: Option<mpsc::UnboundedSender<ToStdin>>,
) {
    // People's messages in the answers go to the harness's input (when it takes them).
    let forward = |messages: Vec<Message>| {
        if let Some(tx) = &stdin {
            for m in messages {
                let _ = tx.send(ToStdin::Message(m));
            }
        }
    };
    let mut lines: Vec<SessionLine> = Vec::new();
    let mut usage = Usage::default();
    let mut refused: Vec<String> = Vec::new();
    let mut dirty = false;
    let mut open = true;
    let mut tick = tokio::time::interval(REPORT_EVERY);
    let beat_every = shared.settings.heartbeat;
    let mut beat = tokio::time::interval_at(Instant::now() + beat_every, beat_every);
    let mut last_renewed = Instant::now();
    loop {
        tokio::select! {
            msg = rx.recv(), if open => match msg {
                Some(ToReporter::Line(l)) => { lines.push(l); dirty = true; }
                Some(ToReporter::Usage(u)) => { if u != usage { usage = u; dirty = true; } }
                Some(ToReporter::EgressRefused(d)) => { refused.push(d); dirty = true; }
                None => {
                    open = false;
                    // The harness is gone: send what is left now, not at the next tick.
                    tick.reset_immediately();
                }
            },
            _ = tick.tick(), if dirty || !open => {
                while dirty {
                    let mut size = 0;
                    let n = lines.iter().take(BATCH_LINES).take_while(|l| { size += l.line.len(); size <= BATCH_BYTES }).count().max(1).min(lines.len());
                    let told = refused.len().min(MAX_REFUSED_PER_REPORT);
                    let report = SessionReport { harness, lines: &lines[..n], usage: &usage, egress_refused: &refused[..told] };
                    match shared.client.session(&step, &report).await {
                        Ok(answer) => {
                            last_renewed = Instant::now();
                            forward(answer.messages);
                            lines.drain(..n);
                            refused.drain(..told);
                            dirty = !lines.is_empty() || !refused.is_empty();
                            if answer.stop {
                                stop.stop(Stop::Server(answer.state));
                                // Nothing more will be stored; stop sending.
                                lines.clear();
                                refused.clear();
                                dirty = false;
                            }
                        }
                        Err(ClientError::Conflict(_)) => { lines.clear(); refused.clear(); dirty = false; }
                        Err(e) if e.is_not_found() => { stop.stop(Stop::Server("gone".into())); lines.clear(); refused.clear(); dirty = false; }
                        Err(e) => {
                            tracing::warn!(step.id = %step, error = %e, "cannot send the session; keeping it for the next try");
                            break;
                        }
                    }
                }
                if !open && !dirty {
                    return;
                }
                if !open {
                    // The server is away at the very end: the lines go with the result's
                    // report failing too; give up after this round.
                    return;
                }
            }
            _ = beat.tick() => {
                // A session report renews the lease too: no heartbeat needed right after one.
                if last_renewed.elapsed() < beat_every / 2 {
                    continue;
                }
                match shared.client.heartbeat(&step).await {
                    Ok(s) => {
                        last_renewed = Instant::now();
                        if s.stop {
                            stop.stop(Stop::Server(s.state));
                        } else {
                            forward(s.messages);
                        }
                    }
                    Err(e) if e.is_not_found() => stop.stop(Stop::Server("gone".into())),
                    Err(e) => tracing::warn!(step.id = %step, error = %e, "heartbeat failed"),
                }
            }
        }
    }
}

/// The harness process: a child of ours, or one adopted after a restart (not our child: its
/// end is seen by polling its liveness, and its exit status is unknown).
pub(crate) enum Proc {
    Child(tokio::process::Child),
    Adopted { pid: i32, start: Option<u64> },
}

impl Proc {
    pub(crate) async fn wait(&mut self) -> Exit {
        match self {
            Proc::Child(c) => match c.wait().await {
                Ok(status) => Exit { code: status.code(), signal: status.signal() },
                Err(_) => Exit { code: None, signal: None },
            },
            Proc::Adopted { pid, start } => {
                while process::alive(*pid, *start) {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Exit { code: None, signal: None }
            }
        }
    }
}

/// Reads a growing file line by line.
pub(crate) struct Tail {
    pub file: Option<std::fs::File>,
    pub path: PathBuf,
    pub partial: Vec<u8>,
}

impl Tail {
    pub(crate) fn new(path: PathBuf) -> Tail {
        Tail { file: None, path, partial: Vec::new() }
    }

    /// The complete lines written since the last call.
    pub(crate) fn lines(&mut self) -> Vec<String> {
        use std::io::Read;
        if self.file.is_none() {
            self.file = std::fs::File::open(&self.path).ok();
        }
        let Some(f) = self.file.as_mut() else { return Vec::new() };
        let mut buf = [0u8; 64 << 10];
        let mut out = Vec::new();
        loop {
            match f.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    self.partial.extend_from_slice(&buf[..n]);
                    while let Some(i) = self.partial.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = self.partial.drain(..=i).collect();
                        out.push(String::from_utf8_lossy(&line[..line.len() - 1]).trim_end_matches('\r').to_owned());
                    }
                }
            }
        }
        out
    }

    /// What is left after the last newline, once the writer is gone.
    pub(crate) fn rest(&mut self) -> Option<String> {
        let mut lines = self.lines();
        if !self.partial.is_empty() {
            lines.push(String::from_utf8_lossy(&std::mem::take(&mut self.partial)).into_owned());
        }
        (!lines.is_empty()).then(|| lines.join("\n"))
    }
}

/// Codex's session file (`$CODEX_HOME/sessions/YYYY/MM/DD/rollout-…-<thread>.jsonl`), read as
/// it grows once it exists: each attempt has a Codex home of its own, so the one rollout file
/// under it is this session's.
pub(crate) struct CodexSessionFile {
    home: PathBuf,
    tail: Option<Tail>,
}

impl CodexSessionFile {
    pub(crate) fn new(home: PathBuf) -> CodexSessionFile {
        CodexSessionFile { home, tail: None }
    }

    /// The complete lines written since the last call.
    pub(crate) fn lines(&mut self) -> Vec<String> {
        if self.tail.is_none() {
            self.tail = rollout(&self.home.join("sessions")).map(Tail::new);
        }
        self.tail.as_mut().map(Tail::lines).unwrap_or_default()
    }
}

/// The first `rollout-*.jsonl` under `dir`, looked for down to the day's directory.
fn rollout(dir: &std::path::Path) -> Option<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).ok()?.flatten().map(|e| e.path()).collect();
    entries.sort();
    entries.into_iter().find_map(|p| {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if p.is_dir() { rollout(&p) } else { (name.starts_with("rollout-") && name.ends_with(".jsonl")).then_some(p) }
    })
}

/// Feeds the harness's lines to its reader and the session.
pub(crate) struct Session {
    pub reader: Reader,
    pub seq: i64,
    pub tx: mpsc::UnboundedSender<ToReporter>,
    /// Claude Code's input, kept open while it runs: told of each result line.
    pub stdin: Option<mpsc::UnboundedSender<ToStdin>>,
}

impl Session {
    pub(crate) fn feed(&mut self, line: String) {
        if let Some(stdin) = &self.stdin {
            if is_result_line(&line) {
                let _ = stdin.send(ToStdin::ResultSeen);
            }
        }
        let before = self.reader.usage().clone();
        let stream = self.reader.line(&line);
        self.seq += 1;
        // The receiver lives as long as the attempt; a send can only fail at its very end.
        let _ = self.tx.send(ToReporter::Line(SessionLine { seq: self.seq, stream: stream.to_owned(), line: protocol::cut_line(&line) }));
        if *self.reader.usage() != before {
            let _ = self.tx.send(ToReporter::Usage(self.reader.usage().clone()));
        }
    }
}

impl Session {
    /// Feeds a line of the harness's own record (Codex's session file): its figures, not its
    /// transcript.
    pub(crate) fn feed_record(&mut self, line: &str) {
        let before = self.reader.usage().clone();
        self.reader.codex_session(line);
        if *self.reader.usage() != before {
            let _ = self.tx.send(ToReporter::Usage(self.reader.usage().clone()));
        }
    }
}

pub(crate) fn stop_reason(why: &Stop) -> String {
    match why {
        Stop::Server(state) => format!("step {state} on the server"),
        Stop::Drain => "host_draining".to_owned(),
    }
}

/// Journals why the harness is being stopped, then interrupts its group. The journal comes
/// first: after a crash, the reason recorded is still the true one.
pub(crate) fn interrupt(shared: &Shared, e: &mut Entry, reason: &str) {
    e.terminating = Some(reason.to_owned());
    if let Err(err) = shared.journal.write(e) {
        tracing::error!(step.id = %e.assignment.step, error = %err, "cannot journal the termination; stopping the harness anyway");
    }
    if let Some(pid) = e.pid {
        process::interrupt_group(pid);
    }
}

/// What the writer of Claude Code's input is told.
pub(crate) enum ToStdin {
    /// A person's message, from an answer of the server.
    Message(Message),
    /// The harness printed a result line: a turn ended.
    ResultSeen,
}

/// Whether a Claude Code output line is its `result` (one per user turn).
pub(crate) fn is_result_line(line: &str) -> bool {
    line.contains("\"result\"") && serde_json::from_str::<Value>(line).is_ok_and(|v| v.get("type").and_then(Value::as_str) == Some("result"))
}

/// One user turn as Claude Code reads it with `--input-format stream-json`: an `SDKUserMessage`
/// (`type: user`, an Anthropic `MessageParam`), one JSON object a line.
pub(crate) fn user_line(text: &str) -> String {
    let mut line = json!({
        "type": "user",
        "message": { "role": "user", "content": [{ "type": "text", "text": text }] },
        "parent_tool_use_id": null,
        "session_id": "default",
    })
    .to_string();
    line.push('\n');
    line
}

/// Writes Claude Code's input: the prompt as the first user line, then each person's message
/// as a further one (acknowledged to the server once written). Claude Code queues the user
/// lines it reads, answers them turn by turn (each turn ends with a result line), and exits
/// once its input has ended and its queue is done; so the input is closed at a result line when
/// no message waits to be written, and a message written before that is still answered.
pub(crate) async fn converse(
    shared: Arc<Shared>, step: String, mut stdin: tokio::process::ChildStdin, prompt: String, mut rx: mpsc::UnboundedReceiver<ToStdin>,
) {
    if stdin.write_all(user_line(&prompt).as_bytes()).await.is_err() {
        // A harness that exits without reading its prompt closes the pipe: not ours to report.
        return;
    }
    let _ = stdin.flush().await;
    let mut written: std::collections::HashSet<uuid::Uuid> = std::collections::HashSet::new();
    // A result line came and nothing was written since: the harness waits for input.
    let mut idle = false;
    while let Some(msg) = rx.recv().await {
        match msg {
            ToStdin::Message(m) => {
                // Offered again until the server heard it was delivered: written once.
                if written.insert(m.id) {
                    if stdin.write_all(user_line(&m.text).as_bytes()).await.is_err() || stdin.flush().await.is_err() {
                        return;
                    }
                    idle = false;
                    tracing::info!(step.id = %step, message.id = %m.id, "a person's message was written to the session");
                }
                if let Err(err) = shared.client.messages_delivered(&step, std::slice::from_ref(&m.id)).await {
                    tracing::warn!(step.id = %step, message.id = %m.id, error = %err, "cannot acknowledge a message; it will be offered again");
                }
            }
            ToStdin::ResultSeen => idle = true,
        }
        if idle && rx.is_empty() {
            // A turn ended and nothing waits: let Claude Code finish what it has.
            let _ = stdin.shutdown().await;
            return;
        }
    }
}

/// Sleeps until `at`, or forever without one (a `select!` branch that never fires).
pub(crate) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_turn_is_one_stream_json_line_claude_code_reads() {
        let line = user_line("Use the \"blue\" one\nplease");
        assert!(line.ends_with('\n') && line.matches('\n').count() == 1, "one line: {line:?}");
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["type"], "user");
        assert_eq!(v["message"], json!({ "role": "user", "content": [{ "type": "text", "text": "Use the \"blue\" one\nplease" }] }));
        assert!(v["parent_tool_use_id"].is_null());
    }

    #[test]
    fn only_a_result_line_ends_a_turn() {
        assert!(is_result_line(r#"{"type":"result","subtype":"success","is_error":false,"result":"done"}"#));
        assert!(!is_result_line(r#"{"type":"assistant","message":{"content":[{"type":"text","text":"\"result\""}]}}"#));
        assert!(!is_result_line("\"result\" but not JSON"));
    }
}
