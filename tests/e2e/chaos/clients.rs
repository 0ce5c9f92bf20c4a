//! The suite's clients, over HTTP to the two API replicas as real ones would: a REST client
//! that submits with an `Idempotency-Key` and, when a replica dies under it (a refused or reset
//! connection, a timeout, a 5xx), sends the same request with the same key to the other; GitHub,
//! which delivers signed `issues.opened` webhooks and redelivers the same delivery (its
//! `X-GitHub-Delivery`) until one is answered 2xx; and a person approving whatever waits.
//!
//! What the server acknowledged is kept: every run a submit was answered with, every delivery
//! answered 2xx, every approval answered 200. The invariants are checked against these.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine::db::Db;
use engine::ids::RunId;
use serde_json::{Value, json};
use shopfloor_tests::github_fake::payloads::{self, Issue, Repo};

use super::{INSTALLATION, REPOSITORY, SECRET};

/// How long a request may go unanswered before the client gives up on that replica.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause before a retry on the other replica.
const RETRY_AFTER: Duration = Duration::from_millis(200);

/// What the server acknowledged, and how often the clients had to try again.
#[derive(Debug, Default)]
pub(super) struct Acked {
    /// REST submits: (Idempotency-Key, the run it was answered with).
    pub(super) submits: Vec<(String, RunId)>,
    /// Deliveries answered 2xx: (issue number, delivery id).
    pub(super) deliveries: Vec<(i64, String)>,
    /// Approvals answered 200.
    pub(super) approvals: Vec<RunId>,
    /// Requests sent again after a failure, and answers that replayed an earlier one.
    pub(super) retries: u64,
    pub(super) replays: u64,
}

#[derive(Clone)]
pub(super) struct Clients {
    http: reqwest::Client,
    bases: Arc<Vec<String>>,
    token: Arc<String>,
    pub(super) acked: Arc<Mutex<Acked>>,
}

/// Why a request must be sent again (on the other replica); any other answer is final.
fn again(status: Option<reqwest::StatusCode>) -> bool {
    status.is_none_or(|s| s.is_server_error() || s == reqwest::StatusCode::TOO_MANY_REQUESTS)
}

impl Clients {
    pub(super) fn new(bases: Vec<String>, token: String) -> Clients {
        let http = reqwest::Client::builder().timeout(REQUEST_TIMEOUT).connect_timeout(Duration::from_secs(2)).build().unwrap();
        Clients { http, bases: Arc::new(bases), token: Arc::new(token), acked: Arc::default() }
    }

    /// Sends `build(base)` to one replica after another, from `first`, until one answers
    /// something final; that answer's status and body.
    async fn until_answered(&self, first: usize, build: impl Fn(&str) -> reqwest::RequestBuilder) -> (reqwest::StatusCode, reqwest::header::HeaderMap, Value) {
        let mut on = first;
        loop {
            match build(&self.bases[on % self.bases.len()]).send().await {
                Ok(r) if !again(Some(r.status())) => {
                    let (status, headers) = (r.status(), r.headers().clone());
                    // A body cut off by the replica's death is an unanswered request too.
                    if let Ok(text) = r.text().await {
                        return (status, headers, serde_json::from_str(&text).unwrap_or(Value::Null));
                    }
                }
                _ => {}
            }
            self.acked.lock().unwrap().retries += 1;
            on += 1;
            tokio::time::sleep(RETRY_AFTER).await;
        }
    }

    /// Submits one run of `workflow`, keyed `key`, until a replica answers it.
    pub(super) async fn submit(&self, first: usize, key: String, workflow: &str, input: Value) {
        let body = json!({ "workflow": workflow, "input": input });
        let (status, headers, answer) = self
            .until_answered(first, |base| {
                self.http.post(format!("{base}/api/v1/orgs/acme/projects/web/runs")).bearer_auth(&*self.token).header("idempotency-key", &key).json(&body)
            })
            .await;
        assert_eq!(status, 201, "submit {key}: {answer}");
        let run: RunId = answer["id"].as_str().and_then(|r| r.parse().ok()).unwrap_or_else(|| panic!("no run id in {answer}"));
        let mut acked = self.acked.lock().unwrap();
        if headers.get("idempotent-replayed").is_some() {
            acked.replays += 1;
        }
        acked.submits.push((key, run));
    }

    /// Delivers `issues.opened` for issue `number` until a replica answers 2xx; each attempt
    /// is the same delivery, as GitHub's redelivery is.
    pub(super) async fn deliver(&self, first: usize, number: i64) {
        let repo = Repo::new(REPOSITORY, INSTALLATION);
        let payload = payloads::issues_event("opened", &repo, &Issue::new(number, &format!("chaos {number}")), &payloads::user("alice"), None);
        let body = serde_json::to_vec(&payload).unwrap();
        let signature = payloads::sign(SECRET, &body);
        let delivery = uuid::Uuid::new_v4().to_string();
        let (status, _, answer) = self
            .until_answered(first, |base| {
                self.http
                    .post(format!("{base}/webhooks/github"))
                    .header("content-type", "application/json")
                    .header("user-agent", "GitHub-Hookshot/chaos")
                    .header("x-github-event", "issues")
                    .header("x-github-delivery", &delivery)
                    .header("x-github-hook-id", "1")
                    .header("x-github-hook-installation-target-type", "integration")
                    .header("x-hub-signature-256", &signature)
                    .body(body.clone())
            })
            .await;
        assert!(status.is_success(), "delivery for issue {number}: {status} {answer}");
        self.acked.lock().unwrap().deliveries.push((number, delivery));
    }

    /// Approves every approval that waits (read from the database, as a person reads the
    /// console), each until a replica answers; how many were approved.
    pub(super) async fn approve_waiting(&self, db: &Db, first: usize) -> u64 {
        let waiting: Vec<RunId> = match sqlx::query_scalar(
            "SELECT a.run_id FROM approvals a JOIN steps st USING (step_id) WHERE a.decision IS NULL AND st.state = 'waiting' ORDER BY a.run_id LIMIT 50",
        )
        .fetch_all(db)
        .await
        {
            Ok(w) => w,
            Err(_) => return 0,
        };
        let mut approved = 0;
        for (i, run) in waiting.into_iter().enumerate() {
            let (status, _, answer) = self
                .until_answered(first + i, |base| {
                    self.http.post(format!("{base}/api/v1/orgs/acme/projects/web/runs/{run}/approvals/ask")).bearer_auth(&*self.token).json(&json!({}))
                })
                .await;
            match status.as_u16() {
                200 => {
                    self.acked.lock().unwrap().approvals.push(run);
                    approved += 1;
                }
                // Approved by a request whose answer was lost (the replica died after its
                // commit): the decision is in the database, and the audit check finds it.
                409 => {}
                _ => panic!("approve {run}: {status} {answer}"),
            }
        }
        approved
    }
}
