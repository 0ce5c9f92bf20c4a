//! The engine pool in this process, with the test executor: runs walk to their end, waits
//! fire on time, approvals park and resume, cancel cascades, nothing is left behind.

use std::time::Duration;

use engine::db::Db;
use engine::ids::RunId;
use engine::store::{Actor, Change, approvals};
use serde_json::{Map, json};

use crate::fixtures::{approve, finish, reject, scalar, started, submit_new, until, until_done, with_input};

async fn nodes_in_order(pool: &Db, run: RunId) -> Vec<String> {
    sqlx::query_scalar("SELECT node || ':' || state FROM steps WHERE run_id = $1 ORDER BY started_seq").bind(run).fetch_all(pool).await.unwrap()
}

#[tokio::test]
async fn a_run_walks_a_join_and_a_gate_loop_to_completion() {
    let (db, s, eng) = started(&engine::testkit::join_and_loop("done")).await;
    let run = submit_new(&db.pool, with_input(&s, json!({ "test": { "gate_fail_visits": [1] } }))).await;
    let (status, reason) = until_done(&db.pool, run, Duration::from_secs(20)).await;
    assert_eq!((status.as_str(), reason), ("completed", None), "{:?}", nodes_in_order(&db.pool, run).await);
    let steps = nodes_in_order(&db.pool, run).await;
    assert_eq!(steps, ["plan:succeeded", "left:succeeded", "right:succeeded", "ci:failed", "left:succeeded", "ci:succeeded", "ship:succeeded"]);
    finish(eng, db).await;
}

const WAIT: &str = include_str!("../../../tests/workflows/wait.yaml");

#[tokio::test]
async fn a_wait_fires_at_its_due_time_not_before() {
    let (db, s, eng) = started(WAIT).await;
    let run = submit_new(&db.pool, with_input(&s, json!({}))).await;
    let (status, _) = until_done(&db.pool, run, Duration::from_secs(10)).await;
    assert_eq!(status, "completed");
    // Never early, by the database's own clock (how late is `make bench`'s to measure).
    let on_time: bool = scalar(&db.pool, "SELECT ended_at >= started_at + interval '2 seconds' FROM steps WHERE run_id = $1 AND node = 'nap'", run).await;
    assert!(on_time, "the wait ended before its two seconds");
    finish(eng, db).await;
}

#[tokio::test]
async fn an_approval_parks_the_run_until_answered_with_its_fields() {
    let (db, s, eng) = started(engine::testkit::APPROVAL).await;
    let run = submit_new(&db.pool, with_input(&s, json!({}))).await;
    until("never reached the approval", Duration::from_secs(10), async || nodes_in_order(&db.pool, run).await == ["ask:waiting"]).await;
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    let err = approvals::approve(&mut ch, s.org, run, "ask", &Map::new()).await.unwrap_err();
    assert!(err.to_string().contains("approval field \"ticket\" is required"), "{err}");
    drop(ch);
    approve(&db.pool, s.org, run, "ask", json!({ "ticket": "T-1" })).await;
    let (status, _) = until_done(&db.pool, run, Duration::from_secs(10)).await;
    assert_eq!(status, "completed");
    let output: serde_json::Value = scalar(&db.pool, "SELECT output FROM steps WHERE run_id = $1 AND node = 'ask'", run).await;
    assert_eq!(output, json!({ "ticket": "T-1" }));

    // A second run is rejected: cancelled with the reason, nothing after the approval runs.
    let run = submit_new(&db.pool, with_input(&s, json!({}))).await;
    until("never reached the approval", Duration::from_secs(10), async || nodes_in_order(&db.pool, run).await == ["ask:waiting"]).await;
    reject(&db.pool, s.org, run, "ask", "not now").await;
    let (status, reason) = until_done(&db.pool, run, Duration::from_secs(10)).await;
    assert_eq!((status.as_str(), reason.as_deref()), ("cancelled", Some("rejected at ask: not now")));
    assert_eq!(nodes_in_order(&db.pool, run).await, ["ask:failed"]);
    finish(eng, db).await;
}
