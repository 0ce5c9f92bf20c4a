//! Gates on checks and the reconciler, with real engines: a gate waits on its pull request's
//! head commit and is decided by check run and status webhooks (no poll), loops through
//! `on_fail`, follows a push to the new head, and fails at its timeout; a run waits for the
//! pull request its output opened to close, then moves the item's card (Done when merged, back
//! to Ready with a comment otherwise) and ends; a pull request a person opened on a
//! `shopfloor/` branch is left alone.

use std::time::Duration;

use serde_json::{Value, json};
use shopfloor_tests::github_fake::payloads::{self, user};
use shopfloor_tests::github_fake::{Issue, PullRequest};

use crate::github_env::GhEnv;

const CI: &str = include_str!("../workflows/ci.yaml");
const SLOW_CI: &str = include_str!("../workflows/slow_ci.yaml");
const SHIP: &str = include_str!("../workflows/ship_until_closed.yaml");

const LONG: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn check_webhooks_pass_and_fail_a_waiting_gate_and_on_fail_loops() {
    let env = GhEnv::start(&[CI, SLOW_CI]).await;
    let _engine = env.engine("gh-a", None);
    let (a, b) = ("a".repeat(40), "b".repeat(40));
    let mut pr = PullRequest::new(5, "CI me", &a);
    pr.labels = vec!["ci".into()];
    env.deliver("pull_request", &payloads::pull_request_event("opened", &env.repo, &pr, &user("alice"))).await;
    env.until("SELECT count(*) FROM steps WHERE node = 'checks' AND state = 'waiting'", 1, LONG).await;
    assert_eq!(env.scalar("SELECT count(*) FROM github_watches WHERE watch = 'checks'").await, 1);

    // One check passes: the gate still waits for the other. The delivery woke the gate (its
    // wake is written with the delivery); once an engine has taken that wake, the gate has
    // looked at the check.
    env.deliver("check_run", &payloads::check_run_event("completed", &env.repo, 1, "build", &a, "completed", Some("success"), &[5])).await;
    env.until("SELECT count(*) FROM wakes w JOIN steps s USING (step_id) WHERE s.node = 'checks' AND w.reason LIKE 'github:%'", 0, LONG).await;
    assert_eq!(env.scalar("SELECT count(*) FROM steps WHERE node = 'checks' AND state = 'waiting'").await, 1);
    // The other fails: the gate fails and loops back to build; the second visit waits, since
    // the old failure is not news to it.
    env.deliver("check_run", &payloads::check_run_event("completed", &env.repo, 2, "test", &a, "completed", Some("failure"), &[5])).await;
    env.until("SELECT count(*) FROM steps WHERE node = 'checks' AND visit = 2 AND state = 'waiting'", 1, LONG).await;
    let gate = env.steps("checks").await;
    assert_eq!((gate[0].state.as_str(), gate[0].reason.as_deref()), ("failed", Some("gate_failed")));
    assert_eq!(gate[0].output.clone().unwrap_or_default()["checks"]["test"]["conclusion"], "failure");
    assert_eq!(env.scalar("SELECT count(*) FROM steps WHERE node = 'build'").await, 2);

    // The fix is pushed: the gate follows the new head, and its checks pass (a check run and a
    // commit status).
    pr.head_sha = b.clone();
    env.deliver("pull_request", &payloads::pull_request_event("synchronize", &env.repo, &pr, &user("alice"))).await;
    env.until(&format!("SELECT count(*) FROM github_watches WHERE head_sha = '{b}'"), 1, LONG).await;
    env.deliver("check_run", &payloads::check_run_event("completed", &env.repo, 3, "build", &b, "completed", Some("success"), &[5])).await;
    env.deliver("status", &payloads::status_event(&env.repo, &b, "test", "success")).await;
    env.until("SELECT count(*) FROM runs WHERE status = 'completed'", 1, LONG).await;
    let gate = env.steps("checks").await;
    assert_eq!((gate[1].visit, gate[1].state.as_str()), (2, "succeeded"));
    assert_eq!(gate[1].output.clone().unwrap_or_default()["head_sha"], b.as_str());
    assert_eq!(env.scalar("SELECT count(*) FROM github_watches").await, 0, "watches go with their steps");

    // A gate whose checks never come fails at its timeout.
    let mut slow = PullRequest::new(6, "Slow one", &"c".repeat(40));
    slow.labels = vec!["slow".into()];
    env.deliver("pull_request", &payloads::pull_request_event("opened", &env.repo, &slow, &user("alice"))).await;
    env.until("SELECT count(*) FROM runs WHERE status = 'failed'", 1, LONG).await;
    let reason = env.text("SELECT reason FROM runs WHERE status = 'failed'").await;
    assert_eq!(reason.as_deref(), Some("timeout"));
    // Nothing of this called GitHub: gates read what the webhooks stored.
    assert!(env.fake.requests().is_empty(), "{:?}", env.fake.requests());
    drop(_engine);
    env.finish().await;
}

fn cards(card: &str) -> Value {
    json!({ "node": { "projectItems": { "nodes": [{
        "id": card,
        "project": { "id": "PVT_board", "field": { "id": "PVTSSF_status", "options": [
            { "id": "opt_ready", "name": "Ready" }, { "id": "opt_done", "name": "Done" } ] } }
    }] } } })
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reconciler_moves_the_card_when_the_pull_request_closes_and_leaves_others_alone() {
    let env = GhEnv::start(&[SHIP]).await;
    let _engine = env.engine("gh-a", None);
    let mut opened = Vec::new();
    for (number, title) in [(1, "Merge me"), (3, "Close me")] {
        let mut issue = Issue::new(number, title);
        issue.labels.push("ship".into());
        env.fake.put_issue(&env.repo.full_name, issue.json(&env.repo));
        env.deliver("issues", &payloads::issues_event("labeled", &env.repo, &issue, &user("bob"), Some("ship"))).await;
        env.until(&format!("SELECT count(*) FROM steps WHERE node = 'closed' AND state = 'waiting' AND run_id IN (SELECT r.run_id FROM runs r JOIN items i ON i.item_id = r.item_id WHERE i.key = '[\"github\",\"acme/widgets\",{number}]')"), 1, LONG).await;
        let pr = env
            .fake
            .pulls("acme/widgets")
            .into_iter()
            .find(|p| p["body"].as_str().is_some_and(|b| b.starts_with(&format!("Closes #{number}"))))
            .expect("the run's pull request");
        opened.push(pr);
    }
    assert_eq!(env.scalar("SELECT count(*) FROM github_watches WHERE watch = 'pull_request.closed'").await, 2);

    // A pull request a person opened on a shopfloor/ branch, outside any run, opens and closes:
    // no step watches it, nothing happens.
    let before = env.fake.requests().len();
    let mut stranger = PullRequest::new(40, "My own change", &"d".repeat(40));
    stranger.head_ref = "shopfloor/40-mine".into();
    env.deliver("pull_request", &payloads::pull_request_event("opened", &env.repo, &stranger, &user("alice"))).await;
    stranger.state = "closed".into();
    stranger.merged = true;
    env.deliver("pull_request", &payloads::pull_request_event("closed", &env.repo, &stranger, &user("alice"))).await;

    // The first is merged: the issue's card moves to Done, the run completes.
    env.fake.graphql_reply(cards("PVTI_card1"));
    env.fake.graphql_reply(json!({ "updateProjectV2ItemFieldValue": { "projectV2Item": { "id": "PVTI_card1" } } }));
    let as_pr = |p: &Value, merged: bool| {
        let mut pr =
            PullRequest::new(p["number"].as_i64().unwrap_or_default(), p["title"].as_str().unwrap_or_default(), p["head"]["sha"].as_str().unwrap_or_default());
        pr.head_ref = p["head"]["ref"].as_str().unwrap_or_default().to_owned();
        pr.state = "closed".into();
        pr.merged = merged;
        pr
    };
    env.deliver("pull_request", &payloads::pull_request_event("closed", &env.repo, &as_pr(&opened[0], true), &user("alice"))).await;
    env.until("SELECT count(*) FROM runs WHERE status = 'completed'", 1, LONG).await;
    let graphql = env.fake.requests_to("POST", "/graphql");
    assert_eq!(graphql.len(), 2);
    assert_eq!(graphql[0].body["variables"]["id"], format!("I_{}_1", env.repo.id), "the issue's card, not the pull request's");
    assert_eq!(graphql[1].body["variables"]["option"], "opt_done");

    // The second is closed unmerged: back to Ready, with a comment saying why.
    env.fake.graphql_reply(cards("PVTI_card3"));
    env.fake.graphql_reply(json!({ "updateProjectV2ItemFieldValue": { "projectV2Item": { "id": "PVTI_card3" } } }));
    env.deliver("pull_request", &payloads::pull_request_event("closed", &env.repo, &as_pr(&opened[1], false), &user("alice"))).await;
    env.until("SELECT count(*) FROM runs WHERE status = 'completed'", 2, LONG).await;
    let graphql = env.fake.requests_to("POST", "/graphql");
    assert_eq!(graphql.len(), 4);
    assert_eq!(graphql[3].body["variables"]["option"], "opt_ready");
    let comments = env.fake.comments("acme/widgets", 3);
    assert_eq!(comments.len(), 1);
    assert!(comments[0]["body"].as_str().unwrap_or_default().starts_with("The pull request was closed without merging"));
    let waited: Vec<Value> = sqlx::query_scalar("SELECT output FROM steps WHERE node = 'closed' ORDER BY created_at").fetch_all(&env.db.pool).await.unwrap();
    assert_eq!((waited[0]["merged"].clone(), waited[1]["merged"].clone()), (json!(true), json!(false)));

    // The person's pull request caused no call to GitHub and no run.
    let after: Vec<_> = env.fake.requests().into_iter().skip(before).filter(|r| r.path.contains("/40")).collect();
    assert!(after.is_empty(), "{after:?}");
    assert_eq!(env.scalar("SELECT count(*) FROM runs").await, 2);
    assert_eq!(env.scalar("SELECT count(*) FROM github_watches").await, 0);
    drop(_engine);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_watch_and_schedule_lookups_use_indexes() {
    let env = GhEnv::start(&[]).await;
    let mut conn = env.db.pool.pool().acquire().await.unwrap();
    // Each lookup a delivery (waking watchers) or an engine's claim (due ticks) makes.
    let lookups = [
        (
            "github_watches_by_item",
            "SELECT step_id FROM github_watches WHERE project_id = gen_random_uuid() AND repository = 'a/b' AND number = 1 AND org_id = gen_random_uuid()",
        ),
        (
            "github_watches_by_sha",
            "SELECT step_id FROM github_watches WHERE project_id = gen_random_uuid() AND repository = 'a/b' AND head_sha = 'abc' AND org_id = gen_random_uuid() AND watch = 'checks'",
        ),
        ("schedules_due", "SELECT EXISTS (SELECT 1 FROM schedules WHERE next_at <= now())"),
        ("schedules_due", "SELECT min(next_at) FROM schedules"),
    ];
    shopfloor_tests::assert_indexed(&mut conn, &lookups).await;
    drop(conn);
    env.finish().await;
}
