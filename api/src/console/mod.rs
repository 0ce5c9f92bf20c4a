//! The web console: server-rendered HTML pages served by the API at `/`, with small plain
//! scripts that make them live through the project event stream (SSE). Every page works with
//! scripts off, except for live updates.
//!
//! The console holds no state and writes nothing itself. It reads with SQL filtered by org,
//! like the REST handlers, and **acts by calling the REST API in-process**: a form post becomes
//! a request to the documented route, dispatched through the same router with the signed-in
//! caller attached (`internal`), so the console's approve, reject, cancel, retry, rerun,
//! pause, upload and token forms run exactly the checks and the `engine::store` writes of the
//! REST handlers, and a console user can do nothing a token of theirs could not.
//!
//! - `session` — sign-in state: the session cookie holds one console token per org (API
//!   tokens named `console session`, revoked at sign-out), CSRF tokens derived from it.
//! - `oauth` — sign-in with GitHub (authorize, code exchange, `/user`), and with a token.
//! - `config` — the console's settings; `state` — `Console`, what its handlers share.
//! - `internal` — calls to the REST router; `error` — the console's error pages; `escape` —
//!   text made safe for HTML and URLs.
//! - `pages/` — Today (with resolve and cycle-budget reset), runs, the run page, hosts (drain,
//!   undrain, deregister) and "Add a host" (a registration and the command that uses it),
//!   workflows, budgets (the org's and a project's: limits, spend, the runs they hold),
//!   members, outgoing webhooks (deliveries, replay), audit log, tokens, GitHub (installations
//!   and the install flow that claims one).
//! - `svg` — the run page's waterfall and graph; `view` — templates and formatting; `people` —
//!   who did something, by name; `transcript` — agents' lines in words.
//!
//! **Architecture Invariant:** no handler here writes to the database; every change goes
//! through a REST handler (and so through `engine::store`), or through `crate::auth` for the
//! session tokens themselves.

/// A template context whose values are serialized (minijinja's `context!` wants `Value`s).
macro_rules! ctx {
    ($($key:ident => $value:expr),* $(,)?) => {
        minijinja::context! { $($key => minijinja::Value::from(minijinja::value::Serde(&$value))),* }
    };
}

mod config;
mod error;
mod escape;
mod internal;
mod oauth;
mod pages;
mod people;
mod session;
mod state;
mod svg;
mod transcript;
mod view;

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use state::Inner;

use crate::http::AppState;

pub use config::ConsoleConfig;
pub use error::ConsoleError;
pub use state::Console;
pub use view::templates;

/// The console's routes, to merge into the app beside the REST API. Panics only if a template
/// does not compile, which the tests catch.
pub fn router(state: AppState, cfg: ConsoleConfig) -> Router {
    // The REST claim of an installation checks people's tokens where sign-in does.
    state.use_github_user_api(&cfg.github_oauth_api_url);
    let (api, _) = crate::http::api_router().split_for_parts();
    let api = api.with_state(state.clone());
    let http = reqwest::Client::builder().timeout(std::time::Duration::from_secs(10)).user_agent(engine::github::USER_AGENT).build().unwrap_or_default();
    let console = Console {
        inner: Arc::new(Inner { app: state, api, env: templates().expect("the console's templates compile"), cfg, http, catalog: Default::default() }),
    };
    let project = "/orgs/{org}/projects/{project}";
    let run = "/orgs/{org}/projects/{project}/runs/{run}";
    // Each sign-in attempt may verify a token or call GitHub: limited per address.
    let signin = Router::new()
        .route("/signin/token", post(oauth::signin_token))
        .route("/auth/github", get(oauth::github_start))
        .route("/auth/github/callback", get(oauth::github_callback))
        .route_layer(axum::middleware::from_fn_with_state(console.state().limits(), oauth::limit_signins));
    Router::new()
        .merge(signin)
        .route("/", get(pages::home))
        .route("/static/console.css", get(stylesheet))
        .route("/static/console.js", get(script))
        .route("/signin", get(oauth::signin_page))
        .route("/signout", post(oauth::signout))
        .route("/orgs/{org}", get(pages::today::page))
        .route("/orgs/{org}/audit", get(pages::audit::page))
        .route("/orgs/{org}/tokens", get(pages::tokens::page).post(pages::tokens::create))
        .route("/orgs/{org}/tokens/{token}/revoke", post(pages::tokens::revoke))
        .route("/orgs/{org}/members", get(pages::members::page).post(pages::members::add))
        .route("/orgs/{org}/members/{user}/role", post(pages::members::role))
        .route("/orgs/{org}/members/{user}/remove", post(pages::members::remove))
        .route("/orgs/{org}/budgets", get(pages::budgets::org_page).post(pages::budgets::org_set))
        .route("/orgs/{org}/budgets/{period}/remove", post(pages::budgets::org_remove))
        .route("/orgs/{org}/github", get(pages::github::page))
        .route("/orgs/{org}/github/connect", post(pages::github::connect))
        .route("/orgs/{org}/github/installations/{installation}/release", post(pages::github::release))
        .route("/github/setup", get(pages::github::setup))
        .route("/github/setup/callback", get(pages::github::callback))
        .route(&format!("{project}/live"), get(pages::live))
        .route(&format!("{project}/cycle-asks/{{item}}/reset"), post(pages::today::reset))
        .route(&format!("{run}/resolve"), post(pages::today::resolve))
        .route(&format!("{project}/runs"), get(pages::runs::page))
        .route(&format!("{project}/hosts"), get(pages::hosts::page))
        .route(&format!("{project}/hosts/add"), get(pages::host_add::page).post(pages::host_add::create))
        .route(&format!("{project}/hosts/{{host}}/drain"), post(pages::hosts::drain))
        .route(&format!("{project}/hosts/{{host}}/undrain"), post(pages::hosts::undrain))
        .route(&format!("{project}/hosts/{{host}}/deregister"), post(pages::hosts::deregister))
        .route(&format!("{project}/budgets"), get(pages::budgets::project_page).post(pages::budgets::project_set))
        .route(&format!("{project}/budgets/{{period}}/remove"), post(pages::budgets::project_remove))
        .route(&format!("{project}/webhooks"), get(pages::webhooks::page).post(pages::webhooks::create))
        .route(&format!("{project}/webhooks/{{webhook}}/delete"), post(pages::webhooks::delete))
        .route(&format!("{project}/webhooks/{{webhook}}/deliveries/{{delivery}}/replay"), post(pages::webhooks::replay))
        .route(&format!("{project}/workflows"), get(pages::workflows::list).post(pages::workflows::upload))
        .route(&format!("{project}/workflows/validate"), post(pages::workflows::validate))
        .route(&format!("{project}/workflows/{{name}}"), get(pages::workflows::detail))
        .route(&format!("{project}/workflows/{{name}}/pause"), post(pages::workflows::pause))
        .route(&format!("{project}/workflows/{{name}}/unpause"), post(pages::workflows::unpause))
        .route(&format!("{project}/workflows/{{name}}/runs"), post(pages::workflows::start))
        .route(&format!("{project}/pause"), post(pages::workflows::pause_project))
        .route(&format!("{project}/unpause"), post(pages::workflows::unpause_project))
        .route(run, get(pages::run::page))
        .route(&format!("{run}/approve/{{node}}"), post(pages::run::approve))
        .route(&format!("{run}/reject/{{node}}"), post(pages::run::reject))
        .route(&format!("{run}/cancel"), post(pages::run::cancel))
        .route(&format!("{run}/retry"), post(pages::run::retry))
        .route(&format!("{run}/rerun"), post(pages::run::rerun))
        .route(&format!("{run}/steps/{{step}}/transcript"), get(pages::run::transcript))
        .route(&format!("{run}/steps/{{step}}/messages"), post(pages::run::say))
        // The signed-in caller of each page fills the scope (`session`), and the in-process
        // REST calls run inside it.
        .layer(axum::middleware::from_fn(crate::http::tenant::scope))
        .layer(axum::middleware::from_fn(refuse_nul))
        // The REST API's bound on answering (a slow form body included).
        .layer(axum::middleware::from_fn_with_state(console.state().limits(), crate::http::limits::timeout))
        .with_state(console)
}

/// A page asked for with an encoded NUL in its path or query: a 400 page, as the REST API
/// answers 400 (the console's own queries and its in-process REST calls would otherwise fail
/// on it).
async fn refuse_nul(req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    if crate::http::extract::has_nul(req.uri()) {
        return ConsoleError::BadRequest(crate::http::extract::NUL.into()).into_response();
    }
    next.run(req).await
}

const CSS: &str = include_str!("../../templates/static/console.css");
const JS: &str = include_str!("../../templates/static/console.js");

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=300"));
    response
}

async fn stylesheet() -> Response {
    asset(CSS, "text/css; charset=utf-8")
}

async fn script() -> Response {
    asset(JS, "text/javascript; charset=utf-8")
}
