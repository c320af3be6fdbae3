//! A tour of the primitives against any store: `cargo run --example tour -- [URL]`
//! (default `memory://`). It prints what each step did and the store requests it took.

use cojob::{Db, Error, LeaseOptions};
use serde_json::json;
use std::time::Duration;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".into());
    let prefix = format!("tour-{}", &cojob::new_holder()[..8]).replace(['-', '_'], "x");
    let db = Db::open(&url).await?.with_prefix(&prefix)?;
    db.store().verify_conditional_writes().await?;
    println!("store {url}: conditional writes verified; keys under {prefix}/");

    let tick = "jobs/default/nightly/ticks/2026-08-09T02:00:00.000000Z";
    let a = db.claim(tick, &json!({"runId": "nightly-1"})).await?;
    let b = db.claim(tick, &json!({"runId": "nightly-2"})).await?;
    println!(
        "claim: first won={} second won={} → both run {}",
        a.won, b.won, b.value["runId"]
    );

    let key = "jobs/default/nightly/runs/nightly-1/lease";
    let ttl = Duration::from_secs(30);
    let opts = |h: String| {
        LeaseOptions::new(h, ttl).state_fn(|s| {
            if s.is_some_and(|s| s["status"] == "succeeded") {
                return Err("run already succeeded".into());
            }
            let attempt = s.and_then(|s| s["attempt"].as_u64()).unwrap_or(0) + 1;
            Ok(json!({"status": "running", "attempt": attempt}))
        })
    };
    let mut lease = db
        .lease(key, opts(cojob::new_holder()))
        .await?
        .expect("fresh lease");
    println!("lease: epoch {} state {}", lease.epoch(), lease.state());
    db.cooperative_write(key, |s| {
        cojob::lease::merge(s, json!({"cancel_requested": true}))
    })
    .await?;
    lease.renew().await?;
    println!(
        "renew absorbed a cooperative write: state {}",
        lease.state()
    );
    lease
        .release(Some(json!({"status": "succeeded", "exitCode": 0})))
        .await?;
    match db.lease(key, opts(cojob::new_holder())).await {
        Err(Error::Aborted { source, .. }) => println!("re-acquire refused: {source}"),
        other => anyhow::bail!("a terminal run was re-acquired: {other:?}"),
    }

    let counter = db.doc::<u64>("counters/runs");
    for _ in 0..3 {
        counter.update(|n| n + 1, Some(0)).await?;
    }
    println!(
        "doc: counter = {}",
        counter.get().await?.map(|(n, _)| n).unwrap_or(0)
    );
    println!("store requests: {}", db.store().stats());
    for k in db.store().list(&prefix).await? {
        db.store().delete(&k).await?;
    }
    Ok(())
}
