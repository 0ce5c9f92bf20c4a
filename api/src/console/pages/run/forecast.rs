//! The run page's forecast of the time left: the median time of each node not yet done, from
//! the workflow's earlier completed runs.

use chrono::{DateTime, Utc};
use engine::db::Db;
use engine::ids::{OrgId, RunId, WorkflowId};

use crate::console::ConsoleError;
use crate::console::view;
use crate::http::runs::RunDetail;

/// The earlier completed runs of the workflow (up to 20) and the median time of each node in
/// them ($1 workflow, $2 org, $3 this run).
pub(crate) const FORECAST_SQL: &str = "WITH earlier AS ( \
       SELECT run_id, created_at, ended_at FROM runs \
       WHERE workflow_id = $1 AND org_id = $2 AND status = 'completed' AND NOT dry_run AND run_id <> $3 \
       ORDER BY ended_at DESC LIMIT 20) \
     SELECT s.node, (percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM s.ended_at - s.created_at)))::float8 AS secs, \
            (SELECT count(*) FROM earlier) AS runs, \
            (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM ended_at - created_at)) FROM earlier)::float8 AS total \
     FROM earlier e JOIN steps s ON s.run_id = e.run_id \
     WHERE s.org_id = $2 AND s.state = 'succeeded' AND s.ended_at IS NOT NULL AND s.reused_from IS NULL \
     GROUP BY s.node";

#[derive(Debug, sqlx::FromRow)]
struct NodeTime {
    node: String,
    secs: Option<f64>,
    runs: i64,
    total: Option<f64>,
}

/// The forecast's sentence, for a running run (`substate`: what holds it now); none once it
/// ended.
pub(super) async fn forecast(
    db: &Db, workflow: Option<WorkflowId>, id: RunId, org_id: OrgId, detail: &RunDetail, substate: Option<&str>, now: DateTime<Utc>,
) -> Result<Option<String>, ConsoleError> {
    let times: Vec<NodeTime> = match workflow {
        Some(w) if detail.run.status == "running" => sqlx::query_as(FORECAST_SQL).bind(w).bind(org_id).bind(id).fetch_all(db).await?,
        _ => Vec::new(),
    };
    let forecast = if detail.run.status != "running" {
        None
    } else if times.is_empty() {
        Some("No forecast yet: no earlier run of this workflow has completed.".to_owned())
    } else {
        let mut left = 0.0;
        for t in &times {
            let Some(median) = t.secs else { continue };
            let latest = detail.steps.iter().rev().find(|st| st.node == t.node);
            match latest {
                Some(st) if st.state == "succeeded" || st.reused => {}
                Some(st) if st.ended_at.is_none() => {
                    let spent = (now - st.created_at).num_milliseconds() as f64 / 1000.0;
                    left += (median - spent).max(0.0);
                }
                _ => left += median,
            }
        }
        let runs = times[0].runs;
        let total = times[0].total.map(|t| format!("; a whole run typically takes {}", view::duration(t))).unwrap_or_default();
        let waits_on_person = substate == Some("awaiting_signal");
        let lead = if left < 1.0 { "Should finish any moment".to_owned() } else { format!("About {} left", view::duration(left)) };
        let person = if waits_on_person { ", once a person answers" } else { "" };
        Some(format!("{lead}{person} (median times from {runs} earlier run{}{total}).", if runs == 1 { "" } else { "s" }))
    };
    Ok(forecast)
}
