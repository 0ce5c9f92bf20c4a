//! The engine pool as real processes: throughput with two engines, recovery after SIGKILL, a
//! PostgreSQL restart, a link cut while claims fail, and an idle pool that sends nothing.

use std::path::Path;
use std::time::Duration;

use engine::db::Db;
use engine::testkit::{TestDb, join_and_loop, test_db};
use serde_json::{Value, json};
use shopfloor_tests::proxy::Proxy;
use shopfloor_tests::{EngineProcess, Invariants, check_invariants, effects_count, own_cluster, scalar, seed, submit_many, until_all_done};

/// Steps per run: plan, left, right, ci (fails), left, ci, ship.
const STEPS_PER_RUN: i64 = 7;

/// Engines `a` and `b` on a test's database, recording what they execute under a temporary
/// directory, with `runs` join-and-loop runs submitted, each failing its gate once.
struct TwoEngines {
    effects: std::path::PathBuf,
    _engines: [EngineProcess; 2],
    _dir: tempfile::TempDir,
}

async fn two_engines_with_runs(db: &TestDb, runs: usize) -> TwoEngines {
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects");
    let engines = engines_with_runs(&db.url, &db.pool, &effects, ["a", "b"], runs, json!({ "test": { "gate_fail_visits": [1] } })).await;
    TwoEngines { effects, _engines: engines, _dir: dir }
}

/// Engines `ids` with the test executor on the database at `url`, recording what they execute
/// in `effects`, then `runs` join-and-loop runs with `input` submitted through `pool`.
async fn engines_with_runs<const N: usize>(url: &str, pool: &Db, effects: &Path, ids: [&str; N], runs: usize, input: Value) -> [EngineProcess; N] {
    let s = seed(pool, &join_and_loop("shipped")).await;
    let engines = ids.map(|id| EngineProcess::start(url, id, effects));
    submit_many(pool, &s, runs, input).await;
    engines
}

#[tokio::test(flavor = "multi_thread")]
async fn two_engine_processes_complete_a_thousand_runs_exactly_once() {
    let db = test_db().await;
    let two = two_engines_with_runs(&db, 1000).await;
    let effects = &two.effects;

    assert_eq!(until_all_done(&db.pool, Duration::from_secs(300)).await, 0, "runs still running");
    assert_eq!(check_invariants(&db.pool, effects).await, Invariants::default());
    assert_eq!(scalar(&db.pool, "SELECT count(*) FROM steps").await, 1000 * STEPS_PER_RUN);
    assert_eq!(effects_count(effects) as i64, 1000 * STEPS_PER_RUN);
    // Both processes did part of the work.
    let by_engine: Vec<(String, i64)> =
        sqlx::query_as("SELECT holder, count(*) FROM steps WHERE holder IS NOT NULL GROUP BY holder ORDER BY holder").fetch_all(&db.pool).await.unwrap();
    assert_eq!(by_engine.len(), 2, "{by_engine:?}");
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_engines_leased_steps_are_recovered_by_the_other() {
    let db = test_db().await;
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects");
    // Each step takes 3 s, so the victim is sure to hold leased steps when it dies.
    let [mut victim] = engines_with_runs(&db.url, &db.pool, &effects, ["victim"], 20, json!({ "test": { "step_ms": 3000, "gate_fail_visits": [1] } })).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while scalar(&db.pool, "SELECT count(*) FROM steps WHERE state = 'running' AND holder = 'engine:victim'").await < 20 {
        assert!(tokio::time::Instant::now() < deadline, "the victim never held 20 steps");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    victim.proc.sigkill();
    let _survivor = EngineProcess::start(&db.url, "survivor", &effects);

    assert_eq!(until_all_done(&db.pool, Duration::from_secs(180)).await, 0, "runs still running");
    assert_eq!(check_invariants(&db.pool, &effects).await, Invariants::default());
    let expired = scalar(&db.pool, "SELECT count(*) FROM steps WHERE reason = 'lease_expired' AND holder = 'engine:victim'").await;
    assert_eq!(expired, 20, "each step the victim held ends as lease_expired");
    // Recovered within the lease and its grace (45 s) plus a little.
    let slowest: f64 = sqlx::query_scalar("SELECT extract(epoch FROM max(ended_at - started_at))::float8 FROM steps WHERE reason = 'lease_expired'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(slowest < 50.0, "a held step took {slowest} s to be taken back");
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn engines_reconnect_after_a_postgres_restart_and_finish_every_run() {
    // A cluster of this test's own: restarting the shared one would break other tests.
    let dir = tempfile::tempdir().unwrap();
    let (own, pg, pool) = own_cluster(dir.path()).await;
    let effects = dir.path().join("effects");
    let _engines = engines_with_runs(&pg.url, &pool, &effects, ["a", "b"], 200, json!({ "test": { "step_ms": 50, "gate_fail_visits": [1] } })).await;
    // Mid-flight: some runs finished, others not yet.
    let underway = async {
        while scalar(&pool, "SELECT count(*) FROM runs WHERE status = 'completed'").await == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(120), underway).await.expect("no run completed before the restart");
    assert!(scalar(&pool, "SELECT count(*) FROM runs WHERE status = 'running'").await > 0, "restart should happen mid-flight");

    pool.close().await;
    pg.stop().unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pg = own.start().await;
    let pool = engine::db::connect(&pg.url, 4).await.unwrap();

    assert_eq!(until_all_done(&pool, Duration::from_secs(180)).await, 0, "runs still running after the restart");
    assert_eq!(check_invariants(&pool, &effects).await, Invariants::default());
    pool.close().await;
    pg.stop().unwrap();
}

/// Waits (a generous deadline that only fails a hung engine) until `sql`'s count is `want`.
async fn until_count(pool: &Db, sql: &str, want: i64, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while scalar(pool, sql).await != want {
        assert!(tokio::time::Instant::now() < deadline, "{what}: `{sql}` never counted {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_engine_cut_off_while_it_claims_listens_again_and_finds_what_it_missed() {
    let db = test_db().await;
    let url = reqwest::Url::parse(&db.url).unwrap();
    let server = std::net::SocketAddr::new(url.host_str().unwrap().parse().unwrap(), url.port().unwrap_or(5432));
    let proxy = Proxy::start(server).await.unwrap();
    let mut through = reqwest::Url::parse(&proxy.url_for(&db.url)).unwrap();
    through.query_pairs_mut().append_pair("application_name", "cut-engine");
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects");
    let s = seed(&db.pool, &join_and_loop("shipped")).await;
    let _engine = EngineProcess::start(through.as_str(), "cut", &effects);
    let listening = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'cut-engine' AND query ILIKE 'LISTEN%'";
    until_count(&db.pool, listening, 1, "the engine listens").await;

    // The link goes: its LISTEN connection and its pool's with it, and every attempt to reach
    // the database again is turned away, while runs are submitted that it is not told of.
    proxy.cut_for(Duration::from_secs(3600));
    until_count(&db.pool, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'cut-engine'", 0, "the engine's connections are gone").await;
    submit_many(&db.pool, &s, 5, json!({})).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while proxy.stats().refused < 3 {
        assert!(tokio::time::Instant::now() < deadline, "the engine stopped trying to reach its database");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Back: it listens again, then looks for what it missed, and every run finishes.
    proxy.heal();
    until_count(&db.pool, listening, 1, "the engine listens again").await;
    assert_eq!(until_all_done(&db.pool, Duration::from_secs(180)).await, 0, "runs still running after the link came back");
    assert_eq!(check_invariants(&db.pool, &effects).await, Invariants::default());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_pool_sends_no_statements() {
    let db = test_db().await;
    let _two = two_engines_with_runs(&db, 10).await;
    assert_eq!(until_all_done(&db.pool, Duration::from_secs(60)).await, 0);
    // Quiescence: the engines' timers for the lease wakes they were told of (30 s lease + 15 s
    // grace) fire once, find those wakes gone with their steps, and then nothing is left to
    // wait for.
    tokio::time::sleep(Duration::from_secs(47)).await;

    // Counted by pg_stat_statements from another database, so neither the counting nor
    // autovacuum's own transactions on the test database are counted.
    let admin = engine::db::connect(&std::env::var("DATABASE_URL").unwrap(), 1).await.unwrap();
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").execute(&admin).await.unwrap();
    let before = shopfloor_tests::statement_calls(&admin, &db.name).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let after = shopfloor_tests::statement_calls(&admin, &db.name).await;
    let sent = shopfloor_tests::statements_sent(&before, &after);
    assert!(!before.is_empty(), "pg_stat_statements saw none of the engines' statements");
    assert_eq!(sent, 0, "the idle pool sent {sent} statements in 30 s");
    admin.close().await;
    db.finish().await;
}
