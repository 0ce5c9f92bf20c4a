//! The run in words: the headline of what it does now or how it ended, the sentence under it,
//! and the links its outputs left.

use serde_json::Value;

use super::strings;
use crate::console::view;
use crate::http::runs::read::Why;
use crate::http::runs::{RunDetail, Step};

/// A reason in words with the machine string kept beside it (`(words, machine)`); a reason
/// with no words is its own words.
fn worded(reason: &str) -> (String, Option<String>) {
    match engine::reasons::words(reason) {
        Some(w) => (w, Some(reason.to_owned())),
        None => (reason.to_owned(), None),
    }
}

/// How a finished run ended, for people: the headline, then the sentence under it and the
/// machine reason it came from. A failure names the step that failed and why in words; a
/// stopped line names the node that would have run once too often and the failure that
/// looped back to it.
pub(super) fn ending(detail: &RunDetail) -> (String, String, Option<String>) {
    let run = &detail.run;
    let reason = run.reason.as_deref().unwrap_or("");
    let failed: Vec<&Step> = detail.steps.iter().filter(|s| s.state == "failed").collect();
    let last_failure = || failed.iter().max_by_key(|s| s.ended_at).copied();
    let step_words = |st: &Step| {
        let why = st.reason.as_deref().map(|r| worded(r).0).or_else(|| st.exit_code.map(|c| format!("The command exited with code {c}")));
        match why {
            Some(w) => format!("{} ({}) failed: {w}.", st.node, st.kind),
            None => format!("{} ({}) failed.", st.node, st.kind),
        }
    };
    let machine = run.reason.clone();
    match run.status.as_str() {
        "completed" if reason == engine::walk::ENDED => ("Completed".into(), "Ended by an end node.".into(), machine),
        "completed" => ("Completed".into(), "Every step that could run has finished.".into(), machine),
        "cancelled" => {
            let why = reason.strip_prefix("cancelled: ").unwrap_or(reason).trim();
            if why.is_empty() {
                ("Cancelled".into(), "Cancelled by a person or the API, with no reason given.".into(), machine)
            } else {
                let (w, _) = worded(why);
                (format!("Cancelled: {w}"), format!("{w}."), machine)
            }
        }
        _ => {
            if let Some(node) = reason.strip_prefix(engine::walk::STOPPED_LINE_PREFIX) {
                let before = last_failure().map(|st| format!(" The last failure before it: {}", step_words(st))).unwrap_or_default();
                let text = format!("{node} would have run more often than the workflow allows (its stop-the-line limit).{before}");
                return (format!("Stopped the line at {node}"), text, machine);
            }
            let at = failed.iter().find(|s| s.reason.as_deref() == Some(reason)).copied().or_else(last_failure);
            let (w, _) = worded(reason);
            match at {
                Some(st) if reason == engine::walk::ENDED => (format!("Failed: ended by {}", st.node), "An end node ended the run as failed.".into(), machine),
                Some(st) if reason == engine::walk::ATTEMPTS_EXHAUSTED || reason.is_empty() => (format!("Failed at {}", st.node), step_words(st), machine),
                Some(st) => (format!("Failed at {}: {w}", st.node), step_words(st), machine),
                None if reason.is_empty() => ("Failed".into(), String::new(), machine),
                None => (format!("Failed: {w}"), format!("{w}."), machine),
            }
        }
    }
}

/// The headline: what the run is doing now, or how it ended, in words.
pub(super) fn headline(why: &Why, detail: &RunDetail) -> (String, &'static str) {
    let d = why.detail.as_ref();
    let s = |k: &str| d.and_then(|d| d.get(k)).and_then(Value::as_str).map(str::to_owned);
    match why.status.as_str() {
        "completed" => (ending(detail).0, "ok"),
        "cancelled" => (ending(detail).0, "off"),
        "failed" => (ending(detail).0, "bad"),
        _ => {
            let text = match why.substate.as_deref() {
                Some("awaiting_signal") if d.and_then(|d| d.get("approval")).and_then(Value::as_bool) == Some(true) => match s("node").as_deref() {
                    Some("$start") | None => "Waiting for approval to start".into(),
                    Some(node) => format!("Waiting for approval at {node}"),
                },
                Some("awaiting_signal") => format!("Waiting for {}", s("signal").unwrap_or_else(|| "a signal".into())),
                Some("sleeping") => match s("until") {
                    Some(until) => format!("Asleep until {}", view::clock(&until)),
                    None => "Asleep".into(),
                },
                Some("unroutable") => {
                    let missing = strings(d.and_then(|d| d.get("missing")));
                    if missing.is_empty() {
                        "Waiting for a host: no host can run this".into()
                    } else {
                        format!("Waiting for a host: none online with {}", missing.join(", "))
                    }
                }
                Some("waiting_for_agent") => format!("Waiting for a host to run {}", s("node").unwrap_or_default()),
                Some("executing") => format!("Running {}", s("node").unwrap_or_default()),
                Some("awaiting_child") => "Waiting on another run".into(),
                Some("awaiting_lease") => {
                    format!("Waiting for the lock of {}", engine::reasons::group_words(&s("group").unwrap_or_default()))
                }
                Some("held") => format!("Held: {}", s("by").unwrap_or_default()),
                _ => "Queued".into(),
            };
            let tone = match why.substate.as_deref() {
                Some("executing") => "run",
                Some("unroutable") => "bad",
                _ => "wait",
            };
            (text, tone)
        }
    }
}

/// Links found in step outputs: a pull request's page, a branch.
pub(super) fn output_links(detail: &RunDetail) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for s in &detail.steps {
        let Some(o) = &s.output else { continue };
        for key in ["html_url", "pull_request_url", "url"] {
            if let Some(u) = o.get(key).and_then(Value::as_str).filter(|u| u.starts_with("https://")) {
                out.push((u.to_owned(), format!("{} output", s.node)));
                break;
            }
        }
        if let Some(b) = o.get("branch").and_then(Value::as_str) {
            out.push((String::new(), format!("branch {b}")));
        }
    }
    out.dedup();
    out
}
