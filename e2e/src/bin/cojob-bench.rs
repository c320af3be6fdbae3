//! Punctuality and cost, side by side with CronJob, on the real cluster (`e2e/bench/run`).
//!
//! ```text
//! cojob-bench [--n 10,100] [--ticks 3] [--metrics 127.0.0.1:18080] [--json OUT] [--check]
//! ```
//!
//! For each N: a fresh namespace with N CronJobs and N CoordinatedJobs, all on `* * * * *`,
//! with the same pod (busybox `true`, host network). They run for `--ticks` minute ticks; then
//! both kinds are suspended and the pods are read back:
//!
//! - **dispatch lag**: the pod's creation minus the tick it serves (for CronJob, the tick is its
//!   Job's `batch.kubernetes.io/cronjob-scheduled-timestamp`; for cojob, `COJOB_FIRE_TIME`);
//! - **start lag**: the workload container's start minus the tick;
//! - **duplicates**: more than one Job (CronJob) or run (cojob) for one tick of one object;
//! - **misses**: ticks of the window without any pod, read once every object of both kinds
//!   has decided the last tick (`status.lastScheduleTime`, waited for up to 2 minutes), so a
//!   late decision counts as lag, not as a miss; each miss is printed.
//!
//! Timestamps are the API server's, whole seconds. The controller's CPU time and resident
//! memory come from `/proc` (the cluster runs on this machine), its bucket requests from its
//! `/metrics` (`--metrics`), and the API server requests of each controller from the API
//! server's own `/metrics` (dispatched requests by flow schema). `--json` writes the figures; `--check` fails on any duplicate or
//! miss (CI runs N = 10 that way).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use chrono::{DateTime, Timelike, Utc};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

struct Options {
    sizes: Vec<usize>,
    ticks: u32,
    metrics: String,
    json: Option<String>,
    check: bool,
    docs: Option<String>,
    command: String,
}

fn options() -> anyhow::Result<Options> {
    let mut o = Options {
        sizes: vec![10],
        ticks: 3,
        metrics: "127.0.0.1:18080".into(),
        json: None,
        check: false,
        docs: None,
        command: "cojob-bench".into(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--n" => {
                o.sizes = value()?
                    .split(',')
                    .map(|n| n.trim().parse().context("--n takes numbers, e.g. 10,100"))
                    .collect::<anyhow::Result<_>>()?
            }
            "--ticks" => o.ticks = value()?.parse().context("--ticks takes a number")?,
            "--metrics" => o.metrics = value()?,
            "--json" => o.json = Some(value()?),
            "--check" => o.check = true,
            "--docs" => o.docs = Some(value()?),
            "--command" => o.command = value()?,
            "-h" | "--help" => {
                println!(
                    "cojob-bench [--n 10,100] [--ticks 3] [--metrics HOST:PORT] [--json OUT] [--check] [--docs FILE --command LINE]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} (see --help)"),
        }
    }
    // Both kinds keep 10 finished runs (and their pods): more ticks could not be read back.
    ensure!((1..=10).contains(&o.ticks), "--ticks must be within 1..=10");
    ensure!(
        o.sizes.iter().all(|n| (1..=10_000).contains(n)),
        "--n sizes must be within 1..=10000"
    );
    Ok(o)
}

/// The pod both kinds run: as small as a pod gets on this cluster.
fn pod_spec() -> Value {
    json!({
        "hostNetwork": true,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "main",
            "image": cojob_e2e::image("busybox"),
            "imagePullPolicy": "Never",
            "command": ["true"],
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}
        }]
    })
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
#[derive(Debug, serde::Serialize)]
struct Figures {
    pods: usize,
    dispatch: Stats,
    start: Stats,
    duplicates: usize,
    misses: usize,
    /// Runs that took more than one attempt's lease (cojob: epoch above 1; CronJob: 0).
    respawned: usize,
}

#[derive(Debug, serde::Serialize)]
struct Stats {
    p50: f64,
    p99: f64,
    max: f64,
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
/// outcome is recorded). `respawned`: runs that took more than one lease epoch.
fn figures(
    samples: &[Sample],
    owners: &[String],
    ticks: &[DateTime<Utc>],
    served: &BTreeSet<(String, DateTime<Utc>)>,
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
    let missed: Vec<(String, DateTime<Utc>)> = owners
        .iter()
        .flat_map(|o| ticks.iter().map(move |t| (o.clone(), *t)))
        .filter(|k| !units.contains_key(k) && !served.contains(k))
        .collect();
    for (owner, tick) in &missed {
        println!("bench: no pod for {owner} at {tick}");
    }
    let misses = missed.len();
    let in_window: Vec<&Sample> = samples.iter().filter(|s| ticks.contains(&s.tick)).collect();
    Figures {
        pods: in_window.len(),
        dispatch: stats(in_window.iter().map(|s| secs(s.created, s.tick)).collect()),
        start: stats(
            in_window
                .iter()
                .filter_map(|s| s.started.map(|st| secs(st, s.tick)))
                .collect(),
        ),
        duplicates,
        misses,
        respawned,
    }
}

fn main_started(pod: &Pod) -> Option<DateTime<Utc>> {
    let status = pod.status.as_ref()?;
    let main = status
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == "main")?;
    let state = main.state.as_ref()?;
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
    DateTime::from_timestamp(at.0.as_second(), 0)
}

fn created(pod: &Pod) -> Option<DateTime<Utc>> {
    let t = pod.metadata.creation_timestamp.as_ref()?;
    DateTime::from_timestamp(t.0.as_second(), 0)
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

/// `cojob controller`, as the chart runs it.
fn is_cojob_controller(argv: &[String]) -> bool {
    argv.first()
        .is_some_and(|a| a.ends_with("/cojob") || a == "cojob")
        && argv.get(1).is_some_and(|a| a == "controller")
}

/// kube-controller-manager (its CronJob controller runs inside it, with every other one).
fn is_kube_controller_manager(argv: &[String]) -> bool {
    argv.first().is_some_and(|a| {
        a.rsplit('/')
            .next()
            .is_some_and(|b| b.starts_with("kube-controller-manager"))
    })
}

/// The sum of the controller's bucket request counters, from its `/metrics`.
async fn bucket_requests(metrics: &str) -> anyhow::Result<f64> {
    let text = cojob_e2e::run_tool(
        "curl",
        &["-sS", "--fail", &format!("http://{metrics}/metrics")],
    )
    .await
    .with_context(|| format!("scraping the controller's /metrics at {metrics}"))?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("cojob_store_requests_total{"))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum())
}

/// API server requests dispatched so far, by who sent them: the cojob controller (its service
/// account outside kube-system: flow schema `service-accounts`, which nothing else uses during
/// the bench) and the kube-controller-manager (its controllers run under kube-system service
/// accounts, plus its own identity; all of them, not only CronJob's and Job's).
async fn api_requests() -> anyhow::Result<(f64, f64)> {
    let text = cojob_e2e::run_tool("kubectl", &["get", "--raw", "/metrics"])
        .await
        .context("scraping the API server's /metrics")?;
    let (mut cojob, mut kcm) = (0.0, 0.0);
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_flowcontrol_dispatched_requests_total{"))
    {
        let Some(value) = line
            .rsplit_once(' ')
            .and_then(|(_, v)| v.parse::<f64>().ok())
        else {
            continue;
        };
        if line.contains("flow_schema=\"service-accounts\"") {
            cojob += value;
        } else if line.contains("flow_schema=\"kube-system-service-accounts\"")
            || line.contains("flow_schema=\"kube-controller-manager\"")
        {
            kcm += value;
        }
    }
    Ok((cojob, kcm))
}

/// The next minute boundary after `t`.
fn next_minute(t: DateTime<Utc>) -> DateTime<Utc> {
    let floor = t
        .with_second(0)
        .and_then(|t| t.with_nanosecond(0))
        .unwrap_or(t);
    floor + chrono::Duration::minutes(1)
}

#[derive(serde::Serialize)]
struct SizeResult {
    n: usize,
    ticks: u32,
    cronjob: Figures,
    cojob: Figures,
    controller_cpu_seconds_per_tick: f64,
    controller_rss_bytes: u64,
    kube_controller_manager_cpu_seconds_per_tick: f64,
    bucket_requests_per_run: f64,
    controller_api_requests_per_tick: f64,
    kube_controller_manager_api_requests_per_tick: f64,
}

async fn run_size(client: &Client, o: &Options, n: usize) -> anyhow::Result<SizeResult> {
    let ns = cojob_e2e::TestNamespace::create(client, &format!("bench-n{n}")).await;
    cojob_e2e::provide_store_credentials(client, &ns.name).await;
    let result = measure(client, o, n, &ns.name).await;
    ns.cleanup().await;
    result
}

async fn measure(client: &Client, o: &Options, n: usize, ns: &str) -> anyhow::Result<SizeResult> {
    let cronjobs: Api<CronJob> = Api::namespaced(client.clone(), ns);
    let cojobs = coordinated_jobs(client, ns);
    // Create both sets in the first half of a minute, so that neither kind sees the next tick
    // as already past.
    let mut now = Utc::now();
    if now.second() > 30 {
        tokio::time::sleep(Duration::from_secs(u64::from(62 - now.second()))).await;
        now = Utc::now();
    }
    println!("bench: N = {n}: creating {n} CronJobs and {n} CoordinatedJobs in {ns}");
    for i in 0..n {
        let cj: CronJob = serde_json::from_value(json!({
            "metadata": {"name": format!("cj-{i}")},
            "spec": {
                "schedule": "* * * * *",
                "concurrencyPolicy": "Allow",
                "successfulJobsHistoryLimit": 10,
                "jobTemplate": {"spec": {"backoffLimit": 0, "template": {"spec": pod_spec()}}}
            }
        }))?;
        cronjobs.create(&PostParams::default(), &cj).await?;
        let co: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cojob.dev/v1alpha1",
            "kind": "CoordinatedJob",
            "metadata": {"name": format!("co-{i}")},
            "spec": {
                "schedule": "* * * * *",
                "concurrencyPolicy": "Allow",
                "successfulRunsHistoryLimit": 10,
                "template": {"spec": pod_spec()}
            }
        }))?;
        cojobs.create(&PostParams::default(), &co).await?;
    }
    let created_all = Utc::now();
    let first = next_minute(created_all.max(now));
    let ticks: Vec<DateTime<Utc>> = (0..o.ticks)
        .map(|k| first + chrono::Duration::minutes(i64::from(k)))
        .collect();
    let (cpu0, _) = process_cost(is_cojob_controller);
    let (kcm0, _) = process_cost(is_kube_controller_manager);
    let req0 = bucket_requests(&o.metrics).await?;
    let (api0, kcm_api0) = api_requests().await?;
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
    let (cpu1, rss) = process_cost(is_cojob_controller);
    let (kcm1, _) = process_cost(is_kube_controller_manager);
    let req1 = bucket_requests(&o.metrics).await?;
    let (api1, kcm_api1) = api_requests().await?;
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
        let cron = cronjobs.list(&ListParams::default()).await?.items;
        let co = cojobs.list(&ListParams::default()).await?.items;
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
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // Stop both kinds before reading back.
    let suspend = json!({"spec": {"suspend": true}});
    for i in 0..n {
        cronjobs
            .patch(
                &format!("cj-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&suspend),
            )
            .await?;
        cojobs
            .patch(
                &format!("co-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&suspend),
            )
            .await?;
    }

    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let mut scheduled: BTreeMap<String, (String, DateTime<Utc>)> = BTreeMap::new();
    for job in jobs.list(&ListParams::default()).await?.items {
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
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let (mut cron, mut co) = (Vec::new(), Vec::new());
    for pod in pods.list(&ListParams::default()).await?.items {
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
    let (mut served, mut respawned) = (BTreeSet::new(), 0);
    for job in cojobs.list(&ListParams::default()).await?.items {
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
                }
                if run.get("phase").and_then(Value::as_str) == Some("succeeded") {
                    served.insert((job.name_any(), tick));
                }
            }
        }
    }
    let co_figures = figures(&co, &co_owners, &ticks, &served, respawned);
    let runs = co_figures.pods.max(1) as f64;
    Ok(SizeResult {
        n,
        ticks: o.ticks,
        cronjob: figures(&cron, &cron_owners, &ticks, &BTreeSet::new(), 0),
        cojob: co_figures,
        controller_cpu_seconds_per_tick: (cpu1 - cpu0) / f64::from(o.ticks),
        controller_rss_bytes: rss,
        kube_controller_manager_cpu_seconds_per_tick: (kcm1 - kcm0) / f64::from(o.ticks),
        bucket_requests_per_run: (req1 - req0) / runs,
        controller_api_requests_per_tick: (api1 - api0) / f64::from(o.ticks),
        kube_controller_manager_api_requests_per_tick: (kcm_api1 - kcm_api0) / f64::from(o.ticks),
    })
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}", a / b)
    } else if a == 0.0 {
        "= (both 0)".into()
    } else {
        format!("∞ ({a} vs 0)")
    }
}

/// The figures as two Markdown tables.
fn tables(results: &[SizeResult]) -> String {
    let mut t = String::from(
        "| N | ticks | kind | pods | dispatch lag p50 / p99 / max (s) | start lag p50 / p99 / max (s) | duplicates | misses | respawned runs |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        for (kind, f) in [("CronJob", &r.cronjob), ("cojob", &r.cojob)] {
            t.push_str(&format!(
                "| {} | {} | {kind} | {} | {} / {} / {} | {} / {} / {} | {} | {} | {} |\n",
                r.n,
                r.ticks,
                f.pods,
                f.dispatch.p50,
                f.dispatch.p99,
                f.dispatch.max,
                f.start.p50,
                f.start.p99,
                f.start.max,
                f.duplicates,
                f.misses,
                f.respawned
            ));
        }
    }
    t.push_str(
        "\n| N | dispatch lag p99, cojob / CronJob | start lag p99, cojob / CronJob | cojob controller CPU s per tick | kube-controller-manager CPU s per tick | API requests per tick, cojob controller / kube-controller-manager | cojob controller RSS (MiB) | bucket requests per run |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        t.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.0} / {:.0} | {:.1} | {:.1} |\n",
            r.n,
            ratio(r.cojob.dispatch.p99, r.cronjob.dispatch.p99),
            ratio(r.cojob.start.p99, r.cronjob.start.p99),
            r.controller_cpu_seconds_per_tick,
            r.kube_controller_manager_cpu_seconds_per_tick,
            r.controller_api_requests_per_tick,
            r.kube_controller_manager_api_requests_per_tick,
            r.controller_rss_bytes as f64 / (1024.0 * 1024.0),
            r.bucket_requests_per_run
        ));
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = options()?;
    let client = cojob_e2e::client().await;
    let mut results = Vec::new();
    for &n in &o.sizes {
        results.push(run_size(&client, &o, n).await?);
    }
    let tables = tables(&results);
    println!("\n{tables}");
    if let Some(path) = &o.docs {
        write_docs(path, &o.command, &tables)?;
        println!("bench: wrote the figures into {path}");
    }
    if let Some(path) = &o.json {
        std::fs::write(path, serde_json::to_string_pretty(&results)?)
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
        println!("bench: check passed: no duplicate, no miss");
    }
    Ok(())
}
