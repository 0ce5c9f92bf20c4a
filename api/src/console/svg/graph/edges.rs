//! The graph's edges: every edge a definition draws (`after`, decision cases, `failure`
//! handlers, a gate's `on_fail`), and which of them go back up, against the layout's direction.

use std::collections::HashMap;

use engine::definition::{Definition, Node, NodeKind};
use engine::store::approvals::RUN_APPROVAL_NODE;

/// The drawn entry, named as the engine names a run's own approval step.
pub(super) const START: &str = RUN_APPROVAL_NODE;

/// One edge as drawn.
pub(super) struct Link {
    pub(super) from: String,
    pub(super) to: String,
    /// `plain`, `loop`, `case` or `failure` (`console.css`).
    pub(super) class: &'static str,
    /// Whether it goes back up, against the layout's direction.
    pub(super) back: bool,
}

/// The nodes a node leads to by the walker's forward edges (`after` and a decision's routes).
pub(super) fn successors<'d>(def: &'d Definition, n: &str) -> Vec<&'d str> {
    let mut out: Vec<&str> = def.nodes.iter().filter(|m| m.after.iter().any(|a| a == n)).map(|m| m.id.as_str()).collect();
    if let Some(NodeKind::Decision(d)) = def.nodes.iter().find(|m| m.id == n).map(|m| &m.kind) {
        out.extend(d.cases.iter().map(|c| c.to.as_str()).chain(d.default.as_deref()));
    }
    out
}

/// Whether `to` can be reached from `from` by forward edges.
pub(super) fn reaches(def: &Definition, from: &str, to: &str) -> bool {
    let mut seen: Vec<&str> = Vec::new();
    let mut stack = vec![from];
    while let Some(n) = stack.pop() {
        if n == to {
            return true;
        }
        if !seen.contains(&n) {
            seen.push(n);
            stack.extend(successors(def, n));
        }
    }
    false
}

/// Whether a node starts a run, by the walker's rule (`walk::is_root`): no `after`, no handler
/// edge into it, and any route into it comes from a decision downstream of it.
pub(super) fn is_root(def: &Definition, n: &Node) -> bool {
    n.after.is_empty()
        && def.nodes.iter().all(|m| {
            let handles = m.failure.as_ref() == Some(&n.id);
            let routes = matches!(&m.kind, NodeKind::Decision(d) if d.cases.iter().map(|c| &c.to).chain(&d.default).any(|t| *t == n.id));
            !handles && (!routes || reaches(def, n.id.as_str(), m.id.as_str()))
        })
}

/// Every edge to draw, `$start`'s first; which go back is decided by a depth-first walk from
/// `$start` that takes a node's loops last, so the forward edges are the ones a run takes first.
pub(super) fn links(def: &Definition) -> Vec<Link> {
    let mut links = Vec::new();
    let link = |from: &str, to: &str, class| Link { from: from.to_owned(), to: to.to_owned(), class, back: false };
    for n in def.nodes.iter().filter(|n| is_root(def, n)) {
        links.push(link(START, n.id.as_str(), "plain"));
    }
    for n in &def.nodes {
        for a in &n.after {
            links.push(link(a.as_str(), n.id.as_str(), "plain"));
        }
        match &n.kind {
            NodeKind::Decision(d) => {
                for to in d.cases.iter().map(|c| &c.to).chain(&d.default) {
                    let covered = def.nodes.iter().any(|m| m.id == *to && m.after.contains(&n.id));
                    if !covered && !links.iter().any(|l: &Link| l.from == n.id.as_str() && l.to == to.as_str()) {
                        links.push(link(n.id.as_str(), to.as_str(), "case"));
                    }
                }
            }
            NodeKind::Gate(g) => {
                if let Some(to) = &g.on_fail {
                    links.push(link(n.id.as_str(), to.as_str(), "loop"));
                }
            }
            _ => {}
        }
        if let Some(to) = &n.failure {
            links.push(link(n.id.as_str(), to.as_str(), "failure"));
        }
    }
    mark_back(&mut links, def);
    links
}

/// Marks the edges that close a cycle in a depth-first walk (from `$start`, then from any node
/// not reached) as back edges.
pub(super) fn mark_back(links: &mut [Link], def: &Definition) {
    let mut order: Vec<&str> = vec![START];
    order.extend(def.nodes.iter().map(|n| n.id.as_str()));
    let out_of = |n: &str| -> Vec<usize> {
        let mut out: Vec<usize> = (0..links.len()).filter(|&i| links[i].from == n).collect();
        out.sort_by_key(|&i| links[i].class == "loop");
        out
    };
    // Not there: not seen yet; 1: on the walk's stack; 2: done.
    let mut mark: HashMap<String, u8> = HashMap::new();
    let mut back = Vec::new();
    for root in order {
        if mark.contains_key(root) {
            continue;
        }
        let mut stack: Vec<(String, Vec<usize>, usize)> = vec![(root.to_owned(), out_of(root), 0)];
        mark.insert(root.to_owned(), 1);
        while let Some((node, out, next)) = stack.last_mut() {
            let Some(&i) = out.get(*next) else {
                mark.insert(node.clone(), 2);
                stack.pop();
                continue;
            };
            *next += 1;
            let to = links[i].to.clone();
            match mark.get(&to) {
                Some(1) => back.push(i),
                Some(_) => {}
                None => {
                    mark.insert(to.clone(), 1);
                    let out = out_of(&to);
                    stack.push((to, out, 0));
                }
            }
        }
    }
    for i in back {
        links[i].back = true;
    }
}
