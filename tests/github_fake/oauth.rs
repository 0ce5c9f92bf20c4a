//! GitHub's OAuth web flow, on loopback, for the console's sign-in tests: the authorize page
//! (which approves at once, as a person who clicks "Authorize" would, and sends the browser back
//! with a code and the `state` it was given), the code exchange (checks the client's id and
//! secret, the code, and the `redirect_uri`; a code works once), `GET /user` and
//! `GET /user/emails` with the access token. It serves both GitHub's web host and its API host,
//! so the console's `SHOPFLOOR_GITHUB_OAUTH_URL` and `SHOPFLOOR_GITHUB_OAUTH_API_URL` can both
//! point at it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Form, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

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
        let app = Router::new()
            .route("/login/oauth/authorize", get(authorize))
            .route("/login/oauth/access_token", post(access_token))
            .route("/user", get(user))
            .route("/user/emails", get(emails))
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
