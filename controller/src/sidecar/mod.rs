//! `cojob sidecar`: keeps a run's lease alive from inside the run's pod.
//!
//! It resumes the lease of its own epoch (`COJOB_EPOCH`) with the holder from the run's Secret,
//! records `running` with the pod and node, and renews every ttl/3. A run decided ahead of its
//! tick (`prestartSeconds`) reads its lease at the start but attaches only 15 to 30 s before
//! the tick ([`sidecar_attach_at`](crate::run::sidecar_attach_at)); the controller keeps the
//! pending lease alive until then. It shows the run's state to the workload as files in the
//! shared volume:
//!
//! - `cancel_requested` appears when someone asked, by a cooperative write, for the run to stop;
//! - `lease_lost` appears when the lease was lost (fenced by a newer epoch, released or deleted),
//!   with the reason, or when no renewal succeeded for a whole ttl by the sidecar's monotonic
//!   clock (the controller may take the run over from then on). The sidecar then stops renewing
//!   and exits with [`EXIT_LEASE_LOST`].
//!
//! - `renewed` holds the node's boot-time clock (ms) at which the last successful renewal was
//!   sent, so the workload's wrapper ([`crate::wrap`]) kills the workload once the deadline
//!   it implies passed, even if this sidecar is frozen;
//! - `cojob` is a copy of this binary, the wrapper the workload's command runs under;
//! - `api.sock` serves the workload API ([`api`]): the run's identity, progress, step
//!   checkpoints and fence checks, fenced by this attempt's epoch.
//!
//! It attaches to its own epoch only, so a pod never serves another attempt even if a holder
//! were reused, and it ignores the lease's deadline when attaching (a node clock running ahead
//! would otherwise see a fresh lease as expired): its first renewal is a compare-and-swap that
//! fails if anyone took the lease meanwhile. The `attached` file of an earlier run of the
//! sidecar (a restart) is removed first, and names its writer's process, so the start gate
//! waits for this one.
//!
//! On SIGTERM (the kubelet stops native sidecars after the workload ends) it renews once more,
//! marking its epoch stopping ([`crate::run::mark_stopping`]), and exits 0 without releasing:
//! the controller releases the lease with the pod's final state, and waits for that state
//! rather than take over an attempt whose sidecar was stopped.

pub mod api;

use cojob::{Db, Error};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::Mutex;

/// The file the sidecar writes in the shared volume once it holds the lease; its start gate
/// (`cojob ready --wait`, the container's postStart hook) waits for it, so the workload never
/// starts without a lease. It holds `<epoch> <pid> <start time>`: the writer's process id and
/// its start time since boot (`/proc/<pid>/stat`), so a file left by an earlier run of a
/// restarted sidecar, whose process is gone, never opens the gate.
pub const ATTACHED_FILE: &str = "attached";

/// The start time of process `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`),
/// or `None` if there is no such process.
fn process_start(pid: &str) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command (field 2) is in parentheses and may hold spaces; count after its end.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19).map(str::to_owned)
}

/// What this process writes into [`ATTACHED_FILE`] once it attached at `epoch`.
fn attached_content(epoch: u64) -> String {
    let pid = std::process::id().to_string();
    let start = process_start(&pid).unwrap_or_default();
    format!("{epoch} {pid} {start}\n")
}

/// `cojob ready`: true once a live sidecar attached to the lease (its [`ATTACHED_FILE`] names
/// a process that still runs, with the same start time).
pub fn ready(shared_dir: &Path) -> bool {
    let Ok(content) = std::fs::read_to_string(shared_dir.join(ATTACHED_FILE)) else {
        return false;
    };
    let mut words = content.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some(_epoch), Some(pid), Some(start)) => process_start(pid).as_deref() == Some(start),
        _ => false,
    }
}

/// The run's tick from `COJOB_FIRE_TIME` in this process's environment (the pod builder sets
/// it on every container of a run), if it is a time: empty for a run without a schedule.
pub fn fire_time_from_env() -> Option<chrono::DateTime<chrono::Utc>> {
    std::env::var("COJOB_FIRE_TIME").ok()?.parse().ok()
}

/// `cojob ready --wait [--not-before <time>]`: polls [`ready`] every 20 ms until it holds and
/// `not_before` has come by this node's clock (true), or the sidecar has not attached within
/// `timeout` (false), counted from its latest attach time ([`crate::run::attach_at`]) when
/// `not_before` is further ahead than [`crate::run::ATTACH_LEAD`]. The sidecar's postStart
/// hook: the kubelet starts the workload's containers only once the hook returned, so the
/// workload starts within 20 ms of the attach, where a startup probe would wait for its next
/// period, and never before its tick when its run was decided ahead (`prestartSeconds`).
///
/// The wait for `not_before` is bounded by [`MAX_PRESTART_SECONDS`](crate::crd::MAX_PRESTART_SECONDS)
/// and `timeout` from the hook's start: a fire time further ahead is not one the controller
/// writes.
///
/// ```
/// let dir = std::env::temp_dir().join(format!("cojob-gate-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// // No sidecar attached: the gate stays shut until its timeout.
/// let timeout = std::time::Duration::from_millis(50);
/// assert!(!cojob_controller::sidecar::wait_ready(&dir, timeout, None));
/// ```
pub fn wait_ready(
    shared_dir: &Path,
    timeout: Duration,
    not_before: Option<chrono::DateTime<chrono::Utc>>,
) -> bool {
    let started = std::time::Instant::now();
    let longest = timeout + Duration::from_secs(crate::crd::MAX_PRESTART_SECONDS.unsigned_abs());
    // The sidecar of a run decided ahead attaches only shortly before its tick: the timeout
    // for the attach counts from then.
    let now = chrono::Utc::now();
    let attach_wait = crate::run::attach_at(not_before, now)
        .and_then(|at| (at - now).to_std().ok())
        .unwrap_or_default();
    let attach_by = (timeout + attach_wait).min(longest);
    loop {
        let attached = ready(shared_dir);
        let due = not_before.is_none_or(|t| chrono::Utc::now() >= t);
        if attached && due {
            return true;
        }
        let waited = started.elapsed();
        if (!attached && waited >= attach_by) || waited >= longest {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Exit code when the lease was lost.
pub const EXIT_LEASE_LOST: i32 = 2;
/// Exit code when the lease could not be attached (absent, released, foreign or expired).
pub const EXIT_NOT_ATTACHED: i32 = 3;

/// Arguments of `cojob sidecar`; the pod builder sets them through the environment. `Debug`
/// hides the holder.
#[derive(clap::Args)]
pub struct Args {
    /// The store URL.
    #[arg(long, env = "COJOB_BUCKET")]
    bucket: String,
    /// The run's lease key.
    #[arg(long, env = "COJOB_LEASE_KEY")]
    lease_key: String,
    /// The lease epoch of this pod's attempt: the only one it attaches to.
    #[arg(long, env = "COJOB_EPOCH")]
    epoch: u64,
    /// The lease holder (a credential, from the run's Secret).
    #[arg(long, env = "COJOB_HOLDER", hide_env_values = true)]
    holder: String,
    /// The lease ttl in seconds; renewal runs every third of it.
    #[arg(long, env = "COJOB_LEASE_TTL_SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    ttl_seconds: u64,
    /// The shared volume where the status files appear.
    #[arg(long, env = "COJOB_SHARED_DIR", default_value = crate::pod::SHARED_MOUNT)]
    shared_dir: PathBuf,
    /// The pod's name (downward API).
    #[arg(long, env = "POD_NAME")]
    pod: Option<String>,
    /// The node's name (downward API).
    #[arg(long, env = "NODE_NAME")]
    node: Option<String>,
    /// The pod's UID (downward API): recorded when the workload starts, so that no other pod
    /// of the same epoch (one created again after this one's API object was removed) ever
    /// starts its workload too.
    #[arg(long, env = "POD_UID")]
    pod_uid: Option<String>,
    /// The run's tick (RFC 3339), `once`, or empty: a tick further ahead than
    /// [`crate::run::ATTACH_LEAD`] (a run decided ahead, `prestartSeconds`) is waited for
    /// before the attach.
    #[arg(long, env = "COJOB_FIRE_TIME")]
    fire_time: Option<String>,
}

/// Another pod of the same epoch started its workload first.
#[derive(Debug, thiserror::Error)]
#[error("pod {0} of this epoch started first")]
struct OtherPodStarted(String);

/// The pod a sidecar runs in, as its lease records it once the sidecar attached (all from the
/// downward API).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodIdentity {
    /// The pod's name.
    pub pod: Option<String>,
    /// The node's name.
    pub node: Option<String>,
    /// The pod's UID: the one pod of its epoch whose workload may start.
    pub uid: Option<String>,
}

/// The lease state a sidecar writes with its first renewal, the compare-and-swap that proves
/// the lease is still its own: `running`, its pod, node and UID, `started_at`, and no stopping
/// mark of an earlier run of the sidecar ([`crate::run::clear_stopping`]). It refuses (nothing
/// is written, [`cojob::Error::Aborted`]) if another pod of the same epoch already recorded that
/// it started.
///
/// ```
/// use cojob_controller::sidecar::{PodIdentity, attached_state};
/// use serde_json::json;
///
/// let me = PodIdentity { pod: Some("run-1".into()), node: Some("n1".into()), uid: Some("u1".into()) };
/// let state = attached_state(&json!({"status": "pending"}), &me, "2026-12-06T12:00:00Z").unwrap();
/// assert_eq!(state["status"], "running");
/// assert_eq!(state["pod_uid"], "u1");
/// // The same pod attaches again after a restart of its sidecar; another pod of the epoch
/// // (created again under the same name) may not.
/// assert!(attached_state(&state, &me, "2026-12-06T12:01:00Z").is_ok());
/// let other = PodIdentity { uid: Some("u2".into()), ..me };
/// assert!(attached_state(&state, &other, "2026-12-06T12:01:00Z").is_err());
/// ```
pub fn attached_state(
    state: &serde_json::Value,
    me: &PodIdentity,
    started_at: &str,
) -> Result<serde_json::Value, cojob::BoxError> {
    let recorded = state.get("pod_uid").and_then(serde_json::Value::as_str);
    if let (Some(recorded), Some(mine)) = (recorded, me.uid.as_deref())
        && recorded != mine
    {
        return Err(OtherPodStarted(recorded.to_owned()).into());
    }
    Ok(crate::run::clear_stopping(cojob::lease::merge(
        state,
        json!({"status": "running", "pod": me.pod, "node": me.node, "pod_uid": me.uid, "started_at": started_at}),
    )))
}

impl std::fmt::Debug for Args {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Args")
            .field("bucket", &self.bucket)
            .field("lease_key", &self.lease_key)
            .field("epoch", &self.epoch)
            .field("holder", &"<redacted>")
            .field("ttl_seconds", &self.ttl_seconds)
            .field("shared_dir", &self.shared_dir)
            .field("fire_time", &self.fire_time)
            .finish_non_exhaustive()
    }
}

/// How the sidecar ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Stopped by a signal; the lease is left for the controller to release.
    Stopped,
    /// The lease was lost; the workload must discard its outcome.
    LeaseLost,
    /// The lease could not be attached.
    NotAttached,
}

impl Outcome {
    /// The process exit code.
    pub fn exit_code(self) -> i32 {
        match self {
            Outcome::Stopped => 0,
            Outcome::LeaseLost => EXIT_LEASE_LOST,
            Outcome::NotAttached => EXIT_NOT_ATTACHED,
        }
    }
}

fn mark(dir: &Path, name: &str, content: &str) {
    if let Err(e) = std::fs::write(dir.join(name), content) {
        tracing::warn!(file = name, error = %e, "could not write a status file");
    }
}

fn show_cancel(dir: &Path, state: &serde_json::Value) {
    if state["cancel_requested"] == json!(true) && !dir.join("cancel_requested").exists() {
        tracing::info!("cancel requested");
        mark(dir, "cancel_requested", "true\n");
    }
}

/// Records for the workload's wrapper when the last successful renewal was sent.
fn show_renewal(dir: &Path, sent_ms: u64) {
    if let Err(e) = crate::wrap::mark_renewed(dir, sent_ms) {
        tracing::warn!(error = %e, "could not record the renewal for the wrapper");
    }
}

/// Runs the sidecar until `shutdown` resolves or the lease is lost.
pub async fn run(
    args: Args,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Outcome> {
    let dir = args.shared_dir.as_path();
    // A restarted sidecar must not open its start gate on the previous run's file (the gate
    // also checks that the file's writer still runs).
    match std::fs::remove_file(dir.join(ATTACHED_FILE)) {
        Ok(()) => tracing::info!("removed the attached file of an earlier sidecar run"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(anyhow::anyhow!("cannot reset the start gate's file: {e}"));
        }
    }
    // The workload's wrapper (`cojob wrap`) runs from the shared volume; it is in place
    // before the start gate can open.
    install_wrapper(dir)?;
    // Minted credentials (`COJOB_CREDENTIALS_EXPIRE_AT`) are renewed while the run lasts;
    // otherwise the environment's credentials are used as they are.
    let minted = crate::credentials::renewable::Renewable::from_env()?.map(Arc::new);
    let db = match &minted {
        Some(credentials) => {
            crate::credentials::renewable::open_store(&args.bucket, credentials.clone())?
        }
        None => Db::open(&args.bucket).await?,
    };
    tokio::pin!(shutdown);
    let outcome = match wait_to_attach(&args, &db, shutdown.as_mut()).await {
        Ok(None) => hold(&args, &db, minted, shutdown).await,
        ended => ended.map(|o| o.unwrap_or(Outcome::Stopped)),
    };
    report_requests(&db, outcome.as_ref().ok());
    outcome
}

/// Resumes this attempt's lease (a read); `None`, with the reason logged and `lease_lost`
/// shown to the workload, when it is absent, released, at another epoch or held by another.
async fn resume(args: &Args, db: &Db) -> Result<Option<cojob::Lease>, Error> {
    let ttl = Duration::from_secs(args.ttl_seconds);
    let lease = db
        .resume_lease(&args.lease_key, &args.holder, args.epoch, ttl)
        .await?;
    if lease.is_none() {
        tracing::error!(
            key = args.lease_key,
            epoch = args.epoch,
            "the lease is absent, released, at another epoch or held by another"
        );
        mark(&args.shared_dir, "lease_lost", "not attached\n");
    }
    Ok(lease)
}

/// For a run decided ahead of its tick (`prestartSeconds`), waits until its attach time,
/// [`crate::run::ATTACH_LEAD`] or up to twice that before the tick
/// ([`crate::run::sidecar_attach_at`]), so the lease is renewed by the controller's pending
/// renewals meanwhile, not every third of a ttl. It reads the lease once first, so a store it
/// cannot reach or an attempt already fenced shows now, in the container's exit, while there
/// is time to act. `None` when it is time to attach; the outcome when the lease is not this
/// attempt's, or the sidecar was stopped meanwhile (its pod deleted before its tick: nothing
/// was written, the workload never started).
async fn wait_to_attach(
    args: &Args,
    db: &Db,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Option<Outcome>> {
    let now = chrono::Utc::now();
    let tick = args
        .fire_time
        .as_deref()
        .and_then(|t| cojob::json::parse_time(t).ok());
    let uid = args.pod_uid.as_deref().unwrap_or_default();
    let Some(at) = crate::run::sidecar_attach_at(tick, now, uid) else {
        return Ok(None);
    };
    if resume(args, db).await?.is_none() {
        return Ok(Some(Outcome::NotAttached));
    }
    let wait = (at - chrono::Utc::now()).to_std().unwrap_or_default();
    tracing::info!(
        key = args.lease_key,
        attach_at = %cojob::json::format_time(at),
        wait_seconds = wait.as_secs(),
        "the run's tick is ahead: attaching shortly before it"
    );
    tokio::select! {
        () = shutdown => {
            tracing::info!("stopping on signal before the attach; the workload never started");
            Ok(Some(Outcome::Stopped))
        }
        () = tokio::time::sleep(wait) => Ok(None),
    }
}

/// Logs the bucket requests this sidecar made, once, as it ends: what its run cost on top of
/// the controller's part (docs/benchmarks.md, "The cost of one run").
fn report_requests(db: &Db, outcome: Option<&Outcome>) {
    let used = db.store().stats();
    tracing::info!(
        gets = used.gets(),
        puts = used.puts(),
        other = used.total() - used.gets() - used.puts(),
        outcome = ?outcome,
        "bucket requests of this sidecar"
    );
}

/// Attaches to the lease and renews it until `shutdown` resolves or the lease is lost.
async fn hold(
    args: &Args,
    db: &Db,
    minted: Option<Arc<crate::credentials::renewable::Renewable>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Outcome> {
    let ttl = Duration::from_secs(args.ttl_seconds);
    let dir = args.shared_dir.as_path();
    // A pod that started late may find its first credentials renewed already.
    refresh_credentials(minted.as_deref(), db, args).await;
    let Some(mut lease) = resume(args, db).await? else {
        return Ok(Outcome::NotAttached);
    };
    // The controller's acquisition set the deadline; start a full ttl from now and record
    // that this pod started, in one compare-and-swap, which is also what proves the lease is
    // still ours. A pod of the same epoch that started first (its UID is recorded) wins.
    // `sent_ms` is taken before each request, so the sidecar's view of its deadline is never
    // later than the one it wrote. The clock is the node's boot-time clock (monotonic), the
    // one the wrapper reads too.
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    let mut sent_ms = crate::wrap::boot_clock_ms();
    let started = cojob::json::format_time(chrono::Utc::now());
    let me = PodIdentity {
        pod: args.pod.clone(),
        node: args.node.clone(),
        uid: args.pod_uid.clone(),
    };
    let first = lease.renew_with(|s| attached_state(s, &me, &started)).await;
    let mut renewed_ms = match &first {
        Ok(()) => sent_ms,
        Err(Error::Aborted { source, .. }) => {
            tracing::error!(key = args.lease_key, reason = %source, "not starting: another pod of this epoch started");
            mark(dir, "lease_lost", &format!("{source}\n"));
            return Ok(Outcome::NotAttached);
        }
        Err(e) if e.is_lease_lost() => {
            tracing::warn!(key = args.lease_key, error = %e, "cannot attach");
            mark(dir, "lease_lost", &format!("{e}\n"));
            return Ok(Outcome::NotAttached);
        }
        Err(e) => {
            tracing::warn!(key = args.lease_key, error = %e, "first renewal failed");
            // The deadline the controller left is not known here: assume only a third of the
            // ttl of it remains (the controller renews a pending attempt long before that).
            sent_ms.saturating_sub(ttl_ms * 2 / 3)
        }
    };
    // What the wrapper fences the workload by: the deadline this sidecar last wrote.
    show_renewal(dir, renewed_ms);
    tracing::info!(
        key = args.lease_key,
        epoch = lease.epoch(),
        "sidecar attached"
    );
    // The workload API is up before the workload can start.
    let run_folder = args
        .lease_key
        .strip_suffix("/lease")
        .unwrap_or(&args.lease_key)
        .to_string();
    let lease = Arc::new(Mutex::new(lease));
    let shared = Arc::new(api::Shared {
        lease: lease.clone(),
        db: db.clone(),
        run_folder,
        epoch: args.epoch,
        lease_key: args.lease_key.clone(),
        lost: Default::default(),
    });
    let api_task = api::serve(dir, shared.clone())
        .map_err(|e| anyhow::anyhow!("cannot serve the workload API in {}: {e}", dir.display()))?;
    let _api = AbortOnDrop(api_task);
    if first.is_ok() {
        // The start gate (`cojob ready --wait`) opens from now on, and the workload starts.
        mark(dir, ATTACHED_FILE, &attached_content(args.epoch));
    }
    tokio::pin!(shutdown);
    let mut result = first;
    // Only a renewal extends the deadline; the state update above does not.
    let mut from_renewal = false;
    loop {
        // After a failed renewal, retry sooner, so a passing store outage does not cost the lease.
        let mut pause = if result.is_ok() {
            ttl / 3
        } else {
            (ttl / 3).min(Duration::from_secs(1))
        };
        // Minted credentials: wake in time to take their renewal, even with a long ttl.
        if let Some(m) = &minted {
            pause = pause.min(m.next_look(chrono::Utc::now()));
        }
        match result {
            Ok(()) => {
                if from_renewal {
                    renewed_ms = sent_ms;
                    show_renewal(dir, renewed_ms);
                }
                show_cancel(dir, lease.lock().await.state());
            }
            Err(Error::LeaseLost { reason, .. }) => {
                shared.lost.store(true, Ordering::SeqCst);
                tracing::warn!(key = args.lease_key, %reason, "lease lost; stopping renewal");
                mark(dir, "lease_lost", &format!("{reason}\n"));
                return Ok(Outcome::LeaseLost);
            }
            Err(e) if crate::wrap::boot_clock_ms().saturating_sub(renewed_ms) >= ttl_ms => {
                // A whole ttl without a renewal, by this process's monotonic clock: the
                // controller may take the run over from now on. Tell the workload, and stop.
                shared.lost.store(true, Ordering::SeqCst);
                tracing::warn!(key = args.lease_key, error = %e, "no renewal for a whole ttl; the lease is presumed lost");
                mark(
                    dir,
                    "lease_lost",
                    &format!("no renewal for {}s: {e}\n", ttl.as_secs()),
                );
                return Ok(Outcome::LeaseLost);
            }
            Err(e) => tracing::warn!(key = args.lease_key, error = %e, "renewal failed; retrying"),
        }
        tokio::select! {
            () = &mut shutdown => {
                // The kubelet stops a native sidecar only once the pod's main containers
                // ended. One last renewal gives the controller a full ttl to see the pod end
                // and release with its result, and marks the attempt stopping: if the pod's
                // end reaches the controller later still (a busy kubelet), it waits for it
                // instead of taking the run over.
                let epoch = args.epoch;
                let last = lease
                    .lock()
                    .await
                    .renew_with(|s| Ok(crate::run::mark_stopping(s, epoch)))
                    .await;
                if let Err(e) = last {
                    tracing::warn!(key = args.lease_key, error = %e, "last renewal failed");
                }
                tracing::info!("stopping on signal; the controller releases the lease");
                return Ok(Outcome::Stopped);
            }
            () = tokio::time::sleep(pause) => {}
        }
        refresh_credentials(minted.as_deref(), db, args).await;
        sent_ms = crate::wrap::boot_clock_ms();
        result = lease.lock().await.renew().await;
        from_renewal = true;
    }
}

/// Takes the renewal of minted credentials that the controller left for this attempt, once it
/// is due; a failure is logged and tried again at the next renewal, while the current
/// credentials still last.
async fn refresh_credentials(
    minted: Option<&crate::credentials::renewable::Renewable>,
    db: &Db,
    args: &Args,
) {
    let Some(minted) = minted else {
        return;
    };
    let now = chrono::Utc::now();
    match minted
        .refresh(db, &args.lease_key, &args.holder, args.epoch, now)
        .await
    {
        Ok(Some(expires_at)) => {
            tracing::info!(%expires_at, "took the renewed store credentials")
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(
            error = %e,
            expires_at = %minted.expires_at(),
            "could not take renewed store credentials; the current ones are used meanwhile"
        ),
    }
}

/// Stops the workload API when the sidecar's loop ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Copies this (static) binary into the shared volume as `cojob`, for the workload's wrapper:
/// to a temporary name, then renamed, so a workload never runs a partial file.
fn install_wrapper(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let exe = std::env::current_exe()?;
    let tmp = dir.join(".cojob.tmp");
    std::fs::copy(&exe, &tmp).map_err(|e| {
        anyhow::anyhow!("cannot copy {} into {}: {e}", exe.display(), dir.display())
    })?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, dir.join(WRAPPER_FILE))?;
    Ok(())
}

/// The wrapper's file name in the shared volume.
pub const WRAPPER_FILE: &str = "cojob";
