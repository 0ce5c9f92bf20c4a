//! CEL expressions (`if:` of a trigger, decision cases): compiling to check them at upload,
//! and evaluating them over a run's JSON context.
//!
//! The context is a JSON object; each of its top-level keys (`item`, `trigger`, `nodes`,
//! `run`, `project`) becomes a CEL variable.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use cel::common::ast::{EntryExpr, Expr, IdedEntryExpr};
use cel::objects::Key;
use cel::{Context, IdedExpr, Program, Value};

/// The variables an expression may always name; absent ones are bound to an empty map so that
/// `has(nodes.build)` is false rather than an error.
const VARIABLES: [&str; 5] = ["item", "trigger", "nodes", "run", "project"];

/// Checks that `expr` is a CEL expression.
///
/// # Errors
/// The parser's message, with the column, when it is not.
pub fn compile(expr: &str) -> Result<(), String> {
    program(expr).map(|_| ())
}

/// Evaluates `expr` over `context` and returns its value as JSON.
///
/// # Errors
/// When the expression does not compile, fails (a missing key, a type mismatch), or gives a
/// value JSON cannot hold.
pub fn eval(expr: &str, context: &serde_json::Value) -> Result<serde_json::Value, String> {
    let value = run(expr, context)?;
    value.json().map_err(|e| format!("the result cannot be turned into JSON: {e}"))
}

/// Evaluates `expr` over `context`.
///
/// # Errors
/// As `eval`, and when the result is not a boolean.
pub fn eval_bool(expr: &str, context: &serde_json::Value) -> Result<bool, String> {
    match run(expr, context)? {
        Value::Bool(b) => Ok(b),
        other => Err(format!("the expression gave {}, not a boolean", other.type_of())),
    }
}

/// The longest expression, in bytes: cel's parser and evaluator recurse once per operator, and
/// a long enough chain (`1+1+…`) overflows the stack of the process that reads it.
pub const MAX_LEN: usize = 1_000;
/// The deepest an expression's tree may nest (operators, calls, field selections).
const MAX_DEPTH: usize = 40;

fn program(expr: &str) -> Result<Program, String> {
    if expr.trim().is_empty() {
        return Err("the expression is empty".to_owned());
    }
    if expr.len() > MAX_LEN {
        return Err(format!("the expression is {} bytes long; at most {MAX_LEN} are read", expr.len()));
    }
    let program = Program::compile(expr).map_err(|errors| {
        let messages: Vec<String> = errors
            .errors
            .iter()
            // ANTLR's list of every token it would have taken helps no one writing a workflow.
            .map(|e| format!("{} (column {})", e.msg.split(" expecting {").next().unwrap_or(&e.msg), e.pos.1))
            .collect();
        messages.join("; ")
    })?;
    bounded(program.expression())?;
    Ok(program)
}

/// Refuses a tree deeper than [`MAX_DEPTH`], and a list macro (`all`, `exists`, `exists_one`,
/// `map`, `filter`) inside another one's: each nesting multiplies the work by a list's length,
/// and an evaluation runs inside an engine's transaction. The walk keeps its own stack, so
/// that checking a deep tree cannot overflow the one it guards.
fn bounded(root: &IdedExpr) -> Result<(), String> {
    let mut stack = vec![(root, 1_usize, 0_usize)];
    while let Some((node, depth, macros)) = stack.pop() {
        if depth > MAX_DEPTH {
            return Err(format!("the expression nests deeper than {MAX_DEPTH} levels: split it, or name its parts in the workflow's input"));
        }
        if matches!(node.expr, Expr::Comprehension(_)) && macros >= 1 {
            return Err("a list macro (all, exists, exists_one, map, filter) inside another one's is not allowed: the work would grow as a product of the lists' lengths".to_owned());
        }
        stack.extend(children(node).into_iter().map(|(child, in_macro)| (child, depth + 1, macros + usize::from(in_macro))));
    }
    Ok(())
}

/// The expressions `node` holds, each with whether it is a list macro's body.
fn children(node: &IdedExpr) -> Vec<(&IdedExpr, bool)> {
    let plain: Vec<&IdedExpr> = match &node.expr {
        Expr::Call(call) => call.target.iter().map(AsRef::as_ref).chain(&call.args).collect(),
        Expr::Comprehension(c) => {
            let mut all = vec![(&c.iter_range, false)];
            all.extend([&c.accu_init, &c.loop_cond, &c.loop_step, &c.result].map(|body| (body, true)));
            return all;
        }
        Expr::List(list) => list.elements.iter().collect(),
        Expr::Map(map) => map.entries.iter().flat_map(entry).collect(),
        Expr::Struct(st) => st.entries.iter().flat_map(entry).collect(),
        Expr::Select(select) => vec![&*select.operand],
        Expr::Unspecified | Expr::Ident(_) | Expr::Literal(_) => Vec::new(),
    };
    plain.into_iter().map(|e| (e, false)).collect()
}

fn entry(e: &IdedEntryExpr) -> Vec<&IdedExpr> {
    match &e.expr {
        EntryExpr::StructField(f) => vec![&f.value],
        EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
    }
}

/// Compiled programs by their text, so that a trigger's `if:` is parsed once per process
/// rather than at every delivery (parsing was a tenth of the API's CPU per delivery). The
/// texts are the workflows' own, so the map stays small; it starts over past `CACHED`.
static PROGRAMS: LazyLock<Mutex<HashMap<String, Arc<Program>>>> = LazyLock::new(Default::default);
const CACHED: usize = 4_096;

fn cached(expr: &str) -> Result<Arc<Program>, String> {
    if let Some(p) = PROGRAMS.lock().ok().and_then(|m| m.get(expr).cloned()) {
        return Ok(p);
    }
    let compiled = Arc::new(program(expr)?);
    if let Ok(mut m) = PROGRAMS.lock() {
        if m.len() >= CACHED {
            m.clear();
        }
        m.insert(expr.to_owned(), compiled.clone());
    }
    Ok(compiled)
}

fn run(expr: &str, context: &serde_json::Value) -> Result<Value, String> {
    let program = cached(expr)?;
    let serde_json::Value::Object(variables) = context else {
        return Err("the context must be a JSON object".to_owned());
    };
    STDLIB.with(|stdlib| {
        let mut cel_context = stdlib.new_inner_scope();
        bind(&mut cel_context, variables);
        program.execute(&cel_context).map_err(|e| e.to_string())
    })
}

thread_local! {
    /// CEL's standard library, built once per thread: `Context::default()` registers every
    /// function anew, which cost more than evaluating a trigger's `if:` itself. Each
    /// evaluation binds its variables in a scope of its own above it.
    static STDLIB: Context<'static, 'static> = Context::default();
}

fn bind(cel_context: &mut Context<'_, '_>, variables: &serde_json::Map<String, serde_json::Value>) {
    for name in VARIABLES {
        if !variables.contains_key(name) {
            cel_context.add_variable_from_value(name, Value::Map(HashMap::<Key, Value>::new().into()));
        }
    }
    for (name, value) in variables {
        cel_context.add_variable_from_value(name.as_str(), to_cel(value));
    }
}

/// JSON to CEL. Non-negative integers become CEL `int`, not `uint` as cel's serde bridge
/// would make them: CEL refuses `uint + int`, and `files_changed + 1` must work.
fn to_cel(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Int(i)
            } else if let Some(u) = n.as_u64() {
                Value::UInt(u)
            } else {
                Value::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::String(Arc::new(s.clone())),
        serde_json::Value::Array(items) => Value::List(Arc::new(items.iter().map(to_cel).collect())),
        serde_json::Value::Object(map) => {
            let map: HashMap<Key, Value> = map.iter().map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v))).collect();
            Value::Map(map.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_deep_or_nested_expressions_are_refused_without_overflowing() {
        let chain = |n: usize, part: &str, sep: &str| vec![part; n].join(sep);
        // What once overflowed the stack: refused by its length, before any parsing.
        assert!(compile(&chain(5_000, "1", "+")).unwrap_err().contains("at most 1000 are read"));
        assert!(compile(&format!("input.{}", chain(20_000, "a", "."))).unwrap_err().contains("at most 1000"));
        // Within the length, refused by its depth.
        assert!(compile(&chain(400, "1", "+")).unwrap_err().contains("nests deeper than 40"));
        assert!(compile(&format!("run.input.{} == 1", chain(300, "a", "."))).unwrap_err().contains("nests deeper"));
        // A list macro inside another one's multiplies the work.
        let nested = "[1, 2].all(a, [3, 4].exists(b, a < b))";
        assert!(compile(nested).unwrap_err().contains("inside another one's"), "{nested}");
        for fine in [
            "'ready' in item.labels && item.state == 'open'",
            "item.labels.exists(l, l.startsWith('area/')) && item.assignees.all(a, a != 'bot')",
            "size(nodes.build.output.files) > 3 ? 'big' : 'small'",
            &chain(30, "1", "+"),
        ] {
            assert_eq!(compile(fine), Ok(()), "{fine}");
        }
        assert_eq!(eval(&chain(30, "1", "+"), &serde_json::json!({})), Ok(serde_json::json!(30)));
    }
}
