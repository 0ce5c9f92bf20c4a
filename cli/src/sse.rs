//! Following the project's event stream (`GET …/projects/{project}/events`, Server-Sent
//! Events): what `runs follow` and `runs list --watch` read instead of polling.
//!
//! The stream is opened before the command reads any state, so nothing that happens between
//! the read and the first event is missed. When the connection drops, it is opened again with
//! `Last-Event-ID` set to the last event seen (1 s, doubling to 30 s, between tries), and the
//! server resumes right after it: no gap, no repeat.

use std::time::Duration;

use futures::StreamExt as _;
use reqwest::{Method, Url};
use serde_json::Value;

use super::error::ClientError;
use super::http::{Api, refused};

/// One event: its kind (`event`) and its `data` as JSON (its `id` is kept by the stream).
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub kind: String,
    pub data: Value,
}

/// The body of the response, as the chunks reqwest yields.
type Bytes = std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// A followed stream that reconnects by itself.
pub(crate) struct Stream {
    url: Url,
    last_id: Option<String>,
    body: Option<Bytes>,
    buf: String,
    /// The fields of the event being read.
    id: Option<String>,
    kind: String,
    data: String,
}

impl Stream {
    /// Opens the project's stream: an error here (a bad token, no such project) is the
    /// command's error.
    pub(crate) async fn open(api: &Api) -> Result<Stream, ClientError> {
        let url = api.project_url(&["events"])?;
        let mut s = Stream { url, last_id: None, body: None, buf: String::new(), id: None, kind: String::new(), data: String::new() };
        s.connect(api).await?;
        Ok(s)
    }

    async fn connect(&mut self, api: &Api) -> Result<(), ClientError> {
        let mut req = api.request(Method::GET, self.url.clone()).header(reqwest::header::ACCEPT, "text/event-stream");
        if let Some(id) = &self.last_id {
            req = req.header("last-event-id", id);
        }
        let resp = req.send().await.map_err(|e| api.unreachable(&e))?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
            return Err(refused(status, &body));
        }
        self.body = Some(Box::pin(resp.bytes_stream()));
        self.buf.clear();
        self.id = None;
        self.kind.clear();
        self.data.clear();
        Ok(())
    }

    /// The next event. A dropped connection is opened again (after a pause) and read on; only
    /// a refusal by the server ends the stream with an error.
    pub(crate) async fn next(&mut self, api: &Api) -> Result<Event, ClientError> {
        let mut backoff = Duration::from_secs(1);
        loop {
            if let Some(event) = self.take_event() {
                return Ok(event);
            }
            let chunk = match self.body.as_mut() {
                Some(body) => body.next().await,
                None => None,
            };
            match chunk {
                Some(Ok(bytes)) => {
                    self.buf.push_str(&String::from_utf8_lossy(&bytes));
                    backoff = Duration::from_secs(1);
                }
                // The connection ended or broke: resume after the last event seen.
                Some(Err(_)) | None => {
                    self.body = None;
                    loop {
                        match self.connect(api).await {
                            Ok(()) => break,
                            Err(e @ ClientError::Refused { .. }) => return Err(e),
                            Err(_) => {
                                tokio::time::sleep(backoff).await;
                                backoff = (backoff * 2).min(Duration::from_secs(30));
                            }
                        }
                    }
                }
            }
        }
    }

    /// The next event if one comes within `wait` (events of one change arrive together: this
    /// lets a reader act once per change rather than once per event).
    pub(crate) async fn next_within(&mut self, api: &Api, wait: Duration) -> Result<Option<Event>, ClientError> {
        match tokio::time::timeout(wait, self.next(api)).await {
            Ok(event) => event.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// Parses complete lines of the buffer; returns an event when a blank line ends one.
    fn take_event(&mut self) -> Option<Event> {
        while let Some(end) = self.buf.find('\n') {
            let mut line: String = self.buf.drain(..=end).collect();
            line.pop();
            if line.ends_with('\r') {
                line.pop();
            }
            if line.is_empty() {
                let event = self.dispatch();
                if event.is_some() {
                    return event;
                }
                continue;
            }
            if line.starts_with(':') {
                continue; // a comment: the keep-alive
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f.to_owned(), v.strip_prefix(' ').unwrap_or(v).to_owned()),
                None => (line.clone(), String::new()),
            };
            match field.as_str() {
                "id" => self.id = Some(value),
                "event" => self.kind = value,
                "data" => {
                    if !self.data.is_empty() {
                        self.data.push('\n');
                    }
                    self.data.push_str(&value);
                }
                _ => {}
            }
        }
        None
    }

    fn dispatch(&mut self) -> Option<Event> {
        if let Some(id) = self.id.take() {
            self.last_id = Some(id);
        }
        let kind = std::mem::take(&mut self.kind);
        let raw = std::mem::take(&mut self.data);
        if raw.is_empty() {
            return None;
        }
        let mut data = serde_json::from_str(&raw).unwrap_or(Value::Null);
        crate::http::defang(&mut data);
        Some(Event { kind: if kind.is_empty() { "message".to_owned() } else { kind }, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream() -> Stream {
        Stream {
            url: Url::parse("http://127.0.0.1/events").unwrap(),
            last_id: None,
            body: None,
            buf: String::new(),
            id: None,
            kind: String::new(),
            data: String::new(),
        }
    }

    #[test]
    fn events_are_read_across_chunks_with_comments_and_either_line_ending() {
        let mut s = stream();
        s.buf.push_str(":\n\nid: 7.1\r\nevent: run.started\r\ndata: {\"run\":");
        assert!(s.take_event().is_none(), "half an event is not an event");
        s.buf.push_str("\"run-a\",\"seq\":1}\r\n\r\nid: 7.2\nevent: step.created\ndata: {\"seq\":\ndata: 2}\n\n");
        let first = s.take_event().unwrap();
        assert_eq!(first.kind, "run.started");
        assert_eq!(first.data["run"], "run-a");
        assert_eq!(s.last_id.as_deref(), Some("7.1"));
        let second = s.take_event().unwrap();
        assert_eq!(second.kind, "step.created");
        assert_eq!(second.data["seq"], 2, "data lines are joined with a newline");
        assert_eq!(s.last_id.as_deref(), Some("7.2"), "a reconnect resumes after the last event seen");
        assert!(s.take_event().is_none());
    }
}
