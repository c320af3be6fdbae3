//! Tick computation: which fire times of a schedule are due, which run and which are missed.
//!
//! Pure logic over a cron expression (5 fields, or 6 with leading seconds), an IANA time zone and
//! the policies of a `CoordinatedJob` (`startingDeadlineSeconds`, `catchUp`). Every fire time is
//! an instant in UTC; DST is the time zone's business:
//!
//! - **Gap** (the clock jumps forward): a local time that does not exist that day fires once, at
//!   the first instant after the gap. `30 2 * * *` in Europe/Paris fires at 03:00 local on the
//!   last Sunday of March, as Vixie cron runs jobs of the skipped hour right after the change
//!   (the behaviour of `croner`, which follows the Open Cron Pattern Specification).
//! - **Fold** (the clock goes back): a local time that happens twice fires once, at its first
//!   occurrence.
//!
//! Hourly and finer schedules keep firing through both: the instants are what count.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use std::time::Duration;

/// At most this many due ticks are considered in one pass; older ones are recorded as missed.
/// Like CronJob's 100-missed-schedules guard, it bounds the work after a long outage.
pub const MAX_DUE_TICKS: usize = 100;

/// How long a tick may wait to be started under `catchUp: None`.
pub const NO_CATCH_UP_GRACE: Duration = Duration::from_secs(60);

/// Why a schedule could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScheduleError {
    /// Not 5 fields, or 6 with leading seconds.
    #[error(
        "schedule {0:?} must have 5 fields (minute hour day month weekday) or 6 with leading seconds"
    )]
    FieldCount(String),
    /// The cron parser refused it.
    #[error("schedule {expr:?} is not a valid cron expression: {reason}")]
    Invalid {
        /// The expression.
        expr: String,
        /// The parser's message.
        reason: String,
    },
    /// Not an IANA time zone name.
    #[error("time zone {0:?} is not an IANA time zone name (like Europe/Paris or UTC)")]
    TimeZone(String),
}

/// What to do with ticks that fell due while the controller was not looking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CatchUp {
    /// Run only the most recent due tick; older ones are missed.
    #[default]
    Latest,
    /// Run every due tick, oldest first.
    All,
    /// Run a tick only if it is seen within [`NO_CATCH_UP_GRACE`]; everything else is missed.
    None,
}

/// Why a tick is recorded as missed rather than run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissReason {
    /// Seen later than `startingDeadlineSeconds` (or the `catchUp: None` grace) after its time.
    DeadlineExceeded,
    /// A newer due tick superseded it (`catchUp: Latest` or `None`).
    Superseded,
}

impl MissReason {
    /// A stable camelCase name, for status and claims.
    pub fn as_str(self) -> &'static str {
        match self {
            MissReason::DeadlineExceeded => "DeadlineExceeded",
            MissReason::Superseded => "Superseded",
        }
    }
}

/// The decision for the ticks due in one pass.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Ticks to run, oldest first.
    pub run: Vec<DateTime<Utc>>,
    /// Ticks to record as missed, with why.
    pub missed: Vec<(DateTime<Utc>, MissReason)>,
    /// When more than [`MAX_DUE_TICKS`] ticks were due, every tick in `(since, missed_before)` is
    /// missed too; the caller records that range once instead of tick by tick.
    pub missed_before: Option<DateTime<Utc>>,
    /// The next fire time after `now`, if any.
    pub next: Option<DateTime<Utc>>,
}

/// A parsed schedule in a time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    tz: Tz,
}

impl Schedule {
    /// Parses `expr` (5 fields, or 6 with leading seconds) in `time_zone` (default UTC).
    ///
    /// ```
    /// use cojob_controller::schedule::Schedule;
    /// let s = Schedule::parse("0 2 * * *", Some("Europe/Paris")).unwrap();
    /// let t = "2026-08-09T00:00:00Z".parse().unwrap();
    /// assert_eq!(s.next_after(t).unwrap().to_rfc3339(), "2026-08-10T00:00:00+00:00");
    /// assert!(Schedule::parse("0 2 * *", None).is_err());
    /// ```
    pub fn parse(expr: &str, time_zone: Option<&str>) -> Result<Schedule, ScheduleError> {
        let fields = expr.split_whitespace().count();
        if !(fields == 5 || fields == 6) || expr.contains('@') {
            return Err(ScheduleError::FieldCount(expr.to_string()));
        }
        let tz = match time_zone {
            None | Some("") => Tz::UTC,
            Some(name) => name
                .parse::<Tz>()
                .map_err(|_| ScheduleError::TimeZone(name.to_string()))?,
        };
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(expr)
            .map_err(|e| ScheduleError::Invalid {
                expr: expr.to_string(),
                reason: e.to_string(),
            })?;
        Ok(Schedule { cron, tz })
    }

    /// The shortest gap between consecutive fire times among the first `samples` after `t`
    /// (`None` when it fires fewer than twice).
    ///
    /// ```
    /// use cojob_controller::schedule::Schedule;
    /// use std::time::Duration;
    /// let t = "2026-08-09T00:00:00Z".parse().unwrap();
    /// let every_5s = Schedule::parse("*/5 * * * * *", None).unwrap();
    /// assert_eq!(every_5s.min_gap(t, 32), Some(Duration::from_secs(5)));
    /// let twice_an_hour = Schedule::parse("0,1 * * * *", None).unwrap();
    /// assert_eq!(twice_an_hour.min_gap(t, 32), Some(Duration::from_secs(60)));
    /// ```
    pub fn min_gap(&self, t: DateTime<Utc>, samples: usize) -> Option<std::time::Duration> {
        let mut prev = self.next_after(t)?;
        let mut least: Option<std::time::Duration> = None;
        for _ in 1..samples {
            let Some(next) = self.next_after(prev) else {
                break;
            };
            let gap = (next - prev).to_std().unwrap_or_default();
            least = Some(least.map_or(gap, |l| l.min(gap)));
            prev = next;
        }
        least
    }

    /// The first fire time strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&t.with_timezone(&self.tz), false)
            .ok()
            .map(|d| d.with_timezone(&Utc))
    }

    /// The last fire time at or before `t`.
    ///
    /// ```
    /// use cojob_controller::schedule::Schedule;
    /// let s = Schedule::parse("0 2 * * *", None).unwrap();
    /// let t = "2026-08-09T02:00:00Z".parse().unwrap();
    /// assert_eq!(s.at_or_before(t), Some(t));
    /// let later = "2026-08-09T03:00:00Z".parse().unwrap();
    /// assert_eq!(s.at_or_before(later), Some(t));
    /// ```
    pub fn at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_previous_occurrence(&t.with_timezone(&self.tz), true)
            .ok()
            .map(|d| d.with_timezone(&Utc))
    }

    /// Fire times in `(after, until]`, oldest first, at most `limit + 1` of them (so a caller can
    /// tell that more were due).
    pub fn ticks_between(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut cursor = after;
        while out.len() <= limit {
            match self.next_after(cursor) {
                Some(t) if t <= until => {
                    out.push(t);
                    cursor = t;
                }
                _ => break,
            }
        }
        out
    }

    /// The newest `n` fire times in `(after, until]`, oldest first.
    fn newest_ticks(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
        n: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut out = Vec::with_capacity(n);
        let mut cursor = until.with_timezone(&self.tz);
        let mut inclusive = true;
        while out.len() < n {
            match self.cron.find_previous_occurrence(&cursor, inclusive) {
                Ok(t) if t.with_timezone(&Utc) > after => {
                    out.push(t.with_timezone(&Utc));
                    cursor = t;
                    inclusive = false;
                }
                _ => break,
            }
        }
        out.reverse();
        out
    }

    /// Decides the ticks due in `(since, now]`: which to run and which to record as missed.
    ///
    /// `since` is the last tick already decided (or the object's creation time).
    pub fn plan(
        &self,
        since: DateTime<Utc>,
        now: DateTime<Utc>,
        starting_deadline: Option<Duration>,
        catch_up: CatchUp,
    ) -> Plan {
        let mut due = self.ticks_between(since, now, MAX_DUE_TICKS);
        let mut plan = Plan {
            next: self.next_after(now),
            ..Plan::default()
        };
        if due.len() > MAX_DUE_TICKS {
            // After a long outage, consider the newest MAX_DUE_TICKS ticks; the older ones are
            // missed as one range.
            due = self.newest_ticks(since, now, MAX_DUE_TICKS);
            plan.missed_before = due.first().copied();
        }
        let deadline = match (catch_up, starting_deadline) {
            (CatchUp::None, Some(d)) => Some(d.min(NO_CATCH_UP_GRACE)),
            (CatchUp::None, None) => Some(NO_CATCH_UP_GRACE),
            (_, d) => d,
        };
        let late = |t: &DateTime<Utc>| {
            deadline.is_some_and(|d| (now - *t).to_std().unwrap_or_default() > d)
        };
        let newest = due.last().copied();
        for t in due {
            if late(&t) {
                plan.missed.push((t, MissReason::DeadlineExceeded));
            } else if catch_up != CatchUp::All && Some(t) != newest {
                plan.missed.push((t, MissReason::Superseded));
            } else {
                plan.run.push(t);
            }
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn paris(expr: &str) -> Schedule {
        Schedule::parse(expr, Some("Europe/Paris")).unwrap()
    }

    #[test]
    fn parses_five_and_six_fields_only() {
        assert!(Schedule::parse("*/5 * * * *", None).is_ok());
        assert!(Schedule::parse("*/10 * * * * *", None).is_ok());
        for bad in [
            "* * * *",
            "0 0 0 * * * 2026",
            "@daily",
            "61 * * * *",
            "x * * * *",
            "",
        ] {
            assert!(Schedule::parse(bad, None).is_err(), "{bad:?}");
        }
        assert_eq!(
            Schedule::parse("0 2 * * *", Some("Mars/Olympus")).unwrap_err(),
            ScheduleError::TimeZone("Mars/Olympus".into())
        );
    }

    #[test]
    fn time_zone_shifts_fire_times() {
        let s = paris("0 2 * * *");
        // Summer: UTC+2, so 02:00 Paris is 00:00 UTC.
        assert_eq!(
            s.next_after(t("2026-08-08T12:00:00Z")),
            Some(t("2026-08-09T00:00:00Z"))
        );
        // Winter: UTC+1.
        assert_eq!(
            s.next_after(t("2026-12-08T12:00:00Z")),
            Some(t("2026-12-09T01:00:00Z"))
        );
    }

    #[test]
    fn dst_gap_fires_once_right_after_the_jump() {
        // 2026-03-29: Paris jumps from 02:00 to 03:00; 02:30 does not exist that day.
        let s = paris("30 2 * * *");
        let ticks = s.ticks_between(t("2026-03-27T12:00:00Z"), t("2026-03-30T12:00:00Z"), 10);
        assert_eq!(
            ticks,
            vec![
                t("2026-03-28T01:30:00Z"),
                t("2026-03-29T01:00:00Z"), // 03:00 CEST, the first instant after the gap
                t("2026-03-30T00:30:00Z"),
            ],
            "once a day, the 29th included"
        );
    }

    #[test]
    fn dst_fold_fires_a_repeated_local_time_once() {
        // 2026-10-25: Paris goes back from 03:00 to 02:00; 02:30 happens twice.
        let s = paris("30 2 * * *");
        let ticks = s.ticks_between(t("2026-10-24T12:00:00Z"), t("2026-10-26T12:00:00Z"), 10);
        assert_eq!(
            ticks,
            vec![t("2026-10-25T00:30:00Z"), t("2026-10-26T01:30:00Z")]
        );
    }

    #[test]
    fn hourly_schedules_follow_instants_through_dst() {
        let s = paris("0 * * * *");
        // The fold day has 25 hours, the gap day 23.
        let fold = s.ticks_between(t("2026-10-24T22:00:00Z"), t("2026-10-25T23:00:00Z"), 100);
        assert_eq!(fold.len(), 25);
        let gap = s.ticks_between(t("2026-03-28T23:00:00Z"), t("2026-03-29T22:00:00Z"), 100);
        assert_eq!(gap.len(), 23);
    }

    #[test]
    fn six_fields_fire_every_ten_seconds() {
        let s = Schedule::parse("*/10 * * * * *", None).unwrap();
        let ticks = s.ticks_between(t("2026-08-09T00:00:00Z"), t("2026-08-09T00:01:00Z"), 100);
        assert_eq!(ticks.len(), 6);
        assert_eq!(ticks[0], t("2026-08-09T00:00:10Z"));
    }

    #[test]
    fn latest_runs_the_newest_and_misses_the_rest() {
        let s = Schedule::parse("0 * * * *", None).unwrap();
        let p = s.plan(
            t("2026-08-09T00:00:00Z"),
            t("2026-08-09T03:10:00Z"),
            None,
            CatchUp::Latest,
        );
        assert_eq!(p.run, vec![t("2026-08-09T03:00:00Z")]);
        assert_eq!(
            p.missed,
            vec![
                (t("2026-08-09T01:00:00Z"), MissReason::Superseded),
                (t("2026-08-09T02:00:00Z"), MissReason::Superseded)
            ]
        );
        assert_eq!(p.next, Some(t("2026-08-09T04:00:00Z")));
    }

    #[test]
    fn all_runs_every_due_tick_within_the_deadline() {
        let s = Schedule::parse("0 * * * *", None).unwrap();
        let deadline = Some(Duration::from_secs(2 * 3600 + 30 * 60));
        let p = s.plan(
            t("2026-08-09T00:00:00Z"),
            t("2026-08-09T03:10:00Z"),
            deadline,
            CatchUp::All,
        );
        assert_eq!(
            p.run,
            vec![
                t("2026-08-09T01:00:00Z"),
                t("2026-08-09T02:00:00Z"),
                t("2026-08-09T03:00:00Z")
            ]
        );
        let tight = Some(Duration::from_secs(3600));
        let p = s.plan(
            t("2026-08-09T00:00:00Z"),
            t("2026-08-09T03:10:00Z"),
            tight,
            CatchUp::All,
        );
        assert_eq!(p.run, vec![t("2026-08-09T03:00:00Z")]);
        assert_eq!(
            p.missed
                .iter()
                .filter(|m| m.1 == MissReason::DeadlineExceeded)
                .count(),
            2
        );
    }

    #[test]
    fn deadline_is_exclusive_of_the_boundary() {
        let s = Schedule::parse("0 * * * *", None).unwrap();
        let d = Some(Duration::from_secs(600));
        let on_time = s.plan(
            t("2026-08-09T00:30:00Z"),
            t("2026-08-09T01:10:00Z"),
            d,
            CatchUp::Latest,
        );
        assert_eq!(on_time.run.len(), 1, "exactly at the deadline still runs");
        let late = s.plan(
            t("2026-08-09T00:30:00Z"),
            t("2026-08-09T01:10:01Z"),
            d,
            CatchUp::Latest,
        );
        assert_eq!(
            late.missed,
            vec![(t("2026-08-09T01:00:00Z"), MissReason::DeadlineExceeded)]
        );
    }

    #[test]
    fn none_runs_only_fresh_ticks() {
        let s = Schedule::parse("0 * * * *", None).unwrap();
        let fresh = s.plan(
            t("2026-08-09T00:30:00Z"),
            t("2026-08-09T01:00:30Z"),
            None,
            CatchUp::None,
        );
        assert_eq!(fresh.run, vec![t("2026-08-09T01:00:00Z")]);
        let stale = s.plan(
            t("2026-08-09T00:30:00Z"),
            t("2026-08-09T01:05:00Z"),
            None,
            CatchUp::None,
        );
        assert!(stale.run.is_empty());
        assert_eq!(
            stale.missed,
            vec![(t("2026-08-09T01:00:00Z"), MissReason::DeadlineExceeded)]
        );
    }

    #[test]
    fn a_long_outage_is_bounded() {
        let s = Schedule::parse("* * * * *", None).unwrap();
        let p = s.plan(
            t("2026-08-01T00:00:00Z"),
            t("2026-08-09T00:00:00Z"),
            None,
            CatchUp::All,
        );
        assert_eq!(p.run.len(), MAX_DUE_TICKS);
        assert_eq!(p.run.first(), Some(&t("2026-08-08T22:21:00Z")));
        assert_eq!(p.run.last(), Some(&t("2026-08-09T00:00:00Z")));
        assert_eq!(p.missed_before, Some(t("2026-08-08T22:21:00Z")));
        let latest = s.plan(
            t("2026-08-01T00:00:00Z"),
            t("2026-08-09T00:00:30Z"),
            None,
            CatchUp::Latest,
        );
        assert_eq!(latest.run, vec![t("2026-08-09T00:00:00Z")]);
        assert_eq!(latest.missed.len(), MAX_DUE_TICKS - 1);
    }
}
