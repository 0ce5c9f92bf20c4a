//! The one `LISTEN` connection of a process: the engine pool's wake-ups (`pool.rs`) and an API
//! replica's event hub (`api::http::events`, which hosts' claims wait on too).
//!
//! A connection that only listens sends nothing, so when a network cut drops its packets
//! without closing it (a NAT mapping that expired, a load balancer that failed over) it would
//! wait for a notification forever. Its socket therefore has TCP keepalives and a user timeout
//! ([`Keepalive`]): probes the kernels send and answer, never a statement, so an idle process
//! still sends PostgreSQL nothing, and a silent peer is noticed within
//! `idle + interval × retries` (25 s by default). sqlx 0.8 cannot do this (it opens its sockets
//! itself and sets only `TCP_NODELAY` on them), hence tokio-postgres here; the pool stays sqlx.
//!
//! deadpool-postgres makes the connection (a pool of one): within [`CONNECT_TIMEOUT`], and
//! subscribed before it is handed out; its recycling is `Fast`, `is_closed()` alone, because
//! the other methods run a statement (`Clean` even `UNLISTEN *`). Three parts stay ours,
//! because deadpool has no place for them: its own connection task discards notifications, so
//! [`Subscribing`] drives the connection and forwards them; deadpool looks at a connection only
//! when one is asked for, and a listener asks once and holds it while it lives, so the loss of
//! an idle connection is reported by that same task, and the lost connection is taken out of
//! the pool; and deadpool has no backoff, so the callers wait between failed attempts
//! ([`Backoff`]: 1 s, doubling, at most [`RETRY_CAP`], so a process is listening again within
//! seconds of its database's return however long it was away).
//!
//! URLs are read by sqlx ([`crate::db::parse_url`]: the same URLs, `PG*` variables and
//! `.pgpass` as the pool) and translated. There is no TLS to PostgreSQL in this build, as for
//! the pool: `sslmode` `disable`, `allow` and `prefer` connect in plaintext, a mode that
//! requires TLS is refused when the URL is read.
//!
//! # Network cuts
//!
//! A cut that drops packets without closing connections (a NAT mapping that expired, a load
//! balancer that failed over) closes nothing, so it must be noticed. What holds:
//!
//! - **The `LISTEN` connection** (each `engine`, `api`, `serve`): TCP keepalives on its socket
//!   (`engine::listen`) give it up within `idle + interval × retries` of the last answer (25 s by
//!   default); the process subscribes again (with the backoff while the network is away) and
//!   then looks for work once: the engine rescans its wakes, the event hub reads the events and
//!   wakes the hosts' claims. Keepalives do not fire while sent data waits for an
//!   acknowledgement; the user timeout (25 s) covers that, and the listener sends nothing but
//!   its `LISTEN`. Probes are TCP segments, not statements: an idle pool still sends none
//!   (`e2e/blackhole.rs`, `e2e/engine_pool.rs`).
//! - **The server's end** of every connection (the pool's through `db::GUARDS`, the listener's
//!   through its options): PostgreSQL probes a silent client the same way and ends its session,
//!   rolling back what it held and, for a listener, letting the notification queue move past it;
//!   its probes also keep an idle path's NAT and load balancer entries alive.
//! - **A pooled connection that died while idle** is found out when it is next taken: sqlx pings
//!   it first, under the pool's 10 s acquire timeout; a ping without an answer fails that acquire
//!   and closes the connection, and the caller's retry (the engine's backoff) gets another, so
//!   each dead connection costs one acquire timeout. A transaction skips that ping for a
//!   connection back in the pool under 500 ms (sqlx pinged it on its way back); one the server
//!   closed in between fails its `BEGIN`, which `Db::begin` answers by trying the next
//!   (`store::a_connection_the_server_closed_in_the_pool_is_replaced_by_the_next_begin`).
//!
//! What does not hold: sqlx 0.8.6 opens the pool's sockets itself and sets nothing on them but
//! `TCP_NODELAY` (upstream issue launchbadge/sqlx#3540), so a statement already sent and
//! acknowledged when the cut comes waits for its answer with nothing to end the wait; the
//! server's `statement_timeout` ends the statement there, but its answer is lost with the link.
//! An engine caught so stops in that call until it is restarted; its leases lapse and other
//! engines take its steps back as after a crash. Ending this needs client keepalives on the
//! pool's sockets (a sqlx release that sets them, or the pool on tokio-postgres), not more
//! timers.

use std::future::poll_fn;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use futures::future::BoxFuture;
use sqlx::ConnectOptions;
use sqlx::postgres::PgSslMode;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::db::DbError;

/// The longest wait between two attempts to reach the database again (to subscribe, to claim):
/// a failover's gap is seconds, and every second waited past the database's return is a second
/// of work not started.
pub const RETRY_CAP: Duration = Duration::from_secs(5);

/// The wait before the next attempt after a failure: 1 s, doubling, at most [`RETRY_CAP`].
#[derive(Debug, Clone, Copy)]
pub struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff(Duration::from_secs(1))
    }
}

impl Backoff {
    /// The wait now, and the next one doubled.
    pub fn wait(&mut self) -> Duration {
        let wait = self.0;
        self.0 = (self.0 * 2).min(RETRY_CAP);
        wait
    }

    /// After a success: the next failure waits 1 s again.
    pub fn reset(&mut self) {
        *self = Backoff::default();
    }

    /// Sleeps for the next wait; true when `stop` was cancelled meanwhile.
    pub async fn pause(&mut self, stop: &tokio_util::sync::CancellationToken) -> bool {
        let wait = self.wait();
        tokio::select! {
            () = stop.cancelled() => true,
            () = tokio::time::sleep(wait) => false,
        }
    }
}

/// How long connecting and subscribing may take before the attempt counts as failed.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// TCP keepalives and the user timeout of a database connection's socket.
///
/// After `idle` without traffic the kernel sends a probe, then one every `interval`; when
/// `retries` went unanswered the connection is given up. Keepalives do not fire while sent data
/// waits to be acknowledged, which `user_timeout` bounds instead (and, once set, Linux uses it
/// for keepalives too: the connection is given up when nothing was heard for that long and a
/// probe went unanswered), so it defaults to `idle + interval × retries`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    pub idle: Duration,
    pub interval: Duration,
    pub retries: u32,
    pub user_timeout: Duration,
}

impl Keepalive {
    /// 10 s idle, then 3 probes 5 s apart: a silent peer is noticed within 25 s.
    pub const DEFAULT: Keepalive =
        Keepalive { idle: Duration::from_secs(10), interval: Duration::from_secs(5), retries: 3, user_timeout: Duration::from_secs(25) };

    /// Settings with the user timeout at `idle + interval × retries` unless one is given;
    /// durations under a second are raised to one (the kernel counts keepalives in seconds).
    pub fn new(idle: Duration, interval: Duration, retries: u32, user_timeout: Option<Duration>) -> Keepalive {
        let second = Duration::from_secs(1);
        let (idle, interval, retries) = (idle.max(second), interval.max(second), retries.max(1));
        Keepalive { idle, interval, retries, user_timeout: user_timeout.unwrap_or(idle + interval * retries).max(second) }
    }

    /// The same limits asked of the server for its end of a connection, as startup options.
    /// The server then ends the backend of a client that vanished (releasing its slot, and for
    /// a listener letting the notification queue move on), and its probes keep a NAT's or a
    /// load balancer's idle timer from expiring. In the units `SHOW` answers with: seconds,
    /// a count, and milliseconds for the user timeout.
    pub fn server_options(&self) -> [(&'static str, String); 4] {
        [
            ("tcp_keepalives_idle", self.idle.as_secs().to_string()),
            ("tcp_keepalives_interval", self.interval.as_secs().to_string()),
            ("tcp_keepalives_count", self.retries.to_string()),
            ("tcp_user_timeout", self.user_timeout.as_millis().to_string()),
        ]
    }
}

impl Default for Keepalive {
    fn default() -> Keepalive {
        Keepalive::DEFAULT
    }
}

/// Where a process listens: a parsed URL and the keepalives of its socket. Its `Debug` never
/// shows the password.
#[derive(Clone)]
pub struct Target {
    config: tokio_postgres::Config,
    /// `host:port/database`, for messages.
    shown: String,
    keepalive: Keepalive,
}

impl Target {
    /// Reads `url` as the pool does, with the default keepalives.
    pub fn parse(url: &str) -> Result<Target, DbError> {
        let opts = crate::db::parse_url(url)?;
        let mut config = tokio_postgres::Config::new();
        let host = match opts.get_socket() {
            Some(dir) => {
                config.host_path(dir);
                dir.display().to_string()
            }
            None => {
                // sqlx keeps an IPv6 address's brackets; a socket address has none.
                let host = opts.get_host().trim_matches(['[', ']']);
                config.host(host);
                host.to_owned()
            }
        };
        config.port(opts.get_port()).user(opts.get_username());
        // sqlx has no getter for the password (from the URL, PGPASSWORD or .pgpass); its URL
        // form carries it, percent-encoded.
        if let Some(password) = opts.to_url_lossy().password() {
            let password = percent_encoding::percent_decode_str(password).decode_utf8().map_err(|e| DbError::BadUrl(e.to_string()))?;
            config.password(password.as_bytes());
        }
        if let Some(db) = opts.get_database() {
            config.dbname(db);
        }
        config.application_name(opts.get_application_name().unwrap_or("shopfloor"));
        if let Some(options) = opts.get_options() {
            config.options(options);
        }
        config.ssl_mode(match opts.get_ssl_mode() {
            PgSslMode::Disable | PgSslMode::Allow | PgSslMode::Prefer => tokio_postgres::config::SslMode::Disable,
            PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull => {
                return Err(DbError::BadUrl("its sslmode requires TLS, which this build does not have for PostgreSQL".into()));
            }
        });
        config.connect_timeout(CONNECT_TIMEOUT);
        let shown = format!("{host}:{}/{}", opts.get_port(), opts.get_database().unwrap_or(opts.get_username()));
        Ok(Target { config, shown, keepalive: Keepalive::DEFAULT })
    }

    pub fn with_keepalive(mut self, keepalive: Keepalive) -> Target {
        self.keepalive = keepalive;
        self
    }

    pub fn keepalive(&self) -> Keepalive {
        self.keepalive
    }

    /// The connection's settings with the keepalives on both ends. The server's go first, so
    /// that options the URL names win.
    fn config(&self) -> tokio_postgres::Config {
        let mut config = self.config.clone();
        let k = self.keepalive;
        config.keepalives(true).keepalives_idle(k.idle).keepalives_interval(k.interval).keepalives_retries(k.retries).tcp_user_timeout(k.user_timeout);
        let mut options: Vec<String> = k.server_options().iter().map(|(name, value)| format!("-c {name}={value}")).collect();
        options.extend(self.config.get_options().map(str::to_owned));
        config.options(options.join(" "));
        config
    }
}

impl FromStr for Target {
    type Err = DbError;

    fn from_str(url: &str) -> Result<Target, DbError> {
        Target::parse(url)
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target").field("at", &self.shown).field("keepalive", &self.keepalive).finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot LISTEN on {target}: {cause}")]
    Connect { target: String, cause: String },
    #[error("the LISTEN connection to {target} was lost: {cause}")]
    Lost { target: String, cause: String },
}

/// What a connection's task tells its listener, tagged with the connection it came from.
struct Message {
    generation: u64,
    kind: Kind,
}

enum Kind {
    Notified(String),
    Lost(String),
}

/// The feed every connection's task writes to.
struct Feed {
    tx: mpsc::UnboundedSender<Message>,
    /// Bumped by each connection made; with at most one at a time, the live one is the last.
    generation: AtomicU64,
}

/// deadpool's way of making a connection: connect, start the task that drives it (forwarding
/// notifications, and the loss), then subscribe.
struct Subscribing {
    feed: Arc<Feed>,
    listen: String,
}

impl deadpool_postgres::Connect for Subscribing {
    fn connect(&self, config: &tokio_postgres::Config) -> BoxFuture<'_, Result<(tokio_postgres::Client, JoinHandle<()>), tokio_postgres::Error>> {
        let config = config.clone();
        Box::pin(async move {
            let (client, mut connection) = config.connect(NoTls).await?;
            let generation = self.feed.generation.fetch_add(1, Ordering::SeqCst) + 1;
            let tx = self.feed.tx.clone();
            let task = tokio::spawn(async move {
                let cause = loop {
                    match poll_fn(|cx| connection.poll_message(cx)).await {
                        Some(Ok(AsyncMessage::Notification(n))) => {
                            let _ = tx.send(Message { generation, kind: Kind::Notified(n.payload().to_owned()) });
                        }
                        Some(Ok(AsyncMessage::Notice(n))) => tracing::info!(notice = %n.message(), "PostgreSQL notice on the LISTEN connection"),
                        Some(Ok(_)) => {}
                        Some(Err(e)) => break with_sources(&e),
                        None => break "the connection was closed".to_owned(),
                    }
                };
                // Closed before the loss is told, so that recycling finds the client closed.
                drop(connection);
                let _ = tx.send(Message { generation, kind: Kind::Lost(cause) });
            });
            client.batch_execute(&self.listen).await?;
            Ok((client, task))
        })
    }
}

/// A process's `LISTEN` connection on one channel: [`subscribe`](Listener::subscribe) connects
/// (when it is not connected), then [`recv`](Listener::recv) hands out the notifications until
/// the connection is lost, after which the caller subscribes again and looks for what it may
/// have missed.
pub struct Listener {
    pool: Pool,
    rx: mpsc::UnboundedReceiver<Message>,
    feed: Arc<Feed>,
    /// The connection while subscribed, with its generation.
    held: Option<(Object, u64)>,
    shown: String,
}

impl Listener {
    /// A listener on `channel` at `target`; nothing connects until [`subscribe`](Listener::subscribe).
    pub fn new(target: &Target, channel: &str) -> Listener {
        let (tx, rx) = mpsc::unbounded_channel();
        let feed = Arc::new(Feed { tx, generation: AtomicU64::new(0) });
        let connect = Subscribing { feed: Arc::clone(&feed), listen: format!(r#"LISTEN "{}""#, channel.replace('"', "\"\"")) };
        let manager = Manager::from_connect(target.config(), connect, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = Pool::builder(manager)
            .max_size(1)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(CONNECT_TIMEOUT))
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .expect("a runtime is given for the timeouts");
        Listener { pool, rx, feed, held: None, shown: target.shown.clone() }
    }

    pub fn is_subscribed(&self) -> bool {
        self.held.is_some()
    }

    /// Connects and subscribes, unless subscribed already. Everything committed after this
    /// returns is notified, so callers look for work only once it has.
    pub async fn subscribe(&mut self) -> Result<(), ListenError> {
        if self.held.is_some() {
            return Ok(());
        }
        match self.pool.get().await {
            Ok(client) => {
                self.held = Some((client, self.feed.generation.load(Ordering::SeqCst)));
                Ok(())
            }
            Err(e) => Err(ListenError::Connect { target: self.shown.clone(), cause: with_sources(&e) }),
        }
    }

    /// The next notification's payload, or the loss of the connection (subscribe again, then
    /// look for what was missed). Pends while not subscribed. Cancel-safe.
    pub async fn recv(&mut self) -> Result<String, ListenError> {
        let Some(generation) = self.held.as_ref().map(|(_, g)| *g) else { return std::future::pending().await };
        loop {
            // Never `None`: the pool's manager keeps a sender.
            let Some(message) = self.rx.recv().await else { return std::future::pending().await };
            // A connection given up earlier: what it says no longer matters.
            if message.generation != generation {
                continue;
            }
            match message.kind {
                Kind::Notified(payload) => return Ok(payload),
                Kind::Lost(cause) => {
                    // Out of the pool and dropped: the next `subscribe` makes a new one.
                    // (Recycling would find it closed and discard it too, with a warning.)
                    if let Some((client, _)) = self.held.take() {
                        drop(Object::take(client));
                    }
                    return Err(ListenError::Lost { target: self.shown.clone(), cause });
                }
            }
        }
    }
}

/// An error with what caused it: tokio-postgres says "error communicating with the server" and
/// keeps the reason (a timeout, a reset) as its source. None of them carries a password.
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.ends_with(&more) {
            text = format!("{text}: {more}");
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_read_as_the_pool_reads_them() {
        let t = Target::parse("postgres://ann:p%40ss%2Fw@db.example:6543/shop?application_name=shopfloor-listen&sslmode=prefer").unwrap();
        let c = &t.config;
        assert_eq!(c.get_hosts(), [tokio_postgres::config::Host::Tcp("db.example".into())]);
        assert_eq!(c.get_ports(), [6543]);
        assert_eq!(c.get_user(), Some("ann"));
        assert_eq!(c.get_password(), Some(&b"p@ss/w"[..]));
        assert_eq!(c.get_dbname(), Some("shop"));
        assert_eq!(c.get_application_name(), Some("shopfloor-listen"));
        assert_eq!(c.get_ssl_mode(), tokio_postgres::config::SslMode::Disable);

        let t = Target::parse("postgres://u@[::1]:5432/d").unwrap();
        assert_eq!(t.config.get_hosts(), [tokio_postgres::config::Host::Tcp("::1".into())]);
        assert_eq!(t.config.get_application_name(), Some("shopfloor"), "named like the pool's connections");
        let t = Target::parse("postgres://u@%2Fvar%2Frun%2Fpostgresql/d").unwrap();
        assert_eq!(t.config.get_hosts(), [tokio_postgres::config::Host::Unix("/var/run/postgresql".into())]);

        assert!(matches!(Target::parse("not a url"), Err(DbError::BadUrl(_))));
        assert!(matches!(Target::parse("postgres://u@h/d?sslmode=require"), Err(DbError::BadUrl(_))), "no TLS in this build: refused, not downgraded");
    }

    #[test]
    fn the_socket_and_the_server_get_the_keepalives_and_the_urls_options_win() {
        let k = Keepalive::new(Duration::from_secs(1), Duration::from_secs(2), 3, None);
        assert_eq!(k.user_timeout, Duration::from_secs(7), "idle + interval × retries");
        let t = Target::parse("postgres://u@h/d?options=-c%20tcp_keepalives_idle%3D60").unwrap().with_keepalive(k);
        let c = t.config();
        assert!(c.get_keepalives());
        assert_eq!(
            (c.get_keepalives_idle(), c.get_keepalives_interval(), c.get_keepalives_retries()),
            (Duration::from_secs(1), Some(Duration::from_secs(2)), Some(3))
        );
        assert_eq!(c.get_tcp_user_timeout(), Some(&Duration::from_secs(7)));
        assert_eq!(
            c.get_options(),
            Some("-c tcp_keepalives_idle=1 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3 -c tcp_user_timeout=7000 -c tcp_keepalives_idle=60")
        );
        assert_eq!(Keepalive::DEFAULT, Keepalive::new(Duration::from_secs(10), Duration::from_secs(5), 3, None));
        // The pool's connections ask the server for the same (sqlx cannot set its sockets').
        for (name, value) in Keepalive::DEFAULT.server_options() {
            assert!(crate::db::GUARDS.contains(&(name, value.as_str())), "{name}={value} is not among db::GUARDS");
        }
    }

    #[test]
    fn a_target_never_shows_its_password() {
        let t = Target::parse("postgres://ann:hunter2@db:5432/shop").unwrap();
        let shown = format!("{t:?}");
        assert!(shown.contains("db:5432/shop") && !shown.contains("hunter2"), "{shown}");
        let e = ListenError::Connect { target: t.shown.clone(), cause: "refused".into() };
        assert!(!e.to_string().contains("hunter2"));
    }
}
