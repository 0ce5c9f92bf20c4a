//! Budgets, for a project (its limits and the org's) and for the org (its limits and every
//! project's): each limit with what its period has spent and whether it is reached, today's and
//! this month's spend per project, the runs a budget holds in admission, and forms that set
//! and remove a limit. Limits and spend are the REST API's (`budgets`); the held runs are one
//! read of `admission_waits`, where admission parks a run a spent budget holds (`hold =
//! 'budget'`, its `detail` naming the limit in words).

use std::collections::BTreeMap;

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use chrono::{DateTime, Datelike, Utc};
use engine::ids::RunId;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::super::session::OrgSession;
use super::super::view::{self, Page};
use super::super::{Console, ConsoleError};
use super::act::shown;
use super::{FormMap, ProjectPath, here, see_other};
use crate::http::budgets::{BudgetList, SpendList};

/// The runs a budget holds ($1 org, $2 a project's slug or null for all, $3 the caller's one
/// project or null), oldest in line first.
const HELD_SQL: &str = "SELECT aw.run_id, p.slug AS project, w.name AS workflow, aw.detail, aw.since \
     FROM admission_waits aw JOIN runs r ON r.run_id = aw.run_id AND r.org_id = aw.org_id \
     JOIN workflows w ON w.workflow_id = r.workflow_id JOIN projects p ON p.project_id = aw.project_id \
     WHERE aw.org_id = $1 AND aw.hold = 'budget' AND ($2::text IS NULL OR p.slug = $2) AND ($3::uuid IS NULL OR aw.project_id = $3) \
     ORDER BY aw.seq LIMIT 200";

#[derive(Debug, Serialize, sqlx::FromRow)]
struct HeldRun {
    run_id: RunId,
    project: String,
    workflow: String,
    /// The limit, in words: `the project's daily budget of $10.00 (hard)`.
    detail: String,
    since: DateTime<Utc>,
}

#[derive(Debug, Serialize)]
struct LimitView {
    /// The project's slug; none for the org's own limit.
    project: Option<String>,
    period: String,
    usd_limit: String,
    hard: bool,
    spent_usd: String,
    reached: bool,
    resets_at: DateTime<Utc>,
    /// Names the row a refused removal is shown beside: `org:day`, `project:<slug>:month`.
    key: String,
}

fn key(project: Option<&str>, period: &str) -> String {
    match project {
        Some(p) => format!("project:{p}:{period}"),
        None => format!("org:{period}"),
    }
}

#[derive(Debug, Serialize)]
struct SpendView {
    project: String,
    today: String,
    month: String,
}

fn usd(x: f64) -> String {
    format!("${x:.2}")
}

/// Which budgets page: the org's (`project` none) or a project's.
struct Scope<'a> {
    project: Option<&'a str>,
}

impl Scope<'_> {
    fn base(&self, org: &str) -> String {
        match self.project {
            Some(p) => format!("/orgs/{org}/projects/{p}/budgets"),
            None => format!("/orgs/{org}/budgets"),
        }
    }
}

/// A REST refusal and the form it answers (`set`, or a limit's key).
type Refused = Option<(String, String)>;

async fn render(c: &Console, s: &OrgSession, scope: &Scope<'_>, refused: Refused, code: StatusCode) -> Result<Response, ConsoleError> {
    // The console's paths are the REST paths of the same budgets.
    let list: BudgetList = c.read(&s.caller, &scope.base(&s.org)).await?;
    let today = Utc::now().date_naive();
    let month_start = today.with_day(1).unwrap_or(today);
    let mut spend_path = format!("/orgs/{}/spend?from={month_start}&to={today}", s.org);
    if let Some(p) = scope.project {
        spend_path.push_str(&format!("&project={}", view::urlencode(p)));
    }
    let spend: SpendList = c.read(&s.caller, &spend_path).await?;
    let projects = c.projects(s).await?;
    // Every project the page is about, spent or not.
    let mut sums: BTreeMap<String, (f64, f64)> = match scope.project {
        Some(p) => BTreeMap::from([(p.to_owned(), (0.0, 0.0))]),
        None => projects.iter().map(|p| (p.clone(), (0.0, 0.0))).collect(),
    };
    for d in spend.items {
        let e = sums.entry(d.project).or_default();
        e.1 += d.usd;
        if d.day == today {
            e.0 += d.usd;
        }
    }
    let spent: Vec<SpendView> = sums.into_iter().map(|(project, (t, m))| SpendView { project, today: usd(t), month: usd(m) }).collect();
    let limits: Vec<LimitView> = list
        .items
        .into_iter()
        .map(|b| LimitView {
            key: key(b.project.as_deref(), &b.period),
            reached: b.spent_usd >= b.usd_limit,
            usd_limit: usd(b.usd_limit),
            spent_usd: usd(b.spent_usd),
            project: b.project,
            period: b.period,
            hard: b.hard,
            resets_at: b.resets_at,
        })
        .collect();
    let held: Vec<HeldRun> = sqlx::query_as(HELD_SQL).bind(s.caller.org).bind(scope.project).bind(s.caller.project).fetch_all(c.db()).await?;
    let page = match scope.project {
        Some(p) => Page::of(s, format!("Budgets · {p}"), "budgets").project(p, projects),
        None => {
            let mut page = Page::of(s, format!("Budgets · {}", s.org), "budgets");
            page.projects = projects;
            page
        }
    };
    let (refused_at, refusal) = refused.unzip();
    let html = c.render(
        "budgets.html",
        ctx! { page => page, scope_project => scope.project, base => scope.base(&s.org), limits => limits, spent => spent, held => held, refused_at => refused_at, refusal => refusal },
    )?;
    Ok(view::html(code, html))
}

pub(in super::super) async fn org_page(State(c): State<Console>, Path(org): Path<String>, headers: HeaderMap, uri: Uri) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &org, &here(&uri)).await?;
    render(&c, &s, &Scope { project: None }, None, StatusCode::OK).await
}

pub(in super::super) async fn project_page(
    State(c): State<Console>, Path(p): Path<ProjectPath>, headers: HeaderMap, uri: Uri,
) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &p.org, &here(&uri)).await?;
    render(&c, &s, &Scope { project: Some(&p.project) }, None, StatusCode::OK).await
}

/// Sets the page's limit for a period (`PUT …/budgets/{period}`).
async fn set(c: &Console, org: &str, scope: &Scope<'_>, headers: &HeaderMap, uri: &Uri, f: &FormMap) -> Result<Response, ConsoleError> {
    let s = c.session(headers, org, &here(uri)).await?;
    s.check(headers, f.get("_csrf").map(String::as_str))?;
    let period = f.get("period").map(String::as_str).unwrap_or_default();
    let Some(limit) = f.get("usd_limit").and_then(|v| v.trim().trim_start_matches('$').parse::<f64>().ok()) else {
        return render(c, &s, scope, Some(("set".into(), "the limit is an amount in dollars, like 25 or 12.50".into())), StatusCode::UNPROCESSABLE_ENTITY)
            .await;
    };
    let hard = f.get("kind").is_none_or(|k| k != "soft");
    let path = format!("{}/{}", scope.base(org), view::urlencode(period));
    match c.call(&s.caller, Method::PUT, &path, Some(json!({ "usd_limit": limit, "hard": hard }))).await? {
        Ok(_) => Ok(see_other(&scope.base(org))),
        Err(r) => {
            let r = shown(r)?;
            render(c, &s, scope, Some(("set".into(), r.detail)), r.status).await
        }
    }
}

pub(in super::super) async fn org_set(
    State(c): State<Console>, Path(org): Path<String>, headers: HeaderMap, uri: Uri, Form(f): Form<FormMap>,
) -> Result<Response, ConsoleError> {
    set(&c, &org, &Scope { project: None }, &headers, &uri, &f).await
}

pub(in super::super) async fn project_set(
    State(c): State<Console>, Path(p): Path<ProjectPath>, headers: HeaderMap, uri: Uri, Form(f): Form<FormMap>,
) -> Result<Response, ConsoleError> {
    set(&c, &p.org, &Scope { project: Some(&p.project) }, &headers, &uri, &f).await
}

#[derive(Debug, Deserialize)]
pub(in super::super) struct OrgPeriodPath {
    org: String,
    period: String,
}

#[derive(Debug, Deserialize)]
pub(in super::super) struct ProjectPeriodPath {
    org: String,
    project: String,
    period: String,
}

/// Removes the page's limit for a period (`DELETE …/budgets/{period}`).
async fn remove(c: &Console, org: &str, scope: &Scope<'_>, period: &str, headers: &HeaderMap, uri: &Uri, f: &FormMap) -> Result<Response, ConsoleError> {
    let s = c.session(headers, org, &here(uri)).await?;
    s.check(headers, f.get("_csrf").map(String::as_str))?;
    let path = format!("{}/{}", scope.base(org), view::urlencode(period));
    match c.call(&s.caller, Method::DELETE, &path, None).await? {
        Ok(_) => Ok(see_other(&scope.base(org))),
        Err(r) => {
            let r = shown(r)?;
            render(c, &s, scope, Some((key(scope.project, period), r.detail)), r.status).await
        }
    }
}

pub(in super::super) async fn org_remove(
    State(c): State<Console>, Path(p): Path<OrgPeriodPath>, headers: HeaderMap, uri: Uri, Form(f): Form<FormMap>,
) -> Result<Response, ConsoleError> {
    remove(&c, &p.org, &Scope { project: None }, &p.period, &headers, &uri, &f).await
}

pub(in super::super) async fn project_remove(
    State(c): State<Console>, Path(p): Path<ProjectPeriodPath>, headers: HeaderMap, uri: Uri, Form(f): Form<FormMap>,
) -> Result<Response, ConsoleError> {
    remove(&c, &p.org, &Scope { project: Some(&p.project) }, &p.period, &headers, &uri, &f).await
}
