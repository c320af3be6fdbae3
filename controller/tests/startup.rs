//! `cojob controller` refuses to start on a store it cannot use, and says why in words a user
//! can act on: a missing bucket, wrong credentials. It runs as a real process against the real
//! S3 server (`COJOB_TEST_S3_URL`, `AWS_*`); it stops before it needs the Kubernetes API.

use std::process::Command;
use std::time::{Duration, Instant};

fn required_env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run `ci/test-servers up` and source its env file, or `ci/test`")
    })
}

/// Runs the controller on `bucket` with `env` added; returns its exit status and stderr.
fn controller(bucket: &str, env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    required_env("COJOB_TEST_S3_URL");
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_cojob"))
        .args([
            "controller",
            "--bucket",
            bucket,
            "--sidecar-image",
            "unused",
        ])
        .env(
            "COJOB_HOLDER_KEY",
            "startup-test-holder-key-of-enough-bytes-0123",
        )
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .envs(env.iter().copied())
        .output()
        .expect("run cojob controller");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the refusal took {:?}",
        started.elapsed()
    );
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_missing_bucket_is_refused_naming_the_bucket() {
    let (status, stderr) = controller("s3://cojob-no-such-bucket/cojob", &[]);
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "refusing to start on s3://cojob-no-such-bucket/cojob: the bucket does not exist"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("NoSuchBucket"), "{stderr}");
    assert!(!stderr.contains("<?xml"), "the raw reply leaks: {stderr}");
}

#[test]
fn wrong_credentials_are_refused_without_the_raw_reply() {
    let bucket = format!(
        "{}/startup-denied",
        required_env("COJOB_TEST_S3_URL").trim_end_matches('/')
    );
    let (status, stderr) = controller(&bucket, &[("AWS_SECRET_ACCESS_KEY", "not-the-secret")]);
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "refusing to start on {bucket}: the store refused the credentials"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("403"), "{stderr}");
    assert!(
        !stderr.contains("StringToSign") && !stderr.contains("<?xml"),
        "signature material leaks: {stderr}"
    );
}

/// A holder key too short to be secret is refused before anything else, and never printed.
#[test]
fn a_short_holder_key_is_refused() {
    let bucket = required_env("COJOB_TEST_S3_URL");
    let (status, stderr) = controller(&bucket, &[("COJOB_HOLDER_KEY", "hunter2")]);
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("COJOB_HOLDER_KEY (--holder-key) is too short")
            && stderr.contains("at least 32 random bytes"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "the key leaks: {stderr}");
}

/// Without a terminal (as in a cluster), every log line is one JSON object, the error included;
/// `--log-format text` gives text.
#[test]
fn logs_are_json_lines_without_a_terminal() {
    let (status, stderr) = controller("s3://cojob-no-such-bucket/cojob", &[]);
    assert!(!status.success());
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let refusal = lines
        .iter()
        .find(|l| l["level"] == "ERROR")
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(
        refusal["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("refusing to start on s3://cojob-no-such-bucket/cojob")),
        "{refusal}"
    );
    assert!(
        refusal["error"]
            .as_str()
            .is_some_and(|e| e.contains("NoSuchBucket")),
        "{refusal}"
    );

    let (_, text) = controller(
        "s3://cojob-no-such-bucket/cojob",
        &[("COJOB_LOG_FORMAT", "text")],
    );
    assert!(
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_err()),
        "{text}"
    );
    assert!(text.contains("refusing to start on"), "{text}");
}

/// A leader lease too short to renew in time is refused before anything else.
#[test]
fn a_leader_lease_ttl_under_three_seconds_is_refused() {
    let bucket = required_env("COJOB_TEST_S3_URL");
    let (status, stderr) = controller(
        &bucket,
        &[
            ("COJOB_LEADER_ELECT", "true"),
            ("COJOB_LEADER_LEASE_TTL", "1s"),
        ],
    );
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("--leader-lease-ttl 1s is under 3 s"),
        "{stderr}"
    );
}

/// Minted credentials are refused together with a per-namespace credentials Secret, under
/// STS's 15 minutes, and on a store that is not S3.
#[test]
fn settings_that_cannot_mint_credentials_are_refused() {
    let bucket = required_env("COJOB_TEST_S3_URL");
    let role = (
        "COJOB_STS_ROLE_ARN",
        "arn:aws:iam::000000000000:role/cojob-runs",
    );
    for (bucket, extra, want) in [
        (
            bucket.as_str(),
            ("COJOB_SIDECAR_CREDENTIALS_SECRET", "cojob-store"),
            "--sts-role-arn and --sidecar-credentials-secret both give sidecars credentials",
        ),
        (
            bucket.as_str(),
            ("COJOB_STS_DURATION", "5m"),
            "--sts-duration 300s is under STS's minimum of 15 minutes",
        ),
        (
            "az://cojob-test/startup",
            ("COJOB_STS_DURATION", "1h"),
            "short-lived credentials need an s3:// store",
        ),
    ] {
        let (status, stderr) = controller(bucket, &[role, extra]);
        assert!(!status.success(), "{stderr}");
        assert!(stderr.contains(want), "wanted {want:?}: {stderr}");
    }
}
