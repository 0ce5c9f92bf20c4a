//! The typed form of a workflow definition: what the walker and the engine read.
//!
//! A `Definition` is only made by `definition::parse`, which has already checked every rule
//! of validation, so code that holds one may rely on them: every edge names an existing node,
//! every expression compiles, every template parses, every cycle has a gate or decision on it.

use std::collections::BTreeMap;
use std::time::Duration;

/// A node's id, the key under `nodes:` in the YAML.
pub type NodeId = String;

#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    pub name: String,
    pub on: Triggers,
    pub concurrency: Option<Concurrency>,
    pub throttle: Option<Throttle>,
    pub budget: Budget,
    /// `approval: required` parks each new run until a person approves it.
    pub approval_required: bool,
    /// A node whose next visit would exceed this is not started (`stopped_line:<node>`).
    pub stop_the_line_attempts: u32,
    /// In the order they appear in the YAML.
    pub nodes: Vec<Node>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Triggers {
    pub github: Option<GithubTrigger>,
    pub schedule: Option<ScheduleTrigger>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GithubTrigger {
    /// `issues.labeled`, `pull_request.closed`, … (`event.action`, or just `event`).
    pub events: Vec<String>,
    /// A CEL expression over `item`, `trigger`, `project`.
    pub condition: Option<String>,
    /// Whose deliveries may start runs (`senders:`): by default only people whose
    /// `author_association` is OWNER, MEMBER or COLLABORATOR, never bots.
    pub senders: Senders,
}

/// Who may trigger a workflow through GitHub (by default only people with write access).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Senders {
    /// OWNER, MEMBER or COLLABORATOR, and never a bot.
    #[default]
    Trusted,
    /// Anyone, bots included (`senders: any`): for public intake workflows and check events,
    /// which bots send.
    Any,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleTrigger {
    pub cron: String,
    /// An IANA time zone name; UTC when absent.
    pub tz: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConcurrencyPolicy {
    Queue,
    Skip,
    Drop,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Concurrency {
    /// `item`, `repository`, or a literal group name.
    pub group: String,
    pub limit: u32,
    pub policy: ConcurrencyPolicy,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Throttle {
    pub per: Duration,
    pub limit: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    /// Runs one item may open between resets (3 by default).
    pub max_cycles: u32,
    pub usd_per_run: Option<f64>,
    pub hard: bool,
}

impl Default for Budget {
    fn default() -> Self {
        Budget { max_cycles: 3, usd_per_run: None, hard: true }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub id: NodeId,
    /// Plain incoming edges: this node may start once one of these finished.
    pub after: Vec<NodeId>,
    pub kind: NodeKind,
    /// Capabilities a host must advertise to run this node (`linux`, `harness:claude-code`).
    pub requires: Vec<String>,
    pub retry: Option<Retry>,
    /// Bounds a step (it fails), or for `wait`/`approval` bounds the wait (it resolves).
    pub timeout: Option<Duration>,
    /// When the step fails for good, the walk goes on as if it had succeeded.
    pub continue_on_error: bool,
    /// A handler node started as soon as this node's step fails for good.
    pub failure: Option<NodeId>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Retry {
    /// Attempts in total, the first included.
    pub attempts: u32,
    /// Delay before the second attempt; doubles after each.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// Retry only on these exit codes; any failure when empty.
    pub exit_codes: Vec<i32>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    Trigger,
    Crew(Crew),
    Gate(Gate),
    Approval(Approval),
    Decision(Decision),
    Output(Output),
    Wait(Wait),
    Workflow(ChildWorkflow),
    End(End),
}

impl NodeKind {
    /// The word used in YAML and in the `steps.kind` column.
    pub fn name(&self) -> &'static str {
        match self {
            NodeKind::Trigger => "trigger",
            NodeKind::Crew(_) => "crew",
            NodeKind::Gate(_) => "gate",
            NodeKind::Approval(_) => "approval",
            NodeKind::Decision(_) => "decision",
            NodeKind::Output(_) => "output",
            NodeKind::Wait(_) => "wait",
            NodeKind::Workflow(_) => "workflow",
            NodeKind::End(_) => "end",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Harness {
    ClaudeCode,
    Codex,
    Command,
}

impl Harness {
    /// The name a workflow and the host protocol use: `claude-code`, `codex`, `command`.
    pub fn name(self) -> &'static str {
        match self {
            Harness::ClaudeCode => "claude-code",
            Harness::Codex => "codex",
            Harness::Command => "command",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Crew {
    pub harness: Harness,
    pub model: Option<String>,
    /// A template over `item`, `trigger`, `nodes.<id>.output`, `run`, `project`.
    pub prompt: String,
    /// For the `command` harness: the program and its arguments.
    pub command: Vec<String>,
    pub caps: Caps,
    /// `expect: changes`: a step that changed no file fails with `no_changes`; `expect: any`:
    /// no change is fine. Unsaid (`None`): changes are expected when a pull request is opened
    /// from the step's work (a safety default).
    pub expect_changes: Option<bool>,
    /// What the agent may do: `permissions`, `tools`, `mcp` (the host turns them into the
    /// CLI's flags) and `network` (what its proxy lets through).
    pub policy: protocol::Policy,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Caps {
    pub turns: Option<u32>,
    pub usd: Option<f64>,
    pub timeout: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    /// Names of the GitHub check runs that must pass.
    pub checks: Vec<String>,
    pub timeout: Option<Duration>,
    /// Where the walk loops back to when the gate fails.
    pub on_fail: Option<NodeId>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Approval {
    pub prompt: String,
    pub fields: BTreeMap<String, Field>,
    pub timeout: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    String,
    Number,
    Boolean,
    Choice,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub field_type: FieldType,
    pub required: bool,
    /// The allowed values of a `choice` field.
    pub options: Vec<String>,
    pub default: Option<serde_json::Value>,
    pub description: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub cases: Vec<Case>,
    pub default: Option<NodeId>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// A CEL expression; the first case that is true routes the walk.
    pub condition: String,
    pub to: NodeId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    PullRequest,
    Comment,
    Label,
    BoardMove,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    pub kind: OutputKind,
    pub draft: bool,
    /// Template for a comment's or pull request's body.
    pub body: Option<String>,
    /// Labels to add (`label`), or the board column to move to (`board_move`).
    pub labels: Vec<String>,
    /// Labels to remove (`label`, key `remove`).
    pub remove_labels: Vec<String>,
    pub column: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Wait {
    /// Sleep this long.
    For(Duration),
    /// Sleep until this instant (RFC 3339 in the YAML).
    Until(chrono::DateTime<chrono::Utc>),
    /// Wait for a GitHub event on the run's item, such as `pull_request.closed`.
    Event(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChildWorkflow {
    /// The name of a workflow of the same project.
    pub name: String,
    /// Input templates for the child run.
    pub input: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndOutcome {
    Completed,
    Failed,
}

#[derive(Debug, Clone, PartialEq)]
pub struct End {
    pub outcome: EndOutcome,
}

impl Definition {
    pub fn node(&self, id: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }
}

impl Definition {
    /// The nodes that may follow `node` through any edge: plain `after`, decision cases and
    /// default, a gate's `on_fail`, a `failure:` handler.
    pub fn successors(&self, node: &str) -> Vec<&str> {
        let mut out = Vec::new();
        for n in &self.nodes {
            if n.after.iter().any(|a| a == node) {
                out.push(n.id.as_str());
            }
        }
        if let Some(n) = self.node(node) {
            match &n.kind {
                NodeKind::Decision(d) => {
                    out.extend(d.cases.iter().map(|c| c.to.as_str()));
                    out.extend(d.default.as_deref());
                }
                NodeKind::Gate(g) => out.extend(g.on_fail.as_deref()),
                _ => {}
            }
            out.extend(n.failure.as_deref());
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// `from` and every node reachable from it.
    pub fn downstream(&self, from: &[String]) -> std::collections::BTreeSet<String> {
        let mut seen: std::collections::BTreeSet<String> = from.iter().cloned().collect();
        let mut todo: Vec<String> = from.to_vec();
        while let Some(n) = todo.pop() {
            for s in self.successors(&n) {
                if seen.insert(s.to_owned()) {
                    todo.push(s.to_owned());
                }
            }
        }
        seen
    }
}
