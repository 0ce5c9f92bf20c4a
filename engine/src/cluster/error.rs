//! What can go wrong with the embedded cluster, and the text an error carries (a command's
//! output, a log's tail).

use std::path::Path;
use std::process::Output;

/// Why the cluster could not be made, started or stopped; each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("no PostgreSQL server binaries found (looked in {looked}); install them with `apt-get install postgresql`")]
    NoBinaries { looked: String },
    #[error("PostgreSQL refuses to run as root and the `postgres` OS user could not be created: {0}; create it with `useradd --system --user-group postgres`")]
    NoOsUser(String),
    #[error("cannot run `{program}`: {cause}")]
    Spawn { program: String, cause: String },
    #[error("cannot {what} {path}: {cause}")]
    Io { what: &'static str, path: String, cause: String },
    #[error("initdb failed: {0}")]
    Initdb(String),
    #[error("PostgreSQL did not start: {0}")]
    Start(String),
    #[error("PostgreSQL is running in {dir} but does not answer on 127.0.0.1:{port}; see {log}, or stop it with `pg_ctl -D {dir} stop`")]
    NotAnswering { dir: String, port: u16, log: String },
    #[error("PostgreSQL did not stop: {0}")]
    Stop(String),
    #[error("cannot create the database `shopfloor` on 127.0.0.1:{port}: {cause}")]
    CreateDb { port: u16, cause: String },
    #[error("the cluster task failed: {0}")]
    Task(String),
}

pub(crate) fn combined(out: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The last `n` non-empty lines of `text`, on one line.
pub(crate) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

pub(crate) fn io_err(what: &'static str, path: &Path, e: std::io::Error) -> ClusterError {
    ClusterError::Io { what, path: path.display().to_string(), cause: e.to_string() }
}

pub(crate) fn spawn_err(program: &Path, e: std::io::Error) -> ClusterError {
    ClusterError::Spawn { program: program.display().to_string(), cause: e.to_string() }
}
