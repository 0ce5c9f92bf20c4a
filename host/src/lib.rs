//! The host agent (`shopfloor host`): it registers with a registration token, claims crew steps
//! its capabilities satisfy, runs each with its harness (Claude Code, Codex, or a command) in a
//! git worktree of a cached clone, streams the session to the server, and reports the outcome.
//!
//! - `config` — the settings (flags and `SHOPFLOOR_*` variables).
//! - `client` — the host protocol as the host calls it.
//! - `agent` — the loop: registration, recovery from the journal, claims, slots, drain.
//! - `attempt` — one attempt: worktree, harness, supervision (timeout, cancel), commit, push,
//!   report, cleanup.
//! - `harness` — each harness's command line and the reading of its output.
//! - `prices` — the price table spend is estimated with while a session runs.
//! - `git` — the cached clone, worktrees, commits and pushes, every call time-limited.
//! - `process` — process groups, bounded calls, liveness, and the shutdown signals every
//!   `shopfloor` process uses.
//! - `journal` — the per-attempt journal, written before each action.
//! - `recovery` — the decision, after a restart, about each journalled attempt.
//! - `trace` — the attempt's span, in its run's trace (the assignment's `traceparent`).
//!
//! The host is a client of the API and nothing else: it holds no database connection, and it
//! never writes the installation token or its own credential where a harness can read them.

pub mod agent;
pub mod attempt;
pub mod client;
pub mod config;
pub mod git;
pub mod harness;
pub mod journal;
pub mod limits;
pub mod prices;
pub mod process;
pub mod recovery;
pub mod trace;
pub mod walls;

pub use config::HostArgs;

/// Why the host agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// It could not start: settings, work directory, credential.
    #[error("{0}")]
    Setup(String),
    /// The server refuses its credential (the host was deregistered, or the credential expired).
    #[error("the server refuses this host's credential: {0}")]
    Refused(String),
}

/// Runs the host agent until a signal stops it.
pub async fn run(args: HostArgs) -> Result<(), HostError> {
    agent::run(args).await
}
