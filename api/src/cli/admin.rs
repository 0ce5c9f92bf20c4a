//! `shopfloor admin`: bootstrap an org with its owner's first token, add projects, rotate and
//! retire the JWT signing keys, and run the embedded cluster for scripts (`make test` uses
//! `cluster start|stop`).
//!
//! What a script needs (a token, a URL) is printed alone on standard output; everything else
//! goes to standard error, except the one line a key command prints on standard output: what
//! it did, with the kids. Input that is wrong (an unknown org or key, a malformed duration)
//! exits 2 with one line that says what to give instead; other failures exit 1.

use std::path::PathBuf;

use chrono::Duration;
use clap::Subcommand;
use engine::cluster::{self, ClusterOptions};
use engine::ids::Slug;
use engine::sealing::SecretKey;
use engine::store::{Actor, Change, signing_keys, tenants};

use super::args::{DbArgs, SecretKeyArgs};
use super::database::Database;
use super::error::CliError;
use crate::auth::{self, UserToken};

/// How long the first owner token lives.
const FIRST_TOKEN_DAYS: i64 = 90;

/// How long a retired key's tokens go on verifying unless `--grace` says otherwise: a day for
/// their holders to mint new tokens (`shopfloor tokens create`) with the old ones.
const DEFAULT_GRACE: &str = "24h";

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Create an org and its owner; prints the owner's first API token on standard output.
    CreateOrg {
        #[arg(long)]
        slug: String,
        #[arg(long = "owner-email")]
        owner_email: String,
        /// Display name (defaults to the slug).
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        secret_key: SecretKeyArgs,
    },
    /// Create a project in an org.
    CreateProject {
        /// The org's slug.
        #[arg(long)]
        org: String,
        #[arg(long)]
        slug: String,
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Make a new JWT signing key: it signs every token from now on. Tokens signed by earlier
    /// keys go on verifying until they expire (or their key is retired), so no one is logged
    /// out.
    RotateSigningKey {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        secret_key: SecretKeyArgs,
    },
    /// Retire a JWT signing key: it signs nothing more, and the tokens it signed stop being
    /// accepted once the grace is over (on every replica within 10 s of that). Retiring the
    /// current key makes a new one in its place.
    RetireSigningKey {
        /// The key's id (the `kid` in its tokens' header; `rotate-signing-key` prints it).
        kid: String,
        /// How long its tokens are still accepted, e.g. `0s` (at once), `30m`, `24h`, `7d`.
        /// Retiring a key again only ever shortens it.
        #[arg(long, default_value = DEFAULT_GRACE)]
        grace: String,
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        secret_key: SecretKeyArgs,
    },
    /// Start or stop an embedded PostgreSQL cluster in a directory.
    #[command(subcommand)]
    Cluster(ClusterCommand),
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Start (or find running) the cluster; prints its URL on standard output.
    Start {
        #[arg(long = "data-dir", env = "SHOPFLOOR_DATA_DIR", default_value = ".shopfloor")]
        data_dir: PathBuf,
        /// Keep fsync and synchronous commit on (off by default here: this is for tests).
        #[arg(long)]
        durable: bool,
    },
    /// Stop the cluster in a directory, if one runs there.
    Stop {
        #[arg(long = "data-dir", env = "SHOPFLOOR_DATA_DIR", default_value = ".shopfloor")]
        data_dir: PathBuf,
    },
}

pub(super) async fn run(cmd: AdminCommand) -> Result<(), CliError> {
    match cmd {
        AdminCommand::CreateOrg { slug, owner_email, name, db, secret_key } => {
            let slug = Slug::parse(&slug).map_err(CliError::msg)?;
            let key = secret_key.require(&db)?;
            with_db(&db, Some(key.clone()), |mut ch| async move {
                let (org, user) = tenants::create_org(&mut ch, &slug, name.as_deref().unwrap_or(slug.as_str()), &owner_email).await?;
                let token = auth::issue_user_token(
                    &mut ch,
                    &key,
                    UserToken { org, user, project: None, role: "owner", name: "first owner token", ttl: Duration::days(FIRST_TOKEN_DAYS) },
                )
                .await?;
                ch.commit().await?;
                eprintln!("created org `{slug}` with owner {owner_email}; the owner's token follows (valid {FIRST_TOKEN_DAYS} days)");
                println!("{token}");
                Ok(())
            })
            .await
        }
        AdminCommand::CreateProject { org, slug, name, db } => {
            let slug = Slug::parse(&slug).map_err(CliError::msg)?;
            with_db(&db, None, |mut ch| async move {
                let org_id = tenants::org_by_slug(&mut ch, &org)
                    .await?
                    .ok_or_else(|| engine::store::StoreError::Invalid(format!("no org `{org}`; create it with `shopfloor admin create-org`")))?;
                tenants::create_project(&mut ch, org_id, &slug, name.as_deref().unwrap_or(slug.as_str())).await?;
                ch.commit().await?;
                eprintln!("created project `{slug}` in org `{org}`");
                Ok(())
            })
            .await
        }
        AdminCommand::RotateSigningKey { db, secret_key } => {
            let key = secret_key.require(&db)?;
            with_db(&db, Some(key.clone()), |mut ch| async move {
                let rotation = signing_keys::rotate(&mut ch, &key).await?;
                ch.commit().await?;
                tracing::info!(signing_key = %rotation.kid, previous = %rotation.previous.join(","), "rotated the signing key");
                let previous = match rotation.previous.as_slice() {
                    [] => String::new(),
                    kids => format!(
                        "; {} still verif{} the tokens it signed until they expire or `shopfloor admin retire-signing-key KID`",
                        kids.join(", "),
                        if kids.len() == 1 { "ies" } else { "y" }
                    ),
                };
                println!("new tokens are signed by {}{previous}", rotation.kid);
                Ok(())
            })
            .await
        }
        AdminCommand::RetireSigningKey { kid, grace, db, secret_key } => {
            let grace = humantime::parse_duration(grace.trim())
                .map_err(|_| CliError::Usage(format!("--grace `{grace}` is not a duration; write it like 0s, 30m, 24h or 7d")))?;
            let key = secret_key.require(&db)?;
            with_db(&db, Some(key.clone()), |mut ch| async move {
                let retired = signing_keys::retire(&mut ch, &key, kid.trim(), grace).await?;
                ch.commit().await?;
                tracing::info!(signing_key = %retired.kid, verify_until = %retired.verify_until, "retired the signing key");
                let successor = retired.successor.map(|k| format!("; new tokens are signed by {k}")).unwrap_or_default();
                println!(
                    "retired signing key {}: its tokens are refused from {}{successor}",
                    retired.kid,
                    retired.verify_until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                );
                Ok(())
            })
            .await
        }
        AdminCommand::Cluster(ClusterCommand::Start { data_dir, durable }) => {
            let c = cluster::ensure_running(&ClusterOptions { data_dir, durable }).await.map_err(CliError::msg)?;
            eprintln!("PostgreSQL {} on port {}", if c.started_here { "started" } else { "already running" }, c.port);
            println!("{}", c.url);
            Ok(())
        }
        AdminCommand::Cluster(ClusterCommand::Stop { data_dir }) => cluster::stop_dir(&ClusterOptions { data_dir, durable: false }).map_err(CliError::msg),
    }
}

/// Opens the database (checking its schema and, when given, that the secret key opens the
/// signing keys: a key sealed with the wrong one would leave the servers unable to sign), runs
/// `f` in one change as the system actor, and closes the database.
async fn with_db<F, Fut>(args: &DbArgs, key: Option<SecretKey>, f: F) -> Result<(), CliError>
where
    F: FnOnce(Change) -> Fut,
    Fut: std::future::Future<Output = Result<(), engine::store::StoreError>>,
{
    let db = Database::open(args, 2).await?;
    let result = async {
        engine::db::check_schema(&db.pool).await.map_err(CliError::msg)?;
        if let Some(key) = key {
            super::secret_key::prepare(&db.pool, &key).await?;
        }
        let ch = Change::begin(&db.pool, Actor::System).await.map_err(CliError::msg)?;
        f(ch).await.map_err(|e| match e {
            engine::store::StoreError::Invalid(m) => CliError::Usage(m),
            engine::store::StoreError::Conflict(m) => CliError::Failed(m),
            other => CliError::msg(other),
        })
    }
    .await;
    db.close().await;
    result
}
