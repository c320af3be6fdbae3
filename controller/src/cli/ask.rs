//! Commands that ask the controller to act: `trigger`, `cancel`, `suspend` and `resume`.
//!
//! They change only the CoordinatedJob (annotations, `spec.suspend`), which RBAC and the
//! admission policies already govern; the controller carries the request out and removes the
//! annotation. The CLI needs no bucket credentials for them.

use std::time::Duration;

use anyhow::Context as _;
use kube::api::{Patch, PatchParams};
use serde::Serialize;
use serde_json::json;

use super::table::{Output, print_json};
use super::target::{JobArgs, Target};
use crate::crd::{CANCEL_ANNOTATION_PREFIX, CoordinatedJob, TRIGGER_ANNOTATION_PREFIX};
use crate::index::Decision;
use crate::layout::{check_trigger_key, trigger_run_id};

/// Arguments of `cojob trigger`.
#[derive(Debug, clap::Args)]
pub struct TriggerArgs {
    #[command(flatten)]
    job: JobArgs,
    /// The trigger key: requests with one key run at most once, however often they are repeated
    /// (a retried CI step, a re-applied manifest). 1 to 63 letters, digits, `-`, `_` or `.`.
    /// Default: a new random key, so every call runs.
    #[arg(long)]
    key: Option<String>,
    /// Why, kept as the request annotation's value (for `kubectl get -o yaml` while pending).
    #[arg(long, default_value = "cojob trigger")]
    reason: String,
    /// How long to wait for the controller's decision; 0 to return once asked.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    wait: Duration,
    /// The controller's store URL; with it, a skipped request says why.
    #[arg(long, env = "COJOB_BUCKET")]
    bucket: Option<String>,
    /// How to print: table or json.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// What `cojob trigger` reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Triggered {
    /// The job, `namespace/name`.
    pub job: String,
    /// The trigger key.
    pub key: String,
    /// The run the key maps to.
    pub run_id: String,
    /// `asked` (not waited for), `run`, `skipped`, or `decided` (no bucket to say which).
    pub decision: String,
    /// Why it was skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `cojob trigger`.
pub async fn trigger(args: TriggerArgs) -> anyhow::Result<()> {
    let key = match args.key {
        Some(k) => k,
        None => random_key()?,
    };
    check_trigger_key(&key).map_err(anyhow::Error::msg)?;
    let target = args.job.resolve().await?;
    let annotation = format!("{TRIGGER_ANNOTATION_PREFIX}{key}");
    annotate(&target, &annotation, &args.reason).await?;
    let mut report = Triggered {
        job: target.display(),
        key: key.clone(),
        run_id: trigger_run_id(&target.name, &key),
        decision: "asked".into(),
        reason: None,
    };
    if !args.wait.is_zero() {
        let job = wait_until_removed(&target, &annotation, args.wait).await?;
        report.decision = "decided".into();
        if let Some(url) = &args.bucket {
            let db = super::target::BucketArgs {
                bucket: url.clone(),
            }
            .open()
            .await?;
            let claim = target.keys(&job)?.trigger(&key);
            let stored = db
                .store()
                .get(&claim)
                .await
                .with_context(|| format!("reading {claim}"))?;
            if let Some((body, _)) = stored {
                match serde_json::from_slice::<Decision>(&body)
                    .with_context(|| format!("reading {claim}"))?
                {
                    Decision::RunId(id) => {
                        report.decision = "run".into();
                        report.run_id = id;
                    }
                    Decision::Skipped(why) | Decision::Missed(why) => {
                        report.decision = "skipped".into();
                        report.reason = Some(why);
                    }
                }
            }
        }
    }
    match args.output {
        Output::Json => print_json(&report),
        Output::Table => {
            let Triggered {
                job,
                key,
                run_id,
                decision,
                reason,
            } = &report;
            match decision.as_str() {
                "asked" => println!(
                    "{job}: trigger {key} asked for; it runs as {run_id} unless concurrencyPolicy skips it"
                ),
                "run" => println!("{job}: trigger {key} runs as {run_id}"),
                "skipped" => println!(
                    "{job}: trigger {key} skipped: {}",
                    reason.as_deref().unwrap_or("")
                ),
                _ => println!(
                    "{job}: trigger {key} decided (run {run_id}, unless concurrencyPolicy skipped it; `cojob why {job} trigger/{key}` says which)"
                ),
            }
            Ok(())
        }
    }
}

/// Arguments of `cojob cancel`.
#[derive(Debug, clap::Args)]
pub struct CancelArgs {
    #[command(flatten)]
    job: JobArgs,
    /// The run to cancel (its id, as `cojob runs` or the status shows it).
    run: String,
    /// How long to wait until the run has ended; 0 to return once asked.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    wait: Duration,
}

/// `cojob cancel`.
pub async fn cancel(args: CancelArgs) -> anyhow::Result<()> {
    let target = args.job.resolve().await?;
    let annotation = format!("{CANCEL_ANNOTATION_PREFIX}{}", args.run);
    annotate(&target, &annotation, "cojob cancel").await?;
    if args.wait.is_zero() {
        println!("{}: cancel of {} asked for", target.display(), args.run);
        return Ok(());
    }
    let mut job = wait_until_removed(&target, &annotation, args.wait).await?;
    // The status is written at the end of the controller's pass: wait until it no longer
    // lists the run as active.
    let deadline = tokio::time::Instant::now() + args.wait;
    while is_active(&job, &args.run) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(300)).await;
        job = target.get().await?;
    }
    let ended = job
        .status
        .as_ref()
        .and_then(|s| s.recent.iter().find(|r| r.run_id == args.run))
        .map(|r| r.phase.clone());
    match ended {
        Some(phase) => println!("{}: run {} ended {phase}", target.display(), args.run),
        None => anyhow::bail!(
            "{}: run {} is not an active run of this job; nothing was cancelled",
            target.display(),
            args.run
        ),
    }
    Ok(())
}

fn is_active(job: &CoordinatedJob, run: &str) -> bool {
    job.status
        .as_ref()
        .is_some_and(|s| s.active.iter().any(|r| r.run_id == run))
}

/// Arguments of `cojob suspend` and `cojob resume`.
#[derive(Debug, clap::Args)]
pub struct SuspendArgs {
    #[command(flatten)]
    job: JobArgs,
}

/// `cojob suspend` (`suspend = true`) and `cojob resume`: sets `spec.suspend`. While suspended,
/// due ticks are recorded as skipped; active runs continue and triggers still run.
pub async fn set_suspended(args: SuspendArgs, suspend: bool) -> anyhow::Result<()> {
    let target = args.job.resolve().await?;
    let patch = json!({"spec": {"suspend": suspend}});
    target
        .api
        .patch(&target.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("patching CoordinatedJob {}", target.display()))?;
    let what = if suspend { "suspended" } else { "resumed" };
    println!("{}: {what}", target.display());
    Ok(())
}

async fn annotate(target: &Target, annotation: &str, value: &str) -> anyhow::Result<()> {
    target.get().await?; // a clear error when there is no such job
    let patch = json!({"metadata": {"annotations": {annotation: value}}});
    target
        .api
        .patch(&target.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating CoordinatedJob {}", target.display()))?;
    Ok(())
}

/// Waits until the controller removed `annotation` (it carried the request out); returns the
/// job as it then is.
async fn wait_until_removed(
    target: &Target,
    annotation: &str,
    wait: Duration,
) -> anyhow::Result<CoordinatedJob> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let job = target.get().await?;
        let pending = job
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(annotation));
        if !pending {
            return Ok(job);
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!(
                "{}: the controller has not carried out {annotation} within {}; is it running? (the request stays; it is carried out when the controller gets to it)",
                target.display(),
                humantime::format_duration(wait)
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A fresh trigger key: `cli-` and 16 random hex digits.
fn random_key() -> anyhow::Result<String> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 8];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| anyhow::anyhow!("no system randomness for a trigger key"))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("cli-{hex}"))
}
