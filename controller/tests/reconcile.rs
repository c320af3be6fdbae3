//! Reconcile and the sweeper against a real kube-apiserver and etcd and a real S3 server.
//! The tests play the kubelet (they write pod phases) and move a fake clock.

mod support;

use std::time::Duration;

use cojob_controller::index::Decision;
use kube::ResourceExt;
use serde_json::json;
use support::{Budget, Harness, condition};

fn state(l: &cojob::LeaseInfo) -> cojob_controller::run::RunState {
    cojob_controller::run::RunState::parse(&l.state).expect("a run state")
}

fn status(
    job: &cojob_controller::crd::CoordinatedJob,
) -> cojob_controller::crd::CoordinatedJobStatus {
    job.status.clone().expect("a status")
}

#[tokio::test]
async fn a_one_shot_run_is_dispatched_once_and_released_on_success() {
    let h = Harness::new("it-once").await;
    h.create_job("once", json!({})).await;
    h.settle("once", 2).await;

    assert_eq!(h.live_pod_names("once").await, ["once-once-1"]);
    let lease = h.lease("once", "once-once").await.expect("the run's lease");
    assert_eq!(lease.epoch, 1);
    let holder = h
        .secret_holder("once-once-1")
        .await
        .expect("the holder Secret");
    assert!(
        lease.is_held_by(&holder),
        "the Secret keeps the lease's holder"
    );
    assert_eq!(
        holder,
        h.derived_holder("once", "once-once", 1).await,
        "the holder derived from the run and the epoch under the holder key"
    );
    let name = h.secret_name_of("once-once-1").await.unwrap();
    assert!(name.starts_with("once-once-1-holder-"), "{name}");
    let secret = h.secrets().get(&name).await.unwrap();
    let owner = &secret.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Pod", "once-once-1")
    );
    let st = state(&lease);
    assert_eq!((st.status.as_str(), st.attempt), ("pending", 1));

    let pod = h.pods().get("once-once-1").await.unwrap();
    assert!(
        !cojob_controller::pod::is_gated(&pod),
        "the scheduling gate goes once the holder Secret exists"
    );
    let env: Vec<String> = pod.spec.as_ref().unwrap().containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| e.name.clone())
        .collect();
    for var in [
        "COJOB_RUN_ID",
        "COJOB_EPOCH",
        "COJOB_FIRE_TIME",
        "COJOB_ATTEMPT",
        "COJOB_LEASE_KEY",
    ] {
        assert!(env.contains(&var.to_string()), "{var} in {env:?}");
    }

    h.finish_pod("once-once-1", 0).await;
    h.settle("once", 3).await;
    let lease = h.lease("once", "once-once").await.unwrap();
    assert!(lease.is_released(), "released on success");
    let st = state(&lease);
    assert_eq!((st.status.as_str(), st.exit_code), ("succeeded", Some(0)));
    assert_eq!(
        h.job_pods("once").await.len(),
        1,
        "never spawned again (I2)"
    );
    let s = status(&h.job("once").await);
    assert_eq!((s.counters.succeeded, s.counters.active), (1, 0));
    assert_eq!(s.recent[0].phase, "succeeded");
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.status, "True");
    let reasons = h.event_reasons("once").await;
    for r in ["RunDispatched", "RunSucceeded"] {
        assert!(reasons.iter().any(|x| x == r), "{r} in {reasons:?}");
    }
    // A run's Events are created whole, without kube-runtime's Recorder: about the job,
    // related to the run's pod, from this controller, each its own object.
    let dispatched = h.events_with_reason("once", "RunDispatched").await;
    assert_eq!(dispatched.len(), 1, "{dispatched:?}");
    let e = &dispatched[0];
    assert_eq!(
        e.related.as_ref().and_then(|r| r.name.as_deref()),
        Some("once-once-1")
    );
    assert_eq!(
        e.regarding.as_ref().and_then(|r| r.kind.as_deref()),
        Some("CoordinatedJob")
    );
    assert_eq!(e.reporting_controller.as_deref(), Some("cojob-controller"));
    assert_eq!(e.reporting_instance.as_deref(), Some("integration"));
    assert_eq!(e.type_.as_deref(), Some("Normal"));
    assert!(e.event_time.is_some() && e.series.is_none());
    assert!(e.note.as_deref().is_some_and(|n| n.contains("once-once")));
    assert_eq!(
        h.decisions("once").await,
        [("once".to_string(), Decision::RunId("once-once".into()))]
    );
    h.cleanup().await;
}

#[tokio::test]
async fn a_failed_attempt_is_retried_under_a_new_epoch_until_max_attempts() {
    let h = Harness::new("it-retry").await;
    h.create_job("flaky", json!({"maxAttempts": 2})).await;
    h.settle("flaky", 1).await;
    h.finish_pod("flaky-once-1", 3).await;
    h.settle("flaky", 2).await;
    let lease = h.lease("flaky", "flaky-once").await.unwrap();
    assert_eq!((lease.epoch, state(&lease).attempt), (2, 2));
    assert!(
        h.live_pod_names("flaky")
            .await
            .contains(&"flaky-once-2".to_string())
    );
    h.finish_pod("flaky-once-2", 3).await;
    h.settle("flaky", 3).await;
    let lease = h.lease("flaky", "flaky-once").await.unwrap();
    let st = state(&lease);
    assert!(lease.is_released());
    assert_eq!(
        (st.status.as_str(), st.attempt, st.exit_code),
        ("failed", 2, Some(3))
    );
    let names: Vec<String> = h
        .job_pods("flaky")
        .await
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert!(!names.contains(&"flaky-once-3".to_string()), "{names:?}");
    let s = status(&h.job("flaky").await);
    assert_eq!((s.counters.failed, s.counters.active), (1, 0));
    assert_eq!(
        condition(&h.job("flaky").await, "LastRunFailed"),
        ("True".into(), "RunFailed".into())
    );
    let reasons = h.event_reasons("flaky").await;
    for r in ["RunDispatched", "RunRespawned", "RunFailed"] {
        assert!(reasons.iter().any(|x| x == r), "{r} in {reasons:?}");
    }
    h.cleanup().await;
}

#[tokio::test]
async fn an_expired_lease_is_stolen_the_stale_pod_fenced_and_attempts_bounded() {
    let h = Harness::new("it-steal").await;
    h.create_job(
        "lost",
        json!({"maxAttempts": 2, "lease": {"ttlSeconds": 30}}),
    )
    .await;
    h.settle("lost", 1).await;
    assert_eq!(h.live_pod_names("lost").await, ["lost-once-1"]);
    h.start_pod("lost-once-1").await;
    h.sidecar_started("lost", "lost-once").await;
    // Not expired yet: nothing moves.
    h.advance(Duration::from_secs(29));
    h.settle("lost", 1).await;
    assert_eq!(h.lease("lost", "lost-once").await.unwrap().epoch, 1);
    // Past the deadline, but within the 5 s clock-skew allowance: a node whose clock is a
    // little behind is not taken for lost.
    h.advance(Duration::from_secs(3));
    h.settle("lost", 1).await;
    assert_eq!(h.lease("lost", "lost-once").await.unwrap().epoch, 1);
    // The pod's sidecar never renews (no kubelet): past ttl + allowance the sweeper steals.
    h.advance(Duration::from_secs(3));
    let cx = h.context(&Budget::unlimited());
    for _ in 0..2 {
        h.reconcile_with(&cx, "lost").await.expect("a pass");
    }
    let lease = h.lease("lost", "lost-once").await.unwrap();
    assert_eq!((lease.epoch, state(&lease).attempt), (2, 2));
    // Counted as the takeover of a running attempt: its sidecar went silent.
    let text = cx.metrics.encode();
    assert!(
        text.contains("cojob_takeovers_total{status=\"running\"} 1")
            && !text.contains("status=\"pending\""),
        "{text}"
    );
    assert_eq!(
        h.live_pod_names("lost").await,
        ["lost-once-2"],
        "epoch 1 fenced and deleted"
    );
    h.start_pod("lost-once-2").await;
    h.sidecar_started("lost", "lost-once").await;
    let reasons = h.event_reasons("lost").await;
    assert!(reasons.iter().any(|r| r == "LeaseLost"), "{reasons:?}");
    assert!(reasons.iter().any(|r| r == "RunRespawned"), "{reasons:?}");
    // Out of attempts at the next expiry: failed, and no third pod.
    h.advance(Duration::from_secs(36));
    h.settle("lost", 2).await;
    let lease = h.lease("lost", "lost-once").await.unwrap();
    let st = state(&lease);
    assert_eq!(
        (st.status.as_str(), st.reason.as_deref()),
        ("failed", Some("AttemptsExhausted"))
    );
    assert!(h.live_pod_names("lost").await.is_empty());
    h.cleanup().await;
}

/// Under load the pod watch lags: the cache still shows the attempt running when its lease
/// expires, though the API server already says the workload succeeded. The takeover is
/// confirmed on a fresh read, so the success is recorded and no second attempt is spent.
#[tokio::test]
async fn a_lagging_pod_cache_does_not_turn_an_ended_attempt_into_a_takeover() {
    ended_attempt_behind_a_lagging_cache("it-lag", true).await;
}

/// The same when the watch has not delivered the pod at all: its absence from the cache is
/// not taken for a pod that is gone (before, the fresh read only fed the choice to create the
/// pod again, and the takeover went ahead beside a pod that had succeeded).
#[tokio::test]
async fn a_pod_the_cache_never_saw_is_read_before_a_takeover() {
    ended_attempt_behind_a_lagging_cache("it-unseen", false).await;
}

/// The attempt's workload succeeded and its sidecar's last renewal ran out, while the pod
/// cache shows the pod running (`cached`) or not at all.
async fn ended_attempt_behind_a_lagging_cache(prefix: &str, cached: bool) {
    let h = Harness::new(prefix).await;
    h.create_job(
        "lag",
        json!({"maxAttempts": 2, "lease": {"ttlSeconds": 30}}),
    )
    .await;
    h.settle("lag", 1).await;
    h.start_pod("lag-once-1").await;
    h.sidecar_started("lag", "lag-once").await;
    // The cache's last copy: the pod running, or none.
    let running = h.pods().get("lag-once-1").await.unwrap();
    let cx = h.context(&Budget::unlimited());
    cx.pod_cache.apply(&kube::runtime::watcher::Event::Init);
    if cached {
        cx.pod_cache
            .apply(&kube::runtime::watcher::Event::InitApply(running));
    }
    cx.pod_cache.apply(&kube::runtime::watcher::Event::InitDone);
    // The workload succeeded, the sidecar's last renewal ran out, and the watch has not
    // delivered the pod's end.
    h.finish_pod("lag-once-1", 0).await;
    h.advance(Duration::from_secs(36));
    let phases: Vec<Option<String>> = cx
        .pod_cache
        .job_pods(&h.ns, "lag")
        .unwrap_or_default()
        .iter()
        .map(|p| p.status.as_ref().and_then(|s| s.phase.clone()))
        .collect();
    let lagging = if cached {
        vec![Some("Running".to_string())]
    } else {
        vec![]
    };
    assert_eq!(phases, lagging, "the cache lags");
    for _ in 0..2 {
        h.reconcile_with(&cx, "lag").await.unwrap();
    }
    let lease = h.lease("lag", "lag-once").await.unwrap();
    let st = state(&lease);
    assert_eq!(
        (lease.epoch, st.attempt, st.status.as_str()),
        (1, 1, "succeeded"),
        "recorded from the fresh copy, not taken over"
    );
    assert!(!h.pod_exists("lag-once-2").await, "no second attempt's pod");
    let reasons = h.event_reasons("lag").await;
    assert!(!reasons.iter().any(|r| r == "LeaseLost"), "{reasons:?}");
    h.cleanup().await;
}

/// Under load the kubelet reports a pod's end late: the sidecar was stopped (so the workload
/// ended) and its last renewal ran out while the API server still says the pod runs. The
/// attempt is not taken over; its end is waited for and recorded at its own epoch.
#[tokio::test]
async fn a_stopped_sidecar_whose_pod_ends_late_is_not_taken_over() {
    let h = Harness::new("it-late").await;
    h.create_job(
        "late",
        json!({"maxAttempts": 2, "lease": {"ttlSeconds": 30}}),
    )
    .await;
    h.settle("late", 1).await;
    h.start_pod("late-once-1").await;
    h.sidecar_started("late", "late-once").await;
    h.sidecar_stopped("late", "late-once").await;
    // Past the last renewal's deadline and the skew allowance; the pod still shows Running.
    h.advance(Duration::from_secs(36));
    assert!(
        h.lease("late", "late-once")
            .await
            .unwrap()
            .is_expired_at(h.now())
    );
    h.settle("late", 2).await;
    let lease = h.lease("late", "late-once").await.unwrap();
    let st = state(&lease);
    assert_eq!(
        (lease.epoch, st.attempt, st.status.as_str()),
        (1, 1, "running"),
        "waiting for the pod's end, not taken over"
    );
    assert!(
        !h.pod_exists("late-once-2").await,
        "no second attempt's pod"
    );
    // The kubelet's report arrives.
    h.finish_pod("late-once-1", 0).await;
    h.settle("late", 1).await;
    let lease = h.lease("late", "late-once").await.unwrap();
    let st = state(&lease);
    assert_eq!(
        (lease.epoch, st.attempt, st.status.as_str()),
        (1, 1, "succeeded")
    );
    let reasons = h.event_reasons("late").await;
    assert!(!reasons.iter().any(|r| r == "LeaseLost"), "{reasons:?}");
    h.cleanup().await;
}

/// Two controllers complete the same ended attempt after its lease ran out. The one whose
/// read of the lease predates the other's record must not take a new epoch over the finished
/// run: the result stays recorded at the attempt's own epoch (G2), with no extra write.
#[tokio::test]
async fn a_stale_read_of_a_recorded_result_takes_no_epoch() {
    use cojob_controller::announce::Announcements;
    use cojob_controller::context::JobScope;
    use cojob_controller::index::ActiveRun;
    use cojob_controller::run::PodOutcome;
    use cojob_controller::sweeper::{complete, group_pods};

    let h = Harness::new("it-twice").await;
    h.create_job(
        "twice",
        json!({"maxAttempts": 3, "lease": {"ttlSeconds": 30}}),
    )
    .await;
    h.settle("twice", 1).await;
    h.start_pod("twice-once-1").await;
    h.sidecar_started("twice", "twice-once").await;
    h.finish_pod("twice-once-1", 0).await;
    // The controllers were away longer than the sidecar's last renewal.
    h.advance(Duration::from_secs(40));
    let stale = h.lease("twice", "twice-once").await.unwrap();
    assert!(stale.is_expired_at(h.now()) && !stale.is_released());
    // Controller A records the success.
    h.settle("twice", 1).await;
    let recorded = h.lease("twice", "twice-once").await.unwrap();
    assert_eq!(
        (recorded.epoch, state(&recorded).status.as_str()),
        (1, "succeeded")
    );
    assert!(recorded.is_released());
    // Controller B completes the same attempt from its earlier read.
    let cx = h.context(&Budget::unlimited());
    let job = h.job("twice").await;
    let scope = JobScope::new(&cx, &job).unwrap();
    let run = ActiveRun {
        run_id: "twice-once".into(),
        fire_time: None,
        trigger: None,
        backfill: None,
    };
    let pods = group_pods(&scope, h.job_pods("twice").await)
        .remove("twice-once")
        .unwrap_or_default();
    let outcome = PodOutcome {
        succeeded: true,
        exit_code: Some(0),
        reason: None,
    };
    let mut said = Announcements::default();
    complete::complete(&scope, &run, &stale, &outcome, &pods, &mut said)
        .await
        .unwrap();
    let after = h.lease("twice", "twice-once").await.unwrap();
    assert_eq!(
        (after.epoch, state(&after).status.as_str(), after.version),
        (1, "succeeded", recorded.version),
        "B wrote nothing"
    );
    h.cleanup().await;
}

/// A pod that has not started (unscheduled, pulling its image) cannot renew through its
/// sidecar; the controller keeps its lease, so a slow start costs no attempt.
#[tokio::test]
async fn a_pod_pending_longer_than_the_ttl_keeps_its_lease() {
    let h = Harness::new("it-pending").await;
    h.create_job(
        "slow",
        json!({"maxAttempts": 2, "lease": {"ttlSeconds": 30}}),
    )
    .await;
    h.settle("slow", 1).await;
    for _ in 0..6 {
        h.advance(Duration::from_secs(12));
        h.settle("slow", 1).await;
    }
    let lease = h.lease("slow", "slow-once").await.unwrap();
    assert_eq!(
        (lease.epoch, state(&lease).attempt),
        (1, 1),
        "72 s pending, no attempt spent"
    );
    assert!(!lease.is_expired_at(h.now()));
    assert_eq!(h.live_pod_names("slow").await, ["slow-once-1"]);
    h.cleanup().await;
}

/// Passes may come late (a queue behind thousands of ticks, an overloaded API server): a
/// pending attempt's lease holds for the start timeout, not the ttl, so a pass that comes
/// after several ttls finds its attempt still pending instead of taking it over.
#[tokio::test]
async fn a_pass_later_than_the_ttl_does_not_take_a_pending_attempt_over() {
    let h = Harness::new("it-late-pass").await;
    h.create_job(
        "late",
        json!({"maxAttempts": 3, "lease": {"ttlSeconds": 20}, "startTimeoutSeconds": 300}),
    )
    .await;
    h.settle("late", 1).await;
    let lease = h.lease("late", "late-once").await.unwrap();
    assert!(
        lease.deadline >= h.now() + chrono::Duration::seconds(290),
        "acquired for the start timeout: {lease:?}"
    );
    // No pass for 4 ttls plus the allowance, then one.
    h.advance(Duration::from_secs(85));
    h.settle("late", 1).await;
    let lease = h.lease("late", "late-once").await.unwrap();
    assert_eq!(
        (lease.epoch, state(&lease).attempt),
        (1, 1),
        "no takeover of an attempt that never started"
    );
    assert_eq!(h.live_pod_names("late").await, ["late-once-1"]);
    // Once its sidecar attached, the ttl applies again: the sidecar's renewal wrote it.
    h.start_pod("late-once-1").await;
    h.sidecar_started("late", "late-once").await;
    let lease = h.lease("late", "late-once").await.unwrap();
    assert!(
        lease.deadline <= h.now() + chrono::Duration::seconds(21),
        "the sidecar's ttl: {lease:?}"
    );
    // Never started past the start timeout: the attempt fails, not a takeover.
    h.cleanup().await;
}

/// A pending attempt's lease is the controller's to renew: when no pass came for the whole
/// start timeout (a controller down, or far behind), it is taken over, and counted apart from
/// a silent sidecar's, since it says the controller, not a node, fell behind.
#[tokio::test]
async fn a_pending_attempt_no_pass_renewed_is_taken_over_and_counted_as_pending() {
    let h = Harness::new("it-pending-lost").await;
    h.create_job(
        "queued",
        json!({"maxAttempts": 3, "lease": {"ttlSeconds": 20}, "startTimeoutSeconds": 60}),
    )
    .await;
    h.settle("queued", 1).await;
    // Placed on a node whose kubelet never takes it up: queued, so no start timeout runs.
    h.bind_pod("queued-once-1", "node-without-kubelet").await;
    h.advance(Duration::from_secs(66));
    let cx = h.context(&Budget::unlimited());
    for _ in 0..2 {
        h.reconcile_with(&cx, "queued").await.expect("a pass");
    }
    let lease = h.lease("queued", "queued-once").await.unwrap();
    assert_eq!(
        (lease.epoch, state(&lease).attempt),
        (2, 1),
        "a takeover of a pod that never started costs no attempt: {lease:?}"
    );
    let text = cx.metrics.encode();
    assert!(
        text.contains("cojob_takeovers_total{status=\"pending\"} 1")
            && !text.contains("status=\"running\""),
        "{text}"
    );
    let lost = h.events_with_reason("queued", "LeaseLost").await;
    let notes: Vec<_> = lost.iter().filter_map(|e| e.note.as_deref()).collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("before its workload started")),
        "{notes:?}"
    );
    h.cleanup().await;
}

#[tokio::test]
async fn ticks_get_one_decision_each_with_catch_up_forbid_and_suspend() {
    let h = Harness::new("it-ticks").await;
    h.create_job(
        "tick",
        json!({"schedule": "*/10 * * * * *", "catchUp": "Latest", "concurrencyPolicy": "Forbid"}),
    )
    .await;
    h.settle("tick", 1).await; // nothing due yet
    // 35 s later: three or four ticks are due; Latest runs the newest and misses the others.
    h.advance(Duration::from_secs(35));
    h.settle("tick", 2).await;
    let decisions = h.decisions("tick").await;
    let runs: Vec<_> = decisions
        .iter()
        .filter(|(_, d)| matches!(d, Decision::RunId(_)))
        .collect();
    let missed = decisions
        .iter()
        .filter(|(_, d)| matches!(d, Decision::Missed(r) if r == "Superseded"))
        .count();
    assert_eq!(runs.len(), 1, "{decisions:?}");
    assert!(missed >= 2, "{decisions:?}");
    assert_eq!(
        &decisions.last().unwrap().1,
        &runs[0].1,
        "the newest tick runs"
    );
    // The run is still active at the next tick: Forbid skips it.
    h.advance(Duration::from_secs(10));
    h.settle("tick", 1).await;
    let last = h.decisions("tick").await.last().cloned().unwrap();
    assert_eq!(last.1, Decision::Skipped("ConcurrencyForbid".into()));
    // Suspended: the next tick is skipped as Suspended, and no pod is made.
    let pods_before = h.job_pods("tick").await.len();
    let patch = json!({"spec": {"suspend": true}});
    h.jobs()
        .patch(
            "tick",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    h.advance(Duration::from_secs(10));
    h.settle("tick", 2).await;
    let last = h.decisions("tick").await.last().cloned().unwrap();
    assert_eq!(last.1, Decision::Skipped("Suspended".into()));
    assert_eq!(h.job_pods("tick").await.len(), pods_before);
    let s = status(&h.job("tick").await);
    assert_eq!(s.counters.skipped, 2);
    assert!(s.counters.missed >= 2);
    assert!(s.last_schedule_time.is_some() && s.next_schedule_time.is_some());
    let reasons = h.event_reasons("tick").await;
    for r in ["RunMissed", "RunSkipped", "RunDispatched"] {
        assert!(reasons.iter().any(|x| x == r), "{r} in {reasons:?}");
    }
    h.cleanup().await;
}

/// A Forbid job whose run outlasts several ticks: every tick is decided `Skipped` in the bucket
/// and counted, but one `RunSkipped` Event is written, not one per tick.
#[tokio::test]
async fn skipped_ticks_are_announced_once_per_interval_not_once_per_tick() {
    let h = Harness::new("it-skipev").await;
    h.create_job(
        "busy",
        json!({"schedule": "*/10 * * * * *", "concurrencyPolicy": "Forbid",
               "lease": {"ttlSeconds": 120}, "startTimeoutSeconds": 600}),
    )
    .await;
    let cx = h.context(&Budget::unlimited());
    h.reconcile_with(&cx, "busy").await.unwrap();
    // One tick per pass (the first may fall before the object's creation second): the first
    // run, then skips while it stays active.
    let mut skipped = 0;
    for _ in 0..8 {
        h.advance(Duration::from_secs(10));
        h.reconcile_with(&cx, "busy").await.unwrap();
        skipped = h
            .decisions("busy")
            .await
            .into_iter()
            .filter(|(_, d)| *d == Decision::Skipped("ConcurrencyForbid".into()))
            .count();
        if skipped == 3 {
            break;
        }
    }
    assert_eq!(skipped, 3);
    assert_eq!(status(&h.job("busy").await).counters.skipped, 3);
    // One publication: one Event object, not a series (kube's recorder would fold repeated
    // publications into one object and count them in `series`).
    let skips = h.events_with_reason("busy", "RunSkipped").await;
    assert_eq!(skips.len(), 1, "{skips:?}");
    assert!(
        skips[0].series.is_none(),
        "published more than once: {:?}",
        skips[0].series
    );
    assert!(
        skips[0]
            .note
            .as_deref()
            .is_some_and(|n| n.contains("skipped: ConcurrencyForbid")),
        "{:?}",
        skips[0].note
    );
    h.cleanup().await;
}

#[tokio::test]
async fn a_deadline_turns_a_late_tick_into_a_miss() {
    let h = Harness::new("it-deadline").await;
    h.create_job(
        "late",
        json!({"schedule": "*/10 * * * * *", "catchUp": "All", "startingDeadlineSeconds": 15}),
    )
    .await;
    h.advance(Duration::from_secs(41));
    h.settle("late", 1).await;
    let decisions = h.decisions("late").await;
    let deadline = decisions
        .iter()
        .filter(|(_, d)| matches!(d, Decision::Missed(r) if r == "DeadlineExceeded"))
        .count();
    let runs = decisions
        .iter()
        .filter(|(_, d)| matches!(d, Decision::RunId(_)))
        .count();
    assert!(deadline >= 2, "{decisions:?}");
    assert!(
        (1..=2).contains(&runs),
        "only ticks within 15 s run: {decisions:?}"
    );
    h.cleanup().await;
}

#[tokio::test]
async fn replace_cancels_the_active_run_for_the_new_tick() {
    let h = Harness::new("it-replace").await;
    h.create_job(
        "rep",
        json!({"schedule": "*/10 * * * * *", "concurrencyPolicy": "Replace"}),
    )
    .await;
    h.advance(Duration::from_secs(11));
    h.settle("rep", 1).await;
    let first = h.live_pod_names("rep").await;
    assert_eq!(first.len(), 1);
    h.advance(Duration::from_secs(10));
    h.settle("rep", 2).await;
    let live = h.live_pod_names("rep").await;
    assert_eq!(live.len(), 1, "{live:?}");
    assert_ne!(live, first);
    let old_run = first[0].trim_end_matches("-1");
    let old = h.lease("rep", old_run).await.unwrap();
    assert_eq!(state(&old).status.as_str(), "cancelled");
    assert!(old.is_released());
    let s = status(&h.job("rep").await);
    assert_eq!((s.counters.cancelled, s.counters.active), (1, 1));
    h.cleanup().await;
}

/// I5: a crash after any number of mutating requests (bucket or API server), followed by a
/// healthy controller, converges to the same state as no crash at all.
#[tokio::test]
async fn a_crash_between_any_two_steps_converges() {
    let h = Harness::new("it-crash").await;
    let mut crashed_somewhere = 0;
    for n in 0..14 {
        let name = format!("c{n}");
        h.create_job(&name, json!({})).await;
        // Dispatch, crashing after n mutating requests.
        let budget = Budget::crash_after(n);
        let cx = h.context(&budget);
        let _ = h.reconcile_with(&cx, &name).await;
        if budget.crashed() {
            crashed_somewhere += 1;
        }
        h.settle(&name, 3).await;
        let pod = format!("{name}-once-1");
        assert_eq!(
            h.live_pod_names(&name).await,
            vec![pod.clone()],
            "crash after {n}: one pod, epoch 1"
        );
        let lease = h.lease(&name, &format!("{name}-once")).await.unwrap();
        assert_eq!(lease.epoch, 1, "crash after {n}: one epoch");
        let holder = h.secret_holder(&pod).await.expect("the holder Secret");
        assert!(
            lease.is_held_by(&holder),
            "crash after {n}: the Secret holds the lease's holder"
        );
        let secret_name = h.secret_name_of(&pod).await.unwrap();
        let secret = h.secrets().get(&secret_name).await.unwrap();
        assert_eq!(
            secret.owner_references()[0].kind,
            "Pod",
            "crash after {n}: the pod owns the Secret"
        );

        // Completion, crashing after n mutating requests.
        h.finish_pod(&pod, 0).await;
        let budget = Budget::crash_after(n);
        let cx = h.context(&budget);
        let _ = h.reconcile_with(&cx, &name).await;
        h.settle(&name, 3).await;
        let lease = h.lease(&name, &format!("{name}-once")).await.unwrap();
        assert!(lease.is_released(), "crash after {n}: released");
        assert_eq!(
            state(&lease).status.as_str(),
            "succeeded",
            "crash after {n}"
        );
        assert_eq!(
            h.job_pods(&name).await.len(),
            1,
            "crash after {n}: never respawned"
        );
        let s = status(&h.job(&name).await);
        assert_eq!(
            (s.counters.succeeded, s.counters.active),
            (1, 0),
            "crash after {n}: counted once"
        );
    }
    assert!(
        crashed_somewhere >= 8,
        "the budgets must cut the pass at many points: {crashed_somewhere}"
    );
    h.cleanup().await;
}

/// A manual run per trigger key: the key's claim decides it once (a repeated request starts
/// nothing, even after the run ended), it goes through `concurrencyPolicy`, not `suspend`, and
/// the annotation is removed once recorded.
#[tokio::test]
async fn a_trigger_runs_once_per_key_through_the_concurrency_policy() {
    let h = Harness::new("it-trigger").await;
    h.create_job(
        "man",
        json!({"schedule": "0 0 1 1 *", "concurrencyPolicy": "Forbid", "suspend": true}),
    )
    .await;
    h.settle("man", 1).await;
    assert!(h.job_pods("man").await.is_empty(), "nothing is due");
    h.trigger("man", "deploy-1").await;
    h.settle("man", 2).await;
    let run = cojob_controller::layout::trigger_run_id("man", "deploy-1");
    let pod = format!("{run}-1");
    assert_eq!(
        h.live_pod_names("man").await,
        vec![pod.clone()],
        "suspend does not stop it"
    );
    assert!(
        h.pending_triggers("man").await.is_empty(),
        "the annotation is removed"
    );
    let keys = h.keys("man").await;
    let (claim, _) =
        h.db.store()
            .get(&keys.trigger("deploy-1"))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(
        serde_json::from_slice::<Decision>(&claim).unwrap(),
        Decision::RunId(run.clone())
    );
    let created = h.pods().get(&pod).await.unwrap();
    let env = created.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap_or_default();
    assert!(
        env.iter()
            .any(|e| e.name == "COJOB_TRIGGER" && e.value.as_deref() == Some("deploy-1")),
        "{env:?}"
    );
    let s = status(&h.job("man").await);
    assert_eq!(s.active[0].tick, "trigger/deploy-1");
    assert!(
        h.event_reasons("man")
            .await
            .iter()
            .any(|r| r == "RunTriggered")
    );

    // The same key again, while the run is active: nothing new.
    h.trigger("man", "deploy-1").await;
    h.settle("man", 2).await;
    assert_eq!(h.job_pods("man").await.len(), 1);
    assert!(h.pending_triggers("man").await.is_empty());
    // Another key while it runs: Forbid skips it.
    h.trigger("man", "deploy-2").await;
    h.settle("man", 2).await;
    let (claim, _) =
        h.db.store()
            .get(&keys.trigger("deploy-2"))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(
        serde_json::from_slice::<Decision>(&claim).unwrap(),
        Decision::Skipped("ConcurrencyForbid".into())
    );
    assert_eq!(h.job_pods("man").await.len(), 1);

    // The run ends; asking with its key again still starts nothing, a new key runs.
    h.finish_pod(&pod, 0).await;
    h.settle("man", 2).await;
    h.trigger("man", "deploy-1").await;
    h.settle("man", 2).await;
    assert_eq!(h.job_pods("man").await.len(), 1, "deploy-1 ran once");
    h.trigger("man", "deploy-3").await;
    h.settle("man", 2).await;
    let third = cojob_controller::layout::trigger_run_id("man", "deploy-3");
    let names: Vec<String> = h
        .job_pods("man")
        .await
        .iter()
        .map(|p| p.name_any())
        .collect();
    let mut expected = vec![pod.clone(), format!("{third}-1")];
    expected.sort();
    assert_eq!(names, expected, "the finished run's pod and the new one");
    let s = status(&h.job("man").await);
    assert_eq!(
        (s.counters.succeeded, s.counters.skipped, s.counters.active),
        (1, 1, 1)
    );
    h.cleanup().await;
}

/// `cancel.cojob.dev/<run>` cancels that run, as a deletion would, and is removed once the run
/// ended; a request for a run that is not active is removed with a Warning.
#[tokio::test]
async fn a_cancel_request_cancels_the_run_and_is_then_removed() {
    let h = Harness::new("it-cancel").await;
    h.create_job("can", json!({"schedule": "0 0 1 1 *"})).await;
    h.settle("can", 1).await;
    h.trigger("can", "k").await;
    h.settle("can", 1).await;
    let run = cojob_controller::layout::trigger_run_id("can", "k");
    assert_eq!(h.live_pod_names("can").await, vec![format!("{run}-1")]);
    h.request_cancel("can", &run).await;
    h.settle("can", 3).await;
    let lease = h.lease("can", &run).await.unwrap();
    assert_eq!(state(&lease).status.as_str(), "cancelled");
    assert!(
        h.live_pod_names("can").await.is_empty(),
        "its pod is stopped"
    );
    let annotations = h.job("can").await.annotations().clone();
    assert!(
        !annotations
            .keys()
            .any(|k| k.starts_with("cancel.cojob.dev/")),
        "{annotations:?}"
    );
    let s = status(&h.job("can").await);
    assert_eq!((s.counters.cancelled, s.counters.active), (1, 0));
    h.request_cancel("can", "can-m000000000000").await;
    h.settle("can", 1).await;
    assert!(h.job("can").await.annotations().is_empty());
    let reasons = h.event_reasons("can").await;
    for r in ["CancelDone", "CancelIgnored"] {
        assert!(reasons.iter().any(|x| x == r), "{r} in {reasons:?}");
    }
    h.cleanup().await;
}

/// A backfill runs each undecided tick of its range once, at most `parallelism` at a time,
/// keeps the decision of every tick decided before, survives crashes at any point, and ends
/// with its annotation removed and its progress stored.
#[tokio::test]
async fn a_backfill_runs_each_undecided_tick_once_and_keeps_decided_ones() {
    let h = Harness::new("it-backfill").await;
    let created = h.now();
    h.create_job(
        "bf",
        json!({"schedule": "*/10 * * * * *", "catchUp": "Latest"}),
    )
    .await;
    h.settle("bf", 1).await;
    h.advance(Duration::from_secs(35));
    h.settle("bf", 2).await;
    // The schedule decided its ticks since creation: one run, the others superseded.
    let before: std::collections::BTreeMap<String, Decision> =
        h.decisions("bf").await.into_iter().collect();
    assert!(before.len() >= 3, "{before:?}");
    for pod in h.live_pod_names("bf").await {
        h.finish_pod(&pod, 0).await;
    }
    h.settle("bf", 1).await;

    let from = created - chrono::Duration::seconds(60);
    let to = created + chrono::Duration::seconds(25);
    let schedule = cojob_controller::schedule::Schedule::parse("*/10 * * * * *", None).unwrap();
    let range = schedule.ticks_between(from - chrono::Duration::microseconds(1), to, 100);
    let request = cojob_controller::backfill::BackfillRequest {
        from,
        to,
        parallelism: 2,
    };
    h.annotate("bf", "backfill.cojob.dev/b1", &request.to_value())
        .await;
    let mut crashed = 0;
    for i in 0..40 {
        // A crash somewhere in every other pass; the healthy pass after it converges.
        let budget = support::Budget::crash_after(i % 7);
        let _ = h.reconcile_with(&h.context(&budget), "bf").await;
        crashed += usize::from(budget.crashed());
        h.settle("bf", 1).await;
        let running: Vec<String> = h
            .job_pods("bf")
            .await
            .into_iter()
            .filter(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                !matches!(phase, Some("Succeeded" | "Failed"))
            })
            .map(|p| p.name_any())
            .collect();
        assert!(running.len() <= 2, "parallelism 2: {running:?}");
        for pod in running {
            h.finish_pod(&pod, 0).await;
        }
        if !h
            .job("bf")
            .await
            .annotations()
            .contains_key("backfill.cojob.dev/b1")
        {
            break;
        }
    }
    assert!(crashed > 3, "{crashed}");
    assert!(
        !h.job("bf")
            .await
            .annotations()
            .contains_key("backfill.cojob.dev/b1"),
        "the backfill ended"
    );
    let after: std::collections::BTreeMap<String, Decision> =
        h.decisions("bf").await.into_iter().collect();
    let mut ran = 0;
    for t in &range {
        let key = cojob::json::format_time(*t);
        let decision = after.get(&key).unwrap_or_else(|| panic!("{key} decided"));
        match before.get(&key) {
            Some(old) => assert_eq!(decision, old, "{key}: decided before, kept"),
            None => {
                let run = cojob_controller::layout::run_id("bf", Some(*t));
                assert_eq!(decision, &Decision::RunId(run.clone()), "{key}");
                let lease = h.lease("bf", &run).await.expect("it ran");
                assert_eq!(
                    (lease.epoch, state(&lease).status.as_str()),
                    (1, "succeeded"),
                    "{key}"
                );
                ran += 1;
            }
        }
    }
    assert!(ran >= 5, "ticks before the job existed ran: {ran}");
    // Every run succeeded once, at epoch 1 (above), and was counted once.
    let runs_started = after
        .values()
        .filter(|d| matches!(d, Decision::RunId(_)))
        .count();
    let s = status(&h.job("bf").await);
    assert_eq!(
        (s.counters.succeeded, s.counters.active),
        (runs_started as i64, 0)
    );
    let pods = h.job_pods("bf").await.len();
    let keys = h.keys("bf").await;
    let progress =
        h.db.doc::<cojob_controller::backfill::BackfillProgress>(&keys.backfill("b1"))
            .get()
            .await
            .unwrap()
            .unwrap()
            .0;
    assert!(progress.done);
    assert_eq!(
        progress.ran + progress.already_decided,
        range.len() as u64,
        "{progress:?}"
    );
    assert!(
        h.event_reasons("bf")
            .await
            .iter()
            .any(|r| r == "BackfillDone")
    );

    // Asked again: nothing runs again.
    h.annotate("bf", "backfill.cojob.dev/b1", &request.to_value())
        .await;
    h.settle("bf", 2).await;
    assert_eq!(h.job_pods("bf").await.len(), pods);
    assert_eq!(status(&h.job("bf").await).counters.active, 0);
    assert!(
        !h.job("bf")
            .await
            .annotations()
            .contains_key("backfill.cojob.dev/b1")
    );
    // A bad request is refused with a Warning and removed.
    h.annotate(
        "bf",
        "backfill.cojob.dev/bad",
        r#"{"from":"2026-01-02T00:00:00Z","to":"2026-01-01T00:00:00Z"}"#,
    )
    .await;
    h.settle("bf", 1).await;
    assert!(
        !h.job("bf")
            .await
            .annotations()
            .contains_key("backfill.cojob.dev/bad")
    );
    assert!(
        h.event_reasons("bf")
            .await
            .iter()
            .any(|r| r == "InvalidBackfill")
    );
    h.cleanup().await;
}

/// A crash anywhere while a trigger is decided, recorded and tidied converges on one run.
#[tokio::test]
async fn a_crash_while_deciding_a_trigger_converges() {
    let h = Harness::new("it-trigger-crash").await;
    let mut crashed_somewhere = 0;
    for n in 0..8 {
        let name = format!("t{n}");
        h.create_job(&name, json!({"schedule": "0 0 1 1 *"})).await;
        h.settle(&name, 1).await;
        h.trigger(&name, "k").await;
        let budget = Budget::crash_after(n);
        let cx = h.context(&budget);
        let _ = h.reconcile_with(&cx, &name).await;
        if budget.crashed() {
            crashed_somewhere += 1;
        }
        h.trigger(&name, "k").await; // asked again meanwhile
        h.settle(&name, 3).await;
        let run = cojob_controller::layout::trigger_run_id(&name, "k");
        assert_eq!(
            h.live_pod_names(&name).await,
            vec![format!("{run}-1")],
            "crash after {n}: one pod, epoch 1"
        );
        assert!(
            h.pending_triggers(&name).await.is_empty(),
            "crash after {n}"
        );
        let s = status(&h.job(&name).await);
        assert_eq!(s.counters.active, 1, "crash after {n}");
    }
    assert!(crashed_somewhere >= 3, "{crashed_somewhere}");
    h.cleanup().await;
}

/// I1 and I3 with two controllers reconciling the same job at the same instants.
#[tokio::test]
async fn two_controllers_at_once_keep_one_decision_and_one_epoch_per_run() {
    let h = Harness::new("it-two").await;
    h.create_job(
        "dup",
        json!({"schedule": "*/5 * * * * *", "concurrencyPolicy": "Allow"}),
    )
    .await;
    let (a, b) = (
        h.context(&Budget::unlimited()),
        h.context(&Budget::unlimited()),
    );
    for step in 0..12 {
        h.advance(Duration::from_secs(5));
        let (ra, rb) = tokio::join!(h.reconcile_with(&a, "dup"), h.reconcile_with(&b, "dup"));
        ra.unwrap_or_else(|e| panic!("controller A, step {step}: {e}"));
        rb.unwrap_or_else(|e| panic!("controller B, step {step}: {e}"));
        // Finish every pod that exists, so runs complete while both controllers race.
        for pod in h.job_pods("dup").await {
            let ended = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded");
            if !ended && step % 2 == 0 {
                h.finish_pod(&pod.name_any(), 0).await;
            }
        }
    }
    let (ra, rb) = tokio::join!(h.reconcile_with(&a, "dup"), h.reconcile_with(&b, "dup"));
    ra.unwrap();
    rb.unwrap();
    let decisions = h.decisions("dup").await;
    let runs: Vec<String> = decisions
        .iter()
        .filter_map(|(_, d)| match d {
            Decision::RunId(r) => Some(r.clone()),
            _ => None,
        })
        .collect();
    assert!(runs.len() >= 10, "{decisions:?}");
    for run in &runs {
        let lease = h.lease("dup", run).await.expect("a lease per run");
        assert_eq!(lease.epoch, 1, "run {run} was acquired once");
    }
    let mut by_run = std::collections::BTreeMap::<String, usize>::new();
    for pod in h.job_pods("dup").await {
        *by_run
            .entry(pod.labels()["cojob.dev/run"].clone())
            .or_default() += 1;
        assert_eq!(pod.labels()["cojob.dev/epoch"], "1");
    }
    assert!(
        by_run.values().all(|n| *n == 1),
        "one pod per run: {by_run:?}"
    );
    let s = status(&h.job("dup").await);
    assert_eq!(
        (s.counters.succeeded + s.counters.active) as usize,
        runs.len(),
        "every run counted exactly once: {:?}",
        s.counters
    );
    h.cleanup().await;
}

#[tokio::test]
async fn deleting_the_job_cancels_active_runs_through_the_finalizer() {
    let h = Harness::new("it-final").await;
    h.create_job("bye", json!({})).await;
    h.settle("bye", 1).await;
    let job = h.job("bye").await;
    assert!(
        job.finalizers()
            .iter()
            .any(|f| f == "cojob.dev/cancel-runs")
    );
    let keys = h.keys("bye").await;
    h.jobs().delete("bye", &Default::default()).await.unwrap();
    h.settle("bye", 1).await;
    let lease =
        h.db.inspect_lease(&keys.lease("bye-once"))
            .await
            .unwrap()
            .unwrap();
    let st = state(&lease);
    assert_eq!(st.status.as_str(), "cancelled");
    assert!(st.cancel_requested && lease.is_released());
    for _ in 0..50 {
        if h.jobs().get_opt("bye").await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        h.jobs().get_opt("bye").await.unwrap().is_none(),
        "the finalizer was removed"
    );
    assert!(
        h.live_pod_names("bye").await.is_empty(),
        "the run's pod was stopped"
    );
    h.cleanup().await;
}

#[tokio::test]
async fn a_deleted_job_releases_the_pods_its_cache_has_not_seen() {
    let h = Harness::new("it-unseen").await;
    h.create_job("bye", json!({})).await;
    h.settle("bye", 1).await;
    assert_eq!(h.live_pod_names("bye").await, ["bye-once-1"]);
    // A watch that lags: the cache has listed, and has not seen the run's pod.
    let cx = h.context(&Budget::unlimited());
    cx.pod_cache.apply(&kube::runtime::watcher::Event::Init);
    cx.pod_cache.apply(&kube::runtime::watcher::Event::InitDone);
    assert_eq!(cx.pod_cache.job_pods(&h.ns, "bye").unwrap().len(), 0);
    h.jobs().delete("bye", &Default::default()).await.unwrap();
    for _ in 0..50 {
        if h.jobs().get_opt("bye").await.unwrap().is_none() {
            break;
        }
        h.reconcile_with(&cx, "bye").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        h.jobs().get_opt("bye").await.unwrap().is_none(),
        "the job's finalizer was removed"
    );
    // The pod went too: its result finalizer was released before the job's, so nothing is
    // left that no one would release.
    let pod = h.pods().get_opt("bye-once-1").await.unwrap();
    assert!(
        pod.as_ref().is_none_or(|p| p.finalizers().is_empty()),
        "the pod still holds {:?}",
        pod.map(|p| p.finalizers().to_vec())
    );
    h.cleanup().await;
}

#[tokio::test]
async fn a_recreated_job_starts_afresh() {
    let h = Harness::new("it-again").await;
    h.create_job("again", json!({})).await;
    h.settle("again", 1).await;
    h.finish_pod("again-once-1", 0).await;
    h.settle("again", 2).await;
    let first = h.keys("again").await;
    h.jobs().delete("again", &Default::default()).await.unwrap();
    h.settle("again", 1).await;
    h.delete_pod_now("again-once-1").await;
    h.create_job("again", json!({})).await;
    // The old object's holder Secret (same name) goes with the garbage collector, in its time;
    // until then the dispatch waits.
    for _ in 0..50 {
        h.settle("again", 1).await;
        if !h.live_pod_names("again").await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let second = h.keys("again").await;
    assert_ne!(first, second);
    assert_eq!(h.live_pod_names("again").await, ["again-once-1"]);
    let lease = h.lease("again", "again-once").await.unwrap();
    assert_eq!(state(&lease).status.as_str(), "pending");
    h.cleanup().await;
}

#[tokio::test]
async fn an_unparseable_schedule_is_a_condition_and_an_event_not_a_crash() {
    let h = Harness::new("it-invalid").await;
    // Five fields, so the schema admits it; cron does not.
    h.create_job("bad", json!({"schedule": "61 * * * *"})).await;
    h.settle("bad", 2).await;
    let s = status(&h.job("bad").await);
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "InvalidSpec")
    );
    assert!(ready.message.contains("61"), "{}", ready.message);
    let job = h.job("bad").await;
    assert_eq!(
        condition(&job, "ScheduleValid"),
        ("False".into(), "InvalidSpec".into())
    );
    let reasons = h.event_reasons("bad").await;
    assert_eq!(
        reasons.iter().filter(|r| *r == "InvalidSpec").count(),
        1,
        "one Event per transition: {reasons:?}"
    );
    // Fixed: valid again.
    let patch = json!({"spec": {"schedule": "1 * * * *"}});
    h.jobs()
        .patch(
            "bad",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    h.settle("bad", 1).await;
    let job = h.job("bad").await;
    assert_eq!(
        condition(&job, "ScheduleValid"),
        ("True".into(), "Valid".into())
    );
    assert_eq!(condition(&job, "Ready").0, "True");
    assert!(h.job_pods("bad").await.is_empty());
    h.cleanup().await;
}

#[tokio::test]
async fn an_unreachable_store_is_a_condition_and_an_event() {
    let h = Harness::new("it-down").await;
    h.create_job("dark", json!({})).await;
    let cx = h.context(&Budget::store_down());
    let err = h
        .reconcile_with(&cx, "dark")
        .await
        .expect_err("the store is down");
    assert!(err.is_store(), "{err}");
    // No hot loop: an exponential backoff with jitter, up to a third of the lease ttl (here
    // 300 s) or 60 s.
    let job = std::sync::Arc::new(h.job("dark").await);
    let delays: Vec<Duration> = (0..8)
        .map(|_| {
            let action = cojob_controller::reconcile::error_policy(job.clone(), &err, cx.clone());
            let requeue = |d| kube::runtime::controller::Action::requeue(d);
            (1..=60_000)
                .map(Duration::from_millis)
                .find(|d| requeue(*d) == action)
                .expect("a requeue of at most 60 s")
        })
        .collect();
    assert!(
        delays[0] >= Duration::from_secs(1) && delays[0] <= Duration::from_secs(2),
        "{delays:?}"
    );
    assert!(
        delays[1] >= delays[0] && delays[2] >= delays[1],
        "doubling: {delays:?}"
    );
    assert!(delays[7] == Duration::from_secs(60), "capped: {delays:?}");
    let s = status(&h.job("dark").await);
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "StoreUnavailable")
    );
    assert_eq!(
        condition(&h.job("dark").await, "StoreAvailable"),
        ("False".into(), "StoreUnavailable".into())
    );
    // A second replica, failing the same way from the same (stale) copy, announces nothing.
    let stale = std::sync::Arc::new(h.job("dark").await);
    let _ = h
        .reconcile_with(&h.context(&Budget::store_down()), "dark")
        .await;
    let _ = cojob_controller::reconcile::reconcile(stale, h.context(&Budget::store_down())).await;
    let reasons = h.event_reasons("dark").await;
    assert_eq!(
        reasons.iter().filter(|r| *r == "StoreUnavailable").count(),
        1,
        "{reasons:?}"
    );
    assert!(h.job_pods("dark").await.is_empty());
    // Back up: it recovers.
    h.settle("dark", 1).await;
    assert_eq!(h.live_pod_names("dark").await, ["dark-once-1"]);
    assert_eq!(condition(&h.job("dark").await, "StoreAvailable").0, "True");
    h.cleanup().await;
}

#[tokio::test]
async fn a_foreign_document_at_a_lease_key_is_reported_and_left_untouched() {
    let h = Harness::new("it-foreign").await;
    h.create_job("alien", json!({})).await;
    let key = h.keys("alien").await.lease("alien-once");
    h.db.store()
        .put(
            &key,
            bytes::Bytes::from_static(b"not a lease"),
            cojob::PutMode::IfAbsent,
        )
        .await
        .unwrap();
    let cx = h.context(&Budget::unlimited());
    let err = h
        .reconcile_with(&cx, "alien")
        .await
        .expect_err("a foreign lease");
    assert!(
        err.to_string().contains("not a valid lease document"),
        "{err}"
    );
    let (body, _) = h.db.store().get(&key).await.unwrap().unwrap();
    assert_eq!(&body[..], b"not a lease", "nothing overwritten");
    assert!(h.job_pods("alien").await.is_empty());
    let s = status(&h.job("alien").await);
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.status, "False");
    h.cleanup().await;
}

/// The bucket requests of a run's life, counted (see docs/benchmarks.md); each is the minimum.
/// Dispatch: read the index, claim the tick, write the index, read the lease, acquire it.
/// An idle sweep: read the index and the lease. Completion: read the index and the lease,
/// release (attached from what was read), write the index.
#[tokio::test]
async fn store_requests_per_run_are_counted() {
    let h = Harness::new("it-count").await;
    h.create_job("count", json!({})).await;
    let cx = h.context(&Budget::unlimited());
    let before = cx.db.store().stats();
    h.reconcile_with(&cx, "count").await.unwrap();
    let dispatch = cx.db.store().stats().since(&before);
    let before = cx.db.store().stats();
    h.reconcile_with(&cx, "count").await.unwrap();
    let idle = cx.db.store().stats().since(&before);
    h.finish_pod("count-once-1", 0).await;
    let before = cx.db.store().stats();
    h.reconcile_with(&cx, "count").await.unwrap();
    let complete = cx.db.store().stats().since(&before);
    println!(
        "store requests: dispatch {} gets + {} puts; idle sweep {} gets + {} puts; completion {} gets + {} puts",
        dispatch.gets(),
        dispatch.puts(),
        idle.gets(),
        idle.puts(),
        complete.gets(),
        complete.puts()
    );
    assert_eq!((dispatch.gets(), dispatch.puts()), (2, 3), "dispatch");
    assert_eq!(
        (idle.gets(), idle.puts()),
        (2, 0),
        "an idle sweep reads the index and the lease"
    );
    assert_eq!((complete.gets(), complete.puts()), (2, 2), "completion");
    assert_eq!(
        dispatch.requests(cojob::error::Op::List),
        0,
        "never a listing"
    );
    h.cleanup().await;
}

/// One pass of `name`, with the pod cache filled first as the controller's pod watch fills it
/// (from what the API server holds): the API requests the pass sent, by `verb resource code`.
async fn api_requests_of_a_pass(
    h: &Harness,
    cx: &std::sync::Arc<cojob_controller::context::Context>,
    name: &str,
    label: &str,
) -> Vec<(String, u64)> {
    use kube::runtime::watcher::Event;
    let pods = h.pods().list(&Default::default()).await.unwrap();
    cx.pod_cache.apply(&Event::Init);
    for pod in pods {
        cx.pod_cache.apply(&Event::InitApply(pod));
    }
    cx.pod_cache.apply(&Event::InitDone);
    let before = cx.metrics.kube_requests().snapshot();
    h.reconcile_with(cx, name).await.unwrap();
    let spent: Vec<(String, u64)> = cx
        .metrics
        .kube_requests()
        .snapshot()
        .into_iter()
        .map(|(v, r, c, n)| {
            let was = before
                .iter()
                .find(|(bv, br, bc, _)| *bv == v && *br == r && *bc == c)
                .map_or(0, |(.., b)| *b);
            (format!("{v} {r} {c}"), n - was)
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    println!("{label}: {spent:?}");
    spent
}

/// The API requests of one run, from its dispatch to its end, by verb and resource, with the
/// run's pods read from the watch-backed cache as the controller reads them
/// (`cojob_kube_requests_total`; docs/benchmarks.md, "API requests per run"): 9 writes, and
/// no read.
#[tokio::test]
async fn api_requests_per_run_are_counted() {
    let h = Harness::new("it-api").await;
    h.create_job("api", json!({})).await;
    let cx = h.context(&Budget::unlimited());
    cx.focus.start(); // what the controller's pod watch does
    let job = (h.ns.as_str(), "api");
    let spent = |list: &[(&str, u64)]| -> Vec<(String, u64)> {
        list.iter().map(|(k, n)| (k.to_string(), *n)).collect()
    };
    // The dispatch: the pod, its holder Secret, its ungating, the status and the Event (and,
    // once in the job's life, its finalizer).
    assert_eq!(
        api_requests_of_a_pass(&h, &cx, "api", "dispatch").await,
        spent(&[
            ("create events 201", 1),
            ("create pods 201", 1),
            ("create secrets 201", 1),
            ("patch coordinatedjobs 200", 1),
            ("patch coordinatedjobs/status 200", 1),
            ("patch pods 200", 1),
        ])
    );
    // The next full sweep: the run is quiet, nothing changed.
    h.advance(cx.settings.sweep_interval);
    assert_eq!(api_requests_of_a_pass(&h, &cx, "api", "idle").await, []);
    // The workload started (a cue): the status shows it running.
    h.start_pod("api-once-1").await;
    h.sidecar_started("api", "api-once").await;
    cx.focus.cue(job, "api-once");
    assert_eq!(
        api_requests_of_a_pass(&h, &cx, "api", "started").await,
        spent(&[("patch coordinatedjobs/status 200", 1)])
    );
    // It ended (a cue): the status, the Event, and the pod's result finalizer, released once
    // (before, the history's collection released it again, from the pass's older copy of the
    // pod: a conflict).
    h.finish_pod("api-once-1", 0).await;
    cx.focus.cue(job, "api-once");
    assert_eq!(
        api_requests_of_a_pass(&h, &cx, "api", "ended").await,
        spent(&[
            ("create events 201", 1),
            ("patch coordinatedjobs/status 200", 1),
            ("patch pods 200", 1),
        ])
    );
    h.advance(cx.settings.sweep_interval);
    assert_eq!(api_requests_of_a_pass(&h, &cx, "api", "after").await, []);
    h.cleanup().await;
}

/// A pod removed after its workload started is never created again under its epoch, so a
/// pass over its run reads no pod by name while the lease holds (before, every such pass
/// confirmed the absence: a `get pods` 404 each, which at N = 10 000 came to 4 per run). At
/// the takeover the absent pod is read fresh once (a lagging cache must not hide a pod that
/// ended), and the new epoch's pod is created after a fresh listing of the run's pods (G3).
#[tokio::test]
async fn a_started_run_whose_pod_is_gone_reads_it_only_at_the_takeover() {
    let h = Harness::new("it-gone").await;
    h.create_job(
        "gone",
        json!({"maxAttempts": 2, "lease": {"ttlSeconds": 30}}),
    )
    .await;
    let cx = h.context(&Budget::unlimited());
    cx.focus.start(); // what the controller's pod watch does
    let job = (h.ns.as_str(), "gone");
    h.reconcile_with(&cx, "gone").await.unwrap();
    h.start_pod("gone-once-1").await;
    h.sidecar_started("gone", "gone-once").await; // deadline: t0 + 30 s
    h.delete_pod_now("gone-once-1").await;
    let get_pods = |spent: &[(String, u64)]| -> u64 {
        spent
            .iter()
            .filter(|(k, _)| k.starts_with("get pods "))
            .map(|(_, n)| n)
            .sum()
    };
    for (label, after) in [
        ("gone", 1),
        ("gone, a sweep later", 10),
        ("gone, later still", 10),
    ] {
        h.advance(Duration::from_secs(after));
        cx.focus.cue(job, "gone-once");
        let spent = api_requests_of_a_pass(&h, &cx, "gone", label).await;
        assert_eq!(get_pods(&spent), 0, "{label}: {spent:?}");
        assert_eq!(h.lease("gone", "gone-once").await.unwrap().epoch, 1);
    }
    // t0 + 36 s: past the deadline and the 5 s allowance.
    h.advance(Duration::from_secs(15));
    let spent = api_requests_of_a_pass(&h, &cx, "gone", "takeover").await;
    let lease = h.lease("gone", "gone-once").await.unwrap();
    assert_eq!((lease.epoch, state(&lease).attempt), (2, 2), "taken over");
    let count = |key: &str| spent.iter().find(|(k, _)| k == key).map_or(0, |(_, n)| *n);
    assert_eq!(
        count("get pods 404"),
        1,
        "the takeover's confirmation: {spent:?}"
    );
    assert_eq!(count("list pods 200"), 1, "G3's fresh listing: {spent:?}");
    assert_eq!(count("create pods 201"), 1, "epoch 2's pod: {spent:?}");
    assert_eq!(h.live_pod_names("gone").await, ["gone-once-2"]);
    h.cleanup().await;
}

/// A run whose sidecar attached and renews is left out of the timer's sweeps until its lease
/// may have expired: its job is requeued for the lease's deadline plus the skew allowance, not
/// for the sweep interval, and a pass in between reads the index but not the lease. At that
/// time the lease is read: renewed, the run is quiet until its new deadline; silent, the run is
/// taken over at once, not a sweep interval later.
#[tokio::test]
async fn a_running_attempt_costs_no_lease_read_until_it_may_be_taken_over() {
    let h = Harness::new("it-quiet").await;
    h.create_job(
        "quiet",
        json!({"maxAttempts": 2, "lease": {"ttlSeconds": 30}}),
    )
    .await;
    let cx = h.context(&Budget::unlimited());
    cx.focus.start(); // what the controller's pod watch does
    let requeue = |s: u64| kube::runtime::controller::Action::requeue(Duration::from_secs(s));
    let gets = |label: &str, before: &cojob::store::StoreStats| {
        let spent = cx.db.store().stats().since(before);
        println!("{label}: {} gets, {} puts", spent.gets(), spent.puts());
        spent.gets()
    };
    h.reconcile_with(&cx, "quiet").await.unwrap();
    h.start_pod("quiet-once-1").await;
    h.sidecar_started("quiet", "quiet-once").await; // deadline: t0 + 30 s
    // The workload's start is a cue (the dispatching pass left the run quiet): its pass reads
    // the lease and finds the run running: the job is due again at t0 + 30 s + the 5 s
    // allowance.
    h.advance(Duration::from_secs(1));
    cx.focus.cue((h.ns.as_str(), "quiet"), "quiet-once");
    let before = cx.db.store().stats();
    let action = h.reconcile_with(&cx, "quiet").await.unwrap();
    assert_eq!(gets("start's cue", &before), 2, "the index and the lease");
    assert_eq!(action, requeue(34), "not the sweep interval");
    // A status that does not show the run running is older (the job cache lags the
    // controller's own write): a timed sweep reads the lease rather than copy it.
    let mut shown = status(&h.job("quiet").await).active;
    assert_eq!(shown[0].phase, "running");
    shown[0].phase = "pending".into();
    h.jobs()
        .patch_status(
            "quiet",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&json!({"status": {"active": shown}})),
        )
        .await
        .unwrap();
    h.advance(Duration::from_secs(1));
    let before = cx.db.store().stats();
    let action = h.reconcile_with(&cx, "quiet").await.unwrap();
    assert_eq!(gets("stale status", &before), 2, "the index and the lease");
    assert_eq!(action, requeue(33));
    assert_eq!(status(&h.job("quiet").await).active[0].phase, "running");
    // A pass in between (a cue, or another replica's wake-up) leaves the quiet run out.
    for left in [28, 23, 18] {
        h.advance(Duration::from_secs(5));
        let before = cx.db.store().stats();
        let action = h.reconcile_with(&cx, "quiet").await.unwrap();
        assert_eq!(gets("quiet", &before), 1, "the index, no lease");
        assert_eq!(action, requeue(left));
    }
    // The sidecar renewed meanwhile (at t0 + 17 s): at the quiet time the lease is read and
    // the run is quiet again until the new deadline plus the allowance.
    h.sidecar_renews("quiet", "quiet-once").await;
    h.advance(Duration::from_secs(18)); // t0 + 35 s
    let before = cx.db.store().stats();
    let action = h.reconcile_with(&cx, "quiet").await.unwrap();
    assert_eq!(gets("quiet time", &before), 2, "the index and the lease");
    assert_eq!(
        action,
        requeue(17),
        "t0 + 17 s + 30 s + 5 s, from t0 + 35 s"
    );
    assert_eq!(h.lease("quiet", "quiet-once").await.unwrap().epoch, 1);
    // The sidecar went silent: at its quiet time the run is taken over.
    h.advance(Duration::from_secs(17));
    h.reconcile_with(&cx, "quiet").await.unwrap();
    let lease = h.lease("quiet", "quiet-once").await.unwrap();
    assert_eq!((lease.epoch, state(&lease).attempt), (2, 2), "taken over");
    h.cleanup().await;
}

/// A pod that waits for a node leaves its attempt quiet: for a ttl after the dispatch (its
/// kubelet may take it up and its sidecar attach meanwhile, unseen), then, once no kubelet
/// has taken it up for twice `cues::LATE_TAKE_UP`, until its pending lease is due for renewal
/// (a third of the pending ttl): nothing can attach before a kubelet takes the pod up, and
/// that is a cue from then on. So 25 minutes in the scheduler's queue cost two or three lease
/// reads and one renewal, where a pass every ttl read it 50 times and a pass every sweep
/// interval 1 500. The workload's start is a cue: its pass shows the run running and leaves
/// it quiet until its lease may be taken over.
#[tokio::test]
async fn a_pod_that_waits_for_a_node_costs_a_lease_read_per_renewal_until_it_starts() {
    let h = Harness::new("it-pending-quiet").await;
    h.create_job(
        "wait",
        json!({"lease": {"ttlSeconds": 30}, "startTimeoutSeconds": 3600}),
    )
    .await;
    let cx = h.context(&Budget::unlimited()); // a sweep interval of 1 s
    cx.focus.start();
    let job = (h.ns.as_str(), "wait");
    let requeue = |s: u64| kube::runtime::controller::Action::requeue(Duration::from_secs(s));
    h.reconcile_with(&cx, "wait").await.unwrap();
    let t0 = h.now();
    assert_eq!(
        h.lease("wait", "wait-once").await.unwrap().deadline,
        t0 + chrono::Duration::seconds(3600),
        "acquired for the pending ttl (the start timeout)"
    );
    // The dispatching pass left it quiet for a ttl: passes in between, each a full sweep by
    // the clock, leave it out (before, the first of them read its lease).
    for (after, left) in [(1, 29), (10, 19), (10, 9)] {
        h.advance(Duration::from_secs(after));
        let before = cx.db.store().stats();
        let action = h.reconcile_with(&cx, "wait").await.unwrap();
        assert_eq!(
            cx.db.store().stats().since(&before).gets(),
            1,
            "the index, no lease"
        );
        assert_eq!(action, requeue(left));
    }
    // 25 minutes of waiting, the controller passing at the times it asks for.
    let end = t0 + chrono::Duration::minutes(25);
    let mut passes = 0u64;
    let before = cx.db.store().stats();
    loop {
        let wait = cx
            .focus
            .until_due(job, ["wait-once"], h.now(), cx.settings.sweep_interval);
        let at = h.now() + chrono::Duration::from_std(wait).unwrap();
        if at >= end {
            break;
        }
        h.advance((at - h.now()).to_std().unwrap());
        h.reconcile_with(&cx, "wait").await.unwrap();
        passes += 1;
    }
    let spent = cx.db.store().stats().since(&before);
    println!(
        "25 minutes pending at ttl 30 s: {passes} passes, {} gets, {} puts (a pass every ttl: 50; every sweep interval: 1 500)",
        spent.gets(),
        spent.puts()
    );
    // At the dispatch's ttl (and a ttl later if the fake clock was behind the pod's creation
    // by the API server's), then at the renewal.
    assert!((2..=3).contains(&passes), "{passes} passes");
    assert_eq!(spent.gets(), 2 * passes, "the index and the lease per pass");
    // One renewal, at a third of the pending ttl (1 200 s), in the pass due for it.
    assert_eq!(spent.puts(), 1, "the pending lease's renewal");
    let lease = h.lease("wait", "wait-once").await.unwrap();
    assert_eq!((lease.epoch, state(&lease).attempt), (1, 1));
    assert_eq!(
        lease.deadline,
        t0 + chrono::Duration::seconds(1200 + 3600),
        "renewed at t0 + 1 200 s"
    );
    assert_eq!(status(&h.job("wait").await).active[0].phase, "pending");
    // The workload starts: the cue's pass shows it running, quiet until the sidecar's
    // deadline plus the allowance.
    h.start_pod("wait-once-1").await;
    h.sidecar_started("wait", "wait-once").await;
    cx.focus.cue(job, "wait-once");
    let before = cx.db.store().stats();
    let action = h.reconcile_with(&cx, "wait").await.unwrap();
    assert_eq!(cx.db.store().stats().since(&before).gets(), 2);
    assert_eq!(action, requeue(35), "the ttl and the allowance");
    assert_eq!(status(&h.job("wait").await).active[0].phase, "running");
    h.cleanup().await;
}

/// A pending attempt's quiet time never outlasts what its sidecar may do unseen: one that
/// attaches without a cue (a lost watch event) and then goes silent is found running by the
/// pass a ttl after the last, and taken over at its lease's deadline plus the allowance.
#[tokio::test]
async fn a_sidecar_that_attaches_unseen_and_goes_silent_is_taken_over_in_time() {
    let h = Harness::new("it-pending-unseen").await;
    h.create_job(
        "unseen",
        json!({"maxAttempts": 2, "lease": {"ttlSeconds": 30}, "startTimeoutSeconds": 3600}),
    )
    .await;
    let cx = h.context(&Budget::unlimited());
    cx.focus.start();
    let job = (h.ns.as_str(), "unseen");
    let requeue = |s: u64| kube::runtime::controller::Action::requeue(Duration::from_secs(s));
    // The dispatching pass leaves it quiet for a ttl.
    h.reconcile_with(&cx, "unseen").await.unwrap();
    h.advance(Duration::from_secs(1));
    assert_eq!(h.reconcile_with(&cx, "unseen").await.unwrap(), requeue(29));
    // 5 s later its sidecar attaches (deadline 36 s after the dispatch) and freezes; no cue.
    h.advance(Duration::from_secs(5));
    h.start_pod("unseen-once-1").await;
    h.sidecar_started("unseen", "unseen-once").await;
    let deadline = h.lease("unseen", "unseen-once").await.unwrap().deadline;
    // At its quiet time the pass finds it running: quiet until the deadline plus 5 s.
    h.advance(Duration::from_secs(24));
    let action = h.reconcile_with(&cx, "unseen").await.unwrap();
    assert_eq!(status(&h.job("unseen").await).active[0].phase, "running");
    let due = deadline + chrono::Duration::seconds(5);
    assert_eq!(
        action,
        requeue((due - h.now()).num_seconds().unsigned_abs())
    );
    let wait = cx
        .focus
        .until_due(job, ["unseen-once"], h.now(), cx.settings.sweep_interval);
    h.advance(wait);
    assert_eq!(h.now(), due);
    h.reconcile_with(&cx, "unseen").await.unwrap();
    let lease = h.lease("unseen", "unseen-once").await.unwrap();
    assert_eq!(
        (lease.epoch, state(&lease).attempt),
        (2, 2),
        "taken over at the deadline plus the allowance"
    );
    h.cleanup().await;
}

/// An hour-long run at the chart's defaults (ttl 60 s, sweep interval 10 s), its sidecar
/// renewing every 20 s and the controller passing at the times it asks for: the lease is read
/// once per 45 to 65 s (2/3 of the ttl plus the allowance to the ttl plus the allowance), not
/// every sweep interval (360 reads an hour).
#[tokio::test]
async fn an_hour_long_run_is_read_about_once_per_ttl() {
    let h = Harness::new("it-hour").await;
    h.create_job("hour", json!({"lease": {"ttlSeconds": 60}}))
        .await;
    let cx = h.context_with(&Budget::unlimited(), |s| {
        s.sweep_interval = Duration::from_secs(10);
    });
    cx.focus.start();
    h.reconcile_with(&cx, "hour").await.unwrap();
    h.start_pod("hour-once-1").await;
    h.sidecar_started("hour", "hour-once").await;
    let job = (h.ns.as_str(), "hour");
    let start = h.now();
    let end = start + chrono::Duration::hours(1);
    let renew_every = chrono::Duration::seconds(20);
    let mut renewal = start + renew_every;
    let first = cx
        .focus
        .until_due(job, ["hour-once"], start, Duration::from_secs(10));
    let mut pass = start + chrono::Duration::from_std(first).unwrap();
    let mut passes = 0u64;
    let before = cx.db.store().stats();
    loop {
        let next = renewal.min(pass);
        if next >= end {
            break;
        }
        h.advance((next - h.now()).to_std().unwrap());
        if next == renewal {
            h.sidecar_renews("hour", "hour-once").await;
            renewal += renew_every;
        } else {
            h.reconcile_with(&cx, "hour").await.unwrap();
            passes += 1;
            let wait = cx
                .focus
                .until_due(job, ["hour-once"], h.now(), Duration::from_secs(10));
            pass = h.now() + chrono::Duration::from_std(wait).unwrap();
        }
    }
    let spent = cx.db.store().stats().since(&before);
    println!(
        "one hour at ttl 60 s: {passes} passes, {} gets, {} puts (a pass every sweep interval: 360 passes, 720 gets)",
        spent.gets(),
        spent.puts()
    );
    assert!((55..=81).contains(&passes), "{passes} passes");
    assert_eq!(spent.gets(), 2 * passes, "the index and the lease per pass");
    assert_eq!(spent.puts(), 0, "the sidecar renews, not the controller");
    assert_eq!(
        h.lease("hour", "hour-once").await.unwrap().epoch,
        1,
        "never taken over"
    );
    h.cleanup().await;
}

/// Between full sweeps, a pass sweeps only the runs whose pods were cues: one lease read for
/// the run a pod event concerns, not one per active run. The others keep their status, a cued
/// run that ended is recorded, and the full sweep still comes every interval.
#[tokio::test]
async fn a_pod_cue_sweeps_only_its_run() {
    let h = Harness::new("it-focus").await;
    h.create_job(
        "focus",
        json!({"schedule": "0 0 1 1 *", "concurrencyPolicy": "Allow"}),
    )
    .await;
    let cx = h.context(&Budget::unlimited());
    cx.focus.start(); // what the controller's pod watch does
    h.trigger("focus", "a").await;
    h.trigger("focus", "b").await;
    for _ in 0..2 {
        h.reconcile_with(&cx, "focus").await.unwrap();
    }
    let active = |job: &cojob_controller::crd::CoordinatedJob| -> Vec<String> {
        status(job)
            .active
            .iter()
            .map(|r| r.run_id.clone())
            .collect()
    };
    let runs = active(&h.job("focus").await);
    assert_eq!(runs.len(), 2, "two manual runs: {runs:?}");
    let job = (h.ns.as_str(), "focus");
    let gets = |label: &str, before: &cojob::store::StoreStats| {
        let spent = cx.db.store().stats().since(before);
        println!("{label}: {} gets, {} puts", spent.gets(), spent.puts());
        spent.gets()
    };

    // No cue: the index only.
    let before = cx.db.store().stats();
    h.reconcile_with(&cx, "focus").await.unwrap();
    assert_eq!(gets("no cue", &before), 1, "the index, no lease");
    assert_eq!(
        active(&h.job("focus").await),
        runs,
        "both runs keep their status"
    );

    // A cue for one run: its lease only.
    cx.focus.cue(job, &runs[0]);
    let before = cx.db.store().stats();
    h.reconcile_with(&cx, "focus").await.unwrap();
    assert_eq!(gets("one cue", &before), 2, "the index and one lease");

    // The full sweep is due after the sweep interval (a third of the ttl is longer here).
    // Both runs' pods wait for a node: the passes that dispatched them left them quiet, and
    // so did the cued pass its run; their sidecars cannot attach unnoticed before a ttl.
    h.advance(cx.settings.sweep_interval);
    let before = cx.db.store().stats();
    h.reconcile_with(&cx, "focus").await.unwrap();
    assert_eq!(gets("full sweep", &before), 1, "both runs are quiet");

    // A run's pod ended: the pass its cue starts records it, and reads no other lease.
    h.finish_pod(&format!("{}-1", runs[0]), 0).await;
    cx.focus.cue(job, &runs[0]);
    let before = cx.db.store().stats();
    h.reconcile_with(&cx, "focus").await.unwrap();
    assert_eq!(
        gets("completion", &before),
        2,
        "the index and the ended run's lease"
    );
    assert_eq!(active(&h.job("focus").await), vec![runs[1].clone()]);
    h.cleanup().await;
}

/// A job's index or a tick claim that cojob did not write (corrupt, or another program's) is
/// reported on the object and never overwritten; no tick is decided past it.
#[tokio::test]
async fn a_corrupt_index_or_tick_claim_is_reported_and_left_untouched() {
    let h = Harness::new("it-corrupt").await;
    h.create_job("idx", json!({"schedule": "* * * * *"})).await;
    h.create_job("tick", json!({})).await;
    let index = h.keys("idx").await.index();
    let tick = h.keys("tick").await.tick(None);
    for key in [&index, &tick] {
        h.db.store()
            .put(
                key,
                bytes::Bytes::from_static(br#"{"written_by":"someone else"}"#),
                cojob::PutMode::IfAbsent,
            )
            .await
            .unwrap();
    }
    h.advance(Duration::from_secs(61));
    let cx = h.context(&Budget::unlimited());
    for (name, key) in [("idx", &index), ("tick", &tick)] {
        let err = h
            .reconcile_with(&cx, name)
            .await
            .expect_err("a foreign document");
        let (body, _) = h.db.store().get(key).await.unwrap().unwrap();
        assert_eq!(
            &body[..],
            br#"{"written_by":"someone else"}"#,
            "{name}: nothing overwritten ({err})"
        );
        let s = status(&h.job(name).await);
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidStoreDocument"),
            "{name}"
        );
        assert!(
            ready.message.contains(key.as_str()),
            "{name}: {}",
            ready.message
        );
        assert!(h.job_pods(name).await.is_empty(), "{name}: nothing ran");
    }
    h.cleanup().await;
}

/// A template of 1 MiB (eight environment variables of 128 KiB, each under Linux's 128 KiB
/// limit for one exec string) is carried into the pod unchanged, and the run completes: the
/// bucket never holds the template, and no document the controller writes grows with it.
#[tokio::test]
async fn a_template_of_one_mebibyte_runs_unchanged() {
    let h = Harness::new("it-big").await;
    let value = "x".repeat(128 * 1024 - 16);
    let env: Vec<serde_json::Value> = (0..8)
        .map(|i| json!({"name": format!("BIG_{i}"), "value": value}))
        .collect();
    let template = json!({"template": {"spec": {
        "nodeSelector": {"cojob.dev/integration-test": "no-such-node"},
        "containers": [{"name": "main", "image": "localhost/cojob/busybox:e2e", "env": env}]
    }}});
    assert!(template.to_string().len() >= 1024 * 1024 - 1024);
    h.create_job("big", template).await;
    h.settle("big", 2).await;
    assert_eq!(h.live_pod_names("big").await, ["big-once-1"]);
    let pod = h.pods().get("big-once-1").await.unwrap();
    let main = &pod.spec.as_ref().unwrap().containers[0];
    let big: Vec<usize> = main
        .env
        .iter()
        .flatten()
        .filter(|e| e.name.starts_with("BIG_"))
        .map(|e| e.value.as_deref().unwrap_or_default().len())
        .collect();
    assert_eq!(
        big,
        vec![value.len(); 8],
        "the template reaches the pod whole"
    );

    h.finish_pod("big-once-1", 0).await;
    h.settle("big", 3).await;
    let lease = h.lease("big", "big-once").await.unwrap();
    assert_eq!(state(&lease).status.as_str(), "succeeded");
    let keys = h.keys("big").await;
    let store = h.db.store();
    let written = store.list(keys.base()).await.unwrap();
    assert!(
        written.len() >= 3,
        "index, tick claim and lease: {written:?}"
    );
    let mut largest = 0;
    for key in written {
        let (body, _) = store.get(&key).await.unwrap().unwrap();
        largest = largest.max(body.len());
    }
    assert!(
        largest < 16 * 1024,
        "a document of {largest} bytes: the template leaked into the bucket"
    );
    let s = status(&h.job("big").await);
    assert_eq!(s.counters.succeeded, 1);
    h.cleanup().await;
}

/// A controller whose clock runs a minute ahead of the store's is told so: a `ClockSkew`
/// Warning Event on its Pod, measured against the time the real S3 server stamps on a write.
/// A clock in step reports nothing.
#[tokio::test]
async fn a_clock_skew_beyond_the_allowance_is_an_event_on_the_controller_pod() {
    let h = Harness::new("it-skew").await;
    let cx = h.context(&Budget::unlimited());
    let pod = "cojob-controller-0";
    let reporter = cojob_controller::skew::Reporter::for_pod(cx.recorder.clone(), &h.ns, pod);
    let allowance = Duration::from_secs(5);
    let store = h.db.store();
    let in_step =
        cojob_controller::skew::check(store, &cojob::clock::SystemClock, allowance, &reporter)
            .await
            .unwrap();
    assert_eq!(in_step, None, "the same machine's clocks agree");
    assert!(h.event_reasons(pod).await.is_empty());

    let ahead = cojob::clock::FakeClock::at(chrono::Utc::now() + chrono::Duration::seconds(60));
    let note = cojob_controller::skew::check(store, &ahead, allowance, &reporter)
        .await
        .unwrap()
        .expect("a minute ahead is reported");
    assert!(note.contains("ahead of the store's"), "{note}");
    let mut reasons = Vec::new();
    for _ in 0..50 {
        reasons = h.event_reasons(pod).await;
        if !reasons.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(reasons, ["ClockSkew"]);
    h.cleanup().await;
}

/// A template that names a container `cojob-sidecar` (or the shared volume, or its mount path)
/// is refused with a readable reason: `Ready=False` (`InvalidSpec`) and a Warning Event;
/// nothing runs.
#[tokio::test]
async fn a_template_that_collides_with_the_sidecar_is_invalid() {
    let h = Harness::new("it-clash").await;
    h.create_job(
        "clash",
        json!({"template": {"spec": {
            "nodeSelector": {"cojob.dev/integration-test": "no-such-node"},
            "containers": [{"name": "main", "image": "localhost/cojob/busybox:e2e"}],
            "initContainers": [{"name": "cojob-sidecar", "image": "localhost/cojob/busybox:e2e"}]
        }}}),
    )
    .await;
    h.settle("clash", 2).await;
    let s = status(&h.job("clash").await);
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "InvalidSpec")
    );
    assert!(
        ready.message.contains("cojob-sidecar is reserved"),
        "{}",
        ready.message
    );
    assert!(
        h.event_reasons("clash")
            .await
            .iter()
            .any(|r| r == "InvalidSpec")
    );
    assert!(h.job_pods("clash").await.is_empty());
    assert!(h.decisions("clash").await.is_empty(), "no tick decided");
    h.cleanup().await;
}

/// A document over the 1 MiB limit planted at one job's index is refused without being read
/// into memory: that job reports `InvalidStoreDocument` (naming its key, never the store's
/// reply) and runs nothing; another job in the namespace runs as usual.
#[tokio::test]
async fn an_oversized_document_stops_only_its_own_job() {
    let h = Harness::new("it-huge").await;
    h.create_job("huge", json!({})).await;
    h.create_job("fine", json!({})).await;
    let key = h.keys("huge").await.index();
    h.plant_oversized(&key).await;
    let cx = h.context(&Budget::unlimited());
    let err = h
        .reconcile_with(&cx, "huge")
        .await
        .expect_err("an oversized index");
    assert!(err.to_string().contains("bytes"), "{err}");
    let s = status(&h.job("huge").await);
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "InvalidStoreDocument")
    );
    assert!(ready.message.contains(&key), "{}", ready.message);
    assert!(h.job_pods("huge").await.is_empty());

    h.settle("fine", 2).await;
    assert_eq!(h.live_pod_names("fine").await, ["fine-once-1"]);
    h.cleanup().await;
}

/// A pod the API server refuses (here an invalid container name, which the CRD's schema lets
/// through) fails its attempt with reason `PodRejected` and the API server's message, instead
/// of being tried again forever; no holder Secret is ever made for a refused pod.
#[tokio::test]
async fn a_refused_pod_fails_its_attempt_with_the_api_reason() {
    let h = Harness::new("it-refused").await;
    h.create_job(
        "refused",
        json!({"maxAttempts": 2, "template": {"spec": {
            "containers": [{"name": "Not_A_DNS_Label", "image": "localhost/cojob/busybox:e2e"}]
        }}}),
    )
    .await;
    h.settle("refused", 8).await;
    let lease = h
        .lease("refused", "refused-once")
        .await
        .expect("the run's lease");
    let st = state(&lease);
    assert_eq!(
        (st.status.as_str(), st.attempt, st.reason.as_deref()),
        ("failed", 2, Some("PodRejected")),
        "{:?}",
        lease.state
    );
    assert!(h.job_pods("refused").await.is_empty());
    let secrets = h.secrets().list(&Default::default()).await.unwrap().items;
    let left: Vec<String> = secrets
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .filter(|n| n.starts_with("refused-once-"))
        .collect();
    assert!(left.is_empty(), "holder Secrets left behind: {left:?}");
    let reasons = h.event_reasons("refused").await;
    for r in ["PodRejected", "RunRetrying", "RunFailed"] {
        assert!(reasons.iter().any(|x| x == r), "{r} in {reasons:?}");
    }
    h.cleanup().await;
}

/// An index listing a run id that is not this job's (forged, or copied from another job) is
/// refused as a whole and left untouched: `InvalidStoreDocument`, nothing runs.
#[tokio::test]
async fn an_index_with_a_forged_run_id_is_refused() {
    let h = Harness::new("it-forged").await;
    h.create_job("forged", json!({})).await;
    let key = h.keys("forged").await.index();
    let mut index = cojob_controller::index::JobIndex::default();
    index.active.push(cojob_controller::index::ActiveRun {
        run_id: "victim-once".into(),
        ..Default::default()
    });
    h.db.doc::<cojob_controller::index::JobIndex>(&key)
        .set(&index)
        .await
        .unwrap();
    let before = h.db.store().get(&key).await.unwrap().unwrap();
    let cx = h.context(&Budget::unlimited());
    let err = h
        .reconcile_with(&cx, "forged")
        .await
        .expect_err("a forged index");
    assert!(err.to_string().contains("victim-once"), "{err}");
    let s = status(&h.job("forged").await);
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.reason, "InvalidStoreDocument");
    assert!(h.job_pods("forged").await.is_empty());
    assert_eq!(
        h.db.store().get(&key).await.unwrap().unwrap(),
        before,
        "left untouched"
    );
    h.cleanup().await;
}

/// A pod removed before its workload started (its API object gone) is created again at the
/// same epoch, with a new UID, and its holder Secret again, owned by the new pod: the holder is
/// derived, so nothing is lost, and no epoch is spent.
#[tokio::test]
async fn a_pod_removed_before_it_started_is_created_again_at_the_same_epoch() {
    let h = Harness::new("it-recreate").await;
    h.create_job("again", json!({})).await;
    h.settle("again", 2).await;
    let first = h.pods().get("again-once-1").await.unwrap();
    h.delete_pod_now("again-once-1").await;
    let mut second = None;
    for _ in 0..50 {
        h.settle("again", 1).await;
        if let Some(pod) = h.pods().get_opt("again-once-1").await.unwrap()
            && pod.uid() != first.uid()
            && let Some(name) = cojob_controller::pod::holder_secret_of(&pod)
            && let Some(secret) = h.secrets().get_opt(&name).await.unwrap()
            && secret
                .owner_references()
                .iter()
                .any(|o| Some(&o.uid) == pod.uid().as_ref())
        {
            second = Some(pod);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(second.is_some(), "the pod and its Secret are created again");
    let lease = h.lease("again", "again-once").await.unwrap();
    assert_eq!(lease.epoch, 1, "no epoch spent");
    assert!(lease.is_held_by(&h.derived_holder("again", "again-once", 1).await));
    assert_eq!(
        h.secret_holder("again-once-1").await.as_deref(),
        Some(h.derived_holder("again", "again-once", 1).await.as_str())
    );
    h.cleanup().await;
}

/// In a namespace that enforces the `restricted` Pod Security level, a job whose own
/// containers comply runs: the injected sidecar complies too (non-root, seccomp
/// `RuntimeDefault`, no capabilities, no privilege escalation).
#[tokio::test]
async fn the_sidecar_complies_with_the_restricted_pod_security_level() {
    let h = Harness::new("it-restricted").await;
    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(h.client.clone())
        .patch(
            &h.ns,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            }}})),
        )
        .await
        .unwrap();
    h.create_job(
        "strict",
        json!({"template": {"spec": {"containers": [{
            "name": "main", "image": "localhost/cojob/busybox:e2e",
            "securityContext": {
                "runAsNonRoot": true, "runAsUser": 1000,
                "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
        }]}}}),
    )
    .await;
    h.settle("strict", 2).await;
    let reasons = h.event_reasons("strict").await;
    assert!(
        !reasons.iter().any(|r| r == "PodRejected"),
        "the run pod was refused: {reasons:?}"
    );
    assert_eq!(h.live_pod_names("strict").await, ["strict-once-1"]);
    h.cleanup().await;
}

/// The controller's limits bound what one tenant can cost: a schedule that fires more often
/// than `--min-schedule-interval`, or a lease ttl under `--min-lease-ttl`, is `InvalidSpec`
/// with the numbers, and nothing is decided or run.
#[tokio::test]
async fn schedules_and_ttls_beyond_the_controller_limits_are_invalid() {
    let h = Harness::new("it-limits").await;
    let strict = h.context_with(&Budget::unlimited(), |s| {
        s.min_schedule_interval = Duration::from_secs(60);
        s.min_lease_ttl = Duration::from_secs(30);
    });
    h.create_job("fast", json!({"schedule": "*/10 * * * * *"}))
        .await;
    h.create_job(
        "short",
        json!({"schedule": "0 * * * *", "lease": {"ttlSeconds": 10}}),
    )
    .await;
    h.create_job(
        "fine",
        json!({"schedule": "0 * * * *", "lease": {"ttlSeconds": 30}}),
    )
    .await;
    for name in ["fast", "short", "fine"] {
        for _ in 0..2 {
            h.reconcile_with(&strict, name).await.unwrap();
        }
    }
    for (name, words) in [
        (
            "fast",
            "the schedule fires every 10s; this controller accepts at most one tick every 1m",
        ),
        (
            "short",
            "lease.ttlSeconds is 10; this controller accepts at least 30s",
        ),
    ] {
        let s = status(&h.job(name).await);
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidSpec"),
            "{name}"
        );
        assert!(ready.message.contains(words), "{name}: {}", ready.message);
        assert!(
            h.decisions(name).await.is_empty(),
            "{name}: no tick decided"
        );
        assert!(h.job_pods(name).await.is_empty(), "{name}: nothing runs");
    }
    let s = status(&h.job("fine").await);
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_ne!(ready.reason.as_str(), "InvalidSpec", "{}", ready.message);
    h.cleanup().await;
}

/// A job whose index can never be read (here over the size limit) can still be deleted: its
/// pods are stopped, an `IndexUnreadable` Warning says that its runs are not recorded as
/// cancelled, and the object goes instead of waiting forever on its finalizer.
#[tokio::test]
async fn a_job_with_an_unreadable_index_can_still_be_deleted() {
    let h = Harness::new("it-unreadable").await;
    h.create_job("stuck", json!({})).await;
    h.settle("stuck", 2).await;
    assert_eq!(h.live_pod_names("stuck").await, ["stuck-once-1"]);
    let key = h.keys("stuck").await.index();
    h.plant_oversized(&key).await;
    h.jobs().delete("stuck", &Default::default()).await.unwrap();
    for _ in 0..50 {
        h.settle("stuck", 1).await;
        if h.jobs().get_opt("stuck").await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        h.jobs().get_opt("stuck").await.unwrap().is_none(),
        "the object is still there"
    );
    assert!(
        h.job_pods("stuck").await.is_empty(),
        "its pods are gone with it"
    );
    let reasons = h.event_reasons("stuck").await;
    assert!(
        reasons.iter().any(|r| r == "IndexUnreadable"),
        "{reasons:?}"
    );
    h.cleanup().await;
}
