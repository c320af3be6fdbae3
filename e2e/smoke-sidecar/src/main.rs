//! The smoke test's sidecar (`e2e/tests/smoke.rs`): proves that a native sidecar starts before
//! the workload, reaches the bucket, and is terminated only after the workload has exited.
//!
//! ```text
//! cojob-smoke-sidecar BUCKET_URL KEY
//! ```
//!
//! Claims `<KEY>/started`, waits for SIGTERM or SIGINT, then claims `<KEY>/stopped`. The store's
//! credentials come from the environment (`AWS_*`). It lives in the end-to-end image
//! (`localhost/cojob/busybox:e2e`, at `/usr/local/bin/cojob-smoke-sidecar`), not in cojob's.

use anyhow::Context;
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};

fn now() -> String {
    cojob::json::format_time(chrono::Utc::now())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(bucket), Some(key), None) = (args.next(), args.next(), args.next()) else {
        anyhow::bail!("usage: cojob-smoke-sidecar BUCKET_URL KEY");
    };
    let db = cojob::Db::open(&bucket)
        .await
        .with_context(|| format!("opening {bucket}"))?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let started = db
        .claim(&format!("{key}/started"), &json!({"at": now()}))
        .await?;
    eprintln!("smoke sidecar: started (claim won: {})", started.won);
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    db.claim(&format!("{key}/stopped"), &json!({"at": now()}))
        .await?;
    eprintln!("smoke sidecar: stopped on signal");
    Ok(())
}
