//! Reading what `why` needs for any number of runs in at most three indexed queries: the
//! runs with their place in line, their open steps, and the hosts that could take them.

use std::collections::HashMap;
use std::sync::LazyLock;

use crate::db::Db;
use chrono::{DateTime, Utc};
use sqlx::FromRow;

use crate::catalog::Catalog;
use crate::definition::{Definition, NodeKind, Wait};
use crate::ids::{OrgId, ProjectId, RunId, StepId, WorkflowId};
use crate::state::{RunStatus, StepState};
use crate::store::{Result, StoreError};

use super::why::{Why, answer};
use super::*;

/// Definitions read by `why`, cached for the process (versions are immutable).
pub(crate) static CATALOG: LazyLock<Catalog> = LazyLock::new(Catalog::default);

/// What holds one run of `org`, in words. A run of another org is not found.
pub async fn why(pool: &Db, org: OrgId, run: RunId) -> Result<Why> {
    whys(pool, org, &[run]).await?.pop().ok_or(StoreError::NotFound("run"))
}

/// [`why`] for many runs at once (a list page), with the same three queries at most. Runs not
/// found in `org` are left out; the others come in the order asked.
pub async fn whys(pool: &Db, org: OrgId, runs: &[RunId]) -> Result<Vec<Why>> {
    let (facts, now) = load(pool, org, runs).await?;
    Ok(facts.iter().map(|f| answer(f, now)).collect())
}

/// The runs asked about ($1 org, $2 run ids), with the database's clock.
pub(crate) const RUNS_SQL: &str = "SELECT r.run_id, r.project_id, r.workflow_id, r.workflow_version, r.status, r.reason, \
            w.name AS workflow_name, w.paused, p.paused AS project_paused, r.admitted_at IS NOT NULL AS admitted, \
            EXISTS (SELECT 1 FROM steps s WHERE s.run_id = r.run_id) AS started, r.needs_approval AND NOT r.dry_run AS awaits_start, now() AS now, \
            aw.hold, aw.detail AS hold_detail, aw.queue AS hold_queue, \
            (SELECT count(*) FROM admission_waits a WHERE a.org_id = aw.org_id AND a.queue = aw.queue AND a.seq < aw.seq) AS ahead, \
            CASE WHEN aw.hold = 'throttle' THEN \
                (SELECT min(s.at) + q.window_ms * interval '1 millisecond' FROM admission_starts s \
                  WHERE s.org_id = aw.org_id AND s.queue = aw.queue AND s.at > now() - q.window_ms * interval '1 millisecond') END AS hold_until \
     FROM runs r JOIN workflows w ON w.workflow_id = r.workflow_id JOIN projects p ON p.project_id = r.project_id \
     LEFT JOIN admission_waits aw ON aw.run_id = r.run_id \
     LEFT JOIN admission_queues q ON q.org_id = aw.org_id AND q.queue = aw.queue \
     WHERE r.org_id = $1 AND r.run_id = ANY($2)";

/// Their open, failed and `end` steps ($1 org, $2 run ids), with what each waits on and who
/// holds it. Failed steps name a backoff's cause and where a failed run failed.
pub(crate) const STEPS_SQL: &str = "SELECT s.run_id, s.step_id, s.node, s.kind, s.visit, s.attempt, s.state, s.reason, s.exit_code, \
            s.requires, s.holder, h.name AS host_name, s.not_before, \
            (SELECT min(k.due_at) FROM wakes k WHERE k.step_id = s.step_id) AS wake_at, \
            a.prompt, a.deadline, c.run_id AS child_run, s.finished_seq \
     FROM steps s \
     LEFT JOIN approvals a ON a.step_id = s.step_id \
     LEFT JOIN runs c ON c.parent_run_id = s.run_id AND c.parent_step_id = s.step_id \
     LEFT JOIN hosts h ON h.org_id = s.org_id \
          AND h.host_id = CASE WHEN s.holder ~ '^host:[0-9a-f-]{36}$' THEN substr(s.holder, 6)::uuid END \
     WHERE s.org_id = $1 AND s.run_id = ANY($2) \
       AND (s.state IN ('pending', 'leased', 'running', 'waiting', 'failed') OR s.kind = 'end') \
     ORDER BY s.run_id, s.started_seq";

/// The capabilities of the available hosts of some projects ($1 org, $2 project ids, $3 hours).
pub(crate) const HOSTS_SQL: &str = "SELECT project_id, capabilities FROM hosts \
     WHERE org_id = $1 AND project_id = ANY($2) AND deregistered_at IS NULL \
       AND last_seen_at > now() - make_interval(hours => $3::int)";

/// The statements `why` runs, by name, so that a test can `EXPLAIN` them: each takes the org
/// as `$1` and an array of ids as `$2` (`hosts` also the hours as `$3`).
pub const QUERIES: [(&str, &str); 3] = [("runs", RUNS_SQL), ("steps", STEPS_SQL), ("hosts", HOSTS_SQL)];

#[derive(FromRow)]
pub(crate) struct RunLine {
    pub run_id: RunId,
    pub project_id: ProjectId,
    pub workflow_id: WorkflowId,
    pub workflow_version: i32,
    pub status: String,
    pub reason: Option<String>,
    pub workflow_name: String,
    pub paused: bool,
    pub project_paused: bool,
    pub admitted: bool,
    pub started: bool,
    pub awaits_start: bool,
    pub now: DateTime<Utc>,
    pub hold: Option<String>,
    pub hold_detail: Option<String>,
    pub hold_queue: Option<String>,
    pub ahead: Option<i64>,
    pub hold_until: Option<DateTime<Utc>>,
}

#[derive(FromRow)]
pub(crate) struct StepLine {
    pub run_id: RunId,
    pub step_id: StepId,
    pub node: String,
    pub kind: String,
    pub visit: i32,
    pub attempt: i32,
    pub state: String,
    pub reason: Option<String>,
    pub exit_code: Option<i32>,
    pub requires: Vec<String>,
    pub holder: Option<String>,
    pub host_name: Option<String>,
    pub not_before: Option<DateTime<Utc>>,
    pub wake_at: Option<DateTime<Utc>>,
    pub prompt: Option<String>,
    pub deadline: Option<DateTime<Utc>>,
    pub child_run: Option<RunId>,
    pub finished_seq: Option<i64>,
}

/// The runs, in the order asked; their open, failed and `end` steps with approvals, wakes,
/// children and holders' names; then the hosts of their projects when a host step is ready.
/// Each query is served by an index (`runs` key, `steps_by_run`, `approvals` key,
/// `wakes_by_step`, `runs_by_parent`, `hosts` key, `hosts_by_project`).
pub(crate) async fn load(pool: &Db, org: OrgId, runs: &[RunId]) -> Result<(Vec<RunFacts>, DateTime<Utc>)> {
    let ids: Vec<uuid::Uuid> = runs.iter().map(|r| r.0).collect();
    let lines: Vec<RunLine> = sqlx::query_as(RUNS_SQL).bind(org).bind(&ids).fetch_all(pool).await?;
    let Some(now) = lines.first().map(|l| l.now) else { return Ok((Vec::new(), Utc::now())) };
    let steps = load_steps(pool, org, &ids).await?;
    let mut by_run: HashMap<RunId, Vec<StepLine>> = HashMap::new();
    for s in steps {
        by_run.entry(s.run_id).or_default().push(s);
    }
    let projects = projects_needing_hosts(&lines, &by_run, now);
    let hosts = load_hosts(pool, org, &projects).await?;

    let mut facts = Vec::with_capacity(lines.len());
    for line in &lines {
        let steps = by_run.remove(&line.run_id).unwrap_or_default();
        let def = definition_if_needed(pool, line, &steps).await;
        facts.push(run_facts(line, steps, def.as_deref(), hosts.get(&line.project_id).cloned().unwrap_or_default()));
    }
    let order: HashMap<RunId, usize> = runs.iter().enumerate().map(|(i, r)| (*r, i)).collect();
    facts.sort_by_key(|f| order.get(&f.run).copied().unwrap_or(usize::MAX));
    Ok((facts, now))
}

pub(crate) async fn load_steps(pool: &Db, org: OrgId, ids: &[uuid::Uuid]) -> Result<Vec<StepLine>> {
    Ok(sqlx::query_as(STEPS_SQL).bind(org).bind(ids).fetch_all(pool).await?)
}

/// Projects of running runs that have a host step ready now: only they need the hosts query.
pub(crate) fn projects_needing_hosts(lines: &[RunLine], steps: &HashMap<RunId, Vec<StepLine>>, now: DateTime<Utc>) -> Vec<uuid::Uuid> {
    let mut out: Vec<uuid::Uuid> = lines
        .iter()
        .filter(|l| l.status == "running")
        .filter(|l| {
            steps
                .get(&l.run_id)
                .is_some_and(|ss| ss.iter().any(|s| s.state == "pending" && HOST_KINDS.contains(&s.kind.as_str()) && s.not_before.is_none_or(|t| t <= now)))
        })
        .map(|l| l.project_id.0)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

pub(crate) async fn load_hosts(pool: &Db, org: OrgId, projects: &[uuid::Uuid]) -> Result<HashMap<ProjectId, Vec<Vec<String>>>> {
    let mut out: HashMap<ProjectId, Vec<Vec<String>>> = HashMap::new();
    if projects.is_empty() {
        return Ok(out);
    }
    let rows: Vec<(ProjectId, Vec<String>)> = sqlx::query_as(HOSTS_SQL).bind(org).bind(projects).bind(HOST_SEEN_WITHIN_HOURS as i32).fetch_all(pool).await?;
    for (project, caps) in rows {
        out.entry(project).or_default().push(caps);
    }
    Ok(out)
}

/// The run's definition, read only when an open wait step must be told apart (a timer or an
/// event); a definition that cannot be read leaves the wait a timer, which is the common case.
pub(crate) async fn definition_if_needed(pool: &Db, line: &RunLine, steps: &[StepLine]) -> Option<std::sync::Arc<Definition>> {
    if !steps.iter().any(|s| s.kind == "wait" && s.state == "waiting") {
        return None;
    }
    let mut conn = pool.begin().await.ok()?;
    CATALOG.get(&mut conn, line.workflow_id, line.workflow_version).await.ok()
}

pub(crate) fn run_facts(line: &RunLine, steps: Vec<StepLine>, def: Option<&Definition>, hosts: Vec<Vec<String>>) -> RunFacts {
    RunFacts {
        run: line.run_id,
        status: RunStatus::parse(&line.status).unwrap_or(RunStatus::Failed),
        reason: line.reason.clone(),
        hold: hold_of(line),
        started: line.started,
        awaits_start: line.awaits_start,
        steps: steps.into_iter().map(|s| step_facts(s, def)).collect(),
        hosts,
    }
}

/// What admission holds the run by: its place in line, or, for a run the engine has not
/// looked at yet, the pause admission will hold it by. A pause holds only runs that have not
/// started: the ones already going carry on.
pub(crate) fn hold_of(line: &RunLine) -> Option<Hold> {
    let ahead = line.ahead.unwrap_or(0);
    match line.hold.as_deref() {
        Some("paused") if line.hold_queue.as_deref().is_some_and(|q| q.starts_with("paused:project:")) => Some(Hold::ProjectPaused),
        Some("paused") => Some(Hold::Paused { workflow: line.workflow_name.clone() }),
        Some("budget") => Some(Hold::Budget { scope: line.hold_detail.clone().unwrap_or_default() }),
        Some("lease") => Some(Hold::Lease { group: line.hold_detail.clone().unwrap_or_default(), ahead }),
        Some("board") => Some(Hold::Board { column: line.hold_detail.clone().unwrap_or_default(), ahead }),
        Some("org_cap") => Some(Hold::OrgCap { cap: line.hold_detail.as_deref().and_then(|c| c.parse().ok()).unwrap_or(0), ahead }),
        Some(_) => Some(Hold::Throttle { until: line.hold_until.unwrap_or(line.now), ahead }),
        None if line.admitted || line.started => None,
        None if line.project_paused => Some(Hold::ProjectPaused),
        None if line.paused => Some(Hold::Paused { workflow: line.workflow_name.clone() }),
        None => None,
    }
}

pub(crate) fn step_facts(s: StepLine, def: Option<&Definition>) -> StepFacts {
    let event = def.and_then(|d| d.node(&s.node)).and_then(|n| match &n.kind {
        NodeKind::Wait(Wait::Event(e)) => Some(e.clone()),
        _ => None,
    });
    StepFacts {
        step: s.step_id,
        holder: holder_words(s.holder.as_deref(), s.host_name.as_deref()),
        node: s.node,
        kind: s.kind,
        visit: s.visit,
        attempt: s.attempt,
        state: StepState::parse(&s.state).unwrap_or(StepState::Failed),
        reason: s.reason,
        exit_code: s.exit_code,
        requires: s.requires,
        not_before: s.not_before,
        wake_at: s.wake_at,
        prompt: s.prompt,
        deadline: s.deadline,
        event,
        child: s.child_run,
        finished_seq: s.finished_seq,
    }
}

/// `engine:e1` → `engine e1`; `host:<id>` → `host <name>` when the host is known.
pub(crate) fn holder_words(holder: Option<&str>, host_name: Option<&str>) -> Option<String> {
    let holder = holder?;
    Some(match (holder.split_once(':'), host_name) {
        (Some(("host", _)), Some(name)) => format!("host {name}"),
        (Some((kind, id)), _) => format!("{kind} {id}"),
        (None, _) => holder.to_owned(),
    })
}
