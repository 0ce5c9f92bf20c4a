//! The walls around a harness process: a crew step is untrusted code (anyone who can write an
//! issue can steer its agent), so it runs in a room of its own built with bubblewrap (`bwrap`,
//! Debian's `bubblewrap`): new mount, PID, IPC and UTS namespaces, every capability dropped.
//!
//! - **Files.** The system read-only (`--ro-bind / /`); a private `/tmp` and `/dev`; the host's
//!   work directory (its credential, journal, cached clones, every attempt) and the host user's
//!   home hidden under empty tmpfs mounts; then the step's own directories bound back, writable
//!   (its worktree or scratch directory, read-only for a `read` step; its home; Codex's home),
//!   and its repository cache's objects read-only (its worktree borrows them).
//! - **Processes.** The step's processes live in a PID namespace of its own: when its harness
//!   ends, bwrap, the namespace's first process, ends and takes every process left in it (one
//!   that left the process group with `setsid` too). The host never signals bwrap itself,
//!   which would end at once and take the harness before its last word: `interrupt` signals
//!   the group's other processes.
//! - **Network.** A network namespace of its own, with only its loopback: the room's way out is
//!   the host's proxy, over a unix socket bound into it (`egress`).
//! - **Environment.** Built from nothing by the caller (`attempt::room`).
//!
//! Without bwrap, or where it cannot make its namespaces, the host claims nothing and says
//! why; `--unsandboxed` is an operator's explicit choice to run without walls.
//!
//! # What a crew step may reach
//!
//! An agent is steered by text anyone who can write an issue controls: a crew step is untrusted
//! code. What it may reach is its own worktree (read-only in a `read` step), its home, Codex's
//! home, its repository cache's objects (read-only: the remote's published history), the
//! system's files read-only, the variables passed to it by name (`--pass-env`: the model API's
//! key), and through the host's proxy its model API, the host's `--egress-allow` and its node's
//! `network.allow`. What it may not: the host's credential (its file or its
//! environment), the host's journal, caches and work directory, the other steps' directories
//! and processes, the host user's credential stores (`~/.claude`, `~/.codex`, `~/.ssh`, `~/.aws`,
//! `~/.config/gh`, `~/.git-credentials`, `~/.netrc`), writing outside its own directories, any
//! other destination (the host's loopback services, the server's and PostgreSQL's ports
//! included), and outliving its step. Git fetch and push, token refresh and every call with the host's
//! credential stay in the host process, outside the walls.
//!
//! How each wall is built (`host/src/walls.rs`, `host/src/attempt/room.rs`), with bubblewrap:
//!
//! - **Files:** `--ro-bind / /`, a new `/dev` and `/proc`, a tmpfs `/tmp` and `/run` (where the
//!   host's unix sockets are: PostgreSQL's, Docker's; a read-only mount does not stop a
//!   connect); the host's work
//!   directory and the host user's credential stores hidden under empty tmpfs mounts (a file
//!   under `/dev/null`); then the step's own directories bound back (writable, or read-only for
//!   a `read` step's worktree) and its cache's objects read-only.
//! - **Network:** a new network namespace (`--unshare-net`); `shopfloor room` runs first in it and
//!   carries the harness's connections to the host's proxy (`egress`).
//! - **Processes:** new PID, IPC and UTS namespaces, every capability dropped (root in the room
//!   cannot unmount what hides the host). When the harness ends, bwrap, the namespace's first
//!   process, ends, and with it every process left in the namespace, one that called `setsid`
//!   included.
//! - **Environment:** built from nothing: `PATH`, the locale, the attempt's `HOME`, `TMPDIR`,
//!   the `--pass-env` names, the step's own (`SHOPFLOOR_STEP_ID`, …), the harness's own.
//! - **Limits** (`host/src/limits.rs`): each step's harness starts in a control group of its own
//!   (joined between fork and exec, so nothing it starts is outside it) with `--max-processes`
//!   (512), `--max-memory-mib` (4096) and `--max-cpu-secs` (14400, the group's total); cgroup v2
//!   where the host has it, else v1's `pids`, `memory` and `cpuacct` controllers. A step that
//!   reached one (`pids.events`' `max`, an `oom_kill`, its CPU time) fails `resource_limit`,
//!   final; the host and the other steps carry on. Where no control group can be written, the
//!   host says so at start and in `check --host` (`limits: skip`), and runs steps without them
//!   (CPU time then by `RLIMIT_CPU`, per process).
//!
//! Which wall is the boundary: these, the host's. The CLIs' own sandboxes are layered inside
//! them as the node's policy asks (Codex's `--sandbox`, Claude Code's permission mode), so a
//! `read` step is refused edits by its CLI and by its read-only worktree both. A host that cannot
//! build the walls (no bubblewrap, no namespaces) stops at start without registering, and
//! `shopfloor check --host` fails `walls` with the fix; `--unsandboxed` runs harnesses without
//! walls, only when an operator says so (environment still built from nothing; the host's
//! network as it is), and each step it starts says so on its run (`step.unwalled`).

use std::path::PathBuf;

/// How harnesses are run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Walls {
    /// Inside bubblewrap, at `bwrap`; `room` is this program, which runs in the room first
    /// (`shopfloor room`, `egress::bridge`).
    Bubblewrap { bwrap: PathBuf, room: PathBuf },
    /// Without walls: the operator said `--unsandboxed`.
    None,
}

/// What one step's room holds.
#[derive(Debug, Clone)]
pub struct Room {
    /// Hidden: the host's work directory and the host user's home.
    pub hidden: Vec<PathBuf>,
    /// The step's own directories, writable.
    pub writable: Vec<PathBuf>,
    /// Readable, nothing more (a `read` step's worktree, its cache's objects).
    pub readable: Vec<PathBuf>,
    /// Where the harness starts.
    pub cwd: PathBuf,
    /// The host's proxy for the step (its unix socket, whose directory is bound into the room
    /// read-only), and the loopback destinations tunnelled to it; `None`: no network at all.
    pub egress: Option<RoomEgress>,
}

/// A room's way out, through the host's proxy (`egress`).
#[derive(Debug, Clone)]
pub struct RoomEgress {
    pub socket: PathBuf,
    pub forwards: Vec<String>,
}

/// What a host without walls is told to do.
pub const FIX: &str = "install bubblewrap (`apt-get install bubblewrap`) on a kernel that lets it make namespaces (in a container: a seccomp profile that allows unshare, or a privileged pod), or run with --unsandboxed to run steps without walls";

impl Walls {
    /// The walls this host can build: bwrap from `PATH`, tried once with the namespaces it
    /// will use. `unsandboxed` skips them.
    pub fn probe(unsandboxed: bool) -> Result<Walls, String> {
        if unsandboxed {
            return Ok(Walls::None);
        }
        let bwrap = crate::process::find("bwrap").ok_or_else(|| "bwrap (bubblewrap) is not on PATH".to_owned())?;
        let room = std::env::current_exe().map_err(|e| format!("cannot find this program to run in the rooms: {e}"))?;
        let walls = Walls::Bubblewrap { bwrap, room };
        let room = Room { hidden: Vec::new(), writable: Vec::new(), readable: Vec::new(), cwd: PathBuf::from("/"), egress: None };
        let argv = walls.wrap(&room, &["true".to_owned()]);
        let out = std::process::Command::new(&argv[0]).args(&argv[1..]).stdin(std::process::Stdio::null()).output();
        match out {
            Ok(o) if o.status.success() => Ok(walls),
            Ok(o) => Err(format!("bwrap cannot build the walls: {}", String::from_utf8_lossy(&o.stderr).trim())),
            Err(e) => Err(format!("bwrap cannot start: {e}")),
        }
    }

    /// The command line that runs `program` in `room`.
    pub fn wrap(&self, room: &Room, program: &[String]) -> Vec<String> {
        let Walls::Bubblewrap { bwrap, room: own } = self else { return program.to_vec() };
        let mut argv: Vec<String> = vec![bwrap.display().to_string()];
        let mut add = |words: &[&str]| argv.extend(words.iter().map(|w| (*w).to_owned()));
        add(&["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--unshare-cgroup-try", "--cap-drop", "ALL"]);
        // `/run` too: the host's unix sockets live there (PostgreSQL's, Docker's, the session
        // bus), and a read-only mount does not stop a connect.
        add(&["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/run"]);
        // Hidden first, then the step's own bound back into the emptied places.
        for path in &room.hidden {
            let p = path.display().to_string();
            if path.is_file() {
                add(&["--ro-bind", "/dev/null", &p]);
            } else {
                add(&["--tmpfs", &p]);
            }
        }
        for path in &room.writable {
            let p = path.display().to_string();
            add(&["--bind", &p, &p]);
        }
        for path in &room.readable {
            let p = path.display().to_string();
            add(&["--ro-bind", &p, &p]);
        }
        if let Some(dir) = room.egress.as_ref().and_then(|e| e.socket.parent()) {
            let d = dir.display().to_string();
            add(&["--ro-bind", &d, &d]);
        }
        let cwd = room.cwd.display().to_string();
        add(&["--chdir", &cwd, "--"]);
        if let Some(egress) = &room.egress {
            argv.extend([own.display().to_string(), "room".into(), "--proxy".into(), egress.socket.display().to_string()]);
            for f in &egress.forwards {
                argv.extend(["--forward".to_owned(), f.clone()]);
            }
            argv.push("--".into());
        }
        argv.extend(program.iter().cloned());
        argv
    }

    /// Whether harnesses run inside walls.
    pub fn walled(&self) -> bool {
        matches!(self, Walls::Bubblewrap { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_is_bound_back_after_what_is_hidden() {
        let walls = Walls::Bubblewrap { bwrap: PathBuf::from("/usr/bin/bwrap"), room: PathBuf::from("/usr/bin/shopfloor") };
        let mut room = Room {
            hidden: vec![PathBuf::from("/var/host"), PathBuf::from("/root")],
            writable: vec![PathBuf::from("/var/host/attempts/s/worktree")],
            readable: vec![PathBuf::from("/var/host/repos/a/b.git/objects")],
            cwd: PathBuf::from("/var/host/attempts/s/worktree"),
            egress: None,
        };
        let argv = walls.wrap(&room, &["claude".to_owned(), "-p".to_owned()]).join(" ");
        let at = |s: &str| argv.find(s).unwrap_or_else(|| panic!("{s} not in {argv}"));
        assert!(at("--tmpfs /var/host") < at("--bind /var/host/attempts/s/worktree /var/host/attempts/s/worktree"));
        assert!(at("--ro-bind / /") < at("--tmpfs /var/host"));
        assert!(argv.contains("--cap-drop ALL") && argv.contains("--unshare-pid") && argv.contains("--unshare-net"));
        assert!(argv.ends_with("--chdir /var/host/attempts/s/worktree -- claude -p"), "{argv}");
        room.egress = Some(RoomEgress { socket: PathBuf::from("/var/host/attempts/s/egress/proxy.sock"), forwards: vec!["127.0.0.1:4000".into()] });
        let argv = walls.wrap(&room, &["claude".to_owned()]).join(" ");
        assert!(argv.contains("--ro-bind /var/host/attempts/s/egress /var/host/attempts/s/egress --chdir"), "{argv}");
        assert!(argv.ends_with("-- /usr/bin/shopfloor room --proxy /var/host/attempts/s/egress/proxy.sock --forward 127.0.0.1:4000 -- claude"), "{argv}");
        assert_eq!(Walls::None.wrap(&room, &["claude".to_owned()]), ["claude"]);
    }
}
