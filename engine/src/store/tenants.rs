//! Orgs, users, memberships, projects and API token records (signing keys: `signing_keys`).

use chrono::{DateTime, Utc};
use serde_json::json;

use super::{Change, Result, StoreError};
use crate::ids::{HostId, OrgId, ProjectId, Slug, UserId};

const INSERT_ORG: &str = "INSERT INTO orgs (org_id, slug, name) VALUES ($1, $2, $3) ON CONFLICT (slug) DO NOTHING";

/// Creates an org with its first owner. A taken slug is a conflict.
pub async fn create_org(ch: &mut Change, slug: &Slug, name: &str, owner_email: &str) -> Result<(OrgId, UserId)> {
    let email = owner_email.trim();
    if !email.contains('@') || email.len() > 254 {
        return Err(StoreError::Invalid(format!("`{email}` is not an email address")));
    }
    let org = OrgId::mint();
    let inserted = sqlx::query(INSERT_ORG).bind(org).bind(slug.as_str()).bind(name).execute(&mut *ch.tx).await?;
    if inserted.rows_affected() == 0 {
        return Err(StoreError::Conflict(format!("an org with slug `{slug}` already exists")));
    }
    let (user, _) = add_membership(ch, org, email, "owner").await?;
    ch.audit(org, None, "org.create", ("org", slug.to_string()), json!({ "owner": email }))?;
    Ok((org, user))
}

const INSERT_MEMBERSHIP: &str = "INSERT INTO memberships (org_id, user_id, role) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";

/// Makes `email` a member of `org` with `role`, and says whether it was not one already. The
/// same email may have been a member before: its user row is kept and reused.
pub(crate) async fn add_membership(ch: &mut Change, org: OrgId, email: &str, role: &str) -> Result<(UserId, bool)> {
    let user: UserId = sqlx::query_scalar(
        "INSERT INTO users (org_id, user_id, email) VALUES ($1, $2, $3) \
         ON CONFLICT (org_id, email) DO UPDATE SET email = EXCLUDED.email RETURNING user_id",
    )
    .bind(org)
    .bind(UserId::mint())
    .bind(email)
    .fetch_one(&mut *ch.tx)
    .await?;
    let inserted = sqlx::query(INSERT_MEMBERSHIP).bind(org).bind(user).bind(role).execute(&mut *ch.tx).await?;
    Ok((user, inserted.rows_affected() == 1))
}

/// Finds an org by slug.
pub async fn org_by_slug(ch: &mut Change, slug: &str) -> Result<Option<OrgId>> {
    Ok(sqlx::query_scalar("SELECT org_id FROM orgs WHERE slug = $1").bind(slug).fetch_optional(&mut *ch.tx).await?)
}

const INSERT_PROJECT: &str = "INSERT INTO projects (org_id, project_id, slug, name) VALUES ($1, $2, $3, $4) ON CONFLICT (org_id, slug) DO NOTHING";

pub async fn create_project(ch: &mut Change, org: OrgId, slug: &Slug, name: &str) -> Result<ProjectId> {
    let project = ProjectId::mint();
    let inserted = sqlx::query(INSERT_PROJECT).bind(org).bind(project).bind(slug.as_str()).bind(name).execute(&mut *ch.tx).await?;
    if inserted.rows_affected() == 0 {
        return Err(StoreError::Conflict(format!("a project with slug `{slug}` already exists in this org")));
    }
    ch.audit(org, Some(project), "project.create", ("project", slug.to_string()), json!({}))?;
    super::retention::start(ch, org, project).await?;
    Ok(project)
}

/// An API token's record; the signed token itself is never stored.
#[derive(Debug, Clone)]
pub struct TokenRecord {
    pub jti: uuid::Uuid,
    pub org: OrgId,
    pub kind: &'static str,
    pub user: Option<UserId>,
    pub host: Option<HostId>,
    pub project: Option<ProjectId>,
    pub role: &'static str,
    pub name: String,
    pub kid: String,
    pub expires_at: DateTime<Utc>,
    /// For a console session made by pasting a token: that token, whose revocation ends it.
    pub issued_from: Option<uuid::Uuid>,
}

pub async fn insert_token(ch: &mut Change, t: &TokenRecord) -> Result<()> {
    sqlx::query(
        "INSERT INTO api_tokens (org_id, jti, kind, user_id, host_id, project_id, role, name, kid, expires_at, issued_from) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(t.org)
    .bind(t.jti)
    .bind(t.kind)
    .bind(t.user)
    .bind(t.host)
    .bind(t.project)
    .bind(t.role)
    .bind(&t.name)
    .bind(&t.kid)
    .bind(t.expires_at)
    .bind(t.issued_from)
    .execute(&mut *ch.tx)
    .await?;
    ch.audit(t.org, t.project, "token.create", ("token", t.jti.to_string()), json!({ "name": t.name, "role": t.role, "kind": t.kind }))?;
    Ok(())
}
