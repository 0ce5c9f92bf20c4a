//! Trace context of runs: one trace per run, as the `spans` crate (shared with the host agent)
//! makes it. The store's run insert writes the [`TraceParent`] of what the caller's
//! [`Change`](crate::store::Change) was given, and the engine's steps run in a [`step_span`]
//! under it.

pub use spans::{TraceParent, record_outcome, step_span};
