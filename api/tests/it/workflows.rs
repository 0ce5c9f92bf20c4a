//! Workflow uploads: every validation problem in one 422 with its line, column and path;
//! validation without saving; versions that change only with the text; PUT's name check;
//! pause and unpause.

use std::path::PathBuf;

use api::http::error::WorkflowProblem;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{App, problem};

const BASE: &str = "/api/v1/orgs/acme/projects/web";

async fn upload(app: &App, token: &str, method: Method, path: &str, yaml: &str) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
    let resp =
        app.http.request(method, app.url(path)).bearer_auth(token).header("content-type", "application/yaml").body(yaml.to_owned()).send().await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    (status, headers, resp.bytes().await.unwrap().to_vec())
}

#[tokio::test]
async fn uploads_answer_every_problem_and_version_only_on_change() {
    let app = App::start().await;
    let org = app.org("acme").await;
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/workflows");
    let mut broken = 0;
    for entry in std::fs::read_dir(&fixtures).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("broken-") {
            continue;
        }
        broken += 1;
        let yaml = std::fs::read_to_string(&path).unwrap();
        let want: Vec<WorkflowProblem> = engine::definition::parse(&yaml).unwrap_err().iter().map(WorkflowProblem::from).collect();
        let (status, headers, body) = upload(&app, &org.member, Method::POST, &format!("{BASE}/workflows"), &yaml).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{name}");
        let p = problem(status, &headers, &body);
        assert_eq!(p.kind, "https://shopfloor.dev/problems/invalid-workflow");
        assert_eq!(p.problems.as_deref(), Some(want.as_slice()), "{name}: every problem, in order");
        // Validation without saving says the same, as a 200.
        let checked = app.json(Method::POST, &format!("{BASE}/validate-workflow"), &org.member, Some(&json!({ "source": yaml })), StatusCode::OK).await;
        assert_eq!(checked["valid"], false);
        let listed: Vec<WorkflowProblem> = serde_json::from_value(checked["problems"].clone()).unwrap();
        assert_eq!(listed, want, "{name}");
    }
    assert!(broken >= 10, "only {broken} broken fixtures");
    let saved: i64 = sqlx::query_scalar("SELECT count(*) FROM workflows WHERE name <> 'approve'").fetch_one(app.pool()).await.unwrap();
    assert_eq!(saved, 0, "a broken workflow was saved");

    let v1 = "name: ship\nnodes:\n  ask:\n    approval: { prompt: ok? }\n";
    let v2 = "name: ship\nnodes:\n  ask:\n    approval: { prompt: really? }\n";
    let (status, _, body) = upload(&app, &org.member, Method::POST, &format!("{BASE}/workflows"), v1).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), json!({ "name": "ship", "version": 1, "created": true }));
    let (status, _, body) = upload(&app, &org.member, Method::PUT, &format!("{BASE}/workflows/ship"), v1).await;
    assert_eq!(status, StatusCode::OK, "the same text is no new version");
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), json!({ "name": "ship", "version": 1, "created": false }));
    let (status, _, _) = upload(&app, &org.member, Method::PUT, &format!("{BASE}/workflows/ship"), v2).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, headers, body) = upload(&app, &org.member, Method::PUT, &format!("{BASE}/workflows/other-name"), v2).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(problem(status, &headers, &body).detail.contains("name: ship"));
    // JSON bodies too; unknown keys refused.
    app.json(Method::POST, &format!("{BASE}/workflows"), &org.member, Some(&json!({ "source": v2 })), StatusCode::OK).await;
    app.json(Method::POST, &format!("{BASE}/workflows"), &org.member, Some(&json!({ "source": v2, "name": "x" })), StatusCode::BAD_REQUEST).await;

    let versions = app.json(Method::GET, &format!("{BASE}/workflows/ship/versions"), &org.viewer, None, StatusCode::OK).await;
    let numbers: Vec<i64> = versions["items"].as_array().unwrap().iter().map(|v| v["version"].as_i64().unwrap()).collect();
    assert_eq!(numbers, [2, 1]);
    let paged = app.json(Method::GET, &format!("{BASE}/workflows/ship/versions?limit=1"), &org.viewer, None, StatusCode::OK).await;
    let next = paged["next_cursor"].as_str().unwrap();
    let rest = app.json(Method::GET, &format!("{BASE}/workflows/ship/versions?limit=1&cursor={next}"), &org.viewer, None, StatusCode::OK).await;
    assert_eq!(rest["items"][0]["version"], 1);
    assert!(rest["next_cursor"].is_null());
    let one = app.json(Method::GET, &format!("{BASE}/workflows/ship/versions/1"), &org.viewer, None, StatusCode::OK).await;
    assert_eq!(one["source"], v1);
    let detail = app.json(Method::GET, &format!("{BASE}/workflows/ship"), &org.viewer, None, StatusCode::OK).await;
    assert_eq!((detail["latest_version"].clone(), detail["latest"]["source"].clone()), (json!(2), json!(v2)));

    let paused = app.json(Method::POST, &format!("{BASE}/workflows/ship/pause"), &org.member, None, StatusCode::OK).await;
    assert_eq!(paused["paused"], true);
    let listed = app.json(Method::GET, &format!("{BASE}/workflows"), &org.viewer, None, StatusCode::OK).await;
    let ship = listed["items"].as_array().unwrap().iter().find(|w| w["name"] == "ship").unwrap().clone();
    assert_eq!(ship["paused"], true);
    let unpaused = app.json(Method::POST, &format!("{BASE}/workflows/ship/unpause"), &org.member, None, StatusCode::OK).await;
    assert_eq!(unpaused["paused"], false);

    // Each change is in the audit log, by its member.
    let audit =
        app.json(Method::GET, &format!("/api/v1/orgs/acme/audit?action=workflow.*&actor=user:{}", org.member_user), &org.owner, None, StatusCode::OK).await;
    let actions: Vec<&str> = audit["items"].as_array().unwrap().iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["workflow.unpause", "workflow.pause", "workflow.version", "workflow.version"]);
    assert_eq!(audit["items"][0]["actor_id"], org.member_user.to_string());
    app.finish().await;
}
