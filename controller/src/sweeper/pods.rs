//! What the sweeper reads from, and does to, a run's pods: how a pod ended, whether anything of
//! it can still run, stopping it, and releasing its result finalizer once its outcome is in the
//! bucket.

use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, Pod};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PropagationPolicy};
use serde_json::json;

use super::{RunPods, RunReport, SweepError};
use crate::context::JobScope;
use crate::index::ActiveRun;
use crate::pod::RESULT_FINALIZER;
use crate::run::{self, PodOutcome, PodView, StartClock};
use cojob::LeaseInfo;

/// How a pod ended, or that it has not. A pod being deleted before it was ever placed on a
/// node is [`PodView::Absent`]: the API server refuses to bind a pod that is being deleted, so
/// nothing of it ever runs.
pub fn pod_view(pod: Option<&Pod>) -> PodView {
    let Some(pod) = pod else {
        return PodView::Absent;
    };
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    if phase != "Succeeded" && phase != "Failed" {
        let placed = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
        if pod.metadata.deletion_timestamp.is_some() && !placed {
            return PodView::Absent;
        }
        return PodView::Live;
    }
    PodView::Ended(PodOutcome {
        succeeded: phase == "Succeeded",
        exit_code: deciding_container(pod)
            .and_then(terminated)
            .map(|t| t.exit_code),
        reason: status.and_then(|s| s.reason.clone()),
    })
}

/// The container whose exit code tells how `pod` ended ([`pod_view`]): the first that
/// terminated with a non-zero code, else the first that terminated.
pub fn deciding_container(pod: &Pod) -> Option<&ContainerStatus> {
    let ended = || {
        pod.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .filter(|c| terminated(c).is_some())
    };
    ended()
        .find(|c| terminated(c).is_some_and(|t| t.exit_code != 0))
        .or_else(|| ended().next())
}

/// How `container` terminated, if it did.
pub fn terminated(container: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    container.state.as_ref()?.terminated.as_ref()
}

/// The reason the API server gives a pod's `PodScheduled` condition while a scheduling gate
/// holds it; it stays after the gates are removed, until the scheduler's first decision.
const SCHEDULING_GATED: &str = "SchedulingGated";

/// From when the start timeout of the attempt whose pod is `pod` counts ([`StartClock`]), read
/// from its `PodScheduled` condition and its kubelet's acknowledgement (`status.startTime`):
///
/// - held by a scheduling gate: from the dispatch (the controller's own gate is its own step;
///   a template's gate is someone else's, and the timeout is what bounds it);
/// - bound to a node by the scheduler, and taken up by the node's kubelet: from the later of
///   the binding (the condition turned `True`) and the kubelet's acknowledgement, so the pod
///   has the whole timeout for its images, volumes and sidecar;
/// - bound by the scheduler, not yet taken up by the node's kubelet: queued on that node, no
///   clock. A new attempt could not start sooner: it waits until this pod stopped (G3), which
///   only the same kubelet can report (or, once the node object is removed, the pod garbage
///   collector, which fails the pod);
/// - bound by the template's `nodeName` (no scheduler, no condition): from the dispatch (the
///   node may not exist);
/// - not bound, and the scheduler found no node for it (`False`, `Unschedulable`): from the
///   condition's time, which is its creation's, since the condition was `False` from the start;
/// - not bound, no decision yet (no condition, or still the gate's `SchedulingGated` after the
///   gates are gone): queued, no clock.
///
/// ```
/// use cojob_controller::run::StartClock;
/// use cojob_controller::sweeper::pods::start_clock;
/// let pod = |spec: serde_json::Value, conditions: serde_json::Value| -> k8s_openapi::api::core::v1::Pod {
///     serde_json::from_value(serde_json::json!({
///         "metadata": {"name": "r-1"}, "spec": spec, "status": {"conditions": conditions}
///     })).unwrap()
/// };
/// let gated = serde_json::json!([{"type": "PodScheduled", "status": "False",
///     "reason": "SchedulingGated", "lastTransitionTime": "2026-12-05T10:00:00Z"}]);
/// assert_eq!(start_clock(&pod(serde_json::json!({"containers": [], "schedulingGates": [{"name": "g"}]}), gated.clone())), StartClock::FromDispatch);
/// assert_eq!(start_clock(&pod(serde_json::json!({"containers": []}), gated)), StartClock::Queued);
/// let bound = serde_json::json!([{"type": "PodScheduled", "status": "True",
///     "lastTransitionTime": "2026-12-05T10:20:00Z"}]);
/// let mut on_node = pod(serde_json::json!({"containers": [], "nodeName": "n"}), bound);
/// assert_eq!(start_clock(&on_node), StartClock::Queued, "its kubelet has not taken it up");
/// on_node.status.as_mut().unwrap().start_time = serde_json::from_value(serde_json::json!("2026-12-05T10:32:00Z")).unwrap();
/// assert_eq!(start_clock(&on_node), StartClock::Since("2026-12-05T10:32:00Z".parse().unwrap()));
/// ```
pub fn start_clock(pod: &Pod) -> StartClock {
    let spec = pod.spec.as_ref();
    if spec
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|gates| !gates.is_empty())
    {
        return StartClock::FromDispatch;
    }
    let condition = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == POD_SCHEDULED);
    let since = |c: &k8s_openapi::api::core::v1::PodCondition| {
        c.last_transition_time
            .as_ref()
            .and_then(crate::api_time::from_api)
            .map_or(StartClock::FromDispatch, StartClock::Since)
    };
    let placed = spec.is_some_and(|s| s.node_name.is_some());
    match condition {
        Some(c) if placed && c.status == "True" => match (since(c), taken_up_at(pod)) {
            (_, None) => StartClock::Queued,
            (StartClock::Since(bound), Some(taken_up)) => StartClock::Since(bound.max(taken_up)),
            (_, Some(taken_up)) => StartClock::Since(taken_up),
        },
        // Bound without the scheduler (a template's `nodeName`), not taken up yet.
        _ if placed => StartClock::FromDispatch,
        Some(c) if c.status == "False" && c.reason.as_deref() != Some(SCHEDULING_GATED) => since(c),
        _ => StartClock::Queued,
    }
}

/// When a kubelet took `pod` up (`status.startTime`, by the kubelet's clock), if one did.
pub fn taken_up_at(pod: &Pod) -> Option<chrono::DateTime<chrono::Utc>> {
    pod.status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .and_then(crate::api_time::from_api)
}

/// Since when `pod` has waited for a kubelet to take it up: its creation, while its
/// `status.startTime` is unset; `None` once a kubelet took it up ([`run::Observed::waiting_since`]).
///
/// ```
/// use cojob_controller::sweeper::pods::waiting_since;
/// let mut pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
///     "metadata": {"name": "r-1", "creationTimestamp": "2026-12-06T10:00:00Z"},
///     "spec": {"containers": []}, "status": {"phase": "Pending"}
/// })).unwrap();
/// assert_eq!(waiting_since(&pod), Some("2026-12-06T10:00:00Z".parse().unwrap()));
/// pod.status.as_mut().unwrap().start_time = serde_json::from_value(serde_json::json!("2026-12-06T10:05:00Z")).unwrap();
/// assert_eq!(waiting_since(&pod), None, "taken up");
/// ```
pub fn waiting_since(pod: &Pod) -> Option<chrono::DateTime<chrono::Utc>> {
    if pod.status.as_ref().is_some_and(|s| s.start_time.is_some()) {
        return None;
    }
    pod.metadata
        .creation_timestamp
        .as_ref()
        .and_then(crate::api_time::from_api)
}

/// The type of a pod's condition that tells where the scheduler stands with it.
pub const POD_SCHEDULED: &str = "PodScheduled";

/// True when the pod may still run something.
pub fn is_live(pod: &Pod) -> bool {
    matches!(pod_view(Some(pod)), PodView::Live)
}

/// Every pod of the run older than `epoch` is quiescent: the next attempt may start (G3).
pub fn predecessors_quiescent(pods: &RunPods, epoch: u64) -> bool {
    pods.range(..epoch)
        .all(|(_, pod)| pod_view(Some(pod)).is_quiescent())
}

/// How a pod is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// With the pod's own grace period: the workload may wind down (cancel, finished runs).
    Graceful,
    /// With a one-second grace period: the pod of a lost attempt, which blocks the next one.
    /// (Not zero: the API server would forget a pod without a finalizer before its kubelet
    /// killed it.)
    Fence,
}

/// Deletes a pod; an absent pod is fine.
pub async fn delete_pod(scope: &JobScope<'_>, name: &str, how: Stop) -> Result<(), SweepError> {
    let params = DeleteParams {
        grace_period_seconds: match how {
            Stop::Graceful => None,
            Stop::Fence => Some(1),
        },
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    match scope.pods.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the pods that still run and are not being deleted already.
pub async fn stop_live_pods(
    scope: &JobScope<'_>,
    pods: Vec<&Pod>,
    how: Stop,
) -> Result<(), SweepError> {
    for pod in pods {
        if is_live(pod) && pod.metadata.deletion_timestamp.is_none() {
            tracing::info!(job = %scope.name, pod = %pod.name_any(), ?how, "stopping a pod");
            delete_pod(scope, &pod.name_any(), how).await?;
        }
    }
    Ok(())
}

/// Deletes the live pods of `run` whose epoch is older than `epoch`: their sidecar's next
/// write fails anyway (the bucket fences it); removing them stops the work, and the next
/// attempt's pod waits until they are quiescent.
pub async fn fence(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    pods: &RunPods,
    epoch: u64,
) -> Result<(), SweepError> {
    tracing::debug!(job = %scope.name, run = %run.run_id, epoch, "fencing older pods");
    let older: Vec<&Pod> = pods.range(..epoch).map(|(_, pod)| pod).collect();
    stop_live_pods(scope, older, Stop::Fence).await
}

/// True when the pod still carries the result finalizer.
pub fn has_result_finalizer(pod: &Pod) -> bool {
    pod.finalizers().iter().any(|f| f == RESULT_FINALIZER)
}

/// Removes the result finalizer, guarded by the pod's resourceVersion (a pod that changed
/// meanwhile is looked at again on the next pass).
pub async fn release_finalizer(scope: &JobScope<'_>, pod: &Pod) -> Result<(), SweepError> {
    let rest: Vec<&String> = pod
        .finalizers()
        .iter()
        .filter(|f| *f != RESULT_FINALIZER)
        .collect();
    let patch = json!({"metadata": {
        "finalizers": rest,
        "resourceVersion": pod.resource_version(),
    }});
    let name = pod.name_any();
    match scope
        .pods
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            tracing::debug!(job = %scope.name, pod = %name, "result finalizer released");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Releases the result finalizer of every pod of a run whose outcome is recorded or no longer
/// matters, judged on the lease as read before the pass (`lease`) and on where the pass left
/// the run (`report`).
pub async fn release_settled(
    scope: &JobScope<'_>,
    pods: &RunPods,
    lease: Option<&LeaseInfo>,
    report: &RunReport,
) -> Result<(), SweepError> {
    for (epoch, pod) in pods {
        if !has_result_finalizer(pod) {
            continue;
        }
        let view = pod_view(Some(pod));
        let settled = match report {
            RunReport::Finished(_) => view.is_quiescent(),
            RunReport::Active { epoch: now, .. } => {
                run::may_release_pod(*epoch, &view, lease)
                    || (epoch < now && view.is_quiescent() && view.succeeded().is_none())
            }
        };
        if settled {
            release_finalizer(scope, pod).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod(spec: Value, conditions: Value, start_time: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "r-1"},
            "spec": spec,
            "status": {"phase": "Pending", "conditions": conditions, "startTime": start_time}
        }))
        .unwrap()
    }

    fn scheduled(status: &str, reason: Option<&str>, at: &str) -> Value {
        json!([{"type": "PodScheduled", "status": status, "reason": reason, "lastTransitionTime": at}])
    }

    #[test]
    fn the_start_clock_follows_the_schedulers_decision() {
        let t = |s: &str| StartClock::Since(s.parse().unwrap());
        let created = "2026-12-05T10:00:00Z";
        let gate =
            json!({"containers": [], "schedulingGates": [{"name": "cojob.dev/holder-secret"}]});
        let ungated = json!({"containers": []});
        let bound = json!({"containers": [], "nodeName": "n"});
        let bound_at = "2026-12-05T10:30:00Z";
        let cases = [
            // Created with the controller's gate: the API server's condition.
            (
                gate.clone(),
                scheduled("False", Some("SchedulingGated"), created),
                None,
                StartClock::FromDispatch,
            ),
            // Gate removed, the scheduler has not looked yet (a backlog): no clock.
            (
                ungated.clone(),
                scheduled("False", Some("SchedulingGated"), created),
                None,
                StartClock::Queued,
            ),
            (ungated.clone(), json!([]), None, StartClock::Queued),
            (ungated.clone(), Value::Null, None, StartClock::Queued),
            (
                ungated.clone(),
                scheduled("Unknown", None, created),
                None,
                StartClock::Queued,
            ),
            // No node fits: the condition stays False, so its time is the creation's.
            (
                ungated.clone(),
                scheduled("False", Some("Unschedulable"), created),
                None,
                t(created),
            ),
            (
                ungated.clone(),
                scheduled("False", Some("SchedulerError"), created),
                None,
                t(created),
            ),
            // Bound, its kubelet has not taken it up (a backlog on the node, or a node that
            // is gone): no clock.
            (
                bound.clone(),
                scheduled("True", None, bound_at),
                None,
                StartClock::Queued,
            ),
            // Bound and taken up: from the later of the two.
            (
                bound.clone(),
                scheduled("True", None, bound_at),
                Some("2026-12-05T10:42:00Z"),
                t("2026-12-05T10:42:00Z"),
            ),
            // (A node's clock behind the API server's: not before the binding.)
            (
                bound.clone(),
                scheduled("True", None, bound_at),
                Some("2026-12-05T10:29:58Z"),
                t(bound_at),
            ),
            (
                bound.clone(),
                json!([{"type": "PodScheduled", "status": "True"}]),
                Some("2026-12-05T10:42:00Z"),
                t("2026-12-05T10:42:00Z"),
            ),
            // Bound by the template's nodeName (no scheduler, no condition).
            (bound.clone(), json!([]), None, StartClock::FromDispatch),
            (
                bound,
                scheduled("False", Some("SchedulingGated"), created),
                None,
                StartClock::FromDispatch,
            ),
            // A gate that is someone else's holds the pod: the timeout bounds it.
            (
                json!({"containers": [], "schedulingGates": [{"name": "example.com/quota"}]}),
                json!([]),
                None,
                StartClock::FromDispatch,
            ),
        ];
        for (spec, conditions, start_time, want) in cases {
            let p = pod(spec.clone(), conditions.clone(), start_time);
            assert_eq!(start_clock(&p), want, "{spec} {conditions} {start_time:?}");
            assert_eq!(
                start_clock(&crate::pod_cache::trim(&p)),
                want,
                "the cache keeps what the clock reads: {spec} {conditions} {start_time:?}"
            );
        }
    }
}
