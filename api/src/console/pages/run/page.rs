//! The run page itself: `page`, and `render`, which the forms' handlers call again with the
//! `Feedback` of a refused answer.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use chrono::Utc;
use engine::definition::Definition;
use engine::ids::WorkflowId;
use serde_json::{Value, json};

use super::super::here;
use super::{Feedback, RunPath, approvals, forecast, headline, run_id, tail, timeline};
use crate::console::people;
use crate::console::session::OrgSession;
use crate::console::svg::{self, symbol};
use crate::console::view::{self, Page};
use crate::console::{Console, ConsoleError};
use crate::http::auth::Role;
use crate::http::runs::RunDetail;
use crate::http::runs::history::RunEventList;
use crate::http::runs::read::Why;

const WORKFLOW_OF_PAGE: &str =
    "SELECT w.workflow_id FROM workflows w JOIN projects p ON p.project_id = w.project_id WHERE w.org_id = $1 AND p.slug = $2 AND w.name = $3";

pub(super) async fn render(
    c: &Console, s: &OrgSession, org: &str, project: &str, run_text: &str, fb: &Feedback, status: StatusCode,
) -> Result<Response, ConsoleError> {
    let id = run_id(run_text)?;
    let base = format!("/orgs/{org}/projects/{project}/runs/{id}");
    let detail: RunDetail = c.read(&s.caller, &base).await?;
    // The run is in this project (the read above checked); `why` is the REST route's answer,
    // computed here without reading the run again.
    let why = engine::substate::why(c.db(), s.caller.org, id).await?;
    let why = Why::of(why).map_err(ConsoleError::internal)?;
    let events: RunEventList = c.read(&s.caller, &format!("{base}/events?limit=200")).await?;
    let db = c.db();
    let org_id = s.caller.org;
    let now = Utc::now();

    // The definition, for the graph and the rerun-from choices.
    let workflow: Option<WorkflowId> = sqlx::query_scalar(WORKFLOW_OF_PAGE).bind(org_id).bind(project).bind(&detail.run.workflow).fetch_optional(db).await?;
    let def = match workflow {
        Some(w) => {
            let mut conn = db.begin().await?;
            c.inner.catalog.get(&mut conn, w, detail.run.version).await.ok()
        }
        None => None,
    };

    let forecast = forecast::forecast(db, workflow, id, org_id, &detail, why.substate.as_deref(), now).await?;

    let transcript = tail::section(db, s, org_id, &detail, &base).await?;

    let (steps, states) = timeline::steps(&detail, now);
    let waterfall = timeline::waterfall(&detail, now);
    let graph = def.as_deref().map(|d| svg::graph(d, &states)).unwrap_or_default();
    let crews = edit_choices(def.as_deref(), &detail);
    let nodes: Vec<String> = def.as_deref().map(|d| d.nodes.iter().map(|n| n.id.to_string()).collect()).unwrap_or_default();

    let (head, tone) = headline::headline(&why, &detail);
    // A finished run's sentence is in words, with the machine reason beside it; a running
    // run's is the engine's explanation, already in words.
    let (why_text, why_machine) = if detail.run.status == "running" {
        (why.text.clone(), None)
    } else {
        let (_, text, machine) = headline::ending(&detail);
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
    let decided = approvals::decided(db, id, org_id).await?;
    let mut actors: Vec<String> = decided.iter().filter_map(|d| d.decided_by.clone()).collect();
    actors.push(detail.run.created_by.clone());
    actors.extend(events.items.iter().filter_map(|e| e.attrs.get("by").and_then(Value::as_str).map(str::to_owned)));
    let names = people::names(db, org_id, actors).await?;
    let decisions = approvals::decisions(&decided, &names);
    let journal = timeline::journal(&events, &names);
    let walls = timeline::walls(&events);
    let created_by = names.get(&detail.run.created_by).cloned().unwrap_or_else(|| detail.run.created_by.clone());
    let projects = c.projects(s).await?;
    let mut page = Page::of(s, format!("{head} · {}", detail.run.id), "runs").project(project, projects);
    page.run = Some(detail.run.id.to_string());
    let finished = detail.run.status != "running";
    let member = s.can(Role::Member);
    let approvals = approvals::approval_views(&detail.approvals, fb);
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
    let notices: Vec<String> = fb.forms.iter().filter(|(k, _)| !shown(k)).map(|(_, v)| v.clone()).collect();
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
            walls => walls,
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
            links => headline::output_links(&detail),
            can_act => member,
            can_cancel => can_cancel,
            can_retry => can_retry,
            can_rerun => can_rerun,
            errors => fb.forms.clone(),
        },
    )?;
    Ok(view::html(status, html))
}

pub(in crate::console) async fn page(State(c): State<Console>, Path(p): Path<RunPath>, headers: HeaderMap, uri: Uri) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    render(&c, &s, &p.org, &p.project, &p.run, &Feedback::default(), StatusCode::OK).await
}

/// The crew nodes an edit-and-retry can change, the failed one first, with what they run now.
fn edit_choices(def: Option<&Definition>, detail: &RunDetail) -> Vec<Value> {
    let failed_crew: Vec<&str> = detail.steps.iter().filter(|st| st.kind == "crew" && st.state == "failed").map(|st| st.node.as_str()).collect();
    let mut crews: Vec<Value> = def
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
    crews
}
