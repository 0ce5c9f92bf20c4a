//! The engine's integration tests: one binary, one module per concern.

mod cluster;
mod testkit;
mod fixtures;
mod store;
mod engine;
mod lifecycle;
mod admission;
mod hosts;
mod poisoned;
mod guards;
mod notices;
mod listen;
