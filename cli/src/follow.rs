//! `shopfloor runs follow RUN`: a run, live.
//!
//! The project's event stream is opened first; then the run's journal so far is read
//! (`…/runs/{run}/events`, paged) and printed with the same lines as live events, so the
//! history and the live part meet without a gap or a repeat (events are told apart by their
//! per-run sequence number). After each event the run is read again for its headline ("waiting
//! for approval", "asleep until 14:00") and the approvals it waits on.
//!
//! A running crew step's transcript is its step log. Session lines are not run events (a host
//! reports many a second), so while a crew step runs its log is read once a second; nothing is
//! read on a timer otherwise.
//!
//! On a terminal the screen is in raw mode and keys act: `a` answers the approval the run
//! waits on (asking each field in turn), `c` cancels the run (after a yes: the one key `y`,
//! no Enter), `q` or Ctrl-C quits. Without a terminal no key is read: the follower says which
//! commands answer or cancel instead. With `--json`, each of the run's events is printed as the API's JSON, one a line.
//! The exit code is 0 when the run completes (or the user quits), 1 when it fails or is
//! cancelled.

use std::collections::{HashMap, HashSet};
use std::io::{IsTerminal as _, Write as _};
use std::time::Duration;

use chrono::{DateTime, Utc};
use crossterm::event::{Event as TermEvent, EventStream, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use futures::StreamExt as _;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::approvals::{answer_words, pick, send_approval};
use super::error::ClientError;
use super::form::{self, Prompt};
use super::http::{Api, Body, with_query};
use super::model::{Approval, RunDetail};
use super::sse;
use super::table::{Style, Tint, clock, status_tint};

/// How often a running crew step's log is read.
const TRANSCRIPT_EVERY: Duration = Duration::from_secs(1);
/// How long to wait for more events of the same change before reading the run.
const SETTLE: Duration = Duration::from_millis(100);

#[derive(Debug, Deserialize)]
struct RunEvent {
    seq: i64,
    kind: String,
    #[serde(default)]
    node: Option<String>,
    #[serde(default)]
    step: Option<String>,
    at: DateTime<Utc>,
    #[serde(default)]
    attrs: Value,
}

#[derive(Deserialize)]
struct EventPage {
    items: Vec<Value>,
    #[serde(default)]
    next_after: Option<i64>,
}

#[derive(Deserialize)]
struct LogPage {
    items: Vec<LogLine>,
    #[serde(default)]
    next_after: Option<i64>,
}

#[derive(Deserialize)]
struct LogLine {
    seq: i64,
    #[serde(default)]
    stream: String,
    line: String,
}

/// Where lines go: standard output, with `\r\n` while the terminal is raw.
struct Screen {
    raw: bool,
    style: Style,
}

impl Screen {
    fn line(&self, text: &str) {
        let mut out = std::io::stdout().lock();
        let _ = if self.raw { write!(out, "{text}\r\n") } else { writeln!(out, "{text}") };
        let _ = out.flush();
    }

    fn partial(&self, text: &str) {
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "{text}");
        let _ = out.flush();
    }

    fn paint(&self, tint: Tint, text: &str) -> String {
        self.style.paint(tint, text)
    }
}

/// Raw mode for as long as it lives, restored on every way out (an early `?`, a panic).
struct RawMode;

impl RawMode {
    fn enable() -> Result<RawMode, ClientError> {
        crossterm::terminal::enable_raw_mode().map_err(|e| ClientError::Failed(format!("cannot read keys from this terminal: {e}")))?;
        Ok(RawMode)
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = crossterm::terminal::disable_raw_mode();
    }
}

/// What the follower knows of the run.
struct State {
    run: String,
    last_seq: i64,
    detail: RunDetail,
    /// Crew steps seen running, with the last log line read.
    transcripts: HashMap<String, i64>,
    /// Steps known to be crew steps.
    crew: HashSet<String>,
    /// Approvals already announced, by step node.
    announced: HashSet<String>,
}

pub(crate) async fn follow(api: &Api, run: &str, json: bool, style: Style) -> Result<u8, ClientError> {
    let mut stream = sse::Stream::open(api).await?;
    let detail: RunDetail = api.get(api.project_url(&["runs", run])?).await?.json()?;
    let keys = !json && std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let _raw = if keys { Some(RawMode::enable()?) } else { None };
    let screen = Screen { raw: keys, style };
    let mut state = State { run: run.to_owned(), last_seq: 0, detail, transcripts: HashMap::new(), crew: HashSet::new(), announced: HashSet::new() };

    if !json && state.detail.run.status == "running" {
        screen.line(&headline(&state.detail, style));
    }
    // The journal so far, then the stream from where it ends.
    journal(api, &screen, &mut state, json).await?;
    // The run may have moved since it was read: read it again, now that the journal is in.
    refresh(api, &screen, &mut state, json, keys).await?;
    if state.detail.run.status != "running" {
        return finish(api, &screen, &mut state, json).await;
    }

    let mut term = if keys { Some(EventStream::new()) } else { None };
    let mut tick = tokio::time::interval(TRANSCRIPT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let reading_logs = !json && !state.transcripts.is_empty();
        tokio::select! {
            event = stream.next(api) => {
                let mut event = Some(event?);
                let mut shown = false;
                // The events of one change come together: print them all, then read the run once.
                while let Some(e) = event {
                    if e.data.get("run").and_then(Value::as_str) == Some(run) {
                        shown |= show_event(&screen, &mut state, &e.data, json);
                    }
                    event = stream.next_within(api, SETTLE).await?;
                }
                if !shown {
                    continue;
                }
                // The run first: the transcripts read next know from it which steps still run.
                refresh(api, &screen, &mut state, json, keys).await?;
                if !json {
                    transcripts(api, &screen, &mut state).await?;
                }
            }
            _ = tick.tick(), if reading_logs => {
                transcripts(api, &screen, &mut state).await?;
            }
            key = next_key(term.as_mut()), if term.is_some() => {
                let Some(key) = key else { continue };
                let Some(term) = term.as_mut() else { continue };
                match key.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(0),
                    KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => return Ok(0),
                    KeyCode::Char('a') => answer(api, &screen, &mut state, term).await,
                    KeyCode::Char('c') => cancel(api, &screen, &state, term).await,
                    _ => {}
                }
            }
        }
        if state.detail.run.status != "running" {
            return finish(api, &screen, &mut state, json).await;
        }
    }
}

/// The next key press from the terminal; `None` for any other terminal event.
async fn next_key(term: Option<&mut EventStream>) -> Option<KeyEvent> {
    let term = term?;
    match term.next().await {
        Some(Ok(TermEvent::Key(k))) if k.kind != KeyEventKind::Release => Some(k),
        Some(Ok(_)) => None,
        // The terminal is gone: nothing more will be typed.
        Some(Err(_)) | None => std::future::pending().await,
    }
}

/// `run-… · approve v1 · waiting for approval`.
fn headline(d: &RunDetail, style: Style) -> String {
    let r = &d.run;
    let words = match (&r.reason, r.status.as_str()) {
        (Some(reason), s) if s != "running" && reason != s => format!("{s}: {reason}"),
        _ => r.words.clone(),
    };
    format!("{} · {} v{} · {}", style.paint(Tint::Bold, &r.id), r.workflow, r.version, style.paint(status_tint(&r.status), &words))
}

/// Prints one journal event (unless already shown); false when it was a repeat.
fn show_event(screen: &Screen, state: &mut State, raw: &Value, json: bool) -> bool {
    let Ok(e) = serde_json::from_value::<RunEvent>(raw.clone()) else { return false };
    if e.seq <= state.last_seq {
        return false;
    }
    state.last_seq = e.seq;
    if json {
        screen.line(&raw.to_string());
        return true;
    }
    let style = screen.style;
    let node = e.node.clone().unwrap_or_default();
    let reason = e.attrs.get("reason").and_then(Value::as_str).map(|r| format!(" ({r})")).unwrap_or_default();
    let attempt = e.attrs.get("attempt").and_then(Value::as_i64).filter(|a| *a > 1).map(|a| format!(" attempt {a}")).unwrap_or_default();
    let text = match e.kind.split_once('.') {
        Some(("step", what)) => {
            if what == "running" {
                if let Some(step) = &e.step {
                    if is_crew(state, step, &node) {
                        state.transcripts.entry(step.clone()).or_insert(0);
                    }
                }
            }
            if what == "created" {
                if let (Some(step), Some("crew")) = (&e.step, e.attrs.get("kind").and_then(Value::as_str)) {
                    state.crew.insert(step.clone());
                }
            }
            format!("{:<16} {}{attempt}{reason}", node, style.paint(status_tint(what), what))
        }
        Some(("run", "awaiting")) => {
            let prompt = e.attrs.get("prompt").and_then(Value::as_str).unwrap_or("").trim().to_owned();
            format!("{:<16} {}: {prompt}", node, style.paint(Tint::Yellow, "waiting for approval"))
        }
        Some(("run", what)) => format!("{:<16} {}{reason}", "run", style.paint(status_tint(what), what)),
        _ => format!("{:<16} {}", node, e.kind),
    };
    screen.line(&format!("  {}  {text}", style.paint(Tint::Dim, &clock(e.at))));
    true
}

/// Whether a step is a crew step: from its `step.created` event, or the run's steps (a node's
/// kind never changes between its steps).
fn is_crew(state: &State, step: &str, node: &str) -> bool {
    state.crew.contains(step) || state.detail.steps.iter().any(|s| (s.id == step || s.node == node) && s.kind == "crew")
}

/// Reads the run again: prints the headline when its words change, and each approval newly
/// waiting, with how to answer it.
async fn refresh(api: &Api, screen: &Screen, state: &mut State, json: bool, keys: bool) -> Result<(), ClientError> {
    let detail: RunDetail = api.get(api.project_url(&["runs", &state.run])?).await?.json()?;
    let before = (state.detail.run.status.clone(), state.detail.run.words.clone());
    state.detail = detail;
    if json {
        return Ok(());
    }
    if (state.detail.run.status.clone(), state.detail.run.words.clone()) != before && state.detail.run.status == "running" {
        screen.line(&headline(&state.detail, screen.style));
    }
    let open: Vec<Approval> = state.detail.approvals.clone();
    for a in open {
        if state.announced.insert(a.node.clone()) {
            let fields = form::fields(&a.fields);
            let described: Vec<String> = fields.iter().map(form::Field::describe).collect();
            let with = if described.is_empty() { String::new() } else { format!(" — fields: {}", described.join("; ")) };
            screen.line(&format!("  {} {}: {}{with}", screen.paint(Tint::Yellow, "?"), a.node, a.prompt.trim()));
            if keys {
                screen.line(&format!("  {}", screen.paint(Tint::Bold, "press a to answer, c to cancel the run, q to quit")));
            } else {
                // No keys without a terminal: the commands that do the same.
                screen.line(&format!("  answer with: shopfloor approve {} {}", state.run, a.node));
                screen.line(&format!("  or cancel with: shopfloor runs cancel {}", state.run));
            }
        }
    }
    state.announced.retain(|n| state.detail.approvals.iter().any(|a| &a.node == n));
    Ok(())
}

/// Prints the run's journal after the last event shown, page by page.
async fn journal(api: &Api, screen: &Screen, state: &mut State, json: bool) -> Result<(), ClientError> {
    let mut after = state.last_seq;
    loop {
        let url = with_query(api.project_url(&["runs", &state.run, "events"])?, &[("after", Some(&after.to_string())), ("limit", Some("200"))]);
        let page: EventPage = api.get(url).await?.json()?;
        for raw in &page.items {
            show_event(screen, state, raw, json);
        }
        match page.next_after {
            Some(n) => after = n,
            None => return Ok(()),
        }
    }
}

/// The run has ended: the rest of its journal (its stream may lag behind the read that saw
/// the end), its last headline, and the exit code.
async fn finish(api: &Api, screen: &Screen, state: &mut State, json: bool) -> Result<u8, ClientError> {
    journal(api, screen, state, json).await?;
    if !json {
        screen.line(&headline(&state.detail, screen.style));
    }
    Ok(if state.detail.run.status == "completed" { 0 } else { 1 })
}

/// Prints the new lines of each running crew step's log; forgets steps that have ended, after
/// their last lines.
///
/// A step is forgotten only when the run, read before its log, shows it ended: the lines a
/// step wrote before it ended are then all in the log read after. A step the run does not
/// show yet (its `step.running` event came before the run was read again) is still running.
async fn transcripts(api: &Api, screen: &Screen, state: &mut State) -> Result<(), ClientError> {
    let steps: Vec<(String, i64)> = state.transcripts.iter().map(|(k, v)| (k.clone(), *v)).collect();
    for (step, mut after) in steps {
        let ended = state.detail.steps.iter().any(|s| s.id == step && !matches!(s.state.as_str(), "pending" | "running" | "leased"));
        loop {
            let url =
                with_query(api.project_url(&["runs", &state.run, "steps", &step, "logs"])?, &[("after", Some(&after.to_string())), ("limit", Some("200"))]);
            let page: LogPage = api.get(url).await?.json()?;
            for l in &page.items {
                let mark = if l.stream == "stderr" { "!" } else { "│" };
                screen.line(&format!("      {} {}", screen.paint(Tint::Dim, mark), l.line));
                after = after.max(l.seq);
            }
            if page.next_after.is_none() {
                break;
            }
        }
        if ended {
            state.transcripts.remove(&step);
        } else {
            state.transcripts.insert(step, after);
        }
    }
    Ok(())
}

/// Questions asked inside the raw-mode screen, answered with the keys of its event stream.
struct RawPrompt<'a> {
    screen: &'a Screen,
    term: &'a mut EventStream,
}

impl Prompt for RawPrompt<'_> {
    async fn line(&mut self, question: &str) -> Option<String> {
        self.screen.partial(&format!("  {question}"));
        let mut text = String::new();
        loop {
            match self.term.next().await? {
                Ok(TermEvent::Key(k)) if k.kind != KeyEventKind::Release => match k.code {
                    KeyCode::Enter => {
                        self.screen.line("");
                        return Some(text);
                    }
                    KeyCode::Esc => {
                        self.screen.line("");
                        return None;
                    }
                    KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                        self.screen.line("");
                        return None;
                    }
                    KeyCode::Backspace if text.pop().is_some() => self.screen.partial("\x08 \x08"),
                    KeyCode::Char(c) => {
                        text.push(c);
                        self.screen.partial(&c.to_string());
                    }
                    _ => {}
                },
                Ok(TermEvent::Paste(p)) => {
                    text.push_str(&p);
                    self.screen.partial(&p);
                }
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }

    fn note(&mut self, text: &str) {
        self.screen.line(text);
    }
}

/// `a`: answers the approval the run waits on, asking its fields in turn.
async fn answer(api: &Api, screen: &Screen, state: &mut State, term: &mut EventStream) {
    let approvals = state.detail.approvals.clone();
    let mut prompt = RawPrompt { screen, term };
    let node = match approvals.as_slice() {
        [] => {
            prompt.note("  no approval waits on this run");
            return;
        }
        [_] => None,
        many => {
            let names: Vec<&str> = many.iter().map(|a| a.node.as_str()).collect();
            match prompt.line(&format!("which approval ({})? ", names.join(", "))).await {
                Some(n) => Some(n.trim().to_owned()),
                None => return,
            }
        }
    };
    let approval = match pick(&approvals, node.as_deref(), &state.run) {
        Ok(a) => a.clone(),
        Err(e) => {
            prompt.note(&format!("  {e}"));
            return;
        }
    };
    prompt.note(&format!("  {}: {}", approval.node, approval.prompt.trim()));
    let fields = form::fields(&approval.fields);
    let mut given = Map::new();
    if form::ask(&fields, &mut given, &mut prompt).await.is_none() {
        prompt.note("  not answered");
        return;
    }
    match send_approval(api, &state.run, &approval.node, given).await {
        Ok(answer) => {
            let words = answer.value().ok().map(|d| answer_words(d.get("answer"))).unwrap_or_default();
            screen.line(&format!("  {} {}{words}", screen.paint(Tint::Green, "approved"), approval.node));
        }
        Err(e) => screen.line(&format!("  {} {e}", screen.paint(Tint::Red, "error:"))),
    }
}

impl RawPrompt<'_> {
    /// Asks a yes-or-no question answered with one key, as the other keys of the screen act
    /// at once: `y` is yes, any other key (or the terminal gone) no.
    async fn yes(&mut self, question: &str) -> bool {
        self.screen.partial(&format!("  {question}"));
        loop {
            match self.term.next().await {
                Some(Ok(TermEvent::Key(k))) if k.kind != KeyEventKind::Release => {
                    let yes = matches!(k.code, KeyCode::Char('y' | 'Y')) && !k.modifiers.contains(KeyModifiers::CONTROL);
                    self.screen.line(if yes { "yes" } else { "no" });
                    return yes;
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    self.screen.line("");
                    return false;
                }
            }
        }
    }
}

/// `c`: cancels the run after a yes (the one key `y`).
async fn cancel(api: &Api, screen: &Screen, state: &State, term: &mut EventStream) {
    let mut prompt = RawPrompt { screen, term };
    if !prompt.yes(&format!("cancel {}? [y/N] ", state.run)).await {
        return;
    }
    let sent = match api.project_url(&["runs", &state.run, "cancel"]) {
        Ok(url) => api.post(url, Body::None).await.map(|_| ()),
        Err(e) => Err(e),
    };
    if let Err(e) = sent {
        screen.line(&format!("  {} {e}", screen.paint(Tint::Red, "error:")));
    }
}
