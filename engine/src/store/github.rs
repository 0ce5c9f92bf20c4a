//! GitHub watches: what a waiting gate or `wait: { event }` step watches on GitHub, and the
//! wakes a webhook writes for the steps it may decide.
//!
//! A gate with `checks:` waits on the check runs and statuses of one commit (the head of the
//! pull request it follows); a wait on an event waits for that event on one pull request or
//! issue. Each such step has one row in `github_watches`. The ingest, in the transaction that
//! stores a check result or an item's new state, writes a `github:<event>.<action>` wake for
//! every step watching it, so the engine looks again exactly when something changed: there is
//! no poll. Rows go with their step's resolution.
//!
//! # A check run decides a gate
//!
//! 1. The walker starts `ci: { gate: { checks: [build, test], on_fail: build } }`. The gate is
//!    created `waiting`, watching the head commit of the pull request the run opened (or of its
//!    own pull request item) in `github_watches`, with a `timeout` wake (1 h by default). Results
//!    already stored in `github_checks` may decide it at once.
//! 2. GitHub posts `check_run.completed`. The ingest stores the result by head SHA and, in the
//!    same transaction, writes a `github:checks` wake for every step watching that commit. A push
//!    to the pull request (`pull_request.synchronize`) wakes it too, and the gate follows the new
//!    head.
//! 3. An engine claims the wake and, under the run's lock, reads the gate's checks: all passed →
//!    the gate succeeds; one failed → it fails `gate_failed` and `on_fail` loops back. A gate
//!    visited again after that loop reads only results reported since its previous visit ended.
//!    The timeout fails it with `timeout`.
//! 4. A `wait: { event: pull_request.closed }` after a `pull_request` output is the reconciler:
//!    it watches that pull request, and the `pull_request.closed` webhook resolves it with the
//!    item's `merged` and `state`, on which a decision routes (move the card to Done, or back to
//!    Ready with a comment). A pull request no run opened is watched by no step.

use std::time::Duration;

use super::{Change, Result};
use crate::ids::{OrgId, ProjectId, RunId, StepId};

/// What a step watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watch<'a> {
    pub repository: &'a str,
    pub number: Option<i64>,
    pub head_sha: Option<&'a str>,
    /// `checks`, or an event such as `pull_request.closed`.
    pub watch: &'a str,
}

/// The reason of a wake written by a webhook: `github:` and what happened.
pub const WAKE_PREFIX: &str = "github:";

/// Records what a waiting step of a locked run watches.
pub async fn watch(ch: &mut Change, run: RunId, step: StepId, w: &Watch<'_>) -> Result<()> {
    let ctx = ch.locked(run)?.clone();
    sqlx::query(
        "INSERT INTO github_watches (org_id, project_id, step_id, run_id, repository, number, head_sha, watch) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (step_id) DO UPDATE SET repository = EXCLUDED.repository, number = EXCLUDED.number, \
           head_sha = EXCLUDED.head_sha, watch = EXCLUDED.watch",
    )
    .bind(ctx.org)
    .bind(ctx.project)
    .bind(step)
    .bind(run)
    .bind(w.repository.to_lowercase())
    .bind(w.number)
    .bind(w.head_sha)
    .bind(w.watch)
    .execute(&mut *ch.tx)
    .await?;
    Ok(())
}

/// The watch of a step, if any: (repository, number, head_sha, watch).
pub async fn watch_of(ch: &mut Change, step: StepId) -> Result<Option<(String, Option<i64>, Option<String>, String)>> {
    Ok(sqlx::query_as("SELECT repository, number, head_sha, watch FROM github_watches WHERE step_id = $1").bind(step).fetch_optional(&mut *ch.tx).await?)
}

/// Moves a gate's watch to a new head commit (a push to the pull request's branch).
pub async fn follow_head(ch: &mut Change, step: StepId, head_sha: &str) -> Result<()> {
    sqlx::query("UPDATE github_watches SET head_sha = $2 WHERE step_id = $1").bind(step).bind(head_sha).execute(&mut *ch.tx).await?;
    Ok(())
}

/// A `wait: { event: … }` step began waiting: `run.awaiting` says for what and until when.
pub fn awaiting_event(ch: &mut Change, run: RunId, step: StepId, node: &str, event: &str, due: Duration) -> Result<()> {
    let deadline = chrono::Utc::now() + chrono::Duration::milliseconds(due.as_millis() as i64);
    let attrs = serde_json::json!({ "substate": "awaiting_signal", "waits_on": "github", "event": event, "deadline": deadline });
    ch.event(run, "run.awaiting", Some((step, node)), attrs)?;
    Ok(())
}

/// An event wait's deadline passed (its step already resolved `timed_out`): its watch goes,
/// and `run.wait_expired` says so.
pub async fn event_wait_expired(ch: &mut Change, run: RunId, step: StepId, node: &str) -> Result<()> {
    forget(ch, step).await?;
    ch.event(run, "run.wait_expired", Some((step, node)), serde_json::json!({ "waits_on": "github" }))?;
    Ok(())
}

/// A run that ends withdraws the event waits it still had open (the wait steps it cancelled in
/// this change that announced themselves with `run.awaiting`): each writes
/// `run.wait_withdrawn`; every watch of the run goes.
pub(super) async fn withdraw_waits(ch: &mut Change, run: RunId) -> Result<()> {
    let withdrawn: Vec<(StepId, String)> = sqlx::query_as(
        "WITH gone AS (DELETE FROM github_watches WHERE run_id = $1) \
         SELECT s.step_id, s.node FROM steps s WHERE s.run_id = $1 AND s.kind = 'wait' AND s.state = 'cancelled' AND s.ended_at = now() \
           AND EXISTS (SELECT 1 FROM run_events e WHERE e.run_id = s.run_id AND e.step_id = s.step_id AND e.kind = 'run.awaiting') \
         ORDER BY s.started_seq",
    )
    .bind(run)
    .fetch_all(&mut *ch.tx)
    .await?;
    for (step, node) in withdrawn {
        ch.event(run, "run.wait_withdrawn", Some((step, &node)), serde_json::json!({ "waits_on": "github" }))?;
    }
    Ok(())
}

/// Forgets a step's watch (it was resolved).
pub async fn forget(ch: &mut Change, step: StepId) -> Result<()> {
    sqlx::query("DELETE FROM github_watches WHERE step_id = $1").bind(step).execute(&mut *ch.tx).await?;
    Ok(())
}

/// A check run or status was stored for `sha`: wakes the gates watching that commit. Returns
/// how many steps were woken.
pub async fn wake_checks(ch: &mut Change, org: OrgId, project: ProjectId, repository: &str, sha: &str) -> Result<u64> {
    let watching = "head_sha = $4 AND watch = 'checks'";
    wake_watching(ch, watching, org, project, repository, sha.to_owned(), "checks").await
}

/// Writes a `github:<what>` wake, due now, for each step of the repository's watches that
/// `watching` (a condition on `$4`, `key`) picks.
async fn wake_watching<K>(ch: &mut Change, watching: &str, org: OrgId, project: ProjectId, repository: &str, key: K, what: &str) -> Result<u64>
where
    K: 'static + Send + for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    let sql = format!(
        "INSERT INTO wakes (org_id, run_id, step_id, due_at, reason) \
         SELECT org_id, run_id, step_id, now(), $5 FROM github_watches \
         WHERE project_id = $2 AND repository = $3 AND {watching} AND org_id = $1"
    );
    let woken = sqlx::query(&sql)
        .bind(org)
        .bind(project)
        .bind(repository.to_lowercase())
        .bind(key)
        .bind(crate::store::cap(&format!("{WAKE_PREFIX}{what}")))
        .execute(&mut *ch.tx)
        .await?
        .rows_affected();
    if woken > 0 {
        ch.note_wake(Duration::ZERO);
    }
    Ok(woken)
}

const SET_DEFAULT_BRANCH: &str = "UPDATE repositories SET default_branch = $4 WHERE org_id = $1 AND project_id = $2 AND full_name = $3";

/// Sets the branch pull requests of a connected repository are opened against.
pub async fn set_default_branch(ch: &mut Change, org: OrgId, project: ProjectId, repository: &str, branch: &str) -> Result<()> {
    sqlx::query(SET_DEFAULT_BRANCH).bind(org).bind(project).bind(repository.to_lowercase()).bind(branch).execute(&mut *ch.tx).await?;
    Ok(())
}
