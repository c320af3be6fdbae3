//! Helpers for cojob's end-to-end tests, which run against a real cluster named by `KUBECONFIG`
//! (the local one from `e2e/cluster/up`, or kind from `e2e/kind/up`) and a real S3 server named
//! by `COJOB_TEST_S3_URL` and the `AWS_*` variables.

pub mod component;
pub mod proxy;

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use std::time::Duration;

/// The image names the cluster scripts import (overridable for kind).
pub fn image(name: &str) -> String {
    let var = format!("COJOB_E2E_IMAGE_{}", name.to_ascii_uppercase());
    std::env::var(var).unwrap_or_else(|_| match name {
        "cojob" => "localhost/cojob/cojob:dev".into(),
        "busybox" => "localhost/cojob/busybox:e2e".into(),
        other => format!("localhost/cojob/{other}:e2e"),
    })
}

pub use cojob_test_support::{CRD_YAML, install_crd, required_env};

/// A client for the cluster of `KUBECONFIG` (which must be set).
pub async fn client() -> Client {
    required_env("KUBECONFIG");
    Client::try_default()
        .await
        .expect("a client for the cluster in KUBECONFIG")
}

/// The Secret each job namespace provides with its sidecars' store credentials
/// (`sidecarCredentialsSecret` in `charts/cojob/values-local.yaml`).
pub const STORE_CREDENTIALS_SECRET: &str = "cojob-store-credentials";

/// Creates [`STORE_CREDENTIALS_SECRET`] in `namespace` with the test S3 server's credentials
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`), as a namespace owner would with credentials
/// scoped to its folder.
pub async fn provide_store_credentials(client: &Client, namespace: &str) {
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": STORE_CREDENTIALS_SECRET},
        "stringData": {
            "AWS_ACCESS_KEY_ID": required_env("AWS_ACCESS_KEY_ID"),
            "AWS_SECRET_ACCESS_KEY": required_env("AWS_SECRET_ACCESS_KEY"),
        },
    }))
    .expect("secret");
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the store credentials Secret");
}

/// A fresh namespace, deleted on drop of the returned guard's `cleanup`.
pub struct TestNamespace {
    /// The namespace's name.
    pub name: String,
    client: Client,
}

impl TestNamespace {
    /// Creates `prefix-<random>` and waits for its default service account.
    pub async fn create(client: &Client, prefix: &str) -> TestNamespace {
        let suffix: String = cojob::new_holder()
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(8)
            .collect::<String>()
            .to_ascii_lowercase();
        let name = format!("{prefix}-{suffix}");
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"cojob.dev/e2e": "true"}}
        }))
        .expect("namespace");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("create namespace");
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        for _ in 0..60 {
            if sas.get_opt("default").await.expect("get sa").is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        TestNamespace {
            name,
            client: client.clone(),
        }
    }

    /// Deletes the namespace (and everything in it).
    pub async fn cleanup(self) {
        let _ = Api::<Namespace>::all(self.client)
            .delete(&self.name, &DeleteParams::background())
            .await;
    }
}

/// Polls a pod until `done` holds, or fails with its status after `timeout`.
pub async fn wait_for_pod(
    pods: &Api<Pod>,
    name: &str,
    timeout: Duration,
    done: impl Fn(&Pod) -> bool,
) -> Pod {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let pod = pods.get(name).await.expect("get pod");
        if done(&pod) {
            return pod;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "pod {name} did not reach the expected state in {timeout:?}; status: {}",
                serde_json::to_string_pretty(&pod.status).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The AWS environment of this process, to pass on to pods that reach the S3 server.
pub fn aws_env() -> Vec<serde_json::Value> {
    [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ALLOW_HTTP",
    ]
    .iter()
    .map(|k| serde_json::json!({"name": k, "value": required_env(k)}))
    .collect()
}

// ---------------------------------------------------------------------------------------------
// Tools: helm and kubectl as subprocesses.

/// The path of a command-line tool (`helm`, `kubectl`): the variable `HELM` / `KUBECTL` when
/// set, else the first executable of that name on `PATH`. Panics when missing (never skips).
pub fn tool(name: &str) -> std::path::PathBuf {
    let var = name.to_ascii_uppercase();
    if let Some(path) = std::env::var_os(&var).filter(|p| !p.is_empty()) {
        return path.into();
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| is_executable(p))
    });
    found.unwrap_or_else(|| {
        panic!(
            "`{name}` is not on PATH (nor set in ${var}): run `e2e/cluster/up` and \
             `source /var/lib/cojob-e2e/env`, which put kubectl and helm on PATH"
        )
    })
}

fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Runs `tool` (see [`tool`]) with `args` from the repository root and returns its stdout, or
/// an error with the command line, exit status, stdout and stderr.
pub async fn run_tool(name: &str, args: &[&str]) -> anyhow::Result<String> {
    let path = tool(name);
    let line = format!("{name} {}", args.join(" "));
    let out = tokio::process::Command::new(&path)
        .args(args)
        .current_dir(repo_root())
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| anyhow::anyhow!("cannot run `{line}` ({}): {e}", path.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        anyhow::bail!(
            "`{line}` failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            stdout.trim_end(),
            String::from_utf8_lossy(&out.stderr).trim_end()
        )
    }
}

/// The repository's root directory (the parent of the `e2e` crate).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the e2e crate lives in the repository")
        .to_path_buf()
}

/// `len` random lowercase alphanumeric characters, for unique names.
pub fn random_suffix(len: usize) -> String {
    let mut out = String::new();
    while out.len() < len {
        out.extend(
            cojob::new_holder()
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .map(|c| c.to_ascii_lowercase())
                .take(len - out.len()),
        );
    }
    out
}

// ---------------------------------------------------------------------------------------------
// CoordinatedJobs.

/// The CoordinatedJob resource (`cojob.dev/v1alpha1`).
pub fn coordinated_job_resource() -> kube::api::ApiResource {
    let gvk = kube::api::GroupVersionKind::gvk("cojob.dev", "v1alpha1", "CoordinatedJob");
    kube::api::ApiResource::from_gvk(&gvk)
}

/// The CoordinatedJobs of `namespace`.
pub fn coordinated_jobs(client: &Client, namespace: &str) -> Api<kube::api::DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &coordinated_job_resource())
}

/// A CoordinatedJob object named `name` with `spec`.
pub fn coordinated_job(name: &str, spec: serde_json::Value) -> kube::api::DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "cojob.dev/v1alpha1",
        "kind": "CoordinatedJob",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("a CoordinatedJob object")
}

// ---------------------------------------------------------------------------------------------
// Diagnostics.

/// The last `lines` lines of every log file of the pod `namespace/pod` under `/var/log/pods`
/// (`kubectl logs` does not work on the local cluster: its node has no InternalIP), container
/// by container; restrict to one container with `container`. Where the files are not on this
/// host (kind), `kubectl logs`.
pub fn pod_log_tail(namespace: &str, pod: &str, container: Option<&str>, lines: usize) -> String {
    let root = std::env::var("COJOB_E2E_POD_LOGS").unwrap_or_else(|_| "/var/log/pods".into());
    let prefix = format!("{namespace}_{pod}_");
    let mut out = String::new();
    let Ok(dirs) = std::fs::read_dir(&root) else {
        return format!("(no pod logs: cannot read {root})\n");
    };
    let mut pod_dirs: Vec<_> = dirs
        .flatten()
        .filter(|d| d.file_name().to_string_lossy().starts_with(&prefix))
        .map(|d| d.path())
        .collect();
    pod_dirs.sort();
    for dir in pod_dirs {
        let Ok(containers) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut containers: Vec<_> = containers.flatten().map(|c| c.path()).collect();
        containers.sort();
        for cdir in containers {
            let cname = cdir
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            if container.is_some_and(|c| c != cname) {
                continue;
            }
            let Ok(files) = std::fs::read_dir(&cdir) else {
                continue;
            };
            let mut files: Vec<_> = files.flatten().map(|f| f.path()).collect();
            files.sort();
            for file in files {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                let all: Vec<&str> = text.lines().collect();
                let tail = &all[all.len().saturating_sub(lines)..];
                out.push_str(&format!(
                    "--- {} (last {} lines)\n",
                    file.display(),
                    tail.len()
                ));
                for line in tail {
                    // CRI log lines: `<time> <stream> <tag> <message>`.
                    let msg = line.splitn(4, ' ').nth(3).unwrap_or(line);
                    out.push_str(msg);
                    out.push('\n');
                }
            }
        }
    }
    if out.is_empty() {
        // Not on this host (kind keeps them inside its node container): ask the API server.
        out = kubectl_logs(namespace, pod, container, lines).unwrap_or_else(|why| {
            format!("(no log files for {namespace}/{pod} under {root}, and {why})\n")
        });
    }
    out
}

/// `kubectl logs --tail LINES` of the pod (every container, or `container`), for clusters
/// whose pod logs are not on this host; an error says why there are none.
fn kubectl_logs(
    namespace: &str,
    pod: &str,
    container: Option<&str>,
    lines: usize,
) -> Result<String, String> {
    let tail = format!("--tail={lines}");
    let mut args = vec!["logs", "-n", namespace, pod, tail.as_str(), "--prefix"];
    match container {
        Some(c) => args.extend(["-c", c]),
        None => args.push("--all-containers"),
    }
    let out = std::process::Command::new(tool("kubectl"))
        .args(&args)
        .output()
        .map_err(|e| format!("kubectl logs could not run: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "kubectl logs failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(format!(
        "--- kubectl {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout)
    ))
}

/// A readable summary of a namespace: its pods (phase and container states) and its events,
/// oldest first.
pub async fn describe_namespace(client: &Client, namespace: &str) -> String {
    use k8s_openapi::api::events::v1::Event;
    let mut out = format!("=== namespace {namespace}\n");
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    match pods.list(&Default::default()).await {
        Ok(list) => {
            out.push_str(&format!("pods ({}):\n", list.items.len()));
            for p in &list.items {
                out.push_str(&format!("  {}\n", pod_summary(p)));
            }
        }
        Err(e) => out.push_str(&format!("pods: cannot list: {e}\n")),
    }
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    match events.list(&Default::default()).await {
        Ok(list) => {
            let mut items = list.items;
            items.sort_by_key(event_time);
            out.push_str(&format!("events ({}):\n", items.len()));
            for e in &items {
                out.push_str(&format!("  {}\n", event_summary(e)));
            }
        }
        Err(e) => out.push_str(&format!("events: cannot list: {e}\n")),
    }
    out
}

/// One line about a pod: name, labels of cojob, phase, and each container's state.
pub fn pod_summary(p: &Pod) -> String {
    let name = p.metadata.name.clone().unwrap_or_default();
    let labels = p.metadata.labels.clone().unwrap_or_default();
    let epoch = labels.get("cojob.dev/epoch").cloned().unwrap_or_default();
    let status = p.status.clone().unwrap_or_default();
    let phase = status.phase.unwrap_or_else(|| "?".into());
    let deleting = if p.metadata.deletion_timestamp.is_some() {
        " (deleting)"
    } else {
        ""
    };
    let mut containers = Vec::new();
    for s in status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
    {
        let state = match &s.state {
            Some(st) if st.running.is_some() => "running".to_string(),
            Some(st) if st.terminated.is_some() => {
                let t = st.terminated.as_ref().unwrap();
                format!(
                    "terminated(exit {}, {})",
                    t.exit_code,
                    t.reason.clone().unwrap_or_default()
                )
            }
            Some(st) if st.waiting.is_some() => {
                let w = st.waiting.as_ref().unwrap();
                format!(
                    "waiting({} {})",
                    w.reason.clone().unwrap_or_default(),
                    w.message.clone().unwrap_or_default()
                )
            }
            _ => "unknown".to_string(),
        };
        containers.push(format!("{}={state}", s.name));
    }
    format!(
        "{name} epoch={epoch} phase={phase}{deleting} [{}]",
        containers.join(", ")
    )
}

fn event_time(e: &k8s_openapi::api::events::v1::Event) -> i64 {
    e.event_time
        .as_ref()
        .map(|t| t.0.as_second())
        .or_else(|| {
            e.deprecated_last_timestamp
                .as_ref()
                .map(|t| t.0.as_second())
        })
        .or_else(|| {
            e.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second())
        })
        .unwrap_or_default()
}

/// One line about an event: time, type, reason, the object it regards, and its note.
pub fn event_summary(e: &k8s_openapi::api::events::v1::Event) -> String {
    let regarding = e
        .regarding
        .as_ref()
        .map(|r| {
            format!(
                "{}/{}",
                r.kind.clone().unwrap_or_default(),
                r.name.clone().unwrap_or_default()
            )
        })
        .unwrap_or_default();
    let count = e
        .series
        .as_ref()
        .map(|s| s.count)
        .or(e.deprecated_count)
        .unwrap_or(1);
    format!(
        "{} {} {} {regarding} x{count}: {}",
        k8s_openapi::jiff::Timestamp::from_second(event_time(e)).unwrap_or_default(),
        e.type_.clone().unwrap_or_default(),
        e.reason.clone().unwrap_or_default(),
        e.note.clone().unwrap_or_default()
    )
}

// ---------------------------------------------------------------------------------------------
// The bucket: a CoordinatedJob's decisions and runs, read back (never the lease holder).

/// A tick's decision, from its claim under `ticks/`.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// The tick runs as this run id.
    Run(String),
    /// The tick was skipped (suspended, Forbid while active, …), with the reason.
    Skipped(String),
    /// The tick was missed (late past the deadline, superseded), with the reason.
    Missed(String),
    /// Anything else: the raw claim value.
    Other(serde_json::Value),
    /// A lease with no tick claim pointing at it.
    NoClaim,
}

impl Decision {
    fn parse(value: &serde_json::Value) -> Decision {
        let s = |k: &str| {
            value.get(k).map(|v| {
                v.as_str()
                    .map(String::from)
                    .unwrap_or_else(|| v.to_string())
            })
        };
        if let Some(run) = value.get("run_id").and_then(|v| v.as_str()) {
            Decision::Run(run.to_string())
        } else if let Some(reason) = s("skipped") {
            Decision::Skipped(reason)
        } else if let Some(reason) = s("missed") {
            Decision::Missed(reason)
        } else {
            Decision::Other(value.clone())
        }
    }

    /// The run id, for a tick that runs.
    pub fn run_id(&self) -> Option<&str> {
        match self {
            Decision::Run(id) => Some(id),
            _ => None,
        }
    }
}

/// A run's lease document without its holder: whether it is released, its epoch, deadline and
/// state.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseView {
    /// The fencing epoch.
    pub epoch: u64,
    /// True once released (`holder` is null).
    pub released: bool,
    /// The deadline, as stored.
    pub deadline_at: String,
    /// The run's state (`status`, `attempt`, `pod`, `node`, `exit_code`, `started_at`, …).
    pub state: serde_json::Value,
}

impl LeaseView {
    /// Parses a stored lease, dropping the holder (a credential) at once.
    pub fn parse(bytes: &[u8]) -> anyhow::Result<LeaseView> {
        let doc: serde_json::Value = serde_json::from_slice(bytes)?;
        let epoch = doc["epoch"]
            .as_u64()
            .ok_or_else(|| anyhow::anyhow!("a lease without an epoch"))?;
        Ok(LeaseView {
            epoch,
            released: doc["holder"].is_null(),
            deadline_at: doc["deadline_at"].as_str().unwrap_or_default().to_string(),
            state: doc["state"].clone(),
        })
    }

    /// `state.status` (pending, running, retrying, succeeded, failed, cancelled).
    pub fn status(&self) -> Option<&str> {
        self.state["status"].as_str()
    }

    /// `state.attempt`.
    pub fn attempt(&self) -> Option<u64> {
        self.state["attempt"].as_u64()
    }

    /// `state.exit_code`.
    pub fn exit_code(&self) -> Option<i64> {
        self.state["exit_code"].as_i64()
    }

    /// A string field of the state (`pod`, `node`, `started_at`, `finished_at`).
    pub fn field(&self, name: &str) -> Option<&str> {
        self.state[name].as_str().filter(|s| !s.is_empty())
    }

    /// True for a final status.
    pub fn is_terminal(&self) -> bool {
        matches!(self.status(), Some("succeeded" | "failed" | "cancelled"))
    }
}

/// One row of a CoordinatedJob's history in the bucket: a tick's decision and its run's lease.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    /// The object's UID (a path segment of the layout).
    pub uid: String,
    /// The tick: a fire time like `2026-08-09T02:00:00.000000Z`, `once`, or `-` for a lease
    /// without a claim.
    pub tick: String,
    /// What was decided.
    pub decision: Decision,
    /// The run's lease, for a tick that runs (None if not written yet).
    pub lease: Option<LeaseView>,
}

impl RunRow {
    /// The tick in unix seconds (None for `once` and `-`).
    pub fn tick_seconds(&self) -> Option<i64> {
        cojob::json::parse_time(&self.tick)
            .ok()
            .map(|t| t.timestamp())
    }
}

/// Reads every tick and run of the CoordinatedJob `namespace/name` (every UID, or only `uid`)
/// under the store: `v1/jobs/<ns>/<name>/<uid>/ticks/<tick>` and `…/runs/<runId>/lease`.
pub async fn read_runs(
    store: &cojob::Store,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
) -> anyhow::Result<Vec<RunRow>> {
    let base = match uid {
        Some(uid) => format!("v1/jobs/{namespace}/{name}/{uid}"),
        None => format!("v1/jobs/{namespace}/{name}"),
    };
    let job_base = format!("v1/jobs/{namespace}/{name}/");
    let keys = store.list(&base).await?;
    let mut rows = Vec::new();
    let mut claimed = std::collections::BTreeSet::new();
    let mut leases = Vec::new();
    for key in &keys {
        let Some(rest) = key.strip_prefix(&job_base) else {
            continue;
        };
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            [uid, "ticks", tick] => {
                let Some((body, _)) = store.get(key).await? else {
                    continue;
                };
                let value: serde_json::Value = serde_json::from_slice(&body)
                    .map_err(|e| anyhow::anyhow!("claim {key} is not JSON: {e}"))?;
                let decision = Decision::parse(&value);
                let lease = match decision.run_id() {
                    Some(run) => {
                        claimed.insert((uid.to_string(), run.to_string()));
                        let lease_key = format!("{job_base}{uid}/runs/{run}/lease");
                        match store.get(&lease_key).await? {
                            Some((body, _)) => Some(
                                LeaseView::parse(&body)
                                    .map_err(|e| anyhow::anyhow!("lease {lease_key}: {e}"))?,
                            ),
                            None => None,
                        }
                    }
                    None => None,
                };
                rows.push(RunRow {
                    uid: uid.to_string(),
                    tick: tick.to_string(),
                    decision,
                    lease,
                });
            }
            [uid, "runs", run, "lease"] => leases.push((uid.to_string(), run.to_string(), key)),
            _ => {}
        }
    }
    for (uid, run, key) in leases {
        if claimed.contains(&(uid.clone(), run.clone())) {
            continue;
        }
        let lease = match store.get(key).await? {
            Some((body, _)) => Some(LeaseView::parse(&body)?),
            None => None,
        };
        rows.push(RunRow {
            uid,
            tick: "-".into(),
            decision: Decision::NoClaim,
            lease: lease.map(|l| LeaseView {
                state: {
                    let mut s = l.state.clone();
                    if s.is_object() {
                        s["run_id"] = serde_json::Value::String(run.clone());
                    }
                    s
                },
                ..l
            }),
        });
    }
    Ok(rows)
}

/// The rows as a text table: uid, tick, decision, run id, epoch, attempt, status, exit code,
/// pod, node. The holder is never shown (it is not even read into a [`RunRow`]).
pub fn runs_table(rows: &[RunRow]) -> String {
    let mut table = vec![
        [
            "UID", "TICK", "DECISION", "RUN", "EPOCH", "ATTEMPT", "STATUS", "EXIT", "HELD", "POD",
            "NODE",
        ]
        .map(String::from),
    ];
    for r in rows {
        let (decision, run) = match &r.decision {
            Decision::Run(id) => ("run".to_string(), id.clone()),
            Decision::Skipped(why) => (format!("skipped: {why}"), "-".into()),
            Decision::Missed(why) => (format!("missed: {why}"), "-".into()),
            Decision::Other(v) => (v.to_string(), "-".into()),
            Decision::NoClaim => (
                "(no claim)".into(),
                r.lease
                    .as_ref()
                    .and_then(|l| l.field("run_id"))
                    .unwrap_or("-")
                    .to_string(),
            ),
        };
        let dash = || "-".to_string();
        let l = r.lease.as_ref();
        let short_uid: String = r.uid.chars().take(8).collect();
        table.push([
            short_uid,
            r.tick.clone(),
            decision,
            run,
            l.map(|l| l.epoch.to_string()).unwrap_or_else(dash),
            l.and_then(|l| l.attempt())
                .map(|a| a.to_string())
                .unwrap_or_else(dash),
            l.and_then(|l| l.status())
                .map(String::from)
                .unwrap_or_else(dash),
            l.and_then(|l| l.exit_code())
                .map(|c| c.to_string())
                .unwrap_or_else(dash),
            l.map(|l| if l.released { "no" } else { "yes" }.to_string())
                .unwrap_or_else(dash),
            l.and_then(|l| l.field("pod"))
                .map(String::from)
                .unwrap_or_else(dash),
            l.and_then(|l| l.field("node"))
                .map(String::from)
                .unwrap_or_else(dash),
        ]);
    }
    let widths: Vec<usize> = (0..table[0].len())
        .map(|i| {
            table
                .iter()
                .map(|row| row[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in &table {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The PID of a run pod's sidecar process on this node (found through `/proc`).
pub fn sidecar_pid(pod: &str) -> Option<i32> {
    let want = format!("POD_NAME={pod}");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if !cmdline.starts_with(b"/cojob\0sidecar") {
            continue;
        }
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        if environ.split(|b| *b == 0).any(|v| v == want.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

/// Sends `sig` (as `kill` takes it: `-STOP`, `-CONT`, `-KILL`) to a process on this machine.
pub fn signal(pid: i32, sig: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill {sig} {pid} failed");
    Ok(())
}
