//! What every API test needs beyond the harness it shares with the console's tests
//! (`harness.rs`: a per-test database, the router served on a loopback port): an
//! org with a token per role (and the tokens that must fail), an in-process engine (whose
//! webhook deliveries resolve names only from the test's own table), and helpers for JSON
//! requests and problem bodies.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use api::auth::{Claims, UserToken, issue_user_token_with_id};
use api::http::limits::LimitArgs;
use api::http::{Problem, router};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::Utc;
use engine::executor::TestExecutor;
use engine::ids::{OrgId, ProjectId, RunId, UserId};
use engine::jobs::WebhookClient;
use engine::net_guard::Policy;
use engine::pool::PoolConfig;
use engine::store::{Actor, Change, api_writes, workflows};
use engine::testkit::APPROVAL;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::{Method, StatusCode};
use serde_json::Value;

pub(crate) use crate::harness::App;
use crate::harness::token;

/// One org's people: a token per role.
pub(crate) struct Org {
    pub id: OrgId,
    pub project: ProjectId,
    pub owner: String,
    pub owner_user: UserId,
    pub admin: String,
    pub admin_user: UserId,
    pub member: String,
    pub member_user: UserId,
    pub viewer: String,
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
    pub api: Policy,
    pub engine: Policy,
    pub names: Names,
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
        App::serve(false, |state, github| {
            state.use_webhook_policy(webhooks);
            state.use_github_user_api(&github.url);
            router(state.clone())
        })
        .await
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
        app.start_engine(engine_config(&app, test_executor, webhooks));
        app
    }

    /// The whole app as `shopfloor api` serves it (REST, webhooks signed with `webhook_secret`,
    /// the console), each request with its peer's address, under `limits`; and an engine with
    /// the test executor.
    pub(crate) async fn with_limits(limits: &LimitArgs, webhook_secret: &str) -> App {
        let mut app = App::serve(true, |state, _| {
            state.use_limits(limits);
            api::cli::app(state, Some(webhook_secret.to_owned().into()), api::console::ConsoleConfig::default())
        })
        .await;
        app.start_engine(engine_config(&app, true, Webhooks::public()));
        app
    }

    /// Submits a run of the org's `approve` workflow through the store, in a change of its own.
    pub(crate) async fn submit_approval(&self, org: &Org) -> RunId {
        let workflow =
            sqlx::query_scalar("SELECT workflow_id FROM workflows WHERE org_id = $1 AND name = 'approve'").bind(org.id).fetch_one(self.pool()).await.unwrap();
        self.submit_to(org.id, org.project, workflow).await
    }

    /// Stops the server (and engine), then checks the teardown invariants and drops the db.
    pub(crate) async fn finish(self) {
        self.stop_serving().await.finish().await;
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

    /// POSTs `body` to `path`, which must answer 201 Created; returns the new resource's `id`.
    pub(crate) async fn created(&self, path: &str, token: &str, body: &Value) -> String {
        let made = self.json(Method::POST, path, token, Some(body), StatusCode::CREATED).await;
        made["id"].as_str().unwrap_or_else(|| panic!("POST {path}: no id in {made}")).to_owned()
    }

    /// The app with the org `acme`, as [`App::org`] makes it: a test's opening.
    pub(crate) async fn with_acme(self) -> (App, Org) {
        let org = self.org("acme").await;
        (self, org)
    }

    /// An org per slug, each as [`App::org`] makes it.
    pub(crate) async fn orgs<const N: usize>(&self, slugs: [&str; N]) -> [Org; N] {
        let mut orgs = Vec::with_capacity(N);
        for slug in slugs {
            orgs.push(self.org(slug).await);
        }
        orgs.try_into().unwrap_or_else(|_| unreachable!("one org per slug"))
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
        let issued = issue_user_token_with_id(&mut ch, &engine::testkit::secret_key(), UserToken { org: org.id, user, project: None, role, name: "test", ttl })
            .await
            .unwrap();
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
}

/// The engine of an in-process app: with the test executor or leaving crew steps to hosts, and
/// these webhook settings.
fn engine_config(app: &App, test_executor: bool, webhooks: Webhooks) -> PoolConfig {
    PoolConfig {
        test_executor: test_executor.then_some(TestExecutor { effects: None }),
        webhooks: WebhookClient::with_resolver(webhooks.engine, engine::testkit::secret_key(), Arc::new(webhooks.names)).expect("the delivery client builds"),
        ..engine::testkit::pool_config("api-test-engine", &app.db.url, None)
    }
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
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
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
