//! The chaos suite's processes: three `shopfloor engine` and two `shopfloor api`, each started
//! again as a new incarnation after a kill, and the ways each reaches PostgreSQL.
//!
//! - engine `a` and replica `r1`: `DATABASE_URL` through PgBouncer in transaction mode, `LISTEN`
//!   direct (as the README's "Behind PgBouncer" says);
//! - engine `b`: direct, named in `pg_stat_activity` (`application_name`), so the driver can
//!   catch it inside an open transaction and freeze it there;
//! - engine `c` and replica `r2`: in a network namespace of their own (`shopfloor_tests::netns`),
//!   their pool (through PgBouncer) and `LISTEN` links each through a proxy on a veth link that
//!   can be cut (sockets closed) or blackholed (packets dropped, nothing closed).

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use shopfloor_tests::netns::{Link, Netns};
use shopfloor_tests::process::Proc;
use shopfloor_tests::proxy::Proxy;
use shopfloor_tests::{EngineProcess, engine_command, shopfloor_bin};
use tokio::time::Instant;

use super::{Rng, SECRET};

/// An engine or an API replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Engine,
    Replica,
}

/// How a process reaches PostgreSQL.
pub(super) enum Route {
    /// Pool through PgBouncer, `LISTEN` direct.
    Pooled,
    /// Both direct, the pool's connections named after the incarnation.
    Direct,
    /// In the namespace: through these proxies, which listen on the links' outside ends.
    Isolated { pool: Proxy, listen: Proxy, pool_link: Link, listen_link: Link },
}

/// How an incarnation ended, or what happened to it: the causes a re-execution is explained by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Fate {
    Killed,
    FrozenInTransaction,
    Blackholed,
    Cut,
    PostgresCrash,
    PgBouncerRestart,
}

impl Fate {
    pub(super) fn words(self) -> &'static str {
        match self {
            Fate::Killed => "its engine was killed (SIGKILL) holding it",
            Fate::FrozenInTransaction => "its engine was frozen (SIGSTOP) inside an open transaction past the lease",
            Fate::Blackholed => "its engine's database links were blackholed past the lease",
            Fate::Cut => "its engine's database link was cut",
            Fate::PostgresCrash => "PostgreSQL crashed (kill -9) while it ran",
            Fate::PgBouncerRestart => "PgBouncer was killed and restarted while it ran",
        }
    }
}

pub(super) struct Slot {
    pub(super) name: &'static str,
    pub(super) kind: Kind,
    pub(super) route: Route,
    incarnation: u32,
    pub(super) process: Option<EngineProcess>,
    pub(super) started_at: Instant,
    down_since: Option<Instant>,
    /// Set while the process is stopped with SIGSTOP, until it is continued.
    pub(super) stalled_until: Option<Instant>,
    /// A replica's HTTP address.
    pub(super) listen: Option<SocketAddr>,
    /// Not killed until then: its links are blackholed, and a kill would end the connections
    /// whose silent loss is what the blackhole is for.
    spared_until: Option<Instant>,
}

impl Slot {
    pub(super) fn isolated(&self) -> bool {
        matches!(self.route, Route::Isolated { .. })
    }
}

/// A time when PostgreSQL was away from these slots.
struct Fault {
    from: Instant,
    to: Instant,
    slots: Vec<usize>,
}

/// How long a start may take while the database is away: its connection probe and its pool's
/// first acquire each give up after 10 s.
const STARTUP: Duration = Duration::from_secs(20);
/// A process that exited by itself (it started while its database was away) is started again
/// after this long.
const REVIVE_AFTER: Duration = Duration::from_secs(1);

/// What the fleet did, for the report.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub(super) engine_kills: u64,
    pub(super) replica_kills: u64,
    pub(super) starts: u64,
    pub(super) exits: u64,
}

pub(super) struct Fleet {
    pub(super) slots: Vec<Slot>,
    pub(super) dir: PathBuf,
    pub(super) effects: PathBuf,
    direct_url: String,
    pooled_url: String,
    github_url: String,
    /// The fake GitHub as engine `c` reaches it (through a proxy on a link of its own).
    github_isolated_url: String,
    pub(super) netns: Netns,
    faults: Vec<Fault>,
    /// Every incarnation's fates, by its holder name (`engine:b3`).
    pub(super) fates: HashMap<String, Vec<Fate>>,
    pub(super) counts: Counts,
    _github_proxy: Proxy,
}

/// `url` with `host:port` for its address.
fn via(url: &str, addr: SocketAddr) -> String {
    let mut u = url::Url::parse(url).expect("a database URL");
    u.set_host(Some(&addr.ip().to_string())).unwrap();
    u.set_port(Some(addr.port())).unwrap();
    u.to_string()
}

impl Fleet {
    /// The five processes' slots, none started yet.
    pub(super) async fn new(dir: &Path, direct_url: &str, pooled_url: &str, github_url: &str) -> Fleet {
        let direct: SocketAddr = {
            let u = url::Url::parse(direct_url).unwrap();
            SocketAddr::new(u.host_str().unwrap().parse().unwrap(), u.port().unwrap())
        };
        let pooler: SocketAddr = {
            let u = url::Url::parse(pooled_url).unwrap();
            SocketAddr::new(u.host_str().unwrap().parse().unwrap(), u.port().unwrap())
        };
        let github: SocketAddr = github_url.trim_start_matches("http://").parse().expect("the fake GitHub's address");
        let mut netns = Netns::create("chaos");
        let mut isolated = || {
            let (pool_link, listen_link) = (netns.link(), netns.link());
            (pool_link, listen_link)
        };
        let (c_pool, c_listen) = isolated();
        let (r_pool, r_listen) = isolated();
        let http_link = netns.link();
        let gh_link = netns.link();
        let proxy = |link: &Link, to: SocketAddr| Proxy::start_on(IpAddr::V4(link.outside), to);
        let github_proxy = proxy(&gh_link, github).await.unwrap();
        let c_route = Route::Isolated {
            pool: proxy(&c_pool, pooler).await.unwrap(),
            listen: proxy(&c_listen, direct).await.unwrap(),
            pool_link: c_pool,
            listen_link: c_listen,
        };
        let r_route = Route::Isolated {
            pool: proxy(&r_pool, pooler).await.unwrap(),
            listen: proxy(&r_listen, direct).await.unwrap(),
            pool_link: r_pool,
            listen_link: r_listen,
        };
        let slot = |name, kind, route, listen| Slot {
            name,
            kind,
            route,
            incarnation: 0,
            process: None,
            started_at: Instant::now(),
            down_since: None,
            stalled_until: None,
            listen,
            spared_until: None,
        };
        let r1 = SocketAddr::from(([127, 0, 0, 1], shopfloor_tests::process::free_port()));
        let r2 = SocketAddr::new(IpAddr::V4(http_link.inside), shopfloor_tests::process::free_port());
        let slots = vec![
            slot("a", Kind::Engine, Route::Pooled, None),
            slot("b", Kind::Engine, Route::Direct, None),
            slot("c", Kind::Engine, c_route, None),
            slot("r1", Kind::Replica, Route::Pooled, Some(r1)),
            slot("r2", Kind::Replica, r_route, Some(r2)),
        ];
        Fleet {
            slots,
            dir: dir.to_owned(),
            effects: dir.join("effects"),
            direct_url: direct_url.to_owned(),
            pooled_url: pooled_url.to_owned(),
            github_url: github_url.to_owned(),
            github_isolated_url: format!("http://{}", github_proxy.addr()),
            netns,
            faults: Vec::new(),
            fates: HashMap::new(),
            counts: Counts::default(),
            _github_proxy: github_proxy,
        }
    }

    pub(super) fn start_all(&mut self) {
        for i in 0..self.slots.len() {
            self.start(i);
        }
    }

    /// The replicas' base URLs, `r1` first.
    pub(super) fn bases(&self) -> Vec<String> {
        self.slots.iter().filter_map(|s| s.listen).map(|a| format!("http://{a}")).collect()
    }

    pub(super) fn index(&self, name: &str) -> usize {
        self.slots.iter().position(|s| s.name == name).expect("a slot of that name")
    }

    /// Starts slot `i` as a new incarnation with its own id (`b3`), as a restarted process
    /// gets a new pid, so steps held by a killed incarnation can be told apart.
    pub(super) fn start(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.incarnation += 1;
        let id = format!("{}{}", slot.name, slot.incarnation);
        let (pool, listen) = match &slot.route {
            Route::Pooled => (self.pooled_url.clone(), Some(self.direct_url.clone())),
            Route::Direct => {
                let mut u = url::Url::parse(&self.direct_url).unwrap();
                u.query_pairs_mut().append_pair("application_name", &format!("chaos-{id}"));
                (u.to_string(), None)
            }
            Route::Isolated { pool, listen, .. } => (via(&self.pooled_url, pool.addr()), Some(via(&self.direct_url, listen.addr()))),
        };
        // Each process's log goes to a file of its own, kept when the suite fails.
        let log =
            OpenOptions::new().create(true).append(true).open(self.dir.join(format!("{}-{}.log", kind_word(slot.kind), slot.name))).expect("open the log");
        let program = if slot.isolated() { self.netns.command(shopfloor_bin()) } else { Command::new(shopfloor_bin()) };
        let mut cmd = match slot.kind {
            Kind::Engine => {
                let github = if slot.isolated() { &self.github_isolated_url } else { &self.github_url };
                let mut cmd = engine_command(program, &id, &self.effects, "info");
                shopfloor_tests::github_fake::as_app(&mut cmd, github, 5);
                cmd
            }
            Kind::Replica => {
                let mut cmd = program;
                cmd.args(["api", "--log", "info"])
                    .env("SHOPFLOOR_LISTEN", slot.listen.expect("a replica's address").to_string())
                    .env("SHOPFLOOR_SECRET_KEY", engine::testkit::SECRET_KEY)
                    .env("SHOPFLOOR_GITHUB_WEBHOOK_SECRET", SECRET)
                    .env("SHOPFLOOR_DRAIN_SECS", "1")
                    .env("SHOPFLOOR_RATE_PER_TOKEN", "10000")
                    .env("SHOPFLOOR_RATE_PER_TOKEN_BURST", "10000")
                    .env("SHOPFLOOR_RATE_PER_ADDRESS", "10000")
                    .env("SHOPFLOOR_RATE_PER_ADDRESS_BURST", "10000");
                cmd
            }
        };
        cmd.env("DATABASE_URL", &pool);
        if let Some(listen) = &listen {
            cmd.env("SHOPFLOOR_LISTEN_DATABASE_URL", listen);
        }
        let child = cmd.stdout(Stdio::null()).stderr(log).spawn().expect("spawn shopfloor");
        slot.process = Some(EngineProcess { proc: Proc(child), id });
        slot.started_at = Instant::now();
        slot.down_since = None;
        self.counts.starts += 1;
    }

    /// The holder name of slot `i`'s current incarnation.
    pub(super) fn holder(&self, i: usize) -> String {
        format!("engine:{}", self.slots[i].process.as_ref().map_or("-", |p| p.id.as_str()))
    }

    pub(super) fn engine_holders(&self) -> Vec<String> {
        (0..self.slots.len()).filter(|&i| self.slots[i].kind == Kind::Engine).map(|i| self.holder(i)).collect()
    }

    /// Marks what happened to the current incarnations of `slots`.
    pub(super) fn befall(&mut self, slots: &[usize], fate: Fate) {
        for &i in slots {
            if self.slots[i].kind == Kind::Engine && self.slots[i].process.is_some() {
                let holder = self.holder(i);
                self.fates.entry(holder).or_default().push(fate);
            }
        }
    }

    /// A fault: the database was away from `slots` from `from` to `to`.
    pub(super) fn fault(&mut self, from: Instant, to: Instant, slots: Vec<usize>) {
        self.faults.push(Fault { from, to, slots });
    }

    pub(super) fn pooled(&self) -> Vec<usize> {
        (0..self.slots.len()).filter(|&i| !matches!(self.slots[i].route, Route::Direct)).collect()
    }

    /// SIGKILLs a random live process of `kind` and starts it again at once. A stalled one is
    /// left alone: it has to wake up and report late for the stall to prove anything.
    pub(super) fn kill_one(&mut self, rng: &mut Rng, kind: Kind) {
        let alive: Vec<usize> = (0..self.slots.len())
            .filter(|&i| {
                let s = &self.slots[i];
                s.kind == kind && s.process.is_some() && s.stalled_until.is_none() && s.spared_until.is_none_or(|t| Instant::now() >= t)
            })
            .collect();
        if alive.is_empty() {
            return;
        }
        let i = alive[rng.between(0, alive.len() as u64 - 1) as usize];
        self.befall(&[i], Fate::Killed);
        if let Some(mut p) = self.slots[i].process.take() {
            p.proc.sigkill();
            match kind {
                Kind::Engine => self.counts.engine_kills += 1,
                Kind::Replica => self.counts.replica_kills += 1,
            }
        }
        self.start(i);
    }

    /// Stops slot `i` (SIGSTOP) until `until`.
    pub(super) fn stall(&mut self, i: usize, until: Instant) {
        let slot = &mut self.slots[i];
        signal(slot.process.as_ref().expect("a stalled process is running"), libc::SIGSTOP);
        slot.stalled_until = Some(until);
    }

    /// Continues (SIGCONT) slot `i` at once.
    pub(super) fn resume(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        if let Some(p) = &slot.process {
            signal(p, libc::SIGCONT);
        }
        slot.stalled_until = None;
    }

    /// Continues stalled processes whose time is up; the names of those that were.
    pub(super) fn resume_due(&mut self) -> Vec<&'static str> {
        let due: Vec<usize> = (0..self.slots.len()).filter(|&i| self.slots[i].stalled_until.is_some_and(|t| Instant::now() >= t)).collect();
        due.into_iter()
            .map(|i| {
                self.resume(i);
                self.slots[i].name
            })
            .collect()
    }

    /// Notices processes that exited by themselves and starts them again after a pause.
    ///
    /// A running engine or replica never exits on its own: it retries whatever the database
    /// does. Only a start can fail, when the database is away while it connects and checks the
    /// schema, so one that exits after starting outside every fault means the harness is
    /// broken (a binary built for another schema, say), and the suite stops and says why
    /// rather than pass without it.
    pub(super) fn revive(&mut self) {
        for i in 0..self.slots.len() {
            let slot = &mut self.slots[i];
            if let Some(p) = &mut slot.process {
                if let Ok(Some(status)) = p.proc.0.try_wait() {
                    let why = last_line(&self.dir.join(format!("{}-{}.log", kind_word(slot.kind), slot.name)));
                    let expected = self.faults.iter().any(|f| f.slots.contains(&i) && slot.started_at + STARTUP >= f.from && slot.started_at <= f.to);
                    assert!(expected, "{} exited by itself ({status}) though its database was reachable: {why}", p.id);
                    println!("chaos: {} could not start while its database was away: {why}", p.id);
                    slot.process = None;
                    slot.down_since = Some(Instant::now());
                    self.counts.exits += 1;
                }
            }
            if slot.down_since.is_some_and(|t| t.elapsed() >= REVIVE_AFTER) {
                self.start(i);
            }
        }
    }

    /// Blackholes (`true`) or restores slot `i`'s two database links.
    pub(super) fn blackhole(&mut self, i: usize, on: bool, until: Instant) {
        self.slots[i].spared_until = Some(until);
        let Route::Isolated { pool_link, listen_link, .. } = &self.slots[i].route else { panic!("{} is not in the namespace", self.slots[i].name) };
        for link in [pool_link, listen_link] {
            if on {
                link.blackhole();
            } else {
                link.restore();
            }
        }
    }

    /// Severs every connection of slot `i`'s database links and refuses new ones for `d`.
    pub(super) fn cut_for(&self, i: usize, d: Duration) {
        let Route::Isolated { pool, listen, .. } = &self.slots[i].route else { panic!("{} is not in the namespace", self.slots[i].name) };
        pool.cut_for(d);
        listen.cut_for(d);
    }

    /// Connections slot `i`'s proxies severed and refused, so far.
    pub(super) fn severed(&self, i: usize) -> (u64, u64) {
        let Route::Isolated { pool, listen, .. } = &self.slots[i].route else { return (0, 0) };
        let (p, l) = (pool.stats(), listen.stats());
        (p.severed + l.severed, p.refused + l.refused)
    }

    pub(super) fn stop_all(&mut self) {
        for slot in &mut self.slots {
            if slot.stalled_until.take().is_some() {
                if let Some(p) = &slot.process {
                    signal(p, libc::SIGCONT);
                }
            }
            if let Some(mut p) = slot.process.take() {
                p.proc.sigkill();
            }
        }
    }

    /// The lines of the processes' logs (JSON, one event a line) that contain `needle`.
    pub(super) fn log_lines(&self, needle: &str) -> Vec<String> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".log") {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                out.extend(text.lines().filter(|l| l.contains(needle)).map(|l| format!("{name}: {l}")));
            }
        }
        out
    }
}

fn kind_word(kind: Kind) -> &'static str {
    match kind {
        Kind::Engine => "engine",
        Kind::Replica => "api",
    }
}

pub(super) fn signal(p: &EngineProcess, sig: libc::c_int) {
    // SAFETY: sending a signal to our own child process by its pid; it has not been waited
    // for, so the pid is still its own.
    let sent = unsafe { libc::kill(p.proc.0.id() as libc::pid_t, sig) };
    assert_eq!(sent, 0, "signal {sig} to {}: {}", p.id, std::io::Error::last_os_error());
}

/// The last line of a process's log: its error, when it exited by itself.
fn last_line(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("(no output)").to_owned()
}
