//! The entry point of layer 1: [`Db`], a store plus a clock and a key prefix.

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::json;
use crate::store::{Store, Version};

/// The largest document cojob writes: 1 MiB of canonical JSON. Larger values are refused with
/// [`Error::TooLarge`] before anything is written. Coordination state should be small; put bulk
/// data in objects of its own and store their keys.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// How many times `doc.update`, `lease` and `cooperative_write` retry a lost race by default.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;

/// A handle on the coordination primitives over one [`Store`]. Cloning is cheap.
///
/// ```
/// # tokio_test::block_on(async {
/// use cojob::Db;
/// let db = Db::open("memory://").await?.with_prefix("tenant-a")?;
/// assert!(db.claim("jobs/x", &"first".to_string()).await?.won);
/// assert_eq!(db.store().list("").await?, vec!["tenant-a/jobs/x".to_string()]);
/// # Ok::<(), cojob::Error>(()) });
/// ```
#[derive(Clone, Debug)]
pub struct Db {
    store: Store,
    clock: Arc<dyn Clock>,
    prefix: String,
    max_attempts: u32,
}

impl Db {
    /// Opens the store at `url` (see [`Store::open`]) with the system clock.
    pub async fn open(url: &str) -> Result<Db> {
        Ok(Db::new(Store::open(url).await?))
    }

    /// A `Db` over `store`, with the system clock and no key prefix.
    pub fn new(store: Store) -> Db {
        Db {
            store,
            clock: Arc::new(SystemClock),
            prefix: String::new(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }

    /// Uses `clock` for deadlines and expiry (a [`FakeClock`](crate::clock::FakeClock) in tests).
    pub fn with_clock(mut self, clock: impl Clock) -> Db {
        self.clock = Arc::new(clock);
        self
    }

    /// Places every key under the folder `prefix`.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Db> {
        let prefix = prefix.trim_matches('/');
        if !prefix.is_empty() {
            crate::store::validate_key(prefix)?;
        }
        self.prefix = prefix.to_string();
        Ok(self)
    }

    /// Sets how many times a lost race is retried by `lease`, `cooperative_write` and new
    /// [`Doc`](crate::Doc)s (at least 1).
    pub fn with_max_attempts(mut self, attempts: u32) -> Db {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The underlying store, for its counters and raw access.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The clock.
    pub fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    pub(crate) fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The store key for a caller's key.
    pub(crate) fn key(&self, key: &str) -> Result<String> {
        crate::store::validate_key(key)?;
        Ok(if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}/{key}", self.prefix)
        })
    }

    /// Reads and parses the JSON document at store key `key`.
    pub(crate) async fn read_json(&self, key: &str) -> Result<Option<(Value, Version)>> {
        match self.store.get(key).await? {
            None => Ok(None),
            Some((bytes, version)) => Ok(Some((parse_json(key, &bytes)?, version))),
        }
    }
}

/// The first backoff window after a lost race in a read-modify-write loop.
pub const BACKOFF_BASE: Duration = Duration::from_millis(2);
/// The largest backoff window.
pub const BACKOFF_CAP: Duration = Duration::from_millis(200);

/// Sleeps after the `lost`-th lost race of a read-modify-write loop ("full jitter"): a uniform
/// random time in `[0, min(cap, base × 2^(lost-1))]`. Contending writers spread out instead of
/// colliding again; an uncontended writer never sleeps.
pub(crate) async fn backoff(lost: u32) {
    let window = BACKOFF_BASE
        .saturating_mul(1u32 << lost.saturating_sub(1).min(16))
        .min(BACKOFF_CAP);
    let micros = u64::try_from(window.as_micros()).unwrap_or(u64::MAX);
    let pause = Duration::from_micros(rand::random_range(0..=micros));
    tokio::time::sleep(pause).await;
}

/// Encodes a value as canonical JSON, refusing documents over [`MAX_DOCUMENT_BYTES`].
pub(crate) fn encode(key: &str, value: &Value) -> Result<Bytes> {
    let bytes = json::to_canonical(value);
    if bytes.len() > MAX_DOCUMENT_BYTES {
        return Err(Error::TooLarge {
            key: key.to_string(),
            size: bytes.len(),
            limit: MAX_DOCUMENT_BYTES,
        });
    }
    Ok(Bytes::from(bytes))
}

/// Converts a serializable value to JSON, or [`Error::Serialize`].
pub(crate) fn to_json<T: serde::Serialize + ?Sized>(key: &str, value: &T) -> Result<Value> {
    serde_json::to_value(value).map_err(|source| Error::Serialize {
        key: key.to_string(),
        source,
    })
}

/// Parses stored bytes as JSON, or [`Error::Corrupt`].
pub(crate) fn parse_json(key: &str, bytes: &[u8]) -> Result<Value> {
    serde_json::from_slice(bytes).map_err(|e| Error::Corrupt {
        key: key.to_string(),
        expected: "JSON document".into(),
        detail: e.to_string(),
    })
}

/// Converts stored JSON to `T`, or [`Error::Corrupt`] naming `T`.
pub(crate) fn from_json<T: DeserializeOwned>(key: &str, value: Value) -> Result<T> {
    serde_json::from_value(value).map_err(|e| Error::Corrupt {
        key: key.to_string(),
        expected: std::any::type_name::<T>().to_string(),
        detail: e.to_string(),
    })
}
