//! `cojob wrap`: the workload's side of the self-fence (G3 when the node cannot be reached).
//!
//! A takeover waits for the kubelet to report that the old pod stopped. When the old node
//! cannot be reached, nothing but the node itself can stop the old workload, so the pod builder
//! starts every workload container that has a `command` through this wrapper (the sidecar
//! copies the static `cojob` binary into the shared volume before the workload may start):
//!
//! ```text
//! /var/run/cojob/cojob wrap --ttl-seconds 30 -- <command> <args>
//! ```
//!
//! The wrapper runs the command as its child, in a process group of its own, forwards SIGTERM
//! and SIGINT to that group (so the workload's own shutdown still works), and exits with the
//! child's status. It kills the whole group with SIGKILL, and exits [`EXIT_FENCED`], when
//!
//! - the sidecar wrote `lease_lost` (fenced by a newer epoch, or no renewal for a whole ttl),
//!   or
//! - the lease's deadline passed by this node's clock: the sidecar writes, in the file
//!   [`RENEWED_FILE`], the boot-time clock at which it sent its last successful renewal, and
//!   the deadline it wrote is that instant plus the ttl. A frozen or crashed sidecar writes
//!   nothing more, and the wrapper still stops the workload in time.
//!
//! The controller takes a lease over only after its deadline plus the clock-skew allowance, so
//! a workload on a node cut off from everything is dead before another attempt can start,
//! within the allowance. The boot-time clock counts a suspended node's sleep too.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

/// The file in the shared volume where the sidecar keeps the boot-time clock (milliseconds)
/// at which it sent its last successful renewal.
pub const RENEWED_FILE: &str = "renewed";

/// The wrapper's exit code when it killed the workload because the lease was lost.
pub const EXIT_FENCED: i32 = 137;

/// How often the wrapper looks at the shared volume and its child.
const POLL: Duration = Duration::from_millis(100);

/// This node's boot-time clock in milliseconds: monotonic, shared by every container of the
/// node, and counting time spent suspended.
pub fn boot_clock_ms() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1000 + u64::try_from(t.tv_nsec).unwrap_or(0) / 1_000_000
}

/// Writes [`RENEWED_FILE`] in `dir` (atomically: a temporary file, then a rename).
pub fn mark_renewed(dir: &Path, sent_ms: u64) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{RENEWED_FILE}.tmp"));
    std::fs::write(&tmp, format!("{sent_ms}\n"))?;
    std::fs::rename(tmp, dir.join(RENEWED_FILE))
}

fn read_renewed(dir: &Path) -> Option<u64> {
    std::fs::read_to_string(dir.join(RENEWED_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Why the wrapper must stop the workload now, if it must.
///
/// ```
/// use cojob_controller::wrap::fence_reason;
/// let ttl = 30_000;
/// assert_eq!(fence_reason(false, Some(1_000), 30_999, ttl), None);
/// assert!(fence_reason(false, Some(1_000), 31_000, ttl).is_some(), "the deadline passed");
/// assert!(fence_reason(true, Some(1_000), 2_000, ttl).is_some(), "lease_lost");
/// // No renewal recorded yet: counted from when the wrapper started.
/// assert_eq!(fence_reason(false, None, 500, ttl), None);
/// ```
pub fn fence_reason(
    lease_lost: bool,
    renewed_ms: Option<u64>,
    now_ms: u64,
    ttl_ms: u64,
) -> Option<String> {
    if lease_lost {
        return Some("the sidecar reported the lease lost".into());
    }
    let since = renewed_ms.unwrap_or(0);
    let deadline = since.saturating_add(ttl_ms);
    (now_ms >= deadline).then(|| {
        format!(
            "no renewal for {} ms (ttl {ttl_ms} ms): the lease's deadline passed",
            now_ms.saturating_sub(since)
        )
    })
}

/// Arguments of `cojob wrap`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The lease ttl in seconds.
    #[arg(long, env = "COJOB_LEASE_TTL_SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    ttl_seconds: u64,
    /// The shared volume the sidecar writes to.
    #[arg(long, env = "COJOB_SHARED_DIR", default_value = crate::pod::SHARED_MOUNT)]
    shared_dir: PathBuf,
    /// The workload's command and arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

/// The exit code that mirrors how the child ended (128 + the signal when it was killed).
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

fn signal_group(pgid: u32, signal: rustix::process::Signal) {
    let Some(pid) = i32::try_from(pgid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return;
    };
    if let Err(e) = rustix::process::kill_process_group(pid, signal) {
        // Gone already (ESRCH) is the common case.
        tracing::debug!(error = %e, "could not signal the workload's process group");
    }
}

/// How long the workload must still wait for its tick (`COJOB_FIRE_TIME`), at most the
/// longest prestart and the start gate's timeout: `None` once it has come.
///
/// ```
/// use chrono::{Duration, Utc};
/// let now = Utc::now();
/// let wait = cojob_controller::wrap::until_tick(Some(now + Duration::seconds(5)), now);
/// assert_eq!(wait, Some(std::time::Duration::from_secs(5)));
/// assert_eq!(cojob_controller::wrap::until_tick(Some(now), now), None);
/// assert_eq!(cojob_controller::wrap::until_tick(None, now), None);
/// ```
pub fn until_tick(
    tick: Option<chrono::DateTime<chrono::Utc>>,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<Duration> {
    let longest = Duration::from_secs(
        crate::crd::MAX_PRESTART_SECONDS.unsigned_abs() + crate::pod::START_GATE_TIMEOUT_SECONDS,
    );
    let wait = (tick? - now).to_std().ok().filter(|d| !d.is_zero())?;
    Some(wait.min(longest))
}

/// Runs the workload under the self-fence, from the run's tick on; returns the exit code for
/// the wrapper.
pub async fn run(args: Args) -> anyhow::Result<i32> {
    use std::os::unix::process::CommandExt;
    use tokio::signal::unix::{SignalKind, signal};
    let ttl_ms = args.ttl_seconds.saturating_mul(1000);
    let dir = args.shared_dir.as_path();
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| anyhow::anyhow!("no command to run"))?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    // The start gate held this container until the run's tick; it does not run again if the
    // kubelet restarted while it waited, so the wrapper waits for the tick too.
    if let Some(wait) = until_tick(crate::sidecar::fire_time_from_env(), chrono::Utc::now()) {
        eprintln!("cojob wrap: waiting {}s for the run's tick", wait.as_secs());
        tokio::select! {
            _ = term.recv() => return Ok(128 + 15),
            _ = int.recv() => return Ok(128 + 2),
            () = tokio::time::sleep(wait) => {}
        }
        if dir.join("lease_lost").exists() {
            eprintln!("cojob wrap: the lease was lost before the tick; not starting the workload");
            return Ok(EXIT_FENCED);
        }
    }
    // The sidecar attached (its start gate opened) just before this process started, so a
    // missing `renewed` file counts from now.
    let started_ms = boot_clock_ms();
    let mut child = Command::new(program)
        .args(rest)
        .process_group(0)
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start {program:?}: {e}"))?;
    let pgid = child.id();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(exit_code(status));
        }
        let renewed = read_renewed(dir).or(Some(started_ms));
        let lost = dir.join("lease_lost").exists();
        if let Some(why) = fence_reason(lost, renewed, boot_clock_ms(), ttl_ms) {
            eprintln!("cojob wrap: {why}; killing the workload");
            signal_group(pgid, rustix::process::Signal::KILL);
            let _ = child.wait();
            return Ok(EXIT_FENCED);
        }
        tokio::select! {
            _ = term.recv() => signal_group(pgid, rustix::process::Signal::TERM),
            _ = int.recv() => signal_group(pgid, rustix::process::Signal::INT),
            () = tokio::time::sleep(POLL) => {}
        }
    }
}
