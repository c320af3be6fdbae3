//! The cojob operator: the `CoordinatedJob` resource and the logic that turns its schedule into
//! exactly-once runs. The binary `cojob` (in `main.rs`) is its command line.
//!
//! - [`crd`]: the resource; [`schedule`]: tick computation; [`layout`]: the bucket layout.
//! - [`run`]: a run's state machine (pure); [`index`]: a job's index document in the bucket.
//! - [`reconcile`]: ticks into claimed runs, status and Events; [`sweeper`]: drives each run
//!   (dispatch, complete, steal, fence, cancel); [`pod`]: a run's pod.
//! - [`sidecar`]: the lease keeper inside each pod; [`cli`]: the command line (the operator's
//!   commands, and `runs`, `why`, `trigger`, `cancel`, `suspend`, `resume` for people);
//!   [`context`]: what they share; [`leader`]: optional leader election.

pub mod announce;
pub mod api_time;
pub mod backfill;
pub mod cli;
pub mod context;
pub mod crd;
pub mod credentials;
pub mod cues;
pub mod fence;
pub mod index;
pub mod kube_requests;
pub mod layout;
pub mod leader;
pub mod metrics;
pub mod pod;
pub mod pod_cache;
pub mod reconcile;
pub mod retry;
pub mod run;
pub mod schedule;
pub mod sidecar;
pub mod skew;
pub mod sweeper;
pub mod template;
pub mod workload;
pub mod wrap;
