//! Cron arithmetic for `on.schedule`: the ticks of a cron expression in a time zone.
//!
//! Expressions have five fields, or six with seconds first (croner's optional seconds); the
//! time zone is an IANA name (UTC when absent). Ticks are computed in the zone, so
//! `0 9 * * 1-5` in `Europe/Paris` is 09:00 Paris time across daylight-saving changes, and
//! returned in UTC for storage. The store (`store::schedules`) keeps each workflow's next tick
//! as a durable row that engines wake on.
//!
//! # A schedule ticks
//!
//! Uploading a version with `on.schedule` writes the workflow's `schedules` row with its next
//! tick and tells the engines' timers. At the tick an engine claims the row, fires the latest
//! tick at or before now (after downtime: only that one), one trigger event per connected
//! repository with the dedup key `[workflow, repository, scheduled_at]` and a run for each new
//! key, and moves `next_at` to the first tick after now, in one transaction.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;

/// A parsed schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    tz: Tz,
}

impl Schedule {
    /// Parses a cron expression and an optional time zone name.
    ///
    /// # Errors
    /// A message when either does not parse (validation refuses such workflows already).
    pub fn parse(cron: &str, tz: Option<&str>) -> Result<Schedule, String> {
        let parsed = Cron::from_str(cron).map_err(|e| format!("`{cron}` is not a cron expression: {e}"))?;
        let tz = match tz {
            Some(name) => name.parse::<Tz>().map_err(|_| format!("`{name}` is not a time zone"))?,
            None => Tz::UTC,
        };
        Ok(Schedule { cron: parsed, tz })
    }

    /// The first tick strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron.find_next_occurrence(&t.with_timezone(&self.tz), false).ok().map(|d| d.with_timezone(&Utc))
    }

    /// The latest tick at or before `t`: after downtime, the one missed tick that fires.
    pub fn latest_at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron.find_previous_occurrence(&t.with_timezone(&self.tz), true).ok().map(|d| d.with_timezone(&Utc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn ticks_are_computed_in_the_time_zone() {
        let s = Schedule::parse("0 9 * * 1-5", Some("Europe/Paris")).unwrap();
        // Friday 2025-01-03 10:00 Paris (09:00 UTC) → Monday 09:00 Paris = 08:00 UTC.
        assert_eq!(s.next_after(at("2025-01-03T09:00:00Z")), Some(at("2025-01-06T08:00:00Z")));
        // In summer Paris is UTC+2.
        assert_eq!(s.next_after(at("2025-07-01T00:00:00Z")), Some(at("2025-07-01T07:00:00Z")));
    }

    #[test]
    fn the_latest_missed_tick_is_found_and_seconds_are_optional() {
        let s = Schedule::parse("*/2 * * * * *", None).unwrap();
        assert_eq!(s.latest_at_or_before(at("2025-01-01T00:00:07.500Z")), Some(at("2025-01-01T00:00:06Z")));
        assert_eq!(s.latest_at_or_before(at("2025-01-01T00:00:06Z")), Some(at("2025-01-01T00:00:06Z")));
        assert_eq!(s.next_after(at("2025-01-01T00:00:06Z")), Some(at("2025-01-01T00:00:08Z")));
        let hourly = Schedule::parse("0 * * * *", None).unwrap();
        assert_eq!(hourly.latest_at_or_before(at("2025-01-01T10:59:59Z")), Some(at("2025-01-01T10:00:00Z")));
        assert!(Schedule::parse("not cron", None).is_err());
        assert!(Schedule::parse("* * * * *", Some("Mars/Olympus")).is_err());
    }
}
