//! shopfloor's HTTP surface and the `shopfloor` command line.
//!
//! `http` holds the axum router (health, readiness and the REST API with its OpenAPI document;
//! webhooks, the host protocol and the console join it), `auth` the service's tokens, `cli`
//! the subcommands of the one binary.

pub mod auth;
pub mod cli;
pub mod http;
pub mod webhooks;
