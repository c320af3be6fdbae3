//! Reconcile: turns a CoordinatedJob's schedule into exactly-once runs.
//!
//! One pass, for one object:
//!
//! 1. **Finalizer.** A deleted object cancels its active runs first (see [`finalize`]). A job
//!    with no active run and nothing due stops after this step while the object is as its
//!    last full pass left it (`idle`): nothing is read from the bucket.
//! 2. **Spec.** A schedule the schema let through but cron cannot parse, or a template that
//!    uses a name the pod builder reserves ([`crate::pod::reserved_conflict`]), becomes a
//!    `Ready=False` condition and an `InvalidSpec` Event; nothing else happens until the spec
//!    changes.
//! 3. **Sweep.** Every active run in the job's index is driven one step
//!    ([`sweeper::sync_run`]); finished runs move to the history.
//! 4. **Ticks** (`ticks`). The schedule in force is recorded (an edit applies from when it is
//!    seen); every tick due since the cursor is claimed in the bucket with its decision, a run
//!    id, a skip or a miss, after a quorum read of the object; a lost claim converges on the
//!    winner's decision (G1). **Triggers** (`triggers`): each `trigger.cojob.dev/<key>`
//!    annotation is decided the same way, once per key, and removed once recorded. New runs are
//!    dispatched at once.
//! 5. **Garbage** (`gc`). Pods of runs that left the active list lose their result finalizer
//!    once their outcome is recorded; pods of runs that left the history are deleted.
//! 6. **Status** (`status`). The status is patched by server-side apply, only when it changed,
//!    and the object is requeued for its next tick or the next sweep, whichever comes first.
//!
//! Every write that matters is conditional in the bucket, so two controllers reconciling the
//! same object at once stay correct without leader election.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use cojob::{Doc, Version};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::{PredicateConfig, WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::announce::Announcements;
use crate::context::{Context, JobScope, MissingField};
use crate::crd::{
    CatchUpPolicy, ConcurrencyPolicy, CoordinatedJob, CoordinatedJobSpec, CoordinatedJobStatus,
    RunCounters, RunStatus,
};
use crate::index::{ActiveRun, Decision, FinishedRun, HistoryLimits, JobIndex};
use crate::layout::run_id;
use crate::pod::LABEL_JOB;
use crate::schedule::{CatchUp, Schedule, ScheduleError};
use crate::sweeper::focus::{Plan, Quiet, Token};
use crate::sweeper::{self, RunPods, RunReport, SweepError};

mod backfills;
mod cancels;
mod finalize;
mod gc;
mod idle;
mod status;
mod ticks;
mod triggers;
mod turns;

pub use turns::Turns;

pub use finalize::finalize;
use finalize::set_finalizers;
use gc::collect_garbage;
pub use idle::STORE_ANSWERED_WITHIN;
use status::{build_status, patch_status, report_not_ready};
use ticks::{decide_ticks, due_at, schedule_fingerprint, waits_for_its_tick};

/// The finalizer that lets active runs be cancelled before the object goes.
pub const FINALIZER: &str = "cojob.dev/cancel-runs";
/// The server-side apply field manager of the status.
pub const FIELD_MANAGER: &str = "cojob-controller";
/// The condition that sums up the job: `False` with the reason of what stops it.
pub const READY: &str = "Ready";
/// The condition that says whether the schedule and template are usable (`InvalidSpec`).
pub const SCHEDULE_VALID: &str = "ScheduleValid";
/// The condition that says whether the bucket answered the last pass (`StoreUnavailable`,
/// `StoreAccessDenied`, `InvalidStoreDocument`).
pub const STORE_AVAILABLE: &str = "StoreAvailable";
/// The condition that says whether the newest finished run failed (`RunFailed`).
pub const LAST_RUN_FAILED: &str = "LastRunFailed";
/// How far past a tick the pass due at it is asked for, so the tick is due when it starts.
const PAST_THE_TICK: Duration = Duration::from_millis(50);
/// The longest pause between two reconciles of an idle object.
pub const IDLE_RESYNC: Duration = Duration::from_secs(300);

/// A failed reconcile. The controller logs it, records it in the status and retries later.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bucket failed.
    #[error("store: {0}")]
    Store(#[from] cojob::Error),
    /// The Kubernetes API failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Driving a run failed.
    #[error(transparent)]
    Sweep(#[from] SweepError),
    /// The object lacks a field the API server always sets.
    #[error(transparent)]
    Missing(#[from] MissingField),
}

impl Error {
    /// True when the bucket is at fault (reported by [`public_report`](Self::public_report)).
    pub fn is_store(&self) -> bool {
        matches!(
            self,
            Error::Store(_)
                | Error::Sweep(
                    SweepError::Store(_)
                        | SweepError::Foreign { .. }
                        | SweepError::Credentials { .. }
                )
        )
    }

    /// The metrics' cause of this failure.
    pub fn kind(&self) -> crate::metrics::ErrorKind {
        use crate::metrics::ErrorKind;
        match self {
            _ if self.is_store() => ErrorKind::Store,
            Error::Kube(_) | Error::Sweep(SweepError::Kube(_)) => ErrorKind::Kubernetes,
            _ => ErrorKind::Other,
        }
    }

    /// True when a document of the job can never be read as it is (not cojob's, corrupt, or
    /// over the size limit), as opposed to a store that is only unavailable.
    ///
    /// ```
    /// use cojob_controller::reconcile::Error;
    /// let corrupt = Error::Store(cojob::Error::Corrupt { key: "k".into(), expected: "index".into(), detail: "x".into() });
    /// assert!(corrupt.is_unreadable_document());
    /// let huge = Error::Store(cojob::Error::Store(cojob::StoreError::TooLarge { key: "k".into(), size: 9, limit: 1 }));
    /// assert!(huge.is_unreadable_document());
    /// ```
    pub fn is_unreadable_document(&self) -> bool {
        matches!(
            self,
            Error::Store(
                cojob::Error::Corrupt { .. }
                    | cojob::Error::TooLarge { .. }
                    | cojob::Error::Store(cojob::StoreError::TooLarge { .. })
            )
        )
    }

    /// The condition reason and message of a bucket failure, as the job's namespace may see
    /// them: what is wrong and which of the job's own keys, never the store's reply (which can
    /// name the endpoint, the account or the principal). The whole error goes to the
    /// controller's log. `None` when the bucket is not at fault.
    ///
    /// ```
    /// use cojob_controller::reconcile::Error;
    /// let e = Error::Store(cojob::Error::Corrupt {
    ///     key: "v1/jobs/a/j/u/index".into(),
    ///     expected: "index".into(),
    ///     detail: "User: arn:aws:iam::1:user/ops".into(),
    /// });
    /// let (reason, message) = e.public_report().unwrap();
    /// assert_eq!(reason, "InvalidStoreDocument");
    /// assert!(message.contains("v1/jobs/a/j/u/index") && !message.contains("arn:"), "{message}");
    /// ```
    pub fn public_report(&self) -> Option<(&'static str, String)> {
        const LOG: &str = "details in the controller's log";
        let lib = match self {
            Error::Store(e) | Error::Sweep(SweepError::Store(e)) => e,
            Error::Sweep(SweepError::Foreign { run_id, .. }) => {
                return Some((
                    "InvalidStoreDocument",
                    format!(
                        "run {run_id}: its lease in the bucket is not a cojob run; it is left untouched ({LOG})"
                    ),
                ));
            }
            Error::Sweep(SweepError::Credentials { run_id, .. }) => {
                return Some((
                    "CredentialsUnavailable",
                    format!(
                        "run {run_id}: its short-lived store credentials could not be minted; retrying ({LOG})"
                    ),
                ));
            }
            _ => return None,
        };
        let store = |e: &cojob::StoreError| match e {
            cojob::StoreError::TooLarge { key, size, limit } => (
                "InvalidStoreDocument",
                format!(
                    "{key} in the bucket has {size} bytes, more than the {limit} of a cojob document; it is not read and this job waits until it is removed ({LOG})"
                ),
            ),
            cojob::StoreError::AccessDenied { .. } => (
                "StoreAccessDenied",
                format!("the bucket refused the controller's credentials; retrying ({LOG})"),
            ),
            cojob::StoreError::NoSuchBucket { .. } => (
                "StoreUnavailable",
                format!("the bucket does not exist; retrying ({LOG})"),
            ),
            _ => (
                "StoreUnavailable",
                format!("the bucket cannot be reached or failed; retrying ({LOG})"),
            ),
        };
        Some(match lib {
            cojob::Error::Store(e) => store(e),
            cojob::Error::Corrupt { key, expected, .. } => (
                "InvalidStoreDocument",
                format!(
                    "{key} in the bucket is not a valid {expected}; it is left untouched ({LOG})"
                ),
            ),
            cojob::Error::Contention { key, .. } => (
                "StoreUnavailable",
                format!("{key}: too many concurrent writers; retrying ({LOG})"),
            ),
            _ => (
                "StoreUnavailable",
                format!("the bucket failed; retrying ({LOG})"),
            ),
        })
    }
}

/// Parses the spec's schedule; `None` for a job without one.
pub fn parse_schedule(spec: &CoordinatedJobSpec) -> Result<Option<Schedule>, ScheduleError> {
    spec.schedule
        .as_deref()
        .map(|s| Schedule::parse(s, spec.time_zone.as_deref()))
        .transpose()
}

/// Why the job asks for more than this controller allows (`--min-schedule-interval`,
/// `--min-lease-ttl`), if it does.
fn beyond_limits(scope: &JobScope<'_>, schedule: Option<&Schedule>) -> Option<String> {
    let settings = &scope.cx.settings;
    let ttl = scope.ttl();
    if ttl < settings.min_lease_ttl {
        return Some(format!(
            "lease.ttlSeconds is {}; this controller accepts at least {}",
            ttl.as_secs(),
            humantime::format_duration(settings.min_lease_ttl)
        ));
    }
    let gap = schedule?.min_gap(scope.cx.db.clock().now(), 32)?;
    (gap < settings.min_schedule_interval).then(|| {
        format!(
            "the schedule fires every {}; this controller accepts at most one tick every {}",
            humantime::format_duration(gap),
            humantime::format_duration(settings.min_schedule_interval)
        )
    })
}

/// Reconciles one CoordinatedJob, in a span that names it (every log line of the pass carries
/// its namespace and name).
#[tracing::instrument(name = "reconcile", skip_all, fields(namespace = job.metadata.namespace.as_deref().unwrap_or_default(), job = job.metadata.name.as_deref().unwrap_or_default()))]
pub async fn reconcile(job: Arc<CoordinatedJob>, cx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile_job(&job, &cx).await;
    if result.is_ok()
        && let Some(uid) = job.metadata.uid.as_deref()
    {
        cx.retries.succeeded(uid);
    }
    cx.metrics
        .reconciled(started.elapsed(), result.as_ref().err().map(Error::kind));
    result
}

async fn reconcile_job(job: &CoordinatedJob, cx: &Context) -> Result<Action, Error> {
    let scope = JobScope::new(cx, job)?;
    if job.metadata.deletion_timestamp.is_some() {
        return finalize(&scope).await;
    }
    if !job.finalizers().iter().any(|f| f == FINALIZER) {
        match set_finalizers(&scope, |f| f.push(FINALIZER.into())).await {
            Ok(()) => {}
            // Modified meanwhile (often by another replica adding the same finalizer). No run
            // may start on an object without the finalizer (its deletion could not cancel
            // them), so stop here; the change comes back through the watch.
            Err(Error::Kube(kube::Error::Api(s))) if s.code == 409 => {
                tracing::debug!(job = %scope.name, "finalizer not added yet: the object changed");
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
            Err(e) => return Err(e),
        }
    }
    // Nothing to do and nothing to read (`idle`): come back at the next tick. The object is
    // as the last full pass left it, so its spec passed the checks below then.
    if let Some(wait) = idle::idle_wait(&scope, cx.db.clock().now()) {
        cx.metrics.idle_pass();
        return Ok(Action::requeue(
            wait.saturating_sub(cx.settings.debounce)
                .max(Duration::from_millis(100)),
        ));
    }
    let schedule = match parse_schedule(&job.spec) {
        Ok(s) => s,
        Err(e) => {
            report_not_ready(&scope, "InvalidSpec", &e.to_string()).await?;
            return Ok(Action::await_change());
        }
    };
    if let Some(why) = beyond_limits(&scope, schedule.as_ref()) {
        report_not_ready(&scope, "InvalidSpec", &why).await?;
        return Ok(Action::await_change());
    }
    let conflict = match job.spec.template.decode() {
        Ok(template) => crate::pod::reserved_conflict(&template),
        Err(e) => Some(format!("template: cannot be read back: {e}")),
    };
    if let Some(why) = conflict {
        report_not_ready(&scope, "InvalidSpec", &why).await?;
        return Ok(Action::await_change());
    }
    let mut said = Announcements::default();
    let result = sync(&scope, schedule.as_ref(), &mut said).await;
    match result {
        Ok(synced) => {
            cx.metrics
                .job_active(&scope.namespace, &scope.name, synced.active.len());
            let status = build_status(&scope, &synced);
            // The pass's Events and its status write are independent requests: sent together,
            // the pass waits for the slower of them, not their sum (a dispatch pass's critical
            // path is the claim, the pod, its holder Secret, the ungating, then this).
            let (written, ()) = tokio::join!(patch_status(&scope, status), said.publish(&scope));
            let written = match written {
                Ok(written) => written,
                Err(e) => {
                    // The runs a later pass leaves out keep the status it shows: sweep all of
                    // them.
                    cx.focus.forget((&scope.namespace, &scope.name));
                    return Err(e);
                }
            };
            // Idle until a tick, a cue or a change of the object (`idle`).
            let version = written.or_else(|| job.metadata.resource_version.clone());
            if let (Some((token, read_at)), Some(version)) = (synced.idle, version) {
                cx.focus
                    .idle((&scope.namespace, &scope.name), token, read_at, &version);
            }
            // The scheduler adds its debounce to every request; take it off here, so a pass
            // due at a tick still starts at the tick.
            Ok(Action::requeue(
                synced.requeue.saturating_sub(cx.settings.debounce),
            ))
        }
        Err(e) => {
            said.publish(&scope).await;
            // The runs this pass was to sweep may not have been: sweep all of them next time.
            cx.focus.forget((&scope.namespace, &scope.name));
            if let Some((reason, message)) = e.public_report() {
                // The API server may be the one failing; the error is returned either way, and
                // logged whole by the error policy.
                let _ = report_not_ready(&scope, reason, &message).await;
            }
            Err(e)
        }
    }
}

/// What a successful pass found.
#[derive(Debug)]
pub struct Synced {
    /// The index after this pass.
    pub index: JobIndex,
    /// The active runs, as reported by the sweeper.
    pub active: Vec<RunStatus>,
    /// The next tick.
    pub next: Option<DateTime<Utc>>,
    /// When to come back.
    pub requeue: Duration,
    /// The pass left the job idle: no active run, nothing more to decide. The pass's focus
    /// token and when it read the index, for [`sweeper::focus::Focus::idle`] once the status is
    /// written.
    pub idle: Option<(Token, DateTime<Utc>)>,
}

fn history_limits(spec: &CoordinatedJobSpec) -> HistoryLimits {
    HistoryLimits {
        successful: usize::try_from(spec.successful_runs_history_limit).unwrap_or(0),
        failed: usize::try_from(spec.failed_runs_history_limit).unwrap_or(0),
    }
}

/// The job's pods, from the watch-backed cache once it is filled, else from the API server.
async fn list_pods(scope: &JobScope<'_>) -> Result<BTreeMap<String, RunPods>, Error> {
    match scope.cx.pod_cache.job_pods(&scope.namespace, &scope.name) {
        Some(pods) => Ok(sweeper::group_pods(scope, pods)),
        None => list_pods_fresh(scope).await,
    }
}

/// The job's pods as the API server has them now (a LIST by label), for the decisions that
/// must not miss a pod the cache has not seen yet.
async fn list_pods_fresh(scope: &JobScope<'_>) -> Result<BTreeMap<String, RunPods>, Error> {
    let lp = ListParams::default().labels(&format!("{LABEL_JOB}={}", scope.name));
    let pods = scope.pods.list(&lp).await?.items;
    Ok(sweeper::group_pods(scope, pods))
}

/// What a sweep of some runs found.
#[derive(Default)]
struct Swept {
    active: Vec<RunStatus>,
    finished: Vec<FinishedRun>,
    /// Runs that could not be driven, with why. One run's trouble never stops the others or
    /// the tick decisions; it is reported after the pass.
    errors: Vec<(String, SweepError)>,
}

/// Sweeps the given runs; which of them are quiet goes to the job's focus, for the pass that
/// took `token`.
async fn sweep(
    scope: &JobScope<'_>,
    token: Token,
    runs: &[ActiveRun],
    pods: &BTreeMap<String, RunPods>,
    said: &mut Announcements,
) -> Swept {
    let empty = RunPods::new();
    let mut out = Swept::default();
    let job = (scope.namespace.as_str(), scope.name.as_str());
    for run in runs {
        let synced =
            sweeper::sync_run(scope, run, pods.get(&run.run_id).unwrap_or(&empty), said).await;
        let quiet = synced
            .as_ref()
            .ok()
            .and_then(|s| match (s.quiet_until, &s.report) {
                (Some(until), RunReport::Active { epoch, phase, .. }) => Some(Quiet {
                    until,
                    epoch: *epoch,
                    phase: *phase,
                }),
                _ => None,
            });
        scope.cx.focus.quiet(job, token, &run.run_id, quiet);
        match synced.map(|s| s.report) {
            Ok(RunReport::Active {
                epoch,
                attempt,
                pod,
                phase,
            }) => out.active.push(RunStatus {
                run_id: run.run_id.clone(),
                tick: run.tick_label(),
                epoch: i64::try_from(epoch).unwrap_or(i64::MAX),
                attempt: i32::try_from(attempt).unwrap_or(i32::MAX),
                pod,
                phase: phase.as_str().into(),
            }),
            Ok(RunReport::Finished(f)) => out.finished.push(f),
            Err(e) => {
                tracing::warn!(job = %scope.name, run = %run.run_id, error = %e, "could not sync a run");
                out.errors.push((run.run_id.clone(), e));
            }
        }
    }
    out
}

/// The index as last read or written, with its version (`None`: not stored yet).
type KnownIndex = Option<(JobIndex, Version)>;

/// Reads the job's index, refusing one cojob did not write for this job
/// ([`JobIndex::validate`]) as corrupt.
async fn read_index(scope: &JobScope<'_>, doc: &Doc<JobIndex>) -> Result<KnownIndex, Error> {
    let known = doc.get().await?;
    if let Some((index, _)) = &known {
        index.validate(&scope.name).map_err(|detail| {
            Error::Store(cojob::Error::Corrupt {
                key: scope.keys.index(),
                expected: "index of this job".into(),
                detail,
            })
        })?;
    }
    Ok(known)
}

fn index_of(known: &KnownIndex) -> JobIndex {
    known.as_ref().map(|(i, _)| i.clone()).unwrap_or_default()
}

/// Applies `change` to the index by compare-and-swap from the known version (no extra read),
/// unless it changes nothing.
async fn update_index(
    doc: &Doc<JobIndex>,
    known: KnownIndex,
    mut change: impl FnMut(&mut JobIndex),
) -> Result<KnownIndex, Error> {
    let mut preview = index_of(&known);
    change(&mut preview);
    if preview == index_of(&known) {
        return Ok(known);
    }
    let stored = doc
        .update_from(
            known,
            |mut i| {
                change(&mut i);
                Ok::<_, cojob::BoxError>(i)
            },
            Some(JobIndex::default()),
        )
        .await?;
    Ok(Some(stored))
}

/// The pass's pipeline: observe (index, pods), sweep the active runs, follow the schedule,
/// decide the due ticks and start their runs, collect garbage; what to tell the user goes to
/// `said`, and the status is written by the caller.
async fn sync(
    scope: &JobScope<'_>,
    schedule: Option<&Schedule>,
    said: &mut Announcements,
) -> Result<Synced, Error> {
    let db = &scope.cx.db;
    let started = db.clock().now();
    let spec = &scope.job.spec;
    // Which runs to sweep: all of them when a full sweep is due or the pass needs them, else
    // the runs whose pods were cues (`sweeper::focus`). Planned before the pods are read: a
    // cue this plan takes is in the pod cache already, and a later one is left for the next
    // pass.
    let job_ref = (scope.namespace.as_str(), scope.name.as_str());
    let every = full_sweep_every(scope);
    let token = scope.cx.focus.token(job_ref);
    let plan = scope
        .cx
        .focus
        .plan(job_ref, started, every, needs_every_run(scope.job, started));
    let doc = db.doc::<JobIndex>(&scope.keys.index());
    let read_at = started;
    let mut known = read_index(scope, &doc).await?;
    let pods = list_pods(scope).await?;
    let limits = history_limits(spec);

    // Sweep the active runs first, so the concurrency policy sees runs that just ended.
    let runs = index_of(&known).active;
    let (to_sweep, shown) = focus_runs(scope.job, &runs, &plan);
    let Swept {
        mut active,
        finished,
        mut errors,
    } = sweep(scope, token, &to_sweep, &pods, said).await;
    if matches!(plan, Plan::All | Plan::AllBut(_)) {
        scope.cx.focus.swept_all(job_ref, token, started);
    }
    active.extend(shown);
    let mut dropped = Vec::new();
    // The runs this pass saw end: the sweeper released their pods' result finalizers, which
    // the pass's copies of those pods still show.
    let mut settled: BTreeSet<String> = finished.iter().map(|f| f.run_id.clone()).collect();
    if !finished.is_empty() {
        known = update_index(&doc, known, |i| {
            dropped = i.record_finished(&finished, limits);
        })
        .await?;
    }

    // Cancels asked for by annotation.
    let cancels = cancels::requested(scope);
    if !cancels.is_empty() {
        cancels::cancel_requested(scope, &cancels, &index_of(&known), &pods, said).await?;
    }

    // Follow the schedule the spec has now: an edit applies from when it is seen.
    let now = db.clock().now();
    // A suspension skips the ticks that fall due, so it cancels the runs decided ahead of
    // theirs (`prestartSeconds`): their workloads wait for the tick and have not started.
    if spec.suspend {
        cancel_ahead_of_tick(scope, &index_of(&known), &pods, now, said).await?;
    }
    if let (Some(fingerprint), Some(expr)) = (schedule_fingerprint(spec), &spec.schedule) {
        let mut edited = false;
        known = update_index(&doc, known, |i| {
            edited = i.record_schedule(&fingerprint, now)
        })
        .await?;
        if edited {
            // After a run decided ahead of its tick (`prestartSeconds`), from that tick on.
            let from = index_of(&known).cursor_time().map_or(now, |c| c.max(now));
            said.normal(
                "ScheduleChanged",
                format!(
                    "schedule is now {expr:?}; it applies to ticks after {}",
                    cojob::json::format_time(from)
                ),
            );
        }
    }
    // Decide the due ticks.
    let (decisions, next, missed_before) =
        decide_ticks(scope, schedule, &index_of(&known), now, said).await?;
    let oldest_run = decisions
        .iter()
        .filter(|(_, d)| matches!(d, Decision::RunId(_)))
        .filter_map(|(t, _)| *t)
        .min();
    if let Some(tick) = oldest_run {
        let lag = (started - tick).to_std().unwrap_or_default();
        scope.cx.metrics.tick_picked_up(lag);
    }
    if !decisions.is_empty() || missed_before.is_some() {
        known = update_index(&doc, known, |i| {
            if let Some(before) = missed_before {
                i.record_missed_range(before);
            }
            i.record_decisions(&decisions);
        })
        .await?;
    }
    // Manual runs asked for by annotation, decided once per key.
    let asked = triggers::requested(scope, said);
    if !asked.is_empty() {
        let decided = triggers::decide_triggers(scope, &asked, &index_of(&known), said).await?;
        if !decided.is_empty() {
            known = update_index(&doc, known, |i| {
                for d in &decided {
                    i.record_trigger(&d.key, &d.decision, now, d.ended);
                }
            })
            .await?;
        }
        triggers::remove_recorded(scope, &asked, &index_of(&known)).await?;
    }
    // Backfills asked for by annotation, a few ticks per pass.
    let asked = backfills::requested(scope);
    let mut backfilling = false;
    if !asked.is_empty() {
        let steps =
            backfills::decide(scope, schedule, &asked, &index_of(&known), now, said).await?;
        if steps.iter().any(backfills::Step::decided_any) {
            known = update_index(&doc, known, |i| {
                for step in &steps {
                    step.record(i);
                }
            })
            .await?;
        }
        backfilling = backfills::finish(scope, schedule, steps, &index_of(&known), now).await?;
    }
    let index = index_of(&known);
    let new_runs: Vec<ActiveRun> = index
        .active
        .iter()
        .filter(|r| !runs.iter().any(|s| s.run_id == r.run_id))
        .cloned()
        .collect();
    if spec.concurrency_policy == ConcurrencyPolicy::Replace {
        replace_older_runs(scope, &index, &pods, said).await?;
    }
    let started = sweep(scope, token, &new_runs, &pods, said).await;
    active.extend(started.active);
    errors.extend(started.errors);
    settled.extend(started.finished.iter().map(|f| f.run_id.clone()));
    if !started.finished.is_empty() {
        known = update_index(&doc, known, |i| {
            dropped.extend(i.record_finished(&started.finished, limits));
        })
        .await?;
    }
    let index = index_of(&known);
    collect_garbage(scope, &index, &pods, &dropped, &settled).await?;
    active.retain(|a| index.active.iter().any(|r| r.run_id == a.run_id));

    let until_next =
        next.map(|n| (due_at(spec, n, now) - now).to_std().unwrap_or_default() + PAST_THE_TICK);
    let mut requeue = until_next.unwrap_or(IDLE_RESYNC).min(IDLE_RESYNC);
    if backfilling {
        requeue = requeue.min(Duration::from_secs(1)); // more ticks of a backfill to decide
    }
    if !index.active.is_empty() {
        // At least every sweep interval, and every third of the ttl, so a pending pod's lease
        // is renewed in time and an expired one is found within ttl + ttl/3. A pass that swept
        // only some runs aims at the next full sweep; a job whose runs are all quiet, at the
        // first time one of their leases may be taken over (`sweeper::focus`).
        let runs = index.active.iter().map(|r| r.run_id.as_str());
        requeue = requeue.min(scope.cx.focus.until_due(job_ref, runs, now, every));
    }
    if let Some((run, e)) = errors.into_iter().next() {
        tracing::warn!(job = %scope.name, %run, "a run could not be driven; reporting it");
        return Err(e.into());
    }
    let idle = (index.active.is_empty() && !backfilling).then_some((token, read_at));
    Ok(Synced {
        index,
        active,
        next,
        requeue: requeue.max(Duration::from_millis(100)),
        idle,
    })
}

/// How often every active run of the job is swept: the sweep interval, or a third of the
/// ttl when that is shorter.
fn full_sweep_every(scope: &JobScope<'_>) -> Duration {
    scope
        .cx
        .settings
        .sweep_interval
        .min(scope.ttl() / 3)
        .max(Duration::from_millis(100))
}

/// True when a pass may decide something that depends on every active run, or cannot tell:
/// something is [`pending`], or `Replace` is the policy.
fn needs_every_run(job: &CoordinatedJob, now: DateTime<Utc>) -> bool {
    pending(job, now) || job.spec.concurrency_policy == ConcurrencyPolicy::Replace
}

/// True when the job asks for something, or the pass cannot tell: the status is missing, a
/// tick is due (or the status of a scheduled job does not say when the next one is), the spec
/// changed since the status was written, or a request waits in an annotation.
fn pending(job: &CoordinatedJob, now: DateTime<Utc>) -> bool {
    let Some(status) = job.status.as_ref() else {
        return true;
    };
    // A job without a schedule has its one run decided by the pass that wrote its status.
    let tick_due = job.spec.schedule.is_some()
        && next_tick_due(status, &job.spec).is_none_or(|t| t <= now.timestamp_micros());
    let asked = job.annotations().keys().any(|k| {
        k.starts_with(crate::crd::TRIGGER_ANNOTATION_PREFIX)
            || k.starts_with(crate::crd::CANCEL_ANNOTATION_PREFIX)
            || k.starts_with(crate::crd::BACKFILL_ANNOTATION_PREFIX)
    });
    tick_due || asked || status.observed_generation != job.metadata.generation
}

/// When the next tick the status shows is due, in microseconds since the epoch:
/// `prestartSeconds` before it. `None` when the status shows none.
fn next_tick_due(status: &CoordinatedJobStatus, spec: &CoordinatedJobSpec) -> Option<i64> {
    let ahead = spec.prestart().num_microseconds().unwrap_or(0);
    status
        .next_schedule_time
        .as_ref()
        .map(|t| t.0.as_microsecond() - ahead)
}

/// The runs to sweep under `plan`, and the status the others keep (as the job's status last
/// showed them; a run it does not show is swept).
fn focus_runs(
    job: &CoordinatedJob,
    runs: &[ActiveRun],
    plan: &Plan,
) -> (Vec<ActiveRun>, Vec<RunStatus>) {
    // True for a run this pass leaves out, as `status` shows it. A status that shows a quiet
    // run otherwise than its quiet pass reported it is older (the job cache may lag the
    // controller's own status write), so that run is swept.
    let left_out = |run_id: &String, status: &RunStatus| match plan {
        Plan::All => false,
        Plan::AllBut(quiet) => quiet.get(run_id).is_some_and(|q| {
            status.phase == q.phase.as_str()
                && u64::try_from(status.epoch).is_ok_and(|e| e == q.epoch)
        }),
        Plan::Only(chosen) => !chosen.contains(run_id),
    };
    if *plan == Plan::All {
        return (runs.to_vec(), Vec::new());
    }
    let shown = job
        .status
        .as_ref()
        .map(|s| s.active.as_slice())
        .unwrap_or_default();
    let mut to_sweep = Vec::new();
    let mut kept = Vec::new();
    for run in runs {
        match shown.iter().find(|s| s.run_id == run.run_id) {
            Some(status) if left_out(&run.run_id, status) => kept.push(status.clone()),
            _ => to_sweep.push(run.clone()),
        }
    }
    (to_sweep, kept)
}

/// Removes the annotations `names` from the object (a request the controller carried out), by
/// a merge patch; an object deleted meanwhile has nothing left to tidy.
async fn remove_annotations(scope: &JobScope<'_>, names: Vec<String>) -> Result<(), Error> {
    if names.is_empty() {
        return Ok(());
    }
    let nulls: serde_json::Map<String, serde_json::Value> = names
        .into_iter()
        .map(|n| (n, serde_json::Value::Null))
        .collect();
    let api: Api<CoordinatedJob> = Api::namespaced(scope.cx.client.clone(), &scope.namespace);
    let patch = json!({"metadata": {"annotations": nulls}});
    match api
        .patch(&scope.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// `concurrencyPolicy: Replace`: cancels every active run but the newest (backfills aside), on every pass until
/// they are cancelled, so a crash or a failed cancel is retried.
async fn replace_older_runs(
    scope: &JobScope<'_>,
    index: &JobIndex,
    pods: &BTreeMap<String, RunPods>,
    said: &mut Announcements,
) -> Result<(), Error> {
    // A backfill's runs are paced by its own parallelism, not replaced; a run decided ahead
    // of its tick (`prestartSeconds`) replaces the others only once its tick has come.
    let now = scope.cx.db.clock().now();
    let scheduled = || {
        index
            .active
            .iter()
            .filter(move |r| r.backfill.is_none() && !waits_for_its_tick(r, now))
    };
    let Some(newest) = scheduled().max_by(|a, b| a.fire_time.cmp(&b.fire_time)) else {
        return Ok(());
    };
    let replaced = scheduled().filter(|r| r.run_id != newest.run_id);
    cancel_each(scope, replaced, pods, said, |old| {
        (
            "RunReplaced",
            format!(
                "run {} cancelled: run {} replaces it",
                old.run_id, newest.run_id
            ),
        )
    })
    .await
}

/// Cancels the active runs decided ahead of a tick still to come ([`waits_for_its_tick`]).
async fn cancel_ahead_of_tick(
    scope: &JobScope<'_>,
    index: &JobIndex,
    pods: &BTreeMap<String, RunPods>,
    now: DateTime<Utc>,
    said: &mut Announcements,
) -> Result<(), Error> {
    let waiting = index.active.iter().filter(|r| waits_for_its_tick(r, now));
    cancel_each(scope, waiting, pods, said, |run| {
        (
            "RunCancelled",
            format!(
                "run {} cancelled before its tick {}: the job is suspended",
                run.run_id,
                run.tick_label()
            ),
        )
    })
    .await
}

/// Cancels each of `runs` ([`sweeper::cancel_run`]); the Event `announce` gives (reason,
/// message) is announced once, by the controller whose call cancelled the run.
async fn cancel_each<'a>(
    scope: &JobScope<'_>,
    runs: impl Iterator<Item = &'a ActiveRun>,
    pods: &BTreeMap<String, RunPods>,
    said: &mut Announcements,
    announce: impl Fn(&ActiveRun) -> (&'static str, String),
) -> Result<(), Error> {
    let empty = RunPods::new();
    for run in runs {
        let outcome =
            sweeper::cancel_run(scope, run, pods.get(&run.run_id).unwrap_or(&empty)).await?;
        if outcome == sweeper::Cancel::Done {
            let (reason, message) = announce(run);
            said.normal(reason, message);
        }
    }
    Ok(())
}

/// The longest pause after a failed reconcile.
pub const MAX_RETRY: Duration = Duration::from_secs(60);

/// What to do after a failed reconcile: retry after an exponential backoff with jitter, per
/// job ([`crate::retry`]), never longer than a third of its lease ttl (the controller's passes
/// renew the leases of runs whose pods are pending) or [`MAX_RETRY`].
pub fn error_policy(job: Arc<CoordinatedJob>, error: &Error, cx: Arc<Context>) -> Action {
    let ttl = Duration::from_secs(job.spec.lease.ttl_seconds.max(1).unsigned_abs());
    let delay = cx.retries.failed(
        job.metadata.uid.as_deref().unwrap_or_default(),
        (ttl / 3).min(MAX_RETRY),
    );
    tracing::warn!(job = %job.name_any(), namespace = job.namespace().unwrap_or_default(), error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Tells the focus which run a pod cue concerns; while the pod watch lists (again), every
/// pass is a full one.
fn note_cue(focus: &sweeper::focus::Focus, event: &watcher::Event<Pod>, cue: bool) {
    let pod = match event {
        watcher::Event::Init => return focus.stop(),
        watcher::Event::InitDone => return focus.start(),
        watcher::Event::Apply(pod)
        | watcher::Event::Delete(pod)
        | watcher::Event::InitApply(pod) => pod,
    };
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let labels = pod.labels();
    let Some(job) = labels.get(LABEL_JOB) else {
        return;
    };
    match (event, labels.get(crate::pod::LABEL_RUN)) {
        (watcher::Event::InitApply(_), _) | (_, None) => focus.forget((namespace, job)),
        (_, Some(run)) if cue => focus.cue((namespace, job), run),
        _ => {}
    }
}

/// A pass as the runner holds it: it waits for one of the `turns`, then reconciles. The pass
/// itself is allocated only once the turn is taken: the runner is unbounded, so at a tick of
/// 10 000 jobs it holds 10 000 of these at once, and a pass's whole state (every await point
/// of [`reconcile`], tens of kilobytes) held inline by each would take hundreds of megabytes
/// before the first ran (the controller was killed at its 256 MiB limit so). Returns without
/// a pass once the turns are closed (shutting down).
pub async fn in_turn(
    turns: Arc<Turns>,
    job: Arc<CoordinatedJob>,
    cx: Arc<Context>,
) -> Result<Action, Error> {
    let Some(_turn) = turns.take().await else {
        return Ok(Action::await_change());
    };
    Box::pin(reconcile(job, cx)).await
}

/// Runs the controller until SIGTERM or SIGINT: watches CoordinatedJobs (in `namespace`, or
/// everywhere) and the pods they own.
pub async fn run(
    cx: Arc<Context>,
    namespace: Option<&str>,
    max_concurrent_reconciles: u16,
) -> Result<(), kube::Error> {
    let client = cx.client.clone();
    let (jobs, pods): (Api<CoordinatedJob>, Api<Pod>) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client, ns),
        ),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    // Wait, with the API server's message in the log, while the CRD is not established yet
    // (a chart installs it together with this Deployment) or RBAC is wrong.
    let mut attempt = 0u32;
    while let Err(e) = jobs.list(&ListParams::default().limit(1)).await {
        attempt += 1;
        if attempt >= 60 {
            return Err(e);
        }
        tracing::warn!(error = %e, "cannot list CoordinatedJobs yet (CRD not established, or RBAC); retrying");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    cx.metrics.set_ready(true);
    // Each pod event is filed in the cache before it triggers its job's reconcile, so that
    // pass sees it. The cache keeps only what reconcile reads of a pod (`pod_cache::trim`),
    // and only a change of that is a cue for a pass (`cues`).
    cx.pod_cache.reset();
    // Every pass sweeps every run until the pod watch's first listing is complete.
    cx.focus.stop();
    let cache = cx.pod_cache.clone();
    let focus = cx.focus.clone();
    let pod_cues = watcher(pods, watcher::Config::default().labels(LABEL_JOB))
        .default_backoff()
        .try_filter_map(move |event| {
            let cue = cache.apply(&event);
            note_cue(&focus, &event, cue);
            let pod = match event {
                watcher::Event::Apply(p)
                | watcher::Event::Delete(p)
                | watcher::Event::InitApply(p) => cue.then_some(p),
                watcher::Event::Init | watcher::Event::InitDone => None,
            };
            futures::future::ready(Ok(pod))
        });
    // The controller's own status writes are no cue: only what a pass acts on is.
    let (reader, writer) = reflector::store();
    // The job cache keeps no managed fields: nothing reads them, and at thousands of jobs
    // they are a good part of each object.
    let job_cues = watcher(jobs, watcher::Config::default())
        .default_backoff()
        .modify(|job| job.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects()
        .predicate_filter(crate::cues::job_cue, PredicateConfig::default());
    // The runner is unbounded and the passes take turns (`turns`): at its own bound it would
    // start waiting passes in hash order, not in the order they came due.
    let turns = Arc::new(Turns::new(max_concurrent_reconciles));
    let closing = turns.clone();
    Controller::for_stream(job_cues, reader)
        .owns_stream(pod_cues)
        .with_config(controller::Config::default().debounce(cx.settings.debounce))
        .shutdown_on_signal()
        .graceful_shutdown_on(async move {
            crate::cli::operator::shutdown_signal().await;
            closing.close();
        })
        .run(
            move |job, cx| in_turn(turns.clone(), job, cx),
            error_policy,
            cx,
        )
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(%object, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile did not complete"),
            }
        })
        .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `f` returns, without calling it.
    fn future_size<A, B, C, Fut>(_: impl Fn(A, B, C) -> Fut) -> usize {
        std::mem::size_of::<Fut>()
    }

    /// At a tick of 10 000 jobs the unbounded runner holds 10 000 passes waiting for their
    /// turn: each must be small, its pass allocated only once it runs.
    #[test]
    fn a_pass_waiting_for_its_turn_holds_little() {
        let waiting = future_size(in_turn);
        let pass = future_size(|job, cx, ()| reconcile(job, cx));
        println!("a pass waiting for its turn: {waiting} bytes; a running pass: {pass} bytes");
        assert!(waiting <= 1024, "{waiting} bytes per waiting pass");
        assert!(
            pass > 4 * waiting,
            "a pass ({pass} bytes) is not held inline"
        );
    }
}
