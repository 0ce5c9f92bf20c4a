//! Shared test data: an org, a project and a workflow written through the store.

use engine::ids::{OrgId, ProjectId, RunId, Slug, WorkflowId};
use engine::store::runs::{self, NewRun};
use engine::store::{tenants, workflows, Actor, Change};
use serde_json::json;
use engine::db::Db;

pub(crate) const TWO_STEPS: &str = "name: two-steps
nodes:
  a:
    crew: { harness: claude-code, prompt: \"do a\" }
  b:
    after: [a]
    crew: { harness: claude-code, prompt: \"do b\" }
";

pub(crate) struct Seed {
    pub(crate) org: OrgId,
    pub(crate) project: ProjectId,
    pub(crate) workflow: WorkflowId,
    pub(crate) version: i32,
}

pub(crate) async fn seed(pool: &Db, slug: &str, source: &str) -> Seed {
    if let Err(problems) = engine::definition::parse(source) {
        panic!("test workflow does not validate: {problems:?}");
    }
    let mut ch = Change::begin(pool, Actor::System).await.unwrap();
    let (org, _) = tenants::create_org(&mut ch, &Slug::parse(slug).unwrap(), slug, "owner@example.com").await.unwrap();
    let project = tenants::create_project(&mut ch, org, &Slug::parse("web").unwrap(), "web").await.unwrap();
    let (workflow, version) = workflows::put_version(&mut ch, org, project, "wf", source).await.unwrap();
    ch.commit().await.unwrap();
    Seed { org, project, workflow, version }
}

pub(crate) fn new_run(s: &Seed) -> NewRun {
    NewRun {
        org: s.org,
        project: s.project,
        workflow: s.workflow,
        version: s.version,
        input: json!({}),
        item: None,
        trigger_event: None,
        parent: None,
        dry_run: false,
        needs_approval: false,
        source: None,
    }
}

pub(crate) async fn submit(pool: &Db, s: &Seed) -> RunId {
    let mut ch = Change::begin(pool, Actor::System).await.unwrap();
    let run = runs::submit(&mut ch, new_run(s)).await.unwrap();
    ch.commit().await.unwrap();
    run
}

pub(crate) async fn count(pool: &Db, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}
