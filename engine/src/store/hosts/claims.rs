//! Claiming ready crew steps for a host (one `Change`, the host's row locked, runs locked
//! `FOR UPDATE SKIP LOCKED`, each step leased), what a host needs to run one (its
//! assignment: the prompt rendered over the run's context, the repository, the caps), and
//! starting a leased step.

use std::collections::HashSet;
use std::time::Duration;

use crate::db::Db;
use protocol::{Caps, Item};
use serde_json::Value;
use sqlx::FromRow;

use crate::catalog::Catalog;
use crate::definition::{self, NodeKind, OutputKind};
use crate::hosts::{self as model, Assignment, RepositoryRef};
use crate::ids::{OrgId, RunId, StepId};
use crate::store::steps::{self, Failure, FailureClass, LEASE, StepRow};
use crate::store::{Actor, Change, Result, StoreError, budgets, cap, runs};

use super::{HostRow, holder, run_of};

/// What a claim took.
#[derive(Debug, Default)]
pub struct Claimed {
    pub assignments: Vec<Assignment>,
    /// A ready step was passed over because an engine held its run at that moment: look again
    /// shortly rather than wait for the next notification.
    pub contended: bool,
    /// Slots the host had free.
    pub room: u32,
}

/// A host's held steps ($1 its holder string), against its slots.
pub const HELD_SQL: &str = "SELECT count(*) FROM steps WHERE holder = $1 AND state IN ('leased', 'running')";

/// Ready crew steps a host may take ($1 org, $2 project, $3 its capabilities, $4 how many),
/// oldest first.
pub const CANDIDATES_SQL: &str = "SELECT s.step_id, s.run_id FROM steps s JOIN runs r ON r.run_id = s.run_id \
     WHERE s.org_id = $1 AND s.state = 'pending' AND s.kind = 'crew' AND s.requires <@ $3::text[] \
       AND (s.not_before IS NULL OR s.not_before <= now()) \
       AND r.project_id = $2 AND r.status = 'running' AND NOT r.dry_run \
     ORDER BY s.created_at, s.step_id LIMIT $4";

/// Leases up to `want` ready crew steps (within the host's free slots) to `host`.
pub async fn claim(pool: &Db, catalog: &Catalog, host: &HostRow, want: u32) -> Result<Claimed> {
    let mut ch = Change::begin(pool, Actor::Host(host.host_id)).await?;
    // One claim of a host at a time: its slots are counted under its row lock.
    let fresh: Option<(Vec<String>, i32, bool)> = sqlx::query_as(
        "SELECT capabilities, max_concurrent, drained_at IS NOT NULL FROM hosts WHERE host_id = $1 AND org_id = $2 AND deregistered_at IS NULL FOR UPDATE",
    )
    .bind(host.host_id)
    .bind(host.org_id)
    .fetch_optional(&mut *ch.tx)
    .await?;
    let (capabilities, max, drained) = fresh.ok_or(StoreError::NotFound("host"))?;
    // A drained host takes nothing new; the steps it holds run on.
    let max = if drained { 0 } else { max };
    let me = holder(host.host_id);
    let held: i64 = sqlx::query_scalar(HELD_SQL).bind(&me).fetch_one(&mut *ch.tx).await?;
    let room = (i64::from(max) - held).clamp(0, i64::from(want));
    let mut claimed = Claimed { room: room as u32, ..Claimed::default() };
    if room == 0 {
        return Ok(claimed);
    }
    // A few more than there is room for, so that steps of runs an engine holds have stand-ins.
    let candidates: Vec<(StepId, RunId)> =
        sqlx::query_as(CANDIDATES_SQL).bind(host.org_id).bind(host.project_id).bind(&capabilities).bind(room * 4).fetch_all(&mut *ch.tx).await?;
    if candidates.is_empty() {
        return Ok(claimed);
    }
    let mut wanted: Vec<RunId> = candidates.iter().map(|c| c.1).collect();
    wanted.sort();
    wanted.dedup();
    let locked: HashSet<RunId> = ch.try_lock_runs(&wanted).await?.into_iter().map(|c| c.run).collect();
    claimed.contended = wanted.iter().any(|r| !locked.contains(r));
    for (step, run) in candidates {
        if claimed.assignments.len() as i64 >= room {
            break;
        }
        if !locked.contains(&run) {
            continue;
        }
        let row = match steps::lease(&mut ch, run, step, &me).await {
            Ok(row) => row,
            // Leased by another claim, or cancelled, since the candidates were read.
            Err(StoreError::Stale(_)) => continue,
            Err(e) => return Err(e),
        };
        match assignment(&mut ch, catalog, run, &row).await? {
            Ok(a) => claimed.assignments.push(a),
            Err(problem) => {
                // A prompt that cannot be rendered will not render on another host either.
                let failure = Failure::new(cap(&problem), FailureClass::Final);
                steps::fail_held(&mut ch, run, step, &me, &failure, None).await?;
                ch.wake(run, None, Duration::ZERO, "advance", true).await?;
            }
        }
    }
    sqlx::query("UPDATE hosts SET last_seen_at = now() WHERE host_id = $1").bind(host.host_id).execute(&mut *ch.tx).await?;
    ch.commit().await?;
    Ok(claimed)
}

/// What a host needs to run a leased crew step; `Err` with a reason when the step cannot run
/// anywhere (its node is gone from the definition, its prompt does not render).
pub(crate) async fn assignment(ch: &mut Change, catalog: &Catalog, run_id: RunId, step: &StepRow) -> Result<std::result::Result<Assignment, String>> {
    let run = runs::get(ch, run_id).await?.ok_or(StoreError::NotFound("run"))?;
    let def = catalog.get(ch.conn(), run.workflow_id, run.workflow_version).await?;
    let Some(node) = def.node(&step.node) else { return Ok(Err(format!("node `{}` is not in the workflow", step.node))) };
    let NodeKind::Crew(crew) = &node.kind else { return Ok(Err(format!("node `{}` is not a crew node", step.node))) };
    // An operator's edit-and-retry replaces the node's prompt, model or harness in this run.
    let edit = match run.source_run_id {
        Some(_) => crate::store::operator::node_override(ch, run_id, &step.node).await?.unwrap_or_default(),
        None => crate::store::operator::NodeOverride::default(),
    };
    let history = steps::of_run(ch, run_id).await?;
    let ctx = crate::run_context::context(ch, &run, &history).await?;
    let prompt = match definition::template::render(edit.prompt.as_deref().unwrap_or(&crew.prompt), &ctx) {
        Ok(p) => p,
        Err(e) => return Ok(Err(format!("prompt_error: {e}"))),
    };
    // The item says which issue; a run about no item may name it in its input.
    let item = &ctx["item"];
    let input = &run.input;
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let number = item.get("number").and_then(Value::as_i64).or_else(|| input.get("issue").and_then(Value::as_i64));
    let title = text(item, "title").or_else(|| text(input, "title"));
    let repository = run_repository(ch.conn(), run.org_id, run_id).await?.map(|r| RepositoryRef {
        clone_url: format!("https://github.com/{}.git", r.full_name),
        full_name: r.full_name,
        default_branch: r.default_branch,
        // Minted by the API after this claim commits (no transaction waits on GitHub).
        token: None,
    });
    let branch = repository.as_ref().map(|_| model::branch_name(number, title.as_deref(), run_id));
    let pr_body = feeds_pull_request(&def, &node.id);
    // The session may spend what is left of the run's, the project's and the org's budgets,
    // and no more than the node's own cap.
    let per_run = def.budget.usd_per_run.filter(|_| def.budget.hard);
    let left = budgets::remaining(ch.conn(), run.org_id, run.project_id, run_id, per_run).await?;
    if left.is_some_and(|l| l <= 0.0) {
        return Ok(Err(budgets::HARD_STOP.to_owned()));
    }
    let usd = match (crew.caps.usd, left) {
        (Some(cap), Some(left)) => Some(cap.min(left)),
        (cap, left) => cap.or(left),
    }
    // Down to a millionth: the harness must not be told a cent more than is left.
    .map(|usd| (usd * 1_000_000.0).floor() / 1_000_000.0);
    Ok(Ok(Assignment {
        step: step.step_id,
        run: run_id,
        node: step.node.clone(),
        visit: step.visit,
        attempt: step.attempt,
        harness: edit.harness.unwrap_or_else(|| crew.harness.name().to_owned()),
        model: edit.model.or_else(|| crew.model.clone()),
        prompt,
        command: crew.command.clone(),
        caps: Caps { turns: crew.caps.turns, usd, timeout_secs: crate::definition::timeouts::step_timeout(node).as_secs().max(1) },
        repository,
        branch,
        item: (number.is_some() || title.is_some()).then_some(Item { number, title }),
        pr_body,
        expect_changes: crew.expect_changes.unwrap_or(pr_body),
        policy: crew.policy.clone(),
        lease_secs: LEASE.as_secs(),
        traceparent: run.traceparent.clone(),
    }))
}

/// The connected repository a run's crew steps work in.
#[derive(Debug, Clone, FromRow)]
pub struct RunRepository {
    /// `owner/name`, lowercased.
    pub full_name: String,
    pub default_branch: String,
    pub installation_id: Option<i64>,
}

/// The repository a run works in: its item's, or (a run about no item, a person's submit) the
/// one its input names; only one connected to the run's project, never any other. Both the
/// claim's assignment and a host's token refresh ask this.
pub async fn run_repository(conn: &mut sqlx::PgConnection, org: OrgId, run: RunId) -> Result<Option<RunRepository>> {
    Ok(sqlx::query_as(
        "SELECT repo.full_name, repo.default_branch, repo.installation_id FROM runs r \
         LEFT JOIN items i ON i.item_id = r.item_id AND i.org_id = r.org_id \
         JOIN repositories repo ON repo.org_id = r.org_id AND repo.project_id = r.project_id \
              AND repo.full_name = lower(coalesce(i.data->>'repository', r.input->>'repository')) \
         WHERE r.run_id = $1 AND r.org_id = $2",
    )
    .bind(run)
    .bind(org)
    .fetch_optional(conn)
    .await?)
}

/// Whether a pull request is opened from this crew node's work: a `pull_request` output is
/// reachable from it without passing another crew node (whose work would come later and be the
/// one described).
pub(crate) fn feeds_pull_request(def: &definition::Definition, node: &str) -> bool {
    let mut seen = HashSet::new();
    let mut todo: Vec<&str> = def.successors(node);
    while let Some(n) = todo.pop() {
        if !seen.insert(n) {
            continue;
        }
        match def.node(n).map(|n| &n.kind) {
            Some(NodeKind::Output(o)) if o.kind == OutputKind::PullRequest => return true,
            Some(NodeKind::Crew(_)) | None => {}
            Some(_) => todo.extend(def.successors(n)),
        }
    }
    false
}

/// The host starts the harness on a step it leased: `leased → running`, fenced by holder. A
/// host that runs it without walls (`unwalled`) leaves a `step.unwalled` event naming itself.
pub async fn start(pool: &Db, host: &HostRow, step: StepId, harness: &str, unwalled: bool) -> Result<StepRow> {
    let run = run_of(pool, host, step).await?;
    let mut ch = Change::begin(pool, Actor::Host(host.host_id)).await?;
    ch.lock_run(host.org_id, run).await?.ok_or(StoreError::NotFound("run"))?;
    let row = steps::start(&mut ch, run, step, &holder(host.host_id)).await?;
    sqlx::query(
        "INSERT INTO step_sessions (org_id, run_id, step_id, host_id, harness) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (step_id) DO NOTHING",
    )
    .bind(host.org_id)
    .bind(run)
    .bind(step)
    .bind(host.host_id)
    .bind(harness)
    .execute(&mut *ch.tx)
    .await?;
    if unwalled {
        ch.event(run, "step.unwalled", Some((step, &row.node)), serde_json::json!({ "host": host.name }))?;
    }
    ch.commit().await?;
    Ok(row)
}
