//! The org a piece of work acts for, and the tenant pool that shows the database only that
//! org's rows: the second wall behind the handlers' `WHERE org_id = …` (migration 0016).
//!
//! A request runs inside [`scoped`], which holds a slot for its org in a task-local; the API
//! fills it with [`act_for`] once the caller's token is verified. Every transaction on a pool
//! made by [`tenant`] begins by taking the role `shopfloor_tenant` and setting `shopfloor.org`
//! to the org of the task that begins it (empty when there is none), both `LOCAL`: the
//! row-level security policies then show and accept only that org's rows, and with no org, no
//! row at all; and a single statement on the pool is a transaction of its own. Nothing is set
//! on the session, so nothing outlives the transaction: behind a transaction pooler, where the
//! next transaction on that server connection may be another client's, no org or role leaks
//! to it, and the same code holds on a direct connection. Work that is nobody's or everybody's
//! (the engine, token verification, webhook ingest, event streams polled outside any request)
//! uses the owner's pool, which the policies do not apply to.
//!
//! The org is read when a transaction begins, so it must be set before: a transaction begun
//! before [`act_for`] keeps the org (or none) it began with. A task spawned from a scoped one
//! does not inherit the scope (task-locals do not cross `tokio::spawn`): it sees nothing.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sqlx::PgConnection;

use crate::db::Db;
use crate::ids::OrgId;

/// The role the tenant pool's connections switch to (made by migration 0016).
pub const TENANT_ROLE: &str = "shopfloor_tenant";

/// Where the org of a scope is kept: set once its caller is known.
#[derive(Clone, Default)]
struct Slot(Arc<Mutex<Option<OrgId>>>);

tokio::task_local! {
    static SCOPE: Slot;
}

/// Runs `work` as a scope acting for `org` (`None`: for no org until [`act_for`] names one).
pub async fn scoped<F: Future>(org: Option<OrgId>, work: F) -> F::Output {
    SCOPE.scope(Slot(Arc::new(Mutex::new(org))), work).await
}

/// From now on, the current scope acts for `org`. False when there is no scope (the tenant pool
/// then shows nothing).
pub fn act_for(org: OrgId) -> bool {
    SCOPE
        .try_with(|slot| {
            if let Ok(mut current) = slot.0.lock() {
                *current = Some(org);
            }
        })
        .is_ok()
}

/// The org the current scope acts for, if any.
pub fn current() -> Option<OrgId> {
    SCOPE.try_with(|slot| slot.0.lock().ok().and_then(|o| *o)).ok().flatten()
}

fn setting() -> String {
    current().map(|o| o.0.to_string()).unwrap_or_default()
}

/// Warned once per process: the role is missing, so the tenant pool is the owner's.
static WARNED: AtomicBool = AtomicBool::new(false);

/// A pool to the same database as `db` (same route, size and limits) whose transactions act as
/// `shopfloor_tenant` for the current scope's org. When the role does not exist or may not be
/// taken (the migration could not create it), they keep the owner's role and a warning says so
/// once: only the handlers' filters hold then.
pub fn tenant(db: &Db) -> Db {
    db.tenant_beside()
}

/// Takes the tenant role and the current scope's org for the rest of `tx`'s transaction: what a
/// tenant pool's transactions begin with ([`Db::begin`]).
pub(crate) async fn enter(tx: &mut PgConnection) -> Result<(), sqlx::Error> {
    // One statement: the org, and the role when it exists and this user may take it.
    let role: Option<String> = sqlx::query_scalar(
        "SELECT (SELECT set_config('role', rolname, true) FROM pg_roles \
                  WHERE rolname = $2 AND pg_has_role(session_user, oid, 'MEMBER')) \
          FROM (SELECT set_config('shopfloor.org', $1, true)) AS org",
    )
    .bind(setting())
    .bind(TENANT_ROLE)
    .fetch_one(&mut *tx)
    .await?;
    if role.is_none() && !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(role = TENANT_ROLE, "the tenant role is missing or not granted (migration 0016 could not make it): row-level security is not in force");
    }
    Ok(())
}
