//! m. Runs prepared ahead of their tick (`prestartSeconds`) on a real kubelet: each tick's pod
//!    is created before the tick, its sidecar attaches, and its workload still starts at the
//!    tick, never before, once per tick. The effect ledger is the workload's own clock: each run
//!    prints the second it started, which must not be before its tick. Then the job is
//!    suspended while the next tick's run waits in its start gate: that run is cancelled and
//!    its workload never runs.
//! n. A run prepared well ahead of its tick (past `cojob_controller::pod::GATE_FREE_LEAD`):
//!    its pod is created without the holder gate (the watch's first sight of it has none), its
//!    sidecar still gets its holder from the Secret created right after the pod, attaches only
//!    15 to 30 s before the tick (`cojob_controller::run::sidecar_attach_at`), and its workload
//!    starts at the tick, once.

use super::*;
use kube::ResourceExt;

/// The workload of both scenarios: it prints its tick and its own clock at its start, the
/// effect ledger that `effects_once` reads.
const LEDGER_WORKLOAD: &str = "echo effect fire=$COJOB_FIRE_TIME started=$(date +%s); sleep 1";

/// The prestart of this scenario's job, in seconds; ticks are 20 s apart.
const PRESTART: i64 = 10;

pub async fn prepared_ahead(ctx: Arc<Ctx>, ns: String) -> anyhow::Result<()> {
    let name = "ahead";
    let created = create_job(
        &ctx,
        &ns,
        name,
        spec(
            LEDGER_WORKLOAD,
            // Every run's pod is read back at the end: keep them all in the history.
            json!({
                "schedule": "*/20 * * * * *",
                "prestartSeconds": PRESTART,
                "successfulRunsHistoryLimit": 10
            }),
        ),
    )
    .await?;
    let uid = created.metadata.uid.clone().context("no uid")?;
    let created_at = created_second(&created.metadata)?;
    // Three ticks, the first with its whole prestart after the object's creation.
    let first = ((created_at + PRESTART + 2) / 20 + 1) * 20;
    let window: Vec<i64> = (0..3).map(|i| first + i * 20).collect();
    let last = *window.last().unwrap();
    println!(
        "m: {ns}/{name} created at {}; ticks {:?}",
        ts(created_at),
        window.iter().map(|t| ts(*t)).collect::<Vec<_>>()
    );
    // The pods as they are created: the watch would see them too, polling is enough at 300 ms.
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let lp = ListParams::default().labels(&format!("cojob.dev/job={name}"));
    let mut first_seen: BTreeMap<String, i64> = BTreeMap::new();
    // Then the tick after the window: once its run is decided ahead and its sidecar attached
    // (the lease says `running`, the workload waits in the start gate), the job is suspended.
    let held = last + 20;
    let held_run = loop {
        for p in pods.list(&lp).await?.items {
            first_seen.entry(p.name_any()).or_insert_with(now_secs);
        }
        if now_secs() > last {
            let rows = runs(&ctx, &ns, name, &uid).await?;
            let attached = rows.iter().find(|r| {
                r.tick_seconds() == Some(held)
                    && r.lease.as_ref().and_then(LeaseView::status) == Some("running")
            });
            if let Some(r) = attached.and_then(|r| r.decision.run_id()) {
                break r.to_string();
            }
        }
        ensure!(
            now_secs() < held - 2,
            "the run of {} was not attached ahead of its tick by {}",
            ts(held),
            ts(now_secs())
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let suspended_at = now_secs();
    suspend(&ctx, &ns, name).await?;
    println!(
        "m: {held_run} attached ahead of its tick {}; the job suspended {} s before it",
        ts(held),
        held - suspended_at
    );
    let window: Vec<i64> = window.into_iter().chain([held]).collect();
    let rows = runs_ended(&ctx, &ns, name, &uid, &window, Duration::from_secs(60)).await?;
    let table = runs_table(&rows);
    // The suspended tick: cancelled, its workload never started, no effect.
    let cancelled = rows
        .iter()
        .find(|r| r.decision.run_id() == Some(held_run.as_str()))
        .and_then(|r| r.lease.as_ref())
        .context("the held run's lease")?;
    ensure!(
        cancelled.status() == Some("cancelled"),
        "the run suspended before its tick ended {}\n{table}",
        cancelled.state
    );
    let held_log = pod_log_tail(&ns, &format!("{held_run}-1"), Some("main"), 50);
    ensure!(
        !held_log.contains("effect"),
        "the run suspended before its tick ran its workload: {held_log:?}"
    );
    if let Some(pod) = pods.get_opt(&format!("{held_run}-1")).await? {
        let started = pod
            .status
            .and_then(|s| s.container_statuses)
            .into_iter()
            .flatten()
            .any(|c| c.name == "main" && c.started == Some(true));
        ensure!(!started, "the held run's workload container started");
    }
    let window = &window[..window.len() - 1];
    let mut ahead = 0;
    for tick in window {
        let run = succeeded_once(&rows, *tick, &table)?;
        let pod = pods
            .get(&format!("{run}-1"))
            .await
            .with_context(|| format!("the pod of {run}"))?;
        let pod_created = created_second(&pod.metadata)?;
        let main_started = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.iter().find(|c| c.name == "main"))
            .and_then(|c| c.state.as_ref())
            .and_then(|s| {
                s.terminated
                    .as_ref()
                    .and_then(|t| t.started_at.clone())
                    .or_else(|| s.running.as_ref().and_then(|r| r.started_at.clone()))
            })
            .map(|t| t.0.as_second())
            .with_context(|| format!("no start time for the workload of {run}"))?;
        let effects = effects_once(&ns, &run)?;
        ensure!(
            effects[0] >= *tick && main_started >= *tick,
            "run {run} started before its tick {}: workload clock {}, container {}",
            ts(*tick),
            ts(effects[0]),
            ts(main_started)
        );
        if pod_created < *tick {
            ahead += 1;
        }
        println!(
            "m: tick {}: pod created {:+} s, workload started {:+} s (its clock {:+} s), seen by the test {:+} s",
            ts(*tick),
            pod_created - tick,
            main_started - tick,
            effects[0] - tick,
            first_seen
                .get(&pod.name_any())
                .map_or(i64::MAX, |s| s - tick),
        );
    }
    // The controller passes `prestartSeconds` before each tick; on a loaded node one pass may be
    // late, not all of them.
    ensure!(
        ahead >= window.len() - 1,
        "only {ahead} of {} pods were created before their tick\n{table}",
        window.len()
    );
    println!(
        "m: ok: {ahead} of 3 pods created ahead of their tick, every workload started at or after it, once; \
         the run suspended while it waited for its tick was cancelled, its workload never ran"
    );
    Ok(())
}

/// Scenario n's prestart, in seconds: past the 30 s from which a pod goes without the holder
/// gate (`GATE_FREE_LEAD`). Its ticks are a minute apart, so the prestart never meets an
/// earlier run still active.
const FAR_PRESTART: i64 = 45;

pub async fn prepared_without_gate(ctx: Arc<Ctx>, ns: String) -> anyhow::Result<()> {
    use futures::StreamExt;
    use kube::api::{WatchEvent, WatchParams};
    let name = "far";
    let selector = format!("cojob.dev/job={name}");
    // Watch the job's pods from before its creation: a pod's first event is its creation.
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let listed = pods.list(&ListParams::default().labels(&selector)).await?;
    let from = listed.metadata.resource_version.unwrap_or_default();
    let mut events = pods
        .watch(
            &WatchParams::default().labels(&selector).timeout(290),
            &from,
        )
        .await?
        .boxed();
    // Created in the first 10 s of a minute, so that the next tick's whole prestart comes
    // after the creation: created later, the controller prepares that tick at once, less
    // than 45 s ahead, and its pod is not the one this scenario is about.
    let second = now_secs().rem_euclid(60);
    if second >= 10 {
        tokio::time::sleep(Duration::from_secs((61 - second) as u64)).await;
    }
    let created = create_job(
        &ctx,
        &ns,
        name,
        spec(
            LEDGER_WORKLOAD,
            json!({"schedule": "0 * * * * *", "prestartSeconds": FAR_PRESTART}),
        ),
    )
    .await?;
    let uid = created.metadata.uid.clone().context("no uid")?;
    let created_at = created_second(&created.metadata)?;
    // The first tick whose whole prestart comes after the object's creation.
    let tick = ((created_at + FAR_PRESTART + 2) / 60 + 1) * 60;
    println!(
        "n: {ns}/{name} created at {}; tick {}",
        ts(created_at),
        ts(tick)
    );
    // The run's pod as created: gated or not.
    let first = tokio::time::timeout(
        Duration::from_secs((tick - now_secs() + 30).max(30) as u64),
        async {
            while let Some(event) = events.next().await {
                match event? {
                    WatchEvent::Added(pod) => return Ok::<_, anyhow::Error>(pod),
                    WatchEvent::Error(e) => bail!("the pod watch failed: {e:?}"),
                    _ => {}
                }
            }
            bail!("the pod watch ended before a pod was created")
        },
    )
    .await
    .context("no pod created by the tick")??;
    drop(events);
    let pod_name = first.name_any();
    let pod_created = created_second(&first.metadata)?;
    ensure!(
        !cojob_controller::pod::is_gated(&first),
        "pod {pod_name}, created {} s ahead of its tick, was created with the holder gate",
        tick - pod_created
    );
    ensure!(
        tick - pod_created >= 30,
        "pod {pod_name} was created {} s ahead of its tick {}, not {FAR_PRESTART}",
        tick - pod_created,
        ts(tick)
    );
    let wait = Duration::from_secs((tick - now_secs() + 90).max(90) as u64);
    let rows = runs_ended(&ctx, &ns, name, &uid, &[tick], wait).await?;
    suspend(&ctx, &ns, name).await?;
    let table = runs_table(&rows);
    let run = succeeded_once(&rows, tick, &table)?;
    ensure!(
        pod_name == format!("{run}-1"),
        "pod {pod_name} for run {run}\n{table}"
    );
    // Its sidecar attached (recorded `started_at`) only one to two leads before the tick, not
    // as its pod started 45 s ahead: the controller kept the pending lease alive until then.
    let lead = 2 * cojob_controller::run::ATTACH_LEAD.as_secs() as i64;
    let attached = rows
        .iter()
        .find(|r| r.decision.run_id() == Some(run.as_str()))
        .and_then(|r| r.lease.as_ref())
        .and_then(|l| l.state["started_at"].as_str())
        .and_then(|t| cojob::json::parse_time(t).ok())
        .map(|t| t.timestamp())
        .with_context(|| format!("run {run} recorded no attach\n{table}"))?;
    ensure!(
        attached >= tick - lead - 1 && attached < tick,
        "run {run}'s sidecar attached {} s before its tick, not within the {lead} s lead",
        tick - attached
    );
    // The effect ledger: the workload ran once, by its own clock not before the tick.
    let effects = effects_once(&ns, &run)?;
    ensure!(
        effects[0] >= tick,
        "run {run} started before its tick {}: {}",
        ts(tick),
        ts(effects[0])
    );
    println!(
        "n: ok: pod {pod_name} created {} s ahead of its tick without the holder gate; its sidecar attached {} s ahead; its workload started {:+} s after the tick, once",
        tick - pod_created,
        tick - attached,
        effects[0] - tick
    );
    Ok(())
}

/// Waits (at most `timeout`) until every tick of `ticks` is decided and its run's lease ended;
/// returns the job's runs.
async fn runs_ended(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    uid: &str,
    ticks: &[i64],
    timeout: Duration,
) -> anyhow::Result<Vec<RunRow>> {
    wait_for(
        "every tick of the window decided and its run finished",
        timeout,
        || async {
            let rows = runs(ctx, ns, name, uid).await?;
            let done = ticks.iter().all(|t| {
                rows.iter().any(|r| {
                    r.tick_seconds() == Some(*t)
                        && r.lease.as_ref().is_some_and(LeaseView::is_terminal)
                })
            });
            if done {
                Ok(Some(rows))
            } else {
                Err(anyhow!("not yet:\n{}", runs_table(&rows)))
            }
        },
    )
    .await
}

/// The run of `tick`: decided once, run, and succeeded at its first epoch.
fn succeeded_once(rows: &[RunRow], tick: i64, table: &str) -> anyhow::Result<String> {
    let at_tick: Vec<&RunRow> = rows
        .iter()
        .filter(|r| r.tick_seconds() == Some(tick))
        .collect();
    ensure!(
        at_tick.len() == 1,
        "tick {} decided {} times\n{table}",
        ts(tick),
        at_tick.len()
    );
    let run = at_tick[0]
        .decision
        .run_id()
        .with_context(|| format!("tick {} did not run\n{table}", ts(tick)))?;
    let lease = at_tick[0].lease.as_ref().context("no lease")?;
    ensure!(
        lease.status() == Some("succeeded") && lease.epoch == 1,
        "run {run}: {}\n{table}",
        lease.state
    );
    Ok(run.to_string())
}

/// The effect ledger of `run`'s first pod: the workload's own clock when it started
/// (`started=`), which it printed exactly once.
fn effects_once(ns: &str, run: &str) -> anyhow::Result<Vec<i64>> {
    let log = pod_log_tail(ns, &format!("{run}-1"), Some("main"), 50);
    let effects: Vec<i64> = log
        .lines()
        .filter_map(|l| l.split("started=").nth(1))
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    ensure!(
        effects.len() == 1,
        "run {run}: effects {effects:?} in {log:?}"
    );
    Ok(effects)
}
