//! One cluster directory's server: its layout (data, log, port file, lock), making it
//! (`initdb`), its settings, starting and stopping it, waiting until it answers, and the
//! `shopfloor` database in it.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::error::{ClusterError, combined, io_err, spawn_err, tail};
use super::os::{Runner, has_pg_stat_statements};

/// The database role the cluster is made for, and the database it serves.
pub(crate) const ROLE: &str = "shopfloor";
pub(crate) const DATABASE: &str = "shopfloor";
/// How long `pg_ctl` may wait for a start or a stop.
pub(crate) const PG_CTL_WAIT_SECS: &str = "120";

/// The files of one cluster, all absolute.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub data_dir: PathBuf,
    pub pgdata: PathBuf,
    pub log: PathBuf,
    pub port_file: PathBuf,
    pub lock_file: PathBuf,
    /// The role's password (mode 0600, the invoking user's): the cluster admits no one without
    /// it, as other users of the machine can reach its port.
    pub password_file: PathBuf,
}

impl Layout {
    pub(crate) fn new(data_dir: &Path) -> Result<Layout, ClusterError> {
        let data_dir = std::path::absolute(data_dir).map_err(|e| io_err("resolve", data_dir, e))?;
        Ok(Layout {
            pgdata: data_dir.join("pg"),
            log: data_dir.join("pg.log"),
            port_file: data_dir.join("pg.port"),
            lock_file: data_dir.join("pg.lock"),
            password_file: data_dir.join("pg.password"),
            data_dir,
        })
    }

    /// The major version in `PG_VERSION`, when the cluster has been made.
    pub(crate) fn major_version(&self) -> Option<String> {
        let text = fs::read_to_string(self.pgdata.join("PG_VERSION")).ok()?;
        let major = text.trim();
        (!major.is_empty()).then(|| major.to_owned())
    }

    /// The URL of `database`, with the role's password; a cluster made before clusters had one
    /// trusts local connections, and its URL has none.
    pub(crate) fn url(&self, port: u16, database: &str) -> String {
        match fs::read_to_string(&self.password_file).ok().map(|p| p.trim().to_owned()).filter(|p| !p.is_empty()) {
            Some(password) => format!("postgres://{ROLE}:{password}@127.0.0.1:{port}/{database}"),
            None => format!("postgres://{ROLE}@127.0.0.1:{port}/{database}"),
        }
    }
}

/// The port of a server already running in the cluster's directory.
pub(crate) fn running_port(layout: &Layout, bindir: &Path, runner: &Runner) -> Option<u16> {
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
pub(crate) fn wait_ready(layout: &Layout, bindir: &Path, port: u16) -> Result<(), ClusterError> {
    let not_answering = || ClusterError::NotAnswering { dir: layout.pgdata.display().to_string(), port, log: layout.log.display().to_string() };
    let isready = bindir.join("pg_isready");
    if !isready.is_file() {
        // Without pg_isready, trust that a TCP connection is accepted.
        return std::net::TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_secs(5)).map(|_| ()).map_err(|_| not_answering());
    }
    let status = Command::new(&isready)
        .args(["-q", "-h", "127.0.0.1", "-U", ROLE, "-d", "postgres", "-t", "30", "-p"])
        .arg(port.to_string())
        .stdin(Stdio::null())
        .status()
        .map_err(|e| spawn_err(&isready, e))?;
    if status.success() { Ok(()) } else { Err(not_answering()) }
}

pub(crate) fn initdb(layout: &Layout, bindir: &Path, runner: &Runner, durable: bool) -> Result<(), ClusterError> {
    let pgdata = &layout.pgdata;
    if pgdata.exists() {
        // No PG_VERSION: the leftovers of an interrupted initdb, which wants an empty directory.
        fs::remove_dir_all(pgdata).map_err(|e| io_err("remove", pgdata, e))?;
    }
    fs::create_dir(pgdata).map_err(|e| io_err("create", pgdata, e))?;
    fs::set_permissions(pgdata, fs::Permissions::from_mode(0o700)).map_err(|e| io_err("chmod", pgdata, e))?;
    runner.own(pgdata)?;

    // A password, never `trust`: the port is on loopback, which every user of the machine
    // reaches, and the role is a superuser. initdb reads it from a file of the server's user,
    // removed once read; ours is kept for the URLs.
    let password = data_encoding::BASE64URL_NOPAD.encode(&rand::random::<[u8; 24]>());
    write_private(&layout.password_file, &password)?;
    let pwfile = layout.data_dir.join("pg.initpw");
    write_private(&pwfile, &password)?;
    runner.own(&pwfile)?;
    let program = bindir.join("initdb");
    let mut cmd = runner.command(&program);
    cmd.arg("-D").arg(pgdata).arg(format!("--pwfile={}", pwfile.display()));
    cmd.args(["-U", ROLE, "-A", "scram-sha-256", "-E", "UTF8", "--locale=C"]);
    if !durable {
        cmd.arg("--no-sync");
    }
    let out = cmd.current_dir(&layout.data_dir).output();
    let _ = fs::remove_file(&pwfile);
    let out = out.map_err(|e| runner.spawn_err(&program, e))?;
    if !out.status.success() {
        return Err(ClusterError::Initdb(tail(&combined(&out), 5)));
    }

    // Our settings live in a file of their own, rewritten at each start; settings later in
    // postgresql.conf win, so the include goes last.
    let conf = pgdata.join("postgresql.conf");
    let mut file = OpenOptions::new().append(true).open(&conf).map_err(|e| io_err("open", &conf, e))?;
    file.write_all(b"\n# Settings of the shopfloor embedded cluster, rewritten at each start.\ninclude_if_exists = 'shopfloor.conf'\n")
        .map_err(|e| io_err("write", &conf, e))?;
    tracing::info!(dir = %pgdata.display(), "created the embedded PostgreSQL cluster");
    Ok(())
}

/// Writes `text` to a new file only its owner may read (replacing one left by an interrupted
/// initdb).
fn write_private(path: &Path, text: &str) -> Result<(), ClusterError> {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = fs::remove_file(path);
    let mut file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(|e| io_err("create", path, e))?;
    file.write_all(text.as_bytes()).and_then(|()| file.sync_all()).map_err(|e| io_err("write", path, e))
}

/// The log is written by the server, so it must belong to the user the server runs as.
pub(crate) fn prepare_log(layout: &Layout, runner: &Runner) -> Result<(), ClusterError> {
    OpenOptions::new().create(true).append(true).open(&layout.log).map_err(|e| io_err("create", &layout.log, e))?;
    runner.own(&layout.log)
}

/// The remembered port while it is free, else a fresh one, which is then remembered.
pub(crate) fn choose_port(layout: &Layout, fresh: bool) -> Result<u16, ClusterError> {
    let remembered = fs::read_to_string(&layout.port_file).ok().and_then(|s| s.trim().parse::<u16>().ok());
    if let Some(port) = remembered.filter(|&p| !fresh && p != 0) {
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(port);
        }
    }
    let port =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr()).map_err(|e| io_err("find a free port on", Path::new("127.0.0.1"), e))?.port();
    fs::write(&layout.port_file, format!("{port}\n")).map_err(|e| io_err("write", &layout.port_file, e))?;
    Ok(port)
}

pub(crate) fn write_conf(layout: &Layout, bindir: &Path, runner: &Runner, port: u16, durable: bool) -> Result<(), ClusterError> {
    // Without the library, pg_stat_statements is left out rather than failing the start.
    let preload = if has_pg_stat_statements(bindir) { "shared_preload_libraries = 'pg_stat_statements'\n" } else { "" };
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
pub(crate) fn start_server(layout: &Layout, bindir: &Path, runner: &Runner) -> Result<(), String> {
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
    let detail = if log_tail.is_empty() { tail(&combined(&out), 5) } else { log_tail };
    Err(format!("{detail} (log: {})", layout.log.display()))
}

pub(crate) fn stop_server(layout: &Layout, bindir: &Path, runner: &Runner) -> Result<(), ClusterError> {
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

pub(crate) async fn create_database(layout: &Layout, port: u16) -> Result<(), ClusterError> {
    use sqlx::Connection;
    let err = |e: sqlx::Error| ClusterError::CreateDb { port, cause: e.to_string() };
    let url = layout.url(port, "postgres");
    let mut conn = sqlx::PgConnection::connect(&url).await.map_err(err)?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)").bind(DATABASE).fetch_one(&mut conn).await.map_err(err)?;
    if !exists {
        match sqlx::query(&format!("CREATE DATABASE \"{DATABASE}\"")).execute(&mut conn).await {
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
pub(crate) fn read_from(path: &Path, offset: u64) -> String {
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
