//! `Console`: what the console's handlers share — the app's state, the REST router served
//! in-process, the templates and the settings.

use std::sync::Arc;

use axum::Router;

use super::config::ConsoleConfig;
use crate::http::AppState;

/// What the console's handlers share.
#[derive(Clone)]
pub struct Console {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) app: AppState,
    /// The REST API's routes, served in-process for the console's actions and reads.
    pub(super) api: Router,
    pub(super) env: minijinja::Environment<'static>,
    pub(super) cfg: ConsoleConfig,
    pub(super) http: reqwest::Client,
    /// Parsed workflow versions, for the run page's graph.
    pub(super) catalog: engine::catalog::Catalog,
}

impl Console {
    pub(super) fn state(&self) -> &AppState {
        &self.inner.app
    }

    pub(super) fn db(&self) -> &engine::db::Db {
        &self.inner.app.db
    }

    pub(super) fn cfg(&self) -> &ConsoleConfig {
        &self.inner.cfg
    }
}
