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
//! - a run that is **quiet** ([`Focus::quiet`], from [`crate::run::quiet_until`]: its pod
//!   lives and nothing is asked of it) is left out of the full sweeps that are only due by the
//!   clock until a step may be due, unless one of its pods is a cue. A running attempt (its
//!   sidecar renews) can only end by its pod's end (a cue) or need a takeover, which is not
//!   possible before its lease's deadline plus the skew allowance. A pending attempt (its
//!   workload has not started) needs the controller at its start deadline, when its pending
//!   lease is due for renewal, or once its sidecar attached, which its workload's start tells
//!   (a cue; without it, a ttl after the pass, unless no kubelet has taken its pod up for a
//!   while: then its taking it up is a cue). A job whose active runs are all quiet is
//!   requeued for the first of their times, not for the sweep interval, so a long run costs a
//!   lease read per ttl, not one per sweep interval, a pod that waits for a node costs one
//!   per renewal of its pending lease, and a lost run is taken over as soon as it may be. The
//!   pass that made a run quiet notes how it reported the run (its epoch and phase): a full
//!   sweep leaves the run out only while the job's status shows it so.
//!
//! A job with **no active run** and nothing due has nothing to sweep: a pass that read its index,
//! left it so and wrote the job's status notes when, and the object's resource version after that
//! write ([`Focus::idle`]). Until a cue, a forget or the next plan, [`Focus::idle_since`] gives
//! that time to a pass that sees the object at that same version (nothing changed it since, not
//! even another replica), and such a pass may leave the bucket unread (`reconcile`).
//!
//! A controller that just started (or lost track: a relist of its pod watch, from its start to
//! its end) sweeps in full, and what a pass learnt is recorded only if nothing was forgotten
//! since it began ([`Token`]).
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
//! let token = focus.token(("ns", "job")); // taken by a pass before its plan
//! focus.swept_all(("ns", "job"), token, t0);
//! focus.cue(("ns", "job"), "job-1");
//! let soon = t0 + chrono::Duration::seconds(3);
//! assert_eq!(focus.plan(("ns", "job"), soon, every, false), Plan::Only(["job-1".to_string()].into()));
//! // Nothing cued since: no run.
//! assert_eq!(focus.plan(("ns", "job"), soon, every, false), Plan::Only(Default::default()));
//! // The full sweep is due, or the pass needs every run.
//! assert_eq!(focus.plan(("ns", "job"), t0 + chrono::Duration::seconds(10), every, false), Plan::All);
//! assert_eq!(focus.plan(("ns", "job"), soon, every, true), Plan::All);
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::run::RunPhase;

/// A job, by namespace and name.
pub type JobRef<'a> = (&'a str, &'a str);

/// Which runs a pass sweeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Every active run.
    All,
    /// A full sweep due by the clock: every active run but these, which are quiet until later
    /// and were not cued; they keep their last status if it shows them as their quiet pass
    /// reported them.
    AllBut(BTreeMap<String, Quiet>),
    /// Only these runs (those cued since the last sweep); the others keep their last status.
    Only(BTreeSet<String>),
}

#[derive(Default)]
struct JobFocus {
    /// Which life of the job's entry this is: [`Focus::forget`] and [`Focus::start`] begin a
    /// new one, and what a pass planned in an older one learnt is not recorded.
    generation: u64,
    /// When the last full sweep started (by the store's clock).
    swept_all_at: Option<DateTime<Utc>>,
    /// Runs whose pods were cues since a pass last took them.
    cued: BTreeSet<String>,
    /// Runs that need no pass before their times unless cued.
    quiet: HashMap<String, Quiet>,
    /// When the last pass read the job's index and left the job without an active run, and
    /// the object's resource version once that pass wrote its status; cleared by the next plan.
    idle: Option<(DateTime<Utc>, String)>,
}

/// A run that needs no pass before `until` unless one of its pods is a cue
/// ([`crate::run::quiet_until`]), and how the pass that found it so reported it: a status that
/// shows the run at another epoch or phase is older than that pass (the job cache may lag the
/// controller's own status write), so a pass that reads it sweeps the run rather than copy it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quiet {
    /// Until when.
    pub until: DateTime<Utc>,
    /// The lease's epoch the pass read.
    pub epoch: u64,
    /// The run's phase the pass reported.
    pub phase: RunPhase,
}

/// What a pass knew of its job's focus when it began ([`Focus::token`]); what it learnt is
/// recorded only if nothing was forgotten since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token(u64);

/// Per job, when it was last swept in full, which runs were cued since and which are quiet.
/// Cheap to clone (shared). Until [`start`](Focus::start) (the controller's pod watch feeds it
/// from then on, once its listing is complete) and from [`stop`](Focus::stop) (it lists
/// again), every pass sweeps every run and no run is quiet.
#[derive(Clone, Default)]
pub struct Focus {
    jobs: Arc<Mutex<HashMap<(String, String), JobFocus>>>,
    fed: Arc<AtomicBool>,
    generations: Arc<AtomicU64>,
}

impl Focus {
    fn entry<'a>(
        &self,
        jobs: &'a mut HashMap<(String, String), JobFocus>,
        job: JobRef<'_>,
    ) -> &'a mut JobFocus {
        jobs.entry(key(job)).or_insert_with(|| JobFocus {
            generation: self.generations.fetch_add(1, Ordering::SeqCst) + 1,
            ..JobFocus::default()
        })
    }

    /// Notes that a pod of `run` was a cue for its job.
    pub fn cue(&self, job: JobRef<'_>, run: &str) {
        if let Ok(mut jobs) = self.jobs.lock() {
            self.entry(&mut jobs, job).cued.insert(run.to_owned());
        }
    }

    /// Forgets what is known of `job`: its next pass sweeps in full, and what a pass that
    /// began before learns is not recorded.
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

    /// Forgets every job until [`start`](Self::start): the pod watch lists again, and a pod
    /// that changed meanwhile may not be in the cache yet, so every pass sweeps every run and
    /// no run is quiet.
    pub fn stop(&self) {
        self.fed.store(false, Ordering::SeqCst);
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.clear();
        }
    }

    /// Taken by a pass before its [`plan`](Self::plan), and given back with what it learnt
    /// ([`quiet`](Self::quiet), [`swept_all`](Self::swept_all)).
    pub fn token(&self, job: JobRef<'_>) -> Token {
        match self.jobs.lock() {
            Ok(mut jobs) => Token(self.entry(&mut jobs, job).generation),
            Err(_) => Token(0),
        }
    }

    /// Notes that `run` needs no pass before `quiet.until` unless one of its pods is a cue
    /// ([`crate::run::quiet_until`]), as a pass that began with `token` found; `None`, a
    /// cue that came meanwhile (the pass may have seen its pods before it), a token older than
    /// the last [`forget`](Self::forget) or a pod watch that is listing forgets it, so full
    /// sweeps include it again.
    pub fn quiet(&self, job: JobRef<'_>, token: Token, run: &str, quiet: Option<Quiet>) {
        let Ok(mut jobs) = self.jobs.lock() else {
            return;
        };
        let Some(known) = jobs.get_mut(&key(job)) else {
            return;
        };
        let fed = self.fed.load(Ordering::SeqCst);
        match quiet {
            Some(quiet) if fed && known.generation == token.0 && !known.cued.contains(run) => {
                known.quiet.insert(run.to_owned(), quiet);
            }
            _ => {
                known.quiet.remove(run);
            }
        }
    }

    /// Forgets that `run` was quiet: the next full sweep includes it (a cancel was asked).
    pub fn wake(&self, job: JobRef<'_>, run: &str) {
        if let Ok(mut jobs) = self.jobs.lock()
            && let Some(known) = jobs.get_mut(&key(job))
        {
            known.quiet.remove(run);
        }
    }

    /// The runs a pass of `job` at `now` sweeps: all of them when `needs_all` or when nothing
    /// is known of the job; when its last full sweep is `every` old, all but the runs quiet
    /// past `now` that were not cued; otherwise the runs cued since the last pass and those
    /// whose quiet time has come. The cues are taken: the pass sweeps their runs.
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
        let cued = std::mem::take(&mut known.cued);
        known.idle = None; // this pass says again, as it ends
        let Some(at) = known.swept_all_at else {
            return Plan::All;
        };
        if needs_all {
            return Plan::All;
        }
        if (now - at).to_std().unwrap_or_default() >= every {
            let skipped: BTreeMap<String, Quiet> = known
                .quiet
                .iter()
                .filter(|(run, q)| q.until > now && !cued.contains(*run))
                .map(|(run, q)| (run.clone(), *q))
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
            .filter(|(_, q)| q.until <= now)
            .map(|(run, _)| run.clone());
        Plan::Only(cued.into_iter().chain(woken).collect())
    }

    /// Records a full sweep of `job` that started at `at`, by a pass that began with `token`.
    pub fn swept_all(&self, job: JobRef<'_>, token: Token, at: DateTime<Utc>) {
        if let Ok(mut jobs) = self.jobs.lock()
            && let Some(known) = jobs.get_mut(&key(job))
            && known.generation == token.0
        {
            known.swept_all_at = Some(at);
        }
    }

    /// Notes that a pass that began with `token` read the job's index at `at`, left the job
    /// without an active run, every step done, and wrote its status, after which the object
    /// was at resource version `version`. Not recorded over a forget, a cue that came during
    /// the pass, or a pod watch that is listing. The job has no run left to be quiet.
    pub fn idle(&self, job: JobRef<'_>, token: Token, at: DateTime<Utc>, version: &str) {
        let fed = self.fed.load(Ordering::SeqCst);
        if let Ok(mut jobs) = self.jobs.lock()
            && let Some(known) = jobs.get_mut(&key(job))
            && fed
            && known.generation == token.0
            && known.cued.is_empty()
        {
            known.idle = Some((at, version.to_owned()));
            known.quiet.clear();
        }
    }

    /// When a pass last found `job` idle ([`idle`](Self::idle)), if nothing happened to it
    /// since: no pod cue, no forget, no pass planned, no relist of the pod watch, and the
    /// object is still at the resource version that pass left it at (`version`, as the job
    /// cache has it now).
    ///
    /// ```
    /// use chrono::{TimeZone, Utc};
    /// use cojob_controller::sweeper::focus::Focus;
    /// let focus = Focus::default();
    /// focus.start();
    /// let t0 = Utc.timestamp_opt(1_000, 0).unwrap();
    /// let token = focus.token(("ns", "job"));
    /// focus.idle(("ns", "job"), token, t0, "41");
    /// assert_eq!(focus.idle_since(("ns", "job"), "41"), Some(t0));
    /// assert_eq!(focus.idle_since(("ns", "job"), "42"), None, "the object changed");
    /// focus.cue(("ns", "job"), "job-1"); // a pod of the job changed
    /// assert_eq!(focus.idle_since(("ns", "job"), "41"), None);
    /// ```
    pub fn idle_since(&self, job: JobRef<'_>, version: &str) -> Option<DateTime<Utc>> {
        if !self.fed.load(Ordering::SeqCst) {
            return None;
        }
        let jobs = self.jobs.lock().ok()?;
        let known = jobs.get(&key(job))?;
        if !known.cued.is_empty() || !known.quiet.is_empty() {
            return None;
        }
        let (at, seen) = known.idle.as_ref()?;
        (seen == version).then_some(*at)
    }

    /// What is recorded of the job's last idle pass, whatever happened since.
    #[cfg(test)]
    fn recorded_idle(&self, job: JobRef<'_>) -> Option<DateTime<Utc>> {
        let jobs = self.jobs.lock().ok()?;
        jobs.get(&key(job))?.idle.as_ref().map(|(at, _)| *at)
    }

    /// How long until `job` needs its next pass for its `active` runs: the first of their
    /// quiet times when all of them are quiet (zero for one whose time has come), else the
    /// next full sweep (zero when nothing is known). Forgets the quiet times of runs that are
    /// no longer active.
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
                Some(q) => (q.until - now).to_std().unwrap_or_default(),
                None => full,
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

    const JOB: JobRef<'static> = ("ns", "j");

    /// A focus fed by a pod watch, the job the tests plan for, and a 10 s sweep interval.
    fn fed() -> (Focus, JobRef<'static>, Duration) {
        let focus = Focus::default();
        focus.start();
        (focus, JOB, Duration::from_secs(10))
    }

    fn t0() -> DateTime<Utc> {
        Utc.timestamp_opt(1_000, 0).unwrap()
    }

    /// `s` seconds after [`t0`].
    fn at(s: i64) -> DateTime<Utc> {
        t0() + chrono::Duration::seconds(s)
    }

    /// Quiet until `s` seconds after [`t0`], as a running attempt of epoch 1.
    fn q(s: i64) -> Quiet {
        Quiet {
            until: at(s),
            epoch: 1,
            phase: RunPhase::Running,
        }
    }

    #[test]
    fn a_full_sweep_comes_every_interval_whatever_the_cues() {
        let (focus, job, every) = fed();
        focus.swept_all(job, focus.token(job), at(0));
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
        focus.swept_all(job, focus.token(job), at(20));
        assert_eq!(
            focus.plan(job, at(15), every, false),
            Plan::Only(BTreeSet::new())
        );
    }

    #[test]
    fn a_quiet_run_is_left_out_of_timed_sweeps_until_its_time() {
        let (focus, job, every) = fed();
        let only = |runs: &[&str]| Plan::Only(runs.iter().map(|r| r.to_string()).collect());
        let but = |runs: &[(&str, i64)]| {
            Plan::AllBut(runs.iter().map(|(r, s)| (r.to_string(), q(*s))).collect())
        };
        focus.swept_all(job, focus.token(job), at(0));
        focus.quiet(job, focus.token(job), "long", Some(q(45)));
        // One of two runs is quiet: the job is due at the full sweep, which leaves it out.
        assert_eq!(
            focus.until_due(job, ["long", "new"], at(2), every),
            Duration::from_secs(8)
        );
        assert_eq!(focus.plan(job, at(10), every, false), but(&[("long", 45)]));
        focus.swept_all(job, focus.token(job), at(10));
        // Every run is quiet: the job is due at the first quiet time, not at the interval.
        focus.quiet(job, focus.token(job), "new", Some(q(30)));
        assert_eq!(
            focus.until_due(job, ["long", "new"], at(10), every),
            Duration::from_secs(20)
        );
        // A cue sweeps its run whatever its quiet time.
        focus.cue(job, "long");
        assert_eq!(focus.plan(job, at(25), every, false), but(&[("new", 30)]));
        focus.swept_all(job, focus.token(job), at(25));
        // A quiet time that came is swept by the next pass, even between full sweeps.
        assert_eq!(focus.plan(job, at(30), every, false), only(&["new"]));
        focus.quiet(job, focus.token(job), "new", None);
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
        focus.swept_all(job, focus.token(job), at(40));
        assert_eq!(
            focus.plan(job, at(50), every, false),
            Plan::All,
            "long is no longer known"
        );
        // Forgetting the job (a failed pass, a relist) forgets its quiet runs.
        focus.quiet(job, focus.token(job), "new", Some(q(90)));
        focus.forget(job);
        focus.swept_all(job, focus.token(job), at(60));
        assert_eq!(focus.plan(job, at(70), every, false), Plan::All);
    }

    #[test]
    fn what_a_pass_learns_is_not_recorded_over_a_forget_or_a_newer_cue() {
        let (focus, job, every) = fed();
        // A pass began, then the pod watch relisted (or another pass failed).
        let stale = focus.token(job);
        assert_eq!(focus.plan(job, at(0), every, false), Plan::All);
        focus.forget(job);
        focus.swept_all(job, stale, at(0));
        focus.quiet(job, stale, "r", Some(q(60)));
        assert_eq!(
            focus.plan(job, at(1), every, false),
            Plan::All,
            "nothing recorded"
        );
        // A cue that came while the pass ran: the pass may have seen the pod before it, so
        // its run is not quiet, and the next pass sweeps it.
        let token = focus.token(job);
        assert_eq!(focus.plan(job, at(2), every, false), Plan::All);
        focus.cue(job, "r");
        focus.swept_all(job, token, at(2));
        focus.quiet(job, token, "r", Some(q(60)));
        assert_eq!(
            focus.until_due(job, ["r"], at(3), every),
            Duration::from_secs(9)
        );
        assert_eq!(
            focus.plan(job, at(3), every, false),
            Plan::Only(["r".to_string()].into())
        );
        // While the pod watch lists again, every pass sweeps every run and none is quiet.
        focus.stop();
        let token = focus.token(job);
        focus.swept_all(job, token, at(4));
        focus.quiet(job, token, "r", Some(q(60)));
        assert_eq!(focus.plan(job, at(20), every, false), Plan::All);
        assert_eq!(
            focus.until_due(job, ["r"], at(5), every),
            Duration::from_secs(9)
        );
        focus.start();
        assert_eq!(focus.plan(job, at(21), every, false), Plan::All);
        let token = focus.token(job);
        focus.swept_all(job, token, at(2));
        // Woken (a cancel): swept again by the full sweeps.
        focus.quiet(job, token, "r", Some(q(60)));
        focus.wake(job, "r");
        assert_eq!(focus.plan(job, at(12), every, false), Plan::All);
    }

    #[test]
    fn an_idle_job_stays_idle_until_a_cue_a_forget_a_plan_or_a_change_of_its_object() {
        let (focus, job, every) = fed();
        assert_eq!(focus.idle_since(job, "1"), None, "nothing known");
        let token = focus.token(job);
        assert_eq!(focus.plan(job, at(0), every, false), Plan::All);
        focus.idle(job, token, at(0), "1");
        assert_eq!(focus.idle_since(job, "1"), Some(at(0)));
        // The object changed since (another replica, an annotation removed, a lagging cache).
        assert_eq!(focus.idle_since(job, "2"), None);
        // A cue: its pass plans (and says again as it ends).
        focus.cue(job, "r");
        assert_eq!(focus.idle_since(job, "1"), None);
        let token = focus.token(job);
        focus.plan(job, at(1), every, false);
        assert_eq!(focus.recorded_idle(job), None, "planned, not ended");
        focus.idle(job, token, at(1), "1");
        assert_eq!(focus.idle_since(job, "1"), Some(at(1)));
        // A cue during the pass: not recorded.
        let token = focus.token(job);
        focus.plan(job, at(3), every, true);
        focus.cue(job, "r");
        focus.idle(job, token, at(3), "1");
        assert_eq!(focus.recorded_idle(job), None, "a cue came during the pass");
        // A forget during the pass (a failed pass elsewhere, a relist): not recorded.
        let stale = focus.token(job);
        focus.plan(job, at(4), every, true);
        focus.forget(job);
        let _ = focus.token(job); // a new life of the job's entry
        focus.idle(job, stale, at(4), "1");
        assert_eq!(focus.recorded_idle(job), None, "forgotten during the pass");
        // Quiet runs left by runs that left the index elsewhere go with the record.
        let token = focus.token(job);
        focus.quiet(job, token, "gone", Some(q(60)));
        focus.idle(job, token, at(5), "1");
        assert_eq!(focus.idle_since(job, "1"), Some(at(5)));
        // While the pod watch lists again, and after it started again.
        focus.stop();
        assert_eq!(focus.idle_since(job, "1"), None);
        focus.start();
        assert_eq!(focus.idle_since(job, "1"), None, "forgotten by the relist");
    }

    #[test]
    fn without_a_pod_watch_every_pass_sweeps_every_run() {
        let focus = Focus::default();
        let t0 = Utc.timestamp_opt(1_000, 0).unwrap();
        focus.swept_all(("a", "j"), focus.token(("a", "j")), t0);
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
        focus.swept_all(("a", "j"), focus.token(("a", "j")), t0);
        focus.swept_all(("b", "j"), focus.token(("b", "j")), t0);
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
