//! What every measure needs: a fresh database on the bench cluster, a seeded workflow, engine
//! processes, and waiting on the database.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use engine::ids::{OrgId, ProjectId, RunId, Slug, WorkflowId};
use engine::store::runs::{self, NewRun};
use engine::store::{Actor, Change, admission, tenants, workflows};

pub(crate) struct Bench {
    /// The cluster's URL for the `postgres` database; measures make databases of their own.
    pub admin_url: String,
    pub shopfloor: PathBuf,
    /// The `SHOPFLOOR_SECRET_KEY` of every process the measures start, and of the tokens they
    /// mint themselves.
    pub key: engine::sealing::SecretKey,
}

pub(crate) struct Db {
    pub url: String,
    pub pool: engine::db::Db,
    pub name: String,
}

pub(crate) struct Seed {
    pub org: OrgId,
    pub project: ProjectId,
    pub workflow: WorkflowId,
    pub version: i32,
}

impl Bench {
    /// A new, migrated database with one workflow.
    pub(crate) async fn database(&self, name: &str, workflow: &str) -> Result<(Db, Seed)> {
        let admin = engine::db::connect(&self.admin_url, 1).await?;
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&admin).await?;
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin).await?;
        admin.close().await;
        let url = with_database(&self.admin_url, name);
        let pool = engine::db::connect(&url, 8).await?;
        engine::db::migrate(&pool).await?;
        engine::definition::parse(workflow).map_err(|p| anyhow::anyhow!("bench workflow does not validate: {p:?}"))?;
        let mut ch = Change::begin(&pool, Actor::System).await?;
        let (org, _) = tenants::create_org(&mut ch, &Slug::parse("bench")?, "bench", "bench@example.com").await?;
        let project = tenants::create_project(&mut ch, org, &Slug::parse("bench")?, "bench").await?;
        // The default cap (50 running runs) would measure admission's line, not the engine.
        admission::set_running_cap(&mut ch, org, 1_000_000).await?;
        let (workflow, version) = workflows::put_version(&mut ch, org, project, "bench", workflow).await?;
        ch.commit().await?;
        Ok((Db { url, pool, name: name.to_owned() }, Seed { org, project, workflow, version }))
    }

    /// A `shopfloor engine` process with the test executor.
    pub(crate) fn engine(&self, db: &Db, id: &str) -> Result<Engine> {
        let child = Command::new(&self.shopfloor)
            .args(["engine", "--test-executor", "--engine-id", id, "--log", "warn"])
            .env("DATABASE_URL", &db.url)
            .env("SHOPFLOOR_SECRET_KEY", secrecy::ExposeSecret::expose_secret(&self.key.to_base64()))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", self.shopfloor.display()))?;
        Ok(Engine { child })
    }
}

pub(crate) struct Engine {
    pub child: Child,
}

impl Engine {
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Resident memory in MiB, from /proc.
    pub(crate) fn rss_mb(&self) -> Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let kb: f64 =
            status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()).context("no VmRSS")?;
        Ok(kb / 1024.0)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

pub(crate) fn new_run(s: &Seed, input: serde_json::Value) -> NewRun {
    NewRun::of_workflow(s.org, s.project, s.workflow, s.version, input)
}

/// Submits `n` runs, `per_tx` to a transaction.
pub(crate) async fn submit_many(db: &Db, s: &Seed, n: usize, per_tx: usize, input: serde_json::Value) -> Result<Vec<RunId>> {
    let mut ids = Vec::with_capacity(n);
    while ids.len() < n {
        let mut ch = Change::begin(&db.pool, Actor::System).await?;
        for _ in 0..(n - ids.len()).min(per_tx) {
            ids.push(runs::submit(&mut ch, new_run(s, input.clone())).await?);
        }
        ch.commit().await?;
    }
    Ok(ids)
}

/// The `p` quantile (0 to 1) of `sorted` (ascending), the nearest rank; NaN when empty.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

pub(crate) async fn scalar_i64(pool: &engine::db::Db, sql: &str) -> Result<i64> {
    sqlx::query_scalar(sql).fetch_one(pool).await.with_context(|| sql.to_owned())
}

pub(crate) async fn scalar_f64(pool: &engine::db::Db, sql: &str) -> Result<f64> {
    let v: Option<f64> = sqlx::query_scalar(sql).fetch_one(pool).await.with_context(|| sql.to_owned())?;
    v.context("no value")
}

/// The steps taken, and the seconds from the first step's start to the last run's end: what a
/// throughput figure divides by.
pub(crate) async fn steps_and_seconds(pool: &engine::db::Db) -> Result<(i64, f64)> {
    let secs = scalar_f64(pool, "SELECT extract(epoch FROM (SELECT max(ended_at) FROM runs) - (SELECT min(started_at) FROM steps))::float8").await?;
    Ok((scalar_i64(pool, "SELECT count(*) FROM steps").await?, secs))
}

/// Waits until `sql` (a count) reaches `want`, checking every second (the harness reads; the
/// engines never poll).
pub(crate) async fn until_count(pool: &engine::db::Db, sql: &str, want: i64, limit: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let n = scalar_i64(pool, sql).await.unwrap_or(-1);
        if n >= want {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out after {limit:?}: `{sql}` is {n}, wanted {want}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

pub(crate) fn with_database(url: &str, name: &str) -> String {
    match url.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => url.to_owned(),
    }
}

impl Db {
    pub(crate) async fn close(self) {
        self.pool.close().await;
    }
}
