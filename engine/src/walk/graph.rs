//! The definition as a graph for the walker: each node's incoming edges, with their kind
//! (plain `after:`, a decision's route, a gate's loop back, a failure handler's), and which
//! edges close a cycle.

use std::collections::HashMap;

use crate::definition::edges::{EdgeKind, reaches, starts_a_run};
use crate::definition::{Definition, Node, NodeKind};

/// The definition with its edges indexed by node position.
pub(super) struct Graph<'d> {
    pub(super) def: &'d Definition,
    pub(super) nodes: &'d [Node],
    pub(super) index: HashMap<&'d str, usize>,
    /// Edges into each node.
    pub(super) incoming: Vec<Vec<Edge>>,
    /// Each node's predecessors: sources of its plain and route edges, itself excluded.
    pub(super) preds: Vec<Vec<usize>>,
}

impl<'d> Graph<'d> {
    pub(super) fn new(def: &'d Definition) -> Self {
        let nodes = def.nodes.as_slice();
        let index: HashMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.id.as_str(), i)).collect();
        let mut graph = Graph { def, nodes, index, incoming: vec![Vec::new(); nodes.len()], preds: vec![Vec::new(); nodes.len()] };
        for (to, node) in nodes.iter().enumerate() {
            for from in &node.after {
                let kind = match graph.kind_of(from) {
                    Some(NodeKind::Decision(_)) => EdgeKind::Route,
                    _ => EdgeKind::Plain,
                };
                graph.add_edge(from, to, kind);
            }
        }
        for node in nodes {
            match &node.kind {
                NodeKind::Decision(decision) => {
                    for to in decision.cases.iter().map(|c| &c.to).chain(&decision.default) {
                        graph.add_edge_to(&node.id, to, EdgeKind::Route);
                    }
                }
                NodeKind::Gate(gate) => {
                    if let Some(to) = &gate.on_fail {
                        graph.add_edge_to(&node.id, to, EdgeKind::Loop);
                    }
                }
                _ => {}
            }
            if let Some(to) = &node.failure {
                graph.add_edge_to(&node.id, to, EdgeKind::Failure);
            }
        }
        graph
    }

    pub(super) fn len(&self) -> usize {
        self.nodes.len()
    }

    pub(super) fn kind_of(&self, id: &str) -> Option<&'d NodeKind> {
        self.index.get(id).map(|&i| &self.nodes[i].kind)
    }

    pub(super) fn add_edge_to(&mut self, from: &str, to: &str, kind: EdgeKind) {
        // A validated definition names only existing nodes; an edge to nowhere is dropped.
        if let Some(&to) = self.index.get(to) {
            self.add_edge(from, to, kind);
        }
    }

    pub(super) fn add_edge(&mut self, from: &str, to: usize, kind: EdgeKind) {
        let Some(&from) = self.index.get(from) else {
            return;
        };
        let edge = Edge { from, kind };
        if !self.incoming[to].contains(&edge) {
            self.incoming[to].push(edge);
        }
        if matches!(kind, EdgeKind::Plain | EdgeKind::Route) && from != to && !self.preds[to].contains(&from) {
            self.preds[to].push(from);
        }
    }

    /// Whether the node starts a run (`definition::edges::starts_a_run`, the rule validation
    /// checks reachability with).
    pub(super) fn is_root(&self, n: usize) -> bool {
        let incoming = self.incoming[n].iter().map(|edge| (edge.from, edge.kind));
        starts_a_run(incoming, !self.nodes[n].after.is_empty(), |from| self.reaches(n, from))
    }

    /// Whether `to` can be reached from `from` along predecessor edges (plain and route).
    pub(super) fn reaches(&self, from: usize, to: usize) -> bool {
        // Successors of n are the nodes that list n among their predecessors.
        reaches(self.len(), from, to, |n| (0..self.len()).filter(move |&m| self.preds[m].contains(&n)))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Edge {
    pub(super) from: usize,
    pub(super) kind: EdgeKind,
}
