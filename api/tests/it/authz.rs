//! Authorization, table-driven: every route of the OpenAPI document, called by each kind of
//! caller — owner, admin, member, viewer, no token, an expired token, a revoked token, a token
//! signed with another key, an `alg: none` token, a token of another org — gets exactly the
//! status the table says. Each allowed call gets fresh objects to act on, so its answer is the
//! route's success status.

use std::collections::BTreeSet;

use api::http::auth::Role;
use engine::ids::RunId;
use engine::store::runs::{self, NewRun};
use engine::store::{api_writes, Actor, Change};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{alg_none, problem, signed_with_other_key, App, Org};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Who {
    Role(Role),
    NoToken,
    Expired,
    Revoked,
    OtherKey,
    AlgNone,
    OtherOrg,
}

/// What a call needs to exist before it is made.
#[derive(Debug, Clone, Copy)]
enum Needs {
    Nothing,
    /// A run waiting at its `ask` approval.
    WaitingRun,
    /// A cancelled run.
    EndedRun,
    /// A viewer member to change or remove.
    Member,
    /// A token of the caller's own (the owner's for callers that are not members).
    OwnToken,
}

struct Case {
    method: Method,
    /// The route as the OpenAPI document names it.
    route: &'static str,
    min: Option<Role>,
    ok: StatusCode,
    needs: Needs,
    body: fn(u32) -> Option<Value>,
}

fn none(_: u32) -> Option<Value> {
    None
}

fn cases() -> Vec<Case> {
    use Needs::*;
    let c = |method: Method, route: &'static str, min: Option<Role>, ok: u16, needs: Needs, body: fn(u32) -> Option<Value>| Case {
        method,
        route,
        min,
        ok: StatusCode::from_u16(ok).unwrap(),
        needs,
        body,
    };
    let (get, post, put, patch, delete) = (Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE);
    let (v, m, a) = (Some(Role::Viewer), Some(Role::Member), Some(Role::Admin));
    vec![
        c(get.clone(), "/healthz", None, 200, Nothing, none),
        c(get.clone(), "/readyz", None, 200, Nothing, none),
        c(get.clone(), "/api/v1/orgs/{org}/members", v, 200, Nothing, none),
        c(post.clone(), "/api/v1/orgs/{org}/members", a, 201, Nothing, |n| Some(json!({ "email": format!("new{n}@x.test"), "role": "viewer" }))),
        c(patch.clone(), "/api/v1/orgs/{org}/members/{user}", a, 200, Member, |_| Some(json!({ "role": "member" }))),
        c(delete.clone(), "/api/v1/orgs/{org}/members/{user}", a, 204, Member, none),
        c(get.clone(), "/api/v1/orgs/{org}/tokens", v, 200, Nothing, none),
        c(post.clone(), "/api/v1/orgs/{org}/tokens", m, 201, Nothing, |_| Some(json!({ "name": "ci", "role": "viewer" }))),
        c(delete.clone(), "/api/v1/orgs/{org}/tokens/{token}", m, 204, OwnToken, none),
        c(get.clone(), "/api/v1/orgs/{org}/projects", v, 200, Nothing, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects", a, 201, Nothing, |n| Some(json!({ "slug": format!("p{n}") }))),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}", v, 200, Nothing, none),
        c(get.clone(), "/api/v1/orgs/{org}/audit", a, 200, Nothing, none),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/audit", a, 200, Nothing, none),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/events", v, 200, Nothing, none),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/workflows", v, 200, Nothing, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/workflows", m, 201, Nothing, |n| Some(json!({ "source": workflow(&format!("w{n}")) }))),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/validate-workflow", m, 200, Nothing, |_| Some(json!({ "source": workflow("x") }))),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/workflows/{name}", v, 200, Nothing, none),
        c(put.clone(), "/api/v1/orgs/{org}/projects/{project}/workflows/{name}", m, 201, Nothing, |n| Some(json!({ "source": workflow(&format!("put{n}")) }))),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/workflows/{name}/versions", v, 200, Nothing, none),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/workflows/{name}/versions/{version}", v, 200, Nothing, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/workflows/{name}/pause", m, 200, Nothing, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/workflows/{name}/unpause", m, 200, Nothing, none),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/runs", v, 200, Nothing, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/runs", m, 201, Nothing, |_| Some(json!({ "workflow": "approve" }))),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/runs/{run}", v, 200, WaitingRun, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/runs/{run}/cancel", m, 200, WaitingRun, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/runs/{run}/retry", m, 201, EndedRun, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/runs/{run}/rerun", m, 201, EndedRun, none),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/runs/{run}/events", v, 200, WaitingRun, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/runs/{run}/approvals/{node}", m, 200, WaitingRun, |_| Some(json!({ "ticket": "T-1" }))),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/runs/{run}/approvals/{node}/reject", m, 200, WaitingRun, |_| Some(json!({ "reason": "no" }))),
    ]
}

/// A valid one-node workflow named `name`.
fn workflow(name: &str) -> String {
    format!("name: {name}\nnodes:\n  ask:\n    approval: {{ prompt: ok? }}\n")
}

fn expected(case: &Case, who: Who) -> StatusCode {
    let Some(min) = case.min else { return case.ok };
    match who {
        Who::NoToken | Who::Expired | Who::Revoked | Who::OtherKey | Who::AlgNone => StatusCode::UNAUTHORIZED,
        Who::OtherOrg => StatusCode::NOT_FOUND,
        Who::Role(r) if r >= min => case.ok,
        Who::Role(_) => StatusCode::FORBIDDEN,
    }
}

async fn submit(app: &App, org: &Org) -> RunId {
    let workflow = sqlx::query_scalar("SELECT workflow_id FROM workflows WHERE org_id = $1 AND name = 'approve'").bind(org.id).fetch_one(app.pool()).await.unwrap();
    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
    let run = runs::submit(
        &mut ch,
        NewRun { org: org.id, project: org.project, workflow, version: 1, input: json!({}), item: None, trigger_event: None, parent: None, dry_run: false, needs_approval: false, source: None },
    )
    .await
    .unwrap();
    ch.commit().await.unwrap();
    run
}

#[tokio::test]
async fn every_route_answers_each_caller_exactly() {
    let app = App::with_engine().await;
    let org = app.org("acme").await;
    let other = app.org("other").await;
    let expired = app.token_for(&org, org.owner_user, "owner", chrono::Duration::hours(-1)).await.1;
    let revoked = app.revoked_token(&org).await;
    let callers: Vec<(Who, Option<String>)> = vec![
        (Who::Role(Role::Owner), Some(org.owner.clone())),
        (Who::Role(Role::Admin), Some(org.admin.clone())),
        (Who::Role(Role::Member), Some(org.member.clone())),
        (Who::Role(Role::Viewer), Some(org.viewer.clone())),
        (Who::NoToken, None),
        (Who::Expired, Some(expired)),
        (Who::Revoked, Some(revoked)),
        (Who::OtherKey, Some(signed_with_other_key(&org.owner))),
        (Who::AlgNone, Some(alg_none(&org.owner))),
        (Who::OtherOrg, Some(other.owner.clone())),
    ];
    let users = [(Role::Owner, org.owner_user), (Role::Member, org.member_user)];

    // The table covers every documented operation, and nothing else.
    let doc = api::http::openapi();
    let mut documented = BTreeSet::new();
    for (path, item) in &doc.paths.paths {
        for (method, op) in [("GET", &item.get), ("POST", &item.post), ("PUT", &item.put), ("PATCH", &item.patch), ("DELETE", &item.delete)] {
            if op.is_some() {
                documented.insert(format!("{method} {path}"));
            }
        }
    }
    let table = cases();
    let covered: BTreeSet<String> = table.iter().map(|c| format!("{} {}", c.method, c.route)).collect();
    assert_eq!(covered, documented, "the table and the OpenAPI document list different routes");

    let mut n = 0u32;
    let mut failures = Vec::new();
    for case in &table {
        for (who, token) in &callers {
            n += 1;
            let mut path = case.route.replace("{org}", "acme").replace("{project}", "web").replace("{name}", "approve").replace("{version}", "1").replace("{node}", "ask");
            match case.needs {
                Needs::Nothing => {}
                Needs::WaitingRun | Needs::EndedRun => {
                    let run = submit(&app, &org).await;
                    if matches!(case.needs, Needs::EndedRun) {
                        let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
                        runs::cancel(&mut ch, org.id, run, "cancelled").await.unwrap();
                        ch.commit().await.unwrap();
                    } else {
                        app.until(run, "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'ask' AND state = 'waiting')", "ask waiting").await;
                    }
                    path = path.replace("{run}", &run.to_string());
                }
                Needs::Member => {
                    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
                    let user = api_writes::add_member(&mut ch, org.id, &format!("target{n}@acme.test"), "viewer").await.unwrap();
                    ch.commit().await.unwrap();
                    path = path.replace("{user}", &user.to_string());
                }
                Needs::OwnToken => {
                    let user = match who {
                        Who::Role(r) => users.iter().find(|(role, _)| role == r).map(|(_, u)| *u),
                        _ => None,
                    };
                    // Admins and viewers have no user in `users`: their own is read from the db.
                    let user = match (user, who) {
                        (Some(u), _) => u,
                        (None, Who::Role(r)) => sqlx::query_scalar("SELECT user_id FROM memberships WHERE org_id = $1 AND role = $2")
                            .bind(org.id)
                            .bind(r.as_str())
                            .fetch_one(app.pool())
                            .await
                            .unwrap(),
                        (None, _) => org.owner_user,
                    };
                    let role = match who {
                        Who::Role(r) => r.as_str(),
                        _ => "owner",
                    };
                    let (jti, _) = app.token_for(&org, user, role, chrono::Duration::days(1)).await;
                    path = path.replace("{token}", &jti.to_string());
                }
            }
            let want = expected(case, *who);
            let (status, headers, body) = app.send(case.method.clone(), &path, token.as_deref(), (case.body)(n).as_ref()).await;
            if status != want {
                failures.push(format!("{who:?} {} {path}: want {want}, got {status}: {}", case.method, String::from_utf8_lossy(&body)));
            } else if !status.is_success() {
                problem(status, &headers, &body);
            }
        }
    }
    assert!(failures.is_empty(), "{} of {n} calls answered wrongly:\n{}", failures.len(), failures.join("\n"));
    app.finish().await;
}
