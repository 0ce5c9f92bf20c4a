//! `shopfloor workflows …`: list, push, validate (on the server), pause and unpause.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use serde::Deserialize;

use super::error::{ClientError, WorkflowProblem};
use super::http::{Api, Body};
use super::list::{Page, PageArgs, print_table};
use super::table::{Style, Table, Tint, ago, plain};
use super::{Conn, say};

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
    let api = Api::connect(&conn)?;
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
