//! `claim`: a unique constraint. Put-if-absent, then a read-back of the winner.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::db::{Db, encode, from_json, parse_json, to_json};
use crate::error::{Error, Result};
use crate::store::{PutMode, PutOutcome, Version};

/// How many times a claim retries when the winner's object vanishes before it is read back.
pub const CLAIM_ATTEMPTS: u32 = 5;

/// The result of [`Db::claim`].
#[derive(Debug, Clone, PartialEq)]
pub struct Claim<V = Value> {
    /// True iff this call created the object.
    pub won: bool,
    /// Yours if you won, the winner's if you lost.
    pub value: V,
    /// The stored object's version.
    pub etag: Version,
}

impl Db {
    /// Claims `key` with `value`: exactly one caller wins, and every loser gets the winner's
    /// value, so duplicate callers converge. Claims are immutable; there is no unclaim.
    ///
    /// The stored document is the canonical JSON of `value`. If the object vanishes between a
    /// lost put and the read-back, the claim retries, at most [`CLAIM_ATTEMPTS`] times.
    ///
    /// ```
    /// # tokio_test::block_on(async {
    /// use serde_json::json;
    /// let db = cojob::Db::open("memory://").await?;
    /// let first = db.claim("ticks/2026-08-09T02:00:00Z", &json!({"run_id": "r1"})).await?;
    /// let again = db.claim("ticks/2026-08-09T02:00:00Z", &json!({"run_id": "r2"})).await?;
    /// assert!(first.won && !again.won);
    /// assert_eq!(again.value, json!({"run_id": "r1"}));
    /// # Ok::<(), cojob::Error>(()) });
    /// ```
    pub async fn claim<V>(&self, key: &str, value: &V) -> Result<Claim<V>>
    where
        V: Serialize + DeserializeOwned,
    {
        let key = self.key(key)?;
        let json = to_json(&key, value)?;
        let body = encode(&key, &json)?;
        for _ in 0..CLAIM_ATTEMPTS {
            match self
                .store()
                .put(&key, body.clone(), PutMode::IfAbsent)
                .await?
            {
                PutOutcome::Written(etag) => {
                    return Ok(Claim {
                        won: true,
                        value: from_json(&key, json)?,
                        etag,
                    });
                }
                PutOutcome::Conflict(Some(winner)) => {
                    let stored = parse_json(&key, &winner.body)?;
                    return Ok(Claim {
                        won: false,
                        value: from_json(&key, stored)?,
                        etag: winner.version,
                    });
                }
                PutOutcome::Conflict(None) => {
                    tracing::debug!(key, "claimed object vanished before read-back; retrying");
                }
            }
        }
        Err(Error::Contention {
            key,
            attempts: CLAIM_ATTEMPTS,
        })
    }
}
