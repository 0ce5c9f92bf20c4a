//! A held step's session: reports (transcript lines under a per-run cap, running usage and
//! spend, which also renew the lease), heartbeats (and the stall they may find), completions,
//! and the steps a host should stop.

use std::time::Duration;

use crate::db::Db;
use protocol::Usage;
use serde_json::{Value, json};

use crate::definition::NodeKind;
use crate::hosts as model;
use crate::ids::{RunId, StepId, WorkflowId};
use crate::state::StepState;
use crate::store::steps::{self, Failure, FailureClass, LEASE, StepRow};
use crate::store::{Actor, Change, Result, StoreError, budgets, cap, runs};

use super::{HostRow, STALLED, holder, run_of, state_of};

/// One transcript line as a host numbers it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
pub struct LogLine {
    /// The host's number for the line within the step, from 1; a line sent again with the
    /// same number is stored once.
    pub seq: i64,
    /// `assistant`, `tool_result`, `result`, `stdout`, `stderr`, …
    pub stream: String,
    pub line: String,
}

/// What a session report did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported {
    /// The step's state: anything but leased or running tells the host to stop.
    pub state: StepState,
    pub stored: usize,
    /// Lines not stored because the run reached its transcript cap.
    pub dropped: usize,
}

/// The cumulative totals of a session, kept per step (never lowered by a late report), with
/// the host's latest estimate beside the reported cost and the spend recorded for it
/// (`spent`, the figure budgets count).
#[expect(clippy::too_many_arguments, reason = "one statement's binds; a struct for them would be read once")]
pub(crate) async fn record_usage(
    conn: &mut sqlx::PgConnection, host: &HostRow, run: RunId, step: StepId, harness: Option<&str>, usage: &Usage, lines: i64, spent: f64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO step_sessions (org_id, run_id, step_id, host_id, harness, model, input_tokens, output_tokens, cost_usd, turns, tool_calls, lines, \
                                    estimated_cost_usd, estimate_basis, output_tokens_lower_bound, spent_usd) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::float8::numeric(14, 6), $10, $11, $12, \
                 $13::float8::numeric(14, 6), $14, $15, $16::float8::numeric(14, 6)) \
         ON CONFLICT (step_id) DO UPDATE SET \
           harness = coalesce(EXCLUDED.harness, step_sessions.harness), \
           model = coalesce(EXCLUDED.model, step_sessions.model), \
           input_tokens = greatest(step_sessions.input_tokens, EXCLUDED.input_tokens), \
           output_tokens = greatest(step_sessions.output_tokens, EXCLUDED.output_tokens), \
           cost_usd = CASE WHEN EXCLUDED.cost_usd IS NULL THEN step_sessions.cost_usd \
                           ELSE greatest(coalesce(step_sessions.cost_usd, 0), EXCLUDED.cost_usd) END, \
           estimated_cost_usd = coalesce(EXCLUDED.estimated_cost_usd, step_sessions.estimated_cost_usd), \
           estimate_basis = coalesce(EXCLUDED.estimate_basis, step_sessions.estimate_basis), \
           output_tokens_lower_bound = CASE WHEN EXCLUDED.output_tokens >= step_sessions.output_tokens \
                                            THEN EXCLUDED.output_tokens_lower_bound ELSE step_sessions.output_tokens_lower_bound END, \
           spent_usd = EXCLUDED.spent_usd, \
           turns = greatest(step_sessions.turns, EXCLUDED.turns), \
           tool_calls = greatest(step_sessions.tool_calls, EXCLUDED.tool_calls), \
           lines = step_sessions.lines + EXCLUDED.lines, \
           last_report_at = now()",
    )
    .bind(host.org_id)
    .bind(run)
    .bind(step)
    .bind(host.host_id)
    .bind(harness)
    .bind(usage.model.as_deref().map(cap))
    .bind(usage.input_tokens.max(0))
    .bind(usage.output_tokens.max(0))
    .bind(model::reported(usage))
    .bind(usage.turns.max(0))
    .bind(usage.tool_calls.max(0))
    .bind(lines)
    .bind(model::estimated(usage))
    .bind(usage.estimate_basis.as_deref().map(|b| cap(b).chars().take(32).collect::<String>()))
    .bind(usage.output_tokens_lower_bound)
    .bind(spent)
    .execute(conn)
    .await?;
    Ok(())
}

const LOCK_LOG_SIZE: &str = "INSERT INTO run_log_sizes (org_id, run_id) VALUES ($1, $2) \
     ON CONFLICT (run_id) DO UPDATE SET bytes = run_log_sizes.bytes RETURNING bytes, capped_at IS NOT NULL";

const NOTE_TRANSCRIPT_CAP: &str = "INSERT INTO step_logs (org_id, run_id, run_created_at, step_id, seq, stream, line) \
     VALUES ($1, $2, (SELECT created_at FROM runs WHERE run_id = $2), $3, $4, 'note', $5) ON CONFLICT DO NOTHING";

/// What a host's session report carries.
#[derive(Debug, Clone, Copy)]
pub struct Report<'a> {
    pub harness: Option<&'a str>,
    pub lines: &'a [LogLine],
    /// The session's running totals.
    pub usage: &'a Usage,
    /// Destinations the step's proxy refused (`host:port`), each a `step.egress_refused` event.
    pub egress_refused: &'a [String],
}

/// The longest destination an event keeps.
const DESTINATION_MAX: usize = 300;

/// A session report: renews the lease, keeps the totals, appends the lines the run's
/// transcript cap (`cap_bytes`) still has room for, and records each refused destination once
/// per step. When the cap is first reached a note says so in the step's log. A host that no
/// longer holds the step stores nothing and learns the step's state.
pub async fn report(pool: &Db, host: &HostRow, step: StepId, r: Report<'_>, cap_bytes: i64) -> Result<Reported> {
    let Report { harness, lines, usage, egress_refused } = r;
    check_usage(usage)?;
    let mut ch = Change::begin(pool, Actor::Host(host.host_id)).await?;
    // A report whose spend figure (the larger of the host's estimate and the reported cost)
    // moved, or that counted more tokens, records the difference against the run's and the
    // project's spend, under the run's lock, taken first (engines lock runs before steps). Most
    // reports only add lines.
    let before: Option<(RunId, Option<f64>, f64, i64)> = sqlx::query_as(
        "SELECT s.run_id, ss.cost_usd::float8, coalesce(ss.spent_usd, ss.cost_usd, 0)::float8, coalesce(ss.input_tokens + ss.output_tokens, 0) FROM steps s \
         LEFT JOIN step_sessions ss ON ss.step_id = s.step_id WHERE s.step_id = $1 AND s.org_id = $2",
    )
    .bind(step)
    .bind(host.org_id)
    .fetch_optional(&mut *ch.tx)
    .await?;
    if let Some((run, cost, recorded, tokens)) = before {
        // An event (a refused destination) is written under the run's lock too.
        if !egress_refused.is_empty() {
            ch.lock_run(host.org_id, run).await?;
        } else if spend_moves(usage, cost, recorded, tokens) {
            ch.lock_run_quietly(host.org_id, run).await?;
        }
    }
    let renewed: Option<(RunId, String, String, WorkflowId, i32)> = sqlx::query_as(&format!(
        "UPDATE steps s SET lease_expires_at = clock_timestamp() + interval '{} seconds' FROM runs r \
         WHERE s.step_id = $1 AND s.org_id = $2 AND s.holder = $3 AND s.state IN ('leased', 'running') AND r.run_id = s.run_id \
         RETURNING s.run_id, s.state, s.node, r.workflow_id, r.workflow_version",
        LEASE.as_secs()
    ))
    .bind(step)
    .bind(host.org_id)
    .bind(holder(host.host_id))
    .fetch_optional(&mut *ch.tx)
    .await?;
    let Some((run, state, node, workflow, version)) = renewed else {
        drop(ch);
        return Ok(Reported { state: state_of(pool, host, step).await?, stored: 0, dropped: lines.len() });
    };
    let state = StepState::parse(&state).unwrap_or(StepState::Running);
    let mut stored = 0;
    let mut dropped = 0;
    if !lines.is_empty() {
        // The run's size, locked (an upsert locks the row it finds, as FOR UPDATE would).
        let (used, capped): (i64, bool) = sqlx::query_as(LOCK_LOG_SIZE).bind(host.org_id).bind(run).fetch_one(&mut *ch.tx).await?;
        let mut room = if capped { 0 } else { (cap_bytes - used).max(0) };
        let (mut seqs, mut streams, mut texts) = (Vec::new(), Vec::new(), Vec::new());
        let mut over: Vec<i64> = Vec::new();
        for l in lines {
            let text = protocol::cut_line(&l.line);
            let size = text.len() as i64;
            if over.is_empty() && size <= room {
                room -= size;
                seqs.push(l.seq);
                streams.push(cap(&l.stream).chars().take(32).collect::<String>());
                texts.push(text);
            } else {
                over.push(l.seq);
            }
        }
        // Lines over the cap that were stored before (a report sent again) are not dropped.
        let first_dropped = over.first().copied();
        if !over.is_empty() {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM UNNEST($2::bigint[]) AS o(seq) WHERE NOT EXISTS (SELECT 1 FROM step_logs l WHERE l.step_id = $1 AND l.seq = o.seq)",
            )
            .bind(step)
            .bind(&over)
            .fetch_one(&mut *ch.tx)
            .await?;
            dropped = n as usize;
        }
        let sizes: Vec<i32> = sqlx::query_scalar(
            "INSERT INTO step_logs (org_id, run_id, run_created_at, step_id, seq, stream, line) \
             SELECT $1, $2, (SELECT created_at FROM runs WHERE run_id = $2), $3, u.seq, u.stream, u.line \
             FROM UNNEST($4::bigint[], $5::text[], $6::text[]) AS u(seq, stream, line) \
             ON CONFLICT (step_id, seq, run_created_at) DO NOTHING RETURNING octet_length(line)",
        )
        .bind(host.org_id)
        .bind(run)
        .bind(step)
        .bind(&seqs)
        .bind(&streams)
        .bind(&texts)
        .fetch_all(&mut *ch.tx)
        .await?;
        stored = sizes.len();
        let added: i64 = sizes.iter().map(|s| i64::from(*s)).sum();
        let newly_capped = !capped && first_dropped.is_some();
        if let (true, Some(seq)) = (newly_capped, first_dropped) {
            // The first dropped line's number is never stored, so the note cannot collide.
            let note = format!("transcript cap of {cap_bytes} bytes for this run reached: later lines are not stored");
            sqlx::query(NOTE_TRANSCRIPT_CAP).bind(host.org_id).bind(run).bind(step).bind(seq).bind(note).execute(&mut *ch.tx).await?;
        }
        sqlx::query(
            "UPDATE run_log_sizes SET bytes = bytes + $2, dropped = dropped + $3, \
                    capped_at = CASE WHEN $4 THEN coalesce(capped_at, now()) ELSE capped_at END WHERE run_id = $1",
        )
        .bind(run)
        .bind(added)
        .bind(dropped as i64)
        .bind(newly_capped)
        .execute(&mut *ch.tx)
        .await?;
    }
    if !egress_refused.is_empty() {
        record_egress_refused(&mut ch, run, step, egress_refused).await?;
    }
    let mut state = state;
    let (spent, recorded) = record_session_spend(&mut ch, host, run, step, usage).await?;
    record_usage(&mut ch.tx, host, run, step, harness, usage, stored as i64, recorded).await?;
    if stored > 0 {
        // Live transcripts (the console) follow `l<run>`; engines ignore it.
        ch.notify_transcript(run);
    }
    // Spend that crossed a hard limit, or turns past the cap, stop the step now (the answer
    // says so): a session that reports all the time may send no heartbeat.
    if spent > 0.0 && over_budget(&mut ch, run).await? {
        state = stop_held(&mut ch, host, run, step, &Failure::new(budgets::HARD_STOP, FailureClass::Final)).await?.state();
    } else if usage.turns > 0 && past_turn_cap(&mut ch, workflow, version, &node, usage.turns).await? {
        state = stop_held(&mut ch, host, run, step, &Failure::new(TURN_CAP, FailureClass::Ordinary)).await?.state();
    }
    ch.commit().await?;
    Ok(Reported { state, stored, dropped })
}

/// A `step.egress_refused` event for each destination not recorded for the step before (a
/// report sent again records nothing twice).
async fn record_egress_refused(ch: &mut Change, run: RunId, step: StepId, destinations: &[String]) -> Result<()> {
    let (node, known): (String, Vec<String>) = sqlx::query_as(
        "SELECT s.node, coalesce(array_agg(e.attrs->>'destination') FILTER (WHERE e.seq IS NOT NULL), '{}') FROM steps s \
         LEFT JOIN run_events e ON e.run_id = s.run_id AND e.step_id = s.step_id AND e.kind = 'step.egress_refused' \
         WHERE s.step_id = $1 GROUP BY s.node",
    )
    .bind(step)
    .fetch_one(ch.conn())
    .await?;
    let mut seen: std::collections::HashSet<String> = known.into_iter().collect();
    for dest in destinations {
        let dest: String = cap(dest).chars().take(DESTINATION_MAX).collect();
        if seen.insert(dest.clone()) {
            ch.event(run, "step.egress_refused", Some((step, &node)), json!({ "destination": dest }))?;
        }
    }
    Ok(())
}

/// The most tokens one session may report, a thousand times what the longest sessions spend.
const MAX_TOKENS: i64 = 1_000_000_000_000;
/// The most dollars one session may report.
const MAX_USD: f64 = 1_000_000.0;

/// Refuses usage no session can have. A host's figures go into its project's day of spend,
/// which every other host of the project adds to: one past what a column holds would make
/// every later report fail, its hard budget included.
fn check_usage(usage: &Usage) -> Result<()> {
    let tokens_ok = [usage.input_tokens, usage.output_tokens].iter().all(|t| (0..=MAX_TOKENS).contains(t));
    let usd_ok = [usage.cost_usd, usage.estimated_cost_usd].iter().flatten().all(|usd| usd.is_finite() && (0.0..=MAX_USD).contains(usd));
    if tokens_ok && usd_ok && usage.turns >= 0 && usage.tool_calls >= 0 {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "usage out of range: tokens are whole numbers from 0 to {MAX_TOKENS}, costs dollars from 0 to {MAX_USD}, turns and tool calls 0 or more"
        )))
    }
}

/// What a report changes of the spend recorded for its session: the dollars (the session's
/// spend figure, `model::spend_figure`, less what was recorded) and the tokens beyond those
/// counted. While no cost was reported the figure only grows (a lower estimate records
/// nothing); a reported cost replaces the estimate, so a cost below what the estimate recorded
/// gives a negative correction.
pub(crate) fn spend_delta(usage: &Usage, cost: Option<f64>, recorded: f64, tokens: i64) -> (f64, i64) {
    let figure = model::spend_figure(usage, cost);
    let mut usd = model::round_cost(figure - recorded);
    if model::reported(usage).or(cost).is_none() {
        usd = usd.max(0.0);
    }
    (usd, (usage.input_tokens.max(0) + usage.output_tokens.max(0) - tokens).max(0))
}

pub(crate) fn spend_moves(usage: &Usage, cost: Option<f64>, recorded: f64, tokens: i64) -> bool {
    spend_delta(usage, cost, recorded, tokens) != (0.0, 0)
}

/// Records what a session spent since its previous report against the run's total and the
/// project's day (`budgets::record_run_spend`): reports carry cumulative figures, so the spend
/// is the difference from what was recorded (`step_sessions.spent_usd`, read under the session
/// row's lock, so two reports never count the same dollars). Returns the dollars added (negative
/// for a correction) and the figure now recorded. Locks the run if it was not.
pub(crate) async fn record_session_spend(ch: &mut Change, host: &HostRow, run: RunId, step: StepId, usage: &Usage) -> Result<(f64, f64)> {
    let before: Option<(Option<f64>, f64, i64)> = sqlx::query_as(
        "SELECT cost_usd::float8, coalesce(spent_usd, cost_usd, 0)::float8, input_tokens + output_tokens FROM step_sessions WHERE step_id = $1 FOR UPDATE",
    )
    .bind(step)
    .fetch_optional(&mut *ch.tx)
    .await?;
    let (cost, recorded, tokens) = before.unwrap_or((None, 0.0, 0));
    let (usd, more_tokens) = spend_delta(usage, cost, recorded, tokens);
    if (usd, more_tokens) == (0.0, 0) {
        return Ok((0.0, recorded));
    }
    if ch.locked(run).is_err() {
        ch.lock_run_quietly(host.org_id, run).await?.ok_or(StoreError::NotFound("run"))?;
    }
    budgets::record_run_spend(ch, run, usd, more_tokens).await?;
    Ok((usd, model::round_cost((recorded + usd).max(0.0))))
}

/// Whether a hard limit stops the crew steps of `run` now: its own `usd_per_run` (a hard
/// workflow budget), or a hard limit of its project or org that spend has reached.
pub(crate) async fn over_budget(ch: &mut Change, run: RunId) -> Result<bool> {
    let Some(row) = runs::get(ch, run).await? else { return Ok(false) };
    let def = crate::store::admission::plan::definition(ch, row.workflow_id, row.workflow_version).await?;
    let per_run = def.budget.usd_per_run.filter(|_| def.budget.hard);
    budgets::hard_stop(ch.conn(), row.org_id, row.project_id, run, per_run).await
}

/// The reason of a crew step whose session passed its node's `caps.turns` (a documented failure reason):
/// a harness that ignores its own turn cap is stopped by the server.
pub(super) const TURN_CAP: &str = "turn_cap";

/// Whether the session of `step` has more turns than its node's `caps.turns` (one statement;
/// the definition comes from the catalog's cache).
pub(crate) async fn over_turns(ch: &mut Change, step: StepId) -> Result<bool> {
    let session: Option<(String, i32, WorkflowId, i32)> = sqlx::query_as(
        "SELECT s.node, ss.turns, r.workflow_id, r.workflow_version FROM steps s \
         JOIN step_sessions ss ON ss.step_id = s.step_id JOIN runs r ON r.run_id = s.run_id WHERE s.step_id = $1",
    )
    .bind(step)
    .fetch_optional(ch.conn())
    .await?;
    let Some((node, turns, workflow, version)) = session else { return Ok(false) };
    past_turn_cap(ch, workflow, version, &node, turns).await
}

/// Whether `turns` is past the `caps.turns` of `node` (no statement while the catalog has the
/// definition).
async fn past_turn_cap(ch: &mut Change, workflow: WorkflowId, version: i32, node: &str, turns: i32) -> Result<bool> {
    let def = crate::store::admission::plan::definition(ch, workflow, version).await?;
    let cap = def.node(node).and_then(|n| match &n.kind {
        NodeKind::Crew(c) => c.caps.turns,
        _ => None,
    });
    Ok(cap.is_some_and(|cap| i64::from(turns) > i64::from(cap)))
}

/// Fails a step the host holds (a spent budget, a stall) and wakes its run: the host learns it
/// from the answer to its next heartbeat or report (or its claim's feed), as it learns of a
/// cancel, and stops the harness. The run is locked.
pub(crate) async fn stop_held(ch: &mut Change, host: &HostRow, run: RunId, step: StepId, failure: &Failure) -> Result<StepRow> {
    // (A report locks its run quietly; the step's end is an event.)
    ch.lock_run(host.org_id, run).await?.ok_or(StoreError::NotFound("run"))?;
    let row = steps::fail_held(ch, run, step, &holder(host.host_id), failure, None).await?;
    ch.wake(run, None, Duration::ZERO, "advance", true).await?;
    Ok(row)
}

/// Whether a crew step's session has been silent for `after`: nothing reported since it
/// started, or since its last report.
pub(crate) async fn stalled(ch: &mut Change, step: StepId, after: Duration) -> Result<bool> {
    let silent: Option<Option<bool>> = sqlx::query_scalar(
        "SELECT coalesce(ss.last_report_at, s.started_at) < now() - $2 * interval '1 millisecond' \
         FROM steps s LEFT JOIN step_sessions ss ON ss.step_id = s.step_id WHERE s.step_id = $1 AND s.kind = 'crew'",
    )
    .bind(step)
    .bind(after.as_millis() as f64)
    .fetch_optional(ch.conn())
    .await?;
    Ok(silent.flatten().unwrap_or(false))
}

/// A heartbeat of a held step: renews the lease and answers the step's state, as
/// `steps::heartbeat` does. A running step whose run a hard budget stops is failed with
/// `budget_hard_stop` (final) first, and a crew step whose session was silent for
/// `stall_after` with `stalled` (retried), so the answer tells the host to stop it.
pub async fn heartbeat(pool: &Db, host: &HostRow, step: StepId, stall_after: Duration) -> Result<StepState> {
    let me = holder(host.host_id);
    let state = steps::heartbeat(pool, host.org_id, step, &me).await?;
    if !matches!(state, StepState::Leased | StepState::Running) {
        // Not held by this host: its state, if the step is of the host's project.
        return state_of(pool, host, step).await;
    }
    let run = run_of(pool, host, step).await?;
    let mut ch = Change::begin(pool, Actor::System).await?;
    let failure = if over_budget(&mut ch, run).await? {
        Failure::new(budgets::HARD_STOP, FailureClass::Final)
    } else if over_turns(&mut ch, step).await? {
        // Like the harness's own `error_max_turns`: retried as `retry:` says.
        Failure::new(TURN_CAP, FailureClass::Ordinary)
    } else if stalled(&mut ch, step, stall_after).await? {
        Failure::new(STALLED, FailureClass::Infrastructure)
    } else {
        return Ok(state);
    };
    ch.lock_run(host.org_id, run).await?.ok_or(StoreError::NotFound("run"))?;
    match stop_held(&mut ch, host, run, step, &failure).await {
        Ok(row) => {
            ch.commit().await?;
            Ok(row.state())
        }
        // Completed, cancelled or taken back meanwhile.
        Err(StoreError::Stale(_)) => {
            drop(ch);
            state_of(pool, host, step).await
        }
        Err(e) => Err(e),
    }
}

/// How a host's step ended.
#[derive(Debug, Clone)]
pub struct Completion {
    /// The step's output: the answer text, files changed, branch, head SHA, commits, the pull
    /// request body, the figures.
    pub output: Value,
    /// `None` for a success.
    pub failure: Option<Failure>,
    pub usage: Usage,
    pub harness: Option<String>,
}

/// Records a host's result for a step it holds, with a `step.session` event carrying the
/// figures, and a wake so that an engine advances the run.
///
/// A step the server ended while this host held it (cancelled, stopped by a hard budget or a
/// stall, failed after its lease lapsed: ended with no output) keeps its end: the result is
/// dropped, but the session's final figures are recorded once (the harness's own, printed after
/// it was interrupted), since they are what it spent; the answer is the step as it stands. A
/// step another host holds now, never held by this one, or already completed, answers `Stale`.
pub async fn complete(pool: &Db, host: &HostRow, step: StepId, c: &Completion) -> Result<StepRow> {
    check_usage(&c.usage)?;
    let run = run_of(pool, host, step).await?;
    let mut ch = Change::begin(pool, Actor::Host(host.host_id)).await?;
    ch.lock_run(host.org_id, run).await?.ok_or(StoreError::NotFound("run"))?;
    let me = holder(host.host_id);
    let moved = match &c.failure {
        None => steps::succeed_held(&mut ch, run, step, &me, &c.output).await,
        Some(f) => steps::fail_held(&mut ch, run, step, &me, f, Some(&c.output)).await,
    };
    let (row, ended_before) = match moved {
        Ok(row) => (row, false),
        Err(StoreError::Stale(why)) => match steps::get(&mut ch, run, step).await? {
            Some(row) if row.holder.as_deref() == Some(me.as_str()) && ended_by_server(&row) && !reported_after_end(&mut ch, run, step).await? => (row, true),
            _ => return Err(StoreError::Stale(why)),
        },
        Err(e) => return Err(e),
    };
    // The final figures may carry cost no report did (the result line comes last).
    let (_, recorded) = record_session_spend(&mut ch, host, run, step, &c.usage).await?;
    record_usage(&mut ch.tx, host, run, step, c.harness.as_deref(), &c.usage, 0, recorded).await?;
    let mut figures = json!({
        "host": host.host_id.to_string(),
        "harness": c.harness,
        "model": c.usage.model.as_deref().map(cap),
        "cost_usd": model::reported(&c.usage),
        "estimated_cost_usd": model::estimated(&c.usage),
        "spent_usd": recorded,
        "input_tokens": c.usage.input_tokens,
        "output_tokens": c.usage.output_tokens,
        "turns": c.usage.turns,
        "tool_calls": c.usage.tool_calls,
    });
    if ended_before {
        figures["after_end"] = json!(true);
    }
    ch.event(run, "step.session", Some((step, &row.node)), figures.clone())?;
    ch.audit(host.org_id, Some(host.project_id), "step.session", ("step", step.to_string()), figures)?;
    if !ended_before {
        ch.wake(run, None, Duration::ZERO, "advance", true).await?;
    }
    ch.commit().await?;
    Ok(row)
}

/// Whether the server ended a held step (cancelled it, or failed it with no output: a hard
/// budget, a stall, a lapsed lease) rather than its holder completing it.
fn ended_by_server(row: &StepRow) -> bool {
    matches!(row.state(), StepState::Cancelled) || (row.state() == StepState::Failed && row.output.is_none())
}

/// Whether the final figures of a step the server ended were recorded already.
async fn reported_after_end(ch: &mut Change, run: RunId, step: StepId) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM run_events WHERE run_id = $1 AND step_id = $2 AND kind = 'step.session' AND (attrs->>'after_end')::bool)",
    )
    .bind(run)
    .bind(step)
    .fetch_one(ch.conn())
    .await?)
}

/// Of the steps a host believes it runs, those it should stop, with their state (`gone` for a
/// step that no longer exists): no longer leased or running under this host.
pub async fn to_stop(pool: &Db, host: &HostRow, held: &[StepId]) -> Result<Vec<(StepId, String)>> {
    if held.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<uuid::Uuid> = held.iter().map(|s| s.0).collect();
    let rows: Vec<(StepId, String, Option<String>)> = sqlx::query_as(
        "SELECT s.step_id, s.state, s.holder FROM steps s JOIN runs r USING (run_id) WHERE s.org_id = $1 AND s.step_id = ANY($2) AND r.project_id = $3",
    )
    .bind(host.org_id)
    .bind(&ids)
    .bind(host.project_id)
    .fetch_all(pool)
    .await?;
    let me = holder(host.host_id);
    let mut stop: Vec<(StepId, String)> = rows
        .iter()
        .filter(|(_, state, h)| !(matches!(state.as_str(), "leased" | "running") && h.as_deref() == Some(me.as_str())))
        .map(|(s, state, _)| (*s, state.clone()))
        .collect();
    for s in held {
        if !rows.iter().any(|r| r.0 == *s) {
            stop.push((*s, "gone".into()));
        }
    }
    Ok(stop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition;
    use crate::store::hosts::claims::feeds_pull_request;

    #[test]
    fn the_last_crew_node_before_a_pull_request_describes_it() {
        let def = definition::parse(
            "name: t\nnodes:\n  plan: { crew: { harness: claude-code, prompt: p } }\n  \
             build: { after: [plan], crew: { harness: claude-code, prompt: b } }\n  \
             ci: { after: [build], gate: { checks: [test] } }\n  \
             pr: { after: [ci], output: { github: pull_request } }\n",
        )
        .unwrap();
        assert!(feeds_pull_request(&def, "build"));
        assert!(!feeds_pull_request(&def, "plan"));
    }

    #[test]
    fn spend_follows_the_estimate_until_the_reported_cost_replaces_it() {
        let est = |usd: f64| Usage { estimated_cost_usd: Some(usd), input_tokens: 10, ..Usage::default() };
        // The estimate grows: its difference is recorded; a report sent again records nothing.
        assert_eq!(spend_delta(&est(0.4), None, 0.0, 0), (0.4, 10));
        assert_eq!(spend_delta(&est(0.4), None, 0.4, 10), (0.0, 0));
        // A lower estimate with no reported cost records nothing (the figure never falls).
        assert_eq!(spend_delta(&est(0.3), None, 0.4, 10), (0.0, 0));
        // The reported cost replaces it, lower (a correction) or higher.
        let reported = |usd: f64| Usage { cost_usd: Some(usd), estimated_cost_usd: Some(usd), input_tokens: 10, ..Usage::default() };
        assert_eq!(spend_delta(&reported(0.25), None, 0.4, 10), (-0.15, 0));
        assert_eq!(spend_delta(&reported(0.5), None, 0.4, 10), (0.1, 0));
        // After a result line, messages that follow are estimated on top of it.
        let more = Usage { cost_usd: Some(0.25), estimated_cost_usd: Some(0.3), input_tokens: 10, ..Usage::default() };
        assert_eq!(spend_delta(&more, Some(0.25), 0.25, 10), (0.05, 0));
        // An older host sends no estimate: the reported cost alone, as before.
        let old = Usage { cost_usd: Some(0.2), input_tokens: 10, ..Usage::default() };
        assert_eq!(spend_delta(&old, None, 0.0, 0), (0.2, 10));
        assert!(!spend_moves(&old, Some(0.2), 0.2, 10));
    }
}
