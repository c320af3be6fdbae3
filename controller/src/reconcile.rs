//! Reconcile: turns a CoordinatedJob's schedule into exactly-once runs.
//!
//! One pass, for one object:
//!
//! 1. **Finalizer.** A deleted object cancels its active runs first (see [`finalize`]).
//! 2. **Spec.** A schedule the schema let through but cron cannot parse becomes a `Ready=False`
//!    condition and an `InvalidSpec` Event; nothing else happens until the spec changes.
//! 3. **Sweep.** Every active run in the job's index is driven one step
//!    ([`sweeper::sync_run`]); finished runs move to the history.
//! 4. **Ticks.** Every tick due since the index's cursor is claimed in the bucket with its
//!    decision, a run id, a skip or a miss; a lost claim converges on the winner's decision
//!    (I1). New runs are dispatched at once.
//! 5. **Status.** The status is patched by server-side apply, only when it changed, and the
//!    object is requeued for its next tick or the next sweep, whichever comes first.
//!
//! Every write that matters is conditional in the bucket, so two controllers reconciling the
//! same object at once stay correct without leader election.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use cojob::{Doc, Version};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::context::{Context, JobScope, MissingField};
use crate::crd::{
    CatchUpPolicy, ConcurrencyPolicy, CoordinatedJob, CoordinatedJobSpec, CoordinatedJobStatus,
    RunCounters, RunStatus,
};
use crate::index::{ActiveRun, Decision, FinishedRun, HistoryLimits, JobIndex};
use crate::layout::run_id;
use crate::pod::LABEL_JOB;
use crate::schedule::{CatchUp, Schedule, ScheduleError};
use crate::sweeper::{self, RunPods, RunReport, SweepError};

/// The finalizer that lets active runs be cancelled before the object goes.
pub const FINALIZER: &str = "cojob.dev/cancel-runs";
/// The server-side apply field manager of the status.
pub const FIELD_MANAGER: &str = "cojob-controller";
/// The condition type reconcile maintains.
pub const READY: &str = "Ready";
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
    /// True when the bucket is at fault (reported as `StoreUnavailable`).
    pub fn is_store(&self) -> bool {
        matches!(
            self,
            Error::Store(_) | Error::Sweep(SweepError::Store(_) | SweepError::Foreign { .. })
        )
    }
}

/// The schedule and time zone as the index records them; `None` without a schedule.
fn schedule_fingerprint(spec: &CoordinatedJobSpec) -> Option<String> {
    let expr = spec.schedule.as_deref()?;
    let words: Vec<&str> = expr.split_whitespace().collect();
    Some(format!(
        "{} {}",
        words.join(" "),
        spec.time_zone.as_deref().unwrap_or("UTC")
    ))
}

/// Parses the spec's schedule; `None` for a job without one.
pub fn parse_schedule(spec: &CoordinatedJobSpec) -> Result<Option<Schedule>, ScheduleError> {
    spec.schedule
        .as_deref()
        .map(|s| Schedule::parse(s, spec.time_zone.as_deref()))
        .transpose()
}

/// Reconciles one CoordinatedJob.
pub async fn reconcile(job: Arc<CoordinatedJob>, cx: Arc<Context>) -> Result<Action, Error> {
    let scope = JobScope::new(&cx, &job)?;
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
    let schedule = match parse_schedule(&job.spec) {
        Ok(s) => s,
        Err(e) => {
            report_not_ready(&scope, "InvalidSpec", &e.to_string()).await?;
            return Ok(Action::await_change());
        }
    };
    match sync(&scope, schedule.as_ref()).await {
        Ok(synced) => {
            let status = build_status(&scope, &synced);
            patch_status(&scope, status).await?;
            Ok(Action::requeue(synced.requeue))
        }
        Err(e) => {
            if e.is_store() {
                // The API server may be the one failing; the error is returned either way.
                let _ = report_not_ready(&scope, "StoreUnavailable", &e.to_string()).await;
            }
            Err(e)
        }
    }
}

/// Sets `Ready=False` with `reason` and, when the reason is new, publishes a Warning Event
/// (once the status is written, so a failing API server does not produce events either).
async fn report_not_ready(scope: &JobScope<'_>, reason: &str, message: &str) -> Result<(), Error> {
    let job = scope.job;
    let already = ready_reason(job) == Some(reason);
    let mut status = job.status.clone().unwrap_or_default();
    set_ready(&mut status, job, false, reason, message);
    patch_status(scope, status).await?;
    if !already {
        scope.warning(reason, message.to_string()).await;
    }
    Ok(())
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
}

fn history_limits(spec: &CoordinatedJobSpec) -> HistoryLimits {
    HistoryLimits {
        successful: usize::try_from(spec.successful_runs_history_limit).unwrap_or(0),
        failed: usize::try_from(spec.failed_runs_history_limit).unwrap_or(0),
    }
}

async fn list_pods(scope: &JobScope<'_>) -> Result<BTreeMap<String, RunPods>, Error> {
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

/// Sweeps the given runs.
async fn sweep(
    scope: &JobScope<'_>,
    runs: &[ActiveRun],
    pods: &BTreeMap<String, RunPods>,
) -> Swept {
    let empty = RunPods::new();
    let mut out = Swept::default();
    for run in runs {
        match sweeper::sync_run(scope, run, pods.get(&run.run_id).unwrap_or(&empty)).await {
            Ok(RunReport::Active {
                epoch,
                attempt,
                pod,
                phase,
            }) => out.active.push(RunStatus {
                run_id: run.run_id.clone(),
                tick: run.fire_time.clone().unwrap_or_else(|| "once".into()),
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

async fn sync(scope: &JobScope<'_>, schedule: Option<&Schedule>) -> Result<Synced, Error> {
    let db = &scope.cx.db;
    let spec = &scope.job.spec;
    let doc = db.doc::<JobIndex>(&scope.keys.index());
    let mut known = doc.get().await?;
    let pods = list_pods(scope).await?;
    let limits = history_limits(spec);

    // Sweep the active runs first, so the concurrency policy sees runs that just ended.
    let runs = index_of(&known).active;
    let Swept {
        mut active,
        finished,
        mut errors,
    } = sweep(scope, &runs, &pods).await;
    let mut dropped = Vec::new();
    if !finished.is_empty() {
        known = update_index(&doc, known, |i| {
            dropped = i.record_finished(&finished, limits);
        })
        .await?;
    }

    // Follow the schedule the spec has now: an edit applies from when it is seen.
    let now = db.clock().now();
    if let (Some(fingerprint), Some(expr)) = (schedule_fingerprint(spec), &spec.schedule) {
        let mut edited = false;
        known = update_index(&doc, known, |i| {
            edited = i.record_schedule(&fingerprint, now)
        })
        .await?;
        if edited {
            scope
                .normal(
                    "ScheduleChanged",
                    format!(
                        "schedule is now {expr:?}; it applies to ticks after {}",
                        cojob::json::format_time(now)
                    ),
                )
                .await;
        }
    }
    // Decide the due ticks.
    let (decisions, next, missed_before) =
        decide_ticks(scope, schedule, &index_of(&known), now).await?;
    if !decisions.is_empty() || missed_before.is_some() {
        known = update_index(&doc, known, |i| {
            if let Some(before) = missed_before {
                i.record_missed_range(before);
            }
            i.record_decisions(&decisions);
        })
        .await?;
    }
    let index = index_of(&known);
    let new_runs: Vec<ActiveRun> = index
        .active
        .iter()
        .filter(|r| !runs.iter().any(|s| s.run_id == r.run_id))
        .cloned()
        .collect();
    if spec.concurrency_policy == ConcurrencyPolicy::Replace {
        replace_older_runs(scope, &index, &pods).await?;
    }
    let started = sweep(scope, &new_runs, &pods).await;
    active.extend(started.active);
    errors.extend(started.errors);
    if !started.finished.is_empty() {
        known = update_index(&doc, known, |i| {
            dropped.extend(i.record_finished(&started.finished, limits));
        })
        .await?;
    }
    let index = index_of(&known);
    collect_garbage(scope, &index, &pods, &dropped).await?;
    active.retain(|a| index.active.iter().any(|r| r.run_id == a.run_id));

    let until_next =
        next.map(|n| (n - now).to_std().unwrap_or_default() + Duration::from_millis(50));
    let mut requeue = until_next.unwrap_or(IDLE_RESYNC).min(IDLE_RESYNC);
    if !index.active.is_empty() {
        // At least every sweep interval, and every third of the ttl, so a pending pod's lease
        // is renewed in time and an expired one is found within ttl + ttl/3.
        requeue = requeue
            .min(scope.cx.settings.sweep_interval)
            .min(scope.ttl() / 3);
    }
    if let Some((run, e)) = errors.into_iter().next() {
        tracing::warn!(job = %scope.name, %run, "a run could not be driven; reporting it");
        return Err(e.into());
    }
    Ok(Synced {
        index,
        active,
        next,
        requeue: requeue.max(Duration::from_millis(100)),
    })
}

/// `concurrencyPolicy: Replace`: cancels every active run but the newest, on every pass until
/// they are cancelled, so a crash or a failed cancel is retried.
async fn replace_older_runs(
    scope: &JobScope<'_>,
    index: &JobIndex,
    pods: &BTreeMap<String, RunPods>,
) -> Result<(), Error> {
    let Some(newest) = index
        .active
        .iter()
        .max_by(|a, b| a.fire_time.cmp(&b.fire_time))
    else {
        return Ok(());
    };
    let empty = RunPods::new();
    for old in index.active.iter().filter(|r| r.run_id != newest.run_id) {
        let done = sweeper::cancel_run(scope, old, pods.get(&old.run_id).unwrap_or(&empty)).await?;
        if done {
            scope
                .normal(
                    "RunReplaced",
                    format!(
                        "run {} cancelled: run {} replaces it",
                        old.run_id, newest.run_id
                    ),
                )
                .await;
        }
    }
    Ok(())
}

/// Settles the pods of runs that are not active: the pods of finished runs in the history
/// lose their result finalizer once quiescent; the pods of runs that left the history are
/// deleted; quiescent pods of runs this index does not know are deleted once their lease shows
/// the run is over (a pod that succeeded keeps its finalizer until its success is recorded).
/// Live pods of unknown runs are left alone: another controller may have just started them
/// and not yet shown us its index.
async fn collect_garbage(
    scope: &JobScope<'_>,
    index: &JobIndex,
    pods: &BTreeMap<String, RunPods>,
    dropped: &[FinishedRun],
) -> Result<(), Error> {
    use sweeper::pods::{has_result_finalizer, release_finalizer};
    for (run, run_pods) in pods {
        if index.active.iter().any(|r| &r.run_id == run) {
            continue; // the sweeper settles them
        }
        let in_history = index.recent.iter().any(|r| &r.run_id == run);
        let was_dropped = dropped.iter().any(|d| &d.run_id == run);
        let quiescent: Vec<&Pod> = run_pods
            .values()
            .filter(|p| sweeper::pod_view(Some(p)).is_quiescent())
            .collect();
        let over = if in_history || was_dropped {
            true
        } else if quiescent.iter().any(|p| has_result_finalizer(p)) {
            // An unknown run: only its lease can say whether its outcome is recorded.
            let lease = scope.cx.db.inspect_lease(&scope.keys.lease(run)).await?;
            lease.is_none_or(|l| {
                crate::run::RunState::parse(&l.state).is_ok_and(|s| s.status.is_terminal())
            })
        } else {
            true
        };
        if !over {
            continue;
        }
        for pod in quiescent {
            if has_result_finalizer(pod) {
                release_finalizer(scope, pod).await?;
            }
            if !in_history || was_dropped {
                sweeper::delete_pod(scope, &pod.name_any(), sweeper::Stop::Graceful).await?;
            }
        }
        if was_dropped {
            for pod in run_pods.values().filter(|p| sweeper::pods::is_live(p)) {
                sweeper::delete_pod(scope, &pod.name_any(), sweeper::Stop::Graceful).await?;
            }
        }
    }
    Ok(())
}

type TickDecisions = Vec<(Option<DateTime<Utc>>, Decision)>;

/// Claims the decision of every due tick; returns them oldest first with the next tick and
/// the start of the ticks after a long outage, if any.
async fn decide_ticks(
    scope: &JobScope<'_>,
    schedule: Option<&Schedule>,
    index: &JobIndex,
    now: DateTime<Utc>,
) -> Result<(TickDecisions, Option<DateTime<Utc>>, Option<DateTime<Utc>>), Error> {
    let spec = &scope.job.spec;
    let Some(schedule) = schedule else {
        if index.once_decided || spec.suspend {
            return Ok((Vec::new(), None, None));
        }
        let decision = claim(scope, None, Decision::RunId(run_id(&scope.name, None))).await?;
        return Ok((vec![(None, decision)], None, None));
    };
    let created = scope
        .job
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| DateTime::from_timestamp_micros(t.0.as_microsecond()))
        .unwrap_or(now);
    // The status mirrors the cursor, so an index lost to a bucket lifecycle rule (or a
    // restore) never makes old ticks due again.
    let mirrored = scope
        .job
        .status
        .as_ref()
        .and_then(|s| s.last_schedule_time.as_ref())
        .and_then(|t| DateTime::from_timestamp_micros(t.0.as_microsecond()));
    let since = index.cursor_time().max(mirrored).unwrap_or(created);
    let catch_up = match spec.catch_up {
        CatchUpPolicy::Latest => CatchUp::Latest,
        CatchUpPolicy::All => CatchUp::All,
        CatchUpPolicy::None => CatchUp::None,
    };
    let deadline = spec
        .starting_deadline_seconds
        .map(|s| Duration::from_secs(s.max(0).unsigned_abs()));
    let plan = schedule.plan(since, now, deadline, catch_up);
    let mut proposals: Vec<(DateTime<Utc>, Decision)> = plan
        .missed
        .iter()
        .map(|(t, why)| (*t, Decision::Missed(why.as_str().into())))
        .collect();
    let mut busy = !index.active.is_empty();
    let forbid = spec.concurrency_policy == ConcurrencyPolicy::Forbid;
    for t in &plan.run {
        proposals.push((*t, Decision::RunId(run_id(&scope.name, Some(*t)))));
    }
    proposals.sort_by_key(|(t, _)| *t);
    if !proposals.is_empty() && !still_current(scope).await? {
        return Ok((Vec::new(), plan.next, None));
    }
    let mut out = Vec::with_capacity(proposals.len());
    for (t, proposal) in proposals {
        let proposal = match proposal {
            Decision::RunId(_) if spec.suspend => Decision::Skipped("Suspended".into()),
            Decision::RunId(_) if forbid && busy => Decision::Skipped("ConcurrencyForbid".into()),
            other => other,
        };
        let decision = claim(scope, Some(t), proposal).await?;
        if matches!(decision, Decision::RunId(_)) {
            busy = true;
        }
        out.push((Some(t), decision));
    }
    Ok((out, plan.next, plan.missed_before))
}

/// A quorum read of the object before anything is claimed for it: the informer's copy may lag,
/// and a replica must not decide ticks for an object that was deleted, recreated (another
/// UID), suspended or edited since. `false`: skip this pass; the watch brings the news.
async fn still_current(scope: &JobScope<'_>) -> Result<bool, Error> {
    let api: Api<CoordinatedJob> = Api::namespaced(scope.cx.client.clone(), &scope.namespace);
    let fresh = api.get_opt(&scope.name).await?;
    let current = fresh.as_ref().is_some_and(|f| {
        f.uid().as_deref() == Some(scope.uid.as_str())
            && f.metadata.deletion_timestamp.is_none()
            && f.metadata.generation == scope.job.metadata.generation
    });
    if !current {
        tracing::info!(job = %scope.name, "the cached object is stale; deciding nothing this pass");
    }
    Ok(current)
}

/// Claims one tick's decision; returns the winner's, announcing it when it is ours.
async fn claim(
    scope: &JobScope<'_>,
    tick: Option<DateTime<Utc>>,
    proposal: Decision,
) -> Result<Decision, Error> {
    let key = scope.keys.tick(tick);
    let claim = scope.cx.db.claim(&key, &proposal).await?;
    if claim.won {
        let at = tick.map_or_else(|| "once".to_string(), cojob::json::format_time);
        match &claim.value {
            Decision::RunId(id) => {
                tracing::info!(job = %scope.name, tick = %at, run = %id, "tick claimed")
            }
            Decision::Skipped(why) => {
                scope
                    .normal("RunSkipped", format!("tick {at} skipped: {why}"))
                    .await
            }
            Decision::Missed(why) => {
                scope
                    .warning("RunMissed", format!("tick {at} missed: {why}"))
                    .await
            }
        }
    }
    Ok(claim.value)
}

fn to_time(t: DateTime<Utc>) -> Option<Time> {
    k8s_openapi::jiff::Timestamp::from_microsecond(t.timestamp_micros())
        .ok()
        .map(Time)
}

fn ready_reason(job: &CoordinatedJob) -> Option<&str> {
    job.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == READY)
        .map(|c| c.reason.as_str())
}

/// Sets the Ready condition, keeping its transition time when nothing but the message changed.
fn set_ready(
    status: &mut CoordinatedJobStatus,
    job: &CoordinatedJob,
    ready: bool,
    reason: &str,
    message: &str,
) {
    let value = if ready { "True" } else { "False" };
    let generation = job.metadata.generation;
    let previous = status.conditions.iter().find(|c| c.type_ == READY);
    let transition = match previous {
        Some(p) if p.status == value && p.reason == reason => p.last_transition_time.clone(),
        _ => Time(k8s_openapi::jiff::Timestamp::now()),
    };
    status.conditions.retain(|c| c.type_ != READY);
    status.conditions.push(Condition {
        type_: READY.into(),
        status: value.into(),
        reason: reason.into(),
        message: message.chars().take(1024).collect(),
        observed_generation: generation,
        last_transition_time: transition,
    });
    status.observed_generation = generation;
}

fn build_status(scope: &JobScope<'_>, synced: &Synced) -> CoordinatedJobStatus {
    let job = scope.job;
    let mut status = job.status.clone().unwrap_or_default();
    let index = &synced.index;
    // Never moves back: the status keeps the cursor if the index was lost.
    let previous = status.last_schedule_time.clone();
    status.last_schedule_time = index.cursor_time().and_then(to_time).max(previous);
    status.next_schedule_time = synced.next.and_then(to_time);
    status.active = synced.active.clone();
    status.recent = index
        .recent
        .iter()
        .map(|r| RunStatus {
            run_id: r.run_id.clone(),
            tick: r.fire_time.clone().unwrap_or_else(|| "once".into()),
            epoch: i64::try_from(r.epoch).unwrap_or(i64::MAX),
            attempt: i32::try_from(r.attempt).unwrap_or(i32::MAX),
            pod: Some(format!("{}-{}", r.run_id, r.epoch)),
            phase: r.status.as_str().into(),
        })
        .collect();
    let c = index.counters;
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    status.counters = RunCounters {
        active: count(index.active.len() as u64),
        succeeded: count(c.succeeded),
        failed: count(c.failed),
        cancelled: count(c.cancelled),
        skipped: count(c.skipped),
        missed: count(c.missed),
    };
    let message = if job.spec.suspend {
        "suspended: new ticks are skipped".to_string()
    } else {
        match synced.next {
            Some(n) => format!("next tick at {}", cojob::json::format_time(n)),
            None if index.active.is_empty() => "no more ticks".to_string(),
            None => "running".to_string(),
        }
    };
    set_ready(&mut status, job, true, "Reconciled", &message);
    status
}

/// Writes the status by server-side apply, unless it is unchanged.
async fn patch_status(scope: &JobScope<'_>, status: CoordinatedJobStatus) -> Result<(), Error> {
    if scope.job.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let api: Api<CoordinatedJob> = Api::namespaced(scope.cx.client.clone(), &scope.namespace);
    // The UID makes the patch fail on an object deleted and created again under the same
    // name since this (possibly cached) copy was read.
    let body = json!({
        "apiVersion": CoordinatedJob::api_version(&()),
        "kind": CoordinatedJob::kind(&()),
        "metadata": {"uid": scope.uid},
        "status": status,
    });
    api.patch_status(
        &scope.name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// Changes the finalizers, guarded by the object's resourceVersion.
async fn set_finalizers(
    scope: &JobScope<'_>,
    change: impl FnOnce(&mut Vec<String>),
) -> Result<(), Error> {
    let mut finalizers = scope.job.finalizers().to_vec();
    change(&mut finalizers);
    let api: Api<CoordinatedJob> = Api::namespaced(scope.cx.client.clone(), &scope.namespace);
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": scope.job.resource_version(),
    }});
    api.patch(&scope.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// A deleted object: cancel its active runs cooperatively, record them, then let it go.
pub async fn finalize(scope: &JobScope<'_>) -> Result<Action, Error> {
    if !scope.job.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    let doc = scope.cx.db.doc::<JobIndex>(&scope.keys.index());
    let known = doc.get().await?;
    let index = index_of(&known);
    let pods = list_pods(scope).await?;
    let empty = RunPods::new();
    for run in &index.active {
        match sweeper::cancel_run(scope, run, pods.get(&run.run_id).unwrap_or(&empty)).await {
            Ok(_) | Err(SweepError::Foreign { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let swept = sweep(scope, &index.active, &pods).await;
    let limits = history_limits(&scope.job.spec);
    let known = update_index(&doc, known, |i| {
        i.record_finished(&swept.finished, limits);
    })
    .await?;
    let index = index_of(&known);
    // Runs whose lease holds something cojob did not write are left as they are; they do not
    // keep the object from going.
    let foreign: Vec<&str> = swept
        .errors
        .iter()
        .filter(|(_, e)| matches!(e, SweepError::Foreign { .. }))
        .map(|(r, _)| r.as_str())
        .collect();
    if index
        .active
        .iter()
        .any(|r| !foreign.contains(&r.run_id.as_str()))
    {
        tracing::info!(job = %scope.name, active = index.active.len(), "waiting for runs to stop before removing the finalizer");
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    // Every run is over: the pods' outcomes are recorded, so their result finalizers go once
    // nothing of them runs. The object waits for pods still stopping, so no pod outlives it
    // with a finalizer nobody would remove.
    let pods = list_pods(scope).await?; // as they are after the cancels
    let mut stopping = Vec::new();
    for pod in pods.values().flat_map(|p| p.values()) {
        if !sweeper::pods::has_result_finalizer(pod) {
            continue;
        }
        if sweeper::pod_view(Some(pod)).is_quiescent() {
            sweeper::pods::release_finalizer(scope, pod).await?;
        } else {
            sweeper::pods::stop_live_pods(scope, vec![pod], sweeper::Stop::Graceful).await?;
            stopping.push(pod.name_any());
        }
    }
    if !stopping.is_empty() {
        tracing::info!(job = %scope.name, ?stopping, "waiting for pods to stop before removing the finalizer");
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    set_finalizers(scope, |f| f.retain(|x| x != FINALIZER)).await?;
    tracing::info!(job = %scope.name, "active runs cancelled; finalizer removed");
    Ok(Action::await_change())
}

/// What to do after a failed reconcile: retry after a pause, never at once.
pub fn error_policy(job: Arc<CoordinatedJob>, error: &Error, _cx: Arc<Context>) -> Action {
    tracing::warn!(job = %job.name_any(), namespace = job.namespace().unwrap_or_default(), error = %error, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Runs the controller until SIGTERM or SIGINT: watches CoordinatedJobs (in `namespace`, or
/// everywhere) and the pods they own.
pub async fn run(cx: Arc<Context>, namespace: Option<&str>) -> Result<(), kube::Error> {
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
    Controller::new(jobs, watcher::Config::default())
        .owns(pods, watcher::Config::default().labels(LABEL_JOB))
        .shutdown_on_signal()
        .run(reconcile, error_policy, cx)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(%object, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile did not complete"),
            }
        })
        .await;
    Ok(())
}
