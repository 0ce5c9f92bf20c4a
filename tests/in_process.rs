//! The API in the test's own process: a router served on a loopback port until a token is
//! cancelled (its engine is `engine::testkit::Engine`). Shared by the API's own tests
//! (`api/tests/it/support.rs`) and the console's (`tests/console/support.rs`).

use std::future::Future;
use std::pin::Pin;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A router served on loopback at `base`, until `stop` is cancelled.
pub struct Served {
    pub base: String,
    pub stop: CancellationToken,
}

/// When a server stops taking connections.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Serves `router` on a port of its own on 127.0.0.1 with axum's own loop. `closing` runs once
/// `stop` is cancelled, before the server drains (an app's event streams end there).
pub async fn serve(router: axum::Router, closing: impl FnOnce() + Send + 'static) -> Served {
    serve_with(router, closing, |listener, router, shutdown| async move {
        let _ = axum::serve(listener, router).with_graceful_shutdown(shutdown).await;
    })
    .await
}

/// As [`serve`], by `serve` (a listener's loop: `api::http::serve::serve`, as `shopfloor api`
/// serves the app, with peers' addresses and its head-read bound).
pub async fn serve_with<F: Future<Output = ()> + Send + 'static>(
    router: axum::Router, closing: impl FnOnce() + Send + 'static, serve: impl FnOnce(TcpListener, axum::Router, Shutdown) -> F,
) -> Served {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let base = format!("http://{}", listener.local_addr().expect("local addr"));
    let stop = CancellationToken::new();
    let cancelled = stop.clone();
    let shutdown: Shutdown = Box::pin(async move {
        cancelled.cancelled().await;
        closing();
    });
    tokio::spawn(serve(listener, router, shutdown));
    Served { base, stop }
}
