//! Keyset paging for every list: `limit` (50 by default, 1 to 200: anything else is refused,
//! as the document's bounds say) and an opaque `cursor`,
//! the base64url of the last row's sort key as JSON. Never `OFFSET`: a page is "the rows
//! after this key", so rows inserted while a client pages cannot shift or repeat what it reads.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sqlx::{Postgres, QueryBuilder};
use utoipa::IntoParams;
use uuid::Uuid;

use engine::db::Db;
use engine::ids::{OrgId, ProjectId};

use super::error::ApiError;

/// Declares a list's answer: a page of `items` and `next_cursor`, the cursor of the page after
/// it (absent on the last), or with `, by seq`, `next_after`, the sequence number it ends at.
/// A macro rather than a generic `Page<T>`, which the OpenAPI document would name
/// `Page_Project` instead of `ProjectList`.
macro_rules! list {
    ($list:ident of $item:ty) => {
        #[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
        pub struct $list {
            pub items: Vec<$item>,
            pub next_cursor: Option<String>,
        }

        impl $list {
            /// The page of `rows`, fetched with `limit + 1` rows, with the cursor of the page
            /// after it keyed by `key` ([`finish`](crate::http::page::finish)).
            pub fn page<K: serde::Serialize>(rows: Vec<$item>, limit: i64, key: impl Fn(&$item) -> K) -> Self {
                let (items, next_cursor) = $crate::http::page::finish(rows, limit, key);
                Self { items, next_cursor }
            }
        }
    };
    // A list by sequence number (a run's events, a step's log): `next_after` instead.
    ($list:ident of $item:ty, by $seq:ident) => {
        #[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
        pub struct $list {
            pub items: Vec<$item>,
            /// Pass as `after` for the next page; absent on the last page.
            pub next_after: Option<i64>,
        }

        impl $list {
            /// The page of `rows`, fetched with `limit + 1` rows, with the sequence number the
            /// page after it starts after ([`finish_after`](crate::http::page::finish_after)).
            pub fn page(rows: Vec<$item>, limit: i64) -> Self {
                let (items, next_after) = $crate::http::page::finish_after(rows, limit, |r| r.$seq);
                Self { items, next_after }
            }
        }
    };
}
pub(crate) use list;

/// A list's query, `?limit=&cursor=`, for the lists that take nothing else.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// Page size, 1 to 200 (50 by default).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page (empty: the first page); a cursor this server
    /// did not give answers 404.
    pub cursor: Option<String>,
}

impl PageQuery {
    /// The page size and the sort key the page starts after (`start`).
    pub fn start<K: DeserializeOwned>(&self) -> Result<(i64, Option<K>), ApiError> {
        start(self.limit, self.cursor.as_deref())
    }
}

pub const DEFAULT_LIMIT: u32 = 50;
pub const MAX_LIMIT: u32 = 200;

/// The page size to use: the default when none is asked, and a limit outside 1 to
/// [`MAX_LIMIT`] refused (never lowered to fit), as the document's bounds for `limit` say.
pub fn limit(asked: Option<u32>) -> Result<i64, ApiError> {
    match asked {
        Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(i64::from(n)),
        Some(_) => Err(ApiError::BadRequest(format!("limit must be between 1 and {MAX_LIMIT}"))),
        None => Ok(i64::from(DEFAULT_LIMIT)),
    }
}

/// A page's size and the sort key it starts after, from a list's `limit` and `cursor`, both
/// checked: a bad limit or cursor is refused.
pub fn start<K: DeserializeOwned>(limit: Option<u32>, cursor: Option<&str>) -> Result<(i64, Option<K>), ApiError> {
    Ok((self::limit(limit)?, decode(cursor)?))
}

const NO_PAGE: &str = "no page at this cursor: pass back the next_cursor of a previous page";

pub fn encode<T: Serialize>(key: &T) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(key).unwrap_or_default())
}

/// The sort key a cursor holds; none for no cursor or an empty one (`?cursor=`: the first page).
/// A cursor this server did not give names no page: 404, as a key that names nothing does.
pub fn decode<T: DeserializeOwned>(cursor: Option<&str>) -> Result<Option<T>, ApiError> {
    let Some(cursor) = cursor.filter(|c| !c.is_empty()) else { return Ok(None) };
    let bad = || ApiError::NotFound(NO_PAGE.into());
    let bytes = URL_SAFE_NO_PAD.decode(cursor.as_bytes()).map_err(|_| bad())?;
    // A NUL in a key reaches PostgreSQL, which refuses it in text with an error of its own.
    if bytes.contains(&0) || bytes.windows(6).any(|w| w.eq_ignore_ascii_case(b"\\u0000")) {
        return Err(bad());
    }
    serde_json::from_slice(&bytes).map(Some).map_err(|_| bad())
}

/// A page of an org's rows, and of one project's when `project` is given, ordered by one
/// unique text column: the rows after the cursor's key, one more than a page (for [`finish`],
/// with that column as the key). `select` is the statement up to its `FROM` table, whose rows
/// carry `org_id` and `project_id`.
pub async fn by_name<R>(db: &Db, select: &str, org: OrgId, project: Option<ProjectId>, column: &'static str, q: &PageQuery) -> Result<(Vec<R>, i64), ApiError>
where
    R: Send + Unpin + for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
{
    let (limit, after) = q.start::<String>()?;
    let mut qb = QueryBuilder::<Postgres>::new(select);
    qb.push(" WHERE org_id = ").push_bind(org);
    if let Some(project) = project {
        qb.push(" AND project_id = ").push_bind(project);
    }
    if let Some(name) = after {
        qb.push(" AND ").push(column).push(" > ").push_bind(name);
    }
    qb.push(" ORDER BY ").push(column).push(" LIMIT ").push_bind(limit + 1);
    Ok((qb.build_query_as().fetch_all(db).await?, limit))
}

/// Ends a list's query newest first, by `created_at` and then the uuid column `id`: the rows
/// before the cursor's key, one more than a page (for [`finish`], with [`newest_key`]).
pub fn newest_first(qb: &mut QueryBuilder<'_, Postgres>, id: &'static str, after: Option<(i64, Uuid)>, limit: i64) -> Result<(), ApiError> {
    if let Some((micros, last)) = after {
        qb.push(" AND (created_at, ").push(id).push(") < (").push_bind(time(micros)?).push(", ").push_bind(last).push(")");
    }
    qb.push(" ORDER BY created_at DESC, ").push(id).push(" DESC LIMIT ").push_bind(limit + 1);
    Ok(())
}

/// The key of a row in a [`newest_first`] list: its time in microseconds, and its id.
pub fn newest_key(created_at: DateTime<Utc>, id: Uuid) -> (i64, Uuid) {
    (created_at.timestamp_micros(), id)
}

/// A cursor's time, which it holds in microseconds since the epoch.
pub fn time(micros: i64) -> Result<DateTime<Utc>, ApiError> {
    DateTime::from_timestamp_micros(micros).ok_or_else(|| ApiError::NotFound(NO_PAGE.into()))
}

/// Cuts a page fetched with `limit + 1` rows to `limit`, with the cursor of its last row when
/// more follow.
pub fn finish<R, K: Serialize>(rows: Vec<R>, limit: i64, key: impl Fn(&R) -> K) -> (Vec<R>, Option<String>) {
    let (rows, last) = cut(rows, limit, key);
    (rows, last.map(|k| encode(&k)))
}

/// Cuts a page of sequence-numbered rows (a run's events, a step's log) fetched with
/// `limit + 1` rows to `limit`, with the last row's number to pass as `after` when more follow.
pub fn finish_after<R>(rows: Vec<R>, limit: i64, seq: impl Fn(&R) -> i64) -> (Vec<R>, Option<i64>) {
    cut(rows, limit, seq)
}

/// `limit` rows of `rows`, and the key of the last one kept when there were more.
fn cut<R, K>(mut rows: Vec<R>, limit: i64, key: impl Fn(&R) -> K) -> (Vec<R>, Option<K>) {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    if rows.len() > limit {
        rows.truncate(limit);
        let last = rows.last().map(key);
        (rows, last)
    } else {
        (rows, None)
    }
}
