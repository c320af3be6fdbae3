//! Recovery time: from a running attempt's fault to its replacement's workload started, on
//! the real node, against the bound the design gives (lease ttl + sweep interval + clock-skew
//! allowance).
//!
//! For each ttl and each fault, `k` one-shot CoordinatedJobs run `sleep` in one namespace, for
//! longer than the time the measurement waits ([`wait_limit`]): a workload that ended before its
//! lease expired would simply succeed, with nothing to recover (a frozen sidecar does not stop
//! the workload, and the run's success is read from the pod). Once a job's workload runs, the
//! fault strikes:
//!
//! - [`Fault::Deleted`]: the pod is deleted (`kubectl delete pod`, 1 s grace). Its sidecar is
//!   told to stop, releases the lease with the attempt failed, and the controller starts the
//!   next attempt at once: the fast path.
//! - [`Fault::Silent`]: the pod's sidecar is frozen (SIGSTOP), as a node that is cut off or a
//!   process that hangs: nothing is released. The lease expires at most ttl after its last
//!   renewal, the controller takes it over at its next pass once the deadline is the clock-skew
//!   allowance behind, fences the old pod, and creates the epoch-2 pod once the old one
//!   stopped: the bound.
//!
//! The time measured ends at the epoch-2 workload's start (the kubelet's timestamp, whole
//! seconds, so up to a second short), and so also holds the new pod's scheduling and start.

use std::time::Duration;

use anyhow::{Context, ensure};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client, ResourceExt};

/// The controller's settings the bound depends on: the chart's defaults, which
/// `e2e/bench/run` installs.
const SWEEP_INTERVAL_S: f64 = 10.0;
const SKEW_ALLOWANCE_S: f64 = 5.0;

/// How the running attempt is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fault {
    /// Its pod is deleted: the sidecar releases the lease on its way out.
    Deleted,
    /// Its sidecar is frozen: the lease must expire before anyone takes it over.
    Silent,
}

/// The recovery times measured at one ttl for one fault.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Recovery {
    /// What was done to the running attempt.
    pub fault: Fault,
    /// The lease ttl of the jobs, in seconds.
    pub ttl_seconds: i64,
    /// ttl + sweep interval + clock-skew allowance, in seconds.
    pub bound_seconds: f64,
    /// Each job's time from the deletion to the replacement's workload start, in seconds.
    pub seconds: Vec<f64>,
}

impl Recovery {
    /// How many recoveries stayed within the bound.
    pub fn within_bound(&self) -> usize {
        self.seconds
            .iter()
            .filter(|s| **s <= self.bound_seconds)
            .count()
    }
}

/// When the workload of a pod that still runs it started.
fn workload_started(pod: &Pod) -> Option<DateTime<Utc>> {
    let running = crate::figures::container_state(pod, "main", false)?
        .running
        .as_ref()?;
    crate::figures::second(running.started_at.as_ref()?)
}

fn epoch(pod: &Pod) -> u64 {
    pod.labels()
        .get("cojob.dev/epoch")
        .and_then(|e| e.parse().ok())
        .unwrap_or(0)
}

/// The pods of job `name` whose workload runs, by epoch.
async fn running(pods: &Api<Pod>, name: &str) -> anyhow::Result<Vec<(u64, String, DateTime<Utc>)>> {
    let list = pods
        .list(&ListParams::default().labels(&format!("cojob.dev/job={name}")))
        .await?;
    Ok(list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((epoch(p), p.name_any(), workload_started(p)?)))
        .collect())
}

/// How long a recovery at lease ttl `ttl` (seconds) may take before it counts as failed: well
/// past the bound, so a slow recovery is measured rather than lost.
fn wait_limit(ttl: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl).unwrap_or(60) * 3 + 120)
}

/// Strikes the running pod of `name` and waits (at most `limit`) for an epoch-2 workload.
async fn one(pods: Api<Pod>, name: String, fault: Fault, limit: Duration) -> anyhow::Result<f64> {
    let t0 = tokio::time::Instant::now();
    let first = loop {
        if let Some(p) = running(&pods, &name).await?.into_iter().find(|p| p.0 == 1) {
            break p;
        }
        ensure!(t0.elapsed() < limit, "{name}: its first pod never ran");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let deleted = Utc::now();
    match fault {
        Fault::Deleted => {
            pods.delete(&first.1, &DeleteParams::default())
                .await
                .with_context(|| format!("deleting {}", first.1))?;
        }
        Fault::Silent => {
            let pid = cojob_e2e::sidecar_pid(&first.1)
                .with_context(|| format!("no sidecar process for {} on this machine", first.1))?;
            cojob_e2e::signal(pid, "-STOP")?;
        }
    }
    let t1 = tokio::time::Instant::now();
    loop {
        if let Some((_, _, started)) = running(&pods, &name).await?.into_iter().find(|p| p.0 >= 2) {
            return Ok((started - deleted).num_milliseconds().max(0) as f64 / 1000.0);
        }
        ensure!(
            t1.elapsed() < limit,
            "{name}: no replacement ran within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Measures `k` recoveries from `fault` at lease ttl `ttl` (seconds) in a fresh namespace.
pub async fn measure(
    client: &Client,
    fault: Fault,
    ttl: i64,
    k: usize,
) -> anyhow::Result<Recovery> {
    let ns = cojob_e2e::TestNamespace::create(client, &format!("bench-recovery-{ttl}")).await;
    cojob_e2e::provide_store_credentials(client, &ns.name).await;
    let result = measure_in(client, &ns.name, fault, ttl, k).await;
    // The sizes measured next count the controller's bucket requests: this namespace's jobs
    // must be gone first.
    let removed = crate::cluster::remove_namespace(
        client,
        ns,
        &format!("recovery from {fault:?} at ttl {ttl} s"),
    )
    .await;
    // The measurement's own error, if any, comes first.
    let recovery = result?;
    removed?;
    Ok(recovery)
}

async fn measure_in(
    client: &Client,
    ns: &str,
    fault: Fault,
    ttl: i64,
    k: usize,
) -> anyhow::Result<Recovery> {
    let jobs = cojob_e2e::coordinated_jobs(client, ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    println!("bench: recovery from {fault:?} at ttl {ttl} s: {k} one-shot jobs in {ns}");
    let limit = wait_limit(ttl);
    // Outlives both waits of `one` (for the first pod, then for its replacement).
    let sleep = limit.as_secs() * 2 + 60;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..k {
        let name = format!("rec-{i}");
        crate::cluster::create_one_shot(&jobs, &name, u64::try_from(ttl)?, sleep).await?;
        tasks.spawn(one(pods.clone(), name, fault, limit));
    }
    let mut seconds = Vec::new();
    while let Some(done) = tasks.join_next().await {
        seconds.push(done??);
    }
    seconds.sort_by(f64::total_cmp);
    Ok(Recovery {
        fault,
        ttl_seconds: ttl,
        bound_seconds: ttl as f64 + SWEEP_INTERVAL_S + SKEW_ALLOWANCE_S,
        seconds,
    })
}

/// The recoveries as a Markdown table.
pub fn table(all: &[Recovery]) -> String {
    let mut t = String::from(
        "| fault | lease ttl (s) | bound: ttl + sweep interval + skew allowance (s) | recoveries | min / median / max (s) | within the bound |\n\
         |---|---|---|---|---|---|\n",
    );
    for r in all {
        let at = |q: f64| {
            r.seconds
                .get(((r.seconds.len().max(1) - 1) as f64 * q).round() as usize)
                .map_or("-".to_string(), |s| format!("{s:.0}"))
        };
        let fault = match r.fault {
            Fault::Deleted => "pod deleted (sidecar releases)",
            Fault::Silent => "sidecar frozen (lease must expire)",
        };
        t.push_str(&format!(
            "| {fault} | {} | {:.0} | {} | {} / {} / {} | {} of {} |\n",
            r.ttl_seconds,
            r.bound_seconds,
            r.seconds.len(),
            at(0.0),
            at(0.5),
            at(1.0),
            r.within_bound(),
            r.seconds.len()
        ));
    }
    t
}
