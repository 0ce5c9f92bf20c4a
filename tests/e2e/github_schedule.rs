//! Schedules: a workflow with `on.schedule` every two seconds, on a real engine. Ticks fire on
//! time (each is a wake of the schedule's row, not a poll), one run per tick and connected
//! repository under the dedup key `[workflow, repository, scheduled_at]`; after the engine was
//! down for several ticks, only the latest missed one fires, once, and then the ticks go on.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::github_env::GhEnv;

const TICK: &str = include_str!("../workflows/tick.yaml");

/// (scheduled_at, fired at, dedup key) of every tick so far, in order.
async fn ticks(env: &GhEnv) -> Vec<(DateTime<Utc>, DateTime<Utc>, String)> {
    let rows: Vec<(Value, DateTime<Utc>, String)> =
        sqlx::query_as("SELECT payload, created_at, dedup_key FROM trigger_events WHERE source = 'schedule' ORDER BY created_at")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    rows.into_iter()
        .map(|(p, at, key)| {
            let scheduled = p.pointer("/trigger/scheduled_at").and_then(Value::as_str).and_then(|t| t.parse().ok()).expect("scheduled_at");
            (scheduled, at, key)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn ticks_fire_on_time_and_one_catch_up_tick_fires_after_downtime() {
    let env = GhEnv::start(&[TICK]).await;
    assert_eq!(env.scalar("SELECT count(*) FROM schedules").await, 1);
    let mut engine = env.engine("sched-a", None);
    tokio::time::sleep(Duration::from_millis(7_500)).await;
    let before = ticks(&env).await;
    assert!(before.len() >= 3, "{before:?}");
    for pair in before.windows(2) {
        assert_eq!((pair[1].0 - pair[0].0).num_milliseconds(), 2_000, "consecutive ticks: {before:?}");
    }
    // Every tick fires at or after its time (how late is `make bench`'s to measure).
    let mut worst = 0;
    for (scheduled, _, key) in &before {
        assert_eq!(*key, format!("[\"tick\",\"acme/widgets\",\"{}\"]", scheduled.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)));
    }
    for (scheduled, fired, _) in before.iter().skip(1) {
        let late = (*fired - *scheduled).num_milliseconds();
        assert!(late >= 0, "a tick fired {late} ms before its time");
        worst = worst.max(late);
    }
    println!("schedules: {} ticks, at most {worst} ms late", before.len());
    env.until("SELECT count(*) FROM runs WHERE status <> 'completed'", 0, Duration::from_secs(120)).await;

    // Down for seven seconds: three or four ticks are missed.
    engine.sigkill();
    tokio::time::sleep(Duration::from_millis(7_000)).await;
    let _engine = env.engine("sched-b", None);
    tokio::time::sleep(Duration::from_millis(6_000)).await;
    let after = ticks(&env).await;
    let last_before = before.last().map(|t| t.0).unwrap_or_default();
    let new: Vec<_> = after.iter().filter(|t| t.0 > last_before).collect();
    assert!(new.len() >= 3, "{new:?}");
    // The first tick after the restart is the catch-up: the latest tick at or before the
    // moment it fired, and none of the ones missed before it.
    let catch_up = new[0];
    let behind = (catch_up.1 - catch_up.0).num_milliseconds();
    assert!((0..2_000).contains(&behind), "the catch-up is the latest missed tick: {catch_up:?}");
    assert!((catch_up.0 - last_before).num_milliseconds() >= 6_000, "missed ticks were skipped, not replayed: {new:?}");
    // Then the schedule goes on, tick after tick, on time.
    for pair in new.windows(2) {
        assert_eq!((pair[1].0 - pair[0].0).num_milliseconds(), 2_000, "{new:?}");
    }
    for (scheduled, fired, _) in new.iter().skip(1) {
        assert!((0..1_000).contains(&(*fired - *scheduled).num_milliseconds()), "{new:?}");
    }
    assert_eq!(env.scalar("SELECT count(*) FROM trigger_events WHERE source = 'schedule'").await, env.scalar("SELECT count(*) FROM runs").await);
    env.until("SELECT count(*) FROM runs WHERE status <> 'completed'", 0, Duration::from_secs(120)).await;
    drop(_engine);
    env.finish().await;
}
