//! The trace context of runs and the span of a step's execution, shared by the engine and the
//! host agent: one trace per run.
//!
//! The webhook delivery or the API request that creates a run is its trace's root span. The
//! run stores that span's context as a W3C `traceparent` ([`TraceParent`]), and every step's
//! span takes it as its remote parent ([`step_span`]), in the engine that executes the step or
//! in the host that runs it (its assignment carries the `traceparent`), so that all the work
//! of a run shows under the webhook or request that created it. Without an OpenTelemetry layer
//! in the process's subscriber no span has a context, runs store none, and nothing here costs
//! more than an empty span.
//!
//! A crate of its own so that the host, which does not depend on the engine, parses the same
//! `traceparent` and makes the same span.

use std::fmt::Display;

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// A W3C `traceparent`: `00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>`, with
/// neither id all zeros.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent(String);

impl TraceParent {
    /// Parses a `traceparent` header value; `None` for anything malformed.
    pub fn parse(s: &str) -> Option<TraceParent> {
        let parts: Vec<&str> = s.trim().split('-').collect();
        let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        let ok = parts.len() == 4
            && parts[0] == "00"
            && hex(parts[1], 32)
            && hex(parts[2], 16)
            && hex(parts[3], 2)
            && parts[1].bytes().any(|b| b != b'0')
            && parts[2].bytes().any(|b| b != b'0');
        ok.then(|| TraceParent(s.trim().to_owned()))
    }

    /// The context of `span`, when it has a valid one (an OpenTelemetry layer is installed).
    pub fn of_span(span: &tracing::Span) -> Option<TraceParent> {
        let cx = span.context();
        let otel = cx.span();
        let sc = otel.span_context();
        sc.is_valid().then(|| TraceParent(format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8())))
    }

    /// The context of the current span.
    pub fn current() -> Option<TraceParent> {
        TraceParent::of_span(&tracing::Span::current())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The trace id, 32 lowercase hex digits.
    pub fn trace_id(&self) -> &str {
        &self.0[3..35]
    }

    /// As a remote parent for spans made here.
    pub fn context(&self) -> opentelemetry::Context {
        let id = |s: &str| u128::from_str_radix(s, 16).unwrap_or_default();
        let span = u64::from_str_radix(&self.0[36..52], 16).unwrap_or_default();
        let flags = u8::from_str_radix(&self.0[53..55], 16).unwrap_or_default();
        let sc = SpanContext::new(TraceId::from(id(self.trace_id())), SpanId::from(span), TraceFlags::new(flags), true, TraceState::default());
        opentelemetry::Context::new().with_remote_span_context(sc)
    }
}

/// The span of one step's execution, child of its run's stored context (a root of its own when
/// the run has none). Its `shopfloor.outcome` is recorded by [`record_outcome`]; a host
/// records the harness it runs as `shopfloor.harness`.
pub fn step_span(traceparent: Option<&str>, run: impl Display, step: impl Display, node: &str, kind: &str, attempt: i32) -> tracing::Span {
    let span = tracing::info_span!(
        parent: None,
        "step",
        otel.name = %format!("step {node}"),
        shopfloor.run.id = %run,
        shopfloor.step.id = %step,
        shopfloor.node = node,
        shopfloor.step.kind = kind,
        shopfloor.attempt = attempt,
        shopfloor.harness = tracing::field::Empty,
        shopfloor.outcome = tracing::field::Empty,
        shopfloor.outcome.reason = tracing::field::Empty,
    );
    if let Some(parent) = traceparent.and_then(TraceParent::parse) {
        // Fails only when the span was entered already, which it was not.
        let _ = span.set_parent(parent.context());
    }
    span
}

/// Records how a step's execution ended on its span.
pub fn record_outcome(span: &tracing::Span, outcome: &str, reason: Option<&str>) {
    span.record("shopfloor.outcome", outcome);
    if let Some(reason) = reason {
        span.record("shopfloor.outcome.reason", reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_parse_strictly() {
        let tp = TraceParent::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
        assert_eq!(tp.trace_id(), "0af7651916cd43dd8448eb211c80319c");
        let cx = tp.context();
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
        assert_eq!(format!("{}", sc.span_id()), "b7ad6b7169203331");
        for bad in [
            "",
            "garbage",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
        ] {
            assert!(TraceParent::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn without_an_otel_layer_spans_have_no_context() {
        assert!(TraceParent::of_span(&tracing::info_span!("x")).is_none());
    }
}
