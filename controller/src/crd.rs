//! The `CoordinatedJob` resource (`cojob.dev/v1alpha1`, short name `cojob`).
//!
//! The CRD is generated from these types (`cojob crd`, checked into `crds/`). Bad specs are
//! rejected at apply time by the schema and CEL rules: a cron expression that is not 5 fields
//! (or 6 with leading seconds), a time zone that is not an IANA name (an enum of every name
//! `chrono-tz` knows), a non-positive lease ttl, values outside their enums, and a template with
//! no container. What the schema cannot judge (a field that parses as 5 fields but is not cron)
//! is reported by the controller through a `False` condition and an Event.

/// The annotation prefix that asks for a manual run (`cojob trigger`):
/// `trigger.cojob.dev/<key>` on a CoordinatedJob requests one run for `key`, exactly once per
/// key and object. The value is free (who asked, and why). The controller removes the
/// annotation once the decision is recorded; [`check_trigger_key`](crate::layout::check_trigger_key)
/// says which keys are valid.
pub const TRIGGER_ANNOTATION_PREFIX: &str = "trigger.cojob.dev/";

/// The annotation prefix that asks to cancel an active run (`cojob cancel`):
/// `cancel.cojob.dev/<run id>`. The run is cancelled as a deletion of the object would cancel
/// it (the workload is asked to stop; a success that happened stays a success), and the
/// annotation is removed once the run has ended.
pub const CANCEL_ANNOTATION_PREFIX: &str = "cancel.cojob.dev/";

/// The annotation prefix that asks to run the ticks of a past range (`cojob backfill`):
/// `backfill.cojob.dev/<id>` with the value `{"from": "<RFC 3339>", "to": "<RFC 3339>",
/// "parallelism": N}` (see [`crate::backfill`]). The annotation is removed once every tick of
/// the range is decided and its runs ended.
pub const BACKFILL_ANNOTATION_PREFIX: &str = "backfill.cojob.dev/";

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A job that runs exactly once per schedule tick (or once, without a schedule), coordinated
/// through conditional writes in an object-storage bucket.
// Each printcolumn(...) repeats `type_ = …`; clippy reads them as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "cojob.dev",
    version = "v1alpha1",
    kind = "CoordinatedJob",
    plural = "coordinatedjobs",
    shortname = "cojob",
    namespaced,
    status = "CoordinatedJobStatus",
    derive = "PartialEq",
    doc = "A job that runs exactly once per schedule tick, fenced through an object-storage bucket",
    validation = Rule::new("size(self.metadata.name) <= 40").message("metadata.name must be at most 40 characters, so run, pod and Secret names stay unique and within Kubernetes' 63-character limits"),
    printcolumn(name = "Schedule", type_ = "string", json_path = ".spec.schedule"),
    printcolumn(
        name = "Time Zone",
        type_ = "string",
        json_path = ".spec.timeZone",
        priority = "1"
    ),
    printcolumn(name = "Suspend", type_ = "boolean", json_path = ".spec.suspend"),
    printcolumn(
        name = "Active",
        type_ = "integer",
        json_path = ".status.counters.active"
    ),
    printcolumn(
        name = "Succeeded",
        type_ = "integer",
        json_path = ".status.counters.succeeded"
    ),
    printcolumn(
        name = "Failed",
        type_ = "integer",
        json_path = ".status.counters.failed"
    ),
    printcolumn(
        name = "Last Schedule",
        type_ = "date",
        json_path = ".status.lastScheduleTime"
    ),
    printcolumn(
        name = "Next Schedule",
        type_ = "string",
        json_path = ".status.nextScheduleTime",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct CoordinatedJobSpec {
    /// A cron expression: 5 fields (minute hour day-of-month month day-of-week), or 6 with
    /// leading seconds. Absent: one run per object, like a Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    #[x_kube(validation = Rule::new(r"self.matches('^\\s*\\S+(\\s+\\S+){4,5}\\s*$')")
        .message("schedule must have 5 fields (minute hour day month weekday) or 6 with leading seconds"))]
    pub schedule: Option<String>,

    /// The IANA time zone the schedule is read in, like `Europe/Paris` (default `UTC`).
    /// Daylight-saving gaps and folds are handled: see the `schedule` module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_zone_schema")]
    pub time_zone: Option<String>,

    /// A tick seen later than this after its time is recorded as missed, never run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("startingDeadlineSeconds must not be negative"))]
    pub starting_deadline_seconds: Option<i64>,

    /// Creates each scheduled run's pod this many seconds before its tick, so that the pod is
    /// scheduled, its images pulled and its sidecar attached by the tick; the workload's
    /// containers still start at the tick, by the node's clock, never before. A run is decided
    /// (claimed) when its pod is created; it is prepared ahead only while the job has no active
    /// run, and a job suspended before the tick cancels it. Absent or 0: at the tick. See
    /// docs/operator.md for how it meets suspension, concurrency and schedule edits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 600").message("prestartSeconds must be between 0 and 600"))]
    pub prestart_seconds: Option<i64>,

    /// What to do with ticks that fell due while the controller was down.
    #[serde(default)]
    pub catch_up: CatchUpPolicy,

    /// Whether runs of consecutive ticks may overlap.
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,

    /// Suspends scheduling: due ticks are recorded as skipped; active runs continue.
    #[serde(default)]
    pub suspend: bool,

    /// The lease that fences each run's pod.
    #[serde(default)]
    pub lease: LeaseSpec,

    /// How many attempts a run gets (after a failure or a lost lease), each under a new epoch.
    #[serde(default = "default_max_attempts")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 100").message("maxAttempts must be between 1 and 100"))]
    pub max_attempts: i32,

    /// How long one attempt may run before it is stopped and counted as failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0").message("activeDeadlineSeconds must be positive"))]
    pub active_deadline_seconds: Option<i64>,

    /// How long an attempt's pod may take to start its workload (pull its images, attach its
    /// sidecar) before the attempt fails with `StartTimeout`, counted from when its node's
    /// kubelet took it up (`status.startTime`), or, for a pod no node fits, from its creation.
    /// A pod still waiting in the scheduler's queue, or bound to a node whose kubelet has not
    /// taken it up, is not late. Until then the controller keeps the attempt's lease alive, so
    /// a slow start costs nothing.
    #[serde(default = "default_start_timeout")]
    #[x_kube(validation = Rule::new("self >= 1").message("startTimeoutSeconds must be at least 1"))]
    pub start_timeout_seconds: i64,

    /// How many succeeded runs `status.recent` keeps.
    #[serde(default = "default_successful_history")]
    #[x_kube(validation = Rule::new("self >= 0"))]
    pub successful_runs_history_limit: i32,

    /// How many failed runs `status.recent` keeps.
    #[serde(default = "default_failed_history")]
    #[x_kube(validation = Rule::new("self >= 0"))]
    pub failed_runs_history_limit: i32,

    /// The pod to run: a Kubernetes `PodTemplateSpec` (see `kubectl explain pod.spec` for
    /// its fields, whose descriptions this CRD leaves out to stay small).
    // Kept encoded in memory (`crate::template`); the schema is PodTemplateSpec's.
    #[schemars(schema_with = "pod_template_schema")]
    #[x_kube(validation = Rule::new("has(self.spec) && has(self.spec.containers) && size(self.spec.containers) > 0")
        .message("template must have at least one container"))]
    pub template: crate::template::PodTemplate,
}

fn default_max_attempts() -> i32 {
    3
}
fn default_start_timeout() -> i64 {
    600
}
fn default_successful_history() -> i32 {
    3
}
fn default_failed_history() -> i32 {
    1
}

/// Every IANA time zone name, as a schema enum, so an unknown zone is refused at apply time.
fn time_zone_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let names: Vec<&str> = chrono_tz::TZ_VARIANTS.iter().map(|tz| tz.name()).collect();
    schemars::json_schema!({
        "type": "string",
        "description": "An IANA time zone name, like Europe/Paris (default UTC).",
        "enum": names,
    })
}

/// The `PodTemplateSpec` schema without its field descriptions.
///
/// Kubernetes documents those fields already (`kubectl explain pod.spec`), and they are 80 % of
/// the schema: with them the CRD is about 500 KB, over the 256 KB that client-side
/// `kubectl apply` can store in its last-applied annotation. Types, formats, enums and the
/// structure stay, so the API server still validates every template at apply time.
fn pod_template_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<PodTemplateSpec>();
    if let Some(object) = schema.as_object_mut() {
        object.remove("description");
        object.values_mut().for_each(strip_descriptions);
    }
    schema
}

/// Removes every `description` keyword (a string) from a schema tree, keeping properties that
/// happen to be named `description` (their value is a schema object, not a string).
fn strip_descriptions(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            if map
                .get("description")
                .is_some_and(serde_json::Value::is_string)
            {
                map.remove("description");
            }
            map.values_mut().for_each(strip_descriptions);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_descriptions),
        _ => {}
    }
}

/// The most `prestartSeconds` allows (the CEL rule's bound): ten minutes.
pub const MAX_PRESTART_SECONDS: i64 = 600;

impl CoordinatedJobSpec {
    /// How long before each scheduled tick its run is decided and its pod created
    /// (`prestartSeconds`, clamped to `0..=`[`MAX_PRESTART_SECONDS`]).
    ///
    /// ```
    /// let spec: cojob_controller::crd::CoordinatedJobSpec = serde_json::from_value(
    ///     serde_json::json!({"schedule": "* * * * *", "prestartSeconds": 15, "template": {}}),
    /// ).unwrap();
    /// assert_eq!(spec.prestart(), chrono::Duration::seconds(15));
    /// ```
    pub fn prestart(&self) -> chrono::Duration {
        chrono::Duration::seconds(
            self.prestart_seconds
                .unwrap_or(0)
                .clamp(0, MAX_PRESTART_SECONDS),
        )
    }
}

/// What to do with ticks that fell due while nobody was scheduling.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CatchUpPolicy {
    /// Run the most recent due tick; record older ones as missed.
    #[default]
    Latest,
    /// Run every due tick within `startingDeadlineSeconds`, oldest first.
    All,
    /// Run only ticks seen within a minute of their time.
    None,
}

/// Whether runs may overlap.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ConcurrencyPolicy {
    /// Runs may overlap.
    Allow,
    /// A tick that falls due while a run is active is recorded as skipped.
    #[default]
    Forbid,
    /// A tick that falls due while a run is active cancels that run and starts its own.
    Replace,
}

/// The lease of each run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseSpec {
    /// How long a lease holds without renewal; the sidecar renews every third of it. At least
    /// 6 s (a renewal every 2 s at most), so ordinary scheduling and network hiccups do not
    /// cost an attempt; a lost pod is taken over after ttl plus the controller's clock-skew
    /// allowance.
    #[serde(default = "default_ttl")]
    #[x_kube(validation = Rule::new("self >= 6 && self <= 86400").message("lease.ttlSeconds must be between 6 and 86400"))]
    pub ttl_seconds: i64,
}

fn default_ttl() -> i64 {
    60
}

impl Default for LeaseSpec {
    fn default() -> Self {
        LeaseSpec {
            ttl_seconds: default_ttl(),
        }
    }
}

/// What the controller last observed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoordinatedJobStatus {
    /// `Ready`, `ScheduleValid`, `StoreAvailable` and `LastRunFailed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The newest tick decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    /// The next tick.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<Time>,
    /// Runs not yet finished.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active: Vec<RunStatus>,
    /// Finished runs, newest first, within the history limits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent: Vec<RunStatus>,
    /// Counts of runs and decisions since the object was created.
    #[serde(default)]
    pub counters: RunCounters,
}

/// One run of a tick.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunStatus {
    /// The run's deterministic id.
    pub run_id: String,
    /// The tick (fire time, RFC 3339 UTC), `once` for an unscheduled job, or `trigger/<key>`
    /// for a manual run.
    pub tick: String,
    /// The lease epoch of the current attempt.
    pub epoch: i64,
    /// The attempt number, from 1.
    pub attempt: i32,
    /// The pod of the current attempt, `<runId>-<epoch>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// pending, running, succeeded, failed or cancelled.
    pub phase: String,
}

/// Counters of runs and tick decisions.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunCounters {
    /// Runs not yet finished.
    #[serde(default)]
    pub active: i64,
    /// Runs that succeeded.
    #[serde(default)]
    pub succeeded: i64,
    /// Runs that failed after their last attempt.
    #[serde(default)]
    pub failed: i64,
    /// Runs cancelled (by the finalizer or `concurrencyPolicy: Replace`).
    #[serde(default)]
    pub cancelled: i64,
    /// Ticks skipped (suspended, or Forbid while active).
    #[serde(default)]
    pub skipped: i64,
    /// Ticks missed (late past the deadline, or superseded).
    #[serde(default)]
    pub missed: i64,
}

/// The CRD as YAML, exactly as `crds/coordinatedjob.yaml` holds it.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    let body = serde_yaml::to_string(&CoordinatedJob::crd())?;
    Ok(format!(
        "# Generated by `cojob crd` from controller/src/crd.rs; do not edit by hand.\n{body}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crds_directory_matches_the_rust_types() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/coordinatedjob.yaml");
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            on_disk == crd_yaml().unwrap(),
            "crds/coordinatedjob.yaml is out of date: run `cargo run -p cojob-controller -- crd > crds/coordinatedjob.yaml`"
        );
    }

    /// Client-side `kubectl apply` keeps the whole object in an annotation, and annotations
    /// are limited to 256 KiB in total.
    #[test]
    fn the_crd_fits_in_a_client_side_apply_annotation() {
        let json = serde_json::to_string(&CoordinatedJob::crd()).unwrap();
        assert!(
            json.len() < 200 * 1024,
            "the CRD is {} bytes of JSON",
            json.len()
        );
        let crd = serde_json::to_value(CoordinatedJob::crd()).unwrap();
        let template = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["template"];
        // The structure is kept: containers are still typed down to their ports.
        let container = &template["properties"]["spec"]["properties"]["containers"]["items"];
        assert_eq!(
            container["properties"]["ports"]["items"]["properties"]["containerPort"]["type"],
            "integer"
        );
        assert!(
            container["properties"]["image"]
                .get("description")
                .is_none()
        );
        assert!(
            template["description"]
                .as_str()
                .unwrap_or("")
                .contains("PodTemplateSpec")
        );
    }

    #[test]
    fn defaults_fill_an_almost_empty_spec() {
        let spec: CoordinatedJobSpec = serde_json::from_value(serde_json::json!({
            "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}
        }))
        .unwrap();
        assert_eq!(spec.max_attempts, 3);
        assert_eq!(spec.lease.ttl_seconds, 60);
        assert_eq!(spec.start_timeout_seconds, 600);
        assert_eq!(spec.catch_up, CatchUpPolicy::Latest);
        assert_eq!(spec.concurrency_policy, ConcurrencyPolicy::Forbid);
        assert!(spec.schedule.is_none());
    }

    #[test]
    fn schema_carries_the_apply_time_checks() {
        let crd = serde_json::to_string(&CoordinatedJob::crd()).unwrap();
        for needle in [
            "Europe/Paris",
            "lease.ttlSeconds must be between 6 and 86400",
            "startTimeoutSeconds must be at least 1",
            "template must have at least one container",
            "schedule must have 5 fields",
            "\"Forbid\"",
            "\"cojob\"",
        ] {
            assert!(crd.contains(needle), "the CRD lacks {needle}");
        }
    }
}
