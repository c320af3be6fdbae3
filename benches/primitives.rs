//! Benchmark of the coordination primitives: store requests per operation, median latency as a
//! ratio to one raw PUT on the same store in the same run, and contended `doc.update`
//! throughput.
//!
//! ```text
//! cargo bench --bench primitives -- memory://
//! cargo bench --bench primitives -- "file:///tmp/cojob-bench"
//! cargo bench --bench primitives -- s3://cojob-test     # with the AWS_* variables of ci/test-servers
//! ```
//! Every run uses a fresh key prefix; it prints Markdown tables for `docs/benchmarks.md`.

use cojob::store::StoreStats;
use cojob::{Db, LeaseOptions, PutMode, Store};
use std::future::Future;
use std::time::{Duration, Instant};

const SAMPLES: usize = 40;
const THROUGHPUT_WINDOW: Duration = Duration::from_secs(3);
const TTL: Duration = Duration::from_secs(60);

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort_unstable();
    xs[xs.len() / 2]
}

/// Times `SAMPLES` runs of `op(i)` and returns the median.
async fn time<F, Fut>(mut op: F) -> Duration
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut xs = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES {
        let t = Instant::now();
        op(i).await;
        xs.push(t.elapsed());
    }
    median(xs)
}

fn counts(s: &StoreStats) -> String {
    let mut parts = Vec::new();
    if s.gets() > 0 {
        parts.push(format!("{} GET", s.gets()));
    }
    if s.puts() > 0 {
        parts.push(format!("{} PUT", s.puts()));
    }
    parts.join(" + ")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .unwrap_or_else(|| "memory://".to_string());
    let base = Store::open(&url).await?;
    base.verify_conditional_writes().await?;
    let prefix = format!("bench-{}", &cojob::new_holder()[..10]).replace(['-', '_'], "x");
    let db = Db::new(base.clone()).with_prefix(&prefix)?;
    let store = db.store().clone();
    println!("## {url}\n");

    // ---- requests per primitive
    println!("| operation | store requests | minimum |\n|---|---|---|");
    let row =
        |name: &str, s: StoreStats, min: &str| println!("| {name} | {} | {min} |", counts(&s));
    let b = store.stats();
    db.claim("count/claim", &1).await?;
    row("claim won", store.stats().since(&b), "1 PUT");
    let b = store.stats();
    db.claim("count/claim", &2).await?;
    row("claim lost", store.stats().since(&b), "1 PUT + 1 GET");
    let b = store.stats();
    let mut lease = db
        .lease("count/lease", LeaseOptions::new(cojob::new_holder(), TTL))
        .await?
        .ok_or("lease unexpectedly held")?;
    row("fresh lease", store.stats().since(&b), "1 GET + 1 PUT");
    let b = store.stats();
    lease.renew().await?;
    row("renew", store.stats().since(&b), "1 PUT");
    let b = store.stats();
    lease.release(None).await?;
    row("release", store.stats().since(&b), "1 PUT");
    let doc = db.doc::<u64>("count/doc");
    doc.update(|n| n, Some(0)).await?;
    let b = store.stats();
    doc.update(|n| n + 1, None).await?;
    row(
        "uncontended doc.update",
        store.stats().since(&b),
        "1 GET + 1 PUT",
    );
    println!();

    // ---- latency, as a ratio to one raw PUT (after a warm-up, so connections are open)
    for i in 0..SAMPLES {
        store
            .put(
                &format!("{prefix}/warm/{i}"),
                "{}".into(),
                PutMode::Overwrite,
            )
            .await?;
        store.get(&format!("{prefix}/warm/{i}")).await?;
    }
    let put = time(|i| {
        let s = store.clone();
        let key = format!("{prefix}/lat/put/{i}");
        async move {
            s.put(&key, "{}".into(), PutMode::Overwrite)
                .await
                .expect("put");
        }
    })
    .await;
    let claim_won = time(|i| {
        let db = db.clone();
        async move {
            db.claim(&format!("lat/claim/{i}"), &i)
                .await
                .expect("claim");
        }
    })
    .await;
    let claim_lost = time(|i| {
        let db = db.clone();
        async move {
            db.claim(&format!("lat/claim/{i}"), &0)
                .await
                .expect("claim");
        }
    })
    .await;
    let lease_fresh = time(|i| {
        let db = db.clone();
        async move {
            db.lease(
                &format!("lat/lease/{i}"),
                LeaseOptions::new(cojob::new_holder(), TTL),
            )
            .await
            .expect("lease");
        }
    })
    .await;
    let mut held = db
        .lease("lat/held", LeaseOptions::new(cojob::new_holder(), TTL))
        .await?
        .ok_or("held")?;
    let mut renews = Vec::new();
    for _ in 0..SAMPLES {
        let t = Instant::now();
        held.renew().await?;
        renews.push(t.elapsed());
    }
    let renew = median(renews);
    let counter = db.doc::<u64>("lat/doc");
    counter.update(|n| n, Some(0)).await?;
    let update = time(|_| {
        let c = counter.clone();
        async move {
            c.update(|n| n + 1, None).await.expect("update");
        }
    })
    .await;
    println!("| operation | median | ratio to one PUT |\n|---|---|---|");
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for (name, d) in [
        ("raw PUT (reference)", put),
        ("claim won", claim_won),
        ("claim lost", claim_lost),
        ("fresh lease", lease_fresh),
        ("renew", renew),
        ("doc.update (uncontended)", update),
    ] {
        println!("| {name} | {:.1} µs | {:.2} |", us(d), us(d) / us(put));
    }
    println!();

    // ---- contended throughput
    println!("| writers | successful doc.update/s | lost races per success |\n|---|---|---|");
    for writers in [1usize, 4, 16] {
        let key = format!("tp/{writers}");
        db.doc::<u64>(&key).update(|n| n, Some(0)).await?;
        let b = store.stats();
        let start = Instant::now();
        let tasks: Vec<_> = (0..writers)
            .map(|_| {
                let doc = db.doc::<u64>(&key).max_attempts(u32::MAX);
                tokio::spawn(async move {
                    let mut done = 0u64;
                    while start.elapsed() < THROUGHPUT_WINDOW {
                        doc.update(|n| n + 1, None).await.expect("update");
                        done += 1;
                    }
                    done
                })
            })
            .collect();
        let mut total = 0;
        for t in tasks {
            total += t.await?;
        }
        let secs = start.elapsed().as_secs_f64();
        let used = store.stats().since(&b);
        let conflicts = used.count(
            cojob::error::Op::PutIfMatch,
            cojob::store::Outcome::Conflict,
        );
        let (stored, _) = db.doc::<u64>(&key).get().await?.ok_or("counter")?;
        assert_eq!(stored, total, "every successful update is counted once");
        println!(
            "| {writers} | {:.0} | {:.2} |",
            total as f64 / secs,
            conflicts as f64 / total.max(1) as f64
        );
    }
    println!();
    // Clean up what this run wrote.
    for key in base.list(&prefix).await? {
        base.delete(&key).await?;
    }
    Ok(())
}
