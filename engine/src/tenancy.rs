//! The org a piece of work acts for, and the tenant pool that shows the database only that
//! org's rows: the second wall behind the handlers' `WHERE org_id = …` (migration 0016).
//!
//! A request runs inside [`scoped`], which holds a slot for its org in a task-local; the API
//! fills it with [`act_for`] once the caller's token is verified. Every connection of a pool
//! made by [`tenant_pool`] has done `SET ROLE shopfloor_tenant` and, each time it is handed
//! out, sets `shopfloor.org` to the org of the task that acquires it, empty when there is none:
//! the row-level security policies then show and accept only that org's rows, and with no org,
//! no row at all. Work that is nobody's or everybody's (the engine, token verification, webhook
//! ingest, event streams polled outside any request) uses the owner's pool, which the policies
//! do not apply to.
//!
//! The org is read when a connection is acquired, so it must be set before: a transaction begun
//! before [`act_for`] keeps the org (or none) it began with. A task spawned from a scoped one
//! does not inherit the scope (task-locals do not cross `tokio::spawn`): it sees nothing.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor as _, PgPool};

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

/// A pool to the same database as `pool`, of the same size, whose connections act as
/// `shopfloor_tenant` for the current scope's org. When the role does not exist or may not be
/// taken (the migration could not create it), its connections keep the owner's role and a
/// warning says so once: only the handlers' filters hold then.
pub fn tenant_pool(pool: &PgPool) -> PgPool {
    let options = pool.connect_options().as_ref().clone();
    let given = pool.options();
    PgPoolOptions::new()
        .max_connections(given.get_max_connections())
        .acquire_timeout(given.get_acquire_timeout())
        .after_connect(|conn, _| {
            Box::pin(async move {
                // One statement: the org, and the role when it exists and this user may take it.
                let role: Option<String> = sqlx::query_scalar(
                    "SELECT (SELECT set_config('role', rolname, false) FROM pg_roles \
                              WHERE rolname = $2 AND pg_has_role(session_user, oid, 'MEMBER')) \
                      FROM (SELECT set_config('shopfloor.org', $1, false)) AS org",
                )
                .bind(setting())
                .bind(TENANT_ROLE)
                .fetch_one(&mut *conn)
                .await?;
                if role.is_none() && !WARNED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(role = TENANT_ROLE, "the tenant role is missing or not granted (migration 0016 could not make it): row-level security is not in force");
                }
                Ok(())
            })
        })
        .before_acquire(|conn, _| {
            Box::pin(async move {
                conn.execute(sqlx::query("SELECT set_config('shopfloor.org', $1, false)").bind(setting())).await?;
                Ok(true)
            })
        })
        .connect_lazy_with(options)
}
