//! GitHub for tests, on loopback: a fake of the REST and GraphQL APIs that records requests and
//! injects failures (`server`), the OAuth web flow that signs people in to the console
//! (`oauth`), and webhook payloads with GitHub's shapes, signed with the real algorithm and
//! posted as GitHub posts them (`payloads`).

pub mod oauth;
pub mod payloads;
pub mod server;

pub use payloads::{Issue, PullRequest, Repo, WebhookClient, sign};
pub use server::{FakeGithub, Fault, Minted, Recorded};

use std::path::PathBuf;
use std::process::Command;

use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The GitHub App's private key (`test_app_key.pem`, made for these tests only).
pub fn app_key() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("github_fake").join("test_app_key.pem")
}

/// The App's public key (`test_app_key.pub.pem`, `openssl rsa -pubout` of [`app_key`]): what
/// GitHub checks the App's JWTs with.
pub fn app_public_key() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("github_fake").join("test_app_key.pub.pem")
}

/// Makes `cmd` (a `shopfloor` process) the GitHub App, id 1 with [`app_key`], against the
/// fake GitHub at `url`, each request given up after `timeout_secs`.
pub fn as_app<'c>(cmd: &'c mut Command, url: &str, timeout_secs: u32) -> &'c mut Command {
    cmd.env("SHOPFLOOR_GITHUB_APP_ID", "1")
        .env("SHOPFLOOR_GITHUB_APP_KEY_FILE", app_key())
        .env("SHOPFLOOR_GITHUB_API_URL", url)
        .env("SHOPFLOOR_GITHUB_GRAPHQL_URL", format!("{url}/graphql"))
        .env("SHOPFLOOR_GITHUB_TIMEOUT_SECS", timeout_secs.to_string())
}

/// GitHub's API refuses a request without a `User-Agent` header with 403 and this text ("All
/// API requests must include a valid User-Agent header"): so do the fakes' API routes.
pub async fn require_user_agent(request: Request, next: Next) -> Response {
    if request.headers().get(header::USER_AGENT).is_some_and(|v| !v.is_empty()) {
        return next.run(request).await;
    }
    let text = "Request forbidden by administrative rules. Please make sure your request has a User-Agent header \
                (https://docs.github.com/en/rest/overview/resources-in-the-rest-api#user-agent-required). \
                Check https://developer.github.com for other possible causes.\n";
    (StatusCode::FORBIDDEN, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}
