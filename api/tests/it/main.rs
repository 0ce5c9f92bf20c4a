//! The API's integration tests: one binary, one module per concern. Each test serves the
//! router on a loopback port against a database of its own (`DATABASE_URL` names the server).

mod authz;
mod bad_input;
mod cli;
mod cli_admin;
mod end_to_end;
mod events;
mod harness;
mod host_budget;
mod idempotency;
mod limits;
mod messages;
mod openapi;
mod operator;
mod paging;
mod row_security;
mod signing_keys;
mod support;
mod tenancy;
mod unavailable;
mod webhooks_out;
mod workflows;
