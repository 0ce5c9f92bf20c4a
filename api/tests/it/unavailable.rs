//! While the database is away (its link cut, as in a failover's gap), every route answers 503
//! with `Retry-After` and the `unavailable` problem type; once it is back, the same requests are
//! served, and nothing stored before was lost. (The console's pages answer the same way:
//! `console::error`'s tests.)

use std::net::SocketAddr;
use std::time::Duration;

use reqwest::{Method, StatusCode, header};
use shopfloor_tests::proxy::Proxy;

use crate::harness::App;
use crate::support::problem;

/// The PostgreSQL server the tests' databases live on.
fn server() -> SocketAddr {
    let url = reqwest::Url::parse(&std::env::var("DATABASE_URL").expect("make test sets DATABASE_URL")).unwrap();
    SocketAddr::new(url.host_str().unwrap().parse().unwrap(), url.port().unwrap_or(5432))
}

#[tokio::test]
async fn while_the_database_is_away_every_route_answers_503_with_retry_after() {
    let proxy = Proxy::start(server()).await.unwrap();
    let app = App::serve_through(Some(&proxy), true, |state, _| {
        api::cli::app(state, Some("a webhook secret".to_owned().into()), api::console::ConsoleConfig::default())
    })
    .await;
    let org = app.org("acme").await;
    let runs = "/api/v1/orgs/acme/projects/web/runs";
    let before = app.json(Method::GET, runs, &org.owner, None, StatusCode::OK).await;

    proxy.cut_for(Duration::from_secs(3600));
    let submit = serde_json::json!({ "workflow": "approve", "inputs": [{}] });
    for (method, path, body) in [
        (Method::GET, runs, None),
        (Method::POST, runs, Some(&submit)),
        (Method::GET, "/api/v1/orgs/acme/projects/web/workflows", None),
        (Method::GET, "/api/v1/orgs/acme/members", None),
    ] {
        let (status, headers, bytes) = app.send(method.clone(), path, Some(&org.owner), body).await;
        let p = problem(status, &headers, &bytes);
        assert_eq!((status, p.kind.as_str()), (StatusCode::SERVICE_UNAVAILABLE, "https://shopfloor.dev/problems/unavailable"), "{method} {path}: {p:?}");
        assert_eq!(headers.get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()), Some("5"), "{method} {path}");
    }
    // Back: the same request is served, with what was there before.
    proxy.heal();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (status, _, bytes) = app.send(Method::GET, runs, Some(&org.owner), None).await;
        if status == StatusCode::OK {
            assert_eq!(serde_json::from_slice::<serde_json::Value>(&bytes).unwrap(), before);
            break;
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(tokio::time::Instant::now() < deadline, "the API did not come back with its database");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    app.finish().await;
}
