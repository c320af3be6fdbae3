//! Completion: record how an attempt ended in the run's lease, then retry or finish.
//!
//! The final state is computed inside the compare-and-swap ([`cojob::Lease::release_with`]),
//! from the freshest stored state, so a cancel requested meanwhile is never erased. A pod of
//! any epoch whose workload succeeded ends the run as `succeeded` (G2).

use std::sync::Arc;

use cojob::{Error as StoreError, LeaseInfo, LeaseOptions};
use serde_json::Value;

use super::{RunPods, RunReport, SweepError, active, dispatch, finished, foreign, holder, now_str};
use crate::announce::Announcements;
use crate::context::JobScope;
use crate::index::ActiveRun;
use crate::run::{self, PodOutcome, Refusal, RunPhase, RunState};

/// How a state transition computes the final state from the stored one.
type Transition = dyn Fn(&Value) -> Result<(Value, RunPhase), Refusal> + Send + Sync;

/// A pod ended (the current epoch's, or any epoch's with a success): release with the final
/// state, and dispatch the next attempt when one is due.
pub async fn complete(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    lease: &LeaseInfo,
    outcome: &PodOutcome,
    pods: &RunPods,
    said: &mut Announcements,
) -> Result<RunReport, SweepError> {
    let (max, now) = (scope.max_attempts(), now_str(scope));
    let outcome2 = outcome.clone();
    let transition: Arc<Transition> = Arc::new(move |s| run::complete(s, &outcome2, max, &now));
    let Some((state, phase)) = record(scope, run, lease, transition).await? else {
        return Ok(active(Some(lease), None));
    };
    after_record(scope, run, lease, state, phase, pods, said).await
}

/// Why an attempt whose workload never started is given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unstarted {
    /// Its pod did not start the workload within `startTimeoutSeconds` (reason
    /// `StartTimeout`); the pod is stopped.
    TimedOut,
    /// The API server refused its pod (reason `PodRejected`); its holder Secret, created only
    /// after the pod, never existed.
    Rejected,
}

/// Ends the current attempt, which never started its workload (it counts), cleans up after
/// it, and retries when attempts are left (a quota may have room by then; an invalid template
/// fails every attempt). Nothing is recorded if the sidecar recorded a start meanwhile.
pub async fn fail_unstarted(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    lease: &LeaseInfo,
    pods: &RunPods,
    said: &mut Announcements,
    why: Unstarted,
) -> Result<RunReport, SweepError> {
    let (max, now) = (scope.max_attempts(), now_str(scope));
    let transition: Arc<Transition> = match why {
        Unstarted::TimedOut => Arc::new(move |s| run::start_timed_out(s, max, &now)),
        Unstarted::Rejected => Arc::new(move |s| run::pod_rejected(s, max, &now)),
    };
    let Some((state, phase)) = record(scope, run, lease, transition).await? else {
        return Ok(active(Some(lease), None));
    };
    if why == Unstarted::TimedOut {
        let pod = crate::pod::pod_name(&run.run_id, lease.epoch);
        tracing::info!(job = %scope.name, run = %run.run_id, %pod, "the attempt's pod did not start in time");
        super::pods::delete_pod(scope, &pod, super::pods::Stop::Fence).await?;
    }
    after_record(scope, run, lease, state, phase, pods, said).await
}

/// Writes the transition's state and releases the lease, holding it with the attempt's
/// holder, or, when the lease is not held by that holder (taken over for a result already, or
/// written under another holder key) and expired or was released, by taking it over guarded by
/// the attempt's `dispatch` marker (so a newer attempt is never overwritten) and by the
/// transition itself on the freshest state: `lease` may be stale (another controller recorded
/// the result and released since it was read), and a takeover that the transition would then
/// refuse would only move the epoch of a finished run.
/// `None`: someone else recorded the attempt first, or the transition refused.
async fn record(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    lease: &LeaseInfo,
    transition: Arc<Transition>,
) -> Result<Option<(Value, RunPhase)>, SweepError> {
    let db = &scope.cx.db;
    let key = scope.keys.lease(&run.run_id);
    let holder = holder::holder(scope, &run.run_id, lease.epoch);
    // With the attempt's own holder the result is recorded at the attempt's epoch, even past
    // the deadline: the compare-and-swap fails if anyone took the lease meanwhile.
    let attached = match db.attach_lease_from(&key, lease, &holder, scope.ttl())? {
        Some(handle) => Some(handle),
        None => {
            db.resume_lease(&key, &holder, lease.epoch, scope.ttl())
                .await?
        }
    };
    let took_over = attached.is_none();
    let mut handle = match attached {
        Some(handle) => handle,
        None if lease.is_released() || lease.is_expired_at(db.clock().now()) => {
            let dispatch = RunState::parse(&lease.state)
                .map_err(|r| foreign(&run.run_id, r))?
                .dispatch;
            let applies = transition.clone();
            let opts = LeaseOptions::new(cojob::new_holder(), scope.ttl()).state_fn(move |p| {
                let p = p.cloned().unwrap_or(Value::Null);
                if RunState::parse(&p)?.dispatch != dispatch {
                    return Err(Refusal::AlreadyDispatched.into());
                }
                applies(&p)?;
                Ok(p)
            });
            match db.lease_from(&key, opts, Some(lease)).await {
                Ok(Some(handle)) => handle,
                Ok(None) | Err(StoreError::Aborted { .. }) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
        None => return Ok(None),
    };
    let mut phase = RunPhase::Pending;
    let result = handle
        .release_with(|s| {
            let (next, p) = transition(s)?;
            phase = p;
            Ok(next)
        })
        .await;
    match result {
        Ok(()) => Ok(Some((handle.state().clone(), phase))),
        Err(StoreError::Aborted { .. }) => {
            // Refused on the freshest state (recorded by someone else, or started meanwhile).
            // A takeover handle is released with what is stored, so the epoch it took is not
            // left held.
            if took_over && !handle.is_released() {
                let _ = handle.release(None).await;
            }
            Ok(None)
        }
        Err(e) if e.is_lease_lost() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

async fn after_record(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    lease: &LeaseInfo,
    state: Value,
    phase: RunPhase,
    pods: &RunPods,
    said: &mut Announcements,
) -> Result<RunReport, SweepError> {
    let parsed = RunState::parse(&state).map_err(|r| foreign(&run.run_id, r))?;
    if phase == RunPhase::Retrying {
        said.run_warning(
            "RunRetrying",
            format!(
                "run {} attempt {} failed (exit code {}, reason {}); retrying",
                run.run_id,
                parsed.attempt,
                parsed.exit_code.map_or("none".into(), |c| c.to_string()),
                parsed.reason.as_deref().unwrap_or("Error"),
            ),
            &crate::pod::pod_name(&run.run_id, lease.epoch),
        );
        let released = scope
            .cx
            .db
            .inspect_lease(&scope.keys.lease(&run.run_id))
            .await?;
        return Ok(
            dispatch::dispatch(scope, run, released.as_ref(), pods, said)
                .await?
                .report,
        );
    }
    announce_end(said, run, &parsed, lease.epoch);
    let info = LeaseInfo {
        holder: None,
        state,
        ..lease.clone()
    };
    Ok(finished(run, Some(&info), &parsed))
}

/// Announces a run's end.
pub fn announce_end(said: &mut Announcements, run: &ActiveRun, state: &RunState, epoch: u64) {
    let code = state
        .exit_code
        .map_or_else(|| "none".to_string(), |c| c.to_string());
    let pod = crate::pod::pod_name(&run.run_id, epoch);
    let (warning, reason, note) = match state.status {
        RunPhase::Succeeded => (
            false,
            "RunSucceeded",
            format!("run {} succeeded on attempt {}", run.run_id, state.attempt),
        ),
        RunPhase::Cancelled => (
            false,
            "RunCancelled",
            format!("run {} cancelled", run.run_id),
        ),
        _ => (
            true,
            "RunFailed",
            format!(
                "run {} failed after {} attempt(s) (exit code {code}, reason {})",
                run.run_id,
                state.attempt,
                state.reason.as_deref().unwrap_or("Error")
            ),
        ),
    };
    if warning {
        said.run_warning(reason, note, &pod);
    } else {
        said.run_normal(reason, note, &pod);
    }
}
