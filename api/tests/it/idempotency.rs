//! `Idempotency-Key`: the same key with the same request answers the same (once, even under
//! concurrent retries); the same key with another request is refused with 422; keys are
//! scoped to an org.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::{App, problem};

/// Submits `body` to the org's project `web` with the idempotency key `key`; answers the raw
/// response.
async fn post_with_key(app: &App, token: &str, org: &str, key: &str, body: &serde_json::Value) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
    let resp = app
        .http
        .post(app.url(&format!("/api/v1/orgs/{org}/projects/web/runs")))
        .bearer_auth(token)
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    (status, headers, resp.bytes().await.unwrap().to_vec())
}

async fn submit(app: &App, token: &str, org: &str, key: &str, body: &serde_json::Value) -> (StatusCode, reqwest::header::HeaderMap, serde_json::Value) {
    let (status, headers, bytes) = post_with_key(app, token, org, key, body).await;
    (status, headers, serde_json::from_slice(&bytes).unwrap())
}

async fn runs(app: &App) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM runs").fetch_one(app.pool()).await.unwrap()
}

#[tokio::test]
async fn a_key_makes_a_create_happen_once() {
    let app = App::with_engine().await;
    let acme = app.org("acme").await;
    let other = app.org("other").await;
    let body = json!({ "workflow": "approve", "input": { "n": 1 } });

    let (status, headers, first) = submit(&app, &acme.member, "acme", "key-1", &body).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get("idempotent-replayed").is_none());
    // The same request again: the same answer, marked as a replay; no second run.
    let (status, headers, again) = submit(&app, &acme.member, "acme", "key-1", &json!({ "input": { "n": 1 }, "workflow": "approve" })).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers.get("idempotent-replayed").unwrap(), "true");
    assert_eq!(again, first);
    assert_eq!(runs(&app).await, 1);

    // The same key with another body is refused.
    let resp = app
        .http
        .post(app.url("/api/v1/orgs/acme/projects/web/runs"))
        .bearer_auth(&acme.member)
        .header("idempotency-key", "key-1")
        .json(&json!({ "workflow": "approve", "input": { "n": 2 } }))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let p = problem(status, &headers, &resp.bytes().await.unwrap());
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(p.kind, "https://shopfloor.dev/problems/idempotency-key-reused");
    assert_eq!(runs(&app).await, 1);

    // Concurrent retries with one key make one run, and all get its answer.
    let attempts = (0..8).map(|_| submit(&app, &acme.member, "acme", "key-2", &body));
    let answers = futures::future::join_all(attempts).await;
    let ids: std::collections::BTreeSet<String> = answers
        .iter()
        .map(|(s, _, b)| {
            assert_eq!(*s, StatusCode::CREATED, "{b}");
            b["id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(runs(&app).await, 2);

    // Keys belong to an org: another org's same key is a new request.
    let (status, _, theirs) = submit(&app, &other.member, "other", "key-1", &body).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_ne!(theirs["id"], first["id"]);
    assert_eq!(runs(&app).await, 3);

    // Other creates honour it too; without a key, a second create of the same slug conflicts.
    let create = |key: Option<&'static str>| {
        let mut req = app.http.post(app.url("/api/v1/orgs/acme/projects")).bearer_auth(&acme.owner).json(&json!({ "slug": "api" }));
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        req.send()
    };
    let one = create(Some("p-1")).await.unwrap();
    assert_eq!(one.status(), StatusCode::CREATED);
    let one: serde_json::Value = one.json().await.unwrap();
    let two = create(Some("p-1")).await.unwrap();
    assert_eq!(two.status(), StatusCode::CREATED);
    assert_eq!(two.json::<serde_json::Value>().await.unwrap(), one);
    assert_eq!(create(None).await.unwrap().status(), StatusCode::CONFLICT);

    // A malformed key is refused before anything happens.
    for bad in ["", &"k".repeat(256), "spaced key"] {
        let (status, headers, bytes) = post_with_key(&app, &acme.member, "acme", bad, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "key {bad:?}");
        problem(status, &headers, &bytes);
    }
    assert_eq!(runs(&app).await, 3);
    let _ = Method::GET;
    app.finish().await;
}
