//! shopfloor's HTTP surface and the `shopfloor` command line.
//!
//! `http` holds the axum router (health, readiness and the REST API with its OpenAPI document;
//! webhooks and the host protocol join it), `console` the web console served beside it, `auth`
//! the service's tokens, `cli` the subcommands of the one binary, `telemetry` the logs, traces
//! and event log of a process (OTLP when configured).

pub mod auth;
pub mod cli;
pub mod console;
pub mod http;
pub mod telemetry;
pub mod webhooks;
