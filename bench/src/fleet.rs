//! The figures that need the whole fleet: `shopfloor api`, engines without the test executor,
//! `shopfloor host` processes, and GitHub's signed webhooks.
//!
//! - `host_steps_per_s`: runs of the same three-node sequential workflow as
//!   `engine_steps_per_s`, its crew steps run by 4 `shopfloor host` processes (4 slots each)
//!   with the `command` harness running `true` and no repository (a scratch directory, no
//!   git), claimed from one `shopfloor api` and walked by 2 `shopfloor engine` processes
//!   without `--test-executor`. Steps per second from the first step's lease to the last run's
//!   end, database timestamps.
//! - `webhook_deliveries_per_s`, `webhook_p99_ms`: distinct signed `issues.labeled` deliveries
//!   (each a new issue number and delivery id, so none dedups) posted by 16 concurrent clients
//!   to one `shopfloor api` process; each matches a workflow's trigger and opens its run in the
//!   transaction that answers. Deliveries per wall-clock second, and the client-side latency's
//!   99th percentile. Every delivery must be answered 2xx and have made exactly one run (read
//!   back from the database), or the bench fails.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use engine::store::{Actor, Change, installations};
use hmac::{Hmac, Mac};
use secrecy::ExposeSecret as _;
use serde_json::{Value, json};
use sha2::Sha256;

use crate::setup::{Bench, Db, percentile, scalar_i64, steps_and_seconds, submit_many};

/// The three-in-a-row of `engine_steps_per_s`, for hosts: each step runs `true`.
const HOST_SEQUENTIAL: &str = r#"name: three-on-hosts
nodes:
  a:
    crew: { harness: command, command: ["true"], prompt: x }
    requires: [linux, "harness:command"]
  b:
    after: [a]
    crew: { harness: command, command: ["true"], prompt: x }
    requires: [linux, "harness:command"]
  c:
    after: [b]
    crew: { harness: command, command: ["true"], prompt: x }
    requires: [linux, "harness:command"]
"#;

/// Opens a run for every labelled open issue; the run's own work is not measured (no engine
/// runs in the webhook measure).
const ON_LABEL: &str = r#"name: on-label
on:
  github:
    events: [issues.labeled]
    if: "'ready' in item.labels && item.state == 'open'"
nodes:
  start: { trigger: {} }
  done: { after: [start], end: completed }
"#;

pub(crate) const HOSTS: usize = 4;
pub(crate) const HOST_SLOTS: u32 = 4;
pub(crate) const WEBHOOK_CLIENTS: usize = 16;
/// Deliveries sent before the clock starts, ten a client (`webhook_ingest`).
pub(crate) const WEBHOOK_WARMUP: usize = 10 * WEBHOOK_CLIENTS;
const SECRET: &str = "the bench's webhook secret";
const INSTALLATION: i64 = 77;
const REPOSITORY: &str = "Bench/Widgets";

/// A child process, killed when dropped.
pub(crate) struct Proc {
    child: Child,
    what: String,
}

impl Proc {
    fn spawn(cmd: &mut Command, what: &str) -> Result<Proc> {
        let child = cmd.stdout(Stdio::null()).stderr(Stdio::inherit()).spawn().with_context(|| format!("starting {what}"))?;
        Ok(Proc { child, what: what.to_owned() })
    }

    /// Fails when the process has exited: a fleet member that died makes the figure meaningless.
    pub(crate) fn alive(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => bail!("{} exited early: {status}", self.what),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `shopfloor api` on the measure's database, ready when this returns.
pub(crate) async fn api(b: &Bench, db: &Db, secret: Option<&str>) -> Result<(Proc, String)> {
    let port = free_port()?;
    let mut cmd = Command::new(&b.shopfloor);
    cmd.args(["api", "--log", "warn"])
        .env("DATABASE_URL", &db.url)
        .env("SHOPFLOOR_SECRET_KEY", b.key.to_base64().expose_secret())
        .env("SHOPFLOOR_LISTEN", format!("127.0.0.1:{port}"));
    if let Some(s) = secret {
        cmd.env("SHOPFLOOR_GITHUB_WEBHOOK_SECRET", s);
    }
    let mut proc = Proc::spawn(&mut cmd, "shopfloor api")?;
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if http.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
            return Ok((proc, base));
        }
        proc.alive()?;
        ensure!(Instant::now() < deadline, "shopfloor api never became ready at {base}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `shopfloor engine` without the test executor: crew steps are left to hosts.
pub(crate) fn engine(b: &Bench, db: &Db, id: &str) -> Result<Proc> {
    let mut cmd = Command::new(&b.shopfloor);
    cmd.args(["engine", "--engine-id", id, "--log", "warn"]).env("DATABASE_URL", &db.url).env("SHOPFLOOR_SECRET_KEY", b.key.to_base64().expose_secret());
    Proc::spawn(&mut cmd, &format!("shopfloor engine {id}"))
}

/// `shopfloor host` registering with `token`, in a work directory of its own.
fn host(b: &Bench, base: &str, name: &str, work: &Path, token: &str) -> Result<Proc> {
    let mut cmd = Command::new(&b.shopfloor);
    cmd.args(["host", "--log", "warn", "--capabilities", "linux,harness:command", "--server", base, "--name", name])
        .arg("--max-concurrent")
        .arg(HOST_SLOTS.to_string())
        .arg("--work-dir")
        .arg(work)
        .env("SHOPFLOOR_HOST_TOKEN", token)
        .env("SHOPFLOOR_DRAIN_SECS", "2");
    Proc::spawn(&mut cmd, &format!("shopfloor host {name}"))
}

pub(crate) struct HostThroughput {
    pub steps_per_s: f64,
    pub steps: i64,
}

/// `n` runs of three crew steps on 4 hosts (see the module's header).
pub(crate) async fn host_throughput(b: &Bench, root: &Path, n: usize) -> Result<HostThroughput> {
    let (db, seed) = b.database("bench_hosts", HOST_SEQUENTIAL).await?;
    // One registration token per host (a token registers one host), minted as the API would.
    let mut tokens = Vec::with_capacity(HOSTS);
    let mut ch = Change::begin(&db.pool, Actor::System).await?;
    for i in 0..HOSTS {
        let (_, token, _) =
            api::auth::issue_registration_token(&mut ch, &b.key, seed.org, seed.project, &format!("bench host {i}"), chrono::Duration::hours(2)).await?;
        tokens.push(token);
    }
    ch.commit().await?;
    submit_many(&db, &seed, n, 500, json!({})).await?;

    let (mut server, base) = api(b, &db, None).await?;
    let mut fleet = vec![engine(b, &db, "e1")?, engine(b, &db, "e2")?];
    let work: PathBuf = root.join("target/bench-hosts");
    let _ = std::fs::remove_dir_all(&work);
    for (i, token) in tokens.iter().enumerate() {
        let dir = work.join(format!("h{i}"));
        std::fs::create_dir_all(&dir)?;
        fleet.push(host(b, &base, &format!("h{i}"), &dir, token)?);
    }

    let deadline = Instant::now() + Duration::from_secs(1500);
    loop {
        let open = scalar_i64(&db.pool, "SELECT count(*) FROM runs WHERE status = 'running'").await?;
        if open == 0 {
            break;
        }
        server.alive()?;
        for p in &mut fleet {
            p.alive()?;
        }
        if Instant::now() > deadline {
            let states: Vec<(String, i64)> =
                sqlx::query_as("SELECT state, count(*) FROM steps GROUP BY state ORDER BY state").fetch_all(&db.pool).await.unwrap_or_default();
            bail!("{open} of {n} host bench runs still running after 25 minutes; steps by state: {states:?}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    drop(fleet);
    drop(server);

    let failed: Vec<(String, Option<String>, i64)> =
        sqlx::query_as("SELECT status, reason, count(*) FROM runs WHERE status <> 'completed' GROUP BY 1, 2 ORDER BY 3 DESC").fetch_all(&db.pool).await?;
    if !failed.is_empty() {
        bail!("host bench runs did not all complete: {failed:?}");
    }
    let elsewhere = scalar_i64(&db.pool, "SELECT count(*) FROM steps WHERE holder IS NULL OR holder NOT LIKE 'host:%'").await?;
    ensure!(elsewhere == 0, "{elsewhere} steps were not run by a host");
    // Each node's harness ran: a host's answer for `true`, exit code 0, once per node.
    let ran =
        scalar_i64(&db.pool, "SELECT count(*) FROM steps WHERE state = 'succeeded' AND output->>'harness' = 'command' AND output->>'exit_code' = '0'").await?;
    ensure!(ran == 3 * n as i64, "{ran} steps succeeded with the `command` harness's exit code 0, not {}", 3 * n);
    let hosts = scalar_i64(&db.pool, "SELECT count(DISTINCT holder) FROM steps").await?;
    if hosts < HOSTS as i64 {
        eprintln!("host_steps_per_s: only {hosts} of the {HOSTS} hosts ran steps");
    }
    let retried = scalar_i64(&db.pool, "SELECT count(*) FROM steps WHERE attempt > 1").await?;
    if retried > 0 {
        eprintln!("host_steps_per_s: {retried} steps were retried (counted in the figure)");
    }
    let (steps, secs) = steps_and_seconds(&db.pool).await?;
    db.close().await;
    let _ = std::fs::remove_dir_all(&work);
    Ok(HostThroughput { steps_per_s: steps as f64 / secs, steps })
}

pub(crate) struct Webhooks {
    pub per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// `X-Hub-Signature-256` as GitHub computes it: HMAC-SHA256 of the body, hex.
fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(body);
    let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

fn user(login: &str) -> Value {
    json!({ "login": login, "id": 100 + login.len(), "node_id": format!("U_{login}"), "type": "User", "site_admin": false })
}

/// An `issues.labeled` delivery with GitHub's shape: issue `number`, open, labelled `ready` by
/// its author (a MEMBER, so trusted to trigger).
fn labeled(number: i64) -> Value {
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let (owner, name) = REPOSITORY.split_once('/').expect("owner/name");
    json!({
        "action": "labeled",
        "sender": user("alice"),
        "repository": {
            "id": 4_242, "node_id": "R_4242", "name": name, "full_name": REPOSITORY, "private": true,
            "owner": { "login": owner, "id": 1, "type": "Organization" },
            "html_url": format!("https://github.com/{REPOSITORY}"), "default_branch": "main", "visibility": "private",
        },
        "organization": { "login": owner, "id": 1, "node_id": "O_1" },
        "installation": { "id": INSTALLATION, "node_id": format!("MDIz{INSTALLATION}") },
        "label": { "id": 5, "node_id": "LA_ready", "name": "ready", "color": "ededed", "default": false },
        "issue": {
            "id": 90_000 + number, "node_id": format!("I_4242_{number}"), "number": number,
            "title": format!("Bench issue {number}"), "body": "Measured.", "state": "open", "state_reason": null,
            "locked": false, "comments": 0, "user": user("alice"), "author_association": "MEMBER",
            "labels": [{ "id": 5, "node_id": "LA_ready", "name": "ready", "color": "ededed", "default": false, "description": null }],
            "assignees": [], "assignee": null, "milestone": null,
            "url": format!("https://api.github.com/repos/{REPOSITORY}/issues/{number}"),
            "html_url": format!("https://github.com/{REPOSITORY}/issues/{number}"),
            "repository_url": format!("https://api.github.com/repos/{REPOSITORY}"),
            "created_at": "2024-05-01T10:00:00Z", "updated_at": now, "closed_at": null,
        },
    })
}

/// A delivery's id, body and signature.
type Signed = (String, Vec<u8>, String);

/// What a client saw of one delivery: its id, the status, the latency and the answer's body.
type Answer = (String, u16, Duration, Value);

/// Posts one signed delivery as GitHub does.
async fn post(http: &reqwest::Client, url: &str, (delivery, body, signature): Signed) -> Result<Answer> {
    let sent = Instant::now();
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .header("user-agent", "GitHub-Hookshot/bench")
        .header("x-github-event", "issues")
        .header("x-github-delivery", &delivery)
        .header("x-github-hook-id", "1")
        .header("x-github-hook-installation-target-type", "integration")
        .header("x-hub-signature-256", signature)
        .body(body)
        .send()
        .await
        .with_context(|| format!("posting delivery {delivery}"))?;
    let status = response.status().as_u16();
    let answer: Value = response.json().await.unwrap_or(Value::Null);
    Ok((delivery, status, sent.elapsed(), answer))
}

/// `n` signed deliveries from 16 concurrent clients to one `shopfloor api` (see the module's
/// header).
pub(crate) async fn webhook_ingest(b: &Bench, n: usize) -> Result<Webhooks> {
    let (db, seed) = b.database("bench_webhooks", ON_LABEL).await?;
    let mut ch = Change::begin(&db.pool, Actor::System).await?;
    // As GitHub's `installation` webhook would announce it, then claimed and connected.
    let announced = installations::Announced { id: INSTALLATION, account: "Bench".into(), repositories: Some(vec![REPOSITORY.into()]), ..Default::default() };
    installations::announce(&mut ch, &announced).await?;
    installations::claim(&mut ch, seed.org, INSTALLATION).await?;
    installations::connect_repository(&mut ch, seed.org, seed.project, INSTALLATION, REPOSITORY).await?;
    ch.commit().await?;
    let (mut server, base) = api(b, &db, Some(SECRET)).await?;
    let url = format!("{base}/webhooks/github");

    // Bodies are built and signed before the clock starts: the figure is the server's. Each
    // client first sends its share of the warm-up, on the connection it keeps: the server's
    // pool connections are opened, its statements prepared and the workflow parsed before the
    // clock starts, as on a server that has been up for a while (GitHub's deliveries reach a
    // running one).
    let total = n + WEBHOOK_WARMUP;
    let mut bodies: Vec<(Vec<Signed>, Vec<Signed>)> = vec![(Vec::new(), Vec::new()); WEBHOOK_CLIENTS];
    for i in 0..total {
        let body = serde_json::to_vec(&labeled(1_000 + i as i64))?;
        let signature = sign(SECRET, &body);
        let (warm, measured) = &mut bodies[i % WEBHOOK_CLIENTS];
        let list = if i < WEBHOOK_WARMUP { warm } else { measured };
        list.push((format!("bench-{i}"), body, signature));
    }
    let ready = std::sync::Arc::new(tokio::sync::Barrier::new(WEBHOOK_CLIENTS + 1));
    let mut tasks = tokio::task::JoinSet::new();
    for (warm, mine) in bodies {
        let url = url.clone();
        let ready = ready.clone();
        tasks.spawn(async move {
            let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
            let mut warmed = Vec::with_capacity(warm.len());
            for signed in warm {
                warmed.push(post(&http, &url, signed).await?);
            }
            ready.wait().await;
            let mut answers = Vec::with_capacity(mine.len());
            for signed in mine {
                answers.push(post(&http, &url, signed).await?);
            }
            anyhow::Ok((warmed, answers))
        });
    }
    ready.wait().await;
    let started = Instant::now();
    let mut warmed = Vec::with_capacity(WEBHOOK_WARMUP);
    let mut answers = Vec::with_capacity(n);
    while let Some(done) = tasks.join_next().await {
        let (w, a) = done.context("a webhook client panicked")??;
        warmed.extend(w);
        answers.extend(a);
    }
    let wall = started.elapsed().as_secs_f64();
    server.alive()?;
    drop(server);

    ensure!(warmed.len() == WEBHOOK_WARMUP, "{} answers for {WEBHOOK_WARMUP} warm-up deliveries", warmed.len());
    ensure!(answers.len() == n, "{} answers for {n} deliveries", answers.len());
    let refused: Vec<_> = answers.iter().chain(&warmed).filter(|a| !(200..300).contains(&a.1)).collect();
    ensure!(
        refused.is_empty(),
        "{} deliveries not answered 2xx, e.g. {:?}",
        refused.len(),
        refused.iter().take(3).map(|a| (&a.0, a.1, &a.3)).collect::<Vec<_>>()
    );
    let not_one: Vec<_> = answers.iter().chain(&warmed).filter(|a| a.3["runs_opened"].as_i64() != Some(1)).collect();
    ensure!(
        not_one.is_empty(),
        "{} deliveries did not answer one run opened, e.g. {:?}",
        not_one.len(),
        not_one.iter().take(3).map(|a| (&a.0, &a.3)).collect::<Vec<_>>()
    );
    // Read back: every delivery recorded, and exactly one run made from each.
    let runs = scalar_i64(&db.pool, "SELECT count(*) FROM runs").await?;
    ensure!(runs == total as i64, "{runs} runs for {total} deliveries");
    let one_each: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM github_deliveries d WHERE d.delivery_id LIKE 'bench-%' AND \
           (SELECT count(*) FROM runs r JOIN trigger_events e ON e.event_id = r.trigger_event_id WHERE e.delivery_id = d.delivery_id) = 1",
    )
    .fetch_one(&db.pool)
    .await?;
    ensure!(one_each == total as i64, "{one_each} of {total} deliveries are recorded with exactly one run");
    if std::env::var("BENCH_PROFILE").as_deref() == Ok("1") {
        crate::measures::print_top_statements(&db, total).await?;
    }
    db.close().await;

    let mut ms: Vec<f64> = answers.iter().map(|a| a.2.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    Ok(Webhooks { per_s: n as f64 / wall, p50_ms: percentile(&ms, 0.50), p99_ms: percentile(&ms, 0.99) })
}
