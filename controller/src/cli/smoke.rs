//! The smoke test's sidecar: proves that a native sidecar starts before the workload, reaches
//! the bucket, and is terminated only after the workload has exited.

use anyhow::Context;
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};

/// Arguments of `cojob smoke-sidecar`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The store URL.
    #[arg(long, env = "COJOB_BUCKET")]
    bucket: String,
    /// The key prefix to write under.
    #[arg(long)]
    key: String,
}

fn now() -> String {
    cojob::json::format_time(chrono::Utc::now())
}

/// Claims `<key>/started`, waits for SIGTERM or SIGINT, then claims `<key>/stopped`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let db = cojob::Db::open(&args.bucket)
        .await
        .with_context(|| format!("opening {}", args.bucket))?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let started = db
        .claim(&format!("{}/started", args.key), &json!({"at": now()}))
        .await?;
    tracing::info!(key = args.key, won = started.won, "sidecar started");
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    db.claim(&format!("{}/stopped", args.key), &json!({"at": now()}))
        .await?;
    tracing::info!(key = args.key, "sidecar stopped on signal");
    Ok(())
}
