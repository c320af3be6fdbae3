//! Holders: each attempt's lease holder is *derived*, never stored where the controller has to
//! read it back.
//!
//! The holder of `(lease key, epoch)` is an HMAC-SHA256 of the two under the controller's
//! holder key ([`HolderKey`], from `COJOB_HOLDER_KEY`). Every replica derives the same holder,
//! so the controller needs no read access to Secrets at all: the only Secret right it holds is
//! `create`.
//!
//! The holder reaches the attempt's sidecar through the Secret `<run>-<epoch>-holder-<random>`
//! (a name unique to the pod object, read back from its spec), created
//! right after the pod and owned by it, so it goes with the pod. The pod is created with the
//! scheduling gate [`HOLDER_GATE`](crate::pod::HOLDER_GATE), removed once the Secret exists, so
//! no kubelet sees the pod before its Secret (it would back off for 10 to 15 s). While a pod is
//! still gated, every pass creates its Secret and removes the gate again (a crash between the
//! writes converges).
//!
//! A pod created well ahead of its tick ([`crate::pod::gate_free`]) has no gate: its Secret is
//! created right after it, and a pass that finds its attempt pending while its kubelet reports
//! the sidecar unable to start for want of it creates it again ([`converge`]), so a crash
//! between the two writes converges as well.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::PostParams;
use kube::{Resource, ResourceExt};

use super::SweepError;
use crate::context::JobScope;
use crate::pod::{HOLDER_KEY, LABEL_EPOCH, LABEL_JOB, LABEL_RUN};

/// The fewest bytes a holder key may have.
pub const MIN_KEY_BYTES: usize = 32;

/// The key holders are derived under. Its value is never printed.
///
/// ```
/// use cojob_controller::sweeper::holder::HolderKey;
/// let key = HolderKey::new(&[7u8; 32]).unwrap();
/// let h = key.holder("v1/jobs/ns/job/uid/runs/r/lease", 2);
/// assert_eq!(h, key.holder("v1/jobs/ns/job/uid/runs/r/lease", 2));
/// assert_ne!(h, key.holder("v1/jobs/ns/job/uid/runs/r/lease", 3));
/// assert!(HolderKey::new(b"short").is_err());
/// ```
#[derive(Clone)]
pub struct HolderKey(ring::hmac::Key);

/// A holder key shorter than [`MIN_KEY_BYTES`].
#[derive(Debug, thiserror::Error)]
#[error("the holder key has {0} bytes; it needs at least {MIN_KEY_BYTES} random bytes")]
pub struct WeakKey(pub usize);

impl HolderKey {
    /// A key from at least [`MIN_KEY_BYTES`] bytes of secret material.
    pub fn new(secret: &[u8]) -> Result<HolderKey, WeakKey> {
        if secret.len() < MIN_KEY_BYTES {
            return Err(WeakKey(secret.len()));
        }
        Ok(HolderKey(ring::hmac::Key::new(
            ring::hmac::HMAC_SHA256,
            secret,
        )))
    }

    /// The holder of the attempt at `epoch` of the run whose lease is `lease_key`: 64 hex
    /// digits, unguessable without the key, different for every run and epoch.
    pub fn holder(&self, lease_key: &str, epoch: u64) -> String {
        let message = format!("cojob holder v1\n{lease_key}\n{epoch}");
        let tag = ring::hmac::sign(&self.0, message.as_bytes());
        tag.as_ref().iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for HolderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HolderKey(<redacted>)")
    }
}

/// The holder of `run_id`'s attempt at `epoch`.
pub fn holder(scope: &JobScope<'_>, run_id: &str, epoch: u64) -> String {
    scope
        .cx
        .settings
        .holder_key
        .holder(&scope.keys.lease(run_id), epoch)
}

/// Creates the holder Secret of `pod` (the attempt's pod at `epoch`, owned by the pod), then
/// lets the pod be scheduled (removes [`HOLDER_GATE`](crate::pod::HOLDER_GATE)). The Secret's
/// name is the one the pod was built with, unique to this pod object, so an existing Secret of
/// that name is this pod's own, from an earlier pass.
///
/// A pod created without the gate, ahead of its tick ([`crate::pod::gate_free`]), has no gate
/// to lift: only its Secret is created.
pub async fn hand_to(
    scope: &JobScope<'_>,
    run_id: &str,
    epoch: u64,
    pod: &Pod,
) -> Result<(), SweepError> {
    let gated = crate::pod::is_gated(pod);
    let Some(name) = crate::pod::holder_secret_of(pod) else {
        return Ok(()); // not a pod this controller built
    };
    create_secret(scope, &name, run_id, epoch, pod).await?;
    if !gated {
        return Ok(());
    }
    let gates: Vec<_> = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|g| g.name != crate::pod::HOLDER_GATE)
        .collect();
    let patch = serde_json::json!({"spec": {"schedulingGates": gates}});
    match scope
        .pods
        .patch(
            &pod.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// For a pending attempt's pod, finishes what a crash may have cut short between its creation
/// and [`hand_to`]: a pod still gated gets its Secret and loses the gate; an ungated pod whose
/// kubelet reports the sidecar's container unable to start for a missing Secret
/// ([`crate::pod::sidecar_lacks_config`]: a pod created without the gate whose Secret never
/// came) gets its Secret, which the kubelet finds on its next try. Any other pod needs nothing,
/// and costs no request.
pub async fn converge(
    scope: &JobScope<'_>,
    run_id: &str,
    epoch: u64,
    pod: &Pod,
) -> Result<(), SweepError> {
    if crate::pod::is_gated(pod) || crate::pod::sidecar_lacks_config(pod) {
        hand_to(scope, run_id, epoch, pod).await?;
    }
    Ok(())
}

/// Mints the attempt's credentials; returns them with when they were asked for (on the real
/// clock, as STS's expiry is): their life is measured from then, whatever STS granted.
pub(super) async fn minted(
    scope: &JobScope<'_>,
    minter: &crate::credentials::Minter,
    run_id: &str,
    epoch: u64,
) -> Result<
    (
        crate::credentials::RunCredentials,
        chrono::DateTime<chrono::Utc>,
    ),
    SweepError,
> {
    let issued = chrono::Utc::now();
    let folder = scope.keys.run_folder(run_id);
    let creds = minter
        .mint(&folder, run_id, epoch, minter.duration())
        .await
        .map_err(|source| SweepError::Credentials {
            run_id: run_id.into(),
            source,
        })?;
    tracing::info!(job = %scope.name, run = %run_id, epoch, expires_at = %creds.expires_at, "minted the attempt's store credentials");
    Ok((creds, issued))
}

async fn create_secret(
    scope: &JobScope<'_>,
    name: &str,
    run_id: &str,
    epoch: u64,
    pod: &Pod,
) -> Result<(), SweepError> {
    let Some(uid) = pod.uid() else {
        return Ok(());
    };
    let mut data: BTreeMap<String, ByteString> = scope
        .cx
        .settings
        .forwarded_env
        .iter()
        .map(|(k, v)| (k.clone(), ByteString(v.clone().into_bytes())))
        .collect();
    data.insert(
        HOLDER_KEY.into(),
        ByteString(holder(scope, run_id, epoch).into_bytes()),
    );
    if let Some(minter) = &scope.cx.settings.minter {
        let (creds, issued) = minted(scope, minter, run_id, epoch).await?;
        for (k, v) in creds.env(issued) {
            data.insert(k.into(), ByteString(v.into_bytes()));
        }
    }
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(scope.namespace.clone()),
            labels: Some(BTreeMap::from([
                (LABEL_JOB.into(), scope.name.clone()),
                (LABEL_RUN.into(), run_id.into()),
                (LABEL_EPOCH.into(), epoch.to_string()),
            ])),
            owner_references: Some(vec![OwnerReference {
                api_version: Pod::api_version(&()).into_owned(),
                kind: Pod::kind(&()).into_owned(),
                name: pod.name_any(),
                uid,
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        },
        data: Some(data),
        immutable: Some(true),
        type_: Some("Opaque".into()),
        ..Secret::default()
    };
    match scope.secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
