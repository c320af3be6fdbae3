//! `cojob runs`: a CoordinatedJob's history as the bucket records it, one row per decision
//! (a tick, the single run of a job without a schedule, or a trigger), newest last.
//!
//! Requests: one list per folder (`ticks/`, `triggers/`), one read per decision shown and one
//! per run shown. The CLI reads; it never writes. The lease holder, a credential, is never
//! read into a row (the bucket only has its digest anyway).

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::table::{Output, print_json, render};
use super::target::{BucketArgs, JobArgs};
use crate::index::Decision;
use crate::layout::JobKeys;
use crate::run::RunState;

/// Arguments of `cojob runs`.
#[derive(Debug, clap::Args)]
pub struct RunsArgs {
    #[command(flatten)]
    job: JobArgs,
    #[command(flatten)]
    bucket: BucketArgs,
    /// Show only the newest N decisions (0: all).
    #[arg(long, default_value_t = 20)]
    last: usize,
    /// How to print: table or json.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// One decision and, for a run, its lease.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// What was decided for: a tick (`2026-08-09T02:00:00.000000Z`), `once`, or
    /// `trigger/<key>`.
    pub tick: String,
    /// When: the tick's time, or when a trigger's decision was written (by the store's clock).
    pub at: Option<DateTime<Utc>>,
    /// The decision: `run`, `skipped` or `missed`.
    pub decision: &'static str,
    /// Why it was skipped or missed (`Suspended`, `ConcurrencyForbid`, `DeadlineExceeded`,
    /// `Superseded`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The run, when the decision is to run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The run's lease: its epoch and state (`None` before the run was first dispatched).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseRow>,
}

/// A run's lease as `cojob runs` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeaseRow {
    /// The epoch of the current (or last) attempt.
    pub epoch: u64,
    /// True while an attempt holds the lease.
    pub held: bool,
    /// The run's state.
    pub state: RunState,
}

impl Row {
    /// The pod of the run's current (or last) attempt.
    pub fn pod(&self) -> Option<String> {
        let lease = self.lease.as_ref()?;
        let run = self.run_id.as_ref()?;
        Some(
            lease
                .state
                .pod
                .clone()
                .unwrap_or_else(|| crate::pod::pod_name(run, lease.epoch)),
        )
    }
}

/// Reads the newest `last` decisions of the job at `keys` (0: all), oldest first.
pub async fn read_history(
    db: &cojob::Db,
    keys: &JobKeys,
    last: usize,
) -> Result<Vec<Row>, cojob::Error> {
    let store = db.store();
    let mut ticks = store.list(&format!("{}/ticks/", keys.base())).await?;
    ticks.sort();
    let triggers = store.list(&format!("{}/triggers/", keys.base())).await?;
    if last > 0 && ticks.len() > last {
        ticks.drain(..ticks.len() - last);
    }
    let mut rows = Vec::with_capacity(ticks.len() + triggers.len());
    for key in ticks.iter().chain(triggers.iter()) {
        let Some(claim) = store.get_object(key).await? else {
            continue; // removed since the list
        };
        let decision: Decision =
            serde_json::from_slice(&claim.body).map_err(|e| cojob::Error::Corrupt {
                key: key.clone(),
                expected: "decision claim".into(),
                detail: e.to_string(),
            })?;
        let name = key.rsplit('/').next().unwrap_or_default();
        let (tick, at) = if key.contains("/triggers/") {
            (format!("trigger/{name}"), claim.last_modified)
        } else {
            (name.to_string(), cojob::json::parse_time(name).ok())
        };
        rows.push(decision_row(db, keys, tick, at, decision).await?);
    }
    // Ticks are in time order; triggers fall in by when they were decided (`once` last).
    rows.sort_by_key(|r| (r.at.is_none(), r.at));
    if last > 0 && rows.len() > last {
        rows.drain(..rows.len() - last);
    }
    Ok(rows)
}

/// The row of one decision: `tick` and `at` label it; for a run, its lease is read.
pub async fn decision_row(
    db: &cojob::Db,
    keys: &JobKeys,
    tick: String,
    at: Option<DateTime<Utc>>,
    decision: Decision,
) -> Result<Row, cojob::Error> {
    let (kind, reason, run_id) = match decision {
        Decision::RunId(id) => ("run", None, Some(id)),
        Decision::Skipped(why) => ("skipped", Some(why), None),
        Decision::Missed(why) => ("missed", Some(why), None),
    };
    let lease = match &run_id {
        Some(id) => {
            let key = keys.lease(id);
            match db.inspect_lease(&key).await? {
                Some(info) => Some(LeaseRow {
                    epoch: info.epoch,
                    held: !info.is_released() && !info.is_expired_at(db.clock().now()),
                    state: RunState::parse(&info.state).map_err(|r| cojob::Error::Corrupt {
                        key,
                        expected: "run state".into(),
                        detail: r.to_string(),
                    })?,
                }),
                None => None,
            }
        }
        None => None,
    };
    Ok(Row {
        tick,
        at,
        decision: kind,
        reason,
        run_id,
        lease,
    })
}

/// The rows as a table: tick, decision, run, epoch, attempt, status, exit code, pod, times.
pub fn table(rows: &[Row]) -> String {
    let header = [
        "TICK", "DECISION", "RUN", "EPOCH", "ATTEMPT", "STATUS", "EXIT", "POD", "STARTED",
        "FINISHED",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let l = r.lease.as_ref();
            let decision = match &r.reason {
                Some(why) => format!("{}: {why}", r.decision),
                None => r.decision.to_string(),
            };
            let status = l.map(|l| {
                let mut s = l.state.status.as_str().to_string();
                if l.state.cancel_requested && !l.state.status.is_terminal() {
                    s.push_str(" (cancel requested)");
                }
                s
            });
            vec![
                r.tick.clone(),
                decision,
                r.run_id.clone().unwrap_or_default(),
                l.map(|l| l.epoch.to_string()).unwrap_or_default(),
                l.map(|l| l.state.attempt.to_string()).unwrap_or_default(),
                status.unwrap_or_default(),
                l.and_then(|l| l.state.exit_code)
                    .map(|c| c.to_string())
                    .unwrap_or_default(),
                r.pod().unwrap_or_default(),
                l.and_then(|l| l.state.started_at.clone())
                    .unwrap_or_default(),
                l.and_then(|l| l.state.finished_at.clone())
                    .unwrap_or_default(),
            ]
        })
        .collect();
    render(&header, &cells)
}

/// `cojob runs`.
pub async fn run(args: RunsArgs) -> anyhow::Result<()> {
    let target = args.job.resolve().await?;
    let job = target.get().await?;
    let keys = target.keys(&job)?;
    let db = args.bucket.open().await?;
    let rows = read_history(&db, &keys, args.last).await.with_context(|| {
        format!(
            "reading the history of {} in {}",
            target.display(),
            args.bucket.bucket
        )
    })?;
    match args.output {
        Output::Json => print_json(&rows),
        Output::Table if rows.is_empty() => {
            println!("nothing decided for {} yet", target.display());
            Ok(())
        }
        Output::Table => {
            print!("{}", table(&rows));
            Ok(())
        }
    }
}
