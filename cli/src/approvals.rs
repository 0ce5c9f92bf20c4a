//! `shopfloor approve` and `reject`: the answer to an approval a run waits on, its fields
//! asked in turn on a terminal; and what `runs follow` shares with them.

use std::io::IsTerminal as _;

use clap::Args;
use serde_json::{Map, Value};

use super::error::ClientError;
use super::form::{self, Terminal};
use super::http::{Answer, Api, Body};
use super::model::{Approval, RunDetail, run_ref};
use super::sse;
use super::{Conn, say};

#[derive(Debug, Args)]
pub struct ApproveArgs {
    #[command(flatten)]
    conn: Conn,
    /// The run: `run-…`, or its full name `<org>:<project>:run-…`.
    run: String,
    /// The approval's node; needed only when the run waits on more than one (`$start` is the
    /// run-level approval of `approval: required`).
    node: Option<String>,
    /// A field of the form, `name=value`, typed as the form says. Repeat for more.
    #[arg(long = "field", value_name = "NAME=VALUE")]
    field: Vec<String>,
    /// Do not ask for the fields not given, even on a terminal.
    #[arg(long)]
    no_prompt: bool,
}

#[derive(Debug, Args)]
pub struct RejectArgs {
    #[command(flatten)]
    conn: Conn,
    /// The run: `run-…`, or its full name `<org>:<project>:run-…`.
    run: String,
    /// The approval's node; needed only when the run waits on more than one.
    node: Option<String>,
    /// Why: the run is cancelled with `rejected at <node>: <reason>` (`rejected at <node>`
    /// without one).
    #[arg(long)]
    reason: Option<String>,
}

/// The approval to answer: the one named, or the only one open.
pub(crate) fn pick<'a>(approvals: &'a [Approval], node: Option<&str>, run: &str) -> Result<&'a Approval, ClientError> {
    match node {
        Some(n) => approvals.iter().find(|a| a.node == n).ok_or_else(|| ClientError::Refused {
            status: 409,
            title: "Conflict".into(),
            detail: format!("no approval waits at `{n}` on {run}"),
            problems: Vec::new(),
        }),
        None => match approvals {
            [] => Err(ClientError::Refused { status: 409, title: "Conflict".into(), detail: format!("{run} waits on no approval"), problems: Vec::new() }),
            [one] => Ok(one),
            many => Err(ClientError::Usage(format!(
                "{run} waits on {} approvals; name one: {}",
                many.len(),
                many.iter().map(|a| a.node.as_str()).collect::<Vec<_>>().join(", ")
            ))),
        },
    }
}

pub(crate) async fn approve(args: ApproveArgs) -> Result<u8, ClientError> {
    let mut conn = args.conn;
    let id = run_ref(&mut conn, &args.run)?;
    let api = Api::connect(&conn)?;
    let detail = once_start_is_open(&api, &id, args.node.as_deref()).await?;
    let approval = pick(&detail.approvals, args.node.as_deref(), &id)?;
    let fields = form::fields(&approval.fields);
    let mut answer = form::given(&fields, &args.field)?;
    let interactive = !args.no_prompt && std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
    if interactive && fields.iter().any(|f| !answer.contains_key(&f.name)) {
        eprintln!("{} at {}: {}", id, approval.node, approval.prompt.trim());
        if form::ask(&fields, &mut answer, &mut Terminal).await.is_none() {
            return Err(ClientError::Failed("not answered: the run still waits".into()));
        }
    }
    let decision = send_approval(&api, &id, &approval.node, answer).await?;
    if conn.json {
        say!("{}", decision.text());
    } else {
        let d: Value = decision.value()?;
        say!("approved {} on {}{}", approval.node, id, answer_words(d.get("answer")));
    }
    Ok(0)
}

/// How long `approve` waits for the engine to open a new run's start approval.
const START_OPENS_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// The run, read once the start approval it waits for is open. A run of a workflow with
/// `approval: required` is "waiting for approval" from its submission, but the engine opens
/// its `$start` approval a moment later: without this wait, `RUN=$(shopfloor runs submit …)`
/// then `shopfloor approve $RUN '$start'` (the README's tour) is refused when it comes first.
async fn once_start_is_open(api: &Api, id: &str, node: Option<&str>) -> Result<RunDetail, ClientError> {
    let url = api.project_url(&["runs", id])?;
    let detail: RunDetail = api.get(url.clone()).await?.json()?;
    if !start_not_open_yet(&detail, node) {
        return Ok(detail);
    }
    // The stream first, then the run again: the event that opens the approval cannot fall
    // between the two.
    let mut stream = sse::Stream::open(api).await?;
    let deadline = tokio::time::Instant::now() + START_OPENS_WITHIN;
    loop {
        let detail: RunDetail = api.get(url.clone()).await?.json()?;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if !start_not_open_yet(&detail, node) || left.is_zero() {
            return Ok(detail);
        }
        // Read the run again after its next event, or at the deadline (then `pick` refuses).
        while let Some(event) = stream.next_within(api, deadline.saturating_duration_since(tokio::time::Instant::now())).await? {
            if event.data.get("run").and_then(Value::as_str) == Some(id) {
                break;
            }
        }
    }
}

/// Whether `node` (none: the only approval) is the start approval of a run that waits for it
/// and the engine has not opened yet.
fn start_not_open_yet(d: &RunDetail, node: Option<&str>) -> bool {
    let start = engine::store::approvals::RUN_APPROVAL_NODE;
    let only_start = d.steps.iter().all(|s| s.node == start && matches!(s.state.as_str(), "pending" | "leased" | "running"));
    node.is_none_or(|n| n == start) && d.approvals.is_empty() && only_start && d.run.status == "running" && d.run.substate.as_deref() == Some("awaiting_signal")
}

/// POSTs an approval's answer.
pub(crate) async fn send_approval(api: &Api, run: &str, node: &str, answer: Map<String, Value>) -> Result<Answer, ClientError> {
    api.post(api.project_url(&["runs", run, "approvals", node])?, Body::Json(Value::Object(answer))).await
}

/// ` with ticket=T-1, size=small`, or nothing for an empty answer.
pub(crate) fn answer_words(answer: Option<&Value>) -> String {
    match answer.and_then(Value::as_object) {
        Some(m) if !m.is_empty() => format!(" with {}", m.iter().map(|(k, v)| format!("{k}={}", form::show(v))).collect::<Vec<_>>().join(", ")),
        _ => String::new(),
    }
}

pub(crate) async fn reject(args: RejectArgs) -> Result<u8, ClientError> {
    let mut conn = args.conn;
    let id = run_ref(&mut conn, &args.run)?;
    let api = Api::connect(&conn)?;
    let node = match args.node {
        Some(n) => n,
        None => {
            let detail: RunDetail = api.get(api.project_url(&["runs", &id])?).await?.json()?;
            pick(&detail.approvals, None, &id)?.node.clone()
        }
    };
    let body = args.reason.map_or(Body::None, |r| Body::Json(serde_json::json!({ "reason": r })));
    let answer = api.post(api.project_url(&["runs", &id, "approvals", &node, "reject"])?, body).await?;
    if conn.json {
        say!("{}", answer.text());
    } else {
        say!("rejected {node} on {id}: the run is cancelled");
    }
    Ok(0)
}
