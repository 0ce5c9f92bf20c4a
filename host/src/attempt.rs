//! One attempt at a crew step on this host, from the claim to the cleaned-up worktree.
//!
//! 1. Journal the assignment (`journal::Phase::Claimed`) before doing anything.
//! 2. Prepare: fetch the cached clone and add a worktree on the step's branch (or make a scratch
//!    directory for a run about no repository). The lease is renewed from here on.
//! 3. `start` on the server (`leased → running`), journal `Launching`, start the harness in a
//!    process group of its own with the prompt on stdin, journal `Running` with its pid.
//! 4. Supervise: read its output file as it grows and send it as the session (batched, about
//!    once a second; each answer, like each heartbeat, says whether to stop); at the step's
//!    timeout, or when told to stop, journal the reason, then SIGINT the group, then SIGKILL it
//!    after the grace. When the harness exits, whatever it left in its group is killed.
//! 5. Finish: on success commit what the harness left uncommitted and push the branch (never
//!    forced); journal the result (`Exited`), report it (`complete`), journal `Reported`.
//! 6. Clean: remove the worktree and the attempt's directory, then the journal entry.
//!
//! A step the server moved on from (cancelled, taken back after a lapsed lease) is stopped and
//! nothing is reported: its result would be refused anyway. Tasks started here (the stdin
//! writer, the reporter) belong to the attempt and end with it.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::{Assignment, Client, ClientError, Complete, Line, Message, SessionReport, Usage};
use crate::config::Settings;
use crate::git::{self, Git};
use crate::harness::{self, Ended, Exit, Kind, Reader};
use crate::journal::{self, Entry, Journal, Phase};
use crate::process;

/// What every attempt of this host shares.
pub struct Shared {
    pub client: Client,
    pub settings: Settings,
    pub journal: Journal,
    /// One lock per cached clone: fetches, worktree changes and pushes of one cache take turns.
    caches: Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
}

impl Shared {
    pub fn new(client: Client, settings: Settings, journal: Journal) -> Shared {
        Shared { client, settings, journal, caches: Mutex::new(HashMap::new()) }
    }

    fn cache_lock(&self, cache: &Path) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.caches.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.entry(cache.to_path_buf()).or_default().clone()
    }

    fn git(&self, token: Option<String>) -> Git {
        Git { timeout: self.settings.git_timeout, token, author_name: self.settings.author_name.clone(), author_email: self.settings.author_email.clone() }
    }
}

/// Why an attempt must stop before its harness is done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The server moved on (its state: `cancelled`, `failed`, `gone`, …): nothing to report.
    Server(String),
    /// The host drains: hand the step back (an infrastructure failure, retried elsewhere).
    Drain,
}

/// Set by whoever learns first that an attempt must stop: the claim's answer, a heartbeat, a
/// session report, the drain.
#[derive(Debug, Default)]
pub struct StopSignal {
    token: CancellationToken,
    why: Mutex<Option<Stop>>,
}

impl StopSignal {
    pub fn stop(&self, why: Stop) {
        let mut w = self.why.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if w.is_none() {
            *w = Some(why);
        }
        drop(w);
        self.token.cancel();
    }

    pub fn why(&self) -> Option<Stop> {
        self.why.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    pub fn is_stopped(&self) -> bool {
        self.token.is_cancelled()
    }
}

/// Lines per session report, and their bytes (the server takes 1 MiB bodies).
const BATCH_LINES: usize = 200;
const BATCH_BYTES: usize = 512 << 10;
/// The longest line sent; the server cuts at the same length.
const LINE_MAX: usize = 64 << 10;
/// How often the harness's output file is read while it runs.
const POLL: Duration = Duration::from_millis(200);
/// How often the session is sent while lines arrive.
const REPORT_EVERY: Duration = Duration::from_secs(1);

enum ToReporter {
    Line(Line),
    Usage(Usage),
}

/// Sends an attempt's session and heartbeats, beside its supervision, so that a slow or absent
/// server never holds up a timeout or a kill.
async fn reporter(
    shared: Arc<Shared>,
    step: String,
    harness: &'static str,
    stop: Arc<StopSignal>,
    mut rx: mpsc::UnboundedReceiver<ToReporter>,
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
    let mut lines: Vec<Line> = Vec::new();
    let mut usage = Usage::default();
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
                    let report = SessionReport { harness, lines: &lines[..n], usage: &usage };
                    match shared.client.session(&step, &report).await {
                        Ok(answer) => {
                            last_renewed = Instant::now();
                            forward(answer.messages);
                            lines.drain(..n);
                            dirty = !lines.is_empty();
                            if answer.stop {
                                stop.stop(Stop::Server(answer.state));
                                // Nothing more will be stored; stop sending.
                                lines.clear();
                                dirty = false;
                            }
                        }
                        Err(ClientError::Conflict(_)) => { lines.clear(); dirty = false; }
                        Err(e) if e.is_not_found() => { stop.stop(Stop::Server("gone".into())); lines.clear(); dirty = false; }
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
enum Proc {
    Child(tokio::process::Child),
    Adopted { pid: i32, start: Option<u64> },
}

impl Proc {
    async fn wait(&mut self) -> Exit {
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
struct Tail {
    file: Option<std::fs::File>,
    path: PathBuf,
    partial: Vec<u8>,
}

impl Tail {
    fn new(path: PathBuf) -> Tail {
        Tail { file: None, path, partial: Vec::new() }
    }

    /// The complete lines written since the last call.
    fn lines(&mut self) -> Vec<String> {
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
    fn rest(&mut self) -> Option<String> {
        let mut lines = self.lines();
        if !self.partial.is_empty() {
            lines.push(String::from_utf8_lossy(&std::mem::take(&mut self.partial)).into_owned());
        }
        (!lines.is_empty()).then(|| lines.join("\n"))
    }
}

fn cut(line: &str) -> String {
    if line.len() <= LINE_MAX {
        return line.to_owned();
    }
    let mut end = LINE_MAX;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line[..end].to_owned()
}

/// Feeds the harness's lines to its reader and the session.
struct Session {
    reader: Reader,
    seq: i64,
    tx: mpsc::UnboundedSender<ToReporter>,
    /// Claude Code's input, kept open while it runs: told of each result line.
    stdin: Option<mpsc::UnboundedSender<ToStdin>>,
}

impl Session {
    fn feed(&mut self, line: String) {
        if let Some(stdin) = &self.stdin {
            if is_result_line(&line) {
                let _ = stdin.send(ToStdin::ResultSeen);
            }
        }
        let before = self.reader.usage().clone();
        let stream = self.reader.line(&line);
        self.seq += 1;
        // The receiver lives as long as the attempt; a send can only fail at its very end.
        let _ = self.tx.send(ToReporter::Line(Line { seq: self.seq, stream, line: cut(&line) }));
        if *self.reader.usage() != before {
            let _ = self.tx.send(ToReporter::Usage(self.reader.usage().clone()));
        }
    }
}

fn stop_reason(why: &Stop) -> String {
    match why {
        Stop::Server(state) => format!("step {state} on the server"),
        Stop::Drain => "host_draining".to_owned(),
    }
}

/// Journals why the harness is being stopped, then interrupts its group. The journal comes
/// first: after a crash, the reason recorded is still the true one.
fn interrupt(shared: &Shared, e: &mut Entry, reason: &str) {
    e.terminating = Some(reason.to_owned());
    if let Err(err) = shared.journal.write(e) {
        tracing::error!(step.id = %e.assignment.step, error = %err, "cannot journal the termination; stopping the harness anyway");
    }
    if let Some(pid) = e.pid {
        process::signal_group(pid, libc::SIGINT);
    }
}

/// Runs an attempt from a fresh claim to its cleanup.
pub async fn run(shared: Arc<Shared>, assignment: Assignment, stop: Arc<StopSignal>) {
    let step = assignment.step.clone();
    let dir = shared.settings.work_dir.join("attempts").join(&step);
    let mut e = Entry::new(assignment, dir);
    if let Err(err) = std::fs::create_dir_all(&e.dir).and_then(|()| shared.journal.write(&mut e)) {
        // Nothing may be done that is not journalled: the lease will lapse and the step be
        // retried elsewhere.
        tracing::error!(step.id = %step, error = %err, "cannot journal the attempt; leaving the step to lapse");
        return;
    }
    let Some(kind) = Kind::parse(&e.assignment.harness) else {
        let c = failed(&format!("unknown harness `{}`", e.assignment.harness), "final", &e.assignment.harness);
        return report_and_clean(&shared, e, Some(c)).await;
    };
    let (tx, rx) = mpsc::unbounded_channel();
    // Claude Code takes people's messages on its input while it runs (stream-json); the
    // others read their prompt to the end of their input.
    let (stdin_tx, mut stdin_rx) = match kind {
        Kind::ClaudeCode => {
            let (t, r) = mpsc::unbounded_channel();
            (Some(t), Some(r))
        }
        Kind::Codex | Kind::Command => (None, None),
    };
    let mut tasks = JoinSet::new();
    tasks.spawn(reporter(shared.clone(), step.clone(), kind.name(), stop.clone(), rx, stdin_tx.clone()));

    let result = async {
        if let Err(why) = prepare(&shared, &mut e).await {
            tracing::warn!(step.id = %step, error = %why, "cannot prepare the worktree");
            return Some(failed("prepare_failed", "infrastructure", kind.name()));
        }
        e.phase = Phase::Prepared;
        if shared.journal.write(&mut e).is_err() {
            return None;
        }
        if stop.is_stopped() {
            return stopped_result(&stop, kind);
        }
        match shared.client.start(&step, kind.name()).await {
            Ok(s) if !s.stop => {}
            Ok(s) => {
                stop.stop(Stop::Server(s.state));
                return None;
            }
            Err(ClientError::Conflict(_)) => {
                stop.stop(Stop::Server("no longer leased".into()));
                return None;
            }
            Err(err) => {
                tracing::warn!(step.id = %step, error = %err, "cannot start the step; leaving it to lapse");
                return None;
            }
        }
        let (program, prompt) = match launch_plan(&shared, &e, kind) {
            Ok(p) => p,
            Err(why) => return Some(failed(&why, "final", kind.name())),
        };
        e.phase = Phase::Launching;
        if shared.journal.write(&mut e).is_err() {
            return None;
        }
        let cwd = work_dir_of(&e);
        let env = harness_env(&e.assignment);
        let mut child = match process::spawn_harness(&program, &cwd, &env, &e.output_file()) {
            Ok(c) => c,
            Err(err) => {
                tracing::warn!(step.id = %step, error = %err, program = %program[0], "cannot start the harness");
                return Some(failed("harness_not_found", "infrastructure", kind.name()));
            }
        };
        let pid = child.id().map_or(0, |p| p as i32);
        e.pid = Some(pid);
        e.pid_start = process::start_time(pid);
        e.launched_at_ms = Some(journal::now_ms());
        e.phase = Phase::Running;
        if let Err(err) = shared.journal.write(&mut e) {
            tracing::error!(step.id = %step, error = %err, "cannot journal the harness's start");
        }
        if let Some(mut stdin) = child.stdin.take() {
            if let Some(rx) = stdin_rx.take() {
                tasks.spawn(converse(shared.clone(), step.clone(), stdin, prompt, rx));
            } else {
                tasks.spawn(async move {
                    // A harness that exits without reading its prompt closes the pipe: not ours to report.
                    let _ = stdin.write_all(prompt.as_bytes()).await;
                    let _ = stdin.shutdown().await;
                });
            }
        }
        supervise(&shared, &mut e, Proc::Child(child), kind, &stop, tx.clone(), stdin_tx.clone()).await
    }
    .await;
    drop(tx);
    drop(stdin_tx);
    // The reporter sends what is left, then ends.
    let _ = tokio::time::timeout(Duration::from_secs(15), async { while tasks.join_next().await.is_some() {} }).await;
    tasks.shutdown().await;
    report_and_clean(&shared, e, result).await;
}

/// Resumes supervision of a harness that survived a restart of the host.
pub async fn adopt(shared: Arc<Shared>, mut e: Entry, stop: Arc<StopSignal>) {
    let kind = Kind::parse(&e.assignment.harness).unwrap_or(Kind::Command);
    let (Some(pid), start) = (e.pid, e.pid_start) else { return report_and_clean(&shared, e, None).await };
    // The journal keeps no token: ask for one now (and again before the push).
    refresh_token(&shared, &mut e).await;
    let (tx, rx) = mpsc::unbounded_channel();
    let mut tasks = JoinSet::new();
    // An adopted harness's input went with the host that started it: it takes no messages.
    tasks.spawn(reporter(shared.clone(), e.assignment.step.clone(), kind.name(), stop.clone(), rx, None));
    tracing::info!(step.id = %e.assignment.step, pid, "adopting a harness that survived a restart");
    let result = supervise(&shared, &mut e, Proc::Adopted { pid, start }, kind, &stop, tx.clone(), None).await;
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(15), async { while tasks.join_next().await.is_some() {} }).await;
    tasks.shutdown().await;
    report_and_clean(&shared, e, result).await;
}

/// Asks the server for a fresh installation token for the attempt's repository (before each
/// fetch and push, and after adopting the attempt), keeps it in memory (never in the journal),
/// and answers the token to use: the fresh one, or the one at hand when the server has none to
/// give or cannot be asked (then the host's own git credentials may still apply).
async fn refresh_token(shared: &Shared, e: &mut Entry) -> Option<String> {
    let step = e.assignment.step.clone();
    let repo = e.assignment.repository.as_mut()?;
    match shared.client.token(&step).await {
        Ok(fresh) => {
            if fresh.token.is_some() {
                repo.token = fresh.token;
            }
        }
        Err(err) => tracing::warn!(step.id = %step, error = %err, "cannot get a fresh installation token; using the one at hand"),
    }
    repo.token.clone()
}

/// What the writer of Claude Code's input is told.
enum ToStdin {
    /// A person's message, from an answer of the server.
    Message(Message),
    /// The harness printed a result line: a turn ended.
    ResultSeen,
}

/// Whether a Claude Code output line is its `result` (one per user turn).
fn is_result_line(line: &str) -> bool {
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
async fn converse(shared: Arc<Shared>, step: String, mut stdin: tokio::process::ChildStdin, prompt: String, mut rx: mpsc::UnboundedReceiver<ToStdin>) {
    if stdin.write_all(user_line(&prompt).as_bytes()).await.is_err() {
        // A harness that exits without reading its prompt closes the pipe: not ours to report.
        return;
    }
    let _ = stdin.flush().await;
    let mut written: std::collections::HashSet<String> = std::collections::HashSet::new();
    // A result line came and nothing was written since: the harness waits for input.
    let mut idle = false;
    while let Some(msg) = rx.recv().await {
        match msg {
            ToStdin::Message(m) => {
                // Offered again until the server heard it was delivered: written once.
                if written.insert(m.id.clone()) {
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

/// What to report when the attempt was stopped before its harness ran.
fn stopped_result(stop: &StopSignal, kind: Kind) -> Option<Complete> {
    match stop.why() {
        Some(Stop::Drain) => Some(failed("host_draining", "infrastructure", kind.name())),
        _ => None,
    }
}

/// A failure to report.
fn failed(reason: &str, class: &str, harness: &str) -> Complete {
    Complete { harness: harness.to_owned(), ..crate::recovery::failure(reason, class) }
}

/// Where the harness runs.
fn work_dir_of(e: &Entry) -> PathBuf {
    e.worktree.clone().unwrap_or_else(|| e.dir.join("work"))
}

/// The harness's environment: which step it works on, never the host's credential.
fn harness_env(a: &Assignment) -> Vec<(String, String)> {
    vec![
        ("SHOPFLOOR_STEP_ID".into(), a.step.clone()),
        ("SHOPFLOOR_RUN_ID".into(), a.run.clone()),
        ("SHOPFLOOR_NODE".into(), a.node.clone()),
        ("SHOPFLOOR_ATTEMPT".into(), a.attempt.to_string()),
    ]
}

/// The command line and the prompt (with the pull request instructions when one will be
/// opened from this work).
fn launch_plan(shared: &Shared, e: &Entry, kind: Kind) -> Result<(Vec<String>, String), String> {
    let a = &e.assignment;
    let program = harness::command_line(kind, a, &shared.settings.claude, &shared.settings.codex)?;
    let mut prompt = a.prompt.clone();
    if a.pr_body {
        let template = std::fs::read_to_string(work_dir_of(e).join(".github/pull_request_template.md")).ok();
        prompt.push_str(&harness::pr_instructions(template.as_deref(), a.item.as_ref().and_then(|i| i.number)));
    }
    Ok((program, prompt))
}

/// Fetches the cached clone and adds the attempt's worktree, or makes a scratch directory.
async fn prepare(shared: &Shared, e: &mut Entry) -> Result<(), String> {
    let Some(repo) = e.assignment.repository.clone() else {
        return std::fs::create_dir_all(e.dir.join("work")).map_err(|err| err.to_string());
    };
    let branch = e.assignment.branch.clone().unwrap_or_else(|| format!("shopfloor/{}", e.assignment.run));
    let url = match &shared.settings.git_url_template {
        Some(t) => t.replace("{repo}", &repo.full_name),
        None => repo.clone_url.clone(),
    };
    let cache = git::cache_path(&shared.settings.work_dir, &repo.full_name);
    let wt = e.dir.join("worktree");
    e.cache = Some(cache.clone());
    e.worktree = Some(wt.clone());
    shared.journal.write(e).map_err(|err| err.to_string())?;
    let g = shared.git(refresh_token(shared, e).await);
    let lock = shared.cache_lock(&cache);
    let _turn = lock.lock().await;
    g.ensure_cache(&cache, &url).await.map_err(|err| err.to_string())?;
    let start = g.add_worktree(&cache, &wt, &branch, &repo.default_branch).await.map_err(|err| err.to_string())?;
    e.start_sha = Some(start);
    Ok(())
}

/// Watches a harness until it is gone, enforcing its timeout and stopping it when told to;
/// returns what to report (`None`: nothing, the server moved on).
async fn supervise(
    shared: &Shared,
    e: &mut Entry,
    mut proc: Proc,
    kind: Kind,
    stop: &StopSignal,
    tx: mpsc::UnboundedSender<ToReporter>,
    stdin: Option<mpsc::UnboundedSender<ToStdin>>,
) -> Option<Complete> {
    let pid = e.pid.unwrap_or(0);
    let mut session = Session { reader: Reader::new(kind, e.assignment.model.clone(), shared.settings.prices.clone()), seq: 0, tx, stdin };
    let mut tail = Tail::new(e.output_file());
    let launched = e.launched_at_ms.unwrap_or_else(journal::now_ms);
    let timeout_ms = e.assignment.caps.timeout_secs.saturating_mul(1000);
    let left = Duration::from_millis((launched + timeout_ms).saturating_sub(journal::now_ms()));
    let timeout_at = Instant::now() + left;
    // A harness adopted while being terminated is killed after the grace, from now.
    let mut interrupted: Option<String> = e.terminating.clone();
    let mut kill_at: Option<Instant> = interrupted.as_ref().map(|_| Instant::now() + shared.settings.interrupt_grace);
    if interrupted.is_some() {
        process::signal_group(pid, libc::SIGINT);
    }
    let mut poll = tokio::time::interval(POLL);
    let exit = {
        let wait = proc.wait();
        tokio::pin!(wait);
        loop {
            tokio::select! {
                exit = &mut wait => break exit,
                _ = poll.tick() => {
                    for line in tail.lines() {
                        session.feed(line);
                    }
                }
                () = tokio::time::sleep_until(timeout_at), if interrupted.is_none() => {
                    tracing::info!(step.id = %e.assignment.step, "the harness ran past its timeout; interrupting it");
                    interrupt(shared, e, "timeout");
                    interrupted = Some("timeout".into());
                    kill_at = Some(Instant::now() + shared.settings.interrupt_grace);
                }
                () = stop.token.cancelled(), if interrupted.is_none() => {
                    let why = stop.why().map_or_else(|| "stopped".to_owned(), |w| stop_reason(&w));
                    tracing::info!(step.id = %e.assignment.step, why, "stopping the harness");
                    interrupt(shared, e, &why);
                    interrupted = Some(why);
                    kill_at = Some(Instant::now() + shared.settings.cancel_grace);
                }
                () = sleep_until(kill_at), if kill_at.is_some() => {
                    tracing::info!(step.id = %e.assignment.step, "the harness outlived its grace; killing its process group");
                    process::signal_group(pid, libc::SIGKILL);
                    kill_at = None;
                }
            }
        }
    };
    // Whatever the harness left running in its group goes with it.
    process::signal_group(pid, libc::SIGKILL);
    if let Some(rest) = tail.rest() {
        for line in rest.lines() {
            session.feed(line.to_owned());
        }
    }
    let _ = session.tx.send(ToReporter::Usage(session.reader.usage().clone()));
    if let Some(why) = stop.why() {
        return match why {
            Stop::Server(_) => None,
            Stop::Drain => Some(failed("host_draining", "infrastructure", kind.name())),
        };
    }
    let ended = session.reader.finish(exit, interrupted.as_deref());
    Some(finish(shared, e, ended, kind).await)
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Turns a harness's end into the result to report: on success, the work is committed and
/// pushed; a step that must change files and changed none fails with `no_changes`.
pub(crate) async fn finish(shared: &Shared, e: &mut Entry, ended: Ended, kind: Kind) -> Complete {
    let a = e.assignment.clone();
    let mut output = json!({
        "text": ended.text,
        "harness": kind.name(),
        "subtype": ended.subtype,
        "exit_code": ended.exit_code,
    });
    let mut result = Complete {
        outcome: if ended.success { "succeeded".into() } else { "failed".into() },
        reason: ended.reason.clone(),
        class: (!ended.success).then(|| ended.class.to_owned()),
        exit_code: ended.exit_code,
        output: Value::Null,
        usage: ended.usage.clone(),
        harness: kind.name().to_owned(),
    };
    if a.pr_body {
        output["pr_body"] = json!(harness::pr_body(&ended.text, a.item.as_ref().and_then(|i| i.number)));
    }
    let mut files_changed = None;
    if let (Some(cache), Some(wt), Some(start), Some(_)) = (e.cache.clone(), e.worktree.clone(), e.start_sha.clone(), a.repository.as_ref()) {
        let branch = a.branch.clone().unwrap_or_else(|| format!("shopfloor/{}", a.run));
        output["branch"] = json!(branch);
        if ended.success {
            // The claim's token may have expired during a long step, and an adopted attempt has
            // none: the push gets a fresh one.
            let g = shared.git(refresh_token(shared, e).await);
            let title = a.item.as_ref().and_then(|i| i.title.clone()).unwrap_or_else(|| a.run.clone());
            let message = format!("{}: {}\n\nshopfloor run {} step {} attempt {}", a.node, title, a.run, a.step, a.attempt);
            let lock = shared.cache_lock(&cache);
            let _turn = lock.lock().await;
            match g.commit_all(&wt, &message, &start).await {
                Ok(work) => {
                    files_changed = Some(work.files.len());
                    output["head_sha"] = json!(work.head);
                    output["commits"] = json!(work.commits.iter().take(100).collect::<Vec<_>>());
                    output["files"] = json!(work.files.iter().take(1000).collect::<Vec<_>>());
                    if !work.commits.is_empty() {
                        if let Err(err) = g.push(&wt, &branch).await {
                            tracing::warn!(step.id = %a.step, error = %err, "push failed");
                            result.outcome = "failed".into();
                            result.reason = Some("push_failed".into());
                            // A later attempt starts from the branch as the remote has it.
                            result.class = Some("infrastructure".into());
                            output["error"] = json!(err.to_string().chars().take(500).collect::<String>());
                        } else {
                            output["pushed"] = json!(true);
                        }
                    }
                }
                Err(err) => {
                    tracing::warn!(step.id = %a.step, error = %err, "cannot commit the work");
                    result.outcome = "failed".into();
                    result.reason = Some("commit_failed".into());
                    result.class = Some("infrastructure".into());
                    output["error"] = json!(err.to_string().chars().take(500).collect::<String>());
                }
            }
        }
    }
    output["files_changed"] = json!(files_changed.unwrap_or(0));
    if result.outcome == "succeeded" && a.expect_changes && files_changed.unwrap_or(0) == 0 {
        result.outcome = "failed".into();
        result.reason = Some("no_changes".into());
        result.class = Some("ordinary".into());
    }
    result.output = output;
    e.result = Some(result.clone());
    e.phase = Phase::Exited;
    if let Err(err) = shared.journal.write(e) {
        tracing::error!(step.id = %a.step, error = %err, "cannot journal the result");
    }
    result
}

/// Reports the result (retrying while the server is away, for a while), then cleans up.
pub(crate) async fn report_and_clean(shared: &Shared, mut e: Entry, result: Option<Complete>) {
    let step = e.assignment.step.clone();
    if let Some(result) = result {
        crate::trace::record_outcome(&result.outcome, result.reason.as_deref());
        if e.result.is_none() {
            e.result = Some(result.clone());
            e.phase = Phase::Exited;
            let _ = shared.journal.write(&mut e);
        }
        let mut backoff = Duration::from_secs(1);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            match shared.client.complete(&step, &result).await {
                Ok(_) => break,
                Err(ClientError::Conflict(why)) => {
                    tracing::info!(step.id = %step, why, "the result was not taken: the step moved on");
                    break;
                }
                Err(err) if Instant::now() + backoff < deadline && matches!(err, ClientError::Unreachable(_)) => {
                    tracing::warn!(step.id = %step, error = %err, "cannot report the result; trying again");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(15));
                }
                Err(err) => {
                    // Left in the journal: the next start of the host reports it.
                    tracing::error!(step.id = %step, error = %err, "cannot report the result; it stays in the journal");
                    return;
                }
            }
        }
    }
    e.phase = Phase::Reported;
    let _ = shared.journal.write(&mut e);
    clean(shared, e).await;
}

/// Removes the attempt's worktree and directory, then its journal entry.
pub(crate) async fn clean(shared: &Shared, e: Entry) {
    if let (Some(cache), Some(wt)) = (&e.cache, &e.worktree) {
        let lock = shared.cache_lock(cache);
        let _turn = lock.lock().await;
        shared.git(None).remove_worktree(cache, wt).await;
    }
    let _ = std::fs::remove_dir_all(&e.dir);
    if let Err(err) = shared.journal.remove(&e.assignment.step) {
        tracing::warn!(step.id = %e.assignment.step, error = %err, "cannot remove the journal entry");
    }
}

/// Reads a dead harness's whole output, for an attempt whose harness ended while the host was
/// away, and makes the result from it (its exit status is unknown).
pub(crate) async fn conclude_from_output(shared: &Shared, e: &mut Entry) -> Complete {
    let kind = Kind::parse(&e.assignment.harness).unwrap_or(Kind::Command);
    let mut reader = Reader::new(kind, e.assignment.model.clone(), shared.settings.prices.clone());
    if let Ok(text) = std::fs::read_to_string(e.output_file()) {
        for line in text.lines() {
            reader.line(line);
        }
    }
    let ended = reader.finish(Exit { code: None, signal: None }, e.terminating.as_deref());
    finish(shared, e, ended, kind).await
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
