//! The project stream (`GET …/projects/{project}/events`, Server-Sent Events, resumable with
//! `Last-Event-ID`), fed by the replica's hub (`event_hub`): a client reads its backlog from the
//! database, then follows the hub's feed, and reads again only when it falls behind.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use engine::db::Db;
use engine::ids::{OrgId, ProjectId, RunId};
use engine::sealing::SecretKey;
use futures::Stream;
use serde::Deserialize;
use tokio::sync::broadcast;
use utoipa::IntoParams;

use super::AppState;
use super::auth::Role;
use super::error::ApiError;
use super::event_hub::{BATCH, Position, RunEvent, StreamEvent, backlog, horizon};
use super::extract::Query;
use super::stream_access::StreamAccess;
use super::tenant::ProjectScope;

/// The console's live transcripts: the runs whose step logs grew, and the signal that the
/// replica shuts down (a transcript stream ends then, like the event streams).
pub fn log_feed(state: &AppState) -> (broadcast::Receiver<RunId>, tokio_util::sync::WaitForCancellationFutureOwned) {
    (state.shared.events.logs.subscribe(), state.shared.closing.clone().cancelled_owned())
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    /// Where to resume, for clients that cannot send the `Last-Event-ID` header: an event's
    /// `id`, or `0` for the start of what the stream keeps (30 days).
    pub last_event_id: Option<String>,
}

/// One client of the stream.
struct Client {
    db: Db,
    org: OrgId,
    project: ProjectId,
    /// Seals the positions given out as ids.
    key: SecretKey,
    rx: broadcast::Receiver<Arc<StreamEvent>>,
    pos: Position,
    queue: VecDeque<StreamEvent>,
    catch_up: bool,
    access: StreamAccess,
}

fn sse(c: &Client, pos: Position, event: &RunEvent) -> Event {
    Event::default()
        .id(pos.to_id(&c.key, c.project))
        .event(event.kind.clone())
        .json_data(event)
        .unwrap_or_else(|_| Event::default().comment("unserializable event"))
}

async fn next_event(mut c: Client) -> Option<(Result<Event, Infallible>, Client)> {
    loop {
        if !c.queue.is_empty() && !c.access.still_allowed(&c.db, c.org).await {
            return None;
        }
        if let Some(e) = c.queue.pop_front() {
            // A quiet event still moves the client on, or its catch-up would read it again.
            c.pos = e.pos;
            if e.quiet {
                continue;
            }
            return Some((Ok(sse(&c, e.pos, &e.event)), c));
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
                    if !c.access.still_allowed(&c.db, c.org).await {
                        return None;
                    }
                    return Some((Ok(sse(&c, e.pos, &e.event)), c));
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
/// Each event's `id` is its position in this project's stream, opaque (it resumes only this
/// project's stream and is the same on every connection), its `event` the kind (`run.started`,
/// `run.awaiting`, `step.succeeded`, …) and its `data` a `RunEvent` as JSON. Reconnect with
/// `Last-Event-ID` (or `?last_event_id=`) to resume after the last event seen, or `0` to replay
/// the 30 days the stream keeps; without it the stream starts with the events committed from
/// now on.
#[utoipa::path(
    get,
    path = "/orgs/{org}/projects/{project}/events", operation_id = "stream_project_events",
    tag = "events",
    params(ProjectScope,
           ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event (its `id`), or `0` for the start"), StreamQuery),
    responses((status = 200, description = "A stream of `RunEvent`s", content_type = "text/event-stream", body = RunEvent),
              (status = 429, description = "The token already holds as many open streams as it may (`SHOPFLOOR_STREAMS_PER_TOKEN`)")),
)]
pub async fn stream(
    State(state): State<AppState>, scope: ProjectScope, headers: HeaderMap, Query(q): Query<StreamQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    scope.require(Role::Viewer)?;
    let access = StreamAccess::open(&state, &scope.org.caller)?;
    let given = headers.get("last-event-id").map(|v| v.to_str().unwrap_or("?").to_owned()).or(q.last_event_id);
    let resume = match given {
        Some(text) if text.trim() == "0" => Some(Position::START),
        Some(text) => Some(
            Position::from_id(&text, state.secret_key(), scope.project)
                .ok_or_else(|| ApiError::BadRequest("Last-Event-ID is not a position of this stream (an event's id, or 0 for the start)".into()))?,
        ),
        None => None,
    };
    // Subscribe before reading anything, so no event falls between the backlog and the feed.
    let rx = state.shared.events.subscribe().await?;
    let pos = match resume {
        Some(p) => p,
        None => horizon(&state.db).await?,
    };
    let client = Client {
        db: state.db.clone(),
        org: scope.org.org,
        project: scope.project,
        key: state.secret_key().clone(),
        rx,
        pos,
        queue: VecDeque::new(),
        catch_up: true,
        access,
    };
    let closing = state.shared.closing.clone().cancelled_owned();
    let events = futures::StreamExt::take_until(futures::stream::unfold(client, next_event), closing);
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}
