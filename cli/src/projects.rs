//! `shopfloor projects …`: list the org's projects, show one with its settings, pause and
//! unpause it. `show`, `pause` and `unpause` act on the project in context (or `--project`).

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use serde::Deserialize;

use super::error::ClientError;
use super::http::{Api, Body};
use super::list::{PageArgs, print_list};
use super::table::{Style, Table, Tint, ago, plain, stamp};
use super::{Conn, say};

#[derive(Debug, Args)]
pub struct ProjectsArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    cmd: ProjectsCommand,
}

#[derive(Debug, Subcommand)]
enum ProjectsCommand {
    /// The org's projects, by slug.
    List(PageArgs),
    /// The project with its settings: paused or not, retention, board WIP limits. With
    /// `--json`, the API's two answers, one a line: the project's, then its settings'.
    Show,
    /// Hold the project's new runs; runs already going carry on (admin).
    Pause,
    /// Release the runs a paused project held (admin).
    Unpause,
}

#[derive(Deserialize)]
struct Project {
    slug: String,
    name: String,
    created_at: DateTime<Utc>,
}

#[derive(Deserialize)]
struct Settings {
    paused: bool,
    retention_days: i64,
    #[serde(default)]
    board_limits: Vec<BoardLimit>,
}

#[derive(Deserialize)]
struct BoardLimit {
    column: String,
    wip_limit: i64,
    occupied: i64,
    waiting: i64,
}

pub(super) async fn projects(args: ProjectsArgs) -> Result<u8, ClientError> {
    let api = Api::connect(&args.conn)?;
    let json = args.conn.json;
    let style = Style::detect();
    match args.cmd {
        ProjectsCommand::List(page) => {
            let answer = api.get(page.url(api.org_url(&["projects"])?)).await?;
            let current = api.has_project().then(|| api.project()).transpose()?;
            print_list(&answer, json, &["SLUG", "NAME", "CREATED", ""], "no projects", |p: &Project| {
                let here = if current == Some(p.slug.as_str()) { ("(current)".to_owned(), Tint::Cyan) } else { plain("") };
                vec![plain(&p.slug), plain(&p.name), plain(ago(p.created_at)), here]
            })
        }
        ProjectsCommand::Show => {
            let project = api.get(api.project_url(&[])?).await?;
            let settings = api.get(api.project_url(&["settings"])?).await?;
            if json {
                say!("{}", project.text());
                say!("{}", settings.text());
                return Ok(0);
            }
            let p: Project = project.json()?;
            let s: Settings = settings.json()?;
            say!("{}  {}", style.paint(Tint::Bold, &p.slug), style.paint(Tint::Dim, &p.name));
            say!("created    {} ({})", stamp(p.created_at), ago(p.created_at));
            say!("state      {}", paused_words(&s, style));
            say!("retention  finished runs are deleted {} days after they end", s.retention_days);
            if !s.board_limits.is_empty() {
                say!();
                let mut t = Table::new(&["COLUMN", "WIP LIMIT", "OCCUPIED", "WAITING"]);
                for b in &s.board_limits {
                    let tint = if b.occupied >= b.wip_limit { Tint::Yellow } else { Tint::Plain };
                    t.row(vec![plain(&b.column), plain(b.wip_limit.to_string()), (b.occupied.to_string(), tint), plain(b.waiting.to_string())]);
                }
                for l in t.render(style) {
                    say!("{l}");
                }
            }
            Ok(0)
        }
        ProjectsCommand::Pause => pause(&api, "pause", json, style).await,
        ProjectsCommand::Unpause => pause(&api, "unpause", json, style).await,
    }
}

fn paused_words(s: &Settings, style: Style) -> String {
    if s.paused { style.paint(Tint::Yellow, "paused: new runs are held") } else { "active".to_owned() }
}

/// `projects pause|unpause`: the API answers the project's settings.
async fn pause(api: &Api, verb: &str, json: bool, style: Style) -> Result<u8, ClientError> {
    let answer = api.post(api.project_url(&[verb])?, Body::None).await?;
    if json {
        say!("{}", answer.text());
    } else {
        let s: Settings = answer.json()?;
        let words = if s.paused { paused_words(&s, style) } else { "active: the runs it held are released".to_owned() };
        say!("{} {words}", api.project()?);
    }
    Ok(0)
}
