//! The operator's command line against a real `shopfloor serve` (with the test executor) on a
//! database of the test's own: each command's output, and the state it changed as the API
//! reports it. `--json` output of each list is compared with the API's own bytes, and
//! `runs follow` is driven in a pseudo-terminal: it shows the run reach its approval, answers
//! it with `a` and the fields, and shows the run complete.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use engine::testkit::{TestDb, test_db};
use serde_json::{Value, json};

use crate::support::{KillOnDrop, Ran};

const BIN: &str = env!("CARGO_BIN_EXE_shopfloor");

pub(crate) const SHIP: &str = include_str!("../../../tests/workflows/ship_after_approval.yaml");
pub(crate) const QUICK: &str = include_str!("../../../tests/workflows/quick_build_and_comment.yaml");
const GATED: &str = include_str!("../../../tests/workflows/gated_build.yaml");

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/workflows").join(name)
}

/// `shopfloor serve` on a test database, an org `acme` with a project `web`, and its owner's
/// token.
pub(crate) struct Server {
    db: TestDb,
    child: KillOnDrop,
    base: String,
    pub token: String,
    home: tempfile::TempDir,
    http: reqwest::Client,
}

impl Server {
    pub(crate) async fn start() -> Server {
        Server::start_with(&["--test-executor"]).await
    }

    /// As `start`, with crew steps left to hosts (no test executor).
    async fn for_hosts() -> Server {
        Server::start_with(&[]).await
    }

    async fn start_with(flags: &[&str]) -> Server {
        let db = test_db().await;
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(BIN)
            .arg("serve")
            .args(flags)
            .args(["--log", "warn"])
            .env("DATABASE_URL", &db.url)
            .env("SHOPFLOOR_SECRET_KEY", engine::testkit::SECRET_KEY)
            .env("SHOPFLOOR_LISTEN", format!("127.0.0.1:{port}"))
            .env("SHOPFLOOR_DRAIN_SECS", "2")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map(KillOnDrop)
            .expect("spawn shopfloor serve");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if http.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status() == 200) {
                break;
            }
            assert!(Instant::now() < deadline, "shopfloor serve was not ready within 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let admin = |args: &[&str]| {
            let out = Command::new(BIN)
                .args(args)
                .env("DATABASE_URL", &db.url)
                .env("SHOPFLOOR_SECRET_KEY", engine::testkit::SECRET_KEY)
                .env("SHOPFLOOR_LOG", "warn")
                .output()
                .unwrap();
            assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8(out.stdout).unwrap()
        };
        let token = admin(&["admin", "create-org", "--slug", "acme", "--owner-email", "owner@acme.test"]).trim().to_owned();
        admin(&["admin", "create-project", "--org", "acme", "--slug", "web"]);
        let home = tempfile::tempdir().unwrap();
        Server { db, child, base, token, home, http }
    }

    /// The command as a user with no settings but a home of their own.
    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args).env("HOME", self.home.path()).env("XDG_CONFIG_HOME", self.home.path().join("config")).env("SHOPFLOOR_LOG", "warn");
        for var in ["SHOPFLOOR_SERVER", "SHOPFLOOR_TOKEN", "SHOPFLOOR_ORG", "SHOPFLOOR_PROJECT", "SHOPFLOOR_CONFIG", "NO_COLOR", "DATABASE_URL"] {
            cmd.env_remove(var);
        }
        cmd
    }

    pub(crate) fn output(mut cmd: Command, stdin: Option<&str>) -> Ran {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).unwrap();
        }
        drop(input);
        let Output { status, stdout, stderr } = child.wait_with_output().unwrap();
        Ran { code: status.code().unwrap_or(-1), stdout: String::from_utf8(stdout).unwrap(), stderr: String::from_utf8(stderr).unwrap() }
    }

    /// Runs a command with the settings of the user's config file only.
    fn plain(&self, args: &[&str], stdin: Option<&str>) -> Ran {
        Server::output(self.command(args), stdin)
    }

    /// Runs a command with the server, token, org and project from the environment.
    pub(crate) fn cli(&self, args: &[&str]) -> Ran {
        Server::output(self.with_env(self.command(args)), None)
    }

    pub(crate) fn with_env(&self, mut cmd: Command) -> Command {
        cmd.env("SHOPFLOOR_SERVER", &self.base).env("SHOPFLOOR_TOKEN", &self.token).env("SHOPFLOOR_ORG", "acme").env("SHOPFLOOR_PROJECT", "web");
        cmd
    }

    /// The API's answer to a GET, as bytes.
    pub(crate) async fn api_bytes(&self, path: &str) -> String {
        let resp = self.http.get(format!("{}{path}", self.base)).bearer_auth(&self.token).send().await.unwrap();
        assert!(resp.status().is_success(), "GET {path}: {}", resp.status());
        resp.text().await.unwrap()
    }

    /// `method path` as `token` with a JSON `body`: the status and the answer's JSON (null if
    /// it has none).
    pub(crate) async fn send(&self, method: reqwest::Method, path: &str, token: &str, body: &Value) -> (reqwest::StatusCode, Value) {
        let resp = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(token).json(body).send().await.unwrap();
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub(crate) async fn api(&self, path: &str) -> Value {
        serde_json::from_str(&self.api_bytes(path).await).unwrap()
    }

    pub(crate) async fn run(&self, id: &str) -> Value {
        self.api(&format!("/api/v1/orgs/acme/projects/web/runs/{id}")).await
    }

    /// Waits until the run satisfies `pred` (the test reads; nothing in the product polls).
    pub(crate) async fn until(&self, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let run = self.run(id).await;
            if pred(&run) {
                return run;
            }
            assert!(Instant::now() < deadline, "{id} never reached {what}: {run}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.home.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Writes `source` to the file `name` and pushes it with `workflows push`.
    pub(crate) fn push(&self, name: &str, source: &str) {
        let path = self.write(name, source);
        self.cli(&["workflows", "push", path.to_str().unwrap()]).ok();
    }

    /// Stops the server (SIGTERM, then its drain), then checks and drops the database.
    pub(crate) async fn finish(mut self) {
        // SAFETY: signalling our own child by its pid.
        unsafe {
            libc::kill(self.child.0.id() as libc::pid_t, libc::SIGTERM);
        }
        let _ = self.child.0.wait();
        self.db.finish().await;
    }
}

fn is_waiting(run: &Value) -> bool {
    run["approvals"].as_array().is_some_and(|a| !a.is_empty())
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread")]
async fn login_stores_the_server_and_token_privately_and_context_switches_projects() {
    let s = Server::start().await;
    // Nothing configured: a usage mistake, exit 2.
    s.plain(&["runs", "list"], None).fails(2, "no server: run `shopfloor login --server URL`");
    // A token only on standard input when asked for; not a terminal here.
    s.plain(&["login", "--server", &s.base, "--org", "acme"], None).fails(2, "--token-stdin");
    // A token the server refuses: its problem, on one line, exit 1.
    s.plain(&["login", "--server", &s.base, "--org", "acme", "--token-stdin"], Some("a.b.c")).fails(1, "error: Unauthorized: ");
    // Another org's slug is not found (its existence is not revealed).
    s.plain(&["login", "--server", &s.base, "--org", "other", "--token-stdin"], Some(&s.token)).fails(1, "error: Not found: org `other` not found");

    let ran = s.plain(&["login", "--server", &s.base, "--org", "acme", "--token-stdin"], Some(&format!("{}\n", s.token))).ok();
    assert_eq!(ran.stdout.trim(), format!("Logged in to {} in org acme (role owner); project web.", s.base));
    let file = s.home.path().join("config/shopfloor/config.json");
    assert_eq!(mode(&file), 0o600, "the token's file is private");
    assert_eq!(mode(file.parent().unwrap()), 0o700);
    let stored: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(stored, json!({ "server": s.base, "token": s.token, "org": "acme", "project": "web" }));

    let ran = s.plain(&["context"], None).ok();
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert!(lines[0].starts_with("server   ") && lines[0].contains(&s.base) && lines[0].ends_with("(config file)"), "{}", ran.stdout);
    assert!(lines[1].starts_with("org      acme") && lines[1].ends_with("(config file)"), "{}", ran.stdout);
    assert!(lines[2].starts_with("project  web") && lines[2].ends_with("(config file)"), "{}", ran.stdout);
    // The environment wins over the file, and says so.
    let ran = Server::output(
        {
            let mut c = s.command(&["context", "--json"]);
            c.env("SHOPFLOOR_PROJECT", "ops");
            c
        },
        None,
    )
    .ok();
    let shown: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(shown["project"], "ops");
    assert_eq!(shown["org"], "acme");

    // Switching to a project the server does not know is refused, and nothing changes.
    s.plain(&["context", "--project", "ops"], None).fails(1, "error: Not found: project `ops` not found");
    let out = Command::new(BIN)
        .args(["admin", "create-project", "--org", "acme", "--slug", "ops"])
        .env("DATABASE_URL", &s.db.url)
        .env("SHOPFLOOR_LOG", "warn")
        .output()
        .unwrap();
    assert!(out.status.success());
    let ran = s.plain(&["context", "--project", "ops"], None).ok();
    assert_eq!(ran.stdout.trim(), "Now using org acme, project ops.");
    let stored: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(stored["project"], "ops");
    assert_eq!(mode(&file), 0o600);
    // Commands now go to `ops`: its workflow list is its own (empty), and a flag overrides.
    let ran = s.plain(&["workflows", "list", "--json"], None).ok();
    assert_eq!(ran.stdout.trim(), s.api_bytes("/api/v1/orgs/acme/projects/ops/workflows").await);

    // Usage mistakes clap finds exit 2 too.
    assert_eq!(s.plain(&["runs", "show"], None).code, 2);
    s.plain(&["runs", "submit", "ship", "--input", "novalue"], None).fails(2, "--input takes name=value");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn workflows_are_validated_pushed_listed_and_paused_on_the_server() {
    let s = Server::start().await;
    let broken = fixture("broken-edges.yaml");
    let good = fixture("issue-to-pr.yaml");

    // The server's validation prints what the offline lint prints.
    let offline = Server::output(s.command(&["validate", broken.to_str().unwrap()]), None);
    let ran = s.cli(&["workflows", "validate", broken.to_str().unwrap()]);
    assert_eq!(ran.code, 1);
    assert_eq!(ran.stdout, offline.stdout);
    assert!(ran.stdout.contains(&format!("{}:7:19: nodes.build.after: there is no node `desing`", broken.display())), "{}", ran.stdout);
    let ran = s.cli(&["workflows", "validate", good.to_str().unwrap()]).ok();
    assert_eq!(ran.stdout.trim(), format!("{}: valid (issue-to-pr)", good.display()));
    // Offline, each valid file says so; a broken one prints its problems as before.
    let ran = Server::output(s.command(&["validate", good.to_str().unwrap(), broken.to_str().unwrap()]), None);
    assert_eq!(ran.code, 1);
    assert_eq!(ran.stdout, format!("ok {}\n{}", good.display(), offline.stdout));
    let ran = Server::output(s.command(&["validate", good.to_str().unwrap()]), None).ok();
    assert_eq!(ran.stdout, format!("ok {}\n", good.display()));

    // An invalid push is refused with every problem; nothing is stored.
    let ran = s.cli(&["workflows", "push", broken.to_str().unwrap()]);
    assert_eq!(ran.code, 1);
    assert_eq!(ran.stdout, offline.stdout);
    assert!(ran.stderr.starts_with("error: Invalid workflow: the workflow does not validate"), "{}", ran.stderr);
    assert_eq!(s.api("/api/v1/orgs/acme/projects/web/workflows").await["items"], json!([]));

    assert_eq!(s.cli(&["workflows", "push", good.to_str().unwrap()]).ok().stdout.trim(), "issue-to-pr version 1 uploaded");
    assert_eq!(s.cli(&["workflows", "push", good.to_str().unwrap()]).ok().stdout.trim(), "issue-to-pr version 1 unchanged");
    let ship = s.write("ship.yaml", SHIP);
    assert_eq!(s.cli(&["workflows", "push", ship.to_str().unwrap()]).ok().stdout.trim(), "ship version 1 uploaded");

    let ran = s.cli(&["workflows", "list"]).ok();
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", ran.stdout);
    assert!(lines[0].starts_with("NAME") && lines[0].contains("VERSION") && lines[0].contains("STATE"));
    assert!(!ran.stdout.contains('\x1b'), "no colour into a pipe");
    assert!(lines.iter().any(|l| l.starts_with("issue-to-pr  1        active")), "{}", ran.stdout);
    let ran = s.cli(&["workflows", "list", "--json"]).ok();
    assert_eq!(ran.stdout.trim_end(), s.api_bytes("/api/v1/orgs/acme/projects/web/workflows").await);

    assert_eq!(s.cli(&["workflows", "pause", "ship"]).ok().stdout.trim(), "ship paused: new runs are held");
    assert_eq!(s.api("/api/v1/orgs/acme/projects/web/workflows/ship").await["paused"], true);
    assert!(s.cli(&["workflows", "list"]).ok().stdout.lines().any(|l| l.starts_with("ship") && l.contains("paused")));
    assert_eq!(s.cli(&["workflows", "unpause", "ship"]).ok().stdout.trim(), "ship active");
    assert_eq!(s.api("/api/v1/orgs/acme/projects/web/workflows/ship").await["paused"], false);
    s.cli(&["workflows", "pause", "nope"]).fails(1, "error: Not found: ");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_are_submitted_shown_answered_rejected_cancelled_retried_and_rerun() {
    let s = Server::start().await;
    s.push("ship.yaml", SHIP);

    // Submit: the id alone on standard output, input typed from name=value.
    let ran = s.cli(&["runs", "submit", "ship", "--input", "n=5", "--input", "who=me", "--input", r#"deep={"a":[1]}"#]).ok();
    let run1 = ran.stdout.trim().to_owned();
    assert!(run1.starts_with("run-") && !run1.contains(char::is_whitespace), "{}", ran.stdout);
    assert!(ran.stderr.contains("submitted ship v1"), "{}", ran.stderr);
    let got = s.until(&run1, "its approval", is_waiting).await;
    assert_eq!(got["input"], json!({ "n": 5, "who": "me", "deep": { "a": [1] } }));

    let ran = s.cli(&["runs", "show", &run1]).ok();
    assert!(ran.stdout.starts_with(&format!("{run1}  acme:web:{run1}\n")), "{}", ran.stdout);
    for want in [
        "workflow  ship v1",
        "status    running: waiting for approval",
        "Waiting for approval at ask: Ship it?",
        "field ticket (string, required)",
        "field size (choice: small|large, default small)",
        &format!("answer with: shopfloor approve {run1} ask"),
    ] {
        assert!(ran.stdout.contains(want), "`{want}` in:\n{}", ran.stdout);
    }
    assert!(ran.stdout.lines().any(|l| l.starts_with("build") && l.contains("crew") && l.contains("succeeded")), "{}", ran.stdout);
    assert_eq!(s.cli(&["runs", "show", &run1, "--json"]).ok().stdout.trim_end(), s.api_bytes(&format!("/api/v1/orgs/acme/projects/web/runs/{run1}")).await);
    // The full name also works, and names the org and project.
    let ran = s.cli(&["runs", "why", &format!("acme:web:{run1}")]).ok();
    assert!(ran.stdout.starts_with("Waiting for approval at ask: Ship it?"), "{}", ran.stdout);

    let ran = s.cli(&["runs", "list"]).ok();
    assert!(ran.stdout.lines().next().unwrap().starts_with("RUN"), "{}", ran.stdout);
    assert!(ran.stdout.lines().any(|l| l.starts_with(&run1) && l.contains("ship v1") && l.contains("waiting for approval")), "{}", ran.stdout);
    assert_eq!(s.cli(&["runs", "list", "--json"]).ok().stdout.trim_end(), s.api_bytes("/api/v1/orgs/acme/projects/web/runs").await);
    assert_eq!(
        s.cli(&["runs", "list", "--json", "--status", "completed", "--limit", "5"]).ok().stdout.trim_end(),
        s.api_bytes("/api/v1/orgs/acme/projects/web/runs?status=completed&limit=5").await
    );
    s.cli(&["runs", "list", "--status", "sideways"]).fails(1, "error: Bad request: status must be");

    // Approve: a missing required field is refused by the server and the run keeps waiting.
    s.cli(&["approve", &run1, "--no-prompt"]).fails(1, "error: Unprocessable request: approval field \"ticket\" is required");
    assert!(is_waiting(&s.run(&run1).await));
    s.cli(&["approve", &run1, "--field", "size=huge"]).fails(2, "size must be one of small, large");
    // Standard input is not a terminal: nothing is asked, the default fills `size`.
    let ran = s.cli(&["approve", &run1, "--field", "ticket=T-1"]).ok();
    assert_eq!(ran.stdout.trim(), format!("approved ask on {run1} with size=small, ticket=T-1"));
    let done = s.until(&run1, "completed", |r| r["status"] == "completed").await;
    let ask = done["steps"].as_array().unwrap().iter().find(|st| st["node"] == "ask").unwrap();
    assert_eq!(ask["output"], json!({ "ticket": "T-1", "size": "small" }));
    s.cli(&["approve", &run1]).fails(1, &format!("error: Conflict: {run1} waits on no approval"));
    assert!(s.cli(&["runs", "why", &run1]).ok().stdout.starts_with("Finished: completed"));

    // Reject: the run is cancelled with the reason.
    let run2 = s.cli(&["runs", "submit", "ship"]).ok().stdout.trim().to_owned();
    s.until(&run2, "its approval", is_waiting).await;
    let ran = s.cli(&["reject", &run2, "ask", "--reason", "too big"]).ok();
    assert_eq!(ran.stdout.trim(), format!("rejected ask on {run2}: the run is cancelled"));
    let got = s.until(&run2, "cancelled", |r| r["status"] == "cancelled").await;
    assert_eq!(got["reason"], "rejected at ask: too big");
    // The reason may be left out, as the API allows.
    let run2b = s.cli(&["runs", "submit", "ship"]).ok().stdout.trim().to_owned();
    s.until(&run2b, "its approval", is_waiting).await;
    let ran = s.cli(&["reject", &run2b]).ok();
    assert_eq!(ran.stdout.trim(), format!("rejected ask on {run2b}: the run is cancelled"));
    let got = s.until(&run2b, "cancelled", |r| r["status"] == "cancelled").await;
    assert_eq!(got["reason"], "rejected at ask: no reason given");

    // Cancel, then retry and rerun: new runs that name their source.
    let run3 = s.cli(&["runs", "submit", "ship"]).ok().stdout.trim().to_owned();
    s.until(&run3, "its approval", is_waiting).await;
    let ran = s.cli(&["runs", "cancel", &run3, "--reason", "not today"]).ok();
    assert_eq!(ran.stdout.trim(), format!("{run3} cancelled (cancelled: not today)"));
    s.cli(&["runs", "cancel", &run3]).fails(1, "error: Conflict: ");
    // Text from the server never acts on the terminal: an escape sequence in a reason is
    // shown as its escape.
    let run8 = s.cli(&["runs", "submit", "ship"]).ok().stdout.trim().to_owned();
    s.until(&run8, "its approval", is_waiting).await;
    let ran = s.cli(&["runs", "cancel", &run8, "--reason", "\u{1b}[2J\u{1b}]0;pwned\u{7}gone"]).ok();
    assert!(!ran.stdout.contains('\u{1b}') && !ran.stdout.contains('\u{7}'), "{:?}", ran.stdout);
    assert!(ran.stdout.contains("\\u{1b}[2J"), "{:?}", ran.stdout);
    let shown = s.cli(&["runs", "show", &run8]).ok();
    assert!(!shown.stdout.contains('\u{1b}') && shown.stdout.contains("gone"), "{:?}", shown.stdout);
    let ran = s.cli(&["runs", "retry", &run3]).ok();
    let run4 = ran.stdout.trim().to_owned();
    assert!(run4.starts_with("run-") && run4 != run3);
    assert!(ran.stderr.contains(&format!("retry of {run3}: {run4}")), "{}", ran.stderr);
    assert_eq!(s.run(&run4).await["source_run"], run3);
    s.cli(&["runs", "retry", &run1]).fails(1, "error: Conflict: the run completed");
    // Edit-and-retry: the node runs again with the prompt given.
    let ran = s.cli(&["runs", "retry", &run2, "--node", "build", "--prompt", "build it again"]).ok();
    let run7 = ran.stdout.trim().to_owned();
    assert!(ran.stderr.contains(&format!("retry of {run2} with build edited: {run7}")), "{}", ran.stderr);
    let edited = |r: &Value| r["steps"].as_array().is_some_and(|st| st.iter().any(|x| x["node"] == "build" && x["output"]["edited"] == true));
    let got = s.until(&run7, "the edited build", edited).await;
    let build = got["steps"].as_array().unwrap().iter().find(|x| x["node"] == "build").unwrap();
    assert_eq!(build["output"]["prompt"], "build it again");
    s.cli(&["runs", "retry", &run2, "--prompt", "x"]).fails(2, "name it with --node");
    // Several edits at once, as the console's form takes them.
    let ran = s.cli(&["runs", "retry", &run2, "--node", "build", "--prompt", "once more", "--model", "claude-opus-4-5"]).ok();
    assert!(ran.stderr.contains("with build edited"), "{}", ran.stderr);
    let run5 = s.cli(&["runs", "rerun", &run1, "--from", "ask"]).ok().stdout.trim().to_owned();
    let got = s.until(&run5, "its approval", is_waiting).await;
    assert_eq!(got["source_run"], run1);
    assert_eq!(got["source_from"], "ask");
    assert_eq!(got["input"], json!({ "n": 5, "who": "me", "deep": { "a": [1] } }));
    let run6 = s.cli(&["runs", "rerun", &run2, "--json"]).ok();
    let run6: Value = serde_json::from_str(&run6.stdout).unwrap();
    assert_eq!(run6["source_run"], run2);
    s.cli(&["runs", "show", "run-aaaaaaaaaaaaaaaaaaaaaaaaaa"]).fails(1, "error: Not found: run not found");

    // `runs follow` without a terminal: the journal, then the ending, and the exit code says it.
    let ran = s.cli(&["runs", "follow", &run1]).ok();
    assert!(ran.stdout.contains("ask              waiting for approval: Ship it?"), "{}", ran.stdout);
    assert!(ran.stdout.trim_end().ends_with(&format!("{run1} · ship v1 · completed")), "{}", ran.stdout);
    let ran = s.cli(&["runs", "follow", &run2]);
    assert_eq!(ran.code, 1);
    assert!(ran.stdout.trim_end().ends_with("cancelled: rejected at ask: too big"), "{}", ran.stdout);
    // With --json: the run's events as the API gives them, one a line.
    let ran = s.cli(&["runs", "follow", &run1, "--json"]).ok();
    let events: Vec<Value> = ran.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let api: Value = s.api(&format!("/api/v1/orgs/acme/projects/web/runs/{run1}/events?limit=200")).await;
    assert_eq!(Value::Array(events), api["items"]);

    // The audit log saw it all.
    let ran = s.cli(&["audit", "list", "--action", "run.*"]).ok();
    assert!(ran.stdout.lines().next().unwrap().starts_with("AT"), "{}", ran.stdout);
    assert!(ran.stdout.contains("run.submit"), "{}", ran.stdout);
    assert_eq!(
        s.cli(&["audit", "list", "--json", "--action", "run.*"]).ok().stdout.trim_end(),
        s.api_bytes("/api/v1/orgs/acme/projects/web/audit?action=run.*").await
    );
    assert_eq!(s.cli(&["audit", "list", "--json", "--org-wide"]).ok().stdout.trim_end(), s.api_bytes("/api/v1/orgs/acme/audit").await);

    for run in [&run4, &run5, run6["id"].as_str().unwrap()] {
        s.until(run, "its approval", is_waiting).await;
        s.cli(&["runs", "cancel", run]).ok();
    }
    s.finish().await;
}

/// `runs say`: the message goes to the run's one running crew step (or `--step`), and the
/// host that holds it finds it in its heartbeat's answer; a run with no live session is a
/// refusal, and one with several asks for `--step`.
#[tokio::test(flavor = "multi_thread")]
async fn runs_say_sends_a_message_to_the_running_crew_session() {
    let s = Server::for_hosts().await;
    let pair = "name: pair\nnodes:\n  left:\n    crew: { harness: claude-code, prompt: left }\n  right:\n    crew: { harness: claude-code, prompt: right }\n";
    s.push("pair.yaml", pair);
    let run = s.cli(&["runs", "submit", "pair"]).ok().stdout.trim().to_owned();
    s.until(&run, "two ready crew steps", |r| r["steps"].as_array().is_some_and(|st| st.iter().filter(|x| x["state"] == "pending").count() == 2)).await;

    // Nothing runs yet: no session to tell.
    s.cli(&["runs", "say", &run, "hello"]).fails(1, "has no running crew step");

    // A host (played here over the host protocol) claims and starts both.
    let (http, base) = (s.http.clone(), s.base.clone());
    let post = |path: String, token: String, body: Value| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let resp = http.post(format!("{base}{path}")).bearer_auth(token).json(&body).send().await.unwrap();
            assert!(resp.status().is_success(), "{path}: {}", resp.status());
            resp.json::<Value>().await.unwrap()
        }
    };
    let reg = post("/api/v1/orgs/acme/projects/web/host-registrations".into(), s.token.clone(), json!({ "name": "box" })).await;
    let cred = post(
        "/api/v1/host/register".into(),
        reg["token"].as_str().unwrap().into(),
        json!({ "name": "box", "capabilities": ["harness:claude-code"], "max_concurrent": 2 }),
    )
    .await;
    let host = cred["token"].as_str().unwrap().to_owned();
    let claimed = post("/api/v1/host/claim".into(), host.clone(), json!({ "max": 2, "wait_secs": 10 })).await;
    let steps: Vec<String> = claimed["assignments"].as_array().unwrap().iter().map(|a| a["step"].as_str().unwrap().to_owned()).collect();
    assert_eq!(steps.len(), 2, "{claimed}");
    for step in &steps {
        post(format!("/api/v1/host/steps/{step}/start"), host.clone(), json!({ "harness": "claude-code" })).await;
    }

    // Two live sessions: which one?
    s.cli(&["runs", "say", &run, "hello"]).fails(2, "pick one with --step");
    let ran = s.cli(&["runs", "say", &run, "--step", &steps[1], "Prefer the blue widget."]).ok();
    let id = ran.stdout.trim().to_owned();
    assert_eq!(id.len(), 36, "the message's id alone on standard output: {}", ran.stdout);
    let beat = post(format!("/api/v1/host/steps/{}/heartbeat", steps[1]), host.clone(), json!({})).await;
    assert_eq!(beat["messages"], json!([{ "id": id, "text": "Prefer the blue widget." }]), "{beat}");

    // One left running: `say` finds it by itself.
    post(format!("/api/v1/host/steps/{}/complete", steps[1]), host.clone(), json!({ "outcome": "succeeded" })).await;
    let ran = s.cli(&["runs", "say", &run, "--json", "Now the left one."]).ok();
    let sent: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(sent["step"], steps[0].as_str());
    post(format!("/api/v1/host/steps/{}/complete", steps[0]), host.clone(), json!({ "outcome": "succeeded" })).await;
    s.until(&run, "completed", |r| r["status"] == "completed").await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_hosts_and_budgets() {
    let s = Server::start().await;
    let ran = s.cli(&["tokens", "create", "--name", "ci", "--role", "member"]).ok();
    let ci = ran.stdout.trim().to_owned();
    assert_eq!(ran.stdout.lines().count(), 1);
    assert_eq!(ci.split('.').count(), 3, "a JWT alone on standard output: {}", ran.stdout);
    assert!(ran.stderr.contains("shown this once"), "{}", ran.stderr);

    // A role that is none: the roles, on one line, and nothing is made.
    let ran = s
        .cli(&["tokens", "create", "--name", "root", "--role", "superuser"])
        .fails(2, "error: --role `superuser` is not a role: give one of viewer, member, admin, owner");
    assert_eq!(ran.stdout, "");

    let ran = s.cli(&["tokens", "list"]).ok();
    assert!(!ran.stdout.contains("root"), "{}", ran.stdout);
    assert!(ran.stdout.lines().any(|l| l.contains("  ci  ") && l.contains("member") && l.ends_with("active")), "{}", ran.stdout);
    let listed = s.cli(&["tokens", "list", "--json"]).ok();
    assert_eq!(listed.stdout.trim_end(), s.api_bytes("/api/v1/orgs/acme/tokens").await);
    let listed: Value = serde_json::from_str(&listed.stdout).unwrap();
    let id = listed["items"].as_array().unwrap().iter().find(|t| t["name"] == "ci").unwrap()["id"].as_str().unwrap().to_owned();

    // The new token works, as a member.
    let as_ci = |args: &[&str]| {
        let mut c = s.with_env(s.command(args));
        c.env("SHOPFLOOR_TOKEN", &ci);
        Server::output(c, None)
    };
    as_ci(&["workflows", "list"]).ok();
    as_ci(&["audit", "list"]).fails(1, "error: Forbidden: this needs the admin role");

    assert_eq!(s.cli(&["tokens", "revoke", &id]).ok().stdout.trim(), format!("revoked {id}"));
    assert!(s.cli(&["tokens", "list"]).ok().stdout.lines().any(|l| l.contains("  ci  ") && l.contains("revoked")));
    as_ci(&["workflows", "list"]).fails(1, "error: Unauthorized: ");

    let ran = s.cli(&["hosts", "list"]).ok();
    assert_eq!(ran.stdout, "");
    assert_eq!(ran.stderr.trim(), "no hosts");
    // A host registers with a registration token, as `shopfloor host` does.
    let reg = host_post(&s, "/api/v1/orgs/acme/projects/web/host-registrations", &s.token, json!({ "name": "box" })).await;
    let host = json!({ "name": "box-1", "capabilities": ["linux", "harness:command"], "max_concurrent": 2 });
    let (status, _) = s.send(reqwest::Method::POST, "/api/v1/host/register", reg["token"].as_str().unwrap(), &host).await;
    assert_eq!(status, 201);
    let ran = s.cli(&["hosts", "list"]).ok();
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert!(lines[0].starts_with("NAME") && lines[0].contains("CAPABILITIES"), "{}", ran.stdout);
    assert!(lines[1].starts_with("box-1  ") && lines[1].contains("harness:command,linux") && lines[1].contains("  2  "), "{}", ran.stdout);
    assert_eq!(s.cli(&["hosts", "list", "--json"]).ok().stdout.trim_end(), s.api_bytes("/api/v1/orgs/acme/projects/web/hosts").await);
    assert_eq!(
        s.cli(&["hosts", "list", "--all", "--json"]).ok().stdout.trim_end(),
        s.api_bytes("/api/v1/orgs/acme/projects/web/hosts?include_deregistered=true").await
    );
    // Drained through the CLI: the API's host says so, the list shows it, undrain lifts it.
    let id = s.api("/api/v1/orgs/acme/projects/web/hosts").await["items"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(s.cli(&["hosts", "drain", &id]).ok().stdout.trim(), "box-1 drained: it claims nothing new");
    assert!(s.api("/api/v1/orgs/acme/projects/web/hosts").await["items"][0]["drained_at"].is_string());
    assert!(s.cli(&["hosts", "list"]).ok().stdout.contains("(drained "));
    assert_eq!(s.cli(&["hosts", "undrain", &id]).ok().stdout.trim(), "box-1 claims again");
    assert!(s.api("/api/v1/orgs/acme/projects/web/hosts").await["items"][0]["drained_at"].is_null());
    // By its name, as `hosts list` shows it.
    assert_eq!(s.cli(&["hosts", "drain", "box-1"]).ok().stdout.trim(), "box-1 drained: it claims nothing new");
    assert!(s.api("/api/v1/orgs/acme/projects/web/hosts").await["items"][0]["drained_at"].is_string());
    assert_eq!(s.cli(&["hosts", "undrain", "box-1"]).ok().stdout.trim(), "box-1 claims again");
    assert!(s.api("/api/v1/orgs/acme/projects/web/hosts").await["items"][0]["drained_at"].is_null());
    s.cli(&["hosts", "drain", "host-nope"]).fails(1, "error: no host named `host-nope` in acme/web: `shopfloor hosts list` shows their names and ids");
    s.cli(&["hosts", "undrain", "host-nope"]).fails(1, "error: no host named `host-nope`");
    s.cli(&["hosts", "drain", "00000000-0000-0000-0000-000000000000"]).fails(1, "error: Not found: host not found");
    // Two hosts of one name: which one?
    let reg = host_post(&s, "/api/v1/orgs/acme/projects/web/host-registrations", &s.token, json!({})).await;
    let host = json!({ "name": "box-1", "capabilities": ["linux"], "max_concurrent": 1 });
    let (status, _) = s.send(reqwest::Method::POST, "/api/v1/host/register", reg["token"].as_str().unwrap(), &host).await;
    assert_eq!(status, 201);
    s.cli(&["hosts", "drain", "box-1"]).fails(2, "2 hosts are named `box-1`: give one's id (");

    // Budgets: shown when the server has the route, else said plainly.
    let doc = s.api("/api/v1/openapi.json").await;
    if doc["paths"].as_object().unwrap().keys().any(|p| p.ends_with("/projects/{project}/budgets")) {
        let ran = s.cli(&["budgets", "show"]).ok();
        assert_eq!(ran.stderr.trim(), "no budgets");
        let limit = json!({ "usd_limit": 5, "hard": true });
        let (status, set) = s.send(reqwest::Method::PUT, "/api/v1/orgs/acme/projects/web/budgets/day", &s.token, &limit).await;
        assert!(status.is_success(), "{status} {set}");
        let ran = s.cli(&["budgets", "show"]).ok();
        assert!(ran.stdout.lines().next().unwrap().starts_with("SCOPE"), "{}", ran.stdout);
        assert!(ran.stdout.lines().any(|l| l.starts_with("project web  day") && l.contains("$5.00  $0.00  hard")), "{}", ran.stdout);
        assert_eq!(s.cli(&["budgets", "show", "--json"]).ok().stdout.trim_end(), s.api_bytes("/api/v1/orgs/acme/projects/web/budgets").await);
        assert_eq!(s.cli(&["budgets", "show", "--json", "--org-wide"]).ok().stdout.trim_end(), s.api_bytes("/api/v1/orgs/acme/budgets").await);
    } else {
        s.cli(&["budgets", "show"]).fails(1, "`shopfloor budgets show` is not built yet");
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_list_watch_prints_each_change_from_the_event_stream() {
    let s = Server::start().await;
    s.push("quick.yaml", QUICK);
    let first = s.cli(&["runs", "submit", "quick"]).ok().stdout.trim().to_owned();
    s.until(&first, "completed", |r| r["status"] == "completed").await;
    let mut watch =
        KillOnDrop(s.with_env(s.command(&["runs", "list", "--watch", "--workflow", "quick"])).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap());
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let out = watch.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    // The stream is open before the list is read: once the table shows, nothing is missed.
    let header = rx.recv_timeout(Duration::from_secs(30)).expect("the table");
    assert!(header.starts_with("RUN"), "{header}");
    let row = rx.recv_timeout(Duration::from_secs(30)).expect("the first run's row");
    assert!(row.starts_with(&first) && row.contains("completed"), "{row}");
    let run = s.cli(&["runs", "submit", "quick", "--input", r#"test={"step_ms":300}"#]).ok().stdout.trim().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.starts_with(&run) && l.contains("completed")) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => seen.push(l),
            Err(_) => panic!("the watch never showed {run} completed; it printed: {seen:#?}"),
        }
    }
    assert!(seen.iter().any(|l| l.starts_with(&run) && l.contains("running")), "{seen:#?}");
    drop(watch);
    s.until(&run, "completed", |r| r["status"] == "completed").await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_follow_in_a_terminal_answers_the_approval_with_a_and_sees_the_run_complete() {
    use expectrl::session::OsSession;
    use expectrl::{Eof, Expect as _, Session};

    let s = Server::start().await;
    s.push("ship.yaml", SHIP);
    // The crew step takes a while, so the follower sees it run and its transcript.
    let run = s.cli(&["runs", "submit", "ship", "--input", r#"test={"step_ms":{"build":4000}}"#]).ok().stdout.trim().to_owned();

    // What a host's session report stores while the step runs (the test executor logs nothing).
    let got =
        s.until(&run, "build running", |r| r["steps"].as_array().is_some_and(|st| st.iter().any(|x| x["node"] == "build" && x["state"] == "running"))).await;
    let step_id: engine::ids::StepId = got["steps"][0]["id"].as_str().unwrap().parse().unwrap();
    sqlx::query(
        "INSERT INTO step_logs (org_id, run_id, run_created_at, step_id, seq, stream, line) \
         SELECT org_id, run_id, (SELECT created_at FROM runs r WHERE r.run_id = steps.run_id), step_id, l.seq, 'stdout', l.line FROM steps, (VALUES (1::bigint, 'compiling widgets'), (2, 'all tests pass')) AS l(seq, line) \
         WHERE step_id = $1",
    )
    .bind(step_id)
    .execute(&s.db.pool)
    .await
    .unwrap();
    let cmd = s.with_env(s.command(&["runs", "follow", &run]));
    let term = tokio::task::spawn_blocking(move || {
        let mut p = Session::spawn(cmd).expect("spawn in a pseudo-terminal");
        p.set_expect_timeout(Some(Duration::from_secs(30)));
        let mut screen = String::new();
        let mut expect = |p: &mut OsSession, text: &str| {
            let found = p.expect(text).unwrap_or_else(|e| panic!("`{text}` never showed ({e}); the screen so far:\n{screen}"));
            screen.push_str(&String::from_utf8_lossy(found.before()));
            screen.push_str(text);
        };
        expect(&mut p, "ship v1");
        expect(&mut p, "build");
        expect(&mut p, "running");
        // The crew step's transcript shows while it runs.
        expect(&mut p, "compiling widgets");
        expect(&mut p, "all tests pass");
        expect(&mut p, "succeeded");
        expect(&mut p, "waiting for approval");
        expect(&mut p, "press a to answer");
        p.send("a").unwrap();
        expect(&mut p, "size (choice: small|large, default small): ");
        p.send("\r").unwrap();
        expect(&mut p, "ticket (string, required): ");
        // An empty answer to a required field is asked again.
        p.send("\r").unwrap();
        expect(&mut p, "ticket is required");
        expect(&mut p, "ticket (string, required): ");
        p.send("T-9\r").unwrap();
        expect(&mut p, "approved");
        expect(&mut p, "ask with size=small, ticket=T-9");
        expect(&mut p, "completed");
        p.expect(Eof).expect("follow ends with the run");
        let status = p.get_process().wait().unwrap();
        (status, screen)
    });
    let term = term.await.unwrap();
    assert!(matches!(term.0, expectrl::process::unix::WaitStatus::Exited(_, 0)), "{:?}\n{}", term.0, term.1);
    // Colour on a terminal.
    assert!(term.1.contains("\x1b["), "{}", term.1);
    let got = s.until(&run, "completed", |r| r["status"] == "completed").await;
    let ask = got["steps"].as_array().unwrap().iter().find(|st| st["node"] == "ask").unwrap();
    assert_eq!(ask["output"], json!({ "ticket": "T-9", "size": "small" }));

    // `shopfloor approve` on a terminal asks each field in turn, with its type and default.
    let run = s.cli(&["runs", "submit", "ship"]).ok().stdout.trim().to_owned();
    s.until(&run, "its approval", is_waiting).await;
    let cmd = s.with_env(s.command(&["approve", &run]));
    let approved = cmd_in_pty(cmd, |p| {
        p.expect("ask: Ship it?").unwrap();
        p.expect("size (choice: small|large, default small): ").unwrap();
        p.send_line("huge").unwrap();
        p.expect("size must be one of small, large").unwrap();
        p.expect("size (choice: small|large, default small): ").unwrap();
        p.send_line("large").unwrap();
        p.expect("ticket (string, required): ").unwrap();
        p.send_line("T-7").unwrap();
        p.expect("approved ask on").unwrap();
        p.expect("with size=large, ticket=T-7").unwrap();
        p.expect(Eof).unwrap();
    });
    assert!(matches!(approved, expectrl::process::unix::WaitStatus::Exited(_, 0)), "{approved:?}");
    let got = s.until(&run, "completed", |r| r["status"] == "completed").await;
    let ask = got["steps"].as_array().unwrap().iter().find(|st| st["node"] == "ask").unwrap();
    assert_eq!(ask["output"], json!({ "ticket": "T-7", "size": "large" }));

    // `q` quits and leaves the run as it is; NO_COLOR is honoured on a terminal too.
    let run = s.cli(&["runs", "submit", "ship"]).ok().stdout.trim().to_owned();
    let mut cmd = s.with_env(s.command(&["runs", "follow", &run]));
    cmd.env("NO_COLOR", "1");
    let (quit, screen) = std::thread::spawn(move || {
        let mut p = expectrl::Session::spawn(cmd).expect("spawn in a pseudo-terminal");
        p.set_expect_timeout(Some(Duration::from_secs(30)));
        let seen = p.expect("press a to answer").unwrap();
        let screen = String::from_utf8_lossy(seen.before()).into_owned();
        p.send("q").unwrap();
        p.expect(Eof).unwrap();
        (p.get_process().wait().unwrap(), screen)
    })
    .join()
    .unwrap();
    assert!(matches!(quit, expectrl::process::unix::WaitStatus::Exited(_, 0)), "{quit:?}");
    assert!(screen.contains("waiting for approval") && !screen.contains('\x1b'), "{screen}");
    assert!(is_waiting(&s.run(&run).await));
    // `c` cancels, after a yes: the one key `y`, no Enter; any other key is a no.
    let cmd = s.with_env(s.command(&["runs", "follow", &run]));
    let question = format!("cancel {run}? [y/N] ");
    let cancelled = cmd_in_pty(cmd, move |p| {
        p.expect("press a to answer").unwrap();
        p.send("c").unwrap();
        p.expect(question.as_str()).unwrap();
        p.send("n").unwrap();
        p.expect("no").unwrap();
        p.send("c").unwrap();
        p.expect(question.as_str()).unwrap();
        p.send("y").unwrap();
        p.expect("yes").unwrap();
        p.expect("cancelled").unwrap();
        p.expect(Eof).unwrap();
    });
    assert!(matches!(cancelled, expectrl::process::unix::WaitStatus::Exited(_, 1)), "{cancelled:?}");
    assert_eq!(s.run(&run).await["status"], "cancelled");
    s.finish().await;
}

/// `runs submit` says what the API says of the new run: a run of an `approval: required`
/// workflow waits for its approval from the start, and is never shown `queued`.
#[tokio::test(flavor = "multi_thread")]
async fn runs_submit_says_a_run_waits_for_its_start_approval() {
    let s = Server::start().await;
    s.push("gated.yaml", GATED);
    let ran = s.cli(&["runs", "submit", "gated"]).ok();
    let run = ran.line().to_owned();
    assert_eq!(ran.stderr.trim(), "submitted gated v1: waiting for approval");
    assert!(!ran.stderr.contains("queued"), "{}", ran.stderr);
    let ran = s.cli(&["runs", "submit", "gated", "--json"]).ok();
    let answer: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!((answer["substate"].as_str(), answer["words"].as_str()), (Some("awaiting_signal"), Some("waiting for approval")), "{answer}");
    let second = answer["id"].as_str().unwrap().to_owned();
    // What the run says afterwards, before and after the engine opens the approval.
    let why = s.cli(&["runs", "why", &run]).ok();
    assert_eq!(why.stdout.trim(), "Waiting for approval to start: Start this run?");
    s.until(&run, "its approval", is_waiting).await;
    assert_eq!(s.run(&run).await["substate"], "awaiting_signal");
    // A run of a workflow with no such approval is queued, as the API says.
    s.push("quick.yaml", QUICK);
    let ran = s.cli(&["runs", "submit", "quick", "--json"]).ok();
    let answer: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(answer["substate"], "queued", "{answer}");
    // A dry run answers its approval at once: it does not wait.
    let ran = s.cli(&["runs", "submit", "gated", "--dry-run", "--json"]).ok();
    let answer: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(answer["substate"], "queued", "{answer}");
    let dry = answer["id"].as_str().unwrap().to_owned();
    s.until(&dry, "completed", |r| r["status"] == "completed").await;
    let quick_run = s.cli(&["runs", "list", "--json", "--workflow", "quick"]).ok();
    let quick_run: Value = serde_json::from_str(&quick_run.stdout).unwrap();
    s.until(quick_run["items"][0]["id"].as_str().unwrap(), "completed", |r| r["status"] == "completed").await;
    for run in [run, second] {
        s.until(&run, "its approval", is_waiting).await;
        s.cli(&["runs", "cancel", &run]).ok();
    }
    s.finish().await;
}

/// A POST that must succeed (a host's report over the host protocol, as the test's own host;
/// a registration for one); its answer.
pub(crate) async fn host_post(s: &Server, path: &str, token: &str, body: Value) -> Value {
    let (status, answer) = s.send(reqwest::Method::POST, path, token, &body).await;
    assert!(status.is_success(), "{path}: {status} {answer}");
    answer
}

/// The lines a running command prints on standard output, one a message.
fn lines_of(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    rx
}

/// Waits for a line that contains `text`; returns every line seen until then.
fn until_line(rx: &std::sync::mpsc::Receiver<String>, text: &str, seen: &mut Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !seen.iter().any(|l| l.contains(text)) {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) => seen.push(l),
            Err(_) => panic!("`{text}` never showed; the lines so far: {seen:#?}"),
        }
    }
}

/// `runs submit --follow` follows the run as `runs follow` does: every transcript line of a
/// crew step that starts running after the follower began, as the host reports them.
#[tokio::test(flavor = "multi_thread")]
async fn runs_submit_follow_shows_every_transcript_line_of_a_running_crew_step() {
    let s = Server::for_hosts().await;
    let solo = "name: solo\nnodes:\n  build:\n    crew: { harness: command, command: make, prompt: build it }\n";
    s.push("solo.yaml", solo);
    let reg = host_post(&s, "/api/v1/orgs/acme/projects/web/host-registrations", &s.token, json!({ "name": "box" })).await;
    let cred = host_post(
        &s,
        "/api/v1/host/register",
        reg["token"].as_str().unwrap(),
        json!({ "name": "box", "capabilities": ["harness:command"], "max_concurrent": 1 }),
    )
    .await;
    let host = cred["token"].as_str().unwrap().to_owned();

    let mut follow = KillOnDrop(s.with_env(s.command(&["runs", "submit", "solo", "--follow"])).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap());
    let rx = lines_of(&mut follow.0);
    let run = rx.recv_timeout(Duration::from_secs(30)).expect("the run's id");
    assert!(run.starts_with("run-"), "{run}");

    // The host claims the step (the claim waits until it is ready) and starts it.
    let deadline = Instant::now() + Duration::from_secs(60);
    let step = loop {
        let claimed = host_post(&s, "/api/v1/host/claim", &host, json!({ "max": 1, "wait_secs": 5 })).await;
        if let Some(a) = claimed["assignments"].as_array().and_then(|a| a.first()) {
            break a["step"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "the step was never claimed: {claimed}");
    };
    host_post(&s, &format!("/api/v1/host/steps/{step}/start"), &host, json!({ "harness": "command" })).await;
    let mut seen = Vec::new();
    until_line(&rx, "running", &mut seen);
    // Each line the session reports shows, one report after another.
    for (seq, line) in [(1, "compiling widgets"), (2, "linking widgets"), (3, "all tests pass")] {
        host_post(
            &s,
            &format!("/api/v1/host/steps/{step}/session"),
            &host,
            json!({ "harness": "command", "lines": [{ "seq": seq, "stream": "stdout", "line": line }] }),
        )
        .await;
        until_line(&rx, line, &mut seen);
    }
    host_post(&s, &format!("/api/v1/host/steps/{step}/complete"), &host, json!({ "outcome": "succeeded" })).await;
    until_line(&rx, &format!("{run} · solo v1 · completed"), &mut seen);
    let status = follow.0.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{seen:#?}");
    let transcript: Vec<&String> = seen.iter().filter(|l| l.contains("│")).collect();
    assert_eq!(transcript.len(), 3, "each line once: {seen:#?}");
    s.finish().await;
}

/// `hosts register` prints the command that starts a host with a new registration token;
/// run as printed, on a machine of its own (here a directory), the host comes online.
#[tokio::test(flavor = "multi_thread")]
async fn hosts_register_prints_the_command_that_brings_a_host_online() {
    let s = Server::for_hosts().await;
    let ran = s.cli(&["hosts", "register", "--name", "box-2", "--capabilities", "linux,harness:command"]).ok();
    let command = ran.line().to_owned();
    let prefix = format!("shopfloor host --server {} --token ", s.base);
    assert!(command.starts_with(&prefix) && command.ends_with(" --name box-2 --capabilities linux,harness:command"), "{command}");
    assert!(ran.stderr.contains("shown this once") && ran.stderr.contains("acme/web"), "{}", ran.stderr);
    // The token in it is the registration's, shown only here.
    let words: Vec<&str> = command.split_whitespace().collect();
    let token = words[5];
    assert_eq!(token.split('.').count(), 3, "{command}");
    assert!(!ran.stderr.contains(token), "{}", ran.stderr);

    let machine = tempfile::tempdir().unwrap();
    let mut host = Command::new(BIN);
    host.args(&words[1..]).current_dir(machine.path()).env("SHOPFLOOR_LOG", "warn").stdout(Stdio::null()).stderr(Stdio::inherit());
    for (var, _) in std::env::vars().filter(|(k, _)| k.starts_with("SHOPFLOOR_") || k == "DATABASE_URL") {
        host.env_remove(var);
    }
    let mut host = KillOnDrop(host.spawn().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let online = loop {
        let hosts = s.api("/api/v1/orgs/acme/projects/web/hosts").await;
        if let Some(h) = hosts["items"].as_array().and_then(|a| a.iter().find(|h| h["name"] == "box-2" && h["last_seen_at"].is_string())) {
            break h.clone();
        }
        assert!(Instant::now() < deadline, "the host never came online: {hosts}");
        assert!(matches!(host.0.try_wait(), Ok(None)), "the host exited");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(online["capabilities"], json!(["harness:command", "linux"]));
    assert!(s.cli(&["hosts", "list"]).ok().stdout.lines().any(|l| l.starts_with("box-2  ")));
    // Drained by the name it came online with.
    assert_eq!(s.cli(&["hosts", "drain", "box-2"]).ok().stdout.trim(), "box-2 drained: it claims nothing new");
    // SAFETY: signalling our own child by its pid.
    unsafe {
        libc::kill(host.0.id() as libc::pid_t, libc::SIGTERM);
    }
    let _ = host.0.wait();

    // --json: the API's answer; bad input is the server's one line.
    let ran = s.cli(&["hosts", "register", "--json"]).ok();
    let reg: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert!(reg["token"].is_string() && reg["expires_at"].is_string(), "{reg}");
    s.cli(&["hosts", "register", "--expires-in-hours", "1000"]).fails(1, "expires_in_hours must be between 1 and 168");
    s.finish().await;
}

/// Runs a command in a pseudo-terminal through `script`; returns how it exited.
fn cmd_in_pty(cmd: Command, script: impl FnOnce(&mut expectrl::session::OsSession) + Send + 'static) -> expectrl::process::unix::WaitStatus {
    std::thread::spawn(move || {
        let mut p = expectrl::Session::spawn(cmd).expect("spawn in a pseudo-terminal");
        p.set_expect_timeout(Some(Duration::from_secs(30)));
        script(&mut p);
        p.get_process().wait().unwrap()
    })
    .join()
    .unwrap()
}
