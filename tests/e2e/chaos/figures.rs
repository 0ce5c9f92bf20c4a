//! What the chaos suite checks once every run has ended, each against what the server
//! acknowledged or what GitHub holds, never against the driver's own tally.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use engine::db::Db;
use engine::ids::RunId;
use shopfloor_tests::github_fake::FakeGithub;

use super::clients::Acked;
use super::fleet::Fate;
use super::{REPOSITORY, REST_SUCCEEDED, WEBHOOK_SUCCEEDED};

/// An acknowledged run that did not end as it should, and why.
#[derive(Debug)]
pub(super) struct Lost {
    pub(super) what: String,
    pub(super) run: Option<RunId>,
}

/// Acknowledged submits and deliveries whose run is missing, unfinished, or ended otherwise
/// than its workflow says (the poisoned run must end `failed engine_error`, every other one
/// `completed` with exactly its expected steps succeeded); and the runs nobody acknowledged.
pub(super) async fn lost_runs(db: &Db, acked: &Acked, poisoned: Option<RunId>) -> (Vec<Lost>, i64) {
    // (run, workflow, status, reason, item key)
    type Row = (RunId, String, String, Option<String>, Option<String>);
    let runs: Vec<Row> =
        sqlx::query_as("SELECT r.run_id, w.name, r.status, r.reason, i.key FROM runs r JOIN workflows w USING (workflow_id) LEFT JOIN items i USING (item_id)")
            .fetch_all(db)
            .await
            .unwrap();
    let succeeded: Vec<(RunId, String, i32)> = sqlx::query_as("SELECT run_id, node, visit FROM steps WHERE state = 'succeeded'").fetch_all(db).await.unwrap();
    let mut steps: HashMap<RunId, BTreeSet<(String, i32)>> = HashMap::new();
    for (run, node, visit) in succeeded {
        steps.entry(run).or_default().insert((node, visit));
    }
    let by_id: HashMap<RunId, (&str, &str, Option<&str>)> = runs.iter().map(|(r, w, s, why, _)| (*r, (w.as_str(), s.as_str(), why.as_deref()))).collect();
    let mut by_issue: HashMap<i64, Vec<RunId>> = HashMap::new();
    for (run, _, _, _, key) in &runs {
        if let Some(number) = key.as_deref().and_then(issue_of) {
            by_issue.entry(number).or_default().push(*run);
        }
    }
    let expected = |list: &[(&str, i32)]| -> BTreeSet<(String, i32)> { list.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect() };
    let (rest, webhook) = (expected(&REST_SUCCEEDED), expected(&WEBHOOK_SUCCEEDED));
    let check = |what: String, run: RunId, want: &BTreeSet<(String, i32)>| -> Option<Lost> {
        let problem = match by_id.get(&run) {
            None => "acknowledged, but there is no such run".to_owned(),
            Some((_, status, reason)) if Some(run) == poisoned => {
                if (*status, *reason) == ("failed", Some("engine_error")) {
                    return None;
                }
                format!("the poisoned run ended {status} {}", reason.unwrap_or_default())
            }
            Some((_, status, reason)) if *status != "completed" => format!("{status} {}", reason.unwrap_or_default()),
            Some(_) if steps.get(&run) != Some(want) => format!("completed with the wrong steps {:?}", steps.get(&run)),
            Some(_) => return None,
        };
        Some(Lost { what: format!("{what}: {problem}"), run: Some(run) })
    };
    let mut lost = Vec::new();
    for (key, run) in &acked.submits {
        lost.extend(check(format!("submit {key}"), *run, &rest));
    }
    for (number, delivery) in &acked.deliveries {
        match by_issue.get(number).map(Vec::as_slice) {
            Some([run]) => lost.extend(check(format!("delivery {delivery} (issue #{number})"), *run, &webhook)),
            Some(many) => lost.push(Lost { what: format!("delivery {delivery} (issue #{number}) started {} runs", many.len()), run: many.first().copied() }),
            None => lost.push(Lost { what: format!("delivery {delivery} (issue #{number}) was acknowledged, but started no run"), run: None }),
        }
    }
    let known: BTreeSet<RunId> =
        acked.submits.iter().map(|(_, r)| *r).chain(acked.deliveries.iter().filter_map(|(n, _)| by_issue.get(n).and_then(|r| r.first().copied()))).collect();
    let unacknowledged = runs.iter().filter(|(r, ..)| !known.contains(r)).count() as i64;
    (lost, unacknowledged)
}

/// `["github","acme/widgets",12]` → 12.
fn issue_of(key: &str) -> Option<i64> {
    let v: serde_json::Value = serde_json::from_str(key).ok()?;
    (v[1] == REPOSITORY).then(|| v[2].as_i64()).flatten()
}

/// Issues whose comment from shopfloor GitHub does not hold exactly once: (doubled, missing).
/// Each run's `ship` output comments once on its issue; a second comment from a re-executed
/// output is an external effect doubled.
pub(super) fn external_effects(github: &FakeGithub, acked: &Acked) -> (Vec<i64>, Vec<i64>) {
    let (mut doubled, mut missing) = (Vec::new(), Vec::new());
    for (number, _) in &acked.deliveries {
        let ours = github.comments(REPOSITORY, *number).iter().filter(|c| c["body"].as_str().is_some_and(|b| b.contains("<!-- shopfloor:"))).count();
        match ours {
            1 => {}
            0 => missing.push(*number),
            _ => doubled.push(*number),
        }
    }
    (doubled, missing)
}

/// An attempt that ran after an earlier attempt of the same visit had already run, and what
/// happened to the earlier one's holder.
pub(super) struct Reexecution {
    pub(super) visit: String,
    pub(super) holder: String,
    /// How the earlier attempt ended (`lease_expired` when its holder lost it).
    pub(super) reason: String,
    /// What befell the holder, last first: the last is why its lease lapsed.
    pub(super) fates: Vec<Fate>,
}

/// The visits executed by more than one attempt: from the test executor's effects file (one
/// line per executed attempt: step, run, node, visit, attempt) and, for the outputs, from the
/// attempts of `ship` on GitHub after an earlier one had been held (GitHub's idempotent
/// output then found its comment and did not post again).
pub(super) async fn reexecutions(db: &Db, effects: &Path, fates: &HashMap<String, Vec<Fate>>) -> Vec<Reexecution> {
    let text = std::fs::read_to_string(effects).unwrap_or_default();
    let mut visits: BTreeMap<(String, String, String), BTreeSet<i32>> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if let [_, run, node, visit, attempt] = f[..] {
            visits.entry((run.to_owned(), node.to_owned(), visit.to_owned())).or_default().insert(attempt.parse().unwrap_or(0));
        }
    }
    let outputs: Vec<(String, String, i32, i32)> = sqlx::query_as(
        "SELECT run_id::text, node, visit, attempt FROM steps WHERE kind = 'output' AND holder IS NOT NULL AND state IN ('succeeded', 'failed')",
    )
    .fetch_all(db)
    .await
    .unwrap();
    for (run, node, visit, attempt) in outputs {
        visits.entry((RunId(run.parse().unwrap()).to_string(), node, visit.to_string())).or_default().insert(attempt);
    }
    // Who held each attempt, and how it ended.
    type Attempt = (String, String, i32, i32, Option<String>, Option<String>);
    let ended: HashMap<(String, String, i32, i32), (String, String)> =
        sqlx::query_as::<_, Attempt>("SELECT run_id::text, node, visit, attempt, holder, reason FROM steps")
            .fetch_all(db)
            .await
            .unwrap()
            .into_iter()
            .map(|(run, node, visit, attempt, holder, reason)| {
                ((RunId(run.parse().unwrap()).to_string(), node, visit, attempt), (holder.unwrap_or_default(), reason.unwrap_or_default()))
            })
            .collect();
    let mut out = Vec::new();
    for ((run, node, visit), attempts) in visits {
        if attempts.len() < 2 {
            continue;
        }
        let first = *attempts.iter().next().unwrap();
        let (holder, reason) = ended.get(&(run.clone(), node.clone(), visit.parse().unwrap_or(0), first)).cloned().unwrap_or_default();
        let fates = fates.get(&holder).map(|f| f.iter().rev().copied().collect()).unwrap_or_default();
        out.push(Reexecution { visit: format!("{run} {node} v{visit} attempts {attempts:?}"), holder, reason, fates });
    }
    out
}

/// The audit, entry by entry: every event names its actor; every step event by an actor other
/// than the engine has its own audit entry (same step, same change; the engine's moves are
/// audited by the journal, which names the engine), and every person's and GitHub's action has
/// one: each acknowledged submit a
/// `run.submit` on its run, each decided approval an `approval.approve`, each run a delivery
/// started a `run.submit` by GitHub. What is missing, as lines.
pub(super) async fn audit_missing(db: &Db, acked: &Acked) -> Vec<String> {
    let mut missing = Vec::new();
    // Step events and step audit entries, paired one to one per (step, kind).
    let unnamed: Vec<(String, i64, String)> = sqlx::query_as("SELECT run_id::text, seq, kind FROM run_events WHERE actor IS NULL").fetch_all(db).await.unwrap();
    missing.extend(unnamed.into_iter().map(|(run, seq, kind)| format!("{run} #{seq} {kind}: the event names no actor")));
    let events: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT step_id::text, kind, count(*) FROM run_events WHERE step_id IS NOT NULL AND kind LIKE 'step.%' AND actor NOT LIKE 'engine:%' GROUP BY 1, 2",
    )
    .fetch_all(db)
    .await
    .unwrap();
    let audits: HashMap<(String, String), i64> =
        sqlx::query_as::<_, (String, String, i64)>("SELECT target_id, action, count(*) FROM audit_log WHERE target_kind = 'step' GROUP BY 1, 2")
            .fetch_all(db)
            .await
            .unwrap()
            .into_iter()
            .map(|(t, a, n)| ((t, a), n))
            .collect();
    for (step, kind, n) in events {
        let step = engine::ids::StepId(step.parse().unwrap()).to_string();
        // The audit names the act, the event what became of the step.
        let action = match kind.as_str() {
            "step.created" => "step.create".to_owned(),
            "step.reused" => "step.reuse".to_owned(),
            other => other.to_owned(),
        };
        let found = audits.get(&(step.clone(), action)).copied().unwrap_or(0);
        if found < n {
            missing.push(format!("{step} {kind}: {n} events, {found} audit entries"));
        }
    }
    // The non-engine actions.
    let entries: Vec<(String, String, String)> =
        sqlx::query_as("SELECT action, target_id, actor_kind FROM audit_log WHERE target_kind = 'run' AND action IN ('run.submit', 'approval.approve')")
            .fetch_all(db)
            .await
            .unwrap();
    let mut by: HashMap<(String, String), Vec<String>> = HashMap::new();
    for (action, target, actor) in entries {
        by.entry((action, target)).or_default().push(actor);
    }
    let one = |action: &str, run: RunId, actor: &str, missing: &mut Vec<String>| match by.get(&(action.to_owned(), run.to_string())).map(Vec::as_slice) {
        Some([a]) if a == actor => {}
        other => missing.push(format!("{run} {action}: expected one entry by {actor}, found {other:?}")),
    };
    for (_, run) in &acked.submits {
        one("run.submit", *run, "user", &mut missing);
    }
    let decided: Vec<RunId> = sqlx::query_scalar("SELECT run_id FROM approvals WHERE decision = 'approved'").fetch_all(db).await.unwrap();
    let acked_approvals: BTreeSet<RunId> = acked.approvals.iter().copied().collect();
    for run in acked_approvals.difference(&decided.iter().copied().collect()) {
        missing.push(format!("{run}: approval acknowledged but not decided"));
    }
    for run in decided {
        one("approval.approve", run, "user", &mut missing);
    }
    let from_github: Vec<RunId> = sqlx::query_scalar("SELECT run_id FROM runs WHERE trigger_event_id IS NOT NULL").fetch_all(db).await.unwrap();
    for run in from_github {
        one("run.submit", run, "github", &mut missing);
    }
    missing
}
