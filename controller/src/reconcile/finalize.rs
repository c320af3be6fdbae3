//! A deleted CoordinatedJob: cancel its runs, release its pods, then let it go.

use super::*;

/// Changes the finalizers, guarded by the object's resourceVersion.
pub(super) async fn set_finalizers(
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
    let mut said = Announcements::default();
    let result = cancel_and_release(scope, &mut said).await;
    said.publish(scope).await;
    result
}

async fn cancel_and_release(
    scope: &JobScope<'_>,
    said: &mut Announcements,
) -> Result<Action, Error> {
    if !scope.job.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    let doc = scope.cx.db.doc::<JobIndex>(&scope.keys.index());
    let known = match read_index(scope, &doc).await {
        Ok(known) => known,
        // An index that can never be read (corrupt, foreign, oversized) must not keep the
        // object forever: without it the runs cannot be recorded as cancelled, but their pods
        // can still be stopped. A store that is only unavailable is waited for.
        Err(e) if e.is_unreadable_document() => {
            tracing::warn!(job = %scope.name, namespace = %scope.namespace, error = %e, "the index cannot be read; stopping the job's pods without recording its runs");
            said.warning(
                "IndexUnreadable",
                format!(
                    "the job's index in the bucket ({}) cannot be read; its pods are stopped and its active runs are not recorded as cancelled",
                    scope.keys.index()
                ),
            );
            return release_pods_then_let_go(scope).await;
        }
        Err(e) => return Err(e),
    };
    let index = index_of(&known);
    let token = scope.cx.focus.token((&scope.namespace, &scope.name));
    let pods = list_pods(scope).await?;
    let empty = RunPods::new();
    for run in &index.active {
        match sweeper::cancel_run(scope, run, pods.get(&run.run_id).unwrap_or(&empty)).await {
            Ok(_) | Err(SweepError::Foreign { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let swept = sweep(scope, token, &index.active, &pods, said).await;
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
    // Every run is over: the pods' outcomes are recorded.
    release_pods_then_let_go(scope).await
}

/// Stops the job's pods, releases their result finalizers once nothing of them runs, then
/// removes the job's own finalizer. The object waits for pods still stopping, so no pod
/// outlives it with a finalizer nobody would remove.
async fn release_pods_then_let_go(scope: &JobScope<'_>) -> Result<Action, Error> {
    // As they are after the cancels, from the API server: a pod the cache has not seen yet
    // (a lagging watch at thousands of pods) would otherwise keep its result finalizer after
    // the job is gone, with no one left to release it, and block its namespace's removal.
    let pods = list_pods_fresh(scope).await?;
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
    scope.cx.metrics.job_gone(&scope.namespace, &scope.name);
    scope.cx.skipped.forget(&scope.uid);
    scope.cx.retries.succeeded(&scope.uid);
    scope.cx.focus.forget((&scope.namespace, &scope.name));
    tracing::info!(job = %scope.name, "active runs cancelled; finalizer removed");
    Ok(Action::await_change())
}
