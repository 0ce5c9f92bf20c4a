//! The testkit: each test gets its own database, cloned from the migrated template.

use engine::{db, testkit};

#[tokio::test]
async fn each_test_db_is_a_separate_migrated_database() {
    let (a, b) = tokio::join!(testkit::test_db(), testkit::test_db());
    assert_ne!(a.name, b.name);
    assert_ne!(a.url, b.url);
    for t in [&a, &b] {
        assert!(t.name.starts_with("t_"), "{}", t.name);
        let current: String = sqlx::query_scalar("SELECT current_database()").fetch_one(&t.pool).await.unwrap();
        assert_eq!(current, t.name);
        db::check_schema(&t.pool).await.expect("the test database is migrated");
    }

    // What one test writes, the other does not see.
    sqlx::query("CREATE TABLE only_in_a (x int)").execute(&a.pool).await.unwrap();
    let in_b: bool = sqlx::query_scalar("SELECT to_regclass('only_in_a') IS NOT NULL").fetch_one(&b.pool).await.unwrap();
    assert!(!in_b);

    let (name_a, url_b) = (a.name.clone(), b.url.clone());
    a.finish().await;
    b.finish().await;
    let admin = db::connect(&std::env::var("DATABASE_URL").unwrap(), 1).await.unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname = $1").bind(&name_a).fetch_one(&admin).await.unwrap();
    assert_eq!(left, 0, "finish drops the database");
    assert!(db::connect(&url_b, 1).await.is_err());
}
