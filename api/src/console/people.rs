//! Who did something, as people read it. Actors are recorded as `kind:id` (`user:<uuid>`,
//! `host:<uuid>`, `engine:e1`); the console shows a person's GitHub login or email, a host's
//! name, and the other kinds in words. One indexed read per page for all the names on it.

use std::collections::HashMap;

use engine::ids::OrgId;

/// The people and hosts named by these actors ($1 org, $2 their ids).
pub(crate) const NAMES_SQL: &str = "SELECT 'user:' || user_id::text AS actor, coalesce(github_login, email) AS name FROM users \
     WHERE org_id = $1 AND user_id = ANY($2) \
     UNION ALL SELECT 'host:' || host_id::text, name FROM hosts WHERE org_id = $1 AND host_id = ANY($2)";

/// Each of `actors` as people read it (`octocat`, `host builder-1`, `the engine (e1)`), with
/// the names of people and hosts read in `org` only (one statement).
pub(super) async fn names(db: &engine::db::Db, org: OrgId, actors: impl IntoIterator<Item = String>) -> Result<HashMap<String, String>, sqlx::Error> {
    let actors: Vec<String> = actors.into_iter().collect();
    let ids: Vec<uuid::Uuid> =
        actors.iter().filter_map(|a| a.strip_prefix("user:").or_else(|| a.strip_prefix("host:"))).filter_map(|id| id.parse().ok()).collect();
    let known: HashMap<String, String> = if ids.is_empty() {
        HashMap::new()
    } else {
        sqlx::query_as::<_, (String, String)>(NAMES_SQL).bind(org).bind(&ids).fetch_all(db).await?.into_iter().collect()
    };
    Ok(actors
        .into_iter()
        .map(|a| {
            let shown = read_as(&known, &a);
            (a, shown)
        })
        .collect())
}

/// One actor in words: a known person's or host's name, else what its kind says.
fn read_as(known: &HashMap<String, String>, actor: &str) -> String {
    let (kind, id) = actor.split_once(':').unwrap_or((actor, ""));
    match (kind, known.get(actor)) {
        ("host", Some(name)) => format!("host {name}"),
        (_, Some(name)) => name.clone(),
        ("engine", _) => format!("the engine ({id})"),
        ("github", _) => "GitHub".into(),
        ("system", _) => "shopfloor".into(),
        ("token", _) => "an API token".into(),
        ("user", _) => "a former member".into(),
        ("host", _) => "a deregistered host".into(),
        _ => actor.to_owned(),
    }
}
