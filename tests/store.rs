//! Layer-0 properties that are specific to a backend, and the capability probe.
mod common;

use async_trait::async_trait;
use bytes::Bytes;
use cojob::store::{Backend, ObjectStoreBackend, StoredObject};
use cojob::{PutMode, PutOutcome, Store, StoreError};
use std::sync::Arc;

#[tokio::test]
async fn file_etag_changes_on_identical_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("file://{}", dir.path().display()))
        .await
        .unwrap();
    let PutOutcome::Written(v1) = store
        .put("k", "same".into(), PutMode::IfAbsent)
        .await
        .unwrap()
    else {
        panic!("fresh")
    };
    let PutOutcome::Written(v2) = store
        .put("k", "same".into(), PutMode::IfMatch(v1.clone()))
        .await
        .unwrap()
    else {
        panic!("current version")
    };
    assert_ne!(v1, v2, "identical bytes still get a new ETag");
    // A→B→A: the stale version must not match even though the bytes are back to A.
    assert!(
        !store
            .put("k", "same".into(), PutMode::IfMatch(v1))
            .await
            .unwrap()
            .is_written()
    );
    let (body, v) = store.get("k").await.unwrap().unwrap();
    assert_eq!((&body[..], v), (&b"same"[..], v2));
}

#[tokio::test]
async fn file_store_hides_its_lock_and_temp_files() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("file://{}", dir.path().display()))
        .await
        .unwrap();
    let PutOutcome::Written(v) = store
        .put("a/b", "1".into(), PutMode::IfAbsent)
        .await
        .unwrap()
    else {
        panic!()
    };
    store
        .put("a/b", "2".into(), PutMode::IfMatch(v))
        .await
        .unwrap();
    assert!(
        dir.path().join("a/.cojob-lock.b").exists(),
        "CAS uses a sibling lock file"
    );
    assert_eq!(store.list("").await.unwrap(), ["a/b"]);
    store.delete("a/b").await.unwrap();
    let left: Vec<_> = std::fs::read_dir(dir.path().join("a")).unwrap().collect();
    assert!(
        left.is_empty(),
        "delete removes the object and its lock file: {left:?}"
    );
}

#[tokio::test]
async fn file_store_versions_foreign_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("plain.json"), b"{\"x\":1}").unwrap();
    let store = Store::open(&format!("file://{}", dir.path().display()))
        .await
        .unwrap();
    let (body, v) = store.get("plain.json").await.unwrap().unwrap();
    assert_eq!(&body[..], b"{\"x\":1}");
    assert!(
        store
            .put("plain.json", "{}".into(), PutMode::IfMatch(v.clone()))
            .await
            .unwrap()
            .is_written()
    );
    assert!(
        !store
            .put("plain.json", "{}".into(), PutMode::IfMatch(v))
            .await
            .unwrap()
            .is_written()
    );
}

#[tokio::test]
async fn open_rejects_bad_urls() {
    for url in ["not a url", "ftp://x/y", "file://relative-host/x", "s3://"] {
        let err = Store::open(url).await.unwrap_err();
        assert!(matches!(err, StoreError::InvalidUrl { .. }), "{url}: {err}");
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    let err = Store::open(&format!("file://{}", file.path().display()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::InvalidUrl { .. }),
        "a file is not a directory: {err}"
    );
}

#[tokio::test]
async fn memory_url_prefix_is_applied() {
    let store = Store::open("memory:///tenant/a").await.unwrap();
    assert_eq!(store.prefix(), "tenant/a");
    store.put("k", "v".into(), PutMode::IfAbsent).await.unwrap();
    assert_eq!(store.list("").await.unwrap(), ["k"]);
}

/// A backend that ignores conditions, like a server without conditional-write support.
#[derive(Debug)]
struct Unconditional(ObjectStoreBackend);

#[async_trait]
impl Backend for Unconditional {
    async fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        self.0.get(key).await
    }
    async fn put(
        &self,
        key: &str,
        body: Bytes,
        _: &PutMode,
        token: &str,
    ) -> Result<PutOutcome, StoreError> {
        self.0.put(key, body, &PutMode::Overwrite, token).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.0.delete(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.0.list(prefix).await
    }
}

#[tokio::test]
async fn probe_fails_closed_on_a_store_without_conditional_writes() {
    let inner = ObjectStoreBackend::new(Arc::new(object_store::memory::InMemory::new()));
    let store = Store::new(Unconditional(inner), "");
    let err = store.verify_conditional_writes().await.unwrap_err();
    assert!(
        matches!(err, StoreError::NoConditionalWrites { .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("does not honour conditional writes"),
        "{err}"
    );
    assert!(
        store.list("").await.unwrap().is_empty(),
        "the probe cleans up after failing"
    );
}

#[tokio::test]
async fn unreachable_s3_is_a_typed_unavailable_error() {
    // Nothing listens on this loopback port; the client gives up after its retries.
    let url = url::Url::parse("s3://nowhere/prefix").unwrap();
    let backend = object_store::aws::AmazonS3Builder::new()
        .with_url(url.as_str())
        .with_endpoint("http://127.0.0.1:9")
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_access_key_id("x")
        .with_secret_access_key("y")
        .with_retry(object_store::RetryConfig {
            max_retries: 1,
            retry_timeout: std::time::Duration::from_secs(2),
            ..Default::default()
        })
        .build()
        .unwrap();
    let store = Store::new(ObjectStoreBackend::new(Arc::new(backend)), "prefix");
    let err = store.get("k").await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    let db = cojob::Db::new(store);
    let err = db.claim("k", &1).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
}
