//! Traces and the event log over OTLP, end to end: a real `shopfloor api` and a real
//! `shopfloor engine` (test executor) on a test database, exporting to an OTLP/HTTP receiver
//! in this process (axum on loopback, decoding protobuf with `opentelemetry-proto`).
//!
//! A signed webhook opens a run whose steps complete. The receiver must get one trace for the
//! run: its only root is the webhook's span (exported by the API process), and every step's
//! span (exported by the engine process) is its child; the run's `trace_id` from the REST API
//! is that trace. Each run event arrives as a log record of the event log with exactly the
//! fixed key list, in the run's trace. The API's JSON log line of the delivery carries the
//! trace and span ids. Batching is shortened with the standard `OTEL_BSP_SCHEDULE_DELAY` and
//! `OTEL_BLRP_SCHEDULE_DELAY`, and every wait has a deadline.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use engine::store::{Actor, Change, workflows};
use engine::testkit::test_db;
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::Value;
use shopfloor_tests::github_fake::payloads::{self, user};
use shopfloor_tests::github_fake::{Issue, WebhookClient};
use shopfloor_tests::process::{Listening, Proc, listen, shopfloor};

use crate::support::{acme, connect_widgets, owner_token, widgets};

const SECRET: &str = "It's a Secret to Everybody";

const TRACED: &str = include_str!("../workflows/traced.yaml");

/// The event log's keys, as `engine::event_log::KEYS` fixes them (written out: the test
/// checks the contract, not the code's own list).
const KEYS: &str = "shopfloor.org shopfloor.project shopfloor.run.id shopfloor.node shopfloor.attempt
    shopfloor.outcome shopfloor.outcome.reason shopfloor.workflow.version shopfloor.duration_ms
    shopfloor.cost.usd gen_ai.request.model gen_ai.usage.input_tokens gen_ai.usage.output_tokens
    vcs.repository.url.full vcs.ref.head.name vcs.ref.head.revision";

fn fixed_keys() -> BTreeSet<&'static str> {
    KEYS.split_whitespace().collect()
}

/// What the receiver got: spans with the `shopfloor.process` of their resource, and log records.
#[derive(Default)]
struct Received {
    spans: Vec<(String, Span)>,
    logs: Vec<LogRecord>,
    /// Requests that were not `application/x-protobuf` or did not decode.
    refused: usize,
}

type Shared = Arc<Mutex<Received>>;

fn protobuf(headers: &HeaderMap) -> bool {
    headers.get("content-type").and_then(|v| v.to_str().ok()) == Some("application/x-protobuf")
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v| v.value.as_ref())
}

fn text(v: Option<&any_value::Value>) -> Option<&str> {
    match v {
        Some(any_value::Value::StringValue(s)) => Some(s),
        _ => None,
    }
}

/// Answers one OTLP/HTTP export: a protobuf `Req` is handed to `keep`, anything else is
/// refused and counted.
fn export<Req: Message + Default, Resp: Message + Default>(
    got: &Shared, headers: &HeaderMap, body: Bytes, keep: impl FnOnce(&mut Received, Req),
) -> (StatusCode, Vec<u8>) {
    let decoded = Req::decode(body).ok().filter(|_| protobuf(headers));
    let mut got = got.lock().unwrap();
    let Some(req) = decoded else {
        got.refused += 1;
        return (StatusCode::BAD_REQUEST, Vec::new());
    };
    keep(&mut got, req);
    (StatusCode::OK, Resp::default().encode_to_vec())
}

async fn traces(State(got): State<Shared>, headers: HeaderMap, body: Bytes) -> (StatusCode, Vec<u8>) {
    export::<ExportTraceServiceRequest, ExportTraceServiceResponse>(&got, &headers, body, |got, req| {
        for rs in req.resource_spans {
            let process = rs.resource.as_ref().and_then(|r| text(attr(&r.attributes, "shopfloor.process"))).unwrap_or_default().to_owned();
            for ss in rs.scope_spans {
                got.spans.extend(ss.spans.into_iter().map(|s| (process.clone(), s)));
            }
        }
    })
}

async fn logs(State(got): State<Shared>, headers: HeaderMap, body: Bytes) -> (StatusCode, Vec<u8>) {
    export::<ExportLogsServiceRequest, ExportLogsServiceResponse>(&got, &headers, body, |got, req| {
        for rl in req.resource_logs {
            for sl in rl.scope_logs {
                got.logs.extend(sl.log_records);
            }
        }
    })
}

/// The OTLP/HTTP receiver on a loopback port; returns its base URL.
async fn receiver(got: Shared) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().route("/v1/traces", post(traces)).route("/v1/logs", post(logs)).with_state(got);
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// `shopfloor <args>` exporting to the receiver at `otlp`, batching briefly; its errors to `stderr`.
fn exporting(args: &[&str], db_url: &str, otlp: &str, stderr: &Path) -> Command {
    let mut cmd = shopfloor(args, db_url);
    cmd.env("SHOPFLOOR_DRAIN_SECS", "2")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp)
        .env("OTEL_SERVICE_NAME", "shopfloor-test")
        .env("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_BLRP_SCHEDULE_DELAY", "100")
        .stderr(std::fs::File::create(stderr).unwrap());
    cmd
}

/// Waits until `check` holds, up to `limit`; panics with `what` otherwise.
async fn until<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn hex(bytes: &[u8]) -> String {
    data_encoding::HEXLOWER.encode(bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_run_is_one_trace_and_its_events_are_log_records() {
    let got: Shared = Arc::default();
    let otlp = receiver(got.clone()).await;
    let db = test_db().await;
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    let acme = acme(&mut ch).await;
    workflows::put_version(&mut ch, acme.org, acme.project, "traced", TRACED).await.unwrap();
    connect_widgets(&mut ch, acme.org, acme.project).await;
    let token = owner_token(&mut ch, &acme, "test", 1).await;
    ch.commit().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let api_log = dir.path().join("api.log");
    let mut api = exporting(&["api", "--log", "info"], &db.url, &otlp, &api_log);
    api.env("SHOPFLOOR_GITHUB_WEBHOOK_SECRET", SECRET);
    let Listening { proc: mut api, base } = listen(api).await;
    let mut engine = Proc(
        exporting(&["engine", "--test-executor", "--engine-id", "traced-1", "--log", "warn"], &db.url, &otlp, &dir.path().join("engine.log"))
            .spawn()
            .expect("spawn shopfloor engine"),
    );
    let http = reqwest::Client::new();

    // The webhook opens the run.
    let repo = widgets();
    let mut issue = Issue::new(12, "Trace me");
    issue.labels.push("ready".into());
    let hooks = WebhookClient::new(&base, SECRET);
    let delivery = uuid::Uuid::new_v4().to_string();
    let (status, answer) = hooks.send("issues", &delivery, &payloads::issues_event("labeled", &repo, &issue, &user("bob"), Some("ready"))).await;
    assert_eq!((status, answer["runs_opened"].as_i64()), (202, Some(1)), "{answer}");

    // It completes.
    let completed = async {
        loop {
            let row: Option<(uuid::Uuid, String)> = sqlx::query_as("SELECT run_id, status FROM runs").fetch_optional(&db.pool).await.unwrap();
            match row {
                Some((id, status)) if status == "completed" => return engine::ids::RunId(id).to_string(),
                Some((_, status)) if status != "running" => panic!("the run ended {status}"),
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    };
    let run: String = tokio::time::timeout(Duration::from_secs(120), completed).await.expect("the run did not complete");

    // The REST API names its trace.
    let detail: Value = http.get(format!("{base}/api/v1/orgs/acme/projects/web/runs/{run}")).bearer_auth(&token).send().await.unwrap().json().await.unwrap();
    let trace_id = detail["trace_id"].as_str().unwrap_or_else(|| panic!("no trace_id in {detail}")).to_owned();
    assert!(trace_id.len() == 32 && trace_id.bytes().all(|b| b.is_ascii_hexdigit()), "{trace_id}");

    // One trace: the webhook's span is its only root, and the steps' spans are its children.
    let nodes = ["start", "code", "done"];
    let (root, steps) = until(Duration::from_secs(120), "the webhook's span and the three steps' spans", || {
        let got = got.lock().unwrap();
        let mine: Vec<&(String, Span)> = got.spans.iter().filter(|(_, s)| hex(&s.trace_id) == trace_id).collect();
        let root = mine.iter().find(|(_, s)| s.name == "POST /webhooks/github")?;
        let steps: Vec<(String, Span)> = mine.iter().filter(|(_, s)| s.name.starts_with("step ")).map(|p| (*p).clone()).collect();
        let named: BTreeSet<&str> = steps.iter().filter_map(|(_, s)| text(attr(&s.attributes, "shopfloor.node"))).collect();
        (named.len() == nodes.len()).then(|| ((*root).clone(), steps))
    })
    .await;
    let (root_process, root) = root;
    assert_eq!(root_process, "api", "the webhook's span comes from the API process");
    assert!(root.parent_span_id.is_empty(), "the webhook's span is a root");
    assert_eq!(text(attr(&root.attributes, "github.delivery")), Some(delivery.as_str()));
    for (process, step) in &steps {
        let node = text(attr(&step.attributes, "shopfloor.node")).unwrap_or_default();
        assert_eq!(process, "engine", "step {node} is the engine's span");
        assert_eq!(step.parent_span_id, root.span_id, "step {node} is a child of the webhook's span");
        assert_eq!(text(attr(&step.attributes, "shopfloor.outcome")), Some("succeeded"), "step {node}");
        assert!(matches!(attr(&step.attributes, "shopfloor.attempt"), Some(any_value::Value::IntValue(1))), "step {node}: {:?}", step.attributes);
    }
    {
        let got = got.lock().unwrap();
        let roots = got.spans.iter().filter(|(_, s)| hex(&s.trace_id) == trace_id && s.parent_span_id.is_empty()).count();
        assert_eq!(roots, 1, "one root in the run's trace");
        assert_eq!(got.refused, 0, "every export was OTLP/HTTP protobuf");
    }

    // The event log: a record per run event, with exactly the fixed keys, in the run's trace.
    let records = until(Duration::from_secs(120), "the run's event log records", || {
        let got = got.lock().unwrap();
        let mine: Vec<LogRecord> = got.logs.iter().filter(|r| text(attr(&r.attributes, "shopfloor.run.id")) == Some(run.as_str())).cloned().collect();
        let names: BTreeSet<&str> = mine.iter().map(|r| r.event_name.as_str()).collect();
        let wanted = ["shopfloor.run.started", "shopfloor.step.succeeded", "shopfloor.run.completed"];
        wanted.iter().all(|w| names.contains(w)).then_some(mine)
    })
    .await;
    for r in &records {
        for kv in &r.attributes {
            assert!(fixed_keys().contains(kv.key.as_str()), "{} carries a key outside the list: {}", r.event_name, kv.key);
        }
        let Some(any_value::Value::StringValue(body)) = r.body.as_ref().and_then(|b| b.value.as_ref()) else {
            panic!("{}: the body is not the record", r.event_name)
        };
        let body: Value = serde_json::from_str(body).unwrap();
        let keys: BTreeSet<&str> = body.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, fixed_keys(), "{}: exactly the fixed keys", r.event_name);
        assert_eq!(hex(&r.trace_id), trace_id, "{} is in the run's trace", r.event_name);
        assert_eq!(body["shopfloor.run.id"], Value::from(run.as_str()));
    }
    let done = records
        .iter()
        .find(|r| r.event_name == "shopfloor.step.succeeded" && text(attr(&r.attributes, "shopfloor.node")) == Some("code"))
        .expect("code's step.succeeded");
    assert!(matches!(attr(&done.attributes, "shopfloor.duration_ms"), Some(any_value::Value::IntValue(_))), "{:?}", done.attributes);
    assert!(matches!(attr(&done.attributes, "shopfloor.workflow.version"), Some(any_value::Value::IntValue(1))));
    let body: Value = serde_json::from_str(match done.body.as_ref().and_then(|b| b.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s,
        _ => unreachable!(),
    })
    .unwrap();
    assert_eq!(body["gen_ai.request.model"], Value::Null, "a key without a value is null");
    assert_eq!(body["shopfloor.outcome"], Value::from("succeeded"));

    // The API's JSON log line of the delivery carries the trace and the webhook span's ids.
    let root_span = hex(&root.span_id);
    let line = until(Duration::from_secs(5), "the delivery's log line", || {
        let text = std::fs::read_to_string(&api_log).unwrap_or_default();
        text.lines().find(|l| l.contains("delivery ingested")).map(str::to_owned)
    })
    .await;
    let line: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
    assert_eq!((line["trace_id"].as_str(), line["span_id"].as_str()), (Some(trace_id.as_str()), Some(root_span.as_str())), "{line}");
    // Nothing secret went into the spans.
    {
        let got = got.lock().unwrap();
        for (_, s) in &got.spans {
            for kv in &s.attributes {
                let v = text(kv.value.as_ref().and_then(|v| v.value.as_ref())).unwrap_or_default();
                assert!(!v.contains(SECRET) && !v.contains(&token) && !v.starts_with("sha256="), "span {} carries a secret in {}", s.name, kv.key);
            }
        }
    }

    engine.terminate();
    api.terminate();
    db.finish().await;
}
