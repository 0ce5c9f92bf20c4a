//! `shopfloor audit list`, `tokens …` and `budgets show|set|remove`.

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde::Deserialize;
use serde_json::Value;

use super::error::ClientError;
use super::http::{Api, Body, with_query};
use super::list::{Page, PageArgs, print_list};
use super::members::parse_role;
use super::table::{Tint, ago, plain, stamp};
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
    print_list(&answer, args.conn.json, &["AT", "ACTOR", "ACTION", "TARGET"], "no audit entries", |e: &AuditEntry| {
        vec![plain(stamp(e.at)), plain(format!("{}:{}", e.actor_kind, e.actor_id)), plain(&e.action), plain(format!("{}:{}", e.target_kind, e.target_id))]
    })
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
                body["role"] = parse_role("--role", r)?.into();
            }
            if let Some(d) = expires_in_days {
                body["expires_in_days"] = d.into();
            }
            let answer = api.post(api.org_url(&["tokens"])?, Body::Json(body)).await?;
            answer.print(json, |c: Created| {
                say!("{}", c.token);
                eprintln!("token `{}` ({}), id {}, expires {}; it is shown this once", c.record.name, c.record.role, c.record.id, stamp(c.record.expires_at));
            })?;
            Ok(0)
        }
        TokensCommand::List(page) => {
            let answer = api.get(page.url(api.org_url(&["tokens"])?)).await?;
            print_list(&answer, json, &["ID", "NAME", "KIND", "ROLE", "CREATED", "EXPIRES", "STATE"], "no tokens", |k: &Token| {
                let state = match k.revoked_at {
                    Some(at) => (format!("revoked {}", ago(at)), Tint::Dim),
                    None if k.expires_at < Utc::now() => ("expired".to_owned(), Tint::Dim),
                    None => ("active".to_owned(), Tint::Green),
                };
                vec![plain(&k.id), plain(&k.name), plain(&k.kind), plain(&k.role), plain(ago(k.created_at)), plain(stamp(k.expires_at)), state]
            })
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
    /// Set the limit for a UTC day or month: the project's when a project is set, else the
    /// org's (admin). A reached limit holds new runs; a hard one stops crew steps too.
    Set {
        /// `day` or `month`.
        period: String,
        /// Dollars per period, e.g. `25` or `12.50`.
        #[arg(long, value_name = "AMOUNT")]
        usd: f64,
        /// Also stop running crew steps when the limit is reached (without it, only new runs
        /// are held).
        #[arg(long)]
        hard: bool,
        /// The org's limit, even when a project is set.
        #[arg(long)]
        org_wide: bool,
    },
    /// Remove the limit for a period, the project's or (as `set` chooses) the org's; the runs
    /// it held are released (admin).
    Remove {
        /// `day` or `month`.
        period: String,
        /// The org's limit, even when a project is set.
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
    let json = args.conn.json;
    match args.cmd {
        BudgetsCommand::Show { org_wide } => show_budgets(&api, org_wide, json).await,
        BudgetsCommand::Set { period, usd, hard, org_wide } => {
            let period = parse_period(&period)?;
            if !usd.is_finite() || usd < 0.0 {
                return Err(ClientError::Usage(format!("--usd {usd} is not an amount: give dollars, 0 or more (`--usd 25`)")));
            }
            let (url, project) = budget_url(&api, org_wide, &[period])?;
            let body = serde_json::json!({ "usd_limit": usd, "hard": hard });
            let answer = match api.send(Method::PUT, url, Body::Json(body)).await {
                Ok(a) => a,
                Err(e) => return Err(budgets_refused(&api, e, "set").await),
            };
            if json {
                say!("{}", answer.text());
                return Ok(0);
            }
            let list: Page<Budget> = answer.json()?;
            let b = list
                .items
                .iter()
                .find(|b| b.period == period && b.project == project)
                .ok_or_else(|| ClientError::Failed("the server set the limit but does not list it: `shopfloor budgets show` shows what is set".into()))?;
            let each = if period == "day" { "a day" } else { "a month" };
            say!(
                "{}: ${:.2} {each}, {}; ${:.2} spent, resets {}",
                scope_name(&api, b.project.as_deref())?,
                b.usd_limit,
                if b.hard { "hard" } else { "soft" },
                b.spent_usd,
                stamp(b.resets_at)
            );
            Ok(0)
        }
        BudgetsCommand::Remove { period, org_wide } => {
            let period = parse_period(&period)?;
            let (url, project) = budget_url(&api, org_wide, &[period])?;
            if let Err(e) = api.send(Method::DELETE, url, Body::None).await {
                return Err(budgets_refused(&api, e, "remove").await);
            }
            if !json {
                say!("removed the {period} limit of {}: the runs it held are released", scope_name(&api, project.as_deref())?);
            }
            Ok(0)
        }
    }
}

/// A budget's period, checked here so that a typo is a usage mistake, not the server's 404.
fn parse_period(text: &str) -> Result<&'static str, ClientError> {
    match text {
        "day" => Ok("day"),
        "month" => Ok("month"),
        _ => Err(ClientError::Usage(format!("`{text}` is not a budget period: give `day` or `month`"))),
    }
}

/// The budgets URL of the project when one is set and `org_wide` is not, else of the org;
/// with the project's slug in the first case.
fn budget_url(api: &Api, org_wide: bool, rest: &[&str]) -> Result<(reqwest::Url, Option<String>), ClientError> {
    let mut segments = vec!["budgets"];
    segments.extend_from_slice(rest);
    if api.has_project() && !org_wide { Ok((api.project_url(&segments)?, Some(api.project()?.to_owned()))) } else { Ok((api.org_url(&segments)?, None)) }
}

/// `project web` or `org acme`.
fn scope_name(api: &Api, project: Option<&str>) -> Result<String, ClientError> {
    Ok(match project {
        Some(p) => format!("project {p}"),
        None => format!("org {}", api.org()?),
    })
}

async fn show_budgets(api: &Api, org_wide: bool, json: bool) -> Result<u8, ClientError> {
    let (url, _) = budget_url(api, org_wide, &[])?;
    let answer = match api.get(url).await {
        Ok(a) => a,
        Err(e) => return Err(budgets_refused(api, e, "show").await),
    };
    print_list(&answer, json, &["SCOPE", "PERIOD", "LIMIT", "SPENT", "KIND", "RESETS"], "no budgets", |b: &Budget| {
        let scope = b.project.clone().map_or_else(|| "org".to_owned(), |p| format!("project {p}"));
        let used = if b.usd_limit > 0.0 { b.spent_usd / b.usd_limit } else { 1.0 };
        let tint = if used >= 1.0 {
            Tint::Red
        } else if used >= 0.8 {
            Tint::Yellow
        } else {
            Tint::Plain
        };
        vec![
            plain(scope),
            plain(&b.period),
            plain(format!("${:.2}", b.usd_limit)),
            (format!("${:.2}", b.spent_usd), tint),
            plain(if b.hard { "hard" } else { "soft" }),
            plain(stamp(b.resets_at)),
        ]
    })
}

/// A refused budgets request as is, but a 404 from a server with no budgets route says that
/// `shopfloor budgets <verb>` is not built there yet, instead of a puzzling "not found".
async fn budgets_refused(api: &Api, e: ClientError, verb: &str) -> ClientError {
    match e {
        ClientError::Refused { status: 404, .. } if !has_budgets(api).await => {
            ClientError::Failed(format!("`shopfloor budgets {verb}` is not built yet: this server has no budgets route"))
        }
        e => e,
    }
}

/// Whether the server documents a budgets route (its OpenAPI document).
async fn has_budgets(api: &Api) -> bool {
    let Ok(doc) = api.get(api.url(&["api", "v1", "openapi.json"])).await.and_then(|a| a.value()) else { return false };
    doc.get("paths").and_then(Value::as_object).is_some_and(|paths| paths.keys().any(|p| p.ends_with("/budgets")))
}
