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

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use protocol::{Complete, Outcome, Secret};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::{Assignment, ClientError};
use crate::git::{self, GitError};
use crate::harness::{self, Ended, Exit, Kind, Reader};
use crate::journal::{self, Entry, Phase};
use crate::limits::Group;
use crate::process;

mod room;
pub(crate) mod session;
mod signal;

use session::{CodexSessionFile, POLL, Proc, Session, Tail, ToReporter, ToStdin, converse, interrupt, reporter, sleep_until, stop_reason};
pub use signal::{Shared, Stop, StopSignal};

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
        match shared.client.start(&step, kind.name(), !shared.settings.walls.walled()).await {
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
        let mut room = match room::furnish(&shared.settings, &e, kind, &cwd) {
            Ok(room) => room,
            Err(err) => {
                tracing::warn!(step.id = %step, error = %err, "cannot make the step's room");
                return Some(failed("prepare_failed", "infrastructure", kind.name()));
            }
        };
        let env = room::environment(&shared.settings, &e, kind);
        let _proxy = match room::open_egress(&shared.settings, &e, kind, &env, refusals(&tx)) {
            Ok(opened) => opened.map(|(proxy, egress)| {
                room.egress = Some(egress);
                proxy
            }),
            Err(err) => {
                tracing::warn!(step.id = %step, error = %err, "cannot open the step's proxy");
                return Some(failed("prepare_failed", "infrastructure", kind.name()));
            }
        };
        let program = shared.settings.walls.wrap(&room, &program);
        let group = match shared.settings.cgroups.group(&step, shared.settings.limits) {
            Ok(group) => group,
            Err(err) => {
                tracing::warn!(step.id = %step, error = %err, "cannot set the step's limits");
                return Some(failed("prepare_failed", "infrastructure", kind.name()));
            }
        };
        // Where no control group counts the step's CPU time, each process gets the limit.
        let limits = shared.settings.limits;
        let cpu_rlimit = (limits.cpu_secs > 0 && group.as_ref().is_none_or(|g| g.cpu_used().is_none())).then_some(limits.cpu_secs);
        let mut child = match process::spawn_harness(&program, &cwd, &env, &e.output_file(), group.as_ref(), cpu_rlimit) {
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
        supervise(&shared, &mut e, Proc::Child(child), kind, &stop, tx.clone(), stdin_tx.clone(), group).await
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
    let group = shared.settings.cgroups.existing(&e.assignment.step);
    let env = room::environment(&shared.settings, &e, kind);
    let proxy = room::open_egress(&shared.settings, &e, kind, &env, refusals(&tx));
    if let Err(err) = &proxy {
        tracing::warn!(step.id = %e.assignment.step, error = %err, "cannot open the adopted step's proxy again; it has no network");
    }
    let result = supervise(&shared, &mut e, Proc::Adopted { pid, start }, kind, &stop, tx.clone(), None, group).await;
    drop(proxy);
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(15), async { while tasks.join_next().await.is_some() {} }).await;
    tasks.shutdown().await;
    report_and_clean(&shared, e, result).await;
}

/// Where the step's proxy tells of a destination it refused: the session's next report.
fn refusals(tx: &mpsc::UnboundedSender<ToReporter>) -> crate::egress::proxy::Refused {
    let tx = tx.clone();
    Arc::new(move |dest| {
        let _ = tx.send(ToReporter::EgressRefused(dest));
    })
}

/// Asks the server for a fresh installation token for the attempt's repository (before each
/// fetch and push, and after adopting the attempt), keeps it in memory (never in the journal),
/// and answers the token to use: the fresh one, or the one at hand when the server has none to
/// give or cannot be asked (then the host's own git credentials may still apply).
async fn refresh_token(shared: &Shared, e: &mut Entry) -> Option<Secret> {
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

/// What to report when the attempt was stopped before its harness ran.
fn stopped_result(stop: &StopSignal, kind: Kind) -> Option<Complete> {
    match stop.why() {
        Some(Stop::Drain) => Some(failed("host_draining", "infrastructure", kind.name())),
        _ => None,
    }
}

/// A failure to report.
fn failed(reason: &str, class: &str, harness: &str) -> Complete {
    Complete { harness: Some(harness.to_owned()), ..crate::recovery::failure(reason, class) }
}

/// Where the harness runs.
fn work_dir_of(e: &Entry) -> PathBuf {
    e.worktree.clone().unwrap_or_else(|| e.dir.join("work"))
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
    let start = g.add_worktree(&cache, &wt, &url, &branch, &repo.default_branch).await.map_err(|err| err.to_string())?;
    e.start_sha = Some(start);
    Ok(())
}

/// Watches a harness until it is gone, enforcing its timeout and stopping it when told to;
/// returns what to report (`None`: nothing, the server moved on).
#[expect(clippy::too_many_arguments, reason = "the attempt's parts, each from its own place; a struct for them would be built once, here")]
async fn supervise(
    shared: &Shared, e: &mut Entry, mut proc: Proc, kind: Kind, stop: &StopSignal, tx: mpsc::UnboundedSender<ToReporter>,
    stdin: Option<mpsc::UnboundedSender<ToStdin>>, group: Option<Group>,
) -> Option<Complete> {
    let pid = e.pid.unwrap_or(0);
    let mut session = Session { reader: Reader::new(kind, e.assignment.model.clone(), shared.settings.prices.clone()), seq: 0, tx, stdin };
    let mut tail = Tail::new(e.output_file());
    let mut record = (kind == Kind::Codex).then(|| CodexSessionFile::new(room::codex_home(e)));
    let launched = e.launched_at_ms.unwrap_or_else(journal::now_ms);
    let timeout_ms = e.assignment.caps.timeout_secs.saturating_mul(1000);
    let left = Duration::from_millis((launched + timeout_ms).saturating_sub(journal::now_ms()));
    let timeout_at = Instant::now() + left;
    // A harness adopted while being terminated is killed after the grace, from now.
    let mut interrupted: Option<String> = e.terminating.clone();
    let mut kill_at: Option<Instant> = interrupted.as_ref().map(|_| Instant::now() + shared.settings.interrupt_grace);
    if interrupted.is_some() {
        process::interrupt_group(pid);
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
                    for line in record.as_mut().map(CodexSessionFile::lines).unwrap_or_default() {
                        session.feed_record(&line);
                    }
                    if interrupted.is_none() && group.as_ref().is_some_and(|g| g.cpu_spent(shared.settings.limits)) {
                        tracing::info!(step.id = %e.assignment.step, "the step used its CPU time; interrupting it");
                        interrupt(shared, e, RESOURCE_LIMIT);
                        interrupted = Some(RESOURCE_LIMIT.into());
                        kill_at = Some(Instant::now() + shared.settings.cancel_grace);
                    }
                    // What the session may spend is known here: it is stopped at once, not
                    // at the server's answer to the report that carries the figure.
                    if interrupted.is_none() && e.assignment.caps.usd.is_some_and(|cap| harness::spend(session.reader.usage()) >= cap) {
                        tracing::info!(step.id = %e.assignment.step, "the session spent what it may; interrupting it");
                        interrupt(shared, e, harness::BUDGET_CAP);
                        interrupted = Some(harness::BUDGET_CAP.into());
                        kill_at = Some(Instant::now() + shared.settings.interrupt_grace);
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
    for line in record.as_mut().map(CodexSessionFile::lines).unwrap_or_default() {
        session.feed_record(&line);
    }
    let _ = session.tx.send(ToReporter::Usage(session.reader.usage().clone()));
    let mut ended = session.reader.finish(exit, interrupted.as_deref());
    let l = shared.settings.limits;
    // The kernel ends a process past RLIMIT_CPU with SIGXCPU (bwrap reports 128 and the signal).
    let counted = group.as_ref().is_some_and(|g| g.cpu_used().is_some());
    let xcpu = !counted && l.cpu_secs > 0 && (exit.signal == Some(libc::SIGXCPU) || exit.code == Some(128 + libc::SIGXCPU));
    let reached = group.as_ref().and_then(|g| g.reached(l)).or(xcpu.then_some("cpu"));
    if let Some(limit) = reached {
        // Whatever the harness made of it, the step was cut short: reaching the limit again is
        // what another attempt would do.
        let said = match limit {
            "memory" => format!("the step used all the memory it may ({} MiB): a process of it was killed", l.memory_bytes >> 20),
            "cpu" => format!("the step used all the CPU time it may ({} s)", l.cpu_secs),
            _ => format!("the step reached the most processes it may have at once ({})", l.processes),
        };
        tracing::info!(step.id = %e.assignment.step, limit, "the step reached a limit");
        (ended.success, ended.reason, ended.class) = (false, Some(RESOURCE_LIMIT.to_owned()), "final");
        ended.text = said;
    }
    if let Some(group) = group {
        remove_group(group).await;
    }
    match stop.why() {
        // The server ended the step: its end stands and the work is not pushed, but what the
        // session spent is real, and the harness's own final figures came after the stop.
        Some(Stop::Server(state)) => Some(Complete { usage: ended.usage, ..failed(&format!("stopped: step {state}"), "ordinary", kind.name()) }),
        Some(Stop::Drain) => Some(Complete { usage: ended.usage, ..failed("host_draining", "infrastructure", kind.name()) }),
        None => Some(finish(shared, e, ended, kind).await),
    }
}

/// The reason of a step that reached its limit on processes, memory or CPU time.
const RESOURCE_LIMIT: &str = "resource_limit";

/// Removes a step's control group once the processes killed in it are gone (the kernel may take
/// a moment to let them go).
async fn remove_group(group: Group) {
    for _ in 0..50 {
        group.remove();
        if !group.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing::warn!(?group, "a step's control group still holds processes; left in place");
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
        outcome: if ended.success { Outcome::Succeeded } else { Outcome::Failed },
        reason: ended.reason.clone(),
        class: (!ended.success).then(|| ended.class.to_owned()),
        exit_code: ended.exit_code,
        output: Value::Null,
        usage: ended.usage.clone(),
        harness: Some(kind.name().to_owned()),
    };
    if a.pr_body {
        output["pr_body"] = json!(harness::pr_body(&ended.text, a.item.as_ref().and_then(|i| i.number)));
    }
    let mut files_changed = None;
    if let (Some(wt), Some(start), Some(_)) = (e.worktree.clone(), e.start_sha.clone(), a.repository.as_ref()) {
        let branch = a.branch.clone().unwrap_or_else(|| format!("shopfloor/{}", a.run));
        output["branch"] = json!(branch);
        if ended.success {
            // The claim's token may have expired during a long step, and an adopted attempt has
            // none: the push gets a fresh one.
            let g = shared.git(refresh_token(shared, e).await);
            let title = a.item.as_ref().and_then(|i| i.title.clone()).unwrap_or_else(|| a.run.clone());
            let message = format!("{}: {}\n\nshopfloor run {} step {} attempt {}", a.node, title, a.run, a.step, a.attempt);
            match g.commit_all(&wt, &message, &start).await {
                Ok(work) => {
                    files_changed = Some(work.files.len());
                    output["head_sha"] = json!(work.head);
                    output["commits"] = json!(work.commits.iter().take(100).collect::<Vec<_>>());
                    output["files"] = json!(work.files.iter().take(1000).collect::<Vec<_>>());
                    if !work.commits.is_empty() {
                        if let Err(err) = g.push(&wt, &branch).await {
                            tracing::warn!(step.id = %a.step, error = %err, "push failed");
                            result.outcome = Outcome::Failed;
                            let (reason, class, said) = match err {
                                // Refused again whatever the agent does: another session would
                                // only spend again. The reason says it was refused; the error
                                // keeps all 500 characters for the remote's own words.
                                GitError::Refused(words) => ("push_refused", "final", words),
                                // A later attempt starts from the branch as the remote has it.
                                other => ("push_failed", "infrastructure", other.to_string()),
                            };
                            result.reason = Some(reason.into());
                            result.class = Some(class.into());
                            output["error"] = json!(said.chars().take(500).collect::<String>());
                        } else {
                            output["pushed"] = json!(true);
                        }
                    }
                }
                Err(err) => {
                    tracing::warn!(step.id = %a.step, error = %err, "cannot commit the work");
                    result.outcome = Outcome::Failed;
                    result.reason = Some("commit_failed".into());
                    result.class = Some("infrastructure".into());
                    output["error"] = json!(err.to_string().chars().take(500).collect::<String>());
                }
            }
        }
    }
    output["files_changed"] = json!(files_changed.unwrap_or(0));
    if result.outcome == Outcome::Succeeded && a.expect_changes && files_changed.unwrap_or(0) == 0 {
        result.outcome = Outcome::Failed;
        if ended.refused.is_empty() {
            result.reason = Some("no_changes".into());
            result.class = Some("ordinary".into());
        } else {
            // The agent tried and was refused: its policy forbids the work, and another
            // session would be refused again.
            result.reason = Some("edits_refused".into());
            result.class = Some("final".into());
            let tried = ended.refused.iter().take(5).cloned().collect::<Vec<_>>().join("; ");
            let words = format!("the agent was refused {} tool call(s) and changed no file: {tried}", ended.refused.len());
            output["error"] = json!(words.chars().take(500).collect::<String>());
        }
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
        // On the attempt's span (`trace::attempt_span`) when it runs in one; recovery runs in none.
        crate::trace::record_outcome(&tracing::Span::current(), result.outcome.as_str(), result.reason.as_deref());
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
    if let Some(wt) = &e.worktree {
        crate::git::Git::remove_worktree(wt);
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
    if kind == Kind::Codex {
        for line in CodexSessionFile::new(room::codex_home(e)).lines() {
            reader.codex_session(&line);
        }
    }
    let ended = reader.finish(Exit { code: None, signal: None }, e.terminating.as_deref());
    finish(shared, e, ended, kind).await
}
