//! The walls around crew steps, through a real `shopfloor host` (inside walls, as a host runs
//! unless told otherwise) and `shopfloor serve`: two `command` steps at once act as an attacker
//! would, and neither finds the host's credential (its file or its environment), the other's
//! work or the host's work directory, nor writes outside its own directory; a process one left
//! running with `setsid` is gone when its step ends.

use std::time::Duration;

use serde_json::json;

use super::host_env::Env;

/// Each step writes a secret of its own, then for ten seconds looks for the other's, and says
/// what it could find and do; it leaves a process behind in a session of its own.
fn workflow() -> String {
    let script = r#"read -r work
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
echo x > "$work/written-by-$me" 2>/dev/null
echo x > "/etc/written-by-$me" 2>/dev/null
setsid sleep 297 >/dev/null 2>&1 < /dev/null &
echo done"#;
    let indented: String = script.lines().map(|l| format!("          {l}\n")).collect();
    format!(
        "name: attack\nnodes:\n  work:\n    crew:\n      harness: command\n      prompt: \"{{{{ input.work }}}}\"\n      command:\n        - sh\n        - -c\n        - |\n{indented}    requires: [\"harness:command\"]\n"
    )
}

/// The pids of live processes whose command line is `sleep 297`.
fn left_behind() -> Vec<i32> {
    super::host_env::live_processes(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == b"sleep\x00297\x00"))
}

#[tokio::test(flavor = "multi_thread")]
async fn two_steps_at_once_find_nothing_of_the_host_nor_of_each_other() {
    let source = workflow();
    let env = Env::start(&[&source]).await;
    let work = env.dir.path().join("hosts").join("walled");
    let vars = [("SHOPFLOOR_HOST_UNSANDBOXED", "false".to_owned())];
    let _host = env.host_full("walled", 2, "linux,harness:command", &env.dir.path().join("claude"), None, &vars).await;
    let input = json!({ "work": work.display().to_string() });
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
        for seen in ["other: none", "credential: hidden", "token: not in env", "attempts: 1", "done"] {
            assert!(text.lines().any(|l| l == seen), "`{seen}` not in what the step saw:\n{text}");
        }
        spans.push((started, finished));
    }
    // They ran at the same time: each looked while the other's secret was there.
    assert!(spans[0].0 < spans[1].1 && spans[1].0 < spans[0].1, "the steps did not overlap: {spans:?}");
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
        command("calm", "sleep 3; echo calm"),
    ];
    let sources: Vec<&str> = sources.iter().map(String::as_str).collect();
    let env = Env::start(&sources).await;
    let vars = [
        ("SHOPFLOOR_HOST_UNSANDBOXED", "false".to_owned()),
        ("SHOPFLOOR_HOST_MAX_PROCESSES", "64".to_owned()),
        ("SHOPFLOOR_HOST_MAX_MEMORY_MIB", "128".to_owned()),
    ];
    let _host = env.host_full("limited", 3, "linux,harness:command", &env.dir.path().join("claude"), None, &vars).await;
    let mut runs = Vec::new();
    for name in ["forks", "hog", "calm"] {
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
