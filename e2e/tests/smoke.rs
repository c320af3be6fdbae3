//! Smoke test of the cluster itself: a pod with a native sidecar (an init container with
//! `restartPolicy: Always`) that writes to the S3 server, and a main container that exits 0.
//! The pod must succeed, the objects must be in the bucket, and the sidecar must have been
//! started before and stopped after the main container.

use cojob_e2e::{TestNamespace, aws_env, client, image, required_env, wait_for_pod};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use std::time::Duration;

fn status<'a>(statuses: &'a Option<Vec<ContainerStatus>>, name: &str) -> &'a ContainerStatus {
    statuses
        .iter()
        .flatten()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no status for container {name}"))
}

#[tokio::test]
async fn native_sidecar_pod_writes_to_s3_and_stops_after_main() {
    let client = client().await;
    let bucket = required_env("COJOB_TEST_S3_URL");
    let ns = TestNamespace::create(&client, "smoke").await;
    let key = format!("e2e/smoke/{}", ns.name);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "smoke"},
        "spec": {
            "hostNetwork": true,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 20,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532},
            "initContainers": [{
                "name": "sidecar",
                "image": image("busybox"),
                "imagePullPolicy": "Never",
                "restartPolicy": "Always",
                "command": ["/usr/local/bin/cojob-smoke-sidecar", bucket, key],
                "env": aws_env(),
                "securityContext": {
                    "readOnlyRootFilesystem": true,
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}
                }
            }],
            "containers": [{
                "name": "main",
                "image": image("busybox"),
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "sleep 3; echo main done"],
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}
            }]
        }
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let done = wait_for_pod(&pods, "smoke", Duration::from_secs(180), |p| {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        phase == Some("Succeeded") || phase == Some("Failed")
    })
    .await;
    let st = done.status.clone().unwrap();
    assert_eq!(st.phase.as_deref(), Some("Succeeded"), "{st:?}");

    let main = status(&st.container_statuses, "main");
    let sidecar = status(&st.init_container_statuses, "sidecar");
    let main_run = main
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("main terminated");
    let side_run = sidecar
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("sidecar terminated");
    assert_eq!(main_run.exit_code, 0);
    assert_eq!(
        side_run.exit_code, 0,
        "the sidecar exits 0 on SIGTERM: {side_run:?}"
    );
    let (main_start, main_end) = (
        main_run.started_at.clone().unwrap().0,
        main_run.finished_at.clone().unwrap().0,
    );
    let (side_start, side_end) = (
        side_run.started_at.clone().unwrap().0,
        side_run.finished_at.clone().unwrap().0,
    );
    assert!(
        side_start <= main_start,
        "the sidecar started first: {side_start} vs {main_start}"
    );
    assert!(
        side_end >= main_end,
        "the sidecar stopped after main: {side_end} vs {main_end}"
    );

    let store = cojob::Store::open(&bucket).await.unwrap();
    let started = store.get(&format!("{key}/started")).await.unwrap();
    let stopped = store.get(&format!("{key}/stopped")).await.unwrap();
    assert!(started.is_some(), "the sidecar wrote its start object");
    let (stopped, _) = stopped.expect("the sidecar wrote its stop object after SIGTERM");
    let stopped: serde_json::Value = serde_json::from_slice(&stopped).unwrap();
    let stopped_at = cojob::json::parse_time(stopped["at"].as_str().unwrap()).unwrap();
    // finishedAt has whole seconds, so compare against the main container's second.
    assert!(
        stopped_at.timestamp() >= main_end.as_second(),
        "stop object written after main exited"
    );
    ns.cleanup().await;
}
