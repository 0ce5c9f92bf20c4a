//! What every long-lived stream holds for its caller, the project event stream and the
//! console's live transcripts alike: a place among its token's open streams (`limits`), and
//! the token itself, checked again every few seconds. A stream outlives no token: once the
//! token is revoked, expires or its person leaves the org, the stream ends at its next send.

use std::time::{Duration, Instant};

use engine::db::Db;
use engine::ids::OrgId;

use super::AppState;
use super::auth::Caller;
use super::error::ApiError;
use super::limits::StreamSlot;

/// How long a stream goes on sending before its token is checked again.
const RECHECK: Duration = Duration::from_secs(5);

const TOKEN_STILL_ALLOWED: &str = "SELECT t.revoked_at IS NULL AND t.expires_at > now() AND (t.user_id IS NULL OR m.user_id IS NOT NULL) \
     FROM api_tokens t LEFT JOIN memberships m ON m.org_id = t.org_id AND m.user_id = t.user_id WHERE t.jti = $1 AND t.org_id = $2";

/// One open stream's hold on its caller's token. The stream keeps the database and the org it
/// reads for; it hands them to each check.
pub struct StreamAccess {
    jti: uuid::Uuid,
    checked_at: Instant,
    /// Given back when the stream's body is dropped: the client went away, the stream ended,
    /// or the server is closing.
    _place: StreamSlot,
}

impl StreamAccess {
    /// Takes a place for one more stream of `caller`'s token: 429 past the token's cap.
    pub fn open(state: &AppState, caller: &Caller) -> Result<StreamAccess, ApiError> {
        let place = state.limits().open_stream(caller.jti)?;
        Ok(StreamAccess { jti: caller.jti, checked_at: Instant::now(), _place: place })
    }

    /// Whether the stream's token may still read `org`'s stream; checked at most every
    /// [`RECHECK`].
    pub async fn still_allowed(&mut self, db: &Db, org: OrgId) -> bool {
        if self.checked_at.elapsed() < RECHECK {
            return true;
        }
        let check = sqlx::query_scalar::<_, bool>(TOKEN_STILL_ALLOWED).bind(self.jti).bind(org).fetch_optional(db);
        // Polled outside the request that opened it: the stream acts for its org itself.
        match engine::tenancy::scoped(Some(org), check).await {
            Ok(Some(true)) => {
                self.checked_at = Instant::now();
                true
            }
            Ok(_) => false,
            // The client reconnects and is checked anew.
            Err(e) => {
                tracing::warn!(error = %e, "a stream cannot check its token; closing it");
                false
            }
        }
    }
}
