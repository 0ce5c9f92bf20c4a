//! What every API test needs: a per-test database, the router served on a loopback port, an
//! org with a token per role (and the tokens that must fail), an in-process engine (whose
//! webhook deliveries resolve names only from the test's own table), and helpers to send
//! requests and read problem bodies.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use api::auth::{issue_user_token_with_id, Claims, UserToken};
use api::http::limits::LimitArgs;
use api::http::{router, AppState, Problem};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use chrono::Utc;
use engine::executor::TestExecutor;
use engine::ids::{OrgId, ProjectId, RunId, UserId};
use engine::jobs::WebhookClient;
use engine::net_guard::Policy;
use engine::pool::PoolConfig;
use engine::store::{api_writes, workflows, Actor, Change};
use engine::testkit::{test_db, Engine, TestDb, APPROVAL};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use engine::db::Db;
use shopfloor_tests::github_fake::oauth::FakeOauth;
use shopfloor_tests::in_process::{self, Served};
use tokio_util::sync::CancellationToken;

/// One org's people: a token per role.
pub(crate) struct Org {
    pub(crate) id: OrgId,
    pub(crate) project: ProjectId,
    pub(crate) owner: String,
    pub(crate) owner_user: UserId,
    pub(crate) admin: String,
    pub(crate) admin_user: UserId,
    pub(crate) member: String,
    pub(crate) member_user: UserId,
    pub(crate) viewer: String,
}

/// The server under test.
pub(crate) struct App {
    pub(crate) db: TestDb,
    /// GitHub's API as people's tokens reach it (`/user/installations`).
    pub(crate) github: FakeOauth,
    pub(crate) base: String,
    pub(crate) http: reqwest::Client,
    stop: CancellationToken,
    engine: Option<Engine>,
}

/// Names the in-process engines resolve, and to what: tests never ask the system's DNS.
#[derive(Default)]
pub(crate) struct Names(pub(crate) HashMap<String, IpAddr>);

impl Resolve for Names {
    fn resolve(&self, name: Name) -> Resolving {
        let found = self.0.get(name.as_str()).map(|ip| SocketAddr::new(*ip, 0));
        let name = name.as_str().to_owned();
        Box::pin(async move {
            let ip = found.ok_or_else(|| format!("{name}: no such name in this test"))?;
            Ok(Box::new(std::iter::once(ip)) as Addrs)
        })
    }
}

/// Outgoing webhooks of an in-process API and engine: the API's policy for new subscriptions,
/// the engine's for each send, and the names the engine resolves.
pub(crate) struct Webhooks {
    pub(crate) api: Policy,
    pub(crate) engine: Policy,
    pub(crate) names: Names,
}

impl Webhooks {
    /// Only public targets (the default of a real server), and no names.
    pub(crate) fn public() -> Webhooks {
        Webhooks { api: Policy::default(), engine: Policy::default(), names: Names::default() }
    }

    /// Private targets allowed on both sides (`SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE=true`), for
    /// tests that deliver to receivers on loopback.
    pub(crate) fn private() -> Webhooks {
        let allow = Policy { allow_private: true };
        Webhooks { api: allow, engine: allow, names: Names::default() }
    }
}

impl App {
    /// A fresh database and the router on 127.0.0.1:0; webhooks may name only public targets.
    pub(crate) async fn start() -> App {
        App::start_with(Policy::default()).await
    }

    async fn start_with(webhooks: Policy) -> App {
        let db = test_db().await;
        let state = AppState::new(db.pool.clone(), db.url.parse().unwrap(), engine::testkit::secret_key());
        state.use_webhook_policy(webhooks);
        let github = FakeOauth::start().await;
        state.use_github_user_api(&github.url);
        let Served { base, stop } = in_process::serve(router(state.clone()), false, move || state.close_streams()).await;
        App { db, github, base, http: reqwest::Client::new(), stop, engine: None }
    }

    /// Also runs an engine with the test executor in this process.
    pub(crate) async fn with_engine() -> App {
        App::with_engine_executing(true, Webhooks::public()).await
    }

    /// Also runs an engine in this process that leaves crew steps to hosts (no test executor).
    pub(crate) async fn with_host_engine() -> App {
        App::with_engine_executing(false, Webhooks::public()).await
    }

    /// Also runs an engine with the test executor, with these webhook settings.
    pub(crate) async fn with_webhooks(webhooks: Webhooks) -> App {
        App::with_engine_executing(true, webhooks).await
    }

    async fn with_engine_executing(test_executor: bool, webhooks: Webhooks) -> App {
        let mut app = App::start_with(webhooks.api).await;
        app.start_engine(test_executor, webhooks);
        app
    }

    /// The whole app as `shopfloor api` serves it (REST, webhooks signed with `webhook_secret`,
    /// the console), each request with its peer's address, under `limits`; and an engine with
    /// the test executor.
    pub(crate) async fn with_limits(limits: &LimitArgs, webhook_secret: &str) -> App {
        let db = test_db().await;
        let state = AppState::new(db.pool.clone(), db.url.parse().unwrap(), engine::testkit::secret_key());
        state.use_limits(limits);
        let github = FakeOauth::start().await;
        let app = api::cli::app(&state, Some(webhook_secret.to_owned().into()), api::console::ConsoleConfig::default());
        let Served { base, stop } = in_process::serve(app, true, move || state.close_streams()).await;
        let mut app = App { db, github, base, http: reqwest::Client::new(), stop, engine: None };
        app.start_engine(true, Webhooks::public());
        app
    }

    fn start_engine(&mut self, test_executor: bool, webhooks: Webhooks) {
        let cfg = PoolConfig {
            test_executor: test_executor.then_some(TestExecutor { effects: None }),
            webhooks: WebhookClient::with_resolver(webhooks.engine, Arc::new(webhooks.names)).expect("the delivery client builds"),
            ..engine::testkit::pool_config("api-test-engine", &self.db.url, None)
        };
        self.engine = Some(Engine::start(&self.db.pool, cfg));
    }

    pub(crate) fn pool(&self) -> &Db {
        &self.db.pool
    }

    /// Submits a run of the org's `approve` workflow through the store, in a change of its own.
    pub(crate) async fn submit_approval(&self, org: &Org) -> RunId {
        let workflow = sqlx::query_scalar("SELECT workflow_id FROM workflows WHERE org_id = $1 AND name = 'approve'").bind(org.id).fetch_one(self.pool()).await.unwrap();
        let seed = shopfloor_tests::Seed { org: org.id, project: org.project, workflow, version: 1 };
        shopfloor_tests::submit_inputs(self.pool(), &seed, &[serde_json::json!({})]).await[0]
    }

    /// Stops the server (and engine), then checks the teardown invariants and drops the db.
    pub(crate) async fn finish(self) {
        self.stop_serving().await;
        self.db.finish().await;
    }

    /// Stops and drops the database without checks (for tests that leave wakes on purpose).
    pub(crate) async fn discard(self) {
        self.stop_serving().await;
        self.db.discard().await;
    }

    async fn stop_serving(&self) {
        self.stop.cancel();
        if let Some(e) = &self.engine {
            e.stop();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Sends a request with an optional bearer token and JSON body.
    pub(crate) async fn send(&self, method: Method, path: &str, token: Option<&str>, body: Option<&Value>) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
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

    /// Registers `host` (its name, capabilities, …) in the org's project `web` through the
    /// host protocol, with a registration the org's admin made; answers the host's credential
    /// (`token`, `host_id`).
    pub(crate) async fn register_host(&self, org: &Org, host: &Value) -> Value {
        let registration = self.json(Method::POST, "/api/v1/orgs/acme/projects/web/host-registrations", &org.admin, None, StatusCode::CREATED).await;
        self.json(Method::POST, "/api/v1/host/register", registration["token"].as_str().unwrap(), Some(host), StatusCode::CREATED).await
    }

    /// A JSON request that must answer `want`; returns the body as JSON.
    pub(crate) async fn json(&self, method: Method, path: &str, token: &str, body: Option<&Value>, want: StatusCode) -> Value {
        let (status, _, bytes) = self.send(method.clone(), path, Some(token), body).await;
        let text = String::from_utf8_lossy(&bytes);
        assert_eq!(status, want, "{method} {path}: {text}");
        serde_json::from_slice(&bytes).unwrap_or(Value::Null)
    }

    /// Creates an org with a project `web`, the workflow `approve`, and a member per role.
    pub(crate) async fn org(&self, slug: &str) -> Org {
        let mut ch = Change::begin(self.pool(), Actor::System).await.unwrap();
        let people = engine::testkit::org_with_people(&mut ch, slug, ["admin", "member", "viewer"]).await;
        let (id, project, owner_user, [admin_user, member_user, viewer_user]) = (people.org, people.project, people.owner, people.members);
        workflows::put_version(&mut ch, id, project, "approve", APPROVAL).await.unwrap();
        let day = chrono::Duration::days(1);
        let owner = token(&mut ch, id, owner_user, "owner", day).await;
        let admin = token(&mut ch, id, admin_user, "admin", day).await;
        let member = token(&mut ch, id, member_user, "member", day).await;
        let viewer = token(&mut ch, id, viewer_user, "viewer", day).await;
        ch.commit().await.unwrap();
        Org { id, project, owner, owner_user, admin, admin_user, member, member_user, viewer }
    }

    /// A token of the org's owner, issued through the store with any lifetime (negative for
    /// an expired one).
    pub(crate) async fn token_for(&self, org: &Org, user: UserId, role: &'static str, ttl: chrono::Duration) -> (uuid::Uuid, String) {
        let mut ch = Change::begin(self.pool(), Actor::System).await.unwrap();
        let issued = issue_user_token_with_id(&mut ch, &engine::testkit::secret_key(), UserToken { org: org.id, user, project: None, role, name: "test", ttl }).await.unwrap();
        ch.commit().await.unwrap();
        issued
    }

    /// A revoked token of the org's owner.
    pub(crate) async fn revoked_token(&self, org: &Org) -> String {
        let (jti, token) = self.token_for(org, org.owner_user, "owner", chrono::Duration::days(1)).await;
        let mut ch = Change::begin(self.pool(), Actor::System).await.unwrap();
        api_writes::revoke_token(&mut ch, org.id, jti).await.unwrap();
        ch.commit().await.unwrap();
        token
    }

    /// Waits until `sql` (with the run bound as $1) returns true.
    pub(crate) async fn until(&self, run: RunId, sql: &str, what: &str) {
        shopfloor_tests::until_run(self.pool(), run, sql, what).await;
    }
}

async fn token(ch: &mut Change, org: OrgId, user: UserId, role: &'static str, ttl: chrono::Duration) -> String {
    issue_user_token_with_id(ch, &engine::testkit::secret_key(), UserToken { org, user, project: None, role, name: "test", ttl }).await.unwrap().1
}

/// A token whose claims are right but whose signature is made with another secret.
pub(crate) fn signed_with_other_key(valid: &str) -> String {
    let header = jsonwebtoken::decode_header(valid).unwrap();
    let claims = claims_of(valid);
    let mut h = Header::new(Algorithm::HS256);
    h.kid = header.kid;
    encode(&h, &claims, &EncodingKey::from_secret(b"not the service's secret at all!")).unwrap()
}

/// The claims of a token, read without checking anything (tests only).
pub(crate) fn claims_of(token: &str) -> Claims {
    let payload = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

/// The same claims with `alg: none` and no signature.
pub(crate) fn alg_none(valid: &str) -> String {
    let kid = jsonwebtoken::decode_header(valid).unwrap().kid.unwrap();
    let header = serde_json::json!({ "alg": "none", "typ": "JWT", "kid": kid });
    let mut claims = claims_of(valid);
    claims.exp = Utc::now().timestamp() + 3600;
    let enc = |v: &Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap());
    format!("{}.{}.", enc(&header), enc(&serde_json::to_value(&claims).unwrap()))
}

/// Reads a problem body, checking its content type and status.
pub(crate) fn problem(status: StatusCode, headers: &reqwest::header::HeaderMap, body: &[u8]) -> Problem {
    let ct = headers.get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    assert_eq!(ct, "application/problem+json", "status {status}: {}", String::from_utf8_lossy(body));
    let p: Problem = serde_json::from_slice(body).unwrap_or_else(|e| panic!("not a problem body ({e}): {}", String::from_utf8_lossy(body)));
    assert_eq!(p.status, status.as_u16());
    assert!(p.kind.starts_with("https://shopfloor.dev/problems/"), "{}", p.kind);
    assert!(!p.title.is_empty());
    p
}

/// One Server-Sent Event.
pub(crate) use shopfloor_tests::sse::{Sse, SseEvent};

/// The SSE stream at `path` of the app, as `token`, resuming after `last_event_id`.
pub(crate) async fn sse(app: &App, path: &str, token: &str, last_event_id: Option<&str>) -> Sse {
    Sse::connect(&app.http, &app.url(path), token, last_event_id).await
}

/// What a `shopfloor` command did (the CLI and admin tests).
pub(crate) struct Ran {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Ran {
    pub(crate) fn ok(self) -> Ran {
        assert_eq!(self.code, 0, "exit {}: stdout {} stderr {}", self.code, self.stdout, self.stderr);
        self
    }

    /// A failure with exit `code` and one line on standard error that says `says`.
    pub(crate) fn fails(self, code: i32, says: &str) -> Ran {
        assert_eq!(self.code, code, "stdout {} stderr {}", self.stdout, self.stderr);
        assert_eq!(self.stderr.trim().lines().count(), 1, "one line: {}", self.stderr);
        assert!(self.stderr.contains(says), "expected `{says}` in: {}", self.stderr);
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
        self
    }

    /// The one line a key command prints.
    pub(crate) fn line(&self) -> &str {
        assert_eq!(self.stdout.trim().lines().count(), 1, "one line: {}", self.stdout);
        self.stdout.trim()
    }
}

/// A child process that a test that panics still stops (`shopfloor serve`, whose database a
/// later test sweeps; a `--watch` that would otherwise wait for its server forever).
pub(crate) struct KillOnDrop(pub(crate) std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
