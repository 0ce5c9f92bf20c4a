//! What the operator pages' forms share: a REST refusal answers the page's 404 when what the
//! form names is not there (another org's host or webhook is not there either, so tenancy
//! reads the same), and is shown beside the form otherwise, with the REST status.

use axum::http::StatusCode;

use super::super::ConsoleError;
use super::super::internal::Refusal;

/// A refusal shown beside a form: its status for the page, and the REST detail.
pub(super) struct Shown {
    pub status: StatusCode,
    pub detail: String,
}

/// The refusal to show, or the page's 404.
pub(super) fn shown(r: Refusal) -> Result<Shown, ConsoleError> {
    if r.status == StatusCode::NOT_FOUND {
        return Err(ConsoleError::NotFound(r.problem.detail));
    }
    Ok(Shown { status: r.status, detail: r.problem.detail })
}
