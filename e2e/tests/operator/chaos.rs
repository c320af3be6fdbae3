//! The chaos suite: a 10-second schedule runs while a fault repeats, and an effect ledger
//! counts what the workload actually did.
//!
//! Each scenario gets its own namespace and CoordinatedJob (`*/10 * * * * *`, `catchUp: All`,
//! `concurrencyPolicy: Allow`, ttl 6 s, 5 attempts), whose workload appends `start`, `beat` and
//! `end` lines with its run and epoch to a ledger on the node. After the fault period the job
//! is suspended, its runs are left to finish, and the checker compares the ticks due with the
//! decisions in the bucket and the ledger:
//!
//! - **due**: ticks of the schedule between the job's first tick and the suspension;
//! - **done**: runs with exactly one completed effect (`end` line);
//! - **duplicates**: runs with more than one completed effect;
//! - **overlaps**: ledger lines of an attempt written after a newer attempt of the run started;
//! - **misses**: ticks due without a run, or runs without a completed effect.
//!
//! Every scenario must report 0 duplicates, 0 overlaps and 0 misses. `COJOB_CHAOS_SECONDS`
//! sets the fault period (CI: 45 s; the documented full run: 180 s) and
//! `COJOB_CHAOS_SCENARIOS` a comma-separated subset (`e2e/chaos/run` wraps both).

use super::faults::Ledger;
use super::*;

/// A fault, injected again and again for the scenario's period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `kill -9` of one controller process every 20 s (the kubelet restarts it).
    ///
    /// Every fault strikes first 10 s into the period (the kubelet 20 s), then at its period.
    KillOneController,
    /// `kill -9` of every controller process every 20 s.
    KillBothControllers,
    /// Each run pod is deleted as soon as its workload exited 0.
    DeleteAfterSuccess,
    /// Each first attempt's pod is deleted while its workload runs.
    DeleteMidRun,
    /// A running pod's sidecar is frozen (SIGSTOP) for 20 s, past ttl + allowance, every 30 s,
    /// once per run; the workload ignores SIGTERM and has a 30 s grace period.
    FreezeSidecar,
    /// The S3 server is hung (SIGSTOP) for 15 s every 30 s.
    HangStore,
    /// Every request to the store arrives 4 s late (the test's proxy holds each chunk a client
    /// sends, past ttl/3), for 15 s every 30 s.
    SlowStore,
    /// The kube-apiserver is killed (`kill -9`) and started again every 30 s.
    RestartApiserver,
    /// The kubelet is stopped (`kill -9`; its containers keep running) for 20 s, past
    /// ttl + allowance, every 40 s, then started again.
    StopKubelet,
}

impl Fault {
    pub const ALL: [Fault; 9] = [
        Fault::KillOneController,
        Fault::KillBothControllers,
        Fault::DeleteAfterSuccess,
        Fault::DeleteMidRun,
        Fault::FreezeSidecar,
        Fault::HangStore,
        Fault::SlowStore,
        Fault::RestartApiserver,
        Fault::StopKubelet,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::KillOneController => "kill-one-controller",
            Fault::KillBothControllers => "kill-both-controllers",
            Fault::DeleteAfterSuccess => "delete-after-success",
            Fault::DeleteMidRun => "delete-mid-run",
            Fault::FreezeSidecar => "freeze-sidecar",
            Fault::HangStore => "hang-store",
            Fault::SlowStore => "slow-store",
            Fault::RestartApiserver => "restart-apiserver",
            Fault::StopKubelet => "stop-kubelet",
        }
    }
}

/// The scenarios chosen by `COJOB_CHAOS_SCENARIOS` (all when unset or `all`).
pub fn selected() -> anyhow::Result<Vec<Fault>> {
    let Ok(list) = std::env::var("COJOB_CHAOS_SCENARIOS") else {
        return Ok(Fault::ALL.to_vec());
    };
    if list.trim() == "all" || list.trim().is_empty() {
        return Ok(Fault::ALL.to_vec());
    }
    list.split(',')
        .map(str::trim)
        .map(|n| {
            Fault::ALL
                .into_iter()
                .find(|f| f.name() == n)
                .ok_or_else(|| {
                    anyhow!(
                        "unknown chaos scenario {n:?}; known: {:?}",
                        Fault::ALL.map(Fault::name)
                    )
                })
        })
        .collect()
}

/// The fault period.
pub fn period() -> Duration {
    let secs = std::env::var("COJOB_CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(45);
    Duration::from_secs(secs)
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Verdict {
    pub due: usize,
    pub done: usize,
    pub duplicates: Vec<String>,
    pub overlaps: Vec<String>,
    pub misses: Vec<String>,
    pub epochs_above_one: usize,
}

impl Verdict {
    pub fn ok(&self) -> bool {
        self.duplicates.is_empty() && self.overlaps.is_empty() && self.misses.is_empty()
    }

    pub fn line(&self, fault: Fault, secs: u64) -> String {
        format!(
            "| {} | {secs} s | {} | {} | {} | {} | {} | {} |",
            fault.name(),
            self.due,
            self.done,
            self.duplicates.len(),
            self.overlaps.len(),
            self.misses.len(),
            self.epochs_above_one
        )
    }
}

/// Processes on this node whose command line starts with `prefix` (NUL-separated words).
fn pids_of(prefix: &[u8]) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if cmdline.starts_with(prefix) {
            out.push(pid);
        }
    }
    out
}

/// The S3 server's process: the pid file `ci/test-servers` writes (versitygw), or, failing
/// that, a process whose program is named `versitygw*`.
fn store_pid() -> Option<i32> {
    let dir = std::env::var("COJOB_TEST_SERVERS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| repo_root().join(".test-servers"));
    if let Some(pid) = std::fs::read_to_string(dir.join("versitygw.pid"))
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
        .filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
    {
        return Some(pid);
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        let base = program.rsplit(|b| *b == b'/').next().unwrap_or_default();
        if base.starts_with(b"versitygw") {
            return Some(pid);
        }
    }
    None
}

pub fn main_running(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.name == "main" && c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
}

/// Injects `fault` until `stop` is set; returns how many times it struck.
async fn inject(
    fault: Fault,
    ctx: Arc<Ctx>,
    ns: String,
    job: String,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<usize> {
    use std::sync::atomic::Ordering;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let selector = format!("cojob.dev/job={job}");
    let mut strikes = 0;
    let mut frozen: Option<(i32, tokio::time::Instant)> = None;
    let mut hung: Option<(i32, tokio::time::Instant)> = None;
    let mut slow: Option<tokio::time::Instant> = None;
    let mut struck_runs = std::collections::HashSet::new();
    let mut kubelet: Option<(cojob_e2e::component::Stopped, tokio::time::Instant)> = None;
    // The first strike comes 10 s in (20 s for the kubelet), then at the fault's period.
    let mut last = tokio::time::Instant::now() - Duration::from_secs(20);
    let every = |secs: u64| Duration::from_secs(secs);
    while !stop.load(Ordering::SeqCst) {
        match fault {
            Fault::KillOneController | Fault::KillBothControllers => {
                if last.elapsed() >= every(20) {
                    let pids = pids_of(b"/cojob\0controller");
                    let victims: Vec<i32> = if fault == Fault::KillOneController {
                        pids.into_iter().take(1).collect()
                    } else {
                        pids
                    };
                    for pid in &victims {
                        super::faults::signal(*pid, "-KILL")?;
                    }
                    strikes += usize::from(!victims.is_empty());
                    last = tokio::time::Instant::now();
                }
            }
            Fault::DeleteAfterSuccess | Fault::DeleteMidRun => {
                let list = pods.list(&ListParams::default().labels(&selector)).await?;
                for p in list.items {
                    if p.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    let hit = if fault == Fault::DeleteAfterSuccess {
                        super::faults::main_exit(&p) == Some(0)
                    } else {
                        let epoch = p
                            .metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get("cojob.dev/epoch").cloned());
                        epoch.as_deref() == Some("1") && main_running(&p)
                    };
                    if hit {
                        let name = p.metadata.name.clone().unwrap_or_default();
                        let _ = pods.delete(&name, &DeleteParams::default()).await;
                        strikes += 1;
                    }
                }
            }
            Fault::FreezeSidecar => {
                if let Some((pid, since)) = frozen
                    && since.elapsed() >= every(20)
                {
                    let _ = super::faults::signal(pid, "-CONT");
                    frozen = None;
                }
                if frozen.is_none() && last.elapsed() >= every(30) {
                    let list = pods.list(&ListParams::default().labels(&selector)).await?;
                    // A run whose every attempt is frozen rightly fails after maxAttempts;
                    // the fault hits each run once, like a fault that strikes at random.
                    let run_of = |p: &Pod| {
                        p.metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get("cojob.dev/run").cloned())
                            .unwrap_or_default()
                    };
                    let target = list.items.iter().find(|p| {
                        p.metadata.deletion_timestamp.is_none()
                            && main_running(p)
                            && !struck_runs.contains(&run_of(p))
                    });
                    if let Some((pid, run)) = target.and_then(|p| {
                        let pid = super::faults::sidecar_pid(p.metadata.name.as_deref()?)?;
                        Some((pid, run_of(p)))
                    }) {
                        struck_runs.insert(run);
                        super::faults::signal(pid, "-STOP")?;
                        frozen = Some((pid, tokio::time::Instant::now()));
                        strikes += 1;
                        last = tokio::time::Instant::now();
                    }
                }
            }
            Fault::HangStore => {
                if let Some((pid, since)) = hung
                    && since.elapsed() >= every(15)
                {
                    super::faults::signal(pid, "-CONT")?;
                    hung = None;
                }
                if hung.is_none() && last.elapsed() >= every(30) {
                    let pid = store_pid().context("the S3 server's process")?;
                    super::faults::signal(pid, "-STOP")?;
                    hung = Some((pid, tokio::time::Instant::now()));
                    strikes += 1;
                    last = tokio::time::Instant::now();
                }
            }
            Fault::SlowStore => {
                let proxy = ctx.store_proxy.as_ref().context(
                    "slow-store needs the test's store proxy (no COJOB_E2E_HELM_VALUES)",
                )?;
                if slow.is_some_and(|since| since.elapsed() >= every(15)) {
                    proxy.set_delay(Duration::ZERO);
                    slow = None;
                }
                if slow.is_none() && last.elapsed() >= every(30) {
                    proxy.set_delay(Duration::from_secs(4));
                    slow = Some(tokio::time::Instant::now());
                    strikes += 1;
                    last = tokio::time::Instant::now();
                }
            }
            Fault::RestartApiserver => {
                if last.elapsed() >= every(30) {
                    let apiserver = cojob_e2e::component::Component::new("kube-apiserver");
                    apiserver.stop("-KILL").await?.start()?;
                    strikes += 1;
                    last = tokio::time::Instant::now();
                }
            }
            Fault::StopKubelet => {
                if kubelet
                    .as_ref()
                    .is_some_and(|(_, since)| since.elapsed() >= every(20))
                    && let Some((stopped, _)) = kubelet.take()
                {
                    stopped.start()?;
                }
                if kubelet.is_none() && last.elapsed() >= every(40) {
                    let stopped = cojob_e2e::component::Component::new("kubelet")
                        .stop("-KILL")
                        .await?;
                    kubelet = Some((stopped, tokio::time::Instant::now()));
                    strikes += 1;
                    last = tokio::time::Instant::now();
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Never leave a process stopped, or the store slow.
    for (pid, _) in frozen.into_iter().chain(hung) {
        let _ = super::faults::signal(pid, "-CONT");
    }
    if let Some(proxy) = &ctx.store_proxy {
        proxy.set_delay(Duration::ZERO);
    }
    if let Some((stopped, _)) = kubelet {
        stopped.start()?;
    }
    Ok(strikes)
}

/// Runs one scenario in `ns`: returns the verdict's table row, or an error with the evidence.
pub async fn scenario(ctx: Arc<Ctx>, ns: String, fault: Fault) -> anyhow::Result<String> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let job = "chaos";
    let ledger = Ledger::create(&ns)?;
    let (script, grace) = match fault {
        // Long enough for a 20 s freeze to land mid-run.
        Fault::FreezeSidecar => (super::faults::ledger_script(15, true), 30),
        _ => (super::faults::ledger_script(3, false), 2),
    };
    create_job(
        &ctx,
        &ns,
        job,
        json!({
            "schedule": "*/10 * * * * *",
            "catchUp": "All",
            "concurrencyPolicy": "Allow",
            "maxAttempts": 5,
            "successfulRunsHistoryLimit": 50,
            "lease": {"ttlSeconds": TTL},
            "template": ledger.template(&script, grace),
        }),
    )
    .await?;
    let uid = job_uid(&ctx, &ns, job).await?;
    let created = now_secs();
    let stop = Arc::new(AtomicBool::new(false));
    let injector = tokio::spawn(inject(
        fault,
        ctx.clone(),
        ns.clone(),
        job.to_string(),
        stop.clone(),
    ));
    let secs = period().as_secs();
    tokio::time::sleep(period()).await;
    stop.store(true, Ordering::SeqCst);
    let strikes = injector
        .await
        .map_err(|e| anyhow!("the fault injector panicked: {e}"))??;
    let ended = now_secs();
    // Let the controllers catch up on the ticks that fell due during the faults (catchUp: All)
    // before suspending, so a suspension never explains a tick away.
    wait_for(
        "a decision for every tick of the fault period",
        Duration::from_secs(120),
        || async {
            let rows = runs(&ctx, &ns, job, &uid).await?;
            let newest = rows.iter().filter_map(RunRow::tick_seconds).max();
            if newest.is_some_and(|t| t >= ended - 10) {
                Ok(Some(()))
            } else {
                Err(anyhow!("newest decided tick: {newest:?}"))
            }
        },
    )
    .await?;
    // Stop new ticks, then let the runs in flight finish (controllers restart, the store
    // resumes, leases expire and are taken over).
    // (Retried: the apiserver may still be starting after the last restart.)
    wait_for("the job suspended", Duration::from_secs(60), || async {
        suspend(&ctx, &ns, job).await?;
        Ok(Some(()))
    })
    .await?;
    let suspended = now_secs();
    let settled = wait_for(
        "every run of the window to end",
        Duration::from_secs(120),
        || async {
            let rows = runs(&ctx, &ns, job, &uid).await?;
            let open: Vec<String> = rows
                .iter()
                .filter(|r| r.tick_seconds().is_some_and(|t| t < suspended - 1))
                .filter(|r| r.decision.run_id().is_some())
                .filter(|r| !r.lease.as_ref().is_some_and(LeaseView::is_terminal))
                .map(|r| r.tick.clone())
                .collect();
            if open.is_empty() {
                Ok(Some(rows))
            } else {
                Err(anyhow!("runs still open: {open:?}"))
            }
        },
    )
    .await;
    let rows = settled.with_context(|| ledger.dump())?;
    let verdict = check(&rows, &ledger, created, ended.min(suspended));
    println!(
        "chaos {}: {strikes} strike(s); due {}, done {}, duplicates {:?}, overlaps {:?}, misses {:?}, runs needing a later epoch {}",
        fault.name(),
        verdict.due,
        verdict.done,
        verdict.duplicates,
        verdict.overlaps,
        verdict.misses,
        verdict.epochs_above_one
    );
    ensure!(strikes > 0, "the fault {} never struck", fault.name());
    ensure!(
        verdict.ok(),
        "chaos {}: {verdict:?}\n{}\n{}",
        fault.name(),
        runs_table(&rows),
        ledger.dump()
    );
    Ok(verdict.line(fault, secs))
}

/// Compares the ticks due in `(created, suspended)` with the decisions and the ledger.
pub fn check(rows: &[RunRow], ledger: &Ledger, created: i64, suspended: i64) -> Verdict {
    let mut v = Verdict::default();
    // Ticks strictly inside the window (a tick at the edges may race the creation or the
    // suspension).
    let first = (created / 10 + 1) * 10;
    let mut tick = first;
    while tick < suspended - 1 {
        v.due += 1;
        let row = rows.iter().find(|r| r.tick_seconds() == Some(tick));
        match row.map(|r| &r.decision) {
            Some(cojob_e2e::Decision::Run(run)) => {
                let ends = ledger.count_run("end", run);
                match ends {
                    1 => v.done += 1,
                    0 => v.misses.push(format!("{run}: no completed effect")),
                    n => v.duplicates.push(format!("{run}: {n} completed effects")),
                }
                if row
                    .and_then(|r| r.lease.as_ref())
                    .is_some_and(|l| l.epoch > 1)
                {
                    v.epochs_above_one += 1;
                }
            }
            other => v.misses.push(format!("tick {tick}: {other:?}")),
        }
        tick += 10;
    }
    v.overlaps = ledger.overlaps_by_run();
    v
}
