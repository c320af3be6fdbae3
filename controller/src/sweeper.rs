//! The sweeper: drives each active run one step along its lifecycle.
//!
//! Reconcile calls [`sync_run`] for every active run in the job's index, at least every
//! `--sweep-interval`. It reads the run's lease (one GET, never a listing), looks at the run's
//! pods, picks the next step with [`run::decide`] and carries it out:
//!
//! - **dispatch**: mint a holder, keep it in a Secret, acquire a new epoch with the
//!   [`run::acquire`] transition, create the pod `<runId>-<epoch>` and hand the Secret to it;
//! - **complete**: the pod ended, so attach with its holder and release with the final state;
//!   a failure with attempts left is dispatched again under a new epoch;
//! - **steal**: the lease expired (pod deleted, node lost, sidecar silent), so take it under a
//!   new epoch and respawn, up to `maxAttempts`;
//! - **fence**: delete live pods whose epoch is older than the lease's.
//!
//! Each step is idempotent and ordered so that a crash between any two steps converges (I5):
//! the Secret is created before the lease is acquired, so a holder is never lost, and the
//! acquisition's `dispatch` marker makes a second acquisition for the same dispatch attach
//! instead of taking another epoch.

use std::collections::BTreeMap;

use cojob::{Error as StoreError, LeaseInfo, LeaseOptions};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use crate::context::JobScope;
use crate::index::{ActiveRun, FinishedRun};
use crate::pod::{HOLDER_KEY, LABEL_EPOCH, LABEL_JOB, LABEL_RUN, RunIdentity, SidecarConfig};
use crate::run::{self, Acquire, PodOutcome, PodView, Refusal, RunPhase, RunState, Step};

/// A failure while driving a run.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The bucket failed (unreachable, wrong credentials, contention).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The Kubernetes API failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The run's lease holds something that is not a cojob run; it is left untouched.
    #[error("run {run_id}: {refusal}")]
    Foreign {
        /// The run.
        run_id: String,
        /// What is wrong.
        refusal: Refusal,
    },
    /// A holder Secret exists but holds no usable holder; it is left untouched.
    #[error("secret {0} holds no holder")]
    BadSecret(String),
}

/// Where a run stands after a sweep.
#[derive(Debug, Clone, PartialEq)]
pub enum RunReport {
    /// Still running (or waiting to).
    Active {
        /// The lease's epoch (0 before the first acquisition).
        epoch: u64,
        /// The attempt.
        attempt: u32,
        /// The current pod, if it exists.
        pod: Option<String>,
        /// The run's phase.
        phase: RunPhase,
    },
    /// Terminal.
    Finished(FinishedRun),
}

/// The pods of one run, by epoch.
pub type RunPods = BTreeMap<u64, Pod>;

/// Groups the job's pods by run and epoch, keeping only pods this job controls.
pub fn group_pods(scope: &JobScope<'_>, pods: Vec<Pod>) -> BTreeMap<String, RunPods> {
    let mut out: BTreeMap<String, RunPods> = BTreeMap::new();
    for pod in pods {
        if !scope.owns(pod.owner_references()) {
            continue;
        }
        let labels = pod.labels();
        let (Some(run), Some(epoch)) = (
            labels.get(LABEL_RUN).cloned(),
            labels.get(LABEL_EPOCH).and_then(|e| e.parse::<u64>().ok()),
        ) else {
            continue;
        };
        out.entry(run).or_default().insert(epoch, pod);
    }
    out
}

/// How a pod ended, or that it has not.
pub fn pod_view(pod: Option<&Pod>) -> PodView {
    let Some(pod) = pod else {
        return PodView::Absent;
    };
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    if phase != "Succeeded" && phase != "Failed" {
        return PodView::Live;
    }
    let codes: Vec<i32> = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code))
        .collect();
    let exit_code = codes
        .iter()
        .copied()
        .find(|c| *c != 0)
        .or(codes.first().copied());
    PodView::Ended(PodOutcome {
        succeeded: phase == "Succeeded",
        exit_code,
        reason: status.and_then(|s| s.reason.clone()),
    })
}

fn is_live(pod: &Pod) -> bool {
    matches!(pod_view(Some(pod)), PodView::Live)
}

fn now_str(scope: &JobScope<'_>) -> String {
    cojob::json::format_time(scope.cx.db.clock().now())
}

fn holder_secret_name(run_id: &str, epoch: u64) -> String {
    format!("{run_id}-{epoch}-holder")
}

fn foreign(run_id: &str, refusal: Refusal) -> SweepError {
    SweepError::Foreign {
        run_id: run_id.into(),
        refusal,
    }
}

/// Drives one active run a step forward.
pub async fn sync_run(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    pods: &RunPods,
) -> Result<RunReport, SweepError> {
    let key = scope.keys.lease(&run.run_id);
    let lease = scope.cx.db.inspect_lease(&key).await?;
    if let Some(l) = &lease {
        fence(scope, run, pods, l.epoch).await?;
    }
    let current = lease.as_ref().and_then(|l| pods.get(&l.epoch));
    let view = pod_view(current);
    // A missing pod is created again only when its Secret was never handed to a pod: then a
    // crash came between acquiring and creating. A Secret owned by a pod means the pod existed
    // and was deleted; its lease must expire first (the pod may still be stopping).
    let never_spawned = match (&lease, &view) {
        (Some(l), PodView::Absent) if !l.is_released() => scope
            .secrets
            .get_opt(&holder_secret_name(&run.run_id, l.epoch))
            .await?
            .is_some_and(|s| !s.owner_references().iter().any(|o| o.kind == "Pod")),
        _ => false,
    };
    let now = scope.cx.db.clock().now();
    let step = run::decide(lease.as_ref(), &view, never_spawned, now)
        .map_err(|r| foreign(&run.run_id, r))?;
    tracing::debug!(job = %scope.name, run = %run.run_id, ?step, "sweep");
    match step {
        Step::Dispatch => dispatch(scope, run, lease.as_ref()).await,
        Step::Finished(state) => {
            // A pod created by a racing dispatch after the run ended, or left by a crash
            // between a cancel's release and its pod deletion: stop it (its sidecar cannot
            // attach, so its workload never started).
            stop_live_pods(scope, pods.values().collect()).await?;
            Ok(finished(run, lease.as_ref(), &state))
        }
        Step::Wait => {
            if let (Some(l), Some(pod)) = (&lease, current) {
                // A crash may have come between creating the pod and handing it its Secret.
                let secret =
                    adopt_secret(scope, &holder_secret_name(&run.run_id, l.epoch), pod).await?;
                keep_pending_alive(scope, run, l, pod, secret.as_ref()).await?;
            }
            Ok(active(lease.as_ref(), current))
        }
        Step::CreatePod => {
            let Some(l) = &lease else {
                return Ok(active(None, None));
            };
            let state = RunState::parse(&l.state).map_err(|r| foreign(&run.run_id, r))?;
            spawn(scope, run, l.epoch, state.attempt).await?;
            Ok(active(lease.as_ref(), None))
        }
        Step::Complete(outcome) => match &lease {
            Some(l) => complete(scope, run, l, &outcome).await,
            None => Ok(active(None, None)),
        },
        Step::Steal => {
            let report = dispatch(scope, run, lease.as_ref()).await?;
            let epoch = match &report {
                RunReport::Active { epoch, .. } => *epoch,
                RunReport::Finished(f) => f.epoch,
            };
            if let Some(l) = &lease
                && epoch > l.epoch
            {
                let stale = format!("{}-{}", run.run_id, l.epoch);
                scope
                    .run_event(
                        EventType::Warning,
                        "LeaseLost",
                        format!(
                            "run {}: the lease of epoch {} expired (pod gone or silent); taken over by epoch {epoch}",
                            run.run_id, l.epoch
                        ),
                        Some(&stale),
                    )
                    .await;
                fence(scope, run, pods, epoch).await?;
            }
            Ok(report)
        }
    }
}

/// Renews the lease for a pod that has not started yet (unscheduled, pulling its image): its
/// sidecar cannot renew before it runs, and a slow start is not a lost run. Like a Job's pod,
/// a pending pod waits as long as it takes (bounded by `activeDeadlineSeconds` once it is
/// placed). The renewal is due when a third of the ttl has passed, so it costs one write every
/// ttl/3 per pending run.
async fn keep_pending_alive(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    lease: &LeaseInfo,
    pod: &Pod,
    secret: Option<&Secret>,
) -> Result<(), SweepError> {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let pending = matches!(phase, None | Some("Pending"))
        && pod.metadata.deletion_timestamp.is_none()
        && RunState::parse(&lease.state).is_ok_and(|s| s.status == RunPhase::Pending);
    let ttl = scope.ttl();
    let left = (lease.deadline - scope.cx.db.clock().now())
        .to_std()
        .unwrap_or_default();
    if !pending || left > ttl * 2 / 3 {
        return Ok(());
    }
    let Some(secret) = secret else {
        return Ok(());
    };
    let holder = holder_of(secret)?;
    let key = scope.keys.lease(&run.run_id);
    if let Some(mut handle) = scope.cx.db.attach_lease_from(&key, lease, &holder, ttl)? {
        match handle.renew().await {
            Ok(()) => {
                tracing::debug!(job = %scope.name, run = %run.run_id, "renewed the lease of a pending pod")
            }
            Err(e) if e.is_lease_lost() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn active(lease: Option<&LeaseInfo>, pod: Option<&Pod>) -> RunReport {
    let state = lease.and_then(|l| RunState::parse(&l.state).ok());
    RunReport::Active {
        epoch: lease.map_or(0, |l| l.epoch),
        attempt: state.as_ref().map_or(0, |s| s.attempt),
        pod: pod.map(|p| p.name_any()),
        phase: state.map_or(RunPhase::Pending, |s| s.status),
    }
}

fn finished(run: &ActiveRun, lease: Option<&LeaseInfo>, state: &RunState) -> RunReport {
    RunReport::Finished(FinishedRun {
        run_id: run.run_id.clone(),
        fire_time: run.fire_time.clone(),
        status: state.status,
        epoch: lease.map_or(0, |l| l.epoch),
        attempt: state.attempt,
        exit_code: state.exit_code,
        finished_at: state.finished_at.clone(),
    })
}

/// Deletes the live pods of `run` whose epoch is older than `epoch`: their sidecar's next
/// write fails anyway (the bucket fences it); removing them stops the work.
async fn fence(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    pods: &RunPods,
    epoch: u64,
) -> Result<(), SweepError> {
    tracing::debug!(job = %scope.name, run = %run.run_id, epoch, "fencing older pods");
    let older: Vec<&Pod> = pods.range(..epoch).map(|(_, pod)| pod).collect();
    stop_live_pods(scope, older).await
}

/// Deletes the pods that still run and are not being deleted already.
async fn stop_live_pods(scope: &JobScope<'_>, pods: Vec<&Pod>) -> Result<(), SweepError> {
    for pod in pods {
        if is_live(pod) && pod.metadata.deletion_timestamp.is_none() {
            tracing::info!(job = %scope.name, pod = %pod.name_any(), "deleting a pod");
            delete_pod(scope, &pod.name_any()).await?;
        }
    }
    Ok(())
}

/// Deletes a pod; an absent pod is fine.
pub async fn delete_pod(scope: &JobScope<'_>, name: &str) -> Result<(), SweepError> {
    match scope.pods.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The holder kept in a run's Secret, if the Secret exists.
async fn read_holder(scope: &JobScope<'_>, name: &str) -> Result<Option<String>, SweepError> {
    match scope.secrets.get_opt(name).await? {
        Some(secret) => holder_of(&secret).map(Some),
        None => Ok(None),
    }
}

/// The holder a run's Secret keeps.
fn holder_of(secret: &Secret) -> Result<String, SweepError> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(HOLDER_KEY))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .filter(|h| !h.is_empty())
        .ok_or_else(|| SweepError::BadSecret(secret.name_any()))
}

/// Creates the holder Secret of a dispatch (owned by the job until its pod exists) or, when a
/// crashed dispatch already made it, returns the holder it keeps.
async fn ensure_holder_secret(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    name: &str,
    epoch: u64,
    holder: String,
) -> Result<Option<String>, SweepError> {
    let mut data: BTreeMap<String, ByteString> = scope
        .cx
        .settings
        .forwarded_env
        .iter()
        .map(|(k, v)| (k.clone(), ByteString(v.clone().into_bytes())))
        .collect();
    data.insert(HOLDER_KEY.into(), ByteString(holder.clone().into_bytes()));
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(scope.namespace.clone()),
            labels: Some(BTreeMap::from([
                (LABEL_JOB.into(), scope.name.clone()),
                (LABEL_RUN.into(), run.run_id.clone()),
                (LABEL_EPOCH.into(), epoch.to_string()),
            ])),
            annotations: Some(BTreeMap::from([(
                ANNOTATION_JOB_UID.into(),
                scope.uid.clone(),
            )])),
            owner_references: Some(vec![scope.owner()]),
            ..ObjectMeta::default()
        },
        data: Some(data),
        immutable: Some(true),
        type_: Some("Opaque".into()),
        ..Secret::default()
    };
    match scope.secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(Some(holder)),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let Some(existing) = scope.secrets.get_opt(name).await? else {
                return Ok(None); // deleted meanwhile: try again next pass
            };
            if existing.annotations().get(ANNOTATION_JOB_UID) != Some(&scope.uid) {
                // A Secret of an older object with the same name (deleted and created again)
                // is still there; wait for the garbage collector.
                tracing::info!(job = %scope.name, secret = name, "a Secret of another object has this name; waiting for it to go");
                return Ok(None);
            }
            read_holder(scope, name)
                .await?
                .map(Some)
                .ok_or_else(|| SweepError::BadSecret(name.into()))
        }
        Err(e) => Err(e.into()),
    }
}

/// The annotation on holder Secrets naming the UID of the job they belong to.
pub const ANNOTATION_JOB_UID: &str = "cojob.dev/job-uid";

/// Acquires a new epoch for `run` and spawns its pod. `prev` is the lease as last read.
async fn dispatch(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    prev: Option<&LeaseInfo>,
) -> Result<RunReport, SweepError> {
    let db = &scope.cx.db;
    let key = scope.keys.lease(&run.run_id);
    let expected = prev.map_or(1, |l| l.epoch.saturating_add(1));
    let secret = holder_secret_name(&run.run_id, expected);
    let Some(holder) =
        ensure_holder_secret(scope, run, &secret, expected, cojob::new_holder()).await?
    else {
        return Ok(active(prev, None));
    };
    let acquire = Acquire {
        run_id: run.run_id.clone(),
        fire_time: run.fire_time.clone(),
        dispatch: secret.clone(),
        max_attempts: scope.max_attempts(),
        now: now_str(scope),
    };
    let opts = LeaseOptions::new(holder.clone(), scope.ttl())
        .state_fn(move |p| run::acquire(p, &acquire).map_err(Into::into));
    let mut acquired_here = true;
    let mut lease = match db.lease_from(&key, opts, prev).await {
        Ok(Some(lease)) => lease,
        Ok(None) => {
            // Held by someone else and not expired: another controller is ahead of us.
            let now = db.inspect_lease(&key).await?;
            return Ok(active(now.as_ref(), None));
        }
        Err(StoreError::Aborted { source, .. }) => match source.downcast_ref::<Refusal>() {
            Some(Refusal::AlreadyDispatched) => {
                acquired_here = false;
                match db.attach_lease(&key, &holder, scope.ttl()).await? {
                    Some(lease) => lease,
                    None => {
                        let now = db.inspect_lease(&key).await?;
                        return Ok(active(now.as_ref(), None));
                    }
                }
            }
            Some(Refusal::Terminal(_)) => {
                let now = db.inspect_lease(&key).await?;
                let state = now
                    .as_ref()
                    .map(|l| RunState::parse(&l.state))
                    .transpose()
                    .map_err(|r| foreign(&run.run_id, r))?
                    .unwrap_or_default();
                return Ok(finished(run, now.as_ref(), &state));
            }
            Some(other) => return Err(foreign(&run.run_id, other.clone())),
            None => return Err(StoreError::Aborted { key, source }.into()),
        },
        Err(e) => return Err(e.into()),
    };
    let state = RunState::parse(lease.state()).map_err(|r| foreign(&run.run_id, r))?;
    let epoch = lease.epoch();
    if state.status.is_terminal() {
        // Out of attempts, or cancelled: recorded by this acquisition; release at once.
        lease.release(None).await?;
        let _ = scope
            .secrets
            .delete(&secret, &DeleteParams::default())
            .await;
        announce_end(scope, run, &state, epoch).await;
        let info = LeaseInfo {
            epoch,
            holder: None,
            deadline: lease.deadline(),
            state: lease.state().clone(),
            version: lease.version().clone(),
        };
        return Ok(finished(run, Some(&info), &state));
    }
    if epoch != expected {
        // The lease moved between our read and our write; name the Secret after the epoch won.
        let kept = ensure_holder_secret(
            scope,
            run,
            &holder_secret_name(&run.run_id, epoch),
            epoch,
            holder.clone(),
        )
        .await?;
        if kept.as_deref() != Some(holder.as_str()) {
            // Another dispatch named a Secret after this epoch first: its holder is not the
            // lease's, so a pod using it could never attach. Let the lease expire instead.
            tracing::warn!(job = %scope.name, run = %run.run_id, epoch, "the Secret of this epoch holds another holder; not spawning");
            return Ok(RunReport::Active {
                epoch,
                attempt: state.attempt,
                pod: None,
                phase: state.status,
            });
        }
    }
    let pod = spawn(scope, run, epoch, state.attempt).await?;
    let note = format!(
        "run {} attempt {} started as pod {} (epoch {epoch})",
        run.run_id,
        state.attempt,
        pod.as_deref().unwrap_or("?")
    );
    // Announced by the controller that acquired the epoch, not by one that attached to it.
    if acquired_here {
        let reason = if state.attempt <= 1 {
            "RunDispatched"
        } else {
            "RunRespawned"
        };
        scope
            .run_event(EventType::Normal, reason, note, pod.as_deref())
            .await;
    }
    tracing::info!(job = %scope.name, run = %run.run_id, epoch, attempt = state.attempt, "run dispatched");
    Ok(RunReport::Active {
        epoch,
        attempt: state.attempt,
        pod,
        phase: state.status,
    })
}

/// Creates the pod of `(run, epoch)` (idempotent) and hands the holder Secret to it. Returns
/// the pod's name, or `None` while a pod of the same name from an older object still exists.
async fn spawn(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    epoch: u64,
    attempt: u32,
) -> Result<Option<String>, SweepError> {
    let identity = RunIdentity {
        run_id: run.run_id.clone(),
        epoch,
        attempt,
        fire_time: run.fire_time.clone().unwrap_or_default(),
        lease_key: scope.keys.lease(&run.run_id),
    };
    let settings = &scope.cx.settings;
    let cfg = SidecarConfig {
        image: settings.sidecar_image.clone(),
        bucket: settings.bucket.clone(),
        env: Vec::new(),
        ttl_seconds: scope.job.spec.lease.ttl_seconds,
        credentials_secret: settings.sidecar_credentials_secret.clone(),
    };
    let pod = crate::pod::build_pod(
        &scope.job.spec.template,
        &scope.namespace,
        scope.owner(),
        &scope.name,
        &identity,
        &cfg,
        scope.job.spec.active_deadline_seconds,
    );
    let name = identity.pod_name();
    let created = match scope.pods.create(&PostParams::default(), &pod).await {
        Ok(p) => p,
        Err(kube::Error::Api(s)) if s.code == 409 => scope.pods.get(&name).await?,
        Err(e) => return Err(e.into()),
    };
    if !scope.owns(created.owner_references()) {
        tracing::info!(job = %scope.name, pod = %name, "a pod of an older object with this name still exists; waiting for it to go");
        return Ok(None);
    }
    adopt_secret(scope, &identity.secret_name(), &created).await?;
    Ok(Some(name))
}

/// Makes the pod the owner of its holder Secret, so the Secret goes with the pod. One read when
/// it already is. Returns the Secret as read (`None` when absent).
async fn adopt_secret(
    scope: &JobScope<'_>,
    secret: &str,
    pod: &Pod,
) -> Result<Option<Secret>, SweepError> {
    let found = scope.secrets.get_opt(secret).await?;
    let (Some(uid), Some(current)) = (pod.uid(), &found) else {
        return Ok(found);
    };
    if current.owner_references().iter().any(|o| o.uid == uid) {
        return Ok(found);
    }
    let owner = OwnerReference {
        api_version: Pod::api_version(&()).into_owned(),
        kind: Pod::kind(&()).into_owned(),
        name: pod.name_any(),
        uid,
        controller: None,
        block_owner_deletion: None,
    };
    let patch = json!({"metadata": {"ownerReferences": [owner]}});
    match scope
        .secrets
        .patch(secret, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(patched) => Ok(Some(patched)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The pod of the lease's epoch ended: release with the final state, and dispatch the next
/// attempt when one is due.
async fn complete(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    lease: &LeaseInfo,
    outcome: &PodOutcome,
) -> Result<RunReport, SweepError> {
    let db = &scope.cx.db;
    let key = scope.keys.lease(&run.run_id);
    let holder = read_holder(scope, &holder_secret_name(&run.run_id, lease.epoch)).await?;
    let attached = match &holder {
        Some(h) => db.attach_lease_from(&key, lease, h, scope.ttl())?,
        None => None,
    };
    let now = now_str(scope);
    let max = scope.max_attempts();
    let mut released = None;
    let (state, phase) = match attached {
        Some(mut handle) => {
            let (state, phase) = run::complete(handle.state(), outcome, max, &now)
                .map_err(|r| foreign(&run.run_id, r))?;
            match handle.release(Some(state.clone())).await {
                Ok(()) => {
                    released = Some(LeaseInfo {
                        epoch: handle.epoch(),
                        holder: None,
                        deadline: handle.deadline(),
                        state: handle.state().clone(),
                        version: handle.version().clone(),
                    });
                    (state, phase)
                }
                Err(e) if e.is_lease_lost() => return Ok(active(Some(lease), None)),
                Err(e) => return Err(e.into()),
            }
        }
        None if lease.is_expired_at(db.clock().now()) => {
            // The holder is gone (or the sidecar stopped renewing before the controller came
            // by): take the expired lease over to record the result, guarded by the dispatch
            // marker so a newer attempt is never overwritten.
            let dispatch = RunState::parse(&lease.state)
                .map_err(|r| foreign(&run.run_id, r))?
                .dispatch;
            let outcome = outcome.clone();
            let now2 = now.clone();
            let opts = LeaseOptions::new(cojob::new_holder(), scope.ttl()).state_fn(move |p| {
                let p = p.cloned().unwrap_or(Value::Null);
                let current = RunState::parse(&p)?;
                if current.dispatch != dispatch {
                    return Err(Refusal::AlreadyDispatched.into());
                }
                Ok(run::complete(&p, &outcome, max, &now2)?.0)
            });
            match db.lease_from(&key, opts, Some(lease)).await {
                Ok(Some(mut handle)) => {
                    let state = handle.state().clone();
                    let phase = RunState::parse(&state)
                        .map_err(|r| foreign(&run.run_id, r))?
                        .status;
                    handle.release(None).await?;
                    (state, phase)
                }
                Ok(None) | Err(StoreError::Aborted { .. }) => {
                    return Ok(active(Some(lease), None));
                }
                Err(e) => return Err(e.into()),
            }
        }
        None => return Ok(active(Some(lease), None)),
    };
    let parsed = RunState::parse(&state).map_err(|r| foreign(&run.run_id, r))?;
    if phase == RunPhase::Retrying {
        scope
            .run_event(
                EventType::Warning,
                "RunRetrying",
                format!(
                    "run {} attempt {} failed (exit code {}); retrying",
                    run.run_id,
                    parsed.attempt,
                    parsed.exit_code.map_or("none".into(), |c| c.to_string())
                ),
                Some(&format!("{}-{}", run.run_id, lease.epoch)),
            )
            .await;
        let released = match released {
            Some(info) => Some(info),
            None => db.inspect_lease(&key).await?,
        };
        return dispatch(scope, run, released.as_ref()).await;
    }
    announce_end(scope, run, &parsed, lease.epoch).await;
    let info = LeaseInfo {
        holder: None,
        state,
        ..lease.clone()
    };
    Ok(finished(run, Some(&info), &parsed))
}

async fn announce_end(scope: &JobScope<'_>, run: &ActiveRun, state: &RunState, epoch: u64) {
    let code = state
        .exit_code
        .map_or_else(|| "none".to_string(), |c| c.to_string());
    let pod = format!("{}-{epoch}", run.run_id);
    let (type_, reason, note) = match state.status {
        RunPhase::Succeeded => (
            EventType::Normal,
            "RunSucceeded",
            format!("run {} succeeded on attempt {}", run.run_id, state.attempt),
        ),
        RunPhase::Cancelled => (
            EventType::Normal,
            "RunCancelled",
            format!("run {} cancelled", run.run_id),
        ),
        _ => (
            EventType::Warning,
            "RunFailed",
            format!(
                "run {} failed after {} attempt(s) (exit code {code}, reason {})",
                run.run_id,
                state.attempt,
                state.reason.as_deref().unwrap_or("Error")
            ),
        ),
    };
    scope.run_event(type_, reason, note, Some(&pod)).await;
}

/// Cancels a run cooperatively: marks `cancel_requested` (the sidecar shows it to the
/// workload), then, holding the lease through its Secret, releases it as `cancelled` and
/// deletes the live pod. A run that was never dispatched is recorded as cancelled so it never
/// starts. Returns true once the run is terminal.
pub async fn cancel_run(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    pods: &RunPods,
) -> Result<bool, SweepError> {
    let db = &scope.cx.db;
    let key = scope.keys.lease(&run.run_id);
    let now = now_str(scope);
    let lease = db.inspect_lease(&key).await?;
    let held = match &lease {
        Some(l) => {
            let state = RunState::parse(&l.state).map_err(|r| foreign(&run.run_id, r))?;
            if state.status.is_terminal() {
                return Ok(true);
            }
            !l.is_released() && !l.is_expired_at(db.clock().now())
        }
        None => false,
    };
    if !held {
        let (run_id, fire_time, now2) = (run.run_id.clone(), run.fire_time.clone(), now.clone());
        let opts = LeaseOptions::new(cojob::new_holder(), scope.ttl()).state_fn(move |p| {
            Ok(match p {
                Some(p) => run::cancel(p, &now2)?,
                None => json!({
                    "status": RunPhase::Cancelled, "attempt": 0, "run_id": run_id,
                    "fire_time": fire_time, "reason": "Cancelled", "finished_at": now2,
                    "cancel_requested": true,
                }),
            })
        });
        return match db.lease_from(&key, opts, lease.as_ref()).await {
            Ok(Some(mut handle)) => {
                handle.release(None).await?;
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(StoreError::Aborted { .. }) => Ok(true),
            Err(e) => Err(e.into()),
        };
    }
    let Some(lease) = lease else {
        return Ok(false);
    };
    db.cooperative_write(&key, |s| {
        cojob::lease::merge(s, json!({"cancel_requested": true}))
    })
    .await?;
    if let PodView::Ended(_) = pod_view(pods.get(&lease.epoch)) {
        return Ok(false); // the sweeper completes it (as cancelled unless it succeeded)
    }
    let Some(holder) = read_holder(scope, &holder_secret_name(&run.run_id, lease.epoch)).await?
    else {
        // No holder: stop the pods; the lease expires and the sweeper records the cancel.
        stop_live_pods(scope, pods.values().collect()).await?;
        return Ok(false);
    };
    let Some(mut handle) = db.attach_lease(&key, &holder, scope.ttl()).await? else {
        return Ok(false);
    };
    let state = run::cancel(handle.state(), &now).map_err(|r| foreign(&run.run_id, r))?;
    match handle.release(Some(state)).await {
        Ok(()) => {}
        Err(e) if e.is_lease_lost() => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    stop_live_pods(scope, pods.values().collect()).await?;
    tracing::info!(job = %scope.name, run = %run.run_id, "run cancelled");
    Ok(true)
}
