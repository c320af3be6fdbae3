//! Conformance against a real S3 server on 127.0.0.1 (`COJOB_TEST_S3_URL`, `AWS_*`): the same
//! primitive suite as on memory, plus race tests of the server itself.
mod common;
mod conformance;
mod suite;

primitive_suite!(common::Kind::S3);
server_races!(common::Kind::S3);

#[tokio::test]
async fn a_missing_bucket_is_a_typed_error_on_every_operation() {
    common::required_env("COJOB_TEST_S3_URL");
    let store = cojob::Store::open("s3://cojob-no-such-bucket/p")
        .await
        .unwrap();
    let err = store.verify_conditional_writes().await.unwrap_err();
    assert!(
        matches!(err, cojob::StoreError::NoSuchBucket { .. }),
        "{err:?}"
    );
    let text = format!("{:#}", anyhow_chain(&err));
    assert!(text.contains("NoSuchBucket"), "{text}");
    assert!(!text.contains("<?xml"), "the raw reply leaks: {text}");
    // A read is not "no document", a delete is not "already gone", and a compare-and-swap is
    // not a lost race: each is the same error.
    let get = store.get("k").await.unwrap_err();
    assert!(
        matches!(get, cojob::StoreError::NoSuchBucket { .. }),
        "{get:?}"
    );
    let delete = store.delete("k").await.unwrap_err();
    assert!(
        matches!(delete, cojob::StoreError::NoSuchBucket { .. }),
        "{delete:?}"
    );
    let cas = store
        .put(
            "k",
            bytes::Bytes::from_static(b"{}"),
            cojob::PutMode::IfMatch(cojob::Version {
                etag: Some("\"x\"".into()),
                generation: None,
            }),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(cas, cojob::StoreError::NoSuchBucket { .. }),
        "{cas:?}"
    );
}

/// Every message of an error's chain, joined as `anyhow`'s `{:#}` would.
fn anyhow_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cause = err.source();
    while let Some(e) = cause {
        out.push_str(": ");
        out.push_str(&e.to_string());
        cause = e.source();
    }
    out
}

#[tokio::test]
async fn wrong_credentials_are_access_denied_without_the_raw_reply() {
    let endpoint = common::required_env("AWS_ENDPOINT_URL");
    let base = url::Url::parse(&common::required_env("COJOB_TEST_S3_URL")).unwrap();
    let backend = object_store::aws::AmazonS3Builder::new()
        .with_url(base.as_str())
        .with_endpoint(&endpoint)
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_access_key_id("cojob-test")
        .with_secret_access_key("not-the-secret")
        .build()
        .unwrap();
    let store = cojob::Store::new(
        cojob::store::ObjectStoreBackend::new(std::sync::Arc::new(backend)),
        "wrong-credentials",
    );
    let err = store.verify_conditional_writes().await.unwrap_err();
    assert!(
        matches!(err, cojob::StoreError::AccessDenied { .. }),
        "{err:?}"
    );
    let text = anyhow_chain(&err);
    assert!(text.contains("403"), "{text}");
    assert!(
        !text.contains("<?xml") && !text.contains("StringToSign") && !text.contains("cojob-test"),
        "the raw reply (signature material, access key id) leaks: {text}"
    );
    let db = cojob::Db::new(store);
    let err = db.claim("k", &1).await.unwrap_err();
    assert!(
        !err.is_transient(),
        "wrong credentials are not retried: {err}"
    );
}
