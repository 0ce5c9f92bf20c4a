//! End-to-end tests across processes: real `shopfloor engine` processes on a test database.

mod blackhole;
mod caps;
mod chaos;
mod check;
mod engine_pool;
mod github_env;
mod github_gates;
mod github_outputs;
mod github_schedule;
mod host_env;
mod host_tokens;
mod hosts;
mod intervene;
mod lifecycle;
mod metrics;
mod pgbouncer;
mod poolers;
mod readme;
mod secrets;
mod serve;
mod sessions;
mod structure;
mod support;
mod telemetry;
mod webhook_targets;
mod webhooks;
