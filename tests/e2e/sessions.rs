//! Sessions read right, through a real `shopfloor host` and `shopfloor serve`: each real-format
//! transcript of `host/tests/fixtures` printed by a stand-in `claude` or `codex` (which ends as
//! that run of the harness ended) is recorded with its cost, estimate, tokens in and out, turns,
//! model, outcome and reason; and a Claude Code session that streams messages and never prints
//! a result line is stopped `budget_hard_stop` once its estimated spend passes a hard budget,
//! with the org's spend showing the estimate.
//!
//! The stand-ins never read their standard input (a harness may keep it open for messages sent
//! mid-session).

use std::path::{Path, PathBuf};
use std::time::Duration;

use engine::ids::RunId;
use serde_json::{Value, json};

use crate::host_env::{Env, alive};

/// The transcripts, from the host crate.
fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../host/tests/fixtures")
}

/// How a fixture's harness ended: an exit code, or `kill -9` of itself.
#[derive(Clone, Copy)]
enum End {
    Code(i32),
    Killed,
}

/// One real-format case and what the server must record of it.
struct Case {
    /// `claude/<node>` or `codex/<node>`: the fixture, and the node that runs it.
    fixture: &'static str,
    end: End,
    model_asked: &'static str,
    state: &'static str,
    reason: Option<&'static str>,
    class: Option<&'static str>,
    cost: Option<f64>,
    estimated: Option<f64>,
    /// What budgets count for the session.
    spent: f64,
    tokens: (i64, i64),
    lower_bound: bool,
    turns: i32,
    tool_calls: i32,
    model: Option<&'static str>,
}

const SONNET: Option<&str> = Some("claude-sonnet-4-5-20250929");

fn cases() -> Vec<Case> {
    let ok = |fixture, cost: f64, tokens, turns, tool_calls| Case {
        fixture,
        end: End::Code(0),
        model_asked: "claude-sonnet-4-5",
        state: "succeeded",
        reason: None,
        class: None,
        cost: Some(cost),
        estimated: Some(cost),
        spent: cost,
        tokens,
        lower_bound: false,
        turns,
        tool_calls,
        model: SONNET,
    };
    let failed = |fixture, code, reason, class, cost: f64, tokens, turns, tool_calls| Case {
        end: End::Code(code),
        state: "failed",
        reason: Some(reason),
        class: Some(class),
        ..ok(fixture, cost, tokens, turns, tool_calls)
    };
    vec![
        ok("claude/success", 0.055_307, (51_843, 583), 3, 2),
        ok("claude/multi_model", 0.057_428, (66_779, 708), 3, 2),
        ok("claude/two_results", 0.066_779, (79_359, 679), 4, 2),
        failed("claude/max_turns", 1, "turn cap reached", "ordinary", 0.037_266, (24_853, 412), 3, 2),
        failed("claude/max_budget", 1, "budget cap reached", "final", 0.055_307, (51_843, 583), 3, 2),
        failed("claude/sigterm", 143, "error during execution: Request was aborted.", "ordinary", 0.037_266, (24_853, 412), 2, 2),
        Case {
            model_asked: "claude-fable-9",
            model: Some("claude-fable-9"),
            estimated: Some(0.0),
            ..failed(
                "claude/api_error_404",
                1,
                "API error 404: There's an issue with the selected model (claude-fable-9). It may not exist or you may not have access to it. Run /model to pick a different model.",
                "final",
                0.0,
                (0, 0),
                1,
                0,
            )
        },
        Case {
            end: End::Killed,
            cost: None,
            estimated: Some(0.037_266),
            spent: 0.037_266,
            lower_bound: true,
            ..failed("claude/no_result", 0, "no result line (killed by signal 9)", "ordinary", 0.0, (24_853, 412), 1, 2)
        },
        Case {
            model_asked: "gpt-5-codex",
            cost: None,
            estimated: Some(0.022_555),
            spent: 0.022_555,
            model: Some("gpt-5-codex"),
            ..ok("codex/success", 0.0, (24_761, 1378), 1, 2)
        },
        Case {
            model_asked: "gpt-5-codex",
            cost: None,
            estimated: Some(0.012_936),
            spent: 0.012_936,
            model: Some("gpt-5-codex"),
            ..ok("codex/reconnect", 0.0, (15_120, 642), 1, 1)
        },
        Case {
            model_asked: "gpt-5-codex",
            cost: None,
            estimated: None,
            spent: 0.0,
            model: Some("gpt-5-codex"),
            ..failed(
                "codex/turn_failed",
                1,
                "turn failed: unexpected status 401 Unauthorized: Missing bearer or basic authentication in header",
                "final",
                0.0,
                (0, 0),
                0,
                0,
            )
        },
    ]
}

impl Case {
    fn harness(&self) -> &'static str {
        if self.fixture.starts_with("codex/") { "codex" } else { "claude-code" }
    }

    /// The node (and workflow) name: `success` for `claude/success`, `codex_success` for Codex.
    fn node(&self) -> String {
        self.fixture.replace("claude/", "").replace('/', "_")
    }

    fn workflow(&self) -> String {
        let h = self.harness();
        format!(
            "name: {node}\nnodes:\n  {node}:\n    crew: {{ harness: {h}, model: {model}, prompt: \"Return an error on empty input.\" }}\n    requires: [\"harness:{h}\"]\n",
            node = self.node(),
            model = self.model_asked,
        )
    }
}

/// A stand-in for a harness: prints the fixture its node names, then ends as that run ended.
fn stand_in(path: &Path, dir: &str, prefix: &str, cases: &[Case]) {
    let mut ends = String::new();
    for c in cases.iter().filter(|c| c.fixture.starts_with(dir)) {
        let end = match c.end {
            End::Code(code) => format!("exit {code}"),
            End::Killed => "kill -9 $$".to_owned(),
        };
        ends.push_str(&format!("  {}) {end} ;;\n", c.node()));
    }
    let script = format!(
        "#!/usr/bin/env bash\n# Prints a real transcript; never reads stdin.\nname=\"${{SHOPFLOOR_NODE#{prefix}}}\"\ncat \"{}/{dir}/$name.jsonl\"\ncase \"$SHOPFLOOR_NODE\" in\n{ends}  *) exit 3 ;;\nesac\n",
        fixtures().display()
    );
    std::fs::write(path, script).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

#[derive(Debug, sqlx::FromRow)]
struct Recorded {
    state: String,
    reason: Option<String>,
    failure_class: Option<String>,
    cost_usd: Option<f64>,
    estimated_cost_usd: Option<f64>,
    spent_usd: f64,
    input_tokens: i64,
    output_tokens: i64,
    output_tokens_lower_bound: bool,
    turns: i32,
    tool_calls: i32,
    model: Option<String>,
}

const RECORDED_SQL: &str = "SELECT s.state, s.reason, s.failure_class, ss.cost_usd::float8 AS cost_usd, ss.estimated_cost_usd::float8 AS estimated_cost_usd, \
            coalesce(ss.spent_usd, 0)::float8 AS spent_usd, ss.input_tokens, ss.output_tokens, ss.output_tokens_lower_bound, ss.turns, ss.tool_calls, ss.model \
     FROM steps s JOIN step_sessions ss ON ss.step_id = s.step_id WHERE s.run_id = $1";

#[tokio::test]
async fn every_real_format_transcript_is_recorded_right_through_a_host() {
    tokio::time::timeout(Duration::from_secs(300), async {
        let cases = cases();
        let sources: Vec<String> = cases.iter().map(Case::workflow).collect();
        let sources: Vec<&str> = sources.iter().map(String::as_str).collect();
        let env = Env::start(&sources).await;
        let (claude, codex) = (env.dir.path().join("claude-replay"), env.dir.path().join("codex-replay"));
        stand_in(&claude, "claude", "", &cases);
        stand_in(&codex, "codex", "codex_", &cases);
        let _host = env.host_with_codex("replay", 4, "linux,harness:claude-code,harness:codex", &claude, Some(&codex)).await;

        let mut runs: Vec<(RunId, &Case)> = Vec::new();
        for c in &cases {
            runs.push((env.submit(&c.node(), vec![json!({})]).await[0], c));
        }
        for (run, c) in &runs {
            env.until(*run, "SELECT status IN ('completed', 'failed') FROM runs WHERE run_id = $1", Duration::from_secs(120), "ended").await;
            let got: Recorded = sqlx::query_as(RECORDED_SQL).bind(run).fetch_one(&env.db.pool).await.unwrap();
            let what = c.fixture;
            assert_eq!(
                (got.state.as_str(), got.reason.as_deref(), got.failure_class.as_deref()),
                (c.state, c.reason, c.class),
                "{what}: outcome, reason, class"
            );
            assert_eq!((got.cost_usd, got.estimated_cost_usd, got.spent_usd), (c.cost, c.estimated, c.spent), "{what}: reported, estimated, spent");
            assert_eq!(
                (got.input_tokens, got.output_tokens, got.output_tokens_lower_bound),
                (c.tokens.0, c.tokens.1, c.lower_bound),
                "{what}: tokens in and out"
            );
            assert_eq!((got.turns, got.tool_calls, got.model.as_deref()), (c.turns, c.tool_calls, c.model), "{what}: turns, tool calls, model");
        }

        // The API says which figures are estimates: the killed session's, not the others'.
        for (run, c) in &runs {
            let view = env.get(&format!("/orgs/acme/projects/web/runs/{run}")).await;
            let session = &view["steps"][0]["session"];
            let estimate = c.cost.is_none() && c.estimated.is_some();
            assert_eq!(session["cost_is_estimate"].as_bool(), Some(estimate), "{}: {view}", c.fixture);
            assert_eq!(session["output_tokens_lower_bound"].as_bool(), Some(c.lower_bound), "{}: {view}", c.fixture);
        }
        // The org's spend is what the sessions' figures add up to.
        let spend: f64 = sqlx::query_scalar("SELECT coalesce(sum(usd), 0)::float8 FROM spend").fetch_one(&env.db.pool).await.unwrap();
        let want: f64 = cases.iter().map(|c| c.spent).sum();
        assert!((spend - want).abs() < 1e-6, "spend {spend}, sessions {want}");
        env.finish().await;
    })
    .await
    .expect("the replayed sessions hung");
}

/// Claude Code streaming a new message every half second for 60 s, and no result line: each
/// message 8,000 tokens out and 20,000 read from the cache on Sonnet 4.5, $0.126009.
const STREAMING_CLAUDE: &str = r#"#!/usr/bin/env bash
set -u
sid="3c1f0e7a-5d2b-4a96-8e41-7b0c9d2f6a35"
model="claude-sonnet-4-5-20250929"
echo "$$" > "$MARKS/$SHOPFLOOR_STEP_ID.pid"
printf '%s\n' '{"type":"system","subtype":"init","cwd":"'"$PWD"'","session_id":"'"$sid"'","tools":["Bash","Edit","Read"],"mcp_servers":[],"model":"'"$model"'","permissionMode":"acceptEdits","apiKeySource":"ANTHROPIC_API_KEY","claude_code_version":"2.1.4","uuid":"0b7e4c2a-9f13-4d58-a6e0-2c5b8d1f7e94"}'
for i in $(seq 1 120); do
  printf '%s\n' '{"type":"assistant","message":{"model":"'"$model"'","id":"msg_stream_'"$i"'","type":"message","role":"assistant","content":[{"type":"text","text":"Step '"$i"' of the refactor."}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3,"cache_creation_input_tokens":0,"cache_read_input_tokens":20000,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"output_tokens":8000,"service_tier":"standard"},"context_management":null},"parent_tool_use_id":null,"session_id":"'"$sid"'","uuid":"a5d0c3e1-7b29-4f84-9c16-'"$(printf '%012d' "$i")"'"}'
  sleep 0.5
done
"#;

#[tokio::test]
async fn estimated_spend_past_a_hard_budget_stops_a_session_that_prints_no_result() {
    tokio::time::timeout(Duration::from_secs(300), async {
        let source = "name: long\nnodes:\n  refactor:\n    crew: { harness: claude-code, model: claude-sonnet-4-5, prompt: \"Refactor the parser.\" }\n    requires: [\"harness:claude-code\"]\n";
        let env = Env::start(&[source]).await;
        let claude = env.dir.path().join("claude-stream");
        std::fs::write(&claude, STREAMING_CLAUDE).unwrap();
        std::fs::set_permissions(&claude, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let client = reqwest::Client::new();
        let api = format!("{}/api/v1/orgs/acme", env.base);
        let set = client.put(format!("{api}/budgets/day")).bearer_auth(&env.owner_token).json(&json!({ "usd_limit": 0.5, "hard": true })).send().await.unwrap();
        assert!(set.status().is_success(), "{}", set.text().await.unwrap_or_default());
        let _host = env.host_with("streamer", 1, "linux,harness:claude-code", &claude).await;
        let run = env.submit("long", vec![json!({})]).await[0];
        let (step, pid) = env.running_harness(run, "refactor").await;

        // Four messages are $0.504: the report that carries the fourth stops the step.
        env.until(run, "SELECT status = 'failed' FROM runs WHERE run_id = $1", Duration::from_secs(90), "failed by its hard budget").await;
        let (reason, class): (String, String) =
            sqlx::query_as("SELECT reason, failure_class FROM steps WHERE run_id = $1").bind(run).fetch_one(&env.db.pool).await.unwrap();
        assert_eq!((reason.as_str(), class.as_str()), ("budget_hard_stop", "final"));
        let (cost, estimated, spent, lower): (Option<f64>, f64, f64, bool) = sqlx::query_as(
            "SELECT cost_usd::float8, estimated_cost_usd::float8, spent_usd::float8, output_tokens_lower_bound FROM step_sessions WHERE run_id = $1",
        )
        .bind(run)
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
        assert_eq!(cost, None, "Claude Code never reported a cost");
        assert!(estimated >= 0.5 && spent == estimated && lower, "estimated {estimated}, spent {spent}");
        let results: i64 = sqlx::query_scalar("SELECT count(*) FROM step_logs WHERE run_id = $1 AND stream = 'result'").bind(run).fetch_one(&env.db.pool).await.unwrap();
        assert_eq!(results, 0);

        // The org's spend shows the estimate, in the spend table and the budgets API.
        let org_spend: f64 = sqlx::query_scalar("SELECT coalesce(sum(usd), 0)::float8 FROM spend").fetch_one(&env.db.pool).await.unwrap();
        assert_eq!(org_spend, spent);
        let budgets: Value = client.get(format!("{api}/budgets")).bearer_auth(&env.owner_token).send().await.unwrap().json().await.unwrap();
        assert_eq!(budgets["items"][0]["spent_usd"].as_f64(), Some(spent), "{budgets}");

        // The host stopped the harness.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        while alive(pid) {
            assert!(tokio::time::Instant::now() < deadline, "the harness of {step} still runs");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        env.finish().await;
    })
    .await
    .expect("the budget stop hung");
}
