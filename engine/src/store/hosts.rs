//! The host protocol's writes: registering a host, claiming ready crew steps for it, starting
//! them, session reports (transcript lines and running usage, which also renew the lease), and
//! completions.
//!
//! A claim is one `Change`: the host's row is locked (so one host's claims never overlap and its
//! `max_concurrent` slots are counted under that lock), ready crew steps whose `requires` the
//! host's capabilities satisfy are picked oldest first, their runs are locked with `FOR UPDATE
//! SKIP LOCKED` (a run an engine is advancing right now is skipped, not waited for, and two
//! replicas' claims never take one step), and each step is leased (`pending → leased`, fenced
//! by the `pending` source state) with the wake that recovers it if the host goes silent.
//!
//! Session reports are like heartbeats: frequent and not moves of the step, so they write no run
//! event and no audit entry; they append log lines (numbered by the host, so a report sent twice
//! stores each line once) under a per-run size cap, and keep the session's cumulative totals.
//! A completion is a fenced move (`running → succeeded | failed`, holder = this host) with a
//! `step.session` event carrying the figures, and a wake so that an engine advances the run.

use std::time::Duration;

use crate::db::Db;
use serde_json::json;
use sqlx::FromRow;

use super::{Change, Result, StoreError, cap};
use crate::hosts::Capability;
use crate::ids::{HostId, OrgId, ProjectId, RunId, StepId};
use crate::state::StepState;

mod claims;
mod sessions;

pub use claims::{CANDIDATES_SQL, Claimed, HELD_SQL, RunRepository, claim, run_repository, start};
pub use sessions::{Completion, LogLine, Report, Reported, complete, heartbeat, report, to_stop};

/// Beyond its timeout, how long the server lets a host-held step run before it fails it: the
/// host interrupts its harness at the timeout itself and needs its interrupt grace (30 s by
/// default) to collect the result line and report.
pub const HOST_STOP_GRACE: Duration = Duration::from_secs(60);

/// A crew step whose session reported nothing for this long is stalled (a safety
/// default): failed `stalled`, an infrastructure failure, so it is retried. Hosts send a
/// report only when the harness printed something, so their heartbeats alone do not count.
pub const STALL_AFTER: Duration = Duration::from_secs(600);

/// The failure reason of a stalled step.
pub const STALLED: &str = "stalled";

/// Transcript bytes stored per run; beyond, lines are counted and dropped, with one note.
pub const RUN_LOG_CAP_BYTES: i64 = 8 << 20;

/// A host's `last_seen_at` is written at most this often.
const SEEN_EVERY_SECS: i32 = 10;

/// The holder string of a host's leases.
pub fn holder(host: HostId) -> String {
    format!("host:{host}")
}

/// A registered host, as its credential names it.
#[derive(Debug, Clone, FromRow)]
pub struct HostRow {
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub host_id: HostId,
    pub name: String,
    pub capabilities: Vec<String>,
    pub max_concurrent: i32,
}

/// What a registration says about the host.
#[derive(Debug, Clone)]
pub struct NewHost<'a> {
    pub org: OrgId,
    pub project: ProjectId,
    pub name: &'a str,
    pub capabilities: &'a [Capability],
    pub max_concurrent: u32,
    /// The registration token's `jti`: it registers one host and is revoked by doing so.
    pub registration: uuid::Uuid,
}

/// The most slots a host may ask for.
pub const MAX_SLOTS: u32 = 64;

/// Registers a host with its registration token, which is revoked in the same change.
pub async fn register(ch: &mut Change, new: &NewHost<'_>) -> Result<HostId> {
    let name = new.name.trim();
    if name.is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control) {
        return Err(StoreError::Invalid("a host's name is 1 to 100 printable characters".into()));
    }
    if !(1..=MAX_SLOTS).contains(&new.max_concurrent) {
        return Err(StoreError::Invalid(format!("max_concurrent must be between 1 and {MAX_SLOTS}")));
    }
    let token: Option<(bool, Option<ProjectId>)> = sqlx::query_as(
        "SELECT revoked_at IS NOT NULL OR expires_at <= now(), project_id FROM api_tokens \
         WHERE org_id = $1 AND jti = $2 AND kind = 'registration' FOR UPDATE",
    )
    .bind(new.org)
    .bind(new.registration)
    .fetch_optional(&mut *ch.tx)
    .await?;
    match token {
        None => return Err(StoreError::NotFound("registration token")),
        Some((true, _)) => return Err(StoreError::Conflict("this registration token was already used or has expired".into())),
        Some((false, project)) if project != Some(new.project) => {
            return Err(StoreError::Invalid("the registration token is for another project".into()));
        }
        Some(_) => {}
    }
    let host = HostId::mint();
    let caps: Vec<&str> = new.capabilities.iter().map(Capability::as_str).collect();
    sqlx::query(
        "INSERT INTO hosts (org_id, project_id, host_id, name, capabilities, max_concurrent, last_seen_at, registered_with) \
         VALUES ($1, $2, $3, $4, $5, $6, now(), $7)",
    )
    .bind(new.org)
    .bind(new.project)
    .bind(host)
    .bind(name)
    .bind(&caps)
    .bind(new.max_concurrent as i32)
    .bind(new.registration)
    .execute(&mut *ch.tx)
    .await?;
    sqlx::query("UPDATE api_tokens SET revoked_at = now() WHERE org_id = $1 AND jti = $2").bind(new.org).bind(new.registration).execute(&mut *ch.tx).await?;
    ch.audit(
        new.org,
        Some(new.project),
        "host.register",
        ("host", host.to_string()),
        json!({ "name": cap(name), "capabilities": caps, "max_concurrent": new.max_concurrent, "registration": new.registration.to_string() }),
    )?;
    Ok(host)
}

/// The host a host credential belongs to, unless it was deregistered.
pub async fn by_token(pool: &Db, org: OrgId, jti: uuid::Uuid) -> Result<Option<HostRow>> {
    Ok(sqlx::query_as(
        "SELECT h.org_id, h.project_id, h.host_id, h.name, h.capabilities, h.max_concurrent \
         FROM api_tokens t JOIN hosts h ON h.host_id = t.host_id AND h.org_id = t.org_id \
         WHERE t.jti = $1 AND t.org_id = $2 AND t.kind = 'host' AND h.deregistered_at IS NULL",
    )
    .bind(jti)
    .bind(org)
    .fetch_optional(pool)
    .await?)
}

/// Records that the host called in (for routing: `unroutable` looks at hosts seen in the last
/// day). Written at most every 10 s per host.
pub async fn seen(pool: &Db, host: &HostRow) -> Result<()> {
    sqlx::query(
        "UPDATE hosts SET last_seen_at = now() WHERE host_id = $1 AND org_id = $2 \
           AND (last_seen_at IS NULL OR last_seen_at < now() - make_interval(secs => $3))",
    )
    .bind(host.host_id)
    .bind(host.org_id)
    .bind(f64::from(SEEN_EVERY_SECS))
    .execute(pool)
    .await?;
    Ok(())
}

/// The run a step of `org` belongs to.
async fn run_of(pool: &Db, host: &HostRow, step: StepId) -> Result<RunId> {
    Ok(step_of(pool, host, step).await?.0)
}

/// The state of a step a host no longer holds.
async fn state_of(pool: &Db, host: &HostRow, step: StepId) -> Result<StepState> {
    let state = step_of(pool, host, step).await?.1;
    StepState::parse(&state).ok_or(StoreError::NotFound("step"))
}

/// A step of the host's project, with its run and state: a step of another project is not
/// found, as one of another org, so that a host learns nothing of steps it may not run.
async fn step_of(pool: &Db, host: &HostRow, step: StepId) -> Result<(RunId, String)> {
    sqlx::query_as("SELECT s.run_id, s.state FROM steps s JOIN runs r USING (run_id) WHERE s.step_id = $1 AND s.org_id = $2 AND r.project_id = $3")
        .bind(step)
        .bind(host.org_id)
        .bind(host.project_id)
        .fetch_optional(pool)
        .await?
        .ok_or(StoreError::NotFound("step"))
}
