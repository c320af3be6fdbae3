//! Cancel: stop a run for good (the job was deleted, or `Replace` supersedes it).

use cojob::{Error as StoreError, LeaseOptions};
use serde_json::json;

use super::pods::{self, Stop};
use super::{RunPods, SweepError, foreign, holder, now_str};
use crate::context::JobScope;
use crate::index::ActiveRun;
use crate::run::{self, PodView, RunPhase, RunState};

/// Where a cancel stands after one [`cancel_run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel {
    /// Asked; the run is not terminal yet (its workload is being stopped).
    Pending,
    /// This call recorded the run as cancelled (announce it).
    Done,
    /// The run was terminal already (another controller, or an earlier pass, ended it).
    Already,
}

impl Cancel {
    /// True once the run is terminal.
    pub fn is_terminal(self) -> bool {
        self != Cancel::Pending
    }
}

/// Cancels a run cooperatively: marks `cancel_requested` (the sidecar shows it to the
/// workload). An attempt whose workload never started is released as `cancelled` at once and
/// its pod deleted; one whose workload runs is stopped (with its grace period), and its outcome
/// is recorded when the pod ends: `cancelled`, or `succeeded` if the workload still exited 0,
/// since its effect happened. A run that was never dispatched is recorded as cancelled so it
/// never starts. Says whether the run is terminal now, and whether this call made it so.
pub async fn cancel_run(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    pods: &RunPods,
) -> Result<Cancel, SweepError> {
    let db = &scope.cx.db;
    // A cancelled run is swept by every full sweep until it ended, quiet or not.
    scope
        .cx
        .focus
        .wake((&scope.namespace, &scope.name), &run.run_id);
    let key = scope.keys.lease(&run.run_id);
    let now = now_str(scope);
    let lease = db.inspect_lease(&key).await?;
    let held = match &lease {
        Some(l) => {
            let state = RunState::parse(&l.state).map_err(|r| foreign(&run.run_id, r))?;
            if state.status.is_terminal() {
                return Ok(Cancel::Already);
            }
            !l.is_released() && !l.is_expired_at(db.clock().now())
        }
        None => false,
    };
    // While a pod of the run may still run, or succeeded without its success being recorded,
    // nothing is declared: ask the workload to stop, and let the sweeper record how it ended
    // (a success stays a success). The current attempt's pod counts as settled while that
    // attempt never started: its workload waits for the lease, which the cancel takes first.
    let unstarted_epoch = lease.as_ref().and_then(|l| {
        RunState::parse(&l.state)
            .ok()
            .filter(RunState::never_started)
            .map(|_| l.epoch)
    });
    let settled = pods.iter().all(|(epoch, p)| {
        let view = pods::pod_view(Some(p));
        (view.is_quiescent() && view.succeeded().is_none())
            || (Some(*epoch) == unstarted_epoch && view.succeeded().is_none())
    });
    if !settled {
        if lease.is_some() {
            db.cooperative_write(&key, |s| {
                cojob::lease::merge(s, json!({"cancel_requested": true}))
            })
            .await?;
        }
        pods::stop_live_pods(scope, pods.values().collect(), Stop::Graceful).await?;
        return Ok(Cancel::Pending);
    }
    if !held {
        let (run_id, fire_time, now2) = (run.run_id.clone(), run.fire_time.clone(), now.clone());
        let opts = LeaseOptions::new(cojob::new_holder(), scope.ttl()).state_fn(move |p| {
            Ok(match p {
                Some(p) => run::cancel(p, &now2)?,
                None => json!({
                    "status": RunPhase::Cancelled, "attempt": 0, "run_id": run_id,
                    "fire_time": fire_time, "reason": "Cancelled", "finished_at": now2,
                    "cancel_requested": true,
                }),
            })
        });
        return match db.lease_from(&key, opts, lease.as_ref()).await {
            Ok(Some(mut handle)) => {
                handle.release(None).await?;
                pods::stop_live_pods(scope, pods.values().collect(), Stop::Graceful).await?;
                Ok(Cancel::Done)
            }
            Ok(None) => Ok(Cancel::Pending),
            Err(StoreError::Aborted { .. }) => Ok(Cancel::Already),
            Err(e) => Err(e.into()),
        };
    }
    let Some(lease) = lease else {
        return Ok(Cancel::Pending);
    };
    db.cooperative_write(&key, |s| {
        cojob::lease::merge(s, json!({"cancel_requested": true}))
    })
    .await?;
    if let PodView::Ended(_) = pods::pod_view(pods.get(&lease.epoch)) {
        return Ok(Cancel::Pending); // the sweeper completes it (as cancelled unless it succeeded)
    }
    let started = RunState::parse(&lease.state)
        .map_err(|r| foreign(&run.run_id, r))?
        .started_at
        .is_some();
    if started {
        // The workload may still finish: stop it, and let the sweeper record how it ended.
        pods::stop_live_pods(scope, pods.values().collect(), Stop::Graceful).await?;
        return Ok(Cancel::Pending);
    }
    let holder = holder::holder(scope, &run.run_id, lease.epoch);
    let Some(mut handle) = db
        .resume_lease(&key, &holder, lease.epoch, scope.ttl())
        .await?
    else {
        // Not this controller's holder (taken over meanwhile, or a holder key that changed):
        // stop the pods; the lease expires and the sweeper records the cancel.
        pods::stop_live_pods(scope, pods.values().collect(), Stop::Graceful).await?;
        return Ok(Cancel::Pending);
    };
    // Computed on the freshest state: a completion that won the race is not overwritten, and a
    // sidecar that recorded a start meanwhile (same holder) makes it refuse.
    match handle
        .release_with(|s| run::cancel_unstarted(s, &now).map_err(Into::into))
        .await
    {
        Ok(()) => {}
        Err(StoreError::Aborted { .. }) => return Ok(Cancel::Pending), // started, or ended, meanwhile
        Err(e) if e.is_lease_lost() => return Ok(Cancel::Pending),
        Err(e) => return Err(e.into()),
    }
    pods::stop_live_pods(scope, pods.values().collect(), Stop::Graceful).await?;
    tracing::info!(job = %scope.name, run = %run.run_id, "run cancelled");
    Ok(Cancel::Done)
}
