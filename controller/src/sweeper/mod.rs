//! The sweeper: drives each active run one step along its lifecycle.
//!
//! Reconcile calls [`sync_run`] for every active run in the job's index at least every
//! `--sweep-interval` (a quiet run, whose pod lives and of which nothing is asked: once a step
//! may be due, [`run::quiet_until`]), and in between for the runs whose pods changed
//! ([`focus`]). It reads the run's lease (one GET, never a listing), looks at the run's pods,
//! picks the next step with [`run::decide`] and carries it out:
//!
//! - **dispatch** ([`dispatch`]): derive the epoch's holder ([`holder`]), acquire a new epoch
//!   with the [`run::acquire`] transition, and create the pod `<runId>-<epoch>`, then its holder
//!   Secret, once no pod of an older attempt can still run (G3);
//! - **complete** ([`complete`]): a pod ended, so record its outcome in the lease and release;
//!   a success of any epoch ends the run (G2); a failure with attempts left is dispatched again;
//! - **steal**: the lease is past its deadline plus the clock-skew allowance (pod deleted, node
//!   lost, sidecar silent), so take a new epoch; its pod waits until the old one is stopped.
//!   A takeover decided on a cached copy of the attempt's pod is confirmed first on the API
//!   server's copy: a watch that lags must not turn an ended workload into a respawn;
//! - **fence** ([`pods`]): delete live pods whose epoch is older than the lease's, with a
//!   one-second grace period;
//! - **cancel** ([`cancel`]): for a deleted job or `Replace`.
//!
//! Run pods carry a result finalizer, released only once their outcome is in the lease (or no
//! longer matters), so a pod deleted after it succeeded still shows how it ended.
//!
//! Each step is idempotent and ordered so that a crash between any two steps converges (I5):
//! holders are derived, so a holder is never lost; the acquisition's `dispatch` marker makes a
//! second acquisition for the same dispatch attach instead of taking another epoch; a pod
//! missing after a crash is created again (its sidecar records the pod's UID when it starts,
//! so at most one pod ever starts per epoch); a pod's holder Secret is created again while the
//! pod is pending.

pub mod cancel;
pub mod complete;
pub mod dispatch;
pub mod focus;
pub mod holder;
pub mod pods;
pub mod renew;

use std::collections::BTreeMap;

use cojob::{Error as StoreError, LeaseInfo};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

pub use cancel::{Cancel, cancel_run};
pub use pods::{Stop, delete_pod, pod_view};

use crate::announce::Announcements;
use crate::context::JobScope;
use crate::index::{ActiveRun, FinishedRun};
use crate::pod::{LABEL_EPOCH, LABEL_RUN};
use crate::run::{self, Observed, Refusal, RunPhase, RunState, Step};

/// A failure while driving a run.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The bucket failed (unreachable, wrong credentials, contention).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The Kubernetes API failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The run's lease holds something that is not a cojob run; it is left untouched.
    #[error("run {run_id}: {refusal}")]
    Foreign {
        /// The run.
        run_id: String,
        /// What is wrong.
        refusal: Refusal,
    },
    /// The API server refused to create a run's pod (400, 403, 404 or 422): the template,
    /// PodSecurity or a quota is at fault, not the controller.
    #[error("pod {pod} refused by the API server ({code}): {message}")]
    PodRejected {
        /// The pod.
        pod: String,
        /// The HTTP status.
        code: u16,
        /// The API server's message.
        message: String,
    },
    /// The job's pod template cannot be read back ([`crate::template`]); reconcile reports it
    /// before any run is swept, so this is only a change of the object in between.
    #[error("the pod template cannot be read back: {0}")]
    Template(#[source] serde_json::Error),
    /// The attempt's short-lived store credentials could not be minted.
    #[error("run {run_id}: {source}")]
    Credentials {
        /// The run.
        run_id: String,
        /// What failed.
        source: crate::credentials::MintError,
    },
}

/// What [`sync_run`] found of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSynced {
    /// Where the run stands.
    pub report: RunReport,
    /// Until when it needs no pass unless its pods are cues ([`run::quiet_until`]), for the
    /// job's [`focus`].
    pub quiet_until: Option<chrono::DateTime<chrono::Utc>>,
}

/// Where a run stands after a sweep.
#[derive(Debug, Clone, PartialEq)]
pub enum RunReport {
    /// Still running (or waiting to).
    Active {
        /// The lease's epoch (0 before the first acquisition).
        epoch: u64,
        /// The attempt.
        attempt: u32,
        /// The current pod, if it exists.
        pod: Option<String>,
        /// The run's phase.
        phase: RunPhase,
    },
    /// Terminal.
    Finished(FinishedRun),
}

/// The pods of one run, by epoch.
pub type RunPods = BTreeMap<u64, Pod>;

/// Groups the job's pods by run and epoch, keeping only pods this job controls.
pub fn group_pods(scope: &JobScope<'_>, pods: Vec<Pod>) -> BTreeMap<String, RunPods> {
    let mut out: BTreeMap<String, RunPods> = BTreeMap::new();
    for pod in pods {
        if !scope.owns(pod.owner_references()) {
            continue;
        }
        let labels = pod.labels();
        let (Some(run), Some(epoch)) = (
            labels.get(LABEL_RUN).cloned(),
            labels.get(LABEL_EPOCH).and_then(|e| e.parse::<u64>().ok()),
        ) else {
            continue;
        };
        out.entry(run).or_default().insert(epoch, pod);
    }
    out
}

fn now_str(scope: &JobScope<'_>) -> String {
    cojob::json::format_time(scope.cx.db.clock().now())
}

fn foreign(run_id: &str, refusal: Refusal) -> SweepError {
    SweepError::Foreign {
        run_id: run_id.into(),
        refusal,
    }
}

/// What the sweeper sees of a run's pods, for [`run::decide`]. When the current attempt's pod
/// is not in the listing and that absence would let the pod be created again
/// ([`Step::CreatePod`]), one fresh read by name confirms that it does not exist (a listing
/// taken just before another controller created it would otherwise look the same). An absence
/// that decides nothing (an attempt that started, or one that waits for an older pod to stop)
/// costs no read: under respawns those were most of a pass's reads. A takeover of an absent
/// pod reads it in [`confirm_takeover`].
async fn observe(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    lease: Option<&LeaseInfo>,
    pods: &RunPods,
) -> Result<Observed, SweepError> {
    let current_pod = lease.and_then(|l| pods.get(&l.epoch));
    let mut seen = Observed {
        current: pod_view(current_pod),
        succeeded: pods
            .values()
            .find_map(|p| pod_view(Some(p)).succeeded().cloned()),
        predecessors_quiescent: lease.is_none_or(|l| pods::predecessors_quiescent(pods, l.epoch)),
        pod_missing: false,
        start_clock: current_pod.map_or(run::StartClock::FromDispatch, pods::start_clock),
        waiting_since: current_pod.and_then(pods::waiting_since),
    };
    if let Some(l) = lease
        && current_pod.is_none()
        && run::absence_decides(l, &seen, &scope.timing())
    {
        seen.pod_missing = scope
            .pods
            .get_opt(&crate::pod::pod_name(&run.run_id, l.epoch))
            .await?
            .is_none();
    }
    Ok(seen)
}

/// The run's next step ([`run::decide`]) on what is observed of `pods`, with what was observed.
async fn decide(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    lease: Option<&LeaseInfo>,
    pods: &RunPods,
) -> Result<(Step, Observed), SweepError> {
    let seen = observe(scope, run, lease, pods).await?;
    let step = run::decide(lease, &seen, &scope.timing()).map_err(|r| foreign(&run.run_id, r))?;
    Ok((step, seen))
}

/// Until when the run needs no pass unless its pods are cues ([`run::quiet_until`]), and not
/// past its pending lease's renewal (`renewal`, [`keep_pending_alive`]) or its credentials'
/// next renewal; `None` for a pod that is being deleted, or a time that has come (a renewal
/// that failed is retried by the next full sweep).
fn quiet_until(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    lease: &LeaseInfo,
    seen: &Observed,
    pod: Option<&Pod>,
    renewal: Option<chrono::DateTime<chrono::Utc>>,
) -> Option<chrono::DateTime<chrono::Utc>> {
    if pod?.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let timing = scope.timing();
    let until = run::quiet_until(lease, &Step::Wait, seen, &timing, scope.lifetimes())?;
    let until = [renewal, renew::due(scope, run, lease, pod)]
        .into_iter()
        .flatten()
        .fold(until, chrono::DateTime::min);
    (until > timing.now).then_some(until)
}

/// Until when a run whose pod the pass just created under `lease` (the epoch it acquired)
/// needs no pass unless its pods are cues: as [`quiet_until`] would find it at the next full
/// sweep, its pod live and waiting for a node. Its start clock is taken as running from the
/// dispatch (the earliest it can start, [`run::StartClock::FromDispatch`]), and the pending
/// lease's renewal is due a third of the pending ttl after this acquisition. `None` when the
/// controller mints credentials: their renewal is timed from the pod's creation, which the
/// next full sweep reads.
fn quiet_after_dispatch(
    scope: &JobScope<'_>,
    lease: &LeaseInfo,
) -> Option<chrono::DateTime<chrono::Utc>> {
    if scope.cx.settings.minter.is_some() {
        return None;
    }
    let seen = Observed {
        current: run::PodView::Live,
        succeeded: None,
        predecessors_quiescent: true,
        pod_missing: false,
        start_clock: run::StartClock::FromDispatch,
        // Just created: its kubelet may take it up in the next second without a cue.
        waiting_since: None,
    };
    let timing = scope.timing();
    let until = run::quiet_until(lease, &Step::Wait, &seen, &timing, scope.lifetimes())?
        .min(pending_renewal_due(scope, lease.deadline)?);
    (until > timing.now).then_some(until)
}

/// When the lease of a pending attempt that holds until `deadline` is due for renewal: once
/// two thirds of the pending ttl are left ([`keep_pending_alive`]).
fn pending_renewal_due(
    scope: &JobScope<'_>,
    deadline: chrono::DateTime<chrono::Utc>,
) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::Duration::from_std(scope.pending_ttl() * 2 / 3)
        .ok()
        .and_then(|left| deadline.checked_sub_signed(left))
}

/// Drives one active run a step forward; what to tell the user goes to `said`.
pub async fn sync_run(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    pods: &RunPods,
    said: &mut Announcements,
) -> Result<RunSynced, SweepError> {
    let key = scope.keys.lease(&run.run_id);
    let lease = scope.cx.db.inspect_lease(&key).await?;
    if let Some(l) = &lease {
        pods::fence(scope, run, pods, l.epoch).await?;
    }
    let (mut step, mut seen) = decide(scope, run, lease.as_ref(), pods).await?;
    let confirmed;
    let pods = match (&step, &lease) {
        (Step::Steal, Some(l)) => match confirm_takeover(scope, run, l, pods).await? {
            Some((fresh, again, observed)) => {
                step = again;
                seen = observed;
                confirmed = fresh;
                &confirmed
            }
            None => pods,
        },
        _ => pods,
    };
    let mut quiet = None;
    tracing::debug!(job = %scope.name, run = %run.run_id, ?step, "sweep");
    let current = lease.as_ref().and_then(|l| pods.get(&l.epoch));
    let report = match (step, &lease) {
        (Step::Dispatch, _) | (_, None) => {
            let synced = dispatch::dispatch(scope, run, lease.as_ref(), pods, said).await?;
            quiet = synced.quiet_until;
            synced.report
        }
        (Step::Finished(state), _) => {
            // A pod created by a racing dispatch after the run ended, or left by a crash
            // between a cancel's release and its pod deletion: stop it (its sidecar cannot
            // attach, so its workload never started).
            pods::stop_live_pods(scope, pods.values().collect(), Stop::Graceful).await?;
            finished(run, lease.as_ref(), &state)
        }
        (Step::Wait, Some(l)) => {
            let renewal = keep_pending_alive(scope, run, l, current).await?;
            renew::credentials(scope, run, l, current).await?;
            quiet = quiet_until(scope, run, l, &seen, current, renewal);
            active(lease.as_ref(), current)
        }
        (Step::CreatePod, Some(l)) => {
            let state = RunState::parse(&l.state).map_err(|r| foreign(&run.run_id, r))?;
            match dispatch::spawn(scope, run, l.epoch, state.attempt).await {
                Ok(pod) => {
                    tracing::info!(job = %scope.name, run = %run.run_id, epoch = l.epoch, ?pod, "pod created");
                    RunReport::Active {
                        epoch: l.epoch,
                        attempt: state.attempt,
                        pod,
                        phase: state.status,
                    }
                }
                Err(SweepError::PodRejected { pod, code, message }) => {
                    tracing::warn!(job = %scope.name, %pod, code, %message, "the API server refused the run's pod");
                    said.run_warning(
                        "PodRejected",
                        format!("pod {pod} refused by the API server: {message}"),
                        &pod,
                    );
                    complete::fail_unstarted(
                        scope,
                        run,
                        l,
                        pods,
                        said,
                        complete::Unstarted::Rejected,
                    )
                    .await?
                }
                Err(e) => return Err(e),
            }
        }
        (Step::Complete(outcome), Some(l)) => {
            complete::complete(scope, run, l, &outcome, pods, said).await?
        }
        (Step::StartTimedOut, Some(l)) => {
            complete::fail_unstarted(scope, run, l, pods, said, complete::Unstarted::TimedOut)
                .await?
        }
        (Step::Steal, Some(l)) => steal(scope, run, l, pods, said).await?,
    };
    pods::release_settled(scope, pods, lease.as_ref(), &report).await?;
    Ok(RunSynced {
        report,
        quiet_until: quiet,
    })
}

/// A takeover is decided on the pod cache, which may lag the API server (an overloaded
/// watch), and costs a write, a fence and a new pod: before it, read the current attempt's
/// pod fresh (one GET, only on this rare path). If the API server holds a newer copy (the
/// workload ended, the pod succeeded), or a pod the cache has not seen yet, decide again on it
/// and return the run's pods with it; `None` keeps the decision (the same copy, or the pod is
/// gone, which a takeover is for).
async fn confirm_takeover(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    lease: &LeaseInfo,
    pods: &RunPods,
) -> Result<Option<(RunPods, Step, Observed)>, SweepError> {
    let cached = pods.get(&lease.epoch);
    let name = crate::pod::pod_name(&run.run_id, lease.epoch);
    let Some(fresh) = scope.pods.get_opt(&name).await? else {
        return Ok(None);
    };
    if cached.is_some_and(|c| c.resource_version() == fresh.resource_version()) {
        return Ok(None);
    }
    let mut refreshed = pods.clone();
    refreshed.insert(lease.epoch, fresh);
    let (step, seen) = decide(scope, run, Some(lease), &refreshed).await?;
    if step != Step::Steal {
        tracing::info!(job = %scope.name, run = %run.run_id, epoch = lease.epoch, ?step, "the pod cache lagged; the attempt's pod, read fresh, needs no takeover");
    }
    Ok(Some((refreshed, step, seen)))
}

/// The lease is past its deadline plus the skew allowance: take a new epoch (which fences the
/// old holder in the bucket), then stop the old pod; the new pod starts once it is quiescent.
async fn steal(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    lease: &LeaseInfo,
    pods: &RunPods,
    said: &mut Announcements,
) -> Result<RunReport, SweepError> {
    // The last attempt's pod (or a cancelled run's) may still run, and succeed: a takeover
    // would only record `AttemptsExhausted` (or `cancelled`) over an outcome that is not known
    // yet. Stop the pod and record how it ended instead.
    let state = RunState::parse(&lease.state).map_err(|r| foreign(&run.run_id, r))?;
    let current = pods.get(&lease.epoch);
    if (state.attempt >= scope.max_attempts() || state.cancel_requested)
        && !state.never_started()
        && current.is_some_and(|p| !pod_view(Some(p)).is_quiescent())
    {
        if let Some(pod) = current
            && pod.metadata.deletion_timestamp.is_none()
        {
            tracing::info!(job = %scope.name, run = %run.run_id, pod = %pod.name_any(), "the last attempt's lease expired; stopping its pod to record how it ended");
            pods::delete_pod(scope, &pod.name_any(), Stop::Fence).await?;
        }
        return Ok(active(Some(lease), current));
    }
    let report = dispatch::dispatch(scope, run, Some(lease), pods, said)
        .await?
        .report;
    let epoch = match &report {
        RunReport::Active { epoch, .. } => *epoch,
        RunReport::Finished(f) => f.epoch,
    };
    if epoch > lease.epoch {
        // `LeaseLost` is announced by `dispatch`, only by the controller that took it over.
        pods::fence(scope, run, pods, epoch).await?;
    }
    Ok(report)
}

/// Renews the lease of an attempt whose workload has not started: its pod is pending
/// (unscheduled, pulling its image), or not created yet because an older pod is still
/// stopping, or it is a run decided ahead of its tick whose sidecar's attach time has not
/// come ([`crate::run::attach_at`]). Its sidecar cannot renew before it runs, and a slow start
/// is not a lost run; the start timeout bounds it. The lease holds for the pending ttl (the
/// longer of the ttl and the start timeout), and the renewal is due when a third of it has
/// passed, so it costs one write every pending ttl/3 per pending run, and a pass may come that
/// late without a takeover.
///
/// Returns when the next renewal is due, for an attempt this controller keeps alive (now, if
/// the lease moved under it); `None` for one it does not (its pod runs, is being deleted, or
/// the attempt started).
async fn keep_pending_alive(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    lease: &LeaseInfo,
    pod: Option<&Pod>,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, SweepError> {
    let state = RunState::parse(&lease.state).ok();
    let now = scope.cx.db.clock().now();
    // A run decided ahead of its tick: its sidecar attaches only shortly before the tick,
    // whatever its pod's phase says meanwhile (a kubelet reports it Pending while the start
    // gate waits; a simulated one, Running).
    let before_attach = state
        .as_ref()
        .is_some_and(|s| crate::run::attach_at(s.fire_at(), now).is_some());
    let waiting = match pod {
        Some(pod) => {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            (matches!(phase, None | Some("Pending")) || before_attach)
                && pod.metadata.deletion_timestamp.is_none()
        }
        None => true, // not created yet: an older pod is still stopping
    };
    let pending =
        waiting && !lease.is_released() && state.as_ref().is_some_and(RunState::never_started);
    if !pending {
        return Ok(None);
    }
    if let Some(pod) = pod {
        // A crash may have come between creating the pod and its Secret or ungating it.
        holder::converge(scope, &run.run_id, lease.epoch, pod).await?;
    }
    let ttl = scope.pending_ttl();
    let due = pending_renewal_due(scope, lease.deadline);
    if due.is_some_and(|due| now < due) {
        return Ok(due);
    }
    let holder = holder::holder(scope, &run.run_id, lease.epoch);
    let key = scope.keys.lease(&run.run_id);
    // Not this epoch's holder, or the lease moved since it was read: the next pass finds out
    // how, and is due now.
    let Some(mut handle) = scope.cx.db.attach_lease_from(&key, lease, &holder, ttl)? else {
        return Ok(Some(now));
    };
    match handle.renew().await {
        Ok(()) => {
            tracing::debug!(job = %scope.name, run = %run.run_id, "renewed the lease of a pending attempt");
            Ok(pending_renewal_due(scope, handle.deadline()))
        }
        Err(e) if e.is_lease_lost() => Ok(Some(now)),
        Err(e) => Err(e.into()),
    }
}

fn active(lease: Option<&LeaseInfo>, pod: Option<&Pod>) -> RunReport {
    let state = lease.and_then(|l| RunState::parse(&l.state).ok());
    RunReport::Active {
        epoch: lease.map_or(0, |l| l.epoch),
        attempt: state.as_ref().map_or(0, |s| s.attempt),
        pod: pod.map(|p| p.name_any()),
        phase: state.map_or(RunPhase::Pending, |s| s.status),
    }
}

fn finished(run: &ActiveRun, lease: Option<&LeaseInfo>, state: &RunState) -> RunReport {
    RunReport::Finished(FinishedRun {
        run_id: run.run_id.clone(),
        fire_time: run.fire_time.clone(),
        trigger: run.trigger.clone(),
        status: state.status,
        epoch: lease.map_or(0, |l| l.epoch),
        attempt: state.attempt,
        exit_code: state.exit_code,
        finished_at: state.finished_at.clone(),
    })
}
