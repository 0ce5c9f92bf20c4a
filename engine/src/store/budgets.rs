//! Budgets and spend: what sessions cost, summed per org and project per UTC day (a month is
//! its days), against the limits that hold new runs and stop crew steps.
//!
//! A project or org limit (`budgets`, per `day` or `month`) that spend has reached holds new
//! runs at admission (the `budget` gate), hard or soft alike; a hard one also fails every crew
//! step that would start, with `budget_hard_stop` (a final failure, never retried), and is
//! what a host's heartbeat checks to stop a running session ([`hard_stop`]). A workflow's
//! `budget.usd_per_run` with `hard: true` stops the crew steps of a run that spent it. Raising
//! or removing a limit releases the runs it held; a new day or month releases them by the wake
//! each held run has at the period's end.

use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use serde::Serialize;
use serde_json::json;

use super::{Change, Result, StoreError, admission};
use crate::admission as rules;
use crate::ids::{OrgId, ProjectId, RunId};

/// The reason of a crew step stopped by a hard limit (a documented failure reason).
pub const HARD_STOP: &str = "budget_hard_stop";

/// Today and the current month, in UTC, as SQL over `now()`.
const TODAY: &str = "(now() AT TIME ZONE 'UTC')::date";
const MONTH_START: &str = "date_trunc('month', now() AT TIME ZONE 'UTC')::date";

/// Records cost and tokens a session spent against today's spend of the project (and so of
/// the org). The hosts' session reports call this (or [`record_run_spend`] when the run is
/// known); `usd` is what this report adds, not a running total. It is negative when a
/// harness's reported cost corrects an estimate that was higher (a correction after midnight
/// UTC lowers the new day's, which is never read below zero).
///
/// A project's day is a few rows (slots) summed when read: this takes one no other
/// transaction holds, or adds one, so that concurrent reports of a project never wait on each
/// other's lock.
pub async fn record_spend(ch: &mut Change, org: OrgId, project: ProjectId, usd: f64, tokens: i64) -> Result<()> {
    if !usd.is_finite() || tokens < 0 {
        return Err(StoreError::Invalid("spend must be a finite amount and tokens not negative".into()));
    }
    if usd == 0.0 && tokens == 0 {
        return Ok(());
    }
    // One statement: the update of a free slot, or when every slot of the day is held (or
    // there is none yet) a new one, numbered at random so that two writers adding one at once
    // do not meet.
    sqlx::query(&format!(
        "WITH free AS (SELECT slot FROM spend WHERE org_id = $1 AND project_id = $2 AND day = {TODAY} LIMIT 1 FOR UPDATE SKIP LOCKED), \
         added AS (UPDATE spend s SET usd = s.usd + $3::numeric, tokens = s.tokens + $4 FROM free \
                   WHERE s.org_id = $1 AND s.project_id = $2 AND s.day = {TODAY} AND s.slot = free.slot RETURNING 1) \
         INSERT INTO spend (org_id, project_id, day, slot, usd, tokens) \
         SELECT $1, $2, {TODAY}, (random() * 2147483646)::int, $3::numeric, $4 WHERE NOT EXISTS (SELECT 1 FROM added) \
         ON CONFLICT (org_id, project_id, day, slot) DO UPDATE SET usd = spend.usd + EXCLUDED.usd, tokens = spend.tokens + EXCLUDED.tokens"
    ))
    .bind(org)
    .bind(project)
    .bind(usd)
    .bind(tokens)
    .execute(&mut *ch.tx)
    .await?;
    if usd > 0.0 {
        ch.tally.spend(usd);
    }
    Ok(())
}

const ADD_RUN_SPEND: &str = "UPDATE runs SET spent_usd = greatest(spent_usd + $2::numeric, 0), spent_tokens = spent_tokens + $3 WHERE run_id = $1";

/// Records a session's cost against its run's total (for `budget.usd_per_run`) and the
/// project's day; a negative `usd` (a correction) lowers both, never below zero. The run must
/// be locked in this change.
pub async fn record_run_spend(ch: &mut Change, run: RunId, usd: f64, tokens: i64) -> Result<()> {
    let ctx = ch.locked(run)?.clone();
    record_spend(ch, ctx.org, ctx.project, usd, tokens).await?;
    sqlx::query(ADD_RUN_SPEND).bind(run).bind(usd).bind(tokens).execute(&mut *ch.tx).await?;
    ch.forget_run_row(run);
    Ok(())
}

/// A limit that spend has reached.
#[derive(Debug, Clone)]
pub(crate) struct Spent {
    /// In words: `the project's daily budget of $10.00`.
    pub scope: String,
    /// Until its period ends (a new UTC day or month).
    pub until: Duration,
}

#[derive(sqlx::FromRow)]
struct Limit {
    project_id: Option<ProjectId>,
    period: String,
    usd_limit: f64,
    hard: bool,
}

#[derive(sqlx::FromRow)]
struct Sums {
    org_day: f64,
    org_month: f64,
    project_day: f64,
    project_month: f64,
    to_tomorrow_ms: f64,
    to_next_month_ms: f64,
}

/// The first limit of the org or the project whose spend has reached it, if any. The limits'
/// rows are locked FOR SHARE, so a change that raises one is ordered with this admission.
pub(crate) async fn holding(ch: &mut Change, org: OrgId, project: ProjectId) -> Result<Option<Spent>> {
    let limits: Vec<Limit> = sqlx::query_as(
        "SELECT project_id, period, usd_limit::float8 AS usd_limit, hard FROM budgets \
         WHERE org_id = $1 AND (project_id IS NULL OR project_id = $2) ORDER BY project_id NULLS LAST, period FOR SHARE",
    )
    .bind(org)
    .bind(project)
    .fetch_all(&mut *ch.tx)
    .await?;
    if limits.is_empty() {
        return Ok(None);
    }
    let sums = sums(ch.conn(), org, project).await?;
    for l in limits {
        let spent = match (l.project_id.is_some(), l.period.as_str()) {
            (true, "day") => sums.project_day,
            (true, _) => sums.project_month,
            (false, "day") => sums.org_day,
            (false, _) => sums.org_month,
        };
        if spent >= l.usd_limit {
            let until = if l.period == "day" { sums.to_tomorrow_ms } else { sums.to_next_month_ms };
            return Ok(Some(Spent {
                scope: words(l.project_id.is_some(), &l.period, l.usd_limit, l.hard),
                until: Duration::from_millis(until.max(0.0) as u64),
            }));
        }
    }
    Ok(None)
}

fn words(project: bool, period: &str, limit: f64, hard: bool) -> String {
    let whose = if project { "project" } else { "org" };
    let period = if period == "day" { "daily" } else { "monthly" };
    let kind = if hard { "hard" } else { "soft" };
    format!("the {whose}'s {period} budget of ${limit:.2} ({kind})")
}

async fn sums(conn: &mut sqlx::PgConnection, org: OrgId, project: ProjectId) -> Result<Sums> {
    Ok(sqlx::query_as(&format!(
        "SELECT greatest(coalesce(sum(usd) FILTER (WHERE day = {TODAY}), 0), 0)::float8 AS org_day, \
                greatest(coalesce(sum(usd), 0), 0)::float8 AS org_month, \
                greatest(coalesce(sum(usd) FILTER (WHERE day = {TODAY} AND project_id = $2), 0), 0)::float8 AS project_day, \
                greatest(coalesce(sum(usd) FILTER (WHERE project_id = $2), 0), 0)::float8 AS project_month, \
                ceil(extract(epoch FROM ({TODAY} + 1)::timestamp AT TIME ZONE 'UTC' - now()) * 1000)::float8 AS to_tomorrow_ms, \
                ceil(extract(epoch FROM ({MONTH_START} + interval '1 month') AT TIME ZONE 'UTC' - now()) * 1000)::float8 AS to_next_month_ms \
         FROM spend WHERE org_id = $1 AND day >= {MONTH_START}"
    ))
    .bind(org)
    .bind(project)
    .fetch_one(conn)
    .await?)
}

/// Whether a hard limit stops the crew steps of `run`: its own `usd_per_run` (when the
/// workflow's budget is hard), or a hard limit of its project or org that spend has reached.
/// The engine asks before it starts a crew step; a host's heartbeat may ask the same to stop
/// a running one.
pub async fn hard_stop(conn: &mut sqlx::PgConnection, org: OrgId, project: ProjectId, run: RunId, usd_per_run: Option<f64>) -> Result<bool> {
    Ok(remaining(conn, org, project, run, usd_per_run).await?.is_some_and(|left| left <= 0.0))
}

/// What `run` may still spend before a hard limit stops it: the least of what is left of its
/// own `usd_per_run` (when the workflow's budget is hard) and of each hard limit of its project
/// and org in the current day or month, never below zero; `None` when no hard limit applies.
/// A host passes it to the harness (`--max-budget-usd`), so the harness stops itself where the
/// server would. Soft limits only hold new runs, so they are not counted.
pub async fn remaining(conn: &mut sqlx::PgConnection, org: OrgId, project: ProjectId, run: RunId, usd_per_run: Option<f64>) -> Result<Option<f64>> {
    let left: Option<f64> = sqlx::query_scalar(&format!(
        "SELECT CASE WHEN l IS NOT NULL THEN greatest(l, 0)::float8 END FROM (SELECT least( \
             (SELECT $4::numeric - spent_usd FROM runs WHERE run_id = $3), \
             (SELECT min(b.usd_limit - (SELECT greatest(coalesce(sum(s.usd), 0), 0) FROM spend s \
                                        WHERE s.org_id = $1 AND (b.project_id IS NULL OR s.project_id = b.project_id) \
                                          AND s.day >= CASE b.period WHEN 'day' THEN {TODAY} ELSE {MONTH_START} END)) \
                FROM budgets b WHERE b.org_id = $1 AND (b.project_id IS NULL OR b.project_id = $2) AND b.hard)) AS l) left_to_spend"
    ))
    .bind(org)
    .bind(project)
    .bind(run)
    .bind(usd_per_run)
    .fetch_one(conn)
    .await?;
    Ok(left)
}

/// A limit with its spend in the current period.
// The API shows it as it is (the OpenAPI document's `Budget`), naming its project by slug.
#[derive(Debug, Clone, Serialize, serde::Deserialize, sqlx::FromRow)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema), schema(as = Budget))]
pub struct BudgetView {
    /// `None`: the org's limit.
    #[serde(skip)]
    pub project_id: Option<ProjectId>,
    /// The project's slug; absent for the org's own limit.
    pub project: Option<String>,
    /// `day` or `month` (UTC).
    pub period: String,
    pub usd_limit: f64,
    /// A hard limit also stops crew steps (`budget_hard_stop`); a soft one only holds new runs.
    pub hard: bool,
    /// Spent in the current day or month.
    pub spent_usd: f64,
    /// When the period ends and spend starts again from zero.
    pub resets_at: DateTime<Utc>,
}

/// The org's limits, or one project's and the org's.
pub async fn list(conn: &mut sqlx::PgConnection, org: OrgId, project: Option<ProjectId>) -> Result<Vec<BudgetView>> {
    Ok(sqlx::query_as(&format!(
        "SELECT b.project_id, p.slug AS project, b.period, b.usd_limit::float8 AS usd_limit, b.hard, \
                (SELECT greatest(coalesce(sum(s.usd), 0), 0)::float8 FROM spend s WHERE s.org_id = b.org_id \
                   AND (b.project_id IS NULL OR s.project_id = b.project_id) \
                   AND s.day >= CASE b.period WHEN 'day' THEN {TODAY} ELSE {MONTH_START} END) AS spent_usd, \
                CASE b.period WHEN 'day' THEN ({TODAY} + 1)::timestamp ELSE ({MONTH_START} + interval '1 month') END AT TIME ZONE 'UTC' AS resets_at \
         FROM budgets b LEFT JOIN projects p ON p.org_id = b.org_id AND p.project_id = b.project_id \
         WHERE b.org_id = $1 AND ($2::uuid IS NULL OR b.project_id IS NULL OR b.project_id = $2) \
         ORDER BY b.project_id NULLS FIRST, b.period"
    ))
    .bind(org)
    .bind(project)
    .fetch_all(conn)
    .await?)
}

/// What a limit caps: the spend of a UTC day or of a UTC month.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    Day,
    Month,
}

impl Period {
    /// `day` or `month`, as the API and the `budgets` table name it.
    pub fn parse(text: &str) -> Option<Period> {
        match text {
            "day" => Some(Period::Day),
            "month" => Some(Period::Month),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
        }
    }
}

/// A limit's name in the audit log: `org:day`, `<project>:month`.
fn budget_key(project: Option<ProjectId>, period: Period) -> String {
    format!("{}:{}", project.map_or("org".into(), |p| p.to_string()), period.as_str())
}

/// The largest limit of a budget, in dollars.
pub const MAX_USD_LIMIT: f64 = 99_999_999.99;

const LIMIT_FOR_UPDATE: &str = "SELECT usd_limit::float8 FROM budgets WHERE org_id = $1 AND project_id IS NOT DISTINCT FROM $2 AND period = $3 FOR UPDATE";

const UPSERT_BUDGET: &str = "INSERT INTO budgets (org_id, budget_id, project_id, period, usd_limit, hard) VALUES ($1, $2, $3, $4, $5::numeric, $6) \
     ON CONFLICT (org_id, project_id, period) DO UPDATE SET usd_limit = EXCLUDED.usd_limit, hard = EXCLUDED.hard";

/// Sets a limit of the org (`project: None`) or a project. Raising one releases the runs it
/// held: they are admitted again, and those no other limit holds start.
pub async fn set(ch: &mut Change, org: OrgId, project: Option<ProjectId>, period: Period, usd_limit: f64, hard: bool) -> Result<()> {
    // The column is numeric(12, 4): the largest limit that it holds, rounded, is below 1e8.
    if !usd_limit.is_finite() || !(0.0..=MAX_USD_LIMIT).contains(&usd_limit) {
        return Err(StoreError::Invalid(format!("usd_limit must be between 0 and {MAX_USD_LIMIT}")));
    }
    // The old limit, locked: admissions read it FOR SHARE.
    let before: Option<f64> = sqlx::query_scalar(LIMIT_FOR_UPDATE).bind(org).bind(project).bind(period.as_str()).fetch_optional(&mut *ch.tx).await?;
    sqlx::query(UPSERT_BUDGET).bind(org).bind(uuid::Uuid::now_v7()).bind(project).bind(period.as_str()).bind(usd_limit).bind(hard).execute(&mut *ch.tx).await?;
    ch.audit(org, project, "budget.set", ("budget", budget_key(project, period)), json!({ "usd_limit": usd_limit, "hard": hard, "before": before }))?;
    if before.is_some_and(|b| usd_limit > b) {
        admission::lines::release_gate(ch, org, rules::BUDGET_QUEUE).await?;
    }
    Ok(())
}

const DELETE_BUDGET: &str = "DELETE FROM budgets WHERE org_id = $1 AND project_id IS NOT DISTINCT FROM $2 AND period = $3";

/// Removes a limit; the runs it held are released. Removing one that is not set is not found.
pub async fn remove(ch: &mut Change, org: OrgId, project: Option<ProjectId>, period: Period) -> Result<()> {
    let gone = sqlx::query(DELETE_BUDGET).bind(org).bind(project).bind(period.as_str()).execute(&mut *ch.tx).await?;
    if gone.rows_affected() == 0 {
        return Err(StoreError::NotFound("budget"));
    }
    ch.audit(org, project, "budget.remove", ("budget", budget_key(project, period)), json!({}))?;
    admission::lines::release_gate(ch, org, rules::BUDGET_QUEUE).await
}

/// One project's spend on one UTC day.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct SpendDay {
    pub project_id: ProjectId,
    pub day: NaiveDate,
    pub usd: f64,
    pub tokens: i64,
}

/// Spend per project and day, newest day first, from `from` to `to` (inclusive).
pub async fn spend(conn: &mut sqlx::PgConnection, org: OrgId, project: Option<ProjectId>, from: NaiveDate, to: NaiveDate) -> Result<Vec<SpendDay>> {
    Ok(sqlx::query_as(
        "SELECT project_id, day, greatest(sum(usd), 0)::float8 AS usd, sum(tokens)::int8 AS tokens FROM spend \
         WHERE org_id = $1 AND ($2::uuid IS NULL OR project_id = $2) AND day BETWEEN $3 AND $4 \
         GROUP BY project_id, day ORDER BY day DESC, project_id LIMIT 5000",
    )
    .bind(org)
    .bind(project)
    .bind(from)
    .bind(to)
    .fetch_all(conn)
    .await?)
}
