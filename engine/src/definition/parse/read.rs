//! Typed readers over the positioned YAML tree: each one either returns the value or records
//! a problem at the offending node and returns `None`, so that a whole file is read and every
//! problem found in one pass.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::yaml::{Key, Node, Pos, Value};
use crate::definition::{expr, template};

/// The problems found so far.
#[derive(Default)]
pub(super) struct Cx {
    pub(super) problems: Vec<Problem>,
}

impl Cx {
    pub(super) fn report(&mut self, pos: Pos, path: &str, message: impl Into<String>) {
        self.problems.push(Problem { line: pos.line, col: pos.col, path: path.to_owned(), message: message.into() });
    }
}

pub(super) fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") }
}

/// How a value is named in "expected a string, found a list".
fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Int(_) => "a whole number",
        Value::Float(_) => "a decimal number",
        Value::Str { .. } => "a string",
        Value::Seq(_) => "a list",
        Value::Map(_) => "a mapping",
    }
}

pub(super) fn type_error(cx: &mut Cx, node: &Node, path: &str, expected: &str) {
    cx.report(node.pos, path, format!("expected {expected}, found {}", describe(&node.value)));
}

/// Where a missing key is reported: the mapping that lacks it.
pub(super) fn missing(cx: &mut Cx, pos: Pos, path: &str, key: &str) {
    cx.report(pos, path, format!("missing required key `{key}`"));
}

/// The entries of a mapping being read.
pub(super) struct Fields<'a> {
    pub(super) path: String,
    pub(super) pos: Pos,
    pub(super) entries: &'a [(Key, Node)],
}

impl<'a> Fields<'a> {
    pub(super) fn get(&self, key: &str) -> Option<&'a Node> {
        // The first occurrence wins; later ones were reported as duplicates.
        self.entries.iter().find(|(k, _)| k.name == key).map(|(_, v)| v)
    }

    pub(super) fn path(&self, key: &str) -> String {
        join(&self.path, key)
    }

    pub(super) fn required(&self, cx: &mut Cx, key: &str) -> Option<&'a Node> {
        let node = self.get(key);
        if node.is_none() {
            missing(cx, self.pos, &self.path, key);
        }
        node
    }

    /// Reads an optional key with `read`; `Some(None)` when it is absent.
    pub(super) fn optional<T>(&self, cx: &mut Cx, key: &str, read: impl FnOnce(&mut Cx, &'a Node, &str) -> Option<T>) -> Option<Option<T>> {
        match self.get(key) {
            Some(node) => read(cx, node, &self.path(key)).map(Some),
            None => Some(None),
        }
    }

    /// Reads a required key with `read`.
    pub(super) fn must<T>(&self, cx: &mut Cx, key: &str, read: impl FnOnce(&mut Cx, &'a Node, &str) -> Option<T>) -> Option<T> {
        let node = self.required(cx, key)?;
        read(cx, node, &self.path(key))
    }

    /// Reads a required key that is one of a fixed set of words.
    pub(super) fn must_one_of<T: Copy>(&self, cx: &mut Cx, key: &str, options: &[(&str, T)]) -> Option<T> {
        self.must(cx, key, |cx, n, p| one_of(cx, n, p, options))
    }

    /// Reads an optional key that is one of a fixed set of words; `Some(None)` when it is absent.
    pub(super) fn optional_one_of<T: Copy>(&self, cx: &mut Cx, key: &str, options: &[(&str, T)]) -> Option<Option<T>> {
        self.optional(cx, key, |cx, n, p| one_of(cx, n, p, options))
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = &'a Key> + use<'a> {
        self.entries.iter().map(|(k, _)| k)
    }
}

/// Reads a mapping whose keys are free (field names, inputs); reports keys written twice.
pub(super) fn entries<'a>(cx: &mut Cx, node: &'a Node, path: &str) -> Option<Fields<'a>> {
    let Value::Map(entries) = &node.value else {
        type_error(cx, node, path, "a mapping");
        return None;
    };
    for (i, (key, _)) in entries.iter().enumerate() {
        if entries[..i].iter().any(|(k, _)| k.name == key.name) {
            cx.report(key.pos, &join(path, &key.name), format!("duplicate key `{}`", key.name));
        }
    }
    Some(Fields { path: path.to_owned(), pos: node.pos, entries })
}

/// Reads a mapping whose keys are free (field names, inputs), each value with `read`; `None`
/// when any value has a problem, all of them reported.
pub(super) fn each_entry<T>(cx: &mut Cx, node: &Node, path: &str, mut read: impl FnMut(&mut Cx, &Node, &str) -> Option<T>) -> Option<BTreeMap<String, T>> {
    let f = entries(cx, node, path)?;
    let mut out = Some(BTreeMap::new());
    for (key, value) in f.entries {
        match (read(cx, value, &f.path(&key.name)), out.as_mut()) {
            (Some(read), Some(map)) => {
                map.entry(key.name.clone()).or_insert(read);
            }
            _ => out = None,
        }
    }
    out
}

/// Reads a mapping that may hold only the keys in `allowed`.
pub(super) fn mapping<'a>(cx: &mut Cx, node: &'a Node, path: &str, allowed: &[&str]) -> Option<Fields<'a>> {
    let fields = entries(cx, node, path)?;
    for key in fields.keys() {
        if !allowed.contains(&key.name.as_str()) {
            cx.report(key.pos, &join(path, &key.name), unknown_key(&key.name, allowed));
        }
    }
    Some(fields)
}

pub(super) fn unknown_key(key: &str, allowed: &[&str]) -> String {
    format!("unknown key `{key}` (allowed: {})", allowed.join(", "))
}

pub(super) fn string(cx: &mut Cx, node: &Node, path: &str) -> Option<String> {
    match &node.value {
        Value::Str { text, .. } => Some(text.clone()),
        _ => {
            type_error(cx, node, path, "a string");
            None
        }
    }
}

pub(super) fn nonempty_string(cx: &mut Cx, node: &Node, path: &str) -> Option<String> {
    let text = string(cx, node, path)?;
    if text.trim().is_empty() {
        cx.report(node.pos, path, "must not be empty");
        return None;
    }
    Some(text)
}

pub(super) fn boolean(cx: &mut Cx, node: &Node, path: &str) -> Option<bool> {
    match node.value {
        Value::Bool(b) => Some(b),
        _ => {
            type_error(cx, node, path, "true or false");
            None
        }
    }
}

/// A whole number of at least `min` that fits a `u32`.
pub(super) fn count(cx: &mut Cx, node: &Node, path: &str, min: u32) -> Option<u32> {
    let Value::Int(n) = node.value else {
        type_error(cx, node, path, "a whole number");
        return None;
    };
    if n < i64::from(min) {
        cx.report(node.pos, path, format!("must be at least {min}, not {n}"));
        return None;
    }
    match u32::try_from(n) {
        Ok(n) => Some(n),
        Err(_) => {
            cx.report(node.pos, path, format!("{n} is too large"));
            None
        }
    }
}

/// An amount of money in US dollars, more than zero.
pub(super) fn usd(cx: &mut Cx, node: &Node, path: &str) -> Option<f64> {
    #[expect(clippy::cast_precision_loss, reason = "dollar amounts are far below 2^52")]
    let amount = match node.value {
        Value::Int(n) => n as f64,
        Value::Float(f) => f,
        _ => {
            type_error(cx, node, path, "an amount in US dollars");
            return None;
        }
    };
    if !(amount.is_finite() && amount > 0.0) {
        cx.report(node.pos, path, format!("must be more than 0, not {amount}"));
        return None;
    }
    Some(amount)
}

/// A duration written `30s`, `10m`, `1h`, `1h30m`; zero is refused because every duration
/// here bounds or spaces out work.
pub(super) fn duration(cx: &mut Cx, node: &Node, path: &str) -> Option<Duration> {
    let Value::Str { text, .. } = &node.value else {
        type_error(cx, node, path, "a duration such as 30s, 10m, 1h or 1h30m");
        return None;
    };
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => {
            cx.report(node.pos, path, "must be longer than zero");
            None
        }
        Ok(d) => Some(d),
        Err(e) => {
            cx.report(node.pos, path, format!("`{text}` is not a duration such as 30s, 10m, 1h or 1h30m ({e})"));
            None
        }
    }
}

/// A list of strings; a lone string stands for a list of one, as in `after: plan`.
pub(super) fn string_list(cx: &mut Cx, node: &Node, path: &str) -> Option<Vec<String>> {
    strings_at(cx, node, path).map(|items| items.into_iter().map(|(s, _)| s).collect())
}

/// A list of strings that must name at least one; `empty` says what to give when it names none.
pub(super) fn nonempty_list(cx: &mut Cx, node: &Node, path: &str, empty: &str) -> Option<Vec<String>> {
    let list = string_list(cx, node, path)?;
    if list.is_empty() {
        cx.report(node.pos, path, empty);
        return None;
    }
    Some(list)
}

/// Like `string_list`, keeping where each string was written (for edges to check later).
pub(super) fn strings_at(cx: &mut Cx, node: &Node, path: &str) -> Option<Vec<(String, Pos)>> {
    match &node.value {
        Value::Str { text, .. } => Some(vec![(text.clone(), node.pos)]),
        Value::Seq(items) => {
            let mut out = Vec::with_capacity(items.len());
            let mut ok = true;
            for (i, item) in items.iter().enumerate() {
                match string(cx, item, &format!("{path}[{i}]")) {
                    Some(s) => out.push((s, item.pos)),
                    None => ok = false,
                }
            }
            ok.then_some(out)
        }
        _ => {
            type_error(cx, node, path, "a list of strings");
            None
        }
    }
}

/// One of a fixed set of words.
pub(super) fn one_of<T: Copy>(cx: &mut Cx, node: &Node, path: &str, options: &[(&str, T)]) -> Option<T> {
    let names: Vec<&str> = options.iter().map(|(name, _)| *name).collect();
    let Value::Str { text, .. } = &node.value else {
        type_error(cx, node, path, &format!("one of {}", names.join(", ")));
        return None;
    };
    let found = options.iter().find(|(name, _)| name == text).map(|(_, v)| *v);
    if found.is_none() {
        let message = match names.as_slice() {
            [only] => format!("must be `{only}`, not `{text}`"),
            _ => format!("`{text}` is not one of {}", names.join(", ")),
        };
        cx.report(node.pos, path, message);
    }
    found
}

/// A plain scalar as JSON, for a field's default.
pub(super) fn scalar_json(cx: &mut Cx, node: &Node, path: &str) -> Option<serde_json::Value> {
    match &node.value {
        Value::Null => Some(serde_json::Value::Null),
        Value::Bool(b) => Some(serde_json::Value::Bool(*b)),
        Value::Int(n) => Some(serde_json::Value::from(*n)),
        Value::Float(f) => match serde_json::Number::from_f64(*f) {
            Some(n) => Some(serde_json::Value::Number(n)),
            None => {
                cx.report(node.pos, path, format!("{f} is not a usable number"));
                None
            }
        },
        Value::Str { text, .. } => Some(serde_json::Value::String(text.clone())),
        Value::Seq(_) | Value::Map(_) => {
            type_error(cx, node, path, "a single value");
            None
        }
    }
}

/// Where line `line` (1-based) of a string's text sits in the file, when that is known.
pub(super) fn text_line_pos(node: &Node, line: Option<usize>) -> Pos {
    match (&node.value, line) {
        (Value::Str { literal: true, .. }, Some(line)) if line >= 1 => Pos { line: node.pos.line + line - 1, col: node.pos.col },
        _ => node.pos,
    }
}

/// One thing wrong with a workflow definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line of the offending YAML node.
    pub line: usize,
    /// 1-based column of the offending YAML node.
    pub col: usize,
    /// Where in the document, such as `nodes.build.retry.attempts`; empty for the whole file.
    pub path: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() { write!(f, "{}", self.message) } else { write!(f, "{}: {}", self.path, self.message) }
    }
}

/// A CEL expression, compiled to check it.
pub(super) fn expression(cx: &mut Cx, node: &Node, path: &str) -> Option<String> {
    let text = string(cx, node, path)?;
    match expr::compile(&text) {
        Ok(()) => Some(text),
        Err(e) => {
            cx.report(node.pos, path, format!("expression does not compile: {e}"));
            None
        }
    }
}

/// A template, parsed to check it. A problem inside a `|` block is placed on its own line.
pub(super) fn template_text(cx: &mut Cx, node: &Node, path: &str) -> Option<String> {
    let text = string(cx, node, path)?;
    match template::syntax_error(&text) {
        None => Some(text),
        Some(e) => {
            let pos = text_line_pos(node, e.line);
            let at = e.line.map(|l| format!(" (line {l} of the template)")).unwrap_or_default();
            cx.report(pos, path, format!("template does not parse: {}{at}", e.message));
            None
        }
    }
}
