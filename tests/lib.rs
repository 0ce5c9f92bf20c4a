//! Helpers for end-to-end tests across real processes: the `shopfloor` binary, engine
//! processes on a test database, and waiting on the database for what they did; and
//! (`in_process`) the API and an engine in a test's own process.

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
