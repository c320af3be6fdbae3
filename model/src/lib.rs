//! An exhaustive model of one cojob run, checked with [`stateright`].
//!
//! The model is the run protocol that `cojob-controller` implements: a run's truth is its lease
//! document in the bucket, every bucket write is a linearizable compare-and-swap of the whole
//! document (one atomic step here), and the actors around it are
//!
//! - two stateless **controllers** (each step reads the bucket and the Kubernetes API afresh
//!   and does at most one write: dispatch or steal, fence, the last-attempt rule's fence
//!   instead of a steal, create the pod, keep alive, complete, the start timeout, remove a
//!   pod's finalizer, and the two steps of a cancel);
//! - the **kubelet and the sidecar** of each pod (schedule, attach, renew, workload end, kill
//!   of a deleting pod), each sidecar with its own clock;
//! - **external actors** that delete any pod at any time (kubectl, PodGC, a node drain).
//!
//! Time is a global integer `t` advanced by [`Action::Tick`]; every process reads
//! `t + skew` with a fixed skew in `[-S, S]` picked when the model starts (controllers) or
//! when the pod is scheduled (sidecars). Crashes, frozen sidecars and network partitions
//! need no action of their own: an actor that never takes its next step is one of the
//! behaviours the checker already explores.
//!
//! [`RunModel`] is parameterised by [`Rules`]: [`Rules::NEW`] is the design as implemented,
//! [`Rules::PROPOSED`] adds three rules it still needs, and turning off one rule gives an
//! older design that the checker must refute (the negative controls in `tests/`). [`Bounds`]
//! sizes the state space. The properties are listed in
//! [`RunModel::properties`](stateright::Model::properties); their names are the constants in
//! [`prop`]:
//!
//! - **G1** a tick is decided once (put-if-absent claim);
//! - **G2** a recorded success is final: no workload starts after a workload exited 0, at
//!   most one exits 0, no pod is created after the run is recorded `succeeded`;
//! - **G3** at most one workload of the run runs at any time;
//! - **fencing**: a sidecar writes only its own epoch, and one pod attaches per epoch;
//! - a terminal status never changes, and a recorded success had a workload that exited 0;
//! - **no failure over a success**: a run is recorded `failed` or `cancelled` only if no
//!   workload of the run exited 0, before or after the write. It holds under
//!   [`Rules::PROPOSED`], and under [`Rules::NEW`] without the cancel path, but not under
//!   [`Rules::NEW`] with it: the implemented cancel can record a success as `cancelled` (see
//!   the proposed fields of [`Rules`]);
//! - `sometimes` properties showing that the bounds reach success, failure, retry, steal
//!   (also one the holder's clock does not yet see), the start timeout, the last-attempt
//!   wait, cancel, a cancel-requested run that still succeeds, a success recorded from a
//!   deleted pod, and a new epoch waiting for a running predecessor.
//!
//! ## Abstractions
//!
//! - One run, one lease. The holder written by epoch `e`'s acquisition is named `e`.
//! - A controller step reads a consistent snapshot and acts atomically. This is exact for
//!   bucket writes (compare-and-swap on the whole document). For pod creation the guards
//!   on pods are stable (a quiescent pod stays quiescent; a pod that succeeded stays so, and
//!   visible, until the run is terminal); a creation that lands after the lease moved on
//!   makes a pod whose sidecar's attach fails, which the model does not need to represent.
//!   The one controller step that decides on one read and writes after another is the
//!   cancel of an attempt that never started: [`State::cancel_release`] carries its decision
//!   to [`Action::ReleaseCancelled`].
//! - The kubelet's grace period is any number of steps: a deleting pod's workload may still
//!   exit 0 before the kill.
//! - A sidecar whose renewal fails kills its workload at once; one that never renews again
//!   models a frozen sidecar or a partition.
//! - The start timeout may fire at any time once the pod exists (its duration is not
//!   modelled, so every order of timeout and start is explored).
//! - Holders are derived from the run and the epoch, so `Complete` records with the attempt's
//!   own holder (its takeover of a lease held by another holder is not modelled), and the cancel's
//!   attach does not check the deadline (that check only defers the cancel to its takeover
//!   branch, which is modelled).
//! - Not modelled: several runs, informer staleness.
//!
//! ```
//! use cojob_model::{Bounds, RunModel, Rules, check};
//! let report = check(&RunModel::new(Rules::NEW, Bounds::tiny()), 1);
//! assert!(report.all_hold(), "{report}");
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model, Property};

/// The model checker, re-exported for its [`Model`] trait and [`Property`] type.
pub use stateright;

/// The most epochs (acquisitions) a model can reach; [`Bounds::max_epochs`] may not exceed it.
pub const MAX_EPOCHS: usize = 8;

/// A time, true or local, in abstract ticks.
pub type Time = i16;

/// The design rules under test. [`Rules::NEW`] is the design as implemented; each field set
/// to `false` brings back one rule of an older design, and [`Rules::PROPOSED`] adds the rules
/// that the checker shows are still needed for [`prop::NO_FAILURE_OVER_SUCCESS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rules {
    /// The controller creates a new epoch's pod only once every pod of an older epoch is
    /// quiescent (terminal, absent, or deleting and never scheduled). Off: the pod is created
    /// as soon as the epoch is acquired (the old "create on steal").
    pub wait_for_quiescent_predecessors: bool,
    /// Run pods carry a finalizer that only the controller removes, once the pod's result is
    /// recorded or no longer matters. Off: a deleted pod disappears with its result as soon
    /// as its containers have stopped.
    pub pod_finalizer: bool,
    /// A successful pod of any epoch completes the run, and while one is seen the controller
    /// does nothing else for the run (no dispatch, steal, keep-alive or pod creation). Off:
    /// only the current epoch's pod is looked at.
    pub success_of_any_epoch_completes: bool,
    /// The tick is claimed with put-if-absent, so the loser converges on the winner's
    /// decision. Off: a blind put, after which each controller believes its own decision.
    pub claim_put_if_absent: bool,
    /// The last-attempt rule (the sweeper's `steal`): a lease past its deadline plus the
    /// allowance whose attempt is the last one allowed, started, and whose pod is not
    /// quiescent is not stolen; the controller marks that pod deleting and waits, and
    /// `Complete` records how it ended. Off: the steal records `failed` (`AttemptsExhausted`)
    /// at once while the pod may still run.
    pub last_attempt_waits: bool,
    /// The cancel of `cancel_run`: `cancel_requested` is written first; an attempt that never
    /// started is released as `cancelled`, but one that started is only stopped (its live
    /// pods marked deleting) and `Complete` records how it ended (`succeeded` wins). Off: the
    /// old cancel, which releases the run as `cancelled` while its workload may still run.
    pub cancel_waits_for_started: bool,
    /// Proposed, not implemented: a steal whose acquisition would record `cancelled` (a
    /// cancel was requested) is not taken while a pod of the run is live; the controller
    /// marks the live pods deleting and waits, as the last-attempt rule does, and `Complete`
    /// records how the pod ended. Implemented: `acquire` records `cancelled` at once.
    pub cancel_steal_waits: bool,
    /// Proposed, not implemented: `cancel_run` takes the lease over as `cancelled`, or decides
    /// to release it as `cancelled`, only while every pod of the run is quiescent and none
    /// succeeded; otherwise it writes `cancel_requested`, stops the live pods and leaves the
    /// outcome to `Complete`. Implemented: the takeover of an absent, released or expired
    /// lease and the release of an attempt that never started look at no pod but the
    /// current one.
    pub cancel_waits_for_pods: bool,
    /// Implemented since the model found the gap: the cancel's release of an attempt that never started is
    /// computed on the freshest state and refuses once the sidecar recorded a start (as the
    /// start timeout does). Implemented: `run::cancel` refuses only a terminal state, so a
    /// sidecar's attach that lands between the cancel's read and its release is absorbed and
    /// overwritten with `cancelled`.
    pub cancel_release_refuses_started: bool,
}

impl Rules {
    /// The implementation: every rule of the new design, the cancel included (it waits for
    /// live or unrecorded pods, a cancelled steal waits like the last attempt, and the release
    /// of an unstarted attempt refuses a start recorded meanwhile).
    pub const NEW: Rules = Rules {
        wait_for_quiescent_predecessors: true,
        pod_finalizer: true,
        success_of_any_epoch_completes: true,
        claim_put_if_absent: true,
        last_attempt_waits: true,
        cancel_waits_for_started: true,
        cancel_steal_waits: true,
        cancel_waits_for_pods: true,
        cancel_release_refuses_started: true,
    };

    /// The implementation before its cancel was fixed: the cancel took an expired lease over
    /// without looking at the pods, a cancelled steal did not wait, and the release of an
    /// unstarted attempt accepted a start recorded meanwhile. The checker records a success
    /// as `cancelled` with these rules.
    pub const CANCEL_FIRST: Rules = Rules {
        cancel_steal_waits: false,
        cancel_waits_for_pods: false,
        cancel_release_refuses_started: false,
        ..Rules::NEW
    };

    /// [`Rules::NEW`] with the three proposed rules that close the remaining ways a success is
    /// recorded as a failure or a cancel.
    pub const PROPOSED: Rules = Rules {
        cancel_steal_waits: true,
        cancel_waits_for_pods: true,
        cancel_release_refuses_started: true,
        ..Rules::NEW
    };

    /// The old design of the run protocol: the pod is created on steal, there is no pod
    /// finalizer, only the current epoch's pod completes the run, the last attempt is stolen
    /// like any other, and a cancel releases the run at once. (The tick claim was always
    /// put-if-absent.)
    pub const OLD: Rules = Rules {
        wait_for_quiescent_predecessors: false,
        pod_finalizer: false,
        success_of_any_epoch_completes: false,
        claim_put_if_absent: true,
        last_attempt_waits: false,
        cancel_waits_for_started: false,
        cancel_steal_waits: false,
        cancel_waits_for_pods: false,
        cancel_release_refuses_started: false,
    };
}

impl Rules {
    /// The names [`Rules::named`] knows, each with a one-line description: three rule sets,
    /// then the variants that turn one rule off (see [`Rules::variant`]).
    pub const NAMES: [(&'static str, &'static str); 12] = [
        ("new", "the design as implemented"),
        (
            "proposed",
            "new, and a cancel never ends the run while a pod is live or succeeded",
        ),
        (
            "old",
            "create on steal, no finalizer, current epoch only, steal the last attempt, cancel at once",
        ),
        (
            "create-on-steal",
            "the pod is created without waiting for older pods",
        ),
        ("no-finalizer", "pods carry no result finalizer"),
        (
            "current-epoch-only",
            "only the current epoch's pod completes the run",
        ),
        ("blind-claim", "the tick is claimed with a blind put"),
        (
            "steal-last-attempt",
            "the last attempt is stolen (recorded failed) while its pod runs",
        ),
        (
            "cancel-at-once",
            "a cancel releases the run as cancelled while its workload runs",
        ),
        (
            "cancel-steal-at-once",
            "a steal records cancelled while a pod is live (proposed rule off)",
        ),
        (
            "cancel-ignores-pods",
            "a cancel takes over or releases while a pod is live or succeeded (proposed rule off)",
        ),
        (
            "cancel-release-over-start",
            "a cancel's release overwrites a start that landed meanwhile (proposed rule off)",
        ),
    ];

    /// The rules of that name (see [`Rules::NAMES`]): a rule set, or a variant of
    /// [`Rules::NEW`].
    pub fn named(name: &str) -> Option<Rules> {
        match name {
            "new" => Some(Rules::NEW),
            "proposed" => Some(Rules::PROPOSED),
            "old" => Some(Rules::OLD),
            _ => Rules::NEW.variant(name),
        }
    }

    /// These rules with the one rule that the variant `name` (one of [`Rules::NAMES`] after the
    /// three rule sets) turns off.
    pub fn variant(self, name: &str) -> Option<Rules> {
        let mut r = self;
        match name {
            "create-on-steal" => r.wait_for_quiescent_predecessors = false,
            "no-finalizer" => r.pod_finalizer = false,
            "current-epoch-only" => r.success_of_any_epoch_completes = false,
            "blind-claim" => r.claim_put_if_absent = false,
            "steal-last-attempt" => r.last_attempt_waits = false,
            "cancel-at-once" => r.cancel_waits_for_started = false,
            "cancel-steal-at-once" => r.cancel_steal_waits = false,
            "cancel-ignores-pods" => r.cancel_waits_for_pods = false,
            "cancel-release-over-start" => r.cancel_release_refuses_started = false,
            _ => return None,
        }
        Some(r)
    }
}

impl Default for Rules {
    fn default() -> Self {
        Rules::NEW
    }
}

/// The bounds of the state space, and the protocol's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bounds {
    /// Controller replicas, 1 or 2.
    pub controllers: u8,
    /// The lease's time to live `T`: every renewal by a sidecar (its attach included) writes
    /// `local_now + T`.
    pub ttl: Time,
    /// The pending ttl `P >= T` (the controller's `max(ttl, start timeout)`): an acquisition and
    /// a controller's renewal of a never-started attempt write `local_now + P`.
    pub pending_ttl: Time,
    /// The skew allowance `A`: a controller steals only when `local_now >= deadline + A`.
    pub allowance: Time,
    /// The skew bound `S`: every process's clock reads `t + skew`, `skew` in `[-S, S]`.
    pub skew: Time,
    /// The most attempts `M` of the run.
    pub max_attempts: u8,
    /// The last value of the true time `t` (it starts at 0).
    pub max_time: Time,
    /// The most epochs; an acquisition past it is not explored. At most [`MAX_EPOCHS`].
    pub max_epochs: u8,
    /// Whether the cancel path (`cancel_run`: request, stop the pods, release as cancelled) is
    /// explored.
    pub cancel: bool,
}

impl Bounds {
    /// The bounds of the CI test: 2 controllers, ttl 2, allowance 1, skew in `[-1, 1]`,
    /// 2 attempts, time 0..=6, 3 epochs, with the cancel path.
    pub const fn ci() -> Bounds {
        Bounds {
            controllers: 2,
            ttl: 2,
            pending_ttl: 3,
            allowance: 1,
            skew: 1,
            max_attempts: 2,
            max_time: 6,
            max_epochs: 3,
            cancel: true,
        }
    }

    /// Tiny bounds for doc tests and quick checks: one controller, no skew, time 0..=4.
    pub const fn tiny() -> Bounds {
        Bounds {
            controllers: 1,
            ttl: 2,
            pending_ttl: 3,
            allowance: 1,
            skew: 0,
            max_attempts: 2,
            max_time: 4,
            max_epochs: 3,
            cancel: false,
        }
    }

    /// The default bounds of the release binary: CI's with time 0..=8, three attempts and
    /// four epochs (about 9 million distinct states).
    pub const fn release() -> Bounds {
        Bounds {
            controllers: 2,
            ttl: 2,
            pending_ttl: 3,
            allowance: 1,
            skew: 1,
            max_attempts: 3,
            max_time: 8,
            max_epochs: 4,
            cancel: true,
        }
    }
}

impl fmt::Display for Bounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "controllers={} ttl={} pending_ttl={} allowance={} skew={} attempts={} time=0..={} epochs={} cancel={}",
            self.controllers,
            self.ttl,
            self.pending_ttl,
            self.allowance,
            self.skew,
            self.max_attempts,
            self.max_time,
            self.max_epochs,
            self.cancel
        )
    }
}

/// A run's phase, the lease state's `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    /// Acquired; the pod is being created or its sidecar has not attached.
    Pending,
    /// The sidecar attached and the workload started.
    Running,
    /// An attempt failed; the lease is released and the next acquisition is a new attempt.
    Retrying,
    /// Terminal: the work succeeded.
    Succeeded,
    /// Terminal: the last attempt failed, or the attempts ran out.
    Failed,
    /// Terminal: cancelled.
    Cancelled,
}

impl Status {
    /// True for the phases a run never leaves.
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Succeeded | Status::Failed | Status::Cancelled)
    }
}

/// The lease document's `state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RunState {
    /// The phase.
    pub status: Status,
    /// The attempt number, from 1.
    pub attempt: u8,
    /// Whether the current attempt's workload started (the sidecar attached).
    pub started: bool,
    /// Whether a cancel was requested.
    pub cancel_requested: bool,
}

impl RunState {
    /// True while the current attempt's workload never started: losing it costs no attempt.
    pub fn never_started(&self) -> bool {
        self.status == Status::Pending && !self.started
    }
}

/// The run's lease document. Every write replaces it whole, by compare-and-swap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    /// Bumped by every acquisition, from 1.
    pub epoch: u8,
    /// The holder token, `None` once released. The acquisition of epoch `e` writes the fresh
    /// holder `e` and puts it in that epoch's Secret, so a holder is named by its epoch.
    pub holder: Option<u8>,
    /// The absolute deadline, written from the writer's own clock plus the ttl.
    pub deadline: Time,
    /// The run state.
    pub state: RunState,
}

/// Where a pod is in its life, as the kubelet reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodPhase {
    /// Created, not yet scheduled: no container ever ran.
    Pending,
    /// Scheduled: the sidecar runs and has not attached yet; the workload has not started.
    Scheduled,
    /// The sidecar attached and the workload runs.
    Running,
    /// Every container ended and the workload exited 0.
    Succeeded,
    /// Every container ended and the workload did not exit 0, or never started.
    Failed,
}

/// A pod of the run that exists as an API object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pod {
    /// The kubelet-reported phase.
    pub phase: PodPhase,
    /// Marked for (graceful) deletion.
    pub deleting: bool,
    /// Still carries the run's result finalizer.
    pub finalizer: bool,
    /// The clock skew of the node it was scheduled on (0 before scheduling).
    pub skew: Time,
}

impl Pod {
    /// Nothing of this pod can run any more: its containers ended, or it is being deleted
    /// and was never scheduled (so it never will be).
    pub fn is_quiescent(&self) -> bool {
        matches!(self.phase, PodPhase::Succeeded | PodPhase::Failed)
            || (self.deleting && self.phase == PodPhase::Pending)
    }
}

/// The pod of one epoch, if any. There is at most one API object per epoch at a time: it is
/// created (again) only while none exists and the attempt never started. (The sidecar records
/// its pod's UID when the workload starts and refuses to start if another pod's is recorded,
/// which keeps this true even for a pod object removed while its containers still ran, a case
/// outside the model.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum PodSlot {
    /// Never created.
    #[default]
    NotCreated,
    /// The API object exists.
    Present(Pod),
    /// Created, then removed from the API (with whatever result it had).
    Gone,
}

impl PodSlot {
    /// The pod, while its API object exists.
    pub fn pod(&self) -> Option<&Pod> {
        match self {
            PodSlot::Present(pod) => Some(pod),
            _ => None,
        }
    }

    /// Quiescent as the controller sees it: absent, or present and quiescent.
    pub fn is_quiescent(&self) -> bool {
        self.pod().is_none_or(Pod::is_quiescent)
    }
}

/// History variables: never read by the protocol, only by the properties.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Ghost {
    /// Workloads that exited 0 (saturates at 3).
    pub successes: u8,
    /// A workload started after some workload of the run had exited 0.
    pub started_after_success: bool,
    /// A pod was created after the run was recorded succeeded.
    pub created_after_recorded_success: bool,
    /// A sidecar wrote the lease while it was at another epoch than its pod's.
    pub foreign_epoch_write: bool,
    /// A sidecar attached while the lease's current attempt had already started.
    pub second_attach_in_epoch: bool,
    /// The first terminal status the run was recorded with.
    pub terminal: Option<Status>,
    /// The run was recorded succeeded from a pod that was already marked for deletion.
    pub success_recorded_from_deleted_pod: bool,
    /// Controllers that decided the tick (G1).
    pub tick_decisions: u8,
}

/// One state of the whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The true time.
    pub t: Time,
    /// Each controller's clock skew (sorted: the controllers are interchangeable).
    pub controller_skew: [Time; 2],
    /// The tick's claim object exists in the bucket.
    pub claimed: bool,
    /// With a blind put: the controllers that wrote the claim (bit per controller).
    pub claim_writers: u8,
    /// The lease document, once the run was first dispatched (or cancelled).
    pub lease: Option<Lease>,
    /// A cancel that read an attempt that never started and will release the lease of this
    /// epoch as `cancelled` with the epoch's holder ([`Action::ReleaseCancelled`]): the
    /// decision and the write are two steps of `cancel_run`. Only with
    /// [`Rules::cancel_waits_for_started`]; forgotten once the write could no longer succeed.
    pub cancel_release: Option<u8>,
    /// The pod of each epoch; index `e - 1` holds epoch `e`'s.
    pub pods: [PodSlot; MAX_EPOCHS],
    /// History variables for the properties.
    pub ghost: Ghost,
}

impl State {
    /// The pod of `epoch` (from 1), if present.
    pub fn pod(&self, epoch: u8) -> Option<&Pod> {
        self.slot(epoch).and_then(PodSlot::pod)
    }

    /// The slot of `epoch` (from 1).
    pub fn slot(&self, epoch: u8) -> Option<&PodSlot> {
        usize::from(epoch)
            .checked_sub(1)
            .and_then(|i| self.pods.get(i))
    }

    fn slot_mut(&mut self, epoch: u8) -> Option<&mut PodSlot> {
        usize::from(epoch)
            .checked_sub(1)
            .and_then(|i| self.pods.get_mut(i))
    }

    fn pod_mut(&mut self, epoch: u8) -> Option<&mut Pod> {
        match self.slot_mut(epoch) {
            Some(PodSlot::Present(pod)) => Some(pod),
            _ => None,
        }
    }

    /// Present pods with their epochs.
    pub fn present_pods(&self) -> impl Iterator<Item = (u8, &Pod)> {
        (1..=MAX_EPOCHS as u8).filter_map(|e| self.pod(e).map(|p| (e, p)))
    }

    /// The number of workloads running at once.
    pub fn running_workloads(&self) -> usize {
        self.present_pods()
            .filter(|(_, p)| p.phase == PodPhase::Running)
            .count()
    }

    /// The run's status, if dispatched.
    pub fn status(&self) -> Option<Status> {
        self.lease.map(|l| l.state.status)
    }
}

/// A step of one actor. Each is atomic: it reads the current state and does at most one
/// write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// True time advances by one.
    Tick,
    /// A controller claims the tick (put-if-absent, or a blind put under the old rules).
    Claim {
        /// The controller.
        controller: u8,
    },
    /// A controller acquires a new epoch: there is no lease, or it is released and not
    /// terminal, or it is held and `local_now >= deadline + A` (a steal).
    Dispatch {
        /// The controller, whose clock is read.
        controller: u8,
    },
    /// A controller marks every pod of an older epoch (every pod, once cancelled) deleting.
    Fence,
    /// A controller creates the current epoch's pod.
    CreatePod,
    /// A controller renews a pending, never-started lease with the Secret's holder.
    KeepAlive {
        /// The controller, whose clock is read.
        controller: u8,
    },
    /// A controller records a pod's end: a success of any epoch ends the run; a failure of
    /// the current epoch's pod releases it for a retry, or fails it.
    Complete,
    /// A controller removes a quiescent pod's finalizer (a deleting pod then disappears).
    RemoveFinalizer {
        /// The pod's epoch.
        epoch: u8,
    },
    /// A controller runs `cancel_run` (with [`Rules::cancel_waits_for_started`]): if the lease
    /// is absent, released, or held past its deadline by the controller's clock (no
    /// allowance), it takes the lease over as `cancelled` and stops the live pods; otherwise it
    /// writes `cancel_requested` and, unless the current pod ended, stops the live pods (the
    /// attempt started) or decides to release the lease as `cancelled` (it never started).
    /// With the old cancel: writes `cancel_requested`.
    Cancel {
        /// The controller, whose clock is read.
        controller: u8,
    },
    /// The second step of a cancel of an attempt that never started: release the lease of
    /// that epoch as `cancelled` (a compare-and-swap with the epoch's holder, from the
    /// freshest state), then stop the live pods. With the old cancel: releases any
    /// cancel-requested run as `cancelled`.
    ReleaseCancelled,
    /// The last-attempt rule: the lease of the last attempt, started, is past its deadline
    /// plus the allowance but its pod is not quiescent, so instead of a steal the controller
    /// marks that pod deleting (and waits for its outcome). With [`Rules::cancel_steal_waits`],
    /// also for a steal that would record `cancelled`; then every live pod of the run is
    /// marked.
    FenceInsteadOfSteal {
        /// The controller, whose clock is read.
        controller: u8,
    },
    /// The start timeout: the current attempt's pod is live but its workload never started,
    /// and the timeout passed (any time: the timeout is not bounded here). A compare-and-swap
    /// from the freshest state, refused once the sidecar recorded a start, that ends the
    /// attempt (it counts: `retrying`, or `failed` on the last attempt, `cancelled` if a
    /// cancel was requested) and releases the lease; the pod is then marked deleting.
    StartTimeout,
    /// The scheduler binds a pod to a node whose clock has `skew`; its sidecar starts.
    Schedule {
        /// The pod's epoch.
        epoch: u8,
        /// The node's clock skew.
        skew: Time,
    },
    /// The sidecar's first write: running, started, a fresh deadline, if the lease is still
    /// at its epoch with its holder; then the workload starts. Otherwise the pod fails.
    Attach {
        /// The pod's epoch.
        epoch: u8,
    },
    /// The sidecar renews (epoch + holder guarded); on failure it kills the workload.
    Renew {
        /// The pod's epoch.
        epoch: u8,
    },
    /// The workload exits.
    WorkloadEnds {
        /// The pod's epoch.
        epoch: u8,
        /// Exit 0.
        success: bool,
    },
    /// The kubelet kills the containers of a deleting pod.
    Kill {
        /// The pod's epoch.
        epoch: u8,
    },
    /// Someone deletes the pod (kubectl, PodGC, a node drain).
    ExternalDelete {
        /// The pod's epoch.
        epoch: u8,
    },
    /// The API server removes a deleting, quiescent pod without a finalizer.
    Remove {
        /// The pod's epoch.
        epoch: u8,
    },
}

/// The names of the properties.
pub mod prop {
    /// G1: a tick is decided by one controller.
    pub const G1_ONE_DECISION: &str = "G1 one decision per tick";
    /// G2: no workload starts after a workload of the run exited 0.
    pub const G2_NO_START_AFTER_SUCCESS: &str = "G2 no workload starts after a success";
    /// G2: at most one workload of the run exits 0.
    pub const G2_ONE_SUCCESS: &str = "G2 at most one successful execution";
    /// G2: no pod is created once the run is recorded succeeded.
    pub const G2_NO_POD_AFTER_RECORDED: &str = "G2 no pod created after recorded success";
    /// G3: at most one workload of the run runs at a time.
    pub const G3_ONE_LIVE: &str = "G3 at most one live attempt";
    /// Fencing: a sidecar attaches to, and renews, only its own epoch.
    pub const FENCING_OWN_EPOCH: &str = "fencing: sidecars write only their own epoch";
    /// Fencing: at most one pod per epoch ever attached.
    pub const FENCING_ONE_PER_EPOCH: &str = "fencing: at most one pod attached per epoch";
    /// I2: a terminal status never changes.
    pub const TERMINAL_IS_FINAL: &str = "terminal status never changes";
    /// A recorded success is backed by a workload that exited 0.
    pub const SUCCESS_IS_REAL: &str = "recorded success had a successful workload";
    /// Example: a run succeeds.
    pub const EX_SUCCEEDS: &str = "sometimes: run succeeds";
    /// Example: a held lease can be stolen (a controller's `Dispatch` is enabled on it).
    pub const EX_STEAL: &str = "sometimes: a lease is stolen";
    /// Example: a lease can be stolen while its running holder's clock says it is still valid
    /// (checked only when the skew allowance is below twice the skew bound, where it is
    /// possible).
    pub const EX_EARLY_STEAL: &str = "sometimes: a lease is stolen before its holder's deadline";
    /// Example: an attempt fails and is retried.
    pub const EX_RETRY: &str = "sometimes: a retry happens";
    /// Example: a run fails.
    pub const EX_FAILS: &str = "sometimes: run fails";
    /// Example: a pod deleted after its workload succeeded is recorded succeeded.
    pub const EX_DELETED_SUCCESS: &str = "sometimes: a deleted pod's success is recorded";
    /// Example: a new epoch's pod is not yet created while an older epoch's workload runs
    /// (a steal from a frozen sidecar).
    pub const EX_WAITS: &str = "sometimes: a new epoch waits for a running predecessor";
    /// Example: a run is cancelled (checked only with [`Bounds::cancel`](crate::Bounds)).
    pub const EX_CANCELLED: &str = "sometimes: run cancelled";
    /// Example: a run whose cancel was requested is recorded succeeded, because its workload
    /// still exited 0 (checked only with [`Bounds::cancel`](crate::Bounds)).
    pub const EX_CANCELLED_BUT_SUCCEEDED: &str =
        "sometimes: a cancel-requested run is recorded succeeded";
    /// Example: the start timeout ends an attempt whose pod is live but never started (the
    /// step is enabled).
    pub const EX_START_TIMEOUT: &str = "sometimes: an attempt's start times out";
    /// Example: the lease of the last attempt, started, is past its deadline plus the
    /// allowance for some controller while its pod is not quiescent: the last-attempt rule
    /// waits there instead of stealing.
    pub const EX_LAST_ATTEMPT_WAITS: &str =
        "sometimes: an expired last attempt is waited for, not stolen";
    /// A run is recorded `failed` or `cancelled` only if no workload of the run exited 0 (ever:
    /// a success is never recorded as a failure or a cancel, also when it comes after the
    /// terminal write).
    pub const NO_FAILURE_OVER_SUCCESS: &str =
        "recorded failed/cancelled only if no workload exited 0";
}

/// The model of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunModel {
    /// The rules under test.
    pub rules: Rules,
    /// The bounds and parameters.
    pub bounds: Bounds,
}

impl RunModel {
    /// A model with these rules and bounds; `bounds.max_epochs` is capped at [`MAX_EPOCHS`]
    /// and `bounds.controllers` to 1..=2.
    pub fn new(rules: Rules, bounds: Bounds) -> RunModel {
        let mut bounds = bounds;
        bounds.max_epochs = bounds.max_epochs.min(MAX_EPOCHS as u8);
        bounds.controllers = bounds.controllers.clamp(1, 2);
        RunModel { rules, bounds }
    }

    fn skews(&self) -> impl Iterator<Item = Time> + use<> {
        let s = self.bounds.skew.max(0);
        -s..=s
    }

    fn controller_ids(&self, state: &State) -> impl Iterator<Item = u8> + use<> {
        // Two controllers with the same skew are indistinguishable: explore one.
        let distinct =
            self.bounds.controllers == 2 && state.controller_skew[0] != state.controller_skew[1];
        0..if distinct { 2u8 } else { 1u8 }
    }

    fn local(&self, state: &State, controller: u8) -> Time {
        state.t + state.controller_skew[usize::from(controller.min(1))]
    }

    /// A successful pod the controller acts on: of any epoch, or (old rules) of the current
    /// epoch only.
    fn seen_success(&self, state: &State) -> Option<u8> {
        let current = state.lease.map(|l| l.epoch)?;
        state
            .present_pods()
            .find(|(e, p)| {
                p.phase == PodPhase::Succeeded
                    && (self.rules.success_of_any_epoch_completes || *e == current)
            })
            .map(|(e, _)| e)
    }

    /// With the new rules, a seen success preempts every other step of the run.
    fn success_preempts(&self, state: &State) -> bool {
        self.rules.success_of_any_epoch_completes
            && state.lease.is_some_and(|l| !l.state.status.is_terminal())
            && self.seen_success(state).is_some()
    }

    fn acquire(&self, prev: Option<&RunState>) -> RunState {
        let Some(prev) = prev else {
            return RunState {
                status: Status::Pending,
                attempt: 1,
                started: false,
                cancel_requested: false,
            };
        };
        if prev.cancel_requested {
            return RunState {
                status: Status::Cancelled,
                ..*prev
            };
        }
        let attempt = if prev.never_started() {
            prev.attempt.max(1)
        } else {
            prev.attempt.saturating_add(1)
        };
        if attempt > self.bounds.max_attempts {
            return RunState {
                status: Status::Failed,
                ..*prev
            };
        }
        RunState {
            status: Status::Pending,
            attempt,
            started: false,
            cancel_requested: false,
        }
    }

    fn may_dispatch(&self, state: &State, controller: u8) -> bool {
        if !state.claimed || self.success_preempts(state) {
            return false;
        }
        match state.lease {
            None => true,
            Some(l) => {
                !l.state.status.is_terminal()
                    && l.epoch < self.bounds.max_epochs
                    && (l.holder.is_none()
                        || (self.expired_for(state, controller, &l)
                            && !self.steal_waits(state, &l)))
            }
        }
    }

    /// The lease is held and `controller`'s clock reads at or past its deadline plus the
    /// allowance: a steal is due.
    fn expired_for(&self, state: &State, controller: u8, l: &Lease) -> bool {
        l.holder.is_some() && self.local(state, controller) >= l.deadline + self.bounds.allowance
    }

    /// The last-attempt rule applies to the held lease `l`: its attempt is the last, started,
    /// and its pod is not quiescent (whatever the rules).
    fn last_attempt_live(&self, state: &State, l: &Lease) -> bool {
        l.holder.is_some()
            && l.state.attempt >= self.bounds.max_attempts
            && !l.state.never_started()
            && state.pod(l.epoch).is_some_and(|p| !p.is_quiescent())
    }

    /// A due steal of the held lease `l` is held back by the rules: the last-attempt rule, or
    /// (proposed) a steal that would record `cancelled` while a pod of the run is live.
    fn steal_waits(&self, state: &State, l: &Lease) -> bool {
        (self.rules.last_attempt_waits && self.last_attempt_live(state, l))
            || self.cancel_steal_live(state, l)
    }

    /// (Proposed) the steal of `l` would record `cancelled` while a pod of the run is live.
    fn cancel_steal_live(&self, state: &State, l: &Lease) -> bool {
        self.rules.cancel_steal_waits && l.state.cancel_requested && any_live_pod(state)
    }

    /// The start timeout may end the current attempt: held, never started, its pod live.
    fn may_time_out_start(&self, state: &State) -> bool {
        state.lease.is_some_and(|l| {
            l.holder == Some(l.epoch)
                && l.state.never_started()
                && state.pod(l.epoch).is_some_and(|p| !p.is_quiescent())
                && !self.success_preempts(state)
        })
    }

    /// How a failed attempt ends, in `run::complete`: `cancelled` if a cancel was requested,
    /// `retrying` with attempts left, else `failed`.
    fn failed_attempt(&self, l: &RunState) -> Status {
        if l.cancel_requested {
            Status::Cancelled
        } else if l.attempt < self.bounds.max_attempts {
            Status::Retrying
        } else {
            Status::Failed
        }
    }

    /// Whether the pending cancel release of `epoch` can still succeed on the lease `l`: the
    /// same epoch and holder, not terminal, and (proposed) the attempt still never started.
    fn cancel_release_possible(&self, l: Option<&Lease>, epoch: u8) -> bool {
        l.is_some_and(|l| {
            l.epoch == epoch
                && l.holder == Some(epoch)
                && !l.state.status.is_terminal()
                && (!self.rules.cancel_release_refuses_started || l.state.never_started())
        })
    }

    /// Whether some controller may steal the held lease now; with `early`, only while the
    /// holder's running pod's own clock still reads before the deadline. (Properties about
    /// steals look at the state before the steal, which needs no history variable.)
    fn steal_enabled(&self, state: &State, early: bool) -> bool {
        let Some(l) = state.lease.filter(|l| l.holder.is_some()) else {
            return false;
        };
        let early_ok = !early
            || state
                .pod(l.epoch)
                .is_some_and(|p| p.phase == PodPhase::Running && state.t + p.skew < l.deadline);
        early_ok && (0..self.bounds.controllers).any(|c| self.may_dispatch(state, c))
    }

    fn may_create_pod(&self, state: &State) -> bool {
        let Some(l) = state.lease else {
            return false;
        };
        l.holder == Some(l.epoch)
            && l.state.never_started()
            && matches!(
                state.slot(l.epoch),
                Some(PodSlot::NotCreated | PodSlot::Gone)
            )
            && !self.success_preempts(state)
            && (!self.rules.wait_for_quiescent_predecessors
                || (1..l.epoch).all(|e| state.slot(e).is_some_and(PodSlot::is_quiescent)))
    }

    fn may_keep_alive(&self, state: &State) -> bool {
        state.lease.is_some_and(|l| {
            l.holder == Some(l.epoch) && l.state.never_started() && !self.success_preempts(state)
        })
    }

    fn fence_targets(&self, state: &State) -> Vec<u8> {
        let Some(l) = state.lease else {
            return Vec::new();
        };
        let all = l.state.status == Status::Cancelled;
        state
            .present_pods()
            .filter(|(e, p)| !p.deleting && (all || *e < l.epoch))
            .map(|(e, _)| e)
            .collect()
    }

    fn may_complete(&self, state: &State) -> bool {
        let Some(l) = state.lease else {
            return false;
        };
        if l.state.status.is_terminal() {
            return false;
        }
        self.seen_success(state).is_some()
            || (l.holder.is_some()
                && state
                    .pod(l.epoch)
                    .is_some_and(|p| p.phase == PodPhase::Failed))
    }

    fn may_remove_finalizer(&self, state: &State, epoch: u8) -> bool {
        let (Some(l), Some(p)) = (state.lease, state.pod(epoch)) else {
            return false;
        };
        p.finalizer
            && p.is_quiescent()
            && (l.state.status.is_terminal()
                || (l.epoch > epoch && p.phase != PodPhase::Succeeded)
                || (l.epoch == epoch && l.holder.is_none()))
    }

    /// `cancel_run` with [`Rules::cancel_waits_for_started`], from the state `s` into `n`.
    fn cancel_run(&self, s: &State, n: &mut State, controller: u8) -> Option<()> {
        if !s.claimed {
            return None;
        }
        let Some(l) = s.lease else {
            // Never dispatched: recorded cancelled, so it never starts.
            n.lease = Some(Lease {
                epoch: 1,
                holder: None,
                deadline: 0,
                state: RunState {
                    status: Status::Cancelled,
                    attempt: 0,
                    started: false,
                    cancel_requested: true,
                },
            });
            return Some(());
        };
        if l.state.status.is_terminal() {
            return None;
        }
        // Held: not released, and not expired by the controller's clock (no allowance).
        let held = l.holder.is_some() && self.local(s, controller) < l.deadline;
        let live = any_live_pod(s);
        let waits = self.rules.cancel_waits_for_pods
            && (live
                || s.present_pods()
                    .any(|(_, p)| p.phase == PodPhase::Succeeded));
        if !held && !waits {
            // Taken over (a new epoch) as cancelled and released at once; then the live pods
            // are stopped.
            n.lease = Some(Lease {
                epoch: l.epoch.saturating_add(1),
                holder: None,
                deadline: 0,
                state: RunState {
                    status: Status::Cancelled,
                    cancel_requested: true,
                    ..l.state
                },
            });
            stop_live_pods(n);
            return Some(());
        }
        n.lease.as_mut()?.state.cancel_requested = true;
        let ended = s
            .pod(l.epoch)
            .is_some_and(|p| matches!(p.phase, PodPhase::Succeeded | PodPhase::Failed));
        if ended {
            // `Complete` records it: cancelled, unless it succeeded.
        } else if l.state.started || (waits && live) {
            // The workload may still finish: stop it, and let `Complete` record how it ended.
            stop_live_pods(n);
        } else if held && !waits {
            n.cancel_release = Some(l.epoch);
        }
        Some(())
    }

    fn step(&self, s: &State, action: Action) -> Option<State> {
        let mut n = s.clone();
        match action {
            Action::Tick => {
                if s.t >= self.bounds.max_time {
                    return None;
                }
                n.t += 1;
            }
            Action::Claim { controller } => {
                if self.rules.claim_put_if_absent {
                    if s.claimed {
                        return None; // the loser reads the winner's decision
                    }
                    n.claimed = true;
                } else {
                    let bit = 1u8 << controller.min(1);
                    if s.claim_writers & bit != 0 {
                        return None;
                    }
                    n.claimed = true;
                    n.claim_writers |= bit;
                }
                n.ghost.tick_decisions = n.ghost.tick_decisions.saturating_add(1);
            }
            Action::Dispatch { controller } => {
                if !self.may_dispatch(s, controller) {
                    return None;
                }
                let prev = s.lease;
                let epoch = prev.map_or(1, |l| l.epoch + 1);
                n.lease = Some(Lease {
                    epoch,
                    holder: Some(epoch),
                    deadline: self.local(s, controller) + self.bounds.pending_ttl,
                    state: self.acquire(prev.as_ref().map(|l| &l.state)),
                });
            }
            Action::Fence => {
                let targets = self.fence_targets(s);
                if targets.is_empty() {
                    return None;
                }
                for e in targets {
                    if let Some(p) = n.pod_mut(e) {
                        p.deleting = true;
                    }
                }
            }
            Action::CreatePod => {
                if !self.may_create_pod(s) {
                    return None;
                }
                let epoch = s.lease.map_or(0, |l| l.epoch);
                if s.ghost.terminal == Some(Status::Succeeded) {
                    n.ghost.created_after_recorded_success = true;
                }
                *n.slot_mut(epoch)? = PodSlot::Present(Pod {
                    phase: PodPhase::Pending,
                    deleting: false,
                    finalizer: self.rules.pod_finalizer,
                    skew: 0,
                });
            }
            Action::KeepAlive { controller } => {
                if !self.may_keep_alive(s) {
                    return None;
                }
                let deadline = self.local(s, controller) + self.bounds.pending_ttl;
                let l = n.lease.as_mut()?;
                if l.deadline == deadline {
                    return None;
                }
                l.deadline = deadline;
            }
            Action::Complete => {
                if !self.may_complete(s) {
                    return None;
                }
                let l = n.lease.as_mut()?;
                if let Some(e) = self.seen_success(s) {
                    l.state.status = Status::Succeeded;
                    if s.pod(e).is_some_and(|p| p.deleting) {
                        n.ghost.success_recorded_from_deleted_pod = true;
                    }
                } else {
                    l.state.status = self.failed_attempt(&l.state);
                }
                l.holder = None;
            }
            Action::RemoveFinalizer { epoch } => {
                if !self.may_remove_finalizer(s, epoch) {
                    return None;
                }
                let slot = n.slot_mut(epoch)?;
                if let PodSlot::Present(p) = slot {
                    if p.deleting {
                        *slot = PodSlot::Gone;
                    } else {
                        p.finalizer = false;
                    }
                }
            }
            Action::Cancel { controller } => {
                if !self.bounds.cancel {
                    return None;
                }
                if self.rules.cancel_waits_for_started {
                    self.cancel_run(s, &mut n, controller)?;
                } else {
                    // The old cancel: request now, release as cancelled in a later step.
                    let l = n.lease.as_mut()?;
                    if l.state.status.is_terminal() || l.state.cancel_requested {
                        return None;
                    }
                    l.state.cancel_requested = true;
                }
                if n == *s {
                    return None;
                }
            }
            Action::ReleaseCancelled => {
                if self.rules.cancel_waits_for_started {
                    let epoch = s.cancel_release?;
                    n.cancel_release = None;
                    if self.cancel_release_possible(s.lease.as_ref(), epoch) {
                        let l = n.lease.as_mut()?;
                        l.state.status = Status::Cancelled;
                        l.holder = None;
                        stop_live_pods(&mut n);
                    }
                } else {
                    let l = n.lease.as_mut()?;
                    if !l.state.cancel_requested || l.state.status.is_terminal() {
                        return None;
                    }
                    l.state.status = Status::Cancelled;
                    l.holder = None;
                }
            }
            Action::FenceInsteadOfSteal { controller } => {
                let l = s.lease?;
                if !self.expired_for(s, controller, &l)
                    || l.state.status.is_terminal()
                    || self.success_preempts(s)
                    || !self.steal_waits(s, &l)
                {
                    return None;
                }
                if self.cancel_steal_live(s, &l) {
                    stop_live_pods(&mut n);
                } else if let Some(p) = n.pod_mut(l.epoch).filter(|p| !p.is_quiescent()) {
                    p.deleting = true;
                }
                if n == *s {
                    return None;
                }
            }
            Action::StartTimeout => {
                if !self.may_time_out_start(s) {
                    return None;
                }
                let l = n.lease.as_mut()?;
                l.state.status = self.failed_attempt(&l.state);
                l.holder = None;
                let epoch = l.epoch;
                n.pod_mut(epoch)?.deleting = true;
            }
            Action::Schedule { epoch, skew } => {
                let p = n.pod_mut(epoch)?;
                if p.phase != PodPhase::Pending || p.deleting {
                    return None;
                }
                p.phase = PodPhase::Scheduled;
                p.skew = skew;
            }
            Action::Attach { epoch } => {
                let pod = *s.pod(epoch)?;
                if pod.phase != PodPhase::Scheduled {
                    return None;
                }
                let lease = s.lease?;
                if sidecar_cas_succeeds(&lease, epoch) {
                    if lease.epoch != epoch {
                        n.ghost.foreign_epoch_write = true;
                    }
                    if lease.state.started {
                        n.ghost.second_attach_in_epoch = true;
                    }
                    let l = n.lease.as_mut()?;
                    l.state.status = Status::Running;
                    l.state.started = true;
                    l.deadline = s.t + pod.skew + self.bounds.ttl;
                    n.pod_mut(epoch)?.phase = PodPhase::Running;
                    if s.ghost.successes > 0 {
                        n.ghost.started_after_success = true;
                    }
                } else {
                    // The CAS failed: the sidecar exits and the workload never starts.
                    n.pod_mut(epoch)?.phase = PodPhase::Failed;
                }
            }
            Action::Renew { epoch } => {
                let pod = *s.pod(epoch)?;
                if pod.phase != PodPhase::Running {
                    return None;
                }
                let lease = s.lease?;
                if sidecar_cas_succeeds(&lease, epoch) {
                    if lease.epoch != epoch {
                        n.ghost.foreign_epoch_write = true;
                    }
                    let deadline = s.t + pod.skew + self.bounds.ttl;
                    if lease.deadline == deadline {
                        return None;
                    }
                    n.lease.as_mut()?.deadline = deadline;
                } else {
                    // The lease is lost: the sidecar kills the workload.
                    n.pod_mut(epoch)?.phase = PodPhase::Failed;
                }
            }
            Action::WorkloadEnds { epoch, success } => {
                let p = n.pod_mut(epoch)?;
                if p.phase != PodPhase::Running {
                    return None;
                }
                if success {
                    p.phase = PodPhase::Succeeded;
                    n.ghost.successes = n.ghost.successes.saturating_add(1).min(3);
                } else {
                    p.phase = PodPhase::Failed;
                }
            }
            Action::Kill { epoch } => {
                let p = n.pod_mut(epoch)?;
                if !p.deleting || !matches!(p.phase, PodPhase::Scheduled | PodPhase::Running) {
                    return None;
                }
                p.phase = PodPhase::Failed;
            }
            Action::ExternalDelete { epoch } => {
                let p = n.pod_mut(epoch)?;
                if p.deleting {
                    return None;
                }
                p.deleting = true;
            }
            Action::Remove { epoch } => {
                let slot = n.slot_mut(epoch)?;
                let PodSlot::Present(p) = slot else {
                    return None;
                };
                if !p.deleting || p.finalizer || !p.is_quiescent() {
                    return None;
                }
                *slot = PodSlot::Gone;
            }
        }
        if n.ghost.terminal.is_none() {
            n.ghost.terminal = n.status().filter(|st| st.is_terminal());
        }
        self.normalize(&mut n);
        Some(n)
    }

    /// Forgets what no later step can read, so that states that behave alike are one state:
    /// the skew of a pod whose sidecar ended, the deadline of a released lease, and a deadline
    /// too far ahead for any clock within the time bound to pass.
    fn normalize(&self, n: &mut State) {
        for slot in &mut n.pods {
            if let PodSlot::Present(p) = slot
                && matches!(p.phase, PodPhase::Succeeded | PodPhase::Failed)
            {
                p.skew = 0;
            }
        }
        if let Some(e) = n.cancel_release
            && !self.cancel_release_possible(n.lease.as_ref(), e)
        {
            n.cancel_release = None;
        }
        let never_expires =
            self.bounds.max_time + self.bounds.skew.max(0) - self.bounds.allowance + 1;
        if let Some(l) = n.lease.as_mut() {
            if l.holder.is_none() {
                l.deadline = 0;
            } else {
                l.deadline = l.deadline.min(never_expires);
            }
        }
    }
}

/// Some pod of the run is live: not quiescent.
fn any_live_pod(state: &State) -> bool {
    state.present_pods().any(|(_, p)| !p.is_quiescent())
}

/// Marks every live pod that is not being deleted yet as deleting (`stop_live_pods`).
fn stop_live_pods(n: &mut State) {
    for slot in &mut n.pods {
        if let PodSlot::Present(p) = slot
            && !p.is_quiescent()
        {
            p.deleting = true;
        }
    }
}

/// The sidecar's compare-and-swap condition: the lease is at the pod's epoch and held by the
/// holder in that epoch's Secret. Expiry is not checked.
fn sidecar_cas_succeeds(lease: &Lease, pod_epoch: u8) -> bool {
    lease.epoch == pod_epoch && lease.holder == Some(pod_epoch)
}

impl Model for RunModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let mut inits = Vec::new();
        let skews: Vec<Time> = self.skews().collect();
        for &a in &skews {
            for &b in &skews {
                let pair = if self.bounds.controllers == 2 {
                    if a > b {
                        continue;
                    }
                    [a, b]
                } else {
                    if a != b {
                        continue;
                    }
                    [a, a]
                };
                inits.push(State {
                    t: 0,
                    controller_skew: pair,
                    claimed: false,
                    claim_writers: 0,
                    lease: None,
                    cancel_release: None,
                    pods: [PodSlot::NotCreated; MAX_EPOCHS],
                    ghost: Ghost::default(),
                });
            }
        }
        inits
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        actions.push(Action::Tick);
        for controller in 0..self.bounds.controllers {
            actions.push(Action::Claim { controller });
        }
        for controller in self.controller_ids(state) {
            actions.extend([
                Action::Dispatch { controller },
                Action::KeepAlive { controller },
                Action::FenceInsteadOfSteal { controller },
                Action::Cancel { controller },
            ]);
        }
        actions.extend([
            Action::Fence,
            Action::CreatePod,
            Action::Complete,
            Action::StartTimeout,
            Action::ReleaseCancelled,
        ]);
        for epoch in 1..=self.bounds.max_epochs {
            if state.pod(epoch).is_none() {
                continue;
            }
            actions.push(Action::RemoveFinalizer { epoch });
            for skew in self.skews() {
                actions.push(Action::Schedule { epoch, skew });
            }
            actions.extend([
                Action::Attach { epoch },
                Action::Renew { epoch },
                Action::WorkloadEnds {
                    epoch,
                    success: true,
                },
                Action::WorkloadEnds {
                    epoch,
                    success: false,
                },
                Action::Kill { epoch },
                Action::ExternalDelete { epoch },
                Action::Remove { epoch },
            ]);
        }
        // Candidates that are not enabled are skipped by the checker: `next_state` is `None`
        // for them (and for steps that would change nothing).
    }

    fn next_state(&self, last_state: &State, action: Action) -> Option<State> {
        self.step(last_state, action)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::<Self>::always(prop::G1_ONE_DECISION, |_, s| s.ghost.tick_decisions <= 1),
            Property::<Self>::always(prop::G2_NO_START_AFTER_SUCCESS, |_, s| {
                !s.ghost.started_after_success
            }),
            Property::<Self>::always(prop::G2_ONE_SUCCESS, |_, s| s.ghost.successes <= 1),
            Property::<Self>::always(prop::G2_NO_POD_AFTER_RECORDED, |_, s| {
                !s.ghost.created_after_recorded_success
            }),
            Property::<Self>::always(prop::G3_ONE_LIVE, |_, s| s.running_workloads() <= 1),
            Property::<Self>::always(prop::FENCING_OWN_EPOCH, |_, s| !s.ghost.foreign_epoch_write),
            Property::<Self>::always(prop::FENCING_ONE_PER_EPOCH, |_, s| {
                !s.ghost.second_attach_in_epoch
            }),
            Property::<Self>::always(prop::TERMINAL_IS_FINAL, |_, s| {
                s.ghost.terminal.is_none_or(|t| s.status() == Some(t))
            }),
            Property::<Self>::always(prop::SUCCESS_IS_REAL, |_, s| {
                s.status() != Some(Status::Succeeded) || s.ghost.successes > 0
            }),
            Property::<Self>::sometimes(prop::EX_SUCCEEDS, |_, s| {
                s.status() == Some(Status::Succeeded)
            }),
            Property::<Self>::sometimes(prop::EX_STEAL, |m, s| m.steal_enabled(s, false)),
            Property::<Self>::sometimes(prop::EX_RETRY, |_, s| {
                s.status() == Some(Status::Retrying)
            }),
            Property::<Self>::sometimes(prop::EX_FAILS, |_, s| s.status() == Some(Status::Failed)),
            Property::<Self>::sometimes(prop::EX_DELETED_SUCCESS, |_, s| {
                s.ghost.success_recorded_from_deleted_pod
            }),
            Property::<Self>::sometimes(prop::EX_WAITS, |_, s| {
                s.lease.is_some_and(|l| {
                    l.holder.is_some()
                        && l.state.status == Status::Pending
                        && s.slot(l.epoch) == Some(&PodSlot::NotCreated)
                        && s.present_pods()
                            .any(|(e, p)| e < l.epoch && p.phase == PodPhase::Running)
                })
            }),
            Property::<Self>::always(prop::NO_FAILURE_OVER_SUCCESS, |_, s| {
                !matches!(s.status(), Some(Status::Failed | Status::Cancelled))
                    || s.ghost.successes == 0
            }),
            Property::<Self>::sometimes(prop::EX_START_TIMEOUT, |m, s| m.may_time_out_start(s)),
            Property::<Self>::sometimes(prop::EX_LAST_ATTEMPT_WAITS, |m, s| {
                s.lease.is_some_and(|l| {
                    m.last_attempt_live(s, &l)
                        && !m.success_preempts(s)
                        && (0..m.bounds.controllers).any(|c| m.expired_for(s, c, &l))
                })
            }),
        ];
        if self.bounds.allowance < 2 * self.bounds.skew {
            properties.push(Property::<Self>::sometimes(prop::EX_EARLY_STEAL, |m, s| {
                m.steal_enabled(s, true)
            }));
        }
        if self.bounds.cancel {
            properties.push(Property::<Self>::sometimes(prop::EX_CANCELLED, |_, s| {
                s.status() == Some(Status::Cancelled)
            }));
            properties.push(Property::<Self>::sometimes(
                prop::EX_CANCELLED_BUT_SUCCEEDED,
                |_, s| {
                    s.lease.is_some_and(|l| {
                        l.state.status == Status::Succeeded && l.state.cancel_requested
                    })
                },
            ));
        }
        properties
    }
}

/// The verdict on one property after a check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The property's name.
    pub name: &'static str,
    /// `always` or `sometimes`.
    pub expectation: Expectation,
    /// Whether the checker found a state where the property is true (`sometimes`) or false
    /// (`always`).
    pub discovered: bool,
    /// The discovery, shortened by [`shorten`].
    pub trace: Option<Trace>,
}

impl Verdict {
    /// Whether the property holds: an `always` without a counterexample, or a `sometimes`
    /// with an example.
    pub fn holds(&self) -> bool {
        self.discovered != self.expectation.discovery_is_failure()
    }
}

/// The outcome of a check.
#[derive(Clone, Debug)]
pub struct Report {
    /// The rules checked.
    pub rules: Rules,
    /// The bounds checked.
    pub bounds: Bounds,
    /// States generated, repeats included.
    pub states: usize,
    /// Distinct states.
    pub unique_states: usize,
    /// The longest path explored.
    pub max_depth: usize,
    /// Whether every reachable state was visited (false when the check stopped at its first
    /// counterexample).
    pub exhaustive: bool,
    /// Wall time.
    pub elapsed: Duration,
    /// One verdict per property, in the model's order.
    pub verdicts: Vec<Verdict>,
}

impl Report {
    /// True when every `always` property holds and every `sometimes` property has an
    /// example.
    pub fn all_hold(&self) -> bool {
        self.verdicts.iter().all(Verdict::holds)
    }

    /// The verdict on `name`, if it is a property of the model.
    pub fn verdict(&self, name: &str) -> Option<&Verdict> {
        self.verdicts.iter().find(|v| v.name == name)
    }

    /// The counterexample to the `always` property `name`, if one was found.
    pub fn counterexample(&self, name: &str) -> Option<&Trace> {
        self.verdict(name)
            .filter(|v| v.expectation == Expectation::Always)
            .and_then(|v| v.trace.as_ref())
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "rules:  {:?}", self.rules)?;
        writeln!(f, "bounds: {}", self.bounds)?;
        writeln!(
            f,
            "states explored: {} (unique: {}, max depth: {}, {}) in {:.2?}",
            self.states,
            self.unique_states,
            self.max_depth,
            if self.exhaustive {
                "exhaustive"
            } else {
                "stopped at the first counterexample"
            },
            self.elapsed
        )?;
        for v in &self.verdicts {
            let kind = match v.expectation {
                Expectation::Always => "always",
                Expectation::Sometimes => "sometimes",
                Expectation::Eventually => "eventually",
            };
            let result = match (&v.expectation, v.discovered) {
                (Expectation::Sometimes, true) => "example found",
                (Expectation::Sometimes, false) if self.exhaustive => "NO EXAMPLE",
                (Expectation::Sometimes, false) => "not reached (check stopped early)",
                (_, true) => "COUNTEREXAMPLE",
                (_, false) if self.exhaustive => "holds",
                (_, false) => "not refuted (check stopped early)",
            };
            writeln!(f, "  [{kind:9}] {:58} {result}", v.name)?;
        }
        Ok(())
    }
}

/// A discovered behaviour: an initial state and the actions taken from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// The initial state.
    pub init: State,
    /// The actions, in order.
    pub actions: Vec<Action>,
}

impl Trace {
    /// The states the trace goes through, the initial one first; `None` if some action is
    /// not enabled where it is taken.
    pub fn states(&self, model: &RunModel) -> Option<Vec<State>> {
        let mut states = vec![self.init.clone()];
        for action in &self.actions {
            let next = model.next_state(states.last()?, *action)?;
            states.push(next);
        }
        Some(states)
    }

    /// One line per step (ticks folded into the time), with the lease and the pods after it.
    pub fn render(&self, model: &RunModel) -> String {
        let Some(states) = self.states(model) else {
            return format!("(not a behaviour of the model) {:?}\n", self.actions);
        };
        let mut out = format!("init: controller skews {:?}\n", self.init.controller_skew);
        for (action, after) in self.actions.iter().zip(states.iter().skip(1)) {
            if let Action::Tick = action {
                continue;
            }
            out.push_str(&format!(
                "  t={}: {action:?} => {}\n",
                after.t,
                summary(after)
            ));
        }
        out
    }
}

/// A one-line summary of a state's lease and pods.
pub fn summary(s: &State) -> String {
    let lease = s.lease.map_or("no lease".to_string(), |l| {
        format!(
            "lease e{} {} dl={} {:?}#{}{}{}",
            l.epoch,
            l.holder
                .map_or("released".to_string(), |h| format!("held({h})")),
            l.deadline,
            l.state.status,
            l.state.attempt,
            if l.state.started { " started" } else { "" },
            if l.state.cancel_requested {
                " cancel-requested"
            } else {
                ""
            }
        )
    });
    let mut pods = Vec::new();
    for e in 1..=MAX_EPOCHS as u8 {
        match s.slot(e) {
            Some(PodSlot::Present(p)) => pods.push(format!(
                "p{e}:{:?}{}{}",
                p.phase,
                if p.deleting { "+deleting" } else { "" },
                if p.finalizer { "" } else { "+nofinalizer" }
            )),
            Some(PodSlot::Gone) => pods.push(format!("p{e}:gone")),
            _ => {}
        }
    }
    let lease = match s.cancel_release {
        Some(e) => format!("{lease} (cancel releases e{e} next)"),
        None => lease,
    };
    if pods.is_empty() {
        lease
    } else {
        format!("{lease} | {}", pods.join(" "))
    }
}

/// Shortens a discovery of `property` to a 1-minimal one: no single action can be left out
/// (and no other initial state used) without losing the discovery. The checker records the
/// last discovery it meets, not the shortest, so this keeps the reported traces readable.
pub fn shorten(model: &RunModel, property: &Property<RunModel>, trace: Trace) -> Trace {
    let hit = |s: &State| {
        let holds = (property.condition)(model, s);
        if property.expectation == Expectation::Sometimes {
            holds
        } else {
            !holds
        }
    };
    // The trace cut right after its first state that makes the discovery.
    let cut = |t: Trace| -> Option<Trace> {
        let states = t.states(model)?;
        let first = states.iter().position(hit)?;
        Some(Trace {
            init: t.init,
            actions: t.actions.into_iter().take(first).collect(),
        })
    };
    let Some(mut best) = cut(trace.clone()) else {
        return trace;
    };
    for init in model.init_states() {
        if let Some(t) = cut(Trace {
            init,
            actions: best.actions.clone(),
        }) {
            if t.actions.len() <= best.actions.len() {
                best = t;
            }
            break;
        }
    }
    let mut i = best.actions.len();
    while i > 0 {
        i -= 1;
        let mut actions = best.actions.clone();
        actions.remove(i);
        if let Some(t) = cut(Trace {
            init: best.init.clone(),
            actions,
        }) {
            best = t;
            i = i.min(best.actions.len());
        }
    }
    best
}

/// The model's initial states: one per (sorted) pair of controller skews.
pub fn initial_states(model: &RunModel) -> Vec<State> {
    model.init_states()
}

/// Checks `model` exhaustively (breadth first, `threads` threads) and reports every property.
pub fn check(model: &RunModel, threads: usize) -> Report {
    run(model, threads, HasDiscoveries::All)
}

/// Checks `model` until the first counterexample to any `always` property (or
/// exhaustively, if there is none).
pub fn refute(model: &RunModel, threads: usize) -> Report {
    run(model, threads, HasDiscoveries::AnyFailures)
}

/// Checks `model` until a counterexample (or example) for one of the named properties is
/// found, or exhaustively if there is none.
pub fn refute_any_of(model: &RunModel, threads: usize, names: &[&'static str]) -> Report {
    let set: BTreeSet<&'static str> = names.iter().copied().collect();
    run(model, threads, HasDiscoveries::AnyOf(set))
}

fn run(model: &RunModel, threads: usize, finish_when: HasDiscoveries) -> Report {
    let started = Instant::now();
    let properties = model.properties();
    let checker = model
        .checker()
        .threads(threads.max(1))
        .finish_when(finish_when.clone())
        .spawn_bfs()
        .join();
    let elapsed = started.elapsed();
    let discoveries = checker.discoveries();
    let found: BTreeSet<&'static str> = discoveries.keys().copied().collect();
    // The checker stops early only once its finish condition matches.
    let exhaustive = !finish_when.matches(&found, &properties);
    let verdicts = properties
        .iter()
        .map(|p| {
            let trace = discoveries.get(p.name).and_then(|path| {
                let mut steps = path.clone().into_vec().into_iter();
                let (init, first) = steps.next()?;
                let actions = first
                    .into_iter()
                    .chain(steps.filter_map(|(_, a)| a))
                    .collect();
                Some(shorten(model, p, Trace { init, actions }))
            });
            Verdict {
                name: p.name,
                expectation: p.expectation.clone(),
                discovered: trace.is_some(),
                trace,
            }
        })
        .collect();
    Report {
        rules: model.rules,
        bounds: model.bounds,
        states: checker.state_count(),
        unique_states: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        exhaustive,
        elapsed,
        verdicts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> RunModel {
        RunModel::new(Rules::NEW, Bounds::ci())
    }

    fn state(status: Status, attempt: u8, started: bool, cancel: bool) -> RunState {
        RunState {
            status,
            attempt,
            started,
            cancel_requested: cancel,
        }
    }

    #[test]
    fn acquire_follows_the_design() {
        let m = model();
        assert_eq!(m.acquire(None), state(Status::Pending, 1, false, false));
        // A steal of an attempt that never started does not count.
        let never = state(Status::Pending, 1, false, false);
        assert_eq!(m.acquire(Some(&never)).attempt, 1);
        // A started attempt counts; past the last attempt the run fails.
        let running = state(Status::Running, 1, true, false);
        assert_eq!(
            m.acquire(Some(&running)),
            state(Status::Pending, 2, false, false)
        );
        let last = state(Status::Running, 2, true, false);
        assert_eq!(m.acquire(Some(&last)).status, Status::Failed);
        let retrying = state(Status::Retrying, 1, true, false);
        assert_eq!(m.acquire(Some(&retrying)).attempt, 2);
        // A cancel request wins over a new attempt.
        let cancel = state(Status::Retrying, 1, true, true);
        assert_eq!(m.acquire(Some(&cancel)).status, Status::Cancelled);
    }

    #[test]
    fn quiescence() {
        let pod = |phase, deleting| Pod {
            phase,
            deleting,
            finalizer: true,
            skew: 0,
        };
        assert!(pod(PodPhase::Pending, true).is_quiescent());
        assert!(!pod(PodPhase::Pending, false).is_quiescent());
        assert!(!pod(PodPhase::Scheduled, true).is_quiescent());
        assert!(!pod(PodPhase::Running, true).is_quiescent());
        assert!(pod(PodPhase::Failed, false).is_quiescent());
        assert!(PodSlot::Gone.is_quiescent() && PodSlot::NotCreated.is_quiescent());
    }

    #[test]
    fn init_states_pair_the_skews() {
        assert_eq!(model().init_states().len(), 6);
        assert_eq!(
            RunModel::new(Rules::NEW, Bounds::tiny())
                .init_states()
                .len(),
            1
        );
    }

    #[test]
    fn tiny_bounds_hold() {
        let report = check(&RunModel::new(Rules::NEW, Bounds::tiny()), 1);
        assert!(report.exhaustive && report.all_hold(), "{report}");
    }

    /// A state at `t` (exact controller clocks) whose lease is `lease` and whose epoch-1 pod is
    /// `pod`.
    fn with(m: &RunModel, t: Time, lease: Lease, pod: Option<Pod>) -> State {
        let mut s = m
            .init_states()
            .into_iter()
            .find(|s| s.controller_skew == [0, 0])
            .expect("exact clocks");
        s.t = t;
        s.claimed = true;
        s.lease = Some(lease);
        if let Some(pod) = pod {
            s.pods[0] = PodSlot::Present(pod);
        }
        s
    }

    fn pod(phase: PodPhase) -> Pod {
        Pod {
            phase,
            deleting: false,
            finalizer: true,
            skew: 0,
        }
    }

    fn held(state: RunState, deadline: Time) -> Lease {
        Lease {
            epoch: 1,
            holder: Some(1),
            deadline,
            state,
        }
    }

    #[test]
    fn cancel_follows_cancel_run() {
        let m = RunModel::new(Rules::CANCEL_FIRST, Bounds::ci());
        let cancel = Action::Cancel { controller: 0 };
        let running = state(Status::Running, 1, true, false);
        let pending = state(Status::Pending, 1, false, false);
        // Started: requested and stopped, not released.
        let s = with(&m, 0, held(running, 3), Some(pod(PodPhase::Running)));
        let n = m.next_state(&s, cancel).expect("enabled");
        assert!(
            n.lease
                .is_some_and(|l| l.state.cancel_requested && l.holder.is_some())
        );
        assert!(n.pod(1).is_some_and(|p| p.deleting) && n.cancel_release.is_none());
        // Never started: requested, and the release is decided (a later step).
        let s = with(&m, 0, held(pending, 3), Some(pod(PodPhase::Pending)));
        let n = m.next_state(&s, cancel).expect("enabled");
        assert_eq!(n.cancel_release, Some(1));
        let r = m.next_state(&n, Action::ReleaseCancelled).expect("enabled");
        assert_eq!(r.status(), Some(Status::Cancelled));
        assert!(r.pod(1).is_some_and(|p| p.deleting));
        // Expired by the controller's clock (no allowance): taken over as cancelled at once,
        // whatever the pods (the gap that `cancel_waits_for_pods` closes).
        let s = with(&m, 3, held(running, 3), Some(pod(PodPhase::Succeeded)));
        let n = m.next_state(&s, cancel).expect("enabled");
        assert_eq!(n.status(), Some(Status::Cancelled));
        assert_eq!(n.lease.map(|l| l.epoch), Some(2));
        let proposed = RunModel::new(Rules::PROPOSED, Bounds::ci());
        let n = proposed.next_state(&s, cancel).expect("enabled");
        assert_eq!(n.status(), Some(Status::Running));
        assert!(n.lease.is_some_and(|l| l.state.cancel_requested));
    }

    #[test]
    fn the_last_attempt_is_fenced_not_stolen() {
        let m = model();
        let last = state(Status::Running, 2, true, false);
        let s = with(&m, 4, held(last, 3), Some(pod(PodPhase::Running)));
        assert!(
            m.next_state(&s, Action::Dispatch { controller: 0 })
                .is_none()
        );
        let n = m
            .next_state(&s, Action::FenceInsteadOfSteal { controller: 0 })
            .expect("enabled");
        assert!(n.pod(1).is_some_and(|p| p.deleting));
        // Not before deadline + allowance.
        let early = with(&m, 3, held(last, 3), Some(pod(PodPhase::Running)));
        assert!(
            m.next_state(&early, Action::FenceInsteadOfSteal { controller: 0 })
                .is_none()
        );
        // A quiescent pod: the steal goes ahead and records the run failed.
        let ended = with(&m, 4, held(last, 3), Some(pod(PodPhase::Failed)));
        let n = m
            .next_state(&ended, Action::Dispatch { controller: 0 })
            .expect("enabled");
        assert_eq!(n.status(), Some(Status::Failed));
        // Not the last attempt: stolen, and the attempt counts.
        let first = state(Status::Running, 1, true, false);
        let s = with(&m, 4, held(first, 3), Some(pod(PodPhase::Running)));
        let n = m
            .next_state(&s, Action::Dispatch { controller: 0 })
            .expect("enabled");
        assert_eq!(n.lease.map(|l| l.state.attempt), Some(2));
    }

    #[test]
    fn the_start_timeout_counts_and_refuses_a_started_attempt() {
        let m = model();
        let last = state(Status::Pending, 2, false, false);
        let s = with(&m, 0, held(last, 3), Some(pod(PodPhase::Scheduled)));
        let n = m.next_state(&s, Action::StartTimeout).expect("enabled");
        assert_eq!(n.status(), Some(Status::Failed));
        assert!(n.pod(1).is_some_and(|p| p.deleting));
        let first = state(Status::Pending, 1, false, true);
        let s = with(&m, 0, held(first, 3), Some(pod(PodPhase::Pending)));
        let n = m.next_state(&s, Action::StartTimeout).expect("enabled");
        assert_eq!(
            n.status(),
            Some(Status::Cancelled),
            "a cancel was requested"
        );
        let started = state(Status::Running, 1, true, false);
        let s = with(&m, 0, held(started, 3), Some(pod(PodPhase::Running)));
        assert!(m.next_state(&s, Action::StartTimeout).is_none());
        // No pod yet: nothing to time out.
        let s = with(&m, 0, held(first, 3), None);
        assert!(m.next_state(&s, Action::StartTimeout).is_none());
    }

    #[test]
    fn never_expiring_deadlines_are_merged() {
        // A deadline no clock can pass within the bounds is stored as one value.
        let m = model();
        let mut s = m.init_states().remove(0);
        s.lease = Some(Lease {
            epoch: 1,
            holder: Some(1),
            deadline: 50,
            state: state(Status::Pending, 1, false, false),
        });
        m.normalize(&mut s);
        let cap = s.lease.map(|l| l.deadline);
        assert_eq!(
            cap,
            Some(m.bounds.max_time + m.bounds.skew - m.bounds.allowance + 1)
        );
    }
}
