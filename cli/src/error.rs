//! The one error type every command returns, and the problems of an invalid workflow that a
//! refusal may carry.

use serde::Deserialize;

/// Every way a command can fail.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    /// The command line itself is wrong or incomplete (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The server refused the request: its problem's title and detail (exit 1).
    #[error("{title}: {detail}")]
    Refused { status: u16, title: String, detail: String, problems: Vec<WorkflowProblem> },
    /// Anything else: the server cannot be reached, a file cannot be read (exit 1).
    #[error("{0}")]
    Failed(String),
}

impl ClientError {
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            ClientError::Usage(_) => 2,
            ClientError::Refused { .. } | ClientError::Failed(_) => 1,
        }
    }

    pub(crate) fn failed(e: impl std::fmt::Display) -> ClientError {
        ClientError::Failed(e.to_string())
    }
}

/// One problem of an invalid workflow, as the API reports it.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct WorkflowProblem {
    pub line: usize,
    pub col: usize,
    #[serde(default)]
    pub path: String,
    pub message: String,
}
