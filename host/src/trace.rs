//! The span of an attempt, in its run's trace: the assignment carries the run's W3C
//! `traceparent`, and the attempt's span takes it as its remote parent, so that the host's
//! work shows under the webhook or request that created the run. Without an OpenTelemetry
//! layer in the process (no OTLP endpoint configured) the span has no context and costs
//! nothing more.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::client::Assignment;

/// The remote parent a `traceparent` names: `00-<32 hex>-<16 hex>-<2 hex>`, ids not all zeros.
pub fn parent(traceparent: &str) -> Option<opentelemetry::Context> {
    let parts: Vec<&str> = traceparent.trim().split('-').collect();
    let [version, trace, span, flags] = parts.as_slice() else { return None };
    let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if *version != "00" || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
        return None;
    }
    let trace = TraceId::from(u128::from_str_radix(trace, 16).ok()?);
    let span = SpanId::from(u64::from_str_radix(span, 16).ok()?);
    let sc = SpanContext::new(trace, span, TraceFlags::new(u8::from_str_radix(flags, 16).ok()?), true, TraceState::default());
    sc.is_valid().then(|| opentelemetry::Context::new().with_remote_span_context(sc))
}

/// The span an attempt runs in; its outcome is recorded when the result is known
/// ([`record_outcome`]).
pub fn attempt_span(a: &Assignment) -> tracing::Span {
    let span = tracing::info_span!(
        parent: None,
        "step",
        otel.name = %format!("step {}", a.node),
        shopfloor.run.id = %a.run,
        shopfloor.step.id = %a.step,
        shopfloor.node = %a.node,
        shopfloor.step.kind = "crew",
        shopfloor.attempt = a.attempt,
        shopfloor.harness = %a.harness,
        shopfloor.outcome = tracing::field::Empty,
        shopfloor.outcome.reason = tracing::field::Empty,
    );
    if let Some(cx) = a.traceparent.as_deref().and_then(parent) {
        // Fails only for a span already entered; this one was not.
        let _ = span.set_parent(cx);
    }
    span
}

/// Records how the attempt ended on the current span (the attempt's).
pub fn record_outcome(outcome: &str, reason: Option<&str>) {
    let span = tracing::Span::current();
    span.record("shopfloor.outcome", outcome);
    if let Some(reason) = reason {
        span.record("shopfloor.outcome.reason", reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_parse_strictly() {
        assert!(parent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").is_some());
        assert!(parent("00-00000000000000000000000000000000-b7ad6b7169203331-01").is_none());
        assert!(parent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331").is_none());
        assert!(parent("garbage").is_none());
    }
}
