//! Holder Secrets: each attempt's lease holder lives in the Secret `<run>-<epoch>-holder`,
//! created before the lease is acquired (so a crash never loses a holder), owned by the job
//! until the attempt's pod exists, then by the pod.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::SweepError;
use crate::context::JobScope;
use crate::index::ActiveRun;
use crate::pod::{HOLDER_KEY, LABEL_EPOCH, LABEL_JOB, LABEL_RUN};

/// The annotation on holder Secrets naming the UID of the job they belong to.
pub const ANNOTATION_JOB_UID: &str = "cojob.dev/job-uid";

pub use crate::pod::holder_secret_name as secret_name;

/// The holder a run's Secret keeps.
pub fn holder_of(secret: &Secret) -> Result<String, SweepError> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(HOLDER_KEY))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .filter(|h| !h.is_empty())
        .ok_or_else(|| SweepError::BadSecret(secret.name_any()))
}

/// The holder kept in a run's Secret, if the Secret exists.
pub async fn read_holder(scope: &JobScope<'_>, name: &str) -> Result<Option<String>, SweepError> {
    match scope.secrets.get_opt(name).await? {
        Some(secret) => holder_of(&secret).map(Some),
        None => Ok(None),
    }
}

/// The Secret, when it exists and was never handed to a pod: the attempt's pod was never
/// created (a crash came between acquiring and creating, or it waits for an older pod).
pub async fn never_handed_to_a_pod(
    scope: &JobScope<'_>,
    name: &str,
) -> Result<Option<Secret>, SweepError> {
    Ok(scope
        .secrets
        .get_opt(name)
        .await?
        .filter(|s| !s.owner_references().iter().any(|o| o.kind == "Pod")))
}

/// Creates the holder Secret of a dispatch (owned by the job until its pod exists) or, when a
/// crashed dispatch of the same attempt already made it, returns the holder it keeps. `None`
/// while a Secret of an older object with the same name waits for the garbage collector.
pub async fn ensure(
    scope: &JobScope<'_>,
    run: &ActiveRun,
    name: &str,
    epoch: u64,
    holder: String,
) -> Result<Option<String>, SweepError> {
    let mut data: BTreeMap<String, ByteString> = scope
        .cx
        .settings
        .forwarded_env
        .iter()
        .map(|(k, v)| (k.clone(), ByteString(v.clone().into_bytes())))
        .collect();
    data.insert(HOLDER_KEY.into(), ByteString(holder.clone().into_bytes()));
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(scope.namespace.clone()),
            labels: Some(BTreeMap::from([
                (LABEL_JOB.into(), scope.name.clone()),
                (LABEL_RUN.into(), run.run_id.clone()),
                (LABEL_EPOCH.into(), epoch.to_string()),
            ])),
            annotations: Some(BTreeMap::from([(
                ANNOTATION_JOB_UID.into(),
                scope.uid.clone(),
            )])),
            owner_references: Some(vec![scope.owner()]),
            ..ObjectMeta::default()
        },
        data: Some(data),
        immutable: Some(true),
        type_: Some("Opaque".into()),
        ..Secret::default()
    };
    match scope.secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(Some(holder)),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let Some(existing) = scope.secrets.get_opt(name).await? else {
                return Ok(None); // deleted meanwhile: try again next pass
            };
            if existing.annotations().get(ANNOTATION_JOB_UID) != Some(&scope.uid) {
                // A Secret of an older object with the same name (deleted and created again)
                // is still there; wait for the garbage collector.
                tracing::info!(job = %scope.name, secret = name, "a Secret of another object has this name; waiting for it to go");
                return Ok(None);
            }
            holder_of(&existing).map(Some)
        }
        Err(e) => Err(e.into()),
    }
}

/// Makes the pod the owner of its holder Secret, so the Secret goes with the pod. One read when
/// it already is. Returns the Secret as read (`None` when absent).
pub async fn adopt(
    scope: &JobScope<'_>,
    secret: &str,
    pod: &Pod,
) -> Result<Option<Secret>, SweepError> {
    let found = scope.secrets.get_opt(secret).await?;
    let (Some(uid), Some(current)) = (pod.uid(), &found) else {
        return Ok(found);
    };
    if current.owner_references().iter().any(|o| o.uid == uid) {
        return Ok(found);
    }
    let owner = OwnerReference {
        api_version: Pod::api_version(&()).into_owned(),
        kind: Pod::kind(&()).into_owned(),
        name: pod.name_any(),
        uid,
        controller: None,
        block_owner_deletion: None,
    };
    let patch = json!({"metadata": {"ownerReferences": [owner]}});
    match scope
        .secrets
        .patch(secret, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(patched) => Ok(Some(patched)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e.into()),
    }
}
