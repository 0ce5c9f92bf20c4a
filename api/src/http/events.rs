//! Run events: the per-replica hub that follows `run_events`, and the project stream
//! (`GET …/projects/{project}/events`, Server-Sent Events, resumable with `Last-Event-ID`).
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

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use chrono::{DateTime, Utc};
use engine::ids::{OrgId, ProjectId, RunId, StepId};
use engine::listen::{Listener, Target};
use engine::store::{Notice, NOTIFY_CHANNEL};
use futures::Stream;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use engine::db::Db;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::{CancellationToken, DropGuard};
use utoipa::{IntoParams, ToSchema};

use super::auth::Role;
use super::error::ApiError;
use super::extract::Query;
use super::tenant::ProjectScope;
use super::AppState;

/// Rows read per query, by the hub and by a resuming client.
const BATCH: i64 = 500;
/// Events a slow client may fall behind before it resumes from the database.
const CHANNEL: usize = 4096;

/// A place in the project stream: `(xid, event_id)` of the event last seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    xid: u64,
    event: i64,
}

impl Position {
    pub fn parse(s: &str) -> Option<Position> {
        let (xid, event) = s.trim().split_once('.')?;
        Some(Position { xid: xid.parse().ok()?, event: event.parse().ok()? })
    }
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.xid, self.event)
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
    project: ProjectId,
    pos: Position,
    /// Of a dry run or a child run: those do not announce themselves on the project's stream
    /// (nor to outgoing webhooks); their own journal still has every event.
    quiet: bool,
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
async fn horizon(db: &Db) -> Result<Position, sqlx::Error> {
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
    logs: broadcast::Sender<RunId>,
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

/// The console's live transcripts: the runs whose step logs grew, and the signal that the
/// replica shuts down (a transcript stream ends then, like the event streams).
pub fn log_feed(state: &AppState) -> (broadcast::Receiver<RunId>, tokio_util::sync::WaitForCancellationFutureOwned) {
    (state.shared.events.logs.subscribe(), state.shared.closing.clone().cancelled_owned())
}

/// Whether a notification may mean a step became ready now (`w0`; an unknown payload too).
fn may_be_ready(payload: &str) -> bool {
    matches!(Notice::parse(payload), Notice::Wake(d) if d.is_zero())
}

async fn follow(
    db: Db,
    target: Target,
    tx: broadcast::Sender<Arc<StreamEvent>>,
    pos: Arc<tokio::sync::Mutex<Option<Position>>>,
    ready: watch::Sender<u64>,
    logs: broadcast::Sender<RunId>,
    stop: CancellationToken,
) {
    let mut backoff = Duration::from_secs(1);
    let mut listener = Listener::new(&target, NOTIFY_CHANNEL);
    loop {
        let subscribed = tokio::select! {
            () = stop.cancelled() => return,
            s = listener.subscribe() => s,
        };
        if let Err(e) = subscribed {
            tracing::warn!(error = %e, retry_in_s = backoff.as_secs(), "event hub cannot LISTEN; retrying");
            if pause(&stop, &mut backoff).await {
                return;
            }
            continue;
        }
        backoff = Duration::from_secs(1);
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

/// Sleeps for the backoff (doubling, 1 s to 60 s); true when stopped meanwhile.
async fn pause(stop: &CancellationToken, backoff: &mut Duration) -> bool {
    let wait = *backoff;
    *backoff = (*backoff * 2).min(Duration::from_secs(60));
    tokio::select! {
        () = stop.cancelled() => true,
        () = tokio::time::sleep(wait) => false,
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
async fn backlog(db: &Db, org: OrgId, project: ProjectId, pos: Position) -> Result<Vec<StreamEvent>, sqlx::Error> {
    let sql = format!(
        "SELECT {COLUMNS} FROM run_events WHERE org_id = $1 AND project_id = $2 AND (xid, event_id) > ($3::text::xid8, $4) \
           AND xid < (SELECT shopfloor_event_horizon()) AND at > now() - make_interval(days => {}) ORDER BY xid, event_id LIMIT $5",
        engine::store::retention::EVENT_DAYS
    );
    let rows: Vec<EventRow> = sqlx::query_as(&sql).bind(org).bind(project).bind(pos.xid.to_string()).bind(pos.event).bind(BATCH).fetch_all(db).await?;
    Ok(rows.into_iter().filter_map(EventRow::settled).collect())
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    /// Where to resume, for clients that cannot send the `Last-Event-ID` header.
    pub last_event_id: Option<String>,
}

/// One client of the stream.
struct Client {
    db: Db,
    org: OrgId,
    project: ProjectId,
    rx: broadcast::Receiver<Arc<StreamEvent>>,
    pos: Position,
    queue: VecDeque<StreamEvent>,
    catch_up: bool,
    /// This stream's place among its token's (`limits`), given back when the body is dropped:
    /// the client went away, the stream ended, or the server is closing.
    _place: super::limits::StreamSlot,
}

fn sse(pos: Position, event: &RunEvent) -> Event {
    Event::default().id(pos.to_string()).event(event.kind.clone()).json_data(event).unwrap_or_else(|_| Event::default().comment("unserializable event"))
}

async fn next_event(mut c: Client) -> Option<(Result<Event, Infallible>, Client)> {
    loop {
        if let Some(e) = c.queue.pop_front() {
            // A quiet event still moves the client on, or its catch-up would read it again.
            c.pos = e.pos;
            if e.quiet {
                continue;
            }
            return Some((Ok(sse(e.pos, &e.event)), c));
        }
        if c.catch_up {
            // Polled outside the request that opened it: the stream acts for its org itself.
            match engine::tenancy::scoped(Some(c.org), backlog(&c.db, c.org, c.project, c.pos)).await {
                Ok(events) => {
                    c.catch_up = events.len() as i64 == BATCH;
                    c.queue.extend(events);
                    continue;
                }
                Err(e) => {
                    // The client reconnects with its Last-Event-ID and loses nothing.
                    tracing::warn!(error = %e, "event stream cannot read its backlog; closing it");
                    return None;
                }
            }
        }
        match c.rx.recv().await {
            Ok(e) if e.org == c.org && e.project == c.project && e.pos > c.pos => {
                c.pos = e.pos;
                if !e.quiet {
                    return Some((Ok(sse(e.pos, &e.event)), c));
                }
            }
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => c.catch_up = true,
            Err(broadcast::error::RecvError::Closed) => return None,
        }
    }
}

/// The project's run events as Server-Sent Events.
///
/// Each event's `id` is its stream position, its `event` the kind (`run.started`,
/// `run.awaiting`, `step.succeeded`, …) and its `data` a `RunEvent` as JSON. Reconnect with
/// `Last-Event-ID` (or `?last_event_id=`) to resume after the last event seen; without it the
/// stream starts with the events committed from now on.
#[utoipa::path(
    get,
    path = "/orgs/{org}/projects/{project}/events", operation_id = "stream_project_events",
    tag = "events",
    params(("org" = String, Path, description = "Org slug"), ("project" = String, Path, description = "Project slug"),
           ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event"), StreamQuery),
    responses((status = 200, description = "A stream of `RunEvent`s", content_type = "text/event-stream", body = RunEvent),
              (status = 429, description = "The token already holds as many open streams as it may (`SHOPFLOOR_STREAMS_PER_TOKEN`)", body = super::Problem, content_type = "application/problem+json")),
)]
pub async fn stream(
    State(state): State<AppState>,
    scope: ProjectScope,
    headers: HeaderMap,
    Query(q): Query<StreamQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    scope.require(Role::Viewer)?;
    let place = state.limits().open_stream(scope.org.caller.jti)?;
    let given = headers.get("last-event-id").map(|v| v.to_str().unwrap_or("?").to_owned()).or(q.last_event_id);
    let resume = match given {
        Some(text) => Some(Position::parse(&text).ok_or_else(|| ApiError::BadRequest("Last-Event-ID is not a position of this stream".into()))?),
        None => None,
    };
    // Subscribe before reading anything, so no event falls between the backlog and the feed.
    let rx = state.shared.events.subscribe().await?;
    let pos = match resume {
        Some(p) => p,
        None => horizon(&state.db).await?,
    };
    let client = Client { db: state.db.clone(), org: scope.org.org, project: scope.project, rx, pos, queue: VecDeque::new(), catch_up: true, _place: place };
    let closing = state.shared.closing.clone().cancelled_owned();
    let events = futures::StreamExt::take_until(futures::stream::unfold(client, next_event), closing);
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}
