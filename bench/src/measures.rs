//! Each figure of `make bench`, measured on the bench cluster with database timestamps.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use engine::store::{Actor, Change, runs};
use serde_json::json;

use crate::setup::{Bench, scalar_i64, steps_and_seconds, submit_many, until_count};

/// Three leased steps in a row.
const SEQUENTIAL: &str = "name: three-in-a-row
nodes:
  a:
    crew: { harness: claude-code, prompt: a }
  b:
    after: [a]
    crew: { harness: claude-code, prompt: b }
  c:
    after: [b]
    crew: { harness: claude-code, prompt: c }
";

const ONE_STEP: &str = "name: one-step
nodes:
  a:
    crew: { harness: claude-code, prompt: a }
";

const ASLEEP: &str = "name: asleep
nodes:
  nap:
    wait: { for: 24h }
";

/// With `BENCH_PROFILE=1`: the statements the engines sent for the runs, by total time, with
/// their calls per run — what to make cheaper or fewer next.
pub(crate) async fn print_top_statements(db: &crate::setup::Db, runs: usize) -> Result<()> {
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").execute(&db.pool).await?;
    let top: Vec<(i64, f64, f64, String)> = sqlx::query_as(
        "SELECT calls, total_exec_time, mean_exec_time, regexp_replace(query, '\\s+', ' ', 'g') FROM pg_stat_statements \
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1) ORDER BY total_exec_time DESC LIMIT 25",
    )
    .bind(&db.name)
    .fetch_all(&db.pool)
    .await
    .context("reading pg_stat_statements (CREATE EXTENSION pg_stat_statements on the bench cluster)")?;
    eprintln!("{:>9} {:>8} {:>9} {:>7}  statement", "calls", "per run", "total ms", "mean ms");
    for (calls, total, mean, query) in top {
        let per_run = calls as f64 / runs as f64;
        eprintln!("{calls:>9} {per_run:>8.2} {total:>9.0} {mean:>7.3}  {}", query.chars().take(160).collect::<String>());
    }
    Ok(())
}

/// `pgbench -N -c 8 -j 2 -T 20`: the machine's durable-commit limit.
pub(crate) async fn pgbench_tps(b: &Bench, bindir: &std::path::Path, seconds: u32) -> Result<f64> {
    let admin = engine::db::connect(&b.admin_url, 1).await?;
    sqlx::query("DROP DATABASE IF EXISTS pgbench WITH (FORCE)").execute(&admin).await?;
    sqlx::query("CREATE DATABASE pgbench").execute(&admin).await?;
    admin.close().await;
    let url = crate::setup::with_database(&b.admin_url, "pgbench");
    let pgbench = bindir.join("pgbench");
    let init = Command::new(&pgbench).args(["-i", "-q", "-s", "10"]).arg(&url).output().context("running pgbench -i")?;
    if !init.status.success() {
        bail!("pgbench -i failed: {}", String::from_utf8_lossy(&init.stderr));
    }
    let run = Command::new(&pgbench).args(["-N", "-c", "8", "-j", "2", "-T", &seconds.to_string()]).arg(&url).output().context("running pgbench")?;
    let out = String::from_utf8_lossy(&run.stdout);
    out.lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no tps in pgbench's output: {out}"))
}

pub(crate) struct Throughput {
    pub runs_per_s: f64,
    pub steps_per_s: f64,
}

/// `n` runs of three leased steps, two engine processes, from the first step's start to the
/// last run's end.
pub(crate) async fn engine_throughput(b: &Bench, n: usize) -> Result<Throughput> {
    let (db, seed) = b.database("bench_engine", SEQUENTIAL).await?;
    submit_many(&db, &seed, n, 500, json!({})).await?;
    if std::env::var("BENCH_PROFILE").as_deref() == Ok("1") {
        // Plans of the engines' slow statements go to the cluster's log (target/bench-cluster/pg.log).
        sqlx::query(&format!("ALTER DATABASE {} SET session_preload_libraries = 'auto_explain'", db.name)).execute(&db.pool).await?;
        sqlx::query(&format!("ALTER DATABASE {} SET auto_explain.log_min_duration = '3ms'", db.name)).execute(&db.pool).await?;
    }
    // BENCH_ENGINES processes (2 unless told), for the scaling figures of ARCHITECTURE.md.
    let engines: usize = std::env::var("BENCH_ENGINES").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    let _engines = (1..=engines).map(|i| b.engine(&db, &format!("e{i}"))).collect::<Result<Vec<_>>>()?;
    until_count(&db.pool, "SELECT count(*) FROM runs WHERE status <> 'running'", n as i64, Duration::from_secs(1800)).await?;
    let failed = scalar_i64(&db.pool, "SELECT count(*) FROM runs WHERE status <> 'completed'").await?;
    if failed > 0 {
        bail!("{failed} bench runs did not complete");
    }
    let (steps, secs) = steps_and_seconds(&db.pool).await?;
    if std::env::var("BENCH_PROFILE").as_deref() == Ok("1") {
        print_top_statements(&db, n).await?;
    }
    db.close().await;
    Ok(Throughput { runs_per_s: n as f64 / secs, steps_per_s: steps as f64 / secs })
}

pub(crate) struct Wake {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub idle_statements_60s: i64,
}

/// Wakes measured, ours and the peer's. A p99 of 200 was their second-slowest, which one
/// slow commit decided (the `COMMIT` that opened a new 16 MB WAL segment took ~50 ms, at the
/// same submission in every run); of 1,000 it is the tenth.
pub(crate) const WAKES: usize = 1_000;

/// Runs that warm the pool before [`WAKES`] are measured.
const WAKE_WARMUP: usize = 200;

/// With the pool idle and warm ([`WAKE_WARMUP`] runs through it first): [`WAKES`] runs
/// submitted one at a time 10 ms apart; latency from the submit's last statement before
/// `COMMIT` to the first step's start. Then, once the pool is quiescent, 60 s of
/// idleness, counted.
pub(crate) async fn wake_latency_and_idle(b: &Bench, idle_secs: u64) -> Result<Wake> {
    let (db, seed) = b.database("bench_wake", ONE_STEP).await?;
    let _e1 = b.engine(&db, "e1")?;
    let _e2 = b.engine(&db, "e2")?;
    // Warm, as the peer is when its wakes are measured (after its chains) and as a pool that
    // has been up a while is: a burst of runs first, so that both engines' pools have opened
    // their connections and prepared their statements. Cold, the first second's wakes waited
    // for those (10 to 60 ms) and decided the p99.
    submit_many(&db, &seed, WAKE_WARMUP, 1, json!({})).await?;
    until_count(&db.pool, "SELECT count(*) FROM runs WHERE status <> 'running'", WAKE_WARMUP as i64, Duration::from_secs(120)).await?;
    // The database's clock as the submit's last statement before `COMMIT` runs (the one that
    // writes the run's events and audit entry), as the peer's clock is read just before its
    // `COMMIT`: the run's own `created_at` is its transaction's start, before admission's
    // statements and the events'.
    let mut committing = Vec::with_capacity(WAKES);
    for _ in 0..WAKES {
        let mut ch = Change::begin(&db.pool, Actor::System).await?;
        let run = runs::submit(&mut ch, crate::setup::new_run(&seed, json!({}))).await?;
        let at = ch.commit_clocked().await?.context("a submit writes its run's events, so its commit reads the clock")?;
        committing.push((run.0, at));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    until_count(&db.pool, "SELECT count(*) FROM runs WHERE status <> 'running'", (WAKE_WARMUP + WAKES) as i64, Duration::from_secs(120)).await?;
    let (ids, ats): (Vec<uuid::Uuid>, Vec<chrono::DateTime<chrono::Utc>>) = committing.into_iter().unzip();
    let mut lat: Vec<f64> = sqlx::query_scalar(
        "SELECT (extract(epoch FROM s.started_at - c.at) * 1000)::float8 \
         FROM unnest($1::uuid[], $2::timestamptz[]) AS c(run_id, at) JOIN steps s USING (run_id) WHERE s.node = 'a'",
    )
    .bind(&ids)
    .bind(&ats)
    .fetch_all(&db.pool)
    .await?;
    lat.sort_by(f64::total_cmp);
    let (p50_ms, p99_ms) = (crate::setup::percentile(&lat, 0.50), crate::setup::percentile(&lat, 0.99));
    if idle_secs == 0 {
        db.close().await;
        return Ok(Wake { p50_ms, p99_ms, idle_statements_60s: 0 });
    }

    // Quiescence: timers set for lease wakes (30 s + 15 s grace) fire once and find them gone.
    tokio::time::sleep(Duration::from_secs(47)).await;
    let admin = engine::db::connect(&b.admin_url, 1).await?;
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").execute(&admin).await?;
    let calls = |admin: engine::db::Db, name: String| async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)",
        )
        .bind(name)
        .fetch_one(&admin)
        .await
    };
    let before = calls(admin.clone(), db.name.clone()).await?;
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let after = calls(admin.clone(), db.name.clone()).await?;
    admin.close().await;
    db.close().await;
    Ok(Wake { p50_ms, p99_ms, idle_statements_60s: after - before })
}

/// An engine holding leased steps is killed; seconds until the last of them starts again on
/// another engine.
pub(crate) async fn recovery(b: &Bench) -> Result<f64> {
    let (db, seed) = b.database("bench_recovery", ONE_STEP).await?;
    let mut victim = b.engine(&db, "victim")?;
    submit_many(&db, &seed, 10, 10, json!({ "test": { "step_ms": 3_600_000 } })).await?;
    until_count(&db.pool, "SELECT count(*) FROM steps WHERE state = 'running'", 10, Duration::from_secs(60)).await?;
    victim.kill();
    let killed_at: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()").fetch_one(&db.pool).await?;
    let _survivor = b.engine(&db, "survivor")?;
    until_count(&db.pool, "SELECT count(*) FROM steps WHERE attempt = 2 AND state = 'running'", 10, Duration::from_secs(180)).await?;
    let last: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT max(started_at) FROM steps WHERE attempt = 2").fetch_one(&db.pool).await?;
    db.close().await;
    Ok((last - killed_at).num_milliseconds() as f64 / 1000.0)
}

/// Resident memory of one engine with 10,000 open runs asleep on waits.
pub(crate) async fn rss_with_open_runs(b: &Bench, n: usize) -> Result<f64> {
    let (db, seed) = b.database("bench_rss", ASLEEP).await?;
    submit_many(&db, &seed, n, 500, json!({})).await?;
    let engine = b.engine(&db, "e1")?;
    until_count(&db.pool, "SELECT count(*) FROM steps WHERE state = 'waiting'", n as i64, Duration::from_secs(600)).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss = engine.rss_mb()?;
    db.close().await;
    Ok(rss)
}

pub(crate) struct Soak {
    pub drift_pct: f64,
    pub table_sizes: String,
}

/// Ten minutes of steady load (a closed loop keeping 200 runs open); throughput in the last
/// minute relative to the first, and the hot tables' sizes at the end.
pub(crate) async fn soak(b: &Bench, minutes: u32) -> Result<Soak> {
    let (db, seed) = b.database("bench_soak", SEQUENTIAL).await?;
    let _e1 = b.engine(&db, "e1")?;
    let _e2 = b.engine(&db, "e2")?;
    let started = tokio::time::Instant::now();
    let total = Duration::from_secs(u64::from(minutes) * 60);
    while started.elapsed() < total {
        let open = scalar_i64(&db.pool, "SELECT count(*) FROM runs WHERE status = 'running'").await?;
        if open < 200 {
            submit_many(&db, &seed, (200 - open) as usize, 100, json!({})).await?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let per_minute: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT floor(extract(epoch FROM ended_at - (SELECT min(created_at) FROM runs)) / 60)::int AS m, count(*) \
         FROM runs WHERE status = 'completed' GROUP BY m ORDER BY m",
    )
    .fetch_all(&db.pool)
    .await?;
    let in_minute = |m: i32| per_minute.iter().find(|(k, _)| *k == m).map_or(0, |(_, n)| *n) as f64;
    let first = in_minute(0).max(1.0);
    let last = in_minute(minutes as i32 - 1);
    let sizes: Vec<(String, i64)> = sqlx::query_as(
        "SELECT relname::text, pg_total_relation_size(relid) FROM pg_stat_user_tables \
         WHERE relname IN ('wakes','steps','runs','run_events','audit_log') ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await?;
    db.close().await;
    Ok(Soak {
        drift_pct: (last - first) / first * 100.0,
        table_sizes: sizes.iter().map(|(t, s)| format!("{t} {} kB", s / 1024)).collect::<Vec<_>>().join(", "),
    })
}
