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
//! - **Environment.** Built from nothing by the caller (`attempt::harness_env`).
//!
//! Without bwrap, or where it cannot make its namespaces, the host claims nothing and says
//! why; `--unsandboxed` is an operator's explicit choice to run without walls.

use std::path::{Path, PathBuf};

/// How harnesses are run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Walls {
    /// Inside bubblewrap, at this path.
    Bubblewrap(PathBuf),
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
        let bwrap = find("bwrap").ok_or_else(|| "bwrap (bubblewrap) is not on PATH".to_owned())?;
        let room = Room { hidden: Vec::new(), writable: Vec::new(), readable: Vec::new(), cwd: PathBuf::from("/") };
        let walls = Walls::Bubblewrap(bwrap);
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
        let Walls::Bubblewrap(bwrap) = self else { return program.to_vec() };
        let mut argv: Vec<String> = vec![bwrap.display().to_string()];
        let mut add = |words: &[&str]| argv.extend(words.iter().map(|w| (*w).to_owned()));
        add(&["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL"]);
        add(&["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]);
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
        let cwd = room.cwd.display().to_string();
        add(&["--chdir", &cwd, "--"]);
        argv.extend(program.iter().cloned());
        argv
    }

    /// Whether harnesses run inside walls.
    pub fn walled(&self) -> bool {
        matches!(self, Walls::Bubblewrap(_))
    }
}

/// The first executable named `name` on `PATH`.
fn find(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let executable = |p: &Path| p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(name)).find(|p| executable(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_is_bound_back_after_what_is_hidden() {
        let walls = Walls::Bubblewrap(PathBuf::from("/usr/bin/bwrap"));
        let room = Room {
            hidden: vec![PathBuf::from("/var/host"), PathBuf::from("/root")],
            writable: vec![PathBuf::from("/var/host/attempts/s/worktree")],
            readable: vec![PathBuf::from("/var/host/repos/a/b.git/objects")],
            cwd: PathBuf::from("/var/host/attempts/s/worktree"),
        };
        let argv = walls.wrap(&room, &["claude".to_owned(), "-p".to_owned()]).join(" ");
        let at = |s: &str| argv.find(s).unwrap_or_else(|| panic!("{s} not in {argv}"));
        assert!(at("--tmpfs /var/host") < at("--bind /var/host/attempts/s/worktree /var/host/attempts/s/worktree"));
        assert!(at("--ro-bind / /") < at("--tmpfs /var/host"));
        assert!(argv.contains("--cap-drop ALL") && argv.contains("--unshare-pid"));
        assert!(argv.ends_with("--chdir /var/host/attempts/s/worktree -- claude -p"), "{argv}");
        assert_eq!(Walls::None.wrap(&room, &["claude".to_owned()]), ["claude"]);
    }
}
