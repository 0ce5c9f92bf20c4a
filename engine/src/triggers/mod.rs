//! GitHub triggers: from a webhook delivery to trigger events and runs.
//!
//! - `projection` — what shopfloor keeps of an issue, a pull request or a repository (the
//!   item), made from webhook payloads, with hidden HTML comments stripped from text.
//! - `judge` — whether a workflow's `on.github` trigger fires: its `events`, its CEL `if:`
//!   over `item`, `trigger` and `project`, and who may trigger (the sender policy).
//! - `ingest` — one delivery in one [`Change`](crate::store::Change): route it to projects,
//!   update the items, judge every workflow, and hand the events to the claim rule in
//!   `store::triggers`.
//!
//! The content hash and the dedup keys are in `crate::item_keys`, and `judge` is
//! `crate::judge` (both re-exported here): the store, which stands below this module, reads
//! them too.
//!
//! **Architecture Invariant:** nothing here calls GitHub. An ingest answers from the payload
//! and the stored projection alone, so a webhook is answered within GitHub's 10 s whatever
//! GitHub's API is doing. Re-judging a queued event when the run it waited behind ends uses the
//! stored projection, which the webhooks keep current.

pub mod ingest;
pub mod projection;

pub use crate::item_keys::{canonical_json, content_hash, dedup_key, item_key};
pub use crate::judge;
pub use ingest::{Delivery, IngestOutcome, ingest};
