//! Tests of parsing and validation against the fixtures in `engine/tests/fixtures/workflows`,
//! and of expression evaluation, template rendering and the `validate` report.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use super::model::{ConcurrencyPolicy, EndOutcome, FieldType, Harness, NodeKind, OutputKind, Wait};
use super::{Problem, expr, parse, report, template};

fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/workflows").join(name)
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(fixture_path(name)).unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

fn problems(name: &str) -> Vec<Problem> {
    match parse(&fixture(name)) {
        Ok(_) => panic!("{name} should not validate"),
        Err(problems) => problems,
    }
}

/// Checks that `name` gives exactly these problems, in file order: each expected line with a
/// message containing the expected text.
fn assert_problems(name: &str, expected: &[(usize, &str)]) {
    let found = problems(name);
    let listing: Vec<String> = found.iter().map(|p| format!("{}:{}: {p}", p.line, p.col)).collect();
    assert_eq!(found.len(), expected.len(), "{name}: expected {expected:#?}\nfound {listing:#?}");
    for (problem, (line, text)) in found.iter().zip(expected) {
        assert!(
            problem.line == *line && problem.to_string().contains(text),
            "{name}: expected line {line} with {text:?}, found {problem:?}\nall: {listing:#?}"
        );
    }
}

// ---- valid definitions ------------------------------------------------------------------

#[test]
fn the_design_example_validates() {
    let definition = parse(&fixture("issue-to-pr.yaml")).unwrap_or_else(|p| panic!("{p:#?}"));
    assert_eq!(definition.name, "issue-to-pr");
    assert!(definition.approval_required);
    assert_eq!(definition.stop_the_line_attempts, 3);
    let github = definition.on.github.as_ref().expect("github trigger");
    assert_eq!(github.events, ["issues.labeled", "issues.opened"]);
    let schedule = definition.on.schedule.as_ref().expect("schedule");
    assert_eq!((schedule.cron.as_str(), schedule.tz.as_deref()), ("0 9 * * 1-5", Some("Europe/Paris")));
    let concurrency = definition.concurrency.as_ref().expect("concurrency");
    assert_eq!((concurrency.group.as_str(), concurrency.limit, concurrency.policy), ("item", 1, ConcurrencyPolicy::Queue));
    let throttle = definition.throttle.as_ref().expect("throttle");
    assert_eq!((throttle.per, throttle.limit), (Duration::from_secs(3600), 20));
    assert_eq!((definition.budget.max_cycles, definition.budget.usd_per_run, definition.budget.hard), (3, Some(10.0), true));

    let ids: Vec<&str> = definition.nodes.iter().map(|n| n.id.as_str()).collect();
    assert_eq!(ids, ["plan", "review_plan", "build", "ci", "route", "big_change_review", "open_pr"]);

    let plan = definition.node("plan").expect("plan");
    assert_eq!(plan.requires, ["linux", "harness:claude-code"]);
    let NodeKind::Crew(crew) = &plan.kind else { panic!("plan is a crew") };
    assert_eq!(crew.harness, Harness::ClaudeCode);
    assert_eq!(crew.model.as_deref(), Some("claude-sonnet-4-5"));
    assert_eq!(crew.caps.turns, Some(40));
    assert_eq!(crew.caps.timeout, Some(Duration::from_secs(30 * 60)));
    assert_eq!(crew.expect_changes, None, "unsaid: decided by whether a pull request follows");

    let build = definition.node("build").expect("build");
    let retry = build.retry.as_ref().expect("retry");
    assert_eq!((retry.attempts, retry.backoff, retry.max_backoff), (3, Duration::from_secs(30), Duration::from_secs(600)));
    assert_eq!(retry.exit_codes, [1]);

    let NodeKind::Gate(gate) = &definition.node("ci").expect("ci").kind else { panic!("ci is a gate") };
    assert_eq!(gate.on_fail.as_deref(), Some("build"));
    assert_eq!(gate.checks, ["build", "test"]);

    let NodeKind::Decision(route) = &definition.node("route").expect("route").kind else { panic!("route is a decision") };
    assert_eq!(route.cases.len(), 1);
    assert_eq!(route.cases[0].to, "big_change_review");
    assert_eq!(route.default.as_deref(), Some("open_pr"));

    let NodeKind::Approval(review) = &definition.node("review_plan").expect("review_plan").kind else { panic!("review_plan is an approval") };
    assert_eq!(review.timeout, Some(Duration::from_secs(24 * 3600)));
    assert!(review.fields["ticket"].required);
    assert_eq!(review.fields["ticket"].field_type, FieldType::String);

    let open_pr = definition.node("open_pr").expect("open_pr");
    assert_eq!(open_pr.after, ["route", "big_change_review"]);
    let NodeKind::Output(output) = &open_pr.kind else { panic!("open_pr is an output") };
    assert_eq!((output.kind, output.draft), (OutputKind::PullRequest, false));
}

#[test]
fn every_kind_parses_with_its_defaults() {
    let definition = parse(&fixture("all-kinds.yaml")).unwrap_or_else(|p| panic!("{p:#?}"));
    assert!(!definition.approval_required);
    assert_eq!(definition.stop_the_line_attempts, 3);
    assert_eq!(definition.budget.max_cycles, 3);
    assert!(definition.concurrency.is_none());
    assert_eq!(definition.on.github.as_ref().map(|g| g.events.clone()), Some(vec!["issues.opened".to_owned()]));

    let kind = |id: &str| &definition.node(id).unwrap_or_else(|| panic!("node {id}")).kind;
    assert_eq!(kind("start"), &NodeKind::Trigger);

    let triage = definition.node("triage").expect("triage");
    assert_eq!(triage.after, ["start"], "a lone string is a list of one");
    assert_eq!(triage.failure.as_deref(), Some("notify"));
    assert_eq!(triage.timeout, Some(Duration::from_secs(45 * 60)));
    let NodeKind::Crew(crew) = &triage.kind else { panic!("triage is a crew") };
    assert_eq!(crew.harness, Harness::Codex);
    assert_eq!(crew.expect_changes, Some(true));

    let lint = definition.node("lint").expect("lint");
    assert!(lint.continue_on_error);
    let retry = lint.retry.as_ref().expect("retry");
    assert_eq!((retry.attempts, retry.backoff, retry.max_backoff), (2, Duration::from_secs(10), Duration::from_secs(600)));
    let NodeKind::Crew(crew) = &lint.kind else { panic!("lint is a crew") };
    assert_eq!((crew.harness, crew.command.as_slice()), (Harness::Command, ["cargo".to_owned(), "clippy".to_owned()].as_slice()));

    let NodeKind::Approval(ask) = kind("ask") else { panic!("ask is an approval") };
    let size = &ask.fields["size"];
    assert_eq!((size.field_type, size.required, size.default.clone()), (FieldType::Choice, true, Some(json!("small"))));
    assert_eq!(size.options, ["small", "large"]);
    assert_eq!(ask.fields["note"].description.as_deref(), Some("Anything to add"));
    assert!(!ask.fields["note"].required);
    assert_eq!(ask.fields["budget"].default, Some(json!(2.5)));
    assert_eq!(ask.fields["urgent"].default, Some(json!(false)));

    assert_eq!(kind("pause"), &NodeKind::Wait(Wait::For(Duration::from_secs(5400))));
    let NodeKind::Wait(Wait::Until(at)) = kind("until") else { panic!("until is a wait until") };
    assert_eq!(at.to_rfc3339(), "2030-01-01T08:00:00+00:00");
    assert_eq!(kind("merged"), &NodeKind::Wait(Wait::Event("pull_request.closed".to_owned())));

    let NodeKind::Workflow(child) = kind("child") else { panic!("child is a workflow") };
    assert_eq!(child.name, "release");
    assert_eq!(child.input["version"], "{{ nodes.ask.output.size }}");

    let NodeKind::Output(label) = kind("label") else { panic!("label is an output") };
    assert_eq!((label.kind, label.labels.as_slice()), (OutputKind::Label, ["shipped".to_owned()].as_slice()));
    let NodeKind::Output(column) = kind("move") else { panic!("move is an output") };
    assert_eq!((column.kind, column.column.as_deref()), (OutputKind::BoardMove, Some("Done")));
    let NodeKind::Output(comment) = kind("notify") else { panic!("notify is an output") };
    assert_eq!((comment.kind, comment.body.as_deref()), (OutputKind::Comment, Some("Failed: {{ run.id }}")));

    let NodeKind::End(done) = kind("done") else { panic!("done is an end") };
    assert_eq!(done.outcome, EndOutcome::Completed);
    let NodeKind::End(give_up) = kind("give_up") else { panic!("give_up is an end") };
    assert_eq!(give_up.outcome, EndOutcome::Failed);
}

#[test]
fn a_minimal_definition_takes_every_default() {
    let definition = parse("name: tiny\nnodes:\n  only: { end: }\n").unwrap_or_else(|p| panic!("{p:#?}"));
    assert_eq!(definition.on, super::Triggers::default());
    assert_eq!(definition.budget, super::Budget::default());
    assert_eq!(definition.stop_the_line_attempts, 3);
    assert!(!definition.approval_required);
    assert_eq!(definition.nodes[0].kind, NodeKind::End(super::End { outcome: EndOutcome::Completed }));
}

#[test]
fn expect_says_changes_or_any() {
    let crew = |expect: &str| {
        let source = format!("name: e\nnodes:\n  w:\n    crew: {{ harness: claude-code, prompt: p{expect} }}\n");
        let definition = parse(&source).unwrap_or_else(|p| panic!("{p:#?}"));
        match &definition.nodes[0].kind {
            NodeKind::Crew(c) => c.expect_changes,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(crew(""), None);
    assert_eq!(crew(", expect: changes"), Some(true));
    assert_eq!(crew(", expect: any"), Some(false));
    let bad = parse("name: e\nnodes:\n  w:\n    crew: { harness: claude-code, prompt: p, expect: nothing }\n").unwrap_err();
    assert!(bad[0].message.contains("changes") && bad[0].message.contains("any"), "{bad:?}");
}

#[test]
fn what_an_agent_may_do_is_its_nodes() {
    use protocol::{McpServer, Permissions, Policy, Tools};
    let policy = |harness: &str, keys: &str| {
        let source = format!("name: e\nnodes:\n  w:\n    crew:\n      harness: {harness}\n      prompt: p\n{keys}");
        parse(&source).map(|d| match &d.nodes[0].kind {
            NodeKind::Crew(c) => c.policy.clone(),
            other => panic!("{other:?}"),
        })
    };
    // Unsaid: everything, inside the step's walls.
    assert_eq!(policy("claude-code", ""), Ok(Policy::default()));
    assert_eq!(Policy::default().permissions, Permissions::Full);
    let said = "      permissions: read\n      tools: { allow: [\"Bash(git log:*)\"], deny: [WebFetch] }\n      \
                mcp:\n        docs: { command: [docs-mcp, --stdio] }\n        search: { url: \"https://mcp.example.com/mcp\" }\n";
    let p = policy("claude-code", said).unwrap_or_else(|p| panic!("{p:#?}"));
    assert_eq!(p.permissions, Permissions::Read);
    assert_eq!(p.tools, Tools { allow: vec!["Bash(git log:*)".into()], deny: vec!["WebFetch".into()] });
    assert_eq!(p.mcp["docs"], McpServer::Command(vec!["docs-mcp".into(), "--stdio".into()]));
    assert_eq!(p.mcp["search"], McpServer::Url("https://mcp.example.com/mcp".into()));
    assert_eq!(policy("codex", "      permissions: edit\n").map(|p| p.permissions), Ok(Permissions::Edit));
    let allow = "      network: { allow: [registry.npmjs.org, \"*.pypi.org\", \"10.0.0.5:8080\"] }\n";
    assert_eq!(policy("codex", allow).map(|p| p.network.allow.len()), Ok(3));

    // What a harness cannot honour is refused, each with its line.
    let refused = |harness: &str, keys: &str| policy(harness, keys).unwrap_err().into_iter().map(|p| p.message).collect::<Vec<_>>().join("; ");
    assert!(refused("codex", "      tools: { deny: [Bash] }\n").contains("`tools` is for claude-code"));
    assert!(refused("command", "      command: [make]\n      permissions: read\n").contains("is for the claude-code and codex harnesses"));
    assert!(refused("claude-code", "      permissions: admin\n").contains("`admin` is not one of read, edit, full"));
    assert!(refused("claude-code", "      mcp: { \"a.b\": { url: \"https://x\" } }\n").contains("not an MCP server name"));
    assert!(refused("claude-code", "      mcp: { docs: { url: \"file:///etc/passwd\" } }\n").contains("not an http:// or https:// URL"));
    assert!(refused("claude-code", "      mcp: { docs: {} }\n").contains("give either `command`"));
    assert!(refused("claude-code", "      tools: { allow: [\"\"] }\n").contains("is not a tool rule"));
    assert!(refused("codex", "      network: { allow: [\"*\"] }\n").contains("`*` is not a destination"));
    assert!(refused("codex", "      network: { allow: [\"host:http\"] }\n").contains("not a number from 1 to 65535"));
}

#[test]
fn anchors_and_aliases_are_expanded() {
    let source = "name: a\nnodes:\n  one: { crew: &c { harness: codex, prompt: hi } }\n  two: { after: [one], crew: *c }\n";
    let definition = parse(source).unwrap_or_else(|p| panic!("{p:#?}"));
    assert_eq!(definition.nodes[0].kind, definition.nodes[1].kind);
}

// ---- broken definitions: every problem, with its line -----------------------------------

#[test]
fn a_yaml_syntax_error_has_its_position() {
    assert_problems("broken-syntax.yaml", &[(7, "YAML syntax error")]);
}

#[test]
fn an_empty_file_or_a_list_is_not_a_workflow() {
    assert_problems("broken-empty.yaml", &[(1, "holds no workflow")]);
    assert_problems("broken-root.yaml", &[(1, "expected a workflow")]);
}

#[test]
fn unknown_keys_and_kinds_name_what_is_allowed() {
    assert_problems(
        "broken-keys.yaml",
        &[
            (2, "descripton: unknown key `descripton` (allowed: name, on, concurrency, throttle, budget, approval, nodes, stop_the_line_attempts)"),
            (3, "concurrency.limt: unknown key `limt` (allowed: group, limit, policy)"),
            (
                9,
                "nodes.plan.crew.temperature: unknown key `temperature` (allowed: harness, model, prompt, command, caps, expect, permissions, tools, mcp, network)",
            ),
            (10, "nodes.plan.retry.jitter: unknown key `jitter` (allowed: attempts, backoff, max_backoff, exit_codes)"),
            (11, "nodes.plan.priority: unknown key `priority` (allowed: after, requires, retry, timeout, continue_on_error, failure, crew)"),
            (14, "nodes.build.agent: unknown node kind `agent` (kinds: trigger, crew, gate, approval, decision, output, wait, workflow, end)"),
            (16, "nodes.review: the node has no kind"),
            (20, "nodes.ship.gate: a node has one kind, and this one already has `output`"),
            (21, "nodes.plan: duplicate key `plan`"),
        ],
    );
}

#[test]
fn wrong_types_are_reported_where_they_are_written() {
    assert_problems(
        "broken-types.yaml",
        &[
            (1, "name: expected a string, found a list"),
            (2, "approval: `maybe` is not one of required, none"),
            (3, "budget.max_cycles: expected a whole number, found a string"),
            (3, "budget.usd_per_run: must be more than 0"),
            (3, "budget.hard: expected true or false, found a string"),
            (4, "stop_the_line_attempts: must be at least 1, not 0"),
            (7, "nodes.plan.requires: expected a list of strings, found a mapping"),
            (8, "nodes.plan.continue_on_error: expected true or false"),
            (10, "nodes.plan.crew.harness: `gpt` is not one of claude-code, codex, command"),
            (12, "nodes.plan.crew.caps.turns: expected a whole number, found a decimal number"),
            (12, "nodes.plan.crew.caps.usd: expected an amount in US dollars"),
            (14, "nodes.build.after[1]: expected a string, found a whole number"),
            (15, "nodes.build.retry.attempts: must be at least 1, not 0"),
            (15, "nodes.build.retry.exit_codes[1]: expected an exit code"),
            (16, "nodes.build.crew.expect: `success` is not one of changes, any"),
        ],
    );
}

#[test]
fn bad_durations_are_reported() {
    assert_problems(
        "broken-durations.yaml",
        &[
            (2, "throttle.per: `soon` is not a duration"),
            (5, "nodes.plan.timeout: expected a duration such as 30s, 10m, 1h or 1h30m, found a whole number"),
            (9, "nodes.plan.crew.caps.timeout: must be longer than zero"),
            (13, "nodes.build.retry.backoff: `5x` is not a duration"),
            (13, "nodes.build.retry.max_backoff: `1 fortnight` is not a duration"),
            (17, "nodes.test.retry.max_backoff: must not be shorter than `backoff`"),
            (20, "nodes.nap.wait.for: `1h30` is not a duration"),
        ],
    );
}

#[test]
fn edges_to_missing_nodes_are_reported_at_the_name() {
    assert_problems(
        "broken-edges.yaml",
        &[
            (5, "nodes.plan.failure: there is no node `notify`"),
            (7, "nodes.build.after: there is no node `desing`"),
            (11, "nodes.ci.gate.on_fail: there is no node `biuld`"),
            (16, "nodes.route.decision.cases[0].to: there is no node `ship`"),
            (17, "nodes.route.decision.default: there is no node `close`"),
        ],
    );
}

#[test]
fn nodes_no_start_leads_to_are_unreachable() {
    assert_problems("broken-unreachable.yaml", &[(9, "nodes.poll: node `poll` is unreachable"), (12, "nodes.check: node `check` is unreachable")]);
}

#[test]
fn a_cycle_needs_a_gate_or_a_decision() {
    assert_problems(
        "broken-cycle.yaml",
        &[
            (5, "nodes.build: cycle with no gate or decision on it: build -> fix -> build"),
            (15, "nodes.ci_fix: cycle with no gate or decision on it: ci_fix -> ci_fix"),
            (18, "nodes.poll: cycle with no gate or decision on it: poll -> poll"),
        ],
    );
}

#[test]
fn expressions_must_compile() {
    assert_problems(
        "broken-expressions.yaml",
        &[
            (5, "on.github.if: expression does not compile: Syntax error"),
            (14, "nodes.route.decision.cases[1].if: expression does not compile"),
            (15, "nodes.route.decision.cases[2]: missing required key `if`"),
            (16, "nodes.route.decision.cases[3].if: expression does not compile: the expression is empty"),
        ],
    );
}

#[test]
fn templates_must_parse_and_block_lines_are_exact() {
    assert_problems(
        "broken-templates.yaml",
        &[
            // Line 3 of the `|` block is line 9 of the file.
            (9, "nodes.plan.crew.prompt: template does not parse: syntax error: unexpected `}`"),
            (13, "nodes.ask.approval.prompt: template does not parse"),
            (16, "nodes.child.workflow.input.ref: template does not parse"),
            (19, "nodes.comment.output.body: template does not parse"),
        ],
    );
}

#[test]
fn approval_fields_are_checked() {
    assert_problems(
        "broken-fields.yaml",
        &[
            (7, "nodes.ask.approval.fields.size: a choice field needs `options`"),
            (8, "nodes.ask.approval.fields.colour: a choice field needs `options`"),
            (9, "nodes.ask.approval.fields.note.options: `options` are only for choice fields"),
            (10, "nodes.ask.approval.fields.count.type: `integer` is not one of string, number, boolean, choice"),
            (11, "nodes.ask.approval.fields.budget.default: the default must be a number"),
            (12, "nodes.ask.approval.fields.tier.default: the default must be one of the options (gold, silver)"),
            (13, "nodes.ask.approval.fields.urgent.required: expected true or false"),
            (14, "nodes.ask.approval.fields.plain: expected a mapping, found a string"),
        ],
    );
}

#[test]
fn triggers_schedules_and_policies_are_checked() {
    assert_problems(
        "broken-triggers.yaml",
        &[
            (4, "on.github.events[1]: `Issues Opened` is not an event name"),
            (5, "on.schedule.cron: `0 25 * * *` is not a cron expression"),
            (5, "on.schedule.tz: `Mars/Olympus` is not a time zone"),
            (6, "on.slack: unknown key `slack` (allowed: github, schedule)"),
            (7, "concurrency.policy: `wait` is not one of queue, skip, drop"),
            (7, "concurrency.limit: must be at least 1"),
            (9, "nodes.go.trigger: expected nothing"),
            (10, "nodes.done.end: `maybe` is not one of completed, failed"),
        ],
    );
}

#[test]
fn each_kind_checks_what_it_needs() {
    assert_problems(
        "broken-kinds.yaml",
        &[
            (4, "nodes.plan.crew: missing required key `harness`"),
            (7, "nodes.build.crew: missing required key `prompt`"),
            (7, "nodes.build.crew.command: `command` is only for the command harness"),
            (10, "nodes.test.crew: missing required key `command`"),
            (13, "nodes.label.output: missing required key `labels`"),
            (13, "nodes.label.output.draft: `draft` does not apply to a label output"),
            (16, "nodes.wait_both.wait.event: a wait has one of for, until, event"),
            (19, "nodes.wait_when.wait.until: `tomorrow` is not an RFC 3339 time"),
            (22, "nodes.wait_none.wait: give one of `for`"),
            (25, "nodes.route.decision.cases: give at least one case"),
        ],
    );
}

#[test]
fn problems_carry_columns_and_paths() {
    let found = problems("broken-edges.yaml");
    assert_eq!(found[1], Problem { line: 7, col: 19, path: "nodes.build.after".to_owned(), message: "there is no node `desing`".to_owned() });
}

#[test]
fn hostile_yaml_is_refused_not_fatal() {
    let deep = format!("name: {}1{}\nnodes: {{}}\n", "[".repeat(200), "]".repeat(200));
    assert!(parse(&deep).is_err());
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        let prev = i - 1;
        let refs = vec![format!("*a{prev}"); 10].join(", ");
        bomb.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
    }
    let problems = parse(&bomb).expect_err("a billion laughs is refused");
    assert!(problems[0].message.contains("expands to more than"), "{problems:?}");
    assert!(parse("--- {name: a}\n--- {name: b}\n").is_err());
    assert!(parse("\u{0}\u{1}: [").is_err());
}

// ---- expressions --------------------------------------------------------------------------

fn context() -> serde_json::Value {
    json!({
        "item": { "title": "Fix the login", "number": 42, "labels": ["bug", "ready-for-agent"], "state": "open" },
        "nodes": { "build": { "output": { "files_changed": 60, "text": "done" } } },
        "run": { "id": "run-1", "attempt": 2 },
    })
}

#[test]
fn expressions_evaluate_over_the_context() {
    let cx = context();
    assert_eq!(expr::eval_bool("'ready-for-agent' in item.labels && item.state == 'open'", &cx), Ok(true));
    assert_eq!(expr::eval_bool("nodes.build.output.files_changed > 50", &cx), Ok(true));
    assert_eq!(expr::eval_bool("nodes.build.output.files_changed + 1 == 61", &cx), Ok(true));
    assert_eq!(expr::eval_bool("item.labels.exists(l, l.startsWith('ready'))", &cx), Ok(true));
    assert_eq!(expr::eval_bool("has(nodes.plan)", &cx), Ok(false));
    assert_eq!(expr::eval_bool("has(trigger.sender)", &cx), Ok(false), "absent variables are empty maps");
    assert_eq!(expr::eval("size(item.labels)", &cx), Ok(json!(2)));
    assert_eq!(expr::eval("item.title + '!'", &cx), Ok(json!("Fix the login!")));
    assert_eq!(expr::eval("{'n': item.number, 'l': item.labels}", &cx), Ok(json!({"n": 42, "l": ["bug", "ready-for-agent"]})));
}

#[test]
fn expression_errors_are_errors() {
    let cx = context();
    assert!(expr::compile("nodes.build.output.files_changed > 50").is_ok());
    assert!(expr::compile("a &&").is_err());
    assert!(expr::compile("  ").is_err());
    assert!(expr::eval_bool("item.title", &cx).unwrap_err().contains("not a boolean"));
    assert!(expr::eval_bool("nodes.plan.output.text == ''", &cx).is_err(), "a missing key is an error");
    assert!(expr::eval_bool("true", &json!([1])).is_err(), "the context must be an object");
}

// ---- templates ----------------------------------------------------------------------------

#[test]
fn templates_render_leniently() {
    let cx = context();
    assert_eq!(template::render("Plan {{ item.title }} (#{{ item.number }})", &cx), Ok("Plan Fix the login (#42)".to_owned()));
    assert_eq!(template::render("[{{ nodes.plan.output.text }}]", &cx), Ok("[]".to_owned()), "undefined renders empty");
    assert_eq!(template::render("{{ missing }}", &cx), Ok(String::new()));
    assert_eq!(
        template::render("{% for l in item.labels %}{{ l }};{% endfor %}{{ item.labels | join(',') }}", &cx),
        Ok("bug;ready-for-agent;bug,ready-for-agent".to_owned())
    );
    assert_eq!(template::render("<{{ item.title }}>", &json!({"item": {"title": "a<b"}})), Ok("<a<b>".to_owned()), "no HTML escaping");
}

#[test]
fn template_syntax_errors_are_errors() {
    assert!(template::check("Hello {{ item.title }}").is_ok());
    assert!(template::check("Hello {{ item.title }").is_err());
    assert!(template::check("{% if x %}no end").is_err());
    assert!(template::render("{{ x ", &context()).is_err());
}

// ---- the validate command -------------------------------------------------------------------

#[test]
fn validate_files_prints_file_line_col_message() {
    let paths = [fixture_path("issue-to-pr.yaml"), fixture_path("broken-edges.yaml"), fixture_path("no-such-file.yaml")];
    let mut out = Vec::new();
    assert!(!report::validate_files(&paths, &mut out));
    let out = String::from_utf8(out).expect("utf-8");
    let lines: Vec<&str> = out.lines().collect();
    let good = paths[0].display().to_string();
    let edges = paths[1].display().to_string();
    let missing = paths[2].display().to_string();
    assert_eq!(lines.len(), 7, "{out}");
    assert_eq!(lines[0], format!("ok {good}"));
    assert_eq!(lines[1], format!("{edges}:5:14: nodes.plan.failure: there is no node `notify`"));
    assert_eq!(lines[2], format!("{edges}:7:19: nodes.build.after: there is no node `desing`"));
    assert!(lines[6].starts_with(&format!("{missing}:1:1: cannot read the file: ")), "{out}");

    let mut out = Vec::new();
    assert!(report::validate_files(&[fixture_path("issue-to-pr.yaml"), fixture_path("all-kinds.yaml")], &mut out));
    let out = String::from_utf8(out).expect("utf-8");
    assert_eq!(out, format!("ok {}\nok {}\n", fixture_path("issue-to-pr.yaml").display(), fixture_path("all-kinds.yaml").display()));
}

#[test]
fn a_first_node_that_a_gate_loops_back_to_still_starts_the_run() {
    let source = "name: loop
nodes:
  build:
    crew: { harness: claude-code, prompt: build }
  ci:
    after: [build]
    gate: { checks: [test], on_fail: build }
";
    assert!(crate::definition::parse(source).is_ok(), "{:?}", crate::definition::parse(source).err());
}

#[test]
fn event_names_are_github_s_own_digits_included() {
    let source = |events: &str| {
        format!("name: w\non:\n  github:\n    events: {events}\nnodes:\n  start: {{ trigger: {{}} }}\n  done: {{ after: [start], end: completed }}\n")
    };
    let def = parse(&source("[projects_v2_item.edited, projects_v2_item, check_suite.completed, issues]")).expect("GitHub's event names");
    let events = def.on.github.expect("a github trigger").events;
    assert_eq!(events, ["projects_v2_item.edited", "projects_v2_item", "check_suite.completed", "issues"]);
    for bad in ["2fa", "issues.", "Issues", "issues.label ed"] {
        let problems = parse(&source(&format!("[\"{bad}\"]"))).expect_err(bad);
        assert!(problems.iter().any(|p| p.to_string().contains("is not an event name")), "{bad}: {problems:?}");
    }
}

#[test]
fn a_workflow_name_is_printable() {
    let source = |name: &str| format!("name: {name}\nnodes:\n  start: {{ trigger: {{}} }}\n");
    assert_eq!(parse(&source("\"café ☃ v2\"")).expect("printable").name, "café ☃ v2");
    for bad in ["\"\\e[31mred\"", "\"a\\u0007b\"", "\"tab\\there\""] {
        let problems = parse(&source(bad)).expect_err(bad);
        assert!(problems.iter().any(|p| p.to_string().contains("control character")), "{bad}: {problems:?}");
    }
}
