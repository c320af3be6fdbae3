//! Short-lived run credentials minted with STS, against a real STS: MinIO's (`ci/test-servers`).
//! What a minted key may do is checked with real S3 requests: its run's folder only.

mod support;

use cojob::store::ObjectStoreBackend;
use cojob::{Db, Store};
use cojob_controller::credentials::{MintError, Minter, RunCredentials, StsSettings};
use cojob_test_support::required_env;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use support::{Budget, Harness};

fn endpoint() -> String {
    required_env("COJOB_TEST_MINIO_ENDPOINT")
}

/// A builder of MinIO's bucket with `key`/`secret` (nothing from the environment: the tests'
/// variables are the other S3 server's).
fn builder(key: &str, secret: &str) -> AmazonS3Builder {
    AmazonS3Builder::new()
        .with_endpoint(endpoint())
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_access_key_id(key)
        .with_secret_access_key(secret)
}

fn sts(duration: Duration) -> StsSettings {
    StsSettings {
        role_arn: "arn:aws:iam::000000000000:role/cojob-runs".into(),
        endpoint: Some(endpoint()),
        region: "us-east-1".into(),
        duration,
    }
}

/// MinIO's bucket under `prefix`, as its URL.
fn minio_url(prefix: &str) -> String {
    format!("{}/{prefix}", required_env("COJOB_TEST_MINIO_URL"))
}

/// The controller's own (root) credentials on MinIO.
fn controller_builder() -> AmazonS3Builder {
    builder(
        &required_env("COJOB_TEST_MINIO_ACCESS_KEY_ID"),
        &required_env("COJOB_TEST_MINIO_SECRET_ACCESS_KEY"),
    )
}

fn minter(prefix: &str) -> Minter {
    Minter::with_builder(
        &minio_url(prefix),
        sts(Duration::from_secs(1800)),
        controller_builder(),
    )
    .expect("a minter")
}

/// The bucket as the minted credentials see it.
fn as_run(c: &RunCredentials) -> AmazonS3 {
    builder(&c.access_key_id, &c.secret_access_key)
        .with_token(&c.session_token)
        .with_url(required_env("COJOB_TEST_MINIO_URL"))
        .build()
        .expect("a store")
}

fn denied(r: Result<impl std::fmt::Debug, object_store::Error>, what: &str) {
    match r {
        Err(
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. },
        ) => {}
        // A refused delete comes back as a generic error with S3's code.
        Err(e @ object_store::Error::Generic { .. }) if e.to_string().contains("AccessDenied") => {}
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_minted_key_opens_only_its_runs_folder_and_expires() {
    let prefix = format!("sts-{}", std::process::id());
    let m = minter(&prefix);
    let run = "v1/jobs/team-a/nightly/u1/runs/nightly-1786240800";
    let before = chrono::Utc::now();
    let c = m
        .mint(run, "nightly-1786240800", 1, Duration::from_secs(900))
        .await
        .expect("minted");
    let expires_in = (c.expires_at - before).num_seconds();
    assert!(
        (890..=910).contains(&expires_in),
        "expires in {expires_in} s"
    );
    assert!(!c.session_token.is_empty());

    let s3 = as_run(&c);
    let lease = Path::from(format!("{prefix}/{run}/lease"));
    s3.put(&lease, PutPayload::from_static(b"{}"))
        .await
        .expect("put its lease");
    let got = s3
        .get(&lease)
        .await
        .expect("get its lease")
        .bytes()
        .await
        .unwrap();
    assert_eq!(&got[..], b"{}");
    s3.put(
        &Path::from(format!("{prefix}/{run}/steps/a")),
        PutPayload::from_static(b"1"),
    )
    .await
    .expect("put a step of its run");

    // Another run of the same job, another namespace, the job's index: refused.
    for other in [
        "v1/jobs/team-a/nightly/u1/runs/nightly-1786240860/lease",
        "v1/jobs/team-b/nightly/u2/runs/nightly-1786240800/lease",
        "v1/jobs/team-a/nightly/u1/index",
        "v1/jobs/team-a/nightly/u1/runs/nightly-1786240800-x/lease",
    ] {
        let key = Path::from(format!("{prefix}/{other}"));
        denied(
            s3.put(&key, PutPayload::from_static(b"{}")).await,
            &format!("put {other}"),
        );
        denied(s3.get(&key).await.map(|_| ()), &format!("get {other}"));
    }
    // The same run under another store prefix: refused too.
    denied(
        s3.put(
            &Path::from(format!("elsewhere/{run}/lease")),
            PutPayload::from_static(b"{}"),
        )
        .await,
        "put under another prefix",
    );
    // No delete, no listing.
    denied(s3.delete(&lease).await, "delete its own lease");
    let listed =
        futures::TryStreamExt::try_collect::<Vec<_>>(s3.list(Some(&Path::from(prefix.as_str()))))
            .await;
    denied(listed, "list the prefix");
}

#[tokio::test]
async fn a_controller_with_wrong_credentials_gets_a_clear_error() {
    let url = format!("{}/sts-wrong", required_env("COJOB_TEST_MINIO_URL"));
    let m = Minter::with_builder(
        &url,
        sts(Duration::from_secs(900)),
        builder(
            &required_env("COJOB_TEST_MINIO_ACCESS_KEY_ID"),
            "not-the-secret",
        ),
    )
    .unwrap();
    let e = m
        .mint("v1/jobs/a/b/c/runs/r", "r", 1, Duration::from_secs(900))
        .await
        .expect_err("wrong credentials mint nothing");
    assert!(matches!(e, MintError::Sts(_)), "{e}");
    let shown = e.to_string();
    assert!(
        shown.contains("AccessDenied") && shown.contains("signature"),
        "{shown}"
    );
    assert!(
        !shown.contains("RequestId") && !shown.contains("<?xml"),
        "the raw reply: {shown}"
    );
}

/// A run on the real kubelet whose sidecar has nothing but its minted credentials (nothing
/// forwarded but the endpoint and region): it attaches, records the success, and releases.
#[tokio::test]
async fn a_run_pod_completes_with_nothing_but_its_minted_credentials() {
    let h = Harness::new("it-sts").await;
    let url = minio_url(&h.ns);
    let own = controller_builder().with_url(&url).build().expect("MinIO");
    let db = Db::new(Store::new(ObjectStoreBackend::new(Arc::new(own)), &h.ns));
    let cx = h.context_on(db.clone(), &Budget::unlimited(), |s| {
        s.bucket = url.clone();
        s.forwarded_env = [
            ("AWS_REGION", "us-east-1".to_string()),
            ("AWS_ENDPOINT_URL", endpoint()),
            ("AWS_ALLOW_HTTP", "true".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        s.minter = Some(Arc::new(minter(&h.ns)));
    });
    h.create_job(
        "paid",
        json!({
            "lease": {"ttlSeconds": 30},
            "activeDeadlineSeconds": 1200,
            "template": {"spec": {
                "nodeSelector": null,
                "hostNetwork": true,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 2,
                "containers": [{
                    "name": "main",
                    "image": "localhost/cojob/busybox:e2e",
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "echo paid once"]
                }]
            }}
        }),
    )
    .await;
    let keys = h.keys("paid").await;
    let lease_key = keys.lease("paid-once");
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let info = loop {
        if let Err(e) = h.reconcile_with(&cx, "paid").await {
            panic!("a pass failed: {e}");
        }
        if let Some(info) = db.inspect_lease(&lease_key).await.expect("read the lease")
            && info.state.get("status").and_then(|s| s.as_str()) == Some("succeeded")
        {
            break info;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the run did not succeed within 180 s; pods: {:?}",
            h.pods().list(&ListParams::default()).await.map(|l| l
                .items
                .iter()
                .map(|p: &Pod| (
                    p.metadata.name.clone(),
                    p.status.clone().and_then(|s| s.phase)
                ))
                .collect::<Vec<_>>())
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert_eq!(info.epoch, 1, "{info:?}");
    assert!(
        info.is_released(),
        "the sidecar released the lease: {info:?}"
    );
    assert_eq!(info.state.get("exit_code"), Some(&json!(0)), "{info:?}");

    // The pod's Secret holds minted credentials, not the controller's, and they open
    // nothing but the run's folder.
    let secret = h
        .secret_name_of("paid-once-1")
        .await
        .expect("the pod names its holder Secret");
    let data = h
        .secrets()
        .get(&secret)
        .await
        .expect("the holder Secret")
        .data
        .unwrap_or_default();
    let field = |k: &str| {
        String::from_utf8(
            data.get(k)
                .unwrap_or_else(|| panic!("no {k} in the Secret"))
                .0
                .clone(),
        )
        .unwrap()
    };
    let minted = RunCredentials {
        access_key_id: field("AWS_ACCESS_KEY_ID"),
        secret_access_key: field("AWS_SECRET_ACCESS_KEY"),
        session_token: field("AWS_SESSION_TOKEN"),
        expires_at: field("COJOB_CREDENTIALS_EXPIRE_AT")
            .parse()
            .expect("an RFC 3339 time"),
    };
    assert_ne!(
        minted.access_key_id,
        required_env("COJOB_TEST_MINIO_ACCESS_KEY_ID")
    );
    assert!(
        !data
            .values()
            .any(|v| v.0 == required_env("COJOB_TEST_MINIO_SECRET_ACCESS_KEY").as_bytes()),
        "the controller's secret key reached the run's Secret"
    );
    let left = (minted.expires_at - chrono::Utc::now()).num_seconds();
    assert!(
        (1150..=1230).contains(&left),
        "deadline 1200 s + ttl 30 s, yet {left} s left"
    );
    let s3 = as_run(&minted);
    s3.get(&Path::from(format!("{}/{lease_key}", h.ns)))
        .await
        .expect("the run's own lease");
    denied(
        s3.get(&Path::from(format!("{}/{}", h.ns, keys.index())))
            .await
            .map(|_| ()),
        "the job's index",
    );
    h.cleanup().await;
}
