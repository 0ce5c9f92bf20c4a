//! A network cut that drops the `LISTEN` connection's packets without closing it: the engine's
//! TCP keepalive notices, the engine reconnects and rescans once, and the runs whose
//! notifications the cut swallowed complete. Before the cut, the idle engine sends no
//! statement while its keepalive probes go back and forth.
//!
//! Why this proves the keepalive: the engine runs in a network namespace of its own and reaches
//! PostgreSQL through two proxies of this process, one per veth link: its pool through one, its
//! `LISTEN` connection (`SHOPFLOOR_LISTEN_DATABASE_URL`) through the other. The cut takes the
//! second link down on this side, so every frame the engine's kernel sends on it (a keepalive
//! probe, a reconnect's SYN) is dropped by the veth driver, and nothing the proxy sends
//! arrives: no FIN, no reset, no refusal, and no kernel acknowledging probes on the far side
//! (which a userspace proxy on loopback that merely stops forwarding would still do). While
//! the cut holds, the engine has nothing to wake it: no timer (no run ever ran here, so no
//! lease wake is pending) and no notification. Its own socket table (`/proc/PID/net/tcp`, the
//! namespace's) shows the keepalive timer armed on the `LISTEN` socket, then the socket given
//! up, which only the keepalive can do; the runs are still untouched then, since the engine
//! looks for work only once subscribed again, and they complete once the link forwards.
//!
//! Nothing is timed: each wait is for a state, under a generous hang guard.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use shopfloor_tests::netns::Netns;
use shopfloor_tests::proxy::Proxy;
use shopfloor_tests::{
    EngineProcess, Invariants, check_invariants, own_cluster, scalar, seed, shopfloor_bin, statement_calls, statements_sent, submit_many, until_all_done,
};

const WORKFLOW: &str = include_str!("../workflows/blackhole.yaml");

/// Hang guard of each wait; nothing is asserted about how long a wait took.
const GUARD: Duration = Duration::from_secs(120);

/// One line of `/proc/PID/net/tcp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Socket {
    local_port: u16,
    peer: SocketAddr,
    established: bool,
    /// The keepalive timer is pending (the `tr` column is 2).
    keepalive_timer: bool,
}

/// Reads an address of `/proc/net/tcp`: the IPv4 address as the kernel's u32 in hex (network
/// order bytes, printed as a native little-endian word), then the port in hex.
fn address(field: &str) -> Option<SocketAddr> {
    let (ip, port) = field.split_once(':')?;
    let ip = u32::from_str_radix(ip, 16).ok()?;
    Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip.to_le_bytes())), u16::from_str_radix(port, 16).ok()?))
}

/// The IPv4 TCP sockets of the namespace `pid` lives in.
fn sockets(pid: u32) -> Vec<Socket> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_else(|e| panic!("the engine's socket table: {e}"));
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (local, peer) = (address(f.get(1)?)?, address(f.get(2)?)?);
            let timer = f.get(5)?.split(':').next()?;
            Some(Socket { local_port: local.port(), peer, established: *f.get(3)? == "01", keepalive_timer: timer == "02" })
        })
        .collect()
}

/// The namespace's count of keepalive probes sent (`TcpExt: TCPKeepAlive`): only the `LISTEN`
/// connection has keepalives on this side (sqlx sets none on the pool's sockets).
fn keepalive_probes(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/netstat")).unwrap_or_else(|e| panic!("the engine's TCP counters: {e}"));
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next().expect("TcpExt names"), lines.next().expect("TcpExt values"));
    let counters: HashMap<&str, u64> = names.split_whitespace().zip(values.split_whitespace()).filter_map(|(n, v)| Some((n, v.parse().ok()?))).collect();
    counters["TCPKeepAlive"]
}

/// Waits for `check` to give something, polling this process's view (never the engine's
/// database), under the hang guard.
async fn until<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let found = async {
        loop {
            if let Some(t) = check().await {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(GUARD, found).await.unwrap_or_else(|_| panic!("never: {what}"))
}

/// Whether the statement that ends every scan (the pool's `next_due`: the earliest wake,
/// schedule tick and job) has been counted in `database`.
async fn scanned(admin: &engine::db::Db, database: &str) -> bool {
    scalar(
        admin,
        &format!(
            "SELECT count(*) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = '{database}') \
               AND query LIKE '%min(due_at)%FROM jobs%'"
        ),
    )
    .await
        > 0
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_cut_of_the_listen_connection_is_noticed_by_its_keepalive_and_the_runs_complete() {
    let mut ns = Netns::create("bh");
    let (pool_link, listen_link) = (ns.link(), ns.link());

    // A cluster of this test's own, which preloads pg_stat_statements.
    let dir = tempfile::tempdir().unwrap();
    let (_own, pg, pool) = own_cluster(dir.path()).await;
    let s = seed(&pool, WORKFLOW).await;
    let database: String = sqlx::query_scalar("SELECT current_database()").fetch_one(&pool).await.unwrap();
    // Counting happens from another database, so that it counts nothing itself.
    let admin_url = reqwest::Url::parse(&pg.url).map(|mut u| {
        u.set_path("/postgres");
        u.to_string()
    });
    let admin = engine::db::connect(&admin_url.unwrap(), 1).await.unwrap();
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").execute(&admin).await.unwrap();

    let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, pg.port));
    let db_proxy = Proxy::start_on(IpAddr::V4(pool_link.outside), upstream).await.unwrap();
    let listen_proxy = Proxy::start_on(IpAddr::V4(listen_link.outside), upstream).await.unwrap();
    let effects = dir.path().join("effects");
    let mut program = ns.command(shopfloor_bin());
    program
        .env("SHOPFLOOR_LISTEN_DATABASE_URL", listen_proxy.url_for(&pg.url))
        // Short, through the settings an operator has: a probe after 1 s of silence, then one a
        // second, given up after 2 (the user timeout follows: 3 s).
        .env("SHOPFLOOR_LISTEN_KEEPALIVE_IDLE_SECS", "1")
        .env("SHOPFLOOR_LISTEN_KEEPALIVE_INTERVAL_SECS", "1")
        .env("SHOPFLOOR_LISTEN_KEEPALIVE_RETRIES", "2");
    let engine = EngineProcess::spawn(program, &db_proxy.url_for(&pg.url), "cut", &effects);
    let pid = engine.proc.0.id();

    // The LISTEN connection: one socket to its proxy, with the keepalive timer armed.
    let listening = until("the engine listens through its proxy", async || {
        let to_proxy: Vec<Socket> = sockets(pid).into_iter().filter(|s| s.peer == listen_proxy.addr() && s.established).collect();
        (to_proxy.len() == 1).then(|| to_proxy[0])
    })
    .await;
    until("the LISTEN socket's keepalive timer is armed", async || {
        sockets(pid).iter().any(|s| s.local_port == listening.local_port && s.established && s.keepalive_timer).then_some(())
    })
    .await;

    // Idle: after its first scan the engine waits, and while its keepalive probes are sent
    // (and answered: the connection lives on) it sends no statement.
    until("the engine's first scan ends", async || scanned(&admin, &database).await.then_some(())).await;
    let before = statement_calls(&admin, &database).await;
    let probes = keepalive_probes(pid);
    until("three keepalive probes go out", async || (keepalive_probes(pid) >= probes + 3).then_some(())).await;
    let after = statement_calls(&admin, &database).await;
    assert!(!before.is_empty(), "pg_stat_statements saw none of the engine's statements");
    assert_eq!(statements_sent(&before, &after), 0, "the idle engine sent statements while its keepalive probed");
    assert!(
        sockets(pid).iter().any(|s| s.local_port == listening.local_port && s.peer == listening.peer && s.established),
        "the probes were answered: the LISTEN connection is the same, established"
    );

    // The cut, then runs: their notifications go into it and are lost.
    listen_link.blackhole();
    let runs = submit_many(&pool, &s, 5, json!({})).await;
    until("the keepalive gives the LISTEN connection up", async || {
        (!sockets(pid).iter().any(|s| s.local_port == listening.local_port && s.established)).then_some(())
    })
    .await;
    // Nothing else could have woken the engine, and it looks for work only once subscribed
    // again, which the cut prevents: the runs are as they were submitted.
    assert_eq!(scalar(&pool, "SELECT count(*) FROM steps").await, 0, "a run moved before the engine could have looked");
    assert_eq!(scalar(&pool, "SELECT count(*) FROM wakes WHERE due_at <= now()").await, runs.len() as i64, "the runs' wakes wait, unclaimed");
    assert_eq!(listen_proxy.stats().relayed, 1, "the engine reconnected through the cut");

    // Forwarding again: the engine subscribes through the proxy, rescans once and runs them.
    listen_link.restore();
    assert_eq!(until_all_done(&pool, GUARD).await, 0, "runs still running after the link came back");
    assert_eq!(scalar(&pool, "SELECT count(*) FROM runs WHERE status = 'completed'").await, runs.len() as i64);
    assert!(listen_proxy.stats().relayed >= 2, "the new LISTEN connection went through the proxy: {:?}", listen_proxy.stats());
    assert_eq!(check_invariants(&pool, Path::new(&effects)).await, Invariants::default());

    drop(engine);
    admin.close().await;
    pool.close().await;
    pg.stop().unwrap();
}
