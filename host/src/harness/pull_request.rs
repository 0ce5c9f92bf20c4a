//! The pull request's description: asked of the agent in its prompt, read from its answer.

/// The line that comes before the pull request's description in an answer.
pub const PR_MARKER: &str = "PULL REQUEST";

/// What is added to the prompt when a pull request will be opened from the step's work: the
/// agent knows why it made each change, so it writes the description, from the repository's
/// template when there is one.
pub fn pr_instructions(template: Option<&str>, issue: Option<i64>) -> String {
    let closes = issue.map(|n| format!(" Its first line is `Closes #{n}`.")).unwrap_or_default();
    let fill = match template {
        Some(t) if !t.trim().is_empty() => format!(" Fill in the repository's pull request template:\n\n{}\n", t.trim()),
        _ => " Say what changed and why, briefly.".to_owned(),
    };
    format!(
        "\n\n---\nWhen you are done, end your answer with the pull request's description: a line that says exactly {PR_MARKER}, then the description.{closes}{fill}"
    )
}

/// The pull request's description in an answer: what follows the last marker line, or the
/// whole answer; with `Closes #<issue>` as its first line.
pub fn pr_body(answer: &str, issue: Option<i64>) -> String {
    let lines: Vec<&str> = answer.lines().collect();
    let body = match lines.iter().rposition(|l| l.trim().trim_matches(['*', '#', ' ']) == PR_MARKER) {
        Some(i) => lines[i + 1..].join("\n"),
        None => answer.to_owned(),
    };
    let body = body.trim().to_owned();
    match issue {
        Some(n) if !body.lines().next().is_some_and(|l| l.trim().eq_ignore_ascii_case(&format!("closes #{n}"))) => format!("Closes #{n}\n\n{body}"),
        _ => body,
    }
}
