//! Connecting to PostgreSQL and keeping the schema in step with the code.
//!
//! Only `serve` and `migrate` apply migrations; every other process checks that the database
//! holds exactly the migrations this binary knows and refuses to start otherwise, so a replica
//! of an older release never writes to a schema it does not understand.

use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

/// The migrations in `migrations/`, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("DATABASE_URL is not a valid PostgreSQL URL ({0}); expected postgres://USER:PASSWORD@HOST:PORT/DATABASE")]
    BadUrl(String),
    #[error("cannot reach the database at {target}: {cause}; check that PostgreSQL is running and DATABASE_URL points at it")]
    Unreachable { target: String, cause: String },
    #[error("the database schema is at migration {db}, newer than this binary knows ({code}); run a newer shopfloor release")]
    SchemaNewer { db: i64, code: i64 },
    #[error("the database schema is at migration {db}, but this binary needs {code}; run `shopfloor migrate`")]
    SchemaOlder { db: i64, code: i64 },
    #[error("migration failed: {0}")]
    Migrate(String),
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
}

/// Parses a database URL without connecting.
pub fn parse_url(url: &str) -> Result<PgConnectOptions, DbError> {
    url.parse::<PgConnectOptions>().map_err(|e| DbError::BadUrl(e.to_string()))
}

/// The limits every connection of a serving process (`api`, `engine`, `serve`) works under,
/// well under the 30 s lease: a statement that runs 10 s, a lock waited for 5 s, or a
/// transaction left idle 15 s (a frozen process) is ended by the server, which rolls its work
/// back and releases its locks, so that nothing it held waits for it. Sent as startup
/// parameters; behind a pooler that does not pass them on (PgBouncer: list `options` in
/// `ignore_startup_parameters`), set them on the role instead (README). With them, the server's
/// TCP keepalives (`listen::Keepalive::DEFAULT`): sqlx cannot set a client's, but the server
/// ends a backend whose client vanished within 25 s, and its probes keep idle links alive.
pub const GUARDS: &[(&str, &str)] = &[
    ("statement_timeout", "10s"),
    ("lock_timeout", "5s"),
    ("idle_in_transaction_session_timeout", "15s"),
    ("tcp_keepalives_idle", "10"),
    ("tcp_keepalives_interval", "5"),
    ("tcp_keepalives_count", "3"),
    ("tcp_user_timeout", "25000"),
];

/// Opens a pool; the first connection is made here so an unreachable server fails now, with a
/// message that says where it looked.
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, DbError> {
    connect_with(parse_url(url)?, max_connections).await
}

/// As [`connect`], each connection under the [`GUARDS`]: the pools of serving processes.
pub async fn connect_guarded(url: &str, max_connections: u32) -> Result<PgPool, DbError> {
    connect_with(parse_url(url)?.options(GUARDS.iter().copied()), max_connections).await
}

async fn connect_with(options: PgConnectOptions, max_connections: u32) -> Result<PgPool, DbError> {
    use sqlx::ConnectOptions;
    let options = options.application_name("shopfloor");
    let target = format!("{}:{}", options.get_host(), options.get_port());
    let unreachable = |cause: String| DbError::Unreachable { target: target.clone(), cause };
    // One direct connection first: a pool would only say that it timed out.
    let probe = tokio::time::timeout(Duration::from_secs(10), options.connect())
        .await
        .map_err(|_| unreachable("no answer within 10 s".into()))?
        .map_err(|e| unreachable(e.to_string()))?;
    drop(probe);
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(options))
}

/// The newest migration version this binary carries.
pub fn code_version() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// The newest migration applied to the database, 0 when none.
pub async fn db_version(pool: &PgPool) -> Result<i64, DbError> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !exists {
        return Ok(0);
    }
    let v: Option<i64> =
        sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
            .fetch_one(pool)
            .await?;
    Ok(v.unwrap_or(0))
}

/// Applies pending migrations, refusing a database whose schema is newer than the code.
pub async fn migrate(pool: &PgPool) -> Result<(), DbError> {
    let (db, code) = (db_version(pool).await?, code_version());
    if db > code {
        return Err(DbError::SchemaNewer { db, code });
    }
    // On a connection of its own without the serving limits: a migration may rewrite a large
    // table or wait for the locks of running processes. It is closed afterwards.
    let mut conn = pool.acquire().await?.detach();
    for unlimited in ["SET statement_timeout = 0", "SET lock_timeout = 0", "SET idle_in_transaction_session_timeout = 0"] {
        sqlx::query(unlimited).execute(&mut conn).await?;
    }
    let ran = MIGRATOR.run(&mut conn).await.map_err(|e| DbError::Migrate(e.to_string()));
    let _ = sqlx::Connection::close(conn).await;
    ran
}

/// Checks that the database holds exactly this binary's schema.
pub async fn check_schema(pool: &PgPool) -> Result<(), DbError> {
    let (db, code) = (db_version(pool).await?, code_version());
    match db.cmp(&code) {
        std::cmp::Ordering::Greater => Err(DbError::SchemaNewer { db, code }),
        std::cmp::Ordering::Less => Err(DbError::SchemaOlder { db, code }),
        std::cmp::Ordering::Equal => Ok(()),
    }
}
