//! Hosts as real processes: `shopfloor serve` (API and one engine, which leaves crew steps to
//! hosts) on a test database, `shopfloor host` processes registered with registration tokens,
//! a fake `claude` that prints real-format stream-json and edits a file, and a local bare git
//! repository as the remote.
//!
//! - An issue becomes a pull request: a signed webhook, a plan on the host, an approval over
//!   the API, a build that pushes the issue's branch, the pull request on the fake GitHub with
//!   the agent's description, a gate on its checks; everything readable over the API after.
//! - A crew step runs in a worktree, its session (transcript, tokens, cost) reaches the server,
//!   and its commit is pushed to `shopfloor/<issue>-<slug>`; the next run on the issue goes on
//!   from that branch.
//! - A host killed with SIGKILL mid-step: the lease lapses, a second host takes the step and
//!   completes it, and the first attempt is recorded `lease_expired`; the killed host, started
//!   again, terminates the harness it left behind (from its journal).
//! - A harness past its timeout is interrupted, then killed with its children.
//! - A cancel through the API reaches a running harness (SIGINT, SIGKILL after at most 3 s).
//! - A draining host (SIGTERM) hands its steps back after the drain time and exits.
//! - 200 steps across 4 hosts with 2 slots each run exactly once each.
//! - A push the remote refuses fails its step once, `push_refused`, in the remote's words: no
//!   second session is spent on work that would be refused again.

use std::time::{Duration, Instant};

use engine::ids::RunId;
use serde_json::{Value, json};
use shopfloor_tests::github_fake::WebhookClient;
use shopfloor_tests::github_fake::payloads::{self, user};
use shopfloor_tests::process::Proc;

const SECRET: &str = "host tests' webhook secret";

use super::host_env::*;
use crate::support::{ready_for_agent, the_pull_request, widgets};

const PLAN_BUILD: &str = include_str!("../workflows/plan_build.yaml");
pub(crate) const ISSUE_TO_PR: &str = include_str!("../workflows/issue_to_pr_on_hosts.yaml");
const ONE: &str = include_str!("../workflows/one.yaml");
const TIMED: &str = include_str!("../workflows/timed.yaml");

#[tokio::test(flavor = "multi_thread")]
async fn a_host_runs_crew_steps_in_worktrees_and_pushes_the_branch() {
    let env = Env::start(&[PLAN_BUILD]).await;
    let _host = env.host("solo", 2).await;
    let run = env.submit("plan-build", vec![json!({ "repository": "acme/widgets", "issue": 7, "title": "Add a widget!" })]).await[0];
    env.until(run, "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'build' AND state = 'succeeded')", Duration::from_secs(60), "built").await;

    // The branch of the issue holds both steps' commits (build went on from plan's).
    let remote = env.dir.path().join("remotes/acme/widgets.git");
    let log = git_out(&remote, &["log", "--format=%s", "shopfloor/7-add-a-widget"]);
    assert_eq!(log.lines().collect::<Vec<_>>(), ["build: Add a widget!", "plan: Add a widget!", "init"], "{log}");
    let changes = git_out(&remote, &["show", "shopfloor/7-add-a-widget:CHANGES.md"]);
    assert_eq!(changes.lines().count(), 2, "{changes}");

    // The output: answer, files, branch, head, commits, the PR body the agent wrote, figures.
    let (output, holder): (Value, String) =
        sqlx::query_as("SELECT output, holder FROM steps WHERE run_id = $1 AND node = 'build'").bind(run).fetch_one(&env.db.pool).await.unwrap();
    assert!(holder.starts_with("host:"), "{holder}");
    assert_eq!(output["branch"], "shopfloor/7-add-a-widget");
    assert_eq!(output["files_changed"], 1);
    assert_eq!(output["files"], json!(["CHANGES.md"]));
    assert_eq!(output["head_sha"], git_out(&remote, &["rev-parse", "shopfloor/7-add-a-widget"]));
    assert_eq!(output["commits"].as_array().map(Vec::len), Some(1));
    assert_eq!(output["pr_body"], "Closes #7\n\nAdd a line to CHANGES.md\n\nSo that the change shows.");
    assert_eq!(output["usage"]["cost_usd"], 0.012346);
    assert_eq!(
        (output["usage"]["input_tokens"].as_i64(), output["usage"]["output_tokens"].as_i64(), output["usage"]["turns"].as_i64()),
        (Some(42), Some(35), Some(2))
    );
    assert_eq!(output["usage"]["model"], "claude-sonnet-4-5-20250929");
    // plan is not followed by a pull request of its own work: no description asked of it.
    let plan: Value = sqlx::query_scalar("SELECT output FROM steps WHERE run_id = $1 AND node = 'plan'").bind(run).fetch_one(&env.db.pool).await.unwrap();
    assert!(plan.get("pr_body").is_none() && plan["text"].as_str().is_some_and(|t| t.starts_with("Added a line")), "{plan}");

    // The session: transcript lines in order, the figures, and a step.session event.
    let streams: Vec<String> =
        sqlx::query_scalar("SELECT l.stream FROM step_logs l JOIN steps s USING (step_id) WHERE s.run_id = $1 AND s.node = 'build' ORDER BY l.seq")
            .bind(run)
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(streams, ["system", "assistant", "tool_result", "assistant", "result"]);
    let (cost, tokens): (f64, i64) = sqlx::query_as(
        "SELECT cost_usd::float8, input_tokens + output_tokens FROM step_sessions JOIN steps s USING (step_id) WHERE s.run_id = $1 AND s.node = 'build'",
    )
    .bind(run)
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert_eq!((cost, tokens), (0.012346, 77));
    let kinds: Vec<String> =
        sqlx::query_scalar("SELECT kind FROM run_events WHERE run_id = $1 AND node = 'build' ORDER BY seq").bind(run).fetch_all(&env.db.pool).await.unwrap();
    // The tests' hosts run --unsandboxed, and each step they start says so.
    assert_eq!(kinds, ["step.created", "step.leased", "step.running", "step.unwalled", "step.succeeded", "step.session"]);
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE actor_kind = 'host' AND action IN ('step.running', 'step.succeeded', 'step.session')")
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(audited, 6, "two steps, three host changes each");

    // Readable over the API: the transcript of the step.
    let step: String = sqlx::query_scalar::<_, engine::ids::StepId>("SELECT step_id FROM steps WHERE run_id = $1 AND node = 'build'")
        .bind(run)
        .fetch_one(&env.db.pool)
        .await
        .map(|s| s.to_string())
        .unwrap();
    let logs = env.get(&format!("/orgs/acme/projects/web/runs/{run}/steps/{step}/logs")).await;
    assert_eq!(logs["items"].as_array().map(Vec::len), Some(5), "{logs}");

    // Nothing left behind on the host: no journal entry, no worktree.
    let work = env.dir.path().join("hosts/solo");
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::read_dir(work.join("journal")).map(|d| d.count()).unwrap_or(0) > 0 {
        assert!(Instant::now() < deadline, "journal entries left behind");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(std::fs::read_dir(work.join("attempts")).map(|d| d.count()).unwrap_or(0), 0);
    drop(_host);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_push_the_remote_refuses_fails_the_step_once_with_the_remotes_words() {
    let env = Env::start(&[PLAN_BUILD]).await;
    // The remote refuses every push, as GitHub refuses an App's change to a workflow file.
    let hook = env.dir.path().join("remotes/acme/widgets.git/hooks/pre-receive");
    std::fs::write(&hook, "#!/bin/sh\necho 'refusing to allow a GitHub App to create or update workflow without workflows permission' >&2\nexit 1\n").unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let _host = env.host("solo", 1).await;
    let run = env.submit("plan-build", vec![json!({ "repository": "acme/widgets", "issue": 8, "title": "Touch CI" })]).await[0];
    env.until(run, "SELECT status = 'failed' FROM runs WHERE run_id = $1", Duration::from_secs(120), "failed").await;

    // One session, not one per retry: the same push would be refused again.
    let steps: Vec<(String, Option<String>, Option<String>, Value)> =
        sqlx::query_as("SELECT state, reason, failure_class, output FROM steps WHERE run_id = $1 AND node = 'plan'")
            .bind(run)
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    let [(state, reason, class, output)] = steps.as_slice() else { panic!("{steps:?}") };
    assert_eq!((state.as_str(), reason.as_deref(), class.as_deref()), ("failed", Some("push_refused"), Some("final")));
    let error = output["error"].as_str().unwrap_or_default();
    // The remote's words alone, the refused ref first: the reason already says it was refused.
    assert!(error.starts_with(" ! [remote rejected]") && error.contains("remote: refusing to allow a GitHub App"), "{output}");
    assert_eq!(output["pushed"], Value::Null);
    let branches = git_out(&env.dir.path().join("remotes/acme/widgets.git"), &["branch", "--list", "shopfloor/*"]);
    assert!(branches.is_empty(), "{branches}");
    assert_eq!(env.status(run).await, ("failed".to_owned(), Some("push_refused".to_owned())));
    // The operator's command line says it in the remote's words too.
    let shown = shopfloor_tests::process::shopfloor(&["runs", "show", &run.to_string()], &env.db.url)
        .env("SHOPFLOOR_SERVER", &env.base)
        .env("SHOPFLOOR_TOKEN", &env.owner_token)
        .env("SHOPFLOOR_ORG", "acme")
        .env("SHOPFLOOR_PROJECT", "web")
        .env("HOME", env.dir.path())
        .stdout(std::process::Stdio::piped())
        .output()
        .unwrap();
    let shown = String::from_utf8(shown.stdout).unwrap();
    assert!(shown.contains("plan (attempt 1) failed: push_refused"), "{shown}");
    assert!(shown.contains("  remote: refusing to allow a GitHub App to create or update workflow"), "{shown}");
    drop(_host);
    env.finish().await;
}

/// A run of `one` whose slow harness runs on the one host `name`: the host, the run, and the
/// running step and harness (see [`Env::running_harness`]).
async fn slow_step_on(env: &Env, name: &str) -> (Proc, RunId, (String, i32)) {
    let host = env.host(name, 1).await;
    let (run, step, pid) = env.working("one", json!({ "words": "@SLOW@" })).await;
    (host, run, (step, pid))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_hosts_step_is_taken_back_and_completed_by_another_host() {
    let env = Env::start(&[ONE]).await;
    let (mut victim, run, (first_step, orphan)) = slow_step_on(&env, "victim").await;
    victim.sigkill();
    let killed_at = Instant::now();
    let _survivor = env.host("survivor", 1).await;

    env.until(run, "SELECT status <> 'running' FROM runs WHERE run_id = $1", Duration::from_secs(120), "ended").await;
    assert_eq!(env.status(run).await, ("completed".to_owned(), None));
    eprintln!("taken back and completed {:?} after the kill", killed_at.elapsed());
    let attempts: Vec<(i32, String, Option<String>, String)> =
        sqlx::query_as("SELECT attempt, state, reason, holder FROM steps WHERE run_id = $1 AND node = 'work' ORDER BY attempt")
            .bind(run)
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!((attempts[0].1.as_str(), attempts[0].2.as_deref()), ("failed", Some("lease_expired")));
    assert_eq!(attempts[1].1, "succeeded");
    assert_ne!(attempts[0].3, attempts[1].3, "another host ran the second attempt");

    // The victim's harness outlived it (its output goes to a file); started again, the victim
    // finds it in its journal, sees the step moved on, and terminates it.
    assert!(alive(orphan), "the orphaned harness should still run");
    let _victim_again = env.host("victim", 1).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while alive(orphan) || !group(orphan).is_empty() {
        assert!(Instant::now() < deadline, "the restarted host did not terminate the orphaned harness");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let journal = env.dir.path().join("hosts/victim/journal").join(format!("{first_step}.json"));
    let deadline = Instant::now() + Duration::from_secs(120);
    while journal.exists() {
        assert!(Instant::now() < deadline, "the journal entry was not settled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Nothing more was reported for the first attempt.
    let (state, reason): (String, Option<String>) =
        sqlx::query_as("SELECT state, reason FROM steps WHERE run_id = $1 AND attempt = 1").bind(run).fetch_one(&env.db.pool).await.unwrap();
    assert_eq!((state.as_str(), reason.as_deref()), ("failed", Some("lease_expired")));
    drop((_survivor, _victim_again));
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_harness_past_its_timeout_is_interrupted_then_killed_with_its_children() {
    let env = Env::start(&[TIMED]).await;
    let _host = env.host("timer", 1).await;
    let (run, step, harness) = env.working("timed", json!({})).await;
    let child_path = env.marks().join(format!("{step}.child"));
    let deadline = Instant::now() + Duration::from_secs(120);
    let child: i32 = loop {
        if let Some(pid) = std::fs::read_to_string(&child_path).ok().and_then(|t| t.trim().parse().ok()) {
            break pid;
        }
        assert!(Instant::now() < deadline, "the harness never started its child");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(alive(harness) && alive(child));

    // 3 s timeout, SIGINT (ignored by both), 2 s grace, then the group is killed.
    env.until(run, "SELECT status <> 'running' FROM runs WHERE run_id = $1", Duration::from_secs(120), "ended").await;
    let (state, reason): (String, Option<String>) =
        sqlx::query_as("SELECT state, reason FROM steps WHERE run_id = $1 AND node = 'work'").bind(run).fetch_one(&env.db.pool).await.unwrap();
    assert_eq!((state.as_str(), reason.as_deref()), ("failed", Some("timeout")));
    assert_eq!(env.status(run).await.0, "failed");
    assert!(!alive(harness) && !alive(child), "harness {harness} or its child {child} still runs");
    assert!(group(harness).is_empty(), "processes left in the harness's group: {:?}", group(harness));
    // The session still has the harness's tokens; no result line, so no cost.
    let (tokens, cost): (i64, Option<f64>) = sqlx::query_as("SELECT input_tokens + output_tokens, cost_usd::float8 FROM step_sessions WHERE run_id = $1")
        .bind(run)
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert_eq!((tokens, cost), (8, None));
    drop(_host);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_through_the_api_stops_the_running_harness() {
    let env = Env::start(&[ONE]).await;
    let _host = env.host("canceller", 1).await;
    let (run, _, harness) = env.working("one", json!({ "words": "@SLOW@ @ALWAYS@" })).await;
    // Let it settle into its long-poll and heartbeats.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let asked = Instant::now();
    let (status, answer) = env.post(&format!("/orgs/acme/projects/web/runs/{run}/cancel"), &json!({ "reason": "changed my mind" })).await;
    assert!((200..300).contains(&status), "{status} {answer}");
    // The host stops it at once (SIGINT, SIGKILL after at most 3 s); the deadline only fails a
    // host that never does.
    let stopped = async {
        while alive(harness) || !group(harness).is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), stopped).await.expect("the harness still runs a minute after the cancel");
    eprintln!("cancel reached the harness in {:?}", asked.elapsed());
    let (state, reason): (String, Option<String>) =
        sqlx::query_as("SELECT state, reason FROM steps WHERE run_id = $1 AND node = 'work'").bind(run).fetch_one(&env.db.pool).await.unwrap();
    assert_eq!((state.as_str(), reason.as_deref()), ("cancelled", Some("cancelled: changed my mind")));
    drop(_host);
    env.finish().await;
}

/// `source` served with the fake GitHub and a host `solo` of `slots`; then issue `number` of
/// `Acme/Widgets`, labelled `ready-for-agent`, put on the fake GitHub and its signed
/// `issues.labeled` webhook sent, which must open a run: the webhook client, and that run.
async fn run_for_ready_issue(source: &str, slots: u32, number: i64, title: &str) -> (Env, Proc, WebhookClient, RunId) {
    let env = Env::start_with(&[source], true).await;
    let host = env.host("solo", slots).await;
    let hooks = WebhookClient::new(&env.base, SECRET);
    let issue = ready_for_agent(env.github.as_ref().expect("the fake GitHub"), number, title);
    let labeled = payloads::issues_event("labeled", &widgets(), &issue, &user("alice"), Some("ready-for-agent"));
    let (status, answer) = hooks.send("issues", "delivery-1", &labeled).await;
    assert_eq!((status, answer["runs_opened"].as_i64()), (202, Some(1)), "{answer}");
    let run = sqlx::query_scalar("SELECT run_id FROM runs").fetch_one(&env.db.pool).await.unwrap();
    (env, host, hooks, run)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_issue_becomes_a_pull_request_through_a_host() {
    // A signed `issues.labeled` webhook opens the run.
    let (env, _host, hooks, run) = run_for_ready_issue(ISSUE_TO_PR, 2, 7, "Add a widget").await;
    let fake = env.github.as_ref().expect("the fake GitHub");
    let repo = widgets();
    let api = |path: String| reqwest::Client::new().get(format!("{}/api/v1/orgs/acme/projects/web{path}", env.base)).bearer_auth(&env.owner_token);

    // The plan runs on the host; a person approves it over the API.
    env.until(
        run,
        "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'review_plan' AND state = 'waiting')",
        Duration::from_secs(120),
        "asked for approval",
    )
    .await;
    let (status, approved) = env.post(&format!("/orgs/acme/projects/web/runs/{run}/approvals/review_plan"), &json!({})).await;
    assert!((200..300).contains(&status), "{status} {approved}");

    // The build commits and pushes the issue's branch; the pull request is opened from it.
    env.until(run, "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'ci' AND state = 'waiting')", Duration::from_secs(60), "waited on CI")
        .await;
    let remote = env.dir.path().join("remotes/acme/widgets.git");
    let pushed = git_out(&remote, &["log", "--format=%s", "shopfloor/7-add-a-widget"]);
    assert_eq!(pushed.lines().collect::<Vec<_>>(), ["build: Add a widget", "plan: Add a widget", "init"]);
    let pr = &the_pull_request(fake);
    assert_eq!(pr["head"]["ref"], "shopfloor/7-add-a-widget");
    let body = pr["body"].as_str().unwrap_or_default();
    assert!(body.starts_with("Closes #7") && body.contains("Add a line to CHANGES.md"), "{body}");
    // The assignments carried installation tokens for the repository, minted by the App with
    // only what a push needs; the pull request's token could open pull requests, not push.
    let mints: Vec<Value> = fake.requests_to("POST", "/app/installations/77/access_tokens").into_iter().map(|r| r.body).collect();
    assert!(mints.contains(&json!({ "repositories": ["widgets"], "permissions": { "contents": "write" } })), "{mints:?}");
    assert!(mints.contains(&json!({ "repositories": ["widgets"], "permissions": { "pull_requests": "write", "contents": "read" } })), "{mints:?}");
    assert!(
        mints.iter().all(|m| m["permissions"].is_object() && m["repositories"] == json!(["widgets"])),
        "every token names its permissions and one repository: {mints:?}"
    );

    // CI reports on the pull request's head: the gate passes and the run completes.
    let head = pr["head"]["sha"].as_str().unwrap().to_owned();
    let number = pr["number"].as_i64().unwrap();
    let (status, _) =
        hooks.send("check_run", "delivery-2", &payloads::check_run_event("completed", &repo, 1, "test", &head, "completed", Some("success"), &[number])).await;
    assert_eq!(status, 202);
    env.until(run, "SELECT status = 'completed' FROM runs WHERE run_id = $1", Duration::from_secs(120), "completed").await;

    // Afterwards, over the API: the run's events, its audit entries, the session transcripts,
    // cost and tokens.
    let detail: Value = api(format!("/runs/{run}")).send().await.unwrap().json().await.unwrap();
    assert_eq!(detail["status"], "completed", "{detail}");
    let events: Value = api(format!("/runs/{run}/events?limit=200")).send().await.unwrap().json().await.unwrap();
    let kinds: Vec<&str> = events["items"].as_array().unwrap().iter().filter_map(|e| e["kind"].as_str()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "step.session").count(), 2, "{kinds:?}");
    let session = events["items"].as_array().unwrap().iter().find(|e| e["kind"] == "step.session" && e["node"] == "build").unwrap();
    assert_eq!((session["attrs"]["cost_usd"].as_f64(), session["attrs"]["output_tokens"].as_i64()), (Some(0.012346), Some(35)));
    let build = detail["steps"].as_array().unwrap().iter().find(|s| s["node"] == "build").unwrap_or_else(|| panic!("{detail}"));
    let step = build["id"].as_str().or_else(|| build["step"].as_str()).unwrap_or_else(|| panic!("{build}")).to_owned();
    let logs: Value = api(format!("/runs/{run}/steps/{step}/logs")).send().await.unwrap().json().await.unwrap();
    assert_eq!(logs["items"].as_array().map(Vec::len), Some(5), "{logs}");
    let audit = env.get("/orgs/acme/audit?limit=200").await;
    let by_host = audit["items"].as_array().unwrap().iter().filter(|a| a["actor_kind"] == "host").count();
    assert!(by_host >= 8, "the host's leases, starts, results and sessions are audited: {by_host}");
    drop(_host);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_draining_host_hands_its_steps_back_and_exits() {
    let env = Env::start(&[ONE]).await;
    let (mut leaving, run, (_, harness)) = slow_step_on(&env, "leaving").await;
    // SIGTERM: no more claims; the step may go on for the drain time (2 s here, set below),
    // then it is stopped and handed back, and the host exits.
    // SAFETY: a signal to our own child.
    unsafe {
        libc::kill(leaving.0.id() as libc::pid_t, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = leaving.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the draining host did not exit");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status:?}");
    assert!(!alive(harness) && group(harness).is_empty(), "the handed-back harness still runs");
    let first: (String, Option<String>, Option<String>) =
        sqlx::query_as("SELECT state, reason, failure_class FROM steps WHERE run_id = $1 AND attempt = 1").bind(run).fetch_one(&env.db.pool).await.unwrap();
    assert_eq!(first, ("failed".to_owned(), Some("host_draining".to_owned()), Some("infrastructure".to_owned())));
    // Retried by itself, on a host that stays.
    let _stays = env.host("stays", 1).await;
    env.until(run, "SELECT status = 'completed' FROM runs WHERE run_id = $1", Duration::from_secs(120), "completed").await;
    drop(_stays);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_steps_on_four_hosts_with_two_slots_each_run_exactly_once() {
    let env = Env::start(&[ONE]).await;
    let mut hosts = Vec::new();
    for i in 0..4 {
        hosts.push(env.host(&format!("h{i}"), 2).await);
    }
    let started = Instant::now();
    let runs = env.submit("one", (0..200).map(|i| json!({ "words": format!("quick {i}") })).collect()).await;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE status = 'running'").fetch_one(&env.db.pool).await.unwrap();
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} runs still running");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = started.elapsed();
    let completed: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE status = 'completed'").fetch_one(&env.db.pool).await.unwrap();
    assert_eq!(completed, runs.len() as i64);
    let steps: Vec<(engine::ids::StepId, String)> =
        sqlx::query_as("SELECT step_id, holder FROM steps WHERE node = 'work'").fetch_all(&env.db.pool).await.unwrap();
    assert_eq!(steps.len(), 200, "one attempt per run: no step was retried");
    // Each step's harness ran exactly once: one line in its counter file.
    for (step, _) in &steps {
        let count = std::fs::read_to_string(env.marks().join(format!("{step}.count"))).unwrap_or_default().lines().count();
        assert_eq!(count, 1, "{step} ran {count} times");
    }
    let counters = std::fs::read_dir(env.marks()).unwrap().flatten().filter(|f| f.file_name().to_string_lossy().ends_with(".count")).count();
    assert_eq!(counters, 200);
    let mut by_host: Vec<(String, usize)> = Vec::new();
    for (_, holder) in &steps {
        match by_host.iter_mut().find(|h| &h.0 == holder) {
            Some(h) => h.1 += 1,
            None => by_host.push((holder.clone(), 1)),
        }
    }
    assert_eq!(by_host.len(), 4, "every host took part: {by_host:?}");
    // Never more than two at once on one host: the server counts slots under the host's lock.
    let overlap: i64 = sqlx::query_scalar(
        "SELECT coalesce(max(n), 0) FROM (SELECT a.step_id, count(*) AS n FROM steps a JOIN steps b ON a.holder = b.holder \
           AND b.started_at <= a.started_at AND b.ended_at > a.started_at WHERE a.node = 'work' GROUP BY a.step_id) o",
    )
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert!(overlap <= 2, "a host ran {overlap} steps at once");
    eprintln!("200 steps on 4 hosts x 2 slots in {took:?}; per host {by_host:?}");
    drop(hosts);
    env.finish().await;
}

const BUILD_CI_PR: &str = include_str!("../workflows/build_ci_pr.yaml");

#[tokio::test(flavor = "multi_thread")]
async fn a_gate_before_the_pull_request_waits_on_the_commit_the_build_pushed() {
    let (env, _host, hooks, run) = run_for_ready_issue(BUILD_CI_PR, 1, 8, "Gate the push").await;
    let fake = env.github.as_ref().expect("the fake GitHub");
    let repo = widgets();

    env.until(run, "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'ci' AND state = 'waiting')", Duration::from_secs(60), "waited on CI")
        .await;
    let remote = env.dir.path().join("remotes/acme/widgets.git");
    let pushed = git_out(&remote, &["rev-parse", "shopfloor/8-gate-the-push"]).trim().to_owned();
    let watched: Option<String> = sqlx::query_scalar("SELECT head_sha FROM github_watches WHERE run_id = $1").bind(run).fetch_one(&env.db.pool).await.unwrap();
    assert_eq!(watched.as_deref(), Some(pushed.as_str()), "the gate watches the pushed commit");
    assert!(fake.pulls("acme/widgets").is_empty(), "no pull request before CI passed");

    // CI on the branch (no pull request yet) passes the gate; then the pull request opens.
    let (status, _) =
        hooks.send("check_run", "delivery-2", &payloads::check_run_event("completed", &repo, 1, "test", &pushed, "completed", Some("success"), &[])).await;
    assert_eq!(status, 202);
    env.until(run, "SELECT status = 'completed' FROM runs WHERE run_id = $1", Duration::from_secs(60), "completed").await;
    assert_eq!(the_pull_request(fake)["head"]["ref"], "shopfloor/8-gate-the-push");
    drop(_host);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crew_step_whose_session_goes_silent_is_stalled_and_retried() {
    // The harness prints its first lines, then nothing (it hangs, ignoring SIGINT).
    let env = Env::start_stalling_after(&[ONE], false, 4).await;
    let _host = env.host("solo", 1).await;
    let run = env.submit("one", vec![json!({ "words": "@HANG@" })]).await[0];

    // Each attempt is failed `stalled` by a heartbeat once its session was silent for 4 s,
    // as an infrastructure failure: retried up to three attempts, then the run fails.
    env.until(run, "SELECT status = 'failed' FROM runs WHERE run_id = $1", Duration::from_secs(120), "failed after three stalls").await;
    let attempts: Vec<(i32, String, Option<String>, Option<String>)> =
        sqlx::query_as("SELECT attempt, state, reason, failure_class FROM steps WHERE run_id = $1 AND node = 'work' ORDER BY attempt")
            .bind(run)
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    let expected: Vec<(i32, String, Option<String>, Option<String>)> =
        (1..=3).map(|a| (a, "failed".to_owned(), Some("stalled".to_owned()), Some("infrastructure".to_owned()))).collect();
    assert_eq!(attempts, expected);
    // Each had reported its first lines before it went silent.
    let reported: i64 =
        sqlx::query_scalar("SELECT count(*) FROM step_sessions WHERE run_id = $1 AND lines > 0").bind(run).fetch_one(&env.db.pool).await.unwrap();
    assert_eq!(reported, 3);
    drop(_host);
    env.finish().await;
}
