//! The environment of the host tests: `shopfloor serve` on a test database, `shopfloor host`
//! processes registered through the API, a stand-in for Claude Code that prints its real
//! stream-json format, and a local bare repository as the remote.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use engine::ids::{OrgId, ProjectId, RunId, WorkflowId};
use engine::store::{Actor, Change, installations};
use engine::testkit::{TestDb, test_db};
use serde_json::Value;
use shopfloor_tests::github_fake::{self, FakeGithub, Repo, WebhookClient};
use shopfloor_tests::process::{Listening, Proc, listen, sh, shopfloor};
use shopfloor_tests::shopfloor_bin;

use crate::support::{Acme, acme, owner_token, put_workflows, registration};

const SECRET: &str = "host tests' webhook secret";

/// A stand-in for Claude Code: reads its prompt as the first user line on stdin (`claude -p
/// --input-format stream-json`) and prints what `--output-format stream-json --verbose` prints
/// (an init line, assistant lines with their usage, a tool result, a result line with cost,
/// turns, tokens and modelUsage), editing CHANGES.md on the way; then, as Claude Code does,
/// answers each further user line with a turn of its own (an assistant line echoing it and a
/// result line) until its input ends. Words in the prompt change what it does:
/// `@SLOW@` prints a line a second for two minutes first (on the first attempt only, unless
/// `@ALWAYS@`); `@HANG@` ignores SIGINT and starts a child that ignores it too, then waits;
/// `@WAIT@` prints a line and waits until `$MARKS/<step>.go` exists; `@LISTEN@` prints a line,
/// then reads the next user line and echoes it (`heard: <text>`) before its result.
/// It writes its pid to `$MARKS/<step>.pid` and a line per run to `$MARKS/<step>.count`.
pub(crate) const FAKE_CLAUDE: &str = r#"#!/usr/bin/env bash
set -u
IFS= read -r prompt || true
sid="sess-$$"
model="claude-sonnet-4-5-20250929"
marks="${MARKS:?}"
step="${SHOPFLOOR_STEP_ID:?}"
echo "$$" > "$marks/$step.pid"
echo "run" >> "$marks/$step.count"
say() { printf '%s\n' "$1"; }
# The text of a user line, still escaped as a JSON string.
text_of() { printf '%s' "$1" | sed -E 's/.*"text":"(([^"\\]|\\.)*)".*/\1/'; }
assistant() {
  say '{"type":"assistant","message":{"id":"'"$1"'","type":"message","role":"assistant","model":"'"$model"'","content":['"$2"'],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":'"$3"',"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":'"$4"',"service_tier":"standard"}},"parent_tool_use_id":null,"session_id":"'"$sid"'"}'
}
result() {
  say '{"type":"result","subtype":"success","is_error":false,"duration_ms":1234,"duration_api_ms":1100,"num_turns":'"$2"',"result":"'"$1"'","session_id":"'"$sid"'","total_cost_usd":0.012345678,"usage":{"input_tokens":42,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":35,"service_tier":"standard"},"modelUsage":{"'"$model"'":{"inputTokens":42,"outputTokens":35,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"webSearchRequests":0,"costUSD":0.012345678,"contextWindow":200000}},"permission_denials":[],"uuid":"u-'"$2"'"}'
}
say '{"type":"system","subtype":"init","cwd":"'"$PWD"'","session_id":"'"$sid"'","tools":["Bash","Edit","Read"],"mcp_servers":[],"model":"'"$model"'","permissionMode":"acceptEdits","apiKeySource":"none"}'
case "$prompt" in
  *@HANG@*)
    trap '' INT
    sleep 600 &
    echo "$!" > "$marks/$step.child"
    assistant msg_h '{"type":"text","text":"Working on it."}' 5 3
    wait
    ;;
  *@SLOW@*)
    if [ "${SHOPFLOOR_ATTEMPT:-1}" = 1 ] || [[ "$prompt" == *@ALWAYS@* ]]; then
      for i in $(seq 1 120); do
        assistant "msg_s$i" '{"type":"text","text":"thinking '"$i"'"}' 1 1
        sleep 1
      done
    fi
    ;;
  *@WAIT@*)
    assistant msg_w '{"type":"text","text":"Waiting for the go-ahead."}' 2 2
    for i in $(seq 1 3000); do
      [ -e "$marks/$step.go" ] && break
      sleep 0.1
    done
    ;;
  *@LISTEN@*)
    assistant msg_l '{"type":"text","text":"Listening."}' 2 2
    if IFS= read -r -t 120 heard; then
      assistant msg_heard '{"type":"text","text":"heard: '"$(text_of "$heard")"'"}' 3 3
    fi
    ;;
esac
assistant msg_1 '{"type":"tool_use","id":"toolu_1","name":"Edit","input":{"file_path":"CHANGES.md"}}' 12 20
echo "- $SHOPFLOOR_NODE of $SHOPFLOOR_RUN_ID, attempt $SHOPFLOOR_ATTEMPT" >> CHANGES.md
say '{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_1","type":"tool_result","content":"The file CHANGES.md has been updated."}]},"parent_tool_use_id":null,"session_id":"'"$sid"'"}'
answer="Added a line to CHANGES.md.\n\nPULL REQUEST\nAdd a line to CHANGES.md\n\nSo that the change shows."
assistant msg_2 '{"type":"text","text":"'"$answer"'"}' 30 15
result "$answer" 2
# Each further user line is a turn of its own; the end of the input ends the session.
turn=2
while IFS= read -r more; do
  turn=$((turn + 1))
  assistant "msg_t$turn" '{"type":"text","text":"heard: '"$(text_of "$more")"'"}' 3 3
  result "heard: $(text_of "$more")" "$turn"
done
"#;

pub(crate) fn git_out(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git").args(args).current_dir(dir).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

pub(crate) struct Env {
    pub db: TestDb,
    pub _server: Proc,
    /// GitHub on loopback, when the server acts as the GitHub App.
    pub github: Option<FakeGithub>,
    pub base: String,
    pub dir: tempfile::TempDir,
    pub org: OrgId,
    pub project: ProjectId,
    pub workflows: Vec<(String, WorkflowId)>,
    pub owner_token: String,
}

impl Env {
    /// `shopfloor serve` on a test database with org `acme`, project `web`, the workflows,
    /// `acme/widgets` connected, and a bare repository for it with one commit on `main`.
    pub(crate) async fn start(sources: &[&str]) -> Env {
        Env::start_with(sources, false).await
    }

    /// As `start`; with `github`, the server is the GitHub App against the fake GitHub
    /// (outputs, installation tokens) and takes signed webhooks.
    pub(crate) async fn start_with(sources: &[&str], github: bool) -> Env {
        Env::start_stalling_after(sources, github, 600).await
    }

    /// As `start_with`, with crew steps whose session is silent for `stall_secs` stalled.
    pub(crate) async fn start_stalling_after(sources: &[&str], github: bool, stall_secs: u64) -> Env {
        Env::launch(sources, github, stall_secs, &[]).await
    }

    /// As `start`, with more settings in the server's environment.
    pub(crate) async fn start_setting(sources: &[&str], vars: &[(&str, &str)]) -> Env {
        Env::launch(sources, false, 600, vars).await
    }

    async fn launch(sources: &[&str], github: bool, stall_secs: u64, vars: &[(&str, &str)]) -> Env {
        let db = test_db().await;
        let dir = tempfile::tempdir().unwrap();
        let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
        let acme = acme(&mut ch).await;
        let wfs = put_workflows(&mut ch, acme.org, acme.project, sources).await;
        installations::connect_for_test(&mut ch, acme.org, acme.project, 77, "acme", "acme/widgets").await.unwrap();
        let owner_token = owner_token(&mut ch, &acme, "test", 2).await;
        ch.commit().await.unwrap();

        let d = dir.path();
        std::fs::create_dir_all(d.join("remotes/acme")).unwrap();
        std::fs::create_dir_all(d.join("marks")).unwrap();
        sh(
            d,
            "git init -q --bare -b main remotes/acme/widgets.git && git clone -q remotes/acme/widgets.git seed 2>/dev/null \
               && cd seed && echo '# widgets' > README.md && mkdir -p .github && echo '## What and why' > .github/pull_request_template.md \
               && git add -A && git -c user.name=t -c user.email=t@example.com commit -q -m init && git push -q origin HEAD:main",
        );
        let fake = d.join("claude");
        std::fs::write(&fake, FAKE_CLAUDE).unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

        let mut cmd = shopfloor(&["serve", "--log", "warn"], &db.url);
        cmd.env("SHOPFLOOR_DRAIN_SECS", "2")
            .env("SHOPFLOOR_DB_CONNECTIONS", "16")
            .env("SHOPFLOOR_GITHUB_WEBHOOK_SECRET", SECRET)
            .env("SHOPFLOOR_STALL_SECS", stall_secs.to_string())
            .envs(vars.iter().copied());
        let fake = if github { Some(FakeGithub::start().await) } else { None };
        if let Some(fake) = &fake {
            github_fake::as_app(&mut cmd, &fake.url, 2);
        }
        let Listening { proc, base } = listen(cmd).await;
        let Acme { org, project, .. } = acme;
        Env { db, _server: proc, github: fake, base, dir, org, project, workflows: wfs, owner_token }
    }

    /// Stops the server, checks that no due wake was left unclaimed, and drops the database.
    pub(crate) async fn finish(self) {
        let Env { db, _server, dir, github, .. } = self;
        drop(_server);
        drop(github);
        db.finish().await;
        drop(dir);
    }

    /// Signs and sends GitHub's webhooks to the server.
    pub(crate) fn hooks(&self) -> WebhookClient {
        WebhookClient::new(&self.base, SECRET)
    }

    /// The connected repository as webhooks name it.
    pub(crate) fn repo(&self) -> Repo {
        Repo::new("acme/widgets", 77)
    }

    pub(crate) fn marks(&self) -> PathBuf {
        self.dir.path().join("marks")
    }

    /// A registration token for one host, made through the API as an admin would.
    pub(crate) async fn registration(&self) -> String {
        registration(&self.base, &self.owner_token, "test host").await
    }

    /// Starts `shopfloor host` with its own work directory (reused when started again).
    pub(crate) async fn host(&self, name: &str, slots: u32) -> Proc {
        self.host_with(name, slots, "linux,harness:claude-code", &self.dir.path().join("claude")).await
    }

    /// As `host`, advertising `capabilities` (comma-separated) and running `claude` as Claude
    /// Code.
    pub(crate) async fn host_with(&self, name: &str, slots: u32, capabilities: &str, claude: &Path) -> Proc {
        self.host_full(name, slots, capabilities, claude, None, &[]).await
    }

    /// As `host_with`, running `codex` as Codex when given.
    pub(crate) async fn host_with_codex(&self, name: &str, slots: u32, capabilities: &str, claude: &Path, codex: Option<&Path>) -> Proc {
        self.host_full(name, slots, capabilities, claude, codex, &[]).await
    }

    /// As `host`, with more variables in the host's environment (`PATH` with a `git` that
    /// notes what it is called with, …).
    pub(crate) async fn host_env(&self, name: &str, slots: u32, vars: &[(&str, String)]) -> Proc {
        self.host_full(name, slots, "linux,harness:claude-code", &self.dir.path().join("claude"), None, vars).await
    }

    /// A host with every setting: its capabilities, the Claude Code and Codex it runs, more
    /// variables in its environment.
    pub(crate) async fn host_full(&self, name: &str, slots: u32, capabilities: &str, claude: &Path, codex: Option<&Path>, vars: &[(&str, String)]) -> Proc {
        let work = self.dir.path().join("hosts").join(name);
        let token = if work.join("credential.json").exists() { String::new() } else { self.registration().await };
        let mut cmd = Command::new(shopfloor_bin());
        // The stand-in harnesses write their marks where the test reads them: these hosts run
        // without walls (`agents.rs` and `walls.rs` run theirs inside), and pass `MARKS` on.
        cmd.env("SHOPFLOOR_HOST_UNSANDBOXED", "true").env("SHOPFLOOR_HOST_PASS_ENV", "MARKS,ANTHROPIC_API_KEY,ANTHROPIC_BASE_URL,OPENAI_API_KEY");
        cmd.envs(vars.iter().map(|(k, v)| (*k, v.as_str())));
        cmd.args(["host", "--log", &std::env::var("HOST_LOG").unwrap_or_else(|_| "warn".into()), "--capabilities", capabilities])
            .arg("--server")
            .arg(&self.base)
            .arg("--name")
            .arg(name)
            .arg("--max-concurrent")
            .arg(slots.to_string())
            .arg("--work-dir")
            .arg(&work)
            .arg("--claude-command")
            .arg(claude)
            .arg("--git-url-template")
            .arg(format!("{}/remotes/{{repo}}.git", self.dir.path().display()))
            .env("SHOPFLOOR_HOST_TOKEN", token)
            .env("SHOPFLOOR_HOST_INTERRUPT_GRACE_SECS", "2")
            .env("SHOPFLOOR_HOST_HEARTBEAT_SECS", "2")
            .env("SHOPFLOOR_DRAIN_SECS", "2")
            .env("MARKS", self.marks())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        if let Some(codex) = codex {
            cmd.arg("--codex-command").arg(codex);
        }
        Proc(cmd.spawn().expect("spawn shopfloor host"))
    }

    /// `GET /api/v1{path}` as the org's owner, the answer's JSON.
    pub(crate) async fn get(&self, path: &str) -> Value {
        let answer = reqwest::Client::new().get(format!("{}/api/v1{path}", self.base)).bearer_auth(&self.owner_token).send().await.unwrap();
        answer.json().await.unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// `POST /api/v1{path}` as the org's owner: the status and the answer's JSON.
    pub(crate) async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, body).await
    }

    /// `PUT /api/v1{path}` as the org's owner: the status and the answer's JSON.
    pub(crate) async fn put(&self, path: &str, body: &Value) -> (u16, Value) {
        self.call(reqwest::Method::PUT, path, body).await
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: &Value) -> (u16, Value) {
        let url = format!("{}/api/v1{path}", self.base);
        let answer = reqwest::Client::new().request(method, url).bearer_auth(&self.owner_token).json(body).send().await.unwrap();
        let status = answer.status().as_u16();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    pub(crate) fn workflow(&self, name: &str) -> WorkflowId {
        self.workflows.iter().find(|w| w.0 == name).map(|w| w.1).expect("a test workflow")
    }

    pub(crate) async fn submit(&self, workflow: &str, inputs: Vec<Value>) -> Vec<RunId> {
        let seed = shopfloor_tests::Seed { org: self.org, project: self.project, workflow: self.workflow(workflow), version: 1 };
        shopfloor_tests::submit_inputs(&self.db.pool, &seed, &inputs).await
    }

    /// Waits until `sql` ($1 = the run) is true.
    pub(crate) async fn until(&self, run: RunId, sql: &str, limit: Duration, what: &str) {
        let deadline = Instant::now() + limit;
        loop {
            let done: bool = sqlx::query_scalar(sql).bind(run).fetch_one(&self.db.pool).await.unwrap();
            if done {
                return;
            }
            if Instant::now() >= deadline {
                let steps: Vec<(String, i32, String, Option<String>)> =
                    sqlx::query_as("SELECT node, attempt, state, coalesce(reason, holder) FROM steps WHERE run_id = $1 ORDER BY started_seq")
                        .bind(run)
                        .fetch_all(&self.db.pool)
                        .await
                        .unwrap_or_default();
                panic!("{run}: never {what}; its steps: {steps:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) async fn status(&self, run: RunId) -> (String, Option<String>) {
        sqlx::query_as("SELECT status, reason FROM runs WHERE run_id = $1").bind(run).fetch_one(&self.db.pool).await.unwrap()
    }

    /// Submits a run of `workflow` with `input`: the run once its crew step `work` runs, with
    /// the step and its harness's pid (see [`Env::running_harness`]).
    pub(crate) async fn working(&self, workflow: &str, input: Value) -> (RunId, String, i32) {
        let run = self.submit(workflow, vec![input]).await[0];
        let (step, pid) = self.running_harness(run, "work").await;
        (run, step, pid)
    }

    /// The one step of `node` that is running, with the pid its harness wrote down.
    pub(crate) async fn running_harness(&self, run: RunId, node: &str) -> (String, i32) {
        self.until(
            run,
            &format!("SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = '{node}' AND state = 'running')"),
            Duration::from_secs(120),
            "ran",
        )
        .await;
        let step: engine::ids::StepId = sqlx::query_scalar("SELECT step_id FROM steps WHERE run_id = $1 AND node = $2 AND state = 'running'")
            .bind(run)
            .bind(node)
            .fetch_one(&self.db.pool)
            .await
            .unwrap();
        let path = self.marks().join(format!("{step}.pid"));
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(pid) = std::fs::read_to_string(&path).ok().and_then(|t| t.trim().parse().ok()) {
                return (step.to_string(), pid);
            }
            assert!(Instant::now() < deadline, "the harness of {step} never started");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Whether a process runs (a zombie does not).
pub(crate) fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()).is_some_and(|state| state != "Z"),
        Err(_) => false,
    }
}

/// The live processes (not zombies) for which `matches` holds, given their pid.
pub(crate) fn live_processes(matches: impl Fn(i32) -> bool) -> Vec<i32> {
    let pids = std::fs::read_dir("/proc").unwrap().flatten().filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()));
    pids.filter(|pid| matches(*pid) && alive(*pid)).collect()
}

/// Live processes of a process group.
pub(crate) fn group(pgid: i32) -> Vec<i32> {
    live_processes(|pid| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().nth(2)).and_then(|g| g.parse::<i32>().ok()) == Some(pgid)
    })
}
