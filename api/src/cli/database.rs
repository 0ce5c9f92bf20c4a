//! Finding the database: DATABASE_URL, or the embedded cluster in SHOPFLOOR_DATA_DIR.

use engine::cluster::{self, Cluster, ClusterOptions};
use engine::db::Db;

use super::args::DbArgs;
use super::error::CliError;

/// A connected database, and the embedded cluster when this process started it.
pub struct Database {
    pub url: String,
    /// The server itself: `SHOPFLOOR_LISTEN_DATABASE_URL`, else `url`. `LISTEN` and
    /// migrations go there, never through a pooler.
    pub direct_url: String,
    pub pool: Db,
    cluster: Option<Cluster>,
}

impl Database {
    pub async fn open(args: &DbArgs, connections: u32) -> Result<Database, CliError> {
        let (url, cluster) = match &args.database_url {
            Some(url) if !url.trim().is_empty() => {
                engine::db::parse_url(url).map_err(CliError::msg)?;
                (url.clone(), None)
            }
            _ => {
                let opts = ClusterOptions { data_dir: args.data_dir.clone(), durable: true };
                let c = cluster::ensure_running(&opts).await.map_err(CliError::msg)?;
                if c.started_here {
                    tracing::info!(dir = %c.pgdata().display(), port = c.port, "started the embedded PostgreSQL cluster");
                }
                (c.url.clone(), c.started_here.then_some(c))
            }
        };
        let direct_url = args.listen.url(&url);
        match engine::db::connect_guarded(&url, connections, args.route()).await {
            Ok(pool) => Ok(Database { url, direct_url, pool, cluster }),
            Err(e) => {
                if let Some(c) = &cluster {
                    let _ = c.stop();
                }
                Err(CliError::msg(e))
            }
        }
    }

    /// Opens the database of a process that needs this binary's schema (`api`, `engine`):
    /// a newer or older schema is refused, and the database closed again.
    pub async fn open_migrated(args: &DbArgs, connections: u32) -> Result<Database, CliError> {
        let db = Database::open(args, connections).await?;
        match engine::db::check_schema(&db.pool).await {
            Ok(_) => Ok(db),
            Err(e) => {
                db.close().await;
                Err(CliError::msg(e))
            }
        }
    }

    /// Applies the migrations on the direct URL: through a pooler the migrator's session lock
    /// and limits would land on whichever server connection it lent.
    pub async fn migrate(&self) -> Result<(), CliError> {
        if self.pool.route() == engine::db::Route::Direct {
            return engine::db::migrate(&self.pool).await.map_err(CliError::msg);
        }
        let direct = engine::db::connect(&self.direct_url, 2).await.map_err(CliError::msg)?;
        let migrated = engine::db::migrate(&direct).await.map_err(CliError::msg);
        direct.close().await;
        migrated
    }

    /// Runs `f` (reading more settings); on failure, closes the database before returning.
    pub async fn or_close<T>(self, f: impl FnOnce() -> Result<T, CliError>) -> Result<(Database, T), CliError> {
        match f() {
            Ok(t) => Ok((self, t)),
            Err(e) => {
                self.close().await;
                Err(e)
            }
        }
    }

    /// Closes the pool and stops the embedded cluster if this process started it.
    pub async fn close(self) {
        self.pool.close().await;
        if let Some(c) = self.cluster {
            match c.stop() {
                Ok(()) => tracing::info!("stopped the embedded PostgreSQL cluster"),
                Err(e) => tracing::warn!(error = %e, "could not stop the embedded PostgreSQL cluster"),
            }
        }
    }
}
