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
    pub line: Option<usize>,
    pub message: String,
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
    if let Some(e) = too_long_tag(src) {
        return Err(e.message);
    }
    let env = environment();
    let template = env.template_from_str(src).map_err(|e| describe(&e))?;
    template.render(Serde(context)).map_err(|e| describe(&e))
}

pub(crate) fn syntax_error(src: &str) -> Option<SyntaxError> {
    if let Some(e) = too_long_tag(src) {
        return Some(e);
    }
    let env = environment();
    env.template_from_str(src).err().map(|e| SyntaxError { line: e.line(), message: describe(&e) })
}

/// The longest `{{ … }}` or `{% … %}` tag, in bytes. minijinja reads a chain of filters or
/// attributes (`{{ x|e|e|… }}`) into a tree as deep as the chain, which its compiler then walks
/// recursively: a long enough one overflows the stack of the process that reads it.
pub const MAX_TAG: usize = 500;

/// The first tag longer than [`MAX_TAG`], as a syntax error at its line. A tag ends at the
/// first `}}` or `%}` outside a string literal; a comment (`{# … #}`) is no tag.
fn too_long_tag(src: &str) -> Option<SyntaxError> {
    let bytes = src.as_bytes();
    let mut i = 0;
    while i + 1 < bytes.len() {
        let close = match &bytes[i..i + 2] {
            b"{{" => b"}}",
            b"{%" => b"%}",
            b"{#" => {
                i = src[i + 2..].find("#}").map_or(bytes.len(), |end| i + 2 + end + 2);
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        };
        let start = i;
        let (mut j, mut quote) = (i + 2, None::<u8>);
        while j < bytes.len() {
            match (quote, bytes[j]) {
                (Some(_), b'\\') => j += 1,
                (Some(q), b) if b == q => quote = None,
                (None, b'"' | b'\'') => quote = Some(bytes[j]),
                (None, _) if bytes[j..].starts_with(close) => break,
                _ => {}
            }
            j += 1;
        }
        if j - start > MAX_TAG {
            let line = src[..start].matches('\n').count() + 1;
            return Some(SyntaxError {
                line: Some(line),
                message: format!("a tag of {} bytes; at most {MAX_TAG} are read: name its parts with `set`", j - start),
            });
        }
        i = j + 2;
    }
    None
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_tags_are_refused_without_overflowing() {
        let chain = |n: usize, part: &str| vec![part; n].join("");
        for long in [format!("{{{{ 1{} }}}}", chain(20_000, "|string")), format!("{{% set x = a{} %}}", chain(10_000, ".a"))] {
            let e = syntax_error(&format!("Fix it\n{long}")).expect("refused");
            assert_eq!(e.line, Some(2));
            assert!(e.message.contains("at most 500 are read"), "{}", e.message);
            assert!(render(&long, &serde_json::json!({})).is_err());
        }
        // A string holding the closing delimiter does not hide the rest of the tag.
        assert!(check(&format!("{{{{ '}}}}' ~ 1{} }}}}", chain(2_000, "|string"))).is_err());
        // The longest tags read do not overflow either: each kind of chain, at the limit.
        for at_limit in [
            format!("{{{{ 1{} }}}}", chain(70, "|string")),
            format!("{{{{ x{} }}}}", chain(240, "|e")),
            format!("{{{{ a{} }}}}", chain(240, ".a")),
            format!("{{{{ 1{} }}}}", chain(240, "+1")),
        ] {
            assert!(at_limit.len() <= MAX_TAG, "{}", at_limit.len());
            assert_eq!(check(&at_limit), Ok(()));
            assert!(render(&at_limit, &serde_json::json!({ "a": {} })).is_ok());
        }
        // Prose and comments are not tags, however long.
        assert_eq!(check(&format!("{}{{# {} #}}{{{{ x }}}}", "word ".repeat(1_000), "c".repeat(1_000))), Ok(()));
    }
}
