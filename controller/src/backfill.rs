//! Backfill: running the ticks of a past range, each at most once.
//!
//! A backfill is asked for with the annotation `backfill.cojob.dev/<id>` (`cojob backfill`),
//! whose value is a [`BackfillRequest`]. Its progress is a document in the bucket,
//! `backfills/<id>` ([`BackfillProgress`]), so a backfill resumes where it stopped after any
//! interruption. Each tick of the range is claimed at the same key the schedule uses
//! (`ticks/<time>`): a tick already decided, by the schedule or an earlier backfill, keeps its
//! decision and never runs again; a tick nobody decided runs as the same run id the schedule
//! would have given it. At most `parallelism` of the backfill's runs are active at once.
//! Ticks after the job's cursor are the schedule's own and are left to it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::schedule::Schedule;

/// The most ticks one backfill may cover.
pub const MAX_TICKS: usize = 1000;
/// The most runs of one backfill active at once.
pub const MAX_PARALLELISM: u32 = 32;

/// What the annotation asks for.
///
/// ```
/// use cojob_controller::backfill::BackfillRequest;
/// let r = BackfillRequest::parse(r#"{"from":"2026-08-01T00:00:00Z","to":"2026-08-02T00:00:00Z","parallelism":2}"#).unwrap();
/// assert_eq!(r.parallelism, 2);
/// assert!(BackfillRequest::parse(r#"{"from":"2026-08-02T00:00:00Z","to":"2026-08-01T00:00:00Z"}"#).is_err());
/// assert!(BackfillRequest::parse("yesterday").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackfillRequest {
    /// The first tick time of the range (inclusive).
    pub from: DateTime<Utc>,
    /// The last tick time of the range (inclusive).
    pub to: DateTime<Utc>,
    /// How many of its runs may be active at once (1 to [`MAX_PARALLELISM`]).
    #[serde(default = "one")]
    pub parallelism: u32,
}

fn one() -> u32 {
    1
}

impl BackfillRequest {
    /// Parses and checks an annotation value.
    pub fn parse(value: &str) -> Result<BackfillRequest, String> {
        let r: BackfillRequest = serde_json::from_str(value).map_err(|e| {
            format!(
                r#"{e}; expected {{"from": "<RFC 3339>", "to": "<RFC 3339>", "parallelism": N}}"#
            )
        })?;
        if r.from > r.to {
            return Err(format!("from {} is after to {}", r.from, r.to));
        }
        if !(1..=MAX_PARALLELISM).contains(&r.parallelism) {
            return Err(format!(
                "parallelism {} is not between 1 and {MAX_PARALLELISM}",
                r.parallelism
            ));
        }
        Ok(r)
    }

    /// The annotation value of this request.
    pub fn to_value(&self) -> String {
        serde_json::json!({
            "from": cojob::json::format_time(self.from),
            "to": cojob::json::format_time(self.to),
            "parallelism": self.parallelism,
        })
        .to_string()
    }
}

/// A backfill's progress, stored at `backfills/<id>` and changed by compare-and-swap.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackfillProgress {
    /// The request, as first seen (a later, different annotation value does not change it).
    pub request: BackfillRequest,
    /// The newest tick of the range decided so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<DateTime<Utc>>,
    /// Ticks this backfill ran (it won their claim).
    #[serde(default)]
    pub ran: u64,
    /// Ticks that were decided before (by the schedule or another backfill): never re-run.
    #[serde(default)]
    pub already_decided: u64,
    /// True once every tick is decided and every run it started has ended.
    #[serde(default)]
    pub done: bool,
}

impl BackfillProgress {
    /// A backfill not started yet.
    pub fn new(request: BackfillRequest) -> BackfillProgress {
        BackfillProgress {
            request,
            cursor: None,
            ran: 0,
            already_decided: 0,
            done: false,
        }
    }

    /// The next ticks to decide: after the cursor, within the range and at or before `limit`
    /// (the job's own cursor: later ticks are the schedule's), at most `room` of them.
    pub fn next_ticks(
        &self,
        schedule: &Schedule,
        limit: DateTime<Utc>,
        room: usize,
    ) -> Vec<DateTime<Utc>> {
        let until = self.request.to.min(limit);
        let after = match self.cursor {
            Some(c) => c,
            // `ticks_between` excludes its start: begin just before `from`.
            None => self.request.from - chrono::Duration::microseconds(1),
        };
        let mut ticks = schedule.ticks_between(after, until, room);
        ticks.truncate(room);
        ticks
    }

    /// True when no tick of the range at or before `limit` is left to decide.
    pub fn all_decided(&self, schedule: &Schedule, limit: DateTime<Utc>) -> bool {
        self.next_ticks(schedule, limit, 1).is_empty()
    }
}

/// How many ticks the range holds (up to [`MAX_TICKS`] + 1, so a caller can tell it is too
/// many).
pub fn count_ticks(schedule: &Schedule, request: &BackfillRequest) -> usize {
    let after = request.from - chrono::Duration::microseconds(1);
    schedule.ticks_between(after, request.to, MAX_TICKS).len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn ticks_come_in_order_from_the_range_within_the_limit_and_the_room() {
        let schedule = Schedule::parse("0 * * * *", None).unwrap();
        let request = BackfillRequest {
            from: t("2026-08-01T00:00:00Z"),
            to: t("2026-08-01T05:00:00Z"),
            parallelism: 2,
        };
        assert_eq!(count_ticks(&schedule, &request), 6, "both ends inclusive");
        let mut p = BackfillProgress::new(request);
        let first = p.next_ticks(&schedule, t("2026-08-02T00:00:00Z"), 2);
        assert_eq!(
            first,
            vec![t("2026-08-01T00:00:00Z"), t("2026-08-01T01:00:00Z")]
        );
        p.cursor = Some(first[1]);
        let limit = t("2026-08-01T03:30:00Z");
        assert_eq!(
            p.next_ticks(&schedule, limit, 5),
            vec![t("2026-08-01T02:00:00Z"), t("2026-08-01T03:00:00Z")],
            "not past the job's cursor"
        );
        p.cursor = Some(t("2026-08-01T03:00:00Z"));
        assert!(p.all_decided(&schedule, limit));
        assert!(!p.all_decided(&schedule, t("2026-08-09T00:00:00Z")));
    }
}
