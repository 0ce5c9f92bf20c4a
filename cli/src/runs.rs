//! `shopfloor runs …`: list (and watch), show, why, follow, submit, cancel, retry, rerun, say
//! and resolve (its code in `resolve.rs`).
//!
//! A run is named by its id (`run-…`) or its full name (`<org>:<project>:run-…`, which also
//! says the org and project). Commands that make a run (`submit`, `retry`, `rerun`) print its
//! id alone on standard output, so `RUN=$(shopfloor runs submit …)` works; what a person wants
//! to read goes to standard error.

use std::collections::HashMap;

use chrono::Utc;
use clap::{Args, Subcommand};
use serde::Deserialize;
use serde_json::Value;

use super::error::ClientError;
use super::follow;
use super::form;
use super::http::{Api, Body, with_query};
use super::model::{Run, RunDetail, run_ref};
use super::resolve;
use super::sse;
use super::table::{Style, Table, Tint, ago, line, plain, span, stamp, status_tint};
use super::{Conn, say};

#[derive(Debug, Args)]
pub struct RunsArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    cmd: RunsCommand,
}

#[derive(Debug, Subcommand)]
enum RunsCommand {
    /// The project's runs, newest first (filters as the API's).
    List(ListArgs),
    /// A run with its steps and the approvals it waits on.
    Show {
        /// The run: `run-…`, or its full name `<org>:<project>:run-…`.
        run: String,
    },
    /// What holds a run, in a sentence.
    Why {
        /// The run: `run-…`, or its full name `<org>:<project>:run-…`.
        run: String,
    },
    /// Follow a run live: its headline, each step as it moves, a running crew step's
    /// transcript. On a terminal, `a` answers an approval, `c` cancels, `q` quits. Exits 0 when
    /// the run completes, 1 when it fails or is cancelled.
    Follow {
        /// The run: `run-…`, or its full name `<org>:<project>:run-…`.
        run: String,
    },
    /// Submit a run of a workflow; prints the new run's id.
    Submit(SubmitArgs),
    /// Cancel a running run (and the children it waits for).
    Cancel {
        /// The run: `run-…`, or its full name `<org>:<project>:run-…`.
        run: String,
        /// Why, recorded with the cancellation.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Retry a failed or cancelled run from the nodes that failed; prints the new run's id.
    /// With `--node` and a new `--prompt`, `--model` or `--harness`: edit-and-retry, the node
    /// runs with them at every later attempt.
    #[command(group(clap::ArgGroup::new("edit").multiple(true)))]
    Retry {
        /// The run: `run-…`, or its full name `<org>:<project>:run-…`.
        run: String,
        /// The crew node to edit.
        #[arg(long, requires = "edit")]
        node: Option<String>,
        /// The node's new prompt (a template, as in the workflow).
        #[arg(long, group = "edit")]
        prompt: Option<String>,
        /// The node's new model.
        #[arg(long, group = "edit")]
        model: Option<String>,
        /// The node's new harness (`claude-code`, `codex`, `command`).
        #[arg(long, group = "edit")]
        harness: Option<String>,
    },
    /// Tell a running crew session something (intervene): the host writes the message to
    /// the agent as a user turn. Only Claude Code takes messages while it runs.
    Say {
        /// The run: `run-…`, or its full name `<org>:<project>:run-…`.
        run: String,
        /// What to tell the agent.
        text: String,
        /// The step (`step-…`) when the run has several running crew steps.
        #[arg(long)]
        step: Option<String>,
    },
    /// Run a finished run again with the same input, from the start or from a node; prints the
    /// new run's id.
    Rerun {
        /// The run: `run-…`, or its full name `<org>:<project>:run-…`.
        run: String,
        /// Start again from this node, reusing the outputs recorded before it.
        #[arg(long)]
        from: Option<String>,
    },
    /// Mark a failed run handled: it leaves the failures to resolve, its status stays
    /// `failed`.
    Resolve {
        /// The run: `run-…`, or its full name `<org>:<project>:run-…`.
        run: String,
        /// Why it needs nothing more (kept in its events and the audit log).
        #[arg(long)]
        note: Option<String>,
    },
}

#[derive(Debug, Args)]
struct ListArgs {
    /// `running`, `completed`, `failed` or `cancelled`.
    #[arg(long)]
    status: Option<String>,
    /// A running run's substate: `queued`, `executing`, `awaiting_signal`, …
    #[arg(long)]
    substate: Option<String>,
    /// A workflow's name.
    #[arg(long)]
    workflow: Option<String>,
    /// An item's key, e.g. `["github","owner/name",12]`.
    #[arg(long)]
    item: Option<String>,
    /// List dry runs (listed apart from the others; they announce nothing, so `--watch` sees
    /// no change of theirs).
    #[arg(long)]
    dry_run: bool,
    /// Page size, 1 to 200 (the server's default is 50).
    #[arg(long)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[arg(long)]
    cursor: Option<String>,
    /// After the list, print each run again as it changes (over the project's event stream);
    /// with --json, each changed run as the API's JSON of that run, one a line.
    #[arg(long)]
    watch: bool,
}

#[derive(Debug, Args)]
struct SubmitArgs {
    /// The workflow's name.
    workflow: String,
    /// An input value, `name=value`; a value that reads as JSON (`5`, `true`, `{"a":1}`) is
    /// that JSON, anything else text. Repeat for more.
    #[arg(long = "input", value_name = "NAME=VALUE")]
    input: Vec<String>,
    /// A version number; the latest by default.
    #[arg(long)]
    version: Option<i32>,
    /// Stub effects and answer approvals at once; deleted a day after it ends.
    #[arg(long)]
    dry_run: bool,
    /// Follow the new run until it ends, as `runs follow` does.
    #[arg(long)]
    follow: bool,
}

#[derive(Deserialize)]
struct RunList {
    items: Vec<Run>,
    #[serde(default)]
    next_cursor: Option<String>,
}

#[derive(Deserialize)]
struct Why {
    text: String,
}

/// The one running crew step of a run (its id), for `runs say` without `--step`.
fn live_crew_step(detail: &Value, run: &str) -> Result<String, ClientError> {
    let steps = detail["steps"].as_array().map(Vec::as_slice).unwrap_or_default();
    let live: Vec<(&str, &str)> = steps
        .iter()
        .filter(|s| s["kind"] == "crew" && s["state"] == "running")
        .filter_map(|s| Some((s["id"].as_str()?, s["node"].as_str().unwrap_or_default())))
        .collect();
    match live.as_slice() {
        [(id, _)] => Ok((*id).to_owned()),
        [] => Err(ClientError::Failed(format!("{run} has no running crew step: a message reaches only a live session"))),
        many => Err(ClientError::Usage(format!(
            "{run} has {} running crew steps ({}): pick one with --step",
            many.len(),
            many.iter().map(|(id, node)| format!("{node} {id}")).collect::<Vec<_>>().join(", ")
        ))),
    }
}

pub(super) async fn run(args: RunsArgs) -> Result<u8, ClientError> {
    let mut conn = args.conn;
    let style = Style::detect();
    match args.cmd {
        RunsCommand::List(list) => {
            let api = Api::connect(&conn)?;
            runs_list(&api, &list, conn.json, style).await
        }
        RunsCommand::Show { run } => {
            let id = run_ref(&mut conn, &run)?;
            let api = Api::connect(&conn)?;
            let answer = api.get(api.project_url(&["runs", &id])?).await?;
            if conn.json {
                say!("{}", answer.text());
            } else {
                show_run(&answer.json()?, style);
            }
            Ok(0)
        }
        RunsCommand::Why { run } => {
            let id = run_ref(&mut conn, &run)?;
            let api = Api::connect(&conn)?;
            let answer = api.get(api.project_url(&["runs", &id, "why"])?).await?;
            if conn.json {
                say!("{}", answer.text());
            } else {
                say!("{}", answer.json::<Why>()?.text);
            }
            Ok(0)
        }
        RunsCommand::Follow { run } => {
            let id = run_ref(&mut conn, &run)?;
            let api = Api::connect(&conn)?;
            follow::follow(&api, &id, conn.json, style).await
        }
        RunsCommand::Submit(s) => {
            let api = Api::connect(&conn)?;
            let mut body = serde_json::json!({ "workflow": s.workflow, "input": Value::Object(form::input(&s.input)?) });
            if let Some(v) = s.version {
                body["version"] = v.into();
            }
            if s.dry_run {
                body["dry_run"] = true.into();
            }
            let answer = api.post(api.project_url(&["runs"])?, Body::Json(body)).await?;
            let run: Run = answer.json()?;
            if conn.json {
                say!("{}", answer.text());
            } else {
                say!("{}", run.id);
                eprintln!("submitted {} v{}: {}", run.workflow, run.version, run.words);
            }
            if s.follow {
                return follow::follow(&api, &run.id, conn.json, style).await;
            }
            Ok(0)
        }
        RunsCommand::Say { run, text, step } => {
            let id = run_ref(&mut conn, &run)?;
            let api = Api::connect(&conn)?;
            let step = match step {
                Some(step) => step,
                None => {
                    let detail: Value = api.get(api.project_url(&["runs", &id])?).await?.json()?;
                    live_crew_step(&detail, &id)?
                }
            };
            let answer = api.post(api.project_url(&["runs", &id, "steps", &step, "messages"])?, Body::Json(serde_json::json!({ "text": text }))).await?;
            answer.print(conn.json, |sent: Value| {
                say!("{}", sent["id"].as_str().unwrap_or_default());
                eprintln!("sent to {step} of {id}: it reaches the agent at the host's next heartbeat");
            })?;
            Ok(0)
        }
        RunsCommand::Cancel { run, reason } => {
            let id = run_ref(&mut conn, &run)?;
            let api = Api::connect(&conn)?;
            let body = reason.map_or(Body::None, |r| Body::Json(serde_json::json!({ "reason": r })));
            let answer = api.post(api.project_url(&["runs", &id, "cancel"])?, body).await?;
            answer.print(conn.json, |run: Run| {
                say!("{} {}{}", run.id, style.paint(status_tint(&run.status), &run.status), run.reason.map(|r| format!(" ({r})")).unwrap_or_default());
            })?;
            Ok(0)
        }
        RunsCommand::Retry { run, node, prompt, model, harness } => {
            let id = run_ref(&mut conn, &run)?;
            let api = Api::connect(&conn)?;
            let (body, what) = match node {
                Some(node) => {
                    let what = format!("retry of {id} with {node} edited");
                    (Body::Json(serde_json::json!({ "node": node, "prompt": prompt, "model": model, "harness": harness })), what)
                }
                None if prompt.is_some() || model.is_some() || harness.is_some() => {
                    return Err(ClientError::Usage("--prompt, --model and --harness edit a node: name it with --node".into()));
                }
                None => (Body::None, format!("retry of {id}")),
            };
            let answer = api.post(api.project_url(&["runs", &id, "retry"])?, body).await?;
            new_run(&answer, conn.json, &what)
        }
        RunsCommand::Rerun { run, from } => {
            let id = run_ref(&mut conn, &run)?;
            let api = Api::connect(&conn)?;
            let url = with_query(api.project_url(&["runs", &id, "rerun"])?, &[("from", from.as_deref())]);
            let answer = api.post(url, Body::None).await?;
            let what = match &from {
                Some(node) => format!("rerun of {id} from {node}"),
                None => format!("rerun of {id}"),
            };
            new_run(&answer, conn.json, &what)
        }
        RunsCommand::Resolve { run, note } => resolve::resolve(conn, &run, note).await,
    }
}

fn new_run(answer: &super::http::Answer, json: bool, what: &str) -> Result<u8, ClientError> {
    if json {
        say!("{}", answer.text());
        return Ok(0);
    }
    let run: Run = answer.json()?;
    say!("{}", run.id);
    eprintln!("{what}: {} ({})", run.id, run.words);
    Ok(0)
}

/// The list's query, as the API takes it.
fn list_url(api: &Api, q: &ListArgs) -> Result<reqwest::Url, ClientError> {
    let limit = q.limit.map(|l| l.to_string());
    Ok(with_query(
        api.project_url(&["runs"])?,
        &[
            ("status", q.status.as_deref()),
            ("substate", q.substate.as_deref()),
            ("workflow", q.workflow.as_deref()),
            ("item", q.item.as_deref()),
            ("dry_run", q.dry_run.then_some("true")),
            ("limit", limit.as_deref()),
            ("cursor", q.cursor.as_deref()),
        ],
    ))
}

const RUN_COLUMNS: [&str; 5] = ["RUN", "WORKFLOW", "STATE", "CREATED", "REASON"];

fn run_row(r: &Run) -> Vec<(String, Tint)> {
    vec![
        plain(&r.id),
        plain(format!("{} v{}", r.workflow, r.version)),
        (r.words.clone(), status_tint(&r.status)),
        plain(ago(r.created_at)),
        plain(r.reason.clone().unwrap_or_default()),
    ]
}

async fn runs_list(api: &Api, q: &ListArgs, json: bool, style: Style) -> Result<u8, ClientError> {
    // Subscribed before the list is read, so no change between the two is missed.
    let stream = if q.watch { Some(sse::Stream::open(api).await?) } else { None };
    let answer = api.get(list_url(api, q)?).await?;
    let list: RunList = answer.json()?;
    let mut table = Table::new(&RUN_COLUMNS);
    for r in &list.items {
        table.row(run_row(r));
    }
    if json {
        say!("{}", answer.text());
    } else if table.is_empty() {
        eprintln!("no runs");
    } else {
        for l in table.render(style) {
            say!("{l}");
        }
        if let Some(c) = &list.next_cursor {
            eprintln!("more: --cursor {c}");
        }
    }
    let Some(mut stream) = stream else { return Ok(0) };
    let mut widths = table.widths();
    widths[0] = widths[0].max(30);
    let mut last: HashMap<String, (String, String)> = list.items.iter().map(|r| (r.id.clone(), (r.status.clone(), r.words.clone()))).collect();
    loop {
        // The runs the events of one change touched, each read once.
        let mut touched: Vec<String> = Vec::new();
        let mut event = Some(stream.next(api).await?);
        while let Some(e) = event {
            let id = e.data.get("run").and_then(Value::as_str).map(str::to_owned);
            if let Some(id) = id.filter(|id| !touched.contains(id)) {
                if e.kind.starts_with("run.") || e.kind.starts_with("step.") {
                    touched.push(id);
                }
            }
            event = stream.next_within(api, SETTLE).await?;
        }
        for id in touched {
            watch_row(api, q, &id, &mut last, &widths, json, style).await?;
        }
    }
}

/// How long to wait for more events of the same change before reading the runs it touched.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(100);

/// Prints a watched run again when its state or words changed.
async fn watch_row(
    api: &Api, q: &ListArgs, id: &str, last: &mut HashMap<String, (String, String)>, widths: &[usize], json: bool, style: Style,
) -> Result<(), ClientError> {
    let answer = match api.get(api.project_url(&["runs", id])?).await {
        Ok(a) => a,
        // A run deleted meanwhile (a dry run's retention) is simply not shown.
        Err(ClientError::Refused { status: 404, .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    let r = answer.json::<RunDetail>()?.run;
    if !last.contains_key(&r.id) && !matches(q, &r) {
        return Ok(());
    }
    let now = (r.status.clone(), r.words.clone());
    if last.get(&r.id) == Some(&now) {
        return Ok(());
    }
    last.insert(r.id.clone(), now);
    if json {
        say!("{}", answer.text());
    } else {
        say!("{}", line(&run_row(&r), widths, style));
    }
    Ok(())
}

/// Whether a run passes the list's filters (for runs first seen while watching).
fn matches(q: &ListArgs, r: &Run) -> bool {
    q.status.as_ref().is_none_or(|s| *s == r.status)
        && q.substate.as_ref().is_none_or(|s| Some(s) == r.substate.as_ref())
        && q.workflow.as_ref().is_none_or(|w| *w == r.workflow)
        && q.item.as_ref().is_none_or(|i| Some(i) == r.item.as_ref())
}

fn show_run(d: &RunDetail, style: Style) {
    let r = &d.run;
    say!("{}  {}", style.paint(Tint::Bold, &r.id), style.paint(Tint::Dim, &r.name));
    say!("workflow  {} v{}", r.workflow, r.version);
    let state = if r.status == "running" { format!("running: {}", r.words) } else { r.status.clone() };
    say!("status    {}", style.paint(status_tint(&r.status), &state));
    if let Some(reason) = &r.reason {
        say!("reason    {reason}");
    }
    say!("created   {} ({}) by {}", stamp(r.created_at), ago(r.created_at), r.created_by);
    if let (Some(s), Some(e)) = (r.started_at, r.ended_at) {
        say!("took      {}", span(s, e));
    }
    if let Some(item) = &r.item {
        say!("item      {item}");
    }
    if let Some(src) = &r.source_run {
        say!("source    {src}{}", r.source_from.as_ref().map(|f| format!(" from {f}")).unwrap_or_default());
    }
    if r.input.as_object().is_some_and(|m| !m.is_empty()) {
        say!("input     {}", r.input);
    }
    if !d.steps.is_empty() {
        say!();
        let mut t = Table::new(&["NODE", "KIND", "STATE", "ATTEMPT", "TOOK", "STEP", "REASON"]);
        for s in &d.steps {
            let took = match (s.started_at, s.ended_at) {
                (Some(a), Some(b)) => span(a, b),
                (Some(a), None) => format!("{}…", span(a, Utc::now())),
                _ => String::new(),
            };
            let mut state = s.state.clone();
            if s.reused {
                state.push_str(" (reused)");
            }
            if s.timed_out {
                state.push_str(" (timed out)");
            }
            t.row(vec![
                plain(&s.node),
                plain(&s.kind),
                (state, status_tint(&s.state)),
                plain(s.attempt.to_string()),
                plain(took),
                plain(&s.id),
                plain(s.reason.clone().unwrap_or_default()),
            ]);
        }
        for l in t.render(style) {
            say!("{l}");
        }
    }
    // A failed step's own words (a refused push's ref and the remote's lines), which its
    // reason only names.
    for s in d.steps.iter().filter(|s| s.state == "failed") {
        if let Some(said) = s.output.get("error").and_then(Value::as_str) {
            say!();
            say!("{} (attempt {}) failed: {}", s.node, s.attempt, s.reason.as_deref().unwrap_or("failed"));
            for line in said.lines() {
                say!("  {line}");
            }
        }
    }
    for a in &d.approvals {
        say!();
        say!("{} at {}: {}", style.paint(Tint::Yellow, "Waiting for approval"), a.node, a.prompt.trim());
        if let Some(deadline) = a.deadline {
            say!("  deadline {} ({})", stamp(deadline), ago(deadline));
        }
        for f in form::fields(&a.fields) {
            say!("  field {}", f.describe());
        }
        say!("  answer with: shopfloor approve {} {}", r.id, a.node);
    }
}
