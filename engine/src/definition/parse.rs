//! Parsing a workflow's YAML into a `Definition`, checking every rule of validation and
//! reporting every problem at once, each with its line, column and path.
//!
//! The work is in three passes: `yaml` reads the text into a tree that keeps positions,
//! this module and `node` read that tree into the typed model (noting each edge as they go),
//! and `graph` checks the edges: that they name nodes, that every node can be reached, and
//! that every cycle passes a gate or a decision.

mod graph;
mod kinds;
mod node;
mod read;
mod yaml;

use std::str::FromStr;

pub use read::Problem;
use read::{Cx, boolean, count, duration, expression, mapping, nonempty_string, one_of, string, usd};
use yaml::Node as YNode;

use super::model::{Budget, Concurrency, ConcurrencyPolicy, Definition, GithubTrigger, ScheduleTrigger, Senders, Throttle, Triggers};

const TOP_KEYS: &[&str] = &["name", "on", "concurrency", "throttle", "budget", "approval", "nodes", "stop_the_line_attempts"];

/// Parses and validates a workflow definition.
///
/// # Errors
/// Every problem found, in file order.
pub fn parse(source: &str) -> Result<Definition, Vec<Problem>> {
    let root = match yaml::load(source) {
        Ok(Some(root)) => root,
        Ok(None) => {
            return Err(vec![Problem {
                line: 1,
                col: 1,
                path: String::new(),
                message: "the file holds no workflow (it needs at least `name` and `nodes`)".to_owned(),
            }]);
        }
        Err(e) => {
            return Err(vec![Problem { line: e.pos.line, col: e.pos.col, path: String::new(), message: format!("YAML syntax error: {}", e.message) }]);
        }
    };
    let mut cx = Cx::default();
    let definition = definition(&mut cx, &root);
    let mut problems = cx.problems;
    match definition {
        Some(definition) if problems.is_empty() => Ok(definition),
        _ => {
            if problems.is_empty() {
                // Every reader that gives up records why; this guards the rule, not a case.
                problems.push(Problem { line: 1, col: 1, path: String::new(), message: "the workflow is not valid".to_owned() });
            }
            problems.sort_by(|a, b| (a.line, a.col, &a.path).cmp(&(b.line, b.col, &b.path)));
            problems.dedup();
            Err(problems)
        }
    }
}

fn definition(cx: &mut Cx, root: &YNode) -> Option<Definition> {
    if !matches!(root.value, yaml::Value::Map(_)) {
        read::type_error(cx, root, "", "a workflow (a mapping with `name`, `nodes` and so on)");
        return None;
    }
    let f = mapping(cx, root, "", TOP_KEYS)?;
    let name = f.must(cx, "name", workflow_name);
    let on = f.optional(cx, "on", triggers).map(Option::unwrap_or_default);
    let concurrency = f.optional(cx, "concurrency", concurrency);
    let throttle = f.optional(cx, "throttle", throttle);
    let budget = f.optional(cx, "budget", budget).map(Option::unwrap_or_default);
    let approval_required = f.optional(cx, "approval", approval_policy).map(|a| a.unwrap_or(false));
    let stop_the_line_attempts = f.optional(cx, "stop_the_line_attempts", |cx, n, p| count(cx, n, p, 1)).map(|n| n.unwrap_or(3));
    let nodes = f.must(cx, "nodes", |cx, n, p| {
        let (skeletons, nodes) = node::nodes(cx, n, p)?;
        graph::check(cx, &skeletons);
        nodes
    });
    Some(Definition {
        name: name?,
        on: on?,
        concurrency: concurrency?,
        throttle: throttle?,
        budget: budget?,
        approval_required: approval_required?,
        stop_the_line_attempts: stop_the_line_attempts?,
        nodes: nodes?,
    })
}

fn approval_policy(cx: &mut Cx, node: &YNode, path: &str) -> Option<bool> {
    one_of(cx, node, path, &[("required", true), ("none", false)])
}

fn triggers(cx: &mut Cx, node: &YNode, path: &str) -> Option<Triggers> {
    let f = mapping(cx, node, path, &["github", "schedule"])?;
    let github = f.optional(cx, "github", github);
    let schedule = f.optional(cx, "schedule", schedule);
    Some(Triggers { github: github?, schedule: schedule? })
}

fn github(cx: &mut Cx, node: &YNode, path: &str) -> Option<GithubTrigger> {
    let f = mapping(cx, node, path, &["events", "if", "senders"])?;
    let events = f.must(cx, "events", events);
    let condition = f.optional(cx, "if", expression);
    let senders = f.optional_one_of(cx, "senders", &[("trusted", Senders::Trusted), ("any", Senders::Any)]).map(Option::unwrap_or_default);
    Some(GithubTrigger { events: events?, condition: condition?, senders: senders? })
}

/// A workflow's name is shown in lists, URLs and terminals: printable characters only (a
/// control character, an escape sequence, would act on an operator's terminal).
fn workflow_name(cx: &mut Cx, node: &YNode, path: &str) -> Option<String> {
    let name = nonempty_string(cx, node, path)?;
    if name.chars().any(char::is_control) {
        cx.report(node.pos, path, format!("{name:?} holds a control character: use printable characters only"));
        return None;
    }
    Some(name)
}

/// Event names as GitHub sends them: `issues`, `issues.labeled`, `projects_v2_item.edited`.
fn events(cx: &mut Cx, node: &YNode, path: &str) -> Option<Vec<String>> {
    let items = read::strings_at(cx, node, path)?;
    if items.is_empty() {
        cx.report(node.pos, path, "give at least one event, such as issues.labeled");
        return None;
    }
    let mut ok = true;
    for (i, (event, pos)) in items.iter().enumerate() {
        let word = |w: &str| w.starts_with(|c: char| c.is_ascii_lowercase()) && w.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        let valid = match event.split_once('.') {
            Some((name, action)) => word(name) && word(action),
            None => word(event),
        };
        if !valid {
            ok = false;
            cx.report(*pos, &format!("{path}[{i}]"), format!("`{event}` is not an event name such as issues or issues.labeled"));
        }
    }
    ok.then(|| items.into_iter().map(|(e, _)| e).collect())
}

fn schedule(cx: &mut Cx, node: &YNode, path: &str) -> Option<ScheduleTrigger> {
    let f = mapping(cx, node, path, &["cron", "tz"])?;
    let cron = f.must(cx, "cron", |cx, n, p| {
        let text = string(cx, n, p)?;
        match croner::Cron::from_str(&text) {
            Ok(_) => Some(text),
            Err(e) => {
                cx.report(n.pos, p, format!("`{text}` is not a cron expression: {e}"));
                None
            }
        }
    });
    let tz = f.optional(cx, "tz", |cx, n, p| {
        let text = string(cx, n, p)?;
        match text.parse::<chrono_tz::Tz>() {
            Ok(_) => Some(text),
            Err(_) => {
                cx.report(n.pos, p, format!("`{text}` is not a time zone such as Europe/Paris or UTC"));
                None
            }
        }
    });
    Some(ScheduleTrigger { cron: cron?, tz: tz? })
}

fn concurrency(cx: &mut Cx, node: &YNode, path: &str) -> Option<Concurrency> {
    let f = mapping(cx, node, path, &["group", "limit", "policy"])?;
    let group = f.optional(cx, "group", nonempty_string);
    let limit = f.optional(cx, "limit", |cx, n, p| count(cx, n, p, 1));
    let policy = f.optional_one_of(cx, "policy", &[("queue", ConcurrencyPolicy::Queue), ("skip", ConcurrencyPolicy::Skip), ("drop", ConcurrencyPolicy::Drop)]);
    Some(Concurrency { group: group?.unwrap_or_else(|| "item".to_owned()), limit: limit?.unwrap_or(1), policy: policy?.unwrap_or(ConcurrencyPolicy::Queue) })
}

fn throttle(cx: &mut Cx, node: &YNode, path: &str) -> Option<Throttle> {
    let f = mapping(cx, node, path, &["per", "limit"])?;
    let per = f.must(cx, "per", duration);
    let limit = f.must(cx, "limit", |cx, n, p| count(cx, n, p, 1));
    Some(Throttle { per: per?, limit: limit? })
}

fn budget(cx: &mut Cx, node: &YNode, path: &str) -> Option<Budget> {
    let f = mapping(cx, node, path, &["max_cycles", "usd_per_run", "hard"])?;
    let defaults = Budget::default();
    let max_cycles = f.optional(cx, "max_cycles", |cx, n, p| count(cx, n, p, 1));
    let usd_per_run = f.optional(cx, "usd_per_run", usd);
    let hard = f.optional(cx, "hard", boolean);
    Some(Budget { max_cycles: max_cycles?.unwrap_or(defaults.max_cycles), usd_per_run: usd_per_run?, hard: hard?.unwrap_or(defaults.hard) })
}
