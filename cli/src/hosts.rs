//! `shopfloor hosts …`: list, register (the command that starts a host, which the console's
//! "Add a host" page shows too), drain, undrain and deregister.

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde::Deserialize;

use super::error::ClientError;
use super::http::{Api, Body, with_query};
use super::list::{Page, PageArgs, print_list};
use super::table::{Tint, ago, plain, stamp};
use super::{Conn, say};

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
    /// Deregisters a host: it takes no more steps and its credentials are revoked (admin).
    Deregister {
        /// The host's name or id (`hosts list` shows them).
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
    let api = Api::connect(&args.conn)?;
    let (all, page) = match args.cmd {
        HostsCommand::List { all, page } => (all, page),
        HostsCommand::Register { name, capabilities, expires_in_hours } => {
            return register(&api, name, capabilities, expires_in_hours, args.conn.json).await;
        }
        HostsCommand::Drain { host } => return drain(&api, &host, "drain", args.conn.json).await,
        HostsCommand::Undrain { host } => return drain(&api, &host, "undrain", args.conn.json).await,
        HostsCommand::Deregister { host } => return deregister(&api, &host, args.conn.json).await,
    };
    let url = with_query(page.url(api.project_url(&["hosts"])?), &[("include_deregistered", all.then_some("true"))]);
    let answer = api.get(url).await?;
    print_list(&answer, args.conn.json, &["NAME", "ID", "CAPABILITIES", "SLOTS", "LAST SEEN"], "no hosts", |h: &Host| {
        let mut seen = match (h.deregistered_at, h.last_seen_at) {
            (Some(d), _) => (format!("deregistered {}", ago(d)), Tint::Dim),
            (None, Some(s)) => plain(ago(s)),
            (None, None) => ("never".to_owned(), Tint::Dim),
        };
        if let (Some(d), None) = (h.drained_at, h.deregistered_at) {
            seen.0 = format!("{} (drained {})", seen.0, ago(d));
        }
        vec![plain(&h.name), plain(&h.id), plain(h.capabilities.join(",")), plain(h.max_concurrent.to_string()), seen]
    })
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
    say!("{}", crate::host_command(api.server(), &r.token, name.as_deref(), capabilities.as_deref()));
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
        [] => {
            Err(ClientError::Failed(format!("no host named `{host}` in {}/{}: `shopfloor hosts list` shows their names and ids", api.org()?, api.project()?)))
        }
        many => Err(ClientError::Usage(format!("{} hosts are named `{host}`: give one's id ({})", many.len(), many.join(", ")))),
    }
}

async fn drain(api: &Api, host: &str, verb: &str, json: bool) -> Result<u8, ClientError> {
    let id = host_id(api, host).await?;
    let answer = api.post(api.project_url(&["hosts", &id, verb])?, Body::None).await?;
    answer.print(json, |h: Host| {
        say!("{} {}", h.name, if h.drained_at.is_some() { "drained: it claims nothing new" } else { "claims again" });
    })?;
    Ok(0)
}

/// `hosts deregister`: the API answers nothing (204), so `--json` prints nothing either.
async fn deregister(api: &Api, host: &str, json: bool) -> Result<u8, ClientError> {
    let id = host_id(api, host).await?;
    api.send(Method::DELETE, api.project_url(&["hosts", &id])?, Body::None).await?;
    if !json {
        say!("{host} deregistered: it takes no more steps and its credentials are revoked");
    }
    Ok(0)
}

/// The command that starts a host with a registration token: `shopfloor host --server …
/// --token …`, with its name and capabilities when given. The CLI's `hosts register` prints it
/// and the console's "Add a host" page shows it, so both say the same thing.
pub fn host_command(server: &str, token: &str, name: Option<&str>, capabilities: Option<&str>) -> String {
    let mut words = vec!["shopfloor".to_owned(), "host".into(), "--server".into(), shell_word(server), "--token".into(), shell_word(token)];
    if let Some(n) = name {
        words.extend(["--name".into(), shell_word(n)]);
    }
    if let Some(c) = capabilities {
        words.extend(["--capabilities".into(), shell_word(c)]);
    }
    words.join(" ")
}

/// A word a POSIX shell reads back as itself: as is when it is plain, else single-quoted.
fn shell_word(text: &str) -> String {
    let plain = !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric() || "-_.,:/@%+=".contains(c));
    if plain { text.to_owned() } else { format!("'{}'", text.replace('\'', r"'\''")) }
}
