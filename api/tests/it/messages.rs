//! Intervene over HTTP, with the host protocol played by the test: a member's message to a
//! running Claude Code session is stored, audited with the member, noted by a `step.message`
//! event (without its text), and offered to the holding host in its heartbeat's and session
//! report's answers until the host acknowledges it; a viewer gets 403, another org's caller
//! 404, and a step that is not a live session or whose harness cannot take messages 409 with
//! the reason. And a held step's fresh installation token: another host's step is 409, an
//! unknown one 404, and with no GitHub App configured the answer is "no token".

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{App, Org, problem};

const BASE: &str = "/api/v1/orgs/acme/projects/web";

async fn register_host(app: &App, org: &Org, name: &str) -> String {
    let cred = app.register_host(org, &json!({ "name": name, "capabilities": ["linux", "harness:claude-code", "harness:codex"], "max_concurrent": 4 })).await;
    cred["token"].as_str().unwrap().to_owned()
}

/// Submits `workflow` and claims its crew step as `host`: (run, step).
async fn claimed(app: &App, org: &Org, host: &str, workflow: &str) -> (String, String) {
    let run = app.created(&format!("{BASE}/runs"), &org.member, &json!({ "workflow": workflow })).await;
    app.until(run.parse().unwrap(), "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND state = 'pending' AND kind = 'crew')", "a ready crew step").await;
    let got = app.json(Method::POST, "/api/v1/host/claim", host, Some(&json!({ "max": 1, "wait_secs": 10 })), StatusCode::OK).await;
    let a = &got["assignments"][0];
    assert_eq!(a["run"].as_str(), Some(run.as_str()), "{got}");
    (run, a["step"].as_str().unwrap().to_owned())
}

async fn say(app: &App, token: &str, run: &str, step: &str, text: &str) -> (StatusCode, Value, reqwest::header::HeaderMap) {
    let (status, headers, body) =
        app.send(Method::POST, &format!("{BASE}/runs/{run}/steps/{step}/messages"), Some(token), Some(&json!({ "text": text }))).await;
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null), headers)
}

async fn refused(app: &App, token: &str, run: &str, step: &str, want: StatusCode) -> String {
    let (status, headers, body) =
        app.send(Method::POST, &format!("{BASE}/runs/{run}/steps/{step}/messages"), Some(token), Some(&json!({ "text": "hello" }))).await;
    assert_eq!(status, want, "{}", String::from_utf8_lossy(&body));
    problem(status, &headers, &body).detail
}

#[tokio::test]
async fn a_message_reaches_the_holding_host_until_it_acknowledges_it() {
    let app = App::with_host_engine().await;
    let [org, other] = app.orgs(["acme", "other"]).await;
    let pool = app.pool().clone();
    for (name, harness) in [("claude", "claude-code"), ("codex", "codex")] {
        let source = format!("name: {name}\nnodes:\n  work:\n    crew: {{ harness: {harness}, prompt: do the work }}\n");
        app.json(Method::PUT, &format!("{BASE}/workflows/{name}"), &org.member, Some(&json!({ "source": source })), StatusCode::CREATED).await;
    }
    let host = register_host(&app, &org, "box").await;
    let (run, step) = claimed(&app, &org, &host, "claude").await;

    // Leased, not started: no session to tell yet.
    let why = refused(&app, &org.member, &run, &step, StatusCode::CONFLICT).await;
    assert!(why.contains("leased") && why.contains("not a live session"), "{why}");
    app.json(Method::POST, &format!("/api/v1/host/steps/{step}/start"), &host, Some(&json!({ "harness": "claude-code" })), StatusCode::OK).await;

    // A viewer may not; another org's member and made-up ids find nothing.
    refused(&app, &org.viewer, &run, &step, StatusCode::FORBIDDEN).await;
    refused(&app, &other.member, &run, &step, StatusCode::NOT_FOUND).await;
    refused(&app, &org.member, &run, "step-aaaaaaaaaaaaaaaaaaaaaaaaaa", StatusCode::NOT_FOUND).await;
    refused(&app, &org.member, "run-aaaaaaaaaaaaaaaaaaaaaaaaaa", &step, StatusCode::NOT_FOUND).await;

    // A member's message: stored, audited, an event without the text.
    let (status, sent, _) = say(&app, &org.member, &run, &step, "  Prefer the blue widget.  ").await;
    assert_eq!(status, StatusCode::CREATED, "{sent}");
    assert_eq!((sent["chars"].as_u64(), sent["delivered_at"].is_null()), (Some(23), true), "{sent}");
    let id = sent["id"].as_str().unwrap().to_owned();
    let (kind, attrs): (String, Value) = sqlx::query_as("SELECT kind, attrs FROM run_events WHERE run_id = $1 ORDER BY seq DESC LIMIT 1")
        .bind(run.parse::<engine::ids::RunId>().unwrap())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(kind, "step.message");
    assert_eq!(attrs["by"], format!("user:{}", org.member_user));
    assert!(!attrs.to_string().contains("blue"), "{attrs}");
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'step.message' AND actor_kind = 'user' AND actor_id = $1 AND target_id = $2")
            .bind(org.member_user.to_string())
            .bind(&step)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(audited, 1);

    // Offered in the heartbeat's answer and the session report's, until acknowledged.
    let beat = app.json(Method::POST, &format!("/api/v1/host/steps/{step}/heartbeat"), &host, None, StatusCode::OK).await;
    assert_eq!(beat["messages"], json!([{ "id": id, "text": "Prefer the blue widget." }]), "{beat}");
    let report = json!({ "harness": "claude-code", "lines": [], "usage": {} });
    let answer = app.json(Method::POST, &format!("/api/v1/host/steps/{step}/session"), &host, Some(&report), StatusCode::OK).await;
    assert_eq!(answer["messages"][0]["id"], id.as_str(), "{answer}");
    // Another host cannot acknowledge it.
    let intruder = register_host(&app, &org, "intruder").await;
    let acked =
        app.json(Method::POST, &format!("/api/v1/host/steps/{step}/messages/delivered"), &intruder, Some(&json!({ "messages": [id] })), StatusCode::OK).await;
    assert_eq!(acked["marked"], 0);
    let acked =
        app.json(Method::POST, &format!("/api/v1/host/steps/{step}/messages/delivered"), &host, Some(&json!({ "messages": [id] })), StatusCode::OK).await;
    assert_eq!(acked["marked"], 1);
    let beat = app.json(Method::POST, &format!("/api/v1/host/steps/{step}/heartbeat"), &host, None, StatusCode::OK).await;
    assert!(beat.get("messages").is_none(), "delivered, it is offered no more: {beat}");

    // A held step's token: no App here, so none; another host's step is a conflict; an
    // unknown step is not found.
    let token = app.json(Method::POST, &format!("/api/v1/host/steps/{step}/token"), &host, None, StatusCode::OK).await;
    assert_eq!(token, json!({ "repository": null, "token": null }));
    app.json(Method::POST, &format!("/api/v1/host/steps/{step}/token"), &intruder, None, StatusCode::CONFLICT).await;
    app.json(Method::POST, "/api/v1/host/steps/step-aaaaaaaaaaaaaaaaaaaaaaaaaa/token", &host, None, StatusCode::NOT_FOUND).await;
    // A person's token has no business on the host protocol.
    app.json(Method::POST, &format!("/api/v1/host/steps/{step}/token"), &org.owner, None, StatusCode::FORBIDDEN).await;

    // A codex session cannot take a message: 409 with the reason.
    let (codex_run, codex_step) = claimed(&app, &org, &host, "codex").await;
    app.json(Method::POST, &format!("/api/v1/host/steps/{codex_step}/start"), &host, Some(&json!({ "harness": "codex" })), StatusCode::OK).await;
    let why = refused(&app, &org.member, &codex_run, &codex_step, StatusCode::CONFLICT).await;
    assert!(why.contains("codex") && why.contains("cannot take messages"), "{why}");

    // A finished session is no longer live; nor is a step that is no crew step.
    app.json(Method::POST, &format!("/api/v1/host/steps/{step}/complete"), &host, Some(&json!({ "outcome": "succeeded" })), StatusCode::OK).await;
    let why = refused(&app, &org.member, &run, &step, StatusCode::CONFLICT).await;
    assert!(why.contains("succeeded"), "{why}");
    let approval = app.created(&format!("{BASE}/runs"), &org.member, &json!({ "workflow": "approve" })).await;
    app.until(approval.parse().unwrap(), "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'ask' AND state = 'waiting')", "ask waiting").await;
    let ask: engine::ids::StepId = sqlx::query_scalar("SELECT step_id FROM steps WHERE run_id = $1 AND node = 'ask'")
        .bind(approval.parse::<engine::ids::RunId>().unwrap())
        .fetch_one(&pool)
        .await
        .unwrap();
    let why = refused(&app, &org.member, &approval, &ask.to_string(), StatusCode::CONFLICT).await;
    assert!(why.contains("not a crew session"), "{why}");
    // An empty message is refused.
    let (status, _, _) = say(&app, &org.member, &codex_run, &codex_step, "   ").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    app.discard().await;
}
