//! Runs decided ahead of their tick (`prestartSeconds`), against a real kube-apiserver and etcd
//! and a real S3 server: the tick is claimed and its pod created `prestartSeconds` before it,
//! with a start gate that holds the workload until the tick; a busy job decides its tick at the
//! tick, as without a prestart; a suspension cancels a run whose tick has not come.

mod support;

use std::time::Duration;

use chrono::{DateTime, DurationRound, Timelike, Utc};
use cojob_controller::index::Decision;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use serde_json::json;
use support::{Budget, Harness};

/// A daily schedule whose tick is the second whole minute from now; moves the fake clock to
/// `offset` seconds into the minute before that tick. Returns the tick and the schedule (no
/// tick of it falls between the job's creation and the tick).
fn daily_at_second(h: &Harness, offset: u64) -> (DateTime<Utc>, String) {
    let minute = chrono::Duration::minutes(1);
    let now = h.now();
    let tick = now.duration_trunc(minute).unwrap() + minute * 2;
    h.advance((tick - minute - now).to_std().unwrap() + Duration::from_secs(offset));
    (tick, format!("{} {} * * *", tick.minute(), tick.hour()))
}

fn state(l: &cojob::LeaseInfo) -> cojob_controller::run::RunState {
    cojob_controller::run::RunState::parse(&l.state).expect("a run state")
}

fn tick_run(name: &str, tick: DateTime<Utc>) -> String {
    cojob_controller::layout::run_id(name, Some(tick))
}

/// The sidecar's env value `name`, and its postStart command (the start gate, which runs with
/// the sidecar's environment).
fn sidecar_gate(
    pod: &k8s_openapi::api::core::v1::Pod,
    name: &str,
) -> (Option<String>, Vec<String>) {
    let sidecar = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .and_then(|i| i.first())
        .expect("the sidecar");
    let value = sidecar
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone());
    let gate = sidecar
        .lifecycle
        .as_ref()
        .and_then(|l| l.post_start.as_ref())
        .and_then(|h| h.exec.as_ref())
        .and_then(|e| e.command.clone())
        .expect("the sidecar's postStart command");
    (value, gate)
}

/// A daily job with a 20 s prestart, 50 s before its tick: its passes ask to come back 20 s
/// before the tick, idle or not; the pass then claims the tick and creates its pod, whose start
/// gate waits for the tick; the status says so; the pass at the tick decides nothing again.
#[tokio::test]
async fn a_tick_is_decided_ahead_and_its_pod_waits_for_it() {
    let h = Harness::new("it-prestart").await;
    let (tick, schedule) = daily_at_second(&h, 10);
    h.create_job(
        "ahead",
        json!({"schedule": schedule, "prestartSeconds": 20}),
    )
    .await;
    let cx = h.context(&Budget::unlimited());
    cx.focus.start();
    let ms = |ms: u64| Action::requeue(Duration::from_millis(ms));
    // 30 s until 20 s before the tick, and the 50 ms a pass is asked for past its time.
    assert_eq!(h.reconcile_with(&cx, "ahead").await.unwrap(), ms(30_050));
    assert!(h.decisions("ahead").await.is_empty());
    // An idle pass a second later asks for the same moment.
    h.advance(Duration::from_secs(1));
    assert_eq!(h.reconcile_with(&cx, "ahead").await.unwrap(), ms(29_050));
    assert!(cx.metrics.encode().contains("cojob_idle_passes_total 1"));

    h.advance(Duration::from_millis(29_050));
    assert!(h.now() < tick);
    h.reconcile_with(&cx, "ahead").await.unwrap();
    let run = tick_run("ahead", tick);
    assert_eq!(
        h.decisions("ahead").await,
        vec![(cojob::json::format_time(tick), Decision::RunId(run.clone()))],
        "the tick is claimed 20 s ahead"
    );
    let pods = h.job_pods("ahead").await;
    assert_eq!(pods.len(), 1);
    let fire = cojob::json::format_time(tick);
    // The start gate waits for the sidecar's COJOB_FIRE_TIME: the tick.
    let (fire_env, gate) = sidecar_gate(&pods[0], "COJOB_FIRE_TIME");
    assert_eq!(fire_env.as_deref(), Some(fire.as_str()));
    assert_eq!(
        gate[1..3],
        ["ready".to_string(), "--wait".to_string()],
        "{gate:?}"
    );
    let status = h.job("ahead").await.status.expect("a status");
    assert_eq!(
        status.last_schedule_time.map(|t| t.0.as_second()),
        Some(tick.timestamp())
    );
    assert_eq!(
        status.next_schedule_time.map(|t| t.0.as_second()),
        Some(tick.timestamp() + 86_400),
        "the next tick is the one after"
    );
    assert_eq!(status.active.len(), 1);

    // Passes before and at the tick decide nothing again and create no other pod.
    for step in [Duration::from_secs(10), Duration::from_secs(11)] {
        h.advance(step);
        h.reconcile_with(&cx, "ahead").await.unwrap();
        assert_eq!(h.decisions("ahead").await.len(), 1, "at {}", h.now());
        assert_eq!(h.live_pod_names("ahead").await, vec![format!("{run}-1")]);
    }
    assert!(h.now() > tick);
    h.cleanup().await;
}

/// A job with an active run when its prestart comes (Forbid, the default) decides the tick at
/// the tick, as without a prestart: here, skipped, since the run is still active.
#[tokio::test]
async fn a_busy_job_decides_its_tick_at_the_tick() {
    let h = Harness::new("it-prestart-busy").await;
    let (tick, schedule) = daily_at_second(&h, 10);
    h.create_job("busy", json!({"schedule": schedule, "prestartSeconds": 20}))
        .await;
    h.settle("busy", 1).await;
    h.trigger("busy", "first").await;
    h.settle("busy", 1).await;
    assert_eq!(h.job("busy").await.status.unwrap().active.len(), 1);
    h.advance(Duration::from_secs(35)); // 15 s before the tick
    h.settle("busy", 2).await;
    assert!(
        h.decisions("busy").await.is_empty(),
        "nothing is decided ahead while a run is active"
    );
    h.advance(Duration::from_secs(16)); // past the tick
    h.settle("busy", 1).await;
    assert_eq!(
        h.decisions("busy").await,
        vec![(
            cojob::json::format_time(tick),
            Decision::Skipped("ConcurrencyForbid".into())
        )]
    );
    h.cleanup().await;
}

/// A job suspended after its tick's run was decided ahead, before the tick: the run is
/// cancelled (its workload never started), its pod deleted, and nothing runs for that tick.
#[tokio::test]
async fn a_suspension_cancels_a_run_decided_ahead_of_its_tick() {
    let h = Harness::new("it-prestart-suspend").await;
    let (tick, schedule) = daily_at_second(&h, 45); // 15 s before the tick: within the prestart
    h.create_job("held", json!({"schedule": schedule, "prestartSeconds": 20}))
        .await;
    h.settle("held", 1).await;
    let run = tick_run("held", tick);
    assert_eq!(h.live_pod_names("held").await, vec![format!("{run}-1")]);
    h.jobs()
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": true}})),
        )
        .await
        .unwrap();
    h.advance(Duration::from_secs(1));
    h.settle("held", 3).await;
    let lease = h.lease("held", &run).await.expect("the run's lease");
    assert_eq!(state(&lease).status.as_str(), "cancelled");
    assert!(
        h.live_pod_names("held").await.is_empty(),
        "its pod is deleted"
    );
    let reasons = h.event_reasons("held").await;
    assert!(reasons.iter().any(|r| r == "RunCancelled"), "{reasons:?}");
    // Past the tick: it stays decided once, and cancelled; no pod.
    h.advance(Duration::from_secs(20));
    h.settle("held", 2).await;
    assert_eq!(h.decisions("held").await.len(), 1);
    assert!(h.live_pod_names("held").await.is_empty());
    let s = h.job("held").await.status.expect("a status");
    assert_eq!((s.counters.cancelled, s.counters.active), (1, 0));
    h.cleanup().await;
}

/// Under `Replace`, a manual run asked for while a run waits for its tick keeps running until
/// that tick; from the tick on, the tick's run replaces it.
#[tokio::test]
async fn a_run_waiting_for_its_tick_replaces_others_only_from_its_tick() {
    let h = Harness::new("it-prestart-replace").await;
    let (tick, schedule) = daily_at_second(&h, 45); // 15 s before the tick: within the prestart
    h.create_job(
        "rep",
        json!({"schedule": schedule, "prestartSeconds": 20, "concurrencyPolicy": "Replace"}),
    )
    .await;
    h.settle("rep", 1).await;
    let ahead = tick_run("rep", tick);
    assert_eq!(h.live_pod_names("rep").await, vec![format!("{ahead}-1")]);
    h.advance(Duration::from_secs(2));
    h.trigger("rep", "now").await;
    h.settle("rep", 2).await;
    let manual = cojob_controller::layout::trigger_run_id("rep", "now");
    let mut live = h.live_pod_names("rep").await;
    live.sort();
    let mut both = vec![format!("{ahead}-1"), format!("{manual}-1")];
    both.sort();
    assert_eq!(live, both, "the manual run is not replaced before the tick");
    let lease = h
        .lease("rep", &manual)
        .await
        .expect("the manual run's lease");
    assert!(!state(&lease).status.is_terminal(), "{}", lease.state);
    h.advance(Duration::from_secs(14)); // past the tick
    h.settle("rep", 2).await;
    let lease = h
        .lease("rep", &manual)
        .await
        .expect("the manual run's lease");
    assert_eq!(
        state(&lease).status.as_str(),
        "cancelled",
        "replaced at the tick"
    );
    assert_eq!(h.live_pod_names("rep").await, vec![format!("{ahead}-1")]);
    h.cleanup().await;
}

/// A pod created at least `GATE_FREE_LEAD` ahead of its tick goes without the holder gate: its
/// dispatch writes the pod once (no ungating patch). Its Secret comes right after it; if it
/// never came (a crash between the two writes, played here by deleting it), the pending pass
/// after the kubelet reports the sidecar unable to start for it creates it again, and a
/// pending pass with no such report sends nothing.
#[tokio::test]
async fn a_pod_created_well_ahead_of_its_tick_goes_without_the_gate() {
    let h = Harness::new("it-prestart-free").await;
    let (tick, schedule) = daily_at_second(&h, 0); // 60 s before the tick
    h.create_job("free", json!({"schedule": schedule, "prestartSeconds": 60}))
        .await;
    let cx = h.context(&Budget::unlimited());
    cx.focus.start();
    let requests = || {
        let r = cx.metrics.kube_requests();
        (
            r.get("create", "pods", "201"),
            r.get("create", "secrets", "201") + r.get("create", "secrets", "409"),
            r.get("patch", "pods", "200"),
        )
    };
    h.reconcile_with(&cx, "free").await.unwrap();
    let run = tick_run("free", tick);
    let pod = format!("{run}-1");
    assert_eq!(h.live_pod_names("free").await, vec![pod.clone()]);
    assert!(
        (tick - h.now()).to_std().unwrap() >= cojob_controller::pod::GATE_FREE_LEAD,
        "dispatched {} ahead",
        tick - h.now()
    );
    assert_eq!(requests(), (1, 1, 0), "the pod and its Secret; no ungating");
    let created = h.pods().get(&pod).await.unwrap();
    assert!(!cojob_controller::pod::is_gated(&created));
    let holder = h.secret_holder(&pod).await.expect("the holder Secret");
    assert_eq!(holder, h.derived_holder("free", &run, 1).await);

    // The Secret is lost; the pod is still pending and its kubelet says nothing yet: a pass over
    // the run sends no request for it.
    let secret = h.secret_name_of(&pod).await.unwrap();
    h.secrets()
        .delete(&secret, &Default::default())
        .await
        .unwrap();
    h.advance(Duration::from_secs(31)); // past the dispatch's quiet time, 29 s before the tick
    cx.focus.cue((h.ns.as_str(), "free"), &run);
    h.reconcile_with(&cx, "free").await.unwrap();
    assert_eq!(requests(), (1, 1, 0), "nothing to converge");
    assert!(h.secret_holder(&pod).await.is_none());

    // The kubelet cannot build the sidecar's container: the next pass creates the Secret again.
    let lacking = json!({"status": {"phase": "Pending", "initContainerStatuses": [{
        "name": cojob_controller::pod::SIDECAR_NAME, "image": "cojob", "imageID": "",
        "ready": false, "restartCount": 0,
        "state": {"waiting": {"reason": "CreateContainerConfigError",
            "message": format!("secret \"{secret}\" not found")}}
    }]}});
    h.pods()
        .patch_status(&pod, &PatchParams::default(), &Patch::Merge(&lacking))
        .await
        .unwrap();
    cx.focus.cue((h.ns.as_str(), "free"), &run);
    h.reconcile_with(&cx, "free").await.unwrap();
    assert_eq!(requests(), (1, 2, 0), "the Secret, created again");
    assert_eq!(h.secret_holder(&pod).await, Some(holder));
    assert!(h.now() < tick);
    h.cleanup().await;
}

/// A run decided 600 s ahead of its tick (the most a prestart allows) at ttl 60 s: its sidecar
/// attaches only `ATTACH_LEAD` before the tick, so until then the controller keeps the pending
/// lease alive and passes the run only for those renewals (the controller passing at the
/// times it asks for), where a pass a ttl made 10 and a sidecar that attached at once 30
/// renewals. A sidecar that never attaches is timed out the lead after the tick, not at the
/// tick where its 600 s start timeout from the dispatch ends.
#[tokio::test]
async fn a_run_decided_ahead_costs_its_pending_renewals_until_its_attach() {
    use cojob_controller::run::ATTACH_LEAD;
    let h = Harness::new("it-prestart-cost").await;
    let minute = chrono::Duration::minutes(1);
    let tick = h.now().duration_trunc(minute).unwrap() + minute * 12;
    let schedule = format!("{} {} * * *", tick.minute(), tick.hour());
    h.create_job(
        "far",
        json!({"schedule": schedule, "prestartSeconds": 600, "lease": {"ttlSeconds": 60}}),
    )
    .await;
    let cx = h.context_with(&Budget::unlimited(), |s| {
        s.sweep_interval = Duration::from_secs(10);
    });
    cx.focus.start();
    h.reconcile_with(&cx, "far").await.unwrap();
    h.advance(
        (tick - chrono::Duration::seconds(600) - h.now())
            .to_std()
            .unwrap(),
    );
    h.advance(Duration::from_millis(50));
    h.reconcile_with(&cx, "far").await.unwrap();
    let run = tick_run("far", tick);
    let pod = format!("{run}-1");
    assert_eq!(
        h.live_pod_names("far").await,
        vec![pod.clone()],
        "dispatched ahead"
    );
    // The pod runs (a kubelet reports it Pending while the start gate waits, kwok Running:
    // Running here, the case the pod's phase alone would not renew); its sidecar waits for its
    // attach time.
    h.start_pod(&pod).await;
    let attach = tick - chrono::Duration::from_std(ATTACH_LEAD).unwrap();
    let job = (h.ns.as_str(), "far");
    let before = cx.db.store().stats();
    let mut passes = 0u64;
    loop {
        let wait = cx
            .focus
            .until_due(job, [run.as_str()], h.now(), Duration::from_secs(10));
        if h.now() + chrono::Duration::from_std(wait).unwrap() >= attach {
            break;
        }
        h.advance(wait);
        h.reconcile_with(&cx, "far").await.unwrap();
        passes += 1;
    }
    let spent = cx.db.store().stats().since(&before);
    println!(
        "585 s waiting for the attach: {passes} passes, {} gets, {} puts (a pass a ttl: 10 passes; a sidecar attached at once: 30 renewals)",
        spent.gets(),
        spent.puts()
    );
    assert!((1..=3).contains(&passes), "{passes} passes");
    assert_eq!(spent.gets(), 2 * passes, "the index and the lease per pass");
    assert_eq!(spent.puts(), passes, "each pass renews the pending lease");
    let lease = h.lease("far", &run).await.unwrap();
    assert_eq!((lease.epoch, state(&lease).status.as_str()), (1, "pending"));
    assert!(lease.deadline > tick, "kept alive past the tick");

    // Its sidecar never attaches: not late at the tick, late the lead after it.
    h.advance((tick - h.now()).to_std().unwrap() + Duration::from_secs(1));
    h.reconcile_with(&cx, "far").await.unwrap();
    let lease = h.lease("far", &run).await.unwrap();
    assert_eq!(
        (lease.epoch, state(&lease).reason),
        (1, None),
        "not timed out at its tick"
    );
    h.advance(ATTACH_LEAD);
    h.reconcile_with(&cx, "far").await.unwrap();
    let lease = h.lease("far", &run).await.unwrap();
    assert!(
        state(&lease).reason.as_deref() == Some(cojob_controller::run::START_TIMEOUT)
            || lease.epoch > 1,
        "timed out the lead after its tick: epoch {}, {:?}",
        lease.epoch,
        lease.state
    );
    h.cleanup().await;
}
