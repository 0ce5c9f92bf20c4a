//! An axum fake of the GitHub REST and GraphQL APIs on `127.0.0.1:0`.
//!
//! It keeps issues, pull requests, comments, labels, check runs and statuses in memory, answers
//! with the shapes of GitHub's documented responses (the fields shopfloor reads, with GitHub's
//! names and types), records every request, and can be told to fail: a status (4xx, 5xx), a
//! secondary rate limit (403 with `Retry-After`), a primary one (`x-ratelimit-remaining: 0`),
//! or a delay long enough for the client to time out.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub authorization: Option<String>,
    pub body: Value,
}

/// A failure to inject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer this status with GitHub's error body (`{"message", "documentation_url"}`).
    Status(u16),
    /// 403 "You have exceeded a secondary rate limit", with `Retry-After: <secs>`.
    SecondaryRateLimit { retry_after: u64 },
    /// 403 with `x-ratelimit-remaining: 0` and `x-ratelimit-reset` this many seconds ahead.
    PrimaryRateLimit { reset_in: u64 },
    /// Answer normally, but only after this long (a client with a shorter timeout gives up).
    Delay(Duration),
    /// Do what was asked at once, but answer only after this long: the effect is made and
    /// the answer lost to a client with a shorter timeout.
    AnswerLate(Duration),
    /// The repository was renamed: GitHub redirects its old paths, 301 for a GET and 307 for
    /// any other method (which a client repeats with its body), to the path with `from`
    /// replaced by `to`.
    Moved { from: String, to: String },
}

/// Which requests a fault applies to: a method (any when None) and a path prefix.
#[derive(Debug, Clone)]
struct Injection {
    method: Option<Method>,
    path_prefix: String,
    fault: Fault,
    times: usize,
}

#[derive(Default)]
struct Data {
    requests: Vec<Recorded>,
    injections: Vec<Injection>,
    /// (repository, number) → issue or pull request (pull requests are issues too).
    issues: BTreeMap<(String, i64), Value>,
    pulls: BTreeMap<(String, i64), Value>,
    comments: BTreeMap<(String, i64), Vec<Value>>,
    labels: BTreeMap<String, Vec<Value>>,
    check_runs: BTreeMap<(String, String), Vec<Value>>,
    statuses: BTreeMap<(String, String), Vec<Value>>,
    graphql: VecDeque<Value>,
    /// installation id → (account, the repositories it reaches).
    installations: BTreeMap<i64, (String, Vec<String>)>,
    /// How long the installation tokens it mints live (GitHub's hour unless told otherwise).
    token_lifetime: Option<Duration>,
    minted: Vec<Minted>,
    next_id: i64,
}

/// An installation token the fake minted, with the `expires_at` it answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Minted {
    pub token: String,
    pub expires_at: chrono::DateTime<chrono::Utc>,
    pub body: Value,
}

impl Data {
    fn id(&mut self) -> i64 {
        self.next_id += 1;
        1_000_000 + self.next_id
    }
}

/// The fake. Dropping it stops the server.
pub struct FakeGithub {
    /// `http://127.0.0.1:<port>`: the API base URL (and `…/graphql`).
    pub url: String,
    data: Arc<Mutex<Data>>,
    task: JoinHandle<()>,
}

impl Drop for FakeGithub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const DOCS: &str = "https://docs.github.com/rest";

impl FakeGithub {
    /// Starts the fake on a free loopback port.
    pub async fn start() -> FakeGithub {
        let data = Arc::new(Mutex::new(Data::default()));
        let app = Router::new().fallback(handle).layer(axum::middleware::from_fn(super::require_user_agent)).with_state(data.clone());
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("bind the fake GitHub");
        let addr = listener.local_addr().expect("the fake's address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeGithub { url: format!("http://{addr}"), data, task }
    }

    fn lock(&self) -> MutexGuard<'_, Data> {
        self.data.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every request so far, oldest first.
    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    /// Requests with this method whose path starts with `prefix`.
    pub fn requests_to(&self, method: &str, prefix: &str) -> Vec<Recorded> {
        self.requests().into_iter().filter(|r| r.method == method && r.path.starts_with(prefix)).collect()
    }

    /// Fails the next `times` requests matching `method` (any when None) and `path_prefix`.
    pub fn inject(&self, method: Option<&str>, path_prefix: &str, fault: Fault, times: usize) {
        let method = method.and_then(|m| m.parse::<Method>().ok());
        self.lock().injections.push(Injection { method, path_prefix: path_prefix.to_owned(), fault, times });
    }

    /// Stores an issue (a payload-shaped `issue` object) so `GET …/issues/{n}` finds it.
    pub fn put_issue(&self, repository: &str, issue: Value) {
        let n = issue.get("number").and_then(Value::as_i64).unwrap_or_default();
        self.lock().issues.insert((repository.to_lowercase(), n), issue);
    }

    /// Stores a pull request (a payload-shaped `pull_request` object).
    pub fn put_pull(&self, repository: &str, pr: Value) {
        let n = pr.get("number").and_then(Value::as_i64).unwrap_or_default();
        self.lock().pulls.insert((repository.to_lowercase(), n), pr);
    }

    /// Comments of an issue or pull request.
    pub fn comments(&self, repository: &str, number: i64) -> Vec<Value> {
        self.lock().comments.get(&(repository.to_lowercase(), number)).cloned().unwrap_or_default()
    }

    /// Pull requests of a repository.
    pub fn pulls(&self, repository: &str) -> Vec<Value> {
        let repository = repository.to_lowercase();
        self.lock().pulls.iter().filter(|((r, _), _)| *r == repository).map(|(_, p)| p.clone()).collect()
    }

    /// Label names of an issue.
    pub fn issue_labels(&self, repository: &str, number: i64) -> Vec<String> {
        let data = self.lock();
        let issue = data.issues.get(&(repository.to_lowercase(), number));
        names(issue.and_then(|i| i.get("labels")))
    }

    /// An installation of the App on `account`, reaching `repositories` (`owner/name`): what
    /// `GET /app/installations/{id}` and `GET /installation/repositories` answer.
    pub fn add_installation(&self, id: i64, account: &str, repositories: &[&str]) {
        self.lock().installations.insert(id, (account.to_owned(), repositories.iter().map(|r| (*r).to_owned()).collect()));
    }

    /// Installation tokens minted from now on live `lifetime` (their `expires_at`) instead of
    /// GitHub's hour: a token shorter-lived than the client's margin is never reused.
    pub fn set_token_lifetime(&self, lifetime: Duration) {
        self.lock().token_lifetime = Some(lifetime);
    }

    /// Every installation token minted so far, oldest first.
    pub fn minted(&self) -> Vec<Minted> {
        self.lock().minted.clone()
    }

    /// Queues the `data` of the next GraphQL answer (answered `{"data": {}}` when none waits).
    pub fn graphql_reply(&self, data: Value) {
        self.lock().graphql.push_back(json!({ "data": data }));
    }

    /// The next GraphQL answer's whole body, as GitHub may send it with a 200: `errors` beside
    /// partial `data`, or alone.
    pub fn graphql_answer(&self, body: Value) {
        self.lock().graphql.push_back(body);
    }
}

fn names(labels: Option<&Value>) -> Vec<String> {
    labels.and_then(Value::as_array).map(|l| l.iter().filter_map(|x| x.get("name").and_then(Value::as_str)).map(str::to_owned).collect()).unwrap_or_default()
}

fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn error(status: u16, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(json!({ "message": message, "documentation_url": DOCS, "status": status.as_u16().to_string() }))).into_response()
}

fn ok(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

/// GitHub's rate-limit headers, on every answer.
fn with_headers(mut response: Response, remaining: u64) -> Response {
    let h = response.headers_mut();
    h.insert("x-ratelimit-limit", HeaderValue::from_static("5000"));
    h.insert("x-ratelimit-remaining", HeaderValue::from(remaining));
    h.insert("x-ratelimit-used", HeaderValue::from(5000 - remaining.min(5000)));
    h.insert("x-ratelimit-resource", HeaderValue::from_static("core"));
    h.insert("x-github-api-version-selected", HeaderValue::from_static("2022-11-28"));
    response
}

async fn handle(State(data): State<Arc<Mutex<Data>>>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let path = uri.path().to_owned();
    let body: Value = if body.is_empty() { Value::Null } else { serde_json::from_slice(&body).unwrap_or(Value::Null) };
    let fault = {
        let mut d = data.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        d.requests.push(Recorded {
            method: method.to_string(),
            path: path.clone(),
            query: uri.query().map(str::to_owned),
            authorization: headers.get("authorization").and_then(|v| v.to_str().ok()).map(str::to_owned),
            body: body.clone(),
        });
        let found = d.injections.iter_mut().find(|i| i.times > 0 && i.method.as_ref().is_none_or(|m| *m == method) && path.starts_with(&i.path_prefix));
        found.map(|i| {
            i.times -= 1;
            i.fault.clone()
        })
    };
    match fault {
        Some(Fault::Status(status)) => {
            let message = match status {
                404 => "Not Found",
                422 => "Validation Failed",
                401 => "Bad credentials",
                403 => "Resource not accessible by integration",
                502 => "Server Error",
                503 => "Service Unavailable",
                _ => "Server Error",
            };
            return with_headers(error(status, message), 4999);
        }
        Some(Fault::SecondaryRateLimit { retry_after }) => {
            let mut r = error(403, "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.");
            r.headers_mut().insert("retry-after", HeaderValue::from(retry_after));
            return with_headers(r, 4999);
        }
        Some(Fault::PrimaryRateLimit { reset_in }) => {
            let mut r = with_headers(error(403, "API rate limit exceeded for installation."), 0);
            let reset = chrono::Utc::now().timestamp() + i64::try_from(reset_in).unwrap_or(60);
            r.headers_mut().insert("x-ratelimit-reset", HeaderValue::from(reset));
            return r;
        }
        Some(Fault::Moved { from, to }) => {
            let location = path.replacen(&from, &to, 1);
            let (status, message) = if method == Method::GET { (301, "Moved Permanently") } else { (307, "Temporary Redirect") };
            let mut r = with_headers(error(status, message), 4999);
            r.headers_mut().insert("location", HeaderValue::from_str(&location).unwrap_or(HeaderValue::from_static("/")));
            return r;
        }
        Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
        Some(Fault::AnswerLate(_)) | None => {}
    }
    let answer = answer(&data, &method, &uri, &headers, body);
    if let Some(Fault::AnswerLate(d)) = fault {
        tokio::time::sleep(d).await;
    }
    answer
}

fn answer(data: &Mutex<Data>, method: &Method, uri: &Uri, headers: &HeaderMap, body: Value) -> Response {
    let path = uri.path();
    let mut d = data.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // Installation tokens are `ghs_fake<n>_<installation>`: the installation a token acts for.
    let acting_for = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|a| a.strip_prefix("Bearer ").or_else(|| a.strip_prefix("token ")))
        .and_then(|t| t.strip_prefix("ghs_fake"))
        .and_then(|t| t.rsplit('_').next())
        .and_then(|id| id.parse::<i64>().ok());
    if path == "/installation/repositories" {
        return with_headers(installation_repositories(&d, acting_for, uri.query().unwrap_or_default()), 4999);
    }
    with_headers(route(&mut d, method, path, uri.query().unwrap_or_default(), body), 4999)
}

/// An installation object as `GET /app/installations/{id}` answers it.
fn installation(id: i64, account: &str) -> Value {
    json!({
        "id": id,
        "account": { "login": account, "id": id + 1000, "node_id": format!("O_{id}"), "type": "Organization", "site_admin": false },
        "access_tokens_url": format!("https://api.github.com/app/installations/{id}/access_tokens"),
        "repositories_url": "https://api.github.com/installation/repositories",
        "html_url": format!("https://github.com/organizations/{account}/settings/installations/{id}"),
        "app_id": 1, "app_slug": "shopfloor-test", "target_id": id + 1000, "target_type": "Organization",
        "permissions": { "issues": "write", "pull_requests": "write", "contents": "write", "checks": "read", "metadata": "read" },
        "events": ["issues", "pull_request", "check_run"], "repository_selection": "selected",
        "single_file_name": null, "has_multiple_single_files": false, "single_file_paths": [],
        "created_at": "2024-05-01T10:00:00Z", "updated_at": "2024-05-01T10:00:00Z", "suspended_at": null, "suspended_by": null,
    })
}

/// `GET /installation/repositories` with an installation token: its repositories, paged.
fn installation_repositories(d: &Data, installation: Option<i64>, query: &str) -> Response {
    let Some((_, repositories)) = installation.and_then(|i| d.installations.get(&i)) else { return error(401, "Bad credentials") };
    let param = |name: &str| query.split('&').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse::<usize>().ok());
    let per_page = param("per_page").unwrap_or(30).clamp(1, 100);
    let page = param("page").unwrap_or(1).max(1);
    let list: Vec<Value> = repositories
        .iter()
        .enumerate()
        .skip((page - 1) * per_page)
        .take(per_page)
        .map(|(i, full)| {
            let (owner, name) = full.split_once('/').unwrap_or((full, full));
            json!({
                "id": 5000 + i, "node_id": format!("R_{i}"), "name": name, "full_name": full, "private": true,
                "owner": { "login": owner, "type": "Organization" }, "default_branch": "main",
                "html_url": format!("https://github.com/{full}"),
            })
        })
        .collect();
    ok(StatusCode::OK, json!({ "total_count": repositories.len(), "repository_selection": "selected", "repositories": list }))
}

/// The endpoints, by method and path segments.
fn route(d: &mut Data, method: &Method, path: &str, query: &str, body: Value) -> Response {
    let seg: Vec<&str> = path.trim_matches('/').split('/').collect();
    let repo = |s: &[&str]| format!("{}/{}", s[1], s[2]).to_lowercase();
    let num = |s: &str| s.parse::<i64>().unwrap_or(-1);
    match (method.as_str(), seg.as_slice()) {
        ("POST", ["graphql"]) => {
            let body = d.graphql.pop_front().unwrap_or_else(|| json!({ "data": {} }));
            ok(StatusCode::OK, body)
        }
        ("POST", ["app", "installations", id, "access_tokens"]) => {
            let n = d.id();
            let lifetime = d.token_lifetime.and_then(|l| chrono::Duration::from_std(l).ok()).unwrap_or_else(|| chrono::Duration::hours(1));
            let expires = (chrono::Utc::now() + lifetime).format("%Y-%m-%dT%H:%M:%SZ").to_string();
            let value = format!("ghs_fake{n}_{id}");
            if let Ok(at) = expires.parse() {
                d.minted.push(Minted { token: value.clone(), expires_at: at, body: body.clone() });
            }
            let mut token = json!({
                "token": value,
                "expires_at": expires,
                "permissions": body.get("permissions").cloned().unwrap_or_else(|| json!({ "issues": "write", "pull_requests": "write", "contents": "write", "checks": "read" })),
                "repository_selection": "selected",
            });
            if let Some(repos) = body.get("repositories") {
                token["repositories"] = json!(repos.as_array().map(|r| r.iter().map(|n| json!({ "name": n, "full_name": n })).collect::<Vec<_>>()));
            }
            ok(StatusCode::CREATED, token)
        }
        ("GET", ["app", "installations", id]) => match d.installations.get(&num(id)) {
            Some((account, _)) => ok(StatusCode::OK, installation(num(id), account)),
            None => error(404, "Not Found"),
        },
        ("GET", ["app"]) => ok(StatusCode::OK, json!({ "id": 1, "slug": "shopfloor-test", "name": "shopfloor test", "owner": { "login": "shopfloor" } })),
        ("GET", ["repos", _, _, "installation"]) => {
            ok(StatusCode::OK, json!({ "id": 77, "account": { "login": seg[1] }, "app_id": 1, "target_type": "Organization" }))
        }
        ("GET", ["repos", _, _, "issues", n]) => match d.issues.get(&(repo(&seg), num(n))).or_else(|| d.pulls.get(&(repo(&seg), num(n)))) {
            Some(issue) => ok(StatusCode::OK, issue.clone()),
            None => error(404, "Not Found"),
        },
        ("PATCH", ["repos", _, _, "issues", n]) => {
            let key = (repo(&seg), num(n));
            let Some(issue) = d.issues.get_mut(&key) else { return error(404, "Not Found") };
            for field in ["title", "body", "state", "state_reason"] {
                if let Some(v) = body.get(field) {
                    issue[field] = v.clone();
                }
            }
            if let Some(labels) = body.get("labels").and_then(Value::as_array) {
                issue["labels"] = json!(labels.iter().filter_map(Value::as_str).map(label).collect::<Vec<_>>());
            }
            issue["updated_at"] = json!(now());
            ok(StatusCode::OK, issue.clone())
        }
        ("GET", ["repos", _, _, "issues", n, "comments"]) => ok(StatusCode::OK, json!(d.comments.get(&(repo(&seg), num(n))).cloned().unwrap_or_default())),
        ("POST", ["repos", _, _, "issues", n, "comments"]) => {
            let Some(text) = body.get("body").and_then(Value::as_str) else { return error(422, "Validation Failed") };
            let id = d.id();
            let comment = json!({
                "id": id, "node_id": format!("IC_{id}"), "body": text,
                "user": { "login": "shopfloor-test[bot]", "id": 9, "type": "Bot" },
                "author_association": "NONE",
                "html_url": format!("https://github.com/{}/issues/{n}#issuecomment-{id}", repo(&seg)),
                "created_at": now(), "updated_at": now(),
            });
            d.comments.entry((repo(&seg), num(n))).or_default().push(comment.clone());
            ok(StatusCode::CREATED, comment)
        }
        ("POST", ["repos", _, _, "issues", n, "labels"]) => {
            let key = (repo(&seg), num(n));
            let new: Vec<String> = match &body {
                Value::Array(l) => l.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
                other => {
                    other.get("labels").and_then(Value::as_array).map(|l| l.iter().filter_map(Value::as_str).map(str::to_owned).collect()).unwrap_or_default()
                }
            };
            let Some(issue) = d.issues.get_mut(&key) else { return error(404, "Not Found") };
            let mut all = names(issue.get("labels"));
            for l in new {
                if !all.contains(&l) {
                    all.push(l);
                }
            }
            issue["labels"] = json!(all.iter().map(|l| label(l)).collect::<Vec<_>>());
            ok(StatusCode::OK, issue["labels"].clone())
        }
        ("DELETE", ["repos", _, _, "issues", n, "labels", name]) => {
            let key = (repo(&seg), num(n));
            let Some(issue) = d.issues.get_mut(&key) else { return error(404, "Not Found") };
            let name = name.replace("%20", " ");
            let mut all = names(issue.get("labels"));
            if !all.contains(&name) {
                return error(404, "Label does not exist");
            }
            all.retain(|l| *l != name);
            issue["labels"] = json!(all.iter().map(|l| label(l)).collect::<Vec<_>>());
            ok(StatusCode::OK, issue["labels"].clone())
        }
        ("GET", ["repos", _, _, "labels"]) => ok(StatusCode::OK, json!(d.labels.get(&repo(&seg)).cloned().unwrap_or_default())),
        ("POST", ["repos", _, _, "labels"]) => {
            let Some(name) = body.get("name").and_then(Value::as_str) else { return error(422, "Validation Failed") };
            let list = d.labels.entry(repo(&seg)).or_default();
            if list.iter().any(|l| l["name"] == name) {
                return ok(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    json!({ "message": "Validation Failed", "errors": [{ "resource": "Label", "code": "already_exists", "field": "name" }], "documentation_url": DOCS }),
                );
            }
            list.push(label(name));
            ok(StatusCode::CREATED, label(name))
        }
        ("GET", ["repos", _, _, "pulls"]) => {
            let params: BTreeMap<&str, &str> = query.split('&').filter_map(|p| p.split_once('=')).collect();
            let state = params.get("state").copied().unwrap_or("open");
            let r = repo(&seg);
            let list: Vec<Value> = d
                .pulls
                .iter()
                .filter(|((pr_repo, _), _)| *pr_repo == r)
                .map(|(_, p)| p.clone())
                .filter(|p| state == "all" || p["state"] == state)
                .filter(|p| {
                    params.get("head").is_none_or(|h| {
                        let h = h.replace("%3A", ":");
                        let label = p.pointer("/head/label").and_then(Value::as_str).unwrap_or_default();
                        label == h || p.pointer("/head/ref").and_then(Value::as_str) == h.split(':').nth(1)
                    })
                })
                .collect();
            ok(StatusCode::OK, json!(list))
        }
        ("GET", ["repos", _, _, "pulls", n]) => match d.pulls.get(&(repo(&seg), num(n))) {
            Some(pr) => ok(StatusCode::OK, pr.clone()),
            None => error(404, "Not Found"),
        },
        ("POST", ["repos", _, _, "pulls"]) => {
            let r = repo(&seg);
            let (Some(head), Some(base)) = (body.get("head").and_then(Value::as_str), body.get("base").and_then(Value::as_str)) else {
                return error(422, "Validation Failed");
            };
            let owner = r.split('/').next().unwrap_or_default().to_owned();
            let head_label = if head.contains(':') { head.to_owned() } else { format!("{owner}:{head}") };
            if d.pulls
                .iter()
                .any(|((pr_repo, _), p)| *pr_repo == r && p["state"] == "open" && p.pointer("/head/label").and_then(Value::as_str) == Some(head_label.as_str()))
            {
                return ok(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    json!({ "message": "Validation Failed", "errors": [{ "resource": "PullRequest", "code": "custom", "message": format!("A pull request already exists for {head_label}.") }], "documentation_url": DOCS }),
                );
            }
            let number = 1 + d.issues.keys().chain(d.pulls.keys()).filter(|(x, _)| *x == r).map(|(_, n)| *n).max().unwrap_or(0);
            let id = d.id();
            let branch = head_label.split(':').nth(1).unwrap_or(head).to_owned();
            let pr = json!({
                "id": id, "node_id": format!("PR_{id}"), "number": number, "state": "open", "locked": false,
                "title": body.get("title"), "body": body.get("body"), "draft": body.get("draft").and_then(Value::as_bool).unwrap_or(false),
                "user": { "login": "shopfloor-test[bot]", "id": 9, "type": "Bot" }, "author_association": "NONE",
                "labels": [], "assignees": [], "requested_reviewers": [], "milestone": null,
                "head": { "label": head_label, "ref": branch, "sha": format!("{:040x}", id), "repo": { "full_name": r } },
                "base": { "label": format!("{owner}:{base}"), "ref": base, "repo": { "full_name": r } },
                "html_url": format!("https://github.com/{r}/pull/{number}"),
                "merged": false, "merged_at": null, "mergeable": null,
                "created_at": now(), "updated_at": now(), "closed_at": null,
            });
            d.pulls.insert((r, number), pr.clone());
            ok(StatusCode::CREATED, pr)
        }
        ("GET", ["repos", _, _, "commits", sha, "check-runs"]) => {
            let runs = d.check_runs.get(&(repo(&seg), (*sha).to_owned())).cloned().unwrap_or_default();
            ok(StatusCode::OK, json!({ "total_count": runs.len(), "check_runs": runs }))
        }
        ("POST", ["repos", _, _, "check-runs"]) => {
            let (Some(name), Some(sha)) = (body.get("name").and_then(Value::as_str), body.get("head_sha").and_then(Value::as_str)) else {
                return error(422, "Validation Failed");
            };
            let id = d.id();
            let run = json!({
                "id": id, "name": name, "head_sha": sha,
                "status": body.get("status").cloned().unwrap_or_else(|| json!("queued")),
                "conclusion": body.get("conclusion").cloned().unwrap_or(Value::Null),
                "started_at": now(), "completed_at": null, "details_url": body.get("details_url"),
                "app": { "id": 1, "slug": "shopfloor-test", "name": "shopfloor test" }, "pull_requests": [],
            });
            d.check_runs.entry((repo(&seg), sha.to_owned())).or_default().push(run.clone());
            ok(StatusCode::CREATED, run)
        }
        ("GET", ["repos", _, _, "commits", sha, "status"]) => {
            let statuses = d.statuses.get(&(repo(&seg), (*sha).to_owned())).cloned().unwrap_or_default();
            let state = if statuses.iter().any(|s| s["state"] == "failure" || s["state"] == "error") {
                "failure"
            } else if statuses.is_empty() || statuses.iter().any(|s| s["state"] == "pending") {
                "pending"
            } else {
                "success"
            };
            ok(StatusCode::OK, json!({ "state": state, "sha": sha, "total_count": statuses.len(), "statuses": statuses }))
        }
        ("POST", ["repos", _, _, "statuses", sha]) => {
            let id = d.id();
            let status = json!({ "id": id, "state": body.get("state"), "context": body.get("context").cloned().unwrap_or_else(|| json!("default")), "target_url": body.get("target_url"), "created_at": now(), "updated_at": now() });
            d.statuses.entry((repo(&seg), (*sha).to_owned())).or_default().push(status.clone());
            ok(StatusCode::CREATED, status)
        }
        _ => error(404, "Not Found"),
    }
}

fn label(name: &str) -> Value {
    json!({ "id": name.len(), "node_id": format!("LA_{name}"), "name": name, "color": "ededed", "default": false, "description": null })
}
