//! The HTTP surface: the axum router, built from one list of documented routes.
//!
//! Every route of the REST API is registered through utoipa-axum's `routes!`, so the OpenAPI
//! document (`openapi()`, served at `/api/v1/openapi.json` and kept in `openapi/openapi.json`)
//! cannot miss one. Handlers get their caller and tenant from extractors (`auth`, `tenant`),
//! parse input with extractors whose rejection is an `ApiError` (`extract`), read with plain
//! SQL filtered by org, and write only through `engine::store`.
//!
//! - `state` — `AppState`, what every handler shares.
//! - `error` — `ApiError` and problem+json; 5xx causes logged once by `log_failures`.
//! - `auth` — bearer-token verification and roles (`keys`: the signing keys' cache);
//!   `tenant` — org and project scopes.
//! - `extract` — JSON, YAML, path, query and `Idempotency-Key` extractors.
//! - `page` — keyset cursors; `idempotency` — replaying create-POSTs.
//! - `event_hub` — the replica's event hub (one `LISTEN`); `events` — the SSE stream.
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
//! - `openapi` — the document's header, security scheme and shared problem responses; the
//!   document itself is served here, beside the list of routes it is built from.
//! - `limits` — abuse limits: rates per token and per address, open event streams per token,
//!   the request timeout, bodies refused by their declared length.
//! - `harden` — the security headers of every response; `serve` — the listener's loop, with a
//!   bound on reading each request's head.

pub mod admission;
pub mod audit;
pub mod auth;
pub mod budgets;
pub mod error;
pub mod event_hub;
pub mod events;
pub mod extract;
pub mod harden;
pub mod health;
pub mod host_protocol;
pub mod hosts;
pub mod idempotency;
pub mod installations;
mod keys;
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
pub mod serve;
mod state;
pub mod stream_access;
pub mod tenant;
pub mod tokens;
pub mod webhooks_out;
pub mod workflows;

use axum::extract::DefaultBodyLimit;
use axum::{Json, Router};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use error::{ApiError, BODY_LIMIT, Problem, problem};
pub use state::AppState;

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
        .routes(routes!(openapi_json))
        .nest("/api/v1", v1)
}

/// The OpenAPI 3.1 document of the routes `router` serves.
pub fn openapi() -> serde_json::Value {
    let mut doc = api_router().into_openapi();
    openapi::finish(&mut doc);
    let mut value = serde_json::to_value(doc).unwrap_or_default();
    // A bound on every text, stated where utoipa's types have no place for it.
    openapi::no_nul_in_text(&mut value);
    value
}

// Served here, beside the list it is built from, since it is one of the routes it describes.
/// This API's OpenAPI 3.1 document.
#[utoipa::path(get, path = "/api/v1/openapi.json", operation_id = "openapi", tag = "health", security(()),
    responses((status = 200, description = "The OpenAPI document", body = Object)))]
pub async fn openapi_json() -> Json<serde_json::Value> {
    // Built once per process: the routes do not change while it runs.
    static DOC: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    Json(DOC.get_or_init(openapi).clone())
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
