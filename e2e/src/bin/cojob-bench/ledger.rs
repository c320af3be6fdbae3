//! Every pod of a size, as a watch saw it: what the read-back of the window's figures needs,
//! without listing the namespace at the end.
//!
//! At N = 10 000 the namespace holds about 40 000 pods by the end of a window, and the API
//! server is still busy with the simulated cluster's play-out of the last tick: one list of
//! them took 275 s (2026-12-07), and the read-back (a list of 20 000 Jobs, then of every pod,
//! after suspending 20 000 objects) outlasted 30 minutes, so the hourly runs printed no table.
//! The ledger watches the namespace's pods from before the first object exists and keeps, for
//! each pod, the few fields of a [`Sample`]: the read-back only waits until the window's pods
//! stop arriving. A pod deleted after it was seen (a CronJob's history, a run taken over) stays
//! in the ledger, where a list would no longer show it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use crate::figures::{Sample, created, main_started};

/// Which kind a pod serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    CronJob,
    CoordinatedJob,
}

/// The pods of one namespace seen so far, by UID, kept until [`PodLedger`] is dropped.
pub struct PodLedger {
    task: tokio::task::JoinHandle<()>,
    seen: Arc<Mutex<HashMap<String, (Kind, Sample)>>>,
}

impl PodLedger {
    /// Starts watching the pods of `namespace` (before its objects are created: the watch
    /// begins with a list, so nothing created before it is established is lost either).
    pub fn start(client: &Client, namespace: &str) -> PodLedger {
        let seen = Arc::new(Mutex::new(HashMap::new()));
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let task = tokio::spawn(record(pods, seen.clone()));
        PodLedger { task, seen }
    }

    /// How many pods of a tick in `ticks` it has seen.
    pub fn count_of(&self, ticks: &[DateTime<Utc>]) -> usize {
        self.seen
            .lock()
            .map(|seen| {
                seen.values()
                    .filter(|(_, s)| ticks.contains(&s.tick))
                    .count()
            })
            .unwrap_or_default()
    }

    /// The names of the pods of either kind and of a tick in `ticks` in `pods` that it has not
    /// seen.
    pub fn missing(&self, pods: &[Pod], ticks: &[DateTime<Utc>]) -> Vec<String> {
        let Ok(seen) = self.seen.lock() else {
            return vec!["(the ledger's lock is poisoned)".into()];
        };
        pods.iter()
            .filter(|p| sample_of(p).is_some_and(|(_, s)| ticks.contains(&s.tick)))
            .filter(|p| {
                p.metadata
                    .uid
                    .as_ref()
                    .is_none_or(|uid| !seen.contains_key(uid))
            })
            .map(|p| p.name_any())
            .collect()
    }

    /// Every pod seen, by kind: the CronJobs', then the CoordinatedJobs'.
    pub fn samples(&self) -> (Vec<Sample>, Vec<Sample>) {
        let (mut cron, mut co) = (Vec::new(), Vec::new());
        if let Ok(seen) = self.seen.lock() {
            for (kind, s) in seen.values() {
                match kind {
                    Kind::CronJob => cron.push(s.clone()),
                    Kind::CoordinatedJob => co.push(s.clone()),
                }
            }
        }
        (cron, co)
    }
}

impl Drop for PodLedger {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Records every pod event of `pods` into `seen` until aborted.
async fn record(pods: Api<Pod>, seen: Arc<Mutex<HashMap<String, (Kind, Sample)>>>) {
    let mut events = std::pin::pin!(watcher(pods, watcher::Config::default()).default_backoff());
    while let Some(event) = events.next().await {
        let p = match event {
            Ok(Event::Apply(p) | Event::InitApply(p) | Event::Delete(p)) => p,
            Ok(Event::Init | Event::InitDone) => continue,
            Err(e) => {
                println!("bench: pod ledger: watch: {e}");
                continue;
            }
        };
        let (Some(uid), Some(sample)) = (p.metadata.uid.clone(), sample_of(&p)) else {
            continue;
        };
        if let Ok(mut seen) = seen.lock() {
            seen.entry(uid)
                .and_modify(|(_, s)| s.started = s.started.or(sample.1.started))
                .or_insert(sample);
        }
    }
}

/// The kind and figures of a pod of either kind; `None` for any other pod.
pub fn sample_of(pod: &Pod) -> Option<(Kind, Sample)> {
    let created = created(pod)?;
    let started = main_started(pod);
    let labels = pod.labels();
    if let Some(job) = labels.get("job-name") {
        let (owner, tick) = cronjob_tick(job)?;
        return Some((
            Kind::CronJob,
            Sample {
                owner,
                tick,
                created,
                started,
                unit: job.clone(),
            },
        ));
    }
    let owner = labels.get("cojob.dev/job")?;
    let run = labels.get("cojob.dev/run")?;
    let tick = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == "main")?
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == "COJOB_FIRE_TIME")?
        .value
        .as_deref()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())?
        .with_timezone(&Utc);
    Some((
        Kind::CoordinatedJob,
        Sample {
            owner: owner.clone(),
            tick,
            created,
            started,
            unit: run.clone(),
        },
    ))
}

/// The CronJob and the tick of one of its Jobs, from the Job's name: the CronJob controller
/// names each Job `<cronjob>-<scheduled time in minutes since the epoch>` (kubernetes
/// `pkg/controller/cronjob`, `getJobName`), and its pods carry it as label `job-name`.
pub fn cronjob_tick(job: &str) -> Option<(String, DateTime<Utc>)> {
    let (owner, minutes) = job.rsplit_once('-')?;
    let minutes: i64 = minutes.parse().ok()?;
    let tick = DateTime::from_timestamp(minutes.checked_mul(60)?, 0)?;
    (!owner.is_empty()).then(|| (owner.to_owned(), tick))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_cronjob_job_name_gives_its_cronjob_and_tick() {
        // 2026-12-07T23:00:00Z is 29 944 740 minutes after the epoch.
        let (owner, tick) = cronjob_tick("cj-17-29944740").unwrap();
        assert_eq!(owner, "cj-17");
        assert_eq!(
            tick,
            "2026-12-07T23:00:00Z".parse::<DateTime<Utc>>().unwrap()
        );
        // Any name that ends in a number is one: the namespace holds no other Jobs.
        assert_eq!(cronjob_tick("cj-17").map(|(o, _)| o), Some("cj".into()));
        assert_eq!(cronjob_tick("cj"), None);
        assert_eq!(cronjob_tick("cj-x"), None);
        assert_eq!(cronjob_tick("-29944740"), None);
    }

    #[test]
    fn pods_of_either_kind_give_their_samples_and_others_none() {
        let cron = pod(json!({
            "metadata": {"name": "cj-3-29944740-abcde", "uid": "u1",
                         "creationTimestamp": "2026-12-07T23:00:04Z",
                         "labels": {"job-name": "cj-3-29944740"}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            "status": {"containerStatuses": [{"name": "main", "image": "busybox", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "startedAt": "2026-12-07T23:00:09Z"}}}]}
        }));
        let (kind, s) = sample_of(&cron).unwrap();
        assert_eq!(kind, Kind::CronJob);
        assert_eq!(
            (s.owner.as_str(), s.unit.as_str()),
            ("cj-3", "cj-3-29944740")
        );
        assert_eq!(
            s.tick,
            "2026-12-07T23:00:00Z".parse::<DateTime<Utc>>().unwrap()
        );
        assert_eq!(
            s.created,
            "2026-12-07T23:00:04Z".parse::<DateTime<Utc>>().unwrap()
        );
        assert_eq!(s.started, Some("2026-12-07T23:00:09Z".parse().unwrap()));

        let co = pod(json!({
            "metadata": {"name": "co-3-1796684400-1", "uid": "u2",
                         "creationTimestamp": "2026-12-07T22:50:01Z",
                         "labels": {"cojob.dev/job": "co-3", "cojob.dev/run": "co-3-1796684400"}},
            "spec": {"containers": [{"name": "main", "image": "busybox",
                "env": [{"name": "COJOB_FIRE_TIME", "value": "2026-12-07T23:00:00Z"}]}]}
        }));
        let (kind, s) = sample_of(&co).unwrap();
        assert_eq!(kind, Kind::CoordinatedJob);
        assert_eq!(
            (s.owner.as_str(), s.unit.as_str()),
            ("co-3", "co-3-1796684400")
        );
        assert_eq!(
            s.tick,
            "2026-12-07T23:00:00Z".parse::<DateTime<Utc>>().unwrap()
        );
        assert_eq!(s.started, None);

        let other = pod(json!({
            "metadata": {"name": "x", "uid": "u3", "creationTimestamp": "2026-12-07T22:50:01Z"},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}
        }));
        assert!(sample_of(&other).is_none());
    }
}
