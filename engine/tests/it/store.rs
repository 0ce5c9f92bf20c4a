//! The one write path: all or nothing, gapless sequences, fencing, tenancy, schema checks.

use std::time::Duration;

use engine::ids::OrgId;
use engine::state::step;
use engine::store::steps::{self, Initial, NewStep};
use engine::store::{Actor, Change, StoreError, runs};
use engine::testkit::test_db;
use serde_json::json;

use crate::fixtures::{TWO_STEPS, cancel, count, locked, new_run, seeded, submit, submitted};

#[tokio::test]
async fn a_failure_mid_change_leaves_nothing_written() {
    let (db, s) = seeded(TWO_STEPS).await;
    let before_audit = count(&db.pool, "SELECT count(*) FROM audit_log").await;
    sqlx::raw_sql(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'injected'; END $$;
         CREATE TRIGGER refuse BEFORE INSERT ON audit_log FOR EACH ROW EXECUTE FUNCTION refuse();",
    )
    .execute(&db.pool)
    .await
    .unwrap();

    // Events and audit entries are written at commit, so that is where the fault strikes.
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    runs::submit(&mut ch, new_run(&s)).await.unwrap();
    let err = ch.commit().await.unwrap_err();
    assert!(err.to_string().contains("injected"), "{err}");

    for table in ["runs", "run_events", "wakes", "steps"] {
        assert_eq!(count(&db.pool, &format!("SELECT count(*) FROM {table}")).await, 0, "{table} kept a row");
    }
    sqlx::query("DROP TRIGGER refuse ON audit_log").execute(&db.pool).await.unwrap();
    assert_eq!(count(&db.pool, "SELECT count(*) FROM audit_log").await, before_audit);

    // Without the fault the same change writes all four together.
    let run = submit(&db.pool, &s).await;
    let q = |t: &str| format!("SELECT count(*) FROM {t} WHERE run_id = '{}'", run.0);
    assert_eq!(count(&db.pool, &q("runs")).await, 1);
    assert_eq!(count(&db.pool, &q("run_events")).await, 1);
    assert_eq!(count(&db.pool, &q("wakes")).await, 1);
    assert_eq!(count(&db.pool, &format!("SELECT count(*) FROM audit_log WHERE target_id = '{run}'")).await, 1);
    db.discard().await;
}

#[tokio::test]
async fn event_sequences_have_no_gaps_under_eight_concurrent_writers() {
    let (db, s, run) = submitted(TWO_STEPS).await;
    let mut writers = Vec::new();
    for w in 0..8u32 {
        let (pool, org) = (db.pool.clone(), s.org);
        writers.push(tokio::spawn(async move {
            for i in 0..25u32 {
                let mut ch = Change::begin(&pool, Actor::System).await.unwrap();
                ch.lock_run(org, run).await.unwrap().unwrap();
                let node = format!("w{w}");
                let new = NewStep { node: &node, kind: "crew", visit: 1, attempt: i + 1, requires: vec![], initial: Initial::Pending, delay: Duration::ZERO };
                steps::create(&mut ch, run, new).await.unwrap();
                // Every third change rolls back: its sequence numbers must not leave a hole.
                if i % 3 == 2 {
                    drop(ch);
                } else {
                    ch.commit().await.unwrap();
                }
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let seqs: Vec<i64> = sqlx::query_scalar("SELECT seq FROM run_events WHERE run_id = $1 ORDER BY seq").bind(run).fetch_all(&db.pool).await.unwrap();
    let expected: Vec<i64> = (1..=seqs.len() as i64).collect();
    assert_eq!(seqs, expected);
    // 1 run.started + 8 writers × 17 committed changes.
    assert_eq!(seqs.len(), 1 + 8 * 17);
    db.discard().await;
}

#[tokio::test]
async fn a_stale_holder_cannot_complete_a_step_it_lost() {
    let (db, s, run) = submitted(TWO_STEPS).await;
    let mut ch = locked(&db.pool, Actor::System, s.org, run).await;
    let new = NewStep { node: "a", kind: "crew", visit: 1, attempt: 1, requires: vec![], initial: Initial::Pending, delay: Duration::ZERO };
    let step = steps::create(&mut ch, run, new).await.unwrap();
    steps::lease(&mut ch, run, step, "engine:old").await.unwrap();
    steps::start(&mut ch, run, step, "engine:old").await.unwrap();
    ch.commit().await.unwrap();

    // Recovery takes the step back.
    let mut ch = locked(&db.pool, Actor::Engine("other".into()), s.org, run).await;
    let failure = steps::Failure::new("lease_expired", steps::FailureClass::Infrastructure);
    steps::fail_leased(&mut ch, run, step, &failure).await.unwrap();
    ch.commit().await.unwrap();

    // The old holder's late success is refused and changes nothing.
    let mut ch = locked(&db.pool, Actor::Engine("old".into()), s.org, run).await;
    let err = steps::succeed_held(&mut ch, run, step, "engine:old", &json!({})).await.unwrap_err();
    assert!(matches!(err, StoreError::Stale(_)), "{err}");
    drop(ch);
    let state: String = sqlx::query_scalar("SELECT state FROM steps WHERE step_id = $1").bind(step).fetch_one(&db.pool).await.unwrap();
    assert_eq!(state, "failed");

    // And a finished step cannot be moved by the engine's own typed moves either.
    let mut ch = locked(&db.pool, Actor::System, s.org, run).await;
    let err = steps::succeed::<(step::Pending, step::Waiting)>(&mut ch, run, step, &json!({}), false).await.unwrap_err();
    assert!(matches!(err, StoreError::Stale(_)), "{err}");
    // A connection still checked out would keep the pool's close waiting.
    drop(ch);
    db.discard().await;
}

#[tokio::test]
async fn a_terminal_run_never_moves_again() {
    let (db, s, run) = submitted(TWO_STEPS).await;
    cancel(&db.pool, s.org, run, "cancelled by test").await;
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    let err = runs::cancel(&mut ch, s.org, run, "again").await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    drop(ch);
    let (status, reason): (String, String) = sqlx::query_as("SELECT status, reason FROM runs WHERE run_id = $1").bind(run).fetch_one(&db.pool).await.unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("cancelled", "cancelled by test"));
    assert_eq!(count(&db.pool, &format!("SELECT count(*) FROM wakes WHERE run_id = '{}'", run.0)).await, 0);
    db.finish().await;
}

#[tokio::test]
async fn another_orgs_run_is_not_found() {
    let (db, _, run) = submitted(TWO_STEPS).await;
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    assert!(ch.lock_run(OrgId::mint(), run).await.unwrap().is_none());
    let err = runs::cancel(&mut ch, OrgId::mint(), run, "x").await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound("run")), "{err}");
    drop(ch);
    db.discard().await;
}

#[tokio::test]
async fn a_schema_newer_than_the_code_is_refused() {
    let db = test_db().await;
    engine::db::check_schema(&db.pool).await.unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99990101000000, 'from the future', true, '\\x00', 0)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let err = engine::db::migrate(&db.pool).await.unwrap_err();
    assert!(err.to_string().contains("newer than this binary"), "{err}");
    let err = engine::db::check_schema(&db.pool).await.unwrap_err();
    assert!(err.to_string().contains("run a newer shopfloor release"), "{err}");
    db.discard().await;
}

/// Polls `fut` up to `polls` times, letting the runtime run (and read sockets) between polls,
/// then drops it: whether it finished.
async fn cut_after(fut: impl Future, polls: i32) -> bool {
    let mut fut = std::pin::pin!(fut);
    for _ in 0..polls {
        if futures::poll!(fut.as_mut()).is_ready() {
            return true;
        }
        tokio::task::yield_now().await;
    }
    false
}

/// A caller dropped while its `BEGIN` is in flight (a request's timeout, a client gone) must
/// not hand the pool a connection left inside a transaction: sqlx 0.8.6's own `begin` does
/// (transact-rs/sqlx#4393), and the next borrower's statements then run inside it, so a write
/// said to be done is not committed. The begin is polled `k` times, letting the runtime read
/// the socket between polls, then dropped, for every `k` until it finishes: so it is cut at
/// each point of its round trips (the `BEGIN`, after the pool's ping when it has one). With
/// one connection in the pool, each cut is followed by a single-statement write, which another
/// connection must see.
#[tokio::test]
async fn a_begin_cancelled_midway_leaves_no_transaction_open_on_the_connection() {
    let db = test_db().await;
    sqlx::query("CREATE TABLE cut_begins (k integer)").execute(&db.pool).await.unwrap();
    let pool = engine::db::connect(&db.url, 1).await.unwrap();
    let mut unseen = Vec::new();
    for cuts in 0..300 {
        cut_after(pool.begin(), cuts).await;
        sqlx::query("INSERT INTO cut_begins VALUES ($1)").bind(cuts).execute(&pool).await.unwrap();
        let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM cut_begins WHERE k = $1").bind(cuts).fetch_one(&db.pool).await.unwrap();
        if seen == 0 {
            unseen.push(cuts);
        }
    }
    assert!(unseen.is_empty(), "writes after a begin cut after these many polls were not committed: {unseen:?}");
}

/// A change dropped without committing (an error's `?`, a request's client gone) gives its
/// locks up at once, not when its connection is next used: the pool sends its `ROLLBACK` as it
/// takes the connection back. Each round locks a run in a change, begins a second change on
/// the pool's other connection, drops the first, and locks the same run in the second (the
/// pool's connections run without a lock timeout here: a lock left held would hang).
#[tokio::test]
async fn a_dropped_change_releases_its_locks_at_once() {
    let (db, s, run) = submitted(TWO_STEPS).await;
    let pool = engine::db::connect(&db.url, 2).await.unwrap();
    for round in 0..20 {
        let mut ch = Change::begin(&pool, Actor::System).await.unwrap();
        assert!(ch.lock_run(s.org, run).await.unwrap().is_some(), "round {round}: the run is not found");
        let mut next = Change::begin(&pool, Actor::System).await.unwrap();
        drop(ch);
        let locked = tokio::time::timeout(Duration::from_secs(60), next.lock_run(s.org, run)).await;
        assert!(matches!(locked, Ok(Ok(Some(_)))), "round {round}: the dropped change still holds the run's lock");
        drop(next);
    }
    db.discard().await;
}

/// A caller dropped while its `COMMIT` is in flight (a host dropping its watching claim, a
/// request's client gone) must leave the change committed and the connection clean: with
/// sqlx's own commit, the dropped transaction sends a `ROLLBACK` on the connection's next use,
/// which either finds the server committed already (PostgreSQL's notice "there is no
/// transaction in progress", which sqlx logs) or undoes the write. The commit is polled `k`
/// times, then dropped, for every `k` until it finishes, with PostgreSQL's notices counted.
#[tokio::test]
async fn a_commit_cancelled_midway_still_commits() {
    use tracing_subscriber::layer::SubscriberExt;
    let db = test_db().await;
    sqlx::query("CREATE TABLE cut_commits (k integer)").execute(&db.pool).await.unwrap();
    let pool = engine::db::connect(&db.url, 1).await.unwrap();
    let notices = Notices::default();
    // The test's runtime has one thread, which polls every connection: its subscriber hears all.
    let _heard = tracing::subscriber::set_default(tracing_subscriber::registry().with(notices.clone()));
    let mut lost = Vec::new();
    for cuts in 1..300 {
        let mut ch = Change::begin(&pool, Actor::Github).await.unwrap();
        sqlx::query("INSERT INTO cut_commits VALUES ($1)").bind(cuts).execute(ch.conn()).await.unwrap();
        let finished = cut_after(ch.commit(), cuts).await;
        let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM cut_commits WHERE k = $1").bind(cuts).fetch_one(&pool).await.unwrap();
        if seen == 0 {
            lost.push(cuts);
        }
        if finished {
            break;
        }
    }
    assert!(lost.is_empty(), "a commit cut after these many polls was not committed: {lost:?}");
    let heard = notices.0.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(heard, 0, "PostgreSQL sent {heard} notices (a ROLLBACK after a COMMIT)");
    db.discard().await;
}

/// Counts what sqlx logs of PostgreSQL's notices.
#[derive(Clone, Default)]
struct Notices(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Notices {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == "sqlx::postgres::notice" {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// A pooled connection the server closed while it waited in the pool (a restart, an
/// administrator's `pg_terminate_backend`, a pooler's timeout) costs the next change nothing:
/// its `BEGIN` finds the connection closed and takes another. A connection that came back to
/// the pool moments ago is not pinged first (`db::PING_AFTER_IDLE`), so each round ends the one
/// connection of a pool right after a change gave it back, then begins the next change at once.
#[tokio::test]
async fn a_connection_the_server_closed_in_the_pool_is_replaced_by_the_next_begin() {
    let db = test_db().await;
    let pool = engine::db::connect(&db.url, 1).await.unwrap();
    let backend = "SELECT pg_backend_pid()";
    for round in 0..5 {
        let mut ch = Change::begin(&pool, Actor::System).await.unwrap();
        let pid: i32 = sqlx::query_scalar(backend).fetch_one(ch.conn()).await.unwrap();
        ch.commit().await.unwrap();
        let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 60000)").bind(pid).fetch_one(&db.pool).await.unwrap();
        assert!(ended, "round {round}: backend {pid} was not ended");
        let mut ch = Change::begin(&pool, Actor::System).await.unwrap_or_else(|e| panic!("round {round}: the change after the close failed: {e}"));
        let next: i32 = sqlx::query_scalar(backend).fetch_one(ch.conn()).await.unwrap();
        assert_ne!(next, pid, "round {round}: the closed connection was used again");
        ch.commit().await.unwrap();
    }
}
