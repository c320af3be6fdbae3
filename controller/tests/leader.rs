//! Leader election (`--leader-elect`) on the real S3 server (`COJOB_TEST_S3_URL`): replicas in
//! this process compete for the leader lease with short ttls. The work each one runs while it
//! leads counts how many run at once; a replica's work must be stopped before another's starts.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

mod support;

use cojob::Db;
use cojob_controller::leader::{Election, lead};
use cojob_controller::metrics::Metrics;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use support::{Budget, store_with_budget};

/// A fresh prefix of the test bucket.
fn bucket(test: &str) -> String {
    let s3 = std::env::var("COJOB_TEST_S3_URL").unwrap_or_else(|_| {
        panic!("COJOB_TEST_S3_URL is not set: run `ci/test-servers up` and source its env file")
    });
    let nanos = chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default();
    format!("{}/leader-{test}-{:x}", s3.trim_end_matches('/'), nanos)
}

/// A view of `bucket` whose requests fail while the returned budget is down.
fn open(bucket: &str) -> (Db, Budget) {
    let budget = Budget::unlimited();
    (Db::new(store_with_budget(bucket, &budget)), budget)
}

/// How many replicas' work runs at once, and the most that ever did.
#[derive(Default)]
struct Leaders {
    now: AtomicUsize,
    most: AtomicUsize,
}

struct Leading(Arc<Leaders>);

impl Drop for Leading {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One replica: its metrics, its shutdown switch and its task.
struct Replica {
    metrics: Arc<Metrics>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), std::io::Error>>,
    down: Budget,
}

fn replica(bucket: &str, name: &str, ttl: Duration, leaders: &Arc<Leaders>) -> Replica {
    let (db, down) = open(bucket);
    let metrics = Arc::new(Metrics::new(db.store().clone()));
    let (stop, stopped) = oneshot::channel::<()>();
    let mut election = Election::new(name);
    election.ttl = ttl;
    election.retry = Duration::from_millis(200);
    let (m, leaders) = (metrics.clone(), leaders.clone());
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        lead(&db, &election, &m, shutdown, || {
            let leaders = leaders.clone();
            async move {
                let n = leaders.now.fetch_add(1, Ordering::SeqCst) + 1;
                leaders.most.fetch_max(n, Ordering::SeqCst);
                let _leading = Leading(leaders);
                std::future::pending::<Result<(), std::io::Error>>().await
            }
        })
        .await
    });
    Replica {
        metrics,
        stop: Some(stop),
        task,
        down,
    }
}

async fn until(what: &str, limit: Duration, f: impl Fn() -> bool) -> Duration {
    let started = Instant::now();
    while !f() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

async fn leader_lease(bucket: &str) -> cojob::LeaseInfo {
    let (db, _) = open(bucket);
    db.inspect_lease(&cojob_controller::layout::leader())
        .await
        .unwrap()
        .expect("a leader lease")
}

/// Starts replica `a`, waits until it leads, then starts `b` and waits until it stands by.
async fn leader_and_standby(
    bucket: &str,
    ttl: Duration,
    leaders: &Arc<Leaders>,
) -> (Replica, Replica) {
    let a = replica(bucket, "a", ttl, leaders);
    until("a leads", Duration::from_secs(20), || a.metrics.is_leader()).await;
    let b = replica(bucket, "b", ttl, leaders);
    until("b is ready", Duration::from_secs(20), || {
        b.metrics.is_ready()
    })
    .await;
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_leads_and_a_crashed_leader_is_replaced_after_its_ttl() {
    let bucket = bucket("crash");
    let leaders = Arc::new(Leaders::default());
    let ttl = Duration::from_secs(3);
    let (a, b) = leader_and_standby(&bucket, ttl, &leaders).await;
    // Two ttls: a renews, so b stands by (and says it is ready to take over).
    tokio::time::sleep(ttl * 2).await;
    assert!(!b.metrics.is_leader());
    assert_eq!(leaders.now.load(Ordering::SeqCst), 1);
    let lease = leader_lease(&bucket).await;
    assert_eq!(lease.epoch, 1);
    assert_eq!(lease.state["instance"], "a");

    // a crashes: it neither renews nor releases. b takes over once the lease expires.
    a.task.abort();
    let _ = a.task.await;
    until("b leads", Duration::from_secs(30), || b.metrics.is_leader()).await;
    let lease = leader_lease(&bucket).await;
    assert_eq!(
        (lease.epoch, lease.state["instance"].as_str()),
        (2, Some("b"))
    );
    assert_eq!(leaders.most.load(Ordering::SeqCst), 1);

    // b shuts down: it releases the lease, and its work ends.
    let mut b = b;
    b.stop.take().unwrap().send(()).unwrap();
    b.task.await.unwrap().unwrap();
    assert!(leader_lease(&bucket).await.is_released());
    assert_eq!(leaders.now.load(Ordering::SeqCst), 0);
}

/// A replica that shuts down hands over at once: with a 60 s ttl, the standby leads long before
/// the lease could have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_shuts_down_hands_over_without_waiting_for_its_ttl() {
    let bucket = bucket("handover");
    let leaders = Arc::new(Leaders::default());
    let ttl = Duration::from_secs(60);
    let (mut a, b) = leader_and_standby(&bucket, ttl, &leaders).await;
    assert!(!b.metrics.is_leader());

    a.stop.take().unwrap().send(()).unwrap();
    a.task.await.unwrap().unwrap();
    until("b leads", Duration::from_secs(20), || b.metrics.is_leader()).await;
    assert_eq!(leader_lease(&bucket).await.state["instance"], "b");
    assert_eq!(leaders.most.load(Ordering::SeqCst), 1);
    b.task.abort();
}

/// A leader cut off from the bucket stops its work before its lease expires, so the replica
/// that takes over never runs beside it; once the bucket is back, the old leader stands by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_bucket_stops_before_another_takes_over() {
    let bucket = bucket("partition");
    let leaders = Arc::new(Leaders::default());
    let ttl = Duration::from_secs(3);
    let (a, b) = leader_and_standby(&bucket, ttl, &leaders).await;

    a.down.set_down(true);
    until("a stops leading", Duration::from_secs(20), || {
        !a.metrics.is_leader()
    })
    .await;
    until("b leads", Duration::from_secs(30), || b.metrics.is_leader()).await;
    assert_eq!(
        leaders.most.load(Ordering::SeqCst),
        1,
        "two leaders at once"
    );

    a.down.set_down(false);
    tokio::time::sleep(ttl * 2).await;
    assert!(!a.metrics.is_leader() && b.metrics.is_leader());
    assert_eq!(leaders.now.load(Ordering::SeqCst), 1);
    assert_eq!(leader_lease(&bucket).await.state["instance"], "b");
    a.task.abort();
    b.task.abort();
}
