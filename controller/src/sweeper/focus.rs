//! Focus: which of a job's active runs a pass sweeps.
//!
//! Sweeping a run reads its lease (a GET), so a pass that sweeps every active run costs one
//! request per run. A job with many runs at once (`concurrencyPolicy: Allow`, long runs)
//! would pay for all of them on every pod cue, though a pod cue concerns one run. So:
//!
//! - a **full sweep** (every active run) happens at least every `min(sweep interval, ttl/3)`
//!   (the leases of pending pods are renewed, expired ones are found), and whenever the pass
//!   may decide something that depends on every run: a tick or a request is due, the spec
//!   changed, the concurrency policy is `Replace`, or the status lacks a run;
//! - **in between**, a pass sweeps only the runs whose pods were cues since the last sweep
//!   ([`Focus::cue`], fed by the controller's pod watch), and reports the other runs as the
//!   status last showed them; its requeue still aims at the next full sweep, so cues never
//!   postpone one;
//! - a run that is **quiet** ([`Focus::quiet`], from [`crate::run::quiet_until`]: its sidecar
//!   attached and renews, its pod lives) is left out of the full sweeps that are only due by
//!   the clock until its lease may have expired, unless one of its pods is a cue. Such a run
//!   can only end by its pod's end (a cue) or need a takeover, which is not possible before
//!   that time. A job whose active runs are all quiet is requeued for the first of their
//!   times, not for the sweep interval, so a long run costs a lease read per ttl, not one per
//!   sweep interval, and a lost one is taken over as soon as it may be.
//!
//! A controller that just started (or lost track: a relist of its pod watch) sweeps in full.
//! Nothing here decides anything about a run: a run left out of a pass is swept at the next
//! full sweep, or at its quiet time, as if the pass had not happened.
//!
//! ```
//! use std::time::Duration;
//! use chrono::{TimeZone, Utc};
//! use cojob_controller::sweeper::focus::{Focus, Plan};
//! let focus = Focus::default();
//! focus.start(); // the pod watch feeds it
//! let t0 = Utc.timestamp_opt(1_000, 0).unwrap();
//! let every = Duration::from_secs(10);
//! // Nothing known yet: every run.
//! assert_eq!(focus.plan(("ns", "job"), t0, every, false), Plan::All);
//! focus.swept_all(("ns", "job"), t0);
//! focus.cue(("ns", "job"), "job-1");
//! let soon = t0 + chrono::Duration::seconds(3);
//! assert_eq!(focus.plan(("ns", "job"), soon, every, false), Plan::Only(["job-1".to_string()].into()));
//! // Nothing cued since: no run.
//! assert_eq!(focus.plan(("ns", "job"), soon, every, false), Plan::Only(Default::default()));
//! // The full sweep is due, or the pass needs every run.
//! assert_eq!(focus.plan(("ns", "job"), t0 + chrono::Duration::seconds(10), every, false), Plan::All);
//! assert_eq!(focus.plan(("ns", "job"), soon, every, true), Plan::All);
//! ```

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// A job, by namespace and name.
pub type JobRef<'a> = (&'a str, &'a str);

/// Which runs a pass sweeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Every active run.
    All,
    /// A full sweep due by the clock: every active run but these, which are quiet until later
    /// and were not cued; they keep their last status.
    AllBut(BTreeSet<String>),
    /// Only these runs (those cued since the last sweep); the others keep their last status.
    Only(BTreeSet<String>),
}

#[derive(Default)]
struct JobFocus {
    /// When the last full sweep started (by the store's clock).
    swept_all_at: Option<DateTime<Utc>>,
    /// Runs whose pods were cues since they were last swept.
    cued: BTreeSet<String>,
    /// Runs that need no pass before these times unless cued.
    quiet: HashMap<String, DateTime<Utc>>,
}

/// Per job, when it was last swept in full and which runs were cued since. Cheap to clone
/// (shared). Until [`start`](Focus::start) (the controller's pod watch feeds it from then on),
/// every pass sweeps every run.
#[derive(Clone, Default)]
pub struct Focus {
    jobs: Arc<Mutex<HashMap<(String, String), JobFocus>>>,
    fed: Arc<AtomicBool>,
}

impl Focus {
    /// Notes that a pod of `run` was a cue for its job.
    pub fn cue(&self, job: JobRef<'_>, run: &str) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.entry(key(job))
                .or_default()
                .cued
                .insert(run.to_owned());
        }
    }

    /// Forgets what is known of `job`: its next pass sweeps in full.
    pub fn forget(&self, job: JobRef<'_>) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.remove(&key(job));
        }
    }

    /// Forgets every job: the pod watch starts (again) and feeds the cues from now on.
    pub fn start(&self) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.clear();
        }
        self.fed.store(true, Ordering::SeqCst);
    }

    /// Notes that `run` needs no pass before `until` unless one of its pods is a cue
    /// ([`crate::run::quiet_until`]); `None` forgets it, so full sweeps include it again.
    pub fn quiet(&self, job: JobRef<'_>, run: &str, until: Option<DateTime<Utc>>) {
        let Ok(mut jobs) = self.jobs.lock() else {
            return;
        };
        match until {
            Some(until) => {
                jobs.entry(key(job))
                    .or_default()
                    .quiet
                    .insert(run.to_owned(), until);
            }
            None => {
                if let Some(known) = jobs.get_mut(&key(job)) {
                    known.quiet.remove(run);
                }
            }
        }
    }

    /// The runs a pass of `job` at `now` sweeps: all of them when `needs_all` or when nothing
    /// is known of the job; when its last full sweep is `every` old, all but the runs quiet
    /// past `now` that were not cued; otherwise the runs cued since the last pass (taken: the
    /// pass sweeps them) and those whose quiet time has come.
    pub fn plan(
        &self,
        job: JobRef<'_>,
        now: DateTime<Utc>,
        every: Duration,
        needs_all: bool,
    ) -> Plan {
        if !self.fed.load(Ordering::SeqCst) {
            return Plan::All;
        }
        let Ok(mut jobs) = self.jobs.lock() else {
            return Plan::All;
        };
        let Some(known) = jobs.get_mut(&key(job)) else {
            return Plan::All;
        };
        let due = known
            .swept_all_at
            .is_none_or(|at| (now - at).to_std().unwrap_or_default() >= every);
        if needs_all || known.swept_all_at.is_none() {
            return Plan::All;
        }
        let cued = std::mem::take(&mut known.cued);
        if due {
            let skipped: BTreeSet<String> = known
                .quiet
                .iter()
                .filter(|(run, until)| **until > now && !cued.contains(*run))
                .map(|(run, _)| run.clone())
                .collect();
            return if skipped.is_empty() {
                Plan::All
            } else {
                Plan::AllBut(skipped)
            };
        }
        let woken = known
            .quiet
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(run, _)| run.clone());
        Plan::Only(cued.into_iter().chain(woken).collect())
    }

    /// Records a full sweep of `job` that started at `at`.
    pub fn swept_all(&self, job: JobRef<'_>, at: DateTime<Utc>) {
        if let Ok(mut jobs) = self.jobs.lock() {
            let known = jobs.entry(key(job)).or_default();
            known.swept_all_at = Some(at);
            known.cued.clear();
        }
    }

    /// How long until `job` needs its next pass for its `active` runs: the first of their
    /// quiet times when all of them are quiet, else the next full sweep (zero when nothing is
    /// known). Forgets the quiet times of runs that are no longer active.
    pub fn until_due<'r>(
        &self,
        job: JobRef<'_>,
        active: impl IntoIterator<Item = &'r str>,
        now: DateTime<Utc>,
        every: Duration,
    ) -> Duration {
        let Ok(mut jobs) = self.jobs.lock() else {
            return Duration::ZERO;
        };
        let Some(known) = jobs.get_mut(&key(job)) else {
            return Duration::ZERO;
        };
        let Some(at) = known.swept_all_at else {
            return Duration::ZERO;
        };
        let full = every.saturating_sub((now - at).to_std().unwrap_or_default());
        let active: BTreeSet<&str> = active.into_iter().collect();
        known.quiet.retain(|run, _| active.contains(run.as_str()));
        let mut next: Option<Duration> = None;
        for run in active {
            let wait = match known.quiet.get(run) {
                Some(until) if *until > now => (*until - now).to_std().unwrap_or_default(),
                _ => full,
            };
            next = Some(next.map_or(wait, |n| n.min(wait)));
        }
        next.unwrap_or(full)
    }
}

fn key((namespace, name): JobRef<'_>) -> (String, String) {
    (namespace.to_owned(), name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn a_full_sweep_comes_every_interval_whatever_the_cues() {
        let focus = Focus::default();
        focus.start();
        let job = ("ns", "j");
        let t0 = Utc.timestamp_opt(1_000, 0).unwrap();
        let every = Duration::from_secs(10);
        let at = |s: i64| t0 + chrono::Duration::seconds(s);
        focus.swept_all(job, t0);
        assert_eq!(
            focus.until_due(job, ["r"], at(4), every),
            Duration::from_secs(6)
        );
        for s in 1..10 {
            focus.cue(job, "r");
            assert_eq!(
                focus.plan(job, at(s), every, false),
                Plan::Only(["r".to_string()].into())
            );
        }
        assert_eq!(focus.plan(job, at(10), every, false), Plan::All);
        assert_eq!(focus.until_due(job, ["r"], at(12), every), Duration::ZERO);
        // A clock that went back is no reason to wait longer.
        focus.swept_all(job, at(20));
        assert_eq!(
            focus.plan(job, at(15), every, false),
            Plan::Only(BTreeSet::new())
        );
    }

    #[test]
    fn a_quiet_run_is_left_out_of_timed_sweeps_until_its_time() {
        let focus = Focus::default();
        focus.start();
        let job = ("ns", "j");
        let t0 = Utc.timestamp_opt(1_000, 0).unwrap();
        let every = Duration::from_secs(10);
        let at = |s: i64| t0 + chrono::Duration::seconds(s);
        let only = |runs: &[&str]| Plan::Only(runs.iter().map(|r| r.to_string()).collect());
        let but = |runs: &[&str]| Plan::AllBut(runs.iter().map(|r| r.to_string()).collect());
        focus.swept_all(job, t0);
        focus.quiet(job, "long", Some(at(45)));
        // One of two runs is quiet: the job is due at the full sweep, which leaves it out.
        assert_eq!(
            focus.until_due(job, ["long", "new"], at(2), every),
            Duration::from_secs(8)
        );
        assert_eq!(focus.plan(job, at(10), every, false), but(&["long"]));
        focus.swept_all(job, at(10));
        // Every run is quiet: the job is due at the first quiet time, not at the interval.
        focus.quiet(job, "new", Some(at(30)));
        assert_eq!(
            focus.until_due(job, ["long", "new"], at(10), every),
            Duration::from_secs(20)
        );
        // A cue sweeps its run whatever its quiet time.
        focus.cue(job, "long");
        assert_eq!(focus.plan(job, at(25), every, false), but(&["new"]));
        focus.swept_all(job, at(25));
        // A quiet time that came is swept by the next pass, even between full sweeps.
        assert_eq!(focus.plan(job, at(30), every, false), only(&["new"]));
        focus.quiet(job, "new", None);
        assert_eq!(
            focus.until_due(job, ["long", "new"], at(30), every),
            Duration::from_secs(5)
        );
        // A pass that needs every run reads every lease.
        assert_eq!(focus.plan(job, at(31), every, true), Plan::All);
        // A run that left the index is forgotten.
        assert_eq!(
            focus.until_due(job, ["new"], at(31), every),
            Duration::from_secs(4)
        );
        focus.swept_all(job, at(40));
        assert_eq!(
            focus.plan(job, at(50), every, false),
            Plan::All,
            "long is no longer known"
        );
        // Forgetting the job (a failed pass, a relist) forgets its quiet runs.
        focus.quiet(job, "new", Some(at(90)));
        focus.forget(job);
        focus.swept_all(job, at(60));
        assert_eq!(focus.plan(job, at(70), every, false), Plan::All);
    }

    #[test]
    fn without_a_pod_watch_every_pass_sweeps_every_run() {
        let focus = Focus::default();
        let t0 = Utc.timestamp_opt(1_000, 0).unwrap();
        focus.swept_all(("a", "j"), t0);
        assert_eq!(
            focus.plan(("a", "j"), t0, Duration::from_secs(10), false),
            Plan::All
        );
    }

    #[test]
    fn jobs_are_kept_apart_and_forgotten() {
        let focus = Focus::default();
        focus.start();
        let t0 = Utc.timestamp_opt(1_000, 0).unwrap();
        let every = Duration::from_secs(10);
        focus.swept_all(("a", "j"), t0);
        focus.swept_all(("b", "j"), t0);
        focus.cue(("a", "j"), "r1");
        assert_eq!(
            focus.plan(("b", "j"), t0, every, false),
            Plan::Only(BTreeSet::new())
        );
        focus.forget(("a", "j"));
        assert_eq!(focus.plan(("a", "j"), t0, every, false), Plan::All);
        focus.start();
        assert_eq!(focus.plan(("b", "j"), t0, every, false), Plan::All);
        assert_eq!(
            focus.until_due(("b", "j"), ["r"], t0, every),
            Duration::ZERO
        );
    }
}
