//! Backfills asked for by annotation (`backfill.cojob.dev/<id>`), driven a few ticks per pass;
//! the rules are in [`crate::backfill`].

use super::*;
use crate::backfill::{BackfillProgress, BackfillRequest, MAX_TICKS, count_ticks};
use crate::crd::BACKFILL_ANNOTATION_PREFIX;
use crate::layout::check_trigger_key;
use crate::run::RunState;
use kube::runtime::events::EventType;
use ticks::{claim_at, schedule_since, still_current};

/// The most backfills driven in one pass.
const PER_PASS: usize = 4;
/// The most ticks one backfill claims in one pass (ticks decided before cost a claim but no
/// room; new runs stop at its parallelism).
const CLAIMS_PER_PASS: usize = 64;

/// One backfill in this pass.
pub(super) struct Step {
    id: String,
    progress: BackfillProgress,
    version: Option<Version>,
    /// Ticks decided in this pass, with the decision and whether its run had ended already.
    decided: Vec<(DateTime<Utc>, Decision, bool, bool)>,
}

impl Step {
    /// True when this pass decided a tick of the backfill.
    pub(super) fn decided_any(&self) -> bool {
        !self.decided.is_empty()
    }

    /// What the index must record.
    pub(super) fn record(&self, index: &mut JobIndex) {
        for (t, decision, ended, _) in &self.decided {
            index.record_backfilled(&self.id, *t, decision, *ended);
        }
    }
}

/// The backfill ids the object's annotations ask for, with their values, sorted.
pub(super) fn requested(scope: &JobScope<'_>) -> Vec<(String, String)> {
    scope
        .job
        .annotations()
        .iter()
        .filter_map(|(name, value)| {
            let id = name.strip_prefix(BACKFILL_ANNOTATION_PREFIX)?;
            Some((id.to_string(), value.clone()))
        })
        .collect()
}

/// Claims the next ticks of each requested backfill; refused requests are reported and their
/// annotations removed. The caller records the steps in the index, then calls [`finish`].
pub(super) async fn decide(
    scope: &JobScope<'_>,
    schedule: Option<&Schedule>,
    asked: &[(String, String)],
    index: &JobIndex,
    now: DateTime<Utc>,
    said: &mut Announcements,
) -> Result<Vec<Step>, Error> {
    let mut refused = Vec::new();
    let mut steps = Vec::new();
    let mut checked = false;
    for (id, value) in asked.iter().take(PER_PASS) {
        let annotation = format!("{BACKFILL_ANNOTATION_PREFIX}{id}");
        let request = check_trigger_key(id)
            .map_err(|e| e.replace("trigger key", "backfill id"))
            .and_then(|()| BackfillRequest::parse(value));
        let (request, schedule) = match (request, schedule) {
            (Ok(r), Some(s)) => (r, s),
            (Err(why), _) => {
                said.warning("InvalidBackfill", format!("{annotation}: {why}"));
                refused.push(annotation);
                continue;
            }
            (Ok(_), None) => {
                said.warning(
                    "InvalidBackfill",
                    format!("{annotation}: the job has no schedule, so no ticks to backfill"),
                );
                refused.push(annotation);
                continue;
            }
        };
        if count_ticks(schedule, &request) > MAX_TICKS {
            said.warning(
                "InvalidBackfill",
                format!("{annotation}: the range holds more than {MAX_TICKS} ticks; split it"),
            );
            refused.push(annotation);
            continue;
        }
        let doc = scope
            .cx
            .db
            .doc::<BackfillProgress>(&scope.keys.backfill(id));
        let (progress, version) = match doc.get().await? {
            Some((p, v)) => (p, Some(v)),
            None => (BackfillProgress::new(request), None),
        };
        let mut room = usize::try_from(progress.request.parallelism)
            .unwrap_or(1)
            .saturating_sub(index.active_of_backfill(id));
        let limit = schedule_since(scope, index, now);
        let ticks = if progress.done || room == 0 {
            Vec::new()
        } else {
            progress.next_ticks(schedule, limit, CLAIMS_PER_PASS)
        };
        if !ticks.is_empty() && !checked {
            if !still_current(scope).await? {
                return Ok(Vec::new());
            }
            checked = true;
        }
        let mut decided = Vec::with_capacity(ticks.len());
        for t in ticks {
            if room == 0 {
                break;
            }
            let proposal = Decision::RunId(run_id(&scope.name, Some(t)));
            let what = format!("tick {} (backfill {id})", cojob::json::format_time(t));
            let key = scope.keys.tick(Some(t));
            let (decision, won) = claim_at(scope, &key, &what, proposal, said).await?;
            let ended = match &decision {
                Decision::RunId(run) if !won => run_ended(scope, run).await?,
                _ => false,
            };
            if let Decision::RunId(run) = &decision {
                let known = index.active.iter().any(|r| &r.run_id == run)
                    || index.recent.iter().any(|r| &r.run_id == run);
                if !known && !ended {
                    room -= 1; // a run of this backfill starts
                }
            }
            decided.push((t, decision, ended, won));
        }
        steps.push(Step {
            id: id.clone(),
            progress,
            version,
            decided,
        });
    }
    remove_annotations(scope, refused).await?;
    Ok(steps)
}

async fn run_ended(scope: &JobScope<'_>, run_id: &str) -> Result<bool, Error> {
    let lease = scope.cx.db.inspect_lease(&scope.keys.lease(run_id)).await?;
    Ok(lease.is_some_and(|l| RunState::parse(&l.state).is_ok_and(|s| s.status.is_terminal())))
}

/// After the index recorded the steps: advances each backfill's progress, and ends the ones
/// whose every tick is decided and whose runs ended (`BackfillDone`, annotation removed).
/// Returns true while a backfill has ticks left to decide.
pub(super) async fn finish(
    scope: &JobScope<'_>,
    schedule: Option<&Schedule>,
    steps: Vec<Step>,
    index: &JobIndex,
    now: DateTime<Utc>,
) -> Result<bool, Error> {
    let Some(schedule) = schedule else {
        return Ok(false);
    };
    let mut left = false;
    let limit = schedule_since(scope, index, now);
    let mut ended = Vec::new();
    for step in steps {
        let cursor = step.decided.last().map(|(t, ..)| *t);
        let won = step.decided.iter().filter(|d| d.3).count() as u64;
        let kept = step.decided.len() as u64 - won;
        let complete = index.active_of_backfill(&step.id) == 0;
        // Applied to the stored progress: only a step that moves the cursor counts its ticks,
        // so a replica that lost the race (or a pass repeated after a crash) adds nothing.
        let advance = move |mut p: BackfillProgress| {
            if cursor.is_some_and(|c| p.cursor.is_none_or(|s| c > s)) {
                p.cursor = cursor;
                p.ran += won;
                p.already_decided += kept;
            }
            if complete && p.all_decided(schedule, limit) {
                p.done = true;
            }
            Ok::<_, cojob::BoxError>(p)
        };
        let before = step.progress.clone();
        let doc = scope
            .cx
            .db
            .doc::<BackfillProgress>(&scope.keys.backfill(&step.id));
        let known = step.version.map(|v| (before.clone(), v));
        let create = known.is_none().then(|| before.clone());
        let (after, _) = doc.update_from(known, advance, create).await?;
        if after.done {
            // Published before its annotation goes, by every pass that removes it, not with
            // the pass's other Events after it: a crash between the progress's write and the
            // removal publishes it again, so it is never lost (at worst, said twice).
            scope
                .run_event(
                    EventType::Normal,
                    "BackfillDone",
                    format!(
                        "backfill {}: {} ticks ran, {} were decided before and kept their decision",
                        step.id, after.ran, after.already_decided
                    ),
                    None,
                )
                .await;
            ended.push(format!("{BACKFILL_ANNOTATION_PREFIX}{}", step.id));
        } else if !after.all_decided(schedule, limit) {
            left = true;
        }
    }
    remove_annotations(scope, ended).await?;
    Ok(left)
}
