//! The connections behind a [`Db`](super::Db): a deadpool of sqlx connections, and [`Tx`], the
//! transaction that holds one.
//!
//! sqlx's own pool pings every connection as it comes back (`PoolConnection::return_to_pool`):
//! a round trip more for every transaction and every single statement, paid by both processes
//! in wake-ups: about 2–3% of the CPU a webhook delivery costs and of the engine's runs per
//! second (bench/history.md, 2026-12-05). Here a connection is pinged when it is taken, and only when its
//! last use did not finish (a dropped transaction, a statement cut short) or it has been idle
//! [`PING_AFTER_IDLE`] or longer.

use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

use deadpool::managed::{self, Metrics, Object, PoolError, RecycleError, RecycleResult};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgTransactionManager};
use sqlx::{ConnectOptions as _, Connection as _, TransactionManager as _};

/// A connection that was given back this recently, its last use finished, is handed to a
/// transaction without a ping: the transaction's `BEGIN` finds a connection that died since
/// (`Db::begin`). One idle longer, or taken for a single statement, is pinged and replaced when
/// the server or a pooler dropped it meanwhile. HikariCP's `aliveBypassWindowMs` makes the same
/// trade, with the same 500 ms.
const PING_AFTER_IDLE: Duration = Duration::from_millis(500);

/// A connection older than this is closed when it is next taken, and another opened: sqlx's
/// default lifetime, so that a server restarted behind a load balancer or a pooler's rotation
/// reaches every connection.
const MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

tokio::task_local! {
    /// Set while `Db::begin` takes a connection: its `BEGIN` finds a dead one out and tries
    /// another, which a single statement could not do safely.
    pub(super) static BEGINNING: ();
}

/// A pooled connection and when its last use finished (`None` while in use, or when that use
/// was cut short and may have left a `ROLLBACK` queued or answers unread).
pub(crate) struct Conn {
    raw: PgConnection,
    settled: Option<Instant>,
}

impl Conn {
    /// Marks the use that took it as finished.
    fn settle(&mut self) {
        self.settled = Some(Instant::now());
    }
}

pub(crate) struct Manager {
    options: PgConnectOptions,
}

impl managed::Manager for Manager {
    type Type = Conn;
    type Error = sqlx::Error;

    async fn create(&self) -> Result<Conn, sqlx::Error> {
        Ok(Conn { raw: self.options.connect().await?, settled: Some(Instant::now()) })
    }

    async fn recycle(&self, conn: &mut Conn, metrics: &Metrics) -> RecycleResult<sqlx::Error> {
        if metrics.age() >= MAX_LIFETIME {
            return Err(RecycleError::message("past its lifetime"));
        }
        let recent = conn.settled.is_some_and(|at| at.elapsed() < PING_AFTER_IDLE) && BEGINNING.try_with(|_| ()).is_ok();
        if !recent {
            // Sends what is queued (a dropped transaction's `ROLLBACK`) and reads every answer
            // still owed; an error drops the connection, and the pool takes or opens another.
            conn.raw.ping().await?;
        }
        Ok(())
    }
}

pub(crate) type Pool = managed::Pool<Manager>;

/// A pool of at most `max` connections made with `options`; none is opened before it is needed.
pub(super) fn pool(options: PgConnectOptions, max: u32, wait: Duration) -> Pool {
    Pool::builder(Manager { options })
        .max_size(max as usize)
        // The connection given back last is taken first: it is the one least likely to need a ping.
        .queue_mode(managed::QueueMode::Lifo)
        .runtime(deadpool::Runtime::Tokio1)
        .wait_timeout(Some(wait))
        .create_timeout(Some(wait))
        .recycle_timeout(Some(wait))
        .build()
        .expect("a runtime is given for the timeouts")
}

/// A connection of `pool`, its use unfinished until [`Taken::settle`].
pub(super) async fn take(pool: &Pool) -> Result<Taken, sqlx::Error> {
    let mut conn = pool.get().await.map_err(|e| match e {
        PoolError::Backend(e) => e,
        PoolError::Timeout(_) => sqlx::Error::PoolTimedOut,
        PoolError::Closed => sqlx::Error::PoolClosed,
        other => sqlx::Error::Protocol(format!("taking a connection: {other}")),
    })?;
    conn.settled = None;
    Ok(Taken(conn))
}

/// Gives back the connections `pool` holds idle, closing each as PostgreSQL expects, and closes
/// the pool: connections in use are dropped as they come back.
pub(super) async fn close(pool: &Pool) {
    let idle = pool.retain(|_, _| false);
    pool.close();
    for conn in idle.removed {
        let _ = conn.raw.close().await;
    }
}

/// A connection taken from the pool.
pub(super) struct Taken(Object<Manager>);

impl Taken {
    /// The use finished: the connection goes back without a ping.
    pub(super) fn settle(&mut self) {
        self.0.settle();
    }

    /// The connection is gone: it is not given back.
    pub(super) fn discard(self) {
        let _ = Object::take(self.0);
    }

    /// Begins a transaction on it with `statement` (`BEGIN` when `None`).
    pub(super) async fn begin(mut self, statement: Option<String>) -> Result<Tx, (Taken, sqlx::Error)> {
        match PgTransactionManager::begin(&mut self.0.raw, statement.map(Into::into)).await {
            Ok(()) => Ok(Tx { conn: Some(self) }),
            Err(e) => Err((self, e)),
        }
    }
}

impl Deref for Taken {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.0.raw
    }
}

impl DerefMut for Taken {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.0.raw
    }
}

/// An open transaction on a pooled connection, used as the connection itself (`&mut *tx`).
/// Dropped without [`Tx::commit`], it is rolled back at once, on a task of
/// its own, before the connection goes back: its locks are not left held until the next use.
pub struct Tx {
    /// `None` once committed or rolled back.
    conn: Option<Taken>,
}

impl Tx {
    pub async fn commit(mut self) -> Result<(), sqlx::Error> {
        let conn = self.conn.as_mut().expect("an open transaction holds its connection");
        PgTransactionManager::commit(conn).await?;
        conn.settle();
        self.conn = None;
        Ok(())
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else { return };
        // Queues the `ROLLBACK` (when the `COMMIT` was not sent already); the ping sends it and
        // reads every answer owed, so the connection goes back clean or not at all.
        PgTransactionManager::start_rollback(&mut conn);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    match conn.ping().await {
                        Ok(()) => conn.settle(),
                        Err(_) => conn.discard(),
                    }
                });
            }
            Err(_) => conn.discard(),
        }
    }
}

impl Deref for Tx {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.conn.as_ref().expect("an open transaction holds its connection")
    }
}

impl DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("an open transaction holds its connection")
    }
}
