//! Work an engine does for no run: sending outgoing webhook deliveries and sweeping projects
//! past their retention. The pool claims due jobs (`store::jobs`) and runs each here, outside
//! any transaction; what they write goes through the store.
//!
//! A delivery is a `POST` of the JSON body with its event type, delivery id and signature in
//! headers: `X-Shopfloor-Signature-256: sha256=<hex HMAC-SHA256 of the body with the
//! subscription's secret>` (the scheme GitHub uses, so receivers can check it in constant time
//! with the same code). A receiver has [`DELIVERY_TIMEOUT`] to answer; anything but a 2xx is
//! retried with backoff.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use sqlx::PgPool;

use crate::ids::ProjectId;
use crate::store::jobs::Job;
use crate::store::webhooks_out::{self, Answer};
use crate::store::{retention, Actor, Change, StoreError};

/// How long a receiver has to answer a delivery.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// The signature header of a delivery.
pub const SIGNATURE_HEADER: &str = "X-Shopfloor-Signature-256";

/// One HTTP client per process: it keeps connections to receivers open between deliveries.
static CLIENT: LazyLock<reqwest::Client> = LazyLock::new(|| {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(DELIVERY_TIMEOUT)
        .build()
        .unwrap_or_default()
});

/// `sha256=<hex>`: the HMAC-SHA256 of `body` keyed with `secret`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(body);
    let bytes = mac.finalize().into_bytes();
    format!("sha256={}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// Runs one claimed job to its end; a failure is logged, and the job comes due again when its
/// lease runs out.
pub async fn run(db: &PgPool, engine_id: &str, job: Job) {
    let result = match job.kind.as_str() {
        webhooks_out::JOB => deliver(db, &CLIENT, engine_id, &job).await,
        retention::JOB => sweep(db, engine_id, &job).await,
        other => {
            tracing::warn!(job.kind = other, "unknown job kind; leaving it");
            Ok(())
        }
    };
    if let Err(e) = result {
        tracing::warn!(job.kind = %job.kind, job.subject = %job.subject, error = %e, "job failed; it comes due again when its lease ends");
    }
}

async fn deliver(db: &PgPool, client: &reqwest::Client, engine_id: &str, job: &Job) -> Result<(), StoreError> {
    let actor = Actor::Engine(engine_id.to_owned());
    let Some(out) = webhooks_out::prepare(db, job.org_id, job.subject).await? else {
        let mut ch = Change::begin(db, actor).await?;
        webhooks_out::forget(&mut ch, job.subject).await?;
        return ch.commit().await;
    };
    let started = Instant::now();
    let sent = client
        .post(&out.url)
        .timeout(DELIVERY_TIMEOUT)
        .header("Content-Type", "application/json")
        .header("User-Agent", "shopfloor-webhooks")
        .header("X-Shopfloor-Event", &out.event)
        .header("X-Shopfloor-Delivery", out.delivery.to_string())
        .header(SIGNATURE_HEADER, signature(&out.secret, &out.body))
        .body(out.body.clone())
        .send()
        .await;
    let answer = match sent {
        Ok(response) => {
            let status = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            Answer::Status(status, text)
        }
        Err(e) => Answer::Error(error_words(&e)),
    };
    let took = started.elapsed();
    let outcome = match &answer {
        Answer::Status(status, _) if (200..300).contains(status) => "delivered",
        Answer::Status(..) => "refused",
        Answer::Error(_) => "unreachable",
    };
    crate::metrics::webhook_delivery(&out.event, outcome);
    let mut ch = Change::begin(db, actor).await?;
    let next = webhooks_out::record(&mut ch, job.org_id, out.delivery, out.attempt, &answer, took).await?;
    ch.commit().await?;
    tracing::debug!(delivery = %out.delivery, attempt = out.attempt, ?answer, retry_in = ?next, "webhook delivery");
    Ok(())
}

/// The error of a delivery that got no answer, in a few words (never the body or headers).
fn error_words(e: &reqwest::Error) -> String {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_request() {
        "request failed"
    } else {
        "failed"
    };
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(e);
    let mut detail = String::new();
    while let Some(s) = source {
        detail = s.to_string();
        source = s.source();
    }
    if detail.is_empty() { what.to_owned() } else { format!("{what}: {detail}") }
}

async fn sweep(db: &PgPool, engine_id: &str, job: &Job) -> Result<(), StoreError> {
    let swept = retention::sweep(db, Actor::Engine(engine_id.to_owned()), job.org_id, ProjectId(job.subject), retention::BATCH).await?;
    if swept.runs > 0 || swept.deliveries > 0 || swept.events > 0 {
        tracing::info!(project.id = %job.subject, runs = swept.runs, deliveries = swept.deliveries, events = swept.events, batches = swept.batches, "retention sweep");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_githubs_scheme() {
        // The example of GitHub's "Validating webhook deliveries".
        assert_eq!(
            signature("It's a Secret to Everybody", b"Hello, World!"),
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        );
    }
}
