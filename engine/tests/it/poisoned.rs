//! One bad run stays one bad run: among 200 runs, one whose rows the database refuses (a
//! trigger stands in for whatever makes an SQL statement of its advance fail) is retried with
//! a backoff of its own and then failed `engine_error` with an audit entry, while the 199
//! others complete.

use std::time::Duration;

use engine::ids::RunId;
use engine::store::engine_errors::ENGINE_ERROR_LIMIT;
use engine::testkit::Engine;
use serde_json::Value;

use crate::fixtures::{TWO_STEPS, count, finish, poison, seeded, submit};

#[tokio::test]
async fn a_poisoned_run_fails_engine_error_and_the_others_complete() {
    let (db, s) = seeded(TWO_STEPS).await;
    let mut runs: Vec<RunId> = Vec::new();
    for _ in 0..200 {
        runs.push(submit(&db.pool, &s).await);
    }
    let poisoned = runs[117];
    // Its second step can never be written: the advance that starts it fails with an SQL error,
    // in whatever batch it falls.
    poison(&db.pool, "steps", &format!("NEW.run_id = '{}' AND NEW.node = 'b'", poisoned.0)).await;

    let eng = Engine::executing(&db, "e1", None);
    let all_ended = async {
        while count(&db.pool, "SELECT count(*) FROM runs WHERE status = 'running'").await > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(300), all_ended).await.expect("runs still running after five minutes");

    let completed = count(&db.pool, "SELECT count(*) FROM runs WHERE status = 'completed'").await;
    let ends: Vec<(String, Option<String>, i64)> =
        sqlx::query_as("SELECT status, reason, count(*) FROM runs GROUP BY 1, 2 ORDER BY 3 DESC").fetch_all(&db.pool).await.unwrap();
    assert_eq!(completed, 199, "every other run completes: {ends:?}");
    let (status, reason, errors): (String, Option<String>, i32) =
        sqlx::query_as("SELECT status, reason, engine_errors FROM runs WHERE run_id = $1").bind(poisoned).fetch_one(&db.pool).await.unwrap();
    assert_eq!((status.as_str(), reason.as_deref(), errors), ("failed", Some("engine_error"), ENGINE_ERROR_LIMIT));
    let audit: Vec<Value> = sqlx::query_scalar("SELECT detail FROM audit_log WHERE action = 'run.engine_error' AND target_id = $1")
        .bind(poisoned.to_string())
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert!(audit[0]["error"].as_str().unwrap_or_default().contains("poisoned row"), "{audit:?}");
    // Failed in words: its journal ends with run.failed, gapless.
    let kinds: Vec<(i64, String)> =
        sqlx::query_as("SELECT seq, kind FROM run_events WHERE run_id = $1 ORDER BY seq").bind(poisoned).fetch_all(&db.pool).await.unwrap();
    assert!(kinds.iter().enumerate().all(|(i, (seq, _))| *seq == i as i64 + 1), "{kinds:?}");
    assert_eq!(kinds.last().map(|k| k.1.as_str()), Some("run.failed"), "{kinds:?}");
    finish(eng, db).await;
}
