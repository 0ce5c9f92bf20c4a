//! The agent's loop: register once, recover what the journal holds, then keep one claim open
//! at all times and run what it hands out, up to the host's slots.
//!
//! The claim is a long poll: the server answers when a step this host can run is ready, or when
//! a held step must stop (cancelled, taken back). With every slot taken the host still keeps a
//! claim open, asking for nothing (`max: 0`), so that a cancel reaches it within a second; when a
//! slot frees, that watching claim is dropped and one that asks for work is sent instead (a
//! claim that asks for work is never dropped: the server may already have leased steps for it).
//!
//! The first SIGTERM drains: no more claims for work; running steps may finish within the drain
//! time, after which they are stopped and handed back (an infrastructure failure, retried on
//! another host). A second signal exits at once: harnesses are left running, and the next start
//! of the host adopts or terminates them from the journal, or their leases lapse.

use std::collections::HashMap;
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use protocol::RegisterHost;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::attempt::session::sleep_until;
use crate::attempt::{self, Shared, Stop, StopSignal};
use crate::client::{ClaimAnswer, Client, ClientError, Credential};
use crate::config::{HostArgs, Settings};
use crate::journal::{Entry, Journal, Phase};
use crate::recovery::{self, Conclusion, Decision, Facts, Observation, Server};
use crate::{HostError, process};

/// How long a claim waits on the server.
const CLAIM_WAIT: Duration = Duration::from_secs(30);

type ClaimFuture = Pin<Box<dyn Future<Output = Result<ClaimAnswer, ClientError>> + Send>>;

/// Holds `<work-dir>/host.lock` for the life of the process: two hosts on one work directory
/// would take each other's worktrees and journal.
struct WorkDirLock {
    _file: std::fs::File,
}

fn lock_work_dir(dir: &Path) -> Result<WorkDirLock, HostError> {
    let path = dir.join("host.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| HostError::Setup(format!("cannot open {}: {e}", path.display())))?;
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own; released when the file is closed.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    if !locked {
        return Err(HostError::Setup(format!("another host process uses {}; give each host its own --work-dir", dir.display())));
    }
    Ok(WorkDirLock { _file: file })
}

/// The `kind` claim of a token, read without verifying it (the server verifies): tells a
/// registration token from a host credential.
fn token_kind(token: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("kind").and_then(|k| k.as_str()).map(str::to_owned)
}

/// The host's credential: the one kept in the work directory, or one made now by registering
/// with the registration token given, or the credential given.
async fn credential(settings: &Settings, token: Option<&str>) -> Result<Credential, HostError> {
    let path = settings.work_dir.join("credential.json");
    if let Ok(bytes) = std::fs::read(&path) {
        let c: Credential =
            serde_json::from_slice(&bytes).map_err(|e| HostError::Setup(format!("{} is unreadable ({e}); remove it and register again", path.display())))?;
        if c.server.is_empty() || c.server == settings.server {
            return Ok(c);
        }
        return Err(HostError::Setup(format!("{} is a credential for {}, not {}; use another --work-dir", path.display(), c.server, settings.server)));
    }
    let token = token
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| HostError::Setup("no credential yet: pass --token with a registration token (an admin makes one under the project's hosts)".into()))?;
    match token_kind(token).as_deref() {
        Some("registration") => {
            // A host without walls says so where its project's people see it (its capabilities);
            // each step it starts says so on its run too.
            let mut capabilities = settings.capabilities.clone();
            if !settings.walls.walled() {
                capabilities.push(UNSANDBOXED.into());
            }
            let body = RegisterHost { name: settings.name.clone(), capabilities, max_concurrent: Some(settings.slots) };
            let c = Client::register(&settings.server, token, &body).await.map_err(|e| HostError::Setup(format!("cannot register: {e}")))?;
            save_credential(&path, &c)?;
            tracing::info!(host.id = %c.host_id, "registered");
            Ok(c)
        }
        Some("host") => Ok(Credential { host_id: String::new(), token: token.to_owned(), org: String::new(), server: settings.server.clone() }),
        _ => Err(HostError::Setup("--token is neither a registration token nor a host credential".into())),
    }
}

/// Writes the credential readable by this user only.
fn save_credential(path: &Path, c: &Credential) -> Result<(), HostError> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("json.tmp");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(c).map_err(std::io::Error::other)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| HostError::Setup(format!("cannot keep the credential in {}: {e}", path.display())))
}

/// Runs the host agent until it is drained or aborted.
/// The capability a host run `--unsandboxed` registers with.
pub const UNSANDBOXED: &str = "unsandboxed";

pub async fn run(args: HostArgs) -> Result<(), HostError> {
    let settings = Settings::from_args(&args).map_err(HostError::Setup)?;
    if !settings.walls.walled() {
        tracing::warn!("--unsandboxed: crew steps run without walls, and can read and reach what this host's user can");
    }
    if let crate::limits::Cgroups::Unavailable(why) = &settings.cgroups {
        tracing::warn!(why, "steps run without limits on their processes and memory (CPU time: per process)");
    }
    std::fs::create_dir_all(&settings.work_dir).map_err(|e| HostError::Setup(format!("cannot create {}: {e}", settings.work_dir.display())))?;
    let _lock = lock_work_dir(&settings.work_dir)?;
    let credential = credential(&settings, args.token.as_deref()).await?;
    let client = Client::new(&settings.server, &credential.token).map_err(|e| HostError::Setup(e.to_string()))?;
    let journal = Journal::open(&settings.work_dir).map_err(|e| HostError::Setup(format!("cannot open the journal: {e}")))?;
    tracing::info!(server = %settings.server, slots = settings.slots, capabilities = ?settings.capabilities, "host started");
    let (drain, abort) = crate::process::shutdown_signals();
    let mut agent = Agent {
        shared: Arc::new(Shared::new(client, settings, journal)),
        running: HashMap::new(),
        tasks: JoinSet::new(),
        task_steps: HashMap::new(),
        waiting: Vec::new(),
    };
    let result = agent.serve(drain, abort).await;
    agent.tasks.shutdown().await;
    result
}

struct Agent {
    shared: Arc<Shared>,
    /// Steps this host runs now, with the signal that stops each.
    running: HashMap<String, Arc<StopSignal>>,
    tasks: JoinSet<()>,
    /// The step each task works on.
    task_steps: HashMap<tokio::task::Id, String>,
    /// Journalled attempts to look at again (the server was away or unsure).
    waiting: Vec<(Entry, Instant)>,
}

impl Agent {
    fn spawn(&mut self, step: String, work: impl Future<Output = ()> + Send + 'static, stop: Arc<StopSignal>) {
        self.running.insert(step.clone(), stop);
        let task = self.tasks.spawn(work);
        self.task_steps.insert(task.id(), step);
    }

    async fn serve(&mut self, drain: CancellationToken, abort: CancellationToken) -> Result<(), HostError> {
        let (entries, bad) = self.shared.journal.load_all().map_err(|e| HostError::Setup(format!("cannot read the journal: {e}")))?;
        for path in bad {
            tracing::error!(path = %path.display(), "unreadable journal entry; left for a person to look at");
        }
        for e in entries {
            self.recover(e).await?;
        }

        let slots = self.shared.settings.slots as usize;
        let mut claim: Option<(u32, ClaimFuture)> = None;
        let mut backoff = Duration::from_secs(1);
        let mut retry_at: Option<Instant> = None;
        let mut drain_at: Option<Instant> = None;
        let mut handed_back = false;
        loop {
            let draining = drain_at.is_some();
            if draining && self.tasks.is_empty() {
                tracing::info!("drained; exiting");
                return Ok(());
            }
            if claim.is_none() && retry_at.is_none_or(|t| t <= Instant::now()) {
                retry_at = None;
                let free = if draining { 0 } else { slots.saturating_sub(self.running.len()) as u32 };
                let held: Vec<String> = self.running.keys().cloned().collect();
                let client = self.shared.client.clone();
                claim = Some((free, Box::pin(async move { client.claim(free, &held, CLAIM_WAIT).await })));
            }
            let next_look = self.waiting.iter().map(|w| w.1).min();
            tokio::select! {
                () = abort.cancelled() => {
                    tracing::warn!(held = self.running.len(), "exiting at once; running harnesses are left to the next start or to lease expiry");
                    return Ok(());
                }
                () = drain.cancelled(), if !draining => {
                    tracing::info!(held = self.running.len(), drain_s = self.shared.settings.drain.as_secs(), "draining: no more claims for work");
                    drain_at = Some(Instant::now() + self.shared.settings.drain);
                    // A claim asking for work is let finish (it may hold leases); a watch is
                    // sent again asking for nothing.
                    if claim.as_ref().is_some_and(|c| c.0 == 0) {
                        claim = None;
                    }
                }
                () = sleep_until(drain_at), if draining && !handed_back => {
                    tracing::warn!(held = self.running.len(), "drain time is up; handing the running steps back");
                    for stop in self.running.values() {
                        stop.stop(Stop::Drain);
                    }
                    handed_back = true;
                }
                answer = async { claim.as_mut().map(|c| &mut c.1).expect("guarded").await }, if claim.is_some() => {
                    claim = None;
                    match answer {
                        Ok(answer) => {
                            backoff = Duration::from_secs(1);
                            for s in answer.stop {
                                if let Some(stop) = self.running.get(&s.step) {
                                    stop.stop(Stop::Server(s.state));
                                }
                            }
                            for a in answer.assignments {
                                if self.running.contains_key(&a.step) {
                                    continue;
                                }
                                let stop = Arc::new(StopSignal::default());
                                if draining {
                                    // Leased by a claim sent before the drain: hand it back.
                                    stop.stop(Stop::Drain);
                                }
                                tracing::info!(step.id = %a.step, run.id = %a.run, node = %a.node, harness = %a.harness, "claimed");
                                let step = a.step.clone();
                                let span = crate::trace::attempt_span(&a);
                                self.spawn(step, tracing::Instrument::instrument(attempt::run(self.shared.clone(), a, stop.clone()), span), stop);
                            }
                        }
                        Err(ClientError::Refused { status, detail }) => {
                            return Err(HostError::Refused(format!("{status}: {detail} (was the host deregistered?)")));
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, retry_in_s = backoff.as_secs(), "claim failed; retrying");
                            retry_at = Some(Instant::now() + backoff);
                            backoff = (backoff * 2).min(Duration::from_secs(30));
                        }
                    }
                }
                Some(done) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                    let id = match done {
                        Ok((id, ())) => id,
                        Err(e) => {
                            tracing::error!(error = %e, "an attempt's task failed; its lease will lapse");
                            e.id()
                        }
                    };
                    if let Some(step) = self.task_steps.remove(&id) {
                        self.running.remove(&step);
                    }
                    // A slot is free: a claim that only watches is replaced by one that asks.
                    if claim.as_ref().is_some_and(|c| c.0 == 0) && !draining {
                        claim = None;
                    }
                }
                () = sleep_until(retry_at), if retry_at.is_some() && claim.is_none() => retry_at = None,
                () = sleep_until(next_look), if next_look.is_some() => {
                    let now = Instant::now();
                    let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting).into_iter().partition(|w| w.1 <= now);
                    self.waiting = later;
                    for (e, _) in due {
                        self.recover(e).await?;
                    }
                }
            }
        }
    }

    /// Looks at the process of a journalled attempt.
    fn process_alive(e: &mut Entry) -> bool {
        match e.pid {
            Some(pid) => process::alive(pid, e.pid_start),
            // Launching, with no pid written: find the process by the step in its environment.
            None if e.phase == Phase::Launching => match find_by_step(&e.assignment.step) {
                Some(pid) => {
                    e.pid = Some(pid);
                    e.pid_start = process::start_time(pid);
                    true
                }
                None => false,
            },
            None => false,
        }
    }

    /// Asks the server where the step stands (renewing its lease if it is still ours).
    async fn server_view(&self, step: &str) -> Result<Server, HostError> {
        Ok(match self.shared.client.heartbeat(step).await {
            Ok(s) if !s.stop => Server::Ours,
            Ok(s) => Server::MovedOn(s.state),
            Err(e) if e.is_not_found() => Server::MovedOn("gone".into()),
            Err(ClientError::Unreachable(_)) => Server::Unreachable,
            Err(ClientError::Refused { status, detail }) => return Err(HostError::Refused(format!("{status}: {detail}"))),
            Err(_) => Server::Unsure,
        })
    }

    /// Decides about one journalled attempt and applies the decision, until it is settled,
    /// adopted, or must wait.
    async fn recover(&mut self, mut e: Entry) -> Result<(), HostError> {
        let step = e.assignment.step.clone();
        for _ in 0..8 {
            let alive = Self::process_alive(&mut e);
            let server = self.server_view(&step).await?;
            let facts = Facts { phase: e.phase, terminating: e.terminating.clone(), result: e.result.clone() };
            let decision = recovery::decide(&facts, &Observation { process_alive: alive, server: server.clone() });
            tracing::info!(step.id = %step, phase = ?e.phase, alive, server = ?server, decision = ?decision, "recovering a journalled attempt");
            match decision {
                Decision::Nothing => {
                    let _ = self.shared.journal.remove(&step);
                    return Ok(());
                }
                Decision::Clean => {
                    attempt::clean(&self.shared, e).await;
                    return Ok(());
                }
                Decision::Adopt => {
                    let stop = Arc::new(StopSignal::default());
                    self.spawn(step, attempt::adopt(self.shared.clone(), e, stop.clone()), stop);
                    return Ok(());
                }
                Decision::Wait => {
                    self.waiting.push((e, Instant::now() + Duration::from_secs(5)));
                    return Ok(());
                }
                Decision::Defer => {
                    self.waiting.push((e, Instant::now() + Duration::from_secs(30)));
                    return Ok(());
                }
                Decision::Observe(Phase::Exited) => {
                    // Written back by `finish`, so the next pass concludes.
                    attempt::conclude_from_output(&self.shared, &mut e).await;
                }
                Decision::Observe(phase) => {
                    e.phase = phase;
                    self.shared.journal.write(&mut e).map_err(|err| HostError::Setup(format!("cannot write the journal: {err}")))?;
                }
                Decision::Conclude(Conclusion::Report(result)) => {
                    attempt::report_and_clean(&self.shared, e, Some(result)).await;
                    return Ok(());
                }
                Decision::Conclude(Conclusion::Abandon(_)) => {
                    attempt::report_and_clean(&self.shared, e, None).await;
                    return Ok(());
                }
                Decision::Terminate(end) => {
                    let why = match (&e.terminating, &end) {
                        (Some(w), _) => w.clone(),
                        (None, Conclusion::Abandon(state)) => format!("step {state} on the server"),
                        (None, Conclusion::Report(r)) => r.reason.clone().unwrap_or_else(|| "terminated".into()),
                    };
                    e.terminating = Some(why);
                    // The intent first, then the signal.
                    self.shared.journal.write(&mut e).map_err(|err| HostError::Setup(format!("cannot write the journal: {err}")))?;
                    if let Some(pid) = e.pid {
                        terminate_group(pid, e.pid_start, self.shared.settings.cancel_grace).await;
                    }
                }
            }
        }
        tracing::warn!(step.id = %step, "journalled attempt not settled after several passes; looking again later");
        self.waiting.push((e, Instant::now() + Duration::from_secs(30)));
        Ok(())
    }
}

/// SIGINT to the group, then SIGKILL after `grace` if its leader still runs.
async fn terminate_group(pid: i32, start: Option<u64>, grace: Duration) {
    process::interrupt_group(pid);
    let deadline = Instant::now() + grace;
    while process::alive(pid, start) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    process::signal_group(pid, libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(5);
    while process::alive(pid, start) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A process started for `step` (its environment names it), if one runs.
fn find_by_step(step: &str) -> Option<i32> {
    let needle = format!("SHOPFLOOR_STEP_ID={step}");
    let dir = std::fs::read_dir("/proc").ok()?;
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(env) = std::fs::read(PathBuf::from(format!("/proc/{pid}/environ"))) else { continue };
        if env.split(|b| *b == 0).any(|v| v == needle.as_bytes()) && process::alive(pid, None) {
            return Some(pid);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_of_a_token_is_read_from_its_claims() {
        let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"kind":"registration","role":"host"}"#);
        assert_eq!(token_kind(&format!("h.{claims}.s")).as_deref(), Some("registration"));
        assert_eq!(token_kind("not a token"), None);
    }

    #[test]
    fn one_host_per_work_dir() {
        let dir = tempfile::tempdir().unwrap();
        let first = lock_work_dir(dir.path()).unwrap();
        assert!(lock_work_dir(dir.path()).is_err());
        drop(first);
        assert!(lock_work_dir(dir.path()).is_ok());
    }
}
