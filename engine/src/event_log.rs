//! The event log: each run event, once its change has committed, shaped as an OpenTelemetry log
//! record with a fixed key list ([`KEYS`]).
//!
//! An [`EventRecord`] is made only by [`EventRecord::new`], which refuses a key outside the
//! list and a string longer than [`MAX_STRING`] characters, and holds every key of the list,
//! null where the event has no value for it. The store hands committed events to [`emit`]
//! (`Change::commit`, after the transaction, never inside it); the process that exports
//! telemetry installs the [`set_sink`] that turns records into OpenTelemetry log records
//! (`api::telemetry`). Without a sink nothing is built at all.
//!
//! Nothing secret goes in: ids, node names, counts, figures, model names and git refs.

use std::sync::OnceLock;

use serde_json::{Map, Value as Json, json};

use crate::ids::{OrgId, ProjectId, RunId};

/// Every key a record has, in this order.
pub const KEYS: [&str; 16] = [
    "shopfloor.org",
    "shopfloor.project",
    "shopfloor.run.id",
    "shopfloor.node",
    "shopfloor.attempt",
    "shopfloor.outcome",
    "shopfloor.outcome.reason",
    "shopfloor.workflow.version",
    "shopfloor.duration_ms",
    "shopfloor.cost.usd",
    "gen_ai.request.model",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "vcs.repository.url.full",
    "vcs.ref.head.name",
    "vcs.ref.head.revision",
];

/// The longest string value a record takes, in characters.
pub const MAX_STRING: usize = 500;

/// The key whose value is rounded to six decimals.
const COST_KEY: &str = "shopfloor.cost.usd";

/// A value of a record's key.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Double(f64),
}

impl Value {
    fn to_json(&self) -> Json {
        match self {
            Value::Str(s) => json!(s),
            Value::Int(i) => json!(i),
            Value::Double(d) => json!(d),
        }
    }
}

/// Why a record was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("`{0}` is not a key of the event log")]
    UnknownKey(String),
    #[error("`{key}` is {chars} characters long; at most {MAX_STRING}")]
    TooLong { key: &'static str, chars: usize },
    #[error("`{0}` is given twice")]
    Duplicate(&'static str),
}

/// One run event as a log record: its name (the event's kind, `step.succeeded`), every key of
/// [`KEYS`] with its value or null, and the trace context of its run.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord {
    name: String,
    values: [Option<Value>; KEYS.len()],
    traceparent: Option<String>,
}

impl EventRecord {
    /// A record of the event `name` with the given keys; the others are null.
    ///
    /// # Errors
    /// A key outside [`KEYS`], a key given twice, or a string (the name included) over
    /// [`MAX_STRING`] characters.
    pub fn new<'a>(name: &str, pairs: impl IntoIterator<Item = (&'a str, Value)>) -> Result<EventRecord, RecordError> {
        let chars = name.chars().count();
        if chars > MAX_STRING {
            return Err(RecordError::TooLong { key: "name", chars });
        }
        let mut values: [Option<Value>; KEYS.len()] = Default::default();
        for (key, value) in pairs {
            let i = KEYS.iter().position(|k| *k == key).ok_or_else(|| RecordError::UnknownKey(key.chars().take(80).collect()))?;
            let key = KEYS[i];
            if values[i].is_some() {
                return Err(RecordError::Duplicate(key));
            }
            let value = match value {
                Value::Str(s) => {
                    let chars = s.chars().count();
                    if chars > MAX_STRING {
                        return Err(RecordError::TooLong { key, chars });
                    }
                    Value::Str(s)
                }
                Value::Double(d) if key == COST_KEY => Value::Double((d * 1e6).round() / 1e6),
                Value::Int(i) if key == COST_KEY => Value::Double(i as f64),
                other => other,
            };
            values[i] = Some(value);
        }
        Ok(EventRecord { name: name.to_owned(), values, traceparent: None })
    }

    /// The trace context (W3C `traceparent`) of the record's run, when it has one.
    #[must_use]
    pub fn with_traceparent(mut self, traceparent: Option<&str>) -> EventRecord {
        self.traceparent = traceparent.map(str::to_owned);
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }

    /// The value of `key`; `None` for null or a key outside the list.
    pub fn get(&self, key: &str) -> Option<&Value> {
        KEYS.iter().position(|k| *k == key).and_then(|i| self.values[i].as_ref())
    }

    /// Every key of the list, in order, with its value or null.
    pub fn pairs(&self) -> impl Iterator<Item = (&'static str, Option<&Value>)> + '_ {
        KEYS.iter().copied().zip(self.values.iter().map(Option::as_ref))
    }

    /// The record as a JSON object: every key, `null` where there is no value.
    pub fn to_json(&self) -> Json {
        let mut m = Map::new();
        for (k, v) in self.pairs() {
            m.insert(k.to_owned(), v.map_or(Json::Null, Value::to_json));
        }
        Json::Object(m)
    }
}

/// What the store knows of a committed run event.
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    pub org: OrgId,
    pub project: ProjectId,
    pub run: RunId,
    pub kind: &'a str,
    pub node: Option<&'a str>,
    pub attrs: &'a Json,
    pub workflow_version: Option<i32>,
    pub traceparent: Option<&'a str>,
    /// Facts of the event that its stored attributes do not carry.
    pub extra: &'a Extra,
}

/// Facts of an event known when it is written but not stored with it: how long the step or run
/// took, and the git refs a step's output names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Extra {
    pub duration_ms: Option<i64>,
    pub repository_url: Option<String>,
    pub branch: Option<String>,
    pub revision: Option<String>,
}

impl Extra {
    /// The git facts a step's output names (`repository`, `branch`, `head_sha`, or a pull
    /// request's `head`), if any.
    pub fn from_output(output: &Json) -> Extra {
        let text = |v: Option<&Json>| v.and_then(Json::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
        let repository = text(output.get("repository")).or_else(|| text(output.pointer("/pull_request/repository")));
        Extra {
            duration_ms: None,
            repository_url: repository.map(|r| if r.contains("://") { r } else { format!("https://github.com/{r}") }),
            branch: text(output.get("branch")).or_else(|| text(output.pointer("/pull_request/branch"))),
            revision: text(output.get("head_sha")).or_else(|| text(output.pointer("/pull_request/head_sha"))),
        }
    }
}

/// Truncates to [`MAX_STRING`] characters: what the store wrote may be longer than a record
/// takes, and a record is better cut than lost.
fn fit(s: &str) -> Value {
    Value::Str(s.chars().take(MAX_STRING).collect())
}

impl EventRecord {
    /// The record of a committed run event.
    ///
    /// # Errors
    /// None in practice: every value is fitted to the record's rules first.
    pub fn of_event(e: &Event<'_>) -> Result<EventRecord, RecordError> {
        let a = e.attrs;
        let mut pairs: Vec<(&str, Value)> = vec![
            ("shopfloor.org", Value::Str(e.org.to_string())),
            ("shopfloor.project", Value::Str(e.project.to_string())),
            ("shopfloor.run.id", Value::Str(e.run.to_string())),
        ];
        if let Some(node) = e.node {
            pairs.push(("shopfloor.node", fit(node)));
        }
        if let Some(attempt) = a.get("attempt").and_then(Json::as_i64) {
            pairs.push(("shopfloor.attempt", Value::Int(attempt)));
        }
        if let Some((_, outcome)) = e.kind.split_once('.') {
            pairs.push(("shopfloor.outcome", fit(outcome)));
        }
        if let Some(reason) = a.get("reason").and_then(Json::as_str) {
            pairs.push(("shopfloor.outcome.reason", fit(reason)));
        }
        if let Some(v) = e.workflow_version.or_else(|| a.get("version").and_then(Json::as_i64).and_then(|v| i32::try_from(v).ok())) {
            pairs.push(("shopfloor.workflow.version", Value::Int(i64::from(v))));
        }
        if let Some(ms) = e.extra.duration_ms {
            pairs.push(("shopfloor.duration_ms", Value::Int(ms)));
        }
        if let Some(usd) = a.get("cost_usd").and_then(Json::as_f64) {
            pairs.push(("shopfloor.cost.usd", Value::Double(usd)));
        }
        if let Some(model) = a.get("model").and_then(Json::as_str) {
            pairs.push(("gen_ai.request.model", fit(model)));
        }
        if let Some(n) = a.get("input_tokens").and_then(Json::as_i64) {
            pairs.push(("gen_ai.usage.input_tokens", Value::Int(n)));
        }
        if let Some(n) = a.get("output_tokens").and_then(Json::as_i64) {
            pairs.push(("gen_ai.usage.output_tokens", Value::Int(n)));
        }
        if let Some(url) = &e.extra.repository_url {
            pairs.push(("vcs.repository.url.full", fit(url)));
        }
        if let Some(branch) = &e.extra.branch {
            pairs.push(("vcs.ref.head.name", fit(branch)));
        }
        if let Some(sha) = &e.extra.revision {
            pairs.push(("vcs.ref.head.revision", fit(sha)));
        }
        let name: String = e.kind.chars().take(MAX_STRING).collect();
        Ok(EventRecord::new(&name, pairs)?.with_traceparent(e.traceparent))
    }
}

/// Where records go: installed once by the process that exports telemetry.
pub type Sink = Box<dyn Fn(&EventRecord) + Send + Sync>;

static SINK: OnceLock<Sink> = OnceLock::new();

/// Installs the sink records go to; a second call is ignored (returns false).
pub fn set_sink(sink: Sink) -> bool {
    SINK.set(sink).is_ok()
}

/// Whether a sink is installed: without one, the store builds no record.
pub fn enabled() -> bool {
    SINK.get().is_some()
}

/// Hands committed events to the sink, if there is one.
pub fn emit<'a>(events: impl IntoIterator<Item = Event<'a>>) {
    let Some(sink) = SINK.get() else { return };
    for e in events {
        match EventRecord::of_event(&e) {
            Ok(record) => sink(&record),
            Err(err) => tracing::warn!(run.id = %e.run, event = e.kind, error = %err, "run event not logged"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_is_present_null_when_absent() {
        let r = EventRecord::new("step.succeeded", [("shopfloor.node", Value::Str("build".into())), ("shopfloor.attempt", Value::Int(2))]).unwrap();
        let j = r.to_json();
        let obj = j.as_object().unwrap();
        assert_eq!(obj.len(), KEYS.len());
        for key in KEYS {
            assert!(obj.contains_key(key), "{key} missing");
        }
        assert_eq!(obj["shopfloor.node"], json!("build"));
        assert_eq!(obj["shopfloor.attempt"], json!(2));
        assert_eq!(obj["shopfloor.org"], Json::Null);
        assert_eq!(r.pairs().filter(|(_, v)| v.is_none()).count(), KEYS.len() - 2);
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = EventRecord::new("step.succeeded", [("shopfloor.secret", Value::Str("x".into()))]).unwrap_err();
        assert_eq!(err, RecordError::UnknownKey("shopfloor.secret".into()));
        assert!(EventRecord::new("x", [("gen_ai.usage.input_tokens", Value::Int(1)), ("token", Value::Int(1))]).is_err());
    }

    #[test]
    fn long_strings_are_refused_and_500_is_accepted() {
        let ok = "a".repeat(500);
        assert!(EventRecord::new("x", [("shopfloor.outcome.reason", Value::Str(ok))]).is_ok());
        // Characters, not bytes: 500 two-byte characters are fine.
        assert!(EventRecord::new("x", [("shopfloor.outcome.reason", Value::Str("é".repeat(500)))]).is_ok());
        let err = EventRecord::new("x", [("shopfloor.outcome.reason", Value::Str("a".repeat(501)))]).unwrap_err();
        assert_eq!(err, RecordError::TooLong { key: "shopfloor.outcome.reason", chars: 501 });
        assert!(EventRecord::new(&"n".repeat(501), []).is_err());
    }

    #[test]
    fn a_key_given_twice_is_refused() {
        let err = EventRecord::new("x", [("shopfloor.node", Value::Str("a".into())), ("shopfloor.node", Value::Str("b".into()))]).unwrap_err();
        assert_eq!(err, RecordError::Duplicate("shopfloor.node"));
    }

    #[test]
    fn cost_has_six_decimals() {
        let r = EventRecord::new("x", [("shopfloor.cost.usd", Value::Double(0.123_456_789))]).unwrap();
        assert_eq!(r.get("shopfloor.cost.usd"), Some(&Value::Double(0.123_457)));
    }

    #[test]
    fn a_session_event_maps_to_gen_ai_keys() {
        let attrs = json!({ "model": "claude-x", "cost_usd": 1.5, "input_tokens": 10, "output_tokens": 20, "host": "host-1", "attempt": 1 });
        let extra =
            Extra { duration_ms: Some(1200), ..Extra::from_output(&json!({ "branch": "shopfloor/1-x", "head_sha": "abc", "repository": "acme/widgets" })) };
        let e = Event {
            org: OrgId(uuid::Uuid::nil()),
            project: ProjectId(uuid::Uuid::nil()),
            run: RunId(uuid::Uuid::nil()),
            kind: "step.session",
            node: Some("code"),
            attrs: &attrs,
            workflow_version: Some(3),
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            extra: &extra,
        };
        let r = EventRecord::of_event(&e).unwrap();
        assert_eq!(r.name(), "step.session");
        assert_eq!(r.get("gen_ai.request.model"), Some(&Value::Str("claude-x".into())));
        assert_eq!(r.get("gen_ai.usage.output_tokens"), Some(&Value::Int(20)));
        assert_eq!(r.get("shopfloor.outcome"), Some(&Value::Str("session".into())));
        assert_eq!(r.get("shopfloor.workflow.version"), Some(&Value::Int(3)));
        assert_eq!(r.get("shopfloor.duration_ms"), Some(&Value::Int(1200)));
        assert_eq!(r.get("vcs.repository.url.full"), Some(&Value::Str("https://github.com/acme/widgets".into())));
        assert_eq!(r.get("vcs.ref.head.name"), Some(&Value::Str("shopfloor/1-x".into())));
        assert_eq!(r.get("vcs.ref.head.revision"), Some(&Value::Str("abc".into())));
        assert!(r.traceparent().is_some());
        // The host id is not a key: it is simply not carried.
        assert!(r.to_json().get("host").is_none());
    }

    #[test]
    fn long_stored_reasons_are_cut_to_fit() {
        let attrs = json!({ "reason": "r".repeat(800) });
        let extra = Extra::default();
        let e = Event {
            org: OrgId(uuid::Uuid::nil()),
            project: ProjectId(uuid::Uuid::nil()),
            run: RunId(uuid::Uuid::nil()),
            kind: "run.failed",
            node: None,
            attrs: &attrs,
            workflow_version: None,
            traceparent: None,
            extra: &extra,
        };
        let r = EventRecord::of_event(&e).unwrap();
        assert_eq!(r.get("shopfloor.outcome.reason"), Some(&Value::Str("r".repeat(500))));
        assert_eq!(r.get("shopfloor.node"), None);
    }
}
