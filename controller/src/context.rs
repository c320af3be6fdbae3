//! What reconcile and the sweeper share: the clients, the store and the settings, plus a
//! per-object [`JobScope`] with its keys, APIs and names.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};

use crate::crd::CoordinatedJob;
use crate::layout::JobKeys;

/// The controller's settings, from the command line.
#[derive(Clone)]
pub struct Settings {
    /// The image of the injected sidecar.
    pub sidecar_image: String,
    /// The store URL, passed to sidecars.
    pub bucket: String,
    /// Environment copied into every run's Secret for its sidecar (store credentials and
    /// endpoints). Values are secrets: never logged.
    pub forwarded_env: BTreeMap<String, String>,
    /// How often the leases of active runs that are not quiet are checked.
    pub sweep_interval: Duration,
    /// How far past its deadline a lease must be before it is taken over.
    pub clock_skew_allowance: Duration,
    /// The longest a job with no active run goes without a pass reading its index
    /// (`--index-resync`); its ticks are read at once whatever this says.
    pub index_resync: Duration,
    /// A Secret, in each run's namespace, with the sidecar's store credentials.
    pub sidecar_credentials_secret: Option<String>,
    /// The shortest interval between two ticks a schedule may have.
    pub min_schedule_interval: Duration,
    /// The shortest lease ttl a job may ask for.
    pub min_lease_ttl: Duration,
    /// How long the controller's scheduler holds a job's pass for more of its events
    /// (`--reconcile-debounce`); requeues are shortened by as much.
    pub debounce: Duration,
    /// The key lease holders are derived under (never printed).
    pub holder_key: crate::sweeper::holder::HolderKey,
    /// Mints each attempt's short-lived credentials, scoped to its run (`--sts-role-arn`);
    /// `None` to give sidecars only what is forwarded or `sidecar_credentials_secret`.
    pub minter: Option<std::sync::Arc<crate::credentials::Minter>>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("sidecar_image", &self.sidecar_image)
            .field("bucket", &self.bucket)
            .field(
                "forwarded_env",
                &self.forwarded_env.keys().collect::<Vec<_>>(),
            )
            .field("sweep_interval", &self.sweep_interval)
            .field("clock_skew_allowance", &self.clock_skew_allowance)
            .field("index_resync", &self.index_resync)
            .field(
                "sidecar_credentials_secret",
                &self.sidecar_credentials_secret,
            )
            .field("min_schedule_interval", &self.min_schedule_interval)
            .field("min_lease_ttl", &self.min_lease_ttl)
            .field("debounce", &self.debounce)
            .field("minted_credentials", &self.minter.is_some())
            .finish_non_exhaustive()
    }
}

/// Shared by every reconcile.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// The bucket.
    pub db: cojob::Db,
    /// Publishes Events.
    pub recorder: Recorder,
    /// Publishes the Events about one run, which never repeat, without the Recorder's cache.
    pub run_events: crate::announce::RunEvents,
    /// The settings.
    pub settings: Settings,
    /// The metrics.
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// The rate limit of `RunSkipped` Events.
    pub skipped: crate::announce::SkippedTicks,
    /// When each running attempt's minted credentials are next renewed.
    pub renewals: crate::credentials::Renewals,
    /// The run pods the controller's watch has seen, by job (empty and unused when reconcile
    /// is called without [`crate::reconcile::run`], as in tests: passes then list pods).
    pub pod_cache: crate::pod_cache::PodCache,
    /// The backoff of jobs whose passes fail.
    pub retries: crate::retry::Retries,
    /// Which runs each job's passes sweep (every run when it knows nothing, as in tests).
    pub focus: crate::sweeper::focus::Focus,
}

/// One CoordinatedJob as reconcile sees it.
pub struct JobScope<'a> {
    /// The shared context.
    pub cx: &'a Context,
    /// The object.
    pub job: &'a CoordinatedJob,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
    /// Its keys in the bucket.
    pub keys: JobKeys,
    /// Pods in its namespace.
    pub pods: Api<Pod>,
    /// Secrets in its namespace.
    pub secrets: Api<Secret>,
}

/// An object without a namespace or UID cannot be reconciled (the API server always sets
/// them; this guards hand-made objects in tests).
#[derive(Debug, thiserror::Error)]
#[error("the CoordinatedJob has no {0}")]
pub struct MissingField(pub &'static str);

impl<'a> JobScope<'a> {
    /// The scope of `job`.
    pub fn new(cx: &'a Context, job: &'a CoordinatedJob) -> Result<JobScope<'a>, MissingField> {
        let namespace = job.namespace().ok_or(MissingField("namespace"))?;
        let uid = job.uid().ok_or(MissingField("uid"))?;
        let name = job.name_any();
        Ok(JobScope {
            cx,
            job,
            keys: JobKeys::new(&namespace, &name, &uid),
            pods: Api::namespaced(cx.client.clone(), &namespace),
            secrets: Api::namespaced(cx.client.clone(), &namespace),
            namespace,
            name,
            uid,
        })
    }

    /// The owner reference that makes the job the controller of its pods.
    pub fn owner(&self) -> OwnerReference {
        OwnerReference {
            api_version: CoordinatedJob::api_version(&()).into_owned(),
            kind: CoordinatedJob::kind(&()).into_owned(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    /// True when `owners` name this job (by UID) as controller.
    pub fn owns(&self, owners: &[OwnerReference]) -> bool {
        owners
            .iter()
            .any(|o| o.uid == self.uid && o.controller == Some(true))
    }

    /// The lease ttl.
    pub fn ttl(&self) -> Duration {
        Duration::from_secs(self.job.spec.lease.ttl_seconds.max(1).unsigned_abs())
    }

    /// How long the lease of an attempt that has not started holds: the longer of the ttl and
    /// the start timeout. Nothing runs under it (the workload starts only once its sidecar
    /// attached, and attaching renews with [`ttl`](Self::ttl)), and a pod that never starts
    /// fails its attempt at the start timeout anyway; so a controller whose passes come late
    /// (a queue behind thousands of ticks, an overloaded API server) does not lose pending
    /// attempts to takeovers that only cost a new pod. The controller writes it when it
    /// acquires an epoch and when it renews a pending attempt.
    pub fn pending_ttl(&self) -> Duration {
        let start = Duration::from_secs(self.job.spec.start_timeout_seconds.max(1).unsigned_abs());
        self.ttl().max(start)
    }

    /// Both ttls, for [`crate::run::quiet_until`].
    pub fn lifetimes(&self) -> crate::run::Lifetimes {
        crate::run::Lifetimes {
            ttl: self.ttl(),
            pending_ttl: self.pending_ttl(),
        }
    }

    /// The timing rules of this job's runs at the store clock's `now`.
    pub fn timing(&self) -> crate::run::Timing {
        crate::run::Timing {
            now: self.cx.db.clock().now(),
            skew_allowance: self.cx.settings.clock_skew_allowance,
            start_timeout: Duration::from_secs(
                self.job.spec.start_timeout_seconds.max(1).unsigned_abs(),
            ),
        }
    }

    /// The job's `maxAttempts`.
    pub fn max_attempts(&self) -> u32 {
        u32::try_from(self.job.spec.max_attempts.max(1)).unwrap_or(1)
    }

    /// Publishes an Event about the job's state (a condition's cause, a warning that holds
    /// while its cause does) through kube-runtime's Recorder, which folds its repeats within
    /// 6 minutes into one series; a failure to publish is logged, never fatal.
    pub async fn event(&self, type_: EventType, reason: &str, note: String) {
        self.publish(type_, reason, note, None, false).await;
    }

    /// Publishes what a pass announced ([`crate::announce`]): an Event about the job that
    /// concerns one pod (its `related` object) if `pod` is given. A run's step (it names its
    /// pod) or a decision (a `Normal` announcement) happens once, so it is created as its own
    /// Event ([`crate::announce::RunEvents`]); a warning without a pod may hold for many
    /// passes (an invalid annotation), and goes through the Recorder to become a series.
    pub async fn run_event(&self, type_: EventType, reason: &str, note: String, pod: Option<&str>) {
        let once = pod.is_some() || type_ == EventType::Normal;
        self.publish(type_, reason, note, pod, once).await;
    }

    async fn publish(
        &self,
        type_: EventType,
        reason: &str,
        note: String,
        pod: Option<&str>,
        once: bool,
    ) {
        let secondary = pod.map(|name| ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(name.into()),
            namespace: Some(self.namespace.clone()),
            ..ObjectReference::default()
        });
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary,
        };
        let regarding = self.job.object_ref(&());
        let published = if once {
            self.cx.run_events.publish(&ev, &regarding).await
        } else {
            self.cx.recorder.publish(&ev, &regarding).await
        };
        if let Err(e) = published {
            tracing::warn!(job = %self.name, namespace = %self.namespace, reason, error = %e, "could not publish an event");
        }
    }

    /// A Warning Event.
    pub async fn warning(&self, reason: &str, note: String) {
        self.event(EventType::Warning, reason, note).await;
    }
}
