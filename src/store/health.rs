//! Whether a store answers: when a request last got the store's answer, and when one last
//! failed for the store's sake.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::StoreError;

/// When the requests of a [`Store`](super::Store) (and its clones) last got an answer, and
/// last failed because of the store. A caller that can do without the store for a while (the
/// controller between two ticks of a job) asks [`answering`](Health::answering) first.
///
/// ```
/// # tokio_test::block_on(async {
/// use std::time::Duration;
/// use cojob::store::Store;
/// let store = Store::open("memory://").await?;
/// assert!(!store.health().answering(Duration::from_secs(60)), "never asked yet");
/// store.get("k").await?; // not found is an answer
/// assert!(store.health().answering(Duration::from_secs(60)));
/// # Ok::<(), cojob::StoreError>(()) });
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Health {
    /// When a request last got the store's answer: an object, no object, a lost condition, or
    /// an object refused for its size (the store answered; the object is at fault).
    pub answered: Option<Instant>,
    /// When a request last failed because of the store: unreachable, a server error or a
    /// timeout, refused credentials, a missing bucket.
    pub failed: Option<Instant>,
}

impl Health {
    /// True when the store answered within `within` of now and no request failed after that
    /// answer.
    pub fn answering(&self, within: Duration) -> bool {
        let Some(answered) = self.answered else {
            return false;
        };
        answered.elapsed() <= within && self.failed.is_none_or(|failed| failed < answered)
    }
}

/// Shared by a store's clones; every request reports to it as it ends.
#[derive(Debug, Default)]
pub(crate) struct Tracker(Mutex<Health>);

impl Tracker {
    /// Notes how a request that just ended went.
    pub(crate) fn observe<T>(&self, result: &Result<T, StoreError>) {
        let now = Instant::now();
        let Ok(mut health) = self.0.lock() else {
            return;
        };
        match result {
            // Refused before anything was sent: says nothing of the store.
            Err(StoreError::InvalidKey { .. } | StoreError::InvalidUrl { .. }) => {}
            Err(e) if e.is_store_failure() => health.failed = Some(now),
            _ => health.answered = Some(now),
        }
    }

    pub(crate) fn snapshot(&self) -> Health {
        self.0.lock().map(|h| *h).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Op;

    fn down() -> Result<(), StoreError> {
        Err(StoreError::Unavailable {
            op: Op::Get,
            key: "k".into(),
            source: "connection refused".into(),
        })
    }

    #[test]
    fn a_failure_after_the_last_answer_means_not_answering() {
        let tracker = Tracker::default();
        let minute = Duration::from_secs(60);
        tracker.observe(&Ok::<(), StoreError>(()));
        assert!(tracker.snapshot().answering(minute));
        tracker.observe(&down());
        assert!(!tracker.snapshot().answering(minute));
        tracker.observe(&Ok::<(), StoreError>(()));
        assert!(tracker.snapshot().answering(minute), "answering again");
        let long_ago = Health {
            answered: Instant::now().checked_sub(2 * minute),
            failed: None,
        };
        assert!(long_ago.answered.is_some());
        assert!(
            !long_ago.answering(minute),
            "an answer older than asked for"
        );
    }

    #[test]
    fn a_key_refused_before_sending_says_nothing() {
        let tracker = Tracker::default();
        tracker.observe(&down());
        tracker.observe(&Err::<(), _>(StoreError::InvalidKey {
            key: "../k".into(),
            reason: "no ..",
        }));
        let health = tracker.snapshot();
        assert!(health.answered.is_none() && health.failed.is_some());
    }

    #[test]
    fn an_object_refused_for_its_size_is_an_answer() {
        let tracker = Tracker::default();
        tracker.observe(&Err::<(), _>(StoreError::TooLarge {
            key: "k".into(),
            size: 9,
            limit: 1,
        }));
        let health = tracker.snapshot();
        assert!(health.failed.is_none() && health.answered.is_some());
    }
}
