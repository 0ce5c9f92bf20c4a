//! The host's journal: one file per attempt, written before each thing the host does to it, so
//! that after a restart of the host every attempt can be decided on (`recovery`).
//!
//! `<work-dir>/journal/<step>.json` holds the assignment (without its token), the phase, the
//! worktree, the harness's process (pid and start time, so a reused pid is not mistaken for
//! it), the reason the host is terminating it (written before the first signal, so the reason
//! recorded stays true after a crash) and the result to report. Each write goes to a temporary
//! file, is synced, and is renamed over the old one: a crash leaves the old entry or the new,
//! never half of one.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use protocol::Complete;
use serde::{Deserialize, Serialize};

use crate::client::Assignment;

/// Where an attempt stands, in the order it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Leased to this host; nothing done yet.
    Claimed,
    /// The worktree (or scratch directory) is ready; the harness has not been started.
    Prepared,
    /// The harness is being started: written before the spawn, so that a crash between the
    /// spawn and the next write still leaves a trace (the process is found by the
    /// `SHOPFLOOR_STEP_ID` in its environment).
    Launching,
    /// The harness was started (`pid`).
    Running,
    /// The harness is gone and `result` holds what to report.
    Exited,
    /// The result was reported (or there was nothing to report); the worktree may remain.
    Reported,
    /// Everything is removed; only this entry is left.
    Cleaned,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub assignment: Assignment,
    pub phase: Phase,
    /// The attempt's directory: the harness's output file, a scratch worktree.
    pub dir: PathBuf,
    /// The cached clone the worktree belongs to.
    pub cache: Option<PathBuf>,
    pub worktree: Option<PathBuf>,
    /// The commit the worktree started from.
    pub start_sha: Option<String>,
    pub pid: Option<i32>,
    pub pid_start: Option<u64>,
    /// When the harness was started (ms since the epoch): its timeout runs from here, also
    /// after the host restarts and adopts it.
    pub launched_at_ms: Option<u64>,
    /// Why the host is stopping the harness, written before it signals it.
    pub terminating: Option<String>,
    /// What to report, once the harness is gone.
    pub result: Option<Complete>,
    pub updated_at_ms: u64,
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Entry {
    pub fn new(assignment: Assignment, dir: PathBuf) -> Entry {
        Entry {
            assignment,
            phase: Phase::Claimed,
            dir,
            cache: None,
            worktree: None,
            start_sha: None,
            pid: None,
            pid_start: None,
            launched_at_ms: None,
            terminating: None,
            result: None,
            updated_at_ms: now_ms(),
        }
    }

    /// The harness's combined output.
    pub fn output_file(&self) -> PathBuf {
        self.dir.join("output.log")
    }
}

#[derive(Debug, Clone)]
pub struct Journal {
    dir: PathBuf,
}

fn file_name(step: &str) -> Option<String> {
    // Step ids are `step-<base32>`; anything else never names a file.
    let ok = step.starts_with("step-") && step.len() <= 64 && step.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    ok.then(|| format!("{step}.json"))
}

impl Journal {
    pub fn open(work_dir: &Path) -> std::io::Result<Journal> {
        let dir = work_dir.join("journal");
        std::fs::create_dir_all(&dir)?;
        Ok(Journal { dir })
    }

    fn path(&self, step: &str) -> std::io::Result<PathBuf> {
        file_name(step).map(|f| self.dir.join(f)).ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("`{step}` is not a step id")))
    }

    /// Writes the entry durably (temporary file, sync, rename, sync of the directory).
    pub fn write(&self, entry: &mut Entry) -> std::io::Result<()> {
        entry.updated_at_ms = now_ms();
        let path = self.path(&entry.assignment.step)?;
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(entry).map_err(std::io::Error::other)?;
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        Ok(())
    }

    /// Forgets an attempt whose work is cleaned away.
    pub fn remove(&self, step: &str) -> std::io::Result<()> {
        match std::fs::remove_file(self.path(step)?) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Every entry, with the files that cannot be read as one (named, for the log).
    pub fn load_all(&self) -> std::io::Result<(Vec<Entry>, Vec<PathBuf>)> {
        let (mut entries, mut bad) = (Vec::new(), Vec::new());
        for f in std::fs::read_dir(&self.dir)?.flatten() {
            let path = f.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            match std::fs::read(&path).ok().and_then(|b| serde_json::from_slice::<Entry>(&b).ok()) {
                Some(e) => entries.push(e),
                None => bad.push(path),
            }
        }
        entries.sort_by_key(|e| e.updated_at_ms);
        Ok((entries, bad))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use protocol::Caps;

    pub(crate) fn assignment(step: &str) -> Assignment {
        Assignment {
            step: step.into(),
            run: "run-x".into(),
            node: "build".into(),
            visit: 1,
            attempt: 1,
            harness: "command".into(),
            model: None,
            prompt: "p".into(),
            command: vec!["true".into()],
            caps: Caps { turns: None, usd: None, timeout_secs: 60 },
            repository: None,
            branch: None,
            item: None,
            pr_body: false,
            expect_changes: false,
            policy: protocol::Policy::default(),
            lease_secs: 30,
            traceparent: None,
        }
    }

    #[test]
    fn entries_round_trip_and_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        let mut e = Entry::new(assignment("step-abc"), dir.path().join("a"));
        e.terminating = Some("timeout".into());
        j.write(&mut e).unwrap();
        let (all, bad) = j.load_all().unwrap();
        assert_eq!((all.len(), bad.len()), (1, 0));
        assert_eq!(all[0].terminating.as_deref(), Some("timeout"));
        j.remove("step-abc").unwrap();
        assert!(j.load_all().unwrap().0.is_empty());
        assert!(j.remove("../etc/passwd").is_err());
    }

    #[test]
    fn the_token_never_reaches_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        let mut a = assignment("step-tok");
        a.repository = Some(crate::client::Repository {
            full_name: "acme/w".into(),
            clone_url: "https://github.com/acme/w.git".into(),
            default_branch: "main".into(),
            token: Some(protocol::Secret::new("ghs_secret")),
        });
        j.write(&mut Entry::new(a, dir.path().join("t"))).unwrap();
        let text = std::fs::read_to_string(dir.path().join("journal/step-tok.json")).unwrap();
        assert!(!text.contains("ghs_secret"), "{text}");
    }
}
