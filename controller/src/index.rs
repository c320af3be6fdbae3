//! A job's index in the bucket: which ticks are decided, which runs are active, the recent
//! history and the counters.
//!
//! The index is a [`Doc`](cojob::Doc) updated by compare-and-swap, so two controllers that
//! decide the same ticks or finish the same runs count them once: every change is a pure
//! function of the stored index, and a change already present is not applied again. The
//! sweeper reads the active runs from here, never by listing the bucket. The CoordinatedJob's
//! status is a projection of this document.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::run::RunPhase;

/// What was decided for one tick: the value of its claim.
///
/// ```
/// use cojob_controller::index::Decision;
/// let d = Decision::RunId("nightly-1786240800".into());
/// assert_eq!(serde_json::to_string(&d).unwrap(), r#"{"run_id":"nightly-1786240800"}"#);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// The tick runs as this run.
    RunId(String),
    /// The tick was skipped (`Suspended`, `ConcurrencyForbid`).
    Skipped(String),
    /// The tick was missed (`DeadlineExceeded`, `Superseded`).
    Missed(String),
}

/// A run that has not reached a terminal phase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ActiveRun {
    /// The run id.
    pub run_id: String,
    /// Its tick, formatted (absent for a job without a schedule). For a manual run, the time
    /// its trigger was decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fire_time: Option<String>,
    /// The trigger key of a manual run (`cojob trigger`); absent for a tick's run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    /// The backfill that started this run of a past tick ([`crate::backfill`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backfill: Option<String>,
}

impl ActiveRun {
    /// Its fire time as a time (`None` without one, or if it does not parse).
    pub fn fire_at(&self) -> Option<DateTime<Utc>> {
        self.fire_time
            .as_deref()
            .and_then(|t| cojob::json::parse_time(t).ok())
    }

    /// What the run serves, as status and `cojob runs` show it: the tick, `once`, or
    /// `trigger/<key>`.
    pub fn tick_label(&self) -> String {
        tick_label(self.fire_time.as_deref(), self.trigger.as_deref())
    }
}

/// See [`ActiveRun::tick_label`].
fn tick_label(fire_time: Option<&str>, trigger: Option<&str>) -> String {
    match (trigger, fire_time) {
        (Some(key), _) => format!("trigger/{key}"),
        (None, Some(t)) => t.to_string(),
        (None, None) => "once".to_string(),
    }
}

impl FinishedRun {
    /// What the run served: the tick, `once`, or `trigger/<key>`.
    pub fn tick_label(&self) -> String {
        tick_label(self.fire_time.as_deref(), self.trigger.as_deref())
    }
}

/// A run that ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishedRun {
    /// The run id.
    pub run_id: String,
    /// Its tick, formatted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fire_time: Option<String>,
    /// The trigger key of a manual run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    /// Its terminal phase.
    pub status: RunPhase,
    /// The epoch of its last attempt.
    pub epoch: u64,
    /// Its last attempt number.
    pub attempt: u32,
    /// The main containers' exit code of the last attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

/// Totals since the job was created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Counters {
    /// Runs that succeeded.
    #[serde(default)]
    pub succeeded: u64,
    /// Runs that failed.
    #[serde(default)]
    pub failed: u64,
    /// Runs that were cancelled.
    #[serde(default)]
    pub cancelled: u64,
    /// Ticks skipped.
    #[serde(default)]
    pub skipped: u64,
    /// Ticks missed.
    #[serde(default)]
    pub missed: u64,
}

/// The index document. Unknown fields are refused: an object cojob did not write is reported
/// as corrupt, never rewritten.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct JobIndex {
    /// The newest tick decided, formatted; ticks up to it are never planned again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// The schedule and time zone the cursor was planned with (`"<expr> <zone>"`). When the
    /// spec's differ, the schedule was edited: the cursor moves to the time of the edit, so
    /// the new expression never fires for ticks before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// For a job without a schedule: whether its one decision was made.
    #[serde(default)]
    pub once_decided: bool,
    /// Active runs, oldest first.
    #[serde(default)]
    pub active: Vec<ActiveRun>,
    /// Recent finished runs, newest first, within the history limits.
    #[serde(default)]
    pub recent: Vec<FinishedRun>,
    /// Totals.
    #[serde(default)]
    pub counters: Counters,
    /// The trigger keys decided most recently, oldest first, at most [`MAX_TRIGGERS`]: a
    /// trigger's decision is recorded (and counted) once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub triggers: Vec<String>,
}

/// The history limits of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLimits {
    /// Succeeded (and cancelled) runs to keep.
    pub successful: usize,
    /// Failed runs to keep.
    pub failed: usize,
}

/// The most active runs an index may list; more means it was not written by cojob.
pub const MAX_ACTIVE: usize = 1000;
/// The most finished runs an index may keep.
pub const MAX_RECENT: usize = 1000;
/// The most trigger keys an index remembers (older ones are still decided once: their claims
/// stay in the bucket).
pub const MAX_TRIGGERS: usize = 200;

impl JobIndex {
    /// Checks what parsing cannot: at most [`MAX_ACTIVE`] active and [`MAX_RECENT`] finished
    /// runs, and every run id the one the layout gives `job` for its tick. An index that fails
    /// was not written by cojob for this job (planted, or another job's), and is left untouched.
    ///
    /// ```
    /// use cojob_controller::index::{ActiveRun, JobIndex};
    /// let mut index = JobIndex::default();
    /// index.active.push(ActiveRun { run_id: "nightly-once".into(), ..Default::default() });
    /// assert!(index.validate("nightly").is_ok());
    /// index.active.push(ActiveRun { run_id: "other-once".into(), ..Default::default() });
    /// assert!(index.validate("nightly").unwrap_err().contains("other-once"));
    /// ```
    pub fn validate(&self, job: &str) -> Result<(), String> {
        if self.active.len() > MAX_ACTIVE {
            return Err(format!(
                "{} active runs, more than {MAX_ACTIVE}",
                self.active.len()
            ));
        }
        if self.recent.len() > MAX_RECENT {
            return Err(format!(
                "{} finished runs, more than {MAX_RECENT}",
                self.recent.len()
            ));
        }
        if self.triggers.len() > MAX_TRIGGERS {
            return Err(format!(
                "{} trigger keys, more than {MAX_TRIGGERS}",
                self.triggers.len()
            ));
        }
        for key in &self.triggers {
            crate::layout::check_trigger_key(key)?;
        }
        let runs = self
            .active
            .iter()
            .map(|a| (&a.run_id, &a.fire_time, &a.trigger))
            .chain(
                self.recent
                    .iter()
                    .map(|f| (&f.run_id, &f.fire_time, &f.trigger)),
            );
        for (run_id, fire_time, trigger) in runs {
            if let Some(key) = trigger {
                crate::layout::check_trigger_key(key)?;
                let expected = crate::layout::trigger_run_id(job, key);
                if *run_id != expected {
                    return Err(format!(
                        "run id {run_id:?} is not the one of job {job} for trigger {key:?} ({expected:?})"
                    ));
                }
                continue;
            }
            let tick = match fire_time {
                Some(t) => Some(
                    cojob::json::parse_time(t)
                        .map_err(|e| format!("run {run_id}: tick {t:?}: {e}"))?,
                ),
                None => None,
            };
            let expected = crate::layout::run_id(job, tick);
            if *run_id != expected {
                return Err(format!(
                    "run id {run_id:?} is not the one of job {job} for its tick ({expected:?})"
                ));
            }
        }
        Ok(())
    }

    /// The cursor as a time.
    pub fn cursor_time(&self) -> Option<DateTime<Utc>> {
        self.cursor
            .as_deref()
            .and_then(|c| cojob::json::parse_time(c).ok())
    }

    /// Records the decisions of ticks, oldest first. Ticks at or before the cursor were
    /// recorded already (by us before a crash, or by another controller) and are ignored, so
    /// applying the same decisions twice changes nothing. `None` is the one tick of a job
    /// without a schedule.
    pub fn record_decisions(&mut self, decisions: &[(Option<DateTime<Utc>>, Decision)]) {
        for (tick, decision) in decisions {
            match tick {
                Some(t) => {
                    if self.cursor_time().is_some_and(|c| *t <= c) {
                        continue;
                    }
                    self.cursor = Some(cojob::json::format_time(*t));
                }
                None => {
                    if self.once_decided {
                        continue;
                    }
                    self.once_decided = true;
                }
            }
            match decision {
                Decision::RunId(run_id) => {
                    if !self.active.iter().any(|r| &r.run_id == run_id)
                        && !self.recent.iter().any(|r| &r.run_id == run_id)
                    {
                        self.active.push(ActiveRun {
                            run_id: run_id.clone(),
                            fire_time: tick.map(cojob::json::format_time),
                            ..ActiveRun::default()
                        });
                    }
                }
                Decision::Skipped(_) => self.counters.skipped += 1,
                Decision::Missed(_) => self.counters.missed += 1,
            }
        }
    }

    /// Records the decision of tick `tick` taken for backfill `id`. Such ticks are at or before
    /// the cursor, which [`record_decisions`](Self::record_decisions) leaves alone. A run
    /// becomes active unless it is known here or `ended` (its lease is terminal: it ran
    /// before); other decisions were counted when they were made.
    pub fn record_backfilled(
        &mut self,
        id: &str,
        tick: DateTime<Utc>,
        decision: &Decision,
        ended: bool,
    ) {
        let Decision::RunId(run_id) = decision else {
            return;
        };
        let known = self.active.iter().any(|r| &r.run_id == run_id)
            || self.recent.iter().any(|r| &r.run_id == run_id);
        if !known && !ended {
            self.active.push(ActiveRun {
                run_id: run_id.clone(),
                fire_time: Some(cojob::json::format_time(tick)),
                backfill: Some(id.to_string()),
                ..ActiveRun::default()
            });
        }
    }

    /// The active runs backfill `id` started.
    pub fn active_of_backfill(&self, id: &str) -> usize {
        self.active
            .iter()
            .filter(|r| r.backfill.as_deref() == Some(id))
            .count()
    }

    /// True when the decision of trigger `key` is recorded here.
    pub fn knows_trigger(&self, key: &str) -> bool {
        self.triggers.iter().any(|k| k == key)
    }

    /// Records the decision of trigger `key`, decided at `at`, once: a run becomes active
    /// (unless `ended`: its lease was found terminal, so it ran already and its record fell out
    /// of this index) and a skip is counted. Keys are remembered up to [`MAX_TRIGGERS`].
    pub fn record_trigger(
        &mut self,
        key: &str,
        decision: &Decision,
        at: DateTime<Utc>,
        ended: bool,
    ) {
        if self.knows_trigger(key) {
            return;
        }
        self.triggers.push(key.to_string());
        if self.triggers.len() > MAX_TRIGGERS {
            let excess = self.triggers.len() - MAX_TRIGGERS;
            self.triggers.drain(..excess);
        }
        match decision {
            Decision::RunId(run_id) => {
                let known = self.active.iter().any(|r| &r.run_id == run_id)
                    || self.recent.iter().any(|r| &r.run_id == run_id);
                if !known && !ended {
                    self.active.push(ActiveRun {
                        run_id: run_id.clone(),
                        fire_time: Some(cojob::json::format_time(at)),
                        trigger: Some(key.to_string()),
                        ..ActiveRun::default()
                    });
                }
            }
            Decision::Skipped(_) => self.counters.skipped += 1,
            Decision::Missed(_) => self.counters.missed += 1,
        }
    }

    /// Records the schedule the cursor follows. A different one than recorded is an edit: the
    /// cursor moves to `now` (never back), so only ticks after the edit are planned with it.
    /// Returns true when the schedule was edited.
    ///
    /// ```
    /// use cojob_controller::index::JobIndex;
    /// let now = "2026-08-09T02:00:00Z".parse().unwrap();
    /// let mut i = JobIndex::default();
    /// assert!(!i.record_schedule("0 * * * * UTC", now), "the first one is not an edit");
    /// assert!(i.cursor.is_none());
    /// assert!(i.record_schedule("*/5 * * * * UTC", now));
    /// assert_eq!(i.cursor_time(), Some(now));
    /// ```
    pub fn record_schedule(&mut self, fingerprint: &str, now: DateTime<Utc>) -> bool {
        let edited = self.schedule.as_deref().is_some_and(|s| s != fingerprint);
        if edited && self.cursor_time().is_none_or(|c| c < now) {
            self.cursor = Some(cojob::json::format_time(now));
        }
        self.schedule = Some(fingerprint.to_string());
        edited
    }

    /// Records that the cursor jumped over ticks that were never looked at (a long outage):
    /// one miss for the whole range.
    pub fn record_missed_range(&mut self, before: DateTime<Utc>) {
        if self.cursor_time().is_some_and(|c| before <= c) {
            return;
        }
        self.counters.missed += 1;
    }

    /// Moves finished runs from the active list to the history and counts them. Runs not in
    /// the active list were recorded already and are ignored. Returns the runs that fell out
    /// of the history limits (their pods can go).
    pub fn record_finished(
        &mut self,
        finished: &[FinishedRun],
        limits: HistoryLimits,
    ) -> Vec<FinishedRun> {
        for run in finished {
            let Some(pos) = self.active.iter().position(|a| a.run_id == run.run_id) else {
                continue;
            };
            self.active.remove(pos);
            match run.status {
                RunPhase::Succeeded => self.counters.succeeded += 1,
                RunPhase::Cancelled => self.counters.cancelled += 1,
                _ => self.counters.failed += 1,
            }
            self.recent.insert(0, run.clone());
        }
        let (mut kept_ok, mut kept_failed) = (0, 0);
        let mut dropped = Vec::new();
        self.recent.retain(|r| {
            let (count, limit) = if r.status == RunPhase::Failed {
                (&mut kept_failed, limits.failed)
            } else {
                (&mut kept_ok, limits.successful)
            };
            *count += 1;
            let keep = *count <= limit;
            if !keep {
                dropped.push(r.clone());
            }
            keep
        });
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn done(id: &str, status: RunPhase) -> FinishedRun {
        FinishedRun {
            run_id: id.into(),
            fire_time: None,
            trigger: None,
            status,
            epoch: 1,
            attempt: 1,
            exit_code: Some(0),
            finished_at: None,
        }
    }

    #[test]
    fn decisions_are_recorded_once_even_when_applied_twice() {
        let decisions = vec![
            (
                Some(t("2026-01-01T00:00:00Z")),
                Decision::Missed("Superseded".into()),
            ),
            (
                Some(t("2026-01-01T00:01:00Z")),
                Decision::RunId("j-1767225660".into()),
            ),
            (
                Some(t("2026-01-01T00:02:00Z")),
                Decision::Skipped("ConcurrencyForbid".into()),
            ),
        ];
        let mut index = JobIndex::default();
        index.record_decisions(&decisions);
        let once = index.clone();
        index.record_decisions(&decisions);
        assert_eq!(index, once);
        assert_eq!(index.active.len(), 1);
        assert_eq!((index.counters.missed, index.counters.skipped), (1, 1));
        assert_eq!(index.cursor.as_deref(), Some("2026-01-01T00:02:00.000000Z"));
    }

    #[test]
    fn a_trigger_is_recorded_once_and_an_ended_run_is_not_active_again() {
        let at = t("2026-01-01T00:00:00Z");
        let run = crate::layout::trigger_run_id("j", "k1");
        let mut index = JobIndex::default();
        index.record_trigger("k1", &Decision::RunId(run.clone()), at, false);
        index.record_trigger("k1", &Decision::RunId(run.clone()), at, false);
        assert_eq!(index.active.len(), 1);
        assert_eq!(index.active[0].tick_label(), "trigger/k1");
        assert!(index.validate("j").is_ok());
        index.record_trigger(
            "k2",
            &Decision::Skipped("ConcurrencyForbid".into()),
            at,
            false,
        );
        index.record_trigger(
            "k2",
            &Decision::Skipped("ConcurrencyForbid".into()),
            at,
            false,
        );
        assert_eq!(index.counters.skipped, 1);
        let old = crate::layout::trigger_run_id("j", "k3");
        index.record_trigger("k3", &Decision::RunId(old), at, true);
        assert_eq!(
            index.active.len(),
            1,
            "a run that ended is not active again"
        );
        for i in 0..MAX_TRIGGERS + 5 {
            index.record_trigger(&format!("s{i}"), &Decision::Skipped("x".into()), at, false);
        }
        assert_eq!(index.triggers.len(), MAX_TRIGGERS);
        assert!(!index.knows_trigger("k1") && index.knows_trigger("s5"));
        // A trigger run under another job's id is not cojob's.
        index.active[0].run_id = crate::layout::trigger_run_id("other", "k1");
        assert!(index.validate("j").unwrap_err().contains("trigger"));
    }

    #[test]
    fn the_single_decision_of_an_unscheduled_job_is_recorded_once() {
        let mut index = JobIndex::default();
        index.record_decisions(&[(None, Decision::RunId("j-once".into()))]);
        index.record_decisions(&[(None, Decision::RunId("j-once".into()))]);
        assert!(index.once_decided);
        assert_eq!(index.active.len(), 1);
        // Finished, then a late duplicate decision: not active again.
        index.record_finished(
            &[done("j-once", RunPhase::Succeeded)],
            HistoryLimits {
                successful: 3,
                failed: 1,
            },
        );
        index.once_decided = false;
        index.record_decisions(&[(None, Decision::RunId("j-once".into()))]);
        assert!(index.active.is_empty());
    }

    #[test]
    fn finished_runs_are_counted_once_and_history_is_trimmed_per_outcome() {
        let mut index = JobIndex::default();
        let ids = ["a", "b", "c", "d", "e"];
        for id in ids {
            index.active.push(ActiveRun {
                run_id: id.into(),
                ..ActiveRun::default()
            });
        }
        let limits = HistoryLimits {
            successful: 2,
            failed: 1,
        };
        let finished = vec![
            done("a", RunPhase::Succeeded),
            done("b", RunPhase::Failed),
            done("c", RunPhase::Succeeded),
            done("d", RunPhase::Failed),
            done("e", RunPhase::Succeeded),
        ];
        let dropped = index.record_finished(&finished, limits);
        let again = index.record_finished(&finished, limits);
        assert!(again.is_empty());
        assert_eq!((index.counters.succeeded, index.counters.failed), (3, 2));
        let kept: Vec<&str> = index.recent.iter().map(|r| r.run_id.as_str()).collect();
        assert_eq!(kept, ["e", "d", "c"]);
        let gone: Vec<&str> = dropped.iter().map(|r| r.run_id.as_str()).collect();
        assert_eq!(gone, ["b", "a"]);
        assert!(index.active.is_empty());
    }
}
