//! Workflows of a project: the list (with pause and unpause, of each and of the whole project),
//! one workflow's versions and definition with a form that starts a run of it, and a form that
//! validates or uploads a definition, showing each problem at its line. All of it is the REST API's: `validate-workflow` answers the problems, an upload that
//! does not validate is refused with them.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::super::people;
use super::super::session::OrgSession;
use super::super::view::{self, Page};
use super::super::{Console, ConsoleError};
use super::{Posted, ProjectPath, here, see_other};
use crate::http::admission::ProjectSettings;
use crate::http::auth::Role;
use crate::http::error::WorkflowProblem;
use crate::http::workflows::{Validation, VersionList, WorkflowDetail, WorkflowList};

#[derive(Debug, Deserialize)]
pub(in super::super) struct NamePath {
    org: String,
    project: String,
    name: String,
}

#[derive(Debug, Serialize)]
struct SourceLine {
    n: usize,
    text: String,
    problems: Vec<String>,
}

/// The definition's lines, each with the problems found on it.
fn annotate(source: &str, problems: &[WorkflowProblem]) -> Vec<SourceLine> {
    source
        .lines()
        .enumerate()
        .map(|(i, text)| SourceLine {
            n: i + 1,
            text: text.to_owned(),
            problems: problems.iter().filter(|p| p.line == i + 1).map(|p| format!("{}:{}: {} ({})", p.line, p.col, p.message, p.path)).collect(),
        })
        .collect()
}

#[derive(Debug, Default, Serialize)]
struct Check {
    source: String,
    ran: bool,
    valid: bool,
    name: Option<String>,
    lines: Vec<SourceLine>,
    /// Problems about the whole file (line 0).
    general: Vec<String>,
    error: Option<String>,
    uploaded: Option<String>,
}

async fn render_list(c: &Console, s: &OrgSession, project: &str, check: Check, status: StatusCode) -> Result<Response, ConsoleError> {
    let list: WorkflowList = c.read(&s.caller, &format!("/orgs/{}/projects/{project}/workflows?limit=200", s.org)).await?;
    let settings: ProjectSettings = c.read(&s.caller, &format!("/orgs/{}/projects/{project}/settings", s.org)).await?;
    let projects = c.projects(s).await?;
    let page = Page::of(s, format!("Workflows · {project}"), "workflows").project(project, projects);
    let (can_edit, can_pause) = (s.can(Role::Member), s.can(Role::Admin));
    let html = c.render(
        "workflows.html",
        ctx! { page => page, workflows => list.items, check => check, can_edit => can_edit, can_pause => can_pause, project_paused => settings.paused },
    )?;
    Ok(view::html(status, html))
}

pub(in super::super) async fn list(State(c): State<Console>, Path(p): Path<ProjectPath>, headers: HeaderMap, uri: Uri) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    render_list(&c, &s, &p.project, Check::default(), StatusCode::OK).await
}

fn checked(source: String, problems: Vec<WorkflowProblem>, name: Option<String>) -> Check {
    let general = problems.iter().filter(|p| p.line == 0).map(|p| format!("{} ({})", p.message, p.path)).collect();
    Check { lines: annotate(&source, &problems), valid: problems.is_empty(), ran: true, name, general, source, ..Check::default() }
}

/// Validates a definition without storing it.
pub(in super::super) async fn validate(State(c): State<Console>, Path(p): Path<ProjectPath>, Posted { s, form: f }: Posted) -> Result<Response, ConsoleError> {
    let source = f.get("source").cloned().unwrap_or_default();
    let path = format!("/orgs/{}/projects/{}/validate-workflow", p.org, p.project);
    let check = match c.call(&s.caller, Method::POST, &path, Some(json!({ "source": source }))).await? {
        Ok(v) => {
            let v: Validation = serde_json::from_value(v).map_err(ConsoleError::internal)?;
            checked(source, v.problems, v.name)
        }
        Err(r) => Check { source, error: Some(r.detail().to_owned()), ran: true, ..Check::default() },
    };
    let status = if check.valid { StatusCode::OK } else { StatusCode::UNPROCESSABLE_ENTITY };
    render_list(&c, &s, &p.project, check, status).await
}

/// Uploads a definition as the next version of the workflow it names.
pub(in super::super) async fn upload(State(c): State<Console>, Path(p): Path<ProjectPath>, Posted { s, form: f }: Posted) -> Result<Response, ConsoleError> {
    let source = f.get("source").cloned().unwrap_or_default();
    let path = format!("/orgs/{}/projects/{}/workflows", p.org, p.project);
    match c.call(&s.caller, Method::POST, &path, Some(json!({ "source": source }))).await? {
        Ok(v) => {
            let name = v.get("name").and_then(|n| n.as_str()).unwrap_or_default();
            Ok(see_other(&format!("/orgs/{}/projects/{}/workflows/{}", p.org, p.project, view::urlencode(name))))
        }
        Err(r) => {
            let check = match r.problem.problems.clone() {
                Some(problems) => checked(source, problems, None),
                None => Check { source, error: Some(r.detail().to_owned()), ran: true, ..Check::default() },
            };
            render_list(&c, &s, &p.project, check, StatusCode::UNPROCESSABLE_ENTITY).await
        }
    }
}

#[derive(Debug, Deserialize, Default)]
pub(in super::super) struct VersionQuery {
    version: Option<i32>,
}

pub(in super::super) async fn detail(
    State(c): State<Console>, Path(p): Path<NamePath>, headers: HeaderMap, uri: Uri, Query(q): Query<VersionQuery>,
) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    let base = format!("/orgs/{}/projects/{}/workflows/{}", p.org, p.project, view::urlencode(&p.name));
    let detail: WorkflowDetail = c.read(&s.caller, &base).await?;
    let versions: VersionList = c.read(&s.caller, &format!("{base}/versions?limit=200")).await?;
    let shown = match q.version {
        Some(v) if Some(v) != detail.latest.as_ref().map(|l| l.version) => {
            Some(c.read::<crate::http::workflows::Version>(&s.caller, &format!("{base}/versions/{v}")).await?)
        }
        _ => detail.latest,
    };
    let source = shown.as_ref().and_then(|v| v.source.clone()).unwrap_or_default();
    // Stored versions validated when they were uploaded; a parser that changed since may
    // disagree, and the page says so at the line.
    let problems: Vec<WorkflowProblem> = match engine::definition::parse(&source) {
        Ok(_) => Vec::new(),
        Err(problems) => problems.iter().map(WorkflowProblem::from).collect(),
    };
    let names = people::names(c.db(), s.caller.org, versions.items.iter().map(|v| v.created_by.clone())).await?;
    let projects = c.projects(&s).await?;
    let page = Page::of(&s, format!("{} · workflows", p.name), "workflows").project(&p.project, projects);
    let can_edit = s.can(Role::Member);
    c.page(
        "workflow.html",
        ctx! {
            page => page,
            workflow => detail.workflow,
            version => shown.as_ref().map(|v| v.version),
            versions => versions.items,
            names => names,
            lines => annotate(&source, &problems),
            valid => problems.is_empty(),
            can_edit => can_edit,
            source => source,
        },
    )
}

async fn set_paused(c: &Console, p: &NamePath, s: &OrgSession, what: &str) -> Result<Response, ConsoleError> {
    let path = format!("/orgs/{}/projects/{}/workflows/{}/{what}", p.org, p.project, view::urlencode(&p.name));
    match c.call(&s.caller, Method::POST, &path, None).await? {
        Ok(_) => Ok(see_other(&format!("/orgs/{}/projects/{}/workflows", p.org, p.project))),
        Err(r) => Err(ConsoleError::BadRequest(r.detail().to_owned())),
    }
}

pub(in super::super) async fn pause(State(c): State<Console>, Path(p): Path<NamePath>, Posted { s, .. }: Posted) -> Result<Response, ConsoleError> {
    set_paused(&c, &p, &s, "pause").await
}

pub(in super::super) async fn unpause(State(c): State<Console>, Path(p): Path<NamePath>, Posted { s, .. }: Posted) -> Result<Response, ConsoleError> {
    set_paused(&c, &p, &s, "unpause").await
}

async fn set_project_paused(c: &Console, p: &ProjectPath, s: &OrgSession, what: &str) -> Result<Response, ConsoleError> {
    match c.call(&s.caller, Method::POST, &format!("/orgs/{}/projects/{}/{what}", p.org, p.project), None).await? {
        Ok(_) => Ok(see_other(&format!("/orgs/{}/projects/{}/workflows", p.org, p.project))),
        Err(r) => Err(ConsoleError::BadRequest(r.detail().to_owned())),
    }
}

/// Pauses the whole project (admin): every new run of its workflows is held; runs already
/// going carry on.
pub(in super::super) async fn pause_project(State(c): State<Console>, Path(p): Path<ProjectPath>, Posted { s, .. }: Posted) -> Result<Response, ConsoleError> {
    set_project_paused(&c, &p, &s, "pause").await
}

/// Unpauses the project (admin): the runs it held are released.
pub(in super::super) async fn unpause_project(
    State(c): State<Console>, Path(p): Path<ProjectPath>, Posted { s, .. }: Posted,
) -> Result<Response, ConsoleError> {
    set_project_paused(&c, &p, &s, "unpause").await
}

/// Starts a run of the workflow (member), with the form's input (a JSON object, `{}` when
/// empty), of the version shown (`version`, else the latest), dry when asked; then shows it.
pub(in super::super) async fn start(State(c): State<Console>, Path(p): Path<NamePath>, Posted { s, form }: Posted) -> Result<Response, ConsoleError> {
    let text = form.get("input").map(|t| t.trim()).filter(|t| !t.is_empty()).unwrap_or("{}");
    let input: Value =
        serde_json::from_str(text).map_err(|e| ConsoleError::BadRequest(format!("The input is not JSON: {e}. Give an object, e.g. {{\"issue\": 12}}.")))?;
    if !input.is_object() {
        return Err(ConsoleError::BadRequest("The input must be a JSON object, e.g. {\"issue\": 12}.".into()));
    }
    let version = match form.get("version").map(String::as_str).filter(|v| !v.is_empty()) {
        Some(v) => Some(v.parse::<i32>().map_err(|_| ConsoleError::BadRequest(format!("`{v}` is not a version number")))?),
        None => None,
    };
    let body = json!({ "workflow": p.name, "input": input, "version": version, "dry_run": form.get("dry_run").is_some_and(|v| v == "on") });
    match c.call(&s.caller, Method::POST, &format!("/orgs/{}/projects/{}/runs", p.org, p.project), Some(body)).await? {
        Ok(run) => {
            let id = run.get("id").and_then(Value::as_str).unwrap_or_default();
            Ok(see_other(&format!("/orgs/{}/projects/{}/runs/{id}", p.org, p.project)))
        }
        Err(r) => Err(ConsoleError::BadRequest(r.detail().to_owned())),
    }
}
