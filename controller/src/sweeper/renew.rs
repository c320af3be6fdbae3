//! Renews the minted credentials of running attempts ([`crate::credentials`]).
//!
//! An attempt's first credentials come with its holder Secret. From half their life on, a pass
//! mints fresh ones and writes them, sealed for the attempt's holder, next to the run's lease
//! (`<run>/credentials/<epoch>`), where the sidecar picks them up. When each is due is kept in memory
//! ([`crate::credentials::Renewals`]); a controller that does not know (a restart, another
//! replica) reads the document once before minting, so replicas do not mint twice.

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;

use super::SweepError;
use super::pods::pod_view;
use crate::context::JobScope;
use crate::credentials::renewable::renewal_key;
use crate::credentials::sealed::{Renewal, seal, unseal};
use crate::credentials::{refresh_at, renew_at};
use crate::index::ActiveRun;
use cojob::LeaseInfo;

/// When the credentials of the attempt that holds `lease` are next due for renewal: `None`
/// when no credentials are minted, or the attempt's pod is gone, stopping or ended.
pub fn due(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    lease: &LeaseInfo,
    pod: Option<&Pod>,
) -> Option<DateTime<Utc>> {
    let minter = scope.cx.settings.minter.as_ref()?;
    let pod = pod?;
    if lease.is_released()
        || pod.metadata.deletion_timestamp.is_some()
        || pod_view(Some(pod)).is_quiescent()
    {
        return None;
    }
    let created = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(crate::api_time::from_api)?;
    let lifetime = chrono::Duration::from_std(minter.duration()).unwrap_or_default();
    // The first credentials were minted just after the pod was created: renewing from the
    // pod's creation on is early, never late.
    Some(
        scope
            .cx
            .renewals
            .due(&scope.keys.lease(&run.run_id), lease.epoch)
            .unwrap_or_else(|| renew_at(created, created + lifetime)),
    )
}

/// Renews the credentials of the attempt that holds `lease`, if they are due ([`due`]) and
/// its pod may still run.
pub async fn credentials(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    lease: &LeaseInfo,
    pod: Option<&Pod>,
) -> Result<(), SweepError> {
    let (Some(minter), Some(due)) = (&scope.cx.settings.minter, due(scope, run, lease, pod)) else {
        return Ok(());
    };
    let lifetime = chrono::Duration::from_std(minter.duration()).unwrap_or_default();
    let now = scope.cx.db.clock().now();
    let lease_key = scope.keys.lease(&run.run_id);
    if now < due {
        return Ok(());
    }
    // A failed renewal is retried by the next pass, while the current credentials last; it
    // does not hold up the run's other steps.
    if let Err(e) = renew(scope, minter, run, lease, &lease_key, now, lifetime).await {
        tracing::warn!(job = %scope.name, run = %run.run_id, epoch = lease.epoch, error = %e, "could not renew the attempt's store credentials; retrying");
        scope
            .warning(
                "CredentialsRenewalFailed",
                format!(
                    "run {}: its store credentials could not be renewed; retrying (details in \
                     the controller's log)",
                    run.run_id
                ),
            )
            .await;
    }
    Ok(())
}

/// No renewal sooner than this after the last one, even if STS granted less than asked.
const MIN_RENEWAL_GAP: chrono::Duration = chrono::Duration::seconds(60);

async fn renew(
    scope: &JobScope<'_>,
    minter: &crate::credentials::Minter,
    run: &ActiveRun,
    lease: &LeaseInfo,
    lease_key: &str,
    now: DateTime<Utc>,
    lifetime: chrono::Duration,
) -> Result<(), SweepError> {
    let renewals = &scope.cx.renewals;
    let holder = super::holder::holder(scope, &run.run_id, lease.epoch);
    let key = renewal_key(lease_key, lease.epoch);
    // Renewed already (by another replica, or by this one before a restart)?
    if let Some((body, _)) = scope
        .cx
        .db
        .store()
        .get(&key)
        .await
        .map_err(cojob::Error::from)?
        && let Ok(renewal) = unseal(&holder, lease_key, lease.epoch, &body)
    {
        let expires = renewal.credentials.expires_at;
        let next = renew_at(expires - lifetime, expires);
        if now < next {
            renewals.set(lease_key, lease.epoch, next, now);
            return Ok(());
        }
    }
    let (credentials, issued) =
        super::holder::minted(scope, minter, &run.run_id, lease.epoch).await?;
    let expires = credentials.expires_at;
    let renewal = Renewal {
        refresh_at: refresh_at(issued, expires),
        credentials,
    };
    let body =
        seal(&holder, lease_key, lease.epoch, &renewal).map_err(|e| SweepError::Credentials {
            run_id: run.run_id.clone(),
            source: e.into(),
        })?;
    scope
        .cx
        .db
        .store()
        .put(&key, body.into(), cojob::PutMode::Overwrite)
        .await
        .map_err(cojob::Error::from)?;
    let next = renew_at(issued, expires).max(issued + MIN_RENEWAL_GAP);
    renewals.set(lease_key, lease.epoch, next, now);
    tracing::info!(job = %scope.name, run = %run.run_id, epoch = lease.epoch, expires_at = %expires, "renewed the attempt's store credentials");
    Ok(())
}
