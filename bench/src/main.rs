//! `make bench`: shopfloor's engine measured against the machine's own durable-commit limit.
//!
//! Starts its own PostgreSQL cluster with durable defaults (fsync and synchronous commit on),
//! measures every figure in one run, prints each as a `name: value` line, and appends the run
//! with the machine, the date and the commit to BENCHMARKS.md. Figures are ratios or counts
//! measured in the same run; nothing here is a pass/fail timing.

mod measures;
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
    let b = Bench { admin_url: pg.url.clone(), shopfloor };
    let mut r = Report { lines: Vec::new() };

    // BENCH_ONLY=engine measures the engine's throughput alone, for quick iterations; such a
    // partial run is printed but not recorded.
    let only_engine = std::env::var("BENCH_ONLY").as_deref() == Ok("engine");
    let result = if only_engine { measure_engine(&b, &bindir, runs, &mut r).await } else { measure(&b, &bindir, runs, &mut r).await };
    let _ = pg.stop();
    result?;
    if only_engine {
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
    let path = root.join("BENCHMARKS.md");
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

async fn measure(b: &Bench, bindir: &std::path::Path, runs: usize, r: &mut Report) -> Result<()> {
    measure_engine(b, bindir, runs, r).await?;
    r.add("host_steps_per_s", "not built (the host agent does not exist yet)");
    let w = measures::wake_latency_and_idle(b, 60).await?;
    r.add("wake_p50_ms", format!("{:.1}", w.p50_ms));
    r.add("wake_p99_ms", format!("{:.1}", w.p99_ms));
    r.add("idle_statements_60s", w.idle_statements_60s);
    r.add("recovery_s", format!("{:.1}", measures::recovery(b).await?));
    r.add("webhook_deliveries_per_s", "not built (GitHub webhooks do not exist yet)");
    r.add("webhook_p99_ms", "not built (GitHub webhooks do not exist yet)");
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

const HEADER: &str = "# Benchmarks\n\n`make bench` appends one section per run. Every figure is measured in the same run on the \
same machine; ratios compare the engine with PostgreSQL's own durable-commit limit there (pgbench).\n\nTargets: \
`engine_runs_per_s_vs_pgbench_tps` ≥ 0.20; `wake_p50_ms` ≤ 3, `wake_p99_ms` ≤ 10; `idle_statements_60s` = 0; \
`recovery_s` ≤ 45; `soak_drift_pct` within ±10; `engine_rss_mb_10k_open` ≤ 150.\n";

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
