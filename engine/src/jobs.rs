//! Work an engine does for no run: sending outgoing webhook deliveries and sweeping projects
//! past their retention. The pool claims due jobs (`store::jobs`) and runs each here, outside
//! any transaction; what they write goes through the store.
//!
//! A delivery is a `POST` of the JSON body with its event type, delivery id and signature in
//! headers: `X-Shopfloor-Signature-256: sha256=<hex HMAC-SHA256 of the body with the
//! subscription's secret>` (the scheme GitHub uses, so receivers can check it in constant time
//! with the same code). A receiver has [`DELIVERY_TIMEOUT`] to answer; anything but a 2xx is
//! retried with backoff. Of the answer, at most [`ANSWER_READ`] bytes are read as they arrive
//! and the connection is then dropped: a receiver cannot make an engine hold what it sends.
//!
//! A delivery reaches only targets the [`Policy`] allows: its URL is checked again before each
//! send (it may predate the check, or the setting may have changed) and its name after
//! resolution, by the client's resolver (`net_guard::VettedResolver`). A refused send is a
//! failed attempt saying why, and it is not retried: the URL or its DNS points inside the
//! network, which waiting does not change and a retry would only probe again. The delivery is
//! `failed` at once; each later event's delivery is judged afresh, and an admin can replay it
//! once the name points where it should.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::db::Db;
use hmac::{Hmac, Mac};
use secrecy::ExposeSecret as _;
use sha2::Sha256;

use crate::ids::ProjectId;
use crate::net_guard::{Policy, Refused, SystemResolver, VettedResolver};
use crate::sealing::SecretKey;
use crate::store::jobs::Job;
use crate::store::webhooks_out::{self, Answer};
use crate::store::{Actor, Change, StoreError, retention};

/// How long a receiver has to answer a delivery.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// How much of a receiver's answer is read (the log keeps its first 1,000 characters, which
/// fit in 4,000 bytes of UTF-8).
pub const ANSWER_READ: usize = 4096;

/// The signature header of a delivery.
pub const SIGNATURE_HEADER: &str = "X-Shopfloor-Signature-256";

/// The HTTP client deliveries go through, with the secret key that opens the subscriptions'
/// secrets: one per engine, so it keeps connections to receivers open between deliveries.
/// Redirects are not followed (a 3xx is an answer, and a redirect could lead inside), no proxy
/// is used (a proxy would resolve the name itself, out of the resolver's sight), and names
/// resolve through a `VettedResolver` with the policy.
#[derive(Debug, Clone)]
pub struct WebhookClient {
    http: reqwest::Client,
    policy: Policy,
    key: SecretKey,
}

impl WebhookClient {
    /// A client that resolves names with the system's resolver.
    pub fn new(policy: Policy, key: SecretKey) -> Result<WebhookClient, reqwest::Error> {
        WebhookClient::with_resolver(policy, key, Arc::new(SystemResolver))
    }

    /// A client that resolves names with `resolver`, whose answers are vetted like the
    /// system's: the seam a test uses to make a public name resolve inward.
    pub fn with_resolver(policy: Policy, key: SecretKey, resolver: Arc<dyn reqwest::dns::Resolve>) -> Result<WebhookClient, reqwest::Error> {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(VettedResolver::new(resolver, policy)))
            .connect_timeout(DELIVERY_TIMEOUT)
            .build()?;
        Ok(WebhookClient { http, policy, key })
    }
}

/// `sha256=<hex>`: the HMAC-SHA256 of `body` keyed with `secret`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    let bytes = mac.finalize().into_bytes();
    format!("sha256={}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// Runs one claimed job to its end; a failure is logged, and the job comes due again when its
/// lease runs out.
pub async fn run(db: &Db, webhooks: &WebhookClient, engine_id: &str, job: Job) {
    let result = match job.kind.as_str() {
        webhooks_out::JOB => deliver(db, webhooks, engine_id, &job).await,
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

async fn deliver(db: &Db, client: &WebhookClient, engine_id: &str, job: &Job) -> Result<(), StoreError> {
    let actor = Actor::Engine(engine_id.to_owned());
    let Some(out) = webhooks_out::prepare(db, &client.key, job.org_id, job.subject).await? else {
        let mut ch = Change::begin(db, actor).await?;
        webhooks_out::forget(&mut ch, job.subject).await?;
        return ch.commit().await;
    };
    let started = Instant::now();
    let answer = match client.policy.target(&out.url) {
        Ok(url) => send(client, url, &out).await,
        Err(refused) => Answer::Refused(format!("refused: {refused}")),
    };
    let took = started.elapsed();
    let outcome = match &answer {
        Answer::Status(status, _) if (200..300).contains(status) => "delivered",
        Answer::Status(..) => "refused",
        Answer::Error(_) => "unreachable",
        // Not sent at all: the guard refused its target ("refused" is a receiver's non-2xx).
        Answer::Refused(_) => "blocked",
    };
    crate::metrics::webhook_delivery(&out.event, outcome);
    let mut ch = Change::begin(db, actor).await?;
    let next = webhooks_out::record(&mut ch, job.org_id, out.delivery, out.attempt, &answer, took).await?;
    ch.commit().await?;
    tracing::debug!(delivery = %out.delivery, attempt = out.attempt, ?answer, retry_in = ?next, "webhook delivery");
    Ok(())
}

/// Sends one delivery to its checked URL and reads at most [`ANSWER_READ`] bytes of the answer.
async fn send(client: &WebhookClient, url: reqwest::Url, out: &webhooks_out::Outgoing) -> Answer {
    let sent = client
        .http
        .post(url)
        .timeout(DELIVERY_TIMEOUT)
        .header("Content-Type", "application/json")
        .header("User-Agent", "shopfloor-webhooks")
        .header("X-Shopfloor-Event", &out.event)
        .header("X-Shopfloor-Delivery", out.delivery.to_string())
        .header(SIGNATURE_HEADER, signature(out.secret.expose_secret(), &out.body))
        .body(out.body.clone())
        .send()
        .await;
    let mut response = match sent {
        Ok(response) => response,
        Err(e) => {
            return match refusal(&e) {
                Some(refused) => Answer::Refused(format!("refused: {refused}")),
                None => Answer::Error(error_words(&e)),
            };
        }
    };
    let status = response.status().as_u16();
    let mut head = Vec::with_capacity(ANSWER_READ);
    // A body that fails or times out midway still leaves its status and what came of it.
    while head.len() < ANSWER_READ {
        match response.chunk().await {
            Ok(Some(chunk)) => head.extend_from_slice(&chunk[..chunk.len().min(ANSWER_READ - head.len())]),
            Ok(None) | Err(_) => break,
        }
    }
    // Dropping the response closes the connection instead of draining the rest into the pool.
    drop(response);
    Answer::Status(status, String::from_utf8_lossy(&head).into_owned())
}

/// The resolver's refusal, when that is why a send failed.
fn refusal(e: &reqwest::Error) -> Option<&Refused> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(refused) = s.downcast_ref::<Refused>() {
            return Some(refused);
        }
        source = s.source();
    }
    None
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

async fn sweep(db: &Db, engine_id: &str, job: &Job) -> Result<(), StoreError> {
    let swept = retention::sweep(db, Actor::Engine(engine_id.to_owned()), job.org_id, ProjectId(job.subject), retention::BATCH).await?;
    if swept.runs > 0 || swept.deliveries > 0 || swept.partitions > 0 {
        tracing::info!(project.id = %job.subject, runs = swept.runs, deliveries = swept.deliveries, partitions = swept.partitions, batches = swept.batches, "retention sweep");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_githubs_scheme() {
        // The example of GitHub's "Validating webhook deliveries".
        assert_eq!(signature(b"It's a Secret to Everybody", b"Hello, World!"), "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17");
    }
}
