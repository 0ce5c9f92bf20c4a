//! A person of one org sees nothing of another through any page or stream: every path of the
//! other org answers 404, as for an org that does not exist, and a cookie entry that names one
//! org with another org's token is worth nothing.

use std::time::Duration;

use engine::store::hosts::LogLine;
use protocol::Usage;
use reqwest::StatusCode;

use crate::browser::{register_host, start_crew_step};
use crate::support::{App, acme};

#[tokio::test]
async fn one_org_sees_nothing_of_another() {
    let app = App::start(false).await;
    let acme = app.org("acme").await;
    let other = app.org("other").await;
    let secret = app.submit(&acme, acme.approve).await;
    let mine = app.submit(&other, other.slow).await;
    // A step of acme's run, for the transcript route.
    let mut b = app.signed_in(&other.owner_token).await;

    let today = b.get("/orgs/other").await;
    assert_eq!(today.status, StatusCode::OK);
    assert!(!today.body.contains("Ship the release?") && !today.body.contains(&secret.to_string()), "acme's approval is not on other's Today");
    for path in [
        "/orgs/acme".to_owned(),
        "/orgs/acme/audit".to_owned(),
        "/orgs/acme/tokens".to_owned(),
        "/orgs/acme/projects/web/runs".to_owned(),
        format!("/orgs/acme/projects/web/runs/{secret}"),
        "/orgs/acme/projects/web/live".to_owned(),
        "/orgs/acme/projects/web/hosts".to_owned(),
        "/orgs/acme/projects/web/workflows".to_owned(),
        // acme's run through other's own org and project.
        format!("/orgs/other/projects/web/runs/{secret}"),
        format!("/orgs/nope/projects/web/runs/{mine}"),
    ] {
        let page = b.get(&path).await;
        assert_eq!(page.status, StatusCode::NOT_FOUND, "{path}: {}", page.body);
        assert!(!page.body.contains("Ship the release?"), "{path}");
    }
    let posted = b.post(&format!("/orgs/other/projects/web/runs/{secret}/cancel"), &[("_csrf", "x")]).await;
    assert!(matches!(posted.status, StatusCode::FORBIDDEN | StatusCode::NOT_FOUND), "{}", posted.status);
    let status: String = app.read("SELECT status FROM runs WHERE run_id = $1", secret).await;
    assert_eq!(status, "running");

    // A cookie that files other's token under acme's name opens nothing of acme.
    let token = b.cookies["shopfloor_session"].split_once('.').unwrap().1.to_owned();
    b.cookies.insert("shopfloor_session".into(), format!("acme.{token}"));
    let forged = b.get("/orgs/acme").await;
    assert_eq!(forged.status, StatusCode::NOT_FOUND);

    // The live stream of other's project is other's only: its events name other's runs.
    let mut c = app.signed_in(&other.owner_token).await;
    let live = c.get("/orgs/other/projects/web/live").await;
    assert_eq!(live.status, StatusCode::OK);
    assert!(live.headers.get("content-type").unwrap().to_str().unwrap().starts_with("text/event-stream"));
    app.discard().await;
}

/// A live transcript outlives nobody's access. Its tail takes one of the session token's
/// stream places, like the project's event stream (past the cap: 429), and once the person is
/// removed from the org, their open tail ends at its next line instead of going on showing
/// the agent's session.
#[tokio::test]
async fn a_live_transcript_ends_when_its_reader_leaves_the_org() {
    let (app, org) = acme(true).await;
    let host = register_host(&app, &org).await;
    let run = app.submit(&org, org.agent).await;
    let step = start_crew_step(&app, &host, run).await;
    let say = |seq: i64| {
        let (pool, host) = (app.pool().clone(), host.clone());
        async move {
            let line = LogLine { seq, stream: "assistant".into(), line: format!("line {seq} of the session") };
            let usage = Usage { input_tokens: 10 * seq, output_tokens: seq, turns: 1, ..Usage::default() };
            crate::support::report_line(&pool, &host, step, line, &usage).await;
        }
    };

    let viewer = app.signed_in(&org.viewer_token).await;
    let path = format!("/orgs/acme/projects/web/runs/{run}/steps/{step}/transcript");
    let mut tail = viewer.stream(&path).await;
    assert_eq!(tail.status(), StatusCode::OK);
    say(1).await;
    let mut seen = String::new();
    while !seen.contains("line 1 of the session") {
        let chunk = tokio::time::timeout(Duration::from_secs(60), tail.chunk()).await.expect("line 1 within 60 s").unwrap().expect("an open stream");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }

    // The session's token holds 8 streams at the most (the default), tails and live pages alike.
    let mut more = Vec::new();
    for _ in 1..8 {
        let open = viewer.stream(&path).await;
        assert_eq!(open.status(), StatusCode::OK);
        more.push(open);
    }
    let refused = viewer.stream(&path).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.text().await.unwrap().contains("8 event streams open"));
    drop(more);

    let user: uuid::Uuid = app.read("SELECT user_id FROM memberships WHERE org_id = $1 AND role = 'viewer'", org.id.0).await;
    let removed = reqwest::Client::new().delete(app.url(&format!("/api/v1/orgs/acme/members/{user}"))).bearer_auth(&org.owner_token).send().await.unwrap();
    assert_eq!(removed.status(), StatusCode::NO_CONTENT);
    let ended = async {
        for seq in 2.. {
            say(seq).await;
            match tokio::time::timeout(Duration::from_millis(500), tail.chunk()).await {
                Ok(Ok(Some(_))) | Err(_) => {}
                Ok(_) => return,
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), ended).await.expect("the removed reader's transcript ended");
    let again = viewer.stream(&path).await;
    assert!(again.status().is_redirection(), "{}", again.status());
    app.discard().await;
}
