//! shopfloor's core: the domain model, workflow definitions, the graph walker, the store (the
//! one write path) and the engine pool.

pub mod advance;
pub mod catalog;
pub mod cluster;
pub mod db;
pub mod definition;
pub mod executor;
pub mod ids;
pub mod pool;
pub mod state;
pub mod store;
pub mod substate;
pub mod triggers;
pub mod walk;

#[cfg(feature = "testkit")]
pub mod testkit;
