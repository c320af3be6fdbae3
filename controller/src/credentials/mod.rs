//! Short-lived store credentials scoped to one run, minted by the controller.
//!
//! With `--sts-role-arn`, every attempt's holder Secret carries credentials of its own instead
//! of anything forwarded: the controller calls STS `AssumeRole` with a *session policy* that
//! allows only `s3:GetObject` and `s3:PutObject` under the run's folder
//! (`<prefix>/v1/jobs/<namespace>/<job>/<uid>/runs/<run>/`: its lease and steps, and the
//! renewals of its own epoch, read-only), for a limited time. Whoever reads
//! that Secret (anyone who may create pods in the namespace) gets a key that opens one run's
//! lease and steps until it expires: not another run's, not another namespace's, not the
//! index or the tick claims.
//!
//! Credentials do not outlive their session; a run may. At half their life the controller mints
//! the attempt fresh ones and leaves them in the run's folder, sealed for the attempt's holder
//! ([`sealed`]); from 60 % of their life the sidecar looks for them at every lease renewal and
//! signs with them from then on ([`renewable`]).
//!
//! The effective permissions are the role's (or, on MinIO, the calling user's) intersected with
//! the session policy, so the role may be as broad as the controller's own access. The call is
//! signed with the controller's credentials, found as for the bucket (environment, web identity,
//! container or instance metadata). Tested against MinIO's STS; AWS STS takes the same request.
//!
//! ```
//! use cojob_controller::credentials::session_policy;
//! let p: serde_json::Value = serde_json::from_str(&session_policy(
//!     "results", "cojob", "v1/jobs/team-a/nightly/6f1c/runs/nightly-1786240800", 2,
//! )).unwrap();
//! let run = "arn:aws:s3:::results/cojob/v1/jobs/team-a/nightly/6f1c/runs/nightly-1786240800";
//! assert_eq!(
//!     p["Statement"][0]["Resource"],
//!     serde_json::json!([format!("{run}/lease"), format!("{run}/steps/*")])
//! );
//! assert_eq!(p["Statement"][0]["Action"], serde_json::json!(["s3:GetObject", "s3:PutObject"]));
//! assert_eq!(p["Statement"][1]["Resource"], serde_json::json!([format!("{run}/credentials/2")]));
//! assert_eq!(p["Statement"][1]["Action"], serde_json::json!(["s3:GetObject"]));
//! ```

pub mod renewable;
pub mod sealed;

use aws_credential_types::Credentials;
use aws_credential_types::provider::{self, ProvideCredentials, error::CredentialsError};
use chrono::{DateTime, Utc};
use std::fmt;
use std::time::Duration;

/// How long one STS call may take, retries included.
pub const STS_TIMEOUT: Duration = Duration::from_secs(10);

/// The shortest session STS grants (15 minutes).
pub const MIN_DURATION: Duration = Duration::from_secs(900);

/// The variable that tells a sidecar its credentials are minted, and when they expire.
pub const EXPIRE_AT_ENV: &str = "COJOB_CREDENTIALS_EXPIRE_AT";
/// The variable that tells a sidecar from when to look for renewed credentials.
pub const REFRESH_AT_ENV: &str = "COJOB_CREDENTIALS_REFRESH_AT";

/// The point `num`/10 of the way from `issued` to `expires`.
fn tenths(issued: DateTime<Utc>, expires: DateTime<Utc>, num: i32) -> DateTime<Utc> {
    issued + (expires - issued) * num / 10
}

/// When the controller renews credentials issued at `issued`: at half their life.
///
/// ```
/// use cojob_controller::credentials::{renew_at, refresh_at};
/// let issued = "2026-12-03T12:00:00Z".parse().unwrap();
/// let expires = "2026-12-03T13:00:00Z".parse().unwrap();
/// assert_eq!(renew_at(issued, expires).to_rfc3339(), "2026-12-03T12:30:00+00:00");
/// assert_eq!(refresh_at(issued, expires).to_rfc3339(), "2026-12-03T12:36:00+00:00");
/// ```
pub fn renew_at(issued: DateTime<Utc>, expires: DateTime<Utc>) -> DateTime<Utc> {
    tenths(issued, expires, 5)
}

/// From when a sidecar looks for the renewal of credentials issued at `issued`: at 60 % of
/// their life, after the controller's [`renew_at`], so the renewal is normally there.
pub fn refresh_at(issued: DateTime<Utc>, expires: DateTime<Utc>) -> DateTime<Utc> {
    tenths(issued, expires, 6)
}

/// When each active attempt's credentials are next due for renewal, as this controller last
/// saw it, by lease key and epoch (so a pass reads the bucket only when one is due).
#[derive(Debug, Default)]
pub struct Renewals(std::sync::Mutex<std::collections::HashMap<(String, u64), DateTime<Utc>>>);

impl Renewals {
    fn map(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<(String, u64), DateTime<Utc>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The next renewal of `(lease_key, epoch)`, if known.
    pub fn due(&self, lease_key: &str, epoch: u64) -> Option<DateTime<Utc>> {
        self.map().get(&(lease_key.to_string(), epoch)).copied()
    }

    /// Records the next renewal of `(lease_key, epoch)`; entries long past are dropped.
    pub fn set(&self, lease_key: &str, epoch: u64, due: DateTime<Utc>, now: DateTime<Utc>) {
        let mut map = self.map();
        map.retain(|_, d| *d + chrono::Duration::days(1) > now);
        map.insert((lease_key.to_string(), epoch), due);
    }
}

/// How the controller mints run credentials (`--sts-*`).
#[derive(Debug, Clone)]
pub struct StsSettings {
    /// The role to assume (`--sts-role-arn`). MinIO ignores it: the session inherits the
    /// calling user's policy.
    pub role_arn: String,
    /// The STS endpoint (`--sts-endpoint`); `None` for AWS's regional endpoint.
    pub endpoint: Option<String>,
    /// The region the request is signed for.
    pub region: String,
    /// How long minted credentials last (`--sts-duration`, at least [`MIN_DURATION`]); they
    /// are renewed at half of it while the run lasts.
    pub duration: Duration,
}

/// Why credentials could not be minted.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    /// The store URL is not an `s3://bucket/prefix` URL.
    #[error("short-lived credentials need an s3:// store, not {0}")]
    NotS3(String),
    /// The controller's own credentials could not be found or built.
    #[error("the controller's credentials: {0}")]
    Setup(String),
    /// STS refused or failed (the service's code and message; may name the principal, so it
    /// goes only to the controller's log).
    #[error("STS AssumeRole failed: {0}")]
    Sts(String),
    /// STS answered without credentials.
    #[error("STS AssumeRole answered without credentials")]
    Empty,
    /// Renewed credentials could not be sealed.
    #[error(transparent)]
    Seal(#[from] sealed::SealError),
}

/// One attempt's credentials. `Debug` shows only the key id and the expiry.
#[derive(Clone, PartialEq)]
pub struct RunCredentials {
    /// `AWS_ACCESS_KEY_ID`.
    pub access_key_id: String,
    /// `AWS_SECRET_ACCESS_KEY`.
    pub secret_access_key: String,
    /// `AWS_SESSION_TOKEN`.
    pub session_token: String,
    /// When STS lets them expire.
    pub expires_at: DateTime<Utc>,
}

impl fmt::Debug for RunCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

impl RunCredentials {
    /// The variables a sidecar reads them from (object_store's names), with the expiry
    /// ([`EXPIRE_AT_ENV`]) and when to look for a renewal ([`REFRESH_AT_ENV`]), in RFC 3339;
    /// `issued` is when they were minted.
    pub fn env(&self, issued: DateTime<Utc>) -> [(&'static str, String); 5] {
        [
            ("AWS_ACCESS_KEY_ID", self.access_key_id.clone()),
            ("AWS_SECRET_ACCESS_KEY", self.secret_access_key.clone()),
            ("AWS_SESSION_TOKEN", self.session_token.clone()),
            (EXPIRE_AT_ENV, self.expires_at.to_rfc3339()),
            (
                REFRESH_AT_ENV,
                refresh_at(issued, self.expires_at).to_rfc3339(),
            ),
        ]
    }
}

/// The session policy of one attempt: read and write its run's lease and step checkpoints,
/// and read the renewals sealed for its epoch; nothing else (no other key, no list, no
/// delete). `run_folder` is relative to `<bucket>/<prefix>`.
pub fn session_policy(bucket: &str, prefix: &str, run_folder: &str, epoch: u64) -> String {
    let path = [prefix, run_folder]
        .iter()
        .map(|p| p.trim_matches('/'))
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("/");
    let arn = |key: &str| format!("arn:aws:s3:::{bucket}/{path}/{key}");
    serde_json::json!({
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject"],
                "Resource": [arn("lease"), arn("steps/*")],
            },
            {
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [arn(&format!("credentials/{epoch}"))],
            },
        ],
    })
    .to_string()
}

/// The session name STS records for an attempt (at most 64 of `[\w+=,.@-]`).
fn session_name(run_id: &str, epoch: u64) -> String {
    let suffix = format!("-{epoch}");
    let room = 64usize.saturating_sub("cojob-".len() + suffix.len());
    let run: String = run_id.chars().take(room).collect();
    format!("cojob-{run}{suffix}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "+=,.@-_".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// STS's code and message when it answered, else what failed on the way (never the raw
/// response).
fn describe(
    e: aws_sdk_sts::error::SdkError<aws_sdk_sts::operation::assume_role::AssumeRoleError>,
) -> MintError {
    use aws_sdk_sts::error::ProvideErrorMetadata as _;
    MintError::Sts(match (e.code(), e.message()) {
        (Some(code), message) => format!("{code}: {}", message.unwrap_or("(no message)")),
        _ => aws_sdk_sts::error::DisplayErrorContext(e).to_string(),
    })
}

/// The controller's credentials as object_store resolves them for the bucket, for signing
/// STS requests.
#[derive(Debug)]
struct ControllerCredentials(object_store::aws::AwsCredentialProvider);

impl ProvideCredentials for ControllerCredentials {
    fn provide_credentials<'a>(&'a self) -> provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        provider::future::ProvideCredentials::new(async move {
            let c = self
                .0
                .get_credential()
                .await
                .map_err(CredentialsError::provider_error)?;
            Ok(Credentials::new(
                c.key_id.clone(),
                c.secret_key.clone(),
                c.token.clone(),
                None,
                "cojob-controller",
            ))
        })
    }
}

/// Mints run credentials with STS.
#[derive(Debug)]
pub struct Minter {
    client: aws_sdk_sts::Client,
    role_arn: String,
    duration: Duration,
    bucket: String,
    prefix: String,
}

impl Minter {
    /// A minter for the runs of the store `store_url` (`s3://bucket/prefix`), signing with the
    /// controller's credentials from the environment (as for the bucket).
    pub fn new(store_url: &str, sts: StsSettings) -> Result<Minter, MintError> {
        Self::with_builder(
            store_url,
            sts,
            object_store::aws::AmazonS3Builder::from_env(),
        )
    }

    /// Like [`new`](Self::new), signing with the credentials that `builder` resolves.
    pub fn with_builder(
        store_url: &str,
        sts: StsSettings,
        builder: object_store::aws::AmazonS3Builder,
    ) -> Result<Minter, MintError> {
        let url = url::Url::parse(store_url).map_err(|_| MintError::NotS3(store_url.into()))?;
        let bucket = match (url.scheme(), url.host_str()) {
            ("s3" | "s3a", Some(b)) if !b.is_empty() => b.to_string(),
            _ => return Err(MintError::NotS3(store_url.into())),
        };
        let own = builder
            .with_url(store_url)
            .build()
            .map_err(|e| MintError::Setup(e.to_string()))?;
        let mut config = aws_sdk_sts::Config::builder()
            .behavior_version(aws_sdk_sts::config::BehaviorVersion::latest())
            .region(aws_sdk_sts::config::Region::new(sts.region))
            .credentials_provider(ControllerCredentials(own.credentials().clone()))
            // object_store caches and refreshes the controller's credentials itself (web
            // identity ones may have minutes left); a second cache could sign with expired ones.
            .identity_cache(aws_sdk_sts::config::IdentityCache::no_cache())
            // A stalled STS holds up the job's pass: give up and retry with backoff.
            .timeout_config(
                aws_sdk_sts::config::timeout::TimeoutConfig::builder()
                    .operation_timeout(STS_TIMEOUT)
                    .build(),
            );
        if let Some(endpoint) = sts.endpoint {
            config = config.endpoint_url(endpoint);
        }
        Ok(Minter {
            client: aws_sdk_sts::Client::from_conf(config.build()),
            role_arn: sts.role_arn,
            duration: sts.duration.max(MIN_DURATION),
            bucket,
            prefix: url.path().trim_matches('/').to_string(),
        })
    }

    /// How long minted credentials last.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// Mints credentials for the attempt `epoch` of the run whose folder is `run_folder`
    /// (relative to the store's prefix), valid for `duration`.
    pub async fn mint(
        &self,
        run_folder: &str,
        run_id: &str,
        epoch: u64,
        duration: Duration,
    ) -> Result<RunCredentials, MintError> {
        let policy = session_policy(&self.bucket, &self.prefix, run_folder, epoch);
        self.mint_with_policy(&policy, &session_name(run_id, epoch), duration)
            .await
    }

    /// Mints credentials restricted by the session policy `policy` (IAM JSON), recorded by STS
    /// under `session`. [`mint`](Self::mint) uses [`session_policy`].
    pub async fn mint_with_policy(
        &self,
        policy: &str,
        session: &str,
        duration: Duration,
    ) -> Result<RunCredentials, MintError> {
        let request = self
            .client
            .assume_role()
            .role_arn(&self.role_arn)
            .role_session_name(session)
            .policy(policy)
            .duration_seconds(i32::try_from(duration.as_secs()).unwrap_or(i32::MAX))
            .send();
        // Boxed: the SDK's future is deep, and a reconcile's would otherwise outgrow the
        // compiler's layout limit.
        let out = Box::pin(request).await.map_err(describe)?;
        let c = out.credentials().ok_or(MintError::Empty)?;
        let expires_at =
            DateTime::from_timestamp(c.expiration().secs(), 0).ok_or(MintError::Empty)?;
        Ok(RunCredentials {
            access_key_id: c.access_key_id().to_string(),
            secret_access_key: c.secret_access_key().to_string(),
            session_token: c.session_token().to_string(),
            expires_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_names_are_what_sts_accepts() {
        assert_eq!(
            session_name("nightly-1786240800", 2),
            "cojob-nightly-1786240800-2"
        );
        let long = session_name(&"x".repeat(80), 12);
        assert_eq!(long.len(), 64);
        assert!(long.ends_with("x-12"), "the epoch is kept: {long}");
        assert_eq!(session_name("a/b c", 1), "cojob-a-b-c-1");
    }

    #[test]
    fn a_policy_without_prefix_has_no_empty_segment() {
        let p = session_policy("b", "", "v1/jobs/n/j/u/runs/r", 1);
        assert!(
            p.contains("arn:aws:s3:::b/v1/jobs/n/j/u/runs/r/lease"),
            "{p}"
        );
    }

    #[test]
    fn only_s3_stores_can_have_minted_credentials() {
        let sts = StsSettings {
            role_arn: "r".into(),
            endpoint: None,
            region: "us-east-1".into(),
            duration: Duration::from_secs(3600),
        };
        let e = Minter::new("az://container/p", sts).unwrap_err();
        assert!(matches!(e, MintError::NotS3(_)), "{e}");
    }

    #[test]
    fn debug_hides_the_secret_and_the_token() {
        let c = RunCredentials {
            access_key_id: "AKID".into(),
            secret_access_key: "SECRET".into(),
            session_token: "TOKEN".into(),
            expires_at: DateTime::UNIX_EPOCH,
        };
        let shown = format!("{c:?}");
        assert!(shown.contains("AKID") && !shown.contains("SECRET") && !shown.contains("TOKEN"));
    }
}
