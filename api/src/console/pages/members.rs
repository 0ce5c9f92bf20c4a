//! The org's members: who they are (email, GitHub login), their role, and forms to add a
//! person, change a role and remove a member, all through the REST API (`members`), whose
//! role checks decide who may: an admin, and an owner where the owner role is given or taken.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::super::session::OrgSession;
use super::super::view::{self, Page};
use super::super::{Console, ConsoleError};
use super::act::shown;
use super::{Posted, here, see_other};
use crate::http::auth::Role;
use crate::http::members::MemberList;

/// What the page shows after a post: a refusal beside the form it answers (`add`, or a
/// member's id), and the email asked for, to fill the form again.
#[derive(Debug, Default, Serialize)]
struct Outcome {
    refused_at: Option<String>,
    refusal: Option<String>,
    email: String,
}

const ROLES: [&str; 4] = ["viewer", "member", "admin", "owner"];

async fn render(c: &Console, s: &OrgSession, outcome: Outcome, status: StatusCode) -> Result<Response, ConsoleError> {
    let list: MemberList = c.read(&s.caller, &format!("/orgs/{}/members?limit=200", s.org)).await?;
    let mut page = Page::of(s, format!("Members · {}", s.org), "members");
    page.projects = c.projects(s).await?;
    // The roles this person may give; the REST checks decide all the same.
    let grantable: Vec<&str> = ROLES.into_iter().filter(|r| Role::parse(r).is_some_and(|r| r <= s.role())).collect();
    let html = c.render(
        "members.html",
        ctx! { page => page, members => list.items, more => list.next_cursor.is_some(), roles => ROLES, grantable => grantable, outcome => outcome, me => s.caller.user.map(|u| u.to_string()) },
    )?;
    Ok(view::html(status, html))
}

pub(in super::super) async fn page(State(c): State<Console>, Path(org): Path<String>, headers: HeaderMap, uri: Uri) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &org, &here(&uri)).await?;
    render(&c, &s, Outcome::default(), StatusCode::OK).await
}

pub(in super::super) async fn add(State(c): State<Console>, Path(org): Path<String>, Posted { s, form: f }: Posted) -> Result<Response, ConsoleError> {
    let email = f.get("email").map(|e| e.trim().to_owned()).unwrap_or_default();
    let body = json!({ "email": email, "role": f.get("role").map(String::as_str).unwrap_or("member") });
    match c.call(&s.caller, Method::POST, &format!("/orgs/{org}/members"), Some(body)).await? {
        Ok(_) => Ok(see_other(&format!("/orgs/{org}/members"))),
        Err(r) => {
            let r = shown(r)?;
            render(&c, &s, Outcome { refused_at: Some("add".into()), refusal: Some(r.detail), email }, r.status).await
        }
    }
}

#[derive(Debug, Deserialize)]
pub(in super::super) struct MemberPath {
    org: String,
    user: String,
}

/// A change to one member, through the REST route; back to the list.
async fn change(c: &Console, p: &MemberPath, s: &OrgSession, method: Method, body: Option<serde_json::Value>) -> Result<Response, ConsoleError> {
    match c.call(&s.caller, method, &format!("/orgs/{}/members/{}", p.org, view::urlencode(&p.user)), body).await? {
        Ok(_) => Ok(see_other(&format!("/orgs/{}/members", p.org))),
        Err(r) => {
            let r = shown(r)?;
            render(c, s, Outcome { refused_at: Some(p.user.clone()), refusal: Some(r.detail), email: String::new() }, r.status).await
        }
    }
}

pub(in super::super) async fn role(State(c): State<Console>, Path(p): Path<MemberPath>, Posted { s, form: f }: Posted) -> Result<Response, ConsoleError> {
    let body = json!({ "role": f.get("role").map(String::as_str).unwrap_or_default() });
    change(&c, &p, &s, Method::PATCH, Some(body)).await
}

pub(in super::super) async fn remove(State(c): State<Console>, Path(p): Path<MemberPath>, Posted { s, .. }: Posted) -> Result<Response, ConsoleError> {
    change(&c, &p, &s, Method::DELETE, None).await
}
