//! The host protocol's store functions: registration, claims routed by capabilities within a
//! host's slots, session reports under the per-run transcript cap, fenced completions.

use std::time::Duration;

use engine::catalog::Catalog;
use engine::db::Db;
use engine::hosts::Capability;
use engine::ids::{HostId, RunId, StepId};
use engine::store::hosts::{self, Completion, HostRow, LogLine, NewHost};
use engine::store::steps::{self, Initial, NewStep};
use engine::store::tenants::{self, TokenRecord};
use engine::store::{Actor, Change, StoreError, runs, signing_keys};
use engine::testkit::test_db;
use protocol::Usage;
use serde_json::json;

use crate::fixtures::{Seed, TWO_STEPS, count, locked, seeded, submit};

/// A registration token's row, as the API's `issue_registration_token` writes it.
async fn registration(pool: &Db, s: &Seed) -> uuid::Uuid {
    let mut ch = Change::begin(pool, Actor::System).await.unwrap();
    let kid = signing_keys::current(&mut ch, &engine::testkit::secret_key()).await.unwrap().kid;
    let jti = uuid::Uuid::now_v7();
    let record = TokenRecord {
        jti,
        org: s.org,
        kind: "registration",
        user: None,
        host: None,
        project: Some(s.project),
        role: "host",
        name: "reg".into(),
        kid,
        expires_at: chrono::Utc::now() + chrono::Duration::hours(1),
        issued_from: None,
    };
    tenants::insert_token(&mut ch, &record).await.unwrap();
    ch.commit().await.unwrap();
    jti
}

async fn register(pool: &Db, s: &Seed, name: &str, caps: &[&str], slots: u32) -> HostRow {
    let token = registration(pool, s).await;
    let caps: Vec<Capability> = caps.iter().map(|c| Capability::parse(c).unwrap()).collect();
    let mut ch = Change::begin(pool, Actor::Token(token)).await.unwrap();
    let host = hosts::register(&mut ch, &NewHost { org: s.org, project: s.project, name, capabilities: &caps, max_concurrent: slots, registration: token })
        .await
        .unwrap();
    ch.commit().await.unwrap();
    row(pool, s, host).await
}

async fn row(pool: &Db, s: &Seed, host: HostId) -> HostRow {
    sqlx::query_as("SELECT org_id, project_id, host_id, name, capabilities, max_concurrent FROM hosts WHERE host_id = $1 AND org_id = $2")
        .bind(host)
        .bind(s.org)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A pending crew step of node `a` needing `requires`, in a run of its own.
async fn ready_step(pool: &Db, s: &Seed, requires: &[&str]) -> (RunId, StepId) {
    let run = submit(pool, s).await;
    let mut ch = locked(pool, Actor::System, s.org, run).await;
    let new = NewStep {
        node: "a",
        kind: "crew",
        visit: 1,
        attempt: 1,
        requires: requires.iter().map(|r| (*r).to_owned()).collect(),
        initial: Initial::Pending,
        delay: Duration::ZERO,
    };
    let step = steps::create(&mut ch, run, new).await.unwrap();
    ch.commit().await.unwrap();
    (run, step)
}

/// A step of its own, claimed by `host` and started with Claude Code.
async fn started_on(pool: &Db, s: &Seed, host: &HostRow) -> (RunId, StepId) {
    let (run, step) = ready_step(pool, s, &[]).await;
    hosts::claim(pool, &Catalog::default(), host, 1).await.unwrap();
    hosts::start(pool, host, step, "claude-code", false).await.unwrap();
    (run, step)
}

fn line(seq: i64, text: &str) -> LogLine {
    LogLine { seq, stream: "assistant".into(), line: text.into() }
}

#[tokio::test]
async fn a_registration_token_registers_one_host() {
    let (db, s) = seeded(TWO_STEPS).await;
    let token = registration(&db.pool, &s).await;
    let caps = [Capability::parse("linux").unwrap()];
    let new = NewHost { org: s.org, project: s.project, name: "box", capabilities: &caps, max_concurrent: 2, registration: token };
    let mut ch = Change::begin(&db.pool, Actor::Token(token)).await.unwrap();
    hosts::register(&mut ch, &new).await.unwrap();
    ch.commit().await.unwrap();
    let mut ch = Change::begin(&db.pool, Actor::Token(token)).await.unwrap();
    assert!(matches!(hosts::register(&mut ch, &new).await, Err(StoreError::Conflict(_))));
    drop(ch);
    assert_eq!(count(&db.pool, "SELECT count(*) FROM hosts").await, 1);
    assert_eq!(count(&db.pool, "SELECT count(*) FROM audit_log WHERE action = 'host.register'").await, 1);
    db.discard().await;
}

#[tokio::test]
async fn a_claim_takes_what_the_hosts_capabilities_and_free_slots_allow() {
    let (db, s) = seeded(TWO_STEPS).await;
    let catalog = Catalog::default();
    let host = register(&db.pool, &s, "box", &["linux", "harness:claude-code"], 2).await;
    let (_, gpu) = ready_step(&db.pool, &s, &["gpu"]).await;
    let (_, first) = ready_step(&db.pool, &s, &["linux"]).await;
    let (_, second) = ready_step(&db.pool, &s, &["linux", "harness:claude-code"]).await;
    let (_, third) = ready_step(&db.pool, &s, &[]).await;

    let claimed = hosts::claim(&db.pool, &catalog, &host, 5).await.unwrap();
    let steps: Vec<StepId> = claimed.assignments.iter().map(|a| a.step).collect();
    assert_eq!(steps, [first, second], "oldest first, within two slots, never the gpu step");
    let a = &claimed.assignments[0];
    assert_eq!((a.prompt.as_str(), a.harness.as_str(), a.repository.is_none(), a.lease_secs), ("do a", "claude-code", true, 30));
    assert_eq!(a.caps.timeout_secs, 3600, "crew steps time out after an hour by default");
    let held: Vec<(String, String)> = sqlx::query_as("SELECT state, holder FROM steps WHERE step_id = ANY($1)")
        .bind(steps.iter().map(|s| s.0).collect::<Vec<_>>())
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert!(held.iter().all(|(state, holder)| state == "leased" && *holder == hosts::holder(host.host_id)), "{held:?}");
    // A lease lapses by itself: each leased step is watched by a wake.
    assert_eq!(count(&db.pool, "SELECT count(*) FROM wakes WHERE reason = 'lease_expiry'").await, 2);

    // Slots full: nothing more, until one is free.
    assert!(hosts::claim(&db.pool, &catalog, &host, 5).await.unwrap().assignments.is_empty());
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    let run: RunId = sqlx::query_scalar("SELECT run_id FROM steps WHERE step_id = $1").bind(first).fetch_one(ch.conn()).await.unwrap();
    ch.lock_run(s.org, run).await.unwrap().unwrap();
    runs::cancel(&mut ch, s.org, run, "cancelled").await.unwrap();
    ch.commit().await.unwrap();
    // The host is told to stop the cancelled one...
    let stop = hosts::to_stop(&db.pool, &host, &[first, second]).await.unwrap();
    assert_eq!(stop, [(first, "cancelled".to_owned())]);
    // ...and its slot takes the next ready step.
    let next = hosts::claim(&db.pool, &catalog, &host, 5).await.unwrap();
    assert_eq!(next.assignments.iter().map(|a| a.step).collect::<Vec<_>>(), [third]);
    let _ = gpu;
    db.discard().await;
}

#[tokio::test]
async fn reports_renew_the_lease_and_stop_at_the_runs_transcript_cap_with_a_note() {
    let (db, s) = seeded(TWO_STEPS).await;
    let host = register(&db.pool, &s, "box", &["linux"], 1).await;
    let (run, step) = started_on(&db.pool, &s, &host).await;
    sqlx::query("UPDATE steps SET lease_expires_at = now() + interval '1 second' WHERE step_id = $1").bind(step).execute(&db.pool).await.unwrap();
    let events = |run: RunId| format!("SELECT count(*) FROM run_events WHERE run_id = '{}'", run.0);
    let events_before = count(&db.pool, &events(run)).await;

    // Ten lines of 30 bytes against a cap of 100: three are stored, then one note.
    let lines: Vec<LogLine> = (1..=10).map(|i| line(i, &format!("{i:>30}"))).collect();
    let usage = Usage { input_tokens: 100, output_tokens: 20, cost_usd: None, turns: 1, tool_calls: 0, model: Some("m".into()), ..Usage::default() };
    let r = hosts::report(&db.pool, &host, step, hosts::Report { harness: Some("claude-code"), lines: &lines, usage: &usage, egress_refused: &[] }, 100)
        .await
        .unwrap();
    assert_eq!((r.state, r.stored, r.dropped), (engine::state::StepState::Running, 3, 7));
    let logged: Vec<(i64, String)> =
        sqlx::query_as("SELECT seq, stream FROM step_logs WHERE step_id = $1 ORDER BY seq").bind(step).fetch_all(&db.pool).await.unwrap();
    assert_eq!(logged, [(1, "assistant".to_owned()), (2, "assistant".into()), (3, "assistant".into()), (4, "note".into())]);
    let renewed: bool = sqlx::query_scalar("SELECT lease_expires_at > now() + interval '20 seconds' FROM steps WHERE step_id = $1")
        .bind(step)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(renewed, "a report renews the lease");

    // The same lines again (the answer was lost): nothing stored twice; totals never go back.
    let lower = Usage { input_tokens: 50, cost_usd: Some(0.123_456_789), ..usage.clone() };
    let r = hosts::report(&db.pool, &host, step, hosts::Report { harness: None, lines: &lines[..2], usage: &lower, egress_refused: &[] }, 100).await.unwrap();
    assert_eq!(r.stored, 0);
    let (tokens, cost, harness): (i64, Option<f64>, String) =
        sqlx::query_as("SELECT input_tokens, cost_usd::float8, harness FROM step_sessions WHERE step_id = $1").bind(step).fetch_one(&db.pool).await.unwrap();
    assert_eq!((tokens, cost, harness.as_str()), (100, Some(0.123_457), "claude-code"));
    let (bytes, dropped, capped): (i64, i64, bool) =
        sqlx::query_as("SELECT bytes, dropped, capped_at IS NOT NULL FROM run_log_sizes WHERE run_id = $1").bind(run).fetch_one(&db.pool).await.unwrap();
    assert_eq!((bytes, dropped, capped), (90, 7, true));
    // Reports are not moves: no event.
    assert_eq!(count(&db.pool, &events(run)).await, events_before);
    db.discard().await;
}

#[tokio::test]
async fn a_completion_is_fenced_on_the_holder_and_wakes_the_run() {
    let (db, s) = seeded(TWO_STEPS).await;
    let host = register(&db.pool, &s, "box", &["linux"], 2).await;
    let other = register(&db.pool, &s, "other", &["linux"], 2).await;
    let (run, step) = started_on(&db.pool, &s, &host).await;
    let done = Completion {
        output: json!({ "text": "ok" }),
        failure: None,
        usage: Usage { input_tokens: 1, output_tokens: 2, cost_usd: Some(0.5), turns: 1, tool_calls: 0, model: None, ..Usage::default() },
        harness: Some("claude-code".into()),
    };
    // Another host cannot complete a step it does not hold.
    assert!(matches!(hosts::complete(&db.pool, &other, step, &done).await, Err(StoreError::Stale(_))));
    sqlx::query("DELETE FROM wakes").execute(&db.pool).await.unwrap();
    hosts::complete(&db.pool, &host, step, &done).await.unwrap();
    let (state, text): (String, String) =
        sqlx::query_as("SELECT state, output->>'text' FROM steps WHERE step_id = $1").bind(step).fetch_one(&db.pool).await.unwrap();
    assert_eq!((state.as_str(), text.as_str()), ("succeeded", "ok"));
    assert_eq!(
        count(&db.pool, &format!("SELECT count(*) FROM wakes WHERE run_id = '{}' AND reason = 'advance'", run.0)).await,
        1,
        "an engine is woken to go on"
    );
    let session: serde_json::Value =
        sqlx::query_scalar("SELECT attrs FROM run_events WHERE run_id = $1 AND kind = 'step.session'").bind(run).fetch_one(&db.pool).await.unwrap();
    assert_eq!((session["cost_usd"].as_f64(), session["output_tokens"].as_i64()), (Some(0.5), Some(2)));
    // Twice is refused: the step is no longer running.
    assert!(matches!(hosts::complete(&db.pool, &host, step, &done).await, Err(StoreError::Stale(_))));
    db.discard().await;
}

#[tokio::test]
async fn the_claims_lookups_use_their_indexes() {
    let db = test_db().await;
    let mut conn = db.pool.pool().acquire().await.unwrap();
    // The tables are empty: forbid scans, and check that an index serves each lookup.
    sqlx::query("SET enable_seqscan = off").execute(&mut *conn).await.unwrap();
    let explain = |sql: &str| format!("EXPLAIN {sql}");
    let candidates = hosts::CANDIDATES_SQL
        .replace("$1", "gen_random_uuid()")
        .replace("$2", "gen_random_uuid()")
        .replace("$3::text[]", "'{linux}'::text[]")
        .replace("$4", "8");
    for (index, sql) in [("steps_claimable", candidates), ("steps_by_holder", hosts::HELD_SQL.replace("$1", "'host:x'"))] {
        let plan: Vec<String> = sqlx::query_scalar(&explain(&sql)).fetch_all(&mut *conn).await.unwrap();
        let plan = plan.join("\n");
        assert!(plan.contains(index), "{sql}\nshould use {index}:\n{plan}");
    }
    drop(conn);
    db.discard().await;
}

/// Many sessions of one project report at once (each in a run of its own, as a busy org's
/// agents do): while a dozen reports stand mid-transaction, holding what a report holds (their
/// run, the spend they recorded), two dozen more of the same project record spend and lines
/// and commit. Before spend was kept in slots, each of them waited for the project's one row of
/// the day. Checked by state: every report completes while the others are held, and none is
/// ever seen waiting on a held one's lock (`pg_blocking_pids`).
#[tokio::test]
async fn the_reports_of_a_projects_sessions_never_wait_on_each_other() {
    const HELD: usize = 12;
    const REPORTING: usize = 24;
    let (db, s) = seeded(TWO_STEPS).await;
    let host = register(&db.pool, &s, "busy", &["linux"], 64).await;
    let mut sessions = Vec::new();
    for _ in 0..HELD + REPORTING {
        sessions.push(started_on(&db.pool, &s, &host).await);
    }
    let usage = Usage { input_tokens: 1_000, output_tokens: 200, turns: 1, model: Some("m".into()), estimated_cost_usd: Some(0.05), ..Usage::default() };
    // Every session has reported once, so each has spend recorded and a session row.
    for (_, step) in &sessions {
        let r = hosts::report(
            &db.pool,
            &host,
            *step,
            hosts::Report { harness: Some("claude-code"), lines: &[line(1, "start")], usage: &usage, egress_refused: &[] },
            1 << 20,
        )
        .await
        .unwrap();
        assert_eq!(r.stored, 1);
    }

    // A dozen reports mid-transaction: each holds its run and the spend it added.
    // (On connections of their own, with one to watch from: the reports below have the test
    // pool's.)
    let holders = engine::db::connect(&db.url, HELD as u32 + 1).await.unwrap();
    let mut held = Vec::new();
    let mut held_pids: Vec<i32> = Vec::new();
    for (run, _) in &sessions[..HELD] {
        let mut ch = Change::begin(&holders, Actor::Host(host.host_id)).await.unwrap();
        ch.lock_run(s.org, *run).await.unwrap().expect("the run");
        // A hung test, not a timing: a spend that waits on a held one's lock never returns.
        tokio::time::timeout(Duration::from_secs(120), engine::store::budgets::record_run_spend(&mut ch, *run, 0.01, 10))
            .await
            .expect("a report's spend waits on the spend another report holds")
            .unwrap();
        held_pids.push(sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(ch.conn()).await.unwrap());
        held.push(ch);
    }

    // Two dozen more, at once: more lines, more tokens and dollars.
    let more = Usage { input_tokens: 2_000, estimated_cost_usd: Some(0.10), ..usage.clone() };
    let mut reports = tokio::task::JoinSet::new();
    for (_, step) in sessions[HELD..].iter().copied() {
        let (pool, host, more) = (db.pool.clone(), host.clone(), more.clone());
        reports.spawn(async move {
            let lines: Vec<LogLine> = (2..=6).map(|i| line(i, "reading the module")).collect();
            hosts::report(&pool, &host, step, hosts::Report { harness: Some("claude-code"), lines: &lines, usage: &more, egress_refused: &[] }, 1 << 20).await
        });
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut done = 0;
    while done < REPORTING {
        let blocked: Vec<(i32, String)> =
            sqlx::query_as("SELECT pid, coalesce(query, '') FROM pg_stat_activity WHERE datname = current_database() AND pg_blocking_pids(pid) && $1::int4[]")
                .bind(&held_pids)
                .fetch_all(&holders)
                .await
                .unwrap();
        assert!(blocked.is_empty(), "a report waits on a lock another session's report holds: {blocked:?}");
        assert!(tokio::time::Instant::now() < deadline, "{done} of {REPORTING} reports completed while the others were held");
        match tokio::time::timeout(Duration::from_millis(100), reports.join_next()).await {
            Ok(Some(r)) => {
                assert_eq!(r.unwrap().unwrap().stored, 5);
                done += 1;
            }
            Ok(None) => break,
            Err(_) => {}
        }
    }
    for ch in held {
        ch.commit().await.unwrap();
    }
    holders.close().await;
    // Every dollar is counted once: 36 first reports at $0.05, 24 more at +$0.05, 12 held at $0.01.
    let (spent, slots): (f64, i64) =
        sqlx::query_as("SELECT sum(usd)::float8, count(*) FROM spend WHERE project_id = $1").bind(s.project).fetch_one(&db.pool).await.unwrap();
    assert!((spent - (36.0 * 0.05 + 24.0 * 0.05 + 12.0 * 0.01)).abs() < 1e-6, "spent {spent}");
    assert!(slots > 1, "the day's spend is in slots, not one row");
    db.discard().await;
}
