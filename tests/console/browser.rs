//! The console in a real browser: sign in with the fake GitHub; find the approval under Needs
//! you; open the run; approve with the required field empty and read the message; fill it and
//! watch the run finish live, without a reload; cancel another run; watch a running agent's
//! transcript grow. Every page is checked by `chromium::accessibility` and `chromium::fits`.

use std::time::Duration;

use engine::hosts::Capability;
use engine::ids::{RunId, StepId};
use engine::store::hosts::{self as host_store, HostRow, LogLine, NewHost};
use engine::store::steps::Failure;
use engine::store::{Actor, Change};
use protocol::Usage;
use serde_json::json;
use shopfloor_tests::github_fake::oauth::Account;

use crate::chromium::{accessibility, browser, click, fill, fits, h1, script, text, until, until_found, until_h1};
use crate::support::{App, close, driven};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_approves_cancels_and_watches_live_in_a_browser() {
    let (d, app, org) = driven(true).await;
    let approval = app.submit(&org, org.approve).await;
    let slow = app.submit(&org, org.slow).await;
    let agent = app.submit(&org, org.agent).await;
    app.until_asked(approval).await;
    app.until_build_pending(agent).await;
    app.github.sign_in_as(Account { login: "acme-owner".into(), id: 1, emails: vec![] });
    let c = browser(&d).await;

    // Sign in with GitHub.
    c.goto(&app.url("/")).await.unwrap();
    until_found(&c, "#github-signin", "the sign-in page").await;
    accessibility(&c, "sign-in").await;
    fits(&c, "signin").await;
    click(&c, "#github-signin").await;
    until_h1(&c, "Today in acme", "Today after sign-in").await;

    // The approval is under Needs you, with its prompt and deadline.
    let needs = text(&c, "#needs-you").await;
    assert!(needs.contains("Ship the release?") && needs.contains("deadline"), "{needs}");
    accessibility(&c, "today").await;
    until(&c, "return document.body.dataset.live === 'on'", "the live stream connected").await;
    fits(&c, "today").await;

    // Open the run.
    click(&c, "#needs-you a.button").await;
    until_h1(&c, "Waiting for approval at review", "the run page").await;
    accessibility(&c, "run").await;

    // Approve with the required field empty: the message, and the run keeps waiting.
    click(&c, "form.approve button[type=submit]").await;
    until_found(&c, ".field-error", "a validation message").await;
    let message = text(&c, ".field-error").await;
    assert!(message.contains("ticket is required"), "{message}");
    assert!(h1(&c).await.contains("Waiting for approval"));
    accessibility(&c, "run with errors").await;
    fits(&c, "run-approval-error").await;

    // Fill it in: the run moves on, and the page follows it live, with no reload.
    fill(&c, "form.approve input[name=ticket]", "T-42").await;
    click(&c, "form.approve button[type=submit]").await;
    until(&c, "return !document.querySelector('form.approve') && document.body.dataset.live === 'on'", "the answered page, live").await;
    script(&c, "window.__sameDocument = 'yes'").await;
    let before = h1(&c).await;
    assert!(!before.contains("Completed"), "the run should still be asleep when the page loads: {before}");
    app.until(approval, "SELECT status = 'completed' FROM runs WHERE run_id = $1", "the run completes").await;
    until_h1(&c, "Completed", "the run completes on the page").await;
    let same = script(&c, "return window.__sameDocument || null").await;
    assert_eq!(same, json!("yes"), "the page updated in place, not by a reload");
    let refreshes = script(&c, "return Number(document.body.dataset.refreshes || 0)").await;
    assert!(refreshes.as_i64().unwrap_or(0) >= 1, "live refreshes: {refreshes}");
    accessibility(&c, "completed run").await;
    fits(&c, "run").await;

    // Cancel another run.
    c.goto(&app.url(&format!("/orgs/acme/projects/web/runs/{slow}"))).await.unwrap();
    until_h1(&c, "Asleep until", "the slow run asleep").await;
    fill(&c, "#cancel-reason", "not today").await;
    click(&c, "#cancel-run").await;
    until_h1(&c, "Cancelled: not today", "the run cancelled").await;

    // A host takes the agent's step and reports its session: the transcript grows live.
    let host = register_host(&app, &org).await;
    let step = start_crew_step(&app, &host, agent).await;
    c.goto(&app.url(&format!("/orgs/acme/projects/web/runs/{agent}"))).await.unwrap();
    until(&c, "return document.querySelector('h1').textContent.includes('Running build') && document.body.dataset.live === 'on'", "the agent running").await;
    script(&c, "window.__sameDocument = 'yes'").await;
    until(&c, "return !!document.getElementById('transcript') && !!document.getElementById('transcript').dataset.stream", "a live transcript").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for seq in 1..=6 {
        let line = LogLine { seq, stream: if seq % 3 == 0 { "stderr".into() } else { "assistant".into() }, line: format!("step {seq}: building the widget") };
        let usage = Usage { input_tokens: 1000 * seq, output_tokens: 100 * seq, cost_usd: Some(0.01 * seq as f64), turns: seq as i32, ..Usage::default() };
        crate::support::report_line(app.pool(), &host, step, line, &usage).await;
        let want = format!("return document.querySelectorAll('#transcript-lines li').length >= {seq}");
        until(&c, &want, &format!("transcript line {seq} on the page")).await;
    }
    let same = script(&c, "return window.__sameDocument || null").await;
    assert_eq!(same, json!("yes"), "the transcript grew without a reload");
    let transcript = text(&c, "#transcript-lines").await;
    assert!(transcript.contains("step 6: building the widget"), "{transcript}");
    accessibility(&c, "run with a transcript").await;
    fits(&c, "run-transcript").await;

    close(c, app).await;
}

pub(crate) async fn register_host(app: &App, org: &crate::support::Org) -> HostRow {
    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
    let (jti, _, _) =
        api::auth::issue_registration_token(&mut ch, &engine::testkit::secret_key(), org.id, org.project, "builder", chrono::Duration::hours(1)).await.unwrap();
    let caps = [Capability::parse("linux").unwrap(), Capability::parse("harness:command").unwrap()];
    let id = host_store::register(
        &mut ch,
        &NewHost { org: org.id, project: org.project, name: "builder-1", capabilities: &caps, max_concurrent: 1, registration: jti },
    )
    .await
    .unwrap();
    ch.commit().await.unwrap();
    HostRow {
        org_id: org.id,
        project_id: org.project,
        host_id: id,
        name: "builder-1".into(),
        capabilities: vec!["linux".into(), "harness:command".into()],
        max_concurrent: 1,
    }
}

/// The crew step of `run` (of `agent`), once pending, claimed and started by `host` as the
/// `command` harness.
pub(crate) async fn start_crew_step(app: &App, host: &HostRow, run: RunId) -> StepId {
    app.until_build_pending(run).await;
    let claimed = host_store::claim(app.pool(), &engine::catalog::Catalog::default(), host, 1).await.expect("claim");
    let step = claimed.assignments.first().expect("the crew step is claimed").step;
    host_store::start(app.pool(), host, step, "command", false).await.expect("start");
    step
}

/// A run of `agent` whose crew step `host` took and failed with `failure`, reporting `output`.
pub(crate) async fn failed_crew_run(app: &App, org: &crate::support::Org, host: &HostRow, output: serde_json::Value, failure: Failure) -> RunId {
    let run = app.submit(org, org.agent).await;
    let step = start_crew_step(app, host, run).await;
    let failed = host_store::Completion { output, failure: Some(failure), usage: Usage::default(), harness: Some("command".into()) };
    host_store::complete(app.pool(), host, step, &failed).await.expect("complete");
    app.until(run, "SELECT status = 'failed' FROM runs WHERE run_id = $1", "the run fails").await;
    run
}
