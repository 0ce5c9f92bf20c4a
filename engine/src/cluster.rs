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
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// The database role the cluster is made for, and the database it serves.
const ROLE: &str = "shopfloor";
const DATABASE: &str = "shopfloor";
/// The OS user the cluster runs as when we are root.
const OS_USER: &str = "postgres";
/// How long `pg_ctl` may wait for a start or a stop.
const PG_CTL_WAIT_SECS: &str = "120";
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
    /// `postgres://shopfloor@127.0.0.1:PORT/shopfloor`.
    pub url: String,
    /// Whether this call started the server (so the caller should stop it) or found it running.
    pub started_here: bool,
    /// The loopback port the server listens on.
    pub port: u16,
    layout: Layout,
    bindir: PathBuf,
    runner: Runner,
}

/// Why the cluster could not be made, started or stopped; each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(
        "no PostgreSQL server binaries found (looked in {looked}); install them with `apt-get install postgresql`"
    )]
    NoBinaries { looked: String },
    #[error(
        "PostgreSQL refuses to run as root and the `postgres` OS user could not be created: {0}; create it with `useradd --system --user-group postgres`"
    )]
    NoOsUser(String),
    #[error("cannot run `{program}`: {cause}")]
    Spawn { program: String, cause: String },
    #[error("cannot {what} {path}: {cause}")]
    Io {
        what: &'static str,
        path: String,
        cause: String,
    },
    #[error("initdb failed: {0}")]
    Initdb(String),
    #[error("PostgreSQL did not start: {0}")]
    Start(String),
    #[error(
        "PostgreSQL is running in {dir} but does not answer on 127.0.0.1:{port}; see {log}, or stop it with `pg_ctl -D {dir} stop`"
    )]
    NotAnswering { dir: String, port: u16, log: String },
    #[error("PostgreSQL did not stop: {0}")]
    Stop(String),
    #[error("cannot create the database `shopfloor` on 127.0.0.1:{port}: {cause}")]
    CreateDb { port: u16, cause: String },
    #[error("the cluster task failed: {0}")]
    Task(String),
}

/// Starts the cluster in `opts.data_dir`, making it first if needed, or finds it running.
///
/// Either way the database `shopfloor` exists when this returns.
pub async fn ensure_running(opts: &ClusterOptions) -> Result<Cluster, ClusterError> {
    let owned = opts.clone();
    let cluster = tokio::task::spawn_blocking(move || ensure_running_blocking(&owned))
        .await
        .map_err(|e| ClusterError::Task(e.to_string()))??;
    if let Err(e) = create_database(cluster.port).await {
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

/// The files of one cluster, all absolute.
#[derive(Debug, Clone)]
struct Layout {
    data_dir: PathBuf,
    pgdata: PathBuf,
    log: PathBuf,
    port_file: PathBuf,
    lock_file: PathBuf,
}

impl Layout {
    fn new(data_dir: &Path) -> Result<Layout, ClusterError> {
        let data_dir = std::path::absolute(data_dir).map_err(|e| io_err("resolve", data_dir, e))?;
        Ok(Layout {
            pgdata: data_dir.join("pg"),
            log: data_dir.join("pg.log"),
            port_file: data_dir.join("pg.port"),
            lock_file: data_dir.join("pg.lock"),
            data_dir,
        })
    }

    /// The major version in `PG_VERSION`, when the cluster has been made.
    fn major_version(&self) -> Option<String> {
        let text = fs::read_to_string(self.pgdata.join("PG_VERSION")).ok()?;
        let major = text.trim();
        (!major.is_empty()).then(|| major.to_owned())
    }

    fn url(&self, port: u16, database: &str) -> String {
        format!("postgres://{ROLE}@127.0.0.1:{port}/{database}")
    }
}

/// Who runs the server binaries: ourselves, or the `postgres` user when we are root.
#[derive(Debug, Clone)]
enum Runner {
    Me,
    Postgres { uid: u32, gid: u32 },
}

impl Runner {
    /// The runner for the current user; as root, the `postgres` user, created when `create`
    /// is set (`None` when it does not exist and may not be created).
    fn current(create: bool) -> Result<Option<Runner>, ClusterError> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(Some(Runner::Me));
        }
        if let Some((uid, gid)) = lookup_user(OS_USER) {
            return Ok(Some(Runner::Postgres { uid, gid }));
        }
        if !create {
            return Ok(None);
        }
        create_os_user()?;
        match lookup_user(OS_USER) {
            Some((uid, gid)) => Ok(Some(Runner::Postgres { uid, gid })),
            None => Err(ClusterError::NoOsUser(
                "useradd succeeded but the user is not found".into(),
            )),
        }
    }

    /// A command that runs `program` as this runner.
    fn command(&self, program: &Path) -> Command {
        let mut cmd = match self {
            Runner::Me => Command::new(program),
            Runner::Postgres { .. } => {
                let mut cmd = Command::new("runuser");
                cmd.args(["-u", OS_USER, "--"]).arg(program);
                cmd
            }
        };
        cmd.stdin(Stdio::null());
        cmd
    }

    /// The error of a command made by [`Runner::command`] that could not be started.
    fn spawn_err(&self, program: &Path, e: std::io::Error) -> ClusterError {
        match self {
            Runner::Me => spawn_err(program, e),
            Runner::Postgres { .. } => ClusterError::Spawn {
                program: format!("runuser -u {OS_USER} -- {}", program.display()),
                cause: if e.kind() == std::io::ErrorKind::NotFound {
                    "runuser not found; install util-linux".into()
                } else {
                    e.to_string()
                },
            },
        }
    }

    /// Gives `path` to the runner (a no-op when we run the server ourselves).
    fn own(&self, path: &Path) -> Result<(), ClusterError> {
        if let Runner::Postgres { uid, gid } = *self {
            std::os::unix::fs::lchown(path, Some(uid), Some(gid))
                .map_err(|e| io_err("chown", path, e))?;
        }
        Ok(())
    }

    /// Gives `dir` and everything under it to the runner, unless `dir` is already its (a
    /// cluster made by another user, then started as root).
    fn own_tree(&self, dir: &Path) -> Result<(), ClusterError> {
        let Runner::Postgres { uid, .. } = *self else {
            return Ok(());
        };
        let meta = fs::symlink_metadata(dir).map_err(|e| io_err("read", dir, e))?;
        if meta.uid() == uid {
            return Ok(());
        }
        self.own_all(dir)
    }

    fn own_all(&self, path: &Path) -> Result<(), ClusterError> {
        self.own(path)?;
        if fs::symlink_metadata(path)
            .map_err(|e| io_err("read", path, e))?
            .is_dir()
        {
            for entry in fs::read_dir(path).map_err(|e| io_err("read", path, e))? {
                self.own_all(&entry.map_err(|e| io_err("read", path, e))?.path())?;
            }
        }
        Ok(())
    }
}

/// The uid and gid of an OS user, through NSS.
fn lookup_user(name: &str) -> Option<(u32, u32)> {
    let out = Command::new("getent")
        .args(["passwd", name])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let mut fields = line.trim().split(':').skip(2);
    let uid = fields.next()?.parse().ok()?;
    let gid = fields.next()?.parse().ok()?;
    Some((uid, gid))
}

fn create_os_user() -> Result<(), ClusterError> {
    let group_exists = Command::new("getent")
        .args(["group", OS_USER])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let mut cmd = Command::new("useradd");
    cmd.args([
        "--system",
        "--home-dir",
        "/var/lib/postgresql",
        "--no-create-home",
    ]);
    cmd.args([
        "--shell",
        "/bin/bash",
        "--comment",
        "PostgreSQL administrator",
    ]);
    if group_exists {
        cmd.args(["--gid", OS_USER]);
    } else {
        cmd.arg("--user-group");
    }
    cmd.arg(OS_USER).stdin(Stdio::null());
    let out = cmd
        .output()
        .map_err(|e| ClusterError::NoOsUser(format!("cannot run useradd: {e}")))?;
    if !out.status.success() {
        return Err(ClusterError::NoOsUser(tail(&combined(&out), 3)));
    }
    tracing::info!(
        user = OS_USER,
        "created the OS user the embedded PostgreSQL runs as"
    );
    Ok(())
}

/// Finds a directory holding `pg_ctl`, `initdb` and `postgres`: the one of the cluster's own
/// major version when it exists, then `pg_config --bindir`, then the highest
/// `/usr/lib/postgresql/<version>/bin`, then `PATH`.
fn find_bindir(major: Option<&str>) -> Result<PathBuf, ClusterError> {
    let mut candidates = Vec::new();
    if let Some(major) = major {
        candidates.push(PathBuf::from(format!("/usr/lib/postgresql/{major}/bin")));
    }
    if let Some(dir) = command_line(Command::new("pg_config").arg("--bindir")) {
        candidates.push(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .collect();
    versions.sort_by_key(|(version, _)| std::cmp::Reverse(*version));
    candidates.extend(versions.into_iter().map(|(_, dir)| dir));
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    candidates
        .into_iter()
        .find(|dir| {
            ["pg_ctl", "initdb", "postgres"]
                .iter()
                .all(|b| dir.join(b).is_file())
        })
        .ok_or_else(|| ClusterError::NoBinaries {
            looked: "`pg_config --bindir`, /usr/lib/postgresql/*/bin and PATH".into(),
        })
}

/// The directory of loadable modules for the server binaries in `bindir`.
fn pkglibdir(bindir: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = command_line(Command::new(bindir.join("pg_config")).arg("--pkglibdir")) {
        dirs.push(PathBuf::from(dir));
    }
    if let Some(prefix) = bindir.parent() {
        dirs.push(prefix.join("lib"));
        dirs.push(prefix.join("lib").join("postgresql"));
    }
    dirs
}

fn has_pg_stat_statements(bindir: &Path) -> bool {
    pkglibdir(bindir).iter().any(|dir| {
        ["pg_stat_statements.so", "pg_stat_statements.dylib"]
            .iter()
            .any(|f| dir.join(f).is_file())
    })
}

/// An exclusive `flock` on the cluster's lock file, released when dropped.
struct DirLock {
    _file: File,
}

impl DirLock {
    fn acquire(path: &Path) -> Result<DirLock, ClusterError> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| io_err("open", path, e))?;
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
            fs::set_permissions(d, fs::Permissions::from_mode(mode | 0o001))
                .map_err(|e| io_err("make searchable", d, e))?;
            tracing::info!(dir = %d.display(), "made searchable by others so the postgres user can reach the embedded cluster");
        }
    }
    Ok(())
}

/// The port of a server already running in the cluster's directory.
fn running_port(layout: &Layout, bindir: &Path, runner: &Runner) -> Option<u16> {
    let pid_file = fs::read_to_string(layout.pgdata.join("postmaster.pid")).ok()?;
    let status = runner
        .command(&bindir.join("pg_ctl"))
        .arg("status")
        .arg("-D")
        .arg(&layout.pgdata)
        .current_dir(&layout.data_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()?;
    if !status.success() {
        return None; // a stale pid file; the server removes it when it starts
    }
    // Line 4 of postmaster.pid is the port.
    pid_file.lines().nth(3)?.trim().parse().ok()
}

/// Waits until a running server accepts connections on `port`.
fn wait_ready(layout: &Layout, bindir: &Path, port: u16) -> Result<(), ClusterError> {
    let not_answering = || ClusterError::NotAnswering {
        dir: layout.pgdata.display().to_string(),
        port,
        log: layout.log.display().to_string(),
    };
    let isready = bindir.join("pg_isready");
    if !isready.is_file() {
        // Without pg_isready, trust that a TCP connection is accepted.
        return std::net::TcpStream::connect_timeout(
            &(Ipv4Addr::LOCALHOST, port).into(),
            Duration::from_secs(5),
        )
        .map(|_| ())
        .map_err(|_| not_answering());
    }
    let status = Command::new(&isready)
        .args([
            "-q",
            "-h",
            "127.0.0.1",
            "-U",
            ROLE,
            "-d",
            "postgres",
            "-t",
            "30",
            "-p",
        ])
        .arg(port.to_string())
        .stdin(Stdio::null())
        .status()
        .map_err(|e| spawn_err(&isready, e))?;
    if status.success() {
        Ok(())
    } else {
        Err(not_answering())
    }
}

fn initdb(
    layout: &Layout,
    bindir: &Path,
    runner: &Runner,
    durable: bool,
) -> Result<(), ClusterError> {
    let pgdata = &layout.pgdata;
    if pgdata.exists() {
        // No PG_VERSION: the leftovers of an interrupted initdb, which wants an empty directory.
        fs::remove_dir_all(pgdata).map_err(|e| io_err("remove", pgdata, e))?;
    }
    fs::create_dir(pgdata).map_err(|e| io_err("create", pgdata, e))?;
    fs::set_permissions(pgdata, fs::Permissions::from_mode(0o700))
        .map_err(|e| io_err("chmod", pgdata, e))?;
    runner.own(pgdata)?;

    let program = bindir.join("initdb");
    let mut cmd = runner.command(&program);
    cmd.arg("-D").arg(pgdata);
    cmd.args(["-U", ROLE, "-A", "trust", "-E", "UTF8", "--locale=C"]);
    if !durable {
        cmd.arg("--no-sync");
    }
    let out = cmd
        .current_dir(&layout.data_dir)
        .output()
        .map_err(|e| runner.spawn_err(&program, e))?;
    if !out.status.success() {
        return Err(ClusterError::Initdb(tail(&combined(&out), 5)));
    }

    // Our settings live in a file of their own, rewritten at each start; settings later in
    // postgresql.conf win, so the include goes last.
    let conf = pgdata.join("postgresql.conf");
    let mut file = OpenOptions::new()
        .append(true)
        .open(&conf)
        .map_err(|e| io_err("open", &conf, e))?;
    file.write_all(b"\n# Settings of the shopfloor embedded cluster, rewritten at each start.\ninclude_if_exists = 'shopfloor.conf'\n")
        .map_err(|e| io_err("write", &conf, e))?;
    tracing::info!(dir = %pgdata.display(), "created the embedded PostgreSQL cluster");
    Ok(())
}

/// The log is written by the server, so it must belong to the user the server runs as.
fn prepare_log(layout: &Layout, runner: &Runner) -> Result<(), ClusterError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(&layout.log)
        .map_err(|e| io_err("create", &layout.log, e))?;
    runner.own(&layout.log)
}

/// The remembered port while it is free, else a fresh one, which is then remembered.
fn choose_port(layout: &Layout, fresh: bool) -> Result<u16, ClusterError> {
    let remembered = fs::read_to_string(&layout.port_file)
        .ok()
        .and_then(|s| s.trim().parse::<u16>().ok());
    if let Some(port) = remembered.filter(|&p| !fresh && p != 0) {
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(port);
        }
    }
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map_err(|e| io_err("find a free port on", Path::new("127.0.0.1"), e))?
        .port();
    fs::write(&layout.port_file, format!("{port}\n"))
        .map_err(|e| io_err("write", &layout.port_file, e))?;
    Ok(port)
}

fn write_conf(
    layout: &Layout,
    bindir: &Path,
    runner: &Runner,
    port: u16,
    durable: bool,
) -> Result<(), ClusterError> {
    // Without the library, pg_stat_statements is left out rather than failing the start.
    let preload = if has_pg_stat_statements(bindir) {
        "shared_preload_libraries = 'pg_stat_statements'\n"
    } else {
        ""
    };
    let switch = if durable { "on" } else { "off" };
    let conf = format!(
        "# Written by shopfloor before each start of the embedded cluster; edits are overwritten.\n\
         port = {port}\n\
         listen_addresses = '127.0.0.1'\n\
         unix_socket_directories = ''\n\
         max_connections = 200\n\
         {preload}\
         fsync = {switch}\n\
         synchronous_commit = {switch}\n\
         full_page_writes = {switch}\n"
    );
    let path = layout.pgdata.join("shopfloor.conf");
    fs::write(&path, conf).map_err(|e| io_err("write", &path, e))?;
    runner.own(&path)
}

/// Starts the server and waits until it accepts connections; on failure, the new lines of its
/// log (or pg_ctl's own output when the log says nothing).
fn start_server(layout: &Layout, bindir: &Path, runner: &Runner) -> Result<(), String> {
    let log_start = fs::metadata(&layout.log).map_or(0, |m| m.len());
    let program = bindir.join("pg_ctl");
    let out = runner
        .command(&program)
        .arg("-D")
        .arg(&layout.pgdata)
        .arg("-l")
        .arg(&layout.log)
        .args(["-w", "-t", PG_CTL_WAIT_SECS, "start"])
        .current_dir(&layout.data_dir)
        .output()
        .map_err(|e| runner.spawn_err(&program, e).to_string())?;
    if out.status.success() {
        return Ok(());
    }
    let log_tail = tail(&read_from(&layout.log, log_start), 5);
    let detail = if log_tail.is_empty() {
        tail(&combined(&out), 5)
    } else {
        log_tail
    };
    Err(format!("{detail} (log: {})", layout.log.display()))
}

fn stop_server(layout: &Layout, bindir: &Path, runner: &Runner) -> Result<(), ClusterError> {
    let program = bindir.join("pg_ctl");
    let out = runner
        .command(&program)
        .arg("-D")
        .arg(&layout.pgdata)
        .args(["-m", "fast", "-w", "-t", PG_CTL_WAIT_SECS, "stop"])
        .current_dir(&layout.data_dir)
        .output()
        .map_err(|e| runner.spawn_err(&program, e))?;
    if out.status.success() || running_port(layout, bindir, runner).is_none() {
        return Ok(());
    }
    Err(ClusterError::Stop(tail(&combined(&out), 5)))
}

async fn create_database(port: u16) -> Result<(), ClusterError> {
    use sqlx::Connection;
    let err = |e: sqlx::Error| ClusterError::CreateDb {
        port,
        cause: e.to_string(),
    };
    let url = format!("postgres://{ROLE}@127.0.0.1:{port}/postgres");
    let mut conn = sqlx::PgConnection::connect(&url).await.map_err(err)?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(DATABASE)
            .fetch_one(&mut conn)
            .await
            .map_err(err)?;
    if !exists {
        match sqlx::query(&format!("CREATE DATABASE \"{DATABASE}\""))
            .execute(&mut conn)
            .await
        {
            Ok(_) => {}
            // Another process created it between our check and our create.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => {}
            Err(e) => return Err(err(e)),
        }
    }
    // Closing politely only saves the server a log line; the work is done either way.
    let _ = conn.close().await;
    Ok(())
}

/// The text of `path` from byte `offset` on (empty when unreadable).
fn read_from(path: &Path, offset: u64) -> String {
    let mut bytes = Vec::new();
    let read = File::open(path).and_then(|mut file| {
        file.seek(SeekFrom::Start(offset))?;
        file.read_to_end(&mut bytes)
    });
    if read.is_err() {
        bytes.clear();
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The first line of a command's output, when it runs and succeeds.
fn command_line(cmd: &mut Command) -> Option<String> {
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next()?.trim();
    (out.status.success() && !line.is_empty()).then(|| line.to_owned())
}

fn combined(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The last `n` non-empty lines of `text`, on one line.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

fn io_err(what: &'static str, path: &Path, e: std::io::Error) -> ClusterError {
    ClusterError::Io {
        what,
        path: path.display().to_string(),
        cause: e.to_string(),
    }
}

fn spawn_err(program: &Path, e: std::io::Error) -> ClusterError {
    ClusterError::Spawn {
        program: program.display().to_string(),
        cause: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::tail;

    #[test]
    fn tail_keeps_the_last_non_empty_lines_on_one_line() {
        assert_eq!(tail("a\n\n b \nc\n\n", 2), "b | c");
        assert_eq!(tail("", 3), "");
        assert_eq!(tail("only", 3), "only");
    }
}
