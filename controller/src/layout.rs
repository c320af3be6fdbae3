//! The bucket layout: where each CoordinatedJob keeps its decisions and runs.
//!
//! Every key lives under the `--bucket` URL's prefix, then under one folder per object:
//!
//! ```text
//! v1/jobs/<namespace>/<name>/<uid>/index                 the job's index (a doc): cursor, active and recent runs, counters
//! v1/jobs/<namespace>/<name>/<uid>/ticks/<fire-time>     a claim: {"run_id"}, {"skipped"} or {"missed"}
//! v1/jobs/<namespace>/<name>/<uid>/ticks/once            the one decision of a job without a schedule
//! v1/jobs/<namespace>/<name>/<uid>/triggers/<key>        a claim: the decision of a manual run, once per key
//! v1/jobs/<namespace>/<name>/<uid>/backfills/<id>        a doc: a backfill's range and progress
//! v1/jobs/<namespace>/<name>/<uid>/runs/<run-id>/lease   the run's lease; its state is a [`RunState`](crate::run::RunState)
//! v1/controller/leader                                  the leader lease of `--leader-elect`; its state names the leader
//! ```
//!
//! The object's UID is part of the path, so a CoordinatedJob deleted and created again under
//! the same name starts afresh instead of finding the old object's decisions.

use chrono::{DateTime, Utc};

/// The version prefix of every key; bumped only with a migration.
pub const VERSION: &str = "v1";

/// The lease that `--leader-elect` replicas compete for ([`crate::leader`]). It is outside
/// `jobs/`, so no namespace's prefix (and no tenant's scoped credentials) reaches it.
///
/// ```
/// assert_eq!(cojob_controller::layout::leader(), "v1/controller/leader");
/// ```
pub fn leader() -> String {
    format!("{VERSION}/controller/leader")
}

/// The keys of one CoordinatedJob.
///
/// ```
/// use cojob_controller::layout::JobKeys;
/// let keys = JobKeys::new("prod", "nightly", "6f1c");
/// let t = "2026-08-09T02:00:00Z".parse().unwrap();
/// assert_eq!(keys.tick(Some(t)), "v1/jobs/prod/nightly/6f1c/ticks/2026-08-09T02:00:00.000000Z");
/// assert_eq!(keys.tick(None), "v1/jobs/prod/nightly/6f1c/ticks/once");
/// assert_eq!(keys.lease("nightly-1786240800"), "v1/jobs/prod/nightly/6f1c/runs/nightly-1786240800/lease");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobKeys {
    base: String,
}

impl JobKeys {
    /// The keys of the object `namespace/name` with `uid`.
    pub fn new(namespace: &str, name: &str, uid: &str) -> JobKeys {
        JobKeys {
            base: format!("{VERSION}/jobs/{namespace}/{name}/{uid}"),
        }
    }

    /// The folder that holds everything of this object.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The job's index document.
    pub fn index(&self) -> String {
        format!("{}/index", self.base)
    }

    /// The decision claim of a tick (`None`: the single run of a job without a schedule).
    pub fn tick(&self, fire_time: Option<DateTime<Utc>>) -> String {
        match fire_time {
            Some(t) => format!("{}/ticks/{}", self.base, cojob::json::format_time(t)),
            None => format!("{}/ticks/once", self.base),
        }
    }

    /// The decision claim of the manual run requested with trigger key `key`.
    pub fn trigger(&self, key: &str) -> String {
        format!("{}/triggers/{key}", self.base)
    }

    /// The progress document of backfill `id`.
    pub fn backfill(&self, id: &str) -> String {
        format!("{}/backfills/{id}", self.base)
    }

    /// The folder of a run: its lease and its steps, all that its sidecar touches (and all
    /// that its minted credentials open, see [`crate::credentials`]).
    pub fn run_folder(&self, run_id: &str) -> String {
        format!("{}/runs/{run_id}", self.base)
    }

    /// The lease of a run.
    pub fn lease(&self, run_id: &str) -> String {
        format!("{}/lease", self.run_folder(run_id))
    }
}

/// The longest job-name prefix kept in a run id, so that pod names (`<runId>-<epoch>`) and
/// label values stay within Kubernetes' 63-character limit.
pub const RUN_ID_NAME_MAX: usize = 40;

/// The deterministic run id of a tick: `<name>-<unix seconds>`, or `<name>-once` for a job
/// without a schedule. Long names are cut to [`RUN_ID_NAME_MAX`] characters (without a
/// trailing `-`).
///
/// ```
/// use cojob_controller::layout::run_id;
/// let t = "2026-08-09T02:00:00Z".parse().unwrap();
/// assert_eq!(run_id("nightly", Some(t)), "nightly-1786240800");
/// assert_eq!(run_id("migrate", None), "migrate-once");
/// ```
pub fn run_id(name: &str, fire_time: Option<DateTime<Utc>>) -> String {
    let short = run_id_name(name);
    match fire_time {
        Some(t) => format!("{short}-{}", t.timestamp()),
        None => format!("{short}-once"),
    }
}

/// The job-name part of a run id: cut to [`RUN_ID_NAME_MAX`], without a trailing `-` or `.`.
fn run_id_name(name: &str) -> String {
    let mut short: String = name.chars().take(RUN_ID_NAME_MAX).collect();
    while short.ends_with('-') || short.ends_with('.') {
        short.pop();
    }
    short
}

/// The deterministic run id of the manual run requested with trigger key `key`:
/// `<name>-m<the first 12 hex digits of SHA-256(key)>`. Every replica, and a retried request,
/// computes the same id; it never looks like a tick's (`m` is not a digit).
///
/// ```
/// use cojob_controller::layout::trigger_run_id;
/// let id = trigger_run_id("nightly", "deploy-4711");
/// assert!(id.starts_with("nightly-m") && id.len() == "nightly-m".len() + 12, "{id}");
/// assert_eq!(id, trigger_run_id("nightly", "deploy-4711"));
/// assert_ne!(id, trigger_run_id("nightly", "deploy-4712"));
/// ```
pub fn trigger_run_id(name: &str, key: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let hex: String = digest.as_ref()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{}-m{hex}", run_id_name(name))
}

/// Checks a trigger key: what an annotation name allows (1 to 63 characters, letters, digits,
/// `-`, `_` and `.`, beginning and ending with a letter or digit).
///
/// ```
/// use cojob_controller::layout::check_trigger_key;
/// assert!(check_trigger_key("release-2026.12.03_1").is_ok());
/// assert!(check_trigger_key("-x").is_err() && check_trigger_key("a/b").is_err());
/// assert!(check_trigger_key(&"k".repeat(64)).is_err() && check_trigger_key("").is_err());
/// ```
pub fn check_trigger_key(key: &str) -> Result<(), String> {
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let chars_ok = key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if key.is_empty() || key.len() > 63 || !chars_ok {
        return Err(format!(
            "trigger key {key:?} must be 1 to 63 letters, digits, '-', '_' or '.'"
        ));
    }
    if !edge_ok(key.chars().next()) || !edge_ok(key.chars().last()) {
        return Err(format!(
            "trigger key {key:?} must begin and end with a letter or digit"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_fit_in_pod_names_and_labels() {
        let name = "a".repeat(39) + "-" + &"b".repeat(200);
        let t: DateTime<Utc> = "2286-11-20T17:46:39Z".parse().unwrap();
        let id = run_id(&name, Some(t));
        assert_eq!(id, format!("{}-9999999999", "a".repeat(39)));
        // `<runId>-<epoch>` with a 3-digit epoch, plus "-holder" for the Secret's name.
        assert!(id.len() + 4 <= 63, "{id}");
        assert!(!id.contains("--"));
        let manual = trigger_run_id(&name, &"k".repeat(63));
        assert!(manual.len() + 4 <= 63, "{manual}");
    }

    #[test]
    fn every_key_is_valid_for_the_store() {
        let keys = JobKeys::new("ns", "job", "0b5c-uid");
        let t: DateTime<Utc> = "2026-03-29T01:00:00Z".parse().unwrap();
        for key in [
            keys.index(),
            keys.tick(Some(t)),
            keys.tick(None),
            keys.trigger("deploy-1"),
            keys.backfill("b-1"),
            keys.lease("job-1"),
        ] {
            cojob::store::validate_key(&key).unwrap();
            assert!(key.starts_with("v1/jobs/ns/job/0b5c-uid/"), "{key}");
        }
    }
}
