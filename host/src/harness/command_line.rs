//! Each harness's command line: the model, the caps, and what the agent may do (its node's
//! [`Policy`]) in the CLI's own flags, as the pinned CLIs' `--help` lists them and as they were
//! seen to behave (Claude Code 2.1.328, Codex 0.169.0).
//!
//! | `permissions` | Claude Code | Codex |
//! |---|---|---|
//! | `read` | `--permission-mode dontAsk`: every edit and command refused (and listed in its result's `permission_denials`) | `--sandbox read-only` |
//! | `edit` | `--permission-mode acceptEdits`, `--disallowedTools Bash` | `--sandbox workspace-write`: its commands write only in the work directory, offline |
//! | `full` | `--permission-mode acceptEdits --allowedTools Bash WebFetch WebSearch` | `--sandbox danger-full-access` |
//!
//! `full` is full inside the step's walls. Claude Code's own way to allow everything
//! (`bypassPermissions`) is refused when it runs as root, so it is never used: the same
//! flags work for any user. In `read` and `edit` Claude Code loads only the host user's
//! settings (`--setting-sources user`): a repository's `.claude/settings.json`, which the agent
//! or an earlier step may have written, cannot allow what the node does not.
//!
//! Neither CLI ever asks: Claude Code in `-p` refuses what it would ask about, and Codex runs
//! with `approval_policy = "never"`. A node's `tools` are added to Claude Code's
//! `--allowedTools` and `--disallowedTools` (a deny wins over any allow). Its `mcp` servers are
//! the only ones either CLI loads (`--strict-mcp-config --mcp-config`; Codex's `mcp_servers`
//! settings, `-c`), and under `full` Claude Code may use their tools (`mcp__<name>`). Codex is
//! told `--skip-git-repo-check` where the work directory is no repository (a run about no
//! repository), which it otherwise refuses.
//!
//! # Each policy's flags
//!
//! A crew node's `permissions` (`read`, `edit`, `full`, the default), `tools` (`allow`, `deny`:
//! Claude Code's rules) and `mcp` servers (`{command: [...]}` or `{url: ...}`) travel in the
//! assignment (`protocol::Policy`) and become each CLI's own flags
//! (`host/src/harness/command_line.rs`; checked against the pinned CLIs' `--help` and behaviour):
//!
//! | policy | Claude Code (`claude -p --input-format stream-json --output-format stream-json --verbose …`) | Codex (`codex exec --json … -`) |
//! |---|---|---|
//! | `read` | `--permission-mode dontAsk --setting-sources user`: every edit and command refused, each in the result's `permission_denials` | `--sandbox read-only -c approval_policy="never"` |
//! | `edit` | `--permission-mode acceptEdits --setting-sources user --disallowedTools Bash` | `--sandbox workspace-write -c approval_policy="never"`: its commands write only in the work directory, offline |
//! | `full` | `--permission-mode acceptEdits --allowedTools Bash WebFetch WebSearch mcp__<server>…` | `--sandbox danger-full-access -c approval_policy="never"` |
//! | `tools` | added to `--allowedTools` / `--disallowedTools` (a deny wins) | refused by validation: Codex's reach is its sandbox |
//! | `mcp` | `--strict-mcp-config --mcp-config {"mcpServers": …}` (always strict: no other server loads) | `-c mcp_servers.<name>.command=… -c mcp_servers.<name>.args=[…]` or `.url=…` |
//! | always | `--model`, `--max-turns`, `--max-budget-usd` from the caps; `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1` | `--model`; `--skip-git-repo-check` for a run about no repository; `CODEX_HOME` the attempt's own, with the host user's `config.toml` and `auth.json` |
//!
//! Neither ever asks a person: Claude Code in `-p` refuses what it would ask about, and Codex runs
//! with approvals `never`. `full` does not use Claude Code's `bypassPermissions`, which it refuses
//! to run as root: the same flags work for any user, and `full` is full inside the step's walls.
//! `read` and `edit` load only the host user's Claude Code settings, so a repository's
//! `.claude/settings.json` cannot allow what the node does not. A refused call leaves each CLI's
//! run a success: the host collects them (Claude Code's `permission_denials`; Codex's session
//! file, where its sandbox's refusals are the tool calls' outputs), and a step expected to change
//! files that changed none after refusals fails `edits_refused` (final), its output's `error`
//! naming the refused calls.

use protocol::{McpServer, Permissions, Policy};
use serde_json::{Value, json};

use super::Kind;
use crate::client::Assignment;

/// Claude Code's tools that run commands or reach the network, allowed under `full`.
const CLAUDE_FULL: [&str; 3] = ["Bash", "WebFetch", "WebSearch"];

/// The command line for an assignment; `claude` and `codex` are the configured commands.
pub fn command_line(kind: Kind, a: &Assignment, claude: &[String], codex: &[String]) -> Result<Vec<String>, String> {
    let mut cmd: Vec<String>;
    match kind {
        Kind::ClaudeCode => {
            cmd = claude.to_vec();
            // The prompt and people's messages come as user lines on stdin (`attempt::converse`).
            cmd.extend(["-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose"].map(str::to_owned));
            if let Some(model) = &a.model {
                cmd.extend(["--model".to_owned(), model.clone()]);
            }
            if let Some(turns) = a.caps.turns {
                cmd.extend(["--max-turns".to_owned(), turns.to_string()]);
            }
            if let Some(usd) = a.caps.usd {
                cmd.extend(["--max-budget-usd".to_owned(), format!("{usd}")]);
            }
            claude_policy(&mut cmd, &a.policy);
        }
        Kind::Codex => {
            cmd = codex.to_vec();
            cmd.extend(["exec", "--json"].map(str::to_owned));
            if let Some(model) = &a.model {
                cmd.extend(["--model".to_owned(), model.clone()]);
            }
            codex_policy(&mut cmd, &a.policy);
            if a.repository.is_none() {
                cmd.push("--skip-git-repo-check".to_owned());
            }
            // `-` reads the prompt from stdin.
            cmd.push("-".to_owned());
        }
        Kind::Command => {
            if a.command.is_empty() {
                return Err("the node names no command".into());
            }
            cmd = a.command.clone();
        }
    }
    Ok(cmd)
}

fn claude_policy(cmd: &mut Vec<String>, policy: &Policy) {
    let mcp_tools = policy.mcp.keys().map(|name| format!("mcp__{name}"));
    let (mode, allow, deny): (&str, Vec<String>, Vec<String>) = match policy.permissions {
        Permissions::Read => ("dontAsk", Vec::new(), Vec::new()),
        Permissions::Edit => ("acceptEdits", Vec::new(), vec!["Bash".to_owned()]),
        Permissions::Full => ("acceptEdits", CLAUDE_FULL.iter().map(|t| (*t).to_owned()).chain(mcp_tools).collect(), Vec::new()),
    };
    cmd.extend(["--permission-mode".to_owned(), mode.to_owned()]);
    if policy.permissions != Permissions::Full {
        cmd.extend(["--setting-sources".to_owned(), "user".to_owned()]);
    }
    let allow: Vec<String> = allow.into_iter().chain(policy.tools.allow.iter().cloned()).collect();
    let deny: Vec<String> = deny.into_iter().chain(policy.tools.deny.iter().cloned()).collect();
    for (flag, tools) in [("--allowedTools", allow), ("--disallowedTools", deny)] {
        if !tools.is_empty() {
            cmd.push(flag.to_owned());
            cmd.extend(tools);
        }
    }
    // Only the node's servers: never the host user's nor the repository's `.mcp.json`.
    cmd.push("--strict-mcp-config".to_owned());
    if !policy.mcp.is_empty() {
        let servers: serde_json::Map<String, Value> = policy
            .mcp
            .iter()
            .map(|(name, server)| {
                let server = match server {
                    McpServer::Command(argv) => json!({ "type": "stdio", "command": argv[0], "args": argv[1..] }),
                    McpServer::Url(url) => json!({ "type": "http", "url": url }),
                };
                (name.clone(), server)
            })
            .collect();
        cmd.extend(["--mcp-config".to_owned(), json!({ "mcpServers": servers }).to_string()]);
    }
}

fn codex_policy(cmd: &mut Vec<String>, policy: &Policy) {
    let sandbox = match policy.permissions {
        Permissions::Read => "read-only",
        Permissions::Edit => "workspace-write",
        Permissions::Full => "danger-full-access",
    };
    cmd.extend(["--sandbox".to_owned(), sandbox.to_owned()]);
    // `exec` never asks by default; said so that no configuration file makes it.
    cmd.extend(["-c".to_owned(), "approval_policy=\"never\"".to_owned()]);
    // A `-c` value is TOML; a JSON string or list of strings is one too.
    for (name, server) in &policy.mcp {
        let settings = match server {
            McpServer::Command(argv) => vec![("command", json!(argv[0])), ("args", json!(argv[1..]))],
            McpServer::Url(url) => vec![("url", json!(url))],
        };
        for (key, value) in settings {
            cmd.extend(["-c".to_owned(), format!("mcp_servers.{name}.{key}={value}")]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::Tools;

    fn assignment(permissions: Permissions) -> Assignment {
        let mut a = crate::journal::tests::assignment("step-x");
        a.policy = Policy { permissions, ..Policy::default() };
        a
    }

    fn line(kind: Kind, a: &Assignment) -> String {
        command_line(kind, a, &["claude".to_owned()], &["codex".to_owned()]).unwrap().join(" ")
    }

    #[test]
    fn each_permission_is_the_clis_own_mode() {
        let claude = |p| line(Kind::ClaudeCode, &assignment(p));
        assert!(
            claude(Permissions::Read).ends_with("--verbose --permission-mode dontAsk --setting-sources user --strict-mcp-config"),
            "{}",
            claude(Permissions::Read)
        );
        assert!(claude(Permissions::Edit).contains("--permission-mode acceptEdits --setting-sources user --disallowedTools Bash --strict-mcp-config"));
        assert!(claude(Permissions::Full).contains("--permission-mode acceptEdits --allowedTools Bash WebFetch WebSearch --strict-mcp-config"));
        assert!(!claude(Permissions::Full).contains("bypassPermissions") && !claude(Permissions::Full).contains("--setting-sources"));
        let codex = |p| line(Kind::Codex, &assignment(p));
        assert_eq!(codex(Permissions::Read), r#"codex exec --json --sandbox read-only -c approval_policy="never" --skip-git-repo-check -"#);
        assert!(codex(Permissions::Edit).contains("--sandbox workspace-write"));
        assert!(codex(Permissions::Full).contains("--sandbox danger-full-access"));
    }

    #[test]
    fn tools_and_mcp_servers_are_the_nodes() {
        let mut a = assignment(Permissions::Full);
        a.policy.tools = Tools { allow: vec!["Bash(npm test:*)".into()], deny: vec!["WebFetch".into()] };
        a.policy.mcp.insert("docs".into(), McpServer::Command(vec!["docs-mcp".into(), "--stdio".into()]));
        a.policy.mcp.insert("search".into(), McpServer::Url("https://mcp.example.com/mcp".into()));
        let cmd = command_line(Kind::ClaudeCode, &a, &["claude".to_owned()], &[]).unwrap();
        let after = |flag: &str| cmd.iter().skip_while(|a| *a != flag).skip(1).take_while(|a| !a.starts_with("--")).cloned().collect::<Vec<_>>();
        assert_eq!(after("--allowedTools"), ["Bash", "WebFetch", "WebSearch", "mcp__docs", "mcp__search", "Bash(npm test:*)"]);
        assert_eq!(after("--disallowedTools"), ["WebFetch"]);
        let config: Value = serde_json::from_str(&after("--mcp-config")[0]).unwrap();
        assert_eq!(config["mcpServers"]["docs"], json!({ "type": "stdio", "command": "docs-mcp", "args": ["--stdio"] }));
        assert_eq!(config["mcpServers"]["search"], json!({ "type": "http", "url": "https://mcp.example.com/mcp" }));
        let codex = line(Kind::Codex, &a);
        assert!(
            codex.contains(
                r#"-c mcp_servers.docs.command="docs-mcp" -c mcp_servers.docs.args=["--stdio"] -c mcp_servers.search.url="https://mcp.example.com/mcp""#
            ),
            "{codex}"
        );
    }

    #[test]
    fn codex_checks_for_a_repository_only_where_there_is_one() {
        let mut a = assignment(Permissions::Full);
        assert!(line(Kind::Codex, &a).contains("--skip-git-repo-check"));
        a.repository = Some(crate::client::Repository {
            full_name: "acme/widgets".into(),
            clone_url: "https://github.com/acme/widgets.git".into(),
            default_branch: "main".into(),
            token: None,
        });
        assert!(!line(Kind::Codex, &a).contains("--skip-git-repo-check"));
    }
}
