//! The harness readers against the transcripts in `host/tests/fixtures`, in the format Claude
//! Code and Codex print (their README says what each is shaped after).

use super::*;
use serde_json::json;

/// `host/tests/fixtures/<name>.jsonl`. Leaked, so that a test keeps its lines as `&str`.
fn fixture(name: &str) -> &'static str {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(format!("{name}.jsonl"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()));
    Box::leak(text.into_boxed_str())
}

fn read(kind: Kind, model: Option<&str>, lines: &[&str]) -> Reader {
    let mut r = Reader::new(kind, model.map(str::to_owned), Arc::new(Prices::shipped()));
    for l in lines {
        r.line(l);
    }
    r
}

fn run(name: &str, model: Option<&str>, exit: Exit) -> Ended {
    let kind = if name.starts_with("codex/") { Kind::Codex } else { Kind::ClaudeCode };
    let lines: Vec<&str> = fixture(name).lines().collect();
    read(kind, model, &lines).finish(exit, None)
}

const OK: Exit = Exit { code: Some(0), signal: None };
const ONE: Exit = Exit { code: Some(1), signal: None };

/// What a test checks of a session: outcome, class, reason, cost, estimate, tokens in and
/// out, turns, tool calls, model.
#[derive(Debug, PartialEq)]
struct Seen {
    success: bool,
    class: &'static str,
    reason: Option<String>,
    cost: Option<f64>,
    estimated: Option<f64>,
    tokens: (i64, i64),
    lower_bound: bool,
    turns: i32,
    tools: i32,
    model: Option<String>,
}

fn seen(e: &Ended) -> Seen {
    Seen {
        success: e.success,
        class: e.class,
        reason: e.reason.clone(),
        cost: e.usage.cost_usd,
        estimated: e.usage.estimated_cost_usd,
        tokens: (e.usage.input_tokens, e.usage.output_tokens),
        lower_bound: e.usage.output_tokens_lower_bound,
        turns: e.usage.turns,
        tools: e.usage.tool_calls,
        model: e.usage.model.clone(),
    }
}

fn sonnet() -> Option<String> {
    Some("claude-sonnet-4-5-20250929".into())
}

impl Seen {
    /// A session of Sonnet: its outcome (success, class, reason), its cost and estimate, its
    /// tokens in and out (and whether out is a lower bound), and its turns and tool calls.
    fn sonnet(outcome: (bool, &'static str, Option<&str>), cost: (Option<f64>, Option<f64>), tokens: (i64, i64, bool), turns_tools: (i32, i32)) -> Seen {
        let ((success, class, reason), (cost, estimated), (tokens_in, tokens_out, lower_bound), (turns, tools)) = (outcome, cost, tokens, turns_tools);
        Seen { success, class, reason: reason.map(str::to_owned), cost, estimated, tokens: (tokens_in, tokens_out), lower_bound, turns, tools, model: sonnet() }
    }
}

#[test]
fn a_claude_success_gives_cost_turns_tokens_and_model() {
    let e = run("claude/success", Some("claude-sonnet-4-5"), OK);
    let want = Seen::sonnet((true, "ordinary", None), (Some(0.055_307), Some(0.055_307)), (51_843, 583, false), (3, 2));
    assert_eq!(seen(&e), want);
    assert_eq!(e.text, "The parser now returns Error::Empty on empty input instead of panicking.");
    assert_eq!(e.usage.estimate_basis.as_deref(), Some("price_table"));
}

#[test]
fn a_helper_models_tokens_and_cost_count_and_the_model_is_the_one_asked_for() {
    let e = run("claude/multi_model", Some("claude-sonnet-4-5"), OK);
    assert!(e.success);
    // Sonnet's 51,843 in and 583 out, plus haiku's 14,936 and 125: only modelUsage has them.
    assert_eq!((e.usage.input_tokens, e.usage.output_tokens, e.usage.cost_usd), (66_779, 708, Some(0.057_428)));
    assert_eq!(e.usage.model, sonnet());
    // The alias's family finds it too; without a request the init line's model does.
    assert_eq!(run("claude/multi_model", Some("sonnet"), OK).usage.model, sonnet());
    assert_eq!(run("claude/multi_model", None, OK).usage.model, sonnet());
    assert_eq!(run("claude/multi_model", Some("claude-haiku-4-5"), OK).usage.model.as_deref(), Some("claude-haiku-4-5-20251001"));
}

#[test]
fn caps_have_their_own_reasons_and_classes() {
    let e = run("claude/max_turns", None, ONE);
    assert_eq!((e.success, e.class, e.reason.as_deref(), e.usage.turns), (false, "ordinary", Some("turn cap reached"), 3));
    assert_eq!((e.usage.cost_usd, e.usage.input_tokens, e.usage.output_tokens), (Some(0.037_266), 24_853, 412));
    let e = run("claude/max_budget", None, ONE);
    assert_eq!((e.class, e.reason.as_deref()), ("final", Some("budget cap reached")));
    // `usage` is all zeros on a budget stop: the counts and the model are modelUsage's.
    assert_eq!((e.usage.input_tokens, e.usage.output_tokens, e.usage.cost_usd), (51_843, 583, Some(0.055_307)));
    assert_eq!(e.usage.model, sonnet());
}

#[test]
fn an_error_during_execution_is_an_ordinary_failure_with_its_error() {
    let e = run("claude/sigterm", None, Exit { code: Some(143), signal: None });
    assert_eq!((e.success, e.class, e.reason.as_deref()), (false, "ordinary", Some("error during execution: Request was aborted.")));
    assert_eq!((e.usage.cost_usd, e.usage.turns, e.usage.output_tokens, e.usage.output_tokens_lower_bound), (Some(0.037_266), 2, 412, false));
    assert_eq!(e.exit_code, Some(143));
}

/// Interrupted while streaming, Claude Code prints a result line with no cost, usage or
/// `modelUsage`: what the session's messages cost stays counted, it is not taken for zero.
#[test]
fn a_result_line_without_figures_keeps_what_the_messages_cost() {
    let lines: Vec<&str> = fixture("claude/aborted").lines().collect();
    let before = read(Kind::ClaudeCode, None, &lines[..lines.len() - 1]).usage().clone();
    assert!(before.estimated_cost_usd.is_some_and(|c| c > 0.0), "{before:?}");
    let e = run("claude/aborted", None, Exit { code: Some(130), signal: None });
    assert_eq!((e.success, e.class), (false, "ordinary"));
    assert_eq!(e.reason.as_deref(), Some("error during execution: [ede_diagnostic] result_type=user last_content_type=n/a stop_reason=null"));
    assert_eq!((e.usage.cost_usd, e.usage.estimated_cost_usd), (None, before.estimated_cost_usd));
    assert_eq!((e.usage.input_tokens, e.usage.output_tokens, e.usage.output_tokens_lower_bound), (before.input_tokens, before.output_tokens, true));
}

/// An `error_…` subtype is a failure even on a line that does not say `is_error`.
#[test]
fn an_error_subtype_fails_without_is_error() {
    let mut lines: Vec<String> = fixture("claude/max_turns").lines().map(str::to_owned).collect();
    let mut result: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    result.as_object_mut().unwrap().remove("is_error");
    *lines.last_mut().unwrap() = result.to_string();
    let e = read(Kind::ClaudeCode, None, &lines.iter().map(String::as_str).collect::<Vec<_>>()).finish(ONE, None);
    assert_eq!((e.success, e.reason.as_deref()), (false, Some("turn cap reached")));
}

#[test]
fn an_unknown_model_is_a_final_failure_in_words_and_never_synthetic() {
    let e = run("claude/api_error_404", Some("claude-fable-9"), ONE);
    assert_eq!((e.success, e.class, e.subtype.as_deref()), (false, "final", Some("success")));
    let reason = e.reason.clone().unwrap();
    assert!(reason.starts_with("API error 404: There's an issue with the selected model (claude-fable-9)"), "{reason}");
    assert!(reason.chars().count() <= 200, "{reason}");
    assert_eq!(e.usage.model.as_deref(), Some("claude-fable-9"));
    assert_eq!((e.usage.cost_usd, e.usage.input_tokens, e.usage.output_tokens), (Some(0.0), 0, 0));
    // Without the init line or a request, still no `<synthetic>`.
    let lines: Vec<&str> = fixture("claude/api_error_404").lines().skip(1).collect();
    assert_eq!(read(Kind::ClaudeCode, None, &lines).usage().model, None);
    // A 5xx or an overload may pass on a later try.
    let overloaded = fixture("claude/api_error_404").replace(r#""api_error_status":404"#, r#""api_error_status":529"#);
    let lines: Vec<&str> = overloaded.lines().collect();
    assert_eq!(read(Kind::ClaudeCode, None, &lines).finish(ONE, None).class, "ordinary");
}

#[test]
fn a_killed_claude_keeps_each_messages_last_snapshot_an_estimate_and_a_lower_bound() {
    let killed = Exit { code: None, signal: Some(9) };
    let e = run("claude/no_result", None, killed);
    assert_eq!((e.success, e.class, e.reason.as_deref()), (false, "ordinary", Some("no result line (killed by signal 9)")));
    // One message, three lines: its last snapshot (412 out), counted once.
    let want = Seen::sonnet((false, "ordinary", Some("no result line (killed by signal 9)")), (None, Some(0.037_266)), (24_853, 412, true), (1, 2));
    assert_eq!(seen(&e), want);
    let lines: Vec<&str> = fixture("claude/no_result").lines().collect();
    let timed_out = read(Kind::ClaudeCode, None, &lines).finish(killed, Some("timeout"));
    assert_eq!(timed_out.reason.as_deref(), Some("timeout"));
}

#[test]
fn the_estimate_grows_with_each_message_until_the_result_replaces_it() {
    let lines: Vec<&str> = fixture("claude/success").lines().collect();
    let mut r = Reader::new(Kind::ClaudeCode, None, Arc::new(Prices::shipped()));
    let mut estimates = Vec::new();
    for l in &lines {
        r.line(l);
        estimates.push((r.usage().estimated_cost_usd, r.usage().cost_usd));
    }
    assert_eq!(estimates[0], (None, None), "the init line costs nothing");
    assert_eq!(estimates[3], (Some(0.037_266), None), "msg_1 at its last snapshot");
    assert_eq!(estimates[6], (Some(0.055_307), None), "msg_1 and msg_2");
    assert_eq!(estimates[7], (Some(0.055_307), Some(0.055_307)), "the result's cost");
    assert!(estimates.windows(2).all(|w| w[0].0.unwrap_or(0.0) <= w[1].0.unwrap_or(0.0)));
}

#[test]
fn an_unknown_model_is_estimated_at_the_dearest_price_and_says_so() {
    let lines: Vec<String> = fixture("claude/no_result").lines().map(|l| l.replace("claude-sonnet-4-5-20250929", "claude-zeta-9")).collect();
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let r = read(Kind::ClaudeCode, None, &lines);
    assert_eq!(r.usage().estimate_basis.as_deref(), Some("unknown_model"));
    // Opus 4.1's prices, the dearest row: 3×15 + 6847×18.75 + 18003×1.5 + 412×75 per million.
    assert_eq!(r.usage().estimated_cost_usd, Some(0.186_331));
}

#[test]
fn with_several_result_lines_the_last_counts_and_later_messages_are_estimated() {
    let lines: Vec<&str> = fixture("claude/two_results").lines().collect();
    // After the first result and a new message: that result's cost plus the new estimate.
    let first = lines.iter().position(|l| l.contains(r#""type":"result""#)).unwrap();
    let r = read(Kind::ClaudeCode, None, &lines[..first + 3]);
    assert_eq!(r.usage().cost_usd, Some(0.037_266));
    assert_eq!(r.usage().estimated_cost_usd, Some(0.055_307));
    assert!(r.usage().output_tokens_lower_bound);
    let e = run("claude/two_results", None, OK);
    assert_eq!((e.success, e.usage.cost_usd, e.usage.estimated_cost_usd), (true, Some(0.066_779), Some(0.066_779)));
    assert_eq!((e.usage.input_tokens, e.usage.output_tokens, e.usage.turns, e.usage.output_tokens_lower_bound), (79_359, 679, 4, false));
    assert_eq!(e.text, "Added the test you asked for.");
}

/// What Claude Code 2.1.328 printed (`tests/`' model stand-in, its default model): its cost
/// is what the price table computes for the tokens it counted.
#[test]
fn real_claude_code_figures_agree_with_the_price_table() {
    let e = run("claude/real_edit", None, OK);
    assert!(e.success, "{e:?}");
    assert_eq!((e.usage.cost_usd, e.usage.turns, e.usage.model.as_deref()), (Some(0.1397), 3, Some("claude-opus-5-5")));
    assert_eq!((e.usage.input_tokens, e.usage.output_tokens), (5300 + 37_500 + 19_000, 800));
    let tokens = Tokens { input: 5300, cache_write_5m: 19_000, cache_read: 37_500, output: 800, ..Tokens::default() };
    let (usd, basis) = Prices::shipped().cost(Some("claude-opus-5-5"), &tokens);
    assert!((usd - 0.1397).abs() < 1e-9, "{usd}");
    assert_eq!(basis, crate::prices::Basis::PriceTable);
}

/// Refused tools leave Claude Code's result a `success`: only its `permission_denials` say so.
#[test]
fn claude_codes_refusals_are_kept_in_words() {
    let e = run("claude/real_denied", None, OK);
    assert!(e.success);
    assert_eq!(e.refused, ["Write /tmp/runs/a/repo/NOTES.md", "Bash wc -l NOTES.md > COUNT.txt"]);
    assert!(run("claude/real_edit", None, OK).refused.is_empty());
}

/// Interrupted (SIGINT) during a tool, Claude Code prints its last word: the cost and turns of
/// the whole session, the interrupted call's included.
#[test]
fn an_interrupted_claude_codes_own_figures_are_kept() {
    let e = run("claude/real_interrupted", Some("claude-opus-5-5"), OK);
    let lines: Vec<&str> = fixture("claude/real_interrupted").lines().collect();
    let e_stopped = read(Kind::ClaudeCode, Some("claude-opus-5-5"), &lines).finish(OK, Some("step cancelled on the server"));
    assert_eq!(e_stopped.reason.as_deref(), Some("step cancelled on the server"));
    for e in [e, e_stopped] {
        assert_eq!((e.usage.cost_usd, e.usage.turns, e.usage.output_tokens_lower_bound), (Some(0.1216), 4, false));
    }
}

/// A 400 Claude Code gave up on: the API's own words, final.
#[test]
fn a_refused_claude_request_is_final_in_the_apis_words() {
    let e = run("claude/real_bad_request", None, ONE);
    assert_eq!((e.success, e.class), (false, "final"));
    assert_eq!(e.reason.as_deref(), Some("API error 400: temperature: Input should be less than or equal to 1"));
}

#[test]
fn codex_counts_tool_items_only_and_takes_the_assignments_model() {
    let e = run("codex/success", Some("gpt-5-codex"), OK);
    assert!(e.success, "{e:?}");
    assert_eq!(e.text, "The parser now returns Error::Empty on empty input.");
    // The command and the file change; not the reasoning, the plan or the message.
    assert_eq!((e.usage.tool_calls, e.usage.turns, e.usage.input_tokens, e.usage.output_tokens), (2, 1, 24_761, 1378));
    assert_eq!((e.usage.model.as_deref(), e.usage.cost_usd), (Some("gpt-5-codex"), None));
    // 5049 uncached × 1.25 + 19,712 cached × 0.125 + 1378 × 10, per million.
    assert_eq!((e.usage.estimated_cost_usd, e.usage.estimate_basis.as_deref()), (Some(0.022_555), Some("price_table")));
}

#[test]
fn a_codex_reconnect_error_does_not_fail_a_turn_that_completes() {
    let e = run("codex/reconnect", Some("gpt-5-codex"), OK);
    assert!(e.success, "{e:?}");
    assert_eq!((e.usage.tool_calls, e.text.as_str()), (1, "All tests pass; nothing to change."));
}

#[test]
fn only_a_failed_turn_or_no_turn_fails_codex() {
    // A 401 is refused again: final.
    let e = run("codex/turn_failed", None, ONE);
    assert_eq!((e.success, e.class), (false, "final"));
    assert_eq!(e.reason.as_deref(), Some("turn failed: unexpected status 401 Unauthorized: Missing bearer or basic authentication in header"));
    assert_eq!((e.usage.tool_calls, e.usage.estimated_cost_usd), (0, None));
    let lines: Vec<&str> = fixture("codex/success").lines().take(5).collect();
    let e = read(Kind::Codex, None, &lines).finish(OK, None);
    assert_eq!(e.reason.as_deref(), Some("no turn completed (exit code 0)"));
}

/// A model the account may not use comes as the API's JSON inside the message: its words, and
/// final; an outage may pass.
#[test]
fn codex_failures_say_the_apis_words_and_a_refusal_is_final() {
    let failed = |message: &str| {
        let line = json!({ "type": "turn.failed", "error": { "message": message } }).to_string();
        read(Kind::Codex, None, &[&line]).finish(ONE, None)
    };
    let e = failed(r#"{"detail":"The 'gpt-9' model is not supported when using Codex with a ChatGPT account."}"#);
    assert_eq!(e.reason.as_deref(), Some("turn failed: The 'gpt-9' model is not supported when using Codex with a ChatGPT account."));
    assert_eq!(e.class, "final");
    let e = failed("unexpected status 400 Bad Request: invalid_request_error");
    assert_eq!(e.class, "final");
    for passing in ["unexpected status 429 Too Many Requests: slow down", "unexpected status 503 Service Unavailable", "stream disconnected before completion"]
    {
        assert_eq!(failed(passing).class, "ordinary", "{passing}");
    }
}

/// What Codex 0.169 printed (standard error and output, as the host's output file has them)
/// against the model stand-in of `tests/`: a 400 whose JSON error body is the whole message, a
/// 429 it gave up on, a refusal to start outside a repository, and a read-only sandbox.
#[test]
fn codex_as_it_really_fails() {
    let e = run("codex/bad_request", Some("gpt-5.5"), ONE);
    assert_eq!((e.success, e.class), (false, "final"));
    assert_eq!(e.reason.as_deref(), Some("turn failed: prompt is too long: 204817 tokens > 200000 maximum"));
    let e = run("codex/rate_limited", Some("gpt-5.5"), ONE);
    assert_eq!((e.class, e.reason.as_deref()), ("ordinary", Some("turn failed: exceeded retry limit, last status: 429 Too Many Requests")));
    // Its own last words, not only its exit code.
    let e = run("codex/no_git", Some("gpt-5.5"), ONE);
    assert_eq!(
        (e.class, e.reason.as_deref()),
        ("ordinary", Some("no turn completed (exit code 1): Not inside a trusted directory and --skip-git-repo-check was not specified."))
    );
    // Its read-only sandbox refused the patch and the command's write: its standard output
    // says nothing of either, its session file says both.
    let mut r = Reader::new(Kind::Codex, Some("gpt-5.5".into()), Arc::new(Prices::shipped()));
    for line in fixture("codex/read_only").lines() {
        r.line(line);
    }
    for line in fixture("codex/read_only.rollout").lines() {
        r.codex_session(line);
    }
    let e = r.finish(OK, None);
    assert!(e.success, "{e:?}");
    assert_eq!(e.refused, ["apply_patch NOTES.md", "exec_command wc -l NOTES.md > COUNT.txt"]);
}

/// Interrupted, Codex prints no `turn.completed`: its session file's running totals (written
/// after each model call) are the session's figures, and its model calls its turns.
#[test]
fn an_interrupted_codex_is_counted_from_its_session_file() {
    let mut r = Reader::new(Kind::Codex, Some("gpt-5.5".into()), Arc::new(Prices::shipped()));
    for line in fixture("codex/interrupted").lines() {
        r.line(line);
    }
    assert_eq!(r.usage().estimated_cost_usd, None, "standard output counts no token");
    let mut estimates = Vec::new();
    for line in fixture("codex/interrupted.rollout").lines() {
        r.codex_session(line);
        estimates.push(r.usage().estimated_cost_usd.unwrap_or(0.0));
    }
    assert!(estimates.windows(2).all(|w| w[0] <= w[1]) && estimates[0] > 0.0, "{estimates:?}");
    let e = r.finish(ONE, Some("budget_hard_stop"));
    assert_eq!((e.success, e.reason.as_deref()), (false, Some("budget_hard_stop")));
    // The last `token_count`: 201,600 in (162,000 cached) and 2300 out, over 9 calls.
    assert_eq!((e.usage.input_tokens, e.usage.output_tokens, e.usage.turns), (201_600, 2300, 9));
    // 39,600 uncached × 5 + 162,000 cached × 0.5 + 2300 × 30, per million.
    assert_eq!(e.usage.estimated_cost_usd, Some(0.348));
}

/// Codex before 0.44 printed `{"id", "msg"}` events: its totals, its tool calls, its answer.
#[test]
fn codex_s_old_json_format_is_read_too() {
    let e = run("codex/legacy", Some("gpt-5-codex"), OK);
    assert!(e.success, "{e:?}");
    assert_eq!(e.text, "An empty list now parses to no items.");
    // The last totals, not a sum: 19,870 in (15,232 of them cached), 612 out.
    assert_eq!((e.usage.tool_calls, e.usage.input_tokens, e.usage.output_tokens), (2, 19_870, 612));
    // 4638 uncached × 1.25 + 15,232 cached × 0.125 + 612 × 10, per million.
    assert_eq!(e.usage.estimated_cost_usd, Some(0.013_822));
    let error = json!({ "id": "0", "msg": { "type": "error", "message": "unexpected status 401 Unauthorized" } }).to_string();
    let e = read(Kind::Codex, None, &[&error]).finish(ONE, None);
    assert_eq!((e.success, e.class, e.reason.as_deref()), (false, "final", Some("turn failed: unexpected status 401 Unauthorized")));
    // The first flat shape of `token_count`.
    let flat = json!({ "id": "0", "msg": { "type": "token_count", "input_tokens": 1674, "cached_input_tokens": 1627, "output_tokens": 384 } }).to_string();
    let u = read(Kind::Codex, None, &[&flat]).usage().clone();
    assert_eq!((u.input_tokens, u.output_tokens), (1674, 384));
}

#[test]
fn a_commands_exit_code_decides() {
    let mut r = Reader::new(Kind::Command, None, Arc::new(Prices::shipped()));
    assert_eq!(r.line("hello"), "output");
    let ended = r.finish(ONE, None);
    assert_eq!((ended.success, ended.reason.as_deref(), ended.exit_code), (false, Some("exit code 1"), Some(1)));
}

#[test]
fn the_pr_body_follows_the_marker_and_closes_the_issue() {
    let answer = "I changed the parser.\n\nPULL REQUEST\nFix the parser\n\nIt crashed on empty input.";
    assert_eq!(pr_body(answer, Some(7)), "Closes #7\n\nFix the parser\n\nIt crashed on empty input.");
    assert_eq!(pr_body("Closes #7\nDone", Some(7)), "Closes #7\nDone");
    assert_eq!(pr_body("Done", None), "Done");
    assert!(pr_instructions(Some("## What\n## Why"), Some(7)).contains("## What"));
}
