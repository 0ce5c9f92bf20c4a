//! A person of one org sees nothing of another through any page or stream: every path of the
//! other org answers 404, as for an org that does not exist, and a cookie entry that names one
//! org with another org's token is worth nothing.

use reqwest::StatusCode;

use crate::support::App;

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
