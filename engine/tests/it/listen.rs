//! The `LISTEN` connection (`engine::listen`) against a real server: notifications arrive, a
//! connection the server ends is reported lost, and subscribing again listens again.

use std::time::Duration;

use engine::listen::{ListenError, Listener, Target};
use engine::testkit::test_db;

/// Hang guard only: nothing here is timed.
const GUARD: Duration = Duration::from_secs(60);

async fn notify(pool: &engine::db::Db, payload: &str) {
    sqlx::query("SELECT pg_notify('t_listen', $1)").bind(payload).execute(pool).await.unwrap();
}

/// The backends of this database that listen, once there are `want` of them.
async fn listening_backends(pool: &engine::db::Db, want: usize) -> Vec<i32> {
    let found = async {
        loop {
            let pids: Vec<i32> = sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%'")
                .fetch_all(pool)
                .await
                .unwrap();
            if pids.len() >= want {
                return pids;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(GUARD, found).await.expect("no backend listens")
}

#[tokio::test]
async fn notifications_arrive_and_a_lost_connection_is_reported_and_subscribed_again() {
    let db = test_db().await;
    let target: Target = db.url.parse().unwrap();
    let mut listener = Listener::new(&target, "t_listen");
    assert!(!listener.is_subscribed());
    listener.subscribe().await.unwrap();
    notify(&db.pool, "one").await;
    assert_eq!(tokio::time::timeout(GUARD, listener.recv()).await.unwrap().unwrap(), "one");

    // The server ends the session (a restart, an operator): the listener says so.
    let pids = listening_backends(&db.pool, 1).await;
    assert_eq!(pids.len(), 1, "one LISTEN connection");
    let name: String = sqlx::query_scalar("SELECT application_name FROM pg_stat_activity WHERE pid = $1").bind(pids[0]).fetch_one(&db.pool).await.unwrap();
    assert_eq!(name, "shopfloor");
    sqlx::query("SELECT pg_terminate_backend($1)").bind(pids[0]).execute(&db.pool).await.unwrap();
    let lost = tokio::time::timeout(GUARD, listener.recv()).await.expect("the loss was never reported");
    assert!(matches!(lost, Err(ListenError::Lost { .. })), "{lost:?}");
    assert!(!listener.is_subscribed());

    // Subscribed again, on a new connection, it hears what is committed from then on.
    listener.subscribe().await.unwrap();
    let again = listening_backends(&db.pool, 1).await;
    assert!(!again.contains(&pids[0]), "the ended backend is not reused");
    notify(&db.pool, "two").await;
    assert_eq!(tokio::time::timeout(GUARD, listener.recv()).await.unwrap().unwrap(), "two");
    drop(listener);
    db.finish().await;
}

#[tokio::test]
async fn a_server_that_cannot_be_reached_fails_the_subscribe_without_showing_the_password() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let target: Target = format!("postgres://ann:hunter2@127.0.0.1:{port}/shop").parse().unwrap();
    let mut listener = Listener::new(&target, "t_listen");
    let err = tokio::time::timeout(GUARD, listener.subscribe()).await.unwrap().unwrap_err();
    assert!(matches!(err, ListenError::Connect { .. }), "{err:?}");
    let shown = err.to_string();
    assert!(shown.contains(&format!("127.0.0.1:{port}/shop")) && !shown.contains("hunter2"), "{shown}");
    assert!(!listener.is_subscribed());
}
