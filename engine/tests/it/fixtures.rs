//! Shared test data: an org, a project and a workflow written through the store
//! (`engine::testkit::seed`), and runs of it.

use std::time::Duration;

use engine::db::Db;
use engine::definition::Definition;
use engine::ids::{OrgId, RunId, WorkflowId};
use engine::store::runs::{self, NewRun};
use engine::store::{Actor, Change, approvals, workflows};
use engine::testkit::{Engine, TestDb, test_db};
use serde_json::{Map, Value, json};

pub(crate) use engine::testkit::{Seed, seed};

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

/// A test database seeded with `source`: the org `acme`, its project and the workflow.
pub(crate) async fn seeded(source: &str) -> (TestDb, Seed) {
    let db = test_db().await;
    let s = seed(&db.pool, "acme", source).await;
    (db, s)
}

/// A test database seeded with `source` and an engine `e1` with the test executor on it.
pub(crate) async fn started(source: &str) -> (TestDb, Seed, Engine) {
    let (db, s) = seeded(source).await;
    let eng = Engine::executing(&db, "e1", None);
    (db, s, eng)
}

/// The end of a test with an engine: stops the engine, then checks the teardown invariants and
/// drops the database.
pub(crate) async fn finish(eng: Engine, db: TestDb) {
    eng.stop();
    db.finish().await;
}

/// A test database seeded with `source` and a run of it submitted, with no engine to move it.
pub(crate) async fn submitted(source: &str) -> (TestDb, Seed, RunId) {
    let (db, s) = seeded(source).await;
    let run = submit(&db.pool, &s).await;
    (db, s, run)
}

/// Adds workflow `name` (or its next version) to the seed's project.
pub(crate) async fn add_workflow(pool: &Db, s: &Seed, name: &str, source: &str) -> (WorkflowId, i32) {
    assert!(engine::definition::parse(source).is_ok(), "{name} does not validate");
    let mut ch = Change::begin(pool, Actor::System).await.unwrap();
    let out = workflows::put_version(&mut ch, s.org, s.project, name, source).await.unwrap();
    ch.commit().await.unwrap();
    out
}

/// Cancels the run with `reason`, as a person does.
pub(crate) async fn cancel(pool: &Db, org: OrgId, run: RunId, reason: &str) {
    let mut ch = Change::begin(pool, Actor::System).await.unwrap();
    runs::cancel(&mut ch, org, run, reason).await.unwrap();
    ch.commit().await.unwrap();
}

/// Reruns `source` with `def`, from the nodes `from` (none: all of it).
pub(crate) async fn rerun(pool: &Db, org: OrgId, source: RunId, def: &Definition, from: &[&str]) -> RunId {
    let from: Vec<String> = from.iter().map(|s| (*s).to_owned()).collect();
    let mut ch = Change::begin(pool, Actor::System).await.unwrap();
    let run = runs::rerun(&mut ch, org, source, def, &from).await.unwrap();
    ch.commit().await.unwrap();
    run
}

/// Approves the run's approval at `node` with `answer` (its fields), as a person does.
pub(crate) async fn approve(pool: &Db, org: OrgId, run: RunId, node: &str, answer: Value) {
    let answer: Map<String, Value> = serde_json::from_value(answer).expect("an answer is an object");
    let mut ch = Change::begin(pool, Actor::System).await.unwrap();
    approvals::approve(&mut ch, org, run, node, &answer).await.unwrap();
    ch.commit().await.unwrap();
}

/// Rejects the run's approval at `node`, giving `reason`.
pub(crate) async fn reject(pool: &Db, org: OrgId, run: RunId, node: &str, reason: &str) {
    let mut ch = Change::begin(pool, Actor::System).await.unwrap();
    approvals::reject(&mut ch, org, run, node, Some(reason)).await.unwrap();
    ch.commit().await.unwrap();
}

/// Polls `done` every 20 ms until it holds; panics with `what` after `limit`.
pub(crate) async fn until(what: &str, limit: Duration, done: impl AsyncFn() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (up to `limit`) until the run's status is not `running`; returns status and reason.
pub(crate) async fn until_done(pool: &Db, run: RunId, limit: Duration) -> (String, Option<String>) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let row: (String, Option<String>) = sqlx::query_as("SELECT status, reason FROM runs WHERE run_id = $1").bind(run).fetch_one(pool).await.unwrap();
        if row.0 != "running" || tokio::time::Instant::now() > deadline {
            return row;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The one value `sql` reads, with the run bound as $1.
pub(crate) async fn scalar<T>(pool: &Db, sql: &str, run: RunId) -> T
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    sqlx::query_scalar(sql).bind(run).fetch_one(pool).await.unwrap()
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
