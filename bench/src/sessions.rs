//! `sessions_*`: how many crew sessions at once one `shopfloor api` serves.
//!
//! `n` runs of a one-crew-node workflow are started by 2 `shopfloor engine` processes; their
//! steps are claimed and started over the host protocol by `n / 64` registered hosts (one HTTP
//! client each, 64 slots), as `shopfloor host` does. Then every session sends what a running
//! agent's host sends: a session report each second (5 transcript lines of about 120 bytes,
//! usage growing: tokens, turns and an estimated cost, so every report records spend), each
//! session at its own phase of the second. A few sessions' transcripts are followed in the
//! console (its live transcript, Server-Sent Events, signed in as the org's owner).
//!
//! After a 10-second warm-up, `BENCH_SESSIONS_SECS` seconds are measured: the reports' client-side latency
//! (p50, p99) and the transcript's lag, from just before a report is sent to its line's
//! arrival in the console (p50, p99). Every report must be answered 200 with its lines stored,
//! or the bench fails.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use engine::store::{Actor, Change};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::fleet;
use crate::setup::{Bench, percentile, scalar_i64, submit_many, until_count};

const ONE_CREW: &str = r#"name: one-session
nodes:
  work:
    crew: { harness: command, command: ["true"], prompt: x }
    requires: [linux, "harness:command"]
"#;

const SLOTS: usize = 64;
const LINES_PER_REPORT: usize = 5;
const WARMUP: Duration = Duration::from_secs(10);
/// Sessions whose transcripts the console follows.
const FOLLOWED: usize = 10;

pub(crate) struct Sessions {
    pub reports: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub lag_p50_ms: f64,
    pub lag_p99_ms: f64,
}

fn epoch_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

/// A held session: its step and run, and the client of the host that holds it.
#[derive(Clone)]
struct Held {
    step: String,
    run: String,
    http: reqwest::Client,
    token: String,
}

/// `n` sessions at once for `secs` measured seconds (see the module's header).
pub(crate) async fn concurrent_sessions(b: &Bench, n: usize, secs: u64) -> Result<Sessions> {
    let (db, seed) = b.database("bench_sessions", ONE_CREW).await?;
    let hosts = n.div_ceil(SLOTS);
    let mut ch = Change::begin(&db.pool, Actor::System).await?;
    let mut registrations = Vec::with_capacity(hosts);
    for i in 0..hosts {
        let (_, token, _) =
            api::auth::issue_registration_token(&mut ch, &b.key, seed.org, seed.project, &format!("session host {i}"), chrono::Duration::hours(2)).await?;
        registrations.push(token);
    }
    let owner: uuid::Uuid = sqlx::query_scalar("SELECT user_id FROM memberships WHERE org_id = $1 LIMIT 1").bind(seed.org).fetch_one(ch.conn()).await?;
    let owner_token = api::auth::issue_user_token(
        &mut ch,
        &b.key,
        api::auth::UserToken {
            org: seed.org,
            user: engine::ids::UserId(owner),
            project: None,
            role: "owner",
            name: "bench owner",
            ttl: chrono::Duration::hours(2),
        },
    )
    .await?;
    ch.commit().await?;
    submit_many(&db, &seed, n, 500, json!({})).await?;

    let (mut server, base) = fleet::api(b, &db, None).await?;
    let _engines = [fleet::engine(b, &db, "e1")?, fleet::engine(b, &db, "e2")?];
    until_count(&db.pool, "SELECT count(*) FROM steps WHERE state = 'pending'", n as i64, Duration::from_secs(300)).await?;

    // Each host registers, claims its share and starts each step, as `shopfloor host` does.
    let mut held: Vec<Held> = Vec::with_capacity(n);
    for (i, registration) in registrations.iter().enumerate() {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
        let cred: Value = http
            .post(format!("{base}/api/v1/host/register"))
            .bearer_auth(registration)
            .json(&json!({ "name": format!("s{i}"), "capabilities": ["linux", "harness:command"], "max_concurrent": SLOTS }))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let token = cred["token"].as_str().context("a host credential")?.to_owned();
        let want = SLOTS.min(n - held.len());
        let mut mine = 0;
        let deadline = Instant::now() + Duration::from_secs(120);
        while mine < want {
            ensure!(Instant::now() < deadline, "host s{i} claimed {mine} of {want} steps in 2 minutes");
            let answer: Value = http
                .post(format!("{base}/api/v1/host/claim"))
                .bearer_auth(&token)
                .json(&json!({ "max": want - mine, "wait_secs": 5 }))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            for a in answer["assignments"].as_array().into_iter().flatten() {
                let step = a["step"].as_str().context("an assignment's step")?.to_owned();
                let run = a["run"].as_str().context("an assignment's run")?.to_owned();
                http.post(format!("{base}/api/v1/host/steps/{step}/start"))
                    .bearer_auth(&token)
                    .json(&json!({ "harness": "command" }))
                    .send()
                    .await?
                    .error_for_status()?;
                held.push(Held { step, run, http: http.clone(), token: token.clone() });
                mine += 1;
            }
        }
    }
    server.alive()?;

    // The console follows a few transcripts, signed in as the owner.
    let session = console_session(&base, &owner_token).await?;
    let lags: Arc<Mutex<Vec<(Instant, f64)>>> = Arc::default();
    let mut followers = tokio::task::JoinSet::new();
    for h in held.iter().step_by((n / FOLLOWED).max(1)).take(FOLLOWED) {
        let url = format!("{base}/orgs/bench/projects/bench/runs/{}/steps/{}/transcript", h.run, h.step);
        followers.spawn(follow(url, session.clone(), lags.clone()));
    }

    // Every session reports each second, at its own phase.
    let started = Instant::now();
    let measure_from = started + WARMUP;
    let until = measure_from + Duration::from_secs(secs);
    let mut sessions = tokio::task::JoinSet::new();
    for (i, h) in held.into_iter().enumerate() {
        let phase = Duration::from_millis((i as u64 * 1000) / n as u64);
        sessions.spawn(report_each_second(base.clone(), h, started + phase, until));
    }
    let mut latencies = Vec::new();
    while let Some(done) = sessions.join_next().await {
        for (at, ms) in done.context("a session task panicked")?? {
            if at >= measure_from {
                latencies.push(ms);
            }
        }
    }
    followers.abort_all();
    server.alive()?;
    let mut lags: Vec<f64> = lags.lock().await.iter().filter(|(at, _)| *at >= measure_from && *at < until).map(|(_, ms)| *ms).collect();
    ensure!(!lags.is_empty(), "the console showed no transcript line while measured");
    let stored = scalar_i64(&db.pool, "SELECT count(*) FROM step_logs").await?;
    ensure!(stored > 0, "no transcript line stored");
    if std::env::var("BENCH_PROFILE").as_deref() == Ok("1") {
        crate::measures::print_top_statements(&db, latencies.len()).await?;
    }
    db.close().await;
    latencies.sort_by(f64::total_cmp);
    lags.sort_by(f64::total_cmp);
    Ok(Sessions {
        reports: latencies.len(),
        p50_ms: percentile(&latencies, 0.50),
        p99_ms: percentile(&latencies, 0.99),
        lag_p50_ms: percentile(&lags, 0.50),
        lag_p99_ms: percentile(&lags, 0.99),
    })
}

/// One session's reports, each second from `first` until `until`: the time each was sent and
/// its latency in milliseconds. Fails on any answer but 200 with every line stored.
async fn report_each_second(base: String, h: Held, first: Instant, until: Instant) -> Result<Vec<(Instant, f64)>> {
    let url = format!("{base}/api/v1/host/steps/{}/session", h.step);
    let mut tick = tokio::time::interval_at(first.into(), Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Vec::new();
    let mut seq = 0_i64;
    for turn in 1_i64.. {
        let at = tick.tick().await.into_std();
        if at >= until {
            break;
        }
        let sent = epoch_ms();
        let lines: Vec<Value> = (0..LINES_PER_REPORT)
            .map(|k| {
                seq += 1;
                json!({ "seq": seq, "stream": "assistant", "line": format!("sent={sent} turn {turn} line {k}: reading the module and planning the change to its tests") })
            })
            .collect();
        let usage = json!({
            "input_tokens": 2_000 * turn, "output_tokens": 300 * turn, "turns": turn, "tool_calls": turn,
            "model": "claude-sonnet-4-5", "estimated_cost_usd": 0.01 * turn as f64, "estimate_basis": "price_table",
        });
        let begun = Instant::now();
        let answer = h
            .http
            .post(&url)
            .bearer_auth(&h.token)
            .json(&json!({ "harness": "command", "lines": lines, "usage": usage }))
            .send()
            .await
            .with_context(|| format!("a report of {}", h.step))?;
        let status = answer.status();
        let body: Value = answer.json().await.unwrap_or(Value::Null);
        let ms = begun.elapsed().as_secs_f64() * 1000.0;
        if status != 200 || body["stored"].as_u64() != Some(LINES_PER_REPORT as u64) {
            bail!("a report of {} answered {status}: {body}", h.step);
        }
        out.push((begun, ms));
    }
    Ok(out)
}

/// Signs in to the console with a token, as its sign-in form does: the session cookie.
async fn console_session(base: &str, token: &str) -> Result<String> {
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
    let page = http.get(format!("{base}/signin")).send().await?;
    let pre: String =
        page.headers().get_all("set-cookie").iter().filter_map(|v| v.to_str().ok()).filter_map(|c| c.split(';').next()).collect::<Vec<_>>().join("; ");
    let html = page.text().await?;
    let at = html.find("name=\"_csrf\"").context("the sign-in page has a CSRF field")?;
    let rest = &html[at..];
    let rest = &rest[rest.find("value=\"").context("a CSRF value")? + 7..];
    let csrf = &rest[..rest.find('"').context("a CSRF value's end")?];
    let signed_in = http.post(format!("{base}/signin/token")).header("cookie", pre).form(&[("_csrf", csrf), ("token", token), ("next", "/")]).send().await?;
    signed_in
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| c.strip_prefix("shopfloor_session=").map(|v| format!("shopfloor_session={}", v.split(';').next().unwrap_or_default())))
        .context("signing in to the console made no session")
}

/// Follows one live transcript, recording each line's lag behind the moment its report was
/// sent (`sent=<ms>` in the line).
async fn follow(url: String, cookie: String, lags: Arc<Mutex<Vec<(Instant, f64)>>>) -> Result<()> {
    let http = reqwest::Client::new();
    let mut answer = http.get(&url).header("cookie", cookie).header("accept", "text/event-stream").send().await?.error_for_status()?;
    let mut buffer = String::new();
    while let Some(chunk) = answer.chunk().await? {
        let now = epoch_ms();
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            if let Some(sent) = event.split("sent=").nth(1).and_then(|s| s.split(' ').next()).and_then(|s| s.parse::<u128>().ok()) {
                lags.lock().await.push((Instant::now(), now.saturating_sub(sent) as f64));
            }
        }
    }
    Ok(())
}
