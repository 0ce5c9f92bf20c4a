//! Reading each kind of node: its own keys (a crew's harness and caps, a gate's checks, an
//! approval's form, a decision's cases, an output, a wait, a child workflow, an end), and the
//! edges it declares (a gate's `on_fail`, a decision's routes).

use std::collections::BTreeMap;

use super::graph::Edge;
use super::read::{
    Cx, Fields, boolean, count, duration, each_entry, entries, expression, join, mapping, missing, nonempty_list, nonempty_string, one_of, scalar_json, string,
    string_list, template_text, type_error, usd,
};
use super::yaml::{Key, Node as YNode, Pos, Value};
use crate::definition::edges::EdgeKind;
use crate::definition::model::{
    Approval, Caps, Case, ChildWorkflow, Crew, Decision, End, EndOutcome, Field, FieldType, Gate, Harness, NodeKind, Output, OutputKind, Wait,
};
use protocol::egress::Rule;
use protocol::{McpServer, Network, Permissions, Policy, Tools};

/// The name of a node, kept with where it was written so that a missing one can be shown.
pub(crate) fn node_ref(cx: &mut Cx, node: &YNode, path: &str) -> Option<(String, Pos)> {
    nonempty_string(cx, node, path).map(|s| (s, node.pos))
}

pub(crate) fn trigger(cx: &mut Cx, node: &YNode, path: &str) -> Option<NodeKind> {
    match &node.value {
        Value::Null => Some(NodeKind::Trigger),
        Value::Map(entries) if entries.is_empty() => Some(NodeKind::Trigger),
        _ => {
            type_error(cx, node, path, "nothing (`trigger: {}`)");
            None
        }
    }
}

pub(crate) fn crew(cx: &mut Cx, node: &YNode, path: &str) -> Option<Crew> {
    let f = mapping(cx, node, path, &["harness", "model", "prompt", "command", "caps", "expect", "permissions", "tools", "mcp", "network"])?;
    let harness = f.must_one_of(cx, "harness", &[("claude-code", Harness::ClaudeCode), ("codex", Harness::Codex), ("command", Harness::Command)]);
    let model = f.optional(cx, "model", nonempty_string);
    let prompt = f.optional(cx, "prompt", template_text);
    let command = f.optional(cx, "command", |cx, n, p| nonempty_list(cx, n, p, "give the program to run and its arguments"));
    let caps = f.optional(cx, "caps", caps);
    let expect = f.optional_one_of(cx, "expect", &[("changes", true), ("any", false)]);
    let permissions = f.optional_one_of(cx, "permissions", &[("read", Permissions::Read), ("edit", Permissions::Edit), ("full", Permissions::Full)]);
    let tools = f.optional(cx, "tools", tools);
    let mcp = f.optional(cx, "mcp", mcp);
    let network = f.optional(cx, "network", network);

    let harness = harness?;
    let mut ok = true;
    if harness == Harness::Command {
        if f.get("command").is_none() {
            missing(cx, f.pos, path, "command");
            ok = false;
        }
    } else {
        if f.get("prompt").is_none() {
            missing(cx, f.pos, path, "prompt");
            ok = false;
        }
        if let Some(n) = f.get("command") {
            cx.report(n.pos, &f.path("command"), "`command` is only for the command harness");
            ok = false;
        }
    }
    // What an agent may do is said in its CLI's own terms; a command's reach is its walls'.
    let agent_only: &[&str] = match harness {
        Harness::Command => &["permissions", "tools", "mcp"],
        Harness::Codex => &["tools"],
        Harness::ClaudeCode => &[],
    };
    for key in agent_only {
        if let Some(n) = f.get(key) {
            let why = if harness == Harness::Codex {
                "`tools` is for claude-code: what Codex may do follows `permissions` (its sandbox)"
            } else {
                "is for the claude-code and codex harnesses"
            };
            cx.report(n.pos, &f.path(key), why);
            ok = false;
        }
    }
    if !ok {
        return None;
    }
    Some(Crew {
        harness,
        model: model?,
        prompt: prompt?.unwrap_or_default(),
        command: command?.unwrap_or_default(),
        caps: caps?.unwrap_or_default(),
        expect_changes: expect?,
        policy: Policy {
            permissions: permissions?.unwrap_or_default(),
            tools: tools?.unwrap_or_default(),
            mcp: mcp?.unwrap_or_default(),
            network: network?.unwrap_or_default(),
        },
    })
}

/// The longest tool rule and MCP server name a workflow may write.
const TOOL_RULE_MAX: usize = 200;
const MCP_NAME_MAX: usize = 64;

fn tools(cx: &mut Cx, node: &YNode, path: &str) -> Option<Tools> {
    let f = mapping(cx, node, path, &["allow", "deny"])?;
    let rules = |cx: &mut Cx, n: &YNode, p: &str| {
        let list = string_list(cx, n, p)?;
        let bad = list.iter().find(|r| r.trim().is_empty() || r.len() > TOOL_RULE_MAX || r.chars().any(char::is_control));
        if let Some(bad) = bad {
            cx.report(
                n.pos,
                p,
                format!("`{bad}` is not a tool rule: name a tool (`Edit`, `Bash(npm test:*)`), on one line, in at most {TOOL_RULE_MAX} characters"),
            );
            return None;
        }
        Some(list)
    };
    let allow = f.optional(cx, "allow", rules);
    let deny = f.optional(cx, "deny", rules);
    Some(Tools { allow: allow?.unwrap_or_default(), deny: deny?.unwrap_or_default() })
}

/// MCP servers by name: names of letters, digits, `-` and `_` (the CLIs build tool names and
/// settings keys from them).
fn mcp(cx: &mut Cx, node: &YNode, path: &str) -> Option<BTreeMap<String, McpServer>> {
    let mut ok = true;
    for key in entries(cx, node, path)?.keys() {
        let name = &key.name;
        if name.is_empty() || name.len() > MCP_NAME_MAX || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            cx.report(key.pos, &join(path, name), format!("`{name}` is not an MCP server name: letters, digits, `-` and `_`, at most {MCP_NAME_MAX}"));
            ok = false;
        }
    }
    let servers = each_entry(cx, node, path, mcp_server)?;
    ok.then_some(servers)
}

/// One MCP server: `{ command: [program, args…] }` or `{ url: https://… }`.
fn mcp_server(cx: &mut Cx, node: &YNode, path: &str) -> Option<McpServer> {
    let f = mapping(cx, node, path, &["command", "url"])?;
    let command = f.optional(cx, "command", |cx, n, p| nonempty_list(cx, n, p, "give the program to run and its arguments"));
    let url = f.optional(cx, "url", nonempty_string);
    match (command?, url?) {
        (Some(command), None) => Some(McpServer::Command(command)),
        (None, Some(url)) if url.starts_with("https://") || url.starts_with("http://") => Some(McpServer::Url(url)),
        (None, Some(url)) => {
            cx.report(node.pos, &f.path("url"), format!("`{url}` is not an http:// or https:// URL"));
            None
        }
        _ => {
            cx.report(node.pos, path, "give either `command` (a program speaking MCP on stdio) or `url`");
            None
        }
    }
}

/// The most destinations a node may allow.
const NETWORK_MAX: usize = 64;

/// `network: { allow: [host, host:port, "*.domain"] }`: where the step may connect beside its
/// model API and its host's own list.
fn network(cx: &mut Cx, node: &YNode, path: &str) -> Option<Network> {
    let f = mapping(cx, node, path, &["allow"])?;
    let allow = f.optional(cx, "allow", |cx, n, p| {
        let list = string_list(cx, n, p)?;
        if list.len() > NETWORK_MAX {
            cx.report(n.pos, p, format!("at most {NETWORK_MAX} destinations"));
            return None;
        }
        let mut ok = true;
        for rule in &list {
            if let Err(why) = Rule::parse(rule) {
                cx.report(n.pos, p, why);
                ok = false;
            }
        }
        ok.then_some(list)
    });
    Some(Network { allow: allow?.unwrap_or_default() })
}

pub(crate) fn caps(cx: &mut Cx, node: &YNode, path: &str) -> Option<Caps> {
    let f = mapping(cx, node, path, &["turns", "usd", "timeout"])?;
    let turns = f.optional(cx, "turns", |cx, n, p| count(cx, n, p, 1));
    let usd = f.optional(cx, "usd", usd);
    let timeout = f.optional(cx, "timeout", duration);
    Some(Caps { turns: turns?, usd: usd?, timeout: timeout? })
}

pub(crate) fn gate(cx: &mut Cx, node: &YNode, path: &str, id: &str, edges: &mut Vec<Edge>) -> Option<Gate> {
    let f = mapping(cx, node, path, &["checks", "timeout", "on_fail"])?;
    let checks = f.must(cx, "checks", |cx, n, p| nonempty_list(cx, n, p, "name at least one check run"));
    let timeout = f.optional(cx, "timeout", duration);
    let on_fail = f.optional(cx, "on_fail", node_ref);
    if let Some(Some(target)) = &on_fail {
        edges.push(Edge::declared(id, target, EdgeKind::Loop, f.path("on_fail")));
    }
    Some(Gate { checks: checks?, timeout: timeout?, on_fail: on_fail?.map(|(t, _)| t) })
}

pub(crate) fn approval(cx: &mut Cx, node: &YNode, path: &str) -> Option<Approval> {
    let f = mapping(cx, node, path, &["prompt", "fields", "timeout"])?;
    let prompt = f.must(cx, "prompt", template_text);
    let fields = f.optional(cx, "fields", fields);
    let timeout = f.optional(cx, "timeout", duration);
    Some(Approval { prompt: prompt?, fields: fields?.unwrap_or_default(), timeout: timeout? })
}

pub(crate) fn fields(cx: &mut Cx, node: &YNode, path: &str) -> Option<BTreeMap<String, Field>> {
    each_entry(cx, node, path, field)
}

pub(crate) fn field(cx: &mut Cx, node: &YNode, path: &str) -> Option<Field> {
    let f = mapping(cx, node, path, &["type", "required", "options", "default", "description"])?;
    let types = [("string", FieldType::String), ("number", FieldType::Number), ("boolean", FieldType::Boolean), ("choice", FieldType::Choice)];
    let field_type = f.must_one_of(cx, "type", &types);
    let required = f.optional(cx, "required", boolean);
    let options = f.optional(cx, "options", string_list);
    let default = f.optional(cx, "default", scalar_json);
    let description = f.optional(cx, "description", string);

    let field_type = field_type?;
    let options = options?.unwrap_or_default();
    let mut ok = true;
    if field_type == FieldType::Choice && options.is_empty() {
        cx.report(f.pos, path, "a choice field needs `options`");
        ok = false;
    }
    if field_type != FieldType::Choice {
        if let Some(n) = f.get("options") {
            cx.report(n.pos, &f.path("options"), "`options` are only for choice fields");
            ok = false;
        }
    }
    let default = default?;
    if let (Some(value), Some(n)) = (&default, f.get("default")) {
        ok &= default_fits(cx, n, &f.path("default"), field_type, &options, value);
    }
    if !ok {
        return None;
    }
    Some(Field { field_type, required: required?.unwrap_or(false), options, default, description: description? })
}

/// Whether a field's default has the field's type.
pub(crate) fn default_fits(cx: &mut Cx, node: &YNode, path: &str, field_type: FieldType, options: &[String], value: &serde_json::Value) -> bool {
    let fits = match field_type {
        FieldType::String => value.is_string(),
        FieldType::Number => value.is_number(),
        FieldType::Boolean => value.is_boolean(),
        FieldType::Choice => value.as_str().is_some_and(|v| options.iter().any(|o| o == v)),
    };
    if !fits {
        let wanted = match field_type {
            FieldType::String => "a string".to_owned(),
            FieldType::Number => "a number".to_owned(),
            FieldType::Boolean => "true or false".to_owned(),
            FieldType::Choice => format!("one of the options ({})", options.join(", ")),
        };
        cx.report(node.pos, path, format!("the default must be {wanted}"));
    }
    fits
}

pub(crate) fn decision(cx: &mut Cx, node: &YNode, path: &str, id: &str, edges: &mut Vec<Edge>) -> Option<Decision> {
    let f = mapping(cx, node, path, &["cases", "default"])?;
    let cases = f.must(cx, "cases", |cx, n, p| cases(cx, n, p, id, edges));
    let default = f.optional(cx, "default", node_ref);
    if let Some(Some(target)) = &default {
        edges.push(Edge::declared(id, target, EdgeKind::Route, f.path("default")));
    }
    Some(Decision { cases: cases?, default: default?.map(|(t, _)| t) })
}

pub(crate) fn cases(cx: &mut Cx, node: &YNode, path: &str, id: &str, edges: &mut Vec<Edge>) -> Option<Vec<Case>> {
    let Value::Seq(items) = &node.value else {
        type_error(cx, node, path, "a list of cases (`- { if: …, to: … }`)");
        return None;
    };
    if items.is_empty() {
        cx.report(node.pos, path, "give at least one case");
        return None;
    }
    let mut out = Some(Vec::new());
    for (i, item) in items.iter().enumerate() {
        let case = case(cx, item, &format!("{path}[{i}]"), id, edges);
        match (case, out.as_mut()) {
            (Some(case), Some(list)) => list.push(case),
            _ => out = None,
        }
    }
    out
}

pub(crate) fn case(cx: &mut Cx, node: &YNode, path: &str, id: &str, edges: &mut Vec<Edge>) -> Option<Case> {
    let f = mapping(cx, node, path, &["if", "to"])?;
    let condition = f.must(cx, "if", expression);
    let to = f.must(cx, "to", node_ref);
    if let Some(target) = &to {
        edges.push(Edge::declared(id, target, EdgeKind::Route, f.path("to")));
    }
    Some(Case { condition: condition?, to: to?.0 })
}

pub(crate) fn output(cx: &mut Cx, node: &YNode, path: &str) -> Option<Output> {
    let f = mapping(cx, node, path, &["github", "draft", "body", "labels", "remove", "column"])?;
    let kinds = [OutputKind::PullRequest, OutputKind::Comment, OutputKind::Label, OutputKind::BoardMove];
    let kind = f.must_one_of(cx, "github", &kinds.map(|k| (kind_word(k), k)));
    let draft = f.optional(cx, "draft", boolean);
    let body = f.optional(cx, "body", template_text);
    let labels = f.optional(cx, "labels", string_list);
    let remove = f.optional(cx, "remove", string_list);
    let column = f.optional(cx, "column", nonempty_string);

    let kind = kind?;
    // Which keys each kind of output takes, and which it needs.
    let (allowed, needed): (&[&str], &[&str]) = match kind {
        OutputKind::PullRequest => (&["draft", "body"], &[]),
        OutputKind::Comment => (&["body"], &["body"]),
        // Labels to add, to remove, or both.
        OutputKind::Label => (&["labels", "remove"], &[]),
        OutputKind::BoardMove => (&["column"], &["column"]),
    };
    let mut ok = true;
    for key in ["draft", "body", "labels", "remove", "column"] {
        if let Some(n) = f.get(key).filter(|_| !allowed.contains(&key)) {
            cx.report(n.pos, &f.path(key), format!("`{key}` does not apply to a {} output", kind_word(kind)));
            ok = false;
        }
    }
    for key in needed {
        if f.get(key).is_none() {
            missing(cx, f.pos, path, key);
            ok = false;
        }
    }
    let labels = labels?.unwrap_or_default();
    let remove_labels = remove?.unwrap_or_default();
    if kind == OutputKind::Label && labels.is_empty() && remove_labels.is_empty() {
        // `remove` alone is enough; with neither, `labels` is what is missing.
        if f.get("labels").is_none() && f.get("remove").is_none() {
            missing(cx, f.pos, path, "labels");
        } else {
            cx.report(f.pos, &f.path("labels"), "name at least one label");
        }
        ok = false;
    }
    if !ok {
        return None;
    }
    Some(Output { kind, draft: draft?.unwrap_or(false), body: body?, labels, remove_labels, column: column? })
}

pub(crate) fn kind_word(kind: OutputKind) -> &'static str {
    match kind {
        OutputKind::PullRequest => "pull_request",
        OutputKind::Comment => "comment",
        OutputKind::Label => "label",
        OutputKind::BoardMove => "board_move",
    }
}

pub(crate) fn wait(cx: &mut Cx, node: &YNode, path: &str) -> Option<Wait> {
    let f = mapping(cx, node, path, &["for", "until", "event"])?;
    let given: Vec<&Key> = f.keys().filter(|k| ["for", "until", "event"].contains(&k.name.as_str())).collect();
    if given.is_empty() {
        cx.report(f.pos, path, "give one of `for` (a duration), `until` (an RFC 3339 time) or `event`");
        return None;
    }
    for extra in given.iter().skip(1) {
        cx.report(extra.pos, &f.path(&extra.name), format!("a wait has one of for, until, event, and this one already has `{}`", given[0].name));
    }
    let first = given[0].name.as_str();
    let wait = wait_kind(cx, &f, first);
    if given.len() > 1 {
        return None;
    }
    wait
}

pub(crate) fn wait_kind(cx: &mut Cx, f: &Fields<'_>, key: &str) -> Option<Wait> {
    let node = f.get(key)?;
    let path = f.path(key);
    match key {
        "for" => duration(cx, node, &path).map(Wait::For),
        "until" => {
            let text = string(cx, node, &path)?;
            match chrono::DateTime::parse_from_rfc3339(&text) {
                Ok(t) => Some(Wait::Until(t.with_timezone(&chrono::Utc))),
                Err(e) => {
                    cx.report(node.pos, &path, format!("`{text}` is not an RFC 3339 time such as 2026-01-31T09:00:00Z ({e})"));
                    None
                }
            }
        }
        _ => nonempty_string(cx, node, &path).map(Wait::Event),
    }
}

pub(crate) fn workflow(cx: &mut Cx, node: &YNode, path: &str) -> Option<ChildWorkflow> {
    let f = mapping(cx, node, path, &["name", "input"])?;
    let name = f.must(cx, "name", nonempty_string);
    let input = f.optional(cx, "input", |cx, n, p| each_entry(cx, n, p, template_text));
    Some(ChildWorkflow { name: name?, input: input?.unwrap_or_default() })
}

pub(crate) fn end(cx: &mut Cx, node: &YNode, path: &str) -> Option<End> {
    if matches!(node.value, Value::Null) {
        return Some(End { outcome: EndOutcome::Completed });
    }
    one_of(cx, node, path, &[("completed", EndOutcome::Completed), ("failed", EndOutcome::Failed)]).map(|outcome| End { outcome })
}
