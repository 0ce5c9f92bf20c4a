//! Intervene through a real `shopfloor serve` and `shopfloor host`: a person's message to a
//! running Claude Code session (`POST …/runs/{run}/steps/{step}/messages`) reaches the host in
//! the answer to its next heartbeat or session report, is written to the harness's standard
//! input as a stream-json user line, and the stand-in echoes it into the transcript before its
//! result; the message is marked delivered, audited with the person, and noted by a
//! `step.message` run event that does not carry its text.

use std::time::Duration;

use serde_json::{Value, json};

use super::host_env::*;

const LISTENING: &str = include_str!("../workflows/listening.yaml");

#[tokio::test(flavor = "multi_thread")]
async fn a_message_to_a_live_session_reaches_the_harness_and_its_transcript() {
    let env = Env::start(&[LISTENING]).await;
    let _host = env.host("solo", 1).await;
    let (run, step, _) = env.working("listening", json!({ "words": "build the widget" })).await;
    // The stand-in has read its prompt and listens for the next user line.
    env.until(run, "SELECT EXISTS (SELECT 1 FROM step_logs WHERE run_id = $1 AND line LIKE '%Listening.%')", Duration::from_secs(120), "listened").await;

    let text = "Use the \"blue\" widget, please";
    let (status, sent) = env.post(&format!("/orgs/acme/projects/web/runs/{run}/steps/{step}/messages"), &json!({ "text": text })).await;
    assert_eq!(status, 201, "{sent}");
    assert_eq!(sent["step"], step.as_str());

    env.until(run, "SELECT status <> 'running' FROM runs WHERE run_id = $1", Duration::from_secs(60), "ended").await;
    assert_eq!(env.status(run).await, ("completed".to_owned(), None));

    // The transcript: the echo of the message as an assistant line, before the result.
    let lines: Vec<(String, String)> =
        sqlx::query_as("SELECT stream, line FROM step_logs WHERE run_id = $1 ORDER BY seq").bind(run).fetch_all(&env.db.pool).await.unwrap();
    let heard = lines.iter().position(|(_, l)| l.contains(r#"heard: Use the \"blue\" widget, please"#)).unwrap_or_else(|| panic!("no echo in {lines:#?}"));
    let result = lines.iter().position(|(s, _)| s == "result").expect("a result line");
    assert_eq!(lines[heard].0, "assistant");
    assert!(heard < result, "{lines:#?}");

    // Delivered, audited with the person, and an event without the text.
    let delivered: bool =
        sqlx::query_scalar("SELECT delivered_at IS NOT NULL FROM step_messages WHERE run_id = $1").bind(run).fetch_one(&env.db.pool).await.unwrap();
    assert!(delivered, "the host acknowledged the message");
    let event: Value =
        sqlx::query_scalar("SELECT attrs FROM run_events WHERE run_id = $1 AND kind = 'step.message'").bind(run).fetch_one(&env.db.pool).await.unwrap();
    assert_eq!(event["chars"], text.chars().count());
    assert!(event["by"].as_str().is_some_and(|b| b.starts_with("user:")), "{event}");
    assert!(!event.to_string().contains("blue"), "the event carries no text: {event}");
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'step.message' AND actor_kind = 'user' AND target_id = $1")
        .bind(&step)
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert_eq!(audited, 1);
    drop(_host);
    env.finish().await;
}
