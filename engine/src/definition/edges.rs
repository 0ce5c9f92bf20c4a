//! The edges between nodes and the rule that says which nodes start a run, written once: the
//! definition's graph checks (`parse/graph.rs`) and the walker (`walk/graph.rs`) must agree on
//! both, or a workflow that validates could have a node no run ever reaches.

/// What an edge into a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EdgeKind {
    /// `after`.
    Plain,
    /// A decision's case or default.
    Route,
    /// A gate's `on_fail`.
    Loop,
    /// A `failure` handler.
    Failure,
}

/// Whether a node starts a run: every edge into it only loops back to it, from a gate's
/// `on_fail` or, when the node has no `after`, from a decision downstream of it (`downstream`
/// says whether an edge's source can be reached from the node). Without this, a first node that
/// a gate sends work back to could never start.
pub(crate) fn starts_a_run(incoming: impl IntoIterator<Item = (usize, EdgeKind)>, has_after: bool, mut downstream: impl FnMut(usize) -> bool) -> bool {
    incoming.into_iter().all(|(from, kind)| match kind {
        EdgeKind::Loop => true,
        EdgeKind::Route => !has_after && downstream(from),
        EdgeKind::Plain | EdgeKind::Failure => false,
    })
}

/// Whether `to` can be reached from `from` in a graph of `len` nodes, following `next`.
pub(crate) fn reaches<I: IntoIterator<Item = usize>>(len: usize, from: usize, to: usize, next: impl Fn(usize) -> I) -> bool {
    let mut seen = vec![false; len];
    let mut stack = vec![from];
    while let Some(n) = stack.pop() {
        if n == to {
            return true;
        }
        if !std::mem::replace(&mut seen[n], true) {
            stack.extend(next(n));
        }
    }
    false
}
