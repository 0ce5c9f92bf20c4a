//! The span of an attempt, in its run's trace: the assignment carries the run's W3C
//! `traceparent`, and the attempt's span (the `spans` crate's step span, as the engine makes
//! it) takes it as its remote parent, so that the host's work shows under the webhook or
//! request that created the run.

use crate::client::Assignment;

pub use spans::record_outcome;

/// The span an attempt runs in; its outcome is recorded when the result is known
/// ([`record_outcome`]).
pub fn attempt_span(a: &Assignment) -> tracing::Span {
    let span = spans::step_span(a.traceparent.as_deref(), &a.run, &a.step, &a.node, "crew", a.attempt);
    span.record("shopfloor.harness", a.harness.as_str());
    span
}
