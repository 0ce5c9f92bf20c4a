//! The `e` notices of a process: the event streams learn of events committed without a wake
//! from one `NOTIFY … 'e'` at most every [`EVENTS_NOTICE_INTERVAL`], carried by a commit when
//! one is due, otherwise sent after it by a trailing task (`Change::commit`).

use std::time::Duration;

use crate::db::Db;

use super::NOTIFY_CHANNEL;

/// How often a process tells the event streams of events it committed without a wake.
const EVENTS_NOTICE_INTERVAL: Duration = Duration::from_millis(50);

/// The `e` notices of this process: one is sent at most every [`EVENTS_NOTICE_INTERVAL`]; a
/// commit that may not send one marks the process dirty, and a trailing notice follows.
pub(crate) struct EventsNotice {
    last: Option<std::time::Instant>,
    dirty: bool,
    /// When the task that sends the trailing notice last looked; a task gone with its runtime
    /// (a test's) stops looking, and the next commit starts another.
    trailing: Option<std::time::Instant>,
}

static EVENTS_NOTICE: std::sync::Mutex<EventsNotice> = std::sync::Mutex::new(EventsNotice { last: None, dirty: false, trailing: None });

impl EventsNotice {
    /// Whether events committed in this process still wait for their trailing notice.
    #[cfg(feature = "testkit")]
    pub(crate) fn owed() -> bool {
        EVENTS_NOTICE.lock().is_ok_and(|n| n.dirty || n.trailing.is_some())
    }

    /// Whether the commit about to happen may carry an `e` itself (and is counted as sent).
    pub(super) fn take_now() -> bool {
        let Ok(mut n) = EVENTS_NOTICE.lock() else { return true };
        let now = std::time::Instant::now();
        if n.last.is_none_or(|t| now.duration_since(t) >= EVENTS_NOTICE_INTERVAL) {
            n.last = Some(now);
            n.dirty = false;
            return true;
        }
        false
    }

    /// After a commit whose events went untold: make sure a notice follows it.
    pub(super) fn owe(pool: &Db) {
        let Ok(mut n) = EVENTS_NOTICE.lock() else { return };
        n.dirty = true;
        if n.trailing.is_some_and(|t| t.elapsed() < EVENTS_NOTICE_INTERVAL * 20) {
            return;
        }
        n.trailing = Some(std::time::Instant::now());
        let pool = pool.clone();
        tokio::spawn(async move {
            loop {
                let wait = {
                    let Ok(mut n) = EVENTS_NOTICE.lock() else { return };
                    if !n.dirty {
                        n.trailing = None;
                        return;
                    }
                    n.trailing = Some(std::time::Instant::now());
                    let since = n.last.map_or(EVENTS_NOTICE_INTERVAL, |t| t.elapsed());
                    if since >= EVENTS_NOTICE_INTERVAL {
                        n.dirty = false;
                        n.last = Some(std::time::Instant::now());
                        None
                    } else {
                        Some(EVENTS_NOTICE_INTERVAL - since)
                    }
                };
                match wait {
                    Some(d) => tokio::time::sleep(d).await,
                    None => {
                        if let Err(e) = sqlx::query("SELECT pg_notify($1, 'e')").bind(NOTIFY_CHANNEL).execute(&pool).await {
                            // The streams catch up at their next notice or reconnect.
                            tracing::warn!(error = %e, "cannot tell the event streams of new events");
                        }
                    }
                }
            }
        });
    }
}
