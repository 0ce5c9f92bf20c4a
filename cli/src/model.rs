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
    pub id: String,
    #[serde(default)]
    pub name: String,
    pub workflow: String,
    pub version: i64,
    pub status: String,
    #[serde(default)]
    pub substate: Option<String>,
    pub words: String,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub input: Value,
    #[serde(default)]
    pub item: Option<String>,
    #[serde(default)]
    pub source_run: Option<String>,
    #[serde(default)]
    pub source_from: Option<String>,
    #[serde(default)]
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub ended_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Step {
    pub id: String,
    pub node: String,
    pub kind: String,
    pub attempt: i64,
    pub state: String,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub timed_out: bool,
    #[serde(default)]
    pub reused: bool,
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub ended_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub output: Value,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Approval {
    pub node: String,
    pub prompt: String,
    #[serde(default)]
    pub fields: Value,
    #[serde(default)]
    pub deadline: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RunDetail {
    #[serde(flatten)]
    pub run: Run,
    #[serde(default)]
    pub steps: Vec<Step>,
    #[serde(default)]
    pub approvals: Vec<Approval>,
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
