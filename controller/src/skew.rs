//! Watching the controller's clock against the store's.
//!
//! Leases compare a deadline written with one clock against another clock, and takeovers wait
//! for the deadline plus `--clock-skew-allowance`. A controller whose clock is off by more than
//! the allowance still keeps G3 (a takeover's pod waits until the old pod stopped), but it takes
//! healthy attempts over too early, or too late. So the controller measures its clock against
//! the store's (the time the store stamps on a scratch object, see
//! [`cojob::Store::clock_offset`]) at start-up and every few minutes, and reports a skew beyond
//! the allowance: a warning in its log and a `ClockSkew` Warning Event on its own Pod.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use std::time::Duration;

/// How often the clock is measured after start-up.
pub const CHECK_EVERY: Duration = Duration::from_secs(300);

/// What one measurement found, when it is worth reporting.
///
/// ```
/// let offset = cojob::ClockOffset {
///     min: Some(chrono::Duration::seconds(-31)),
///     max: Some(chrono::Duration::seconds(-29)),
/// };
/// let note = cojob_controller::skew::verdict(&offset, std::time::Duration::from_secs(5)).unwrap();
/// assert!(note.contains("30 s ahead of the store's"), "{note}");
/// ```
pub fn verdict(offset: &cojob::ClockOffset, allowance: Duration) -> Option<String> {
    if !offset.exceeds(allowance) {
        return None;
    }
    let estimate = offset.estimate()?;
    let secs = estimate.num_milliseconds() as f64 / 1000.0;
    let (by, direction) = if secs < 0.0 {
        (-secs, "ahead of")
    } else {
        (secs, "behind")
    };
    Some(format!(
        "this controller's clock is about {by:.0} s {direction} the store's, beyond the clock \
         skew allowance of {} s: leases may be taken over too early or too late; synchronise \
         the node's clock (NTP) or raise clockSkewAllowance",
        allowance.as_secs()
    ))
}

/// Where a skew is reported: the controller's own Pod, when `POD_NAME` and `POD_NAMESPACE`
/// are set (the chart sets both).
#[derive(Clone)]
pub struct Reporter {
    recorder: Recorder,
    pod: Option<ObjectReference>,
}

impl Reporter {
    /// Reports to the Pod named by `POD_NAME` and `POD_NAMESPACE`, through `recorder`; only to
    /// the log when either is unset.
    pub fn new(recorder: Recorder) -> Reporter {
        match (std::env::var("POD_NAME"), std::env::var("POD_NAMESPACE")) {
            (Ok(name), Ok(namespace)) => Reporter::for_pod(recorder, &namespace, &name),
            _ => Reporter {
                recorder,
                pod: None,
            },
        }
    }

    /// Reports to the Pod `namespace/name`, through `recorder`.
    pub fn for_pod(recorder: Recorder, namespace: &str, name: &str) -> Reporter {
        let pod = Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..ObjectReference::default()
        });
        Reporter { recorder, pod }
    }

    async fn report(&self, note: String) {
        tracing::warn!(reason = "ClockSkew", "{note}");
        let Some(pod) = &self.pod else { return };
        let ev = Event {
            type_: EventType::Warning,
            reason: "ClockSkew".into(),
            note: Some(note),
            action: "CheckClock".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, pod).await {
            tracing::warn!(error = %e, "could not publish the ClockSkew event");
        }
    }
}

/// Measures `clock` against the store once, and reports a skew beyond `allowance`; returns
/// the report, if any.
pub async fn check(
    store: &cojob::Store,
    clock: &dyn cojob::clock::Clock,
    allowance: Duration,
    reporter: &Reporter,
) -> Result<Option<String>, cojob::StoreError> {
    let offset = store.clock_offset(clock).await?;
    tracing::debug!(?offset, "clock offset to the store");
    let note = verdict(&offset, allowance);
    if let Some(note) = &note {
        reporter.report(note.clone()).await;
    }
    Ok(note)
}

/// Measures the system clock now and then every [`CHECK_EVERY`], reporting each skew beyond
/// `allowance`. Runs until the task is dropped; a store error only skips that measurement.
pub async fn watch(store: cojob::Store, allowance: Duration, reporter: Reporter) {
    loop {
        if let Err(e) = check(&store, &cojob::clock::SystemClock, allowance, &reporter).await {
            tracing::debug!(error = %e, "could not measure the clock offset");
        }
        tokio::time::sleep(CHECK_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offset(min: i64, max: i64) -> cojob::ClockOffset {
        cojob::ClockOffset {
            min: Some(chrono::Duration::seconds(min)),
            max: Some(chrono::Duration::seconds(max)),
        }
    }

    #[test]
    fn only_a_certain_skew_beyond_the_allowance_is_reported() {
        let five = Duration::from_secs(5);
        assert_eq!(verdict(&offset(-1, 1), five), None);
        assert_eq!(verdict(&offset(4, 7), five), None, "might be within");
        let behind = verdict(&offset(9, 11), five).unwrap();
        assert!(behind.contains("about 10 s behind the store's"), "{behind}");
        let ahead = verdict(&offset(-11, -9), five).unwrap();
        assert!(ahead.contains("about 10 s ahead of the store's"), "{ahead}");
        let unknown = cojob::ClockOffset {
            min: None,
            max: None,
        };
        assert_eq!(verdict(&unknown, five), None, "a store that stamps no time");
    }
}
