//! Shared test data: an org, a project and a workflow written through the store
//! (`engine::testkit::seed`), and runs of it.

use std::time::Duration;

use engine::ids::{OrgId, RunId};
use engine::store::runs::{self, NewRun};
use engine::store::{Actor, Change};
use serde_json::json;
use engine::db::Db;

pub(crate) use engine::testkit::{seed, Seed};

pub(crate) const TWO_STEPS: &str = include_str!("../../../tests/workflows/two_steps.yaml");

/// A run of the seeded workflow with no input.
pub(crate) fn new_run(s: &Seed) -> NewRun {
    with_input(s, json!({}))
}

/// A run of the seeded workflow with `input`.
pub(crate) fn with_input(s: &Seed, input: serde_json::Value) -> NewRun {
    engine::testkit::new_run(s, input)
}

/// Submits `new` in a change of its own.
pub(crate) async fn submit_new(pool: &Db, new: NewRun) -> RunId {
    let mut ch = Change::begin(pool, Actor::System).await.unwrap();
    let run = runs::submit(&mut ch, new).await.unwrap();
    ch.commit().await.unwrap();
    run
}

pub(crate) async fn submit(pool: &Db, s: &Seed) -> RunId {
    submit_new(pool, new_run(s)).await
}

/// Polls `done` every 20 ms until it holds; panics with `what` after `limit`.
pub(crate) async fn until(what: &str, limit: Duration, done: impl AsyncFn() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) async fn count(pool: &Db, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Makes the database refuse, with an SQL error, every insert into `table` of a row for which
/// `when` (a condition on `NEW`) holds: what a statement of an advance may meet.
pub(crate) async fn poison(pool: &Db, table: &str, when: &str) {
    sqlx::query(&format!(
        "CREATE FUNCTION poison_{table}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF {when} THEN RAISE EXCEPTION 'poisoned row'; END IF; RETURN NEW; END $$"
    ))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(&format!("CREATE TRIGGER poison BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION poison_{table}()")).execute(pool).await.unwrap();
}

/// A change by `actor` holding the lock of `org`'s `run`.
pub(crate) async fn locked(pool: &Db, actor: Actor, org: OrgId, run: RunId) -> Change {
    let mut ch = Change::begin(pool, actor).await.unwrap();
    ch.lock_run(org, run).await.unwrap().expect("the run exists");
    ch
}
