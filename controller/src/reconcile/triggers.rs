//! Manual runs: a `trigger.cojob.dev/<key>` annotation asks for one run, decided exactly once
//! per key and object by a claim at `triggers/<key>`; the annotation is removed once the
//! decision is in the index.
//!
//! A trigger goes through `concurrencyPolicy` like a tick (`Forbid` skips it while a run is
//! active, `Replace` cancels older runs) but not through `suspend`: like `kubectl create job
//! --from=cronjob/…`, a manual run is an explicit request. A key asked for again (a retried CI
//! step, a re-applied manifest) finds its claim and starts nothing.

use super::*;
use crate::crd::TRIGGER_ANNOTATION_PREFIX;
use crate::layout::{check_trigger_key, trigger_run_id};
use crate::run::RunState;
use ticks::{claim_at, still_current};

/// The most triggers decided in one pass; the rest wait for the next (the annotation stays).
const PER_PASS: usize = 16;

/// One trigger's decision, as the index records it.
pub(super) struct TriggerDecision {
    /// The trigger key.
    pub key: String,
    /// What was decided.
    pub decision: Decision,
    /// The run already ended (its lease is terminal): it is not active again.
    pub ended: bool,
}

/// The trigger keys the object's annotations ask for, sorted. An annotation name that is not
/// a valid key (the API server allows a few more characters) is ignored and reported.
pub(super) fn requested(scope: &JobScope<'_>, said: &mut Announcements) -> Vec<String> {
    let mut keys = Vec::new();
    for name in scope.job.annotations().keys() {
        let Some(key) = name.strip_prefix(TRIGGER_ANNOTATION_PREFIX) else {
            continue;
        };
        match check_trigger_key(key) {
            Ok(()) => keys.push(key.to_string()),
            Err(why) => said.warning("InvalidTrigger", format!("annotation {name}: {why}")),
        }
    }
    keys
}

/// Decides the triggers in `keys` that `index` does not know yet.
pub(super) async fn decide_triggers(
    scope: &JobScope<'_>,
    keys: &[String],
    index: &JobIndex,
    said: &mut Announcements,
) -> Result<Vec<TriggerDecision>, Error> {
    let new: Vec<&String> = keys
        .iter()
        .filter(|k| !index.knows_trigger(k))
        .take(PER_PASS)
        .collect();
    if new.is_empty() || !still_current(scope).await? {
        return Ok(Vec::new());
    }
    let forbid = scope.job.spec.concurrency_policy == ConcurrencyPolicy::Forbid;
    let mut busy = !index.active.is_empty();
    let mut out = Vec::with_capacity(new.len());
    for key in new {
        let run_id = trigger_run_id(&scope.name, key);
        let proposal = if forbid && busy {
            Decision::Skipped("ConcurrencyForbid".into())
        } else {
            Decision::RunId(run_id.clone())
        };
        let what = format!("trigger {key}");
        let (decision, won) =
            claim_at(scope, &scope.keys.trigger(key), &what, proposal, said).await?;
        let mut ended = false;
        if let Decision::RunId(id) = &decision {
            busy = true;
            if won {
                said.normal("RunTriggered", format!("{what}: run {id}"));
            } else {
                // Decided before, by a pass whose index update was lost or has been trimmed
                // since: a run whose lease is terminal already ran.
                ended = run_ended(scope, id).await?;
            }
        }
        out.push(TriggerDecision {
            key: key.clone(),
            decision,
            ended,
        });
    }
    Ok(out)
}

async fn run_ended(scope: &JobScope<'_>, run_id: &str) -> Result<bool, Error> {
    let lease = scope.cx.db.inspect_lease(&scope.keys.lease(run_id)).await?;
    Ok(lease.is_some_and(|l| RunState::parse(&l.state).is_ok_and(|s| s.status.is_terminal())))
}

/// Removes the annotations of the triggers `index` has recorded. A crash before this only
/// leaves annotations whose decision the next pass finds recorded.
pub(super) async fn remove_recorded(
    scope: &JobScope<'_>,
    keys: &[String],
    index: &JobIndex,
) -> Result<(), Error> {
    let done = keys
        .iter()
        .filter(|k| index.knows_trigger(k))
        .map(|k| format!("{TRIGGER_ANNOTATION_PREFIX}{k}"))
        .collect();
    remove_annotations(scope, done).await
}
