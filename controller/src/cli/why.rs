//! `cojob why`: what was decided for one tick of a CoordinatedJob, and why.
//!
//! The answer comes from the tick's claim in the bucket (the decision every controller
//! converged on) and, for a run, its lease; without a claim, from the schedule, the object's
//! creation and the index's cursor. [`explain`] is the pure part.

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::runs::{LeaseRow, Row};
use super::table::{Output, print_json};
use super::target::{BucketArgs, JobArgs};
use crate::crd::{CatchUpPolicy, CoordinatedJobSpec, TRIGGER_ANNOTATION_PREFIX};
use crate::index::{Decision, JobIndex};
use crate::reconcile::parse_schedule;

/// Arguments of `cojob why`.
#[derive(Debug, clap::Args)]
pub struct WhyArgs {
    #[command(flatten)]
    job: JobArgs,
    /// The tick: an RFC 3339 time (2026-08-09T02:00:00Z), `once` (a job without a schedule),
    /// or `trigger/<key>` (a manual run).
    tick: String,
    #[command(flatten)]
    bucket: BucketArgs,
    /// How to print: table (a sentence) or json.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// Which decision is asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TickRef {
    /// A fire time.
    Time(DateTime<Utc>),
    /// The single run of a job without a schedule.
    Once,
    /// The manual run of a trigger key.
    Trigger(String),
}

impl std::str::FromStr for TickRef {
    type Err = String;

    /// ```
    /// use cojob_controller::cli::why::TickRef;
    /// assert_eq!("once".parse::<TickRef>(), Ok(TickRef::Once));
    /// assert_eq!("trigger/deploy-1".parse::<TickRef>(), Ok(TickRef::Trigger("deploy-1".into())));
    /// assert!(matches!("2026-08-09T04:00:00+02:00".parse::<TickRef>(), Ok(TickRef::Time(_))));
    /// assert!("yesterday".parse::<TickRef>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<TickRef, String> {
        if s == "once" {
            return Ok(TickRef::Once);
        }
        if let Some(key) = s.strip_prefix("trigger/") {
            crate::layout::check_trigger_key(key)?;
            return Ok(TickRef::Trigger(key.to_string()));
        }
        DateTime::parse_from_rfc3339(s)
            .map(|t| TickRef::Time(t.with_timezone(&Utc)))
            .map_err(|e| {
                format!("{s:?} is not an RFC 3339 time (2026-08-09T02:00:00Z), `once` or `trigger/<key>`: {e}")
            })
    }
}

/// What is known about the tick.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    /// The job's spec now.
    pub spec: &'a CoordinatedJobSpec,
    /// When the object was created.
    pub created: Option<DateTime<Utc>>,
    /// Now.
    pub now: DateTime<Utc>,
    /// The job's index, if stored.
    pub index: Option<&'a JobIndex>,
    /// The tick asked about.
    pub tick: &'a TickRef,
    /// Its claim, if any.
    pub decision: Option<&'a Decision>,
    /// The run's lease, for a run.
    pub lease: Option<&'a LeaseRow>,
    /// A trigger whose annotation is still on the object (asked, not decided yet).
    pub trigger_pending: bool,
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Answer {
    /// In one word: `ran`, `running`, `skipped`, `missed`, `pending`, `not-due`, `not-a-tick`,
    /// `not-decided`.
    pub verdict: &'static str,
    /// Why, in a sentence or two.
    pub explanation: String,
}

/// Explains the decision of one tick from `facts`.
pub fn explain(f: &Facts<'_>) -> Answer {
    let answer = |verdict, explanation: String| Answer {
        verdict,
        explanation,
    };
    if let Some(decision) = f.decision {
        return match decision {
            Decision::RunId(run) => explain_run(run, f.lease),
            Decision::Skipped(why) => answer(
                "skipped",
                match why.as_str() {
                    "Suspended" => "skipped: the job was suspended (spec.suspend) when it fell due".into(),
                    "ConcurrencyForbid" => "skipped: concurrencyPolicy is Forbid and another run of the job was still active".into(),
                    other => format!("skipped: {other}"),
                },
            ),
            Decision::Missed(why) => answer(
                "missed",
                match why.as_str() {
                    "DeadlineExceeded" => format!(
                        "missed: no controller decided it within {} of its time (startingDeadlineSeconds, or a minute with catchUp None), so it never ran",
                        f.spec.starting_deadline_seconds.map_or("the deadline".to_string(), |s| format!("{s} s"))
                    ),
                    "Superseded" => "missed: it fell due together with a newer tick, and catchUp Latest runs only the newest".into(),
                    other => format!("missed: {other}"),
                },
            ),
        };
    }
    match f.tick {
        TickRef::Trigger(key) if f.trigger_pending => answer(
            "pending",
            format!("trigger {key} is asked for (annotation {TRIGGER_ANNOTATION_PREFIX}{key}) and not decided yet: is the controller running?"),
        ),
        TickRef::Trigger(key) => answer(
            "not-decided",
            format!("no trigger {key} was ever decided for this job (ask with `cojob trigger --key {key}`)"),
        ),
        TickRef::Once if f.spec.schedule.is_some() => answer(
            "not-a-tick",
            "this job has a schedule; `once` is the single run of a job without one".into(),
        ),
        TickRef::Once => answer(
            "not-decided",
            "the job's single run is not decided yet: is the controller running, and is the job suspended?".into(),
        ),
        TickRef::Time(t) => explain_undecided_time(f, *t),
    }
}

fn explain_run(run: &str, lease: Option<&LeaseRow>) -> Answer {
    let Some(l) = lease else {
        return Answer {
            verdict: "running",
            explanation: format!("decided to run as {run}; not dispatched yet"),
        };
    };
    let s = &l.state;
    let exit = s
        .exit_code
        .map(|c| format!(", exit code {c}"))
        .unwrap_or_default();
    let reason = s
        .reason
        .as_deref()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    let attempts = format!("attempt {} at epoch {}", s.attempt, l.epoch);
    if s.status.is_terminal() {
        Answer {
            verdict: "ran",
            explanation: format!(
                "ran as {run}: {}{reason}{exit}, {attempts}",
                s.status.as_str()
            ),
        }
    } else {
        let cancel = if s.cancel_requested {
            ", cancel requested"
        } else {
            ""
        };
        Answer {
            verdict: "running",
            explanation: format!(
                "running as {run}: {}{cancel}, {attempts}",
                s.status.as_str()
            ),
        }
    }
}

fn explain_undecided_time(f: &Facts<'_>, t: DateTime<Utc>) -> Answer {
    let fmt = cojob::json::format_time;
    let answer = |verdict, explanation: String| Answer {
        verdict,
        explanation,
    };
    let schedule = match parse_schedule(f.spec) {
        Ok(Some(s)) => s,
        Ok(None) => {
            return answer(
                "not-a-tick",
                "this job has no schedule: its single run is `once`".into(),
            );
        }
        Err(e) => return answer("not-a-tick", format!("the job's schedule is invalid: {e}")),
    };
    if schedule.at_or_before(t) != Some(t) {
        let before = schedule
            .at_or_before(t)
            .map(fmt)
            .unwrap_or_else(|| "none".into());
        let after = schedule
            .next_after(t)
            .map(fmt)
            .unwrap_or_else(|| "none".into());
        return answer(
            "not-a-tick",
            format!(
                "{} is not a tick of the schedule; the nearest are {before} and {after}",
                fmt(t)
            ),
        );
    }
    if t > f.now {
        let wait = humantime::format_duration(std::time::Duration::from_secs(
            (t - f.now).num_seconds().max(0).unsigned_abs(),
        ));
        return answer("not-due", format!("not due yet: in {wait}"));
    }
    if f.created.is_some_and(|c| t <= c) {
        return answer(
            "not-a-tick",
            "it fell due before the job was created; a job only runs ticks after its creation"
                .into(),
        );
    }
    let cursor = f.index.and_then(JobIndex::cursor_time);
    if cursor.is_some_and(|c| t <= c) {
        let how = if f.spec.catch_up == CatchUpPolicy::All {
            ""
        } else {
            " or was superseded"
        };
        return answer(
            "missed",
            format!(
                "it has no decision of its own but is behind the cursor ({}): it fell in a long outage (the oldest of many due ticks are missed as one range{how}), or before the schedule was last edited",
                cursor.map(fmt).unwrap_or_default()
            ),
        );
    }
    answer(
        "not-decided",
        "due but not decided yet: is the controller running (it decides due ticks on every pass)?"
            .into(),
    )
}

/// `cojob why`.
pub async fn run(args: WhyArgs) -> anyhow::Result<()> {
    let tick: TickRef = args.tick.parse().map_err(anyhow::Error::msg)?;
    let target = args.job.resolve().await?;
    let job = target.get().await?;
    let keys = target.keys(&job)?;
    let db = args.bucket.open().await?;
    let key = match &tick {
        TickRef::Time(t) => keys.tick(Some(*t)),
        TickRef::Once => keys.tick(None),
        TickRef::Trigger(k) => keys.trigger(k),
    };
    let context = || format!("reading {key} in {}", args.bucket.bucket);
    let decision: Option<Decision> = match db.store().get(&key).await.with_context(context)? {
        Some((body, _)) => Some(serde_json::from_slice(&body).with_context(context)?),
        None => None,
    };
    let row: Option<Row> = match &decision {
        Some(d @ Decision::RunId(_)) => Some(
            super::runs::decision_row(&db, &keys, label(&tick), None, d.clone())
                .await
                .with_context(context)?,
        ),
        _ => None,
    };
    let index = db
        .doc::<JobIndex>(&keys.index())
        .get()
        .await
        .with_context(|| format!("reading {}", keys.index()))?
        .map(|(i, _)| i);
    let pending = match &tick {
        TickRef::Trigger(k) => job
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(&format!("{TRIGGER_ANNOTATION_PREFIX}{k}"))),
        _ => false,
    };
    let created = job
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(crate::api_time::from_api);
    let facts = Facts {
        spec: &job.spec,
        created,
        now: Utc::now(),
        index: index.as_ref(),
        tick: &tick,
        decision: decision.as_ref(),
        lease: row.as_ref().and_then(|r| r.lease.as_ref()),
        trigger_pending: pending,
    };
    let answer = explain(&facts);
    match args.output {
        Output::Json => print_json(&serde_json::json!({
            "job": target.display(), "tick": label(&tick), "verdict": answer.verdict,
            "explanation": answer.explanation, "run": row,
        })),
        Output::Table => {
            println!(
                "{} {}: {}",
                target.display(),
                label(&tick),
                answer.explanation
            );
            Ok(())
        }
    }
}

/// The tick as `cojob runs` labels it.
fn label(tick: &TickRef) -> String {
    match tick {
        TickRef::Time(t) => cojob::json::format_time(*t),
        TickRef::Once => "once".into(),
        TickRef::Trigger(k) => format!("trigger/{k}"),
    }
}
