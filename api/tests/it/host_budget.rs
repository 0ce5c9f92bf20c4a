//! Budgets and operator actions as a host sees them, through the host protocol: a drained
//! host's claims take nothing; session reports record the estimated spend since the previous
//! report (they carry cumulative figures: the host's estimate from token counts, as it is while
//! Claude Code runs, with no reported cost); a heartbeat once a hard budget is spent tells the
//! host to stop, and the step fails `budget_hard_stop`, never retried; the reported cost, when
//! it comes, replaces the estimate (lower here: a correcting difference); the run's API view
//! says which figure is an estimate; an edit-and-retry's prompt and model reach the next host's
//! assignment.

use engine::db::Db;
use engine::ids::{OrgId, RunId};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{App, Org};

const BASE: &str = "/api/v1/orgs/acme/projects/web";

async fn register_host(app: &App, org: &Org) -> (String, String) {
    let cred = app.register_host(org, &json!({ "name": "box", "capabilities": ["linux", "harness:claude-code"], "max_concurrent": 2 })).await;
    (cred["token"].as_str().unwrap().to_owned(), cred["host_id"].as_str().unwrap().to_owned())
}

async fn claim(app: &App, host: &str, wait: u32) -> Value {
    app.json(Method::POST, "/api/v1/host/claim", host, Some(&json!({ "max": 1, "wait_secs": wait })), StatusCode::OK).await
}

async fn spent(pool: &Db, org: OrgId, run: &str) -> (f64, f64, i64) {
    let run: RunId = run.parse().unwrap();
    sqlx::query_as(
        "SELECT r.spent_usd::float8, (SELECT coalesce(sum(usd), 0)::float8 FROM spend WHERE org_id = $1), r.spent_tokens FROM runs r WHERE r.run_id = $2",
    )
    .bind(org)
    .bind(run)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A report while the harness runs: the host's estimate, no reported cost (Claude Code prints
/// its cost only on its result line).
async fn report(app: &App, host: &str, step: &str, estimate: f64, tokens: i64) -> Value {
    let usage = json!({ "input_tokens": tokens, "output_tokens": 0, "cost_usd": null, "estimated_cost_usd": estimate, "estimate_basis": "price_table", "output_tokens_lower_bound": true });
    let body = json!({ "harness": "claude-code", "lines": [], "usage": usage });
    app.json(Method::POST, &format!("/api/v1/host/steps/{step}/session"), host, Some(&body), StatusCode::OK).await
}

#[tokio::test]
async fn hosts_report_spend_are_stopped_by_a_spent_hard_budget_and_drain() {
    let app = App::with_host_engine().await;
    let org = app.org("acme").await;
    let pool = app.pool().clone();
    let source = "name: crewed\nnodes:\n  work:\n    crew: { harness: claude-code, model: sonnet, prompt: do the work }\n";
    app.json(Method::PUT, &format!("{BASE}/workflows/crewed"), &org.member, Some(&json!({ "source": source })), StatusCode::CREATED).await;
    let (host, host_id) = register_host(&app, &org).await;

    // Drained, the host claims nothing, though a step waits for it.
    let drained = app.json(Method::POST, &format!("{BASE}/hosts/{host_id}/drain"), &org.admin, None, StatusCode::OK).await;
    assert!(drained["drained_at"].is_string(), "{drained}");
    let run = app.created(&format!("{BASE}/runs"), &org.member, &json!({ "workflow": "crewed" })).await;
    app.until(run.parse().unwrap(), "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND state = 'pending')", "a ready crew step").await;
    let nothing = claim(&app, &host, 1).await;
    assert_eq!(nothing["assignments"], json!([]), "a drained host takes nothing");
    let listed = app.json(Method::GET, &format!("{BASE}/hosts"), &org.viewer, None, StatusCode::OK).await;
    assert!(listed["items"][0]["drained_at"].is_string(), "the list shows it drained: {listed}");
    app.json(Method::POST, &format!("{BASE}/hosts/{host_id}/undrain"), &org.admin, None, StatusCode::OK).await;
    let got = claim(&app, &host, 5).await;
    let step = got["assignments"][0]["step"].as_str().expect("undrained, it claims the step").to_owned();
    assert_eq!((got["assignments"][0]["prompt"].as_str(), got["assignments"][0]["model"].as_str()), (Some("do the work"), Some("sonnet")));
    app.json(Method::POST, &format!("/api/v1/host/steps/{step}/start"), &host, Some(&json!({ "harness": "claude-code" })), StatusCode::OK).await;

    // A host of another project of the org learns nothing of the step: not found, as another
    // org's, and a claim that says it holds it hears it is gone.
    app.json(Method::POST, "/api/v1/orgs/acme/projects", &org.admin, Some(&json!({ "slug": "ops" })), StatusCode::CREATED).await;
    let reg = app.json(Method::POST, "/api/v1/orgs/acme/projects/ops/host-registrations", &org.admin, None, StatusCode::CREATED).await;
    let other = json!({ "name": "ops-box", "capabilities": ["linux", "harness:claude-code"], "max_concurrent": 1 });
    let other = app.json(Method::POST, "/api/v1/host/register", reg["token"].as_str().unwrap(), Some(&other), StatusCode::CREATED).await;
    let other = other["token"].as_str().unwrap();
    for (verb, body) in [("heartbeat", None), ("session", Some(json!({ "lines": [] }))), ("start", Some(json!({ "harness": "claude-code" })))] {
        app.json(Method::POST, &format!("/api/v1/host/steps/{step}/{verb}"), other, body.as_ref(), StatusCode::NOT_FOUND).await;
    }
    let held = app.json(Method::POST, "/api/v1/host/claim", other, Some(&json!({ "max": 0, "wait_secs": 0, "held": [step] })), StatusCode::OK).await;
    assert!(held.to_string().contains("gone"), "{held}");

    // Reports carry cumulative estimates; the spend is what each adds.
    let r = report(&app, &host, &step, 0.4, 100).await;
    assert_eq!(r["stop"], false);
    assert_eq!(spent(&pool, org.id, &run).await, (0.4, 0.4, 100));
    report(&app, &host, &step, 0.9, 250).await;
    report(&app, &host, &step, 0.9, 250).await;
    assert_eq!(spent(&pool, org.id, &run).await, (0.9, 0.9, 250), "a report sent twice counts once");
    // Figures no session can have are refused, and change nothing: one near what a column
    // holds would make every later report of the project fail, its hard budget included.
    for usage in [
        json!({ "input_tokens": 9_223_372_036_854_775_000_i64 }),
        json!({ "input_tokens": i64::MAX, "output_tokens": i64::MAX }),
        json!({ "input_tokens": -5 }),
        json!({ "estimated_cost_usd": 1e12 }),
        json!({ "cost_usd": -1.0 }),
    ] {
        let body = json!({ "harness": "claude-code", "lines": [], "usage": usage });
        let refused = app.json(Method::POST, &format!("/api/v1/host/steps/{step}/session"), &host, Some(&body), StatusCode::UNPROCESSABLE_ENTITY).await;
        assert!(refused["detail"].as_str().is_some_and(|d| d.contains("usage out of range")), "{usage}: {refused}");
        let done = json!({ "outcome": "succeeded", "output": {}, "usage": usage });
        app.json(Method::POST, &format!("/api/v1/host/steps/{step}/complete"), &host, Some(&done), StatusCode::UNPROCESSABLE_ENTITY).await;
    }
    assert_eq!(spent(&pool, org.id, &run).await, (0.9, 0.9, 250));
    let beat = app.json(Method::POST, &format!("/api/v1/host/steps/{step}/heartbeat"), &host, None, StatusCode::OK).await;
    assert_eq!(beat["stop"], false);

    // A hard daily budget the project has spent: the next heartbeat says stop.
    app.json(Method::PUT, &format!("{BASE}/budgets/day"), &org.admin, Some(&json!({ "usd_limit": 0.5, "hard": true })), StatusCode::OK).await;
    let beat = app.json(Method::POST, &format!("/api/v1/host/steps/{step}/heartbeat"), &host, None, StatusCode::OK).await;
    assert_eq!((beat["state"].as_str(), beat["stop"].as_bool()), (Some("failed"), Some(true)), "{beat}");
    let (reason, class): (String, String) = sqlx::query_as("SELECT reason, failure_class FROM steps WHERE step_id = $1")
        .bind(step.parse::<engine::ids::StepId>().unwrap())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!((reason.as_str(), class.as_str()), ("budget_hard_stop", "final"));
    app.until(run.parse().unwrap(), "SELECT status = 'failed' FROM runs WHERE run_id = $1", "failed").await;
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM steps WHERE run_id = $1").bind(run.parse::<RunId>().unwrap()).fetch_one(&pool).await.unwrap();
    assert_eq!(attempts, 1, "budget_hard_stop is never retried");
    // Its result, when it comes, is dropped: the step stays failed. What the session spent is
    // recorded (the CLI's last word, lower than the estimate here), once.
    let late = json!({ "outcome": "succeeded", "output": { "text": "done" }, "usage": { "input_tokens": 250, "cost_usd": 0.7 } });
    let answer = app.json(Method::POST, &format!("/api/v1/host/steps/{step}/complete"), &host, Some(&late), StatusCode::OK).await;
    assert_eq!((answer["state"].as_str(), answer["stop"].as_bool()), (Some("failed"), Some(true)), "{answer}");
    assert_eq!(spent(&pool, org.id, &run).await, (0.7, 0.7, 250));
    let (state, output): (String, Option<serde_json::Value>) =
        sqlx::query_as("SELECT state, output FROM steps WHERE step_id = $1").bind(step.parse::<engine::ids::StepId>().unwrap()).fetch_one(&pool).await.unwrap();
    assert_eq!((state.as_str(), output), ("failed", None));
    let (status, _, _) = app.send(Method::POST, &format!("/api/v1/host/steps/{step}/complete"), Some(&host), Some(&late)).await;
    assert_eq!(status, StatusCode::CONFLICT, "a second report of the same session is refused");

    // The budget raised, an edit-and-retry: the host's next assignment has the new prompt and model.
    app.json(Method::PUT, &format!("{BASE}/budgets/day"), &org.admin, Some(&json!({ "usd_limit": 100, "hard": true })), StatusCode::OK).await;
    let edit = json!({ "node": "work", "prompt": "do less", "model": "haiku" });
    let retried = app.json(Method::POST, &format!("{BASE}/runs/{run}/retry"), &org.member, Some(&edit), StatusCode::CREATED).await;
    let got = claim(&app, &host, 10).await;
    let a = &got["assignments"][0];
    assert_eq!(
        (a["run"].as_str(), a["prompt"].as_str(), a["model"].as_str(), a["harness"].as_str()),
        (retried["id"].as_str(), Some("do less"), Some("haiku"), Some("claude-code"))
    );
    let step = a["step"].as_str().unwrap().to_owned();
    app.json(Method::POST, &format!("/api/v1/host/steps/{step}/start"), &host, None, StatusCode::OK).await;
    let new_run = retried["id"].as_str().unwrap();
    report(&app, &host, &step, 0.3, 10).await;
    assert_eq!(spent(&pool, org.id, new_run).await, (0.3, 1.0, 10), "the estimate counts while the session runs");
    let view = app.json(Method::GET, &format!("{BASE}/runs/{new_run}"), &org.viewer, None, StatusCode::OK).await;
    let session = &view["steps"][0]["session"];
    assert_eq!(
        (session["cost_usd"].clone(), session["estimated_cost_usd"].as_f64(), session["cost_is_estimate"].as_bool()),
        (Value::Null, Some(0.3), Some(true)),
        "{view}"
    );
    assert_eq!(session["output_tokens_lower_bound"], true);
    // The final figures come with the completion: the reported cost replaces the estimate,
    // here lower than it, so the spend is corrected down to it.
    let usage = json!({ "cost_usd": 0.25, "estimated_cost_usd": 0.25, "input_tokens": 10 });
    let body = json!({ "outcome": "succeeded", "usage": usage });
    app.json(Method::POST, &format!("/api/v1/host/steps/{step}/complete"), &host, Some(&body), StatusCode::OK).await;
    assert_eq!(spent(&pool, org.id, new_run).await, (0.25, 0.95, 10));
    let view = app.json(Method::GET, &format!("{BASE}/runs/{new_run}"), &org.viewer, None, StatusCode::OK).await;
    let session = &view["steps"][0]["session"];
    assert_eq!(
        (session["cost_usd"].as_f64(), session["spent_usd"].as_f64(), session["cost_is_estimate"].as_bool()),
        (Some(0.25), Some(0.25), Some(false)),
        "{view}"
    );
    // An estimate field the protocol does not know is refused, not ignored.
    let bad = json!({ "harness": "claude-code", "usage": { "estimated_usd": 1.0 } });
    let (status, _, _) = app.send(Method::POST, &format!("/api/v1/host/steps/{step}/session"), Some(&host), Some(&bad)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    app.until(new_run.parse().unwrap(), "SELECT status = 'completed' FROM runs WHERE run_id = $1", "completed").await;
    app.discard().await;
}
