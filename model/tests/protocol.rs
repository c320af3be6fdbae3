//! The exhaustive check of the run protocol at CI bounds, and the negative controls: each old
//! rule brought back must let the checker find a counterexample.

use cojob_model::{Bounds, Report, RunModel, Rules, check, prop, refute_any_of};

fn show(label: &str, report: &Report) {
    println!("--- {label}\n{report}");
}

#[test]
fn new_rules_hold_at_ci_bounds() {
    let report = check(&RunModel::new(Rules::NEW, Bounds::ci()), 1);
    show("new rules, CI bounds", &report);
    assert!(report.exhaustive, "the check must visit every reachable state");
    assert!(report.all_hold(), "{report}");
}
