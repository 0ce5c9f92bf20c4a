//! `/metrics` on real processes: a `shopfloor api` replica and a `shopfloor engine` with
//! `--metrics-addr`, scraped before and after a run submitted over REST, a signed GitHub
//! webhook that opens a run, and an outgoing webhook delivered to a receiver in the test; then
//! `shopfloor serve`, whose one `/metrics` shows its engine's figures too.

use std::time::Duration;

use engine::store::{Actor, Change};
use engine::testkit::{TestDb, test_db};
use serde_json::json;
use shopfloor_tests::github_fake::payloads::{self, user};
use shopfloor_tests::github_fake::{Issue, WebhookClient};
use shopfloor_tests::process::{Listening, Proc, free_port, listen, shopfloor};

use crate::support::{acme, connect_widgets, owner_token, put_workflows, widgets};

const SECRET: &str = "metrics-test-webhook-secret";

const BUILD: &str = include_str!("../workflows/build.yaml");
const QUICK: &str = include_str!("../workflows/quick_on_label.yaml");

const SUBMIT_ROUTE: &str = "/api/v1/orgs/{org}/projects/{project}/runs";

/// The value of the samples named `name` whose labels include every one of `labels`, summed;
/// 0 when there is none.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut total = 0.0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let (metric, label_text) = match series.split_once('{') {
            Some((m, rest)) => (m, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if metric != name {
            continue;
        }
        if labels.iter().all(|(k, v)| label_text.split(',').any(|pair| pair == format!("{k}=\"{v}\""))) {
            total += value.parse::<f64>().unwrap_or_else(|_| panic!("not a number in `{line}`"));
        }
    }
    total
}

async fn scrape(url: &str) -> String {
    let r = reqwest::get(url).await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(r.status(), 200, "GET {url}");
    let kind = r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    assert!(kind.starts_with("application/openmetrics-text"), "content type {kind}");
    r.text().await.unwrap()
}

/// Waits until `sql` counts `want`.
async fn until(db: &TestDb, sql: &str, want: i64) {
    shopfloor_tests::until_count(&db.pool, sql, want, Duration::from_secs(60)).await;
}

/// Org `acme`, project `web`, both workflows, `Acme/Widgets` connected, an outgoing webhook
/// of `run.completed` to `receiver`; answers the owner's token.
async fn seed(db: &TestDb, receiver: &str) -> String {
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    let acme = acme(&mut ch).await;
    put_workflows(&mut ch, acme.org, acme.project, &[BUILD, QUICK]).await;
    connect_widgets(&mut ch, acme.org, acme.project).await;
    // The receiver is on loopback: allowed only with SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE, which
    // the engine gets too.
    engine::testkit::subscribe(&mut ch, acme.org, acme.project, receiver, &["run.completed"]).await;
    let token = owner_token(&mut ch, &acme, "metrics", 1).await;
    ch.commit().await.unwrap();
    token
}

/// A receiver of outgoing webhooks that answers 200 to everything.
async fn receiver() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/hook", axum::routing::post(|| async { "ok" }));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/hook"), task)
}

async fn submit(base: &str, token: &str) {
    let r = reqwest::Client::new()
        .post(format!("{base}/api/v1/orgs/acme/projects/web/runs"))
        .bearer_auth(token)
        .json(&json!({ "workflow": "build" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
}

#[tokio::test(flavor = "multi_thread")]
async fn api_and_engine_count_what_they_did() {
    let db = test_db().await;
    let (hook, _receiver) = receiver().await;
    let token = seed(&db, &hook).await;
    let engine_port = free_port();
    let mut api = shopfloor(&["api", "--log", "warn"], &db.url);
    api.env("SHOPFLOOR_GITHUB_WEBHOOK_SECRET", SECRET);
    let Listening { proc: _api, base } = listen(api).await;
    let _engine = Proc(
        shopfloor(&["engine", "--test-executor", "--log", "warn"], &db.url)
            .env("SHOPFLOOR_METRICS_ADDR", format!("127.0.0.1:{engine_port}"))
            .env("SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE", "true")
            .env("SHOPFLOOR_DRAIN_SECS", "2")
            .spawn()
            .unwrap(),
    );
    let (api_metrics, engine_metrics) = (format!("{base}/metrics"), format!("http://127.0.0.1:{engine_port}/metrics"));
    shopfloor_tests::until_ok(&engine_metrics).await;

    let api_before = scrape(&api_metrics).await;
    let engine_before = scrape(&engine_metrics).await;
    // The engine serves nothing but /metrics.
    assert_eq!(reqwest::get(format!("http://127.0.0.1:{engine_port}/healthz")).await.unwrap().status(), 404);

    // A run over REST; a labelled issue over a signed webhook; and a badly signed one.
    submit(&base, &token).await;
    let hooks = WebhookClient::new(&base, SECRET);
    let repo = widgets();
    let mut issue = Issue::new(7, "Make it faster");
    issue.labels.push("ready".to_owned());
    let (status, _) =
        hooks.send("issues", &uuid::Uuid::new_v4().to_string(), &payloads::issues_event("labeled", &repo, &issue, &user("bob"), Some("ready"))).await;
    assert_eq!(status, 202);
    let (status, _) = hooks.send_raw("issues", &uuid::Uuid::new_v4().to_string(), b"{}".to_vec(), Some("sha256=00")).await;
    assert_eq!(status, 401);
    until(&db, "SELECT count(*) FROM runs WHERE status = 'completed'", 2).await;
    until(&db, "SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'", 2).await;

    let api_after = scrape(&api_metrics).await;
    let engine_after = scrape(&engine_metrics).await;
    let moved = |before: &str, after: &str, name: &str, labels: &[(&str, &str)]| sample(after, name, labels) - sample(before, name, labels);

    // The API: the submit by its route template, the webhooks by event and outcome, the run it opened.
    let submit_labels = [("method", "POST"), ("route", SUBMIT_ROUTE), ("status", "201")];
    assert_eq!(moved(&api_before, &api_after, "shopfloor_http_requests_total", &submit_labels), 1.0, "{api_after}");
    assert_eq!(moved(&api_before, &api_after, "shopfloor_http_request_duration_seconds_count", &[("method", "POST"), ("route", SUBMIT_ROUTE)]), 1.0);
    assert!(!api_after.contains("/orgs/acme/"), "a raw path is a label: {api_after}");
    assert_eq!(moved(&api_before, &api_after, "shopfloor_github_webhooks_total", &[("event", "issues"), ("outcome", "accepted")]), 1.0, "{api_after}");
    assert_eq!(moved(&api_before, &api_after, "shopfloor_github_webhooks_total", &[("event", "unverified"), ("outcome", "bad-signature")]), 1.0);
    assert_eq!(moved(&api_before, &api_after, "shopfloor_runs_started_total", &[]), 2.0);
    // Read at scrape: every substate is there, and no run is running now.
    assert!(api_after.contains("shopfloor_runs{status=\"running\",substate=\"executing\"} 0"), "{api_after}");
    assert!(api_after.contains("shopfloor_admission_waiting{queue=\"org\"}"), "{api_after}");

    // The engine: the wakes it claimed, how late, the crew step it ran, the runs it ended,
    // the webhooks it delivered.
    assert!(moved(&engine_before, &engine_after, "shopfloor_wakes_claimed_total", &[]) >= 2.0, "{engine_after}");
    assert!(moved(&engine_before, &engine_after, "shopfloor_wake_latency_seconds_count", &[]) >= 2.0);
    assert_eq!(moved(&engine_before, &engine_after, "shopfloor_steps_started_total", &[("kind", "crew")]), 1.0, "{engine_after}");
    assert_eq!(moved(&engine_before, &engine_after, "shopfloor_steps_finished_total", &[("kind", "crew"), ("outcome", "succeeded")]), 1.0);
    assert_eq!(moved(&engine_before, &engine_after, "shopfloor_step_duration_seconds_count", &[("kind", "crew")]), 1.0);
    assert_eq!(moved(&engine_before, &engine_after, "shopfloor_runs_finished_total", &[("status", "completed")]), 2.0);
    assert_eq!(
        moved(&engine_before, &engine_after, "shopfloor_webhook_deliveries_total", &[("event", "run.completed"), ("outcome", "delivered")]),
        2.0,
        "{engine_after}"
    );
    assert_eq!(sample(&engine_after, "shopfloor_lease_expiries_total", &[]), 0.0);

    // Neither shows a secret or a token.
    for text in [&api_after, &engine_after] {
        assert!(!text.contains(SECRET) && !text.contains(&token), "a secret in /metrics");
    }
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_shows_its_engine_on_its_one_metrics() {
    let db = test_db().await;
    let (hook, _receiver) = receiver().await;
    let token = seed(&db, &hook).await;
    let mut serve = shopfloor(&["serve", "--test-executor", "--log", "warn"], &db.url);
    serve.env("SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE", "true").env("SHOPFLOOR_DRAIN_SECS", "2");
    let Listening { proc: _serve, base } = listen(serve).await;
    let before = scrape(&format!("{base}/metrics")).await;
    submit(&base, &token).await;
    until(&db, "SELECT count(*) FROM runs WHERE status = 'completed'", 1).await;
    let after = scrape(&format!("{base}/metrics")).await;
    assert!(sample(&after, "shopfloor_wakes_claimed_total", &[]) > sample(&before, "shopfloor_wakes_claimed_total", &[]), "{after}");
    let succeeded = [("kind", "crew"), ("outcome", "succeeded")];
    assert_eq!(sample(&after, "shopfloor_steps_finished_total", &succeeded) - sample(&before, "shopfloor_steps_finished_total", &succeeded), 1.0);
    let submits = [("route", SUBMIT_ROUTE), ("status", "201")];
    assert_eq!(sample(&after, "shopfloor_http_requests_total", &submits) - sample(&before, "shopfloor_http_requests_total", &submits), 1.0);
    db.finish().await;
}
