//! The cluster side of the bench: the pod both kinds run, one-shot CoordinatedJobs, paged
//! reads, parallel creation and a namespace's removal.

use std::time::Duration;

use kube::api::{ListParams, ObjectList, PartialObjectMeta, PostParams};
use kube::core::DynamicObject;
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::Nodes;

/// The pod both kinds run, running `command`: as small as a pod gets on this cluster.
pub fn pod_spec(nodes: Nodes, command: &[&str]) -> Value {
    let mut spec = json!({
        "hostNetwork": true,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "main",
            "image": cojob_e2e::image("busybox"),
            "imagePullPolicy": "Never",
            "command": command,
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}
        }]
    });
    if nodes == Nodes::Kwok {
        spec["nodeSelector"] = json!({"type": "kwok"});
        spec["tolerations"] =
            json!([{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]);
    }
    spec
}

/// Creates a one-shot CoordinatedJob `name` (no schedule: it runs once) on the real node, with
/// lease ttl `ttl` seconds, whose workload sleeps `seconds`.
pub async fn create_one_shot(
    jobs: &Api<DynamicObject>,
    name: &str,
    ttl: u64,
    seconds: u64,
) -> anyhow::Result<()> {
    let sleep = seconds.to_string();
    let job = cojob_e2e::coordinated_job(
        name,
        json!({
            "lease": {"ttlSeconds": ttl},
            "template": {"spec": pod_spec(Nodes::Real, &["sleep", &sleep])}
        }),
    );
    jobs.create(&PostParams::default(), &job).await?;
    Ok(())
}

/// Every object of `api`, read in pages of 500 (at N = 10 000 a namespace holds tens of
/// thousands of pods: one unpaged list would be hundreds of megabytes).
pub async fn list_all<K>(api: &Api<K>) -> anyhow::Result<Vec<K>>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    paged(move |params| async move { api.list(&params).await }).await
}

/// The metadata of every object of `api`, read in pages of 500: the names, labels and
/// annotations of 20 000 Jobs without their specs and statuses.
pub async fn list_all_metadata<K>(api: &Api<K>) -> anyhow::Result<Vec<PartialObjectMeta<K>>>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    paged(move |params| async move { api.list_metadata(&params).await }).await
}

/// Every item of a paged list, `page` reading one page.
async fn paged<T, F, Fut>(mut page: F) -> anyhow::Result<Vec<T>>
where
    T: Clone,
    F: FnMut(ListParams) -> Fut,
    Fut: std::future::Future<Output = kube::Result<ObjectList<T>>>,
{
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let list = page(params.clone()).await?;
        out.extend(list.items);
        match list.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(out),
        }
    }
}

/// How many objects `api` holds, from one page of one (the API server counts the rest).
pub async fn count<K>(api: &Api<K>) -> anyhow::Result<u64>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let page = api.list(&ListParams::default().limit(1)).await?;
    let rest = page
        .metadata
        .remaining_item_count
        .map_or(0, |r| r.max(0).unsigned_abs());
    Ok(page.items.len() as u64 + rest)
}

/// Runs `task(i)` for every `i` in `0..n`, 32 at a time (one client: creating 20 000 objects
/// one after the other would take longer than a tick).
pub async fn for_each_parallel<F, Fut>(n: usize, task: F) -> anyhow::Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        if set.len() >= 32
            && let Some(done) = set.join_next().await
        {
            done??;
        }
        set.spawn(task(i));
    }
    while let Some(done) = set.join_next().await {
        done??;
    }
    Ok(())
}

/// Removes a benchmark's namespace and waits (up to 15 minutes) until it is gone, so that
/// what comes next starts on an empty cluster: a namespace being removed still costs the API
/// server, and its CoordinatedJobs' finalizers still cost the controller bucket requests.
pub async fn remove_namespace(
    client: &Client,
    ns: cojob_e2e::TestNamespace,
    what: &str,
) -> anyhow::Result<()> {
    let name = ns.name.clone();
    ns.cleanup().await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let t0 = tokio::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(900) {
        if namespaces.get_opt(&name).await?.is_none() {
            println!(
                "bench: {what}: namespace {name} removed in {:?}",
                t0.elapsed()
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    println!("bench: {what}: namespace {name} still there after 15 minutes; going on");
    Ok(())
}
