//! What a crew step may do, through a real `shopfloor host` and server: the harness is told
//! the budget left (the least of the node's cap, the run's `usd_per_run` and the project's
//! hard limit, less what was spent) and the turn cap; a session that ignores its turn cap is
//! stopped by the server (`turn_cap`); a host that does not advertise a step's harness never
//! claims it; and a crew step that feeds a pull request and changed no file fails
//! `no_changes`, which the run's page says in words.

use std::time::Duration;

use engine::ids::RunId;
use engine::store::{Actor, Change, budgets};
use serde_json::{Value, json};
use shopfloor_tests::process::Proc;

use super::host_env::*;

/// A Claude Code stand-in that writes its arguments to `$MARKS/<step>.args` and prints what
/// `claude -p --output-format stream-json --verbose` prints for a session of two messages. It
/// changes CHANGES.md unless the prompt is `@NOCHANGE@`, and with `@IGNORE_TURNS@` it goes on
/// sending assistant messages (a turn each) for a minute whatever `--max-turns` said. It does
/// not read its standard input to the end: a host may keep it open for later messages.
const ARGS_CLAUDE: &str = r#"#!/usr/bin/env bash
set -u
IFS= read -r -t 10 prompt || true
marks="${MARKS:?}"
step="${SHOPFLOOR_STEP_ID:?}"
printf '%s\n' "$@" > "$marks/$step.args"
sid="sess-$$"
model="claude-sonnet-4-5-20250929"
say() { printf '%s\n' "$1"; }
assistant() {
  say '{"type":"assistant","message":{"id":"'"$1"'","type":"message","role":"assistant","model":"'"$model"'","content":[{"type":"text","text":"'"$2"'"}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":2,"service_tier":"standard"}},"parent_tool_use_id":null,"session_id":"'"$sid"'","uuid":"u-'"$1"'"}'
}
say '{"type":"system","subtype":"init","cwd":"'"$PWD"'","session_id":"'"$sid"'","tools":["Bash","Edit","Read"],"mcp_servers":[],"model":"'"$model"'","permissionMode":"acceptEdits","apiKeySource":"none","uuid":"u-init"}'
case "$prompt" in
  *@IGNORE_TURNS@*)
    for i in $(seq 1 60); do
      assistant "msg_$i" "turn $i"
      sleep 1
    done
    ;;
esac
case "$prompt" in
  *@NOCHANGE@*) ;;
  *) echo "- $SHOPFLOOR_NODE of $SHOPFLOOR_RUN_ID" >> CHANGES.md ;;
esac
assistant msg_a "Working."
assistant msg_b "Done."
say '{"type":"result","subtype":"success","is_error":false,"duration_ms":900,"duration_api_ms":800,"num_turns":2,"result":"Done.","session_id":"'"$sid"'","total_cost_usd":0.0021,"usage":{"input_tokens":6,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":4,"service_tier":"standard"},"modelUsage":{"'"$model"'":{"inputTokens":6,"outputTokens":4,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"webSearchRequests":0,"costUSD":0.0021,"contextWindow":200000}},"permission_denials":[],"uuid":"u-result"}'
"#;

const CAPPED: &str = include_str!("../workflows/capped.yaml");
const TURNS: &str = include_str!("../workflows/turns.yaml");
const BARE: &str = include_str!("../workflows/bare.yaml");
const TO_PR: &str = include_str!("../workflows/to_pr.yaml");

fn stand_in(env: &Env) -> std::path::PathBuf {
    let path = env.dir.path().join("args-claude");
    std::fs::write(&path, ARGS_CLAUDE).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

/// A host `name` with one slot that runs Claude Code as the [`stand_in`].
async fn claude_host(env: &Env, name: &str) -> Proc {
    env.host_with(name, 1, "linux,harness:claude-code", &stand_in(env)).await
}

/// `source` served with a host `host` of the [`stand_in`], and a run of `workflow` with `input`.
async fn run_on_claude(source: &str, host: &str, workflow: &str, input: Value) -> (Env, Proc, RunId) {
    let env = Env::start(&[source]).await;
    let host = claude_host(&env, host).await;
    let run = env.submit(workflow, vec![input]).await[0];
    (env, host, run)
}

/// The step of `node` in `run`, with its state and reason.
async fn step(env: &Env, run: engine::ids::RunId, node: &str) -> (engine::ids::StepId, String, Option<String>) {
    sqlx::query_as("SELECT step_id, state, reason FROM steps WHERE run_id = $1 AND node = $2 ORDER BY attempt DESC LIMIT 1")
        .bind(run)
        .bind(node)
        .fetch_one(&env.db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_harness_is_told_the_budget_left_and_the_turn_cap() {
    let env = Env::start(&[CAPPED]).await;
    // A hard daily limit of $5 for the project, of which $1.25 is spent already.
    let (status, set) = env.put("/orgs/acme/projects/web/budgets/day", &json!({ "usd_limit": 5, "hard": true })).await;
    assert!((200..300).contains(&status), "{status} {set}");
    let mut ch = Change::begin(&env.db.pool, Actor::System).await.unwrap();
    budgets::record_spend(&mut ch, env.org, env.project, 1.25, 1000).await.unwrap();
    ch.commit().await.unwrap();

    let _host = claude_host(&env, "capped").await;
    let run = env.submit("capped", vec![json!({ "words": "go" })]).await[0];
    env.until(run, "SELECT status = 'completed' FROM runs WHERE run_id = $1", Duration::from_secs(60), "completed").await;
    let (step, _, _) = step(&env, run, "work").await;
    let args = std::fs::read_to_string(env.marks().join(format!("{step}.args"))).unwrap();
    let args: Vec<&str> = args.lines().collect();
    let value = |flag: &str| args.iter().position(|a| *a == flag).and_then(|i| args.get(i + 1)).copied();
    // The least of $10 (the node), $4 (the run) and $5 − $1.25 (the project today).
    assert_eq!(value("--max-budget-usd"), Some("3.75"), "{args:?}");
    assert_eq!(value("--max-turns"), Some("7"), "{args:?}");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_past_its_turn_cap_is_stopped_by_the_server() {
    let (env, _host, run) = run_on_claude(TURNS, "turns", "turns", json!({})).await;
    // The stand-in goes on for a minute; the server stops it once it reports a fourth turn.
    env.until(run, "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND reason = 'turn_cap')", Duration::from_secs(50), "stopped at its turn cap").await;
    let turns: i32 =
        sqlx::query_scalar("SELECT ss.turns FROM step_sessions ss JOIN steps s ON s.step_id = ss.step_id WHERE s.run_id = $1 AND s.reason = 'turn_cap'")
            .bind(run)
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
    assert!(turns > 3, "stopped at {turns} turns, within its cap of 3");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_without_the_harness_never_claims_the_step() {
    let env = Env::start(&[BARE]).await;
    // A host that runs commands only; were it handed the step, it would fail it
    // `harness_not_found` (its claude command does not exist).
    let missing = env.dir.path().join("no-such-claude");
    let _commands = env.host_with("commands", 2, "linux,harness:command", &missing).await;
    let run = env.submit("bare", vec![json!({ "words": "go" })]).await[0];
    let client = reqwest::Client::new();
    let why_url = format!("{}/api/v1/orgs/acme/projects/web/runs/{run}/why", env.base);
    let unroutable = async {
        loop {
            let why: Option<Value> = match client.get(&why_url).bearer_auth(&env.owner_token).send().await {
                Ok(r) => r.json().await.ok(),
                Err(_) => None,
            };
            match why {
                Some(why) if why["substate"] == "unroutable" => return why,
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    };
    let why = tokio::time::timeout(Duration::from_secs(60), unroutable).await.expect("the run never said that no host can run it");
    assert_eq!(why["detail"]["missing"], json!(["harness:claude-code"]), "{why}");
    assert!(why["text"].as_str().unwrap_or_default().contains("harness:claude-code"), "{why}");

    // A host that runs Claude Code takes it; the other one never held it.
    let _claude = claude_host(&env, "claude").await;
    env.until(run, "SELECT status = 'completed' FROM runs WHERE run_id = $1", Duration::from_secs(60), "completed").await;
    let holders: Vec<(i32, String)> = sqlx::query_as(
        "SELECT s.attempt, h.name FROM steps s JOIN step_sessions ss ON ss.step_id = s.step_id JOIN hosts h ON h.host_id = ss.host_id WHERE s.run_id = $1 AND s.node = 'work'",
    )
    .bind(run)
    .fetch_all(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(holders, [(1, "claude".to_owned())]);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crew_step_that_feeds_a_pull_request_and_changed_nothing_fails_no_changes() {
    let (env, _host, run) = run_on_claude(TO_PR, "builder", "to-pr", json!({ "repository": "acme/widgets", "title": "Nothing to do" })).await;
    env.until(run, "SELECT status = 'failed' FROM runs WHERE run_id = $1", Duration::from_secs(60), "failed").await;
    let (_, state, reason) = step(&env, run, "build").await;
    assert_eq!((state.as_str(), reason.as_deref()), ("failed", Some("no_changes")));
    let opened: i64 = sqlx::query_scalar("SELECT count(*) FROM steps WHERE run_id = $1 AND node = 'open_pr'").bind(run).fetch_one(&env.db.pool).await.unwrap();
    assert_eq!(opened, 0, "no pull request is opened from no work");

    // The run's page says it in words, with the machine reason beside them.
    let owner: engine::ids::UserId =
        sqlx::query_scalar("SELECT user_id FROM memberships WHERE org_id = $1 AND role = 'owner'").bind(env.org).fetch_one(&env.db.pool).await.unwrap();
    let mut ch = Change::begin(&env.db.pool, Actor::System).await.unwrap();
    let token = api::auth::issue_user_token(
        &mut ch,
        &engine::testkit::secret_key(),
        api::auth::UserToken { org: env.org, user: owner, project: None, role: "owner", name: "console session", ttl: chrono::Duration::hours(1) },
    )
    .await
    .unwrap();
    ch.commit().await.unwrap();
    let page = reqwest::Client::new()
        .get(format!("{}/orgs/acme/projects/web/runs/{run}", env.base))
        .header("cookie", format!("shopfloor_session=acme.{token}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("Changed no file, though a pull request is opened from this work"), "{page}");
    assert!(page.contains("no_changes"));
    env.finish().await;
}
