//! A client of a Server-Sent Events stream (the project event stream), as a test reads it.

use std::time::Duration;

use serde_json::Value;

#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: String,
    pub event: String,
    pub data: Value,
}

/// An open stream.
pub struct Sse {
    stream: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<axum::body::Bytes>> + Send>>,
    buf: String,
}

impl Sse {
    /// Opens `url` with `token`, resuming after `last_event_id`; panics unless it answers a stream.
    pub async fn connect(http: &reqwest::Client, url: &str, token: &str, last_event_id: Option<&str>) -> Sse {
        let mut req = http.get(url).bearer_auth(token).header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        let resp = req.send().await.expect("connect to the stream");
        assert_eq!(resp.status(), reqwest::StatusCode::OK, "GET {url}");
        let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        assert!(ct.starts_with("text/event-stream"), "{ct}");
        Sse { stream: Box::pin(resp.bytes_stream()), buf: String::new() }
    }

    /// The next event (comments and keep-alives skipped); a hang guard fails a stream silent
    /// for two minutes.
    pub async fn next(&mut self) -> SseEvent {
        self.next_or_end().await.expect("the stream stays open")
    }

    /// The next event, or `None` when the server ended the stream.
    pub async fn next_or_end(&mut self) -> Option<SseEvent> {
        use futures::StreamExt;
        loop {
            while let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut id, mut event, mut data) = (String::new(), String::new(), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if !data.is_empty() {
                    return Some(SseEvent { id, event, data: serde_json::from_str(&data).expect("event data is JSON") });
                }
            }
            let chunk = tokio::time::timeout(Duration::from_secs(120), self.stream.next()).await.expect("the stream hung");
            let chunk = chunk?.expect("the stream reads");
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// The next event if one comes within `wait`.
    pub async fn next_within(&mut self, wait: Duration) -> Option<SseEvent> {
        tokio::time::timeout(wait, self.next()).await.ok()
    }

    /// Reads events until one matches; returns every event read, the match last.
    pub async fn until(&mut self, what: &str, pred: impl Fn(&SseEvent) -> bool) -> Vec<SseEvent> {
        let mut seen = Vec::new();
        loop {
            let e = self.next().await;
            let done = pred(&e);
            seen.push(e);
            if done {
                return seen;
            }
            assert!(seen.len() < 10_000, "never saw {what}");
        }
    }
}
