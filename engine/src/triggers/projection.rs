//! The item projection: what shopfloor keeps of an issue, a pull request or a repository.
//!
//! A webhook payload carries the whole issue or pull request, so most deliveries replace the
//! fields they know; a few add to what is stored (the latest comment or review, one check's
//! result, the board card), since no single payload carries everything. The projection is what
//! `if:` conditions and prompts read as `item`, and what the content hash is computed over.
//!
//! Text that reaches a prompt (bodies, comments, reviews) has hidden HTML comments removed
//! (what reaches the agent): an issue author can hide instructions to the agent in
//! `<!-- … -->`, which GitHub does not show to the people reading the issue.
//!
//! Shape (keys absent when unknown):
//!
//! ```text
//! kind            "issue" | "pull_request" | "repository"
//! repository      "owner/name", lowercased
//! number, title, body, state ("open"|"closed"), state_reason, url, locked
//! labels          label names, sorted       assignees   logins, sorted
//! author, author_association, milestone
//! draft, merged, head {ref, sha}, base {ref}, requested_reviewers     (pull requests)
//! comment         {id, author, author_association, body}   the latest comment
//! review          {id, author, author_association, state, body}   the latest review
//! checks          {name: {status, conclusion}} for the head SHA     (pull requests)
//! board           {project, card, column, fields {name: value}, archived}   (Projects v2)
//! ref, head_sha, default_branch                                     (repository, on push)
//! created_at, updated_at, closed_at, merged_at   (not part of the content hash)
//! ```

use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};

/// Removes `<!-- … -->` comments. An unterminated comment hides the rest of the text, as
/// GitHub renders it, so the rest is removed too.
pub fn strip_hidden_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("<!--") {
        out.push_str(&rest[..start]);
        match rest[start + 4..].find("-->") {
            Some(end) => rest = &rest[start + 4 + end + 3..],
            None => {
                rest = "";
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A change a delivery makes to one item's stored projection.
#[derive(Debug, Clone, PartialEq)]
pub enum Patch {
    /// Fields read from a whole issue, pull request or push: they replace the stored ones.
    Fields(Map<String, Value>),
    /// The latest comment or review (`comment` / `review`).
    Latest { key: &'static str, value: Value },
    /// A comment or review was deleted: forget it if it is the stored latest one.
    Deleted { key: &'static str, id: i64 },
    /// One check's result on the head SHA it was reported for.
    Check { head_sha: String, name: String, status: String, conclusion: Option<String> },
    /// The item's Projects v2 card, with the field a move or an edit set (`Status` is the
    /// board column).
    Board { project: String, card: String, field: Option<(String, Value)> },
    /// The card was archived: it is in no column until restored, when its `Status` field puts
    /// it back in its column (the `restored` payload names no field).
    BoardArchived { card: String },
    /// The card left the board.
    BoardRemoved { card: String },
}

/// What a delivery says about one issue, pull request or repository.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemUpdate {
    /// `owner/name`, lowercased.
    pub repository: String,
    /// None for the repository item (a push).
    pub number: Option<i64>,
    pub node_id: Option<String>,
    /// The payload's `updated_at`: an older delivery (GitHub does not promise order) does not
    /// overwrite a newer projection.
    pub updated_at: Option<DateTime<Utc>>,
    pub patches: Vec<Patch>,
}

impl ItemUpdate {
    pub fn key(&self) -> String {
        super::item_key(&self.repository, self.number)
    }
}

/// An issue's or a pull request's comment event: a deleted comment leaves the item, any other
/// action makes it the latest.
fn comment_patch(action: &str, comment: &Value) -> Patch {
    match action {
        "deleted" => Patch::Deleted { key: "comment", id: int(comment, "id") },
        _ => Patch::Latest { key: "comment", value: comment_fields(comment) },
    }
}

/// The item a delivery of `event` is about, when it is about one issue, pull request or
/// repository. Check events and board moves name their items indirectly (by head SHA, by
/// node id); `ingest` finds those.
pub fn item_update(event: &str, payload: &Value) -> Option<ItemUpdate> {
    let repository = repository_name(payload)?;
    let action = payload.get("action").and_then(Value::as_str).unwrap_or_default();
    match event {
        "issues" => {
            let issue = payload.get("issue")?;
            update_from(repository, issue, vec![Patch::Fields(issue_fields(issue))])
        }
        "issue_comment" => {
            let issue = payload.get("issue")?;
            let comment = comment_patch(action, payload.get("comment")?);
            update_from(repository, issue, vec![Patch::Fields(issue_fields(issue)), comment])
        }
        "pull_request" => {
            let pr = payload.get("pull_request")?;
            update_from(repository, pr, vec![Patch::Fields(pull_request_fields(pr))])
        }
        "pull_request_review" => {
            let pr = payload.get("pull_request")?;
            let review = payload.get("review")?;
            // Submitted, edited or dismissed: the review's current state is the latest word.
            let latest = Patch::Latest { key: "review", value: review_fields(review) };
            update_from(repository, pr, vec![Patch::Fields(pull_request_fields(pr)), latest])
        }
        "pull_request_review_comment" => {
            let pr = payload.get("pull_request")?;
            let comment = comment_patch(action, payload.get("comment")?);
            update_from(repository, pr, vec![Patch::Fields(pull_request_fields(pr)), comment])
        }
        // A push that deleted its branch or tag has no head to build: it changes nothing and
        // starts nothing (GitHub Actions runs no push workflow for it either).
        "push" if payload.get("deleted").and_then(Value::as_bool) == Some(true) => None,
        "push" => {
            let repo = payload.get("repository")?;
            let mut fields = Map::new();
            fields.insert("kind".into(), json!("repository"));
            fields.insert("repository".into(), json!(repository));
            fields.insert("ref".into(), payload.get("ref").cloned().unwrap_or(Value::Null));
            fields.insert("head_sha".into(), payload.get("after").cloned().unwrap_or(Value::Null));
            fields.insert("default_branch".into(), repo.get("default_branch").cloned().unwrap_or(Value::Null));
            fields.insert("url".into(), repo.get("html_url").cloned().unwrap_or(Value::Null));
            Some(ItemUpdate {
                repository,
                number: None,
                node_id: repo.get("node_id").and_then(Value::as_str).map(str::to_owned),
                updated_at: None,
                patches: vec![Patch::Fields(fields)],
            })
        }
        _ => None,
    }
}

/// The update of the issue or pull request `object`; none without its number (which GitHub
/// always sends), so that it is never taken for the repository's own item.
fn update_from(repository: String, object: &Value, patches: Vec<Patch>) -> Option<ItemUpdate> {
    Some(ItemUpdate {
        repository,
        number: Some(object.get("number").and_then(Value::as_i64)?),
        node_id: object.get("node_id").and_then(Value::as_str).map(str::to_owned),
        updated_at: object.get("updated_at").and_then(Value::as_str).and_then(|t| t.parse().ok()),
        patches,
    })
}

/// `repository.full_name`, lowercased.
pub fn repository_name(payload: &Value) -> Option<String> {
    payload.pointer("/repository/full_name").and_then(Value::as_str).map(str::to_lowercase)
}

fn int(v: &Value, key: &str) -> i64 {
    v.get(key).and_then(Value::as_i64).unwrap_or_default()
}

fn login(v: Option<&Value>) -> Value {
    v.and_then(|u| u.get("login")).cloned().unwrap_or(Value::Null)
}

fn sorted_strings(list: Option<&Value>, key: &str) -> Value {
    let mut names: Vec<String> = list
        .and_then(Value::as_array)
        .map(|items| items.iter().filter_map(|i| i.get(key).and_then(Value::as_str)).map(str::to_owned).collect())
        .unwrap_or_default();
    names.sort();
    names.dedup();
    json!(names)
}

fn text(v: Option<&Value>) -> Value {
    match v.and_then(Value::as_str) {
        Some(t) => json!(strip_hidden_comments(t)),
        None => Value::Null,
    }
}

fn copy(from: &Value, to: &mut Map<String, Value>, keys: &[&str]) {
    for key in keys {
        to.insert((*key).to_owned(), from.get(*key).cloned().unwrap_or(Value::Null));
    }
}

/// An issue's fields (an `issue` object; one with a `pull_request` key is a pull request seen
/// through the issues API, which lacks the branch fields: those stay as stored).
pub fn issue_fields(issue: &Value) -> Map<String, Value> {
    let mut f = Map::new();
    let is_pr = issue.get("pull_request").is_some_and(|p| !p.is_null());
    f.insert("kind".into(), json!(if is_pr { "pull_request" } else { "issue" }));
    common_fields(issue, &mut f);
    f
}

/// A pull request's fields.
pub fn pull_request_fields(pr: &Value) -> Map<String, Value> {
    let mut f = Map::new();
    f.insert("kind".into(), json!("pull_request"));
    common_fields(pr, &mut f);
    copy(pr, &mut f, &["draft", "merged", "merged_at"]);
    if f.get("merged").is_some_and(Value::is_null) {
        // `merged` is absent from some PR shapes; `merged_at` says it as well.
        let merged = pr.get("merged_at").is_some_and(|m| !m.is_null());
        f.insert("merged".into(), json!(merged));
    }
    f.insert(
        "head".into(),
        json!({ "ref": pr.pointer("/head/ref"), "sha": pr.pointer("/head/sha"), "repository": pr.pointer("/head/repo/full_name").and_then(Value::as_str).map(str::to_lowercase) }),
    );
    f.insert("base".into(), json!({ "ref": pr.pointer("/base/ref") }));
    f.insert("requested_reviewers".into(), sorted_strings(pr.get("requested_reviewers"), "login"));
    f
}

fn common_fields(object: &Value, f: &mut Map<String, Value>) {
    copy(object, f, &["number", "title", "state", "state_reason", "locked", "author_association", "created_at", "updated_at", "closed_at"]);
    f.insert("url".into(), object.get("html_url").cloned().unwrap_or(Value::Null));
    f.insert("body".into(), text(object.get("body")));
    f.insert("author".into(), login(object.get("user")));
    f.insert("labels".into(), sorted_strings(object.get("labels"), "name"));
    f.insert("assignees".into(), sorted_strings(object.get("assignees"), "login"));
    f.insert("milestone".into(), object.pointer("/milestone/title").cloned().unwrap_or(Value::Null));
}

/// A comment's fields, with hidden comments stripped from its body.
pub fn comment_fields(comment: &Value) -> Value {
    json!({
        "id": comment.get("id"),
        "author": login(comment.get("user")),
        "author_association": comment.get("author_association"),
        "body": text(comment.get("body")),
        "url": comment.get("html_url"),
    })
}

/// A review's fields.
pub fn review_fields(review: &Value) -> Value {
    json!({
        "id": review.get("id"),
        "author": login(review.get("user")),
        "author_association": review.get("author_association"),
        "state": review.get("state").and_then(Value::as_str).map(str::to_lowercase),
        "body": text(review.get("body")),
    })
}

/// Applies a delivery's patches to the stored projection (`Value::Null` for a new item).
/// Returns `None` when the delivery is older than what is stored and must not overwrite it.
pub fn apply(stored: &Value, update: &ItemUpdate) -> Option<Value> {
    let mut data = match stored {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    if let (Some(new), Some(old)) = (update.updated_at, data.get("updated_at").and_then(Value::as_str).and_then(|t| t.parse::<DateTime<Utc>>().ok())) {
        if new < old {
            return None;
        }
    }
    data.insert("repository".into(), json!(update.repository));
    if let Some(n) = update.number {
        data.insert("number".into(), json!(n));
    }
    for patch in &update.patches {
        match patch {
            Patch::Fields(fields) => {
                let old_head = data.get("head").and_then(|h| h.get("sha")).cloned();
                for (k, v) in fields {
                    data.insert(k.clone(), v.clone());
                }
                // Check results belong to a commit: a new head starts with none.
                let new_head = data.get("head").and_then(|h| h.get("sha")).cloned();
                if old_head.is_some() && new_head != old_head {
                    data.remove("checks");
                }
            }
            Patch::Latest { key, value } => {
                data.insert((*key).to_owned(), value.clone());
            }
            Patch::Deleted { key, id } => {
                if data.get(*key).and_then(|c| c.get("id")).and_then(Value::as_i64) == Some(*id) {
                    data.insert((*key).to_owned(), Value::Null);
                }
            }
            Patch::Check { head_sha, name, status, conclusion } => {
                let head = data.get("head").and_then(|h| h.get("sha")).and_then(Value::as_str);
                if head.is_some_and(|h| h != head_sha) {
                    continue;
                }
                let checks = data.entry("checks").or_insert_with(|| json!({}));
                if !checks.is_object() {
                    *checks = json!({});
                }
                if let Some(map) = checks.as_object_mut() {
                    map.insert(name.clone(), json!({ "status": status, "conclusion": conclusion }));
                }
            }
            Patch::Board { project, card, field } => {
                let mut board = match data.remove("board") {
                    Some(Value::Object(b)) if b.get("card").and_then(Value::as_str) == Some(card.as_str()) => b,
                    _ => Map::new(),
                };
                board.insert("project".into(), json!(project));
                board.insert("card".into(), json!(card));
                let fields = board.entry("fields").or_insert_with(|| json!({}));
                if let (Some((name, value)), Some(fields)) = (field, fields.as_object_mut()) {
                    fields.insert(name.clone(), value.clone());
                }
                let column = fields.as_object().and_then(|f| f.iter().find(|(n, _)| n.eq_ignore_ascii_case("status"))).map(|(_, v)| v.clone());
                board.insert("column".into(), column.unwrap_or(Value::Null));
                board.insert("archived".into(), json!(false));
                data.insert("board".into(), Value::Object(board));
            }
            // Another card of the item's (on another board) leaves the stored one as it is.
            Patch::BoardArchived { card } => {
                if let Some(board) = data.get_mut("board").and_then(Value::as_object_mut).filter(|b| b.get("card") == Some(&json!(card))) {
                    board.insert("column".into(), Value::Null);
                    board.insert("archived".into(), json!(true));
                }
            }
            Patch::BoardRemoved { card } => {
                if data.get("board").and_then(|b| b.get("card")) == Some(&json!(card)) {
                    data.insert("board".into(), Value::Null);
                }
            }
        }
    }
    Some(Value::Object(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issue(labels: &[&str], body: &str, updated: &str) -> Value {
        json!({
            "action": "labeled",
            "issue": {
                "number": 7, "node_id": "I_7", "title": "Fix it", "body": body, "state": "open",
                "user": { "login": "alice", "type": "User" }, "author_association": "MEMBER",
                "labels": labels.iter().map(|l| json!({ "name": l })).collect::<Vec<_>>(),
                "assignees": [], "html_url": "https://github.com/Acme/W/issues/7",
                "created_at": "2024-01-01T00:00:00Z", "updated_at": updated,
            },
            "repository": { "full_name": "Acme/W" },
        })
    }

    #[test]
    fn an_issue_without_a_whole_number_is_no_item() {
        let mut payload = issue(&["ready"], "", "2024-01-01T00:00:00Z");
        assert_eq!(item_update("issues", &payload).map(|u| u.key()).as_deref(), Some(r#"["github","acme/w",7]"#));
        for number in [Value::Null, json!(7.5), json!("7")] {
            payload["issue"]["number"] = number.clone();
            assert_eq!(item_update("issues", &payload), None, "{number}");
        }
        payload["issue"].as_object_mut().unwrap().remove("number");
        assert_eq!(item_update("issues", &payload), None);
    }

    #[test]
    fn a_push_that_deletes_a_ref_is_no_update() {
        let repo = json!({ "full_name": "Acme/Widgets", "default_branch": "main", "node_id": "R_1" });
        let pushed = json!({ "ref": "refs/heads/main", "after": "a1b2", "deleted": false, "repository": repo });
        let update = item_update("push", &pushed).expect("a push updates the repository's item");
        assert_eq!(
            update.patches,
            vec![Patch::Fields(
                serde_json::from_value(json!({
                    "kind": "repository", "repository": "acme/widgets", "ref": "refs/heads/main", "head_sha": "a1b2",
                    "default_branch": "main", "url": null,
                }))
                .unwrap()
            )]
        );
        let deleted = json!({ "ref": "refs/tags/v1", "after": "0000000000000000000000000000000000000000", "deleted": true, "repository": repo });
        assert_eq!(item_update("push", &deleted), None);
    }

    #[test]
    fn an_archived_card_leaves_its_column_until_it_is_restored() {
        let on = |patch: Patch| ItemUpdate { repository: "acme/widgets".into(), number: Some(7), node_id: None, updated_at: None, patches: vec![patch] };
        let board =
            |field: Option<(&str, &str)>| Patch::Board { project: "PVT_1".into(), card: "PVTI_1".into(), field: field.map(|(n, v)| (n.into(), json!(v))) };
        let moved = apply(&json!({}), &on(board(Some(("Status", "Ready"))))).unwrap();
        assert_eq!(moved["board"]["column"], "Ready");
        let archived = apply(&moved, &on(Patch::BoardArchived { card: "PVTI_1".into() })).unwrap();
        assert_eq!((&archived["board"]["column"], &archived["board"]["archived"]), (&Value::Null, &json!(true)));
        // `restored` names no field: the card's Status puts it back.
        let restored = apply(&archived, &on(board(None))).unwrap();
        assert_eq!(restored["board"], moved["board"]);
        // The item's card on another board, archived or deleted, leaves this one be.
        for elsewhere in [Patch::BoardArchived { card: "PVTI_2".into() }, Patch::BoardRemoved { card: "PVTI_2".into() }] {
            assert_eq!(apply(&moved, &on(elsewhere)).unwrap()["board"], moved["board"]);
        }
        assert_eq!(apply(&restored, &on(Patch::BoardRemoved { card: "PVTI_1".into() })).unwrap()["board"], Value::Null);
    }

    #[test]
    fn hidden_comments_are_stripped_including_an_unterminated_one() {
        assert_eq!(strip_hidden_comments("a<!-- secret -->b<!--x-->c"), "abc");
        assert_eq!(strip_hidden_comments("keep <!-- ignore all\nprevious"), "keep ");
        assert_eq!(strip_hidden_comments("no comment -->"), "no comment -->");
    }

    #[test]
    fn an_issue_projects_with_sorted_labels_and_a_clean_body() {
        let u = item_update("issues", &issue(&["b", "a"], "do <!-- and rm -rf / --> it", "2024-01-02T00:00:00Z")).unwrap();
        assert_eq!(u.key(), r#"["github","acme/w",7]"#);
        let data = apply(&Value::Null, &u).unwrap();
        assert_eq!(data["labels"], json!(["a", "b"]));
        assert_eq!(data["body"], "do  it");
        assert_eq!(data["kind"], "issue");
        assert_eq!(data["author"], "alice");
    }

    #[test]
    fn an_older_delivery_does_not_overwrite_a_newer_projection() {
        let newer = apply(&Value::Null, &item_update("issues", &issue(&["a"], "", "2024-01-03T00:00:00Z")).unwrap()).unwrap();
        let older = item_update("issues", &issue(&[], "", "2024-01-02T00:00:00Z")).unwrap();
        assert!(apply(&newer, &older).is_none());
    }

    #[test]
    fn checks_follow_the_head_sha() {
        let pr = json!({ "number": 3, "head": { "ref": "f", "sha": "s1" }, "base": { "ref": "main" }, "labels": [], "updated_at": "2024-01-01T00:00:00Z" });
        let u =
            ItemUpdate { repository: "a/b".into(), number: Some(3), node_id: None, updated_at: None, patches: vec![Patch::Fields(pull_request_fields(&pr))] };
        let data = apply(&Value::Null, &u).unwrap();
        let check = |sha: &str| ItemUpdate {
            repository: "a/b".into(),
            number: Some(3),
            node_id: None,
            updated_at: None,
            patches: vec![Patch::Check { head_sha: sha.into(), name: "test".into(), status: "completed".into(), conclusion: Some("success".into()) }],
        };
        let data = apply(&data, &check("s1")).unwrap();
        assert_eq!(data["checks"]["test"]["conclusion"], "success");
        let stale = apply(&data, &check("s0")).unwrap();
        assert_eq!(stale["checks"], data["checks"]);
        let mut moved = pr.clone();
        moved["head"]["sha"] = json!("s2");
        let u2 = ItemUpdate { patches: vec![Patch::Fields(pull_request_fields(&moved))], ..u };
        assert!(apply(&data, &u2).unwrap().get("checks").is_none());
    }
}
