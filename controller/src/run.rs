//! A run's state machine, as pure functions of what was observed.
//!
//! A run's truth is its lease in the bucket. The lease's `state` is a [`RunState`]; it moves
//! through these phases:
//!
//! ```text
//!            acquire                sidecar                pod ended
//!   (none) ──────────▶ pending ──────────▶ running ──────────────────▶ succeeded
//!                        ▲                    │   failed, attempt < max
//!                        │ acquire            ├──────────────────────▶ retrying ─┐
//!                        └────────────────────┼───────────────────────────────────┘
//!                                             │   failed, attempt = max
//!                                             └──────────────────────▶ failed
//!   any non-terminal phase with cancel_requested ──────────────────▶ cancelled
//! ```
//!
//! Every acquisition bumps the lease's epoch; [`acquire`] is its `state_fn`, so the transition
//! and the new epoch are written in one compare-and-swap. It refuses a terminal run (I2), and
//! it refuses a second acquisition for the same dispatch, so two controllers dispatching the
//! same run at once take one epoch between them. [`decide`] picks the next step of a run from
//! its lease and its pod; the sweeper carries it out.

use cojob::LeaseInfo;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A run's phase, as stored in its lease state's `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RunPhase {
    /// Acquired by the controller; the pod is being created or has not started its sidecar.
    #[default]
    Pending,
    /// The sidecar attached and renews the lease.
    Running,
    /// An attempt failed and another follows under a new epoch.
    Retrying,
    /// The work succeeded. Terminal.
    Succeeded,
    /// The work failed on its last attempt, or ran out of attempts. Terminal.
    Failed,
    /// Cancelled (finalizer, `Replace`). Terminal.
    Cancelled,
}

impl RunPhase {
    /// True for phases a run never leaves.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunPhase::Succeeded | RunPhase::Failed | RunPhase::Cancelled
        )
    }

    /// The lowercase name, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            RunPhase::Pending => "pending",
            RunPhase::Running => "running",
            RunPhase::Retrying => "retrying",
            RunPhase::Succeeded => "succeeded",
            RunPhase::Failed => "failed",
            RunPhase::Cancelled => "cancelled",
        }
    }
}

/// The typed view of a run lease's `state`. Fields written by others (the sidecar's `node`,
/// a workload's progress) are kept, because every transition merges into the stored value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RunState {
    /// The phase.
    pub status: RunPhase,
    /// The attempt number, from 1; bumped by every acquisition.
    #[serde(default)]
    pub attempt: u32,
    /// The run id.
    #[serde(default)]
    pub run_id: String,
    /// The tick this run is for (absent for a job without a schedule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fire_time: Option<String>,
    /// The dispatch that acquired the current epoch (the holder Secret's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch: Option<String>,
    /// The pod of the current attempt (written by its sidecar).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The node of the current attempt (written by its sidecar).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The main containers' exit code once the attempt ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why the run ended or was retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the sidecar of the current attempt started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// When the run reached a terminal phase (or the attempt ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Set by a cooperative write to ask the run to stop.
    #[serde(default)]
    pub cancel_requested: bool,
}

impl RunState {
    /// Reads a stored state; `null` (a lease written by someone else) is an error.
    pub fn parse(state: &Value) -> Result<RunState, Refusal> {
        if !state.is_object() {
            return Err(Refusal::Foreign(format!(
                "the lease state is {state}, not a run state object"
            )));
        }
        let parsed: RunState =
            serde_json::from_value(state.clone()).map_err(|e| Refusal::Foreign(e.to_string()))?;
        if parsed.run_id.is_empty() {
            return Err(Refusal::Foreign("the lease state has no run_id".into()));
        }
        Ok(parsed)
    }
}

/// Why an acquisition was refused. Nothing is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The run already ended; it is never spawned again.
    #[error("the run is already {}", .0.as_str())]
    Terminal(RunPhase),
    /// This dispatch already acquired an epoch (another controller got there first).
    #[error("this dispatch already acquired the lease")]
    AlreadyDispatched,
    /// The lease state is not a cojob run state.
    #[error("the lease does not hold a cojob run: {0}")]
    Foreign(String),
}

/// The inputs of an acquisition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquire {
    /// The run id.
    pub run_id: String,
    /// The tick, if any.
    pub fire_time: Option<String>,
    /// This dispatch's name (the holder Secret's name), unique per attempt.
    pub dispatch: String,
    /// The job's `maxAttempts`.
    pub max_attempts: u32,
    /// The current time, formatted.
    pub now: String,
}

/// The `state_fn` of every acquisition: a fresh run starts `pending` at attempt 1; a run
/// with attempts left goes back to `pending` with `attempt + 1`; a run out of attempts becomes
/// `failed` (reason `AttemptsExhausted`), and one whose cancel was requested becomes
/// `cancelled`. The caller releases a lease acquired into a terminal phase at once.
///
/// ```
/// use cojob_controller::run::{acquire, Acquire, Refusal};
/// let a = Acquire { run_id: "r".into(), fire_time: None, dispatch: "r-1-holder".into(), max_attempts: 2, now: "t".into() };
/// let first = acquire(None, &a).unwrap();
/// assert_eq!((first["status"].as_str(), first["attempt"].as_u64()), (Some("pending"), Some(1)));
/// assert_eq!(acquire(Some(&first), &a), Err(Refusal::AlreadyDispatched));
/// ```
pub fn acquire(prev: Option<&Value>, a: &Acquire) -> Result<Value, Refusal> {
    let Some(prev) = prev else {
        return Ok(json!({
            "status": RunPhase::Pending,
            "attempt": 1,
            "run_id": a.run_id,
            "fire_time": a.fire_time,
            "dispatch": a.dispatch,
            "dispatched_at": a.now,
            "cancel_requested": false,
        }));
    };
    let state = RunState::parse(prev)?;
    if state.status.is_terminal() {
        return Err(Refusal::Terminal(state.status));
    }
    if state.dispatch.as_deref() == Some(a.dispatch.as_str()) {
        return Err(Refusal::AlreadyDispatched);
    }
    if state.cancel_requested {
        return Ok(finish_state(prev, RunPhase::Cancelled, "Cancelled", &a.now));
    }
    if state.attempt >= a.max_attempts {
        return Ok(finish_state(
            prev,
            RunPhase::Failed,
            "AttemptsExhausted",
            &a.now,
        ));
    }
    Ok(cojob::lease::merge(
        prev,
        json!({
            "status": RunPhase::Pending,
            "attempt": state.attempt + 1,
            "dispatch": a.dispatch,
            "dispatched_at": a.now,
            "pod": null,
            "node": null,
            "started_at": null,
            "exit_code": null,
            "reason": null,
            "finished_at": null,
        }),
    ))
}

fn finish_state(prev: &Value, phase: RunPhase, reason: &str, now: &str) -> Value {
    cojob::lease::merge(
        prev,
        json!({"status": phase, "reason": reason, "finished_at": now}),
    )
}

/// How a run's pod ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodOutcome {
    /// The pod phase was `Succeeded`.
    pub succeeded: bool,
    /// The main containers' exit code (the first non-zero one, else 0), if any ended.
    pub exit_code: Option<i32>,
    /// The pod's reason, like `DeadlineExceeded` or `Evicted`.
    pub reason: Option<String>,
}

/// The state to release a run with when its pod ended: `succeeded`; `cancelled` when a cancel
/// was requested and the work did not succeed; `retrying` when attempts are left; else
/// `failed`.
///
/// ```
/// use cojob_controller::run::{complete, PodOutcome, RunPhase};
/// use serde_json::json;
/// let running = json!({"status": "running", "attempt": 1, "run_id": "r"});
/// let failed = PodOutcome { succeeded: false, exit_code: Some(3), reason: None };
/// let (state, phase) = complete(&running, &failed, 2, "t").unwrap();
/// assert_eq!((phase, state["exit_code"].as_i64()), (RunPhase::Retrying, Some(3)));
/// ```
pub fn complete(
    prev: &Value,
    outcome: &PodOutcome,
    max_attempts: u32,
    now: &str,
) -> Result<(Value, RunPhase), Refusal> {
    let state = RunState::parse(prev)?;
    if state.status.is_terminal() {
        return Err(Refusal::Terminal(state.status));
    }
    if state.status == RunPhase::Retrying {
        // Someone recorded this attempt's end already; the next attempt is being dispatched.
        return Err(Refusal::AlreadyDispatched);
    }
    let phase = if outcome.succeeded {
        RunPhase::Succeeded
    } else if state.cancel_requested {
        RunPhase::Cancelled
    } else if state.attempt < max_attempts {
        RunPhase::Retrying
    } else {
        RunPhase::Failed
    };
    let reason = match (phase, &outcome.reason) {
        (RunPhase::Cancelled, _) => Some("Cancelled".to_string()),
        (_, Some(r)) => Some(r.clone()),
        (RunPhase::Succeeded, None) => None,
        (_, None) => Some("Error".to_string()),
    };
    let state = cojob::lease::merge(
        prev,
        json!({
            "status": phase,
            "exit_code": outcome.exit_code,
            "reason": reason,
            "finished_at": now,
        }),
    );
    Ok((state, phase))
}

/// The state that cancels a run outright (its pod is stopped by the caller).
pub fn cancel(prev: &Value, now: &str) -> Result<Value, Refusal> {
    let state = RunState::parse(prev)?;
    if state.status.is_terminal() {
        return Err(Refusal::Terminal(state.status));
    }
    Ok(finish_state(
        &cojob::lease::merge(prev, json!({"cancel_requested": true})),
        RunPhase::Cancelled,
        "Cancelled",
        now,
    ))
}

/// What was observed of the pod of the lease's current epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodView {
    /// No such pod.
    Absent,
    /// It exists and has not ended (pending, running or being deleted).
    Live,
    /// It ended.
    Ended(PodOutcome),
}

/// The next step for a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// No lease yet, or released between attempts: acquire a new epoch and spawn its pod.
    Dispatch,
    /// The run is over; nothing is ever spawned again.
    Finished(RunState),
    /// Held and its pod lives: nothing to do until it ends or the lease expires.
    Wait,
    /// Held, the pod is missing and its holder Secret was never handed to a pod: a crash came
    /// between acquiring and creating the pod. Create it.
    CreatePod,
    /// The pod of the current epoch ended: release with the final state.
    Complete(PodOutcome),
    /// Held past its deadline by a pod that is gone or silent: steal under a new epoch.
    Steal,
}

/// Picks a run's next step from its lease, its current pod and whether the current epoch's
/// pod was never created (its holder Secret exists and was never handed to a pod).
pub fn decide(
    lease: Option<&LeaseInfo>,
    pod: &PodView,
    never_spawned: bool,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Step, Refusal> {
    let Some(lease) = lease else {
        return Ok(Step::Dispatch);
    };
    let state = RunState::parse(&lease.state)?;
    if state.status.is_terminal() {
        return Ok(Step::Finished(state));
    }
    if lease.is_released() {
        return Ok(Step::Dispatch);
    }
    match pod {
        PodView::Ended(outcome) => Ok(Step::Complete(outcome.clone())),
        _ if lease.is_expired_at(now) => Ok(Step::Steal),
        PodView::Live => Ok(Step::Wait),
        // Only an attempt whose pod never started may have its pod created again.
        PodView::Absent
            if never_spawned && state.status == RunPhase::Pending && state.started_at.is_none() =>
        {
            Ok(Step::CreatePod)
        }
        PodView::Absent => Ok(Step::Wait),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Duration, Utc};

    fn a(dispatch: &str, max: u32) -> Acquire {
        Acquire {
            run_id: "r".into(),
            fire_time: Some("2026-08-09T02:00:00.000000Z".into()),
            dispatch: dispatch.into(),
            max_attempts: max,
            now: "now".into(),
        }
    }

    fn now() -> DateTime<Utc> {
        "2026-08-09T02:00:30Z".parse().unwrap()
    }

    fn lease(state: Value, holder: Option<&str>, deadline_in: i64) -> LeaseInfo {
        LeaseInfo {
            epoch: 2,
            holder: holder.map(str::to_string),
            deadline: now() + Duration::seconds(deadline_in),
            state,
            version: cojob::Version {
                etag: Some("e".into()),
                generation: None,
            },
        }
    }

    fn failed(code: i32) -> PodOutcome {
        PodOutcome {
            succeeded: false,
            exit_code: Some(code),
            reason: None,
        }
    }

    #[test]
    fn acquisitions_bump_the_attempt_until_the_last_then_fail() {
        let s1 = acquire(None, &a("r-1-holder", 2)).unwrap();
        assert_eq!(RunState::parse(&s1).unwrap().attempt, 1);
        let mut running = cojob::lease::merge(&s1, json!({"status": "running", "pod": "r-1"}));
        let s2 = acquire(Some(&running), &a("r-2-holder", 2)).unwrap();
        let st2 = RunState::parse(&s2).unwrap();
        assert_eq!(
            (st2.status, st2.attempt, st2.pod),
            (RunPhase::Pending, 2, None)
        );
        assert_eq!(
            st2.fire_time.as_deref(),
            Some("2026-08-09T02:00:00.000000Z")
        );
        running = cojob::lease::merge(&s2, json!({"status": "running"}));
        let s3 = acquire(Some(&running), &a("r-3-holder", 2)).unwrap();
        let st3 = RunState::parse(&s3).unwrap();
        assert_eq!(
            (st3.status, st3.reason.as_deref()),
            (RunPhase::Failed, Some("AttemptsExhausted"))
        );
        assert_eq!(
            acquire(Some(&s3), &a("r-4-holder", 9)),
            Err(Refusal::Terminal(RunPhase::Failed))
        );
    }

    #[test]
    fn acquisition_keeps_foreign_fields_and_refuses_foreign_states() {
        let s = json!({"status": "retrying", "attempt": 1, "run_id": "r", "progress": 0.5});
        let next = acquire(Some(&s), &a("r-2-holder", 3)).unwrap();
        assert_eq!(next["progress"], json!(0.5));
        assert!(matches!(
            acquire(Some(&Value::Null), &a("x", 3)),
            Err(Refusal::Foreign(_))
        ));
        assert!(matches!(
            acquire(Some(&json!({"status": "exploded"})), &a("x", 3)),
            Err(Refusal::Foreign(_))
        ));
    }

    #[test]
    fn a_requested_cancel_ends_the_run_at_the_next_acquisition() {
        let s = json!({"status": "running", "attempt": 1, "run_id": "r", "cancel_requested": true});
        let next = acquire(Some(&s), &a("r-2-holder", 3)).unwrap();
        assert_eq!(next["status"], "cancelled");
        assert_eq!(next["attempt"], 1);
    }

    #[test]
    fn completion_maps_the_pod_outcome_to_a_phase() {
        let running = json!({"status": "running", "attempt": 1, "run_id": "r"});
        let ok = PodOutcome {
            succeeded: true,
            exit_code: Some(0),
            reason: None,
        };
        assert_eq!(
            complete(&running, &ok, 1, "t").unwrap().1,
            RunPhase::Succeeded
        );
        assert_eq!(
            complete(&running, &failed(1), 2, "t").unwrap().1,
            RunPhase::Retrying
        );
        let (state, phase) = complete(&running, &failed(7), 1, "t").unwrap();
        assert_eq!(phase, RunPhase::Failed);
        assert_eq!(
            (state["exit_code"].clone(), state["reason"].clone()),
            (json!(7), json!("Error"))
        );
        let cancelled = cojob::lease::merge(&running, json!({"cancel_requested": true}));
        assert_eq!(
            complete(&cancelled, &failed(143), 3, "t").unwrap().1,
            RunPhase::Cancelled
        );
        assert_eq!(
            complete(&cancelled, &ok, 3, "t").unwrap().1,
            RunPhase::Succeeded
        );
        let done = json!({"status": "succeeded", "attempt": 1, "run_id": "r"});
        assert_eq!(
            complete(&done, &failed(1), 3, "t"),
            Err(Refusal::Terminal(RunPhase::Succeeded))
        );
    }

    #[test]
    fn decide_covers_every_lease_and_pod_combination() {
        let running = json!({"status": "running", "attempt": 1, "run_id": "r"});
        let ended = PodView::Ended(failed(1));
        assert_eq!(
            decide(None, &PodView::Absent, false, now()),
            Ok(Step::Dispatch)
        );
        let held = lease(running.clone(), Some("h"), 10);
        assert_eq!(
            decide(Some(&held), &PodView::Live, true, now()),
            Ok(Step::Wait)
        );
        // A missing pod is created again only for an attempt that never started.
        let pending = lease(
            json!({"status": "pending", "attempt": 1, "run_id": "r"}),
            Some("h"),
            10,
        );
        assert_eq!(
            decide(Some(&pending), &PodView::Absent, true, now()),
            Ok(Step::CreatePod)
        );
        assert_eq!(
            decide(Some(&held), &PodView::Absent, true, now()),
            Ok(Step::Wait),
            "a pod that ran and was deleted is never created again under the same epoch"
        );
        assert_eq!(
            decide(Some(&held), &PodView::Absent, false, now()),
            Ok(Step::Wait)
        );
        assert_eq!(
            decide(Some(&held), &ended, true, now()),
            Ok(Step::Complete(failed(1)))
        );
        let expired = lease(running.clone(), Some("h"), 0);
        assert_eq!(
            decide(Some(&expired), &PodView::Live, true, now()),
            Ok(Step::Steal)
        );
        assert_eq!(
            decide(Some(&expired), &PodView::Absent, false, now()),
            Ok(Step::Steal)
        );
        // An ended pod is completed even after expiry: its result is not thrown away.
        assert_eq!(
            decide(Some(&expired), &ended, false, now()),
            Ok(Step::Complete(failed(1)))
        );
        let retrying = lease(
            json!({"status": "retrying", "attempt": 1, "run_id": "r"}),
            None,
            -5,
        );
        assert_eq!(
            decide(Some(&retrying), &ended, false, now()),
            Ok(Step::Dispatch)
        );
        let done = lease(
            json!({"status": "succeeded", "attempt": 1, "run_id": "r"}),
            None,
            -5,
        );
        assert!(matches!(
            decide(Some(&done), &PodView::Absent, false, now()),
            Ok(Step::Finished(RunState {
                status: RunPhase::Succeeded,
                ..
            }))
        ));
        assert!(
            decide(
                Some(&lease(json!(42), None, 0)),
                &PodView::Absent,
                false,
                now()
            )
            .is_err()
        );
    }
}
