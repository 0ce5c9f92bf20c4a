//! A run as the API describes it (the fields this client shows), and how a command line names
//! one.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;

use super::Conn;
use super::error::ClientError;

/// A run as the API describes it (the fields this client shows).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Run {
    pub(crate) id: String,
    #[serde(default)]
    pub(crate) name: String,
    pub(crate) workflow: String,
    pub(crate) version: i64,
    pub(crate) status: String,
    #[serde(default)]
    pub(crate) substate: Option<String>,
    pub(crate) words: String,
    #[serde(default)]
    pub(crate) reason: Option<String>,
    #[serde(default)]
    pub(crate) input: Value,
    #[serde(default)]
    pub(crate) item: Option<String>,
    #[serde(default)]
    pub(crate) source_run: Option<String>,
    #[serde(default)]
    pub(crate) source_from: Option<String>,
    #[serde(default)]
    pub(crate) created_by: String,
    pub(crate) created_at: DateTime<Utc>,
    #[serde(default)]
    pub(crate) started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub(crate) ended_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Step {
    pub(crate) id: String,
    pub(crate) node: String,
    pub(crate) kind: String,
    pub(crate) attempt: i64,
    pub(crate) state: String,
    #[serde(default)]
    pub(crate) reason: Option<String>,
    #[serde(default)]
    pub(crate) timed_out: bool,
    #[serde(default)]
    pub(crate) reused: bool,
    #[serde(default)]
    pub(crate) started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub(crate) ended_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Approval {
    pub(crate) node: String,
    pub(crate) prompt: String,
    #[serde(default)]
    pub(crate) fields: Value,
    #[serde(default)]
    pub(crate) deadline: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RunDetail {
    #[serde(flatten)]
    pub(crate) run: Run,
    #[serde(default)]
    pub(crate) steps: Vec<Step>,
    #[serde(default)]
    pub(crate) approvals: Vec<Approval>,
}

/// The id of a run named by id or full name; a full name also sets the org and project.
pub(crate) fn run_ref(conn: &mut Conn, text: &str) -> Result<String, ClientError> {
    let parts: Vec<&str> = text.split(':').collect();
    match parts.as_slice() {
        [id] => Ok((*id).to_owned()),
        [org, project, id] => {
            conn.org = Some((*org).to_owned());
            conn.project = Some((*project).to_owned());
            Ok((*id).to_owned())
        }
        _ => Err(ClientError::Usage(format!("`{text}` is not a run: give `run-…` or `<org>:<project>:run-…`"))),
    }
}
