//! `cojob fenced-put`: a workload's fenced write (G4), from a shell.
//!
//! A run's workload that records a result outside the run's lease writes it with its attempt's
//! fencing token, `COJOB_EPOCH`, through [`cojob::Db::fenced_put`]: the write lands unless a
//! newer attempt of the run already wrote there. For example, in a pod template:
//!
//! ```yaml
//! command: ["/cojob", "fenced-put", "--store", "s3://results/payments",
//!           "--key", "$(COJOB_RUN_ID)", "--value", "{\"paid\": true}"]
//! ```
//!
//! Exit codes: 0 written, [`STALE_EXIT`] refused (a newer attempt wrote), 1 any other error.

use anyhow::Context as _;

/// The exit code of a write refused because a newer attempt already wrote.
pub const STALE_EXIT: i32 = 3;

/// Arguments of `cojob fenced-put`.
#[derive(Debug, clap::Args)]
pub struct FencedPutArgs {
    /// The store URL of the results, e.g. s3://bucket/prefix (credentials from the
    /// environment, as for the controller).
    #[arg(long, env = "COJOB_EFFECT_STORE")]
    pub store: String,
    /// The result's key under the store URL, e.g. the run id.
    #[arg(long)]
    pub key: String,
    /// The fencing token; in a run's pod, its attempt's epoch.
    #[arg(long, env = "COJOB_EPOCH")]
    pub token: u64,
    /// The result, as JSON (a bare word is taken as a string).
    #[arg(long)]
    pub value: String,
}

/// Performs the write and prints what happened; returns the process's exit code.
pub async fn run(args: FencedPutArgs) -> anyhow::Result<i32> {
    let value: serde_json::Value = serde_json::from_str(&args.value)
        .unwrap_or_else(|_| serde_json::Value::String(args.value.clone()));
    let db = cojob::Db::open(&args.store)
        .await
        .with_context(|| format!("opening the store {}", args.store))?;
    let outcome = db
        .fenced_put(&args.key, args.token, &value)
        .await
        .with_context(|| format!("writing {} with fence {}", args.key, args.token))?;
    Ok(match outcome {
        cojob::fence::Fenced::Written { .. } => {
            println!("{}: written with fence {}", args.key, args.token);
            0
        }
        cojob::fence::Fenced::Stale { stored } => {
            eprintln!(
                "{}: refused: a newer attempt wrote it (fence {stored} > {})",
                args.key, args.token
            );
            STALE_EXIT
        }
    })
}
