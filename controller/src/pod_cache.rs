//! A watch-backed cache of run pods, indexed by job, so a reconcile reads its job's pods from
//! memory instead of listing them from the API server on every pass.
//!
//! The controller's pod watch (`cojob.dev/job`-labelled pods) feeds [`PodCache::apply`] with
//! every watcher event before the event triggers a reconcile of the owning job, so the pass
//! that a pod event starts already sees that event. Until the watch's first listing is
//! complete, [`PodCache::job_pods`] answers `None` and reconcile lists instead; a relist
//! (after the watch expired) replaces the contents at once when it is complete, as
//! kube-runtime's reflector does.
//!
//! The cache keeps only what reconcile reads of a pod ([`trim`]), encoded as JSON: at 10 000
//! jobs it holds tens of thousands of finished pods (each job's history), and a whole pod
//! object (its spec, the sidecar's, conditions, images) is most of the controller's memory. A
//! decoded `Pod`, even trimmed, keeps room for every field the API defines; the encoded copy
//! takes a fraction of it (`cargo bench -p cojob-controller --bench memory`), and a pass
//! decodes only its own job's pods. Most cached pods are a history's: ended, their outcome
//! recorded and their result finalizer released. Of those the cache keeps less still
//! ([`settle`]): what tells their run, their owner and how they ended.
//!
//! A cache may lag the API server by the watch's latency. Reconcile relies on it only where a
//! lag delays a step and never breaks a guarantee; the decisions that need the truth read it
//! fresh: whether the current attempt's pod is missing (a GET by name, in the sweeper),
//! whether an older attempt's pod can still run before a new one is created (G3: a LIST of the
//! run's pods, in dispatch), and which pods still hold a result finalizer before a deleted
//! job lets go of its own (a LIST of the job's pods, in finalize).
//!
//! ```
//! use cojob_controller::pod_cache::PodCache;
//! use k8s_openapi::api::core::v1::Pod;
//! use kube::runtime::watcher::Event;
//!
//! let pod: Pod = serde_json::from_value(serde_json::json!({
//!     "metadata": {"name": "p", "namespace": "a", "labels": {"cojob.dev/job": "nightly"}}
//! })).unwrap();
//! let cache = PodCache::default();
//! assert!(cache.job_pods("a", "nightly").is_none()); // not listed yet: ask the API server
//! cache.apply(&Event::Init);
//! cache.apply(&Event::InitApply(pod.clone()));
//! cache.apply(&Event::InitDone);
//! assert_eq!(cache.job_pods("a", "nightly").unwrap().len(), 1);
//! cache.apply(&Event::Delete(pod));
//! assert!(cache.job_pods("a", "nightly").unwrap().is_empty());
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateTerminated, ContainerStatus, EnvVar, Pod,
    PodCondition, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::runtime::watcher::Event;

use crate::pod::{HOLDER_ENV, LABEL_JOB, SIDECAR_NAME};

/// A namespace and a job name.
type JobKey = (String, String);
/// A namespace and a pod name.
type PodKey = (String, String);

/// One cached pod: its trimmed form ([`trim`]) encoded as JSON (see the module's
/// documentation).
enum Kept {
    Encoded(Box<[u8]>),
    /// Only if encoding failed (no pod the API server sends fails to encode).
    Decoded(Box<Pod>),
}

impl Kept {
    fn new(pod: &Pod) -> Kept {
        let kept = if is_settled(pod) {
            settle(pod)
        } else {
            trim(pod)
        };
        match serde_json::to_vec(&kept) {
            Ok(bytes) => Kept::Encoded(bytes.into_boxed_slice()),
            Err(e) => {
                tracing::warn!(pod = %pod.name_any(), error = %e, "cannot encode a pod for the cache; keeping it decoded");
                Kept::Decoded(Box::new(kept))
            }
        }
    }

    /// The trimmed pod, or `None` (logged) if its encoding cannot be read back, in which case
    /// the caller asks the API server.
    fn pod(&self) -> Option<Pod> {
        match self {
            Kept::Encoded(bytes) => match serde_json::from_slice(bytes) {
                Ok(pod) => Some(pod),
                Err(e) => {
                    tracing::error!(error = %e, "cannot decode a cached pod; asking the API server");
                    None
                }
            },
            Kept::Decoded(pod) => Some(Pod::clone(pod)),
        }
    }

    /// The encoded size, for the cache's own measurement.
    fn bytes(&self) -> usize {
        match self {
            Kept::Encoded(bytes) => bytes.len(),
            Kept::Decoded(_) => std::mem::size_of::<Pod>(),
        }
    }
}

#[derive(Default)]
struct Contents {
    /// Pods by job, then by pod name.
    by_job: HashMap<JobKey, BTreeMap<String, Kept>>,
    /// The job each pod is filed under.
    job_of: HashMap<PodKey, JobKey>,
}

impl Contents {
    /// Files `pod` (trimmed) and returns the copy it replaces, if any.
    fn insert(&mut self, pod: &Pod) -> Option<Kept> {
        let Some(job) = job_key(pod) else {
            return self.remove(pod); // a pod that lost its label is no longer a run pod
        };
        let key = pod_key(pod);
        let mut before = None;
        if let Some(old) = self.job_of.get(&key).filter(|old| **old != job).cloned() {
            before = self.forget(&old, &key.1);
        }
        let replaced = self
            .by_job
            .entry(job.clone())
            .or_default()
            .insert(key.1.clone(), Kept::new(pod));
        self.job_of.insert(key, job);
        replaced.or(before)
    }

    fn remove(&mut self, pod: &Pod) -> Option<Kept> {
        let key = pod_key(pod);
        let job = self.job_of.remove(&key)?;
        self.forget(&job, &key.1)
    }

    fn forget(&mut self, job: &JobKey, pod: &str) -> Option<Kept> {
        let pods = self.by_job.get_mut(job)?;
        let removed = pods.remove(pod);
        if pods.is_empty() {
            self.by_job.remove(job);
        }
        removed
    }
}

#[derive(Default)]
struct State {
    /// What the last complete listing and the events since then say.
    live: Contents,
    /// A relist in progress, swapped in when it is complete.
    relist: Option<Contents>,
    /// True once a listing has completed.
    ready: bool,
}

/// The run pods the controller's watch has seen, by job. Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct PodCache {
    state: Arc<RwLock<State>>,
}

impl PodCache {
    /// Applies one watcher event, and says whether it is a cue for its job's reconcile
    /// ([`crate::cues::pod_wakes`], [`crate::cues::deletion_wakes`]): a change of what
    /// reconcile acts on, or a pod of a listing (after a watch starts again, every job looks
    /// afresh).
    pub fn apply(&self, event: &Event<Pod>) -> bool {
        let Ok(mut state) = self.state.write() else {
            return true; // poisoned: a panic elsewhere; reconcile falls back to listing
        };
        match event {
            // A copy that cannot be read back counts as a cue: the pass that follows looks.
            Event::Apply(pod) => match state.live.insert(pod).map(|k| k.pod()) {
                Some(None) => true,
                Some(Some(before)) => crate::cues::pod_wakes(Some(&before), pod),
                None => crate::cues::pod_wakes(None, pod),
            },
            Event::Delete(pod) => match state.live.remove(pod).map(|k| k.pod()) {
                Some(None) => true,
                Some(Some(before)) => crate::cues::deletion_wakes(Some(&before)),
                None => crate::cues::deletion_wakes(None),
            },
            Event::Init => {
                state.relist = Some(Contents::default());
                false
            }
            Event::InitApply(pod) => {
                state
                    .relist
                    .get_or_insert_with(Contents::default)
                    .insert(pod);
                true
            }
            Event::InitDone => {
                if let Some(listed) = state.relist.take() {
                    state.live = listed;
                }
                state.ready = true;
                false
            }
        }
    }

    /// The pods filed under job `name` in `namespace`, or `None` while the watch has not
    /// completed its first listing, or if a copy cannot be read back (the caller then asks
    /// the API server).
    pub fn job_pods(&self, namespace: &str, name: &str) -> Option<Vec<Pod>> {
        let state = self.state.read().ok()?;
        if !state.ready {
            return None;
        }
        let key = (namespace.to_owned(), name.to_owned());
        match state.live.by_job.get(&key) {
            Some(pods) => pods.values().map(Kept::pod).collect(),
            None => Some(Vec::new()),
        }
    }

    /// The bytes the cached pods' copies take, beside [`PodCache::len`]: what a pod costs the
    /// controller's memory, before the maps' own overhead.
    pub fn encoded_bytes(&self) -> usize {
        self.state.read().map_or(0, |s| {
            s.live
                .by_job
                .values()
                .flat_map(|pods| pods.values())
                .map(Kept::bytes)
                .sum()
        })
    }

    /// Forgets everything and serves nothing until the next complete listing (a watch that
    /// starts again, as after a leadership change, must not be answered from an old one).
    pub fn reset(&self) {
        if let Ok(mut state) = self.state.write() {
            *state = State::default();
        }
    }

    /// How many pods the cache holds.
    pub fn len(&self) -> usize {
        self.state.read().map_or(0, |s| s.live.job_of.len())
    }

    /// True when the cache holds no pod.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The part of a pod that reconcile reads, which is all the cache keeps:
///
/// - its metadata, but managed fields (names, labels with the run and epoch, owner references,
///   finalizers, deletion and creation times, resource version);
/// - of its spec, the node it is bound to, its scheduling gates (the holder gate), and of the
///   sidecar container its name and `COJOB_HOLDER` variable (which holder Secret it reads);
/// - of its status, the phase and reason, the `PodScheduled` condition's status, reason and
///   time and the kubelet's `startTime` (from when its start timeout counts,
///   [`crate::sweeper::pods::start_clock`]), and of each container status (and the sidecar's)
///   its name, state and the fields the API requires.
///
/// The decisions that need the whole truth (is the current pod missing, can an older pod still
/// run) read the API server, not the cache.
///
/// ```
/// use cojob_controller::pod_cache::trim;
/// use k8s_openapi::api::core::v1::Pod;
/// let pod: Pod = serde_json::from_value(serde_json::json!({
///     "metadata": {"name": "r-1", "labels": {"cojob.dev/epoch": "1"}},
///     "spec": {"nodeName": "n", "containers": [{"name": "main", "image": "busybox"}]},
///     "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
/// })).unwrap();
/// let kept = trim(&pod);
/// assert_eq!(kept.metadata.labels, pod.metadata.labels);
/// assert_eq!(kept.spec.as_ref().unwrap().node_name.as_deref(), Some("n"));
/// assert!(kept.spec.as_ref().unwrap().containers.is_empty());
/// assert_eq!(kept.status.as_ref().unwrap().phase.as_deref(), Some("Running"));
/// assert!(kept.status.as_ref().unwrap().conditions.is_none());
/// ```
pub fn trim(pod: &Pod) -> Pod {
    let mut metadata = pod.metadata.clone();
    metadata.managed_fields = None;
    let spec = pod.spec.as_ref().map(|s| PodSpec {
        node_name: s.node_name.clone(),
        scheduling_gates: s.scheduling_gates.clone(),
        init_containers: s.init_containers.as_ref().map(|all| {
            all.iter()
                .filter(|c| c.name == SIDECAR_NAME)
                .map(|c| Container {
                    name: c.name.clone(),
                    env: c.env.as_ref().map(|env| {
                        env.iter()
                            .filter(|e| e.name == HOLDER_ENV)
                            .cloned()
                            .collect::<Vec<EnvVar>>()
                    }),
                    ..Container::default()
                })
                .collect()
        }),
        ..PodSpec::default()
    });
    let status = pod.status.as_ref().map(|s| PodStatus {
        phase: s.phase.clone(),
        reason: s.reason.clone(),
        // When its kubelet took it up, for the start timeout.
        start_time: s.start_time.clone(),
        // Where the scheduler stands with it, for the start timeout: only its decision.
        conditions: s.conditions.as_ref().and_then(|all| {
            let kept: Vec<PodCondition> = all
                .iter()
                .filter(|c| c.type_ == crate::sweeper::pods::POD_SCHEDULED)
                .map(|c| PodCondition {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    reason: c.reason.clone(),
                    last_transition_time: c.last_transition_time.clone(),
                    ..PodCondition::default()
                })
                .collect();
            (!kept.is_empty()).then_some(kept)
        }),
        container_statuses: s
            .container_statuses
            .as_ref()
            .map(|all| all.iter().map(container_status).collect()),
        // The sidecar's, for whether its kubelet lacks the holder Secret
        // (`crate::pod::sidecar_lacks_config`).
        init_container_statuses: s.init_container_statuses.as_ref().map(|all| {
            all.iter()
                .filter(|c| c.name == SIDECAR_NAME)
                .map(container_status)
                .collect()
        }),
        ..PodStatus::default()
    });
    Pod {
        metadata,
        spec,
        status,
    }
}

/// What the cache keeps of one container's status: its name, state, readiness and restarts
/// (and the fields the API requires).
fn container_status(c: &ContainerStatus) -> ContainerStatus {
    ContainerStatus {
        name: c.name.clone(),
        state: c.state.clone(),
        ready: c.ready,
        restart_count: c.restart_count,
        ..ContainerStatus::default()
    }
}

/// True when nothing more happens to `pod` that reconcile acts on but its deletion: it ended
/// (`Succeeded` or `Failed`, phases a pod never leaves) and its result finalizer is released,
/// which the controller does only once the outcome is recorded (or was never needed).
///
/// ```
/// use cojob_controller::pod_cache::is_settled;
/// use k8s_openapi::api::core::v1::Pod;
/// let pod = |phase: &str, finalizers: &[&str]| -> Pod {
///     serde_json::from_value(serde_json::json!({
///         "metadata": {"name": "r-1", "finalizers": finalizers}, "status": {"phase": phase}
///     })).unwrap()
/// };
/// assert!(is_settled(&pod("Succeeded", &[])));
/// assert!(is_settled(&pod("Failed", &["example.com/other"])));
/// assert!(!is_settled(&pod("Succeeded", &["cojob.dev/run-result"])), "outcome not recorded yet");
/// assert!(!is_settled(&pod("Running", &[])));
/// ```
pub fn is_settled(pod: &Pod) -> bool {
    let ended = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    ended && !crate::sweeper::pods::has_result_finalizer(pod)
}

/// What the cache keeps of a settled pod ([`is_settled`]), less than [`trim`]: its name,
/// namespace, UID, labels (its job, run and epoch, and any of the template's), owners and
/// finalizers, the time its deletion was asked, and how it ended: the phase, the reason and
/// the one exit code [`crate::sweeper::pod_view`] reports. No spec, no resource version, no
/// times but the deletion's: reconcile reads none of them of an ended pod (a finalizer is
/// released by resource version only while it is held, so never from a settled pod).
///
/// ```
/// use cojob_controller::pod_cache::{settle, trim};
/// use cojob_controller::sweeper::pod_view;
/// use k8s_openapi::api::core::v1::Pod;
/// let pod: Pod = serde_json::from_value(serde_json::json!({
///     "metadata": {"name": "r-1", "uid": "u", "resourceVersion": "9",
///         "creationTimestamp": "2026-12-03T18:00:00Z", "labels": {"cojob.dev/epoch": "1"}},
///     "spec": {"nodeName": "n", "containers": [{"name": "main", "image": "busybox"}]},
///     "status": {"phase": "Failed", "containerStatuses": [
///         {"name": "a", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
///          "state": {"terminated": {"exitCode": 0, "reason": "Completed",
///             "startedAt": "2026-12-03T18:00:01Z", "finishedAt": "2026-12-03T18:00:09Z"}}},
///         {"name": "b", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
///          "state": {"terminated": {"exitCode": 3}}}]}
/// })).unwrap();
/// let kept = settle(&pod);
/// assert_eq!(pod_view(Some(&kept)), pod_view(Some(&pod)));
/// assert_eq!(kept.metadata.labels, pod.metadata.labels);
/// assert!(kept.spec.is_none() && kept.metadata.resource_version.is_none());
/// let size = |p: &Pod| serde_json::to_vec(p).unwrap().len();
/// assert!(size(&kept) < size(&trim(&pod)));
/// ```
pub fn settle(pod: &Pod) -> Pod {
    let meta = &pod.metadata;
    let status = pod.status.as_ref();
    // The container whose code `pod_view` reports, and only its code.
    let deciding = crate::sweeper::pods::deciding_container(pod).map(|c| ContainerStatus {
        name: c.name.clone(),
        state: Some(ContainerState {
            terminated: crate::sweeper::pods::terminated(c).map(|t| ContainerStateTerminated {
                exit_code: t.exit_code,
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        }),
        ..ContainerStatus::default()
    });
    Pod {
        metadata: ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            labels: meta.labels.clone(),
            owner_references: meta.owner_references.clone(),
            finalizers: meta.finalizers.clone().filter(|f| !f.is_empty()),
            deletion_timestamp: meta.deletion_timestamp.clone(),
            ..ObjectMeta::default()
        },
        spec: None,
        status: status.map(|s| PodStatus {
            phase: s.phase.clone(),
            reason: s.reason.clone(),
            container_statuses: deciding.map(|c| vec![c]),
            ..PodStatus::default()
        }),
    }
}

fn job_key(pod: &Pod) -> Option<JobKey> {
    let job = pod.labels().get(LABEL_JOB)?;
    Some((pod.namespace().unwrap_or_default(), job.clone()))
}

fn pod_key(pod: &Pod) -> PodKey {
    (pod.namespace().unwrap_or_default(), pod.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, job: Option<&str>) -> Pod {
        let mut labels = serde_json::Map::new();
        if let Some(job) = job {
            labels.insert(LABEL_JOB.into(), job.into());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "labels": labels}
        }))
        .unwrap()
    }

    fn names(cache: &PodCache, ns: &str, job: &str) -> Vec<String> {
        let mut out: Vec<String> = cache
            .job_pods(ns, job)
            .unwrap()
            .iter()
            .map(|p| p.name_any())
            .collect();
        out.sort();
        out
    }

    /// A run pod as the API server returns it, ended with exit code 3.
    fn full_pod(gated: bool, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "nightly-abc-1", "namespace": "a", "uid": "u1", "resourceVersion": "42",
                "creationTimestamp": "2026-12-03T18:00:00Z",
                "labels": {LABEL_JOB: "nightly", "cojob.dev/run": "nightly-abc", "cojob.dev/epoch": "1"},
                "finalizers": ["cojob.dev/run-result"],
                "ownerReferences": [{"apiVersion": "cojob.dev/v1alpha1", "kind": "CoordinatedJob",
                    "name": "nightly", "uid": "j1", "controller": true}],
                "managedFields": [{"manager": "cojob", "operation": "Update"}]
            },
            "spec": {
                "nodeName": "node-1",
                "schedulingGates": if gated { serde_json::json!([{"name": crate::pod::HOLDER_GATE}]) } else { serde_json::json!([]) },
                "initContainers": [{
                    "name": SIDECAR_NAME, "image": "cojob", "restartPolicy": "Always",
                    "env": [
                        {"name": "COJOB_LEASE_KEY", "value": "k"},
                        {"name": "COJOB_HOLDER", "valueFrom": {"secretKeyRef": {"name": "nightly-abc-1-holder", "key": "holder"}}}
                    ]
                }],
                "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", "exit 3"],
                    "env": [{"name": "COJOB_RUN_ID", "value": "nightly-abc"}]}]
            },
            "status": {
                "phase": phase, "reason": "Evicted", "startTime": "2026-12-03T18:00:03Z",
                "conditions": [{"type": "Ready", "status": "False"},
                    {"type": "PodScheduled", "status": "True", "lastProbeTime": null,
                     "lastTransitionTime": "2026-12-03T18:00:02Z", "message": "bound"}],
                "initContainerStatuses": [{"name": SIDECAR_NAME, "image": "cojob", "imageID": "x",
                    "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 0}}}],
                "containerStatuses": [{"name": "main", "image": "busybox", "imageID": "y",
                    "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 3}}}]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_trimmed_pod_gives_reconcile_the_same_answers() {
        use crate::sweeper::pods::{is_live, pod_view};
        for gated in [true, false] {
            for phase in ["Pending", "Running", "Succeeded", "Failed"] {
                let full = full_pod(gated, phase);
                let kept = trim(&full);
                assert_eq!(pod_view(Some(&kept)), pod_view(Some(&full)), "{phase}");
                assert_eq!(is_live(&kept), is_live(&full));
                assert_eq!(crate::pod::is_gated(&kept), crate::pod::is_gated(&full));
                assert_eq!(crate::pod::is_gated(&kept), gated);
                assert_eq!(
                    crate::pod::holder_secret_of(&kept),
                    crate::pod::holder_secret_of(&full)
                );
                assert!(crate::pod::holder_secret_of(&kept).is_some());
                assert_eq!(kept.metadata.labels, full.metadata.labels);
                assert_eq!(kept.metadata.finalizers, full.metadata.finalizers);
                assert_eq!(
                    kept.metadata.owner_references,
                    full.metadata.owner_references
                );
                assert_eq!(kept.resource_version(), full.resource_version());
                assert_eq!(kept.uid(), full.uid());
                assert!(kept.metadata.managed_fields.is_none());
                // What it is for: the workload's containers, the sidecar's other settings,
                // conditions and the init container statuses but the sidecar's state are gone.
                let spec = kept.spec.as_ref().unwrap();
                assert!(spec.containers.is_empty());
                let sidecar = &spec.init_containers.as_ref().unwrap()[0];
                assert_eq!(sidecar.env.as_ref().unwrap().len(), 1);
                assert!(sidecar.image.is_none() && sidecar.restart_policy.is_none());
                let status = kept.status.as_ref().unwrap();
                let inits = status.init_container_statuses.as_ref().unwrap();
                assert_eq!(inits.len(), 1);
                assert_eq!(inits[0].name, SIDECAR_NAME);
                assert!(inits[0].state.is_some() && inits[0].image.is_empty());
                assert!(!crate::pod::sidecar_lacks_config(&kept));
                // A sidecar whose kubelet lacks its holder Secret says so in the cache too.
                let mut lacking = full.clone();
                lacking
                    .status
                    .as_mut()
                    .unwrap()
                    .init_container_statuses
                    .as_mut()
                    .unwrap()[0]
                    .state = Some(
                    serde_json::from_value(serde_json::json!(
                        {"waiting": {"reason": "CreateContainerConfigError"}}
                    ))
                    .unwrap(),
                );
                assert!(crate::pod::sidecar_lacks_config(&lacking));
                assert!(crate::pod::sidecar_lacks_config(&trim(&lacking)));
                let conditions = status.conditions.as_ref().unwrap();
                assert_eq!(conditions.len(), 1, "only PodScheduled");
                assert!(conditions[0].message.is_none());
                assert_eq!(
                    crate::sweeper::pods::start_clock(&kept),
                    crate::sweeper::pods::start_clock(&full)
                );
                if !gated {
                    assert_eq!(
                        crate::sweeper::pods::start_clock(&kept),
                        crate::run::StartClock::Since("2026-12-03T18:00:03Z".parse().unwrap()),
                        "from the kubelet's acknowledgement, kept"
                    );
                }
            }
        }
        // The cache hands out the trimmed copy.
        let cache = PodCache::default();
        cache.apply(&Event::Init);
        cache.apply(&Event::InitApply(full_pod(false, "Running")));
        cache.apply(&Event::InitDone);
        let served = cache.job_pods("a", "nightly").unwrap();
        assert!(served[0].spec.as_ref().unwrap().containers.is_empty());
        // Kept encoded, served decoded: exactly the trimmed pod.
        assert_eq!(served, [trim(&full_pod(false, "Running"))]);
        assert!(cache.encoded_bytes() > 0);
    }

    /// `full_pod` after its outcome was recorded: the result finalizer released.
    fn settled_pod(phase: &str) -> Pod {
        let mut pod = full_pod(false, phase);
        pod.metadata.finalizers = Some(vec![]);
        pod.metadata.resource_version = Some("43".into());
        pod
    }

    #[test]
    fn a_settled_pod_is_kept_smaller_and_answers_the_same() {
        use crate::sweeper::pods::{has_result_finalizer, is_live, pod_view};
        for phase in ["Succeeded", "Failed"] {
            let full = settled_pod(phase);
            assert!(is_settled(&full));
            let kept = settle(&full);
            assert_eq!(pod_view(Some(&kept)), pod_view(Some(&full)), "{phase}");
            assert!(!is_live(&kept) && !has_result_finalizer(&kept));
            assert_eq!(kept.name_any(), full.name_any());
            assert_eq!(kept.uid(), full.uid());
            assert_eq!(kept.metadata.labels, full.metadata.labels);
            assert_eq!(
                kept.metadata.owner_references,
                full.metadata.owner_references
            );
            // Nothing reconcile acts on changed: keeping the stub is no cue.
            assert!(!crate::cues::pod_wakes(Some(&kept), &full));
            assert!(!crate::cues::deletion_wakes(Some(&kept)));
            let size = |p: &Pod| serde_json::to_vec(p).unwrap().len();
            assert!(
                size(&kept) * 3 < size(&trim(&full)) * 2,
                "{} bytes settled against {} trimmed",
                size(&kept),
                size(&trim(&full))
            );
        }
        // A pod that still holds the result finalizer, or runs, is trimmed only.
        assert!(!is_settled(&full_pod(false, "Succeeded")));
        assert!(!is_settled(&settled_pod("Running")));
        // The exit code `pod_view` reports is the first non-zero one, kept as the only status.
        let mut two = settled_pod("Failed");
        let statuses = two
            .status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap();
        let mut first = statuses[0].clone();
        first.name = "first".into();
        first
            .state
            .as_mut()
            .unwrap()
            .terminated
            .as_mut()
            .unwrap()
            .exit_code = 0;
        statuses.insert(0, first);
        let kept = settle(&two);
        assert_eq!(pod_view(Some(&kept)), pod_view(Some(&two)));
        assert_eq!(kept.status.unwrap().container_statuses.unwrap().len(), 1);

        // The cache serves a settled pod as its stub, and a pod deleted while it held the
        // finalizer keeps its deletion time once settled.
        let cache = PodCache::default();
        cache.apply(&Event::Init);
        cache.apply(&Event::InitApply(full_pod(false, "Succeeded")));
        cache.apply(&Event::InitDone);
        let mut released = settled_pod("Succeeded");
        released.metadata.deletion_timestamp =
            Some(serde_json::from_value(serde_json::json!("2026-12-03T18:01:00Z")).unwrap());
        assert!(
            !cache.apply(&Event::Apply(released.clone())),
            "a released finalizer is no cue"
        );
        let served = cache.job_pods("a", "nightly").unwrap();
        assert_eq!(served, [settle(&released)]);
        assert!(served[0].metadata.deletion_timestamp.is_some());
    }

    #[test]
    fn pods_are_filed_by_namespace_and_job() {
        let cache = PodCache::default();
        cache.apply(&Event::Init);
        cache.apply(&Event::InitApply(pod("a", "p1", Some("j"))));
        cache.apply(&Event::InitApply(pod("b", "p2", Some("j"))));
        cache.apply(&Event::InitDone);
        cache.apply(&Event::Apply(pod("a", "p3", Some("k"))));
        cache.apply(&Event::Apply(pod("a", "p4", Some("j"))));
        assert_eq!(names(&cache, "a", "j"), ["p1", "p4"]);
        assert_eq!(names(&cache, "b", "j"), ["p2"]);
        assert_eq!(names(&cache, "a", "k"), ["p3"]);
        assert!(names(&cache, "c", "j").is_empty());
        assert_eq!(cache.len(), 4);
    }

    #[test]
    fn a_relist_replaces_the_contents_only_when_complete() {
        let cache = PodCache::default();
        cache.apply(&Event::Init);
        cache.apply(&Event::InitApply(pod("a", "old", Some("j"))));
        cache.apply(&Event::InitDone);
        // The watch expired; its deletion of `old` was never seen.
        cache.apply(&Event::Init);
        cache.apply(&Event::InitApply(pod("a", "new", Some("j"))));
        assert_eq!(
            names(&cache, "a", "j"),
            ["old"],
            "a partial relist is not served"
        );
        cache.apply(&Event::InitDone);
        assert_eq!(names(&cache, "a", "j"), ["new"]);
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn nothing_is_served_before_the_first_listing_completes() {
        let cache = PodCache::default();
        cache.apply(&Event::Apply(pod("a", "p", Some("j"))));
        cache.apply(&Event::Init);
        assert!(cache.job_pods("a", "j").is_none());
        cache.apply(&Event::InitDone);
        assert!(cache.job_pods("a", "j").unwrap().is_empty());
    }

    #[test]
    fn a_relabelled_or_deleted_pod_leaves_its_old_job() {
        let cache = PodCache::default();
        cache.apply(&Event::Init);
        cache.apply(&Event::InitDone);
        cache.apply(&Event::Apply(pod("a", "p", Some("j"))));
        cache.apply(&Event::Apply(pod("a", "p", Some("k"))));
        assert!(names(&cache, "a", "j").is_empty());
        assert_eq!(names(&cache, "a", "k"), ["p"]);
        cache.apply(&Event::Apply(pod("a", "p", None)));
        assert!(names(&cache, "a", "k").is_empty());
        assert!(cache.is_empty());
        cache.apply(&Event::Apply(pod("a", "q", Some("k"))));
        cache.apply(&Event::Delete(pod("a", "q", Some("k"))));
        assert!(cache.is_empty());
    }
}
