//! i. Fenced effects (G4), end to end: a run's workload records its result in a bucket of its
//!    own with `cojob fenced-put`, fenced by its attempt's `COJOB_EPOCH`. A fresh result is
//!    written with the attempt's epoch; where a newer attempt already wrote (a fence planted at
//!    epoch 7, as an attempt still running on a node nobody can reach would find it), the
//!    write is refused, the stored result is untouched, and the attempt fails with exit 3.

use super::*;

pub async fn fenced_effects(ctx: Arc<Ctx>, ns: String) -> anyhow::Result<()> {
    let effects = format!(
        "{}/e2e-effects/{}",
        required_env("COJOB_TEST_S3_URL").trim_end_matches('/'),
        random_suffix(10)
    );
    let results = cojob::Db::open(&effects).await?;
    results
        .fenced_put("late-once", 7, "from attempt 7")
        .await
        .context("plant a newer attempt's result")?;
    let template = |name: &str| {
        json!({
            "maxAttempts": 1,
            "lease": {"ttlSeconds": TTL},
            "template": {"spec": {
                "hostNetwork": true,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 2,
                "containers": [{
                    "name": "main",
                    "image": image("cojob"),
                    "imagePullPolicy": "Never",
                    "command": ["/cojob", "fenced-put", "--store", effects,
                        "--key", "$(COJOB_RUN_ID)",
                        "--value", format!("done by {name} at epoch $(COJOB_EPOCH)")],
                    "env": cojob_e2e::aws_env(),
                    "securityContext": {
                        "allowPrivilegeEscalation": false,
                        "capabilities": {"drop": ["ALL"]}
                    }
                }]
            }}
        })
    };
    for name in ["fresh", "late"] {
        create_job(&ctx, &ns, name, template(name)).await?;
    }
    let fresh_uid = job_uid(&ctx, &ns, "fresh").await?;
    let late_uid = job_uid(&ctx, &ns, "late").await?;
    let fresh = terminal_once_lease(
        &ctx,
        &ns,
        "fresh",
        &fresh_uid,
        "the fresh run to end",
        Duration::from_secs(90),
    )
    .await?;
    ensure!(
        fresh.status() == Some("succeeded"),
        "fresh: {}",
        fresh.state
    );
    let stored = results.fenced_get::<String>("fresh-once").await?;
    ensure!(
        stored
            == Some((
                fresh.epoch,
                format!("done by fresh at epoch {}", fresh.epoch)
            )),
        "fresh-once's result: {stored:?} (lease epoch {})",
        fresh.epoch
    );

    let late = terminal_once_lease(
        &ctx,
        &ns,
        "late",
        &late_uid,
        "the fenced run to end",
        Duration::from_secs(90),
    )
    .await?;
    ensure!(
        late.status() == Some("failed")
            // `cojob fenced-put`'s exit code for a refused write (`fence::STALE_EXIT`).
            && late.exit_code() == Some(3),
        "late: the refused write must fail its attempt with exit 3: {}",
        late.state
    );
    let stored = results.fenced_get::<String>("late-once").await?;
    ensure!(
        stored == Some((7, "from attempt 7".to_string())),
        "the newer attempt's result was overwritten: {stored:?}"
    );
    println!(
        "i: ok: fresh-once wrote its result at epoch {}; late-once was refused (fence 7) and failed with exit 3",
        fresh.epoch
    );
    Ok(())
}
