//! Authorization, table-driven: every route of the OpenAPI document, called by each kind of
//! caller — owner, admin, member, viewer, no token, an expired token, a revoked token, a token
//! signed with another key, an `alg: none` token, a token of another org — gets exactly the
//! status the table says. Each allowed call gets fresh objects to act on, so its answer is the
//! route's success status.

use std::collections::BTreeSet;

use api::http::auth::Role;
use engine::ids::RunId;
use engine::store::runs;
use engine::store::{Actor, Change, api_writes};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{App, Org, alg_none, problem, signed_with_other_key};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Who {
    Role(Role),
    NoToken,
    Expired,
    Revoked,
    OtherKey,
    AlgNone,
    OtherOrg,
    /// A host registration token of the org: host routes only.
    HostToken,
    /// A host credential of the org (a registered host): the host protocol only.
    HostCredential,
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
    /// A registered host of the project.
    Host,
    /// A run with a step (its waiting `ask`).
    Step,
    /// A step no host holds (of a cancelled run), the same for every call: the host protocol's
    /// calls leave it as it is, so one run serves them all.
    SharedStep,
    /// The org's daily budget, and the project's, set.
    Budgets,
    /// An outgoing webhook of the project.
    Webhook,
    /// A delivery of an outgoing webhook.
    Delivery,
    /// A failed run.
    FailedRun,
    /// An item of the project.
    Item,
    /// GitHub's installation 77, announced, reaching `acme/repo<n>`, claimed by the org; the
    /// claim's GitHub token `ghu_authz` can access it.
    Installation,
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
        c(get.clone(), "/api/v1/openapi.json", None, 200, Nothing, none),
        // Outside the OpenAPI document (see `UNDOCUMENTED`): for scrapers, open to every caller.
        c(get.clone(), "/metrics", None, 200, Nothing, none),
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
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/repositories", v, 200, Nothing, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/repositories", a, 201, Installation, |n| {
            Some(json!({ "installation_id": 77, "repository": format!("acme/repo{n}") }))
        }),
        c(get.clone(), "/api/v1/orgs/{org}/github/installations", v, 200, Nothing, none),
        c(post.clone(), "/api/v1/orgs/{org}/github/installations", a, 201, Installation, |_| {
            Some(json!({ "installation_id": 77, "github_token": "ghu_authz" }))
        }),
        c(delete.clone(), "/api/v1/orgs/{org}/github/installations/{installation}", a, 204, Installation, none),
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
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/runs/{run}/why", v, 200, WaitingRun, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/runs/{run}/cancel", m, 200, WaitingRun, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/runs/{run}/retry", m, 201, EndedRun, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/runs/{run}/rerun", m, 201, EndedRun, none),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/runs/{run}/events", v, 200, WaitingRun, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/runs/{run}/approvals/{node}", m, 200, WaitingRun, |_| Some(json!({ "ticket": "T-1" }))),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/runs/{run}/approvals/{node}/reject", m, 200, WaitingRun, |_| Some(json!({ "reason": "no" }))),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/runs/{run}/steps/{step}/logs", v, 200, Step, none),
        // Authorized, and refused by the step: a waiting approval is no live session.
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/runs/{run}/steps/{step}/messages", m, 409, Step, |_| Some(json!({ "text": "hello" }))),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/hosts", v, 200, Nothing, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/host-registrations", a, 201, Nothing, |_| Some(json!({ "name": "box" }))),
        c(delete.clone(), "/api/v1/orgs/{org}/projects/{project}/hosts/{host}", a, 204, Host, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/hosts/{host}/drain", a, 200, Host, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/hosts/{host}/undrain", a, 200, Host, none),
        // The host protocol: host credentials only (registration tokens only to register). A
        // step the host does not hold answers `stop` to a heartbeat or a report, and 409 to a
        // start or a completion: authorized, and refused by the step's state.
        c(post.clone(), "/api/v1/host/claim", None, 200, Nothing, |_| Some(json!({ "max": 0, "wait_secs": 0 }))),
        c(post.clone(), "/api/v1/host/steps/{step}/start", None, 409, SharedStep, none),
        c(post.clone(), "/api/v1/host/steps/{step}/heartbeat", None, 200, SharedStep, none),
        c(post.clone(), "/api/v1/host/steps/{step}/session", None, 200, SharedStep, |_| {
            Some(json!({ "lines": [{ "seq": 1, "stream": "stdout", "line": "x" }] }))
        }),
        c(post.clone(), "/api/v1/host/steps/{step}/complete", None, 409, SharedStep, |_| Some(json!({ "outcome": "succeeded" }))),
        c(post.clone(), "/api/v1/host/steps/{step}/token", None, 409, SharedStep, none),
        c(post.clone(), "/api/v1/host/steps/{step}/messages/delivered", None, 200, SharedStep, |_| Some(json!({ "messages": [] }))),
        c(post.clone(), "/api/v1/host/register", None, 201, Nothing, |n| Some(json!({ "name": format!("box-{n}"), "capabilities": ["linux"] }))),
        // Admission, budgets and outgoing webhooks. Limits stay high enough for the runs above.
        c(get.clone(), "/api/v1/orgs/{org}/limits", v, 200, Nothing, none),
        c(put.clone(), "/api/v1/orgs/{org}/limits", a, 200, Nothing, |_| Some(json!({ "running_cap": 10_000 }))),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/settings", v, 200, Nothing, none),
        c(put.clone(), "/api/v1/orgs/{org}/projects/{project}/retention", a, 200, Nothing, |_| Some(json!({ "retention_days": 90 }))),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/pause", a, 200, Nothing, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/unpause", a, 200, Nothing, none),
        c(put.clone(), "/api/v1/orgs/{org}/projects/{project}/board-limits", a, 200, Nothing, |_| Some(json!({ "column": "In review", "wip_limit": 1000 }))),
        c(get.clone(), "/api/v1/orgs/{org}/budgets", v, 200, Nothing, none),
        c(put.clone(), "/api/v1/orgs/{org}/budgets/{period}", a, 200, Nothing, |_| Some(json!({ "usd_limit": 1000 }))),
        c(delete.clone(), "/api/v1/orgs/{org}/budgets/{period}", a, 204, Budgets, none),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/budgets", v, 200, Nothing, none),
        c(put.clone(), "/api/v1/orgs/{org}/projects/{project}/budgets/{period}", a, 200, Nothing, |_| Some(json!({ "usd_limit": 1000, "hard": false }))),
        c(delete.clone(), "/api/v1/orgs/{org}/projects/{project}/budgets/{period}", a, 204, Budgets, none),
        c(get.clone(), "/api/v1/orgs/{org}/spend", v, 200, Nothing, none),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/webhooks", a, 200, Nothing, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/webhooks", a, 201, Nothing, |_| {
            Some(json!({ "url": "https://hooks.example.com/hook", "events": ["x.never"] }))
        }),
        c(delete.clone(), "/api/v1/orgs/{org}/projects/{project}/webhooks/{webhook}", a, 204, Webhook, none),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/webhooks/{webhook}/deliveries", a, 200, Webhook, none),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/webhooks/{webhook}/deliveries/{delivery}", a, 200, Delivery, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/webhooks/{webhook}/deliveries/{delivery}/replay", a, 201, Delivery, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/runs/{run}/resolve", m, 200, FailedRun, none),
        c(get.clone(), "/api/v1/orgs/{org}/projects/{project}/cycle-asks", v, 200, Nothing, none),
        c(post.clone(), "/api/v1/orgs/{org}/projects/{project}/cycle-asks/{item}/reset", m, 200, Item, none),
    ]
}

/// Routes the router serves outside the OpenAPI document (the console's pages and the GitHub
/// webhook are tested apart).
const UNDOCUMENTED: [&str; 1] = ["/metrics"];

/// A valid one-node workflow named `name`.
fn workflow(name: &str) -> String {
    format!("name: {name}\nnodes:\n  ask:\n    approval: {{ prompt: ok? }}\n")
}

fn expected(case: &Case, who: Who) -> StatusCode {
    if case.route.starts_with("/api/v1/host/") {
        let registers = case.route == "/api/v1/host/register";
        return match who {
            Who::NoToken | Who::Expired | Who::Revoked | Who::OtherKey | Who::AlgNone => StatusCode::UNAUTHORIZED,
            Who::HostToken if registers => case.ok,
            Who::HostCredential if !registers => case.ok,
            _ => StatusCode::FORBIDDEN,
        };
    }
    let Some(min) = case.min else { return case.ok };
    match who {
        Who::NoToken | Who::Expired | Who::Revoked | Who::OtherKey | Who::AlgNone => StatusCode::UNAUTHORIZED,
        Who::OtherOrg => StatusCode::NOT_FOUND,
        Who::HostToken | Who::HostCredential => StatusCode::FORBIDDEN,
        Who::Role(r) if r >= min => case.ok,
        Who::Role(_) => StatusCode::FORBIDDEN,
    }
}

async fn submit(app: &App, org: &Org) -> RunId {
    app.submit_approval(org).await
}

/// A registration token of the org's `web` project, made through the API.
async fn registration_token(app: &App, org: &Org) -> String {
    let made = app.json(Method::POST, "/api/v1/orgs/acme/projects/web/host-registrations", &org.owner, None, StatusCode::CREATED).await;
    made["token"].as_str().unwrap().to_owned()
}

/// A host registered through the host protocol; answers its credential.
async fn host_credential(app: &App, org: &Org) -> String {
    let made = app.register_host(org, &json!({ "name": "credentialed", "capabilities": ["linux"], "max_concurrent": 2 })).await;
    made["token"].as_str().unwrap().to_owned()
}

/// A host written directly (the list and deregistration need one without its credential).
async fn add_host(app: &App, org: &Org, name: &str) -> uuid::Uuid {
    insert_in_project(app, org, "INSERT INTO hosts (org_id, project_id, host_id, name, capabilities) VALUES ($1, $2, $3, $4, '{linux}')", name).await
}

/// Runs the insert `sql` of a row of the org's project (`$1`, `$2`) with a new id (`$3`) and
/// `fourth` (`$4`); answers the id.
async fn insert_in_project<'q, T>(app: &App, org: &Org, sql: &'q str, fourth: T) -> uuid::Uuid
where
    T: 'q + Send + sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    let id = uuid::Uuid::now_v7();
    sqlx::query(sql).bind(org.id).bind(org.project).bind(id).bind(fourth).execute(app.pool()).await.unwrap();
    id
}

/// Cancels through the store; a cancel racing the engine's first advance of the run may be
/// chosen as a deadlock victim (the engine locks wakes, then runs), and is tried again.
async fn cancel(app: &App, org: &Org, run: RunId) {
    for _ in 0..5 {
        let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
        match runs::cancel(&mut ch, org.id, run, "cancelled").await {
            Ok(_) => return ch.commit().await.unwrap(),
            Err(e) => eprintln!("cancel {run}: {e}; again"),
        }
    }
    panic!("cannot cancel {run}");
}

#[tokio::test]
async fn every_route_answers_each_caller_exactly() {
    let app = App::with_engine().await;
    let org = app.org("acme").await;
    // Every waiting run this table makes holds one of the org's slots: room for all of them.
    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
    engine::store::admission::set_running_cap(&mut ch, org.id, 10_000).await.unwrap();
    ch.commit().await.unwrap();
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
        (Who::HostToken, Some(registration_token(&app, &org).await)),
        (Who::HostCredential, Some(host_credential(&app, &org).await)),
    ];
    let users = [(Role::Owner, org.owner_user), (Role::Member, org.member_user)];
    app.github.grant("acme-admin", 77, "acme");
    app.github.add_token("ghu_authz", shopfloor_tests::github_fake::oauth::Account { login: "acme-admin".into(), id: 1, emails: Vec::new() });
    let shared_step = {
        let run = submit(&app, &org).await;
        app.until(run, "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'ask' AND state = 'waiting')", "ask waiting").await;
        let step: engine::ids::StepId =
            sqlx::query_scalar("SELECT step_id FROM steps WHERE run_id = $1 AND node = 'ask'").bind(run).fetch_one(app.pool()).await.unwrap();
        // Ended, so it holds no place under the org's cap on running runs.
        cancel(&app, &org, run).await;
        step.to_string()
    };

    // The table covers every documented operation, and nothing else.
    let doc = api::http::openapi();
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in ["get", "post", "put", "patch", "delete"] {
            if item.get(method).is_some() {
                documented.insert(format!("{} {path}", method.to_uppercase()));
            }
        }
    }
    let table = cases();
    let covered: BTreeSet<String> = table.iter().filter(|c| !UNDOCUMENTED.contains(&c.route)).map(|c| format!("{} {}", c.method, c.route)).collect();
    assert_eq!(covered, documented, "the table and the OpenAPI document list different routes");

    let mut n = 0u32;
    let mut failures = Vec::new();
    for case in &table {
        for (who, token) in &callers {
            n += 1;
            // A PUT uploads a new workflow, named as its body names it.
            let name = if case.method == Method::PUT { format!("put{n}") } else { "approve".to_owned() };
            let mut path = case
                .route
                .replace("{org}", "acme")
                .replace("{project}", "web")
                .replace("{name}", &name)
                .replace("{version}", "1")
                .replace("{node}", "ask")
                .replace("{period}", "day");
            match case.needs {
                Needs::Nothing => {}
                Needs::SharedStep => path = path.replace("{step}", &shared_step),
                Needs::Budgets => {
                    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
                    engine::store::budgets::set(&mut ch, org.id, None, engine::store::budgets::Period::Day, 1000.0, true).await.unwrap();
                    engine::store::budgets::set(&mut ch, org.id, Some(org.project), engine::store::budgets::Period::Day, 1000.0, true).await.unwrap();
                    ch.commit().await.unwrap();
                }
                Needs::FailedRun => {
                    let run = submit(&app, &org).await;
                    for _ in 0..5 {
                        let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
                        ch.lock_run(org.id, run).await.unwrap().unwrap();
                        match runs::finish::<engine::state::run::Failed>(&mut ch, run, Some("exit_code:1")).await {
                            Ok(_) => {
                                ch.commit().await.unwrap();
                                break;
                            }
                            Err(e) => eprintln!("fail {run}: {e}; again"),
                        }
                    }
                    path = path.replace("{run}", &run.to_string());
                }
                Needs::Item => {
                    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
                    let key = format!(r#"["github","acme/web",{n}]"#);
                    let item = engine::store::triggers::ensure_item(&mut ch, org.id, org.project, &key).await.unwrap();
                    ch.commit().await.unwrap();
                    path = path.replace("{item}", &item.to_string());
                }
                Needs::Webhook | Needs::Delivery => {
                    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
                    let webhook = engine::testkit::subscribe(&mut ch, org.id, org.project, "https://hooks.example.com/hook", &["x.never"]).await;
                    ch.commit().await.unwrap();
                    path = path.replace("{webhook}", &webhook.to_string());
                    if matches!(case.needs, Needs::Delivery) {
                        // A delivered one, so that only a replay sends it again.
                        let sql = "INSERT INTO webhook_deliveries (org_id, project_id, delivery_id, subscription_id, event, body, state, attempts) \
                                   VALUES ($1, $2, $3, $4, 'x.never', '{}', 'delivered', 1)";
                        let delivery = insert_in_project(&app, &org, sql, webhook).await;
                        path = path.replace("{delivery}", &delivery.to_string());
                    }
                }
                Needs::Installation => {
                    use engine::store::installations::{self, Announced};
                    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
                    let inst = installations::announce(&mut ch, &Announced { id: 77, account: "acme".into(), ..Announced::default() }).await.unwrap();
                    installations::set_repositories(&mut ch, &inst, &[format!("acme/repo{n}")], &[]).await.unwrap();
                    installations::claim(&mut ch, org.id, 77).await.unwrap();
                    ch.commit().await.unwrap();
                    path = path.replace("{installation}", "77");
                }
                Needs::Host => {
                    let host = add_host(&app, &org, &format!("box-{n}")).await;
                    path = path.replace("{host}", &host.to_string());
                }
                Needs::Step => {
                    let run = submit(&app, &org).await;
                    app.until(run, "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'ask' AND state = 'waiting')", "ask waiting").await;
                    let step: engine::ids::StepId =
                        sqlx::query_scalar("SELECT step_id FROM steps WHERE run_id = $1 AND node = 'ask'").bind(run).fetch_one(app.pool()).await.unwrap();
                    path = path.replace("{run}", &run.to_string()).replace("{step}", &step.to_string());
                }
                Needs::WaitingRun | Needs::EndedRun => {
                    let run = submit(&app, &org).await;
                    if matches!(case.needs, Needs::EndedRun) {
                        cancel(&app, &org, run).await;
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
            // A registration token registers one host: each registration gets a fresh one.
            let fresh = match (case.route, who) {
                ("/api/v1/host/register", Who::HostToken) => Some(registration_token(&app, &org).await),
                _ => None,
            };
            let token = fresh.as_ref().or(token.as_ref());
            let (status, headers, body) = app.send(case.method.clone(), &path, token.map(String::as_str), (case.body)(n).as_ref()).await;
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

#[tokio::test]
async fn rotated_keys_keep_old_tokens_valid() {
    let app = App::start().await;
    let org = app.org("acme").await;
    let old_kid = jsonwebtoken::decode_header(&org.owner).unwrap().kid.unwrap();
    let mut ch = engine::store::Change::begin(app.pool(), engine::store::Actor::System).await.unwrap();
    engine::store::signing_keys::rotate(&mut ch, &engine::testkit::secret_key()).await.unwrap();
    ch.commit().await.unwrap();
    let (_, fresh) = app.token_for(&org, org.owner_user, "owner", chrono::Duration::days(1)).await;
    let new_kid = jsonwebtoken::decode_header(&fresh).unwrap().kid.unwrap();
    assert_ne!(old_kid, new_kid, "a new key signs new tokens");
    for token in [&org.owner, &fresh] {
        app.json(Method::GET, "/api/v1/orgs/acme/members", token, None, StatusCode::OK).await;
    }
    app.finish().await;
}

#[tokio::test]
async fn a_demotion_or_a_removal_applies_to_live_tokens_at_once() {
    let app = App::start().await;
    let org = app.org("acme").await;
    let member = org.member_user;
    let path = format!("/api/v1/orgs/acme/members/{member}");
    let runs = "/api/v1/orgs/acme/projects/web/runs";
    // A member may not mint a token above their role.
    app.json(Method::POST, "/api/v1/orgs/acme/tokens", &org.member, Some(&json!({ "name": "x", "role": "admin" })), StatusCode::FORBIDDEN).await;
    // An admin may not grant the owner role; the last owner cannot leave.
    app.json(Method::PATCH, &path, &org.admin, Some(&json!({ "role": "owner" })), StatusCode::FORBIDDEN).await;
    app.json(Method::DELETE, &format!("/api/v1/orgs/acme/members/{}", org.owner_user), &org.owner, None, StatusCode::CONFLICT).await;
    // Nor revoke an owner's token (an owner may revoke an admin's).
    let (owners, owner_token) = app.token_for(&org, org.owner_user, "owner", chrono::Duration::days(1)).await;
    app.json(Method::DELETE, &format!("/api/v1/orgs/acme/tokens/{owners}"), &org.admin, None, StatusCode::FORBIDDEN).await;
    app.json(Method::GET, runs, &owner_token, None, StatusCode::OK).await;
    let (admins, admin_token) = app.token_for(&org, org.admin_user, "admin", chrono::Duration::days(1)).await;
    app.json(Method::DELETE, &format!("/api/v1/orgs/acme/tokens/{admins}"), &org.owner, None, StatusCode::NO_CONTENT).await;
    app.json(Method::GET, runs, &admin_token, None, StatusCode::UNAUTHORIZED).await;

    app.json(Method::PATCH, &path, &org.admin, Some(&json!({ "role": "viewer" })), StatusCode::OK).await;
    app.json(Method::POST, runs, &org.member, Some(&json!({ "workflow": "approve" })), StatusCode::FORBIDDEN).await;
    app.json(Method::GET, runs, &org.member, None, StatusCode::OK).await;

    app.json(Method::DELETE, &path, &org.admin, None, StatusCode::NO_CONTENT).await;
    app.json(Method::GET, runs, &org.member, None, StatusCode::UNAUTHORIZED).await;
    let revoked: i64 =
        sqlx::query_scalar("SELECT count(*) FROM api_tokens WHERE user_id = $1 AND revoked_at IS NULL").bind(member).fetch_one(app.pool()).await.unwrap();
    assert_eq!(revoked, 0, "a removed member's tokens are revoked");
    let members = app.json(Method::GET, "/api/v1/orgs/acme/members", &org.viewer, None, StatusCode::OK).await;
    assert_eq!(members["items"].as_array().unwrap().len(), 3);
    app.finish().await;
}

#[tokio::test]
async fn hosts_are_listed_registered_and_deregistered() {
    let app = App::start().await;
    let org = app.org("acme").await;
    let base = "/api/v1/orgs/acme/projects/web";
    let made = app.json(Method::POST, &format!("{base}/host-registrations"), &org.admin, Some(&json!({ "expires_in_hours": 2 })), StatusCode::CREATED).await;
    let token = made["token"].as_str().unwrap();
    let claims = crate::support::claims_of(token);
    assert_eq!((claims.kind.as_str(), claims.role.as_str()), ("registration", "host"));
    // A registration token reaches no person's route.
    app.json(Method::GET, &format!("{base}/runs"), token, None, StatusCode::FORBIDDEN).await;
    app.json(Method::POST, &format!("{base}/host-registrations"), &org.admin, Some(&json!({ "expires_in_hours": 1000 })), StatusCode::UNPROCESSABLE_ENTITY)
        .await;

    let a = add_host(&app, &org, "a").await;
    let b = add_host(&app, &org, "b").await;
    let listed = app.json(Method::GET, &format!("{base}/hosts"), &org.viewer, None, StatusCode::OK).await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 2);
    app.json(Method::DELETE, &format!("{base}/hosts/{a}"), &org.admin, None, StatusCode::NO_CONTENT).await;
    app.json(Method::DELETE, &format!("{base}/hosts/{a}"), &org.admin, None, StatusCode::NO_CONTENT).await;
    let listed = app.json(Method::GET, &format!("{base}/hosts"), &org.viewer, None, StatusCode::OK).await;
    let names: Vec<&str> = listed["items"].as_array().unwrap().iter().map(|h| h["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["b"]);
    let all = app.json(Method::GET, &format!("{base}/hosts?include_deregistered=true&limit=1"), &org.viewer, None, StatusCode::OK).await;
    assert_eq!(all["items"][0]["id"], a.to_string());
    assert!(all["next_cursor"].is_string());
    let _ = b;
    let audit = app.json(Method::GET, "/api/v1/orgs/acme/audit?action=host.deregister", &org.owner, None, StatusCode::OK).await;
    assert_eq!(audit["items"].as_array().unwrap().len(), 1, "deregistered once, audited once");
    app.finish().await;
}
