//! The host protocol's wire types that the host agent and the server both read or write, each
//! written once: every request the host sends ([`RegisterHost`], [`ClaimRequest`],
//! [`StartStep`], a session's [`SessionLine`]s and [`Usage`], how a step ended: [`Complete`],
//! and [`DeliveredMessages`]), and of the answers an assignment's [`Caps`] and [`Item`], a
//! claim's [`StopStep`], a held step's [`Standing`] with people's [`Message`]s, and its
//! [`StepToken`]. The server's OpenAPI document is generated from them.
//!
//! Strictness follows the reader. What the server reads (the host's requests) refuses unknown
//! fields; what the host reads (the answers) ignores them and defaults what may be missing, so
//! a newer server does not break an older host.
//!
//! A crate of its own so that the host, which does not depend on the engine, reads and writes
//! the types the server does. The types whose two sides still differ (an assignment's ids,
//! which the server parses into the engine's newtypes, and its token, which the host never
//! journals) stay with each side: `engine::hosts` and `host::client`.

use std::collections::BTreeMap;

pub mod egress;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

// The OpenAPI document names `Caps`, `Item` and `Usage` `CapsDoc`, `ItemDoc` and `UsageDoc`,
// as before the API took the engine's types for its own.

/// The caps a host enforces (the server enforces them too, through heartbeats).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, ToSchema)]
#[schema(as = CapsDoc)]
pub struct Caps {
    /// The node's `caps.turns` (`--max-turns`); a session past it is stopped `turn_cap`.
    #[serde(default)]
    pub turns: Option<u32>,
    /// What the session may spend (`--max-budget-usd`): the least of the node's `caps.usd` and
    /// what is left of the run's `usd_per_run` and of the project's and org's hard limits, at
    /// the claim.
    #[serde(default)]
    pub usd: Option<f64>,
    /// The step's timeout: SIGINT at this point, the process group killed after the host's
    /// grace.
    pub timeout_secs: u64,
}

/// What an agent may do in its step, from its crew node: the host turns it into each CLI's own
/// flags (`permissions` into Claude Code's permission mode and Codex's sandbox, `tools` into
/// Claude Code's allowed and denied tools, `mcp` into each CLI's MCP servers), and `network`
/// into what its proxy lets through.
// An older server sends none: the defaults are what a node that says nothing gets.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[schema(as = PolicyDoc)]
pub struct Policy {
    #[serde(default)]
    pub permissions: Permissions,
    #[serde(default, skip_serializing_if = "Tools::is_empty")]
    pub tools: Tools,
    /// MCP servers by name; the agent's own configuration's are never loaded.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mcp: BTreeMap<String, McpServer>,
    /// Where the step may connect beside its model API and its host's own list
    /// ([`egress::Rule`]s, as written).
    #[serde(default, skip_serializing_if = "Network::is_empty")]
    pub network: Network,
}

/// A crew node's `network`: the destinations its step may reach through the host's proxy.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
pub struct Network {
    #[serde(default)]
    pub allow: Vec<String>,
}

impl Network {
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty()
    }
}

/// How far an agent may change its work directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Permissions {
    /// Reads and searches only: no edit, no command (a plan, a review).
    Read,
    /// Edits files in its work directory; runs no command.
    Edit,
    /// Edits and runs commands, inside the step's walls.
    #[default]
    Full,
}

impl Permissions {
    /// The word a workflow writes.
    pub fn name(self) -> &'static str {
        match self {
            Permissions::Read => "read",
            Permissions::Edit => "edit",
            Permissions::Full => "full",
        }
    }
}

/// Tools a Claude Code agent may use without asking (`allow`) and may never use (`deny`), in
/// its rule syntax (`Bash(npm test:*)`, `WebFetch`, `mcp__github`); a deny wins.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
pub struct Tools {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
}

impl Tools {
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }
}

/// An MCP server an agent may use: a program speaking MCP on its standard input and output, or
/// a server at a URL (streamable HTTP).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum McpServer {
    /// The program and its arguments.
    Command(Vec<String>),
    Url(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = ItemDoc)]
pub struct Item {
    #[serde(default)]
    pub number: Option<i64>,
    #[serde(default)]
    pub title: Option<String>,
}

/// A host's registration, with a registration token.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterHost {
    /// The host's name in lists (`build-box-3`).
    pub name: String,
    /// What it offers: `linux`, `arm64`, `gpu`, `harness:claude-code`, …; at most 64.
    #[serde(default)]
    #[schema(max_items = 64)]
    pub capabilities: Vec<String>,
    /// Steps it runs at once, 1 to 64 (1 by default).
    #[schema(minimum = 1, maximum = 64)]
    pub max_concurrent: Option<u32>,
}

/// A claim: the steps a host wants, and the ones it holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// Steps wanted now, 0 to 64 (the host's free slots; the server also counts them against
    /// the host's `max_concurrent`). 0 only watches the held steps.
    #[serde(default)]
    #[schema(maximum = 64)]
    pub max: u32,
    /// Seconds to wait for work, 0 to 30 (30 by default).
    #[schema(maximum = 30)]
    pub wait_secs: Option<u32>,
    /// The steps the host runs now (`step-…`), at most 64: the answer names those it must
    /// stop.
    #[serde(default)]
    #[schema(max_items = 64)]
    pub held: Vec<String>,
}

/// A held step the host must stop, and why (its state now, or `gone`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StopStep {
    pub step: String,
    pub state: String,
}

/// Where a held step stands: the answer to a start, a heartbeat and a completion.
// The host reads a session report's answer as one too, leaving out what it adds.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(as = StepStanding)]
pub struct Standing {
    /// `leased`, `running`, or the state it moved to without the host.
    pub state: String,
    /// The host must stop working on the step (cancelled, taken back, finished).
    pub stop: bool,
    /// Messages from people for the running session, oldest first (heartbeats only): write
    /// each to the harness, then acknowledge it (`messages/delivered`); until then it is
    /// offered again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<Message>,
}

/// A person's message to a running session (intervene).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = StepMessage)]
pub struct Message {
    pub id: Uuid,
    pub text: String,
}

/// The host starts work on a leased step.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartStep {
    /// The harness the host runs (`claude-code`, `codex`, `command`).
    pub harness: Option<String>,
    /// The host runs it without walls (`--unsandboxed`): the run records so
    /// (`step.unwalled`), and its page says so.
    #[serde(default)]
    pub unwalled: bool,
}

/// People's messages the host wrote to the harness.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveredMessages {
    /// The ids of the messages the host wrote to the harness.
    pub messages: Vec<Uuid>,
}

/// One transcript line of a session report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionLine {
    /// The host's number for the line, from 1; a line sent again is stored once.
    pub seq: i64,
    /// `assistant`, `tool_result`, `result`, `stdout`, `stderr`, …
    pub stream: String,
    pub line: String,
}

/// The most refused destinations a session report carries.
pub const MAX_EGRESS_REFUSED: usize = 32;

/// The longest transcript line either side keeps: the host sends no longer one, and the server
/// cuts what a host sends anyway (a tool result with a whole file in it).
pub const LINE_MAX_BYTES: usize = 64 << 10;

/// Cuts a line to at most [`LINE_MAX_BYTES`] on a character boundary, saying how much went, so
/// the server's cut leaves a line the host cut as it is.
pub fn cut_line(line: &str) -> String {
    if line.len() <= LINE_MAX_BYTES {
        return line.to_owned();
    }
    // Room for the note: `… [` and `] bytes cut]` with up to 20 digits.
    let mut end = LINE_MAX_BYTES - 40;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [{} bytes cut]", &line[..end], line.len() - end)
}

/// How a step ended on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Succeeded,
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
        }
    }
}

/// How a held step ended, as the host reports it (and journals it first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = CompleteStep)]
#[serde(deny_unknown_fields)]
pub struct Complete {
    pub outcome: Outcome,
    /// A failure's short machine reason: `timeout`, `turn cap reached`, `budget cap reached`,
    /// `exit code 1`, `no_changes`, `push_failed`, …
    pub reason: Option<String>,
    /// `ordinary` (the node's `retry:` decides), `infrastructure` (retried by itself) or
    /// `final` (never retried). `ordinary` by default.
    pub class: Option<String>,
    pub exit_code: Option<i32>,
    /// The step's output: `text`, `files_changed`, `files`, `pr_body`, `branch`, `head_sha`,
    /// `commits`, … An object.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub output: Value,
    #[serde(default)]
    pub usage: Usage,
    pub harness: Option<String>,
}

/// A credential in a message: (de)serialized as its text, shown by `Debug` as `<redacted>`,
/// so whatever holds one derives `Debug` and can be logged whole.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }

    /// The credential itself, for the call that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A fresh installation token for a held step's repository.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StepToken {
    /// `owner/name`: the repository of the step's run, when it is about a connected one.
    pub repository: Option<String>,
    /// A token for that repository alone with `contents: write` (fetch and push); null when
    /// the GitHub App is not configured here or the run is about no connected repository (the
    /// host's own git credentials apply).
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub token: Option<Secret>,
}

/// A session's running totals (cumulative).
// Cumulative, so a report sent twice changes nothing. The server reads it: unknown fields are
// refused, missing ones default. The host sends the estimate's fields only when it has them,
// so a report without an estimate (a command, a session before its first message) reads on a
// server older than them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, ToSchema)]
#[schema(as = UsageDoc)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    #[serde(default)]
    pub input_tokens: i64,
    #[serde(default)]
    pub output_tokens: i64,
    /// Null while unknown.
    // A harness killed before its result line reports no cost.
    #[serde(default)]
    pub cost_usd: Option<f64>,
    #[serde(default)]
    pub turns: i32,
    #[serde(default)]
    pub tool_calls: i32,
    #[serde(default)]
    pub model: Option<String>,
    /// The host's estimate of the cost so far, from each message's token counts and its price
    /// table (Claude Code reports its cost only at the end, Codex never). Budgets count the
    /// larger of this and `cost_usd`.
    // Null when the host made none (an older host, a command). Once a result line came, the
    // host sends the reported cost plus its estimate of what came after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_cost_usd: Option<f64>,
    /// `price_table`, or `unknown_model` when a model was priced at the table's dearest row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate_basis: Option<String>,
    /// The output tokens are a lower bound: no result line counted them.
    // The session runs, or was killed before printing one: only the last snapshot of each
    // message was counted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_tokens_lower_bound: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_cut_on_a_character_boundary_once() {
        let line = "é".repeat(LINE_MAX_BYTES);
        let cut = cut_line(&line);
        assert!(cut.len() <= LINE_MAX_BYTES && cut.ends_with(" bytes cut]"), "{}", cut.len());
        assert_eq!(cut_line(&cut), cut, "a cut line is not cut again");
        assert_eq!(cut_line("short"), "short");
    }

    #[test]
    fn a_token_is_sent_as_its_text_and_never_shown_by_debug() {
        let answer = StepToken { repository: Some("acme/widgets".into()), token: Some(Secret::new("ghs_abc123")) };
        assert!(!format!("{answer:?}").contains("ghs_abc123"), "{answer:?}");
        let wire = serde_json::to_value(&answer).unwrap();
        assert_eq!(wire, serde_json::json!({ "repository": "acme/widgets", "token": "ghs_abc123" }));
        let back: StepToken = serde_json::from_value(wire).unwrap();
        assert_eq!(back.token.as_ref().map(Secret::expose), Some("ghs_abc123"));
    }
}
