//! The controller's memory at a full history, measured in this process on realistic objects:
//! what each cached run pod costs, three ways, what each CoordinatedJob costs in the job cache
//! with its metric series, and what 10 000 jobs with the chart's default history add up to.
//!
//! ```text
//! cargo bench -p cojob-controller --bench memory
//! ```
//!
//! - **Pods**: copies of `fixtures/run-pod.json`, an ended run pod as the local cluster's API
//!   server returned it (`kubectl get pod -o json`), each with its own name, uid and job. They
//!   are kept as the pod cache kept them before it encoded them (each trimmed pod decoded, an
//!   `Arc<Pod>`: the reference), and in the [`PodCache`] as a pod whose result finalizer is
//!   still held (trimmed) and as one whose outcome is recorded (settled: a history's pod).
//! - **Jobs**: copies of `fixtures/coordinated-job.json`, a CoordinatedJob of `cojob-bench`
//!   with the chart's default history in its status (3 succeeded and 1 failed run), filed in
//!   a kube-runtime reflector store as the controller's job watch files them, plus the job's
//!   two metric series.
//!
//! Heap bytes are counted by a global allocator that adds up what is allocated and freed, so
//! the figures are exact for this build and do not depend on the machine's load; what the
//! process's resident size adds (the allocator's own overhead, buffers in flight, the binary)
//! is not in them. It prints Markdown tables for `docs/benchmarks.md`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use cojob_controller::crd::CoordinatedJob;
use cojob_controller::metrics::Metrics;
use cojob_controller::pod_cache::{PodCache, trim};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{reflector, watcher::Event};

/// Counts the heap bytes in use.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Pods per measurement: a job's history at 10 000 jobs is tens of thousands of pods.
const PODS: usize = 20_000;
/// Pods per job, as the benchmark's jobs keep (`e2e/bench/run`).
const PER_JOB: usize = 10;
/// Jobs in the full-history estimate, the issue's largest size.
const JOBS: usize = 10_000;
/// Finished runs a job keeps by default (`successfulRunsHistoryLimit` 3, `failedRunsHistoryLimit`
/// 1), each with its pod.
const HISTORY: usize = 4;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Heap bytes per item that `fill` leaves allocated (and returns, to keep it alive).
fn per_item<T>(items: usize, fill: impl FnOnce() -> T) -> (f64, T) {
    let before = live();
    let kept = fill();
    ((live() - before) as f64 / items as f64, kept)
}

/// The fixture with its own name, uid and job; `settled` releases its result finalizer (the
/// controller's last step once the run's outcome is recorded).
fn pod(template: &Pod, i: usize, settled: bool) -> Pod {
    let mut pod = template.clone();
    let job = format!("job-{:05}", i / PER_JOB);
    pod.metadata.name = Some(format!("{job}-{:010}-1", i));
    pod.metadata.uid = Some(format!("{:08x}-0000-4000-8000-{:012x}", i, i));
    if let Some(labels) = pod.metadata.labels.as_mut() {
        labels.insert("cojob.dev/job".into(), job.clone());
        labels.insert("cojob.dev/run".into(), format!("{job}-{:010}", i));
    }
    if settled {
        pod.metadata.finalizers = None;
    }
    pod
}

fn filled_cache(pods: &[Pod]) -> PodCache {
    let cache = PodCache::default();
    cache.apply(&Event::Init);
    for p in pods {
        cache.apply(&Event::InitApply(p.clone()));
    }
    cache.apply(&Event::InitDone);
    cache
}

/// Reads every job's pods back, as passes do; seconds per pod.
fn read_back(cache: &PodCache, namespace: &str, jobs: &[String]) -> anyhow::Result<f64> {
    let started = Instant::now();
    for job in jobs {
        let copies = cache.job_pods(namespace, job);
        anyhow::ensure!(
            copies.as_ref().is_some_and(|c| c.len() == PER_JOB),
            "job {job} is not served whole"
        );
        black_box(copies);
    }
    Ok(started.elapsed().as_secs_f64() / PODS as f64)
}

/// What one cached pod costs, three ways.
struct PodFigures {
    reference: f64,
    trimmed: f64,
    settled: f64,
}

fn pods() -> anyhow::Result<PodFigures> {
    let template: Pod = serde_json::from_str(include_str!("fixtures/run-pod.json"))?;
    let held: Vec<Pod> = (0..PODS).map(|i| pod(&template, i, false)).collect();
    let settled: Vec<Pod> = (0..PODS).map(|i| pod(&template, i, true)).collect();
    let namespace = template.metadata.namespace.clone().unwrap_or_default();

    // The reference: each trimmed pod kept decoded, filed by job then name.
    let (reference_bytes, reference) = per_item(PODS, || {
        let mut by_job: BTreeMap<String, BTreeMap<String, Arc<Pod>>> = BTreeMap::new();
        for p in &held {
            let job = p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("cojob.dev/job"))
                .cloned()
                .unwrap_or_default();
            by_job.entry(job).or_default().insert(
                p.metadata.name.clone().unwrap_or_default(),
                Arc::new(trim(p)),
            );
        }
        by_job
    });
    let (trimmed_bytes, trimmed) = per_item(PODS, || filled_cache(&held));
    let (settled_bytes, settled_cache) = per_item(PODS, || filled_cache(&settled));
    for cache in [&trimmed, &settled_cache] {
        anyhow::ensure!(
            cache.len() == PODS,
            "the cache holds {} pods, not {PODS}",
            cache.len()
        );
    }

    // Reading one job's pods back, as a pass does: a clone each (reference), a decode each
    // (cache).
    let jobs: Vec<String> = reference.keys().cloned().collect();
    let started = Instant::now();
    for job in &jobs {
        let copies: Vec<Pod> = reference[job].values().map(|p| Pod::clone(p)).collect();
        black_box(copies);
    }
    let reference_read = started.elapsed().as_secs_f64() / PODS as f64;
    let trimmed_read = read_back(&trimmed, &namespace, &jobs)?;
    let settled_read = read_back(&settled_cache, &namespace, &jobs)?;

    let fixture = serde_json::to_vec(&template)?.len();
    println!(
        "{PODS} copies of an ended run pod ({fixture} bytes of JSON as the API server sends it), {PER_JOB} per job.\n"
    );
    println!(
        "| kept as | heap bytes per pod | ratio to the reference | encoded bytes per pod | read back, µs per pod | ratio |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| trimmed `Pod`, decoded (the cache before it encoded; reference) | {reference_bytes:.0} | 1.00 | | {:.2} | 1.00 |",
        reference_read * 1e6
    );
    for (what, bytes, cache, read) in [
        (
            "trimmed `Pod`, encoded (`PodCache`, result finalizer held)",
            trimmed_bytes,
            &trimmed,
            trimmed_read,
        ),
        (
            "settled `Pod`, encoded (`PodCache`, outcome recorded: a history's pod)",
            settled_bytes,
            &settled_cache,
            settled_read,
        ),
    ] {
        println!(
            "| {what} | {bytes:.0} | {:.2} | {:.0} | {:.2} | {:.2} |",
            bytes / reference_bytes,
            cache.encoded_bytes() as f64 / PODS as f64,
            read * 1e6,
            read / reference_read
        );
    }
    black_box((reference, trimmed, settled_cache));
    Ok(PodFigures {
        reference: reference_bytes,
        trimmed: trimmed_bytes,
        settled: settled_bytes,
    })
}

/// What one CoordinatedJob costs.
struct JobFigures {
    /// In the job cache, its template kept encoded.
    cached: f64,
    /// The same with its template decoded (the job cache before `PodTemplate`).
    reference: f64,
    /// Its two metric series.
    series: f64,
}

/// What one CoordinatedJob costs in the job cache, and its two metric series.
fn jobs() -> anyhow::Result<JobFigures> {
    let template: CoordinatedJob =
        serde_json::from_str(include_str!("fixtures/coordinated-job.json"))?;
    let copies: Vec<CoordinatedJob> = (0..JOBS)
        .map(|i| {
            let mut job = template.clone();
            job.metadata.name = Some(format!("co-{i}"));
            job.metadata.uid = Some(format!("{:08x}-0000-4000-8000-{:012x}", i, i));
            job
        })
        .collect();
    // The template alone, encoded as the job keeps it and decoded as it was kept before.
    let (encoded, templates) = per_item(JOBS, || {
        copies
            .iter()
            .map(|j| j.spec.template.clone())
            .collect::<Vec<_>>()
    });
    // Copies, as the reflector's store keeps (it clones each object it is sent), so their
    // vectors are not a decoder's growth but exact.
    let specs = templates
        .iter()
        .map(|t| t.decode())
        .collect::<Result<Vec<_>, _>>()?;
    let (decoded, copied) = per_item(JOBS, || specs.to_vec());
    black_box((templates, specs, copied));
    let (job_bytes, (reader, writer)) = per_item(JOBS, || {
        let (reader, mut writer) = reflector::store::<CoordinatedJob>();
        writer.apply_watcher_event(&Event::Init);
        for job in &copies {
            writer.apply_watcher_event(&Event::InitApply(job.clone()));
        }
        writer.apply_watcher_event(&Event::InitDone);
        (reader, writer)
    });
    anyhow::ensure!(
        reader.len() == JOBS,
        "the store holds {} jobs, not {JOBS}",
        reader.len()
    );
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    let store = runtime.block_on(cojob::Store::open("memory://"))?;
    let metrics = Metrics::new(store);
    let (series_bytes, ()) = per_item(JOBS, || {
        for job in &copies {
            let name = job.metadata.name.as_deref().unwrap_or_default();
            metrics.job_active("bench-n10000-ifrb1xf8", name, 0);
            metrics.run_ended(
                cojob_controller::metrics::RunOutcome::Succeeded,
                "bench-n10000-ifrb1xf8",
                name,
                1.0,
            );
        }
    });
    black_box((reader, writer, metrics));
    Ok(JobFigures {
        cached: job_bytes,
        reference: job_bytes - encoded + decoded,
        series: series_bytes,
    })
}

fn main() -> anyhow::Result<()> {
    let pod = pods()?;
    let job = jobs()?;
    println!(
        "\nA CoordinatedJob with the default history in its status, in the job cache: {:.0} heap bytes with its template decoded, {:.0} with it encoded ({:.2}); its two metric series: {:.0}.\n",
        job.reference,
        job.cached,
        job.cached / job.reference,
        job.series
    );
    println!(
        "| {JOBS} jobs with the default history ({HISTORY} finished runs each, {} pods) | heap bytes per job | MiB in all | ratio |",
        JOBS * HISTORY
    );
    println!("|---|---|---|---|");
    let reference = job.reference + job.series + HISTORY as f64 * pod.reference;
    for (what, per_job) in [
        (
            "templates and pods decoded (reference: the controller before the encoded pod cache)",
            reference,
        ),
        (
            "templates decoded, pods trimmed and encoded (before `PodTemplate` and settled pods)",
            job.reference + job.series + HISTORY as f64 * pod.trimmed,
        ),
        (
            "templates encoded, history pods settled and encoded (now)",
            job.cached + job.series + HISTORY as f64 * pod.settled,
        ),
    ] {
        println!(
            "| {what} | {per_job:.0} | {:.0} | {:.2} |",
            JOBS as f64 * per_job / f64::from(1 << 20),
            per_job / reference
        );
    }
    Ok(())
}
