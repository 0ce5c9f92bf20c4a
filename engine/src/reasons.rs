//! Machine reasons in words for people. Runs and steps carry short machine strings
//! (`stopped_line:build`, `gate:no_commit`, `exit code 3`); the API keeps them as they
//! are, and the console shows these words with the machine string beside them. A reason not
//! known here has no words and is shown as it is.

/// The words for a reason, or `None` when it is not one this knows.
pub fn words(reason: &str) -> Option<String> {
    let reason = reason.trim();
    if let Some(w) = fixed(reason) {
        return Some(w.to_owned());
    }
    let (head, rest) = match reason.split_once(':') {
        Some((h, r)) => (h, r.trim()),
        None => (reason, ""),
    };
    Some(match head {
        "deferred" => match rest {
            "rate_limited" => "Deferred: GitHub's rate limit was reached; it runs again once the limit resets".into(),
            "github_unavailable" => "Deferred: GitHub did not answer; it is tried again".into(),
            why => format!("Deferred: {}", why.replace('_', " ")),
        },
        "stopped_line" => format!("Stopped the line: {rest} would have run more often than the workflow allows"),
        "exit_code" => format!("The command exited with code {rest}"),
        "route" if rest.starts_with("$error") => match rest.trim_start_matches("$error").trim_start_matches(':').trim() {
            "" => "The decision's expression could not be evaluated".into(),
            why => format!("The decision's expression could not be evaluated: {why}"),
        },
        "cancelled" if !rest.is_empty() => format!("Cancelled: {rest}"),
        "revoked" => format!("Revoked: {rest}"),
        _ => return prefixed(reason),
    })
}

/// Reasons that are one fixed string.
fn fixed(reason: &str) -> Option<&'static str> {
    Some(match reason {
        "gate_failed" => "The gate's check failed",
        "gate:no_commit" => "The gate had no commit to check: the work before it pushed nothing",
        "attempts_exhausted" => "Failed on every attempt it was allowed",
        "budget_hard_stop" => "Stopped: a hard budget is spent",
        "lease_expired" => "The host running it stopped answering",
        "route:$unknown" => "The decision matched none of its cases",
        "route:$below_threshold" => "The decision was not confident enough to choose a case",
        "ended:end_run" => "Ended by an end node",
        "engine_error" => "The engine could not go on with this run (the server's log has the cause)",
        "timeout" => "Took longer than its timeout",
        "no_changes" => "Changed no file, though a pull request is opened from this work",
        "resource_limit" => "Stopped: the step reached its host's limit on processes or memory; not retried",
        "edits_refused" => "Changed no file: the agent was refused the edits it tried (its step's permissions or tools forbid them); not retried",
        "turn_cap" => "Stopped: the session passed its turn cap",
        "turn cap reached" => "The agent reached its turn cap",
        "budget cap reached" => "The agent reached its budget cap",
        "stalled" => "The session reported nothing for too long",
        "harness_not_found" => "The host could not start the harness",
        "host_draining" => "The host was shutting down",
        "host_restarted" => "The host restarted before the step began",
        "prepare_failed" => "The host could not prepare the worktree",
        "commit_failed" => "The work could not be committed",
        "push_failed" => "The work could not be pushed",
        "push_refused" => {
            "The repository refused the push (a protected branch, a hook, or a change under .github/workflows, which the App's token may not make); not retried"
        }
        "no executor" => "No executor can run this kind of step",
        "revoked" => "Revoked",
        _ => return None,
    })
}

/// Reasons that start with words and end with a name or a cause.
fn prefixed(reason: &str) -> Option<String> {
    if let Some(code) = reason.strip_prefix("exit code ") {
        return Some(format!("The command exited with code {code}"));
    }
    if let Some(sig) = reason.strip_prefix("killed by signal ") {
        return Some(format!("The process was killed by signal {sig}"));
    }
    if let Some(rest) = reason.strip_prefix("no result line (") {
        return Some(format!("The agent ended without a result ({}", rest));
    }
    if let Some(rest) = reason.strip_prefix("no turn completed (") {
        return Some(format!("The agent ended before finishing a turn ({}", rest));
    }
    if let Some(rest) = reason.strip_prefix("rejected at ") {
        return Some(match rest.split_once(": ") {
            Some((node, why)) => format!("Rejected at {node}: {why}"),
            None => format!("Rejected at {rest}"),
        });
    }
    if let Some(event) = reason.strip_prefix("superseded by ") {
        return Some(format!("Superseded: a newer event ({event}) started another run"));
    }
    if let Some(rest) = reason.strip_prefix("parent ") {
        return rest.strip_suffix(" is no longer running").map(|run| format!("Its parent run {run} ended first"));
    }
    if let Some(rest) = reason.strip_prefix("child ") {
        return rest.split_once(' ').map(|(run, status)| format!("Its child run {run} {status}"));
    }
    if let Some(why) = reason.strip_prefix("turn failed: ") {
        return Some(format!("The agent's turn failed: {why}"));
    }
    None
}

/// A concurrency group in words, from the group part of its queue (`admission::group_name`):
/// `item:["github","acme/web",7]` is `acme/web#7`, `deploy` is `concurrency group deploy`.
pub fn group_words(group: &str) -> String {
    match group {
        "-" => return "the concurrency group of runs about no item".into(),
        "workflow" => return "the workflow's concurrency group".into(),
        _ => {}
    }
    if let Some(repo) = group.strip_prefix("repository:") {
        return format!("repository {repo}");
    }
    if let Some(key) = group.strip_prefix("item:") {
        let item: Option<Vec<serde_json::Value>> = serde_json::from_str(key).ok();
        return match item.as_deref() {
            Some([_, serde_json::Value::String(repo), serde_json::Value::Number(n)]) => format!("{repo}#{n}"),
            Some([_, serde_json::Value::String(repo)]) => repo.clone(),
            _ => format!("item {key}"),
        };
    }
    format!("concurrency group {group}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every documented failure reason, and the ones the host and the engine write, has words
    /// that do not just repeat the machine string.
    #[test]
    fn every_listed_reason_has_words() {
        let reasons = [
            "deferred:rate_limited",
            "deferred:github_unavailable",
            "deferred:some_other_cause",
            "gate_failed",
            "gate:no_commit",
            "attempts_exhausted",
            "budget_hard_stop",
            "lease_expired",
            "route:$unknown",
            "route:$below_threshold",
            "route:$error: no such key",
            "stopped_line:build",
            "rejected at review: too risky",
            "ended:end_run",
            "parent run-1 is no longer running",
            "superseded by issues.edited",
            "revoked",
            "exit code 3",
            "exit_code:2",
            "killed by signal 9",
            "no result line (killed by signal 9)",
            "engine_error",
            "timeout",
            "stalled",
            "turn_cap",
            "edits_refused",
            "resource_limit",
            "host_restarted",
            "child run-2 failed",
            "cancelled: not today",
        ];
        for r in reasons {
            let w = words(r).unwrap_or_else(|| panic!("{r} has no words"));
            assert_ne!(w, r);
            assert!(w.chars().next().is_some_and(char::is_uppercase), "{r}: {w}");
            assert!(!w.contains('_') || r.contains("no_changes"), "{r}: {w}");
        }
        assert_eq!(words("stopped_line:build").unwrap(), "Stopped the line: build would have run more often than the workflow allows");
        assert_eq!(words("something new"), None);
    }

    #[test]
    fn groups_read_as_what_they_lock() {
        assert_eq!(group_words(r#"item:["github","acme/web",7]"#), "acme/web#7");
        assert_eq!(group_words("repository:acme/web"), "repository acme/web");
        assert_eq!(group_words("-"), "the concurrency group of runs about no item");
        assert_eq!(group_words("workflow"), "the workflow's concurrency group");
        assert_eq!(group_words("deploy"), "concurrency group deploy");
    }
}
