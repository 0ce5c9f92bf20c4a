//! `shopfloor check` as an operator runs it: every check passing against a migrated database,
//! with a signing key, the GitHub App minting a token from the fake GitHub, and the webhook
//! secret; then failing checks, each with its fix line and a non-zero exit; and `--host` on a
//! host machine (a harness and git on PATH, the server answering); and `DATABASE_URL` through a
//! real PgBouncer in transaction mode, which fails without a direct
//! `SHOPFLOOR_LISTEN_DATABASE_URL` and passes with one, while the server itself is never taken
//! for a pooler.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::process::Command;

use engine::store::{Actor, Change};
use engine::testkit::test_db;
use shopfloor_tests::github_fake::FakeGithub;
use shopfloor_tests::shopfloor_bin;

use crate::support::{acme, connect_widgets, owner_token};

/// Runs `shopfloor check ARGS` with only the given settings; answers (exit code, stdout).
fn check(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(shopfloor_bin());
    cmd.arg("check").args(args).env("SHOPFLOOR_LOG", "off");
    for var in [
        "DATABASE_URL",
        "SHOPFLOOR_LISTEN_DATABASE_URL",
        "SHOPFLOOR_SECRET_KEY",
        "SHOPFLOOR_GITHUB_WEBHOOK_SECRET",
        "SHOPFLOOR_GITHUB_APP_ID",
        "SHOPFLOOR_GITHUB_APP_KEY",
        "SHOPFLOOR_GITHUB_APP_KEY_FILE",
        "SHOPFLOOR_GITHUB_API_URL",
        "SHOPFLOOR_SERVER",
        "SHOPFLOOR_HOST_CAPABILITIES",
        "SHOPFLOOR_CLAUDE_COMMAND",
        "SHOPFLOOR_CODEX_COMMAND",
        "SHOPFLOOR_HOST_PRICES",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("shopfloor check {args:?}:\n{stdout}{}", String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), stdout)
}

/// The line of a check, and the one after it.
fn line_of<'a>(out: &'a str, check: &str) -> (&'a str, Option<&'a str>) {
    let lines: Vec<&str> = out.lines().collect();
    let i =
        lines.iter().position(|l| l.split_once(':').is_some_and(|(head, _)| head.ends_with(check))).unwrap_or_else(|| panic!("no `{check}` line in:\n{out}"));
    (lines[i], lines.get(i + 1).copied())
}

fn assert_ok(out: &str, check: &str) {
    let (line, _) = line_of(out, check);
    assert!(line.starts_with("ok "), "{line}");
}

/// A failed check with its fix line, which says `fix_says`.
fn assert_fails(out: &str, check: &str, fix_says: &str) {
    let (line, next) = line_of(out, check);
    assert!(line.starts_with("FAIL "), "{line}");
    let fix = next.unwrap_or_default().trim();
    assert!(fix.starts_with("fix: ") && fix.contains(fix_says), "the fix of `{line}` should say `{fix_says}`: {fix}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ready_server_passes_every_check() {
    let db = test_db().await;
    let fake = FakeGithub::start().await;
    let (code, out) = {
        let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
        let acme = acme(&mut ch).await;
        connect_widgets(&mut ch, acme.org, acme.project).await;
        // The first token makes the first signing key.
        owner_token(&mut ch, &acme, "first", 1).await;
        ch.commit().await.unwrap();
        let key = shopfloor_tests::github_fake::app_key();
        let env = [
            ("DATABASE_URL", db.url.as_str()),
            ("SHOPFLOOR_SECRET_KEY", engine::testkit::SECRET_KEY),
            ("SHOPFLOOR_GITHUB_WEBHOOK_SECRET", "a webhook secret"),
            ("SHOPFLOOR_GITHUB_APP_ID", "1"),
            ("SHOPFLOOR_GITHUB_APP_KEY_FILE", key.to_str().unwrap()),
            ("SHOPFLOOR_GITHUB_API_URL", fake.url.as_str()),
        ];
        // The fake GitHub answers on the runtime's other threads meanwhile.
        let ready = tokio::task::block_in_place(|| check(&[], &env));
        // Another secret key than the one that sealed the signing key.
        let other = "b3RoZXIga2V5IG9mIGV4YWN0bHkgMzIgYnl0ZXMgLi4=";
        let (wrong, wrong_out) = tokio::task::block_in_place(|| check(&[], &[env[0], ("SHOPFLOOR_SECRET_KEY", other)]));
        assert_eq!(wrong, 1, "{wrong_out}");
        assert_fails(&wrong_out, "secret key", "set the SHOPFLOOR_SECRET_KEY that sealed the signing keys");
        ready
    };
    assert_eq!(code, 0, "{out}");
    for name in ["database", "secret key", "jwt signing keys", "github app", "webhook secret"] {
        assert_ok(&out, name);
    }
    assert!(line_of(&out, "github app").0.contains("minted an installation token for acme/widgets"), "{out}");
    assert_eq!(fake.requests_to("POST", "/app/installations/77/access_tokens").len(), 1, "one token minted at the configured URL");
    assert!(!out.contains("ghs_"), "the token is never printed: {out}");
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn each_failing_check_says_its_fix_and_the_exit_is_not_zero() {
    let db = test_db().await;
    let fake = FakeGithub::start().await;
    // A migrated database with no org yet (no signing key), no webhook secret, no App.
    let (code, out) = tokio::task::block_in_place(|| check(&[], &[("DATABASE_URL", &db.url), ("SHOPFLOOR_GITHUB_API_URL", &fake.url)]));
    assert_eq!(code, 1, "{out}");
    assert_ok(&out, "database");
    assert_fails(&out, "secret key", "openssl rand -base64 32");
    assert_fails(&out, "jwt signing keys", "shopfloor admin create-org");
    assert_fails(&out, "webhook secret", "set SHOPFLOOR_GITHUB_WEBHOOK_SECRET");
    let (app, _) = line_of(&out, "github app");
    assert!(app.starts_with("skip ") && app.contains("not configured"), "{app}");

    // An App whose key is not a key.
    let bad_key = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(bad_key.path(), "not a pem").unwrap();
    let key = bad_key.path().to_str().unwrap();
    let (code, out) = tokio::task::block_in_place(|| {
        check(
            &[],
            &[
                ("DATABASE_URL", &db.url),
                ("SHOPFLOOR_GITHUB_WEBHOOK_SECRET", "s"),
                ("SHOPFLOOR_GITHUB_APP_ID", "1"),
                ("SHOPFLOOR_GITHUB_APP_KEY_FILE", key),
                ("SHOPFLOOR_GITHUB_API_URL", &fake.url),
            ],
        )
    });
    assert_eq!(code, 1, "{out}");
    assert_fails(&out, "github app", "SHOPFLOOR_GITHUB_APP_KEY_FILE");
    db.finish().await;

    // No database answers there.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (code, out) = check(&[], &[("DATABASE_URL", &format!("postgres://nobody@127.0.0.1:{port}/nothing")), ("SHOPFLOOR_GITHUB_WEBHOOK_SECRET", "s")]);
    assert_eq!(code, 1, "{out}");
    assert_fails(&out, "database", "check that PostgreSQL is running");
    assert_ok(&out, "webhook secret");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_machine_checks_its_harnesses_git_and_the_server() {
    // The server: something answering /healthz.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().route("/healthz", axum::routing::get(|| async { "{\"status\":\"ok\"}" }));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    // A PATH with a `claude` of its own and the system's git.
    let bin = tempfile::tempdir().unwrap();
    let claude = bin.path().join("claude");
    std::fs::write(&claude, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&claude, std::fs::Permissions::from_mode(0o755)).unwrap();
    let git = String::from_utf8(Command::new("sh").args(["-c", "command -v git"]).output().unwrap().stdout).unwrap();
    let git_dir = PathBuf::from(git.trim()).parent().unwrap().to_owned();
    let bwrap = String::from_utf8(Command::new("sh").args(["-c", "command -v bwrap"]).output().unwrap().stdout).unwrap();
    let bwrap_dir = PathBuf::from(bwrap.trim()).parent().expect("bubblewrap is installed (make test installs it)").to_owned();
    let path = format!("{}:{}:{}", bin.path().display(), git_dir.display(), bwrap_dir.display());

    let (code, out) = tokio::task::block_in_place(|| {
        check(&["--host"], &[("PATH", &path), ("SHOPFLOOR_SERVER", &server), ("SHOPFLOOR_HOST_CAPABILITIES", "linux,harness:claude-code")])
    });
    assert_eq!(code, 0, "{out}");
    for name in ["claude", "walls", "git", "prices", "server"] {
        assert_ok(&out, name);
    }
    assert!(!out.contains("codex"), "only the advertised harness is checked: {out}");

    // A `harness:command` host has neither claude nor codex, and needs neither.
    let (code, out) = tokio::task::block_in_place(|| {
        check(
            &["--host"],
            &[
                ("PATH", &path),
                ("SHOPFLOOR_SERVER", &server),
                ("SHOPFLOOR_HOST_CAPABILITIES", "linux,harness:command"),
                ("SHOPFLOOR_CLAUDE_COMMAND", "/nonexistent/claude"),
            ],
        )
    });
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("claude") && !out.contains("codex"), "harnesses the host does not advertise are not checked: {out}");
    for name in ["git", "prices", "server"] {
        assert_ok(&out, name);
    }
    // One that advertises no harness at all is told it runs no crew step, and passes.
    let (code, out) =
        tokio::task::block_in_place(|| check(&["--host"], &[("PATH", &path), ("SHOPFLOOR_SERVER", &server), ("SHOPFLOOR_HOST_CAPABILITIES", "linux")]));
    assert_eq!(code, 0, "{out}");
    assert!(out.lines().any(|l| l.starts_with("skip harnesses: the host advertises none")), "{out}");
    assert!(!out.lines().any(|l| l.contains(" claude: ") || l.contains(" codex: ")), "{out}");

    // A harness the host advertises but lacks, and a server that does not answer.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (code, out) = tokio::task::block_in_place(|| {
        let silent = format!("http://127.0.0.1:{port}");
        let bad = [
            ("PATH", path.as_str()),
            ("SHOPFLOOR_SERVER", silent.as_str()),
            ("SHOPFLOOR_HOST_CAPABILITIES", "harness:codex"),
            ("SHOPFLOOR_HOST_PRICES", "/nonexistent/prices.json"),
        ];
        check(&["--host"], &bad)
    });
    assert_eq!(code, 1, "{out}");
    assert_fails(&out, "codex", "SHOPFLOOR_CODEX_COMMAND");
    assert_fails(&out, "prices", "SHOPFLOOR_HOST_PRICES");
    assert_ok(&out, "git");
    assert_fails(&out, "server", "check SHOPFLOOR_SERVER");
}

/// A host without what its walls need (here: bubblewrap not on its PATH) is told so with the
/// fix, and, started, claims nothing: it stops before registering. `--unsandboxed` is the
/// operator's way past it, and the check says what it means.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_that_cannot_build_its_walls_fails_its_check_and_claims_nothing() {
    let bin = tempfile::tempdir().unwrap();
    let path = bin.path().display().to_string();
    let (code, out) = tokio::task::block_in_place(|| check(&["--host"], &[("PATH", &path), ("SHOPFLOOR_HOST_CAPABILITIES", "linux,harness:command")]));
    assert_eq!(code, 1, "{out}");
    assert_fails(&out, "walls", "apt-get install bubblewrap");
    let (_, out) = tokio::task::block_in_place(|| {
        check(&["--host"], &[("PATH", &path), ("SHOPFLOOR_HOST_CAPABILITIES", "linux,harness:command"), ("SHOPFLOOR_HOST_UNSANDBOXED", "true")])
    });
    let (line, _) = line_of(&out, "walls");
    assert!(line.starts_with("skip ") && line.contains("without walls"), "{line}");

    let work = tempfile::tempdir().unwrap();
    let started = tokio::task::block_in_place(|| {
        Command::new(shopfloor_bin())
            .args(["host", "--server", "http://127.0.0.1:9", "--token", "sfr_unused", "--capabilities", "linux,harness:command"])
            .arg("--work-dir")
            .arg(work.path())
            .env("PATH", &path)
            .env_remove("SHOPFLOOR_HOST_UNSANDBOXED")
            .output()
            .unwrap()
    });
    let said = String::from_utf8_lossy(&started.stderr);
    assert!(!started.status.success(), "{said}");
    assert!(said.contains("cannot run crew steps inside walls, so it claims none") && said.contains("apt-get install bubblewrap"), "{said}");
    assert!(!work.path().join("credential.json").exists(), "it registered");
}

/// The models the advertised harnesses' CLIs use by default or offer are priced by the host's
/// table: the shipped one prices some only by their family (no published price yet), and a table
/// of an operator's own that lacks a model fails, naming it.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_is_told_the_models_its_prices_cannot_price() {
    let env = [("SHOPFLOOR_HOST_CAPABILITIES", "linux,harness:codex"), ("SHOPFLOOR_CODEX_COMMAND", "/nonexistent/codex")];
    let (_, out) = tokio::task::block_in_place(|| check(&["--host"], &env));
    let (line, _) = line_of(&out, "prices");
    assert!(line.starts_with("ok ") && line.contains("the table shipped with this release; priced by their family"), "{line}");
    assert!(line.contains("gpt-6.1-sol"), "{line}");
    assert!(!line.contains("gpt-5.5"), "a model the table names is not listed: {line}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prices.json");
    std::fs::write(&file, r#"{"models": [{"match": ["gpt-5.5"], "input": 5, "output": 30, "cache_write": 0, "cache_read": 0.5}]}"#).unwrap();
    let file = file.display().to_string();
    let (code, out) = tokio::task::block_in_place(|| check(&["--host"], &[env[0], env[1], ("SHOPFLOOR_HOST_PRICES", &file)]));
    assert_eq!(code, 1, "{out}");
    assert_fails(&out, "prices", "add rows that match them");
    let (line, _) = line_of(&out, "prices");
    assert!(line.contains("cannot price gpt-5.6-luna") && !line.contains("gpt-5.5,"), "{line}");
}

/// PgBouncer in statement mode refuses every transaction: `check` says which setting to change,
/// not that the database is missing or unmigrated.
#[tokio::test(flavor = "multi_thread")]
async fn a_statement_mode_pooler_is_named_with_the_mode_to_use() {
    let db = test_db().await;
    let bouncer = shopfloor_tests::pgbouncer::PgBouncer::start_in(&db.url, 2, "statement").await;
    let pooled = bouncer.url(&db.url);
    let env = [("DATABASE_URL", pooled.as_str()), ("SHOPFLOOR_LISTEN_DATABASE_URL", db.url.as_str()), ("SHOPFLOOR_SECRET_KEY", engine::testkit::SECRET_KEY)];
    let (code, out) = check(&[], &env);
    assert_eq!(code, 1, "{out}");
    let (line, fix) = line_of(&out, "database");
    assert!(line.starts_with("FAIL database: the database is a pooler in statement mode"), "{line}");
    assert!(fix.is_some_and(|f| f.contains("`pool_mode = transaction`") && !f.contains("migrate")), "{fix:?}");
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_pooler_without_a_direct_url_fails_with_its_fix() {
    let db = test_db().await;
    let key = engine::testkit::SECRET_KEY;
    let (_, direct) = check(&[], &[("DATABASE_URL", &db.url), ("SHOPFLOOR_SECRET_KEY", key)]);
    let (line, _) = line_of(&direct, "database pooler");
    assert_eq!(line, "ok   database pooler: DATABASE_URL is direct (no transaction pooler)");
    // One server connection and two: the pooler is told either way.
    for size in [1, 2] {
        let bouncer = shopfloor_tests::pgbouncer::PgBouncer::start(&db.url, size).await;
        let pooled = bouncer.url(&db.url);
        let (code, out) = check(&[], &[("DATABASE_URL", &pooled), ("SHOPFLOOR_SECRET_KEY", key)]);
        assert_eq!(code, 1);
        let (line, fix) = line_of(&out, "database pooler");
        assert_eq!(
            line,
            "FAIL database pooler: DATABASE_URL is a transaction pooler (two connections shared one server session) and SHOPFLOOR_LISTEN_DATABASE_URL is not set"
        );
        assert!(fix.is_some_and(|f| f.trim_start().starts_with("fix: set SHOPFLOOR_LISTEN_DATABASE_URL to the PostgreSQL server itself")), "{fix:?}");
        // The other checks still read the database, through the pooler.
        assert_ok(&out, "database");
        let (_, out) = check(&[], &[("DATABASE_URL", &pooled), ("SHOPFLOOR_LISTEN_DATABASE_URL", &db.url), ("SHOPFLOOR_SECRET_KEY", key)]);
        let (line, _) = line_of(&out, "database pooler");
        assert!(line.starts_with("ok   database pooler: DATABASE_URL is a transaction pooler;"), "{line}");
        // The pooler given as the direct URL too.
        let (_, out) = check(&[], &[("DATABASE_URL", &pooled), ("SHOPFLOOR_LISTEN_DATABASE_URL", &pooled), ("SHOPFLOOR_SECRET_KEY", key)]);
        let (line, fix) = line_of(&out, "database pooler");
        assert_eq!(line, "FAIL database pooler: SHOPFLOOR_LISTEN_DATABASE_URL is a transaction pooler too");
        assert!(fix.is_some_and(|f| f.contains("fix:")), "{fix:?}");
    }
    db.finish().await;
}
