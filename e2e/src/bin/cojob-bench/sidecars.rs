//! Simulated sidecars for the run pods on kwok's nodes (sizes of `--kwok`).
//!
//! Nothing runs on a simulated node, so without them no sidecar attaches to a run's lease. A
//! run pod that kwok reports Running is then, to the controller, a pod whose sidecar may have
//! attached unseen: it passes the attempt once per ttl, and takes the run over once the
//! pending lease expires while kwok still reports the pod Running (under kwok's backlog at
//! thousands of pods a tick, minutes later). A real node asks for neither.
//!
//! So the bench plays each pod's sidecar against the bucket with the real sidecar's lease
//! writes. Once kwok reports the pod Running:
//!
//! 1. it reads the holder from the pod's Secret, as the kubelet does for the container's
//!    environment (again every 10 s while the Secret is missing, as the kubelet does);
//! 2. it resumes the lease at the pod's epoch and records `running`, with the pod, its node
//!    and UID, in one compare-and-swap ([`cojob_controller::sidecar::attached_state`]); for
//!    a run decided ahead of its tick it reads the lease first and attaches only shortly
//!    before the tick ([`cojob_controller::run::sidecar_attach_at`]), as the real sidecar does;
//! 3. it renews every ttl/3;
//! 4. once the workload is over (5 s after the start gate opens, the longest kwok's stage runs
//!    it), or the pod ended or is being deleted, it renews once more, marking its epoch
//!    stopping ([`cojob_controller::run::mark_stopping`]), as the real sidecar does on the
//!    SIGTERM a kubelet sends it once the workload ended. It does not wait for kwok to report
//!    the pod's end: at N = 10 000 kwok's status writers report it minutes late, and a sidecar
//!    renewing all that while cost the bucket requests and takeovers no real node causes
//!    (2026-12-07: 186 takeovers); the controller waits for a stopping epoch's pod to end.
//!
//! It neither serves the workload API nor writes the shared volume's files: no workload
//! reads them on kwok. One store client serves every simulated sidecar of a bucket, where each
//! real one opens its own; the requests are the same.
//!
//! One difference remains: kwok moves a pod to Succeeded 2 to 5 s after Running (or after its
//! tick, for a run decided ahead: `e2e/bench/kwok-stages.yaml`) whether its sidecar attached
//! or not, where a real workload starts only after the attach. A pod that ended before its
//! simulated sidecar attached leaves the lease to the controller, as it did without simulated
//! sidecars.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use cojob::Db;
use cojob_controller::{pod, run, sidecar};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::runtime::watcher::Event;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;

/// What the simulated sidecars of one size did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SidecarCounts {
    /// Pods whose simulated sidecar attached (its first compare-and-swap landed).
    pub attached: u64,
    /// Pods whose lease could not be attached: the pod ended first (or was removed with its
    /// Secret), the lease was released or is at another epoch, or another pod of the epoch
    /// started.
    pub not_attached: u64,
    /// Sidecars that lost the lease while they renewed it, before their pod ended (a takeover).
    pub lost: u64,
    /// Sidecars that stopped with their workload or their pod: the stopping mark written, or
    /// the lease released by the controller with the pod's result already.
    pub stopped: u64,
    /// Sidecars that failed otherwise (the API server unreachable, or a holder Secret without
    /// a holder).
    pub errors: u64,
    /// Store errors of an attach or of the stopping mark, each followed by a new try after a
    /// kubelet's back-off (as a real sidecar that exits on one is started again); 0 in reports
    /// from before they were tried again.
    #[serde(default)]
    pub restarts: u64,
    /// Bucket requests of every simulated sidecar together.
    pub bucket_requests: u64,
}

/// How one simulated sidecar ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    NotAttached,
    Lost,
    Stopped,
}

#[derive(Default)]
struct Counters {
    attached: AtomicU64,
    not_attached: AtomicU64,
    lost: AtomicU64,
    stopped: AtomicU64,
    errors: AtomicU64,
    restarts: AtomicU64,
}

/// The simulated sidecars of one namespace, running until [`Sidecars::stop`].
pub struct Sidecars {
    task: tokio::task::JoinHandle<()>,
    counters: Arc<Counters>,
    stores: Arc<std::sync::Mutex<HashMap<String, Db>>>,
}

impl Sidecars {
    /// Starts simulating the sidecar of every run pod of `namespace` that kwok reports Running.
    pub fn start(client: &Client, namespace: &str) -> Sidecars {
        let counters = Arc::new(Counters::default());
        let stores = Arc::new(std::sync::Mutex::new(HashMap::new()));
        let task = tokio::spawn(watch_and_attach(
            client.clone(),
            namespace.to_owned(),
            counters.clone(),
            stores.clone(),
        ));
        Sidecars {
            task,
            counters,
            stores,
        }
    }

    /// Stops every simulated sidecar (the window's pods are read back by then) and
    /// says what they did.
    pub fn stop(self) -> SidecarCounts {
        // Aborting the watch drops its set of sidecars, which aborts them (also on drop).
        self.task.abort();
        let c = &self.counters;
        let bucket_requests = self
            .stores
            .lock()
            .map(|stores| stores.values().map(|db| db.store().stats().total()).sum())
            .unwrap_or_default();
        SidecarCounts {
            attached: c.attached.load(Ordering::Relaxed),
            not_attached: c.not_attached.load(Ordering::Relaxed),
            lost: c.lost.load(Ordering::Relaxed),
            stopped: c.stopped.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            restarts: c.restarts.load(Ordering::Relaxed),
            bucket_requests,
        }
    }
}

impl Drop for Sidecars {
    /// A size that failed midway stops its simulated sidecars too.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a pod's sidecar container is given, read from the pod.
struct Attempt {
    bucket: String,
    lease_key: String,
    epoch: u64,
    ttl: Duration,
    secret: String,
    me: sidecar::PodIdentity,
    /// The run's tick (`COJOB_FIRE_TIME`), when it is a time.
    tick: Option<chrono::DateTime<chrono::Utc>>,
}

impl Attempt {
    /// The attempt of a run pod, from its sidecar container's environment; `None` for a pod
    /// without one.
    fn of(p: &Pod) -> Option<Attempt> {
        let spec = p.spec.as_ref()?;
        let container = spec
            .init_containers
            .as_ref()?
            .iter()
            .find(|c| c.name == pod::SIDECAR_NAME)?;
        let env = container.env.as_ref()?;
        let value = |name: &str| {
            env.iter()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
        };
        Some(Attempt {
            bucket: value("COJOB_BUCKET")?,
            lease_key: value("COJOB_LEASE_KEY")?,
            epoch: value("COJOB_EPOCH")?.parse().ok()?,
            ttl: Duration::from_secs(value("COJOB_LEASE_TTL_SECONDS")?.parse().ok()?),
            secret: pod::holder_secret_of(p)?,
            tick: value("COJOB_FIRE_TIME").and_then(|t| cojob::json::parse_time(&t).ok()),
            me: sidecar::PodIdentity {
                pod: p.metadata.name.clone(),
                node: spec.node_name.clone(),
                uid: p.metadata.uid.clone(),
            },
        })
    }
}

/// The pod's phase is over, or it is being deleted: its sidecar would be stopped.
fn ended(p: &Pod) -> bool {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    p.metadata.deletion_timestamp.is_some() || matches!(phase, Some("Succeeded" | "Failed"))
}

/// kwok reported the pod Running: a real sidecar would be starting.
fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Watches the namespace's run pods, starts a simulated sidecar for each that turns Running
/// and tells it when its pod ended.
async fn watch_and_attach(
    client: Client,
    namespace: String,
    counters: Arc<Counters>,
    stores: Arc<std::sync::Mutex<HashMap<String, Db>>>,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().labels(pod::LABEL_RUN);
    let mut events = std::pin::pin!(watcher(pods, config).default_backoff());
    // The end signal of each Running pod given a sidecar, by UID, until the pod ended (a pod
    // never runs again once it ended or is being deleted, so this is also every pod given one).
    let mut ends: HashMap<String, watch::Sender<bool>> = HashMap::new();
    let mut sidecars = tokio::task::JoinSet::new();
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            Some(_) = sidecars.join_next(), if !sidecars.is_empty() => continue,
        };
        let p = match event {
            None => return,
            Some(Err(e)) => {
                println!("bench: simulated sidecars: pod watch: {e}");
                continue;
            }
            Some(Ok(Event::Apply(p) | Event::InitApply(p) | Event::Delete(p))) => p,
            Some(Ok(Event::Init | Event::InitDone)) => continue,
        };
        let Some(uid) = p.metadata.uid.clone() else {
            continue;
        };
        if ended(&p) {
            if let Some(end) = ends.remove(&uid) {
                // A sidecar that already ended (its lease lost) has no receiver left.
                let _ = end.send(true);
            }
            continue;
        }
        if !running(&p) || ends.contains_key(&uid) {
            continue;
        }
        let Some(attempt) = Attempt::of(&p) else {
            continue;
        };
        let (end, pod_ended) = watch::channel(false);
        ends.insert(uid, end);
        let db = match store(&stores, &attempt.bucket).await {
            Ok(db) => db,
            Err(e) => {
                println!("bench: simulated sidecars: {e:#}");
                counters.errors.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let (secrets, counters) = (secrets.clone(), counters.clone());
        sidecars.spawn(async move {
            let counter = match hold(&attempt, &secrets, &db, pod_ended, &counters).await {
                Ok(Outcome::NotAttached) => &counters.not_attached,
                Ok(Outcome::Lost) => &counters.lost,
                Ok(Outcome::Stopped) => &counters.stopped,
                Err(e) => {
                    println!(
                        "bench: simulated sidecar of {:?}: {e:#}",
                        attempt.me.pod.as_deref().unwrap_or_default()
                    );
                    &counters.errors
                }
            };
            counter.fetch_add(1, Ordering::Relaxed);
        });
    }
}

/// The store client of `bucket`, opened once (credentials from this process's environment,
/// like the tests').
async fn store(stores: &std::sync::Mutex<HashMap<String, Db>>, bucket: &str) -> anyhow::Result<Db> {
    if let Some(db) = stores.lock().ok().and_then(|s| s.get(bucket).cloned()) {
        return Ok(db);
    }
    let db = Db::open(bucket)
        .await
        .with_context(|| format!("opening {bucket}"))?;
    if let Ok(mut s) = stores.lock() {
        s.insert(bucket.to_owned(), db.clone());
    }
    Ok(db)
}

/// How long a kubelet waits before it tries again to start a container whose Secret was
/// missing, or one that exited (its pod worker's back-off).
const KUBELET_RETRY: Duration = Duration::from_secs(10);

/// Sleeps `wait` unless the pod ends first; `true` if it ended (or the watch that would say so
/// is gone).
async fn sleep_unless_ended(pod_ended: &mut watch::Receiver<bool>, wait: Duration) -> bool {
    if *pod_ended.borrow() {
        return true;
    }
    tokio::select! {
        _ = pod_ended.changed() => true,
        () = tokio::time::sleep(wait) => *pod_ended.borrow(),
    }
}

/// One simulated sidecar: attaches, renews every ttl/3 until its workload is over or its pod
/// ended, then renews once more marking its epoch stopping.
async fn hold(
    a: &Attempt,
    secrets: &Api<Secret>,
    db: &Db,
    mut pod_ended: watch::Receiver<bool>,
    counters: &Counters,
) -> anyhow::Result<Outcome> {
    // A pod created ahead of its tick without the holder gate may be Running a moment before
    // its Secret exists: like the kubelet, try again after its back-off (10 s) until the pod
    // ended. The Secret is owned by its pod, and goes with it.
    let secret = loop {
        if let Some(secret) = secrets.get_opt(&a.secret).await? {
            break secret;
        }
        if sleep_unless_ended(&mut pod_ended, KUBELET_RETRY).await {
            return Ok(Outcome::NotAttached);
        }
    };
    let holder = secret
        .data
        .and_then(|mut d| d.remove(pod::HOLDER_KEY))
        .context("the holder Secret has no holder")?;
    let holder = String::from_utf8(holder.0).context("the holder is not UTF-8")?;
    // A pod that ended first leaves its lease to the controller, as without a sidecar.
    if *pod_ended.borrow() {
        return Ok(Outcome::NotAttached);
    }
    // The real sidecar exits on a store error, and the kubelet starts it again after its
    // back-off: so does this one, until the pod ended.
    let mut lease = loop {
        match attach(a, &holder, db, &mut pod_ended).await {
            Ok(Some(lease)) => break lease,
            Ok(None) => return Ok(Outcome::NotAttached),
            Err(e) => {
                counters.restarts.fetch_add(1, Ordering::Relaxed);
                println!(
                    "bench: simulated sidecar of {:?}: {e:#}; starting again in {KUBELET_RETRY:?}",
                    a.me.pod.as_deref().unwrap_or_default()
                );
                if sleep_unless_ended(&mut pod_ended, KUBELET_RETRY).await {
                    return Ok(Outcome::NotAttached);
                }
            }
        }
    };
    counters.attached.fetch_add(1, Ordering::Relaxed);
    let workload_ended = tokio::time::sleep(workload_time(a.tick, chrono::Utc::now()));
    let mut workload_ended = std::pin::pin!(workload_ended);
    loop {
        tokio::select! {
            // Its pod ended, or the watch that would say so is gone, or its workload is over
            // (a kubelet then stops the sidecar, whenever kwok reports the end): stop as on
            // SIGTERM.
            _ = pod_ended.changed() => return stop(a, &mut lease).await,
            () = &mut workload_ended => return stop_ahead_of_kwok(a, &mut lease, &mut pod_ended, counters).await,
            () = tokio::time::sleep(a.ttl / 3) => {
                match lease.renew().await {
                    Ok(()) => {}
                    Err(e) if e.is_lease_lost() => return Ok(Outcome::Lost),
                    // A passing store error: the next renewal tries again, as the real
                    // sidecar's does.
                    Err(e) => println!("bench: simulated sidecar of {:?}: renewal failed: {e}", a.me.pod.as_deref().unwrap_or_default()),
                }
            }
        }
    }
}

/// How long kwok's stage runs a pod's workload (`e2e/bench/kwok-stages.yaml`: it ends 2 to
/// 5 s after it started); the simulated sidecar takes the longest.
const WORKLOAD: Duration = Duration::from_secs(5);

/// How long from `now`, an attach, until the workload of a run of `tick` is over: it starts at
/// the tick (the start gate) or at once if the tick is past, and runs [`WORKLOAD`].
fn workload_time(
    tick: Option<chrono::DateTime<chrono::Utc>>,
    now: chrono::DateTime<chrono::Utc>,
) -> Duration {
    let gate = tick
        .and_then(|t| (t - now).to_std().ok())
        .unwrap_or_default();
    gate + WORKLOAD
}

/// One start of a simulated sidecar, up to its attach: `None` if the lease is not this
/// attempt's, or the pod ended first. A run decided ahead of its tick reads its lease at once
/// and attaches a lead before the tick ([`run::sidecar_attach_at`]), as the real sidecar does.
async fn attach(
    a: &Attempt,
    holder: &str,
    db: &Db,
    pod_ended: &mut watch::Receiver<bool>,
) -> anyhow::Result<Option<cojob::Lease>> {
    let uid = a.me.uid.as_deref().unwrap_or_default();
    if let Some(at) = run::sidecar_attach_at(a.tick, chrono::Utc::now(), uid) {
        if db
            .resume_lease(&a.lease_key, holder, a.epoch, a.ttl)
            .await?
            .is_none()
        {
            return Ok(None);
        }
        let wait = (at - chrono::Utc::now()).to_std().unwrap_or_default();
        if sleep_unless_ended(pod_ended, wait).await {
            return Ok(None);
        }
    }
    let Some(mut lease) = db
        .resume_lease(&a.lease_key, holder, a.epoch, a.ttl)
        .await?
    else {
        return Ok(None);
    };
    let started = cojob::json::format_time(chrono::Utc::now());
    match lease
        .renew_with(|s| sidecar::attached_state(s, &a.me, &started))
        .await
    {
        Ok(()) => Ok(Some(lease)),
        Err(e) if e.is_lease_lost() || matches!(e, cojob::Error::Aborted { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// [`stop`] once the workload is over, tried again after a kubelet's back-off until it lands
/// or the pod's end is reported. The real sidecar writes its mark once: if that fails, its
/// kubelet reports the pod's end seconds later and the controller records it. kwok reports it
/// minutes late under a backlog, and the lease would expire meanwhile and the run be taken
/// over, which a real node does not cause.
async fn stop_ahead_of_kwok(
    a: &Attempt,
    lease: &mut cojob::Lease,
    pod_ended: &mut watch::Receiver<bool>,
    counters: &Counters,
) -> anyhow::Result<Outcome> {
    loop {
        match stop(a, lease).await {
            Err(e) => {
                counters.restarts.fetch_add(1, Ordering::Relaxed);
                println!(
                    "bench: simulated sidecar of {:?}: stopping: {e:#}; trying again in {KUBELET_RETRY:?}",
                    a.me.pod.as_deref().unwrap_or_default()
                );
            }
            done => return done,
        }
        if sleep_unless_ended(pod_ended, KUBELET_RETRY).await {
            return Ok(Outcome::Stopped);
        }
    }
}

/// The last renewal of a sidecar told to stop: it marks its epoch stopping
/// ([`run::mark_stopping`]), which tells the controller that the pod's end is on its way.
async fn stop(a: &Attempt, lease: &mut cojob::Lease) -> anyhow::Result<Outcome> {
    let epoch = a.epoch;
    match lease.renew_with(|s| Ok(run::mark_stopping(s, epoch))).await {
        // kwok may report the pod's end before this mark, where a kubelet reports it after:
        // the controller may have released the lease with the pod's result already, which is
        // what the mark leads to.
        Ok(()) => Ok(Outcome::Stopped),
        Err(e) if e.is_lease_lost() => Ok(Outcome::Stopped),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodStatus, PodTemplateSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

    /// A run pod as the controller builds it, bound to a kwok node with `phase`.
    fn run_pod(phase: &str) -> Pod {
        let template: PodTemplateSpec = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["true"]}]}
        }))
        .unwrap();
        let run = pod::RunIdentity {
            run_id: "co-1-1786240800".into(),
            epoch: 3,
            attempt: 2,
            fire_time: "2026-12-06T12:00:00Z".into(),
            trigger: None,
            secret: "co-1-1786240800-3-holder-abc123".into(),
            lease_key: "cojob/ns/co-1/runs/1786240800/lease".into(),
        };
        let cfg = pod::SidecarConfig {
            image: "cojob:dev".into(),
            bucket: "s3://cojob-test/bench-x".into(),
            env: Vec::new(),
            ttl_seconds: 60,
            credentials_secret: None,
        };
        let owner = OwnerReference {
            api_version: "cojob.dev/v1alpha1".into(),
            kind: "CoordinatedJob".into(),
            name: "co-1".into(),
            uid: "job-uid".into(),
            ..OwnerReference::default()
        };
        let mut p = pod::build_pod(&template, "ns", owner, "co-1", &run, &cfg, None);
        p.metadata.uid = Some("pod-uid".into());
        if let Some(spec) = p.spec.as_mut() {
            spec.node_name = Some("kwok-node-0".into());
        }
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            ..PodStatus::default()
        });
        p
    }

    #[test]
    fn a_run_pod_gives_its_sidecar_the_lease_epoch_ttl_and_holder_secret() {
        let a = Attempt::of(&run_pod("Running")).expect("a run pod has a sidecar");
        assert_eq!(a.bucket, "s3://cojob-test/bench-x");
        assert_eq!(a.lease_key, "cojob/ns/co-1/runs/1786240800/lease");
        assert_eq!(a.epoch, 3);
        assert_eq!(a.ttl, Duration::from_secs(60));
        assert_eq!(a.secret, "co-1-1786240800-3-holder-abc123");
        assert_eq!(
            a.tick,
            Some(cojob::json::parse_time("2026-12-06T12:00:00Z").unwrap())
        );
        assert_eq!(
            a.me,
            sidecar::PodIdentity {
                pod: Some("co-1-1786240800-3".into()),
                node: Some("kwok-node-0".into()),
                uid: Some("pod-uid".into()),
            }
        );
    }

    #[test]
    fn the_workload_ends_five_seconds_after_its_gate_opens() {
        let now = cojob::json::parse_time("2026-12-06T11:59:40Z").unwrap();
        let tick = cojob::json::parse_time("2026-12-06T12:00:00Z").unwrap();
        // Attached 20 s before its tick: the gate holds the workload until then.
        assert_eq!(workload_time(Some(tick), now), Duration::from_secs(25));
        // Attached after its tick, or without one (a one-shot run): at once.
        let late = cojob::json::parse_time("2026-12-06T12:00:03Z").unwrap();
        assert_eq!(workload_time(Some(tick), late), WORKLOAD);
        assert_eq!(workload_time(None, now), WORKLOAD);
    }

    #[test]
    fn a_pod_without_a_sidecar_gets_none() {
        let mut p = run_pod("Running");
        if let Some(spec) = p.spec.as_mut() {
            spec.init_containers = None;
        }
        assert!(Attempt::of(&p).is_none());
    }

    #[test]
    fn a_sidecar_starts_on_running_and_stops_on_the_end_or_a_deletion() {
        assert!(running(&run_pod("Running")) && !ended(&run_pod("Running")));
        assert!(!running(&run_pod("Pending")) && !ended(&run_pod("Pending")));
        assert!(ended(&run_pod("Succeeded")) && ended(&run_pod("Failed")));
        let mut deleted = run_pod("Running");
        deleted.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        assert!(ended(&deleted));
    }
}
