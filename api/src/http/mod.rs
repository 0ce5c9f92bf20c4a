//! The HTTP surface: the axum router, built from one list of documented routes.
//!
//! Every route of the REST API is registered through utoipa-axum's `routes!`, so the OpenAPI
//! document (`openapi()`, served at `/api/v1/openapi.json` and kept in `openapi/openapi.json`)
//! cannot miss one. Handlers get their caller and tenant from extractors (`auth`, `tenant`),
//! parse input with extractors whose rejection is an `ApiError` (`extract`), read with plain
//! SQL filtered by org, and write only through `engine::store`.
//!
//! - `error` — `ApiError` and problem+json; 5xx causes logged once by `log_failures`.
//! - `auth` — bearer-token verification and roles; `tenant` — org and project scopes.
//! - `extract` — JSON, YAML, path, query and `Idempotency-Key` extractors.
//! - `page` — keyset cursors; `idempotency` — replaying create-POSTs.
//! - `events` — the replica's event hub (one `LISTEN`) and the SSE stream.
//! - `members`, `tokens`, `projects`, `repositories`, `workflows`, `runs`, `hosts`, `audit` — the resources.
//! - `host_protocol` — what `shopfloor host` calls: register, claim (a long poll), start,
//!   heartbeat, session reports, complete, a held step's fresh installation token, messages
//!   acknowledged.
//! - `messages` — intervene: a person's message to a live crew session.
//! - `admission`, `budgets`, `webhooks_out`, `operator` — the org's cap, project pause and
//!   retention; budgets and spend; outgoing webhooks with their delivery log and replay;
//!   resolving a failed run, cycle-budget asks and their reset.
//! - `metrics` — `GET /metrics` (unauthenticated, not in the document) and the middleware
//!   counting requests by route template and status.
//! - `openapi` — the document's header, security scheme and shared problem responses.
//! - `limits` — abuse limits: rates per token and per address, open event streams per token,
//!   the request timeout, bodies refused by their declared length.

pub mod admission;
pub mod audit;
pub mod auth;
pub mod budgets;
pub mod error;
pub mod events;
pub mod extract;
pub mod health;
pub mod host_protocol;
pub mod hosts;
pub mod idempotency;
pub mod installations;
pub mod limits;
pub mod members;
pub mod messages;
pub mod metrics;
pub mod openapi;
pub mod operator;
pub mod page;
pub mod projects;
pub mod repositories;
pub mod runs;
pub mod tenant;
pub mod tokens;
pub mod webhooks_out;
pub mod workflows;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::Router;
use engine::db::Db;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use error::{problem, ApiError, Problem};

/// Request bodies above this are refused with 413 (webhooks, which get GitHub's 25 MB, are
/// routed apart).
pub const BODY_LIMIT: usize = 1 << 20;

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
    catalog: engine::catalog::Catalog,
    keys: auth::KeyCache,
    events: events::EventHub,
    /// Cancelled at shutdown: event streams end so that connections can drain.
    closing: tokio_util::sync::CancellationToken,
    /// The GitHub App, when configured: hosts' assignments get installation tokens from it.
    github: std::sync::OnceLock<Arc<engine::github::GithubApp>>,
    /// GitHub's REST API as people's tokens reach it (`/user/installations`): the console's
    /// `SHOPFLOOR_GITHUB_OAUTH_API_URL` (GitHub's public API unless set at start).
    github_user_api: std::sync::OnceLock<String>,
    /// For the calls the API makes to GitHub with a person's token.
    http: reqwest::Client,
    /// Seals and opens the signing keys (`SHOPFLOOR_SECRET_KEY`).
    secret_key: engine::sealing::SecretKey,
    /// How long a crew step's session may stay silent before a heartbeat fails it `stalled`
    /// (`engine::store::hosts::STALL_AFTER` unless set at start).
    stall_after: std::sync::OnceLock<std::time::Duration>,
    /// The abuse limits (`limits::LimitArgs::default()` unless set at start).
    limits: std::sync::OnceLock<Arc<limits::Limits>>,
    /// Which targets a webhook subscription may name (only public ones unless set at start).
    webhooks: std::sync::OnceLock<engine::net_guard::Policy>,
}

impl AppState {
    /// Builds the state and starts the event hub, whose `LISTEN` connection goes to `listen`
    /// (a direct URL: a transaction pooler cannot LISTEN). `secret_key` seals and
    /// opens the signing keys. Needs a Tokio runtime; the hub stops when the last clone of the
    /// state is dropped.
    pub fn new(db: Db, listen: engine::listen::Target, secret_key: engine::sealing::SecretKey) -> AppState {
        let system = db;
        let db = engine::tenancy::tenant(&system);
        let events = events::EventHub::start(system.clone(), listen);
        let shared = Shared {
            catalog: engine::catalog::Catalog::default(),
            keys: auth::KeyCache::default(),
            events,
            closing: tokio_util::sync::CancellationToken::new(),
            github: std::sync::OnceLock::new(),
            github_user_api: std::sync::OnceLock::new(),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(std::time::Duration::from_secs(10))
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
    pub fn use_limits(&self, args: &limits::LimitArgs) {
        let _ = self.shared.limits.set(Arc::new(limits::Limits::new(args)));
    }

    /// The abuse limits in force.
    pub fn limits(&self) -> Arc<limits::Limits> {
        self.shared.limits.get_or_init(|| Arc::new(limits::Limits::new(&limits::LimitArgs::default()))).clone()
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

/// The documented routes; `router` serves them and `openapi` describes them.
pub fn api_router() -> OpenApiRouter<AppState> {
    let v1 = OpenApiRouter::new()
        .routes(routes!(members::list, members::add))
        .routes(routes!(members::change_role, members::remove))
        .routes(routes!(tokens::list, tokens::create))
        .routes(routes!(tokens::revoke))
        .routes(routes!(projects::list, projects::create))
        .routes(routes!(projects::get))
        .routes(routes!(repositories::list, repositories::connect))
        .routes(routes!(installations::list, installations::claim))
        .routes(routes!(installations::release))
        .routes(routes!(audit::org_log))
        .routes(routes!(audit::project_log))
        .routes(routes!(workflows::list, workflows::create))
        .routes(routes!(workflows::validate))
        .routes(routes!(workflows::get, workflows::put))
        .routes(routes!(workflows::versions))
        .routes(routes!(workflows::version))
        .routes(routes!(workflows::pause))
        .routes(routes!(workflows::unpause))
        .routes(routes!(runs::read::list, runs::act::submit))
        .routes(routes!(runs::read::get))
        .routes(routes!(runs::read::why))
        .routes(routes!(runs::act::cancel))
        .routes(routes!(runs::act::retry))
        .routes(routes!(runs::act::rerun))
        .routes(routes!(runs::history::events))
        .routes(routes!(runs::answers::approve))
        .routes(routes!(runs::answers::reject))
        .routes(routes!(runs::history::step_logs))
        .routes(routes!(messages::send))
        .routes(routes!(hosts::list))
        .routes(routes!(hosts::register))
        .routes(routes!(hosts::deregister))
        .routes(routes!(hosts::drain))
        .routes(routes!(hosts::undrain))
        .routes(routes!(events::stream))
        .routes(routes!(admission::get_limits, admission::set_limits))
        .routes(routes!(admission::get_settings))
        .routes(routes!(admission::set_retention))
        .routes(routes!(admission::pause))
        .routes(routes!(admission::unpause))
        .routes(routes!(admission::set_board_limit))
        .routes(routes!(budgets::list))
        .routes(routes!(budgets::set_org, budgets::remove_org))
        .routes(routes!(budgets::list_project))
        .routes(routes!(budgets::set_project, budgets::remove_project))
        .routes(routes!(budgets::spend))
        .routes(routes!(webhooks_out::list, webhooks_out::create))
        .routes(routes!(webhooks_out::delete))
        .routes(routes!(webhooks_out::deliveries))
        .routes(routes!(webhooks_out::delivery))
        .routes(routes!(webhooks_out::replay))
        .routes(routes!(operator::resolve))
        .routes(routes!(operator::cycle_asks))
        .routes(routes!(operator::reset))
        .routes(routes!(host_protocol::register))
        .routes(routes!(host_protocol::claim::claim))
        .routes(routes!(host_protocol::held::start))
        .routes(routes!(host_protocol::held::heartbeat))
        .routes(routes!(host_protocol::held::session))
        .routes(routes!(host_protocol::held::complete))
        .routes(routes!(host_protocol::held::messages_delivered))
        .routes(routes!(host_protocol::held::token));
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(health::openapi_json))
        .nest("/api/v1", v1)
}

/// The OpenAPI 3.1 document of the routes `router` serves.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut doc = api_router().into_openapi();
    openapi::finish(&mut doc);
    doc
}

pub fn router(state: AppState) -> Router {
    let (routes, _) = api_router().split_for_parts();
    routes
        // Outside the OpenAPI document, like the console: it is for scrapers (`metrics`).
        .route(metrics::PATH, axum::routing::get(metrics::scrape))
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(extract::refuse_nul))
        // From the inside out: a declared body over the limit is refused before it is read; the
        // handler is bounded in time; the rates are checked before anything else runs.
        .layer(axum::middleware::from_fn(limits::declared_body_limit))
        .layer(axum::middleware::from_fn_with_state(state.limits(), limits::timeout))
        .layer(axum::middleware::from_fn_with_state(state.limits(), limits::rates))
        .layer(axum::middleware::from_fn(error::log_failures))
        .layer(axum::middleware::from_fn(tenant::scope))
        .with_state(state)
}
