//! The run lifecycle as the reference systems define it, driven from GitHub through signed
//! webhooks to a real `shopfloor serve` (and a real `shopfloor host` where a crew step must
//! run): the claim rule on "an attempt began", cycle budgets that stop every workflow on
//! the item, event waits' lifecycle events and default deadline, dry and child runs that do
//! not announce themselves, reruns that park for approval, and rendered approval prompts.

use std::time::Duration;

use engine::ids::RunId;
use serde_json::{Value, json};
use shopfloor_tests::github_fake::Issue;
use shopfloor_tests::process::Proc;
use shopfloor_tests::sse::Sse;

use crate::host_env::Env;

const CREW: &str = include_str!("../workflows/crew.yaml");
const CREW_THEN_ASK: &str = include_str!("../workflows/crew_then_ask.yaml");
const ALPHA: &str = include_str!("../workflows/alpha.yaml");
const BETA: &str = include_str!("../workflows/beta.yaml");
const MERGE_WAIT: &str = include_str!("../workflows/merge_wait.yaml");
const LONG_WAIT: &str = include_str!("../workflows/long_wait.yaml");
const GATED: &str = include_str!("../workflows/gated_ship_ask.yaml");
const PARENT: &str = include_str!("../workflows/parent_of_leaf.yaml");
const LEAF: &str = include_str!("../workflows/leaf_naps.yaml");

/// The substates of a run whose crew step waits for a host.
const WAITING_FOR_A_HOST: &[&str] = &["waiting_for_agent", "unroutable"];

impl Env {
    async fn send(&self, event: &str, payload: &Value) -> Value {
        let (status, answer) = self.hooks().send(event, &uuid::Uuid::new_v4().to_string(), payload).await;
        assert_eq!(status, 202, "{answer}");
        answer
    }

    /// The project's event stream from now on, as the owner.
    async fn stream(&self) -> Sse {
        Sse::connect(&reqwest::Client::new(), &format!("{}/api/v1/orgs/acme/projects/web/events", self.base), &self.owner_token, None).await
    }

    /// The runs of `workflow`, oldest first: (id, status, reason).
    async fn runs_of(&self, workflow: &str) -> Vec<(RunId, String, Option<String>)> {
        sqlx::query_as("SELECT r.run_id, r.status, r.reason FROM runs r JOIN workflows w USING (workflow_id) WHERE w.name = $1 ORDER BY r.created_at, r.run_id")
            .bind(workflow)
            .fetch_all(&self.db.pool)
            .await
            .unwrap()
    }

    /// The trigger events of `workflow`, oldest first: (status, reason).
    async fn events_of(&self, workflow: &str) -> Vec<(String, Option<String>)> {
        sqlx::query_as(
            "SELECT e.status, e.reason FROM trigger_events e JOIN workflows w USING (workflow_id) WHERE w.name = $1 ORDER BY e.created_at, e.event_id",
        )
        .bind(workflow)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }

    /// Waits until the run's substate, as the API shows it, is one of `want`.
    async fn until_substate(&self, run: RunId, want: &[&str]) {
        let wait = async {
            loop {
                let r = self.get(&format!("/orgs/acme/projects/web/runs/{run}")).await;
                if r["substate"].as_str().is_some_and(|s| want.contains(&s)) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(120), wait).await.unwrap_or_else(|_| panic!("{run} never became {want:?}"));
    }

    async fn until_status(&self, run: RunId, want: &str) {
        self.until(run, &format!("SELECT status = '{want}' FROM runs WHERE run_id = $1"), Duration::from_secs(120), want).await;
    }

    /// Puts issue `number` labelled `label`, which opens one run of `workflow`: the issue, and
    /// that run (the workflow's first).
    async fn open_issue(&self, number: i64, title: &str, label: &str, workflow: &str) -> (Issue, RunId) {
        let mut issue = Issue::new(number, title);
        assert_eq!(self.send("issues", &issue.labeled(&self.repo(), label)).await["runs_opened"], 1);
        (issue, self.runs_of(workflow).await[0].0)
    }

    /// Edits the issue: the event opens no run, and queues as the workflow's `nth` trigger event.
    async fn edit_queues(&self, issue: &mut Issue, body: &str, workflow: &str, nth: usize) {
        let answer = self.send("issues", &issue.edited(&self.repo(), body, "bob")).await;
        assert_eq!(answer["runs_opened"], 0, "{answer}");
        assert_eq!(self.events_of(workflow).await[nth].0, "queued");
    }

    /// Lets the harness running `step` finish.
    fn finish_harness(&self, step: &str) {
        std::fs::write(self.marks().join(format!("{step}.go")), "").unwrap();
    }
}

/// `source` served with a host `builder`, and issue `number` labelled `ready`: the one run of
/// `workflow` it opened, once its crew step `work` runs on the host (the step's id).
async fn running_on_a_host(source: &str, workflow: &str, number: i64, title: &str) -> (Env, Proc, Issue, RunId, String) {
    let env = Env::start(&[source]).await;
    let host = env.host("builder", 1).await;
    let (issue, run) = env.open_issue(number, title, "ready", workflow).await;
    let (step, _pid) = env.running_harness(run, "work").await;
    (env, host, issue, run, step)
}

/// usine's claim rule: only a run in which an attempt began holds a newer event back. A run
/// whose crew step waits for a host has not started: a new event supersedes it, and the item
/// no longer matching revokes it; neither spends the item's cycle budget.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_waiting_for_a_host_is_superseded_and_revoked() {
    let env = Env::start(&[CREW]).await;
    let (mut issue, first) = env.open_issue(5, "the widget", "ready", "crew").await;
    // No host is connected: the crew step waits for one (with no host registered at all, the
    // console says none can run it).
    env.until_substate(first, WAITING_FOR_A_HOST).await;

    // Another label: a new event for the item, which the if: still admits.
    assert_eq!(env.send("issues", &issue.labeled(&env.repo(), "urgent")).await["runs_opened"], 1);
    let runs = env.runs_of("crew").await;
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0].1, "cancelled");
    assert!(runs[0].2.as_deref().is_some_and(|r| r.starts_with("superseded by ")), "{runs:?}");
    let second = runs[1].0;
    env.until_substate(second, WAITING_FOR_A_HOST).await;

    // The label goes: the run waiting for a host is revoked, and nothing opens.
    assert_eq!(env.send("issues", &issue.unlabeled(&env.repo(), "ready")).await["runs_opened"], 0);
    assert_eq!(env.status(second).await, ("cancelled".to_owned(), Some("revoked".to_owned())));
    let events: Vec<String> = env.events_of("crew").await.into_iter().map(|e| e.0).collect();
    assert_eq!(events, ["superseded", "revoked"]);
    // No attempt of either began: both gave their cycle back.
    let used: i32 = sqlx::query_scalar("SELECT cycles_used FROM item_cycle_budgets").fetch_one(&env.db.pool).await.unwrap();
    assert_eq!(used, 0);
    env.finish().await;
}

/// A running attempt always finishes: the newer event queues behind it, is not revoked by the
/// run's own progress, and is judged again when the run ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_running_crew_step_is_never_superseded_and_the_queued_event_is_judged_at_its_end() {
    let (env, _host, mut issue, first, step) = running_on_a_host(CREW, "crew", 6, "the gizmo").await;

    env.edit_queues(&mut issue, "More detail while it runs", "crew", 1).await;
    assert_eq!(env.runs_of("crew").await.len(), 1, "the running run is never superseded");
    assert_eq!(env.status(first).await.0, "running");

    // The harness finishes; the run ends, and the queued event opens its run.
    env.finish_harness(&step);
    env.until_status(first, "completed").await;
    let runs = env.runs_of("crew").await;
    assert_eq!(runs.len(), 2, "{runs:?}");
    let events: Vec<String> = env.events_of("crew").await.into_iter().map(|e| e.0).collect();
    assert_eq!(events, ["started", "started"]);

    // Queued again behind the second run; then the label goes: the queued event no longer
    // matches and is revoked, the running run is not, and nothing opens when it ends (the end
    // judges the queue in its own transaction, so the count after it is final).
    let (second_step, _) = env.running_harness(runs[1].0, "work").await;
    env.edit_queues(&mut issue, "Changed again", "crew", 2).await;
    assert_eq!(env.send("issues", &issue.unlabeled(&env.repo(), "ready")).await["runs_opened"], 0);
    assert_eq!(env.events_of("crew").await[2], ("revoked".to_owned(), Some("revoked".to_owned())));
    assert_eq!(env.status(runs[1].0).await.0, "running", "a running attempt is never revoked");
    env.finish_harness(&second_step);
    env.until_status(runs[1].0, "completed").await;
    assert_eq!(env.runs_of("crew").await.len(), 2);
    env.finish().await;
}

/// usine: supersede and revoke apply only where no attempt began. A run whose crew step is done
/// and that now waits at an approval has started: a newer event queues behind it, and the item
/// no longer matching revokes that event, never the run.
#[tokio::test(flavor = "multi_thread")]
async fn a_started_run_waiting_at_an_approval_is_neither_superseded_nor_revoked() {
    let (env, _host, mut issue, run, step) = running_on_a_host(CREW_THEN_ASK, "crew_then_ask", 7, "the sprocket").await;
    env.finish_harness(&step);
    env.until_substate(run, &["awaiting_signal"]).await;

    env.edit_queues(&mut issue, "More detail while it waits", "crew_then_ask", 1).await;
    assert_eq!(env.runs_of("crew_then_ask").await.len(), 1, "a started run is never superseded");

    assert_eq!(env.send("issues", &issue.unlabeled(&env.repo(), "ready")).await["runs_opened"], 0);
    assert_eq!(env.events_of("crew_then_ask").await[1], ("revoked".to_owned(), Some("revoked".to_owned())));
    assert_eq!(env.status(run).await, ("running".to_owned(), None), "a started run is never revoked");
    let used: i32 = sqlx::query_scalar("SELECT cycles_used FROM item_cycle_budgets").fetch_one(&env.db.pool).await.unwrap();
    assert_eq!(used, 1, "its cycle stays spent");
    env.finish().await;
}

/// usine: once an item's cycle budget is spent, no workflow opens a run on that item until a
/// person answers the ask; the reset judges every blocked workflow again.
#[tokio::test(flavor = "multi_thread")]
async fn a_spent_cycle_budget_stops_every_workflow_on_the_item_until_reset() {
    let env = Env::start(&[ALPHA, BETA]).await;
    let mut issue = Issue::new(9, "Keeps changing");
    assert_eq!(env.send("issues", &issue.labeled(&env.repo(), "ready")).await["runs_opened"], 2);
    for wf in ["alpha", "beta"] {
        let run = env.runs_of(wf).await[0].0;
        env.until_status(run, "completed").await;
    }

    // alpha's one cycle is spent: its event is blocked and asks; beta (judged after alpha)
    // opens nothing either.
    let answer = env.send("issues", &issue.edited(&env.repo(), "v2", "bob")).await;
    assert_eq!(answer["runs_opened"], 0, "{answer}");
    assert_eq!(env.events_of("alpha").await[1], ("blocked".to_owned(), Some("cycle budget 1/1".to_owned())));
    let beta = env.events_of("beta").await;
    assert_eq!(beta[1].0, "blocked", "{beta:?}");
    assert!(beta[1].1.as_deref().is_some_and(|r| r.contains("alpha")), "the reason names the spent budget: {beta:?}");
    let answer = env.send("issues", &issue.edited(&env.repo(), "v3", "bob")).await;
    assert_eq!(answer["runs_opened"], 0, "{answer}");
    assert_eq!(env.runs_of("beta").await.len(), 1);

    // The ask is under "Needs you", through the API.
    let asks = env.get("/orgs/acme/projects/web/cycle-asks").await["items"].as_array().cloned().unwrap();
    assert_eq!(asks.len(), 1, "{asks:?}");
    assert_eq!((asks[0]["workflow"].as_str(), asks[0]["title"].as_str()), (Some("alpha"), Some("Keeps changing")));
    let item = asks[0]["item"].as_str().expect("the ask names its item").to_owned();

    // A person resets it: both workflows are judged again and open their runs.
    let (status, reset) = env.post(&format!("/orgs/acme/projects/web/cycle-asks/{item}/reset"), &json!({})).await;
    assert_eq!(status, 200, "{reset}");
    let wait = async {
        while env.runs_of("alpha").await.len() < 2 || env.runs_of("beta").await.len() < 2 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), wait).await.expect("the reset opened a run of each workflow");
    env.finish().await;
}

/// An event wait says what it waits for and until when, and says so again when its default
/// deadline (a setting, shortened here) passes or when its run is cancelled.
#[tokio::test(flavor = "multi_thread")]
async fn an_event_wait_announces_itself_expires_at_the_default_deadline_or_is_withdrawn() {
    let env = Env::start_setting(&[MERGE_WAIT, LONG_WAIT], &[("SHOPFLOOR_EVENT_WAIT_TIMEOUT_SECS", "3")]).await;
    let mut sse = env.stream().await;
    let (_, run) = env.open_issue(12, "Waits for its pull request", "wait", "merge-wait").await;
    let run = run.to_string();
    let seen = sse
        .until("the waiting run's end", |e| {
            e.data["run"] == run.as_str()
                && e.event.starts_with("run.")
                && e.event != "run.started"
                && e.event != "run.awaiting"
                && e.event != "run.wait_expired"
        })
        .await;
    let lifecycle: Vec<&str> = seen.iter().filter(|e| e.data["run"] == run.as_str() && e.event.starts_with("run.")).map(|e| e.event.as_str()).collect();
    assert_eq!(lifecycle, ["run.started", "run.awaiting", "run.wait_expired", "run.completed"]);
    let awaiting = seen.iter().find(|e| e.event == "run.awaiting").unwrap();
    assert_eq!(
        (awaiting.data["attrs"]["waits_on"].as_str(), awaiting.data["attrs"]["event"].as_str()),
        (Some("github"), Some("pull_request.closed")),
        "{:?}",
        awaiting.data
    );
    let deadline = awaiting.data["attrs"]["deadline"].as_str().expect("a deadline");
    chrono::DateTime::parse_from_rfc3339(deadline).expect("the deadline is a timestamp");
    let output: Value = sqlx::query_scalar("SELECT output FROM steps WHERE node = 'merged'").fetch_one(&env.db.pool).await.unwrap();
    assert_eq!(output["timed_out"], true, "{output}");

    // Cancelled while it waits: the wait is withdrawn.
    let mut other = Issue::new(13, "Not needed after all");
    assert_eq!(env.send("issues", &other.labeled(&env.repo(), "hold")).await["runs_opened"], 1);
    let held = env.runs_of("long-wait").await[0].0;
    let held_id = held.to_string();
    sse.until("the second wait", |e| e.data["run"] == held_id.as_str() && e.event == "run.awaiting").await;
    let (status, answer) = env.post(&format!("/orgs/acme/projects/web/runs/{held}/cancel"), &json!({ "reason": "not needed" })).await;
    assert_eq!(status, 200, "{answer}");
    let seen = sse.until("the cancel", |e| e.data["run"] == held_id.as_str() && e.event == "run.cancelled").await;
    let kinds: Vec<&str> = seen.iter().filter(|e| e.data["run"] == held_id.as_str() && e.event.starts_with("run.")).map(|e| e.event.as_str()).collect();
    assert_eq!(kinds, ["run.wait_withdrawn", "run.cancelled"]);
    env.finish().await;
}

/// spool: dry runs and child runs do not announce themselves; dry runs are listed apart.
#[tokio::test(flavor = "multi_thread")]
async fn dry_runs_and_child_runs_stay_off_the_stream_and_dry_runs_off_the_list() {
    let env = Env::start(&[LEAF, PARENT]).await;
    let mut sse = env.stream().await;
    let (status, dry) = env.post("/orgs/acme/projects/web/runs", &json!({ "workflow": "leaf", "dry_run": true })).await;
    assert_eq!(status, 201, "{dry}");
    let dry_id = dry["id"].as_str().unwrap().to_owned();
    env.until_status(dry_id.parse().unwrap(), "completed").await;
    // Then a parent, whose child runs beside it: only the parent's events reach the stream.
    let (status, parent) = env.post("/orgs/acme/projects/web/runs", &json!({ "workflow": "parent" })).await;
    assert_eq!(status, 201, "{parent}");
    let parent_id = parent["id"].as_str().unwrap().to_owned();
    let seen = sse.until("the parent's end", |e| e.data["run"] == parent_id.as_str() && e.event == "run.completed").await;
    let child: RunId = sqlx::query_scalar("SELECT run_id FROM runs WHERE parent_run_id IS NOT NULL").fetch_one(&env.db.pool).await.unwrap();
    let strangers: Vec<String> = seen.iter().filter(|e| e.data["run"] != parent_id.as_str()).map(|e| format!("{} {}", e.data["run"], e.event)).collect();
    assert!(strangers.is_empty(), "only the parent announces itself: {strangers:?}");
    // Their journals keep every event.
    for run in [dry_id.clone(), child.to_string()] {
        let journal = env.get(&format!("/orgs/acme/projects/web/runs/{run}/events")).await;
        let kinds: Vec<&str> = journal["items"].as_array().unwrap().iter().filter_map(|e| e["kind"].as_str()).collect();
        assert!(kinds.contains(&"run.started") && kinds.contains(&"run.completed"), "{run}: {kinds:?}");
    }

    // Listed apart.
    let ids = |list: Value| list["items"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect::<Vec<_>>();
    let listed = ids(env.get("/orgs/acme/projects/web/runs").await);
    assert!(listed.contains(&parent_id) && !listed.contains(&dry_id), "{listed:?}");
    assert_eq!(ids(env.get("/orgs/acme/projects/web/runs?dry_run=true").await), [dry_id]);
    assert!(ids(env.get("/orgs/acme/projects/web/runs?dry_run=false").await).contains(&parent_id));
    env.finish().await;
}

/// `approval: required` holds a rerun as it held the run; a prompt shows the item's title.
#[tokio::test(flavor = "multi_thread")]
async fn an_approval_prompt_shows_the_item_and_a_rerun_parks_for_approval() {
    let env = Env::start(&[GATED]).await;
    let (_, run) = env.open_issue(21, "the sprocket", "ship", "gated").await;
    env.until_substate(run, &["awaiting_signal"]).await;
    let path = format!("/orgs/acme/projects/web/runs/{run}");
    let opened = async {
        while env.get(&path).await["approvals"][0]["node"] != "$start" {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(120), opened).await.expect("the run's $start approval opens");
    let (status, answer) = env.post(&format!("{path}/approvals/$start"), &json!({})).await;
    assert_eq!(status, 200, "{answer}");

    // The approval node's prompt is rendered over the run's context.
    let asked = async {
        loop {
            let detail = env.get(&path).await;
            if detail["approvals"][0]["node"] == "ask" {
                return detail["approvals"][0]["prompt"].as_str().unwrap().to_owned();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let prompt = tokio::time::timeout(Duration::from_secs(60), asked).await.expect("the run reached its approval");
    assert_eq!(prompt, "Ship the sprocket (#21)?");
    let (status, answer) = env.post(&format!("{path}/approvals/ask"), &json!({})).await;
    assert_eq!(status, 200, "{answer}");
    env.until_status(run, "completed").await;

    // A rerun parks at `$start` again, waiting for a person.
    let (status, rerun) = env.post(&format!("{path}/rerun"), &json!({})).await;
    assert_eq!(status, 201, "{rerun}");
    let again: RunId = rerun["id"].as_str().unwrap().parse().unwrap();
    env.until_substate(again, &["awaiting_signal"]).await;
    // The substate says "waiting for approval" as soon as the rerun is made; the engine opens
    // the `$start` approval itself a moment later (the CLI's `approve` waits for it too).
    let parked = async {
        loop {
            let detail = env.get(&format!("/orgs/acme/projects/web/runs/{again}")).await;
            if detail["approvals"][0]["node"] == "$start" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(120), parked).await.expect("the rerun's $start approval opens");
    env.finish().await;
}
