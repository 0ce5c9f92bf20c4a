//! Templates (minijinja, HTML auto-escaped, strict about undefined values) and the small
//! formatting helpers pages share. The templates live in `api/templates/` and are compiled into
//! the binary; `templates()` compiles them all, so a syntax error fails the console's start and
//! its tests, and a page that names a value it was not given fails its render test.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use minijinja::{Environment, UndefinedBehavior, Value};
use serde::Serialize;

pub(super) use super::escape::{urldecode, urlencode};
use super::session::OrgSession;
use super::{Console, ConsoleError};

/// Every template, by name.
pub(super) const TEMPLATES: &[(&str, &str)] = &[
    ("layout.html", include_str!("../../templates/layout.html")),
    ("macros.html", include_str!("../../templates/macros.html")),
    ("signin.html", include_str!("../../templates/signin.html")),
    ("today.html", include_str!("../../templates/today.html")),
    ("runs.html", include_str!("../../templates/runs.html")),
    ("run.html", include_str!("../../templates/run.html")),
    ("hosts.html", include_str!("../../templates/hosts.html")),
    ("host_add.html", include_str!("../../templates/host_add.html")),
    ("budgets.html", include_str!("../../templates/budgets.html")),
    ("members.html", include_str!("../../templates/members.html")),
    ("webhooks.html", include_str!("../../templates/webhooks.html")),
    ("workflows.html", include_str!("../../templates/workflows.html")),
    ("workflow.html", include_str!("../../templates/workflow.html")),
    ("audit.html", include_str!("../../templates/audit.html")),
    ("tokens.html", include_str!("../../templates/tokens.html")),
    ("github.html", include_str!("../../templates/github.html")),
];

/// The console's template environment, every template compiled.
pub fn templates() -> Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::Html);
    for (name, source) in TEMPLATES {
        env.add_template(name, source)?;
    }
    env.add_filter("ago", |t: String| ago(&t));
    env.add_filter("clock", |t: String| clock(&t));
    env.add_filter("duration", |secs: f64| duration(secs));
    env.add_filter("reason_words", |r: String| engine::reasons::words(&r).unwrap_or_default());
    env.add_filter("item_name", |k: String| item_name(&k));
    // The server's clock, which the page's relative times count from.
    env.add_function("now", || Utc::now().to_rfc3339());
    env.add_filter("urlencode_path", |s: String| urlencode(&s));
    env.add_filter("json", |v: Value| serde_json::to_string(&v).unwrap_or_default());
    Ok(env)
}

/// What the layout needs on every page.
#[derive(Debug, Serialize, Default)]
pub(super) struct Page {
    pub title: String,
    pub org: Option<String>,
    pub project: Option<String>,
    pub projects: Vec<String>,
    pub orgs: Vec<String>,
    pub csrf: String,
    pub signout_csrf: String,
    /// Event streams the page listens to for live updates.
    pub streams: Vec<String>,
    /// The run a run page shows: its live updates only follow this run's events.
    pub run: Option<String>,
    pub section: &'static str,
    pub role: String,
}

impl Page {
    /// A page with no session (sign-in).
    pub(super) fn bare(title: &str) -> Page {
        Page { title: title.to_owned(), ..Page::default() }
    }

    pub(super) fn of(s: &OrgSession, title: impl Into<String>, section: &'static str) -> Page {
        Page {
            title: title.into(),
            org: Some(s.org.clone()),
            orgs: s.orgs.clone(),
            csrf: s.csrf.clone(),
            signout_csrf: s.signout_csrf.clone(),
            section,
            role: s.role().as_str().to_owned(),
            ..Page::default()
        }
    }

    /// Scopes the page to a project (its nav), listening to the project's stream.
    pub(super) fn project(mut self, project: &str, projects: Vec<String>) -> Page {
        if let Some(org) = &self.org {
            self.streams.push(format!("/orgs/{org}/projects/{project}/live"));
        }
        self.project = Some(project.to_owned());
        self.projects = projects;
        self
    }
}

impl Console {
    pub(super) fn render(&self, name: &str, ctx: Value) -> Result<String, ConsoleError> {
        let template = self.inner.env.get_template(name).map_err(ConsoleError::internal)?;
        template.render(ctx).map_err(|e| ConsoleError::internal(format!("{e:#}")))
    }

    /// The project slugs of the org (the caller's one project for a token limited to it).
    pub(super) async fn projects(&self, s: &OrgSession) -> Result<Vec<String>, ConsoleError> {
        let slugs: Vec<String> =
            sqlx::query_scalar("SELECT slug FROM projects WHERE org_id = $1 AND ($2::uuid IS NULL OR project_id = $2) ORDER BY slug LIMIT 200")
                .bind(s.caller.org)
                .bind(s.caller.project)
                .fetch_all(self.db())
                .await?;
        Ok(slugs)
    }

    /// The page's HTML, answered.
    pub(super) fn page(&self, name: &str, ctx: Value) -> Result<Response, ConsoleError> {
        Ok(html(StatusCode::OK, self.render(name, ctx)?))
    }
}

pub(super) fn html(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    // The policy, framing and caching headers are every response's (`http::harden`).
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    response
}

fn parse_time(t: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(t).ok().map(|t| t.with_timezone(&Utc))
}

/// "3 min ago", "in 2 h".
pub(super) fn ago(t: &str) -> String {
    parse_time(t).map(|t| ::cli::ago_in(t, [" s", " min", " h", " d"])).unwrap_or_default()
}

/// A time of day in UTC (the date too when it is not today).
pub(super) fn clock(t: &str) -> String {
    let Some(t) = parse_time(t) else { return String::new() };
    if t.date_naive() == Utc::now().date_naive() { t.format("%H:%M:%S UTC").to_string() } else { t.format("%Y-%m-%d %H:%M UTC").to_string() }
}

/// "1 h 4 min", "2 min 5 s", "800 ms".
pub(super) fn duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return String::new();
    }
    if secs < 1.0 {
        return format!("{} ms", (secs * 1000.0).round() as i64);
    }
    let s = secs.round() as i64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

/// A link to the item on GitHub, from its key `["github","owner/name",12]`.
pub(super) fn item_link(key: &str) -> Option<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(key).ok()?;
    let a = v.as_array()?;
    if a.first()?.as_str()? != "github" {
        return None;
    }
    let repo = a.get(1)?.as_str()?;
    if !repo.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')) {
        return None;
    }
    match a.get(2).and_then(serde_json::Value::as_i64) {
        Some(n) => Some((format!("https://github.com/{repo}/issues/{n}"), format!("{repo}#{n}"))),
        None => Some((format!("https://github.com/{repo}"), repo.to_owned())),
    }
}

/// An item's name for people (`acme/web#12`), or its key when it is not a GitHub item.
pub(super) fn item_name(key: &str) -> String {
    item_link(key).map_or_else(|| key.to_owned(), |(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_compiles() {
        templates().expect("templates compile");
    }

    #[test]
    fn urls_round_trip() {
        let s = "/orgs/acme/projects/web/runs?status=failed&x=a b/é";
        assert_eq!(urldecode(&urlencode(s)), s);
        assert_eq!(urldecode("%2"), "%2");
    }

    #[test]
    fn durations_read_as_words() {
        assert_eq!(duration(0.25), "250 ms");
        assert_eq!(duration(65.0), "1 min 5 s");
        assert_eq!(duration(3700.0), "1 h 1 min");
    }
}
