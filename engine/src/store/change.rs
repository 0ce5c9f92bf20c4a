//! `Change`: one transaction of the write path, with its audit entries, run events, wakes and
//! the single `NOTIFY` sent at commit.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use sqlx::{PgPool, Postgres, Row, Transaction};

use super::{Result, StoreError};
use crate::ids::{HostId, OrgId, ProjectId, RunId, StepId, UserId};

/// The channel engines and API replicas `LISTEN` on. The payload is `w<ms>`, the delay until
/// the earliest wake the transaction wrote for another process (`w0` when due now), or `e`
/// when it only wrote run events (for the event streams; engines ignore it).
pub const NOTIFY_CHANNEL: &str = "shopfloor_wakes";

/// What a notification says, parsed from its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// A wake falls due after this delay.
    Wake(Duration),
    /// New run events, nothing for engines.
    Events,
}

impl Notice {
    pub fn parse(payload: &str) -> Notice {
        match payload.strip_prefix('w').and_then(|ms| ms.parse().ok()) {
            Some(ms) => Notice::Wake(Duration::from_millis(ms)),
            None if payload == "e" => Notice::Events,
            // An unknown payload: look, rather than miss a wake.
            None => Notice::Wake(Duration::ZERO),
        }
    }
}

/// Who makes a change, for the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    User(UserId),
    /// A token acting without a user (a bootstrap or automation token), by its `jti`.
    Token(uuid::Uuid),
    Host(HostId),
    /// An engine process, by its id.
    Engine(String),
    Github,
    System,
}

impl Actor {
    fn kind(&self) -> &'static str {
        match self {
            Actor::User(_) => "user",
            Actor::Token(_) => "token",
            Actor::Host(_) => "host",
            Actor::Engine(_) => "engine",
            Actor::Github => "github",
            Actor::System => "system",
        }
    }

    fn id(&self) -> String {
        match self {
            Actor::User(id) => id.to_string(),
            Actor::Token(jti) => jti.to_string(),
            Actor::Host(id) => id.to_string(),
            Actor::Engine(id) => id.clone(),
            Actor::Github => "github".into(),
            Actor::System => "system".into(),
        }
    }
}

/// A run locked in this change, with the sequence number its next event takes.
#[derive(Debug, Clone)]
pub struct RunCtx {
    pub org: OrgId,
    pub project: ProjectId,
    pub run: RunId,
    next_seq: i64,
    first_seq: i64,
}

/// One transaction of the write path.
pub struct Change {
    pub(super) tx: Transaction<'static, Postgres>,
    pub(super) actor: Actor,
    runs: HashMap<RunId, RunCtx>,
    /// The smallest delay of a wake written for another process to see.
    notify_delay: Option<Duration>,
    wrote_events: bool,
}

impl Change {
    pub async fn begin(pool: &PgPool, actor: Actor) -> Result<Change> {
        Ok(Change { tx: pool.begin().await?, actor, runs: HashMap::new(), notify_delay: None, wrote_events: false })
    }

    pub fn actor(&self) -> &Actor {
        &self.actor
    }

    /// Locks the run's row for the rest of the transaction. Returns `None` when it does not
    /// exist in `org` (tenancy: a run of another org is simply not found).
    pub async fn lock_run(&mut self, org: OrgId, run: RunId) -> Result<Option<RunCtx>> {
        if let Some(ctx) = self.runs.get(&run) {
            return Ok(Some(ctx.clone()));
        }
        let row = sqlx::query(
            "SELECT project_id, next_seq FROM runs WHERE run_id = $1 AND org_id = $2 FOR UPDATE",
        )
        .bind(run)
        .bind(org)
        .fetch_optional(&mut *self.tx)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let seq: i64 = row.get("next_seq");
        let ctx = RunCtx { org, project: row.get("project_id"), run, next_seq: seq, first_seq: seq };
        self.runs.insert(run, ctx.clone());
        Ok(Some(ctx))
    }

    /// Locks many runs at once, in id order so that two batches never deadlock. Runs of
    /// unknown ids are left out.
    pub async fn lock_runs(&mut self, runs: &[RunId]) -> Result<Vec<RunCtx>> {
        let ids: Vec<uuid::Uuid> = runs.iter().filter(|r| !self.runs.contains_key(r)).map(|r| r.0).collect();
        let rows = sqlx::query(
            "SELECT run_id, org_id, project_id, next_seq FROM runs WHERE run_id = ANY($1) ORDER BY run_id FOR UPDATE",
        )
        .bind(&ids)
        .fetch_all(&mut *self.tx)
        .await?;
        for row in rows {
            let seq: i64 = row.get("next_seq");
            let run: RunId = row.get("run_id");
            let ctx = RunCtx { org: row.get("org_id"), project: row.get("project_id"), run, next_seq: seq, first_seq: seq };
            self.runs.insert(run, ctx);
        }
        Ok(runs.iter().filter_map(|r| self.runs.get(r).cloned()).collect())
    }

    /// Registers a run created in this transaction as locked (its row is new, so no one else
    /// can see it until commit).
    pub(super) fn adopt_new_run(&mut self, org: OrgId, project: ProjectId, run: RunId) -> RunCtx {
        let ctx = RunCtx { org, project, run, next_seq: 1, first_seq: 1 };
        self.runs.insert(run, ctx.clone());
        ctx
    }

    pub(super) fn locked(&self, run: RunId) -> Result<&RunCtx> {
        self.runs
            .get(&run)
            .ok_or_else(|| StoreError::Invalid(format!("write to {run} without its row lock")))
    }

    /// The sequence number the next event of `run` will take.
    pub(super) fn peek_seq(&self, run: RunId) -> Result<i64> {
        Ok(self.locked(run)?.next_seq)
    }

    /// Appends a run event; returns its sequence number.
    pub(super) async fn event(
        &mut self,
        run: RunId,
        kind: &str,
        step: Option<(StepId, &str)>,
        attrs: Value,
    ) -> Result<i64> {
        let ctx = self.runs.get_mut(&run).ok_or_else(|| StoreError::Invalid(format!("event on {run} without its row lock")))?;
        let seq = ctx.next_seq;
        ctx.next_seq += 1;
        self.wrote_events = true;
        let (org, project) = (ctx.org, ctx.project);
        sqlx::query(
            "INSERT INTO run_events (org_id, project_id, run_id, seq, kind, step_id, node, attrs) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(org)
        .bind(project)
        .bind(run)
        .bind(seq)
        .bind(kind)
        .bind(step.map(|s| s.0))
        .bind(step.map(|s| s.1))
        .bind(attrs)
        .execute(&mut *self.tx)
        .await?;
        Ok(seq)
    }

    /// Writes an audit entry for this change's actor.
    pub(super) async fn audit(
        &mut self,
        org: OrgId,
        project: Option<ProjectId>,
        action: &str,
        target: (&str, String),
        detail: Value,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO audit_log (org_id, project_id, actor_kind, actor_id, action, target_kind, target_id, detail) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(org)
        .bind(project)
        .bind(self.actor.kind())
        .bind(self.actor.id())
        .bind(action)
        .bind(target.0)
        .bind(target.1)
        .bind(detail)
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    /// Writes a wake for `run` (and `step`) due after `delay`. `tell_others` says whether
    /// another process must learn of it: false only when this process will act on it itself
    /// right after commit.
    pub(crate) async fn wake(
        &mut self,
        run: RunId,
        step: Option<StepId>,
        delay: Duration,
        reason: &str,
        tell_others: bool,
    ) -> Result<()> {
        let org = self.locked(run)?.org;
        sqlx::query(
            "INSERT INTO wakes (org_id, run_id, step_id, due_at, reason) \
             VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond', $5)",
        )
        .bind(org)
        .bind(run)
        .bind(step)
        .bind(delay.as_millis() as f64)
        .bind(reason)
        .execute(&mut *self.tx)
        .await?;
        if tell_others {
            self.notify_delay = Some(self.notify_delay.map_or(delay, |d| d.min(delay)));
        }
        Ok(())
    }

    /// Writes a wake for a run this change has not locked (a parent or child run), which is
    /// always for another process to act on.
    pub(super) async fn wake_other(&mut self, org: OrgId, run: RunId, reason: &str) -> Result<()> {
        sqlx::query("INSERT INTO wakes (org_id, run_id, due_at, reason) VALUES ($1, $2, now(), $3)")
            .bind(org)
            .bind(run)
            .bind(reason)
            .execute(&mut *self.tx)
            .await?;
        self.notify_delay = Some(Duration::ZERO);
        Ok(())
    }

    /// Deletes the wakes still pending for a step that has finished.
    pub(super) async fn drop_step_wakes(&mut self, step: StepId) -> Result<()> {
        sqlx::query("DELETE FROM wakes WHERE step_id = $1").bind(step).execute(&mut *self.tx).await?;
        Ok(())
    }

    /// Asks every listener to look again without writing a wake (a host may claim a step
    /// that became ready).
    pub(crate) fn notify_now(&mut self) {
        self.notify_delay = Some(Duration::ZERO);
    }

    /// Stores the advanced sequence counters and commits, with one `NOTIFY` when a wake was
    /// written for another process or events were appended (the streams follow them).
    pub async fn commit(mut self) -> Result<()> {
        for ctx in self.runs.values() {
            if ctx.next_seq != ctx.first_seq {
                sqlx::query("UPDATE runs SET next_seq = $2 WHERE run_id = $1")
                    .bind(ctx.run)
                    .bind(ctx.next_seq)
                    .execute(&mut *self.tx)
                    .await?;
            }
        }
        let payload = match self.notify_delay {
            Some(delay) => Some(format!("w{}", delay.as_millis())),
            None => self.wrote_events.then(|| "e".to_owned()),
        };
        if let Some(payload) = payload {
            sqlx::query("SELECT pg_notify($1, $2)").bind(NOTIFY_CHANNEL).bind(payload).execute(&mut *self.tx).await?;
        }
        self.tx.commit().await?;
        Ok(())
    }

    /// The transaction, for reads that must see this change's own writes.
    pub fn conn(&mut self) -> &mut sqlx::PgConnection {
        &mut self.tx
    }
}
