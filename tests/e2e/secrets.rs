//! No secret leaks: `shopfloor serve` (API and engine, the GitHub App against the fake GitHub)
//! and a `shopfloor host` run a webhook-triggered issue through to a pull request, with known
//! test secrets everywhere: the webhook secret, the App's private key, the JWT signing key and
//! the secret key that seals it,
//! bearer tokens (a person's, a registration token, the host's credential), a console session
//! cookie and the installation tokens the fake GitHub mints (`ghs_…`). Bad requests (a bad
//! signature, bad tokens, bad JSON) produce error bodies. Then every process's output (logs at
//! debug for shopfloor's own crates), every answer, every run event and the project's event
//! stream are searched for each secret, as written and in base64: none may appear.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use data_encoding::{BASE64, BASE64URL_NOPAD, HEXLOWER};
use engine::ids::RunId;
use engine::store::{Actor, Change, installations, workflows};
use engine::testkit::test_db;
use serde_json::{Value, json};
use shopfloor_tests::github_fake::payloads::{self, user};
use shopfloor_tests::github_fake::{self, FakeGithub, WebhookClient};
use shopfloor_tests::process::{Listening, Proc, listen, sh, shopfloor};
use shopfloor_tests::shopfloor_bin;

use crate::host_env::FAKE_CLAUDE;
use crate::hosts::ISSUE_TO_PR;
use crate::support::{acme, approve, owner_token, ready_for_agent, registration, the_pull_request, widgets};

const WEBHOOK_SECRET: &str = "whsec-leaktest-5c1f0e9a7b3d";
const LOG: &str = "info,engine=debug,api=debug,host=debug,shopfloor=debug";

/// Standard output and error of a child, to files.
fn to_files(cmd: &mut Command, dir: &std::path::Path, name: &str) {
    cmd.stdout(Stdio::from(std::fs::File::create(dir.join(format!("{name}.out"))).unwrap()));
    cmd.stderr(Stdio::from(std::fs::File::create(dir.join(format!("{name}.err"))).unwrap()));
}

/// Every string value of a JSON document (a credential file's token among them).
fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(o) => o.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

/// One answer, as text: status, headers and body.
async fn answer(r: reqwest::Response) -> String {
    let mut text = format!("{}\n", r.status());
    for (k, v) in r.headers() {
        text.push_str(&format!("{k}: {}\n", v.to_str().unwrap_or("?")));
    }
    text + &r.text().await.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn no_secret_reaches_a_log_an_answer_an_event_or_the_stream() {
    let db = test_db().await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let fake = FakeGithub::start().await;
    let key_file = github_fake::app_key();

    let mut ch = Change::begin(&db.pool, Actor::System).await.unwrap();
    let acme = acme(&mut ch).await;
    workflows::put_version(&mut ch, acme.org, acme.project, "issue-to-pr", ISSUE_TO_PR).await.unwrap();
    installations::connect_for_test(&mut ch, acme.org, acme.project, 77, "acme", "acme/widgets").await.unwrap();
    let owner_token = owner_token(&mut ch, &acme, "leak test", 2).await;
    ch.commit().await.unwrap();

    std::fs::create_dir_all(d.join("remotes/acme")).unwrap();
    std::fs::create_dir_all(d.join("marks")).unwrap();
    sh(
        &d,
        "git init -q --bare -b main remotes/acme/widgets.git && git clone -q remotes/acme/widgets.git seed 2>/dev/null \
            && cd seed && echo '# widgets' > README.md && git add -A && git -c user.name=t -c user.email=t@example.com commit -q -m init \
            && git push -q origin HEAD:main",
    );
    let claude = d.join("claude");
    std::fs::write(&claude, FAKE_CLAUDE).unwrap();
    std::fs::set_permissions(&claude, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let mut cmd = shopfloor(&["serve", "--log", LOG], &db.url);
    cmd.env("SHOPFLOOR_DRAIN_SECS", "2").env("SHOPFLOOR_GITHUB_WEBHOOK_SECRET", WEBHOOK_SECRET);
    github_fake::as_app(&mut cmd, &fake.url, 2);
    to_files(&mut cmd, &d, "serve");
    let Listening { proc: serve, base } = listen(cmd).await;
    let http = reqwest::Client::new();
    let mut answers = Vec::new();

    // The project's event stream, read until the end of the test.
    let stream = Arc::new(Mutex::new(String::new()));
    let reader = {
        let (stream, response) =
            (stream.clone(), http.get(format!("{base}/api/v1/orgs/acme/projects/web/events")).bearer_auth(&owner_token).send().await.unwrap());
        assert_eq!(response.status(), 200);
        tokio::spawn(async move {
            let mut response = response;
            while let Ok(Some(chunk)) = response.chunk().await {
                stream.lock().unwrap().push_str(&String::from_utf8_lossy(&chunk));
            }
        })
    };

    // A console session, signed in with the person's token.
    let signin = http.get(format!("{base}/signin")).send().await.unwrap();
    let pre = signin
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|c| c.split(';').next().unwrap().to_owned())
        .collect::<Vec<_>>()
        .join("; ");
    let page = signin.text().await.unwrap();
    let main = &page[page.find("<main").expect("a main element")..];
    let at = main.find("name=\"_csrf\"").expect("a CSRF field");
    let rest = &main[at..];
    let rest = &rest[rest.find("value=\"").unwrap() + 7..];
    let csrf = rest[..rest.find('"').unwrap()].to_owned();
    let no_redirects = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let signed_in = no_redirects
        .post(format!("{base}/signin/token"))
        .header("cookie", &pre)
        .form(&[("_csrf", csrf.as_str()), ("token", owner_token.as_str()), ("next", "/")])
        .send()
        .await
        .unwrap();
    let session = signed_in
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| c.strip_prefix("shopfloor_session=").map(|v| v.split(';').next().unwrap().to_owned()))
        .expect("a session cookie");
    // (The sign-in's own answer carries the cookie: that is its job, so it is not searched.)

    // A host, registered with a registration token made over the API.
    let registration = registration(&base, &owner_token, "leak-test host").await;
    let work = d.join("host");
    let mut cmd = Command::new(shopfloor_bin());
    cmd.args(["host", "--log", LOG, "--capabilities", "linux,harness:claude-code", "--name", "leaky", "--max-concurrent", "2"])
        .arg("--server")
        .arg(&base)
        .arg("--work-dir")
        .arg(&work)
        .arg("--claude-command")
        .arg(&claude)
        .arg("--git-url-template")
        .arg(format!("{}/remotes/{{repo}}.git", d.display()))
        .env("SHOPFLOOR_HOST_TOKEN", &registration)
        .env("SHOPFLOOR_HOST_HEARTBEAT_SECS", "2")
        .env("SHOPFLOOR_DRAIN_SECS", "2")
        .env("MARKS", d.join("marks"))
        // The stand-in writes its marks where the test reads them: no walls, `MARKS` passed on.
        .env("SHOPFLOOR_HOST_UNSANDBOXED", "true")
        .env("SHOPFLOOR_HOST_PASS_ENV", "MARKS");
    to_files(&mut cmd, &d, "host");
    let host = Proc(cmd.spawn().unwrap());

    // A signed webhook opens the run; the plan runs on the host; a person approves over the
    // API and looks at the run in the console; the build pushes; the pull request is opened
    // with an installation token; CI passes; the run completes.
    let repo = widgets();
    let issue = ready_for_agent(&fake, 7, "Add a widget");
    let hooks = WebhookClient::new(&base, WEBHOOK_SECRET);
    let (status, body) = hooks.send("issues", "delivery-1", &payloads::issues_event("labeled", &repo, &issue, &user("alice"), Some("ready-for-agent"))).await;
    assert_eq!(status, 202, "{body}");
    answers.push(("webhook answer".to_owned(), body.to_string()));
    let run: RunId = sqlx::query_scalar("SELECT run_id FROM runs").fetch_one(&db.pool).await.unwrap();
    let until = |sql: &'static str, what: &'static str| {
        let pool = db.pool.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !sqlx::query_scalar::<_, bool>(sql).bind(run).fetch_one(&pool).await.unwrap() {
                assert!(Instant::now() < deadline, "{run} never {what}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    until("SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'review_plan' AND state = 'waiting')", "asked for approval").await;
    let run_page = format!("{base}/orgs/acme/projects/web/runs/{run}");
    let page = http.get(&run_page).header("cookie", format!("shopfloor_session={session}")).send().await.unwrap();
    assert_eq!(page.status(), 200, "the console session works");
    answers.push(("console run page".to_owned(), answer(page).await));
    let approved = approve(&http, &base, &owner_token, run, "review_plan").await;
    assert!(approved.status().is_success());
    answers.push(("approval".to_owned(), answer(approved).await));
    until("SELECT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND node = 'ci' AND state = 'waiting')", "waited on CI").await;
    let pr = the_pull_request(&fake);
    let head = pr["head"]["sha"].as_str().unwrap().to_owned();
    let number = pr["number"].as_i64().unwrap();
    let (status, body) =
        hooks.send("check_run", "delivery-2", &payloads::check_run_event("completed", &repo, 1, "test", &head, "completed", Some("success"), &[number])).await;
    assert_eq!(status, 202);
    answers.push(("check webhook answer".to_owned(), body.to_string()));
    until("SELECT status = 'completed' FROM runs WHERE run_id = $1", "completed").await;
    let minted = fake.requests_to("POST", "/app/installations/77/access_tokens").len();
    assert!(minted >= 1, "installation tokens were minted");

    // Bad requests, several carrying secrets where they do not belong.
    let (_, body) = hooks.send_raw("issues", "delivery-3", br#"{"zen":"x"}"#.to_vec(), Some("sha256=0000")).await;
    answers.push(("bad signature".to_owned(), body.to_string()));
    let other = WebhookClient::new(&base, "not the secret");
    let (status, body) = other.send("issues", "delivery-4", &json!({ "secret": WEBHOOK_SECRET })).await;
    assert_eq!(status, 401);
    answers.push(("signed with another secret".to_owned(), body.to_string()));
    let runs = format!("{base}/api/v1/orgs/acme/projects/web/runs");
    for (what, token) in [
        ("tampered token", format!("{owner_token}x")),
        ("webhook secret as a token", WEBHOOK_SECRET.to_owned()),
        ("registration token as a person", registration.clone()),
    ] {
        let r = http.get(&runs).bearer_auth(&token).send().await.unwrap();
        assert!(r.status().is_client_error(), "{what}: {}", r.status());
        answers.push((what.to_owned(), answer(r).await));
    }
    let r = http
        .post(&runs)
        .bearer_auth(&owner_token)
        .header("content-type", "application/json")
        .body(format!("{{\"workflow\": \"{owner_token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    answers.push(("bad JSON".to_owned(), answer(r).await));
    let r = http.post(format!("{base}/api/v1/host/claim")).bearer_auth(format!("{registration}x")).json(&json!({ "max": 0 })).send().await.unwrap();
    assert!(r.status().is_client_error());
    answers.push(("host claim with a bad credential".to_owned(), answer(r).await));
    let r = no_redirects
        .post(format!("{base}/signin/token"))
        .header("cookie", &pre)
        .form(&[("_csrf", csrf.as_str()), ("token", &format!("{owner_token}x")), ("next", "/")])
        .send()
        .await
        .unwrap();
    answers.push(("console sign-in with a bad token".to_owned(), answer(r).await));
    let r = http.get(&run_page).header("cookie", format!("shopfloor_session={session}x")).send().await.unwrap();
    answers.push(("console with a bad session".to_owned(), answer(r).await));

    // Let the stream and the logs catch up, then stop everything.
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(host);
    drop(serve);
    reader.abort();

    // The secrets, now that every one exists.
    let credential: Value = serde_json::from_str(&std::fs::read_to_string(work.join("credential.json")).unwrap()).unwrap();
    let mut credential_strings = Vec::new();
    strings(&credential, &mut credential_strings);
    let host_credential = credential_strings.into_iter().find(|s| s.len() > 40 && s.split('.').count() == 3).expect("a JWT in credential.json");
    // Signing keys are sealed at rest: what leaks would be the opened secret.
    let sealed: Vec<(String, Vec<u8>)> = sqlx::query_as("SELECT kid, sealed FROM signing_keys").fetch_all(&db.pool).await.unwrap();
    let signing_keys: Vec<Vec<u8>> = sealed
        .iter()
        .map(|(kid, sealed)| {
            secrecy::ExposeSecret::expose_secret(&engine::testkit::secret_key().open(engine::sealing::Sealed::SigningKey(kid), sealed).unwrap()).to_vec()
        })
        .collect();
    let pem = std::fs::read_to_string(&key_file).unwrap();
    let mut secrets: Vec<(String, String)> = vec![
        ("webhook secret".into(), WEBHOOK_SECRET.into()),
        ("SHOPFLOOR_SECRET_KEY".into(), engine::testkit::SECRET_KEY.into()),
        ("person's token".into(), owner_token.clone()),
        ("registration token".into(), registration.clone()),
        ("host credential".into(), host_credential),
        ("console session".into(), session.clone()),
        // Every token the fake mints starts so; none may be seen anywhere.
        ("installation token".into(), "ghs_".into()),
    ];
    for key in &signing_keys {
        secrets.push(("JWT signing key (hex)".into(), HEXLOWER.encode(key)));
        secrets.push(("JWT signing key (base64)".into(), BASE64.encode(key)));
        secrets.push(("JWT signing key (base64url)".into(), BASE64URL_NOPAD.encode(key)));
    }
    // The App key's body lines are base64 already; any one of them is a leak.
    for line in pem.lines().filter(|l| !l.starts_with("-----") && l.len() >= 32) {
        secrets.push(("GitHub App key".into(), line.to_owned()));
    }
    for (what, s) in secrets.clone() {
        if s.len() >= 8 && what != "installation token" && !what.starts_with("GitHub App key") {
            secrets.push((format!("{what} (base64)"), BASE64.encode(s.as_bytes())));
            secrets.push((format!("{what} (base64url)"), BASE64URL_NOPAD.encode(s.as_bytes())));
        }
    }

    // Where they must not be.
    let mut places: Vec<(String, String)> = Vec::new();
    for name in ["serve.out", "serve.err", "host.out", "host.err"] {
        places.push((name.to_owned(), std::fs::read_to_string(d.join(name)).unwrap_or_default()));
    }
    let events: Vec<String> = sqlx::query_scalar("SELECT kind || ' ' || coalesce(node, '') || ' ' || attrs::text FROM run_events ORDER BY event_id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    places.push(("run events".to_owned(), events.join("\n")));
    places.push(("event stream".to_owned(), stream.lock().unwrap().clone()));
    for (what, text) in answers {
        places.push((format!("answer: {what}"), text));
    }
    // The search means something: the logs, the events and the stream saw the run.
    assert!(places[1].1.contains("delivery ingested"), "the server logged the run: {}", places[1].1.len());
    assert!(events.iter().any(|e| e.starts_with("run.completed")), "{events:?}");
    assert!(places.iter().any(|(w, t)| w == "event stream" && t.contains("run.completed")), "the stream saw the run end");

    let mut leaks = Vec::new();
    for (where_, text) in &places {
        for (what, secret) in &secrets {
            if text.contains(secret.as_str()) {
                let at = text.find(secret.as_str()).unwrap();
                let from = text[..at].char_indices().rev().nth(80).map_or(0, |(i, _)| i);
                leaks.push(format!("{what} in {where_}: …{}…", &text[from..(at + secret.len()).min(text.len())]));
            }
        }
    }
    assert!(leaks.is_empty(), "{} leak(s):\n{}", leaks.len(), leaks.join("\n"));
    db.finish().await;
}
