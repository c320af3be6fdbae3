//! Building a run's pod: the user's template plus the run's identity, a shared volume and the
//! native lease sidecar.
//!
//! Pure functions of their inputs, so the pod of `(run, epoch)` is always the same object and
//! its creation is idempotent (a second create gets `AlreadyExists`).

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvFromSource, EnvVar, EnvVarSource, ExecAction, Lifecycle,
    LifecycleHandler, Pod, PodSchedulingGate, ResourceRequirements, SeccompProfile,
    SecretEnvSource, SecretKeySelector, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use std::collections::BTreeMap;

/// The sidecar's environment variable that carries its holder, from the holder Secret.
pub const HOLDER_ENV: &str = "COJOB_HOLDER";

/// The scheduling gate that holds a run pod until its holder Secret exists.
pub const HOLDER_GATE: &str = "cojob.dev/holder-secret";

/// True while `pod` still carries [`HOLDER_GATE`].
pub fn is_gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == HOLDER_GATE))
}

/// How far ahead of its tick a pod must be created to go without [`HOLDER_GATE`].
///
/// The gate keeps the kubelet from seeing a pod before its holder Secret exists; lifting it
/// costs a second write of the pod, which every watcher of pods (scheduler, kubelet,
/// controllers) then handles again. A pod created well ahead of its tick (`prestartSeconds`)
/// does not need it: its workload waits for the tick anyway, and a kubelet that sees the pod
/// before its Secret (a race the Secret, created right after the pod, mostly wins) fails the
/// sidecar's container with `CreateContainerConfigError` and tries again after its pod
/// worker's back-off, 10 to 15 s, long before the tick.
pub const GATE_FREE_LEAD: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether a pod created at `now` for a run whose tick is `fire_at` goes without
/// [`HOLDER_GATE`]: only when the tick is at least [`GATE_FREE_LEAD`] away.
///
/// ```
/// use chrono::{Duration, TimeZone, Utc};
/// use cojob_controller::pod::gate_free;
/// let tick = Utc.with_ymd_and_hms(2026, 12, 7, 12, 0, 0).unwrap();
/// assert!(gate_free(Some(tick), tick - Duration::seconds(30)));
/// assert!(!gate_free(Some(tick), tick - Duration::seconds(29)));
/// assert!(!gate_free(Some(tick), tick + Duration::seconds(1)));
/// assert!(!gate_free(None, tick)); // a one-off run: it starts now
/// ```
pub fn gate_free(
    fire_at: Option<chrono::DateTime<chrono::Utc>>,
    now: chrono::DateTime<chrono::Utc>,
) -> bool {
    fire_at.is_some_and(|t| (t - now).to_std().is_ok_and(|lead| lead >= GATE_FREE_LEAD))
}

/// True when the kubelet reports that it cannot build the sidecar's container from the pod's
/// spec (`CreateContainerConfigError`): for a run pod created without [`HOLDER_GATE`], its
/// holder Secret does not exist (yet).
///
/// ```
/// use cojob_controller::pod::sidecar_lacks_config;
/// let pod = |reason: &str| -> k8s_openapi::api::core::v1::Pod {
///     serde_json::from_value(serde_json::json!({"status": {"initContainerStatuses": [{
///         "name": "cojob-sidecar", "image": "i", "imageID": "", "ready": false,
///         "restartCount": 0, "state": {"waiting": {"reason": reason}}
///     }]}})).unwrap()
/// };
/// assert!(sidecar_lacks_config(&pod("CreateContainerConfigError")));
/// assert!(!sidecar_lacks_config(&pod("ContainerCreating")));
/// assert!(!sidecar_lacks_config(&Default::default()));
/// ```
pub fn sidecar_lacks_config(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.name == SIDECAR_NAME)
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.as_deref())
        .any(|r| r == "CreateContainerConfigError")
}

/// Takes [`HOLDER_GATE`] off a pod built by [`build_pod`], before it is created (for a pod
/// that goes without it: [`gate_free`]). The template's own gates stay.
pub fn drop_holder_gate(pod: &mut Pod) {
    if let Some(gates) = pod.spec.as_mut().and_then(|s| s.scheduling_gates.as_mut()) {
        gates.retain(|g| g.name != HOLDER_GATE);
    }
}

/// The user and group the sidecar runs as (non-root, like the image's own user).
pub const SIDECAR_UID: i64 = 65532;

/// The label that names a pod's CoordinatedJob.
pub const LABEL_JOB: &str = "cojob.dev/job";
/// The label that names a pod's run.
pub const LABEL_RUN: &str = "cojob.dev/run";
/// The label that carries a pod's lease epoch.
pub const LABEL_EPOCH: &str = "cojob.dev/epoch";
/// The finalizer on every run pod: the pod object stays, with the kubelet's record of how its
/// containers ended, until the controller wrote that outcome into the run's lease. A pod
/// deleted right after its workload succeeded (by `kubectl delete`, a drain or the pod garbage
/// collector) therefore never makes a recorded success look like a lost run (G2).
pub const RESULT_FINALIZER: &str = "cojob.dev/run-result";
/// The name of the injected sidecar container.
pub const SIDECAR_NAME: &str = "cojob-sidecar";
/// The shared volume, mounted in every container.
pub const SHARED_VOLUME: &str = "cojob";
/// Where the shared volume is mounted; `cancel_requested` appears here.
pub const SHARED_MOUNT: &str = "/var/run/cojob";
/// The key of the holder in the run's Secret.
pub const HOLDER_KEY: &str = "holder";
/// Where the cojob image keeps its binary (the sidecar's start gate runs it).
pub const SIDECAR_BINARY: &str = "/cojob";
/// How long the sidecar's start gate (its postStart hook, `cojob ready --wait`) waits for the
/// attach before it fails, and the kubelet restarts the sidecar; the tick's wait comes on top.
pub const START_GATE_TIMEOUT_SECONDS: u64 = 120;

/// Everything that identifies one attempt of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunIdentity {
    /// The run's deterministic id (a DNS label).
    pub run_id: String,
    /// The lease epoch of this attempt.
    pub epoch: u64,
    /// The attempt number, from 1.
    pub attempt: u32,
    /// The tick, RFC 3339 UTC, or `once`; for a manual run, when its trigger was decided.
    pub fire_time: String,
    /// The trigger key of a manual run (`COJOB_TRIGGER`).
    pub trigger: Option<String>,
    /// The name of this pod's holder Secret ([`new_holder_secret_name`]).
    pub secret: String,
    /// The lease's key in the bucket.
    pub lease_key: String,
}

/// The pod of `run_id`'s attempt at `epoch`: `<runId>-<epoch>`.
pub fn pod_name(run_id: &str, epoch: u64) -> String {
    format!("{run_id}-{epoch}")
}

/// The name of `run_id`'s dispatch at `epoch`, `<runId>-<epoch>-holder`: the acquisition's
/// `dispatch` marker, and the prefix of the holder Secret of each pod object of that attempt.
///
/// ```
/// assert_eq!(cojob_controller::pod::holder_secret_name("nightly-1786240800", 2), "nightly-1786240800-2-holder");
/// ```
pub fn holder_secret_name(run_id: &str, epoch: u64) -> String {
    format!("{}-holder", pod_name(run_id, epoch))
}

/// The name of the holder Secret of one pod object: [`holder_secret_name`] and a random
/// suffix, so that a pod created again at the same epoch never meets the Secret of its
/// predecessor (which the garbage collector may remove at any time).
pub fn new_holder_secret_name(run_id: &str, epoch: u64) -> String {
    let suffix: String = cojob::new_holder()
        .chars()
        .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        .take(6)
        .collect();
    format!("{}-{suffix}", holder_secret_name(run_id, epoch))
}

/// The holder Secret a run pod was created with (its sidecar's `COJOB_HOLDER` reference).
pub fn holder_secret_of(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .init_containers
        .as_ref()?
        .iter()
        .find(|c| c.name == SIDECAR_NAME)?
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == HOLDER_ENV)?
        .value_from
        .as_ref()?
        .secret_key_ref
        .as_ref()
        .map(|r| r.name.clone())
}

impl RunIdentity {
    /// The pod's name ([`pod_name`]).
    pub fn pod_name(&self) -> String {
        pod_name(&self.run_id, self.epoch)
    }

    /// The name of the Secret that holds this pod's lease holder.
    pub fn secret_name(&self) -> String {
        self.secret.clone()
    }
}

/// How the sidecar is run.
#[derive(Debug, Clone, PartialEq)]
pub struct SidecarConfig {
    /// The cojob image.
    pub image: String,
    /// The bucket URL the sidecar opens.
    pub bucket: String,
    /// Extra environment for the sidecar (store credentials, endpoints), as given to the
    /// controller.
    pub env: Vec<EnvVar>,
    /// The lease ttl in seconds (the sidecar renews every third of it).
    pub ttl_seconds: i64,
    /// A Secret in the run's namespace whose keys become the sidecar's environment: store
    /// credentials scoped to that namespace, instead of the controller's forwarded ones.
    pub credentials_secret: Option<String>,
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

fn run_env(run: &RunIdentity) -> Vec<EnvVar> {
    let mut vars = vec![
        env("COJOB_RUN_ID", &run.run_id),
        env("COJOB_EPOCH", run.epoch.to_string()),
        env("COJOB_FIRE_TIME", &run.fire_time),
        env("COJOB_ATTEMPT", run.attempt.to_string()),
        env("COJOB_LEASE_KEY", &run.lease_key),
        env("COJOB_API", crate::workload::api_address()),
    ];
    if let Some(key) = &run.trigger {
        vars.push(env("COJOB_TRIGGER", key));
    }
    vars
}

fn shared_mount() -> VolumeMount {
    VolumeMount {
        name: SHARED_VOLUME.into(),
        mount_path: SHARED_MOUNT.into(),
        ..VolumeMount::default()
    }
}

/// The sidecar's postStart hook: `cojob ready --wait <timeout>`. The hook runs with the
/// container's environment, so it also waits for the run's `COJOB_FIRE_TIME`: a run decided
/// ahead of its tick (`prestartSeconds`) starts its workload at the tick, by the node's clock.
fn start_gate() -> Vec<String> {
    vec![
        SIDECAR_BINARY.into(),
        "ready".into(),
        "--wait".into(),
        format!("{START_GATE_TIMEOUT_SECONDS}s"),
    ]
}

/// The native sidecar: an init container with `restartPolicy: Always` running `cojob sidecar`,
/// with the holder from the run's Secret (never a plain env value).
fn sidecar(run: &RunIdentity, cfg: &SidecarConfig) -> Container {
    let mut env_vars = run_env(run);
    env_vars.push(env("COJOB_BUCKET", &cfg.bucket));
    env_vars.push(env("COJOB_LEASE_TTL_SECONDS", cfg.ttl_seconds.to_string()));
    for (name, path) in [
        ("POD_NAME", "metadata.name"),
        ("POD_UID", "metadata.uid"),
        ("NODE_NAME", "spec.nodeName"),
    ] {
        env_vars.push(EnvVar {
            name: name.into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(k8s_openapi::api::core::v1::ObjectFieldSelector {
                    field_path: path.into(),
                    ..Default::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        });
    }
    env_vars.push(EnvVar {
        name: HOLDER_ENV.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: run.secret_name(),
                key: HOLDER_KEY.into(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    });
    env_vars.extend(cfg.env.iter().cloned());
    Container {
        name: SIDECAR_NAME.into(),
        image: Some(cfg.image.clone()),
        args: Some(vec!["sidecar".into()]),
        restart_policy: Some("Always".into()),
        // The workload's containers start only once the sidecar holds the lease: the kubelet
        // starts the next container only after a sidecar's postStart hook returned. A hook
        // that polls every 20 ms opens the gate within 20 ms of the attach; a startup probe
        // would wait for its next period (up to a second, plus the kubelet's initial jitter).
        lifecycle: Some(Lifecycle {
            post_start: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(start_gate()),
                }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        }),
        env: Some(env_vars),
        // The run's Secret also carries the store credentials forwarded by the controller;
        // a namespace's own credentials Secret, when configured, comes after and wins.
        env_from: Some(
            std::iter::once(run.secret_name())
                .chain(cfg.credentials_secret.clone())
                .map(|name| EnvFromSource {
                    secret_ref: Some(SecretEnvSource {
                        name,
                        optional: Some(false),
                    }),
                    ..EnvFromSource::default()
                })
                .collect(),
        ),
        volume_mounts: Some(vec![shared_mount()]),
        // Complete for the `restricted` Pod Security level, whatever the pod's own settings.
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(SIDECAR_UID),
            run_as_group: Some(SIDECAR_UID),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..SecurityContext::default()
        }),
        // Enough for a renewal every ttl/3; counted against quotas like any container.
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".into(), Quantity("10m".into())),
                ("memory".into(), Quantity("32Mi".into())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".into(),
                Quantity("128Mi".into()),
            )])),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    }
}

/// Why `template` cannot be used: it names a container `cojob-sidecar`, a volume `cojob`, or
/// mounts something at `/var/run/cojob`, which the pod builder adds itself. (CEL cannot check
/// this at apply time within its cost budget: the pod schema's lists are unbounded.)
///
/// ```
/// let t: k8s_openapi::api::core::v1::PodTemplateSpec = serde_json::from_value(serde_json::json!(
///     {"spec": {"containers": [{"name": "cojob-sidecar", "image": "x"}]}})).unwrap();
/// let why = cojob_controller::pod::reserved_conflict(&t).unwrap();
/// assert!(why.contains("cojob-sidecar is reserved"), "{why}");
/// ```
pub fn reserved_conflict(template: &k8s_openapi::api::core::v1::PodTemplateSpec) -> Option<String> {
    let spec = template.spec.as_ref()?;
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        if c.name == SIDECAR_NAME {
            return Some(format!(
                "template: the container name {SIDECAR_NAME} is reserved for the lease sidecar"
            ));
        }
        if c.volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path.trim_end_matches('/') == SHARED_MOUNT)
        {
            return Some(format!(
                "template: container {}: the mount path {SHARED_MOUNT} is reserved for the run's shared volume",
                c.name
            ));
        }
    }
    if spec
        .volumes
        .iter()
        .flatten()
        .any(|v| v.name == SHARED_VOLUME)
    {
        return Some(format!(
            "template: the volume name {SHARED_VOLUME} is reserved for the run's shared volume"
        ));
    }
    None
}

/// Starts a workload container's `command` under `cojob wrap` (the self-fence, see
/// [`crate::wrap`]): `[<shared>/cojob, wrap, --ttl-seconds, <ttl>, --, <command>...]`; its
/// `args` follow as before. A container without a `command` runs its image's entrypoint,
/// which the pod builder cannot see, and is left as it is.
fn wrapped(mut c: Container, ttl_seconds: i64) -> Container {
    if let Some(command) = c.command.take().filter(|c| !c.is_empty()) {
        let mut full = vec![
            format!("{SHARED_MOUNT}/{}", crate::sidecar::WRAPPER_FILE),
            "wrap".into(),
            "--ttl-seconds".into(),
            ttl_seconds.to_string(),
            "--".into(),
        ];
        full.extend(command);
        c.command = Some(full);
    }
    c
}

/// Builds the pod of one attempt from the job's template.
///
/// - name `<runId>-<epoch>`, in the job's namespace, owned by the job;
/// - labels for the job, run and epoch (on top of the template's);
/// - `COJOB_*` env in every container; the shared volume in every container;
/// - each workload container's `command` under `cojob wrap`, the self-fence;
/// - the sidecar first among the init containers, so it starts before the others;
/// - `restartPolicy: Never`: a failed attempt is retried under a new epoch, not restarted;
/// - the [`RESULT_FINALIZER`], so the pod's outcome outlives a deletion until it is recorded;
/// - the scheduling gate [`HOLDER_GATE`]: the pod is not scheduled until its holder Secret
///   exists (the controller creates the Secret, owned by the pod, then removes the gate), so
///   the kubelet never sees it without its Secret. A pod created well ahead of its tick goes
///   without it ([`gate_free`], [`drop_holder_gate`]).
pub fn build_pod(
    template: &k8s_openapi::api::core::v1::PodTemplateSpec,
    namespace: &str,
    owner: OwnerReference,
    job_name: &str,
    run: &RunIdentity,
    cfg: &SidecarConfig,
    active_deadline_seconds: Option<i64>,
) -> Pod {
    let mut meta = template.metadata.clone().unwrap_or_default();
    let mut spec = template.spec.clone().unwrap_or_default();
    meta.name = Some(run.pod_name());
    meta.generate_name = None;
    meta.namespace = Some(namespace.into());
    meta.owner_references = Some(vec![owner]);
    let finalizers = meta.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == RESULT_FINALIZER) {
        finalizers.push(RESULT_FINALIZER.into());
    }
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(LABEL_JOB.into(), job_name.into());
    labels.insert(LABEL_RUN.into(), run.run_id.clone());
    labels.insert(LABEL_EPOCH.into(), run.epoch.to_string());

    let with_run = |mut c: Container| {
        let mut e = run_env(run);
        e.extend(c.env.take().unwrap_or_default());
        c.env = Some(e);
        c.volume_mounts
            .get_or_insert_with(Vec::new)
            .push(shared_mount());
        c
    };
    let ttl = cfg.ttl_seconds;
    spec.containers = spec
        .containers
        .into_iter()
        .map(with_run)
        .map(|c| wrapped(c, ttl))
        .collect();
    let mut init = vec![sidecar(run, cfg)];
    init.extend(
        spec.init_containers
            .take()
            .unwrap_or_default()
            .into_iter()
            .map(with_run),
    );
    spec.init_containers = Some(init);
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: SHARED_VOLUME.into(),
        empty_dir: Some(Default::default()),
        ..Volume::default()
    });
    spec.restart_policy = Some("Never".into());
    spec.scheduling_gates
        .get_or_insert_with(Vec::new)
        .push(PodSchedulingGate {
            name: HOLDER_GATE.into(),
        });
    if active_deadline_seconds.is_some() {
        spec.active_deadline_seconds = active_deadline_seconds;
    }
    Pod {
        metadata: meta,
        spec: Some(spec),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodTemplateSpec;

    fn template() -> PodTemplateSpec {
        serde_json::from_value(serde_json::json!({
            "metadata": {"labels": {"app": "etl"}},
            "spec": {
                "restartPolicy": "OnFailure",
                "initContainers": [{"name": "setup", "image": "busybox"}],
                "containers": [{"name": "main", "image": "etl:1", "env": [{"name": "MODE", "value": "full"}]}]
            }
        }))
        .unwrap()
    }

    fn run() -> RunIdentity {
        RunIdentity {
            run_id: "nightly-1786240800".into(),
            epoch: 2,
            attempt: 2,
            fire_time: "2026-08-09T02:00:00.000000Z".into(),
            trigger: None,
            lease_key: "v1/jobs/ns/nightly/runs/nightly-1786240800/lease".into(),
            secret: "nightly-1786240800-2-holder-abc123".into(),
        }
    }

    fn build() -> Pod {
        let owner = OwnerReference {
            api_version: "cojob.dev/v1alpha1".into(),
            kind: "CoordinatedJob".into(),
            name: "nightly".into(),
            uid: "u-1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        let cfg = SidecarConfig {
            image: "localhost/cojob/cojob:dev".into(),
            bucket: "s3://b/p".into(),
            env: vec![env("AWS_REGION", "us-east-1")],
            ttl_seconds: 30,
            credentials_secret: Some("cojob-store".into()),
        };
        build_pod(&template(), "ns", owner, "nightly", &run(), &cfg, Some(600))
    }

    /// A sidecar configuration with nothing but an image, a bucket and a 12 s ttl.
    fn bare_config() -> SidecarConfig {
        SidecarConfig {
            image: "i".into(),
            bucket: "s3://b/p".into(),
            env: vec![],
            ttl_seconds: 12,
            credentials_secret: None,
        }
    }

    #[test]
    fn only_the_holder_gate_is_dropped() {
        let mut t = template();
        t.spec.as_mut().unwrap().scheduling_gates = Some(vec![PodSchedulingGate {
            name: "example.com/quota".into(),
        }]);
        let cfg = bare_config();
        let mut pod = build_pod(&t, "ns", OwnerReference::default(), "j", &run(), &cfg, None);
        let names = |p: &Pod| -> Vec<String> {
            let gates = p.spec.as_ref().unwrap().scheduling_gates.iter().flatten();
            gates.map(|g| g.name.clone()).collect()
        };
        assert_eq!(names(&pod), ["example.com/quota", HOLDER_GATE]);
        drop_holder_gate(&mut pod);
        assert!(!is_gated(&pod));
        assert_eq!(
            names(&pod),
            ["example.com/quota"],
            "the template's gate stays"
        );
        drop_holder_gate(&mut pod); // idempotent
        assert_eq!(names(&pod), ["example.com/quota"]);
    }

    #[test]
    fn a_workload_command_runs_under_the_wrapper() {
        let c = |v: serde_json::Value| -> Container { serde_json::from_value(v).unwrap() };
        let w = wrapped(
            c(
                serde_json::json!({"name": "main", "command": ["sh", "-c", "work $(COJOB_RUN_ID)"], "args": ["x"]}),
            ),
            30,
        );
        assert_eq!(
            w.command.unwrap(),
            [
                "/var/run/cojob/cojob",
                "wrap",
                "--ttl-seconds",
                "30",
                "--",
                "sh",
                "-c",
                "work $(COJOB_RUN_ID)"
            ]
        );
        assert_eq!(w.args.unwrap(), ["x"], "args follow unchanged");
        let bare = wrapped(c(serde_json::json!({"name": "main", "args": ["x"]})), 30);
        assert_eq!(bare.command, None, "an image entrypoint cannot be wrapped");
        // In a whole pod: the workload container is wrapped, init containers are not.
        let mut t = template();
        t.spec.as_mut().unwrap().containers[0].command = Some(vec!["etl".into()]);
        let owner = OwnerReference::default();
        let cfg = bare_config();
        let pod = build_pod(&t, "ns", owner, "nightly", &run(), &cfg, None);
        assert!(is_gated(&pod), "held until its holder Secret exists");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.containers[0].command.as_ref().unwrap()[3], "12");
        assert!(spec.init_containers.unwrap().iter().all(|i| {
            i.command
                .as_ref()
                .is_none_or(|c| c[0] != "/var/run/cojob/cojob")
        }));
    }

    #[test]
    fn pod_is_named_by_run_and_epoch_and_owned_by_the_job() {
        let pod = build();
        let finalizers = pod.metadata.finalizers.clone();
        assert_eq!(pod.metadata.name.as_deref(), Some("nightly-1786240800-2"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("ns"));
        let labels = pod.metadata.labels.unwrap();
        assert_eq!(labels["app"], "etl");
        assert_eq!(labels[LABEL_EPOCH], "2");
        assert_eq!(
            pod.metadata.owner_references.unwrap()[0].controller,
            Some(true)
        );
        assert_eq!(build(), build(), "the same inputs give the same pod");
        assert_eq!(
            finalizers,
            Some(vec![RESULT_FINALIZER.to_string()]),
            "the outcome outlives a deletion until it is recorded"
        );
    }

    #[test]
    fn sidecar_is_a_native_sidecar_that_starts_first() {
        let spec = build().spec.unwrap();
        let init = spec.init_containers.unwrap();
        assert_eq!(init[0].name, SIDECAR_NAME);
        assert_eq!(init[0].restart_policy.as_deref(), Some("Always"));
        let from: Vec<String> = init[0]
            .env_from
            .iter()
            .flatten()
            .filter_map(|e| e.secret_ref.as_ref().map(|r| r.name.clone()))
            .collect();
        assert_eq!(from, ["nightly-1786240800-2-holder-abc123", "cojob-store"]);
        let gate = init[0]
            .lifecycle
            .clone()
            .and_then(|l| l.post_start)
            .expect("a postStart hook");
        assert_eq!(
            gate.exec.and_then(|e| e.command),
            Some(vec![
                "/cojob".to_string(),
                "ready".to_string(),
                "--wait".to_string(),
                "120s".to_string(),
            ]),
            "the workload waits until the sidecar holds the lease"
        );
        assert!(init[0].startup_probe.is_none());
        assert_eq!(init[1].name, "setup");
        let sc = init[0].security_context.clone().unwrap();
        assert_eq!(
            (sc.run_as_non_root, sc.read_only_root_filesystem),
            (Some(true), Some(true))
        );
        let env = init[0].env.clone().unwrap();
        let holder = env.iter().find(|e| e.name == "COJOB_HOLDER").unwrap();
        assert!(
            holder.value.is_none(),
            "the holder is never a plain env value"
        );
        let secret = holder.value_from.clone().unwrap().secret_key_ref.unwrap();
        assert_eq!(secret.name, "nightly-1786240800-2-holder-abc123");
        assert_eq!(
            holder_secret_of(&build()).as_deref(),
            Some("nightly-1786240800-2-holder-abc123")
        );
        assert!(env.iter().any(|e| e.name == "AWS_REGION"));
    }

    #[test]
    fn every_container_gets_the_run_env_and_the_shared_volume() {
        let spec = build().spec.unwrap();
        let main = &spec.containers[0];
        let names: Vec<&str> = main
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        for var in [
            "COJOB_RUN_ID",
            "COJOB_EPOCH",
            "COJOB_FIRE_TIME",
            "COJOB_ATTEMPT",
            "COJOB_LEASE_KEY",
            "MODE",
        ] {
            assert!(names.contains(&var), "{var} missing: {names:?}");
        }
        let epoch = main
            .env
            .as_ref()
            .unwrap()
            .iter()
            .find(|e| e.name == "COJOB_EPOCH")
            .unwrap();
        assert_eq!(epoch.value.as_deref(), Some("2"));
        assert_eq!(
            main.volume_mounts.as_ref().unwrap()[0].mount_path,
            SHARED_MOUNT
        );
        assert_eq!(spec.volumes.unwrap()[0].name, SHARED_VOLUME);
        assert_eq!(
            spec.restart_policy.as_deref(),
            Some("Never"),
            "attempts are retried by epoch"
        );
        assert_eq!(spec.active_deadline_seconds, Some(600));
    }
}
