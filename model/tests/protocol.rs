//! The exhaustive check of the run protocol at CI bounds, and the negative controls: with a
//! rule of the old design brought back, the same checker must find a counterexample.

use cojob_model::stateright::Model;
use cojob_model::{
    Action, Bounds, PodPhase, PodSlot, Report, Rules, RunModel, State, check, prop, refute_any_of,
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

#[test]
fn new_rules_hold_at_ci_bounds() {
    let report = check(&RunModel::new(Rules::NEW, Bounds::ci()), 1);
    show(&report);
    assert!(
        report.exhaustive,
        "the check must visit every reachable state"
    );
    assert!(report.all_hold(), "{report}");
    assert!(
        report.unique_states > 100_000,
        "the state space shrank: {report}"
    );
}

#[test]
fn new_rules_hold_with_one_controller_and_exact_clocks() {
    let bounds = Bounds {
        controllers: 1,
        skew: 0,
        ..Bounds::ci()
    };
    let report = check(&RunModel::new(Rules::NEW, bounds), 1);
    show(&report);
    assert!(report.exhaustive && report.all_hold(), "{report}");
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
fn old_rules_break_g3_and_g2() {
    let old = Rules::OLD;
    refuted(old, Bounds::ci(), &[prop::G3_ONE_LIVE]);
    refuted(old, Bounds::ci(), &G2);
}

#[test]
fn every_rule_is_needed() {
    // Each rule of the new design, turned off alone, lets the checker find a counterexample
    // to some `always` property at CI bounds.
    for (name, _) in Rules::NAMES.iter().filter(|(n, _)| *n != "new") {
        let model = RunModel::new(rules(name), Bounds::ci());
        let report = cojob_model::refute(&model, 1);
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
