//! The exhaustive check of the run protocol at CI bounds, and the negative controls: with a
//! rule of the old design brought back, the same checker must find a counterexample.
//!
//! [`Rules::NEW`] (the implementation, equal to [`Rules::PROPOSED`]) satisfies every property,
//! and each of its rules is needed; [`Rules::CANCEL_FIRST`] (the cancel before its fixes)
//! records a success as `cancelled`.

use cojob_model::stateright::Model;
use cojob_model::{
    Action, Bounds, PodPhase, PodSlot, Report, Rules, RunModel, State, Status, check, prop,
    refute_any_of,
};

const G2: [&str; 3] = [
    prop::G2_NO_START_AFTER_SUCCESS,
    prop::G2_ONE_SUCCESS,
    prop::G2_NO_POD_AFTER_RECORDED,
];

fn rules(name: &str) -> Rules {
    Rules::named(name).unwrap_or_else(|| panic!("no rules named {name}"))
}

/// Finds a counterexample to one of `names` under `rules`, prints it, and returns the
/// property it refutes with the states of its (shortened) trace.
fn refuted(rules: Rules, bounds: Bounds, names: &[&'static str]) -> (&'static str, Vec<State>) {
    let model = RunModel::new(rules, bounds);
    let report = refute_any_of(&model, 1, names);
    println!("{report}");
    let (name, trace) = names
        .iter()
        .find_map(|n| report.counterexample(n).map(|t| (*n, t)))
        .unwrap_or_else(|| panic!("no counterexample to {names:?} under {rules:?}:\n{report}"));
    println!("counterexample to {name}:\n{}", trace.render(&model));
    let states = trace.states(&model).expect("a behaviour of the model");
    let last = states.last().expect("a state");
    let property = model
        .properties()
        .into_iter()
        .find(|p| p.name == name)
        .expect("a property of the model");
    assert!(
        !(property.condition)(&model, last),
        "the trace ends in a violation"
    );
    (name, states)
}

fn show(report: &Report) {
    println!("{report}");
}

/// The status written by the step into `states[i]`, with the state before it, for the first
/// step that made the run terminal.
fn terminal_write(states: &[State]) -> (&State, &State) {
    let i = states
        .iter()
        .position(|s| s.status().is_some_and(Status::is_terminal))
        .expect("the run ends");
    (&states[i - 1], &states[i])
}

#[test]
fn the_cancel_before_its_fixes_fails_only_no_failure_over_success() {
    // Every property of the implemented design holds, except that a success may be recorded
    // as cancelled (see `the_implemented_cancel_records_a_success_as_cancelled`).
    let report = check(&RunModel::new(Rules::CANCEL_FIRST, Bounds::ci()), 1);
    show(&report);
    assert!(
        report.exhaustive,
        "the check must visit every reachable state"
    );
    for v in &report.verdicts {
        let expected = v.name != prop::NO_FAILURE_OVER_SUCCESS;
        assert_eq!(v.holds(), expected, "{}\n{report}", v.name);
    }
    assert!(
        report.unique_states > 100_000,
        "the state space shrank: {report}"
    );
}

#[test]
fn proposed_rules_hold_at_ci_bounds() {
    assert_eq!(
        Rules::NEW,
        Rules::PROPOSED,
        "the implementation has the proposed rules"
    );
    let report = check(&RunModel::new(Rules::PROPOSED, Bounds::ci()), 1);
    show(&report);
    assert!(report.exhaustive && report.all_hold(), "{report}");
    assert!(
        report.unique_states > 100_000,
        "the state space shrank: {report}"
    );
}

#[test]
fn proposed_rules_hold_with_one_controller_and_exact_clocks() {
    let bounds = Bounds {
        controllers: 1,
        skew: 0,
        ..Bounds::ci()
    };
    let report = check(&RunModel::new(Rules::PROPOSED, bounds), 1);
    show(&report);
    assert!(report.exhaustive && report.all_hold(), "{report}");
}

#[test]
fn the_cancel_before_its_fixes_records_a_success_as_cancelled() {
    // The cancel takes an expired lease over (no allowance, no look at the pods) while a pod
    // has succeeded and its success is not recorded yet.
    let (_, states) = refuted(
        Rules::CANCEL_FIRST,
        Bounds::ci(),
        &[prop::NO_FAILURE_OVER_SUCCESS],
    );
    let (before, after) = terminal_write(&states);
    assert_eq!(after.status(), Some(Status::Cancelled));
    assert!(
        before
            .present_pods()
            .any(|(_, p)| p.phase != PodPhase::Failed),
        "a pod had succeeded or was live: {before:?}"
    );
}

#[test]
fn without_cancel_the_implementation_records_no_failure_over_success() {
    let bounds = Bounds {
        cancel: false,
        ..Bounds::ci()
    };
    let report = check(&RunModel::new(Rules::NEW, bounds), 1);
    show(&report);
    assert!(report.exhaustive && report.all_hold(), "{report}");
}

#[test]
fn stealing_the_last_attempt_records_a_success_as_failed() {
    // The old last-attempt behaviour, in the implementation without cancel (where the
    // property holds).
    let rules = Rules::NEW.variant("steal-last-attempt").expect("a variant");
    let bounds = Bounds {
        cancel: false,
        ..Bounds::ci()
    };
    let (_, states) = refuted(rules, bounds, &[prop::NO_FAILURE_OVER_SUCCESS]);
    let (before, after) = terminal_write(&states);
    assert_eq!(after.status(), Some(Status::Failed));
    // The steal took a new epoch while the last attempt's workload was running.
    assert!(after.lease.map(|l| l.epoch) > before.lease.map(|l| l.epoch));
    assert_eq!(before.running_workloads(), 1);
}

#[test]
fn cancelling_at_once_records_a_success_as_cancelled() {
    // The old cancel, on top of the proposed rules (where the property holds).
    let rules = Rules::PROPOSED
        .variant("cancel-at-once")
        .expect("a variant");
    let (_, states) = refuted(rules, Bounds::ci(), &[prop::NO_FAILURE_OVER_SUCCESS]);
    let (before, after) = terminal_write(&states);
    assert_eq!(after.status(), Some(Status::Cancelled));
    assert_eq!(
        before.running_workloads(),
        1,
        "released while the workload ran"
    );
}

#[test]
fn each_proposed_rule_is_needed() {
    for name in [
        "cancel-steal-at-once",
        "cancel-ignores-pods",
        "cancel-release-over-start",
    ] {
        let rules = Rules::PROPOSED.variant(name).expect("a variant");
        let (_, states) = refuted(rules, Bounds::ci(), &[prop::NO_FAILURE_OVER_SUCCESS]);
        let (_, after) = terminal_write(&states);
        assert_eq!(after.status(), Some(Status::Cancelled), "{name}");
    }
}

#[test]
fn create_on_steal_breaks_g3() {
    let (_, states) = refuted(rules("create-on-steal"), Bounds::ci(), &[prop::G3_ONE_LIVE]);
    assert_eq!(states.last().map(State::running_workloads), Some(2));
}

#[test]
fn create_on_steal_breaks_g3_even_with_exact_clocks() {
    // No skew at all: a frozen sidecar (one that stops renewing) is enough.
    let bounds = Bounds {
        skew: 0,
        ..Bounds::ci()
    };
    refuted(rules("create-on-steal"), bounds, &[prop::G3_ONE_LIVE]);
}

#[test]
fn no_finalizer_breaks_g2() {
    let (_, states) = refuted(rules("no-finalizer"), Bounds::ci(), &G2);
    // The successful pod disappeared with its result before the run was recorded.
    assert!(
        states
            .last()
            .is_some_and(|s| s.pods.contains(&PodSlot::Gone) && s.ghost.successes == 1),
        "{:?}",
        states.last()
    );
}

#[test]
fn current_epoch_only_breaks_g2() {
    let (_, states) = refuted(rules("current-epoch-only"), Bounds::ci(), &G2);
    // An older epoch's pod succeeded and is still there, unread.
    assert!(states.last().is_some_and(|s| {
        s.present_pods()
            .any(|(e, p)| p.phase == PodPhase::Succeeded && s.lease.is_some_and(|l| e < l.epoch))
    }));
}

#[test]
fn blind_claim_breaks_g1() {
    let (_, states) = refuted(rules("blind-claim"), Bounds::ci(), &[prop::G1_ONE_DECISION]);
    assert_eq!(states.last().map(|s| s.ghost.tick_decisions), Some(2));
}

#[test]
fn old_rules_break_g3_g2_and_record_failures_over_successes() {
    let old = Rules::OLD;
    refuted(old, Bounds::ci(), &[prop::G3_ONE_LIVE]);
    refuted(old, Bounds::ci(), &G2);
    refuted(old, Bounds::ci(), &[prop::NO_FAILURE_OVER_SUCCESS]);
}

#[test]
fn every_rule_is_needed() {
    // Each rule of the proposed design (which satisfies every property), turned off alone,
    // lets the checker find a counterexample to some `always` property at CI bounds.
    let variants = Rules::NAMES
        .iter()
        .filter(|(n, _)| !matches!(*n, "new" | "proposed" | "old"));
    for (name, _) in variants {
        let rules = Rules::PROPOSED.variant(name).expect("a variant");
        assert_ne!(rules, Rules::PROPOSED, "{name} turns a rule off");
        let report = cojob_model::refute(&RunModel::new(rules, Bounds::ci()), 1);
        assert!(!report.all_hold(), "{name}: no counterexample\n{report}");
    }
}

#[test]
fn traces_replay() {
    // A hand-written behaviour: dispatch, create, schedule, attach, succeed, complete.
    let model = RunModel::new(Rules::NEW, Bounds::tiny());
    let actions = [
        Action::Claim { controller: 0 },
        Action::Dispatch { controller: 0 },
        Action::CreatePod,
        Action::Schedule { epoch: 1, skew: 0 },
        Action::Attach { epoch: 1 },
        Action::WorkloadEnds {
            epoch: 1,
            success: true,
        },
        Action::Complete,
    ];
    let init = cojob_model::initial_states(&model)
        .into_iter()
        .next()
        .expect("an initial state");
    let trace = cojob_model::Trace {
        init,
        actions: actions.to_vec(),
    };
    let states = trace.states(&model).expect("every step is enabled");
    assert_eq!(
        states.last().and_then(State::status),
        Some(cojob_model::Status::Succeeded)
    );
}

/// Replays `actions` from the initial state of `model` with controller skews `[0, 0]`.
fn replay(model: &RunModel, actions: &[Action]) -> Vec<State> {
    let init = cojob_model::initial_states(model)
        .into_iter()
        .find(|s| s.controller_skew == [0, 0])
        .expect("an initial state");
    let trace = cojob_model::Trace {
        init,
        actions: actions.to_vec(),
    };
    trace.states(model).expect("every step is enabled")
}

#[test]
fn a_silent_last_attempt_is_stopped_and_its_success_recorded() {
    // One attempt allowed; the sidecar attaches and goes silent; past deadline + allowance the
    // controller may not steal, it stops the pod; the workload exits 0 in its grace period.
    let bounds = Bounds {
        max_attempts: 1,
        ..Bounds::ci()
    };
    let model = RunModel::new(Rules::NEW, bounds);
    let mut actions = vec![
        Action::Claim { controller: 0 },
        Action::Dispatch { controller: 0 },
        Action::CreatePod,
        Action::Schedule { epoch: 1, skew: 0 },
        Action::Attach { epoch: 1 },
    ];
    actions.extend([Action::Tick; 3]);
    let before = replay(&model, &actions);
    let last = before.last().expect("a state");
    assert!(
        model
            .next_state(last, Action::Dispatch { controller: 0 })
            .is_none()
    );
    actions.extend([
        Action::FenceInsteadOfSteal { controller: 0 },
        Action::WorkloadEnds {
            epoch: 1,
            success: true,
        },
        Action::Complete,
    ]);
    let states = replay(&model, &actions);
    let end = states.last().expect("a state");
    assert_eq!(end.status(), Some(Status::Succeeded));
    assert!(end.ghost.success_recorded_from_deleted_pod);
    // With the old rule the steal records the run failed instead.
    let old = RunModel::new(
        Rules::NEW.variant("steal-last-attempt").expect("a variant"),
        bounds,
    );
    let stolen = old
        .next_state(last, Action::Dispatch { controller: 0 })
        .expect("the steal is enabled");
    assert_eq!(stolen.status(), Some(Status::Failed));
}

#[test]
fn a_pod_that_never_starts_times_out_and_its_late_attach_fails() {
    let model = RunModel::new(Rules::NEW, Bounds::ci());
    let states = replay(
        &model,
        &[
            Action::Claim { controller: 0 },
            Action::Dispatch { controller: 0 },
            Action::CreatePod,
            Action::Schedule { epoch: 1, skew: 0 },
            Action::StartTimeout,
            Action::Attach { epoch: 1 },
        ],
    );
    let end = states.last().expect("a state");
    assert_eq!(end.status(), Some(Status::Retrying));
    assert_eq!(
        end.pod(1).map(|p| (p.phase, p.deleting)),
        Some((PodPhase::Failed, true))
    );
    // Once the sidecar recorded the start, the timeout is refused.
    let started = &states[states.len() - 3];
    let attached = model
        .next_state(started, Action::Attach { epoch: 1 })
        .expect("the attach is enabled");
    assert!(model.next_state(&attached, Action::StartTimeout).is_none());
}

#[test]
fn a_started_cancel_waits_for_the_workload_and_a_success_wins() {
    let model = RunModel::new(Rules::NEW, Bounds::ci());
    let states = replay(
        &model,
        &[
            Action::Claim { controller: 0 },
            Action::Dispatch { controller: 0 },
            Action::CreatePod,
            Action::Schedule { epoch: 1, skew: 0 },
            Action::Attach { epoch: 1 },
            Action::Cancel { controller: 0 },
        ],
    );
    let cancelled = states.last().expect("a state");
    // Requested and stopped, not released.
    assert!(
        cancelled
            .lease
            .is_some_and(|l| l.state.cancel_requested && l.holder.is_some())
    );
    assert!(cancelled.pod(1).is_some_and(|p| p.deleting));
    assert!(
        model
            .next_state(cancelled, Action::ReleaseCancelled)
            .is_none()
    );
    let success = model
        .next_state(
            cancelled,
            Action::WorkloadEnds {
                epoch: 1,
                success: true,
            },
        )
        .and_then(|s| model.next_state(&s, Action::Complete))
        .expect("completes");
    assert_eq!(success.status(), Some(Status::Succeeded));
    let failure = model
        .next_state(cancelled, Action::Kill { epoch: 1 })
        .and_then(|s| model.next_state(&s, Action::Complete))
        .expect("completes");
    assert_eq!(failure.status(), Some(Status::Cancelled));
}
