//! Race tests of a real server: its conditional writes must be atomic, or nothing built on it
//! holds. Shared by the S3 and Azure conformance suites.

use crate::common::{Kind, Rig};
use bytes::Bytes;
use cojob::{Db, PutMode, PutOutcome};
use std::sync::Arc;

const RACERS: usize = 32;
const TRIALS: usize = 5;

/// 32 racing put-if-absent creates of one fresh key give exactly one success, five times.
pub async fn racing_creates_have_one_winner(kind: Kind) {
    let rig = Rig::new(kind).await;
    for trial in 0..TRIALS {
        let key = format!("race/create-{trial}");
        let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
        let tasks: Vec<_> = (0..RACERS)
            .map(|i| {
                let (store, key, barrier) = (rig.raw.clone(), key.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store
                        .put(
                            &key,
                            Bytes::from(format!("{{\"racer\":{i}}}")),
                            PutMode::IfAbsent,
                        )
                        .await
                        .unwrap()
                })
            })
            .collect();
        let outcomes = futures::future::join_all(tasks).await;
        let winners = outcomes
            .into_iter()
            .filter(|o| matches!(o.as_ref().unwrap(), PutOutcome::Written(_)))
            .count();
        assert_eq!(
            winners, 1,
            "trial {trial}: {winners} of {RACERS} creates succeeded"
        );
    }
}

/// 16 racing compare-and-swaps on one version give exactly one success, five times.
pub async fn racing_swaps_have_one_winner(kind: Kind) {
    let rig = Rig::new(kind).await;
    for trial in 0..TRIALS {
        let key = format!("race/swap-{trial}");
        let PutOutcome::Written(v) = rig
            .raw
            .put(&key, "{}".into(), PutMode::IfAbsent)
            .await
            .unwrap()
        else {
            panic!("fresh key")
        };
        let barrier = Arc::new(tokio::sync::Barrier::new(RACERS / 2));
        let tasks: Vec<_> = (0..RACERS / 2)
            .map(|i| {
                let (store, key, barrier, v) =
                    (rig.raw.clone(), key.clone(), barrier.clone(), v.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store
                        .put(
                            &key,
                            Bytes::from(format!("{{\"racer\":{i}}}")),
                            PutMode::IfMatch(v),
                        )
                        .await
                        .unwrap()
                })
            })
            .collect();
        let winners = futures::future::join_all(tasks)
            .await
            .into_iter()
            .filter(|o| o.as_ref().unwrap().is_written())
            .count();
        assert_eq!(
            winners, 1,
            "trial {trial}: {winners} swaps on one version succeeded"
        );
    }
}

/// Concurrent claims and increments through the library against the server.
pub async fn library_under_contention(kind: Kind) {
    let rig = Rig::new(kind).await;
    let db: Db = rig.rival.clone();
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let db = db.clone();
            tokio::spawn(async move { db.claim("tick", &i).await.unwrap().won })
        })
        .collect();
    let wins = futures::future::join_all(tasks)
        .await
        .into_iter()
        .filter(|w| *w.as_ref().unwrap())
        .count();
    assert_eq!(wins, 1);
    crate::common::concurrent_increments(&db, 8, 10, 500).await;
}

/// Instantiates the server race tests for one kind.
#[macro_export]
macro_rules! server_races {
    ($kind:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn server_racing_creates_have_one_winner() {
            $crate::conformance::racing_creates_have_one_winner($kind).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn server_racing_swaps_have_one_winner() {
            $crate::conformance::racing_swaps_have_one_winner($kind).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn library_under_contention() {
            $crate::conformance::library_under_contention($kind).await;
        }
    };
}
