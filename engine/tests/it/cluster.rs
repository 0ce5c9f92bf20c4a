//! The embedded cluster: made once, found running rather than started twice, stopped, and
//! started again with its data kept.

use std::time::Instant;

use engine::cluster::{self, ClusterOptions};
use engine::testkit::OwnCluster;
use sqlx::{Connection, PgConnection};

#[tokio::test]
async fn cluster_starts_is_reused_and_keeps_data_across_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let own = OwnCluster::new(tmp.path().join("data"));
    let opts = &own.opts;

    let t = Instant::now();
    let first = cluster::ensure_running(opts).await.unwrap();
    eprintln!("first start (initdb included): {:?}", t.elapsed());
    assert!(first.started_here);
    assert!(first.url.starts_with("postgres://shopfloor:"), "{}", first.url);
    assert!(first.url.ends_with(&format!("@127.0.0.1:{}/shopfloor", first.port)), "{}", first.url);
    // Other users of the machine reach the port: without the password, no one gets in (the
    // role is a superuser), and the password is in a file only its owner reads.
    let bare = format!("postgres://shopfloor@127.0.0.1:{}/shopfloor", first.port);
    let refused = PgConnection::connect(&bare).await.expect_err("no password, no connection");
    assert!(refused.to_string().contains("password"), "{refused}");
    let wrong = format!("postgres://shopfloor:guess@127.0.0.1:{}/shopfloor", first.port);
    assert!(PgConnection::connect(&wrong).await.is_err(), "a wrong password is refused");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(tmp.path().join("data/pg.password")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    let mut conn = PgConnection::connect(&first.url).await.unwrap();
    let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut conn).await.unwrap();
    assert_eq!(one, 1);
    let max: String = sqlx::query_scalar("SHOW max_connections").fetch_one(&mut conn).await.unwrap();
    assert_eq!(max, "200");
    let fsync: String = sqlx::query_scalar("SHOW fsync").fetch_one(&mut conn).await.unwrap();
    assert_eq!(fsync, "off");
    if pg_stat_statements_installed() {
        sqlx::query("CREATE EXTENSION pg_stat_statements").execute(&mut conn).await.unwrap();
        let _: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_statements").fetch_one(&mut conn).await.expect("pg_stat_statements is preloaded");
    }
    sqlx::query("CREATE TABLE kept (x int)").execute(&mut conn).await.unwrap();
    sqlx::query("INSERT INTO kept VALUES (42)").execute(&mut conn).await.unwrap();
    conn.close().await.unwrap();

    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::fs::MetadataExt;
        let owner = std::fs::metadata(first.pgdata()).unwrap().uid();
        assert_ne!(owner, 0, "as root, the cluster must belong to the postgres user");
    }

    let again = cluster::ensure_running(opts).await.unwrap();
    assert!(!again.started_here, "a running cluster is reused, not started twice");
    assert_eq!(again.url, first.url);

    first.stop().unwrap();
    assert!(PgConnection::connect(&first.url).await.is_err(), "the server should be stopped");

    let t = Instant::now();
    let restarted = cluster::ensure_running(opts).await.unwrap();
    eprintln!("restart: {:?}", t.elapsed());
    assert!(restarted.started_here);
    assert_eq!(restarted.url, first.url, "the remembered port is reused while free");
    let mut conn = PgConnection::connect(&restarted.url).await.unwrap();
    let x: i32 = sqlx::query_scalar("SELECT x FROM kept").fetch_one(&mut conn).await.unwrap();
    assert_eq!(x, 42);
    conn.close().await.unwrap();

    cluster::stop_dir(opts).unwrap();
    assert!(PgConnection::connect(&restarted.url).await.is_err(), "stop_dir should stop it");
    cluster::stop_dir(opts).expect("stopping a stopped cluster is fine");
}

#[tokio::test]
async fn stop_dir_without_a_cluster_is_fine() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = ClusterOptions { data_dir: tmp.path().join("nothing"), durable: false };
    cluster::stop_dir(&opts).unwrap();
}

/// Whether the machine's PostgreSQL has the pg_stat_statements library (Debian's layout).
fn pg_stat_statements_installed() -> bool {
    std::fs::read_dir("/usr/lib/postgresql").into_iter().flatten().flatten().any(|v| v.path().join("lib/pg_stat_statements.so").is_file())
}
