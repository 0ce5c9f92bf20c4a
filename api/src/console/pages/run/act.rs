//! The forms that act on the run: cancel, retry (with an optional edit of a crew node), rerun
//! (from the start or a node) and a message to a running crew session, each posted through
//! the REST route of the same name; and the answer every form of the page gets.

use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

use super::super::{FormMap, Posted, see_other};
use super::page::render;
use super::{Feedback, RunPath, StepPath};
use crate::console::internal::Refusal;
use crate::console::session::OrgSession;
use crate::console::view;
use crate::console::{Console, ConsoleError};

/// A form's answer: on success, back to the run (or to the new run); on a refusal, the page
/// again with the message beside the form (422), nothing changed.
pub(super) async fn answer(
    c: &Console, s: &OrgSession, p: &RunPath, form: &str, result: Result<Value, Refusal>, fb: Feedback,
) -> Result<Response, ConsoleError> {
    let base = format!("/orgs/{}/projects/{}/runs/{}", p.org, p.project, p.run);
    match result {
        Ok(v) => {
            // A retry or rerun answers the new run.
            let to = match v.get("id").and_then(Value::as_str) {
                Some(new) if new != p.run && new.starts_with("run-") => {
                    format!("/orgs/{}/projects/{}/runs/{new}", p.org, p.project)
                }
                _ => base,
            };
            Ok(see_other(&to))
        }
        Err(r) => {
            let mut fb = fb;
            fb.forms.insert(form.to_owned(), r.detail().to_owned());
            render(c, s, &p.org, &p.project, &p.run, &fb, StatusCode::UNPROCESSABLE_ENTITY).await
        }
    }
}

/// Posts a form of the run page to the REST route `rest` under the run's own (`/cancel`,
/// `/approvals/<node>/reject`, …), and answers as every form does (`answer`).
pub(super) async fn post(c: &Console, s: &OrgSession, run: &RunPath, form: &str, rest: &str, body: Option<Value>) -> Result<Response, ConsoleError> {
    let path = format!("/orgs/{}/projects/{}/runs/{}{rest}", run.org, run.project, run.run);
    let result = c.call(&s.caller, Method::POST, &path, body).await?;
    answer(c, s, run, form, result, Feedback::default()).await
}

/// A form's optional reason: trimmed, none when blank.
pub(super) fn reason(form: &FormMap) -> Option<&str> {
    form.get("reason").map(|r| r.trim()).filter(|r| !r.is_empty())
}

pub(in crate::console) async fn cancel(State(c): State<Console>, Path(p): Path<RunPath>, Posted { s, form }: Posted) -> Result<Response, ConsoleError> {
    post(&c, &s, &p, "cancel", "/cancel", Some(json!({ "reason": reason(&form) }))).await
}

pub(in crate::console) async fn retry(State(c): State<Console>, Path(p): Path<RunPath>, Posted { s, form }: Posted) -> Result<Response, ConsoleError> {
    // Edit-and-retry names a crew node and what to change; a plain retry sends no body.
    let text = |k: &str| form.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    let body = text("node")
        .map(|node| json!({ "node": node, "prompt": form.get("prompt").filter(|p| !p.trim().is_empty()), "model": text("model"), "harness": text("harness") }));
    let key = if body.is_some() { "edit" } else { "retry" };
    post(&c, &s, &p, key, "/retry", body).await
}

pub(in crate::console) async fn rerun(State(c): State<Console>, Path(p): Path<RunPath>, Posted { s, form }: Posted) -> Result<Response, ConsoleError> {
    let rest = match form.get("from").map(|f| f.trim()).filter(|f| !f.is_empty()) {
        Some(from) => format!("/rerun?from={}", view::urlencode(from)),
        None => "/rerun".to_owned(),
    };
    post(&c, &s, &p, "rerun", &rest, None).await
}

/// Intervene: the form under a running crew step's transcript, posted to the REST route that
/// sends the message to the session.
pub(in crate::console) async fn say(State(c): State<Console>, Path(p): Path<StepPath>, Posted { s, form }: Posted) -> Result<Response, ConsoleError> {
    let text = form.get("text").map(String::as_str).unwrap_or_default();
    let rest = format!("/steps/{}/messages", view::urlencode(&p.step));
    post(&c, &s, &p.run(), "say", &rest, Some(json!({ "text": text }))).await
}
