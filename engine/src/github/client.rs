//! The GitHub App client: octocrab authenticated as the App (an RS256 JWT), installation tokens
//! scoped to one repository and cached until five minutes before they expire, and calls whose
//! failures are classified for the output executor.
//!
//! Requests go through octocrab's raw methods (`_get`, `_post`, `_delete`) so that the status
//! and the rate-limit headers can be read: a secondary rate limit (403/429 with `Retry-After`,
//! or GitHub's "secondary rate limit" message) and an exhausted primary limit
//! (`x-ratelimit-remaining: 0`, until `x-ratelimit-reset`) are deferrals, not failures. 5xx
//! answers, timeouts and connection errors are retried here with a doubling backoff, and then
//! reported as an outage, which the executor also defers. Any other 4xx is the caller's
//! mistake and final. A redirect (a renamed or transferred repository) is followed within the
//! configured API, with the same method and body.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use octocrab::Octocrab;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

/// GitHub's public API, the default of `SHOPFLOOR_GITHUB_API_URL`.
pub const PUBLIC_API: &str = "https://api.github.com";

/// An installation token is used until this long before it expires, then minted again.
pub const TOKEN_MARGIN: Duration = Duration::from_secs(5 * 60);

/// How a failed call is retried before it counts as an outage: waits of 1 s, 2 s, 4 s.
const RETRIES: u32 = 3;
/// Redirects followed for one call (a renamed or transferred repository answers with one).
const REDIRECTS: u32 = 3;

/// The GitHub App's settings (`SHOPFLOOR_GITHUB_APP_ID`, `SHOPFLOOR_GITHUB_APP_KEY[_FILE]`,
/// `SHOPFLOOR_GITHUB_API_URL`, `SHOPFLOOR_GITHUB_GRAPHQL_URL`).
#[derive(Clone)]
pub struct AppSettings {
    pub app_id: u64,
    /// The App's private key, PEM.
    pub private_key: SecretString,
    /// The REST base URL: GitHub's public API, a GitHub Enterprise `…/api/v3`, or a test fake.
    pub api_url: String,
    /// The GraphQL endpoint; `<api_url>/graphql` when unset.
    pub graphql_url: Option<String>,
    /// How long one request may take.
    pub timeout: Duration,
    /// The first wait of the retry backoff (1 s; tests shorten it).
    pub backoff: Duration,
}

impl std::fmt::Debug for AppSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("AppSettings")
            .field("app_id", &self.app_id)
            .field("api_url", &self.api_url)
            .field("graphql_url", &self.graphql_url)
            .finish_non_exhaustive()
    }
}

/// Why a call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// A 4xx other than a rate limit: retrying cannot help.
    #[error("github {status}: {message}")]
    Client { status: u16, message: String },
    /// A secondary or exhausted primary rate limit: try again after this long.
    #[error("rate limited for {0:?}")]
    RateLimited(Duration),
    /// 5xx, timeouts, connection errors, still failing after the retries.
    #[error("github unavailable: {0}")]
    Unavailable(String),
    /// The App's settings are unusable (a key that does not load, a bad URL).
    #[error("github app: {0}")]
    Config(String),
}

/// An answer with a 2xx status.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
    /// How long until the rate limit resets, when the answer says none is left
    /// (`x-ratelimit-remaining: 0`): GraphQL answers its rate limit with a 200.
    pub exhausted_for: Option<Duration>,
}

#[derive(Clone)]
struct Token {
    value: SecretString,
    expires_at: DateTime<Utc>,
}

/// The cached token of one installation, repository and scope, locked while it is minted.
type TokenSlot = Arc<tokio::sync::Mutex<Option<Token>>>;

/// The App: its JWT-authenticated clients and the installation tokens it minted.
pub struct GithubApp {
    settings: AppSettings,
    /// The App's key, which signs its JWTs (RS256, with ring: jsonwebtoken 9).
    key: jsonwebtoken::EncodingKey,
    /// Without credentials: each call says as whom it is made (the App's JWT, an
    /// installation's token).
    rest: Octocrab,
    /// Based at the GraphQL endpoint's origin, so that a GitHub Enterprise REST path prefix
    /// (`/api/v3`) is not put before `/api/graphql`.
    graphql: Octocrab,
    graphql_path: String,
    /// One slot per installation, repository and scope, each locked across its own mint only:
    /// concurrent steps of one repository mint one token, and a slow mint holds no other.
    tokens: std::sync::Mutex<HashMap<(i64, String, Scope), TokenSlot>>,
}

/// What an installation token may do: each use asks GitHub for the least it needs, so a token
/// that reaches a host or leaks from an output can do nothing else (GitHub's `permissions`
/// of the token request; the App must have been granted at least these).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// A crew step on a host: fetch and push its branch.
    Push,
    /// Find and open the run's pull request.
    PullRequest,
    /// Comments and labels, on issues and pull requests (GitHub's issue routes take either
    /// permission for a pull request's number).
    Issues,
    /// Move a card on a Projects v2 board (the org's projects) and read the item it is for.
    Board,
    /// List the repositories an installation reaches.
    Metadata,
}

impl Scope {
    /// GitHub's `permissions` object.
    pub fn permissions(self) -> Value {
        match self {
            Scope::Push => json!({ "contents": "write" }),
            Scope::PullRequest => json!({ "pull_requests": "write", "contents": "read" }),
            Scope::Issues => json!({ "issues": "write", "pull_requests": "write" }),
            Scope::Board => json!({ "organization_projects": "write", "issues": "read", "pull_requests": "read" }),
            Scope::Metadata => json!({ "metadata": "read" }),
        }
    }
}

impl std::fmt::Debug for GithubApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GithubApp").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// Clients authenticated with one repository's installation token.
#[derive(Debug, Clone)]
pub struct RepoClient {
    rest: Octocrab,
    graphql: Octocrab,
    graphql_path: String,
    backoff: Duration,
    /// The REST API's URL (`https://api.github.com`, `https://host/api/v3`): the only place a
    /// redirect may lead (the token goes with the request).
    api_url: String,
}

/// The GraphQL endpoint beside a REST API: `https://api.github.com/graphql`, and on GitHub
/// Enterprise Server (REST at `/api/v3`) `/api/graphql`.
fn graphql_url_of(api_url: &str) -> String {
    let api = api_url.trim_end_matches('/');
    match api.strip_suffix("/api/v3") {
        Some(host) => format!("{host}/api/graphql"),
        None => format!("{api}/graphql"),
    }
}

/// `https://host:port` and the path of a URL.
fn split_url(url: &str) -> Result<(String, String), CallError> {
    let scheme_end = url.find("://").ok_or_else(|| CallError::Config(format!("`{url}` is not an http(s) URL")))? + 3;
    match url[scheme_end..].find('/') {
        Some(i) => Ok((url[..scheme_end + i].to_owned(), url[scheme_end + i..].to_owned())),
        None => Ok((url.to_owned(), "/".to_owned())),
    }
}

impl GithubApp {
    /// Builds the App's clients. Nothing is sent yet.
    ///
    /// # Errors
    /// `Config` when the key is not an RSA private key in PEM or a URL does not parse.
    pub fn new(settings: AppSettings) -> Result<GithubApp, CallError> {
        let key = jsonwebtoken::EncodingKey::from_rsa_pem(settings.private_key.expose_secret().as_bytes())
            .map_err(|e| CallError::Config(format!("the App key is not an RSA private key in PEM: {e}")))?;
        let graphql_url = settings.graphql_url.clone().unwrap_or_else(|| graphql_url_of(&settings.api_url));
        let (graphql_origin, graphql_path) = split_url(&graphql_url)?;
        let build = |base: &str| -> Result<Octocrab, CallError> {
            Octocrab::builder()
                .base_uri(base)
                .map_err(|e| CallError::Config(format!("`{base}`: {e}")))?
                .set_connect_timeout(Some(settings.timeout))
                .set_read_timeout(Some(settings.timeout))
                .set_write_timeout(Some(settings.timeout))
                .build()
                .map_err(|e| CallError::Config(e.to_string()))
        };
        let rest = build(settings.api_url.trim_end_matches('/'))?;
        let graphql = build(&graphql_origin)?;
        Ok(GithubApp { settings, key, rest, graphql, graphql_path, tokens: std::sync::Mutex::new(HashMap::new()) })
    }

    /// The REST client as the App itself: a JWT of the App's, signed now (GitHub: issued a
    /// minute back for clocks that drift, at most ten minutes long, issued by the App's id).
    fn as_app(&self) -> Result<Octocrab, CallError> {
        let now = Utc::now().timestamp();
        // `iss` a string, as RFC 7519 has it (GitHub takes the id either way).
        let claims = json!({ "iat": now - 60, "exp": now + 540, "iss": self.settings.app_id.to_string() });
        let jwt = jsonwebtoken::encode(&jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256), &claims, &self.key)
            .map_err(|e| CallError::Config(format!("cannot sign the App's JWT: {e}")))?;
        self.rest.user_access_token(SecretString::from(jwt)).map_err(|e| CallError::Config(e.to_string()))
    }

    /// Clients for `repository` (`owner/name`) through `installation`, with a token scoped to
    /// that repository alone and to `scope`'s permissions. A cached token is used until five
    /// minutes before it expires.
    ///
    /// # Errors
    /// As for any call: the token request may be refused, limited or fail.
    pub async fn for_repository(&self, installation: i64, repository: &str, scope: Scope) -> Result<RepoClient, CallError> {
        let token = self.installation_token(installation, repository, scope).await?;
        let as_installation = |crab: &Octocrab| crab.user_access_token(token.clone()).map_err(|e| CallError::Config(e.to_string()));
        Ok(RepoClient {
            rest: as_installation(&self.rest)?,
            graphql: as_installation(&self.graphql)?,
            graphql_path: self.graphql_path.clone(),
            backoff: self.settings.backoff,
            api_url: self.settings.api_url.trim_end_matches('/').to_owned(),
        })
    }

    /// The token of `installation` for `repository` alone with `scope`'s permissions, from the
    /// cache or minted now (`POST /app/installations/{id}/access_tokens` as the App).
    ///
    /// # Errors
    /// As for any call.
    pub async fn installation_token(&self, installation: i64, repository: &str, scope: Scope) -> Result<SecretString, CallError> {
        let key = (installation, repository.to_lowercase(), scope);
        let slot = self.slot(key);
        // Held across the mint, so that concurrent steps of one repository mint one token.
        let mut cached = slot.lock().await;
        if let Some(t) = cached.as_ref() {
            if t.expires_at - chrono::Duration::from_std(TOKEN_MARGIN).unwrap_or_default() > Utc::now() {
                return Ok(t.value.clone());
            }
        }
        let name = repository.rsplit('/').next().unwrap_or(repository);
        let token = self.mint(installation, json!({ "repositories": [name], "permissions": scope.permissions() })).await?;
        *cached = Some(token.clone());
        Ok(token.value)
    }

    /// Drops the cached token of `installation` for `repository` and `scope`: GitHub answered
    /// 401 to it (revoked, or expired sooner than this process's clock says).
    pub async fn forget_token(&self, installation: i64, repository: &str, scope: Scope) {
        *self.slot((installation, repository.to_lowercase(), scope)).lock().await = None;
    }

    fn slot(&self, key: (i64, String, Scope)) -> TokenSlot {
        let mut slots = self.tokens.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        slots.entry(key).or_default().clone()
    }

    /// A new installation token (`body`: GitHub's `repositories` and `permissions`).
    async fn mint(&self, installation: i64, body: Value) -> Result<Token, CallError> {
        let answer = call(
            &self.as_app()?,
            Verb::Post,
            &format!("/app/installations/{installation}/access_tokens"),
            Some(&body),
            self.settings.backoff,
            &self.settings.api_url,
        )
        .await?;
        let value = answer.body.get("token").and_then(Value::as_str).ok_or_else(|| CallError::Unavailable("the token answer has no token".into()))?;
        let expires_at = answer
            .body
            .get("expires_at")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<DateTime<Utc>>().ok())
            // GitHub's tokens last an hour; without a date, assume the least.
            .unwrap_or_else(|| Utc::now() + chrono::Duration::minutes(10));
        Ok(Token { value: SecretString::from(value.to_owned()), expires_at })
    }

    /// The installation as GitHub knows it (`GET /app/installations/{id}` as the App): its
    /// account and repository selection.
    ///
    /// # Errors
    /// As for any call; an id GitHub does not know is `Client { status: 404 }`.
    pub async fn installation(&self, installation: i64) -> Result<Value, CallError> {
        Ok(call(&self.as_app()?, Verb::Get, &format!("/app/installations/{installation}"), None, self.settings.backoff, &self.settings.api_url).await?.body)
    }

    /// Every repository the installation reaches (`owner/name`), from
    /// `GET /installation/repositories` with a metadata-only token of the installation.
    ///
    /// # Errors
    /// As for any call.
    pub async fn installation_repositories(&self, installation: i64) -> Result<Vec<String>, CallError> {
        // At most 5,000 repositories: a bound, not a limit GitHub sets.
        const PAGES: u32 = 50;
        let token = self.mint(installation, json!({ "permissions": Scope::Metadata.permissions() })).await?;
        let crab = self.rest.user_access_token(token.value).map_err(|e| CallError::Config(e.to_string()))?;
        let mut names = Vec::new();
        for page in 1..=PAGES {
            let answer =
                call(&crab, Verb::Get, &format!("/installation/repositories?per_page=100&page={page}"), None, self.settings.backoff, &self.settings.api_url)
                    .await?;
            let list = answer.body.get("repositories").and_then(Value::as_array).cloned().unwrap_or_default();
            names.extend(list.iter().filter_map(|r| r.get("full_name").and_then(Value::as_str)).map(str::to_owned));
            let total = answer.body.get("total_count").and_then(Value::as_u64).unwrap_or(0);
            if list.len() < 100 || names.len() as u64 >= total {
                break;
            }
        }
        Ok(names)
    }
}

impl GithubApp {
    /// The App as GitHub knows it (`GET /app`, authenticated with the App's JWT): proves the
    /// App id and its key without an installation (`shopfloor check`).
    ///
    /// # Errors
    /// As for any call.
    pub async fn about(&self) -> Result<Value, CallError> {
        Ok(call(&self.as_app()?, Verb::Get, "/app", None, self.settings.backoff, &self.settings.api_url).await?.body)
    }

    /// The REST base URL the App calls.
    pub fn api_url(&self) -> &str {
        &self.settings.api_url
    }
}

/// The HTTP methods the outputs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    Post,
    Patch,
    Delete,
}

impl RepoClient {
    /// A REST call (`path` from the API root, with its query).
    ///
    /// # Errors
    /// Classified: `Client` (4xx), `RateLimited`, `Unavailable` (after the retries).
    pub async fn rest(&self, verb: Verb, path: &str, body: Option<&Value>) -> Result<Answer, CallError> {
        call(&self.rest, verb, path, body, self.backoff, &self.api_url).await
    }

    /// A REST call tried once (redirects followed): for a request that may have been done
    /// though its answer was lost, whose caller looks before it tries again.
    ///
    /// # Errors
    /// As for `rest`, `Unavailable` at the first 5xx or transport error.
    pub async fn rest_once(&self, verb: Verb, path: &str, body: Option<&Value>) -> Result<Answer, CallError> {
        follow(&self.rest, verb, path, body, &self.api_url).await
    }

    /// How long the first retry waits (doubling after).
    pub fn backoff(&self) -> Duration {
        self.backoff
    }

    /// A GraphQL call. GitHub answers its errors with a 200: a rate limit (`RATE_LIMITED`, or a
    /// message that says a secondary one was passed) is a rate limit; errors beside `data` that
    /// holds something are partial results (a card on a board the installation cannot see comes
    /// back null), given to the caller to use what came; errors alone are a client error.
    ///
    /// # Errors
    /// As for `rest`.
    pub async fn graphql(&self, query: &str, variables: &Value) -> Result<Value, CallError> {
        let body = json!({ "query": query, "variables": variables });
        let answer = call(&self.graphql, Verb::Post, &self.graphql_path, Some(&body), self.backoff, &self.api_url).await?;
        let data = answer.body.get("data").cloned().unwrap_or(Value::Null);
        let Some(errors) = answer.body.get("errors").and_then(Value::as_array).filter(|e| !e.is_empty()) else { return Ok(data) };
        let message = errors.iter().filter_map(|e| e.get("message").and_then(Value::as_str)).collect::<Vec<_>>().join("; ");
        let limited =
            errors.iter().any(|e| e.get("type").and_then(Value::as_str) == Some("RATE_LIMITED")) || message.to_lowercase().contains("secondary rate limit");
        if limited {
            // The primary limit says when it resets; a secondary one asks for a minute at least.
            return Err(CallError::RateLimited(answer.exhausted_for.unwrap_or(Duration::from_secs(60))));
        }
        if data.as_object().is_some_and(|d| d.values().any(|v| !v.is_null())) {
            tracing::warn!(github.errors = message, "github answered part of a GraphQL query");
            return Ok(data);
        }
        Err(CallError::Client { status: 200, message: crate::store::cap(&message) })
    }
}

/// One call with its retries ([`with_retries`]), its redirects followed ([`follow`]).
async fn call(crab: &Octocrab, verb: Verb, path: &str, body: Option<&Value>, backoff: Duration, api_url: &str) -> Result<Answer, CallError> {
    with_retries(backoff, path, || follow(crab, verb, path, body, api_url)).await
}

/// Runs `attempt` again while it fails with an outage (a 5xx, a timeout, a transport error),
/// after `backoff`, doubling, [`RETRIES`] times; `what` names it in the log.
///
/// # Errors
/// The last attempt's.
pub(crate) async fn with_retries<T, F, Fut>(backoff: Duration, what: &str, mut attempt: F) -> Result<T, CallError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, CallError>>,
{
    let mut wait = backoff;
    for _ in 0..RETRIES {
        match attempt().await {
            Err(CallError::Unavailable(why)) => {
                tracing::info!(github.path = what, why, retry_in_ms = wait.as_millis() as u64, "github call failed; retrying");
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            done => return done,
        }
    }
    attempt().await
}

/// One request, its redirects followed (GitHub's answer for a renamed or transferred
/// repository: 301 for a GET, 307 for the rest) with the same method and body, within
/// `api_url` only: the token goes with the request.
async fn follow(crab: &Octocrab, verb: Verb, path: &str, body: Option<&Value>, api_url: &str) -> Result<Answer, CallError> {
    let mut path = path.to_owned();
    for _ in 0..REDIRECTS {
        match send(crab, verb, &path, body).await? {
            Sent::Answer(answer) => return Ok(answer),
            Sent::Moved(location) => {
                path = within(&location, api_url).ok_or_else(|| CallError::Client {
                    status: 307,
                    message: crate::store::cap(&format!("redirected away from GitHub's API, to {location}: not followed")),
                })?;
            }
        }
    }
    match send(crab, verb, &path, body).await? {
        Sent::Answer(answer) => Ok(answer),
        Sent::Moved(location) => Err(CallError::Client { status: 307, message: crate::store::cap(&format!("too many redirects (last to {location})")) }),
    }
}

/// The path, from the API's root, of a redirect's `Location` when it stays within `api_url`
/// (a path, or a URL under it).
fn within(location: &str, api_url: &str) -> Option<String> {
    let (origin, base) = split_url(api_url).ok()?;
    let path = if location.starts_with('/') && !location.starts_with("//") { location } else { location.strip_prefix(&origin)? };
    let path = path.strip_prefix(base.trim_end_matches('/')).unwrap_or(path);
    path.starts_with('/').then(|| path.to_owned())
}

/// What one request came to: a classified answer, or a redirect to follow.
enum Sent {
    Answer(Answer),
    Moved(String),
}

async fn send(crab: &Octocrab, verb: Verb, path: &str, body: Option<&Value>) -> Result<Sent, CallError> {
    let sent = match verb {
        Verb::Get => crab._get(path).await,
        Verb::Post => crab._post(path, body).await,
        Verb::Patch => crab._patch(path, body).await,
        Verb::Delete => crab._delete(path, body).await,
    };
    let response = sent.map_err(|e| CallError::Unavailable(crate::store::cap(&transport(&e))))?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    if let (301 | 302 | 307 | 308, Some(location)) = (status, header("location")) {
        return Ok(Sent::Moved(location));
    }
    let text = crab.body_to_string(response).await.map_err(|e| CallError::Unavailable(crate::store::cap(&e.to_string())))?;
    let body: Value = if text.trim().is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
    classify(status, &header, body).map(Sent::Answer)
}

/// A transport error in words, with its sources (octocrab's own display says only "Service
/// Error").
fn transport(e: &octocrab::Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Sorts an answer into success, rate limit, outage or client error.
pub fn classify(status: u16, header: &dyn Fn(&str) -> Option<String>, body: Value) -> Result<Answer, CallError> {
    let exhausted_for = (header("x-ratelimit-remaining").as_deref() == Some("0")).then(|| {
        let reset = header("x-ratelimit-reset").and_then(|v| v.trim().parse::<i64>().ok());
        Duration::from_secs(reset.map_or(60, |r| (r - Utc::now().timestamp()).clamp(1, 3600)).unsigned_abs())
    });
    if (200..300).contains(&status) {
        return Ok(Answer { status, body, exhausted_for });
    }
    let message = body.get("message").and_then(Value::as_str).unwrap_or_default().to_owned();
    if status == 403 || status == 429 {
        if let Some(secs) = header("retry-after").and_then(|v| v.trim().parse::<u64>().ok()) {
            return Err(CallError::RateLimited(Duration::from_secs(secs)));
        }
        if let Some(wait) = exhausted_for {
            return Err(CallError::RateLimited(wait));
        }
        if message.to_lowercase().contains("secondary rate limit") || status == 429 {
            // GitHub asks for at least a minute when it gives no time.
            return Err(CallError::RateLimited(Duration::from_secs(60)));
        }
    }
    if status >= 500 {
        return Err(CallError::Unavailable(format!("{status} {message}")));
    }
    Err(CallError::Client { status, message: crate::store::cap(&message) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers<'a>(list: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| list.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn graphql_is_beside_the_rest_api() {
        assert_eq!(graphql_url_of("https://api.github.com"), "https://api.github.com/graphql");
        assert_eq!(graphql_url_of("https://git.example.com/api/v3/"), "https://git.example.com/api/graphql");
        assert_eq!(graphql_url_of("http://127.0.0.1:9/"), "http://127.0.0.1:9/graphql");
    }

    #[test]
    fn a_redirect_is_followed_only_within_the_api() {
        let github = "https://api.github.com";
        assert_eq!(within("https://api.github.com/repositories/9/issues/5/comments", github).as_deref(), Some("/repositories/9/issues/5/comments"));
        assert_eq!(within("/repos/acme/gadgets/pulls", github).as_deref(), Some("/repos/acme/gadgets/pulls"));
        let enterprise = "https://git.example.com/api/v3";
        assert_eq!(within("https://git.example.com/api/v3/repositories/9", enterprise).as_deref(), Some("/repositories/9"));
        for away in ["https://evil.example/repos/x", "https://api.github.com.evil.example/x", "//evil.example/x", "http://api.github.com/x", "repos/x"] {
            assert_eq!(within(away, github), None, "{away}");
        }
    }

    #[test]
    fn answers_are_classified() {
        assert!(classify(201, &headers(&[]), json!({})).is_ok());
        assert_eq!(classify(403, &headers(&[("retry-after", "30")]), json!({})).unwrap_err(), CallError::RateLimited(Duration::from_secs(30)));
        let secondary = json!({ "message": "You have exceeded a secondary rate limit. Please wait." });
        assert_eq!(classify(403, &headers(&[]), secondary).unwrap_err(), CallError::RateLimited(Duration::from_secs(60)));
        assert!(matches!(classify(403, &headers(&[("x-ratelimit-remaining", "0")]), json!({})), Err(CallError::RateLimited(_))));
        assert!(matches!(classify(502, &headers(&[]), json!({})), Err(CallError::Unavailable(_))));
        assert_eq!(
            classify(422, &headers(&[]), json!({ "message": "Validation Failed" })).unwrap_err(),
            CallError::Client { status: 422, message: "Validation Failed".into() }
        );
        assert!(matches!(
            classify(403, &headers(&[]), json!({ "message": "Resource not accessible by integration" })),
            Err(CallError::Client { status: 403, .. })
        ));
        // GraphQL's primary limit comes in a 200 whose headers say when it resets.
        let reset = (Utc::now().timestamp() + 600).to_string();
        let spent = classify(200, &headers(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", &reset)]), json!({})).unwrap();
        assert!(spent.exhausted_for.is_some_and(|d| (590..=600).contains(&d.as_secs())), "{:?}", spent.exhausted_for);
        assert_eq!(classify(200, &headers(&[("x-ratelimit-remaining", "4999")]), json!({})).unwrap().exhausted_for, None);
    }

    #[test]
    fn graphql_urls_split_into_origin_and_path() {
        assert_eq!(split_url("https://ghe.example.com/api/graphql").unwrap(), ("https://ghe.example.com".into(), "/api/graphql".into()));
        assert_eq!(split_url("http://127.0.0.1:9/graphql").unwrap(), ("http://127.0.0.1:9".into(), "/graphql".into()));
        assert!(split_url("nope").is_err());
    }
}
