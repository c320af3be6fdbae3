//! Conformance against a real S3 server on 127.0.0.1 (`COJOB_TEST_S3_URL`, `AWS_*`): the same
//! primitive suite as on memory, plus race tests of the server itself.
mod common;
mod conformance;
mod suite;

primitive_suite!(common::Kind::S3);
server_races!(common::Kind::S3);

#[tokio::test]
async fn a_missing_bucket_fails_the_probe_with_a_clear_error() {
    common::required_env("COJOB_TEST_S3_URL");
    let store = cojob::Store::open("s3://cojob-no-such-bucket/p")
        .await
        .unwrap();
    let err = store.verify_conditional_writes().await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("cojob-no-such-bucket") || text.contains("NoSuchBucket"),
        "{text}"
    );
}
