//! Serving the app on a listener: axum's router on hyper, as `axum::serve` does, with what it
//! cannot set: a bound on reading a request's head ([`HEAD_READ_TIMEOUT`]), which also closes a
//! connection left idle between requests, so a client that opens connections and sends a
//! header byte now and then holds none for long. (A slow body is the request timeout's:
//! `limits::timeout`, on every route.) Each request carries its peer's address
//! (`ConnectInfo<SocketAddr>`). On `shutdown` no connection is taken; open ones finish their
//! request and close.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// How long a connection may take to send a request's head, or stay idle between two.
pub const HEAD_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` until `shutdown`, then waits for the open connections to finish.
pub async fn serve(listener: TcpListener, router: Router, shutdown: impl Future<Output = ()>) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(HEAD_READ_TIMEOUT);
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, most likely: wait a moment rather than spin.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = tower::ServiceBuilder::new()
            .map_request(move |mut request: axum::http::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(ConnectInfo::<SocketAddr>(peer));
                request
            })
            .service(router.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            // hyper's bound starts at a request's first byte: a connection that sends none is
            // closed here.
            let mut first = [0u8; 1];
            if !matches!(tokio::time::timeout(HEAD_READ_TIMEOUT, stream.peek(&mut first)).await, Ok(Ok(1..))) {
                return;
            }
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), TowerToHyperService::new(service));
            if let Err(e) = watcher.watch(connection).await {
                tracing::debug!(error = %e, %peer, "a connection ended in error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
