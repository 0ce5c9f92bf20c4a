//! `make bench`: shopfloor's engine measured against the machine's own durable-commit limit.
//!
//! Starts its own PostgreSQL cluster with durable defaults (fsync and synchronous commit on),
//! measures every figure in one run, prints each as a `name: value` line, and appends the run
//! with the machine, the date and the commit to `bench/history.md` (BENCHMARKS.md is the
//! current figures on one page, kept by hand). Figures are ratios or counts
//! measured in the same run; nothing here is a pass/fail timing.
//!
//! | figure | what |
//! |---|---|
//! | `pgbench_tps` | `pgbench -N -c 8 -j 2 -T 20`: the cluster's durable-commit limit |
//! | `engine_runs_per_s`, `engine_steps_per_s` | `BENCH_RUNS` (20,000) runs of three crew steps in a row on `BENCH_ENGINES` (2) engines with the test executor, first step's start to last run's end |
//! | `engine_runs_per_s_vs_pgbench_tps` | the two above, as a ratio |
//! | `host_steps_per_s` | the same workflow's steps run by 4 `shopfloor host` processes (4 slots each, the `command` harness running `true`, no repository) claiming from one `shopfloor api`, 2 engines without the test executor; `BENCH_HOST_RUNS` runs (at most 2,000 by default), first step's lease to last run's end; `host_steps_note` says how many |
//! | `wake_p50_ms`, `wake_p99_ms` | an idle, warm pool (200 runs first, as the peer is warm from its chains): submit's commit to the first step's start |
//! | `peer_pool_*`, `peer_batched_*` | the peer, graphile-worker, in each configuration its documentation gives for throughput (`peer.rs`): `BENCH_PEER_CHAINS` (2,000) chains of three jobs, and its idle wake measured as ours |
//! | `peer`, `peer_chains_per_s`, `peer_wake_p50_ms`, `peer_wake_p99_ms` | the better of them (more chains per second) |
//! | `engine_runs_per_s_vs_peer`, `wake_p50_vs_peer`, `wake_p99_vs_peer` | ours over the peer's (throughput: above 1 is ahead; latency: below 1 is ahead) |
//! | `idle_statements_60s` | statements an idle pool sends in 60 s |
//! | `recovery_s` | an engine holding steps killed: until another runs them all again |
//! | `webhook_deliveries_per_s`, `webhook_p99_ms` | `BENCH_WEBHOOKS` (at most 2,000 by default) signed `issues.labeled` deliveries, each a new issue that opens one run, from 16 concurrent clients to one `shopfloor api`, after 160 warm-up deliveries the clock does not count (ten a client, on the connection it keeps): deliveries per wall-clock second and the client-side latency's p99; the bench fails unless each was answered 2xx and made exactly one run; `webhook_note` says how many |
//! | `sessions_<n>_report_p50_ms`, `…_p99_ms`, `sessions_<n>_transcript_lag_p50_ms`, `…_p99_ms`, `sessions_<n>_reports_per_s`, `sessions_within_goal` | for each count in `BENCH_SESSIONS` (100, 300 and 1,000), that many crew sessions at once on one `shopfloor api`, each reporting every second (5 transcript lines, growing usage and spend) over the host protocol, 10 followed in the console's live transcript (`sessions.rs`): the reports' client-side latency and the console's lag behind the host, over `BENCH_SESSIONS_SECS` (30) seconds after a 10-second warm-up; `sessions_within_goal` is the largest count with report p99 ≤ 100 ms and lag p99 ≤ 1 s |
//! | `soak_drift_pct`, `soak_table_sizes` | with `BENCH_SOAK=1`: ten minutes of steady load, last minute against the first |
//! | `engine_rss_mb_10k_open` | one engine's resident memory with 10,000 runs asleep |
//!
//! `BENCH_ONLY=engine` measures only the engine's throughput, `BENCH_ONLY=fleet` only the host
//! and webhook figures, `BENCH_ONLY=webhooks`, `BENCH_ONLY=sessions` and `BENCH_ONLY=wake` one of those, `BENCH_ONLY=peer`
//! only the peer's; such partial runs are printed, not recorded.

mod fleet;
mod measures;
mod peer;
mod sessions;
mod setup;

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use engine::cluster::{self, ClusterOptions};

use crate::setup::Bench;

struct Report {
    lines: Vec<(String, String)>,
}

impl Report {
    fn add(&mut self, name: &str, value: impl std::fmt::Display) {
        println!("{name}: {value}");
        self.lines.push((name.to_owned(), value.to_string()));
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let root = PathBuf::from(std::env::var("BENCH_ROOT").unwrap_or_else(|_| ".".into()));
    let exe = std::env::current_exe()?;
    let shopfloor = exe.parent().context("bench binary has a directory")?.join("shopfloor");
    anyhow::ensure!(shopfloor.exists(), "{} is not built: run `make bench`", shopfloor.display());
    let runs: usize = std::env::var("BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);

    let data_dir = root.join("target/bench-cluster");
    let _ = cluster::stop_dir(&ClusterOptions { data_dir: data_dir.clone(), durable: true });
    let _ = std::fs::remove_dir_all(&data_dir);
    let pg = cluster::ensure_running(&ClusterOptions { data_dir, durable: true }).await?;
    let bindir = pg_bindir()?;
    let b = Bench { admin_url: pg.url.clone(), shopfloor, key: engine::sealing::SecretKey::generate() };
    let mut r = Report { lines: Vec::new() };

    // BENCH_ONLY=engine measures the engine's throughput alone, BENCH_ONLY=fleet the hosts'
    // and the webhooks' figures alone, for quick iterations; such a partial run is printed but
    // not recorded.
    let only = std::env::var("BENCH_ONLY").ok();
    let result = match only.as_deref() {
        Some("engine") => measure_engine(&b, &bindir, runs, &mut r).await,
        Some("fleet") => measure_fleet(&b, &root, runs, &mut r).await,
        Some("peer") => measure_peer(&b, &root, &mut r).await.map(|_| ()),
        Some("webhooks") => measure_webhooks(&b, runs, &mut r).await,
        Some("sessions") => measure_sessions(&b, &mut r).await,
        Some("wake") => measures::wake_latency_and_idle(&b, 0).await.map(|w| {
            r.add("wake_p50_ms", format!("{:.2}", w.p50_ms));
            r.add("wake_p99_ms", format!("{:.2}", w.p99_ms));
        }),
        Some(other) => Err(anyhow::anyhow!("BENCH_ONLY={other}: expected `engine`, `fleet`, `webhooks`, `sessions`, `wake` or `peer`")),
        None => measure(&b, &bindir, &root, runs, &mut r).await,
    };
    let _ = pg.stop();
    result?;
    if only.is_some() {
        return Ok(());
    }

    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain"]).is_some_and(|s| !s.is_empty());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().find_map(|l| l.strip_prefix("MemTotal:")).and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok()))
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut entry = format!(
        "\n## {} — commit {commit}{}\n\nMachine: {cpus} CPUs, {mem_gib:.0} GiB memory; PostgreSQL with fsync and synchronous_commit on; {runs} runs.\n\n| figure | value |\n|---|---|\n",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        if dirty { " (with uncommitted changes)" } else { "" },
    );
    for (name, value) in &r.lines {
        let _ = writeln!(entry, "| `{name}` | {value} |");
    }
    let path = root.join("bench/history.md");
    let mut doc = std::fs::read_to_string(&path).unwrap_or_else(|_| HEADER.to_owned());
    doc.push_str(&entry);
    std::fs::write(&path, doc)?;
    eprintln!("appended to {}", path.display());
    Ok(())
}

async fn measure_engine(b: &Bench, bindir: &std::path::Path, runs: usize, r: &mut Report) -> Result<()> {
    let tps = measures::pgbench_tps(b, bindir, 20).await?;
    r.add("pgbench_tps", format!("{tps:.0}"));
    let t = measures::engine_throughput(b, runs).await?;
    r.add("engine_runs_per_s", format!("{:.0}", t.runs_per_s));
    r.add("engine_steps_per_s", format!("{:.0}", t.steps_per_s));
    r.add("engine_runs_per_s_vs_pgbench_tps", format!("{:.3}", t.runs_per_s / tps));
    Ok(())
}

/// A count from `var`, else `runs` but at most `cap` (the fleet's figures are slower per item
/// than the engine's, and the whole bench should stay within 20 minutes).
fn count(var: &str, runs: usize, cap: usize) -> usize {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(runs.min(cap)).max(1)
}

async fn measure_hosts(b: &Bench, root: &std::path::Path, runs: usize, r: &mut Report) -> Result<()> {
    let n = count("BENCH_HOST_RUNS", runs, 2_000);
    let t = fleet::host_throughput(b, root, n).await?;
    r.add("host_steps_per_s", format!("{:.0}", t.steps_per_s));
    r.add(
        "host_steps_note",
        format!("{n} runs, {} steps, on {} hosts × {} slots (`command` harness running `true`)", t.steps, fleet::HOSTS, fleet::HOST_SLOTS),
    );
    Ok(())
}

async fn measure_webhooks(b: &Bench, runs: usize, r: &mut Report) -> Result<()> {
    let n = count("BENCH_WEBHOOKS", runs, 2_000);
    let w = fleet::webhook_ingest(b, n).await?;
    r.add("webhook_deliveries_per_s", format!("{:.0}", w.per_s));
    r.add("webhook_p99_ms", format!("{:.1}", w.p99_ms));
    r.add(
        "webhook_note",
        format!(
            "{n} deliveries from {} clients to one `shopfloor api`, after {} warm-up deliveries; p50 {:.1} ms",
            fleet::WEBHOOK_CLIENTS,
            fleet::WEBHOOK_WARMUP,
            w.p50_ms
        ),
    );
    Ok(())
}

async fn measure_sessions(b: &Bench, r: &mut Report) -> Result<()> {
    let levels: Vec<usize> =
        std::env::var("BENCH_SESSIONS").unwrap_or_else(|_| "100,300,1000".into()).split(',').filter_map(|n| n.trim().parse().ok()).collect();
    let secs = std::env::var("BENCH_SESSIONS_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    let mut within = 0;
    for n in levels {
        let s = sessions::concurrent_sessions(b, n, secs).await?;
        r.add(&format!("sessions_{n}_report_p50_ms"), format!("{:.1}", s.p50_ms));
        r.add(&format!("sessions_{n}_report_p99_ms"), format!("{:.1}", s.p99_ms));
        r.add(&format!("sessions_{n}_transcript_lag_p50_ms"), format!("{:.0}", s.lag_p50_ms));
        r.add(&format!("sessions_{n}_transcript_lag_p99_ms"), format!("{:.0}", s.lag_p99_ms));
        r.add(&format!("sessions_{n}_reports_per_s"), format!("{:.0}", s.reports as f64 / secs as f64));
        if s.p99_ms <= 100.0 && s.lag_p99_ms <= 1_000.0 {
            within = within.max(n);
        }
    }
    r.add("sessions_within_goal", within);
    r.add("sessions_note", format!("each session reports every second (5 lines, usage and spend), measured {secs} s; within goal: report p99 ≤ 100 ms and transcript lag p99 ≤ 1,000 ms; goal 1,000 sessions"));
    Ok(())
}

async fn measure_fleet(b: &Bench, root: &std::path::Path, runs: usize, r: &mut Report) -> Result<()> {
    measure_hosts(b, root, runs, r).await?;
    measure_webhooks(b, runs, r).await
}

/// The peer in each of its configurations, each printed; answers the better one (more chains
/// per second), which the engine is compared against.
async fn measure_peer(b: &Bench, root: &std::path::Path, r: &mut Report) -> Result<peer::Peer> {
    let chains = std::env::var("BENCH_PEER_CHAINS").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000);
    let mut best: Option<peer::Peer> = None;
    for config in peer::CONFIGS {
        let p = peer::graphile_worker(b, root, config, chains).await?;
        r.add(&format!("peer_{config}"), format!("{}; {chains} chains", p.version));
        r.add(&format!("peer_{config}_chains_per_s"), format!("{:.0}", p.chains_per_s));
        r.add(&format!("peer_{config}_wake_p50_ms"), format!("{:.2}", p.wake_p50_ms));
        r.add(&format!("peer_{config}_wake_p99_ms"), format!("{:.2}", p.wake_p99_ms));
        if best.as_ref().is_none_or(|b| p.chains_per_s > b.chains_per_s) {
            best = Some(p);
        }
    }
    let best = best.context("no peer configuration")?;
    r.add("peer", best.version.clone());
    r.add("peer_chains_per_s", format!("{:.0}", best.chains_per_s));
    r.add("peer_wake_p50_ms", format!("{:.2}", best.wake_p50_ms));
    r.add("peer_wake_p99_ms", format!("{:.2}", best.wake_p99_ms));
    Ok(best)
}

async fn measure_wake(b: &Bench, p: &peer::Peer, r: &mut Report) -> Result<()> {
    let w = measures::wake_latency_and_idle(b, 60).await?;
    r.add("wake_p50_ms", format!("{:.2}", w.p50_ms));
    r.add("wake_p99_ms", format!("{:.2}", w.p99_ms));
    r.add("wake_p50_vs_peer", format!("{:.2}", w.p50_ms / p.wake_p50_ms));
    r.add("wake_p99_vs_peer", format!("{:.2}", w.p99_ms / p.wake_p99_ms));
    r.add("idle_statements_60s", w.idle_statements_60s);
    Ok(())
}

async fn measure(b: &Bench, bindir: &std::path::Path, root: &std::path::Path, runs: usize, r: &mut Report) -> Result<()> {
    measure_engine(b, bindir, runs, r).await?;
    let ours = r.lines.iter().find(|(n, _)| n == "engine_runs_per_s").and_then(|(_, v)| v.parse::<f64>().ok()).unwrap_or(0.0);
    let p = measure_peer(b, root, r).await?;
    r.add("engine_runs_per_s_vs_peer", format!("{:.2}", ours / p.chains_per_s));
    measure_hosts(b, root, runs, r).await?;
    measure_wake(b, &p, r).await?;
    r.add("recovery_s", format!("{:.1}", measures::recovery(b).await?));
    measure_webhooks(b, runs, r).await?;
    measure_sessions(b, r).await?;
    if std::env::var("BENCH_SOAK").as_deref() == Ok("1") {
        let s = measures::soak(b, 10).await?;
        r.add("soak_drift_pct", format!("{:.1}", s.drift_pct));
        r.add("soak_table_sizes", s.table_sizes);
    } else {
        r.add("soak_drift_pct", "not measured (set BENCH_SOAK=1)");
    }
    r.add("engine_rss_mb_10k_open", format!("{:.1}", measures::rss_with_open_runs(b, 10_000).await?));
    Ok(())
}

const HEADER: &str = "# Benchmark history\n\nEvery `make bench` run, oldest first; the current figures are in BENCHMARKS.md.\n";

fn pg_bindir() -> Result<PathBuf> {
    let out = std::process::Command::new("pg_config").arg("--bindir").output();
    if let Ok(out) = out {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("pgbench").exists() {
            return Ok(dir);
        }
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")?.filter_map(|e| e.ok()).map(|e| e.path().join("bin")).collect();
    dirs.sort();
    dirs.into_iter().rev().find(|d| d.join("pgbench").exists()).context("pgbench not found; install postgresql-contrib or postgresql")
}

fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
