//! The controller's memory with a full run history, measured on the cluster.
//!
//! `k` CoordinatedJobs on the simulated nodes, whose schedule fires once a year and which keep
//! `runs` succeeded runs each (`successfulRunsHistoryLimit`), are given `runs` manual runs
//! each (`trigger.cojob.dev/<key>`, one round after the other), so that the controller ends
//! up caching `k × runs` settled pods: 10 000 × 4 is the chart's default history (3 succeeded
//! and 1 failed run kept) at N = 10 000. Then:
//!
//! - the controller's resident memory (`VmRSS`) is read with that history cached;
//! - its pod is deleted, and the new process's resident memory is sampled every 5 s for
//!   2 minutes while it lists the jobs and the pods again and passes every job once, with its
//!   peak (`VmHWM`) at the end.
//!
//! kube-controller-manager removes ended pods above `--terminated-pod-gc-threshold` (12 500 by
//! default), so a larger history needs a cluster started with a higher threshold
//! (`COJOB_E2E_TERMINATED_POD_GC_THRESHOLD`, read by `e2e/cluster/up`). The pods that remain
//! are counted and reported, so a lower threshold shows in the figures.

use std::time::Duration;

use anyhow::ensure;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::{Api, Client};
use serde_json::json;

use cojob_e2e::coordinated_jobs;

use crate::cluster::{count, for_each_parallel, list_all, pod_spec};
use crate::machine::{is_cojob_controller, process_identity, process_memory};

/// Where `e2e/bench/run` installs the controller (release `cojob-bench`).
const CONTROLLER_NAMESPACE: &str = "cojob-bench-system";
/// The chart's label on the controller's pods.
const CONTROLLER_SELECTOR: &str = "app.kubernetes.io/instance=cojob-bench";
/// How long the restarted controller is sampled.
const AFTER_RESTART: Duration = Duration::from_secs(120);
/// The chart's memory limit for the controller.
pub const CHART_LIMIT_BYTES: u64 = 256 * 1024 * 1024;

/// The figures of one history.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct History {
    /// CoordinatedJobs.
    pub jobs: usize,
    /// Runs given to each, and kept by each.
    pub runs_per_job: usize,
    /// Runs recorded succeeded, over all jobs (`status.counters.succeeded`).
    pub succeeded: u64,
    /// The jobs' pods on the cluster once every run ended: the history the controller caches.
    pub pods: u64,
    /// Seconds the runs took, from the first trigger to the last success.
    pub runs_seconds: f64,
    /// The controller's resident bytes with that history cached.
    pub rss: u64,
    /// The restarted controller's resident bytes 2 minutes after it started.
    pub rss_after_restart: u64,
    /// The restarted controller's peak resident bytes over those 2 minutes.
    pub peak_after_restart: u64,
}

impl History {
    /// True when every run succeeded, every pod of the history remained, and the controller
    /// stayed under the chart's limit before and after its restart.
    pub fn as_expected(&self) -> bool {
        let all = (self.jobs * self.runs_per_job) as u64;
        self.succeeded == all
            && self.pods == all
            && self.rss > 0
            && self.rss_after_restart > 0
            && self.peak_after_restart.max(self.rss) < CHART_LIMIT_BYTES
    }
}

/// Measures `k` jobs with `runs` runs each in a fresh namespace.
pub async fn measure(client: &Client, k: usize, runs: usize) -> anyhow::Result<History> {
    let ns = cojob_e2e::TestNamespace::create(client, "bench-history").await;
    cojob_e2e::provide_store_credentials(client, &ns.name).await;
    let result = measure_in(client, &ns.name, k, runs).await;
    let removed = crate::cluster::remove_namespace(client, ns, "history").await;
    let history = result?;
    removed?;
    Ok(history)
}

async fn measure_in(client: &Client, ns: &str, k: usize, runs: usize) -> anyhow::Result<History> {
    let jobs = coordinated_jobs(client, ns);
    println!("bench: history: {k} jobs with {runs} runs each in {ns}");
    let spec = pod_spec(crate::Nodes::Kwok, &["true"]);
    {
        let jobs = jobs.clone();
        for_each_parallel(k, move |i| {
            let (jobs, spec) = (jobs.clone(), spec.clone());
            async move {
                let job = cojob_e2e::coordinated_job(
                    &format!("history-{i}"),
                    json!({
                        "schedule": "0 0 1 1 *",
                        "successfulRunsHistoryLimit": runs,
                        "template": {"spec": spec}
                    }),
                );
                jobs.create(&PostParams::default(), &job).await?;
                Ok(())
            }
        })
        .await?;
    }
    let t0 = tokio::time::Instant::now();
    // A round is k runs on a cluster that may start only tens of pods a second.
    let round_limit = Duration::from_secs(600) + Duration::from_millis(500) * k as u32;
    // Each poll lists every job: every 5 s, or 5 ms per job beyond a thousand (50 s at 10 000).
    let poll = Duration::from_secs(5).max(Duration::from_millis(5) * k as u32);
    let mut succeeded = 0;
    for round in 0..runs {
        let asked = {
            let jobs = jobs.clone();
            for_each_parallel(k, move |i| {
                let jobs = jobs.clone();
                async move {
                    let ask = json!({"metadata": {"annotations": {
                        format!("trigger.cojob.dev/history-{round}"): "cojob-bench history"
                    }}});
                    jobs.patch(
                        &format!("history-{i}"),
                        &PatchParams::default(),
                        &Patch::Merge(&ask),
                    )
                    .await?;
                    Ok(())
                }
            })
        };
        asked.await?;
        let want = (k * (round + 1)) as u64;
        let started = tokio::time::Instant::now();
        loop {
            succeeded = succeeded_runs(&jobs).await?;
            if succeeded >= want {
                break;
            }
            ensure!(
                started.elapsed() < round_limit,
                "history: round {round}: {succeeded} of {want} runs succeeded within {round_limit:?}"
            );
            tokio::time::sleep(poll).await;
        }
        println!(
            "bench: history: round {round}: {succeeded} runs succeeded, {:?} since the first trigger",
            t0.elapsed()
        );
    }
    let runs_seconds = t0.elapsed().as_secs_f64();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    // The passes that record the last runs' ends and release their pods' finalizers settle.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let pods = count(&pods).await?;
    let (rss, _) = process_memory(is_cojob_controller);
    println!(
        "bench: history: {pods} pods, controller {:.1} MiB resident",
        mib(rss)
    );
    let (rss_after_restart, peak_after_restart) = restart_and_sample(client).await?;
    let history = History {
        jobs: k,
        runs_per_job: runs,
        succeeded,
        pods,
        runs_seconds,
        rss,
        rss_after_restart,
        peak_after_restart,
    };
    println!("bench: {history:?}");
    Ok(history)
}

/// Runs recorded succeeded over every job of `jobs`.
async fn succeeded_runs(jobs: &Api<DynamicObject>) -> anyhow::Result<u64> {
    Ok(list_all(jobs)
        .await?
        .iter()
        .filter_map(|j| j.data["status"]["counters"]["succeeded"].as_u64())
        .sum())
}

/// Deletes the controller's pod and samples the new process for [`AFTER_RESTART`]: its
/// resident bytes at the end and its peak.
async fn restart_and_sample(client: &Client) -> anyhow::Result<(u64, u64)> {
    let before = process_identity(is_cojob_controller);
    let controllers: Api<Pod> = Api::namespaced(client.clone(), CONTROLLER_NAMESPACE);
    controllers
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(CONTROLLER_SELECTOR),
        )
        .await?;
    let t0 = tokio::time::Instant::now();
    loop {
        let now = process_identity(is_cojob_controller);
        if !now.is_empty() && now.is_disjoint(&before) {
            break;
        }
        ensure!(
            t0.elapsed() < Duration::from_secs(300),
            "history: no new controller process within 300 s of deleting its pod"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "bench: history: controller restarted after {:?}",
        t0.elapsed()
    );
    let started = tokio::time::Instant::now();
    let (mut rss, mut peak) = (0, 0);
    while started.elapsed() < AFTER_RESTART {
        tokio::time::sleep(Duration::from_secs(5)).await;
        (rss, peak) = process_memory(is_cojob_controller);
    }
    Ok((rss, peak))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The histories as a Markdown table.
pub fn table(all: &[History]) -> String {
    let mut t = String::from(
        "| jobs | runs kept per job | runs succeeded | history pods on the cluster | runs took (s) | controller RSS with them (MiB) | after a restart: RSS at 2 min / peak (MiB) | under the chart's 256 MiB |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for h in all {
        t.push_str(&format!(
            "| {} | {} | {} | {} | {:.0} | {:.1} | {:.1} / {:.1} | {} |\n",
            h.jobs,
            h.runs_per_job,
            h.succeeded,
            h.pods,
            h.runs_seconds,
            mib(h.rss),
            mib(h.rss_after_restart),
            mib(h.peak_after_restart),
            if h.peak_after_restart.max(h.rss) < CHART_LIMIT_BYTES {
                "yes"
            } else {
                "no"
            }
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(succeeded: u64, pods: u64, peak_mib: u64) -> History {
        History {
            jobs: 10,
            runs_per_job: 4,
            succeeded,
            pods,
            runs_seconds: 30.0,
            rss: 60 << 20,
            rss_after_restart: 62 << 20,
            peak_after_restart: peak_mib << 20,
        }
    }

    #[test]
    fn a_history_is_as_expected_only_whole_and_under_the_limit() {
        assert!(history(40, 40, 100).as_expected());
        assert!(!history(39, 40, 100).as_expected(), "a run did not succeed");
        assert!(
            !history(40, 38, 100).as_expected(),
            "pods removed by the cluster's pod GC"
        );
        assert!(!history(40, 40, 256).as_expected(), "at the chart's limit");
        let table = table(&[history(40, 40, 100), history(40, 40, 300)]);
        assert!(table.contains("| 10 | 4 | 40 | 40 | 30 | 60.0 | 62.0 / 100.0 | yes |"));
        assert!(table.contains("| 62.0 / 300.0 | no |"));
    }
}
