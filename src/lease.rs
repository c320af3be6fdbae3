//! `lease`: expiring ownership with epoch fencing.
//!
//! A lease is the document `{"deadline_at":…,"epoch":…,"holder":…,"state":…}`, only ever
//! replaced by compare-and-swap. `holder` records the holder's digest
//! ([`holder_digest`]), never the credential itself. Every acquisition bumps `epoch`, the fencing token. Every write
//! through a [`Lease`] handle is guarded by the version the handle last saw; when the guard
//! fails the handle re-reads and classifies: epoch advanced, holder changed or document gone
//! means [`Error::LeaseLost`]; same epoch and holder means a cooperative write, whose state is
//! absorbed before the write is retried.

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::db::{Db, backoff, encode, from_json};
use crate::error::{BoxError, Error, LostReason, Result};
use crate::json::{format_time, parse_time, truncate_micros};
use crate::store::{PutMode, PutOutcome, StoredObject, Version};
use crate::token::{holder_digest, is_digest_like, records_holder};

/// A state transition run atomically with an acquisition: it receives the current state (`None`
/// for a fresh lease) and returns the new one, or an error to abort (nothing is written). It must
/// be pure, because a lost race calls it again.
pub type StateFn = Arc<dyn Fn(Option<&Value>) -> Result<Value, BoxError> + Send + Sync>;

/// Options of [`Db::lease`].
///
/// ```
/// use cojob::LeaseOptions;
/// use std::time::Duration;
/// let opts = LeaseOptions::new(cojob::new_holder(), Duration::from_secs(60))
///     .state_fn(|s| Ok(serde_json::json!({"status": "running", "was": s.cloned()})))
///     .steal_if_expired(true);
/// assert_eq!(opts.ttl, Duration::from_secs(60));
/// ```
#[derive(Clone)]
pub struct LeaseOptions {
    /// How long an acquisition or renewal holds the lease. Must be greater than zero.
    pub ttl: Duration,
    /// Who is acquiring: an unguessable string (see [`new_holder`](crate::new_holder)).
    pub holder: String,
    /// An optional transition of the state, written atomically with the acquisition.
    pub state_fn: Option<StateFn>,
    /// Whether an expired lease held by someone else may be taken (default `true`).
    pub steal_if_expired: bool,
}

impl fmt::Debug for LeaseOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseOptions")
            .field("ttl", &self.ttl)
            .field("holder", &"<redacted>")
            .field("state_fn", &self.state_fn.is_some())
            .field("steal_if_expired", &self.steal_if_expired)
            .finish()
    }
}

impl LeaseOptions {
    /// Options for `holder` with `ttl`, no state function, stealing expired leases.
    pub fn new(holder: impl Into<String>, ttl: Duration) -> Self {
        LeaseOptions {
            ttl,
            holder: holder.into(),
            state_fn: None,
            steal_if_expired: true,
        }
    }

    /// Sets the acquisition's state transition.
    pub fn state_fn<F>(mut self, f: F) -> Self
    where
        F: Fn(Option<&Value>) -> Result<Value, BoxError> + Send + Sync + 'static,
    {
        self.state_fn = Some(Arc::new(f));
        self
    }

    /// Sets whether an expired lease may be stolen.
    pub fn steal_if_expired(mut self, steal: bool) -> Self {
        self.steal_if_expired = steal;
        self
    }
}

/// The stored lease document.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LeaseDoc {
    pub deadline_at: DateTime<Utc>,
    pub epoch: u64,
    /// As recorded: the holder's digest (or, in documents written before digests, the holder).
    pub holder: Option<String>,
    pub state: Value,
}

const FIELDS: [&str; 4] = ["deadline_at", "epoch", "holder", "state"];

impl LeaseDoc {
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "deadline_at": format_time(self.deadline_at),
            "epoch": self.epoch,
            "holder": self.holder,
            "state": self.state,
        })
    }

    /// Parses a stored lease document, refusing anything that is not exactly the lease shape.
    pub(crate) fn parse(key: &str, bytes: &[u8]) -> Result<LeaseDoc> {
        let corrupt = |detail: String| Error::Corrupt {
            key: key.to_string(),
            expected: "lease document".into(),
            detail,
        };
        let value: Value = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
        let Value::Object(mut map) = value else {
            return Err(corrupt("not a JSON object".into()));
        };
        if map.len() != FIELDS.len() || !FIELDS.iter().all(|f| map.contains_key(*f)) {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            return Err(corrupt(format!(
                "fields are {keys:?}, expected exactly {FIELDS:?}"
            )));
        }
        let deadline_at = map
            .get("deadline_at")
            .and_then(Value::as_str)
            .and_then(|s| parse_time(s).ok())
            .ok_or_else(|| corrupt("deadline_at is not an RFC 3339 timestamp".into()))?;
        let epoch = map
            .get("epoch")
            .and_then(Value::as_u64)
            .filter(|e| *e > 0)
            .ok_or_else(|| corrupt("epoch is not a positive integer".into()))?;
        let holder = match map.get("holder") {
            Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            _ => {
                return Err(corrupt(
                    "holder is neither null nor a non-empty string".into(),
                ));
            }
        };
        let state = map.remove("state").unwrap_or(Value::Null);
        Ok(LeaseDoc {
            deadline_at,
            epoch,
            holder,
            state,
        })
    }

    /// Expiry is inclusive: a lease whose deadline is `now` has expired.
    pub(crate) fn expired_at(&self, now: DateTime<Utc>) -> bool {
        now >= self.deadline_at
    }
}

/// A read-only view of a stored lease, from [`Db::inspect_lease`]: what a sweeper needs to
/// decide whether a lease is held, released or expired, without acquiring it.
///
/// Its holder string is a credential and is never printed by `Debug`.
#[derive(Clone, PartialEq)]
pub struct LeaseInfo {
    /// The fencing epoch of the current (or last) ownership period.
    pub epoch: u64,
    /// The holder as recorded, `sha256:…` ([`holder_digest`]), or `None`
    /// after a release. Compare a holder with [`is_held_by`](Self::is_held_by).
    pub holder: Option<String>,
    /// When the current ownership period ends unless renewed.
    pub deadline: DateTime<Utc>,
    /// The application state.
    pub state: Value,
    /// The stored version.
    pub version: Version,
}

impl LeaseInfo {
    fn to_doc(&self) -> LeaseDoc {
        LeaseDoc {
            deadline_at: self.deadline,
            epoch: self.epoch,
            holder: self.holder.clone(),
            state: self.state.clone(),
        }
    }

    /// True once released (no holder).
    pub fn is_released(&self) -> bool {
        self.holder.is_none()
    }

    /// True when held and the deadline is at or before `now` (expiry is inclusive).
    pub fn is_expired_at(&self, now: DateTime<Utc>) -> bool {
        self.holder.is_some() && now >= self.deadline
    }

    /// True when `holder` holds it (expired or not).
    pub fn is_held_by(&self, holder: &str) -> bool {
        records_holder(self.holder.as_deref(), holder)
    }
}

impl fmt::Debug for LeaseInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseInfo")
            .field("epoch", &self.epoch)
            .field("holder", &self.holder.as_ref().map(|_| "<redacted>"))
            .field("deadline", &self.deadline)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

fn check_ttl(ttl: Duration) -> Result<chrono::Duration> {
    if ttl.is_zero() {
        return Err(Error::InvalidTtl { ttl });
    }
    chrono::Duration::from_std(ttl).map_err(|_| Error::InvalidTtl { ttl })
}

fn check_holder(holder: &str) -> Result<()> {
    if holder.is_empty() || is_digest_like(holder) {
        return Err(Error::InvalidHolder);
    }
    Ok(())
}

/// A handle on one ownership period of a lease: `(key, epoch, holder)`.
///
/// Its holder string is a credential and is never printed by `Debug`.
pub struct Lease {
    db: Db,
    key: String,
    ttl: Duration,
    doc: LeaseDoc,
    holder: String,
    version: Version,
    released: bool,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("epoch", &self.doc.epoch)
            .field("deadline_at", &format_time(self.doc.deadline_at))
            .field("released", &self.released)
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// The lease's key (with the `Db` prefix).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token of this ownership period.
    pub fn epoch(&self) -> u64 {
        self.doc.epoch
    }

    /// The holder string (a credential: keep it out of logs).
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The deadline this handle last wrote or saw.
    pub fn deadline(&self) -> DateTime<Utc> {
        self.doc.deadline_at
    }

    /// The ttl that renewals extend the deadline by.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The state this handle last wrote or absorbed.
    pub fn state(&self) -> &Value {
        &self.doc.state
    }

    /// The state converted to `T`.
    pub fn state_as<T: DeserializeOwned>(&self) -> Result<T> {
        from_json(&self.key, self.doc.state.clone())
    }

    /// The stored version this handle's next write is guarded by.
    pub fn version(&self) -> &Version {
        &self.version
    }

    /// Whether the deadline has passed by the `Db`'s clock (inclusive).
    pub fn is_expired(&self) -> bool {
        self.doc.expired_at(self.db.clock().now())
    }

    /// Whether this handle has released the lease.
    pub fn is_released(&self) -> bool {
        self.released
    }

    /// The lease as this handle last wrote or saw it, as [`Db::inspect_lease`] would read it
    /// then: the holder as its digest, `None` once released.
    ///
    /// ```
    /// # tokio_test::block_on(async {
    /// use cojob::{Db, LeaseOptions};
    /// use std::time::Duration;
    /// let db = Db::open("memory://").await?;
    /// let mut lease = db.lease("l", LeaseOptions::new("w1", Duration::from_secs(30))).await?.unwrap();
    /// let held = lease.info();
    /// assert!(held.is_held_by("w1"));
    /// assert_eq!(held.deadline, db.inspect_lease("l").await?.unwrap().deadline);
    /// lease.release(None).await?;
    /// assert!(lease.info().is_released());
    /// # Ok::<(), cojob::Error>(()) });
    /// ```
    pub fn info(&self) -> LeaseInfo {
        LeaseInfo {
            epoch: self.doc.epoch,
            holder: (!self.released).then(|| holder_digest(&self.holder)),
            deadline: self.doc.deadline_at,
            state: self.doc.state.clone(),
            version: self.version.clone(),
        }
    }

    /// Heartbeat: extends the deadline to now + ttl. Absorbs cooperative writes.
    pub async fn renew(&mut self) -> Result<()> {
        self.guarded(true, Some(holder_digest(&self.holder)), |s| Ok(s.clone()))
            .await
    }

    /// Heartbeat and state change in one write: extends the deadline to now + ttl and stores
    /// `f` of the freshest state (cooperative writes included; `f` may run more than once).
    /// `f` may refuse, and then nothing is written ([`Error::Aborted`]). A holder that attaches
    /// and records that it started this way proves the lease is its own, and says so, with
    /// one request.
    ///
    /// ```
    /// # tokio_test::block_on(async {
    /// use cojob::{Db, LeaseOptions};
    /// use serde_json::json;
    /// use std::time::Duration;
    /// let db = Db::open("memory://").await?;
    /// let mut lease = db.lease("l", LeaseOptions::new("w1", Duration::from_secs(30))).await?.unwrap();
    /// let before = lease.deadline();
    /// lease.renew_with(|s| Ok(cojob::lease::merge(s, json!({"status": "running"})))).await?;
    /// assert!(lease.deadline() >= before);
    /// assert_eq!(db.inspect_lease("l").await?.unwrap().state["status"], "running");
    /// # Ok::<(), cojob::Error>(()) });
    /// ```
    pub async fn renew_with<F>(&mut self, f: F) -> Result<()>
    where
        F: FnMut(&Value) -> Result<Value, BoxError>,
    {
        self.guarded(true, Some(holder_digest(&self.holder)), f)
            .await
    }

    /// Guarded read-modify-write of the state. `f` sees the freshest state, cooperative writes
    /// included, and may run more than once.
    pub async fn update_state<F>(&mut self, mut f: F) -> Result<()>
    where
        F: FnMut(&Value) -> Value,
    {
        self.guarded(false, Some(holder_digest(&self.holder)), |s| Ok(f(s)))
            .await
    }

    /// Like [`update_state`](Self::update_state), but `f` can abort with an error, and then
    /// nothing is written ([`Error::Aborted`]).
    pub async fn try_update_state<F>(&mut self, f: F) -> Result<()>
    where
        F: FnMut(&Value) -> Result<Value, BoxError>,
    {
        self.guarded(false, Some(holder_digest(&self.holder)), f)
            .await
    }

    /// Guarded replace of the state. It discards cooperative writes it has not read; holders in a
    /// cooperative protocol should use [`update_state`](Self::update_state).
    pub async fn write(&mut self, state: Value) -> Result<()> {
        self.guarded(false, Some(holder_digest(&self.holder)), |_| {
            Ok(state.clone())
        })
        .await
    }

    /// Ends this ownership period: records `state` (or keeps the current one) and sets the
    /// holder to null. The document stays, so epochs keep increasing. Any later write through
    /// this handle fails with [`Error::LeaseLost`].
    pub async fn release(&mut self, state: Option<Value>) -> Result<()> {
        self.guarded(false, None, |s| {
            Ok(state.clone().unwrap_or_else(|| s.clone()))
        })
        .await?;
        self.released = true;
        Ok(())
    }

    /// Ends this ownership period like [`release`](Self::release), but the final state is
    /// `f` of the freshest state: a cooperative write that lands meanwhile (a cancel request,
    /// say) is read and passed to `f` again, never overwritten by a state computed before it.
    /// `f` may refuse, and then nothing is written ([`Error::Aborted`]).
    ///
    /// ```
    /// # tokio_test::block_on(async {
    /// use cojob::{Db, LeaseOptions};
    /// use serde_json::json;
    /// use std::time::Duration;
    /// let db = Db::open("memory://").await?;
    /// let mut lease = db.lease("l", LeaseOptions::new("w1", Duration::from_secs(30))).await?.unwrap();
    /// db.cooperative_write("l", |_| json!({"cancel_requested": true})).await?;
    /// lease.release_with(|s| Ok(json!({"cancel_requested": s["cancel_requested"], "status": "done"}))).await?;
    /// let stored = db.inspect_lease("l").await?.unwrap();
    /// assert_eq!(stored.state, json!({"cancel_requested": true, "status": "done"}));
    /// # Ok::<(), cojob::Error>(()) });
    /// ```
    pub async fn release_with<F>(&mut self, f: F) -> Result<()>
    where
        F: FnMut(&Value) -> Result<Value, BoxError>,
    {
        self.guarded(false, None, f).await?;
        self.released = true;
        Ok(())
    }

    async fn guarded<F>(&mut self, extend: bool, holder: Option<String>, mut f: F) -> Result<()>
    where
        F: FnMut(&Value) -> Result<Value, BoxError>,
    {
        if self.released {
            return Err(self.lost(LostReason::Released));
        }
        for _ in 0..self.db.max_attempts() {
            let state = f(&self.doc.state).map_err(|source| Error::Aborted {
                key: self.key.clone(),
                source,
            })?;
            let deadline_at = if extend {
                deadline(&self.db, self.ttl)?
            } else {
                self.doc.deadline_at
            };
            let next = LeaseDoc {
                deadline_at,
                epoch: self.doc.epoch,
                holder: holder.clone(),
                state,
            };
            let body = encode(&self.key, &next.to_json())?;
            let mode = PutMode::IfMatch(self.version.clone());
            match self.db.store().put(&self.key, body, mode).await? {
                PutOutcome::Written(version) => {
                    self.doc = next;
                    self.version = version;
                    return Ok(());
                }
                PutOutcome::Conflict(current) => self.absorb(current)?,
            }
        }
        Err(Error::Contention {
            key: self.key.clone(),
            attempts: self.db.max_attempts(),
        })
    }

    /// After a failed guard: classify what is stored now, and absorb a cooperative write.
    fn absorb(&mut self, current: Option<StoredObject>) -> Result<()> {
        let Some(current) = current else {
            return Err(self.lost(LostReason::Deleted));
        };
        let stored = LeaseDoc::parse(&self.key, &current.body)?;
        if stored.epoch > self.doc.epoch {
            return Err(self.lost(LostReason::EpochAdvanced {
                ours: self.doc.epoch,
                stored: stored.epoch,
            }));
        }
        if stored.epoch < self.doc.epoch {
            // The document was deleted and created again since this period began.
            return Err(self.lost(LostReason::Deleted));
        }
        if !records_holder(stored.holder.as_deref(), &self.holder) {
            return Err(self.lost(LostReason::HolderChanged));
        }
        tracing::debug!(
            key = self.key,
            epoch = stored.epoch,
            "absorbed a cooperative write"
        );
        self.doc = stored;
        self.version = current.version;
        Ok(())
    }

    fn lost(&self, reason: LostReason) -> Error {
        tracing::info!(key = self.key, epoch = self.doc.epoch, %reason, "lease lost");
        Error::LeaseLost {
            key: self.key.clone(),
            reason,
        }
    }
}

fn deadline(db: &Db, ttl: Duration) -> Result<DateTime<Utc>> {
    let ttl = check_ttl(ttl)?;
    let now = db.clock().now();
    Ok(truncate_micros(now.checked_add_signed(ttl).ok_or(
        Error::InvalidTtl {
            ttl: ttl.to_std().unwrap_or_default(),
        },
    )?))
}

impl Db {
    /// Acquires the lease at `key`: creates it, re-acquires it after a release, or steals it
    /// once expired (if `opts.steal_if_expired`). Every acquisition bumps the epoch and runs
    /// `opts.state_fn`. Returns `None` while someone else actively holds it.
    ///
    /// Acquiring a lease this holder already holds begins a new period and fences the old one.
    ///
    /// ```
    /// # tokio_test::block_on(async {
    /// use cojob::{Db, LeaseOptions};
    /// use serde_json::json;
    /// use std::time::Duration;
    /// let db = Db::open("memory://").await?;
    /// let ttl = Duration::from_secs(60);
    /// let mut lease = db
    ///     .lease("runs/r1/lease", LeaseOptions::new(cojob::new_holder(), ttl)
    ///         .state_fn(|_| Ok(json!({"status": "running"}))))
    ///     .await?
    ///     .expect("free");
    /// assert_eq!(lease.epoch(), 1);
    /// assert!(db.lease("runs/r1/lease", LeaseOptions::new("someone-else", ttl)).await?.is_none());
    /// lease.renew().await?;
    /// lease.update_state(|s| json!({"status": s["status"], "progress": 0.5})).await?;
    /// lease.release(Some(json!({"status": "succeeded"}))).await?;
    /// let again = db.lease("runs/r1/lease", LeaseOptions::new("someone-else", ttl)).await?.expect("released");
    /// assert_eq!(again.epoch(), 2);
    /// assert_eq!(again.state(), &json!({"status": "succeeded"}));
    /// # Ok::<(), cojob::Error>(()) });
    /// ```
    pub async fn lease(&self, key: &str, opts: LeaseOptions) -> Result<Option<Lease>> {
        let key = self.key(key)?;
        check_ttl(opts.ttl)?;
        check_holder(&opts.holder)?;
        let current = parse_lease(&key, self.store().get_object(&key).await?)?;
        self.acquire(key, opts, current).await
    }

    /// Like [`lease`](Self::lease), but starts from `known`, the lease as the caller read it
    /// with [`inspect_lease`](Self::inspect_lease) (`None`: absent), instead of reading again.
    /// A stale `known` only costs the lost compare-and-swap, which returns the current document.
    ///
    /// ```
    /// # tokio_test::block_on(async {
    /// use cojob::{Db, LeaseOptions};
    /// use std::time::Duration;
    /// let db = Db::open("memory://").await?;
    /// let known = db.inspect_lease("l").await?;
    /// let before = db.store().stats();
    /// let lease = db.lease_from("l", LeaseOptions::new("w1", Duration::from_secs(30)), known.as_ref()).await?;
    /// assert_eq!(lease.expect("free").epoch(), 1);
    /// assert_eq!(db.store().stats().since(&before).gets(), 0);
    /// # Ok::<(), cojob::Error>(()) });
    /// ```
    pub async fn lease_from(
        &self,
        key: &str,
        opts: LeaseOptions,
        known: Option<&LeaseInfo>,
    ) -> Result<Option<Lease>> {
        let key = self.key(key)?;
        check_ttl(opts.ttl)?;
        check_holder(&opts.holder)?;
        let current = known.map(|k| (k.to_doc(), k.version.clone()));
        self.acquire(key, opts, current).await
    }

    async fn acquire(
        &self,
        key: String,
        opts: LeaseOptions,
        mut current: Option<(LeaseDoc, Version)>,
    ) -> Result<Option<Lease>> {
        for _ in 0..self.max_attempts() {
            let now = self.clock().now();
            if let Some((doc, _)) = &current {
                let held = doc.holder.is_some() && !doc.expired_at(now);
                let same_holder = records_holder(doc.holder.as_deref(), &opts.holder);
                if held && !same_holder {
                    return Ok(None);
                }
                if doc.holder.is_some() && !same_holder && !opts.steal_if_expired {
                    return Ok(None);
                }
            }
            let previous = current.as_ref().map(|(d, _)| &d.state);
            let state = match &opts.state_fn {
                Some(f) => f(previous).map_err(|source| Error::Aborted {
                    key: key.clone(),
                    source,
                })?,
                None => previous.cloned().unwrap_or(Value::Null),
            };
            let doc = LeaseDoc {
                deadline_at: deadline(self, opts.ttl)?,
                epoch: current
                    .as_ref()
                    .map_or(0, |(d, _)| d.epoch)
                    .checked_add(1)
                    .ok_or_else(|| Error::Corrupt {
                        key: key.clone(),
                        expected: "lease document".into(),
                        detail: "the epoch cannot grow any further".into(),
                    })?,
                holder: Some(holder_digest(&opts.holder)),
                state,
            };
            let body = encode(&key, &doc.to_json())?;
            let mode = match current {
                None => PutMode::IfAbsent,
                Some((_, version)) => PutMode::IfMatch(version),
            };
            match self.store().put(&key, body, mode).await? {
                PutOutcome::Written(version) => {
                    tracing::debug!(key, epoch = doc.epoch, "lease acquired");
                    return Ok(Some(Lease {
                        db: self.clone(),
                        key,
                        ttl: opts.ttl,
                        doc,
                        holder: opts.holder,
                        version,
                        released: false,
                    }));
                }
                PutOutcome::Conflict(now_stored) => current = parse_lease(&key, now_stored)?,
            }
        }
        Err(Error::Contention {
            key,
            attempts: self.max_attempts(),
        })
    }

    /// Re-enters an ownership period that is already `holder`'s: one read, no write, no epoch
    /// bump, no deadline change. Returns `None` when the lease is absent, released, held by
    /// someone else, or expired (resume an expired lease with [`Db::lease`], which fences).
    ///
    /// ```
    /// # tokio_test::block_on(async {
    /// use cojob::{Db, LeaseOptions};
    /// use std::time::Duration;
    /// let db = Db::open("memory://").await?;
    /// let (me, ttl) = (cojob::new_holder(), Duration::from_secs(30));
    /// let lease = db.lease("l", LeaseOptions::new(me.clone(), ttl)).await?.unwrap();
    /// let mut same = db.attach_lease("l", &me, ttl).await?.expect("mine");
    /// assert_eq!(same.epoch(), lease.epoch());
    /// same.renew().await?;
    /// assert!(db.attach_lease("l", "not-me", ttl).await?.is_none());
    /// # Ok::<(), cojob::Error>(()) });
    /// ```
    pub async fn attach_lease(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>> {
        let key = self.key(key)?;
        check_ttl(ttl)?;
        check_holder(holder)?;
        let current = parse_lease(&key, self.store().get_object(&key).await?)?;
        self.attach(key, holder, ttl, current)
    }

    /// Like [`attach_lease`](Self::attach_lease), but from `known`, the lease as the caller
    /// read it with [`inspect_lease`](Self::inspect_lease): no request at all. If `known` is
    /// stale, the handle's first write finds out (and reports [`Error::LeaseLost`] when the
    /// ownership period ended).
    pub fn attach_lease_from(
        &self,
        key: &str,
        known: &LeaseInfo,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>> {
        let key = self.key(key)?;
        check_ttl(ttl)?;
        check_holder(holder)?;
        self.attach(
            key,
            holder,
            ttl,
            Some((known.to_doc(), known.version.clone())),
        )
    }

    /// Resumes the ownership period `epoch` of `holder`: one read, no write. Unlike
    /// [`attach_lease`](Self::attach_lease) it ignores the deadline, because a reader whose clock
    /// runs ahead would otherwise see a fresh lease as expired; the handle's first write is a
    /// compare-and-swap, so it fails with [`Error::LeaseLost`] if anyone acquired the lease in
    /// between. Returns `None` when the lease is absent, released, at another epoch or held by
    /// someone else. A process given one epoch's credentials (a run's pod) thus never serves
    /// another epoch, even with the same holder.
    ///
    /// ```
    /// # tokio_test::block_on(async {
    /// use cojob::{Db, LeaseOptions};
    /// use std::time::Duration;
    /// let db = Db::open("memory://").await?;
    /// let ttl = Duration::from_secs(30);
    /// db.lease("l", LeaseOptions::new("w1", ttl)).await?.unwrap();
    /// assert!(db.resume_lease("l", "w1", 2, ttl).await?.is_none(), "not epoch 2");
    /// let mut mine = db.resume_lease("l", "w1", 1, ttl).await?.expect("epoch 1 is w1's");
    /// mine.renew().await?;
    /// # Ok::<(), cojob::Error>(()) });
    /// ```
    pub async fn resume_lease(
        &self,
        key: &str,
        holder: &str,
        epoch: u64,
        ttl: Duration,
    ) -> Result<Option<Lease>> {
        let key = self.key(key)?;
        check_ttl(ttl)?;
        check_holder(holder)?;
        let Some((doc, version)) = parse_lease(&key, self.store().get_object(&key).await?)? else {
            return Ok(None);
        };
        if doc.epoch != epoch || !records_holder(doc.holder.as_deref(), holder) {
            return Ok(None);
        }
        Ok(Some(self.handle(key, holder, ttl, doc, version)))
    }

    /// A handle on an ownership period the caller checked is `holder`'s.
    fn handle(
        &self,
        key: String,
        holder: &str,
        ttl: Duration,
        doc: LeaseDoc,
        version: Version,
    ) -> Lease {
        Lease {
            db: self.clone(),
            key,
            ttl,
            doc,
            holder: holder.to_string(),
            version,
            released: false,
        }
    }

    fn attach(
        &self,
        key: String,
        holder: &str,
        ttl: Duration,
        current: Option<(LeaseDoc, Version)>,
    ) -> Result<Option<Lease>> {
        let Some((doc, version)) = current else {
            return Ok(None);
        };
        if !records_holder(doc.holder.as_deref(), holder) || doc.expired_at(self.clock().now()) {
            return Ok(None);
        }
        Ok(Some(self.handle(key, holder, ttl, doc, version)))
    }

    /// Reads a lease without acquiring it: one read, no write. `None` when absent; a document
    /// that is not a lease is [`Error::Corrupt`].
    ///
    /// ```
    /// # tokio_test::block_on(async {
    /// use cojob::{Db, LeaseOptions};
    /// use std::time::Duration;
    /// let db = Db::open("memory://").await?;
    /// assert!(db.inspect_lease("l").await?.is_none());
    /// db.lease("l", LeaseOptions::new("w1", Duration::from_secs(30))).await?.unwrap();
    /// let info = db.inspect_lease("l").await?.expect("stored");
    /// assert_eq!(info.epoch, 1);
    /// assert!(info.is_held_by("w1") && !info.is_expired_at(db.clock().now()));
    /// assert!(!format!("{info:?}").contains("w1"));
    /// # Ok::<(), cojob::Error>(()) });
    /// ```
    pub async fn inspect_lease(&self, key: &str) -> Result<Option<LeaseInfo>> {
        let key = self.key(key)?;
        Ok(
            parse_lease(&key, self.store().get_object(&key).await?)?.map(|(doc, version)| {
                LeaseInfo {
                    epoch: doc.epoch,
                    holder: doc.holder,
                    deadline: doc.deadline_at,
                    state: doc.state,
                    version,
                }
            }),
        )
    }

    /// Changes a lease's `state` from outside the lease, without fencing its holder: epoch,
    /// holder and deadline are kept. The holder sees the new state on its next guarded write.
    /// Returns the state written. An absent lease is [`Error::NotFound`].
    ///
    /// ```
    /// # tokio_test::block_on(async {
    /// use cojob::{Db, LeaseOptions};
    /// use serde_json::json;
    /// use std::time::Duration;
    /// let db = Db::open("memory://").await?;
    /// let mut lease = db.lease("l", LeaseOptions::new("w1", Duration::from_secs(30))).await?.unwrap();
    /// db.cooperative_write("l", |s| {
    ///     let mut s = s.as_object().cloned().unwrap_or_default();
    ///     s.insert("cancel_requested".into(), json!(true));
    ///     serde_json::Value::Object(s)
    /// }).await?;
    /// lease.renew().await?; // absorbs the cooperative write
    /// assert_eq!(lease.state()["cancel_requested"], json!(true));
    /// # Ok::<(), cojob::Error>(()) });
    /// ```
    pub async fn cooperative_write<F>(&self, key: &str, mut f: F) -> Result<Value>
    where
        F: FnMut(&Value) -> Value,
    {
        let key = self.key(key)?;
        let mut current = parse_lease(&key, self.store().get_object(&key).await?)?;
        for attempt in 0..self.max_attempts() {
            if attempt > 0 {
                backoff(attempt).await;
            }
            let Some((mut doc, version)) = current else {
                return Err(Error::NotFound { key });
            };
            doc.state = f(&doc.state);
            let body = encode(&key, &doc.to_json())?;
            match self
                .store()
                .put(&key, body, PutMode::IfMatch(version))
                .await?
            {
                PutOutcome::Written(_) => return Ok(doc.state),
                PutOutcome::Conflict(now_stored) => current = parse_lease(&key, now_stored)?,
            }
        }
        Err(Error::Contention {
            key,
            attempts: self.max_attempts(),
        })
    }
}

/// Parses a stored object as a lease document with its version.
fn parse_lease(key: &str, object: Option<StoredObject>) -> Result<Option<(LeaseDoc, Version)>> {
    object
        .map(|o| Ok((LeaseDoc::parse(key, &o.body)?, o.version)))
        .transpose()
}

/// Merges `patch` into an object state (a convenience for cooperative writes and
/// `update_state`): non-object states are replaced by an object.
///
/// ```
/// use serde_json::json;
/// let s = cojob::lease::merge(&json!({"a": 1}), json!({"b": 2}));
/// assert_eq!(s, json!({"a": 1, "b": 2}));
/// ```
pub fn merge(state: &Value, patch: Value) -> Value {
    let mut out: Map<String, Value> = state.as_object().cloned().unwrap_or_default();
    if let Value::Object(p) = patch {
        out.extend(p);
    }
    Value::Object(out)
}
