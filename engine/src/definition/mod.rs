//! Workflow definitions: the typed model, parsing with validation, and expression/template
//! compilation.

pub(crate) mod edges;
pub mod expr;
pub mod model;
mod parse;
pub mod report;
pub mod template;
pub mod timeouts;

#[cfg(test)]
mod tests;

pub use model::*;
pub use parse::{Problem, parse};
