//! Outgoing webhooks of a project (admin): subscriptions (a URL, a secret, event filters),
//! their delivery log with each attempt's answer, and replaying a delivery. Deliveries are
//! signed with `X-Shopfloor-Signature-256: sha256=<HMAC-SHA256 of the body>` and retried with
//! backoff (`engine::jobs`). The secret is shown once, when the subscription is made. A URL
//! must point outside the server's network (`engine::net_guard`): it is refused here with 422
//! otherwise, and checked again by the engine at each send, after resolution.

use axum::extract::State;
use axum::http::StatusCode;
use engine::store::webhooks_out::{self as store, Attempt, Delivery, Subscription};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::AppState;
use super::auth::Role;
use super::error::ApiError;
use super::extract::{Json, Path, Query};
use super::page::{self, PageQuery};
use super::tenant::ProjectScope;

/// A new subscription, with its secret (shown only now).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CreatedWebhook {
    #[serde(flatten)]
    pub webhook: Subscription,
    /// Signs every delivery: `X-Shopfloor-Signature-256: sha256=<hex HMAC-SHA256 of the body>`.
    pub secret: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WebhookList {
    pub items: Vec<Subscription>,
}

/// An event filter: an event type (`run.failed`), a prefix of them (`run.*`) or `*`.
#[derive(ToSchema)]
#[schema(pattern = "^([a-z._]{1,99}\\*?|\\*)$")]
#[expect(dead_code, reason = "the document's name for a filter; bodies carry it as text")]
pub struct EventFilter(String);

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWebhook {
    /// An `http://` or `https://` URL that receives a `POST` per event, with no user name or
    /// password. It must reach a public address: loopback, private, link-local, carrier-grade
    /// NAT, multicast, reserved and cloud metadata addresses (in any spelling) and local names
    /// are refused with 422, unless the server allows private targets
    /// (`SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE`). A name is checked again after resolution at each
    /// send.
    #[schema(max_length = 2048, pattern = "^https?://[A-Za-z][A-Za-z0-9-]*(\\.[A-Za-z][A-Za-z0-9-]*)*(:[0-9]{1,4})?([/?#][^\\s\\x00-\\x1f\\x7f-\\x9f]*)?$")]
    pub url: String,
    /// Event filters (`run.*` by default): lifecycle events `run.started`, `run.awaiting`,
    /// `run.wait_expired`, `run.wait_withdrawn`, `run.held`, `run.admitted`, `run.completed`,
    /// `run.failed`, `run.cancelled`, and `step.*`; 1 to 50 of them.
    #[schema(value_type = Option<Vec<EventFilter>>, min_items = 1, max_items = 50)]
    pub events: Option<Vec<String>>,
    /// 16 to 256 characters; one is made when absent.
    #[schema(min_length = 16, max_length = 256)]
    pub secret: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeliveryDetail {
    #[serde(flatten)]
    pub delivery: Delivery,
    /// The body sent (rendered at the first attempt).
    pub body: Option<serde_json::Value>,
    pub attempts_log: Vec<Attempt>,
}

page::list!(DeliveryList of Delivery);

/// The path of a subscription's routes.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct WebhookPath {
    /// Webhook id
    webhook: String,
}

/// The path of a delivery's routes.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct DeliveryPath {
    /// Webhook id
    webhook: String,
    /// Delivery id
    delivery: String,
}

fn not_found(what: &str) -> ApiError {
    ApiError::NotFound(format!("{what} not found"))
}

const SUBSCRIPTION_BY_ID: &str =
    "SELECT subscription_id, url, events, created_by, created_at FROM webhook_subscriptions WHERE org_id = $1 AND project_id = $2 AND subscription_id = $3";

/// The subscription named by the path, in this project.
async fn subscription(state: &AppState, scope: &ProjectScope, id: &str) -> Result<Subscription, ApiError> {
    let id: Uuid = id.parse().map_err(|_| not_found("webhook"))?;
    let row: Option<Subscription> = sqlx::query_as(SUBSCRIPTION_BY_ID).bind(scope.org.org).bind(scope.project).bind(id).fetch_optional(&state.db).await?;
    row.ok_or_else(|| not_found("webhook"))
}

const SUBSCRIPTIONS: &str = "SELECT subscription_id, url, events, created_by, created_at FROM webhook_subscriptions WHERE org_id = $1 AND project_id = $2 \
     ORDER BY created_at, subscription_id LIMIT 200";

/// The project's outgoing webhooks (admin).
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/webhooks", operation_id = "list_webhooks", tag = "webhooks",
    params(ProjectScope),
    responses((status = 200, body = WebhookList)))]
pub async fn list(State(state): State<AppState>, scope: ProjectScope) -> Result<Json<WebhookList>, ApiError> {
    scope.require(Role::Admin)?;
    let items: Vec<Subscription> = sqlx::query_as(SUBSCRIPTIONS).bind(scope.org.org).bind(scope.project).fetch_all(&state.db).await?;
    Ok(Json(WebhookList { items }))
}

/// Subscribes a URL to the project's events (admin). The answer carries the secret that signs
/// deliveries; it is not shown again.
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/webhooks", operation_id = "create_webhook", tag = "webhooks",
    params(ProjectScope),
    request_body = CreateWebhook,
    responses((status = 201, body = CreatedWebhook)))]
pub async fn create(
    State(state): State<AppState>, scope: ProjectScope, Json(body): Json<CreateWebhook>,
) -> Result<(StatusCode, Json<CreatedWebhook>), ApiError> {
    scope.require(Role::Admin)?;
    let events = body.events.unwrap_or_else(|| vec!["run.*".to_owned()]);
    let mut ch = scope.change(&state).await?;
    let new = store::NewSubscription { org: scope.org.org, project: scope.project, url: body.url.trim(), secret: body.secret.as_deref(), events: &events };
    let (id, secret) = store::create(&mut ch, state.secret_key(), new, state.webhook_policy()).await?;
    ch.commit().await?;
    let webhook = subscription(&state, &scope, &id.to_string()).await?;
    Ok((StatusCode::CREATED, Json(CreatedWebhook { webhook, secret })))
}

/// Removes a subscription and its delivery log (admin).
#[utoipa::path(delete, path = "/orgs/{org}/projects/{project}/webhooks/{webhook}", operation_id = "delete_webhook", tag = "webhooks",
    params(ProjectScope, WebhookPath),
    responses((status = 204, description = "Removed")))]
pub async fn delete(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<WebhookPath>) -> Result<StatusCode, ApiError> {
    scope.require(Role::Admin)?;
    let webhook = subscription(&state, &scope, &p.webhook).await?;
    let mut ch = scope.change(&state).await?;
    store::delete(&mut ch, scope.org.org, scope.project, webhook.subscription_id).await?;
    ch.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The subscription's deliveries, newest first (admin).
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/webhooks/{webhook}/deliveries", operation_id = "list_webhook_deliveries", tag = "webhooks",
    params(ProjectScope, WebhookPath, PageQuery),
    responses((status = 200, body = DeliveryList)))]
pub async fn deliveries(
    State(state): State<AppState>, scope: ProjectScope, Path(p): Path<WebhookPath>, Query(q): Query<PageQuery>,
) -> Result<Json<DeliveryList>, ApiError> {
    scope.require(Role::Admin)?;
    let webhook = subscription(&state, &scope, &p.webhook).await?;
    let (limit, after) = q.start::<(i64, Uuid)>()?;
    let mut qb = sqlx::QueryBuilder::<sqlx::Postgres>::new(format!("SELECT {} FROM webhook_deliveries WHERE org_id = ", store::DELIVERY_COLUMNS));
    qb.push_bind(scope.org.org).push(" AND subscription_id = ").push_bind(webhook.subscription_id);
    page::newest_first(&mut qb, "delivery_id", after, limit)?;
    let rows: Vec<Delivery> = qb.build_query_as().fetch_all(&state.db).await?;
    Ok(Json(DeliveryList::page(rows, limit, |d| page::newest_key(d.created_at, d.delivery_id))))
}

async fn find_delivery(state: &AppState, scope: &ProjectScope, p: &DeliveryPath) -> Result<(Subscription, Delivery, Option<serde_json::Value>), ApiError> {
    let webhook = subscription(state, scope, &p.webhook).await?;
    let id: Uuid = p.delivery.parse().map_err(|_| not_found("delivery"))?;
    let row: Option<(Delivery, Option<serde_json::Value>)> = sqlx::query_as::<_, DeliveryWithBody>(&format!(
        "SELECT {}, body FROM webhook_deliveries WHERE org_id = $1 AND subscription_id = $2 AND delivery_id = $3",
        store::DELIVERY_COLUMNS
    ))
    .bind(scope.org.org)
    .bind(webhook.subscription_id)
    .bind(id)
    .fetch_optional(&state.db)
    .await?
    .map(|d| (d.delivery, d.body));
    let (delivery, body) = row.ok_or_else(|| not_found("delivery"))?;
    Ok((webhook, delivery, body))
}

#[derive(sqlx::FromRow)]
struct DeliveryWithBody {
    #[sqlx(flatten)]
    delivery: Delivery,
    body: Option<serde_json::Value>,
}

const DELIVERY_ATTEMPTS: &str =
    "SELECT attempt, at, status, response, error, duration_ms FROM webhook_attempts WHERE org_id = $1 AND delivery_id = $2 ORDER BY attempt";

/// One delivery with its body and every attempt (admin).
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/webhooks/{webhook}/deliveries/{delivery}", operation_id = "get_webhook_delivery", tag = "webhooks",
    params(ProjectScope, DeliveryPath),
    responses((status = 200, body = DeliveryDetail)))]
pub async fn delivery(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<DeliveryPath>) -> Result<Json<DeliveryDetail>, ApiError> {
    scope.require(Role::Admin)?;
    let (_, delivery, body) = find_delivery(&state, &scope, &p).await?;
    let attempts_log: Vec<Attempt> = sqlx::query_as(DELIVERY_ATTEMPTS).bind(scope.org.org).bind(delivery.delivery_id).fetch_all(&state.db).await?;
    Ok(Json(DeliveryDetail { delivery, body, attempts_log }))
}

/// Sends a delivery's body again, as a new delivery (admin).
#[utoipa::path(post, path = "/orgs/{org}/projects/{project}/webhooks/{webhook}/deliveries/{delivery}/replay", operation_id = "replay_webhook_delivery", tag = "webhooks",
    params(ProjectScope, DeliveryPath),
    responses((status = 201, body = Delivery)))]
pub async fn replay(State(state): State<AppState>, scope: ProjectScope, Path(p): Path<DeliveryPath>) -> Result<(StatusCode, Json<Delivery>), ApiError> {
    scope.require(Role::Admin)?;
    let (_, delivery, _) = find_delivery(&state, &scope, &p).await?;
    let mut ch = scope.change(&state).await?;
    let id = store::replay(&mut ch, scope.org.org, scope.project, delivery.delivery_id).await?;
    let made: Delivery =
        sqlx::query_as(&format!("SELECT {} FROM webhook_deliveries WHERE delivery_id = $1", store::DELIVERY_COLUMNS)).bind(id).fetch_one(ch.conn()).await?;
    ch.commit().await?;
    Ok((StatusCode::CREATED, Json(made)))
}
