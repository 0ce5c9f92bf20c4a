//! Per-test databases, for this workspace's tests (behind the `testkit` feature).
//!
//! Each test gets a database of its own, cloned from a migrated template on the server that
//! `DATABASE_URL` names (`make test` starts a throwaway cluster and sets it). Tests run one
//! process each under cargo-nextest, so the template is built under an advisory lock, as
//! `<template>_building`, and renamed only when fully migrated: a half-built template is never
//! cloned. The template's name carries a hash of the migrations, so a changed migration gets a
//! fresh template. A test ends with [`TestDb::finish`], which checks the teardown invariants and
//! drops the database; databases of tests that panicked are swept by a later test once they
//! are an hour old (their names carry their creation time: `t_<unix secs>_<random>`).
//!
//! Test helpers may panic: a failure here is a failed test, with the reason in the message.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::db::Db;
use sha2::{Digest, Sha256};
use sqlx::PgConnection;

use crate::db;

/// Databases of dead tests older than this are dropped at the start of a test.
const SWEEP_AFTER: Duration = Duration::from_secs(3600);
/// The advisory lock key under which the template is built ("shopfloo" in ASCII).
const TEMPLATE_LOCK: i64 = 0x7368_6f70_666c_6f6f;
/// Connections in a test database's pool.
const POOL_SIZE: u32 = 20;

/// The `SHOPFLOOR_SECRET_KEY` of every test: what spawned `serve`/`api` processes are given and
/// what tests that issue tokens in-process seal signing keys with. A constant, so that a test's
/// processes and the test itself agree without passing it around.
pub const SECRET_KEY: &str = "c2hvcGZsb29yIHRlc3RzOiAzMiBieXRlcyBvZiBrZXk=";

/// [`SECRET_KEY`], parsed.
pub fn secret_key() -> crate::sealing::SecretKey {
    crate::sealing::SecretKey::parse(SECRET_KEY).unwrap_or_else(|e| panic!("testkit::SECRET_KEY {e}"))
}

/// A database of one test's own.
pub struct TestDb {
    /// A pool on the test's database.
    pub pool: Db,
    /// The URL of the test's database.
    pub url: String,
    /// The test's database name, `t_<unix secs>_<random>`.
    pub name: String,
    admin_url: String,
}

/// The name of the template database for this binary's migrations:
/// `shopfloor_tpl_<first 12 hex digits of a SHA-256 over the migrations' versions and checksums>`.
pub fn template_name() -> String {
    let mut hash = Sha256::new();
    for migration in db::MIGRATOR.iter() {
        hash.update(migration.version.to_be_bytes());
        hash.update(&migration.checksum);
    }
    let hex: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("shopfloor_tpl_{}", &hex[..12])
}

/// Makes a fresh, migrated database for one test.
pub async fn test_db() -> TestDb {
    let admin_url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set: database tests need a PostgreSQL server. Run them with \
             `make test`, which starts a throwaway cluster, or set DATABASE_URL to a server where \
             this role may CREATE DATABASE"
        )
    });
    let admin_pool = db::connect(&admin_url, 1).await.unwrap_or_else(|e| panic!("test_db: cannot connect to DATABASE_URL: {e}"));
    let mut admin = admin_pool.pool().acquire().await.unwrap_or_else(|e| panic!("test_db: cannot connect to DATABASE_URL: {e}"));

    sweep_stale(&mut admin).await;
    let template = template_name();
    ensure_template(&mut admin, &admin_url, &template).await;

    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let name = format!("t_{now}_{:08x}", rand::random::<u32>());
    execute(&mut admin, &format!("CREATE DATABASE \"{name}\" TEMPLATE \"{template}\" STRATEGY FILE_COPY"))
        .await
        .unwrap_or_else(|e| panic!("test_db: cannot clone {template} into {name}: {e}"));
    drop(admin);
    admin_pool.close().await;

    let url = with_database(&admin_url, &name);
    let pool = db::connect(&url, POOL_SIZE).await.unwrap_or_else(|e| panic!("test_db: cannot connect to the test database {name}: {e}"));
    TestDb { pool, url, name, admin_url }
}

impl TestDb {
    /// Ends the test: checks that nothing was left undone (no wake due more than 5 s ago is
    /// still unclaimed), then drops the database. Panics, after dropping, when a check fails.
    pub async fn finish(self) {
        let leftovers = stale_wakes(&self.pool).await;
        let name = self.name.clone();
        self.discard().await;
        assert!(leftovers.is_empty(), "test database {name} was left with due wakes that no engine claimed: {}", leftovers.join(", "));
    }

    /// Drops the database without checking anything: for tests that leave work undone on
    /// purpose.
    pub async fn discard(self) {
        self.pool.close().await;
        let admin = db::connect(&self.admin_url, 1).await.unwrap_or_else(|e| panic!("cannot connect to DATABASE_URL to drop {}: {e}", self.name));
        let dropped = sqlx::query(&format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name)).execute(&admin).await;
        admin.close().await;
        if let Err(e) = dropped {
            panic!("cannot drop the test database {}: {e}", self.name);
        }
    }
}

/// Up to three wakes, as JSON, that fell due more than 5 s ago; none when the schema has no
/// `wakes.due_at` (yet).
async fn stale_wakes(pool: &Db) -> Vec<String> {
    let has_wakes: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns
                         WHERE table_schema = current_schema() AND table_name = 'wakes'
                           AND column_name = 'due_at')",
    )
    .fetch_one(pool)
    .await
    .unwrap_or_else(|e| panic!("teardown check: {e}"));
    if !has_wakes {
        return Vec::new();
    }
    sqlx::query_scalar(
        "SELECT row_to_json(w)::text FROM wakes w
          WHERE w.due_at < now() - interval '5 seconds' ORDER BY w.due_at LIMIT 3",
    )
    .fetch_all(pool)
    .await
    .unwrap_or_else(|e| panic!("teardown check: {e}"))
}

/// Drops the databases of tests that died more than [`SWEEP_AFTER`] ago. Another process may
/// be sweeping the same ones, so failures are ignored.
async fn sweep_stale(admin: &mut PgConnection) {
    let names: Vec<String> = sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE 't\\_%'").fetch_all(&mut *admin).await.unwrap_or_default();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    for name in names {
        let Some(created) = name.split('_').nth(1).and_then(|s| s.parse::<u64>().ok()) else {
            continue;
        };
        if now.saturating_sub(created) > SWEEP_AFTER.as_secs() {
            let _ = execute(admin, &format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")).await;
        }
    }
}

/// Builds the template unless it exists, under an advisory lock so that concurrent test
/// processes build it once.
async fn ensure_template(admin: &mut PgConnection, admin_url: &str, template: &str) {
    if database_exists(admin, template).await {
        return;
    }
    execute(admin, &format!("SELECT pg_advisory_lock({TEMPLATE_LOCK})")).await.unwrap_or_else(|e| panic!("test_db: cannot take the template lock: {e}"));
    if !database_exists(admin, template).await {
        build_template(admin, admin_url, template).await;
    }
    execute(admin, &format!("SELECT pg_advisory_unlock({TEMPLATE_LOCK})")).await.unwrap_or_else(|e| panic!("test_db: cannot release the template lock: {e}"));
}

async fn build_template(admin: &mut PgConnection, admin_url: &str, template: &str) {
    let building = format!("{template}_building");
    let step = |what: &str, e: &dyn std::fmt::Display| -> ! { panic!("test_db: building the template {template}: {what}: {e}") };
    // A builder that died leaves its half-built template behind; we hold the lock, so no
    // one else is building it now.
    if let Err(e) = execute(admin, &format!("DROP DATABASE IF EXISTS \"{building}\" WITH (FORCE)")).await {
        step("drop a half-built one", &e);
    }
    if let Err(e) = execute(admin, &format!("CREATE DATABASE \"{building}\" TEMPLATE template0")).await {
        step("create", &e);
    }
    let pool = db::connect(&with_database(admin_url, &building), 2).await.unwrap_or_else(|e| step("connect", &e));
    if let Err(e) = db::migrate(&pool).await {
        step("migrate", &e);
    }
    pool.close().await;

    // A template that nobody can connect to can always be cloned.
    if let Err(e) = execute(admin, &format!("ALTER DATABASE \"{building}\" WITH ALLOW_CONNECTIONS false")).await {
        step("close it to connections", &e);
    }
    // The server may still be ending the sessions we just closed, which blocks the rename.
    let rename = format!("ALTER DATABASE \"{building}\" RENAME TO \"{template}\"");
    let mut tries = 0;
    loop {
        match execute(admin, &rename).await {
            Ok(()) => return,
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55006") && tries < 100 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => step("rename", &e),
        }
    }
}

async fn database_exists(admin: &mut PgConnection, name: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(name)
        .fetch_one(admin)
        .await
        .unwrap_or_else(|e| panic!("test_db: cannot list databases: {e}"))
}

async fn execute(conn: &mut PgConnection, sql: &str) -> Result<(), sqlx::Error> {
    sqlx::query(sql).execute(conn).await.map(|_| ())
}

/// `url` with its database replaced by `database`, keeping its query string.
fn with_database(url: &str, database: &str) -> String {
    let (head, query) = url.split_at(url.find('?').unwrap_or(url.len()));
    let authority = head.find("://").map_or(0, |i| i + 3);
    let base = head[authority..].find('/').map_or(head, |i| &head[..authority + i]);
    format!("{base}/{database}{query}")
}

/// A throwaway PostgreSQL cluster of one test's own in `data_dir` (not durable: fast), for a
/// test that starts, stops or cuts a server, which the shared one's other tests must not feel.
/// Stopped when dropped, so that a test that fails leaves no server running on its removed
/// directory.
pub struct OwnCluster {
    pub opts: crate::cluster::ClusterOptions,
}

impl OwnCluster {
    pub fn new(data_dir: std::path::PathBuf) -> OwnCluster {
        OwnCluster { opts: crate::cluster::ClusterOptions { data_dir, durable: false } }
    }

    /// Starts it (making it first) or finds it running.
    pub async fn start(&self) -> crate::cluster::Cluster {
        crate::cluster::ensure_running(&self.opts).await.unwrap_or_else(|e| panic!("the test's own cluster in {}: {e}", self.opts.data_dir.display()))
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        if let Err(e) = crate::cluster::stop_dir(&self.opts) {
            eprintln!("could not stop the test's own cluster in {}: {e}", self.opts.data_dir.display());
        }
    }
}

/// Waits until every event committed in this process has been told to the event streams
/// (the trailing `e` notice of [`crate::store::Change`] is sent), so that a test listening
/// afterwards hears only what it causes itself.
pub async fn events_told() {
    let told = async {
        while crate::store::EventsNotice::owed() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), told).await.expect("the trailing events notice is sent");
}

/// Makes `workflow`'s cycle budget on `acme/web#7` used up, as ingest leaves it: the item (an
/// open issue labelled `ready`), an `issues.labeled` event it blocked, and the budget's ask.
/// Returns the item.
pub async fn used_up_cycle_budget(
    pool: &Db, org: crate::ids::OrgId, project: crate::ids::ProjectId, workflow: crate::ids::WorkflowId, workflow_name: &str,
) -> crate::ids::ItemId {
    use serde_json::json;
    let mut ch = crate::store::Change::begin(pool, crate::store::Actor::System).await.expect("a change");
    let item = crate::store::triggers::ensure_item(&mut ch, org, project, r#"["github","acme/web",7]"#).await.expect("the item");
    ch.commit().await.expect("commit the item");
    sqlx::query("UPDATE items SET data = $2 WHERE item_id = $1")
        .bind(item)
        .bind(json!({ "repository": "acme/web", "number": 7, "state": "open", "labels": ["ready"] }))
        .execute(pool)
        .await
        .expect("the item's data");
    let event = uuid::Uuid::now_v7();
    sqlx::query(
        "INSERT INTO trigger_events (org_id, project_id, event_id, workflow_id, item_id, dedup_key, source, payload, status) \
         VALUES ($1, $2, $3, $4, $5, 'blocked-one', 'github', $6, 'blocked')",
    )
    .bind(org)
    .bind(project)
    .bind(event)
    .bind(workflow)
    .bind(item)
    .bind(json!({ "trigger": { "event": "issues", "action": "labeled" } }))
    .execute(pool)
    .await
    .expect("the blocked event");
    sqlx::query(
        "INSERT INTO item_cycle_budgets (org_id, project_id, item_id, workflow_id, generation, cycles_used, asked_at, ask) \
         VALUES ($1, $2, $3, $4, 0, 1, now(), $5)",
    )
    .bind(org)
    .bind(project)
    .bind(item)
    .bind(workflow)
    .bind(json!({ "event": event, "workflow": workflow_name, "cycles_used": 1, "max_cycles": 1 }))
    .execute(pool)
    .await
    .expect("the budget's ask");
    item
}

/// An org, its project `web` and one workflow version, written through the store.
pub struct Seed {
    pub org: crate::ids::OrgId,
    pub project: crate::ids::ProjectId,
    pub workflow: crate::ids::WorkflowId,
    pub version: i32,
}

/// Org `slug` (its owner `owner@<slug>.test`) with project `web`, and `source` as its workflow
/// `wf`; a source that does not validate fails the test.
pub async fn seed(pool: &Db, slug: &str, source: &str) -> Seed {
    use crate::store::{Actor, Change, workflows};
    if let Err(problems) = crate::definition::parse(source) {
        panic!("test workflow does not validate: {problems:?}");
    }
    let mut ch = Change::begin(pool, Actor::System).await.expect("begin the seed");
    let People { org, project, .. } = org_with_people(&mut ch, slug, []).await;
    let (workflow, version) = workflows::put_version(&mut ch, org, project, "wf", source).await.expect("the workflow");
    ch.commit().await.expect("commit the seed");
    Seed { org, project, workflow, version }
}

/// An org with its project `web`, its owner, and a member per role ([`org_with_people`]).
pub struct People<const N: usize> {
    pub org: crate::ids::OrgId,
    pub project: crate::ids::ProjectId,
    pub owner: crate::ids::UserId,
    /// A member per role, in the order the roles were given.
    pub members: [crate::ids::UserId; N],
}

/// Org `slug` (its owner `owner@<slug>.test`) with project `web` and, for each of `roles`, a
/// member `<role>@<slug>.test`, written in `ch`. Their tokens are the caller's to issue: that
/// needs the API crate.
pub async fn org_with_people<const N: usize>(ch: &mut crate::store::Change, slug: &str, roles: [&str; N]) -> People<N> {
    use crate::ids::Slug;
    use crate::store::{api_writes, tenants};
    let org_slug = Slug::parse(slug).unwrap_or_else(|e| panic!("the org's slug: {e:?}"));
    let (org, owner) = tenants::create_org(ch, &org_slug, slug, &format!("owner@{slug}.test")).await.expect("the org");
    let project = tenants::create_project(ch, org, &Slug::parse("web").expect("a slug"), "web").await.expect("the project");
    let mut members = [owner; N];
    for (member, role) in members.iter_mut().zip(roles) {
        *member = api_writes::add_member(ch, org, &format!("{role}@{slug}.test"), role).await.unwrap_or_else(|e| panic!("the {role}: {e}"));
    }
    People { org, project, owner, members }
}

/// A run of the seeded workflow with `input`, as a person submits it: no item, trigger event,
/// parent or approval.
pub fn new_run(s: &Seed, input: serde_json::Value) -> crate::store::runs::NewRun {
    crate::store::runs::NewRun::of_workflow(s.org, s.project, s.workflow, s.version, input)
}

/// A webhook subscription of `project` to `events` at `url`, with a secret made for it and
/// sealed with [`SECRET_KEY`], as the API makes one; loopback and private URLs are allowed.
pub async fn subscribe(ch: &mut crate::store::Change, org: crate::ids::OrgId, project: crate::ids::ProjectId, url: &str, events: &[&str]) -> uuid::Uuid {
    use crate::store::webhooks_out::{NewSubscription, create};
    let events: Vec<String> = events.iter().map(|e| (*e).to_owned()).collect();
    let new = NewSubscription { org, project, url, secret: None, events: &events };
    let (id, _) = create(ch, &secret_key(), new, crate::net_guard::Policy { allow_private: true }).await.unwrap_or_else(|e| panic!("subscribe {url}: {e}"));
    id
}

/// The workflow `approve`: an approval `ask` with one required field, `ticket`, then an output
/// `ship` that comments.
pub const APPROVAL: &str = include_str!("../../tests/workflows/approve.yaml");

/// The nodes of a fan-out, a join and a gate that loops back once, which several tests walk:
/// `plan`; `left` and `right` after it; `ci` after both, sending the run back to `left` when
/// its check fails. Each test adds what follows `ci`.
pub const FAN_OUT_JOIN_LOOP: &str = "  plan:
    crew: { harness: claude-code, prompt: plan }
  left:
    after: [plan]
    crew: { harness: claude-code, prompt: left }
  right:
    after: [plan]
    crew: { harness: claude-code, prompt: right }
  ci:
    after: [left, right]
    gate: { checks: [test], on_fail: left }
";

/// The workflow `join-and-loop`: [`FAN_OUT_JOIN_LOOP`], then an output `ship` after `ci` that
/// comments `body`. With the test executor, a run takes seven steps: plan, left, right, ci
/// (fails), left, ci, ship.
pub fn join_and_loop(body: &str) -> String {
    format!("name: join-and-loop\nnodes:\n{FAN_OUT_JOIN_LOOP}  ship:\n    after: [ci]\n    output: {{ github: comment, body: {body} }}\n")
}

/// The configuration of an engine pool in a test's own process: `id`, its `LISTEN` connection
/// to `listen_url`, 64 wakes a batch and 64 steps at once, a 5 s drain, no GitHub outputs, the
/// default webhook policy and event-wait timeout, and `test_executor` (or `None`: crew, gate
/// and output steps wait for hosts).
pub fn pool_config(id: &str, listen_url: &str, test_executor: Option<crate::executor::TestExecutor>) -> crate::pool::PoolConfig {
    crate::pool::PoolConfig {
        id: id.to_owned(),
        listen: listen_url.parse().unwrap_or_else(|e| panic!("the listen URL {listen_url}: {e:?}")),
        batch: 64,
        max_in_flight: 64,
        drain: Duration::from_secs(5),
        test_executor,
        outputs: None,
        webhooks: crate::jobs::WebhookClient::new(crate::net_guard::Policy::default(), secret_key()).unwrap_or_else(|e| panic!("the webhook client: {e:?}")),
        event_wait_timeout: crate::advance::EVENT_WAIT_TIMEOUT,
    }
}

/// An engine pool running in the test's own process until it is stopped.
pub struct Engine {
    /// Asks it to drain: it stops claiming and finishes what it holds.
    pub drain: tokio_util::sync::CancellationToken,
    /// Stops it at once.
    pub abort: tokio_util::sync::CancellationToken,
    /// Its task, which ends once it has stopped.
    pub task: tokio::task::JoinHandle<Result<(), crate::store::StoreError>>,
}

impl Engine {
    /// Runs an engine pool with `cfg` on `pool` (see [`pool_config`]).
    pub fn start(pool: &Db, cfg: crate::pool::PoolConfig) -> Engine {
        let (drain, abort) = (tokio_util::sync::CancellationToken::new(), tokio_util::sync::CancellationToken::new());
        let task = tokio::spawn(crate::pool::run(pool.clone(), cfg, drain.clone(), abort.clone()));
        Engine { drain, abort, task }
    }

    /// Runs an engine pool `id` on the test's database with the test executor, which runs crew,
    /// gate and output steps itself and records each execution in `effects` when given.
    pub fn executing(db: &TestDb, id: &str, effects: Option<&std::path::Path>) -> Engine {
        let executor = crate::executor::TestExecutor { effects: effects.map(std::path::Path::to_path_buf) };
        Engine::start(&db.pool, pool_config(id, &db.url, Some(executor)))
    }

    /// Drains and aborts at once: the test is over.
    pub fn stop(&self) {
        self.drain.cancel();
        self.abort.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn with_database_replaces_only_the_path() {
        assert_eq!(with_database("postgres://u@h:1/db", "t"), "postgres://u@h:1/t");
        assert_eq!(with_database("postgres://u@h:1", "t"), "postgres://u@h:1/t");
        assert_eq!(with_database("postgres://u:p@h/db?sslmode=disable", "t"), "postgres://u:p@h/t?sslmode=disable");
    }
}
