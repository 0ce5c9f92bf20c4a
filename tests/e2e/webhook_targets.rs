//! Outgoing webhooks' targets on a real `shopfloor api`: with the default settings every
//! internal address, in each of its spellings, and every local or metadata name is refused
//! when the subscription is made (422 problem+json, nothing stored, nothing audited); a public
//! URL is taken. With `SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE=true` loopback and private targets are
//! taken, and metadata, link-local and unspecified ones are still refused.

use engine::store::{Actor, Change};
use engine::testkit::{TestDb, test_db};
use serde_json::{Value, json};
use shopfloor_tests::process::{Listening, listen, shopfloor};

use crate::support::{acme, owner_token};

const WEBHOOKS: &str = "/api/v1/orgs/acme/projects/web/webhooks";

/// Each internal target, with the words of its refusal.
const INTERNAL: &[(&str, &str)] = &[
    ("http://127.0.0.1:8080/hook", "127.0.0.1 is a loopback address"),
    ("http://2130706433/hook", "127.0.0.1 is a loopback address"),
    ("http://0x7f000001/hook", "127.0.0.1 is a loopback address"),
    ("http://0177.0.0.1/hook", "127.0.0.1 is a loopback address"),
    ("http://127.1/hook", "127.0.0.1 is a loopback address"),
    ("http://[::1]/hook", "[::1] is a loopback address"),
    ("http://[::ffff:127.0.0.1]/hook", "[::ffff:7f00:1] is a loopback address"),
    ("http://[::ffff:7f00:1]/hook", "[::ffff:7f00:1] is a loopback address"),
    ("http://[::127.0.0.1]/hook", "[::7f00:1] is a loopback address"),
    ("http://[64:ff9b::127.0.0.1]/hook", "[64:ff9b::7f00:1] is a loopback address"),
    ("http://[2002:7f00:1::]/hook", "[2002:7f00:1::] is a loopback address"),
    ("http://localhost:3000/hook", "localhost is a loopback address"),
    ("http://app.localhost/hook", "app.localhost is a loopback address"),
    ("http://0.0.0.0/hook", "0.0.0.0 is the unspecified address"),
    ("http://[::]/hook", "[::] is the unspecified address"),
    ("http://10.0.0.1/hook", "10.0.0.1 is a private address"),
    ("http://172.16.5.4/hook", "172.16.5.4 is a private address"),
    ("http://192.168.1.1/hook", "192.168.1.1 is a private address"),
    ("http://[::ffff:192.168.1.1]/hook", "[::ffff:c0a8:101] is a private address"),
    ("http://[fd12:3456::1]/hook", "[fd12:3456::1] is a private address"),
    ("http://100.64.0.1/hook", "100.64.0.1 is a carrier-grade NAT address"),
    ("http://169.254.10.10/hook", "169.254.10.10 is a link-local address"),
    ("http://[fe80::1]/hook", "[fe80::1] is a link-local address"),
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a cloud metadata address"),
    ("http://2852039166/latest/meta-data/", "169.254.169.254 is a cloud metadata address"),
    ("http://[::ffff:169.254.169.254]/", "[::ffff:a9fe:a9fe] is a cloud metadata address"),
    ("http://[fd00:ec2::254]/latest/meta-data/", "[fd00:ec2::254] is a cloud metadata address"),
    ("http://metadata.google.internal/computeMetadata/v1/", "metadata.google.internal is a cloud metadata address"),
    ("http://224.0.0.1/hook", "224.0.0.1 is a multicast address"),
    ("http://[ff02::1]/hook", "[ff02::1] is a multicast address"),
    ("http://255.255.255.255/hook", "255.255.255.255 is the broadcast address"),
    ("http://0.1.2.3/hook", "0.1.2.3 is a reserved address"),
    ("http://192.0.0.8/hook", "192.0.0.8 is a reserved address"),
    ("http://198.18.0.1/hook", "198.18.0.1 is a reserved address"),
    ("http://240.0.0.1/hook", "240.0.0.1 is a reserved address"),
];

/// A `shopfloor api` on the test's database with these extra variables.
async fn api(db: &TestDb, env: &[(&str, &str)]) -> Listening {
    let mut cmd = shopfloor(&["api", "--log", "warn"], &db.url);
    cmd.env_remove("SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE").envs(env.iter().copied());
    listen(cmd).await
}

/// Org `acme` with project `web`; the owner's token.
async fn seed(db: &TestDb) -> String {
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    let acme = acme(&mut ch).await;
    let token = owner_token(&mut ch, &acme, "targets", 1).await;
    ch.commit().await.unwrap();
    token
}

/// POSTs a subscription to `url`; the status and the body (a problem's detail is checked to
/// come with its content type).
async fn subscribe(base: &str, token: &str, url: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{base}{WEBHOOKS}"))
        .bearer_auth(token)
        .json(&json!({ "url": url, "events": ["run.completed"] }))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let kind = r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    if status >= 400 {
        assert_eq!(kind, "application/problem+json", "{url}: {body}");
    }
    (status, body)
}

async fn stored(db: &TestDb) -> (i64, i64) {
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_subscriptions").fetch_one(&db.pool).await.unwrap();
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'webhook.create'").fetch_one(&db.pool).await.unwrap();
    (rows, audited)
}

#[tokio::test(flavor = "multi_thread")]
async fn internal_targets_are_refused_when_a_webhook_is_made() {
    let db = test_db().await;
    let token = seed(&db).await;
    let Listening { proc: server, base } = api(&db, &[]).await;

    for (url, why) in INTERNAL {
        let (status, problem) = subscribe(&base, &token, url).await;
        assert_eq!(status, 422, "{url}: {problem}");
        assert_eq!(problem["detail"], format!("url must not point inside the network: {why}"), "{url}");
    }
    for (url, why) in [
        ("http://user:secret@hooks.example.com/hook", "url must not carry a user name or password"),
        ("ftp://hooks.example.com/hook", "url must be an http:// or https:// URL"),
    ] {
        let (status, problem) = subscribe(&base, &token, url).await;
        assert_eq!((status, problem["detail"].as_str()), (422, Some(why)), "{url}: {problem}");
    }
    assert_eq!(stored(&db).await, (0, 0), "a refused subscription left a row");

    // A public URL is taken (its name is judged again, after resolution, at each send).
    let (status, made) = subscribe(&base, &token, "https://hooks.example.com/shopfloor").await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(stored(&db).await, (1, 1));
    drop(server);

    // On premises: loopback and private targets are taken; metadata and the like are not.
    let Listening { proc: _server, base } = api(&db, &[("SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE", "true")]).await;
    let (taken, refused) = (201, 422);
    for (url, want) in [
        ("http://127.0.0.1:8080/hook", taken),
        ("http://2130706433/hook", taken),
        ("http://[::1]/hook", taken),
        ("http://10.0.0.1/hook", taken),
        ("http://localhost:3000/hook", taken),
        ("http://100.64.0.1/hook", taken),
        ("http://169.254.169.254/latest/meta-data/", refused),
        ("http://[fd00:ec2::254]/", refused),
        ("http://metadata.google.internal/", refused),
        ("http://169.254.10.10/", refused),
        ("http://0.0.0.0/", refused),
        ("http://255.255.255.255/", refused),
    ] {
        let (status, answer) = subscribe(&base, &token, url).await;
        assert_eq!(status, want, "{url}: {answer}");
    }
    assert_eq!(stored(&db).await, (7, 7));
    db.finish().await;
}
