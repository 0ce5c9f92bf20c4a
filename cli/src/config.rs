//! The client's config file and how settings are resolved.
//!
//! `shopfloor login` writes `config.json` in the user's config directory
//! (`$SHOPFLOOR_CONFIG` if set, else `$XDG_CONFIG_HOME/shopfloor/config.json`, else
//! `~/.config/shopfloor/config.json`): the server, the token, the current org and project. The
//! file holds a secret, so it is created with mode 0600 in a directory of mode 0700, and
//! replaced by a rename so that it is never seen half-written.
//!
//! A setting comes from, first to last: a flag, its environment variable (`SHOPFLOOR_SERVER`,
//! `SHOPFLOOR_TOKEN`, `SHOPFLOOR_ORG`, `SHOPFLOOR_PROJECT`), then the file. The token has no
//! flag: a token in `argv` is visible to every user of the machine.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Conn;
use super::error::ClientError;

/// What the file holds.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub(crate) struct FileConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub org: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
}

/// Where a setting came from, for `shopfloor context`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// A flag or its environment variable (clap does not tell them apart).
    Flag,
    Env,
    File,
    Unset,
}

impl Source {
    pub(crate) fn words(self, env: &str) -> String {
        match self {
            Source::Flag => format!("flag or {env}"),
            Source::Env => env.to_owned(),
            Source::File => "config file".to_owned(),
            Source::Unset => "unset".to_owned(),
        }
    }
}

/// The settings a command runs with.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub server: Option<String>,
    pub token: Option<String>,
    pub org: Option<String>,
    pub project: Option<String>,
    pub sources: [Source; 4],
}

/// The config file's path.
pub(crate) fn path() -> Result<PathBuf, ClientError> {
    if let Some(p) = non_empty_env("SHOPFLOOR_CONFIG") {
        return Ok(PathBuf::from(p));
    }
    if let Some(dir) = non_empty_env("XDG_CONFIG_HOME") {
        return Ok(Path::new(&dir).join("shopfloor").join("config.json"));
    }
    if let Some(home) = non_empty_env("HOME") {
        return Ok(Path::new(&home).join(".config").join("shopfloor").join("config.json"));
    }
    Err(ClientError::Usage("cannot tell where your config directory is: set HOME, XDG_CONFIG_HOME or SHOPFLOOR_CONFIG".into()))
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Reads the file; a missing file is an empty config.
pub(crate) fn load() -> Result<FileConfig, ClientError> {
    let path = path()?;
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Failed(format!("{} is not a shopfloor config file ({e}); run `shopfloor login` again", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(FileConfig::default()),
        Err(e) => Err(ClientError::Failed(format!("cannot read {}: {e}", path.display()))),
    }
}

/// Writes the file with mode 0600 (its directory 0700), replacing it whole.
pub(crate) fn save(config: &FileConfig) -> Result<PathBuf, ClientError> {
    let path = path()?;
    let fail = |what: &str, e: std::io::Error| ClientError::Failed(format!("cannot {what} {}: {e}", path.display()));
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| fail("create the directory of", e))?;
    }
    let text = serde_json::to_vec_pretty(config).map_err(ClientError::failed)?;
    let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        // A file left by an older client may have wider bits: the mode is set, not assumed.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.write_all(&text)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail("write", e));
    }
    Ok(path)
}

/// The settings of a command: flags (with their variables) over the file.
pub(crate) fn settings(conn: &Conn) -> Result<Settings, ClientError> {
    let file = load()?;
    let token_env = non_empty_env("SHOPFLOOR_TOKEN");
    let pick = |flag: &Option<String>, file: &Option<String>| match (flag.as_ref().filter(|v| !v.trim().is_empty()), file) {
        (Some(v), _) => (Some(v.trim().to_owned()), Source::Flag),
        (None, Some(v)) => (Some(v.clone()), Source::File),
        (None, None) => (None, Source::Unset),
    };
    let (server, s0) = pick(&conn.server, &file.server);
    let (token, s1) = match token_env {
        Some(t) => (Some(t.trim().to_owned()), Source::Env),
        None => (file.token.clone(), if file.token.is_some() { Source::File } else { Source::Unset }),
    };
    let (org, s2) = pick(&conn.org, &file.org);
    let (project, s3) = pick(&conn.project, &file.project);
    Ok(Settings { server, token, org, project, sources: [s0, s1, s2, s3] })
}
