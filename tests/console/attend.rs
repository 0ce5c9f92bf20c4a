//! What needs a person, answered in a real browser: an approval card that says which run it is
//! about, the run page saying who approved and with what, a failed crew step's headline in
//! words and its edit-and-retry, a failure resolved from Today, a used-up cycle budget reset
//! from Today, and relative times that move on while the page stays open. Every page it visits
//! gets `accessibility` and `fits`.

use engine::ids::RunId;
use engine::store::hosts::{self as host_store, Completion};
use engine::store::steps::{Failure, FailureClass};
use engine::store::{Actor, Change};
use fantoccini::Locator;
use protocol::Usage;
use serde_json::json;

use crate::browser::register_host;
use crate::chromium::{VIEWPORTS, accessibility, click, click_on, fits, fits_here, h1, resize, script, text, type_into, until, until_found, until_h1};
use crate::operate::sign_in;
use crate::support::{App, Org, acme_pages, close, driven};

/// A run of `agent` whose crew step a host took and failed with exit code 2.
async fn failed_crew_run(app: &App, org: &Org, host: &host_store::HostRow) -> RunId {
    let failure = Failure { reason: "exit code 2".into(), class: FailureClass::Final, exit_code: Some(2) };
    crate::browser::failed_crew_run(app, org, host, json!({ "text": "make: *** [build] Error 2" }), failure).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_answers_approvals_failures_and_cycle_budgets_in_a_browser() {
    let (d, app, org) = driven(true).await;
    app.asking(&org).await;
    let c = sign_in(&d, &app, "acme").await;

    // The approval card says which workflow and what the run is about.
    let card = text(&c, "#needs-you li.approval").await;
    assert!(card.contains("approve") && card.contains("no input") && card.contains("Ship the release?"), "{card}");
    // Relative times move on while the page stays open, without a reload.
    script(&c, "window.__sameDocument = 'yes'").await;
    let first = text(&c, "#needs-you time[data-ago]").await;
    let moved = format!("return document.querySelector('#needs-you time[data-ago]').textContent !== {}", json!(first));
    until(&c, &moved, "the approval's relative time moves on").await;
    assert_eq!(script(&c, "return window.__sameDocument || null").await, json!("yes"));
    accessibility(&c, "today with an approval").await;
    fits(&c, "attend-today").await;

    // Approve with a ticket: the run page then says who approved, and what they entered.
    click(&c, "#needs-you a.button").await;
    until_found(&c, "form.approve", "the approval form").await;
    type_into(&c, "form.approve input[name=ticket]", "T-77").await;
    click_on(&c, "form.approve button[type=submit]").await;
    until_found(&c, "#decisions:not([hidden])", "the decision on the run page").await;
    let decided = text(&c, "#decisions").await;
    assert!(decided.contains("approved at review by acme-owner") && decided.contains("ticket") && decided.contains("T-77"), "{decided}");
    let meta = text(&c, "#headline .meta").await;
    // The test made the run as the system, which the page names in words.
    assert!(meta.contains("created by shopfloor") && !meta.contains("system:"), "{meta}");
    accessibility(&c, "run with a decision").await;
    fits(&c, "attend-run-decided").await;

    // A crew step fails: the headline says where and why in words, the machine reason beside.
    let host = register_host(&app, &org).await;
    let failed = failed_crew_run(&app, &org, &host).await;
    c.goto(&app.url(&format!("/orgs/acme/projects/web/runs/{failed}"))).await.unwrap();
    until_h1(&c, "Failed at build", "the failed run").await;
    assert_eq!(h1(&c).await.trim_start_matches(|ch: char| !ch.is_alphabetic()), "Failed at build: The command exited with code 2");
    let why = text(&c, "#headline .why").await;
    assert!(why.contains("build (crew) failed: The command exited with code 2") && why.contains("exit code 2"), "{why}");
    let steps = text(&c, "#steps").await;
    assert!(!steps.contains("exit 2") && !steps.contains("0/0 tokens") && !steps.contains("tokens in"), "{steps}");
    accessibility(&c, "failed run").await;
    fits(&c, "attend-run-failed").await;

    // Edit and retry it: the new run's crew step runs the edited prompt with the other harness.
    let prompt = c.find(Locator::Id("edit-prompt")).await.unwrap();
    assert_eq!(prompt.prop("value").await.unwrap().as_deref(), Some("Build it"));
    prompt.clear().await.unwrap();
    prompt.send_keys("Build it again, with the cache cleared").await.unwrap();
    click(&c, "#edit-retry-submit").await;
    let retried: RunId = loop_until_new_run(&app, failed).await;
    until(&c, &format!("return location.pathname.endsWith({})", json!(retried.to_string())), "the new run's page").await;
    app.until_build_pending(retried).await;
    let catalog = engine::catalog::Catalog::default();
    let claimed = host_store::claim(app.pool(), &catalog, &host, 1).await.expect("claim the edited step");
    let edited = claimed.assignments.first().expect("the edited step is claimed");
    assert_eq!(edited.prompt, "Build it again, with the cache cleared");
    let meta = text(&c, "#headline .meta").await;
    assert!(meta.contains(&format!("rerun of {failed}")) || meta.contains(&failed.to_string()), "{meta}");

    // Another failure, resolved from Today: it leaves the list.
    host_store::start(app.pool(), &host, edited.step, "command", false).await.expect("start the edited step");
    let done = Completion { output: json!({ "text": "built" }), failure: None, usage: Usage::default(), harness: Some("command".into()) };
    host_store::complete(app.pool(), &host, edited.step, &done).await.expect("complete the edited step");
    app.until(retried, "SELECT status = 'completed' FROM runs WHERE run_id = $1", "the retry completes").await;
    let other = failed_crew_run(&app, &org, &host).await;
    c.goto(&app.url("/orgs/acme")).await.unwrap();
    let card = format!("#needs-you li.failure a[href$='{other}']");
    until_found(&c, &card, "the failure under Needs you").await;
    let failures = text(&c, "#needs-you").await;
    assert!(failures.contains("The command exited with code 2"), "{failures}");
    fits(&c, "attend-today-failure").await;
    let form = format!("form.resolve[action$='/runs/{other}/resolve']");
    type_into(&c, &format!("{form} input[name=note]"), "flaky runner, fixed").await;
    click_on(&c, &format!("{form} button[type=submit]")).await;
    until(
        &c,
        &format!("return document.querySelector('h1').textContent.includes('Today') && !document.querySelector({})", json!(card)),
        "the failure resolved",
    )
    .await;
    let resolved: bool = sqlx::query_scalar("SELECT resolved_at IS NOT NULL FROM runs WHERE run_id = $1").bind(other).fetch_one(app.pool()).await.unwrap();
    assert!(resolved, "the run is marked resolved");

    // A used-up cycle budget, reset from Today: the event it blocked opens a run.
    let item = used_up_cycle_budget(&app, &org).await;
    c.goto(&app.url("/orgs/acme")).await.unwrap();
    until_found(&c, "#needs-you li.ask", "the cycle-budget ask").await;
    let ask = text(&c, "#needs-you li.ask").await;
    assert!(ask.contains("acme/web#7") && ask.contains("triaged"), "{ask}");
    accessibility(&c, "today with an ask").await;
    fits(&c, "attend-today-ask").await;
    click_on(&c, "#needs-you li.ask button.reset-cycle").await;
    until(&c, "return document.querySelector('h1').textContent.includes('Today') && !document.querySelector('#needs-you li.ask')", "the ask answered").await;
    let opened: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM runs WHERE item_id = $1)").bind(item).fetch_one(app.pool()).await.unwrap();
    assert!(opened, "the blocked event opened a run");

    close(c, app).await;
}

/// The run a retry of `source` made (the form's answer redirects to it).
async fn loop_until_new_run(app: &App, source: RunId) -> RunId {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let found: Option<RunId> =
            sqlx::query_scalar("SELECT run_id FROM runs WHERE source_run_id = $1").bind(source).fetch_optional(app.pool()).await.unwrap();
        if let Some(run) = found {
            return run;
        }
        assert!(tokio::time::Instant::now() < deadline, "no retry of {source} was made");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A GitHub-triggered workflow whose cycle budget on `acme/web#7` is used up, with the event it
/// blocked waiting (as ingest leaves them). Returns the item.
async fn used_up_cycle_budget(app: &App, org: &Org) -> uuid::Uuid {
    let source = "name: triaged\non:\n  github: { events: [issues.labeled] }\nbudget: { max_cycles: 1 }\nnodes:\n  ask:\n    approval: { prompt: ok? }\n";
    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
    let (workflow, _) = engine::store::workflows::put_version(&mut ch, org.id, org.project, "triaged", source).await.unwrap();
    ch.commit().await.unwrap();
    engine::testkit::used_up_cycle_budget(app.pool(), org.id, org.project, workflow, "triaged").await.0
}

/// Every page of the console, as an owner with runs, a host and workflows to show: one h1,
/// every field labelled, state in words, and no text outside its box at a laptop's and a
/// phone's size (a screenshot of each under `target/screenshots/`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_reads_at_a_laptops_and_a_phones_size() {
    let (d, app, org) = driven(true).await;
    let waiting = app.submit(&org, org.approve).await;
    app.submit(&org, org.slow).await;
    app.until_asked(waiting).await;
    let host = register_host(&app, &org).await;
    let failed = failed_crew_run(&app, &org, &host).await;
    let c = sign_in(&d, &app, "acme").await;
    let project = "/orgs/acme/projects/web";
    let org_pages = [("org-budgets", "/budgets"), ("members", "/members"), ("github", "/github")];
    let project_pages = [("runs-failed", "/runs?status=failed"), ("host-add", "/hosts/add"), ("budgets", "/budgets"), ("webhooks", "/webhooks")];
    let pages = acme_pages(waiting, failed, &org_pages, &project_pages);
    for viewport in VIEWPORTS {
        resize(&c, viewport).await;
        for (name, path) in &pages {
            c.goto(&app.url(path)).await.unwrap();
            until(&c, "return document.readyState === 'complete' && !!document.querySelector('h1')", &format!("the {name} page")).await;
            let title = h1(&c).await;
            assert!(!title.contains("not found") && !title.contains("went wrong"), "{name}: {title}");
            accessibility(&c, name).await;
            fits_here(&c, &format!("page-{name}")).await;
        }
    }
    // Going from live page to live page leaves no stream open behind: the session may hold 8
    // (`SHOPFLOOR_STREAMS_PER_TOKEN`), and each page here connects its own.
    for round in 0..5 {
        for path in ["/orgs/acme".to_owned(), format!("{project}/runs/{waiting}")] {
            c.goto(&app.url(&path)).await.unwrap();
            until(&c, "return document.body.dataset.live === 'on'", &format!("round {round}: {path} live")).await;
        }
    }
    close(c, app).await;
}
