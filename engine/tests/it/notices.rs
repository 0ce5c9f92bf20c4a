//! NOTIFY discipline: at most one notification per transaction; a wake for another process
//! is said at once, and events alone ride on a per-process notice that follows their commits.

use std::time::Duration;

use engine::store::{Actor, Change, NOTIFY_CHANNEL, Notice, operator, runs};
use engine::testkit::Engine;
use sqlx::postgres::PgListener;

use crate::fixtures::{new_run, seeded, until_done};

const FAILS: &str = include_str!("../../../tests/workflows/fails_at_once.yaml");

/// The next notification on the channel, with a hang guard.
async fn next(l: &mut PgListener) -> String {
    tokio::time::timeout(Duration::from_secs(60), l.recv()).await.expect("a notification").expect("the listener reads").payload().to_owned()
}

#[test]
fn payloads_are_words_and_engines_act_on_wakes_only() {
    assert_eq!(Notice::parse("w0"), Notice::Wake(Duration::ZERO));
    assert_eq!(Notice::parse("w250 w40"), Notice::Wake(Duration::from_millis(40)));
    assert_eq!(Notice::parse("e"), Notice::Events);
    let run = engine::ids::RunId::mint();
    assert_eq!(Notice::parse(&format!("l{run}")), Notice::Events);
    assert_eq!(Notice::parse(&format!("w5 l{run}")), Notice::Wake(Duration::from_millis(5)));
    assert_eq!(Notice::transcripts(&format!("w5 l{run}")).collect::<Vec<_>>(), [run]);
    assert_eq!(Notice::parse("something new"), Notice::Wake(Duration::ZERO), "an unknown word makes engines look");
}

#[tokio::test]
async fn one_notification_per_change_and_events_alone_are_told_after_their_commits() {
    let (db, s) = seeded(FAILS).await;
    // Runs that fail at once, so that resolving them writes an event and nothing else.
    let eng = Engine::executing(&db, "e1", None);
    let mut failed = Vec::new();
    for _ in 0..5 {
        let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
        failed.push(runs::submit(&mut ch, new_run(&s)).await.unwrap());
        ch.commit().await.unwrap();
    }
    for run in &failed {
        assert_eq!(until_done(&db.pool, *run, Duration::from_secs(60)).await.0, "failed");
    }
    // The engine's own commits, and the notice that follows its events, are over before
    // listening starts.
    eng.stop();
    eng.task.await.unwrap().unwrap();
    engine::testkit::events_told().await;

    let mut l = PgListener::connect(&db.url).await.unwrap();
    l.listen(NOTIFY_CHANNEL).await.unwrap();
    // A submit writes events and a wake an engine must learn of: one notification, the wake.
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    runs::submit(&mut ch, new_run(&s)).await.unwrap();
    ch.commit().await.unwrap();
    assert_eq!(next(&mut l).await, "w0");

    // Events alone: some changes carry the `e` themselves, the others are covered by a notice
    // sent after them (the event-stream tests show that none goes untold). Every notice says
    // `e` alone, and there are no more of them than changes.
    for run in &failed {
        let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
        assert!(operator::resolve(&mut ch, s.org, *run, None).await.unwrap());
        ch.commit().await.unwrap();
    }
    let mut told = vec![next(&mut l).await];
    // A probe marks where to stop reading.
    sqlx::query("SELECT pg_notify($1, 'probe')").bind(NOTIFY_CHANNEL).execute(&db.pool).await.unwrap();
    loop {
        let payload = next(&mut l).await;
        if payload == "probe" {
            break;
        }
        told.push(payload);
    }
    assert!(told.iter().all(|p| p == "e"), "{told:?}");
    assert!(told.len() <= failed.len(), "{told:?}");
    db.finish().await;
}
