//! The replica's event hub: it follows `run_events` and hands each new event to every open
//! stream (`events`) and each `ready` or transcript signal to those who wait on it.
//!
//! Each replica holds ONE `LISTEN` connection (outside the pool). On every notification the hub
//! reads the new events once, for every client of every org, and fans them out through a
//! `tokio::sync::broadcast`; a client costs no query per event, only the read that resumes it.
//!
//! Ordering: events are read by `(xid, event_id)` and only below the oldest transaction of
//! this database still running (`shopfloor_event_horizon()`, migration 0009: like
//! `pg_snapshot_xmin`, without letting other databases' transactions hold the streams back).
//! An event committed later always has a larger position
//! than every event already handed out, so a client's position (its `Last-Event-ID`, the
//! text `<xid>.<event_id>`) never has an event appear behind it. While committed events wait
//! for an older transaction to end, the hub looks again after a short, doubling delay (10 ms
//! to 1 s) until they pass: that is the only timer, and it runs only while events wait.
//!
//! A replica nobody follows reads nothing: on a notification with no subscriber the hub forgets
//! its position, and the next subscriber sets it to the horizon before reading its own backlog
//! (both under one lock), so the hub resumes at or before where that subscriber's backlog ends.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use engine::db::Db;
use engine::ids::{OrgId, ProjectId, RunId, StepId};
use engine::listen::{Listener, Target};
use engine::sealing::SecretKey;
use engine::store::{NOTIFY_CHANNEL, Notice};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::{CancellationToken, DropGuard};
use utoipa::ToSchema;

/// Rows read per query, by the hub and by a resuming client.
pub(super) const BATCH: i64 = 500;
/// Events a slow client may fall behind before it resumes from the database.
const CHANNEL: usize = 4096;

/// A place in the project stream: `(xid, event_id)` of the event last seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    xid: u64,
    event: i64,
}

impl Position {
    /// Before every event the stream keeps: `Last-Event-ID: 0`.
    pub const START: Position = Position { xid: 0, event: 0 };

    /// The position as a client sees it, the event's SSE `id`: sealed for `project`
    /// (`SecretKey::seal_position`). The service-wide transaction id and event id it holds
    /// would tell a tenant how busy every other tenant is; sealed, they tell nothing, the id
    /// of an event is the same on every connection and replica, and it resumes only this
    /// project's stream.
    pub fn to_id(self, key: &SecretKey, project: ProjectId) -> String {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.xid.to_be_bytes());
        bytes[8..].copy_from_slice(&self.event.to_be_bytes());
        key.seal_position(project.0, &bytes)
    }

    /// What [`Position::to_id`] gave out for `project`; `None` for anything else.
    pub fn from_id(id: &str, key: &SecretKey, project: ProjectId) -> Option<Position> {
        // Only positions this service sealed open: no text a client makes up reaches the query.
        let bytes = key.open_position(project.0, id)?;
        let (xid, event) = bytes.split_at(8);
        Some(Position { xid: u64::from_be_bytes(xid.try_into().ok()?), event: i64::from_be_bytes(event.try_into().ok()?) })
    }
}

/// One event of a run's journal.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct RunEvent {
    #[schema(value_type = String, example = "run-aaaaaaaaaaaaaaaaaaaaaaaaaa")]
    pub run: RunId,
    /// Gapless per run, from 1.
    pub seq: i64,
    /// `run.started`, `run.awaiting`, `step.succeeded`, …
    pub kind: String,
    pub node: Option<String>,
    #[schema(value_type = Option<String>)]
    pub step: Option<StepId>,
    pub at: DateTime<Utc>,
    pub attrs: Value,
}

#[derive(sqlx::FromRow)]
struct EventRow {
    org_id: OrgId,
    project_id: ProjectId,
    run_id: RunId,
    seq: i64,
    event_id: i64,
    xid: String,
    horizon: String,
    at: DateTime<Utc>,
    kind: String,
    step_id: Option<StepId>,
    node: Option<String>,
    attrs: Value,
    quiet: bool,
}

/// An event as the hub hands it out.
#[derive(Debug)]
pub struct StreamEvent {
    pub(crate) org: OrgId,
    pub(super) project: ProjectId,
    pub(super) pos: Position,
    /// Of a dry run or a child run: those do not announce themselves on the project's stream
    /// (nor to outgoing webhooks); their own journal still has every event.
    pub(super) quiet: bool,
    pub(crate) event: RunEvent,
}

impl EventRow {
    /// The event, or `None` while its transaction is not yet below the horizon.
    fn settled(self) -> Option<StreamEvent> {
        let xid: u64 = self.xid.parse().ok()?;
        let horizon: u64 = self.horizon.parse().ok()?;
        if xid >= horizon {
            return None;
        }
        Some(StreamEvent {
            org: self.org_id,
            project: self.project_id,
            pos: Position { xid, event: self.event_id },
            quiet: self.quiet,
            event: RunEvent { run: self.run_id, seq: self.seq, kind: self.kind, node: self.node, step: self.step_id, at: self.at, attrs: self.attrs },
        })
    }
}

const COLUMNS: &str = "org_id, project_id, run_id, seq, event_id, xid::text AS xid, \
     (SELECT shopfloor_event_horizon())::text AS horizon, at, kind, step_id, node, attrs, \
     coalesce((SELECT r.dry_run OR r.parent_run_id IS NOT NULL FROM runs r WHERE r.run_id = run_events.run_id), false) AS quiet";

/// The position before every event not yet settled: a new client starts there.
pub(super) async fn horizon(db: &Db) -> Result<Position, sqlx::Error> {
    let xmin: String = sqlx::query_scalar("SELECT shopfloor_event_horizon()::text").fetch_one(db).await?;
    Ok(Position { xid: xmin.parse().unwrap_or(0), event: 0 })
}

/// The replica's event hub. Dropping the last `AppState` stops its task.
pub struct EventHub {
    tx: broadcast::Sender<Arc<StreamEvent>>,
    /// Where the hub has read to; `None` while nobody subscribed since it last had no one to
    /// tell. Held across a read and across a subscription's first look at the horizon.
    pos: Arc<tokio::sync::Mutex<Option<Position>>>,
    db: Db,
    /// Bumped on each notification that a wake is due now (a step may have become ready for a
    /// host) and after each (re)connect: hosts' claims wait on it (`host_protocol`), on this
    /// same `LISTEN` connection.
    ready: watch::Sender<u64>,
    /// Runs whose transcript grew (`l<run>` notifications from session reports), for the
    /// console's live transcripts.
    pub(super) logs: broadcast::Sender<RunId>,
    _stop: DropGuard,
}

impl EventHub {
    /// Starts following `run_events`, with a `LISTEN` connection of its own to `listen`.
    pub fn start(db: Db, listen: Target) -> EventHub {
        let (tx, _) = broadcast::channel(CHANNEL);
        let (ready, _) = watch::channel(0);
        let (logs, _) = broadcast::channel(CHANNEL);
        let stop = CancellationToken::new();
        let pos = Arc::new(tokio::sync::Mutex::new(None));
        tokio::spawn(follow(db.clone(), listen, tx.clone(), pos.clone(), ready.clone(), logs.clone(), stop.clone()));
        EventHub { tx, pos, db, ready, logs, _stop: stop.drop_guard() }
    }

    /// A feed of every event the hub reads from now on. Call it before reading any backlog:
    /// the hub then resumes no later than the horizon as it is now.
    pub(crate) async fn subscribe(&self) -> Result<broadcast::Receiver<Arc<StreamEvent>>, sqlx::Error> {
        let mut pos = self.pos.lock().await;
        let rx = self.tx.subscribe();
        if pos.is_none() {
            *pos = Some(horizon(&self.db).await?);
        }
        Ok(rx)
    }

    /// Changes when a step may have become ready for a host.
    pub(crate) fn ready(&self) -> watch::Receiver<u64> {
        self.ready.subscribe()
    }
}

/// Whether a notification may mean a step became ready now (`w0`; an unknown payload too).
fn may_be_ready(payload: &str) -> bool {
    matches!(Notice::parse(payload), Notice::Wake(d) if d.is_zero())
}

async fn follow(
    db: Db, target: Target, tx: broadcast::Sender<Arc<StreamEvent>>, pos: Arc<tokio::sync::Mutex<Option<Position>>>, ready: watch::Sender<u64>,
    logs: broadcast::Sender<RunId>, stop: CancellationToken,
) {
    let mut backoff = engine::listen::Backoff::default();
    let mut listener = Listener::new(&target, NOTIFY_CHANNEL);
    loop {
        let subscribed = tokio::select! {
            () = stop.cancelled() => return,
            s = listener.subscribe() => s,
        };
        if let Err(e) = subscribed {
            tracing::warn!(error = %e, "event hub cannot LISTEN; retrying");
            if backoff.pause(&stop).await {
                return;
            }
            continue;
        }
        backoff.reset();
        // Subscribed before reading, so nothing committed from now on goes unnoticed; and
        // read once after each (re)connect, since notifications may have been missed.
        ready.send_modify(|n| *n += 1);
        let mut wait: Option<Duration> = None;
        loop {
            wait = match read(&db, &mut *pos.lock().await, &tx).await {
                Ok(false) => None,
                Ok(true) => Some(wait.map_or(Duration::from_millis(10), |w| (w * 2).min(Duration::from_secs(1)))),
                Err(e) => {
                    tracing::warn!(error = %e, "event hub cannot read run events; retrying");
                    Some(Duration::from_secs(1))
                }
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(wait.unwrap_or(Duration::ZERO)), if wait.is_some() => {}
                n = listener.recv() => match n {
                    Ok(payload) => {
                        if may_be_ready(&payload) {
                            ready.send_modify(|n| *n += 1);
                        }
                        for run in Notice::transcripts(&payload) {
                            // No receiver is not an error: no transcript is watched here now.
                            let _ = logs.send(run);
                        }
                    }
                    Err(e) => {
                        // Reconnected at once (then with the backoff), and read again.
                        tracing::warn!(error = %e, "event hub lost its LISTEN connection; reconnecting");
                        break;
                    }
                },
            }
        }
    }
}

/// Reads and sends the events settled since `pos`; true when some committed events still wait
/// for an older transaction.
async fn read(db: &Db, pos: &mut Option<Position>, tx: &broadcast::Sender<Arc<StreamEvent>>) -> Result<bool, sqlx::Error> {
    if tx.receiver_count() == 0 {
        // Nobody to tell: the next subscriber sets where to resume (`EventHub::subscribe`).
        *pos = None;
        return Ok(false);
    }
    let mut at = match *pos {
        Some(p) => p,
        None => {
            let p = horizon(db).await?;
            *pos = Some(p);
            p
        }
    };
    let sql = format!("SELECT {COLUMNS} FROM run_events WHERE (xid, event_id) > ($1::text::xid8, $2) ORDER BY xid, event_id LIMIT $3");
    loop {
        let rows: Vec<EventRow> = sqlx::query_as(&sql).bind(at.xid.to_string()).bind(at.event).bind(BATCH).fetch_all(db).await?;
        let full = rows.len() as i64 == BATCH;
        for row in rows {
            let Some(event) = row.settled() else { return Ok(true) };
            at = event.pos;
            *pos = Some(at);
            // No receiver is not an error: nobody listens on this replica now.
            let _ = tx.send(Arc::new(event));
        }
        if !full {
            return Ok(false);
        }
    }
}

/// The settled events of one project after `pos`, for a client that resumes: what the stream
/// replays goes back `EVENT_DAYS` (30), though a kept run's journal goes back to its start.
pub(super) async fn backlog(db: &Db, org: OrgId, project: ProjectId, pos: Position) -> Result<Vec<StreamEvent>, sqlx::Error> {
    let sql = format!(
        "SELECT {COLUMNS} FROM run_events WHERE org_id = $1 AND project_id = $2 AND (xid, event_id) > ($3::text::xid8, $4) \
           AND xid < (SELECT shopfloor_event_horizon()) AND at > now() - make_interval(days => {}) ORDER BY xid, event_id LIMIT $5",
        engine::store::retention::EVENT_DAYS
    );
    let rows: Vec<EventRow> = sqlx::query_as(&sql).bind(org).bind(project).bind(pos.xid.to_string()).bind(pos.event).bind(BATCH).fetch_all(db).await?;
    Ok(rows.into_iter().filter_map(EventRow::settled).collect())
}
