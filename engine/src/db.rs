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
//!
//! # Behind a transaction pooler
//!
//! `DATABASE_URL` may be PgBouncer in transaction mode, `SHOPFLOOR_LISTEN_DATABASE_URL` the server
//! itself (README: "Behind PgBouncer"). A client connection to such a pooler holds a server
//! session only while a transaction is open; between transactions, and between two protocol
//! exchanges outside one, the session may serve another client.
//!
//! 1. `cli::DbArgs::route` takes `Route::Pooler` when both URLs are given; `cli::Database` opens
//!    the pools on `DATABASE_URL` with it and keeps the direct URL for `LISTEN` (`pool.rs`,
//!    `http/events.rs`) and for migrations (`Database::migrate`; `db::migrate` refuses the
//!    pooler's route: the migrator takes a session advisory lock and sets session limits).
//! 2. The pools' connections send no startup parameter PgBouncer refuses (`extra_float_digits`,
//!    `options`) and keep no statement prepared (cache capacity 0: sqlx names each statement
//!    `sqlx_s_N` per client connection, and another client's on the same server session would
//!    collide).
//! 3. `Db::begin` sends `BEGIN; DEALLOCATE ALL; SET LOCAL statement_timeout …` as one simple
//!    query: whatever another client left prepared on the server session is gone, and the limits
//!    hold for this transaction only. A tenant pool then sets its role and org `LOCAL`.
//! 4. A single statement on `&Db` (`fetch_one(&db)`, …) is begun, run and committed before its
//!    rows are handed back, so the caller's next statement sees what it wrote.
//! 5. `Change::begin` is `Db::begin`: a change's statements, its `pg_notify` and its commit are
//!    one transaction on one server session; the `NOTIFY` reaches the listeners on their direct
//!    connections at commit. Transaction-scoped advisory locks (`pg_advisory_xact_lock`, the
//!    signing keys) are fine.
//!
//! `shopfloor check` tells a transaction pooler by two connections sharing one backend
//! (`db::is_transaction_pooler`) and fails, with its fix, when the direct URL is missing or is a
//! pooler too. `tests/e2e/pgbouncer.rs` starts a real PgBouncer (`tests/pgbouncer.rs`) with two or
//! four server connections: each statement gets its own answer, two orgs' concurrent work never
//! sees the other's rows or leaves its role or org behind, and two `api` replicas and two engines
//! run waits, approvals answered on the other replica and a host's crew step to completion.
//!
//! # The migrations
//!
//! Forward-only SQL. `0001_schema.sql` holds the whole data model.
//! `0002_api.sql` adds the REST API's idempotency keys (per org, kept a day) and the indexes
//! of its filtered lists (runs by workflow, audit by action and by actor, tokens by user).
//! `0004_github.sql` adds what ingest needs: deliveries of no tenant (`org_id` NULL, no payload),
//! the item lookups by node id and head SHA, dedup keys unique per project, the trigger events'
//! generation and outcome, cycle-budget asks, and `github_checks` by head SHA.
//! `0005_github_outputs.sql` adds `github_watches` (what a waiting gate or event wait watches:
//! a repository, a pull request, its head commit) and `schedules` (one row per scheduled
//! workflow; `next_at` is its next tick).
//! `0006_hosts.sql` adds the host protocol's state: the index a claim reads (`pending` crew
//! steps by org and age) and the one counting a host's held steps, `step_sessions` (a session's
//! cumulative tokens, cost, turns, tool calls per step), `run_log_sizes` (transcript bytes per
//! run against its cap, and when it was reached), and `hosts.registered_with`.
//! `0007_admission.sql` adds admission (`admission_queues`, one row per line and the lock it is
//! taken under; `admission_waits`, the runs in line with their place; `admission_starts`, a
//! throttle's window; the org's cap as a `concurrency_leases` group), `runs.admitted_at` and
//! the run's spend, project pause and retention, `jobs`, and the outgoing webhooks'
//! subscriptions, deliveries and attempts.
//! `0008_console.sql` adds the console's org-wide indexes (running, ended and failed runs per
//! org, completed runs per workflow for the forecast) and the sign-in lookups of people by
//! GitHub login and email.
//! `0010_resolve.sql` adds `runs.resolved_at`/`resolved_by` (a failed run marked handled).
//! `0011_operator.sql` adds `board_limits` (a project's WIP limit per board column) with the index
//! admission counts a column's items by, the `board` hold, `run_node_overrides` (edit-and-retry),
//! `hosts.drained_at`/`drained_by`, and `run_events` by project and age (their retention).
//! `0012_run_trace.sql` adds `runs.traceparent` (beside `runs.trace_id`: the trace a run's spans join).
//! `0013_event_age_brin.sql` turns the events' age index into a BRIN summary of `at`: events are
//! appended in time order, and every change inserts them, so a B-tree entry per event was a cost
//! on the hottest insert for an hourly sweep.
//! `0014_installations.sql` lets installations be unclaimed (`org_id` NULL until an org proves
//! access; `claimed_at`/`claimed_by`) and adds `github_installation_repositories`, the
//! repositories each reaches as GitHub last said.
//! `0015_signing_keys.sql` adds `signing_keys.sealed` (the secret sealed with
//! `SHOPFLOOR_SECRET_KEY`) and `verify_until` (a retired key's end), and makes the plaintext
//! `secret` optional (cleared when a key is sealed; dropped by a later release).
//! `0016_row_security.sql` adds the second tenancy wall: the role `shopfloor_tenant` (NOLOGIN,
//! NOBYPASSRLS, granted to the migrating user; skipped with a NOTICE when that user may not create
//! roles), `shopfloor_org()` (the setting `shopfloor.org`), and row-level security on every table
//! with an `org_id` column (`org_id = shopfloor_org()`; unclaimed installations, `org_id` NULL,
//! are visible; a delivery of no org is not) and on `github_installation_repositories` (through
//! its installation). Enabled, not forced: the owner bypasses.
//! `0017_spend_estimates.sql` adds to `step_sessions` the host's estimate
//! (`estimated_cost_usd`, `estimate_basis`), whether the output tokens are a lower bound, and
//! `spent_usd`, what the spend tables hold for the session (NULL in older rows, whose spend was
//! their reported cost: read `coalesce(spent_usd, cost_usd, 0)`). See `engine/src/hosts.rs`, "How spend is known".
//! `0019_engine_errors.sql` counts on each run how often advancing it failed on its own
//! (`runs.engine_errors`, `store::engine_errors`).
//! `0018_step_messages.sql` adds `step_messages` (intervene: a person's message to a running
//! crew step, who sent it, and when the holding host acknowledged it; undelivered ones by step),
//! under row security like every table with an `org_id`.
//! `0025_tenant_keys.sql` makes every table whose `project_id` is required name its project
//! and org together: one key `(project_id, org_id) → projects (project_id, org_id)` in place of
//! the two keys to `orgs` and to `projects`, so no row can pair an org with another org's
//! project (tables whose project is optional keep their key to `orgs`; an item's cycle budget
//! names its item's project, now required). It also drops
//! `runs → workflows`, which `runs → workflow_versions` already proves. Each key is one check
//! fewer on every insert: six a webhook delivery that opens a run.
//! `0026_session_parents.sql` adds `api_tokens.issued_from`: the token a console session was
//! made from by pasting it, so that revoking a token revokes the sessions made from it and
//! theirs (`api_writes::revoke_token`, one recursive statement).
//! `0027_sealed_webhook_secrets.sql` adds `webhook_subscriptions.sealed_secret` (the secret
//! sealed with `SHOPFLOOR_SECRET_KEY`, bound to the subscription) and makes the plaintext
//! `secret` optional (cleared when a process holding the key seals it at start; one of the two
//! is always there).

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
