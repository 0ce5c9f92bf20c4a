//! shopfloor behind a real PgBouncer in transaction mode (`tests/pgbouncer.rs`), with so few
//! server connections that every one is shared: each statement gets its own answer; two orgs'
//! concurrent work through the tenant pool never sees the other's rows, nor leaves its role or
//! org to the owner's; and two `shopfloor api` and two `shopfloor engine` processes on
//! `DATABASE_URL` through the pooler (`SHOPFLOOR_LISTEN_DATABASE_URL` direct) run waits,
//! approvals answered on the other replica and a host's crew step to completion, with the other
//! replica's event stream seeing every `run.completed`.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use engine::db::{self, Route};
use engine::ids::{OrgId, RunId, Slug};
use engine::store::{Actor, Change, tenants};
use engine::testkit::test_db;
use serde_json::{Value, json};
use shopfloor_tests::pgbouncer::PgBouncer;
use shopfloor_tests::process::{Proc, free_port, shopfloor};
use shopfloor_tests::shopfloor_bin;
use tokio::task::JoinSet;

use crate::support::{acme, approve, owner_token, put_workflows, registration};

/// Server connections PgBouncer keeps per database and user: fewer than the clients of every
/// test here, so sharing is certain.
const POOL_SIZE: u32 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_statement_through_pgbouncer_gets_its_own_answer() {
    let db = test_db().await;
    let bouncer = PgBouncer::start(&db.url, POOL_SIZE).await;
    let pooled = db::connect_guarded(&bouncer.url(&db.url), 8, Route::Pooler).await.unwrap();
    let mut tasks = JoinSet::new();
    for t in 0..8i64 {
        let pooled = pooled.clone();
        tasks.spawn(async move {
            for i in 0..150i64 {
                // Two statements of different text in turn: a statement bound on another
                // client's prepared one would answer the other sum.
                let n = t * 10_000 + i;
                let one: i64 = sqlx::query_scalar("SELECT $1::int8 + 1").bind(n).fetch_one(&pooled).await.unwrap();
                let two: i64 = sqlx::query_scalar("SELECT $1::int8 + 2").bind(n).fetch_one(&pooled).await.unwrap();
                assert_eq!((one, two), (n + 1, n + 2), "a statement through the pooler answered another's");
                let mut tx = pooled.begin().await.unwrap();
                let three: i64 = sqlx::query_scalar("SELECT $1::int8 + 3").bind(n).fetch_one(&mut *tx).await.unwrap();
                let four: i64 = sqlx::query_scalar("SELECT $1::int8 + 4").bind(n).fetch_one(&mut *tx).await.unwrap();
                tx.commit().await.unwrap();
                assert_eq!((three, four), (n + 3, n + 4), "a statement in a transaction through the pooler answered another's");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap_or_else(|e| panic!("{e}; pgbouncer's log:\n{}", bouncer.log()));
    }
    // The serving limits hold on the pooler's route too, set for each transaction (the
    // keepalives are the pooler's own, on its links to the server).
    for (name, value) in db::GUARDS.iter().filter(|(name, _)| !name.starts_with("tcp_")) {
        let shown: String = sqlx::query_scalar(&format!("SELECT current_setting('{name}')")).fetch_one(&pooled).await.unwrap();
        assert_eq!(shown, *value, "{name} through the pooler");
    }
    pooled.close().await;
    drop(bouncer);
    db.finish().await;
}

/// What one task saw: the backends it ran on.
type Seen = HashSet<i32>;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_orgs_sharing_pgbouncer_server_connections_never_see_each_others_rows() {
    let db = test_db().await;
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    let mut orgs = Vec::new();
    for (slug, projects) in [("acme", 2), ("other", 3)] {
        let (org, _) = tenants::create_org(&mut ch, &Slug::parse(slug).unwrap(), slug, &format!("o@{slug}.example.com")).await.unwrap();
        for p in 0..projects {
            tenants::create_project(&mut ch, org, &Slug::parse(&format!("p{p}")).unwrap(), "P").await.unwrap();
        }
        orgs.push((org, projects));
    }
    ch.commit().await.unwrap();

    let bouncer = PgBouncer::start(&db.url, POOL_SIZE).await;
    let owner = db::connect_guarded(&bouncer.url(&db.url), 8, Route::Pooler).await.unwrap();
    let tenant = engine::tenancy::tenant(&owner);
    let login: String = sqlx::query_scalar("SELECT session_user::text").fetch_one(&db.pool).await.unwrap();

    let mut tasks: JoinSet<Seen> = JoinSet::new();
    for _ in 0..3 {
        for &(org, projects) in &orgs {
            let tenant = tenant.clone();
            tasks.spawn(engine::tenancy::scoped(Some(org), async move { as_tenant(&tenant, Some((org, projects))).await }));
        }
        // No scope: no org, no rows.
        let tenant = tenant.clone();
        tasks.spawn(async move { as_tenant(&tenant, None).await });
        // The owner, on the same server connections: every row, and nothing a tenant set.
        let (owner, login) = (owner.clone(), login.clone());
        tasks.spawn(async move {
            let mut seen = Seen::new();
            for _ in 0..100 {
                let (pid, user, org, projects): (i32, String, Option<String>, i64) =
                    sqlx::query_as("SELECT pg_backend_pid(), current_user::text, current_setting('shopfloor.org', true), (SELECT count(*) FROM projects)")
                        .fetch_one(&owner)
                        .await
                        .unwrap();
                assert_eq!(user, login, "a tenant's role outlived its transaction");
                assert!(org.as_deref().unwrap_or("").is_empty(), "a tenant's org outlived its transaction: {org:?}");
                assert_eq!(projects, 5, "the owner sees every org's projects");
                seen.insert(pid);
            }
            seen
        });
    }
    let mut backends = Seen::new();
    let mut clients = 0;
    while let Some(done) = tasks.join_next().await {
        backends.extend(done.unwrap_or_else(|e| panic!("{e}; pgbouncer's log:\n{}", bouncer.log())));
        clients += 1;
    }
    // The test means something only if the clients really shared server sessions.
    assert!(backends.len() <= POOL_SIZE as usize && clients > backends.len(), "{clients} clients on the backends {backends:?}");
    tenant.close().await;
    owner.close().await;
    drop(bouncer);
    db.finish().await;
}

/// Reads the projects as the tenant, in single statements and in transactions of several,
/// checking that only `org`'s are seen (`None`: none at all).
async fn as_tenant(tenant: &db::Db, org: Option<(OrgId, i64)>) -> Seen {
    let mut seen = Seen::new();
    let (want_org, want) = match org {
        Some((org, n)) => (Some(org.0), n),
        None => (None, 0),
    };
    for _ in 0..100 {
        let found: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT org_id FROM projects").fetch_all(tenant).await.unwrap();
        assert_eq!(found.len() as i64, want, "{want_org:?} saw the projects of {found:?}");
        assert!(found.iter().all(|o| Some(*o) == want_org), "{want_org:?} saw the projects of {found:?}");
        let mut tx = tenant.begin().await.unwrap();
        let (pid, user, setting): (i32, String, String) =
            sqlx::query_as("SELECT pg_backend_pid(), current_user::text, current_setting('shopfloor.org')").fetch_one(&mut *tx).await.unwrap();
        assert_eq!(user, engine::tenancy::TENANT_ROLE);
        assert_eq!(setting, want_org.map(|o| o.to_string()).unwrap_or_default());
        let others: i64 = sqlx::query_scalar("SELECT count(*) FROM orgs WHERE org_id IS DISTINCT FROM $1").bind(want_org).fetch_one(&mut *tx).await.unwrap();
        assert_eq!(others, 0, "{want_org:?} saw another org");
        tx.commit().await.unwrap();
        seen.insert(pid);
    }
    seen
}

const BUILD: &str = include_str!("../workflows/build_then_nap.yaml");
const ASK: &str = include_str!("../workflows/ask.yaml");
const NAP: &str = include_str!("../workflows/nap.yaml");

/// Runs of each workflow.
const RUNS: usize = 4;

#[tokio::test(flavor = "multi_thread")]
async fn two_apis_and_two_engines_behind_pgbouncer_run_workflows_to_completion() {
    let db = test_db().await;
    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    let acme = acme(&mut ch).await;
    put_workflows(&mut ch, acme.org, acme.project, &[BUILD, ASK, NAP]).await;
    let token = owner_token(&mut ch, &acme, "test", 2).await;
    ch.commit().await.unwrap();

    let bouncer = PgBouncer::start(&db.url, 4).await;
    let pooled_url = bouncer.url(&db.url);
    let dir = tempfile::tempdir().unwrap();
    let spawn = |name: &str, args: &[&str], port: Option<u16>| {
        let log = std::fs::File::create(dir.path().join(format!("{name}.log"))).unwrap();
        let mut cmd = shopfloor(args, &pooled_url);
        cmd.env("SHOPFLOOR_LISTEN_DATABASE_URL", &db.url).env("SHOPFLOOR_DRAIN_SECS", "2").stderr(Stdio::from(log));
        if let Some(port) = port {
            cmd.env("SHOPFLOOR_LISTEN", format!("127.0.0.1:{port}"));
        }
        Proc(cmd.spawn().expect("spawn shopfloor"))
    };
    let ports = [free_port(), free_port()];
    let bases: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let mut procs = vec![spawn("api-1", &["api", "--log", "warn"], Some(ports[0])), spawn("api-2", &["api", "--log", "warn"], Some(ports[1]))];
    for base in &bases {
        shopfloor_tests::until_ok(&format!("{base}/readyz")).await;
    }
    procs.push(spawn("engine-1", &["engine", "--engine-id", "e1", "--log", "warn"], None));
    procs.push(spawn("engine-2", &["engine", "--engine-id", "e2", "--log", "warn"], None));

    // The second replica's event stream, open before anything runs.
    let http = reqwest::Client::new();
    let stream = http.get(format!("{}/api/v1/orgs/acme/projects/web/events", bases[1])).bearer_auth(&token).send().await.unwrap();
    assert_eq!(stream.status(), 200);
    let (completed_tx, mut completed) = tokio::sync::mpsc::unbounded_channel::<RunId>();
    let reader = tokio::spawn(async move {
        let mut stream = stream;
        let mut buffer = String::new();
        while let Ok(Some(chunk)) = stream.chunk().await {
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buffer.find("\n\n") {
                let frame: String = buffer.drain(..end + 2).collect();
                for data in frame.lines().filter_map(|l| l.strip_prefix("data:")) {
                    let Ok(event) = serde_json::from_str::<Value>(data.trim()) else { continue };
                    if event["kind"] == "run.completed" {
                        if let Some(run) = event["run"].as_str().and_then(|r| r.parse().ok()) {
                            let _ = completed_tx.send(run);
                        }
                    }
                }
            }
        }
    });

    // A host on the first replica runs the crew steps.
    let host_token = registration(&bases[0], &token, "builder").await;
    procs.push(host(&bases[0], &host_token, dir.path()));

    // Runs submitted on both replicas in turn.
    let mut runs: Vec<(RunId, &str, usize)> = Vec::new();
    for _ in 0..RUNS {
        for workflow in ["build", "ask", "nap"] {
            let on = runs.len() % 2;
            let answer = http
                .post(format!("{}/api/v1/orgs/acme/projects/web/runs", bases[on]))
                .bearer_auth(&token)
                .json(&json!({ "workflow": workflow, "input": {} }))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), 201, "submit {workflow} on replica {on}: {}", answer.text().await.unwrap_or_default());
            let run: Value = answer.json().await.unwrap();
            runs.push((run["id"].as_str().unwrap().parse().unwrap(), workflow, on));
        }
    }

    // Each approval is answered on the replica that did not take the run.
    let everything = async {
        for &(run, workflow, on) in &runs {
            if workflow != "ask" {
                continue;
            }
            let other = &bases[1 - on];
            loop {
                let answer = approve(&http, other, &token, run, "ask").await;
                if answer.status().is_success() {
                    break;
                }
                // Not asked yet: the run has not reached its approval.
                assert_eq!(answer.status(), 409, "approve {run} on the other replica: {}", answer.text().await.unwrap_or_default());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let want: BTreeSet<RunId> = runs.iter().map(|r| r.0).collect();
        let mut seen = BTreeSet::new();
        while !want.is_subset(&seen) {
            seen.insert(completed.recv().await.expect("the event stream ended"));
        }
    };
    if tokio::time::timeout(Duration::from_secs(300), everything).await.is_err() {
        let states: Vec<(String, String, Option<String>)> =
            sqlx::query_as("SELECT run_id::text, status, reason FROM runs ORDER BY run_id").fetch_all(&db.pool).await.unwrap_or_default();
        panic!("not every run completed and was streamed: {states:?}\n{}", logs(dir.path(), &bouncer));
    }
    let statuses: Vec<String> = sqlx::query_scalar("SELECT DISTINCT status FROM runs").fetch_all(&db.pool).await.unwrap();
    assert_eq!(statuses, ["completed"]);
    // The crew steps ran on the host, each once.
    let crew: Vec<(String, i64)> =
        sqlx::query_as("SELECT holder, count(*) FROM steps WHERE node = 'build' AND state = 'succeeded' GROUP BY holder").fetch_all(&db.pool).await.unwrap();
    assert!(crew.len() == 1 && crew[0].0.starts_with("host:") && crew[0].1 == RUNS as i64, "crew steps: {crew:?}");
    reader.abort();
    drop(procs);
    let logged = logs(dir.path(), &bouncer);
    let shopfloor = &logged[..logged.find("--- pgbouncer").unwrap_or(logged.len())];
    assert!(!logged.contains("prepared statement") && !shopfloor.contains("\"ERROR\""), "a process hit the pooler:\n{logged}");
    drop(bouncer);
    db.finish().await;
}

/// `shopfloor host` on `server`, advertising the `command` harness.
fn host(server: &str, token: &str, dir: &Path) -> Proc {
    let log = std::fs::File::create(dir.join("host.log")).unwrap();
    let child = Command::new(shopfloor_bin())
        .args(["host", "--log", "warn", "--capabilities", "linux,harness:command", "--name", "builder", "--max-concurrent", "2"])
        .arg("--server")
        .arg(server)
        .arg("--work-dir")
        .arg(dir.join("host"))
        .env("SHOPFLOOR_HOST_TOKEN", token)
        .env("SHOPFLOOR_HOST_HEARTBEAT_SECS", "2")
        .env("SHOPFLOOR_DRAIN_SECS", "2")
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn shopfloor host");
    Proc(child)
}

/// Every process's log, and PgBouncer's.
fn logs(dir: &Path, bouncer: &PgBouncer) -> String {
    let mut all = String::new();
    for name in ["api-1", "api-2", "engine-1", "engine-2", "host"] {
        let text = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        all.push_str(&format!("--- {name}\n{text}"));
    }
    all.push_str(&format!("--- pgbouncer\n{}", bouncer.log()));
    all
}
