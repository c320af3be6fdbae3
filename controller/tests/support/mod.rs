//! The harness of the controller's integration tests: a real kube-apiserver (from
//! `KUBECONFIG`, the local cluster of `e2e/cluster/up`) and a real S3 server
//! (`COJOB_TEST_S3_URL`). No kubelet runs the pods: they carry a node selector no node matches,
//! and the tests write their phases. Time is a fake clock the tests move.
//!
//! A [`Budget`] simulates a crash: it lets the first N mutating requests through, to the bucket
//! and to the API server alike, and fails every one after it, as if the process had died there.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use cojob::clock::FakeClock;
use cojob::error::Op;
use cojob::store::{Backend, ObjectStoreBackend, StoredObject};
use cojob::{Db, LeaseInfo, PutMode, PutOutcome, Store, StoreError};
use cojob_controller::context::{Context, Settings};
use cojob_controller::crd::CoordinatedJob;
use cojob_controller::index::Decision;
use cojob_controller::layout::JobKeys;
use cojob_test_support::{install_crd, required_env};
use k8s_openapi::api::core::v1::{Namespace, Pod, PodCondition, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kube::{Client, Config, ResourceExt};
use serde_json::{Value, json};

/// How many mutating requests may still succeed; `None` is unlimited.
#[derive(Clone, Debug, Default)]
pub struct Budget {
    left: Option<Arc<AtomicI64>>,
    down: Arc<AtomicBool>,
}

impl Budget {
    /// Unlimited.
    pub fn unlimited() -> Budget {
        Budget::default()
    }

    /// The first `n` mutating requests succeed, then every one fails.
    pub fn crash_after(n: i64) -> Budget {
        Budget {
            left: Some(Arc::new(AtomicI64::new(n))),
            down: Arc::default(),
        }
    }

    /// Every store request fails (reads too): the bucket is unreachable.
    pub fn store_down() -> Budget {
        Budget {
            left: None,
            down: Arc::new(AtomicBool::new(true)),
        }
    }

    fn spend(&self) -> bool {
        match &self.left {
            None => true,
            Some(left) => left.fetch_sub(1, Ordering::SeqCst) > 0,
        }
    }

    /// Cuts this budget's bucket off (every request fails, reads too), or restores it.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// True once the budget ran out.
    pub fn crashed(&self) -> bool {
        self.left
            .as_ref()
            .is_some_and(|l| l.load(Ordering::SeqCst) < 0)
    }
}

/// A backend that fails mutating requests once its budget is spent.
#[derive(Debug)]
struct CrashBackend {
    inner: ObjectStoreBackend,
    budget: Budget,
}

fn crashed(op: Op, key: &str) -> StoreError {
    StoreError::Unavailable {
        op,
        key: key.into(),
        source: "injected crash".into(),
    }
}

#[async_trait]
impl Backend for CrashBackend {
    async fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        if self.budget.down.load(Ordering::SeqCst) {
            return Err(crashed(Op::Get, key));
        }
        self.inner.get(key).await
    }
    async fn put(
        &self,
        key: &str,
        body: Bytes,
        mode: &PutMode,
        token: &str,
    ) -> Result<PutOutcome, StoreError> {
        if self.budget.down.load(Ordering::SeqCst) || !self.budget.spend() {
            return Err(crashed(Op::PutIfMatch, key));
        }
        self.inner.put(key, body, mode, token).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        if self.budget.down.load(Ordering::SeqCst) || !self.budget.spend() {
            return Err(crashed(Op::Delete, key));
        }
        self.inner.delete(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.inner.list(prefix).await
    }
}

/// The store at `bucket` (an S3 URL), whose requests spend `budget`.
pub fn store_with_budget(bucket: &str, budget: &Budget) -> Store {
    let url = url::Url::parse(bucket).unwrap();
    let (inner, prefix) = ObjectStoreBackend::from_url(&url).unwrap();
    Store::new(
        CrashBackend {
            inner,
            budget: budget.clone(),
        },
        &prefix,
    )
}

/// One test's namespace, bucket prefix and fake clock.
pub struct Harness {
    /// An unrestricted client.
    pub client: Client,
    /// The test's namespace.
    pub ns: String,
    /// The bucket URL (a fresh prefix).
    pub bucket: String,
    /// An unrestricted view of the bucket, on the fake clock.
    pub db: Db,
    /// The fake clock every context shares.
    pub clock: FakeClock,
    config: Config,
}

fn unique(prefix: &str) -> String {
    let nanos = Utc::now().timestamp_nanos_opt().unwrap_or_default();
    format!("{prefix}-{:x}", nanos & 0xff_ffff_ffff)
}

impl Harness {
    /// Creates a namespace and a bucket prefix, and installs the CRD.
    pub async fn new(prefix: &str) -> Harness {
        required_env("KUBECONFIG");
        let s3 = required_env("COJOB_TEST_S3_URL");
        let config = Config::infer().await.expect("kubeconfig");
        let client = Client::try_from(config.clone()).expect("client");
        install_crd(&client, "cojob-integration", Duration::from_secs(10)).await;
        let ns = unique(prefix);
        let namespaces: Api<Namespace> = Api::all(client.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
            )
            .await
            .expect("create namespace");
        // Pods are refused until the service-account controller made `default`.
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(client.clone(), &ns);
        for _ in 0..600 {
            if sas.get_opt("default").await.expect("get sa").is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let bucket = format!("{}/{}", s3.trim_end_matches('/'), ns);
        let clock = FakeClock::at(Utc::now());
        let db = Db::new(Store::open(&bucket).await.expect("open S3")).with_clock(clock.clone());
        Harness {
            client,
            ns,
            bucket,
            db,
            clock,
            config,
        }
    }

    /// A controller context whose bucket and API requests spend `budget`.
    pub fn context(&self, budget: &Budget) -> Arc<Context> {
        self.context_with(budget, |_| {})
    }

    /// Like [`context`](Self::context), with settings changed by `tune`.
    pub fn context_with(&self, budget: &Budget, tune: impl FnOnce(&mut Settings)) -> Arc<Context> {
        let db = Db::new(store_with_budget(&self.bucket, budget)).with_clock(self.clock.clone());
        self.context_on(db, budget, tune)
    }

    /// Like [`context_with`](Self::context_with), on the bucket `db` (another store; its
    /// settings' `bucket` is for `tune` to set).
    pub fn context_on(
        &self,
        db: Db,
        budget: &Budget,
        tune: impl FnOnce(&mut Settings),
    ) -> Arc<Context> {
        let api_budget = budget.clone();
        let filter =
            tower::filter::FilterLayer::new(move |req: http::Request<kube::client::Body>| {
                let mutating = req.method() != http::Method::GET;
                if mutating && !api_budget.spend() {
                    return Err::<_, tower::BoxError>("injected crash".into());
                }
                Ok(req)
            });
        let metrics = Arc::new(cojob_controller::metrics::Metrics::new(db.store().clone()));
        let client = kube::client::ClientBuilder::try_from(self.config.clone())
            .unwrap()
            .with_layer(&filter)
            .with_layer(&metrics.kube_requests().layer())
            .build();
        let reporter = Reporter {
            controller: "cojob-controller".into(),
            instance: Some("integration".into()),
        };
        let mut settings = Settings {
            sidecar_image: "localhost/cojob/cojob:dev".into(),
            bucket: self.bucket.clone(),
            forwarded_env: [("AWS_REGION".to_string(), "us-east-1".to_string())].into(),
            sweep_interval: Duration::from_secs(1),
            clock_skew_allowance: Duration::from_secs(5),
            index_resync: Duration::from_secs(3600),
            sidecar_credentials_secret: None,
            holder_key: test_holder_key(),
            min_schedule_interval: Duration::from_secs(1),
            min_lease_ttl: Duration::from_secs(6),
            debounce: Duration::ZERO,
            minter: None,
        };
        tune(&mut settings);
        Arc::new(Context {
            run_events: cojob_controller::announce::RunEvents::new(
                client.clone(),
                reporter.clone(),
            ),
            recorder: Recorder::new(client.clone(), reporter),
            skipped: Default::default(),
            renewals: Default::default(),
            pod_cache: Default::default(),
            retries: Default::default(),
            focus: Default::default(),
            client,
            db,
            settings,
            metrics,
        })
    }

    /// The CoordinatedJob API of the namespace.
    pub fn jobs(&self) -> Api<CoordinatedJob> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// The Pod API of the namespace.
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// The Secret API of the namespace.
    pub fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Creates a CoordinatedJob from a spec (merged over a default template whose pods no
    /// node runs).
    pub async fn create_job(&self, name: &str, spec: Value) -> CoordinatedJob {
        let mut full = json!({
            "lease": {"ttlSeconds": 300},
            "template": {"spec": {
                "nodeSelector": {"cojob.dev/integration-test": "no-such-node"},
                "containers": [{"name": "main", "image": "localhost/cojob/busybox:e2e"}]
            }}
        });
        merge(&mut full, spec);
        let job: CoordinatedJob = serde_json::from_value(json!({
            "apiVersion": "cojob.dev/v1alpha1",
            "kind": "CoordinatedJob",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": full,
        }))
        .expect("a valid CoordinatedJob");
        self.jobs()
            .create(&PostParams::default(), &job)
            .await
            .expect("create CoordinatedJob")
    }

    /// The job as stored now.
    pub async fn job(&self, name: &str) -> CoordinatedJob {
        self.jobs().get(name).await.expect("get CoordinatedJob")
    }

    /// One reconcile pass of `name` with `cx`, on the object as stored now.
    pub async fn reconcile_with(
        &self,
        cx: &Arc<Context>,
        name: &str,
    ) -> Result<Action, cojob_controller::reconcile::Error> {
        let job = Arc::new(self.job(name).await);
        cojob_controller::reconcile::reconcile(job, cx.clone()).await
    }

    /// `n` healthy reconcile passes; each must succeed.
    pub async fn settle(&self, name: &str, n: usize) {
        let cx = self.context(&Budget::unlimited());
        for i in 0..n {
            let Some(job) = self.jobs().get_opt(name).await.expect("get CoordinatedJob") else {
                return; // deleted: its finalizer is done
            };
            let result = cojob_controller::reconcile::reconcile(Arc::new(job), cx.clone()).await;
            if let Err(e) = result {
                panic!("reconcile pass {i} of {name} failed: {e}");
            }
        }
    }

    /// Asks for a manual run with trigger key `key` (what `cojob trigger` does).
    pub async fn trigger(&self, name: &str, key: &str) {
        let annotation = format!("{}{key}", cojob_controller::crd::TRIGGER_ANNOTATION_PREFIX);
        let patch = json!({"metadata": {"annotations": {annotation: "test"}}});
        self.jobs()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("trigger {name}: {e}"));
    }

    /// Sets annotation `name` on the job (an empty value removes it).
    pub async fn annotate(&self, job: &str, name: &str, value: &str) {
        let value = if value.is_empty() {
            Value::Null
        } else {
            json!(value)
        };
        let patch = json!({"metadata": {"annotations": {name: value}}});
        self.jobs()
            .patch(job, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("annotate {job}: {e}"));
    }

    /// Asks to cancel run `run_id` (what `cojob cancel` does).
    pub async fn request_cancel(&self, name: &str, run_id: &str) {
        let annotation = format!(
            "{}{run_id}",
            cojob_controller::crd::CANCEL_ANNOTATION_PREFIX
        );
        let patch = json!({"metadata": {"annotations": {annotation: "test"}}});
        self.jobs()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("cancel {run_id}: {e}"));
    }

    /// The trigger keys still asked for in the job's annotations.
    pub async fn pending_triggers(&self, name: &str) -> Vec<String> {
        let prefix = cojob_controller::crd::TRIGGER_ANNOTATION_PREFIX;
        self.job(name)
            .await
            .annotations()
            .keys()
            .filter_map(|k| k.strip_prefix(prefix).map(String::from))
            .collect()
    }

    /// The job's keys in the bucket.
    pub async fn keys(&self, name: &str) -> JobKeys {
        let job = self.job(name).await;
        JobKeys::new(&self.ns, name, &job.uid().unwrap())
    }

    /// A run's lease.
    pub async fn lease(&self, name: &str, run_id: &str) -> Option<LeaseInfo> {
        let key = self.keys(name).await.lease(run_id);
        self.db.inspect_lease(&key).await.expect("read lease")
    }

    /// Every tick decision of the job, by tick key suffix.
    pub async fn decisions(&self, name: &str) -> Vec<(String, Decision)> {
        let keys = self.keys(name).await;
        let folder = format!("{}/ticks", keys.base());
        let mut out = Vec::new();
        for key in self.db.store().list(&folder).await.expect("list ticks") {
            let (body, _) = self.db.store().get(&key).await.unwrap().expect("claim");
            let decision: Decision = serde_json::from_slice(&body).expect("a decision");
            out.push((key.rsplit('/').next().unwrap().to_string(), decision));
        }
        out
    }

    /// The job's pods, sorted by name.
    pub async fn job_pods(&self, name: &str) -> Vec<Pod> {
        let lp = ListParams::default().labels(&format!("cojob.dev/job={name}"));
        let mut pods = self.pods().list(&lp).await.expect("list pods").items;
        pods.sort_by_key(|p| p.name_any());
        pods
    }

    /// Names of the job's pods that are not being deleted.
    pub async fn live_pod_names(&self, name: &str) -> Vec<String> {
        self.job_pods(name)
            .await
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| p.name_any())
            .collect()
    }

    /// Plays the kubelet: the pod's main container ended with `exit_code`.
    pub async fn finish_pod(&self, pod: &str, exit_code: i32) {
        let phase = if exit_code == 0 {
            "Succeeded"
        } else {
            "Failed"
        };
        let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let status = json!({"status": {
            "phase": phase,
            "containerStatuses": [{
                "name": "main", "image": "localhost/cojob/busybox:e2e", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": exit_code, "reason": if exit_code == 0 {"Completed"} else {"Error"}, "startedAt": now, "finishedAt": now}}
            }]
        }});
        self.pods()
            .patch_status(pod, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap_or_else(|e| panic!("set the phase of pod {pod}: {e}"));
    }

    /// Plays the kubelet: the pod started (its sidecar, in these tests, never renews), taken up
    /// first if it was not ([`Harness::ack_pod`]).
    pub async fn start_pod(&self, pod: &str) {
        let taken_up = self
            .pods()
            .get(pod)
            .await
            .unwrap_or_else(|e| panic!("read pod {pod}: {e}"))
            .status
            .and_then(|s| s.start_time)
            .is_some();
        if !taken_up {
            self.ack_pod(pod).await;
        }
        let status = json!({"status": {"phase": "Running"}});
        self.pods()
            .patch_status(pod, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap_or_else(|e| panic!("set the phase of pod {pod}: {e}"));
    }

    /// Plays the kubelet taking a bound pod up: its acknowledgement (`status.startTime`, which
    /// a kubelet writes before it pulls the pod's images). Returns that time, to the second.
    pub async fn ack_pod(&self, pod: &str) -> DateTime<Utc> {
        let now = chrono::SubsecRound::trunc_subsecs(Utc::now(), 0);
        let at = now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let status = json!({"status": {"startTime": at}});
        self.pods()
            .patch_status(pod, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap_or_else(|e| panic!("set the start time of pod {pod}: {e}"));
        now
    }

    /// The pod's `PodScheduled` condition, if it has one.
    async fn scheduled(&self, pod: &str) -> Option<PodCondition> {
        let pod = self.pods().get_opt(pod).await.unwrap()?;
        pod.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == cojob_controller::sweeper::pods::POD_SCHEDULED)
    }

    /// The pod's `PodScheduled` condition as `(status, reason)`, if it has one.
    pub async fn scheduled_condition(&self, pod: &str) -> Option<(String, Option<String>)> {
        self.scheduled(pod).await.map(|c| (c.status, c.reason))
    }

    /// When the pod's `PodScheduled` condition last changed (the API server's clock, to the
    /// second).
    pub async fn scheduled_at(&self, pod: &str) -> DateTime<Utc> {
        self.scheduled(pod)
            .await
            .and_then(|c| c.last_transition_time)
            .as_ref()
            .and_then(cojob_controller::api_time::from_api)
            .expect("a PodScheduled condition with a time")
    }

    /// Waits (in real time, up to 20 s) until the real scheduler found no node for the pod
    /// (`PodScheduled` `False`, `Unschedulable`); panics otherwise.
    pub async fn wait_unschedulable(&self, pod: &str) {
        let want = Some(("False".to_string(), Some("Unschedulable".to_string())));
        for _ in 0..200 {
            if self.scheduled_condition(pod).await == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "the scheduler did not mark {pod} unschedulable: {:?}",
            self.scheduled_condition(pod).await
        );
    }

    /// Places a pod on a node no kubelet serves (the binding subresource, as the scheduler
    /// does): from then on only a kubelet's report could say it stopped, and nothing takes it
    /// up until the test plays the kubelet ([`Harness::ack_pod`], [`Harness::start_pod`]).
    pub async fn bind_pod(&self, pod: &str, node: &str) {
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": pod},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        self.pods()
            .create_subresource::<Value, Value>("binding", pod, &PostParams::default(), &binding)
            .await
            .unwrap_or_else(|e| panic!("bind pod {pod}: {e}"));
    }

    /// Attaches to the run's lease as the current attempt's sidecar does: with the epoch's
    /// derived holder and the job's ttl. Returns the lease and its epoch.
    async fn attach_as_sidecar(&self, name: &str, run_id: &str) -> (cojob::Lease, u64) {
        let key = self.keys(name).await.lease(run_id);
        let epoch = self.lease(name, run_id).await.expect("a lease").epoch;
        let holder = self.derived_holder(name, run_id, epoch).await;
        let ttl = self
            .job(name)
            .await
            .spec
            .lease
            .ttl_seconds
            .max(1)
            .unsigned_abs();
        let lease = self
            .db
            .attach_lease(&key, &holder, Duration::from_secs(ttl))
            .await
            .expect("attach")
            .expect("the epoch's lease, held and not expired");
        (lease, epoch)
    }

    /// Plays the sidecar: records in the run's lease that the attempt's workload started.
    pub async fn sidecar_started(&self, name: &str, run_id: &str) {
        // As the sidecar does: attach and renew (the deadline becomes its ttl from now), then
        // record the start.
        let (mut lease, _) = self.attach_as_sidecar(name, run_id).await;
        lease.renew().await.expect("renew");
        let now = cojob::json::format_time(self.now());
        lease
            .update_state(|s| {
                cojob::lease::merge(s, json!({"status": "running", "started_at": now}))
            })
            .await
            .expect("record the start");
    }

    /// Plays the sidecar's periodic renewal: the lease's deadline becomes its ttl from now.
    pub async fn sidecar_renews(&self, name: &str, run_id: &str) {
        let (mut lease, _) = self.attach_as_sidecar(name, run_id).await;
        lease.renew().await.expect("renew");
    }

    /// As the sidecar does when the kubelet stops it (after the workload's containers ended):
    /// one last renewal that marks its epoch stopping.
    pub async fn sidecar_stopped(&self, name: &str, run_id: &str) {
        let (mut lease, epoch) = self.attach_as_sidecar(name, run_id).await;
        lease
            .renew_with(|s| Ok(cojob_controller::run::mark_stopping(s, epoch)))
            .await
            .expect("the last renewal");
    }

    /// Deletes a pod as a user would (`kubectl delete pod`); the pod stays while it has
    /// finalizers.
    pub async fn delete_pod(&self, pod: &str) {
        self.pods()
            .delete(pod, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete pod {pod}: {e}"));
    }

    /// True while the pod object exists.
    pub async fn pod_exists(&self, pod: &str) -> bool {
        self.pods().get_opt(pod).await.unwrap().is_some()
    }

    /// Removes a pod at once, finalizers and all, as an administrator forcing it would (no
    /// kubelet is there to stop it).
    pub async fn delete_pod_now(&self, pod: &str) {
        let patch = json!({"metadata": {"finalizers": null}});
        let _ = self
            .pods()
            .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        let _ = self
            .pods()
            .delete(pod, &DeleteParams::default().grace_period(0))
            .await;
        for _ in 0..50 {
            if self.pods().get_opt(pod).await.unwrap().is_none() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("pod {pod} was not deleted");
    }

    /// The Events about the job, in no particular order.
    pub async fn events(&self, name: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.ns);
        let lp = ListParams::default().fields(&format!("regarding.name={name}"));
        events.list(&lp).await.expect("list events").items
    }

    /// The Events about the job with `reason`.
    pub async fn events_with_reason(&self, name: &str, reason: &str) -> Vec<Event> {
        let mut events = self.events(name).await;
        events.retain(|e| e.reason.as_deref() == Some(reason));
        events
    }

    /// The reasons of the Events about the job, in no particular order.
    pub async fn event_reasons(&self, name: &str) -> Vec<String> {
        self.events(name)
            .await
            .into_iter()
            .filter_map(|e| e.reason)
            .collect()
    }

    /// The holder the controller derives for `(run, epoch)` of `job`.
    pub async fn derived_holder(&self, job: &str, run: &str, epoch: u64) -> String {
        let job = self.jobs().get(job).await.unwrap();
        let keys = JobKeys::new(&self.ns, &job.name_any(), &job.uid().unwrap());
        test_holder_key().holder(&keys.lease(run), epoch)
    }

    /// Puts an object one byte over the document limit at `key` (as a tenant with write access
    /// to the job's folder could).
    pub async fn plant_oversized(&self, key: &str) {
        self.db
            .store()
            .put(
                key,
                vec![b' '; cojob::MAX_DOCUMENT_BYTES + 1].into(),
                PutMode::Overwrite,
            )
            .await
            .unwrap();
    }

    /// The name of the holder Secret a pod was created with.
    pub async fn secret_name_of(&self, pod: &str) -> Option<String> {
        let pod = self.pods().get_opt(pod).await.unwrap()?;
        cojob_controller::pod::holder_secret_of(&pod)
    }

    /// The holder kept in a pod's Secret.
    pub async fn secret_holder(&self, pod: &str) -> Option<String> {
        let name = self.secret_name_of(pod).await?;
        let secret = self.secrets().get_opt(&name).await.unwrap()?;
        let bytes = secret.data?.get("holder")?.0.clone();
        String::from_utf8(bytes).ok()
    }

    /// Moves the fake clock.
    pub fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }

    /// The fake clock's time.
    pub fn now(&self) -> DateTime<Utc> {
        cojob::clock::Clock::now(&self.clock)
    }

    /// Deletes the test's CoordinatedJobs (removing the finalizers the controller under test
    /// left) and waits until they are gone, so the next test binary finds none; then deletes
    /// the namespace.
    pub async fn cleanup(self) {
        for _ in 0..100 {
            let Ok(list) = self.jobs().list(&ListParams::default()).await else {
                break;
            };
            if list.items.is_empty() {
                break;
            }
            for job in list.items {
                let patch = json!({"metadata": {"finalizers": null}});
                let name = job.name_any();
                let _ = self
                    .jobs()
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                let _ = self.jobs().delete(&name, &DeleteParams::default()).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // No controller runs after the test: release the pods' result finalizers, or the
        // namespace could never go.
        if let Ok(pods) = self.pods().list(&ListParams::default()).await {
            for pod in pods.items {
                let patch = json!({"metadata": {"finalizers": null}});
                let _ = self
                    .pods()
                    .patch(
                        &pod.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await;
                // Pods bound to a node without a kubelet go only by force.
                let _ = self
                    .pods()
                    .delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
                    .await;
            }
        }
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let _ = namespaces.delete(&self.ns, &DeleteParams::default()).await;
    }
}

fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p,
    }
}

/// The holder key of every controller in these tests (all replicas share one).
pub fn test_holder_key() -> cojob_controller::sweeper::holder::HolderKey {
    cojob_controller::sweeper::holder::HolderKey::new(b"integration-tests-holder-key-0123456789")
        .unwrap()
}

/// A condition's `(status, reason)` in the job's status.
pub fn condition(job: &CoordinatedJob, kind: &str) -> (String, String) {
    let s = job.status.clone().expect("a status");
    let c = s
        .conditions
        .iter()
        .find(|c| c.type_ == kind)
        .unwrap_or_else(|| panic!("condition {kind} in {:?}", s.conditions));
    (c.status.clone(), c.reason.clone())
}
