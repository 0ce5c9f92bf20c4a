//! The machine under the cluster: its PostgreSQL server binaries, and the OS user the server
//! runs as when we are root (`postgres`, created if missing, through `runuser`).

use std::fs::{self};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::error::{ClusterError, combined, io_err, spawn_err, tail};

/// The OS user the cluster runs as when we are root.
pub(crate) const OS_USER: &str = "postgres";

/// Who runs the server binaries: ourselves, or the `postgres` user when we are root.
#[derive(Debug, Clone)]
pub(crate) enum Runner {
    Me,
    Postgres { uid: u32, gid: u32 },
}

impl Runner {
    /// The runner for the current user; as root, the `postgres` user, created when `create`
    /// is set (`None` when it does not exist and may not be created).
    pub(crate) fn current(create: bool) -> Result<Option<Runner>, ClusterError> {
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
            None => Err(ClusterError::NoOsUser("useradd succeeded but the user is not found".into())),
        }
    }

    /// A command that runs `program` as this runner.
    pub(crate) fn command(&self, program: &Path) -> Command {
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
    pub(crate) fn spawn_err(&self, program: &Path, e: std::io::Error) -> ClusterError {
        match self {
            Runner::Me => spawn_err(program, e),
            Runner::Postgres { .. } => ClusterError::Spawn {
                program: format!("runuser -u {OS_USER} -- {}", program.display()),
                cause: if e.kind() == std::io::ErrorKind::NotFound { "runuser not found; install util-linux".into() } else { e.to_string() },
            },
        }
    }

    /// Gives `path` to the runner (a no-op when we run the server ourselves).
    pub(crate) fn own(&self, path: &Path) -> Result<(), ClusterError> {
        if let Runner::Postgres { uid, gid } = *self {
            std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(|e| io_err("chown", path, e))?;
        }
        Ok(())
    }

    /// Gives `dir` and everything under it to the runner, unless `dir` is already its (a
    /// cluster made by another user, then started as root).
    pub(crate) fn own_tree(&self, dir: &Path) -> Result<(), ClusterError> {
        let Runner::Postgres { uid, .. } = *self else {
            return Ok(());
        };
        let meta = fs::symlink_metadata(dir).map_err(|e| io_err("read", dir, e))?;
        if meta.uid() == uid {
            return Ok(());
        }
        self.own_all(dir)
    }

    pub(crate) fn own_all(&self, path: &Path) -> Result<(), ClusterError> {
        self.own(path)?;
        if fs::symlink_metadata(path).map_err(|e| io_err("read", path, e))?.is_dir() {
            for entry in fs::read_dir(path).map_err(|e| io_err("read", path, e))? {
                self.own_all(&entry.map_err(|e| io_err("read", path, e))?.path())?;
            }
        }
        Ok(())
    }
}

/// The uid and gid of an OS user, through NSS.
pub(crate) fn lookup_user(name: &str) -> Option<(u32, u32)> {
    let out = Command::new("getent").args(["passwd", name]).stdin(Stdio::null()).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let mut fields = line.trim().split(':').skip(2);
    let uid = fields.next()?.parse().ok()?;
    let gid = fields.next()?.parse().ok()?;
    Some((uid, gid))
}

pub(crate) fn create_os_user() -> Result<(), ClusterError> {
    let group_exists = Command::new("getent").args(["group", OS_USER]).stdin(Stdio::null()).stdout(Stdio::null()).status().is_ok_and(|s| s.success());
    let mut cmd = Command::new("useradd");
    cmd.args(["--system", "--home-dir", "/var/lib/postgresql", "--no-create-home"]);
    cmd.args(["--shell", "/bin/bash", "--comment", "PostgreSQL administrator"]);
    if group_exists {
        cmd.args(["--gid", OS_USER]);
    } else {
        cmd.arg("--user-group");
    }
    cmd.arg(OS_USER).stdin(Stdio::null());
    let out = cmd.output().map_err(|e| ClusterError::NoOsUser(format!("cannot run useradd: {e}")))?;
    if !out.status.success() {
        return Err(ClusterError::NoOsUser(tail(&combined(&out), 3)));
    }
    tracing::info!(user = OS_USER, "created the OS user the embedded PostgreSQL runs as");
    Ok(())
}

/// Finds a directory holding `pg_ctl`, `initdb` and `postgres`: the one of the cluster's own
/// major version when it exists, then `pg_config --bindir`, then the highest
/// `/usr/lib/postgresql/<version>/bin`, then `PATH`.
pub(crate) fn find_bindir(major: Option<&str>) -> Result<PathBuf, ClusterError> {
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
        .find(|dir| ["pg_ctl", "initdb", "postgres"].iter().all(|b| dir.join(b).is_file()))
        .ok_or_else(|| ClusterError::NoBinaries { looked: "`pg_config --bindir`, /usr/lib/postgresql/*/bin and PATH".into() })
}

/// The directory of loadable modules for the server binaries in `bindir`.
pub(crate) fn pkglibdir(bindir: &Path) -> Vec<PathBuf> {
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

pub(crate) fn has_pg_stat_statements(bindir: &Path) -> bool {
    pkglibdir(bindir).iter().any(|dir| ["pg_stat_statements.so", "pg_stat_statements.dylib"].iter().any(|f| dir.join(f).is_file()))
}

/// The first line of a command's output, when it runs and succeeds.
pub(crate) fn command_line(cmd: &mut Command) -> Option<String> {
    let out = cmd.stdin(Stdio::null()).stderr(Stdio::null()).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next()?.trim();
    (out.status.success() && !line.is_empty()).then(|| line.to_owned())
}
