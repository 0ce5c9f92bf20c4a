//! Outgoing webhooks end to end: a receiver on loopback that fails the first two deliveries
//! gets the third (retried with backoff by the engine, nothing polling); each delivery's
//! signature verifies with the subscription's secret; the delivery log shows every attempt with
//! the receiver's answer; an API call replays a delivery, which arrives with the same body.
//!
//! The walls at send time (`engine::net_guard`): a public name that resolves to 127.0.0.1 and
//! a stored loopback URL are refused without a connection, failed at once with the reason; the
//! same name is delivered when private targets are allowed; and a receiver that answers
//! 100 MB has a few KiB of it read before the engine drops the connection.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode as AxumStatus};
use hmac::{Hmac, Mac};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{App, Webhooks};

const BASE: &str = "/api/v1/orgs/acme/projects/web";

#[derive(Clone, Debug)]
struct Received {
    headers: HeaderMap,
    body: Bytes,
    at: tokio::time::Instant,
}

/// A receiver on 127.0.0.1:0 that answers 500 to its first `fail` requests, then 200.
async fn receiver(fail: usize) -> (String, Arc<Mutex<Vec<Received>>>) {
    let got: Arc<Mutex<Vec<Received>>> = Arc::default();
    let seen = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let seen = seen.clone();
            async move {
                let mut all = seen.lock().unwrap();
                all.push(Received { headers, body, at: tokio::time::Instant::now() });
                if all.len() <= fail { (AxumStatus::INTERNAL_SERVER_ERROR, "not now") } else { (AxumStatus::OK, "thanks") }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

async fn until_received(got: &Arc<Mutex<Vec<Received>>>, n: usize) -> Vec<Received> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let now = got.lock().unwrap().clone();
        if now.len() >= n {
            return now;
        }
        assert!(tokio::time::Instant::now() < deadline, "the receiver got {} of {n} deliveries", now.len());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn verifies(secret: &str, r: &Received) -> bool {
    let header = r.headers.get("x-shopfloor-signature-256").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let Some(hex) = header.strip_prefix("sha256=") else { return false };
    let Ok(sig) = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16)).collect::<Result<Vec<u8>, _>>() else { return false };
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(&r.body);
    mac.verify_slice(&sig).is_ok()
}

#[tokio::test]
async fn a_failing_receiver_gets_the_third_attempt_signed_and_a_replay_arrives_again() {
    let app = App::with_webhooks(Webhooks::private()).await;
    let org = app.org("acme").await;
    let (url, got) = receiver(2).await;
    let secret = "a-secret-of-the-receiver-0123456789";
    let made = app
        .json(
            Method::POST,
            &format!("{BASE}/webhooks"),
            &org.admin,
            Some(&json!({ "url": url, "secret": secret, "events": ["run.completed", "run.cancelled"] })),
            StatusCode::CREATED,
        )
        .await;
    let webhook = made["id"].as_str().unwrap().to_owned();
    assert_eq!(made["secret"], secret);
    // The secret is never shown again.
    let listed = app.json(Method::GET, &format!("{BASE}/webhooks"), &org.admin, None, StatusCode::OK).await;
    assert!(listed["items"][0].get("secret").is_none(), "{listed}");
    // At rest it is sealed for this subscription: no plaintext column, nothing of it in the seal.
    let (plaintext, sealed): (Option<String>, Vec<u8>) =
        sqlx::query_as("SELECT secret, sealed_secret FROM webhook_subscriptions WHERE subscription_id = $1::uuid")
            .bind(&webhook)
            .fetch_one(app.pool())
            .await
            .unwrap();
    assert!(plaintext.is_none());
    assert!(!sealed.windows(8).any(|w| secret.as_bytes().windows(8).any(|s| s == w)), "the seal shows none of the secret");
    let id = webhook.parse().unwrap();
    let opened = engine::testkit::secret_key().open(engine::sealing::Sealed::WebhookSecret(id), &sealed).unwrap();
    assert_eq!(secrecy::ExposeSecret::expose_secret(&opened), secret.as_bytes());

    // A run that is cancelled: one `run.cancelled` event, one delivery.
    let run = app.created(&format!("{BASE}/runs"), &org.member, &json!({ "workflow": "approve" })).await;
    app.until(run.parse().unwrap(), "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'ask' AND state = 'waiting')", "ask waiting").await;
    app.json(Method::POST, &format!("{BASE}/runs/{run}/cancel"), &org.member, None, StatusCode::OK).await;

    let three = until_received(&got, 3).await;
    // The same delivery three times, each signed; retried after 1 s, then 4 s.
    let ids: Vec<&str> = three.iter().map(|r| r.headers["x-shopfloor-delivery"].to_str().unwrap()).collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert!(three.iter().all(|r| verifies(secret, r)), "every delivery's signature verifies");
    assert!(!verifies("another secret of the same length", &three[0]));
    assert!(three.iter().all(|r| r.body == three[0].body && r.headers["x-shopfloor-event"] == "run.cancelled"));
    let gaps = [three[1].at - three[0].at, three[2].at - three[1].at];
    assert!(gaps[0] >= Duration::from_millis(900) && gaps[1] >= Duration::from_millis(3_900), "backoff: {gaps:?}");
    let body: Value = serde_json::from_slice(&three[0].body).unwrap();
    assert_eq!(
        (body["type"].as_str(), body["run"].as_str(), body["org"].as_str(), body["workflow"].as_str()),
        (Some("run.cancelled"), Some(run.as_str()), Some("acme"), Some("approve"))
    );
    assert_eq!(body["run_name"], format!("acme:web:{run}"));

    // The log: one delivery, delivered at the third attempt, with each answer.
    let log = app.json(Method::GET, &format!("{BASE}/webhooks/{webhook}/deliveries"), &org.admin, None, StatusCode::OK).await;
    let items = log["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{log}");
    let delivery = items[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(delivery, ids[0]);
    let detail = app.json(Method::GET, &format!("{BASE}/webhooks/{webhook}/deliveries/{delivery}"), &org.admin, None, StatusCode::OK).await;
    assert_eq!((detail["state"].as_str(), detail["attempts"].as_i64(), detail["last_status"].as_i64()), (Some("delivered"), Some(3), Some(200)), "{detail}");
    let answers: Vec<(i64, &str)> =
        detail["attempts_log"].as_array().unwrap().iter().map(|a| (a["status"].as_i64().unwrap(), a["response"].as_str().unwrap())).collect();
    assert_eq!(answers, [(500, "not now"), (500, "not now"), (200, "thanks")]);
    assert_eq!(detail["body"], body);

    // A replay: a new delivery with the same body, signed again.
    let replayed = app.json(Method::POST, &format!("{BASE}/webhooks/{webhook}/deliveries/{delivery}/replay"), &org.admin, None, StatusCode::CREATED).await;
    assert_eq!(replayed["replay_of"], delivery);
    let four = until_received(&got, 4).await;
    let last = &four[3];
    assert_eq!(last.headers["x-shopfloor-delivery"], replayed["id"].as_str().unwrap());
    assert_eq!(last.body, three[0].body);
    assert!(verifies(secret, last));
    let audit = app.json(Method::GET, "/api/v1/orgs/acme/audit?action=webhook.replay", &org.owner, None, StatusCode::OK).await;
    assert_eq!(audit["items"].as_array().unwrap().len(), 1);

    // Only the events it subscribed to: nothing for the run's start, steps or waits. Deliveries
    // are written with their events, and every event of the (cancelled) run is committed, so
    // the log is final: the delivery and its replay.
    let log = app.json(Method::GET, &format!("{BASE}/webhooks/{webhook}/deliveries"), &org.admin, None, StatusCode::OK).await;
    assert_eq!(log["items"].as_array().unwrap().len(), 2, "{log}");
    assert_eq!(got.lock().unwrap().len(), 4);
    app.finish().await;
}

/// Cancels a run parked at its approval: one `run.cancelled` event, so one delivery per
/// subscription to it.
async fn cancelled_run(app: &App, org: &crate::support::Org) -> String {
    let run = app.created(&format!("{BASE}/runs"), &org.member, &json!({ "workflow": "approve" })).await;
    app.until(run.parse().unwrap(), "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'ask' AND state = 'waiting')", "ask waiting").await;
    app.json(Method::POST, &format!("{BASE}/runs/{run}/cancel"), &org.member, None, StatusCode::OK).await;
    run
}

/// Waits until `sql` answers `want`.
async fn until_count(app: &App, sql: &str, want: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let got: i64 = sqlx::query_scalar(sql).fetch_one(app.pool()).await.unwrap();
        if got == want {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{sql}: {got}, expected {want}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A listener on 127.0.0.1:0 that counts the connections made to it and closes each.
async fn connection_counter() -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            drop(conn);
        }
    });
    (port, accepted)
}

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// An app whose engine resolves `hooks.example.com` to 127.0.0.1 (as an attacker's DNS would once
/// a subscription is made), and an org subscribed to `run.cancelled` at that name on `port`:
/// the API takes the name, since it looks public and the API resolves nothing. Returns the
/// subscription's id.
async fn subscribed_by_name(allow_private: bool, port: impl std::fmt::Display) -> (App, crate::support::Org, String) {
    let mut webhooks = Webhooks::public();
    webhooks.engine.allow_private = allow_private;
    webhooks.names.0.insert("hooks.example.com".into(), LOOPBACK);
    let app = App::with_webhooks(webhooks).await;
    let org = app.org("acme").await;
    let url = format!("http://hooks.example.com:{port}/hook");
    let id = app.created(&format!("{BASE}/webhooks"), &org.admin, &json!({ "url": url, "events": ["run.cancelled"] })).await;
    (app, org, id)
}

#[tokio::test]
async fn a_public_name_resolving_to_loopback_is_refused_at_send_and_never_connected_to() {
    let (port, accepted) = connection_counter().await;
    // Public targets only, as a server by default.
    let (app, org, named) = subscribed_by_name(false, port).await;
    // A subscription stored before the check existed (or while private targets were allowed),
    // in the decimal spelling of 127.0.0.1: checked again at send.
    sqlx::query(
        "INSERT INTO webhook_subscriptions (org_id, project_id, subscription_id, url, secret, events, created_by) \
         VALUES ($1, $2, gen_random_uuid(), $3, 'a-secret-of-sixteen-chars', ARRAY['run.cancelled'], 'test')",
    )
    .bind(org.id)
    .bind(org.project)
    .bind(format!("http://2130706433:{port}/hook"))
    .execute(app.pool())
    .await
    .unwrap();

    cancelled_run(&app, &org).await;
    // Both deliveries fail at their first attempt, and are not retried.
    until_count(&app, "SELECT count(*) FROM webhook_deliveries WHERE state = 'failed'", 2).await;
    // One attempt each, with no status and no answer: only the reason.
    let attempts: Vec<(i32, Option<String>)> = sqlx::query_as(
        "SELECT d.attempts, a.error FROM webhook_deliveries d JOIN webhook_attempts a USING (delivery_id) \
         WHERE a.status IS NULL AND a.response IS NULL ORDER BY a.error",
    )
    .fetch_all(app.pool())
    .await
    .unwrap();
    assert_eq!(
        attempts,
        [(1, Some("refused: 127.0.0.1 is a loopback address".to_owned())), (1, Some("refused: hooks.example.com resolves to an internal address".to_owned()))]
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE kind = 'webhook'").fetch_one(app.pool()).await.unwrap();
    assert_eq!(left, 0, "a refused delivery is not due again");
    // The admin's delivery log says why, and nothing of any answer.
    let log = app.json(Method::GET, &format!("{BASE}/webhooks/{named}/deliveries"), &org.admin, None, StatusCode::OK).await;
    let delivery = &log["items"][0];
    assert_eq!(
        (delivery["state"].as_str(), delivery["last_error"].as_str(), delivery["next_at"].as_str()),
        (Some("failed"), Some("refused: hooks.example.com resolves to an internal address"), None),
        "{log}"
    );
    // The deliveries are recorded after the send was refused: no connection was ever made.
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "the loopback listener was connected to");
    app.finish().await;
}

#[tokio::test]
async fn with_private_targets_allowed_the_same_name_is_delivered() {
    // The control of the test above: the same resolver, an engine that allows private targets
    // (`SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE`): the name reaches the receiver on loopback.
    let (url, got) = receiver(0).await;
    let port = url.rsplit_once(':').unwrap().1.trim_end_matches("/hook").to_owned();
    let (app, org, _) = subscribed_by_name(true, &port).await;
    // The API's own policy still refuses a loopback URL.
    let (status, headers, body) =
        app.send(Method::POST, &format!("{BASE}/webhooks"), Some(&org.admin), Some(&json!({ "url": format!("http://127.0.0.1:{port}/hook") }))).await;
    let problem = crate::support::problem(status, &headers, &body);
    assert_eq!((status, problem.detail.as_str()), (StatusCode::UNPROCESSABLE_ENTITY, "url must not point inside the network: 127.0.0.1 is a loopback address"));

    cancelled_run(&app, &org).await;
    let one = until_received(&got, 1).await;
    assert_eq!(one[0].headers["host"], format!("hooks.example.com:{port}"));
    until_count(&app, "SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'", 1).await;
    app.finish().await;
}

/// 100 MB: what a receiver tries to make an engine read.
const FLOOD: u64 = 100 * 1024 * 1024;

/// A receiver on 127.0.0.1:0 that answers each request 200 with a 100 MB body, written as fast
/// as the connection takes it, and adds up the body bytes it managed to write before the
/// connection was closed on it; `ended` counts the connections that are over.
async fn flood() -> (String, Arc<AtomicU64>, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (written, ended) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicUsize::new(0)));
    let (w, e) = (written.clone(), ended.clone());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let (w, e) = (w.clone(), e.clone());
            tokio::spawn(async move {
                // The request: its head, then the body its Content-Length announces.
                let mut request = Vec::new();
                let mut buf = [0u8; 8192];
                let head_end = loop {
                    let n = conn.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        e.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    request.extend_from_slice(&buf[..n]);
                    if let Some(i) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&request[..head_end]).to_ascii_lowercase();
                let length: usize = head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
                while request.len() < head_end + length {
                    let n = conn.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    request.extend_from_slice(&buf[..n]);
                }
                let answer = format!("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {FLOOD}\r\n\r\n");
                if conn.write_all(answer.as_bytes()).await.is_ok() {
                    let chunk = vec![b'a'; 64 * 1024];
                    let mut sent = 0u64;
                    while sent < FLOOD {
                        let left = usize::try_from(FLOOD - sent).unwrap_or(usize::MAX).min(chunk.len());
                        let n = match conn.write(&chunk[..left]).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        sent += n as u64;
                        w.fetch_add(n as u64, Ordering::SeqCst);
                    }
                }
                e.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (url, written, ended)
}

#[tokio::test]
async fn a_receiver_answering_100_mb_has_a_few_kib_read_and_its_connection_dropped() {
    let (url, written, ended) = flood().await;
    let app = App::with_webhooks(Webhooks::private()).await;
    let org = app.org("acme").await;
    app.json(Method::POST, &format!("{BASE}/webhooks"), &org.admin, Some(&json!({ "url": url, "events": ["run.cancelled"] })), StatusCode::CREATED).await;
    cancelled_run(&app, &org).await;

    // Delivered on its 200, with the first 1,000 characters of the answer kept.
    until_count(&app, "SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'", 1).await;
    let (status, response): (Option<i32>, Option<String>) =
        sqlx::query_as("SELECT status, response FROM webhook_attempts").fetch_one(app.pool()).await.unwrap();
    assert_eq!(status, Some(200));
    assert_eq!(response.as_deref(), Some("a".repeat(1000).as_str()));
    // The engine dropped the connection: the receiver's writes fail. Had the engine read the
    // answer through, it would have taken all 100 MB; had it kept the connection without
    // reading, the receiver would still be blocked in a write.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while ended.load(Ordering::SeqCst) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the receiver is still writing: {} bytes so far", written.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let written = written.load(Ordering::SeqCst);
    // What the receiver wrote is what the kernel's socket buffers took (a few MiB at most on
    // loopback), not what the engine read, which is 4 KiB.
    eprintln!("the receiver wrote {written} of {FLOOD} bytes before the engine dropped the connection");
    assert!(written < 16 * 1024 * 1024, "the receiver wrote {written} bytes: the engine read the answer");
    app.finish().await;
}
