//! The operator's administration commands against a real `shopfloor serve` (`cli.rs`'s
//! `Server`): members, budgets, `runs resolve`, workflow versions and sources, host
//! deregistration, projects and outgoing webhooks. For each: its table, its `--json` compared
//! with the API's own bytes, the change as the API reports it afterwards, and a refusal.

use std::process::Command;

use serde_json::{Value, json};

use crate::cli::{QUICK, SHIP, Server, host_post};
use crate::support::Ran;

const FAILS: &str = include_str!("../../../tests/workflows/fails_at_once.yaml");

const MEMBERS: &str = "/api/v1/orgs/acme/members";
const PROJECT: &str = "/api/v1/orgs/acme/projects/web";

impl Server {
    /// A command as another token (`tokens create` made it) with the same org and project.
    fn cli_as(&self, token: &str, args: &[&str]) -> Ran {
        let mut c = self.with_env(self.command(args));
        c.env("SHOPFLOOR_TOKEN", token);
        Server::output(c, None)
    }

    /// A command with no project in context: the org's.
    fn cli_org(&self, args: &[&str]) -> Ran {
        let mut c: Command = self.with_env(self.command(args));
        c.env_remove("SHOPFLOOR_PROJECT");
        Server::output(c, None)
    }

    /// A token of the owner's with a lower role, alone on `tokens create`'s standard output.
    fn token_with(&self, role: &str) -> String {
        self.cli(&["tokens", "create", "--name", role, "--role", role]).ok().line().to_owned()
    }
}

/// The member with this email, as the API lists them.
async fn member(s: &Server, email: &str) -> Option<Value> {
    s.api(MEMBERS).await["items"].as_array().unwrap().iter().find(|m| m["email"] == email).cloned()
}

#[tokio::test(flavor = "multi_thread")]
async fn members_are_listed_added_given_a_role_and_removed_by_email_or_id() {
    let s = Server::start().await;
    let ran = s.cli(&["members", "list"]).ok();
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", ran.stdout);
    assert!(lines[0].starts_with("EMAIL") && lines[0].contains("USER") && lines[0].contains("ROLE"), "{}", ran.stdout);
    let owner = member(&s, "owner@acme.test").await.unwrap();
    let owner_id = owner["user"].as_str().unwrap().to_owned();
    assert!(lines[1].starts_with(&format!("owner@acme.test  {owner_id}  owner")), "{}", ran.stdout);

    // Add: the new member's line; the API lists them with the role.
    let ran = s.cli(&["members", "add", "dev@acme.test", "--role", "member"]).ok();
    let dev = member(&s, "dev@acme.test").await.expect("dev is a member");
    assert_eq!(dev["role"], "member");
    let dev_id = dev["user"].as_str().unwrap().to_owned();
    assert_eq!(ran.line(), format!("added dev@acme.test to acme as member (user {dev_id})"));
    let ran = s.cli(&["members", "add", "ops@acme.test", "--role", "admin", "--json"]).ok();
    let ops: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(Some(ops.clone()), member(&s, "ops@acme.test").await);
    assert_eq!(ops["role"], "admin");
    s.cli(&["members", "add", "dev@acme.test", "--role", "viewer"]).fails(1, "error: Conflict: dev@acme.test is already a member");
    let ran =
        s.cli(&["members", "add", "x@acme.test", "--role", "boss"]).fails(2, "error: --role `boss` is not a role: give one of viewer, member, admin, owner");
    assert_eq!(ran.stdout, "");
    assert!(member(&s, "x@acme.test").await.is_none());

    // The list, its pages and its JSON.
    let ran = s.cli(&["members", "list"]).ok();
    assert_eq!(ran.stdout.lines().count(), 4, "{}", ran.stdout);
    assert!(ran.stdout.lines().any(|l| l.starts_with(&format!("dev@acme.test    {dev_id}  member"))), "{}", ran.stdout);
    assert_eq!(s.cli(&["members", "list", "--json"]).ok().stdout.trim_end(), s.api_bytes(MEMBERS).await);
    let ran = s.cli(&["members", "list", "--limit", "1"]).ok();
    assert_eq!(ran.stdout.lines().count(), 2, "{}", ran.stdout);
    assert!(ran.stderr.starts_with("more: --cursor "), "{}", ran.stderr);

    // Role: by email or by id; the API reports the new role.
    assert_eq!(s.cli(&["members", "role", "dev@acme.test", "admin"]).ok().line(), "dev@acme.test is now admin in acme");
    assert_eq!(member(&s, "dev@acme.test").await.unwrap()["role"], "admin");
    let ran = s.cli(&["members", "role", &dev_id, "viewer", "--json"]).ok();
    let shown: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(Some(shown), member(&s, "dev@acme.test").await);
    assert_eq!(member(&s, "dev@acme.test").await.unwrap()["role"], "viewer");
    s.cli(&["members", "role", "dev@acme.test", "boss"]).fails(2, "error: ROLE `boss` is not a role: give one of viewer, member, admin, owner");
    s.cli(&["members", "role", "nobody@acme.test", "member"])
        .fails(1, "error: no member `nobody@acme.test` in acme: `shopfloor members list` shows their emails and ids");
    s.cli(&["members", "role", "00000000-0000-0000-0000-000000000000", "member"]).fails(1, "error: Not found: member not found");

    // Refused: a member's token removes no one; an admin's cannot touch an owner; the last
    // owner stays. Nothing changes.
    let as_member = s.token_with("member");
    s.cli_as(&as_member, &["members", "remove", "owner@acme.test"]).fails(1, "error: Forbidden: this needs the admin role or above; the token has member");
    let as_admin = s.token_with("admin");
    s.cli_as(&as_admin, &["members", "remove", "owner@acme.test"]).fails(1, "error: Forbidden: this needs the owner role or above; the token has admin");
    s.cli_as(&as_admin, &["members", "role", "dev@acme.test", "owner"]).fails(1, "error: Forbidden: this needs the owner role");
    s.cli(&["members", "remove", &owner_id]).fails(1, "error: Conflict: an org keeps at least one owner");
    assert_eq!(member(&s, "owner@acme.test").await.unwrap()["role"], "owner");

    // Remove: by email, and by id with --json (the API answers nothing, so nothing prints).
    assert_eq!(s.cli(&["members", "remove", "dev@acme.test"]).ok().line(), "removed dev@acme.test from acme: their tokens are revoked");
    assert!(member(&s, "dev@acme.test").await.is_none());
    let ran = s.cli(&["members", "remove", ops["user"].as_str().unwrap(), "--json"]).ok();
    assert_eq!(ran.stdout, "");
    assert!(member(&s, "ops@acme.test").await.is_none());
    s.cli(&["members", "remove", "dev@acme.test"]).fails(1, "error: no member `dev@acme.test` in acme");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn budgets_are_set_and_removed_on_the_project_or_the_org() {
    let s = Server::start().await;
    let project_budgets = format!("{PROJECT}/budgets");
    let budget = |list: &Value, project: Value, period: &str| {
        list["items"].as_array().unwrap().iter().find(|b| b["project"] == project && b["period"] == period).cloned()
    };

    // On the project in context: soft without --hard.
    let ran = s.cli(&["budgets", "set", "day", "--usd", "5"]).ok();
    assert!(ran.line().starts_with("project web: $5.00 a day, soft; $0.00 spent, resets "), "{}", ran.stdout);
    let set = budget(&s.api(&project_budgets).await, json!("web"), "day").expect("the project's day limit");
    assert_eq!((set["usd_limit"].as_f64(), set["hard"].as_bool()), (Some(5.0), Some(false)), "{set}");
    // --json: the PUT's answer, the project's limits as the API lists them.
    let ran = s.cli(&["budgets", "set", "day", "--usd", "7.5", "--hard", "--json"]).ok();
    assert_eq!(ran.stdout.trim_end(), s.api_bytes(&project_budgets).await);
    let set = budget(&s.api(&project_budgets).await, json!("web"), "day").unwrap();
    assert_eq!((set["usd_limit"].as_f64(), set["hard"].as_bool()), (Some(7.5), Some(true)), "{set}");

    // On the org: with --org-wide, or with no project in context.
    let ran = s.cli(&["budgets", "set", "month", "--usd", "100", "--hard", "--org-wide"]).ok();
    assert!(ran.line().starts_with("org acme: $100.00 a month, hard; $0.00 spent, resets "), "{}", ran.stdout);
    let ran = s.cli_org(&["budgets", "set", "day", "--usd", "40"]).ok();
    assert!(ran.line().starts_with("org acme: $40.00 a day, soft;"), "{}", ran.stdout);
    let org = s.api("/api/v1/orgs/acme/budgets").await;
    assert_eq!(budget(&org, Value::Null, "month").unwrap()["usd_limit"].as_f64(), Some(100.0));
    assert_eq!(budget(&org, Value::Null, "day").unwrap()["usd_limit"].as_f64(), Some(40.0));
    assert!(budget(&s.api(&project_budgets).await, Value::Null, "month").is_some(), "the project's list shows the org's limits too");
    let ran = s.cli(&["budgets", "show", "--org-wide"]).ok();
    let rows: Vec<Vec<&str>> = ran.stdout.lines().map(|l| l.split_whitespace().collect()).collect();
    for want in [["org", "month", "$100.00", "$0.00", "hard"], ["org", "day", "$40.00", "$0.00", "soft"]] {
        assert!(rows.iter().any(|r| r.starts_with(&want)), "{want:?} in:\n{}", ran.stdout);
    }
    assert!(rows.iter().any(|r| r.starts_with(&["project", "web", "day", "$7.50", "$0.00", "hard"])), "{}", ran.stdout);

    // Refused: a period that is none (here, before any request), an amount that is none, a
    // member's token.
    let ran = s.cli(&["budgets", "set", "week", "--usd", "5"]).fails(2, "error: `week` is not a budget period: give `day` or `month`");
    assert_eq!(ran.stdout, "");
    s.cli(&["budgets", "remove", "fortnight"]).fails(2, "error: `fortnight` is not a budget period: give `day` or `month`");
    s.cli(&["budgets", "set", "day", "--usd", "NaN"]).fails(2, "is not an amount: give dollars, 0 or more");
    let as_member = s.token_with("member");
    s.cli_as(&as_member, &["budgets", "set", "day", "--usd", "1"]).fails(1, "error: Forbidden: this needs the admin role or above; the token has member");
    assert_eq!(budget(&s.api(&project_budgets).await, json!("web"), "day").unwrap()["usd_limit"].as_f64(), Some(7.5));

    // Remove: the project's, then the org's (--json prints nothing: the API answers nothing).
    assert_eq!(s.cli(&["budgets", "remove", "day"]).ok().line(), "removed the day limit of project web: the runs it held are released");
    assert!(budget(&s.api(&project_budgets).await, json!("web"), "day").is_none());
    s.cli(&["budgets", "remove", "day"]).fails(1, "error: Not found: budget not found");
    let ran = s.cli(&["budgets", "remove", "month", "--org-wide", "--json"]).ok();
    assert_eq!(ran.stdout, "");
    assert_eq!(s.cli_org(&["budgets", "remove", "day"]).ok().line(), "removed the day limit of org acme: the runs it held are released");
    assert_eq!(s.api("/api/v1/orgs/acme/budgets").await["items"], json!([]));
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_resolve_marks_a_failed_run_handled_and_leaves_it_failed() {
    let s = Server::start().await;
    s.push("fails.yaml", FAILS);
    s.push("quick.yaml", QUICK);
    let failed = s.cli(&["runs", "submit", "wf"]).ok().line().to_owned();
    s.until(&failed, "failed", |r| r["status"] == "failed").await;
    let done = s.cli(&["runs", "submit", "quick"]).ok().line().to_owned();
    s.until(&done, "completed", |r| r["status"] == "completed").await;

    // Refused: a run that did not fail, a run that is none, a name that is no run.
    s.cli(&["runs", "resolve", &done]).fails(1, "error: Conflict: only a failed run is resolved; this one is completed");
    assert!(s.run(&done).await["resolved_at"].is_null());
    s.cli(&["runs", "resolve", "run-aaaaaaaaaaaaaaaaaaaaaaaaaa"]).fails(1, "error: Not found: run not found");
    s.cli(&["runs", "resolve", "acme:web"]).fails(2, "is not a run: give `run-…` or `<org>:<project>:run-…`");

    let ran = s.cli(&["runs", "resolve", &failed, "--note", "flaky runner"]).ok();
    let run = s.run(&failed).await;
    assert_eq!(run["status"], "failed", "it stays failed");
    assert!(run["resolved_at"].is_string(), "{run}");
    let owner = member(&s, "owner@acme.test").await.unwrap();
    let by = format!("user:{}", owner["user"].as_str().unwrap());
    assert!(ran.line().starts_with(&format!("{failed} resolved by {by} at ")), "{}", ran.stdout);
    assert!(ran.line().ends_with(": it stays failed, off the list of failures to handle"), "{}", ran.stdout);
    // Again, by its full name and with --json: the API's answer, which changes nothing.
    let ran = s.cli(&["runs", "resolve", &format!("acme:web:{failed}"), "--json"]).ok();
    let answer: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(answer, json!({ "run": failed, "resolved_at": run["resolved_at"], "resolved_by": by }));
    assert_eq!(s.run(&failed).await["resolved_at"], run["resolved_at"]);
    let audit = s.api(&format!("{PROJECT}/audit?action=run.resolve")).await;
    assert_eq!(audit["items"].as_array().unwrap().len(), 1, "{audit}");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn workflows_versions_are_listed_and_a_version_shows_as_its_yaml() {
    let s = Server::start().await;
    let v1 = SHIP.to_owned();
    let v2 = format!("{SHIP}# the second version\n");
    s.push("ship.yaml", &v1);
    s.push("ship.yaml", &v2);

    let ran = s.cli(&["workflows", "versions", "ship"]).ok();
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", ran.stdout);
    assert!(lines[0].starts_with("VERSION") && lines[0].contains("SHA256") && lines[0].contains("CREATED"), "{}", ran.stdout);
    let versions = s.api(&format!("{PROJECT}/workflows/ship/versions")).await;
    for (line, v) in lines[1..].iter().zip(versions["items"].as_array().unwrap()) {
        let sha = &v["sha256"].as_str().unwrap()[..12];
        assert!(line.starts_with(&format!("{}        {sha}  {}", v["version"], v["created_by"].as_str().unwrap())), "{line}");
    }
    assert!(lines[1].starts_with("2 ") && lines[2].starts_with("1 "), "newest first: {}", ran.stdout);
    assert_eq!(s.cli(&["workflows", "versions", "ship", "--json"]).ok().stdout.trim_end(), s.api_bytes(&format!("{PROJECT}/workflows/ship/versions")).await);

    // Show: the YAML alone on standard output, as uploaded; which version on standard error.
    let ran = s.cli(&["workflows", "show", "ship"]).ok();
    assert_eq!(ran.stdout, v2);
    assert!(ran.stderr.starts_with("ship version 2 (the latest), uploaded by user:"), "{}", ran.stderr);
    let ran = s.cli(&["workflows", "show", "ship", "--version", "1"]).ok();
    assert_eq!(ran.stdout, v1);
    assert!(ran.stderr.starts_with("ship version 1, uploaded by"), "{}", ran.stderr);
    // Redirected to a file and pushed back, it is the same version.
    let file = s.write("shown.yaml", &s.cli(&["workflows", "show", "ship"]).ok().stdout);
    assert_eq!(s.cli(&["workflows", "push", file.to_str().unwrap()]).ok().line(), "ship version 2 unchanged");
    assert_eq!(s.cli(&["workflows", "show", "ship", "--json"]).ok().stdout.trim_end(), s.api_bytes(&format!("{PROJECT}/workflows/ship")).await);
    assert_eq!(
        s.cli(&["workflows", "show", "ship", "--version", "1", "--json"]).ok().stdout.trim_end(),
        s.api_bytes(&format!("{PROJECT}/workflows/ship/versions/1")).await
    );

    // Into a pipe the text is as uploaded, carriage returns and all (a terminal would get them
    // as escapes).
    let crlf = v1.replace('\n', "\r\n");
    s.push("crlf.yaml", &crlf);
    let ran = s.cli(&["workflows", "show", "ship"]).ok();
    assert_eq!(ran.stdout, crlf);
    assert!(ran.stderr.starts_with("ship version 3 (the latest)"), "{}", ran.stderr);

    s.cli(&["workflows", "show", "nope"]).fails(1, "error: Not found: workflow `nope` not found");
    s.cli(&["workflows", "show", "ship", "--version", "9"]).fails(1, "error: Not found: version `9` not found");
    s.cli(&["workflows", "versions", "nope"]).fails(1, "error: Not found: workflow `nope` not found");
    assert_eq!(s.cli(&["workflows", "show", "ship", "--version", "two"]).code, 2);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hosts_are_deregistered_and_projects_listed_shown_paused_and_unpaused() {
    let s = Server::start().await;
    let hosts = format!("{PROJECT}/hosts");
    // Two hosts register with registration tokens, as `shopfloor host` does.
    for name in ["box-1", "box-2"] {
        let reg = host_post(&s, &format!("{PROJECT}/host-registrations"), &s.token, json!({ "name": name })).await;
        host_post(&s, "/api/v1/host/register", reg["token"].as_str().unwrap(), json!({ "name": name, "capabilities": ["linux"], "max_concurrent": 1 })).await;
    }
    let as_member = s.token_with("member");
    s.cli_as(&as_member, &["hosts", "deregister", "box-1"]).fails(1, "error: Forbidden: this needs the admin role or above; the token has member");
    // By name: the host leaves the list; the API keeps it, deregistered.
    assert_eq!(s.cli(&["hosts", "deregister", "box-1"]).ok().line(), "box-1 deregistered: it takes no more steps and its credentials are revoked");
    let listed = s.api(&hosts).await;
    assert_eq!(listed["items"].as_array().unwrap().iter().map(|h| h["name"].as_str().unwrap()).collect::<Vec<_>>(), ["box-2"]);
    let all = s.api(&format!("{hosts}?include_deregistered=true")).await;
    assert!(all["items"].as_array().unwrap().iter().any(|h| h["name"] == "box-1" && h["deregistered_at"].is_string()), "{all}");
    assert!(s.cli(&["hosts", "list", "--all"]).ok().stdout.lines().any(|l| l.starts_with("box-1") && l.contains("deregistered ")));
    s.cli(&["hosts", "deregister", "box-1"]).fails(1, "error: no host named `box-1` in acme/web: `shopfloor hosts list` shows their names and ids");
    s.cli(&["hosts", "deregister", "00000000-0000-0000-0000-000000000000"]).fails(1, "error: Not found: host not found");
    // By id, with --json: the API answers nothing, so nothing prints.
    let id = listed["items"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(s.cli(&["hosts", "deregister", &id, "--json"]).ok().stdout, "");
    assert_eq!(s.api(&hosts).await["items"], json!([]));

    // Projects: the list marks the one in context.
    let (status, _) = s.send(reqwest::Method::POST, "/api/v1/orgs/acme/projects", &s.token, &json!({ "slug": "ops", "name": "Operations" })).await;
    assert_eq!(status, 201);
    let ran = s.cli(&["projects", "list"]).ok();
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", ran.stdout);
    assert!(lines[0].starts_with("SLUG  NAME") && lines[0].contains("CREATED"), "{}", ran.stdout);
    assert!(lines[1].starts_with("ops   Operations") && !lines[1].contains("(current)"), "{}", ran.stdout);
    assert!(lines[2].starts_with("web   web") && lines[2].ends_with("(current)"), "{}", ran.stdout);
    assert_eq!(s.cli(&["projects", "list", "--json"]).ok().stdout.trim_end(), s.api_bytes("/api/v1/orgs/acme/projects").await);

    let ran = s.cli(&["projects", "show"]).ok();
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(lines[0], "web  web");
    assert_eq!(lines[2], "state      active");
    assert_eq!(lines[3], "retention  finished runs are deleted 90 days after they end");
    let both = format!("{}\n{}\n", s.api_bytes(PROJECT).await, s.api_bytes(&format!("{PROJECT}/settings")).await);
    assert_eq!(s.cli(&["projects", "show", "--json"]).ok().stdout, both);

    // Pause and unpause, as the API's settings report them; another project is left alone.
    assert_eq!(s.cli(&["projects", "pause"]).ok().line(), "web paused: new runs are held");
    assert_eq!(s.api(&format!("{PROJECT}/settings")).await["paused"], true);
    assert!(s.cli(&["projects", "show"]).ok().stdout.contains("\nstate      paused: new runs are held\n"));
    assert_eq!(s.cli(&["projects", "pause", "--json"]).ok().stdout.trim_end(), s.api_bytes(&format!("{PROJECT}/settings")).await);
    assert_eq!(s.api("/api/v1/orgs/acme/projects/ops/settings").await["paused"], false);
    assert_eq!(s.cli(&["projects", "unpause"]).ok().line(), "web active: the runs it held are released");
    assert_eq!(s.api(&format!("{PROJECT}/settings")).await["paused"], false);
    assert_eq!(s.cli(&["projects", "pause", "--project", "ops"]).ok().line(), "ops paused: new runs are held");
    assert_eq!(s.api("/api/v1/orgs/acme/projects/ops/settings").await["paused"], true);
    assert_eq!(s.api(&format!("{PROJECT}/settings")).await["paused"], false);

    // Refused: a member's token, a project that is none, no project at all.
    s.cli_as(&as_member, &["projects", "pause"]).fails(1, "error: Forbidden: this needs the admin role or above; the token has member");
    assert_eq!(s.api(&format!("{PROJECT}/settings")).await["paused"], false);
    s.cli(&["projects", "show", "--project", "nope"]).fails(1, "error: Not found: project `nope` not found");
    s.cli_org(&["projects", "unpause"]).fails(2, "error: no project: give --project");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn webhooks_are_created_listed_delivered_replayed_and_deleted() {
    let s = Server::start().await;
    let webhooks = format!("{PROJECT}/webhooks");
    let ran = s.cli(&["webhooks", "list"]).ok();
    assert_eq!((ran.stdout.as_str(), ran.stderr.trim()), ("", "no webhooks"));

    // Create: the secret alone on standard output, the rest on standard error.
    let ran = s.cli(&["webhooks", "create", "--url", "https://hooks.example.com/shopfloor", "--events", "run.completed,run.failed"]).ok();
    let secret = ran.line().to_owned();
    assert!(secret.len() >= 16 && !secret.contains(' '), "{secret}");
    assert!(ran.stderr.contains("shown this once") && !ran.stderr.contains(&secret), "{}", ran.stderr);
    let listed = s.api(&webhooks).await;
    let hook = listed["items"][0].clone();
    let id = hook["id"].as_str().unwrap().to_owned();
    assert_eq!((hook["url"].as_str(), &hook["events"]), (Some("https://hooks.example.com/shopfloor"), &json!(["run.completed", "run.failed"])));
    assert!(ran.stderr.contains(&format!("webhook {id} for https://hooks.example.com/shopfloor (run.completed,run.failed)")), "{}", ran.stderr);
    // --json: the API's answer, the subscription and its secret.
    let ran = s.cli(&["webhooks", "create", "--url", "https://hooks.example.com/other", "--json"]).ok();
    let made: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert!(made["secret"].is_string() && made["events"] == json!(["run.*"]), "{made}");
    let other = made["id"].as_str().unwrap().to_owned();

    let ran = s.cli(&["webhooks", "list"]).ok();
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", ran.stdout);
    assert!(lines[0].starts_with("ID") && lines[0].contains("URL") && lines[0].contains("EVENTS"), "{}", ran.stdout);
    assert!(lines[1].starts_with(&format!("{id}  https://hooks.example.com/shopfloor  run.completed,run.failed  user:")), "{}", ran.stdout);
    assert_eq!(s.cli(&["webhooks", "list", "--json"]).ok().stdout.trim_end(), s.api_bytes(&webhooks).await);

    // Refused: a URL inside the network, a member's token.
    s.cli(&["webhooks", "create", "--url", "http://127.0.0.1:9/hook"]).fails(1, "error: Unprocessable request: url must not point inside the network");
    let as_member = s.token_with("member");
    s.cli_as(&as_member, &["webhooks", "list"]).fails(1, "error: Forbidden: this needs the admin role or above; the token has member");
    assert_eq!(s.api(&webhooks).await["items"].as_array().unwrap().len(), 2);

    // A run's completion is a delivery (made with its event).
    s.push("quick.yaml", QUICK);
    let run = s.cli(&["runs", "submit", "quick"]).ok().line().to_owned();
    s.until(&run, "completed", |r| r["status"] == "completed").await;
    let deliveries = format!("{webhooks}/{id}/deliveries");
    let ran = s.cli(&["webhooks", "deliveries", &id]).ok();
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", ran.stdout);
    assert!(lines[0].starts_with("DELIVERY") && lines[0].contains("STATE") && lines[0].contains("ATTEMPTS"), "{}", ran.stdout);
    let first = s.api(&deliveries).await["items"][0].clone();
    let delivery = first["id"].as_str().unwrap().to_owned();
    assert!(lines[1].starts_with(&format!("{delivery}  run.completed  {run}  ")), "{}", ran.stdout);
    // Its state moves as the engine tries to send it: --json is compared with the API's bytes
    // when the API answered the same before and after the command.
    let mut tries = 0;
    loop {
        let before = s.api_bytes(&deliveries).await;
        let shown = s.cli(&["webhooks", "deliveries", &id, "--json"]).ok().stdout;
        if s.api_bytes(&deliveries).await == before {
            assert_eq!(shown.trim_end(), before);
            break;
        }
        tries += 1;
        assert!(tries < 20, "the deliveries kept changing: {before}");
    }
    let ids = |v: &Value| v["items"].as_array().unwrap().iter().map(|d| d["id"].clone()).collect::<Vec<_>>();

    // Replay: the new delivery's id alone; the API lists it as a replay of the first.
    let ran = s.cli(&["webhooks", "replay", &id, &delivery]).ok();
    let replay = ran.line().to_owned();
    assert_ne!(replay, delivery);
    assert!(ran.stderr.starts_with(&format!("replay of {delivery}: {replay} (run.completed, ")), "{}", ran.stderr);
    let listed = s.api(&deliveries).await;
    let again = listed["items"].as_array().unwrap().iter().find(|d| d["id"] == replay.as_str()).expect("the replay is listed");
    assert_eq!(again["replay_of"], delivery.as_str());
    let ran = s.cli(&["webhooks", "replay", &id, &delivery, "--json"]).ok();
    assert_eq!(serde_json::from_str::<Value>(&ran.stdout).unwrap()["replay_of"], delivery.as_str());
    s.cli(&["webhooks", "replay", &id, "00000000-0000-0000-0000-000000000000"]).fails(1, "error: Not found: delivery not found");
    s.cli(&["webhooks", "deliveries", "00000000-0000-0000-0000-000000000000"]).fails(1, "error: Not found: webhook not found");

    // Delete: gone from the list, with its deliveries; the other stays.
    assert_eq!(s.cli(&["webhooks", "delete", &id]).ok().line(), format!("deleted webhook {id} and its deliveries"));
    let left = s.api(&webhooks).await;
    assert_eq!(ids(&left), vec![json!(other)]);
    s.cli(&["webhooks", "delete", &id]).fails(1, "error: Not found: webhook not found");
    assert_eq!(s.cli(&["webhooks", "delete", &other, "--json"]).ok().stdout, "");
    assert_eq!(s.api(&webhooks).await["items"], json!([]));
    s.finish().await;
}
