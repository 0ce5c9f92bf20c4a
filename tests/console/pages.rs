//! The console over plain HTTP, as a browser with scripts off uses it: sign-in (token and
//! GitHub), the session cookie's attributes, CSRF on every form, each page's one h1 and
//! labelled fields, approving with validation messages, cancel, sign-out.

use engine::store::{Actor, Change, workflows};
use reqwest::StatusCode;

use crate::support::{Answer, App, Browser, acme, acme_owner, count, field, page_csrf};

/// Every `<input>`, `<select>` and `<textarea>` that is not hidden has a `<label for>` naming
/// its id, and the page has one `<h1>`.
fn accessible(html: &str, page: &str) {
    assert_eq!(count(html, "<h1"), 1, "{page}: one h1");
    for tag in ["<input", "<select", "<textarea"] {
        for (at, _) in html.match_indices(tag) {
            let rest = &html[at..];
            let end = rest.find('>').unwrap_or(rest.len());
            let element = &rest[..end];
            if element.contains("type=\"hidden\"") {
                continue;
            }
            let id = element.split("id=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or_else(|| panic!("{page}: a field without an id: {element}"));
            assert!(html.contains(&format!("for=\"{id}\"")), "{page}: field #{id} has no label");
        }
    }
}

/// Presses the button at `path` that removes `gone`: the page it leads to no longer shows it.
async fn removes(b: &mut Browser, path: &str, csrf: &str, gone: &str) {
    let page = b.press_and_follow(path, csrf).await;
    assert!(!page.body.contains(gone), "{}", page.body);
}

/// Opens a page that must answer 200 and be [`accessible`].
async fn open(b: &mut Browser, path: &str, page: &str) -> Answer {
    let answer = b.get(path).await;
    assert_eq!(answer.status, StatusCode::OK, "{page}: {}", answer.body);
    accessible(&answer.body, page);
    answer
}

#[tokio::test]
async fn a_failed_steps_own_words_show_under_its_reason_escaped() {
    let (app, org, mut b) = acme_owner(true).await;
    let host = crate::browser::register_host(&app, &org).await;
    // As a host reports a push GitHub refused: the refused ref, then the remote's lines.
    let said = " ! [remote rejected] HEAD -> shopfloor/7-x (refusing to allow a GitHub App to create or update \
                workflow without workflows permission)\nremote: <script>alert(1)</script>";
    let failure = engine::store::steps::Failure { reason: "push_refused".into(), class: engine::store::steps::FailureClass::Final, exit_code: None };
    let run = crate::browser::failed_crew_run(&app, &org, &host, serde_json::json!({ "error": said }), failure).await;
    let page = b.get(&format!("/orgs/acme/projects/web/runs/{run}")).await;
    assert_eq!(page.status, StatusCode::OK);
    let steps = &page.body[page.body.find("id=\"steps\"").unwrap()..];
    let rows = &steps[steps.find("<tbody>").unwrap()..];
    let row = &rows[..rows.find("</tr>").unwrap()];
    assert!(row.contains("The repository refused the push") && row.contains("push_refused"), "{row}");
    assert!(row.contains("<span class=\"said\"> ! [remote rejected] HEAD -&gt; shopfloor"), "{row}");
    assert!(row.contains("refusing to allow a GitHub App to create or update workflow without workflows permission"), "{row}");
    assert!(!page.body.contains("<script>alert(1)") && row.contains("&lt;script&gt;alert(1)&lt;"), "the host's words are escaped: {row}");
    app.discard().await;
}

#[tokio::test]
async fn the_run_page_says_a_step_ran_without_walls_and_where_it_was_refused() {
    use engine::store::hosts as host_store;
    let (app, org, mut b) = acme_owner(true).await;
    let host = crate::browser::register_host(&app, &org).await;
    let run = app.submit(&org, org.agent).await;
    app.until_build_pending(run).await;
    let claimed = host_store::claim(app.pool(), &engine::catalog::Catalog::default(), &host, 1).await.expect("claim");
    let step = claimed.assignments.first().expect("the crew step is claimed").step;
    // As a host started with --unsandboxed starts it, and as a walled one reports its proxy's
    // refusals: the same destination twice (a report sent again) is recorded once.
    host_store::start(app.pool(), &host, step, "command", true).await.expect("start");
    let refused = ["evil.example:443".to_owned(), "127.0.0.1:5432".to_owned()];
    for _ in 0..2 {
        let report = host_store::Report { harness: Some("command"), lines: &[], usage: &protocol::Usage::default(), egress_refused: &refused };
        host_store::report(app.pool(), &host, step, report, host_store::RUN_LOG_CAP_BYTES).await.expect("report");
    }
    let recorded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM run_events WHERE run_id = $1 AND kind = 'step.egress_refused'").bind(run).fetch_one(app.pool()).await.unwrap();
    assert_eq!(recorded, 2);
    let page = open(&mut b, &format!("/orgs/acme/projects/web/runs/{run}"), "run").await;
    let said: Vec<&str> = page.body.match_indices("<p class=\"walls\">").map(|(at, _)| &page.body[at..at + page.body[at..].find("</p>").unwrap()]).collect();
    assert_eq!(said.len(), 3, "{said:?}");
    assert!(said[0].contains("ran without walls: its host builder-1 runs --unsandboxed"), "{said:?}");
    assert!(said.iter().any(|p| p.contains("was refused a connection to evil.example:443")), "{said:?}");
    assert!(said.iter().any(|p| p.contains("was refused a connection to 127.0.0.1:5432")), "{said:?}");
    app.discard().await;
}

/// The headers every answer must carry, and `no-store` unless it says otherwise.
fn hardened(a: &Answer, what: &str) {
    for (name, want) in [("x-content-type-options", "nosniff"), ("referrer-policy", "same-origin"), ("x-frame-options", "DENY")] {
        assert_eq!(a.headers.get(name).and_then(|v| v.to_str().ok()), Some(want), "{what}: {name}");
    }
    let csp = a.headers.get("content-security-policy").and_then(|v| v.to_str().ok()).unwrap_or_else(|| panic!("{what}: no CSP"));
    assert!(csp.contains("frame-ancestors 'none'"), "{what}: {csp}");
    if a.headers.get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|t| t.starts_with("text/html")) {
        assert!(csp.contains("script-src 'self'"), "{what}: {csp}");
    }
}

#[tokio::test]
async fn every_answer_carries_the_security_headers_error_pages_included() {
    let (app, _org, mut b) = acme_owner(false).await;
    let mut answers = Vec::new();
    for (path, status, what) in [
        ("/orgs/acme", StatusCode::OK, "a page"),
        ("/orgs/acme/projects/nope/runs", StatusCode::NOT_FOUND, "a console 404"),
        ("/api/v1/no/such/route", StatusCode::NOT_FOUND, "a REST 404"),
        ("/api/v1/orgs/acme/projects", StatusCode::UNAUTHORIZED, "a REST 401"),
    ] {
        let a = b.get(path).await;
        assert_eq!(a.status, status, "{what}");
        hardened(&a, what);
        answers.push(a);
    }
    let forged = b.post("/signout", &[("_csrf", "not the form's")]).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    hardened(&forged, "a console 403");
    answers.push(forged);
    for a in &answers {
        assert_eq!(a.headers.get("cache-control").and_then(|v| v.to_str().ok()), Some("no-store"));
    }
    // A static file keeps its own caching.
    let css = b.get("/static/console.css").await;
    hardened(&css, "the stylesheet");
    assert!(css.headers["cache-control"].to_str().unwrap().starts_with("public"));
    // Served over http here: no HSTS.
    assert!(!answers[0].headers.contains_key("strict-transport-security"));
    app.discard().await;
}

#[tokio::test]
async fn a_console_session_is_no_api_token_and_a_planted_pre_sign_in_cookie_signs_nobody_in() {
    let (app, org, mut b) = acme_owner(false).await;
    let session = b.cookies.get("shopfloor_session").cloned().expect("signed in");
    let token = session.split('~').find_map(|e| e.strip_prefix("acme.")).expect("acme's session token").to_owned();
    // As a bearer token of the REST API it is refused, and mints nothing.
    let mint = reqwest::Client::new()
        .post(format!("{}/api/v1/orgs/acme/tokens", b.base))
        .bearer_auth(&token)
        .json(&serde_json::json!({ "name": "from a stolen cookie", "role": "owner" }))
        .send()
        .await
        .unwrap();
    assert_eq!(mint.status(), StatusCode::UNAUTHORIZED);
    assert!(mint.text().await.unwrap().contains("console session is not an API token"));
    // The console still takes it.
    assert_eq!(b.get("/orgs/acme").await.status, StatusCode::OK);
    // Nor may an API token take the sessions' name.
    let named = reqwest::Client::new()
        .post(format!("{}/api/v1/orgs/acme/tokens", b.base))
        .bearer_auth(&org.owner_token)
        .json(&serde_json::json!({ "name": "Console Session", "role": "viewer" }))
        .send()
        .await
        .unwrap();
    assert_eq!(named.status(), StatusCode::UNPROCESSABLE_ENTITY);

    // A pre-sign-in cookie this server never made, posted with the CSRF field derived from it
    // (as another site that can set cookies for this one would): no one is signed in.
    let planted = "planted-by-someone-else-0123456789abcdef";
    let digest = <sha2::Sha256 as sha2::Digest>::digest(format!("shopfloor console csrf\n{planted}").as_bytes());
    let csrf = data_encoding::BASE64URL_NOPAD.encode(&digest[..24]);
    let mut stranger = Browser::new(&b.base);
    stranger.cookies.insert("shopfloor_pre".into(), planted.into());
    let answer = stranger.post_form("/signin/token", &csrf, &[("token", &org.owner_token), ("next", "/")]).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.body);
    assert!(!stranger.cookies.contains_key("shopfloor_session"));
    // The cookie the server made still works.
    let mut person = Browser::new(&b.base);
    assert!(person.sign_in_with_token(&org.owner_token).await.status.is_success());
    assert!(person.cookies.contains_key("shopfloor_session"));
    app.discard().await;
}

#[tokio::test]
async fn revoking_a_pasted_token_ends_the_sessions_made_from_it() {
    let (app, org) = acme(false).await;
    let mut ch = engine::store::Change::begin(app.pool(), engine::store::Actor::System).await.unwrap();
    let pasted = crate::harness::token(&mut ch, org.id, org.owner, "owner", chrono::Duration::hours(1)).await;
    ch.commit().await.unwrap();
    // A session made from the token, and one made from that session's own token.
    let mut child = Browser::new(&app.base);
    assert_eq!(child.sign_in_with_token(&pasted).await.status, StatusCode::OK);
    let entry = child.cookies.get("shopfloor_session").cloned().expect("a session cookie");
    let mut grandchild = Browser::new(&app.base);
    assert_eq!(grandchild.sign_in_with_token(entry.strip_prefix("acme.").expect("acme's session")).await.status, StatusCode::OK);
    let mut other = app.signed_in(&org.owner_token).await;

    // The owner revokes the pasted token through the API.
    let jti: uuid::Uuid =
        sqlx::query_scalar("SELECT jti FROM api_tokens WHERE name = 'test' AND expires_at < now() + interval '2 hours'").fetch_one(app.pool()).await.unwrap();
    let revoked = app.http.delete(format!("{}/api/v1/orgs/acme/tokens/{jti}", app.base)).bearer_auth(&org.owner_token).send().await.unwrap();
    assert_eq!(revoked.status(), StatusCode::NO_CONTENT);

    for (who, browser) in [("made from the token", &mut child), ("made from that session", &mut grandchild)] {
        let page = browser.get("/orgs/acme").await;
        assert_eq!(page.status, StatusCode::SEE_OTHER, "the session {who} still opens pages: {}", page.body);
        assert!(page.location().starts_with("/signin?next="), "{who}: {}", page.location());
    }
    assert_eq!(other.get("/orgs/acme").await.status, StatusCode::OK, "a session made from another token goes on");
    let (action, detail): (String, serde_json::Value) =
        sqlx::query_as("SELECT action, detail FROM audit_log WHERE action = 'token.revoke' ORDER BY at DESC LIMIT 1").fetch_one(app.pool()).await.unwrap();
    assert_eq!((action.as_str(), &detail["sessions_revoked"]), ("token.revoke", &serde_json::json!(2)));
}

#[tokio::test]
async fn token_sign_in_gives_a_session_cookie_and_every_page_renders() {
    let (app, org) = acme(true).await;
    let run = app.asking(&org).await;
    let mut b = Browser::new(&app.base);

    // Not signed in: to the sign-in page, and back afterwards.
    let first = b.get("/orgs/acme").await;
    assert_eq!(first.status, StatusCode::SEE_OTHER);
    assert!(first.location().starts_with("/signin?next="), "{}", first.location());

    let signin = b.get("/signin").await;
    accessible(&signin.body, "sign-in");
    let pre = signin.headers.get_all("set-cookie").iter().map(|v| v.to_str().unwrap().to_owned()).collect::<Vec<_>>().join("\n");
    assert!(pre.contains("HttpOnly") && pre.contains("SameSite=Lax") && !pre.contains("Secure"), "{pre}");

    // A wrong token stays signed out.
    let csrf = page_csrf(&signin.body);
    let bad = b.post_form("/signin/token", &csrf, &[("token", "nope"), ("next", "/")]).await;
    assert!(bad.location().contains("error=token"), "{}", bad.location());

    // A place to go back to that a browser reads as another site (it drops tabs and newlines
    // from a URL: `/\t/evil.example` is `//evil.example`) is replaced by the org's home.
    for next in ["/\t/evil.example", "/\n/evil.example", "//evil.example", "/\\evil.example", "https://evil.example/"] {
        let mut c = Browser::new(&app.base);
        let query: String = url::form_urlencoded::Serializer::new(String::new()).append_pair("next", next).finish();
        let signin = c.get(&format!("/signin?{query}")).await;
        assert_eq!(signin.status, StatusCode::OK, "{next:?}: {}", signin.body);
        let csrf = page_csrf(&signin.body);
        let landed = c.post_form("/signin/token", &csrf, &[("token", &org.owner_token), ("next", next)]).await;
        assert_eq!(landed.status, StatusCode::SEE_OTHER, "{next:?}: {}", landed.body);
        assert_eq!(landed.location(), "/orgs/acme", "{next:?}");
    }

    let today = b.sign_in_with_token(&org.owner_token).await;
    assert_eq!(today.status, StatusCode::OK, "{}", today.body);
    assert!(today.body.contains("Today in acme"));
    let cookie = b.cookies.get("shopfloor_session").cloned().expect("a session cookie");
    assert!(cookie.starts_with("acme.") && !cookie.contains(&org.owner_token), "the pasted token is never the session");
    // A session never outlives the token it was made from: one with an hour left makes a
    // session of an hour, not of the configured twelve.
    let mut ch = engine::store::Change::begin(app.pool(), engine::store::Actor::System).await.unwrap();
    let short = crate::harness::token(&mut ch, org.id, org.owner, "owner", chrono::Duration::hours(1)).await;
    ch.commit().await.unwrap();
    Browser::new(&app.base).sign_in_with_token(&short).await;
    let (token_ends, session_ends): (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) = sqlx::query_as(
        "SELECT (SELECT max(expires_at) FROM api_tokens WHERE name = 'test' AND expires_at < now() + interval '2 hours'), \
                (SELECT expires_at FROM api_tokens WHERE name = 'console session' ORDER BY created_at DESC, jti DESC LIMIT 1)",
    )
    .fetch_one(app.pool())
    .await
    .unwrap();
    assert!(session_ends <= token_ends, "the session ends {session_ends}, after its token ({token_ends})");
    assert!(today.body.contains("Ship the release?"), "the approval is under Needs you");
    accessible(&today.body, "today");

    let base = "/orgs/acme/projects/web";
    for path in [
        format!("{base}/runs"),
        format!("{base}/runs?status=running&workflow=approve"),
        format!("{base}/runs/{run}"),
        format!("{base}/hosts"),
        format!("{base}/workflows"),
        format!("{base}/workflows/approve"),
        "/orgs/acme/audit".to_owned(),
        "/orgs/acme/audit?action=run.*".to_owned(),
        "/orgs/acme/tokens".to_owned(),
    ] {
        let page = open(&mut b, &path, &path).await;
        assert!(page.headers.get("content-security-policy").is_some(), "{path}");
    }
    let run_page = b.get(&format!("{base}/runs/{run}")).await;
    assert!(run_page.body.contains("Waiting for approval at review"), "the headline says what it does");
    assert!(run_page.body.contains("<svg class=\"graph\"") && run_page.body.contains("‖ approval · waiting"), "the graph shows node states in words");
    app.discard().await;
}

#[tokio::test]
async fn forms_need_their_csrf_field_and_approving_checks_the_fields() {
    let (app, org) = acme(true).await;
    let run = app.asking(&org).await;
    let mut b = app.signed_in(&org.owner_token).await;
    let path = format!("/orgs/acme/projects/web/runs/{run}");
    let page = b.get(&path).await;
    let csrf = page_csrf(&page.body);

    // Without the field, or with another session's, nothing happens.
    let forged = b.post(&format!("{path}/approve/review"), &[("ticket", "T-1")]).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let forged = b.post(&format!("{path}/cancel"), &[("_csrf", "x")]).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let status: String = app.read("SELECT status FROM runs WHERE run_id = $1", run).await;
    assert_eq!(status, "running");

    // A required field left empty and a number that is not one: both messages, nothing decided.
    let refused = b.post_form(&format!("{path}/approve/review"), &csrf, &[("ticket", " "), ("risk", "high")]).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    refused.shows("ticket is required");
    refused.shows("risk must be a number");
    assert!(refused.body.contains("aria-invalid=\"true\""));
    let open: bool = app.read("SELECT decision IS NULL FROM approvals WHERE run_id = $1", run).await;
    assert!(open, "the run keeps waiting");

    let approved = b.post_form(&format!("{path}/approve/review"), &csrf, &[("ticket", "T-42"), ("risk", "2")]).await;
    assert_eq!(approved.status, StatusCode::SEE_OTHER, "{}", approved.body);
    let answer: serde_json::Value = app.read("SELECT answer FROM approvals WHERE run_id = $1", run).await;
    assert_eq!(answer, serde_json::json!({ "ticket": "T-42", "risk": 2 }));
    let approver: String = app.read("SELECT decided_by FROM approvals WHERE run_id = $1", run).await;
    assert!(approver.contains(&org.owner.to_string()), "decided by the signed-in person: {approver}");

    // Cancel another run.
    let slow = app.submit(&org, org.slow).await;
    let cancelled = b.post_form(&format!("/orgs/acme/projects/web/runs/{slow}/cancel"), &csrf, &[("reason", "not today")]).await;
    assert_eq!(cancelled.status, StatusCode::SEE_OTHER);
    let (status, reason): (String, Option<String>) =
        sqlx::query_as("SELECT status, reason FROM runs WHERE run_id = $1").bind(slow).fetch_one(app.pool()).await.unwrap();
    assert_eq!((status.as_str(), reason.as_deref()), ("cancelled", Some("cancelled: not today")));

    // A viewer reads, and has no forms to act with; a post is refused by the REST API's role check.
    let mut v = app.signed_in(&org.viewer_token).await;
    let page = v.get(&format!("/orgs/acme/projects/web/runs/{slow}")).await;
    assert!(!page.body.contains("/rerun\""), "no rerun form for a viewer");
    // The tokens page has a form for everyone; its CSRF field is the session's.
    let vcsrf = page_csrf(&v.get("/orgs/acme/tokens").await.body);
    let refused = v.press(&format!("/orgs/acme/projects/web/runs/{slow}/rerun"), &vcsrf).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    refused.shows("needs the member role");

    // Sign-out revokes the console token: the old cookie no longer works.
    let old = b.cookies.clone();
    let today = b.get("/orgs/acme").await;
    let out_csrf = field(&today.body[today.body.find("/signout").unwrap()..], "_csrf").unwrap();
    let out = b.press("/signout", &out_csrf).await;
    assert_eq!(out.location(), "/signin");
    assert!(!b.cookies.contains_key("shopfloor_session"));
    b.cookies = old;
    let after = b.get("/orgs/acme").await;
    assert_eq!(after.status, StatusCode::SEE_OTHER, "a revoked session signs in again");
    app.discard().await;
}

#[tokio::test]
async fn github_sign_in_finds_the_person_by_login_or_verified_email() {
    use shopfloor_tests::github_fake::oauth::Account;
    let app = App::start(false).await;
    let _acme = app.org("acme").await;
    let _other = app.org("other").await;
    let oauth = &app.github;
    let mut b = Browser::new(&app.base);

    // By login: the owner of acme.
    oauth.sign_in_as(Account { login: "ACME-owner".into(), id: 7, emails: vec![("someone@else.test".into(), true)] });
    let signin = b.get("/signin?next=/orgs/acme/audit").await;
    assert!(signin.body.contains("Sign in with GitHub"));
    let start = b.get("/auth/github?next=/orgs/acme/audit").await;
    let authorize = start.location();
    assert!(authorize.starts_with(&oauth.url) && authorize.contains("state="), "{authorize}");
    let back = b.get(&authorize).await; // the fake approves at once
    assert!(back.location().contains("/auth/github/callback?code="), "{}", back.location());
    let landed = b.get(&back.location()).await;
    assert_eq!(landed.location(), "/orgs/acme/audit");
    let audit = b.follow(landed).await;
    assert_eq!(audit.status, StatusCode::OK, "{}", audit.body);
    assert!(b.cookies["shopfloor_session"].starts_with("acme."));
    assert_eq!(oauth.seen().iter().filter(|s| s.as_str() == "POST /login/oauth/access_token").count(), 1);

    // A replayed callback (same code, same state) is refused: the state was spent.
    let replay = b.get(&back.location()).await;
    assert!(replay.location().contains("error="), "{}", replay.location());

    // By verified email, for a person with no login recorded: the viewer of `other`.
    let mut c = Browser::new(&app.base);
    oauth.sign_in_as(Account { login: "stranger".into(), id: 8, emails: vec![("viewer@other.test".into(), true)] });
    let start = c.get("/auth/github").await;
    let back = c.get(&start.location()).await;
    let callback = c.get(&back.location()).await;
    let landed = c.follow(callback).await;
    landed.shows("Today in other");

    // An unverified email is not enough, and a stranger gets no session.
    let mut d = Browser::new(&app.base);
    oauth.sign_in_as(Account { login: "mallory".into(), id: 9, emails: vec![("owner@acme.test".into(), false)] });
    let start = d.get("/auth/github").await;
    let back = d.get(&start.location()).await;
    let landed = d.get(&back.location()).await;
    assert!(landed.location().contains("error=nomember"), "{}", landed.location());
    assert!(!d.cookies.contains_key("shopfloor_session"));

    // A callback whose state does not match the browser's is refused.
    let mut e = Browser::new(&app.base);
    let forged = e.get("/auth/github/callback?code=code1&state=guess").await;
    assert!(forged.location().contains("error=state"), "{}", forged.location());
    app.discard().await;
}

#[tokio::test]
async fn workflows_page_shows_problems_at_their_lines() {
    let (app, _, mut b) = acme_owner(false).await;
    let page = b.get("/orgs/acme/projects/web/workflows").await;
    let csrf = page_csrf(&page.body);
    let broken = "name: broken\nnodes:\n  a:\n    crew: { harness: nope }\n  b:\n    after: [missing]\n    wait: { for: 1m }\n";
    let checked = validate(&mut b, &csrf, broken).await;
    assert_eq!(checked.status, StatusCode::UNPROCESSABLE_ENTITY);
    checked.shows("class=\"problem\"");
    assert!(checked.body.contains("Not valid"));
    let uploaded = b.post_form("/orgs/acme/projects/web/workflows", &csrf, &[("source", broken)]).await;
    assert_eq!(uploaded.status, StatusCode::UNPROCESSABLE_ENTITY);
    let good = "name: tiny\nnodes:\n  nap:\n    wait: { for: 1m }\n";
    let uploaded = b.post_form("/orgs/acme/projects/web/workflows", &csrf, &[("source", good)]).await;
    assert_eq!(uploaded.location(), "/orgs/acme/projects/web/workflows/tiny");
    let paused = b.press("/orgs/acme/projects/web/workflows/tiny/pause", &csrf).await;
    assert_eq!(paused.status, StatusCode::SEE_OTHER);
    let is_paused: bool = sqlx::query_scalar("SELECT paused FROM workflows WHERE name = 'tiny'").fetch_one(app.pool()).await.unwrap();
    assert!(is_paused);
    // A run started from the workflow's page, with its input, lands on the run's page.
    let detail = b.get("/orgs/acme/projects/web/workflows/tiny").await;
    detail.shows("Start a run of v1");
    let started = b.post_form("/orgs/acme/projects/web/workflows/tiny/runs", &csrf, &[("input", r#"{"issue": 12}"#), ("version", "1")]).await;
    assert_eq!(started.status, StatusCode::SEE_OTHER, "{}", started.body);
    let (id, input): (engine::ids::RunId, serde_json::Value) = sqlx::query_as("SELECT run_id, input FROM runs").fetch_one(app.pool()).await.unwrap();
    assert_eq!(input, serde_json::json!({ "issue": 12 }));
    assert_eq!(started.location(), format!("/orgs/acme/projects/web/runs/{id}"));
    // Input that is not a JSON object is said so, and starts nothing.
    for (bad, says) in [("[1]", "must be a JSON object"), ("{issue: 12", "is not JSON")] {
        let refused = b.post_form("/orgs/acme/projects/web/workflows/tiny/runs", &csrf, &[("input", bad)]).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}: {}", refused.body);
        assert!(refused.body.contains(says), "{bad}: {}", refused.body);
    }
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM runs").fetch_one(app.pool()).await.unwrap();
    assert_eq!(runs, 1);
    // The whole project: paused, the page says so and offers to unpause; unpaused, it is not.
    let page = b.get("/orgs/acme/projects/web/workflows").await;
    assert!(page.body.contains("Pause the project") && !page.body.contains("project paused"), "{}", page.body);
    assert_eq!(b.press("/orgs/acme/projects/web/pause", &csrf).await.location(), "/orgs/acme/projects/web/workflows");
    let paused: bool = sqlx::query_scalar("SELECT paused FROM projects WHERE slug = 'web'").fetch_one(app.pool()).await.unwrap();
    assert!(paused);
    let page = b.get("/orgs/acme/projects/web/workflows").await;
    assert!(page.body.contains("project paused") && page.body.contains("Unpause the project"), "{}", page.body);
    b.press("/orgs/acme/projects/web/unpause", &csrf).await;
    let paused: bool = sqlx::query_scalar("SELECT paused FROM projects WHERE slug = 'web'").fetch_one(app.pool()).await.unwrap();
    assert!(!paused);
    // Tokens: made once, shown once.
    let made = b.post_form("/orgs/acme/tokens", &csrf, &[("name", "ci"), ("role", "member"), ("days", "7")]).await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    assert!(made.body.contains("not shown again"));
    // A lifetime that is not a number of days is said so, and no token is made.
    for days in ["-5", "abc", "1.5"] {
        let refused = b.post_form("/orgs/acme/tokens", &csrf, &[("name", "short"), ("role", "member"), ("days", days)]).await;
        assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{days}: {}", refused.body);
        assert!(refused.body.contains("is not a number of days"), "{}", refused.body);
    }
    let shorts: i64 = sqlx::query_scalar("SELECT count(*) FROM api_tokens WHERE name = 'short'").fetch_one(app.pool()).await.unwrap();
    assert_eq!(shorts, 0);
    // A NUL in a page's path or query is a 400 page, as in the REST API, never a 500.
    for path in ["/orgs/acme/projects/web/runs?workflow=%00", "/orgs/acme/audit?actor=%00", "/orgs/acme/projects/web/workflows/a%00b"] {
        let page = b.get(path).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{path}: {}", page.body);
        assert!(page.body.contains("NUL"), "{path}: {}", page.body);
    }
    app.discard().await;
}

#[tokio::test]
async fn the_live_stream_carries_the_projects_run_events() {
    let (app, org, b) = acme_owner(true).await;
    let cookie = b.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ");
    let mut resp = b.http.get(app.url("/orgs/acme/projects/web/live")).header("cookie", cookie).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let run = app.submit(&org, org.approve).await;
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    while !seen.contains("run.awaiting") {
        let chunk = tokio::time::timeout_at(deadline, resp.chunk()).await.expect("an event within 10 s").unwrap().expect("the stream stays open");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains(&run.to_string()), "{seen}");
    app.discard().await;
}

#[tokio::test]
async fn a_resolved_failure_leaves_todays_failures_to_resolve() {
    use engine::store::{Actor, Change, runs};
    let (app, org) = acme(false).await;
    let run = app.submit(&org, org.approve).await;
    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
    ch.lock_run(org.id, run).await.unwrap().unwrap();
    runs::finish::<engine::state::run::Failed>(&mut ch, run, Some("exit_code:1")).await.unwrap();
    ch.commit().await.unwrap();
    let mut b = Browser::new(&app.base);
    let today = b.sign_in_with_token(&org.owner_token).await;
    let section = |html: &str| html.split("Failures to resolve").nth(1).map(|rest| rest.split("</section>").next().unwrap_or_default().to_owned());
    assert!(section(&today.body).is_some_and(|s| s.contains(&run.to_string())), "the failed run is to resolve: {}", today.body);

    let resolved = reqwest::Client::new()
        .post(app.url(&format!("/api/v1/orgs/acme/projects/web/runs/{run}/resolve")))
        .bearer_auth(&org.owner_token)
        .json(&serde_json::json!({ "note": "known flake" }))
        .send()
        .await
        .unwrap();
    assert_eq!(resolved.status(), StatusCode::OK);
    let today = b.get("/orgs/acme").await;
    assert_eq!(today.status, StatusCode::OK);
    assert!(section(&today.body).is_none(), "a resolved failure is not to resolve any more: {}", today.body);
    // Still failed, and still listed among the runs that finished.
    assert!(today.body.contains(&run.to_string()), "it still shows as finished lately");
    app.discard().await;
}

/// Intervene from the run page: a running crew step's transcript has a form (a member's, with
/// the session's CSRF field) that sends a message to the session through the REST route; the
/// host holding the step finds it in its heartbeat's answer. A viewer sees no form; a step
/// whose harness cannot take messages answers the form with the reason.
#[tokio::test]
async fn a_running_crew_steps_transcript_takes_a_message_for_the_session() {
    let (app, org) = acme(true).await;
    let run = app.submit(&org, org.agent).await;
    app.until_build_pending(run).await;
    let http = reqwest::Client::new();
    let post = |path: String, token: String, body: serde_json::Value| {
        let (http, url) = (http.clone(), app.url(&path));
        async move {
            let resp = http.post(url).bearer_auth(token).json(&body).send().await.unwrap();
            assert!(resp.status().is_success(), "{path}: {}", resp.status());
            resp.json::<serde_json::Value>().await.unwrap()
        }
    };
    let reg = post("/api/v1/orgs/acme/projects/web/host-registrations".into(), org.owner_token.clone(), serde_json::json!({ "name": "box" })).await;
    let body = serde_json::json!({ "name": "box", "capabilities": ["linux", "harness:command"] });
    let host = post("/api/v1/host/register".into(), reg["token"].as_str().unwrap().into(), body).await["token"].as_str().unwrap().to_owned();
    let claimed = post("/api/v1/host/claim".into(), host.clone(), serde_json::json!({ "max": 1, "wait_secs": 10 })).await;
    let step = claimed["assignments"][0]["step"].as_str().unwrap().to_owned();
    // Started as Claude Code would be (the form does not look at the harness; the REST route does).
    post(format!("/api/v1/host/steps/{step}/start"), host.clone(), serde_json::json!({ "harness": "claude-code" })).await;

    let mut b = app.signed_in(&org.owner_token).await;
    let path = format!("/orgs/acme/projects/web/runs/{run}");
    let page = b.get(&path).await;
    let action = format!("{path}/steps/{step}/messages").replace('/', "&#x2f;");
    assert!(page.body.contains(&format!("action=\"{action}\" class=\"card\" id=\"say-form\"")), "{}", page.body);
    accessible(&page.body, "run page with a live session");
    let csrf = page_csrf(&page.body);
    let forged = b.post(&format!("{path}/steps/{step}/messages"), &[("_csrf", "x"), ("text", "hi")]).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let sent = b.post_form(&format!("{path}/steps/{step}/messages"), &csrf, &[("text", "Prefer the blue widget.")]).await;
    assert_eq!(sent.status, StatusCode::SEE_OTHER, "{}", sent.body);
    assert_eq!(sent.location(), path);
    let beat = post(format!("/api/v1/host/steps/{step}/heartbeat"), host.clone(), serde_json::json!({})).await;
    assert_eq!(beat["messages"][0]["text"], "Prefer the blue widget.", "{beat}");
    let by: String = app.read("SELECT sent_by FROM step_messages WHERE run_id = $1", run).await;
    assert_eq!(by, format!("user:{}", org.owner), "sent as the signed-in person");

    // An empty message is refused beside the form, nothing sent.
    let refused = b.post_form(&format!("{path}/steps/{step}/messages"), &csrf, &[("text", "  ")]).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    refused.shows("id=\"say-form\"");
    refused.shows("role=\"alert\"");

    // A viewer reads the transcript without the form.
    let mut v = app.signed_in(&org.viewer_token).await;
    assert!(!v.get(&path).await.body.contains("say-form"));
    app.discard().await;
}

/// The run page draws the workflow's graph from its definition: the issue-to-pull-request example, with its
/// `$start`, the gate's `on_fail` as a dashed back edge, and every node with its state in words.
#[tokio::test]
async fn the_run_page_draws_the_graph_with_start_and_the_loop_back() {
    let source = include_str!("../../engine/tests/fixtures/workflows/issue-to-pr.yaml");
    let (app, org) = acme(false).await;
    let mut ch = Change::begin(app.pool(), Actor::System).await.unwrap();
    let (workflow, _) = workflows::put_version(&mut ch, org.id, org.project, "issue-to-pr", source).await.unwrap();
    ch.commit().await.unwrap();
    let run = app.submit(&org, workflow).await;
    let mut b = app.signed_in(&org.owner_token).await;
    let page = b.get(&format!("/orgs/acme/projects/web/runs/{run}")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let at = page.body.find("<svg class=\"graph\"").expect("the graph's svg");
    let svg = &page.body[at..at + page.body[at..].find("</svg>").expect("the svg's end")];
    assert!(svg.contains("role=\"img\"") && svg.contains("aria-label=\"Graph of 7 nodes"), "{svg}");
    assert!(svg.contains("data-node=\"$start\"") && svg.contains("data-from=\"$start\" data-to=\"plan\""), "{svg}");
    assert!(svg.contains("class=\"edge loop back\" data-from=\"ci\" data-to=\"build\""), "{svg}");
    for node in ["plan", "review_plan", "build", "ci", "route", "big_change_review", "open_pr"] {
        assert!(svg.contains(&format!("data-node=\"{node}\"")), "{node} is drawn");
    }
    assert!(svg.contains("○ decision · not reached"), "{svg}");
    app.discard().await;
}

/// Workflow YAML keeps its indentation, on a workflow's page and in a validation's result: the
/// lines are sent as they are and the stylesheet keeps their whitespace.
#[tokio::test]
async fn workflow_source_keeps_its_indentation() {
    let (app, _, mut b) = acme_owner(false).await;
    let page = b.get("/orgs/acme/projects/web/workflows/approve").await;
    assert_eq!(page.status, StatusCode::OK);
    for line in ["<code>  review:</code>", "<code>    approval:</code>", "<code>      timeout: 24h</code>"] {
        assert!(page.body.contains(line), "{line} in {}", page.body);
    }
    let csrf = page_csrf(&b.get("/orgs/acme/projects/web/workflows").await.body);
    let broken = "name: broken\nnodes:\n  a:\n    crew: { harness: nope }\n";
    let checked = validate(&mut b, &csrf, broken).await;
    assert_eq!(checked.status, StatusCode::UNPROCESSABLE_ENTITY);
    for line in ["<code>  a:</code>", "<code>    crew: { harness: nope }</code>"] {
        assert!(checked.body.contains(line), "{line} in {}", checked.body);
    }
    let css = b.get("/static/console.css").await.body;
    let rule = css.find(".source code {").map(|at| &css[at..at + css[at..].find('}').unwrap()]).expect("a rule for .source code");
    assert!(rule.contains("white-space: pre;"), "{rule}");
    app.discard().await;
}

/// The text of the element with `id` (a `<textarea>`, a cell), its HTML escapes read back.
fn text_of(html: &str, id: &str) -> String {
    let at = html.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no #{id}"));
    let rest = &html[at..];
    let rest = &rest[rest.find('>').expect("the tag ends") + 1..];
    unescape(&rest[..rest.find('<').expect("the text ends")])
}

fn unescape(s: &str) -> String {
    s.replace("&#x2f;", "/")
        .replace("&#x2F;", "/")
        .replace("&#x27;", "'")
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// The registration token in a `shopfloor host … --token <token> …` command.
pub(crate) fn token_in(command: &str) -> String {
    let words: Vec<&str> = command.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "--token").expect("a --token word");
    words[at + 1].to_owned()
}

#[tokio::test]
async fn adding_a_host_shows_the_command_with_its_token_once() {
    let (app, org, mut b) = acme_owner(false).await;
    let hosts = b.get("/orgs/acme/projects/web/hosts").await;
    assert!(hosts.body.contains("href=\"/orgs/acme/projects/web/hosts/add\""), "the hosts page links to Add a host");
    let form = open(&mut b, "/orgs/acme/projects/web/hosts/add", "add a host").await;
    let csrf = page_csrf(&form.body);

    let made = b.post_form("/orgs/acme/projects/web/hosts/add", &csrf, &[("name", "box 1"), ("capabilities", "linux, harness:command"), ("hours", "2")]).await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    accessible(&made.body, "add a host, answered");
    let command = text_of(&made.body, "host-command");
    let token = token_in(&command);
    // The CLI's command, word for word, aimed at the address the console was reached at.
    assert_eq!(command, cli::host_command(&app.base, &token, Some("box 1"), Some("linux,harness:command")));
    assert!(command.contains("--name 'box 1'"), "a name with a space is quoted: {command}");
    assert_eq!(count(&made.body, &token), 1, "the token appears once");
    made.shows("once");
    let kind: String = app.read("SELECT kind FROM api_tokens WHERE org_id = $1 AND name = 'box 1'", org.id).await;
    assert_eq!(kind, "registration");

    // A reload shows the form, never the token again.
    for path in ["/orgs/acme/projects/web/hosts/add", "/orgs/acme/projects/web/hosts"] {
        let again = b.get(path).await;
        assert_eq!(again.status, StatusCode::OK);
        assert!(!again.body.contains(&token), "{path} shows the token again");
        assert!(!again.body.contains("--token"), "{path}");
    }

    // A capability the host would refuse is caught before a token is made.
    let bad = b.post_form("/orgs/acme/projects/web/hosts/add", &csrf, &[("name", "box-2"), ("capabilities", "Linux!"), ("hours", "2")]).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    bad.shows("is not a capability");

    // A viewer is refused by the REST route, in its words.
    let mut viewer = app.signed_in(&org.viewer_token).await;
    let form = viewer.get("/orgs/acme/projects/web/hosts/add").await;
    let refused = viewer.post_form("/orgs/acme/projects/web/hosts/add", &page_csrf(&form.body), &[("name", "box-3"), ("hours", "2")]).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    refused.shows("this needs the admin role");
    assert!(!refused.body.contains("--token"));
    // No such project: not found.
    let none = b.get("/orgs/acme/projects/nope/hosts/add").await;
    assert_eq!(none.status, StatusCode::NOT_FOUND);
    app.discard().await;
}

#[tokio::test]
async fn hosts_are_drained_undrained_and_deregistered_through_the_rest_checks() {
    let (app, org) = acme(false).await;
    let other = app.org("globex").await;
    let host = crate::browser::register_host(&app, &org).await;
    let theirs = crate::browser::register_host(&app, &other).await;
    let id = host.host_id.to_string();
    let mut b = app.signed_in(&org.owner_token).await;
    let page = b.get("/orgs/acme/projects/web/hosts").await;
    accessible(&page.body, "hosts");
    page.shows("Drain builder-1");
    assert!(!page.body.contains("drained</span>"));
    let csrf = page_csrf(&page.body);

    // A viewer sees the page and the buttons, and the REST refusal beside them.
    let mut viewer = app.signed_in(&org.viewer_token).await;
    let seen = viewer.get("/orgs/acme/projects/web/hosts").await;
    let refused = viewer.press(&format!("/orgs/acme/projects/web/hosts/{id}/drain"), &page_csrf(&seen.body)).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.body.contains("this needs the admin role or above; the token has viewer"), "{}", refused.body);
    let drained: bool = app.read("SELECT drained_at IS NOT NULL FROM hosts WHERE host_id = $1", host.host_id).await;
    assert!(!drained, "a viewer drained a host");

    // Drained: its own badge, and the undrain button.
    let done = b.press(&format!("/orgs/acme/projects/web/hosts/{id}/drain"), &csrf).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    let page = b.follow(done).await;
    assert!(page.body.contains("<span aria-hidden=\"true\">‖</span> drained"), "{}", page.body);
    assert!(!page.body.contains("online</span>"));
    assert!(page.body.contains("Undrain builder-1"));
    let page = b.press_and_follow(&format!("/orgs/acme/projects/web/hosts/{id}/undrain"), &csrf).await;
    assert!(!page.body.contains("drained</span>"), "{}", page.body);
    assert!(page.body.contains("Drain builder-1"));

    // Another org's host is not found, and stays as it was.
    let theirs_id = theirs.host_id.to_string();
    for verb in ["drain", "deregister"] {
        let answer = b.press(&format!("/orgs/acme/projects/web/hosts/{theirs_id}/{verb}"), &csrf).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{verb}");
    }
    let untouched: bool = sqlx::query_scalar("SELECT drained_at IS NULL AND deregistered_at IS NULL FROM hosts WHERE host_id = $1")
        .bind(theirs.host_id)
        .fetch_one(app.pool())
        .await
        .unwrap();
    assert!(untouched);

    removes(&mut b, &format!("/orgs/acme/projects/web/hosts/{id}/deregister"), &csrf, "builder-1").await;
    app.discard().await;
}

#[tokio::test]
async fn budgets_page_sets_limits_shows_spend_and_the_runs_a_budget_holds() {
    let (app, org, mut b) = acme_owner(true).await;
    app.record_spend(&org, 3.5).await;
    let page = open(&mut b, "/orgs/acme/projects/web/budgets", "budgets").await;
    page.shows("No limit is set");
    assert!(page.body.contains("aria-current=\"page\">Budgets"), "the nav marks Budgets");
    assert!(page.body.contains("<td>$3.50</td><td>$3.50</td>"), "today's and this month's spend: {}", page.body);
    let csrf = page_csrf(&page.body);

    // A viewer cannot set one: the REST refusal is shown at the form.
    let mut viewer = app.signed_in(&org.viewer_token).await;
    let seen = viewer.get("/orgs/acme/projects/web/budgets").await;
    let refused = viewer.post_form("/orgs/acme/projects/web/budgets", &page_csrf(&seen.body), &[("period", "day"), ("usd_limit", "1"), ("kind", "hard")]).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.body.contains("this needs the admin role"));
    let bad = b.post_form("/orgs/acme/projects/web/budgets", &csrf, &[("period", "day"), ("usd_limit", "lots"), ("kind", "hard")]).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);

    // A hard daily limit below what was spent today: reached, and a new run is held by it.
    let set = b.post_form("/orgs/acme/projects/web/budgets", &csrf, &[("period", "day"), ("usd_limit", "2"), ("kind", "hard")]).await;
    assert_eq!(set.status, StatusCode::SEE_OTHER, "{}", set.body);
    let run = app.submit(&org, org.slow).await;
    app.until_held_by_budget(run).await;
    let page = b.follow(set).await;
    let row = &page.body[page.body.find("id=\"limit-project:web:day\"").expect("the limit's row")..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(row.contains("project web") && row.contains("$2.00") && row.contains("hard"), "{row}");
    assert!(row.contains("$3.50") && row.contains("reached"), "{row}");
    let held = &page.body[page.body.find("id=\"held\"").unwrap()..];
    assert!(held.contains(&run.to_string()), "{held}");
    assert!(held.contains("the project&#x27;s daily budget of $2.00 (hard) is spent"), "{held}");

    // A viewer's removal is refused beside the limit's row.
    let refused = viewer.press("/orgs/acme/projects/web/budgets/day/remove", &page_csrf(&seen.body)).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let row = &refused.body[refused.body.find("id=\"limit-project:web:day\"").unwrap()..];
    assert!(row[..row.find("</tr>").unwrap()].contains("this needs the admin role"), "{row}");

    // The org's page: every project's limits, and the org's own, set there.
    let org_page = open(&mut b, "/orgs/acme/budgets", "org budgets").await;
    assert!(org_page.body.contains(&run.to_string()));
    let set = b.post_form("/orgs/acme/budgets", &page_csrf(&org_page.body), &[("period", "month"), ("usd_limit", "500"), ("kind", "soft")]).await;
    let org_page = b.follow(set).await;
    let row = &org_page.body[org_page.body.find("id=\"limit-org:month\"").unwrap()..];
    assert!(row[..row.find("</tr>").unwrap()].contains("$500.00"), "{row}");
    assert!(row.contains("soft"));
    // Removing a limit that is not set is the REST API's not found.
    let none = b.press("/orgs/acme/budgets/day/remove", &csrf).await;
    assert_eq!(none.status, StatusCode::NOT_FOUND);

    // Removing the project's limit releases the run.
    let removed = b.press("/orgs/acme/projects/web/budgets/day/remove", &csrf).await;
    assert_eq!(removed.status, StatusCode::SEE_OTHER);
    app.until(run, "SELECT NOT EXISTS (SELECT 1 FROM admission_waits WHERE run_id = $1)", "released").await;
    let page = b.get("/orgs/acme/projects/web/budgets").await;
    assert!(page.body.contains("No run is held by a budget"));
    assert!(!page.body.contains("id=\"limit-project:web:day\""));
    app.discard().await;
}

#[tokio::test]
async fn members_page_adds_people_changes_roles_and_removes_them() {
    let (app, org, mut b) = acme_owner(false).await;
    let other = app.org("globex").await;
    let page = open(&mut b, "/orgs/acme/members", "members").await;
    assert!(page.body.contains("owner@acme.test") && page.body.contains("acme-owner"));
    assert!(page.body.contains("viewer@acme.test"));
    assert!(page.body.contains("aria-current=\"page\">Members"));
    let csrf = page_csrf(&page.body);

    let added = b.post_form("/orgs/acme/members", &csrf, &[("email", "dana@acme.test"), ("role", "member")]).await;
    assert_eq!(added.status, StatusCode::SEE_OTHER, "{}", added.body);
    let page = b.follow(added).await;
    let user: uuid::Uuid =
        sqlx::query_scalar("SELECT user_id FROM users WHERE org_id = $1 AND email = 'dana@acme.test'").bind(org.id).fetch_one(app.pool()).await.unwrap();
    let row = &page.body[page.body.find(&format!("id=\"member-{user}\"")).unwrap()..];
    assert!(row.contains("<td class=\"role\">member</td>"), "{row}");
    let again = b.post_form("/orgs/acme/members", &csrf, &[("email", "dana@acme.test"), ("role", "member")]).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    again.shows("id=\"add-error\"");

    let changed = b.post_form(&format!("/orgs/acme/members/{user}/role"), &csrf, &[("role", "admin")]).await;
    let page = b.follow(changed).await;
    let row = &page.body[page.body.find(&format!("id=\"member-{user}\"")).unwrap()..];
    assert!(row.contains("<td class=\"role\">admin</td>"), "{row}");

    // A viewer is refused by the REST route, shown beside the form.
    let mut viewer = app.signed_in(&org.viewer_token).await;
    let seen = viewer.get("/orgs/acme/members").await;
    let refused = viewer.press(&format!("/orgs/acme/members/{user}/remove"), &page_csrf(&seen.body)).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.body.contains("this needs the admin role"));

    // Another org's member is not found here.
    let theirs = b.press(&format!("/orgs/acme/members/{}/remove", other.owner), &csrf).await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND);

    removes(&mut b, &format!("/orgs/acme/members/{user}/remove"), &csrf, "dana@acme.test").await;
    app.discard().await;
}

#[tokio::test]
async fn webhooks_page_subscribes_with_the_secret_shown_once_and_replays_deliveries() {
    let (app, org, mut b) = acme_owner(true).await;
    let other = app.org("globex").await;
    let page = open(&mut b, "/orgs/acme/projects/web/webhooks", "webhooks").await;
    assert!(page.body.contains("No outgoing webhook"));
    let csrf = page_csrf(&page.body);

    let refused = b.post_form("/orgs/acme/projects/web/webhooks", &csrf, &[("url", "http://127.0.0.1:9/hook"), ("events", "")]).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    refused.shows("id=\"create-error\"");

    let made =
        b.post_form("/orgs/acme/projects/web/webhooks", &csrf, &[("url", "https://hooks.example.com/shopfloor"), ("events", "run.*, step.failed")]).await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    accessible(&made.body, "webhooks, answered");
    let at = made.body.find("id=\"new-secret\"").expect("the secret's field");
    let rest = &made.body[at..];
    let rest = &rest[rest.find("value=\"").unwrap() + 7..];
    let secret = rest[..rest.find('"').unwrap()].to_owned();
    assert!(secret.len() >= 16, "{secret}");
    assert_eq!(count(&made.body, &secret), 1);
    let reload = b.get("/orgs/acme/projects/web/webhooks").await;
    assert!(!reload.body.contains(&secret), "the secret is shown again");
    assert!(reload.body.contains("step.failed"));
    let webhook: uuid::Uuid = app.read("SELECT subscription_id FROM webhook_subscriptions WHERE org_id = $1", org.id).await;

    // A run's events make deliveries; one is replayed as a new delivery.
    let run = app.delivered(&org).await;
    let page = b.get("/orgs/acme/projects/web/webhooks").await;
    let delivery: uuid::Uuid = sqlx::query_scalar("SELECT delivery_id FROM webhook_deliveries WHERE run_id = $1 ORDER BY created_at LIMIT 1")
        .bind(run)
        .fetch_one(app.pool())
        .await
        .unwrap();
    page.shows(&format!("id=\"delivery-{delivery}\""));
    let replayed = b.press(&format!("/orgs/acme/projects/web/webhooks/{webhook}/deliveries/{delivery}/replay"), &csrf).await;
    assert_eq!(replayed.status, StatusCode::SEE_OTHER);
    let page = b.follow(replayed).await;
    page.shows("<span class=\"tag\">replay</span>");

    // A viewer is told webhooks are for admins, in the REST API's words.
    let mut viewer = app.signed_in(&org.viewer_token).await;
    let seen = viewer.get("/orgs/acme/projects/web/webhooks").await;
    assert_eq!(seen.status, StatusCode::OK);
    assert!(seen.body.contains("this needs the admin role"));
    assert!(!seen.body.contains("hooks.example.com"));

    // Another org's webhook is not found here.
    let mut ch = engine::store::Change::begin(app.pool(), engine::store::Actor::System).await.unwrap();
    let theirs = engine::testkit::subscribe(&mut ch, other.id, other.project, "https://hooks.example.com/globex", &["run.*"]).await;
    ch.commit().await.unwrap();
    let answer = b.press(&format!("/orgs/acme/projects/web/webhooks/{theirs}/delete"), &csrf).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    let answer = b.press(&format!("/orgs/acme/projects/web/webhooks/{theirs}/deliveries/{delivery}/replay"), &csrf).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);

    let page = b.press_and_follow(&format!("/orgs/acme/projects/web/webhooks/{webhook}/delete"), &csrf).await;
    page.shows("No outgoing webhook");
    app.discard().await;
}

/// Posts a workflow's source to the workflows page's validate form.
async fn validate(b: &mut Browser, csrf: &str, source: &str) -> Answer {
    b.post_form("/orgs/acme/projects/web/workflows/validate", csrf, &[("source", source)]).await
}
