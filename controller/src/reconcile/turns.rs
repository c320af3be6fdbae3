//! Passes take their turns in the order they came due.
//!
//! kube-runtime's runner can bound how many passes run at once, but at that bound it parks
//! every request that comes due in a hash set and starts the parked ones in the set's
//! iteration order, not in the order they came due. While requests keep coming as fast as
//! passes end, a request whose slot in that order is late waits for as long as the load lasts.
//! At N = 10 000 on simulated nodes (2026-12-07) the ticks of 1 344 jobs, due at 14:50:00,
//! waited up to ten minutes behind the pod cues of runs dispatched after them, and for 90
//! seconds no tick was decided at all while 255 passes a second ran.
//!
//! So the controller leaves the runner unbounded (it still runs one pass per job at a time)
//! and bounds the passes here: each pass waits for one of `--max-concurrent-reconciles`
//! turns of a semaphore that grants them first come, first served (tokio's [`Semaphore`] is
//! fair), so a pass waits for at most the passes that came due before it.

use tokio::sync::{Semaphore, SemaphorePermit};

/// The turns passes take, at most `limit` at once, granted in the order they were asked for.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use cojob_controller::reconcile::Turns;
/// let turns = Turns::new(16);
/// let turn = turns.take().await.expect("open");
/// drop(turn); // the pass ended: its turn goes to the pass that asked first
/// // Closed at shutdown: a pass still waiting for its turn does not run.
/// turns.close();
/// assert!(turns.take().await.is_none());
/// # });
/// ```
#[derive(Debug)]
pub struct Turns {
    semaphore: Semaphore,
}

impl Turns {
    /// At most `limit` passes at once; 0 means no bound, as for kube-runtime's runner.
    pub fn new(limit: u16) -> Self {
        let permits = match limit {
            0 => Semaphore::MAX_PERMITS,
            n => usize::from(n),
        };
        Self {
            semaphore: Semaphore::new(permits),
        }
    }

    /// Waits for a turn, after every pass that asked before; `None` once [`close`](Self::close)d.
    pub async fn take(&self) -> Option<SemaphorePermit<'_>> {
        self.semaphore.acquire().await.ok()
    }

    /// Ends every wait: passes that have not started yet do not run (at shutdown; the next
    /// controller passes over every job when it starts).
    pub fn close(&self) {
        self.semaphore.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[tokio::test]
    async fn turns_are_granted_in_the_order_they_were_asked_for() {
        let turns = Arc::new(Turns::new(2));
        let order = Arc::new(Mutex::new(Vec::new()));
        let held = (turns.take().await.unwrap(), turns.take().await.unwrap());
        let mut waiting = Vec::new();
        for pass in 0..20 {
            let (turns, order) = (turns.clone(), order.clone());
            waiting.push(tokio::spawn(async move {
                let _turn = turns.take().await.unwrap();
                order.lock().unwrap().push(pass);
                tokio::task::yield_now().await;
            }));
            // The test's runtime has one thread: the pass runs until it waits for its turn,
            // so each asks before the next is spawned.
            tokio::task::yield_now().await;
        }
        assert!(
            order.lock().unwrap().is_empty(),
            "no turn while both are held"
        );
        drop(held);
        for w in waiting {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), (0..20).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn no_bound_when_the_limit_is_zero() {
        let turns = Turns::new(0);
        let held: Vec<_> = (0..1000)
            .map(|_| turns.semaphore.try_acquire().unwrap())
            .collect();
        assert_eq!(held.len(), 1000);
    }

    #[tokio::test]
    async fn a_closed_gate_ends_every_wait() {
        let turns = Arc::new(Turns::new(1));
        let held = turns.take().await.unwrap();
        let waiter = {
            let turns = turns.clone();
            tokio::spawn(async move { turns.take().await.is_none() })
        };
        tokio::task::yield_now().await;
        turns.close();
        assert!(
            waiter.await.unwrap(),
            "a waiting pass is refused its turn once closed"
        );
        drop(held);
    }
}
