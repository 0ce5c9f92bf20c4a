//! `shopfloor host`'s settings: every one a flag and a `SHOPFLOOR_*` variable.
//!
//! | flag | variable | default |
//! |---|---|---|
//! | `--server` | `SHOPFLOOR_SERVER` | (required) the API's base URL |
//! | `--token` | `SHOPFLOOR_HOST_TOKEN` | a registration token on first start, or a host credential; not needed once `<work-dir>/credential.json` exists |
//! | `--name` | `SHOPFLOOR_HOST_NAME` | the machine's hostname |
//! | `--capabilities` | `SHOPFLOOR_HOST_CAPABILITIES` | `linux` |
//! | `--max-concurrent` (`--slots`) | `SHOPFLOOR_HOST_MAX_CONCURRENT` | 1 |
//! | `--work-dir` | `SHOPFLOOR_HOST_WORK_DIR` | `.shopfloor-host` |
//! | `--claude-command` | `SHOPFLOOR_CLAUDE_COMMAND` | `claude` |
//! | `--codex-command` | `SHOPFLOOR_CODEX_COMMAND` | `codex` |
//! | `--git-url-template` | `SHOPFLOOR_GIT_URL_TEMPLATE` | the assignment's clone URL |
//! | `--interrupt-grace-secs` | `SHOPFLOOR_HOST_INTERRUPT_GRACE_SECS` | 30 |
//! | `--git-timeout-secs` | `SHOPFLOOR_GIT_TIMEOUT_SECS` | 600 |
//! | `--heartbeat-secs` | `SHOPFLOOR_HOST_HEARTBEAT_SECS` | 10 |
//! | `--drain-secs` | `SHOPFLOOR_DRAIN_SECS` | 30 |
//! | `--git-author` | `SHOPFLOOR_GIT_AUTHOR` | `shopfloor <shopfloor@users.noreply.github.com>` |
//! | `--prices` | `SHOPFLOOR_HOST_PRICES` | the price table shipped in the binary (`host/prices.json`) |
//! | `--pass-env` | `SHOPFLOOR_HOST_PASS_ENV` | the model APIs' keys and base URLs (see `PASS_ENV`) |
//! | `--unsandboxed` | `SHOPFLOOR_HOST_UNSANDBOXED` | off: every harness runs inside walls (`walls`) |
//! | `--max-processes` | `SHOPFLOOR_HOST_MAX_PROCESSES` | 512 processes a step may have at once (`limits`) |
//! | `--max-memory-mib` | `SHOPFLOOR_HOST_MAX_MEMORY_MIB` | 4096 MiB of memory a step may use (`limits`) |
//! | `--max-cpu-secs` | `SHOPFLOOR_HOST_MAX_CPU_SECS` | 14400 CPU seconds a step's processes may use together, 0 for none (`limits`) |
//! | `--egress-allow` | `SHOPFLOOR_HOST_EGRESS_ALLOW` | none: destinations every step may reach beside its model API and its node's `network.allow` (`egress`) |

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

#[derive(Debug, Clone, Args)]
pub struct HostArgs {
    /// The shopfloor API's base URL, e.g. https://shopfloor.example.com.
    #[arg(long = "server", env = "SHOPFLOOR_SERVER")]
    pub server: String,
    /// A registration token (first start: the host registers and keeps its credential in the
    /// work directory) or a host credential.
    #[arg(long = "token", env = "SHOPFLOOR_HOST_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// This host's name in lists. Defaults to the machine's hostname.
    #[arg(long = "name", env = "SHOPFLOOR_HOST_NAME")]
    pub name: Option<String>,
    /// What this host offers, comma-separated: linux, arm64, gpu, harness:claude-code, …
    #[arg(long = "capabilities", env = "SHOPFLOOR_HOST_CAPABILITIES", value_delimiter = ',', default_value = "linux")]
    pub capabilities: Vec<String>,
    /// Steps run at once.
    #[arg(long = "max-concurrent", visible_alias = "slots", env = "SHOPFLOOR_HOST_MAX_CONCURRENT", default_value_t = 1)]
    pub max_concurrent: u32,
    /// Where the host keeps its credential, its journal, cached clones and worktrees. One host
    /// process per directory (a lock file enforces it).
    #[arg(long = "work-dir", env = "SHOPFLOOR_HOST_WORK_DIR", default_value = ".shopfloor-host")]
    pub work_dir: PathBuf,
    /// The Claude Code command, with any flags of your own (e.g. `claude --permission-mode acceptEdits`).
    #[arg(long = "claude-command", env = "SHOPFLOOR_CLAUDE_COMMAND", default_value = "claude")]
    pub claude_command: String,
    /// The Codex command, with any flags of your own.
    #[arg(long = "codex-command", env = "SHOPFLOOR_CODEX_COMMAND", default_value = "codex")]
    pub codex_command: String,
    /// Where repositories are fetched from, with `{repo}` for `owner/name` (a mirror, or local
    /// bare repositories in tests). Unset: the clone URL the server gives.
    #[arg(long = "git-url-template", env = "SHOPFLOOR_GIT_URL_TEMPLATE")]
    pub git_url_template: Option<String>,
    /// After a harness is interrupted (SIGINT) at its timeout, how long it has to print its
    /// result line before its process group is killed.
    #[arg(long = "interrupt-grace-secs", env = "SHOPFLOOR_HOST_INTERRUPT_GRACE_SECS", default_value_t = 30)]
    pub interrupt_grace_secs: u64,
    /// The time limit of each git call (clone, fetch, worktree, commit, push).
    #[arg(long = "git-timeout-secs", env = "SHOPFLOOR_GIT_TIMEOUT_SECS", default_value_t = 600)]
    pub git_timeout_secs: u64,
    /// How often the lease of each held step is renewed.
    #[arg(long = "heartbeat-secs", env = "SHOPFLOOR_HOST_HEARTBEAT_SECS", default_value_t = 10)]
    pub heartbeat_secs: u64,
    /// On the first SIGTERM, how long running steps may go on before they are handed back.
    #[arg(long = "drain-secs", env = "SHOPFLOOR_DRAIN_SECS", default_value_t = 30)]
    pub drain_secs: u64,
    /// The author (and committer) of the commits the host makes, `Name <email>`.
    #[arg(long = "git-author", env = "SHOPFLOOR_GIT_AUTHOR", default_value = "shopfloor <shopfloor@users.noreply.github.com>")]
    pub git_author: String,
    /// A price table (JSON, the shape of `host/prices.json`) to estimate sessions' spend with,
    /// instead of the one shipped in this release.
    #[arg(long = "prices", env = "SHOPFLOOR_HOST_PRICES")]
    pub prices: Option<PathBuf>,
    /// The variables of the host's environment a harness gets, by name, comma-separated (the
    /// model API's key): a harness's environment is built from nothing else but its step's own,
    /// PATH, the locale and its private HOME.
    #[arg(long = "pass-env", env = "SHOPFLOOR_HOST_PASS_ENV", value_delimiter = ',', default_value = PASS_ENV)]
    pub pass_env: Vec<String>,
    /// Run harnesses without walls (no bubblewrap): they can read what the host's user can,
    /// the host's credential included. Only for a machine that is itself the wall.
    #[arg(long = "unsandboxed", env = "SHOPFLOOR_HOST_UNSANDBOXED")]
    pub unsandboxed: bool,
    /// The most processes a step may have at once; one that reaches it fails `resource_limit`.
    #[arg(long = "max-processes", env = "SHOPFLOOR_HOST_MAX_PROCESSES", default_value_t = 512)]
    pub max_processes: u32,
    /// The most memory a step may use, in MiB; one whose process is killed for passing it fails
    /// `resource_limit`.
    #[arg(long = "max-memory-mib", env = "SHOPFLOOR_HOST_MAX_MEMORY_MIB", default_value_t = 4096)]
    pub max_memory_mib: u64,
    /// The most CPU time a step's processes may use together, in seconds (four hours of one
    /// core by default; 0: no limit); one that uses it fails `resource_limit`.
    #[arg(long = "max-cpu-secs", env = "SHOPFLOOR_HOST_MAX_CPU_SECS", default_value_t = 14_400)]
    pub max_cpu_secs: u64,
    /// Destinations every walled step may reach beside its model API and its node's
    /// `network.allow`, comma-separated: `host`, `host:port`, `*.domain` (a package registry, a
    /// loopback service of this machine's).
    #[arg(long = "egress-allow", env = "SHOPFLOOR_HOST_EGRESS_ALLOW", value_delimiter = ',')]
    pub egress_allow: Vec<String>,
}

/// What harnesses get of the host's environment unless told otherwise: the model APIs' keys
/// and base URLs.
pub const PASS_ENV: &str = "ANTHROPIC_API_KEY,ANTHROPIC_BASE_URL,OPENAI_API_KEY,OPENAI_BASE_URL,CODEX_API_KEY";

/// The settings as the agent uses them.
#[derive(Debug, Clone)]
pub struct Settings {
    pub server: String,
    pub name: String,
    pub capabilities: Vec<String>,
    pub slots: u32,
    pub work_dir: PathBuf,
    pub claude: Vec<String>,
    pub codex: Vec<String>,
    pub git_url_template: Option<String>,
    pub interrupt_grace: Duration,
    /// A cancelled step is stopped within this (within 5 s of the word reaching us).
    pub cancel_grace: Duration,
    pub git_timeout: Duration,
    pub heartbeat: Duration,
    pub drain: Duration,
    pub author_name: String,
    pub author_email: String,
    pub prices: Arc<crate::prices::Prices>,
    pub pass_env: Vec<String>,
    pub walls: crate::walls::Walls,
    pub egress_allow: Vec<protocol::egress::Rule>,
    pub limits: crate::limits::Limits,
    pub cgroups: crate::limits::Cgroups,
}

impl Settings {
    pub fn from_args(a: &HostArgs) -> Result<Settings, String> {
        let words = |s: &str, what: &str| {
            let w: Vec<String> = s.split_whitespace().map(str::to_owned).collect();
            if w.is_empty() { Err(format!("--{what}-command is empty")) } else { Ok(w) }
        };
        let (author_name, author_email) = match a.git_author.rsplit_once('<') {
            Some((name, email)) if email.ends_with('>') => (name.trim().to_owned(), email.trim_end_matches('>').trim().to_owned()),
            _ => return Err(format!("--git-author `{}` is not `Name <email>`", a.git_author)),
        };
        if a.max_concurrent == 0 || a.max_concurrent > 64 {
            return Err("--max-concurrent must be between 1 and 64".into());
        }
        let name = a.name.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_owned()).ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "host".into())
        });
        let interrupt_grace = Duration::from_secs(a.interrupt_grace_secs);
        Ok(Settings {
            server: a.server.trim_end_matches('/').to_owned(),
            name,
            capabilities: a.capabilities.iter().map(|c| c.trim().to_owned()).filter(|c| !c.is_empty()).collect(),
            slots: a.max_concurrent,
            work_dir: a.work_dir.clone(),
            claude: words(&a.claude_command, "claude")?,
            codex: words(&a.codex_command, "codex")?,
            git_url_template: a.git_url_template.clone(),
            interrupt_grace,
            cancel_grace: interrupt_grace.min(Duration::from_secs(3)),
            git_timeout: Duration::from_secs(a.git_timeout_secs.max(1)),
            heartbeat: Duration::from_secs(a.heartbeat_secs.max(1)),
            drain: Duration::from_secs(a.drain_secs),
            author_name,
            author_email,
            prices: Arc::new(crate::prices::Prices::load(a.prices.as_deref())?),
            pass_env: a.pass_env.iter().map(|n| n.trim().to_owned()).filter(|n| !n.is_empty()).collect(),
            // A host that cannot wall its steps in claims none.
            walls: crate::walls::Walls::probe(a.unsandboxed)
                .map_err(|why| format!("this host cannot run crew steps inside walls, so it claims none: {why}; fix: {}", crate::walls::FIX))?,
            egress_allow: crate::egress::operator_rules(&a.egress_allow)?,
            limits: crate::limits::Limits {
                processes: a.max_processes.max(1),
                memory_bytes: a.max_memory_mib.max(1).saturating_mul(1 << 20),
                cpu_secs: a.max_cpu_secs,
            },
            cgroups: crate::limits::Cgroups::detect(),
        })
    }
}
