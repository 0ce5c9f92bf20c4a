//! The approval forms' handlers (approve, reject), which check an answer field by field (with
//! the store's own `check_answer`) before the REST route records it; a refused answer shows the
//! page again with its messages and values (`approvals.rs` shows them).

use std::collections::HashMap;

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use engine::store::approvals::check_answer;
use serde_json::{Map, Value, json};

use super::super::{Posted, posted};
use super::act::{answer, post, reason};
use super::page::render;
use super::{Feedback, NodePath, run_id};
use crate::console::view;
use crate::console::{Console, ConsoleError};

const OPEN_APPROVAL_FIELDS: &str = "SELECT fields FROM approvals WHERE org_id = $1 AND run_id = $2 AND node = $3 AND decision IS NULL";

/// Turns an approval form's text fields into the JSON answer, by the form's field types, with
/// a message per field that cannot be read or does not pass `check_answer`.
fn read_answer(spec: &Value, posted: &[(String, String)]) -> (Map<String, Value>, HashMap<String, String>, HashMap<String, String>) {
    let empty = Map::new();
    let fields = spec.as_object().unwrap_or(&empty);
    let mut answer = Map::new();
    let mut errors = HashMap::new();
    let mut typed = HashMap::new();
    for (name, f) in fields {
        let Some(raw) = posted.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.trim().to_owned()) else {
            continue;
        };
        typed.insert(name.clone(), raw.clone());
        let kind = f.get("type").and_then(Value::as_str).unwrap_or("string");
        match kind {
            "boolean" => {
                answer.insert(name.clone(), Value::Bool(true));
            }
            "number" if raw.is_empty() => {}
            "number" => match raw.parse::<f64>() {
                Ok(n) if n.is_finite() => {
                    let v = if n.fract() == 0.0 && n.abs() < 9e15 { json!(n as i64) } else { json!(n) };
                    answer.insert(name.clone(), v);
                }
                _ => {
                    errors.insert(name.clone(), format!("{name} must be a number"));
                }
            },
            _ if raw.is_empty() => {}
            _ => {
                answer.insert(name.clone(), Value::String(raw.chars().take(10_000).collect()));
            }
        }
    }
    // Unchecked boxes are sent as nothing: they mean false.
    for (name, f) in fields {
        if f.get("type").and_then(Value::as_str) == Some("boolean") && !answer.contains_key(name) {
            answer.insert(name.clone(), Value::Bool(false));
        }
    }
    // Each field on its own, so that every message shows at once.
    for (name, f) in fields {
        if errors.contains_key(name) {
            continue;
        }
        let mut one_spec = Map::new();
        one_spec.insert(name.clone(), f.clone());
        let mut one = Map::new();
        if let Some(v) = answer.get(name) {
            one.insert(name.clone(), v.clone());
        }
        if let Err(message) = check_answer(&Value::Object(one_spec), &one) {
            errors.insert(name.clone(), message.replace("approval field ", "").replace('"', ""));
        }
    }
    (answer, errors, typed)
}

pub(in crate::console) async fn approve(
    State(c): State<Console>, Path(p): Path<NodePath>, headers: HeaderMap, uri: Uri, Form(form): Form<Vec<(String, String)>>,
) -> Result<Response, ConsoleError> {
    let csrf = form.iter().find(|(k, _)| k == "_csrf").map(|(_, v)| v);
    let s = posted(&c, &headers, &p.org, &uri, csrf).await?;
    let run = p.run();
    let id = run_id(&p.run)?;
    let spec: Option<Value> = sqlx::query_scalar(OPEN_APPROVAL_FIELDS).bind(s.caller.org).bind(id).bind(&p.node).fetch_optional(c.db()).await?;
    let fields: Vec<(String, String)> = form.into_iter().filter(|(k, _)| !k.starts_with('_')).collect();
    let (answer_json, errors, typed) = read_answer(spec.as_ref().unwrap_or(&Value::Null), &fields);
    let mut fb = Feedback::default();
    fb.values.insert(p.node.clone(), typed);
    if !errors.is_empty() {
        fb.forms.insert(format!("approve:{}", p.node), "Not approved yet: fix the fields marked below.".into());
        fb.fields.insert(p.node.clone(), errors);
        return render(&c, &s, &p.org, &p.project, &p.run, &fb, StatusCode::UNPROCESSABLE_ENTITY).await;
    }
    let path = format!("/orgs/{}/projects/{}/runs/{}/approvals/{}", p.org, p.project, p.run, view::urlencode(&p.node));
    let result = c.call(&s.caller, Method::POST, &path, Some(Value::Object(answer_json))).await?;
    answer(&c, &s, &run, &format!("approve:{}", p.node), result, fb).await
}

pub(in crate::console) async fn reject(State(c): State<Console>, Path(p): Path<NodePath>, Posted { s, form }: Posted) -> Result<Response, ConsoleError> {
    let rest = format!("/approvals/{}/reject", view::urlencode(&p.node));
    let body = json!({ "reason": reason(&form) });
    post(&c, &s, &p.run(), &format!("reject:{}", p.node), &rest, Some(body)).await
}
