//! Outgoing webhooks: per-project subscriptions, their deliveries and the log of attempts.
//!
//! A delivery is written in the change that writes its event (`Change::commit` inserts the
//! run events, and with them, in the same statement, a delivery and a job for each
//! subscription of the project whose filters name the event; dry runs and child runs announce
//! nothing). An engine claims the job, sends the delivery outside any transaction
//! (`crate::jobs`), and records the attempt here: delivered on a 2xx, otherwise due again after a backoff (1 s,
//! 4 s, 16 s, … an hour) until it is given up after [`rules::WEBHOOK_ATTEMPTS`] attempts.
//! A replay sends a delivery's body again as a new delivery.
//!
//! A subscription's URL must be a target the [`Policy`] allows (`crate::net_guard`): it is
//! checked here when it is made, and again by the engine at each send, after resolution.
//!
//! Its secret is stored sealed with the service's secret key (`crate::sealing`), bound to the
//! subscription: it is shown once, when the subscription is made, and opened only to sign a
//! delivery. A database copy alone does not let anyone sign deliveries a receiver would trust.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::RngCore;
use secrecy::SecretBox;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use uuid::Uuid;

use super::{Change, Result, StoreError, cap, jobs};
use crate::admission as rules;
use crate::ids::{OrgId, ProjectId, RunId, StepId};
use crate::net_guard::{Policy, Refused};
use crate::sealing::{Sealed, SecretKey};

/// The job kind of a delivery.
pub const JOB: &str = "webhook";

/// What `Change::commit` adds to its insert of run events (`e`, returning `org_id`,
/// `project_id`, `run_id`, `kind`, `event_id`): the deliveries (`d`) and their jobs. The
/// commit counts `d` to notify the engines when there is one.
pub(super) const DELIVERIES_CTE: &str = ", d AS (INSERT INTO webhook_deliveries (org_id, project_id, delivery_id, subscription_id, event, run_id, event_id) \
        SELECT e.org_id, e.project_id, gen_random_uuid(), s.subscription_id, e.kind, e.run_id, e.event_id \
        FROM e JOIN webhook_subscriptions s ON s.project_id = e.project_id AND s.org_id = e.org_id \
        WHERE EXISTS (SELECT 1 FROM unnest(s.events) f WHERE f = e.kind OR (right(f, 1) = '*' AND starts_with(e.kind, left(f, -1)))) \
          AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = e.run_id AND (r.dry_run OR r.parent_run_id IS NOT NULL)) \
        RETURNING org_id, delivery_id), \
      j AS (INSERT INTO jobs (org_id, kind, subject, due_at) SELECT org_id, 'webhook', delivery_id, now() FROM d)";

/// A subscription, without its secret.
// The API shows it as it is (the OpenAPI document's `Webhook`): never its secret after creation.
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema), schema(as = Webhook))]
pub struct Subscription {
    #[serde(rename = "id")]
    pub subscription_id: Uuid,
    pub url: String,
    /// Event types it receives: `run.completed`, `run.*`, `step.failed`, `*`.
    pub events: Vec<String>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
}

fn check(url: &str, events: &[String], policy: Policy) -> Result<()> {
    let scheme_ok = url.starts_with("https://") || url.starts_with("http://");
    if !scheme_ok || url.chars().count() > 2048 || url.chars().any(|c| c.is_whitespace() || c.is_control()) || url.split("://").nth(1).is_none_or(str::is_empty)
    {
        return Err(StoreError::Invalid(Refused::NotHttp.to_string()));
    }
    match policy.target(url) {
        Ok(_) => {}
        Err(e @ Refused::Host { .. }) => return Err(StoreError::Invalid(format!("url must not point inside the network: {e}"))),
        Err(e) => return Err(StoreError::Invalid(e.to_string())),
    }
    if events.is_empty() || events.len() > 50 {
        return Err(StoreError::Invalid("events must name 1 to 50 event types (`run.*`, `run.failed`, `*`)".into()));
    }
    for e in events {
        let body = e.strip_suffix('*').unwrap_or(e);
        if e.len() > 100 || !body.chars().all(|c| c.is_ascii_lowercase() || c == '.' || c == '_') || (body.is_empty() && e != "*") {
            return Err(StoreError::Invalid(format!("`{}` is not an event filter (`run.*`, `run.failed`, `*`)", cap(e))));
        }
    }
    Ok(())
}

const INSERT_SUBSCRIPTION: &str = "INSERT INTO webhook_subscriptions (org_id, project_id, subscription_id, url, sealed_secret, events, created_by) \
     VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// A new subscription's place and what it sends.
pub struct NewSubscription<'a> {
    pub org: OrgId,
    pub project: ProjectId,
    pub url: &'a str,
    /// The receiver's secret; `None`: one is made.
    pub secret: Option<&'a str>,
    pub events: &'a [String],
}

/// Subscribes a URL to a project's events, when `policy` allows its target. Without a secret
/// one is made; it is returned here and never shown again: it is stored sealed with `key`.
pub async fn create(ch: &mut Change, key: &SecretKey, new: NewSubscription<'_>, policy: Policy) -> Result<(Uuid, String)> {
    let NewSubscription { org, project, url, secret, events } = new;
    check(url, events, policy)?;
    let secret = match secret {
        Some(s) if (16..=256).contains(&s.chars().count()) => s.to_owned(),
        Some(_) => return Err(StoreError::Invalid("secret must be 16 to 256 characters".into())),
        None => {
            let mut bytes = [0u8; 32];
            rand::rng().fill_bytes(&mut bytes);
            super::workflows::hex(&bytes)
        }
    };
    let id = Uuid::now_v7();
    let by = cap(&ch.actor().label());
    let sealed = key.seal(Sealed::WebhookSecret(id), secret.as_bytes());
    sqlx::query(INSERT_SUBSCRIPTION).bind(org).bind(project).bind(id).bind(url).bind(sealed).bind(events).bind(by).execute(&mut *ch.tx).await?;
    ch.audit(org, Some(project), "webhook.create", ("webhook", id.to_string()), json!({ "url": cap(url), "events": events }))?;
    Ok((id, secret))
}

const DELETE_SUBSCRIPTION: &str = "DELETE FROM webhook_subscriptions WHERE org_id = $1 AND project_id = $2 AND subscription_id = $3";

/// Removes a subscription and its deliveries.
pub async fn delete(ch: &mut Change, org: OrgId, project: ProjectId, id: Uuid) -> Result<()> {
    let gone = sqlx::query(DELETE_SUBSCRIPTION).bind(org).bind(project).bind(id).execute(&mut *ch.tx).await?;
    if gone.rows_affected() == 0 {
        return Err(StoreError::NotFound("webhook"));
    }
    ch.audit(org, Some(project), "webhook.delete", ("webhook", id.to_string()), json!({}))?;
    Ok(())
}

const REPLAY_DELIVERY: &str = "INSERT INTO webhook_deliveries (org_id, project_id, delivery_id, subscription_id, event, run_id, event_id, body, replay_of) \
     SELECT org_id, project_id, $4, subscription_id, event, run_id, event_id, body, delivery_id FROM webhook_deliveries \
     WHERE org_id = $1 AND project_id = $2 AND delivery_id = $3 RETURNING subscription_id";

/// Sends a delivery's body again, as a new delivery due now.
pub async fn replay(ch: &mut Change, org: OrgId, project: ProjectId, delivery: Uuid) -> Result<Uuid> {
    let id = Uuid::now_v7();
    let made: Option<Uuid> = sqlx::query_scalar(REPLAY_DELIVERY).bind(org).bind(project).bind(delivery).bind(id).fetch_optional(&mut *ch.tx).await?;
    let subscription = made.ok_or(StoreError::NotFound("delivery"))?;
    jobs::schedule(ch, org, JOB, id, Duration::ZERO).await?;
    ch.audit(org, Some(project), "webhook.replay", ("webhook", subscription.to_string()), json!({ "delivery": delivery, "replay": id }))?;
    Ok(id)
}

/// A delivery ready to send.
#[derive(Debug)]
pub struct Outgoing {
    pub delivery: Uuid,
    pub url: String,
    /// The subscription's secret, opened: the HMAC key of the signature.
    pub secret: SecretBox<[u8]>,
    pub event: String,
    /// The exact bytes sent and signed.
    pub body: Vec<u8>,
    /// This attempt's number (1 for the first).
    pub attempt: i32,
}

#[derive(sqlx::FromRow)]
struct Pending {
    subscription_id: Uuid,
    url: String,
    sealed_secret: Option<Vec<u8>>,
    secret: Option<String>,
    event: String,
    body: Option<Value>,
    attempts: i32,
    run_id: Option<RunId>,
    event_id: Option<i64>,
}

#[derive(sqlx::FromRow)]
struct EventLine {
    seq: i64,
    at: DateTime<Utc>,
    node: Option<String>,
    step_id: Option<StepId>,
    attrs: Value,
    org: String,
    project: String,
    workflow: String,
    version: i32,
}

/// Reads a pending delivery to send, with its subscription's secret opened by `key`; its body
/// is rendered from its event the first time and kept, so every attempt and replay sends the
/// same bytes. `None` when it is no longer pending (delivered, given up, its subscription
/// removed).
pub async fn prepare(pool: &crate::db::Db, key: &SecretKey, org: OrgId, delivery: Uuid) -> Result<Option<Outgoing>> {
    let row: Option<Pending> = sqlx::query_as(
        "SELECT s.subscription_id, s.url, s.sealed_secret, s.secret, d.event, d.body, d.attempts, d.run_id, d.event_id FROM webhook_deliveries d \
         JOIN webhook_subscriptions s ON s.subscription_id = d.subscription_id \
         WHERE d.org_id = $1 AND d.delivery_id = $2 AND d.state = 'pending'",
    )
    .bind(org)
    .bind(delivery)
    .fetch_optional(pool)
    .await?;
    let Some(p) = row else { return Ok(None) };
    let secret = opened(key, p.subscription_id, p.sealed_secret.as_deref(), p.secret)?;
    let body = match p.body {
        Some(body) => body,
        None => {
            let line: Option<EventLine> = sqlx::query_as(
                "SELECT e.seq, e.at, e.node, e.step_id, e.attrs, o.slug AS org, p.slug AS project, w.name AS workflow, r.workflow_version AS version \
                 FROM run_events e JOIN runs r ON r.run_id = e.run_id JOIN workflows w ON w.workflow_id = r.workflow_id \
                 JOIN orgs o ON o.org_id = e.org_id JOIN projects p ON p.project_id = e.project_id \
                 WHERE e.run_id = $1 AND e.event_id = $2 AND e.org_id = $3",
            )
            .bind(p.run_id)
            .bind(p.event_id)
            .bind(org)
            .fetch_optional(pool)
            .await?;
            let body = match (line, p.run_id) {
                (Some(l), Some(run)) => json!({
                    "type": p.event,
                    "at": l.at,
                    "org": l.org,
                    "project": l.project,
                    "workflow": l.workflow,
                    "version": l.version,
                    "run": run.to_string(),
                    "run_name": format!("{}:{}:{run}", l.org, l.project),
                    "seq": l.seq,
                    "node": l.node,
                    "step": l.step_id.map(|s| s.to_string()),
                    "data": l.attrs,
                }),
                // The run was deleted before its event could be sent: say what is known.
                _ => json!({ "type": p.event, "run": p.run_id.map(|r| r.to_string()), "data": {} }),
            };
            sqlx::query("UPDATE webhook_deliveries SET body = $3 WHERE org_id = $1 AND delivery_id = $2 AND body IS NULL")
                .bind(org)
                .bind(delivery)
                .bind(&body)
                .execute(pool)
                .await?;
            body
        }
    };
    let body = serde_json::to_vec(&body).map_err(|e| StoreError::Invalid(format!("delivery body: {e}")))?;
    Ok(Some(Outgoing { delivery, url: p.url, secret, event: p.event, body, attempt: p.attempts + 1 }))
}

/// A subscription's secret: opened, or as an earlier release stored it (the next start seals it).
fn opened(key: &SecretKey, id: Uuid, sealed: Option<&[u8]>, plaintext: Option<String>) -> Result<SecretBox<[u8]>> {
    match (sealed, plaintext) {
        (Some(sealed), _) => Ok(key.open(Sealed::WebhookSecret(id), sealed)?),
        (None, Some(plaintext)) => Ok(SecretBox::new(plaintext.into_bytes().into_boxed_slice())),
        // The table's check keeps one of the two.
        (None, None) => Err(StoreError::Invalid(format!("webhook {id} has no secret"))),
    }
}

/// Seals every subscription secret an earlier release stored in plaintext, clearing the
/// plaintext in the same statement; returns how many. The secrets are the same, so receivers
/// notice nothing.
pub async fn seal_plaintext(ch: &mut Change, key: &SecretKey) -> Result<usize> {
    let rows: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT subscription_id, secret FROM webhook_subscriptions WHERE sealed_secret IS NULL FOR UPDATE").fetch_all(&mut *ch.tx).await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let (ids, sealed): (Vec<Uuid>, Vec<Vec<u8>>) = rows.iter().map(|(id, plaintext)| (*id, key.seal(Sealed::WebhookSecret(*id), plaintext.as_bytes()))).unzip();
    sqlx::query(SEAL_SUBSCRIPTIONS).bind(&ids).bind(&sealed).execute(&mut *ch.tx).await?;
    Ok(rows.len())
}

/// Each subscription ($1) its sealed secret ($2, in the same order), its plaintext cleared.
const SEAL_SUBSCRIPTIONS: &str = "UPDATE webhook_subscriptions s SET sealed_secret = n.sealed, secret = NULL \
     FROM unnest($1::uuid[], $2::bytea[]) AS n (id, sealed) WHERE s.subscription_id = n.id";

/// Opens the newest sealed secret, so that a process given another secret key refuses to start
/// instead of failing every delivery (one key seals them all).
pub async fn check_opens(db: &crate::db::Db, key: &SecretKey) -> Result<()> {
    let newest: Option<(Uuid, Vec<u8>)> = sqlx::query_as(
        "SELECT subscription_id, sealed_secret FROM webhook_subscriptions WHERE sealed_secret IS NOT NULL ORDER BY subscription_id DESC LIMIT 1",
    )
    .fetch_optional(db)
    .await?;
    if let Some((id, sealed)) = newest {
        drop(key.open(Sealed::WebhookSecret(id), &sealed)?);
    }
    Ok(())
}

/// How an attempt went.
#[derive(Debug, Clone)]
pub enum Answer {
    /// The receiver answered with this status and body (the first 1000 characters).
    Status(u16, String),
    /// It did not answer: refused, timed out, a TLS or DNS failure.
    Error(String),
    /// It was not sent: its target is inside the network (`crate::net_guard`). Final: the
    /// delivery fails without further attempts (see `crate::jobs`).
    Refused(String),
}

/// Records an attempt; returns the delay until the next one, when there is one. Fenced by the
/// attempt number: a second record of the same attempt changes nothing.
pub async fn record(ch: &mut Change, org: OrgId, delivery: Uuid, attempt: i32, answer: &Answer, took: Duration) -> Result<Option<Duration>> {
    let (status, response, error) = match answer {
        Answer::Status(s, body) => (Some(i32::from(*s)), Some(body.chars().take(1000).collect::<String>()), None),
        Answer::Error(e) | Answer::Refused(e) => (None, None, Some(cap(e))),
    };
    let delivered = status.is_some_and(|s| (200..300).contains(&s));
    let retried = !delivered && !matches!(answer, Answer::Refused(_)) && attempt < rules::WEBHOOK_ATTEMPTS;
    let next = retried.then(|| rules::webhook_backoff(attempt));
    let state = match (delivered, next) {
        (true, _) => "delivered",
        (false, Some(_)) => "pending",
        (false, None) => "failed",
    };
    let updated = sqlx::query(
        "UPDATE webhook_deliveries SET attempts = $3, state = $4, last_status = $5, last_error = $6, \
                next_at = now() + $7 * interval '1 millisecond', delivered_at = CASE WHEN $4 = 'delivered' THEN now() END \
         WHERE org_id = $1 AND delivery_id = $2 AND attempts = $3 - 1 AND state = 'pending'",
    )
    .bind(org)
    .bind(delivery)
    .bind(attempt)
    .bind(state)
    .bind(status)
    .bind(error.as_deref().or(response.as_deref().filter(|_| !delivered)).map(cap))
    .bind(next.map(|d| d.as_millis() as f64))
    .execute(&mut *ch.tx)
    .await?;
    if updated.rows_affected() == 0 {
        return Ok(None);
    }
    sqlx::query("INSERT INTO webhook_attempts (org_id, delivery_id, attempt, status, response, error, duration_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)")
        .bind(org)
        .bind(delivery)
        .bind(attempt)
        .bind(status)
        .bind(response)
        .bind(error)
        .bind(i32::try_from(took.as_millis()).unwrap_or(i32::MAX))
        .execute(&mut *ch.tx)
        .await?;
    match next {
        Some(delay) => jobs::schedule(ch, org, JOB, delivery, delay).await?,
        None => jobs::done(ch, JOB, delivery).await?,
    }
    Ok(next)
}

/// A delivery job whose delivery is gone or no longer pending: nothing more to do.
pub async fn forget(ch: &mut Change, delivery: Uuid) -> Result<()> {
    jobs::done(ch, JOB, delivery).await
}

/// A delivery in the log.
// The API shows it as it is (the OpenAPI document's `WebhookDelivery`).
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema), schema(as = WebhookDelivery))]
pub struct Delivery {
    #[serde(rename = "id")]
    pub delivery_id: Uuid,
    pub event: String,
    #[serde(rename = "run")]
    #[cfg_attr(feature = "schema", schema(value_type = Option<String>))]
    pub run_id: Option<RunId>,
    /// `pending` (due, or waiting for its next attempt), `delivered`, or `failed` (given up,
    /// or refused because its target is inside the network: not retried).
    pub state: String,
    pub attempts: i32,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    /// When the next attempt is due, while pending.
    pub next_at: Option<DateTime<Utc>>,
    /// The delivery this one replays.
    pub replay_of: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub delivered_at: Option<DateTime<Utc>>,
}

/// One attempt: the receiver's answer, or why there was none.
// The API shows it as it is (the OpenAPI document's `DeliveryAttempt`).
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema), schema(as = DeliveryAttempt))]
pub struct Attempt {
    pub attempt: i32,
    pub at: DateTime<Utc>,
    pub status: Option<i32>,
    /// The first 1000 characters of the receiver's answer (at most 4 KiB of it is read).
    pub response: Option<String>,
    /// Why there was no answer: `could not connect: …`, `timed out`, or `refused: …` when
    /// the target is inside the network (`refused: NAME resolves to an internal address`).
    pub error: Option<String>,
    pub duration_ms: i32,
}

pub const DELIVERY_COLUMNS: &str = "delivery_id, event, run_id, state, attempts, last_status, last_error, next_at, replay_of, created_at, delivered_at";
