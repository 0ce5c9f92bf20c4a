//! Webhook payloads with GitHub's shapes, and a client that signs and posts them the way GitHub
//! does (`X-Hub-Signature-256`, `X-GitHub-Event`, `X-GitHub-Delivery`).
//!
//! The builders fill the fields GitHub sends that shopfloor reads, with GitHub's names, types
//! and nesting (the `issue` inside `issues.labeled`, `check_run.pull_requests`, the `changes`
//! of a `projects_v2_item.edited`, …), plus the envelope every App delivery carries:
//! `action`, `sender`, `repository`, `organization` and `installation`.

use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

/// A repository connected through an App installation.
#[derive(Debug, Clone)]
pub struct Repo {
    /// `Owner/Name`, as GitHub spells it (shopfloor lowercases it).
    pub full_name: String,
    pub id: i64,
    pub installation: i64,
    /// The branch GitHub says pull requests go to (`main` unless set).
    pub default_branch: String,
}

impl Repo {
    pub fn new(full_name: &str, installation: i64) -> Repo {
        Repo { full_name: full_name.to_owned(), id: 4_200 + full_name.len() as i64, installation, default_branch: "main".into() }
    }

    pub fn owner(&self) -> &str {
        self.full_name.split('/').next().unwrap_or_default()
    }

    /// The `repository` object of a payload.
    pub fn json(&self) -> Value {
        let name = self.full_name.split('/').nth(1).unwrap_or_default();
        json!({
            "id": self.id, "node_id": format!("R_{}", self.id), "name": name, "full_name": self.full_name, "private": true,
            "owner": { "login": self.owner(), "id": 1, "type": "Organization" },
            "html_url": format!("https://github.com/{}", self.full_name),
            "default_branch": self.default_branch, "visibility": "private",
        })
    }

    fn envelope(&self, action: Option<&str>, sender: &Value) -> Value {
        let mut p = json!({
            "sender": sender,
            "repository": self.json(),
            "organization": { "login": self.owner(), "id": 1, "node_id": "O_1" },
            "installation": { "id": self.installation, "node_id": format!("MDIz{}", self.installation) },
        });
        if let Some(a) = action {
            p["action"] = json!(a);
        }
        p
    }
}

/// A person (`type: User`).
pub fn user(login: &str) -> Value {
    json!({ "login": login, "id": 100 + login.len(), "node_id": format!("U_{login}"), "type": "User", "site_admin": false })
}

/// A bot (`type: Bot`, `login` ending in `[bot]`).
pub fn bot(name: &str) -> Value {
    json!({ "login": format!("{name}[bot]"), "id": 41_898_282, "node_id": format!("BOT_{name}"), "type": "Bot", "site_admin": false })
}

fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn labels(names: &[String]) -> Value {
    json!(
        names
            .iter()
            .map(|n| json!({ "id": n.len(), "node_id": format!("LA_{n}"), "name": n, "color": "ededed", "default": false, "description": null }))
            .collect::<Vec<_>>()
    )
}

/// An issue's state, from which payloads are built.
#[derive(Debug, Clone)]
pub struct Issue {
    pub number: i64,
    pub title: String,
    pub body: String,
    pub labels: Vec<String>,
    pub state: String,
    pub author: String,
    pub author_association: String,
    pub assignees: Vec<String>,
}

impl Issue {
    pub fn new(number: i64, title: &str) -> Issue {
        Issue {
            number,
            title: title.to_owned(),
            body: String::new(),
            labels: Vec::new(),
            state: "open".to_owned(),
            author: "alice".to_owned(),
            author_association: "MEMBER".to_owned(),
            assignees: Vec::new(),
        }
    }

    /// The `issue` object, `updated_at` now.
    pub fn json(&self, repo: &Repo) -> Value {
        let id = 90_000 + self.number;
        json!({
            "id": id, "node_id": format!("I_{}_{}", repo.id, self.number), "number": self.number,
            "title": self.title, "body": self.body, "state": self.state,
            "state_reason": if self.state == "closed" { json!("completed") } else { Value::Null },
            "locked": false, "comments": 0,
            "user": user(&self.author), "author_association": self.author_association,
            "labels": labels(&self.labels),
            "assignees": self.assignees.iter().map(|a| user(a)).collect::<Vec<_>>(),
            "assignee": self.assignees.first().map(|a| user(a)),
            "milestone": null,
            "url": format!("https://api.github.com/repos/{}/issues/{}", repo.full_name, self.number),
            "html_url": format!("https://github.com/{}/issues/{}", repo.full_name, self.number),
            "repository_url": format!("https://api.github.com/repos/{}", repo.full_name),
            "created_at": "2024-05-01T10:00:00Z", "updated_at": now(),
            "closed_at": if self.state == "closed" { json!(now()) } else { Value::Null },
        })
    }
}

impl Issue {
    /// Adds the label `name`: the `issues.labeled` event `bob` sends.
    pub fn labeled(&mut self, repo: &Repo, name: &str) -> Value {
        self.labels.push(name.to_owned());
        issues_event("labeled", repo, self, &user("bob"), Some(name))
    }

    /// Takes the label `name` off: the `issues.unlabeled` event `bob` sends.
    pub fn unlabeled(&mut self, repo: &Repo, name: &str) -> Value {
        self.labels.retain(|l| l != name);
        issues_event("unlabeled", repo, self, &user("bob"), Some(name))
    }

    /// Sets the body: the `issues.edited` event `sender` sends.
    pub fn edited(&mut self, repo: &Repo, body: &str, sender: &str) -> Value {
        self.body = body.to_owned();
        issues_event("edited", repo, self, &user(sender), None)
    }
}

/// `issues` with `action` (opened, edited, labeled, unlabeled, closed, …). `label` is the
/// label an `issues.labeled`/`unlabeled` carries; `issues.edited` gets `changes`.
pub fn issues_event(action: &str, repo: &Repo, issue: &Issue, sender: &Value, label: Option<&str>) -> Value {
    let mut p = repo.envelope(Some(action), sender);
    p["issue"] = issue.json(repo);
    if let Some(l) = label {
        p["label"] = json!({ "id": l.len(), "node_id": format!("LA_{l}"), "name": l, "color": "ededed", "default": false });
    }
    if action == "edited" {
        p["changes"] = json!({ "body": { "from": "(the previous body)" } });
    }
    p
}

/// `issue_comment` on an issue.
pub fn issue_comment_event(action: &str, repo: &Repo, issue: &Issue, comment_id: i64, body: &str, commenter: &str, association: &str) -> Value {
    let mut p = repo.envelope(Some(action), &user(commenter));
    p["issue"] = issue.json(repo);
    p["comment"] = json!({
        "id": comment_id, "node_id": format!("IC_{comment_id}"), "body": body, "user": user(commenter),
        "author_association": association, "created_at": now(), "updated_at": now(),
        "html_url": format!("https://github.com/{}/issues/{}#issuecomment-{comment_id}", repo.full_name, issue.number),
    });
    p
}

/// A pull request's state.
#[derive(Debug, Clone)]
pub struct PullRequest {
    pub number: i64,
    pub title: String,
    pub body: String,
    pub labels: Vec<String>,
    pub state: String,
    pub draft: bool,
    pub merged: bool,
    pub head_ref: String,
    pub head_sha: String,
    pub base_ref: String,
    pub author: String,
    pub author_association: String,
}

impl PullRequest {
    pub fn new(number: i64, title: &str, head_sha: &str) -> PullRequest {
        PullRequest {
            number,
            title: title.to_owned(),
            body: String::new(),
            labels: Vec::new(),
            state: "open".to_owned(),
            draft: false,
            merged: false,
            head_ref: format!("shopfloor/{number}-change"),
            head_sha: head_sha.to_owned(),
            base_ref: "main".to_owned(),
            author: "alice".to_owned(),
            author_association: "MEMBER".to_owned(),
        }
    }

    /// The `pull_request` object.
    pub fn json(&self, repo: &Repo) -> Value {
        let id = 70_000 + self.number;
        json!({
            "id": id, "node_id": format!("PR_{}_{}", repo.id, self.number), "number": self.number,
            "title": self.title, "body": self.body, "state": self.state, "locked": false, "draft": self.draft,
            "user": user(&self.author), "author_association": self.author_association,
            "labels": labels(&self.labels), "assignees": [], "requested_reviewers": [], "milestone": null,
            "head": { "label": format!("{}:{}", repo.owner(), self.head_ref), "ref": self.head_ref, "sha": self.head_sha, "repo": repo.json() },
            "base": { "label": format!("{}:{}", repo.owner(), self.base_ref), "ref": self.base_ref, "sha": "0".repeat(40), "repo": repo.json() },
            "merged": self.merged, "merged_at": if self.merged { json!(now()) } else { Value::Null },
            "mergeable": null, "mergeable_state": "unknown",
            "html_url": format!("https://github.com/{}/pull/{}", repo.full_name, self.number),
            "created_at": "2024-05-01T10:00:00Z", "updated_at": now(),
            "closed_at": if self.state == "closed" { json!(now()) } else { Value::Null },
        })
    }
}

/// `pull_request` with `action` (opened, synchronize, labeled, closed, …).
pub fn pull_request_event(action: &str, repo: &Repo, pr: &PullRequest, sender: &Value) -> Value {
    let mut p = repo.envelope(Some(action), sender);
    p["number"] = json!(pr.number);
    p["pull_request"] = pr.json(repo);
    if action == "synchronize" {
        p["before"] = json!("1".repeat(40));
        p["after"] = json!(pr.head_sha);
    }
    p
}

/// `pull_request_review.submitted` with a review `state` (approved, changes_requested, commented).
pub fn pull_request_review_event(repo: &Repo, pr: &PullRequest, reviewer: &str, association: &str, state: &str, body: &str) -> Value {
    let mut p = repo.envelope(Some("submitted"), &user(reviewer));
    p["pull_request"] = pr.json(repo);
    p["review"] = json!({
        "id": 555, "node_id": "PRR_555", "user": user(reviewer), "body": body, "state": state,
        "author_association": association, "commit_id": pr.head_sha, "submitted_at": now(),
        "html_url": format!("https://github.com/{}/pull/{}#pullrequestreview-555", repo.full_name, pr.number),
    });
    p
}

/// `check_run` with `action` (created, completed, …) for `head_sha`.
#[expect(clippy::too_many_arguments, reason = "mirrors the payload's fields one to one")]
pub fn check_run_event(action: &str, repo: &Repo, id: i64, name: &str, head_sha: &str, status: &str, conclusion: Option<&str>, prs: &[i64]) -> Value {
    let mut p = repo.envelope(Some(action), &bot("github-actions"));
    p["check_run"] = json!({
        "id": id, "node_id": format!("CR_{id}"), "name": name, "head_sha": head_sha, "status": status, "conclusion": conclusion,
        "started_at": now(), "completed_at": if status == "completed" { json!(now()) } else { Value::Null },
        "details_url": format!("https://github.com/{}/actions/runs/{id}", repo.full_name),
        "app": { "id": 15368, "slug": "github-actions", "name": "GitHub Actions" },
        "check_suite": { "id": id + 1, "head_sha": head_sha, "status": status, "conclusion": conclusion },
        "pull_requests": prs.iter().map(|n| json!({ "number": n, "head": { "sha": head_sha }, "base": { "ref": "main" } })).collect::<Vec<_>>(),
    });
    p
}

/// `check_suite.completed` for `head_sha`.
pub fn check_suite_event(repo: &Repo, id: i64, head_sha: &str, conclusion: &str) -> Value {
    let mut p = repo.envelope(Some("completed"), &bot("github-actions"));
    p["check_suite"] = json!({
        "id": id, "head_sha": head_sha, "head_branch": "feature", "status": "completed", "conclusion": conclusion,
        "app": { "id": 15368, "slug": "github-actions", "name": "GitHub Actions" }, "pull_requests": [],
        "created_at": now(), "updated_at": now(),
    });
    p
}

/// `status` (a commit status; no `action`).
pub fn status_event(repo: &Repo, sha: &str, context: &str, state: &str) -> Value {
    let mut p = repo.envelope(None, &user("ci-runner"));
    p["id"] = json!(31_337);
    p["sha"] = json!(sha);
    p["name"] = json!(repo.full_name);
    p["context"] = json!(context);
    p["state"] = json!(state);
    p["target_url"] = json!("https://ci.example.com/build/1");
    p["description"] = json!("The build finished");
    p["commit"] = json!({ "sha": sha });
    p["branches"] = json!([]);
    p["created_at"] = json!(now());
    p["updated_at"] = json!(now());
    p
}

/// `push` of `after` onto `git_ref` (no `action`).
pub fn push_event(repo: &Repo, git_ref: &str, before: &str, after: &str, pusher: &str) -> Value {
    let mut p = repo.envelope(None, &user(pusher));
    p["ref"] = json!(git_ref);
    p["before"] = json!(before);
    p["after"] = json!(after);
    p["created"] = json!(false);
    p["deleted"] = json!(false);
    p["forced"] = json!(false);
    p["pusher"] = json!({ "name": pusher, "email": format!("{pusher}@example.com") });
    p["head_commit"] = json!({ "id": after, "message": "Change things", "timestamp": now() });
    p["commits"] = json!([{ "id": after, "message": "Change things" }]);
    p
}

/// `projects_v2_item` (an org project's card) for the issue or pull request `content_node_id`;
/// `edited` with `field` = (name, single-select option name) is a column move.
pub fn projects_v2_item_event(action: &str, org: &str, installation: i64, content_node_id: &str, field: Option<(&str, &str)>, sender: &Value) -> Value {
    let mut p = json!({
        "action": action,
        "projects_v2_item": {
            "id": 314, "node_id": "PVTI_314", "project_node_id": "PVT_9", "content_node_id": content_node_id,
            "content_type": if content_node_id.starts_with("PR_") { "PullRequest" } else { "Issue" },
            "creator": user("alice"), "created_at": "2024-05-01T10:00:00Z", "updated_at": now(), "archived_at": null,
        },
        "organization": { "login": org, "id": 1, "node_id": "O_1" },
        "sender": sender,
        "installation": { "id": installation, "node_id": format!("MDIz{installation}") },
    });
    // An archived card says when; a restored one says when it had been.
    match action {
        "archived" => {
            p["projects_v2_item"]["archived_at"] = json!(now());
            p["changes"] = json!({ "archived_at": { "from": null, "to": now() } });
        }
        "restored" => p["changes"] = json!({ "archived_at": { "from": now(), "to": null } }),
        _ => {}
    }
    if let Some((name, option)) = field {
        p["changes"] = json!({ "field_value": {
            "field_node_id": "PVTSSF_1", "field_type": "single_select", "field_name": name, "project_number": 9,
            "from": { "id": "0", "name": "Todo", "color": "GRAY" }, "to": { "id": "1", "name": option, "color": "BLUE" },
        } });
    }
    p
}

/// `repository.renamed`, as GitHub sends it after the rename: `repository` is the renamed one,
/// `changes` has the old name (without its owner).
pub fn repository_renamed_event(repo: &Repo, old_name: &str, sender: &Value) -> Value {
    let mut p = repo.envelope(Some("renamed"), sender);
    p["changes"] = json!({ "repository": { "name": { "from": old_name } } });
    p
}

/// `repository.transferred` from the organization `old_owner`: `repository` is the moved one.
pub fn repository_transferred_event(repo: &Repo, old_owner: &str, sender: &Value) -> Value {
    let mut p = repo.envelope(Some("transferred"), sender);
    p["changes"] = json!({ "owner": { "from": { "organization": {
        "login": old_owner, "id": 2, "node_id": "O_2", "url": format!("https://api.github.com/orgs/{old_owner}"), "description": "",
    } } } });
    p
}

/// `installation` with `action` (created, deleted, suspend, unsuspend).
pub fn installation_event(action: &str, installation: i64, account: &str, repositories: &[&str]) -> Value {
    json!({
        "action": action,
        "installation": {
            "id": installation, "account": { "login": account, "id": 1, "type": "Organization" },
            "repository_selection": "selected", "app_id": 1, "app_slug": "shopfloor",
            "target_type": "Organization", "permissions": { "issues": "write", "pull_requests": "write", "contents": "write", "checks": "read" },
            "events": ["issues", "pull_request", "check_run"], "suspended_at": null,
        },
        "repositories": repositories.iter().map(|r| json!({ "id": r.len(), "name": r.split('/').nth(1), "full_name": r, "private": true })).collect::<Vec<_>>(),
        "sender": user("alice"),
    })
}

/// `installation_repositories` (added / removed).
pub fn installation_repositories_event(action: &str, installation: i64, account: &str, added: &[&str], removed: &[&str]) -> Value {
    let list =
        |names: &[&str]| names.iter().map(|r| json!({ "id": r.len(), "name": r.split('/').nth(1), "full_name": r, "private": true })).collect::<Vec<_>>();
    json!({
        "action": action,
        "installation": { "id": installation, "account": { "login": account, "id": 1, "type": "Organization" } },
        "repository_selection": "selected",
        "repositories_added": list(added),
        "repositories_removed": list(removed),
        "sender": user("alice"),
    })
}

/// The `X-Hub-Signature-256` value GitHub sends for `body`.
pub fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(body);
    format!("sha256={}", data_encoding::HEXLOWER.encode(&mac.finalize().into_bytes()))
}

/// Posts signed deliveries to a `/webhooks/github` URL.
#[derive(Clone)]
pub struct WebhookClient {
    pub url: String,
    pub secret: String,
    client: reqwest::Client,
}

impl WebhookClient {
    pub fn new(base_url: &str, secret: &str) -> WebhookClient {
        WebhookClient { url: format!("{base_url}/webhooks/github"), secret: secret.to_owned(), client: reqwest::Client::new() }
    }

    /// Posts `payload` as delivery `delivery` of `event`, signed; returns the status and body.
    pub async fn send(&self, event: &str, delivery: &str, payload: &Value) -> (u16, Value) {
        let body = serde_json::to_vec(payload).expect("a JSON payload");
        let signature = sign(&self.secret, &body);
        self.send_raw(event, delivery, body, Some(&signature)).await
    }

    /// Sends a delivery's headers declaring a body of `length` bytes, then only its first
    /// bytes, and reads the answer's status: a server that refuses by the declared length
    /// answers without waiting for the rest. (A client that sent the whole body could find the
    /// connection closed under it instead of reading the answer.)
    pub async fn send_declaring(&self, event: &str, delivery: &str, length: usize, signature: &str) -> u16 {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let rest = self.url.strip_prefix("http://").expect("an http:// URL");
        let (addr, path) = rest.split_once('/').expect("a URL with a path");
        let mut conn = tokio::net::TcpStream::connect(addr).await.expect("the server accepts");
        let head = format!(
            "POST /{path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nX-GitHub-Event: {event}\r\n\
             X-GitHub-Delivery: {delivery}\r\nX-Hub-Signature-256: {signature}\r\nContent-Length: {length}\r\n\r\n{{\"action\":"
        );
        conn.write_all(head.as_bytes()).await.expect("the server reads the head");
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        while !answer.windows(2).any(|w| w == b"\r\n") {
            let n = conn.read(&mut buf).await.expect("the server answers");
            assert!(n > 0, "the server closed the connection without answering");
            answer.extend_from_slice(&buf[..n]);
        }
        let line = String::from_utf8_lossy(&answer).into_owned();
        line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("not an HTTP answer: {line}"))
    }

    /// Posts `payload` as a webhook set to `application/x-www-form-urlencoded` does: the JSON in
    /// the form field `payload`, the form signed.
    pub async fn send_form(&self, event: &str, delivery: &str, payload: &Value) -> (u16, Value) {
        let json = serde_json::to_string(payload).expect("a JSON payload");
        let body = url::form_urlencoded::Serializer::new(String::new()).append_pair("payload", &json).finish().into_bytes();
        let signature = sign(&self.secret, &body);
        self.send_as("application/x-www-form-urlencoded", event, delivery, body, Some(&signature)).await
    }

    /// Posts `body` as it is, with `signature` (or none).
    pub async fn send_raw(&self, event: &str, delivery: &str, body: Vec<u8>, signature: Option<&str>) -> (u16, Value) {
        self.send_as("application/json", event, delivery, body, signature).await
    }

    /// Posts `body` as `content_type`, with `signature` (or none).
    pub async fn send_as(&self, content_type: &str, event: &str, delivery: &str, body: Vec<u8>, signature: Option<&str>) -> (u16, Value) {
        let mut request = self
            .client
            .post(&self.url)
            .header("content-type", content_type)
            .header("user-agent", "GitHub-Hookshot/fake")
            .header("x-github-event", event)
            .header("x-github-delivery", delivery)
            .header("x-github-hook-id", "1")
            .header("x-github-hook-installation-target-type", "integration")
            .body(body);
        if let Some(s) = signature {
            request = request.header("x-hub-signature-256", s);
        }
        let response = request.send().await.expect("the server answers");
        let status = response.status().as_u16();
        let body = response.json::<Value>().await.unwrap_or(Value::Null);
        (status, body)
    }
}
