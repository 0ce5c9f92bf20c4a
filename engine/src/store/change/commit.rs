//! A change's commit: the admission lines its ended runs leave handed on, its buffered events
//! (with the outgoing webhook deliveries they make), audit entries and a webhook delivery's
//! outcome written, at most one `NOTIFY`, then the event log. Apart from `Change` itself, so
//! that what a commit calls (`admission::lines`, `webhooks_out`) may use a `Change` without a
//! circle.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Change, NOTIFY_CHANNEL};
use crate::db::Db;
use crate::event_log;
use crate::store::Result;
use crate::store::admission::release;
use crate::store::events_notice::EventsNotice;
use crate::store::webhooks_out::DELIVERIES_CTE;

/// A delivery's outcome, as stored by [`Change::finish_delivery`].
const OUTCOME_SQL: &str = "UPDATE github_deliveries SET outcome = $2, detail = $3 WHERE delivery_id = $1";
/// The same inside the events' statement, after its twenty parameters.
const OUTCOME_CTE: &str = ", o AS (UPDATE github_deliveries SET outcome = $22, detail = $23 WHERE delivery_id = $21)";

impl Change {
    /// Inserts the buffered events (with the outgoing webhook deliveries they make) and audit
    /// entries in one statement, which also sends the change's notification: `notice` when
    /// the statement made no delivery, `on_delivery` when it did (a delivery is a job due now
    /// for whichever engine sends it). A webhook delivery's outcome is written by it too.
    /// Answers whether it made a delivery, and the database's clock as the statement ran.
    async fn flush(&mut self, notice: Option<&str>, on_delivery: &str) -> Result<(bool, DateTime<Utc>)> {
        let (e, a) = (std::mem::take(&mut self.events), std::mem::take(&mut self.audits));
        let outcome = self.delivery_outcome.take();
        let outcome_cte = if outcome.is_some() { OUTCOME_CTE } else { "" };
        // The rows go in the order given (no join to reorder them): event ids, which the
        // streams order by, follow the events' sequence numbers. Each carries its run's
        // `created_at` (known from the run's lock), the partition key. Every event names this
        // change's actor: the engine's moves are audited by it.
        let sql = format!(
            "WITH e AS (INSERT INTO run_events (org_id, project_id, run_id, run_created_at, seq, kind, step_id, node, attrs, actor) \
             SELECT *, $10 FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $9::timestamptz[], $4::bigint[], $5::text[], $6::uuid[], $7::text[], $8::jsonb[]) \
             RETURNING org_id, project_id, run_id, kind, event_id), \
             a AS (INSERT INTO audit_log (org_id, project_id, actor_kind, actor_id, action, target_kind, target_id, detail) \
             SELECT o, p, $11, $12, a, tk, ti, d \
             FROM UNNEST($13::uuid[], $14::uuid[], $15::text[], $16::text[], $17::text[], $18::jsonb[]) AS u(o, p, a, tk, ti, d)) \
             {DELIVERIES_CTE}{outcome_cte} \
             SELECT n > 0, CASE WHEN n > 0 THEN pg_notify('{NOTIFY_CHANNEL}', $19)::text \
                                WHEN $20::text IS NOT NULL THEN pg_notify('{NOTIFY_CHANNEL}', $20)::text END, \
                    clock_timestamp() \
             FROM (SELECT count(*) AS n FROM d) c"
        );
        let mut query = sqlx::query_as(&sql)
            .bind(e.iter().map(|x| x.org.0).collect::<Vec<_>>())
            .bind(e.iter().map(|x| x.project.0).collect::<Vec<_>>())
            .bind(e.iter().map(|x| x.run.0).collect::<Vec<_>>())
            .bind(e.iter().map(|x| x.seq).collect::<Vec<_>>())
            .bind(e.iter().map(|x| x.kind.as_str()).collect::<Vec<_>>())
            .bind(e.iter().map(|x| x.step.map(|s| s.0)).collect::<Vec<_>>())
            .bind(e.iter().map(|x| x.node.as_deref()).collect::<Vec<_>>())
            .bind(e.iter().map(|x| &x.attrs).collect::<Vec<_>>())
            .bind(e.iter().map(|x| x.run_created_at).collect::<Vec<_>>())
            .bind(self.actor.label())
            .bind(self.actor.kind())
            .bind(self.actor.id())
            .bind(a.iter().map(|x| x.org.0).collect::<Vec<_>>())
            .bind(a.iter().map(|x| x.project.map(|p| p.0)).collect::<Vec<_>>())
            .bind(a.iter().map(|x| x.action.as_str()).collect::<Vec<_>>())
            .bind(a.iter().map(|x| x.target_kind.as_str()).collect::<Vec<_>>())
            .bind(a.iter().map(|x| x.target_id.as_str()).collect::<Vec<_>>())
            .bind(a.iter().map(|x| &x.detail).collect::<Vec<_>>())
            .bind(on_delivery)
            .bind(notice);
        if let Some(o) = outcome {
            query = query.bind(o.id).bind(o.outcome).bind(o.detail);
        }
        let (delivered, _, clock): (bool, Option<String>, DateTime<Utc>) = query.fetch_one(&mut *self.tx).await?;
        if event_log::enabled() {
            self.written.extend(e);
        }
        Ok((delivered, clock))
    }

    /// The notification's words for a wake due after `delay`, if any: `w<ms>`, then the runs
    /// whose transcripts grew.
    fn words(&self, delay: Option<Duration>) -> Vec<String> {
        let wake = delay.map(|d| format!("w{}", d.as_millis()));
        wake.into_iter().chain(self.transcripts.iter().map(|run| format!("l{run}"))).collect()
    }

    /// Writes the buffered events and audit entries and commits, with at most one `NOTIFY`:
    /// when a wake was written for another process, a transcript grew, or (at most every
    /// `EVENTS_NOTICE_INTERVAL` per process) events were appended.
    pub async fn commit(self) -> Result<()> {
        self.commit_clocked().await.map(|_| ())
    }

    /// Commits as [`commit`](Change::commit) does, answering the database's clock as the
    /// statement that wrote the change's events and audit entries ran, its last before
    /// `COMMIT`; `None` when it wrote none. Where `make bench` starts a wake's latency, as it
    /// starts the peer's (a clock read just before its `COMMIT`).
    pub async fn commit_clocked(mut self) -> Result<Option<DateTime<Utc>>> {
        // Queue rows are locked last, so that a change never holds one while it waits for a
        // run's lock or takes a stronger lock on the same row later.
        if !self.releases.is_empty() {
            let releases = std::mem::take(&mut self.releases);
            release(&mut self, releases).await?;
        }
        let wrote_events = !self.events.is_empty();
        let mut words = self.words(self.notify_delay);
        // Any notice makes the streams read; only a change with nothing else to say needs an `e`.
        let mut owes_events = wrote_events && words.is_empty() && !EventsNotice::take_now();
        if wrote_events && words.is_empty() && !owes_events {
            words.push("e".to_owned());
        }
        let notice = (!words.is_empty()).then(|| words.join(" "));
        let clock = if self.events.is_empty() && self.audits.is_empty() {
            if let Some(o) = self.delivery_outcome.take() {
                sqlx::query(OUTCOME_SQL).bind(o.id).bind(o.outcome).bind(o.detail).execute(&mut *self.tx).await?;
            }
            if let Some(notice) = &notice {
                sqlx::query("SELECT pg_notify($1, $2)").bind(NOTIFY_CHANNEL).bind(notice).execute(&mut *self.tx).await?;
            }
            None
        } else {
            // The rows and the notification in one round trip.
            let on_delivery = self.words(Some(Duration::ZERO)).join(" ");
            let (delivered, at) = self.flush(notice.as_deref(), &on_delivery).await?;
            if delivered {
                // The delivery's `w0` told the streams too.
                owes_events = false;
            }
            Some(at)
        };
        Db::commit(self.tx).await?;
        if owes_events {
            EventsNotice::owe(&self.pool);
        }
        // The event log sees only what committed, and is written outside the transaction.
        event_log::emit(self.written.iter().map(|e| event_log::Event {
            org: e.org,
            project: e.project,
            run: e.run,
            kind: &e.kind,
            node: e.node.as_deref(),
            attrs: &e.attrs,
            workflow_version: e.version,
            traceparent: e.traceparent.as_deref(),
            extra: &e.extra,
        }));
        std::mem::take(&mut self.tally).committed();
        Ok(clock)
    }
}
