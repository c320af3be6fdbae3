//! Cues: which watch events start a pass of their CoordinatedJob.
//!
//! Each pass reads the job's index and every active run's lease from the bucket, so a pass
//! that cannot act costs two or more requests for nothing, and queues in front of the passes
//! that decide ticks. Two kinds of event are therefore not cues:
//!
//! - **A job event that changed only the status** ([`job_cue`]). The controller's own status
//!   write would otherwise start a pass after every pass that changed the status. Spec edits
//!   (the generation), annotations (triggers, cancels, backfills), labels, other owners'
//!   finalizers and deletion are cues. cojob's own finalizer is not: the first pass adds it
//!   and goes on, and a second pass for that write would only read the index again (a
//!   one-shot job's run paid 1 GET for it). A finalizer of ours that someone removed is put
//!   back by the next pass, which starts no run before it is back.
//! - **A pod event that changed nothing reconcile acts on** ([`pod_wakes`]): the pod a pass
//!   just created, its scheduling, its gate's removal, its containers' progress, a finalizer
//!   the controller released, and the deletion of a pod whose end was already a cue (the
//!   history's pods, and a pod deleted after it ended: its result finalizer keeps it until its
//!   outcome is recorded). What a pass acts on is how a pod ended or whether it can still run
//!   ([`crate::sweeper::pod_view`]), whether a live pod is being deleted, and whether its
//!   workload started ([`workload_started`]): a change of any is a cue, and so is a pod of an
//!   earlier attempt ending (the next attempt's pod waits for it).
//!
//! A kubelet's taking a pod up (`status.startTime`) is a cue when it comes [`LATE_TAKE_UP`] or
//! more after the pod's creation: a pending attempt whose pod waited that long for a node or
//! a kubelet is quiet without the ttl bound below, since its sidecar cannot attach before.
//! Taken up sooner, it is not one, and costs no pass.
//!
//! The workload's start is a cue because a pending attempt is quiet
//! ([`crate::run::quiet_until`]): its pass shows the run `running` in the job's status as the
//! workload starts, and from then on asks to come back when its sidecar's lease may have
//! expired, not at a pending attempt's times. It costs one pass per run, the one that used to
//! come with the next full sweep; a run whose workload ends within the debounce
//! (`--reconcile-debounce`) of its start gets one pass for both.
//!
//! Nothing here is needed for safety: every pass re-reads the truth. An active run is passed
//! over at least every sweep interval (and every third of its ttl) whatever the events,
//! except a quiet one ([`crate::sweeper::focus`]: its pod lives and nothing is asked of it),
//! which is passed over at the latest when a step may be due: for a running attempt, when its
//! lease may be taken over, a ttl plus the clock-skew allowance at most; for a pending one,
//! a ttl from the pass at most, since its sidecar may attach meanwhile (unless its pod has
//! waited long for a kubelet: then when its pending lease is due for renewal, at most a
//! third of the pending ttl, or on its late take-up's cue). Its pod's end,
//! deletion and workload start are cues, and a relist of the pod watch wakes every run. Cues
//! only decide how soon a pass follows a change.

use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::api::core::v1::Pod;

use crate::crd::CoordinatedJob;
use crate::run::PodView;
use crate::sweeper::pod_view;

/// The part of a CoordinatedJob whose change starts a pass: everything but its status and
/// cojob's own finalizer, as a hash for kube-runtime's `predicate_filter`.
///
/// ```
/// use cojob_controller::cues::job_cue;
/// use cojob_controller::crd::CoordinatedJob;
/// let job: CoordinatedJob = serde_json::from_value(serde_json::json!({
///     "apiVersion": "cojob.dev/v1alpha1", "kind": "CoordinatedJob",
///     "metadata": {"name": "nightly", "generation": 1},
///     "spec": {"schedule": "0 2 * * *", "template": {"spec": {"containers": []}}}
/// })).unwrap();
/// let mut written = job.clone();
/// written.status = Some(Default::default()); // the controller's own status write
/// assert_eq!(job_cue(&job), job_cue(&written));
/// let mut asked = job.clone();
/// asked.metadata.annotations = Some([("trigger.cojob.dev/now".to_string(), "x".to_string())].into());
/// assert_ne!(job_cue(&job), job_cue(&asked));
/// let mut claimed = job.clone();
/// claimed.metadata.finalizers = Some(vec!["cojob.dev/cancel-runs".into()]); // the first pass
/// assert_eq!(job_cue(&job), job_cue(&claimed));
/// ```
pub fn job_cue(job: &CoordinatedJob) -> Option<u64> {
    let meta = &job.metadata;
    let others: Vec<&String> = meta
        .finalizers
        .iter()
        .flatten()
        .filter(|f| f.as_str() != crate::reconcile::FINALIZER)
        .collect();
    let mut hasher = DefaultHasher::new();
    (
        meta.generation,
        &meta.annotations,
        &meta.labels,
        others,
        meta.deletion_timestamp.is_some(),
    )
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// How long after its creation a kubelet's taking a pod up (`status.startTime`) is a cue.
///
/// A pass leaves a pending attempt whose pod no kubelet has taken up for twice this long
/// without the pass a ttl later that a sidecar attaching unseen would need
/// ([`crate::run::quiet_until`]): such a pod runs nothing until a kubelet takes it up, and
/// from then on that is a cue. A pod taken up sooner is not one (the pass a ttl after the
/// dispatch covers it), so a run on a prompt node pays no pass for it. The margin between the
/// two covers a kubelet's clock behind the controller's by up to this much.
pub const LATE_TAKE_UP: std::time::Duration = std::time::Duration::from_secs(15);

/// What reconcile acts on of a pod, compared from one event to the next.
#[derive(Debug, PartialEq, Eq)]
struct Seen<'a> {
    view: PodView,
    /// The workload started ([`workload_started`]).
    started: bool,
    /// A kubelet took the pod up [`LATE_TAKE_UP`] or more after its creation.
    taken_up_late: bool,
    /// A live pod is being deleted (an ended one's deletion changes nothing).
    stopping: bool,
    labels: Option<&'a std::collections::BTreeMap<String, String>>,
    owners: Option<Vec<&'a str>>,
}

fn seen(pod: &Pod) -> Seen<'_> {
    let view = pod_view(Some(pod));
    Seen {
        stopping: pod.metadata.deletion_timestamp.is_some() && view == PodView::Live,
        started: workload_started(pod),
        taken_up_late: taken_up_late(pod),
        view,
        labels: pod.metadata.labels.as_ref(),
        owners: pod
            .metadata
            .owner_references
            .as_ref()
            .map(|o| o.iter().map(|r| r.uid.as_str()).collect()),
    }
}

/// True once one of the pod's own containers (not its sidecar, an init container) started:
/// running, ended, or restarted. The workload's containers start only after the sidecar's
/// start gate saw it attached ([`crate::pod`]), so by then the run's lease says `running`.
///
/// ```
/// use cojob_controller::cues::workload_started;
/// let pod = |state: serde_json::Value| -> k8s_openapi::api::core::v1::Pod {
///     serde_json::from_value(serde_json::json!({
///         "metadata": {"name": "r-1"},
///         "status": {"phase": "Pending", "containerStatuses": [{"name": "main", "image": "b",
///             "imageID": "", "ready": false, "restartCount": 0, "state": state}]}
///     })).unwrap()
/// };
/// assert!(!workload_started(&pod(serde_json::json!({"waiting": {"reason": "PodInitializing"}}))));
/// assert!(workload_started(&pod(serde_json::json!({"running": {}}))));
/// ```
pub fn workload_started(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .any(|c| {
            c.restart_count > 0
                || c.state
                    .as_ref()
                    .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
        })
}

/// True when a kubelet took `pod` up (`status.startTime`, by its clock) [`LATE_TAKE_UP`] or
/// more after the pod's creation (by the API server's).
fn taken_up_late(pod: &Pod) -> bool {
    let taken_up = crate::sweeper::pods::taken_up_at(pod);
    let created = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(crate::api_time::from_api);
    match (taken_up, created, chrono::Duration::from_std(LATE_TAKE_UP)) {
        (Some(taken_up), Some(created), Ok(late)) => taken_up - created >= late,
        _ => false,
    }
}

/// True when a pod that went from `before` (`None`: not seen yet) to `after` changed something
/// its job's reconcile acts on. A pod seen for the first time is a cue unless it is live and
/// not being deleted (the pass that created it has done what there is to do).
///
/// ```
/// use cojob_controller::cues::pod_wakes;
/// use k8s_openapi::api::core::v1::Pod;
/// let pod = |phase: &str, node: Option<&str>| -> Pod {
///     serde_json::from_value(serde_json::json!({
///         "metadata": {"name": "r-1"},
///         "spec": {"nodeName": node, "containers": []},
///         "status": {"phase": phase}
///     })).unwrap()
/// };
/// assert!(!pod_wakes(None, &pod("Pending", None)), "the pass that created it is done");
/// assert!(!pod_wakes(Some(&pod("Pending", None)), &pod("Pending", Some("n"))), "scheduled");
/// assert!(!pod_wakes(Some(&pod("Pending", Some("n"))), &pod("Running", Some("n"))), "no container yet");
/// assert!(pod_wakes(Some(&pod("Running", Some("n"))), &pod("Succeeded", Some("n"))));
/// assert!(pod_wakes(None, &pod("Succeeded", Some("n"))), "found ended");
/// ```
pub fn pod_wakes(before: Option<&Pod>, after: &Pod) -> bool {
    let now = seen(after);
    match before {
        Some(before) => seen(before) != now,
        None => now.view != PodView::Live || now.stopping,
    }
}

/// True when the deletion of a pod last seen as `before` is a cue: unless its end was one
/// already (a pod is removed only once its result finalizer is released, after its outcome
/// is recorded, or when it never had one).
///
/// ```
/// use cojob_controller::cues::deletion_wakes;
/// use k8s_openapi::api::core::v1::Pod;
/// let pod = |phase: &str| -> Pod {
///     serde_json::from_value(serde_json::json!({
///         "metadata": {"name": "r-1"}, "spec": {"nodeName": "n", "containers": []},
///         "status": {"phase": phase}
///     })).unwrap()
/// };
/// assert!(!deletion_wakes(Some(&pod("Succeeded"))));
/// assert!(deletion_wakes(Some(&pod("Running"))));
/// assert!(deletion_wakes(None));
/// ```
pub fn deletion_wakes(before: Option<&Pod>) -> bool {
    !before.is_some_and(|p| matches!(pod_view(Some(p)), PodView::Ended(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(phase: &str, exit: Option<i32>) -> Pod {
        let statuses = exit.map(|code| {
            serde_json::json!([{"name": "main", "image": "b", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"terminated": {"exitCode": code}}}])
        });
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "r-1", "labels": {"cojob.dev/epoch": "1"},
                "finalizers": ["cojob.dev/run-result"],
                "ownerReferences": [{"apiVersion": "v1", "kind": "K", "name": "j", "uid": "u"}]},
            "spec": {"nodeName": "n", "containers": [],
                "schedulingGates": [{"name": crate::pod::HOLDER_GATE}]},
            "status": {"phase": phase, "containerStatuses": statuses}
        }))
        .unwrap()
    }

    fn deleting(pod: &Pod) -> Pod {
        let mut value = serde_json::to_value(pod).unwrap();
        value["metadata"]["deletionTimestamp"] = "2026-12-03T18:00:00Z".into();
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn only_other_owners_finalizers_are_job_cues() {
        let job: CoordinatedJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "cojob.dev/v1alpha1", "kind": "CoordinatedJob",
            "metadata": {"name": "j", "generation": 1},
            "spec": {"template": {"spec": {"containers": []}}}
        }))
        .unwrap();
        let with = |finalizers: &[&str]| {
            let mut j = job.clone();
            j.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
            job_cue(&j)
        };
        let ours = crate::reconcile::FINALIZER;
        assert_eq!(job_cue(&job), with(&[ours]), "the first pass's own write");
        assert_eq!(
            with(&[]),
            with(&[ours]),
            "ours removed: put back by the next pass"
        );
        assert_ne!(with(&[ours]), with(&[ours, "example.com/hold"]));
        assert_ne!(with(&["example.com/hold"]), with(&[]));
    }

    #[test]
    fn what_reconcile_does_not_read_is_no_cue() {
        let a = pod("Running", None);
        assert!(
            !pod_wakes(Some(&pod("Pending", None)), &a),
            "a phase without a started container is no cue"
        );
        let mut b = a.clone();
        b.metadata.finalizers = None; // the controller released its finalizer
        b.metadata.resource_version = Some("9".into());
        if let Some(spec) = b.spec.as_mut() {
            spec.scheduling_gates = None; // the controller removed its gate
        }
        assert!(!pod_wakes(Some(&a), &b));
    }

    /// `pod` with its containers in `main` and its sidecar (an init container) in `sidecar`.
    fn with_states(pod: &Pod, main: serde_json::Value, sidecar: serde_json::Value) -> Pod {
        let mut value = serde_json::to_value(pod).unwrap();
        let status = |name: &str, state: serde_json::Value| {
            serde_json::json!([{"name": name, "image": "b", "imageID": "", "ready": false,
                "restartCount": 0, "state": state}])
        };
        value["status"]["containerStatuses"] = status("main", main);
        value["status"]["initContainerStatuses"] = status("cojob-sidecar", sidecar);
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_workloads_start_is_a_cue_and_the_sidecars_is_not() {
        let base = pod("Pending", None);
        let waiting = serde_json::json!({"waiting": {"reason": "PodInitializing"}});
        let running = serde_json::json!({"running": {"startedAt": "2026-12-06T03:00:00Z"}});
        let created = with_states(&base, waiting.clone(), waiting.clone());
        let sidecar_up = with_states(&base, waiting.clone(), running.clone());
        let workload_up = with_states(&pod("Running", None), running.clone(), running.clone());
        assert!(
            !pod_wakes(Some(&created), &sidecar_up),
            "the sidecar started"
        );
        assert!(
            pod_wakes(Some(&sidecar_up), &workload_up),
            "the workload started"
        );
        assert!(!pod_wakes(Some(&workload_up), &workload_up.clone()));
        // Seen for the first time already started (a relist, another replica's pod): the
        // pass that created it did not see that.
        assert!(
            !pod_wakes(None, &workload_up),
            "a live pod, new to the cache"
        );
        // A restart of a workload container is no second start.
        let mut restarted = with_states(&pod("Running", None), waiting, running);
        if let Some(c) = restarted
            .status
            .as_mut()
            .and_then(|s| s.container_statuses.as_mut())
        {
            c[0].restart_count = 1;
        }
        assert!(!pod_wakes(Some(&workload_up), &restarted));
        // The pod cache's trimmed copy tells the same.
        assert!(pod_wakes(
            Some(&crate::pod_cache::trim(&sidecar_up)),
            &crate::pod_cache::trim(&workload_up)
        ));
    }

    #[test]
    fn a_kubelet_taking_a_pod_up_is_a_cue_only_when_late() {
        let waiting = |created: &str| {
            let mut p = pod("Pending", None);
            p.metadata.creation_timestamp =
                serde_json::from_value(serde_json::json!(created)).unwrap();
            p
        };
        let taken_up = |p: &Pod, at: &str| {
            let mut p = p.clone();
            if let Some(status) = p.status.as_mut() {
                status.start_time = serde_json::from_value(serde_json::json!(at)).unwrap();
            }
            p
        };
        let fresh = waiting("2026-12-06T10:00:00Z");
        assert!(
            !pod_wakes(Some(&fresh), &taken_up(&fresh, "2026-12-06T10:00:14Z")),
            "taken up within LATE_TAKE_UP: the pass a ttl after the dispatch covers it"
        );
        let late = taken_up(&fresh, "2026-12-06T10:00:15Z");
        assert!(pod_wakes(Some(&fresh), &late), "taken up late: a cue");
        assert!(
            !pod_wakes(Some(&late), &late.clone()),
            "once: the next event of the same pod is not one"
        );
        let mut no_creation = fresh.clone();
        no_creation.metadata.creation_timestamp = None;
        assert!(
            !pod_wakes(
                Some(&no_creation),
                &taken_up(&no_creation, "2026-12-06T11:00:00Z")
            ),
            "no creation time to tell: not one (the ttl bound then applies, see run::quiet_until)"
        );
    }

    #[test]
    fn how_a_pod_ended_and_its_deletion_are_cues() {
        let ok = pod("Succeeded", Some(0));
        assert!(pod_wakes(Some(&pod("Running", None)), &ok));
        // The same phase with another exit code is another outcome.
        assert!(pod_wakes(
            Some(&pod("Failed", Some(1))),
            &pod("Failed", Some(2))
        ));
        assert!(
            !pod_wakes(Some(&ok), &deleting(&ok)),
            "an ended pod's deletion"
        );
        let running = pod("Running", None);
        assert!(
            pod_wakes(Some(&running), &deleting(&running)),
            "a live pod's deletion"
        );
        let mut relabelled = ok.clone();
        relabelled.metadata.labels = Some([("cojob.dev/epoch".into(), "2".into())].into());
        assert!(pod_wakes(Some(&ok), &relabelled));
        let mut orphaned = ok.clone();
        orphaned.metadata.owner_references = None;
        assert!(pod_wakes(Some(&ok), &orphaned));
        assert!(!pod_wakes(Some(&ok), &ok.clone()));
    }

    #[test]
    fn a_new_pod_is_a_cue_unless_it_is_live() {
        assert!(!pod_wakes(None, &pod("Pending", None)));
        assert!(!pod_wakes(None, &pod("Running", None)));
        assert!(pod_wakes(None, &pod("Failed", Some(1))));
        assert!(pod_wakes(None, &deleting(&pod("Pending", None))));
    }
}
