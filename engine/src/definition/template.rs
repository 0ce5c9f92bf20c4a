//! Templates (`{{ … }}`) of prompts, bodies and child inputs: checking their syntax at
//! upload, and rendering them over a run's JSON context with minijinja.
//!
//! Rendering is lenient about missing data: an undefined variable, or an attribute of one
//! (`nodes.plan.output.text` before `plan` ran), renders as an empty string. A syntax error is
//! always an error.

use minijinja::{Environment, UndefinedBehavior, value::Serde};

/// Bounds the work one render may do, so that a template's loops cannot stall a step.
const FUEL: u64 = 1_000_000;

/// A syntax error, with the 1-based line of the template it is on when minijinja knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyntaxError {
    pub(crate) line: Option<usize>,
    pub(crate) message: String,
}

/// Checks that `src` is a template.
///
/// # Errors
/// minijinja's message when it does not parse.
pub fn check(src: &str) -> Result<(), String> {
    syntax_error(src).map_or(Ok(()), |e| Err(e.message))
}

/// Renders `src` with the keys of `context` as its variables.
///
/// # Errors
/// A syntax error, or a failure while rendering (a filter given the wrong type, running out
/// of fuel).
pub fn render(src: &str, context: &serde_json::Value) -> Result<String, String> {
    let env = environment();
    let template = env.template_from_str(src).map_err(|e| describe(&e))?;
    template.render(Serde(context)).map_err(|e| describe(&e))
}

pub(crate) fn syntax_error(src: &str) -> Option<SyntaxError> {
    let env = environment();
    env.template_from_str(src).err().map(|e| SyntaxError { line: e.line(), message: describe(&e) })
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Chainable);
    env.set_fuel(Some(FUEL));
    env
}

/// The error without minijinja's "(in <string>:N)" suffix, which names no file of ours.
fn describe(e: &minijinja::Error) -> String {
    match e.detail() {
        Some(detail) => format!("{}: {detail}", e.kind()),
        None => e.kind().to_string(),
    }
}
