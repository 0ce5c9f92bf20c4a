//! A frozen process cannot hold the line: a serving process's connections work under
//! `db::GUARDS`, so a transaction left idle (a process stopped mid-change) is ended by the
//! server and the row it locked is free for everyone else, while a migration runs unlimited.

use std::time::Duration;

use engine::db;
use engine::testkit::test_db;
use sqlx::Connection as _;

#[tokio::test]
async fn a_transaction_left_open_by_a_frozen_process_is_ended_and_its_lock_released() {
    let db = test_db().await;
    let guarded = db::connect_guarded(&db.url, 2, db::Route::Direct).await.unwrap();
    for (name, value) in db::GUARDS {
        let shown: String = sqlx::query_scalar(&format!("SHOW {name}")).fetch_one(&guarded).await.unwrap();
        assert_eq!(shown, *value, "{name}");
    }
    sqlx::query("CREATE TABLE held (id int PRIMARY KEY)").execute(&db.pool).await.unwrap();
    sqlx::query("INSERT INTO held VALUES (1)").execute(&db.pool).await.unwrap();

    // The frozen process: it locked the row, then stopped sending anything.
    let mut frozen = guarded.pool().acquire().await.unwrap().detach();
    sqlx::query("BEGIN").execute(&mut frozen).await.unwrap();
    sqlx::query("SELECT id FROM held WHERE id = 1 FOR UPDATE").execute(&mut frozen).await.unwrap();

    // Another process waits for the row (unlimited here), and gets it once the server ended
    // the idle transaction.
    let mut other = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(120), sqlx::query_scalar::<_, i32>("SELECT id FROM held WHERE id = 1 FOR UPDATE").fetch_one(&mut other))
        .await
        .expect("the frozen transaction still holds the row");
    assert_eq!(got.unwrap(), 1);
    assert!(sqlx::query("SELECT 1").execute(&mut frozen).await.is_err(), "the frozen session was ended");
    drop(other);
    guarded.close().await;
    db.finish().await;
}

/// An operator tells processes apart in `pg_stat_activity` by the `application_name` their
/// URL gives; without one, every connection is `shopfloor`.
#[tokio::test]
async fn the_application_name_a_url_gives_is_kept() {
    let db = test_db().await;
    let sep = if db.url.contains('?') { '&' } else { '?' };
    for (url, name) in [(format!("{}{sep}application_name=engine-b7", db.url), "engine-b7"), (db.url.clone(), "shopfloor")] {
        for route in [db::Route::Direct, db::Route::Pooler] {
            let pool = db::connect_guarded(&url, 1, route).await.unwrap();
            let shown: String =
                sqlx::query_scalar("SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()").fetch_one(&pool).await.unwrap();
            assert_eq!(shown, name, "{route:?}");
            pool.close().await;
        }
    }
    db.finish().await;
}
