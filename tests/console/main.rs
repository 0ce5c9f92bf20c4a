//! The web console's tests: pages and forms over HTTP (`pages`), tenancy across orgs
//! (`tenancy`), statements and index use per page on 10,000 seeded runs (`scale`), and the
//! browser tests in headless Chromium (`browser`; `operate`: adding a host and running it,
//! draining, budgets, members and webhooks; `attend`: approvals, failures, edit-and-retry and
//! cycle budgets answered from Today and the run page; `chromium`: the kit). Each test serves the API with the console on
//! a loopback port against a database of its own (`DATABASE_URL` names the server).

mod attend;
mod browser;
mod chromium;
mod connect;
#[path = "../../api/tests/it/harness.rs"]
mod harness;
mod operate;
mod pages;
mod scale;
mod support;
mod tenancy;
