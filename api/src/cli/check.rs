//! `shopfloor check`: readiness checks, one line each (`ok`, `FAIL`, or `skip` for what is not
//! configured), and under each failure the line that says how to fix it. Exit 0 only when
//! nothing failed.
//!
//! On a server: the database is reachable and holds this binary's schema, `SHOPFLOOR_SECRET_KEY`
//! is set and opens every sealed signing key, a JWT signing key exists, the GitHub App's key parses and mints an installation token at
//! `SHOPFLOOR_GITHUB_API_URL` (skipped when no App is configured), and the webhook secret is
//! set. With `--host`, on a host machine instead: the harnesses the host's capabilities name
//! (and only those: a step of another harness never runs there) and `git` are on `PATH`, and
//! the server (`SHOPFLOOR_SERVER`) answers.
//!
//! A check prints what it found, never a secret (no key, token or URL password).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use engine::db::Db;
use secrecy::ExposeSecret;

use super::args::{DbArgs, GithubAppArgs, GithubArgs, SecretKeyArgs};

/// `shopfloor check`'s settings: those of the processes it checks.
#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub secret_key: SecretKeyArgs,
    #[command(flatten)]
    pub github: GithubArgs,
    #[command(flatten)]
    pub github_app: GithubAppArgs,
    /// Check a host machine (harnesses, git, the server) instead of a server.
    #[arg(long = "host")]
    pub host: bool,
    /// With --host: the server's base URL.
    #[arg(long = "server", env = "SHOPFLOOR_SERVER")]
    pub server: Option<String>,
    /// With --host: the host's capabilities; only the harnesses they name are checked
    /// (`harness:command` runs any program: nothing to check).
    #[arg(long = "capabilities", env = "SHOPFLOOR_HOST_CAPABILITIES", value_delimiter = ',', default_value = "linux")]
    pub capabilities: Vec<String>,
    /// With --host: the Claude Code command.
    #[arg(long = "claude-command", env = "SHOPFLOOR_CLAUDE_COMMAND", default_value = "claude")]
    pub claude_command: String,
    /// With --host: the Codex command.
    #[arg(long = "codex-command", env = "SHOPFLOOR_CODEX_COMMAND", default_value = "codex")]
    pub codex_command: String,
    /// With --host: the price table the host estimates spend with, instead of the shipped one.
    #[arg(long = "prices", env = "SHOPFLOOR_HOST_PRICES")]
    pub prices: Option<PathBuf>,
    /// With --host: the host runs its steps without walls.
    #[arg(long = "unsandboxed", env = "SHOPFLOOR_HOST_UNSANDBOXED")]
    pub unsandboxed: bool,
}

/// One check's result.
struct Outcome {
    name: &'static str,
    kind: Kind,
    detail: String,
    fix: Option<String>,
}

#[derive(PartialEq)]
enum Kind {
    Ok,
    Fail,
    Skip,
}

impl Outcome {
    fn ok(name: &'static str, detail: impl Into<String>) -> Outcome {
        Outcome { name, kind: Kind::Ok, detail: detail.into(), fix: None }
    }

    fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Outcome {
        Outcome { name, kind: Kind::Fail, detail: detail.into(), fix: Some(fix.into()) }
    }

    fn skip(name: &'static str, detail: impl Into<String>) -> Outcome {
        Outcome { name, kind: Kind::Skip, detail: detail.into(), fix: None }
    }

    fn print(&self) {
        let word = match self.kind {
            Kind::Ok => "ok",
            Kind::Fail => "FAIL",
            Kind::Skip => "skip",
        };
        println!("{word:<4} {}: {}", self.name, self.detail);
        if let Some(fix) = &self.fix {
            println!("     fix: {fix}");
        }
    }
}

/// Runs the checks, printing each as it ends; the exit code is 0 only when none failed.
pub(super) async fn run(args: CheckArgs) -> u8 {
    let outcomes = if args.host { host_checks(&args).await } else { server_checks(&args).await };
    if outcomes.iter().any(|o| o.kind == Kind::Fail) { 1 } else { 0 }
}

async fn server_checks(args: &CheckArgs) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    let mut done = |o: Outcome| {
        o.print();
        outcomes.push(o);
    };
    let pooled = match args.db.database_url.as_deref().filter(|u| !u.trim().is_empty()) {
        Some(url) => Some(engine::db::is_transaction_pooler(url).await),
        None => None,
    };
    // Behind a transaction pooler the checks' own reads take the pooler's route, whatever the
    // settings say: what they find should not depend on the setting that is missing.
    let route = if matches!(pooled, Some(Ok(true))) { engine::db::Route::Pooler } else { args.db.route() };
    let (db, outcome) = database(&args.db, route).await;
    done(outcome);
    if let Some(pooled) = pooled {
        done(pooler(&args.db, pooled).await);
    }
    done(secret_key(&args.secret_key, db.as_ref()).await);
    done(match &db {
        Some(pool) => signing_keys(pool).await,
        None => Outcome::fail("jwt signing keys", "cannot be read without the database", "fix the database check above first"),
    });
    done(github_app(&args.github_app, db.as_ref()).await);
    done(webhook_secret(&args.github));
    if let Some(pool) = db {
        pool.close().await;
    }
    outcomes
}

/// The problem and its fix from an error written as "problem; what to do".
fn split_fix(message: &str, fallback: &str) -> (String, String) {
    match message.split_once("; ") {
        Some((problem, fix)) => (problem.to_owned(), fix.to_owned()),
        None => (message.to_owned(), fallback.to_owned()),
    }
}

async fn database(args: &DbArgs, route: engine::db::Route) -> (Option<Db>, Outcome) {
    const NAME: &str = "database";
    let Some(url) = args.database_url.as_deref().filter(|u| !u.trim().is_empty()) else {
        return (
            None,
            Outcome::fail(
                NAME,
                "DATABASE_URL is not set",
                "set DATABASE_URL to postgres://USER:PASSWORD@HOST:PORT/DATABASE (`shopfloor admin cluster start` prints one for an embedded cluster)",
            ),
        );
    };
    let pool = match engine::db::connect_on(url, 2, route).await {
        Ok(pool) => pool,
        Err(e) => {
            let (problem, fix) = split_fix(&e.to_string(), "check DATABASE_URL");
            return (None, Outcome::fail(NAME, problem, fix));
        }
    };
    match engine::db::check_schema(&pool).await {
        Ok(()) => {
            let outcome = Outcome::ok(NAME, format!("reachable, schema at migration {} (this binary's)", engine::db::code_version()));
            (Some(pool), outcome)
        }
        Err(e) => {
            let (problem, fix) = split_fix(&e.to_string(), "check that DATABASE_URL names shopfloor's database");
            // Reachable but not ready: the other checks can still read what exists.
            (Some(pool), Outcome::fail(NAME, problem, fix))
        }
    }
}

/// Whether DATABASE_URL is a transaction pooler, and if so, that `LISTEN` and migrations have
/// the server itself to go to (`SHOPFLOOR_LISTEN_DATABASE_URL`), which is no pooler either.
async fn pooler(args: &DbArgs, pooled: Result<bool, engine::db::DbError>) -> Outcome {
    const NAME: &str = "database pooler";
    const DIRECT: &str = "set SHOPFLOOR_LISTEN_DATABASE_URL to the PostgreSQL server itself, not the pooler, on every process: LISTEN and migrations need a session of their own, and the pools are made safe for the pooler only when it is set (README: Behind PgBouncer)";
    let listen = args.listen.listen_database_url.as_deref().filter(|u| !u.trim().is_empty());
    let pooled = match pooled {
        Ok(pooled) => pooled,
        // The database check above says why and how to fix it.
        Err(_) => return Outcome::skip(NAME, "cannot tell without reaching the database"),
    };
    match (pooled, listen) {
        (true, None) => Outcome::fail(
            NAME,
            "DATABASE_URL is a transaction pooler (two connections shared one server session) and SHOPFLOOR_LISTEN_DATABASE_URL is not set",
            DIRECT,
        ),
        (_, Some(listen)) => match engine::db::is_transaction_pooler(listen).await {
            Ok(true) => Outcome::fail(NAME, "SHOPFLOOR_LISTEN_DATABASE_URL is a transaction pooler too", DIRECT),
            Ok(false) if pooled => {
                Outcome::ok(NAME, "DATABASE_URL is a transaction pooler; LISTEN and migrations go to SHOPFLOOR_LISTEN_DATABASE_URL, which is direct")
            }
            Ok(false) => Outcome::ok(NAME, "DATABASE_URL is direct; SHOPFLOOR_LISTEN_DATABASE_URL is set, so the pools work as behind a transaction pooler"),
            Err(e) => Outcome::fail(
                NAME,
                format!("SHOPFLOOR_LISTEN_DATABASE_URL: {}", split_fix(&e.to_string(), "").0),
                "set SHOPFLOOR_LISTEN_DATABASE_URL to a reachable PostgreSQL server",
            ),
        },
        (false, None) => Outcome::ok(NAME, "DATABASE_URL is direct (no transaction pooler)"),
    }
}

/// The secret key is set, well formed, and opens every sealed signing key and the webhook
/// secrets. (A server on the embedded cluster reads it from its data directory; `check` reads
/// only the setting.)
async fn secret_key(args: &SecretKeyArgs, db: Option<&Db>) -> Outcome {
    const NAME: &str = "secret key";
    const HOW: &str = "set SHOPFLOOR_SECRET_KEY to 32 random bytes in base64 (`openssl rand -base64 32`), the same on every process of this database";
    let key = match args.given() {
        Ok(Some(key)) => key,
        Ok(None) => return Outcome::fail(NAME, "SHOPFLOOR_SECRET_KEY is not set", HOW),
        Err(e) => return Outcome::fail(NAME, e.to_string().split_once("; ").map_or(e.to_string(), |(problem, _)| problem.to_owned()), HOW),
    };
    let Some(pool) = db else { return Outcome::ok(NAME, "set, well formed (the database is needed to check it opens the signing keys)") };
    let opened = async {
        engine::store::webhooks_out::check_opens(pool, &key).await?;
        engine::store::signing_keys::check_opens(pool, &key).await
    };
    match opened.await {
        Ok((0, _)) => Outcome::ok(NAME, "set, well formed; no signing key yet"),
        Ok((n, 0)) => Outcome::ok(NAME, format!("opens the {n} signing key{}", if n == 1 { "" } else { "s" })),
        Ok((n, plaintext)) => {
            Outcome::ok(NAME, format!("opens the sealed signing keys; {plaintext} of {n} still in plaintext, sealed when `serve`, `api` or `engine` starts"))
        }
        Err(engine::store::StoreError::Sealed(e)) => Outcome::fail(
            NAME,
            format!("does not open {}", e.what),
            format!("set the SHOPFLOOR_SECRET_KEY that sealed the {} (the one the servers of this database use)", e.kind),
        ),
        Err(e) => Outcome::fail(NAME, format!("cannot read the sealed secrets: {e}"), "fix the database check above first"),
    }
}

async fn signing_keys(pool: &Db) -> Outcome {
    const NAME: &str = "jwt signing keys";
    let count: Result<i64, sqlx::Error> = sqlx::query_scalar("SELECT count(*) FROM signing_keys WHERE retired_at IS NULL").fetch_one(pool).await;
    match count {
        Ok(0) => Outcome::fail(
            NAME,
            "no current signing key in the database",
            "create the first org with `shopfloor admin create-org SLUG --owner-email EMAIL`: its first token makes the key",
        ),
        Ok(n) => Outcome::ok(NAME, format!("{n} current key{}", if n == 1 { "" } else { "s" })),
        Err(e) => Outcome::fail(NAME, format!("cannot read them: {e}"), "run `shopfloor migrate`, then check again"),
    }
}

async fn github_app(args: &GithubAppArgs, db: Option<&Db>) -> Outcome {
    const NAME: &str = "github app";
    if args.app_id.is_none() && args.key.is_none() && args.key_file.is_none() {
        return Outcome::skip(NAME, "not configured (SHOPFLOOR_GITHUB_APP_ID is unset): output steps wait, hosts use their own git credentials");
    }
    if args.app_id.is_none() {
        return Outcome::fail(NAME, "a key is set but no App id", "set SHOPFLOOR_GITHUB_APP_ID to the App's id (its settings page on GitHub shows it)");
    }
    let app = match super::processes::github_app(args) {
        Ok(Some(app)) => app,
        Ok(None) => return Outcome::fail(NAME, "not configured", "set SHOPFLOOR_GITHUB_APP_ID"),
        Err(e) => {
            return Outcome::fail(NAME, e.to_string(), "set SHOPFLOOR_GITHUB_APP_KEY_FILE to the private key (PEM) generated on the App's settings page");
        }
    };
    let api = app.api_url().to_owned();
    // A connected repository's installation mints a token as an output step would.
    let repository: Option<(i64, String)> = match db {
        Some(pool) => sqlx::query_as("SELECT installation_id, full_name FROM repositories WHERE installation_id IS NOT NULL ORDER BY created_at LIMIT 1")
            .fetch_optional(pool)
            .await
            .ok()
            .flatten(),
        None => None,
    };
    let fix = |e: &engine::github::client::CallError| match e {
        engine::github::client::CallError::Client { status: 401, .. } => {
            "GitHub refused the App's JWT: check that SHOPFLOOR_GITHUB_APP_ID is the id of the App whose key this is".to_owned()
        }
        engine::github::client::CallError::Client { status: 404, .. } => {
            "the installation is gone: install the App on the repository again, and connect it again".to_owned()
        }
        engine::github::client::CallError::Unavailable(_) => format!("cannot reach {api}: check SHOPFLOOR_GITHUB_API_URL and the network"),
        _ => "check the App's settings on GitHub".to_owned(),
    };
    match repository {
        Some((installation, repo)) => match app.installation_token(installation, &repo, engine::github::client::Scope::Metadata).await {
            Ok(_) => Outcome::ok(NAME, format!("key parses; minted an installation token for {repo} at {api}")),
            Err(e) => Outcome::fail(NAME, format!("cannot mint an installation token for {repo}: {e}"), fix(&e)),
        },
        None => match app.about().await {
            Ok(about) => {
                let slug = about.get("slug").and_then(serde_json::Value::as_str).unwrap_or("?");
                Outcome::ok(NAME, format!("key parses; GitHub at {api} knows the App `{slug}` (no repository connected yet: no installation token to mint)"))
            }
            Err(e) => Outcome::fail(NAME, format!("GitHub at {api} refuses the App: {e}"), fix(&e)),
        },
    }
}

fn webhook_secret(args: &GithubArgs) -> Outcome {
    const NAME: &str = "webhook secret";
    match &args.webhook_secret {
        Some(s) if !s.expose_secret().trim().is_empty() => Outcome::ok(NAME, "set"),
        _ => Outcome::fail(
            NAME,
            "SHOPFLOOR_GITHUB_WEBHOOK_SECRET is not set: POST /webhooks/github answers 503",
            "set SHOPFLOOR_GITHUB_WEBHOOK_SECRET to the webhook secret of the GitHub App's settings",
        ),
    }
}

async fn host_checks(args: &CheckArgs) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    let mut done = |o: Outcome| {
        o.print();
        outcomes.push(o);
    };
    // A crew step needs `harness:<its harness>` of its host (`engine::hosts::crew_requires`):
    // a harness the host does not advertise never runs there, so it is not checked.
    let advertises = |h: &str| args.capabilities.iter().any(|c| c.trim() == format!("harness:{h}"));
    if advertises("claude-code") {
        done(on_path("claude", &args.claude_command, "install Claude Code (`npm install -g @anthropic-ai/claude-code`) or set SHOPFLOOR_CLAUDE_COMMAND to it"));
    }
    if advertises("codex") {
        done(on_path("codex", &args.codex_command, "install Codex (`npm install -g @openai/codex`) or set SHOPFLOOR_CODEX_COMMAND to it"));
    }
    if !advertises("claude-code") && !advertises("codex") && !advertises("command") {
        done(Outcome::skip(
            "harnesses",
            "the host advertises none (add harness:claude-code, harness:codex or harness:command to SHOPFLOOR_HOST_CAPABILITIES): it runs no crew step",
        ));
    }
    done(walls(args.unsandboxed));
    done(limits());
    done(on_path("git", "git", "install git (`apt-get install git`)"));
    let harnesses: Vec<&str> = ["claude-code", "codex"].into_iter().filter(|h| advertises(h)).collect();
    done(prices(args.prices.as_deref(), &harnesses));
    done(server(args.server.as_deref()).await);
    outcomes
}

/// Whether the host can build the walls its crew steps run in (a host that cannot claims
/// none), unless it runs them without.
fn walls(unsandboxed: bool) -> Outcome {
    match host::walls::Walls::probe(unsandboxed) {
        Ok(host::walls::Walls::Bubblewrap { bwrap, .. }) => Outcome::ok("walls", format!("{} builds them", bwrap.display())),
        Ok(host::walls::Walls::None) => Outcome::skip("walls", "--unsandboxed: crew steps run without walls and can read what the host's user can"),
        Err(why) => Outcome::fail("walls", format!("{why}: the host claims no crew step"), host::walls::FIX),
    }
}

/// Whether the host can limit each step's processes and memory (control groups it may write).
fn limits() -> Outcome {
    match host::limits::Cgroups::detect() {
        host::limits::Cgroups::V2(dir) => Outcome::ok("limits", format!("cgroup v2, under {}", dir.display())),
        host::limits::Cgroups::V1 { cpuacct: Some(_), .. } => Outcome::ok("limits", "cgroup v1 (pids, memory, cpuacct)"),
        host::limits::Cgroups::V1 { cpuacct: None, .. } => Outcome::ok("limits", "cgroup v1 (pids, memory; CPU time per process, by rlimit)"),
        host::limits::Cgroups::Unavailable(why) => Outcome::skip("limits", format!("{why}: steps run without limits on their processes and memory")),
    }
}

/// The price table sessions' spend is estimated with while they run, and how it prices the
/// models the advertised harnesses' CLIs use by default or offer (the shipped table's list, and
/// the file's own): a model it prices only by its family is named; one it cannot price at all
/// (it would be estimated at the dearest row) fails.
fn prices(path: Option<&Path>, harnesses: &[&str]) -> Outcome {
    use host::prices::{Basis, Prices};
    let table = match Prices::load(path) {
        Ok(table) => table,
        Err(e) => {
            return Outcome::fail("prices", e, "fix the file SHOPFLOOR_HOST_PRICES names (the shape of host/prices.json), or unset it for the shipped table");
        }
    };
    let shipped = Prices::shipped();
    let mut models: Vec<&String> = harnesses.iter().flat_map(|h| shipped.harness_models(h).iter().chain(table.harness_models(h))).collect();
    models.sort();
    models.dedup();
    let named = |basis: Basis| models.iter().filter(|m| table.row(Some(m.as_str())).1 == basis).map(|m| m.as_str()).collect::<Vec<_>>().join(", ");
    let source = path.map_or_else(|| "the table shipped with this release".to_owned(), |p| p.display().to_string());
    let (unpriced, by_family) = (named(Basis::UnknownModel), named(Basis::Family));
    if !unpriced.is_empty() {
        return Outcome::fail(
            "prices",
            format!("{source} cannot price {unpriced}: their sessions would be estimated at its dearest row"),
            "add rows that match them to the file SHOPFLOOR_HOST_PRICES names (the shape of host/prices.json)",
        );
    }
    match by_family.as_str() {
        "" => Outcome::ok("prices", source),
        _ => Outcome::ok("prices", format!("{source}; priced by their family, without published prices: {by_family}")),
    }
}

fn on_path(name: &'static str, command: &str, fix: &str) -> Outcome {
    match host::process::find(command) {
        Some(path) => Outcome::ok(name, format!("{}", path.display())),
        None => Outcome::fail(name, format!("`{command}` is not on PATH"), fix),
    }
}

async fn server(url: Option<&str>) -> Outcome {
    const NAME: &str = "server";
    let Some(url) = url.filter(|u| !u.trim().is_empty()) else {
        return Outcome::fail(NAME, "SHOPFLOOR_SERVER is not set", "set SHOPFLOOR_SERVER to the server's base URL, e.g. https://shopfloor.example.com");
    };
    let base = url.trim_end_matches('/');
    let client = match reqwest::Client::builder().timeout(Duration::from_secs(10)).build() {
        Ok(c) => c,
        Err(e) => return Outcome::fail(NAME, format!("cannot make an HTTP client: {e}"), "check the system's TLS setup"),
    };
    match client.get(format!("{base}/healthz")).send().await {
        Ok(r) if r.status().is_success() => Outcome::ok(NAME, format!("{base} answers")),
        Ok(r) => Outcome::fail(NAME, format!("{base}/healthz answered {}", r.status()), "check that SHOPFLOOR_SERVER is shopfloor's base URL"),
        Err(e) => Outcome::fail(NAME, format!("cannot reach {base}: {}", without_url(&e)), "check SHOPFLOOR_SERVER and that the server is running"),
    }
}

/// A reqwest error without the URL it repeats.
fn without_url(e: &reqwest::Error) -> String {
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(e);
    let mut detail = if e.is_timeout() { "no answer within 10 s".to_owned() } else { "connection failed".to_owned() };
    while let Some(s) = source {
        detail = s.to_string();
        source = s.source();
    }
    detail
}
