//! `shopfloor serve` on the embedded default, and the one-line errors of the command line.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt as _;
use std::process::{Command, Stdio};

use shopfloor_tests::process::{Proc, free_port};
use shopfloor_tests::shopfloor_bin;

#[tokio::test(flavor = "multi_thread")]
async fn serve_runs_its_own_postgres_and_keeps_the_data_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let data = dir.path().join(".shopfloor");
    let port = free_port();
    let serve = || {
        Command::new(shopfloor_bin())
            .args(["serve", "--log", "warn"])
            .env_remove("DATABASE_URL")
            .env("SHOPFLOOR_DATA_DIR", &data)
            .env("SHOPFLOOR_LISTEN", format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map(Proc)
            .unwrap()
    };
    let create_org = || {
        Command::new(shopfloor_bin())
            .args(["admin", "create-org", "--slug", "acme", "--owner-email", "o@example.com"])
            .env_remove("DATABASE_URL")
            .env("SHOPFLOOR_DATA_DIR", &data)
            .output()
            .unwrap()
    };

    let mut first = serve();
    shopfloor_tests::until_ok(&format!("http://127.0.0.1:{port}/readyz")).await;
    let created = create_org();
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let token = String::from_utf8(created.stdout).unwrap();
    assert_eq!(token.lines().count(), 1, "the token is alone on standard output");
    assert_eq!(token.trim().split('.').count(), 3, "a JWT");
    // With no SHOPFLOOR_SECRET_KEY, the embedded cluster's key was made beside it, for the
    // owner alone, and the admin command found it there.
    let key_file = data.join("secret-key");
    let mode = std::fs::metadata(&key_file).expect("serve made the secret key under SHOPFLOOR_DATA_DIR").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", key_file.display());
    let key = std::fs::read_to_string(&key_file).unwrap();
    assert!(engine::sealing::SecretKey::parse(&key).is_ok(), "32 bytes of base64");
    assert!(first.terminate().success());

    // The second start reuses the cluster and its data: the org is still there.
    let mut second = serve();
    shopfloor_tests::until_ok(&format!("http://127.0.0.1:{port}/readyz")).await;
    let again = create_org();
    assert!(!again.status.success());
    assert_eq!(String::from_utf8_lossy(&again.stderr).trim(), "error: an org with slug `acme` already exists");
    assert_eq!(std::fs::read_to_string(&key_file).unwrap(), key, "the same key on every start");
    assert!(second.terminate().success());
    // Stopped with the server: nothing answers on the cluster's port any more.
    let port_file = std::fs::read_to_string(data.join("pg.port")).unwrap();
    let pg_port: u16 = port_file.trim().parse().unwrap();
    assert!(std::net::TcpStream::connect(("127.0.0.1", pg_port)).is_err(), "PostgreSQL still runs after serve stopped");
}

/// Runs the binary; returns (exit code, stderr).
fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(shopfloor_bin());
    cmd.args(args).env_remove("DATABASE_URL").env("SHOPFLOOR_LOG", "off");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn assert_one_clear_line(code: i32, stderr: &str, says: &str) {
    assert_ne!(code, 0);
    assert_eq!(stderr.trim().lines().count(), 1, "one line, got: {stderr}");
    assert!(stderr.contains(says), "expected `{says}` in: {stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{stderr}");
}

#[test]
fn bad_configuration_ends_with_one_clear_line() {
    let (code, err) = run(&["migrate"], &[("DATABASE_URL", "not a url")]);
    assert_one_clear_line(code, &err, "DATABASE_URL is not a valid PostgreSQL URL");

    let port = free_port();
    let url = format!("postgres://nobody@127.0.0.1:{port}/nothing");
    let (code, err) = run(&["migrate"], &[("DATABASE_URL", &url)]);
    assert_one_clear_line(code, &err, &format!("cannot reach the database at 127.0.0.1:{port}"));

    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, err) = run(&["api"], &[("DATABASE_URL", &url), ("SHOPFLOOR_LISTEN", &addr)]);
    assert_one_clear_line(code, &err, "the address is in use; stop the other server or set SHOPFLOOR_LISTEN");

    // A host with no credential yet and no registration token says what to pass.
    let work = tempfile::tempdir().unwrap();
    let work_dir = work.path().to_string_lossy().into_owned();
    let (code, err) = run(&["host", "--server", "http://127.0.0.1:9", "--work-dir", &work_dir], &[]);
    assert_one_clear_line(code, &err, "no credential yet: pass --token with a registration token");
}

#[test]
fn validate_lints_workflow_files_offline() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/workflows");
    let good = fixtures.join("issue-to-pr.yaml");
    let bad = fixtures.join("broken-edges.yaml");
    let out = Command::new(shopfloor_bin()).arg("validate").arg(&good).env_remove("DATABASE_URL").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("ok {}\n", good.display()));

    let out = Command::new(shopfloor_bin()).arg("validate").arg(&good).arg(&bad).env_remove("DATABASE_URL").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    assert_eq!(lines[0], format!("ok {}", good.display()));
    assert_eq!(lines[2], format!("{}:7:19: nodes.build.after: there is no node `desing`", bad.display()));
    assert!(lines[1..].iter().all(|l| l.starts_with(&bad.display().to_string())), "{text}");
}
