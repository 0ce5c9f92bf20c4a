//! A real PgBouncer in transaction mode in front of the test server, for the tests that run
//! shopfloor behind one: a process of the test's own on a free loopback port, with its ini and
//! auth file in a temporary directory, stopped when dropped. `make test` installs PgBouncer
//! (`scripts/test.sh`); without it, [`PgBouncer::start`] panics saying how to install it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::free_port;

/// A running PgBouncer, killed when dropped.
pub struct PgBouncer {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: tempfile::TempDir,
    /// The server behind it.
    server: url::Url,
}

/// Where the `pgbouncer` binary is: on `PATH`, or where Debian and Homebrew put it.
fn binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path).chain(["/usr/sbin", "/usr/local/sbin", "/usr/local/bin", "/opt/homebrew/bin"].map(PathBuf::from));
    for dir in dirs {
        let bin = dir.join("pgbouncer");
        if bin.is_file() {
            return bin;
        }
    }
    panic!("pgbouncer is not installed: `make test` installs it (apt-get install pgbouncer); or install it yourself, then run the test again")
}

impl PgBouncer {
    /// PgBouncer in transaction mode with at most `pool_size` server connections per database
    /// and user, in front of the server that `url` (a test database's) names; clients connect
    /// without a password (`auth_type = trust`) and it logs in to the server as they asked,
    /// with the password `url` carries. No `ignore_startup_parameters`: shopfloor's pooler
    /// route sends none that PgBouncer refuses, and this shows it.
    pub async fn start(url: &str, pool_size: u32) -> PgBouncer {
        PgBouncer::start_in(url, pool_size, "transaction").await
    }

    /// The same in another `pool_mode` (`session`, `statement`).
    pub async fn start_in(url: &str, pool_size: u32, pool_mode: &str) -> PgBouncer {
        let server = url::Url::parse(url).unwrap_or_else(|e| panic!("the test database URL does not parse: {e}"));
        let user = match server.username() {
            "" => "postgres".to_owned(),
            u => u.to_owned(),
        };
        let password = server.password().unwrap_or("").to_owned();
        let host = server.host_str().unwrap_or("127.0.0.1").to_owned();
        let server_port = server.port().unwrap_or(5432);
        let port = free_port();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let ini = format!(
            "[databases]\n* = host={host} port={server_port}\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {auth}\npool_mode = {pool_mode}\ndefault_pool_size = {pool_size}\nmin_pool_size = 0\n\
             max_client_conn = 1000\nmax_db_connections = 0\nserver_lifetime = 3600\nlog_connections = 0\nlog_disconnections = 0\n",
            auth = dir.path().join("userlist.txt").display(),
        );
        std::fs::write(dir.path().join("pgbouncer.ini"), ini).unwrap();
        std::fs::write(dir.path().join("userlist.txt"), format!("\"{user}\" \"{password}\"\n")).unwrap();
        let child = spawn(dir.path());
        let mut bouncer = PgBouncer { child, port, dir, server };
        bouncer.until_ready().await;
        bouncer
    }

    /// Kills PgBouncer (SIGKILL: every client connection is reset, no transaction finishes)
    /// and starts it again on the same port, as a restarted pooler pod comes back.
    pub async fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn(self.dir.path());
        self.until_ready().await;
    }

    /// `url` (the test database's) with PgBouncer's address instead of the server's.
    pub fn url(&self, url: &str) -> String {
        let mut through = url::Url::parse(url).unwrap();
        through.set_host(Some("127.0.0.1")).unwrap();
        through.set_port(Some(self.port)).unwrap();
        let _ = through.set_password(None);
        through.to_string()
    }

    /// What PgBouncer logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }

    async fn until_ready(&mut self) {
        let url = self.url(self.server.as_str());
        let ready = async {
            loop {
                if let Ok(Some(status)) = self.child.try_wait() {
                    return Err(format!("pgbouncer exited ({status})"));
                }
                if reachable(&url).await {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        match tokio::time::timeout(Duration::from_secs(60), ready).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("{e}; its log:\n{}", self.log()),
            Err(_) => panic!("pgbouncer never served {}; its log:\n{}", self.port, self.log()),
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `pgbouncer` on the ini and auth file in `dir`, logging to `pgbouncer.log` there.
fn spawn(dir: &std::path::Path) -> Child {
    // Appended to, so that a restart keeps what the killed one logged.
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("pgbouncer.log")).unwrap();
    let mut cmd = Command::new(binary());
    // PgBouncer refuses to run as root; it switches to the `postgres` user (which owns the
    // test cluster then), and must still read its files.
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        cmd.args(["-u", "postgres"]);
    }
    cmd.arg(dir.join("pgbouncer.ini"))
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start pgbouncer: {e}"))
}

/// Whether a connection through `url` answers a statement (the simple protocol, and no startup
/// parameter PgBouncer refuses).
async fn reachable(url: &str) -> bool {
    use sqlx::ConnectOptions as _;
    let Ok(options) = url.parse::<sqlx::postgres::PgConnectOptions>() else { return false };
    match options.extra_float_digits(None).connect().await {
        Ok(mut conn) => sqlx::Executor::execute(&mut conn, "SELECT 1").await.is_ok(),
        Err(_) => false,
    }
}
