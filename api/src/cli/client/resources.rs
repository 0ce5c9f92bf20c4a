//! `shopfloor workflows …`, `hosts list|register|drain|undrain`, `audit list`, `tokens …` and
//! `budgets show`.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde::Deserialize;
use serde_json::Value;

use super::config;
use super::http::{with_query, Api, Body, ClientError, WorkflowProblem};
use super::table::{ago, plain, stamp, Style, Table, Tint};
use super::{say, Conn};

fn connect(conn: &Conn) -> Result<Api, ClientError> {
    Api::new(&config::settings(conn)?)
}

/// Prints a table, or says there is nothing, and where the next page starts.
fn print_table(table: &Table, style: Style, nothing: &str, next_cursor: Option<&str>) {
    if table.is_empty() {
        eprintln!("{nothing}");
    } else {
        for l in table.render(style) {
            say!("{l}");
        }
    }
    if let Some(c) = next_cursor {
        eprintln!("more: --cursor {c}");
    }
}

#[derive(Debug, Args)]
pub struct WorkflowsArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    cmd: WorkflowsCommand,
}

#[derive(Debug, Subcommand)]
enum WorkflowsCommand {
    /// The project's workflows.
    List(PageArgs),
    /// Upload a workflow file as its next version (nothing changes when the text is the
    /// latest version's already).
    Push { file: PathBuf },
    /// Ask the server whether a workflow file is valid (`shopfloor validate` checks offline).
    Validate { file: PathBuf },
    /// Hold new runs of a workflow.
    Pause { name: String },
    /// Let a paused workflow's runs go on.
    Unpause { name: String },
}

#[derive(Debug, Args)]
struct PageArgs {
    /// Page size, 1 to 200 (the server's default is 50).
    #[arg(long)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[arg(long)]
    cursor: Option<String>,
}

impl PageArgs {
    fn url(&self, url: reqwest::Url) -> reqwest::Url {
        let limit = self.limit.map(|l| l.to_string());
        with_query(url, &[("limit", limit.as_deref()), ("cursor", self.cursor.as_deref())])
    }
}

#[derive(Deserialize)]
struct Page<T> {
    items: Vec<T>,
    #[serde(default)]
    next_cursor: Option<String>,
}

#[derive(Deserialize)]
struct Workflow {
    name: String,
    latest_version: i64,
    paused: bool,
    created_at: DateTime<Utc>,
}

#[derive(Deserialize)]
struct Uploaded {
    name: String,
    version: i64,
    created: bool,
}

#[derive(Deserialize)]
struct Validation {
    valid: bool,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    problems: Vec<WorkflowProblem>,
}

fn read_file(file: &Path) -> Result<String, ClientError> {
    std::fs::read_to_string(file).map_err(|e| ClientError::Failed(format!("cannot read {}: {e}", file.display())))
}

/// `FILE:LINE:COL: path: message`, as `shopfloor validate` prints them.
fn print_problems(file: &Path, problems: &[WorkflowProblem]) {
    for p in problems {
        let path = if p.path.is_empty() { String::new() } else { format!("{}: ", p.path) };
        say!("{}:{}:{}: {path}{}", file.display(), p.line, p.col, p.message);
    }
}

pub(super) async fn workflows(args: WorkflowsArgs) -> Result<u8, ClientError> {
    let conn = args.conn;
    let api = connect(&conn)?;
    let style = Style::detect();
    match args.cmd {
        WorkflowsCommand::List(page) => {
            let answer = api.get(page.url(api.project_url(&["workflows"])?)).await?;
            if conn.json {
                say!("{}", answer.text());
                return Ok(0);
            }
            let list: Page<Workflow> = answer.json()?;
            let mut t = Table::new(&["NAME", "VERSION", "STATE", "CREATED"]);
            for w in &list.items {
                let state = if w.paused { ("paused".to_owned(), Tint::Yellow) } else { plain("active") };
                t.row(vec![plain(&w.name), plain(w.latest_version.to_string()), state, plain(ago(w.created_at))]);
            }
            print_table(&t, style, "no workflows", list.next_cursor.as_deref());
            Ok(0)
        }
        WorkflowsCommand::Push { file } => {
            let text = read_file(&file)?;
            let answer = match api.post(api.project_url(&["workflows"])?, Body::Yaml(text)).await {
                Ok(a) => a,
                Err(ClientError::Refused { problems, status, title, detail }) if !problems.is_empty() => {
                    print_problems(&file, &problems);
                    return Err(ClientError::Refused { status, title, detail, problems });
                }
                Err(e) => return Err(e),
            };
            if conn.json {
                say!("{}", answer.text());
            } else {
                let u: Uploaded = answer.json()?;
                if u.created {
                    say!("{} version {} uploaded", u.name, u.version);
                } else {
                    say!("{} version {} unchanged", u.name, u.version);
                }
            }
            Ok(0)
        }
        WorkflowsCommand::Validate { file } => {
            let text = read_file(&file)?;
            let answer = api.post(api.project_url(&["validate-workflow"])?, Body::Yaml(text)).await?;
            let v: Validation = answer.json()?;
            if conn.json {
                say!("{}", answer.text());
            } else if v.valid {
                say!("{}: valid{}", file.display(), v.name.map(|n| format!(" ({n})")).unwrap_or_default());
            } else {
                print_problems(&file, &v.problems);
            }
            Ok(if v.valid { 0 } else { 1 })
        }
        WorkflowsCommand::Pause { name } => pause(&api, &name, "pause", conn.json).await,
        WorkflowsCommand::Unpause { name } => pause(&api, &name, "unpause", conn.json).await,
    }
}

async fn pause(api: &Api, name: &str, verb: &str, json: bool) -> Result<u8, ClientError> {
    let answer = api.post(api.project_url(&["workflows", name, verb])?, Body::None).await?;
    if json {
        say!("{}", answer.text());
    } else {
        let w: Workflow = answer.json()?;
        say!("{} {}", w.name, if w.paused { "paused: new runs are held" } else { "active" });
    }
    Ok(0)
}

#[derive(Debug, Args)]
pub struct HostsArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    cmd: HostsCommand,
}

#[derive(Debug, Subcommand)]
enum HostsCommand {
    /// The project's hosts.
    List {
        /// Also hosts that were deregistered.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Make a registration token for a new host and print the command that starts the host
    /// with it, to paste on that machine; the token is in the command, shown this once (admin).
    Register {
        /// The new host's name, in lists (and the registration's); the machine's hostname
        /// when not given.
        #[arg(long)]
        name: Option<String>,
        /// What the host offers, comma-separated (`linux,harness:claude-code`), put in the
        /// command; the host's default (`linux`) when not given.
        #[arg(long)]
        capabilities: Option<String>,
        /// Hours the token may wait to be used, 1 to 168 (the server's default is 24).
        #[arg(long)]
        expires_in_hours: Option<u32>,
    },
    /// Stops new claims for a host; the steps it holds run to their end (admin).
    Drain {
        /// The host's name or id (`hosts list` shows them).
        host: String,
    },
    /// Lets a drained host claim again (admin).
    Undrain {
        /// The host's name or id.
        host: String,
    },
}

#[derive(Deserialize)]
struct Host {
    id: String,
    name: String,
    #[serde(default)]
    capabilities: Vec<String>,
    max_concurrent: i64,
    #[serde(default)]
    last_seen_at: Option<DateTime<Utc>>,
    #[serde(default)]
    deregistered_at: Option<DateTime<Utc>>,
    #[serde(default)]
    drained_at: Option<DateTime<Utc>>,
}

pub(super) async fn hosts(args: HostsArgs) -> Result<u8, ClientError> {
    let api = connect(&args.conn)?;
    let (all, page) = match args.cmd {
        HostsCommand::List { all, page } => (all, page),
        HostsCommand::Register { name, capabilities, expires_in_hours } => {
            return register(&api, name, capabilities, expires_in_hours, args.conn.json).await;
        }
        HostsCommand::Drain { host } => return drain(&api, &host, "drain", args.conn.json).await,
        HostsCommand::Undrain { host } => return drain(&api, &host, "undrain", args.conn.json).await,
    };
    let url = with_query(page.url(api.project_url(&["hosts"])?), &[("include_deregistered", all.then_some("true"))]);
    let answer = api.get(url).await?;
    if args.conn.json {
        say!("{}", answer.text());
        return Ok(0);
    }
    let list: Page<Host> = answer.json()?;
    let mut t = Table::new(&["NAME", "ID", "CAPABILITIES", "SLOTS", "LAST SEEN"]);
    for h in &list.items {
        let mut seen = match (h.deregistered_at, h.last_seen_at) {
            (Some(d), _) => (format!("deregistered {}", ago(d)), Tint::Dim),
            (None, Some(s)) => plain(ago(s)),
            (None, None) => ("never".to_owned(), Tint::Dim),
        };
        if let (Some(d), None) = (h.drained_at, h.deregistered_at) {
            seen.0 = format!("{} (drained {})", seen.0, ago(d));
        }
        t.row(vec![plain(&h.name), plain(&h.id), plain(h.capabilities.join(",")), plain(h.max_concurrent.to_string()), seen]);
    }
    print_table(&t, Style::detect(), "no hosts", list.next_cursor.as_deref());
    Ok(0)
}

#[derive(Deserialize)]
struct Registration {
    id: String,
    token: String,
    expires_at: DateTime<Utc>,
}

/// `hosts register`: the registration, then the command that starts the host with it.
async fn register(api: &Api, name: Option<String>, capabilities: Option<String>, hours: Option<u32>, json: bool) -> Result<u8, ClientError> {
    let mut body = serde_json::json!({});
    if let Some(n) = &name {
        body["name"] = n.as_str().into();
    }
    if let Some(h) = hours {
        body["expires_in_hours"] = h.into();
    }
    let answer = api.post(api.project_url(&["host-registrations"])?, Body::Json(body)).await?;
    if json {
        say!("{}", answer.text());
        return Ok(0);
    }
    let r: Registration = answer.json()?;
    say!("{}", crate::http::hosts::host_command(api.server(), &r.token, name.as_deref(), capabilities.as_deref()));
    eprintln!(
        "registration {} for {}/{}, usable once until {}; run the command above on the host (it holds the token, shown this once)",
        r.id,
        api.org()?,
        api.project()?,
        stamp(r.expires_at)
    );
    Ok(0)
}

/// A host named by its id, or by its name among the project's registered hosts.
async fn host_id(api: &Api, host: &str) -> Result<String, ClientError> {
    if uuid::Uuid::parse_str(host).is_ok() {
        return Ok(host.to_owned());
    }
    let mut found: Vec<String> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let url = with_query(api.project_url(&["hosts"])?, &[("limit", Some("200")), ("cursor", cursor.as_deref())]);
        let page: Page<Host> = api.get(url).await?.json()?;
        found.extend(page.items.into_iter().filter(|h| h.name == host).map(|h| h.id));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    match found.as_slice() {
        [id] => Ok(id.clone()),
        [] => Err(ClientError::Failed(format!("no host named `{host}` in {}/{}: `shopfloor hosts list` shows their names and ids", api.org()?, api.project()?))),
        many => Err(ClientError::Usage(format!("{} hosts are named `{host}`: give one's id ({})", many.len(), many.join(", ")))),
    }
}

async fn drain(api: &Api, host: &str, verb: &str, json: bool) -> Result<u8, ClientError> {
    let id = host_id(api, host).await?;
    let answer = api.post(api.project_url(&["hosts", &id, verb])?, Body::None).await?;
    if json {
        say!("{}", answer.text());
    } else {
        let h: Host = answer.json()?;
        say!("{} {}", h.name, if h.drained_at.is_some() { "drained: it claims nothing new" } else { "claims again" });
    }
    Ok(0)
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    cmd: AuditCommand,
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// Who did what, newest first: the project's entries when a project is set, else the org's.
    List(AuditListArgs),
}

#[derive(Debug, Args)]
struct AuditListArgs {
    /// The whole org's log, even when a project is set.
    #[arg(long)]
    org_wide: bool,
    /// The actor's id, or `kind:id` (`user:0190…`, `engine:e1`).
    #[arg(long)]
    actor: Option<String>,
    /// An action (`run.cancelled`), or a prefix ending in `*` (`run.*`).
    #[arg(long)]
    action: Option<String>,
    /// The target's id, or `kind:id` (`run:run-…`).
    #[arg(long)]
    target: Option<String>,
    /// Entries at or after this time (RFC 3339).
    #[arg(long)]
    since: Option<String>,
    /// Entries before this time (RFC 3339).
    #[arg(long)]
    until: Option<String>,
    #[command(flatten)]
    page: PageArgs,
}

#[derive(Deserialize)]
struct AuditEntry {
    at: DateTime<Utc>,
    actor_kind: String,
    actor_id: String,
    action: String,
    target_kind: String,
    target_id: String,
}

pub(super) async fn audit(args: AuditArgs) -> Result<u8, ClientError> {
    let api = connect(&args.conn)?;
    let AuditCommand::List(q) = args.cmd;
    let base = if api.has_project() && !q.org_wide { api.project_url(&["audit"])? } else { api.org_url(&["audit"])? };
    let url = with_query(
        q.page.url(base),
        &[
            ("actor", q.actor.as_deref()),
            ("action", q.action.as_deref()),
            ("target", q.target.as_deref()),
            ("since", q.since.as_deref()),
            ("until", q.until.as_deref()),
        ],
    );
    let answer = api.get(url).await?;
    if args.conn.json {
        say!("{}", answer.text());
        return Ok(0);
    }
    let list: Page<AuditEntry> = answer.json()?;
    let mut t = Table::new(&["AT", "ACTOR", "ACTION", "TARGET"]);
    for e in &list.items {
        t.row(vec![plain(stamp(e.at)), plain(format!("{}:{}", e.actor_kind, e.actor_id)), plain(&e.action), plain(format!("{}:{}", e.target_kind, e.target_id))]);
    }
    print_table(&t, Style::detect(), "no audit entries", list.next_cursor.as_deref());
    Ok(0)
}

#[derive(Debug, Args)]
pub struct TokensArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    cmd: TokensCommand,
}

#[derive(Debug, Subcommand)]
enum TokensCommand {
    /// Make a token; prints it alone on standard output, once.
    Create {
        /// What it is for, e.g. `ci`.
        #[arg(long)]
        name: String,
        /// `viewer`, `member`, `admin` or `owner`: at most your own role, which is the default.
        #[arg(long)]
        role: Option<String>,
        /// 1 to 365 days (the server's default is 90).
        #[arg(long)]
        expires_in_days: Option<u32>,
    },
    /// The org's tokens (yours, or everyone's for an admin).
    List(PageArgs),
    /// Revoke a token by its id.
    Revoke { id: String },
}

/// The roles a token may have, lowest first.
const ROLES: [&str; 4] = ["viewer", "member", "admin", "owner"];

/// A role given on the command line, checked here so that a typo gets the roles in one line
/// rather than the server's words about JSON.
fn parse_role(text: &str) -> Result<&str, ClientError> {
    if ROLES.contains(&text) {
        Ok(text)
    } else {
        Err(ClientError::Usage(format!("--role `{text}` is not a role: give one of {}", ROLES.join(", "))))
    }
}

#[derive(Deserialize)]
struct Token {
    id: String,
    name: String,
    kind: String,
    role: String,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    #[serde(default)]
    revoked_at: Option<DateTime<Utc>>,
}

#[derive(Deserialize)]
struct Created {
    #[serde(flatten)]
    record: Token,
    token: String,
}

pub(super) async fn tokens(args: TokensArgs) -> Result<u8, ClientError> {
    let api = connect(&args.conn)?;
    let json = args.conn.json;
    match args.cmd {
        TokensCommand::Create { name, role, expires_in_days } => {
            let mut body = serde_json::json!({ "name": name });
            if let Some(r) = &role {
                body["role"] = parse_role(r)?.into();
            }
            if let Some(d) = expires_in_days {
                body["expires_in_days"] = d.into();
            }
            let answer = api.post(api.org_url(&["tokens"])?, Body::Json(body)).await?;
            if json {
                say!("{}", answer.text());
            } else {
                let c: Created = answer.json()?;
                say!("{}", c.token);
                eprintln!("token `{}` ({}), id {}, expires {}; it is shown this once", c.record.name, c.record.role, c.record.id, stamp(c.record.expires_at));
            }
            Ok(0)
        }
        TokensCommand::List(page) => {
            let answer = api.get(page.url(api.org_url(&["tokens"])?)).await?;
            if json {
                say!("{}", answer.text());
                return Ok(0);
            }
            let list: Page<Token> = answer.json()?;
            let mut t = Table::new(&["ID", "NAME", "KIND", "ROLE", "CREATED", "EXPIRES", "STATE"]);
            for k in &list.items {
                let state = match k.revoked_at {
                    Some(at) => (format!("revoked {}", ago(at)), Tint::Dim),
                    None if k.expires_at < Utc::now() => ("expired".to_owned(), Tint::Dim),
                    None => ("active".to_owned(), Tint::Green),
                };
                t.row(vec![plain(&k.id), plain(&k.name), plain(&k.kind), plain(&k.role), plain(ago(k.created_at)), plain(stamp(k.expires_at)), state]);
            }
            print_table(&t, Style::detect(), "no tokens", list.next_cursor.as_deref());
            Ok(0)
        }
        TokensCommand::Revoke { id } => {
            api.send(Method::DELETE, api.org_url(&["tokens", &id])?, Body::None).await?;
            if !json {
                say!("revoked {id}");
            }
            Ok(0)
        }
    }
}

#[derive(Debug, Args)]
pub struct BudgetsArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    cmd: BudgetsCommand,
}

#[derive(Debug, Subcommand)]
enum BudgetsCommand {
    /// The limits with their spend in the current period: the project's and the org's when a
    /// project is set, else the org's and every project's.
    Show {
        /// Every project's limits, even when a project is set.
        #[arg(long)]
        org_wide: bool,
    },
}

#[derive(Deserialize)]
struct Budget {
    #[serde(default)]
    project: Option<String>,
    period: String,
    usd_limit: f64,
    hard: bool,
    spent_usd: f64,
    resets_at: DateTime<Utc>,
}

pub(super) async fn budgets(args: BudgetsArgs) -> Result<u8, ClientError> {
    let api = connect(&args.conn)?;
    let BudgetsCommand::Show { org_wide } = args.cmd;
    let url = if api.has_project() && !org_wide { api.project_url(&["budgets"])? } else { api.org_url(&["budgets"])? };
    let answer = match api.get(url).await {
        Ok(a) => a,
        Err(e @ ClientError::Refused { status: 404, .. }) => return Err(if has_budgets(&api).await { e } else { not_built() }),
        Err(e) => return Err(e),
    };
    if args.conn.json {
        say!("{}", answer.text());
        return Ok(0);
    }
    let list: Page<Budget> = answer.json()?;
    let mut t = Table::new(&["SCOPE", "PERIOD", "LIMIT", "SPENT", "KIND", "RESETS"]);
    for b in &list.items {
        let scope = b.project.clone().map_or_else(|| "org".to_owned(), |p| format!("project {p}"));
        let used = if b.usd_limit > 0.0 { b.spent_usd / b.usd_limit } else { 1.0 };
        let tint = if used >= 1.0 {
            Tint::Red
        } else if used >= 0.8 {
            Tint::Yellow
        } else {
            Tint::Plain
        };
        t.row(vec![
            plain(scope),
            plain(&b.period),
            plain(format!("${:.2}", b.usd_limit)),
            (format!("${:.2}", b.spent_usd), tint),
            plain(if b.hard { "hard" } else { "soft" }),
            plain(stamp(b.resets_at)),
        ]);
    }
    print_table(&t, Style::detect(), "no budgets", None);
    Ok(0)
}

fn not_built() -> ClientError {
    ClientError::Failed("`shopfloor budgets show` is not built yet: this server has no budgets route".into())
}

/// Whether the server documents a budgets route (its OpenAPI document), so that an older
/// server gets a plain "not built" instead of a puzzling 404.
async fn has_budgets(api: &Api) -> bool {
    let Ok(doc) = api.get(api.url(&["api", "v1", "openapi.json"])).await.and_then(|a| a.value()) else { return false };
    doc.get("paths").and_then(Value::as_object).is_some_and(|paths| paths.keys().any(|p| p.ends_with("/budgets")))
}
