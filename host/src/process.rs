//! Child processes in process groups of their own, and bounded calls.
//!
//! Every harness and every git call runs as the leader of a new process group, so that it and
//! everything it starts (a test server, git's credential helper, an agent's tools) can be
//! signalled at once. Killing only the leader is not enough: a grandchild would keep running,
//! or keep an output pipe open so that reading it never ends.
//!
//! A harness writes to a file in its attempt directory rather than a pipe: the file outlives a
//! restart of the host, so a process that still runs after one can be adopted and its output
//! read from the start again (`attempt`, `recovery`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use crate::limits::Group;

/// Where `command` resolves: a path as given, else the first executable of that name on PATH.
pub fn find(command: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let executable = |p: &Path| p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if command.contains('/') {
        let p = PathBuf::from(command);
        return executable(&p).then_some(p);
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(command)).find(|p| executable(p))
}

/// Sends `signal` to every process of the group `pgid`; false when none is left.
pub fn signal_group(pgid: i32, signal: i32) -> bool {
    if pgid <= 1 {
        return false;
    }
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
    unsafe { libc::kill(-pgid, signal) == 0 }
}

/// Interrupts (SIGINT) every process of the group `pgid` but bubblewrap's own: bwrap would end
/// at once and its PID namespace with it, taking the harness before it prints its last word;
/// it ends by itself once the harness has. False when the group is gone.
pub fn interrupt_group(pgid: i32) -> bool {
    let members = group_members(pgid);
    for pid in &members {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != "bwrap" {
            // SAFETY: kill(2) on one pid; no memory is involved.
            unsafe { libc::kill(*pid, libc::SIGINT) };
        }
    }
    !members.is_empty()
}

/// The start time of a process (clock ticks since boot, field 22 of `/proc/<pid>/stat`), and
/// whether it is a zombie. Together with the pid it names one process: a pid reused after a
/// restart has another start time.
fn stat(pid: i32) -> Option<(u64, bool)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?;
    let start: u64 = fields.get(19)?.parse().ok()?;
    Some((start, *state == "Z"))
}

/// The identity of a live process, to journal beside its pid.
pub fn start_time(pid: i32) -> Option<u64> {
    stat(pid).map(|(start, _)| start)
}

/// Whether the process `pid` that started at `started` still runs (a zombie does not).
pub fn alive(pid: i32, started: Option<u64>) -> bool {
    match stat(pid) {
        Some((start, zombie)) => !zombie && started.is_none_or(|s| s == start),
        // No /proc (not Linux): ask the kernel whether the pid exists.
        // SAFETY: signal 0 only checks that the process exists.
        None => !Path::new("/proc/self/stat").exists() && unsafe { libc::kill(pid, 0) == 0 },
    }
}

/// The pids of the live (not zombie) processes of group `pgid`.
pub fn group_members(pgid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(close) = text.rfind(')') else { continue };
        let fields: Vec<&str> = text[close + 1..].split_whitespace().collect();
        // Fields after the name: state, ppid, pgrp, …
        if fields.first() != Some(&"Z") && fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid) {
            out.push(pid);
        }
    }
    out
}

/// Starts `program` as the leader of a new process group in `cwd`, its stdout and stderr
/// appended to `output`, `stdin` written to it (then closed) by a task the caller owns; in
/// `group` when given, and with `cpu_secs` of CPU time for each of its processes when given.
pub fn spawn_harness(
    program: &[String], cwd: &Path, env: &[(String, String)], output: &Path, group: Option<&Group>, cpu_secs: Option<u64>,
) -> std::io::Result<Child> {
    let (first, args) = program.split_first().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command"))?;
    let out = std::fs::OpenOptions::new().create(true).append(true).open(output)?;
    let err = out.try_clone()?;
    let mut cmd = Command::new(first);
    // Nothing of the host's environment but what the caller gives (`attempt::room`).
    cmd.args(args)
        .current_dir(cwd)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::piped())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        // The process may outlive us on purpose (adoption after a restart): never killed by a
        // dropped handle, only by the supervisor.
        .kill_on_drop(false);
    // In the step's control group before it runs: nothing it starts is outside it.
    let files = group.map(Group::procs_files).unwrap_or_default();
    if !files.is_empty() || cpu_secs.is_some() {
        // SAFETY: `join` and `limit_cpu` make only async-signal-safe calls (open, write, close,
        // setrlimit).
        unsafe {
            cmd.pre_exec(move || {
                crate::limits::join(&files)?;
                cpu_secs.map_or(Ok(()), crate::limits::limit_cpu)
            })
        };
    }
    cmd.spawn()
}

/// What a bounded call came back with.
#[derive(Debug)]
pub struct Output {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("cannot start `{0}`: {1}")]
    Spawn(String, std::io::Error),
    #[error("`{0}` ran past its time limit of {1:?} and was killed")]
    TimedOut(String, Duration),
    #[error("`{0}` failed: {1}")]
    Io(String, std::io::Error),
}

/// Runs `cmd` (already configured with its args, cwd and env) in a process group of its own,
/// with no stdin, collecting its output; past `limit` the whole group is killed.
pub async fn call(mut cmd: Command, what: &str, limit: Duration) -> Result<Output, CallError> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).kill_on_drop(true).env("GIT_TERMINAL_PROMPT", "0");
    let mut child = cmd.spawn().map_err(|e| CallError::Spawn(what.to_owned(), e))?;
    let pgid = child.id().map_or(0, |p| p as i32);
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let collect = async {
        let (mut o, mut e) = (Vec::new(), Vec::new());
        let read_out = async {
            if let Some(s) = out.as_mut() {
                s.read_to_end(&mut o).await?;
            }
            Ok::<_, std::io::Error>(())
        };
        let read_err = async {
            if let Some(s) = err.as_mut() {
                s.read_to_end(&mut e).await?;
            }
            Ok::<_, std::io::Error>(())
        };
        let (a, b) = tokio::join!(read_out, read_err);
        a.and(b)?;
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, o, e))
    };
    match tokio::time::timeout(limit, collect).await {
        Ok(Ok((status, o, e))) => {
            // Whatever it left running in its group goes with it.
            signal_group(pgid, libc::SIGKILL);
            Ok(Output { status: status.code(), stdout: String::from_utf8_lossy(&o).into_owned(), stderr: String::from_utf8_lossy(&e).into_owned() })
        }
        Ok(Err(e)) => {
            signal_group(pgid, libc::SIGKILL);
            Err(CallError::Io(what.to_owned(), e))
        }
        Err(_) => {
            signal_group(pgid, libc::SIGKILL);
            Err(CallError::TimedOut(what.to_owned(), limit))
        }
    }
}

/// The first SIGTERM or Ctrl-C cancels `drain`; the second cancels `abort`. Every long-lived
/// `shopfloor` process (host, serve, api, engine) shuts down this way.
pub fn shutdown_signals() -> (tokio_util::sync::CancellationToken, tokio_util::sync::CancellationToken) {
    let (drain, abort) = (tokio_util::sync::CancellationToken::new(), tokio_util::sync::CancellationToken::new());
    let (d, a) = (drain.clone(), abort.clone());
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
            tracing::warn!("cannot install signal handlers");
            return;
        };
        for token in [d, a] {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            token.cancel();
        }
    });
    (drain, abort)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_past_its_limit_is_killed_with_its_children() {
        let mut cmd = Command::new("sh");
        // The child keeps the output pipe open: without killing the group, reading would hang.
        cmd.args(["-c", "sleep 30 & echo started; wait"]);
        let err = call(cmd, "sh", Duration::from_millis(500)).await.unwrap_err();
        assert!(matches!(err, CallError::TimedOut(..)), "{err}");
    }

    #[tokio::test]
    async fn a_harness_past_its_cpu_time_is_ended_by_the_kernel() {
        // Where no control group counts a step's CPU time, each process has the limit.
        let dir = tempfile::tempdir().unwrap();
        let program = ["sh".to_owned(), "-c".to_owned(), "while :; do :; done".to_owned()];
        let mut child = spawn_harness(&program, dir.path(), &[], &dir.path().join("out"), None, Some(1)).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(120), child.wait()).await.expect("ended").unwrap();
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(libc::SIGXCPU), "{status:?}");
    }

    #[tokio::test]
    async fn a_call_collects_output_and_status() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
        let out = call(cmd, "sh", Duration::from_secs(5)).await.unwrap();
        assert_eq!((out.status, out.stdout.trim(), out.stderr.trim()), (Some(3), "out", "err"));
    }

    #[test]
    fn this_process_is_alive_and_has_a_start_time() {
        let me = std::process::id() as i32;
        let start = start_time(me);
        assert!(start.is_some());
        assert!(alive(me, start));
        assert!(!alive(me, start.map(|s| s + 1)), "another start time is another process");
    }
}
