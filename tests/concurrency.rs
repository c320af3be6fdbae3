//! Real concurrency on the memory and file stores: tasks racing on one key, and several
//! processes racing on one directory.
mod common;

use cojob::clock::FakeClock;
use cojob::store::{DirBackend, ObjectStoreBackend};
use cojob::{Db, Error, LeaseOptions, LostReason, Store};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

const CLAIMERS: usize = 32;
const WRITERS: u64 = 16;
const INCREMENTS: u64 = 50;

async fn stores() -> Vec<(&'static str, Store, Option<tempfile::TempDir>)> {
    let memory = Store::new(
        ObjectStoreBackend::new(Arc::new(object_store::memory::InMemory::new())),
        "",
    );
    let dir = tempfile::tempdir().unwrap();
    let file = Store::new(DirBackend::open(dir.path()).await.unwrap(), "");
    vec![("memory", memory, None), ("file", file, Some(dir))]
}

async fn claim_race(db: Db) {
    for round in 0..5 {
        let key = format!("race/{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(CLAIMERS));
        let tasks: Vec<_> = (0..CLAIMERS)
            .map(|i| {
                let (db, key, barrier) = (db.clone(), key.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    db.claim(&key, &json!({"by": i})).await.unwrap()
                })
            })
            .collect();
        let claims: Vec<_> = futures::future::join_all(tasks)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let winners: Vec<_> = claims.iter().filter(|c| c.won).collect();
        assert_eq!(winners.len(), 1, "exactly one of {CLAIMERS} claims wins");
        let value = &winners[0].value;
        assert!(claims.iter().all(|c| &c.value == value), "losers converge");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_claimers_one_winner() {
    for (name, store, _dir) in stores().await {
        eprintln!("{name}");
        claim_race(Db::new(store)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_writers_exact_total() {
    for (name, store, _dir) in stores().await {
        eprintln!("{name}");
        common::concurrent_increments(&Db::new(store), WRITERS, INCREMENTS, 1000).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_holder_is_fenced_while_others_race() {
    for (name, store, _dir) in stores().await {
        eprintln!("{name}");
        let clock = FakeClock::at_unix_micros(1_786_240_800_000_000);
        let db = Db::new(store).with_clock(clock.clone());
        let ttl = Duration::from_secs(30);
        let mut paused = db
            .lease("l", LeaseOptions::new(cojob::new_holder(), ttl))
            .await
            .unwrap()
            .unwrap();
        clock.advance(ttl + Duration::from_secs(1));
        // Eight workers race to steal; exactly one gets epoch 2.
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let db = db.clone();
                tokio::spawn(async move {
                    db.lease("l", LeaseOptions::new(cojob::new_holder(), ttl))
                        .await
                        .unwrap()
                })
            })
            .collect();
        let stolen: Vec<_> = futures::future::join_all(tasks)
            .await
            .into_iter()
            .filter_map(|r| r.unwrap())
            .collect();
        assert_eq!(stolen.len(), 1, "one thief wins");
        assert_eq!(stolen[0].epoch(), 2);
        let err = paused.update_state(|_| json!("late")).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::LeaseLost {
                    reason: LostReason::EpochAdvanced { .. },
                    ..
                }
            ),
            "{err}"
        );
    }
}

// ------------------------------------------------------------ several processes

const CHILD_ENV: &str = "COJOB_TEST_CHILD_DIR";
const PROCESSES: usize = 4;
const KEYS: usize = 20;
const CHILD_INCREMENTS: u64 = 25;

/// The body of one child process (run by `file_store_raced_from_several_processes`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run as a child process by file_store_raced_from_several_processes"]
async fn child_process_worker() {
    let dir = std::env::var(CHILD_ENV).expect("child needs its directory");
    let db = Db::open(&format!("file://{dir}")).await.unwrap();
    let me = std::process::id();
    let doc = db.doc::<u64>("counter").max_attempts(10_000);
    let mut won = Vec::new();
    for k in 0..KEYS {
        let c = db
            .claim(&format!("ticks/{k}"), &json!({"pid": me}))
            .await
            .unwrap();
        if c.won {
            won.push(format!("ticks/{k}"));
        }
        // Interleave increments with the claims, so the processes race on both.
        if (k as u64) < CHILD_INCREMENTS {
            doc.update(|n| n + 1, Some(0)).await.unwrap();
        }
    }
    for _ in KEYS as u64..CHILD_INCREMENTS {
        doc.update(|n| n + 1, Some(0)).await.unwrap();
    }
    let report = std::path::Path::new(&dir).join(format!("wins-{me}.txt"));
    std::fs::write(report, won.join("\n")).unwrap();
}

#[test]
fn file_store_raced_from_several_processes() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "child_process_worker",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, dir.path())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "a child failed: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.contains("1 passed"),
            "the child ran its worker: {text}"
        );
    }
    let mut wins = Vec::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("wins-") {
            let text = std::fs::read_to_string(&path).unwrap();
            wins.extend(text.lines().filter(|l| !l.is_empty()).map(str::to_string));
            std::fs::remove_file(path).unwrap();
        }
    }
    wins.sort();
    let mut expected: Vec<String> = (0..KEYS).map(|k| format!("ticks/{k}")).collect();
    expected.sort();
    assert_eq!(
        wins, expected,
        "each key won exactly once across {PROCESSES} processes"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let total = rt.block_on(async {
        let db = Db::open(&format!("file://{}", dir.path().display()))
            .await
            .unwrap();
        db.doc::<u64>("counter").get().await.unwrap().unwrap().0
    });
    assert_eq!(total, PROCESSES as u64 * CHILD_INCREMENTS);
}
