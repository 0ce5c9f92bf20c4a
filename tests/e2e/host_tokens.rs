//! Installation tokens that outlive the step: the server (as the GitHub App, against the fake
//! GitHub) mints tokens that live a few seconds, the Claude Code stand-in waits until the
//! claim's token has expired (then tokens live an hour), and the push still uses a token the
//! fake minted after that: the host asked the server for a fresh one (`POST
//! /api/v1/host/steps/{step}/token`) before it pushed. The same holds for an attempt adopted by
//! a host killed with SIGKILL and started again on its work directory while the harness ran
//! on: the journal keeps no token, and the adopted attempt asks for one.
//!
//! Pushes go to a local bare repository, so the token git sends is read from a `git` wrapper
//! on the host's `PATH` that notes the time and the `http.extraHeader` of each fetch and push.

use std::time::Duration;

use serde_json::json;

use super::host_env::*;

const LONG: &str = include_str!("../workflows/long.yaml");

/// A `git` that notes `<verb> <unix ms> <token or ->` of each call that reaches the remote
/// (fetch, push, the cache's clone; not an attempt's worktree, cloned from the cache) in
/// `$MARKS/git.log`, then runs git.
fn git_wrapper(env: &Env) -> String {
    let real = String::from_utf8(std::process::Command::new("sh").args(["-c", "command -v git"]).output().unwrap().stdout).unwrap().trim().to_owned();
    let bin = env.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = format!(
        "#!/usr/bin/env bash\ncase \"$1 $*\" in *--shared*) ;; fetch*|push*|clone*)\n  printf '%s %s %s\\n' \"$1\" \"$(date +%s%3N)\" \"${{GIT_CONFIG_VALUE_0:--}}\" >> \"$MARKS/git.log\";;\nesac\nexec {real} \"$@\"\n"
    );
    std::fs::write(bin.join("git"), script).unwrap();
    std::fs::set_permissions(bin.join("git"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default())
}

/// The git calls noted so far: (verb, unix ms, the token in the header if any).
fn git_calls(env: &Env) -> Vec<(String, i64, Option<String>)> {
    let text = std::fs::read_to_string(env.marks().join("git.log")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ' ');
            let (verb, ms, header) = (f.next()?, f.next()?.parse().ok()?, f.next()?);
            // `AUTHORIZATION: basic <base64 of x-access-token:TOKEN>`
            let token = header
                .rsplit(' ')
                .next()
                .and_then(|b| data_encoding::BASE64.decode(b.as_bytes()).ok())
                .and_then(|d| String::from_utf8(d).ok().and_then(|s| s.strip_prefix("x-access-token:").map(str::to_owned)));
            Some((verb.to_owned(), ms, token))
        })
        .collect()
}

async fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let waited = async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(limit, waited).await.unwrap_or_else(|_| panic!("never {what}"));
}

/// The push-scoped tokens the fake minted.
fn push_tokens(env: &Env) -> Vec<shopfloor_tests::github_fake::Minted> {
    let fake = env.github.as_ref().unwrap();
    fake.minted().into_iter().filter(|m| m.body["permissions"] == json!({ "contents": "write" })).collect()
}

/// Checks the push: one push, with a token the fake minted for pushing, not the claim's, minted
/// after the `after`th push token and with the hour-long lifetime the test set once the claim's
/// token had expired: a token asked for after that, valid when git pushed.
fn assert_pushed_with_a_fresh_token(env: &Env, after: usize) {
    let pushes: Vec<_> = git_calls(env).into_iter().filter(|c| c.0 == "push").collect();
    assert_eq!(pushes.len(), 1, "{pushes:?}");
    let (_, _, token) = &pushes[0];
    let token = token.as_deref().expect("the push carried an installation token");
    let minted = push_tokens(env);
    let index = minted.iter().position(|m| m.token == token).unwrap_or_else(|| panic!("the push's token was not one the fake minted for pushing"));
    assert!(index >= after, "the push used an old token (#{index} of {}), not one asked for after #{after}", minted.len());
    assert_ne!(minted[0].token, token, "the push used the claim's token");
    let lives = minted[index].expires_at - minted[0].expires_at;
    assert!(lives > chrono::Duration::minutes(30), "the push's token is not one minted after the claim's token expired");
}

/// Waits until the claim's token (the first minted to push) has expired, lets the harness of
/// `step` finish, and checks that the run completed.
async fn finish_past_the_claim_tokens_expiry(env: &Env, run: engine::ids::RunId, step: &str) {
    let claims = push_tokens(env)[0].expires_at;
    wait_for("past the claim token's expiry", Duration::from_secs(120), || chrono::Utc::now() > claims + chrono::Duration::seconds(1)).await;
    // From now on tokens live an hour: the one the push carries must be asked for after this.
    env.github.as_ref().unwrap().set_token_lifetime(Duration::from_secs(3600));
    std::fs::write(env.marks().join(format!("{step}.go")), "").unwrap();

    env.until(run, "SELECT status <> 'running' FROM runs WHERE run_id = $1", Duration::from_secs(60), "ended").await;
    assert_eq!(env.status(run).await, ("completed".to_owned(), None));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_step_that_outlives_its_token_pushes_with_a_fresh_one() {
    let env = Env::start_with(&[LONG], true).await;
    env.github.as_ref().unwrap().set_token_lifetime(Duration::from_secs(3));
    let path = git_wrapper(&env);
    let _host = env.host_env("solo", 1, &[("PATH", path)]).await;
    let (run, step, _) = env.working("long", json!({ "repository": "acme/widgets", "issue": 9, "title": "Long work" })).await;

    // The claim's token (the first minted to push) expires while the harness works.
    wait_for("a token minted at the claim", Duration::from_secs(120), || !push_tokens(&env).is_empty()).await;
    finish_past_the_claim_tokens_expiry(&env, run, &step).await;
    let remote = env.dir.path().join("remotes/acme/widgets.git");
    assert_eq!(git_out(&remote, &["log", "-1", "--format=%s", "shopfloor/9-long-work"]), "work: Long work");
    // The fetch asked for a token too (the claim's, or a fresh one: any the fake minted).
    let fetches: Vec<_> = git_calls(&env).into_iter().filter(|c| c.0 != "push").collect();
    assert!(!fetches.is_empty() && fetches.iter().all(|f| f.2.as_ref().is_some_and(|t| push_tokens(&env).iter().any(|m| &m.token == t))), "{fetches:?}");
    assert_pushed_with_a_fresh_token(&env, 1);
    drop(_host);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_adopted_attempt_pushes_with_a_fresh_token() {
    let env = Env::start_with(&[LONG], true).await;
    env.github.as_ref().unwrap().set_token_lifetime(Duration::from_secs(3));
    let path = git_wrapper(&env);
    let mut victim = env.host_env("victim", 1, &[("PATH", path.clone())]).await;
    let (run, step, harness) = env.working("long", json!({ "repository": "acme/widgets", "issue": 11, "title": "Adopted work" })).await;

    // Killed mid-step; the harness runs on. Started again on the same work directory (within
    // the lease), the host adopts it and asks for a token: the journal kept none.
    victim.sigkill();
    assert!(alive(harness), "the harness should outlive its host");
    let before = push_tokens(&env).len();
    let _again = env.host_env("victim", 1, &[("PATH", path)]).await;
    wait_for("a token asked for by the adopting host", Duration::from_secs(120), || push_tokens(&env).len() > before).await;
    finish_past_the_claim_tokens_expiry(&env, run, &step).await;
    // The one attempt, finished by the adopting host: not taken back.
    let attempts: Vec<(i32, String)> =
        sqlx::query_as("SELECT attempt, state FROM steps WHERE run_id = $1 AND node = 'work'").bind(run).fetch_all(&env.db.pool).await.unwrap();
    assert_eq!(attempts, [(1, "succeeded".to_owned())]);
    let remote = env.dir.path().join("remotes/acme/widgets.git");
    assert_eq!(git_out(&remote, &["log", "-1", "--format=%s", "shopfloor/11-adopted-work"]), "work: Adopted work");
    assert_pushed_with_a_fresh_token(&env, before);
    drop(_again);
    env.finish().await;
}
