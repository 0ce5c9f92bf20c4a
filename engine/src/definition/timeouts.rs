//! A node's timeouts: the safety defaults and the one a step of a node
//! runs with. What the engine, the GitHub watches and the host protocol all read.

use std::time::Duration;

use super::{Node, NodeKind};

/// Default step timeouts: a bound on every step that names none.
pub const CREW_TIMEOUT: Duration = Duration::from_secs(3600);
pub const GATE_TIMEOUT: Duration = Duration::from_secs(3600);
pub const OUTPUT_TIMEOUT: Duration = Duration::from_secs(300);

/// How long a step of `node` may run: its own `timeout:`, else its kind's (a crew node's caps,
/// a gate's), else the default of its kind.
pub fn step_timeout(node: &Node) -> Duration {
    node.timeout.unwrap_or(match &node.kind {
        NodeKind::Crew(c) => c.caps.timeout.unwrap_or(CREW_TIMEOUT),
        NodeKind::Gate(g) => g.timeout.unwrap_or(GATE_TIMEOUT),
        _ => OUTPUT_TIMEOUT,
    })
}
