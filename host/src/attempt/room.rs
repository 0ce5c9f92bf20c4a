//! A step's room: the directories its harness has (its worktree, a home of its own, Codex's
//! home), what the walls hide of the host, and an environment built from nothing.

use std::path::{Path, PathBuf};

use protocol::Permissions;
use protocol::egress::Rule;

use crate::config::Settings;
use crate::egress::proxy::{Proxy, Refused};
use crate::egress::{Allowed, Source};
use crate::harness::Kind;
use crate::journal::Entry;
use crate::walls::{Room, RoomEgress};

/// The attempt's home directory: the harness's `HOME`, empty but for the harness's own login
/// and settings copied from the host user's.
fn home(e: &Entry) -> PathBuf {
    e.dir.join("home")
}

/// The attempt's Codex home: its session file is this session's alone, and nothing of another
/// step's sessions is in reach.
pub(crate) fn codex_home(e: &Entry) -> PathBuf {
    e.dir.join("codex-home")
}

/// What a harness needs of its login and settings, by harness: paths under the host user's
/// home (Codex's: under `$CODEX_HOME`), copied to the same paths under the attempt's.
fn logins(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::ClaudeCode => &[".claude/.credentials.json", ".claude/settings.json"],
        Kind::Codex => &["config.toml", "auth.json"],
        Kind::Command => &[],
    }
}

/// Where the host user keeps credentials that a step must never read, under its home: hidden
/// by the walls, though the harness's `HOME` is the attempt's own.
const SECRETS_AT_HOME: [&str; 8] = [".claude", ".claude.json", ".codex", ".ssh", ".aws", ".config/gh", ".git-credentials", ".netrc"];

/// Makes the attempt's home (and Codex's), with copies of the host user's login and settings
/// for the harness, and says what the walls give the step: `cwd` (its worktree or scratch
/// directory; read-only for a `read` step), its homes, its repository cache's objects; the
/// host's work directory and the host user's credentials hidden.
pub(crate) fn furnish(settings: &Settings, e: &Entry, kind: Kind, cwd: &Path) -> std::io::Result<Room> {
    let host_home = std::env::var_os("HOME").map(PathBuf::from);
    let home = home(e);
    let (from, to) = match kind {
        Kind::Codex => (std::env::var_os("CODEX_HOME").map(PathBuf::from).or_else(|| host_home.as_ref().map(|h| h.join(".codex"))), codex_home(e)),
        _ => (host_home.clone(), home.clone()),
    };
    std::fs::create_dir_all(&home)?;
    std::fs::create_dir_all(&to)?;
    for file in logins(kind) {
        if let Some(source) = from.as_ref().map(|f| f.join(file)).filter(|f| f.is_file()) {
            let target = to.join(file);
            if let Some(dir) = target.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::copy(source, target)?;
        }
    }
    let canonical = |p: &Path| std::fs::canonicalize(p);
    let mut hidden = vec![canonical(&settings.work_dir)?];
    if let Some(host_home) = host_home.as_ref().and_then(|h| canonical(h).ok()) {
        hidden.extend(SECRETS_AT_HOME.iter().map(|s| host_home.join(s)).filter(|p| p.exists()));
    }
    let mut writable = vec![canonical(&home)?];
    if kind == Kind::Codex {
        writable.push(canonical(&to)?);
    }
    let mut readable = Vec::new();
    let work = canonical(cwd)?;
    if e.assignment.policy.permissions == Permissions::Read && kind != Kind::Command {
        readable.push(work.clone());
    } else {
        writable.push(work.clone());
    }
    if let Some(cache) = &e.cache {
        readable.push(canonical(&cache.join("objects"))?);
    }
    Ok(Room { hidden, writable, readable, cwd: work, egress: None })
}

/// Opens the room's way out: starts the step's proxy (again, for a harness adopted after a
/// restart: the room has bound the socket's directory, so a new socket there serves it) and
/// says where the room finds it. Without walls a step has the host's network as it is.
pub(crate) fn open_egress(
    settings: &Settings, e: &Entry, kind: Kind, env: &[(String, String)], refused: Refused,
) -> std::io::Result<Option<(Proxy, RoomEgress)>> {
    if !settings.walls.walled() {
        return Ok(None);
    }
    let allowed = allowed(settings, e, kind, env);
    let dir = e.dir.join("egress");
    std::fs::create_dir_all(&dir)?;
    let socket = std::fs::canonicalize(&dir)?.join("proxy.sock");
    let forwards = allowed.forwards();
    let proxy = Proxy::start(&socket, allowed, refused)?;
    Ok(Some((proxy, RoomEgress { socket, forwards })))
}

/// What the step may reach (`egress`): the operator's `--egress-allow`, its model API (the
/// harness's documented endpoint and the base URLs the host's environment and the harness's
/// copied settings name), and its node's `network.allow` and MCP servers' URLs.
pub(crate) fn allowed(settings: &Settings, e: &Entry, kind: Kind, env: &[(String, String)]) -> Allowed {
    let policy = &e.assignment.policy;
    let mut rules: Vec<(Rule, Source)> = settings.egress_allow.iter().map(|r| (r.clone(), Source::Operator)).collect();
    let documented: &[&str] = match kind {
        Kind::ClaudeCode => &["https://api.anthropic.com"],
        // ChatGPT's sign-in sends Codex's calls to chatgpt.com.
        Kind::Codex => &["https://api.openai.com", "https://chatgpt.com"],
        Kind::Command => &[],
    };
    rules.extend(documented.iter().filter_map(|u| Rule::for_url(u)).map(|r| (r, Source::Harness)));
    rules.extend(base_urls(e, kind, env).iter().filter_map(|u| Rule::for_url(u)).map(|r| (r, Source::Operator)));
    for text in &policy.network.allow {
        match Rule::parse(text) {
            Ok(rule) => rules.push((rule, Source::Workflow)),
            Err(why) => tracing::warn!(step.id = %e.assignment.step, %why, "ignoring a destination of the node's network.allow"),
        }
    }
    let mcp_urls = policy.mcp.values().filter_map(|m| match m {
        protocol::McpServer::Url(u) => Rule::for_url(u),
        protocol::McpServer::Command(_) => None,
    });
    rules.extend(mcp_urls.map(|r| (r, Source::Workflow)));
    Allowed::new(rules)
}

/// The model API base URLs the host's side names for the harness: its environment's, and its
/// copied settings' (Claude Code's `env` in `settings.json`; Codex's model providers).
fn base_urls(e: &Entry, kind: Kind, env: &[(String, String)]) -> Vec<String> {
    let var = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let mut urls = Vec::new();
    match kind {
        Kind::ClaudeCode => {
            urls.extend(var("ANTHROPIC_BASE_URL"));
            let settings = std::fs::read_to_string(home(e).join(".claude/settings.json")).ok();
            let settings: Option<serde_json::Value> = settings.and_then(|t| serde_json::from_str(&t).ok());
            urls.extend(settings.as_ref().and_then(|s| s.pointer("/env/ANTHROPIC_BASE_URL")).and_then(|v| v.as_str()).map(str::to_owned));
        }
        Kind::Codex => {
            urls.extend(var("OPENAI_BASE_URL"));
            let config = std::fs::read_to_string(codex_home(e).join("config.toml")).ok();
            if let Some(doc) = config.and_then(|t| t.parse::<toml_edit::DocumentMut>().ok()) {
                for key in ["openai_base_url", "chatgpt_base_url"] {
                    urls.extend(doc.get(key).and_then(|v| v.as_str()).map(str::to_owned));
                }
                if let Some(providers) = doc.get("model_providers").and_then(|p| p.as_table_like()) {
                    urls.extend(providers.iter().filter_map(|(_, p)| p.as_table_like()?.get("base_url")?.as_str().map(str::to_owned)));
                }
            }
        }
        Kind::Command => {}
    }
    urls
}

/// The harness's environment, built from nothing: `PATH` and the locale of the host's, the
/// attempt's `HOME` and a private `TMPDIR`, the variables the operator passes through by name
/// (`--pass-env`), and the step's own; never the host's credential. Codex's home
/// (`CODEX_HOME`) is the attempt's own; Claude Code sends nothing but its model calls (no
/// telemetry, error reports or update checks, and no side calls of its auto mode).
pub(crate) fn environment(settings: &Settings, e: &Entry, kind: Kind) -> Vec<(String, String)> {
    let a = &e.assignment;
    let absolute = |p: PathBuf| std::fs::canonicalize(&p).unwrap_or(p).display().to_string();
    let host = |name: &str| std::env::var(name).ok().map(|v| (name.to_owned(), v));
    let mut env: Vec<(String, String)> = ["PATH", "LANG", "LC_ALL", "TZ"].iter().filter_map(|n| host(n)).collect();
    env.extend(settings.pass_env.iter().filter_map(|n| host(n)));
    env.extend([
        ("HOME".to_owned(), absolute(home(e))),
        ("TMPDIR".to_owned(), "/tmp".to_owned()),
        ("SHOPFLOOR_STEP_ID".to_owned(), a.step.clone()),
        ("SHOPFLOOR_RUN_ID".to_owned(), a.run.clone()),
        ("SHOPFLOOR_NODE".to_owned(), a.node.clone()),
        ("SHOPFLOOR_ATTEMPT".to_owned(), a.attempt.to_string()),
    ]);
    match kind {
        Kind::Codex => env.push(("CODEX_HOME".into(), absolute(codex_home(e)))),
        Kind::ClaudeCode => env.push(("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(), "1".into())),
        Kind::Command => {}
    }
    env
}
