//! The whole path through HTTP only: an org bootstrapped as `shopfloor admin create-org` does
//! it, then a project, the issue-to-pull-request example workflow uploaded, a run submitted and watched over
//! SSE to its approvals, approved with the form's fields and walked to the end; another run
//! rejected and cancelled with `rejected at <node>: <reason>`; and the stream resumed with
//! `Last-Event-ID` without a gap or a repeat.

use std::collections::BTreeMap;

use api::auth::{UserToken, issue_user_token};
use engine::ids::Slug;
use engine::store::{Actor, Change, tenants};
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::{self, App, SseEvent};

const ISSUE_TO_PR: &str = include_str!("../../../engine/tests/fixtures/workflows/issue-to-pr.yaml");

/// What `shopfloor admin create-org` does: the org, its owner, and the owner's first token.
async fn bootstrap(app: &App) -> String {
    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
    let (org, user) = tenants::create_org(&mut ch, &Slug::parse("acme").unwrap(), "Acme", "owner@acme.test").await.unwrap();
    let token = issue_user_token(
        &mut ch,
        &engine::testkit::secret_key(),
        UserToken { org, user, project: None, role: "owner", name: "first owner token", ttl: chrono::Duration::days(90) },
    )
    .await
    .unwrap();
    ch.commit().await.unwrap();
    token
}

fn is(e: &SseEvent, run: &str, kind: &str, node: Option<&str>) -> bool {
    e.event == kind && e.data["run"] == run && node.is_none_or(|n| e.data["node"] == n)
}

/// Per run, the sequence numbers seen must be consecutive from the first one seen.
fn assert_gapless(events: &[SseEvent]) {
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for e in events {
        let run = e.data["run"].as_str().unwrap().to_owned();
        let seq = e.data["seq"].as_i64().unwrap();
        if let Some(prev) = last.get(&run) {
            assert_eq!(seq, prev + 1, "run {run}: seq {seq} after {prev}");
        }
        last.insert(run, seq);
    }
}

#[tokio::test]
async fn a_run_is_driven_through_http_and_watched_over_sse() {
    let app = App::with_engine().await;
    let owner = bootstrap(&app).await;
    let base = "/api/v1/orgs/acme/projects/web";

    app.json(Method::POST, "/api/v1/orgs/acme/projects", &owner, Some(&json!({ "slug": "web", "name": "Web" })), StatusCode::CREATED).await;
    let uploaded = app
        .http
        .put(app.url(&format!("{base}/workflows/issue-to-pr")))
        .bearer_auth(&owner)
        .header("content-type", "application/yaml")
        .body(ISSUE_TO_PR)
        .send()
        .await
        .unwrap();
    assert_eq!(uploaded.status(), StatusCode::CREATED);
    let uploaded: serde_json::Value = uploaded.json().await.unwrap();
    assert_eq!(uploaded, json!({ "name": "issue-to-pr", "version": 1, "created": true }));

    let mut sse = support::sse(&app, &format!("{base}/events"), &owner, None).await;
    let mut seen = Vec::new();

    // Run 1: both approvals answered, the run walks to its end.
    let run = app.json(Method::POST, &format!("{base}/runs"), &owner, Some(&json!({ "workflow": "issue-to-pr", "input": {} })), StatusCode::CREATED).await;
    let run1 = run["id"].as_str().unwrap().to_owned();
    assert_eq!(run["name"], format!("acme:web:{run1}"));
    assert_eq!(run["status"], "running");

    seen.extend(sse.until("the run-level approval", |e| is(e, &run1, "run.awaiting", Some("$start"))).await);
    app.json(Method::POST, &format!("{base}/runs/{run1}/approvals/$start"), &owner, None, StatusCode::OK).await;

    let awaiting = sse.until("review_plan", |e| is(e, &run1, "run.awaiting", Some("review_plan"))).await;
    let asked = awaiting.last().unwrap().clone();
    seen.extend(awaiting);
    assert_eq!(asked.data["attrs"]["prompt"], "Go ahead with this plan?");
    assert_eq!(asked.data["attrs"]["fields"]["ticket"]["required"], true);

    // A missing required field is refused and the run keeps waiting.
    let (status, _, body) = app.send(Method::POST, &format!("{base}/runs/{run1}/approvals/review_plan"), Some(&owner), Some(&json!({}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{}", String::from_utf8_lossy(&body));
    let detail = app.json(Method::GET, &format!("{base}/runs/{run1}"), &owner, None, StatusCode::OK).await;
    assert_eq!(detail["status"], "running");
    assert_eq!(detail["substate"], "awaiting_signal");
    assert_eq!(detail["approvals"][0]["node"], "review_plan");
    let why = app.json(Method::GET, &format!("{base}/runs/{run1}/why"), &owner, None, StatusCode::OK).await;
    assert_eq!((why["substate"].as_str(), why["words"].as_str()), (Some("awaiting_signal"), Some("waiting for approval")));
    assert!(why["text"].as_str().unwrap().starts_with("Waiting for approval at review_plan: Go ahead with this plan?"), "{why}");
    assert_eq!(why["detail"]["node"], "review_plan");
    let waiting = app.json(Method::GET, &format!("{base}/runs?substate=awaiting_signal"), &owner, None, StatusCode::OK).await;
    assert_eq!(waiting["items"][0]["id"], run1.as_str());

    let decided = app.json(Method::POST, &format!("{base}/runs/{run1}/approvals/review_plan"), &owner, Some(&json!({ "ticket": "T-1" })), StatusCode::OK).await;
    assert_eq!(decided["decision"], "approved");
    assert_eq!(decided["answer"], json!({ "ticket": "T-1" }));

    seen.extend(sse.until("run 1 completed", |e| is(e, &run1, "run.completed", None)).await);
    let detail = app.json(Method::GET, &format!("{base}/runs/{run1}"), &owner, None, StatusCode::OK).await;
    assert_eq!(detail["status"], "completed", "{detail}");
    let nodes: Vec<String> =
        detail["steps"].as_array().unwrap().iter().map(|s| format!("{}:{}", s["node"].as_str().unwrap(), s["state"].as_str().unwrap())).collect();
    for want in ["$start:succeeded", "plan:succeeded", "review_plan:succeeded", "build:succeeded", "ci:succeeded", "route:succeeded", "open_pr:succeeded"] {
        assert!(nodes.contains(&want.to_owned()), "{want} not in {nodes:?}");
    }
    let review = detail["steps"].as_array().unwrap().iter().find(|s| s["node"] == "review_plan").unwrap();
    assert_eq!(review["output"], json!({ "ticket": "T-1" }));
    audit_trail(&app, &owner, &run1, &detail).await;

    // Run 2: rejected at review_plan.
    let run = app.json(Method::POST, &format!("{base}/runs"), &owner, Some(&json!({ "workflow": "issue-to-pr" })), StatusCode::CREATED).await;
    let run2 = run["id"].as_str().unwrap().to_owned();
    let started = sse.until("run 2 started", |e| is(e, &run2, "run.started", None)).await;
    let resume_from = started.last().unwrap().id.clone();
    seen.extend(started);
    seen.extend(sse.until("run 2 run-level approval", |e| is(e, &run2, "run.awaiting", Some("$start"))).await);
    app.json(Method::POST, &format!("{base}/runs/{run2}/approvals/$start"), &owner, None, StatusCode::OK).await;
    seen.extend(sse.until("run 2 review_plan", |e| is(e, &run2, "run.awaiting", Some("review_plan"))).await);
    let rejected = app
        .json(Method::POST, &format!("{base}/runs/{run2}/approvals/review_plan/reject"), &owner, Some(&json!({ "reason": "too risky" })), StatusCode::OK)
        .await;
    assert_eq!(rejected["decision"], "rejected");
    let cancelled = sse.until("run 2 cancelled", |e| is(e, &run2, "run.cancelled", None)).await;
    assert_eq!(cancelled.last().unwrap().data["attrs"]["reason"], "rejected at review_plan: too risky");
    seen.extend(cancelled);
    let detail = app.json(Method::GET, &format!("{base}/runs/{run2}"), &owner, None, StatusCode::OK).await;
    assert_eq!(detail["status"], "cancelled");
    assert_eq!(detail["reason"], "rejected at review_plan: too risky");
    let why = app.json(Method::GET, &format!("{base}/runs/{run2}/why"), &owner, None, StatusCode::OK).await;
    assert_eq!(why["text"], "Finished: cancelled: rejected at review_plan: too risky");
    assert!(why["substate"].is_null());

    // The document the server serves is the one the code generates.
    let served = app.json(Method::GET, "/api/v1/openapi.json", &owner, None, StatusCode::OK).await;
    assert_eq!(served, api::http::openapi());

    // The stream never skipped or repeated an event of a run, and each event has an id of its own.
    assert_gapless(&seen);
    let ids: std::collections::HashSet<&str> = seen.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), seen.len(), "an id given twice");

    // Resuming after run 2's first event replays exactly what followed it.
    let after: Vec<&SseEvent> = seen.iter().skip_while(|e| e.id != resume_from).skip(1).collect();
    let mut again = support::sse(&app, &format!("{base}/events"), &owner, Some(&resume_from)).await;
    for want in &after {
        let got = again.next().await;
        assert_eq!((&got.id, &got.event), (&want.id, &want.event), "resumed stream differs");
    }

    // The journal per run agrees with the stream.
    let events = app.json(Method::GET, &format!("{base}/runs/{run2}/events?limit=200"), &owner, None, StatusCode::OK).await;
    let kinds: Vec<&str> = events["items"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"run.started"));
    assert_eq!(kinds.last(), Some(&"run.cancelled"));
    drop(sse);
    drop(again);
    app.finish().await;
}

/// The audit log shows the people's acts (from `audit_log`) and the engine's moves (from the
/// runs' journal, never copied into `audit_log`) as one list, in one order, paged as one.
async fn audit_trail(app: &App, owner: &str, run: &str, detail: &serde_json::Value) {
    let entries = |v: &serde_json::Value| -> Vec<(String, String, i64)> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["action"].as_str().unwrap().to_owned(), e["actor_kind"].as_str().unwrap().to_owned(), e["id"].as_i64().unwrap()))
            .collect()
    };
    let build = detail["steps"].as_array().unwrap().iter().find(|s| s["node"] == "build").unwrap()["id"].as_str().unwrap().to_owned();
    let step = app.json(Method::GET, &format!("/api/v1/orgs/acme/audit?target=step:{build}"), owner, None, StatusCode::OK).await;
    let moves: Vec<String> = entries(&step).iter().map(|(a, k, _)| format!("{a} by {k}")).collect();
    assert_eq!(moves, ["step.succeeded by engine", "step.running by engine", "step.create by engine"], "{step}");
    assert!(entries(&step).iter().all(|(_, _, id)| *id < 0), "the engine's moves are read from the journal: {step}");
    assert_eq!(step["items"][2]["detail"]["node"], "build");
    assert_eq!(step["items"][1]["detail"]["holder"], "engine:api-test-engine", "the engine's lease and start are one move: {step}");
    let copied: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE actor_kind = 'engine' AND target_kind = 'step'").fetch_one(app.pool()).await.unwrap();
    assert_eq!(copied, 0, "the engine's moves are not written twice");

    let of_run = app.json(Method::GET, &format!("/api/v1/orgs/acme/audit?target=run:{run}&limit=200"), owner, None, StatusCode::OK).await;
    let acts: Vec<(String, String)> = entries(&of_run).into_iter().map(|(a, k, _)| (a, k)).collect();
    for want in [("run.completed", "engine"), ("approval.approve", "user"), ("run.submit", "user")] {
        assert!(acts.contains(&(want.0.to_owned(), want.1.to_owned())), "{want:?} not in {acts:?}");
    }
    let created = app.json(Method::GET, "/api/v1/orgs/acme/audit?action=step.create&limit=200", owner, None, StatusCode::OK).await;
    let steps = detail["steps"].as_array().unwrap().len();
    assert_eq!(entries(&created).len(), steps, "one step.create per step of the run: {created}");

    // Paging seven at a time reads the whole list once, in its order.
    let whole = entries(&app.json(Method::GET, "/api/v1/orgs/acme/audit?limit=200", owner, None, StatusCode::OK).await);
    assert!(whole.len() > 7 && whole.len() < 200, "{whole:?}");
    let mut paged = Vec::new();
    let mut cursor = String::new();
    loop {
        let page = app.json(Method::GET, &format!("/api/v1/orgs/acme/audit?limit=7{cursor}"), owner, None, StatusCode::OK).await;
        paged.extend(entries(&page));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(paged, whole);
}
