//! Logs, traces and the event log of a `shopfloor` process.
//!
//! Logs are JSON lines on standard error, filtered by `--log`; a line written inside a span
//! that has a trace carries its `trace_id` and `span_id`. Traces and the event log are
//! exported over OTLP (HTTP, protobuf) only when an endpoint is configured with the standard
//! variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (both), `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
//! (traces), `OTEL_EXPORTER_OTLP_LOGS_ENDPOINT` (the event log). The SDK reads the others
//! itself: `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` (the service is `shopfloor` when
//! neither names it), `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT`,
//! `OTEL_BSP_*` and `OTEL_BLRP_*` (batching). `OTEL_SDK_DISABLED=true`, or
//! `OTEL_TRACES_EXPORTER`/`OTEL_LOGS_EXPORTER=none`, turns exporting off. With no endpoint no
//! exporter is built and no OpenTelemetry layer is installed: spans cost what they cost
//! without it.
//!
//! Spans of `info` and above are exported whatever `--log` says (`--log warn` quiets the
//! lines, not the traces). The event log is each committed run event as a log record
//! (`engine::event_log`): its attributes are the record's keys that have a value, its body the
//! whole record as JSON with a null for each key without one (an OTLP attribute cannot be
//! null through the SDK), its event name `shopfloor.<kind>` (`shopfloor.step.succeeded`), and
//! its trace context the run's.

use std::time::SystemTime;

use engine::event_log::{EventRecord, Value};
use engine::trace::TraceParent;
use opentelemetry::logs::{AnyValue, Logger as _, LoggerProvider as _, Severity};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{LogExporter, Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::logs::SdkLoggerProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Subscriber;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The providers to flush and shut down when the process exits.
#[must_use = "call `shutdown` before the process exits, or the last spans and records are lost"]
pub struct Telemetry {
    traces: Option<SdkTracerProvider>,
    logs: Option<SdkLoggerProvider>,
}

/// Where OTLP goes, read from the standard variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Exporting {
    pub traces: bool,
    pub logs: bool,
}

impl Exporting {
    /// Reads the standard variables through `var`.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Exporting {
        let set = |name: &str| var(name).is_some_and(|v| !v.trim().is_empty());
        let off = |name: &str| var(name).is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Exporting::default();
        }
        let any = set("OTEL_EXPORTER_OTLP_ENDPOINT");
        Exporting {
            traces: (any || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) && !off("OTEL_TRACES_EXPORTER"),
            logs: (any || set("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT")) && !off("OTEL_LOGS_EXPORTER"),
        }
    }
}

/// Installs the process's subscriber: JSON lines filtered by `log`, and, when `export` is true
/// and an OTLP endpoint is configured, the trace and event-log exporters. `process` names the
/// subcommand (`serve`, `api`, `engine`, `host`) in the resource.
///
/// Call it outside any async runtime: the exporters' HTTP client blocks on its own threads.
pub fn init(log: &str, export: bool, process: &str) -> Telemetry {
    let filter = EnvFilter::try_new(log).unwrap_or_else(|_| EnvFilter::new("info"));
    let lines = tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr).event_format(TraceIds).with_filter(filter);
    let exporting = if export { Exporting::from_env(|k| std::env::var(k).ok()) } else { Exporting::default() };
    let mut problems = Vec::new();
    let resource = resource(process);
    let traces = exporting.traces.then(|| tracer_provider(resource.clone())).and_then(|r| r.map_err(|e| problems.push(format!("traces: {e}"))).ok());
    let logs = exporting.logs.then(|| logger_provider(resource)).and_then(|r| r.map_err(|e| problems.push(format!("event log: {e}"))).ok());
    let spans = traces.as_ref().map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("shopfloor")).with_filter(LevelFilter::INFO));
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(lines).with(spans));
    // The line formatter asks the subscriber for a span's trace (it cannot look the subscriber
    // up while it formats an event).
    let _ = DISPATCH.set(dispatch.downgrade());
    dispatch.init();
    if let Some(provider) = &logs {
        let logger = provider.logger("shopfloor.events");
        engine::event_log::set_sink(Box::new(move |record| {
            let mut r = logger.create_log_record();
            fill(&mut r, record);
            logger.emit(r);
        }));
    }
    for problem in problems {
        tracing::error!(error = %problem, "cannot export over OTLP; going on without it");
    }
    if traces.is_some() || logs.is_some() {
        tracing::info!(traces = traces.is_some(), event_log = logs.is_some(), "exporting over OTLP");
    }
    Telemetry { traces, logs }
}

impl Telemetry {
    /// Exports what is still batched and stops the exporters.
    pub fn shutdown(self) {
        if let Some(p) = self.traces {
            if let Err(e) = p.shutdown() {
                eprintln!("warning: traces not all exported at exit: {e}");
            }
        }
        if let Some(p) = self.logs {
            if let Err(e) = p.shutdown() {
                eprintln!("warning: event log not all exported at exit: {e}");
            }
        }
    }
}

/// The process's resource: the SDK's (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), with
/// `service.name` `shopfloor` when neither names it.
fn resource(process: &str) -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.split(',').any(|kv| kv.trim_start().starts_with("service.name=")));
    let mut b = Resource::builder().with_attribute(opentelemetry::KeyValue::new("shopfloor.process", process.to_owned()));
    if !named {
        b = b.with_service_name("shopfloor");
    }
    b.build()
}

fn tracer_provider(resource: Resource) -> Result<SdkTracerProvider, opentelemetry_otlp::ExporterBuildError> {
    let exporter = SpanExporter::builder().with_http().with_protocol(Protocol::HttpBinary).build()?;
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}

fn logger_provider(resource: Resource) -> Result<SdkLoggerProvider, opentelemetry_otlp::ExporterBuildError> {
    let exporter = LogExporter::builder().with_http().with_protocol(Protocol::HttpBinary).build()?;
    Ok(SdkLoggerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}

/// `shopfloor.<kind>`, kept for the life of the process: the SDK takes event names as
/// `&'static str`, and run events are of a few dozen kinds.
fn event_name(kind: &str) -> &'static str {
    static NAMES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let name = format!("shopfloor.{kind}");
    let mut names = NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(known) = names.iter().find(|n| **n == name) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.into_boxed_str());
    names.push(leaked);
    leaked
}

/// An event-log record as an OpenTelemetry log record.
fn fill(r: &mut impl opentelemetry::logs::LogRecord, record: &EventRecord) {
    let now = SystemTime::now();
    r.set_timestamp(now);
    r.set_observed_timestamp(now);
    r.set_event_name(event_name(record.name()));
    r.set_severity_number(Severity::Info);
    r.set_severity_text("INFO");
    r.set_body(AnyValue::from(record.to_json().to_string()));
    for (key, value) in record.pairs() {
        match value {
            Some(Value::Str(s)) => r.add_attribute(key, s.clone()),
            Some(Value::Int(i)) => r.add_attribute(key, *i),
            Some(Value::Double(d)) => r.add_attribute(key, *d),
            None => {}
        }
    }
    if let Some(tp) = record.traceparent().and_then(TraceParent::parse) {
        let cx = tp.context();
        let sc = cx.span().span_context().clone();
        r.set_trace_context(sc.trace_id(), sc.span_id(), Some(sc.trace_flags()));
    }
}

/// The JSON line of an event, with `trace_id` and `span_id` first when it is written inside a
/// span that has a trace.
struct TraceIds;

/// The process's subscriber, for the line formatter.
static DISPATCH: std::sync::OnceLock<tracing::dispatcher::WeakDispatch> = std::sync::OnceLock::new();

impl<S, N> FormatEvent<S, N> for TraceIds
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &tracing::Event<'_>) -> std::fmt::Result {
        let json = tracing_subscriber::fmt::format().json();
        let ids = ctx.parent_span().and_then(|span| {
            let dispatch = DISPATCH.get()?.upgrade()?;
            let cx = tracing_opentelemetry::get_otel_context(&span.id(), &dispatch)?;
            let sc = cx.span().span_context().clone();
            sc.is_valid().then(|| (sc.trace_id(), sc.span_id()))
        });
        let Some((trace_id, span_id)) = ids else { return json.format_event(ctx, writer, event) };
        let mut line = String::new();
        json.format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => write!(writer, "{{\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\",{rest}"),
            None => writer.write_str(&line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(name, _)| *name == k).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn nothing_is_exported_without_an_endpoint() {
        assert_eq!(Exporting::from_env(env(&[])), Exporting { traces: false, logs: false });
        assert_eq!(Exporting::from_env(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])), Exporting::default());
        assert_eq!(Exporting::from_env(env(&[("OTEL_SERVICE_NAME", "x")])), Exporting::default());
    }

    #[test]
    fn endpoints_turn_exporters_on() {
        assert_eq!(Exporting::from_env(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")])), Exporting { traces: true, logs: true });
        assert_eq!(Exporting::from_env(env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/v1/traces")])), Exporting { traces: true, logs: false });
        assert_eq!(Exporting::from_env(env(&[("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "http://c:4318/v1/logs")])), Exporting { traces: false, logs: true });
        let off = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_TRACES_EXPORTER", "none")];
        assert_eq!(Exporting::from_env(env(&off)), Exporting { traces: false, logs: true });
        let disabled = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_SDK_DISABLED", "true")];
        assert_eq!(Exporting::from_env(env(&disabled)), Exporting::default());
    }
}
