//! The walls around crew steps, through a real `shopfloor host` (inside walls, as a host runs
//! unless told otherwise) and `shopfloor serve`: two `command` steps at once act as an attacker
//! would, and neither finds the host's credential (its file or its environment), the other's
//! work or the host's work directory, nor writes outside its own directory, nor reaches the
//! server's or PostgreSQL's port; a destination the host allows works through its proxy, a
//! refused one is a `step.egress_refused` event; a process one left running with `setsid` is
//! gone when its step ends.

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::host_env::Env;

/// Each step writes a secret of its own, then for ten seconds looks for the other's, and says
/// what it could find and do; it tries the network straight and through its proxy; it leaves a
/// process behind in a session of its own.
fn workflow() -> String {
    let script = r#"read -r work server pg allowed socket
me="$SHOPFLOOR_STEP_ID"
echo mine > "SECRET-$me"
found=none
for i in $(seq 1 20); do
  for f in $(find "$work" /tmp "$HOME" -name 'SECRET-step-*' 2>/dev/null); do
    case "$f" in *"SECRET-$me") ;; *) found="$f" ;; esac
  done
  sleep 0.5
done
echo "other: $found"
if [ -e "$work/credential.json" ]; then echo "credential: readable"; else echo "credential: hidden"; fi
if env | grep -q '^SHOPFLOOR_HOST_TOKEN='; then echo "token: in env"; else echo "token: not in env"; fi
echo "attempts: $(ls "$work/attempts" 2>/dev/null | wc -l)"
if [ -S "$socket" ]; then echo "host socket: visible"; else echo "host socket: hidden"; fi
echo x > "$work/written-by-$me" 2>/dev/null
echo x > "/etc/written-by-$me" 2>/dev/null
straight() { if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then echo open; else echo closed; fi; }
echo "server straight: $(straight "$server")"
echo "postgres straight: $(straight "$pg")"
proxy="${HTTP_PROXY##*:}"
ask() { exec 3<>"/dev/tcp/127.0.0.1/$proxy"; printf "$1" >&3; head -c 300 <&3 | tr -d '\r' | tr '\n' ' '; exec 3<&-; }
echo "server via proxy: $(ask "CONNECT 127.0.0.1:$server HTTP/1.1\r\nHost: 127.0.0.1:$server\r\n\r\n")"
echo "name via proxy: $(ask 'CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n')"
echo "allowed via proxy: $(ask "GET http://127.0.0.1:$allowed/ HTTP/1.1\r\nHost: 127.0.0.1:$allowed\r\n\r\n")"
echo "allowed straight: $(exec 3<>"/dev/tcp/127.0.0.1/$allowed"; printf 'GET / HTTP/1.0\r\n\r\n' >&3; tail -c 14 <&3)"
setsid sleep 297 >/dev/null 2>&1 < /dev/null &
echo done"#;
    let indented: String = script.lines().map(|l| format!("          {l}\n")).collect();
    format!(
        "name: attack\nnodes:\n  work:\n    crew:\n      harness: command\n      prompt: \"{{{{ input.work }}}} {{{{ input.server }}}} {{{{ input.pg }}}} {{{{ input.allowed }}}} {{{{ input.socket }}}}\"\n      command:\n        - bash\n        - -c\n        - |\n{indented}    requires: [\"harness:command\"]\n"
    )
}

/// The pids of live processes whose command line is `sleep 297`.
fn left_behind() -> Vec<i32> {
    super::host_env::live_processes(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == b"sleep\x00297\x00"))
}

/// A loopback HTTP server the host allows its steps to reach: it answers every request with
/// `hello, allowed`.
async fn allowed_service() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\nConnection: close\r\n\r\nhello, allowed").await;
            });
        }
    });
    port
}

/// The port of a URL (`http://127.0.0.1:PORT/…`, `postgres://…@127.0.0.1:PORT/db`).
fn port_of(url: &str) -> u16 {
    let after_host = url.rsplit('@').next().unwrap().split("://").last().unwrap();
    let authority = after_host.split(['/', '?']).next().unwrap();
    authority.rsplit(':').next().unwrap().parse().unwrap_or_else(|_| panic!("no port in {url}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn two_steps_at_once_find_nothing_of_the_host_nor_of_each_other() {
    let source = workflow();
    let env = Env::start(&[&source]).await;
    let work = env.dir.path().join("hosts").join("walled");
    let allowed = allowed_service().await;
    let vars = [("SHOPFLOOR_HOST_UNSANDBOXED", "false".to_owned()), ("SHOPFLOOR_HOST_EGRESS_ALLOW", format!("127.0.0.1:{allowed}"))];
    let _host = env.host_full("walled", 2, "linux,harness:command", &env.dir.path().join("claude"), None, &vars).await;
    let (server, pg) = (port_of(&env.base), port_of(&env.db.url));
    // A unix socket of the host's where services keep theirs (PostgreSQL's, Docker's).
    let socket = std::path::PathBuf::from(format!("/run/shopfloor-walls-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let input = json!({ "work": work.display().to_string(), "server": server, "pg": pg, "allowed": allowed, "socket": socket.display().to_string() });
    let runs = env.submit("attack", vec![input.clone(), input]).await;
    for run in &runs {
        env.until(*run, "SELECT status <> 'running' FROM runs WHERE run_id = $1", Duration::from_secs(180), "ended").await;
    }
    let mut spans = Vec::new();
    for run in &runs {
        let (state, text, started, finished): (String, Option<String>, chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) =
            sqlx::query_as("SELECT state, output->>'text', started_at, ended_at FROM steps WHERE run_id = $1 AND node = 'work'")
                .bind(run)
                .fetch_one(&env.db.pool)
                .await
                .unwrap();
        let text = text.unwrap_or_default();
        assert_eq!(state, "succeeded", "{text}");
        let seen = [
            "other: none",
            "credential: hidden",
            "token: not in env",
            "attempts: 1",
            "host socket: hidden",
            "server straight: closed",
            "postgres straight: closed",
            "done",
        ];
        for seen in seen {
            assert!(text.lines().any(|l| l == seen), "`{seen}` not in what the step saw:\n{text}");
        }
        let said = |start: &str| text.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("no `{start}` in:\n{text}")).to_owned();
        assert!(said("server via proxy:").contains("403 Forbidden"), "{text}");
        assert!(said("name via proxy:").contains("403 Forbidden"), "{text}");
        assert!(said("allowed via proxy:").contains("200 OK") && said("allowed via proxy:").ends_with("hello, allowed"), "{text}");
        assert!(said("allowed straight:").ends_with("hello, allowed"), "{text}");
        // Each refusal is on the run's record, once, with its destination.
        let mut refused: Vec<String> = sqlx::query_scalar("SELECT attrs->>'destination' FROM run_events WHERE run_id = $1 AND kind = 'step.egress_refused'")
            .bind(run)
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
        refused.sort();
        assert_eq!(refused, [format!("127.0.0.1:{server}"), "example.com:443".to_owned()]);
        spans.push((started, finished));
    }
    // They ran at the same time: each looked while the other's secret was there.
    assert!(spans[0].0 < spans[1].1 && spans[1].0 < spans[0].1, "the steps did not overlap: {spans:?}");
    let _ = std::fs::remove_file(&socket);
    // Nothing written outside their own directories.
    let written: Vec<_> = std::fs::read_dir(&work).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with("written-by-")).collect();
    assert!(written.is_empty(), "{written:?}");
    assert!(!std::fs::read_dir("/etc").unwrap().flatten().any(|e| e.file_name().to_string_lossy().starts_with("written-by-")));
    // What they left running went with them.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !left_behind().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "processes outlived their steps: {:?}", left_behind());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    env.finish().await;
}

/// A workflow `name` of one `command` step running `script` with `sh -c`.
fn command(name: &str, script: &str) -> String {
    format!("name: {name}\nnodes:\n  work:\n    crew: {{ harness: command, command: [sh, -c, {script:?}] }}\n    requires: [\"harness:command\"]\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_step_past_its_limits_fails_and_the_others_carry_on() {
    let sources = [
        // 300 processes at once, where 64 are allowed.
        command("forks", "for i in $(seq 1 300); do sleep 5 & done; wait"),
        // 400 MB in one shell variable, where 128 MiB are allowed.
        command("hog", "x=$(head -c 400000000 /dev/zero | tr '\\0' a); echo ${#x}"),
        // Busy for up to ten minutes, where one second of CPU time is allowed.
        command("spin", "end=$(( $(date +%s) + 600 )); while [ $(date +%s) -lt $end ]; do :; done"),
        command("calm", "sleep 3; echo calm"),
    ];
    let sources: Vec<&str> = sources.iter().map(String::as_str).collect();
    let env = Env::start(&sources).await;
    let vars = [
        ("SHOPFLOOR_HOST_UNSANDBOXED", "false".to_owned()),
        ("SHOPFLOOR_HOST_MAX_PROCESSES", "64".to_owned()),
        ("SHOPFLOOR_HOST_MAX_MEMORY_MIB", "128".to_owned()),
        ("SHOPFLOOR_HOST_MAX_CPU_SECS", "1".to_owned()),
    ];
    let _host = env.host_full("limited", 4, "linux,harness:command", &env.dir.path().join("claude"), None, &vars).await;
    let mut runs = Vec::new();
    for name in ["forks", "hog", "spin", "calm"] {
        runs.push((name, env.submit(name, vec![json!({})]).await[0]));
    }
    for (name, run) in &runs {
        env.until(*run, "SELECT status <> 'running' FROM runs WHERE run_id = $1", Duration::from_secs(180), name).await;
        let (state, reason, class, text): (String, Option<String>, Option<String>, Option<String>) =
            sqlx::query_as("SELECT state, reason, failure_class, output->>'text' FROM steps WHERE run_id = $1 AND node = 'work' ORDER BY attempt DESC LIMIT 1")
                .bind(run)
                .fetch_one(&env.db.pool)
                .await
                .unwrap();
        let got = (state.as_str(), reason.as_deref(), class.as_deref());
        match *name {
            "calm" => assert_eq!(got, ("succeeded", None, None), "{text:?}"),
            _ => assert_eq!(got, ("failed", Some("resource_limit"), Some("final")), "{name}: {text:?}"),
        }
    }
    // The host carries on: it takes another step after them.
    let again = env.submit("calm", vec![json!({})]).await[0];
    env.until(again, "SELECT status = 'completed' FROM runs WHERE run_id = $1", Duration::from_secs(120), "completed").await;
    env.finish().await;
}
