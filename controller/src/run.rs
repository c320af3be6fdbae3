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
    /// When the current attempt's epoch was acquired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatched_at: Option<String>,
    /// When the sidecar of the current attempt started (the workload starts only after).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// When the run reached a terminal phase (or the attempt ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Set by a cooperative write to ask the run to stop.
    #[serde(default)]
    pub cancel_requested: bool,
    /// The epoch whose sidecar was told to stop, written with its last renewal
    /// ([`mark_stopping`]). The kubelet stops a native sidecar only after the pod's main
    /// containers ended, so that attempt's workload is over and its pod's end is on its way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopping_epoch: Option<u64>,
}

/// The state key of [`RunState::stopping_epoch`].
pub const STOPPING_EPOCH: &str = "stopping_epoch";

/// `state` with [`RunState::stopping_epoch`] set to `epoch`: what a sidecar writes with its
/// last renewal when the kubelet stops it.
///
/// ```
/// use cojob_controller::run::{clear_stopping, mark_stopping};
/// use serde_json::json;
/// let s = mark_stopping(&json!({"status": "running"}), 2);
/// assert_eq!(s, json!({"status": "running", "stopping_epoch": 2}));
/// assert_eq!(clear_stopping(s), json!({"status": "running"}));
/// ```
pub fn mark_stopping(state: &Value, epoch: u64) -> Value {
    cojob::lease::merge(state, json!({ STOPPING_EPOCH: epoch }))
}

/// `state` without [`RunState::stopping_epoch`]: a sidecar that (re)attaches is not stopping.
pub fn clear_stopping(mut state: Value) -> Value {
    if let Some(fields) = state.as_object_mut() {
        fields.remove(STOPPING_EPOCH);
    }
    state
}

/// How long before its tick, at the latest, the sidecar of a run decided ahead
/// (`prestartSeconds`) attaches to its lease; it attaches between this and twice this before
/// the tick ([`sidecar_attach_at`]). Until then it only reads the lease once, at its start (a
/// store it cannot reach, or an attempt already fenced, shows while there is time to act), and
/// the attempt stays `pending`, its lease kept by the controller's renewals of a pending
/// attempt (one per third of the pending ttl) rather than the sidecar's (one per third of the
/// ttl): a run prepared 600 s ahead at ttl 60 s makes about 2 writes before its tick instead
/// of 30, and its job about 3 timer passes instead of 13. The attach is a read and a
/// compare-and-swap, milliseconds on a reachable store; the lead leaves room for a slow one,
/// and the start gate still holds the workload until the tick itself.
pub const ATTACH_LEAD: std::time::Duration = std::time::Duration::from_secs(15);

/// When, at the latest, the sidecar of a run whose tick is `fire_time` attaches:
/// [`ATTACH_LEAD`] before the tick, or at once (`None`) for a run without a tick, or one whose
/// tick is less than that lead after `now`.
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use cojob_controller::run::attach_at;
/// let now = Utc.timestamp_opt(1_000, 0).unwrap();
/// let tick = Utc.timestamp_opt(1_600, 0).unwrap();
/// assert_eq!(attach_at(Some(tick), now), Some(Utc.timestamp_opt(1_585, 0).unwrap()));
/// assert_eq!(attach_at(Some(Utc.timestamp_opt(1_010, 0).unwrap()), now), None);
/// assert_eq!(attach_at(None, now), None);
/// ```
pub fn attach_at(
    fire_time: Option<chrono::DateTime<chrono::Utc>>,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<chrono::DateTime<chrono::Utc>> {
    let lead = chrono::Duration::from_std(ATTACH_LEAD).ok()?;
    let at = fire_time?.checked_sub_signed(lead)?;
    (at > now).then_some(at)
}

/// When the sidecar of the pod with UID `pod_uid` attaches, for a run whose tick is
/// `fire_time`: up to [`ATTACH_LEAD`] before [`attach_at`], by a hash of the UID, so that the
/// sidecars of many runs on one tick spread their attaches (a read and a write each) over the
/// lead rather than sending them to the bucket in the same second. `None`: at once.
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use cojob_controller::run::{attach_at, sidecar_attach_at};
/// let now = Utc.timestamp_opt(1_000, 0).unwrap();
/// let tick = Some(Utc.timestamp_opt(1_600, 0).unwrap());
/// let at = sidecar_attach_at(tick, now, "uid-a").unwrap();
/// let latest = attach_at(tick, now).unwrap();
/// assert!(at <= latest && at >= latest - chrono::Duration::seconds(15));
/// assert_eq!(sidecar_attach_at(tick, now, "uid-a"), Some(at), "the same for the same pod");
/// assert_eq!(sidecar_attach_at(None, now, "uid-a"), None);
/// ```
pub fn sidecar_attach_at(
    fire_time: Option<chrono::DateTime<chrono::Utc>>,
    now: chrono::DateTime<chrono::Utc>,
    pod_uid: &str,
) -> Option<chrono::DateTime<chrono::Utc>> {
    let latest = attach_at(fire_time, now)?;
    let spread = u64::try_from(ATTACH_LEAD.as_millis()).ok()?.max(1);
    let hash = pod_uid.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let early = chrono::Duration::milliseconds(i64::try_from(hash % spread).ok()?);
    let at = latest.checked_sub_signed(early)?;
    (at > now).then_some(at)
}

impl RunState {
    /// True while the current attempt's workload has not started: the run is `pending` and
    /// no sidecar recorded a start. Such an attempt did nothing, so losing it costs no attempt.
    pub fn never_started(&self) -> bool {
        self.status == RunPhase::Pending && self.started_at.is_none()
    }

    /// The run's tick as a time (`None` without one, or if it does not parse).
    pub fn fire_at(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        cojob::json::parse_time(self.fire_time.as_deref()?).ok()
    }

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
    /// The attempt's workload started meanwhile.
    #[error("the attempt started")]
    Started,
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
/// `cancelled`. An attempt whose workload never started (its lease was lost while the pod
/// waited for a node, an image or a controller) is taken over without counting: the new
/// epoch keeps its attempt number. The caller releases a lease acquired into a terminal phase
/// at once.
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
    let attempt = if state.never_started() {
        state.attempt.max(1)
    } else {
        state.attempt.saturating_add(1)
    };
    if attempt > a.max_attempts {
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
            "attempt": attempt,
            "dispatch": a.dispatch,
            "dispatched_at": a.now,
            "pod": null,
            "pod_uid": null,
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
    if state.status == RunPhase::Retrying && !outcome.succeeded {
        // Someone recorded this attempt's end already; the next attempt is being dispatched.
        // A success is never dropped, though: a workload that exited 0 ends the run (G2).
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

/// Why an attempt whose pod never started is given up.
pub const START_TIMEOUT: &str = "StartTimeout";

/// The state that ends an attempt whose workload did not start within the job's
/// `startTimeoutSeconds` (unschedulable, an image that never pulls, a sidecar that cannot reach
/// the store). It counts as a failed attempt. Refused once a sidecar recorded a start, so a pod
/// that starts at the last moment keeps its attempt: the compare-and-swap decides.
///
/// ```
/// use cojob_controller::run::{start_timed_out, RunPhase};
/// use serde_json::json;
/// let pending = json!({"status": "pending", "attempt": 1, "run_id": "r"});
/// let (state, phase) = start_timed_out(&pending, 2, "t").unwrap();
/// assert_eq!((phase, state["reason"].as_str()), (RunPhase::Retrying, Some("StartTimeout")));
/// let started = json!({"status": "running", "attempt": 1, "run_id": "r", "started_at": "t"});
/// assert!(start_timed_out(&started, 2, "t").is_err());
/// ```
pub fn start_timed_out(
    prev: &Value,
    max_attempts: u32,
    now: &str,
) -> Result<(Value, RunPhase), Refusal> {
    fail_unstarted(prev, START_TIMEOUT, max_attempts, now)
}

/// Fails an attempt whose workload never started, with `reason`; refused once a sidecar
/// recorded a start.
fn fail_unstarted(
    prev: &Value,
    reason: &str,
    max_attempts: u32,
    now: &str,
) -> Result<(Value, RunPhase), Refusal> {
    let state = RunState::parse(prev)?;
    if !state.never_started() {
        return Err(Refusal::Started);
    }
    let outcome = PodOutcome {
        succeeded: false,
        exit_code: None,
        reason: Some(reason.into()),
    };
    complete(prev, &outcome, max_attempts, now)
}

/// The reason recorded when the API server refused an attempt's pod.
pub const POD_REJECTED: &str = "PodRejected";

/// The API server refused to create the attempt's pod (an invalid template, PodSecurity, a
/// quota): the attempt fails with reason `PodRejected` (it counts), unless its workload
/// started meanwhile.
///
/// ```
/// use cojob_controller::run::{RunPhase, pod_rejected};
/// use serde_json::json;
/// let pending = json!({"status": "pending", "attempt": 1, "run_id": "r"});
/// let (state, phase) = pod_rejected(&pending, 1, "t").unwrap();
/// assert_eq!((phase, state["reason"].as_str()), (RunPhase::Failed, Some("PodRejected")));
/// ```
pub fn pod_rejected(
    prev: &Value,
    max_attempts: u32,
    now: &str,
) -> Result<(Value, RunPhase), Refusal> {
    fail_unstarted(prev, POD_REJECTED, max_attempts, now)
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

/// Like [`cancel`], for an attempt the caller saw never started: refused if its sidecar
/// recorded a start since, so a workload that runs is never declared cancelled.
///
/// ```
/// use cojob_controller::run::cancel_unstarted;
/// use serde_json::json;
/// let pending = json!({"status": "pending", "attempt": 1, "run_id": "r"});
/// assert_eq!(cancel_unstarted(&pending, "t").unwrap()["status"], "cancelled");
/// let running = json!({"status": "running", "attempt": 1, "run_id": "r", "started_at": "t"});
/// assert!(cancel_unstarted(&running, "t").is_err());
/// ```
pub fn cancel_unstarted(prev: &Value, now: &str) -> Result<Value, Refusal> {
    if !RunState::parse(prev)?.never_started() {
        return Err(Refusal::Started);
    }
    cancel(prev, now)
}

/// What was observed of one pod of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodView {
    /// No such pod, or a pod deleted before it was placed on a node: nothing of it ever ran
    /// or ever will (the API server refuses to bind a pod that is being deleted).
    Absent,
    /// It exists and may run: pending on a node, running, or being stopped.
    Live,
    /// It ended: the kubelet reported every main container terminated.
    Ended(PodOutcome),
}

impl PodView {
    /// Nothing of this pod runs now or later (G3 waits for this before the next attempt).
    pub fn is_quiescent(&self) -> bool {
        !matches!(self, PodView::Live)
    }

    /// The pod ended and its workload succeeded.
    pub fn succeeded(&self) -> Option<&PodOutcome> {
        match self {
            PodView::Ended(o) if o.succeeded => Some(o),
            _ => None,
        }
    }
}

/// What the sweeper saw of a run besides its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The pod of the lease's current epoch.
    pub current: PodView,
    /// The ended pod, of any epoch, whose workload succeeded, if any.
    pub succeeded: Option<PodOutcome>,
    /// Every pod of an older epoch than the lease's is quiescent.
    pub predecessors_quiescent: bool,
    /// The lease is held and the current epoch's pod does not exist (confirmed by a fresh
    /// read): it was never created (a crash, or it waited for an older pod), or it was removed.
    pub pod_missing: bool,
    /// From when the current attempt's start timeout counts ([`StartClock`]).
    pub start_clock: StartClock,
    /// The current attempt's pod exists and no kubelet has taken it up yet
    /// (`status.startTime` unset): since its creation. Such a pod runs nothing, so its sidecar
    /// cannot attach, and its kubelet's acknowledgement, once late, is a cue
    /// ([`crate::cues::LATE_TAKE_UP`]). `None` for a pod taken up, or not seen.
    pub waiting_since: Option<chrono::DateTime<chrono::Utc>>,
}

/// From when an attempt's start timeout (`startTimeoutSeconds`) counts, by where the
/// scheduler and the node's kubelet stand with its pod.
///
/// The timeout is there for a pod that will not start (no node fits it, an image that never
/// pulls, a sidecar that cannot reach the store), so that it cannot hold its run, and under
/// `Forbid` every later tick, forever. A pod that merely waits in the scheduler's queue, behind
/// thousands of others, is not such a pod: a new attempt would only go to the back of the same
/// queue, and add to the load. Nor is a pod bound to a node whose kubelet has not taken it up:
/// a new attempt's pod would be created only once this one stopped (G3), which only that
/// kubelet can report. So the clock starts at the scheduler's decision that no node fits, or
/// at the kubelet's acknowledgement of a bound pod, and a pod waiting for either is never
/// late.
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use cojob_controller::run::StartClock;
/// let dispatched = Utc.timestamp_opt(1_000, 0).unwrap();
/// let placed = Utc.timestamp_opt(1_700, 0).unwrap();
/// assert_eq!(StartClock::FromDispatch.since(dispatched), Some(dispatched));
/// assert_eq!(StartClock::Since(placed).since(dispatched), Some(placed));
/// assert_eq!(StartClock::Queued.since(dispatched), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartClock {
    /// From the attempt's dispatch: its pod is held by a scheduling gate (the controller's
    /// own, until the holder Secret exists, or the template's), bound by the template's
    /// `nodeName` and not taken up yet, or not seen.
    #[default]
    FromDispatch,
    /// The pod waits for the scheduler's first look, or for its node's kubelet to take it
    /// up: no clock runs.
    Queued,
    /// The scheduler found no node for the pod at this time, or its node's kubelet took it up
    /// then: from then, or from the dispatch if that is later (a clock behind the
    /// controller's).
    Since(chrono::DateTime<chrono::Utc>),
}

impl StartClock {
    /// When the start timeout starts counting for an attempt dispatched at `dispatched`;
    /// `None` while it does not.
    pub fn since(
        self,
        dispatched: chrono::DateTime<chrono::Utc>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        match self {
            StartClock::FromDispatch => Some(dispatched),
            StartClock::Queued => None,
            StartClock::Since(decided) => Some(decided.max(dispatched)),
        }
    }
}

/// The timing rules of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// The controller's clock.
    pub now: chrono::DateTime<chrono::Utc>,
    /// How far a holder's clock may be behind the controller's: a lease is stolen only once
    /// `now >= deadline + skew_allowance`.
    pub skew_allowance: std::time::Duration,
    /// How long an attempt's pod may take to start its workload before the attempt fails.
    pub start_timeout: std::time::Duration,
}

impl Timing {
    fn lease_expired(&self, lease: &LeaseInfo) -> bool {
        let allowance =
            chrono::Duration::from_std(self.skew_allowance).unwrap_or(chrono::Duration::MAX);
        self.now
            .checked_sub_signed(allowance)
            .is_some_and(|judged| lease.is_expired_at(judged))
    }

    fn start_overdue(&self, state: &RunState, clock: StartClock) -> bool {
        self.start_deadline(state, clock)
            .is_some_and(|due| self.now >= due)
    }

    /// When the attempt in `state` fails for not having started, with its pod's start clock
    /// ([`StartClock`]): `None` while no clock runs (its pod waits in a queue) or the state
    /// does not say when it was dispatched. The start timeout from the clock's start, or for
    /// a run decided ahead of its tick, [`ATTACH_LEAD`] after the tick if that is later: its
    /// sidecar attaches only that lead before the tick.
    ///
    /// ```
    /// use chrono::{TimeZone, Utc};
    /// use cojob_controller::run::{RunState, StartClock, Timing};
    /// let now = Utc.timestamp_opt(1_000, 0).unwrap();
    /// let timing = Timing { now, skew_allowance: std::time::Duration::from_secs(5), start_timeout: std::time::Duration::from_secs(600) };
    /// let state = RunState { dispatched_at: Some("1970-01-01T00:16:40Z".into()), ..RunState::default() };
    /// assert_eq!(timing.start_deadline(&state, StartClock::FromDispatch), Some(now + chrono::Duration::seconds(600)));
    /// assert_eq!(timing.start_deadline(&state, StartClock::Queued), None);
    /// // Decided 600 s ahead of its tick: its sidecar attaches 15 to 30 s before it.
    /// let ahead = RunState { fire_time: Some("1970-01-01T00:26:40Z".into()), ..state };
    /// assert_eq!(timing.start_deadline(&ahead, StartClock::FromDispatch), Some(now + chrono::Duration::seconds(615)));
    /// ```
    pub fn start_deadline(
        &self,
        state: &RunState,
        clock: StartClock,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        let since = state
            .dispatched_at
            .as_deref()
            .and_then(|t| t.parse::<chrono::DateTime<chrono::Utc>>().ok())
            .and_then(|dispatched| clock.since(dispatched))?;
        let timeout =
            chrono::Duration::from_std(self.start_timeout).unwrap_or(chrono::Duration::MAX);
        let due = since.checked_add_signed(timeout)?;
        // The sidecar of a run decided ahead of its tick attaches only shortly before it, at
        // the latest [`ATTACH_LEAD`] before it: it gets until as long after the tick,
        // whatever its start timeout.
        let lead = chrono::Duration::from_std(ATTACH_LEAD).ok()?;
        let attach_by =
            attach_at(state.fire_at(), since).and_then(|at| at.checked_add_signed(lead + lead));
        Some(attach_by.map_or(due, |by| due.max(by)))
    }
}

/// The next step for a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// No lease yet, or released between attempts: acquire a new epoch and spawn its pod.
    Dispatch,
    /// The run is over; nothing is ever spawned again.
    Finished(Box<RunState>),
    /// Held and its pod lives, or the pod waits for an older one to stop: nothing to do but
    /// keep a pending attempt's lease alive.
    Wait,
    /// Held, the attempt never started, its pod does not exist, and every older pod is
    /// quiescent: create it (again). Its sidecar starts the workload only if no other pod of
    /// the epoch started first.
    CreatePod,
    /// A pod ended: record its outcome. A success of any epoch ends the run (G2).
    Complete(PodOutcome),
    /// The current attempt's pod did not start its workload within the start timeout.
    StartTimedOut,
    /// Held past its deadline plus the skew allowance by a pod that is gone or silent: take a
    /// new epoch. Its pod is created once the old one is quiescent (G3).
    Steal,
}

/// Picks a run's next step from its lease and what was observed of its pods.
pub fn decide(
    lease: Option<&LeaseInfo>,
    seen: &Observed,
    timing: &Timing,
) -> Result<Step, Refusal> {
    let Some(lease) = lease else {
        return Ok(Step::Dispatch);
    };
    let state = RunState::parse(&lease.state)?;
    if state.status.is_terminal() {
        return Ok(Step::Finished(Box::new(state)));
    }
    if let Some(ok) = &seen.succeeded {
        return Ok(Step::Complete(ok.clone()));
    }
    if lease.is_released() {
        return Ok(Step::Dispatch);
    }
    match &seen.current {
        PodView::Ended(outcome) => Ok(Step::Complete(outcome.clone())),
        // Before expiry: a pod that never started in time fails its attempt, even if no
        // controller kept its lease alive meanwhile. A pod still queued for the scheduler is
        // not late ([`StartClock`]).
        PodView::Live
            if state.never_started() && timing.start_overdue(&state, seen.start_clock) =>
        {
            Ok(Step::StartTimedOut)
        }
        // Its sidecar was stopped, which the kubelet does only once the workload's containers
        // ended: the pod's end is late (a busy kubelet), not lost. A takeover would wait for
        // this pod to stop anyway (G3); wait for its end instead, and record it.
        PodView::Live if state.stopping_epoch == Some(lease.epoch) => Ok(Step::Wait),
        _ if timing.lease_expired(lease) => Ok(Step::Steal),
        PodView::Live => Ok(Step::Wait),
        // Only an attempt whose pod never started may have its pod created again, and only
        // once nothing of an older attempt can still run.
        PodView::Absent
            if seen.pod_missing && state.never_started() && seen.predecessors_quiescent =>
        {
            Ok(Step::CreatePod)
        }
        PodView::Absent => Ok(Step::Wait),
    }
}

/// Whether [`decide`] would create the current attempt's pod again were its absence from the
/// pass's view confirmed ([`Observed::pod_missing`]); `seen` is the observation without that
/// confirmation. Only then is the fresh read that confirms it worth its request: for an
/// attempt that started, an expired lease (the takeover reads the pod itself) or an older pod
/// that may still run, the absence decides nothing.
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use cojob::{LeaseInfo, Version};
/// use cojob_controller::run::{absence_decides, Observed, PodView, Timing};
/// use serde_json::json;
/// use std::time::Duration;
/// let now = Utc.timestamp_opt(1_000, 0).unwrap();
/// let lease = |state: serde_json::Value| LeaseInfo {
///     epoch: 2,
///     holder: Some("h".into()),
///     deadline: now + chrono::Duration::seconds(600),
///     state,
///     version: Version { etag: Some("e".into()), generation: None },
/// };
/// let timing = Timing { now, skew_allowance: Duration::from_secs(5), start_timeout: Duration::from_secs(600) };
/// let absent = Observed { current: PodView::Absent, succeeded: None, predecessors_quiescent: true, pod_missing: false, start_clock: Default::default(), waiting_since: None };
/// let pending = lease(json!({"status": "pending", "attempt": 2, "run_id": "r", "dispatched_at": "1970-01-01T00:16:40Z"}));
/// assert!(absence_decides(&pending, &absent, &timing));
/// // The pod of epoch 1 may still run: epoch 2's pod waits, whether or not it exists.
/// let blocked = Observed { predecessors_quiescent: false, ..absent.clone() };
/// assert!(!absence_decides(&pending, &blocked, &timing));
/// // The workload started: its pod is never created again.
/// let running = lease(json!({"status": "running", "attempt": 2, "run_id": "r", "started_at": "t"}));
/// assert!(!absence_decides(&running, &absent, &timing));
/// ```
pub fn absence_decides(lease: &LeaseInfo, seen: &Observed, timing: &Timing) -> bool {
    let confirmed = Observed {
        pod_missing: true,
        ..seen.clone()
    };
    matches!(decide(Some(lease), &confirmed, timing), Ok(Step::CreatePod))
}

/// How long the leases of a job's attempts hold: what [`quiet_until`] trusts a deadline for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetimes {
    /// The ttl a sidecar renews its lease for (`lease.ttlSeconds`).
    pub ttl: std::time::Duration,
    /// The ttl the controller holds a pending attempt's lease for: the longer of the ttl and
    /// the start timeout.
    pub pending_ttl: std::time::Duration,
}

/// Until when a run needs no pass unless one of its pods is a cue (its end, its deletion, its
/// workload's start: [`crate::cues`]), for a run whose pod lives, is not being deleted, and of
/// which nothing is asked (no cancel, no stopping sidecar), when the next step is
/// [`Step::Wait`]. `None` when a pass may have work sooner, or the time has come.
///
/// - **Running** (its sidecar attached and renews): the only step a pass could take without a
///   cue is the takeover, which [`decide`] allows from the lease's deadline plus the skew
///   allowance on. A sidecar's renewal only moves the deadline later.
/// - **Pending** (its workload has not started): the earliest of the takeover of the lease as
///   it is; the attempt's start deadline ([`Timing::start_deadline`]; for a pod whose clock
///   has not started, the start timeout from now, since its clock can only start later); and a
///   ttl from now, since its sidecar may attach at any moment and a frozen one could be taken
///   over a ttl plus the allowance after that (the allowance covers the sidecar's clock being
///   behind). For a run decided ahead of its tick, a ttl from its sidecar's attach
///   ([`attach_at`], [`ATTACH_LEAD`] before the tick) instead: its workload cannot start before
///   the tick, so until the lead before it the pod costs only the pending lease's renewals.
///   The controller's own renewal of the pending lease is the caller's to add
///   ([`crate::sweeper`]).
/// - **Pending, its pod not taken up** by a kubelet for twice [`crate::cues::LATE_TAKE_UP`] or
///   more ([`Observed::waiting_since`]: it waits for a node, or for a kubelet with a backlog):
///   the same but the ttl from now. The pod runs nothing, so its sidecar cannot attach before
///   its kubelet takes it up, and that acknowledgement is a cue from then on; so a pod that
///   waits long costs a pass per renewal of its pending lease (a third of the pending ttl),
///   not one per ttl. Were the cue never to come (its node lost between taking it up and
///   reporting it), a sidecar that attached and froze is found by that renewal's pass instead
///   of a ttl later; its workload never started.
///
/// A deadline more than its ttl ahead (a clock that runs ahead wrote it) counts as that ttl
/// from now. A takeover by another controller only makes this one's pass find nothing to do,
/// so the time is never too late. The sweeper skips the run's lease read until then
/// ([`crate::sweeper::focus`]).
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use cojob::{LeaseInfo, Version};
/// use cojob_controller::run::{quiet_until, Lifetimes, Observed, PodView, Step, Timing};
/// use serde_json::json;
/// use std::time::Duration;
/// let now = Utc.timestamp_opt(1_000, 0).unwrap();
/// let lease = |state: serde_json::Value, deadline_in: i64| LeaseInfo {
///     epoch: 1,
///     holder: Some("h".into()),
///     deadline: now + chrono::Duration::seconds(deadline_in),
///     state,
///     version: Version { etag: Some("e".into()), generation: None },
/// };
/// let seen = Observed { current: PodView::Live, succeeded: None, predecessors_quiescent: true, pod_missing: false, start_clock: Default::default(), waiting_since: None };
/// let timing = Timing { now, skew_allowance: Duration::from_secs(5), start_timeout: Duration::from_secs(600) };
/// let ttls = Lifetimes { ttl: Duration::from_secs(60), pending_ttl: Duration::from_secs(600) };
/// let running = lease(json!({"status": "running", "attempt": 1, "run_id": "r", "started_at": "t"}), 40);
/// assert_eq!(quiet_until(&running, &Step::Wait, &seen, &timing, ttls), Some(now + chrono::Duration::seconds(45)));
/// // Its sidecar may attach any moment: a ttl from now.
/// let pending = lease(json!({"status": "pending", "attempt": 1, "run_id": "r", "dispatched_at": "1970-01-01T00:16:40Z"}), 600);
/// assert_eq!(quiet_until(&pending, &Step::Wait, &seen, &timing, ttls), Some(now + chrono::Duration::seconds(60)));
/// // Its pod has waited a minute for a node: nothing can attach before a kubelet takes it
/// // up, which is a cue; its start deadline (the start timeout from now) or the renewal.
/// let waiting = Observed { waiting_since: Some(now - chrono::Duration::seconds(60)), ..seen };
/// assert_eq!(quiet_until(&pending, &Step::Wait, &waiting, &timing, ttls), Some(now + chrono::Duration::seconds(600)));
/// ```
pub fn quiet_until(
    lease: &LeaseInfo,
    step: &Step,
    seen: &Observed,
    timing: &Timing,
    lifetimes: Lifetimes,
) -> Option<chrono::DateTime<chrono::Utc>> {
    if *step != Step::Wait || lease.is_released() || seen.current != PodView::Live {
        return None;
    }
    let state = RunState::parse(&lease.state).ok()?;
    if state.cancel_requested || state.stopping_epoch == Some(lease.epoch) {
        return None;
    }
    let after = |d: std::time::Duration| {
        chrono::Duration::from_std(d)
            .ok()
            .and_then(|d| timing.now.checked_add_signed(d))
    };
    let allowance = chrono::Duration::from_std(timing.skew_allowance).ok()?;
    // The takeover of the lease as it is; a deadline further than its ttl away was written
    // by a clock that runs ahead: trust it no further than a renewal now could have set it.
    let takeover = |ttl: std::time::Duration| {
        lease
            .deadline
            .min(after(ttl)?)
            .checked_add_signed(allowance)
    };
    let until = if state.never_started() {
        let start = timing
            .start_deadline(&state, seen.start_clock)
            .or_else(|| after(timing.start_timeout))?;
        let until = takeover(lifetimes.pending_ttl)?.min(start);
        let long_waiting = seen.waiting_since.is_some_and(|created| {
            chrono::Duration::from_std(crate::cues::LATE_TAKE_UP * 2)
                .is_ok_and(|long| timing.now - created >= long)
        });
        if long_waiting {
            until
        } else {
            // Its sidecar attaches at once, or for a run decided ahead, by the lead before its
            // tick ([`attach_at`]).
            let attach = attach_at(state.fire_at(), timing.now).unwrap_or(timing.now);
            let ttl = chrono::Duration::from_std(lifetimes.ttl).ok()?;
            until.min(attach.checked_add_signed(ttl)?)
        }
    } else if state.status == RunPhase::Running {
        takeover(lifetimes.ttl)?
    } else {
        return None;
    };
    (until > timing.now).then_some(until)
}

/// True when a run's pod of `pod_epoch` may lose its result finalizer (and so disappear): it
/// is quiescent, and its outcome is recorded or no longer matters. A pod whose workload
/// succeeded keeps it until the run is recorded `succeeded` (G2).
///
/// ```
/// use cojob_controller::run::{may_release_pod, PodView};
/// assert!(!may_release_pod(1, &PodView::Live, None), "a live pod keeps it");
/// assert!(may_release_pod(1, &PodView::Absent, None), "no run: nothing to record");
/// ```
pub fn may_release_pod(pod_epoch: u64, view: &PodView, lease: Option<&LeaseInfo>) -> bool {
    if !view.is_quiescent() {
        return false;
    }
    let Some(lease) = lease else {
        return true;
    };
    let Ok(state) = RunState::parse(&lease.state) else {
        return false;
    };
    if state.status.is_terminal() {
        return true;
    }
    match pod_epoch.cmp(&lease.epoch) {
        std::cmp::Ordering::Less => view.succeeded().is_none(),
        std::cmp::Ordering::Equal => lease.is_released() || matches!(view, PodView::Absent),
        std::cmp::Ordering::Greater => false,
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

    fn timing() -> Timing {
        Timing {
            now: now(),
            skew_allowance: std::time::Duration::from_secs(5),
            start_timeout: std::time::Duration::from_secs(600),
        }
    }

    fn seen(current: PodView) -> Observed {
        Observed {
            current,
            succeeded: None,
            predecessors_quiescent: true,
            pod_missing: false,
            start_clock: StartClock::FromDispatch,
            waiting_since: None,
        }
    }

    fn ok() -> PodOutcome {
        PodOutcome {
            succeeded: true,
            exit_code: Some(0),
            reason: None,
        }
    }

    const TTL: Lifetimes = Lifetimes {
        ttl: std::time::Duration::from_secs(30),
        pending_ttl: std::time::Duration::from_secs(600),
    };

    #[test]
    fn a_running_attempt_is_quiet_until_its_lease_may_be_taken_over() {
        let t = timing();
        let running = json!({"status": "running", "attempt": 1, "run_id": "r", "started_at": "x"});
        let held = lease(running.clone(), Some("h"), 10);
        let live = seen(PodView::Live);
        let until = now() + Duration::seconds(15);
        assert_eq!(quiet_until(&held, &Step::Wait, &live, &t, TTL), Some(until));
        // At that time the takeover is due: decide steals, so the time is not too late.
        let later = Timing { now: until, ..t };
        assert_eq!(decide(Some(&held), &live, &later), Ok(Step::Steal));
        let before = Timing {
            now: until - Duration::milliseconds(1),
            ..t
        };
        assert_eq!(decide(Some(&held), &live, &before), Ok(Step::Wait));
        // Nothing is quiet that a timer pass must look at sooner.
        let stopping = lease(mark_stopping(&running, 2), Some("h"), 10);
        assert_eq!(
            quiet_until(&stopping, &Step::Wait, &live, &t, TTL),
            None,
            "a stopping sidecar"
        );
        let older_mark = lease(mark_stopping(&running, 1), Some("h"), 10);
        assert_eq!(
            quiet_until(&older_mark, &Step::Wait, &live, &t, TTL),
            Some(until),
            "an older epoch's mark"
        );
        let mut cancelled = running.clone();
        cancelled["cancel_requested"] = json!(true);
        let cancelled = lease(cancelled, Some("h"), 10);
        assert_eq!(
            quiet_until(&cancelled, &Step::Wait, &live, &t, TTL),
            None,
            "a cancel"
        );
        assert_eq!(
            quiet_until(&held, &Step::Wait, &seen(PodView::Absent), &t, TTL),
            None,
            "no live pod"
        );
        assert_eq!(
            quiet_until(&held, &Step::Steal, &live, &t, TTL),
            None,
            "another step"
        );
        let released = lease(running.clone(), None, 10);
        assert_eq!(
            quiet_until(&released, &Step::Wait, &live, &t, TTL),
            None,
            "released"
        );
        // A deadline written by a clock that runs ahead counts as a ttl from now.
        let ahead = lease(running.clone(), Some("h"), 300);
        assert_eq!(
            quiet_until(&ahead, &Step::Wait, &live, &t, TTL),
            Some(now() + Duration::seconds(35))
        );
        let expired = lease(running, Some("h"), -5);
        assert_eq!(
            quiet_until(&expired, &Step::Wait, &live, &t, TTL),
            None,
            "due now"
        );
    }

    #[test]
    fn a_pending_attempt_is_quiet_until_a_step_may_be_due() {
        let t = timing();
        let dispatched = now() - Duration::seconds(100);
        let pending = |deadline_in: i64| {
            lease(
                json!({"status": "pending", "attempt": 1, "run_id": "r",
                    "dispatched_at": cojob::json::format_time(dispatched)}),
                Some("h"),
                deadline_in,
            )
        };
        let with_clock = |start_clock: StartClock| Observed {
            start_clock,
            ..seen(PodView::Live)
        };
        let quiet = |l: &LeaseInfo, clock: StartClock| {
            quiet_until(l, &Step::Wait, &with_clock(clock), &t, TTL)
        };
        // A fresh pending lease: the sidecar may attach now, so a ttl from now.
        let fresh = pending(600);
        let in_ttl = now() + Duration::seconds(30);
        assert_eq!(quiet(&fresh, StartClock::FromDispatch), Some(in_ttl));
        assert_eq!(quiet(&fresh, StartClock::Queued), Some(in_ttl));
        // Its start deadline first: 600 s from the dispatch, 100 s ago, against a ttl of 600.
        let ttls = Lifetimes {
            ttl: std::time::Duration::from_secs(600),
            ..TTL
        };
        let at = |clock| quiet_until(&fresh, &Step::Wait, &with_clock(clock), &t, ttls);
        let due = dispatched + Duration::seconds(600);
        assert_eq!(at(StartClock::FromDispatch), Some(due));
        // At that time decide fails the attempt; a millisecond before, it waits.
        let late = |now| Timing { now, ..t };
        let live = with_clock(StartClock::FromDispatch);
        assert_eq!(
            decide(Some(&fresh), &live, &late(due)),
            Ok(Step::StartTimedOut)
        );
        assert_eq!(
            decide(Some(&fresh), &live, &late(due - Duration::milliseconds(1))),
            Ok(Step::Wait)
        );
        // A clock that started later moves it; a queued pod's clock can only start from now.
        let bound = now() - Duration::seconds(10);
        assert_eq!(
            at(StartClock::Since(bound)),
            Some(bound + Duration::seconds(600))
        );
        assert_eq!(at(StartClock::Queued), Some(now() + Duration::seconds(600)));
        // Or the takeover of the pending lease as it is, when nothing renewed it.
        let old = pending(20);
        assert_eq!(
            quiet(&old, StartClock::Queued),
            Some(now() + Duration::seconds(25))
        );
        assert_eq!(
            decide(Some(&old), &live, &late(now() + Duration::seconds(25))),
            Ok(Step::Steal)
        );
        // A pending deadline written by a clock far ahead counts as the pending ttl from now.
        let ahead = pending(5_000);
        let far = Lifetimes {
            ttl: std::time::Duration::from_secs(5_000),
            pending_ttl: std::time::Duration::from_secs(50),
        };
        assert_eq!(
            quiet_until(
                &ahead,
                &Step::Wait,
                &with_clock(StartClock::Queued),
                &t,
                far
            ),
            Some(now() + Duration::seconds(55))
        );
        // Nothing is quiet that is overdue, asked to stop, or without a live pod.
        assert_eq!(quiet(&pending(-5), StartClock::Queued), None, "due now");
        let mut cancelled = fresh.clone();
        cancelled.state["cancel_requested"] = json!(true);
        assert_eq!(quiet(&cancelled, StartClock::Queued), None, "a cancel");
        assert_eq!(
            quiet_until(&fresh, &Step::Wait, &seen(PodView::Absent), &t, TTL),
            None,
            "no pod yet"
        );
    }

    /// A run decided 600 s ahead of its tick: its sidecar attaches [`ATTACH_LEAD`] before the
    /// tick, so until then its pod needs no pass a ttl after each (only the pending lease's
    /// renewals, the caller's), and its start is not late before the lead after the tick.
    #[test]
    fn a_run_decided_ahead_waits_for_its_attach_a_lead_before_its_tick() {
        let t = timing();
        let tick = now() + Duration::seconds(600);
        let prepared = lease(
            json!({"status": "pending", "attempt": 1, "run_id": "r",
                "fire_time": cojob::json::format_time(tick),
                "dispatched_at": cojob::json::format_time(now())}),
            Some("h"),
            700,
        );
        let live = seen(PodView::Live);
        let attach = tick - Duration::seconds(15);
        assert_eq!(attach_at(Some(tick), now()), Some(attach));
        let short = Lifetimes {
            ttl: std::time::Duration::from_secs(10),
            ..TTL
        };
        assert_eq!(
            quiet_until(&prepared, &Step::Wait, &live, &t, short),
            Some(attach + Duration::seconds(10)),
            "a ttl after its attach"
        );
        // Its start deadline: the start timeout (600 s) would end at the tick; the lead after
        // it is later.
        let state = RunState::parse(&prepared.state).unwrap();
        let late_by = tick + Duration::seconds(15);
        assert_eq!(
            t.start_deadline(&state, StartClock::FromDispatch),
            Some(late_by)
        );
        let at = |now| Timing { now, ..t };
        assert_eq!(decide(Some(&prepared), &live, &at(tick)), Ok(Step::Wait));
        assert_eq!(
            decide(Some(&prepared), &live, &at(late_by)),
            Ok(Step::StartTimedOut)
        );
        // A longer start timeout keeps its own deadline.
        let patient = Timing {
            start_timeout: std::time::Duration::from_secs(900),
            ..t
        };
        assert_eq!(
            patient.start_deadline(&state, StartClock::FromDispatch),
            Some(now() + Duration::seconds(900))
        );
        // Inside the lead, and for a run whose tick passed, the sidecar attaches at once.
        let soon = Timing {
            now: attach + Duration::seconds(1),
            ..t
        };
        assert_eq!(
            quiet_until(&prepared, &Step::Wait, &live, &soon, short),
            Some(soon.now + Duration::seconds(10))
        );
        assert_eq!(attach_at(Some(tick), tick), None);
        let mut no_tick = prepared.clone();
        no_tick.state["fire_time"] = json!("once");
        assert_eq!(
            quiet_until(&no_tick, &Step::Wait, &live, &t, short),
            Some(now() + Duration::seconds(10)),
            "no tick to wait for"
        );
    }

    /// The sweeper confirms a pod's absence only where [`absence_decides`] says so: everywhere
    /// else the confirmation must not change the decision.
    #[test]
    fn an_absence_decides_only_the_creation_of_the_pod() {
        let t = timing();
        let states = [
            json!({"status": "pending", "attempt": 2, "run_id": "r"}),
            json!({"status": "pending", "attempt": 2, "run_id": "r", "dispatched_at": "2026-08-09T01:00:00Z"}),
            json!({"status": "running", "attempt": 2, "run_id": "r", "started_at": "x"}),
            json!({"status": "pending", "attempt": 2, "run_id": "r", "stopping_epoch": 2}),
            json!({"status": "succeeded", "attempt": 2, "run_id": "r"}),
            json!({"status": "pending", "attempt": 2, "run_id": "r", "cancel_requested": true}),
            json!(null),
        ];
        let mut creations = 0;
        for state in states {
            for holder in [Some("h"), None] {
                for deadline_in in [-60, -3, 10, 600] {
                    let l = lease(state.clone(), holder, deadline_in);
                    for quiescent in [true, false] {
                        for succeeded in [None, Some(ok())] {
                            let unconfirmed = Observed {
                                predecessors_quiescent: quiescent,
                                succeeded: succeeded.clone(),
                                ..seen(PodView::Absent)
                            };
                            let confirmed = Observed {
                                pod_missing: true,
                                ..unconfirmed.clone()
                            };
                            let (before, after) = (
                                decide(Some(&l), &unconfirmed, &t),
                                decide(Some(&l), &confirmed, &t),
                            );
                            if absence_decides(&l, &unconfirmed, &t) {
                                creations += 1;
                                assert_eq!(after, Ok(Step::CreatePod), "{l:?} {unconfirmed:?}");
                            } else {
                                assert_eq!(before, after, "{l:?} {unconfirmed:?}");
                            }
                        }
                    }
                }
            }
        }
        // Held, within its deadline and the allowance (3 deadlines), never started (4 states),
        // older pods quiescent, no success.
        assert_eq!(creations, 12);
    }

    #[test]
    fn decide_covers_every_lease_and_pod_combination() {
        let t = timing();
        let running = json!({"status": "running", "attempt": 1, "run_id": "r", "started_at": "x"});
        let ended = PodView::Ended(failed(1));
        assert_eq!(decide(None, &seen(PodView::Absent), &t), Ok(Step::Dispatch));
        let held = lease(running.clone(), Some("h"), 10);
        assert_eq!(
            decide(Some(&held), &seen(PodView::Live), &t),
            Ok(Step::Wait)
        );
        // A missing pod is created again only for an attempt that never started.
        let pending = lease(
            json!({"status": "pending", "attempt": 1, "run_id": "r"}),
            Some("h"),
            10,
        );
        let unspawned = Observed {
            pod_missing: true,
            ..seen(PodView::Absent)
        };
        assert_eq!(decide(Some(&pending), &unspawned, &t), Ok(Step::CreatePod));
        // ... and only once every older pod is quiescent (G3).
        let blocked = Observed {
            predecessors_quiescent: false,
            ..unspawned.clone()
        };
        assert_eq!(decide(Some(&pending), &blocked, &t), Ok(Step::Wait));
        assert_eq!(
            decide(Some(&held), &unspawned, &t),
            Ok(Step::Wait),
            "a pod that ran and was deleted is never created again under the same epoch"
        );
        assert_eq!(
            decide(Some(&held), &seen(PodView::Absent), &t),
            Ok(Step::Wait)
        );
        assert_eq!(
            decide(Some(&held), &seen(ended.clone()), &t),
            Ok(Step::Complete(failed(1)))
        );
        // Expiry is judged with the skew allowance: not stolen until deadline + allowance.
        let just_expired = lease(running.clone(), Some("h"), 0);
        assert_eq!(
            decide(Some(&just_expired), &seen(PodView::Live), &t),
            Ok(Step::Wait)
        );
        let expired = lease(running.clone(), Some("h"), -5);
        assert_eq!(
            decide(Some(&expired), &seen(PodView::Live), &t),
            Ok(Step::Steal)
        );
        assert_eq!(
            decide(Some(&expired), &seen(PodView::Absent), &t),
            Ok(Step::Steal)
        );
        // An ended pod is completed even after expiry: its result is not thrown away.
        assert_eq!(
            decide(Some(&expired), &seen(ended.clone()), &t),
            Ok(Step::Complete(failed(1)))
        );
        // A stopped sidecar's workload has ended: its pod's late end is waited for, not taken
        // over. A mark of an older epoch does not count.
        let stopping = lease(mark_stopping(&running, 2), Some("h"), -5);
        assert_eq!(
            decide(Some(&stopping), &seen(PodView::Live), &t),
            Ok(Step::Wait)
        );
        assert_eq!(
            decide(Some(&stopping), &seen(PodView::Absent), &t),
            Ok(Step::Steal),
            "a stopped attempt whose pod is gone is taken over"
        );
        assert_eq!(
            decide(Some(&stopping), &seen(ended.clone()), &t),
            Ok(Step::Complete(failed(1)))
        );
        let stopped_before = lease(mark_stopping(&running, 1), Some("h"), -5);
        assert_eq!(
            decide(Some(&stopped_before), &seen(PodView::Live), &t),
            Ok(Step::Steal)
        );
        // A success of any epoch ends the run, even when the lease moved on (G2).
        let older_ok = Observed {
            succeeded: Some(ok()),
            ..seen(PodView::Absent)
        };
        assert_eq!(
            decide(Some(&expired), &older_ok, &t),
            Ok(Step::Complete(ok()))
        );
        let retrying = lease(
            json!({"status": "retrying", "attempt": 1, "run_id": "r"}),
            None,
            -5,
        );
        assert_eq!(
            decide(Some(&retrying), &seen(ended), &t),
            Ok(Step::Dispatch)
        );
        assert_eq!(
            decide(Some(&retrying), &older_ok, &t),
            Ok(Step::Complete(ok()))
        );
        let done = lease(
            json!({"status": "succeeded", "attempt": 1, "run_id": "r"}),
            None,
            -5,
        );
        assert!(matches!(
            decide(Some(&done), &older_ok, &t),
            Ok(Step::Finished(s)) if s.status == RunPhase::Succeeded
        ));
        assert!(decide(Some(&lease(json!(42), None, 0)), &seen(PodView::Absent), &t).is_err());
    }

    #[test]
    fn a_pod_that_does_not_start_in_time_ends_its_attempt() {
        let t = timing();
        let at = |secs_ago: i64| cojob::json::format_time(now() - Duration::seconds(secs_ago));
        let pending = |since: String| {
            lease(
                json!({"status": "pending", "attempt": 1, "run_id": "r", "dispatched_at": since}),
                Some("h"),
                10,
            )
        };
        assert_eq!(
            decide(Some(&pending(at(599))), &seen(PodView::Live), &t),
            Ok(Step::Wait)
        );
        assert_eq!(
            decide(Some(&pending(at(600))), &seen(PodView::Live), &t),
            Ok(Step::StartTimedOut)
        );
        let started = lease(
            json!({"status": "running", "attempt": 1, "run_id": "r", "dispatched_at": at(900), "started_at": at(10)}),
            Some("h"),
            10,
        );
        assert_eq!(
            decide(Some(&started), &seen(PodView::Live), &t),
            Ok(Step::Wait)
        );
    }

    #[test]
    fn the_start_timeout_counts_from_the_schedulers_decision() {
        let t = timing();
        let ago = |secs: i64| now() - Duration::seconds(secs);
        let pending = lease(
            json!({"status": "pending", "attempt": 1, "run_id": "r",
                   "dispatched_at": cojob::json::format_time(ago(3_600))}),
            Some("h"),
            10,
        );
        let with = |start_clock| Observed {
            start_clock,
            ..seen(PodView::Live)
        };
        // An hour in the scheduler's queue is not late: it has not looked at the pod yet.
        assert_eq!(
            decide(Some(&pending), &with(StartClock::Queued), &t),
            Ok(Step::Wait)
        );
        // Placed 599 s ago: still pulling its images, attaching; 600 s: late.
        assert_eq!(
            decide(Some(&pending), &with(StartClock::Since(ago(599))), &t),
            Ok(Step::Wait)
        );
        assert_eq!(
            decide(Some(&pending), &with(StartClock::Since(ago(600))), &t),
            Ok(Step::StartTimedOut)
        );
        // Found no node an hour ago (the time is the condition's, from its creation): late,
        // as from its dispatch.
        assert_eq!(
            decide(Some(&pending), &with(StartClock::Since(ago(3_700))), &t),
            Ok(Step::StartTimedOut)
        );
        // Held by a gate, from its dispatch: an hour is late.
        assert_eq!(
            decide(Some(&pending), &with(StartClock::FromDispatch), &t),
            Ok(Step::StartTimedOut)
        );
        // An attempt whose workload started is never timed out.
        let running = lease(
            json!({"status": "running", "attempt": 1, "run_id": "r", "started_at": "x",
                   "dispatched_at": cojob::json::format_time(ago(3_600))}),
            Some("h"),
            10,
        );
        assert_eq!(
            decide(Some(&running), &with(StartClock::Since(ago(3_600))), &t),
            Ok(Step::Wait)
        );
    }

    #[test]
    fn losing_an_attempt_that_never_started_costs_no_attempt() {
        let never =
            json!({"status": "pending", "attempt": 1, "run_id": "r", "dispatch": "r-1-holder"});
        let next = acquire(Some(&never), &a("r-2-holder", 1)).unwrap();
        assert_eq!(
            (next["status"].as_str(), next["attempt"].as_u64()),
            (Some("pending"), Some(1)),
            "maxAttempts 1 and the only attempt never ran: run it"
        );
        let ran = cojob::lease::merge(&never, json!({"status": "running", "started_at": "t"}));
        let next = acquire(Some(&ran), &a("r-2-holder", 1)).unwrap();
        assert_eq!(next["status"], "failed");
        let timed_out = start_timed_out(&never, 1, "t").unwrap();
        assert_eq!(timed_out.1, RunPhase::Failed, "a start timeout counts");
    }

    #[test]
    fn a_pod_keeps_its_result_finalizer_until_its_outcome_is_recorded() {
        let held = |epoch, status: &str| LeaseInfo {
            epoch,
            ..lease(
                json!({"status": status, "attempt": 1, "run_id": "r"}),
                Some("h"),
                10,
            )
        };
        let ended_ok = PodView::Ended(ok());
        let ended_bad = PodView::Ended(failed(1));
        assert!(!may_release_pod(2, &ended_ok, Some(&held(2, "running"))));
        assert!(
            !may_release_pod(1, &ended_ok, Some(&held(2, "pending"))),
            "G2: an older success is recorded first"
        );
        assert!(may_release_pod(1, &ended_bad, Some(&held(2, "pending"))));
        assert!(may_release_pod(1, &ended_ok, Some(&held(2, "succeeded"))));
        assert!(
            !may_release_pod(2, &ended_bad, Some(&held(2, "running"))),
            "not recorded yet"
        );
        let released = LeaseInfo {
            holder: None,
            ..held(2, "retrying")
        };
        assert!(may_release_pod(2, &ended_bad, Some(&released)));
        assert!(!may_release_pod(
            1,
            &PodView::Live,
            Some(&held(2, "succeeded"))
        ));
        assert!(may_release_pod(
            2,
            &PodView::Absent,
            Some(&held(2, "pending"))
        ));
        assert!(!may_release_pod(3, &ended_bad, Some(&held(2, "pending"))));
    }
}
