//! Helpers for end-to-end tests across real processes: the `shopfloor` binary, engine
//! processes on a test database, and waiting on the database for what they did; and
//! (`in_process`) the API and an engine in a test's own process.
//!
//! # What the tests cover
//!
//! End-to-end tests across real processes: `shopfloor engine` processes on a per-test database.
//! `github_fake/` is GitHub on loopback: an axum fake of the REST and GraphQL endpoints that
//! records requests and injects 4xx, 5xx, rate limits and delays, webhook payloads with
//! GitHub's shapes, signed with the real algorithm, and the OAuth web flow (`oauth.rs`).
//! `e2e/github_outputs.rs`, `github_gates.rs` and `github_schedule.rs` run engines as the GitHub
//! App against the fake (key: `github_fake/test_app_key.pem`, made for the tests only): a crash
//! after a pull request or a comment leaves exactly one, 4xx / 5xx / rate limit / outage, labels
//! and board moves, gates on checks, the reconciler, schedule ticks and the catch-up tick.
//! `e2e/hosts.rs` runs `shopfloor serve` and `shopfloor host` processes with a fake `claude`
//! (a script printing real-format stream-json) and local bare repositories: an issue that becomes
//! a pull request (signed webhook, plan, approval over the API, build pushing the branch, the
//! pull request on the fake GitHub, its gate on a check run); a crew step's
//! worktree, session and push; a host killed with SIGKILL and its step taken back
//! (`lease_expired`) and finished by another host, then the orphaned harness terminated from the
//! journal; a push the remote's hook refuses failing its step once (`push_refused`), with the
//! remote's words; a timeout that interrupts then kills a harness with its children; a cancel through
//! the API reaching the harness; a draining host handing its step back; 200 steps on
//! 4 hosts with 2 slots each, each run exactly once.
//! `e2e/agents.rs` drives the real Claude Code and Codex, pinned in `scripts/agent-clis.txt` and
//! installed by `make test`, through a host and `shopfloor serve`, against `model_fake/`: stand-ins
//! of the Anthropic Messages API and the OpenAI Responses API on loopback (streamed events, usage,
//! error bodies, as published), behind one scripted model a marker in the prompt picks (edit a file
//! then run a command, keep working at a second a call, listen for a person's message, refuse with
//! a 400). Each CLI: an edit and a command pushed, the figures the CLI printed recorded; a `read`
//! step that cannot edit, and `edits_refused` where changes were expected; a run's hard cap
//! stopping a session within a call of it, its spend the CLI's own final figure; a cancel leaving
//! no process and its cost recorded; a 400 failing once, final, in the API's words; Claude Code:
//! a person's message in the model's next request.
//! `e2e/sessions.rs` replays each real-format transcript of `host/tests/fixtures` (Claude Code:
//! success, several models, two result lines, turn and budget caps, an error after SIGTERM, an
//! API 404 with its `<synthetic>` line, killed with no result line; Codex: success, a
//! `Reconnecting…` error before `turn.completed`, `turn.failed`) from stand-in `claude` and
//! `codex` scripts (printing the file, ending with the recorded exit; never reading stdin)
//! through a host and `shopfloor serve`, and checks each recorded session's cost, estimate,
//! spend, tokens, turns, model, outcome and reason, and the API's `cost_is_estimate`; and a
//! Claude Code session streaming messages with no result line is stopped `budget_hard_stop` by
//! its estimated spend passing a hard budget, the org's spend showing the estimate.
//! `e2e/caps.rs`: the `--max-budget-usd` and `--max-turns` a stand-in receives are the budget
//! left and the node's cap; a session ignoring its turn cap is stopped `turn_cap`; a host without
//! `harness:claude-code` never claims a Claude Code step (the run is `unroutable`, naming it); a
//! crew step that feeds a pull request and changed nothing fails `no_changes`, in words on the
//! run page. `e2e/host_tokens.rs`: with the fake GitHub's tokens living 3 s (`FakeGithub::set_token_lifetime`), a step that outlives the claim's
//! token and an attempt adopted after a SIGKILL of its host both push with a fresh token the fake
//! minted and that had not expired (a `git` wrapper on the host's `PATH` notes what each push
//! carried). `e2e/intervene.rs`: a message through the API reaches a running stand-in's input
//! and is echoed into its transcript before its result.
//! `e2e/telemetry.rs` runs `shopfloor api` and a test-executor `shopfloor engine` exporting to an
//! OTLP/HTTP receiver in the test (axum, `opentelemetry-proto`): a signed webhook's run is one
//! trace whose only root is the webhook's span with every step's span under it, the API's
//! `trace_id` is that trace, each run event arrives as a log record with exactly the fixed keys,
//! and the API's JSON log line carries the trace and span ids.
//! `e2e/blackhole.rs` cuts an engine's `LISTEN` connection silently: the engine runs in a
//! network namespace (`netns.rs`: veth links, `ip`, root) and reaches PostgreSQL through two
//! proxies (`proxy.rs`, `Proxy::start_on`), one per link; taking the `LISTEN` link down drops
//! every frame without closing a socket, which a proxy on loopback cannot do (its kernel would
//! answer the probes). Idle, the engine sends no statement while its keepalive probes go out (its
//! namespace's `TCPKeepAlive` counter); cut, the keepalive gives the socket up (its
//! `/proc/PID/net/tcp`), the runs submitted meanwhile wait untouched, and once the link forwards
//! the engine subscribes again through the proxy, rescans and completes them.
//! `e2e/chaos/` is the chaos suite (`make chaos` runs it with 2000 runs; `make test` with 300):
//! three engines and two API replicas (`fleet.rs`: engine `a` and replica `r1` pool through
//! PgBouncer, `b` is direct and named in `pg_stat_activity`, `c` and `r2` live in a network
//! namespace behind proxies), clients over HTTP (`clients.rs`: REST submits with an
//! `Idempotency-Key` sent again to the other replica on a failure, signed `issues.opened`
//! deliveries redelivered until answered 2xx, approvals), and the figures checked against what
//! the server acknowledged and what the fake GitHub holds (`figures.rs`: runs lost, one comment
//! per issue, re-executions with the fault behind each, the audit entry by entry). Its faults,
//! one after another: SIGKILLs of engines and replicas throughout, `b` frozen inside an open
//! transaction, a poisoned run, `c`'s links cut, PgBouncer killed and restarted, PostgreSQL
//! crashed with `fsync` on, `c`'s and then `r2`'s links blackholed.
//! `e2e/pgbouncer.rs` runs the statements, the tenant pool, and two `shopfloor api` and two
//! `shopfloor engine` processes with a host through a real PgBouncer in transaction mode (see
//! `engine/src/db.rs`, "Behind a transaction pooler"); `e2e/poolers.rs` checks that every process `LISTEN`s on the
//! listen URL.
//! `e2e/metrics.rs` scrapes `/metrics` of a `shopfloor api` and a `shopfloor engine
//! --metrics-addr` before and after a run over REST, a signed webhook and an outgoing delivery,
//! and of `shopfloor serve`. `e2e/webhook_targets.rs` posts every internal address form (numeric,
//! mapped and embedded spellings, metadata and local names) to a `shopfloor api` as a webhook
//! URL: each a 422 problem+json with nothing stored; with `SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE`
//! loopback and private ones are taken and metadata ones still refused. (The send-time walls,
//! with a resolver that answers 127.0.0.1, and a receiver streaming 100 MB, are in
//! `api/tests/it/webhooks_out.rs`.) `e2e/check.rs` runs `shopfloor check` passing against a migrated
//! database and the fake GitHub, failing with its fix lines, `--host`, and a real PgBouncer
//! without and with a direct URL. `e2e/secrets.rs` runs
//! `serve` and a host with known secrets through an issue to a pull request plus bad requests,
//! and searches every process's output, every answer, the run events and the event stream for
//! each secret and its base64.
//! `console/` tests the web console: pages and forms over HTTP, tenancy, every page on 10,000
//! seeded runs (statements counted, no sequential scan of a large table), and a headless
//! Chromium driven through chromedriver (fantoccini; the kit is `chromium.rs`): `browser.rs`
//! (approve, cancel, a live transcript), `operate.rs` (add a host and run it, drain, budgets,
//! members, webhooks), `attend.rs` (Needs you, who approved, edit-and-retry, every page). Each
//! page gets `accessibility` and `fits`: no text outside its box at 1280×900 and 390×844, with
//! screenshots in `target/screenshots/`. `e2e/readme.rs` runs the README's tour as written.
//! `in_process.rs` serves the API on a loopback port (`serve`), beside an engine in the test's
//! own process (`engine::testkit::Engine`). On it stands the one harness of the API's tests and
//! the console's, `api/tests/it/harness.rs` (`App`: the test's database, the fake GitHub, the
//! served router, the engine a test starts, requests with a token, the teardown; it needs the API
//! crate, so the console's binary takes the file in with `#[path]`); `api/tests/it/support.rs`
//! adds the API tests' orgs, tokens and problem bodies, `console/support.rs` the console's orgs
//! and its cookie-keeping browser.
//! What the tests share is written once, in the crate `shopfloor_tests` (`lib.rs`): `process.rs`
//! starts `shopfloor` on a test database (`shopfloor`), on a free port until it is ready
//! (`listen`), and kills it when dropped (`Proc`, which an `EngineProcess` holds); `lib.rs` makes
//! the `shopfloor engine` command with the test executor that `EngineProcess` and the chaos fleet
//! start (`engine_command`), seeds
//! (`seed`, `submit_inputs`), starts a migrated cluster of a test's own (`own_cluster`, for tests
//! that restart or cut the server), waits on the database (`until_count`, `until_run`, `until_all_done`), reads a
//! statement's plan (`plan`) and checks that indexes serve a list of lookups (`assert_indexed`);
//! `github_fake` makes a process the GitHub App against the fake
//! (`as_app`) and an issue's label and edit events (`Issue::labeled`, …). `e2e/support.rs` holds
//! what needs the API crate, which `shopfloor_tests` cannot depend on (the API's tests depend on
//! it): org `acme` with project `web` (`acme`), its workflows (`put_workflows`), its repository
//! `Acme/Widgets` connected (`connect_widgets`, `widgets`) with an issue for an agent on the fake
//! GitHub (`ready_for_agent`), a person's token (`owner_token`) and a host's registration
//! (`registration`).
//! `workflows/`: the workflows that the engine's, the API's, `e2e/` and `console/` tests submit
//! (and `engine::testkit::APPROVAL`), one YAML file each whose first line says what it
//! exercises, taken in with `include_str!`; the parser's own fixtures, valid and broken, are in
//! `engine/tests/fixtures/workflows`.

pub mod github_fake;
pub mod in_process;
pub mod model_fake;
pub mod netns;
pub mod pgbouncer;
pub mod process;
pub mod proxy;
pub mod sse;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use engine::db::Db;
use engine::ids::RunId;
use engine::store::runs;
use engine::store::{Actor, Change};

/// Waits until `url` answers 200 (a server's `/readyz` once it has started). The deadline only
/// ends a hung test: a loaded machine may take long, and nothing is asserted about how long.
pub async fn until_ok(url: &str) {
    let answered = async {
        while !reqwest::get(url).await.is_ok_and(|r| r.status() == reqwest::StatusCode::OK) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(180), answered).await.is_err() {
        panic!("{url} never answered 200: the server did not start (see its output above)");
    }
}

/// The `shopfloor` binary of this build (`make test` builds it first).
pub fn shopfloor_bin() -> PathBuf {
    if let Ok(bin) = std::env::var("SHOPFLOOR_BIN") {
        return PathBuf::from(bin);
    }
    // target/<profile>/deps/e2e-<hash> → target/<profile>/shopfloor
    let exe = std::env::current_exe().expect("the test binary knows its path");
    let bin = exe.parent().and_then(Path::parent).map(|dir| dir.join("shopfloor")).expect("target/<profile>/");
    assert!(bin.exists(), "{} is not built: run `cargo build --bin shopfloor` (make test does)", bin.display());
    bin
}

/// A `shopfloor engine` process with the test executor; killed when dropped.
pub struct EngineProcess {
    pub proc: process::Proc,
    pub id: String,
}

impl EngineProcess {
    pub fn start(database_url: &str, id: &str, effects: &Path) -> EngineProcess {
        EngineProcess::spawn(Command::new(shopfloor_bin()), database_url, id, effects)
    }

    /// As [`EngineProcess::start`], with `program` as the `shopfloor` to run (a command that
    /// runs it, such as [`netns::Netns::command`], with settings of its own in its environment).
    pub fn spawn(program: Command, database_url: &str, id: &str, effects: &Path) -> EngineProcess {
        let child = engine_command(program, id, effects, "warn")
            .env("DATABASE_URL", database_url)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn shopfloor engine");
        EngineProcess { proc: process::Proc(child), id: id.to_owned() }
    }
}

/// `program` (a `shopfloor`) as `shopfloor engine` `id` with the test executor, recording what
/// it executes in `effects`, draining for 5 s and logging at `log`; its database and output are
/// the caller's to set.
pub fn engine_command(mut program: Command, id: &str, effects: &Path, log: &str) -> Command {
    program
        .args(["engine", "--test-executor", "--engine-id", id, "--log", log])
        .arg("--test-effects")
        .arg(effects)
        .env("SHOPFLOOR_DRAIN_SECS", "5")
        .env("SHOPFLOOR_SECRET_KEY", engine::testkit::SECRET_KEY);
    program
}

pub use engine::testkit::Seed;

/// A cluster of the test's own in `dir`'s `cluster` (stopped when the first value is dropped),
/// started, and a migrated pool of four on it.
pub async fn own_cluster(dir: &Path) -> (engine::testkit::OwnCluster, engine::cluster::Cluster, Db) {
    // Run as root, the server runs as `postgres`, which must be able to enter the directory.
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let own = engine::testkit::OwnCluster::new(dir.join("cluster"));
    let pg = own.start().await;
    let pool = engine::db::connect(&pg.url, 4).await.unwrap_or_else(|e| panic!("{}: {e}", pg.url));
    engine::db::migrate(&pool).await.unwrap_or_else(|e| panic!("migrate {}: {e}", pg.url));
    (own, pg, pool)
}

/// Org `acme` with project `web` and `source` as its workflow ([`engine::testkit::seed`]).
pub async fn seed(pool: &Db, source: &str) -> Seed {
    engine::testkit::seed(pool, "acme", source).await
}

/// Submits `n` runs with `input`, 100 per transaction.
pub async fn submit_many(pool: &Db, s: &Seed, n: usize, input: serde_json::Value) -> Vec<RunId> {
    submit_inputs(pool, s, &vec![input; n]).await
}

/// Submits a run for each input, 100 per transaction.
pub async fn submit_inputs(pool: &Db, s: &Seed, inputs: &[serde_json::Value]) -> Vec<RunId> {
    let mut ids = Vec::with_capacity(inputs.len());
    for chunk in inputs.chunks(100) {
        let mut ch = Change::begin(pool, Actor::System).await.unwrap();
        for input in chunk {
            let new = engine::testkit::new_run(s, input.clone());
            ids.push(runs::submit(&mut ch, new).await.unwrap());
        }
        ch.commit().await.unwrap();
    }
    ids
}

pub async fn scalar(pool: &Db, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Waits until `sql` counts `want`, up to `limit` (the test reads; the processes never poll).
pub async fn until_count(pool: &Db, sql: &str, want: i64, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let got = scalar(pool, sql).await;
        if got == want {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{sql}: still {got}, expected {want} after {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `sql`, with the run bound as $1, is true: 120 s at most.
pub async fn until_run(pool: &Db, run: RunId, sql: &str, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let done: bool = sqlx::query_scalar(sql).bind(run).fetch_one(pool).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        if done {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{run} never reached: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until no run is `running`, up to `limit`; returns how many still are.
pub async fn until_all_done(pool: &Db, limit: Duration) -> i64 {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        // The test process reads; the engines never poll.
        let left = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM runs WHERE status = 'running'").fetch_one(pool).await.unwrap_or(i64::MAX);
        if left == 0 || tokio::time::Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The invariants every engine test ends with, as counts that must all be zero.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Invariants {
    /// Runs not terminal, or not completed.
    pub runs_lost: i64,
    /// A step id executed twice, or two attempts of one visit both succeeded.
    pub effects_doubled: i64,
    /// Runs whose event sequence is not exactly 1..n.
    pub event_gaps: i64,
    /// Step events by an actor other than the engine without the audit entry of the same
    /// change, and events that name no actor.
    pub audit_missing: i64,
    /// Steps still leased or running.
    pub steps_held: i64,
}

pub async fn check_invariants(pool: &Db, effects: &Path) -> Invariants {
    let runs_lost = scalar(pool, "SELECT count(*) FROM runs WHERE status <> 'completed'").await;
    let text = std::fs::read_to_string(effects).unwrap_or_default();
    let mut seen = std::collections::HashSet::new();
    let mut doubled = text.lines().filter(|l| !seen.insert(l.split(' ').next().unwrap_or_default().to_owned())).count() as i64;
    doubled += scalar(pool, "SELECT count(*) FROM (SELECT 1 FROM steps WHERE state = 'succeeded' GROUP BY run_id, node, visit HAVING count(*) > 1) d").await;
    let event_gaps = scalar(pool, "SELECT count(*) FROM (SELECT run_id FROM run_events GROUP BY run_id HAVING min(seq) <> 1 OR max(seq) <> count(*)) g").await;
    // Each step event names its actor. One by an engine is audited by the journal itself;
    // every other is written with one audit entry on the same step, so per step the counts of
    // those events and of its audit entries are equal.
    let unnamed = scalar(pool, "SELECT count(*) FROM run_events WHERE actor IS NULL").await;
    let step_events: Vec<(uuid::Uuid, i64)> = sqlx::query_as(
        "SELECT step_id, count(*) FROM run_events WHERE step_id IS NOT NULL AND kind LIKE 'step.%' AND actor NOT LIKE 'engine:%' GROUP BY step_id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let audits: std::collections::HashMap<String, i64> =
        sqlx::query_as::<_, (String, i64)>("SELECT target_id, count(*) FROM audit_log WHERE target_kind = 'step' GROUP BY target_id")
            .fetch_all(pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let audit_missing = step_events.iter().filter(|(step, events)| audits.get(&engine::ids::StepId(*step).to_string()).copied().unwrap_or(0) < *events).count()
        as i64
        + unnamed;
    let steps_held = scalar(pool, "SELECT count(*) FROM steps WHERE state IN ('leased', 'running')").await;
    Invariants { runs_lost, effects_doubled: doubled, event_gaps, audit_missing, steps_held }
}

/// The plan PostgreSQL makes for `sql` on `conn` (`EXPLAIN`), a line a node.
pub async fn plan(conn: &mut sqlx::PgConnection, sql: &str) -> String {
    let lines: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {sql}")).fetch_all(conn).await.unwrap_or_else(|e| panic!("EXPLAIN {sql}: {e}"));
    lines.join("\n")
}

/// Asserts that each of `lookups`, an index (or several, `a|b`: any of them) and a statement,
/// is served by that index and reads no table whole. Sequential scans are turned off on `conn`
/// first: a test's tables are small or empty, and the planner would otherwise scan them
/// whatever the indexes.
pub async fn assert_indexed(conn: &mut sqlx::PgConnection, lookups: &[(&str, &str)]) {
    sqlx::query("SET enable_seqscan = off").execute(&mut *conn).await.unwrap();
    for (index, sql) in lookups {
        let plan = plan(conn, sql).await;
        assert!(index.split('|').any(|i| plan.contains(i)) && !plan.contains("Seq Scan"), "{sql}\nshould use {index}:\n{plan}");
    }
}

/// Calls per statement (pg_stat_statements' `queryid`) in `database`, read through `admin`, a
/// connection to another database of the same cluster, so that reading counts nothing.
pub async fn statement_calls(admin: &Db, database: &str) -> std::collections::HashMap<i64, i64> {
    sqlx::query_as::<_, (i64, i64)>("SELECT queryid, calls FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)")
        .bind(database)
        .fetch_all(admin)
        .await
        .unwrap_or_else(|e| panic!("pg_stat_statements cannot be read ({e}): the cluster must preload it"))
        .into_iter()
        .collect()
}

/// Statements sent between two [`statement_calls`]: only calls that grew or appeared count,
/// so entries pg_stat_statements evicted meanwhile (other tests fill it) are not read as
/// negative work.
pub fn statements_sent(before: &std::collections::HashMap<i64, i64>, after: &std::collections::HashMap<i64, i64>) -> i64 {
    after.iter().map(|(q, n)| (n - before.get(q).copied().unwrap_or(0)).max(0)).sum()
}

/// The effects file's lines (one per executed step attempt).
pub fn effects_count(effects: &Path) -> usize {
    std::fs::read_to_string(effects).map(|t| t.lines().count()).unwrap_or(0)
}
