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
    spawn_epoch(r, key, holder, 1)
}

fn spawn_epoch(r: &Rig, key: &str, holder: &str, epoch: u64) -> Child {
    spawn_pod(r, key, holder, epoch, "uid-a", r.shared.path())
}

/// The sidecar of the pod with `uid`, showing its files in `shared`.
fn spawn_pod(r: &Rig, key: &str, holder: &str, epoch: u64, uid: &str, shared: &Path) -> Child {
    spawn_with_ttl(r, key, holder, epoch, uid, shared, TTL)
}

/// Like [`spawn_pod`], renewing every third of `ttl`.
fn spawn_with_ttl(
    r: &Rig,
    key: &str,
    holder: &str,
    epoch: u64,
    uid: &str,
    shared: &Path,
    ttl: Duration,
) -> Child {
    sidecar_command(r, key, holder, epoch, uid, shared, ttl)
        .spawn()
        .unwrap()
}

/// The command of [`spawn_with_ttl`], to add to before it is spawned.
fn sidecar_command(
    r: &Rig,
    key: &str,
    holder: &str,
    epoch: u64,
    uid: &str,
    shared: &Path,
    ttl: Duration,
) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cojob"));
    command
        .arg("sidecar")
        .env(
            "COJOB_BUCKET",
            format!("file://{}", r.bucket.path().display()),
        )
        .env("COJOB_LEASE_KEY", key)
        .env("COJOB_EPOCH", epoch.to_string())
        .env("COJOB_HOLDER", holder)
        .env("COJOB_LEASE_TTL_SECONDS", ttl.as_secs().to_string())
        .env("COJOB_SHARED_DIR", shared)
        .env("POD_UID", uid)
        .env("POD_NAME", "run-1-1")
        .env("NODE_NAME", "node-a");
    command
}

/// The controller's acquisition of a run's lease for a pending attempt (its pending ttl).
async fn acquire_pending(r: &Rig, key: &str, holder: &str) {
    r.db.lease(key, LeaseOptions::new(holder, Duration::from_secs(600)))
        .await
        .unwrap()
        .unwrap();
}

/// The sidecar of a run decided ahead of its tick `fire_time` (its pod's UID `uid-a`).
fn spawn_ahead(r: &Rig, key: &str, holder: &str, fire_time: &str) -> Child {
    sidecar_command(r, key, holder, 1, "uid-a", r.shared.path(), TTL)
        .env("COJOB_FIRE_TIME", fire_time)
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
    // The wrapper's binary and the renewal record are in place before the workload starts.
    let wrapper = std::fs::metadata(r.shared.path().join("cojob")).expect("the wrapper binary");
    assert!(
        std::os::unix::fs::PermissionsExt::mode(&wrapper.permissions()) & 0o111 != 0,
        "the wrapper is executable"
    );
    let renewed = || -> u64 {
        std::fs::read_to_string(r.shared.path().join("renewed"))
            .expect("the renewal record")
            .trim()
            .parse()
            .unwrap()
    };
    let at_attach = renewed();
    assert!(at_attach <= cojob_controller::wrap::boot_clock_ms());

    until("a renewal", Duration::from_secs(5), async || {
        let d = lease_doc(&r.db, key).await;
        cojob::json::parse_time(d["deadline_at"].as_str().unwrap()).unwrap() > first_deadline
    })
    .await;
    until(
        "the renewal record to advance",
        Duration::from_secs(5),
        async || renewed() > at_attach,
    )
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
        cojob::holder_digest(&holder).as_str(),
        "the controller releases, not the sidecar"
    );
    assert_eq!(
        doc["state"][cojob_controller::run::STOPPING_EPOCH],
        doc["epoch"],
        "its last renewal marks its epoch stopping"
    );
    // A sidecar of the same epoch that attaches again (a restart) is not stopping.
    let mut again = spawn(&r, key, &holder);
    until("attached again", Duration::from_secs(10), async || {
        lease_doc(&r.db, key)
            .await
            .get("state")
            .is_some_and(|s| s.get(cojob_controller::run::STOPPING_EPOCH).is_none())
    })
    .await;
    let _ = Command::new("kill")
        .args(["-TERM", &again.id().to_string()])
        .status();
    assert_eq!(wait_exit(&mut again, Duration::from_secs(5)), 0);
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

/// A pod of one attempt never serves another, even when it carries the same holder.
#[tokio::test]
async fn attaches_only_to_its_own_epoch() {
    let r = rig().await;
    let holder = cojob::new_holder();
    let key = "runs/r4/lease";
    for _ in 0..2 {
        r.db.lease(key, LeaseOptions::new(holder.clone(), TTL))
            .await
            .unwrap()
            .unwrap();
    }
    let mut child = spawn_epoch(&r, key, &holder, 1);
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(10)),
        cojob_controller::sidecar::EXIT_NOT_ATTACHED,
        "epoch 1's pod refuses the lease at epoch 2"
    );
    assert_eq!(
        lease_doc(&r.db, key).await["state"],
        serde_json::Value::Null
    );
    let mut child = spawn_epoch(&r, key, &holder, 2);
    until("running", Duration::from_secs(10), async || {
        lease_doc(&r.db, key).await["state"]["status"] == "running"
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
}

/// A pod created again for the same epoch (after the first one's API object was removed while
/// its containers still ran) never starts its workload: the first pod's UID is recorded, and
/// the first sidecar keeps the lease. A restart of the first pod's own sidecar attaches again.
#[tokio::test]
async fn a_second_pod_of_the_same_epoch_does_not_start() {
    let r = rig().await;
    let holder = cojob::new_holder();
    let key = "runs/r5/lease";
    r.db.lease(key, LeaseOptions::new(holder.clone(), TTL))
        .await
        .unwrap()
        .unwrap();
    let mut first = spawn_pod(&r, key, &holder, 1, "uid-a", r.shared.path());
    until("running", Duration::from_secs(10), async || {
        lease_doc(&r.db, key).await["state"]["pod_uid"] == "uid-a"
    })
    .await;
    let other = tempfile::tempdir().unwrap();
    let mut second = spawn_pod(&r, key, &holder, 1, "uid-b", other.path());
    assert_eq!(
        wait_exit(&mut second, Duration::from_secs(10)),
        cojob_controller::sidecar::EXIT_NOT_ATTACHED,
        "the second pod of epoch 1 refuses to start"
    );
    assert!(other.path().join("lease_lost").exists());
    assert!(!cojob_controller::sidecar::ready(other.path()));
    // The first sidecar still holds the lease a whole ttl later (its renewals went on).
    tokio::time::sleep(TTL + Duration::from_secs(1)).await;
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first sidecar runs"
    );
    assert!(!r.shared.path().join("lease_lost").exists());
    let doc = lease_doc(&r.db, key).await;
    assert_eq!(doc["state"]["pod_uid"], "uid-a");
    assert!(
        doc["deadline_at"].as_str().unwrap()
            > cojob::json::format_time(chrono::Utc::now()).as_str(),
        "renewed: {doc}"
    );
    // The first pod's sidecar, restarted, attaches again.
    let _ = first.kill();
    let _ = first.wait();
    let mut again = spawn_pod(&r, key, &holder, 1, "uid-a", r.shared.path());
    until("attached again", Duration::from_secs(10), async || {
        cojob_controller::sidecar::ready(r.shared.path())
    })
    .await;
    assert!(again.try_wait().unwrap().is_none());
    let _ = again.kill();
    let _ = again.wait();
}

/// A restarted sidecar's start gate never opens on the previous run's `attached` file: the
/// file names its writer's process, which is gone, and the new run removes it first.
#[tokio::test]
async fn a_restart_does_not_pass_the_start_gate_on_an_old_file() {
    let r = rig().await;
    let file = r
        .shared
        .path()
        .join(cojob_controller::sidecar::ATTACHED_FILE);
    // Written by a process that has ended (a short-lived child's pid and start time).
    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id().to_string();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    gone.wait().unwrap();
    let start = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(19).map(str::to_owned))
        .unwrap_or_else(|| "1".into());
    std::fs::write(&file, format!("1 {pid} {start}\n")).unwrap();
    assert!(!cojob_controller::sidecar::ready(r.shared.path()));
    // Written by a live process (this one, as the sidecar writes it): the gate opens.
    let me = std::process::id().to_string();
    let stat = std::fs::read_to_string(format!("/proc/{me}/stat")).unwrap();
    let start = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(19)
        .unwrap()
        .to_owned();
    std::fs::write(&file, format!("1 {me} {start}\n")).unwrap();
    assert!(cojob_controller::sidecar::ready(r.shared.path()));
    assert!(cojob_controller::sidecar::wait_ready(
        r.shared.path(),
        Duration::from_millis(100),
        None
    ));
    // A run decided ahead of its tick: the gate opens at the tick, not before.
    let tick = chrono::Utc::now() + chrono::Duration::milliseconds(700);
    let waited = std::time::Instant::now();
    assert!(cojob_controller::sidecar::wait_ready(
        r.shared.path(),
        Duration::from_millis(100),
        Some(tick)
    ));
    assert!(chrono::Utc::now() >= tick, "opened before the tick");
    assert!(waited.elapsed() >= Duration::from_millis(600));
    // The old format, without a process, never opens it.
    std::fs::write(&file, "1\n").unwrap();
    assert!(!cojob_controller::sidecar::wait_ready(
        r.shared.path(),
        Duration::from_millis(100),
        None
    ));
    // Nor does a tick to come: the sidecar must have attached within the timeout.
    assert!(!cojob_controller::sidecar::wait_ready(
        r.shared.path(),
        Duration::from_millis(100),
        Some(chrono::Utc::now() + chrono::Duration::milliseconds(300))
    ));
    std::fs::write(&file, format!("1 {me} {start}\n")).unwrap();
    let mut child = spawn(&r, "runs/absent/lease", &cojob::new_holder());
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(10)),
        cojob_controller::sidecar::EXIT_NOT_ATTACHED
    );
    assert!(
        !cojob_controller::sidecar::ready(r.shared.path()),
        "the stale file is gone"
    );
}

/// The sidecar of a run decided ahead of its tick (`prestartSeconds`) reads its lease at its
/// start and attaches only shortly before the tick (`sidecar_attach_at`, between `ATTACH_LEAD`
/// and twice it, by its pod's UID): until then the lease is untouched
/// (the controller keeps a pending lease alive) and the start gate is shut; the gate's own
/// timeout counts from the attach, and it opens at the tick.
#[tokio::test]
async fn a_run_decided_ahead_attaches_a_lead_before_its_tick() {
    use cojob_controller::run::ATTACH_LEAD;
    let r = rig().await;
    let holder = cojob::new_holder();
    let key = "runs/r-ahead/lease";
    acquire_pending(&r, key, &holder).await;
    let before = lease_doc(&r.db, key).await;
    // The tick 3 s after twice the lead: the sidecar waits 3 to 18 s, then attaches.
    let lead = chrono::Duration::from_std(ATTACH_LEAD).unwrap();
    let now = chrono::Utc::now();
    let tick = now + lead * 2 + chrono::Duration::seconds(3);
    let attach_at = cojob_controller::run::sidecar_attach_at(Some(tick), now, "uid-a").unwrap();
    assert!(attach_at >= tick - lead * 2 && attach_at <= tick - lead);
    let fire_time = cojob::json::format_time(tick);
    let mut child = spawn_ahead(&r, key, &holder, &fire_time);
    // The start gate, as the kubelet runs it, with a timeout shorter than the wait to attach.
    let mut gate = Command::new(env!("CARGO_BIN_EXE_cojob"))
        .args(["ready", "--wait", "1s"])
        .env("COJOB_SHARED_DIR", r.shared.path())
        .env("COJOB_FIRE_TIME", &fire_time)
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(chrono::Utc::now() < attach_at, "the test was too slow");
    assert_eq!(
        lease_doc(&r.db, key).await,
        before,
        "nothing written before the attach time"
    );
    assert!(!cojob_controller::sidecar::ready(r.shared.path()));
    assert!(gate.try_wait().unwrap().is_none(), "the gate still waits");
    until("running", Duration::from_secs(25), async || {
        lease_doc(&r.db, key).await["state"]["status"] == "running"
    })
    .await;
    let attached = chrono::Utc::now();
    assert!(
        attached >= attach_at && attached < tick,
        "attached at {attached}, for {attach_at} (tick {tick})"
    );
    let doc = lease_doc(&r.db, key).await;
    let started = cojob::json::parse_time(doc["state"]["started_at"].as_str().unwrap()).unwrap();
    assert!(
        started >= attach_at,
        "started_at {started} before {attach_at}"
    );
    // The gate opens at the tick, not at the attach.
    assert_eq!(wait_exit(&mut gate, Duration::from_secs(40)), 0);
    assert!(
        chrono::Utc::now() >= tick,
        "the gate opened before the tick"
    );
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    assert_eq!(wait_exit(&mut child, Duration::from_secs(5)), 0);
}

/// A run decided ahead whose pod is deleted before its sidecar attached (a suspension
/// cancels it): the sidecar stops at once and writes nothing; and one whose attempt was
/// fenced meanwhile finds out from its first read, at its start.
#[tokio::test]
async fn a_run_decided_ahead_stops_before_its_attach_without_writing() {
    let r = rig().await;
    let holder = cojob::new_holder();
    let key = "runs/r-ahead-stopped/lease";
    acquire_pending(&r, key, &holder).await;
    let before = lease_doc(&r.db, key).await;
    let tick = cojob::json::format_time(chrono::Utc::now() + chrono::Duration::seconds(300));
    let mut child = spawn_ahead(&r, key, &holder, &tick);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(child.try_wait().unwrap().is_none(), "it waits for its tick");
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    assert_eq!(wait_exit(&mut child, Duration::from_secs(5)), 0);
    assert_eq!(lease_doc(&r.db, key).await, before, "nothing written");
    assert!(!cojob_controller::sidecar::ready(r.shared.path()));
    // Fenced before its start (a newer epoch): it exits at once, not at its attach time.
    acquire_pending(&r, key, &holder).await;
    let mut stale = spawn_ahead(&r, key, &holder, &tick);
    assert_eq!(
        wait_exit(&mut stale, Duration::from_secs(5)),
        cojob_controller::sidecar::EXIT_NOT_ATTACHED
    );
}

/// A node whose clock runs ahead sees a fresh lease as already expired; the sidecar attaches
/// anyway, and its renewal (a compare-and-swap) proves the lease is still its own.
#[tokio::test]
async fn attaches_when_its_clock_runs_ahead_of_the_writer() {
    let r = rig().await;
    let holder = cojob::new_holder();
    let key = "runs/r5/lease";
    // The controller's clock is 10 s behind this process's: the deadline it writes is already
    // past here.
    let behind = cojob::clock::FakeClock::at(chrono::Utc::now() - chrono::Duration::seconds(10));
    let controller = Db::new(r.db.store().clone()).with_clock(behind);
    controller
        .lease(key, LeaseOptions::new(holder.clone(), TTL))
        .await
        .unwrap()
        .unwrap();
    let mut child = spawn(&r, key, &holder);
    until("running", Duration::from_secs(10), async || {
        lease_doc(&r.db, key).await["state"]["status"] == "running"
    })
    .await;
    let doc = lease_doc(&r.db, key).await;
    let deadline = cojob::json::parse_time(doc["deadline_at"].as_str().unwrap()).unwrap();
    assert!(deadline > chrono::Utc::now(), "renewed from this clock");
    assert_eq!(doc["epoch"], 1);
    let _ = child.kill();
    let _ = child.wait();
}

/// `cojob api` or `cojob step` in a workload container of the pod whose volume is `shared`:
/// (exit code, stdout).
fn workload(shared: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cojob"))
        .args(args)
        .env("COJOB_API", format!("unix:{}/api.sock", shared.display()))
        .env("COJOB_LOG_FORMAT", "text")
        .current_dir(shared)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn reply(out: &(i32, String)) -> serde_json::Value {
    serde_json::from_str(out.1.trim()).unwrap_or_else(|e| panic!("{out:?}: {e}"))
}

/// The workload API: the run's identity, merged progress, fence tokens, and step checkpoints
/// that a respawned attempt gets back instead of running again; every call of a fenced
/// attempt is refused (409, exit 3).
#[tokio::test]
async fn the_workload_api_checkpoints_steps_across_attempts_and_fences_stale_ones() {
    let r = rig().await;
    let holder = cojob::new_holder();
    let key = "v1/jobs/ns/j/uid/runs/j-1/lease";
    let ttl = Duration::from_secs(30); // renewals 10 s apart: none during the checks
    let state = |attempt: u32| json!({"status": "pending", "attempt": attempt, "run_id": "j-1"});
    r.db.lease(
        key,
        LeaseOptions::new(holder.clone(), ttl).state_fn(move |_| Ok(state(1))),
    )
    .await
    .unwrap()
    .unwrap();
    let first_dir = tempfile::tempdir().unwrap();
    let first = first_dir.path();
    let mut one = spawn_with_ttl(&r, key, &holder, 1, "uid-1", first, ttl);
    until("attached", Duration::from_secs(10), async || {
        first.join("attached").exists()
    })
    .await;

    let run = reply(&workload(first, &["api", "GET", "/v1/run"]));
    assert_eq!(
        (&run["run_id"], &run["epoch"], &run["attempt"]),
        (&json!("j-1"), &json!(1), &json!(1))
    );
    assert_eq!(run["lease_lost"], false);
    // Progress merges into the lease state.
    assert_eq!(
        workload(first, &["api", "PUT", "/v1/progress", r#"{"rows": 10}"#]).0,
        0
    );
    let merged = reply(&workload(
        first,
        &["api", "PUT", "/v1/progress", r#"{"phase": "load"}"#],
    ));
    assert_eq!(merged["progress"], json!({"rows": 10, "phase": "load"}));
    assert_eq!(
        lease_doc(&r.db, key).await["state"]["progress"],
        json!({"rows": 10, "phase": "load"})
    );
    let bad = workload(first, &["api", "PUT", "/v1/progress", "[1]"]);
    assert_eq!(bad.0, 1, "{bad:?}");
    // Fence tokens.
    assert_eq!(
        workload(first, &["api", "POST", "/v1/fence", r#"{"token": 1}"#]).0,
        0
    );
    assert_eq!(
        workload(first, &["api", "POST", "/v1/fence", r#"{"token": 7}"#]).0,
        3
    );

    // A step runs once; asked again, its output comes back without running it.
    let step = [
        "step",
        "extract",
        "--",
        "sh",
        "-c",
        "echo ran >> count; echo rows=42",
    ];
    assert_eq!(workload(first, &step), (0, "rows=42\n".into()));
    assert_eq!(workload(first, &step), (0, "rows=42\n".into()));
    assert_eq!(
        std::fs::read_to_string(first.join("count")).unwrap(),
        "ran\n"
    );
    // A failing step is not recorded: the next attempt runs it again.
    let failing = [
        "step",
        "load",
        "--",
        "sh",
        "-c",
        "echo tried >> tries; exit 4",
    ];
    assert_eq!(workload(first, &failing).0, 4);
    assert_eq!(
        workload(first, &["api", "GET", "/v1/steps/load"]).0,
        1,
        "404: not recorded"
    );

    // The run is taken over: a new epoch. The first attempt is fenced at its next call.
    r.db.lease(
        key,
        LeaseOptions::new(holder.clone(), ttl).state_fn(move |_| Ok(state(2))),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        workload(first, &["api", "PUT", "/v1/progress", r#"{"rows": 11}"#]).0,
        3
    );
    assert_eq!(
        workload(first, &step).0,
        3,
        "a fenced attempt records no step"
    );
    assert_eq!(
        reply(&workload(first, &["api", "GET", "/v1/run"]))["lease_lost"],
        true
    );
    let _ = one.kill();
    let _ = one.wait();

    // The respawned attempt gets the first attempt's step output back, without running it.
    let second_dir = tempfile::tempdir().unwrap();
    let second = second_dir.path();
    let mut two = spawn_with_ttl(&r, key, &holder, 2, "uid-2", second, ttl);
    until("attached", Duration::from_secs(10), async || {
        second.join("attached").exists()
    })
    .await;
    assert_eq!(workload(second, &step), (0, "rows=42\n".into()));
    assert!(!second.join("count").exists(), "the step did not run again");
    let retried = ["step", "load", "--", "sh", "-c", "echo loaded"];
    assert_eq!(workload(second, &retried), (0, "loaded\n".into()));
    assert_eq!(
        workload(second, &["api", "POST", "/v1/fence", r#"{"token": 2}"#]).0,
        0
    );
    assert_eq!(
        workload(second, &["api", "POST", "/v1/fence", r#"{"token": 1}"#]).0,
        3
    );
    let stored =
        r.db.store()
            .get("v1/jobs/ns/j/uid/runs/j-1/steps/extract")
            .await
            .unwrap();
    assert!(
        stored.is_some(),
        "the step's claim is under the run's folder"
    );
    let _ = two.kill();
    let _ = two.wait();
}

/// `examples/workload-api/worker.py`, the workload API from Python's standard library, against
/// a real sidecar: its step runs once (a second run gets the recorded result), its progress
/// lands in the lease, and its fence check passes.
#[tokio::test]
async fn the_python_example_uses_the_workload_api() {
    let r = rig().await;
    let holder = cojob::new_holder();
    let key = "v1/jobs/ns/py/uid/runs/py-1/lease";
    let ttl = Duration::from_secs(30);
    r.db.lease(
        key,
        LeaseOptions::new(holder.clone(), ttl)
            .state_fn(|_| Ok(json!({"status": "pending", "attempt": 1, "run_id": "py-1"}))),
    )
    .await
    .unwrap()
    .unwrap();
    let mut sidecar = spawn_with_ttl(&r, key, &holder, 1, "uid-py", r.shared.path(), ttl);
    let shared = r.shared.path().to_path_buf();
    until("attached", Duration::from_secs(10), async || {
        shared.join("attached").exists()
    })
    .await;
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/workload-api/worker.py");
    let python = |_: ()| {
        let out = Command::new("python3")
            .arg(&example)
            .env("COJOB_API", format!("unix:{}/api.sock", shared.display()))
            .output()
            .expect("python3 (ci/test requires it)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let first = python(());
    assert_eq!(
        (
            &first["run_id"],
            &first["epoch"],
            &first["download_ran_here"],
            &first["fence_current"]
        ),
        (&json!("py-1"), &json!(1), &json!(true), &json!(true)),
        "{first}"
    );
    let second = python(());
    assert_eq!(second["download_ran_here"], false, "{second}");
    assert_eq!(second["download"], first["download"]);
    assert_eq!(
        lease_doc(&r.db, key).await["state"]["progress"],
        json!({"downloaded": 1000})
    );
    let _ = sidecar.kill();
    let _ = sidecar.wait();
}
