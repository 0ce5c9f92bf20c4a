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

/// The GitHub App's private key (`test_app_key.pem`, made for these tests only).
pub fn app_key() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("github_fake").join("test_app_key.pem")
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
