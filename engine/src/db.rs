//! Connecting to PostgreSQL and keeping the schema in step with the code.
//!
//! Only `serve` and `migrate` apply migrations; every other process checks that the database
//! holds exactly the migrations this binary knows and refuses to start otherwise, so a replica
//! of an older release never writes to a schema it does not understand.
//!
//! Every pool is held as a [`Db`], which knows what each of its transactions begins with.
//! Behind a transaction pooler (PgBouncer `pool_mode = transaction`, [`Route::Pooler`]) a
//! client connection owns a server connection only while a transaction is open, and sqlx 0.8
//! sends a statement as two protocol exchanges (parse and describe, then bind and execute),
//! each ended by a `Sync` at which the pooler may hand the server to another client. So on
//! that route: no statement runs outside a transaction (a single statement on a `Db` is one of
//! its own), every transaction starts with `DEALLOCATE ALL` (prepared statements other clients
//! left on that server connection cannot collide with ours), the statement cache is off
//! (a statement prepared in one transaction is never bound in another, on another server), and
//! the serving limits are `SET LOCAL` instead of startup parameters. Measured through PgBouncer
//! 1.18: without the transaction, about one unnamed statement in two ran another client's
//! statement with our parameters; with the cache on, `prepared statement "sqlx_s_1" already
//! exists`. On the direct route none of this is needed and none of it is done.

mod conns;

use std::time::Duration;

use futures::{StreamExt as _, TryStreamExt as _};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgQueryResult, PgRow};
use sqlx::{Either, Execute, Executor, PgPool, Postgres};

use crate::ids::OrgId;
pub use conns::Tx;
use conns::{BEGINNING, Pool};

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
    #[error(
        "the database at {target} refused a startup parameter ({cause}), as PgBouncer does; if DATABASE_URL is a pooler, set SHOPFLOOR_LISTEN_DATABASE_URL to the PostgreSQL server itself (README: Behind PgBouncer)"
    )]
    PoolerRefused { target: String, cause: String },
    #[error("migrations need a direct connection, not a transaction pooler (they hold a session lock); set SHOPFLOOR_LISTEN_DATABASE_URL to the server itself")]
    MigrateThroughPooler,
    #[error("migration failed: {0}")]
    Migrate(String),
    #[error(
        "the database is a pooler in statement mode ({0}), which allows no transaction; use `pool_mode = transaction` with SHOPFLOOR_LISTEN_DATABASE_URL set, or `pool_mode = session` (README: Behind PgBouncer)"
    )]
    StatementPooler(String),
    #[error(transparent)]
    Sql(sqlx::Error),
}

impl From<sqlx::Error> for DbError {
    /// PgBouncer in statement mode refuses every transaction, and shopfloor has no statement
    /// outside one: that is a setting to change, said as such.
    fn from(e: sqlx::Error) -> DbError {
        match e.as_database_error().map(|d| d.message()) {
            Some(m) if m.contains("statement pooling mode") => DbError::StatementPooler(m.to_owned()),
            _ => DbError::Sql(e),
        }
    }
}

/// Parses a database URL without connecting.
pub fn parse_url(url: &str) -> Result<PgConnectOptions, DbError> {
    url.parse::<PgConnectOptions>().map_err(|e| DbError::BadUrl(e.to_string()))
}

/// The limits every connection of a serving process (`api`, `engine`, `serve`) works under,
/// well under the 30 s lease: a statement that runs 10 s, a lock waited for 5 s, or a
/// transaction left idle 15 s (a frozen process) is ended by the server, which rolls its work
/// back and releases its locks, so that nothing it held waits for it. Sent as startup
/// parameters on the direct route; behind a pooler, which would not pass them on, each
/// transaction sets the timeouts `LOCAL` (keepalives are the pooler's own business on its links
/// to the server). With them, the server's TCP keepalives
/// (`listen::Keepalive::DEFAULT`): sqlx cannot set a client's, but the server ends a backend
/// whose client vanished within 25 s, and its probes keep idle links alive.
pub const GUARDS: &[(&str, &str)] = &[
    ("statement_timeout", "10s"),
    ("lock_timeout", "5s"),
    ("idle_in_transaction_session_timeout", "15s"),
    ("tcp_keepalives_idle", "10"),
    ("tcp_keepalives_interval", "5"),
    ("tcp_keepalives_count", "3"),
    ("tcp_user_timeout", "25000"),
];

/// How a pool reaches the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The server itself, or a pooler in session mode: a connection is one session.
    Direct,
    /// A transaction pooler: a connection is a session only inside a transaction.
    Pooler,
}

/// A pool and what each of its transactions begins with: the pooler's preamble on
/// [`Route::Pooler`], the tenant's role and org on a tenant pool (`tenancy::tenant`). Run single
/// statements on `&Db` as on a pool, and transactions with [`Db::begin`]. There is deliberately
/// no `acquire`: a connection used for several statements outside a transaction is what a
/// pooler breaks.
#[derive(Clone)]
pub struct Db {
    conns: Pool,
    /// sqlx's pool on the same server, opened only when used: for [`Db::pool`].
    raw: PgPool,
    route: Route,
    /// Whether transactions on the pooler route set [`GUARDS`] (the startup parameters do it on
    /// the direct route).
    guarded: bool,
    tenant: bool,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").field("route", &self.route).field("guarded", &self.guarded).field("tenant", &self.tenant).finish_non_exhaustive()
    }
}

impl From<PgPool> for Db {
    /// A pool on the direct route, as the owner: what tests and tools make themselves.
    fn from(raw: PgPool) -> Db {
        let options = raw.connect_options().as_ref().clone();
        let given = raw.options();
        let conns = conns::pool(options, given.get_max_connections(), given.get_acquire_timeout());
        Db { conns, raw, route: Route::Direct, guarded: false, tenant: false }
    }
}

impl Db {
    /// The route this pool takes.
    pub fn route(&self) -> Route {
        self.route
    }

    /// Whether this is a tenant pool (`tenancy::tenant`).
    pub fn is_tenant(&self) -> bool {
        self.tenant
    }

    /// A pool beside this one (same server, route, size and limits), whose transactions act as
    /// the tenant: for `tenancy::tenant`, which says what that means.
    pub(crate) fn tenant_beside(&self) -> Db {
        let options = self.raw.connect_options().as_ref().clone();
        let given = self.raw.options();
        let conns = conns::pool(options.clone(), given.get_max_connections(), given.get_acquire_timeout());
        let raw = raw_options(given.get_max_connections(), given.get_acquire_timeout()).connect_lazy_with(options);
        Db { conns, raw, route: self.route, guarded: self.guarded, tenant: true }
    }

    /// Begins a transaction with this pool's settings in force until it ends.
    ///
    /// sqlx 0.8.6's `begin` is not cancel-safe on PostgreSQL (transact-rs/sqlx#4393, fixed
    /// upstream after 0.8.6): a caller dropped while its `BEGIN` is in flight (a request's
    /// timeout, a client gone, a `select!`) returns the connection to the pool inside a
    /// transaction nothing ends, and the next borrower's statements run in it (PostgreSQL warns
    /// "there is already a transaction in progress"; a single statement's write then waits for
    /// someone else's `COMMIT`). `make bench` showed it in its host fleet phase (86 warnings,
    /// with the API, engines and hosts at work). So the begin runs on a task of its own and always
    /// finishes: when its caller is gone, the finished transaction is dropped there and rolled
    /// back as any dropped transaction is (`store::a_begin_cancelled_midway_…` shows both).
    pub async fn begin(&self) -> Result<Tx, sqlx::Error> {
        let db = self.clone();
        // The scope is task-local: read here, in the caller's task.
        let org = if self.tenant { crate::tenancy::scope::current() } else { None };
        to_the_end(async move { db.begin_to_the_end(org).await }, "beginning a transaction").await
    }

    async fn begin_to_the_end(&self, org: Option<OrgId>) -> Result<Tx, sqlx::Error> {
        let mut tx = BEGINNING.scope((), self.begin_on_a_live_connection()).await?;
        if self.tenant {
            crate::tenancy::scope::enter(&mut tx, org).await?;
        }
        Ok(tx)
    }

    /// `BEGIN` (with the pooler's preamble on that route) on a connection of the pool. A
    /// connection that came back to the pool moments ago is taken without a ping
    /// (`conns::PING_AFTER_IDLE`), so its `BEGIN` is what finds it dead when the server or a pooler
    /// closed it since (a restart, an administrator): that connection is dropped and the next
    /// one tried. `BEGIN` changes nothing, so trying again is always safe.
    async fn begin_on_a_live_connection(&self) -> Result<Tx, sqlx::Error> {
        // After a restart every connection of the pool may be dead; each try drops one.
        let mut tries = self.conns.status().max_size + 1;
        loop {
            let statement = match self.route {
                Route::Direct => None,
                Route::Pooler => Some(self.pooler_preamble()),
            };
            match conns::take(&self.conns).await?.begin(statement).await {
                Ok(tx) => return Ok(tx),
                Err((conn, e)) if tries > 1 && connection_lost(&e) => {
                    conn.discard();
                    tries -= 1;
                    tracing::info!(error = %e, "a pooled connection was found closed by its BEGIN; trying another");
                }
                Err((conn, e)) => {
                    if connection_lost(&e) {
                        conn.discard();
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Commits `tx` on a task of its own, for the same reason as [`Db::begin`]: a caller
    /// dropped while its `COMMIT` is in flight would otherwise leave sqlx to send a `ROLLBACK`
    /// after the server had committed (PostgreSQL warns "there is no transaction in progress",
    /// which `make bench`'s host phase showed when a host dropped its watching claim), and the
    /// caller's change would be committed or not by chance. A commit that started finishes.
    pub async fn commit(tx: Tx) -> Result<(), sqlx::Error> {
        to_the_end(tx.commit(), "committing a transaction").await
    }

    /// `BEGIN` and what a transaction on a pooler's server connection needs first, in one
    /// simple-protocol message (one round trip).
    fn pooler_preamble(&self) -> String {
        let mut sql = String::from("BEGIN; DEALLOCATE ALL");
        if self.guarded {
            // The timeouts; keepalives belong to the pooler's own link to the server.
            for (name, value) in GUARDS.iter().filter(|(name, _)| !name.starts_with("tcp_")) {
                sql.push_str(&format!("; SET LOCAL {name} = '{value}'"));
            }
        }
        sql
    }

    /// Whether a single statement needs a transaction of its own.
    fn wraps(&self) -> bool {
        self.tenant || self.route == Route::Pooler
    }

    /// Closes the pool: its idle connections are closed now, those in use as they come back.
    pub async fn close(&self) {
        conns::close(&self.conns).await;
        self.raw.close().await;
    }

    /// sqlx's pool on the same server, without what [`Db::begin`] sets: for the owner's work on
    /// the direct route only (tests reaching for a raw connection, the migrator).
    pub fn pool(&self) -> &PgPool {
        &self.raw
    }
}

/// Runs `work` on a task of its own and waits for it: dropping the caller does not cut it
/// short (a panic in it is the caller's).
async fn to_the_end<T: Send + 'static>(work: impl std::future::Future<Output = Result<T, sqlx::Error>> + Send + 'static, what: &str) -> Result<T, sqlx::Error> {
    match tokio::spawn(work).await {
        Ok(done) => done,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(sqlx::Error::Protocol(format!("{what}: {e}"))),
    }
}

impl<'c> Executor<'c> for &'c Db {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> futures::stream::BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        // The results are gathered before the connection goes back; in a transaction, before
        // it commits, so what the statement wrote is visible to the caller's next one.
        futures::stream::once(async move {
            let all: Vec<_> = if self.wraps() {
                let mut tx = self.begin().await?;
                let all = (&mut *tx).fetch_many(query).try_collect().await?;
                Db::commit(tx).await?;
                all
            } else {
                let mut conn = conns::take(&self.conns).await?;
                let all = (&mut *conn).fetch_many(query).try_collect().await?;
                conn.settle();
                all
            };
            Ok::<_, sqlx::Error>(futures::stream::iter(all.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(self, query: E) -> futures::future::BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        Box::pin(async move {
            if self.wraps() {
                let mut tx = self.begin().await?;
                let row = (&mut *tx).fetch_optional(query).await?;
                Db::commit(tx).await?;
                return Ok(row);
            }
            let mut conn = conns::take(&self.conns).await?;
            let row = (&mut *conn).fetch_optional(query).await?;
            conn.settle();
            Ok(row)
        })
    }

    fn prepare_with<'e, 'q: 'e>(
        self, sql: &'q str, parameters: &'e [sqlx::postgres::PgTypeInfo],
    ) -> futures::future::BoxFuture<'e, Result<sqlx::postgres::PgStatement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        Box::pin(async move {
            let mut conn = conns::take(&self.conns).await?;
            let statement = (&mut *conn).prepare_with(sql, parameters).await?;
            conn.settle();
            Ok(statement)
        })
    }

    fn describe<'e, 'q: 'e>(self, sql: &'q str) -> futures::future::BoxFuture<'e, Result<sqlx::Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        Box::pin(async move {
            let mut conn = conns::take(&self.conns).await?;
            let described = (&mut *conn).describe(sql).await?;
            conn.settle();
            Ok(described)
        })
    }
}

/// Opens a pool on the direct route; the first connection is made here so an unreachable
/// server fails now, with a message that says where it looked.
pub async fn connect(url: &str, max_connections: u32) -> Result<Db, DbError> {
    open(parse_url(url)?, max_connections, Route::Direct, false).await
}

/// As [`connect`], on `route`, each transaction under the [`GUARDS`]: the pools of serving
/// processes.
pub async fn connect_guarded(url: &str, max_connections: u32, route: Route) -> Result<Db, DbError> {
    open(parse_url(url)?, max_connections, route, true).await
}

/// As [`connect`], on `route`, without the serving limits (`shopfloor check`).
pub async fn connect_on(url: &str, max_connections: u32, route: Route) -> Result<Db, DbError> {
    open(parse_url(url)?, max_connections, route, false).await
}

async fn open(options: PgConnectOptions, max_connections: u32, route: Route, guarded: bool) -> Result<Db, DbError> {
    use sqlx::ConnectOptions;
    // An `application_name` the URL gives is kept, so an operator can tell processes apart in
    // `pg_stat_activity`.
    let name = options.get_application_name().unwrap_or("shopfloor").to_owned();
    let options = options.application_name(&name);
    let options = match route {
        Route::Direct if guarded => options.options(GUARDS.iter().copied()),
        Route::Direct => options,
        // No statement is kept prepared across transactions, and no startup parameter a
        // pooler would refuse (`extra_float_digits` is only for servers before 12; the
        // limits are set per transaction).
        Route::Pooler => options.statement_cache_capacity(0).extra_float_digits(None),
    };
    let target = format!("{}:{}", options.get_host(), options.get_port());
    let unreachable = |cause: String| DbError::Unreachable { target: target.clone(), cause };
    // One direct connection first: a pool would only say that it timed out.
    let probe = tokio::time::timeout(Duration::from_secs(10), options.connect()).await.map_err(|_| unreachable("no answer within 10 s".into()))?.map_err(
        |e| match e.as_database_error() {
            // PgBouncer's words for a parameter it passes on to no server (`options`).
            Some(d) if d.message().starts_with("unsupported startup parameter") => {
                DbError::PoolerRefused { target: target.clone(), cause: d.message().to_owned() }
            }
            _ => unreachable(e.to_string()),
        },
    )?;
    drop(probe);
    let conns = conns::pool(options.clone(), max_connections, Duration::from_secs(10));
    let raw = raw_options(max_connections, Duration::from_secs(10)).connect_lazy_with(options);
    Ok(Db { conns, raw, route, guarded, tenant: false })
}

/// sqlx's own pool, for [`Db::pool`].
fn raw_options(max_connections: u32, acquire_timeout: Duration) -> PgPoolOptions {
    PgPoolOptions::new().max_connections(max_connections).acquire_timeout(acquire_timeout)
}

/// Whether `e` says the connection itself is gone (closed, reset, or ended by the server: class
/// 57P, operator intervention, and class 08, connection exception), rather than the statement
/// failing.
fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(d) => d.code().is_some_and(|c| c.starts_with("57P") || c.starts_with("08")),
        _ => false,
    }
}

/// The newest migration version this binary carries.
pub fn code_version() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// The newest migration applied to the database, 0 when none.
pub async fn db_version(pool: &Db) -> Result<i64, DbError> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL").fetch_one(pool).await?;
    if !exists {
        return Ok(0);
    }
    let v: Option<i64> = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success").fetch_one(pool).await?;
    Ok(v.unwrap_or(0))
}

/// Applies pending migrations, refusing a database whose schema is newer than the code. Needs
/// the direct route: the migrator holds a session advisory lock and sets session limits.
pub async fn migrate(pool: &Db) -> Result<(), DbError> {
    if pool.route() == Route::Pooler {
        return Err(DbError::MigrateThroughPooler);
    }
    let (db, code) = (db_version(pool).await?, code_version());
    if db > code {
        return Err(DbError::SchemaNewer { db, code });
    }
    // On a connection of its own without the serving limits: a migration may rewrite a large
    // table or wait for the locks of running processes. It is closed afterwards.
    let mut conn = pool.pool().acquire().await?.detach();
    for unlimited in ["SET statement_timeout = 0", "SET lock_timeout = 0", "SET idle_in_transaction_session_timeout = 0"] {
        sqlx::query(unlimited).execute(&mut conn).await?;
    }
    let ran = MIGRATOR.run(&mut conn).await.map_err(|e| DbError::Migrate(e.to_string()));
    let _ = sqlx::Connection::close(conn).await;
    ran
}

/// Checks that the database holds exactly this binary's schema.
pub async fn check_schema(pool: &Db) -> Result<(), DbError> {
    let (db, code) = (db_version(pool).await?, code_version());
    match db.cmp(&code) {
        std::cmp::Ordering::Greater => Err(DbError::SchemaNewer { db, code }),
        std::cmp::Ordering::Less => Err(DbError::SchemaOlder { db, code }),
        std::cmp::Ordering::Equal => Ok(()),
    }
}

/// Whether `url` is a pooler in transaction (or statement) mode: two of its client
/// connections share one server session. Seen by `pg_backend_pid()`: a connection's backend
/// changing between two statements while another connection holds a transaction open, or that
/// other connection getting the backend the first one just used. On the server itself, and
/// behind a pooler in session mode, a connection keeps its own backend, so neither happens and
/// the answer is false. Only the simple protocol is used, which any pooler passes whole.
pub async fn is_transaction_pooler(url: &str) -> Result<bool, DbError> {
    use sqlx::{ConnectOptions as _, Connection as _};
    let options = parse_url(url)?.statement_cache_capacity(0).extra_float_digits(None).application_name("shopfloor check");
    let target = format!("{}:{}", options.get_host(), options.get_port());
    let connect = || async {
        match tokio::time::timeout(Duration::from_secs(10), options.connect()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(DbError::Unreachable { target: target.clone(), cause: e.to_string() }),
            Err(_) => Err(DbError::Unreachable { target: target.clone(), cause: "no answer within 10 s".into() }),
        }
    };
    async fn pid(conn: &mut sqlx::PgConnection) -> Result<String, sqlx::Error> {
        use sqlx::Row as _;
        conn.fetch_one("SELECT pg_backend_pid()::text").await?.try_get(0)
    }
    let mut other = connect().await?;
    for _ in 0..3 {
        let mut first = connect().await?;
        let before = pid(&mut first).await?;
        other.execute("BEGIN").await?;
        let held = pid(&mut other).await?;
        // A pooler with one server connection makes this wait for `other`: no answer is no
        // evidence either way.
        let after = tokio::time::timeout(Duration::from_secs(2), pid(&mut first)).await;
        other.execute("ROLLBACK").await?;
        if held == before || matches!(&after, Ok(Ok(p)) if *p != before) {
            return Ok(true);
        }
        let _ = first.close().await;
    }
    let _ = other.close().await;
    Ok(false)
}
