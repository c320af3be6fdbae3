//! The operator end to end: the chart installed by Helm (`charts/cojob`, `values-local.yaml`)
//! on the real cluster, real pods with the real lease sidecar, the real S3 server.
//!
//! One test drives everything, because the release is cluster-wide (one CRD, one controller):
//!
//! a. `helm upgrade --install --wait`: the controller Deployment, with two replicas racing on
//!    the bucket (`COJOB_E2E_REPLICAS` to change), becomes Available;
//! b. a 6-field schedule every 10 s, watched for 60 s: exactly one decision per tick, one pod
//!    per run, every run succeeded on its first attempt with no respawn, the sidecar recorded
//!    `running`;
//! c. a one-shot job succeeds: its lease is released with `succeeded` and exit code 0;
//! d. a running pod is deleted: the sweeper steals the expired lease (epoch 2) and respawns;
//! e. a failing pod is retried up to `maxAttempts`, then the run is `failed`;
//! h. a frozen sidecar next to a workload that ignores SIGTERM: no two attempts overlap (G3),
//!    checked on an effect ledger (`operator/faults.rs`);
//! f. a pod deleted after its workload succeeded, while no controller runs: recorded, never run
//!    again (G2), on the ledger;
//! i. fenced effects (G4): a workload's `cojob fenced-put` writes its result with its epoch, and
//!    is refused where a newer attempt already wrote (`operator/fence.rs`);
//! k. tenants: two namespaces with their own scoped S3 users; every attack of one tenant on
//!    the other, on the controller's credentials or through the controller is refused
//!    (`operator/tenant.rs`);
//! l. the workload API across a respawn (a step checkpointed by `cojob step` is not run again,
//!    on a ledger) and the command line as the kubectl plugin (`kubectl cojob trigger` twice
//!    runs once; `runs` and `why` report it) (`operator/workload.rs`);
//! j. the CRD deleted while a run is active: the run is cancelled, its pod stopped, the CRD
//!    goes and the controller stays up (`operator/crd_gone.rs`);
//! g. `helm uninstall` (its pre-delete hook drains every CoordinatedJob) leaves nothing behind.
//!
//! b–e, h, i, k and l run concurrently, each in its own namespace; f scales the controller down, so it
//! runs after them, then the chaos suite, then j (it deletes the CRD); g runs last. (Invalid specs rejected at
//! apply time are covered by `crd.rs`.) A failing step reports the pods, events, bucket state
//! and controller logs it saw; the controller's whole log is copied under `target/tmp/`.
//!
//! The controller watches every namespace and the uninstall drains every CoordinatedJob, so
//! the test needs the cluster's CoordinatedJobs to itself: it stops at once, naming them, when
//! another test's objects exist. The chart's values come from `charts/cojob/values-local.yaml`
//! (override with `COJOB_E2E_HELM_VALUES`), the bucket is a fresh prefix of
//! `COJOB_TEST_S3_URL`.

use anyhow::{Context, anyhow, bail, ensure};
use cojob_e2e::{
    LeaseView, RunRow, TestNamespace, client, coordinated_job, coordinated_jobs,
    describe_namespace, image, pod_log_tail, random_suffix, read_runs, repo_root, required_env,
    run_tool, runs_table,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[path = "operator/chaos.rs"]
mod chaos;
#[path = "operator/crd_gone.rs"]
mod crd_gone;
#[path = "operator/faults.rs"]
mod faults;
#[path = "operator/fence.rs"]
mod fence;
#[path = "operator/prestart.rs"]
mod prestart;
#[path = "operator/tenant.rs"]
mod tenant;
#[path = "operator/workload.rs"]
mod workload;

/// The release; its name contains "cojob", so every object of the chart is named `cojob-e2e`.
const RELEASE: &str = "cojob-e2e";
const RELEASE_NS: &str = "cojob-e2e-system";
const CRD_NAME: &str = "coordinatedjobs.cojob.dev";
/// The lease ttl of the test jobs, and the chart's local sweep interval (values-local.yaml).
const TTL: u64 = 6;
const SWEEP: u64 = 2;

struct Ctx {
    client: Client,
    /// The controller's bucket URL: a fresh prefix per run.
    bucket: String,
    store: cojob::Store,
    /// The proxy every controller and sidecar reaches the S3 server through (the chaos suite's
    /// slow store); `None` with custom Helm values (`COJOB_E2E_HELM_VALUES`).
    store_proxy: Option<cojob_e2e::proxy::LatencyProxy>,
}

/// An object's `creationTimestamp`, in whole seconds since the epoch.
fn created_second(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> anyhow::Result<i64> {
    meta.creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
        .context("no creationTimestamp")
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
}

fn ts(secs: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| secs.to_string())
}

/// Polls `check` every 500 ms until it gives `Some`, or fails after `timeout` with `what` and
/// the last error or observation it returned.
async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = String::from("(no observation)");
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}; last: {last}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Objects and observations.

/// A CoordinatedJob spec: busybox running `sh -c <script>` on the host network (the S3 server
/// and the apiserver are on 127.0.0.1), with a short lease, merged with `extra`.
fn spec(script: &str, extra: Value) -> Value {
    let mut spec = json!({
        "lease": {"ttlSeconds": TTL},
        "template": {
            "spec": {
                "hostNetwork": true,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 2,
                "containers": [{
                    "name": "main",
                    "image": image("busybox"),
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                    "securityContext": {
                        "allowPrivilegeEscalation": false,
                        "capabilities": {"drop": ["ALL"]}
                    }
                }]
            }
        }
    });
    if let (Value::Object(base), Value::Object(extra)) = (&mut spec, extra) {
        base.extend(extra);
    }
    spec
}

async fn create_job(ctx: &Ctx, ns: &str, name: &str, spec: Value) -> anyhow::Result<DynamicObject> {
    coordinated_jobs(&ctx.client, ns)
        .create(&PostParams::default(), &coordinated_job(name, spec))
        .await
        .with_context(|| format!("creating CoordinatedJob {ns}/{name}"))
}

/// Sets `spec.suspend` of the CoordinatedJob `ns/name`.
async fn suspend(ctx: &Ctx, ns: &str, name: &str) -> anyhow::Result<()> {
    coordinated_jobs(&ctx.client, ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": true}})),
        )
        .await
        .with_context(|| format!("suspending {ns}/{name}"))?;
    Ok(())
}

async fn job_status(ctx: &Ctx, ns: &str, name: &str) -> anyhow::Result<Value> {
    let obj = coordinated_jobs(&ctx.client, ns).get(name).await?;
    Ok(obj.data.get("status").cloned().unwrap_or(Value::Null))
}

fn counter(status: &Value, name: &str) -> i64 {
    status["counters"][name].as_i64().unwrap_or(0)
}

/// Waits for `.status.counters.<name>` of the job to equal `want`.
async fn wait_counter(ctx: &Ctx, ns: &str, job: &str, name: &str, want: i64) -> anyhow::Result<()> {
    wait_for(
        &format!("status.counters.{name} == {want} on {ns}/{job}"),
        Duration::from_secs(30),
        || async {
            let status = job_status(ctx, ns, job).await?;
            if counter(&status, name) == want {
                Ok(Some(()))
            } else {
                Err(anyhow!("status: {status}"))
            }
        },
    )
    .await
}

/// The events of the namespace that regard `kind/name`.
async fn events_about(ctx: &Ctx, ns: &str, kind: &str, name: &str) -> anyhow::Result<Vec<Event>> {
    let events: Api<Event> = Api::namespaced(ctx.client.clone(), ns);
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name))
        })
        .collect())
}

/// Waits for an event with `reason` about the CoordinatedJob `job`.
async fn wait_job_event(ctx: &Ctx, ns: &str, job: &str, reason: &str) -> anyhow::Result<Event> {
    wait_for(
        &format!("a {reason} event about CoordinatedJob {ns}/{job}"),
        Duration::from_secs(30),
        || async {
            let events = events_about(ctx, ns, "CoordinatedJob", job).await?;
            let reasons: Vec<String> = events.iter().filter_map(|e| e.reason.clone()).collect();
            match events
                .into_iter()
                .find(|e| e.reason.as_deref() == Some(reason))
            {
                Some(e) => Ok(Some(e)),
                None => Err(anyhow!("reasons seen: {reasons:?}")),
            }
        },
    )
    .await
}

/// The pods that the scheduler placed in `ns` (its `Scheduled` events outlive the pods).
async fn scheduled_pods(ctx: &Ctx, ns: &str) -> anyhow::Result<BTreeSet<String>> {
    let events: Api<Event> = Api::namespaced(ctx.client.clone(), ns);
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Scheduled"))
        .filter_map(|e| e.regarding.and_then(|r| r.name))
        .collect())
}

/// Every pod of a job seen while the tracker ran: its labels and the phases it was seen in.
#[derive(Debug, Clone, Default)]
struct SeenPod {
    run: String,
    epoch: String,
    phases: BTreeSet<String>,
}

/// Lists a job's pods every 300 ms in the background and remembers each one, so pods that the
/// controller deletes later still count.
struct PodTracker {
    seen: Arc<Mutex<BTreeMap<String, SeenPod>>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodTracker {
    fn start(client: &Client, ns: &str, job: &str) -> PodTracker {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let selector = format!("cojob.dev/job={job}");
        let seen: Arc<Mutex<BTreeMap<String, SeenPod>>> = Arc::default();
        let record = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await {
                    let mut seen = record.lock().unwrap();
                    for p in list.items {
                        let name = p.metadata.name.clone().unwrap_or_default();
                        let labels = p.metadata.labels.clone().unwrap_or_default();
                        let entry = seen.entry(name).or_default();
                        entry.run = labels.get("cojob.dev/run").cloned().unwrap_or_default();
                        entry.epoch = labels.get("cojob.dev/epoch").cloned().unwrap_or_default();
                        if let Some(phase) = p.status.and_then(|s| s.phase) {
                            entry.phases.insert(phase);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        PodTracker { seen, task }
    }

    fn seen(&self) -> BTreeMap<String, SeenPod> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for PodTracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The job's UID (a segment of its bucket keys).
async fn job_uid(ctx: &Ctx, ns: &str, name: &str) -> anyhow::Result<String> {
    coordinated_jobs(&ctx.client, ns)
        .get(name)
        .await?
        .metadata
        .uid
        .ok_or_else(|| anyhow!("{ns}/{name} has no uid"))
}

async fn runs(ctx: &Ctx, ns: &str, name: &str, uid: &str) -> anyhow::Result<Vec<RunRow>> {
    read_runs(&ctx.store, ns, name, Some(uid)).await
}

/// The lease of a one-shot job's run (`<name>-once`), once its `ticks/once` claim exists.
async fn once_lease(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    uid: &str,
) -> anyhow::Result<Option<LeaseView>> {
    let rows = runs(ctx, ns, name, uid).await?;
    let Some(row) = rows.iter().find(|r| r.tick == "once") else {
        return Ok(None);
    };
    let want = format!("{name}-once");
    ensure!(
        row.decision.run_id() == Some(want.as_str()),
        "ticks/once decided {:?}, expected run {want}",
        row.decision
    );
    Ok(row.lease.clone())
}

/// Waits until the one-shot run's lease is terminal, and returns it.
async fn terminal_once_lease(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    uid: &str,
    what: &str,
    timeout: Duration,
) -> anyhow::Result<LeaseView> {
    wait_for(what, timeout, || async {
        match once_lease(ctx, ns, name, uid).await? {
            Some(l) if l.is_terminal() => Ok(Some(l)),
            other => Err(anyhow!("lease: {other:?}")),
        }
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// a. install

/// Makes a CRD created outside Helm (by `crd.rs`, which applies `crds/` itself) adoptable by
/// this release; refuses one that another release owns, since two controllers on two buckets
/// would each run every tick.
async fn adopt_or_check_crd(ctx: &Ctx) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    let Some(crd) = crds.get_opt(CRD_NAME).await? else {
        return Ok(());
    };
    let annotations = crd.metadata.annotations.clone().unwrap_or_default();
    match annotations.get("meta.helm.sh/release-name") {
        Some(owner) if owner == RELEASE => Ok(()),
        Some(owner) => bail!(
            "CRD {CRD_NAME} belongs to Helm release {owner} in {}: another cojob controller \
             runs on this cluster. Uninstall it first (helm uninstall {owner} -n {0})",
            annotations
                .get("meta.helm.sh/release-namespace")
                .cloned()
                .unwrap_or_default()
        ),
        None => {
            let patch = json!({"metadata": {
                "labels": {"app.kubernetes.io/managed-by": "Helm"},
                "annotations": {
                    "meta.helm.sh/release-name": RELEASE,
                    "meta.helm.sh/release-namespace": RELEASE_NS
                }
            }});
            crds.patch(CRD_NAME, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            println!("adopted the existing CRD {CRD_NAME} into release {RELEASE}");
            Ok(())
        }
    }
}

/// The label of this test's namespaces: CoordinatedJobs left there by an earlier, failed run
/// are this test's own to remove.
const OWN_LABEL: &str = "cojob.dev/e2e-operator";

/// The controller watches every namespace and the drain hook deletes every CoordinatedJob, so
/// this test needs the cluster's CoordinatedJobs to itself: it fails fast, naming them, when
/// another test's objects are there, and clears what an earlier run of its own left behind.
async fn preflight(ctx: &Ctx) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    if crds.get_opt(CRD_NAME).await?.is_none() {
        return Ok(());
    }
    let all: Api<DynamicObject> =
        Api::all_with(ctx.client.clone(), &cojob_e2e::coordinated_job_resource());
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(ctx.client.clone());
    let own: BTreeSet<String> = namespaces
        .list_metadata(&ListParams::default().labels(OWN_LABEL))
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    // Objects already being deleted without finalizers (another test's cleanup, a namespace
    // going away) get a minute to disappear.
    let mut foreign = Vec::new();
    for _ in 0..60 {
        foreign.clear();
        let mut leaving = false;
        for job in all.list(&ListParams::default()).await?.items {
            let ns = job.metadata.namespace.clone().unwrap_or_default();
            let name = job.metadata.name.clone().unwrap_or_default();
            if own.contains(&ns) {
                strip_and_delete(ctx, &ns, &name).await;
            } else {
                leaving |= job.metadata.deletion_timestamp.is_some()
                    && job.metadata.finalizers.as_ref().is_none_or(Vec::is_empty);
                foreign.push(format!("{ns}/{name}"));
            }
        }
        if foreign.is_empty() || !leaving {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    ensure!(
        foreign.is_empty(),
        "the cluster is in use: CoordinatedJobs of another test or user exist ({}). This test \
         installs a controller for every namespace and its uninstall drains every \
         CoordinatedJob; run it when they are gone",
        foreign.join(", ")
    );
    Ok(())
}

/// Deletes a CoordinatedJob without its controller (finalizers removed).
async fn strip_and_delete(ctx: &Ctx, ns: &str, name: &str) {
    let api = coordinated_jobs(&ctx.client, ns);
    let _ = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await;
    let _ = api.delete(name, &DeleteParams::background()).await;
}

/// After a failed uninstall: removes what is left of the release by force, so the next run
/// (and the other tests on this cluster) start clean.
async fn force_cleanup(ctx: &Ctx, namespaces: &[String]) {
    for ns in namespaces {
        // Without a controller nobody releases the run pods' result finalizers.
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
        if let Ok(list) = pods.list(&ListParams::default()).await {
            for p in list.items {
                let _ = pods
                    .patch(
                        &p.metadata.name.unwrap_or_default(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
            }
        }
        if let Ok(list) = coordinated_jobs(&ctx.client, ns)
            .list(&ListParams::default())
            .await
        {
            for job in list.items {
                strip_and_delete(ctx, ns, &job.metadata.name.unwrap_or_default()).await;
            }
        }
    }
    if release_exists().await.unwrap_or(false) {
        let _ = run_tool(
            "helm",
            &[
                "uninstall",
                RELEASE,
                "-n",
                RELEASE_NS,
                "--no-hooks",
                "--wait",
                "--timeout",
                "2m",
            ],
        )
        .await;
    }
    let drain = format!("{RELEASE}-drain");
    for name in [RELEASE, drain.as_str()] {
        let _ = Api::<ClusterRole>::all(ctx.client.clone())
            .delete(name, &DeleteParams::default())
            .await;
        let _ = Api::<ClusterRoleBinding>::all(ctx.client.clone())
            .delete(name, &DeleteParams::default())
            .await;
    }
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    if let Ok(Some(crd)) = crds.get_opt(CRD_NAME).await {
        let owner = crd
            .metadata
            .annotations
            .unwrap_or_default()
            .get("meta.helm.sh/release-name")
            .cloned();
        if owner.as_deref() == Some(RELEASE) {
            let _ = crds.delete(CRD_NAME, &DeleteParams::default()).await;
        }
    }
}

/// Copies the controller pods' whole logs (they vanish with the pods at uninstall) into the
/// test's target directory and says where.
fn save_controller_logs(run: &str) -> String {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("operator-{run}"));
    let _ = std::fs::create_dir_all(&dir);
    let prefix = format!("{RELEASE_NS}_");
    let mut saved = 0;
    if let Ok(pods) = std::fs::read_dir("/var/log/pods") {
        for pod in pods.flatten() {
            let pod_dir = pod.file_name().to_string_lossy().into_owned();
            if !pod_dir.starts_with(&prefix) {
                continue;
            }
            for container in std::fs::read_dir(pod.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                for file in std::fs::read_dir(container.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    let target = dir.join(format!(
                        "{pod_dir}.{}.{}",
                        container.file_name().to_string_lossy(),
                        file.file_name().to_string_lossy()
                    ));
                    if std::fs::copy(file.path(), target).is_ok() {
                        saved += 1;
                    }
                }
            }
        }
    }
    format!(
        "{saved} log file(s) of {RELEASE_NS} saved in {}",
        dir.display()
    )
}

async fn release_exists() -> anyhow::Result<bool> {
    let out = run_tool("helm", &["list", "-n", RELEASE_NS, "-a", "-q"]).await?;
    Ok(out.lines().any(|l| l.trim() == RELEASE))
}

/// A [`LatencyProxy`](cojob_e2e::proxy::LatencyProxy) in front of the S3 server of
/// `AWS_ENDPOINT_URL` (`ci/test-servers`: `http://127.0.0.1:9000`).
async fn start_store_proxy() -> cojob_e2e::proxy::LatencyProxy {
    let endpoint = required_env("AWS_ENDPOINT_URL");
    let upstream: std::net::SocketAddr = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap_or_else(|e| panic!("AWS_ENDPOINT_URL={endpoint}: not http://<ip>:<port>: {e}"));
    cojob_e2e::proxy::LatencyProxy::start(upstream)
        .await
        .expect("a proxy on 127.0.0.1 in front of the S3 server")
}

async fn install(ctx: &Ctx) -> anyhow::Result<()> {
    if release_exists().await? {
        println!("a previous run left release {RELEASE}; uninstalling it first");
        run_tool(
            "helm",
            &[
                "uninstall",
                RELEASE,
                "-n",
                RELEASE_NS,
                "--wait",
                "--timeout",
                "3m",
            ],
        )
        .await?;
    }
    adopt_or_check_crd(ctx).await?;
    let chart = repo_root().join("charts/cojob");
    let values = std::env::var("COJOB_E2E_HELM_VALUES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| chart.join("values-local.yaml"));
    let bucket = format!("bucket={}", ctx.bucket);
    // Two replicas by default: every decision must stay exactly-once with two controllers
    // racing on the bucket (there is no leader election).
    let replicas = format!(
        "replicaCount={}",
        std::env::var("COJOB_E2E_REPLICAS").unwrap_or_else(|_| "2".into())
    );
    // With this repository's values, the store is reached through the test's proxy.
    let env = ctx
        .store_proxy
        .as_ref()
        .map(|p| {
            format!(
                "env={}",
                json!([
                    {"name": "AWS_ENDPOINT_URL", "value": format!("http://{}", p.addr())},
                    {"name": "AWS_ALLOW_HTTP", "value": "true"},
                    {"name": "AWS_REGION", "value": "us-east-1"},
                ])
            )
        })
        .unwrap_or_default();
    let mut extra: Vec<&str> = Vec::new();
    if !env.is_empty() {
        extra.extend(["--set-json", env.as_str()]);
    }
    let started = tokio::time::Instant::now();
    let out = run_tool(
        "helm",
        &[
            "upgrade",
            "--install",
            RELEASE,
            chart.to_str().unwrap(),
            "--namespace",
            RELEASE_NS,
            "--create-namespace",
            "-f",
            values.to_str().unwrap(),
            "--set",
            &bucket,
            "--set",
            &replicas,
            "--wait",
            "--timeout",
            "3m",
        ]
        .into_iter()
        .chain(extra)
        .collect::<Vec<_>>(),
    )
    .await?;
    println!(
        "helm install took {:?}:\n{}",
        started.elapsed(),
        out.lines().take(6).collect::<Vec<_>>().join("\n")
    );
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), RELEASE_NS);
    wait_for(
        "the controller Deployment to be Available",
        Duration::from_secs(60),
        || async {
            let d = deployments.get(RELEASE).await?;
            let status = d.status.clone().unwrap_or_default();
            let available = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Available" && c.status == "True");
            let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            if available && status.available_replicas.unwrap_or(0) >= want {
                Ok(Some(()))
            } else {
                Err(anyhow!("status: {}", serde_json::to_string(&status)?))
            }
        },
    )
    .await?;
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    wait_for(
        "the CRD to be Established",
        Duration::from_secs(30),
        || async {
            let c = crds.get(CRD_NAME).await?;
            let ok = c
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            Ok(ok.then_some(()))
        },
    )
    .await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// b. every 10 s for a minute: exactly once

async fn every_ten_seconds(ctx: Arc<Ctx>, ns: String) -> anyhow::Result<()> {
    let name = "tick10";
    let tracker = PodTracker::start(&ctx.client, &ns, name);
    let created = create_job(
        &ctx,
        &ns,
        name,
        spec(
            "echo run=$COJOB_RUN_ID epoch=$COJOB_EPOCH fire=$COJOB_FIRE_TIME; sleep 2",
            // Allow: this step checks that every tick runs once. Under Forbid (the default) a
            // run still finishing when the next tick comes (pod start is slow on a loaded CI
            // node) makes that tick a correct `skipped`, which is not what is checked here.
            json!({
                "schedule": "*/10 * * * * *",
                "concurrencyPolicy": "Allow",
                "successfulRunsHistoryLimit": 20
            }),
        ),
    )
    .await?;
    let uid = created.metadata.uid.clone().context("no uid")?;
    let created_at = created_second(&created.metadata)?;
    // The window: the first 10-second tick after creation and the six after it (60 s).
    let first = (created_at / 10 + 1) * 10;
    let window: Vec<i64> = (0..=6).map(|i| first + i * 10).collect();
    let last = *window.last().unwrap();
    println!(
        "b: {ns}/{name} created at {}; window {} .. {}",
        ts(created_at),
        ts(first),
        ts(last)
    );

    // Watch the leases while the window passes, to see the sidecar's `running`.
    let statuses: Mutex<BTreeMap<String, BTreeSet<String>>> = Mutex::default();
    let record = |rows: &[RunRow]| {
        let mut statuses = statuses.lock().unwrap();
        for r in rows {
            if let (Some(run), Some(l)) = (r.decision.run_id(), &r.lease) {
                statuses
                    .entry(run.to_string())
                    .or_default()
                    .insert(l.status().unwrap_or("?").to_string());
            }
        }
    };
    while now_secs() < last + 1 {
        if let Ok(rows) = runs(&ctx, &ns, name, &uid).await {
            record(&rows);
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    // Stop scheduling (later ticks are recorded as skipped), then let the last runs finish.
    suspend(&ctx, &ns, name).await?;
    let rows = wait_for(
        "every tick of the window decided and every run finished",
        Duration::from_secs(45),
        || async {
            let rows = runs(&ctx, &ns, name, &uid).await?;
            record(&rows);
            let decided: BTreeSet<i64> = rows.iter().filter_map(RunRow::tick_seconds).collect();
            let missing: Vec<String> = window
                .iter()
                .filter(|t| !decided.contains(t))
                .map(|t| ts(*t))
                .collect();
            let unfinished: Vec<&str> = rows
                .iter()
                .filter(|r| r.decision.run_id().is_some())
                .filter(|r| !r.lease.as_ref().is_some_and(LeaseView::is_terminal))
                .filter_map(|r| r.decision.run_id())
                .collect();
            if missing.is_empty() && unfinished.is_empty() {
                Ok(Some(rows))
            } else {
                Err(anyhow!(
                    "ticks without a decision: {missing:?}; runs not finished: {unfinished:?}\n{}",
                    runs_table(&rows)
                ))
            }
        },
    )
    .await?;
    // Wait for the runs' pods to be noticed (the tracker polls) before comparing.
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!("b: the bucket after the window:\n{}", runs_table(&rows));

    // One decision per tick, on the 10-second grid; every tick of the window ran.
    let table = runs_table(&rows);
    let mut by_tick: BTreeMap<i64, &RunRow> = BTreeMap::new();
    for r in &rows {
        let t = r
            .tick_seconds()
            .ok_or_else(|| anyhow!("a tick key that is not a fire time: {r:?}\n{table}"))?;
        ensure!(
            t % 10 == 0,
            "a tick off the 10-second grid: {}\n{table}",
            r.tick
        );
        ensure!(
            by_tick.insert(t, r).is_none(),
            "two claims for the tick {}\n{table}",
            ts(t)
        );
    }
    for t in &window {
        let r = by_tick[t];
        let want = format!("{name}-{t}");
        ensure!(
            r.decision.run_id() == Some(want.as_str()),
            "tick {} decided {:?}, expected the run {want}\n{table}",
            ts(*t),
            r.decision
        );
    }
    // Every run: succeeded under epoch 1, first attempt, released, written by the sidecar.
    let run_rows: Vec<&RunRow> = rows
        .iter()
        .filter(|r| r.decision.run_id().is_some())
        .collect();
    for r in &run_rows {
        let run = r.decision.run_id().unwrap();
        let want = format!("{name}-{}", r.tick_seconds().unwrap());
        ensure!(
            run == want,
            "tick {} has run id {run}, expected {want}",
            r.tick
        );
        let l = r.lease.as_ref().context("a run without a lease")?;
        // Epoch 1; or 2 when the controller recorded the result after the stopped sidecar's
        // lease had expired (a takeover for bookkeeping: attempt 1, the same pod, no respawn).
        ensure!(
            l.status() == Some("succeeded")
                && l.attempt() == Some(1)
                && (l.epoch == 1 || l.epoch == 2 && l.field("pod") == Some(&format!("{run}-1"))),
            "run {run}: expected succeeded at epoch 1, attempt 1; state {} epoch {}\n{table}",
            l.state,
            l.epoch
        );
        if l.epoch == 2 {
            println!(
                "b: note: run {run} was recorded at epoch 2: the controller came by after its \
                 lease expired (ttl {TTL} s) and took it over to record the result"
            );
        }
        ensure!(
            l.released,
            "run {run}: the lease is still held after success\n{table}"
        );
        ensure!(
            l.exit_code() == Some(0),
            "run {run}: exit code {:?}",
            l.exit_code()
        );
        ensure!(
            l.field("pod") == Some(format!("{run}-1").as_str()),
            "run {run}: state.pod is {:?}",
            l.field("pod")
        );
        ensure!(
            l.field("node").is_some() && l.field("started_at").is_some(),
            "run {run}: the sidecar did not record its node and start: {}",
            l.state
        );
    }
    // The sidecar recorded `running` (seen while polling at least once).
    let statuses = statuses.into_inner().unwrap();
    ensure!(
        statuses.values().any(|s| s.contains("running")),
        "no run was ever seen `running` in the bucket: {statuses:?}"
    );
    // Pods: one per run, epoch 1, and no pod for anything but a claimed run.
    let seen = tracker.seen();
    let scheduled = scheduled_pods(&ctx, &ns).await?;
    let mut pods_by_run: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (pod, s) in &seen {
        pods_by_run
            .entry(s.run.clone())
            .or_default()
            .insert(pod.clone());
        ensure!(s.epoch == "1", "pod {pod} has epoch {}: {seen:?}", s.epoch);
    }
    for pod in &scheduled {
        // Pods gone before the tracker saw them are known by their Scheduled event.
        if !seen.contains_key(pod) {
            let run = pod
                .rsplit_once('-')
                .map(|(r, _)| r.to_string())
                .unwrap_or_default();
            pods_by_run.entry(run).or_default().insert(pod.clone());
        }
    }
    let claimed: BTreeSet<String> = run_rows
        .iter()
        .filter_map(|r| r.decision.run_id().map(String::from))
        .collect();
    let with_pods: BTreeSet<String> = pods_by_run.keys().cloned().collect();
    ensure!(
        claimed == with_pods,
        "runs claimed {claimed:?} but pods ran for {with_pods:?} ({pods_by_run:?})"
    );
    for (run, pods) in &pods_by_run {
        ensure!(
            pods.len() == 1 && pods.contains(&format!("{run}-1")),
            "run {run} had pods {pods:?}"
        );
    }
    // The status agrees.
    let succeeded = run_rows.len() as i64;
    wait_counter(&ctx, &ns, name, "succeeded", succeeded).await?;
    let status = job_status(&ctx, &ns, name).await?;
    ensure!(
        counter(&status, "failed") == 0 && status["lastScheduleTime"].is_string(),
        "status: {status}"
    );
    wait_job_event(&ctx, &ns, name, "RunDispatched").await?;
    wait_job_event(&ctx, &ns, name, "RunSucceeded").await?;
    check_metrics(&ctx, &ns, name, succeeded).await?;
    println!(
        "b: ok: {} ticks in the window, {} runs, {} pods, all succeeded on attempt 1, no respawn",
        window.len(),
        claimed.len(),
        seen.len().max(scheduled.len())
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// c. a one-shot job succeeds and its lease is released

async fn released_on_success(ctx: Arc<Ctx>, ns: String) -> anyhow::Result<()> {
    let name = "once-ok";
    create_job(&ctx, &ns, name, spec("sleep 3", json!({}))).await?;
    let uid = job_uid(&ctx, &ns, name).await?;
    let lease = terminal_once_lease(
        &ctx,
        &ns,
        name,
        &uid,
        "the one-shot run to succeed",
        Duration::from_secs(90),
    )
    .await?;
    ensure!(
        lease.status() == Some("succeeded"),
        "final state: {}",
        lease.state
    );
    ensure!(
        lease.released,
        "the lease is still held after success: {lease:?}"
    );
    ensure!(lease.exit_code() == Some(0), "exit code: {}", lease.state);
    // Epoch 2 only if the result was recorded by a takeover after the lease expired.
    ensure!(
        (lease.epoch == 1 || lease.epoch == 2) && lease.attempt() == Some(1),
        "epoch {} attempt {:?}",
        lease.epoch,
        lease.attempt()
    );
    ensure!(
        lease.field("pod") == Some(format!("{name}-once-1").as_str()),
        "state.pod: {}",
        lease.state
    );
    ensure!(
        lease.field("finished_at").is_some(),
        "no finished_at: {}",
        lease.state
    );
    wait_counter(&ctx, &ns, name, "succeeded", 1).await?;
    let status = job_status(&ctx, &ns, name).await?;
    ensure!(
        counter(&status, "failed") == 0 && counter(&status, "active") == 0,
        "status: {status}"
    );
    wait_job_event(&ctx, &ns, name, "RunSucceeded").await?;
    // The controller logs JSON in the cluster, each reconcile in a span naming its object.
    let lines = controller_log_lines(&ctx).await?;
    let parsed: Vec<Value> = lines
        .iter()
        .map(|l| {
            serde_json::from_str(l)
                .with_context(|| format!("a controller log line is not JSON: {l}"))
        })
        .collect::<anyhow::Result<_>>()?;
    ensure!(
        parsed.iter().any(|l| l["span"]["name"] == "reconcile"
            && l["span"]["namespace"] == ns.as_str()
            && l["span"]["job"] == name),
        "no controller log line in the reconcile span of {ns}/{name} among {} lines",
        parsed.len()
    );
    println!(
        "c: ok: {name}-once succeeded, released, exit code 0; the controller's JSON log names it in the reconcile span"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// d. a deleted pod is respawned under epoch 2

async fn deleted_pod_respawned(ctx: Arc<Ctx>, ns: String) -> anyhow::Result<()> {
    let name = "respawn";
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    create_job(
        &ctx,
        &ns,
        name,
        spec("sleep 3600", json!({"maxAttempts": 3})),
    )
    .await?;
    let uid = job_uid(&ctx, &ns, name).await?;
    let first = format!("{name}-once-1");
    wait_for(
        &format!("pod {first} Running"),
        Duration::from_secs(90),
        || async {
            let p = pods.get_opt(&first).await?;
            let phase = p.as_ref().and_then(|p| p.status.as_ref()?.phase.clone());
            Ok((phase.as_deref() == Some("Running")).then_some(()))
        },
    )
    .await?;
    // The sidecar holds the lease and renews it (every ttl/3 = 2 s).
    let held = wait_for(
        "the lease to be running at epoch 1",
        Duration::from_secs(30),
        || async {
            match once_lease(&ctx, &ns, name, &uid).await? {
                Some(l) if l.status() == Some("running") && !l.released => Ok(Some(l)),
                other => Err(anyhow!("lease: {other:?}")),
            }
        },
    )
    .await?;
    ensure!(held.epoch == 1, "epoch {} before the deletion", held.epoch);
    tokio::time::sleep(Duration::from_secs(TTL / 3 * 2 + 1)).await;
    let renewed = once_lease(&ctx, &ns, name, &uid)
        .await?
        .context("lease vanished")?;
    ensure!(
        renewed.epoch == 1 && renewed.deadline_at > held.deadline_at,
        "the sidecar did not renew: deadline {} then {} (epoch {})",
        held.deadline_at,
        renewed.deadline_at,
        renewed.epoch
    );

    // Delete the running pod at once, as a lost node would.
    pods.delete(
        &first,
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .context("deleting the first pod")?;
    let deleted = tokio::time::Instant::now();
    let second = format!("{name}-once-2");
    let limit = Duration::from_secs(TTL + SWEEP + 32);
    let pod = wait_for(
        &format!("the respawned pod {second} (ttl {TTL} s + sweep {SWEEP} s + slack)"),
        limit,
        || async { Ok(pods.get_opt(&second).await?) },
    )
    .await?;
    let took = deleted.elapsed();
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    ensure!(
        labels.get("cojob.dev/epoch").map(String::as_str) == Some("2")
            && labels.get("cojob.dev/run").map(String::as_str) == Some(&format!("{name}-once")),
        "labels of {second}: {labels:?}"
    );
    let lease = wait_for(
        "the lease at epoch 2, attempt 2",
        Duration::from_secs(30),
        || async {
            match once_lease(&ctx, &ns, name, &uid).await? {
                Some(l) if l.epoch == 2 && l.attempt() == Some(2) => Ok(Some(l)),
                other => Err(anyhow!("lease: {other:?}")),
            }
        },
    )
    .await?;
    ensure!(
        !lease.is_terminal(),
        "the respawned run ended: {}",
        lease.state
    );
    wait_for(
        &format!("pod {second} Running"),
        Duration::from_secs(60),
        || async {
            let p = pods.get_opt(&second).await?;
            let phase = p.as_ref().and_then(|p| p.status.as_ref()?.phase.clone());
            Ok((phase.as_deref() == Some("Running")).then_some(()))
        },
    )
    .await?;
    wait_job_event(&ctx, &ns, name, "RunRespawned").await?;
    ensure!(
        pods.get_opt(&first).await?.is_none(),
        "the deleted pod {first} is back"
    );
    println!(
        "d: ok: {second} created {took:?} after {first} was deleted; lease epoch 2, attempt 2"
    );
    // The job stays active: `helm uninstall` must drain it (g).
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// e. a failing pod is retried up to maxAttempts

async fn failing_pod_retried(ctx: Arc<Ctx>, ns: String) -> anyhow::Result<()> {
    let name = "fails";
    let tracker = PodTracker::start(&ctx.client, &ns, name);
    create_job(
        &ctx,
        &ns,
        name,
        spec(
            "echo attempt $COJOB_ATTEMPT; exit 3",
            json!({"maxAttempts": 2}),
        ),
    )
    .await?;
    let uid = job_uid(&ctx, &ns, name).await?;
    let lease = terminal_once_lease(
        &ctx,
        &ns,
        name,
        &uid,
        "the run to fail",
        Duration::from_secs(120),
    )
    .await?;
    ensure!(
        lease.status() == Some("failed"),
        "final state: {}",
        lease.state
    );
    ensure!(
        lease.attempt() == Some(2),
        "expected attempt 2: epoch {} state {}",
        lease.epoch,
        lease.state
    );
    ensure!(lease.exit_code() == Some(3), "exit code: {}", lease.state);
    ensure!(
        lease.released,
        "the lease is still held after the failure: {lease:?}"
    );
    wait_counter(&ctx, &ns, name, "failed", 1).await?;
    wait_job_event(&ctx, &ns, name, "RunFailed").await?;
    // Exactly two pods ran: `-once-1`, then the retry under a later epoch. The retry is
    // usually `-once-2`; when the controller recorded attempt 1 after its lease had expired,
    // that takeover used epoch 2 (no pod) and the retry is `-once-3`.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut ran: BTreeSet<String> = tracker.seen().keys().cloned().collect();
    ran.extend(scheduled_pods(&ctx, &ns).await?);
    let epochs: Vec<u64> = ran
        .iter()
        .filter_map(|p| p.strip_prefix(&format!("{name}-once-"))?.parse().ok())
        .collect();
    ensure!(
        epochs.len() == 2 && ran.len() == 2 && epochs.contains(&1),
        "pods that ran: {ran:?}, expected {name}-once-1 and one retry"
    );
    let retry = format!("{name}-once-{}", epochs.iter().max().unwrap());
    ensure!(
        lease.field("pod") == Some(retry.as_str()) && lease.epoch >= *epochs.iter().max().unwrap(),
        "the final state names pod {:?} at epoch {}, expected the retry {retry}: {}",
        lease.field("pod"),
        lease.epoch,
        lease.state
    );
    if retry != format!("{name}-once-2") {
        println!(
            "e: note: attempt 1 was recorded by a takeover after its lease expired; the retry ran as {retry}"
        );
    }
    println!("e: ok: {ran:?} ran and failed with exit 3; the run is failed after attempt 2");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// g. helm uninstall leaves nothing behind

async fn uninstall_and_check(ctx: &Ctx) -> anyhow::Result<()> {
    let started = tokio::time::Instant::now();
    run_tool(
        "helm",
        &[
            "uninstall",
            RELEASE,
            "-n",
            RELEASE_NS,
            "--wait",
            "--timeout",
            "4m",
        ],
    )
    .await?;
    println!("helm uninstall took {:?}", started.elapsed());
    let c = &ctx.client;
    ensure!(!release_exists().await?, "helm still lists {RELEASE}");
    let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
    wait_for("the CRD to be deleted", Duration::from_secs(60), || async {
        Ok(crds.get_opt(CRD_NAME).await?.is_none().then_some(()))
    })
    .await?;
    let drain = format!("{RELEASE}-drain");
    let mut left = Vec::new();
    for name in [RELEASE, drain.as_str()] {
        if Api::<ClusterRole>::all(c.clone())
            .get_opt(name)
            .await?
            .is_some()
        {
            left.push(format!("ClusterRole {name}"));
        }
        if Api::<ClusterRoleBinding>::all(c.clone())
            .get_opt(name)
            .await?
            .is_some()
        {
            left.push(format!("ClusterRoleBinding {name}"));
        }
        let sas: Api<ServiceAccount> = Api::namespaced(c.clone(), RELEASE_NS);
        if sas.get_opt(name).await?.is_some() {
            left.push(format!("ServiceAccount {RELEASE_NS}/{name}"));
        }
    }
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), RELEASE_NS);
    if deployments.get_opt(RELEASE).await?.is_some() {
        left.push(format!("Deployment {RELEASE_NS}/{RELEASE}"));
    }
    if Api::<Job>::namespaced(c.clone(), RELEASE_NS)
        .get_opt(&drain)
        .await?
        .is_some()
    {
        left.push(format!("Job {RELEASE_NS}/{drain} (the pre-delete hook)"));
    }
    let creds = format!("{RELEASE}-credentials");
    if Api::<Secret>::namespaced(c.clone(), RELEASE_NS)
        .get_opt(&creds)
        .await?
        .is_some()
    {
        left.push(format!("Secret {RELEASE_NS}/{creds}"));
    }
    ensure!(
        left.is_empty(),
        "left behind after helm uninstall: {left:?}"
    );
    // The runs' pods and holder Secrets go with their CoordinatedJobs.
    let selector = ListParams::default().labels("cojob.dev/job");
    wait_for(
        "no pod or Secret labelled cojob.dev/job in any namespace",
        Duration::from_secs(90),
        || async {
            let pods = Api::<Pod>::all(c.clone()).list(&selector).await?;
            let secrets = Api::<Secret>::all(c.clone())
                .list_metadata(&selector)
                .await?;
            let name = |m: &kube::api::ObjectMeta| {
                format!(
                    "{}/{}",
                    m.namespace.clone().unwrap_or_default(),
                    m.name.clone().unwrap_or_default()
                )
            };
            let pods: Vec<String> = pods.items.iter().map(|p| name(&p.metadata)).collect();
            let secrets: Vec<String> = secrets.items.iter().map(|s| name(&s.metadata)).collect();
            if pods.is_empty() && secrets.is_empty() {
                Ok(Some(()))
            } else {
                Err(anyhow!("pods {pods:?}, secrets {secrets:?}"))
            }
        },
    )
    .await?;
    println!("g: ok: helm uninstall left no CRD, RBAC, controller, hook, pod or Secret");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Diagnostics

/// Scrapes every controller replica (each logs the port it serves on) and checks the metrics
/// against the `succeeded` runs that job `ns/name` made: summed over the replicas, at least that
/// many run decisions, successes and dispatch-lag observations (other scenarios run at the same
/// time), the job's last success within the last minute, readiness, and bucket requests.
async fn check_metrics(ctx: &Ctx, ns: &str, name: &str, succeeded: i64) -> anyhow::Result<()> {
    let mut ports = BTreeSet::new();
    for line in controller_log_lines(ctx).await? {
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if v["message"] == "serving /metrics, /healthz and /readyz"
            && let Some(port) = v["addr"].as_str().and_then(|a| a.rsplit(':').next())
        {
            ports.insert(port.to_string());
        }
    }
    ensure!(
        !ports.is_empty(),
        "no controller logged its metrics address"
    );
    let mut sums: BTreeMap<String, f64> = BTreeMap::new();
    let mut last_success = 0f64;
    let job_labels = format!("namespace=\"{ns}\",job=\"{name}\"");
    for port in &ports {
        let base = format!("http://127.0.0.1:{port}");
        let ready = run_tool("curl", &["-sS", "--fail", &format!("{base}/readyz")]).await;
        ensure!(ready.is_ok(), "replica on :{port} is not ready: {ready:?}");
        let text = run_tool("curl", &["-sS", "--fail", &format!("{base}/metrics")])
            .await
            .with_context(|| format!("scraping :{port}"))?;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let value: f64 = value.parse().unwrap_or(0.0);
            *sums.entry(series.to_string()).or_default() += value;
            if series == format!("cojob_job_last_success_timestamp_seconds{{{job_labels}}}") {
                last_success = last_success.max(value);
            }
        }
    }
    let sum = |series: &str| sums.get(series).copied().unwrap_or(0.0);
    let expected = succeeded as f64;
    ensure!(
        sum("cojob_decisions_total{kind=\"run\"}") >= expected
            && sum("cojob_runs_total{outcome=\"succeeded\"}") >= expected
            && sum("cojob_dispatch_lag_seconds_count") >= expected
            && sum("cojob_tick_pickup_seconds_count") >= expected,
        "metrics of {} replica(s) count fewer than the {succeeded} runs of {ns}/{name}: {sums:?}",
        ports.len()
    );
    let age = now_secs() as f64 - last_success;
    ensure!(
        (0.0..60.0).contains(&age),
        "{ns}/{name}'s last success is {age} s old by the metrics"
    );
    ensure!(
        sum("cojob_store_requests_total{op=\"put_if_absent\",outcome=\"ok\"}") >= expected,
        "bucket requests: {sums:?}"
    );
    Ok(())
}

/// Every line the controller containers logged, without the container runtime's prefix.
async fn controller_log_lines(ctx: &Ctx) -> anyhow::Result<Vec<String>> {
    let root = std::env::var("COJOB_E2E_POD_LOGS").unwrap_or_else(|_| "/var/log/pods".into());
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), RELEASE_NS);
    let mut lines = Vec::new();
    let on_host = std::path::Path::new(&root).is_dir();
    for pod in pods.list(&ListParams::default()).await?.items {
        let name = pod.metadata.name.unwrap_or_default();
        if !on_host {
            // kind keeps pod logs inside its node container: ask the API server.
            let text = cojob_e2e::run_tool(
                "kubectl",
                &["logs", "-n", RELEASE_NS, &name, "-c", "controller"],
            )
            .await?;
            lines.extend(
                text.lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(str::to_owned),
            );
            continue;
        }
        let prefix = format!("{RELEASE_NS}_{name}_");
        for dir in std::fs::read_dir(&root)?.flatten() {
            if !dir.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            let Ok(files) = std::fs::read_dir(dir.path().join("controller")) else {
                continue;
            };
            for file in files.flatten() {
                let text = std::fs::read_to_string(file.path())?;
                // CRI format: `<time> <stream> <tag> <line>`.
                lines.extend(
                    text.lines()
                        .filter_map(|l| l.splitn(4, ' ').nth(3))
                        .filter(|l| !l.trim().is_empty())
                        .map(str::to_owned),
                );
            }
        }
    }
    ensure!(!lines.is_empty(), "no controller log lines under {root}");
    Ok(lines)
}

async fn controller_logs(ctx: &Ctx) -> String {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), RELEASE_NS);
    let mut out = String::new();
    match pods.list(&ListParams::default()).await {
        Ok(list) => {
            for p in list.items {
                let name = p.metadata.name.clone().unwrap_or_default();
                out.push_str(&format!("=== {}\n", cojob_e2e::pod_summary(&p)));
                out.push_str(&pod_log_tail(RELEASE_NS, &name, None, 120));
            }
        }
        Err(e) => out.push_str(&format!("cannot list pods of {RELEASE_NS}: {e}\n")),
    }
    if out.is_empty() {
        out.push_str(&format!("(no pods in {RELEASE_NS})\n"));
    }
    out
}

async fn diagnose(ctx: &Ctx, ns: &str) -> String {
    let mut out = describe_namespace(&ctx.client, ns).await;
    if let Ok(list) = coordinated_jobs(&ctx.client, ns)
        .list(&ListParams::default())
        .await
    {
        for job in list.items {
            let name = job.metadata.name.clone().unwrap_or_default();
            out.push_str(&format!(
                "CoordinatedJob {name} status: {}\n",
                serde_json::to_string_pretty(job.data.get("status").unwrap_or(&Value::Null))
                    .unwrap_or_default()
            ));
            match read_runs(&ctx.store, ns, &name, None).await {
                Ok(rows) => out.push_str(&format!("bucket:\n{}", runs_table(&rows))),
                Err(e) => out.push_str(&format!("bucket: cannot read: {e:#}\n")),
            }
        }
    }
    // The logs of the job pods still present (main and sidecar).
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    if let Ok(list) = pods.list(&ListParams::default()).await {
        for p in list.items.iter().take(4) {
            let name = p.metadata.name.clone().unwrap_or_default();
            out.push_str(&pod_log_tail(ns, &name, None, 20));
        }
    }
    out
}

fn panic_message(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into()),
        Err(e) => e.to_string(),
    }
}

type Scenario =
    fn(Arc<Ctx>, String) -> std::pin::Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_installed_by_helm_runs_jobs_exactly_once() {
    let client = client().await;
    let base = required_env("COJOB_TEST_S3_URL");
    let bucket = format!(
        "{}/e2e-operator/{}",
        base.trim_end_matches('/'),
        random_suffix(10)
    );
    let store = cojob::Store::open(&bucket)
        .await
        .expect("open the test bucket");
    let store_proxy = match std::env::var("COJOB_E2E_HELM_VALUES") {
        Ok(_) => None,
        Err(_) => Some(start_store_proxy().await),
    };
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        bucket,
        store,
        store_proxy,
    });
    let started = tokio::time::Instant::now();
    println!(
        "operator e2e: release {RELEASE} in {RELEASE_NS}, bucket {}",
        ctx.bucket
    );

    let run = random_suffix(6);
    if let Err(e) = preflight(&ctx).await {
        panic!("preflight: {e:#}");
    }
    // a.
    if let Err(e) = install(&ctx).await {
        println!("{}", save_controller_logs(&run));
        let logs = controller_logs(&ctx).await;
        let ns = describe_namespace(&client, RELEASE_NS).await;
        let _ = run_tool("helm", &["uninstall", RELEASE, "-n", RELEASE_NS, "--wait"]).await;
        panic!("a. helm install failed: {e:#}\n{ns}\ncontroller logs:\n{logs}");
    }
    println!(
        "a: ok: installed, controller Available, in {:?}",
        started.elapsed()
    );

    // b–e, concurrently, each in its own namespace.
    let scenarios: [(&str, &str, Scenario); 10] = [
        ("b. a 10-second schedule for 60 s", "op-sched", |c, n| {
            Box::pin(every_ten_seconds(c, n))
        }),
        ("c. released on success", "op-ok", |c, n| {
            Box::pin(released_on_success(c, n))
        }),
        ("d. deleted pod respawned", "op-respawn", |c, n| {
            Box::pin(deleted_pod_respawned(c, n))
        }),
        ("e. failing pod retried", "op-fail", |c, n| {
            Box::pin(failing_pod_retried(c, n))
        }),
        (
            "h. frozen sidecar, workload ignoring SIGTERM",
            "op-frozen",
            |c, n| Box::pin(faults::frozen_sidecar(c, n)),
        ),
        ("i. fenced effects (G4)", "op-fence", |c, n| {
            Box::pin(fence::fenced_effects(c, n))
        }),
        (
            "k. tenants: scoped credentials and refused attacks",
            "op-tenant-a",
            |c, n| Box::pin(tenant::tenants(c, n)),
        ),
        (
            "m. runs prepared ahead of their tick",
            "op-prestart",
            |c, n| Box::pin(prestart::prepared_ahead(c, n)),
        ),
        (
            "n. a run prepared well ahead, without the holder gate",
            "op-prestart-far",
            |c, n| Box::pin(prestart::prepared_without_gate(c, n)),
        ),
        (
            "l. workload API across a respawn, and the kubectl plugin",
            "op-workload",
            |c, n| Box::pin(workload::workload_api_and_cli(c, n)),
        ),
    ];
    let later: [(&str, &str, Scenario); 1] = [(
        "f. deleted after success while no controller runs",
        "op-deleted-ok",
        |c, n| Box::pin(faults::deleted_after_success(c, n)),
    )];
    let mut namespaces = Vec::new();
    let mut failures = Vec::new();
    // `COJOB_E2E_ONLY_CHAOS=1` (e2e/chaos/run) runs the chaos scenarios alone.
    if std::env::var("COJOB_E2E_ONLY_CHAOS").is_err() {
        for batch in [&scenarios[..], &later[..]] {
            run_batch(&ctx, batch, &mut namespaces, &mut failures).await;
        }
    }
    run_chaos(&ctx, &mut namespaces, &mut failures).await;
    // j. deletes the CRD, so it comes last, before g.
    if std::env::var("COJOB_E2E_ONLY_CHAOS").is_err() {
        let last: [(&str, &str, Scenario); 1] = [(
            "j. the CRD deleted while a run is active",
            "op-crd-gone",
            |c, n| Box::pin(crd_gone::crd_deleted_mid_run(c, n)),
        )];
        run_batch(&ctx, &last, &mut namespaces, &mut failures).await;
    }
    if !failures.is_empty() {
        failures.push(format!("controller logs:\n{}", controller_logs(&ctx).await));
    }
    finish(ctx, &run, started, namespaces, failures).await;
}

/// The chaos scenarios (`operator/chaos.rs`), one after the other: their faults hit the whole
/// node (controllers, the S3 server). Prints the table that `docs/robustness.md` keeps.
async fn run_chaos(
    ctx: &Arc<Ctx>,
    namespaces: &mut Vec<TestNamespace>,
    failures: &mut Vec<String>,
) {
    let faults = match chaos::selected() {
        Ok(f) => f,
        Err(e) => {
            failures.push(format!("chaos: {e:#}"));
            return;
        }
    };
    let mut table = vec![
        "| scenario | fault period | ticks due | done once | duplicates | overlaps | misses | runs that needed a later epoch |".to_string(),
        "|---|---|---|---|---|---|---|---|".to_string(),
    ];
    for fault in faults {
        let ns = TestNamespace::create(&ctx.client, &format!("chaos-{}", fault.name())).await;
        cojob_e2e::provide_store_credentials(&ctx.client, &ns.name).await;
        let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(ctx.client.clone())
            .patch(
                &ns.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {OWN_LABEL: "true"}}})),
            )
            .await;
        match chaos::scenario(ctx.clone(), ns.name.clone(), fault).await {
            Ok(row) => table.push(row),
            Err(e) => {
                println!("chaos {}: FAILED: {e:#}", fault.name());
                failures.push(format!(
                    "chaos {} (namespace {}): {e:#}\n{}",
                    fault.name(),
                    ns.name,
                    diagnose(ctx, &ns.name).await
                ));
            }
        }
        namespaces.push(ns);
    }
    println!("chaos results:\n{}", table.join("\n"));
}

/// Runs scenarios concurrently, each in a namespace of its own, and collects their failures.
async fn run_batch(
    ctx: &Arc<Ctx>,
    scenarios: &[(&str, &str, Scenario)],
    namespaces: &mut Vec<TestNamespace>,
    failures: &mut Vec<String>,
) {
    let client = ctx.client.clone();
    let mut handles = Vec::new();
    for (title, prefix, scenario) in scenarios.iter().copied() {
        if !chosen(title) {
            println!("{title}: not run, left out by COJOB_E2E_SCENARIOS");
            continue;
        }
        let ns = TestNamespace::create(&client, prefix).await;
        cojob_e2e::provide_store_credentials(&client, &ns.name).await;
        Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .patch(
                &ns.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {OWN_LABEL: "true"}}})),
            )
            .await
            .expect("label the test namespace");
        let handle = tokio::spawn(scenario(ctx.clone(), ns.name.clone()));
        handles.push((title, ns.name.clone(), handle));
        namespaces.push(ns);
    }
    for (title, ns, handle) in handles {
        let result = match handle.await {
            Ok(r) => r,
            Err(e) => Err(anyhow!("panicked: {}", panic_message(e))),
        };
        if let Err(e) = result {
            println!("{title}: FAILED: {e:#}");
            failures.push(format!(
                "{title} (namespace {ns}): {e:#}\n{}",
                diagnose(ctx, &ns).await
            ));
        }
    }
}

/// Whether the scenario titled `title` runs: `COJOB_E2E_SCENARIOS` lists their letters
/// (`b,c,d`); unset, every scenario runs. Only the kind path sets it, for the scenarios that
/// need this machine's own servers (`e2e/kind/up`); `ci/test` unsets it.
fn chosen(title: &str) -> bool {
    std::env::var("COJOB_E2E_SCENARIOS").map_or(true, |list| {
        list.split(',')
            .map(str::trim)
            .any(|letter| !letter.is_empty() && title.starts_with(&format!("{letter}.")))
    })
}

/// g (the uninstall), the cleanup and the verdict.
async fn finish(
    ctx: Arc<Ctx>,
    run: &str,
    started: tokio::time::Instant,
    namespaces: Vec<TestNamespace>,
    mut failures: Vec<String>,
) {
    let client = ctx.client.clone();
    println!("{}", save_controller_logs(run));
    // g. last.
    if let Err(e) = uninstall_and_check(&ctx).await {
        let mut diag = describe_namespace(&client, RELEASE_NS).await;
        for ns in &namespaces {
            diag.push_str(&describe_namespace(&client, &ns.name).await);
        }
        // The hook's pod logs, if it is still there.
        let pods: Api<Pod> = Api::namespaced(client.clone(), RELEASE_NS);
        if let Ok(list) = pods.list(&ListParams::default()).await {
            for p in list.items {
                let name = p.metadata.name.clone().unwrap_or_default();
                diag.push_str(&pod_log_tail(RELEASE_NS, &name, None, 60));
            }
        }
        failures.push(format!(
            "g. helm uninstall leaves nothing behind: {e:#}\n{diag}"
        ));
        diag.push_str(&save_controller_logs(&format!("{run}-uninstall")));
        let names: Vec<String> = namespaces.iter().map(|n| n.name.clone()).collect();
        force_cleanup(&ctx, &names).await;
    }
    for ns in namespaces {
        ns.cleanup().await;
    }
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .delete(RELEASE_NS, &DeleteParams::background())
        .await;
    if failures.is_empty() {
        // The bucket prefix is this run's alone; keep it only to debug a failure.
        if let Ok(keys) = ctx.store.list("").await {
            for key in keys {
                let _ = ctx.store.delete(&key).await;
            }
        }
    } else {
        println!("the bucket state is kept under {}", ctx.bucket);
    }
    println!("operator e2e took {:?}", started.elapsed());
    assert!(
        failures.is_empty(),
        "{} step(s) failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
