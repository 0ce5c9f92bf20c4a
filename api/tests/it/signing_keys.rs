//! Signing keys sealed at rest, rotated and retired, against a real `shopfloor serve` on a
//! database of the test's own, with `shopfloor admin` run beside it as an operator runs it: the
//! server learns of a rotation or a retirement only from the database, as any other replica
//! would. Also: the rows hold no plaintext, plaintext keys of an earlier release are sealed at
//! start without logging anyone out, and a missing, malformed or wrong `SHOPFLOOR_SECRET_KEY`
//! ends the process with one line that says what to set.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use engine::sealing::Sealed;
use engine::testkit::{SECRET_KEY, TestDb, secret_key, test_db};
use reqwest::StatusCode;
use secrecy::ExposeSecret as _;
use serde_json::{Value, json};

use crate::support::{KillOnDrop, Ran};

const BIN: &str = env!("CARGO_BIN_EXE_shopfloor");
/// Another well-formed key than the one that sealed the test's signing keys.
const OTHER_KEY: &str = "b3RoZXIga2V5IG9mIGV4YWN0bHkgMzIgYnl0ZXMgLi4=";

/// `shopfloor ARGS` on the test's database with the secret key `key` (none: unset).
fn shopfloor(db: &TestDb, key: Option<&str>, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env("DATABASE_URL", &db.url).env("SHOPFLOOR_LOG", "warn").env_remove("SHOPFLOOR_SECRET_KEY");
    if let Some(key) = key {
        cmd.env("SHOPFLOOR_SECRET_KEY", key);
    }
    cmd
}

fn run(mut cmd: Command) -> Ran {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    Ran { code: out.status.code().unwrap_or(-1), stdout: String::from_utf8(out.stdout).unwrap(), stderr: String::from_utf8(out.stderr).unwrap() }
}

fn admin(db: &TestDb, args: &[&str]) -> Ran {
    let mut all = vec!["admin"];
    all.extend_from_slice(args);
    run(shopfloor(db, Some(SECRET_KEY), &all))
}

/// A server on the test's database, ready.
struct Server {
    _child: KillOnDrop,
    base: String,
    http: reqwest::Client,
}

impl Server {
    async fn start(db: &TestDb) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut cmd = shopfloor(db, Some(SECRET_KEY), &["serve", "--log", "warn"]);
        cmd.env("SHOPFLOOR_LISTEN", format!("127.0.0.1:{port}")).env("SHOPFLOOR_DRAIN_SECS", "2").stdout(Stdio::null()).stderr(Stdio::inherit());
        let mut child = KillOnDrop(cmd.spawn().expect("spawn shopfloor serve"));
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !http.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status() == 200) {
            assert!(child.0.try_wait().unwrap().is_none(), "shopfloor serve exited before it was ready");
            assert!(Instant::now() < deadline, "shopfloor serve was not ready within 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Server { _child: child, base, http }
    }

    /// What the server answers a read of the org with `token`.
    async fn status(&self, token: &str) -> StatusCode {
        self.http.get(format!("{}/api/v1/orgs/acme/members", self.base)).bearer_auth(token).send().await.unwrap().status()
    }

    /// A new token minted over the API with `token`.
    async fn mint(&self, token: &str) -> String {
        let r = self.http.post(format!("{}/api/v1/orgs/acme/tokens", self.base)).bearer_auth(token).json(&json!({ "name": "next" })).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        let body: Value = r.json().await.unwrap();
        body["token"].as_str().unwrap().to_owned()
    }
}

/// The org `acme` and its owner's first token.
/// A test database with the org `acme`, made as `shopfloor admin create-org` makes it; answers
/// the owner's token it printed.
async fn db_with_org() -> (TestDb, String) {
    let db = test_db().await;
    let token = admin(&db, &["create-org", "--slug", "acme", "--owner-email", "owner@acme.test"]).ok().stdout.trim().to_owned();
    (db, token)
}

fn kid(token: &str) -> String {
    jsonwebtoken::decode_header(token).unwrap().kid.unwrap()
}

/// The word after `after` in `line`, without trailing punctuation.
fn word_after<'a>(line: &'a str, after: &str) -> &'a str {
    let rest = line.split_once(after).unwrap_or_else(|| panic!("no `{after}` in: {line}")).1;
    rest.split_whitespace().next().unwrap().trim_end_matches([';', ':', ','])
}

#[tokio::test]
async fn a_rotation_signs_new_tokens_with_a_new_key_and_old_tokens_keep_working() {
    let (db, first) = db_with_org().await;
    let server = Server::start(&db).await;
    assert_eq!(server.status(&first).await, StatusCode::OK);

    let rotated = admin(&db, &["rotate-signing-key"]).ok();
    let new_kid = word_after(rotated.line(), "new tokens are signed by ").to_owned();
    assert_ne!(new_kid, kid(&first));
    assert!(rotated.line().contains(&kid(&first)), "names the previous key: {}", rotated.line());

    let next = server.mint(&first).await;
    assert_eq!(kid(&next), new_kid, "the server signs with the new key");
    assert_eq!(server.status(&first).await, StatusCode::OK, "no one is logged out by a rotation");
    assert_eq!(server.status(&next).await, StatusCode::OK);

    // At rest: no plaintext column, and the sealed bytes show nothing of the secret they open
    // to, which is the key that signed the token (checked by verifying it).
    let rows: Vec<(String, Option<Vec<u8>>, Vec<u8>)> =
        sqlx::query_as("SELECT kid, secret, sealed FROM signing_keys ORDER BY created_at").fetch_all(&db.pool).await.unwrap();
    assert_eq!(rows.len(), 2);
    for (kid_of_row, plaintext, sealed) in &rows {
        assert!(plaintext.is_none(), "{kid_of_row} has a plaintext secret");
        let opened = secret_key().open(Sealed::SigningKey(kid_of_row), sealed).unwrap();
        let secret = opened.expose_secret();
        assert_eq!(secret.len(), 32);
        assert!(!sealed.windows(8).any(|w| secret.windows(8).any(|s| s == w)), "{kid_of_row}'s sealed bytes hold part of its secret");
        let hex = data_encoding::HEXLOWER.encode(secret);
        let as_text: String =
            sqlx::query_scalar("SELECT signing_keys::text FROM signing_keys WHERE kid = $1").bind(kid_of_row).fetch_one(&db.pool).await.unwrap();
        assert!(!as_text.contains(&hex), "the row as text shows the secret");
        let token = if *kid_of_row == new_kid { &next } else { &first };
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
        validation.validate_aud = false;
        jsonwebtoken::decode::<Value>(token, &jsonwebtoken::DecodingKey::from_secret(secret), &validation).expect("the opened secret is the one that signed");
    }
    drop(server);
    db.finish().await;
}

#[tokio::test]
async fn a_retired_key_is_refused_after_its_grace_even_by_a_server_that_cached_it() {
    let (db, first) = db_with_org().await;
    let old_kid = kid(&first);
    let server = Server::start(&db).await;
    // The server has the key in its cache from now on.
    assert_eq!(server.status(&first).await, StatusCode::OK);

    // Retiring the only current key makes its successor; within the grace the old key's
    // tokens still work, and new ones are signed by the successor.
    let retired = admin(&db, &["retire-signing-key", &old_kid, "--grace", "1h"]).ok();
    assert!(retired.line().starts_with(&format!("retired signing key {old_kid}: its tokens are refused from ")), "{}", retired.line());
    let successor = word_after(retired.line(), "new tokens are signed by ").to_owned();
    assert_eq!(server.status(&first).await, StatusCode::OK, "the grace is not over");
    let next = server.mint(&first).await;
    assert_eq!(kid(&next), successor);

    // Retiring again with a shorter grace brings the end closer: now. The server, which never
    // heard of it, refuses the old key once its cache entry is read again.
    admin(&db, &["retire-signing-key", &old_kid, "--grace", "0s"]).ok();
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.status(&first).await != StatusCode::UNAUTHORIZED {
        assert!(Instant::now() < deadline, "a token of the retired key was still accepted 60 s after its grace");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(server.status(&next).await, StatusCode::OK, "the successor's tokens work");
    assert_eq!(kid(&server.mint(&next).await), successor, "the service still issues tokens");
    // A longer grace does not bring a retired key back.
    admin(&db, &["retire-signing-key", &old_kid, "--grace", "7d"]).ok();
    let until: bool = sqlx::query_scalar("SELECT verify_until <= now() FROM signing_keys WHERE kid = $1").bind(&old_kid).fetch_one(&db.pool).await.unwrap();
    assert!(until, "the earlier end is kept");

    // Bad input: one line with the fix, exit 2.
    let unknown = admin(&db, &["retire-signing-key", "k-nope"]).fails(2, "no signing key `k-nope`");
    assert!(unknown.stderr.contains(&successor), "lists the keys: {}", unknown.stderr);
    admin(&db, &["retire-signing-key", &successor, "--grace", "soon"]).fails(2, "write it like 0s, 30m, 24h or 7d");
    drop(server);
    db.finish().await;
}

#[tokio::test]
async fn plaintext_keys_of_an_earlier_release_are_sealed_at_start_and_their_tokens_still_work() {
    let (db, first) = db_with_org().await;
    // As the previous release stored it: the secret in plaintext, nothing sealed.
    let (old_kid, sealed): (String, Vec<u8>) = sqlx::query_as("SELECT kid, sealed FROM signing_keys").fetch_one(&db.pool).await.unwrap();
    let secret = secret_key().open(Sealed::SigningKey(&old_kid), &sealed).unwrap().expose_secret().to_vec();
    sqlx::query("UPDATE signing_keys SET secret = $2, sealed = NULL WHERE kid = $1").bind(&old_kid).bind(&secret).execute(&db.pool).await.unwrap();

    let server = Server::start(&db).await;
    let (plaintext, sealed): (Option<Vec<u8>>, Option<Vec<u8>>) =
        sqlx::query_as("SELECT secret, sealed FROM signing_keys WHERE kid = $1").bind(&old_kid).fetch_one(&db.pool).await.unwrap();
    assert!(plaintext.is_none(), "the plaintext is gone once the server has started");
    let sealed = sealed.expect("sealed at start");
    assert_eq!(secret_key().open(Sealed::SigningKey(&old_kid), &sealed).unwrap().expose_secret(), secret.as_slice(), "the same secret, sealed");
    assert_eq!(server.status(&first).await, StatusCode::OK, "no one is logged out by the sealing");
    drop(server);
    db.finish().await;
}

#[tokio::test]
async fn webhook_secrets_of_an_earlier_release_are_sealed_at_start_and_one_sealed_by_another_key_stops_it() {
    let (db, owner) = db_with_org().await;
    let server = Server::start(&db).await;
    let made = server.http.post(format!("{}/api/v1/orgs/acme/projects", server.base)).bearer_auth(&owner).json(&json!({ "slug": "web" })).send().await.unwrap();
    assert_eq!(made.status(), StatusCode::CREATED);
    drop(server);
    // As the previous release stored it: the secret in plaintext.
    // Two of them, sealed in one statement: each must get its own seal.
    let (earlier, id) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    let (earlier_secret, secret) = ("whsec-of-the-first-subscription-9", "whsec-of-an-earlier-release-0123");
    for (subscription, plaintext) in [(earlier, earlier_secret), (id, secret)] {
        sqlx::query(
            "INSERT INTO webhook_subscriptions (org_id, project_id, subscription_id, url, secret, events, created_by) \
             SELECT org_id, project_id, $1, 'https://hooks.example.com/old', $2, ARRAY['run.*'], 'test' FROM projects WHERE slug = 'web'",
        )
        .bind(subscription)
        .bind(plaintext)
        .execute(&db.pool)
        .await
        .unwrap();
    }

    // An engine holds the key now (it signs deliveries), and seals what it finds at start.
    let engine = KillOnDrop(shopfloor(&db, Some(SECRET_KEY), &["engine", "--log", "off"]).stdout(Stdio::null()).stderr(Stdio::inherit()).spawn().unwrap());
    let read = "SELECT secret, sealed_secret FROM webhook_subscriptions WHERE subscription_id = $1";
    let deadline = Instant::now() + Duration::from_secs(60);
    let sealed = loop {
        let (plaintext, sealed): (Option<String>, Option<Vec<u8>>) = sqlx::query_as(read).bind(id).fetch_one(&db.pool).await.unwrap();
        match sealed {
            Some(sealed) => break sealed,
            None => assert!(plaintext.is_some(), "the table keeps one of the two"),
        }
        assert!(Instant::now() < deadline, "the engine did not seal the plaintext secret within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    drop(engine);
    let plaintext: Option<String> =
        sqlx::query_scalar("SELECT secret FROM webhook_subscriptions WHERE subscription_id = $1").bind(id).fetch_one(&db.pool).await.unwrap();
    assert!(plaintext.is_none(), "cleared in the statement that sealed it");
    let opened = secret_key().open(Sealed::WebhookSecret(id), &sealed).unwrap();
    assert_eq!(opened.expose_secret(), secret.as_bytes(), "the same secret: receivers see the same signature");
    let (plaintext, first): (Option<String>, Vec<u8>) =
        sqlx::query_as("SELECT secret, sealed_secret FROM webhook_subscriptions WHERE subscription_id = $1").bind(earlier).fetch_one(&db.pool).await.unwrap();
    assert!(plaintext.is_none());
    assert_eq!(secret_key().open(Sealed::WebhookSecret(earlier), &first).unwrap().expose_secret(), earlier_secret.as_bytes());

    // Sealed by another key (a process of this database given another SHOPFLOOR_SECRET_KEY):
    // a process refuses to start, in one line, rather than fail every delivery.
    let other = engine::sealing::SecretKey::parse(OTHER_KEY).unwrap();
    sqlx::query("UPDATE webhook_subscriptions SET sealed_secret = $2 WHERE subscription_id = $1")
        .bind(id)
        .bind(other.seal(Sealed::WebhookSecret(id), secret.as_bytes()))
        .execute(&db.pool)
        .await
        .unwrap();
    let refused =
        format!("the secret of webhook {id} does not open with this SHOPFLOOR_SECRET_KEY; set the SHOPFLOOR_SECRET_KEY that sealed the webhook secrets");
    for process in ["engine", "api"] {
        let stopped = run(shopfloor(&db, Some(SECRET_KEY), &[process, "--log", "off"])).fails(1, &refused);
        assert!(!stopped.stderr.contains(secret), "{}", stopped.stderr);
    }
    db.finish().await;
}

#[tokio::test]
async fn a_missing_malformed_or_wrong_secret_key_is_one_line_that_says_what_to_set() {
    let (db, _) = db_with_org().await;
    let keys_before: i64 = sqlx::query_scalar("SELECT count(*) FROM signing_keys").fetch_one(&db.pool).await.unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let listen = format!("127.0.0.1:{port}");
    for process in ["serve", "api", "engine"] {
        let start = |key: Option<&str>| {
            let mut cmd = shopfloor(&db, key, &[process, "--log", "off"]);
            cmd.env("SHOPFLOOR_LISTEN", &listen);
            run(cmd)
        };
        start(None).fails(1, "SHOPFLOOR_SECRET_KEY is not set; set SHOPFLOOR_SECRET_KEY to 32 random bytes in base64");
        start(Some("not a key")).fails(1, "SHOPFLOOR_SECRET_KEY is not base64; set SHOPFLOOR_SECRET_KEY to 32 random bytes");
        let short = data_encoding::BASE64.encode(&[7; 16]);
        start(Some(&short)).fails(1, "SHOPFLOOR_SECRET_KEY decodes to 16 bytes, not 32");
        start(Some(OTHER_KEY)).fails(1, "does not open with this SHOPFLOOR_SECRET_KEY; set the SHOPFLOOR_SECRET_KEY that sealed the signing keys");
    }
    // An operator's command with the wrong key changes nothing: a key sealed with it would
    // leave every server unable to sign.
    run(shopfloor(&db, Some(OTHER_KEY), &["admin", "rotate-signing-key"])).fails(1, "does not open with this SHOPFLOOR_SECRET_KEY");
    run(shopfloor(&db, None, &["admin", "rotate-signing-key"])).fails(1, "SHOPFLOOR_SECRET_KEY is not set");
    let keys_after: i64 = sqlx::query_scalar("SELECT count(*) FROM signing_keys").fetch_one(&db.pool).await.unwrap();
    assert_eq!(keys_after, keys_before, "no key was made");
    // The key never shows in what the commands print.
    let mut verbose = shopfloor(&db, Some(OTHER_KEY), &["serve", "--log", "debug"]);
    verbose.env("SHOPFLOOR_LISTEN", &listen);
    let printed = run(verbose);
    assert_ne!(printed.code, 0);
    assert!(!printed.stderr.contains(OTHER_KEY) && !printed.stdout.contains(OTHER_KEY), "{}", printed.stderr);
    db.finish().await;
}
