//! `shopfloor audit list`, `tokens …` and `budgets show`.

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde::Deserialize;
use serde_json::Value;

use super::error::ClientError;
use super::http::{Api, Body, with_query};
use super::list::{Page, PageArgs, print_table};
use super::table::{Style, Table, Tint, ago, plain, stamp};
use super::{Conn, say};

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
    let api = Api::connect(&args.conn)?;
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
        t.row(vec![
            plain(stamp(e.at)),
            plain(format!("{}:{}", e.actor_kind, e.actor_id)),
            plain(&e.action),
            plain(format!("{}:{}", e.target_kind, e.target_id)),
        ]);
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
    if ROLES.contains(&text) { Ok(text) } else { Err(ClientError::Usage(format!("--role `{text}` is not a role: give one of {}", ROLES.join(", ")))) }
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
    let api = Api::connect(&args.conn)?;
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
    let api = Api::connect(&args.conn)?;
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
