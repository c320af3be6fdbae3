//! # cojob: exactly-once coordination over object storage
//!
//! cojob's coordination library turns an object-storage bucket (S3, GCS, Azure Blob, a local
//! directory, or memory) into three primitives, each a thin protocol over the bucket's
//! conditional writes (put-if-absent and compare-and-swap on an ETag):
//!
//! | primitive | guarantee |
//! |---|---|
//! | [`Db::claim`] | exactly one winner; losers converge on the winner's value |
//! | [`Db::lease`] | mutual exclusion while clock skew ≪ ttl; epoch + CAS fencing makes a paused holder's late writes fail |
//! | [`Db::doc`] | each `update` is an atomic read-modify-write on one key |
//!
//! Layer 0, [`store`], is the conditional object I/O underneath, with request counters.
//!
//! ## claim: a unique constraint
//!
//! ```
//! # tokio_test::block_on(async {
//! use cojob::Db;
//! use serde_json::json;
//!
//! let db = Db::open("memory://").await?;
//! let tick = "dispatch/daily-etl:2026-08-09";
//! let mine = db.claim(tick, &json!({"run_id": "r-1"})).await?;
//! let dup = db.claim(tick, &json!({"run_id": "r-2"})).await?;
//! assert!(mine.won);
//! assert!(!dup.won);
//! assert_eq!(dup.value, json!({"run_id": "r-1"})); // the loser converges on the winner
//! # Ok::<(), cojob::Error>(()) });
//! ```
//!
//! ## lease: expiring ownership with fencing
//!
//! ```
//! # tokio_test::block_on(async {
//! use cojob::{Db, Error, LeaseOptions, clock::FakeClock};
//! use serde_json::json;
//! use std::time::Duration;
//!
//! let clock = FakeClock::at_unix_micros(1_786_240_800_000_000);
//! let db = Db::open("memory://").await?.with_clock(clock.clone());
//! let ttl = Duration::from_secs(120);
//!
//! // Acquisition is a state transition; it refuses a run that already finished.
//! let opts = |holder: String| LeaseOptions::new(holder, ttl).state_fn(|s| {
//!     if s.is_some_and(|s| s["status"] == "completed") {
//!         return Err("already done".into());
//!     }
//!     Ok(json!({"status": "running"}))
//! });
//! let mut first = db.lease("state/etl/run-123", opts(cojob::new_holder())).await?.expect("free");
//! first.update_state(|s| cojob::lease::merge(s, json!({"progress": 0.5}))).await?;
//!
//! // The holder pauses past its ttl; a second worker steals the lease under epoch 2.
//! clock.advance(ttl);
//! let mut second = db.lease("state/etl/run-123", opts(cojob::new_holder())).await?.expect("expired");
//! assert_eq!((first.epoch(), second.epoch()), (1, 2));
//!
//! // The paused holder's next write is rejected by the bucket itself.
//! assert!(matches!(first.renew().await, Err(Error::LeaseLost { .. })));
//! second.release(Some(json!({"status": "completed"}))).await?;
//! assert!(matches!(
//!     db.lease("state/etl/run-123", opts(cojob::new_holder())).await,
//!     Err(Error::Aborted { .. })
//! ));
//! # Ok::<(), cojob::Error>(()) });
//! ```
//!
//! [`Db::cooperative_write`] changes a lease's state from outside (for example a cancel
//! request) and [`Db::attach_lease`] re-enters a period you already own; both have examples on
//! their own pages.
//!
//! ## doc: a typed read-modify-write
//!
//! ```
//! # tokio_test::block_on(async {
//! use serde::{Deserialize, Serialize};
//! #[derive(Serialize, Deserialize, Default)]
//! struct Queue { next: u64 }
//!
//! let db = cojob::Db::open("memory://").await?;
//! let queue = db.doc::<Queue>("queues/default");
//! let (q, _version) = queue.update(|mut q| { q.next += 1; q }, Some(Queue::default())).await?;
//! assert_eq!(q.next, 1);
//! # Ok::<(), cojob::Error>(()) });
//! ```
//!
//! ## Documents
//!
//! Documents are canonical JSON ([`json`]): sorted keys, no insignificant whitespace, UTF-8.
//! Timestamps are fixed-width RFC 3339 UTC with microseconds. A lease is exactly
//! `{"deadline_at":…,"epoch":…,"holder":…,"state":…}`, where `holder` is the holder's digest
//! ([`holder_digest`], `sha256:<hex>`) or `null` once released: a holder is a credential, so the
//! bucket never stores it. No document may exceed [`MAX_DOCUMENT_BYTES`].

#![warn(missing_docs)]

mod claim;
pub mod clock;
mod db;
mod doc;
pub mod error;
pub mod fence;
pub mod json;
pub mod lease;
pub mod store;
mod token;

pub use claim::{CLAIM_ATTEMPTS, Claim};
pub use db::{BACKOFF_BASE, BACKOFF_CAP, DEFAULT_MAX_ATTEMPTS, Db, MAX_DOCUMENT_BYTES};
pub use doc::Doc;
pub use error::{BoxError, Error, LostReason, Result, StoreError};
pub use lease::{Lease, LeaseInfo, LeaseOptions, StateFn};
pub use store::{ClockOffset, PutMode, PutOutcome, Store, Version};
pub use token::{holder_digest, new_holder};
