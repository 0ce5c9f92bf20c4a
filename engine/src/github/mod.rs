//! GitHub effects: what the engine itself does on GitHub, and how waiting steps follow it.
//!
//! - `client` — the GitHub App through octocrab: RS256 JWT app auth, installation tokens scoped
//!   to one repository and cached until five minutes before expiry, calls whose failures are
//!   classified (4xx final, rate limits and outages deferred, 5xx and timeouts retried).
//! - `outputs` — the output executor: pull requests, comments, labels and board moves,
//!   idempotent after a crash (an open PR on the branch is found before opening one; a comment
//!   carries a hidden marker with its run and node and is found before being posted again).
//! - `watch` — gates on checks and waits on GitHub events: the step waits, the webhook that
//!   can decide it wakes it (`store::github`), and the engine decides it under the run's lock.
//!
//! **Architecture Invariant:** GitHub is called only by the output executor, outside any
//! transaction, under a lease fenced like every holder's; the ingest and the engine's advance
//! never call GitHub.

pub mod client;
pub mod outputs;
pub mod watch;

pub use client::{AppSettings, CallError, GithubApp, Scope};

/// What shopfloor's own HTTP clients call themselves: GitHub's API refuses a request without a
/// `User-Agent` (403).
pub const USER_AGENT: &str = concat!("shopfloor/", env!("CARGO_PKG_VERSION"));
pub use outputs::{Executed, OutputExecutor};
