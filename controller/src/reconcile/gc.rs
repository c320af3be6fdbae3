//! Garbage collection of the pods of runs that are no longer active.

use super::*;

/// Settles the pods of runs that are not active: the pods of finished runs in the history
/// lose their result finalizer once quiescent; the pods of runs that left the history are
/// deleted; quiescent pods of runs this index does not know are deleted once their lease shows
/// the run is over (a pod that succeeded keeps its finalizer until its success is recorded).
/// Live pods of unknown runs are left alone: another controller may have just started them
/// and not yet shown us its index. The runs in `settled` ended in this pass, whose sweep
/// released their quiescent pods' finalizers already: the pass's copies of those pods predate
/// it, and a second release would only be refused as a conflict.
pub(super) async fn collect_garbage(
    scope: &JobScope<'_>,
    index: &JobIndex,
    pods: &BTreeMap<String, RunPods>,
    dropped: &[FinishedRun],
    settled: &BTreeSet<String>,
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
            if has_result_finalizer(pod) && !settled.contains(run) {
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
