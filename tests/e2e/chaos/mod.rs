//! The chaos suite: runs of two workflows with a join, a gate loop, an approval, a timed wait
//! and leased steps, on three engine processes behind two API replicas, while a driver, over
//! HTTP as real clients do, submits runs with an `Idempotency-Key` (REST), delivers signed
//! `issues.opened` webhooks whose runs comment on their issue on a fake GitHub, and approves
//! what waits; all the while it:
//!
//! - SIGKILLs a random engine every 2–5 s and a random replica every 3–8 s, and starts each
//!   again at once;
//! - crashes PostgreSQL (`kill -9` of the postmaster) with `fsync` and `synchronous_commit` on
//!   for that phase, so that what was acknowledged must survive the crash recovery;
//! - kills PgBouncer (which engine `a`, engine `c` and both replicas pool through) and starts
//!   it again;
//! - cuts engine `c`'s database links (sockets closed) for 5 s, and later blackholes them
//!   (packets dropped, nothing closed) past a lease; then blackholes replica `r2`'s;
//! - freezes engine `b` (SIGSTOP) while `pg_stat_activity` shows it inside an open transaction,
//!   for longer than a lease: the server's `idle_in_transaction_session_timeout` must end that
//!   transaction and release its locks, the leases it held lapse and are recovered elsewhere,
//!   and when it wakes, the fence must refuse what it reports late;
//! - poisons one acknowledged run (a trigger makes the insert of its last step fail), which
//!   must end `failed engine_error` while every other run goes on.
//!
//! Afterwards, against what the server acknowledged (`clients::Acked`) and what GitHub holds
//! (`figures`): no acknowledged run lost or ended otherwise than it should, exactly one
//! comment per issue on GitHub (`external_effects_doubled`), every re-execution listed with
//! the fault that caused it, gapless events, the audit complete entry by entry, and no
//! admission lease left held.
//!
//! `CHAOS_RUNS` is the number of runs (300 by default, sized for `make test`'s budget on two
//! cores; `make chaos` runs 2000), half of each kind, and `CHAOS_SEED` seeds every random
//! choice of the driver: the seed is printed first, so a failing schedule can be replayed. The
//! timing of the processes is not reproducible, the driver's random choices are. The suite runs
//! a PostgreSQL cluster of its own, because it crashes it, and a network namespace (root).

mod clients;
mod figures;
mod fleet;

use std::collections::BTreeMap;
use std::time::Duration;

use engine::cluster::{Cluster, ClusterOptions};
use engine::db::Db;
use engine::ids::RunId;
use engine::store::steps::{LEASE, LEASE_GRACE};
use engine::store::{Actor, Change, installations};
use engine::testkit::FAN_OUT_JOIN_LOOP;
use serde_json::{Map, Value, json};
use shopfloor_tests::github_fake::FakeGithub;
use shopfloor_tests::pgbouncer::PgBouncer;
use shopfloor_tests::scalar;
use tokio::task::JoinSet;
use tokio::time::Instant;

use clients::Clients;
use fleet::{Fate, Fleet, Kind};

use crate::support::{acme, owner_token, put_workflows};

pub(crate) const SECRET: &str = "chaos webhook secret";
pub(crate) const INSTALLATION: i64 = 77;
pub(crate) const REPOSITORY: &str = "acme/widgets";

/// What both workflows add to the fan-out, join and loop ([`FAN_OUT_JOIN_LOOP`]) before `ship`.
const ASK_AND_NAP: &str = "  ask:
    after: [ci]
    approval:
      prompt: Ship it?
  nap:
    after: [ask]
    wait: { for: 1s }
";

/// Submitted over REST, with inputs that fail the gate's first visit (sending the run back
/// through `left` once); `ship` is a leased step of the test executor.
fn rest_workflow() -> String {
    format!("name: chaos\nnodes:\n{FAN_OUT_JOIN_LOOP}{ASK_AND_NAP}  ship:\n    after: [nap]\n    crew: {{ harness: claude-code, prompt: ship }}\n")
}

/// Started by `issues.opened`; `ship` comments on the issue on GitHub.
fn webhook_workflow() -> String {
    format!(
        "name: chaos-issue\non:\n  github:\n    events: [issues.opened]\nnodes:\n{FAN_OUT_JOIN_LOOP}{ASK_AND_NAP}  ship:\n    after: [nap]\n    output: {{ github: comment, body: shipped }}\n"
    )
}

/// The visits that succeed in a REST run that ends as it should.
const REST_SUCCEEDED: [(&str, i32); 8] = [("plan", 1), ("left", 1), ("right", 1), ("left", 2), ("ci", 2), ("ask", 1), ("nap", 1), ("ship", 1)];
/// The same for a webhook's run: no input, so the gate passes at once.
const WEBHOOK_SUCCEEDED: [(&str, i32); 7] = [("plan", 1), ("left", 1), ("right", 1), ("ci", 1), ("ask", 1), ("nap", 1), ("ship", 1)];

/// The leased nodes of a REST run, each given its own random duration per run.
const LEASED: [&str; 5] = ["plan", "left", "right", "ci", "ship"];

const DEFAULT_RUNS: usize = 300;
const DEFAULT_SEED: u64 = 20_240_611;
/// The driver's pace.
const TICK: Duration = Duration::from_millis(100);
const ENGINE_KILL_EVERY: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(5));
const REPLICA_KILL_EVERY: (Duration, Duration) = (Duration::from_secs(3), Duration::from_secs(8));
/// Runs are submitted in bursts this far apart, each of the runs that came due since the last.
const BURST_EVERY: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(5));
const CUT: Duration = Duration::from_secs(5);
/// PgBouncer's `server_login_retry` (its default; `tests/pgbouncer.rs` keeps it).
const SERVER_LOGIN_RETRY: Duration = Duration::from_secs(15);
/// Past a lease and its grace, so the frozen engine's steps are recovered elsewhere meanwhile.
const PAST_A_LEASE: Duration = Duration::from_secs(LEASE.as_secs() + LEASE_GRACE.as_secs() + 5);
/// Past the `LISTEN` connections' keepalives (25 s), so a blackholed one is given up, and past
/// a lease, so the blackholed engine's leases lapse.
const BLACKHOLE: Duration = Duration::from_secs(35);

/// splitmix64: a seeded generator small enough to keep here, so the schedule depends on the
/// seed alone and not on a crate's version.
pub(crate) struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn duration(&mut self, (lo, hi): (Duration, Duration)) -> Duration {
        Duration::from_millis(self.between(lo.as_millis() as u64, hi.as_millis() as u64))
    }

    /// A moment `lo`–`hi` percent into `window` after `start`.
    fn moment(&mut self, start: Instant, window: Duration, lo: u64, hi: u64) -> Instant {
        start + window.mul_f64(self.between(lo, hi) as f64 / 100.0)
    }
}

/// A REST run's input: a random duration for each leased node, and the gate's failing first
/// visit.
fn input(rng: &mut Rng) -> Value {
    let step_ms: Map<String, Value> = LEASED.iter().map(|n| ((*n).to_owned(), json!(rng.between(20, 200)))).collect();
    json!({ "test": { "step_ms": step_ms, "gate_fail_visits": [1] } })
}

/// Runs still `running`, or `None` while the database is away.
async fn running(db: &Db) -> Option<i64> {
    sqlx::query_scalar("SELECT count(*) FROM runs WHERE status = 'running'").fetch_one(db).await.ok()
}

/// Steps leased or running under these holders; 0 while the database is away.
async fn held(db: &Db, holders: &[String]) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM steps WHERE state IN ('leased', 'running') AND holder = ANY($1)").bind(holders).fetch_one(db).await.unwrap_or(0)
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("{name}={v} is not a number")),
        Err(_) => default,
    }
}

/// Creates the org, its project, both workflows, the GitHub installation and a person's token.
async fn seed(db: &Db) -> String {
    let mut ch = Change::begin(db, Actor::System).await.unwrap();
    let acme = acme(&mut ch).await;
    put_workflows(&mut ch, acme.org, acme.project, &[rest_workflow(), webhook_workflow()]).await;
    installations::connect_for_test(&mut ch, acme.org, acme.project, INSTALLATION, "acme", REPOSITORY).await.unwrap();
    let token = owner_token(&mut ch, &acme, "chaos", 4).await;
    ch.commit().await.unwrap();
    token
}

/// The backend of engine `b`'s current incarnation that is inside an open transaction, if any:
/// (pid, when its transaction began).
async fn in_transaction(db: &Db, id: &str) -> Option<(i32, chrono::DateTime<chrono::Utc>)> {
    sqlx::query_as(
        "SELECT pid, xact_start FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle in transaction' AND xact_start IS NOT NULL LIMIT 1",
    )
    .bind(format!("chaos-{id}"))
    .fetch_optional(db)
    .await
    .ok()
    .flatten()
}

/// Poisons one of the `acked` runs that has not reached `ship`: a trigger makes the insert
/// of its `ship` step fail with an SQL error, in whatever batch of whichever engine it falls.
/// `None` when no run could be caught before its `ship`.
async fn poison(db: &Db, acked: &[RunId]) -> Option<RunId> {
    let run: RunId = sqlx::query_scalar(
        "SELECT run_id FROM runs r WHERE run_id = ANY($1) AND status = 'running' \
         AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.run_id = r.run_id AND s.node IN ('nap', 'ship')) ORDER BY created_at DESC LIMIT 1",
    )
    .bind(acked)
    .fetch_optional(db)
    .await
    .ok()??;
    sqlx::query(&format!(
        "CREATE OR REPLACE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF NEW.run_id = '{}' AND NEW.node = 'ship' THEN RAISE EXCEPTION 'poisoned row'; END IF; RETURN NEW; END $$",
        run.0
    ))
    .execute(db)
    .await
    .ok()?;
    sqlx::query("CREATE OR REPLACE TRIGGER poison BEFORE INSERT ON steps FOR EACH ROW EXECUTE FUNCTION poison()").execute(db).await.ok()?;
    // The trigger's lock waited for every insert in flight, so a `ship` written before it is
    // visible now; then that run was too quick, and another is tried at the next tick.
    let passed: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'ship')").bind(run).fetch_one(db).await.ok()?;
    if passed {
        let _ = sqlx::query("DROP TRIGGER poison ON steps").execute(db).await;
        return None;
    }
    Some(run)
}

/// Crashes PostgreSQL: SIGKILL to the postmaster, then waits for its children to go (they
/// exit when they see it gone), so that the restart finds no shared memory in use.
async fn crash(opts: &ClusterOptions) {
    let pid_file = opts.data_dir.join("pg/postmaster.pid");
    let text = std::fs::read_to_string(&pid_file).unwrap_or_else(|e| panic!("read {}: {e}", pid_file.display()));
    let postmaster: i32 = text.lines().next().and_then(|l| l.trim().parse().ok()).expect("the postmaster's pid");
    let children: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // The parent is the fourth field, after the command in parentheses.
            stat.rsplit_once(") ").and_then(|(_, rest)| rest.split(' ').nth(1)?.parse::<i32>().ok()) == Some(postmaster)
        })
        .collect();
    // SAFETY: a signal to the cluster's postmaster, a process of ours (or our user's) by its pid.
    assert_eq!(unsafe { libc::kill(postmaster, libc::SIGKILL) }, 0, "kill -9 the postmaster: {}", std::io::Error::last_os_error());
    let gone = async {
        while std::iter::once(postmaster).chain(children.iter().copied()).any(crate::host_env::alive) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), gone).await.expect("PostgreSQL's processes outlived their postmaster by a minute");
    // A dead postmaster nobody reaped (a container's init may not) still answers `kill -0`, so
    // its pid file would keep the next one from starting: gone, as an operator would remove it.
    std::fs::remove_file(&pid_file).unwrap_or_else(|e| panic!("remove {}: {e}", pid_file.display()));
}

/// Sets `fsync` and `synchronous_commit` (the cluster runs without them outside the crash
/// phase), and waits until a new session sees them. Turning them on also flushes the WAL with
/// a `CHECKPOINT`: a commit acknowledged just before, under `synchronous_commit = off`, has its
/// commit record only in the server's WAL buffers until the WAL writer's next round (up to
/// 200 ms), and a crash then would lose what the server had acknowledged. Seen once in CI: a
/// submit and a delivery answered a few milliseconds before the crash were gone after it.
async fn durable(db: &Db, url: &str, on: bool) {
    let value = if on { "on" } else { "off" };
    for name in ["fsync", "synchronous_commit"] {
        sqlx::query(&format!("ALTER SYSTEM SET {name} = {value}")).execute(db).await.unwrap();
    }
    sqlx::query("SELECT pg_reload_conf()").execute(db).await.unwrap();
    let seen = async {
        loop {
            // A new session, since the pool's may predate the reload.
            let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(url).await.unwrap();
            let (f, s): (String, String) =
                sqlx::query_as("SELECT current_setting('fsync'), current_setting('synchronous_commit')").fetch_one(&mut conn).await.unwrap();
            if f == value && s == value {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), seen).await.expect("the reloaded settings are seen");
    if on {
        // The postmaster signals every backend before it forks a session that sees the reload,
        // and a backend applies it before its next command: a commit acknowledged under the
        // old setting was read before that, and its record is flushed here.
        sqlx::query("CHECKPOINT").execute(db).await.unwrap();
    }
}

/// Which faults are still to come, and what each saw when it came.
#[derive(Default)]
struct Schedule {
    done: BTreeMap<&'static str, String>,
}

impl Schedule {
    fn due(&self, name: &str) -> bool {
        !self.done.contains_key(name)
    }

    /// Whether fault `name` is still to come and its moment has come.
    fn ready(&self, name: &str, at: &BTreeMap<&str, Instant>, now: Instant) -> bool {
        self.due(name) && now >= at[name]
    }

    fn record(&mut self, name: &'static str, at: Duration, what: String) {
        println!("chaos: {name} at {:.1} s: {what}", at.as_secs_f64());
        self.done.insert(name, what);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn engines_replicas_poolers_and_postgres_failing_lose_nothing_acknowledged() {
    let runs_total: usize = env_or("CHAOS_RUNS", DEFAULT_RUNS);
    let seed_value: u64 = env_or("CHAOS_SEED", DEFAULT_SEED);
    // Runs arrive over the whole window, so every fault lands on runs in flight; 8 a second on
    // average keeps the engines far from their limit, so what is measured is recovery, not a
    // backlog. The window holds every fault one after another.
    let window = Duration::from_secs((runs_total as u64 / 8).clamp(150, 300));
    println!("chaos: seed {seed_value} (set CHAOS_SEED to replay), {runs_total} runs over {} s", window.as_secs());
    let mut rng = Rng(seed_value);
    let began = Instant::now();

    let dir = tempfile::tempdir().unwrap();
    let (own, pg, db) = shopfloor_tests::own_cluster(dir.path()).await;
    let (port, url) = (pg.port, pg.url.clone());
    let token = seed(&db).await;
    let github = FakeGithub::start().await;
    github.add_installation(INSTALLATION, "acme", &[REPOSITORY]);
    let mut bouncer = PgBouncer::start(&pg.url, 20).await;
    let mut fleet = Fleet::new(dir.path(), &pg.url, &bouncer.url(&pg.url), &github.url).await;
    fleet.start_all();
    for base in fleet.bases() {
        shopfloor_tests::until_ok(&format!("{base}/readyz")).await;
    }
    let clients = Clients::new(fleet.bases(), token);
    let (b, c, r2) = (fleet.index("b"), fleet.index("c"), fleet.index("r2"));

    // The schedule: one fault after another, so each is seen alone; kills throughout.
    let start = Instant::now();
    let at: BTreeMap<&str, Instant> = [
        ("freeze", (3, 6)),
        ("poison", (10, 12)),
        ("cut", (20, 24)),
        ("pgbouncer", (28, 32)),
        ("crash", (42, 46)),
        ("blackhole-engine", (52, 56)),
        ("blackhole-replica", (82, 86)),
    ]
    .into_iter()
    .map(|(name, (lo, hi))| (name, rng.moment(start, window, lo, hi)))
    .collect();
    let mut schedule = Schedule::default();
    let mut pg: Option<Cluster> = Some(pg);
    let mut blackholed: Option<(usize, Instant)> = None;
    let mut frozen: Option<(i32, Instant)> = None;
    // How long after the freeze the server ended the frozen transaction's session.
    let mut frozen_released: Option<f64> = None;
    let mut poisoned: Option<RunId> = None;
    let mut next_engine_kill = start + rng.duration(ENGINE_KILL_EVERY);
    let mut next_replica_kill = start + rng.duration(REPLICA_KILL_EVERY);
    let mut next_burst = start;
    let mut requested = 0usize;
    let mut sends: JoinSet<()> = JoinSet::new();
    let mut approving: Option<tokio::task::JoinHandle<u64>> = None;
    let mut approved = 0u64;

    loop {
        let now = Instant::now();
        let elapsed = now - start;
        if now >= next_burst {
            let due = ((runs_total as f64 * elapsed.as_secs_f64() / window.as_secs_f64()).ceil() as usize).min(runs_total);
            while requested < due {
                let (clients, first) = (clients.clone(), rng.between(0, 1) as usize);
                if requested % 2 == 0 {
                    let input = input(&mut rng);
                    let key = format!("chaos-{seed_value}-{requested}");
                    sends.spawn(async move { clients.submit(first, key, "chaos", input).await });
                } else {
                    let number = requested as i64 + 1;
                    sends.spawn(async move { clients.deliver(first, number).await });
                }
                requested += 1;
            }
            next_burst = now + rng.duration(BURST_EVERY);
        }
        while let Some(done) = sends.try_join_next() {
            done.expect("a client task");
        }
        // Approvals are answered as a person would, one pass at a time beside the driver.
        if approving.as_ref().is_none_or(|t| t.is_finished()) {
            if let Some(t) = approving.take() {
                approved += t.await.expect("the approver");
            }
            let (clients, db, first) = (clients.clone(), db.clone(), rng.between(0, 1) as usize);
            approving = Some(tokio::spawn(async move { clients.approve_waiting(&db, first).await }));
        }
        fleet.revive();

        // Faults wait for a moment when steps are held (bursts come and go), since a fault that
        // finds nothing in flight proves little; past the window they go ahead regardless.
        let late = elapsed >= window;
        if schedule.ready("poison", &at, now) {
            let acked: Vec<RunId> = clients.acked.lock().unwrap().submits.iter().map(|(_, r)| *r).collect();
            if let Some(run) = poison(&db, &acked).await {
                poisoned = Some(run);
                schedule.record("poison", elapsed, format!("run {run}: the insert of its `ship` step fails"));
            }
        }
        // Caught between two statements of one of its transactions: looked for often, for a
        // moment each tick.
        for _ in 0..100 {
            if !schedule.ready("freeze", &at, now) || fleet.slots[b].process.is_none() || frozen.is_some() {
                break;
            }
            let id = fleet.slots[b].process.as_ref().unwrap().id.clone();
            if let Some((pid, began_tx)) = in_transaction(&db, &id).await {
                fleet.stall(b, Instant::now() + PAST_A_LEASE);
                // Frozen inside that transaction only if it is still open now that the
                // process is stopped; otherwise let it go and catch another.
                if in_transaction(&db, &id).await == Some((pid, began_tx)) {
                    fleet.befall(&[b], Fate::FrozenInTransaction);
                    frozen = Some((pid, Instant::now()));
                    let holding = held(&db, &[fleet.holder(b)]).await;
                    schedule.record(
                        "freeze",
                        elapsed,
                        format!(
                            "engine {id} stopped (SIGSTOP) inside a transaction of backend {pid}, holding {holding} steps, for {} s",
                            PAST_A_LEASE.as_secs()
                        ),
                    );
                    break;
                }
                fleet.resume(b);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if let Some((pid, since)) = frozen {
            let open: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1").bind(pid).fetch_one(&db).await.unwrap_or(1);
            if open == 0 {
                let after = since.elapsed().as_secs_f64();
                println!("chaos: the frozen engine's backend {pid} was ended by the server {after:.1} s after the freeze, its locks released");
                frozen_released = Some(after);
                frozen = None;
            }
        }
        if schedule.ready("crash", &at, now) && (late || held(&db, &fleet.engine_holders()).await > 0) {
            let busy = (running(&db).await.unwrap_or(-1), held(&db, &fleet.engine_holders()).await);
            durable(&db, &url, true).await;
            let from = Instant::now();
            crash(&own.opts).await;
            drop(pg.take());
            let all: Vec<usize> = (0..fleet.slots.len()).collect();
            fleet.befall(&all, Fate::PostgresCrash);
            let again = own.start().await;
            assert_eq!(again.port, port, "PostgreSQL came back on another port; the processes' URLs name the old one");
            pg = Some(again);
            fleet.fault(from, Instant::now(), all);
            // PgBouncer refuses logins for its `server_login_retry` (15 s by default) after the
            // server refused its own: a pooled process starting then cannot reach the database.
            fleet.fault(from, Instant::now() + SERVER_LOGIN_RETRY, fleet.pooled());
            schedule.record(
                "crash",
                elapsed,
                format!(
                    "kill -9 of the postmaster with fsync on: {} runs running, {} steps held; back after {:.1} s",
                    busy.0,
                    busy.1,
                    from.elapsed().as_secs_f64()
                ),
            );
            durable(&db, &url, false).await;
        }
        if schedule.ready("cut", &at, now) && (late || held(&db, &[fleet.holder(c)]).await > 0) {
            let holding = held(&db, &[fleet.holder(c)]).await;
            fleet.befall(&[c], Fate::Cut);
            fleet.cut_for(c, CUT);
            fleet.fault(now, now + CUT, vec![c]);
            schedule.record("cut", elapsed, format!("engine c's database links severed for {} s, holding {holding} steps", CUT.as_secs()));
        }
        if schedule.ready("pgbouncer", &at, now) && (late || held(&db, &fleet.engine_holders()).await > 0) {
            let pooled = fleet.pooled();
            fleet.befall(&pooled, Fate::PgBouncerRestart);
            let from = Instant::now();
            bouncer.restart().await;
            fleet.fault(from, Instant::now(), pooled);
            schedule.record("pgbouncer", elapsed, format!("PgBouncer killed (SIGKILL) and started again in {:.1} s", from.elapsed().as_secs_f64()));
        }
        for (name, slot) in [("blackhole-engine", c), ("blackhole-replica", r2)] {
            if blackholed.is_none() && schedule.ready(name, &at, now) && (late || slot == r2 || held(&db, &[fleet.holder(c)]).await > 0) {
                let holding = held(&db, &[fleet.holder(c)]).await;
                fleet.befall(&[slot], Fate::Blackholed);
                fleet.blackhole(slot, true, now + BLACKHOLE);
                blackholed = Some((slot, now + BLACKHOLE));
                fleet.fault(now, now + BLACKHOLE, vec![slot]);
                let who = &fleet.slots[slot].name;
                schedule.record(name, elapsed, format!("{who}'s database links blackholed for {} s (engine c holding {holding} steps)", BLACKHOLE.as_secs()));
            }
        }
        if let Some((slot, until)) = blackholed {
            if now >= until {
                fleet.blackhole(slot, false, now);
                blackholed = None;
                println!("chaos: {}'s database links forward again at {:.1} s", fleet.slots[slot].name, elapsed.as_secs_f64());
            }
        }
        for name in fleet.resume_due() {
            println!("chaos: engine {name} continues (SIGCONT) at {:.1} s", elapsed.as_secs_f64());
        }
        if now >= next_engine_kill {
            fleet.kill_one(&mut rng, Kind::Engine);
            next_engine_kill = Instant::now() + rng.duration(ENGINE_KILL_EVERY);
        }
        if now >= next_replica_kill {
            fleet.kill_one(&mut rng, Kind::Replica);
            next_replica_kill = Instant::now() + rng.duration(REPLICA_KILL_EVERY);
        }
        // Past the window, the two faults that need a moment of their own give up waiting for
        // it; the asserts at the end say so, rather than the suite waiting for ever.
        if late {
            for name in ["freeze", "poison"] {
                if schedule.due(name) && frozen.is_none() {
                    schedule.record(name, elapsed, "never found its moment".into());
                }
            }
        }
        let all_faults = at.keys().all(|name| !schedule.due(name));
        if late && requested == runs_total && all_faults && blackholed.is_none() && fleet.slots.iter().all(|s| s.stalled_until.is_none()) {
            break;
        }
        tokio::time::sleep(TICK).await;
    }
    let chaos_s = start.elapsed().as_secs_f64();
    println!("chaos: faults stopped at {chaos_s:.1} s; waiting for the clients and the runs to finish");

    // The calm: every client's request is answered, what the last killed engine held comes
    // back after its lease and grace, and approvals are still answered as they come.
    let calm = async {
        while let Some(done) = sends.join_next().await {
            done.expect("a client task");
        }
        loop {
            if let Some(t) = approving.take() {
                approved += t.await.expect("the approver");
            }
            approved += clients.approve_waiting(&db, 0).await;
            fleet.revive();
            if running(&db).await == Some(0) {
                break;
            }
            tokio::time::sleep(TICK).await;
        }
    };
    let settled = tokio::time::timeout(LEASE + LEASE_GRACE + Duration::from_secs(240), calm).await.is_ok();
    let duration_s = start.elapsed().as_secs_f64();
    fleet.stop_all();

    let acked = std::mem::take(&mut *clients.acked.lock().unwrap());
    let (lost, unacknowledged) = figures::lost_runs(&db, &acked, poisoned).await;
    let (doubled, missing) = figures::external_effects(&github, &acked);
    let reexecuted = figures::reexecutions(&db, &fleet.effects, &fleet.fates).await;
    let audit_missing = figures::audit_missing(&db, &acked).await;
    let event_gaps = scalar(&db, "SELECT count(*) FROM (SELECT run_id FROM run_events GROUP BY run_id HAVING min(seq) <> 1 OR max(seq) <> count(*)) g").await;
    let steps_held = scalar(&db, "SELECT count(*) FROM steps WHERE state IN ('leased', 'running')").await;
    // With every run ended, admission's queues hold nothing: no lease rows, and no queue whose
    // count (`held` less its releases not yet counted off) says otherwise.
    let leases_held = scalar(
        &db,
        "SELECT (SELECT count(*) FROM concurrency_leases) \
              + (SELECT count(*) FROM admission_queues q \
                 WHERE q.held <> (SELECT count(*) FROM lease_releases r WHERE r.org_id = q.org_id AND r.queue = q.queue))",
    )
    .await;
    let recovered = scalar(&db, "SELECT count(*) FROM steps WHERE reason = 'lease_expired'").await;
    let poisoned_end: Option<(String, Option<String>)> = match poisoned {
        Some(run) => sqlx::query_as("SELECT status, reason FROM runs WHERE run_id = $1").bind(run).fetch_optional(&db).await.unwrap(),
        None => None,
    };

    let counts = &fleet.counts;
    println!("runs_acknowledged: {} submits ({} answered by a replay of their key), {} deliveries", acked.submits.len(), acked.replays, acked.deliveries.len());
    println!("runs_unacknowledged: {unacknowledged}");
    println!("client_retries: {}", acked.retries);
    println!("approvals_acknowledged: {} (of {approved} passes' answers)", acked.approvals.len());
    println!("steps_recovered_after_lease_expiry: {recovered}");
    println!("engine_kills: {}", counts.engine_kills);
    println!("replica_kills: {}", counts.replica_kills);
    println!("process_starts: {} ({} exited by themselves while their database was away)", counts.starts, counts.exits);
    for (name, what) in &schedule.done {
        println!("{name}: {what}");
    }
    println!("frozen_transaction_ended_after_s: {frozen_released:?}");
    let (severed, refused) = fleet.severed(c);
    println!("engine_c_connections: {severed} severed by the cut, {refused} refused while it lasted");
    println!("poisoned_run: {poisoned:?} ended {poisoned_end:?}");
    println!("stale_results_dropped: {}", fleet.log_lines("dropping a stale result").len());
    let mut causes: BTreeMap<String, usize> = BTreeMap::new();
    for r in &reexecuted {
        let why = match (r.reason.as_str(), r.fates.first()) {
            ("lease_expired", Some(last)) => last.words().to_owned(),
            ("lease_expired", None) => format!("its holder {} lost its lease with no fault of the driver's (a slow machine)", r.holder),
            (reason, _) => format!("its earlier attempt ended `{reason}` and was retried"),
        };
        *causes.entry(why).or_default() += 1;
    }
    println!("reexecutions: {} (visits executed by more than one attempt)", reexecuted.len());
    for (why, n) in &causes {
        println!("  {n}: {why}");
    }
    for r in reexecuted.iter().take(5) {
        println!("  e.g. {} (first held by {})", r.visit, r.holder);
    }
    println!("chaos_s: {chaos_s:.1}");
    println!("duration_s: {duration_s:.1}");
    println!("total_s: {:.1}", began.elapsed().as_secs_f64());
    println!("runs_lost: {}", lost.len());
    for l in lost.iter().take(10) {
        println!("  {}", l.what);
    }
    println!("external_effects_doubled: {} (issues with more than one comment from shopfloor)", doubled.len());
    println!("external_effects_missing: {}", missing.len());
    println!("event_gaps: {event_gaps}");
    println!("audit_missing: {}", audit_missing.len());
    for line in audit_missing.iter().take(10) {
        println!("  {line}");
    }
    println!("steps_held: {steps_held}");
    println!("leases_held: {leases_held}");
    let errors = fleet.log_lines("\"level\":\"ERROR\"");
    println!("log_errors: {}", errors.len());
    for line in errors.iter().take(10) {
        println!("  {line}");
    }

    let broken = !settled
        || !lost.is_empty()
        || !doubled.is_empty()
        || !missing.is_empty()
        || event_gaps != 0
        || !audit_missing.is_empty()
        || steps_held != 0
        || leases_held != 0
        || unacknowledged != 0;
    if broken {
        for l in lost.iter().filter_map(|l| l.run).take(5) {
            let steps: Vec<String> = sqlx::query_scalar(
                "SELECT format('%s v%s a%s %s %s %s', node, visit, attempt, state, coalesce(reason, ''), coalesce(holder, '')) FROM steps WHERE run_id = $1 ORDER BY started_seq",
            )
            .bind(l)
            .fetch_all(&db)
            .await
            .unwrap_or_default();
            println!("lost run {l}:\n  {}", steps.join("\n  "));
        }
        // Keep the processes' logs and the effects file for whoever reads the failure.
        let kept = dir.keep();
        println!("chaos: logs and effects kept in {}", kept.display());
    }
    assert!(settled, "runs were still running {} s after the faults stopped (seed {seed_value})", duration_s - chaos_s);
    assert_eq!(acked.submits.len() + acked.deliveries.len(), runs_total, "every request was answered");
    assert!(poisoned.is_some(), "no run was poisoned");
    assert!(frozen_released.is_some(), "the server never ended the frozen engine's open transaction");
    assert_eq!(
        (lost.len(), unacknowledged, doubled.len(), missing.len(), event_gaps, audit_missing.len(), steps_held, leases_held),
        (0, 0, 0, 0, 0, 0, 0, 0),
        "an invariant broke under chaos (seed {seed_value}): (runs_lost, runs_unacknowledged, external_effects_doubled, external_effects_missing, event_gaps, audit_missing, steps_held, leases_held)"
    );
    db.close().await;
    drop(bouncer);
    if let Some(pg) = pg {
        tokio::task::spawn_blocking(move || pg.stop()).await.expect("the stop task").expect("stop PostgreSQL");
    }
}
