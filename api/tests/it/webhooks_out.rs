//! Outgoing webhooks end to end: a receiver on loopback that fails the first two deliveries
//! gets the third (retried with backoff by the engine, nothing polling); each delivery's
//! signature verifies with the subscription's secret; the delivery log shows every attempt with
//! the receiver's answer; an API call replays a delivery, which arrives with the same body.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode as AxumStatus};
use hmac::{Hmac, Mac};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sha2::Sha256;

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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
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
        .json(Method::POST, &format!("{BASE}/webhooks"), &org.admin, Some(&json!({ "url": url, "secret": secret, "events": ["run.completed", "run.cancelled"] })), StatusCode::CREATED)
        .await;
    let webhook = made["id"].as_str().unwrap().to_owned();
    assert_eq!(made["secret"], secret);
    // The secret is never shown again.
    let listed = app.json(Method::GET, &format!("{BASE}/webhooks"), &org.admin, None, StatusCode::OK).await;
    assert!(listed["items"][0].get("secret").is_none(), "{listed}");

    // A run that is cancelled: one `run.cancelled` event, one delivery.
    let run = app.json(Method::POST, &format!("{BASE}/runs"), &org.member, Some(&json!({ "workflow": "approve" })), StatusCode::CREATED).await;
    let run = run["id"].as_str().unwrap().to_owned();
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
    assert_eq!((body["type"].as_str(), body["run"].as_str(), body["org"].as_str(), body["workflow"].as_str()), (Some("run.cancelled"), Some(run.as_str()), Some("acme"), Some("approve")));
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

    // Only the events it subscribed to: nothing for the run's start, steps or waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(got.lock().unwrap().len(), 4);
    app.finish().await;
}
