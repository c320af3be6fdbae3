//! Request counters, by operation and outcome, and request latencies, by operation.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Op;

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// It succeeded (for a get: the object was there).
    Ok,
    /// A get found no object.
    NotFound,
    /// A conditional put lost.
    Conflict,
    /// It failed with an error.
    Error,
}

impl Outcome {
    /// Every outcome, in counter order.
    pub const ALL: [Outcome; 4] = [
        Outcome::Ok,
        Outcome::NotFound,
        Outcome::Conflict,
        Outcome::Error,
    ];

    /// `Ok` or `Error`, for operations that cannot conflict or miss.
    pub fn of<T, E>(result: &Result<T, E>) -> Outcome {
        match result {
            Ok(_) => Outcome::Ok,
            Err(_) => Outcome::Error,
        }
    }

    /// A stable lowercase name, for metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::NotFound => "not_found",
            Outcome::Conflict => "conflict",
            Outcome::Error => "error",
        }
    }
}

const OPS: usize = Op::ALL.len();
const OUTCOMES: usize = Outcome::ALL.len();

/// The upper bounds, in seconds, of the latency buckets (a last one, unbounded, follows).
pub const LATENCY_BOUNDS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
const BUCKETS: usize = LATENCY_BOUNDS.len() + 1;

#[derive(Debug, Default)]
pub(crate) struct Counters {
    cells: [[AtomicU64; OUTCOMES]; OPS],
    latency: [[AtomicU64; BUCKETS]; OPS],
    latency_sum_us: [AtomicU64; OPS],
}

impl Counters {
    /// Counts one request of `op`, sent at `started`, that ended in `outcome`.
    pub(crate) fn record(&self, started: std::time::Instant, op: Op, outcome: Outcome) {
        self.cells[op as usize][outcome as usize].fetch_add(1, Ordering::Relaxed);
        let elapsed = started.elapsed();
        let seconds = elapsed.as_secs_f64();
        let bucket = LATENCY_BOUNDS
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(BUCKETS - 1);
        self.latency[op as usize][bucket].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.latency_sum_us[op as usize].fetch_add(micros, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> StoreStats {
        let load = |cell: &AtomicU64| cell.load(Ordering::Relaxed);
        StoreStats {
            counts: self.cells.each_ref().map(|row| row.each_ref().map(load)),
            latency: self.latency.each_ref().map(|row| row.each_ref().map(load)),
            latency_sum_us: self.latency_sum_us.each_ref().map(load),
        }
    }
}

/// The latencies of one operation's requests: how many fell in each bucket, and their sum.
#[derive(Debug, Clone, PartialEq)]
pub struct Latency {
    /// `(upper bound in seconds, requests)` per bucket, not cumulative; the last bound is
    /// `f64::INFINITY`.
    pub buckets: Vec<(f64, u64)>,
    /// The sum of the latencies.
    pub sum: std::time::Duration,
    /// The number of requests.
    pub count: u64,
}

/// A snapshot of a store's request counters. Subtract two snapshots with [`StoreStats::since`]
/// to count the requests of one operation.
///
/// ```
/// # tokio_test::block_on(async {
/// use cojob::{error::Op, store::{Outcome, PutMode, Store}};
/// let store = Store::open("memory://").await?;
/// let before = store.stats();
/// store.put("k", "v".into(), PutMode::IfAbsent).await?;
/// let used = store.stats().since(&before);
/// assert_eq!(used.count(Op::PutIfAbsent, Outcome::Ok), 1);
/// assert_eq!(used.total(), 1);
/// # Ok::<(), cojob::StoreError>(()) });
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    counts: [[u64; OUTCOMES]; OPS],
    latency: [[u64; BUCKETS]; OPS],
    latency_sum_us: [u64; OPS],
}

impl StoreStats {
    /// Requests of `op` that ended in `outcome`.
    pub fn count(&self, op: Op, outcome: Outcome) -> u64 {
        self.counts[op as usize][outcome as usize]
    }

    /// Requests of `op`, whatever their outcome.
    pub fn requests(&self, op: Op) -> u64 {
        self.counts[op as usize].iter().sum()
    }

    /// Reads (gets), whatever their outcome.
    pub fn gets(&self) -> u64 {
        self.requests(Op::Get)
    }

    /// Writes of every mode, whatever their outcome.
    pub fn puts(&self) -> u64 {
        self.requests(Op::PutOverwrite)
            + self.requests(Op::PutIfAbsent)
            + self.requests(Op::PutIfMatch)
    }

    /// Every request.
    pub fn total(&self) -> u64 {
        self.counts.iter().flatten().sum()
    }

    /// The requests made since `earlier` was taken.
    pub fn since(&self, earlier: &StoreStats) -> StoreStats {
        let mut out = *self;
        for (row, old) in out.counts.iter_mut().zip(&earlier.counts) {
            for (c, o) in row.iter_mut().zip(old) {
                *c = c.saturating_sub(*o);
            }
        }
        for (row, old) in out.latency.iter_mut().zip(&earlier.latency) {
            for (c, o) in row.iter_mut().zip(old) {
                *c = c.saturating_sub(*o);
            }
        }
        for (c, o) in out.latency_sum_us.iter_mut().zip(&earlier.latency_sum_us) {
            *c = c.saturating_sub(*o);
        }
        out
    }

    /// The latencies of `op`'s requests (whatever their outcome).
    ///
    /// ```
    /// # tokio_test::block_on(async {
    /// use cojob::{error::Op, store::{PutMode, Store}};
    /// let store = Store::open("memory://").await?;
    /// store.put("k", "v".into(), PutMode::IfAbsent).await?;
    /// let latency = store.stats().latency(Op::PutIfAbsent);
    /// assert_eq!(latency.count, 1);
    /// assert_eq!(latency.buckets.iter().map(|(_, n)| n).sum::<u64>(), 1);
    /// assert_eq!(latency.buckets.last().unwrap().0, f64::INFINITY);
    /// # Ok::<(), cojob::StoreError>(()) });
    /// ```
    pub fn latency(&self, op: Op) -> Latency {
        let row = &self.latency[op as usize];
        let bounds = LATENCY_BOUNDS.iter().copied().chain([f64::INFINITY]);
        Latency {
            buckets: bounds.zip(row.iter().copied()).collect(),
            sum: std::time::Duration::from_micros(self.latency_sum_us[op as usize]),
            count: row.iter().sum(),
        }
    }

    /// Every non-zero counter as `(op, outcome, count)`.
    pub fn iter(&self) -> impl Iterator<Item = (Op, Outcome, u64)> + '_ {
        Op::ALL.into_iter().flat_map(move |op| {
            Outcome::ALL
                .into_iter()
                .map(move |outcome| (op, outcome, self.count(op, outcome)))
                .filter(|(_, _, n)| *n > 0)
        })
    }
}

impl fmt::Display for StoreStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (op, outcome, n) in self.iter() {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{op}/{}={n}", outcome.as_str())?;
        }
        if first {
            f.write_str("none")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn latencies_fall_in_their_buckets_and_subtract() {
        let counters = Counters::default();
        let now = Instant::now();
        counters.record(now, Op::Get, Outcome::Ok);
        let before = counters.snapshot();
        let long_ago = now.checked_sub(Duration::from_secs(20)).unwrap();
        counters.record(long_ago, Op::Get, Outcome::Ok);
        counters.record(long_ago, Op::List, Outcome::Ok);
        let after = counters.snapshot();

        let all = after.latency(Op::Get);
        assert_eq!(all.count, 2);
        assert!(all.sum >= Duration::from_secs(20));
        assert_eq!(all.buckets.len(), LATENCY_BOUNDS.len() + 1);
        assert_eq!(all.buckets.last(), Some(&(f64::INFINITY, 1)));
        assert_eq!(all.buckets.iter().map(|(_, n)| n).sum::<u64>(), 2);

        let delta = after.since(&before).latency(Op::Get);
        assert_eq!(delta.count, 1);
        assert_eq!(delta.buckets.last(), Some(&(f64::INFINITY, 1)));
        assert_eq!(after.latency(Op::Delete).count, 0);
    }
}
