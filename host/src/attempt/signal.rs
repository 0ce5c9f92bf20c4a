//! What every attempt of this host shares (the client, the settings, the journal, the
//! harnesses), and how an attempt is told to stop and why.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use protocol::Secret;
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::config::Settings;
use crate::git::Git;
use crate::journal::Journal;

/// What every attempt of this host shares.
pub struct Shared {
    pub client: Client,
    pub settings: Settings,
    pub journal: Journal,
    /// One lock per cached clone: its fetches and the clones made from it take turns.
    pub(crate) caches: Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
}

impl Shared {
    pub fn new(client: Client, settings: Settings, journal: Journal) -> Shared {
        Shared { client, settings, journal, caches: Mutex::new(HashMap::new()) }
    }

    pub(crate) fn cache_lock(&self, cache: &Path) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.caches.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.entry(cache.to_path_buf()).or_default().clone()
    }

    pub(crate) fn git(&self, token: Option<Secret>) -> Git {
        Git { timeout: self.settings.git_timeout, token, author_name: self.settings.author_name.clone(), author_email: self.settings.author_email.clone() }
    }
}

/// Why an attempt must stop before its harness is done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The server moved on (its state: `cancelled`, `failed`, `gone`, …): nothing to report.
    Server(String),
    /// The host drains: hand the step back (an infrastructure failure, retried elsewhere).
    Drain,
}

/// Set by whoever learns first that an attempt must stop: the claim's answer, a heartbeat, a
/// session report, the drain.
#[derive(Debug, Default)]
pub struct StopSignal {
    pub(crate) token: CancellationToken,
    pub(crate) why: Mutex<Option<Stop>>,
}

impl StopSignal {
    pub fn stop(&self, why: Stop) {
        let mut w = self.why.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if w.is_none() {
            *w = Some(why);
        }
        drop(w);
        self.token.cancel();
    }

    pub fn why(&self) -> Option<Stop> {
        self.why.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    pub fn is_stopped(&self) -> bool {
        self.token.is_cancelled()
    }
}
