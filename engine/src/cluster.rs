//! The embedded PostgreSQL cluster: what `shopfloor serve` runs when no `DATABASE_URL` is
//! given, and the throwaway cluster that `make test` starts.
//!
//! The cluster is made with the machine's own PostgreSQL server binaries and lives in
//! `<data_dir>/pg`; beside it are its log (`pg.log`), the port it was given the first time
//! (`pg.port`, reused while that port is free) and a lock file that keeps two processes from
//! starting it at once. It listens on 127.0.0.1 only, has no Unix socket, and trusts loopback
//! connections as the `shopfloor` role: it is a single-user development database, not a server
//! to expose. Settings shopfloor needs are written to `pg/shopfloor.conf`, which
//! `postgresql.conf` includes, before every start.
//!
//! PostgreSQL refuses to run as root, so when we are root the cluster belongs to, and runs as,
//! the `postgres` OS user (created if missing), through `runuser`.
//!
//! The caller stops only what it started: [`Cluster::started_here`] says whether this call
//! started the server or found it running.

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

mod error;
mod os;
mod server;

pub use error::ClusterError;
use error::io_err;
use os::Runner;
use os::find_bindir;
use server::{DATABASE, Layout, choose_port, create_database, initdb, prepare_log, running_port, start_server, stop_server, wait_ready, write_conf};

/// How many times a start is retried on another port when the remembered one was taken
/// between our check and the server's bind.
const START_ATTEMPTS: usize = 3;

/// Where the cluster lives and how it trades safety for speed.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The cluster lives in `data_dir/pg`, its log in `data_dir/pg.log`.
    pub data_dir: PathBuf,
    /// `false` turns off `fsync`, `synchronous_commit` and `full_page_writes`: fast, and fine
    /// for tests, but a crash of the machine may lose or corrupt data.
    pub durable: bool,
}

/// A running cluster.
#[derive(Debug)]
pub struct Cluster {
    /// `postgres://shopfloor:PASSWORD@127.0.0.1:PORT/shopfloor` (`SHOPFLOOR_DATA_DIR/pg.password`).
    pub url: String,
    /// Whether this call started the server (so the caller should stop it) or found it running.
    pub started_here: bool,
    /// The loopback port the server listens on.
    pub port: u16,
    layout: Layout,
    bindir: PathBuf,
    runner: Runner,
}

/// Starts the cluster in `opts.data_dir`, making it first if needed, or finds it running.
///
/// Either way the database `shopfloor` exists when this returns.
pub async fn ensure_running(opts: &ClusterOptions) -> Result<Cluster, ClusterError> {
    let owned = opts.clone();
    let cluster = tokio::task::spawn_blocking(move || ensure_running_blocking(&owned)).await.map_err(|e| ClusterError::Task(e.to_string()))??;
    if let Err(e) = create_database(&cluster.layout, cluster.port).await {
        if cluster.started_here {
            // The database error is the one worth reporting; a failed stop here would only
            // leave the server for the next start to reuse.
            let _ = cluster.stop();
        }
        return Err(e);
    }
    Ok(cluster)
}

/// Stops the cluster in `opts.data_dir` if one is running there; nothing to stop is fine.
pub fn stop_dir(opts: &ClusterOptions) -> Result<(), ClusterError> {
    let layout = Layout::new(&opts.data_dir)?;
    let Some(major) = layout.major_version() else {
        return Ok(());
    };
    if !layout.pgdata.join("postmaster.pid").exists() {
        return Ok(());
    }
    let Some(runner) = Runner::current(false)? else {
        // Root without a `postgres` user: no cluster of ours can be running.
        return Ok(());
    };
    let bindir = find_bindir(Some(&major))?;
    stop_server(&layout, &bindir, &runner)
}

impl Cluster {
    /// Stops the server (fast shutdown: open sessions are ended, committed data is kept).
    pub fn stop(&self) -> Result<(), ClusterError> {
        stop_server(&self.layout, &self.bindir, &self.runner)
    }

    /// The directory that holds the cluster's files.
    pub fn pgdata(&self) -> &Path {
        &self.layout.pgdata
    }
}

/// An exclusive `flock` on the cluster's lock file, released when dropped.
struct DirLock {
    _file: File,
}

impl DirLock {
    fn acquire(path: &Path) -> Result<DirLock, ClusterError> {
        let file = OpenOptions::new().create(true).truncate(false).write(true).open(path).map_err(|e| io_err("open", path, e))?;
        // SAFETY: the descriptor is open for as long as `file` lives; flock has no other
        // preconditions.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io_err("lock", path, std::io::Error::last_os_error()));
        }
        Ok(DirLock { _file: file })
    }
}

fn ensure_running_blocking(opts: &ClusterOptions) -> Result<Cluster, ClusterError> {
    let layout = Layout::new(&opts.data_dir)?;
    fs::create_dir_all(&layout.data_dir).map_err(|e| io_err("create", &layout.data_dir, e))?;
    let _lock = DirLock::acquire(&layout.lock_file)?;
    let Some(runner) = Runner::current(true)? else {
        return Err(ClusterError::NoOsUser("it does not exist".into()));
    };
    let major = layout.major_version();
    let bindir = find_bindir(major.as_deref())?;
    if matches!(runner, Runner::Postgres { .. }) {
        make_traversable(&layout.data_dir)?;
    }
    let cluster = |port, started_here| Cluster {
        url: layout.url(port, DATABASE),
        started_here,
        port,
        layout: layout.clone(),
        bindir: bindir.clone(),
        runner: runner.clone(),
    };

    if let Some(port) = running_port(&layout, &bindir, &runner) {
        wait_ready(&layout, &bindir, port)?;
        tracing::debug!(port, dir = %layout.pgdata.display(), "reusing the running embedded PostgreSQL");
        return Ok(cluster(port, false));
    }

    if major.is_none() {
        initdb(&layout, &bindir, &runner, opts.durable)?;
    } else {
        runner.own_tree(&layout.pgdata)?;
    }
    prepare_log(&layout, &runner)?;

    let mut last_error = String::new();
    for attempt in 0..START_ATTEMPTS {
        let port = choose_port(&layout, attempt > 0)?;
        write_conf(&layout, &bindir, &runner, port, opts.durable)?;
        match start_server(&layout, &bindir, &runner) {
            Ok(()) => {
                tracing::info!(port, dir = %layout.pgdata.display(), "started the embedded PostgreSQL");
                return Ok(cluster(port, true));
            }
            Err(tail) if tail.contains("Address already in use") => last_error = tail,
            Err(tail) => return Err(ClusterError::Start(tail)),
        }
    }
    Err(ClusterError::Start(last_error))
}

/// Makes `dir` and its ancestors searchable by others, so the `postgres` user can reach the
/// cluster inside it (a temporary directory, say, is made `0700`). Only the search bit is
/// added; nothing becomes readable.
fn make_traversable(dir: &Path) -> Result<(), ClusterError> {
    for d in dir.ancestors() {
        let meta = fs::metadata(d).map_err(|e| io_err("read", d, e))?;
        let mode = meta.permissions().mode();
        if mode & 0o001 == 0 {
            fs::set_permissions(d, fs::Permissions::from_mode(mode | 0o001)).map_err(|e| io_err("make searchable", d, e))?;
            tracing::info!(dir = %d.display(), "made searchable by others so the postgres user can reach the embedded cluster");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::error::tail;

    #[test]
    fn tail_keeps_the_last_non_empty_lines_on_one_line() {
        assert_eq!(tail("a\n\n b \nc\n\n", 2), "b | c");
        assert_eq!(tail("", 3), "");
        assert_eq!(tail("only", 3), "only");
    }
}
