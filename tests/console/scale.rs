//! Every page on a project with 10,000 runs (and as many in a second org): the statements it
//! sends are few and do not grow with the data (no N+1), the large tables are read through
//! indexes only (no sequential scan in the plan of any statement the page sends), and the
//! server time is printed. The pages are served in-process on this test's one thread inside a
//! `console_page` span, so a tracing layer can count the statements sqlx sends for the page
//! and read their plans: the page's connections load `auto_explain`, which sends each
//! statement's plan back as a notice. Nothing else the database does meanwhile (another
//! pool's event hub, autovacuum) is charged to the page. The tenant pool's `set_config` of the
//! role and the request's org, sent at the start of each of its transactions
//! (`engine::tenancy`; a single statement is a transaction of its own), is counted apart: it is
//! one per transaction, so it follows the page's statements and cannot hide an N+1 of them;
//! the `BEGIN`, `COMMIT` and `ROLLBACK` around them are not the page's reads and are not counted.

use std::cell::{Cell, RefCell};
use std::str::FromStr as _;
use std::time::Instant;

use api::http::AppState;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use engine::ids::RunId;
use tower::ServiceExt as _;
use tracing::Instrument as _;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use crate::support::{App, acme_pages, app as console_app};

thread_local! {
    static STATEMENTS: Cell<usize> = const { Cell::new(0) };
    /// The tenant pool's `SELECT (SELECT set_config('role', …` at the start of each transaction.
    static SCOPES: Cell<usize> = const { Cell::new(0) };
    /// `table: statement` for each sequential scan of a large table in a page's plans.
    static SCANS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// The span a page is served in; only what happens inside it is counted.
pub(crate) const PAGE_SPAN: &str = "console_page";

/// Counts sqlx's statement events, and reads the plans `auto_explain` sends back, of the page
/// being served on this thread.
pub(crate) struct CountStatements;

/// What a statement event is: the tenant pool's setting of the role and org at the start of a
/// transaction, the transaction's own `BEGIN`/`COMMIT`/`ROLLBACK` (not the page's reads), or the
/// page's own.
#[derive(Default)]
struct IsScope(Option<bool>);

impl tracing::field::Visit for IsScope {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() != "summary" {
            return;
        }
        if value.starts_with("SELECT (SELECT set_config('role',") {
            self.0 = Some(true);
        } else if matches!(value.trim(), "BEGIN" | "COMMIT" | "ROLLBACK") {
            self.0 = Some(false);
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "summary" {
            self.record_str(field, format!("{value:?}").trim_matches('"'));
        }
    }
}

/// The message of a notice: with `auto_explain`, a statement's text and plan.
#[derive(Default)]
struct Message(String);

impl tracing::field::Visit for Message {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            value.clone_into(&mut self.0);
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

/// The large tables a plan reads sequentially (`Seq Scan on steps s`, `Parallel Seq Scan on …`).
fn sequential_scans(plan: &str) -> Vec<&str> {
    plan.match_indices("Seq Scan on ")
        .filter_map(|(at, m)| plan[at + m.len()..].split(|c: char| !(c.is_alphanumeric() || c == '_')).next())
        .filter(|table| LARGE.contains(table))
        .collect()
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for CountStatements {
    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let in_page = ctx.event_scope(event).is_some_and(|mut scope| scope.any(|span| span.name() == PAGE_SPAN));
        if !in_page {
            return;
        }
        match event.metadata().target() {
            "sqlx::query" => {
                let mut scope = IsScope::default();
                event.record(&mut scope);
                let counter = match scope.0 {
                    Some(true) => &SCOPES,
                    Some(false) => return,
                    None => &STATEMENTS,
                };
                counter.with(|c| c.set(c.get() + 1));
            }
            "sqlx::postgres::notice" => {
                let mut plan = Message::default();
                event.record(&mut plan);
                let statement = plan.0.lines().find_map(|l| l.strip_prefix("Query Text: ")).unwrap_or("?").to_owned();
                for table in sequential_scans(&plan.0) {
                    SCANS.with(|s| s.borrow_mut().push(format!("{table}: {statement}")));
                }
            }
            _ => {}
        }
    }
}

/// What the layer must see: sqlx's statements and notices, and the page span.
pub(crate) fn counted(m: &tracing::Metadata<'_>) -> bool {
    matches!(m.target(), "sqlx::query" | "sqlx::postgres::notice") || m.name() == PAGE_SPAN
}

/// Tables large enough that a sequential scan of them on a page is a missing index.
const LARGE: &[&str] = &["runs", "steps", "run_events", "approvals", "audit_log", "step_logs", "wakes", "step_sessions"];

/// A pool whose connections send each statement's plan back as a notice (`auto_explain`,
/// loaded at connection start: the test's database user is a superuser).
fn explaining_pool(url: &str) -> engine::db::Db {
    let options = sqlx::postgres::PgConnectOptions::from_str(url).unwrap().options([
        ("session_preload_libraries", "auto_explain"),
        ("auto_explain.log_min_duration", "0"),
        ("auto_explain.log_level", "notice"),
        ("auto_explain.log_nested_statements", "on"),
    ]);
    engine::db::Db::from(sqlx::postgres::PgPoolOptions::new().max_connections(4).connect_lazy_with(options))
}

/// Seeds `n` runs of every status in the org's project, with their steps, events, approvals
/// (a few open), audit entries, sessions and transcripts, as the engine would have written
/// them. Test data only: production writes go through the store.
async fn seed(pool: &engine::db::Db, org: &crate::support::Org, n: i64) {
    let sql = [
        "INSERT INTO runs (org_id, project_id, run_id, workflow_id, workflow_version, status, reason, created_by, created_at, started_at, ended_at) \
         SELECT $1, $2, gen_random_uuid(), CASE WHEN g % 2 = 0 THEN $3 ELSE $4 END, 1, \
                CASE WHEN g % 10 = 0 THEN 'running' WHEN g % 10 IN (1, 2) THEN 'failed' WHEN g % 10 = 3 THEN 'cancelled' ELSE 'completed' END, \
                CASE WHEN g % 10 IN (1, 2) THEN 'gate_failed' END, 'seed', \
                now() - make_interval(secs => g * 30), now() - make_interval(secs => g * 30 - 1), \
                CASE WHEN g % 10 <> 0 THEN now() - make_interval(secs => g * 30 - 20) END \
         FROM generate_series(1, $5::int) g",
        "INSERT INTO steps (org_id, run_id, step_id, node, kind, visit, attempt, state, started_seq, finished_seq, created_at, started_at, ended_at) \
         SELECT r.org_id, r.run_id, gen_random_uuid(), n.node, n.kind, 1, 1, \
                CASE WHEN r.status = 'running' AND n.node = 'review' THEN 'waiting' WHEN r.status = 'running' THEN 'pending' \
                     WHEN r.status = 'failed' AND n.node = 'settle' THEN 'failed' ELSE 'succeeded' END, \
                n.i, n.i + 1, r.created_at + make_interval(secs => n.i), r.created_at + make_interval(secs => n.i), \
                CASE WHEN r.status <> 'running' THEN r.created_at + make_interval(secs => n.i * 5) END \
         FROM runs r CROSS JOIN (VALUES (1, 'review', 'approval'), (2, 'settle', 'wait')) n(i, node, kind) \
         WHERE r.org_id = $1 AND (r.status <> 'running' OR n.node = 'review')",
        "INSERT INTO approvals (org_id, step_id, run_id, node, prompt, fields, deadline, decision, answer) \
         SELECT s.org_id, s.step_id, s.run_id, 'review', 'Ship the release?', '{\"ticket\": {\"type\": \"string\", \"required\": true}}', now() + interval '1 day', \
                CASE WHEN s.state = 'waiting' THEN NULL ELSE 'approved' END, CASE WHEN s.state = 'waiting' THEN NULL ELSE '{\"ticket\": \"T\"}'::jsonb END \
         FROM steps s WHERE s.org_id = $1 AND s.node = 'review'",
        "INSERT INTO run_events (org_id, project_id, run_id, run_created_at, seq, kind, node, attrs) \
         SELECT r.org_id, r.project_id, r.run_id, r.created_at, k.seq, k.kind, k.node, '{}' FROM runs r \
         CROSS JOIN (VALUES (1, 'run.started', NULL), (2, 'step.created', 'review'), (3, 'step.succeeded', 'review'), (4, 'run.completed', NULL)) k(seq, kind, node) \
         WHERE r.org_id = $1",
        "INSERT INTO audit_log (org_id, project_id, actor_kind, actor_id, action, target_kind, target_id, at) \
         SELECT $1, $2, 'engine', 'e1', 'run.completed', 'run', r.run_id::text, coalesce(r.ended_at, r.created_at) FROM runs r WHERE r.org_id = $1",
        "INSERT INTO wakes (org_id, run_id, step_id, due_at, reason) \
         SELECT s.org_id, s.run_id, s.step_id, now() + interval '1 day', 'timeout' FROM steps s WHERE s.org_id = $1 AND s.state = 'waiting'",
        "INSERT INTO hosts (org_id, project_id, host_id, name, capabilities, max_concurrent, last_seen_at) \
         VALUES ($1, $2, gen_random_uuid(), 'seed-host', '{linux}', 4, now())",
        "INSERT INTO step_sessions (org_id, run_id, step_id, host_id, harness, input_tokens, output_tokens, cost_usd, turns) \
         SELECT s.org_id, s.run_id, s.step_id, (SELECT host_id FROM hosts WHERE org_id = $1 LIMIT 1), 'command', 1000, 100, 0.01, 3 \
         FROM steps s WHERE s.org_id = $1 AND s.node = 'settle'",
        "INSERT INTO step_logs (org_id, run_id, run_created_at, step_id, seq, stream, line) \
         SELECT s.org_id, s.run_id, (SELECT created_at FROM runs r WHERE r.run_id = s.run_id), s.step_id, g, 'stdout', 'line ' || g \
         FROM (SELECT * FROM steps WHERE org_id = $1 AND state = 'succeeded' LIMIT 200) s \
         CROSS JOIN generate_series(1, 50) g",
    ];
    for s in sql {
        // Each statement names a prefix of these binds; bind only those.
        let q = match (1..=5).filter(|i| s.contains(&format!("${i}"))).count() {
            1 => sqlx::query(s).bind(org.id),
            2 => sqlx::query(s).bind(org.id).bind(org.project),
            _ => sqlx::query(s).bind(org.id).bind(org.project).bind(org.approve).bind(org.slow).bind(n as i32),
        };
        q.execute(pool).await.unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    // Open approvals are few in real life: all but 30 of the waiting ones are answered.
    sqlx::query(
        "UPDATE approvals SET decision = 'approved' WHERE org_id = $1 AND decision IS NULL \
         AND step_id NOT IN (SELECT step_id FROM approvals WHERE org_id = $1 AND decision IS NULL LIMIT 30)",
    )
    .bind(org.id)
    .execute(pool)
    .await
    .unwrap();
}

struct Measured {
    status: StatusCode,
    statements: usize,
    scopes: usize,
    scans: Vec<String>,
    millis: f64,
    body: String,
}

async fn measure(router: &axum::Router, cookie: &str, path: &str) -> Measured {
    let req = Request::get(path).header(header::COOKIE, cookie).header(header::HOST, "console.test").body(Body::empty()).unwrap();
    STATEMENTS.with(|c| c.set(0));
    SCOPES.with(|c| c.set(0));
    SCANS.with(|s| s.borrow_mut().clear());
    let started = Instant::now();
    let response = router.clone().oneshot(req).instrument(tracing::info_span!(PAGE_SPAN)).await.unwrap();
    let millis = started.elapsed().as_secs_f64() * 1000.0;
    let statements = STATEMENTS.with(Cell::get);
    let scopes = SCOPES.with(Cell::get);
    let scans = SCANS.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 64 << 20).await.unwrap();
    Measured { status, statements, scopes, scans, millis, body: String::from_utf8_lossy(&bytes).into_owned() }
}

#[tokio::test(flavor = "current_thread")]
async fn every_page_reads_through_indexes_with_few_statements_at_10000_runs() {
    let app = App::start(false).await;
    let acme = app.org("acme").await;
    let noise = app.org("noise").await;
    let started = Instant::now();
    seed(app.pool(), &acme, 10_000).await;
    seed(app.pool(), &noise, 10_000).await;
    sqlx::query("ANALYZE").execute(app.pool()).await.unwrap();
    eprintln!("seeded 2 x 10,000 runs in {:.1} s", started.elapsed().as_secs_f64());
    let completed: RunId = app.read("SELECT run_id FROM runs WHERE org_id = $1 AND status = 'failed' ORDER BY created_at DESC LIMIT 1", acme.id).await;
    let waiting: RunId = sqlx::query_scalar("SELECT a.run_id FROM approvals a WHERE a.org_id = $1 AND a.decision IS NULL LIMIT 1")
        .bind(acme.id)
        .fetch_one(app.pool())
        .await
        .unwrap();

    // A console session of the owner, as sign-in makes it.
    let mut ch = engine::store::Change::begin(app.pool(), engine::store::Actor::System).await.unwrap();
    let token = api::auth::issue_user_token(
        &mut ch,
        &engine::testkit::secret_key(),
        api::auth::UserToken { org: acme.id, user: acme.owner, project: None, role: "owner", name: "console session", ttl: chrono::Duration::hours(1) },
    )
    .await
    .unwrap();
    ch.commit().await.unwrap();
    let cookie = format!("shopfloor_session=acme.{token}");

    let runs = [
        ("runs filtered", "/runs?status=failed&workflow=approve"),
        ("runs by substate", "/runs?substate=awaiting_signal"),
        ("runs in a window", "/runs?since=2020-01-01T00:00&until=2100-01-01T00:00"),
    ];
    let pages = acme_pages(waiting, completed, &[], &runs);
    let state = AppState::new(explaining_pool(&app.db.url), app.db.url.parse().unwrap(), engine::testkit::secret_key());
    let router = console_app(state, Default::default());
    let mut report = Vec::new();
    for (name, path) in &pages {
        let warm = measure(&router, &cookie, path).await;
        assert_eq!(warm.status, StatusCode::OK, "{name}: {}", warm.body);
        let mut runs: Vec<Measured> = Vec::new();
        for _ in 0..3 {
            runs.push(measure(&router, &cookie, path).await);
        }
        let scanned: Vec<&String> = std::iter::once(&warm).chain(&runs).flat_map(|m| &m.scans).collect();
        assert!(scanned.is_empty(), "{name} ({path}) read large tables without an index: {scanned:#?}");
        let statements = runs.iter().map(|m| m.statements).max().unwrap_or(0);
        assert!(statements <= 20, "{name}: {statements} statements for one page (N+1?)");
        assert!(runs.iter().all(|m| m.statements == runs[0].statements), "{name}: the statement count varies between identical requests");
        // Each transaction of the tenant pool sets the org once, then sends at least one statement.
        let scopes = runs.iter().map(|m| m.scopes).max().unwrap_or(0);
        assert!(scopes <= statements, "{name}: {scopes} settings of the org for {statements} statements");
        let mut times: Vec<f64> = runs.iter().map(|m| m.millis).collect();
        times.sort_by(f64::total_cmp);
        report.push(format!("{name:<18} {statements:>3} statements (+{scopes:>2} org settings)  {:>7.1} ms (median of 3)", times[1]));
    }
    eprintln!("console pages at 10,000 runs (debug build):\n{}", report.join("\n"));
    app.discard().await;
}
