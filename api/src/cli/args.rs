//! The flags and variables of the server's processes (`serve`, `api`, `engine`, `migrate`,
//! `admin`, `check`): one struct per group, flattened into each command that takes it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use engine::listen::{Keepalive, Target};
use secrecy::SecretString;

use super::error::CliError;

/// Where the database is.
#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// PostgreSQL URL. Unset: the embedded cluster in SHOPFLOOR_DATA_DIR is used, started if
    /// needed.
    #[arg(long = "database-url", env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Where the embedded PostgreSQL cluster lives (in `pg/` under it).
    #[arg(long = "data-dir", env = "SHOPFLOOR_DATA_DIR", default_value = ".shopfloor")]
    pub data_dir: PathBuf,
    #[command(flatten)]
    pub listen: ListenDbArgs,
}

impl DbArgs {
    /// How the pools reach the server: a `DATABASE_URL` beside a direct
    /// `SHOPFLOOR_LISTEN_DATABASE_URL` is taken to be a transaction pooler (the only reason to
    /// give both), and its pools are made safe behind one (`engine::db::Route::Pooler`).
    pub fn route(&self) -> engine::db::Route {
        let given = |u: &Option<String>| u.as_deref().is_some_and(|u| !u.trim().is_empty());
        if given(&self.database_url) && given(&self.listen.listen_database_url) { engine::db::Route::Pooler } else { engine::db::Route::Direct }
    }
}

#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub secret_key: SecretKeyArgs,
}

/// What the host protocol enforces on the hosts' steps.
#[derive(Debug, Clone, Args)]
pub struct HostsArgs {
    /// Seconds a crew step's session may stay silent before its next heartbeat fails it
    /// `stalled` (an infrastructure failure: retried).
    #[arg(long = "stall-secs", env = "SHOPFLOOR_STALL_SECS", default_value_t = 600)]
    pub stall_secs: u64,
}

/// Where outgoing webhooks may send: `SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE` (false: only public
/// addresses). Read by the API (a subscription's URL is checked when it is made) and by the
/// engines (again at each send, after DNS resolution), so set it alike on both.
#[derive(Debug, Clone, Args)]
pub struct WebhooksArgs {
    /// Let outgoing webhooks reach loopback, private (RFC 1918, fc00::/7) and carrier-grade
    /// NAT addresses and local names: for on-premises installs and tests. Link-local, cloud
    /// metadata, unspecified, multicast and reserved addresses stay refused.
    #[arg(long = "webhooks-allow-private", env = "SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE", default_value_t = false)]
    pub allow_private: bool,
}

impl WebhooksArgs {
    pub fn policy(&self) -> engine::net_guard::Policy {
        engine::net_guard::Policy { allow_private: self.allow_private }
    }
}

#[derive(Debug, Clone, Args)]
pub struct ListenArgs {
    /// Address the HTTP server listens on.
    #[arg(long = "listen", env = "SHOPFLOOR_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
}

/// Where a process `LISTEN`s: the engine's wake-ups, a replica's event hub and hosts' claims.
/// `SHOPFLOOR_LISTEN_DATABASE_URL` (default: `DATABASE_URL`), and the TCP keepalives of that
/// connection's socket, which notice a network cut that drops packets without closing it:
/// `SHOPFLOOR_LISTEN_KEEPALIVE_IDLE_SECS` (10), `SHOPFLOOR_LISTEN_KEEPALIVE_INTERVAL_SECS` (5),
/// `SHOPFLOOR_LISTEN_KEEPALIVE_RETRIES` (3) and `SHOPFLOOR_LISTEN_TCP_USER_TIMEOUT_SECS`
/// (idle + interval × retries: 25 s).
#[derive(Debug, Clone, Args)]
pub struct ListenDbArgs {
    /// A direct URL for the LISTEN connection (a transaction pooler such as PgBouncer cannot
    /// LISTEN), and for migrations. Defaults to DATABASE_URL; when given, DATABASE_URL is taken
    /// to be a transaction pooler.
    #[arg(long = "listen-database-url", env = "SHOPFLOOR_LISTEN_DATABASE_URL", hide_env_values = true)]
    pub listen_database_url: Option<String>,
    /// Seconds without traffic on the LISTEN connection before the first keepalive probe.
    #[arg(long = "listen-keepalive-idle-secs", env = "SHOPFLOOR_LISTEN_KEEPALIVE_IDLE_SECS", default_value_t = Keepalive::DEFAULT.idle.as_secs())]
    pub keepalive_idle_secs: u64,
    /// Seconds between unanswered keepalive probes.
    #[arg(long = "listen-keepalive-interval-secs", env = "SHOPFLOOR_LISTEN_KEEPALIVE_INTERVAL_SECS", default_value_t = Keepalive::DEFAULT.interval.as_secs())]
    pub keepalive_interval_secs: u64,
    /// Unanswered probes after which the connection is given up, reconnected, and work
    /// looked for once.
    #[arg(long = "listen-keepalive-retries", env = "SHOPFLOOR_LISTEN_KEEPALIVE_RETRIES", default_value_t = Keepalive::DEFAULT.retries)]
    pub keepalive_retries: u32,
    /// Seconds sent data may stay unacknowledged (and, on Linux, the connection silent once
    /// a probe went) before the connection is given up. Default: idle + interval × retries.
    #[arg(long = "listen-tcp-user-timeout-secs", env = "SHOPFLOOR_LISTEN_TCP_USER_TIMEOUT_SECS")]
    pub tcp_user_timeout_secs: Option<u64>,
}

impl ListenDbArgs {
    /// The direct URL: the one given, else the database's.
    pub fn url(&self, database_url: &str) -> String {
        self.listen_database_url.clone().unwrap_or_else(|| database_url.to_owned())
    }

    /// Where to LISTEN: the direct URL when given, else the database's, with the keepalives.
    pub fn target(&self, database_url: &str) -> Result<Target, CliError> {
        let (url, var) = match &self.listen_database_url {
            Some(url) => (url.as_str(), "SHOPFLOOR_LISTEN_DATABASE_URL"),
            None => (database_url, "DATABASE_URL"),
        };
        let target = Target::parse(url).map_err(|e| CliError::Failed(format!("{var}: {e}")))?;
        let secs = Duration::from_secs;
        Ok(target.with_keepalive(Keepalive::new(
            secs(self.keepalive_idle_secs),
            secs(self.keepalive_interval_secs),
            self.keepalive_retries,
            self.tcp_user_timeout_secs.map(secs),
        )))
    }
}

#[derive(Debug, Clone, Args)]
pub struct PoolArgs {
    /// This engine's id in leases and the audit log. Defaults to `<hostname>-<pid>`.
    #[arg(long = "engine-id", env = "SHOPFLOOR_ENGINE_ID")]
    pub engine_id: Option<String>,
    /// Seconds the first SIGTERM waits for held steps before the process exits.
    #[arg(long = "drain-secs", env = "SHOPFLOOR_DRAIN_SECS", default_value_t = 30)]
    pub drain_secs: u64,
    /// Wakes claimed per transaction.
    #[arg(long = "batch", env = "SHOPFLOOR_ENGINE_BATCH", default_value_t = 64)]
    pub batch: i64,
    /// Steps this engine executes at once.
    #[arg(long = "max-in-flight", env = "SHOPFLOOR_ENGINE_MAX_IN_FLIGHT", default_value_t = 256)]
    pub max_in_flight: usize,
    /// Run crew, gate and output steps with the no-op test executor instead of waiting for
    /// hosts and integrations. For tests and benchmarks only.
    #[arg(long = "test-executor", env = "SHOPFLOOR_TEST_EXECUTOR", default_value_t = false)]
    pub test_executor: bool,
    /// With --test-executor: append one line per executed step to this file.
    #[arg(long = "test-effects", env = "SHOPFLOOR_TEST_EFFECTS")]
    pub test_effects: Option<PathBuf>,
    /// Database connections of this process's pool.
    #[arg(long = "db-connections", env = "SHOPFLOOR_DB_CONNECTIONS", default_value_t = 8)]
    pub db_connections: u32,
    /// Seconds an event wait (`wait: { event: … }`) without a `timeout:` waits before it
    /// resolves with `timed_out: true` (a day).
    #[arg(long = "event-wait-timeout-secs", env = "SHOPFLOOR_EVENT_WAIT_TIMEOUT_SECS", default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..))]
    pub event_wait_timeout_secs: u64,
}

/// The GitHub App's webhook settings: `SHOPFLOOR_GITHUB_WEBHOOK_SECRET` (no default; until it
/// is set, `POST /webhooks/github` answers 503).
#[derive(Debug, Clone, Args)]
pub struct GithubArgs {
    /// The GitHub App's webhook secret, which signs every delivery (X-Hub-Signature-256).
    #[arg(long = "github-webhook-secret", env = "SHOPFLOOR_GITHUB_WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<secrecy::SecretString>,
}

/// The GitHub App the engines act as for output steps (pull requests, comments, labels, board
/// moves): `SHOPFLOOR_GITHUB_APP_ID` and its private key, PEM, from
/// `SHOPFLOOR_GITHUB_APP_KEY_FILE` or `SHOPFLOOR_GITHUB_APP_KEY`; `SHOPFLOOR_GITHUB_API_URL`
/// (default `https://api.github.com`; a GitHub Enterprise `https://HOST/api/v3`);
/// `SHOPFLOOR_GITHUB_GRAPHQL_URL` (default `<api url>/graphql`); `SHOPFLOOR_GITHUB_TIMEOUT_SECS`
/// (10). Without an App id and key, output steps wait (or go to the test executor).
#[derive(Debug, Clone, Args)]
pub struct GithubAppArgs {
    /// The GitHub App's id.
    #[arg(long = "github-app-id", env = "SHOPFLOOR_GITHUB_APP_ID")]
    pub app_id: Option<u64>,
    /// A file holding the App's private key (PEM).
    #[arg(long = "github-app-key-file", env = "SHOPFLOOR_GITHUB_APP_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// The App's private key itself (PEM), when no key file is given.
    #[arg(long = "github-app-key", env = "SHOPFLOOR_GITHUB_APP_KEY", hide_env_values = true)]
    pub key: Option<secrecy::SecretString>,
    /// GitHub's REST API base URL.
    #[arg(long = "github-api-url", env = "SHOPFLOOR_GITHUB_API_URL", default_value = engine::github::client::PUBLIC_API)]
    pub api_url: String,
    /// GitHub's GraphQL endpoint (Projects v2 board moves).
    #[arg(long = "github-graphql-url", env = "SHOPFLOOR_GITHUB_GRAPHQL_URL")]
    pub graphql_url: Option<String>,
    /// Seconds one GitHub request may take.
    #[arg(long = "github-timeout-secs", env = "SHOPFLOOR_GITHUB_TIMEOUT_SECS", default_value_t = 10)]
    pub timeout_secs: u64,
    /// Test hook: abort the process right after an output's effect on GitHub, before the step
    /// is recorded (`pr_opened`, `comment_posted`). Never set it in production.
    #[arg(long = "test-crash-after", env = "SHOPFLOOR_TEST_CRASH_AFTER", hide = true)]
    pub test_crash_after: Option<String>,
}

/// What `serve` and `api` share: the HTTP server with its database, secret key and address,
/// GitHub (webhooks and the App, which mints the installation tokens hosts' assignments carry),
/// the console, hosts, the abuse limits and outgoing webhooks.
#[derive(Debug, Args)]
pub struct ServerArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub secret_key: SecretKeyArgs,
    #[command(flatten)]
    pub listen: ListenArgs,
    #[command(flatten)]
    pub github: GithubArgs,
    #[command(flatten)]
    pub github_app: GithubAppArgs,
    #[command(flatten)]
    pub console: crate::console::ConsoleConfig,
    #[command(flatten)]
    pub hosts: HostsArgs,
    #[command(flatten)]
    pub limits: crate::http::limits::LimitArgs,
    #[command(flatten)]
    pub webhooks: WebhooksArgs,
}

/// `serve`: the server and the engine's pool in one process.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub pool: PoolArgs,
}

/// `api`: the server alone.
#[derive(Debug, Args)]
pub struct ApiArgs {
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Args)]
pub struct EngineArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Opens the webhook subscriptions' secrets, to sign deliveries.
    #[command(flatten)]
    pub secret_key: SecretKeyArgs,
    #[command(flatten)]
    pub pool: PoolArgs,
    #[command(flatten)]
    pub github_app: GithubAppArgs,
    #[command(flatten)]
    pub webhooks: WebhooksArgs,
    /// Serve `GET /metrics` (Prometheus) on this address; nothing else is served there.
    /// Unset (the default): the engine listens on no port.
    #[arg(long = "metrics-addr", env = "SHOPFLOOR_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
}

/// The key that seals the signing keys and the webhook secrets: `SHOPFLOOR_SECRET_KEY` (no
/// default on a `DATABASE_URL`; with the embedded cluster, `SHOPFLOOR_DATA_DIR/secret-key`,
/// made on first need).
#[derive(Debug, Clone, Args)]
pub struct SecretKeyArgs {
    /// The key that seals the JWT signing keys and the outgoing webhook secrets at rest: 32
    /// random bytes in base64 (`openssl rand -base64 32`), the same on every process of one
    /// database. Unset with the embedded cluster: SHOPFLOOR_DATA_DIR/secret-key, made on first
    /// need.
    #[arg(long = "secret-key", env = "SHOPFLOOR_SECRET_KEY", hide_env_values = true)]
    pub secret_key: Option<SecretString>,
}
