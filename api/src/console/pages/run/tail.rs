//! The transcript section of the run page: the last lines of the running (else the latest)
//! crew step's transcript, with its session's figures and the form that talks to it, and the
//! live transcript itself (Server-Sent Events, `transcript`).

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use engine::db::Db;
use engine::ids::{OrgId, RunId, StepId};
use futures::Stream;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::super::here;
use super::{StepPath, run_id};
use crate::console::session::OrgSession;
use crate::console::transcript;
use crate::console::{Console, ConsoleError};
use crate::http::auth::Role;
use crate::http::runs::RunDetail;
use crate::http::stream_access::StreamAccess;

/// The last lines of a step's transcript ($1 step, $2 org, $3 how many).
pub(crate) const TRANSCRIPT_SQL: &str = "SELECT seq, at, stream, line FROM (SELECT seq, at, stream, line FROM step_logs \
     WHERE step_id = $1 AND org_id = $2 ORDER BY seq DESC LIMIT $3) t ORDER BY seq";

/// Lines after a sequence number ($1 step, $2 org, $3 after, $4 how many).
pub(crate) const TRANSCRIPT_AFTER_SQL: &str =
    "SELECT seq, at, stream, line FROM step_logs WHERE step_id = $1 AND org_id = $2 AND seq > $3 ORDER BY seq LIMIT $4";

const TRANSCRIPT_LINES: i64 = 300;

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
struct Line {
    seq: i64,
    at: DateTime<Utc>,
    stream: String,
    line: String,
    /// The line as people read it (`transcript::show`): its kind and its text.
    #[sqlx(skip)]
    kind: &'static str,
    #[sqlx(skip)]
    text: String,
}

impl Line {
    /// Fills in what the line shows.
    fn shown(mut self) -> Line {
        let s = transcript::show(&self.stream, &self.line);
        self.kind = s.kind;
        self.text = s.text;
        self
    }
}

/// The transcript section: the running crew step's lines, else the latest crew step's; none
/// for a run with no crew step.
pub(super) async fn section(db: &Db, s: &OrgSession, org_id: OrgId, detail: &RunDetail, base: &str) -> Result<Option<Value>, ConsoleError> {
    let crew = detail
        .steps
        .iter()
        .rev()
        .find(|st| st.kind == "crew" && matches!(st.state.as_str(), "running" | "leased"))
        .or_else(|| detail.steps.iter().rev().find(|st| st.kind == "crew"));
    let transcript = match crew {
        Some(st) => {
            let lines: Vec<Line> = sqlx::query_as(TRANSCRIPT_SQL).bind(st.id).bind(org_id).bind(TRANSCRIPT_LINES).fetch_all(db).await?;
            let lines: Vec<Line> = lines.into_iter().map(Line::shown).collect();
            let last = lines.last().map_or(0, |l| l.seq);
            let live = matches!(st.state.as_str(), "running" | "leased");
            // Intervene: a member may tell a running session something (the REST route says
            // when its harness cannot take it).
            let can_say = s.can(Role::Member) && st.state == "running";
            let figures = st.session.as_ref().map(|s| {
                json!({
                    "model": s.model, "input_tokens": s.input_tokens, "output_tokens": s.output_tokens,
                    "output_tokens_lower_bound": s.output_tokens_lower_bound, "cost_usd": s.cost_usd,
                    "estimated_cost_usd": s.estimated_cost_usd, "estimate_basis": s.estimate_basis, "turns": s.turns,
                })
            });
            Some(json!({
                "step": st.id.to_string(), "node": st.node, "state": st.state, "live": live, "lines": lines, "last": last,
                "stream": format!("{base}/steps/{}/transcript?after={last}", st.id), "figures": figures,
                "can_say": can_say, "say": format!("{base}/steps/{}/messages", st.id),
            }))
        }
        None => None,
    };
    Ok(transcript)
}

#[derive(Debug, Deserialize, Default)]
pub(in crate::console) struct After {
    after: Option<i64>,
}

/// One client of a live transcript.
struct Tail {
    db: engine::db::Db,
    org: engine::ids::OrgId,
    run: RunId,
    step: StepId,
    after: i64,
    queue: VecDeque<Line>,
    catch_up: bool,
    rx: tokio::sync::broadcast::Receiver<RunId>,
    /// The session token's place among its streams, checked again as lines are sent: a tail
    /// ends once the person signs out, is removed from the org or the token is revoked.
    access: StreamAccess,
}

fn line_event(l: &Line) -> Event {
    let shown = transcript::show(&l.stream, &l.line);
    Event::default()
        .id(l.seq.to_string())
        .event("line")
        .json_data(json!({ "seq": l.seq, "stream": l.stream, "kind": shown.kind, "text": shown.text }))
        .unwrap_or_else(|_| Event::default().comment("unserializable line"))
}

async fn next_line(mut t: Tail) -> Option<(Result<Event, Infallible>, Tail)> {
    loop {
        if !t.queue.is_empty() && !t.access.still_allowed(&t.db, t.org).await {
            return None;
        }
        if let Some(l) = t.queue.pop_front() {
            t.after = l.seq;
            return Some((Ok(line_event(&l)), t));
        }
        if t.catch_up {
            let read = sqlx::query_as(TRANSCRIPT_AFTER_SQL).bind(t.step).bind(t.org).bind(t.after).bind(500_i64).fetch_all(&t.db);
            // Polled outside the request that opened it: the tail acts for its org itself.
            let lines: Result<Vec<Line>, _> = engine::tenancy::scoped(Some(t.org), read).await;
            match lines {
                Ok(lines) => {
                    t.catch_up = lines.len() == 500;
                    t.queue.extend(lines);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "transcript stream cannot read step logs; closing it");
                    return None;
                }
            }
        }
        match t.rx.recv().await {
            Ok(run) if run == t.run => t.catch_up = true,
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => t.catch_up = true,
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
        }
    }
}

/// The live transcript of a step: its lines after `?after=` (or `Last-Event-ID`) as
/// Server-Sent Events named `line`, then each new line as a session report stores it.
pub(in crate::console) async fn transcript(
    State(c): State<Console>, Path(p): Path<StepPath>, headers: HeaderMap, uri: Uri, Query(q): Query<After>,
) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    let not_found = || ConsoleError::NotFound("step not found".into());
    let run = run_id(&p.run)?;
    let step: StepId = p.step.parse().map_err(|_| not_found())?;
    let found: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM steps s JOIN runs r ON r.run_id = s.run_id JOIN projects p ON p.project_id = r.project_id \
         WHERE s.step_id = $1 AND s.run_id = $2 AND s.org_id = $3 AND r.org_id = $3 AND p.slug = $4 AND ($5::uuid IS NULL OR r.project_id = $5)",
    )
    .bind(step)
    .bind(run)
    .bind(s.caller.org)
    .bind(&p.project)
    .bind(s.caller.project.map(|p| p.0))
    .fetch_optional(c.db())
    .await?;
    found.ok_or_else(not_found)?;
    let access = StreamAccess::open(c.state(), &s.caller)?;
    let last = headers.get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<i64>().ok());
    // Subscribe before reading, so no line falls between the backlog and the feed.
    let (rx, closing) = crate::http::events::log_feed(c.state());
    let tail = Tail {
        db: c.db().clone(),
        org: s.caller.org,
        run,
        step,
        after: last.or(q.after).unwrap_or(0).max(0),
        queue: VecDeque::new(),
        catch_up: true,
        rx,
        access,
    };
    let lines = futures::StreamExt::take_until(futures::stream::unfold(tail, next_line), closing);
    Ok(sse(lines))
}

fn sse<S: Stream<Item = Result<Event, Infallible>> + Send + 'static>(s: S) -> Response {
    Sse::new(s).keep_alive(KeepAlive::default()).into_response()
}
