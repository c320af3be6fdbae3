//! `cojob wrap` as a real process around a real workload: the self-fence kills the workload's
//! whole process group once the lease's deadline passed without a renewal (a frozen sidecar)
//! or once the sidecar reported the lease lost, even when the workload ignores SIGTERM; it
//! keeps a renewed workload alive, forwards SIGTERM, and exits with the workload's status.

use cojob_controller::wrap::{EXIT_FENCED, boot_clock_ms, mark_renewed};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn wrap(dir: &Path, ttl_seconds: u64, script: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_cojob"))
        .args([
            "wrap",
            "--ttl-seconds",
            &ttl_seconds.to_string(),
            "--shared-dir",
        ])
        .arg(dir)
        .args(["--", "sh", "-c", script])
        .spawn()
        .expect("start cojob wrap")
}

/// Waits for the child, up to `timeout`; returns its exit code and how long it took.
fn wait(child: &mut Child, timeout: Duration) -> (i32, Duration) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status.code().unwrap_or(-1), start.elapsed());
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            panic!("cojob wrap still runs after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn alive(pid_file: &Path) -> bool {
    let pid = std::fs::read_to_string(pid_file).unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
    // Gone, or a zombie nobody reaped yet.
    !stat.is_empty() && !stat.contains(") Z ")
}

/// A workload that ignores SIGTERM and records the pid of a grandchild.
fn stubborn(dir: &Path) -> String {
    format!(
        "trap '' TERM; sleep 60 & echo $! > {}/grandchild; wait",
        dir.display()
    )
}

#[test]
fn exits_with_the_workloads_status() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = wrap(dir.path(), 30, "exit 7");
    assert_eq!(wait(&mut child, Duration::from_secs(10)).0, 7);
}

#[test]
fn a_silent_sidecar_gets_the_workload_killed_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    // The last renewal was sent now; the deadline is 2 s away, and no renewal follows (the
    // sidecar is frozen).
    mark_renewed(dir.path(), boot_clock_ms()).unwrap();
    let mut child = wrap(dir.path(), 2, &stubborn(dir.path()));
    let (code, took) = wait(&mut child, Duration::from_secs(10));
    assert_eq!(code, EXIT_FENCED);
    assert!(
        took >= Duration::from_millis(1500),
        "killed before the deadline: {took:?}"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !alive(&dir.path().join("grandchild")),
        "the workload's process group survived"
    );
}

#[test]
fn lease_lost_gets_the_workload_killed_at_once() {
    let dir = tempfile::tempdir().unwrap();
    mark_renewed(dir.path(), boot_clock_ms()).unwrap();
    let mut child = wrap(dir.path(), 60, &stubborn(dir.path()));
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(dir.path().join("lease_lost"), "epoch advanced\n").unwrap();
    let (code, took) = wait(&mut child, Duration::from_secs(10));
    assert_eq!(code, EXIT_FENCED);
    assert!(took < Duration::from_secs(5), "{took:?}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(!alive(&dir.path().join("grandchild")));
}

#[test]
fn renewals_keep_the_workload_alive_past_the_ttl() {
    let dir = tempfile::tempdir().unwrap();
    mark_renewed(dir.path(), boot_clock_ms()).unwrap();
    let mut child = wrap(dir.path(), 2, "sleep 4; exit 0");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(6) {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        mark_renewed(dir.path(), boot_clock_ms()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(wait(&mut child, Duration::from_secs(5)).0, 0);
}

#[test]
fn sigterm_reaches_the_workload() {
    let dir = tempfile::tempdir().unwrap();
    mark_renewed(dir.path(), boot_clock_ms()).unwrap();
    let mut child = wrap(
        dir.path(),
        60,
        &format!(
            "trap 'exit 5' TERM; touch {}/ready; while true; do sleep 0.1; done",
            dir.path().display()
        ),
    );
    let start = Instant::now();
    while !dir.path().join("ready").exists() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert_eq!(wait(&mut child, Duration::from_secs(10)).0, 5);
}

/// `cojob wrap` with the run's tick in `COJOB_FIRE_TIME`, the workload recording when it
/// started (nanoseconds, by the same clock).
fn wrap_at(dir: &Path, tick: chrono::DateTime<chrono::Utc>) -> Child {
    let script = format!("date +%s%N > {}/started", dir.display());
    Command::new(env!("CARGO_BIN_EXE_cojob"))
        .args(["wrap", "--ttl-seconds", "30", "--shared-dir"])
        .arg(dir)
        .args(["--", "sh", "-c", &script])
        .env("COJOB_FIRE_TIME", cojob::json::format_time(tick))
        .spawn()
        .expect("start cojob wrap")
}

/// A run prepared ahead of its tick: the wrapper starts the workload at the tick, not before,
/// even if the sidecar's start gate let the container start early (a kubelet restarted while
/// the gate waited).
#[test]
fn the_workload_starts_at_its_tick() {
    let dir = tempfile::tempdir().unwrap();
    let tick = chrono::Utc::now() + chrono::Duration::milliseconds(1500);
    let mut child = wrap_at(dir.path(), tick);
    assert_eq!(wait(&mut child, Duration::from_secs(10)).0, 0);
    let started: i64 = std::fs::read_to_string(dir.path().join("started"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let tick_ns = tick.timestamp_nanos_opt().unwrap();
    assert!(
        started >= tick_ns,
        "started {} ms before the tick",
        (tick_ns - started) / 1_000_000
    );
}

/// A lease lost while the workload waits for its tick: the workload never starts.
#[test]
fn a_lease_lost_before_the_tick_never_starts_the_workload() {
    let dir = tempfile::tempdir().unwrap();
    let tick = chrono::Utc::now() + chrono::Duration::milliseconds(1500);
    let mut child = wrap_at(dir.path(), tick);
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(dir.path().join("lease_lost"), "epoch advanced\n").unwrap();
    assert_eq!(wait(&mut child, Duration::from_secs(10)).0, EXIT_FENCED);
    assert!(!dir.path().join("started").exists(), "the workload ran");
}
