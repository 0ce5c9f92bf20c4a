//! Admission, budgets and retention against a real engine in this process: each concurrency
//! policy, the throttle and the org's cap under 50 concurrent submits (never more running
//! than allowed at any instant, read from the step history; none lost; released in the order
//! they were put in line), pauses, a hard budget stopping crew steps and holding new runs until
//! it is raised, and a retention sweep of 10,000 runs while runs are being created.

use std::time::Duration;

use engine::db::Db;
use engine::ids::{OrgId, ProjectId, RunId, WorkflowId};
use engine::store::runs::{self, NewRun};
use engine::store::{Actor, Change, StoreError, admission, budgets, retention, workflows};
use engine::substate;
use engine::testkit::{Engine, test_db};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::fixtures::{Seed, add_workflow, cancel, finish, new_run, poison, seed, seeded, started, until, until_done, with_input};

const PLAIN: &str = include_str!("../../../tests/workflows/one_crew_step.yaml");

/// Submits `n` runs at once, each in its own change on its own connection.
async fn submit_concurrently(pool: &Db, s: &Seed, n: usize, input: Value) -> Vec<Result<RunId, StoreError>> {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let (pool, new) = (pool.clone(), with_input(s, input.clone()));
        tasks.spawn(async move {
            let mut ch = Change::begin(&pool, Actor::System).await?;
            let run = runs::submit(&mut ch, new).await?;
            ch.commit().await?;
            Ok::<_, StoreError>((i, run))
        });
    }
    let mut out: Vec<(usize, Result<RunId, StoreError>)> = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined.unwrap() {
            Ok((i, run)) => out.push((i, Ok(run))),
            Err(e) => out.push((usize::MAX, Err(e))),
        }
    }
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

async fn submit(pool: &Db, new: NewRun) -> Result<RunId, StoreError> {
    let mut ch = Change::begin(pool, Actor::System).await?;
    let run = runs::submit(&mut ch, new).await?;
    ch.commit().await?;
    Ok(run)
}

/// The most runs of `workflow` running at any instant, from the step history: a run runs from
/// its first step's start to its end (half-open, so one that ends as another starts does not
/// overlap it).
async fn max_running(pool: &Db, workflow: WorkflowId) -> i64 {
    sqlx::query_scalar(
        "WITH r AS (SELECT r.run_id, (SELECT min(s.started_at) FROM steps s WHERE s.run_id = r.run_id) AS s, r.ended_at AS e \
                    FROM runs r WHERE r.workflow_id = $1), \
              ev AS (SELECT s AS t, 1 AS d FROM r WHERE s IS NOT NULL UNION ALL SELECT e, -1 FROM r WHERE s IS NOT NULL) \
         SELECT coalesce(max(n), 0)::bigint FROM (SELECT sum(d) OVER (ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS n FROM ev) x",
    )
    .bind(workflow)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Runs put in line, by their ticket (`run.held`'s `line`), with when each first started.
async fn released(pool: &Db, workflow: WorkflowId) -> Vec<(i64, Option<chrono::DateTime<chrono::Utc>>)> {
    sqlx::query_as(
        "SELECT (e.attrs->>'line')::bigint, (SELECT min(s.started_at) FROM steps s WHERE s.run_id = e.run_id) \
         FROM run_events e JOIN runs r ON r.run_id = e.run_id WHERE r.workflow_id = $1 AND e.kind = 'run.held' ORDER BY 1",
    )
    .bind(workflow)
    .fetch_all(pool)
    .await
    .unwrap()
}

fn assert_in_order(lines: &[(i64, Option<chrono::DateTime<chrono::Utc>>)]) {
    let started: Vec<_> = lines.iter().filter_map(|(_, s)| *s).collect();
    assert!(started.windows(2).all(|w| w[0] <= w[1]), "runs were not released in the order they were put in line: {lines:?}");
}

async fn statuses(pool: &Db, runs: &[RunId]) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for run in runs {
        out.push(until_done(pool, *run, Duration::from_secs(60)).await);
    }
    out
}

/// Every queue's count of its leases (`held`, less the releases of ended runs not yet counted
/// off by an admission) is the leases it has.
async fn assert_leases_counted(pool: &Db) {
    let queues: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT q.queue, q.held - (SELECT count(*) FROM lease_releases r WHERE r.org_id = q.org_id AND r.queue = q.queue), \
                (SELECT count(*) FROM concurrency_leases l WHERE l.org_id = q.org_id AND l.group_key = q.queue) \
         FROM admission_queues q",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let wrong: Vec<_> = queues.iter().filter(|(_, counted, held)| counted != held).collect();
    assert!(wrong.is_empty(), "(queue, counted, leases): {wrong:?}");
}

fn group(name: &str, limit: u32, policy: &str) -> String {
    format!(
        "name: grouped
concurrency: {{ group: {name}, limit: {limit}, policy: {policy} }}
nodes:
  work:
    crew: {{ harness: claude-code, prompt: work }}
"
    )
}

#[tokio::test]
async fn queue_runs_at_most_the_limit_at_once_and_releases_in_line_order() {
    let (db, s) = seeded(&group("deploy", 3, "queue")).await;
    let results = submit_concurrently(&db.pool, &s, 50, json!({ "test": { "step_ms": 150 } })).await;
    let runs: Vec<RunId> = results.into_iter().map(|r| r.expect("queue accepts every submit")).collect();
    // Three took the group's leases at submit; the others wait in line, and say where.
    let last: RunId = sqlx::query_scalar("SELECT run_id FROM admission_waits ORDER BY seq DESC LIMIT 1").fetch_one(&db.pool).await.unwrap();
    let w = substate::why(&db.pool, s.org, last).await.unwrap();
    assert_eq!((w.words.as_str(), w.text.as_str()), ("waiting for a lock", "Waiting for the lock of concurrency group deploy (46 ahead in line)"));
    let eng = Engine::executing(&db, "e1", None);
    for st in statuses(&db.pool, &runs).await {
        assert_eq!(st, ("completed".to_owned(), None));
    }
    assert_eq!(max_running(&db.pool, s.workflow).await, 3);
    let lines = released(&db.pool, s.workflow).await;
    assert!(lines.len() >= 40, "most runs waited in line: {}", lines.len());
    assert_in_order(&lines);
    assert_leases_counted(&db.pool).await;
    finish(eng, db).await;
}

#[tokio::test]
async fn skip_refuses_new_runs_while_the_group_is_full() {
    let (db, s, eng) = started(&group("deploy", 3, "skip")).await;
    let results = submit_concurrently(&db.pool, &s, 50, json!({ "test": { "step_ms": 3000 } })).await;
    let accepted: Vec<RunId> = results.iter().filter_map(|r| r.as_ref().ok().copied()).collect();
    let refused: Vec<String> = results.iter().filter_map(|r| r.as_ref().err()).map(|e| e.to_string()).collect();
    assert_eq!((accepted.len(), refused.len()), (3, 47), "{refused:?}");
    assert!(refused.iter().all(|e| e.starts_with("skipped: concurrency group deploy is full")), "{refused:?}");
    // Nothing of a refused submit was written.
    assert_eq!(crate::fixtures::count(&db.pool, "SELECT count(*) FROM runs").await, 3);
    for st in statuses(&db.pool, &accepted).await {
        assert_eq!(st.0, "completed");
    }
    // Once the group has room again, a submit is accepted.
    let again = submit(&db.pool, with_input(&s, json!({}))).await.unwrap();
    assert_eq!(statuses(&db.pool, &[again]).await[0].0, "completed");
    assert_eq!(max_running(&db.pool, s.workflow).await, 3);
    finish(eng, db).await;
}

#[tokio::test]
async fn drop_cancels_the_oldest_run_in_line_for_the_newest() {
    let (db, s, eng) = started(&group("deploy", 2, "drop")).await;
    let results = submit_concurrently(&db.pool, &s, 50, json!({ "test": { "step_ms": 3000 } })).await;
    let runs: Vec<RunId> = results.into_iter().map(|r| r.expect("drop accepts every submit")).collect();
    let ended = statuses(&db.pool, &runs).await;
    let completed = ended.iter().filter(|e| e.0 == "completed").count();
    let dropped = ended.iter().filter(|e| e.0 == "cancelled" && e.1.as_deref().is_some_and(|r| r.starts_with("dropped: "))).count();
    // Two ran at once; each newer run took the place of the one in line; the last one ran.
    assert_eq!((completed, dropped), (3, 47), "{ended:?}");
    let dropped_with_steps: i64 =
        sqlx::query_scalar("SELECT count(*) FROM runs r WHERE r.status = 'cancelled' AND EXISTS (SELECT 1 FROM steps s WHERE s.run_id = r.run_id)")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(dropped_with_steps, 0, "a dropped run never started");
    assert_eq!(max_running(&db.pool, s.workflow).await, 2);
    finish(eng, db).await;
}

#[tokio::test]
async fn a_throttle_admits_at_most_its_limit_per_window_from_a_wake_at_the_windows_end() {
    let db = test_db().await;
    let source = "name: throttled
throttle: { per: 1s, limit: 10 }
nodes:
  work:
    crew: { harness: claude-code, prompt: work }
";
    let s = seed(&db.pool, "acme", source).await;
    let eng = Engine::executing(&db, "e1", None);
    let started = Instant::now();
    // Watched from the first submit on, not after a pause: on a loaded machine the submits may
    // take as long as the throttle's windows, and a fixed pause could look too late.
    let watcher = {
        let (pool, org) = (db.pool.clone(), s.org);
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let one: Option<RunId> = sqlx::query_scalar("SELECT run_id FROM admission_waits WHERE hold = 'throttle' ORDER BY seq DESC LIMIT 1")
                    .fetch_optional(&pool)
                    .await
                    .unwrap();
                if let Some(one) = one {
                    let w = substate::why(&pool, org, one).await.unwrap();
                    // It may have been admitted between the two reads; look again.
                    if w.words == "asleep" {
                        return w;
                    }
                }
                assert!(Instant::now() < deadline, "no run ever waited on the throttle");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let runs: Vec<RunId> = submit_concurrently(&db.pool, &s, 50, json!({})).await.into_iter().map(Result::unwrap).collect();
    // Runs beyond the throttle sleep until the window has room, and say so.
    let w = watcher.await.unwrap();
    assert!(w.text.contains("held by the workflow's throttle"), "{}", w.text);
    for st in statuses(&db.pool, &runs).await {
        assert_eq!(st.0, "completed");
    }
    let took = started.elapsed();
    // 50 runs at 10 a second: the fifth ten starts 4 s after the first.
    assert!(took >= Duration::from_secs(4) && took < Duration::from_secs(20), "took {took:?}");
    let starts: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM min(s.started_at))::float8 FROM steps s JOIN runs r ON r.run_id = s.run_id \
         WHERE r.workflow_id = $1 GROUP BY s.run_id ORDER BY 1",
    )
    .bind(s.workflow)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(starts.len(), 50);
    for i in 0..starts.len() - 10 {
        assert!(starts[i + 10] - starts[i] >= 1.0 - 1e-6, "11 starts within a second: {} and {}", starts[i], starts[i + 10]);
    }
    assert_in_order(&released(&db.pool, s.workflow).await);
    finish(eng, db).await;
}

async fn set_cap(pool: &Db, org: OrgId, cap: i32) {
    let mut ch = Change::begin(pool, Actor::System).await.unwrap();
    admission::set_running_cap(&mut ch, org, cap).await.unwrap();
    ch.commit().await.unwrap();
}

#[tokio::test]
async fn the_org_cap_queues_runs_beyond_it_and_child_runs_never_wait() {
    let (db, s) = seeded(PLAIN).await;
    set_cap(&db.pool, s.org, 5).await;
    let runs: Vec<RunId> = submit_concurrently(&db.pool, &s, 50, json!({ "test": { "step_ms": 100 } })).await.into_iter().map(Result::unwrap).collect();
    // Five were admitted at submit; a submit that found the org's row busy was left to the
    // engine (which queues it), the others are in line already and say so.
    let admitted = crate::fixtures::count(&db.pool, "SELECT count(*) FROM runs WHERE admitted_at IS NOT NULL").await;
    assert!(admitted <= 5, "{admitted} admitted at submit");
    let queued: Option<RunId> = sqlx::query_scalar("SELECT run_id FROM admission_waits ORDER BY seq DESC LIMIT 1").fetch_optional(&db.pool).await.unwrap();
    if let Some(q) = queued {
        let w = substate::why(&db.pool, s.org, q).await.unwrap();
        assert!(w.text.starts_with("Queued: held by the org's cap of 5 running runs ("), "{}", w.text);
    }
    let eng = Engine::executing(&db, "e1", None);
    for st in statuses(&db.pool, &runs).await {
        assert_eq!(st.0, "completed");
    }
    assert_eq!(max_running(&db.pool, s.workflow).await, 5);
    assert_in_order(&released(&db.pool, s.workflow).await);
    assert_leases_counted(&db.pool).await;

    // A parent at the cap still gets its child: child runs never wait on it.
    set_cap(&db.pool, s.org, 1).await;
    let (parent_wf, version) = add_workflow(&db.pool, &s, "parent", "name: parent\nnodes:\n  spawn:\n    workflow: { name: wf }\n").await;
    let parent = submit(&db.pool, NewRun { workflow: parent_wf, version, ..new_run(&s) }).await.unwrap();
    assert_eq!(statuses(&db.pool, &[parent]).await[0].0, "completed");
    finish(eng, db).await;
}

/// A run failed without words (its journal refuses the run's events, so even `run.failed`
/// cannot be written) gives up its room like any ended run: the run in line behind it at a
/// cap of one is admitted and completes. The refusal comes at the advance's commit, where the
/// journal's rows are written, and is that run's trouble alone.
#[tokio::test]
async fn a_run_failed_without_its_journal_hands_its_room_on() {
    let (db, s) = seeded(PLAIN).await;
    set_cap(&db.pool, s.org, 1).await;
    let first = submit(&db.pool, with_input(&s, json!({ "test": { "step_ms": 10 } }))).await.unwrap();
    let second = submit(&db.pool, with_input(&s, json!({ "test": { "step_ms": 10 } }))).await.unwrap();
    assert!(held_in_line(&db.pool, second).await, "the second run waits for the cap");
    poison(&db.pool, "run_events", &format!("NEW.run_id = '{}'", first.0)).await;
    let eng = Engine::executing(&db, "e1", None);
    let ended = statuses(&db.pool, &[second]).await.remove(0);
    let first_row: (String, Option<String>, i32) =
        sqlx::query_as("SELECT status, reason, engine_errors FROM runs WHERE run_id = $1").bind(first).fetch_one(&db.pool).await.unwrap();
    assert_eq!(ended.0, "completed", "the first run (status, reason, engine errors): {first_row:?}");
    let (status, reason): (String, Option<String>) =
        sqlx::query_as("SELECT status, reason FROM runs WHERE run_id = $1").bind(first).fetch_one(&db.pool).await.unwrap();
    assert_eq!((status.as_str(), reason.as_deref()), ("failed", Some("engine_error")));
    let bare: Vec<Value> = sqlx::query_scalar("SELECT detail FROM audit_log WHERE action = 'run.engine_error' AND target_id = $1")
        .bind(first.to_string())
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert!(bare.iter().any(|d| d["without_event"] == json!(true)), "{bare:?}");
    assert_leases_counted(&db.pool).await;
    finish(eng, db).await;
}

async fn held_in_line(pool: &Db, run: RunId) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM admission_waits WHERE run_id = $1)").bind(run).fetch_one(pool).await.unwrap()
}

#[tokio::test]
async fn a_submit_is_refused_once_a_thousand_runs_wait_for_the_cap() {
    let (db, s) = seeded(PLAIN).await;
    set_cap(&db.pool, s.org, 1).await;
    // No engine: the first run holds the only slot, the next 1,000 wait.
    for _ in 0..10 {
        let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
        for _ in 0..100 {
            runs::submit(&mut ch, new_run(&s)).await.unwrap();
        }
        ch.commit().await.unwrap();
    }
    submit(&db.pool, new_run(&s)).await.unwrap();
    let err = submit(&db.pool, new_run(&s)).await.unwrap_err();
    assert!(matches!(&err, StoreError::Full(m) if m.starts_with("1000 runs already wait")), "{err}");
    assert_eq!(crate::fixtures::count(&db.pool, "SELECT count(*) FROM runs").await, 1001);
    // A dry run is not admitted through the line.
    submit(&db.pool, NewRun { dry_run: true, ..new_run(&s) }).await.unwrap();
    db.discard().await;
}

#[tokio::test]
async fn a_paused_workflow_or_project_holds_new_runs_until_unpaused() {
    let (db, s, eng) = started(PLAIN).await;
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    workflows::set_paused(&mut ch, s.org, s.workflow, true).await.unwrap();
    ch.commit().await.unwrap();
    let held = submit(&db.pool, new_run(&s)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let w = substate::why(&db.pool, s.org, held).await.unwrap();
    assert_eq!((w.words.as_str(), w.text.as_str()), ("held", "Held: workflow wf is paused"));
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    workflows::set_paused(&mut ch, s.org, s.workflow, false).await.unwrap();
    admission::set_project_paused(&mut ch, s.org, s.project, true).await.unwrap();
    ch.commit().await.unwrap();
    let w = substate::why(&db.pool, s.org, held).await.unwrap();
    // Unpausing the workflow woke it; the project's pause now holds it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let w2 = substate::why(&db.pool, s.org, held).await.unwrap();
    assert_eq!(w2.text, "Held: the project is paused", "{} then {}", w.text, w2.text);
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    admission::set_project_paused(&mut ch, s.org, s.project, false).await.unwrap();
    ch.commit().await.unwrap();
    assert_eq!(statuses(&db.pool, &[held]).await[0].0, "completed");
    let kinds: Vec<String> =
        sqlx::query_scalar("SELECT kind FROM run_events WHERE run_id = $1 AND kind LIKE 'run.%' ORDER BY seq").bind(held).fetch_all(&db.pool).await.unwrap();
    assert_eq!(kinds, ["run.started", "run.held", "run.held", "run.admitted", "run.completed"]);
    finish(eng, db).await;
}

async fn set_budget(pool: &Db, org: OrgId, project: Option<ProjectId>, usd: f64, hard: bool) {
    let mut ch = Change::begin(pool, Actor::System).await.unwrap();
    budgets::set(&mut ch, org, project, budgets::Period::Day, usd, hard).await.unwrap();
    ch.commit().await.unwrap();
}

#[tokio::test]
async fn a_hard_budget_stops_the_next_crew_step_holds_new_runs_and_raising_it_releases_them() {
    let db = test_db().await;
    let source = "name: costly
nodes:
  a:
    crew: { harness: claude-code, prompt: a }
  b:
    after: [a]
    crew: { harness: claude-code, prompt: b }
    retry: { attempts: 3, backoff: 1s }
  c:
    after: [b]
    crew: { harness: claude-code, prompt: c }
  d:
    after: [c]
    crew: { harness: claude-code, prompt: d }
";
    let s = seed(&db.pool, "acme", source).await;
    set_budget(&db.pool, s.org, Some(s.project), 10.0, true).await;
    let eng = Engine::executing(&db, "e1", None);
    let costly = json!({ "test": { "cost_usd": 4, "tokens": 1000 } });
    let first = submit(&db.pool, with_input(&s, costly.clone())).await.unwrap();
    assert_eq!(statuses(&db.pool, &[first]).await[0], ("failed".to_owned(), Some(budgets::HARD_STOP.to_owned())));
    let steps: Vec<String> = sqlx::query_scalar(
        "SELECT node || ':' || state || coalesce(':' || reason, '') || coalesce(':' || failure_class, '') FROM steps WHERE run_id = $1 ORDER BY started_seq",
    )
    .bind(first)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    // a, b and c report 4 each (12 ≥ 10): d fails before it starts, final, never retried.
    assert_eq!(steps, ["a:succeeded", "b:succeeded", "c:succeeded", "d:failed:budget_hard_stop:final"]);
    let (usd, tokens): (f64, i64) =
        sqlx::query_as("SELECT sum(usd)::float8, sum(tokens)::int8 FROM spend WHERE project_id = $1").bind(s.project).fetch_one(&db.pool).await.unwrap();
    assert_eq!((usd, tokens), (12.0, 3000));
    let spent: f64 = sqlx::query_scalar("SELECT spent_usd::float8 FROM runs WHERE run_id = $1").bind(first).fetch_one(&db.pool).await.unwrap();
    assert_eq!(spent, 12.0);

    // New runs are held by the spent budget.
    let held = submit(&db.pool, with_input(&s, costly)).await.unwrap();
    let w = substate::why(&db.pool, s.org, held).await.unwrap();
    assert_eq!(w.text, "Held: the project's daily budget of $10.00 (hard) is spent");
    // It wakes by itself at the end of the UTC day.
    let due: f64 = sqlx::query_scalar("SELECT extract(epoch FROM due_at - now())::float8 FROM wakes WHERE run_id = $1 AND reason = 'admit'")
        .bind(held)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!((0.0..=86_400.0).contains(&due), "wakes at midnight UTC, in {due} s");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(crate::fixtures::count(&db.pool, &format!("SELECT count(*) FROM steps WHERE run_id = '{}'", held.0)).await, 0);

    // Raising the limit releases it; it runs to the end.
    set_budget(&db.pool, s.org, Some(s.project), 100.0, true).await;
    assert_eq!(statuses(&db.pool, &[held]).await[0], ("completed".to_owned(), None));
    eng.stop();
    db.discard().await;
}

#[tokio::test]
async fn a_soft_budget_holds_new_runs_but_lets_crew_steps_run() {
    let (db, s) = seeded("name: plain\nnodes:\n  work:\n    crew: { harness: claude-code, prompt: work }\n  more:\n    after: [work]\n    crew: { harness: claude-code, prompt: more }\n").await;
    set_budget(&db.pool, s.org, None, 1.0, false).await;
    let eng = Engine::executing(&db, "e1", None);
    let first = submit(&db.pool, with_input(&s, json!({ "test": { "cost_usd": 2 } }))).await.unwrap();
    assert_eq!(statuses(&db.pool, &[first]).await[0].0, "completed");
    let held = submit(&db.pool, new_run(&s)).await.unwrap();
    let w = substate::why(&db.pool, s.org, held).await.unwrap();
    assert_eq!(w.text, "Held: the org's daily budget of $1.00 (soft) is spent");
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    budgets::remove(&mut ch, s.org, None, budgets::Period::Day).await.unwrap();
    ch.commit().await.unwrap();
    assert_eq!(statuses(&db.pool, &[held]).await[0].0, "completed");
    eng.stop();
    db.discard().await;
}

/// Inserts `n` finished runs of the seed's workflow that ended `days` ago, each with two steps
/// and four events (what a run's history holds), in one statement per table.
async fn old_runs(pool: &Db, s: &Seed, n: i64, days: i32) {
    let ids: Vec<uuid::Uuid> = (0..n).map(|_| uuid::Uuid::now_v7()).collect();
    sqlx::query(
        "INSERT INTO runs (org_id, project_id, run_id, workflow_id, workflow_version, status, created_by, created_at, started_at, ended_at, admitted_at) \
         SELECT $1, $2, id, $3, $4, 'completed', 'test', now() - make_interval(days => $6), now() - make_interval(days => $6), \
                now() - make_interval(days => $6), now() - make_interval(days => $6) FROM unnest($5::uuid[]) AS id",
    )
    .bind(s.org)
    .bind(s.project)
    .bind(s.workflow)
    .bind(s.version)
    .bind(&ids)
    .bind(days)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO steps (org_id, run_id, step_id, node, kind, visit, attempt, state, started_seq, finished_seq) \
         SELECT $1, id, gen_random_uuid(), n, 'crew', 1, 1, 'succeeded', k, k + 1 FROM unnest($2::uuid[]) AS id, \
                (VALUES ('a', 2), ('b', 4)) AS v(n, k)",
    )
    .bind(s.org)
    .bind(&ids)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO run_events (org_id, project_id, run_id, run_created_at, seq, kind) \
         SELECT $1, $2, id, (SELECT created_at FROM runs WHERE run_id = id), k, 'step.x' FROM unnest($3::uuid[]) AS id, generate_series(1, 4) AS k",
    )
    .bind(s.org)
    .bind(s.project)
    .bind(&ids)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn retention_deletes_what_is_past_it_and_nothing_else_without_blocking_new_runs() {
    let (db, s) = seeded(PLAIN).await;
    set_cap(&db.pool, s.org, 100_000).await;
    old_runs(&db.pool, &s, 10_000, 40).await;
    old_runs(&db.pool, &s, 50, 20).await;
    // A run still running, started long ago, is never deleted.
    let running = submit(&db.pool, with_input(&s, json!({ "test": { "step_ms": 600_000 } }))).await.unwrap();
    sqlx::query("UPDATE runs SET created_at = now() - interval '400 days' WHERE run_id = $1").bind(running).execute(&db.pool).await.unwrap();
    let before = crate::fixtures::count(&db.pool, "SELECT count(*) FROM runs").await;
    assert_eq!(before, 10_051);

    // Runs are created, one change each, all through the sweep.
    let creating = tokio::sync::watch::channel(true);
    let (pool, seed_again) = (db.pool.clone(), s_copy(&s));
    let mut keep_going = creating.1.clone();
    let creator = tokio::spawn(async move {
        let mut latencies = Vec::new();
        let mut made = Vec::new();
        while *keep_going.borrow_and_update() {
            let t = Instant::now();
            made.push(submit(&pool, new_run(&seed_again)).await.unwrap());
            latencies.push(t.elapsed());
        }
        (latencies, made)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A retention of 30 days: the sweep is due now, an engine takes it.
    let eng = Engine::executing(&db, "e1", None);
    let started = Instant::now();
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    retention::set_days(&mut ch, s.org, s.project, 30).await.unwrap();
    ch.commit().await.unwrap();
    let sweep_ended = loop {
        let old = crate::fixtures::count(&db.pool, "SELECT count(*) FROM runs WHERE ended_at < now() - interval '30 days'").await;
        if old == 0 {
            break started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(120), "{old} old runs left");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    creating.0.send(false).unwrap();
    let (latencies, made) = creator.await.unwrap();
    let during = latencies.len();
    let slowest = latencies.iter().max().copied().unwrap_or_default();
    let mut sorted = latencies.clone();
    sorted.sort();
    let p99 = sorted.get(sorted.len() * 99 / 100).copied().unwrap_or_default();
    eprintln!("retention: 10000 runs deleted in {sweep_ended:?}; {during} runs created meanwhile, p99 {p99:?}, slowest {slowest:?}");
    // Runs were created all through the sweep, one change each: none waited for it to end
    // (how long each took is printed, for `make bench` to judge, not asserted).
    assert!(during >= 20, "run creation went on during the sweep: {during}");

    // Exactly the old finished runs went, with their steps; the kept runs' journals are whole
    // (the deleted runs' journals go with their month's partition, once no run of it is left).
    let left = crate::fixtures::count(&db.pool, "SELECT count(*) FROM runs").await;
    assert_eq!(left, 51 + made.len() as i64);
    assert_eq!(crate::fixtures::count(&db.pool, "SELECT count(*) FROM steps WHERE node IN ('a', 'b')").await, 100);
    assert_eq!(crate::fixtures::count(&db.pool, "SELECT count(*) FROM run_events WHERE kind = 'step.x' AND run_id IN (SELECT run_id FROM runs)").await, 200);
    let still: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE run_id = $1").bind(running).fetch_one(&db.pool).await.unwrap();
    assert_eq!(still, 1, "a running run is never deleted");
    // The next sweep is due in a day (the oldest run left comes of age in about 10 days, but
    // the journals' partitions are looked after daily), once the sweep has finished (until then
    // its job is due a lease ahead).
    next_sweep_in_days(&db.pool, s.project, 1.0).await;
    eng.stop();
    db.discard().await;
}

fn s_copy(s: &Seed) -> Seed {
    Seed { org: s.org, project: s.project, workflow: s.workflow, version: s.version }
}

const BOARDED: &str = include_str!("../../../tests/workflows/boarded.yaml");

async fn set_board_limit(pool: &Db, s: &Seed, column: &str, limit: Option<i32>) {
    let mut ch = Change::begin(pool, Actor::System).await.unwrap();
    admission::set_board_limit(&mut ch, s.org, s.project, column, limit).await.unwrap();
    ch.commit().await.unwrap();
}

async fn held_by_board(pool: &Db, run: RunId) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM admission_waits WHERE run_id = $1 AND hold = 'board')").bind(run).fetch_one(pool).await.unwrap()
}

/// Waits until the run was admitted and has started a step.
async fn until_started(pool: &Db, run: RunId) {
    until(&format!("{run} was never admitted"), Duration::from_secs(20), async || {
        sqlx::query_scalar("SELECT admitted_at IS NOT NULL AND EXISTS (SELECT 1 FROM steps WHERE run_id = $1) FROM runs WHERE run_id = $1")
            .bind(run)
            .fetch_one(pool)
            .await
            .unwrap()
    })
    .await;
}

#[tokio::test]
async fn a_full_board_column_holds_runs_that_move_cards_into_it_and_releases_them_in_order() {
    let (db, s) = seeded(BOARDED).await;
    set_board_limit(&db.pool, &s, "In progress", Some(2)).await;
    let results = submit_concurrently(&db.pool, &s, 5, json!({ "test": { "step_ms": 200 } })).await;
    let runs: Vec<RunId> = results.into_iter().map(|r| r.expect("a full column holds, never refuses")).collect();
    // Two took the column's room at submit; three wait in its line and say which column.
    let waiting: Vec<RunId> = sqlx::query_scalar("SELECT run_id FROM admission_waits WHERE hold = 'board' ORDER BY seq").fetch_all(&db.pool).await.unwrap();
    assert_eq!(waiting.len(), 3);
    let w = substate::why(&db.pool, s.org, waiting[2]).await.unwrap();
    assert_eq!(
        (w.substate.as_ref().map(|s| s.name()), w.text.as_str()),
        (Some("queued"), "Queued: held by board column In progress (WIP limit 2), which is full (2 ahead in line)")
    );
    let mut conn = db.pool.pool().acquire().await.unwrap();
    let limits = admission::board_limits(&mut conn, s.org, s.project).await.unwrap();
    drop(conn);
    assert_eq!((limits[0].column.as_str(), limits[0].limit, limits[0].occupied, limits[0].waiting), ("In progress", 2, 2, 3));

    let eng = Engine::executing(&db, "e1", None);
    for st in statuses(&db.pool, &runs).await {
        assert_eq!(st, ("completed".to_owned(), None));
    }
    assert_eq!(max_running(&db.pool, s.workflow).await, 2, "never more than the limit occupy the column");
    let lines = released(&db.pool, s.workflow).await;
    assert_eq!(lines.len(), 3);
    assert_in_order(&lines);
    finish(eng, db).await;
}

/// A `projects_v2_item.edited` delivery moving an item's card to `column`.
async fn move_card(pool: &Db, delivery: &str, content_node_id: &str, column: &str) {
    let body = json!({
        "action": "edited",
        "projects_v2_item": { "id": 314, "node_id": format!("PVTI_{content_node_id}"), "project_node_id": "PVT_9", "content_node_id": content_node_id, "content_type": "Issue" },
        "changes": { "field_value": { "field_node_id": "PVTSSF_1", "field_type": "single_select", "field_name": "Status",
                                      "from": { "id": "0", "name": "In progress" }, "to": { "id": "1", "name": column } } },
        "organization": { "login": "acme", "id": 1 },
        "sender": { "login": "alice", "id": 2, "type": "User" },
        "installation": { "id": 77 },
    });
    let bytes = serde_json::to_vec(&body).unwrap();
    let outcome = engine::triggers::ingest(pool, &engine::triggers::Delivery { id: delivery, event: "projects_v2_item", body: &bytes }).await.unwrap();
    assert_eq!(outcome, engine::triggers::IngestOutcome::Accepted { outcome: "accepted".into(), runs_opened: 0 });
}

#[tokio::test]
async fn room_in_a_column_is_freed_by_a_card_leaving_it_a_raised_limit_and_a_run_ending() {
    let (db, s) = seeded(BOARDED).await;
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    engine::store::installations::connect_for_test(&mut ch, s.org, s.project, 77, "acme", "acme/web").await.unwrap();
    let mut items = Vec::new();
    for n in [1, 2] {
        items.push(engine::store::triggers::ensure_item(&mut ch, s.org, s.project, &format!(r#"["github","acme/web",{n}]"#)).await.unwrap());
    }
    ch.commit().await.unwrap();
    // Two cards are in the column already (as the webhooks stored them; the name's case differs).
    for (n, item) in items.iter().enumerate() {
        sqlx::query("UPDATE items SET node_id = $2, data = $3 WHERE item_id = $1")
            .bind(*item)
            .bind(format!("I_{n}"))
            .bind(json!({ "repository": "acme/web", "number": n + 1, "board": { "project": "PVT_9", "card": format!("PVTI_I_{n}"), "column": "In Progress", "fields": {} } }))
            .execute(&db.pool)
            .await
            .unwrap();
    }
    set_board_limit(&db.pool, &s, "in progress", Some(2)).await;
    let eng = Engine::executing(&db, "e1", None);
    let long = json!({ "test": { "step_ms": 600_000 } });

    // The column is full of cards: a run is held, and says why.
    let a = submit(&db.pool, with_input(&s, long.clone())).await.unwrap();
    assert!(held_by_board(&db.pool, a).await);
    let w = substate::why(&db.pool, s.org, a).await.unwrap();
    assert_eq!(w.text, "Queued: held by board column in progress (WIP limit 2), which is full (next in line)");

    // A card leaves the column (a webhook): the run is admitted, with no poll.
    move_card(&db.pool, "d-1", "I_0", "Done").await;
    until_started(&db.pool, a).await;

    // One card and one admitted run occupy it now: the next is held until the limit is raised.
    let b = submit(&db.pool, with_input(&s, long.clone())).await.unwrap();
    assert!(held_by_board(&db.pool, b).await);
    set_board_limit(&db.pool, &s, "In progress", Some(3)).await;
    until_started(&db.pool, b).await;

    // Full again; a run ending frees its room.
    let c = submit(&db.pool, with_input(&s, long.clone())).await.unwrap();
    assert!(held_by_board(&db.pool, c).await);
    cancel(&db.pool, s.org, a, "done with it").await;
    until_started(&db.pool, c).await;

    // A card moving into the column takes room; removing the limit lets everyone in line go.
    move_card(&db.pool, "d-2", "I_0", "In progress").await;
    let d = submit(&db.pool, with_input(&s, long.clone())).await.unwrap();
    assert!(held_by_board(&db.pool, d).await);
    set_board_limit(&db.pool, &s, "In progress", None).await;
    until_started(&db.pool, d).await;

    for run in [b, c, d] {
        cancel(&db.pool, s.org, run, "test over").await;
    }
    eng.stop();
    db.discard().await;
}

/// The journal partition of the month `days` ago, made if missing; its name.
async fn partition_of(pool: &Db, days: i32) -> String {
    sqlx::query_scalar(
        "SELECT 'run_events_' || to_char(m, 'YYYYMM') FROM (SELECT date_trunc('month', now() - make_interval(days => $1))::date AS m) x, \
                LATERAL (SELECT shopfloor_journal_partition(x.m)) made",
    )
    .bind(days)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn exists(pool: &Db, table: &str) -> bool {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL").bind(table).fetch_one(pool).await.unwrap()
}

/// Sets the project's retention again, which makes its sweep due now (an engine takes it).
async fn sweep_now(pool: &Db, s: &Seed) {
    let mut ch = Change::begin(pool, Actor::System).await.unwrap();
    retention::set_days(&mut ch, s.org, s.project, 90).await.unwrap();
    ch.commit().await.unwrap();
}

/// Waits for `sql` to be true, with a hang guard.
async fn until_true(pool: &Db, sql: &str) {
    let wait = async {
        while !sqlx::query_scalar::<_, bool>(sql).fetch_one(pool).await.unwrap() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(120), wait).await.unwrap_or_else(|_| panic!("never: {sql}"));
}

#[tokio::test]
async fn a_runs_journal_lives_as_long_as_the_run_and_its_partition_goes_whole_after_it() {
    let (db, s) = seeded(PLAIN).await;
    // 300 runs that ended 20 days ago (within the 90 days of retention), four events each,
    // the first two 40 days old: past what the stream replays, still their runs' history.
    old_runs(&db.pool, &s, 300, 20).await;
    sqlx::query("UPDATE run_events SET at = now() - interval '40 days' WHERE kind = 'step.x' AND seq <= 2").execute(&db.pool).await.unwrap();
    // 50 runs of a year ago in their month's partition, long past retention, and a run of the
    // same month that still runs.
    let ancient = partition_of(&db.pool, 420).await;
    old_runs(&db.pool, &s, 51, 420).await;
    let running: RunId =
        sqlx::query_scalar("SELECT run_id FROM runs WHERE created_at < now() - interval '400 days' ORDER BY run_id LIMIT 1").fetch_one(&db.pool).await.unwrap();
    sqlx::query("UPDATE runs SET status = 'running', ended_at = NULL WHERE run_id = $1").bind(running).execute(&db.pool).await.unwrap();
    let in_ancient = format!("SELECT count(*) FROM {ancient}");
    assert_eq!(crate::fixtures::count(&db.pool, &in_ancient).await, 51 * 4);
    let eng = Engine::executing(&db, "e1", None);

    // The sweep deletes the 50 finished runs of a year ago; their partition stays while the
    // running run of its month is left, and every journal of a kept run is whole.
    sweep_now(&db.pool, &s).await;
    until_true(&db.pool, "SELECT count(*) = 301 FROM runs").await;
    next_sweep_in_days(&db.pool, s.project, 1.0).await;
    assert!(exists(&db.pool, &ancient).await, "a running run's partition is kept");
    assert_eq!(
        crate::fixtures::count(&db.pool, "SELECT count(*) FROM run_events WHERE kind = 'step.x' AND run_id IN (SELECT run_id FROM runs)").await,
        301 * 4
    );
    let old: i64 = crate::fixtures::count(
        &db.pool,
        "SELECT count(*) FROM run_events WHERE at < now() - interval '30 days' AND run_created_at > now() - interval '30 days'",
    )
    .await;
    assert_eq!(old, 600, "events older than 30 days of runs still kept");

    // That run ends, long ago: the next sweep deletes it, and its month's partition goes whole.
    sqlx::query("UPDATE runs SET status = 'cancelled', ended_at = now() - interval '400 days' WHERE run_id = $1")
        .bind(running)
        .execute(&db.pool)
        .await
        .unwrap();
    sweep_now(&db.pool, &s).await;
    until_true(&db.pool, &format!("SELECT to_regclass('{ancient}') IS NULL")).await;
    assert_eq!(crate::fixtures::count(&db.pool, "SELECT count(*) FROM runs").await, 300);
    assert_eq!(crate::fixtures::count(&db.pool, "SELECT count(*) FROM run_events WHERE kind = 'step.x'").await, 300 * 4);
    // The months ahead are there.
    for ahead in [0, 1, 2] {
        let name: String = sqlx::query_scalar("SELECT 'run_events_' || to_char(date_trunc('month', now()) + make_interval(months => $1), 'YYYYMM')")
            .bind(ahead)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert!(exists(&db.pool, &name).await, "{name}");
    }
    eng.stop();
    db.discard().await;
}

/// Waits (10 s at most) until the project's next retention sweep is due in `days` (± 0.1):
/// the job is rescheduled once the running sweep has finished.
async fn next_sweep_in_days(pool: &Db, project: ProjectId, days: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let next: f64 = sqlx::query_scalar("SELECT extract(epoch FROM due_at - now())::float8 / 86400 FROM jobs WHERE kind = 'retention' AND subject = $1")
            .bind(project.0)
            .fetch_one(pool)
            .await
            .unwrap();
        if (next - days).abs() < 0.1 {
            return;
        }
        assert!(Instant::now() < deadline, "next sweep in {next} days, not {days}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
