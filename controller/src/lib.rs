//! The cojob operator: the `CoordinatedJob` resource and the logic that turns its schedule into
//! exactly-once runs. The binary `cojob` (in `main.rs`) is its command line.
//!
//! Modules land one concept at a time: [`schedule`] (tick computation), [`crd`] (the
//! resource), [`pod`] (a run's pod) and [`sidecar`] (the lease keeper) today; reconcile and the
//! sweeper next.

pub mod crd;
pub mod pod;
pub mod schedule;
pub mod sidecar;
