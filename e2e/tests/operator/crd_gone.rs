//! j. The CRD deleted while a run is active: the API server deletes every CoordinatedJob, the
//!    controller's finalizer cancels the run (its pod is stopped, the lease records
//!    `cancelled`), the CRD goes, and the controller keeps running. `helm uninstall` (g) then
//!    finds no CRD and has nothing to drain.

use super::*;

pub async fn crd_deleted_mid_run(ctx: Arc<Ctx>, ns: String) -> anyhow::Result<()> {
    let name = "crd-gone";
    create_job(&ctx, &ns, name, spec("sleep 600", json!({}))).await?;
    let uid = job_uid(&ctx, &ns, name).await?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pod = format!("{name}-once-1");
    wait_for(
        "the run's workload to run",
        Duration::from_secs(90),
        || async {
            let p = pods.get_opt(&pod).await?;
            Ok(p.as_ref()
                .is_some_and(super::chaos::main_running)
                .then_some(()))
        },
    )
    .await?;
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    crds.delete(CRD_NAME, &DeleteParams::default()).await?;
    wait_for(
        "the CRD to be gone (its objects finalized)",
        Duration::from_secs(120),
        || async { Ok(crds.get_opt(CRD_NAME).await?.is_none().then_some(())) },
    )
    .await?;
    let lease = terminal_once_lease(
        &ctx,
        &ns,
        name,
        &uid,
        "the run to be recorded",
        Duration::from_secs(30),
    )
    .await?;
    ensure!(
        lease.status() == Some("cancelled"),
        "the run was not cancelled: {}",
        lease.state
    );
    wait_for(
        "the run's pod to be gone",
        Duration::from_secs(60),
        || async { Ok(pods.get_opt(&pod).await?.is_none().then_some(())) },
    )
    .await?;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), RELEASE_NS);
    let d = deployments.get(RELEASE).await?;
    let ready = d.status.and_then(|s| s.ready_replicas).unwrap_or(0);
    ensure!(
        ready >= 1,
        "no controller is ready after the CRD went: {ready}"
    );
    println!(
        "j: ok: the CRD deleted mid-run: {pod} stopped, run cancelled, CRD gone, controller up"
    );
    Ok(())
}
