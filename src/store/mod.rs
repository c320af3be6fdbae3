//! Layer 0: conditional object I/O.
//!
//! A [`Store`] reads and writes whole objects by key, with three write modes: unconditional
//! ([`PutMode::Overwrite`]), put-if-absent ([`PutMode::IfAbsent`]) and compare-and-swap on a
//! [`Version`] ([`PutMode::IfMatch`]). A lost race is an ordinary outcome,
//! [`PutOutcome::Conflict`], not an error.
//!
//! Stores are opened from a URL ([`Store::open`]):
//!
//! | URL | backend |
//! |---|---|
//! | `memory://` | in-process memory (`object_store::memory::InMemory`); each `open` is a new, empty store |
//! | `file:///dir` | our own local-directory backend ([`DirBackend`]) with `link` and `flock` |
//! | `s3://bucket/prefix` | Amazon S3 or a compatible server; honours the `AWS_*` environment variables, among them `AWS_ENDPOINT_URL` and `AWS_ALLOW_HTTP=true` for a local server |
//! | `gs://bucket/prefix` | Google Cloud Storage; `GOOGLE_*` variables. Untested: no local GCS server accepts `object_store`'s conditional writes (`e2e/s3-servers.md`) |
//! | `az://container/prefix` | Azure Blob Storage; `AZURE_*` variables (`AZURE_STORAGE_USE_EMULATOR=true` for Azurite) |
//!
//! Further backends implement the [`Backend`] trait and are wrapped with [`Store::new`].
//!
//! # Ambiguous outcomes
//!
//! A conditional put can fail in a way that does not prove it lost: the client retried after a
//! timeout or a 5xx and the first attempt had already landed, so the retry sees 412; or S3
//! answered 409 `ConditionalRequestConflict`, which `object_store` reports as `AlreadyExists`.
//! cojob resolves every such outcome by **re-reading**:
//!
//! 1. Every write carries a fresh 128-bit *write token* from a CSPRNG, stored beside the object
//!    (as user metadata `cojobwrite` on the cloud stores, a name valid on S3, GCS and Azure alike, in the file header of [`DirBackend`]).
//! 2. When a conditional put reports a conflict, or fails with an error, the store reads the key
//!    once. If the stored object carries this write's token, the write landed and the put
//!    returns [`PutOutcome::Written`] with the stored version. Otherwise a conflict stays a
//!    [`PutOutcome::Conflict`], carrying the object just read, and an error stays that error.
//!
//! The re-read is the read every caller needs after a lost race anyway (a claim's read-back, a
//! lease's classification, a doc's next round), so resolving ambiguity costs no extra request:
//! a lost claim is one PUT and one GET.
//!
//! Bytes alone cannot decide this (two writers may write identical bytes, and some servers use
//! the body's MD5 as the ETag), which is why the token exists.
//!
//! # Example
//!
//! ```
//! # tokio_test::block_on(async {
//! use cojob::store::{PutMode, PutOutcome, Store};
//! let store = Store::open("memory://").await?;
//! let first = store.put("a/b", "v1".into(), PutMode::IfAbsent).await?;
//! let PutOutcome::Written(v1) = first else { panic!("fresh key") };
//! // A lost race returns the object that won.
//! let PutOutcome::Conflict(Some(winner)) = store.put("a/b", "again".into(), PutMode::IfAbsent).await? else {
//!     panic!("the key exists")
//! };
//! assert_eq!(&winner.body[..], b"v1");
//! assert!(store.put("a/b", "v2".into(), PutMode::IfMatch(v1.clone())).await?.is_written());
//! assert!(!store.put("a/b", "v3".into(), PutMode::IfMatch(v1)).await?.is_written());
//! let (body, _version) = store.get("a/b").await?.expect("present");
//! assert_eq!(&body[..], b"v2");
//! assert_eq!(store.list("a").await?, vec!["a/b".to_string()]);
//! # Ok::<(), cojob::StoreError>(()) });
//! ```

mod dir;
mod health;
mod remote;
mod stats;

pub use dir::DirBackend;
pub use health::Health;
pub use remote::{ObjectStoreBackend, Reply};
pub use stats::{Outcome, StoreStats};

use async_trait::async_trait;
use bytes::Bytes;
use std::fmt;
use std::sync::Arc;

use crate::clock::Clock;
use crate::error::{Op, StoreError};
use crate::token;

/// The version of a stored object: the ETag and, where the store has one, its version or
/// generation (GCS compares generations).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Version {
    /// The entity tag, quotes included as the server sent it.
    pub etag: Option<String>,
    /// The version id or generation, where the store keeps one.
    pub generation: Option<String>,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.etag, &self.generation) {
            (Some(e), Some(g)) => write!(f, "{e}#{g}"),
            (Some(e), None) => f.write_str(e),
            (None, Some(g)) => write!(f, "#{g}"),
            (None, None) => f.write_str("-"),
        }
    }
}

/// How a put is conditioned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutMode {
    /// Write unconditionally.
    Overwrite,
    /// Write only if no object exists at the key (`If-None-Match: *`).
    IfAbsent,
    /// Write only if the stored object still has this version (`If-Match`).
    IfMatch(Version),
}

impl PutMode {
    fn op(&self) -> Op {
        match self {
            PutMode::Overwrite => Op::PutOverwrite,
            PutMode::IfAbsent => Op::PutIfAbsent,
            PutMode::IfMatch(_) => Op::PutIfMatch,
        }
    }
}

/// What a put did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    /// The object was written; this is its new version.
    Written(Version),
    /// The condition did not hold (the key exists, or its version moved, or it is gone).
    ///
    /// [`Store::put`] re-reads the key after every lost race and returns what it found: the
    /// object that won, or `None` if the key is now absent. A [`Backend`] returns
    /// `Conflict(None)` and leaves the re-read to the store.
    Conflict(Option<StoredObject>),
}

impl PutOutcome {
    /// True for [`PutOutcome::Written`].
    pub fn is_written(&self) -> bool {
        matches!(self, PutOutcome::Written(_))
    }
}

/// One object as read by a [`Backend`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    /// The object's bytes.
    pub body: Bytes,
    /// Its version.
    pub version: Version,
    /// The write token it was written with, if it was written by cojob.
    pub token: Option<String>,
    /// When the store says the object was written, by the store's clock (S3 and Azure:
    /// `Last-Modified`, whole seconds; a directory: the file's modification time), if it says.
    pub last_modified: Option<chrono::DateTime<chrono::Utc>>,
}

/// One storage backend: the trait every store implements (memory, object stores, a local
/// directory, or your own). Keys have been validated and prefixed by [`Store`] already.
///
/// A backend must apply [`PutMode::IfAbsent`] and [`PutMode::IfMatch`] atomically, report a
/// failed condition as `PutOutcome::Conflict(None)` (never as an error), and give every write a new
/// version even when the bytes are unchanged, or at least keep the `token` it is given so that
/// [`Store`] can recognise its own writes.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// Reads the object at `key`, or `None` if absent.
    async fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError>;
    /// Like [`get`](Self::get), but refuses an object larger than `limit` bytes with
    /// [`StoreError::TooLarge`], ideally before its body is read into memory. The default reads
    /// it whole and then checks; the built-in backends check the size first.
    async fn get_bounded(
        &self,
        key: &str,
        limit: usize,
    ) -> Result<Option<StoredObject>, StoreError> {
        within_limit(key, self.get(key).await?, limit)
    }
    /// Writes `body` at `key` under `mode`, recording the write `token`.
    async fn put(
        &self,
        key: &str,
        body: Bytes,
        mode: &PutMode,
        token: &str,
    ) -> Result<PutOutcome, StoreError>;
    /// Deletes `key`; deleting an absent key succeeds.
    async fn delete(&self, key: &str) -> Result<(), StoreError>;
    /// Lists every key under the folder `prefix` (all keys when empty), in any order.
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError>;
}

#[async_trait]
impl<B: Backend + ?Sized> Backend for Arc<B> {
    async fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        (**self).get(key).await
    }
    async fn get_bounded(
        &self,
        key: &str,
        limit: usize,
    ) -> Result<Option<StoredObject>, StoreError> {
        (**self).get_bounded(key, limit).await
    }
    async fn put(
        &self,
        key: &str,
        body: Bytes,
        mode: &PutMode,
        token: &str,
    ) -> Result<PutOutcome, StoreError> {
        (**self).put(key, body, mode, token).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        (**self).delete(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        (**self).list(prefix).await
    }
}

/// `object`, unless its body is larger than `limit` ([`StoreError::TooLarge`]).
pub(crate) fn within_limit(
    key: &str,
    object: Option<StoredObject>,
    limit: usize,
) -> Result<Option<StoredObject>, StoreError> {
    match object {
        Some(o) if o.body.len() > limit => Err(StoreError::TooLarge {
            key: key.to_string(),
            size: u64::try_from(o.body.len()).unwrap_or(u64::MAX),
            limit,
        }),
        other => Ok(other),
    }
}

/// How far a store's clock is ahead of a local clock (negative: behind), as the interval the
/// measurement allows; see [`Store::clock_offset`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockOffset {
    /// The smallest offset consistent with the measurement (`None`: the store stamps no time).
    pub min: Option<chrono::Duration>,
    /// The largest offset consistent with the measurement.
    pub max: Option<chrono::Duration>,
}

impl ClockOffset {
    /// True when the two clocks certainly differ by more than `allowance`.
    pub fn exceeds(&self, allowance: std::time::Duration) -> bool {
        let allowance = chrono::Duration::from_std(allowance).unwrap_or(chrono::Duration::MAX);
        self.min.is_some_and(|min| min > allowance) || self.max.is_some_and(|max| max < -allowance)
    }

    /// The middle of the interval, for reports.
    pub fn estimate(&self) -> Option<chrono::Duration> {
        Some(self.min? + (self.max? - self.min?) / 2)
    }
}

/// A handle on a bucket (or directory) plus an optional key prefix, with request counters.
/// Cloning is cheap and clones share the counters.
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn Backend>,
    prefix: String,
    description: Arc<str>,
    stats: Arc<stats::Counters>,
    health: Arc<health::Tracker>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("store", &self.description)
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl Store {
    /// Opens a store from a URL (see the [module docs](self) for the schemes). The URL's path
    /// becomes the key prefix. Credentials and endpoints come from the environment.
    pub async fn open(url: &str) -> Result<Store, StoreError> {
        let parsed = url::Url::parse(url).map_err(|e| StoreError::InvalidUrl {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
        if parsed.scheme() == "file" {
            let path = parsed.to_file_path().map_err(|()| StoreError::InvalidUrl {
                url: url.to_string(),
                reason: "a file URL needs an absolute local path, like file:///var/lib/cojob"
                    .into(),
            })?;
            let backend = DirBackend::open(&path).await?;
            return Ok(Self::new(backend, "").described(url));
        }
        let (backend, prefix) = ObjectStoreBackend::from_url(&parsed)?;
        Ok(Self::new(backend, &prefix).described(&redact(&parsed)))
    }

    /// Wraps a backend, with keys placed under `prefix` (a folder; may be empty).
    pub fn new(backend: impl Backend, prefix: &str) -> Store {
        let description: Arc<str> = format!("{backend:?}").into();
        Store {
            backend: Arc::new(backend),
            prefix: prefix.trim_matches('/').to_string(),
            description,
            stats: Arc::default(),
            health: Arc::default(),
        }
    }

    fn described(mut self, what: &str) -> Store {
        self.description = what.into();
        self
    }

    /// A human-readable description of the store (its URL, without credentials).
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The key prefix this store adds.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A snapshot of the request counters.
    pub fn stats(&self) -> StoreStats {
        self.stats.snapshot()
    }

    /// When this store (and its clones) last answered a request, and last failed one.
    pub fn health(&self) -> Health {
        self.health.snapshot()
    }

    fn full_key(&self, key: &str) -> Result<String, StoreError> {
        validate_key(key)?;
        Ok(if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}/{key}", self.prefix)
        })
    }

    /// Reads `key`: its bytes and version, or `None` if absent.
    pub async fn get(&self, key: &str) -> Result<Option<(Bytes, Version)>, StoreError> {
        Ok(self.get_object(key).await?.map(|o| (o.body, o.version)))
    }

    /// Reads `key` with its write token.
    pub async fn get_object(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        let full = self.full_key(key)?;
        self.raw_get(&full).await
    }

    /// Every read is bounded by [`MAX_DOCUMENT_BYTES`](crate::MAX_DOCUMENT_BYTES), the largest
    /// document cojob writes: a larger object (planted, or not cojob's) is refused with
    /// [`StoreError::TooLarge`] without being buffered.
    async fn raw_get(&self, full: &str) -> Result<Option<StoredObject>, StoreError> {
        let started = std::time::Instant::now();
        let result = self
            .backend
            .get_bounded(full, crate::MAX_DOCUMENT_BYTES)
            .await;
        self.stats.record(
            started,
            Op::Get,
            match &result {
                Ok(Some(_)) => Outcome::Ok,
                Ok(None) => Outcome::NotFound,
                Err(_) => Outcome::Error,
            },
        );
        self.health.observe(&result);
        result
    }

    /// Writes `body` at `key` under `mode`. A failed condition is [`PutOutcome::Conflict`],
    /// which carries the object that won (one re-read). Ambiguous failures of conditional puts
    /// are resolved by that same re-read (see the [module docs](self)).
    pub async fn put(
        &self,
        key: &str,
        body: Bytes,
        mode: PutMode,
    ) -> Result<PutOutcome, StoreError> {
        let full = self.full_key(key)?;
        let write_token = token::write_token();
        let op = mode.op();
        let started = std::time::Instant::now();
        let result = self.backend.put(&full, body, &mode, &write_token).await;
        self.stats.record(
            started,
            op,
            match &result {
                Ok(PutOutcome::Written(_)) => Outcome::Ok,
                Ok(PutOutcome::Conflict(_)) => Outcome::Conflict,
                Err(_) => Outcome::Error,
            },
        );
        self.health.observe(&result);
        let ours = |o: &StoredObject| o.token.as_deref() == Some(write_token.as_str());
        match (result, &mode) {
            (Ok(PutOutcome::Written(v)), _) => Ok(PutOutcome::Written(v)),
            (Ok(PutOutcome::Conflict(_)), _) => match self.raw_get(&full).await? {
                Some(o) if ours(&o) => {
                    tracing::debug!(key = full, "a put reported a conflict but had landed");
                    Ok(PutOutcome::Written(o.version))
                }
                current => Ok(PutOutcome::Conflict(current)),
            },
            (Err(e), PutMode::Overwrite) => Err(e),
            (Err(e), _) => match self.raw_get(&full).await {
                Ok(Some(o)) if ours(&o) => {
                    tracing::debug!(key = full, error = %e, "a put reported an error but had landed");
                    Ok(PutOutcome::Written(o.version))
                }
                _ => Err(e),
            },
        }
    }

    /// Deletes `key`. Deleting an absent key succeeds.
    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let full = self.full_key(key)?;
        let started = std::time::Instant::now();
        let result = self.backend.delete(&full).await;
        self.stats.record(started, Op::Delete, Outcome::of(&result));
        self.health.observe(&result);
        result
    }

    /// Lists the keys under the folder `prefix` (every key when `prefix` is empty), sorted,
    /// relative to this store's own prefix.
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let prefix = prefix.trim_end_matches('/');
        let full = if prefix.is_empty() {
            self.prefix.clone()
        } else {
            self.full_key(prefix)?
        };
        let started = std::time::Instant::now();
        let result = self.backend.list(&full).await;
        self.stats.record(started, Op::List, Outcome::of(&result));
        self.health.observe(&result);
        let strip = if self.prefix.is_empty() {
            0
        } else {
            self.prefix.len() + 1
        };
        let mut keys: Vec<String> = result?
            .into_iter()
            .filter(|k| k.len() > strip)
            .map(|k| k[strip..].to_string())
            .collect();
        keys.sort_unstable();
        Ok(keys)
    }

    /// Measures how far the store's clock is from `clock`: writes a scratch object, reads back
    /// the time the store stamped on it, and bounds the difference by the request's round trip
    /// and the stamp's whole-second precision. Three requests; the scratch object is deleted.
    ///
    /// Leases compare a deadline written by one clock with another's, so a controller or node
    /// whose clock is off by more than the skew allowance is worth reporting.
    ///
    /// ```
    /// # tokio_test::block_on(async {
    /// use cojob::clock::SystemClock;
    /// let store = cojob::Store::open("memory://skew").await?;
    /// let offset = store.clock_offset(&SystemClock).await?;
    /// assert!(!offset.exceeds(std::time::Duration::from_secs(5)));
    /// # Ok::<(), cojob::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub async fn clock_offset(&self, clock: &dyn Clock) -> Result<ClockOffset, StoreError> {
        let key = format!("cojob-clock/{}", token::write_token());
        let before = clock.now();
        self.put(&key, Bytes::from_static(b"{}"), PutMode::Overwrite)
            .await?;
        let after = clock.now();
        let read = self.get_object(&key).await;
        let cleanup = self.delete(&key).await;
        let stamped = read?.and_then(|o| o.last_modified);
        cleanup?;
        Ok(match stamped {
            // The store's write fell in [stamped, stamped + 1 s); ours in [before, after].
            Some(stamped) => ClockOffset {
                min: Some(stamped - after),
                max: Some(stamped + chrono::Duration::seconds(1) - before),
            },
            None => ClockOffset {
                min: None,
                max: None,
            },
        })
    }

    /// Checks that the store honours conditional writes: two racing put-if-absent calls on a
    /// scratch key must give exactly one winner, and a compare-and-swap on a stale version must
    /// fail. The scratch key is deleted afterwards. Run it at start-up and fail closed.
    pub async fn verify_conditional_writes(&self) -> Result<(), StoreError> {
        let key = format!("cojob-probe/{}", token::write_token());
        let result = self.probe(&key).await;
        let cleanup = self.delete(&key).await;
        result.and(cleanup)
    }

    async fn probe(&self, key: &str) -> Result<(), StoreError> {
        let fail = |detail: String| StoreError::NoConditionalWrites {
            store: self.description.to_string(),
            detail,
        };
        let (a, b) = tokio::join!(
            self.put(
                key,
                Bytes::from_static(b"{\"probe\":\"a\"}"),
                PutMode::IfAbsent
            ),
            self.put(
                key,
                Bytes::from_static(b"{\"probe\":\"b\"}"),
                PutMode::IfAbsent
            ),
        );
        let winners: Vec<Version> = [a?, b?]
            .into_iter()
            .filter_map(|o| match o {
                PutOutcome::Written(v) => Some(v),
                PutOutcome::Conflict(_) => None,
            })
            .collect();
        let [first] = winners.as_slice() else {
            return Err(fail(format!(
                "{} of 2 racing put-if-absent calls succeeded, expected exactly 1",
                winners.len()
            )));
        };
        let first = first.clone();
        let PutOutcome::Written(_) = self
            .put(
                key,
                Bytes::from_static(b"{\"probe\":\"c\"}"),
                PutMode::IfMatch(first.clone()),
            )
            .await?
        else {
            return Err(fail(
                "compare-and-swap on the current version failed".into(),
            ));
        };
        match self
            .put(
                key,
                Bytes::from_static(b"{\"probe\":\"d\"}"),
                PutMode::IfMatch(first),
            )
            .await?
        {
            PutOutcome::Conflict(_) => Ok(()),
            PutOutcome::Written(_) => {
                Err(fail("compare-and-swap on a stale version succeeded".into()))
            }
        }
    }
}

/// Checks that a key is a relative, `/`-separated object name with no empty, `.` or `..`
/// segments and no control characters.
pub fn validate_key(key: &str) -> Result<(), StoreError> {
    let bad = |reason| StoreError::InvalidKey {
        key: key.to_string(),
        reason,
    };
    if key.is_empty() {
        return Err(bad("a key may not be empty"));
    }
    if key.len() > 1024 {
        return Err(bad("a key may not be longer than 1024 bytes"));
    }
    if key.chars().any(|c| c.is_control() || c == '\\') {
        return Err(bad("a key may not hold control characters or backslashes"));
    }
    for segment in key.split('/') {
        match segment {
            "" => {
                return Err(bad(
                    "a key may not have empty segments or leading, trailing or doubled '/'",
                ));
            }
            "." | ".." => return Err(bad("a key may not have '.' or '..' segments")),
            s if s.starts_with(".cojob") => {
                return Err(bad("segments starting with '.cojob' are reserved"));
            }
            _ => {}
        }
    }
    Ok(())
}

fn redact(url: &url::Url) -> String {
    let mut u = url.clone();
    let _ = u.set_password(None);
    let _ = u.set_username("");
    u.set_query(None);
    u.to_string()
}
