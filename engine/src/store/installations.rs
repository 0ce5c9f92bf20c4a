//! Installations of the GitHub App and the repositories connected through them.
//!
//! An installation belongs to the org GitHub says it belongs to, never to the first org that
//! names its id. It becomes known only from GitHub: a signed `installation` or
//! `installation_repositories` webhook ([`announce`], [`set_repositories`]) or the App's own
//! API, and stays unclaimed (no org) until an org [`claim`]s it, which the API allows only once
//! GitHub has shown that the claiming person can access it. A repository is connected to a
//! project only if the installation can reach it ([`connect_repository`]); a repository removed
//! from the installation is detached from its projects, and attached again when it comes back.

use serde_json::json;
use sqlx::Row;
use uuid::Uuid;

use super::{Change, Result, StoreError, cap};
use crate::ids::{OrgId, ProjectId};

/// An installation as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installation {
    pub id: i64,
    /// The org that claimed it; None while unclaimed.
    pub org: Option<OrgId>,
    /// The GitHub account (organization or user) it is installed on.
    pub account: String,
    pub suspended: bool,
    pub deleted: bool,
}

pub(crate) fn installation_of(r: &sqlx::postgres::PgRow) -> Installation {
    Installation {
        id: r.get("installation_id"),
        org: r.get("org_id"),
        account: r.get("account_login"),
        suspended: r.get("suspended"),
        deleted: r.get("deleted"),
    }
}

/// The columns `installation_of` reads.
pub(crate) const INSTALLATION_COLUMNS: &str =
    "installation_id, org_id, account_login, suspended_at IS NOT NULL AS suspended, deleted_at IS NOT NULL AS deleted";

/// The installation, claimed or not.
pub async fn find(conn: &mut sqlx::PgConnection, installation: i64) -> Result<Option<Installation>> {
    let row = sqlx::query(&format!("SELECT {INSTALLATION_COLUMNS} FROM github_installations WHERE installation_id = $1"))
        .bind(installation)
        .fetch_optional(conn)
        .await?;
    Ok(row.as_ref().map(installation_of))
}

/// What GitHub said about an installation.
#[derive(Debug, Clone, Default)]
pub struct Announced {
    pub id: i64,
    pub account: String,
    /// `Organization` or `User`.
    pub account_type: Option<String>,
    /// `all` or `selected`.
    pub repository_selection: Option<String>,
    /// The repositories it can reach (`owner/name`), when GitHub listed them: the list replaces
    /// the stored one.
    pub repositories: Option<Vec<String>>,
}

fn lower(names: &[String]) -> Vec<String> {
    names.iter().map(|n| n.to_lowercase()).collect()
}

const FORGET_UNLISTED: &str = "DELETE FROM github_installation_repositories WHERE installation_id = $1 AND NOT (full_name = ANY($2))";

/// Records what GitHub said: a new installation is stored unclaimed; a known one keeps its org,
/// and is active again (not deleted) with the account and repository list GitHub gave.
pub async fn announce(ch: &mut Change, a: &Announced) -> Result<Installation> {
    let row = sqlx::query(&format!(
        "INSERT INTO github_installations (installation_id, account_login, account_type, repository_selection) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (installation_id) DO UPDATE SET account_login = EXCLUDED.account_login, \
           account_type = coalesce(EXCLUDED.account_type, github_installations.account_type), \
           repository_selection = coalesce(EXCLUDED.repository_selection, github_installations.repository_selection), \
           deleted_at = NULL \
         RETURNING {INSTALLATION_COLUMNS}"
    ))
    .bind(a.id)
    .bind(&a.account)
    .bind(&a.account_type)
    .bind(&a.repository_selection)
    .fetch_one(&mut *ch.tx)
    .await?;
    let installation = installation_of(&row);
    if let Some(repositories) = &a.repositories {
        let names = lower(repositories);
        sqlx::query(FORGET_UNLISTED).bind(a.id).bind(&names).execute(&mut *ch.tx).await?;
        list(ch, a.id, &names).await?;
        if let Some(org) = installation.org {
            reattach(ch, org, a.id, &names).await?;
            detach_missing(ch, org, a.id).await?;
        }
    }
    Ok(installation)
}

/// Applies an `installation` webhook's `deleted`, `suspend` or `unsuspend` to a known
/// installation. Returns the delivery's outcome.
pub async fn lifecycle(ch: &mut Change, inst: &Installation, action: &str) -> Result<&'static str> {
    let outcome = match action {
        "deleted" => {
            sqlx::query("UPDATE github_installations SET deleted_at = now() WHERE installation_id = $1").bind(inst.id).execute(&mut *ch.tx).await?;
            sqlx::query("UPDATE repositories SET installation_id = NULL WHERE installation_id = $1").bind(inst.id).execute(&mut *ch.tx).await?;
            "installation_deleted"
        }
        "suspend" => {
            sqlx::query("UPDATE github_installations SET suspended_at = now() WHERE installation_id = $1").bind(inst.id).execute(&mut *ch.tx).await?;
            "installation_suspended"
        }
        "unsuspend" => {
            sqlx::query("UPDATE github_installations SET suspended_at = NULL WHERE installation_id = $1").bind(inst.id).execute(&mut *ch.tx).await?;
            "installation_active"
        }
        _ => return Ok("ignored"),
    };
    audit_change(ch, inst, action, json!({ "account": inst.account }))?;
    Ok(outcome)
}

/// An installation's changes are in the audit log of the org that claimed it; an unclaimed
/// one's are in its deliveries only (no tenant's log is theirs to read).
fn audit_change(ch: &mut Change, inst: &Installation, action: &str, detail: serde_json::Value) -> Result<()> {
    match inst.org {
        Some(org) => ch.audit(org, None, &format!("installation.{action}"), ("installation", inst.id.to_string()), detail),
        None => Ok(()),
    }
}

const FORGET_REMOVED: &str = "DELETE FROM github_installation_repositories WHERE installation_id = $1 AND full_name = ANY($2)";

/// Applies `installation_repositories`: the installation's list gains and loses repositories;
/// for a claimed installation, removed repositories are detached from their projects and
/// repositories added back are attached again. Returns (attached, detached).
pub async fn set_repositories(ch: &mut Change, inst: &Installation, added: &[String], removed: &[String]) -> Result<(u64, u64)> {
    let (added, removed) = (lower(added), lower(removed));
    sqlx::query(FORGET_REMOVED).bind(inst.id).bind(&removed).execute(&mut *ch.tx).await?;
    list(ch, inst.id, &added).await?;
    let Some(org) = inst.org else { return Ok((0, 0)) };
    let detached = detach_missing(ch, org, inst.id).await?;
    let attached = reattach(ch, org, inst.id, &added).await?;
    if attached + detached > 0 {
        audit_change(ch, inst, "repositories", json!({ "added": added, "removed": removed }))?;
    }
    Ok((attached, detached))
}

/// A repository GitHub renamed or moved to another owner (`repository.renamed`,
/// `repository.transferred`): the installation's list, the projects' connections and the
/// watches of their waiting runs take the new name, under which every later delivery comes.
/// Items keep the name they were made under. Returns the connections renamed.
pub async fn rename_repository(ch: &mut Change, inst: &Installation, from: &str, to: &str) -> Result<u64> {
    let (from, to) = (from.to_lowercase(), to.to_lowercase());
    if from == to {
        return Ok(0);
    }
    sqlx::query(
        r#"WITH gone AS (
               DELETE FROM github_installation_repositories WHERE installation_id = $1 AND full_name = $2
               RETURNING 1)
           INSERT INTO github_installation_repositories (installation_id, full_name)
           SELECT $1, $3 FROM gone
           ON CONFLICT DO NOTHING"#,
    )
    .bind(inst.id)
    .bind(&from)
    .bind(&to)
    .execute(&mut *ch.tx)
    .await?;
    let Some(org) = inst.org else { return Ok(0) };
    let projects: Vec<ProjectId> = sqlx::query_scalar(
        r#"WITH renamed AS (
               UPDATE repositories r SET full_name = $4
               WHERE r.org_id = $1 AND r.installation_id = $2 AND r.full_name = $3
                 AND NOT EXISTS (SELECT 1 FROM repositories n WHERE n.project_id = r.project_id AND n.full_name = $4)
               RETURNING r.project_id),
           watched AS (
               UPDATE github_watches w SET repository = $4 FROM renamed
               WHERE w.org_id = $1 AND w.project_id = renamed.project_id AND w.repository = $3)
           SELECT project_id FROM renamed"#,
    )
    .bind(org)
    .bind(inst.id)
    .bind(&from)
    .bind(&to)
    .fetch_all(&mut *ch.tx)
    .await?;
    if projects.is_empty() {
        return Ok(0);
    }
    audit_change(ch, inst, "repository_renamed", json!({ "from": from, "to": to }))?;
    Ok(projects.len() as u64)
}

/// Adds repositories to the installation's list.
async fn list(ch: &mut Change, installation: i64, names: &[String]) -> Result<()> {
    sqlx::query("INSERT INTO github_installation_repositories (installation_id, full_name) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING")
        .bind(installation)
        .bind(names)
        .execute(&mut *ch.tx)
        .await?;
    Ok(())
}

/// Projects' repositories the installation no longer reaches lose it.
async fn detach_missing(ch: &mut Change, org: OrgId, installation: i64) -> Result<u64> {
    Ok(sqlx::query(
        "UPDATE repositories r SET installation_id = NULL WHERE r.org_id = $1 AND r.installation_id = $2 \
         AND NOT EXISTS (SELECT 1 FROM github_installation_repositories g WHERE g.installation_id = $2 AND g.full_name = r.full_name)",
    )
    .bind(org)
    .bind(installation)
    .execute(&mut *ch.tx)
    .await?
    .rows_affected())
}

/// Repositories a project had connected and lost are attached again when they come back.
async fn reattach(ch: &mut Change, org: OrgId, installation: i64, names: &[String]) -> Result<u64> {
    Ok(sqlx::query("UPDATE repositories SET installation_id = $2 WHERE org_id = $1 AND installation_id IS NULL AND full_name = ANY($3)")
        .bind(org)
        .bind(installation)
        .bind(names)
        .execute(&mut *ch.tx)
        .await?
        .rows_affected())
}

/// Gives a known installation to `org`. The caller has already proven, through GitHub, that the
/// person acting can access it. Claiming an installation the org already has changes nothing.
///
/// # Errors
/// `NotFound` when GitHub never announced it (or it was uninstalled); `Conflict` when another
/// org has it.
pub async fn claim(ch: &mut Change, org: OrgId, installation: i64) -> Result<Installation> {
    let Some(inst) = find(&mut ch.tx, installation).await? else {
        return Err(StoreError::NotFound("installation"));
    };
    if inst.deleted {
        return Err(StoreError::NotFound("installation"));
    }
    match inst.org {
        Some(owner) if owner == org => return Ok(inst),
        Some(_) => {
            return Err(StoreError::Conflict(format!(
                "installation {installation} is connected to another org; an admin of that org must disconnect it first"
            )));
        }
        None => {}
    }
    let by = cap(&ch.actor().label());
    let row = sqlx::query(&format!(
        "UPDATE github_installations SET org_id = $2, claimed_at = now(), claimed_by = $3 \
         WHERE installation_id = $1 AND org_id IS NULL RETURNING {INSTALLATION_COLUMNS}"
    ))
    .bind(installation)
    .bind(org)
    .bind(by)
    .fetch_optional(&mut *ch.tx)
    .await?;
    // Two orgs claiming at once: the row lock makes the second see the first's org.
    let Some(row) = row else { return Err(StoreError::Conflict(format!("installation {installation} is connected to another org"))) };
    let inst = installation_of(&row);
    audit_change(ch, &inst, "claim", json!({ "account": inst.account }))?;
    Ok(inst)
}

/// Gives an installation up: the org's repositories connected through it are detached, and it
/// is unclaimed again (another org may claim it with its own proof).
pub async fn release(ch: &mut Change, org: OrgId, installation: i64) -> Result<()> {
    let inst = find(&mut ch.tx, installation).await?.filter(|i| i.org == Some(org)).ok_or(StoreError::NotFound("installation"))?;
    sqlx::query("UPDATE repositories SET installation_id = NULL WHERE org_id = $1 AND installation_id = $2")
        .bind(org)
        .bind(installation)
        .execute(&mut *ch.tx)
        .await?;
    sqlx::query("UPDATE github_installations SET org_id = NULL, claimed_at = NULL, claimed_by = NULL WHERE installation_id = $1 AND org_id = $2")
        .bind(installation)
        .bind(org)
        .execute(&mut *ch.tx)
        .await?;
    audit_change(ch, &inst, "release", json!({ "account": inst.account }))
}

/// Whether GitHub's list for the installation holds the repository.
pub async fn reaches(conn: &mut sqlx::PgConnection, installation: i64, full_name: &str) -> Result<bool> {
    Ok(sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM github_installation_repositories WHERE installation_id = $1 AND full_name = $2)")
        .bind(installation)
        .bind(full_name.to_lowercase())
        .fetch_one(conn)
        .await?)
}

/// Connects `full_name` to a project through an installation the org claimed and that reaches
/// the repository. Connecting it again changes nothing but the installation.
///
/// # Errors
/// `NotFound` for an installation the org does not have (another org's is not found either:
/// its existence is never revealed); `Invalid` for a repository outside the installation.
pub async fn connect_repository(ch: &mut Change, org: OrgId, project: ProjectId, installation: i64, full_name: &str) -> Result<()> {
    let inst = find(&mut ch.tx, installation).await?.filter(|i| i.org == Some(org) && !i.deleted).ok_or(StoreError::NotFound("installation"))?;
    let name = full_name.to_lowercase();
    if !reaches(&mut ch.tx, inst.id, &name).await? {
        return Err(StoreError::Invalid(format!(
            "repository {name} is not in installation {installation} ({}): add it to the installation on GitHub first",
            inst.account
        )));
    }
    sqlx::query(
        "INSERT INTO repositories (org_id, project_id, repository_id, full_name, installation_id) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (project_id, full_name) DO UPDATE SET installation_id = EXCLUDED.installation_id",
    )
    .bind(org)
    .bind(project)
    .bind(Uuid::now_v7())
    .bind(&name)
    .bind(installation)
    .execute(&mut *ch.tx)
    .await?;
    ch.audit(org, Some(project), "repository.connect", ("repository", name), json!({ "installation": installation }))?;
    Ok(())
}

/// For tests and benchmarks that start from a connected repository: the installation as
/// GitHub would announce it, claimed by `org`, with `full_name` connected to `project`.
#[cfg(feature = "testkit")]
pub async fn connect_for_test(ch: &mut Change, org: OrgId, project: ProjectId, installation: i64, account: &str, full_name: &str) -> Result<()> {
    let inst = announce(ch, &Announced { id: installation, account: account.to_owned(), ..Announced::default() }).await?;
    set_repositories(ch, &inst, &[full_name.to_owned()], &[]).await?;
    claim(ch, org, installation).await?;
    connect_repository(ch, org, project, installation, full_name).await
}
