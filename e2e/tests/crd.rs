//! The CoordinatedJob CRD on a real apiserver: it installs, and bad specs are rejected at apply
//! time with a readable message (schema and CEL), while a good one is accepted.

use cojob_e2e::{TestNamespace, client, install_crd};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};
use std::time::Duration;

fn spec(patch: Value) -> Value {
    let mut spec = json!({
        "schedule": "*/10 * * * * *",
        "timeZone": "Europe/Paris",
        "lease": {"ttlSeconds": 30},
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}
    });
    if let (Value::Object(base), Value::Object(p)) = (&mut spec, patch) {
        base.extend(p);
    }
    spec
}

#[tokio::test]
async fn invalid_specs_are_rejected_at_apply_time() {
    let client = client().await;
    install_crd(&client, "cojob-e2e", Duration::from_secs(30)).await;
    let ns = TestNamespace::create(&client, "crd").await;
    let gvk = GroupVersionKind::gvk("cojob.dev", "v1alpha1", "CoordinatedJob");
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &ApiResource::from_gvk(&gvk));
    let create = |name: &str, spec: Value| {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cojob.dev/v1alpha1", "kind": "CoordinatedJob",
            "metadata": {"name": name}, "spec": spec
        }))
        .unwrap();
        let api = api.clone();
        async move {
            api.create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &obj,
            )
            .await
        }
    };

    create("good", spec(json!({})))
        .await
        .expect("a valid spec is accepted");
    create("once", spec(json!({"schedule": null})))
        .await
        .expect("no schedule: one run");

    let cases = [
        (
            "bad-cron",
            json!({"schedule": "* * *"}),
            "schedule must have 5 fields",
        ),
        (
            "seven-fields",
            json!({"schedule": "0 0 0 * * * 2026"}),
            "schedule must have 5 fields",
        ),
        (
            "bad-zone",
            json!({"timeZone": "Mars/Olympus"}),
            "spec.timeZone: Unsupported value: \"Mars/Olympus\"",
        ),
        (
            "short-ttl",
            json!({"lease": {"ttlSeconds": 1}}),
            "lease.ttlSeconds must be between 6 and 86400",
        ),
        (
            "bad-catchup",
            json!({"catchUp": "Sometimes"}),
            "spec.catchUp: Unsupported value: \"Sometimes\"",
        ),
        (
            "bad-policy",
            json!({"concurrencyPolicy": "Maybe"}),
            "spec.concurrencyPolicy: Unsupported value",
        ),
        (
            "no-container",
            json!({"template": {"spec": {"containers": []}}}),
            "template must have at least one container",
        ),
        (
            "no-attempts",
            json!({"maxAttempts": 0}),
            "maxAttempts must be between 1 and 100",
        ),
    ];
    let long = "a".repeat(41);
    let err = create(&long, spec(json!({})))
        .await
        .expect_err("a name over 40 characters");
    assert!(
        err.to_string()
            .contains("metadata.name must be at most 40 characters"),
        "{err}"
    );
    for (name, patch, expected) in cases {
        let err = create(name, spec(patch)).await.expect_err(name);
        let text = err.to_string();
        assert!(
            text.contains(expected),
            "{name}: expected {expected:?} in: {text}"
        );
        assert!(text.contains("Invalid"), "{name}: {text}");
    }
    ns.cleanup().await;
}
