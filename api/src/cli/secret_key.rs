//! Where the secret key that seals the JWT signing keys and the webhook secrets comes from, and
//! what `serve`, `api` and `engine` do with it at start.
//!
//! `SHOPFLOOR_SECRET_KEY`: 32 random bytes in base64 (`openssl rand -base64 32`), the same on
//! every process of one database. Unset, it is needed all the same by a process on a
//! `DATABASE_URL` (`serve`, `api`, `engine`, the `admin` commands that issue tokens or change
//! keys), which refuses to start and says how to make one: a key made up by one replica would
//! not open what another sealed. Only with the embedded cluster (no `DATABASE_URL`) is there
//! one obvious place for it: `SHOPFLOOR_DATA_DIR/secret-key`, made (mode 0600) on first need
//! and read after, so `make run` works with no settings. The key is never printed or logged.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use engine::db::Db;
use engine::sealing::SecretKey;
use engine::store::{Actor, Change, signing_keys, webhooks_out};
use secrecy::ExposeSecret;

use super::args::{DbArgs, SecretKeyArgs};
use super::error::CliError;

/// What to write in SHOPFLOOR_SECRET_KEY, said by every error about it.
const HOW: &str =
    "set SHOPFLOOR_SECRET_KEY to 32 random bytes in base64, e.g. the output of `openssl rand -base64 32`, the same on every process of this database";

impl SecretKeyArgs {
    /// The key given by the flag or the variable, if one is.
    pub(super) fn given(&self) -> Result<Option<SecretKey>, CliError> {
        let Some(text) = &self.secret_key else { return Ok(None) };
        SecretKey::parse(text.expose_secret()).map(Some).map_err(|e| CliError::Failed(format!("SHOPFLOOR_SECRET_KEY {e}; {HOW}")))
    }

    /// The key, given or (with the embedded cluster) from its file; `None` when neither.
    pub(super) fn find(&self, db: &DbArgs) -> Result<Option<SecretKey>, CliError> {
        if let Some(key) = self.given()? {
            return Ok(Some(key));
        }
        if db.database_url.as_deref().is_some_and(|u| !u.trim().is_empty()) {
            return Ok(None);
        }
        embedded_key(&db.data_dir.join("secret-key")).map(Some)
    }

    /// The key; a process that needs one and has none refuses to start.
    pub(super) fn require(&self, db: &DbArgs) -> Result<SecretKey, CliError> {
        self.find(db)?.ok_or_else(|| CliError::Failed(format!("SHOPFLOOR_SECRET_KEY is not set; {HOW}")))
    }
}

/// Reads the embedded cluster's key file, making it first if there is none. The file is made
/// whole under another name and linked into place, so a process starting beside this one
/// reads either no file or the whole key, and two that make one at once agree on the first.
fn embedded_key(path: &Path) -> Result<SecretKey, CliError> {
    let broken = |e: &dyn std::fmt::Display| {
        CliError::Failed(format!(
            "{} is not a secret key ({e}); restore it, or set SHOPFLOOR_SECRET_KEY to the key that sealed this cluster's signing keys",
            path.display()
        ))
    };
    match std::fs::read_to_string(path) {
        Ok(text) => return SecretKey::parse(&text).map_err(|e| broken(&e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(CliError::Failed(format!("cannot read {}: {e}", path.display()))),
    }
    let cannot = |e: std::io::Error| CliError::Failed(format!("cannot write {}: {e}; check that SHOPFLOOR_DATA_DIR is writable", path.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(cannot)?;
    }
    let key = SecretKey::generate();
    let draft = PathBuf::from(format!("{}.{}.new", path.display(), std::process::id()));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&draft)?;
        file.write_all(key.to_base64().expose_secret().as_bytes())?;
        file.write_all(b"\n")?;
        file.sync_all()?;
        std::fs::hard_link(&draft, path)
    })();
    let _ = std::fs::remove_file(&draft);
    match written {
        Ok(()) => {
            tracing::info!(path = %path.display(), "made the embedded cluster's secret key (SHOPFLOOR_SECRET_KEY was not set)");
            Ok(key)
        }
        // Another process made it meanwhile: use that one.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let text = std::fs::read_to_string(path).map_err(cannot)?;
            SecretKey::parse(&text).map_err(|e| broken(&e))
        }
        Err(e) => Err(cannot(e)),
    }
}

/// What `serve`, `api`, `engine` and `migrate` do with the key at start: refuse a key that does
/// not open the sealed signing keys and webhook secrets (one line, before anything serves),
/// then seal the ones an earlier release stored in plaintext. Sealing keeps each secret, so no
/// token stops verifying and no receiver sees another signature.
pub(super) async fn prepare(db: &Db, key: &SecretKey) -> Result<(), CliError> {
    signing_keys::check_opens(db, key).await.map_err(CliError::msg)?;
    webhooks_out::check_opens(db, key).await.map_err(CliError::msg)?;
    let mut ch = Change::begin(db, Actor::System).await.map_err(CliError::msg)?;
    let sealed = signing_keys::seal_plaintext(&mut ch, key).await.map_err(CliError::msg)?;
    let webhooks = webhooks_out::seal_plaintext(&mut ch, key).await.map_err(CliError::msg)?;
    ch.commit().await.map_err(CliError::msg)?;
    if !sealed.is_empty() {
        tracing::info!(signing_keys = %sealed.join(","), "sealed the signing keys an earlier release stored in plaintext");
    }
    if webhooks > 0 {
        tracing::info!(webhooks, "sealed the webhook secrets an earlier release stored in plaintext");
    }
    Ok(())
}
