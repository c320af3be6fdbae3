//! How long a job waits before its next reconcile after a failed one: an exponential backoff
//! with jitter, per job, so a store outage or an API server that throttles (429) is not met
//! with every job retrying in step.
//!
//! The delay starts at [`FIRST_RETRY`] and doubles with each consecutive failure of the same
//! job, with a random part so that jobs that failed together spread out, up to a ceiling the
//! caller gives (reconcile uses a third of the job's lease ttl, at most a minute: a pending
//! run's lease is renewed by the controller's passes, so one failing run must not starve the
//! job's others for longer than that). A successful pass starts the job over.
//!
//! ```
//! use std::time::Duration;
//! use cojob_controller::retry::Retries;
//! let retries = Retries::default();
//! let ceiling = Duration::from_secs(20);
//! let first = retries.failed("uid-1", ceiling);
//! assert!(first >= Duration::from_secs(1) && first <= Duration::from_secs(2));
//! let later: Vec<Duration> = (0..8).map(|_| retries.failed("uid-1", ceiling)).collect();
//! assert!(later.iter().all(|d| *d <= ceiling) && later.last() == Some(&ceiling));
//! retries.succeeded("uid-1");
//! assert!(retries.failed("uid-1", ceiling) <= Duration::from_secs(2));
//! ```

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// The delay after a job's first failure (before jitter, which adds up to as much again).
pub const FIRST_RETRY: Duration = Duration::from_secs(1);

/// Consecutive failures per job, as backoff iterators.
#[derive(Default)]
pub struct Retries {
    by_job: Mutex<HashMap<String, ExponentialBackoff>>,
}

impl Retries {
    /// The job `uid` failed again: how long to wait before the next pass, at most `ceiling`.
    pub fn failed(&self, uid: &str, ceiling: Duration) -> Duration {
        let ceiling = ceiling.max(FIRST_RETRY);
        let mut by_job = match self.by_job.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let backoff = by_job.entry(uid.to_owned()).or_insert_with(|| {
            ExponentialBuilder::new()
                .with_min_delay(FIRST_RETRY)
                .with_factor(2.0)
                .with_jitter()
                .without_max_times()
                .with_max_delay(ceiling)
                .build()
        });
        let delay = backoff.next().unwrap_or(ceiling).min(ceiling);
        // Whole milliseconds: finer is noise, and whole values are easier to read in logs.
        Duration::from_millis(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX))
    }

    /// The job `uid` had a successful pass (or is gone): its next failure starts over.
    pub fn succeeded(&self, uid: &str) {
        if let Ok(mut by_job) = self.by_job.lock() {
            by_job.remove(uid);
        }
    }
}
