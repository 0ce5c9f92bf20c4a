//! Whether a workflow's `on.github` trigger fires for a delivery: its `events`, its CEL `if:`,
//! and who may trigger.
//!
//! The `if:` sees three variables: `item` (the projection after this delivery), `trigger` (what
//! happened: event, action, sender, the label or comment it carried) and `project` (slug and
//! name). A condition should speak of the item's state; `trigger` narrows which deliveries may
//! start a run. Revocation ("the item stopped matching") re-evaluates a pending run's `if:`
//! with the `trigger` that started it and the item as it is now.

use serde_json::{Value, json};

use crate::definition::{GithubTrigger, Senders, expr};
use crate::triggers::projection::comment_fields;

/// The outcome of an `if:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Matches,
    DoesNotMatch,
    /// The expression failed on this data (a missing key, a type mismatch).
    Failed(String),
}

/// Evaluates the trigger's `if:` (none: it matches).
pub fn verdict(trigger: &GithubTrigger, item: &Value, trigger_ctx: &Value, project: &Value) -> Verdict {
    let Some(condition) = &trigger.condition else { return Verdict::Matches };
    let ctx = json!({ "item": item, "trigger": trigger_ctx, "project": project });
    match expr::eval_bool(condition, &ctx) {
        Ok(true) => Verdict::Matches,
        Ok(false) => Verdict::DoesNotMatch,
        Err(e) => Verdict::Failed(crate::store::cap(&e)),
    }
}

/// Whether `events` names this delivery: `issues` matches every action of the event,
/// `issues.labeled` only that one.
pub fn names_event(trigger: &GithubTrigger, event: &str, action: Option<&str>) -> bool {
    trigger.events.iter().any(|e| match e.split_once('.') {
        Some((name, act)) => name == event && Some(act) == action,
        None => e == event,
    })
}

/// Who sent a delivery, and whether the default policy lets them trigger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sender {
    pub login: String,
    pub bot: bool,
    /// OWNER, MEMBER, COLLABORATOR, CONTRIBUTOR, … as far as the payload tells it.
    pub association: Option<String>,
}

const TRUSTED: [&str; 3] = ["OWNER", "MEMBER", "COLLABORATOR"];

/// Actions on an issue or pull request that GitHub lets only people with triage (or write)
/// access do to someone else's item: their sender is a collaborator even though the payload
/// carries only the author's association.
const TRIAGE_ACTIONS: [&str; 17] = [
    "labeled",
    "unlabeled",
    "assigned",
    "unassigned",
    "milestoned",
    "demilestoned",
    "closed",
    "reopened",
    "edited",
    "locked",
    "unlocked",
    "pinned",
    "unpinned",
    "transferred",
    "review_requested",
    "review_request_removed",
    "typed",
];

impl Sender {
    /// Reads the sender of `payload`. GitHub's payloads give `author_association` for the
    /// author of an issue, pull request, comment or review, never for the sender, so the
    /// association is the author's when the sender is the author, a collaborator's when the
    /// action needs triage access, and unknown otherwise.
    pub fn of(event: &str, payload: &Value) -> Sender {
        let sender = payload.get("sender");
        let login = sender.and_then(|s| s.get("login")).and_then(Value::as_str).unwrap_or_default().to_owned();
        let bot = sender.and_then(|s| s.get("type")).and_then(Value::as_str) == Some("Bot") || login.ends_with("[bot]");
        let action = payload.get("action").and_then(Value::as_str).unwrap_or_default();
        let assoc = |v: Option<&Value>| v.and_then(|o| o.get("author_association")).and_then(Value::as_str).map(str::to_owned);
        let author = |v: Option<&Value>| v.and_then(|o| o.pointer("/user/login")).and_then(Value::as_str).map(str::to_owned);
        let association = match event {
            "issue_comment" | "pull_request_review_comment" => {
                let comment = payload.get("comment");
                if author(comment).as_deref() == Some(login.as_str()) {
                    assoc(comment)
                } else if action == "deleted" || action == "edited" {
                    // Editing or deleting someone else's comment needs triage access.
                    Some("COLLABORATOR".to_owned())
                } else {
                    None
                }
            }
            "pull_request_review" => {
                let review = payload.get("review");
                if author(review).as_deref() == Some(login.as_str()) { assoc(review) } else { Some("COLLABORATOR".to_owned()) }
            }
            "issues" | "pull_request" => {
                let object = payload.get("issue").or_else(|| payload.get("pull_request"));
                if author(object).as_deref() == Some(login.as_str()) {
                    assoc(object)
                } else if TRIAGE_ACTIONS.contains(&action) {
                    Some("COLLABORATOR".to_owned())
                } else {
                    None
                }
            }
            // Pushing to the repository needs write access.
            "push" => Some("COLLABORATOR".to_owned()),
            // Editing an org's project board needs write access to the project.
            "projects_v2_item" => Some("MEMBER".to_owned()),
            _ => None,
        };
        Sender { login, bot, association }
    }

    /// The default policy: OWNER, MEMBER or COLLABORATOR, never a bot.
    pub fn trusted(&self) -> bool {
        !self.bot && self.association.as_deref().is_some_and(|a| TRUSTED.contains(&a))
    }

    /// Whether this sender may trigger a workflow whose `senders:` is `senders`.
    pub fn may_trigger(&self, senders: Senders) -> bool {
        match senders {
            Senders::Any => true,
            Senders::Trusted => self.trusted(),
        }
    }
}

/// The `trigger` variable for a delivery: what happened, by whom, with the label, comment,
/// review, check or push it carried.
pub fn trigger_context(delivery: &str, event: &str, payload: &Value, sender: &Sender) -> Value {
    let action = payload.get("action").and_then(Value::as_str);
    let mut t = json!({
        "source": "github",
        "event": event,
        "action": action,
        "name": match action { Some(a) => format!("{event}.{a}"), None => event.to_owned() },
        "delivery": delivery,
        "sender": { "login": sender.login, "bot": sender.bot, "association": sender.association },
    });
    let Some(obj) = t.as_object_mut() else { return t };
    if let Some(label) = payload.pointer("/label/name") {
        obj.insert("label".into(), json!({ "name": label }));
    }
    if let Some(comment) = payload.get("comment") {
        obj.insert("comment".into(), comment_fields(comment));
    }
    if let Some(review) = payload.get("review") {
        obj.insert("review".into(), crate::triggers::projection::review_fields(review));
    }
    if let Some(changes) = payload.get("changes") {
        // Which fields an edit changed, without the old text (it may be long, and is not the
        // item's state).
        let names: Vec<&String> = changes.as_object().map(|m| m.keys().collect()).unwrap_or_default();
        obj.insert("changed".into(), json!(names));
    }
    for key in ["check_run", "check_suite"] {
        if let Some(check) = payload.get(key) {
            obj.insert(
                "check".into(),
                json!({
                    "name": check.get("name").or_else(|| check.pointer("/app/name")),
                    "status": check.get("status"),
                    "conclusion": check.get("conclusion"),
                    "head_sha": check.get("head_sha"),
                }),
            );
        }
    }
    if event == "status" {
        obj.insert("check".into(), json!({ "name": payload.get("context"), "state": payload.get("state"), "head_sha": payload.get("sha") }));
    }
    if event == "push" {
        obj.insert("ref".into(), payload.get("ref").cloned().unwrap_or(Value::Null));
        obj.insert("after".into(), payload.get("after").cloned().unwrap_or(Value::Null));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trigger(events: &[&str], condition: Option<&str>) -> GithubTrigger {
        GithubTrigger { events: events.iter().map(|e| (*e).to_owned()).collect(), condition: condition.map(str::to_owned), senders: Senders::Trusted }
    }

    #[test]
    fn events_match_by_name_or_name_and_action() {
        let t = trigger(&["issues.labeled", "pull_request"], None);
        assert!(names_event(&t, "issues", Some("labeled")));
        assert!(!names_event(&t, "issues", Some("opened")));
        assert!(names_event(&t, "pull_request", Some("synchronize")));
        assert!(!names_event(&t, "issue_comment", Some("created")));
    }

    #[test]
    fn conditions_read_item_trigger_and_project() {
        let t = trigger(&["issues"], Some("'ready' in item.labels && trigger.action == 'labeled' && project.slug == 'web'"));
        let item = json!({ "labels": ["ready"] });
        let project = json!({ "slug": "web" });
        assert_eq!(verdict(&t, &item, &json!({ "action": "labeled" }), &project), Verdict::Matches);
        assert_eq!(verdict(&t, &json!({ "labels": [] }), &json!({ "action": "labeled" }), &project), Verdict::DoesNotMatch);
        let broken = trigger(&["issues"], Some("item.nope.deeper == 1"));
        assert!(matches!(verdict(&broken, &item, &json!({}), &project), Verdict::Failed(_)));
    }

    #[test]
    fn the_sender_policy_trusts_members_and_never_bots() {
        let by = |login: &str, kind: &str, author: &str, assoc: &str, action: &str| {
            json!({ "action": action, "sender": { "login": login, "type": kind },
                    "issue": { "user": { "login": author }, "author_association": assoc } })
        };
        assert!(Sender::of("issues", &by("alice", "User", "alice", "MEMBER", "opened")).trusted());
        assert!(!Sender::of("issues", &by("eve", "User", "eve", "NONE", "opened")).trusted());
        assert!(!Sender::of("issues", &by("eve", "User", "eve", "CONTRIBUTOR", "edited")).trusted());
        // Labelling someone else's issue needs triage access.
        assert!(Sender::of("issues", &by("bob", "User", "eve", "NONE", "labeled")).trusted());
        assert!(!Sender::of("issues", &by("ci[bot]", "Bot", "eve", "NONE", "labeled")).trusted());
        assert!(Sender::of("issues", &by("ci[bot]", "Bot", "eve", "NONE", "labeled")).may_trigger(Senders::Any));
        let comment = json!({ "action": "created", "sender": { "login": "eve", "type": "User" },
                              "comment": { "user": { "login": "eve" }, "author_association": "NONE" } });
        assert!(!Sender::of("issue_comment", &comment).trusted());
    }
}
