//! l. The workload API and the command line, against the installed controller and real pods.
//!
//! - A run's workload checkpoints a step with `cojob step` (which appends to an effect ledger
//!   on the node) and reports its output with `cojob api PUT /v1/progress`. Its pod is deleted
//!   after the step; the respawned attempt (epoch 2) gets the first result back instead of
//!   running the step again: the ledger has one `extract` line, and the progress written at
//!   epoch 2 carries epoch 1's output.
//! - `kubectl cojob trigger --key` (the kubectl plugin), asked twice, runs one run; `kubectl
//!   cojob runs` lists it and `kubectl cojob why` explains it.

use super::faults::Ledger;
use super::*;

pub async fn workload_api_and_cli(ctx: Arc<Ctx>, ns: String) -> anyhow::Result<()> {
    let ledger = Ledger::create(&ns)?;
    let script = r#"L=/ledger/ledger; C=/var/run/cojob/cojob
out=$($C step extract -- sh -c 'echo "extract $COJOB_RUN_ID $COJOB_EPOCH" >> /ledger/ledger; echo from-epoch-$COJOB_EPOCH') || exit 1
$C api PUT /v1/progress "{\"extract\": \"$out\", \"at\": $COJOB_EPOCH}" || exit 1
sleep 3600"#;
    let mut spec = json!({"lease": {"ttlSeconds": TTL}, "maxAttempts": 3});
    spec["template"] = ledger.template(script, 1);
    create_job(&ctx, &ns, "steps", spec).await?;
    let uid = job_uid(&ctx, &ns, "steps").await?;
    let progress_at = |epoch: u64| {
        let (ctx, ns, uid) = (ctx.clone(), ns.clone(), uid.clone());
        async move {
            wait_for(
                &format!("the workload's progress at epoch {epoch}"),
                Duration::from_secs(120),
                || async {
                    let lease = once_lease(&ctx, &ns, "steps", &uid).await?;
                    let progress = lease.map(|l| l.state["progress"].clone());
                    Ok(progress.filter(|p| p["at"] == json!(epoch)))
                },
            )
            .await
        }
    };
    let first = progress_at(1).await.with_context(|| ledger.dump())?;
    ensure!(
        first["extract"] == "from-epoch-1",
        "epoch 1 progress: {first}"
    );

    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    pods.delete(
        "steps-once-1",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .context("deleting the first attempt's pod")?;
    let second = progress_at(2).await.with_context(|| ledger.dump())?;
    ensure!(
        second["extract"] == "from-epoch-1",
        "the respawned attempt got {second}, not the first attempt's step result"
    );
    ensure!(
        ledger.count("extract", None) == 1,
        "the step ran more than once: {}",
        ledger.dump()
    );

    // The command line, as the kubectl plugin, against the installed controller.
    let script = r#"echo "ran $COJOB_RUN_ID $COJOB_EPOCH $COJOB_TRIGGER" >> /ledger/ledger"#;
    let mut spec = json!({"schedule": "0 0 1 1 *", "lease": {"ttlSeconds": TTL}});
    spec["template"] = ledger.template(script, 1);
    create_job(&ctx, &ns, "manual", spec).await?;
    let job = format!("{ns}/manual");
    let bucket = ctx.bucket.as_str();
    let mut run_ids = BTreeSet::new();
    for _ in 0..2 {
        let out = run_tool(
            "kubectl",
            &[
                "cojob",
                "trigger",
                &job,
                "--key",
                "release-1",
                "--bucket",
                bucket,
                "-o",
                "json",
            ],
        )
        .await?;
        let report: Value = serde_json::from_str(&out).with_context(|| out.clone())?;
        ensure!(report["decision"] == "run", "trigger: {report}");
        run_ids.insert(report["run_id"].as_str().unwrap_or_default().to_string());
    }
    ensure!(run_ids.len() == 1, "one run for one key: {run_ids:?}");
    let run_id = run_ids.into_iter().next().unwrap_or_default();
    wait_for(
        "the manual run to succeed",
        Duration::from_secs(90),
        || async {
            let rows = run_tool(
                "kubectl",
                &["cojob", "runs", &job, "--bucket", bucket, "-o", "json"],
            )
            .await?;
            let rows: Value = serde_json::from_str(&rows)?;
            let status = rows[0]["lease"]["state"]["status"].clone();
            Ok((rows.as_array().map(Vec::len) == Some(1) && status == "succeeded").then_some(()))
        },
    )
    .await?;
    ensure!(
        ledger.count_run("ran", &run_id) == 1,
        "the manual run ran once: {}",
        ledger.dump()
    );
    let why = run_tool(
        "kubectl",
        &[
            "cojob",
            "why",
            &job,
            "trigger/release-1",
            "--bucket",
            bucket,
        ],
    )
    .await?;
    ensure!(
        why.contains(&format!("ran as {run_id}: succeeded")),
        "why: {why}"
    );
    println!(
        "l: ok: the step ran once across a respawn (epoch 2 got epoch 1's output); kubectl cojob trigger twice ran {run_id} once; runs and why report it"
    );
    Ok(())
}
