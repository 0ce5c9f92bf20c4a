//! `shopfloor admin`: bootstrap an org with its owner's first token, add projects, and run the
//! embedded cluster for scripts (`make test` uses `cluster start|stop`).
//!
//! What a script needs (a token, a URL) is printed alone on standard output; everything else
//! goes to standard error.

use std::path::PathBuf;

use chrono::Duration;
use clap::Subcommand;
use engine::cluster::{self, ClusterOptions};
use engine::ids::Slug;
use engine::store::{tenants, Actor, Change};

use super::{CliError, Database, DbArgs};
use crate::auth::{self, UserToken};

/// How long the first owner token lives.
const FIRST_TOKEN_DAYS: i64 = 90;

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
        AdminCommand::CreateOrg { slug, owner_email, name, db } => {
            let slug = Slug::parse(&slug).map_err(CliError::msg)?;
            with_db(&db, |mut ch| async move {
                let (org, user) = tenants::create_org(&mut ch, &slug, name.as_deref().unwrap_or(slug.as_str()), &owner_email).await?;
                let token = auth::issue_user_token(
                    &mut ch,
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
            with_db(&db, |mut ch| async move {
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
        AdminCommand::Cluster(ClusterCommand::Start { data_dir, durable }) => {
            let c = cluster::ensure_running(&ClusterOptions { data_dir, durable }).await.map_err(CliError::msg)?;
            eprintln!("PostgreSQL {} on port {}", if c.started_here { "started" } else { "already running" }, c.port);
            println!("{}", c.url);
            Ok(())
        }
        AdminCommand::Cluster(ClusterCommand::Stop { data_dir }) => {
            cluster::stop_dir(&ClusterOptions { data_dir, durable: false }).map_err(CliError::msg)
        }
    }
}

/// Opens the database (checking its schema), runs `f` in one change as the system actor, and
/// closes the database.
async fn with_db<F, Fut>(args: &DbArgs, f: F) -> Result<(), CliError>
where
    F: FnOnce(Change) -> Fut,
    Fut: std::future::Future<Output = Result<(), engine::store::StoreError>>,
{
    let db = Database::open(args, 2).await?;
    let result = async {
        engine::db::check_schema(&db.pool).await.map_err(CliError::msg)?;
        let ch = Change::begin(&db.pool, Actor::System).await.map_err(CliError::msg)?;
        f(ch).await.map_err(|e| match e {
            engine::store::StoreError::Conflict(m) | engine::store::StoreError::Invalid(m) => CliError::Failed(m),
            other => CliError::msg(other),
        })
    }
    .await;
    db.close().await;
    result
}
