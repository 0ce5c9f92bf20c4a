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

pub(crate) mod scope;

use crate::db::Db;

pub use scope::{TENANT_ROLE, act_for, current, scoped};

/// A pool to the same database as `db` (same route, size and limits) whose transactions act as
/// `shopfloor_tenant` for the current scope's org. When the role does not exist or may not be
/// taken (the migration could not create it), they keep the owner's role and a warning says so
/// once: only the handlers' filters hold then.
pub fn tenant(db: &Db) -> Db {
    db.tenant_beside()
}
