//! The peer: graphile-worker, the Node.js job queue on PostgreSQL with LISTEN/NOTIFY, pinned in
//! `bench/peer/package.json` and run by `bench/peer/chains.mjs` on a database of the bench's own
//! cluster, in the same run as the engine's figures, in each configuration its documentation
//! gives for throughput ([`CONFIGS`]); the engine is compared against the better. `make bench`
//! installs it under `target/peer` (npm) and copies the script beside it.

use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, Result, bail};

use crate::setup::{Bench, with_database};

/// The peer's figures, as `chains.mjs` printed them.
pub(crate) struct Peer {
    pub version: String,
    pub chains_per_s: f64,
    pub wake_p50_ms: f64,
    pub wake_p99_ms: f64,
}

/// The peer's configurations (`PEER_CONFIG` of `chains.mjs`): its default worker at a
/// concurrency equal to its pool, and its performance page's batched settings.
pub(crate) const CONFIGS: [&str; 2] = ["pool", "batched"];

/// Chains of three jobs (each enqueues the next) and the idle worker's wake latency, with the
/// peer in `config`.
pub(crate) async fn graphile_worker(b: &Bench, root: &Path, config: &str, chains: usize) -> Result<Peer> {
    let script = root.join("target/peer/chains.mjs");
    anyhow::ensure!(script.exists(), "{} is missing: run `make bench`, which installs the peer", script.display());
    let admin = engine::db::connect(&b.admin_url, 1).await?;
    sqlx::query("DROP DATABASE IF EXISTS peer WITH (FORCE)").execute(&admin).await?;
    sqlx::query("CREATE DATABASE peer").execute(&admin).await?;
    admin.close().await;
    let out = tokio::process::Command::new("node")
        .arg(&script)
        .env("PEER_DATABASE_URL", with_database(&b.admin_url, "peer"))
        .env("PEER_CONFIG", config)
        .env("PEER_CHAINS", chains.to_string())
        .env("PEER_WAKES", crate::measures::WAKES.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .await
        .context("run the peer (node)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("the peer failed ({}): {text}", out.status);
    }
    let field = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(&format!("{name}: "))).map(str::to_owned).with_context(|| format!("the peer printed no {name}: {text}"))
    };
    let number = |name: &str| -> Result<f64> { field(name)?.parse().with_context(|| format!("the peer's {name} is not a number")) };
    Ok(Peer {
        version: field("peer_version")?,
        chains_per_s: number("peer_chains_per_s")?,
        wake_p50_ms: number("peer_wake_p50_ms")?,
        wake_p99_ms: number("peer_wake_p99_ms")?,
    })
}
