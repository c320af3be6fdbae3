//! Dispatch: acquire a new epoch for a run and start its pod, never while a pod of an older
//! attempt can still run (G3).

use cojob::{Error as StoreError, LeaseInfo, LeaseOptions};
use kube::ResourceExt;
use kube::api::{ListParams, PostParams};

use super::{
    RunPods, RunReport, RunSynced, SweepError, active, complete, finished, foreign, holder, now_str,
};
use crate::announce::Announcements;
use crate::context::JobScope;
use crate::index::ActiveRun;
use crate::metrics::TakeoverOf;
use crate::pod::{LABEL_JOB, LABEL_RUN, RunIdentity, SidecarConfig};
use crate::run::{self, Acquire, Refusal, RunState};

/// Acquires a new epoch for `run` and spawns its pod once every older pod is quiescent. `prev`
/// is the lease as last read. An attempt whose pod this pass created is quiet as a pending
/// attempt is ([`crate::run::quiet_until`]), so the next full sweep leaves it out instead of
/// reading the lease this pass just wrote.
///
/// The holder is derived from the run and the epoch this dispatch expects
/// ([`holder::holder`]); the acquisition's `dispatch` marker makes a second controller doing
/// the same attach instead of taking another epoch.
pub async fn dispatch(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    prev: Option<&LeaseInfo>,
    pods: &RunPods,
    said: &mut Announcements,
) -> Result<RunSynced, SweepError> {
    let report = |report: RunReport| RunSynced {
        report,
        quiet_until: None,
    };
    let db = &scope.cx.db;
    let key = scope.keys.lease(&run.run_id);
    let expected = prev.map_or(1, |l| l.epoch.saturating_add(1));
    let holder = holder::holder(scope, &run.run_id, expected);
    let acquire = Acquire {
        run_id: run.run_id.clone(),
        fire_time: run.fire_time.clone(),
        dispatch: crate::pod::holder_secret_name(&run.run_id, expected),
        max_attempts: scope.max_attempts(),
        now: now_str(scope),
    };
    // Nothing has started under the new epoch: it holds for the pending ttl.
    let opts = LeaseOptions::new(holder.clone(), scope.pending_ttl())
        .state_fn(move |p| run::acquire(p, &acquire).map_err(Into::into));
    let mut acquired_here = true;
    let mut lease = match db.lease_from(&key, opts, prev).await {
        Ok(Some(lease)) => lease,
        Ok(None) => {
            // Held by someone else and not expired: another controller is ahead of us.
            let now = db.inspect_lease(&key).await?;
            return Ok(report(active(now.as_ref(), None)));
        }
        Err(StoreError::Aborted { source, .. }) => match source.downcast_ref::<Refusal>() {
            Some(Refusal::AlreadyDispatched) => {
                acquired_here = false;
                match db.attach_lease(&key, &holder, scope.pending_ttl()).await? {
                    Some(lease) => lease,
                    None => {
                        let now = db.inspect_lease(&key).await?;
                        return Ok(report(active(now.as_ref(), None)));
                    }
                }
            }
            Some(Refusal::Terminal(_)) => {
                let now = db.inspect_lease(&key).await?;
                let state = now
                    .as_ref()
                    .map(|l| RunState::parse(&l.state))
                    .transpose()
                    .map_err(|r| foreign(&run.run_id, r))?
                    .unwrap_or_default();
                return Ok(report(finished(run, now.as_ref(), &state)));
            }
            Some(other) => return Err(foreign(&run.run_id, other.clone())),
            None => return Err(StoreError::Aborted { key, source }.into()),
        },
        Err(e) => return Err(e.into()),
    };
    let state = RunState::parse(lease.state()).map_err(|r| foreign(&run.run_id, r))?;
    let epoch = lease.epoch();
    if state.status.is_terminal() {
        // Out of attempts, or cancelled: recorded by this acquisition; release at once.
        lease.release(None).await?;
        complete::announce_end(said, run, &state, epoch);
        return Ok(report(finished(run, Some(&lease.info()), &state)));
    }
    if epoch != expected {
        // The lease moved between our read and our write (a rare race of three controller
        // passes): the holder written is the one of another epoch, which no sidecar could
        // attach with. Release it unchanged; the next pass dispatches again.
        tracing::info!(job = %scope.name, run = %run.run_id, epoch, expected, "the lease moved during the dispatch; released");
        lease.release(None).await?;
        let now = db.inspect_lease(&key).await?;
        return Ok(report(active(now.as_ref(), None)));
    }
    let blocking: Vec<String> = pods
        .range(..epoch)
        .filter(|(_, p)| !super::pods::pod_view(Some(p)).is_quiescent())
        .map(|(_, p)| p.name_any())
        .collect();
    let pod = if blocking.is_empty() {
        match spawn(scope, run, epoch, state.attempt).await {
            Ok(pod) => pod,
            // Recorded by the next pass (the attempt's pod was never created), which fails
            // the attempt with the API server's reason.
            Err(SweepError::PodRejected { pod, code, message }) => {
                tracing::warn!(job = %scope.name, %pod, code, %message, "the API server refused the run's pod");
                return Ok(report(RunReport::Active {
                    epoch,
                    attempt: state.attempt,
                    pod: None,
                    phase: state.status,
                }));
            }
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    // Announced by the controller that acquired the epoch, not by one that attached to it.
    if let Some(lost) = prev.filter(|p| acquired_here && !p.is_released()) {
        // Taken over from a holder that went silent (the lease was held, and expired).
        let (of, how) = if RunState::parse(&lost.state).is_ok_and(|s| s.never_started()) {
            (TakeoverOf::Pending, "before its workload started")
        } else {
            (
                TakeoverOf::Running,
                "while its workload ran (pod gone or silent)",
            )
        };
        said.lease_lost(
            of,
            format!(
                "run {}: the lease of epoch {} expired {how}; taken over by epoch {epoch}",
                run.run_id, lost.epoch
            ),
            &crate::pod::pod_name(&run.run_id, lost.epoch),
        );
    }
    if acquired_here {
        let reason = if state.attempt <= 1 && epoch == 1 {
            "RunDispatched"
        } else {
            "RunRespawned"
        };
        let note = match &pod {
            Some(name) => format!(
                "run {} attempt {} started as pod {name} (epoch {epoch})",
                run.run_id, state.attempt
            ),
            None => format!(
                "run {} attempt {} (epoch {epoch}) starts once pod {} has stopped",
                run.run_id,
                state.attempt,
                blocking.join(", ")
            ),
        };
        if reason == "RunDispatched"
            && pod.is_some()
            && let Some(fired) = run.fire_at()
        {
            let lag = (scope.cx.db.clock().now() - fired)
                .to_std()
                .unwrap_or_default();
            scope.cx.metrics.dispatched(lag);
        }
        let related = pod
            .clone()
            .unwrap_or_else(|| crate::pod::pod_name(&run.run_id, epoch));
        said.run_normal(reason, note, &related);
    }
    tracing::info!(job = %scope.name, run = %run.run_id, epoch, attempt = state.attempt, waiting_for = ?blocking, "run dispatched");
    let quiet_until = pod
        .as_ref()
        .and_then(|_| super::quiet_after_dispatch(scope, &lease.info()));
    Ok(RunSynced {
        report: RunReport::Active {
            epoch,
            attempt: state.attempt,
            pod,
            phase: state.status,
        },
        quiet_until,
    })
}

/// Creates the pod of `(run, epoch)` (idempotent), then its holder Secret, owned by it, then
/// lifts the pod's holder gate; a pod created well ahead of its tick has none
/// ([`crate::pod::gate_free`]). Returns
/// the pod's name, or `None` while a pod of the same name from an older object still exists,
/// or while a pod of an older attempt can still run.
///
/// The caller judged the older attempts' pods on the pass's view, which may come from the
/// watch cache; from the second epoch on, they are listed afresh first, so a cache that lags
/// can delay an attempt but never start one beside a live predecessor (G3).
pub async fn spawn(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    epoch: u64,
    attempt: u32,
) -> Result<Option<String>, SweepError> {
    if epoch > 1 {
        let lp = ListParams::default().labels(&format!(
            "{LABEL_JOB}={},{LABEL_RUN}={}",
            scope.name, run.run_id
        ));
        let listed = scope.pods.list(&lp).await?.items;
        let fresh = super::group_pods(scope, listed)
            .remove(&run.run_id)
            .unwrap_or_default();
        if !super::pods::predecessors_quiescent(&fresh, epoch) {
            tracing::info!(job = %scope.name, run = %run.run_id, epoch, "an older attempt's pod is still running; the new pod waits");
            return Ok(None);
        }
    }
    let identity = RunIdentity {
        run_id: run.run_id.clone(),
        epoch,
        attempt,
        fire_time: run.fire_time.clone().unwrap_or_default(),
        trigger: run.trigger.clone(),
        lease_key: scope.keys.lease(&run.run_id),
        secret: crate::pod::new_holder_secret_name(&run.run_id, epoch),
    };
    let settings = &scope.cx.settings;
    let cfg = SidecarConfig {
        image: settings.sidecar_image.clone(),
        bucket: settings.bucket.clone(),
        env: Vec::new(),
        ttl_seconds: scope.job.spec.lease.ttl_seconds,
        credentials_secret: settings.sidecar_credentials_secret.clone(),
    };
    let template = scope
        .job
        .spec
        .template
        .decode()
        .map_err(SweepError::Template)?;
    let now = scope.cx.db.clock().now();
    let mut pod = crate::pod::build_pod(
        &template,
        &scope.namespace,
        scope.owner(),
        &scope.name,
        &identity,
        &cfg,
        deadline_from_creation(scope.job.spec.active_deadline_seconds, run.fire_at(), now),
    );
    // Well ahead of its tick, the pod goes without the holder gate: one write of the pod
    // instead of two (`crate::pod::GATE_FREE_LEAD`).
    if crate::pod::gate_free(run.fire_at(), now) {
        crate::pod::drop_holder_gate(&mut pod);
    }
    let name = identity.pod_name();
    let created = match scope.pods.create(&PostParams::default(), &pod).await {
        Ok(p) => p,
        Err(kube::Error::Api(s)) if s.code == 409 => scope.pods.get(&name).await?,
        Err(kube::Error::Api(s)) if matches!(s.code, 400 | 403 | 404 | 422) => {
            return Err(SweepError::PodRejected {
                pod: name,
                code: s.code,
                message: s.message,
            });
        }
        Err(e) => return Err(e.into()),
    };
    if !scope.owns(created.owner_references()) {
        tracing::info!(job = %scope.name, pod = %name, "a pod of an older object with this name still exists; waiting for it to go");
        return Ok(None);
    }
    holder::hand_to(scope, &run.run_id, epoch, &created).await?;
    Ok(Some(name))
}

/// The pod's `activeDeadlineSeconds`: the kubelet counts it from the pod's start, so a pod
/// created ahead of its tick (`prestartSeconds`) gets the seconds it waits for the tick on
/// top, and its workload keeps the whole deadline.
fn deadline_from_creation(
    deadline: Option<i64>,
    fire_at: Option<chrono::DateTime<chrono::Utc>>,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<i64> {
    let ahead = fire_at.map_or(0, |t| (t - now).num_seconds().max(0));
    deadline.map(|d| d.saturating_add(ahead))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_created_ahead_of_its_tick_keeps_its_whole_deadline() {
        let at = |t: &str| cojob::json::parse_time(t).unwrap();
        let now = at("2026-12-05T09:59:30Z");
        let tick = Some(at("2026-12-05T10:00:00.000000Z"));
        assert_eq!(deadline_from_creation(Some(120), tick, now), Some(150));
        let past = Some(at("2026-12-05T09:00:00.000000Z"));
        assert_eq!(deadline_from_creation(Some(120), past, now), Some(120));
        assert_eq!(deadline_from_creation(Some(120), None, now), Some(120));
        assert_eq!(deadline_from_creation(None, tick, now), None);
    }
}
