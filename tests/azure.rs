//! Conformance against Azurite on 127.0.0.1 (`COJOB_TEST_AZ_URL`, `AZURE_*`): the same primitive
//! suite as on memory, plus race tests of the server itself.
mod common;
mod conformance;
mod suite;

primitive_suite!(common::Kind::Azure);
server_races!(common::Kind::Azure);

#[tokio::test]
async fn wrong_credentials_are_a_typed_access_denied_error() {
    use cojob::store::ObjectStoreBackend;
    use cojob::{Store, StoreError};
    let url = common::required_env("COJOB_TEST_AZ_URL");
    let backend = object_store::azure::MicrosoftAzureBuilder::from_env()
        .with_url(url.as_str())
        .with_access_key("d3Jvbmcta2V5LW5vdC10aGUtZW11bGF0b3Itb25l")
        .build()
        .unwrap();
    let store = Store::new(
        ObjectStoreBackend::new(std::sync::Arc::new(backend)),
        "denied",
    );
    let err = store.get("k").await.unwrap_err();
    assert!(matches!(err, StoreError::AccessDenied { .. }), "{err:?}");
    let err = store.verify_conditional_writes().await.unwrap_err();
    assert!(matches!(err, StoreError::AccessDenied { .. }), "{err:?}");
    let err = cojob::Db::new(store).claim("k", &1).await.unwrap_err();
    assert!(err.to_string().contains("access denied"), "{err}");
}

#[tokio::test]
async fn a_missing_container_is_a_typed_error() {
    common::required_env("COJOB_TEST_AZ_URL");
    let store = cojob::Store::open("az://cojob-no-such-container/p")
        .await
        .unwrap();
    let err = store.get("k").await.unwrap_err();
    assert!(
        matches!(err, cojob::StoreError::NoSuchBucket { .. }),
        "a read is not \"no document\": {err:?}"
    );
    let err = store.verify_conditional_writes().await.unwrap_err();
    assert!(
        matches!(err, cojob::StoreError::NoSuchBucket { .. }),
        "{err:?}"
    );
    assert!(!format!("{err}").contains("<?xml"), "{err}");
}
