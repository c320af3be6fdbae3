//! The CoordinatedJob's status: a projection of the index, written by server-side apply.

use super::*;

/// Sets `Ready=False` with `reason`, and the condition that names the cause (`ScheduleValid`
/// for `InvalidSpec`, `StoreAvailable` for a bucket failure). A new reason is written with
/// the object's resourceVersion as a precondition, and the Warning Event is published only by
/// the write that made the transition: with two replicas, one Event per transition.
pub(super) async fn report_not_ready(
    scope: &JobScope<'_>,
    reason: &str,
    message: &str,
) -> Result<(), Error> {
    let cause = if reason == "InvalidSpec" {
        SCHEDULE_VALID
    } else {
        STORE_AVAILABLE
    };
    let not_ready = |job: &CoordinatedJob| {
        let mut status = job.status.clone().unwrap_or_default();
        set_ready(&mut status, job, false, reason, message);
        set_condition(&mut status, job, cause, false, reason, message);
        status
    };
    let mut job = scope.job.clone();
    for _ in 0..3 {
        if ready_reason(&job) == Some(reason) {
            // Reported already (by this controller or another): refresh the message only.
            return apply_status(scope, &job, not_ready(&job), None)
                .await
                .map(|_| ());
        }
        let version = job.metadata.resource_version.clone();
        match apply_status(scope, &job, not_ready(&job), version).await {
            Ok(_) => {
                scope.warning(reason, message.to_string()).await;
                return Ok(());
            }
            // Changed since this copy was read (a finalizer added, another replica's status):
            // decide again on the fresh object.
            Err(Error::Kube(kube::Error::Api(s))) if s.code == 409 => {
                let api: Api<CoordinatedJob> =
                    Api::namespaced(scope.cx.client.clone(), &scope.namespace);
                job = api.get(&scope.name).await?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub(super) fn ready_reason(job: &CoordinatedJob) -> Option<&str> {
    job.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == READY)
        .map(|c| c.reason.as_str())
}

/// Sets the Ready condition (and the observed generation).
pub(super) fn set_ready(
    status: &mut CoordinatedJobStatus,
    job: &CoordinatedJob,
    ready: bool,
    reason: &str,
    message: &str,
) {
    set_condition(status, job, READY, ready, reason, message);
    status.observed_generation = job.metadata.generation;
}

/// Sets condition `kind`, keeping its transition time when only the message changed.
pub(super) fn set_condition(
    status: &mut CoordinatedJobStatus,
    job: &CoordinatedJob,
    kind: &str,
    value: bool,
    reason: &str,
    message: &str,
) {
    let value = if value { "True" } else { "False" };
    let previous = status.conditions.iter().find(|c| c.type_ == kind);
    let transition = match previous {
        Some(p) if p.status == value && p.reason == reason => p.last_transition_time.clone(),
        _ => Time(k8s_openapi::jiff::Timestamp::now()),
    };
    let condition = Condition {
        type_: kind.into(),
        status: value.into(),
        reason: reason.into(),
        message: message.chars().take(1024).collect(),
        observed_generation: job.metadata.generation,
        last_transition_time: transition,
    };
    match status.conditions.iter_mut().find(|c| c.type_ == kind) {
        Some(c) => *c = condition,
        None => status.conditions.push(condition),
    }
}

/// `LastRunFailed` from the newest finished run.
fn set_last_run(status: &mut CoordinatedJobStatus, job: &CoordinatedJob, index: &JobIndex) {
    let (failed, reason, message) = match index.recent.first() {
        None => (
            false,
            "NoFinishedRun",
            "no run has finished yet".to_string(),
        ),
        Some(r) if r.status == crate::run::RunPhase::Failed => (
            true,
            "RunFailed",
            format!(
                "run {} failed after attempt {}{}",
                r.run_id,
                r.attempt,
                r.exit_code
                    .map(|c| format!(", exit code {c}"))
                    .unwrap_or_default()
            ),
        ),
        Some(r) => (
            false,
            "RunEnded",
            format!("run {} {}", r.run_id, r.status.as_str()),
        ),
    };
    set_condition(status, job, LAST_RUN_FAILED, failed, reason, &message);
}

pub(super) fn build_status(scope: &JobScope<'_>, synced: &Synced) -> CoordinatedJobStatus {
    let job = scope.job;
    let mut status = job.status.clone().unwrap_or_default();
    let index = &synced.index;
    // Never moves back: the status keeps the cursor if the index was lost.
    let previous = status.last_schedule_time.clone();
    status.last_schedule_time = index
        .cursor_time()
        .and_then(crate::api_time::to_api)
        .max(previous);
    status.next_schedule_time = synced.next.and_then(crate::api_time::to_api);
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
    set_condition(
        &mut status,
        job,
        SCHEDULE_VALID,
        true,
        "Valid",
        "the schedule and template are usable",
    );
    set_condition(
        &mut status,
        job,
        STORE_AVAILABLE,
        true,
        "Reachable",
        "the bucket answered the last pass",
    );
    set_last_run(&mut status, job, index);
    status
}

/// Writes the status by server-side apply, unless it is unchanged; returns the object's
/// resource version after the write, `None` when nothing was written.
pub(super) async fn patch_status(
    scope: &JobScope<'_>,
    status: CoordinatedJobStatus,
) -> Result<Option<String>, Error> {
    apply_status(scope, scope.job, status, None).await
}

/// Writes `status` over `job`'s, unless unchanged; with `resource_version`, only if the object
/// is still at that version (409 otherwise). Returns the object's resource version after the
/// write, `None` when nothing was written.
async fn apply_status(
    scope: &JobScope<'_>,
    job: &CoordinatedJob,
    status: CoordinatedJobStatus,
    resource_version: Option<String>,
) -> Result<Option<String>, Error> {
    if job.status.as_ref() == Some(&status) {
        return Ok(None);
    }
    let api: Api<CoordinatedJob> = Api::namespaced(scope.cx.client.clone(), &scope.namespace);
    // The UID makes the patch fail on an object deleted and created again under the same
    // name since this (possibly cached) copy was read.
    let mut metadata = json!({"uid": scope.uid});
    if let Some(v) = resource_version {
        metadata["resourceVersion"] = json!(v);
    }
    let body = json!({
        "apiVersion": CoordinatedJob::api_version(&()),
        "kind": CoordinatedJob::kind(&()),
        "metadata": metadata,
        "status": status,
    });
    let written = api
        .patch_status(
            &scope.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
    Ok(written.metadata.resource_version)
}
