//! The definitions of workflow versions, parsed once per process. Versions are immutable, so
//! a cached definition never goes stale.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::definition::{self, Definition};
use crate::ids::WorkflowId;
use crate::store::{Result, StoreError};

#[derive(Default)]
pub struct Catalog {
    parsed: Mutex<HashMap<(WorkflowId, i32), Arc<Definition>>>,
}

/// Beyond this many versions the cache starts again empty; a process rarely sees so many.
const MAX_CACHED: usize = 10_000;

impl Catalog {
    pub async fn get(&self, conn: &mut sqlx::PgConnection, workflow: WorkflowId, version: i32) -> Result<Arc<Definition>> {
        if let Some(def) = self.parsed.lock().map_err(|_| poisoned())?.get(&(workflow, version)) {
            return Ok(def.clone());
        }
        let source: String = sqlx::query_scalar("SELECT source FROM workflow_versions WHERE workflow_id = $1 AND version = $2")
            .bind(workflow)
            .bind(version)
            .fetch_optional(conn)
            .await?
            .ok_or(StoreError::NotFound("workflow version"))?;
        let def = definition::parse(&source).map_err(|problems| {
            let first = problems.first().map(|p| p.message.clone()).unwrap_or_default();
            StoreError::Invalid(format!("stored workflow version {version} no longer validates: {first}"))
        })?;
        let def = Arc::new(def);
        let mut parsed = self.parsed.lock().map_err(|_| poisoned())?;
        if parsed.len() >= MAX_CACHED {
            parsed.clear();
        }
        parsed.insert((workflow, version), def.clone());
        Ok(def)
    }
}

fn poisoned() -> StoreError {
    StoreError::Invalid("definition cache poisoned by a panic".into())
}
