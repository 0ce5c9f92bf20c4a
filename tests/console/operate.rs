//! Operating a project in a real browser, as a person does: add a host from the hosts page and
//! run the command it gives as a real `shopfloor host`, then see the host online; drain and
//! undrain a host; set a budget below today's spend and see a new run held by it; add a member;
//! subscribe a webhook and replay a delivery. Every page is checked by
//! `chromium::accessibility` and `chromium::fits` (the run page only by the first: its
//! waterfall is checked elsewhere).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::Client;
use shopfloor_tests::github_fake::oauth::Account;

use crate::chromium::{Driver, accessibility, browser, click, fill, fits, h1, script, text, until_found, until_h1, until_text};
use crate::support::{App, Org, close, driven};

/// A child process, killed when dropped (a failed assertion must not leave a host running).
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Signs in as the org's owner through the fake GitHub, and lands on Today.
pub(crate) async fn sign_in(d: &Driver, app: &App, slug: &str) -> Client {
    app.github.sign_in_as(Account { login: format!("{slug}-owner"), id: 1, emails: vec![] });
    let c = browser(d).await;
    c.goto(&app.url("/")).await.unwrap();
    until_found(&c, "#github-signin", "the sign-in page").await;
    follow_to(&c, "#github-signin", &format!("Today in {slug}"), "Today after sign-in").await;
    c
}

/// Follows `link` to the page whose h1 says `heading` (`what`, should it never come).
async fn follow_to(c: &Client, link: &str, heading: &str, what: &str) {
    click(c, link).await;
    until_h1(c, heading, what).await;
}

/// Fills each `(field, value)` of a form, then presses its button `submit`.
async fn submit_form(c: &Client, fields: &[(&str, &str)], submit: &str) {
    for &(field, value) in fields {
        fill(c, field, value).await;
    }
    click(c, submit).await;
}

/// Opens `path` and waits for its h1 to say `heading`.
async fn open(c: &Client, app: &App, path: &str, heading: &str) {
    c.goto(&app.url(path)).await.unwrap();
    until_h1(c, heading, heading).await;
}

/// Waits until `sql` (with no parameters) is true; the deadline only catches a hang.
async fn until_db(app: &App, sql: &str, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let done: bool = sqlx::query_scalar(sql).fetch_one(app.pool()).await.unwrap();
        if done {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The words of a POSIX shell command line of plain words and single-quoted ones (what
/// `host_command` writes).
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut started = false;
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '\'' => {
                quoted = !quoted;
                started = true;
            }
            '\\' if !quoted => {
                if let Some(next) = chars.next() {
                    word.push(next);
                    started = true;
                }
            }
            c if c.is_whitespace() && !quoted => {
                if started {
                    words.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            c => {
                word.push(c);
                started = true;
            }
        }
    }
    assert!(!quoted, "an unclosed quote in {line}");
    if started {
        words.push(word);
    }
    words
}

/// Both checks every page of these tests gets.
async fn check(c: &Client, name: &str) {
    accessibility(c, name).await;
    fits(c, name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_adds_a_host_and_sees_it_come_online() {
    let bin = shopfloor_tests::shopfloor_bin();
    let (d, app, _) = driven(false).await;
    let c = sign_in(&d, &app, "acme").await;

    open(&c, &app, "/orgs/acme/projects/web/hosts", "Hosts of web").await;
    check(&c, "hosts-empty").await;
    follow_to(&c, "#add-host", "Add a host", "the Add a host page").await;
    check(&c, "host-add").await;
    submit_form(&c, &[("#h-name", "box-1"), ("#h-caps", "linux, harness:command"), ("#h-hours", "2")], "#make-registration").await;
    until_found(&c, "#host-command", "the command to paste").await;
    check(&c, "host-add-command").await;
    let command = script(&c, "return document.getElementById('host-command').value").await;
    let command = command.as_str().expect("the command's text").trim().to_owned();
    let note = text(&c, ".host-command").await;
    assert!(note.contains("registers one host, once"), "{note}");

    // Paste it, as a person would on the machine (with a work directory of the test's own).
    let words = shell_words(&command);
    assert_eq!(words[..2], ["shopfloor", "host"], "{command}");
    assert!(words.windows(2).any(|w| w == ["--server", app.base.as_str()]), "{command}");
    let work = tempfile::tempdir().unwrap();
    let host = Proc(
        Command::new(&bin)
            .args(&words[1..])
            .arg("--work-dir")
            .arg(work.path())
            .args(["--log", "warn"])
            .env_remove("SHOPFLOOR_HOST_TOKEN")
            .env("SHOPFLOOR_HOST_HEARTBEAT_SECS", "2")
            .env("SHOPFLOOR_DRAIN_SECS", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn shopfloor host"),
    );
    until_db(&app, "SELECT EXISTS (SELECT 1 FROM hosts WHERE name = 'box-1' AND last_seen_at IS NOT NULL)", "the host registered and reported").await;

    open(&c, &app, "/orgs/acme/projects/web/hosts", "Hosts of web").await;
    let row = text(&c, "#hosts tbody tr").await;
    assert!(row.contains("box-1") && row.contains("online"), "{row}");
    assert!(row.contains("harness:command"), "{row}");
    check(&c, "hosts-online").await;
    drop(host);

    close(c, app).await;
}

/// A host that reported just now, as `shopfloor host` would.
async fn online_host(app: &App, org: &Org) -> engine::store::hosts::HostRow {
    let host = crate::browser::register_host(app, org).await;
    sqlx::query("UPDATE hosts SET last_seen_at = now() WHERE host_id = $1").bind(host.host_id).execute(app.pool()).await.unwrap();
    host
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_drains_a_host_and_sees_it_drained() {
    let (d, app, org) = driven(false).await;
    let host = online_host(&app, &org).await;
    let c = sign_in(&d, &app, "acme").await;
    let row = format!("#host-{} .host-status", host.host_id);

    open(&c, &app, "/orgs/acme/projects/web/hosts", "Hosts of web").await;
    assert!(text(&c, &row).await.contains("online"));
    click(&c, "button.drain").await;
    until_text(&c, &row, "drained", "the host shown drained").await;
    let status = text(&c, &row).await;
    assert!(!status.contains("online"), "{status}");
    check(&c, "hosts-drained").await;
    until_db(&app, "SELECT drained_at IS NOT NULL FROM hosts", "drained").await;

    click(&c, "button.undrain").await;
    until_text(&c, &row, "online", "the host online again").await;
    until_db(&app, "SELECT drained_at IS NULL FROM hosts", "undrained").await;

    close(c, app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_sets_a_budget_and_sees_a_run_held_by_it() {
    let (d, app, org) = driven(true).await;
    // Today's spend so far, as hosts' session reports record it.
    app.record_spend(&org, 3.5).await;
    let c = sign_in(&d, &app, "acme").await;

    open(&c, &app, "/orgs/acme/projects/web/hosts", "Hosts of web").await;
    follow_to(&c, "header nav a[href$='/budgets']", "Budgets of web", "the budgets page").await;
    assert_eq!(text(&c, "header nav a[aria-current=page]").await, "Budgets");
    let spend = text(&c, "#spend tbody").await;
    assert!(spend.contains("$3.50"), "{spend}");
    check(&c, "budgets-empty").await;

    submit_form(&c, &[("#b-limit", "2")], "#set-limit button[type=submit]").await;
    until_found(&c, "#limits", "the limit listed").await;
    let limit = text(&c, "#limits tbody").await;
    assert!(limit.contains("$2.00") && limit.contains("hard") && limit.contains("reached"), "{limit}");

    let run = app.submit(&org, org.slow).await;
    app.until_held_by_budget(run).await;
    c.refresh().await.unwrap();
    until_text(&c, "#held", &run.to_string(), "the run under held by a budget").await;
    let held = text(&c, "#held").await;
    assert!(held.contains("the project's daily budget of $2.00 (hard) is spent"), "{held}");
    check(&c, "budgets-held").await;

    // The org's page lists it too, with its project.
    follow_to(&c, "#org-budgets", "Budgets of acme", "the org's budgets").await;
    let held = text(&c, "#held").await;
    assert!(held.contains(&run.to_string()) && held.contains("web"), "{held}");
    check(&c, "budgets-org").await;

    // The run's own page says what holds it.
    follow_to(&c, &format!("#held a[href$='{run}']"), "Held", "the run page").await;
    let head = h1(&c).await;
    assert!(head.contains("budget"), "{head}");
    accessibility(&c, "held run").await;

    close(c, app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_adds_a_member_and_subscribes_a_webhook() {
    let (d, app, org) = driven(true).await;
    let c = sign_in(&d, &app, "acme").await;

    follow_to(&c, "header nav a[href='/orgs/acme/members']", "Members of acme", "the members page").await;
    check(&c, "members").await;
    submit_form(&c, &[("#mem-email", "dana@acme.test")], "#add-member button[type=submit]").await;
    until_text(&c, "#members", "dana@acme.test", "the new member listed").await;
    let members = text(&c, "#members").await;
    assert!(members.contains("dana@acme.test"), "{members}");
    check(&c, "members-added").await;

    follow_to(&c, "header nav a[href$='/webhooks']", "Outgoing webhooks of web", "the webhooks page").await;
    check(&c, "webhooks-empty").await;
    submit_form(&c, &[("#w-url", "https://hooks.example.com/shopfloor"), ("#w-events", "run.*")], "#new-webhook button[type=submit]").await;
    until_found(&c, "#new-secret", "the signing secret").await;
    let secret = script(&c, "return document.getElementById('new-secret').value").await;
    assert!(secret.as_str().is_some_and(|s| s.len() >= 16), "{secret}");
    check(&c, "webhooks-created").await;

    // A run's events are delivered (or tried); one is sent again from the page.
    app.delivered(&org).await;
    open(&c, &app, "/orgs/acme/projects/web/webhooks", "Outgoing webhooks of web").await;
    let deliveries = text(&c, "table.deliveries").await;
    assert!(deliveries.contains("run."), "{deliveries}");
    click(&c, "table.deliveries button[type=submit]").await;
    until_text(&c, "table.deliveries", "replay", "the replayed delivery").await;
    check(&c, "webhooks-deliveries").await;

    close(c, app).await;
}
