//! The project stream's ordering: an event committed later than another, by a transaction
//! that started writing earlier, is held until it can no longer appear behind a client's
//! position, then delivered in `(xid, event_id)` order; a stream resumed from any position
//! reads what followed it.

use engine::ids::RunId;
use engine::store::runs::{self, NewRun};
use engine::store::{Actor, Change, approvals};
use serde_json::json;

use crate::support::{self, App, Org, Sse, SseEvent};

async fn new_run(app: &App, org: &Org) -> NewRun {
    let workflow =
        sqlx::query_scalar("SELECT workflow_id FROM workflows WHERE org_id = $1 AND name = 'approve'").bind(org.id).fetch_one(app.pool()).await.unwrap();
    NewRun::of_workflow(org.id, org.project, workflow, 1, json!({}))
}

/// Reads the stream up to `run`'s wait at its approval; what it read.
async fn until_awaiting(sse: &mut Sse, run: RunId, what: &str) -> Vec<SseEvent> {
    sse.until(what, |e| e.data["run"] == run.to_string() && e.event == "run.awaiting").await
}

/// The app with an engine, org `acme`, and the project's stream as its viewer, which has shown
/// run A (of `approve`) waiting at its approval.
async fn streaming_with_a_waiting_run() -> (App, Org, Sse, RunId) {
    let app = App::with_engine().await;
    let org = app.org("acme").await;
    let mut sse = support::sse(&app, "/api/v1/orgs/acme/projects/web/events", &org.viewer, None).await;
    let a = app.submit_approval(&org).await;
    until_awaiting(&mut sse, a, "run A waiting at its approval").await;
    (app, org, sse, a)
}

#[tokio::test]
async fn a_slow_transactions_events_are_never_skipped_or_reordered() {
    let (app, org, mut sse, a) = streaming_with_a_waiting_run().await;

    // A's approval is answered by a transaction that writes first but commits last; run B is
    // submitted and committed meanwhile.
    let mut slow = Change::begin(app.pool(), Actor::System).await.unwrap();
    let answer = json!({ "ticket": "T-1" }).as_object().cloned().unwrap();
    approvals::approve(&mut slow, org.id, a, "ask", &answer).await.unwrap();
    let mut fast = Change::begin(app.pool(), Actor::System).await.unwrap();
    let b = runs::submit(&mut fast, new_run(&app, &org).await).await.unwrap();
    fast.commit().await.unwrap();

    // B's events wait behind the open older transaction: a client that saw them and then A's
    // would have A's appear behind its position. So the first event the client sees once the
    // slow transaction commits is A's, though B's committed first.
    slow.commit().await.unwrap();

    let first = sse.next().await;
    assert_eq!((first.event.as_str(), first.data["run"].as_str().unwrap()), ("step.succeeded", a.to_string().as_str()));
    let rest = until_awaiting(&mut sse, b, "run B waiting at its approval").await;
    assert!(rest.iter().any(|e| e.data["run"] == b.to_string() && e.event == "run.started"));

    // Resuming from the first event replays the rest in the same order.
    let all: Vec<_> = std::iter::once(first.clone()).chain(rest).collect();
    let mut again = support::sse(&app, "/api/v1/orgs/acme/projects/web/events", &org.viewer, Some(&first.id)).await;
    for want in &all[1..] {
        let got = again.next().await;
        assert_eq!(got.id, want.id);
    }
    // Another project's stream (and org) sees none of it: read from the very start, the first
    // event it shows is of its own run, submitted after all of the above.
    let other = app.org("other").await;
    let mut theirs = support::sse(&app, "/api/v1/orgs/other/projects/web/events", &other.owner, Some("0")).await;
    let own = app.submit_approval(&other).await;
    let seen = theirs.next().await;
    assert_eq!(seen.data["run"], own.to_string(), "{seen:?}");
    // An id resumes only the stream that gave it: it says nothing of the service's transaction
    // ids (which would tell one tenant how busy the others are), and elsewhere it is refused.
    assert!(!first.id.contains('.') && first.id.len() == 43, "{}", first.id);
    let foreign =
        app.http.get(app.url("/api/v1/orgs/other/projects/web/events")).bearer_auth(&other.owner).header("last-event-id", &first.id).send().await.unwrap();
    assert_eq!(foreign.status(), reqwest::StatusCode::BAD_REQUEST);
    assert!(foreign.text().await.unwrap().contains("not a position of this stream"));
    drop((sse, again, theirs));
    app.finish().await;
}

#[tokio::test]
async fn the_hub_follows_on_after_its_listen_connection_is_ended() {
    let (app, org, mut sse, _) = streaming_with_a_waiting_run().await;

    // The server ends every listening session (the hub's and the engine's), as a restart or
    // an operator would; each process subscribes again and looks once for what it missed.
    let ended: Vec<bool> =
        sqlx::query_scalar("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%'")
            .fetch_all(app.pool())
            .await
            .unwrap();
    assert_eq!(ended, [true, true], "the hub and the engine each listen once");
    let b = app.submit_approval(&org).await;
    until_awaiting(&mut sse, b, "run B waiting at its approval").await;
    drop(sse);
    app.finish().await;
}

/// A stream does not outlive its token: once the token is revoked, the stream ends at its next
/// event after the token's periodic check, and reconnecting is refused.
#[tokio::test]
async fn a_revoked_tokens_stream_ends() {
    let (app, org) = App::with_engine().await.with_acme().await;
    let (jti, token) = app.token_for(&org, org.admin_user, "admin", chrono::Duration::days(1)).await;
    let path = "/api/v1/orgs/acme/projects/web/events";
    let mut sse = support::sse(&app, path, &token, None).await;
    let first = app.submit_approval(&org).await;
    until_awaiting(&mut sse, first, "a run while the token is good").await;

    app.json(reqwest::Method::DELETE, &format!("/api/v1/orgs/acme/tokens/{jti}"), &org.owner, None, reqwest::StatusCode::NO_CONTENT).await;
    let ended = async {
        loop {
            app.submit_approval(&org).await;
            if sse.next_or_end().await.is_none() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), ended).await.expect("the revoked token's stream ended");
    let (status, _, _) = app.send(reqwest::Method::GET, path, Some(&token), None).await;
    assert_eq!(status, reqwest::StatusCode::UNAUTHORIZED);
    app.finish().await;
}
