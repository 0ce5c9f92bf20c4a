//! Connect GitHub: an installation of the App belongs to the org whose person GitHub says can
//! access it, never to the first org that names its id. Over HTTP against the console and the
//! REST API, with GitHub's fakes (the OAuth web host and API, signed webhooks): GitHub's install
//! flow (a `state` bound to the session, the setup URL, OAuth, `/user/installations`) connects an
//! installation and then its repositories; every way around it is refused with a 4xx and
//! stores nothing.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use shopfloor_tests::github_fake::oauth::Account;
use shopfloor_tests::github_fake::payloads::{self, WebhookClient};
use shopfloor_tests::github_fake::server::FakeGithub;

use crate::support::{App, WEBHOOK_SECRET, page_csrf};

const INSTALLATION: i64 = 4242;

fn person(login: &str) -> Account {
    Account { login: login.into(), id: 7, emails: Vec::new() }
}

/// A REST call with a bearer token: the status and the JSON (or problem) body.
async fn rest(app: &App, method: Method, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
    let (status, headers, bytes) = app.send(method, path, Some(token), Some(&body)).await;
    let is_problem = headers.get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    let body = serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null);
    if status.is_client_error() {
        assert!(is_problem, "a {status} is problem+json: {body}");
    }
    (status, body)
}

/// A POST of `body` with a bearer token: the status and the JSON (or problem) body.
async fn post(app: &App, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
    rest(app, Method::POST, path, token, body).await
}

async fn count(app: &App, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(app.pool()).await.unwrap()
}

/// GitHub's `installation.created` for the Acme installation, signed.
async fn announce(hooks: &WebhookClient, delivery: &str) {
    let created = payloads::installation_event("created", INSTALLATION, "Acme", &["Acme/Widgets", "Acme/Gadgets"]);
    let (status, body) = hooks.send("installation", delivery, &created).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["outcome"], "installation_announced", "{body}");
}

fn query_param(url: &str, name: &str) -> Option<String> {
    let query = url.split_once('?')?.1;
    query.split('&').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')).map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread")]
async fn githubs_install_flow_connects_an_installation_and_then_its_repositories() {
    let app = App::start(false).await;
    let acme = app.org("acme").await;
    let oauth = &app.github;
    let hooks = WebhookClient::new(&app.base, WEBHOOK_SECRET);
    announce(&hooks, "d-created").await;
    assert_eq!(count(&app, "SELECT count(*) FROM github_installations WHERE installation_id = 4242 AND org_id IS NULL").await, 1, "announced, and no org's");

    oauth.grant("acme-owner", INSTALLATION, "Acme");
    oauth.will_install(INSTALLATION, &app.url("/github/setup"));
    oauth.sign_in_as(person("acme-owner"));
    let mut browser = app.signed_in(&acme.owner_token).await;
    let page = browser.get("/orgs/acme/github").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("No installation is connected to acme yet"), "{}", page.body);

    // The button sends the browser to the App's install page with a fresh state.
    let to_github = browser.press("/orgs/acme/github/connect", &page_csrf(&page.body)).await;
    assert!(to_github.status.is_redirection(), "{}", to_github.body);
    let install = to_github.location();
    assert!(install.starts_with(&format!("{}/apps/shopfloor-test/installations/new?state=", oauth.url)), "{install}");
    let state = query_param(&install, "state").unwrap();
    // GitHub installs and comes back to the setup URL with the installation and the state.
    let setup = browser.get(&install).await;
    let back = setup.location();
    assert!(back.starts_with(&app.url("/github/setup?installation_id=4242&setup_action=install")), "{back}");
    assert_eq!(query_param(&back, "state").as_deref(), Some(state.as_str()));
    // The setup URL asks GitHub who the person is before anything is claimed.
    let authorize = browser.get(&back).await;
    assert!(authorize.location().starts_with(&format!("{}/login/oauth/authorize?", oauth.url)), "{}", authorize.location());
    assert_eq!(count(&app, "SELECT count(*) FROM github_installations WHERE org_id IS NOT NULL").await, 0, "nothing claimed before GitHub's proof");
    let landed = browser.follow(authorize).await;
    assert_eq!(landed.status, StatusCode::OK, "{}", landed.body);
    assert!(landed.body.contains("Installation 4242 is connected to acme"), "{}", landed.body);
    // (minijinja escapes `/` in HTML text.)
    assert!(landed.body.replace("&#x2f;", "/").contains("acme/gadgets, acme/widgets"), "{}", landed.body);
    assert!(oauth.seen().iter().any(|r| r == "GET /user/installations"), "{:?}", oauth.seen());
    let owner: Option<uuid::Uuid> =
        sqlx::query_scalar("SELECT org_id FROM github_installations WHERE installation_id = 4242").fetch_one(app.pool()).await.unwrap();
    assert_eq!(owner, Some(acme.id.0));
    assert_eq!(count(&app, "SELECT count(*) FROM audit_log WHERE action = 'installation.claim'").await, 1);

    // A repository of the installation connects; one outside it is refused and not stored.
    let repos = "/api/v1/orgs/acme/projects/web/repositories";
    let (status, body) = post(&app, repos, &acme.owner_token, json!({ "installation_id": INSTALLATION, "repository": "Acme/Widgets" })).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = post(&app, repos, &acme.owner_token, json!({ "installation_id": INSTALLATION, "repository": "Acme/Secret" })).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("not in installation 4242"), "{body}");
    assert_eq!(count(&app, "SELECT count(*) FROM repositories").await, 1);

    // GitHub takes the repository out of the installation: it is detached from the project.
    let removed = payloads::installation_repositories_event("removed", INSTALLATION, "Acme", &[], &["Acme/Widgets"]);
    assert_eq!(hooks.send("installation_repositories", "d-removed", &removed).await.0, 202);
    assert_eq!(count(&app, "SELECT count(*) FROM repositories WHERE full_name = 'acme/widgets' AND installation_id IS NULL").await, 1);
    let (_, listed) = rest(&app, Method::GET, "/api/v1/orgs/acme/github/installations", &acme.viewer_token, Value::Null).await;
    assert_eq!(listed["items"][0]["repositories"], json!(["acme/gadgets"]), "{listed}");
    app.discard().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_state_that_is_not_this_browsers_claims_nothing() {
    let app = App::start(false).await;
    let acme = app.org("acme").await;
    let oauth = &app.github;
    announce(&WebhookClient::new(&app.base, WEBHOOK_SECRET), "d-created").await;
    oauth.grant("acme-owner", INSTALLATION, "Acme");
    oauth.sign_in_as(person("acme-owner"));
    let mut browser = app.signed_in(&acme.owner_token).await;

    // A setup link that this browser never started (someone else's, or forged).
    let forged = browser.get("/github/setup?installation_id=4242&setup_action=install&state=forgedforgedforgedforged").await;
    assert_eq!(forged.status, StatusCode::BAD_REQUEST, "{}", forged.body);
    // Started here, but GitHub (or someone) comes back with another state.
    let page = browser.get("/orgs/acme/github").await;
    browser.press("/orgs/acme/github/connect", &page_csrf(&page.body)).await;
    let other = browser.get("/github/setup?installation_id=4242&setup_action=install&state=anotherstateanotherstate").await;
    assert_eq!(other.status, StatusCode::BAD_REQUEST, "{}", other.body);
    let callback = browser.get("/github/setup/callback?code=code1&state=anotherstateanotherstate").await;
    assert_eq!(callback.status, StatusCode::BAD_REQUEST, "{}", callback.body);
    assert_eq!(count(&app, "SELECT count(*) FROM github_installations WHERE org_id IS NOT NULL").await, 0);
    app.discard().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_org_takes_an_installation_or_a_repository_it_cannot_prove() {
    let app = App::start(false).await;
    let acme = app.org("acme").await;
    let evil = app.org("evil").await;
    let oauth = &app.github;
    let claims = |org: &str| format!("/api/v1/orgs/{org}/github/installations");
    let claim = |token: &str| json!({ "installation_id": INSTALLATION, "github_token": token });
    let nothing_claimed = "SELECT count(*) FROM github_installations WHERE org_id IS NOT NULL";
    let evil_repos = "/api/v1/orgs/evil/projects/web/repositories";

    // A bare id, never announced by GitHub: nothing to connect through.
    let bare = json!({ "installation_id": INSTALLATION, "repository": "acme/widgets" });
    let (status, body) = post(&app, evil_repos, &evil.owner_token, bare.clone()).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // An installation GitHub never announced, though the person can see it on GitHub.
    oauth.grant("evil-owner", 999, "Evil");
    let evil_token = oauth.token_for(person("evil-owner"));
    let (status, body) = post(&app, &claims("evil"), &evil.owner_token, json!({ "installation_id": 999, "github_token": evil_token })).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("never announced"), "{body}");
    assert_eq!(count(&app, "SELECT count(*) FROM github_installations").await, 0);

    announce(&WebhookClient::new(&app.base, WEBHOOK_SECRET), "d-created").await;
    // A person GitHub does not let see the installation.
    let (status, body) = post(&app, &claims("evil"), &evil.owner_token, claim(&evil_token)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    // A token GitHub does not know.
    let (status, body) = post(&app, &claims("evil"), &evil.owner_token, claim("ghu_not_a_token")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    // No proof at all.
    let (status, body) = post(&app, &claims("evil"), &evil.owner_token, json!({ "installation_id": INSTALLATION })).await;
    assert!(status.is_client_error(), "{status} {body}");
    assert_eq!(count(&app, nothing_claimed).await, 0);
    // Still no repository through an unclaimed installation.
    let (status, _) = post(&app, evil_repos, &evil.owner_token, bare.clone()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Acme's owner proves access: acme has it.
    oauth.grant("acme-owner", INSTALLATION, "Acme");
    let acme_token = oauth.token_for(person("acme-owner"));
    let (status, body) = post(&app, &claims("acme"), &acme.owner_token, claim(&acme_token)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["account"], "Acme", "{body}");
    // A member is not an admin: the claim is an admin's.
    let member = post(&app, &claims("acme"), &acme.viewer_token, claim(&acme_token)).await;
    assert_eq!(member.0, StatusCode::FORBIDDEN);

    // Someone who can see the installation on GitHub, claiming it for a second org.
    oauth.grant("evil-owner", INSTALLATION, "Acme");
    let (status, body) = post(&app, &claims("evil"), &evil.owner_token, claim(&evil_token)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("another org"), "{body}");
    let owner: Option<uuid::Uuid> =
        sqlx::query_scalar("SELECT org_id FROM github_installations WHERE installation_id = 4242").fetch_one(app.pool()).await.unwrap();
    assert_eq!(owner, Some(acme.id.0), "the rightful org keeps it");
    // Nor may the second org connect a repository through it, or give it up.
    let refused = [(Method::POST, evil_repos.to_owned(), bare), (Method::DELETE, format!("{}/{INSTALLATION}", claims("evil")), Value::Null)];
    for (method, path, body) in refused {
        let (status, _) = rest(&app, method, &path, &evil.owner_token, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
    }
    let (_, listed) = rest(&app, Method::GET, &claims("evil"), &evil.owner_token, Value::Null).await;
    assert_eq!(listed["items"], json!([]), "{listed}");
    assert_eq!(count(&app, "SELECT count(*) FROM repositories").await, 0);

    // Acme gives it up; then the second org's person may claim it with their own proof.
    let (status, _) = rest(&app, Method::DELETE, &format!("{}/{INSTALLATION}", claims("acme")), &acme.owner_token, Value::Null).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = post(&app, &claims("evil"), &evil.owner_token, claim(&evil_token)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    app.discard().await;
}

/// The GitHub App as these tests' fake knows it (the key is made for the tests only).
fn github_app(fake: &FakeGithub) -> std::sync::Arc<engine::github::GithubApp> {
    let key = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("github_fake/test_app_key.pem")).unwrap();
    let settings = engine::github::AppSettings {
        app_id: 1,
        private_key: key.into(),
        api_url: fake.url.clone(),
        graphql_url: None,
        timeout: std::time::Duration::from_secs(10),
        backoff: std::time::Duration::from_millis(10),
    };
    std::sync::Arc::new(engine::github::GithubApp::new(settings).unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_apps_own_api_announces_an_installation_whose_webhook_never_came() {
    let fake = FakeGithub::start().await;
    fake.add_installation(5151, "Acme", &["Acme/Widgets"]);
    let app = App::start_with(false, Some(github_app(&fake))).await;
    let acme = app.org("acme").await;
    let oauth = &app.github;
    oauth.grant("acme-owner", 5151, "Acme");
    let token = oauth.token_for(person("acme-owner"));

    let (status, body) =
        post(&app, "/api/v1/orgs/acme/github/installations", &acme.owner_token, json!({ "installation_id": 5151, "github_token": token })).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["account"], "Acme", "{body}");
    assert_eq!(body["repositories"], json!(["acme/widgets"]), "{body}");
    assert_eq!(fake.requests_to("GET", "/app/installations/5151").len(), 1, "asked as the App");
    let listed = fake.requests_to("GET", "/installation/repositories");
    assert_eq!(listed.len(), 1);
    assert!(listed[0].authorization.as_deref().unwrap_or_default().starts_with("Bearer ghs_"), "with an installation token: {listed:?}");
    let mint = fake.requests_to("POST", "/app/installations/5151/access_tokens");
    assert_eq!(mint[0].body, json!({ "permissions": { "metadata": "read" } }), "the list needs metadata only");

    // A repository added on GitHub since (an installation on all repositories sends no webhook
    // for it) is found by asking the App again when a connect misses it.
    fake.add_installation(5151, "Acme", &["Acme/Widgets", "Acme/Newer"]);
    let repos = "/api/v1/orgs/acme/projects/web/repositories";
    let (status, body) = post(&app, repos, &acme.owner_token, json!({ "installation_id": 5151, "repository": "acme/newer" })).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, _) = post(&app, repos, &acme.owner_token, json!({ "installation_id": 5151, "repository": "acme/absent" })).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    // An id GitHub does not know, though a person's token lists it (a stale grant).
    oauth.grant("acme-owner", 6161, "Acme");
    let (status, body) =
        post(&app, "/api/v1/orgs/acme/github/installations", &acme.owner_token, json!({ "installation_id": 6161, "github_token": token })).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(count(&app, "SELECT count(*) FROM github_installations WHERE installation_id = 6161").await, 0);
    app.discard().await;
}
