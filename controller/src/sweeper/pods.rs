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
use crate::run::{self, PodOutcome, PodView};
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
