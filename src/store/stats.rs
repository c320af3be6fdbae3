//! Request counters, by operation and outcome.

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

#[derive(Debug, Default)]
pub(crate) struct Counters {
    cells: [[AtomicU64; OUTCOMES]; OPS],
}

impl Counters {
    pub(crate) fn record(&self, op: Op, outcome: Outcome) {
        self.cells[op as usize][outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> StoreStats {
        let mut counts = [[0; OUTCOMES]; OPS];
        for (row, cells) in counts.iter_mut().zip(&self.cells) {
            for (count, cell) in row.iter_mut().zip(cells) {
                *count = cell.load(Ordering::Relaxed);
            }
        }
        StoreStats { counts }
    }
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
        let mut counts = self.counts;
        for (row, old) in counts.iter_mut().zip(&earlier.counts) {
            for (c, o) in row.iter_mut().zip(old) {
                *c = c.saturating_sub(*o);
            }
        }
        StoreStats { counts }
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
