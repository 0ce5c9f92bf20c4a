//! The console in a real browser: headless Chromium driven through chromedriver (WebDriver)
//! with fantoccini. Sign in with the fake GitHub; find the approval under Needs you; open the
//! run; approve with the required field empty and read the message; fill it and watch the run
//! finish live, without a reload; cancel another run; watch a running agent's transcript grow.
//! Along the way: one h1 per page, a label for every field, state never in colour alone; and
//! screenshots of Today and the run page in `target/screenshots/`.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`make test` installs them when missing).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use engine::hosts::{Capability, Usage};
use engine::store::hosts::{self as host_store, HostRow, LogLine, NewHost};
use engine::store::{Actor, Change};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use shopfloor_tests::github_fake::oauth::Account;

use crate::support::App;

const CHROMIUM: [&str; 2] = ["/usr/bin/chromium", "/usr/bin/chromium-browser"];
const CHROMEDRIVER: [&str; 2] = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"];

fn found(paths: &[&str]) -> Option<PathBuf> {
    paths.iter().map(PathBuf::from).find(|p| p.exists())
}

/// chromedriver on a free loopback port; killed when dropped.
struct Driver {
    child: Child,
    url: String,
    _profile: tempfile::TempDir,
    chromium: PathBuf,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn driver() -> Driver {
    let (Some(chromium), Some(chromedriver)) = (found(&CHROMIUM), found(&CHROMEDRIVER)) else {
        panic!(
            "the console's browser tests need Chromium and chromedriver, and they are not installed: \
             run `sudo apt-get install chromium chromium-driver` (Debian/Ubuntu), or `make test`, which installs \
             them with apt-get when it can"
        );
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port");
    let mut child = Command::new(&chromedriver)
        .arg(format!("--port={port}"))
        .arg("--allowed-ips=127.0.0.1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromedriver.display()));
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    for _ in 0..100 {
        if http.get(format!("{url}/status")).send().await.is_ok_and(|r| r.status().is_success()) {
            return Driver { child, url, _profile: tempfile::tempdir().expect("a profile directory"), chromium };
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("chromedriver did not answer on {url} within 10 s");
}

async fn browser(d: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": d.chromium,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,1400",
                format!("--user-data-dir={}", d._profile.path().display()),
            ],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&d.url)
        .await
        .unwrap_or_else(|e| panic!("chromedriver could not start Chromium: {e}"))
}

/// Runs a script until it returns true (up to 20 s).
async fn until(c: &Client, script: &str, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let v = c.execute(script, vec![]).await.unwrap_or(Value::Null);
        if v == Value::Bool(true) {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            let h1 = c.execute("return document.querySelector('h1') && document.querySelector('h1').textContent", vec![]).await.unwrap_or_default();
            panic!("never happened: {what} (h1: {h1})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn h1(c: &Client) -> String {
    c.find(Locator::Css("h1")).await.expect("an h1").text().await.unwrap_or_default()
}

/// One h1; every visible field labelled; every state badge and graph node says its state in
/// text. Returns the problems found.
async fn accessibility(c: &Client, page: &str) {
    let problems = c
        .execute(
            r#"
            const out = [];
            const h1s = document.querySelectorAll('h1').length;
            if (h1s !== 1) out.push(h1s + ' h1 elements');
            for (const el of document.querySelectorAll('input, select, textarea')) {
              if (el.type === 'hidden') continue;
              const labelled = (el.id && document.querySelector('label[for="' + el.id + '"]')) || el.closest('label') || el.getAttribute('aria-label');
              if (!labelled) out.push('unlabelled ' + el.tagName + ' ' + (el.name || ''));
            }
            for (const b of document.querySelectorAll('.badge, svg .node, svg .bar')) {
              if (!b.textContent.trim().match(/[a-z]/)) out.push('a state shown by colour alone: ' + b.outerHTML.slice(0, 80));
            }
            return out;
            "#,
            vec![],
        )
        .await
        .expect("the accessibility script runs");
    assert_eq!(problems, json!([]), "{page}: accessibility problems");
}

fn screenshots() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("screenshots");
    std::fs::create_dir_all(&dir).expect("target/screenshots");
    dir
}

async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("a screenshot");
    let path = screenshots().join(name);
    std::fs::write(&path, png).expect("write the screenshot");
    eprintln!("screenshot: {}", path.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_approves_cancels_and_watches_live_in_a_browser() {
    let d = driver().await;
    let app = App::start(true).await;
    let org = app.org("acme").await;
    let approval = app.submit(&org, org.approve).await;
    let slow = app.submit(&org, org.slow).await;
    let agent = app.submit(&org, org.agent).await;
    app.until(approval, "SELECT EXISTS (SELECT 1 FROM approvals WHERE run_id = $1 AND decision IS NULL)", "an open approval").await;
    app.until(agent, "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'build' AND state = 'pending')", "a crew step for a host").await;
    app.oauth.as_ref().unwrap().sign_in_as(Account { login: "acme-owner".into(), id: 1, emails: vec![] });
    let c = browser(&d).await;

    // Sign in with GitHub.
    c.goto(&app.url("/")).await.unwrap();
    until(&c, "return !!document.getElementById('github-signin')", "the sign-in page").await;
    accessibility(&c, "sign-in").await;
    c.find(Locator::Id("github-signin")).await.unwrap().click().await.unwrap();
    until(&c, "return document.querySelector('h1') && document.querySelector('h1').textContent.includes('Today in acme')", "Today after sign-in").await;

    // The approval is under Needs you, with its prompt and deadline.
    let needs = c.find(Locator::Id("needs-you")).await.unwrap().text().await.unwrap();
    assert!(needs.contains("Ship the release?") && needs.contains("deadline"), "{needs}");
    accessibility(&c, "today").await;
    until(&c, "return document.body.dataset.live === 'on'", "the live stream connected").await;
    screenshot(&c, "today.png").await;

    // Open the run.
    c.find(Locator::Css("#needs-you a.button")).await.unwrap().click().await.unwrap();
    until(&c, "return document.querySelector('h1').textContent.includes('Waiting for approval at review')", "the run page").await;
    accessibility(&c, "run").await;

    // Approve with the required field empty: the message, and the run keeps waiting.
    c.find(Locator::Css("form.approve button[type=submit]")).await.unwrap().click().await.unwrap();
    until(&c, "return !!document.querySelector('.field-error')", "a validation message").await;
    let message = c.find(Locator::Css(".field-error")).await.unwrap().text().await.unwrap();
    assert!(message.contains("ticket is required"), "{message}");
    assert!(h1(&c).await.contains("Waiting for approval"));
    accessibility(&c, "run with errors").await;

    // Fill it in: the run moves on, and the page follows it live, with no reload.
    let ticket = c.find(Locator::Css("form.approve input[name=ticket]")).await.unwrap();
    ticket.send_keys("T-42").await.unwrap();
    c.find(Locator::Css("form.approve button[type=submit]")).await.unwrap().click().await.unwrap();
    until(&c, "return !document.querySelector('form.approve') && document.body.dataset.live === 'on'", "the answered page, live").await;
    c.execute("window.__sameDocument = 'yes'", vec![]).await.unwrap();
    let before = h1(&c).await;
    assert!(!before.contains("Completed"), "the run should still be asleep when the page loads: {before}");
    app.until(approval, "SELECT status = 'completed' FROM runs WHERE run_id = $1", "the run completes").await;
    until(&c, "return document.querySelector('h1').textContent.includes('Completed')", "the run completes on the page").await;
    let same = c.execute("return window.__sameDocument || null", vec![]).await.unwrap();
    assert_eq!(same, json!("yes"), "the page updated in place, not by a reload");
    let refreshes = c.execute("return Number(document.body.dataset.refreshes || 0)", vec![]).await.unwrap();
    assert!(refreshes.as_i64().unwrap_or(0) >= 1, "live refreshes: {refreshes}");
    accessibility(&c, "completed run").await;
    screenshot(&c, "run.png").await;

    // Cancel another run.
    c.goto(&app.url(&format!("/orgs/acme/projects/web/runs/{slow}"))).await.unwrap();
    until(&c, "return document.querySelector('h1').textContent.includes('Asleep until')", "the slow run asleep").await;
    c.find(Locator::Id("cancel-reason")).await.unwrap().send_keys("not today").await.unwrap();
    c.find(Locator::Id("cancel-run")).await.unwrap().click().await.unwrap();
    until(&c, "return document.querySelector('h1').textContent.includes('Cancelled: not today')", "the run cancelled").await;

    // A host takes the agent's step and reports its session: the transcript grows live.
    let host = register_host(&app, &org).await;
    let catalog = engine::catalog::Catalog::default();
    let claimed = host_store::claim(app.pool(), &catalog, &host, 1).await.expect("claim");
    let step = claimed.assignments.first().expect("the crew step is claimed").step;
    host_store::start(app.pool(), &host, step, "command").await.expect("start");
    c.goto(&app.url(&format!("/orgs/acme/projects/web/runs/{agent}"))).await.unwrap();
    until(&c, "return document.querySelector('h1').textContent.includes('Running build') && document.body.dataset.live === 'on'", "the agent running").await;
    c.execute("window.__sameDocument = 'yes'", vec![]).await.unwrap();
    until(&c, "return !!document.getElementById('transcript') && !!document.getElementById('transcript').dataset.stream", "a live transcript").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for seq in 1..=6 {
        let line = LogLine { seq, stream: if seq % 3 == 0 { "stderr".into() } else { "assistant".into() }, line: format!("step {seq}: building the widget") };
        let usage = Usage { input_tokens: 1000 * seq, output_tokens: 100 * seq, cost_usd: Some(0.01 * seq as f64), turns: seq as i32, ..Usage::default() };
        host_store::report(app.pool(), &host, step, Some("command"), &[line], &usage, host_store::RUN_LOG_CAP_BYTES).await.expect("report");
        let want = format!("return document.querySelectorAll('#transcript-lines li').length >= {seq}");
        until(&c, &want, &format!("transcript line {seq} on the page")).await;
    }
    let same = c.execute("return window.__sameDocument || null", vec![]).await.unwrap();
    assert_eq!(same, json!("yes"), "the transcript grew without a reload");
    let text = c.find(Locator::Id("transcript-lines")).await.unwrap().text().await.unwrap();
    assert!(text.contains("step 6: building the widget"), "{text}");
    accessibility(&c, "run with a transcript").await;
    screenshot(&c, "run-transcript.png").await;

    // The same pages at a phone's width.
    c.set_window_size(390, 844).await.unwrap();
    c.goto(&app.url("/orgs/acme")).await.unwrap();
    until(&c, "return document.querySelector('h1').textContent.includes('Today')", "Today on a phone").await;
    let overflow = c.execute("return document.documentElement.scrollWidth <= window.innerWidth + 1", vec![]).await.unwrap();
    assert_eq!(overflow, json!(true), "Today fits a phone's width");
    screenshot(&c, "today-phone.png").await;

    c.close().await.unwrap();
    app.discard().await;
}

async fn register_host(app: &App, org: &crate::support::Org) -> HostRow {
    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
    let (jti, _, _) = api::auth::issue_registration_token(&mut ch, &engine::testkit::secret_key(), org.id, org.project, "builder", chrono::Duration::hours(1)).await.unwrap();
    let caps = [Capability::parse("linux").unwrap(), Capability::parse("harness:command").unwrap()];
    let id = host_store::register(&mut ch, &NewHost { org: org.id, project: org.project, name: "builder-1", capabilities: &caps, max_concurrent: 1, registration: jti })
        .await
        .unwrap();
    ch.commit().await.unwrap();
    HostRow { org_id: org.id, project_id: org.project, host_id: id, name: "builder-1".into(), capabilities: vec!["linux".into(), "harness:command".into()], max_concurrent: 1 }
}
