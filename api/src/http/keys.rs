//! The signing keys a token verifies with, opened and held for a few seconds (`KeyCache`, in
//! `AppState`), and the one 401 every failed check of a token gives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::sealing::SecretKey;
use engine::store::signing_keys;
use secrecy::SecretBox;

use super::error::ApiError;

/// How long a cached key is trusted before it is read again: the bound within which a
/// retirement made by another process (another replica, `shopfloor admin`) reaches this one.
pub(super) const KEY_CACHE_TTL: Duration = Duration::from_secs(10);

/// Signing secrets by `kid`, opened. A key's secret never changes, but its end does: a
/// retirement sets when it stops verifying. So an entry carries that moment (as the database
/// counted it when the entry was read, turned into this process's clock: no clock skew between
/// replica and database) and is read again after [`KEY_CACHE_TTL`]. A key retired anywhere stops
/// verifying here at its `verify_until`, or at most `KEY_CACHE_TTL` after the retirement when
/// its grace is shorter than that. An unknown `kid` is looked up in the database each time (and
/// not remembered).
#[derive(Default)]
pub(super) struct KeyCache {
    keys: Mutex<HashMap<String, CachedKey>>,
}

struct CachedKey {
    secret: Arc<SecretBox<[u8]>>,
    read_at: Instant,
    /// `None`: until its tokens expire.
    verifies_until: Option<Instant>,
}

impl CachedKey {
    /// The secret while the key verifies; a refusal after its grace.
    fn usable(&self, now: Instant) -> Result<Arc<SecretBox<[u8]>>, ApiError> {
        match self.verifies_until {
            Some(until) if now >= until => Err(refuse("signing key retired")),
            _ => Ok(self.secret.clone()),
        }
    }
}

impl KeyCache {
    pub(super) async fn get(&self, db: &engine::db::Db, sealing: &SecretKey, kid: &str) -> Result<Arc<SecretBox<[u8]>>, ApiError> {
        let now = Instant::now();
        if let Some(entry) = self.keys.lock().map_err(|_| ApiError::internal("key cache poisoned"))?.get(kid) {
            if now.duration_since(entry.read_at) < KEY_CACHE_TTL {
                return entry.usable(now);
            }
        }
        let Some(found) = signing_keys::verifying(db, sealing, kid).await? else {
            self.keys.lock().map_err(|_| ApiError::internal("key cache poisoned"))?.remove(kid);
            return Err(refuse("unknown kid"));
        };
        let read_at = Instant::now();
        let entry = CachedKey { secret: Arc::new(found.secret), read_at, verifies_until: found.verifies_for.map(|left| read_at + left) };
        let usable = entry.usable(read_at);
        let mut keys = self.keys.lock().map_err(|_| ApiError::internal("key cache poisoned"))?;
        // Keys are few; a bound keeps a bug from growing this forever.
        if keys.len() > 1_000 {
            keys.clear();
        }
        keys.insert(kid.to_owned(), entry);
        usable
    }
}

/// One 401 for every failed check; the reason goes to the log only.
pub(super) fn refuse(why: &str) -> ApiError {
    tracing::debug!(reason = why, "token refused");
    ApiError::Unauthorized("missing, invalid, expired or revoked bearer token".into())
}
