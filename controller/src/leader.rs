//! Optional leader election (`cojob controller --leader-elect`) on a lease in the bucket.
//!
//! Correctness never depends on it: every decision is a claim and every run a lease, so any
//! number of controllers may reconcile at once and each tick still runs once. What election
//! buys is less duplicate work: with it, one replica reconciles and the others stand by, each
//! asking for the lease every [`Election::retry`].
//!
//! The leader holds `v1/controller/leader` ([`crate::layout::leader`]) with a holder from the
//! CSPRNG and renews it every third of its ttl. It stops reconciling (the controller future is
//! dropped, as a crash would stop it) when a renewal finds the lease taken, or when it could not
//! renew before the deadline it last set. A replica that shuts down releases the lease, so a
//! standby takes over at its next try, not a ttl later. The bucket was chosen over a Kubernetes
//! Lease because it needs no RBAC beyond what the controller has, and lives where the decisions
//! it guards live.
//!
//! ```no_run
//! # async fn demo(db: cojob::Db, metrics: cojob_controller::metrics::Metrics) {
//! use cojob_controller::leader::{lead, Election};
//! let election = Election::new("cojob-controller-0");
//! let never = std::future::pending::<()>();
//! // Runs the closure's future only while this process leads; returns its result on shutdown.
//! let done: Result<(), std::io::Error> = lead(&db, &election, &metrics, never, || async {
//!     // reconcile …
//!     Ok(())
//! })
//! .await;
//! # }
//! ```

use std::future::Future;
use std::time::{Duration, Instant};

use cojob::{Db, Lease, LeaseOptions};
use serde_json::json;

use crate::metrics::Metrics;

/// The settings of an election.
#[derive(Debug, Clone)]
pub struct Election {
    /// How long one acquisition or renewal holds the lease: a crashed leader is replaced
    /// within about this long.
    pub ttl: Duration,
    /// How often a standby asks for the lease.
    pub retry: Duration,
    /// This replica's name (the pod name), recorded in the lease's state for people to read.
    pub instance: String,
}

impl Election {
    /// The defaults: a 15 s ttl (renewed every 5 s) and a try every 2 s, as client-go's
    /// leader election.
    pub fn new(instance: impl Into<String>) -> Election {
        Election {
            ttl: Duration::from_secs(15),
            retry: Duration::from_secs(2),
            instance: instance.into(),
        }
    }
}

/// Why a leader stopped leading.
enum Lost {
    /// A renewal found the lease taken (or released) by someone else.
    TakenOver,
    /// Renewals failed until the deadline this leader had set passed.
    NotRenewed,
}

/// Runs `work()` while this process holds the leader lease, and stands by otherwise, until
/// `shutdown` completes or the work ends. The work is started anew each time leadership is
/// won, and dropped when it is lost. On the way out the lease is released. Store errors while
/// standing by are logged and retried: a standby never gives up.
pub async fn lead<W, F, E>(
    db: &Db,
    election: &Election,
    metrics: &Metrics,
    shutdown: impl Future<Output = ()>,
    mut work: W,
) -> Result<(), E>
where
    W: FnMut() -> F,
    F: Future<Output = Result<(), E>>,
{
    let key = crate::layout::leader();
    let holder = cojob::new_holder();
    tokio::pin!(shutdown);
    let mut announced_standby = false;
    loop {
        metrics.set_leader(false);
        let mut lease = tokio::select! {
            () = &mut shutdown => return Ok(()),
            lease = acquire(db, &key, &holder, election, &mut announced_standby, metrics) => lease,
        };
        announced_standby = false;
        metrics.set_leader(true);
        tracing::info!(instance = %election.instance, epoch = lease.epoch(), "leading: this replica reconciles");
        let outcome = tokio::select! {
            () = &mut shutdown => None,
            result = work() => Some(result),
            lost = hold(&mut lease, election) => {
                let why = match lost {
                    Lost::TakenOver => "another replica took the lease",
                    Lost::NotRenewed => "the lease could not be renewed before its deadline",
                };
                tracing::warn!(instance = %election.instance, why, "lost leadership: reconciling stops until it is won again");
                continue;
            }
        };
        metrics.set_leader(false);
        if let Err(e) = lease.release(None).await {
            tracing::warn!(error = %e, "could not release the leader lease; a standby takes over once it expires");
        } else {
            tracing::info!("released the leader lease");
        }
        return outcome.unwrap_or(Ok(()));
    }
}

/// Asks for the lease every `retry` until it is won.
async fn acquire(
    db: &Db,
    key: &str,
    holder: &str,
    election: &Election,
    announced: &mut bool,
    metrics: &Metrics,
) -> Lease {
    let state = json!({"instance": election.instance});
    loop {
        let state = state.clone();
        let opts = LeaseOptions::new(holder, election.ttl).state_fn(move |_| Ok(state.clone()));
        match db.lease(key, opts).await {
            Ok(Some(lease)) => return lease,
            Ok(None) => {
                metrics.set_ready(true);
                if !*announced {
                    *announced = true;
                    let leader = db
                        .inspect_lease(key)
                        .await
                        .ok()
                        .flatten()
                        .and_then(|l| l.state["instance"].as_str().map(str::to_owned));
                    tracing::info!(
                        leader = leader.as_deref().unwrap_or("unknown"),
                        "standing by: another replica leads"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not ask for the leader lease; retrying"),
        }
        tokio::time::sleep(election.retry).await;
    }
}

/// Renews the lease every third of its ttl until it is lost. A failed renewal is retried every
/// `retry`; leadership ends once the deadline set by the last successful renewal (measured
/// from before its request was sent) is within a `retry` of passing.
async fn hold(lease: &mut Lease, election: &Election) -> Lost {
    let mut deadline = Instant::now() + election.ttl;
    let mut pause = election.ttl / 3;
    loop {
        tokio::time::sleep(pause).await;
        let sent = Instant::now();
        match lease.renew().await {
            Ok(()) => {
                deadline = sent + election.ttl;
                pause = election.ttl / 3;
            }
            Err(cojob::Error::LeaseLost { .. }) => return Lost::TakenOver,
            Err(e) => {
                tracing::warn!(error = %e, "could not renew the leader lease; retrying");
                pause = election.retry.min(election.ttl / 3);
            }
        }
        if Instant::now() + pause >= deadline {
            return Lost::NotRenewed;
        }
    }
}
