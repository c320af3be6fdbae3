//! Faults from outside the controller, on real pods with a real kubelet, checked against an
//! effect ledger: the workload appends `start`, `beat` and `end` lines, with its run and epoch,
//! to a file on the node (a hostPath), and the checks read what it actually did.
//!
//! f. the run pod is deleted right after its workload exited 0, while no controller runs: the
//!    success is recorded from the deleted pod (its result finalizer kept it) and the run never
//!    starts again (G2);
//! h. the sidecar is frozen (SIGSTOP) past its ttl next to a workload that ignores SIGTERM
//!    with a 30 s grace period: the next attempt's workload starts only after the old one is
//!    dead (G3), and the tick's work completes exactly once.

use super::*;

/// Where the ledgers live on the node.
const LEDGER_ROOT: &str = "/var/lib/cojob-e2e/ledger";

/// Where ledgers live: `COJOB_E2E_LEDGER`, else [`LEDGER_ROOT`]. The directory must be the same
/// on this machine and on the node (kind mounts it into its node container).
fn ledger_root() -> std::path::PathBuf {
    std::env::var_os("COJOB_E2E_LEDGER")
        .filter(|p| !p.is_empty())
        .map_or_else(|| LEDGER_ROOT.into(), Into::into)
}

/// A test's ledger: a directory on the node, mounted at `/ledger` in the workload.
pub struct Ledger {
    dir: std::path::PathBuf,
}

impl Ledger {
    pub fn create(ns: &str) -> anyhow::Result<Ledger> {
        use std::os::unix::fs::PermissionsExt;
        let dir = ledger_root().join(ns);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
        Ok(Ledger { dir })
    }

    /// The lines written so far, in the order they were appended.
    pub fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("ledger"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The lines whose first word is `kind` and whose epoch (third word) is `epoch`.
    pub fn count(&self, kind: &str, epoch: Option<&str>) -> usize {
        self.lines()
            .iter()
            .filter(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.first() == Some(&kind) && epoch.is_none_or(|e| w.get(2) == Some(&e))
            })
            .count()
    }

    /// The lines whose first word is `kind` and whose run (second word) is `run`.
    pub fn count_run(&self, kind: &str, run: &str) -> usize {
        self.lines()
            .iter()
            .filter(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.first() == Some(&kind) && w.get(1) == Some(&run)
            })
            .count()
    }

    /// [`overlaps`](Self::overlaps), run by run, for a ledger shared by many runs.
    pub fn overlaps_by_run(&self) -> Vec<String> {
        let mut by_run: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for line in self.lines() {
            if let Some(run) = line.split_whitespace().nth(1) {
                by_run
                    .entry(run.to_string())
                    .or_default()
                    .push(line.clone());
            }
        }
        by_run
            .values()
            .flat_map(|lines| overlaps_in(lines))
            .collect()
    }

    /// Lines of another epoch appended after `epoch`'s `start`: two attempts were live at once.
    pub fn overlaps(&self) -> Vec<String> {
        overlaps_in(&self.lines())
    }
}

/// Lines of an epoch appended after a newer epoch's `start`, in one run's lines.
fn overlaps_in(lines: &[String]) -> Vec<String> {
    {
        let mut live_epochs: Vec<String> = Vec::new();
        let mut out = Vec::new();
        for line in lines {
            let w: Vec<&str> = line.split_whitespace().collect();
            let (Some(kind), Some(epoch)) = (w.first(), w.get(2)) else {
                continue;
            };
            if *kind == "start" {
                live_epochs.push(epoch.to_string());
            }
            if let Some(newest) = live_epochs.last()
                && newest.as_str() != *epoch
            {
                out.push(format!("{line} (after the start of epoch {newest})"));
            }
        }
        out
    }
}

impl Ledger {
    /// The pod template: busybox running `script` with the ledger mounted.
    pub fn template(&self, script: &str, grace: i64) -> Value {
        json!({"spec": {
            "hostNetwork": true,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": grace,
            "volumes": [{"name": "ledger", "hostPath": {"path": self.dir, "type": "Directory"}}],
            "containers": [{
                "name": "main",
                "image": image("busybox"),
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "ledger", "mountPath": "/ledger"}],
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}
                }
            }]
        }})
    }

    pub fn dump(&self) -> String {
        format!(
            "ledger {}:\n{}",
            self.dir.display(),
            self.lines().join("\n")
        )
    }
}

/// The workload: `start`, a `beat` a second for `beats` seconds, then `end`, each line with its
/// run and epoch.
pub fn ledger_script(beats: u32, ignore_term: bool) -> String {
    let trap = if ignore_term { "trap '' TERM; " } else { "" };
    format!(
        "{trap}L=/ledger/ledger; echo \"start $COJOB_RUN_ID $COJOB_EPOCH\" >> $L; i=0; \
         while [ $i -lt {beats} ]; do echo \"beat $COJOB_RUN_ID $COJOB_EPOCH\" >> $L; sleep 1; \
         i=$((i+1)); done; echo \"end $COJOB_RUN_ID $COJOB_EPOCH\" >> $L"
    )
}

/// Sets the controller Deployment's replicas and waits until that many controller pods exist
/// (0: none left at all).
async fn scale_controller(ctx: &Ctx, replicas: i32) -> anyhow::Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), RELEASE_NS);
    deployments
        .patch(
            RELEASE,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), RELEASE_NS);
    wait_for(
        &format!("{replicas} controller pod(s) ready"),
        Duration::from_secs(90),
        || async {
            let list = pods.list(&ListParams::default()).await?.items;
            let controllers: Vec<&Pod> = list
                .iter()
                .filter(|p| {
                    p.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with(RELEASE) && !n.contains("drain"))
                })
                .collect();
            let ready = controllers
                .iter()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|c| {
                                c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                            })
                })
                .count();
            let done = if replicas == 0 {
                controllers.is_empty()
            } else {
                ready >= usize::try_from(replicas).unwrap_or(0)
            };
            Ok(done.then_some(()))
        },
    )
    .await
}

/// The exit code of the pod's main container, once it terminated.
pub fn main_exit(pod: &Pod) -> Option<i32> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == "main")?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

/// f. G2: deleted after success while no controller runs.
pub async fn deleted_after_success(ctx: Arc<Ctx>, ns: String) -> anyhow::Result<()> {
    let name = "succeeded-then-deleted";
    let ledger = Ledger::create(&ns)?;
    let tracker = PodTracker::start(&ctx.client, &ns, name);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    create_job(
        &ctx,
        &ns,
        name,
        json!({
            "lease": {"ttlSeconds": TTL},
            "maxAttempts": 3,
            "template": ledger.template(&ledger_script(6, false), 2),
        }),
    )
    .await?;
    let uid = job_uid(&ctx, &ns, name).await?;
    wait_for("the workload's start", Duration::from_secs(90), || async {
        Ok((ledger.count("start", Some("1")) == 1).then_some(()))
    })
    .await?;
    // The controllers go away while the workload runs.
    scale_controller(&ctx, 0).await?;
    let first = format!("{name}-once-1");
    wait_for(
        &format!("{first}'s workload to exit 0"),
        Duration::from_secs(60),
        || async {
            let p = pods.get_opt(&first).await?;
            Ok(p.as_ref()
                .and_then(main_exit)
                .filter(|c| *c == 0)
                .map(|_| ()))
        },
    )
    .await?;
    pods.delete(&first, &DeleteParams::default()).await?;
    // Longer than the lease's ttl plus the skew allowance: a controller that judged by the
    // lease alone would take the run for lost.
    tokio::time::sleep(Duration::from_secs(TTL + 5 + 3)).await;
    ensure!(
        pods.get_opt(&first).await?.is_some(),
        "the deleted pod is gone before its result was recorded: no result finalizer?"
    );
    scale_controller(&ctx, 2).await?;
    let lease = terminal_once_lease(
        &ctx,
        &ns,
        name,
        &uid,
        "the run to be recorded",
        Duration::from_secs(60),
    )
    .await?;
    wait_for(
        &format!("{first} to go"),
        Duration::from_secs(30),
        || async { Ok(pods.get_opt(&first).await?.is_none().then_some(())) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(SWEEP + 2)).await;
    let seen = tracker.seen();
    let ends = ledger.count("end", None);
    ensure!(
        // Recorded at the attempt's own epoch: the holder is derived, so deleting the pod and
        // its Secret loses nothing.
        lease.status() == Some("succeeded")
            && lease.epoch == 1
            && lease.attempt() == Some(1)
            && ends == 1
            && seen.len() == 1,
        "G2 broken: lease {} at epoch {}, {ends} completed effect(s), pods {:?}\n{}",
        lease.state,
        lease.epoch,
        seen.keys().collect::<Vec<_>>(),
        ledger.dump()
    );
    println!(
        "f: ok: the success of a pod deleted while no controller ran was recorded (epoch {}); 1 effect, 1 pod",
        lease.epoch
    );
    Ok(())
}

pub use cojob_e2e::{sidecar_pid, signal};

/// h. G3: a frozen sidecar next to a workload that ignores SIGTERM.
pub async fn frozen_sidecar(ctx: Arc<Ctx>, ns: String) -> anyhow::Result<()> {
    let name = "frozen-sidecar";
    let ledger = Ledger::create(&ns)?;
    create_job(
        &ctx,
        &ns,
        name,
        json!({
            "lease": {"ttlSeconds": TTL},
            "maxAttempts": 3,
            "template": ledger.template(&ledger_script(25, true), 30),
        }),
    )
    .await?;
    let uid = job_uid(&ctx, &ns, name).await?;
    wait_for("the workload's start", Duration::from_secs(90), || async {
        Ok((ledger.count("start", Some("1")) == 1).then_some(()))
    })
    .await?;
    let first = format!("{name}-once-1");
    let pid = sidecar_pid(&first).with_context(|| format!("no sidecar process for {first}"))?;
    signal(pid, "-STOP")?;
    let frozen = tokio::time::Instant::now();
    // Frozen until the controller took over and the new attempt's workload started.
    let outcome = wait_for(
        "epoch 2's workload to start",
        Duration::from_secs(60),
        || async { Ok((ledger.count("start", Some("2")) >= 1).then_some(())) },
    )
    .await;
    let _ = signal(pid, "-CONT");
    outcome.with_context(|| ledger.dump())?;
    println!(
        "h: the takeover's workload started {:?} after the sidecar froze",
        frozen.elapsed()
    );
    let lease = terminal_once_lease(
        &ctx,
        &ns,
        name,
        &uid,
        "the run to end",
        Duration::from_secs(90),
    )
    .await?;
    let overlaps = ledger.overlaps();
    let ends = ledger.count("end", None);
    ensure!(
        overlaps.is_empty() && ends == 1 && lease.status() == Some("succeeded"),
        "G3 broken: {} overlapping line(s) {overlaps:?}, {ends} completed effect(s), lease {}\n{}",
        overlaps.len(),
        lease.state,
        ledger.dump()
    );
    println!(
        "h: ok: epoch {} completed the run; epoch 1's workload was dead before it started (0 overlaps, 1 effect)",
        lease.epoch
    );
    Ok(())
}
