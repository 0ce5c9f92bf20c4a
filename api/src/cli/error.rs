//! How a command of the server's fails: one line, and the exit code.

/// A failure of a command, printed as one line.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Failed(String),
    /// The command line is wrong (an unknown key, a malformed duration): exit 2, like clap's
    /// own usage errors.
    #[error("{0}")]
    Usage(String),
    /// Not built yet: said plainly, never faked.
    #[error("`shopfloor {0}` is not built yet")]
    NotBuilt(&'static str),
}

impl CliError {
    pub fn msg(e: impl std::fmt::Display) -> CliError {
        CliError::Failed(e.to_string())
    }

    /// The process's exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Failed(_) | CliError::NotBuilt(_) => 1,
        }
    }
}
