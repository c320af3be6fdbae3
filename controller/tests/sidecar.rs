//! `cojob sidecar` as a real process against a real (directory) store: it attaches, records
//! `running`, renews every ttl/3, shows a cancel request as a file, exits 2 when fenced, 0 on
//! SIGTERM and 3 when it cannot attach.

use cojob::{Db, LeaseOptions};
use serde_json::json;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(3);

struct Rig {
    bucket: tempfile::TempDir,
    shared: tempfile::TempDir,
    db: Db,
}

async fn rig() -> Rig {
    let bucket = tempfile::tempdir().unwrap();
    let shared = tempfile::tempdir().unwrap();
    let db = Db::open(&format!("file://{}", bucket.path().display()))
        .await
        .unwrap();
    Rig { bucket, shared, db }
}

fn spawn(r: &Rig, key: &str, holder: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_cojob"))
        .arg("sidecar")
        .env(
            "COJOB_BUCKET",
            format!("file://{}", r.bucket.path().display()),
        )
        .env("COJOB_LEASE_KEY", key)
        .env("COJOB_HOLDER", holder)
        .env("COJOB_LEASE_TTL_SECONDS", TTL.as_secs().to_string())
        .env("COJOB_SHARED_DIR", r.shared.path())
        .env("POD_NAME", "run-1-1")
        .env("NODE_NAME", "node-a")
        .spawn()
        .unwrap()
}

async fn until(what: &str, timeout: Duration, mut check: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

fn wait_exit(child: &mut Child, timeout: Duration) -> i32 {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            panic!("the sidecar did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn lease_doc(db: &Db, key: &str) -> serde_json::Value {
    db.doc::<serde_json::Value>(key)
        .get()
        .await
        .unwrap()
        .unwrap()
        .0
}

#[tokio::test]
async fn renews_shows_cancel_and_exits_when_fenced() {
    let r = rig().await;
    let holder = cojob::new_holder();
    let key = "runs/r1/lease";
    let lease =
        r.db.lease(key, LeaseOptions::new(holder.clone(), TTL))
            .await
            .unwrap()
            .unwrap();
    let first_deadline = lease.deadline();
    let mut child = spawn(&r, key, &holder);

    until("running", Duration::from_secs(10), async || {
        lease_doc(&r.db, key).await["state"]["status"] == "running"
    })
    .await;
    let doc = lease_doc(&r.db, key).await;
    assert_eq!(doc["state"]["pod"], "run-1-1");
    assert_eq!(doc["state"]["node"], "node-a");
    assert_eq!(doc["epoch"], 1, "attaching never bumps the epoch");

    until("a renewal", Duration::from_secs(5), async || {
        let d = lease_doc(&r.db, key).await;
        cojob::json::parse_time(d["deadline_at"].as_str().unwrap()).unwrap() > first_deadline
    })
    .await;

    r.db.cooperative_write(key, |s| {
        cojob::lease::merge(s, json!({"cancel_requested": true}))
    })
    .await
    .unwrap();
    let shared = r.shared.path().to_path_buf();
    until(
        "cancel_requested file",
        Duration::from_secs(5),
        async || shared.join("cancel_requested").exists(),
    )
    .await;
    assert_eq!(
        lease_doc(&r.db, key).await["state"]["cancel_requested"],
        true,
        "renewals keep the cooperative write"
    );

    // A new period (same holder re-acquiring) fences the sidecar's handle.
    let newer =
        r.db.lease(key, LeaseOptions::new(holder.clone(), TTL))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(newer.epoch(), 2);
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(5)),
        cojob_controller::sidecar::EXIT_LEASE_LOST
    );
    let reason = std::fs::read_to_string(r.shared.path().join("lease_lost")).unwrap();
    assert!(reason.contains("epoch advanced from 1 to 2"), "{reason}");
    let after = lease_doc(&r.db, key).await;
    assert_eq!(
        after["epoch"], 2,
        "the fenced sidecar wrote nothing after losing"
    );
}

#[tokio::test]
async fn exits_zero_on_sigterm_without_releasing() {
    let r = rig().await;
    let holder = cojob::new_holder();
    let key = "runs/r2/lease";
    r.db.lease(key, LeaseOptions::new(holder.clone(), TTL))
        .await
        .unwrap()
        .unwrap();
    let mut child = spawn(&r, key, &holder);
    until("running", Duration::from_secs(10), async || {
        lease_doc(&r.db, key).await["state"]["status"] == "running"
    })
    .await;
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(wait_exit(&mut child, Duration::from_secs(5)), 0);
    let doc = lease_doc(&r.db, key).await;
    assert_eq!(
        doc["holder"],
        holder.as_str(),
        "the controller releases, not the sidecar"
    );
}

#[tokio::test]
async fn refuses_a_lease_it_does_not_hold() {
    let r = rig().await;
    let key = "runs/r3/lease";
    r.db.lease(key, LeaseOptions::new(cojob::new_holder(), TTL))
        .await
        .unwrap()
        .unwrap();
    let mut child = spawn(&r, key, "not-the-holder");
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(10)),
        cojob_controller::sidecar::EXIT_NOT_ATTACHED
    );
    assert!(Path::new(&r.shared.path().join("lease_lost")).exists());
}
