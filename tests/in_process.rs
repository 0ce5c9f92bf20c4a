//! The API in the test's own process: a router served on a loopback port until a token is
//! cancelled (its engine is `engine::testkit::Engine`). Shared by the API's own tests
//! (`api/tests/it/support.rs`) and the console's (`tests/console/support.rs`).

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;

/// A router served on loopback at `base`, until `stop` is cancelled.
pub struct Served {
    pub base: String,
    pub stop: CancellationToken,
}

/// Serves `router` on a port of its own on 127.0.0.1; each request carries its peer's address
/// when `peers` (`ConnectInfo<SocketAddr>`, as `shopfloor api` serves it). `closing` runs once
/// `stop` is cancelled, before the server drains (an app's event streams end there).
pub async fn serve(router: axum::Router, peers: bool, closing: impl FnOnce() + Send + 'static) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let base = format!("http://{}", listener.local_addr().expect("local addr"));
    let stop = CancellationToken::new();
    let cancelled = stop.clone();
    let shutdown = async move {
        cancelled.cancelled().await;
        closing();
    };
    tokio::spawn(async move {
        if peers {
            let app = router.into_make_service_with_connect_info::<SocketAddr>();
            let _ = axum::serve(listener, app).with_graceful_shutdown(shutdown).await;
        } else {
            let _ = axum::serve(listener, router).with_graceful_shutdown(shutdown).await;
        }
    });
    Served { base, stop }
}
