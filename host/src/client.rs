//! The host protocol as the host calls it (`/api/v1/host/…` on the server): register, claim,
//! start, heartbeat, session, complete; a held step's fresh installation token; messages
//! acknowledged. The types mirror the server's OpenAPI document; unknown
//! fields in answers are ignored, so a newer server does not break an older host. The wire
//! types the server shares are the `protocol` crate's; those here differ from the server's: an
//! assignment (ids as text, a token the journal leaves out), a session report that borrows its
//! lines, and the credential as its file keeps it.

use std::time::Duration;

use protocol::{
    Caps, ClaimRequest, Complete, DeliveredMessages, Item, Policy, RegisterHost, Secret, SessionLine, Standing, StartStep, StepToken, StopStep, Usage,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server refuses because the host no longer holds the step (409).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The credential is not (or no longer) valid: revoked by deregistration, expired (401/403).
    #[error("refused ({status}): {detail}")]
    Refused { status: u16, detail: String },
    #[error("the server answered {status}: {detail}")]
    Status { status: u16, detail: String },
    /// The server could not be reached or did not answer in time.
    #[error("cannot reach the server: {0}")]
    Unreachable(String),
}

impl ClientError {
    /// Whether the step this call was about is gone from the server (404).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ClientError::Status { status: 404, .. })
    }
}

/// The credential registration answers, as kept in `<work-dir>/credential.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Credential {
    pub host_id: String,
    pub token: String,
    pub org: String,
    /// The server it is for: a credential is not sent to another server.
    #[serde(default)]
    pub server: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    pub step: String,
    pub run: String,
    pub node: String,
    #[serde(default)]
    pub visit: i32,
    #[serde(default)]
    pub attempt: i32,
    pub harness: String,
    #[serde(default)]
    pub model: Option<String>,
    pub prompt: String,
    #[serde(default)]
    pub command: Vec<String>,
    pub caps: Caps,
    #[serde(default)]
    pub repository: Option<Repository>,
    #[serde(default)]
    pub branch: Option<String>,
    #[serde(default)]
    pub item: Option<Item>,
    #[serde(default)]
    pub pr_body: bool,
    #[serde(default)]
    pub expect_changes: bool,
    #[serde(default)]
    pub policy: Policy,
    #[serde(default)]
    pub lease_secs: u64,
    /// The run's W3C trace context: the attempt's span joins the run's trace.
    #[serde(default)]
    pub traceparent: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Repository {
    pub full_name: String,
    pub clone_url: String,
    pub default_branch: String,
    /// Used for fetch and push only, never written to disk: the journal leaves it out.
    #[serde(default, skip_serializing)]
    pub token: Option<Secret>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ClaimAnswer {
    #[serde(default)]
    pub assignments: Vec<Assignment>,
    #[serde(default)]
    pub stop: Vec<StopStep>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SessionReport<'a> {
    pub harness: &'a str,
    pub lines: &'a [SessionLine],
    pub usage: &'a Usage,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub egress_refused: &'a [String],
}

/// The protocol's client, with the host's credential.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("base", &self.base).finish_non_exhaustive()
    }
}

/// The time limit of each call but `claim`, which waits up to its own wait plus this.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

fn http() -> Result<reqwest::Client, ClientError> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("shopfloor-host/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ClientError::Unreachable(e.to_string()))
}

async fn answer<T: for<'de> Deserialize<'de>>(sent: Result<reqwest::Response, reqwest::Error>) -> Result<T, ClientError> {
    let response = sent.map_err(|e| ClientError::Unreachable(e.to_string()))?;
    let status = response.status().as_u16();
    if (200..300).contains(&status) {
        return response.json::<T>().await.map_err(|e| ClientError::Unreachable(format!("unreadable answer: {e}")));
    }
    // A problem+json body: its `detail` says what went wrong.
    let text = response.text().await.unwrap_or_default();
    let detail = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v.get("detail").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| text.chars().take(200).collect());
    Err(match status {
        409 => ClientError::Conflict(detail),
        401 | 403 => ClientError::Refused { status, detail },
        // Busy (a rolled-back change), over a rate limit, a request that took too long, or the
        // server is restarting: try again later.
        429 | 502..=504 => ClientError::Unreachable(format!("{status}: {detail}")),
        _ => ClientError::Status { status, detail },
    })
}

impl Client {
    pub fn new(base: &str, token: &str) -> Result<Client, ClientError> {
        Ok(Client { http: http()?, base: base.trim_end_matches('/').to_owned(), token: token.to_owned() })
    }

    /// Registers with a registration token; answers the credential.
    pub async fn register(base: &str, registration: &str, body: &RegisterHost) -> Result<Credential, ClientError> {
        let url = format!("{}/api/v1/host/register", base.trim_end_matches('/'));
        let sent = http()?.post(url).bearer_auth(registration).json(body).timeout(CALL_TIMEOUT).send().await;
        let mut credential: Credential = answer(sent).await?;
        credential.server = base.trim_end_matches('/').to_owned();
        Ok(credential)
    }

    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.post(format!("{}/api/v1/host/{path}", self.base)).bearer_auth(&self.token).timeout(CALL_TIMEOUT)
    }

    /// Claims up to `max` steps, waiting up to `wait` for one; says which `held` steps to stop.
    pub async fn claim(&self, max: u32, held: &[String], wait: Duration) -> Result<ClaimAnswer, ClientError> {
        let body = ClaimRequest { max, held: held.to_vec(), wait_secs: Some(u32::try_from(wait.as_secs()).unwrap_or(u32::MAX)) };
        let sent = self.post("claim").timeout(wait + Duration::from_secs(15)).json(&body).send().await;
        answer(sent).await
    }

    pub async fn start(&self, step: &str, harness: &str, unwalled: bool) -> Result<Standing, ClientError> {
        let sent = self.post(&format!("steps/{step}/start")).json(&StartStep { harness: Some(harness.to_owned()), unwalled }).send().await;
        answer(sent).await
    }

    pub async fn heartbeat(&self, step: &str) -> Result<Standing, ClientError> {
        let sent = self.post(&format!("steps/{step}/heartbeat")).send().await;
        answer(sent).await
    }

    pub async fn session(&self, step: &str, report: &SessionReport<'_>) -> Result<Standing, ClientError> {
        let sent = self.post(&format!("steps/{step}/session")).json(report).send().await;
        answer(sent).await
    }

    pub async fn complete(&self, step: &str, c: &Complete) -> Result<Standing, ClientError> {
        let sent = self.post(&format!("steps/{step}/complete")).json(c).send().await;
        answer(sent).await
    }

    /// A fresh installation token for the repository of a step this host holds (asked before
    /// each fetch and push, and after adopting an attempt): `None` when the server has no
    /// GitHub App (the host's own git credentials apply) or the run is about no repository.
    pub async fn token(&self, step: &str) -> Result<StepToken, ClientError> {
        let sent = self.post(&format!("steps/{step}/token")).send().await;
        answer(sent).await
    }

    /// Acknowledges messages written to the harness: the server offers them no more.
    pub async fn messages_delivered(&self, step: &str, ids: &[uuid::Uuid]) -> Result<(), ClientError> {
        let sent = self.post(&format!("steps/{step}/messages/delivered")).json(&DeliveredMessages { messages: ids.to_vec() }).send().await;
        answer::<Value>(sent).await.map(|_| ())
    }
}
