//! Faults from outside the controller, against the real kube-apiserver and S3 server (the
//! tests play the kubelet and the sidecar, and move a fake clock): each test here failed on the
//! controller before the guarantee it names was built (see `docs/guarantees.md`).

mod support;

use std::time::Duration;

use serde_json::json;
use support::Harness;

fn state(l: &cojob::LeaseInfo) -> cojob_controller::run::RunState {
    cojob_controller::run::RunState::parse(&l.state).expect("a run state")
}

/// True once the pod lost its result finalizer (a pod placed on a node stays until its
/// kubelet confirms; none runs here).
async fn released(h: &Harness, pod: &str) -> bool {
    match h.pods().get_opt(pod).await.unwrap() {
        None => true,
        Some(p) => !p
            .metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == cojob_controller::pod::RESULT_FINALIZER),
    }
}

/// Waits (in real time) until the pod object is gone.
async fn gone(h: &Harness, pod: &str) -> bool {
    for _ in 0..50 {
        if !h.pod_exists(pod).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// G2. The pod is deleted right after its workload exited 0, before any controller recorded
/// the result. Its result finalizer keeps the kubelet's record until the success is in the
/// lease; the run is never started again, however long the controller was away.
#[tokio::test]
async fn a_pod_deleted_after_it_succeeded_is_recorded_and_never_run_again() {
    let h = Harness::new("it-g2").await;
    h.create_job("done", json!({"lease": {"ttlSeconds": 30}}))
        .await;
    h.settle("done", 1).await;
    h.start_pod("done-once-1").await;
    h.sidecar_started("done", "done-once").await;
    h.finish_pod("done-once-1", 0).await;
    h.delete_pod("done-once-1").await;
    assert!(
        h.pod_exists("done-once-1").await,
        "the result finalizer keeps the pod"
    );
    // The controller comes back long after the lease expired.
    h.advance(Duration::from_secs(120));
    h.settle("done", 3).await;
    let lease = h.lease("done", "done-once").await.unwrap();
    let st = state(&lease);
    assert_eq!(
        (lease.epoch, st.status.as_str(), st.exit_code),
        (1, "succeeded", Some(0)),
        "recorded from the deleted pod, at its own epoch"
    );
    assert!(gone(&h, "done-once-1").await, "then the pod may go");
    assert!(
        h.job_pods("done").await.is_empty(),
        "no second attempt ever existed"
    );
    h.cleanup().await;
}

/// G3. A running pod stops renewing (its sidecar is frozen) while its workload goes on. The
/// lease is taken over, but the next attempt's pod is created only once the kubelet reported
/// the old one stopped; until then the new epoch's lease is kept alive and nothing runs twice.
#[tokio::test]
async fn a_stolen_attempt_waits_until_the_old_pod_has_stopped() {
    let h = Harness::new("it-g3").await;
    h.create_job(
        "frozen",
        json!({"maxAttempts": 3, "lease": {"ttlSeconds": 30}}),
    )
    .await;
    h.settle("frozen", 1).await;
    h.bind_pod("frozen-once-1", "node-without-kubelet").await;
    h.start_pod("frozen-once-1").await;
    h.sidecar_started("frozen", "frozen-once").await;
    h.advance(Duration::from_secs(36));
    h.settle("frozen", 2).await;
    let lease = h.lease("frozen", "frozen-once").await.unwrap();
    assert_eq!(lease.epoch, 2, "taken over");
    let old = h.pods().get("frozen-once-1").await.unwrap();
    assert!(
        old.metadata.deletion_timestamp.is_some(),
        "the old pod is being stopped"
    );
    assert_eq!(
        old.metadata.deletion_grace_period_seconds,
        Some(1),
        "with a one-second grace period"
    );
    assert!(
        !h.pod_exists("frozen-once-2").await,
        "no new pod while the old one may still run"
    );
    // The old pod takes longer than a ttl to stop: the new epoch keeps its lease meanwhile.
    for _ in 0..8 {
        h.advance(Duration::from_secs(10));
        h.settle("frozen", 1).await;
    }
    let lease = h.lease("frozen", "frozen-once").await.unwrap();
    assert_eq!(lease.epoch, 2, "80 s waiting, the new epoch kept");
    assert!(!lease.is_expired_at(h.now()));
    assert!(!h.pod_exists("frozen-once-2").await);
    // The kubelet reports the old workload killed: now, and only now, the next attempt starts.
    h.finish_pod("frozen-once-1", 137).await;
    h.settle("frozen", 2).await;
    assert!(h.pod_exists("frozen-once-2").await, "the next attempt");
    assert!(
        released(&h, "frozen-once-1").await,
        "its finalizer released"
    );
    let st = state(&h.lease("frozen", "frozen-once").await.unwrap());
    assert_eq!((st.status.as_str(), st.attempt), ("pending", 2));
    h.cleanup().await;
}

/// G2 across epochs. The old attempt's workload finished successfully just before it was
/// stopped: the run succeeded, and the attempt that took over never starts.
#[tokio::test]
async fn a_success_of_a_taken_over_attempt_ends_the_run() {
    let h = Harness::new("it-g2-late").await;
    h.create_job("late", json!({"lease": {"ttlSeconds": 30}}))
        .await;
    h.settle("late", 1).await;
    h.bind_pod("late-once-1", "node-without-kubelet").await;
    h.start_pod("late-once-1").await;
    h.sidecar_started("late", "late-once").await;
    h.advance(Duration::from_secs(36));
    h.settle("late", 2).await;
    assert_eq!(h.lease("late", "late-once").await.unwrap().epoch, 2);
    h.finish_pod("late-once-1", 0).await;
    h.settle("late", 2).await;
    let lease = h.lease("late", "late-once").await.unwrap();
    assert!(lease.is_released());
    assert_eq!(state(&lease).status.as_str(), "succeeded");
    assert!(!h.pod_exists("late-once-2").await, "never started");
    assert!(released(&h, "late-once-1").await);
    h.cleanup().await;
}

/// A controller outage while the only attempt's pod waited to start. Longer than the ttl: the
/// pending lease (held for the start timeout) is still valid, nothing moves. Longer than that,
/// with the pod removed meanwhile: taking the lease over costs no attempt, since nothing ran.
#[tokio::test]
async fn losing_an_attempt_that_never_started_costs_no_attempt() {
    let h = Harness::new("it-unstarted").await;
    h.create_job(
        "once",
        json!({"maxAttempts": 1, "startTimeoutSeconds": 120, "lease": {"ttlSeconds": 30}}),
    )
    .await;
    h.settle("once", 1).await;
    h.advance(Duration::from_secs(40)); // no controller renewed the pending pod's lease
    h.settle("once", 1).await;
    let lease = h.lease("once", "once-once").await.unwrap();
    assert_eq!(
        (lease.epoch, state(&lease).attempt),
        (1, 1),
        "an outage longer than the ttl takes nothing over"
    );
    assert!(h.pod_exists("once-once-1").await);
    // The pass at 40 s renewed it until 160 s. The pod goes, and no controller runs until
    // 170 s: past the deadline and the allowance.
    h.delete_pod_now("once-once-1").await;
    h.advance(Duration::from_secs(130));
    h.settle("once", 2).await;
    let lease = h.lease("once", "once-once").await.unwrap();
    let st = state(&lease);
    assert_eq!(
        (lease.epoch, st.status.as_str(), st.attempt),
        (2, "pending", 1),
        "still the first attempt, not AttemptsExhausted"
    );
    assert!(h.pod_exists("once-once-2").await);
    h.cleanup().await;
}

/// A pod that never starts (unschedulable here) is not kept alive forever: after
/// `startTimeoutSeconds` the attempt fails with `StartTimeout`, and counts.
#[tokio::test]
async fn a_pod_that_never_starts_fails_its_attempt_after_the_start_timeout() {
    let h = Harness::new("it-start").await;
    h.create_job(
        "stuck",
        json!({"maxAttempts": 2, "startTimeoutSeconds": 60, "lease": {"ttlSeconds": 30}}),
    )
    .await;
    h.settle("stuck", 1).await;
    for _ in 0..5 {
        h.advance(Duration::from_secs(11));
        h.settle("stuck", 1).await;
    }
    assert_eq!(
        h.lease("stuck", "stuck-once").await.unwrap().epoch,
        1,
        "kept alive within the start timeout"
    );
    // The start timeout counts from the scheduler's decision, here that no node fits: the
    // condition's time is the pod's creation, by the API server's clock (which the fake
    // clock started from, a moment before the pod was created).
    h.wait_unschedulable("stuck-once-1").await;
    let due = h.scheduled_at("stuck-once-1").await + chrono::Duration::seconds(60);
    h.clock.set(due.max(h.now() + chrono::Duration::seconds(6)));
    h.settle("stuck", 2).await;
    let lease = h.lease("stuck", "stuck-once").await.unwrap();
    let st = state(&lease);
    assert_eq!((lease.epoch, st.attempt), (2, 2), "the retry");
    assert!(h.pod_exists("stuck-once-2").await);
    assert!(
        !h.live_pod_names("stuck")
            .await
            .contains(&"stuck-once-1".to_string())
    );
    let reasons = h.event_reasons("stuck").await;
    assert!(reasons.iter().any(|r| r == "RunRetrying"), "{reasons:?}");
    // The retry does not start either: out of attempts.
    h.wait_unschedulable("stuck-once-2").await;
    h.advance(Duration::from_secs(61));
    h.settle("stuck", 2).await;
    let st = state(&h.lease("stuck", "stuck-once").await.unwrap());
    assert_eq!(
        (st.status.as_str(), st.reason.as_deref()),
        ("failed", Some("StartTimeout"))
    );
    h.cleanup().await;
}

/// A pod the scheduler has not looked at yet (a backlog; here a scheduler name nobody serves)
/// is not late to start, however long it waits: a new attempt would only queue behind it. Nor
/// is a pod bound to a node whose kubelet has not taken it up (a backlog on the node, or a
/// node that is gone): a new attempt would wait for that pod to stop (G3), which only the same
/// kubelet can report. The start timeout counts from the kubelet's acknowledgement, so the
/// pod then gets the whole timeout for its images and sidecar, and no more.
#[tokio::test]
async fn a_pod_is_timed_out_only_once_the_scheduler_placed_it_and_its_kubelet_took_it_up() {
    let h = Harness::new("it-queued").await;
    h.create_job(
        "queued",
        json!({"maxAttempts": 2, "startTimeoutSeconds": 60, "lease": {"ttlSeconds": 30},
               "template": {"spec": {"schedulerName": "cojob-no-such-scheduler"}}}),
    )
    .await;
    h.settle("queued", 2).await;
    let pod = h.pods().get("queued-once-1").await.unwrap();
    let spec = pod.spec.as_ref().unwrap();
    assert!(
        spec.scheduling_gates.as_ref().is_none_or(|g| g.is_empty()),
        "the holder gate is removed: the pod waits for its scheduler"
    );
    assert!(spec.node_name.is_none());
    let undecided = h.scheduled_condition("queued-once-1").await;
    assert!(
        undecided.is_none() || undecided == Some(("False".into(), Some("SchedulingGated".into()))),
        "no scheduler decided about it: {undecided:?}"
    );
    // Three start timeouts in the scheduler's queue, then three more on a node whose kubelet
    // does not take the pod up: the attempt waits, its lease kept alive.
    let waits_pending = |place: &'static str| {
        let h = &h;
        async move {
            for _ in 0..16 {
                h.advance(Duration::from_secs(11));
                h.settle("queued", 1).await;
            }
            let lease = h.lease("queued", "queued-once").await.unwrap();
            assert_eq!(
                (lease.epoch, state(&lease).status),
                (1, cojob_controller::run::RunPhase::Pending),
                "a pod queued {place} is not timed out"
            );
            assert!(
                h.live_pod_names("queued")
                    .await
                    .contains(&"queued-once-1".to_string())
            );
            assert!(
                lease.deadline > h.now(),
                "the pending lease is renewed meanwhile ({place})"
            );
        }
    };
    waits_pending("for the scheduler").await;
    h.bind_pod("queued-once-1", "node-without-kubelet").await;
    assert_eq!(
        h.scheduled_condition("queued-once-1").await,
        Some(("True".into(), None))
    );
    h.clock.set(chrono::Utc::now());
    waits_pending("for its kubelet").await;
    // Taken up now (the fake clock starts from the acknowledgement's time).
    let taken_up = h.ack_pod("queued-once-1").await;
    h.clock.set(taken_up);
    for _ in 0..5 {
        h.advance(Duration::from_secs(11));
        h.settle("queued", 1).await;
    }
    let lease = h.lease("queued", "queued-once").await.unwrap();
    assert_eq!(
        lease.epoch, 1,
        "55 s after its kubelet took it up, within the start timeout"
    );
    h.advance(Duration::from_secs(6));
    h.settle("queued", 2).await;
    let lease = h.lease("queued", "queued-once").await.unwrap();
    let st = state(&lease);
    assert_eq!(
        (lease.epoch, st.attempt),
        (2, 2),
        "61 s after its kubelet took it up the attempt failed and the retry holds the lease"
    );
    assert!(
        !h.live_pod_names("queued")
            .await
            .contains(&"queued-once-1".to_string()),
        "the late pod is stopped"
    );
    let reasons = h.event_reasons("queued").await;
    assert!(reasons.iter().any(|r| r == "RunRetrying"), "{reasons:?}");
    // The bound pod stops only when its (absent) kubelet says so; then the retry's pod is
    // created, and waits for its scheduler too.
    h.finish_pod("queued-once-1", 137).await;
    h.settle("queued", 2).await;
    assert!(h.pod_exists("queued-once-2").await);
    h.cleanup().await;
}

/// A pod deleted while it runs (the kubelet reports it killed) is a failed attempt, retried
/// under a new epoch once it has stopped.
#[tokio::test]
async fn a_pod_deleted_mid_run_is_retried_once_stopped() {
    let h = Harness::new("it-midrun").await;
    h.create_job(
        "mid",
        json!({"maxAttempts": 2, "lease": {"ttlSeconds": 30}}),
    )
    .await;
    h.settle("mid", 1).await;
    h.bind_pod("mid-once-1", "node-without-kubelet").await;
    h.start_pod("mid-once-1").await;
    h.sidecar_started("mid", "mid-once").await;
    h.delete_pod("mid-once-1").await;
    h.settle("mid", 1).await;
    assert!(!h.pod_exists("mid-once-2").await, "still stopping");
    h.finish_pod("mid-once-1", 143).await;
    h.settle("mid", 2).await;
    let lease = h.lease("mid", "mid-once").await.unwrap();
    assert_eq!((lease.epoch, state(&lease).attempt), (2, 2));
    assert!(h.pod_exists("mid-once-2").await);
    assert!(released(&h, "mid-once-1").await);
    h.cleanup().await;
}

/// An edited schedule applies from the edit: the new expression never fires for ticks that
/// fell between the old cursor and the edit (kubernetes#63371 asks the same of CronJob).
#[tokio::test]
async fn an_edited_schedule_starts_from_the_edit() {
    let h = Harness::new("it-edit").await;
    h.create_job("edit", json!({"schedule": "0 0 1 1 *"})).await;
    h.settle("edit", 1).await;
    h.advance(Duration::from_secs(20 * 60));
    let patch = json!({"spec": {"schedule": "*/5 * * * *"}});
    h.jobs()
        .patch(
            "edit",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    h.settle("edit", 2).await;
    assert!(
        h.decisions("edit").await.is_empty(),
        "no tick of the new schedule before the edit runs"
    );
    let reasons = h.event_reasons("edit").await;
    assert!(
        reasons.iter().any(|r| r == "ScheduleChanged"),
        "{reasons:?}"
    );
    h.advance(Duration::from_secs(5 * 60)); // (now, now + 300 s] holds exactly one tick
    h.settle("edit", 1).await;
    assert_eq!(
        h.decisions("edit").await.len(),
        1,
        "the first tick after the edit"
    );
    h.cleanup().await;
}

/// The bucket lost the job's index and tick claims (a lifecycle rule expired them): the
/// status still holds the cursor, so old ticks are not decided, nor run, again.
#[tokio::test]
async fn losing_the_index_does_not_rerun_old_ticks() {
    let h = Harness::new("it-lost-index").await;
    h.create_job(
        "minutely",
        json!({"schedule": "* * * * *", "catchUp": "All", "lease": {"ttlSeconds": 30}}),
    )
    .await;
    h.settle("minutely", 1).await;
    h.advance(Duration::from_secs(61));
    h.settle("minutely", 1).await;
    // One tick, or two when the job was created just before a minute boundary.
    let ran = h.decisions("minutely").await;
    assert!(!ran.is_empty(), "a tick ran");
    let pods = h.live_pod_names("minutely").await;
    assert!(!pods.is_empty(), "{ran:?}");
    for pod in &pods {
        h.finish_pod(pod, 0).await;
    }
    h.settle("minutely", 2).await;
    // Everything of the job in the bucket expires, and its pods are collected.
    let base = h.keys("minutely").await.base().to_string();
    for key in h.db.store().list(&base).await.unwrap() {
        h.db.store().delete(&key).await.unwrap();
    }
    for pod in &pods {
        h.delete_pod_now(pod).await;
    }
    h.settle("minutely", 2).await;
    assert!(
        h.decisions("minutely").await.is_empty(),
        "no tick decided again"
    );
    assert!(h.job_pods("minutely").await.is_empty(), "nothing ran again");
    h.cleanup().await;
}

/// A replica whose cache still holds a deleted object (same name, another UID now) decides
/// nothing for it: the object is read from the API server before any tick is claimed.
#[tokio::test]
async fn a_stale_cached_object_decides_nothing() {
    let h = Harness::new("it-stale").await;
    h.create_job("stale", json!({"schedule": "* * * * *"}))
        .await;
    h.settle("stale", 1).await;
    let old = h.job("stale").await;
    h.jobs().delete("stale", &Default::default()).await.unwrap();
    h.settle("stale", 2).await;
    h.create_job("stale", json!({"schedule": "0 0 1 1 *"}))
        .await;
    h.advance(Duration::from_secs(61));
    let cx = h.context(&support::Budget::unlimited());
    let _ = cojob_controller::reconcile::reconcile(std::sync::Arc::new(old.clone()), cx).await;
    let keys =
        cojob_controller::layout::JobKeys::new(&h.ns, "stale", &old.metadata.uid.clone().unwrap());
    let ticks =
        h.db.store()
            .list(&format!("{}/ticks", keys.base()))
            .await
            .unwrap();
    assert!(ticks.is_empty(), "claimed for a deleted object: {ticks:?}");
    assert!(h.job_pods("stale").await.is_empty());
    h.cleanup().await;
}

/// The last attempt's lease expires while its pod may still run: instead of recording
/// `AttemptsExhausted` over an unknown outcome, the pod is stopped and its outcome recorded (a
/// success here).
#[tokio::test]
async fn a_silent_last_attempt_is_stopped_and_its_outcome_recorded() {
    let h = Harness::new("it-last").await;
    h.create_job(
        "last",
        json!({"maxAttempts": 1, "lease": {"ttlSeconds": 30}}),
    )
    .await;
    h.settle("last", 1).await;
    h.bind_pod("last-once-1", "node-without-kubelet").await;
    h.start_pod("last-once-1").await;
    h.sidecar_started("last", "last-once").await;
    h.advance(Duration::from_secs(36));
    h.settle("last", 2).await;
    let lease = h.lease("last", "last-once").await.unwrap();
    assert_eq!(
        (lease.epoch, state(&lease).status.as_str()),
        (1, "running"),
        "not failed while the outcome is unknown"
    );
    let pod = h.pods().get("last-once-1").await.unwrap();
    assert!(pod.metadata.deletion_timestamp.is_some(), "being stopped");
    h.finish_pod("last-once-1", 0).await;
    h.settle("last", 2).await;
    let st = state(&h.lease("last", "last-once").await.unwrap());
    assert_eq!((st.status.as_str(), st.exit_code), ("succeeded", Some(0)));
    h.cleanup().await;
}

/// No run starts on an object without the controller's finalizer: when adding it conflicts
/// (the cached copy is stale), the pass stops there and comes back.
#[tokio::test]
async fn no_run_starts_before_the_finalizer_is_on_the_object() {
    let h = Harness::new("it-fin409").await;
    h.create_job("early", json!({})).await;
    let stale = h.job("early").await;
    let label = json!({"metadata": {"labels": {"changed": "yes"}}});
    h.jobs()
        .patch(
            "early",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&label),
        )
        .await
        .unwrap();
    let cx = h.context(&support::Budget::unlimited());
    cojob_controller::reconcile::reconcile(std::sync::Arc::new(stale), cx)
        .await
        .expect("a conflict is not an error");
    assert!(h.job_pods("early").await.is_empty(), "nothing ran");
    assert!(h.decisions("early").await.is_empty(), "nothing decided");
    h.settle("early", 2).await;
    assert_eq!(h.live_pod_names("early").await, ["early-once-1"]);
    h.cleanup().await;
}

/// Deleting a job stops a running workload gracefully and records how it ended: `cancelled`
/// when it was cut short, `succeeded` when it still finished (its effect happened).
#[tokio::test]
async fn a_cancelled_run_records_how_its_workload_ended() {
    let h = Harness::new("it-cancel").await;
    for name in ["cut", "done"] {
        h.create_job(name, json!({"lease": {"ttlSeconds": 30}}))
            .await;
        h.settle(name, 1).await;
        let pod = format!("{name}-once-1");
        h.bind_pod(&pod, "node-without-kubelet").await;
        h.start_pod(&pod).await;
        h.sidecar_started(name, &format!("{name}-once")).await;
    }
    let keys = [("cut", h.keys("cut").await), ("done", h.keys("done").await)];
    for (name, _) in &keys {
        h.jobs().delete(name, &Default::default()).await.unwrap();
        h.settle(name, 1).await;
        let pod = h.pods().get(&format!("{name}-once-1")).await.unwrap();
        assert!(
            pod.metadata.deletion_timestamp.is_some(),
            "{name}: stopping"
        );
    }
    h.finish_pod("cut-once-1", 143).await;
    h.finish_pod("done-once-1", 0).await;
    for (name, keys) in &keys {
        h.settle(name, 3).await;
        let lease =
            h.db.inspect_lease(&keys.lease(&format!("{name}-once")))
                .await
                .unwrap()
                .unwrap();
        let want = if *name == "cut" {
            "cancelled"
        } else {
            "succeeded"
        };
        assert_eq!(state(&lease).status.as_str(), want, "{name}");
        for _ in 0..50 {
            if h.jobs().get_opt(name).await.unwrap().is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            h.jobs().get_opt(name).await.unwrap().is_none(),
            "{name}: gone"
        );
    }
    h.cleanup().await;
}
