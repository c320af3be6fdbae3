//! The CoordinatedJob's status: a projection of the index, written by server-side apply.

use super::*;

/// Sets `Ready=False` with `reason` and, when the reason is new, publishes a Warning Event
/// (once the status is written, so a failing API server does not produce events either).
pub(super) async fn report_not_ready(
    scope: &JobScope<'_>,
    reason: &str,
    message: &str,
) -> Result<(), Error> {
    let job = scope.job;
    let already = ready_reason(job) == Some(reason);
    let mut status = job.status.clone().unwrap_or_default();
    set_ready(&mut status, job, false, reason, message);
    patch_status(scope, status).await?;
    if !already {
        scope.warning(reason, message.to_string()).await;
    }
    Ok(())
}

pub(super) fn to_time(t: DateTime<Utc>) -> Option<Time> {
    k8s_openapi::jiff::Timestamp::from_microsecond(t.timestamp_micros())
        .ok()
        .map(Time)
}

pub(super) fn ready_reason(job: &CoordinatedJob) -> Option<&str> {
    job.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == READY)
        .map(|c| c.reason.as_str())
}

/// Sets the Ready condition, keeping its transition time when nothing but the message changed.
pub(super) fn set_ready(
    status: &mut CoordinatedJobStatus,
    job: &CoordinatedJob,
    ready: bool,
    reason: &str,
    message: &str,
) {
    let value = if ready { "True" } else { "False" };
    let generation = job.metadata.generation;
    let previous = status.conditions.iter().find(|c| c.type_ == READY);
    let transition = match previous {
        Some(p) if p.status == value && p.reason == reason => p.last_transition_time.clone(),
        _ => Time(k8s_openapi::jiff::Timestamp::now()),
    };
    status.conditions.retain(|c| c.type_ != READY);
    status.conditions.push(Condition {
        type_: READY.into(),
        status: value.into(),
        reason: reason.into(),
        message: message.chars().take(1024).collect(),
        observed_generation: generation,
        last_transition_time: transition,
    });
    status.observed_generation = generation;
}

pub(super) fn build_status(scope: &JobScope<'_>, synced: &Synced) -> CoordinatedJobStatus {
    let job = scope.job;
    let mut status = job.status.clone().unwrap_or_default();
    let index = &synced.index;
    // Never moves back: the status keeps the cursor if the index was lost.
    let previous = status.last_schedule_time.clone();
    status.last_schedule_time = index.cursor_time().and_then(to_time).max(previous);
    status.next_schedule_time = synced.next.and_then(to_time);
    status.active = synced.active.clone();
    status.recent = index
        .recent
        .iter()
        .map(|r| RunStatus {
            run_id: r.run_id.clone(),
            tick: r.tick_label(),
            epoch: i64::try_from(r.epoch).unwrap_or(i64::MAX),
            attempt: i32::try_from(r.attempt).unwrap_or(i32::MAX),
            pod: Some(format!("{}-{}", r.run_id, r.epoch)),
            phase: r.status.as_str().into(),
        })
        .collect();
    let c = index.counters;
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    status.counters = RunCounters {
        active: count(index.active.len() as u64),
        succeeded: count(c.succeeded),
        failed: count(c.failed),
        cancelled: count(c.cancelled),
        skipped: count(c.skipped),
        missed: count(c.missed),
    };
    let message = if job.spec.suspend {
        "suspended: new ticks are skipped".to_string()
    } else {
        match synced.next {
            Some(n) => format!("next tick at {}", cojob::json::format_time(n)),
            None if index.active.is_empty() => "no more ticks".to_string(),
            None => "running".to_string(),
        }
    };
    set_ready(&mut status, job, true, "Reconciled", &message);
    status
}

/// Writes the status by server-side apply, unless it is unchanged.
pub(super) async fn patch_status(
    scope: &JobScope<'_>,
    status: CoordinatedJobStatus,
) -> Result<(), Error> {
    if scope.job.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let api: Api<CoordinatedJob> = Api::namespaced(scope.cx.client.clone(), &scope.namespace);
    // The UID makes the patch fail on an object deleted and created again under the same
    // name since this (possibly cached) copy was read.
    let body = json!({
        "apiVersion": CoordinatedJob::api_version(&()),
        "kind": CoordinatedJob::kind(&()),
        "metadata": {"uid": scope.uid},
        "status": status,
    });
    api.patch_status(
        &scope.name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}
