//! What the GitHub effect tests share: a test database with org `acme`, project `web` and
//! `Acme/Widgets` connected through installation 77, the fake GitHub on loopback, webhooks
//! ingested in-process (signatures are the webhook tests' business), and `shopfloor engine`
//! processes acting as the GitHub App (`tests/github_fake/test_app_key.pem`, a key made for
//! these tests only) against the fake.

use std::process::{Command, Stdio};
use std::time::Duration;

use engine::store::{Actor, Change};
use engine::testkit::{TestDb, test_db};
use engine::triggers::{Delivery, IngestOutcome, ingest};
use serde_json::Value;
use shopfloor_tests::github_fake::{self, FakeGithub, Repo};
use shopfloor_tests::process::Proc;
use shopfloor_tests::shopfloor_bin;

use crate::support::{acme, connect_widgets, put_workflows, widgets};

/// One step of a node, as the GitHub tests read it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct StepRow {
    pub visit: i32,
    pub state: String,
    pub reason: Option<String>,
    pub output: Option<Value>,
}

pub(crate) struct GhEnv {
    pub db: TestDb,
    pub fake: FakeGithub,
    pub repo: Repo,
}

impl GhEnv {
    pub(crate) async fn start(sources: &[&str]) -> GhEnv {
        let db = test_db().await;
        let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
        let acme = acme(&mut ch).await;
        put_workflows(&mut ch, acme.org, acme.project, sources).await;
        connect_widgets(&mut ch, acme.org, acme.project).await;
        ch.commit().await.unwrap();
        let fake = FakeGithub::start().await;
        GhEnv { db, fake, repo: widgets() }
    }

    /// An engine acting as the App against the fake, with the test executor for crew steps.
    /// `crash_after` sets the output executor's test hook.
    pub(crate) fn engine(&self, id: &str, crash_after: Option<&str>) -> Proc {
        let mut cmd = Command::new(shopfloor_bin());
        cmd.args(["engine", "--test-executor", "--engine-id", id, "--log", "warn"])
            .env("DATABASE_URL", &self.db.url)
            .env("SHOPFLOOR_SECRET_KEY", engine::testkit::SECRET_KEY)
            .env("SHOPFLOOR_DRAIN_SECS", "2")
            .env_remove("SHOPFLOOR_TEST_CRASH_AFTER")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        github_fake::as_app(&mut cmd, &self.fake.url, 2);
        if let Some(point) = crash_after {
            cmd.env("SHOPFLOOR_TEST_CRASH_AFTER", point);
        }
        Proc(cmd.spawn().expect("spawn shopfloor engine"))
    }

    /// Ingests a delivery as `POST /webhooks/github` would, after its signature check.
    pub(crate) async fn deliver(&self, event: &str, payload: &Value) -> IngestOutcome {
        let body = serde_json::to_vec(payload).unwrap();
        let id = uuid::Uuid::new_v4().to_string();
        ingest(&self.db.pool, &Delivery { id: &id, event, body: &body }).await.unwrap_or_else(|e| panic!("ingest {event}: {e}"))
    }

    pub(crate) async fn scalar(&self, sql: &str) -> i64 {
        shopfloor_tests::scalar(&self.db.pool, sql).await
    }

    /// The steps of `node`, oldest first.
    pub(crate) async fn steps(&self, node: &str) -> Vec<StepRow> {
        sqlx::query_as("SELECT visit, state, reason, output FROM steps WHERE node = $1 ORDER BY started_seq, created_at")
            .bind(node)
            .fetch_all(&self.db.pool)
            .await
            .unwrap()
    }

    pub(crate) async fn text(&self, sql: &str) -> Option<String> {
        sqlx::query_scalar(sql).fetch_optional(&self.db.pool).await.unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Waits until `sql` gives `want`, up to `limit` (the test reads; engines never poll).
    pub(crate) async fn until(&self, sql: &str, want: i64, limit: Duration) {
        shopfloor_tests::until_count(&self.db.pool, sql, want, limit).await;
    }

    pub(crate) async fn finish(self) {
        drop(self.fake);
        self.db.finish().await;
    }
}
