//! Keyset paging: a client paging through runs and the audit log while rows are inserted
//! sees every row that existed when it started exactly once, never a row twice, in order;
//! filters narrow lists; bad paging parameters are 400s.

use std::collections::BTreeSet;

use engine::store::runs;
use engine::store::{Actor, Change};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::support::{App, Org};

async fn submit_many(app: &App, org: &Org, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(app.submit_approval(org).await.to_string());
    }
    ids
}

/// Pages through `path` (a list with `next_cursor`), inserting `during` more runs between
/// pages; returns every item's `key` in the order read.
async fn page_all(app: &App, org: &Org, path: &str, key: &str, limit: u32, during: usize) -> Vec<String> {
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let sep = if path.contains('?') { '&' } else { '?' };
        let url = match &cursor {
            Some(c) => format!("{path}{sep}limit={limit}&cursor={c}"),
            None => format!("{path}{sep}limit={limit}"),
        };
        let page: Value = app.json(Method::GET, &url, &org.owner, None, StatusCode::OK).await;
        let items = page["items"].as_array().unwrap();
        assert!(items.len() <= limit as usize);
        seen.extend(items.iter().map(|i| i[key].to_string()));
        pages += 1;
        if pages <= during {
            submit_many(app, org, 1).await;
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return seen,
        }
    }
}

fn assert_once(seen: &[String], before: &[String]) {
    let unique: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "a row was read twice");
    for id in before {
        assert!(unique.contains(id), "{id} existed before paging and was never read");
    }
}

#[tokio::test]
async fn paging_while_rows_are_inserted_has_no_gaps_or_repeats() {
    let app = App::start().await;
    let org = app.org("acme").await;
    let before: Vec<String> = submit_many(&app, &org, 95).await.into_iter().map(|id| format!("\"{id}\"")).collect();

    let seen = page_all(&app, &org, "/api/v1/orgs/acme/projects/web/runs", "id", 7, 30).await;
    assert_once(&seen, &before);
    // Newest first, by (created_at, id).
    let order: Vec<(String, String)> =
        sqlx::query_as("SELECT created_at::text, run_id::text FROM runs ORDER BY created_at DESC, run_id DESC").fetch_all(app.pool()).await.unwrap();
    let rank: std::collections::HashMap<String, usize> = order.iter().enumerate().map(|(i, (_, id))| (id.clone(), i)).collect();
    let ranks: Vec<usize> = seen
        .iter()
        .map(|s| {
            let run: engine::ids::RunId = s.trim_matches('"').parse().unwrap();
            rank[&run.0.to_string()]
        })
        .collect();
    assert!(ranks.windows(2).all(|w| w[0] < w[1]), "runs out of order");

    // The audit log: every `run.submit` entry of before, once.
    let audit_before: Vec<String> = sqlx::query_scalar("SELECT audit_id::text FROM audit_log").fetch_all(app.pool()).await.unwrap();
    let seen = page_all(&app, &org, "/api/v1/orgs/acme/audit", "id", 11, 10).await;
    assert_once(&seen, &audit_before);

    // Filters.
    let submits = app.json(Method::GET, "/api/v1/orgs/acme/audit?action=run.submit&limit=200", &org.owner, None, StatusCode::OK).await;
    assert!(submits["items"].as_array().unwrap().iter().all(|e| e["action"] == "run.submit"));
    let prefixed = app.json(Method::GET, "/api/v1/orgs/acme/audit?action=run.*&limit=5", &org.owner, None, StatusCode::OK).await;
    assert_eq!(prefixed["items"].as_array().unwrap().len(), 5);
    let one = before[0].trim_matches('"');
    let target = app.json(Method::GET, &format!("/api/v1/orgs/acme/audit?target=run:{one}"), &org.owner, None, StatusCode::OK).await;
    assert_eq!(target["items"].as_array().unwrap().len(), 1);
    let future = app.json(Method::GET, "/api/v1/orgs/acme/audit?since=2999-01-01T00:00:00Z", &org.owner, None, StatusCode::OK).await;
    assert!(future["items"].as_array().unwrap().is_empty());
    let system = app.json(Method::GET, "/api/v1/orgs/acme/audit?actor=system:system&limit=1", &org.owner, None, StatusCode::OK).await;
    assert_eq!(system["items"][0]["actor_kind"], "system");

    // Cancel one run, then filter runs by status and workflow.
    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
    runs::cancel(&mut ch, org.id, one.parse().unwrap(), "cancelled").await.unwrap();
    ch.commit().await.unwrap();
    let cancelled = app.json(Method::GET, "/api/v1/orgs/acme/projects/web/runs?status=cancelled", &org.owner, None, StatusCode::OK).await;
    let items = cancelled["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["id"], one);
    let none = app.json(Method::GET, "/api/v1/orgs/acme/projects/web/runs?workflow=nope", &org.owner, None, StatusCode::OK).await;
    assert!(none["items"].as_array().unwrap().is_empty());
    let most = app.json(Method::GET, "/api/v1/orgs/acme/projects/web/runs?limit=200", &org.owner, None, StatusCode::OK).await;
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM runs").fetch_one(app.pool()).await.unwrap();
    assert!(total < 200);
    assert_eq!(most["items"].as_array().unwrap().len() as i64, total, "every run, below the largest page of 200");

    // A limit outside the document's 1 to 200 is refused, never lowered to fit.
    for bad in ["?limit=0", "?limit=201", "?limit=1000", "?limit=2147483648", "?status=sideways", "?substate=dozing"] {
        let (status, headers, body) = app.send(Method::GET, &format!("/api/v1/orgs/acme/projects/web/runs{bad}"), Some(&org.owner), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {}", String::from_utf8_lossy(&body));
        let problem = crate::support::problem(status, &headers, &body);
        if bad.starts_with("?limit") {
            assert_eq!(problem.detail, "limit must be between 1 and 200", "{bad}");
        }
    }
    // A cursor this server did not give names no page; an empty one is the first page.
    for bad in ["?cursor=not-a-cursor", "?cursor=bm90IGpzb24"] {
        let (status, _, body) = app.send(Method::GET, &format!("/api/v1/orgs/acme/projects/web/runs{bad}"), Some(&org.owner), None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{bad}: {}", String::from_utf8_lossy(&body));
    }
    let first = app.json(Method::GET, "/api/v1/orgs/acme/projects/web/runs?cursor=", &org.owner, None, StatusCode::OK).await;
    assert_eq!(first["items"].as_array().unwrap().len() as i64, total.min(50));
    // The runs wait for an engine that this test does not run.
    app.discard().await;
}
