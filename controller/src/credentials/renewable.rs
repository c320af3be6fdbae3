//! The sidecar's side of minted credentials: the store client signs with whatever credentials
//! are current, and the sidecar swaps in the renewal the controller sealed for it.
//!
//! The holder Secret carries the first credentials with `COJOB_CREDENTIALS_EXPIRE_AT` and
//! `COJOB_CREDENTIALS_REFRESH_AT`. From the refresh time on, at every lease renewal, the sidecar
//! reads `<run>/credentials/<epoch>` ([`renewal_key`]), opens it with its holder
//! ([`super::sealed::unseal`]) and takes the credentials if they last longer than its own.

use std::sync::{Arc, RwLock};

use chrono::{DateTime, Utc};
use object_store::aws::AwsCredential;

use super::sealed::{Renewal, unseal};
use super::{EXPIRE_AT_ENV, REFRESH_AT_ENV, RunCredentials};

/// How often a sidecar past its refresh time looks again for a renewal it has not found.
pub const RETRY: std::time::Duration = std::time::Duration::from_secs(30);

/// The key of the renewed credentials of a run's attempt `epoch`, in the run's folder.
///
/// ```
/// use cojob_controller::credentials::renewable::renewal_key;
/// assert_eq!(renewal_key("v1/jobs/a/j/u/runs/r/lease", 2), "v1/jobs/a/j/u/runs/r/credentials/2");
/// ```
pub fn renewal_key(lease_key: &str, epoch: u64) -> String {
    let folder = lease_key.strip_suffix("/lease").unwrap_or(lease_key);
    format!("{folder}/credentials/{epoch}")
}

/// Why the sidecar could not take a renewal.
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    /// Reading the document failed.
    #[error("reading the renewed credentials: {0}")]
    Store(#[from] cojob::StoreError),
    /// The document does not open with this attempt's holder.
    #[error(transparent)]
    Sealed(#[from] super::sealed::SealError),
}

#[derive(Debug)]
struct Current {
    credential: Arc<AwsCredential>,
    expires_at: DateTime<Utc>,
    refresh_at: DateTime<Utc>,
}

/// Credentials that can be replaced while the store client uses them.
#[derive(Debug)]
pub struct Renewable {
    current: RwLock<Current>,
}

fn aws(c: &RunCredentials) -> Arc<AwsCredential> {
    Arc::new(AwsCredential {
        key_id: c.access_key_id.clone(),
        secret_key: c.secret_access_key.clone(),
        token: Some(c.session_token.clone()),
    })
}

impl Renewable {
    /// Starts from `renewal`.
    pub fn new(renewal: &Renewal) -> Renewable {
        Renewable {
            current: RwLock::new(Current {
                credential: aws(&renewal.credentials),
                expires_at: renewal.credentials.expires_at,
                refresh_at: renewal.refresh_at,
            }),
        }
    }

    /// The minted credentials of the pod's environment, or `None` when they are not minted
    /// (no `COJOB_CREDENTIALS_EXPIRE_AT`): the sidecar then uses the environment as it is.
    pub fn from_env() -> anyhow::Result<Option<Renewable>> {
        let Ok(expires) = std::env::var(EXPIRE_AT_ENV) else {
            return Ok(None);
        };
        let var = |name: &str| {
            std::env::var(name)
                .map_err(|_| anyhow::anyhow!("{EXPIRE_AT_ENV} is set but {name} is not"))
        };
        let time = |name: &str, value: String| {
            value
                .parse::<DateTime<Utc>>()
                .map_err(|e| anyhow::anyhow!("{name}: {e}"))
        };
        let credentials = RunCredentials {
            access_key_id: var("AWS_ACCESS_KEY_ID")?,
            secret_access_key: var("AWS_SECRET_ACCESS_KEY")?,
            session_token: var("AWS_SESSION_TOKEN")?,
            expires_at: time(EXPIRE_AT_ENV, expires)?,
        };
        let refresh_at = time(REFRESH_AT_ENV, var(REFRESH_AT_ENV)?)?;
        Ok(Some(Renewable::new(&Renewal {
            credentials,
            refresh_at,
        })))
    }

    /// When the current credentials expire.
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.read(|c| c.expires_at)
    }

    fn read<T>(&self, f: impl FnOnce(&Current) -> T) -> T {
        f(&self
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// How long the sidecar may wait before it should look for a renewal: until the refresh
    /// time, then every [`RETRY`] until one is found (at least a second). The sidecar wakes
    /// for it even when its lease renewals are further apart.
    ///
    /// ```
    /// # use cojob_controller::credentials::{RunCredentials, sealed::Renewal, renewable::{Renewable, RETRY}};
    /// # use std::time::Duration;
    /// let now: chrono::DateTime<chrono::Utc> = "2026-12-03T12:00:00Z".parse().unwrap();
    /// let r = Renewable::new(&Renewal {
    ///     credentials: RunCredentials { access_key_id: "a".into(), secret_access_key: "s".into(),
    ///         session_token: "t".into(), expires_at: now + chrono::Duration::minutes(20) },
    ///     refresh_at: now + chrono::Duration::minutes(2),
    /// });
    /// assert_eq!(r.next_look(now), Duration::from_secs(120));
    /// assert_eq!(r.next_look(now + chrono::Duration::minutes(3)), RETRY);
    /// ```
    pub fn next_look(&self, now: DateTime<Utc>) -> std::time::Duration {
        let until = (self.read(|c| c.refresh_at) - now)
            .to_std()
            .unwrap_or_default();
        if until.is_zero() {
            RETRY
        } else {
            until.max(std::time::Duration::from_secs(1))
        }
    }

    /// Takes `renewal` if it lasts longer than the current credentials; true if taken.
    pub fn replace(&self, renewal: &Renewal) -> bool {
        let mut current = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if renewal.credentials.expires_at <= current.expires_at {
            return false;
        }
        *current = Current {
            credential: aws(&renewal.credentials),
            expires_at: renewal.credentials.expires_at,
            refresh_at: renewal.refresh_at,
        };
        true
    }

    /// From the refresh time on: reads the renewal sealed for this attempt and takes it if it
    /// is newer. Returns the new expiry when it took one.
    pub async fn refresh(
        &self,
        db: &cojob::Db,
        lease_key: &str,
        holder: &str,
        epoch: u64,
        now: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>, RefreshError> {
        if now < self.read(|c| c.refresh_at) {
            return Ok(None);
        }
        let Some((body, _)) = db.store().get(&renewal_key(lease_key, epoch)).await? else {
            return Ok(None);
        };
        let renewal = unseal(holder, lease_key, epoch, &body)?;
        Ok(self
            .replace(&renewal)
            .then_some(renewal.credentials.expires_at))
    }
}

#[async_trait::async_trait]
impl object_store::CredentialProvider for Renewable {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        Ok(self.read(|c| c.credential.clone()))
    }
}

/// The bucket `url` (`s3://bucket/prefix`), signed with `credentials`; endpoint and region
/// from the environment.
pub fn open_store(url: &str, credentials: Arc<Renewable>) -> anyhow::Result<cojob::Db> {
    let parsed = url::Url::parse(url).map_err(|e| anyhow::anyhow!("the store URL {url}: {e}"))?;
    let s3 = object_store::aws::AmazonS3Builder::from_env()
        .with_url(url)
        .with_credentials(credentials)
        .build()
        .map_err(|e| anyhow::anyhow!("the store {url}: {e}"))?;
    let backend = cojob::store::ObjectStoreBackend::new(Arc::new(s3));
    Ok(cojob::Db::new(cojob::Store::new(
        backend,
        parsed.path().trim_matches('/'),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn renewal(key: &str, expires: i64) -> Renewal {
        Renewal {
            credentials: RunCredentials {
                access_key_id: key.into(),
                secret_access_key: "s".into(),
                session_token: "t".into(),
                expires_at: DateTime::from_timestamp(expires, 0).unwrap(),
            },
            refresh_at: DateTime::from_timestamp(expires - 100, 0).unwrap(),
        }
    }

    #[tokio::test]
    async fn only_a_longer_lasting_renewal_is_taken() {
        use object_store::CredentialProvider as _;
        let r = Renewable::new(&renewal("first", 1000));
        assert!(!r.replace(&renewal("older", 900)));
        assert_eq!(r.get_credential().await.unwrap().key_id, "first");
        assert!(r.replace(&renewal("second", 2000)));
        assert_eq!(r.get_credential().await.unwrap().key_id, "second");
        assert_eq!(r.expires_at().timestamp(), 2000);
    }
}
