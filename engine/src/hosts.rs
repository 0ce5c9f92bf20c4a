//! The host protocol's model: what a host advertises (capabilities), what it is handed when it
//! claims a crew step (an [`Assignment`]), what its session reports carry ([`Usage`]), and the
//! branch a crew step works on. Pure data and functions; the writes are in `store::hosts`.
//!
//! # How spend is known
//!
//! Claude Code prints its cost only on its result lines; Codex never prints one, and prints its
//! tokens only when a turn completes. So that a cap stops a session while it spends, not after:
//!
//! 1. **The host estimates, as the session goes.** `host/src/prices.rs` prices token counts
//!    (input, 5-minute and 1-hour cache writes, cache reads, output) with a price table per
//!    model, USD per million tokens. Claude Code: the last snapshot of each `message.id` of its
//!    assistant lines (their output tokens a lower bound until a result line). Codex: its
//!    session file, `$CODEX_HOME/sessions/…/rollout-…-<thread>.jsonl` (each attempt has its own
//!    Codex home), which it writes as it goes: a `token_usage_record` with the thread's running
//!    totals right after each model call, a `token_count` event after the call's tool; its
//!    `turn.completed` when the turn ends. A model is priced by the longest `match` prefix of
//!    its name, else by the longest `family` prefix (a newer release of a known family:
//!    `estimate_basis: model_family`), else at the table's most expensive row (`unknown_model`).
//!    The table is data, `host/prices.json`, embedded in the binary, with the models each pinned
//!    CLI uses by default or offers (`harnesses`; `shopfloor check --host` names those the table
//!    prices only by family or not at all); an operator replaces it with `shopfloor host
//!    --prices FILE` (`SHOPFLOOR_HOST_PRICES`, the same JSON shape) when prices change before a
//!    release does. Every session report carries the estimate (`usage.estimated_cost_usd`)
//!    beside the reported cost (`usage.cost_usd`, null until a result line), and whether the
//!    output tokens are a lower bound. After a result line the estimate is that line's cost
//!    plus the estimate of what came after it, so once the last result comes it is the
//!    reported cost.
//! 2. **The host stops at the caps.** The assignment's caps `usd` is the least of the node's
//!    cap and what the run, the project and the org may still spend. Claude Code is told it
//!    (`--max-budget-usd`) and checks it after each response; the host checks its own figure
//!    after every line it reads and interrupts the session once it reaches it (`budget cap
//!    reached`, final), without waiting for the server.
//! 3. **The server counts the larger.** `engine::hosts::spend_figure` is the larger of the
//!    estimate and the reported cost (the stored one when a report has none);
//!    `store::hosts::record_session_spend` records the difference from what it recorded for the
//!    session before (`step_sessions.spent_usd`, under the session row's lock) against the run
//!    (`runs.spent_usd`) and the project's day (`spend`), so nothing counts twice. While no cost
//!    was reported the figure only grows. When the reported cost comes it replaces the estimate:
//!    a reported cost below the estimate records a negative correction, which lowers the run's
//!    total and today's row, never below zero (a correction after midnight UTC lowers the new
//!    day's row, not the day the estimate was counted on).
//! 4. **Hard caps act on that figure.** A report whose spend crossed a hard limit fails the step
//!    `budget_hard_stop` in the same change and its answer says stop; heartbeats check the same
//!    (`store::budgets::hard_stop`). The host interrupts the harness.
//! 5. **The last word counts.** Interrupted, for whatever reason, a session's CLI has the host's
//!    grace to finish: Claude Code prints a result line with the whole session's cost and turns
//!    (the interrupted call included); Codex exits at once, its session file holding the count
//!    of every call it completed. The host reads both to the end and reports the figures, also
//!    for a step the server already ended (cancelled, stopped by a hard budget): the server
//!    records them without changing the step (`complete` on a step that ended under its
//!    holder), so the spend is the CLI's own final figure where it printed one, else the last
//!    estimate, marked as one (`cost_is_estimate`).
//! 6. **Figures say what they are.** `GET …/runs/{run}` gives each crew step's `session`:
//!    `cost_usd`, `estimated_cost_usd`, `estimate_basis`, `spent_usd` and `cost_is_estimate`
//!    (no reported cost yet), `output_tokens_lower_bound`; the run page shows "≈ $0.42
//!    estimated" and "at least N out". The org's spend (`GET …/spend`, budgets) holds the estimate
//!    while a session runs and its reported cost after.

use protocol::{Caps, Item, Usage};
use serde::{Deserialize, Serialize};

use crate::ids::{RunId, StepId, is_word};

/// A capability a host advertises and a node `requires`: `linux`, `arm64`, `gpu`,
/// `harness:claude-code`. Lowercase letters, digits and `:._-`, 1 to 64 characters.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Capability(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a capability: use 1-64 lowercase letters, digits and `:._-`, starting with a letter or digit")]
pub struct BadCapability(pub String);

impl Capability {
    pub fn parse(s: &str) -> Result<Capability, BadCapability> {
        if is_word(s, 64, b":._-") { Ok(Capability(s.to_owned())) } else { Err(BadCapability(s.chars().take(80).collect())) }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What a crew step requires of a host: its node's `requires`, and `harness:<its harness>`, so
/// that a host that cannot run the harness never claims the step (it would fail it
/// `harness_not_found` on every retry).
pub fn crew_requires(requires: &[String], harness: &str) -> Vec<String> {
    let needed = format!("harness:{harness}");
    let mut all = requires.to_vec();
    if !all.contains(&needed) {
        all.push(needed);
    }
    all
}

/// The longest slug of an issue title in a branch name.
const SLUG_MAX: usize = 40;

/// An issue title as a branch name's slug: lowercase, each run of characters other than
/// `a-z0-9` one hyphen, hyphens trimmed, cut at 40 characters, a hyphen left at the end by the
/// cut dropped.
pub fn slug(title: &str) -> String {
    let mut out = String::new();
    for c in title.to_lowercase().chars() {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let trimmed = out.trim_matches('-');
    let cut: String = trimmed.chars().take(SLUG_MAX).collect();
    cut.trim_end_matches('-').to_owned()
}

/// The branch a crew step works on: `shopfloor/<issue>-<slug>` for an issue, so that a later
/// run on the same issue goes on from the earlier run's commits; `shopfloor/<run>` when the run
/// is about no issue.
pub fn branch_name(number: Option<i64>, title: Option<&str>, run: RunId) -> String {
    match number {
        Some(n) => issue_branch(n, title.unwrap_or_default()),
        None => format!("shopfloor/{run}"),
    }
}

/// The branch of a run about issue `number`: `shopfloor/<n>-<slug of the title>`, or
/// `shopfloor/<n>` when the title leaves no slug. A pull request output opens from it when
/// its crew step named no branch (`github::outputs`).
pub fn issue_branch(number: i64, title: &str) -> String {
    let s = slug(title);
    if s.is_empty() { format!("shopfloor/{number}") } else { format!("shopfloor/{number}-{s}") }
}

/// A step handed to the host, with what it needs to run it: what `claim` answers.
// The OpenAPI document names it `AssignmentDoc`, and its `RepositoryRef` `RepositoryDoc`, as
// before the API took this type for its own. Its caps and item are the `protocol` crate's; it
// stays the server's own because the host reads ids as text and never journals the token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema), schema(as = AssignmentDoc))]
pub struct Assignment {
    #[cfg_attr(feature = "schema", schema(value_type = String, example = "step-aaaaaaaaaaaaaaaaaaaaaaaaaa"))]
    pub step: StepId,
    #[cfg_attr(feature = "schema", schema(value_type = String, example = "run-aaaaaaaaaaaaaaaaaaaaaaaaaa"))]
    pub run: RunId,
    pub node: String,
    pub visit: i32,
    pub attempt: i32,
    /// `claude-code`, `codex` or `command`.
    pub harness: String,
    pub model: Option<String>,
    /// The node's prompt, rendered over the run's context.
    pub prompt: String,
    /// For the `command` harness: the program and its arguments.
    pub command: Vec<String>,
    pub caps: Caps,
    /// The repository to work in; none for a run about no connected repository (the step runs
    /// in a scratch directory).
    pub repository: Option<RepositoryRef>,
    /// The branch to commit to and push (never forced) when there is a repository:
    /// `shopfloor/<issue>-<slug>`.
    pub branch: Option<String>,
    /// The issue or pull request the run is about.
    pub item: Option<Item>,
    /// A pull request is opened from this step's work later in the run: the agent is asked to
    /// write its description.
    pub pr_body: bool,
    /// `expect: changes`: a step that changed no file fails with `no_changes`.
    pub expect_changes: bool,
    /// What the agent may do (its node's `permissions`, `tools`, `mcp`, `network`).
    pub policy: protocol::Policy,
    /// The lease lasts this long without a heartbeat or a session report.
    pub lease_secs: u64,
    /// The run's W3C trace context (`00-<trace id>-<span id>-<flags>`): the host's span of
    /// the attempt joins the run's trace. Absent when the server exports no traces.
    pub traceparent: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema), schema(as = RepositoryDoc))]
pub struct RepositoryRef {
    /// `owner/name`, lowercased.
    pub full_name: String,
    pub clone_url: String,
    pub default_branch: String,
    /// A short-lived installation token for this repository only, used for fetch and push;
    /// none when the GitHub App is not configured (the host's own git credentials apply).
    // A `Secret`: `Debug` shows `<redacted>`, like the host's side of the same message.
    #[cfg_attr(feature = "schema", schema(value_type = Option<String>))]
    pub token: Option<protocol::Secret>,
}

/// A session's reported cost, when it is a cost.
pub fn reported(usage: &Usage) -> Option<f64> {
    usage.cost_usd.filter(|c| c.is_finite() && *c >= 0.0).map(round_cost)
}

/// A session's estimated cost, when it is one.
pub fn estimated(usage: &Usage) -> Option<f64> {
    usage.estimated_cost_usd.filter(|c| c.is_finite() && *c >= 0.0).map(round_cost)
}

/// What a session has spent, as far as the server knows: the larger of the host's estimate and
/// the harness's reported cost (`reported` falls back to what an earlier report said). A host
/// whose harness reported its cost sends the reported figure as its estimate too (plus what came
/// after it), so once the result line comes the figure is the reported cost, lower or higher
/// than the estimate was.
pub fn spend_figure(usage: &Usage, reported_before: Option<f64>) -> f64 {
    // Reported costs are cumulative: a lower one than before is a stale report.
    let reported = match (reported(usage), reported_before) {
        (Some(now), Some(before)) => now.max(before),
        (now, before) => now.or(before).unwrap_or(0.0),
    };
    round_cost(reported.max(estimated(usage).unwrap_or(0.0)))
}

/// A cost rounded to a millionth of a dollar: harnesses report float noise past the sixth
/// digit (`0.36616580000000004`), and cents would be too coarse for one call.
pub fn round_cost(usd: f64) -> f64 {
    (usd * 1_000_000.0).round() / 1_000_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assignments_token_goes_out_as_its_text_and_never_shows_in_debug() {
        let repo = RepositoryRef {
            full_name: "acme/widgets".into(),
            clone_url: "https://github.com/acme/widgets.git".into(),
            default_branch: "main".into(),
            token: Some(protocol::Secret::new("ghs_installation")),
        };
        assert!(!format!("{repo:?}").contains("ghs_installation"), "{repo:?}");
        assert_eq!(serde_json::to_value(&repo).unwrap()["token"], "ghs_installation");
    }

    #[test]
    fn slugs_follow_the_branch_rules() {
        assert_eq!(slug("Add a state core!"), "add-a-state-core");
        assert_eq!(slug("  --Fix: crash on  start--  "), "fix-crash-on-start");
        assert_eq!(slug("Ünïcode tïtle"), "n-code-t-tle");
        // Cut at 40, and a hyphen the cut leaves at the end is dropped.
        let long = "abcdefghij abcdefghij abcdefghij abcdefgh xyz";
        assert_eq!(slug(long), "abcdefghij-abcdefghij-abcdefghij-abcdefg");
        let cut_at_hyphen = "abcdefghij abcdefghij abcdefghij abcdef ghi";
        assert_eq!(slug(cut_at_hyphen), "abcdefghij-abcdefghij-abcdefghij-abcdef");
        assert_eq!(slug("!!!"), "");
    }

    #[test]
    fn branches_name_the_issue_or_the_run() {
        let run = RunId::mint();
        assert_eq!(branch_name(Some(42), Some("Add state core"), run), "shopfloor/42-add-state-core");
        assert_eq!(branch_name(Some(42), Some("???"), run), "shopfloor/42");
        assert_eq!(branch_name(None, Some("x"), run), format!("shopfloor/{run}"));
    }

    #[test]
    fn branch_names_are_slugs_of_the_title() {
        assert_eq!(issue_branch(42, "Fix the Widget: it's broken!"), "shopfloor/42-fix-the-widget-it-s-broken");
        assert_eq!(issue_branch(7, "!!!"), "shopfloor/7");
        assert!(issue_branch(1, &"long ".repeat(40)).len() <= "shopfloor/1-".len() + 41);
    }

    #[test]
    fn a_crew_step_requires_its_harness() {
        assert_eq!(crew_requires(&["linux".into()], "claude-code"), ["linux", "harness:claude-code"]);
        assert_eq!(crew_requires(&["harness:codex".into()], "codex"), ["harness:codex"]);
    }

    #[test]
    fn capabilities_are_parsed() {
        for ok in ["linux", "harness:claude-code", "gpu.a100", "arm64"] {
            assert!(Capability::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Linux", "-x", "a b", &"x".repeat(65)] {
            assert!(Capability::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn costs_are_rounded_to_a_millionth() {
        assert_eq!(round_cost(0.366_165_800_000_000_04), 0.366_166);
        assert_eq!(round_cost(1.0), 1.0);
    }
}
