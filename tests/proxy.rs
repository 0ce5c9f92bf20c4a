//! A loopback TCP proxy in front of PostgreSQL that can sever one process's database link.
//!
//! A process whose `DATABASE_URL` (and `SHOPFLOOR_LISTEN_DATABASE_URL`) points at the proxy
//! reaches the server only through it, so [`Proxy::cut_for`] takes that one process off the
//! network: every relayed connection is closed at once and new ones are closed as soon as they
//! are accepted until the cut ends. The server and every other client are untouched, which is
//! what a cable pulled between one engine and the database looks like, and what a server
//! restart does not show (there, every client loses its link together).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A running proxy; it stops, closing every connection through it, when dropped.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

struct Shared {
    upstream: SocketAddr,
    /// While set and in the future, accepted connections are closed at once.
    refuse_until: Mutex<Option<Instant>>,
    /// Bumped by each cut; every relay watches it and closes both ends when it moves.
    cuts: watch::Sender<u64>,
    relayed: AtomicU64,
    severed: AtomicU64,
    refused: AtomicU64,
}

/// What the proxy did, for a test's report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections relayed to the server.
    pub relayed: u64,
    /// Live connections closed by a cut.
    pub severed: u64,
    /// Connections closed on arrival during a cut, or because the server did not answer.
    pub refused: u64,
}

impl Proxy {
    /// Listens on a free loopback port and relays every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        Proxy::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST), upstream).await
    }

    /// As [`Proxy::start`], listening on `ip` (the root end of a [`crate::netns`] link, for a
    /// process in that namespace).
    pub async fn start_on(ip: IpAddr, upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind((ip, 0)).await?;
        let addr = listener.local_addr()?;
        let (cuts, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            upstream,
            refuse_until: Mutex::new(None),
            cuts,
            relayed: AtomicU64::new(0),
            severed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(Proxy { addr, shared, accept })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `url` with its host and port replaced by the proxy's, so a client of it goes through
    /// the proxy to the same database as the same user.
    pub fn url_for(&self, url: &str) -> String {
        let mut through = reqwest::Url::parse(url).unwrap_or_else(|e| panic!("{url} is not a URL: {e}"));
        through.set_host(Some(&self.addr.ip().to_string())).expect("a postgres URL has a host");
        through.set_port(Some(self.port())).expect("a postgres URL has a port");
        through.to_string()
    }

    /// Closes every connection through the proxy now, and each new one as it arrives for `d`.
    pub fn cut_for(&self, d: Duration) {
        *self.shared.refuse_until.lock().expect("the proxy's lock is never poisoned") = Some(Instant::now() + d);
        self.shared.cuts.send_modify(|n| *n += 1);
    }

    /// Ends a cut now: connections are relayed again.
    pub fn heal(&self) {
        *self.shared.refuse_until.lock().expect("the proxy's lock is never poisoned") = None;
    }

    /// Whether a cut is in force.
    pub fn is_cut(&self) -> bool {
        self.shared.refusing()
    }

    pub fn stats(&self) -> ProxyStats {
        ProxyStats {
            relayed: self.shared.relayed.load(Ordering::Relaxed),
            severed: self.shared.severed.load(Ordering::Relaxed),
            refused: self.shared.refused.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // No new connections, and a last cut closes the live ones.
        self.accept.abort();
        self.shared.cuts.send_modify(|n| *n += 1);
    }
}

impl Shared {
    fn refusing(&self) -> bool {
        self.refuse_until.lock().expect("the proxy's lock is never poisoned").is_some_and(|until| Instant::now() < until)
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else { continue };
        if shared.refusing() {
            shared.refused.fetch_add(1, Ordering::Relaxed);
            drop(client);
            continue;
        }
        tokio::spawn(relay(client, Arc::clone(&shared)));
    }
}

/// Relays one connection until either side closes it or a cut comes.
async fn relay(mut client: TcpStream, shared: Arc<Shared>) {
    let mut cut = shared.cuts.subscribe();
    cut.mark_unchanged();
    let Ok(mut server) = TcpStream::connect(shared.upstream).await else {
        // The server is away (restarting): the client sees its connection closed, as it would
        // see a refusal.
        shared.refused.fetch_add(1, Ordering::Relaxed);
        return;
    };
    // A cut that came while we were connecting applies to this connection too.
    if cut.has_changed().unwrap_or(true) || shared.refusing() {
        shared.refused.fetch_add(1, Ordering::Relaxed);
        return;
    }
    shared.relayed.fetch_add(1, Ordering::Relaxed);
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = cut.changed() => {
            shared.severed.fetch_add(1, Ordering::Relaxed);
        }
    }
    // Both streams are dropped here, which closes them; each peer learns of it on its next
    // read or write, as after a network failure.
}
