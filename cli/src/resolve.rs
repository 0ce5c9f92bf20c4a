//! `shopfloor runs resolve`: marks a failed run handled. It leaves the failures to resolve and
//! keeps its status `failed`; resolving it again changes nothing. (Apart from `runs.rs`, which
//! is long enough.)

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::error::ClientError;
use super::http::{Api, Body};
use super::model::run_ref;
use super::table::stamp;
use super::{Conn, say};

#[derive(Deserialize)]
struct Resolved {
    run: String,
    resolved_at: DateTime<Utc>,
    resolved_by: String,
}

/// `runs resolve RUN [--note TEXT]`.
pub(crate) async fn resolve(mut conn: Conn, run: &str, note: Option<String>) -> Result<u8, ClientError> {
    let id = run_ref(&mut conn, run)?;
    let api = Api::connect(&conn)?;
    let body = note.map_or(Body::None, |n| Body::Json(serde_json::json!({ "note": n })));
    let answer = api.post(api.project_url(&["runs", &id, "resolve"])?, body).await?;
    answer.print(conn.json, |r: Resolved| {
        say!("{} resolved by {} at {}: it stays failed, off the list of failures to handle", r.run, r.resolved_by, stamp(r.resolved_at));
    })?;
    Ok(0)
}
