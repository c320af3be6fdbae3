//! Typed errors of the coordination library.
//!
//! Two enums split the failures by layer: [`StoreError`] for layer 0 (object I/O) and [`Error`]
//! for layer 1 (claim, lease, doc). Every layer-1 call returns [`Error`], which wraps a
//! [`StoreError`] when the store itself failed.

use std::fmt;

/// A boxed error returned by user closures (`state_fn`, `Doc::try_update`, …) to abort.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The result type of layer-1 operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which store operation failed; used in errors and in request counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// A read of one object.
    Get,
    /// An unconditional write.
    PutOverwrite,
    /// A put-if-absent (create) write.
    PutIfAbsent,
    /// A compare-and-swap write guarded by a version.
    PutIfMatch,
    /// A delete.
    Delete,
    /// A listing.
    List,
}

impl Op {
    /// Every operation, in counter order.
    pub const ALL: [Op; 6] = [
        Op::Get,
        Op::PutOverwrite,
        Op::PutIfAbsent,
        Op::PutIfMatch,
        Op::Delete,
        Op::List,
    ];

    /// A stable lowercase name, for metrics labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::PutOverwrite => "put_overwrite",
            Op::PutIfAbsent => "put_if_absent",
            Op::PutIfMatch => "put_if_match",
            Op::Delete => "delete",
            Op::List => "list",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failure of layer 0: opening a store or one request to it.
///
/// A lost conditional write is *not* an error: it is
/// [`PutOutcome::Conflict`](crate::store::PutOutcome::Conflict).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store URL could not be parsed or names an unsupported scheme.
    #[error("invalid store URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// A key is not a valid object name (empty, absolute, `..`, empty segment, …).
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey {
        /// The key as given.
        key: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The store refused the credentials, or they lack permission for the operation.
    #[error("{op} {key:?}: access denied: {source}")]
    AccessDenied {
        /// The operation.
        op: Op,
        /// The key.
        key: String,
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// An object is larger than the limit of a bounded read; it was not read into memory.
    #[error(
        "{key:?}: the object has {size} bytes, more than the {limit} a cojob document may have"
    )]
    TooLarge {
        /// The key.
        key: String,
        /// The object's size in bytes.
        size: u64,
        /// The limit in bytes.
        limit: usize,
    },
    /// The bucket (S3, GCS) or container (Azure) named by the store URL does not exist.
    #[error("{op} {key:?}: the bucket does not exist: {source}")]
    NoSuchBucket {
        /// The operation.
        op: Op,
        /// The key.
        key: String,
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// The store could not be reached or answered with a server error (after retries).
    #[error("{op} {key:?}: store unavailable: {source}")]
    Unavailable {
        /// The operation.
        op: Op,
        /// The key.
        key: String,
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// The store does not honour conditional writes, as found by
    /// [`Store::verify_conditional_writes`](crate::store::Store::verify_conditional_writes).
    #[error("store {store} does not honour conditional writes: {detail}")]
    NoConditionalWrites {
        /// The store's description.
        store: String,
        /// What the probe observed.
        detail: String,
    },
    /// Any other backend failure.
    #[error("{op} {key:?}: {source}")]
    Backend {
        /// The operation.
        op: Op,
        /// The key.
        key: String,
        /// The backend's error.
        #[source]
        source: BoxError,
    },
}

impl StoreError {
    /// True when the store is at fault (unreachable, failing, refusing the credentials, or
    /// without its bucket), as opposed to one key or object ([`TooLarge`](Self::TooLarge),
    /// [`InvalidKey`](Self::InvalidKey)) or the caller's URL.
    ///
    /// ```
    /// use cojob::{StoreError, error::Op};
    /// let down = StoreError::Unavailable { op: Op::Get, key: "k".into(), source: "refused".into() };
    /// assert!(down.is_store_failure());
    /// let big = StoreError::TooLarge { key: "k".into(), size: 9, limit: 1 };
    /// assert!(!big.is_store_failure());
    /// ```
    pub fn is_store_failure(&self) -> bool {
        !matches!(
            self,
            StoreError::InvalidUrl { .. }
                | StoreError::InvalidKey { .. }
                | StoreError::TooLarge { .. }
        )
    }
}

/// Why a lease handle lost its ownership period.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// Someone acquired the lease again: the stored epoch is newer than ours.
    EpochAdvanced {
        /// The handle's epoch.
        ours: u64,
        /// The stored epoch.
        stored: u64,
    },
    /// The stored holder is not ours (another holder, or none after a release).
    HolderChanged,
    /// The lease document was deleted.
    Deleted,
    /// This handle already released the lease.
    Released,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::EpochAdvanced { ours, stored } => {
                write!(f, "epoch advanced from {ours} to {stored}")
            }
            LostReason::HolderChanged => f.write_str("the holder changed"),
            LostReason::Deleted => f.write_str("the lease document was deleted"),
            LostReason::Released => f.write_str("the lease was already released by this handle"),
        }
    }
}

/// A failure of a layer-1 operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lease was lost; the holder must discard its outcome.
    #[error("lease {key:?} lost: {reason}")]
    LeaseLost {
        /// The lease key.
        key: String,
        /// How it was lost.
        reason: LostReason,
    },
    /// The stored object is not a document of the expected shape (not JSON, wrong fields, a
    /// foreign object). Nothing was written.
    #[error("object {key:?} is not a valid {expected}: {detail}")]
    Corrupt {
        /// The key.
        key: String,
        /// What was expected there (`"lease document"`, a type name, …).
        expected: String,
        /// The parse failure.
        detail: String,
    },
    /// A lease ttl of zero was given; ttls must be greater than zero.
    #[error("invalid lease ttl {ttl:?}: it must be greater than zero")]
    InvalidTtl {
        /// The ttl given.
        ttl: std::time::Duration,
    },
    /// An empty holder string was given, or one in the recorded form (`sha256:…`).
    #[error("invalid lease holder: it must be a non-empty string not beginning with \"sha256:\"")]
    InvalidHolder,
    /// A value could not be serialized to JSON. Nothing was written.
    #[error("value for {key:?} does not serialize to JSON: {source}")]
    Serialize {
        /// The key.
        key: String,
        /// The serializer's error.
        #[source]
        source: serde_json::Error,
    },
    /// A document is larger than [`MAX_DOCUMENT_BYTES`](crate::MAX_DOCUMENT_BYTES). Nothing was
    /// written.
    #[error("document for {key:?} is {size} bytes, over the limit of {limit} bytes")]
    TooLarge {
        /// The key.
        key: String,
        /// The document's size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The document does not exist and the operation needs it.
    #[error("no document at {key:?}")]
    NotFound {
        /// The key.
        key: String,
    },
    /// A user closure (`state_fn`, an update function) returned an error. Nothing was written.
    #[error("aborted by the caller's function at {key:?}: {source}")]
    Aborted {
        /// The key.
        key: String,
        /// The closure's error.
        #[source]
        source: BoxError,
    },
    /// Every attempt lost a race; the operation gave up.
    #[error("gave up on {key:?} after {attempts} attempts under contention")]
    Contention {
        /// The key.
        key: String,
        /// How many attempts were made.
        attempts: u32,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Error {
    /// True for [`Error::LeaseLost`].
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. })
    }

    /// True when retrying later may succeed: contention or an unavailable store.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Contention { .. } | Error::Store(StoreError::Unavailable { .. })
        )
    }
}
