//! Inside a walled step's room, the first process after bubblewrap's (`shopfloor room`): it
//! listens on the room's loopback for the harness and carries each connection to the host's
//! proxy over the unix socket bound into the room, then runs the harness and ends with it.
//!
//! - The proxy's port, in the harness's `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY` (and their
//!   lowercase forms); `NO_PROXY` names loopback, which has no proxy to go through.
//! - Each `--forward host:port`: connections to that loopback address are tunnelled to it
//!   through the proxy (`CONNECT`), for a client that goes straight to a loopback base URL.
//!
//! Interrupts are the harness's: the host signals the room's processes, and this one keeps
//! carrying the harness's connections until it has ended (its last words may need them).

use std::path::PathBuf;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};

/// `shopfloor room`: not for people; the host starts it inside a step's walls.
#[derive(Debug, clap::Args)]
pub struct RoomArgs {
    /// The host's proxy, a unix socket.
    #[arg(long)]
    pub proxy: PathBuf,
    /// A loopback `host:port` to tunnel through the proxy (repeated).
    #[arg(long = "forward")]
    pub forward: Vec<String>,
    /// The harness and its arguments.
    #[arg(last = true, required = true)]
    pub program: Vec<String>,
}

/// Runs the harness behind its bridge; answers its exit code (128 and the signal when a signal
/// ended it, as bubblewrap reports it).
pub async fn run(args: RoomArgs) -> Result<u8, String> {
    use tokio::signal::unix::{SignalKind, signal};
    // Handled, never acted on: the harness gets its own and decides. (Tokio's handler stays
    // installed once registered; the streams are not needed.)
    for kind in [SignalKind::interrupt(), SignalKind::terminate(), SignalKind::hangup()] {
        drop(signal(kind).map_err(|e| format!("cannot take signals: {e}"))?);
    }
    let proxy = TcpListener::bind("127.0.0.1:0").await.map_err(|e| format!("cannot listen on the room's loopback: {e}"))?;
    let port = proxy.local_addr().map_err(|e| e.to_string())?.port();
    tokio::spawn(carry(proxy, args.proxy.clone(), None));
    for dest in &args.forward {
        let listener = TcpListener::bind(dest.as_str()).await.map_err(|e| format!("cannot listen on {dest} in the room: {e}"))?;
        tokio::spawn(carry(listener, args.proxy.clone(), Some(dest.clone())));
    }
    let (program, rest) = args.program.split_first().ok_or("no harness to run")?;
    let url = format!("http://127.0.0.1:{port}");
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(rest).kill_on_drop(false);
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        cmd.env(name, &url).env(name.to_ascii_lowercase(), &url);
    }
    cmd.env("NO_PROXY", "localhost,127.0.0.1,::1").env("no_proxy", "localhost,127.0.0.1,::1");
    let status = cmd.spawn().map_err(|e| format!("cannot start `{program}`: {e}"))?.wait().await.map_err(|e| e.to_string())?;
    use std::os::unix::process::ExitStatusExt as _;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code.clamp(0, 255) as u8,
        (None, Some(sig)) => (128 + sig).clamp(0, 255) as u8,
        (None, None) => 255,
    })
}

/// Carries each connection of `listener` to the proxy: as it is, or tunnelled to `dest`.
async fn carry(listener: TcpListener, proxy: PathBuf, dest: Option<String>) {
    while let Ok((tcp, _)) = listener.accept().await {
        let (proxy, dest) = (proxy.clone(), dest.clone());
        tokio::spawn(async move {
            let _ = join(tcp, &proxy, dest.as_deref()).await;
        });
    }
}

async fn join(mut tcp: TcpStream, proxy: &std::path::Path, dest: Option<&str>) -> std::io::Result<()> {
    let mut unix = UnixStream::connect(proxy).await?;
    if let Some(dest) = dest {
        unix.write_all(format!("CONNECT {dest} HTTP/1.1\r\nHost: {dest}\r\n\r\n").as_bytes()).await?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        // Byte by byte up to the head's end: what follows is the destination's.
        while !head.ends_with(b"\r\n\r\n") {
            if unix.read(&mut byte).await? == 0 || head.len() > 16 << 10 {
                return Ok(());
            }
            head.push(byte[0]);
        }
        if !head.starts_with(b"HTTP/1.1 200") {
            // Refused: the client sees the connection close (the proxy has reported it).
            return Ok(());
        }
    }
    tokio::io::copy_bidirectional(&mut tcp, &mut unix).await.map(|_| ())
}
