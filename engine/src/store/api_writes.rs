//! Writes the REST API makes that no other part of the store covers: members and their roles,
//! token revocation, and idempotency keys. Each is audited in the same change, like every
//! other write.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::QueryScalar;

use super::{Change, Result, StoreError, cap};
use crate::ids::{OrgId, UserId};

/// The roles of a person in an org, highest first.
pub const ROLES: [&str; 4] = ["owner", "admin", "member", "viewer"];

fn check_role(role: &str) -> Result<()> {
    if ROLES.contains(&role) { Ok(()) } else { Err(StoreError::Invalid(format!("`{}` is not a role (owner, admin, member, viewer)", cap(role)))) }
}

/// Adds a person to an org by email with a role. A person who is already a member is a
/// conflict (change the role instead).
pub async fn add_member(ch: &mut Change, org: OrgId, email: &str, role: &str) -> Result<UserId> {
    check_role(role)?;
    let email = email.trim();
    if !email.contains('@') || email.chars().count() > 254 || email.chars().any(char::is_control) {
        return Err(StoreError::Invalid(format!("`{}` is not an email address", cap(email))));
    }
    let (user, added) = super::tenants::add_membership(ch, org, email, role).await?;
    if !added {
        return Err(StoreError::Conflict(format!("{} is already a member", cap(email))));
    }
    ch.audit(org, None, "member.add", ("user", user.to_string()), json!({ "email": cap(email), "role": role }))?;
    Ok(user)
}

/// The current role of a member, locked for the rest of the change.
pub async fn member_role(ch: &mut Change, org: OrgId, user: UserId) -> Result<Option<String>> {
    Ok(sqlx::query_scalar("SELECT role FROM memberships WHERE org_id = $1 AND user_id = $2 FOR UPDATE")
        .bind(org)
        .bind(user)
        .fetch_optional(&mut *ch.tx)
        .await?)
}

/// Refuses a change that would leave the org without an owner. Owners are locked so that two
/// concurrent demotions cannot both pass.
async fn keep_an_owner(ch: &mut Change, org: OrgId, leaving: UserId) -> Result<()> {
    let owners: Vec<UserId> =
        sqlx::query_scalar("SELECT user_id FROM memberships WHERE org_id = $1 AND role = 'owner' FOR UPDATE").bind(org).fetch_all(&mut *ch.tx).await?;
    if owners.iter().all(|o| *o == leaving) {
        return Err(StoreError::Conflict("an org keeps at least one owner".into()));
    }
    Ok(())
}

/// Changes a member's role. The last owner cannot be demoted.
pub async fn set_member_role(ch: &mut Change, org: OrgId, user: UserId, role: &str) -> Result<()> {
    check_role(role)?;
    let current = member_role(ch, org, user).await?.ok_or(StoreError::NotFound("member"))?;
    if current == role {
        return Ok(());
    }
    if current == "owner" {
        keep_an_owner(ch, org, user).await?;
    }
    sqlx::query("UPDATE memberships SET role = $3 WHERE org_id = $1 AND user_id = $2").bind(org).bind(user).bind(role).execute(&mut *ch.tx).await?;
    ch.audit(org, None, "member.role", ("user", user.to_string()), json!({ "from": current, "to": role }))?;
    Ok(())
}

const REVOKE_MEMBER_TOKENS: &str = "UPDATE api_tokens SET revoked_at = now() WHERE org_id = $1 AND user_id = $2 AND revoked_at IS NULL AND expires_at > now()";

/// Removes a member and revokes their live tokens in the same change. The last owner cannot
/// be removed.
pub async fn remove_member(ch: &mut Change, org: OrgId, user: UserId) -> Result<()> {
    let current = member_role(ch, org, user).await?.ok_or(StoreError::NotFound("member"))?;
    if current == "owner" {
        keep_an_owner(ch, org, user).await?;
    }
    sqlx::query("DELETE FROM memberships WHERE org_id = $1 AND user_id = $2").bind(org).bind(user).execute(&mut *ch.tx).await?;
    let revoked = sqlx::query(REVOKE_MEMBER_TOKENS).bind(org).bind(user).execute(&mut *ch.tx).await?;
    ch.audit(org, None, "member.remove", ("user", user.to_string()), json!({ "role": current, "tokens_revoked": revoked.rows_affected() }))?;
    Ok(())
}

/// Revokes a token of the org. Revoking a revoked token again changes nothing.
pub async fn revoke_token(ch: &mut Change, org: OrgId, jti: uuid::Uuid) -> Result<()> {
    let lock = sqlx::query_scalar("SELECT revoked_at FROM api_tokens WHERE org_id = $1 AND jti = $2 FOR UPDATE").bind(org).bind(jti);
    if !lock_unended(ch, "token", lock).await? {
        return Ok(());
    }
    sqlx::query("UPDATE api_tokens SET revoked_at = now() WHERE org_id = $1 AND jti = $2").bind(org).bind(jti).execute(&mut *ch.tx).await?;
    let sessions = sqlx::query(REVOKE_ISSUED_FROM).bind(org).bind(jti).execute(&mut *ch.tx).await?.rows_affected();
    ch.audit(org, None, "token.revoke", ("token", jti.to_string()), json!({ "sessions_revoked": sessions }))?;
    Ok(())
}

/// The console sessions made from a token ($2), and those made from them, still unrevoked.
const REVOKE_ISSUED_FROM: &str = "WITH RECURSIVE issued AS ( \
         SELECT jti FROM api_tokens WHERE issued_from = $2 AND org_id = $1 \
         UNION SELECT t.jti FROM api_tokens t JOIN issued i ON t.issued_from = i.jti WHERE t.org_id = $1) \
     UPDATE api_tokens SET revoked_at = now() WHERE org_id = $1 AND jti IN (SELECT jti FROM issued) AND revoked_at IS NULL";

/// Locks a row that a timestamp ends (a token's `revoked_at`, a host's `deregistered_at`),
/// reading that timestamp with `lock` (`SELECT <column> … FOR UPDATE`): `true` while it is
/// unset, `false` once set, so that ending a row twice changes nothing; `NotFound(what)`
/// without a row.
async fn lock_unended(ch: &mut Change, what: &'static str, lock: EndedAt<'_>) -> Result<bool> {
    match lock.fetch_optional(&mut *ch.tx).await? {
        None => Err(StoreError::NotFound(what)),
        Some(ended_at) => Ok(ended_at.is_none()),
    }
}

/// A statement that reads a row's ending timestamp.
type EndedAt<'q> = QueryScalar<'q, Postgres, Option<DateTime<Utc>>, PgArguments>;

/// How long an idempotency key is remembered.
pub const IDEMPOTENCY_TTL_HOURS: i32 = 24;

/// What an `Idempotency-Key` means for this request.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyClaim {
    /// First use: go on, and record the answer with [`record_answer`] in this change.
    New,
    /// The same request was answered before: answer this again.
    Replay { status: u16, body: Value },
    /// The key was used for another request.
    Mismatch,
}

const FORGET_EXPIRED_KEY: &str = "DELETE FROM idempotency_keys WHERE org_id = $1 AND key = $2 AND created_at < now() - make_interval(hours => $3)";

const CLAIM_KEY: &str = "INSERT INTO idempotency_keys (org_id, key, request_hash) VALUES ($1, $2, $3) ON CONFLICT (org_id, key) DO NOTHING";

/// Claims an idempotency key for a request (by its hash) as the first write of a change. A
/// concurrent request with the same key waits on the row until this change ends, then sees
/// its answer, so a create runs at most once per key.
pub async fn claim_key(ch: &mut Change, org: OrgId, key: &str, request_hash: &str) -> Result<KeyClaim> {
    sqlx::query(FORGET_EXPIRED_KEY).bind(org).bind(key).bind(IDEMPOTENCY_TTL_HOURS).execute(&mut *ch.tx).await?;
    let inserted = sqlx::query(CLAIM_KEY).bind(org).bind(key).bind(request_hash).execute(&mut *ch.tx).await?;
    if inserted.rows_affected() == 1 {
        return Ok(KeyClaim::New);
    }
    let (hash, status, body): (String, Option<i32>, Option<Value>) =
        sqlx::query_as("SELECT request_hash, status, response FROM idempotency_keys WHERE org_id = $1 AND key = $2")
            .bind(org)
            .bind(key)
            .fetch_one(&mut *ch.tx)
            .await?;
    if hash != request_hash {
        return Ok(KeyClaim::Mismatch);
    }
    match (status, body) {
        (Some(status), Some(body)) => Ok(KeyClaim::Replay { status: u16::try_from(status).unwrap_or(200), body }),
        // Written and committed without its answer: cannot happen through `record_answer`,
        // but say so rather than run the create twice.
        _ => Err(StoreError::Conflict("this Idempotency-Key's first request did not finish".into())),
    }
}

/// Records the answer to a request whose key was claimed in this change.
pub async fn record_answer(ch: &mut Change, org: OrgId, key: &str, status: u16, body: &Value) -> Result<()> {
    sqlx::query("UPDATE idempotency_keys SET status = $3, response = $4 WHERE org_id = $1 AND key = $2")
        .bind(org)
        .bind(key)
        .bind(i32::from(status))
        .bind(body)
        .execute(&mut *ch.tx)
        .await?;
    Ok(())
}

const REVOKE_HOST_TOKENS: &str = "UPDATE api_tokens SET revoked_at = now() WHERE org_id = $1 AND host_id = $2 AND revoked_at IS NULL";

/// Deregisters a host of a project: it takes no more steps, and its credentials are revoked
/// in the same change. Deregistering twice changes nothing.
pub async fn deregister_host(ch: &mut Change, org: OrgId, project: crate::ids::ProjectId, host: crate::ids::HostId) -> Result<()> {
    let lock = sqlx::query_scalar("SELECT deregistered_at FROM hosts WHERE org_id = $1 AND project_id = $2 AND host_id = $3 FOR UPDATE")
        .bind(org)
        .bind(project)
        .bind(host);
    if !lock_unended(ch, "host", lock).await? {
        return Ok(());
    }
    sqlx::query("UPDATE hosts SET deregistered_at = now() WHERE org_id = $1 AND host_id = $2").bind(org).bind(host).execute(&mut *ch.tx).await?;
    let revoked = sqlx::query(REVOKE_HOST_TOKENS).bind(org).bind(host).execute(&mut *ch.tx).await?;
    ch.audit(org, Some(project), "host.deregister", ("host", host.to_string()), json!({ "tokens_revoked": revoked.rows_affected() }))?;
    Ok(())
}
