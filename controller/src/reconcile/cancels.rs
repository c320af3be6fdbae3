//! Cancels on request: a `cancel.cojob.dev/<run id>` annotation cancels that active run, as
//! deleting the object would (the workload is asked to stop; a success that happened stays a
//! success). The annotation is removed once the run is no longer active.

use super::*;
use crate::crd::CANCEL_ANNOTATION_PREFIX;

/// The run ids the object's annotations ask to cancel, sorted.
pub(super) fn requested(scope: &JobScope<'_>) -> Vec<String> {
    scope
        .job
        .annotations()
        .keys()
        .filter_map(|name| name.strip_prefix(CANCEL_ANNOTATION_PREFIX))
        .map(String::from)
        .collect()
}

/// Drives the cancel of every requested run that is active, and removes the annotations of
/// those that are not (ended, or never this job's), saying how each ended.
pub(super) async fn cancel_requested(
    scope: &JobScope<'_>,
    run_ids: &[String],
    index: &JobIndex,
    pods: &BTreeMap<String, RunPods>,
    said: &mut Announcements,
) -> Result<(), Error> {
    let empty = RunPods::new();
    let mut settled = Vec::new();
    for run_id in run_ids {
        if let Some(run) = index.active.iter().find(|r| &r.run_id == run_id) {
            sweeper::cancel_run(scope, run, pods.get(run_id).unwrap_or(&empty)).await?;
            continue;
        }
        match index.recent.iter().find(|r| &r.run_id == run_id) {
            Some(ended) => said.normal(
                "CancelDone",
                format!("run {run_id} ended {}", ended.status.as_str()),
            ),
            None => said.warning(
                "CancelIgnored",
                format!("run {run_id} is not an active run of this job; nothing to cancel"),
            ),
        }
        settled.push(format!("{CANCEL_ANNOTATION_PREFIX}{run_id}"));
    }
    remove_annotations(scope, settled).await
}
