//! The scope a piece of work acts for (a task-local slot holding its org), and what a tenant
//! pool's transactions begin with ([`enter`]). Below `db`, which calls [`enter`]; `tenancy`
//! (the tenant pool) stands above `db`.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sqlx::PgConnection;

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

/// Warned once per process: the role is missing, so the tenant pool is the owner's.
static WARNED: AtomicBool = AtomicBool::new(false);

/// Takes the tenant role and `org` (the scope's, read by the caller: `Db::begin` runs this on a
/// task of its own, outside the scope) for the rest of `tx`'s transaction: what a tenant pool's
/// transactions begin with.
pub(crate) async fn enter(tx: &mut PgConnection, org: Option<OrgId>) -> Result<(), sqlx::Error> {
    // One statement: the org, and the role when it exists and this user may take it.
    let role: Option<String> = sqlx::query_scalar(
        "SELECT (SELECT set_config('role', rolname, true) FROM pg_roles \
                  WHERE rolname = $2 AND pg_has_role(session_user, oid, 'MEMBER')) \
          FROM (SELECT set_config('shopfloor.org', $1, true)) AS org",
    )
    .bind(org.map(|o| o.0.to_string()).unwrap_or_default())
    .bind(TENANT_ROLE)
    .fetch_one(&mut *tx)
    .await?;
    if role.is_none() && !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(role = TENANT_ROLE, "the tenant role is missing or not granted (migration 0016 could not make it): row-level security is not in force");
    }
    Ok(())
}
