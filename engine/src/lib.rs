//! shopfloor's core: the domain model, workflow definitions, the graph walker, the store (the
//! one write path) and the engine pool.

pub mod admission;
pub mod advance;
pub mod catalog;
pub mod cluster;
pub mod db;
pub mod definition;
pub mod event_log;
pub mod executor;
pub mod github;
pub mod hosts;
pub mod ids;
pub mod item_keys;
pub mod jobs;
pub mod judge;
pub mod listen;
pub mod metrics;
pub mod net_guard;
pub mod pool;
pub mod reasons;
pub mod run_context;
pub mod schedule;
pub mod sealing;
pub mod state;
pub mod store;
pub mod substate;
pub mod tenancy;
pub mod trace;
pub mod triggers;
pub mod walk;

#[cfg(feature = "testkit")]
pub mod testkit;
