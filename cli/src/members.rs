//! `shopfloor members …`: list, add, remove and change a role, in the org; and the roles a
//! command line may name (`tokens create --role` checks them here too).
//!
//! A member is named by their user id or their email, as `members list` shows them; an email
//! is looked up in the list, since the API's routes take the id.

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde::Deserialize;

use super::error::ClientError;
use super::http::{Api, Body, with_query};
use super::list::{Page, PageArgs, print_list};
use super::table::{Tint, ago, plain};
use super::{Conn, say};

/// The roles of the org, lowest first.
pub(crate) const ROLES: [&str; 4] = ["viewer", "member", "admin", "owner"];

/// A role given on the command line as `what` (`--role`, `ROLE`), checked here so that a
/// typo gets the roles in one line rather than the server's words about JSON.
pub(crate) fn parse_role<'a>(what: &str, text: &'a str) -> Result<&'a str, ClientError> {
    if ROLES.contains(&text) { Ok(text) } else { Err(ClientError::Usage(format!("{what} `{text}` is not a role: give one of {}", ROLES.join(", ")))) }
}

#[derive(Debug, Args)]
pub struct MembersArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    cmd: MembersCommand,
}

#[derive(Debug, Subcommand)]
enum MembersCommand {
    /// The org's members, by email.
    List(PageArgs),
    /// Add a person by email with a role (admin; owner to add an owner).
    Add {
        /// Their email address.
        email: String,
        /// `viewer`, `member`, `admin` or `owner`.
        #[arg(long)]
        role: String,
    },
    /// Remove a member; their tokens are revoked with it (admin; owner to remove an owner).
    Remove {
        /// The member's user id or email (`members list` shows both).
        user: String,
    },
    /// Change a member's role (admin; owner when the owner role is given or taken).
    Role {
        /// The member's user id or email (`members list` shows both).
        user: String,
        /// `viewer`, `member`, `admin` or `owner`.
        role: String,
    },
}

#[derive(Deserialize)]
struct Member {
    user: String,
    email: String,
    role: String,
    #[serde(default)]
    github_login: Option<String>,
    created_at: DateTime<Utc>,
}

pub(super) async fn members(args: MembersArgs) -> Result<u8, ClientError> {
    let api = Api::connect(&args.conn)?;
    let json = args.conn.json;
    match args.cmd {
        MembersCommand::List(page) => {
            let answer = api.get(page.url(api.org_url(&["members"])?)).await?;
            print_list(&answer, json, &["EMAIL", "USER", "ROLE", "GITHUB", "JOINED"], "no members", |m: &Member| {
                let github = m.github_login.clone().map_or_else(|| ("-".to_owned(), Tint::Dim), plain);
                vec![plain(&m.email), plain(&m.user), plain(&m.role), github, plain(ago(m.created_at))]
            })
        }
        MembersCommand::Add { email, role } => {
            let body = serde_json::json!({ "email": email, "role": parse_role("--role", &role)? });
            let answer = api.post(api.org_url(&["members"])?, Body::Json(body)).await?;
            if json {
                say!("{}", answer.text());
            } else {
                let m: Member = answer.json()?;
                say!("added {} to {} as {} (user {})", m.email, api.org()?, m.role, m.user);
            }
            Ok(0)
        }
        MembersCommand::Remove { user } => {
            let id = member_id(&api, &user).await?;
            api.send(Method::DELETE, api.org_url(&["members", &id])?, Body::None).await?;
            if !json {
                say!("removed {user} from {}: their tokens are revoked", api.org()?);
            }
            Ok(0)
        }
        MembersCommand::Role { user, role } => {
            let body = serde_json::json!({ "role": parse_role("ROLE", &role)? });
            let id = member_id(&api, &user).await?;
            let answer = api.send(Method::PATCH, api.org_url(&["members", &id])?, Body::Json(body)).await?;
            if json {
                say!("{}", answer.text());
            } else {
                let m: Member = answer.json()?;
                say!("{} is now {} in {}", m.email, m.role, api.org()?);
            }
            Ok(0)
        }
    }
}

/// A member named by their user id, or by their email among the org's members.
async fn member_id(api: &Api, user: &str) -> Result<String, ClientError> {
    if uuid::Uuid::parse_str(user).is_ok() {
        return Ok(user.to_owned());
    }
    let mut cursor: Option<String> = None;
    loop {
        let url = with_query(api.org_url(&["members"])?, &[("limit", Some("200")), ("cursor", cursor.as_deref())]);
        let page: Page<Member> = api.get(url).await?.json()?;
        if let Some(m) = page.items.into_iter().find(|m| m.email.eq_ignore_ascii_case(user.trim())) {
            return Ok(m.user);
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    Err(ClientError::Failed(format!("no member `{user}` in {}: `shopfloor members list` shows their emails and ids", api.org()?)))
}
