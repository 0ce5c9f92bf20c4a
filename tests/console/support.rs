//! What the console's tests share beyond the harness of the API's tests (`harness`, from
//! `api/tests/it/harness.rs`: a database of the test's own, the fake GitHub OAuth, the app
//! served on a loopback port): the app with the console, an in-process engine (without the test
//! executor: crew steps wait for a host, as in production), orgs with their people, and an
//! HTTP client that keeps the session cookie by hand.

use std::collections::HashMap;
use std::time::Duration;

use api::console::ConsoleConfig;
use api::http::AppState;
use engine::ids::{OrgId, ProjectId, RunId, UserId, WorkflowId};
use engine::pool::PoolConfig;
use engine::store::{Actor, Change, workflows};
use reqwest::StatusCode;
use reqwest::header::{COOKIE, HeaderMap, LOCATION, SET_COOKIE};
use shopfloor_tests::github_fake::oauth::{CLIENT_ID, CLIENT_SECRET, FakeOauth};

use crate::chromium::{Driver, driver};
pub(crate) use crate::harness::App;
use crate::harness::token;

pub(crate) const APPROVAL: &str = include_str!("../workflows/approve_release.yaml");
pub(crate) const AGENT: &str = include_str!("../workflows/agent.yaml");
pub(crate) const SLOW: &str = include_str!("../workflows/slow.yaml");

pub(crate) struct Org {
    pub id: OrgId,
    pub project: ProjectId,
    pub owner: UserId,
    pub owner_token: String,
    pub viewer_token: String,
    pub approve: WorkflowId,
    pub agent: WorkflowId,
    pub slow: WorkflowId,
}

/// The console's settings pointing at the fake GitHub.
pub(crate) fn console_config(oauth: &FakeOauth) -> ConsoleConfig {
    ConsoleConfig {
        github_client_id: Some(CLIENT_ID.into()),
        github_client_secret: Some(CLIENT_SECRET.to_owned().into()),
        github_oauth_url: oauth.url.clone(),
        github_oauth_api_url: oauth.url.clone(),
        github_app_slug: Some("shopfloor-test".into()),
        ..ConsoleConfig::default()
    }
}

/// A `command` session's report of one transcript line with its running usage, as a host sends it.
pub(crate) async fn report_line(
    pool: &engine::db::Db, host: &engine::store::hosts::HostRow, step: engine::ids::StepId, line: engine::store::hosts::LogLine, usage: &protocol::Usage,
) {
    use engine::store::hosts::{RUN_LOG_CAP_BYTES, Report, report};
    report(pool, host, step, Report { harness: Some("command"), lines: &[line], usage, egress_refused: &[] }, RUN_LOG_CAP_BYTES).await.expect("report");
}

/// The secret the App's webhooks are signed with.
pub(crate) const WEBHOOK_SECRET: &str = "the console tests' webhook secret";

/// The whole app as `shopfloor api` serves it (`api::cli::app`: REST, GitHub's webhooks signed
/// with [`WEBHOOK_SECRET`], the console).
pub(crate) fn app(state: AppState, cfg: ConsoleConfig) -> axum::Router {
    api::cli::app(&state, Some(WEBHOOK_SECRET.to_owned().into()), cfg)
}

impl App {
    pub(crate) async fn start(with_engine: bool) -> App {
        App::start_with(with_engine, None).await
    }

    /// Also acting as the GitHub App (`github_app`) where the REST API calls GitHub as the App.
    pub(crate) async fn start_with(with_engine: bool, github_app: Option<std::sync::Arc<engine::github::GithubApp>>) -> App {
        init_tracing();
        let mut served = App::serve(false, |state, github| {
            if let Some(app) = github_app {
                state.use_github_app(app);
            }
            app(state.clone(), console_config(github))
        })
        .await;
        if with_engine {
            let cfg =
                PoolConfig { max_in_flight: 16, drain: Duration::from_secs(2), ..engine::testkit::pool_config("console-test-engine", &served.db.url, None) };
            served.start_engine(cfg);
        }
        served
    }

    /// The one value `sql` reads, with `arg` as $1.
    pub(crate) async fn read<T, A>(&self, sql: &str, arg: A) -> T
    where
        T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
        A: for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + 'static,
    {
        sqlx::query_scalar(sql).bind(arg).fetch_one(self.pool()).await.unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Records `usd` spent today by the org's project (1,000 tokens), as hosts' session
    /// reports do.
    pub(crate) async fn record_spend(&self, org: &Org, usd: f64) {
        let mut ch = Change::begin(self.pool(), Actor::System).await.unwrap();
        engine::store::budgets::record_spend(&mut ch, org.id, org.project, usd, 1000).await.unwrap();
        ch.commit().await.unwrap();
    }

    /// A browser signed in with `token`.
    pub(crate) async fn signed_in(&self, token: &str) -> Browser {
        let mut browser = Browser::new(&self.base);
        browser.sign_in_with_token(token).await;
        browser
    }

    /// An org with a project `web`, the three workflows, an owner (GitHub login `<slug>-owner`)
    /// and a viewer, with a token each.
    pub(crate) async fn org(&self, slug: &str) -> Org {
        let pool = self.pool();
        let mut ch = Change::begin(pool, Actor::System).await.unwrap();
        let people = engine::testkit::org_with_people(&mut ch, slug, ["viewer"]).await;
        let (id, project, owner, [viewer]) = (people.org, people.project, people.owner, people.members);
        let (approve, _) = workflows::put_version(&mut ch, id, project, "approve", APPROVAL).await.unwrap();
        let (agent, _) = workflows::put_version(&mut ch, id, project, "agent", AGENT).await.unwrap();
        let (slow, _) = workflows::put_version(&mut ch, id, project, "slow", SLOW).await.unwrap();
        let day = chrono::Duration::days(1);
        let owner_token = token(&mut ch, id, owner, "owner", day).await;
        let viewer_token = token(&mut ch, id, viewer, "viewer", day).await;
        ch.commit().await.unwrap();
        // Test setup: people's GitHub logins are recorded by whoever adds them (not yet an API).
        sqlx::query("UPDATE users SET github_login = $2 WHERE user_id = $1").bind(owner).bind(format!("{slug}-owner")).execute(pool).await.unwrap();
        Org { id, project, owner, owner_token, viewer_token, approve, agent, slow }
    }

    /// Submits a run of `workflow` through the store, as the REST submit does.
    pub(crate) async fn submit(&self, org: &Org, workflow: WorkflowId) -> RunId {
        self.submit_to(org.id, org.project, workflow).await
    }

    /// A run of `org`'s `approve`, once it is parked at its approval.
    pub(crate) async fn asking(&self, org: &Org) -> RunId {
        let run = self.submit(org, org.approve).await;
        self.until_asked(run).await;
        run
    }

    /// Waits until `run` is parked at an approval no one has answered.
    pub(crate) async fn until_asked(&self, run: RunId) {
        let sql = "SELECT EXISTS (SELECT 1 FROM approvals WHERE run_id = $1 AND decision IS NULL)";
        self.until(run, sql, "an open approval").await;
    }

    /// A run of `org`'s `slow`, once its events have made at least one webhook delivery.
    pub(crate) async fn delivered(&self, org: &Org) -> RunId {
        let run = self.submit(org, org.slow).await;
        let sql = "SELECT EXISTS (SELECT 1 FROM webhook_deliveries WHERE run_id = $1)";
        self.until(run, sql, "a delivery").await;
        run
    }

    /// Waits until `run` is held by a budget.
    pub(crate) async fn until_held_by_budget(&self, run: RunId) {
        let sql = "SELECT EXISTS (SELECT 1 FROM admission_waits WHERE run_id = $1 AND hold = 'budget')";
        self.until(run, sql, "held by the budget").await;
    }

    /// Waits until `run`'s crew step `build` waits for a host to take it.
    pub(crate) async fn until_build_pending(&self, run: RunId) {
        let sql = "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'build' AND state = 'pending')";
        self.until(run, sql, "a crew step for a host").await;
    }
}

/// A test's opening: the app as [`App::start`] serves it, with the org `acme`.
pub(crate) async fn acme(with_engine: bool) -> (App, Org) {
    let app = App::start(with_engine).await;
    let org = app.org("acme").await;
    (app, org)
}

/// [`acme`], with a [`Browser`] signed in as the org's owner.
pub(crate) async fn acme_owner(with_engine: bool) -> (App, Org, Browser) {
    let (app, org) = acme(with_engine).await;
    let browser = app.signed_in(&org.owner_token).await;
    (app, org, browser)
}

/// The pages of the org `acme` and its project `web` that a test of every page reads, by name:
/// Today, the audit log, the tokens and `org_pages`; the runs, the hosts, the workflows,
/// `approve`, the pages of a run `waiting` at its approval and of a `failed` one, and
/// `project_pages` (each a name and the path below the org's or the project's).
pub(crate) fn acme_pages(
    waiting: RunId, failed: RunId, org_pages: &[(&'static str, &str)], project_pages: &[(&'static str, &str)],
) -> Vec<(&'static str, String)> {
    let runs = (format!("/runs/{waiting}"), format!("/runs/{failed}"));
    let org = [("today", ""), ("audit", "/audit"), ("tokens", "/tokens")].into_iter().chain(org_pages.iter().copied());
    let project = [
        ("runs", "/runs"),
        ("hosts", "/hosts"),
        ("workflows", "/workflows"),
        ("workflow", "/workflows/approve"),
        ("run-waiting", &runs.0),
        ("run-failed", &runs.1),
    ];
    let project = project.into_iter().chain(project_pages.iter().copied()).map(|(name, rest)| (name, format!("/orgs/acme/projects/web{rest}")));
    org.map(|(name, rest)| (name, format!("/orgs/acme{rest}"))).chain(project).collect()
}

/// A browser test's opening: the WebDriver, and [`acme`].
pub(crate) async fn driven(with_engine: bool) -> (Driver, App, Org) {
    let d = driver().await;
    let (app, org) = acme(with_engine).await;
    (d, app, org)
}

/// A browser test's end: closes the browser's session, then drops the app's database.
pub(crate) async fn close(c: fantoccini::Client, app: App) {
    c.close().await.unwrap();
    app.discard().await;
}

/// A browser-like HTTP client: no automatic redirects, cookies kept by hand.
pub(crate) struct Browser {
    pub http: reqwest::Client,
    pub cookies: HashMap<String, String>,
    pub base: String,
}

pub(crate) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Answer {
    /// Fails the test, showing the body, unless the body holds `needle`.
    pub(crate) fn shows(&self, needle: &str) {
        assert!(self.body.contains(needle), "{needle:?} is not in:\n{}", self.body);
    }

    pub(crate) fn location(&self) -> String {
        self.headers.get(LOCATION).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
    }
}

impl Browser {
    pub(crate) fn new(base: &str) -> Browser {
        let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        Browser { http, cookies: HashMap::new(), base: base.to_owned() }
    }

    fn cookie_header(&self) -> String {
        self.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ")
    }

    fn keep(&mut self, headers: &HeaderMap) {
        for v in headers.get_all(SET_COOKIE) {
            let text = v.to_str().unwrap_or_default();
            let pair = text.split(';').next().unwrap_or_default();
            let Some((k, v)) = pair.split_once('=') else {
                continue;
            };
            if text.contains("Max-Age=0") || v.is_empty() {
                self.cookies.remove(k);
            } else {
                self.cookies.insert(k.to_owned(), v.to_owned());
            }
        }
    }

    fn absolute(&self, path: &str) -> String {
        if path.starts_with("http") { path.to_owned() } else { format!("{}{path}", self.base) }
    }

    pub(crate) async fn get(&mut self, path: &str) -> Answer {
        let resp = self.http.get(self.absolute(path)).header(COOKIE, self.cookie_header()).send().await.expect("request");
        self.answer(resp).await
    }

    /// Opens a stream (an `EventSource`'s GET, with the cookie) and hands back the response
    /// unread, to be read chunk by chunk.
    pub(crate) async fn stream(&self, path: &str) -> reqwest::Response {
        self.http.get(self.absolute(path)).header(COOKIE, self.cookie_header()).header("accept", "text/event-stream").send().await.expect("request")
    }

    pub(crate) async fn post(&mut self, path: &str, form: &[(&str, &str)]) -> Answer {
        let resp = self.http.post(self.absolute(path)).header(COOKIE, self.cookie_header()).form(form).send().await.expect("request");
        self.answer(resp).await
    }

    /// Posts a form as its page sends it: the page's CSRF field, then `fields`.
    pub(crate) async fn post_form(&mut self, path: &str, csrf: &str, fields: &[(&str, &str)]) -> Answer {
        let mut form = vec![("_csrf", csrf)];
        form.extend_from_slice(fields);
        self.post(path, &form).await
    }

    /// Presses a form's only button: posts its CSRF field alone.
    pub(crate) async fn press(&mut self, path: &str, csrf: &str) -> Answer {
        self.post_form(path, csrf, &[]).await
    }

    /// Presses a form's only button and follows where it leads: the page.
    pub(crate) async fn press_and_follow(&mut self, path: &str, csrf: &str) -> Answer {
        let answer = self.press(path, csrf).await;
        self.follow(answer).await
    }

    async fn answer(&mut self, resp: reqwest::Response) -> Answer {
        let status = resp.status();
        let headers = resp.headers().clone();
        self.keep(&headers);
        let streaming = headers.get(reqwest::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let body = if streaming { String::new() } else { resp.text().await.unwrap_or_default() };
        Answer { status, headers, body }
    }

    /// Follows redirects (by hand, so cookies set on the way are kept) up to a page.
    pub(crate) async fn follow(&mut self, mut answer: Answer) -> Answer {
        for _ in 0..10 {
            if !answer.status.is_redirection() {
                return answer;
            }
            let to = answer.location();
            answer = self.get(&to).await;
        }
        panic!("too many redirects");
    }

    /// Signs in with an API token through the sign-in form.
    pub(crate) async fn sign_in_with_token(&mut self, token: &str) -> Answer {
        let page = self.get("/signin").await;
        let csrf = page_csrf(&page.body);
        let answer = self.post_form("/signin/token", &csrf, &[("token", token), ("next", "/")]).await;
        self.follow(answer).await
    }
}

/// The value of the first `<input name="NAME" value="…">` of a page.
pub(crate) fn field(html: &str, name: &str) -> Option<String> {
    let at = html.find(&format!("name=\"{name}\""))?;
    let rest = &html[at..];
    let v = rest.find("value=\"")?;
    let rest = &rest[v + 7..];
    Some(rest[..rest.find('"')?].replace("&amp;", "&").replace("&#x2f;", "/").replace("&#x2F;", "/"))
}

/// The CSRF field of the page's own forms (the header's sign-out form has another).
pub(crate) fn page_csrf(html: &str) -> String {
    let main = html.find("<main").expect("a main element");
    field(&html[main..], "_csrf").expect("a form with a CSRF field")
}

/// Installs, once per test binary, the tracing subscriber: errors to the test's output, and the
/// count of statements sqlx sends on each thread (for `scale`).
pub(crate) fn init_tracing() {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    static INSTALLED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    INSTALLED.get_or_init(|| {
        let errors = tracing_subscriber::fmt::layer().with_test_writer().with_filter(tracing_subscriber::filter::LevelFilter::WARN);
        let subscriber = tracing_subscriber::registry()
            .with(errors)
            .with(crate::scale::CountStatements.with_filter(tracing_subscriber::filter::filter_fn(crate::scale::counted)));
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
}

/// How many times `needle` occurs in `html`.
pub(crate) fn count(html: &str, needle: &str) -> usize {
    html.matches(needle).count()
}
