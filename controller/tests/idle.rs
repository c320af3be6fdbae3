//! Idle passes against a real kube-apiserver and etcd and a real S3 server: a job with no
//! active run reads its index at its ticks and once per `--index-resync`, not at every pass,
//! and a bucket that stops answering is still reported.

mod support;

use std::time::Duration;

use chrono::{DurationRound, Timelike};
use kube::runtime::controller::Action;
use serde_json::json;
use support::{Budget, Harness, condition};

fn requeue(s: u64) -> Action {
    Action::requeue(Duration::from_secs(s))
}

fn idle_passes(cx: &cojob_controller::context::Context) -> u64 {
    let text = cx.metrics.encode();
    text.lines()
        .find_map(|l| l.strip_prefix("cojob_idle_passes_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("cojob_idle_passes_total in\n{text}"))
}

/// The `cojob_store_answering` gauge.
fn answering(cx: &cojob_controller::context::Context) -> bool {
    let text = cx.metrics.encode();
    match text
        .lines()
        .find_map(|l| l.strip_prefix("cojob_store_answering "))
    {
        Some("1") => true,
        Some("0") => false,
        other => panic!("cojob_store_answering is {other:?} in\n{text}"),
    }
}

/// A daily job whose tick is 90 minutes away, the controller passing at the times it asks
/// for (every 5 minutes): the first pass reads the index, the passes after it read nothing, the
/// pass an hour after that read reads it again (the resync), and the pass at the tick reads it
/// and starts the run.
#[tokio::test]
async fn an_idle_job_reads_its_index_at_its_tick_and_once_an_hour() {
    let h = Harness::new("it-idle").await;
    // Start on a whole minute, so every requeue is a whole number of seconds.
    let now = h.now();
    let minute = chrono::Duration::minutes(1);
    h.advance(
        (now.duration_trunc(minute).unwrap() + minute - now)
            .to_std()
            .unwrap(),
    );
    let t0 = h.now();
    let tick = t0 + chrono::Duration::minutes(90);
    h.create_job(
        "daily",
        json!({"schedule": format!("{} {} * * *", tick.minute(), tick.hour())}),
    )
    .await;
    let cx = h.context(&Budget::unlimited());
    cx.focus.start(); // what the controller's pod watch does
    let spent = |before: &cojob::store::StoreStats| {
        let used = cx.db.store().stats().since(before);
        (used.gets(), used.puts())
    };
    let before = cx.db.store().stats();
    assert_eq!(h.reconcile_with(&cx, "daily").await.unwrap(), requeue(300));
    assert_eq!(spent(&before).0, 1, "the first pass reads the index");
    let mut reads = Vec::new();
    while h.now() < tick {
        h.advance(Duration::from_secs(300));
        let before = cx.db.store().stats();
        let action = h.reconcile_with(&cx, "daily").await.unwrap();
        let minutes = (h.now() - t0).num_minutes();
        let (gets, puts) = spent(&before);
        println!("pass at t0 + {minutes} min: {gets} gets, {puts} puts");
        if gets > 0 {
            reads.push(minutes);
        }
        if minutes < 90 {
            assert_eq!(action, requeue(300), "at t0 + {minutes} min");
            assert_eq!(puts, 0, "nothing to write at t0 + {minutes} min");
        }
    }
    assert_eq!(reads, [60, 90], "the resync and the tick");
    assert_eq!(
        idle_passes(&cx),
        16,
        "17 passes between, one of them the resync"
    );
    let job = h.job("daily").await;
    let active = job.status.as_ref().map(|s| s.active.len());
    assert_eq!(active, Some(1), "the tick's run started");
    // A job with an active run is not idle.
    h.advance(Duration::from_secs(1));
    let before = cx.db.store().stats();
    h.reconcile_with(&cx, "daily").await.unwrap();
    assert!(spent(&before).0 >= 1, "its passes read the index");
    assert_eq!(idle_passes(&cx), 16);
    h.cleanup().await;
}

/// An idle job's passes read the bucket again once a request to it failed, so the outage is
/// reported on the job; they read it after a pod cue or a change of the object by someone else
/// too, and go back to reading nothing once a pass has read it cleanly.
#[tokio::test]
async fn an_idle_job_reads_its_index_after_a_store_failure_or_a_cue() {
    let h = Harness::new("it-idle-down").await;
    h.create_job("yearly", json!({"schedule": "0 0 1 1 *"}))
        .await;
    let budget = Budget::unlimited();
    let cx = h.context(&budget);
    cx.focus.start();
    let gets = |before: &cojob::store::StoreStats| cx.db.store().stats().since(before).gets();
    let pass = async |label: &str| {
        let before = cx.db.store().stats();
        let result = h.reconcile_with(&cx, "yearly").await;
        let spent = gets(&before);
        println!("{label}: {spent} gets, {:?}", result.as_ref().err());
        (spent, result)
    };
    assert_eq!(pass("first").await.0, 1);
    let (spent, action) = pass("idle").await;
    assert_eq!((spent, action.unwrap()), (0, requeue(300)));
    // The bucket goes down. Until a request to it fails, an idle pass does not notice.
    budget.set_down(true);
    h.advance(Duration::from_secs(300));
    assert_eq!(pass("down, not seen yet").await.0, 0);
    // The controller's clock check (every 5 minutes) fails; the next pass reads and reports.
    assert!(answering(&cx));
    assert!(cx.db.store().get("probe").await.is_err());
    assert!(
        !answering(&cx),
        "the gauge the CojobStoreUnavailable alert watches"
    );
    let (spent, result) = pass("down, seen").await;
    assert_eq!(spent, 1, "it tried to read the index");
    assert!(result.expect_err("the bucket is down").is_store());
    let job = h.job("yearly").await;
    assert_eq!(
        condition(&job, "StoreAvailable"),
        ("False".into(), "StoreUnavailable".into())
    );
    // Back up: the next pass reads, reports, and the one after reads nothing.
    budget.set_down(false);
    h.advance(Duration::from_secs(2));
    let (spent, result) = pass("back up").await;
    assert_eq!(spent, 1);
    result.unwrap();
    assert_eq!(
        condition(&h.job("yearly").await, "StoreAvailable").0,
        "True"
    );
    assert_eq!(pass("idle again").await.0, 0);
    // A pod of the job changed: its pass reads.
    cx.focus.cue((h.ns.as_str(), "yearly"), "yearly-x");
    assert_eq!(pass("cue").await.0, 1);
    assert_eq!(pass("idle after the cue").await.0, 0);
    // Someone else changed the object (another replica's status or annotation write, a
    // label): the next pass reads, and the one after reads nothing again.
    h.jobs()
        .patch(
            "yearly",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await
        .unwrap();
    assert_eq!(pass("object changed").await.0, 1);
    assert_eq!(pass("idle after the change").await.0, 0);
    // A controller that has just started (its pod watch listing) reads.
    cx.focus.stop();
    assert_eq!(pass("pod watch listing").await.0, 1);
    h.cleanup().await;
}
