//! The proxy in the host that a walled step's connections go through, on a unix socket of the
//! step's own: an HTTP proxy taking `CONNECT host:port` (a tunnel, for TLS) and absolute-form
//! requests (`GET http://host:port/path`, plain HTTP, sent on with `Connection: close`).
//! A destination off the step's list is answered 403 with why, and reported once.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::task::JoinHandle;

use super::{Allowed, Source, is_hosts_own};

/// The longest request head read.
const HEAD_MAX: usize = 16 << 10;
/// How long a connection out may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// A step's proxy; it stops when dropped.
pub struct Proxy {
    task: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the proxy tells of each destination it refused, once per destination.
pub type Refused = Arc<dyn Fn(String) + Send + Sync>;

impl Proxy {
    /// Listens on `socket` (a stale one from before a restart is replaced).
    pub fn start(socket: &Path, allowed: Allowed, refused: Refused) -> std::io::Result<Proxy> {
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir)?;
        }
        match std::fs::remove_file(socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(socket)?;
        let allowed = Arc::new(allowed);
        let told: Arc<Mutex<HashSet<String>>> = Arc::default();
        // The connections are the task's: stopping it stops them.
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { break };
                        let (allowed, refused, told) = (allowed.clone(), refused.clone(), told.clone());
                        connections.spawn(async move {
                            let tell = |dest: &str| {
                                if told.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(dest.to_owned()) {
                                    refused(dest.to_owned());
                                }
                            };
                            serve(stream, &allowed, &tell).await;
                        });
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Ok(Proxy { task })
    }
}

/// One request; a refused destination is told (before the client hears it).
async fn serve(mut client: UnixStream, allowed: &Allowed, tell: &(dyn Fn(&str) + Send + Sync)) {
    let (head, rest) = match read_head(&mut client).await {
        Some(h) => h,
        None => {
            answer(&mut client, "400 Bad Request", "shopfloor's proxy takes CONNECT host:port and http:// requests").await;
            return;
        }
    };
    let request = match Request::parse(&head) {
        Ok(r) => r,
        Err(why) => {
            answer(&mut client, "400 Bad Request", &why).await;
            return;
        }
    };
    let dest = request.destination();
    let addrs = match reach(allowed, &request.host, request.port).await {
        Ok(addrs) => addrs,
        Err(Refusal::Refused(why)) => {
            tell(&dest);
            answer(&mut client, "403 Forbidden", &format!("shopfloor: the step may not reach {dest}: {why}")).await;
            return;
        }
        Err(Refusal::Unresolved(why)) => {
            answer(&mut client, "502 Bad Gateway", &format!("shopfloor: cannot resolve {dest}: {why}")).await;
            return;
        }
    };
    let Some(mut upstream) = connect(&addrs).await else {
        answer(&mut client, "502 Bad Gateway", &format!("shopfloor: cannot connect to {dest}")).await;
        return;
    };
    let opening = match &request.forward {
        None => {
            if client.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n").await.is_err() {
                return;
            }
            rest
        }
        Some(head) => [head.as_bytes(), &rest].concat(),
    };
    if upstream.write_all(&opening).await.is_ok() {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    }
}

enum Refusal {
    Refused(String),
    Unresolved(String),
}

/// The addresses to connect to, once the destination is allowed; a workflow's word never
/// reaches an address of the host's own.
async fn reach(allowed: &Allowed, host: &str, port: u16) -> Result<Vec<SocketAddr>, Refusal> {
    let source = allowed.source(host, port).ok_or_else(|| Refusal::Refused("not in the crew node's network.allow nor the host's --egress-allow".into()))?;
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port)).await.map_err(|e| Refusal::Unresolved(e.to_string()))?.collect();
    if source == Source::Workflow && addrs.iter().any(|a| is_hosts_own(a.ip())) {
        return Err(Refusal::Refused("it is an address of the host's own, which only the host's --egress-allow opens".into()));
    }
    Ok(addrs)
}

async fn connect(addrs: &[SocketAddr]) -> Option<TcpStream> {
    for addr in addrs {
        if let Ok(Ok(s)) = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            return Some(s);
        }
    }
    None
}

/// Reads up to the end of the request head; answers it and what followed it.
async fn read_head(client: &mut UnixStream) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Some((buf, rest));
        }
        if buf.len() > HEAD_MAX {
            return None;
        }
    }
}

async fn answer(client: &mut UnixStream, status: &str, text: &str) {
    let body = format!("{text}\n");
    let reply = format!("HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    let _ = client.write_all(reply.as_bytes()).await;
    let _ = client.shutdown().await;
}

/// A proxy request: where to, and for plain HTTP the head to send on.
#[derive(Debug)]
struct Request {
    host: String,
    port: u16,
    /// `None` for a tunnel.
    forward: Option<String>,
}

/// Headers for the proxy alone, or about this connection: not sent on.
const HOP_BY_HOP: [&str; 5] = ["proxy-connection", "proxy-authorization", "connection", "keep-alive", "te"];

impl Request {
    fn parse(head: &[u8]) -> Result<Request, String> {
        let mut headers = [httparse::EMPTY_HEADER; 100];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(head) {
            Ok(httparse::Status::Complete(_)) => {}
            _ => return Err("a malformed request head".into()),
        }
        let (method, target) = (req.method.unwrap_or_default(), req.path.unwrap_or_default());
        if method.eq_ignore_ascii_case("CONNECT") {
            let (host, port) = protocol::egress::split_host_port(target).ok_or("CONNECT takes host:port")?;
            let port = port.ok_or("CONNECT takes host:port")?;
            return Ok(Request { host: protocol::egress::normalize(&host), port, forward: None });
        }
        let Some(rest) = target.strip_prefix("http://") else {
            return Err(format!("`{method} {target}`: the proxy takes CONNECT host:port (for https) and absolute http:// URLs"));
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let path = if path.starts_with('?') { format!("/{path}") } else { path.to_owned() };
        let (host, port) = protocol::egress::split_host_port(authority).ok_or("a bad port")?;
        let mut out = format!("{method} {path} HTTP/1.1\r\n");
        for h in req.headers.iter() {
            if HOP_BY_HOP.iter().any(|n| h.name.eq_ignore_ascii_case(n)) {
                continue;
            }
            out.push_str(h.name);
            out.push_str(": ");
            out.push_str(&String::from_utf8_lossy(h.value));
            out.push_str("\r\n");
        }
        out.push_str("Connection: close\r\n\r\n");
        Ok(Request { host: protocol::egress::normalize(&host), port: port.unwrap_or(80), forward: Some(out) })
    }

    /// `host:port` as events and answers name it.
    fn destination(&self) -> String {
        if self.host.contains(':') { format!("[{}]:{}", self.host, self.port) } else { format!("{}:{}", self.host, self.port) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asks the proxy at `socket` to CONNECT to `dest`; answers its status line.
    async fn ask(socket: &Path, dest: &str) -> String {
        let mut s = UnixStream::connect(socket).await.unwrap();
        s.write_all(format!("CONNECT {dest} HTTP/1.1\r\nHost: {dest}\r\n\r\n").as_bytes()).await.unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n") && s.read(&mut byte).await.unwrap() == 1 {
            head.push(byte[0]);
        }
        String::from_utf8_lossy(&head).trim().to_owned()
    }

    #[tokio::test]
    async fn a_workflows_word_never_opens_the_hosts_own_addresses() {
        let service = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = service.local_addr().unwrap().port();
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("proxy.sock");
        let told: Arc<Mutex<Vec<String>>> = Arc::default();
        let t = told.clone();
        let rule = |s: &str| protocol::egress::Rule::parse(s).unwrap();
        // The workflow names the host's loopback (twice: by address and by name); the operator
        // names another port of it.
        let service2 = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port2 = service2.local_addr().unwrap().port();
        let allowed = Allowed::new([
            (rule(&format!("127.0.0.1:{port}")), Source::Workflow),
            (rule(&format!("localhost:{port}")), Source::Workflow),
            (rule(&format!("127.0.0.1:{port2}")), Source::Operator),
        ]);
        let _proxy = Proxy::start(&socket, allowed, Arc::new(move |d| t.lock().unwrap().push(d))).unwrap();
        assert!(ask(&socket, &format!("127.0.0.1:{port}")).await.contains("403"));
        assert!(ask(&socket, &format!("localhost:{port}")).await.contains("403"));
        assert!(ask(&socket, &format!("127.0.0.1:{port}")).await.contains("403"));
        assert!(ask(&socket, &format!("127.0.0.1:{port2}")).await.contains("200"));
        assert!(ask(&socket, "example.com:443").await.contains("403"));
        // Each refused destination is told once.
        let told = told.lock().unwrap().clone();
        assert_eq!(told, [format!("127.0.0.1:{port}"), format!("localhost:{port}"), "example.com:443".to_owned()]);
    }

    #[test]
    fn requests_read_as_proxies_take_them() {
        let r = Request::parse(b"CONNECT API.anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\n\r\n").unwrap();
        assert_eq!((r.destination().as_str(), r.forward.is_none()), ("api.anthropic.com:443", true));
        let r = Request::parse(b"GET http://[::1]:8080?q=1 HTTP/1.1\r\nHost: [::1]:8080\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n").unwrap();
        assert_eq!(r.destination(), "[::1]:8080");
        assert_eq!(r.forward.as_deref(), Some("GET /?q=1 HTTP/1.1\r\nHost: [::1]:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"));
        assert!(Request::parse(b"GET /x HTTP/1.1\r\n\r\n").unwrap_err().contains("absolute http:// URLs"));
        assert!(Request::parse(b"CONNECT example.com HTTP/1.1\r\n\r\n").is_err());
    }
}
