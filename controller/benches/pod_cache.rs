//! Memory per cached run pod, and what reading one back costs: the pod cache
//! ([`cojob_controller::pod_cache::PodCache`]) against a reference that keeps each trimmed
//! pod decoded (an `Arc<Pod>` per pod, as the cache did before it encoded them), both in this
//! process, on the same pods.
//!
//! ```text
//! cargo bench -p cojob-controller --bench pod_cache
//! ```
//!
//! The pods are copies of `fixtures/run-pod.json`, an ended run pod as the local cluster's API
//! server returned it (`kubectl get pod -o json`), each with its own name, uid and job. Heap
//! bytes are counted by a global allocator that adds up what is allocated and freed, so the
//! figures are exact for this build and do not depend on the machine's load. It prints a
//! Markdown table for `docs/benchmarks.md`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use cojob_controller::pod_cache::{PodCache, trim};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;

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

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// The fixture with its own name, uid and job.
fn pod(template: &Pod, i: usize) -> Pod {
    let mut pod = template.clone();
    let job = format!("job-{:05}", i / PER_JOB);
    pod.metadata.name = Some(format!("{job}-{:010}-1", i));
    pod.metadata.uid = Some(format!("{:08x}-0000-4000-8000-{:012x}", i, i));
    if let Some(labels) = pod.metadata.labels.as_mut() {
        labels.insert("cojob.dev/job".into(), job.clone());
        labels.insert("cojob.dev/run".into(), format!("{job}-{:010}", i));
    }
    pod
}

fn main() -> anyhow::Result<()> {
    let template: Pod = serde_json::from_str(include_str!("fixtures/run-pod.json"))?;
    let pods: Vec<Pod> = (0..PODS).map(|i| pod(&template, i)).collect();
    let namespace = template.metadata.namespace.clone().unwrap_or_default();

    // The reference: each trimmed pod kept decoded, filed by job then name.
    let before = live();
    let mut reference: BTreeMap<String, BTreeMap<String, Arc<Pod>>> = BTreeMap::new();
    for p in &pods {
        let job = p
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("cojob.dev/job"))
            .cloned()
            .unwrap_or_default();
        reference.entry(job).or_default().insert(
            p.metadata.name.clone().unwrap_or_default(),
            Arc::new(trim(p)),
        );
    }
    let reference_bytes = (live() - before) as f64 / PODS as f64;

    let before = live();
    let cache = PodCache::default();
    cache.apply(&Event::Init);
    for p in &pods {
        cache.apply(&Event::InitApply(p.clone()));
    }
    cache.apply(&Event::InitDone);
    let cache_bytes = (live() - before) as f64 / PODS as f64;
    anyhow::ensure!(
        cache.len() == PODS,
        "the cache holds {} pods, not {PODS}",
        cache.len()
    );

    // Reading one job's pods back, as a pass does: a clone each (reference), a decode each
    // (cache).
    let jobs: Vec<String> = reference.keys().cloned().collect();
    let started = Instant::now();
    for job in &jobs {
        let copies: Vec<Pod> = reference[job].values().map(|p| Pod::clone(p)).collect();
        black_box(copies);
    }
    let reference_read = started.elapsed().as_secs_f64() / PODS as f64;
    let started = Instant::now();
    for job in &jobs {
        let copies = cache.job_pods(&namespace, job);
        anyhow::ensure!(
            copies.as_ref().is_some_and(|c| c.len() == PER_JOB),
            "job {job} is not served whole"
        );
        black_box(copies);
    }
    let cache_read = started.elapsed().as_secs_f64() / PODS as f64;

    let fixture = serde_json::to_vec(&template)?.len();
    println!(
        "{PODS} copies of an ended run pod ({fixture} bytes of JSON as the API server sends it), {PER_JOB} per job.\n"
    );
    println!(
        "| kept as | heap bytes per pod | ratio to the reference | read back, µs per pod | ratio |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| trimmed `Pod`, decoded (reference) | {reference_bytes:.0} | 1.00 | {:.2} | 1.00 |",
        reference_read * 1e6
    );
    println!(
        "| trimmed `Pod`, encoded (`PodCache`) | {cache_bytes:.0} | {:.2} | {:.2} | {:.2} |",
        cache_bytes / reference_bytes,
        cache_read * 1e6,
        cache_read / reference_read
    );
    println!(
        "\nencoded copies alone: {:.0} bytes per pod",
        cache.encoded_bytes() as f64 / PODS as f64
    );
    black_box(reference);
    Ok(())
}
