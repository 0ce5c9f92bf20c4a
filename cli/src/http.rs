//! The HTTP client of the command line: one server, one bearer token, an org and a project.
//!
//! Paths are built segment by segment, so a node called `$start` or a workflow name with odd
//! characters is percent-encoded, never spliced into the URL. An answer that is not a success
//! becomes `ClientError::Refused` with the problem's title and detail (RFC 9457), which is
//! what the user reads.

use std::time::Duration;

use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::config::{self, Settings};
use super::error::{ClientError, WorkflowProblem};
use super::{Conn, say};

/// How long one ordinary request may take (the event stream has no limit).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Deserialize)]
struct Problem {
    title: String,
    #[serde(default)]
    detail: String,
    #[serde(default)]
    problems: Option<Vec<WorkflowProblem>>,
}

/// A successful answer's body, kept as bytes so `--json` prints it as is.
pub(crate) struct Answer {
    pub body: Vec<u8>,
}

impl Answer {
    /// The answer read into `T`, its text made safe to print ([`defang`]).
    pub(crate) fn json<T: DeserializeOwned>(&self) -> Result<T, ClientError> {
        let mut value = self.raw_value()?;
        defang(&mut value);
        serde_json::from_value(value).map_err(unexpected)
    }

    pub(crate) fn value(&self) -> Result<Value, ClientError> {
        self.json()
    }

    /// Prints the answer: the API's bytes with `--json`, else what `show` makes of it read as
    /// `T` (its text made safe to print).
    pub(crate) fn print<T: DeserializeOwned>(&self, json: bool, show: impl FnOnce(T)) -> Result<(), ClientError> {
        if json {
            say!("{}", self.text());
        } else {
            show(self.json()?);
        }
        Ok(())
    }

    /// The answer read as sent, control characters and all: only for text that goes where no
    /// terminal reads it (`workflows show` into a file).
    pub(crate) fn raw_value(&self) -> Result<Value, ClientError> {
        serde_json::from_slice(&self.body).map_err(unexpected)
    }

    /// The body as the API sent it, for `--json`.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn unexpected(e: serde_json::Error) -> ClientError {
    ClientError::Failed(format!("the server's answer is not what this client expects ({e})"))
}

/// A request body.
pub(crate) enum Body {
    None,
    Json(Value),
    Yaml(String),
}

/// A connection to one server, as one principal, in one org (and maybe one project).
pub(crate) struct Api {
    http: reqwest::Client,
    base: Url,
    token: String,
    org: Option<String>,
    project: Option<String>,
}

impl Api {
    /// The client a command's connection settings say (`--server` and the rest, else the
    /// environment and the config file).
    pub(crate) fn connect(conn: &Conn) -> Result<Api, ClientError> {
        Api::new(&config::settings(conn)?)
    }

    pub(crate) fn new(settings: &Settings) -> Result<Api, ClientError> {
        let server =
            settings.server.as_deref().ok_or_else(|| ClientError::Usage("no server: run `shopfloor login --server URL` or set SHOPFLOOR_SERVER".into()))?;
        let token = settings.token.clone().ok_or_else(|| ClientError::Usage("no token: run `shopfloor login` or set SHOPFLOOR_TOKEN".into()))?;
        Api::with(server, token, settings.org.clone(), settings.project.clone())
    }

    pub(crate) fn with(server: &str, token: String, org: Option<String>, project: Option<String>) -> Result<Api, ClientError> {
        let base = parse_server(server)?;
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("shopfloor-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(ClientError::failed)?;
        Ok(Api { http, base, token, org, project })
    }

    pub(crate) fn server(&self) -> &str {
        self.base.as_str().trim_end_matches('/')
    }

    pub(crate) fn org(&self) -> Result<&str, ClientError> {
        self.org.as_deref().ok_or_else(|| ClientError::Usage("no org: give --org, set SHOPFLOOR_ORG, or run `shopfloor context --org ORG`".into()))
    }

    pub(crate) fn project(&self) -> Result<&str, ClientError> {
        self.project
            .as_deref()
            .ok_or_else(|| ClientError::Usage("no project: give --project, set SHOPFLOOR_PROJECT, or run `shopfloor context --project PROJECT`".into()))
    }

    pub(crate) fn has_project(&self) -> bool {
        self.project.is_some()
    }

    /// `<server>/<segments…>`, each segment percent-encoded.
    pub(crate) fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// `/api/v1/orgs/{org}/<rest…>`.
    pub(crate) fn org_url(&self, rest: &[&str]) -> Result<Url, ClientError> {
        let mut segments = vec!["api", "v1", "orgs", self.org()?];
        segments.extend_from_slice(rest);
        Ok(self.url(&segments))
    }

    /// `/api/v1/orgs/{org}/projects/{project}/<rest…>`.
    pub(crate) fn project_url(&self, rest: &[&str]) -> Result<Url, ClientError> {
        let mut segments = vec!["api", "v1", "orgs", self.org()?, "projects", self.project()?];
        segments.extend_from_slice(rest);
        Ok(self.url(&segments))
    }

    /// A request with the bearer token, for callers that need the response itself (streams).
    pub(crate) fn request(&self, method: Method, url: Url) -> reqwest::RequestBuilder {
        self.http.request(method, url).bearer_auth(&self.token)
    }

    /// Sends a request; a non-success answer is `Refused` with the problem's words.
    pub(crate) async fn send(&self, method: Method, url: Url, body: Body) -> Result<Answer, ClientError> {
        let mut req = self.request(method, url).timeout(REQUEST_TIMEOUT);
        req = match body {
            Body::None => req,
            Body::Json(v) => req.json(&v),
            Body::Yaml(text) => req.header(reqwest::header::CONTENT_TYPE, "application/yaml").body(text),
        };
        let resp = req.send().await.map_err(|e| self.unreachable(&e))?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| self.unreachable(&e))?.to_vec();
        if status.is_success() { Ok(Answer { body }) } else { Err(refused(status, &body)) }
    }

    pub(crate) async fn get(&self, url: Url) -> Result<Answer, ClientError> {
        self.send(Method::GET, url, Body::None).await
    }

    pub(crate) async fn post(&self, url: Url, body: Body) -> Result<Answer, ClientError> {
        self.send(Method::POST, url, body).await
    }

    pub(crate) fn unreachable(&self, e: &reqwest::Error) -> ClientError {
        let why = if e.is_timeout() {
            "it did not answer in time".to_owned()
        } else if e.is_connect() {
            "the connection was refused or failed".to_owned()
        } else {
            // reqwest's own message names the URL; its source says what went wrong.
            std::error::Error::source(e).map_or_else(|| e.to_string(), ToString::to_string)
        };
        ClientError::Failed(format!("cannot reach the server at {}: {why}", self.server()))
    }
}

/// The server's URL: `http(s)://host[:port][/prefix]`; a bare `host:port` means http.
pub(crate) fn parse_server(text: &str) -> Result<Url, ClientError> {
    let text = text.trim();
    let with_scheme = if text.contains("://") { text.to_owned() } else { format!("http://{text}") };
    let url = Url::parse(&with_scheme).map_err(|e| ClientError::Usage(format!("`{text}` is not a server URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
        return Err(ClientError::Usage(format!("`{text}` is not an http or https URL")));
    }
    Ok(url)
}

/// The URL with one query pair for each given value.
pub(crate) fn with_query(mut url: Url, pairs: &[(&str, Option<&str>)]) -> Url {
    let given: Vec<(&str, &str)> = pairs.iter().filter_map(|(k, v)| v.map(|v| (*k, v))).collect();
    if !given.is_empty() {
        url.query_pairs_mut().extend_pairs(given);
    }
    url
}

/// The error of a non-success answer: the problem's title and detail, or the status and the
/// start of whatever body came instead (a proxy's error page).
pub(crate) fn refused(status: StatusCode, body: &[u8]) -> ClientError {
    let problem = serde_json::from_slice::<Value>(body).ok().and_then(|mut v| {
        defang(&mut v);
        serde_json::from_value::<Problem>(v).ok()
    });
    match problem {
        Some(p) => {
            ClientError::Refused { status: status.as_u16(), title: one_line(&p.title), detail: one_line(&p.detail), problems: p.problems.unwrap_or_default() }
        }
        None => {
            let text: String = String::from_utf8_lossy(body).chars().take(200).collect();
            let title = status.canonical_reason().unwrap_or("HTTP error").to_owned();
            let detail = if text.trim().is_empty() { format!("HTTP {}", status.as_u16()) } else { format!("HTTP {}: {}", status.as_u16(), one_line(&text)) };
            ClientError::Refused { status: status.as_u16(), title, detail, problems: Vec::new() }
        }
    }
}

fn one_line(text: &str) -> String {
    defang_text(text).split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What the server holds was written by people and agents (a reason, a workflow's name, an
/// answer, a transcript): a control character in it would act on the terminal (`ESC [2J`
/// clears it, `ESC ]0;` retitles it), so every one but a newline or a tab is shown as its
/// escape (`\u{1b}`). `--json` prints the API's own text, where JSON escapes them already.
pub(crate) fn defang(value: &mut Value) {
    match value {
        Value::String(s) if s.chars().any(acts_on_terminal) => *s = defang_text(s),
        Value::Array(items) => items.iter_mut().for_each(defang),
        Value::Object(fields) => fields.values_mut().for_each(defang),
        _ => {}
    }
}

fn defang_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if acts_on_terminal(c) { out.extend(c.escape_default()) } else { out.push(c) }
    }
    out
}

fn acts_on_terminal(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}
