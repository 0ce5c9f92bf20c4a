//! Behind a transaction pooler, `LISTEN` goes to its own direct URL in every process:
//! `shopfloor api` and `shopfloor engine` listen on `SHOPFLOOR_LISTEN_DATABASE_URL`, never on
//! `DATABASE_URL` (a pooler would hand the listening session to other clients).

use std::time::Duration;

use engine::testkit::test_db;
use shopfloor_tests::process::{Proc, free_port, shopfloor};

/// The application names of the backends that `LISTEN`, once there are `want` of them.
async fn listeners(pool: &engine::db::Db, want: i64) -> Vec<String> {
    let listening = "FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%'";
    shopfloor_tests::until_count(pool, &format!("SELECT count(*) {listening}"), want, Duration::from_secs(120)).await;
    sqlx::query_scalar(&format!("SELECT application_name {listening} ORDER BY 1")).fetch_all(pool).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_process_listens_on_the_listen_url() {
    let db = test_db().await;
    // The same server, told apart by the application name the listen URL carries.
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let listen_url = format!("{}{sep}application_name=shopfloor-listen", db.url);
    let port = free_port();
    let spawn = |args: &[&str]| {
        shopfloor(args, &db.url)
            .env("SHOPFLOOR_LISTEN_DATABASE_URL", &listen_url)
            .env("SHOPFLOOR_LISTEN", format!("127.0.0.1:{port}"))
            .spawn()
            .expect("spawn shopfloor")
    };
    let _api = Proc(spawn(&["api", "--log", "warn"]));
    shopfloor_tests::until_ok(&format!("http://127.0.0.1:{port}/readyz")).await;
    let _engine = Proc(spawn(&["engine", "--test-executor", "--log", "warn"]));
    // The replica's event hub (which hosts' claims wait on too) and the engine.
    let names = listeners(&db.pool, 2).await;
    assert_eq!(names, ["shopfloor-listen", "shopfloor-listen"], "a process listens through DATABASE_URL");
    drop((_api, _engine));
    db.finish().await;
}
