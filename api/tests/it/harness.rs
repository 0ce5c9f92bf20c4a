//! The one harness of the tests that serve the API in their own process: the API's
//! (`support.rs` adds its requests, orgs and tokens) and the console's
//! (`tests/console/support.rs`, whose binary takes this file in with `#[path]`, adds its orgs
//! and browser). What it holds: a database of the test's own, the fake GitHub (its OAuth host
//! and the API people's tokens reach), the router on a loopback port, an engine in this process
//! when a test starts one, and the teardown.

use std::time::Duration;

use api::auth::{UserToken, issue_user_token};
use api::http::AppState;
use engine::db::Db;
use engine::ids::{OrgId, ProjectId, RunId, UserId, WorkflowId};
use engine::pool::PoolConfig;
use engine::store::Change;
use engine::testkit::{Engine, TestDb, test_db};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use shopfloor_tests::github_fake::oauth::FakeOauth;
use shopfloor_tests::in_process::{self, Served};
use shopfloor_tests::proxy::Proxy;
use tokio_util::sync::CancellationToken;

/// The server under test.
pub(crate) struct App {
    pub db: TestDb,
    /// GitHub as people reach it: the OAuth sign-in and the API of their tokens
    /// (`/user/installations`).
    pub github: FakeOauth,
    pub base: String,
    pub http: reqwest::Client,
    stop: CancellationToken,
    engine: Option<Engine>,
}

impl App {
    /// A fresh database, the fake GitHub, and the router `build` makes of the app's state served
    /// on 127.0.0.1:0; each request carries its peer's address when `peers` (as `shopfloor api`
    /// serves it).
    pub(crate) async fn serve(peers: bool, build: impl FnOnce(&AppState, &FakeOauth) -> axum::Router) -> App {
        App::serve_through(None, peers, build).await
    }

    /// As [`App::serve`]; with `proxy` (which can cut the link), the server reaches the test's
    /// database through it, while the test's own pool stays direct.
    pub(crate) async fn serve_through(proxy: Option<&Proxy>, peers: bool, build: impl FnOnce(&AppState, &FakeOauth) -> axum::Router) -> App {
        let db = test_db().await;
        let (pool, url) = match proxy {
            None => (db.pool.clone(), db.url.clone()),
            Some(p) => {
                let url = p.url_for(&db.url);
                (engine::db::connect_guarded(&url, 8, engine::db::Route::Direct).await.expect("the proxy relays"), url)
            }
        };
        let state = AppState::new(pool, url.parse().unwrap(), engine::testkit::secret_key());
        let github = FakeOauth::start().await;
        let router = build(&state, &github);
        let closing = move || state.close_streams();
        let Served { base, stop } =
            if peers { in_process::serve_with(router, closing, api::http::serve::serve).await } else { in_process::serve(router, closing).await };
        App { db, github, base, http: reqwest::Client::new(), stop, engine: None }
    }

    /// Runs an engine with `cfg` in this process, on the test's database, until the test ends.
    pub(crate) fn start_engine(&mut self, cfg: PoolConfig) {
        self.engine = Some(Engine::start(&self.db.pool, cfg));
    }

    pub(crate) fn pool(&self) -> &Db {
        &self.db.pool
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Sends a request with an optional bearer token and JSON body.
    pub(crate) async fn send(
        &self, method: Method, path: &str, token: Option<&str>, body: Option<&Value>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
        let mut req = self.http.request(method, self.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.expect("request reaches the server");
        let status = resp.status();
        let headers = resp.headers().clone();
        // An event stream never ends: its status and headers are the answer.
        let streaming = headers.get(reqwest::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let bytes = if streaming { Vec::new() } else { resp.bytes().await.map(|b| b.to_vec()).unwrap_or_default() };
        (status, headers, bytes)
    }

    /// Submits a run of `workflow` (version 1, no input) through the store, as the REST submit
    /// does, in a change of its own.
    pub(crate) async fn submit_to(&self, org: OrgId, project: ProjectId, workflow: WorkflowId) -> RunId {
        let seed = shopfloor_tests::Seed { org, project, workflow, version: 1 };
        shopfloor_tests::submit_inputs(self.pool(), &seed, &[serde_json::json!({})]).await[0]
    }

    /// Waits until `sql` (with the run bound as $1) returns true.
    pub(crate) async fn until(&self, run: RunId, sql: &str, what: &str) {
        shopfloor_tests::until_run(self.pool(), run, sql, what).await;
    }

    /// Stops the server, the engine and the fake GitHub; answers the database, for the caller
    /// to check and drop ([`TestDb::finish`]) or drop unchecked.
    pub(crate) async fn stop_serving(self) -> TestDb {
        self.stop.cancel();
        if let Some(e) = self.engine {
            e.stop();
            let _ = e.task.await;
        }
        self.github.stop();
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.db
    }

    /// Stops and drops the database without checks (for tests that leave wakes on purpose).
    pub(crate) async fn discard(self) {
        self.stop_serving().await.discard().await;
    }
}

/// A token of `user` as `role` in `org` living `ttl`, issued through the store in `ch`.
pub(crate) async fn token(ch: &mut Change, org: OrgId, user: UserId, role: &'static str, ttl: chrono::Duration) -> String {
    issue_user_token(ch, &engine::testkit::secret_key(), UserToken { org, user, project: None, role, name: "test", ttl }).await.unwrap()
}
