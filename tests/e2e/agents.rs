//! The real agent CLIs, pinned in `scripts/agent-clis.txt` (`make test` installs them), run
//! by a real `shopfloor host` for a real `shopfloor serve`, each talking to a stand-in of its
//! model API on loopback (`shopfloor_tests::model_fake`: the Anthropic Messages API for Claude
//! Code, the OpenAI Responses API for Codex), whose scripted model edits a file, runs commands,
//! keeps working, listens, or is refused, as a marker in the prompt says.
//!
//! What a user checks: a session that edits and runs a command succeeds and pushes its work,
//! with the figures the CLI itself printed; a `read` step cannot edit, and a step whose agent
//! was refused its edits does not succeed; a session that keeps spending is stopped by the
//! run's hard cap, its spend recorded between the cap and one model call more (the CLI's own
//! final figure where it printed one); a cancel leaves no process and records what was spent;
//! a model API's 400 fails the step once, final, in the API's words; and a person's message
//! reaches the model's next request.

use std::path::PathBuf;
use std::time::Duration;

use engine::ids::RunId;
use serde_json::{Value, json};
use shopfloor_tests::model_fake::{self, BAD_REQUEST, FakeModel};
use shopfloor_tests::process::Proc;

use super::host_env::{Env, git_out};

/// A pinned CLI, installed by `make test` (`scripts/agent-clis.sh`), named by `var`.
fn cli(var: &str) -> PathBuf {
    let path = std::env::var(var)
        .unwrap_or_else(|_| panic!("{var} is not set: run `make test`, which installs the pinned agent CLIs (scripts/agent-clis.sh) and sets it"));
    let path = PathBuf::from(path);
    assert!(path.exists(), "{} does not exist: run scripts/agent-clis.sh (make test does)", path.display());
    path
}

/// Which CLI a test drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Agent {
    Claude,
    Codex,
}

impl Agent {
    fn harness(self) -> &'static str {
        match self {
            Agent::Claude => "claude-code",
            Agent::Codex => "codex",
        }
    }

    /// The model a test asks for: one the price table knows, so that figures can be checked.
    fn model(self) -> &'static str {
        match self {
            Agent::Claude => "claude-sonnet-4-5",
            // The one model of Codex 0.169's list that takes the Responses API's published
            // tools (its default, gpt-6.1-sol, calls a JavaScript tool of its own).
            Agent::Codex => "gpt-5.5",
        }
    }

    async fn fake(self) -> FakeModel {
        match self {
            Agent::Claude => model_fake::anthropic::start().await,
            Agent::Codex => model_fake::openai::start().await,
        }
    }
}

/// A workflow `name` of one crew node `work` for `agent`, with more keys for the crew (`extra`,
/// YAML flow-mapping entries) and for the workflow (`top`).
fn workflow(name: &str, agent: Agent, prompt: &str, extra: &str, top: &str) -> String {
    let (harness, model) = (agent.harness(), agent.model());
    format!(
        "name: {name}\n{top}nodes:\n  work:\n    crew: {{ harness: {harness}, model: {model}, prompt: \"{prompt}\"{extra} }}\n    requires: [\"harness:{harness}\"]\n"
    )
}

/// A server with `sources`, the stand-in model of `agent`, and a host running the real CLI
/// against it.
struct Rig {
    env: Env,
    model: FakeModel,
    _host: Proc,
}

impl Rig {
    async fn start(agent: Agent, sources: &[String]) -> Rig {
        let sources: Vec<&str> = sources.iter().map(String::as_str).collect();
        let env = Env::start(&sources).await;
        let model = agent.fake().await;
        let home = env.dir.path().join("home");
        // Codex: a provider of the host user's settings (which the host gives each attempt's
        // Codex home) at the stand-in, with the key in OPENAI_API_KEY; no plugin sync nor
        // analytics, which would look for hosts this machine cannot reach.
        std::fs::create_dir_all(home.join(".codex")).unwrap();
        let codex_config = format!(
            "model_provider = \"standin\"\n\n[model_providers.standin]\nname = \"stand-in\"\nbase_url = \"{}/v1\"\nenv_key = \"OPENAI_API_KEY\"\n\n\
             [analytics]\nenabled = false\n\n[features]\nplugins = false\n",
            model.url
        );
        std::fs::write(home.join(".codex/config.toml"), codex_config).unwrap();
        let vars = [
            // Inside the walls, as a host runs unless told otherwise.
            ("SHOPFLOOR_HOST_UNSANDBOXED", "false".to_owned()),
            ("HOME", home.display().to_string()),
            // Claude Code: the stand-in and an API key.
            ("ANTHROPIC_BASE_URL", model.url.clone()),
            ("ANTHROPIC_API_KEY", "sk-ant-test".to_owned()),
            ("OPENAI_API_KEY", "sk-test".to_owned()),
        ];
        let capabilities = format!("linux,harness:{}", agent.harness());
        let host = env.host_full("agents", 1, &capabilities, &cli("SHOPFLOOR_TEST_CLAUDE"), Some(&cli("SHOPFLOOR_TEST_CODEX")), &vars).await;
        Rig { env, model, _host: host }
    }

    async fn finish(self) {
        let Rig { env, model, _host } = self;
        drop(_host);
        drop(model);
        env.finish().await;
    }

    async fn until_ended(&self, run: RunId) {
        self.env.until(run, "SELECT status <> 'running' FROM runs WHERE run_id = $1", Duration::from_secs(240), "ended").await;
    }

    /// The last step of `work`: its state, reason and class.
    async fn work(&self, run: RunId) -> (String, Option<String>, Option<String>) {
        sqlx::query_as("SELECT state, reason, failure_class FROM steps WHERE run_id = $1 AND node = 'work' ORDER BY attempt DESC LIMIT 1")
            .bind(run)
            .fetch_one(&self.env.db.pool)
            .await
            .unwrap()
    }

    /// The id of the step of `work` (its first attempt).
    async fn step(&self, run: RunId) -> String {
        let step: engine::ids::StepId = sqlx::query_scalar("SELECT step_id FROM steps WHERE run_id = $1 AND node = 'work' ORDER BY attempt LIMIT 1")
            .bind(run)
            .fetch_one(&self.env.db.pool)
            .await
            .unwrap();
        step.to_string()
    }

    /// The session's recorded figures: cost reported, spend counted, input and output tokens,
    /// turns.
    async fn session(&self, run: RunId) -> Session {
        let row: (Option<f64>, Option<f64>, f64, i64, i64, i32, Option<String>) = sqlx::query_as(
            "SELECT ss.cost_usd::float8, ss.estimated_cost_usd::float8, coalesce(ss.spent_usd, 0)::float8, ss.input_tokens, ss.output_tokens, ss.turns, ss.estimate_basis \
             FROM step_sessions ss JOIN steps s ON s.step_id = ss.step_id WHERE s.run_id = $1 AND s.node = 'work' ORDER BY s.attempt DESC LIMIT 1",
        )
        .bind(run)
        .fetch_one(&self.env.db.pool)
        .await
        .unwrap();
        Session { cost: row.0, estimated: row.1, spent: row.2, input: row.3, output: row.4, turns: row.5, basis: row.6 }
    }

    /// The run's transcript lines of `stream`, parsed.
    async fn transcript(&self, run: RunId, stream: &str) -> Vec<Value> {
        let lines: Vec<String> = sqlx::query_scalar("SELECT line FROM step_logs WHERE run_id = $1 AND stream = $2 ORDER BY seq")
            .bind(run)
            .bind(stream)
            .fetch_all(&self.env.db.pool)
            .await
            .unwrap();
        lines.iter().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// Waits until the stand-in has answered `n` model calls.
    async fn until_calls(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
        while self.model.calls().iter().filter(|c| c.reply.is_some()).count() < n {
            assert!(tokio::time::Instant::now() < deadline, "the model was called {} times, never {n}", self.model.calls().len());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[derive(Debug)]
struct Session {
    cost: Option<f64>,
    estimated: Option<f64>,
    spent: f64,
    input: i64,
    output: i64,
    turns: i32,
    basis: Option<String>,
}

/// The figures the CLI itself printed last: Claude Code's result line (cost, turns, tokens
/// summed over `modelUsage`), Codex's `turn.completed` usage (it prints no cost).
async fn printed(rig: &Rig, agent: Agent, run: RunId) -> (Option<f64>, i32, i64, i64) {
    match agent {
        Agent::Claude => {
            let results = rig.transcript(run, "result").await;
            let r = results.last().unwrap_or_else(|| panic!("no result line"));
            let models = r["modelUsage"].as_object().expect("modelUsage");
            let sum = |k: &[&str]| models.values().map(|m| k.iter().map(|k| m[*k].as_i64().unwrap_or(0)).sum::<i64>()).sum::<i64>();
            let input = sum(&["inputTokens", "cacheReadInputTokens", "cacheCreationInputTokens"]);
            (r["total_cost_usd"].as_f64(), r["num_turns"].as_i64().unwrap() as i32, input, sum(&["outputTokens"]))
        }
        // Codex prints its tokens per turn, and counts its model calls in its session file,
        // one for each call the stand-in answered.
        Agent::Codex => {
            let turns = rig.transcript(run, "turn").await;
            let done: Vec<&Value> = turns.iter().filter(|t| t["type"] == "turn.completed").collect();
            assert!(!done.is_empty(), "no turn.completed in {turns:?}");
            let input = done.iter().map(|t| t["usage"]["input_tokens"].as_i64().unwrap()).sum();
            let output = done.iter().map(|t| t["usage"]["output_tokens"].as_i64().unwrap()).sum();
            let calls = rig.model.calls().iter().filter(|c| c.reply.is_some()).count();
            (None, calls as i32, input, output)
        }
    }
}

/// The repository as the step pushed it: the file at `path` on `branch`, if any.
fn pushed(env: &Env, branch: &str, path: &str) -> String {
    git_out(&env.dir.path().join("remotes/acme/widgets.git"), &["show", &format!("{branch}:{path}")])
}

async fn edits_and_runs_a_command(agent: Agent) {
    let rig = Rig::start(agent, &[workflow("edit", agent, "@EDIT@ Write the notes", "", "")]).await;
    let run = rig.env.submit("edit", vec![json!({ "repository": "acme/widgets", "title": "Notes" })]).await[0];
    rig.until_ended(run).await;
    assert_eq!(rig.work(run).await, ("succeeded".to_owned(), None, None));
    let branch: String =
        sqlx::query_scalar("SELECT output->>'branch' FROM steps WHERE run_id = $1 AND node = 'work'").bind(run).fetch_one(&rig.env.db.pool).await.unwrap();
    assert_eq!(pushed(&rig.env, &branch, "NOTES.md"), "hello from the model");
    assert_eq!(pushed(&rig.env, &branch, "COUNT.txt"), "1 NOTES.md", "the command ran in the worktree");
    // Inside the walls the CLI reached its model API through the host's proxy, and tried
    // nothing else.
    let refused: Vec<String> = sqlx::query_scalar("SELECT attrs->>'destination' FROM run_events WHERE run_id = $1 AND kind = 'step.egress_refused'")
        .bind(run)
        .fetch_all(&rig.env.db.pool)
        .await
        .unwrap();
    assert!(refused.is_empty(), "{refused:?}");

    let s = rig.session(run).await;
    let (cost, turns, input, output) = printed(&rig, agent, run).await;
    assert_eq!((s.cost, s.turns, s.input, s.output), (cost, turns, input, output), "{s:?}");
    match agent {
        // The CLI's cost is what budgets count.
        Agent::Claude => assert_eq!(Some(s.spent), cost, "{s:?}"),
        // Codex prints none: the host's estimate from the price table.
        Agent::Codex => {
            assert_eq!(s.basis.as_deref(), Some("price_table"));
            assert!(s.estimated.is_some_and(|e| e > 0.0 && (e - s.spent).abs() < 1e-6), "{s:?}");
        }
    }
    rig.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_edits_runs_a_command_and_its_figures_are_its_own() {
    edits_and_runs_a_command(Agent::Claude).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn codex_edits_runs_a_command_and_its_figures_are_its_own() {
    edits_and_runs_a_command(Agent::Codex).await;
}

async fn a_read_step_cannot_edit(agent: Agent) {
    let sources = [
        workflow("look", agent, "@EDIT@ Look only", ", permissions: read, expect: any", ""),
        workflow("must", agent, "@EDIT@ Change it", ", permissions: read, expect: changes", ""),
    ];
    let rig = Rig::start(agent, &sources).await;
    // Allowed to change nothing: it succeeds, and nothing was written.
    let look = rig.env.submit("look", vec![json!({ "repository": "acme/widgets", "title": "Look" })]).await[0];
    rig.until_ended(look).await;
    assert_eq!(rig.work(look).await.0, "succeeded");
    let files: Option<Value> =
        sqlx::query_scalar("SELECT output->'files' FROM steps WHERE run_id = $1 AND node = 'work'").bind(look).fetch_one(&rig.env.db.pool).await.unwrap();
    assert_eq!(files, Some(json!([])), "a read step changed files");

    // Expected to change files, refused every edit: failed, and the reason says why.
    let must = rig.env.submit("must", vec![json!({ "repository": "acme/widgets", "title": "Must" })]).await[0];
    rig.until_ended(must).await;
    let (state, reason, _) = rig.work(must).await;
    assert_eq!((state.as_str(), reason.as_deref()), ("failed", Some("edits_refused")));
    let error: String = sqlx::query_scalar("SELECT output->>'error' FROM steps WHERE run_id = $1 AND node = 'work' ORDER BY attempt DESC LIMIT 1")
        .bind(must)
        .fetch_one(&rig.env.db.pool)
        .await
        .unwrap();
    assert!(error.contains("refused") && error.contains("NOTES.md"), "{error}; its session: {:#?}", rig.transcript(must, "stderr").await);
    rig.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_cannot_edit_in_a_read_step() {
    a_read_step_cannot_edit(Agent::Claude).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn codex_cannot_edit_in_a_read_step() {
    a_read_step_cannot_edit(Agent::Codex).await;
}

/// The hard cap of the spending test.
const CAP: f64 = 0.25;

async fn a_session_that_keeps_working_is_stopped_at_the_cap(agent: Agent) {
    let top = format!("budget: {{ usd_per_run: {CAP}, hard: true }}\n");
    let rig = Rig::start(agent, &[workflow("spend", agent, "@FOREVER@ Keep going", "", &top)]).await;
    let run = rig.env.submit("spend", vec![json!({})]).await[0];
    rig.until_ended(run).await;
    // Stopped by the server's count (`budget_hard_stop`), or by the host's or the CLI's own,
    // told what the run may still spend (`budget cap reached`): final either way.
    let (state, reason, class) = rig.work(run).await;
    assert_eq!((state.as_str(), class.as_deref()), ("failed", Some("final")), "{reason:?}");
    assert!(matches!(reason.as_deref(), Some("budget_hard_stop" | "budget cap reached")), "{reason:?}");

    // The dearest call the model answered: the most the spend may pass the cap by.
    let calls = rig.model.calls();
    let answered = calls.iter().filter(|c| c.reply.is_some()).count();
    assert!(answered < model_fake::FOREVER_CALLS, "never stopped: {answered} calls");
    let dearest = calls.iter().filter_map(|c| c.tokens).map(|t| price(agent, t)).fold(0.0, f64::max);
    let spent: f64 = sqlx::query_scalar("SELECT spent_usd::float8 FROM runs WHERE run_id = $1").bind(run).fetch_one(&rig.env.db.pool).await.unwrap();
    assert!(spent >= CAP && spent <= CAP + dearest + 1e-6, "spent {spent}, cap {CAP}, one call ≤ {dearest}");

    // What the model was paid for, at the table's prices for the model asked for: every call
    // the stand-in answered, of which the CLI may not have counted the one it was interrupted in.
    let prices: Vec<f64> = calls.iter().filter_map(|c| c.tokens).map(|t| price(agent, t)).collect();
    let paid: f64 = prices.iter().sum();
    let counted = paid - prices.last().copied().unwrap_or(0.0);
    assert!(spent >= counted - 1e-5 && spent <= paid + 1e-5, "recorded {spent}, the calls cost {counted} to {paid}");
    // Claude Code printed its own final figure after the interrupt: that is the spend. Codex
    // prints none: the spend is the estimate from its session file's last count.
    let s = rig.session(run).await;
    if agent == Agent::Claude {
        let cost = s.cost.unwrap_or_else(|| panic!("no cost of the CLI's own recorded: {s:?}"));
        assert!((s.spent - cost).abs() < 1e-6 && (spent - cost).abs() < 1e-6, "{s:?}");
    }
    rig.finish().await;
}

/// What one call's tokens cost at the list price of the model the tests ask for (USD per
/// million: Claude Sonnet 4.5 and GPT-5.5, as `host/prices.json` has them; OpenAI's input
/// counts its cached part, which the stand-in reports as cache reads).
fn price(agent: Agent, t: model_fake::Tokens) -> f64 {
    let (input, write, read, output) = match agent {
        Agent::Claude => (3.0, 3.75, 0.30, 15.0),
        Agent::Codex => (5.0, 5.0, 0.5, 30.0),
    };
    (t.input as f64 * input + t.cache_write as f64 * write + t.cache_read as f64 * read + t.output as f64 * output) / 1e6
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_is_stopped_at_the_hard_cap() {
    a_session_that_keeps_working_is_stopped_at_the_cap(Agent::Claude).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn codex_is_stopped_at_the_hard_cap() {
    a_session_that_keeps_working_is_stopped_at_the_cap(Agent::Codex).await;
}

/// The processes whose environment names `step` (the host gives every harness its step's id,
/// and the CLI's tools inherit it).
fn session_processes(step: &str) -> Vec<i32> {
    let needle = format!("SHOPFLOOR_STEP_ID={step}");
    super::host_env::live_processes(|pid| {
        std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| environ.split(|b| *b == 0).any(|v| v == needle.as_bytes()))
    })
}

async fn a_cancel_leaves_no_process_and_records_its_cost(agent: Agent) {
    let rig = Rig::start(agent, &[workflow("cancel", agent, "@FOREVER@ Keep going", "", "")]).await;
    let run = rig.env.submit("cancel", vec![json!({})]).await[0];
    rig.until_calls(3).await;
    let step = rig.step(run).await;
    assert!(!session_processes(&step).is_empty(), "the session runs");
    let (status, answer) = rig.env.post(&format!("/orgs/acme/projects/web/runs/{run}/cancel"), &json!({ "reason": "not needed" })).await;
    assert_eq!(status, 200, "{answer}");
    // The host reports the session's last figures once its harness is gone.
    rig.env
        .until(
            run,
            "SELECT EXISTS (SELECT 1 FROM run_events WHERE run_id = $1 AND kind = 'step.session' AND (attrs->>'after_end')::bool)",
            Duration::from_secs(120),
            "reported the cancelled session's figures",
        )
        .await;
    assert_eq!(session_processes(&step), Vec::<i32>::new(), "a process of the cancelled session lives on");
    // The spend is the CLI's own last figure where it printed one (Claude Code does, unless
    // interrupted before its model answered), else the host's last estimate, marked as one.
    let s = rig.session(run).await;
    assert!(s.spent > 0.0 && s.input > 0, "{s:?}");
    let figure = s.cost.or(s.estimated).unwrap_or_default();
    assert!((s.spent - figure).abs() < 1e-6, "{s:?}");
    rig.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_cancelled_leaves_nothing_and_its_cost_is_kept() {
    a_cancel_leaves_no_process_and_records_its_cost(Agent::Claude).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn codex_cancelled_leaves_nothing_and_its_cost_is_kept() {
    a_cancel_leaves_no_process_and_records_its_cost(Agent::Codex).await;
}

async fn a_bad_request_fails_once_final(agent: Agent) {
    let retry = "\n    retry: { attempts: 3, backoff: 1s }";
    let source = workflow("bad", agent, "@BAD@ Go", "", "") + retry.trim_start_matches('\n') + "\n";
    let rig = Rig::start(agent, &[source]).await;
    let run = rig.env.submit("bad", vec![json!({})]).await[0];
    rig.until_ended(run).await;
    let (state, reason, class) = rig.work(run).await;
    assert_eq!((state.as_str(), class.as_deref()), ("failed", Some("final")));
    let reason = reason.unwrap_or_default();
    assert!(reason.contains(BAD_REQUEST), "{reason}");
    let attempts: i64 =
        sqlx::query_scalar("SELECT count(*) FROM steps WHERE run_id = $1 AND node = 'work'").bind(run).fetch_one(&rig.env.db.pool).await.unwrap();
    assert_eq!(attempts, 1, "a refused request is not sent again by another attempt");
    rig.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_refused_by_the_api_fails_once() {
    a_bad_request_fails_once_final(Agent::Claude).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn codex_refused_by_the_api_fails_once() {
    a_bad_request_fails_once_final(Agent::Codex).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_reaches_claude_codes_next_request() {
    let agent = Agent::Claude;
    let rig = Rig::start(agent, &[workflow("listen", agent, "@LISTEN@ Wait for word", "", "")]).await;
    let run = rig.env.submit("listen", vec![json!({})]).await[0];
    rig.until_calls(2).await;
    let step = rig.step(run).await;
    let text = "please @STOP@ now";
    let (status, sent) = rig.env.post(&format!("/orgs/acme/projects/web/runs/{run}/steps/{step}/messages"), &json!({ "text": text })).await;
    assert_eq!(status, 201, "{sent}");
    rig.until_ended(run).await;
    assert_eq!(rig.work(run).await.0, "succeeded");
    // The first request that carried the message was answered as a model that heard it would.
    let calls = rig.model.calls();
    let heard = calls.iter().find(|c| c.reply.is_some() && c.body.to_string().contains(text)).expect("no request of the model carried the message");
    assert_eq!(heard.reply, Some(model_fake::Reply::Text("heard".into())), "{:#?}", heard.body["messages"]);
    rig.finish().await;
}
