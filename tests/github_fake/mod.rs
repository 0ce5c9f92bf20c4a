//! GitHub for tests, on loopback: a fake of the REST and GraphQL APIs that records requests and
//! injects failures (`server`), and webhook payloads with GitHub's shapes, signed with the real
//! algorithm and posted as GitHub posts them (`payloads`).

pub mod payloads;
pub mod server;

pub use payloads::{sign, Issue, PullRequest, Repo, WebhookClient};
pub use server::{Fault, FakeGithub, Recorded};
