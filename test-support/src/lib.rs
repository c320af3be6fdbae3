//! Helpers shared by cojob's tests that need real servers: the controller's integration tests
//! (`controller/tests/`) and the end-to-end crate (`e2e/`). The product's crates dev-depend on
//! this small crate, not on the end-to-end one.
//!
//! ```no_run
//! # async fn demo() {
//! let kubeconfig = cojob_test_support::required_env("KUBECONFIG");
//! let client = kube::Client::try_default().await.unwrap();
//! cojob_test_support::install_crd(&client, "my-test", std::time::Duration::from_secs(10)).await;
//! # }
//! ```

use std::time::Duration;

use kube::{Api, Client};

/// A required environment variable, or a panic that says how to get it: a test that needs a
/// server fails without it, it never skips.
pub fn required_env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: these tests need the local cluster and the test servers. Run \
             `e2e/cluster/up` and `source /var/lib/cojob-e2e/env`, or run every test with `ci/test`."
        )
    })
}

/// The CoordinatedJob CRD of this tree (`crds/coordinatedjob.yaml`).
pub const CRD_YAML: &str = include_str!("../../crds/coordinatedjob.yaml");

/// Installs this tree's CRD by server-side apply as `field_manager`, and waits up to `timeout`
/// for the apiserver to establish it. Panics (a test failure) otherwise.
pub async fn install_crd(client: &Client, field_manager: &str, timeout: Duration) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crd: CustomResourceDefinition =
        serde_yaml::from_str(CRD_YAML).expect("crds/coordinatedjob.yaml parses");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().expect("the CRD has a name");
    crds.patch(
        &name,
        &kube::api::PatchParams::apply(field_manager).force(),
        &kube::api::Patch::Apply(&crd),
    )
    .await
    .expect("the apiserver accepts the CRD");
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        let got = crds.get(&name).await.expect("get the CRD");
        let established = got
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("CRD {name} not established within {timeout:?}");
}
