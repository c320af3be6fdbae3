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

    // Its renewals: readable (none yet: not found, not refused), not writable; another
    // epoch's: refused; any other key of its own folder: refused.
    let mine = Path::from(format!("{prefix}/{run}/credentials/1"));
    match s3.get(&mine).await {
        Err(object_store::Error::NotFound { .. }) => {}
        other => panic!("get its renewals: {other:?}"),
    }
    denied(
        s3.put(&mine, PutPayload::from_static(b"{}")).await,
        "put its renewals",
    );
    denied(
        s3.get(&Path::from(format!("{prefix}/{run}/credentials/2")))
            .await
            .map(|_| ()),
        "get another epoch's renewals",
    );
    denied(
        s3.put(
            &Path::from(format!("{prefix}/{run}/junk")),
            PutPayload::from_static(b"{}"),
        )
        .await,
        "put another key of its folder",
    );
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

/// `c` reads the run's lease (under the harness's prefix) and is refused the job's index.
async fn opens_the_lease_not_the_index(
    h: &Harness,
    keys: &cojob_controller::layout::JobKeys,
    lease_key: &str,
    c: &RunCredentials,
) {
    let s3 = as_run(c);
    s3.get(&Path::from(format!("{}/{lease_key}", h.ns)))
        .await
        .expect("the key opens the run's lease");
    denied(
        s3.get(&Path::from(format!("{}/{}", h.ns, keys.index())))
            .await
            .map(|_| ()),
        "the job's index",
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
    assert!(info.is_released(), "the lease is released: {info:?}");
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
    // Minted for 1800 s when the Secret was made (its creation time has whole seconds).
    let made = h
        .secrets()
        .get(&secret)
        .await
        .unwrap()
        .metadata
        .creation_timestamp
        .unwrap()
        .0
        .as_second();
    let life = minted.expires_at.timestamp() - made;
    assert!(
        (1795..=1801).contains(&life),
        "minted for {life} s, not 1800"
    );
    let refresh: chrono::DateTime<chrono::Utc> = field("COJOB_CREDENTIALS_REFRESH_AT")
        .parse()
        .expect("an RFC 3339 time");
    let left = (minted.expires_at - refresh).num_seconds();
    assert!(
        (718..=722).contains(&left),
        "the sidecar looks for a renewal from 60 % of the life: {left} s before the end"
    );
    opens_the_lease_not_the_index(&h, &keys, &lease_key, &minted).await;
    h.cleanup().await;
}

/// The controller's bucket on MinIO under the test's prefix, on the harness's fake clock.
fn controller_db(h: &Harness) -> Db {
    let own = controller_builder()
        .with_url(minio_url(&h.ns))
        .build()
        .expect("MinIO");
    Db::new(Store::new(ObjectStoreBackend::new(Arc::new(own)), &h.ns)).with_clock(h.clock.clone())
}

/// A controller context on `db` that mints 15-minute credentials.
fn minting_context(h: &Harness, db: &Db) -> Arc<cojob_controller::context::Context> {
    let url = minio_url(&h.ns);
    h.context_on(db.clone(), &Budget::unlimited(), |s| {
        s.bucket = url.clone();
        s.minter = Some(Arc::new(
            Minter::with_builder(&url, sts(Duration::from_secs(900)), controller_builder())
                .expect("a minter"),
        ));
    })
}

/// At half their life a running attempt's credentials are renewed, once, sealed for its
/// holder next to its lease; a restarted controller reads what was renewed instead of minting
/// again.
#[tokio::test]
async fn credentials_are_renewed_at_half_life_once_and_sealed_for_the_holder() {
    use cojob_controller::credentials::renewable::renewal_key;
    use cojob_controller::credentials::sealed::unseal;
    let h = Harness::new("it-sts-renew").await;
    let db = controller_db(&h);
    let cx = minting_context(&h, &db);
    // No node runs the pod (the harness's template): the attempt stays pending, which is
    // still an attempt whose pod may run.
    h.create_job("long", json!({"lease": {"ttlSeconds": 3600}}))
        .await;
    let keys = h.keys("long").await;
    let lease_key = keys.lease("long-once");
    let doc_key = renewal_key(&lease_key, 1);
    let raw = async |key: &str| db.store().get(key).await.expect("get").map(|(b, _)| b);
    h.reconcile_with(&cx, "long").await.expect("dispatch");
    let created = h.pods().get("long-once-1").await.expect("the pod");
    let created_at = chrono::DateTime::from_timestamp(
        created.metadata.creation_timestamp.unwrap().0.as_second(),
        0,
    )
    .unwrap();
    h.reconcile_with(&cx, "long").await.expect("a pass");
    assert!(raw(&doc_key).await.is_none(), "renewed before half-life");

    // Half of the 900 s life has passed (on the controller's clock).
    tokio::time::sleep(Duration::from_secs(2)).await;
    h.clock.set(created_at + chrono::Duration::seconds(451));
    h.reconcile_with(&cx, "long")
        .await
        .expect("the renewing pass");
    let body = raw(&doc_key).await.expect("the renewal is written");
    let holder = h.derived_holder("long", "long-once", 1).await;
    let renewal = unseal(&holder, &lease_key, 1, &body).expect("it opens with the holder");
    assert!(
        unseal(
            &h.derived_holder("long", "long-once", 2).await,
            &lease_key,
            1,
            &body
        )
        .is_err(),
        "another attempt's holder opened it"
    );
    let c = &renewal.credentials;
    let life = (c.expires_at - renewal.refresh_at).num_seconds();
    assert!(
        (355..=365).contains(&life),
        "the sidecar looks from 60 % of the life: {life} s left"
    );
    opens_the_lease_not_the_index(&h, &keys, &lease_key, c).await;

    // Renewed once: later passes, and a restarted controller whose clock is past the first
    // credentials' half-life but not the renewal's, leave it as it is.
    h.clock.set(c.expires_at - chrono::Duration::seconds(451));
    h.reconcile_with(&cx, "long").await.expect("a pass");
    let restarted = minting_context(&h, &db);
    h.reconcile_with(&restarted, "long")
        .await
        .expect("a restarted controller's pass");
    assert_eq!(raw(&doc_key).await.as_ref(), Some(&body), "minted again");

    // At the renewal's own half-life, the next one.
    h.clock.set(c.expires_at - chrono::Duration::seconds(449));
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.reconcile_with(&restarted, "long")
        .await
        .expect("the second renewal");
    let next = unseal(&holder, &lease_key, 1, &raw(&doc_key).await.unwrap()).unwrap();
    assert!(
        next.credentials.expires_at > c.expires_at,
        "{next:?} after {renewal:?}"
    );
    h.cleanup().await;
}

/// The sidecar takes the renewal sealed for it: starting with credentials that may read
/// nothing but its renewals, it attaches to its lease only by signing with the renewed ones.
#[tokio::test]
async fn the_sidecar_signs_with_the_renewal_it_unseals() {
    use cojob_controller::credentials::renewable::renewal_key;
    use cojob_controller::credentials::sealed::{Renewal, seal};
    let prefix = format!("sts-sidecar-{}", std::process::id());
    let url = minio_url(&prefix);
    let root = controller_builder().with_url(&url).build().expect("MinIO");
    let db = Db::new(Store::new(ObjectStoreBackend::new(Arc::new(root)), &prefix));
    let folder = "v1/jobs/t/j/u/runs/j-once";
    let lease_key = format!("{folder}/lease");
    let holder = cojob::new_holder();
    db.lease(
        &lease_key,
        cojob::LeaseOptions::new(holder.clone(), Duration::from_secs(30)),
    )
    .await
    .expect("acquire")
    .expect("free");
    let m = minter(&prefix);
    let renewals_only = json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Action": ["s3:GetObject"],
            "Resource": [format!("arn:aws:s3:::cojob-test/{prefix}/{folder}/credentials/1")],
        }],
    });
    let only_renewals = m
        .mint_with_policy(
            &renewals_only.to_string(),
            "renewals-only",
            Duration::from_secs(900),
        )
        .await
        .expect("minted");
    let full = m
        .mint(folder, "j-once", 1, Duration::from_secs(1000))
        .await
        .expect("minted");
    let now = chrono::Utc::now();
    let sidecar = |c: &RunCredentials,
                   refresh_at: chrono::DateTime<chrono::Utc>,
                   shared: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_cojob"))
            .arg("sidecar")
            .env_clear()
            .env("AWS_ENDPOINT_URL", endpoint())
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", &c.access_key_id)
            .env("AWS_SECRET_ACCESS_KEY", &c.secret_access_key)
            .env("AWS_SESSION_TOKEN", &c.session_token)
            .env("COJOB_CREDENTIALS_EXPIRE_AT", c.expires_at.to_rfc3339())
            .env("COJOB_CREDENTIALS_REFRESH_AT", refresh_at.to_rfc3339())
            .env("COJOB_BUCKET", &url)
            .env("COJOB_LEASE_KEY", &lease_key)
            .env("COJOB_EPOCH", "1")
            .env("COJOB_HOLDER", &holder)
            .env("COJOB_LEASE_TTL_SECONDS", "30")
            .env("COJOB_SHARED_DIR", shared)
            .env("POD_UID", "uid-a")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the sidecar")
    };
    let body = seal(
        &holder,
        &lease_key,
        1,
        &Renewal {
            credentials: full.clone(),
            refresh_at: now + chrono::Duration::seconds(500),
        },
    )
    .unwrap();
    db.store()
        .put(
            &renewal_key(&lease_key, 1),
            body.into(),
            cojob::PutMode::Overwrite,
        )
        .await
        .expect("plant the renewal");

    // Control: before its refresh time it signs with what it has, and cannot attach.
    let shared = tempfile::tempdir().unwrap();
    let early = sidecar(
        &only_renewals,
        now + chrono::Duration::seconds(300),
        shared.path(),
    );
    let out = tokio::task::spawn_blocking(move || early.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(!out.status.success(), "attached without the renewal");
    let running = async || {
        db.inspect_lease(&lease_key).await.unwrap().unwrap().state["status"] == json!("running")
    };
    assert!(!running().await);

    // From its refresh time on, it takes the renewal, attaches and records `running`.
    let shared = tempfile::tempdir().unwrap();
    let mut due = sidecar(
        &only_renewals,
        now - chrono::Duration::seconds(1),
        shared.path(),
    );
    let start = std::time::Instant::now();
    while !running().await {
        if let Some(status) = due.try_wait().unwrap() {
            let out = due.wait_with_output().unwrap();
            panic!(
                "the sidecar exited ({status}) before attaching: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "not running within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = due.kill();
    let out = due.wait_with_output().unwrap();
    let log =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("took the renewed store credentials"), "{log}");
    assert!(
        !log.contains(&full.secret_access_key) && !log.contains(&holder),
        "a secret in the log"
    );

    // While it runs, with a ttl whose renewals are 10 s apart: it wakes at its refresh time
    // (3 s on) and takes the renewal then.
    let first = m
        .mint(folder, "j-once", 1, Duration::from_secs(900))
        .await
        .expect("minted");
    let shared = tempfile::tempdir().unwrap();
    let mut running_one = sidecar(
        &first,
        chrono::Utc::now() + chrono::Duration::seconds(3),
        shared.path(),
    );
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(
        running_one.try_wait().unwrap().is_none(),
        "the sidecar stopped"
    );
    let _ = running_one.kill();
    let out = running_one.wait_with_output().unwrap();
    let log =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("sidecar attached"), "{log}");
    assert!(
        log.contains("took the renewed store credentials"),
        "not taken within 7 s: {log}"
    );
}
