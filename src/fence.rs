//! `fence`: effects fenced by a token, for writes that live outside the lease.
//!
//! A run's attempts carry a growing fencing token (cojob's `COJOB_EPOCH`). A workload that
//! writes a result somewhere else keeps the token next to the result and writes by
//! compare-and-swap, refusing when the stored token is newer than its own: an attempt that was
//! taken over, but still runs on a node nobody can reach, can no longer overwrite the newer
//! attempt's result. A write with the same token is allowed again (a retried write of the same
//! attempt), and a newer token replaces an older one.
//!
//! The document is `{"fence": <token>, "value": <T>}`, canonical JSON like every cojob
//! document, at any key of any store [`Db`] opens.
//!
//! ```
//! # tokio_test::block_on(async {
//! use cojob::fence::Fenced;
//! let db = cojob::Db::open("memory://effects").await?;
//! // Attempt 2 wrote its result ...
//! assert!(matches!(db.fenced_put("payments/run-7", 2, "paid").await?, Fenced::Written { .. }));
//! // ... so attempt 1, still running somewhere, is refused.
//! assert_eq!(db.fenced_put("payments/run-7", 1, "paid").await?, Fenced::Stale { stored: 2 });
//! let (token, value) = db.fenced_get::<String>("payments/run-7").await?.unwrap();
//! assert_eq!((token, value.as_str()), (2, "paid"));
//! # Ok::<(), cojob::Error>(()) });
//! ```

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::db::Db;
use crate::error::{Error, Result};
use crate::store::Version;

/// What a fenced write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fenced {
    /// The value was written with the token; this is the document's new version.
    Written {
        /// The version written.
        version: Version,
    },
    /// Nothing was written: the document carries a newer token.
    Stale {
        /// The token stored.
        stored: u64,
    },
}

/// The stored form of a fenced document.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored<T> {
    fence: u64,
    value: T,
}

/// The abort reason of a stale write, inside the update loop.
#[derive(Debug, thiserror::Error)]
#[error("the document carries fence {stored}, newer than {token}")]
struct StaleFence {
    stored: u64,
    token: u64,
}

impl Db {
    /// Writes `value` at `key` with the fencing token `token`, unless the document there
    /// carries a newer token. Retries lost races (bounded by the database's `max_attempts`);
    /// a foreign document at `key` is an [`Error::Corrupt`], never overwritten.
    pub async fn fenced_put<T>(&self, key: &str, token: u64, value: &T) -> Result<Fenced>
    where
        T: Serialize + ?Sized,
    {
        let value = serde_json::to_value(value).map_err(|e| Error::Serialize {
            key: key.to_string(),
            source: e,
        })?;
        let doc = self.doc::<Stored<serde_json::Value>>(key);
        let next = Stored {
            fence: token,
            value: value.clone(),
        };
        let result = doc
            .try_update(
                |current: Stored<serde_json::Value>| {
                    if current.fence > token {
                        Err(StaleFence {
                            stored: current.fence,
                            token,
                        })
                    } else {
                        Ok(Stored {
                            fence: token,
                            value: value.clone(),
                        })
                    }
                },
                Some(next),
            )
            .await;
        match result {
            Ok((_, version)) => Ok(Fenced::Written { version }),
            Err(Error::Aborted { source, key }) => match source.downcast::<StaleFence>() {
                Ok(stale) => Ok(Fenced::Stale {
                    stored: stale.stored,
                }),
                Err(source) => Err(Error::Aborted { key, source }),
            },
            Err(e) => Err(e),
        }
    }

    /// The token and value of the fenced document at `key`, if any.
    pub async fn fenced_get<T>(&self, key: &str) -> Result<Option<(u64, T)>>
    where
        T: Serialize + DeserializeOwned,
    {
        Ok(self
            .doc::<Stored<T>>(key)
            .get()
            .await?
            .map(|(s, _)| (s.fence, s.value)))
    }
}
