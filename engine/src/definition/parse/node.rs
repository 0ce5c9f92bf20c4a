//! Reading the `nodes:` mapping: each node's one kind, its common keys, and the edges it
//! declares (noted in a `Skeleton` for the graph checks, which run even when a node has
//! other problems).

use std::time::Duration;

use super::graph::{Edge, Skeleton};
use super::kinds::{approval, crew, decision, end, gate, node_ref, output, trigger, wait, workflow};
use super::read::{Cx, boolean, count, duration, entries, mapping, string_list, strings_at, type_error, unknown_key};
use super::yaml::{Key, Node as YNode, Value};
use crate::definition::edges::EdgeKind;
use crate::definition::model::{Node, NodeKind, Retry};

const KINDS: &[&str] = &["trigger", "crew", "gate", "approval", "decision", "output", "wait", "workflow", "end"];
const COMMON: &[&str] = &["after", "requires", "retry", "timeout", "continue_on_error", "failure"];

/// Retry spacing when the definition gives none.
const DEFAULT_BACKOFF: Duration = Duration::from_secs(10);
const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(600);

/// Reads every node. The skeletons are always returned (for the graph checks); the nodes only
/// when all of them are valid.
pub(super) fn nodes(cx: &mut Cx, node: &YNode, path: &str) -> Option<(Vec<Skeleton>, Option<Vec<Node>>)> {
    let f = entries(cx, node, path)?;
    if f.entries.is_empty() {
        cx.report(node.pos, path, "a workflow needs at least one node");
    }
    let mut skeletons: Vec<Skeleton> = Vec::new();
    let mut nodes = Some(Vec::new());
    for (key, value) in f.entries {
        if skeletons.iter().any(|s| s.id == key.name) {
            // Reported as a duplicate key already; the first definition stands.
            nodes = None;
            continue;
        }
        let (skeleton, parsed) = one(cx, key, value, &f.path(&key.name));
        skeletons.push(skeleton);
        match (parsed, nodes.as_mut()) {
            (Some(parsed), Some(list)) => list.push(parsed),
            _ => nodes = None,
        }
    }
    Some((skeletons, nodes))
}

fn valid_id(id: &str) -> bool {
    let mut chars = id.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic()) && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn one(cx: &mut Cx, key: &Key, value: &YNode, path: &str) -> (Skeleton, Option<Node>) {
    let id = key.name.clone();
    let mut skeleton = Skeleton { id: id.clone(), pos: key.pos, path: path.to_owned(), kind: None, edges: Vec::new() };
    let id_ok = valid_id(&id);
    if !id_ok {
        cx.report(key.pos, path, format!("`{id}` is not a node id: use letters, digits, `_` and `-`, starting with a letter"));
    }
    let Some(f) = entries(cx, value, path) else {
        return (skeleton, None);
    };

    let kinds: Vec<&Key> = f.keys().filter(|k| KINDS.contains(&k.name.as_str())).collect();
    let unknown: Vec<&Key> = f.keys().filter(|k| !KINDS.contains(&k.name.as_str()) && !COMMON.contains(&k.name.as_str())).collect();
    for k in &unknown {
        let message = if kinds.is_empty() {
            format!("unknown node kind `{}` (kinds: {})", k.name, KINDS.join(", "))
        } else {
            unknown_key(&k.name, &[COMMON, &[kinds[0].name.as_str()]].concat())
        };
        cx.report(k.pos, &f.path(&k.name), message);
    }
    if kinds.is_empty() && unknown.is_empty() {
        cx.report(f.pos, path, format!("the node has no kind: give one of {}", KINDS.join(", ")));
    }
    for extra in kinds.iter().skip(1) {
        cx.report(extra.pos, &f.path(&extra.name), format!("a node has one kind, and this one already has `{}`", kinds[0].name));
    }

    let after = f.optional(cx, "after", strings_at);
    for (target, pos) in after.iter().flatten().flatten() {
        skeleton.edges.push(Edge { from: target.clone(), to: id.clone(), pos: *pos, kind: EdgeKind::Plain, path: f.path("after") });
    }
    let failure = f.optional(cx, "failure", node_ref);
    if let Some(Some(target)) = &failure {
        skeleton.edges.push(Edge::declared(&id, target, EdgeKind::Failure, f.path("failure")));
    }
    let requires = f.optional(cx, "requires", string_list);
    let retry = f.optional(cx, "retry", retry);
    let timeout = f.optional(cx, "timeout", duration);
    let continue_on_error = f.optional(cx, "continue_on_error", boolean);

    let kind = kinds.first().and_then(|k| {
        skeleton.kind = KINDS.iter().find(|name| **name == k.name).copied();
        let node = f.get(&k.name)?;
        kind(cx, &k.name, node, &f.path(&k.name), &id, &mut skeleton.edges)
    });

    let parsed = (|| {
        if !id_ok || kinds.len() != 1 || !unknown.is_empty() {
            return None;
        }
        Some(Node {
            id,
            after: after?.unwrap_or_default().into_iter().map(|(t, _)| t).collect(),
            kind: kind?,
            requires: requires?.unwrap_or_default(),
            retry: retry?,
            timeout: timeout?,
            continue_on_error: continue_on_error?.unwrap_or(false),
            failure: failure?.map(|(t, _)| t),
        })
    })();
    (skeleton, parsed)
}

fn kind(cx: &mut Cx, name: &str, node: &YNode, path: &str, id: &str, edges: &mut Vec<Edge>) -> Option<NodeKind> {
    match name {
        "trigger" => trigger(cx, node, path),
        "crew" => crew(cx, node, path).map(NodeKind::Crew),
        "gate" => gate(cx, node, path, id, edges).map(NodeKind::Gate),
        "approval" => approval(cx, node, path).map(NodeKind::Approval),
        "decision" => decision(cx, node, path, id, edges).map(NodeKind::Decision),
        "output" => output(cx, node, path).map(NodeKind::Output),
        "wait" => wait(cx, node, path).map(NodeKind::Wait),
        "workflow" => workflow(cx, node, path).map(NodeKind::Workflow),
        "end" => end(cx, node, path).map(NodeKind::End),
        _ => None,
    }
}

fn retry(cx: &mut Cx, node: &YNode, path: &str) -> Option<Retry> {
    let f = mapping(cx, node, path, &["attempts", "backoff", "max_backoff", "exit_codes"])?;
    let attempts = f.must(cx, "attempts", |cx, n, p| count(cx, n, p, 1));
    let backoff = f.optional(cx, "backoff", duration);
    let max_backoff = f.optional(cx, "max_backoff", duration);
    let exit_codes = f.optional(cx, "exit_codes", exit_codes);
    let backoff = backoff?.unwrap_or(DEFAULT_BACKOFF);
    let max_backoff = max_backoff?.unwrap_or(DEFAULT_MAX_BACKOFF.max(backoff));
    if max_backoff < backoff {
        if let Some(n) = f.get("max_backoff") {
            cx.report(n.pos, &f.path("max_backoff"), "must not be shorter than `backoff`");
        }
        return None;
    }
    Some(Retry { attempts: attempts?, backoff, max_backoff, exit_codes: exit_codes?.unwrap_or_default() })
}

fn exit_codes(cx: &mut Cx, node: &YNode, path: &str) -> Option<Vec<i32>> {
    let Value::Seq(items) = &node.value else {
        type_error(cx, node, path, "a list of exit codes");
        return None;
    };
    let mut codes = Vec::new();
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        match item.value {
            Value::Int(n) if i32::try_from(n).is_ok() => codes.extend(i32::try_from(n).ok()),
            _ => {
                type_error(cx, item, &format!("{path}[{i}]"), "an exit code");
                ok = false;
            }
        }
    }
    ok.then_some(codes)
}
