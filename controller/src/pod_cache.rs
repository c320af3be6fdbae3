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
//! A cache may lag the API server by the watch's latency. Reconcile relies on it only where a
//! lag delays a step and never breaks a guarantee; the two decisions that need the truth read
//! it fresh: whether the current attempt's pod is missing (a GET by name, in the sweeper) and
//! whether an older attempt's pod can still run before a new one is created (G3: a LIST of the
//! run's pods, in dispatch).
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

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::watcher::Event;

use crate::pod::LABEL_JOB;

/// A namespace and a job name.
type JobKey = (String, String);
/// A namespace and a pod name.
type PodKey = (String, String);

#[derive(Default)]
struct Contents {
    /// Pods by job, then by pod name.
    by_job: HashMap<JobKey, BTreeMap<String, Arc<Pod>>>,
    /// The job each pod is filed under.
    job_of: HashMap<PodKey, JobKey>,
}

impl Contents {
    fn insert(&mut self, pod: &Pod) {
        let Some(job) = job_key(pod) else {
            self.remove(pod); // a pod that lost its label is no longer a run pod
            return;
        };
        let key = pod_key(pod);
        if let Some(old) = self.job_of.get(&key).filter(|old| **old != job).cloned() {
            self.forget(&old, &key.1);
        }
        self.by_job
            .entry(job.clone())
            .or_default()
            .insert(key.1.clone(), Arc::new(pod.clone()));
        self.job_of.insert(key, job);
    }

    fn remove(&mut self, pod: &Pod) {
        let key = pod_key(pod);
        if let Some(job) = self.job_of.remove(&key) {
            self.forget(&job, &key.1);
        }
    }

    fn forget(&mut self, job: &JobKey, pod: &str) {
        if let Some(pods) = self.by_job.get_mut(job) {
            pods.remove(pod);
            if pods.is_empty() {
                self.by_job.remove(job);
            }
        }
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
    /// Applies one watcher event.
    pub fn apply(&self, event: &Event<Pod>) {
        let Ok(mut state) = self.state.write() else {
            return; // poisoned: a panic elsewhere; reconcile falls back to listing
        };
        match event {
            Event::Apply(pod) => state.live.insert(pod),
            Event::Delete(pod) => state.live.remove(pod),
            Event::Init => state.relist = Some(Contents::default()),
            Event::InitApply(pod) => state
                .relist
                .get_or_insert_with(Contents::default)
                .insert(pod),
            Event::InitDone => {
                if let Some(listed) = state.relist.take() {
                    state.live = listed;
                }
                state.ready = true;
            }
        }
    }

    /// The pods filed under job `name` in `namespace`, or `None` while the watch has not
    /// completed its first listing (the caller then asks the API server).
    pub fn job_pods(&self, namespace: &str, name: &str) -> Option<Vec<Pod>> {
        let state = self.state.read().ok()?;
        if !state.ready {
            return None;
        }
        let key = (namespace.to_owned(), name.to_owned());
        Some(
            state
                .live
                .by_job
                .get(&key)
                .map(|pods| pods.values().map(|p| Pod::clone(p)).collect())
                .unwrap_or_default(),
        )
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
