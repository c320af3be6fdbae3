//! `doc`: a typed document with a compare-and-swap retry loop.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt;
use std::marker::PhantomData;

use crate::db::{Db, backoff, encode, from_json, parse_json, to_json};
use crate::error::{BoxError, Error, Result};
use crate::store::{PutMode, PutOutcome, Version};

/// One object as a typed document `T`, stored as canonical JSON. Made by [`Db::doc`].
///
/// ```
/// # tokio_test::block_on(async {
/// use serde::{Deserialize, Serialize};
/// #[derive(Serialize, Deserialize, Default, Debug, PartialEq)]
/// struct Counters { runs: u64 }
///
/// let db = cojob::Db::open("memory://").await?;
/// let counters = db.doc::<Counters>("metrics/daily");
/// counters.update(|mut c| { c.runs += 1; c }, Some(Counters::default())).await?;
/// counters.update(|mut c| { c.runs += 1; c }, None).await?;
/// let (value, _version) = counters.get().await?.expect("present");
/// assert_eq!(value, Counters { runs: 2 });
/// counters.delete().await?;
/// assert!(counters.get().await?.is_none());
/// # Ok::<(), cojob::Error>(()) });
/// ```
pub struct Doc<T> {
    db: Db,
    key: String,
    max_attempts: u32,
    _type: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for Doc<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Doc")
            .field("key", &self.key)
            .field("type", &std::any::type_name::<T>())
            .field("max_attempts", &self.max_attempts)
            .finish()
    }
}

impl<T> Clone for Doc<T> {
    fn clone(&self) -> Self {
        Doc {
            db: self.db.clone(),
            key: self.key.clone(),
            max_attempts: self.max_attempts,
            _type: PhantomData,
        }
    }
}

impl Db {
    /// A typed document at `key`. The key is checked on first use.
    pub fn doc<T: Serialize + DeserializeOwned>(&self, key: &str) -> Doc<T> {
        Doc {
            db: self.clone(),
            key: key.to_string(),
            max_attempts: self.max_attempts(),
            _type: PhantomData,
        }
    }
}

impl<T: Serialize + DeserializeOwned> Doc<T> {
    /// The document's key, as given.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Sets how many read-modify-write rounds `update` tries before giving up (at least 1;
    /// default [`DEFAULT_MAX_ATTEMPTS`](crate::DEFAULT_MAX_ATTEMPTS)).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// Reads the document and its version, or `None` if absent. A stored object that is not a
    /// `T` is [`Error::Corrupt`].
    pub async fn get(&self) -> Result<Option<(T, Version)>> {
        let key = self.db.key(&self.key)?;
        match self.db.read_json(&key).await? {
            None => Ok(None),
            Some((json, version)) => Ok(Some((from_json(&key, json)?, version))),
        }
    }

    /// Atomic read-modify-write: reads the document (or takes `create` when absent), applies
    /// `f`, and writes the result with compare-and-swap (or put-if-absent), retrying lost races
    /// up to `max_attempts` times. A lost race returns the winning document, so a retry needs
    /// no extra read; it waits a jittered, exponentially growing pause first (up to
    /// [`BACKOFF_CAP`](crate::BACKOFF_CAP)), so contending writers spread out. `f` must be pure: it can run more than once. With no
    /// `create`, an absent document is [`Error::NotFound`]. Returns the value written and its
    /// version.
    pub async fn update<F>(&self, mut f: F, create: Option<T>) -> Result<(T, Version)>
    where
        F: FnMut(T) -> T,
    {
        self.try_update(|v| Ok::<T, BoxError>(f(v)), create).await
    }

    /// Like [`update`](Self::update), but `f` can abort with an error, and then nothing is
    /// written ([`Error::Aborted`]).
    pub async fn try_update<F, E>(&self, f: F, create: Option<T>) -> Result<(T, Version)>
    where
        F: FnMut(T) -> Result<T, E>,
        E: Into<BoxError>,
    {
        let key = self.db.key(&self.key)?;
        let current = match self.db.store().get_object(&key).await? {
            Some(object) => Some((parse_json(&key, &object.body)?, object.version)),
            None => None,
        };
        self.update_loop(key, current, f, create).await
    }

    /// Like [`try_update`](Self::try_update), but starts from `known`, a value and version the
    /// caller read earlier (from [`get`](Self::get)), instead of reading again: one request
    /// fewer when `known` is still current. A stale `known` costs nothing but the lost
    /// compare-and-swap, which returns the current document. `known = None` means "absent".
    ///
    /// ```
    /// # tokio_test::block_on(async {
    /// let db = cojob::Db::open("memory://").await?;
    /// let doc = db.doc::<u64>("n");
    /// doc.set(&1).await?;
    /// let known = doc.get().await?;
    /// let before = db.store().stats();
    /// let (n, _) = doc.update_from(known, |n| Ok::<_, cojob::BoxError>(n + 1), None).await?;
    /// assert_eq!(n, 2);
    /// assert_eq!(db.store().stats().since(&before).gets(), 0);
    /// # Ok::<(), cojob::Error>(()) });
    /// ```
    pub async fn update_from<F, E>(
        &self,
        known: Option<(T, Version)>,
        f: F,
        create: Option<T>,
    ) -> Result<(T, Version)>
    where
        F: FnMut(T) -> Result<T, E>,
        E: Into<BoxError>,
    {
        let key = self.db.key(&self.key)?;
        let current = known
            .map(|(value, version)| Ok::<_, Error>((to_json(&key, &value)?, version)))
            .transpose()?;
        self.update_loop(key, current, f, create).await
    }

    async fn update_loop<F, E>(
        &self,
        key: String,
        mut current: Option<(Value, Version)>,
        mut f: F,
        create: Option<T>,
    ) -> Result<(T, Version)>
    where
        F: FnMut(T) -> Result<T, E>,
        E: Into<BoxError>,
    {
        let create: Option<Value> = create.map(|c| to_json(&key, &c)).transpose()?;
        for attempt in 0..self.max_attempts {
            if attempt > 0 {
                backoff(attempt).await;
            }
            let (value, mode) = match current {
                Some((value, version)) => (value, PutMode::IfMatch(version)),
                None => match &create {
                    Some(c) => (c.clone(), PutMode::IfAbsent),
                    None => return Err(Error::NotFound { key }),
                },
            };
            let next = f(from_json(&key, value)?).map_err(|e| Error::Aborted {
                key: key.clone(),
                source: e.into(),
            })?;
            let body = encode(&key, &to_json(&key, &next)?)?;
            match self.db.store().put(&key, body, mode).await? {
                PutOutcome::Written(version) => return Ok((next, version)),
                PutOutcome::Conflict(now_stored) => {
                    current = match now_stored {
                        Some(object) => Some((parse_json(&key, &object.body)?, object.version)),
                        None => None,
                    };
                }
            }
        }
        Err(Error::Contention {
            key,
            attempts: self.max_attempts,
        })
    }

    /// Writes `value` unconditionally.
    pub async fn set(&self, value: &T) -> Result<Version> {
        let key = self.db.key(&self.key)?;
        let body = encode(&key, &to_json(&key, value)?)?;
        match self.db.store().put(&key, body, PutMode::Overwrite).await? {
            PutOutcome::Written(v) => Ok(v),
            PutOutcome::Conflict(_) => Err(Error::Contention { key, attempts: 1 }),
        }
    }

    /// Deletes the document; deleting an absent document succeeds.
    pub async fn delete(&self) -> Result<()> {
        let key = self.db.key(&self.key)?;
        Ok(self.db.store().delete(&key).await?)
    }
}
