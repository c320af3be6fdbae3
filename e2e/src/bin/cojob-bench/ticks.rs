//! The ticks a size measures: every `every` minutes, the first never the objects' own first.

use chrono::{DateTime, Timelike, Utc};

/// The first tick of [`schedule`]`(every)` after `t`.
fn next_tick(t: DateTime<Utc>, every: u32) -> DateTime<Utc> {
    let floor = t
        .with_second(0)
        .and_then(|t| t.with_nanosecond(0))
        .unwrap_or(t);
    let mut tick = floor + chrono::Duration::minutes(1);
    while !tick.minute().is_multiple_of(every) {
        tick += chrono::Duration::minutes(1);
    }
    tick
}

/// The first tick a size measures, for objects that all exist at `created`: at least `room`
/// after it (its costs are counted from before its work begins), and never the objects' first
/// tick, so that every window starts with a tick's backlog of both kinds behind it, as on a
/// cluster whose jobs have run for a while. Which tick came first used to depend on when in
/// the interval the objects happened to be created.
pub fn first_measured_tick(
    created: DateTime<Utc>,
    room: chrono::Duration,
    every: u32,
) -> DateTime<Utc> {
    let their_second = next_tick(created, every) + chrono::Duration::minutes(i64::from(every));
    next_tick(created + room, every).max(their_second)
}

/// The cron expression of a tick every `every` minutes, a divisor of 60: hourly ticks fall
/// on the hour (cron's minute field ends at 59, so `*/60` is no schedule).
pub fn schedule(every: u32) -> String {
    match every {
        1 => "* * * * *".into(),
        60 => "0 * * * *".into(),
        _ => format!("*/{every} * * * *"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn ticks_fall_on_multiples_of_the_interval() {
        assert_eq!(
            next_tick(t("2026-12-03T18:00:00Z"), 1),
            t("2026-12-03T18:01:00Z")
        );
        assert_eq!(
            next_tick(t("2026-12-03T18:01:30Z"), 5),
            t("2026-12-03T18:05:00Z")
        );
        assert_eq!(
            next_tick(t("2026-12-03T18:55:01Z"), 5),
            t("2026-12-03T19:00:00Z")
        );
        assert_eq!(
            next_tick(t("2026-12-03T18:00:00Z"), 60),
            t("2026-12-03T19:00:00Z")
        );
        assert_eq!(schedule(1), "* * * * *");
        assert_eq!(schedule(5), "*/5 * * * *");
        assert_eq!(schedule(60), "0 * * * *");
    }

    #[test]
    fn a_window_never_starts_at_the_objects_first_tick() {
        let room = |s| chrono::Duration::seconds(s);
        // Created just after a tick: the room (a prestart of 600 s and the lead) ends before
        // the next, but that is the objects' first; their second is measured.
        assert_eq!(
            first_measured_tick(t("2026-12-06T07:02:00Z"), room(655), 15),
            t("2026-12-06T07:30:00Z")
        );
        // Created just before a tick: the room already skips it.
        assert_eq!(
            first_measured_tick(t("2026-12-06T07:13:00Z"), room(655), 15),
            t("2026-12-06T07:30:00Z")
        );
        // A room longer than an interval decides on its own.
        assert_eq!(
            first_measured_tick(t("2026-12-06T07:13:00Z"), room(1100), 15),
            t("2026-12-06T07:45:00Z")
        );
        // Hourly ticks (a size the simulated nodes play out in more than half an hour):
        // created at 07:02, the objects' first tick is 08:00 and their second is measured.
        assert_eq!(
            first_measured_tick(t("2026-12-06T07:02:00Z"), room(655), 60),
            t("2026-12-06T09:00:00Z")
        );
        // One-minute ticks without a prestart: the second minute after creation.
        assert_eq!(
            first_measured_tick(t("2026-12-06T07:02:10Z"), room(5), 1),
            t("2026-12-06T07:04:00Z")
        );
    }
}
