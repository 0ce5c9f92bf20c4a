//! One webhook delivery, in one [`Change`]: record it by its delivery id, route it to the
//! projects that connected its repository through its installation, update the items it is
//! about, judge every workflow's `on.github` trigger, and hand the matching events to the claim
//! rule (`store::triggers`). The delivery row, the items, the events, the runs with their
//! events, audit entries and wakes, and the one `NOTIFY` commit together or not at all.
//!
//! Nothing here calls GitHub: the answer depends on the payload and the database only.

use std::time::Duration;

use crate::db::Db;
use serde::Serialize;
use serde_json::{Value, json};

use super::judge::{self, Sender, Verdict};
use super::projection::{self, ItemUpdate, Patch};
use crate::store::installations::{self, Announced, Installation};
use crate::store::triggers::{self as st, Claim, DeliveryRow, ItemRow, Route, RouteAsk};
use crate::store::{Actor, Change, StoreError};

/// Events the ingest understands; any other is stored and answered all the same.
pub const EVENTS: [&str; 14] = [
    "ping",
    "issues",
    "issue_comment",
    "pull_request",
    "pull_request_review",
    "pull_request_review_comment",
    "check_run",
    "check_suite",
    "status",
    "push",
    "projects_v2_item",
    "installation",
    "installation_repositories",
    "repository",
];

/// A delivery whose signature was checked: its headers and raw body.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    /// `X-GitHub-Delivery`.
    pub id: &'a str,
    /// `X-GitHub-Event`.
    pub event: &'a str,
    pub body: &'a [u8],
}

/// What the ingest did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum IngestOutcome {
    /// The delivery id was already stored: nothing was done.
    Redelivery,
    /// Stored, with what came of it (`accepted`, `unrouted`, `unknown_event`, …) and the
    /// number of runs it opened.
    Accepted { outcome: String, runs_opened: usize },
}

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("the payload is not a JSON object: {0}")]
    Malformed(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Deadlocks and serialization failures are retried this many times: an ingest locks an
/// item's runs and then the item, and an engine re-judging the item on a run's end may take
/// them in the other order for a run created in between (rare, and PostgreSQL breaks the tie).
const RETRIES: u32 = 4;

/// Ingests one delivery.
///
/// # Errors
/// `Malformed` when the body is not a JSON object (nothing is stored); `Store` when the
/// database failed (nothing is stored: GitHub may redeliver).
pub async fn ingest(pool: &Db, delivery: &Delivery<'_>) -> Result<IngestOutcome, IngestError> {
    let mut payload: Value = serde_json::from_slice(delivery.body).map_err(|e| IngestError::Malformed(e.to_string()))?;
    if !payload.is_object() {
        return Err(IngestError::Malformed("expected an object".into()));
    }
    replace_nul(&mut payload);
    let mut attempt = 0;
    loop {
        match ingest_once(pool, delivery, &payload).await {
            Err(StoreError::Sql(e)) if attempt < RETRIES && retryable(&e) => {
                attempt += 1;
                tracing::debug!(delivery = delivery.id, attempt, error = %e, "ingest retried");
                tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt) + u64::from(rand::random::<u8>() % 10))).await;
            }
            other => return other.map_err(IngestError::from),
        }
    }
}

/// Replaces each NUL in the payload's strings and keys with U+FFFD. GitHub sends text as its
/// users typed it, and a title holding `\u0000` is valid JSON that PostgreSQL's `jsonb` refuses:
/// the delivery would fail every time it came.
fn replace_nul(value: &mut Value) {
    const NUL: char = '\0';
    match value {
        Value::String(s) if s.contains(NUL) => *s = s.replace(NUL, "\u{FFFD}"),
        Value::Array(items) => items.iter_mut().for_each(replace_nul),
        Value::Object(map) => {
            if map.keys().any(|k| k.contains(NUL)) {
                *map = std::mem::take(map).into_iter().map(|(k, v)| (k.replace(NUL, "\u{FFFD}"), v)).collect();
            }
            map.values_mut().for_each(replace_nul);
        }
        _ => {}
    }
}

fn retryable(e: &sqlx::Error) -> bool {
    matches!(e.as_database_error().and_then(|d| d.code()).as_deref(), Some("40P01" | "40001"))
}

/// What each project and workflow made of a delivery, stored as the delivery's `detail`.
#[derive(Debug, Default)]
struct Report {
    entries: Vec<Value>,
    runs_opened: usize,
}

impl Report {
    fn add(&mut self, route: &Route, item: &ItemRow, workflow: &str, result: Value) {
        self.entries.push(json!({ "project": route.project_slug, "item": item.key, "workflow": workflow, "result": result }));
    }

    fn claim(&mut self, route: &Route, item: &ItemRow, workflow: &str, claim: &Claim) {
        if matches!(claim, Claim::Opened { .. }) {
            self.runs_opened += 1;
        }
        self.add(route, item, workflow, serde_json::to_value(claim).unwrap_or(Value::Null));
    }
}

async fn ingest_once(pool: &Db, d: &Delivery<'_>, payload: &Value) -> Result<IngestOutcome, StoreError> {
    let mut ch = Change::begin(pool, Actor::Github).await?;
    // The runs this delivery opens join the trace of the caller's span (the webhook's).
    ch.set_trace(crate::trace::TraceParent::current());
    let action = payload.get("action").and_then(Value::as_str);
    let installation_id = payload.pointer("/installation/id").and_then(Value::as_i64);
    let repository = projection::repository_name(payload);
    let row = DeliveryRow { id: d.id, event: d.event, action, installation: installation_id, repository: repository.as_deref() };
    // An item's or a check's delivery is routed by the statement that records it.
    let subject = Subject::of(d.event, payload);
    let event = match action {
        Some(action) => format!("{}.{action}", d.event),
        None => d.event.to_owned(),
    };
    let ask = subject.ask(&event, default_branch(payload));
    let recorded = st::record_delivery(&mut ch, &row, ask.as_ref()).await?;
    if !recorded.fresh {
        // Dropping the change rolls back: a redelivery writes nothing.
        return Ok(IngestOutcome::Redelivery);
    }
    let (installation, routes) = (recorded.installation, recorded.routes);
    let mut report = Report::default();
    let outcome: &str = match (d.event, installation.as_ref(), installation_id) {
        (event, _, _) if !EVENTS.contains(&event) => "unknown_event",
        ("ping", _, _) => "ping",
        ("installation", known, Some(id)) => on_installation(&mut ch, payload, id, action.unwrap_or_default(), known).await?,
        ("installation_repositories", known, Some(id)) => {
            // An installation first seen here (its `installation` delivery lost or not yet
            // arrived) is announced by this one: the payload names its account.
            let inst = match known {
                Some(inst) => inst.clone(),
                None => installations::announce(&mut ch, &announced(payload, id, None)).await?,
            };
            installations::set_repositories(&mut ch, &inst, &full_names(payload, "repositories_added"), &full_names(payload, "repositories_removed")).await?;
            "installation_repositories"
        }
        ("repository", Some(inst), Some(_)) => on_repository(&mut ch, payload, inst).await?,
        (_, None, _) | (_, _, None) => "unrouted",
        (_, Some(Installation { org: None, .. }), _) => "unclaimed",
        (_, Some(inst), _) if inst.suspended || inst.deleted => "installation_inactive",
        ("projects_v2_item", Some(Installation { org: Some(org), .. }), Some(_)) => on_board(&mut ch, d, payload, *org, &mut report).await?,
        (_, Some(_), Some(_)) => match &subject {
            Subject::Other => "ignored",
            _ if routes.is_empty() => "unrouted",
            Subject::Item(update) => on_item(&mut ch, d, payload, update, &routes, &mut report).await?,
            Subject::Check(check) => on_check(&mut ch, d, payload, check, &routes, &mut report).await?,
        },
    };
    ch.finish_delivery(d.id, outcome, json!({ "claims": report.entries }));
    ch.commit().await?;
    Ok(IngestOutcome::Accepted { outcome: outcome.to_owned(), runs_opened: report.runs_opened })
}

/// The repository's default branch, as the payload's envelope says.
fn default_branch(payload: &Value) -> Option<&str> {
    payload.pointer("/repository/default_branch").and_then(Value::as_str)
}

/// The `full_name`s of a payload's list of repositories.
fn full_names(payload: &Value, key: &str) -> Vec<String> {
    payload
        .get(key)
        .and_then(Value::as_array)
        .map_or_else(Vec::new, |list| list.iter().filter_map(|r| r.get("full_name").and_then(Value::as_str)).map(str::to_owned).collect())
}

/// What an `installation` or `installation_repositories` payload says about the installation.
fn announced(payload: &Value, id: i64, repositories: Option<Vec<String>>) -> Announced {
    let text = |pointer: &str| payload.pointer(pointer).and_then(Value::as_str).map(str::to_owned);
    Announced {
        id,
        account: text("/installation/account/login").unwrap_or_default(),
        account_type: text("/installation/account/type"),
        repository_selection: text("/installation/repository_selection").or_else(|| text("/repository_selection")),
        repositories,
    }
}

/// An `installation` delivery: `created` (and `new_permissions_accepted`, `unsuspend` of an
/// installation never seen) makes it known, unclaimed until an org proves access; `deleted`,
/// `suspend` and `unsuspend` change a known one.
async fn on_installation(ch: &mut Change, payload: &Value, id: i64, action: &str, known: Option<&Installation>) -> Result<&'static str, StoreError> {
    if action == "deleted" {
        return match known {
            Some(inst) => installations::lifecycle(ch, inst, action).await,
            None => Ok("unrouted"),
        };
    }
    // `created` lists every repository the installation reaches.
    let repositories = (action == "created").then(|| full_names(payload, "repositories"));
    let inst = installations::announce(ch, &announced(payload, id, repositories)).await?;
    match action {
        "suspend" | "unsuspend" => installations::lifecycle(ch, &inst, action).await,
        _ if inst.org.is_some() => Ok("installation_active"),
        _ => Ok("installation_announced"),
    }
}

/// What an item's or a check's delivery is about, read from its payload alone: known before
/// the delivery is recorded, so that the statement recording it routes it too.
enum Subject {
    /// An issue, pull request, comment, review or push.
    Item(ItemUpdate),
    /// A check run, check suite or commit status.
    Check(Check),
    /// Anything else, or a payload without what its event needs (`ignored`).
    Other,
}

/// A check run, check suite or commit status, as its payload gives it.
struct Check {
    repository: String,
    sha: String,
    name: String,
    external_id: i64,
    status: String,
    conclusion: Option<String>,
    url: Option<String>,
}

impl Subject {
    fn of(event: &str, payload: &Value) -> Subject {
        match event {
            "issues" | "issue_comment" | "pull_request" | "pull_request_review" | "pull_request_review_comment" | "push" => {
                projection::item_update(event, payload).map_or(Subject::Other, Subject::Item)
            }
            "check_run" | "check_suite" | "status" => check_of(event, payload).map_or(Subject::Other, Subject::Check),
            _ => Subject::Other,
        }
    }

    /// What routing the delivery asks: steps watching the issue or pull request look again
    /// (`event` is the wake's reason: `pull_request.closed`); a check wakes its gates once
    /// stored (`on_check`).
    fn ask<'a>(&'a self, event: &'a str, default_branch: Option<&'a str>) -> Option<RouteAsk<'a>> {
        match self {
            Subject::Item(update) => Some(RouteAsk { repository: &update.repository, default_branch, watched: update.number.map(|n| (n, event)) }),
            Subject::Check(check) => Some(RouteAsk { repository: &check.repository, default_branch, watched: None }),
            Subject::Other => None,
        }
    }
}

fn check_of(event: &str, payload: &Value) -> Option<Check> {
    let repository = projection::repository_name(payload)?;
    let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
    let (sha, name, external_id, status, conclusion, url) = match event {
        "status" => {
            let state = s(payload.get("state")).unwrap_or_default();
            let (status, conclusion) = if state == "pending" { ("in_progress".to_owned(), None) } else { ("completed".to_owned(), Some(state)) };
            (s(payload.get("sha")), s(payload.get("context")), 0, status, conclusion, s(payload.get("target_url")))
        }
        event => {
            let check = payload.get(event)?;
            let name = s(check.get("name")).or_else(|| s(check.pointer("/app/name")));
            let status = s(check.get("status")).unwrap_or_else(|| "queued".into());
            let id = check.get("id").and_then(Value::as_i64).unwrap_or_default();
            (s(check.get("head_sha")), name, id, status, s(check.get("conclusion")), s(check.get("details_url")))
        }
    };
    Some(Check { repository, sha: sha?, name: name?, external_id, status, conclusion, url })
}

/// An issue, pull request, comment, review or push: one item, in each project that connected
/// the repository (`routes`, never empty).
async fn on_item(
    ch: &mut Change, d: &Delivery<'_>, payload: &Value, update: &ItemUpdate, routes: &[Route], report: &mut Report,
) -> Result<&'static str, StoreError> {
    let sender = Sender::of(d.event, payload);
    let trigger = judge::trigger_context(d.id, d.event, payload, &sender);
    // What a new item holds: the update applied to nothing.
    let first = projection::apply(&Value::Null, update).unwrap_or_else(|| json!({}));
    for route in routes {
        if let Some(item) = st::item_for_update(ch, route.org, route.project, &update.key(), &first, update.node_id.as_deref()).await? {
            judge_item(ch, d, route, item, update, &sender, &trigger, report).await?;
        }
    }
    Ok("accepted")
}

/// A check run, check suite or commit status: stored by head SHA for gates, and applied to the
/// pull requests whose head it is, in each project that connected the repository (`routes`,
/// never empty).
async fn on_check(
    ch: &mut Change, d: &Delivery<'_>, payload: &Value, check: &Check, routes: &[Route], report: &mut Report,
) -> Result<&'static str, StoreError> {
    let Check { repository, sha, name, external_id, status, conclusion, url } = check;
    let sender = Sender::of(d.event, payload);
    let trigger = judge::trigger_context(d.id, d.event, payload, &sender);
    let result = st::CheckResult {
        repository,
        head_sha: sha,
        name,
        source: d.event,
        external_id: *external_id,
        status,
        conclusion: conclusion.as_deref(),
        details_url: url.as_deref(),
    };
    for route in routes {
        if !st::record_check(ch, route.org, route.project, &result).await? {
            continue;
        }
        // Gates watching this commit look at their checks again.
        crate::store::github::wake_checks(ch, route.org, route.project, repository, sha).await?;
        for id in st::items_by_head(ch, route.org, route.project, repository, sha).await? {
            let Some(item) = st::lock_item(ch, route.org, id).await? else { continue };
            let update = ItemUpdate {
                repository: repository.clone(),
                number: None,
                node_id: None,
                updated_at: None,
                patches: vec![Patch::Check { head_sha: sha.clone(), name: name.clone(), status: status.clone(), conclusion: conclusion.clone() }],
            };
            judge_item(ch, d, route, item, &update, &sender, &trigger, report).await?;
        }
    }
    Ok("accepted")
}

/// A repository renamed or transferred keeps its connections under its new name; its other
/// actions (`edited`, `archived`, …) change nothing here.
async fn on_repository(ch: &mut Change, payload: &Value, inst: &Installation) -> Result<&'static str, StoreError> {
    let text = |p: &str| payload.pointer(p).and_then(Value::as_str);
    let (name, owner) = (text("/repository/name"), text("/repository/owner/login"));
    let from = match payload.get("action").and_then(Value::as_str) {
        Some("renamed") => owner.zip(text("/changes/repository/name/from")),
        Some("transferred") => text("/changes/owner/from/organization/login").or_else(|| text("/changes/owner/from/user/login")).zip(name),
        _ => None,
    };
    let (Some((from_owner, from_name)), Some(to)) = (from, text("/repository/full_name")) else { return Ok("ignored") };
    installations::rename_repository(ch, inst, &format!("{from_owner}/{from_name}"), to).await?;
    Ok("repository_renamed")
}

/// A Projects v2 card moved or edited: the board names its issue or pull request by node id.
async fn on_board(ch: &mut Change, d: &Delivery<'_>, payload: &Value, org: crate::ids::OrgId, report: &mut Report) -> Result<&'static str, StoreError> {
    let card = payload.get("projects_v2_item");
    let text = |p: &str| card.and_then(|c| c.get(p)).and_then(Value::as_str).map(str::to_owned);
    let Some(content) = text("content_node_id") else { return Ok("ignored") };
    let action = payload.get("action").and_then(Value::as_str).unwrap_or_default();
    let patch = match action {
        "deleted" => Patch::BoardRemoved { card: text("node_id").unwrap_or_default() },
        "archived" => Patch::BoardArchived { card: text("node_id").unwrap_or_default() },
        _ => {
            let change = payload.pointer("/changes/field_value");
            let field_name = change.and_then(|c| c.get("field_name")).and_then(Value::as_str);
            // Single-select options and iterations are objects; text, number and date values
            // are given as they are.
            let value = change.and_then(|c| c.get("to")).map(|to| match to {
                Value::Object(o) => o.get("name").or_else(|| o.get("title")).cloned().unwrap_or(Value::Null),
                other => other.clone(),
            });
            Patch::Board {
                project: text("project_node_id").unwrap_or_default(),
                card: text("node_id").unwrap_or_default(),
                field: field_name.zip(value).map(|(n, v)| (n.to_owned(), v)),
            }
        }
    };
    let items = st::items_by_node(ch, org, &content).await?;
    if items.is_empty() {
        return Ok("unrouted");
    }
    let sender = Sender::of(d.event, payload);
    let trigger = judge::trigger_context(d.id, d.event, payload, &sender);
    for (id, route) in &items {
        let Some(item) = st::lock_item(ch, route.org, *id).await? else { continue };
        let update = ItemUpdate { repository: String::new(), number: None, node_id: None, updated_at: None, patches: vec![patch.clone()] };
        judge_item(ch, d, route, item, &update, &sender, &trigger, report).await?;
    }
    Ok("accepted")
}

/// Applies an update to one item (locked, with its open runs; a fresh one holds it already),
/// then judges the project's workflows on it.
#[expect(clippy::too_many_arguments, reason = "one call site per event family; a struct would only rename them")]
async fn judge_item(
    ch: &mut Change, d: &Delivery<'_>, route: &Route, mut item: ItemRow, update: &ItemUpdate, sender: &Sender, trigger: &Value, report: &mut Report,
) -> Result<(), StoreError> {
    let mut changed = item.fresh;
    let mut update = update.clone();
    if update.repository.is_empty() {
        // Board and check updates name the item, not its repository: keep the stored one.
        update.repository = item.data.get("repository").and_then(Value::as_str).unwrap_or_default().to_owned();
        update.number = item.data.get("number").and_then(Value::as_i64);
    }
    if let Some(data) = projection::apply(&item.data, &update).filter(|data| !item.fresh && *data != item.data) {
        let hash = st::update_item(ch, &item, &data, update.node_id.as_deref()).await?;
        changed = item.content_hash.as_deref() != Some(hash.as_str());
        item.data = data;
        item.content_hash = Some(hash);
    }
    let repository = item.data.get("repository").and_then(Value::as_str).unwrap_or_default().to_owned();
    let number = item.data.get("number").and_then(Value::as_i64);
    let project = route.context();
    let action = trigger.get("action").and_then(Value::as_str);
    let pending = if changed && !item.fresh { st::workflows_pending_on(ch, route.org, item.item_id).await? } else { Vec::new() };
    for wf in st::github_workflows(ch, route).await? {
        let Some(t) = wf.def.on.github.clone() else { continue };
        if wf.paused {
            // A paused workflow submits nothing and revokes nothing.
            continue;
        }
        let mut claimed = false;
        if judge::names_event(&t, d.event, action) {
            if !sender.may_trigger(t.senders) {
                report.add(route, &item, &wf.name, json!({ "claim": "sender_not_trusted", "sender": sender.login }));
            } else {
                match judge::verdict(&t, &item.data, trigger, &project) {
                    Verdict::Matches => {
                        let new = st::NewEvent {
                            org: route.org,
                            project: route.project,
                            workflow: &wf,
                            item: &item,
                            repository: &repository,
                            number,
                            trigger: trigger.clone(),
                            delivery: Some(d.id),
                        };
                        let claim = st::submit_event(ch, new).await?;
                        report.claim(route, &item, &wf.name, &claim);
                        claimed = true;
                    }
                    Verdict::DoesNotMatch => report.add(route, &item, &wf.name, json!({ "claim": "not_matched" })),
                    Verdict::Failed(e) => report.add(route, &item, &wf.name, json!({ "claim": "condition_failed", "error": e })),
                }
            }
        }
        if !claimed && pending.contains(&wf.id) {
            // Judge each pending run with the trigger that opened it, on the item as it is
            // now; a failing expression keeps the run.
            let still = |t_ctx: &Value| judge::verdict(&t, &item.data, t_ctx, &project) != Verdict::DoesNotMatch;
            let revoked = st::revoke_unmatched(ch, route.org, item.item_id, wf.id, &still).await?;
            if !revoked.runs.is_empty() || revoked.events > 0 {
                report.add(route, &item, &wf.name, json!({ "claim": "revoked", "runs": revoked.runs, "events": revoked.events }));
            }
        }
    }
    Ok(())
}
