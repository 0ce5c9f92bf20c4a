//! Child processes of the tests: `shopfloor` commands on a test database, a free loopback port
//! for one to listen on, and a handle that kills a child when the test ends, so a failed
//! assertion leaves nothing running.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::{shopfloor_bin, until_ok};

/// A loopback port nothing listens on now, for a process the test starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Runs `script` with `sh -c` in `dir`; a failure fails the test with the script's stderr.
pub fn sh(dir: &Path, script: &str) {
    let out = Command::new("sh").arg("-c").arg(script).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
}

/// `shopfloor <args>` on the database at `database_url` with the tests' secret key; its output
/// is discarded but for errors (a test sends either elsewhere by setting it again).
pub fn shopfloor(args: &[&str], database_url: &str) -> Command {
    let mut cmd = Command::new(shopfloor_bin());
    cmd.args(args).env("DATABASE_URL", database_url).env("SHOPFLOOR_SECRET_KEY", engine::testkit::SECRET_KEY).stdout(Stdio::null()).stderr(Stdio::inherit());
    cmd
}

/// A child process killed when dropped.
pub struct Proc(pub Child);

impl Proc {
    /// SIGKILL: no drain, no goodbye.
    pub fn sigkill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    /// Waits for the process to exit by itself (a crash hook). One still running after 120 s
    /// fails the test as hung, naming `what` it waited for.
    pub async fn until_exited(&mut self, what: &str) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
        while !matches!(self.0.try_wait(), Ok(Some(_))) {
            assert!(tokio::time::Instant::now() < deadline, "hung: {what} never ended the process");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, then wait: the process drains and flushes what it holds.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        // SAFETY: a signal to our own child, by its pid.
        unsafe {
            libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM);
        }
        self.0.wait().expect("wait for the child")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            self.sigkill();
        }
    }
}

/// A `shopfloor serve` or `api` on a port of its own, ready; killed when dropped.
pub struct Listening {
    pub proc: Proc,
    pub base: String,
}

/// Starts `cmd` (a `shopfloor serve` or `api`) listening on a free loopback port and waits until
/// it is ready.
pub async fn listen(mut cmd: Command) -> Listening {
    let port = free_port();
    let proc = Proc(cmd.env("SHOPFLOOR_LISTEN", format!("127.0.0.1:{port}")).spawn().expect("spawn shopfloor"));
    let base = format!("http://127.0.0.1:{port}");
    until_ok(&format!("{base}/readyz")).await;
    Listening { proc, base }
}
