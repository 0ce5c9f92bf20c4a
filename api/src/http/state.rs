//! `AppState`: what every handler shares — the tenant and system pools, and the replica's
//! caches (workflow versions, signing keys), event hub, limits and settings made at start.

use std::sync::Arc;

use engine::db::Db;

use super::event_hub::EventHub;
use super::keys::KeyCache;
use super::limits::{LimitArgs, Limits};

/// What every handler shares: the database pools and the replica's caches and event hub.
#[derive(Clone)]
pub struct AppState {
    /// The tenant pool (`engine::tenancy`): its statements see only the rows of the org the
    /// request acts for (its verified caller's), and none outside a request. Handlers use it.
    pub db: Db,
    /// The pool the state was given, as the tables' owner: only for cross-tenant work (token
    /// verification, webhook ingest, the event hub and the streams' reads, sign-in, health,
    /// metrics). Every query on it filters by org itself.
    pub system: Db,
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(super) catalog: engine::catalog::Catalog,
    pub(super) keys: KeyCache,
    pub(super) events: EventHub,
    /// Cancelled at shutdown: event streams end so that connections can drain.
    pub(super) closing: tokio_util::sync::CancellationToken,
    /// The GitHub App, when configured: hosts' assignments get installation tokens from it.
    pub(super) github: std::sync::OnceLock<Arc<engine::github::GithubApp>>,
    /// GitHub's REST API as people's tokens reach it (`/user/installations`): the console's
    /// `SHOPFLOOR_GITHUB_OAUTH_API_URL` (GitHub's public API unless set at start).
    pub(super) github_user_api: std::sync::OnceLock<String>,
    /// For the calls the API makes to GitHub with a person's token.
    pub(super) http: reqwest::Client,
    /// Seals and opens the signing keys (`SHOPFLOOR_SECRET_KEY`).
    pub(super) secret_key: engine::sealing::SecretKey,
    /// How long a crew step's session may stay silent before a heartbeat fails it `stalled`
    /// (`engine::store::hosts::STALL_AFTER` unless set at start).
    pub(super) stall_after: std::sync::OnceLock<std::time::Duration>,
    /// The abuse limits (`LimitArgs::default()` unless set at start).
    pub(super) limits: std::sync::OnceLock<Arc<Limits>>,
    /// Which targets a webhook subscription may name (only public ones unless set at start).
    pub(super) webhooks: std::sync::OnceLock<engine::net_guard::Policy>,
}

impl AppState {
    /// Builds the state and starts the event hub, whose `LISTEN` connection goes to `listen`
    /// (a direct URL: a transaction pooler cannot LISTEN). `secret_key` seals and
    /// opens the signing keys. Needs a Tokio runtime; the hub stops when the last clone of the
    /// state is dropped.
    pub fn new(db: Db, listen: engine::listen::Target, secret_key: engine::sealing::SecretKey) -> AppState {
        let system = db;
        let db = engine::tenancy::tenant(&system);
        let events = EventHub::start(system.clone(), listen);
        let shared = Shared {
            catalog: engine::catalog::Catalog::default(),
            keys: KeyCache::default(),
            events,
            closing: tokio_util::sync::CancellationToken::new(),
            github: std::sync::OnceLock::new(),
            github_user_api: std::sync::OnceLock::new(),
            // GitHub's API refuses a request without a User-Agent.
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(std::time::Duration::from_secs(10))
                .user_agent(engine::github::USER_AGENT)
                .build()
                .unwrap_or_default(),
            secret_key,
            stall_after: std::sync::OnceLock::new(),
            limits: std::sync::OnceLock::new(),
            webhooks: std::sync::OnceLock::new(),
        };
        AppState { db, system, shared: Arc::new(shared) }
    }

    /// Mints installation tokens for hosts' assignments with this App (set once, at start).
    pub fn use_github_app(&self, app: Arc<engine::github::GithubApp>) {
        // Set once by the process that builds the state; a second call changes nothing.
        let _ = self.shared.github.set(app);
    }

    /// Where people's GitHub tokens are checked (set once, at start).
    pub fn use_github_user_api(&self, url: &str) {
        let _ = self.shared.github_user_api.set(url.trim_end_matches('/').to_owned());
    }

    pub(crate) fn github_user_api(&self) -> &str {
        self.shared.github_user_api.get().map_or(engine::github::client::PUBLIC_API, String::as_str)
    }

    /// Sets how long a crew step's session may stay silent (set once, at start).
    pub fn use_stall_after(&self, after: std::time::Duration) {
        let _ = self.shared.stall_after.set(after);
    }

    /// The key that seals the signing keys: issuing a token needs it.
    pub fn secret_key(&self) -> &engine::sealing::SecretKey {
        &self.shared.secret_key
    }

    pub(crate) fn stall_after(&self) -> std::time::Duration {
        self.shared.stall_after.get().copied().unwrap_or(engine::store::hosts::STALL_AFTER)
    }

    /// Sets the abuse limits (once, at start, before the routers are built: they take the
    /// limits then). A second call changes nothing.
    pub fn use_limits(&self, args: &LimitArgs) {
        let _ = self.shared.limits.set(Arc::new(Limits::new(args)));
    }

    /// The abuse limits in force.
    pub fn limits(&self) -> Arc<Limits> {
        self.shared.limits.get_or_init(|| Arc::new(Limits::new(&LimitArgs::default()))).clone()
    }

    /// Sets which targets webhook subscriptions may name (set once, at start:
    /// `SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE`; tests that deliver to loopback receivers set it too).
    pub fn use_webhook_policy(&self, policy: engine::net_guard::Policy) {
        let _ = self.shared.webhooks.set(policy);
    }

    pub(crate) fn webhook_policy(&self) -> engine::net_guard::Policy {
        self.shared.webhooks.get().copied().unwrap_or_default()
    }

    /// Ends every open event stream (at shutdown).
    pub fn close_streams(&self) {
        self.shared.closing.cancel();
    }
}
