//! Prometheus metrics: the one registry of a process and every metric it holds.
//!
//! The registry is process-wide (`METRICS`), so `shopfloor serve` shows its HTTP server's and
//! its engine's figures on one `/metrics`. Counters move only when what they count has
//! committed: a `Change` gathers what it did in a [`Tally`] and hands it over after its
//! `COMMIT` succeeds, so a rolled-back change counts nothing. Two families are read from the
//! database at each scrape instead ([`render`]): running runs by substate and admission queue
//! depths, each one indexed query; every process that serves `/metrics` reports the same
//! figures for them (aggregate with `max`, not `sum`).
//!
//! No label carries tenant data: routes are templates (`/api/v1/orgs/{org}/…`), queues are
//! named by kind, webhook events by their type. The scrape is unauthenticated.

use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::db::Db;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The content type of [`render`]'s answer (OpenMetrics text, which Prometheus scrapes).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepOutcomeLabels {
    pub kind: String,
    pub outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunLabels {
    pub status: String,
    pub substate: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    pub queue: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    pub route: String,
    pub status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub method: String,
    pub route: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventOutcomeLabels {
    pub event: String,
    pub outcome: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms to about 33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

fn duration_histogram() -> Histogram {
    // 10 ms to about 11 h.
    Histogram::new(exponential_buckets(0.01, 2.0, 22))
}

/// Every metric of the process.
pub struct Metrics {
    registry: Registry,
    pub wakes_claimed: Counter,
    pub wake_latency: Histogram,
    pub steps_started: Family<KindLabels, Counter>,
    pub steps_finished: Family<StepOutcomeLabels, Counter>,
    pub step_duration: HistogramFamily<KindLabels>,
    pub lease_expiries: Counter,
    pub runs_started: Counter,
    pub runs_finished: Family<StatusLabels, Counter>,
    pub runs: Family<RunLabels, Gauge>,
    pub queue_waiting: Family<QueueLabels, Gauge>,
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_latency: HistogramFamily<RouteLabels>,
    pub github_webhooks: Family<EventOutcomeLabels, Counter>,
    pub webhook_deliveries: Family<EventOutcomeLabels, Counter>,
    pub spend_usd: Counter<f64, AtomicU64>,
    pub scrape_errors: Counter,
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("shopfloor");
        let m = Metrics {
            registry: Registry::default(),
            wakes_claimed: Counter::default(),
            wake_latency: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            steps_started: Family::default(),
            steps_finished: Family::default(),
            step_duration: Family::new_with_constructor(duration_histogram),
            lease_expiries: Counter::default(),
            runs_started: Counter::default(),
            runs_finished: Family::default(),
            runs: Family::default(),
            queue_waiting: Family::default(),
            http_requests: Family::default(),
            http_latency: Family::new_with_constructor(latency_histogram),
            github_webhooks: Family::default(),
            webhook_deliveries: Family::default(),
            spend_usd: Counter::default(),
            scrape_errors: Counter::default(),
        };
        registry.register("wakes_claimed", "Wakes claimed by this process's engine and acted on (committed)", m.wakes_claimed.clone());
        registry.register("wake_latency_seconds", "From a wake's due time to its claim", m.wake_latency.clone());
        registry.register("steps_started", "Steps moved to running, by step kind", m.steps_started.clone());
        registry.register("steps_finished", "Steps ended, by step kind and outcome (succeeded, failed, cancelled)", m.steps_finished.clone());
        registry.register("step_duration_seconds", "From a step's start to its end, by step kind", m.step_duration.clone());
        registry.register("lease_expiries", "Steps taken back from a holder whose lease lapsed (lease_expired)", m.lease_expiries.clone());
        registry.register("runs_started", "Runs submitted", m.runs_started.clone());
        registry.register("runs_finished", "Runs ended, by status", m.runs_finished.clone());
        registry.register("runs", "Running runs by substate, read from the database at scrape", m.runs.clone());
        registry.register("admission_waiting", "Runs waiting in admission lines, by kind of line, read at scrape", m.queue_waiting.clone());
        registry.register("http_requests", "HTTP requests, by method, matched route template and status", m.http_requests.clone());
        registry.register("http_request_duration_seconds", "HTTP request latency to the response head, by method and route template", m.http_latency.clone());
        registry.register("github_webhooks", "GitHub webhook deliveries received, by event and outcome", m.github_webhooks.clone());
        registry.register("webhook_deliveries", "Outgoing webhook delivery attempts, by event and outcome", m.webhook_deliveries.clone());
        registry.register("spend_usd", "Spend recorded (USD), as session reports and the test executor record it", m.spend_usd.clone());
        registry.register("scrape_errors", "Scrapes whose database figures could not be read", m.scrape_errors.clone());
        Metrics { registry, ..m }
    }
}

/// The process's metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// What one `Change` did that metrics count, handed over when it commits.
#[derive(Debug, Default)]
pub struct Tally {
    steps_started: Vec<String>,
    /// (kind, outcome, seconds since the step started when known).
    steps_finished: Vec<(String, &'static str, Option<f64>)>,
    lease_expiries: u64,
    runs_started: u64,
    runs_finished: Vec<&'static str>,
    spend_usd: f64,
}

impl Tally {
    pub fn step_started(&mut self, kind: &str) {
        self.steps_started.push(kind.to_owned());
    }

    pub fn step_finished(&mut self, kind: &str, outcome: &'static str, took: Option<f64>) {
        self.steps_finished.push((kind.to_owned(), outcome, took));
    }

    pub fn lease_expired(&mut self) {
        self.lease_expiries += 1;
    }

    pub fn run_started(&mut self) {
        self.runs_started += 1;
    }

    pub fn run_finished(&mut self, status: &'static str) {
        self.runs_finished.push(status);
    }

    pub fn spend(&mut self, usd: f64) {
        self.spend_usd += usd;
    }

    /// Counts what the committed change did.
    pub fn committed(self) {
        let m = &*METRICS;
        for kind in self.steps_started {
            m.steps_started.get_or_create(&KindLabels { kind }).inc();
        }
        for (kind, outcome, took) in self.steps_finished {
            if let Some(s) = took {
                m.step_duration.get_or_create(&KindLabels { kind: kind.clone() }).observe(s.max(0.0));
            }
            m.steps_finished.get_or_create(&StepOutcomeLabels { kind, outcome: outcome.to_owned() }).inc();
        }
        m.lease_expiries.inc_by(self.lease_expiries);
        m.runs_started.inc_by(self.runs_started);
        for status in self.runs_finished {
            m.runs_finished.get_or_create(&StatusLabels { status: status.to_owned() }).inc();
        }
        if self.spend_usd > 0.0 {
            m.spend_usd.inc_by(self.spend_usd);
        }
    }
}

/// Wakes an engine claimed in a committed change, with how late each was (seconds past due).
pub fn wakes_claimed(lateness: &[f64]) {
    let m = &*METRICS;
    m.wakes_claimed.inc_by(lateness.len() as u64);
    for s in lateness {
        m.wake_latency.observe(s.max(0.0));
    }
}

/// One HTTP request answered. `route` is the matched route's template, never the raw path.
pub fn http_request(method: &str, route: &str, status: u16, took: Duration) {
    let m = &*METRICS;
    m.http_requests.get_or_create(&HttpLabels { method: method.to_owned(), route: route.to_owned(), status: status.to_string() }).inc();
    m.http_latency.get_or_create(&RouteLabels { method: method.to_owned(), route: route.to_owned() }).observe(took.as_secs_f64());
}

/// One GitHub webhook delivery received and answered.
pub fn github_webhook(event: &str, outcome: &str) {
    METRICS.github_webhooks.get_or_create(&EventOutcomeLabels { event: event.to_owned(), outcome: outcome.to_owned() }).inc();
}

/// One attempt of an outgoing webhook delivery.
pub fn webhook_delivery(event: &str, outcome: &str) {
    METRICS.webhook_deliveries.get_or_create(&EventOutcomeLabels { event: event.to_owned(), outcome: outcome.to_owned() }).inc();
}

/// Running runs by substate in one query over the partial index of running runs and each
/// run's open steps (`steps_by_run`). The substate is the one `substate::derive` gives, to the
/// precision one query allows: it does not look at hosts, so an unroutable step counts as
/// `waiting_for_agent`.
const RUNS_BY_SUBSTATE: &str = "\
SELECT CASE
         WHEN w.hold = 'lease' THEN 'awaiting_lease'
         WHEN w.hold = 'org_cap' THEN 'queued'
         WHEN w.hold = 'throttle' THEN 'sleeping'
         WHEN w.hold IS NOT NULL THEN 'held'
         WHEN o.signal THEN 'awaiting_signal'
         WHEN o.executing THEN 'executing'
         WHEN o.agent THEN 'waiting_for_agent'
         WHEN o.child THEN 'awaiting_child'
         WHEN o.sleeping THEN 'sleeping'
         ELSE 'queued'
       END AS substate, count(*)
FROM runs r
LEFT JOIN admission_waits w ON w.run_id = r.run_id
LEFT JOIN LATERAL (
  SELECT bool_or(s.state = 'waiting' AND s.kind <> 'workflow') AS signal,
         bool_or(s.state IN ('leased', 'running')
                 OR (s.state = 'pending' AND s.kind <> 'crew' AND coalesce(s.not_before, now()) <= now())) AS executing,
         bool_or(s.state = 'pending' AND s.kind = 'crew' AND coalesce(s.not_before, now()) <= now()) AS agent,
         bool_or(s.state = 'waiting' AND s.kind = 'workflow') AS child,
         bool_or(s.state = 'pending' AND s.not_before > now()) AS sleeping
  FROM steps s WHERE s.run_id = r.run_id AND s.state IN ('pending', 'leased', 'running', 'waiting')
) o ON true
WHERE r.status = 'running'
GROUP BY 1";

/// Runs waiting in admission lines by kind of line (`org`, `group`, `throttle`, `paused`,
/// `budget`): one read of `admission_queues`, whose `waiting` is kept under each row's lock.
const QUEUE_DEPTHS: &str = "SELECT split_part(queue, ':', 1) AS kind, sum(waiting)::bigint FROM admission_queues GROUP BY 1";

const SUBSTATES: [&str; 8] = ["queued", "executing", "waiting_for_agent", "sleeping", "awaiting_signal", "awaiting_child", "awaiting_lease", "held"];

/// Reads the scrape-time figures from the database (when the process has one).
async fn refresh(db: &Db) -> Result<(), sqlx::Error> {
    let m = &*METRICS;
    let runs: Vec<(String, i64)> = sqlx::query_as(RUNS_BY_SUBSTATE).fetch_all(db).await?;
    let queues: Vec<(String, Option<i64>)> = sqlx::query_as(QUEUE_DEPTHS).fetch_all(db).await?;
    // Every substate is shown, zero included, so a rate or an alert never sees a gap.
    for substate in SUBSTATES {
        let n = runs.iter().find(|(s, _)| s == substate).map_or(0, |(_, n)| *n);
        m.runs.get_or_create(&RunLabels { status: "running".into(), substate: substate.into() }).set(n);
    }
    m.queue_waiting.clear();
    for (queue, waiting) in queues {
        m.queue_waiting.get_or_create(&QueueLabels { queue }).set(waiting.unwrap_or(0));
    }
    Ok(())
}

/// The process's metrics in the OpenMetrics text format, with the database's figures read now.
pub async fn render(db: Option<&Db>) -> String {
    if let Some(db) = db {
        if let Err(e) = refresh(db).await {
            METRICS.scrape_errors.inc();
            tracing::warn!(error = %e, "cannot read the database figures for /metrics");
        }
    }
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &METRICS.registry) {
        tracing::error!(error = %e, "cannot encode the metrics");
    }
    out
}
