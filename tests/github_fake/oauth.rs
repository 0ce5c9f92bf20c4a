//! GitHub's OAuth web flow, on loopback, for the console's sign-in tests: the authorize page
//! (which approves at once, as a person who clicks "Authorize" would, and sends the browser back
//! with a code and the `state` it was given), the code exchange (checks the client's id and
//! secret, the code, and the `redirect_uri`; a code works once), `GET /user` and
//! `GET /user/emails` with the access token. It serves both GitHub's web host and its API host,
//! so the console's `SHOPFLOOR_GITHUB_OAUTH_URL` and `SHOPFLOOR_GITHUB_OAUTH_API_URL` can both
//! point at it. For the App's install flow it has the install page
//! (`/apps/{slug}/installations/new`, which installs at once, as a person who clicks "Install"
//! would, and sends the browser to the App's setup URL with `installation_id`, `setup_action`
//! and the `state` it was given) and `GET /user/installations`: the installations of the App
//! that the token's person can access, in GitHub's shape.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

pub const CLIENT_ID: &str = "Iv1.fakeclient";
pub const CLIENT_SECRET: &str = "fake-client-secret";

/// A GitHub account the fake signs in as.
#[derive(Debug, Clone)]
pub struct Account {
    pub login: String,
    pub id: i64,
    /// `(address, verified)`.
    pub emails: Vec<(String, bool)>,
}

#[derive(Default)]
struct Data {
    /// Who "clicks Authorize" next.
    next: Option<Account>,
    /// code → (account, redirect_uri)
    codes: HashMap<String, (Account, String)>,
    /// access token → account
    tokens: HashMap<String, Account>,
    counter: u64,
    /// Requests seen, as `METHOD path`.
    seen: Vec<String>,
    /// login → the installations (id, account) that person can access.
    grants: HashMap<String, Vec<(i64, String)>>,
    /// What the install page installs next: (installation id, the App's setup URL).
    install: Option<(i64, String)>,
}

/// The fake, served on 127.0.0.1; stops when dropped.
pub struct FakeOauth {
    pub url: String,
    data: Arc<Mutex<Data>>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl FakeOauth {
    pub async fn start() -> FakeOauth {
        let data = Arc::new(Mutex::new(Data::default()));
        // The API host's routes want a User-Agent, as GitHub's do; the web host's are a
        // browser's.
        let api = Router::new()
            .route("/user", get(user))
            .route("/user/emails", get(emails))
            .route("/user/installations", get(user_installations))
            .layer(axum::middleware::from_fn(super::require_user_agent));
        let app = Router::new()
            .route("/login/oauth/authorize", get(authorize))
            .route("/login/oauth/access_token", post(access_token))
            .route("/apps/{slug}/installations/new", get(install_page))
            .merge(api)
            .with_state(data.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let url = format!("http://{}", listener.local_addr().expect("local addr"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        FakeOauth { url, data, stop }
    }

    /// The account the next authorization signs in as.
    pub fn sign_in_as(&self, account: Account) {
        self.data.lock().expect("fake oauth lock").next = Some(account);
    }

    /// Lets `login` access `installation` (of `account`), as a member of that GitHub account
    /// would.
    pub fn grant(&self, login: &str, installation: i64, account: &str) {
        self.data.lock().expect("fake oauth lock").grants.entry(login.to_owned()).or_default().push((installation, account.to_owned()));
    }

    /// The next visit to the install page installs `installation` and goes back to `setup_url`.
    pub fn will_install(&self, installation: i64, setup_url: &str) {
        self.data.lock().expect("fake oauth lock").install = Some((installation, setup_url.to_owned()));
    }

    /// A user access token of `account`, as the web flow would have given it.
    pub fn token_for(&self, account: Account) -> String {
        let token = {
            let mut d = self.data.lock().expect("fake oauth lock");
            d.counter += 1;
            format!("ghu_fake{}", d.counter)
        };
        self.add_token(&token, account);
        token
    }

    /// Makes `token` a user access token of `account`.
    pub fn add_token(&self, token: &str, account: Account) {
        self.data.lock().expect("fake oauth lock").tokens.insert(token.to_owned(), account);
    }

    /// Requests seen, as `METHOD path`.
    pub fn seen(&self) -> Vec<String> {
        self.data.lock().expect("fake oauth lock").seen.clone()
    }

    pub fn stop(self) {
        let _ = self.stop.send(());
    }
}

fn problem(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "message": message, "documentation_url": "https://docs.github.com/rest" }))).into_response()
}

async fn authorize(State(data): State<Arc<Mutex<Data>>>, Query(q): Query<HashMap<String, String>>) -> Response {
    let mut d = data.lock().expect("fake oauth lock");
    d.seen.push("GET /login/oauth/authorize".into());
    if q.get("client_id").map(String::as_str) != Some(CLIENT_ID) {
        return (StatusCode::NOT_FOUND, "unknown client_id").into_response();
    }
    let Some(redirect) = q.get("redirect_uri").cloned() else { return (StatusCode::BAD_REQUEST, "no redirect_uri").into_response() };
    let state = q.get("state").cloned().unwrap_or_default();
    let Some(account) = d.next.clone() else {
        return Redirect::to(&format!("{redirect}?error=access_denied&state={state}")).into_response();
    };
    d.counter += 1;
    let code = format!("code{}", d.counter);
    d.codes.insert(code.clone(), (account, redirect.clone()));
    Redirect::to(&format!("{redirect}?code={code}&state={state}")).into_response()
}

async fn access_token(State(data): State<Arc<Mutex<Data>>>, headers: HeaderMap, Form(f): Form<HashMap<String, String>>) -> Response {
    let mut d = data.lock().expect("fake oauth lock");
    d.seen.push("POST /login/oauth/access_token".into());
    let json_wanted = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("json"));
    if !json_wanted {
        return (StatusCode::OK, "error=unsupported_accept").into_response();
    }
    if f.get("client_id").map(String::as_str) != Some(CLIENT_ID) || f.get("client_secret").map(String::as_str) != Some(CLIENT_SECRET) {
        return Json(json!({ "error": "incorrect_client_credentials" })).into_response();
    }
    let code = f.get("code").cloned().unwrap_or_default();
    // A code is good once.
    let Some((account, redirect)) = d.codes.remove(&code) else { return Json(json!({ "error": "bad_verification_code" })).into_response() };
    if f.get("redirect_uri").is_some_and(|r| *r != redirect) {
        return Json(json!({ "error": "redirect_uri_mismatch" })).into_response();
    }
    d.counter += 1;
    let token = format!("gho_fake{}", d.counter);
    d.tokens.insert(token.clone(), account);
    Json(json!({ "access_token": token, "token_type": "bearer", "scope": "read:user,user:email" })).into_response()
}

fn account(d: &Data, headers: &HeaderMap) -> Option<Account> {
    let auth = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = auth.strip_prefix("Bearer ").or_else(|| auth.strip_prefix("token "))?;
    d.tokens.get(token).cloned()
}

async fn user(State(data): State<Arc<Mutex<Data>>>, headers: HeaderMap) -> Response {
    let mut d = data.lock().expect("fake oauth lock");
    d.seen.push("GET /user".into());
    let Some(a) = account(&d, &headers) else { return problem(StatusCode::UNAUTHORIZED, "Requires authentication") };
    let primary: Value = a.emails.iter().find(|(_, v)| *v).map_or(Value::Null, |(e, _)| json!(e));
    Json(json!({ "login": a.login, "id": a.id, "type": "User", "site_admin": false, "name": a.login, "email": primary })).into_response()
}

async fn emails(State(data): State<Arc<Mutex<Data>>>, headers: HeaderMap) -> Response {
    let mut d = data.lock().expect("fake oauth lock");
    d.seen.push("GET /user/emails".into());
    let Some(a) = account(&d, &headers) else { return problem(StatusCode::UNAUTHORIZED, "Requires authentication") };
    let list: Vec<Value> =
        a.emails.iter().enumerate().map(|(i, (e, v))| json!({ "email": e, "verified": v, "primary": i == 0, "visibility": "private" })).collect();
    Json(Value::Array(list)).into_response()
}

async fn user_installations(State(data): State<Arc<Mutex<Data>>>, headers: HeaderMap, Query(q): Query<HashMap<String, String>>) -> Response {
    let mut d = data.lock().expect("fake oauth lock");
    d.seen.push("GET /user/installations".into());
    let Some(a) = account(&d, &headers) else { return problem(StatusCode::UNAUTHORIZED, "Bad credentials") };
    let all = d.grants.get(&a.login).cloned().unwrap_or_default();
    let per_page = q.get("per_page").and_then(|p| p.parse::<usize>().ok()).unwrap_or(30).clamp(1, 100);
    let page = q.get("page").and_then(|p| p.parse::<usize>().ok()).unwrap_or(1).max(1);
    let list: Vec<Value> = all
        .iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .map(|(id, account)| {
            json!({
                "id": id,
                "account": { "login": account, "id": id + 1000, "type": "Organization" },
                "access_tokens_url": format!("https://api.github.com/app/installations/{id}/access_tokens"),
                "repositories_url": "https://api.github.com/installation/repositories",
                "html_url": format!("https://github.com/organizations/{account}/settings/installations/{id}"),
                "app_id": 1, "app_slug": "shopfloor-test", "target_id": id + 1000, "target_type": "Organization",
                "permissions": { "issues": "write", "pull_requests": "write", "contents": "write", "metadata": "read" },
                "events": ["issues", "pull_request", "check_run"], "repository_selection": "selected",
                "created_at": "2024-05-01T10:00:00Z", "updated_at": "2024-05-01T10:00:00Z", "suspended_at": null,
            })
        })
        .collect();
    Json(json!({ "total_count": all.len(), "installations": list })).into_response()
}

async fn install_page(State(data): State<Arc<Mutex<Data>>>, Query(q): Query<HashMap<String, String>>) -> Response {
    let mut d = data.lock().expect("fake oauth lock");
    d.seen.push("GET /apps/installations/new".into());
    let Some((installation, setup)) = d.install.take() else { return (StatusCode::NOT_FOUND, "nothing to install").into_response() };
    let state = q.get("state").map(|s| format!("&state={s}")).unwrap_or_default();
    Redirect::to(&format!("{setup}?installation_id={installation}&setup_action=install{state}")).into_response()
}
