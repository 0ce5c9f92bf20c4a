//! Checks on the graph of nodes: every edge names a node, every node can be reached from a
//! starting node, and every cycle passes through a gate or a decision (the only nodes that can
//! end a loop).
//!
//! All edges count here: plain `after` edges, decision cases and defaults, a gate's `on_fail`
//! and a `failure` handler.

use std::collections::{HashMap, VecDeque};

use super::read::Cx;
use super::yaml::Pos;
use crate::definition::edges::{EdgeKind, reaches, starts_a_run};

/// What the graph checks need to know of a node, gathered even when the node has problems.
pub(super) struct Skeleton {
    pub(super) id: String,
    /// Where the node's id is written.
    pub(super) pos: Pos,
    pub(super) path: String,
    /// `None` when the node has no known kind.
    pub(super) kind: Option<&'static str>,
    /// The edges this node's definition names.
    pub(super) edges: Vec<Edge>,
}

pub(super) struct Edge {
    pub(super) from: String,
    pub(super) to: String,
    pub(super) kind: EdgeKind,
    /// Where the other end's name is written.
    pub(super) pos: Pos,
    pub(super) path: String,
}

impl Edge {
    /// The edge that node `id` declares with the key at `path`, to the node named at `target`.
    pub(super) fn declared(id: &str, target: &(String, Pos), kind: EdgeKind, path: String) -> Edge {
        Edge { from: id.to_owned(), to: target.0.clone(), kind, pos: target.1, path }
    }
}

pub(super) fn check(cx: &mut Cx, nodes: &[Skeleton]) {
    let index: HashMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.id.as_str(), i)).collect();
    let mut successors: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut incoming: Vec<Vec<(usize, EdgeKind)>> = vec![Vec::new(); nodes.len()];
    for node in nodes {
        for edge in &node.edges {
            match (index.get(edge.from.as_str()), index.get(edge.to.as_str())) {
                (Some(&from), Some(&to)) => {
                    successors[from].push(to);
                    incoming[to].push((from, edge.kind));
                }
                (from, _) => {
                    let missing = if from.is_none() { &edge.from } else { &edge.to };
                    cx.report(edge.pos, &edge.path, format!("there is no node `{missing}`"));
                }
            }
        }
    }
    let starts: Vec<usize> = (0..nodes.len())
        .filter(|&n| {
            let has_after = incoming[n].iter().any(|(_, k)| *k == EdgeKind::Plain);
            starts_a_run(incoming[n].iter().copied(), has_after, |from| reaches(nodes.len(), n, from, |i| successors[i].iter().copied()))
        })
        .collect();
    unreachable(cx, nodes, &successors, &starts);
    ungated_cycles(cx, nodes, &successors);
}

/// Nodes that no path leads to from a node that starts a run.
fn unreachable(cx: &mut Cx, nodes: &[Skeleton], successors: &[Vec<usize>], starts: &[usize]) {
    let mut reached = vec![false; nodes.len()];
    let mut queue: VecDeque<usize> = starts.iter().copied().collect();
    for &i in &queue {
        reached[i] = true;
    }
    while let Some(i) = queue.pop_front() {
        for &next in &successors[i] {
            if !reached[next] {
                reached[next] = true;
                queue.push_back(next);
            }
        }
    }
    for (node, _) in nodes.iter().zip(&reached).filter(|(_, r)| !**r) {
        cx.report(node.pos, &node.path, format!("node `{}` is unreachable: no path leads to it from a starting node", node.id));
    }
}

/// Cycles made only of nodes that cannot end a loop, one problem per such cycle group.
fn ungated_cycles(cx: &mut Cx, nodes: &[Skeleton], successors: &[Vec<usize>]) {
    let breaks_loops = |i: usize| matches!(nodes[i].kind, Some("gate" | "decision"));
    // The graph without gates and decisions: any cycle left in it has neither.
    let plain: Vec<Vec<usize>> = successors
        .iter()
        .enumerate()
        .map(|(i, next)| if breaks_loops(i) { Vec::new() } else { next.iter().copied().filter(|&j| !breaks_loops(j)).collect() })
        .collect();
    for component in strongly_connected(&plain) {
        let Some(&start) = component.iter().min() else {
            continue;
        };
        let is_cycle = component.len() > 1 || plain[start].contains(&start);
        if !is_cycle {
            continue;
        }
        let cycle = shortest_cycle(&plain, &component, start);
        let names: Vec<&str> = cycle.iter().map(|&i| nodes[i].id.as_str()).collect();
        cx.report(nodes[start].pos, &nodes[start].path, format!("cycle with no gate or decision on it: {}", names.join(" -> ")));
    }
}

/// The strongly connected components (Kosaraju), iteratively so that a huge graph cannot
/// overflow the stack.
fn strongly_connected(successors: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = successors.len();
    let mut order = Vec::with_capacity(n);
    let mut visited = vec![false; n];
    for root in 0..n {
        if visited[root] {
            continue;
        }
        visited[root] = true;
        let mut stack = vec![(root, 0usize)];
        while let Some((node, next_child)) = stack.pop() {
            if let Some(&child) = successors[node].get(next_child) {
                stack.push((node, next_child + 1));
                if !visited[child] {
                    visited[child] = true;
                    stack.push((child, 0));
                }
            } else {
                order.push(node);
            }
        }
    }
    let mut predecessors = vec![Vec::new(); n];
    for (from, next) in successors.iter().enumerate() {
        for &to in next {
            predecessors[to].push(from);
        }
    }
    let mut component_of = vec![usize::MAX; n];
    let mut components = Vec::new();
    for &root in order.iter().rev() {
        if component_of[root] != usize::MAX {
            continue;
        }
        let id = components.len();
        let mut members = vec![root];
        component_of[root] = id;
        let mut stack = vec![root];
        while let Some(node) = stack.pop() {
            for &prev in &predecessors[node] {
                if component_of[prev] == usize::MAX {
                    component_of[prev] = id;
                    members.push(prev);
                    stack.push(prev);
                }
            }
        }
        components.push(members);
    }
    components
}

/// A shortest path from `start` back to itself inside `component`, both ends included.
fn shortest_cycle(successors: &[Vec<usize>], component: &[usize], start: usize) -> Vec<usize> {
    let mut parent: HashMap<usize, usize> = HashMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for &next in &successors[node] {
            if next == start {
                let mut path = vec![start];
                let mut at = node;
                while at != start {
                    path.push(at);
                    at = parent.get(&at).copied().unwrap_or(start);
                }
                path.push(start);
                path.reverse();
                return path;
            }
            if component.contains(&next) && !parent.contains_key(&next) {
                parent.insert(next, node);
                queue.push_back(next);
            }
        }
    }
    vec![start]
}
