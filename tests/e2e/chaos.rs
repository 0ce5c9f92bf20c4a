//! The chaos suite: many runs of a workflow with a join, a gate loop, an approval, a timed
//! wait and leased steps, on three engine processes, while a driver SIGKILLs a random engine
//! every 2–5 s and starts it again, cuts one engine's database link through a loopback proxy
//! for 5 s, and restarts PostgreSQL once. Afterwards no run may be lost or end otherwise than
//! it should, no step attempt may have run twice, no run's events may skip a number and no
//! step change may lack its audit entry.
//!
//! It also stalls one engine once (SIGSTOP) for longer than a lease and its grace, then lets
//! it go on (SIGCONT): its steps are recovered and run again elsewhere meanwhile, and when it
//! wakes it finishes the old attempts and tries to report them, which the fence must refuse.
//! A killed engine never reports late, so this is the one fault that proves the fence
//! (DESIGN.md: a lease that lapses while its holder still lives is the commonest cause of
//! double execution).
//!
//! `CHAOS_RUNS` is the number of runs (300 by default, sized for `make test`'s budget of three
//! minutes on two cores; `make chaos` runs 2000) and `CHAOS_SEED` seeds every random choice of
//! the driver: the seed is printed first, so a failing schedule can be replayed. The timing of
//! the processes is not reproducible, the driver's random choices are. The suite runs a PostgreSQL
//! cluster of its own, because it restarts it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::OpenOptions;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use engine::cluster::{self, Cluster, ClusterOptions};
use engine::ids::RunId;
use engine::store::steps::{LEASE, LEASE_GRACE};
use engine::store::{approvals, runs, Actor, Change, StoreError};
use serde_json::{json, Map, Value};
use shopfloor_tests::proxy::Proxy;
use shopfloor_tests::{check_invariants, effects_count, scalar, seed, shopfloor_bin, EngineProcess, Invariants, Seed};
use engine::db::Db;
use tokio::time::Instant;

/// A join (`left` and `right` after `plan`), a gate that fails its first visit and loops back
/// to `left`, an approval the driver answers, a short wait, and leased steps throughout.
const WORKFLOW: &str = "name: chaos
nodes:
  plan:
    crew: { harness: claude-code, prompt: plan }
  left:
    after: [plan]
    crew: { harness: claude-code, prompt: left }
  right:
    after: [plan]
    crew: { harness: claude-code, prompt: right }
  ci:
    after: [left, right]
    gate: { checks: [test], on_fail: left }
  ask:
    after: [ci]
    approval:
      prompt: Ship it?
  nap:
    after: [ask]
    wait: { for: 1s }
  ship:
    after: [nap]
    output: { github: comment, body: shipped }
";

/// The nodes and visits that succeed in a run that ends as it should: the gate's first visit
/// fails and sends the run back through `left` once.
const SUCCEEDED: [(&str, i32); 8] = [("plan", 1), ("left", 1), ("right", 1), ("left", 2), ("ci", 2), ("ask", 1), ("nap", 1), ("ship", 1)];

/// The leased nodes, each given its own random duration per run.
const LEASED: [&str; 5] = ["plan", "left", "right", "ci", "ship"];

/// The engine behind the proxy, `c`.
const PROXIED: usize = 2;
const DEFAULT_RUNS: usize = 300;
const DEFAULT_SEED: u64 = 20_240_611;
/// The driver's pace: runs are submitted, approvals answered and dead engines noticed this often.
const TICK: Duration = Duration::from_millis(100);
/// A running engine is killed every 2 to 5 s.
const KILL_EVERY: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(5));
/// Runs are submitted in bursts this far apart, each of the runs that came due since the last,
/// so engines claim and record in batches across runs and a kill often lands on a full hand.
const BURST_EVERY: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(5));
const CUT: Duration = Duration::from_secs(5);
/// Longer than a lease and its grace, so the stalled engine's steps are recovered before it
/// wakes; the margin lets another engine claim the recovery on a busy machine.
const STALL: Duration = Duration::from_secs(LEASE.as_secs() + LEASE_GRACE.as_secs() + 5);
/// An engine that exited by itself (it started while its database was away) is started again
/// after this long.
const REVIVE_AFTER: Duration = Duration::from_secs(1);
/// Runs submitted per transaction.
const SUBMIT_BATCH: usize = 50;
/// Approvals answered per transaction.
const APPROVE_BATCH: i64 = 100;

/// splitmix64: a seeded generator small enough to keep here, so the schedule depends on the
/// seed alone and not on a crate's version.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn duration(&mut self, (lo, hi): (Duration, Duration)) -> Duration {
        Duration::from_millis(self.between(lo.as_millis() as u64, hi.as_millis() as u64))
    }
}

/// One of the three engines; each start is a new incarnation with its own id (`b3`), as a
/// restarted process gets a new pid, so steps held by a killed incarnation can be told apart.
struct Slot {
    name: &'static str,
    /// Whether this engine reaches PostgreSQL through the proxy.
    proxied: bool,
    incarnation: u32,
    process: Option<EngineProcess>,
    started_at: Instant,
    down_since: Option<Instant>,
    /// Set while the process is stopped with SIGSTOP, until it is continued.
    stalled_until: Option<Instant>,
}

/// What the driver did, for the report.
#[derive(Debug, Default)]
struct Figures {
    kills: u64,
    starts: u64,
    /// Engines that exited by themselves: started while PostgreSQL or the proxy was away.
    exits: u64,
    approvals: u64,
    submit_retries: u64,
    running_at_restart: i64,
    held_at_restart: i64,
    running_at_cut: i64,
    held_at_cut: i64,
    stalled: String,
    held_at_stall: i64,
}

/// A time when PostgreSQL was away from every engine (`all`) or from the proxied one.
struct Fault {
    from: Instant,
    to: Instant,
    all: bool,
}

impl Fault {
    /// An engine started at `t` may fail its start on this fault: its connection probe and
    /// schema check may each wait up to 10 s.
    fn overlaps_start(&self, t: Instant) -> bool {
        t + STARTUP >= self.from && t <= self.to
    }
}

/// How long an engine's start may take: its connection probe and its pool's first acquire
/// each give up after 10 s.
const STARTUP: Duration = Duration::from_secs(20);

struct Driver {
    rng: Rng,
    faults: Vec<Fault>,
    dir: PathBuf,
    effects: PathBuf,
    direct_url: String,
    proxied_url: String,
    slots: Vec<Slot>,
    figures: Figures,
}

impl Driver {
    fn start(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.incarnation += 1;
        let id = format!("{}{}", slot.name, slot.incarnation);
        let url = if slot.proxied { &self.proxied_url } else { &self.direct_url };
        // Each engine's log goes to a file of its own, kept when the suite fails.
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("engine-{}.log", slot.name)))
            .expect("open the engine's log");
        let child = Command::new(shopfloor_bin())
            .args(["engine", "--test-executor", "--engine-id", &id, "--log", "info"])
            .arg("--test-effects")
            .arg(&self.effects)
            .env("DATABASE_URL", url)
            .env("SHOPFLOOR_LISTEN_DATABASE_URL", url)
            .env("SHOPFLOOR_DRAIN_SECS", "5")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn shopfloor engine");
        slot.process = Some(EngineProcess { child, id });
        slot.started_at = Instant::now();
        slot.down_since = None;
        self.figures.starts += 1;
    }

    /// SIGKILLs a random live engine and starts it again at once. A stalled engine is left
    /// alone: it has to wake up and report late for the stall to prove anything.
    fn kill_one(&mut self) {
        let alive: Vec<usize> = (0..self.slots.len()).filter(|&i| self.slots[i].process.is_some() && self.slots[i].stalled_until.is_none()).collect();
        if alive.is_empty() {
            return;
        }
        let i = alive[self.rng.between(0, alive.len() as u64 - 1) as usize];
        if let Some(mut p) = self.slots[i].process.take() {
            p.kill();
            self.figures.kills += 1;
        }
        self.start(i);
    }

    /// The holder name of engine `i`'s current incarnation (steps held by the killed ones
    /// only wait for recovery).
    fn holder(&self, i: usize) -> String {
        format!("engine:{}", self.slots[i].process.as_ref().map_or("-", |p| p.id.as_str()))
    }

    fn holders(&self) -> Vec<String> {
        (0..self.slots.len()).map(|i| self.holder(i)).collect()
    }

    /// Stops engine `i` (SIGSTOP) for `d`; returns its id.
    fn stall(&mut self, i: usize, d: Duration) -> String {
        let slot = &mut self.slots[i];
        let p = slot.process.as_ref().expect("a stalled engine is running");
        signal(p, libc::SIGSTOP);
        slot.stalled_until = Some(Instant::now() + d);
        p.id.clone()
    }

    /// Continues (SIGCONT) a stalled engine whose time is up; true when one was.
    fn resume_due(&mut self) -> bool {
        let mut resumed = false;
        for slot in &mut self.slots {
            if slot.stalled_until.is_some_and(|t| Instant::now() >= t) {
                if let Some(p) = &slot.process {
                    signal(p, libc::SIGCONT);
                }
                slot.stalled_until = None;
                resumed = true;
            }
        }
        resumed
    }

    /// Notices engines that exited by themselves and starts them again after a pause.
    ///
    /// A running engine never exits on its own: it retries whatever the database does. Only
    /// a start can fail, when the database is away while the engine connects and checks the
    /// schema, so an engine that exits after starting outside every fault means the harness
    /// is broken (a binary built for another schema, say), and the suite stops and says why
    /// rather than pass without engines.
    fn revive(&mut self) {
        for i in 0..self.slots.len() {
            let slot = &mut self.slots[i];
            if let Some(p) = &mut slot.process {
                if let Ok(Some(status)) = p.child.try_wait() {
                    let why = last_line(&self.dir.join(format!("engine-{}.log", slot.name)));
                    let expected = self.faults.iter().any(|f| (f.all || slot.proxied) && f.overlaps_start(slot.started_at));
                    assert!(expected, "engine {} exited by itself ({status}) though its database was reachable: {why}", p.id);
                    println!("chaos: engine {} could not start while its database was away: {why}", p.id);
                    slot.process = None;
                    slot.down_since = Some(Instant::now());
                    self.figures.exits += 1;
                }
            }
            if slot.down_since.is_some_and(|t| t.elapsed() >= REVIVE_AFTER) {
                self.start(i);
            }
        }
    }
}

fn signal(p: &EngineProcess, sig: libc::c_int) {
    // SAFETY: sending a signal to our own child process by its pid; it has not been waited
    // for, so the pid is still its own.
    let sent = unsafe { libc::kill(p.child.id() as libc::pid_t, sig) };
    assert_eq!(sent, 0, "signal {sig} to engine {}: {}", p.id, std::io::Error::last_os_error());
}

/// A run's input: a random duration for each leased node, and the gate's failing first visit.
fn input(rng: &mut Rng) -> Value {
    let step_ms: Map<String, Value> = LEASED.iter().map(|n| ((*n).to_owned(), json!(rng.between(20, 200)))).collect();
    json!({ "test": { "step_ms": step_ms, "gate_fail_visits": [1] } })
}

/// Submits runs in one transaction.
async fn submit(pool: &Db, s: &Seed, inputs: Vec<Value>) -> Result<(), StoreError> {
    let mut ch = Change::begin(pool, Actor::System).await?;
    for input in inputs {
        let new = runs::NewRun {
            org: s.org,
            project: s.project,
            workflow: s.workflow,
            version: s.version,
            input,
            item: None,
            trigger_event: None,
            parent: None,
            dry_run: false,
            needs_approval: false,
            source: None,
        };
        runs::submit(&mut ch, new).await?;
    }
    ch.commit().await
}

/// Approves every waiting approval, a batch per transaction; returns how many.
async fn answer_approvals(pool: &Db, s: &Seed) -> Result<u64, StoreError> {
    let waiting: Vec<(RunId, String)> = sqlx::query_as(
        "SELECT a.run_id, a.node FROM approvals a JOIN steps st USING (step_id) \
         WHERE a.decision IS NULL AND st.state = 'waiting' ORDER BY a.run_id LIMIT $1",
    )
    .bind(APPROVE_BATCH)
    .fetch_all(pool)
    .await?;
    if waiting.is_empty() {
        return Ok(0);
    }
    let mut ch = Change::begin(pool, Actor::System).await?;
    for (run, node) in &waiting {
        approvals::approve(&mut ch, s.org, *run, node, &Map::new()).await?;
    }
    ch.commit().await?;
    Ok(waiting.len() as u64)
}

/// Runs still `running`, or `None` while the database is away.
async fn running(pool: &Db) -> Option<i64> {
    sqlx::query_scalar("SELECT count(*) FROM runs WHERE status = 'running'").fetch_one(pool).await.ok()
}

/// Steps leased or running under these holders; 0 while the database is away.
async fn held(pool: &Db, holders: &[String]) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM steps WHERE state IN ('leased', 'running') AND holder = ANY($1)")
        .bind(holders)
        .fetch_one(pool)
        .await
        .unwrap_or(0)
}

/// Stops the suite's cluster however the test ends.
struct StopCluster(ClusterOptions);

impl Drop for StopCluster {
    fn drop(&mut self) {
        if let Err(e) = cluster::stop_dir(&self.0) {
            eprintln!("chaos: could not stop the cluster in {}: {e}", self.0.data_dir.display());
        }
    }
}

/// Stops the cluster without blocking the runtime's workers (the proxy relays meanwhile).
async fn stop(pg: Cluster) {
    tokio::task::spawn_blocking(move || pg.stop()).await.expect("the stop task").expect("stop PostgreSQL");
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("{name}={v} is not a number")),
        Err(_) => default,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn engines_killed_cut_off_and_restarted_lose_nothing() {
    let runs_total: usize = env_or("CHAOS_RUNS", DEFAULT_RUNS);
    let seed_value: u64 = env_or("CHAOS_SEED", DEFAULT_SEED);
    // Runs arrive over the whole window, so every fault lands on runs in flight; 8 a second on
    // average keeps the engines far from their limit, so what is measured is recovery, not a
    // backlog.
    let window = Duration::from_secs((runs_total as u64 / 8).clamp(60, 300));
    println!("chaos: seed {seed_value} (set CHAOS_SEED to replay), {runs_total} runs over {} s", window.as_secs());
    let mut rng = Rng(seed_value);
    let began = Instant::now();

    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let opts = ClusterOptions { data_dir: dir.path().join("cluster"), durable: false };
    let pg = cluster::ensure_running(&opts).await.unwrap();
    let _stop_cluster = StopCluster(opts.clone());
    let port = pg.port;
    let pool = engine::db::connect(&pg.url, 4).await.unwrap();
    engine::db::migrate(&pool).await.unwrap();
    let s = seed(&pool, WORKFLOW).await;
    let proxy = Proxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await.unwrap();

    let slots = [("a", false), ("b", false), ("c", true)]
        .map(|(name, proxied)| Slot { name, proxied, incarnation: 0, process: None, started_at: Instant::now(), down_since: None, stalled_until: None })
        .into();
    let mut d = Driver {
        rng: Rng(rng.next()),
        faults: Vec::new(),
        dir: dir.path().to_owned(),
        effects: dir.path().join("effects"),
        direct_url: pg.url.clone(),
        proxied_url: proxy.url_for(&pg.url),
        slots,
        figures: Figures::default(),
    };
    for i in 0..d.slots.len() {
        d.start(i);
    }

    // The schedule: the stall early, so that it ends within the window (it takes most of the
    // short one), the restart in the first half of the window and the cut in the second, so
    // those two never overlap; kills throughout.
    let start = Instant::now();
    let stall_at = start + rng.duration((Duration::from_secs(2), window.saturating_sub(STALL).max(Duration::from_secs(3))));
    let stalled_slot = rng.between(0, 1) as usize;
    let mut stalled = false;
    let mut resumed = false;
    let restart_at = start + window.mul_f64(rng.between(25, 45) as f64 / 100.0);
    let cut_at = start + window.mul_f64(rng.between(55, 75) as f64 / 100.0);
    let mut pg = Some(pg);
    let mut restarted = false;
    let mut cut = false;
    let mut next_kill = start + d.rng.duration(KILL_EVERY);
    let mut next_burst = start;
    let mut submitted = 0usize;
    let mut pending_inputs: Vec<Value> = Vec::new();

    // The chaos: until the window is over, every run is submitted and every fault has happened.
    loop {
        let now = Instant::now();
        if now >= next_burst {
            let due = ((runs_total as f64 * (now - start).as_secs_f64() / window.as_secs_f64()).ceil() as usize).min(runs_total);
            while submitted + pending_inputs.len() < due {
                pending_inputs.push(input(&mut rng));
            }
            next_burst = now + rng.duration(BURST_EVERY);
        }
        if !pending_inputs.is_empty() {
            let batch: Vec<Value> = pending_inputs.iter().take(SUBMIT_BATCH).cloned().collect();
            let n = batch.len();
            match submit(&pool, &s, batch).await {
                Ok(()) => {
                    pending_inputs.drain(..n);
                    submitted += n;
                }
                // A commit may fail after the server committed it: count what is there, so a
                // retry never submits a run twice. Only the driver creates runs.
                Err(_) => {
                    d.figures.submit_retries += 1;
                    if let Ok(there) = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM runs").fetch_one(&pool).await {
                        let there = there as usize;
                        pending_inputs.drain(..(there - submitted).min(pending_inputs.len()));
                        submitted = there;
                    }
                }
            }
        }
        if let Ok(n) = answer_approvals(&pool, &s).await {
            d.figures.approvals += n;
        }
        d.revive();

        // The restart and the cut wait for a moment when steps are held (bursts come and go),
        // since a fault that finds nothing in flight proves little; past the window they go
        // ahead regardless.
        let late = now - start >= window;
        if !restarted && now >= restart_at && (late || held(&pool, &d.holders()).await > 0) {
            restarted = true;
            d.figures.running_at_restart = running(&pool).await.unwrap_or(-1);
            d.figures.held_at_restart = held(&pool, &d.holders()).await;
            println!(
                "chaos: restarting PostgreSQL at {:.1} s: {} runs running, {} steps held",
                (now - start).as_secs_f64(),
                d.figures.running_at_restart,
                d.figures.held_at_restart
            );
            let from = Instant::now();
            stop(pg.take().expect("the cluster")).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let again = cluster::ensure_running(&opts).await.unwrap();
            assert_eq!(again.port, port, "PostgreSQL came back on another port; the engines' URLs name the old one");
            pg = Some(again);
            d.faults.push(Fault { from, to: Instant::now(), all: true });
        }
        if !cut && now >= cut_at && (late || held(&pool, &[d.holder(PROXIED)]).await > 0) {
            cut = true;
            d.figures.running_at_cut = running(&pool).await.unwrap_or(-1);
            d.figures.held_at_cut = held(&pool, &[d.holder(PROXIED)]).await;
            println!(
                "chaos: cutting engine c's database link for {} s at {:.1} s: {} runs running, {} steps held by c",
                CUT.as_secs(),
                (now - start).as_secs_f64(),
                d.figures.running_at_cut,
                d.figures.held_at_cut
            );
            proxy.cut_for(CUT);
            d.faults.push(Fault { from: now, to: now + CUT, all: false });
        }
        if !stalled && now >= stall_at && d.slots[stalled_slot].process.is_some() && (late || held(&pool, &[d.holder(stalled_slot)]).await > 0) {
            stalled = true;
            d.figures.held_at_stall = held(&pool, &[d.holder(stalled_slot)]).await;
            d.figures.stalled = d.stall(stalled_slot, STALL);
            println!(
                "chaos: stalling engine {} (SIGSTOP) for {} s at {:.1} s: it holds {} steps",
                d.figures.stalled,
                STALL.as_secs(),
                (now - start).as_secs_f64(),
                d.figures.held_at_stall
            );
        }
        if d.resume_due() {
            resumed = true;
            println!("chaos: engine {} continues (SIGCONT) at {:.1} s", d.figures.stalled, start.elapsed().as_secs_f64());
        }
        if now >= next_kill {
            d.kill_one();
            next_kill = Instant::now() + d.rng.duration(KILL_EVERY);
        }
        if now - start >= window && submitted == runs_total && restarted && cut && resumed {
            break;
        }
        tokio::time::sleep(TICK).await;
    }
    let chaos_s = start.elapsed().as_secs_f64();
    println!("chaos: faults stopped at {chaos_s:.1} s; waiting for the runs to finish");

    // The calm: what the last killed engine held comes back after its lease and grace; every
    // engine is up, and approvals are still answered as they come.
    let deadline = Instant::now() + LEASE + LEASE_GRACE + Duration::from_secs(60);
    let left = loop {
        if let Ok(n) = answer_approvals(&pool, &s).await {
            d.figures.approvals += n;
        }
        d.revive();
        let left = running(&pool).await.unwrap_or(i64::MAX);
        if left == 0 || Instant::now() > deadline {
            break left;
        }
        tokio::time::sleep(TICK).await;
    };
    let duration_s = start.elapsed().as_secs_f64();
    for slot in &mut d.slots {
        if let Some(mut p) = slot.process.take() {
            p.kill();
        }
    }

    let inv = check_invariants(&pool, &d.effects).await;
    let wrong = wrong_outcomes(&pool).await;
    let twice = attempts_run_twice(&d.effects);
    let runs_lost = inv.runs_lost + wrong.len() as i64;
    let effects_doubled = inv.effects_doubled + twice;
    let steps = scalar(&pool, "SELECT count(*) FROM steps").await;
    let recovered = scalar(&pool, "SELECT count(*) FROM steps WHERE reason = 'lease_expired'").await;
    // A step recovered again on its retry: three in a row fail the run by design
    // (INFRASTRUCTURE_ATTEMPTS), so this says how close the schedule came to that.
    let recovered_again = scalar(&pool, "SELECT count(*) FROM steps WHERE reason = 'lease_expired' AND attempt > 1").await;
    let (stall_recovered, stall_late) = stalled_attempts(&pool, &d.effects, &d.figures.stalled).await;
    let stats = proxy.stats();
    let f = &d.figures;
    println!("runs: {submitted}");
    println!("runs_running_at_end: {left}");
    println!("steps: {steps}");
    println!("steps_executed: {}", effects_count(&d.effects));
    println!("steps_recovered_after_lease_expiry: {recovered} ({recovered_again} of them retries)");
    println!("kills: {}", f.kills);
    println!("engine_starts: {} ({} exited by themselves while their database was away)", f.starts, f.exits);
    println!("postgres_restarts: 1 ({} runs running, {} steps held)", f.running_at_restart, f.held_at_restart);
    println!(
        "proxy_cuts: 1 ({} runs running, {} steps held by c; {} connections severed, {} refused)",
        f.running_at_cut, f.held_at_cut, stats.severed, stats.refused
    );
    println!(
        "engine_stalls: 1 ({} held {} steps; {stall_recovered} recovered meanwhile, {stall_late} of them had run all the same)",
        f.stalled, f.held_at_stall
    );
    println!("stale_results_dropped: {}", log_lines(&d.dir, "dropping a stale result").len());
    println!("approvals_answered: {}", f.approvals);
    println!("submit_retries: {}", f.submit_retries);
    println!("chaos_s: {chaos_s:.1}");
    println!("duration_s: {duration_s:.1}");
    println!("total_s: {:.1}", began.elapsed().as_secs_f64());
    println!("runs_lost: {runs_lost}");
    println!("effects_doubled: {effects_doubled}");
    println!("event_gaps: {}", inv.event_gaps);
    println!("audit_missing: {}", inv.audit_missing);
    println!("steps_held: {}", inv.steps_held);
    let errors = log_lines(&d.dir, "\"level\":\"ERROR\"");
    println!("engine_log_errors: {}", errors.len());
    for line in errors.iter().take(10) {
        println!("  {line}");
    }

    let broken = runs_lost != 0 || effects_doubled != 0 || inv.event_gaps != 0 || inv.audit_missing != 0 || inv.steps_held != 0;
    if broken {
        report_lost(&pool, &wrong).await;
        report_doubled(&pool).await;
        // Keep the engines' logs and the effects file for whoever reads the failure.
        let kept = dir.keep();
        println!("chaos: engine logs and effects kept in {}", kept.display());
    }
    assert_eq!(submitted, runs_total);
    assert_eq!(
        Invariants { runs_lost, effects_doubled, event_gaps: inv.event_gaps, audit_missing: inv.audit_missing, steps_held: inv.steps_held },
        Invariants::default(),
        "an invariant broke under chaos (seed {seed_value})"
    );
    pool.close().await;
    if let Some(pg) = pg {
        stop(pg).await;
    }
}

/// Completed runs whose succeeded steps are not exactly [`SUCCEEDED`]: terminal, but with a
/// wrong outcome.
async fn wrong_outcomes(pool: &Db) -> Vec<uuid::Uuid> {
    let completed: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT run_id FROM runs WHERE status = 'completed'").fetch_all(pool).await.unwrap();
    let rows: Vec<(uuid::Uuid, String, i32)> = sqlx::query_as(
        "SELECT s.run_id, s.node, s.visit FROM steps s JOIN runs r USING (run_id) WHERE r.status = 'completed' AND s.state = 'succeeded'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut by_run: HashMap<uuid::Uuid, BTreeSet<(String, i32)>> = HashMap::new();
    for (run, node, visit) in rows {
        by_run.entry(run).or_default().insert((node, visit));
    }
    let expected: BTreeSet<(String, i32)> = SUCCEEDED.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect();
    completed.into_iter().filter(|run| by_run.get(run) != Some(&expected)).collect()
}

/// The steps the stalled engine held that were recovered from it, and how many of those it
/// executed anyway once it woke (their effects lines).
async fn stalled_attempts(pool: &Db, effects: &Path, stalled: &str) -> (i64, i64) {
    let recovered: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT step_id FROM steps WHERE holder = $1 AND reason = 'lease_expired'")
        .bind(format!("engine:{stalled}"))
        .fetch_all(pool)
        .await
        .unwrap();
    let ids: HashSet<String> = recovered.iter().map(|s| engine::ids::StepId(*s).to_string()).collect();
    let text = std::fs::read_to_string(effects).unwrap_or_default();
    let late = text.lines().filter(|l| ids.contains(l.split(' ').next().unwrap_or_default())).count() as i64;
    (recovered.len() as i64, late)
}

/// Effects lines that repeat a (run, node, visit, attempt): the same attempt executed twice
/// even under two step ids, which the per-step check alone would not see.
fn attempts_run_twice(effects: &Path) -> i64 {
    let text = std::fs::read_to_string(effects).unwrap_or_default();
    let mut seen = HashSet::new();
    text.lines().filter(|l| !seen.insert(l.split(' ').skip(1).collect::<Vec<_>>().join(" "))).count() as i64
}

/// The last line of an engine's log: its error, when it exited by itself.
fn last_line(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("(no output)").to_owned()
}

/// The lines of the engines' logs (JSON, one event a line) that contain `needle`. Errors are
/// printed: warnings are expected under chaos (lost connections, retries), but an error means
/// an engine gave up on something, such as failing a run it could not advance.
fn log_lines(dir: &Path, needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("engine-") {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            out.extend(text.lines().filter(|l| l.contains(needle)).map(|l| format!("{name}: {l}")));
        }
    }
    out
}

/// Prints a few of the visits that succeeded more than once, with each attempt's holder.
async fn report_doubled(pool: &Db) {
    let doubled: Vec<String> = sqlx::query_scalar(
        "SELECT format('doubled: run %s node %s visit %s: %s', run_id, node, visit, string_agg(format('attempt %s by %s', attempt, holder), ', ')) \
         FROM steps WHERE state = 'succeeded' GROUP BY run_id, node, visit HAVING count(*) > 1 LIMIT 5",
    )
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    for line in doubled {
        println!("{line}");
    }
}

/// Prints a few of the runs that did not end, or ended otherwise than they should, with their
/// steps, to start the search for the cause.
async fn report_lost(pool: &Db, wrong: &[uuid::Uuid]) {
    let lost: Vec<(uuid::Uuid, String, Option<String>)> = sqlx::query_as(
        "(SELECT run_id, status, reason FROM runs WHERE status <> 'completed' ORDER BY run_id LIMIT 5) \
         UNION ALL (SELECT run_id, status, reason FROM runs WHERE run_id = ANY($1) ORDER BY run_id LIMIT 5)",
    )
    .bind(wrong)
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    for (run, status, reason) in lost {
        println!("lost run {}: {status} {}", RunId(run), reason.unwrap_or_default());
        let steps: Vec<String> = sqlx::query_scalar(
            "SELECT format('%s v%s a%s %s %s %s', node, visit, attempt, state, coalesce(reason, ''), coalesce(holder, '')) \
             FROM steps WHERE run_id = $1 ORDER BY started_seq",
        )
        .bind(run)
        .fetch_all(pool)
        .await
        .unwrap_or_default();
        for step in steps {
            println!("  {step}");
        }
    }
}
