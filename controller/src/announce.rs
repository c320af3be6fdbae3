//! What a reconcile pass tells the user.
//!
//! The steps that change a run or a tick (dispatch, completion, takeover, tick claims, a
//! replacement, a schedule edit) do not publish Events themselves: they add what to announce
//! to the pass's [`Announcements`], and the pipeline publishes them once the pass is over,
//! whatever its outcome. Decisions and bucket writes never wait on the Events API, and a test
//! can read what a step announced.
//!
//! ```
//! use cojob_controller::announce::Announcements;
//! let mut said = Announcements::default();
//! said.run_normal("RunDispatched", "run r attempt 1 started as pod r-1 (epoch 1)".into(), "r-1");
//! said.warning("RunMissed", "tick 2026-12-03T00:00:00.000000Z missed: deadline".into());
//! assert_eq!(said.reasons(), ["RunDispatched", "RunMissed"]);
//! ```

use futures::StreamExt;
use kube::runtime::events::EventType;

use crate::context::JobScope;
use crate::metrics::{RunOutcome, TakeoverOf};

/// One Event to publish about the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    /// Normal or Warning.
    pub type_: EventType,
    /// The Event's reason (`RunDispatched`, `LeaseLost`, …).
    pub reason: &'static str,
    /// The human-readable note.
    pub note: String,
    /// The run's pod the Event concerns, if any (its `related` object).
    pub pod: Option<String>,
    /// For a `LeaseLost` Event, where the lost attempt stood: counted in
    /// `cojob_takeovers_total{status}`.
    pub takeover: Option<TakeoverOf>,
}

/// The Events one pass will publish, in the order they were announced.
#[derive(Debug, Default)]
pub struct Announcements(Vec<Announcement>);

impl Announcements {
    /// A Normal Event about the job.
    pub fn normal(&mut self, reason: &'static str, note: String) {
        self.push(EventType::Normal, reason, note, None);
    }

    /// A Warning Event about the job.
    pub fn warning(&mut self, reason: &'static str, note: String) {
        self.push(EventType::Warning, reason, note, None);
    }

    /// A Normal Event about the job that concerns one run's pod.
    pub fn run_normal(&mut self, reason: &'static str, note: String, pod: &str) {
        self.push(EventType::Normal, reason, note, Some(pod.into()));
    }

    /// A Warning Event about the job that concerns one run's pod.
    pub fn run_warning(&mut self, reason: &'static str, note: String, pod: &str) {
        self.push(EventType::Warning, reason, note, Some(pod.into()));
    }

    /// A `LeaseLost` Warning: this controller took over the lease of an attempt in `of`.
    pub fn lease_lost(&mut self, of: TakeoverOf, note: String, pod: &str) {
        self.0.push(Announcement {
            type_: EventType::Warning,
            reason: "LeaseLost",
            note,
            pod: Some(pod.into()),
            takeover: Some(of),
        });
    }

    /// An Event of either type.
    pub fn push(
        &mut self,
        type_: EventType,
        reason: &'static str,
        note: String,
        pod: Option<String>,
    ) {
        self.0.push(Announcement {
            type_,
            reason,
            note,
            pod,
            takeover: None,
        });
    }

    /// The reasons announced so far, in order.
    pub fn reasons(&self) -> Vec<&'static str> {
        self.0.iter().map(|a| a.reason).collect()
    }

    /// Everything announced so far.
    pub fn all(&self) -> &[Announcement] {
        &self.0
    }

    /// Counts what was announced in the metrics (a fact is announced by the one controller that
    /// made it), then publishes every announcement as an Event about the job (a failure to
    /// publish one is logged, never fatal), [`PUBLISH_AT_ONCE`] at a time: a pass that drove
    /// several runs waits for about one Event's round trip, not one per Event.
    pub async fn publish(self, scope: &JobScope<'_>) {
        let metrics = &scope.cx.metrics;
        let now = scope.cx.db.clock().now().timestamp_millis() as f64 / 1000.0;
        for a in &self.0 {
            match a.reason {
                "RunSucceeded" => {
                    metrics.run_ended(RunOutcome::Succeeded, &scope.namespace, &scope.name, now)
                }
                "RunFailed" => {
                    metrics.run_ended(RunOutcome::Failed, &scope.namespace, &scope.name, now)
                }
                "RunCancelled" => {
                    metrics.run_ended(RunOutcome::Cancelled, &scope.namespace, &scope.name, now)
                }
                "RunRespawned" => metrics.respawned(),
                _ => {}
            }
            if let Some(of) = a.takeover {
                metrics.took_over(of);
            }
        }
        futures::stream::iter(self.0)
            .for_each_concurrent(PUBLISH_AT_ONCE, |a| async move {
                scope
                    .run_event(a.type_, a.reason, a.note, a.pod.as_deref())
                    .await;
            })
            .await;
    }
}

/// How many of one pass's Events are sent at once, at most.
pub const PUBLISH_AT_ONCE: usize = 8;

/// How often, at most, a job's skipped ticks are announced: one `RunSkipped` Event per job per
/// this long. A `Forbid` job whose run outlasts many ticks would otherwise write an Event
/// per tick; the decisions themselves are all in the bucket (`cojob runs`), and counted in
/// `status.counters.skipped` and `cojob_decisions_total{kind="skipped"}`.
pub const SKIPPED_EVENT_INTERVAL: chrono::Duration = chrono::Duration::minutes(5);

/// Rate-limits `RunSkipped` Events, per job (by UID), in this process. The first skip is
/// announced; later ones within [`SKIPPED_EVENT_INTERVAL`] are held back and counted, and the
/// next announcement says how many were.
///
/// ```
/// use cojob_controller::announce::SkippedTicks;
/// let skips = SkippedTicks::default();
/// let t0: chrono::DateTime<chrono::Utc> = "2026-12-03T00:00:00Z".parse().unwrap();
/// assert_eq!(skips.admit("uid-1", t0), Some(0));
/// assert_eq!(skips.admit("uid-1", t0 + chrono::Duration::seconds(10)), None);
/// assert_eq!(skips.admit("uid-1", t0 + chrono::Duration::seconds(20)), None);
/// assert_eq!(skips.admit("uid-2", t0), Some(0), "each job has its own limit");
/// assert_eq!(skips.admit("uid-1", t0 + chrono::Duration::minutes(6)), Some(2));
/// ```
#[derive(Debug, Default)]
pub struct SkippedTicks {
    by_job: std::sync::Mutex<std::collections::HashMap<String, Held>>,
}

#[derive(Debug)]
struct Held {
    announced_at: chrono::DateTime<chrono::Utc>,
    held: u32,
}

impl SkippedTicks {
    /// A tick of the job `uid` was skipped at `now`: `Some(n)` to announce it (`n` skips were
    /// held back since the last announcement), `None` to hold it back.
    pub fn admit(&self, uid: &str, now: chrono::DateTime<chrono::Utc>) -> Option<u32> {
        let mut by_job = match self.by_job.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        match by_job.get_mut(uid) {
            Some(h) if now - h.announced_at < SKIPPED_EVENT_INTERVAL => {
                h.held = h.held.saturating_add(1);
                None
            }
            Some(h) => {
                let held = h.held;
                *h = Held {
                    announced_at: now,
                    held: 0,
                };
                Some(held)
            }
            None => {
                by_job.insert(
                    uid.to_owned(),
                    Held {
                        announced_at: now,
                        held: 0,
                    },
                );
                Some(0)
            }
        }
    }

    /// The job `uid` is gone: its entry goes too.
    pub fn forget(&self, uid: &str) {
        if let Ok(mut by_job) = self.by_job.lock() {
            by_job.remove(uid);
        }
    }
}

/// Publishes the Events of facts that happen once (a run's steps, which name its pod as their
/// `related` object, and decisions: a trigger, a skip, a schedule edit) as new
/// `events.k8s.io/v1` Events, and keeps nothing.
///
/// kube-runtime's `Recorder` keeps every Event it publishes for 6 minutes, so that a repeat
/// (the same reason about the same objects) becomes a series. These never repeat; kept all
/// the same, they were the controller's largest live allocation after a burst of runs (a heap
/// profile over 2 000 runs: 11.8 MB for 6 000 Events, in a table that does not shrink when
/// they expire), and each publish scanned all of them. A decision's Event through the
/// Recorder would also fold the next one of its reason within 6 minutes into its series, and
/// that one's note (which run) would be lost. The job's state Events (conditions, warnings
/// that hold while their cause does) repeat, and still go through the `Recorder`.
pub struct RunEvents {
    client: kube::Client,
    reporter: kube::runtime::events::Reporter,
    /// The last timestamp used in a name (nanoseconds): names stay unique within the process.
    last: std::sync::atomic::AtomicI64,
}

impl RunEvents {
    /// Publishes as `reporter`, through `client`.
    pub fn new(client: kube::Client, reporter: kube::runtime::events::Reporter) -> RunEvents {
        RunEvents {
            client,
            reporter,
            last: Default::default(),
        }
    }

    /// Creates the Event `ev` about `regarding` (its `secondary` becomes the Event's
    /// `related`), in `regarding`'s namespace.
    ///
    /// # Errors
    ///
    /// If the API server refuses it.
    pub async fn publish(
        &self,
        ev: &kube::runtime::events::Event,
        regarding: &k8s_openapi::api::core::v1::ObjectReference,
    ) -> Result<(), kube::Error> {
        let event = self.build(ev, regarding);
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(self.client.clone(), namespace)
            .create(&kube::api::PostParams::default(), &event)
            .await
            .map(|_| ())
    }

    /// The Event object, as kube-runtime's `Recorder` builds a new one.
    fn build(
        &self,
        ev: &kube::runtime::events::Event,
        regarding: &k8s_openapi::api::core::v1::ObjectReference,
    ) -> k8s_openapi::api::events::v1::Event {
        let now = k8s_openapi::jiff::Timestamp::now();
        let stamp = next_stamp(
            &self.last,
            i64::try_from(now.as_nanosecond()).unwrap_or(i64::MAX),
        );
        let controller = &self.reporter.controller;
        k8s_openapi::api::events::v1::Event {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(format!(
                    "{}.{stamp:x}",
                    regarding.name.as_deref().unwrap_or(controller)
                )),
                namespace: regarding.namespace.clone(),
                ..Default::default()
            },
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            note: ev.note.clone(),
            event_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                now,
            )),
            regarding: Some(regarding.clone()),
            related: ev.secondary.clone(),
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            type_: Some(
                match ev.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            ..Default::default()
        }
    }
}

/// The timestamp for the next Event name: `wanted` (now, in nanoseconds), or one past the last
/// one used if that is not later, so that two Events published in the same nanosecond, or
/// across a step back of the clock, never share a name.
fn next_stamp(last: &std::sync::atomic::AtomicI64, wanted: i64) -> i64 {
    use std::sync::atomic::Ordering;
    let next = |previous: i64| wanted.max(previous.saturating_add(1));
    match last.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| Some(next(p))) {
        Ok(previous) | Err(previous) => next(previous),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_stay_unique_within_a_nanosecond_and_across_a_clock_step_back() {
        let last = std::sync::atomic::AtomicI64::new(0);
        assert_eq!(next_stamp(&last, 100), 100);
        assert_eq!(next_stamp(&last, 100), 101, "same nanosecond");
        assert_eq!(next_stamp(&last, 50), 102, "the clock stepped back");
        assert_eq!(next_stamp(&last, 500), 500, "later: the clock's own");
    }
}
