//! What the end-to-end tests share beyond `shopfloor_tests`: the org most of them start from
//! and a person's token, which needs the API crate (`shopfloor_tests` cannot depend on it: the
//! API's own tests depend on `shopfloor_tests`).

use engine::ids::{OrgId, ProjectId, RunId, Slug, UserId, WorkflowId};
use engine::store::{Change, installations, tenants, workflows};
use shopfloor_tests::github_fake::{FakeGithub, Issue, Repo};

/// Org `acme` (its owner `o@example.com`) and its project `web`.
pub(crate) struct Acme {
    pub org: OrgId,
    pub owner: UserId,
    pub project: ProjectId,
}

/// Creates org `acme` and project `web` in `ch`.
pub(crate) async fn acme(ch: &mut Change) -> Acme {
    let (org, owner) = tenants::create_org(ch, &Slug::parse("acme").unwrap(), "Acme", "o@example.com").await.unwrap();
    let project = tenants::create_project(ch, org, &Slug::parse("web").unwrap(), "Web").await.unwrap();
    Acme { org, owner, project }
}

/// The GitHub App's installation on the account `Acme`, which holds `Acme/Widgets`.
pub(crate) const INSTALLATION: i64 = 77;

/// Connects `Acme/Widgets` (installation [`INSTALLATION`]) to `project` of `org`.
pub(crate) async fn connect_widgets(ch: &mut Change, org: OrgId, project: ProjectId) {
    installations::connect_for_test(ch, org, project, INSTALLATION, "Acme", "Acme/Widgets").await.unwrap();
}

/// `Acme/Widgets` as GitHub's payloads name it.
pub(crate) fn widgets() -> Repo {
    Repo::new("Acme/Widgets", INSTALLATION)
}

/// Issue `number` of `Acme/Widgets`, labelled `ready-for-agent`, as the fake GitHub holds it.
pub(crate) fn ready_for_agent(fake: &FakeGithub, number: i64, title: &str) -> Issue {
    let mut issue = Issue::new(number, title);
    issue.labels.push("ready-for-agent".into());
    fake.put_issue("acme/widgets", issue.json(&widgets()));
    issue
}

/// The one pull request the fake GitHub holds for `acme/widgets` (there must be exactly one).
pub(crate) fn the_pull_request(fake: &FakeGithub) -> serde_json::Value {
    let pulls = fake.pulls("acme/widgets");
    assert_eq!(pulls.len(), 1, "exactly one pull request: {pulls:?}");
    pulls.into_iter().next().unwrap()
}

/// Approves the run's approval `node` (with no fields) as `token` through the API at `base`;
/// the answer, whatever its status.
pub(crate) async fn approve(http: &reqwest::Client, base: &str, token: &str, run: RunId, node: &str) -> reqwest::Response {
    http.post(format!("{base}/api/v1/orgs/acme/projects/web/runs/{run}/approvals/{node}")).bearer_auth(token).json(&serde_json::json!({})).send().await.unwrap()
}

/// Puts each workflow under the name its source gives (a source that does not validate fails
/// the test); their names and ids, in order.
pub(crate) async fn put_workflows<S: AsRef<str>>(ch: &mut Change, org: OrgId, project: ProjectId, sources: &[S]) -> Vec<(String, WorkflowId)> {
    let mut put = Vec::new();
    for source in sources {
        let source = source.as_ref();
        let def = engine::definition::parse(source).unwrap_or_else(|p| panic!("test workflow does not validate: {p:?}"));
        let (id, _) = workflows::put_version(ch, org, project, &def.name, source).await.unwrap();
        put.push((def.name.clone(), id));
    }
    put
}

/// A token of the org's owner named `name`, valid for `hours`.
pub(crate) async fn owner_token(ch: &mut Change, acme: &Acme, name: &str, hours: i64) -> String {
    let user = api::auth::UserToken { org: acme.org, user: acme.owner, project: None, role: "owner", name, ttl: chrono::Duration::hours(hours) };
    api::auth::issue_user_token(ch, &engine::testkit::secret_key(), user).await.unwrap()
}

/// A registration token for one host called `name`, made over the API at `base` with `token`,
/// as an admin would.
pub(crate) async fn registration(base: &str, token: &str, name: &str) -> String {
    let url = format!("{base}/api/v1/orgs/acme/projects/web/host-registrations");
    let answer = reqwest::Client::new().post(url).bearer_auth(token).json(&serde_json::json!({ "name": name })).send().await.unwrap();
    let made: serde_json::Value = answer.json().await.unwrap();
    made["token"].as_str().unwrap_or_else(|| panic!("no registration token in {made}")).to_owned()
}
