//! The engine's integration tests: one binary, one module per concern.

mod admission;
mod cluster;
mod engine;
mod fixtures;
mod guards;
mod hosts;
mod lifecycle;
mod listen;
mod notices;
mod poisoned;
mod store;
mod testkit;
