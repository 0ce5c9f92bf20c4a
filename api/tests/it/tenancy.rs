//! Tenancy: every route that names an object, called by one org's owner with the id of an
//! object of another org, answers 404 with the same body as for an id that exists nowhere, so
//! the answer leaks nothing; and the other org's objects are left untouched.

use engine::ids::{OrgId, RunId, Slug};
use engine::store::runs::{self, NewRun};
use engine::store::{Actor, Change, tenants, workflows};
use engine::testkit::APPROVAL;
use reqwest::{Method, StatusCode};
use serde_json::json;

use api::auth::{UserToken, issue_user_token_with_id};

use crate::support::{App, problem};

#[tokio::test]
async fn another_orgs_ids_answer_404_and_leak_nothing() {
    let app = App::with_engine().await;
    let acme = app.org("acme").await;
    let other = app.org("other").await;

    // The other org's objects: a project, a workflow, a waiting run, a member and a token.
    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
    // Named by its slug below, as a caller in acme would try it.
    tenants::create_project(&mut ch, other.id, &Slug::parse("secret").unwrap(), "secret").await.unwrap();
    let (wf, _) = workflows::put_version(&mut ch, other.id, other.project, "private-wf", &APPROVAL.replace("name: approve", "name: private-wf")).await.unwrap();
    let run = runs::submit(&mut ch, NewRun::of_workflow(other.id, other.project, wf, 1, json!({}))).await.unwrap();
    ch.commit().await.unwrap();
    app.until(run, "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'ask' AND state = 'waiting')", "ask waiting").await;
    let (jti, _) = app.token_for(&other, other.member_user, "member", chrono::Duration::days(1)).await;
    let host = uuid::Uuid::now_v7();
    sqlx::query("INSERT INTO hosts (org_id, project_id, host_id, name) VALUES ($1, $2, $3, 'their-box')")
        .bind(other.id)
        .bind(other.project)
        .bind(host)
        .execute(app.pool())
        .await
        .unwrap();
    let step: engine::ids::StepId =
        sqlx::query_scalar("SELECT step_id FROM steps WHERE run_id = $1 AND node = 'ask'").bind(run).fetch_one(app.pool()).await.unwrap();
    let (host, step) = (host.to_string(), step.to_string());
    let (missing_host, missing_step) = (uuid::Uuid::now_v7().to_string(), engine::ids::StepId::mint().to_string());

    let run_id = run.to_string();
    let missing_run = engine::ids::RunId::mint().to_string();
    let user = other.member_user.to_string();
    let missing_user = uuid::Uuid::now_v7().to_string();
    let token = jti.to_string();
    let missing_token = uuid::Uuid::now_v7().to_string();

    // (method, path with the other org's id, the same path with an id that exists nowhere, the id)
    let calls: Vec<(Method, String, String, &str)> = vec![
        (Method::GET, "/api/v1/orgs/other/projects".into(), "/api/v1/orgs/nowhere/projects".into(), "other"),
        (Method::GET, "/api/v1/orgs/other/members".into(), "/api/v1/orgs/nowhere/members".into(), "other"),
        (Method::GET, "/api/v1/orgs/other/projects/web/runs".into(), "/api/v1/orgs/nowhere/projects/web/runs".into(), "other"),
        (Method::GET, "/api/v1/orgs/acme/projects/secret".into(), "/api/v1/orgs/acme/projects/nosuch".into(), "secret"),
        (Method::GET, "/api/v1/orgs/acme/projects/secret/runs".into(), "/api/v1/orgs/acme/projects/nosuch/runs".into(), "secret"),
        (Method::GET, "/api/v1/orgs/acme/projects/secret/workflows".into(), "/api/v1/orgs/acme/projects/nosuch/workflows".into(), "secret"),
        (Method::GET, "/api/v1/orgs/acme/projects/secret/events".into(), "/api/v1/orgs/acme/projects/nosuch/events".into(), "secret"),
        (Method::GET, "/api/v1/orgs/acme/projects/secret/audit".into(), "/api/v1/orgs/acme/projects/nosuch/audit".into(), "secret"),
        (Method::GET, "/api/v1/orgs/acme/projects/web/workflows/private-wf".into(), "/api/v1/orgs/acme/projects/web/workflows/no-such-wf".into(), "private-wf"),
        (
            Method::GET,
            "/api/v1/orgs/acme/projects/web/workflows/private-wf/versions".into(),
            "/api/v1/orgs/acme/projects/web/workflows/no-such-wf/versions".into(),
            "private-wf",
        ),
        (
            Method::GET,
            "/api/v1/orgs/acme/projects/web/workflows/private-wf/versions/1".into(),
            "/api/v1/orgs/acme/projects/web/workflows/no-such-wf/versions/1".into(),
            "private-wf",
        ),
        (
            Method::POST,
            "/api/v1/orgs/acme/projects/web/workflows/private-wf/pause".into(),
            "/api/v1/orgs/acme/projects/web/workflows/no-such-wf/pause".into(),
            "private-wf",
        ),
        (
            Method::POST,
            "/api/v1/orgs/acme/projects/web/workflows/private-wf/unpause".into(),
            "/api/v1/orgs/acme/projects/web/workflows/no-such-wf/unpause".into(),
            "private-wf",
        ),
        (Method::GET, format!("/api/v1/orgs/acme/projects/web/runs/{run_id}"), format!("/api/v1/orgs/acme/projects/web/runs/{missing_run}"), &run_id),
        (Method::GET, format!("/api/v1/orgs/acme/projects/web/runs/{run_id}/why"), format!("/api/v1/orgs/acme/projects/web/runs/{missing_run}/why"), &run_id),
        (
            Method::GET,
            format!("/api/v1/orgs/acme/projects/web/runs/{run_id}/events"),
            format!("/api/v1/orgs/acme/projects/web/runs/{missing_run}/events"),
            &run_id,
        ),
        (
            Method::POST,
            format!("/api/v1/orgs/acme/projects/web/runs/{run_id}/cancel"),
            format!("/api/v1/orgs/acme/projects/web/runs/{missing_run}/cancel"),
            &run_id,
        ),
        (
            Method::POST,
            format!("/api/v1/orgs/acme/projects/web/runs/{run_id}/retry"),
            format!("/api/v1/orgs/acme/projects/web/runs/{missing_run}/retry"),
            &run_id,
        ),
        (
            Method::POST,
            format!("/api/v1/orgs/acme/projects/web/runs/{run_id}/rerun"),
            format!("/api/v1/orgs/acme/projects/web/runs/{missing_run}/rerun"),
            &run_id,
        ),
        (
            Method::POST,
            format!("/api/v1/orgs/acme/projects/web/runs/{run_id}/approvals/ask"),
            format!("/api/v1/orgs/acme/projects/web/runs/{missing_run}/approvals/ask"),
            &run_id,
        ),
        (
            Method::POST,
            format!("/api/v1/orgs/acme/projects/web/runs/{run_id}/approvals/ask/reject"),
            format!("/api/v1/orgs/acme/projects/web/runs/{missing_run}/approvals/ask/reject"),
            &run_id,
        ),
        (Method::GET, "/api/v1/orgs/acme/projects/secret/hosts".into(), "/api/v1/orgs/acme/projects/nosuch/hosts".into(), "secret"),
        (Method::POST, "/api/v1/orgs/acme/projects/secret/host-registrations".into(), "/api/v1/orgs/acme/projects/nosuch/host-registrations".into(), "secret"),
        (Method::DELETE, format!("/api/v1/orgs/acme/projects/web/hosts/{host}"), format!("/api/v1/orgs/acme/projects/web/hosts/{missing_host}"), &host),
        (
            Method::GET,
            format!("/api/v1/orgs/acme/projects/web/runs/{run_id}/steps/{step}/logs"),
            format!("/api/v1/orgs/acme/projects/web/runs/{run_id}/steps/{missing_step}/logs"),
            &step,
        ),
        (Method::PATCH, format!("/api/v1/orgs/acme/members/{user}"), format!("/api/v1/orgs/acme/members/{missing_user}"), &user),
        (Method::DELETE, format!("/api/v1/orgs/acme/members/{user}"), format!("/api/v1/orgs/acme/members/{missing_user}"), &user),
        (Method::DELETE, format!("/api/v1/orgs/acme/tokens/{token}"), format!("/api/v1/orgs/acme/tokens/{missing_token}"), &token),
    ];
    for (method, path, missing, id) in &calls {
        let body = match *method {
            Method::PATCH => Some(json!({ "role": "admin" })),
            Method::POST if path.contains("/approvals/") && !path.ends_with("reject") => Some(json!({ "ticket": "T-1" })),
            _ => None,
        };
        let (status, headers, bytes) = app.send(method.clone(), path, Some(&acme.owner), body.as_ref()).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {}", String::from_utf8_lossy(&bytes));
        problem(status, &headers, &bytes);
        let (m_status, _, m_bytes) = app.send(method.clone(), missing, Some(&acme.owner), body.as_ref()).await;
        assert_eq!(m_status, StatusCode::NOT_FOUND, "{method} {missing}");
        // Byte for byte the answer for an id that exists nowhere, but for the id asked about.
        let missing_id = missing.split('/').zip(path.split('/')).find(|(a, b)| a != b).map(|(a, _)| a).unwrap();
        let text = String::from_utf8_lossy(&bytes).replace(id, "<id>");
        let m_text = String::from_utf8_lossy(&m_bytes).replace(missing_id, "<id>");
        assert_eq!(text, m_text, "{method} {path} answers differently from an id that does not exist");
        for secret in [other.id.to_string(), other.project.to_string(), "secret".into(), "private-wf".into(), "other".into(), run_id.clone()] {
            if !path.contains(&secret) {
                assert!(!text.contains(&secret), "{method} {path} leaks {secret}: {text}");
            }
        }
    }

    // Nothing of the other org moved, and no retry or rerun of its run was made in acme.
    left_waiting(&app, run, acme.id, 0).await;
    let paused: bool = sqlx::query_scalar("SELECT paused FROM workflows WHERE workflow_id = $1").bind(wf).fetch_one(app.pool()).await.unwrap();
    assert!(!paused);
    let role: String = sqlx::query_scalar("SELECT role FROM memberships WHERE org_id = $1 AND user_id = $2")
        .bind(other.id)
        .bind(other.member_user)
        .fetch_one(app.pool())
        .await
        .unwrap();
    assert_eq!(role, "member");
    let gone: bool = sqlx::query_scalar("SELECT deregistered_at IS NOT NULL FROM hosts WHERE host_id = $1")
        .bind(uuid::Uuid::parse_str(&host).unwrap())
        .fetch_one(app.pool())
        .await
        .unwrap();
    assert!(!gone, "another org's host was deregistered");
    let revoked: bool = sqlx::query_scalar("SELECT revoked_at IS NOT NULL FROM api_tokens WHERE jti = $1").bind(jti).fetch_one(app.pool()).await.unwrap();
    assert!(!revoked);
    app.finish().await;
}

/// Within one org, a run belongs to its project: every run route of another project answers
/// it 404, byte for byte as a run that exists nowhere, as it answers text that is no run id;
/// and nothing of the run moves.
#[tokio::test]
async fn a_run_is_not_found_through_another_project_of_its_org() {
    let app = App::with_engine().await;
    let acme = app.org("acme").await;
    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
    tenants::create_project(&mut ch, acme.id, &Slug::parse("ops").unwrap(), "ops").await.unwrap();
    let (wf, _) = workflows::put_version(&mut ch, acme.id, acme.project, "approve", APPROVAL).await.unwrap();
    let run = runs::submit(&mut ch, NewRun::of_workflow(acme.id, acme.project, wf, 1, json!({}))).await.unwrap();
    ch.commit().await.unwrap();
    app.until(run, "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'ask' AND state = 'waiting')", "ask waiting").await;
    let step: engine::ids::StepId =
        sqlx::query_scalar("SELECT step_id FROM steps WHERE run_id = $1 AND node = 'ask'").bind(run).fetch_one(app.pool()).await.unwrap();
    let missing = engine::ids::RunId::mint().to_string();

    let routes = [
        (Method::GET, ""),
        (Method::GET, "/why"),
        (Method::GET, "/events"),
        (Method::POST, "/cancel"),
        (Method::POST, "/retry"),
        (Method::POST, "/rerun"),
        (Method::POST, "/resolve"),
        (Method::POST, "/approvals/ask"),
        (Method::POST, "/approvals/ask/reject"),
        (Method::GET, &format!("/steps/{step}/logs")),
        (Method::POST, &format!("/steps/{step}/messages")),
    ];
    for (method, rest) in routes {
        let body = rest.ends_with("/messages").then(|| json!({ "text": "hello" }));
        let mut answers = Vec::new();
        for id in [run.to_string(), missing.clone(), "run-nope".to_owned()] {
            let path = format!("/api/v1/orgs/acme/projects/ops/runs/{id}{rest}");
            let (status, headers, bytes) = app.send(method.clone(), &path, Some(&acme.owner), body.as_ref()).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {}", String::from_utf8_lossy(&bytes));
            problem(status, &headers, &bytes);
            answers.push(String::from_utf8_lossy(&bytes).replace(&id, "<id>"));
        }
        assert!(answers.iter().all(|a| *a == answers[0]), "{method} …{rest} answers a run of another project unlike a missing one: {answers:?}");
        // The same route in the run's own project finds it.
        let (status, _, _) = app.send(method.clone(), &format!("/api/v1/orgs/acme/projects/web/runs/{run}{rest}"), Some(&acme.viewer), body.as_ref()).await;
        assert_ne!(status, StatusCode::NOT_FOUND, "{method} …{rest} in the run's own project");
    }

    left_waiting(&app, run, acme.id, 1).await;
    app.finish().await;
}

/// The approval run still waits at `ask`, and `org` holds `runs` runs: the calls neither
/// answered the run nor made a retry or rerun of it.
async fn left_waiting(app: &App, run: RunId, org: OrgId, runs: i64) {
    let state: String = sqlx::query_scalar("SELECT state FROM steps WHERE run_id = $1 AND node = 'ask'").bind(run).fetch_one(app.pool()).await.unwrap();
    assert_eq!(state, "waiting");
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE org_id = $1").bind(org).fetch_one(app.pool()).await.unwrap();
    assert_eq!(held, runs, "a retry or rerun made a run");
}

/// A token limited to one project stays within it: the tokens it makes are limited to that
/// project too, and the org's audit log shows it that project's entries only.
#[tokio::test]
async fn a_project_limited_token_makes_only_project_limited_tokens_and_reads_its_projects_audit() {
    let app = App::with_engine().await;
    let org = app.org("acme").await;
    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
    let ops = tenants::create_project(&mut ch, org.id, &Slug::parse("ops").unwrap(), "ops").await.unwrap();
    ch.commit().await.unwrap();
    let limited = UserToken { org: org.id, user: org.admin_user, project: Some(ops), role: "admin", name: "ops only", ttl: chrono::Duration::days(1) };
    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
    let (_, limited) = issue_user_token_with_id(&mut ch, &engine::testkit::secret_key(), limited).await.unwrap();
    ch.commit().await.unwrap();
    // The web project's activity, written by an unlimited token.
    app.json(Method::PUT, "/api/v1/orgs/acme/projects/web/budgets/day", &org.admin, Some(&json!({ "usd_limit": 5 })), StatusCode::OK).await;
    app.json(Method::GET, "/api/v1/orgs/acme/projects/web/runs", &limited, None, StatusCode::NOT_FOUND).await;

    let made = app.json(Method::POST, "/api/v1/orgs/acme/tokens", &limited, Some(&json!({ "name": "escalated" })), StatusCode::CREATED).await;
    let made = made["token"].as_str().unwrap();
    app.json(Method::GET, "/api/v1/orgs/acme/projects/web/runs", made, None, StatusCode::NOT_FOUND).await;
    app.json(Method::GET, "/api/v1/orgs/acme/projects/ops/runs", made, None, StatusCode::OK).await;

    let budget_set = |log: &serde_json::Value| log["items"].as_array().unwrap().iter().any(|e| e["action"] == "budget.set");
    let all = app.json(Method::GET, "/api/v1/orgs/acme/audit?limit=200", &org.admin, None, StatusCode::OK).await;
    assert!(budget_set(&all), "{all}");
    let log = app.json(Method::GET, "/api/v1/orgs/acme/audit?limit=200", &limited, None, StatusCode::OK).await;
    assert!(!budget_set(&log), "the web project's entries: {log}");
    app.finish().await;
}
