//! The org's audit log, newest first, with the REST API's filters (actor, action, target, a
//! time window) and keyset paging. Reading it needs the admin role, as in the API.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use serde::{Deserialize, Serialize};

use super::super::people;
use super::super::view::{Page, urlencode};
use super::super::{Console, ConsoleError};
use super::{Window, here, instant};
use crate::http::audit::AuditList;

#[derive(Debug, Deserialize, Serialize, Default)]
pub(in super::super) struct Filters {
    #[serde(default)]
    actor: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    target: String,
    #[serde(flatten)]
    window: Window,
}

pub(in super::super) async fn page(
    State(c): State<Console>, Path(org): Path<String>, headers: HeaderMap, uri: Uri, Query(f): Query<Filters>,
) -> Result<Response, ConsoleError> {
    let s = c.session(&headers, &org, &here(&uri)).await?;
    let mut q: Vec<String> = vec!["limit=100".into()];
    let mut keep: Vec<String> = Vec::new();
    for (k, v) in [("actor", &f.actor), ("action", &f.action), ("target", &f.target)] {
        if !v.trim().is_empty() {
            q.push(format!("{k}={}", urlencode(v.trim())));
            keep.push(format!("{k}={}", urlencode(v.trim())));
        }
    }
    for (k, v) in [("since", &f.window.since), ("until", &f.window.until)] {
        if let Some(t) = instant(v) {
            q.push(format!("{k}={}", urlencode(&t.to_rfc3339())));
            keep.push(format!("{k}={}", urlencode(v.trim())));
        }
    }
    if !f.window.cursor.is_empty() {
        q.push(format!("cursor={}", urlencode(&f.window.cursor)));
    }
    let list: AuditList = c.read(&s.caller, &format!("/orgs/{org}/audit?{}", q.join("&"))).await?;
    let next = list.next_cursor.as_ref().map(|cur| {
        let mut k = keep.clone();
        k.push(format!("cursor={}", urlencode(cur)));
        format!("?{}", k.join("&"))
    });
    let names = people::names(c.db(), s.caller.org, list.items.iter().map(|e| format!("{}:{}", e.actor_kind, e.actor_id))).await?;
    let mut page = Page::of(&s, format!("Audit log · {org}"), "audit");
    page.projects = c.projects(&s).await?;
    c.page("audit.html", ctx! { page => page, entries => list.items, names => names, next => next, filters => f, paged => !f.window.cursor.is_empty() })
}
