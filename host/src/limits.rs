//! Per-step limits on processes, memory and CPU time, by control group: each walled harness
//! starts in a group of its own (placed there before it runs, so nothing it starts escapes),
//! whose `pids.max` and memory limit the kernel enforces; a step that reached one fails
//! `resource_limit`, and the host and the other steps carry on. CPU time is the group's total
//! (v2's `cpu.stat`, which every group keeps), read by the host as it watches the step, which
//! it interrupts at the limit; where no v2 group counts it, each process of the step gets the
//! limit as its own (`RLIMIT_CPU`: the kernel ends it with `SIGXCPU`).
//!
//! cgroup v2 (one hierarchy, `/sys/fs/cgroup`: `pids.max`, `memory.max`, `memory.events`'s
//! `oom_kill`, `pids.events`' `max`) where the host has it, else v1's `pids` and `memory`
//! controllers (`memory.limit_in_bytes`, `memory.oom_control`'s `oom_kill`, `pids.events`).
//! Groups are made under the host's own group (v2) or a `shopfloor` group of each controller
//! (v1); where neither can be written the host says so at start and runs steps without them.

use std::ffi::CString;
use std::path::{Path, PathBuf};

/// The limits of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub processes: u32,
    pub memory_bytes: u64,
    /// CPU seconds, the step's processes' together; 0: none.
    pub cpu_secs: u64,
}

/// Where step groups are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cgroups {
    /// cgroup v2: step groups under this directory.
    V2(PathBuf),
    /// cgroup v1: step groups under these directories of the `pids` and `memory` controllers,
    /// and of `cpuacct` (which counts CPU time) where it is mounted.
    V1 { pids: PathBuf, memory: PathBuf, cpuacct: Option<PathBuf> },
    /// No control group this host may write: no limits.
    Unavailable(String),
}

const ROOT: &str = "/sys/fs/cgroup";

impl Cgroups {
    /// The control groups this host can make step groups in, tried by making one.
    pub fn detect() -> Cgroups {
        let root = Path::new(ROOT);
        let found = if root.join("cgroup.controllers").exists() {
            v2_parent().map(Cgroups::V2)
        } else {
            let (pids, memory) = (root.join("pids/shopfloor"), root.join("memory/shopfloor"));
            let cpuacct = Some(root.join("cpuacct/shopfloor")).filter(|c| std::fs::create_dir_all(c).is_ok());
            std::fs::create_dir_all(&pids).and_then(|()| std::fs::create_dir_all(&memory)).map(|()| Cgroups::V1 { pids, memory, cpuacct })
        };
        match found {
            Ok(c) => match c.make("probe") {
                Ok(group) => {
                    group.remove();
                    c
                }
                Err(e) => Cgroups::Unavailable(format!("cannot make a control group: {e}")),
            },
            Err(e) => Cgroups::Unavailable(format!("cannot make a control group under {ROOT}: {e}")),
        }
    }

    /// Makes the group of one step (`name`) with `limits`; none where the host has no control
    /// group to write (it said so at start).
    pub fn group(&self, name: &str, limits: Limits) -> std::io::Result<Option<Group>> {
        if matches!(self, Cgroups::Unavailable(_)) {
            return Ok(None);
        }
        let group = self.make(name)?;
        match &group {
            Group::V2(dir) => {
                std::fs::write(dir.join("pids.max"), limits.processes.to_string())?;
                std::fs::write(dir.join("memory.max"), limits.memory_bytes.to_string())?;
                // No swap to spill into: the memory limit is the step's.
                let _ = std::fs::write(dir.join("memory.swap.max"), "0");
            }
            Group::V1 { pids, memory, .. } => {
                std::fs::write(pids.join("pids.max"), limits.processes.to_string())?;
                std::fs::write(memory.join("memory.limit_in_bytes"), limits.memory_bytes.to_string())?;
                let _ = std::fs::write(memory.join("memory.memsw.limit_in_bytes"), limits.memory_bytes.to_string());
            }
        }
        Ok(Some(group))
    }

    /// The group of step `name` made earlier (by this host before a restart), if it is there.
    pub fn existing(&self, name: &str) -> Option<Group> {
        self.named(name).ok().filter(|g| g.dirs().iter().all(|d| d.exists()))
    }

    fn make(&self, name: &str) -> std::io::Result<Group> {
        let group = self.named(name)?;
        for dir in group.dirs() {
            std::fs::create_dir_all(dir)?;
        }
        Ok(group)
    }

    /// Where the group of step `name` is.
    fn named(&self, name: &str) -> std::io::Result<Group> {
        Ok(match self {
            Cgroups::V2(parent) => Group::V2(parent.join(name)),
            Cgroups::V1 { pids, memory, cpuacct } => {
                Group::V1 { pids: pids.join(name), memory: memory.join(name), cpuacct: cpuacct.as_ref().map(|c| c.join(name)) }
            }
            Cgroups::Unavailable(why) => return Err(std::io::Error::other(why.clone())),
        })
    }
}

/// cgroup v2: a `shopfloor` group beside the host's own, with the pids and memory controllers
/// enabled for the groups made in it. (A process may not stay in a group whose controllers
/// are enabled for children, so the steps' groups live in their own parent.)
fn v2_parent() -> std::io::Result<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup")?;
    let own = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("/").trim_start_matches('/');
    let base = Path::new(ROOT).join(own);
    let parent = base.parent().unwrap_or(&base).join("shopfloor");
    std::fs::create_dir_all(&parent)?;
    std::fs::write(parent.join("cgroup.subtree_control"), "+pids +memory")?;
    Ok(parent)
}

/// One step's control group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Group {
    V2(PathBuf),
    V1 { pids: PathBuf, memory: PathBuf, cpuacct: Option<PathBuf> },
}

impl Group {
    fn dirs(&self) -> Vec<&Path> {
        match self {
            Group::V2(dir) => vec![dir],
            Group::V1 { pids, memory, cpuacct } => [Some(pids), Some(memory), cpuacct.as_ref()].into_iter().flatten().map(PathBuf::as_path).collect(),
        }
    }

    /// The `cgroup.procs` files a process joins the group by, as C strings for `pre_exec`.
    pub fn procs_files(&self) -> Vec<CString> {
        self.dirs().iter().filter_map(|d| CString::new(d.join("cgroup.procs").as_os_str().as_encoded_bytes()).ok()).collect()
    }

    /// The CPU time the step's processes have used, where the group counts it (v2's
    /// `cpu.stat`, v1's `cpuacct.usage`).
    pub fn cpu_used(&self) -> Option<std::time::Duration> {
        match self {
            Group::V2(dir) => {
                let stat = std::fs::read_to_string(dir.join("cpu.stat")).ok()?;
                let usec: u64 = stat.lines().find_map(|l| l.strip_prefix("usage_usec "))?.trim().parse().ok()?;
                Some(std::time::Duration::from_micros(usec))
            }
            Group::V1 { cpuacct, .. } => {
                let nanos: u64 = std::fs::read_to_string(cpuacct.as_ref()?.join("cpuacct.usage")).ok()?.trim().parse().ok()?;
                Some(std::time::Duration::from_nanos(nanos))
            }
        }
    }

    /// Whether the step has used its CPU time.
    pub fn cpu_spent(&self, limits: Limits) -> bool {
        limits.cpu_secs > 0 && self.cpu_used().is_some_and(|used| used.as_secs() >= limits.cpu_secs)
    }

    /// Which limit the step reached, if one: `cpu`, `processes` or `memory`.
    pub fn reached(&self, limits: Limits) -> Option<&'static str> {
        if self.cpu_spent(limits) {
            return Some("cpu");
        }
        let count = |file: PathBuf, key: &str| -> u64 {
            std::fs::read_to_string(file).unwrap_or_default().lines().find_map(|l| l.strip_prefix(key).map(str::trim).and_then(|n| n.parse().ok())).unwrap_or(0)
        };
        let (pids, memory) = match self {
            Group::V2(dir) => (count(dir.join("pids.events"), "max "), count(dir.join("memory.events"), "oom_kill ")),
            Group::V1 { pids, memory, .. } => (count(pids.join("pids.events"), "max "), count(memory.join("memory.oom_control"), "oom_kill ")),
        };
        if memory > 0 {
            Some("memory")
        } else if pids > 0 {
            Some("processes")
        } else {
            None
        }
    }

    /// Whether the group is there.
    pub fn exists(&self) -> bool {
        self.dirs().iter().any(|d| d.exists())
    }

    /// Removes the group (it must hold no process any more).
    pub fn remove(&self) {
        for dir in self.dirs() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Gives the calling process (and what it starts) at most `secs` seconds of CPU time each: for a
/// child between fork and exec (setrlimit is async-signal-safe). At the limit the kernel sends
/// `SIGXCPU`, which ends a process that does not handle it; five seconds on, `SIGKILL`.
pub fn limit_cpu(secs: u64) -> std::io::Result<()> {
    let limit = libc::rlimit { rlim_cur: secs as libc::rlim_t, rlim_max: secs.saturating_add(5) as libc::rlim_t };
    // SAFETY: setrlimit with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_CPU, &limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Joins the calling process to the groups whose `cgroup.procs` files are `files`: for a child
/// between fork and exec, so only async-signal-safe calls.
pub fn join(files: &[CString]) -> std::io::Result<()> {
    for file in files {
        // SAFETY: open/write/close on a NUL-terminated path and a static buffer.
        let fd = unsafe { libc::open(file.as_ptr(), libc::O_WRONLY) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let written = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
        unsafe { libc::close(fd) };
        if written != 1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
