//! The long-running processes: `serve`, `api`, `engine`, and `migrate`.

use std::time::Duration;

use engine::executor::TestExecutor;
use engine::pool::PoolConfig;
use engine::sealing::SecretKey;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::args::{ApiArgs, EngineArgs, GithubAppArgs, MigrateArgs, PoolArgs, ServeArgs, ServerArgs, WebhooksArgs};
use super::database::Database;
use super::error::CliError;
use super::secret_key;
use crate::http::{self, AppState};

/// Applies the migrations, then seals the signing keys an earlier release stored in plaintext
/// when the secret key is at hand (without it, `serve` and `api` seal them at start).
pub(super) async fn migrate(args: MigrateArgs) -> Result<(), CliError> {
    let key = args.secret_key.find(&args.db)?;
    let db = Database::open(&args.db, 2).await?;
    let result = async {
        db.migrate().await?;
        match &key {
            Some(key) => secret_key::prepare(&db.pool, key).await,
            None => Ok(()),
        }
    }
    .await;
    db.close().await;
    result?;
    eprintln!("schema is at migration {}", engine::db::code_version());
    Ok(())
}

pub(super) async fn serve(ServeArgs { server: args, pool: pool_args }: ServeArgs) -> Result<(), CliError> {
    // Bind first: a port in use should fail before anything else starts.
    let listener = bind(&args.listen.listen, "SHOPFLOOR_LISTEN").await?;
    let key = args.secret_key.require(&args.db)?;
    let webhooks = webhook_client(&args.webhooks, &key)?;
    let db = Database::open(&args.db, pool_args.db_connections + 8).await?;
    let prepared = async {
        db.migrate().await?;
        secret_key::prepare(&db.pool, &key).await
    };
    if let Err(e) = prepared.await {
        db.close().await;
        return Err(e);
    }
    let app = match github_app(&args.github_app) {
        Ok(a) => a,
        Err(e) => {
            db.close().await;
            return Err(e);
        }
    };
    let listen = match args.db.listen.target(&db.url) {
        Ok(l) => l,
        Err(e) => {
            db.close().await;
            return Err(e);
        }
    };
    let outputs = app.clone().map(|a| engine::github::OutputExecutor::new(a, args.github_app.test_crash_after.clone()));
    let (drain, abort) = host::process::shutdown_signals();
    let cfg = pool_config(&pool_args, listen.clone(), outputs, webhooks);
    let settings = HttpSettings::of(&args);
    let server = tokio::spawn(serve_http(
        listener,
        db.pool.clone(),
        listen,
        key,
        drain.clone(),
        args.github.webhook_secret.clone(),
        args.console.clone(),
        app,
        settings,
    ));
    let pool = tokio::spawn(engine::pool::run(db.pool.clone(), cfg, drain.clone(), abort.clone()));
    tracing::info!(listen = %args.listen.listen, "shopfloor is serving");
    let (served, pooled) = tokio::join!(server, pool);
    db.close().await;
    served.map_err(CliError::msg)??;
    pooled.map_err(CliError::msg)?.map_err(CliError::msg)
}

pub(super) async fn api(ApiArgs { server: args }: ApiArgs) -> Result<(), CliError> {
    let listener = bind(&args.listen.listen, "SHOPFLOOR_LISTEN").await?;
    let key = args.secret_key.require(&args.db)?;
    let db = Database::open_migrated(&args.db, 16).await?;
    let url = db.url.clone();
    let (db, (app, listen)) = db.or_close(|| Ok((github_app(&args.github_app)?, args.db.listen.target(&url)?))).await?;
    if let Err(e) = secret_key::prepare(&db.pool, &key).await {
        db.close().await;
        return Err(e);
    }
    let (drain, _abort) = host::process::shutdown_signals();
    let settings = HttpSettings::of(&args);
    let served = serve_http(listener, db.pool.clone(), listen, key, drain, args.github.webhook_secret.clone(), args.console.clone(), app, settings).await;
    db.close().await;
    served
}

pub(super) async fn engine(args: EngineArgs) -> Result<(), CliError> {
    // Bind first, like the HTTP server: a port in use fails before anything starts.
    let metrics = match &args.metrics_addr {
        Some(addr) => Some(bind(addr, "SHOPFLOOR_METRICS_ADDR").await?),
        None => None,
    };
    let key = args.secret_key.require(&args.db)?;
    let webhooks = webhook_client(&args.webhooks, &key)?;
    let db = Database::open_migrated(&args.db, args.pool.db_connections).await?;
    if let Err(e) = secret_key::prepare(&db.pool, &key).await {
        db.close().await;
        return Err(e);
    }
    let url = db.url.clone();
    let (db, (outputs, listen)) = db.or_close(|| Ok((github_outputs(&args.github_app)?, args.db.listen.target(&url)?))).await?;
    let (drain, abort) = host::process::shutdown_signals();
    if let Some(listener) = metrics {
        tokio::spawn(serve_metrics(listener, db.pool.clone(), drain.clone()));
    }
    let cfg = pool_config(&args.pool, listen, outputs, webhooks);
    tracing::info!(engine.id = %cfg.id, test_executor = cfg.test_executor.is_some(), "engine started");
    if cfg.test_executor.is_none() && cfg.outputs.is_none() {
        tracing::info!("output steps wait: no GitHub App is configured (SHOPFLOOR_GITHUB_APP_ID and its key)");
    }
    let result = engine::pool::run(db.pool.clone(), cfg, drain, abort).await;
    db.close().await;
    result.map_err(CliError::msg)
}

/// The output executor, when the GitHub App is configured. An App id without a key, or a key
/// that does not load, stops the process: outputs would otherwise wait forever unexplained.
fn github_outputs(args: &GithubAppArgs) -> Result<Option<engine::github::OutputExecutor>, CliError> {
    Ok(github_app(args)?.map(|app| engine::github::OutputExecutor::new(app, args.test_crash_after.clone())))
}

/// The GitHub App, when configured (outputs; installation tokens for hosts' assignments).
pub(super) fn github_app(args: &GithubAppArgs) -> Result<Option<std::sync::Arc<engine::github::GithubApp>>, CliError> {
    let Some(app_id) = args.app_id else { return Ok(None) };
    let key = match (&args.key_file, &args.key) {
        (Some(path), _) => std::fs::read_to_string(path)
            .map(secrecy::SecretString::from)
            .map_err(|e| CliError::Failed(format!("cannot read SHOPFLOOR_GITHUB_APP_KEY_FILE {}: {e}", path.display())))?,
        (None, Some(key)) => key.clone(),
        (None, None) => {
            return Err(CliError::Failed(
                "SHOPFLOOR_GITHUB_APP_ID is set but no key: set SHOPFLOOR_GITHUB_APP_KEY_FILE (or SHOPFLOOR_GITHUB_APP_KEY) to the App's private key, PEM"
                    .into(),
            ));
        }
    };
    let settings = engine::github::AppSettings {
        app_id,
        private_key: key,
        api_url: args.api_url.clone(),
        graphql_url: args.graphql_url.clone(),
        timeout: Duration::from_secs(args.timeout_secs.max(1)),
        backoff: Duration::from_secs(1),
    };
    let app = engine::github::GithubApp::new(settings).map_err(CliError::msg)?;
    tracing::info!(github.app_id = app_id, github.api = %args.api_url, "GitHub App configured");
    Ok(Some(std::sync::Arc::new(app)))
}

/// The engine's webhook delivery client, with the policy of `SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE`
/// and the secret key that opens the subscriptions' secrets.
fn webhook_client(args: &WebhooksArgs, key: &SecretKey) -> Result<engine::jobs::WebhookClient, CliError> {
    engine::jobs::WebhookClient::new(args.policy(), key.clone()).map_err(|e| CliError::Failed(format!("cannot build the webhook delivery client: {e}")))
}

fn pool_config(
    args: &PoolArgs, listen: engine::listen::Target, outputs: Option<engine::github::OutputExecutor>, webhooks: engine::jobs::WebhookClient,
) -> PoolConfig {
    let id = args.engine_id.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_owned()).unwrap_or_else(|_| "engine".into());
        format!("{host}-{}", std::process::id())
    });
    PoolConfig {
        id,
        listen,
        batch: args.batch.max(1),
        max_in_flight: args.max_in_flight.max(1),
        drain: Duration::from_secs(args.drain_secs),
        test_executor: args.test_executor.then(|| TestExecutor { effects: args.test_effects.clone() }),
        outputs,
        webhooks,
        event_wait_timeout: Duration::from_secs(args.event_wait_timeout_secs),
    }
}

/// What `serve` and `api` tell the HTTP server's state besides its connections.
struct HttpSettings {
    /// How long a crew step's session may stay silent (`SHOPFLOOR_STALL_SECS`).
    stall_after: Duration,
    /// Which targets a webhook subscription may name (`SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE`).
    webhooks: engine::net_guard::Policy,
    /// The abuse limits (`SHOPFLOOR_RATE_*`, `SHOPFLOOR_REQUEST_TIMEOUT_SECS`, …).
    limits: http::limits::LimitArgs,
}

impl HttpSettings {
    fn of(args: &ServerArgs) -> HttpSettings {
        HttpSettings { stall_after: Duration::from_secs(args.hosts.stall_secs.max(1)), webhooks: args.webhooks.policy(), limits: args.limits.clone() }
    }
}

/// Binds `addr`; a failure names the setting (`var`) to change.
async fn bind(addr: &std::net::SocketAddr, var: &str) -> Result<TcpListener, CliError> {
    TcpListener::bind(addr).await.map_err(|e| {
        let why = match e.kind() {
            std::io::ErrorKind::AddrInUse => format!("the address is in use; stop the other server or set {var} to another address"),
            std::io::ErrorKind::PermissionDenied => format!("permission denied; use a port above 1023 in {var}"),
            _ => e.to_string(),
        };
        CliError::Failed(format!("cannot listen on {addr}: {why}"))
    })
}

/// The whole app of `serve` and `api`: the REST API, the webhooks and the console, counted by
/// the metrics middleware. Serve it with connect info (`into_make_service_with_connect_info`)
/// so that the per-address limits know each request's peer; set the state's limits first.
pub fn app(state: &AppState, webhook_secret: Option<secrecy::SecretString>, console: crate::console::ConsoleConfig) -> axum::Router {
    let tls = http::harden::Tls(console.public_url.as_deref().is_some_and(|u| u.starts_with("https://")));
    // The webhooks need the App's secret, which the REST router's state does not carry.
    http::router(state.clone())
        .merge(crate::webhooks::router(crate::webhooks::WebhookState::new(state.system.clone(), webhook_secret).with_limits(state.limits())))
        .merge(crate::console::router(state.clone(), console))
        // Around every route (so the matched route is known): requests by route and status.
        .layer(axum::middleware::from_fn(http::metrics::track))
        // Outermost: every answer, a rejection or a fallback's too, gets the headers.
        .layer(axum::middleware::from_fn_with_state(tls, http::harden::harden))
}

/// Serves the app; its event hub LISTENs on `listen`.
#[expect(clippy::too_many_arguments, reason = "the settings of `serve` and `api`, passed once")]
async fn serve_http(
    listener: TcpListener, db: engine::db::Db, listen: engine::listen::Target, secret_key: engine::sealing::SecretKey, drain: CancellationToken,
    webhook_secret: Option<secrecy::SecretString>, console: crate::console::ConsoleConfig, github: Option<std::sync::Arc<engine::github::GithubApp>>,
    settings: HttpSettings,
) -> Result<(), CliError> {
    let state = AppState::new(db, listen, secret_key);
    state.use_stall_after(settings.stall_after);
    state.use_webhook_policy(settings.webhooks);
    // Before the routers are built: they take the limits with them.
    state.use_limits(&settings.limits);
    if let Some(app) = github {
        state.use_github_app(app);
    }
    let app = app(&state, webhook_secret, console);
    // Event streams never end by themselves: close them, or the shutdown would wait forever.
    let shutdown = async move {
        drain.cancelled().await;
        state.close_streams();
    };
    // With the peer's address in each request (the per-address limits count by it), and a
    // bound on reading each request's head.
    http::serve::serve(listener, app, shutdown).await;
    Ok(())
}

/// An engine's `--metrics-addr` listener: `GET /metrics` and nothing else, until the drain.
async fn serve_metrics(listener: TcpListener, db: engine::db::Db, drain: CancellationToken) {
    let app = axum::Router::new().route(
        http::metrics::PATH,
        axum::routing::get(move || {
            let db = db.clone();
            async move { http::metrics::answer(engine::metrics::render(Some(&db)).await) }
        }),
    );
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(drain.cancelled_owned()).await {
        tracing::error!(error = %e, "the metrics listener stopped");
    }
}
