//! Outputs on GitHub, executed by real `shopfloor engine` processes acting as the GitHub App
//! against the fake: installation tokens minted with the App's JWT and scoped to the
//! repository; a crash between "GitHub acted" and "step recorded" leaves exactly one pull
//! request or comment after recovery; 4xx fails for good, 5xx is retried, a secondary rate
//! limit defers the step until GitHub's `Retry-After`, an outage defers it; labels and board
//! moves.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shopfloor_tests::github_fake::payloads::{self, user};
use shopfloor_tests::github_fake::{Fault, Issue, Repo};
use shopfloor_tests::process::Proc;

use crate::github_env::GhEnv;
use crate::support::the_pull_request;

const SHIP: &str = include_str!("../workflows/ship_build_then_pr.yaml");
const SAY: &str = include_str!("../workflows/say.yaml");
const TRIAGE: &str = include_str!("../workflows/triage.yaml");

const LONG: Duration = Duration::from_secs(90);

async fn label(env: &GhEnv, number: i64, title: &str, name: &str) -> Issue {
    label_in(env, &env.repo, number, title, name).await
}

/// Puts issue `number` of `repo`, labelled `name`, on the fake GitHub and delivers its
/// `issues.labeled` webhook, which must open one run.
async fn label_in(env: &GhEnv, repo: &Repo, number: i64, title: &str, name: &str) -> Issue {
    let mut issue = Issue::new(number, title);
    issue.labels.push(name.to_owned());
    env.fake.put_issue(&repo.full_name, issue.json(repo));
    let outcome = env.deliver("issues", &payloads::issues_event("labeled", repo, &issue, &user("bob"), Some(name))).await;
    assert!(format!("{outcome:?}").contains("runs_opened: 1"), "{outcome:?}");
    issue
}

/// `source` served, issue `number` labelled `name`, and a first engine that dies at the crash
/// hook `hook`: once GitHub acted, before the step recorded it.
async fn crashed_at(source: &str, number: i64, title: &str, name: &str, hook: &str) -> GhEnv {
    let env = GhEnv::start(&[source]).await;
    label(&env, number, title, name).await;
    let mut first = env.engine("gh-a", Some(hook));
    first.until_exited(&format!("the crash hook {hook}")).await;
    env
}

/// The path of the comments of issue `n` of `acme/widgets`.
fn comments_of(n: i64) -> String {
    format!("/repos/acme/widgets/issues/{n}/comments")
}

/// [`SAY`] served, with the POSTs of each `(issue, fault, times)`'s comments failing with the
/// fault, the first so many times.
async fn say_with_faults<const N: usize>(faults: [(i64, Fault, usize); N]) -> GhEnv {
    let env = GhEnv::start(&[SAY]).await;
    for (n, fault, times) in faults {
        env.fake.inject(Some("POST"), &comments_of(n), fault, times);
    }
    env
}

/// Starts engine `id` and waits until it completed the one run; the engine.
async fn completed_by(env: &GhEnv, id: &str) -> Proc {
    let engine = env.engine(id, None);
    env.until("SELECT count(*) FROM runs WHERE status = 'completed'", 1, LONG).await;
    engine
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_after_the_pull_request_opened_leaves_exactly_one_after_recovery() {
    // The first engine opens the pull request and dies before recording it.
    let env = crashed_at(SHIP, 1, "Fix the widget", "ship", "pr_opened").await;
    assert_eq!(env.fake.pulls("acme/widgets").len(), 1);
    assert_eq!(env.scalar("SELECT count(*) FROM steps WHERE node = 'open_pr' AND state = 'running'").await, 1);

    // Another engine recovers the step when its lease lapses, finds the open pull request on
    // the branch, and records it instead of opening a second one.
    let started = Instant::now();
    let _second = completed_by(&env, "gh-b").await;
    println!("github outputs: the crashed pull request step was recovered in {:.1} s", started.elapsed().as_secs_f64());
    let pr = &the_pull_request(&env.fake);
    assert_eq!(env.fake.requests_to("POST", "/repos/acme/widgets/pulls").len(), 1);
    assert_eq!(pr["head"]["ref"], "shopfloor/1-fix-the-widget");
    assert_eq!(pr["base"]["ref"], "main");
    let body = pr["body"].as_str().unwrap_or_default();
    assert_eq!(body.lines().next(), Some("Closes #1"), "{body}");
    assert!(body.contains("build done"), "the crew step's text: {body}");

    let steps = env.steps("open_pr").await;
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert_eq!((steps[0].state.as_str(), steps[0].reason.as_deref()), ("failed", Some("lease_expired")));
    assert_eq!(steps[1].state, "succeeded");
    let output = steps[1].output.clone().unwrap_or_default();
    assert_eq!(output["created"], false, "{output}");
    assert_eq!(output["pull_request"]["number"], pr["number"]);

    // The App minted installation tokens with its JWT, scoped to the one repository and to what
    // opening a pull request needs, and used them; the second engine minted its own (tokens are
    // cached per process).
    let mints = env.fake.requests_to("POST", "/app/installations/77/access_tokens");
    assert_eq!(mints.len(), 2, "{mints:?}");
    for mint in &mints {
        let auth = mint.authorization.clone().unwrap_or_default();
        let jwt = auth.strip_prefix("Bearer ").unwrap_or_default();
        // As GitHub checks it: RS256 under the App's public key, issued by the App's id, not
        // yet expired, at most ten minutes long.
        let public = std::fs::read(shopfloor_tests::github_fake::app_public_key()).unwrap();
        let key = jsonwebtoken::DecodingKey::from_rsa_pem(&public).unwrap();
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
        validation.set_required_spec_claims(&["exp", "iat", "iss"]);
        validation.set_issuer(&["1"]);
        let claims = jsonwebtoken::decode::<Value>(jwt, &key, &validation).unwrap_or_else(|e| panic!("not the App's JWT ({e}): {auth}")).claims;
        assert!(claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap() <= 600, "{claims}");
        assert_eq!(mint.body, json!({ "repositories": ["widgets"], "permissions": { "pull_requests": "write", "contents": "read" } }));
    }
    for call in env.fake.requests().iter().filter(|r| r.path.starts_with("/repos/")) {
        assert!(call.authorization.as_deref().unwrap_or_default().starts_with("Bearer ghs_"), "{call:?}");
    }
    drop(_second);
    env.finish().await;
}

/// A repository whose default branch is `master`, as GitHub's deliveries say: its pull
/// request goes to `master`.
#[tokio::test(flavor = "multi_thread")]
async fn a_master_repositorys_pull_request_goes_to_master() {
    let env = GhEnv::start(&[SHIP]).await;
    let mut repo = env.repo.clone();
    repo.default_branch = "master".into();
    label_in(&env, &repo, 2, "Old repository", "ship").await;
    let _engine = completed_by(&env, "gh-master").await;
    assert_eq!(the_pull_request(&env.fake)["base"]["ref"], "master");
    drop(_engine);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_after_the_comment_posted_leaves_exactly_one_after_recovery() {
    let env = crashed_at(SAY, 4, "Say hello", "say", "comment_posted").await;
    assert_eq!(env.fake.comments("acme/widgets", 4).len(), 1);

    let _second = completed_by(&env, "gh-b").await;
    let comments = env.fake.comments("acme/widgets", 4);
    assert_eq!(comments.len(), 1, "exactly one comment: {comments:?}");
    let run: String = env.text("SELECT 'run-' || run_id FROM runs LIMIT 1").await.unwrap_or_default();
    let body = comments[0]["body"].as_str().unwrap_or_default();
    assert!(body.starts_with("Working on Say hello"), "{body}");
    let run_id: uuid::Uuid = sqlx::query_scalar("SELECT run_id FROM runs").fetch_one(&env.db.pool).await.unwrap();
    let marker = format!("<!-- shopfloor:{}:note -->", engine::ids::RunId(run_id));
    assert!(body.ends_with(&marker), "{body} should end with {marker} ({run})");
    assert_eq!(env.fake.requests_to("POST", "/repos/acme/widgets/issues/4/comments").len(), 1);
    let steps = env.steps("note").await;
    assert_eq!(steps.last().and_then(|s| s.output.clone()).unwrap_or_default()["created"], false);
    drop(_second);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_errors_fail_server_errors_retry_and_rate_limits_and_outages_defer() {
    // #10: a 422, final. #11: one 502, retried. #12: a secondary rate limit for 2 s, deferred.
    // #13: 502 four times (the call and its three retries), an outage, deferred.
    let env = say_with_faults([
        (10, Fault::Status(422), 1),
        (11, Fault::Status(502), 1),
        (12, Fault::SecondaryRateLimit { retry_after: 2 }, 1),
        (13, Fault::Status(503), 4),
    ])
    .await;
    let started = Instant::now();
    let _engine = env.engine("gh-a", None);
    for n in 10..=13 {
        label(&env, n, &format!("Issue {n}"), "say").await;
    }

    // 4xx: the step fails for good at once, without a retry; the run fails.
    env.until("SELECT count(*) FROM runs WHERE status = 'failed'", 1, LONG).await;
    let failed: (String, String) =
        sqlx::query_as("SELECT s.reason, s.failure_class FROM steps s WHERE s.state = 'failed'").fetch_one(&env.db.pool).await.unwrap();
    assert_eq!(failed, ("github:422".to_owned(), "final".to_owned()));
    assert_eq!(env.fake.requests_to("POST", &comments_of(10)).len(), 1, "a 4xx is never retried");
    assert!(env.fake.comments("acme/widgets", 10).is_empty());

    // 5xx once: retried after a second, one comment.
    // Rate limited: the step went back to pending (`deferred:rate_limited`) and ran again
    // after GitHub's Retry-After.
    env.until("SELECT count(*) FROM runs WHERE status = 'completed'", 2, LONG).await;
    assert_eq!(env.fake.requests_to("POST", &comments_of(11)).len(), 2);
    assert_eq!(env.fake.comments("acme/widgets", 11).len(), 1);
    assert_eq!(env.fake.comments("acme/widgets", 12).len(), 1);
    let deferred: Vec<(Value, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as("SELECT attrs, at FROM run_events WHERE kind = 'step.deferred' ORDER BY at").fetch_all(&env.db.pool).await.unwrap();
    assert!(!deferred.is_empty());
    assert_eq!(deferred[0].0["reason"], "deferred:rate_limited", "{deferred:?}");
    assert_eq!(deferred[0].0["delay_ms"], 2000);
    let limited = env.fake.requests_to("POST", &comments_of(12));
    assert_eq!(limited.len(), 2, "once limited, once after the wait");
    let (attempt, succeeded_after): (i32, f64) = sqlx::query_as(
        "SELECT s.attempt, extract(epoch FROM s.ended_at - e.at)::float8 FROM steps s JOIN run_events e ON e.step_id = s.step_id AND e.kind = 'step.deferred' \
         JOIN items i ON i.item_id = (SELECT item_id FROM runs WHERE run_id = s.run_id) WHERE i.key = '[\"github\",\"acme/widgets\",12]'",
    )
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(attempt, 1, "a deferral is not an attempt");
    assert!(succeeded_after >= 1.9, "ran again only after Retry-After: {succeeded_after:.2} s");

    // The outage: the call and its retries failed, and the step waits for GitHub to come back
    // (deferred, not failed).
    env.until(
        "SELECT count(*) FROM steps s JOIN runs r ON r.run_id = s.run_id JOIN items i ON i.item_id = r.item_id \
         WHERE i.key = '[\"github\",\"acme/widgets\",13]' AND s.state = 'pending' AND s.reason = 'deferred:github_unavailable'",
        1,
        LONG,
    )
    .await;
    assert_eq!(env.fake.requests_to("POST", &comments_of(13)).len(), 4);
    assert_eq!(env.scalar("SELECT count(*) FROM runs WHERE status = 'running'").await, 1);
    println!("github outputs: 4xx, 5xx, rate limit and outage handled in {:.1} s", started.elapsed().as_secs_f64());
    drop(_engine);
    env.finish().await;
}

/// Two ways a comment's POST goes wrong while GitHub stays up. On #7 GitHub made the comment
/// but answered after the engine gave up (its timeout is 2 s here): the engine looks for the
/// comment before it posts again, and finds it. On #6 GitHub answers 401 to an installation
/// token it no longer takes (revoked, or expired before the engine's clock says): a new token
/// is minted and the comment made. One comment each.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_answer_and_a_refused_token_each_leave_one_comment() {
    let env = say_with_faults([(7, Fault::AnswerLate(Duration::from_secs(5)), 1), (6, Fault::Status(401), 1)]).await;
    let _engine = env.engine("gh-a", None);
    label(&env, 7, "Lost answer", "say").await;
    label(&env, 6, "Refused token", "say").await;
    env.until("SELECT count(*) FROM runs WHERE status = 'completed'", 2, LONG).await;
    for n in [6, 7] {
        assert_eq!(env.fake.comments("acme/widgets", n).len(), 1, "#{n}: {:?}", env.fake.comments("acme/widgets", n));
    }
    assert_eq!(env.fake.requests_to("POST", &comments_of(7)).len(), 1, "found, not posted again");
    let created: bool = sqlx::query_scalar(
        "SELECT (s.output->>'created')::bool FROM steps s JOIN runs r ON r.run_id = s.run_id JOIN items i ON i.item_id = r.item_id \
         WHERE i.key = '[\"github\",\"acme/widgets\",7]' AND s.node = 'note' AND s.state = 'succeeded'",
    )
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert!(!created, "#7's comment was found, not made");
    assert_eq!(env.fake.requests_to("POST", &comments_of(6)).len(), 2);
    assert_eq!(env.fake.requests_to("POST", "/app/installations/77/access_tokens").len(), 2, "a new token after the 401");
    drop(_engine);
    env.finish().await;
}

/// A repository renamed on GitHub answers its old paths with redirects (301 for a GET, 307 for a
/// POST, with the body to send again): the output follows them, and the comment is made once.
#[tokio::test(flavor = "multi_thread")]
async fn a_renamed_repositorys_redirects_are_followed() {
    let env = GhEnv::start(&[SAY]).await;
    let moved = Fault::Moved { from: "/repos/acme/widgets/".into(), to: "/repos/acme/gadgets/".into() };
    env.fake.inject(None, "/repos/acme/widgets/issues/5/comments", moved, 10);
    let _engine = env.engine("gh-moved", None);
    label(&env, 5, "Moved", "say").await;
    env.until("SELECT count(*) FROM runs WHERE status = 'completed'", 1, LONG).await;
    let comments = env.fake.comments("acme/gadgets", 5);
    assert_eq!(comments.len(), 1, "{comments:?}");
    assert!(comments[0]["body"].as_str().unwrap_or_default().starts_with("Working on Moved"), "{comments:?}");
    assert_eq!(env.fake.requests_to("POST", "/repos/acme/widgets/issues/5/comments").len(), 1);
    assert_eq!(env.fake.requests_to("POST", "/repos/acme/gadgets/issues/5/comments").len(), 1);
    drop(_engine);
    env.finish().await;
}

/// GitHub answers a GraphQL query in part, with a 200: the issue's card on a board the
/// installation cannot see comes back without its project, beside an error. The move is made
/// on the board it can see.
#[tokio::test(flavor = "multi_thread")]
async fn a_partial_graphql_answer_moves_the_card_on_the_board_it_can_see() {
    let env = GhEnv::start(&[TRIAGE]).await;
    env.fake.graphql_answer(json!({
        "data": { "node": { "projectItems": { "nodes": [
            { "id": "PVTI_hidden", "project": null },
            { "id": "PVTI_card8", "project": { "id": "PVT_board", "field": { "id": "PVTSSF_status", "options": [
                { "id": "opt_ready", "name": "Ready" }, { "id": "opt_progress", "name": "In progress" } ] } } },
        ] } } },
        "errors": [{ "type": "FORBIDDEN", "path": ["node", "projectItems", "nodes", 0, "project"],
                     "message": "Resource not accessible by integration", "locations": [{ "line": 1, "column": 60 }] }],
    }));
    env.fake.graphql_reply(json!({ "updateProjectV2ItemFieldValue": { "projectV2Item": { "id": "PVTI_card8" } } }));
    let _engine = env.engine("gh-partial", None);
    label(&env, 8, "Sort me too", "triage").await;
    env.until("SELECT count(*) FROM runs WHERE status = 'completed'", 1, LONG).await;
    let graphql = env.fake.requests_to("POST", "/graphql");
    assert_eq!(graphql.len(), 2, "{graphql:?}");
    assert_eq!(graphql[1].body["variables"]["item"], "PVTI_card8");
    drop(_engine);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn labels_are_added_and_removed_and_the_card_moves_on_the_board() {
    let env = GhEnv::start(&[TRIAGE]).await;
    // The narrow queries' answers: the issue's card with the board's Status options, then the
    // mutation's.
    env.fake.graphql_reply(json!({ "node": { "projectItems": { "nodes": [{
        "id": "PVTI_card7",
        "project": { "id": "PVT_board", "field": { "id": "PVTSSF_status", "options": [
            { "id": "opt_ready", "name": "Ready" }, { "id": "opt_progress", "name": "In progress" }, { "id": "opt_done", "name": "Done" } ] } }
    }] } } }));
    env.fake.graphql_reply(json!({ "updateProjectV2ItemFieldValue": { "projectV2Item": { "id": "PVTI_card7" } } }));
    let _engine = env.engine("gh-a", None);
    label(&env, 7, "Sort me", "triage").await;
    env.until("SELECT count(*) FROM runs WHERE status = 'completed'", 1, LONG).await;

    assert_eq!(env.fake.issue_labels("acme/widgets", 7), ["in-progress"]);
    let graphql = env.fake.requests_to("POST", "/graphql");
    assert_eq!(graphql.len(), 2, "{graphql:?}");
    assert_eq!(graphql[0].body["variables"]["id"], format!("I_{}_7", env.repo.id));
    assert_eq!(graphql[1].body["variables"], json!({ "project": "PVT_board", "item": "PVTI_card7", "field": "PVTSSF_status", "option": "opt_progress" }));
    assert!(graphql[1].body["query"].as_str().unwrap_or_default().contains("updateProjectV2ItemFieldValue"));
    assert!(graphql[0].authorization.as_deref().unwrap_or_default().starts_with("Bearer ghs_"));
    let output: Value = sqlx::query_scalar("SELECT output FROM steps WHERE node = 'move'").fetch_one(&env.db.pool).await.unwrap();
    assert_eq!(output["board"]["column"], "In progress");
    // Each step asked for what it needs, once (tokens are cached per repository and scope until
    // five minutes before they expire): the labels the issues' permissions, the board move the
    // org's projects'.
    let mints: Vec<Value> = env.fake.requests_to("POST", "/app/installations/77/access_tokens").into_iter().map(|r| r.body["permissions"].clone()).collect();
    assert_eq!(mints.len(), 2, "{mints:?}");
    assert!(mints.contains(&json!({ "issues": "write", "pull_requests": "write" })), "{mints:?}");
    assert!(mints.contains(&json!({ "organization_projects": "write", "issues": "read", "pull_requests": "read" })), "{mints:?}");
    drop(_engine);
    env.finish().await;
}
