//! `cojob backfill`: runs the ticks of a past range, each at most once (see
//! [`crate::backfill`]). The controller does the work, asked through the annotation
//! `backfill.cojob.dev/<id>`; `--dry-run` only reads the bucket and says what would run.

use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use kube::api::{Patch, PatchParams};
use serde::Serialize;
use serde_json::json;

use super::table::{Output, print_json, render};
use super::target::{BucketArgs, JobArgs};
use crate::backfill::{BackfillProgress, BackfillRequest, MAX_TICKS, count_ticks};
use crate::crd::BACKFILL_ANNOTATION_PREFIX;
use crate::index::{Decision, JobIndex};
use crate::layout::check_trigger_key;
use crate::reconcile::parse_schedule;

/// Arguments of `cojob backfill`.
#[derive(Debug, clap::Args)]
pub struct BackfillArgs {
    #[command(flatten)]
    job: JobArgs,
    /// The first tick of the range (RFC 3339, inclusive).
    #[arg(long, value_parser = parse_time)]
    from: DateTime<Utc>,
    /// The last tick of the range (RFC 3339, inclusive).
    #[arg(long, value_parser = parse_time)]
    to: DateTime<Utc>,
    /// How many of its runs may be active at once.
    #[arg(long, default_value_t = 1)]
    parallelism: u32,
    /// The backfill's id (letters, digits, `-`, `_`, `.`). Default: one derived from the range,
    /// so asking for the same range again is the same backfill.
    #[arg(long)]
    id: Option<String>,
    /// Only say which ticks would run and which are decided already; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// How long to wait for the backfill to finish; 0 to return once asked.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    wait: Duration,
    #[command(flatten)]
    bucket: BucketArgs,
    /// How to print: table or json.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{s:?} is not an RFC 3339 time (2026-08-09T02:00:00Z): {e}"))
}

/// One tick of a dry run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Planned {
    /// The tick.
    pub tick: String,
    /// `run` (undecided: the backfill runs it), `decided` (kept), or `schedule` (after the
    /// job's cursor: the schedule's own).
    pub plan: &'static str,
    /// The existing decision, for a decided tick.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
}

/// `cojob backfill`.
pub async fn run(args: BackfillArgs) -> anyhow::Result<()> {
    let request = BackfillRequest {
        from: args.from,
        to: args.to,
        parallelism: args.parallelism,
    };
    let request = BackfillRequest::parse(&request.to_value()).map_err(anyhow::Error::msg)?;
    let id = args.id.clone().unwrap_or_else(|| {
        format!(
            "range-{}-{}",
            request.from.timestamp(),
            request.to.timestamp()
        )
    });
    check_trigger_key(&id).map_err(|e| anyhow::anyhow!(e.replace("trigger key", "backfill id")))?;
    let target = args.job.resolve().await?;
    let job = target.get().await?;
    let schedule = parse_schedule(&job.spec)
        .map_err(|e| anyhow::anyhow!("the job's schedule is invalid: {e}"))?
        .with_context(|| {
            format!(
                "{} has no schedule, so no ticks to backfill",
                target.display()
            )
        })?;
    if count_ticks(&schedule, &request) > MAX_TICKS {
        anyhow::bail!("the range holds more than {MAX_TICKS} ticks; split it");
    }
    let keys = target.keys(&job)?;
    let db = args.bucket.open().await?;
    if args.dry_run {
        let index = db
            .doc::<JobIndex>(&keys.index())
            .get()
            .await
            .with_context(|| format!("reading {}", keys.index()))?
            .map(|(i, _)| i);
        let cursor = index.as_ref().and_then(JobIndex::cursor_time);
        let mut plan = Vec::new();
        let after = request.from - chrono::Duration::microseconds(1);
        for t in schedule.ticks_between(after, request.to, MAX_TICKS) {
            let key = keys.tick(Some(t));
            let claim = db
                .store()
                .get(&key)
                .await
                .with_context(|| format!("reading {key}"))?;
            let decision = match claim {
                Some((body, _)) => Some(
                    serde_json::from_slice::<Decision>(&body)
                        .with_context(|| format!("reading {key}"))?,
                ),
                None => None,
            };
            let tick = cojob::json::format_time(t);
            plan.push(match decision {
                Some(d) => Planned {
                    tick,
                    plan: "decided",
                    decision: Some(d),
                },
                None if cursor.is_none_or(|c| t > c) => Planned {
                    tick,
                    plan: "schedule",
                    decision: None,
                },
                None => Planned {
                    tick,
                    plan: "run",
                    decision: None,
                },
            });
        }
        return match args.output {
            Output::Json => print_json(&json!({"job": target.display(), "id": id, "ticks": plan})),
            Output::Table => {
                let rows: Vec<Vec<String>> = plan
                    .iter()
                    .map(|p| {
                        let what = match (&p.plan, &p.decision) {
                            (_, Some(Decision::RunId(r))) => format!("decided: ran as {r}; kept"),
                            (_, Some(Decision::Skipped(w))) => {
                                format!("decided: skipped ({w}); kept")
                            }
                            (_, Some(Decision::Missed(w))) => {
                                format!("decided: missed ({w}); kept")
                            }
                            (&"schedule", None) => {
                                "after the job's cursor: the schedule's own".into()
                            }
                            _ => "runs".into(),
                        };
                        vec![p.tick.clone(), what]
                    })
                    .collect();
                print!("{}", render(&["TICK", "BACKFILL"], &rows));
                let runs = plan.iter().filter(|p| p.plan == "run").count();
                println!(
                    "dry run: {runs} of {} ticks would run; nothing was changed",
                    plan.len()
                );
                Ok(())
            }
        };
    }
    let annotation = format!("{BACKFILL_ANNOTATION_PREFIX}{id}");
    let patch = json!({"metadata": {"annotations": {&annotation: request.to_value()}}});
    target
        .api
        .patch(&target.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating CoordinatedJob {}", target.display()))?;
    let deadline = tokio::time::Instant::now() + args.wait;
    loop {
        let job = target.get().await?;
        let pending = job
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(&annotation));
        let progress = db
            .doc::<BackfillProgress>(&keys.backfill(&id))
            .get()
            .await
            .with_context(|| format!("reading {}", keys.backfill(&id)))?
            .map(|(p, _)| p);
        if !pending || tokio::time::Instant::now() >= deadline {
            return report(
                &target.display(),
                &id,
                progress.as_ref(),
                pending,
                args.output,
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn report(
    job: &str,
    id: &str,
    progress: Option<&BackfillProgress>,
    pending: bool,
    output: Output,
) -> anyhow::Result<()> {
    match output {
        Output::Json => {
            print_json(&json!({"job": job, "id": id, "pending": pending, "progress": progress}))
        }
        Output::Table => {
            match progress {
                Some(p) if p.done => println!(
                    "{job}: backfill {id} done: {} ticks ran, {} were decided before and kept their decision",
                    p.ran, p.already_decided
                ),
                Some(p) => println!(
                    "{job}: backfill {id} in progress: decided up to {}, {} ran, {} kept",
                    p.cursor
                        .map(cojob::json::format_time)
                        .unwrap_or_else(|| "-".into()),
                    p.ran,
                    p.already_decided
                ),
                None => println!(
                    "{job}: backfill {id} asked for; the controller has not started it yet"
                ),
            }
            Ok(())
        }
    }
}
