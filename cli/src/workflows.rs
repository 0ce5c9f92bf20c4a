//! `shopfloor workflows …`: list, push, validate (on the server), pause, unpause, versions and
//! show (a version's YAML).

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use serde::Deserialize;
use serde_json::Value;

use super::error::{ClientError, WorkflowProblem};
use super::http::{Api, Body};
use super::list::{PageArgs, print_list};
use super::table::{Tint, ago, plain, stamp};
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
    /// A workflow's versions, newest first.
    Versions {
        name: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Print a workflow's YAML as uploaded, alone on standard output
    /// (`shopfloor workflows show ship > ship.yaml`): the latest version, or `--version N`.
    Show {
        name: String,
        /// A version number; the latest by default.
        #[arg(long)]
        version: Option<u32>,
    },
}

#[derive(Deserialize)]
struct Workflow {
    name: String,
    latest_version: i64,
    paused: bool,
    created_at: DateTime<Utc>,
}

#[derive(Deserialize)]
struct Version {
    version: i64,
    sha256: String,
    created_by: String,
    created_at: DateTime<Utc>,
    #[serde(default)]
    source: Option<String>,
}

/// A workflow with its latest version (`get_workflow`).
#[derive(Deserialize)]
struct Detail {
    name: String,
    #[serde(default)]
    latest: Option<Version>,
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
    match args.cmd {
        WorkflowsCommand::List(page) => {
            let answer = api.get(page.url(api.project_url(&["workflows"])?)).await?;
            print_list(&answer, conn.json, &["NAME", "VERSION", "STATE", "CREATED"], "no workflows", |w: &Workflow| {
                let state = if w.paused { ("paused".to_owned(), Tint::Yellow) } else { plain("active") };
                vec![plain(&w.name), plain(w.latest_version.to_string()), state, plain(ago(w.created_at))]
            })
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
            answer.print(conn.json, |u: Uploaded| {
                if u.created {
                    say!("{} version {} uploaded", u.name, u.version);
                } else {
                    say!("{} version {} unchanged", u.name, u.version);
                }
            })?;
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
        WorkflowsCommand::Versions { name, page } => {
            let answer = api.get(page.url(api.project_url(&["workflows", &name, "versions"])?)).await?;
            print_list(&answer, conn.json, &["VERSION", "SHA256", "BY", "CREATED"], "no versions", |v: &Version| {
                let sha: String = v.sha256.chars().take(12).collect();
                vec![plain(v.version.to_string()), plain(sha), plain(&v.created_by), plain(stamp(v.created_at))]
            })
        }
        WorkflowsCommand::Show { name, version } => show(&api, &name, version, conn.json).await,
    }
}

/// `workflows show`: the source alone on standard output, byte for byte, so that pushing the
/// file it was redirected to changes nothing; which version it is goes to standard error.
async fn show(api: &Api, name: &str, version: Option<u32>, json: bool) -> Result<u8, ClientError> {
    let answer = match version {
        Some(n) => api.get(api.project_url(&["workflows", name, "versions", &n.to_string()])?).await?,
        None => api.get(api.project_url(&["workflows", name])?).await?,
    };
    if json {
        say!("{}", answer.text());
        return Ok(0);
    }
    let (v, latest, pointer) = match version {
        Some(_) => (answer.json::<Version>()?, "", "/source"),
        None => {
            let d: Detail = answer.json()?;
            (d.latest.ok_or_else(|| ClientError::Failed(format!("{} has no version to show", d.name)))?, " (the latest)", "/latest/source")
        }
    };
    // A terminal gets the text with its control characters shown as escapes, as every other
    // text from the server; a file or a pipe gets it as uploaded.
    let source = if std::io::stdout().is_terminal() {
        v.source.clone().unwrap_or_default()
    } else {
        answer.raw_value()?.pointer(pointer).and_then(Value::as_str).unwrap_or_default().to_owned()
    };
    // Not `say!`: the text ends as it ends, with no newline added.
    let _ = std::io::stdout().lock().write_all(source.as_bytes());
    eprintln!("{name} version {}{latest}, uploaded by {} at {}, sha256 {}", v.version, v.created_by, stamp(v.created_at), v.sha256);
    Ok(0)
}

async fn pause(api: &Api, name: &str, verb: &str, json: bool) -> Result<u8, ClientError> {
    let answer = api.post(api.project_url(&["workflows", name, verb])?, Body::None).await?;
    answer.print(json, |w: Workflow| {
        say!("{} {}", w.name, if w.paused { "paused: new runs are held" } else { "active" });
    })?;
    Ok(0)
}
