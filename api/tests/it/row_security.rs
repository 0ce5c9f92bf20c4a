//! Row-level security (migration 0016), the second wall behind the handlers' `WHERE org_id`:
//! under the tenant role a connection sees only the rows of the org in `shopfloor.org`, none
//! without one, and may write no other org's row; every table with an `org_id` column has the
//! wall; and the hot reads keep their indexes under it.

use engine::db::Db;
use engine::ids::{OrgId, RunId};
use engine::tenancy::TENANT_ROLE;
use reqwest::{Method, StatusCode};
use serde_json::json;
use sqlx::PgConnection;

use crate::support::{App, Org};

/// The tables of the schema whose rows the policies guard.
async fn guarded_tables(pool: &Db) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
          WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND c.relrowsecurity ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The tables with an `org_id` column, and whether they have row security.
async fn org_tables(pool: &Db) -> Vec<(String, bool)> {
    sqlx::query_as(
        "SELECT c.relname::text, c.relrowsecurity FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'org_id' AND NOT a.attisdropped \
          WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A connection as the tenant role acting for `org` (none: `None`).
async fn tenant(pool: &Db, org: Option<OrgId>) -> sqlx::pool::PoolConnection<sqlx::Postgres> {
    let mut conn = pool.pool().acquire().await.unwrap();
    sqlx::query(&format!("SET ROLE {TENANT_ROLE}")).execute(&mut *conn).await.unwrap();
    sqlx::query("SELECT set_config('shopfloor.org', $1, false)").bind(org.map(|o| o.0.to_string()).unwrap_or_default()).execute(&mut *conn).await.unwrap();
    conn
}

async fn count(conn: &mut PgConnection, sql: &str, org: Option<OrgId>) -> i64 {
    let q = sqlx::query_scalar(sql);
    let q = match org {
        Some(o) => q.bind(o),
        None => q,
    };
    q.fetch_one(conn).await.unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// An app with an engine and two orgs seeded through the API: a run of each waiting at its
/// approval (runs, steps, events, audit, approvals, wakes), a webhook subscription and a budget
/// each; with the app's pool.
async fn seeded() -> (App, Org, Org, Db) {
    let app = App::with_engine().await;
    let [acme, other] = app.orgs(["acme", "other"]).await;
    for (slug, org) in [("acme", &acme), ("other", &other)] {
        let run: RunId =
            app.created(&format!("/api/v1/orgs/{slug}/projects/web/runs"), &org.member, &json!({ "workflow": "approve", "input": {} })).await.parse().unwrap();
        app.until(run, "SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'ask' AND state = 'waiting')", "ask waiting").await;
        let hook = json!({ "url": "https://hooks.example.com/x", "events": ["run.succeeded"] });
        app.json(Method::POST, &format!("/api/v1/orgs/{slug}/projects/web/webhooks"), &org.admin, Some(&hook), StatusCode::CREATED).await;
        app.json(Method::PUT, &format!("/api/v1/orgs/{slug}/budgets/day"), &org.admin, Some(&json!({ "usd_limit": 10 })), StatusCode::OK).await;
    }
    let pool = app.pool().clone();
    (app, acme, other, pool)
}

#[tokio::test]
async fn the_tenant_role_sees_and_writes_only_its_orgs_rows() {
    let (app, acme, other, pool) = seeded().await;

    // No table with an org_id column forgets the wall.
    let orgs = org_tables(&pool).await;
    let bare: Vec<&String> = orgs.iter().filter(|(_, rls)| !rls).map(|(t, _)| t).collect();
    assert!(bare.is_empty(), "tables with an org_id column but no row security: {bare:?}");
    let guarded = guarded_tables(&pool).await;
    assert!(guarded.len() > orgs.len(), "github_installation_repositories is guarded too: {guarded:?}");

    // The owner sees both orgs' rows in the seeded tables.
    let mut seeded = Vec::new();
    for (table, _) in &orgs {
        let theirs = count(pool.pool().acquire().await.unwrap().as_mut(), &format!("SELECT count(*) FROM {table} WHERE org_id = $1"), Some(other.id)).await;
        if theirs > 0 {
            seeded.push(table.clone());
        }
    }
    for must in [
        "orgs",
        "users",
        "memberships",
        "api_tokens",
        "projects",
        "workflows",
        "runs",
        "steps",
        "run_events",
        "audit_log",
        "approvals",
        "webhook_subscriptions",
        "budgets",
    ] {
        assert!(seeded.iter().any(|t| t == must), "{must} was not seeded for the other org: {seeded:?}");
    }

    // No org set: nothing at all, in every guarded table.
    let mut none = tenant(&pool, None).await;
    for table in &guarded {
        assert_eq!(count(&mut none, &format!("SELECT count(*) FROM {table}"), None).await, 0, "{table} shows rows to no org");
    }
    drop(none);

    // Acme set: its own rows, none of the other org's, in every table.
    let mut conn = tenant(&pool, Some(acme.id)).await;
    for table in &seeded {
        assert!(count(&mut conn, &format!("SELECT count(*) FROM {table}"), None).await > 0, "{table} hides acme's own rows from acme");
    }
    for (table, _) in &orgs {
        let foreign = count(&mut conn, &format!("SELECT count(*) FROM {table} WHERE org_id IS DISTINCT FROM $1"), Some(acme.id)).await;
        assert_eq!(foreign, 0, "{table} shows acme rows of another org");
    }

    // Writing the other org's row under acme's setting is refused by WITH CHECK, and so is
    // moving one of acme's rows to it.
    let err = sqlx::query("INSERT INTO projects (org_id, project_id, slug, name) VALUES ($1, gen_random_uuid(), 'sneaky', 'sneaky')")
        .bind(other.id)
        .execute(&mut *conn)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("row-level security"), "{err}");
    let err = sqlx::query("UPDATE projects SET org_id = $1 WHERE org_id = $2").bind(other.id).bind(acme.id).execute(&mut *conn).await.unwrap_err();
    assert!(err.to_string().contains("row-level security"), "{err}");
    // The other org's rows cannot be reached to change or delete.
    let touched = sqlx::query("UPDATE runs SET reason = 'x' WHERE org_id = $1").bind(other.id).execute(&mut *conn).await.unwrap().rows_affected();
    assert_eq!(touched, 0);
    let touched = sqlx::query("DELETE FROM webhook_subscriptions WHERE org_id = $1").bind(other.id).execute(&mut *conn).await.unwrap().rows_affected();
    assert_eq!(touched, 0);
    drop(conn);
    app.finish().await;
}

#[tokio::test]
async fn hot_reads_use_their_indexes_under_the_tenant_role() {
    let (app, acme, _, pool) = seeded().await;
    let mut conn = tenant(&pool, Some(acme.id)).await;
    // Few rows: forbid scans where an index can serve, as the other plan tests do.
    sqlx::query("SET enable_seqscan = off").execute(&mut *conn).await.unwrap();
    let org = format!("'{}'::uuid", acme.id);
    let project = format!("'{}'::uuid", acme.project);
    let run = format!("(SELECT run_id FROM runs WHERE org_id = {org} LIMIT 1)");
    let reads = [
        (
            "runs by org and project, newest first",
            format!("SELECT run_id FROM runs r WHERE r.org_id = {org} AND r.project_id = {project} ORDER BY r.run_id DESC LIMIT 50"),
        ),
        ("a run by id", format!("SELECT * FROM runs WHERE run_id = {run} AND org_id = {org} AND project_id = {project}")),
        ("a run's steps", format!("SELECT * FROM steps WHERE run_id = {run} AND org_id = {org}")),
        (
            "the project event stream",
            format!(
                "SELECT run_id, seq FROM run_events WHERE org_id = {org} AND project_id = {project} AND (xid, event_id) > ('0'::xid8, 0) AND xid < (SELECT shopfloor_event_horizon()) ORDER BY xid, event_id LIMIT 200"
            ),
        ),
        ("a project by slug", format!("SELECT project_id FROM projects WHERE org_id = {org} AND slug = 'web'")),
    ];
    for (what, sql) in reads {
        let plan = shopfloor_tests::plan(&mut conn, &sql).await;
        assert!(!plan.contains("Seq Scan"), "{what} scans under the tenant role:\n{sql}\n{plan}");
        assert!(plan.contains("Index"), "{what} uses no index under the tenant role:\n{sql}\n{plan}");
    }
    drop(conn);
    app.finish().await;
}

#[tokio::test]
async fn the_tenant_pool_acts_for_the_scopes_org_and_for_none_outside_one() {
    let (app, acme) = App::start().await.with_acme().await;
    let state = api::http::AppState::new(app.pool().clone(), app.db.url.parse().unwrap(), engine::testkit::secret_key());
    let who = "SELECT current_user::text, current_setting('shopfloor.org', true), (SELECT count(*) FROM projects)";
    let read = |db: Db| async move { sqlx::query_as::<_, (String, Option<String>, i64)>(who).fetch_one(&db).await.unwrap() };

    let (role, org, projects) = engine::tenancy::scoped(Some(acme.id), read(state.db.clone())).await;
    assert_eq!((role.as_str(), org.as_deref(), projects), (TENANT_ROLE, Some(acme.id.to_string().as_str()), 1));
    // The same connections, handed out again outside any scope: no org, no rows.
    let (role, org, projects) = read(state.db.clone()).await;
    assert_eq!((role.as_str(), org.as_deref(), projects), (TENANT_ROLE, Some(""), 0));
    // A scope filled later, as a request's is once its caller is verified.
    let filled = engine::tenancy::scoped(None, async {
        let before = read(state.db.clone()).await.2;
        assert!(engine::tenancy::act_for(acme.id));
        (before, read(state.db.clone()).await.2)
    })
    .await;
    assert_eq!(filled, (0, 1));
    // A task spawned from a scope does not inherit it.
    let spawned = engine::tenancy::scoped(Some(acme.id), async { tokio::spawn(read(state.db.clone())).await.unwrap().2 }).await;
    assert_eq!(spawned, 0);
    // The owner's pool sees every org.
    let (role, _, projects) = read(state.system.clone()).await;
    assert_ne!(role, TENANT_ROLE);
    assert_eq!(projects, 1);
    drop(state);
    app.finish().await;
}

#[tokio::test]
async fn without_the_tenant_role_the_tenant_pool_keeps_its_users_role() {
    let app = App::start().await;
    // A user the tenant role was never granted to (as when migration 0016 could not set it
    // up). Roles are cluster-wide: made once, if missing.
    // A password, as the embedded cluster admits no one without.
    sqlx::query(
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'shopfloor_rls_outsider') THEN \
           CREATE ROLE shopfloor_rls_outsider LOGIN; END IF; \
           ALTER ROLE shopfloor_rls_outsider PASSWORD 'outsider'; END $$",
    )
    .execute(app.pool())
    .await
    .unwrap();
    let mut options: sqlx::postgres::PgConnectOptions = app.db.url.parse().unwrap();
    options = options.username("shopfloor_rls_outsider").password("outsider");
    let outsider = Db::from(sqlx::postgres::PgPoolOptions::new().max_connections(1).connect_lazy_with(options));
    let pool = engine::tenancy::tenant(&outsider);
    let who: String = sqlx::query_scalar("SELECT current_user::text").fetch_one(&pool).await.unwrap();
    assert_eq!(who, "shopfloor_rls_outsider", "the connection works, as its own user");
    pool.close().await;
    outsider.close().await;
    app.finish().await;
}

/// Below the policies (which the owner's pool bypasses), the schema pairs a project's rows
/// with the project's org (migration 0025): every table whose project is required keys
/// `(project_id, org_id)` to projects, so not even the owner can store a row of one org that
/// points into another org's project.
#[tokio::test]
async fn no_row_pairs_an_org_with_another_orgs_project() {
    let app = App::start().await;
    let [acme, other] = app.orgs(["acme", "other"]).await;
    let pool = app.pool().clone();

    let unpaired: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
           JOIN pg_attribute p ON p.attrelid = c.oid AND p.attname = 'project_id' AND p.attnotnull AND NOT p.attisdropped \
           JOIN pg_attribute o ON o.attrelid = c.oid AND o.attname = 'org_id' AND NOT o.attisdropped \
          WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relname <> 'projects' \
            AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conrelid = c.oid AND k.contype = 'f' \
                              AND k.confrelid = 'projects'::regclass AND k.conkey @> ARRAY[p.attnum, o.attnum]) \
          ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(unpaired.is_empty(), "tables whose project is not keyed with its org: {unpaired:?}");

    let err = sqlx::query("INSERT INTO items (org_id, project_id, item_id, key, data) VALUES ($1, $2, gen_random_uuid(), 'issue:1', '{}')")
        .bind(acme.id)
        .bind(other.project)
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("items_project_org_fkey"), "{err}");
    let ours = sqlx::query("INSERT INTO items (org_id, project_id, item_id, key, data) VALUES ($1, $2, gen_random_uuid(), 'issue:1', '{}')")
        .bind(acme.id)
        .bind(acme.project)
        .execute(&pool)
        .await;
    assert!(ours.is_ok(), "an item of acme's own project: {ours:?}");
    app.finish().await;
}
