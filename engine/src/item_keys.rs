//! An item's key, its content hash and a trigger event's dedup key. They must not change
//! between releases: a key written today is compared with one computed next year. Read by
//! ingest (`triggers`), the store's trigger writes and schedules, and the GitHub watches.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Keys that hold timestamps, left out of the content hash: a timestamp moves without the item
/// changing in a way a workflow cares about (GitHub bumps `updated_at` for many reasons).
const TIMESTAMP_KEYS: [&str; 14] = [
    "created_at",
    "updated_at",
    "closed_at",
    "merged_at",
    "submitted_at",
    "pushed_at",
    "started_at",
    "completed_at",
    "createdAt",
    "updatedAt",
    "closedAt",
    "mergedAt",
    "submittedAt",
    "pushedAt",
];

/// JSON with object keys sorted and no whitespace; `strip_timestamps` leaves out
/// [`TIMESTAMP_KEYS`] at every depth.
pub fn canonical_json(value: &Value, strip_timestamps: bool) -> String {
    let mut out = String::new();
    write_canonical(value, strip_timestamps, &mut out);
    out
}

fn write_canonical(value: &Value, strip: bool, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().filter(|k| !(strip && TIMESTAMP_KEYS.contains(&k.as_str()))).collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key.as_str()], strip, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, strip, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// SHA-256 (lowercase hex) of the item's canonical JSON without timestamps.
pub fn content_hash(item: &Value) -> String {
    hex(&Sha256::digest(canonical_json(item, true).as_bytes()))
}

/// An item's key: `["github","owner/name",number]`, or `["github","owner/name"]` for the
/// repository itself, as canonical JSON with the repository lowercased.
pub fn item_key(repository: &str, number: Option<i64>) -> String {
    let repository = repository.to_lowercase();
    let key = match number {
        Some(n) => serde_json::json!(["github", repository, n]),
        None => serde_json::json!(["github", repository]),
    };
    canonical_json(&key, false)
}

/// A trigger event's dedup key: `[workflow, repository, number, content_hash]`, plus the
/// item's cycle generation once it is above zero (so a reset lets the same content act again).
/// A repository item has `null` for its number.
pub fn dedup_key(workflow: &str, repository: &str, number: Option<i64>, content_hash: &str, generation: i32) -> String {
    let mut key = vec![Value::from(workflow), Value::from(repository.to_lowercase()), number.map_or(Value::Null, Value::from), Value::from(content_hash)];
    if generation > 0 {
        key.push(Value::from(generation));
    }
    canonical_json(&Value::Array(key), false)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let a = json!({ "b": 1, "a": { "z": [3, { "y": 1, "x": 2 }], "c": "é\"" } });
        assert_eq!(canonical_json(&a, false), r#"{"a":{"c":"é\"","z":[3,{"x":2,"y":1}]},"b":1}"#);
    }

    #[test]
    fn the_content_hash_ignores_timestamps_and_key_order() {
        let a = json!({ "title": "t", "labels": ["x"], "updated_at": "2024-01-01T00:00:00Z", "head": { "sha": "abc", "pushed_at": "x" } });
        let b = json!({ "head": { "sha": "abc" }, "labels": ["x"], "title": "t", "updated_at": "2025-05-05T00:00:00Z", "closed_at": null });
        assert_eq!(content_hash(&a), content_hash(&b));
        let c = json!({ "title": "t", "labels": ["x", "y"] });
        assert_ne!(content_hash(&a), content_hash(&c));
        assert_eq!(content_hash(&a).len(), 64);
    }

    #[test]
    fn keys_are_canonical_and_lowercase_the_repository() {
        assert_eq!(item_key("Acme/Widgets", Some(42)), r#"["github","acme/widgets",42]"#);
        assert_eq!(item_key("acme/widgets", None), r#"["github","acme/widgets"]"#);
        assert_eq!(dedup_key("fix", "Acme/W", Some(7), "ab", 0), r#"["fix","acme/w",7,"ab"]"#);
        assert_eq!(dedup_key("fix", "acme/w", Some(7), "ab", 2), r#"["fix","acme/w",7,"ab",2]"#);
        assert_eq!(dedup_key("nightly", "acme/w", None, "ab", 0), r#"["nightly","acme/w",null,"ab"]"#);
    }
}
