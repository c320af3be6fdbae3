//! Helpers for cojob's end-to-end tests, which run against a real cluster named by `KUBECONFIG`
//! (the local one from `e2e/cluster/up`, or kind from `e2e/kind/up`) and a real S3 server named
//! by `COJOB_TEST_S3_URL` and the `AWS_*` variables.

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use std::time::Duration;

/// The image names the cluster scripts import (overridable for kind).
pub fn image(name: &str) -> String {
    let var = format!("COJOB_E2E_IMAGE_{}", name.to_ascii_uppercase());
    std::env::var(var).unwrap_or_else(|_| match name {
        "cojob" => "localhost/cojob/cojob:dev".into(),
        "busybox" => "localhost/cojob/busybox:e2e".into(),
        other => format!("localhost/cojob/{other}:e2e"),
    })
}

/// A required environment variable, or a panic that says how to get it.
pub fn required_env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: end-to-end tests need a cluster and the S3 server. Run \
             `e2e/cluster/up` and `source /var/lib/cojob-e2e/env`, or run every test with `ci/test`."
        )
    })
}

/// A client for the cluster of `KUBECONFIG` (which must be set).
pub async fn client() -> Client {
    required_env("KUBECONFIG");
    Client::try_default()
        .await
        .expect("a client for the cluster in KUBECONFIG")
}

/// A fresh namespace, deleted on drop of the returned guard's `cleanup`.
pub struct TestNamespace {
    /// The namespace's name.
    pub name: String,
    client: Client,
}

impl TestNamespace {
    /// Creates `prefix-<random>` and waits for its default service account.
    pub async fn create(client: &Client, prefix: &str) -> TestNamespace {
        let suffix: String = cojob::new_holder()
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(8)
            .collect::<String>()
            .to_ascii_lowercase();
        let name = format!("{prefix}-{suffix}");
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"cojob.dev/e2e": "true"}}
        }))
        .expect("namespace");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("create namespace");
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        for _ in 0..60 {
            if sas.get_opt("default").await.expect("get sa").is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        TestNamespace {
            name,
            client: client.clone(),
        }
    }

    /// Deletes the namespace (and everything in it).
    pub async fn cleanup(self) {
        let _ = Api::<Namespace>::all(self.client)
            .delete(&self.name, &DeleteParams::background())
            .await;
    }
}

/// Polls a pod until `done` holds, or fails with its status after `timeout`.
pub async fn wait_for_pod(
    pods: &Api<Pod>,
    name: &str,
    timeout: Duration,
    done: impl Fn(&Pod) -> bool,
) -> Pod {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let pod = pods.get(name).await.expect("get pod");
        if done(&pod) {
            return pod;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "pod {name} did not reach the expected state in {timeout:?}; status: {}",
                serde_json::to_string_pretty(&pod.status).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The AWS environment of this process, to pass on to pods that reach the S3 server.
pub fn aws_env() -> Vec<serde_json::Value> {
    [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ALLOW_HTTP",
    ]
    .iter()
    .map(|k| serde_json::json!({"name": k, "value": required_env(k)}))
    .collect()
}
