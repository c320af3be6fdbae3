//! Tick decisions: which ticks are due since the cursor, claimed once each in the bucket.

use super::*;

/// The schedule and time zone as the index records them; `None` without a schedule.
pub(super) fn schedule_fingerprint(spec: &CoordinatedJobSpec) -> Option<String> {
    let expr = spec.schedule.as_deref()?;
    let words: Vec<&str> = expr.split_whitespace().collect();
    Some(format!(
        "{} {}",
        words.join(" "),
        spec.time_zone.as_deref().unwrap_or("UTC")
    ))
}

pub(super) type TickDecisions = Vec<(Option<DateTime<Utc>>, Decision)>;

/// Claims the decision of every due tick; returns them oldest first with the next tick and
/// the start of the ticks after a long outage, if any.
pub(super) async fn decide_ticks(
    scope: &JobScope<'_>,
    schedule: Option<&Schedule>,
    index: &JobIndex,
    now: DateTime<Utc>,
    said: &mut Announcements,
) -> Result<(TickDecisions, Option<DateTime<Utc>>, Option<DateTime<Utc>>), Error> {
    let spec = &scope.job.spec;
    let Some(schedule) = schedule else {
        if index.once_decided || spec.suspend {
            return Ok((Vec::new(), None, None));
        }
        let decision = claim(
            scope,
            None,
            Decision::RunId(run_id(&scope.name, None)),
            said,
        )
        .await?;
        return Ok((vec![(None, decision)], None, None));
    };
    let since = schedule_since(scope, index, now);
    let catch_up = match spec.catch_up {
        CatchUpPolicy::Latest => CatchUp::Latest,
        CatchUpPolicy::All => CatchUp::All,
        CatchUpPolicy::None => CatchUp::None,
    };
    let deadline = spec
        .starting_deadline_seconds
        .map(|s| Duration::from_secs(s.max(0).unsigned_abs()));
    let plan = schedule.plan(since, now, deadline, catch_up);
    // After a tick decided ahead (`prestartSeconds`) the cursor is past `now`: the next tick
    // is the one after it.
    let mut next = if since > now {
        schedule.next_after(since)
    } else {
        plan.next
    };
    let mut proposals: Vec<(DateTime<Utc>, Decision)> = plan
        .missed
        .iter()
        .map(|(t, why)| (*t, Decision::Missed(why.as_str().into())))
        .collect();
    let mut busy = !index.active.is_empty();
    let forbid = spec.concurrency_policy == ConcurrencyPolicy::Forbid;
    for t in &plan.run {
        proposals.push((*t, Decision::RunId(run_id(&scope.name, Some(*t)))));
    }
    // The next tick's run, decided ahead while the job is free: nothing active, nothing due
    // to run now, not suspended. Otherwise it is decided at its tick, as without a prestart.
    let ahead = next
        .filter(|n| now >= *n - spec.prestart() && !busy && plan.run.is_empty() && !spec.suspend);
    if let Some(t) = ahead {
        proposals.push((t, Decision::RunId(run_id(&scope.name, Some(t)))));
    }
    proposals.sort_by_key(|(t, _)| *t);
    if !proposals.is_empty() && !still_current(scope).await? {
        return Ok((Vec::new(), next, None));
    }
    if let Some(t) = ahead {
        next = schedule.next_after(t);
    }
    let mut out = Vec::with_capacity(proposals.len());
    for (t, proposal) in proposals {
        let proposal = match proposal {
            Decision::RunId(_) if spec.suspend => Decision::Skipped("Suspended".into()),
            Decision::RunId(_) if forbid && busy => Decision::Skipped("ConcurrencyForbid".into()),
            other => other,
        };
        let decision = claim(scope, Some(t), proposal, said).await?;
        if matches!(decision, Decision::RunId(_)) {
            busy = true;
        }
        out.push((Some(t), decision));
    }
    Ok((out, next, plan.missed_before))
}

/// When a pass is due for the tick `next`: `prestartSeconds` before it, or at the tick itself
/// once that moment passed without its run decided ahead (the job was busy then).
pub(super) fn due_at(
    spec: &CoordinatedJobSpec,
    next: DateTime<Utc>,
    now: DateTime<Utc>,
) -> DateTime<Utc> {
    let early = next - spec.prestart();
    if early > now { early } else { next }
}

/// True while a run decided ahead waits for its tick: its fire time is still to come. A
/// suspension cancels such a run, as it skips the ticks that fall due.
pub(super) fn waits_for_its_tick(run: &ActiveRun, now: DateTime<Utc>) -> bool {
    run.trigger.is_none() && run.backfill.is_none() && run.fire_at().is_some_and(|t| t > now)
}

/// Where the schedule's own ticks begin: after the index's cursor, or the one mirrored in the
/// status, or the object's creation. Earlier ticks are decided, or a backfill's.
pub(super) fn schedule_since(
    scope: &JobScope<'_>,
    index: &JobIndex,
    now: DateTime<Utc>,
) -> DateTime<Utc> {
    let created = scope
        .job
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(crate::api_time::from_api)
        .unwrap_or(now);
    // The status mirrors the cursor, so an index lost to a bucket lifecycle rule (or a
    // restore) never makes old ticks due again.
    let mirrored = scope
        .job
        .status
        .as_ref()
        .and_then(|s| s.last_schedule_time.as_ref())
        .and_then(crate::api_time::from_api);
    index.cursor_time().max(mirrored).unwrap_or(created)
}

/// A quorum read of the object before anything is claimed for it: the informer's copy may lag,
/// and a replica must not decide ticks for an object that was deleted, recreated (another
/// UID), suspended or edited since. `false`: skip this pass; the watch brings the news. Its
/// metadata says all of that (a suspension or any other edit of the spec moves the
/// generation), so only the metadata is read: the API server neither encodes nor sends the
/// spec's pod template and the status, up to a mebibyte a job.
pub(super) async fn still_current(scope: &JobScope<'_>) -> Result<bool, Error> {
    let api: Api<CoordinatedJob> = Api::namespaced(scope.cx.client.clone(), &scope.namespace);
    let fresh = api.get_metadata_opt(&scope.name).await?;
    let current = fresh.as_ref().is_some_and(|f| {
        f.uid().as_deref() == Some(scope.uid.as_str())
            && f.metadata.deletion_timestamp.is_none()
            && f.metadata.generation == scope.job.metadata.generation
    });
    if !current {
        tracing::info!(job = %scope.name, "the cached object is stale; deciding nothing this pass");
    }
    Ok(current)
}

/// Claims one tick's decision; returns the winner's, announcing it when it is ours.
pub(super) async fn claim(
    scope: &JobScope<'_>,
    tick: Option<DateTime<Utc>>,
    proposal: Decision,
    said: &mut Announcements,
) -> Result<Decision, Error> {
    let at = tick.map_or_else(|| "once".to_string(), cojob::json::format_time);
    let (decision, _) = claim_at(
        scope,
        &scope.keys.tick(tick),
        &format!("tick {at}"),
        proposal,
        said,
    )
    .await?;
    Ok(decision)
}

/// Claims the decision at `key` (what it decides is `what`, for people); returns the winner's
/// and whether it is ours, announcing it when it is.
pub(super) async fn claim_at(
    scope: &JobScope<'_>,
    key: &str,
    what: &str,
    proposal: Decision,
    said: &mut Announcements,
) -> Result<(Decision, bool), Error> {
    let claim = scope.cx.db.claim(key, &proposal).await?;
    if claim.won {
        scope.cx.metrics.decided(match &claim.value {
            Decision::RunId(_) => crate::metrics::DecisionKind::Run,
            Decision::Skipped(_) => crate::metrics::DecisionKind::Skipped,
            Decision::Missed(_) => crate::metrics::DecisionKind::Missed,
        });
        match &claim.value {
            Decision::RunId(id) => {
                tracing::info!(job = %scope.name, decided = %what, run = %id, "claimed")
            }
            // While suspended every tick is skipped: the status says so, an Event per tick
            // would only repeat it.
            Decision::Skipped(why) if why == "Suspended" => {
                tracing::debug!(job = %scope.name, decided = %what, "skipped: suspended")
            }
            Decision::Skipped(why) => {
                match scope
                    .cx
                    .skipped
                    .admit(&scope.uid, scope.cx.db.clock().now())
                {
                    Some(0) => said.normal("RunSkipped", format!("{what} skipped: {why}")),
                    Some(held) => said.normal(
                        "RunSkipped",
                        format!(
                            "{what} skipped: {why} (and {held} more since the last RunSkipped \
                             Event; `cojob runs` lists them)"
                        ),
                    ),
                    None => {
                        tracing::debug!(job = %scope.name, decided = %what, %why, "skipped (Event held back)")
                    }
                }
            }
            Decision::Missed(why) => said.warning("RunMissed", format!("{what} missed: {why}")),
        }
    }
    Ok((claim.value, claim.won))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn spec(prestart: Option<i64>) -> CoordinatedJobSpec {
        serde_json::from_value(serde_json::json!({
            "schedule": "* * * * *", "prestartSeconds": prestart, "template": {}
        }))
        .unwrap()
    }

    #[test]
    fn a_pass_is_due_prestart_before_the_tick_then_at_the_tick() {
        let tick = at("2026-12-05T10:00:00Z");
        let ahead = spec(Some(20));
        assert_eq!(
            due_at(&ahead, tick, at("2026-12-05T09:59:00Z")),
            at("2026-12-05T09:59:40Z")
        );
        // Inside the prestart (the job was busy at its start): at the tick.
        assert_eq!(due_at(&ahead, tick, at("2026-12-05T09:59:40Z")), tick);
        assert_eq!(due_at(&ahead, tick, at("2026-12-05T09:59:50Z")), tick);
        assert_eq!(due_at(&spec(None), tick, at("2026-12-05T09:59:00Z")), tick);
        // Out of bounds (refused at apply time) is clamped.
        assert_eq!(spec(Some(-5)).prestart(), chrono::Duration::zero());
        assert_eq!(
            spec(Some(100_000)).prestart(),
            chrono::Duration::seconds(600)
        );
    }

    #[test]
    fn only_a_tick_run_whose_tick_is_to_come_waits_for_it() {
        let now = at("2026-12-05T09:59:50Z");
        let run = |fire: &str, trigger: Option<&str>, backfill: Option<&str>| ActiveRun {
            run_id: "r".into(),
            fire_time: Some(fire.into()),
            trigger: trigger.map(String::from),
            backfill: backfill.map(String::from),
        };
        assert!(waits_for_its_tick(
            &run("2026-12-05T10:00:00.000000Z", None, None),
            now
        ));
        assert!(!waits_for_its_tick(
            &run("2026-12-05T09:59:00.000000Z", None, None),
            now
        ));
        assert!(!waits_for_its_tick(
            &run("2026-12-05T10:00:00.000000Z", Some("k"), None),
            now
        ));
        assert!(!waits_for_its_tick(
            &run("2026-12-05T10:00:00.000000Z", None, Some("b")),
            now
        ));
        let once = ActiveRun {
            run_id: "r".into(),
            ..ActiveRun::default()
        };
        assert!(!waits_for_its_tick(&once, now));
    }
}
