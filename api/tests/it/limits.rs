//! The abuse limits over HTTP, against the whole app served as `shopfloor api` serves it (REST,
//! webhooks, console; each request with its peer's address), with limits set low: a token over
//! its rate, a spray of made-up tokens caught per address (never a signed webhook delivery from
//! it), sign-in per address, the cap on
//! open event streams, bodies refused by their declared length before they are read, and the
//! request timeout, which cuts neither an event stream nor the host claim's long poll.
//!
//! Addresses: the server listens on 127.0.0.1, and a client can come from any 127.0.0.0/8
//! address (`from`), so each part of a test is a client of its own.

use std::net::IpAddr;
use std::time::Duration;

use api::http::limits::LimitArgs;
use engine::ids::Slug;
use engine::store::{Actor, Change, tenants};
use reqwest::header::{CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::support::{self, App, problem};

const SECRET: &str = "the limits test's webhook secret";
const PROJECTS: &str = "/api/v1/orgs/acme/projects";
const EVENTS: &str = "/api/v1/orgs/acme/projects/web/events";

/// A client whose connections come from `ip` (a loopback address), following no redirect.
fn from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder().local_address(ip.parse::<IpAddr>().ok()).redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// Sends requests made by `request` (given the attempt's number) until one answers 429, at
/// most 200; returns how many were answered before it, each checked by `before`, and the 429.
async fn until_refused(request: impl Fn(usize) -> reqwest::RequestBuilder, before: impl Fn(StatusCode)) -> (usize, HeaderMap, Vec<u8>) {
    for i in 0..200 {
        let resp = request(i).send().await.expect("the server answers");
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
        if status == StatusCode::TOO_MANY_REQUESTS {
            return (i, headers, body);
        }
        before(status);
    }
    panic!("200 requests in a row and none was refused");
}

fn retry_after(headers: &HeaderMap) -> u64 {
    headers.get(RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).expect("a Retry-After of whole seconds")
}

#[tokio::test]
async fn a_token_over_its_rate_is_refused_with_retry_after_and_others_are_not() {
    let app = App::with_limits(&LimitArgs { per_token: 1, per_token_burst: 5, ..LimitArgs::default() }, SECRET).await;
    let org = app.org("acme").await;
    let (passed, headers, body) = until_refused(|_| app.http.get(app.url(PROJECTS)).bearer_auth(&org.owner), |s| assert_eq!(s, StatusCode::OK)).await;
    assert!(passed >= 5, "the burst of 5 passes first, {passed} did");
    let p = problem(StatusCode::TOO_MANY_REQUESTS, &headers, &body);
    assert_eq!(p.kind, "https://shopfloor.dev/problems/rate-limited");
    // One request a second: the next is at most a second away.
    assert_eq!(retry_after(&headers), 1);
    // Another token, from the same address, has its own bucket.
    app.json(Method::GET, PROJECTS, &org.member, None, StatusCode::OK).await;
    app.finish().await;
}

#[tokio::test]
async fn made_up_tokens_and_anonymous_requests_are_counted_per_address() {
    let app = App::with_limits(&LimitArgs { per_address: 1, per_address_burst: 5, ..LimitArgs::default() }, SECRET).await;
    let org = app.org("acme").await;

    // Each token is new, so no token bucket stops the spray: its 401s empty the address's.
    let sprayer = from("127.0.0.2");
    let (passed, headers, body) =
        until_refused(|i| sprayer.get(app.url(PROJECTS)).bearer_auth(format!("made.up.{i}")), |s| assert_eq!(s, StatusCode::UNAUTHORIZED)).await;
    assert!(passed >= 5, "{passed}");
    let p = problem(StatusCode::TOO_MANY_REQUESTS, &headers, &body);
    assert_eq!(p.kind, "https://shopfloor.dev/problems/rate-limited");
    assert_eq!(retry_after(&headers), 1);

    // Another address is not refused, with a token or without one.
    let neighbour = from("127.0.0.3");
    assert_eq!(neighbour.get(app.url(PROJECTS)).bearer_auth(&org.owner).send().await.unwrap().status(), StatusCode::OK);
    assert_eq!(neighbour.get(app.url("/healthz")).send().await.unwrap().status(), StatusCode::OK);

    // Requests without a credential are charged to their address too.
    let anonymous = from("127.0.0.4");
    let (passed, headers, body) = until_refused(|_| anonymous.get(app.url("/healthz")), |s| assert_eq!(s, StatusCode::OK)).await;
    assert!(passed >= 5, "{passed}");
    problem(StatusCode::TOO_MANY_REQUESTS, &headers, &body);
    app.finish().await;
}

/// A delivery of GitHub's `ping` event, signed with `secret`.
fn ping(client: &reqwest::Client, app: &App, secret: &str) -> reqwest::RequestBuilder {
    let body = br#"{"zen":"Keep it logically awesome.","hook_id":1}"#;
    client
        .post(app.url("/webhooks/github"))
        .header(CONTENT_TYPE, "application/json")
        .header("x-github-event", "ping")
        .header("x-github-delivery", uuid::Uuid::new_v4().to_string())
        .header("x-hub-signature-256", shopfloor_tests::github_fake::payloads::sign(secret, body))
        .body(body.as_slice())
}

#[tokio::test]
async fn a_signed_delivery_is_taken_from_an_address_that_bad_signatures_emptied() {
    let app = App::with_limits(&LimitArgs { per_address: 1, per_address_burst: 3, ..LimitArgs::default() }, SECRET).await;
    // Someone behind GitHub's address (or the same proxy) sends badly signed deliveries until
    // the address is refused.
    let shared = from("127.0.0.7");
    let (passed, ..) = until_refused(|_| ping(&shared, &app, "not the secret"), |s| assert_eq!(s, StatusCode::UNAUTHORIZED)).await;
    assert!(passed >= 2, "{passed}");
    assert_eq!(ping(&shared, &app, "not the secret").send().await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    // GitHub's own deliveries from there are still taken, every one.
    for _ in 0..10 {
        let status = ping(&shared, &app, SECRET).send().await.unwrap().status();
        assert!(status.is_success(), "a signed delivery was answered {status}");
    }
    // A request without a signature is refused before its body is read.
    let unsigned = shared.post(app.url("/webhooks/github")).header("x-github-event", "ping").body("{}").send().await.unwrap();
    assert_eq!(unsigned.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(unsigned.headers().contains_key(RETRY_AFTER));
    app.finish().await;
}

#[tokio::test]
async fn a_connection_that_sends_its_head_slowly_is_closed() {
    let app = App::with_limits(&LimitArgs::default(), SECRET).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    // Until the server closes `conn` (a read sees its end, or a write fails); what it read.
    let until_closed = |mut conn: tokio::net::TcpStream, trickle: bool| async move {
        let mut read = Vec::new();
        let mut buf = [0u8; 512];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            assert!(tokio::time::Instant::now() < deadline, "a connection was never closed");
            if trickle && conn.write_all(b"a").await.is_err() {
                return read;
            }
            match tokio::time::timeout(Duration::from_secs(1), conn.read(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => return read,
                Ok(Ok(n)) => read.extend_from_slice(&buf[..n]),
                Err(_) => {}
            }
        }
    };
    // Half a request head, then a byte each second: never the end of the head.
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Slow: ").await.unwrap();
    // A connection that never sends a byte.
    let idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    // One kept alive after its answer, sending nothing more.
    let mut kept = tokio::net::TcpStream::connect(&addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n").await.unwrap();
    let (_, idle, kept) = tokio::join!(until_closed(slow, true), until_closed(idle, false), until_closed(kept, false));
    assert!(idle.is_empty());
    assert!(kept.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&kept));
    app.finish().await;
}

#[tokio::test]
async fn a_trusted_proxy_names_the_address_that_is_counted() {
    let app = App::with_limits(&LimitArgs { per_address: 1, per_address_burst: 3, trust_forwarded_for: true, ..LimitArgs::default() }, SECRET).await;
    // One peer (the proxy), two clients behind it.
    let proxy = from("127.0.0.5");
    for client in ["203.0.113.1", "203.0.113.2"] {
        let forwarded = format!("198.51.100.77, {client}");
        let (passed, ..) = until_refused(|_| proxy.get(app.url("/healthz")).header("x-forwarded-for", &forwarded), |s| assert_eq!(s, StatusCode::OK)).await;
        assert!(passed >= 3, "{client} behind the proxy has a bucket of its own: {passed} passed");
    }
    app.finish().await;
}

#[tokio::test]
async fn console_sign_in_and_the_oauth_callback_are_limited_per_address() {
    let app = App::with_limits(&LimitArgs { signin_per_minute: 1, signin_burst: 3, ..LimitArgs::default() }, SECRET).await;
    let not_refused = |s: StatusCode| assert_ne!(s, StatusCode::TOO_MANY_REQUESTS);
    let tries = [
        ("127.0.0.6", Method::POST, "/signin/token"),
        ("127.0.0.7", Method::GET, "/auth/github/callback?code=c0de&state=st4te"),
        ("127.0.0.8", Method::GET, "/auth/github"),
    ];
    for (ip, method, path) in tries {
        let client = from(ip);
        let request = |_| {
            let request = client.request(method.clone(), app.url(path));
            if method == Method::POST { request.form(&[("token", "not a token"), ("next", "/")]) } else { request }
        };
        let (passed, headers, body) = until_refused(request, not_refused).await;
        assert!(passed >= 3, "{path}: the burst of 3 passes first, {passed} did");
        let ct = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        assert!(ct.starts_with("text/html"), "the console answers with a page: {ct}");
        assert!(String::from_utf8_lossy(&body).contains("Too many attempts"));
        // One attempt a minute: the next is at most a minute away.
        assert!((1..=60).contains(&retry_after(&headers)), "{path}");
    }
    // The sign-in page itself is not an attempt.
    assert_eq!(from("127.0.0.6").get(app.url("/signin")).send().await.unwrap().status(), StatusCode::OK);
    app.finish().await;
}

#[tokio::test]
async fn a_token_holds_at_most_its_streams_and_a_closed_one_frees_its_place() {
    let app = App::with_limits(&LimitArgs { streams_per_token: 2, ..LimitArgs::default() }, SECRET).await;
    let org = app.org("acme").await;
    let first = support::sse(&app, EVENTS, &org.viewer, None).await;
    let _second = support::sse(&app, EVENTS, &org.viewer, None).await;
    let (status, headers, body) = app.send(Method::GET, EVENTS, Some(&org.viewer), None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let p = problem(status, &headers, &body);
    assert!(p.detail.contains("2 event streams open"), "{}", p.detail);
    // Another token has places of its own.
    let _others = support::sse(&app, EVENTS, &org.member, None).await;

    // Closing one gives its place back once the server sees the connection go.
    drop(first);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let _third = loop {
        let resp = app.http.get(app.url(EVENTS)).bearer_auth(&org.viewer).send().await.unwrap();
        if resp.status() == StatusCode::OK {
            break resp;
        }
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(tokio::time::Instant::now() < deadline, "the closed stream's place never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    app.finish().await;
}

/// Sends `head` and a few bytes of a body the head says is far longer, then reads the answer's
/// status line and headers: the server must answer without waiting for the rest.
async fn declared_too_long(app: &App, head: &str) -> String {
    let addr = app.base.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(b"{\"action\":").await.unwrap();
    let mut answer = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "the server closed the connection without answering");
            answer.extend_from_slice(&buf[..n]);
        }
    };
    // Generous, and still shorter than the request timeout (30 s) that would answer 503.
    tokio::time::timeout(Duration::from_secs(20), read).await.expect("an answer without the body");
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn bodies_declared_over_the_limit_are_refused_before_they_are_read() {
    let app = App::with_limits(&LimitArgs::default(), SECRET).await;
    let org = app.org("acme").await;
    let webhook = "POST /webhooks/github HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nX-GitHub-Event: issues\r\n\
                   X-GitHub-Delivery: d-1\r\nX-Hub-Signature-256: sha256=00\r\nContent-Length: 30000000\r\n\r\n";
    let answer = declared_too_long(&app, webhook).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("content-type: application/problem+json"), "{answer}");

    let rest = format!(
        "POST {PROJECTS} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 2097152\r\n\r\n",
        org.owner
    );
    let answer = declared_too_long(&app, &rest).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("content-type: application/problem+json"), "{answer}");

    app.finish().await;
}

#[tokio::test]
async fn a_request_over_the_timeout_is_answered_503_but_streams_and_claims_are_not_cut() {
    let app = App::with_limits(&LimitArgs { request_timeout_secs: 1, ..LimitArgs::default() }, SECRET).await;
    let org = app.org("acme").await;
    let mut stream = support::sse(&app, EVENTS, &org.viewer, None).await;

    // A create that waits on a row another transaction holds: the project `blocked`, inserted
    // and not committed.
    let mut holder = Change::begin(app.pool(), Actor::System).await.unwrap();
    tenants::create_project(&mut holder, org.id, &Slug::parse("blocked").unwrap(), "blocked").await.unwrap();
    let (status, headers, body) = app.send(Method::POST, PROJECTS, Some(&org.admin), Some(&json!({ "slug": "blocked" }))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let p = problem(status, &headers, &body);
    assert_eq!(p.kind, "https://shopfloor.dev/problems/timeout");
    drop(holder);
    // The stopped request left nothing behind: the same create now succeeds.
    app.json(Method::POST, PROJECTS, &org.admin, Some(&json!({ "slug": "blocked" })), StatusCode::CREATED).await;

    // The stream, open since before that second, still carries events.
    let run = app.created("/api/v1/orgs/acme/projects/web/runs", &org.member, &json!({ "workflow": "approve" })).await;
    stream.until("the new run's first event", |e| e.data["run"] == run.as_str()).await;

    // A claim that waits 3 s for work answers 200 when its wait is over.
    let registration = app.json(Method::POST, "/api/v1/orgs/acme/projects/web/host-registrations", &org.owner, None, StatusCode::CREATED).await;
    let registration = registration["token"].as_str().unwrap().to_owned();
    let host = json!({ "name": "patient", "capabilities": ["linux"], "max_concurrent": 1 });
    let credential = app.json(Method::POST, "/api/v1/host/register", &registration, Some(&host), StatusCode::CREATED).await;
    let credential = credential["token"].as_str().unwrap().to_owned();
    let claimed = app.json(Method::POST, "/api/v1/host/claim", &credential, Some(&json!({ "max": 0, "wait_secs": 3 })), StatusCode::OK).await;
    assert_eq!(claimed["assignments"], json!([]));
    app.finish().await;
}
