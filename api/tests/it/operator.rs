//! Every operator action through HTTP, each checked three ways: the state it changed, the
//! audit entry naming the acting user, and the run event it wrote. Cancel, approve, reject,
//! retry, rerun, pause and unpause a workflow and a project, set a budget and the org's cap,
//! set retention, resolve a failed run, reset an item's cycle budget, edit-and-retry, drain and
//! undrain a host, set and remove a board column's WIP limit; and admission's refusals answered
//! as problems (409 for a full `skip` group, 429 for a full line). The host protocol's side of
//! draining and budgets is in `host_budget`.

use engine::db::Db;
use engine::ids::{OrgId, RunId, UserId};
use engine::store::{Actor, Change, admission};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use shopfloor_tests::Seed;

use crate::support::{App, Org, problem};

const BASE: &str = "/api/v1/orgs/acme/projects/web";

/// The audit entries of `action` whose actor is `user`, on `target`.
async fn audited(pool: &Db, org: OrgId, action: &str, user: UserId, target: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE org_id = $1 AND action = $2 AND actor_kind = 'user' AND actor_id = $3 AND target_id = $4")
        .bind(org)
        .bind(action)
        .bind(user.to_string())
        .bind(target)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn events(pool: &Db, run: &str) -> Vec<String> {
    let run: RunId = run.parse().unwrap();
    sqlx::query_scalar("SELECT kind || coalesce(':' || node, '') FROM run_events WHERE run_id = $1 ORDER BY seq").bind(run).fetch_all(pool).await.unwrap()
}

async fn submit(app: &App, org: &Org, workflow: &str) -> String {
    app.created(&format!("{BASE}/runs"), &org.member, &json!({ "workflow": workflow })).await
}

async fn waiting_at_ask(app: &App, run: &str) {
    app.until(run.parse().unwrap(), "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'ask' AND state = 'waiting')", "ask waiting").await;
}

async fn status(app: &App, org: &Org, run: &str) -> Value {
    app.json(Method::GET, &format!("{BASE}/runs/{run}"), &org.viewer, None, StatusCode::OK).await
}

async fn upload(app: &App, org: &Org, name: &str, source: &str) {
    let path = format!("{BASE}/workflows/{name}");
    let (status, _, body) = app.send(Method::PUT, &path, Some(&org.member), Some(&json!({ "source": source }))).await;
    assert!(status.is_success(), "{}", String::from_utf8_lossy(&body));
}

/// An app with an engine and the org `acme`, with the pool its audit log and events are read
/// from.
async fn acme() -> (App, Org, Db) {
    let app = App::with_engine().await;
    let org = app.org("acme").await;
    let pool = app.pool().clone();
    (app, org, pool)
}

#[tokio::test]
async fn each_operator_action_changes_state_is_audited_with_its_user_and_writes_its_event() {
    let (app, org, pool) = acme().await;
    let member = org.member_user;
    let admin = org.admin_user;

    // Cancel.
    let run = submit(&app, &org, "approve").await;
    waiting_at_ask(&app, &run).await;
    let cancelled = app.json(Method::POST, &format!("{BASE}/runs/{run}/cancel"), &org.member, Some(&json!({ "reason": "not needed" })), StatusCode::OK).await;
    assert_eq!((cancelled["status"].as_str(), cancelled["reason"].as_str()), (Some("cancelled"), Some("cancelled: not needed")));
    assert_eq!(audited(&pool, org.id, "run.cancelled", member, &run).await, 1);
    assert!(events(&pool, &run).await.ends_with(&["step.cancelled:ask".to_owned(), "run.wait_withdrawn:ask".to_owned(), "run.cancelled".to_owned()]));

    // Retry of the cancelled run: a new run that starts again from what did not finish.
    let retried = app.json(Method::POST, &format!("{BASE}/runs/{run}/retry"), &org.member, None, StatusCode::CREATED).await;
    let retry = retried["id"].as_str().unwrap().to_owned();
    assert_eq!(retried["source_run"], run);
    assert_eq!(audited(&pool, org.id, "run.submit", member, &retry).await, 1);
    assert_eq!(events(&pool, &retry).await.first().map(String::as_str), Some("run.started"));

    // Approve, with the form's field: the step succeeds with the answer, the run goes on.
    waiting_at_ask(&app, &retry).await;
    app.json(Method::POST, &format!("{BASE}/runs/{retry}/approvals/ask"), &org.member, Some(&json!({ "ticket": "T-7" })), StatusCode::OK).await;
    let step: Value = sqlx::query_scalar("SELECT output FROM steps WHERE run_id = $1 AND node = 'ask' AND state = 'succeeded'")
        .bind(retry.parse::<RunId>().unwrap())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(step, json!({ "ticket": "T-7" }));
    assert_eq!(audited(&pool, org.id, "approval.approve", member, &retry).await, 1);
    assert!(events(&pool, &retry).await.contains(&"step.succeeded:ask".to_owned()));

    // Reject: the run is cancelled with the reason.
    let rejected = submit(&app, &org, "approve").await;
    waiting_at_ask(&app, &rejected).await;
    app.json(Method::POST, &format!("{BASE}/runs/{rejected}/approvals/ask/reject"), &org.member, Some(&json!({ "reason": "too big" })), StatusCode::OK).await;
    let now = status(&app, &org, &rejected).await;
    assert_eq!((now["status"].as_str(), now["reason"].as_str()), (Some("cancelled"), Some("rejected at ask: too big")));
    assert_eq!(audited(&pool, org.id, "approval.reject", member, &rejected).await, 1);
    assert!(events(&pool, &rejected).await.ends_with(&["step.failed:ask".to_owned(), "run.cancelled".to_owned()]));

    // Rerun: the same input again, as a new run.
    let rerun = app.json(Method::POST, &format!("{BASE}/runs/{rejected}/rerun"), &org.member, None, StatusCode::CREATED).await;
    let rerun = rerun["id"].as_str().unwrap().to_owned();
    assert_eq!(audited(&pool, org.id, "run.submit", member, &rerun).await, 1);
    waiting_at_ask(&app, &rerun).await;
    assert!(events(&pool, &rerun).await.contains(&"run.awaiting:ask".to_owned()));

    // Pause a workflow: a new run is held; unpause releases it.
    app.json(Method::POST, &format!("{BASE}/workflows/approve/pause"), &org.member, None, StatusCode::OK).await;
    let wf: String = sqlx::query_scalar("SELECT workflow_id::text FROM workflows WHERE name = 'approve'").fetch_one(&pool).await.unwrap();
    let wf_target = engine::ids::WorkflowId(wf.parse().unwrap()).to_string();
    assert_eq!(audited(&pool, org.id, "workflow.pause", member, &wf_target).await, 1);
    let held = submit(&app, &org, "approve").await;
    let why = app.json(Method::GET, &format!("{BASE}/runs/{held}/why"), &org.viewer, None, StatusCode::OK).await;
    assert_eq!((why["substate"].as_str(), why["text"].as_str()), (Some("held"), Some("Held: workflow approve is paused")));
    app.json(Method::POST, &format!("{BASE}/workflows/approve/unpause"), &org.member, None, StatusCode::OK).await;
    assert_eq!(audited(&pool, org.id, "workflow.unpause", member, &wf_target).await, 1);
    waiting_at_ask(&app, &held).await;
    assert_eq!(&events(&pool, &held).await[..3], ["run.started", "run.held", "run.admitted"]);

    // Pause a project (admin): the same, for every workflow of it.
    let settings = app.json(Method::POST, &format!("{BASE}/pause"), &org.admin, None, StatusCode::OK).await;
    assert_eq!(settings["paused"], true);
    assert_eq!(audited(&pool, org.id, "project.pause", admin, &org.project.to_string()).await, 1);
    let held = submit(&app, &org, "approve").await;
    let why = app.json(Method::GET, &format!("{BASE}/runs/{held}/why"), &org.viewer, None, StatusCode::OK).await;
    assert_eq!(why["text"], "Held: the project is paused");
    app.json(Method::POST, &format!("{BASE}/unpause"), &org.admin, None, StatusCode::OK).await;
    assert_eq!(audited(&pool, org.id, "project.unpause", admin, &org.project.to_string()).await, 1);
    waiting_at_ask(&app, &held).await;
    assert_eq!(&events(&pool, &held).await[..3], ["run.started", "run.held", "run.admitted"]);

    // A spent budget holds new runs; raising it (admin) releases them.
    upload(&app, &org, "costly", "name: costly\nnodes:\n  work:\n    crew: { harness: claude-code, prompt: work }\n").await;
    app.json(Method::PUT, &format!("{BASE}/budgets/day"), &org.admin, Some(&json!({ "usd_limit": 1, "hard": false })), StatusCode::OK).await;
    let spender = app.created(&format!("{BASE}/runs"), &org.member, &json!({ "workflow": "costly", "input": { "test": { "cost_usd": 3 } } })).await;
    app.until(spender.parse().unwrap(), "SELECT status = 'completed' FROM runs WHERE run_id = $1", "completed").await;
    let budgets = app.json(Method::GET, &format!("{BASE}/budgets"), &org.viewer, None, StatusCode::OK).await;
    assert_eq!((budgets["items"][0]["project"].as_str(), budgets["items"][0]["spent_usd"].as_f64()), (Some("web"), Some(3.0)));
    let held = submit(&app, &org, "approve").await;
    let why = app.json(Method::GET, &format!("{BASE}/runs/{held}/why"), &org.viewer, None, StatusCode::OK).await;
    assert_eq!(why["text"], "Held: the project's daily budget of $1.00 (soft) is spent");
    app.json(Method::PUT, &format!("{BASE}/budgets/day"), &org.admin, Some(&json!({ "usd_limit": 50, "hard": false })), StatusCode::OK).await;
    let target = format!("{}:day", org.project);
    assert_eq!(audited(&pool, org.id, "budget.set", admin, &target).await, 2);
    waiting_at_ask(&app, &held).await;
    assert_eq!(&events(&pool, &held).await[..3], ["run.started", "run.held", "run.admitted"]);
    let spend = app.json(Method::GET, "/api/v1/orgs/acme/spend", &org.viewer, None, StatusCode::OK).await;
    assert_eq!((spend["total_usd"].as_f64(), spend["items"][0]["project"].as_str()), (Some(3.0), Some("web")));

    // The org's cap (admin): at 1, with a run waiting at its approval, a new run is queued;
    // raising the cap releases it.
    let limits = app.json(Method::PUT, "/api/v1/orgs/acme/limits", &org.admin, Some(&json!({ "running_cap": 1 })), StatusCode::OK).await;
    assert!(limits["running"].as_i64().unwrap() >= 1, "{limits}");
    assert_eq!(audited(&pool, org.id, "org.running_cap", admin, &org.id.to_string()).await, 1);
    let queued = submit(&app, &org, "approve").await;
    let why = app.json(Method::GET, &format!("{BASE}/runs/{queued}/why"), &org.viewer, None, StatusCode::OK).await;
    assert!(why["text"].as_str().unwrap().starts_with("Queued: held by the org's cap of 1 running runs"), "{why}");
    assert_eq!(app.json(Method::GET, "/api/v1/orgs/acme/limits", &org.viewer, None, StatusCode::OK).await["waiting"], 1);
    app.json(Method::PUT, "/api/v1/orgs/acme/limits", &org.admin, Some(&json!({ "running_cap": 50 })), StatusCode::OK).await;
    waiting_at_ask(&app, &queued).await;
    assert_eq!(&events(&pool, &queued).await[..3], ["run.started", "run.held", "run.admitted"]);

    // Retention (admin).
    let set = app.json(Method::PUT, &format!("{BASE}/retention"), &org.admin, Some(&json!({ "retention_days": 30 })), StatusCode::OK).await;
    assert_eq!(set["retention_days"], 30);
    assert_eq!(audited(&pool, org.id, "project.retention", admin, &org.project.to_string()).await, 1);

    // Resolve a failed run: marked handled, still failed.
    upload(&app, &org, "failing", "name: failing\nnodes:\n  work:\n    crew: { harness: claude-code, prompt: work }\n").await;
    let failed =
        app.created(&format!("{BASE}/runs"), &org.member, &json!({ "workflow": "failing", "input": { "test": { "fail_attempts": { "work": 1 } } } })).await;
    app.until(failed.parse().unwrap(), "SELECT status = 'failed' FROM runs WHERE run_id = $1", "failed").await;
    let (status_now, _, _) = app.send(Method::POST, &format!("{BASE}/runs/{held}/resolve"), Some(&org.member), None).await;
    assert_eq!(status_now, StatusCode::CONFLICT, "only a failed run is resolved");
    let resolved =
        app.json(Method::POST, &format!("{BASE}/runs/{failed}/resolve"), &org.member, Some(&json!({ "note": "flaky runner" })), StatusCode::OK).await;
    assert_eq!(resolved["resolved_by"], format!("user:{member}"));
    let now = status(&app, &org, &failed).await;
    assert_eq!((now["status"].as_str(), now["resolved_at"].is_string()), (Some("failed"), true));
    assert_eq!(audited(&pool, org.id, "run.resolve", member, &failed).await, 1);
    assert_eq!(events(&pool, &failed).await.last().map(String::as_str), Some("run.resolved"));

    // Reset an item's spent cycle budget: its blocked event opens a run.
    reset_cycle_budget(&app, &org, &pool, member).await;
    app.discard().await;
}

/// A workflow triggered by GitHub whose cycle budget on an item is spent, with the event it
/// blocked; the reset (member) clears the ask and the event opens a run.
async fn reset_cycle_budget(app: &App, org: &Org, pool: &Db, member: UserId) {
    upload(
        app,
        org,
        "triaged",
        "name: triaged\non:\n  github: { events: [issues.labeled] }\nbudget: { max_cycles: 1 }\nnodes:\n  ask:\n    approval: { prompt: ok? }\n",
    )
    .await;
    let key = r#"["github","acme/web",7]"#;
    let workflow: engine::ids::WorkflowId = sqlx::query_scalar("SELECT workflow_id FROM workflows WHERE name = 'triaged'").fetch_one(pool).await.unwrap();
    let item = engine::testkit::used_up_cycle_budget(pool, org.id, org.project, workflow, "triaged").await;
    let asks = app.json(Method::GET, &format!("{BASE}/cycle-asks"), &org.viewer, None, StatusCode::OK).await;
    assert_eq!((asks["items"][0]["key"].as_str(), asks["items"][0]["workflow"].as_str()), (Some(key), Some("triaged")));
    let item_id = asks["items"][0]["item"].as_str().unwrap().to_owned();
    let reset = app.json(Method::POST, &format!("{BASE}/cycle-asks/{item_id}/reset"), &org.member, None, StatusCode::OK).await;
    assert_eq!(reset["generation"], 1);
    assert_eq!(reset["claims"][0]["claim"]["claim"], "opened", "{reset}");
    let run = reset["claims"][0]["claim"]["run"].as_str().unwrap().to_owned();
    assert_eq!(events(pool, &run).await.first().map(String::as_str), Some("run.started"));
    assert_eq!(audited(pool, org.id, "item.cycle_reset", member, &item.to_string()).await, 1);
    let asks = app.json(Method::GET, &format!("{BASE}/cycle-asks"), &org.viewer, None, StatusCode::OK).await;
    assert_eq!(asks["items"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn admission_refusals_are_problems_409_and_429() {
    let app = App::start().await;
    let org = app.org("acme").await;
    upload(&app, &org, "single", "name: single\nconcurrency: { group: deploy, limit: 1, policy: skip }\nnodes:\n  ask:\n    approval: { prompt: ok? }\n").await;
    submit(&app, &org, "single").await;
    let (status, headers, body) = app.send(Method::POST, &format!("{BASE}/runs"), Some(&org.member), Some(&json!({ "workflow": "single" }))).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let p = problem(status, &headers, &body);
    assert_eq!(p.detail, "skipped: concurrency group deploy is full (1 running)");

    // The org's line is full: 1,000 wait for a cap of 1 (no engine: nothing moves).
    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
    admission::set_running_cap(&mut ch, org.id, 1).await.unwrap();
    ch.commit().await.unwrap();
    let workflow = sqlx::query_scalar("SELECT workflow_id FROM workflows WHERE name = 'approve'").fetch_one(app.pool()).await.unwrap();
    let seed = Seed { org: org.id, project: org.project, workflow, version: 1 };
    shopfloor_tests::submit_many(app.pool(), &seed, 1_000, json!({})).await;
    let (status, headers, body) = app.send(Method::POST, &format!("{BASE}/runs"), Some(&org.member), Some(&json!({ "workflow": "approve" }))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let p = problem(status, &headers, &body);
    assert_eq!(
        (p.kind.as_str(), p.detail.as_str()),
        ("https://shopfloor.dev/problems/too-many-requests", "1000 runs already wait for the org's cap of 1 running runs")
    );
    app.discard().await;
}

#[tokio::test]
async fn edit_and_retry_draining_a_host_and_wip_limits_are_audited_with_their_user() {
    let (app, org, pool) = acme().await;
    let member = org.member_user;
    let admin = org.admin_user;

    // Edit-and-retry: a cancelled run of a crew node, retried with a new prompt and model.
    upload(&app, &org, "editable", "name: editable\nnodes:\n  work:\n    crew: { harness: claude-code, model: sonnet, prompt: do the work }\n  check:\n    after: [work]\n    approval: { prompt: ok? }\n").await;
    let first =
        app.created(&format!("{BASE}/runs"), &org.member, &json!({ "workflow": "editable", "input": { "test": { "step_ms": { "work": 1500 } } } })).await;
    app.until(first.parse().unwrap(), "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'work' AND state = 'running')", "work running").await;
    app.json(Method::POST, &format!("{BASE}/runs/{first}/cancel"), &org.member, None, StatusCode::OK).await;
    // Bad edits are refused as problems, and nothing is created.
    for (edit, want) in [
        (json!({ "node": "nope", "prompt": "x" }), StatusCode::NOT_FOUND),
        (json!({ "node": "check", "prompt": "x" }), StatusCode::UNPROCESSABLE_ENTITY),
        (json!({ "node": "work", "harness": "vim" }), StatusCode::UNPROCESSABLE_ENTITY),
        (json!({ "node": "work" }), StatusCode::UNPROCESSABLE_ENTITY),
        (json!({ "node": "work", "prompt": "{{ unclosed" }), StatusCode::UNPROCESSABLE_ENTITY),
        (json!({ "prompt": "x" }), StatusCode::BAD_REQUEST),
    ] {
        let (status, headers, body) = app.send(Method::POST, &format!("{BASE}/runs/{first}/retry"), Some(&org.member), Some(&edit)).await;
        assert_eq!(status, want, "{edit}: {}", String::from_utf8_lossy(&body));
        crate::support::problem(status, &headers, &body);
    }
    let (status, _, _) = app
        .send(Method::POST, &format!("/api/v1/orgs/other/projects/web/runs/{first}/retry"), Some(&org.member), Some(&json!({ "node": "work", "prompt": "x" })))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(sqlx::query_scalar::<_, i64>("SELECT count(*) FROM runs WHERE source_run_id IS NOT NULL").fetch_one(&pool).await.unwrap(), 0);
    let edit = json!({ "node": "work", "prompt": "do less", "model": "haiku" });
    let retried = app.json(Method::POST, &format!("{BASE}/runs/{first}/retry"), &org.member, Some(&edit), StatusCode::CREATED).await;
    let retry = retried["id"].as_str().unwrap().to_owned();
    assert_eq!(retried["source_run"], first);
    waiting_at(&app, &retry, "check").await;
    let output: Value = sqlx::query_scalar("SELECT output FROM steps WHERE run_id = $1 AND node = 'work' AND state = 'succeeded'")
        .bind(retry.parse::<RunId>().unwrap())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        (output["prompt"].as_str(), output["model"].as_str(), output["harness"].as_str(), output["edited"].as_bool()),
        (Some("do less"), Some("haiku"), Some("claude-code"), Some(true))
    );
    assert_eq!(audited(&pool, org.id, "run.edit_retry", member, &retry).await, 1);
    assert!(events(&pool, &retry).await.contains(&"run.edited".to_owned()));
    // A plain retry of the retry keeps the edit.
    app.json(Method::POST, &format!("{BASE}/runs/{retry}/cancel"), &org.member, None, StatusCode::OK).await;
    let again = app.json(Method::POST, &format!("{BASE}/runs/{retry}/retry"), &org.member, None, StatusCode::CREATED).await;
    let again = again["id"].as_str().unwrap().to_owned();
    let kept: Option<String> = sqlx::query_scalar("SELECT prompt FROM run_node_overrides WHERE run_id = $1 AND node = 'work'")
        .bind(again.parse::<RunId>().unwrap())
        .fetch_optional(&pool)
        .await
        .unwrap();
    assert_eq!(kept.as_deref(), Some("do less"));
    app.json(Method::POST, &format!("{BASE}/runs/{again}/cancel"), &org.member, None, StatusCode::OK).await;

    // Drain and undrain a host (admin): visible in the list, audited.
    let host = uuid::Uuid::now_v7();
    sqlx::query("INSERT INTO hosts (org_id, project_id, host_id, name, capabilities) VALUES ($1, $2, $3, 'box-1', '{linux}')")
        .bind(org.id)
        .bind(org.project)
        .bind(host)
        .execute(&pool)
        .await
        .unwrap();
    let (status, _, _) = app.send(Method::POST, &format!("{BASE}/hosts/{host}/drain"), Some(&org.member), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, _) = app.send(Method::POST, &format!("{BASE}/hosts/not-a-host/drain"), Some(&org.admin), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let drained = app.json(Method::POST, &format!("{BASE}/hosts/{host}/drain"), &org.admin, None, StatusCode::OK).await;
    assert_eq!(drained["drained_by"], format!("user:{admin}"));
    let listed = app.json(Method::GET, &format!("{BASE}/hosts"), &org.viewer, None, StatusCode::OK).await;
    assert!(listed["items"][0]["drained_at"].is_string(), "{listed}");
    assert_eq!(audited(&pool, org.id, "host.drain", admin, &engine::ids::HostId(host).to_string()).await, 1);
    let undrained = app.json(Method::POST, &format!("{BASE}/hosts/{host}/undrain"), &org.admin, None, StatusCode::OK).await;
    assert!(undrained["drained_at"].is_null());
    assert_eq!(audited(&pool, org.id, "host.undrain", admin, &engine::ids::HostId(host).to_string()).await, 1);

    // A board column's WIP limit (admin): shown in the settings, audited, removable once.
    let settings =
        app.json(Method::PUT, &format!("{BASE}/board-limits"), &org.admin, Some(&json!({ "column": "In progress", "wip_limit": 3 })), StatusCode::OK).await;
    assert_eq!(settings["board_limits"], json!([{ "column": "In progress", "wip_limit": 3, "occupied": 0, "waiting": 0 }]));
    assert_eq!(audited(&pool, org.id, "board.wip_limit", admin, &org.project.to_string()).await, 1);
    for bad in [json!({ "column": "", "wip_limit": 3 }), json!({ "column": "x", "wip_limit": 0 }), json!({ "column": "x" , "wip_limit": "3" })] {
        let (status, _, body) = app.send(Method::PUT, &format!("{BASE}/board-limits"), Some(&org.admin), Some(&bad)).await;
        assert!(status.is_client_error(), "{bad}: {status} {}", String::from_utf8_lossy(&body));
    }
    let settings =
        app.json(Method::PUT, &format!("{BASE}/board-limits"), &org.admin, Some(&json!({ "column": "in PROGRESS", "wip_limit": null })), StatusCode::OK).await;
    assert_eq!(settings["board_limits"], json!([]));
    assert_eq!(audited(&pool, org.id, "board.wip_limit_remove", admin, &org.project.to_string()).await, 1);
    let (status, _, _) =
        app.send(Method::PUT, &format!("{BASE}/board-limits"), Some(&org.admin), Some(&json!({ "column": "In progress", "wip_limit": null }))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.discard().await;
}

async fn waiting_at(app: &App, run: &str, node: &str) {
    let sql = format!("SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = '{node}' AND state = 'waiting')");
    app.until(run.parse().unwrap(), &sql, "waiting").await;
}
