//! Idle passes: a job with no active run and nothing due leaves the bucket unread.
//!
//! Between its ticks, a job whose runs all ended has nothing to do, yet it still gets passes:
//! every [`IDLE_RESYNC`](super::IDLE_RESYNC), and on each change of the object that is a cue.
//! Each used to read the job's index (a GET), so a daily job paid more for its idle passes than
//! for its runs. A pass leaves the bucket unread when all of these hold:
//!
//! - nothing is asked of the job: no tick due by its status, no request in an annotation, no
//!   spec change since its status was written ([`super::pending`]);
//! - its status shows no active run, and this controller's last pass read its index, left it
//!   without an active run and wrote the status, with no pod cue, forget or relist since, and
//!   the object is still at the resource version that pass left it at: nobody changed it since,
//!   not even another replica ([`crate::sweeper::focus::Focus::idle_since`]);
//! - that read is less than `--index-resync` old (an hour by default) by the store's clock,
//!   and not in its future (a clock that stepped back): the index is the truth, and another
//!   writer (a second controller on the same bucket, a person) could have changed it;
//! - the bucket's last answer to this controller is less than [`STORE_ANSWERED_WITHIN`] old and
//!   no request failed after it ([`cojob::store::Health`]), so `StoreAvailable` keeps telling
//!   the truth: the clock check reads the bucket every [`crate::skew::CHECK_EVERY`], and while
//!   the last request failed the idle passes read the bucket and report what they find.
//!
//! The pass then only asks to come back at the next tick, or when the read is due.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{IDLE_RESYNC, PAST_THE_TICK, next_tick_due, pending};
use crate::context::JobScope;

/// How recently the bucket must have answered the controller for an idle pass to leave it
/// unread: the clock check's period and a minute.
pub const STORE_ANSWERED_WITHIN: Duration =
    Duration::from_secs(crate::skew::CHECK_EVERY.as_secs() + 60);

/// When the pass of an idle job may leave the bucket unread, how long until the job needs a
/// pass that reads it: just past its next tick, the index's resync, or [`IDLE_RESYNC`],
/// whichever comes first. `None`: this pass reads the bucket.
pub(super) fn idle_wait(scope: &JobScope<'_>, now: DateTime<Utc>) -> Option<Duration> {
    let job = scope.job;
    let status = job.status.as_ref()?;
    if pending(job, now) || !status.active.is_empty() {
        return None;
    }
    let version = job.metadata.resource_version.as_deref()?;
    let since = scope
        .cx
        .focus
        .idle_since((&scope.namespace, &scope.name), version)?;
    let resync = scope.cx.settings.index_resync;
    let read_ago = (now - since).to_std().ok()?; // a clock that stepped back: read
    let resync_in = resync.checked_sub(read_ago).filter(|d| !d.is_zero())?;
    if !scope
        .cx
        .db
        .store()
        .health()
        .answering(STORE_ANSWERED_WITHIN)
    {
        return None;
    }
    let to_tick = next_tick_due(status, &job.spec).map(|due| {
        let micros = due - now.timestamp_micros();
        Duration::from_micros(u64::try_from(micros).unwrap_or(0)) + PAST_THE_TICK
    });
    Some(
        resync_in
            .min(to_tick.unwrap_or(IDLE_RESYNC))
            .min(IDLE_RESYNC),
    )
}
