//! GitHub for tests, on loopback: a fake of the REST and GraphQL APIs that records requests and
//! injects failures (`server`), the OAuth web flow that signs people in to the console
//! (`oauth`), and webhook payloads with GitHub's shapes, signed with the real algorithm and
//! posted as GitHub posts them (`payloads`).

pub mod oauth;
pub mod payloads;
pub mod server;

pub use payloads::{sign, Issue, PullRequest, Repo, WebhookClient};
pub use server::{Fault, FakeGithub, Minted, Recorded};
