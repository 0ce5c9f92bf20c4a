//! The output executor: `output: { github: … }` steps, executed by the engine itself under a
//! lease, outside any transaction, through the GitHub App.
//!
//! A step may run twice: its engine can die after GitHub acted and before the step was
//! recorded, and recovery runs it again. Every output is therefore idempotent:
//!
//! - `pull_request`: an open pull request from the run's branch is looked for first and reused;
//!   only when there is none is one opened (a 422 "already exists" from a race is answered by
//!   looking again). The body's first line is `Closes #<n>`, then the node's `body` template or
//!   the latest crew step's text. The branch is the crew step's `branch`, else
//!   `shopfloor/<n>-<slug of the title>`.
//! - `comment`: the body ends with a hidden marker, `<!-- shopfloor:<run>:<node> -->` (with
//!   `:<visit>` after a loop), and the item's comments are searched for it before posting.
//! - `label`: labels are added and removed, which GitHub does idempotently (removing one that
//!   is gone is not an error).
//! - `board_move`: the item's Projects v2 card gets its `Status` set to the column, with the
//!   narrow GraphQL queries (one page of the item's cards with the Status field's options,
//!   then one mutation). Setting a value twice is harmless.
//!
//! Failures: a 4xx fails the step for good (`github:<status>`, never retried); a rate limit
//! defers it (`deferred:rate_limited`) until GitHub's time; an outage (5xx, timeouts, after
//! the client's retries) defers it (`deferred:github_unavailable`) rather than failing it.
//!
//! **Test hook:** with `crash_after` set (`SHOPFLOOR_TEST_CRASH_AFTER=pr_opened` or
//! `comment_posted`), the process aborts right after GitHub opened the pull request or posted
//! the comment, before the step is recorded: the crash the idempotency above is for.
//!
//! # An output reaches GitHub
//!
//! 1. A run reaches `open_pr: { output: { github: pull_request } }`. `advance` creates the step
//!    and, on an engine with the GitHub App configured, leases it to itself and starts it
//!    (`lease_and_start`: 30 s lease, one `lease_expiry` wake) in the same commit.
//! 2. After commit, the pool runs `OutputExecutor::execute` outside any transaction, renewing
//!    the lease every 10 s. It reads the run, the node, the item, the repository's installation
//!    and the succeeded steps' outputs on one pooled connection, and returns it.
//! 3. `GithubApp::for_repository` hands out a client with an installation token scoped to the
//!    repository: cached, or minted with the App's JWT (`POST /app/installations/{id}/access_tokens`).
//! 4. The executor looks for an open pull request from `shopfloor/<n>-<slug>` (or the crew step's
//!    `branch`); finding one, it takes it. Otherwise it opens one whose body starts `Closes #<n>`.
//! 5. The result is recorded fenced by holder (`succeed_held`). If the engine died between 4 and
//!    5, the lease lapses, recovery fails the step `lease_expired` (infrastructure), the walker
//!    starts attempt 2, and step 4 finds the pull request: still exactly one.
//! 6. A 4xx ends the step `github:<status>` (final, never retried). A rate limit or an outage
//!    gives the step back (`defer_held`: `running → pending`, reason `deferred:rate_limited` or
//!    `deferred:github_unavailable`, same attempt) with an `execute` wake for GitHub's time.

use std::sync::Arc;
use std::time::Duration;

use crate::db::Db;
use serde_json::{Map, Value, json};

use super::client::{CallError, GithubApp, RepoClient, Scope, Verb, with_retries};
use crate::advance::ToExecute;
use crate::catalog::Catalog;
use crate::definition::{NodeKind, Output, OutputKind};
use crate::hosts::issue_branch;
use crate::store::steps::{Failure, FailureClass};

/// How long an output waits after GitHub was unavailable through all the client's retries.
pub const OUTAGE_DEFERRAL: Duration = Duration::from_secs(30);

/// What executing a step came to.
#[derive(Debug, Clone)]
pub enum Executed {
    Succeeded(Value),
    Failed(Failure),
    /// Give the step back until `delay` has passed (`reason` is `deferred:<why>`).
    Deferred {
        reason: String,
        delay: Duration,
    },
}

impl From<Result<Value, Failure>> for Executed {
    fn from(r: Result<Value, Failure>) -> Executed {
        match r {
            Ok(v) => Executed::Succeeded(v),
            Err(f) => Executed::Failed(f),
        }
    }
}

/// Executes output steps through a GitHub App.
#[derive(Debug, Clone)]
pub struct OutputExecutor {
    app: Arc<GithubApp>,
    /// The test hook (see the module documentation).
    crash_after: Option<String>,
}

/// Everything an output needs, read before GitHub is called (no connection is held while it is).
struct Ctx {
    run: String,
    node: String,
    visit: i32,
    output: Output,
    repository: String,
    number: Option<i64>,
    node_id: Option<String>,
    item: Value,
    installation: i64,
    default_branch: String,
    /// The template context: `run`, `input`, `item`, `nodes.<id>.output`.
    template: Value,
    /// The latest crew step's output.
    crew: Value,
}

fn failure(reason: impl Into<String>, class: FailureClass) -> Executed {
    Executed::Failed(Failure::new(reason, class))
}

impl From<CallError> for Executed {
    fn from(e: CallError) -> Executed {
        match e {
            CallError::Client { status, message } => {
                tracing::warn!(github.status = status, github.message = message, "github refused an output");
                failure(format!("github:{status}"), FailureClass::Final)
            }
            CallError::RateLimited(delay) => Executed::Deferred { reason: "deferred:rate_limited".into(), delay },
            CallError::Unavailable(why) => {
                tracing::warn!(why, "github unavailable; output deferred");
                Executed::Deferred { reason: "deferred:github_unavailable".into(), delay: OUTAGE_DEFERRAL }
            }
            CallError::Config(why) => {
                tracing::error!(why, "github app misconfigured");
                failure("github:app_config", FailureClass::Infrastructure)
            }
        }
    }
}

impl OutputExecutor {
    pub fn new(app: Arc<GithubApp>, crash_after: Option<String>) -> OutputExecutor {
        OutputExecutor { app, crash_after }
    }

    /// Executes one leased output step.
    pub async fn execute(&self, db: &Db, catalog: &Catalog, job: &ToExecute) -> Executed {
        let ctx = match load(db, catalog, job).await {
            Ok(Ok(ctx)) => ctx,
            Ok(Err(refused)) => return refused,
            Err(e) => return failure(crate::store::cap(&format!("engine_error: {e}")), FailureClass::Infrastructure),
        };
        let scope = match ctx.output.kind {
            OutputKind::PullRequest => Scope::PullRequest,
            OutputKind::Comment | OutputKind::Label => Scope::Issues,
            OutputKind::BoardMove => Scope::Board,
        };
        let mut done = self.output(&ctx, scope).await;
        if matches!(done, Err(Step::Call(CallError::Client { status: 401, .. }))) {
            // GitHub no longer takes the cached token (revoked, or expired before this
            // process's clock says): once more with a new one.
            self.app.forget_token(ctx.installation, &ctx.repository, scope).await;
            done = self.output(&ctx, scope).await;
        }
        match done {
            Ok(output) => Executed::Succeeded(output),
            Err(Step::Call(e)) => e.into(),
            Err(Step::Refused(reason)) => failure(reason, FailureClass::Final),
        }
    }

    async fn output(&self, ctx: &Ctx, scope: Scope) -> Result<Value, Step> {
        let client = self.app.for_repository(ctx.installation, &ctx.repository, scope).await?;
        match ctx.output.kind {
            OutputKind::PullRequest => self.pull_request(&client, ctx).await,
            OutputKind::Comment => self.comment(&client, ctx).await,
            OutputKind::Label => labels(&client, ctx).await,
            OutputKind::BoardMove => board_move(&client, ctx).await,
        }
    }

    fn crash_point(&self, point: &str) {
        if self.crash_after.as_deref().is_some_and(|c| c.split(',').any(|c| c.trim() == point)) {
            tracing::error!(point, "SHOPFLOOR_TEST_CRASH_AFTER: aborting the process (test hook)");
            std::process::abort();
        }
    }

    async fn pull_request(&self, client: &RepoClient, ctx: &Ctx) -> Result<Value, Step> {
        let number = ctx.number.ok_or_else(|| Step::Refused("output:no_item".into()))?;
        let title = ctx.item.get("title").and_then(Value::as_str).unwrap_or("shopfloor").to_owned();
        let branch = ctx.crew.get("branch").and_then(Value::as_str).map_or_else(|| issue_branch(number, &title), str::to_owned);
        let owner = ctx.repository.split('/').next().unwrap_or_default().to_owned();
        if let Some(pr) = open_pull(client, &ctx.repository, &owner, &branch).await? {
            return Ok(pr_output(&ctx.repository, &pr, false));
        }
        let text = match &ctx.output.body {
            Some(tpl) => {
                crate::definition::template::render(tpl, &ctx.template).map_err(|e| Step::Refused(crate::store::cap(&format!("output:template: {e}"))))?
            }
            None => ctx.crew.get("text").and_then(Value::as_str).unwrap_or_default().to_owned(),
        };
        let body = json!({
            "title": title,
            "head": branch,
            "base": ctx.default_branch,
            "body": format!("Closes #{number}\n\n{text}"),
            "draft": ctx.output.draft,
        });
        match client.rest(Verb::Post, &format!("/repos/{}/pulls", ctx.repository), Some(&body)).await {
            Ok(answer) => {
                self.crash_point("pr_opened");
                Ok(pr_output(&ctx.repository, &answer.body, true))
            }
            // Opened meanwhile (another attempt, or our own before a crash): take that one.
            Err(CallError::Client { status: 422, message }) => match open_pull(client, &ctx.repository, &owner, &branch).await? {
                Some(pr) => Ok(pr_output(&ctx.repository, &pr, false)),
                None => Err(Step::Call(CallError::Client { status: 422, message })),
            },
            Err(e) => Err(Step::Call(e)),
        }
    }

    async fn comment(&self, client: &RepoClient, ctx: &Ctx) -> Result<Value, Step> {
        let number = ctx.number.ok_or_else(|| Step::Refused("output:no_item".into()))?;
        let marker = if ctx.visit > 1 {
            format!("<!-- shopfloor:{}:{}:{} -->", ctx.run, ctx.node, ctx.visit)
        } else {
            format!("<!-- shopfloor:{}:{} -->", ctx.run, ctx.node)
        };
        let text = match &ctx.output.body {
            Some(tpl) => {
                crate::definition::template::render(tpl, &ctx.template).map_err(|e| Step::Refused(crate::store::cap(&format!("output:template: {e}"))))?
            }
            None => String::new(),
        };
        let body = json!({ "body": format!("{text}\n\n{marker}") });
        let path = format!("/repos/{}/issues/{number}/comments", ctx.repository);
        // A POST that timed out or met a 5xx may have been made all the same: each try looks
        // for the marker first, so the comment is made once (and found after a crash).
        let (repository, marker, path, body) = (&ctx.repository, &marker, &path, &body);
        let (comment, created) = with_retries(client.backoff(), path, || async move {
            if let Some(found) = find_comment(client, repository, number, marker).await? {
                return Ok((found, false));
            }
            Ok((client.rest_once(Verb::Post, path, Some(body)).await?.body, true))
        })
        .await?;
        if created {
            self.crash_point("comment_posted");
        }
        Ok(comment_output(&comment, created))
    }
}

/// The comment on issue `number` that carries `marker`, if one was made. Tried once: its caller
/// retries the look and what follows it together.
async fn find_comment(client: &RepoClient, repository: &str, number: i64, marker: &str) -> Result<Option<Value>, CallError> {
    for page in 1..=50 {
        let path = format!("/repos/{repository}/issues/{number}/comments?per_page=100&page={page}");
        let answer = client.rest_once(Verb::Get, &path, None).await?;
        let list = answer.body.as_array().cloned().unwrap_or_default();
        if let Some(found) = list.iter().find(|c| c.get("body").and_then(Value::as_str).is_some_and(|b| b.contains(marker))) {
            return Ok(Some(found.clone()));
        }
        // A page shorter than asked for is the last; the bound keeps a bad answer from looping.
        if list.len() < 100 {
            break;
        }
    }
    Ok(None)
}

/// An output's failure before it is classified.
enum Step {
    Call(CallError),
    /// The output cannot be done as defined (no item to act on, a template that fails).
    Refused(String),
}

impl From<CallError> for Step {
    fn from(e: CallError) -> Step {
        Step::Call(e)
    }
}

/// Percent-encodes a path segment (RFC 3986 unreserved characters stay).
fn encode(s: &str) -> String {
    encode_keeping(s, b"-._~")
}

/// Percent-encodes a query value; `/` may stay there.
fn encode_query(s: &str) -> String {
    encode_keeping(s, b"-._~/")
}

fn encode_keeping(s: &str, keep: &[u8]) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || keep.contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

async fn open_pull(client: &RepoClient, repository: &str, owner: &str, branch: &str) -> Result<Option<Value>, CallError> {
    let path = format!("/repos/{repository}/pulls?state=open&head={}&per_page=100", encode_query(&format!("{owner}:{branch}")));
    let answer = client.rest(Verb::Get, &path, None).await?;
    // The head filter is GitHub's; check the branch anyway, a wrong match would be worse.
    Ok(answer.body.as_array().and_then(|l| l.iter().find(|p| p.pointer("/head/ref").and_then(Value::as_str) == Some(branch)).cloned()))
}

fn pr_output(repository: &str, pr: &Value, created: bool) -> Value {
    json!({
        "pull_request": {
            "repository": repository,
            "number": pr.get("number"),
            "url": pr.get("html_url"),
            "node_id": pr.get("node_id"),
            "head_sha": pr.pointer("/head/sha"),
            "branch": pr.pointer("/head/ref"),
        },
        "created": created,
    })
}

fn comment_output(c: &Value, created: bool) -> Value {
    json!({ "comment": { "id": c.get("id"), "url": c.get("html_url") }, "created": created })
}

async fn labels(client: &RepoClient, ctx: &Ctx) -> Result<Value, Step> {
    let number = ctx.number.ok_or_else(|| Step::Refused("output:no_item".into()))?;
    if !ctx.output.labels.is_empty() {
        let body = json!({ "labels": ctx.output.labels });
        client.rest(Verb::Post, &format!("/repos/{}/issues/{number}/labels", ctx.repository), Some(&body)).await?;
    }
    for name in &ctx.output.remove_labels {
        match client.rest(Verb::Delete, &format!("/repos/{}/issues/{number}/labels/{}", ctx.repository, encode(name)), None).await {
            // Already gone: removing is idempotent.
            Ok(_) | Err(CallError::Client { status: 404, .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(json!({ "labels": { "added": ctx.output.labels, "removed": ctx.output.remove_labels } }))
}

/// The item's cards with each board's Status field: one page, the narrow query.
const CARDS: &str = "query($id: ID!) { node(id: $id) { \
  ... on Issue { projectItems(first: 20) { nodes { id project { id field(name: \"Status\") { ... on ProjectV2SingleSelectField { id options { id name } } } } } } } \
  ... on PullRequest { projectItems(first: 20) { nodes { id project { id field(name: \"Status\") { ... on ProjectV2SingleSelectField { id options { id name } } } } } } } } }";

const MOVE: &str = "mutation($project: ID!, $item: ID!, $field: ID!, $option: String!) { \
  updateProjectV2ItemFieldValue(input: { projectId: $project, itemId: $item, fieldId: $field, value: { singleSelectOptionId: $option } }) { projectV2Item { id } } }";

async fn board_move(client: &RepoClient, ctx: &Ctx) -> Result<Value, Step> {
    let column = ctx.output.column.clone().unwrap_or_default();
    let node_id = ctx.node_id.clone().ok_or_else(|| Step::Refused("board:no_item".into()))?;
    let data = client.graphql(CARDS, &json!({ "id": node_id })).await?;
    // Cards on boards the installation cannot see come back without their project: skipped.
    let cards: Vec<Value> = data
        .pointer("/node/projectItems/nodes")
        .and_then(Value::as_array)
        .map(|nodes| nodes.iter().filter(|c| c.pointer("/project/id").is_some_and(Value::is_string)).cloned().collect())
        .unwrap_or_default();
    // The board the webhooks last saw the card on, else the first one.
    let known = ctx.item.pointer("/board/project").and_then(Value::as_str);
    let card = cards
        .iter()
        .find(|c| known.is_some() && c.pointer("/project/id").and_then(Value::as_str) == known)
        .or_else(|| cards.first())
        .ok_or_else(|| Step::Refused("board:not_on_board".into()))?;
    let (Some(card_id), Some(project), Some(field)) = (
        card.get("id").and_then(Value::as_str),
        card.pointer("/project/id").and_then(Value::as_str),
        card.pointer("/project/field/id").and_then(Value::as_str),
    ) else {
        return Err(Step::Refused("board:no_status_field".into()));
    };
    let options = card.pointer("/project/field/options").and_then(Value::as_array).cloned().unwrap_or_default();
    let option = options
        .iter()
        .find(|o| o.get("name").and_then(Value::as_str).is_some_and(|n| n.eq_ignore_ascii_case(&column)))
        .and_then(|o| o.get("id").and_then(Value::as_str))
        .ok_or_else(|| Step::Refused(crate::store::cap(&format!("board:no_column:{column}"))))?;
    let moved = client.graphql(MOVE, &json!({ "project": project, "item": card_id, "field": field, "option": option })).await?;
    if moved.pointer("/updateProjectV2ItemFieldValue/projectV2Item/id").is_none_or(Value::is_null) {
        return Err(Step::Call(CallError::Client { status: 200, message: "the board did not take the move".into() }));
    }
    Ok(json!({ "board": { "project": project, "card": card_id, "column": column } }))
}

/// Reads what the step needs. `Ok(Err(_))`: the output cannot be done (final).
async fn load(db: &Db, catalog: &Catalog, job: &ToExecute) -> Result<Result<Ctx, Executed>, sqlx::Error> {
    let mut conn = db.begin().await?;
    let run: Option<(crate::ids::WorkflowId, i32, Option<crate::ids::ItemId>, crate::ids::ProjectId, Value)> =
        sqlx::query_as("SELECT workflow_id, workflow_version, item_id, project_id, input FROM runs WHERE run_id = $1 AND org_id = $2")
            .bind(job.run)
            .bind(job.org)
            .fetch_optional(&mut *conn)
            .await?;
    let Some((workflow, version, item_id, project, input)) = run else { return Ok(Err(failure("output:no_run", FailureClass::Final))) };
    let def = match catalog.get(&mut conn, workflow, version).await {
        Ok(d) => d,
        Err(e) => return Ok(Err(failure(crate::store::cap(&format!("engine_error: {e}")), FailureClass::Infrastructure))),
    };
    let Some(NodeKind::Output(output)) = def.node(&job.node).map(|n| n.kind.clone()) else {
        return Ok(Err(failure("output:not_an_output", FailureClass::Final)));
    };
    let item: Option<(Value, Option<String>)> = match item_id {
        Some(id) => {
            sqlx::query_as("SELECT data, node_id FROM items WHERE item_id = $1 AND org_id = $2").bind(id).bind(job.org).fetch_optional(&mut *conn).await?
        }
        None => None,
    };
    let (item, node_id) = item.unwrap_or((Value::Null, None));
    let Some(repository) = item.get("repository").and_then(Value::as_str).map(str::to_owned) else {
        return Ok(Err(failure("output:no_repository", FailureClass::Final)));
    };
    let repo: Option<(Option<i64>, String)> =
        sqlx::query_as("SELECT installation_id, default_branch FROM repositories WHERE project_id = $1 AND full_name = $2 AND org_id = $3")
            .bind(project)
            .bind(&repository)
            .bind(job.org)
            .fetch_optional(&mut *conn)
            .await?;
    let Some((Some(installation), default_branch)) = repo else {
        return Ok(Err(failure("github:not_connected", FailureClass::Final)));
    };
    let steps: Vec<(String, String, Option<Value>)> =
        sqlx::query_as("SELECT node, kind, output FROM steps WHERE run_id = $1 AND org_id = $2 AND state = 'succeeded' ORDER BY started_seq")
            .bind(job.run)
            .bind(job.org)
            .fetch_all(&mut *conn)
            .await?;
    drop(conn);
    let mut nodes = Map::new();
    let mut crew = Value::Null;
    for (node, kind, out) in steps {
        let out = out.unwrap_or(Value::Null);
        if kind == "crew" {
            crew = out.clone();
        }
        nodes.insert(node, json!({ "output": out }));
    }
    let template = json!({ "run": { "id": job.run.to_string(), "input": input }, "input": input, "item": item, "nodes": nodes });
    Ok(Ok(Ctx {
        run: job.run.to_string(),
        node: job.node.clone(),
        visit: job.visit,
        output,
        number: item.get("number").and_then(Value::as_i64),
        repository,
        node_id,
        item,
        installation,
        default_branch,
        template,
        crew,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(encode("acme:shopfloor/1-fix"), "acme%3Ashopfloor%2F1-fix");
        assert_eq!(encode_query("acme:shopfloor/1-fix"), "acme%3Ashopfloor/1-fix");
        assert_eq!(encode("good first issue"), "good%20first%20issue");
    }
}
