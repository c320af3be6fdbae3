//! One size N: create N CronJobs and N CoordinatedJobs on the same schedule, count the costs
//! over the window's ticks, and read back every pod of them that a watch saw (module `ledger`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Timelike, Utc};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::core::DynamicObject;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use cojob_e2e::coordinated_jobs;

use crate::cluster::{for_each_parallel, list_all, list_all_metadata, pod_spec, remove_namespace};
use crate::figures::{Figures, figures, nan, nan_if_null};
use crate::ledger::{PodLedger, cronjob_tick};
use crate::machine::{
    is_cojob_controller, is_kube_controller_manager, is_shared_component, machine_cpu,
    process_cost, process_identity,
};
use crate::report::tables;
use crate::scrape::{ApiCounters, ControllerMetrics, Histo, api_requests, controller_metrics};
use crate::sidecars::{SidecarCounts, Sidecars};
use crate::ticks::{first_measured_tick, schedule};
use crate::{Nodes, Options};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct SizeResult {
    /// When it was measured (UTC, to the minute).
    #[serde(default)]
    pub measured: String,
    pub n: usize,
    pub ticks: u32,
    pub every_minutes: u32,
    pub nodes: Nodes,
    /// The CoordinatedJobs' `prestartSeconds` (0 in reports from before the option).
    #[serde(default)]
    pub prestart_seconds: u64,
    /// The CoordinatedJobs' `startTimeoutSeconds` if not the CRD's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timeout_seconds: Option<u64>,
    pub cronjob: Figures,
    pub cojob: Figures,
    /// The cojob controller's process was not the same at the end of the window (it restarted:
    /// killed for its memory, for example); its own counters started again, so its CPU,
    /// bucket requests and tick pickup over the window are not known (NaN).
    #[serde(default)]
    pub controller_restarted: bool,
    #[serde(deserialize_with = "nan_if_null")]
    pub controller_cpu_seconds_per_tick: f64,
    pub controller_rss_bytes: u64,
    pub kube_controller_manager_cpu_seconds_per_tick: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub bucket_requests_per_run: f64,
    pub controller_api_requests_per_tick: f64,
    /// The controller's API requests per run in the window, by verb and resource (its own
    /// `cojob_kube_requests_total`; empty in reports from before it, or if it restarted).
    #[serde(default)]
    pub controller_api_requests_per_run: BTreeMap<String, f64>,
    /// The controller's takeovers in the window, by the lost attempt's status (its own
    /// `cojob_takeovers_total`; empty in reports from before the label, or if it restarted).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub controller_takeovers: BTreeMap<String, f64>,
    pub kube_controller_manager_api_requests_per_tick: f64,
    /// CPU seconds per tick of what both kinds share: API server, etcd, scheduler, kwok.
    pub shared_cpu_seconds_per_tick: f64,
    /// The machine's CPU busy over the window, 0 to 1 (all cores).
    #[serde(deserialize_with = "nan_if_null")]
    pub machine_busy: f64,
    /// Seconds from a tick to the start of the controller's pass that decided it (the wait in
    /// its work queue, plus the requeue's own timer), from `cojob_tick_pickup_seconds`.
    pub tick_pickup: Histo,
    /// How long the controller's passes took (`cojob_reconcile_duration_seconds`); empty in
    /// reports from before it was measured.
    #[serde(default)]
    pub pass_duration: Histo,
    /// What the simulated sidecars of the run pods on kwok's nodes did (`None`: the size ran
    /// without them, on the real node or with `--no-kwok-sidecars`, or before they existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated_sidecars: Option<SidecarCounts>,
    /// The mean wait of the controller's API requests in the API server's
    /// priority-and-fairness queues, in milliseconds (NaN: not measured).
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub controller_api_wait_ms: f64,
    /// The same for the kube-controller-manager's.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub kube_controller_manager_api_wait_ms: f64,
}

/// The counters the costs are differences of, read at the start and at the end of a window.
struct Costs {
    /// The controller's process (pid, start time): another at the end means it restarted.
    controller_process: BTreeSet<(String, String)>,
    controller_cpu: f64,
    controller_rss: u64,
    kcm_cpu: f64,
    shared_cpu: f64,
    machine_busy: f64,
    machine_total: f64,
    bucket_requests: f64,
    pickup: Histo,
    passes: Histo,
    kube_requests: BTreeMap<String, f64>,
    takeovers: BTreeMap<String, f64>,
    controller_api: ApiCounters,
    kcm_api: ApiCounters,
}

impl Costs {
    async fn now(metrics: &str) -> anyhow::Result<Costs> {
        let (controller_cpu, controller_rss) = process_cost(is_cojob_controller);
        let (kcm_cpu, _) = process_cost(is_kube_controller_manager);
        let (shared_cpu, _) = process_cost(is_shared_component);
        let (machine_busy, machine_total) = machine_cpu();
        let ControllerMetrics {
            bucket_requests,
            pickup,
            passes,
            kube_requests,
            takeovers,
        } = controller_metrics(metrics).await?;
        let (controller_api, kcm_api) = api_requests().await?;
        Ok(Costs {
            controller_process: process_identity(is_cojob_controller),
            controller_cpu,
            controller_rss,
            kcm_cpu,
            shared_cpu,
            machine_busy,
            machine_total,
            bucket_requests,
            pickup,
            passes,
            kube_requests,
            takeovers,
            controller_api,
            kcm_api,
        })
    }
}

/// What each series of a labelled counter (`after`) counted since `before`.
fn counted_since(
    after: &BTreeMap<String, f64>,
    before: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).unwrap_or(&0.0)))
        .collect()
}

/// What the CoordinatedJobs' statuses record of the window's ticks.
struct Runs {
    /// Ticks whose run succeeded.
    served: BTreeSet<(String, DateTime<Utc>)>,
    /// Ticks with a run, succeeded or not.
    decided: BTreeSet<(String, DateTime<Utc>)>,
    /// Runs of more than one lease epoch.
    respawned: usize,
    /// Of those, the runs on an attempt after the first.
    new_attempts: usize,
}

/// Reads the runs of `ticks` from every CoordinatedJob's status (its active and recent runs).
async fn runs_of(cojobs: &Api<DynamicObject>, ticks: &[DateTime<Utc>]) -> anyhow::Result<Runs> {
    let mut runs = Runs {
        served: BTreeSet::new(),
        decided: BTreeSet::new(),
        respawned: 0,
        new_attempts: 0,
    };
    for job in list_all(cojobs).await? {
        let status = job.data.get("status").cloned().unwrap_or_default();
        for list in ["active", "recent"] {
            for run in status
                .get(list)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let tick = run
                    .get("tick")
                    .and_then(Value::as_str)
                    .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                    .map(|t| t.with_timezone(&Utc));
                let Some(tick) = tick.filter(|t| ticks.contains(t)) else {
                    continue;
                };
                if run.get("epoch").and_then(Value::as_i64).unwrap_or(0) > 1 {
                    runs.respawned += 1;
                    if run.get("attempt").and_then(Value::as_i64).unwrap_or(1) > 1 {
                        runs.new_attempts += 1;
                    }
                }
                if run.get("phase").and_then(Value::as_str) == Some("succeeded") {
                    runs.served.insert((job.name_any(), tick));
                }
                runs.decided.insert((job.name_any(), tick));
            }
        }
    }
    Ok(runs)
}

/// One size to measure: N of each kind, where, and how often they tick.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    pub n: usize,
    pub nodes: Nodes,
    pub every: u32,
    pub ticks: u32,
}

pub async fn run_size(client: &Client, o: &Options, size: Size) -> anyhow::Result<SizeResult> {
    let n = size.n;
    let ns = cojob_e2e::TestNamespace::create(client, &format!("bench-n{n}")).await;
    cojob_e2e::provide_store_credentials(client, &ns.name).await;
    let result = measure(client, o, size, &ns.name).await;
    if let Ok(r) = &result {
        // Each size as soon as it is measured: a long run's figures must not wait for its end.
        println!("\n{}", tables(std::slice::from_ref(r)));
    }
    let removed = remove_namespace(client, ns, &format!("N = {n}")).await;
    // The measurement's own error, if any, comes first.
    let figures = result?;
    removed?;
    Ok(figures)
}

async fn measure(client: &Client, o: &Options, size: Size, ns: &str) -> anyhow::Result<SizeResult> {
    let Size {
        n,
        nodes,
        every,
        ticks: ticks_n,
    } = size;
    let cronjobs: Api<CronJob> = Api::namespaced(client.clone(), ns);
    let cojobs = coordinated_jobs(client, ns);
    // Create both sets in the first half of a minute, so that neither kind sees the next tick
    // as already past.
    let mut now = Utc::now();
    if now.second() > 30 {
        tokio::time::sleep(Duration::from_secs(u64::from(62 - now.second()))).await;
        now = Utc::now();
    }
    let cron = schedule(every);
    println!(
        "bench: N = {n}: creating {n} CronJobs and {n} CoordinatedJobs on {cron:?} in {ns} ({nodes:?} nodes)"
    );
    let spec = pod_spec(nodes, &["true"]);
    // On simulated nodes, the bench plays each run pod's sidecar (module `sidecars`).
    let sidecars =
        (nodes == Nodes::Kwok && !o.no_kwok_sidecars).then(|| Sidecars::start(client, ns));
    // Every pod of both kinds, as it is created and runs (module `ledger`).
    let ledger = PodLedger::start(client, ns);
    for_each_parallel(n, |i| {
        let (cronjobs, cojobs, cron, spec, prestart, start_timeout) = (
            cronjobs.clone(),
            cojobs.clone(),
            cron.clone(),
            spec.clone(),
            o.prestart,
            o.start_timeout,
        );
        async move {
            let cj: CronJob = serde_json::from_value(json!({
                "metadata": {"name": format!("cj-{i}")},
                "spec": {
                    "schedule": cron,
                    "concurrencyPolicy": "Allow",
                    "successfulJobsHistoryLimit": 10,
                    "jobTemplate": {"spec": {"backoffLimit": 0, "template": {"spec": spec}}}
                }
            }))?;
            cronjobs.create(&PostParams::default(), &cj).await?;
            let mut co = json!({
                "schedule": cron,
                "concurrencyPolicy": "Allow",
                "successfulRunsHistoryLimit": 10,
                "prestartSeconds": prestart,
                "template": {"spec": spec}
            });
            if let Some(s) = start_timeout {
                co["startTimeoutSeconds"] = json!(s);
            }
            let co = cojob_e2e::coordinated_job(&format!("co-{i}"), co);
            cojobs.create(&PostParams::default(), &co).await?;
            Ok(())
        }
    })
    .await?;
    let created_all = Utc::now();
    println!(
        "bench: N = {n}: created in {} s",
        (created_all - now).num_seconds()
    );
    // The costs are counted from `lead` before the first tick's work: the tick, or with
    // `--prestart` the moment its runs are prepared, that long before it like the others'.
    let lead = chrono::Duration::seconds(50);
    let ahead = chrono::Duration::seconds(o.prestart as i64); // at most 600
    // At least 5 s after the last object exists, so that every object sees the first tick;
    // with a prestart, its whole prestart and `lead` too, so that the count misses none of it.
    let room = chrono::Duration::seconds(5) + if o.prestart > 0 { lead + ahead } else { ahead };
    let first = first_measured_tick(created_all.max(now), room, every);
    let ticks: Vec<DateTime<Utc>> = (0..ticks_n)
        .map(|k| first + chrono::Duration::minutes(i64::from(k * every)))
        .collect();
    // Counted until 40 s after the last tick (the previous tick's work, if any, is done
    // `lead` before the first's).
    let counting = (first - lead - ahead - Utc::now())
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(counting).await;
    let before = Costs::now(&o.metrics).await?;
    let last = ticks[ticks.len() - 1];
    // Until the last tick's pods have had 40 s to start.
    let wait = (last + chrono::Duration::seconds(40) - Utc::now())
        .to_std()
        .unwrap_or_default();
    println!(
        "bench: N = {n}: ticks {} .. {}; waiting {:?}",
        ticks[0], last, wait
    );
    tokio::time::sleep(wait).await;
    let after = Costs::now(&o.metrics).await?;
    // A tick decided late is late, not missed: wait (at most 2 minutes) until every object of
    // both kinds has decided the last tick, so that its pods are on their way when the ledger
    // is read. Both kinds go on ticking (the namespace's removal stops them): the ledger keeps
    // every pod it saw, and a later tick's pods are not the window's.
    let decided = |items: Vec<Value>| {
        items
            .iter()
            .filter(|o| {
                o.pointer("/status/lastScheduleTime")
                    .and_then(Value::as_str)
                    .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                    .is_some_and(|t| t.with_timezone(&Utc) >= last)
            })
            .count()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let cron = list_all(&cronjobs).await?;
        let co = list_all(&cojobs).await?;
        let (cron_done, co_done) = (
            decided(
                cron.iter()
                    .map(serde_json::to_value)
                    .collect::<Result<_, _>>()?,
            ),
            decided(
                co.iter()
                    .map(serde_json::to_value)
                    .collect::<Result<_, _>>()?,
            ),
        );
        if (cron_done == n && co_done == n) || tokio::time::Instant::now() >= deadline {
            println!(
                "bench: N = {n}: last tick decided by {cron_done} CronJobs and {co_done} CoordinatedJobs"
            );
            break;
        }
        tokio::time::sleep(Duration::from_secs(if n > 1000 { 10 } else { 2 })).await;
    }
    let read_back = tokio::time::Instant::now();
    let runs = runs_of(&cojobs, &ticks).await?;
    // A decided tick's pod may still be on its way (a Job's pod, or a run's pod behind its
    // Secret): read the ledger once its pods of the window hold still for 10 s (at most 2
    // minutes). Later ticks' pods are not the window's and do not count.
    let (mut seen, t0) = (ledger.count_of(&ticks), tokio::time::Instant::now());
    while t0.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let now = ledger.count_of(&ticks);
        if now == seen {
            break;
        }
        seen = now;
    }
    if o.check {
        // The ledger against a list of the namespace (small sizes only: the check runs in CI).
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let missing = ledger.missing(&list_all(&pods).await?, &ticks);
        anyhow::ensure!(
            missing.is_empty(),
            "the pod ledger missed pods that a list shows: {missing:?}"
        );
    }
    // Ticks with a Job, pod or not: a Job is named after its CronJob and tick, which the
    // ledger reads off its pods' `job-name`; each Job's annotation checks the name.
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let mut cron_decided: BTreeSet<(String, DateTime<Utc>)> = BTreeSet::new();
    for job in list_all_metadata(&jobs).await? {
        let name = job.name_any();
        let from_name = cronjob_tick(&name);
        let scheduled = job
            .annotations()
            .get("batch.kubernetes.io/cronjob-scheduled-timestamp")
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc));
        anyhow::ensure!(
            from_name.as_ref().map(|(_, tick)| *tick) == scheduled,
            "Job {name}: its name gives {from_name:?}, its scheduled-timestamp annotation {scheduled:?}"
        );
        cron_decided.extend(from_name);
    }
    let (cron, co) = ledger.samples();
    println!(
        "bench: N = {n}: read back in {:?}: {} pods seen, {} of the window",
        read_back.elapsed(),
        cron.len() + co.len(),
        seen
    );
    let cron_owners: Vec<String> = (0..n).map(|i| format!("cj-{i}")).collect();
    let co_owners: Vec<String> = (0..n).map(|i| format!("co-{i}")).collect();
    let Runs {
        served,
        decided: co_decided,
        respawned,
        new_attempts,
    } = runs;
    // The simulated sidecars renew their leases until everything is read back: stopped before,
    // with kwok still playing the tick's pods, their Running pods' leases would expire and be
    // taken over while the bench reads, and count as respawns of the window.
    let simulated_sidecars = sidecars.map(Sidecars::stop);
    if let Some(s) = &simulated_sidecars {
        println!("bench: N = {n}: simulated sidecars: {s:?}");
    }
    let mut co_figures = figures(&co, &co_owners, &ticks, &served, &co_decided, respawned);
    co_figures.new_attempts = Some(new_attempts);
    let runs = co_figures.pods.max(1) as f64;
    let per_tick = f64::from(ticks_n);
    let restarted = before.controller_process != after.controller_process;
    if restarted {
        println!(
            "bench: N = {n}: the cojob controller restarted during the window ({:?} at the start, {:?} at the end: see its pod's last state); its CPU, bucket requests and tick pickup are not measured",
            before.controller_process, after.controller_process
        );
    }
    // What the controller's own counters give, unless they started again meanwhile.
    let own = |v: f64| if restarted { f64::NAN } else { v };
    let own_window = |after: &Histo, before: &Histo| {
        if restarted {
            after.since(after)
        } else {
            after.since(before)
        }
    };
    Ok(SizeResult {
        measured: Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
        n,
        ticks: ticks_n,
        every_minutes: every,
        nodes,
        prestart_seconds: o.prestart,
        start_timeout_seconds: o.start_timeout,
        simulated_sidecars,
        tick_pickup: own_window(&after.pickup, &before.pickup),
        pass_duration: own_window(&after.passes, &before.passes),
        controller_api_wait_ms: after
            .controller_api
            .mean_wait_ms_since(&before.controller_api),
        kube_controller_manager_api_wait_ms: after.kcm_api.mean_wait_ms_since(&before.kcm_api),
        controller_restarted: restarted,
        shared_cpu_seconds_per_tick: (after.shared_cpu - before.shared_cpu) / per_tick,
        machine_busy: if after.machine_total > before.machine_total {
            (after.machine_busy - before.machine_busy)
                / (after.machine_total - before.machine_total)
        } else {
            f64::NAN
        },
        cronjob: figures(
            &cron,
            &cron_owners,
            &ticks,
            &BTreeSet::new(),
            &cron_decided,
            0,
        ),
        cojob: co_figures,
        controller_cpu_seconds_per_tick: own(
            (after.controller_cpu - before.controller_cpu) / per_tick
        ),
        controller_rss_bytes: after.controller_rss,
        kube_controller_manager_cpu_seconds_per_tick: (after.kcm_cpu - before.kcm_cpu) / per_tick,
        bucket_requests_per_run: own((after.bucket_requests - before.bucket_requests) / runs),
        controller_api_requests_per_run: if restarted {
            BTreeMap::new()
        } else {
            counted_since(&after.kube_requests, &before.kube_requests)
                .into_iter()
                .map(|(k, v)| (k, v / runs))
                .filter(|(_, v)| *v > 0.0)
                .collect()
        },
        controller_takeovers: if restarted {
            BTreeMap::new()
        } else {
            counted_since(&after.takeovers, &before.takeovers)
        },
        controller_api_requests_per_tick: (after.controller_api.dispatched
            - before.controller_api.dispatched)
            / per_tick,
        kube_controller_manager_api_requests_per_tick: (after.kcm_api.dispatched
            - before.kcm_api.dispatched)
            / per_tick,
    })
}
