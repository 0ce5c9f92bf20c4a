//! The run page: a headline in words, the forecast of the time left, the steps as a journal, a
//! waterfall and the graph, the live transcript of a crew step, and the forms that act on the
//! run (approve, reject, cancel, retry, rerun, rerun from a node, and a message to a running
//! crew session).
//!
//! The run, its steps, open approvals, `why` and events come from the REST API in-process;
//! the forecast, the sessions' figures, the transcript and the graph's definition are read
//! here, each with one indexed statement. Every form posts back here and acts through the REST
//! route of the same name; an approval's answer is checked field by field first (with the
//! store's own `check_answer`) so that every message shows at once beside its field.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;

use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use engine::ids::{RunId, StepId, WorkflowId};
use engine::store::approvals::check_answer;
use futures::Stream;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::super::internal::Refusal;
use super::super::people;
use super::super::transcript;
use super::super::session::OrgSession;
use super::super::svg::{self, Bar, symbol};
use super::super::view::{self, Page};
use super::super::{Console, ConsoleError};
use super::{FormMap, here, see_other};
use crate::http::auth::Role;
use crate::http::runs::{OpenApproval, RunDetail, RunEventList, Why};

#[derive(Debug, Deserialize)]
pub(in super::super) struct RunPath {
    org: String,
    project: String,
    run: String,
}

#[derive(Debug, Deserialize)]
pub(in super::super) struct NodePath {
    org: String,
    project: String,
    run: String,
    node: String,
}

#[derive(Debug, Deserialize)]
pub(in super::super) struct StepPath {
    org: String,
    project: String,
    run: String,
    step: String,
}

/// The earlier completed runs of the workflow (up to 20) and the median time of each node in
/// them ($1 workflow, $2 org, $3 this run).
pub(crate) const FORECAST_SQL: &str = "WITH earlier AS ( \
       SELECT run_id, created_at, ended_at FROM runs \
       WHERE workflow_id = $1 AND org_id = $2 AND status = 'completed' AND NOT dry_run AND run_id <> $3 \
       ORDER BY ended_at DESC LIMIT 20) \
     SELECT s.node, (percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM s.ended_at - s.created_at)))::float8 AS secs, \
            (SELECT count(*) FROM earlier) AS runs, \
            (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM ended_at - created_at)) FROM earlier)::float8 AS total \
     FROM earlier e JOIN steps s ON s.run_id = e.run_id \
     WHERE s.org_id = $2 AND s.state = 'succeeded' AND s.ended_at IS NOT NULL AND s.reused_from IS NULL \
     GROUP BY s.node";

/// The figures of the run's crew sessions ($1 run, $2 org).
pub(crate) const SESSIONS_SQL: &str = "SELECT step_id, model, input_tokens, output_tokens, output_tokens_lower_bound, cost_usd::float8 AS cost_usd, \
            estimated_cost_usd::float8 AS estimated_cost_usd, estimate_basis, turns, tool_calls \
     FROM step_sessions WHERE run_id = $1 AND org_id = $2";

/// The last lines of a step's transcript ($1 step, $2 org, $3 how many).
pub(crate) const TRANSCRIPT_SQL: &str = "SELECT seq, at, stream, line FROM (SELECT seq, at, stream, line FROM step_logs \
     WHERE step_id = $1 AND org_id = $2 ORDER BY seq DESC LIMIT $3) t ORDER BY seq";

/// Lines after a sequence number ($1 step, $2 org, $3 after, $4 how many).
pub(crate) const TRANSCRIPT_AFTER_SQL: &str = "SELECT seq, at, stream, line FROM step_logs WHERE step_id = $1 AND org_id = $2 AND seq > $3 ORDER BY seq LIMIT $4";

/// The run's answered approvals, oldest first ($1 run, $2 org).
pub(crate) const DECISIONS_SQL: &str = "SELECT node, decision, answer, decided_by, decided_at FROM approvals \
     WHERE run_id = $1 AND org_id = $2 AND decision IS NOT NULL ORDER BY decided_at";

const TRANSCRIPT_LINES: i64 = 300;

/// An answered approval: who decided, how, and what they entered.
#[derive(Debug, sqlx::FromRow)]
struct DecisionRow {
    node: String,
    decision: String,
    answer: Option<Value>,
    decided_by: Option<String>,
    decided_at: Option<DateTime<Utc>>,
}

#[derive(Debug, sqlx::FromRow)]
struct NodeTime {
    node: String,
    secs: Option<f64>,
    runs: i64,
    total: Option<f64>,
}

#[derive(Debug, Serialize, sqlx::FromRow)]
struct Session {
    step_id: StepId,
    model: Option<String>,
    input_tokens: i64,
    output_tokens: i64,
    /// No result line counted the output tokens: shown as "at least".
    output_tokens_lower_bound: bool,
    cost_usd: Option<f64>,
    /// The host's estimate, shown ("≈ $0.42 estimated") while no cost was reported.
    estimated_cost_usd: Option<f64>,
    estimate_basis: Option<String>,
    turns: i32,
    tool_calls: i32,
}

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

/// What a failed form leaves on the page: messages per approval field, the values typed, and
/// one message per form.
#[derive(Debug, Default)]
struct Feedback {
    /// node → field → message
    fields: HashMap<String, HashMap<String, String>>,
    /// node → field → value typed
    values: HashMap<String, HashMap<String, String>>,
    /// form → message (`approve:<node>`, `reject:<node>`, `cancel`, `retry`, `rerun`)
    forms: HashMap<String, String>,
}

#[derive(Debug, Serialize)]
struct FieldView {
    name: String,
    id: String,
    kind: String,
    required: bool,
    options: Vec<String>,
    description: Option<String>,
    value: String,
    checked: bool,
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct ApprovalView {
    node: String,
    prompt: String,
    deadline: Option<DateTime<Utc>>,
    fields: Vec<FieldView>,
    error: Option<String>,
    reject_error: Option<String>,
}

#[derive(Debug, Serialize)]
struct StepView {
    id: String,
    node: String,
    kind: String,
    visit: i32,
    attempt: i32,
    state: String,
    symbol: &'static str,
    class: &'static str,
    reason: Option<String>,
    exit_code: Option<i32>,
    reused: bool,
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    ended_at: Option<DateTime<Utc>>,
    secs: Option<f64>,
    session: Option<Session>,
}

fn run_id(text: &str) -> Result<RunId, ConsoleError> {
    text.parse()
        .map_err(|_| ConsoleError::NotFound("run not found".into()))
}

/// A reason in words with the machine string kept beside it (`(words, machine)`); a reason
/// with no words is its own words.
fn worded(reason: &str) -> (String, Option<String>) {
    match engine::reasons::words(reason) {
        Some(w) => (w, Some(reason.to_owned())),
        None => (reason.to_owned(), None),
    }
}

/// How a finished run ended, for people: the headline, then the sentence under it and the
/// machine reason it came from. A failure names the step that failed and why in words; a
/// stopped line names the node that would have run once too often and the failure that
/// looped back to it.
fn ending(detail: &RunDetail) -> (String, String, Option<String>) {
    let run = &detail.run;
    let reason = run.reason.as_deref().unwrap_or("");
    let failed: Vec<&crate::http::runs::Step> = detail.steps.iter().filter(|s| s.state == "failed").collect();
    let last_failure = || failed.iter().max_by_key(|s| s.ended_at).copied();
    let step_words = |st: &crate::http::runs::Step| {
        let why = st.reason.as_deref().map(|r| worded(r).0).or_else(|| st.exit_code.map(|c| format!("The command exited with code {c}")));
        match why {
            Some(w) => format!("{} ({}) failed: {w}.", st.node, st.kind),
            None => format!("{} ({}) failed.", st.node, st.kind),
        }
    };
    let machine = run.reason.clone();
    match run.status.as_str() {
        "completed" if reason == engine::walk::ENDED => ("Completed".into(), "Ended by an end node.".into(), machine),
        "completed" => ("Completed".into(), "Every step that could run has finished.".into(), machine),
        "cancelled" => {
            let why = reason.strip_prefix("cancelled: ").unwrap_or(reason).trim();
            if why.is_empty() {
                ("Cancelled".into(), "Cancelled by a person or the API, with no reason given.".into(), machine)
            } else {
                let (w, _) = worded(why);
                (format!("Cancelled: {w}"), format!("{w}."), machine)
            }
        }
        _ => {
            if let Some(node) = reason.strip_prefix(engine::walk::STOPPED_LINE_PREFIX) {
                let before = last_failure().map(|st| format!(" The last failure before it: {}", step_words(st))).unwrap_or_default();
                let text = format!("{node} would have run more often than the workflow allows (its stop-the-line limit).{before}");
                return (format!("Stopped the line at {node}"), text, machine);
            }
            let at = failed.iter().find(|s| s.reason.as_deref() == Some(reason)).copied().or_else(last_failure);
            let (w, _) = worded(reason);
            match at {
                Some(st) if reason == engine::walk::ENDED => (format!("Failed: ended by {}", st.node), "An end node ended the run as failed.".into(), machine),
                Some(st) if reason == engine::walk::ATTEMPTS_EXHAUSTED || reason.is_empty() => {
                    (format!("Failed at {}", st.node), step_words(st), machine)
                }
                Some(st) => (format!("Failed at {}: {w}", st.node), step_words(st), machine),
                None if reason.is_empty() => ("Failed".into(), String::new(), machine),
                None => (format!("Failed: {w}"), format!("{w}."), machine),
            }
        }
    }
}

/// The headline: what the run is doing now, or how it ended, in words.
fn headline(why: &Why, detail: &RunDetail) -> (String, &'static str) {
    let d = why.detail.as_ref();
    let s = |k: &str| {
        d.and_then(|d| d.get(k))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    match why.status.as_str() {
        "completed" => (ending(detail).0, "ok"),
        "cancelled" => (ending(detail).0, "off"),
        "failed" => (ending(detail).0, "bad"),
        _ => {
            let text = match why.substate.as_deref() {
                Some("awaiting_signal")
                    if d.and_then(|d| d.get("approval")).and_then(Value::as_bool) == Some(true) =>
                {
                    match s("node").as_deref() {
                        Some("$start") | None => "Waiting for approval to start".into(),
                        Some(node) => format!("Waiting for approval at {node}"),
                    }
                }
                Some("awaiting_signal") => format!(
                    "Waiting for {}",
                    s("signal").unwrap_or_else(|| "a signal".into())
                ),
                Some("sleeping") => match s("until") {
                    Some(until) => format!("Asleep until {}", view::clock(&until)),
                    None => "Asleep".into(),
                },
                Some("unroutable") => {
                    let missing: Vec<String> = d
                        .and_then(|d| d.get("missing"))
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_owned)
                                .collect()
                        })
                        .unwrap_or_default();
                    if missing.is_empty() {
                        "Waiting for a host: no host can run this".into()
                    } else {
                        format!(
                            "Waiting for a host: none online with {}",
                            missing.join(", ")
                        )
                    }
                }
                Some("waiting_for_agent") => format!(
                    "Waiting for a host to run {}",
                    s("node").unwrap_or_default()
                ),
                Some("executing") => format!("Running {}", s("node").unwrap_or_default()),
                Some("awaiting_child") => "Waiting on another run".into(),
                Some("awaiting_lease") => {
                    format!("Waiting for the lock of {}", engine::reasons::group_words(&s("group").unwrap_or_default()))
                }
                Some("held") => format!("Held: {}", s("by").unwrap_or_default()),
                _ => "Queued".into(),
            };
            let tone = match why.substate.as_deref() {
                Some("executing") => "run",
                Some("unroutable") => "bad",
                _ => "wait",
            };
            (text, tone)
        }
    }
}

/// Links found in step outputs: a pull request's page, a branch.
fn output_links(detail: &RunDetail) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for s in &detail.steps {
        let Some(o) = &s.output else { continue };
        for key in ["html_url", "pull_request_url", "url"] {
            if let Some(u) = o
                .get(key)
                .and_then(Value::as_str)
                .filter(|u| u.starts_with("https://"))
            {
                out.push((u.to_owned(), format!("{} output", s.node)));
                break;
            }
        }
        if let Some(b) = o.get("branch").and_then(Value::as_str) {
            out.push((String::new(), format!("branch {b}")));
        }
    }
    out.dedup();
    out
}

fn approval_views(approvals: &[OpenApproval], fb: &Feedback) -> Vec<ApprovalView> {
    approvals
        .iter()
        .map(|a| {
            let empty = Map::new();
            let spec = a.fields.as_object().unwrap_or(&empty);
            let typed = fb.values.get(&a.node);
            let errors = fb.fields.get(&a.node);
            let fields =
                spec.iter()
                    .map(|(name, f)| {
                        let kind = f
                            .get("type")
                            .and_then(Value::as_str)
                            .unwrap_or("string")
                            .to_owned();
                        let default = f.get("default").filter(|d| !d.is_null());
                        let value =
                            typed.and_then(|t| t.get(name)).cloned().unwrap_or_else(
                                || match default {
                                    Some(Value::String(s)) => s.clone(),
                                    Some(v) => v.to_string(),
                                    None => String::new(),
                                },
                            );
                        let checked = match typed {
                            Some(t) => t.contains_key(name),
                            None => default.and_then(Value::as_bool).unwrap_or(false),
                        };
                        FieldView {
                            id: format!(
                                "f-{}-{}",
                                a.node.replace(|c: char| !c.is_ascii_alphanumeric(), "_"),
                                name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
                            ),
                            name: name.clone(),
                            required: f.get("required").and_then(Value::as_bool).unwrap_or(false),
                            options: f
                                .get("options")
                                .and_then(Value::as_array)
                                .map(|o| {
                                    o.iter()
                                        .filter_map(Value::as_str)
                                        .map(str::to_owned)
                                        .collect()
                                })
                                .unwrap_or_default(),
                            description: f
                                .get("description")
                                .and_then(Value::as_str)
                                .map(str::to_owned),
                            error: errors.and_then(|e| e.get(name)).cloned(),
                            value,
                            checked,
                            kind,
                        }
                    })
                    .collect();
            ApprovalView {
                node: a.node.clone(),
                prompt: a.prompt.clone(),
                deadline: a.deadline,
                fields,
                error: fb.forms.get(&format!("approve:{}", a.node)).cloned(),
                reject_error: fb.forms.get(&format!("reject:{}", a.node)).cloned(),
            }
        })
        .collect()
}

/// A one-line summary of an event's attributes.
fn summary(attrs: &Value) -> String {
    let Some(map) = attrs.as_object() else {
        return String::new();
    };
    let mut parts: Vec<String> = Vec::new();
    for (k, v) in map.iter().take(6) {
        let v = match v {
            Value::String(s) => s.chars().take(80).collect(),
            Value::Null => continue,
            Value::Object(_) | Value::Array(_) => continue,
            other => other.to_string(),
        };
        parts.push(format!("{k}: {v}"));
    }
    parts.join(", ")
}

async fn render(
    c: &Console,
    s: &OrgSession,
    org: &str,
    project: &str,
    run_text: &str,
    fb: &Feedback,
    status: StatusCode,
) -> Result<Response, ConsoleError> {
    let id = run_id(run_text)?;
    let base = format!("/orgs/{org}/projects/{project}/runs/{id}");
    let detail: RunDetail = c.read(&s.caller, &base).await?;
    // The run is in this project (the read above checked); `why` is the REST route's answer,
    // computed here without reading the run again.
    let why = engine::substate::why(c.db(), s.caller.org, id).await?;
    let why = Why {
        detail: why
            .substate
            .as_ref()
            .map(serde_json::to_value)
            .transpose()
            .map_err(ConsoleError::internal)?,
        substate: why.substate.as_ref().map(|x| x.name().to_owned()),
        status: why.status,
        reason: why.reason,
        words: why.words,
        text: why.text,
    };
    let events: RunEventList = c
        .read(&s.caller, &format!("{base}/events?limit=200"))
        .await?;
    let db = c.db();
    let org_id = s.caller.org;
    let now = Utc::now();

    // The definition, for the graph and the rerun-from choices.
    let workflow: Option<WorkflowId> =
        sqlx::query_scalar("SELECT w.workflow_id FROM workflows w JOIN projects p ON p.project_id = w.project_id WHERE w.org_id = $1 AND p.slug = $2 AND w.name = $3")
            .bind(org_id)
            .bind(project)
            .bind(&detail.run.workflow)
            .fetch_optional(db)
            .await?;
    let def = match workflow {
        Some(w) => {
            let mut conn = db.begin().await?;
            c.inner
                .catalog
                .get(&mut conn, w, detail.run.version)
                .await
                .ok()
        }
        None => None,
    };

    // The forecast: the median time of each node not yet done, from earlier runs.
    let times: Vec<NodeTime> = match workflow {
        Some(w) if detail.run.status == "running" => {
            sqlx::query_as(FORECAST_SQL)
                .bind(w)
                .bind(org_id)
                .bind(id)
                .fetch_all(db)
                .await?
        }
        _ => Vec::new(),
    };
    let forecast = if detail.run.status != "running" {
        None
    } else if times.is_empty() {
        Some("No forecast yet: no earlier run of this workflow has completed.".to_owned())
    } else {
        let mut left = 0.0;
        for t in &times {
            let Some(median) = t.secs else { continue };
            let latest = detail.steps.iter().rev().find(|st| st.node == t.node);
            match latest {
                Some(st) if st.state == "succeeded" || st.reused => {}
                Some(st) if st.ended_at.is_none() => {
                    let spent = (now - st.created_at).num_milliseconds() as f64 / 1000.0;
                    left += (median - spent).max(0.0);
                }
                _ => left += median,
            }
        }
        let runs = times[0].runs;
        let total = times[0]
            .total
            .map(|t| format!("; a whole run typically takes {}", view::duration(t)))
            .unwrap_or_default();
        let waits_on_person = why.substate.as_deref() == Some("awaiting_signal");
        let lead = if left < 1.0 {
            "Should finish any moment".to_owned()
        } else {
            format!("About {} left", view::duration(left))
        };
        let person = if waits_on_person {
            ", once a person answers"
        } else {
            ""
        };
        Some(format!(
            "{lead}{person} (median times from {runs} earlier run{}{total}).",
            if runs == 1 { "" } else { "s" }
        ))
    };

    let sessions: Vec<Session> = sqlx::query_as(SESSIONS_SQL)
        .bind(id)
        .bind(org_id)
        .fetch_all(db)
        .await?;
    let mut sessions: HashMap<StepId, Session> =
        sessions.into_iter().map(|s| (s.step_id, s)).collect();

    // The transcript: the running crew step's, else the latest crew step's.
    let crew = detail
        .steps
        .iter()
        .rev()
        .find(|st| st.kind == "crew" && matches!(st.state.as_str(), "running" | "leased"))
        .or_else(|| detail.steps.iter().rev().find(|st| st.kind == "crew"));
    let transcript = match crew {
        Some(st) => {
            let lines: Vec<Line> = sqlx::query_as(TRANSCRIPT_SQL)
                .bind(st.id)
                .bind(org_id)
                .bind(TRANSCRIPT_LINES)
                .fetch_all(db)
                .await?;
            let lines: Vec<Line> = lines.into_iter().map(Line::shown).collect();
            let last = lines.last().map_or(0, |l| l.seq);
            let live = matches!(st.state.as_str(), "running" | "leased");
            // Intervene: a member may tell a running session something (the REST route says
            // when its harness cannot take it).
            let can_say = s.can(Role::Member) && st.state == "running";
            let figures = sessions.get(&st.id).map(|s| json!({ "model": s.model, "input_tokens": s.input_tokens, "output_tokens": s.output_tokens, "output_tokens_lower_bound": s.output_tokens_lower_bound, "cost_usd": s.cost_usd, "estimated_cost_usd": s.estimated_cost_usd, "estimate_basis": s.estimate_basis, "turns": s.turns }));
            Some(json!({
                "step": st.id.to_string(), "node": st.node, "state": st.state, "live": live, "lines": lines, "last": last,
                "stream": format!("{base}/steps/{}/transcript?after={last}", st.id), "figures": figures,
                "can_say": can_say, "say": format!("{base}/steps/{}/messages", st.id),
            }))
        }
        None => None,
    };

    let mut states: HashMap<String, String> = HashMap::new();
    let steps: Vec<StepView> = detail
        .steps
        .iter()
        .map(|st| {
            states.insert(st.node.clone(), st.state.clone());
            let (sym, class) = symbol(&st.state);
            let start = st.started_at.unwrap_or(st.created_at);
            StepView {
                id: st.id.to_string(),
                node: st.node.clone(),
                kind: st.kind.clone(),
                visit: st.visit,
                attempt: st.attempt,
                state: st.state.clone(),
                symbol: sym,
                class,
                reason: st.reason.clone(),
                exit_code: st.exit_code,
                reused: st.reused,
                created_at: st.created_at,
                started_at: st.started_at,
                ended_at: st.ended_at,
                secs: Some(
                    (st.ended_at.unwrap_or(now) - start)
                        .num_milliseconds()
                        .max(0) as f64
                        / 1000.0,
                ),
                session: sessions.remove(&st.id),
            }
        })
        .collect();
    let bars: Vec<Bar<'_>> = detail
        .steps
        .iter()
        .map(|st| Bar {
            label: if st.attempt > 1 || st.visit > 1 {
                format!("{} (visit {}, attempt {})", st.node, st.visit, st.attempt)
            } else {
                st.node.clone()
            },
            state: &st.state,
            start: st.started_at.unwrap_or(st.created_at),
            end: st.ended_at,
        })
        .collect();
    let run_end = detail.run.ended_at.unwrap_or(now);
    let waterfall = if bars.is_empty() {
        String::new()
    } else {
        svg::waterfall(&bars, detail.run.created_at, run_end, now)
    };
    let graph = def
        .as_deref()
        .map(|d| svg::graph(d, &states))
        .unwrap_or_default();
    // The crew nodes an edit-and-retry can change, the failed one first, with what they run now.
    let failed_crew: Vec<&str> = detail.steps.iter().filter(|st| st.kind == "crew" && st.state == "failed").map(|st| st.node.as_str()).collect();
    let mut crews: Vec<Value> = def
        .as_deref()
        .map(|d| {
            d.nodes
                .iter()
                .filter_map(|n| match &n.kind {
                    engine::definition::NodeKind::Crew(crew) => Some(json!({
                        "id": n.id.to_string(), "prompt": crew.prompt, "model": crew.model, "harness": crew.harness.name(),
                        "failed": failed_crew.contains(&n.id.to_string().as_str()),
                    })),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    crews.sort_by_key(|c| c["failed"] != true);
    let nodes: Vec<String> = def
        .as_deref()
        .map(|d| d.nodes.iter().map(|n| n.id.to_string()).collect())
        .unwrap_or_default();

    let (head, tone) = headline(&why, &detail);
    // A finished run's sentence is in words, with the machine reason beside it; a running
    // run's is the engine's explanation, already in words.
    let (why_text, why_machine) = if detail.run.status == "running" {
        (why.text.clone(), None)
    } else {
        let (_, text, machine) = ending(&detail);
        (text, machine)
    };
    let (head_symbol, _) = symbol(match tone {
        "ok" => "succeeded",
        "bad" => "failed",
        "off" => "cancelled",
        "run" => "running",
        _ => "waiting",
    });
    // Who decided each approval and what they entered, and every person the page names.
    let decided: Vec<DecisionRow> = sqlx::query_as(DECISIONS_SQL).bind(id).bind(org_id).fetch_all(db).await?;
    let mut actors: Vec<String> = decided.iter().filter_map(|d| d.decided_by.clone()).collect();
    actors.push(detail.run.created_by.clone());
    actors.extend(events.items.iter().filter_map(|e| e.attrs.get("by").and_then(Value::as_str).map(str::to_owned)));
    let names = people::names(db, org_id, actors).await?;
    let decisions: Vec<Value> = decided
        .iter()
        .map(|d| {
            let entered: Vec<(String, String)> = match &d.answer {
                Some(Value::Object(m)) => m
                    .iter()
                    .filter(|(k, _)| d.decision == "approved" || k.as_str() == "reason")
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_owned)))
                    .collect(),
                _ => Vec::new(),
            };
            let by = d.decided_by.as_deref().map(|b| names.get(b).cloned().unwrap_or_else(|| b.to_owned()));
            json!({ "node": d.node, "decision": d.decision, "by": by, "at": d.decided_at, "entered": entered })
        })
        .collect();
    let journal: Vec<Value> = events
        .items
        .iter()
        .map(|e| {
            let mut attrs = e.attrs.clone();
            if let Some(by) = attrs.get("by").and_then(Value::as_str).and_then(|b| names.get(b)) {
                attrs["by"] = Value::String(by.clone());
            }
            json!({ "seq": e.seq, "at": e.at, "kind": e.kind, "node": e.node, "summary": summary(&attrs) })
        })
        .collect();
    let created_by = names.get(&detail.run.created_by).cloned().unwrap_or_else(|| detail.run.created_by.clone());
    let projects = c.projects(s).await?;
    let mut page =
        Page::of(s, format!("{head} · {}", detail.run.id), "runs").project(project, projects);
    page.run = Some(detail.run.id.to_string());
    let finished = detail.run.status != "running";
    let member = s.can(Role::Member);
    let approvals = approval_views(&detail.approvals, fb);
    let can_cancel = member && !finished;
    let can_retry = member && matches!(detail.run.status.as_str(), "failed" | "cancelled");
    let can_rerun = member && finished;
    // Refusals of forms this page no longer shows (the run moved on, or the role cannot act)
    // are shown at the top.
    let shown = |key: &str| match key.split_once(':') {
        Some((_, node)) => member && approvals.iter().any(|a| a.node == node),
        None => match key {
            "cancel" => can_cancel,
            "retry" | "edit" => can_retry,
            "rerun" => can_rerun,
            "say" => transcript.as_ref().is_some_and(|t| t["can_say"] == true),
            _ => false,
        },
    };
    let notices: Vec<String> = fb
        .forms
        .iter()
        .filter(|(k, _)| !shown(k))
        .map(|(_, v)| v.clone())
        .collect();
    let html = c.render(
        "run.html",
        ctx! {
            page => page,
            run => detail.run,
            base => base,
            headline => head,
            tone => tone,
            head_symbol => head_symbol,
            why => why_text,
            why_machine => why_machine,
            forecast => forecast,
            steps => steps,
            journal => journal,
            decisions => decisions,
            created_by => created_by,
            more_events => events.next_after.is_some(),
            approvals => approvals,
            notices => notices,
            waterfall => minijinja::Value::from_safe_string(waterfall),
            graph => minijinja::Value::from_safe_string(graph),
            transcript => transcript,
            nodes => nodes,
            crews => crews,
            item => detail.run.item.as_deref().and_then(view::item_link),
            links => output_links(&detail),
            can_act => member,
            can_cancel => can_cancel,
            can_retry => can_retry,
            can_rerun => can_rerun,
            errors => fb.forms.clone(),
        },
    )?;
    Ok(view::html(status, html))
}

pub(in super::super) async fn page(
    State(c): State<Console>,
    Path(p): Path<RunPath>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    render(
        &c,
        &s,
        &p.org,
        &p.project,
        &p.run,
        &Feedback::default(),
        StatusCode::OK,
    )
    .await
}

/// A form's answer: on success, back to the run (or to the new run); on a refusal, the page
/// again with the message beside the form (422), nothing changed.
async fn answer(
    c: &Console,
    s: &OrgSession,
    p: &RunPath,
    form: &str,
    result: Result<Value, Refusal>,
    fb: Feedback,
) -> Result<Response, ConsoleError> {
    let base = format!("/orgs/{}/projects/{}/runs/{}", p.org, p.project, p.run);
    match result {
        Ok(v) => {
            // A retry or rerun answers the new run.
            let to = match v.get("id").and_then(Value::as_str) {
                Some(new) if new != p.run && new.starts_with("run-") => {
                    format!("/orgs/{}/projects/{}/runs/{new}", p.org, p.project)
                }
                _ => base,
            };
            Ok(see_other(&to))
        }
        Err(r) => {
            let mut fb = fb;
            fb.forms.insert(form.to_owned(), r.detail().to_owned());
            render(
                c,
                s,
                &p.org,
                &p.project,
                &p.run,
                &fb,
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await
        }
    }
}

/// Turns an approval form's text fields into the JSON answer, by the form's field types, with
/// a message per field that cannot be read or does not pass `check_answer`.
fn read_answer(
    spec: &Value,
    posted: &[(String, String)],
) -> (
    Map<String, Value>,
    HashMap<String, String>,
    HashMap<String, String>,
) {
    let empty = Map::new();
    let fields = spec.as_object().unwrap_or(&empty);
    let mut answer = Map::new();
    let mut errors = HashMap::new();
    let mut typed = HashMap::new();
    for (name, f) in fields {
        let Some(raw) = posted
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim().to_owned())
        else {
            continue;
        };
        typed.insert(name.clone(), raw.clone());
        let kind = f.get("type").and_then(Value::as_str).unwrap_or("string");
        match kind {
            "boolean" => {
                answer.insert(name.clone(), Value::Bool(true));
            }
            "number" if raw.is_empty() => {}
            "number" => match raw.parse::<f64>() {
                Ok(n) if n.is_finite() => {
                    let v = if n.fract() == 0.0 && n.abs() < 9e15 {
                        json!(n as i64)
                    } else {
                        json!(n)
                    };
                    answer.insert(name.clone(), v);
                }
                _ => {
                    errors.insert(name.clone(), format!("{name} must be a number"));
                }
            },
            _ if raw.is_empty() => {}
            _ => {
                answer.insert(
                    name.clone(),
                    Value::String(raw.chars().take(10_000).collect()),
                );
            }
        }
    }
    // Unchecked boxes are sent as nothing: they mean false.
    for (name, f) in fields {
        if f.get("type").and_then(Value::as_str) == Some("boolean") && !answer.contains_key(name) {
            answer.insert(name.clone(), Value::Bool(false));
        }
    }
    // Each field on its own, so that every message shows at once.
    for (name, f) in fields {
        if errors.contains_key(name) {
            continue;
        }
        let mut one_spec = Map::new();
        one_spec.insert(name.clone(), f.clone());
        let mut one = Map::new();
        if let Some(v) = answer.get(name) {
            one.insert(name.clone(), v.clone());
        }
        if let Err(message) = check_answer(&Value::Object(one_spec), &one) {
            errors.insert(
                name.clone(),
                message.replace("approval field ", "").replace('"', ""),
            );
        }
    }
    (answer, errors, typed)
}

pub(in super::super) async fn approve(
    State(c): State<Console>,
    Path(p): Path<NodePath>,
    headers: HeaderMap,
    uri: Uri,
    Form(form): Form<Vec<(String, String)>>,
) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    let posted_csrf = form
        .iter()
        .find(|(k, _)| k == "_csrf")
        .map(|(_, v)| v.as_str());
    s.check(&headers, posted_csrf)?;
    let run = RunPath {
        org: p.org.clone(),
        project: p.project.clone(),
        run: p.run.clone(),
    };
    let id = run_id(&p.run)?;
    let spec: Option<Value> = sqlx::query_scalar("SELECT fields FROM approvals WHERE org_id = $1 AND run_id = $2 AND node = $3 AND decision IS NULL")
        .bind(s.caller.org)
        .bind(id)
        .bind(&p.node)
        .fetch_optional(c.db())
        .await?;
    let fields: Vec<(String, String)> = form
        .into_iter()
        .filter(|(k, _)| !k.starts_with('_'))
        .collect();
    let (answer_json, errors, typed) = read_answer(spec.as_ref().unwrap_or(&Value::Null), &fields);
    let mut fb = Feedback::default();
    fb.values.insert(p.node.clone(), typed);
    if !errors.is_empty() {
        fb.forms.insert(
            format!("approve:{}", p.node),
            "Not approved yet: fix the fields marked below.".into(),
        );
        fb.fields.insert(p.node.clone(), errors);
        return render(
            &c,
            &s,
            &p.org,
            &p.project,
            &p.run,
            &fb,
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
    }
    let path = format!(
        "/orgs/{}/projects/{}/runs/{}/approvals/{}",
        p.org,
        p.project,
        p.run,
        view::urlencode(&p.node)
    );
    let result = c
        .call(
            &s.caller,
            Method::POST,
            &path,
            Some(Value::Object(answer_json)),
        )
        .await?;
    answer(&c, &s, &run, &format!("approve:{}", p.node), result, fb).await
}

pub(in super::super) async fn reject(
    State(c): State<Console>,
    Path(p): Path<NodePath>,
    headers: HeaderMap,
    uri: Uri,
    Form(form): Form<FormMap>,
) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    s.check(&headers, form.get("_csrf").map(String::as_str))?;
    let reason = form
        .get("reason")
        .map(|r| r.trim())
        .filter(|r| !r.is_empty());
    let path = format!(
        "/orgs/{}/projects/{}/runs/{}/approvals/{}/reject",
        p.org,
        p.project,
        p.run,
        view::urlencode(&p.node)
    );
    let result = c
        .call(
            &s.caller,
            Method::POST,
            &path,
            Some(json!({ "reason": reason })),
        )
        .await?;
    let run = RunPath {
        org: p.org.clone(),
        project: p.project.clone(),
        run: p.run.clone(),
    };
    answer(
        &c,
        &s,
        &run,
        &format!("reject:{}", p.node),
        result,
        Feedback::default(),
    )
    .await
}

pub(in super::super) async fn cancel(
    State(c): State<Console>,
    Path(p): Path<RunPath>,
    headers: HeaderMap,
    uri: Uri,
    Form(form): Form<FormMap>,
) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    s.check(&headers, form.get("_csrf").map(String::as_str))?;
    let reason = form
        .get("reason")
        .map(|r| r.trim())
        .filter(|r| !r.is_empty());
    let path = format!(
        "/orgs/{}/projects/{}/runs/{}/cancel",
        p.org, p.project, p.run
    );
    let result = c
        .call(
            &s.caller,
            Method::POST,
            &path,
            Some(json!({ "reason": reason })),
        )
        .await?;
    answer(&c, &s, &p, "cancel", result, Feedback::default()).await
}

pub(in super::super) async fn retry(
    State(c): State<Console>,
    Path(p): Path<RunPath>,
    headers: HeaderMap,
    uri: Uri,
    Form(form): Form<FormMap>,
) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    s.check(&headers, form.get("_csrf").map(String::as_str))?;
    let path = format!(
        "/orgs/{}/projects/{}/runs/{}/retry",
        p.org, p.project, p.run
    );
    // Edit-and-retry names a crew node and what to change; a plain retry sends no body.
    let text = |k: &str| form.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    let body = text("node").map(|node| {
        json!({ "node": node, "prompt": form.get("prompt").filter(|p| !p.trim().is_empty()), "model": text("model"), "harness": text("harness") })
    });
    let key = if body.is_some() { "edit" } else { "retry" };
    let result = c.call(&s.caller, Method::POST, &path, body).await?;
    answer(&c, &s, &p, key, result, Feedback::default()).await
}

pub(in super::super) async fn rerun(
    State(c): State<Console>,
    Path(p): Path<RunPath>,
    headers: HeaderMap,
    uri: Uri,
    Form(form): Form<FormMap>,
) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    s.check(&headers, form.get("_csrf").map(String::as_str))?;
    let from = form.get("from").map(|f| f.trim()).filter(|f| !f.is_empty());
    let mut path = format!(
        "/orgs/{}/projects/{}/runs/{}/rerun",
        p.org, p.project, p.run
    );
    if let Some(from) = from {
        path.push_str(&format!("?from={}", view::urlencode(from)));
    }
    let result = c.call(&s.caller, Method::POST, &path, None).await?;
    answer(&c, &s, &p, "rerun", result, Feedback::default()).await
}

/// Intervene: the form under a running crew step's transcript, posted to the REST route that
/// sends the message to the session.
pub(in super::super) async fn say(
    State(c): State<Console>,
    Path(p): Path<StepPath>,
    headers: HeaderMap,
    uri: Uri,
    Form(form): Form<FormMap>,
) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    s.check(&headers, form.get("_csrf").map(String::as_str))?;
    let text = form.get("text").map(String::as_str).unwrap_or_default();
    let path = format!(
        "/orgs/{}/projects/{}/runs/{}/steps/{}/messages",
        p.org,
        p.project,
        p.run,
        view::urlencode(&p.step)
    );
    let result = c
        .call(
            &s.caller,
            Method::POST,
            &path,
            Some(json!({ "text": text })),
        )
        .await?;
    let run = RunPath {
        org: p.org.clone(),
        project: p.project.clone(),
        run: p.run.clone(),
    };
    answer(&c, &s, &run, "say", result, Feedback::default()).await
}

#[derive(Debug, Deserialize, Default)]
pub(in super::super) struct After {
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
        if let Some(l) = t.queue.pop_front() {
            t.after = l.seq;
            return Some((Ok(line_event(&l)), t));
        }
        if t.catch_up {
            let read = sqlx::query_as(TRANSCRIPT_AFTER_SQL)
                .bind(t.step)
                .bind(t.org)
                .bind(t.after)
                .bind(500_i64)
                .fetch_all(&t.db);
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
pub(in super::super) async fn transcript(
    State(c): State<Console>,
    Path(p): Path<StepPath>,
    headers: HeaderMap,
    uri: Uri,
    Query(q): Query<After>,
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
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok());
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
    };
    let lines = futures::StreamExt::take_until(futures::stream::unfold(tail, next_line), closing);
    Ok(sse(lines))
}

fn sse<S: Stream<Item = Result<Event, Infallible>> + Send + 'static>(s: S) -> Response {
    Sse::new(s).keep_alive(KeepAlive::default()).into_response()
}
