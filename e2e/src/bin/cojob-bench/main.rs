//! Punctuality and cost, side by side with CronJob, on the real cluster (`e2e/bench/run`).
//!
//! ```text
//! cojob-bench [--n 10,100] [--ticks 3] [--every 1] [--kwok 1000,10000] [--kwok-every 5]
//!             [--kwok-ticks 5] [--recovery K] [--recovery-ttl 12,30]
//!             [--cost K] [--cost-seconds 1,300] [--cost-ttl 30]
//!             [--metrics 127.0.0.1:18080] [--json OUT] [--merge EARLIER.json] [--check]
//!             [--docs FILE --command LINE]
//! ```
//!
//! For each size N: a fresh namespace with N CronJobs and N CoordinatedJobs on the same
//! schedule (`*/every * * * *`), with the same pod (busybox `true`, host network). Sizes of
//! `--n` run on the real node; sizes of `--kwok` on the simulated nodes of `e2e/bench/kwok`
//! (nothing runs there: a pod is Running when bound and Succeeded 2 to 7 s later). After the
//! ticks, both kinds are suspended and the pods are read back:
//!
//! - **dispatch lag**: the pod's creation minus the tick it serves (for CronJob, the tick is its
//!   Job's `batch.kubernetes.io/cronjob-scheduled-timestamp`; for cojob, `COJOB_FIRE_TIME`);
//! - **start lag**: the workload container's start minus the tick (real node only);
//! - **duplicates**: more than one Job (CronJob) or run (cojob) for one tick of one object;
//! - **misses**: ticks of the window without a Job (CronJob) or a run (cojob), read once every
//!   object of both kinds has decided the last tick (`status.lastScheduleTime`, waited for up
//!   to 2 minutes), so a late decision counts as lag, not as a miss; each miss is printed.
//!   A decided tick whose pod does not exist yet at the end is counted apart.
//!
//! Timestamps are the API server's, whole seconds. CPU time and resident memory come from
//! `/proc` (the cluster runs on this machine): the cojob controller's, kube-controller-manager's
//! (CronJob's and every other built-in controller), and what both share (API server, etcd,
//! scheduler, kwok). The controller's bucket requests and its tick pickup latency (the
//! reconcile queue's) come from its `/metrics` (`--metrics`), the API server requests of each
//! controller from the API server's own `/metrics` (dispatched requests by flow schema).
//! `--recovery K` then times K recoveries after a pod is deleted and K after a sidecar froze, at each ttl of
//! `--recovery-ttl` (module `recovery`), and `--cost K` counts the bucket requests of K one-shot
//! runs at each workload duration of `--cost-seconds`, the controller's and the sidecars', against
//! the formula (module `cost`). `--json` writes the figures, `--docs` the tables and
//! the plots (module `plots`); `--merge` adds the sizes of an earlier `--json` report that
//! this run did not measure (each size's table row says when it was measured); `--check`
//! fails on any duplicate or miss, a run that does not recover, or a run whose bucket
//! requests fall outside the formula (CI's small run).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, ensure};
use chrono::{DateTime, Timelike, Utc};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ContainerState, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

mod cost;
mod idle;
mod plots;
mod recovery;

/// Punctuality and cost side by side with CronJob, on the local cluster (see the module
/// documentation; `e2e/bench/run` calls it).
#[derive(clap::Parser, Debug)]
#[command(name = "cojob-bench")]
struct Options {
    /// Sizes on the real node, comma-separated (`''` for none).
    #[arg(long = "n", value_name = "N,N", default_value = "10", value_parser = sizes)]
    sizes: Sizes,
    /// Sizes on the simulated nodes of `e2e/bench/kwok`, comma-separated.
    #[arg(long = "kwok", value_name = "N,N", default_value = "", value_parser = sizes)]
    kwok_sizes: Sizes,
    /// Ticks measured on the real node (both kinds keep 10 finished runs, so at most 10).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10))]
    ticks: u32,
    /// Minutes between ticks (`*/every * * * *`) on the real node.
    #[arg(long, value_name = "MINUTES", default_value_t = 1, value_parser = divides_hour)]
    every: u32,
    /// Minutes between ticks on the simulated nodes.
    #[arg(long, value_name = "MINUTES", default_value_t = 5, value_parser = divides_hour)]
    kwok_every: u32,
    /// The CoordinatedJobs' `prestartSeconds`: each tick's run is decided and its pod created
    /// this long before the tick, and its workload still starts at the tick (0: at the tick).
    #[arg(long, value_name = "SECONDS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=600))]
    prestart: u64,
    /// The CoordinatedJobs' `startTimeoutSeconds` (default: the CRD's, 600). A Job's pod has
    /// no start timeout, so a size whose nodes start pods later than that (kwok's backlog at
    /// thousands of pods a tick) compares like with like only with a longer one.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    start_timeout: Option<u64>,
    /// Ticks measured on the simulated nodes (at most 10).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=10))]
    kwok_ticks: u32,
    /// Recoveries to measure for each fault at each lease ttl of `--recovery-ttl`.
    #[arg(long = "recovery", value_name = "K", default_value_t = 0)]
    recoveries: usize,
    /// Lease ttls (seconds) of the recovery measurement, comma-separated.
    #[arg(
        long = "recovery-ttl",
        value_name = "SECONDS,SECONDS",
        value_delimiter = ',',
        default_value = "12,30",
        value_parser = clap::value_parser!(i64).range(6..=300)
    )]
    recovery_ttls: Vec<i64>,
    /// One-shot runs to count the bucket requests of, at each workload duration of
    /// `--cost-seconds` (module `cost`).
    #[arg(long = "cost", value_name = "K", default_value_t = 0)]
    costs: usize,
    /// Workload durations (seconds of `sleep`) whose cost in bucket requests is counted,
    /// comma-separated.
    #[arg(
        long = "cost-seconds",
        value_name = "SECONDS,SECONDS",
        value_delimiter = ',',
        default_value = "1,300",
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    cost_seconds: Vec<u64>,
    /// The lease ttl (seconds) of the runs whose cost is counted.
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(6..=300))]
    cost_ttl: u64,
    /// CoordinatedJobs with nothing due whose passes and bucket requests are counted over
    /// `--idle-minutes` (module `idle`); measured first, on an otherwise idle controller.
    #[arg(long = "idle", value_name = "K", default_value_t = 0)]
    idle_jobs: usize,
    /// The window of the idle jobs' count, in minutes (at least 5: a job with nothing due
    /// passes every 5 minutes).
    #[arg(long, value_name = "MINUTES", default_value_t = 11.0, value_parser = at_least_five)]
    idle_minutes: f64,
    /// The cojob controller's metrics endpoint.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:18080")]
    metrics: String,
    /// Writes the figures as JSON.
    #[arg(long, value_name = "OUT")]
    json: Option<String>,
    /// An earlier `--json` report whose other sizes join this run's tables.
    #[arg(long, value_name = "EARLIER.json")]
    merge: Option<String>,
    /// Fails on any duplicate, miss or run that does not recover (CI's small run).
    #[arg(long)]
    check: bool,
    /// Writes the tables into this Markdown file (between its cojob-bench markers) and the
    /// plots into `bench/` beside it.
    #[arg(long, value_name = "FILE")]
    docs: Option<String>,
    /// The command line the docs name as the one that measured the figures.
    #[arg(long, value_name = "LINE", default_value = "cojob-bench")]
    command: String,
}

/// A comma-separated list of sizes.
#[derive(Debug, Clone, Default)]
struct Sizes(Vec<usize>);

impl std::ops::Deref for Sizes {
    type Target = Vec<usize>;
    fn deref(&self) -> &Vec<usize> {
        &self.0
    }
}

/// Parses `10,100` (or `''`, no size); each size within 1..=10 000.
fn sizes(v: &str) -> Result<Sizes, String> {
    v.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| match n.parse::<usize>() {
            Ok(n) if (1..=10_000).contains(&n) => Ok(n),
            _ => Err(format!("{n:?} is not a size within 1..=10000")),
        })
        .collect::<Result<_, _>>()
        .map(Sizes)
}

/// Parses a tick period in minutes that divides an hour, so `*/every` ticks evenly.
fn divides_hour(v: &str) -> Result<u32, String> {
    match v.parse::<u32>() {
        Ok(m) if (1..=30).contains(&m) && 60 % m == 0 => Ok(m),
        _ => Err(format!(
            "{v:?} does not divide an hour (1, 2, 3, 4, 5, 6, 10, 12, 15, 20 or 30 minutes)"
        )),
    }
}

fn at_least_five(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(m) if (5.0..=120.0).contains(&m) => Ok(m),
        _ => Err(format!(
            "{v:?}: the idle window is 5 to 120 minutes (a job with nothing due passes every 5)"
        )),
    }
}

/// Where the benchmark's pods run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum Nodes {
    /// The cluster's one real kubelet: start lag is real.
    Real,
    /// The simulated nodes of `e2e/bench/kwok` (label `type=kwok`): nothing runs, a pod is
    /// Running as soon as it is bound and Succeeded 2 to 7 s later, so dispatch lag and the
    /// controllers' cost are real, start lag is the scheduler's and kwok's.
    Kwok,
}

/// The pod both kinds run, running `command`: as small as a pod gets on this cluster.
fn pod_spec(nodes: Nodes, command: &[&str]) -> Value {
    let mut spec = json!({
        "hostNetwork": true,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "main",
            "image": cojob_e2e::image("busybox"),
            "imagePullPolicy": "Never",
            "command": command,
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}
        }]
    });
    if nodes == Nodes::Kwok {
        spec["nodeSelector"] = json!({"type": "kwok"});
        spec["tolerations"] =
            json!([{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]);
    }
    spec
}

/// Creates a one-shot CoordinatedJob `name` (no schedule: it runs once) on the real node, with
/// lease ttl `ttl` seconds, whose workload sleeps `seconds`.
async fn create_one_shot(
    jobs: &Api<DynamicObject>,
    name: &str,
    ttl: u64,
    seconds: u64,
) -> anyhow::Result<()> {
    let sleep = seconds.to_string();
    let job: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cojob.dev/v1alpha1",
        "kind": "CoordinatedJob",
        "metadata": {"name": name},
        "spec": {
            "lease": {"ttlSeconds": ttl},
            "template": {"spec": pod_spec(Nodes::Real, &["sleep", &sleep])}
        }
    }))?;
    jobs.create(&PostParams::default(), &job).await?;
    Ok(())
}

/// The controller's `/metrics` text.
async fn scrape(metrics: &str) -> anyhow::Result<String> {
    cojob_e2e::run_tool(
        "curl",
        &["-sS", "--fail", &format!("http://{metrics}/metrics")],
    )
    .await
    .with_context(|| format!("scraping the controller's /metrics at {metrics}"))
}

fn coordinated_jobs(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cojob.dev", "v1alpha1", "CoordinatedJob");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

/// One pod's figures.
struct Sample {
    /// Which object it belongs to.
    owner: String,
    tick: DateTime<Utc>,
    created: DateTime<Utc>,
    started: Option<DateTime<Utc>>,
    /// The Job (CronJob) or run (cojob) it serves.
    unit: String,
}

/// The figures of one kind at one size.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Figures {
    pods: usize,
    dispatch: Stats,
    start: Stats,
    duplicates: usize,
    misses: usize,
    /// Ticks decided to run (a Job, or a cojob run, exists) whose pod did not exist yet when
    /// the pods were read back: lag beyond the window, not a miss.
    unspawned: usize,
    /// Runs that took more than one attempt's lease (cojob: epoch above 1; CronJob: 0).
    respawned: usize,
    /// Of those, the runs on a new attempt (attempt above 1: a start timeout, or a failure
    /// retried); the others were taken over within their attempt (a lease that expired).
    /// `None` in reports from before it was counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    new_attempts: Option<usize>,
    /// The dispatch lag of each tick of the window, in order (empty in reports from before
    /// it was kept): whether a tail comes from one tick (the first, say) or from all.
    #[serde(default)]
    by_tick: Vec<TickLag>,
}

/// One tick's dispatch lag: its objects' first pods created minus the tick.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct TickLag {
    tick: DateTime<Utc>,
    dispatch: Stats,
    /// Objects whose first pod for this tick was created after it (lag above 0 s).
    late: usize,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Stats {
    #[serde(deserialize_with = "nan_if_null")]
    p50: f64,
    #[serde(deserialize_with = "nan_if_null")]
    p99: f64,
    #[serde(deserialize_with = "nan_if_null")]
    max: f64,
}

/// JSON has no NaN or infinity (serde_json writes `null`): read `null` back as NaN.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(<Option<f64> as serde::Deserialize>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn stats(mut v: Vec<f64>) -> Stats {
    if v.is_empty() {
        return Stats {
            p50: f64::NAN,
            p99: f64::NAN,
            max: f64::NAN,
        };
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    Stats {
        p50: at(0.5),
        p99: at(0.99),
        max: v[v.len() - 1],
    }
}

/// `served`: ticks known to have run although no pod of theirs is left (a cojob run whose lease
/// was taken over keeps the outcome of the pod that succeeded, and that pod goes once the
/// outcome is recorded). `decided`: ticks with a Job (CronJob) or a run (cojob), pod or not.
/// `respawned`: runs that took more than one lease epoch.
fn figures(
    samples: &[Sample],
    owners: &[String],
    ticks: &[DateTime<Utc>],
    served: &BTreeSet<(String, DateTime<Utc>)>,
    decided: &BTreeSet<(String, DateTime<Utc>)>,
    respawned: usize,
) -> Figures {
    let secs = |a: DateTime<Utc>, b: DateTime<Utc>| (a - b).num_milliseconds() as f64 / 1000.0;
    let mut units: BTreeMap<(String, DateTime<Utc>), BTreeSet<String>> = BTreeMap::new();
    for s in samples {
        units
            .entry((s.owner.clone(), s.tick))
            .or_default()
            .insert(s.unit.clone());
    }
    let duplicates = units.values().filter(|u| u.len() > 1).count();
    let (unspawned, missed): (Vec<_>, Vec<_>) = owners
        .iter()
        .flat_map(|o| ticks.iter().map(move |t| (o.clone(), *t)))
        .filter(|k| !units.contains_key(k) && !served.contains(k))
        .partition(|k| decided.contains(k));
    for (owner, tick) in &missed {
        println!("bench: no pod for {owner} at {tick}");
    }
    let misses = missed.len();
    let in_window: Vec<&Sample> = samples.iter().filter(|s| ticks.contains(&s.tick)).collect();
    // Lags are the tick's: its first pod created, its first workload started. A later pod
    // (a cojob attempt after a takeover) is counted in `respawned`, not as a late dispatch.
    /// A tick's first pod created, and its first workload started.
    type Firsts = (DateTime<Utc>, Option<DateTime<Utc>>);
    let mut first: BTreeMap<(&str, DateTime<Utc>), Firsts> = BTreeMap::new();
    for s in &in_window {
        let e = first
            .entry((s.owner.as_str(), s.tick))
            .or_insert((s.created, s.started));
        e.0 = e.0.min(s.created);
        e.1 = match (e.1, s.started) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    let lags: Vec<(DateTime<Utc>, f64)> = first
        .iter()
        .map(|((_, tick), (created, _))| (*tick, secs(*created, *tick)))
        .collect();
    let by_tick = ticks
        .iter()
        .map(|&tick| {
            let of: Vec<f64> = lags
                .iter()
                .filter(|(t, _)| *t == tick)
                .map(|&(_, lag)| lag)
                .collect();
            TickLag {
                tick,
                late: of.iter().filter(|&&lag| lag > 0.0).count(),
                dispatch: stats(of),
            }
        })
        .collect();
    Figures {
        pods: in_window.len(),
        dispatch: stats(lags.iter().map(|&(_, lag)| lag).collect()),
        start: stats(
            first
                .iter()
                .filter_map(|((_, tick), (_, started))| started.map(|st| secs(st, *tick)))
                .collect(),
        ),
        duplicates,
        misses,
        unspawned: unspawned.len(),
        respawned,
        new_attempts: None,
        by_tick,
    }
}

/// An API timestamp, to the whole second the API gives.
fn second(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.0.as_second(), 0)
}

/// The state of the pod's container (or init container) `name`.
fn container_state<'a>(pod: &'a Pod, name: &str, init: bool) -> Option<&'a ContainerState> {
    let status = pod.status.as_ref()?;
    let statuses = if init {
        status.init_container_statuses.as_ref()
    } else {
        status.container_statuses.as_ref()
    };
    statuses?.iter().find(|c| c.name == name)?.state.as_ref()
}

fn main_started(pod: &Pod) -> Option<DateTime<Utc>> {
    let state = container_state(pod, "main", false)?;
    let at = state
        .running
        .as_ref()
        .and_then(|r| r.started_at.as_ref())
        .or_else(|| {
            state
                .terminated
                .as_ref()
                .and_then(|t| t.started_at.as_ref())
        })?;
    second(at)
}

fn created(pod: &Pod) -> Option<DateTime<Utc>> {
    second(pod.metadata.creation_timestamp.as_ref()?)
}

/// CPU seconds and resident bytes of the processes whose arguments satisfy `is_it` (the
/// cluster runs on this machine, so its processes are in this `/proc`).
fn process_cost(is_it: impl Fn(&[String]) -> bool) -> (f64, u64) {
    let ticks_per_second = 100.0; // USER_HZ on Linux
    let (mut cpu, mut rss) = (0.0, 0);
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return (0.0, 0);
    };
    for entry in dir.flatten() {
        let path = entry.path();
        let Ok(cmd) = std::fs::read(path.join("cmdline")) else {
            continue;
        };
        let argv: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if !is_it(&argv) {
            continue;
        }
        if let Ok(stat) = std::fs::read_to_string(path.join("stat"))
            && let Some((_, rest)) = stat.rsplit_once(')')
        {
            // proc(5): after the command come state (3), …, utime (14) and stime (15).
            let f: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            let stime: f64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            cpu += (utime + stime) / ticks_per_second;
        }
        if let Ok(status) = std::fs::read_to_string(path.join("status"))
            && let Some(kb) = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        {
            rss += kb * 1024;
        }
    }
    (cpu, rss)
}

/// Which processes match `is_it`: each one's pid and start time (clock ticks since boot, field
/// 22 of `/proc/<pid>/stat`), so a process that was restarted, even under the same pid, is
/// told apart.
fn process_identity(is_it: impl Fn(&[String]) -> bool) -> BTreeSet<(String, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return BTreeSet::new();
    };
    dir.flatten()
        .filter_map(|entry| {
            let path = entry.path();
            let cmd = std::fs::read(path.join("cmdline")).ok()?;
            let argv: Vec<String> = cmd
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if !is_it(&argv) {
                return None;
            }
            let stat = std::fs::read_to_string(path.join("stat")).ok()?;
            let (_, rest) = stat.rsplit_once(')')?;
            let start = rest.split_whitespace().nth(19)?.to_owned();
            Some((entry.file_name().to_string_lossy().into_owned(), start))
        })
        .collect()
}

/// `cojob controller`, as the chart runs it.
fn is_cojob_controller(argv: &[String]) -> bool {
    argv.first()
        .is_some_and(|a| a.ends_with("/cojob") || a == "cojob")
        && argv.get(1).is_some_and(|a| a == "controller")
}

/// kube-controller-manager (its CronJob controller runs inside it, with every other one).
fn is_kube_controller_manager(argv: &[String]) -> bool {
    is_program(argv, "kube-controller-manager")
}

/// The API server, etcd, the scheduler and kwok: what both kinds share.
fn is_shared_component(argv: &[String]) -> bool {
    ["kube-apiserver", "etcd", "kube-scheduler", "kwok"]
        .iter()
        .any(|p| is_program(argv, p))
}

/// True when `argv[0]`'s file name starts with `program` (the cluster's binaries carry their
/// version: `kube-apiserver-v1.34.12`).
fn is_program(argv: &[String], program: &str) -> bool {
    argv.first().is_some_and(|a| {
        a.rsplit('/')
            .next()
            .is_some_and(|b| b == program || b.starts_with(&format!("{program}-")))
    })
}

/// The machine's busy and total CPU time so far, in seconds (`/proc/stat`).
fn machine_cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return (0.0, 0.0);
    };
    let f: Vec<f64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: f64 = f.iter().take(8).sum();
    // idle (4th) and iowait (5th) are not busy.
    let idle = f.get(3).copied().unwrap_or(0.0) + f.get(4).copied().unwrap_or(0.0);
    ((total - idle) / 100.0, total / 100.0)
}

/// A histogram of the controller's, as scraped: cumulative bucket counts by upper bound.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
struct Histo {
    /// Observations.
    count: f64,
    /// Their mean, in seconds.
    #[serde(deserialize_with = "nan_if_null")]
    mean: f64,
    /// The upper bound of the bucket holding the 99th percentile, in seconds (infinite: beyond
    /// the last bucket, read back from JSON as NaN).
    #[serde(deserialize_with = "nan_if_null")]
    p99_at_most: f64,
    #[serde(skip)]
    sum: f64,
    #[serde(skip)]
    buckets: Vec<(f64, f64)>,
}

impl Histo {
    /// The observations made between `before` and `self`.
    fn since(&self, before: &Histo) -> Histo {
        let buckets: Vec<(f64, f64)> = self
            .buckets
            .iter()
            .map(|(le, c)| {
                let old = before
                    .buckets
                    .iter()
                    .find(|(l, _)| l == le)
                    .map_or(0.0, |(_, c)| *c);
                (*le, c - old)
            })
            .collect();
        let count = self.count - before.count;
        let sum = self.sum - before.sum;
        let p99_at_most = buckets
            .iter()
            .find(|(_, c)| count > 0.0 && *c >= 0.99 * count)
            .map_or(f64::NAN, |(le, _)| *le);
        Histo {
            count,
            mean: if count > 0.0 { sum / count } else { f64::NAN },
            p99_at_most,
            sum,
            buckets,
        }
    }
}

/// What the controller's `/metrics` says so far.
struct ControllerMetrics {
    /// The sum of its bucket request counters.
    bucket_requests: f64,
    /// `cojob_tick_pickup_seconds`.
    pickup: Histo,
    /// `cojob_reconcile_duration_seconds` (how long its passes took).
    passes: Histo,
    /// `cojob_kube_requests_total` by [`kube_requests`]' keys (empty from a build before it).
    kube_requests: BTreeMap<String, f64>,
}

async fn controller_metrics(metrics: &str) -> anyhow::Result<ControllerMetrics> {
    let text = scrape(metrics).await?;
    let read = |name: &str| {
        let h = histogram(&text, name);
        ensure!(
            !h.buckets.is_empty(),
            "the controller at {metrics} has no {name} (an older build?)"
        );
        Ok(h)
    };
    Ok(ControllerMetrics {
        bucket_requests: cost::parse_store_requests(&text).0.total(),
        pickup: read("cojob_tick_pickup_seconds")?,
        passes: read("cojob_reconcile_duration_seconds")?,
        kube_requests: kube_requests(&text),
    })
}

/// The controller's API requests (`cojob_kube_requests_total`) keyed `verb resource`, with the
/// status appended where it is not a success (`create pods 409`): a conflict or a refusal is
/// a cost of its own.
fn kube_requests(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("cojob_kube_requests_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| {
                    kv.strip_prefix(name)?
                        .strip_prefix("=\"")?
                        .strip_suffix('"')
                })
                .unwrap_or("?")
        };
        let code = label("code");
        let mut key = format!("{} {}", label("verb"), label("resource"));
        if !code.starts_with('2') {
            key = format!("{key} {code}");
        }
        *out.entry(key).or_insert(0.0) += value;
    }
    out
}

/// The histogram `name` (unlabelled) of a Prometheus text exposition, as it stands.
fn histogram(text: &str, name: &str) -> Histo {
    let mut h = Histo::default();
    for line in text.lines() {
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let Some(rest) = key.strip_prefix(name) else {
            continue;
        };
        if rest == "_sum" {
            h.sum = value;
        } else if rest == "_count" {
            h.count = value;
        } else if let Some(le) = rest
            .strip_prefix("_bucket{le=\"")
            .and_then(|r| r.strip_suffix("\"}"))
        {
            h.buckets.push((le.parse().unwrap_or(f64::INFINITY), value));
        }
    }
    h
}

/// The API server's counters for one client: requests dispatched, and the seconds they
/// waited in its priority-and-fairness queues (with how many waits were measured).
#[derive(Debug, Default, Clone, Copy)]
struct ApiCounters {
    dispatched: f64,
    wait_seconds: f64,
    waits: f64,
}

impl ApiCounters {
    /// The mean queue wait per request between `before` and `self`, in milliseconds.
    fn mean_wait_ms_since(&self, before: &ApiCounters) -> f64 {
        let waits = self.waits - before.waits;
        if waits > 0.0 {
            1000.0 * (self.wait_seconds - before.wait_seconds) / waits
        } else {
            f64::NAN
        }
    }
}

/// API server requests dispatched so far, and their queue waits, by who sent them: the cojob
/// controller (its service account outside kube-system: flow schema `service-accounts`, which
/// nothing else uses during the bench) and the kube-controller-manager (its controllers run
/// under kube-system service accounts, plus its own identity; all of them, not only CronJob's
/// and Job's).
async fn api_requests() -> anyhow::Result<(ApiCounters, ApiCounters)> {
    let text = cojob_e2e::run_tool("kubectl", &["get", "--raw", "/metrics"])
        .await
        .context("scraping the API server's /metrics")?;
    Ok(api_counters(&text))
}

/// [`api_requests`] from the API server's metrics text.
fn api_counters(text: &str) -> (ApiCounters, ApiCounters) {
    let (mut cojob, mut kcm) = (ApiCounters::default(), ApiCounters::default());
    for line in text.lines() {
        let Some((key, value)) = line
            .rsplit_once(' ')
            .and_then(|(k, v)| Some((k, v.parse::<f64>().ok()?)))
        else {
            continue;
        };
        let who = if key.contains("flow_schema=\"service-accounts\"") {
            &mut cojob
        } else if key.contains("flow_schema=\"kube-system-service-accounts\"")
            || key.contains("flow_schema=\"kube-controller-manager\"")
        {
            &mut kcm
        } else {
            continue;
        };
        if key.starts_with("apiserver_flowcontrol_dispatched_requests_total{") {
            who.dispatched += value;
        } else if key.starts_with("apiserver_flowcontrol_request_wait_duration_seconds_sum{") {
            who.wait_seconds += value;
        } else if key.starts_with("apiserver_flowcontrol_request_wait_duration_seconds_count{") {
            who.waits += value;
        }
    }
    (cojob, kcm)
}

/// The first tick of `*/every * * * *` after `t`.
fn next_tick(t: DateTime<Utc>, every: u32) -> DateTime<Utc> {
    let floor = t
        .with_second(0)
        .and_then(|t| t.with_nanosecond(0))
        .unwrap_or(t);
    let mut tick = floor + chrono::Duration::minutes(1);
    while !tick.minute().is_multiple_of(every) {
        tick += chrono::Duration::minutes(1);
    }
    tick
}

/// The first tick a size measures, for objects that all exist at `created`: at least `room`
/// after it (its costs are counted from before its work begins), and never the objects' first
/// tick, so that every window starts with a tick's backlog of both kinds behind it, as on a
/// cluster whose jobs have run for a while. Which tick came first used to depend on when in
/// the interval the objects happened to be created.
fn first_measured_tick(
    created: DateTime<Utc>,
    room: chrono::Duration,
    every: u32,
) -> DateTime<Utc> {
    let their_second = next_tick(created, every) + chrono::Duration::minutes(i64::from(every));
    next_tick(created + room, every).max(their_second)
}

/// The cron expression of a tick every `every` minutes.
fn schedule(every: u32) -> String {
    if every == 1 {
        "* * * * *".into()
    } else {
        format!("*/{every} * * * *")
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SizeResult {
    /// When it was measured (UTC, to the minute).
    #[serde(default)]
    measured: String,
    n: usize,
    ticks: u32,
    every_minutes: u32,
    nodes: Nodes,
    /// The CoordinatedJobs' `prestartSeconds` (0 in reports from before the option).
    #[serde(default)]
    prestart_seconds: u64,
    /// The CoordinatedJobs' `startTimeoutSeconds` if not the CRD's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    start_timeout_seconds: Option<u64>,
    cronjob: Figures,
    cojob: Figures,
    /// The cojob controller's process was not the same at the end of the window (it restarted:
    /// killed for its memory, for example); its own counters started again, so its CPU,
    /// bucket requests and tick pickup over the window are not known (NaN).
    #[serde(default)]
    controller_restarted: bool,
    #[serde(deserialize_with = "nan_if_null")]
    controller_cpu_seconds_per_tick: f64,
    controller_rss_bytes: u64,
    kube_controller_manager_cpu_seconds_per_tick: f64,
    #[serde(deserialize_with = "nan_if_null")]
    bucket_requests_per_run: f64,
    controller_api_requests_per_tick: f64,
    /// The controller's API requests per run in the window, by verb and resource (its own
    /// `cojob_kube_requests_total`; empty in reports from before it, or if it restarted).
    #[serde(default)]
    controller_api_requests_per_run: BTreeMap<String, f64>,
    kube_controller_manager_api_requests_per_tick: f64,
    /// CPU seconds per tick of what both kinds share: API server, etcd, scheduler, kwok.
    shared_cpu_seconds_per_tick: f64,
    /// The machine's CPU busy over the window, 0 to 1 (all cores).
    #[serde(deserialize_with = "nan_if_null")]
    machine_busy: f64,
    /// Seconds from a tick to the start of the controller's pass that decided it (the wait in
    /// its work queue, plus the requeue's own timer), from `cojob_tick_pickup_seconds`.
    tick_pickup: Histo,
    /// How long the controller's passes took (`cojob_reconcile_duration_seconds`); empty in
    /// reports from before it was measured.
    #[serde(default)]
    pass_duration: Histo,
    /// The mean wait of the controller's API requests in the API server's
    /// priority-and-fairness queues, in milliseconds (NaN: not measured).
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    controller_api_wait_ms: f64,
    /// The same for the kube-controller-manager's.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    kube_controller_manager_api_wait_ms: f64,
}

/// NaN, for figures missing from older reports.
fn nan() -> f64 {
    f64::NAN
}

/// Every object of `api`, read in pages of 500 (at N = 10 000 a namespace holds tens of
/// thousands of pods: one unpaged list would be hundreds of megabytes).
async fn list_all<K>(api: &Api<K>) -> anyhow::Result<Vec<K>>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await?;
        out.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(out),
        }
    }
}

/// How many objects `api` holds, from one page of one (the API server counts the rest).
async fn count<K>(api: &Api<K>) -> anyhow::Result<u64>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let page = api.list(&ListParams::default().limit(1)).await?;
    let rest = page
        .metadata
        .remaining_item_count
        .map_or(0, |r| r.max(0).unsigned_abs());
    Ok(page.items.len() as u64 + rest)
}

/// Runs `task(i)` for every `i` in `0..n`, 32 at a time (one client: creating 20 000 objects
/// one after the other would take longer than a tick).
async fn for_each_parallel<F, Fut>(n: usize, task: F) -> anyhow::Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        if set.len() >= 32
            && let Some(done) = set.join_next().await
        {
            done??;
        }
        set.spawn(task(i));
    }
    while let Some(done) = set.join_next().await {
        done??;
    }
    Ok(())
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
            controller_api,
            kcm_api,
        })
    }
}

/// One size to measure: N of each kind, where, and how often they tick.
#[derive(Debug, Clone, Copy)]
struct Size {
    n: usize,
    nodes: Nodes,
    every: u32,
    ticks: u32,
}

async fn run_size(client: &Client, o: &Options, size: Size) -> anyhow::Result<SizeResult> {
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

/// Removes a benchmark's namespace and waits (up to 15 minutes) until it is gone, so that
/// what comes next starts on an empty cluster: a namespace being removed still costs the API
/// server, and its CoordinatedJobs' finalizers still cost the controller bucket requests.
async fn remove_namespace(
    client: &Client,
    ns: cojob_e2e::TestNamespace,
    what: &str,
) -> anyhow::Result<()> {
    let name = ns.name.clone();
    ns.cleanup().await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let t0 = tokio::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(900) {
        if namespaces.get_opt(&name).await?.is_none() {
            println!(
                "bench: {what}: namespace {name} removed in {:?}",
                t0.elapsed()
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    println!("bench: {what}: namespace {name} still there after 15 minutes; going on");
    Ok(())
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
                "apiVersion": "cojob.dev/v1alpha1",
                "kind": "CoordinatedJob",
                "metadata": {"name": format!("co-{i}")},
                "spec": {
                    "schedule": cron,
                    "concurrencyPolicy": "Allow",
                    "successfulRunsHistoryLimit": 10,
                    "prestartSeconds": prestart,
                    "template": {"spec": spec}
                }
            });
            if let Some(s) = start_timeout {
                co["spec"]["startTimeoutSeconds"] = json!(s);
            }
            let co: DynamicObject = serde_json::from_value(co)?;
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
    // both kinds has decided the last tick, so the suspension below cannot turn a late
    // decision into a skipped tick.
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
    // Stop both kinds before reading back.
    let suspend = json!({"spec": {"suspend": true}});
    for_each_parallel(n, |i| {
        let (cronjobs, cojobs, suspend) = (cronjobs.clone(), cojobs.clone(), suspend.clone());
        async move {
            let params = PatchParams::default();
            cronjobs
                .patch(&format!("cj-{i}"), &params, &Patch::Merge(&suspend))
                .await?;
            cojobs
                .patch(&format!("co-{i}"), &params, &Patch::Merge(&suspend))
                .await?;
            Ok(())
        }
    })
    .await?;
    // A decided tick's pod may still be on its way (a Job's pod, or a run's pod behind its
    // Secret): read back once the number of pods holds still for 10 s (at most 2 minutes).
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let (mut seen, t0) = (count(&pods).await?, tokio::time::Instant::now());
    while t0.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let now = count(&pods).await?;
        if now == seen {
            break;
        }
        seen = now;
    }

    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let mut scheduled: BTreeMap<String, (String, DateTime<Utc>)> = BTreeMap::new();
    for job in list_all(&jobs).await? {
        let owner = job
            .owner_references()
            .iter()
            .find(|r| r.kind == "CronJob")
            .map(|r| r.name.clone());
        let tick = job
            .annotations()
            .get("batch.kubernetes.io/cronjob-scheduled-timestamp")
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc));
        if let (Some(owner), Some(tick)) = (owner, tick) {
            scheduled.insert(job.name_any(), (owner, tick));
        }
    }
    let (mut cron, mut co) = (Vec::new(), Vec::new());
    for pod in list_all(&pods).await? {
        let Some(created) = created(&pod) else {
            continue;
        };
        let started = main_started(&pod);
        let labels = pod.labels();
        if let Some(job) = labels.get("job-name") {
            if let Some((owner, tick)) = scheduled.get(job) {
                cron.push(Sample {
                    owner: owner.clone(),
                    tick: *tick,
                    created,
                    started,
                    unit: job.clone(),
                });
            }
        } else if let (Some(owner), Some(run)) =
            (labels.get("cojob.dev/job"), labels.get("cojob.dev/run"))
        {
            let tick = pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.iter().find(|c| c.name == "main"))
                .and_then(|c| c.env.as_ref())
                .and_then(|env| env.iter().find(|e| e.name == "COJOB_FIRE_TIME"))
                .and_then(|e| e.value.as_deref())
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.with_timezone(&Utc));
            if let Some(tick) = tick {
                co.push(Sample {
                    owner: owner.clone(),
                    tick,
                    created,
                    started,
                    unit: run.clone(),
                });
            }
        }
    }
    let cron_owners: Vec<String> = (0..n).map(|i| format!("cj-{i}")).collect();
    let co_owners: Vec<String> = (0..n).map(|i| format!("co-{i}")).collect();
    // What the controller recorded: succeeded runs by tick, and runs of more than one epoch.
    let (mut served, mut co_decided, mut respawned) = (BTreeSet::new(), BTreeSet::new(), 0);
    let mut new_attempts = 0;
    for job in list_all(&cojobs).await? {
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
                    respawned += 1;
                    if run.get("attempt").and_then(Value::as_i64).unwrap_or(1) > 1 {
                        new_attempts += 1;
                    }
                }
                if run.get("phase").and_then(Value::as_str) == Some("succeeded") {
                    served.insert((job.name_any(), tick));
                }
                co_decided.insert((job.name_any(), tick));
            }
        }
    }
    let mut co_figures = figures(&co, &co_owners, &ticks, &served, &co_decided, respawned);
    co_figures.new_attempts = Some(new_attempts);
    let cron_decided: BTreeSet<(String, DateTime<Utc>)> = scheduled.values().cloned().collect();
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
            after
                .kube_requests
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        (v - before.kube_requests.get(k).unwrap_or(&0.0)) / runs,
                    )
                })
                .filter(|(_, v)| *v > 0.0)
                .collect()
        },
        controller_api_requests_per_tick: (after.controller_api.dispatched
            - before.controller_api.dispatched)
            / per_tick,
        kube_controller_manager_api_requests_per_tick: (after.kcm_api.dispatched
            - before.kcm_api.dispatched)
            / per_tick,
    })
}

/// What the plots show of one size.
fn plot_point(r: &SizeResult) -> plots::Point {
    plots::Point {
        n: r.n,
        cronjob_dispatch_p99: r.cronjob.dispatch.p99,
        cojob_dispatch_p99: r.cojob.dispatch.p99,
        // On simulated nodes nothing starts: their start lag is kwok's, not a kubelet's.
        cronjob_start_p99: if r.nodes == Nodes::Real {
            r.cronjob.start.p99
        } else {
            f64::NAN
        },
        cojob_start_p99: if r.nodes == Nodes::Real {
            r.cojob.start.p99
        } else {
            f64::NAN
        },
        controller_rss_mib: r.controller_rss_bytes as f64 / (1024.0 * 1024.0),
        controller_api_requests_per_tick: r.controller_api_requests_per_tick,
        kube_controller_manager_api_requests_per_tick: r
            .kube_controller_manager_api_requests_per_tick,
        bucket_requests_per_run: r.bucket_requests_per_run,
        controller_cpu_seconds_per_tick: r.controller_cpu_seconds_per_tick,
        kube_controller_manager_cpu_seconds_per_tick: r
            .kube_controller_manager_cpu_seconds_per_tick,
    }
}

/// cojob's figure over CronJob's; a negative cojob figure (pods created ahead of the tick, with
/// `--prestart`) has no ratio, and says so, nor has a figure that was not measured (NaN: no pod
/// of that kind started in the window, for example).
fn ratio(a: f64, b: f64) -> String {
    if a.is_nan() || b.is_nan() {
        format!("none ({a} vs {b})")
    } else if a < 0.0 {
        format!("ahead ({a} s vs {b} s)")
    } else if b > 0.0 {
        format!("{:.2}", a / b)
    } else if a == 0.0 {
        "= (both 0)".into()
    } else {
        format!("∞ ({a} vs 0)")
    }
}

/// The figures as two Markdown tables.
fn tables(results: &[SizeResult]) -> String {
    let mut t = String::new();
    let times: BTreeSet<&str> = results.iter().map(|r| r.measured.as_str()).collect();
    if times.len() > 1 {
        // Merged from more than one run: say which size is from when.
        let when: Vec<String> = results
            .iter()
            .map(|r| format!("N = {} ({:?}): {}", r.n, r.nodes, r.measured))
            .collect();
        t.push_str(&format!("Measured at: {}.\n\n", when.join("; ")));
    }
    t.push_str(
        "| N | nodes | ticks (every) | kind | pods | dispatch lag p50 / p99 / max (s) | start lag p50 / p99 / max (s) | duplicates | misses | pod not created by the end | respawned runs |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let nodes = nodes_label(r.nodes);
        let cojob = cojob_label(r);
        for (kind, f) in [("CronJob", &r.cronjob), (cojob.as_str(), &r.cojob)] {
            t.push_str(&format!(
                "| {} | {nodes} | {} ({} min) | {kind} | {} | {} / {} / {} | {} / {} / {} | {} | {} | {} | {} |\n",
                r.n,
                r.ticks,
                r.every_minutes,
                f.pods,
                f.dispatch.p50,
                f.dispatch.p99,
                f.dispatch.max,
                f.start.p50,
                f.start.p99,
                f.start.max,
                f.duplicates,
                f.misses,
                f.unspawned,
                respawned_cell(f)
            ));
        }
    }
    t.push_str(
        "\n| N | dispatch lag p99, cojob / CronJob | start lag p99, cojob / CronJob | cojob controller CPU s per tick | kube-controller-manager CPU s per tick | API requests per tick, cojob controller / kube-controller-manager | cojob controller RSS (MiB) | bucket requests per run | tick pickup mean / p99 ≤ (s) | API server + etcd + scheduler + kwok CPU s per tick | machine CPU busy |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        t.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.0} / {:.0} | {:.1} | {:.1} | {:.2} / {} | {:.1} | {:.0} % |\n",
            r.n,
            ratio(r.cojob.dispatch.p99, r.cronjob.dispatch.p99),
            ratio(r.cojob.start.p99, r.cronjob.start.p99),
            r.controller_cpu_seconds_per_tick,
            r.kube_controller_manager_cpu_seconds_per_tick,
            r.controller_api_requests_per_tick,
            r.kube_controller_manager_api_requests_per_tick,
            r.controller_rss_bytes as f64 / (1024.0 * 1024.0),
            r.bucket_requests_per_run,
            r.tick_pickup.mean,
            r.tick_pickup.p99_at_most,
            r.shared_cpu_seconds_per_tick,
            r.machine_busy * 100.0
        ));
    }
    t.push_str(&passes_table(results));
    t.push_str(&api_requests_table(results));
    t.push_str(&by_tick_table(results));
    for r in results.iter().filter(|r| r.controller_restarted) {
        t.push_str(&format!(
            "\nN = {} ({:?} nodes): the cojob controller restarted during the window, so its CPU, bucket requests and tick pickup are not known (NaN); its memory is the restarted process's.\n",
            r.n, r.nodes
        ));
    }
    t
}

/// The controller's passes and how long the API server queued each kind's requests, for the
/// sizes that measured them (empty if none did).
fn passes_table(results: &[SizeResult]) -> String {
    let measured: Vec<&SizeResult> = results
        .iter()
        .filter(|r| r.pass_duration.count > 0.0)
        .collect();
    if measured.is_empty() {
        return String::new();
    }
    let mut t = String::from(
        "\nThe controller's passes (`cojob_reconcile_duration_seconds`) and the API server's queue wait per request (priority and fairness):\n\n\
         | N | kind | passes per tick | pass duration mean / p99 ≤ (s) | API queue wait per request, mean (ms), cojob controller / kube-controller-manager |\n\
         |---|---|---|---|---|\n",
    );
    for r in measured {
        t.push_str(&format!(
            "| {} | {} | {:.0} | {:.3} / {} | {:.1} / {:.1} |\n",
            r.n,
            cojob_label(r),
            r.pass_duration.count / f64::from(r.ticks.max(1)),
            r.pass_duration.mean,
            r.pass_duration.p99_at_most,
            r.controller_api_wait_ms,
            r.kube_controller_manager_api_wait_ms,
        ));
    }
    t
}

/// The controller's API requests per run by verb and resource, one column per size that
/// counted them (empty if none did).
fn api_requests_table(results: &[SizeResult]) -> String {
    let measured: Vec<&SizeResult> = results
        .iter()
        .filter(|r| !r.controller_api_requests_per_run.is_empty())
        .collect();
    if measured.is_empty() {
        return String::new();
    }
    let keys: BTreeSet<&String> = measured
        .iter()
        .flat_map(|r| r.controller_api_requests_per_run.keys())
        .collect();
    let mut t = String::from(
        "\nThe cojob controller's API requests per run (pod created in the window), by verb and resource (`cojob_kube_requests_total`; a status other than 2xx after the resource):\n\n| request |",
    );
    for r in &measured {
        t.push_str(&format!(" N = {} ({}) |", r.n, nodes_label(r.nodes)));
    }
    t.push_str("\n|---|");
    t.push_str(&"---|".repeat(measured.len()));
    t.push('\n');
    let row = |t: &mut String, name: &str, value: &dyn Fn(&SizeResult) -> f64| {
        t.push_str(&format!("| {name} |"));
        for r in &measured {
            t.push_str(&format!(" {:.2} |", value(r)));
        }
        t.push('\n');
    };
    for key in keys {
        row(&mut t, key, &|r: &SizeResult| {
            r.controller_api_requests_per_run
                .get(key)
                .copied()
                .unwrap_or(0.0)
        });
    }
    row(&mut t, "**all**", &|r: &SizeResult| {
        r.controller_api_requests_per_run.values().sum()
    });
    t
}

/// The respawned runs, split into new attempts and takeovers where the report counted them.
fn respawned_cell(f: &Figures) -> String {
    match f.new_attempts {
        Some(new) if f.respawned > 0 => format!(
            "{} ({new} new attempts, {} takeovers)",
            f.respawned,
            f.respawned.saturating_sub(new)
        ),
        _ => f.respawned.to_string(),
    }
}

/// How the tables name the nodes of a size.
fn nodes_label(nodes: Nodes) -> &'static str {
    match nodes {
        Nodes::Real => "real",
        Nodes::Kwok => "kwok (simulated)",
    }
}

/// How the tables name cojob's rows: with the prestart and the start timeout, if not the
/// defaults.
fn cojob_label(r: &SizeResult) -> String {
    let mut label = "cojob".to_string();
    if r.prestart_seconds > 0 {
        label += &format!(", prestart {} s", r.prestart_seconds);
    }
    if let Some(s) = r.start_timeout_seconds {
        label += &format!(", start timeout {s} s");
    }
    label
}

/// Each tick's dispatch lag, one row per size and kind (empty if no result kept them).
fn by_tick_table(results: &[SizeResult]) -> String {
    let kept: Vec<&SizeResult> = results
        .iter()
        .filter(|r| !r.cojob.by_tick.is_empty())
        .collect();
    let columns = kept.iter().map(|r| r.ticks as usize).max().unwrap_or(0);
    if columns == 0 {
        return String::new();
    }
    let mut t = String::from(
        "\nDispatch lag by tick, p50 / p99 / max (s), and how many objects' pods came after \
         their tick:\n\n| N | nodes | kind |",
    );
    for k in 1..=columns {
        t.push_str(&format!(" tick {k} |"));
    }
    t.push_str(&format!("\n|---|---|---|{}\n", "---|".repeat(columns)));
    for r in kept {
        let cojob = cojob_label(r);
        for (kind, f) in [("CronJob", &r.cronjob), (cojob.as_str(), &r.cojob)] {
            t.push_str(&format!("| {} | {} | {kind} |", r.n, nodes_label(r.nodes)));
            for k in 0..columns {
                match f.by_tick.get(k) {
                    Some(l) => t.push_str(&format!(
                        " {} / {} / {} ({} late) |",
                        l.dispatch.p50, l.dispatch.p99, l.dispatch.max, l.late
                    )),
                    None => t.push_str(" |"),
                }
            }
            t.push('\n');
        }
    }
    t
}

const BEGIN: &str = "<!-- cojob-bench:begin (written by e2e/bench/run) -->";
const END: &str = "<!-- cojob-bench:end -->";

/// Replaces the figures between the markers in `path` (appending a section the first time).
fn write_docs(path: &str, command: &str, tables: &str) -> anyhow::Result<()> {
    let doc = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    let body = format!(
        "{BEGIN}\nMeasured {} on this machine ({cores} cores; load average at the end {load}) with \
         `{command}`.\n\n{tables}{END}",
        Utc::now().format("%Y-%m-%d %H:%M UTC")
    );
    let new = match (doc.find(BEGIN), doc.find(END)) {
        (Some(b), Some(e)) if b < e => format!("{}{body}{}", &doc[..b], &doc[e + END.len()..]),
        _ => format!(
            "{}\n## Side by side with CronJob (`e2e/bench/run`)\n\n{body}\n",
            doc.trim_end()
        ),
    };
    std::fs::write(path, new).with_context(|| format!("writing {path}"))
}

/// What `--json` writes, and `--merge` reads back.
#[derive(serde::Serialize, serde::Deserialize)]
struct Report {
    sizes: Vec<SizeResult>,
    #[serde(default)]
    recovery: Vec<recovery::Recovery>,
    #[serde(default)]
    cost: Vec<cost::Cost>,
    #[serde(default)]
    idle: Vec<idle::Idle>,
}

/// Adds to `results` the sizes of an earlier report that this run did not measure (the same
/// N on the same kind of node with the same `--prestart`), and its recoveries and costs if this run measured none; real
/// nodes first, then by N.
fn merge(
    path: &str,
    results: &mut Vec<SizeResult>,
    recoveries: &mut Vec<recovery::Recovery>,
    costs: &mut Vec<cost::Cost>,
    idles: &mut Vec<idle::Idle>,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let earlier: Report = serde_json::from_str(&text)
        .with_context(|| format!("{path} is not a cojob-bench report"))?;
    for old in earlier.sizes {
        if !results.iter().any(|r| {
            r.n == old.n
                && r.nodes == old.nodes
                && r.prestart_seconds == old.prestart_seconds
                && r.start_timeout_seconds == old.start_timeout_seconds
        }) {
            println!(
                "bench: keeping N = {} ({:?} nodes, measured {}) from {path}",
                old.n, old.nodes, old.measured
            );
            results.push(old);
        }
    }
    results.sort_by_key(|r| (r.nodes == Nodes::Kwok, r.n, r.prestart_seconds));
    if recoveries.is_empty() {
        *recoveries = earlier.recovery;
    }
    if costs.is_empty() {
        *costs = earlier.cost;
    }
    if idles.is_empty() {
        *idles = earlier.idle;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = <Options as clap::Parser>::parse();
    let client = cojob_e2e::client().await;
    let mut results = Vec::new();
    let real = o.sizes.iter().map(|&n| Size {
        n,
        nodes: Nodes::Real,
        every: o.every,
        ticks: o.ticks,
    });
    let kwok = o.kwok_sizes.iter().map(|&n| Size {
        n,
        nodes: Nodes::Kwok,
        every: o.kwok_every,
        ticks: o.kwok_ticks,
    });
    // Idle jobs first, while they are the controller's only ones.
    let mut idles = Vec::new();
    if o.idle_jobs > 0 {
        idles.push(idle::measure(&client, &o.metrics, o.idle_jobs, o.idle_minutes).await?);
    }
    // Recoveries first, on a quiet cluster: after a large size, its namespace's removal may
    // still load the node and the API server.
    let mut recoveries = Vec::new();
    if o.recoveries > 0 {
        for fault in [recovery::Fault::Deleted, recovery::Fault::Silent] {
            for &ttl in &o.recovery_ttls {
                recoveries.push(recovery::measure(&client, fault, ttl, o.recoveries).await?);
            }
        }
    }
    // The cost of one run, on an idle controller: its counters then hold only these runs.
    let mut costs = Vec::new();
    if o.costs > 0 {
        for &seconds in &o.cost_seconds {
            costs.push(cost::measure(&client, &o.metrics, seconds, o.cost_ttl, o.costs).await?);
        }
    }
    for size in real.chain(kwok).collect::<Vec<_>>() {
        results.push(run_size(&client, &o, size).await?);
    }
    if let Some(path) = &o.merge {
        merge(path, &mut results, &mut recoveries, &mut costs, &mut idles)?;
    }
    // A run of recoveries or costs only (`--n ''`) has no size to show.
    let mut tables = if results.is_empty() {
        String::new()
    } else {
        tables(&results) + "\n"
    };
    if !recoveries.is_empty() {
        tables.push_str(&recovery::table(&recoveries));
    }
    if !costs.is_empty() {
        tables.push('\n');
        tables.push_str(&cost::table(&costs));
    }
    if !idles.is_empty() {
        tables.push('\n');
        tables.push_str(&idle::table(&idles));
    }
    println!("\n{tables}");
    if let Some(path) = &o.docs {
        // The plots go next to the document, in bench/, and the document links them.
        let dir = std::path::Path::new(path)
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .join("bench");
        let points: Vec<plots::Point> = results.iter().map(plot_point).collect();
        let files = plots::write(&points, &dir)?;
        tables.push('\n');
        for file in files {
            let title = file.trim_end_matches(".svg");
            tables.push_str(&format!("![{title}](bench/{file})\n"));
        }
        write_docs(path, &o.command, &tables)?;
        println!(
            "bench: wrote the figures into {path} and the plots into {}",
            dir.display()
        );
    }
    if let Some(path) = &o.json {
        // The shape of `Report`, which `--merge` reads back.
        let report =
            json!({"sizes": &results, "recovery": &recoveries, "cost": &costs, "idle": &idles});
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {path}"))?;
    }
    if o.check {
        for r in &results {
            for (kind, f) in [("CronJob", &r.cronjob), ("cojob", &r.cojob)] {
                ensure!(
                    f.duplicates == 0 && f.misses == 0,
                    "N = {}: {kind} had {} duplicates and {} misses",
                    r.n,
                    f.duplicates,
                    f.misses
                );
            }
            ensure!(r.cojob.pods > 0, "N = {}: no cojob pod was measured", r.n);
        }
        for c in &costs {
            ensure!(
                c.within_formula(),
                "a run of sleep {} at ttl {} s cost more or less than the formula says: {c:?}",
                c.sleep_seconds,
                c.ttl_seconds
            );
        }
        for i in &idles {
            ensure!(
                i.as_expected(),
                "{} idle jobs over {} minutes: a job missed its passes, or they read or wrote the bucket more than once per --index-resync: {i:?}",
                i.jobs,
                i.minutes
            );
        }
        println!(
            "bench: check passed: no duplicate, no miss, every run's bucket requests within the formula, idle jobs read nothing between their resyncs"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn a_ratio_says_ahead_when_pods_come_before_the_tick() {
        assert_eq!(ratio(-9.0, 0.0), "ahead (-9 s vs 0 s)");
        assert_eq!(ratio(-2.0, 3.0), "ahead (-2 s vs 3 s)");
        assert_eq!(ratio(2.0, 4.0), "0.50");
        assert_eq!(ratio(0.0, 0.0), "= (both 0)");
        assert_eq!(ratio(1470.0, f64::NAN), "none (1470 vs NaN)");
        assert_eq!(ratio(f64::NAN, 3.0), "none (NaN vs 3)");
    }

    #[test]
    fn ticks_fall_on_multiples_of_the_interval() {
        assert_eq!(
            next_tick(t("2026-12-03T18:00:00Z"), 1),
            t("2026-12-03T18:01:00Z")
        );
        assert_eq!(
            next_tick(t("2026-12-03T18:01:30Z"), 5),
            t("2026-12-03T18:05:00Z")
        );
        assert_eq!(
            next_tick(t("2026-12-03T18:55:01Z"), 5),
            t("2026-12-03T19:00:00Z")
        );
        assert_eq!(schedule(1), "* * * * *");
        assert_eq!(schedule(5), "*/5 * * * *");
    }

    #[test]
    fn a_window_never_starts_at_the_objects_first_tick() {
        let room = |s| chrono::Duration::seconds(s);
        // Created just after a tick: the room (a prestart of 600 s and the lead) ends before
        // the next, but that is the objects' first; their second is measured.
        assert_eq!(
            first_measured_tick(t("2026-12-06T07:02:00Z"), room(655), 15),
            t("2026-12-06T07:30:00Z")
        );
        // Created just before a tick: the room already skips it.
        assert_eq!(
            first_measured_tick(t("2026-12-06T07:13:00Z"), room(655), 15),
            t("2026-12-06T07:30:00Z")
        );
        // A room longer than an interval decides on its own.
        assert_eq!(
            first_measured_tick(t("2026-12-06T07:13:00Z"), room(1100), 15),
            t("2026-12-06T07:45:00Z")
        );
        // One-minute ticks without a prestart: the second minute after creation.
        assert_eq!(
            first_measured_tick(t("2026-12-06T07:02:10Z"), room(5), 1),
            t("2026-12-06T07:04:00Z")
        );
    }

    #[test]
    fn the_pickup_histogram_is_the_difference_over_the_window() {
        let before = Histo {
            count: 10.0,
            sum: 1.0,
            buckets: vec![(0.1, 10.0), (1.0, 10.0), (f64::INFINITY, 10.0)],
            ..Histo::default()
        };
        let after = Histo {
            count: 110.0,
            sum: 21.0,
            buckets: vec![(0.1, 60.0), (1.0, 108.0), (f64::INFINITY, 110.0)],
            ..Histo::default()
        };
        let window = after.since(&before);
        assert_eq!(window.count, 100.0);
        assert!((window.mean - 0.2).abs() < 1e-9);
        // 98 of 100 within 1 s: the 99th percentile is in the +Inf bucket.
        assert_eq!(window.p99_at_most, f64::INFINITY);
        let nothing = after.since(&after);
        assert!(nothing.mean.is_nan() && nothing.p99_at_most.is_nan());
    }

    #[test]
    fn histograms_and_queue_waits_are_read_from_the_metrics_text() {
        let controller = "\
# TYPE cojob_reconcile_duration_seconds histogram
cojob_reconcile_duration_seconds_sum 3.5
cojob_reconcile_duration_seconds_count 7
cojob_reconcile_duration_seconds_bucket{le=\"0.5\"} 6
cojob_reconcile_duration_seconds_bucket{le=\"+Inf\"} 7
cojob_tick_pickup_seconds_sum 9.0
cojob_tick_pickup_seconds_count 1
cojob_tick_pickup_seconds_bucket{le=\"+Inf\"} 1
";
        let passes = histogram(controller, "cojob_reconcile_duration_seconds");
        assert_eq!((passes.count, passes.sum), (7.0, 3.5));
        assert_eq!(passes.buckets, vec![(0.5, 6.0), (f64::INFINITY, 7.0)]);
        let window = passes.since(&Histo::default());
        assert!((window.mean - 0.5).abs() < 1e-9);
        assert_eq!(window.p99_at_most, f64::INFINITY);
        let pickup = histogram(controller, "cojob_tick_pickup_seconds");
        assert_eq!((pickup.count, pickup.sum), (1.0, 9.0));

        let server = |cojob_waited: f64, cojob_waits: f64| {
            format!(
                "\
apiserver_flowcontrol_dispatched_requests_total{{flow_schema=\"service-accounts\",priority_level=\"workload-low\"}} {cojob_waits}
apiserver_flowcontrol_request_wait_duration_seconds_sum{{execute=\"true\",flow_schema=\"service-accounts\",priority_level=\"workload-low\"}} {cojob_waited}
apiserver_flowcontrol_request_wait_duration_seconds_count{{execute=\"true\",flow_schema=\"service-accounts\",priority_level=\"workload-low\"}} {cojob_waits}
apiserver_flowcontrol_request_wait_duration_seconds_bucket{{execute=\"true\",flow_schema=\"service-accounts\",priority_level=\"workload-low\",le=\"+Inf\"}} {cojob_waits}
apiserver_flowcontrol_dispatched_requests_total{{flow_schema=\"kube-controller-manager\",priority_level=\"workload-high\"}} 40
apiserver_flowcontrol_dispatched_requests_total{{flow_schema=\"kube-system-service-accounts\",priority_level=\"workload-high\"}} 60
apiserver_flowcontrol_request_wait_duration_seconds_sum{{execute=\"true\",flow_schema=\"kube-system-service-accounts\",priority_level=\"workload-high\"}} 0.1
apiserver_flowcontrol_request_wait_duration_seconds_count{{execute=\"true\",flow_schema=\"kube-system-service-accounts\",priority_level=\"workload-high\"}} 100
apiserver_flowcontrol_dispatched_requests_total{{flow_schema=\"exempt\",priority_level=\"exempt\"}} 999
"
            )
        };
        let (co_before, kcm) = api_counters(&server(1.0, 100.0));
        let (co_after, _) = api_counters(&server(3.0, 300.0));
        assert_eq!(co_after.dispatched - co_before.dispatched, 200.0);
        assert!((co_after.mean_wait_ms_since(&co_before) - 10.0).abs() < 1e-9);
        assert_eq!(kcm.dispatched, 100.0);
        assert!((kcm.mean_wait_ms_since(&ApiCounters::default()) - 1.0).abs() < 1e-9);
        assert!(kcm.mean_wait_ms_since(&kcm).is_nan());
    }

    #[test]
    fn the_controllers_api_requests_are_read_by_verb_and_resource_with_failures_apart() {
        let text = "\
# HELP cojob_kube_requests Requests this process sent
# TYPE cojob_kube_requests counter
cojob_kube_requests_total{verb=\"create\",resource=\"pods\",code=\"201\"} 4
cojob_kube_requests_total{verb=\"create\",resource=\"pods\",code=\"409\"} 1
cojob_kube_requests_total{verb=\"patch\",resource=\"coordinatedjobs/status\",code=\"200\"} 8
cojob_kube_requests_total{verb=\"get\",resource=\"pods\",code=\"error\"} 2
cojob_store_requests_total{op=\"get\",outcome=\"ok\"} 99
";
        let read = kube_requests(text);
        assert_eq!(
            read.into_iter().collect::<Vec<_>>(),
            vec![
                ("create pods".to_string(), 4.0),
                ("create pods 409".into(), 1.0),
                ("get pods error".into(), 2.0),
                ("patch coordinatedjobs/status".into(), 8.0),
            ]
        );
    }

    fn sample(owner: &str, tick: &str, unit: &str, created: &str) -> Sample {
        Sample {
            owner: owner.into(),
            tick: t(tick),
            created: t(created),
            started: None,
            unit: unit.into(),
        }
    }

    #[test]
    fn figures_tell_duplicates_misses_and_late_pods_apart() {
        let ticks = [t("2026-12-03T18:01:00Z"), t("2026-12-03T18:02:00Z")];
        let owners = ["a".to_string(), "b".to_string(), "c".to_string()];
        let samples = [
            sample("a", "2026-12-03T18:01:00Z", "a-1", "2026-12-03T18:01:02Z"),
            sample("a", "2026-12-03T18:02:00Z", "a-2", "2026-12-03T18:02:01Z"),
            // Two units for one tick: a duplicate.
            sample("b", "2026-12-03T18:01:00Z", "b-1", "2026-12-03T18:01:00Z"),
            sample("b", "2026-12-03T18:01:00Z", "b-1x", "2026-12-03T18:01:03Z"),
        ];
        // b's second tick ran (recorded) without a pod left; c's first was decided, no pod
        // yet; c's second was never decided: the one miss.
        let served = BTreeSet::from([("b".to_string(), ticks[1])]);
        let decided = BTreeSet::from([("c".to_string(), ticks[0])]);
        let f = figures(&samples, &owners, &ticks, &served, &decided, 1);
        assert_eq!(f.pods, 4);
        assert_eq!(f.duplicates, 1);
        assert_eq!(f.misses, 1);
        assert_eq!(f.unspawned, 1);
        assert_eq!(f.respawned, 1);
        assert_eq!(
            respawned_cell(&f),
            "1",
            "not split: new attempts not counted"
        );
        let split = Figures {
            respawned: 3224,
            new_attempts: Some(453),
            ..f.clone()
        };
        assert_eq!(
            respawned_cell(&split),
            "3224 (453 new attempts, 2771 takeovers)"
        );
        let none = Figures {
            respawned: 0,
            new_attempts: Some(0),
            ..f.clone()
        };
        assert_eq!(respawned_cell(&none), "0");
        // b's duplicate (created 3 s after the tick) is not its tick's lag: its first pod's is.
        assert_eq!(f.dispatch.max, 2.0);
        assert!(f.start.p50.is_nan(), "no pod started");
        // By tick: the first tick's lags are a's 2 s and b's 0 s (c has no pod); the second's
        // a's 1 s alone.
        let by: Vec<(DateTime<Utc>, f64, usize)> = f
            .by_tick
            .iter()
            .map(|l| (l.tick, l.dispatch.max, l.late))
            .collect();
        assert_eq!(by, [(ticks[0], 2.0, 1), (ticks[1], 1.0, 1)]);
    }

    #[test]
    fn a_report_merges_back_with_its_nan_figures() {
        let stats = json!({"p50": 1.0, "p99": null, "max": null});
        let figures = json!({"pods": 0, "dispatch": stats, "start": stats, "duplicates": 0,
            "misses": 0, "unspawned": 0, "respawned": 0});
        let size = |n: usize, nodes: &str| {
            json!({"measured": "2026-12-03 18:35 UTC", "n": n, "ticks": 3, "every_minutes": 5,
                "nodes": nodes, "cronjob": figures, "cojob": figures,
                "controller_cpu_seconds_per_tick": 1.0, "controller_rss_bytes": 1,
                "kube_controller_manager_cpu_seconds_per_tick": 1.0, "bucket_requests_per_run": 9.0,
                "controller_api_requests_per_tick": 1.0,
                "kube_controller_manager_api_requests_per_tick": 1.0,
                "shared_cpu_seconds_per_tick": 1.0, "machine_busy": null,
                "tick_pickup": {"count": 0.0, "mean": null, "p99_at_most": null}})
        };
        let report = json!({"sizes": [size(1000, "kwok"), size(10, "real")], "recovery": []});
        let path =
            std::env::temp_dir().join(format!("cojob-bench-merge-{}.json", std::process::id()));
        std::fs::write(&path, report.to_string()).unwrap();
        // This run measured N = 10 on the real node again: the report's N = 1 000 joins it.
        let mut results: Vec<SizeResult> = vec![serde_json::from_value(size(10, "real")).unwrap()];
        results[0].measured = "now".into();
        let (mut recoveries, mut costs, mut idles) = (Vec::new(), Vec::new(), Vec::new());
        merge(
            path.to_str().unwrap(),
            &mut results,
            &mut recoveries,
            &mut costs,
            &mut idles,
        )
        .unwrap();
        assert!(costs.is_empty(), "a report without costs merges as none");
        assert!(
            idles.is_empty(),
            "a report without idle jobs merges as none"
        );
        std::fs::remove_file(&path).unwrap();
        let kept: Vec<(usize, Nodes, &str)> = results
            .iter()
            .map(|r| (r.n, r.nodes, r.measured.as_str()))
            .collect();
        assert_eq!(
            kept,
            [
                (10, Nodes::Real, "now"),
                (1000, Nodes::Kwok, "2026-12-03 18:35 UTC")
            ]
        );
        assert!(results[1].cojob.dispatch.p99.is_nan() && results[1].machine_busy.is_nan());
        assert!(tables(&results).starts_with("Measured at: N = 10 (Real): now; N = 1000 (Kwok)"));
        assert!(
            !tables(&results).contains("by tick"),
            "reports from before the lags by tick have no such table"
        );
        assert!(
            !tables(&results).contains("by verb and resource"),
            "reports from before the API requests by verb have no such table"
        );
        results[0].controller_api_requests_per_run = [
            ("create pods".to_string(), 1.0),
            ("patch coordinatedjobs/status".into(), 2.5),
        ]
        .into();
        let table = tables(&results);
        assert!(
            table.contains("| request | N = 10 (real) |\n|---|---|\n| create pods | 1.00 |\n| patch coordinatedjobs/status | 2.50 |\n| **all** | 3.50 |\n"),
            "{table}"
        );
        results[0].controller_api_requests_per_run.clear();
        // A size that kept them has a row per kind, a column per tick.
        let lag = |p99: f64, late: usize| {
            json!({"tick": "2026-12-05T09:25:00Z", "dispatch": {"p50": -78.0, "p99": p99,
                "max": p99}, "late": late})
        };
        let mut with = size(1000, "kwok");
        with["prestart_seconds"] = json!(120);
        with["cojob"]["by_tick"] = json!([lag(8.0, 12), lag(0.0, 0), lag(-1.0, 0)]);
        with["cronjob"]["by_tick"] = json!([lag(38.0, 990), lag(30.0, 980), lag(31.0, 985)]);
        let with: SizeResult = serde_json::from_value(with).unwrap();
        let table = by_tick_table(&[with]);
        assert!(
            table.contains(
                "| 1000 | kwok (simulated) | cojob, prestart 120 s | -78 / 8 / 8 (12 late) | -78 / 0 / 0 (0 late) | -78 / -1 / -1 (0 late) |"
            ),
            "{table}"
        );
        assert!(table.contains("| tick 1 | tick 2 | tick 3 |"), "{table}");
        // A start timeout other than the CRD's default is named too; without one, none is.
        let mut longer = size(6120, "kwok");
        longer["prestart_seconds"] = json!(600);
        longer["start_timeout_seconds"] = json!(1800);
        let longer: SizeResult = serde_json::from_value(longer).unwrap();
        assert_eq!(
            cojob_label(&longer),
            "cojob, prestart 600 s, start timeout 1800 s"
        );
        let default: SizeResult = serde_json::from_value(size(6120, "kwok")).unwrap();
        assert_eq!(cojob_label(&default), "cojob");
        assert!(
            !serde_json::to_string(&default)
                .unwrap()
                .contains("start_timeout"),
            "a report keeps the field only where it was set"
        );
    }
}
