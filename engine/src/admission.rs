//! Admission's rules that need no database: which queues a run goes through and in what
//! order, a concurrency group's name, and how the console names a hold.
//!
//! Before a run starts it passes, in this order:
//!
//! 1. **gates**: its project or workflow paused, then a spent budget (a soft or hard limit of
//!    the project or the org for the UTC day or month). A gate lets every run through once it
//!    opens (unpause, a raised limit, a new day).
//! 2. **its concurrency group** (`concurrency:`): a lease per run, at most `limit` at once.
//!    `queue` waits in line (`awaiting_lease`), `skip` refuses the new run, `drop` cancels the
//!    oldest run in line and takes its place at the back.
//! 3. **board columns** with a WIP limit (`board_limits`) that its workflow moves cards into
//!    (a `board_move` output): a lease per run, at most the limit less the items whose card is
//!    in the column already. A run waits in the column's line while it is full.
//! 4. **its throttle** (`throttle:`): at most `limit` runs admitted per window; beyond it a run
//!    sleeps until the window has room.
//! 5. **the org's cap** on running runs (`orgs.running_cap`, 50 by default): a lease per
//!    running run, across the org's projects. Beyond it runs are queued; a submit is refused
//!    when [`MAX_WAITING`] already wait.
//!
//! The group comes before the cap, so a run waiting for a per-item lock never holds one of the
//! org's slots; the throttle comes before the cap so that a start it counts is a run about to
//! start, not one that then waits. Child runs and dry runs are admitted at once and count
//! nowhere: a parent may be waiting on its child, and a dry run has no effects.
//!
//! The queues, leases and lines live in `store::admission`; this module holds what it decides
//! with.
//!
//! # A run is admitted
//!
//! 1. `runs::submit` asks `store::admission` before it writes the run (child runs and dry runs
//!    skip all of it). The workflow's and project's rows are read `FOR SHARE`: a paused one
//!    holds the run at its gate. Budget rows likewise: a spent limit (hard or soft, the project's
//!    or the org's, for the UTC day or month) holds it, with a wake at the period's end.
//! 2. Its concurrency group's row is locked `FOR UPDATE` and its leases counted. With room and
//!    no one in line, the run takes a lease; otherwise `queue` puts it in line
//!    (`awaiting_lease`), `skip` refuses the submit (409, nothing written) and `drop` cancels the
//!    oldest run in line (`dropped: …`) and takes its place at the back.
//! 3. A throttle is left to the engine: the first advance counts the window's admissions under
//!    the throttle's row lock, in the change that starts the first step, so the window counts
//!    real starts. Beyond its limit the run sleeps; the head of the line has a wake for when the
//!    window has room.
//! 4. The org's row: with fewer leases than its cap and no one in line, the run takes an `org`
//!    lease and is admitted (`admitted_at`, an `advance` wake). Beyond the cap it is queued; with
//!    1,000 in line the submit is refused (429). A submit that finds the row held by another
//!    change does not wait: it leaves the step to the engine.
//! 5. A run in line has no wake. `runs::finish` hands on what the ending run held: as its
//!    change commits, it locks the rows of its queues `FOR SHARE` (last, so no change waits on a
//!    run's lock while holding one, nor upgrades one) and wakes the first runs in line, as many
//!    as there is room for. A woken run admits itself under its own row lock and the queue's, only if it is at the
//!    head of the line (so runs are released in order), and wakes the next while room remains.
//!    Unpausing, raising or removing a budget and raising the cap wake the runs they held.
//!    A queue's leases are counted on its row (`held`), which only a holder of the row
//!    `FOR UPDATE` writes: an ending run, which holds it `FOR SHARE`, leaves a `lease_releases`
//!    row per lease instead, and the next admission, once it holds the row, takes them and counts
//!    them off (`lines::held_in`). Counting the leases themselves cost 1 ms an
//!    admission at 10,000 running runs (migration 0024).
//! 6. A board column with a WIP limit (stage between the group and the throttle) counts the
//!    items whose stored card is in it (the projection `projects_v2_item` webhooks keep) plus the
//!    runs holding a lease in its line, each item once. A run ending, a card leaving the column
//!    (the ingest's `update_item` hands its line to `release` at commit) and a raised or removed
//!    limit wake the runs in line; a run about an item already in the column takes no more room.

use crate::definition::Concurrency;

/// Runs that may wait in an org's line for its cap; a submit beyond it is refused (429). The
/// check is made by a submit that takes the org's lock at once; one that finds it held is left
/// to the engine, which queues rather than refuses.
pub const MAX_WAITING: i32 = 1_000;

/// The queue of the org's cap (and its lease's group key).
pub const ORG_QUEUE: &str = "org";

/// The gate of spent budgets.
pub const BUDGET_QUEUE: &str = "budget";

/// Runs woken at once when room frees in a queue; the woken head admits itself and wakes the
/// ones after it while room remains, so a large release goes in bounded steps.
pub const WAKE_AT_ONCE: i64 = 100;

/// The concurrency group a run takes a lease in, as a queue name.
///
/// A group belongs to its workflow: its `limit` and `policy` are the workflow's, and two
/// workflows naming the same group with different limits would have no single meaning.
/// `group: item` is one group per item (a run about no item shares the workflow's `-` group),
/// `group: repository` one per repository, `group: workflow` the whole workflow, and any
/// other word is a literal name.
pub fn group_queue(project: &str, workflow: &str, c: &Concurrency, item: Option<&ItemRef>) -> String {
    let group = match c.group.as_str() {
        "item" => item.map_or_else(|| "-".to_owned(), |i| format!("item:{}", i.key)),
        "repository" => item.and_then(|i| i.repository.clone()).map_or_else(|| "-".to_owned(), |r| format!("repository:{r}")),
        "workflow" => "workflow".to_owned(),
        literal => literal.to_owned(),
    };
    format!("group:{project}:{workflow}:{group}")
}

/// The name a console shows for a group queue (`item:["github","acme/web",7]`).
pub fn group_name(queue: &str) -> &str {
    queue.splitn(4, ':').nth(3).unwrap_or(queue)
}

/// The item a run is about, as a group reads it.
#[derive(Debug, Clone)]
pub struct ItemRef {
    /// `["github","owner/name",12]`.
    pub key: String,
    pub repository: Option<String>,
}

impl ItemRef {
    /// The repository is the second element of a GitHub item key.
    pub fn from_key(key: String) -> ItemRef {
        let repository = serde_json::from_str::<Vec<serde_json::Value>>(&key).ok().and_then(|parts| parts.get(1).and_then(|r| r.as_str()).map(str::to_owned));
        ItemRef { key, repository }
    }
}

/// The line of a board column with a WIP limit (`board:<project>:<column key>`).
pub fn board_queue(project: &str, column: &str) -> String {
    format!("board:{project}:{}", column_key(column))
}

/// A board column as limits and lines name it: trimmed and lowercased, since `board_move`
/// matches columns without regard to case.
pub fn column_key(column: &str) -> String {
    column.trim().to_lowercase()
}

/// The project and column key of a board line.
pub fn board_of(queue: &str) -> Option<(&str, &str)> {
    let rest = queue.strip_prefix("board:")?;
    rest.split_once(':')
}

/// The board columns a workflow moves cards into, as keys, sorted (the order their lines are
/// locked in).
pub fn board_columns(def: &crate::definition::Definition) -> Vec<String> {
    use crate::definition::{NodeKind, OutputKind};
    let mut columns: Vec<String> = def
        .nodes
        .iter()
        .filter_map(|n| match &n.kind {
            NodeKind::Output(o) if o.kind == OutputKind::BoardMove => o.column.as_deref().map(column_key),
            _ => None,
        })
        .filter(|c| !c.is_empty())
        .collect();
    columns.sort();
    columns.dedup();
    columns
}

/// The throttle queue of a workflow.
pub fn throttle_queue(workflow: &str) -> String {
    format!("throttle:{workflow}")
}

/// The gate of a paused workflow, and of a paused project.
pub fn paused_queue(workflow: &str) -> String {
    format!("paused:{workflow}")
}

pub fn project_paused_queue(project: &str) -> String {
    format!("paused:project:{project}")
}

/// What kind of line a queue is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueKind {
    /// Leases at once: a concurrency group, the org's cap.
    Leases,
    /// Leases at once, less the items on the board column.
    Board,
    /// Starts per window.
    Throttle,
    /// Everyone passes once it opens.
    Gate,
}

pub fn queue_kind(queue: &str) -> QueueKind {
    if queue == ORG_QUEUE || queue.starts_with("group:") {
        QueueKind::Leases
    } else if queue.starts_with("board:") {
        QueueKind::Board
    } else if queue.starts_with("throttle:") {
        QueueKind::Throttle
    } else {
        QueueKind::Gate
    }
}

/// Whether a run goes through admission at all: child runs and dry runs do not.
pub fn applies(child: bool, dry_run: bool) -> bool {
    !child && !dry_run
}

/// Where a queue comes in the order runs pass them. Changes lock queue rows in this order, so
/// two of them never wait on each other's queues.
pub fn stage(queue: &str) -> u8 {
    if queue.starts_with("paused:") {
        0
    } else if queue == BUDGET_QUEUE {
        1
    } else if queue.starts_with("group:") {
        2
    } else if queue.starts_with("board:") {
        3
    } else if queue.starts_with("throttle:") {
        4
    } else {
        5
    }
}

/// Whether an event kind matches a subscription's filters: `*` matches everything,
/// `run.*` every kind with that prefix, anything else itself.
pub fn event_matches(filters: &[String], kind: &str) -> bool {
    filters.iter().any(|f| match f.strip_suffix('*') {
        Some(prefix) => kind.starts_with(prefix),
        None => f == kind,
    })
}

/// The delay before the next attempt of a webhook delivery after `attempts` failed ones:
/// 1 s, 4 s, 16 s, … up to an hour.
pub fn webhook_backoff(attempts: i32) -> std::time::Duration {
    let exp = u32::try_from(attempts.saturating_sub(1).clamp(0, 10)).unwrap_or(10);
    std::time::Duration::from_secs(4u64.saturating_pow(exp).min(3600))
}

/// Attempts of one delivery before it is given up (`failed`); about five hours of retries.
pub const WEBHOOK_ATTEMPTS: i32 = 10;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::ConcurrencyPolicy;

    fn c(group: &str) -> Concurrency {
        Concurrency { group: group.into(), limit: 1, policy: ConcurrencyPolicy::Queue }
    }

    #[test]
    fn a_group_is_the_workflows_and_names_its_item_repository_or_literal() {
        let item = ItemRef::from_key(r#"["github","acme/web",7]"#.into());
        assert_eq!(item.repository.as_deref(), Some("acme/web"));
        assert_eq!(group_queue("p", "w", &c("item"), Some(&item)), r#"group:p:w:item:["github","acme/web",7]"#);
        assert_eq!(group_queue("p", "w", &c("repository"), Some(&item)), "group:p:w:repository:acme/web");
        assert_eq!(group_queue("p", "w", &c("item"), None), "group:p:w:-");
        assert_eq!(group_queue("p", "w", &c("deploy"), None), "group:p:w:deploy");
        assert_eq!(group_name(&group_queue("p", "w", &c("item"), Some(&item))), r#"item:["github","acme/web",7]"#);
    }

    #[test]
    fn queues_are_told_apart_by_their_names() {
        assert_eq!(queue_kind(ORG_QUEUE), QueueKind::Leases);
        assert_eq!(queue_kind("group:p:w:deploy"), QueueKind::Leases);
        assert_eq!(queue_kind(&throttle_queue("w")), QueueKind::Throttle);
        assert_eq!(queue_kind(BUDGET_QUEUE), QueueKind::Gate);
        assert_eq!(queue_kind(&paused_queue("w")), QueueKind::Gate);
        assert_eq!(queue_kind(&project_paused_queue("p")), QueueKind::Gate);
        let board = board_queue("p", " In Progress ");
        assert_eq!((queue_kind(&board), board_of(&board)), (QueueKind::Board, Some(("p", "in progress"))));
        assert!(stage("group:p:w:x") < stage(&board) && stage(&board) < stage(&throttle_queue("w")));
    }

    #[test]
    fn a_workflow_names_the_columns_it_moves_cards_into() {
        let def = crate::definition::parse(
            "name: t\nnodes:\n  a: { output: { github: board_move, column: In Review } }\n  \
             b: { after: [a], output: { github: board_move, column: in progress } }\n  \
             c: { after: [b], output: { github: board_move, column: In progress } }\n",
        )
        .unwrap();
        assert_eq!(board_columns(&def), ["in progress", "in review"]);
    }

    #[test]
    fn event_filters_match_by_name_or_prefix() {
        let f = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(event_matches(&f(&["run.*"]), "run.completed"));
        assert!(!event_matches(&f(&["run.*"]), "step.failed"));
        assert!(event_matches(&f(&["run.failed", "step.failed"]), "step.failed"));
        assert!(event_matches(&f(&["*"]), "step.created"));
        assert!(!event_matches(&f(&["run.failed"]), "run.failed.x"));
    }

    #[test]
    fn webhook_retries_back_off_by_four_up_to_an_hour() {
        let s = |n| webhook_backoff(n).as_secs();
        assert_eq!((s(1), s(2), s(3), s(4)), (1, 4, 16, 64));
        assert_eq!(s(9), 3600);
    }
}
