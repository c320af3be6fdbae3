//! Injected clocks, so tests can move time.
//!
//! ```
//! use cojob::clock::{Clock, FakeClock};
//! use std::time::Duration;
//! let clock = FakeClock::at_unix_micros(1_000_000);
//! clock.advance(Duration::from_secs(5));
//! assert_eq!(clock.now().timestamp(), 6);
//! ```

use chrono::{DateTime, Utc};
use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::json::truncate_micros;

/// A source of wall-clock time. Lease expiry compares a holder-written deadline with the reader's
/// clock, so clocks only need to agree to well within a lease's ttl.
pub trait Clock: Send + Sync + Debug + 'static {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves only when told to. Clones share the same time.
#[derive(Debug, Clone)]
pub struct FakeClock {
    now: Arc<Mutex<DateTime<Utc>>>,
}

impl FakeClock {
    /// A fake clock set to `t` (truncated to microseconds).
    pub fn at(t: DateTime<Utc>) -> Self {
        FakeClock {
            now: Arc::new(Mutex::new(truncate_micros(t))),
        }
    }

    /// A fake clock set to `micros` microseconds after the Unix epoch.
    pub fn at_unix_micros(micros: i64) -> Self {
        Self::at(DateTime::from_timestamp_micros(micros).unwrap_or_default())
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        let step = chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX);
        *now = now.checked_add_signed(step).unwrap_or(*now);
    }

    /// Sets the clock to `t`.
    pub fn set(&self, t: DateTime<Utc>) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) = truncate_micros(t);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
