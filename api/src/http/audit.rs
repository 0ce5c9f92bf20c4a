//! The audit log: who did what to which object, newest first, filtered by actor, action,
//! target and time, for the org or one project (admin).

use axum::extract::State;
use chrono::{DateTime, Utc};
use engine::ids::{OrgId, ProjectId};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::auth::Role;
use super::error::ApiError;
use super::extract::{Json, Query};
use super::tenant::{OrgScope, ProjectScope};
use super::{page, AppState};

#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct AuditEntry {
    #[sqlx(rename = "audit_id")]
    pub id: i64,
    pub at: DateTime<Utc>,
    /// `user`, `token`, `host`, `engine`, `github` or `system`.
    pub actor_kind: String,
    pub actor_id: String,
    /// `run.submit`, `approval.approve`, `member.add`, …
    pub action: String,
    pub target_kind: String,
    pub target_id: String,
    pub detail: Value,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditList {
    pub items: Vec<AuditEntry>,
    pub next_cursor: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// The actor's id, or `kind:id` (e.g. `user:0190…`, `engine:e1`).
    pub actor: Option<String>,
    /// An action (`run.cancelled`), or a prefix ending in `*` (`run.*`).
    pub action: Option<String>,
    /// The target's id, or `kind:id` (e.g. `run:run-…`).
    pub target: Option<String>,
    /// Entries at or after this time (RFC 3339).
    pub since: Option<DateTime<Utc>>,
    /// Entries before this time (RFC 3339).
    pub until: Option<DateTime<Utc>>,
    /// Page size, 1 to 200 (50 by default).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// `kind:id` or `id`. Ids may contain `:` themselves only after a kind.
fn kind_and_id(text: &str, kinds: &[&str]) -> (Option<String>, String) {
    match text.split_once(':') {
        Some((kind, id)) if kinds.contains(&kind) => (Some(kind.to_owned()), id.to_owned()),
        _ => (None, text.to_owned()),
    }
}

const ACTOR_KINDS: [&str; 6] = ["user", "token", "host", "engine", "github", "system"];
const TARGET_KINDS: [&str; 9] = ["run", "step", "workflow", "project", "org", "user", "token", "host", "repository"];

async fn read(state: &AppState, org: OrgId, project: Option<ProjectId>, q: AuditQuery) -> Result<AuditList, ApiError> {
    let limit = page::limit(q.limit)?;
    let after: Option<(i64, i64)> = page::decode(q.cursor.as_deref())?;
    let mut qb = sqlx::QueryBuilder::<sqlx::Postgres>::new(
        "SELECT audit_id, at, actor_kind, actor_id, action, target_kind, target_id, detail FROM audit_log WHERE org_id = ",
    );
    qb.push_bind(org);
    if let Some(project) = project {
        qb.push(" AND project_id = ").push_bind(project);
    }
    if let Some(actor) = &q.actor {
        let (kind, id) = kind_and_id(actor, &ACTOR_KINDS);
        qb.push(" AND actor_id = ").push_bind(id);
        if let Some(kind) = kind {
            qb.push(" AND actor_kind = ").push_bind(kind);
        }
    }
    if let Some(action) = &q.action {
        match action.strip_suffix('*') {
            Some(prefix) => {
                // A LIKE pattern with the prefix's own wildcards escaped.
                let escaped = prefix.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_");
                qb.push(" AND action LIKE ").push_bind(format!("{escaped}%"));
            }
            None => {
                qb.push(" AND action = ").push_bind(action.clone());
            }
        }
    }
    if let Some(target) = &q.target {
        let (kind, id) = kind_and_id(target, &TARGET_KINDS);
        qb.push(" AND target_id = ").push_bind(id);
        if let Some(kind) = kind {
            qb.push(" AND target_kind = ").push_bind(kind);
        }
    }
    if let Some(since) = q.since {
        qb.push(" AND at >= ").push_bind(since);
    }
    if let Some(until) = q.until {
        qb.push(" AND at < ").push_bind(until);
    }
    if let Some((micros, id)) = after {
        let at = DateTime::from_timestamp_micros(micros).ok_or_else(|| ApiError::BadRequest("invalid cursor".into()))?;
        qb.push(" AND (at, audit_id) < (").push_bind(at).push(", ").push_bind(id).push(")");
    }
    qb.push(" ORDER BY at DESC, audit_id DESC LIMIT ").push_bind(limit + 1);
    let rows: Vec<AuditEntry> = qb.build_query_as().fetch_all(&state.db).await?;
    let (items, next_cursor) = page::finish(rows, limit, |e| (e.at.timestamp_micros(), e.id));
    Ok(AuditList { items, next_cursor })
}

/// The org's audit log (admin).
#[utoipa::path(get, path = "/orgs/{org}/audit", operation_id = "list_org_audit", tag = "audit",
    params(("org" = String, Path, description = "Org slug"), AuditQuery),
    responses((status = 200, body = AuditList)))]
pub async fn org_log(State(state): State<AppState>, scope: OrgScope, Query(q): Query<AuditQuery>) -> Result<Json<AuditList>, ApiError> {
    scope.require(Role::Admin)?;
    Ok(Json(read(&state, scope.org, None, q).await?))
}

/// One project's audit log (admin).
#[utoipa::path(get, path = "/orgs/{org}/projects/{project}/audit", operation_id = "list_project_audit", tag = "audit",
    params(("org" = String, Path, description = "Org slug"), ("project" = String, Path, description = "Project slug"), AuditQuery),
    responses((status = 200, body = AuditList)))]
pub async fn project_log(State(state): State<AppState>, scope: ProjectScope, Query(q): Query<AuditQuery>) -> Result<Json<AuditList>, ApiError> {
    scope.require(Role::Admin)?;
    Ok(Json(read(&state, scope.org.org, Some(scope.project), q).await?))
}
