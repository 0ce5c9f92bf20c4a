//! `shopfloor login` and `shopfloor context`: which server, which token, which org and project.
//!
//! There is no route that names a token's org, so `login` is told the org (`--org`, or asked
//! on a terminal) and proves the pair by listing the org's projects; with one project, that
//! project becomes the current one.

use std::io::{IsTerminal as _, Read as _, Write as _};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use clap::Args;
use serde::Deserialize;
use serde_json::{Value, json};

use super::config::{self, FileConfig, Source};
use super::error::ClientError;
use super::form::{Prompt as _, Terminal};
use super::http::{Api, parse_server, with_query};
use super::{Conn, say};

#[derive(Debug, Args)]
pub struct LoginArgs {
    /// The server's URL, e.g. `https://shopfloor.example.com` or `localhost:8080`.
    #[arg(long)]
    server: String,
    /// Read the token from standard input instead of asking for it (for scripts).
    #[arg(long)]
    token_stdin: bool,
    /// The org's slug; asked for on a terminal when not given.
    #[arg(long)]
    org: Option<String>,
    /// The project to use; the org's only project when it has one.
    #[arg(long)]
    project: Option<String>,
}

#[derive(Debug, Args)]
pub struct ContextArgs {
    /// Switch to this org (the stored token must belong to it).
    #[arg(long)]
    org: Option<String>,
    /// Switch to this project.
    #[arg(long, conflicts_with = "no_project")]
    project: Option<String>,
    /// Use no project until one is chosen.
    #[arg(long)]
    no_project: bool,
    /// Print the context as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Deserialize)]
struct ProjectList {
    items: Vec<ProjectItem>,
}

#[derive(Deserialize)]
struct ProjectItem {
    slug: String,
}

pub(super) async fn login(args: LoginArgs) -> Result<u8, ClientError> {
    let server = parse_server(&args.server)?;
    let server = server.as_str().trim_end_matches('/').to_owned();
    let token = read_token(args.token_stdin)?;
    if token.split('.').count() != 3 {
        return Err(ClientError::Usage("that is not a shopfloor token (a JWT of three dot-separated parts)".into()));
    }
    let org = match args.org {
        Some(org) => org,
        None if std::io::stdin().is_terminal() => {
            Terminal.line("Org slug: ").await.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).ok_or_else(|| ClientError::Usage("no org given".into()))?
        }
        None => return Err(ClientError::Usage("give the org's slug with --org".into())),
    };
    let api = Api::with(&server, token.clone(), Some(org.clone()), None)?;
    let list: ProjectList = api.get(with_query(api.org_url(&["projects"])?, &[("limit", Some("200"))])).await?.json()?;
    let project = match args.project {
        Some(p) => {
            api.get(api.org_url(&["projects", &p])?).await?;
            Some(p)
        }
        None if list.items.len() == 1 => list.items.first().map(|p| p.slug.clone()),
        None => None,
    };
    let path = config::save(&FileConfig { server: Some(server.clone()), token: Some(token.clone()), org: Some(org.clone()), project: project.clone() })?;
    let role = role_of(&token).map(|r| format!(" (role {r})")).unwrap_or_default();
    match &project {
        Some(p) => say!("Logged in to {server} in org {org}{role}; project {p}."),
        None if list.items.is_empty() => say!("Logged in to {server} in org {org}{role}; the org has no project yet."),
        None => say!("Logged in to {server} in org {org}{role}; choose a project with `shopfloor context --project P`."),
    }
    eprintln!("saved to {}", path.display());
    Ok(0)
}

/// The token: from standard input with `--token-stdin`, else asked on the terminal without
/// echo.
fn read_token(from_stdin: bool) -> Result<String, ClientError> {
    let token = if from_stdin {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map_err(|e| ClientError::Failed(format!("cannot read the token from standard input: {e}")))?;
        text
    } else if std::io::stdin().is_terminal() {
        read_hidden("Token: ")?
    } else {
        return Err(ClientError::Usage("standard input is not a terminal: give the token on it with --token-stdin".into()));
    };
    let token = token.trim().to_owned();
    if token.is_empty() {
        return Err(ClientError::Usage("no token given".into()));
    }
    Ok(token)
}

/// Reads a line in raw mode without echoing it.
fn read_hidden(question: &str) -> Result<String, ClientError> {
    use crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers, read};
    eprint!("{question}");
    let _ = std::io::stderr().flush();
    crossterm::terminal::enable_raw_mode().map_err(ClientError::failed)?;
    let mut text = String::new();
    let result = loop {
        match read() {
            Ok(Event::Key(k)) if k.kind != KeyEventKind::Release => match k.code {
                KeyCode::Enter => break Ok(()),
                KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => break Err(ClientError::Failed("cancelled".into())),
                KeyCode::Esc => break Err(ClientError::Failed("cancelled".into())),
                KeyCode::Backspace => {
                    text.pop();
                }
                KeyCode::Char(c) => text.push(c),
                _ => {}
            },
            // A pasted token arrives as one event when the terminal brackets pastes.
            Ok(Event::Paste(p)) => text.push_str(&p),
            Ok(_) => {}
            Err(e) => break Err(ClientError::failed(e)),
        }
    };
    let _ = crossterm::terminal::disable_raw_mode();
    eprintln!();
    result.map(|()| text)
}

/// The role a token names (its claims, read without checking: the server checks).
fn role_of(token: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()?;
    claims.get("role").and_then(Value::as_str).map(str::to_owned)
}

pub(super) async fn context(args: ContextArgs) -> Result<u8, ClientError> {
    if args.org.is_none() && args.project.is_none() && !args.no_project {
        return show(args.json);
    }
    let mut file = config::load()?;
    let changed_org = args.org.as_ref().is_some_and(|o| Some(o) != file.org.as_ref());
    let org = args.org.or_else(|| file.org.clone()).ok_or_else(|| ClientError::Usage("no org yet: give --org".into()))?;
    let project = if args.no_project { None } else { args.project.or_else(|| if changed_org { None } else { file.project.clone() }) };
    let server = file.server.clone().ok_or_else(|| ClientError::Usage("not logged in: run `shopfloor login --server URL` first".into()))?;
    let token = file.token.clone().ok_or_else(|| ClientError::Usage("not logged in: run `shopfloor login --server URL` first".into()))?;
    // The server must know the pair, with this token.
    let api = Api::with(&server, token, Some(org.clone()), project.clone())?;
    match &project {
        Some(p) => api.get(api.org_url(&["projects", p])?).await?,
        None => api.get(api.org_url(&["projects"])?).await?,
    };
    file.org = Some(org.clone());
    file.project = project.clone();
    config::save(&file)?;
    match project {
        Some(p) => say!("Now using org {org}, project {p}."),
        None => say!("Now using org {org}, no project."),
    }
    Ok(0)
}

/// Prints where commands go and where each setting comes from.
fn show(as_json: bool) -> Result<u8, ClientError> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let conn = Conn { server: env("SHOPFLOOR_SERVER"), org: env("SHOPFLOOR_ORG"), project: env("SHOPFLOOR_PROJECT"), json: as_json };
    let s = config::settings(&conn)?;
    let path = config::path()?;
    let names = ["SHOPFLOOR_SERVER", "SHOPFLOOR_TOKEN", "SHOPFLOOR_ORG", "SHOPFLOOR_PROJECT"];
    // Only variables reach this command, so a "flag" source is its variable.
    let from = |i: usize| match s.sources[i] {
        Source::Flag | Source::Env => names[i].to_owned(),
        other => other.words(names[i]),
    };
    if as_json {
        let v = json!({
            "server": s.server, "org": s.org, "project": s.project, "token": s.token.is_some(),
            "config": path.display().to_string(),
        });
        say!("{v}");
        return Ok(0);
    }
    let val = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let rows = [
        ("server", val(&s.server), from(0)),
        ("org", val(&s.org), from(2)),
        ("project", val(&s.project), from(3)),
        ("token", if s.token.is_some() { "set".to_owned() } else { "-".to_owned() }, from(1)),
    ];
    let width = rows.iter().map(|r| r.1.chars().count()).max().unwrap_or(0);
    for (name, value, source) in rows {
        say!("{name:<8} {value:<width$}  ({source})");
    }
    say!("{:<8} {}", "config", path.display());
    Ok(0)
}
