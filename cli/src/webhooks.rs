//! `shopfloor webhooks …`: the project's outgoing webhooks (admin): list, create (which prints
//! the signing secret, once), delete, a subscription's deliveries, and replaying one.

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde::Deserialize;

use super::error::ClientError;
use super::http::{Api, Body};
use super::list::{PageArgs, print_list};
use super::table::{Tint, ago, plain, stamp, status_tint};
use super::{Conn, say};

#[derive(Debug, Args)]
pub struct WebhooksArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    cmd: WebhooksCommand,
}

#[derive(Debug, Subcommand)]
enum WebhooksCommand {
    /// The project's subscriptions.
    List,
    /// Subscribe a URL to the project's events; prints the secret that signs each delivery
    /// (`X-Shopfloor-Signature-256`) alone on standard output, once.
    Create {
        /// An `http://` or `https://` URL outside the server's network; it gets a POST per
        /// event.
        #[arg(long)]
        url: String,
        /// Event filters, comma-separated or repeated: `run.completed`, `run.*`, `step.*`,
        /// `*` (the server's default is `run.*`).
        #[arg(long, value_delimiter = ',')]
        events: Vec<String>,
    },
    /// Remove a subscription and its delivery log.
    Delete {
        /// The subscription's id (`webhooks list` shows them).
        id: String,
    },
    /// A subscription's deliveries, newest first.
    Deliveries {
        /// The subscription's id.
        id: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Send a delivery's body again, as a new delivery; prints its id.
    Replay {
        /// The subscription's id.
        id: String,
        /// The delivery's id (`webhooks deliveries ID` shows them).
        delivery: String,
    },
}

#[derive(Deserialize)]
struct Webhook {
    id: String,
    url: String,
    events: Vec<String>,
    created_by: String,
    created_at: DateTime<Utc>,
}

#[derive(Deserialize)]
struct Created {
    #[serde(flatten)]
    webhook: Webhook,
    secret: String,
}

#[derive(Deserialize)]
struct Delivery {
    id: String,
    event: String,
    #[serde(default)]
    run: Option<String>,
    state: String,
    attempts: i64,
    #[serde(default)]
    last_status: Option<i64>,
    #[serde(default)]
    last_error: Option<String>,
    #[serde(default)]
    replay_of: Option<String>,
    created_at: DateTime<Utc>,
}

pub(super) async fn webhooks(args: WebhooksArgs) -> Result<u8, ClientError> {
    let api = Api::connect(&args.conn)?;
    let json = args.conn.json;
    match args.cmd {
        WebhooksCommand::List => {
            let answer = api.get(api.project_url(&["webhooks"])?).await?;
            print_list(&answer, json, &["ID", "URL", "EVENTS", "BY", "CREATED"], "no webhooks", |w: &Webhook| {
                vec![plain(&w.id), plain(&w.url), plain(w.events.join(",")), plain(&w.created_by), plain(ago(w.created_at))]
            })
        }
        WebhooksCommand::Create { url, events } => {
            let mut body = serde_json::json!({ "url": url });
            if !events.is_empty() {
                body["events"] = events.into();
            }
            let answer = api.post(api.project_url(&["webhooks"])?, Body::Json(body)).await?;
            answer.print(json, |c: Created| {
                say!("{}", c.secret);
                eprintln!(
                    "webhook {} for {} ({}); the secret above signs each delivery (X-Shopfloor-Signature-256) and is shown this once",
                    c.webhook.id,
                    c.webhook.url,
                    c.webhook.events.join(",")
                );
            })?;
            Ok(0)
        }
        WebhooksCommand::Delete { id } => {
            api.send(Method::DELETE, api.project_url(&["webhooks", &id])?, Body::None).await?;
            if !json {
                say!("deleted webhook {id} and its deliveries");
            }
            Ok(0)
        }
        WebhooksCommand::Deliveries { id, page } => {
            let answer = api.get(page.url(api.project_url(&["webhooks", &id, "deliveries"])?)).await?;
            print_list(&answer, json, &["DELIVERY", "EVENT", "RUN", "STATE", "ATTEMPTS", "LAST", "CREATED"], "no deliveries", |d: &Delivery| {
                vec![
                    plain(&d.id),
                    plain(&d.event),
                    plain(d.run.clone().unwrap_or_default()),
                    (d.state.clone(), delivery_tint(&d.state)),
                    plain(d.attempts.to_string()),
                    plain(last_answer(d)),
                    plain(stamp(d.created_at)),
                ]
            })
        }
        WebhooksCommand::Replay { id, delivery } => {
            let answer = api.post(api.project_url(&["webhooks", &id, "deliveries", &delivery, "replay"])?, Body::None).await?;
            answer.print(json, |d: Delivery| {
                say!("{}", d.id);
                eprintln!("replay of {}: {} ({}, {})", d.replay_of.as_deref().unwrap_or(&delivery), d.id, d.event, d.state);
            })?;
            Ok(0)
        }
    }
}

fn delivery_tint(state: &str) -> Tint {
    match state {
        "delivered" => Tint::Green,
        "pending" => Tint::Yellow,
        other => status_tint(other),
    }
}

/// The receiver's last answer: its HTTP status, or why there was none.
fn last_answer(d: &Delivery) -> String {
    match (d.last_status, &d.last_error) {
        (Some(status), _) => format!("HTTP {status}"),
        (None, Some(error)) => error.clone(),
        (None, None) => String::new(),
    }
}
