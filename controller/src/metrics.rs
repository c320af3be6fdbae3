//! Metrics, health and readiness, served on one port: `/metrics` (Prometheus text format),
//! `/healthz` (the process serves) and `/readyz` (it has listed CoordinatedJobs, so it
//! reconciles).
//!
//! Every count follows a fact that one controller owns: a tick decision counts where its
//! claim was won, a run's end where its outcome was recorded, a takeover where the new epoch
//! was acquired. So summing a metric over the replicas counts each fact once. Labels are
//! bounded: no run ids; `namespace` and `job` only on the per-job gauges, which alerting on a
//! job that stopped succeeding needs, and which are removed when the job goes.
//!
//! ```
//! use cojob_controller::metrics::{Metrics, RunOutcome};
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = cojob::Store::open("memory://").await.unwrap();
//! let metrics = Metrics::new(store);
//! metrics.run_ended(RunOutcome::Succeeded, "team-a", "nightly", 1_780_000_000.0);
//! let text = metrics.encode();
//! assert!(text.contains("cojob_runs_total{outcome=\"succeeded\"} 1"), "{text}");
//! assert!(text.contains("cojob_job_last_success_timestamp_seconds{namespace=\"team-a\",job=\"nightly\"} 1780000000"), "{text}");
//! # }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunOutcome {
    /// Its workload exited 0.
    Succeeded,
    /// Out of attempts.
    Failed,
    /// Cancelled (the job deleted, or `Replace`).
    Cancelled,
}

/// What was decided for a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecisionKind {
    /// It runs.
    Run,
    /// Skipped (`Forbid` with a run active, or suspended).
    Skipped,
    /// Missed (past its deadline, or beyond the catch-up limit).
    Missed,
}

/// Why a reconcile pass failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The bucket.
    Store,
    /// The Kubernetes API.
    Kubernetes,
    /// Anything else.
    Other,
}

/// Where the workload of an attempt whose lease was taken over stood: what tells a controller
/// that renewed too late (an attempt still pending, whose lease only the controller renews)
/// from a sidecar that went silent (a running one: its node, its network or the sidecar itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TakeoverOf {
    /// The workload had not started: the controller kept the lease, or the pod ran and its
    /// sidecar never attached.
    Pending,
    /// The workload had started, and its sidecar stopped renewing.
    Running,
}

/// Label values in lowercase, as Prometheus conventions have them.
macro_rules! label_values {
    ($($ty:ty { $($variant:ident => $text:literal),+ $(,)? })+) => {$(
        impl $ty {
            /// The label value.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }
        }
        impl EncodeLabelValue for $ty {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
                EncodeLabelValue::encode(&self.as_str(), encoder)
            }
        }
    )+};
}

label_values! {
    RunOutcome { Succeeded => "succeeded", Failed => "failed", Cancelled => "cancelled" }
    DecisionKind { Run => "run", Skipped => "skipped", Missed => "missed" }
    ErrorKind { Store => "store", Kubernetes => "kubernetes", Other => "other" }
    TakeoverOf { Pending => "pending", Running => "running" }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: RunOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabel {
    kind: DecisionKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StatusLabel {
    status: TakeoverOf,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ErrorLabel {
    error: ErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct JobLabels {
    namespace: String,
    job: String,
}

/// The controller's metrics. Cheap to share (`Arc`), safe from every task.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    runs: Family<OutcomeLabel, Counter>,
    decisions: Family<KindLabel, Counter>,
    takeovers: Family<StatusLabel, Counter>,
    respawns: Counter,
    dispatch_lag: Histogram,
    tick_pickup: Histogram,
    reconcile_duration: Histogram,
    reconcile_errors: Family<ErrorLabel, Counter>,
    idle_passes: Counter,
    job_active: Family<JobLabels, Gauge>,
    job_last_success: Family<JobLabels, Gauge<f64, AtomicU64>>,
    leader: Gauge,
    ready: AtomicBool,
    kube_requests: crate::kube_requests::KubeRequests,
}

/// The bucket's request counters, read from the store's own at each scrape.
#[derive(Debug)]
struct StoreRequests(cojob::Store);

impl Collector for StoreRequests {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = self.0.stats();
        let counter = ConstCounter::new(0u64);
        let mut metric = encoder.encode_descriptor(
            "cojob_store_requests",
            "Requests to the bucket, by operation and outcome",
            None,
            counter.metric_type(),
        )?;
        for op in cojob::error::Op::ALL {
            for outcome in cojob::store::Outcome::ALL {
                let labels = [("op", op.as_str()), ("outcome", outcome.as_str())];
                ConstCounter::new(stats.count(op, outcome))
                    .encode(metric.encode_family(&labels)?)?;
            }
        }
        let answering = self
            .0
            .health()
            .answering(crate::reconcile::STORE_ANSWERED_WITHIN);
        let gauge = ConstGauge::new(i64::from(answering));
        let metric = encoder.encode_descriptor(
            "cojob_store_answering",
            "1 when the bucket answered this controller in the last 6 minutes and no request \
             failed after that answer",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric)?;
        let mut metric = encoder.encode_descriptor(
            "cojob_store_request_duration",
            "Latency of requests to the bucket, by operation",
            Some(&prometheus_client::registry::Unit::Seconds),
            prometheus_client::metrics::MetricType::Histogram,
        )?;
        for op in cojob::error::Op::ALL {
            let latency = stats.latency(op);
            metric
                .encode_family(&[("op", op.as_str())])?
                .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    latency.sum.as_secs_f64(),
                    latency.count,
                    &latency.buckets,
                    None,
                )?;
        }
        Ok(())
    }
}

impl Metrics {
    /// The metrics, with the request counters of `store`.
    pub fn new(store: cojob::Store) -> Metrics {
        let mut m = Metrics {
            runs: Family::default(),
            decisions: Family::default(),
            takeovers: Family::default(),
            respawns: Counter::default(),
            // 10 ms .. ~10 min
            dispatch_lag: Histogram::new(exponential_buckets(0.01, 2.0, 17)),
            tick_pickup: Histogram::new(exponential_buckets(0.01, 2.0, 17)),
            // 1 ms .. ~30 s
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            reconcile_errors: Family::default(),
            idle_passes: Counter::default(),
            job_active: Family::default(),
            job_last_success: Family::default(),
            leader: Gauge::default(),
            ready: AtomicBool::new(false),
            kube_requests: Default::default(),
            registry: Registry::default(),
        };
        m.registry
            .register("cojob_runs", "Runs that ended, by outcome", m.runs.clone());
        m.registry.register(
            "cojob_decisions",
            "Tick decisions claimed, by kind",
            m.decisions.clone(),
        );
        m.registry.register(
            "cojob_takeovers",
            "Leases taken over after their holder went silent (a new epoch), by the run's status \
             when it was lost (pending: the workload had not started)",
            m.takeovers.clone(),
        );
        m.registry.register(
            "cojob_respawns",
            "Attempts started again under a new epoch (retries and takeovers)",
            m.respawns.clone(),
        );
        m.registry.register(
            "cojob_dispatch_lag_seconds",
            "From a tick's fire time to its run's pod being created (first attempt)",
            m.dispatch_lag.clone(),
        );
        m.registry.register(
            "cojob_tick_pickup_seconds",
            "From a tick's fire time to the start of the pass that decides it (the wait for a \
             worker in the reconcile queue, plus the requeue timer's own lateness)",
            m.tick_pickup.clone(),
        );
        m.registry.register(
            "cojob_reconcile_duration_seconds",
            "How long one reconcile pass of one CoordinatedJob took",
            m.reconcile_duration.clone(),
        );
        m.registry.register(
            "cojob_reconcile_errors",
            "Reconcile passes that failed, by cause",
            m.reconcile_errors.clone(),
        );
        m.registry.register(
            "cojob_idle_passes",
            "Passes of a CoordinatedJob with no active run and nothing due that left the bucket \
             unread (--index-resync)",
            m.idle_passes.clone(),
        );
        m.registry.register(
            "cojob_job_active_runs",
            "Active runs of a CoordinatedJob",
            m.job_active.clone(),
        );
        m.registry.register(
            "cojob_job_last_success_timestamp_seconds",
            "When a run of a CoordinatedJob last succeeded (recorded by this replica), in Unix seconds",
            m.job_last_success.clone(),
        );
        m.registry.register(
            "cojob_leader",
            "1 while this replica reconciles: it holds the leader lease, or runs without --leader-elect",
            m.leader.clone(),
        );
        m.registry
            .register_collector(Box::new(StoreRequests(store)));
        m.registry
            .register_collector(Box::new(m.kube_requests.clone()));
        m
    }

    /// The counter of this process's requests to the API server (`cojob_kube_requests_total`):
    /// build the client with its [`layer`](crate::kube_requests::KubeRequests::layer).
    pub fn kube_requests(&self) -> &crate::kube_requests::KubeRequests {
        &self.kube_requests
    }

    /// A run's end was recorded by this controller, at `now` (Unix seconds).
    pub fn run_ended(&self, outcome: RunOutcome, namespace: &str, job: &str, now: f64) {
        self.runs.get_or_create(&OutcomeLabel { outcome }).inc();
        if outcome == RunOutcome::Succeeded {
            self.job_last_success
                .get_or_create(&job_labels(namespace, job))
                .set(now);
        }
    }

    /// This controller won a tick's claim with `kind`.
    pub fn decided(&self, kind: DecisionKind) {
        self.decisions.get_or_create(&KindLabel { kind }).inc();
    }

    /// This controller took a silent lease over, from an attempt in `status`.
    pub fn took_over(&self, status: TakeoverOf) {
        self.takeovers.get_or_create(&StatusLabel { status }).inc();
    }

    /// This controller started an attempt again under a new epoch.
    pub fn respawned(&self) {
        self.respawns.inc();
    }

    /// A first attempt's pod was created `lag` after its tick.
    pub fn dispatched(&self, lag: Duration) {
        self.dispatch_lag.observe(lag.as_secs_f64());
    }

    /// A pass that started `lag` after the oldest tick it decides (the reconcile queue's
    /// latency for scheduled work).
    pub fn tick_picked_up(&self, lag: Duration) {
        self.tick_pickup.observe(lag.as_secs_f64());
    }

    /// A pass of an idle job left the bucket unread.
    pub fn idle_pass(&self) {
        self.idle_passes.inc();
    }

    /// A reconcile pass took `took`, and failed with `error` if any.
    pub fn reconciled(&self, took: Duration, error: Option<ErrorKind>) {
        self.reconcile_duration.observe(took.as_secs_f64());
        if let Some(error) = error {
            self.reconcile_errors
                .get_or_create(&ErrorLabel { error })
                .inc();
        }
    }

    /// The job has `active` active runs.
    pub fn job_active(&self, namespace: &str, job: &str, active: usize) {
        self.job_active
            .get_or_create(&job_labels(namespace, job))
            .set(i64::try_from(active).unwrap_or(i64::MAX));
    }

    /// The job is gone: its series go too.
    pub fn job_gone(&self, namespace: &str, job: &str) {
        let labels = job_labels(namespace, job);
        self.job_active.remove(&labels);
        self.job_last_success.remove(&labels);
    }

    /// Marks this replica as the one that reconciles, or as a standby.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// True while this replica reconciles (see [`set_leader`](Self::set_leader)).
    pub fn is_leader(&self) -> bool {
        self.leader.get() == 1
    }

    /// Marks the controller ready (it listed CoordinatedJobs) or not.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// True once ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Every metric, in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "could not encode the metrics");
        }
        out
    }
}

fn job_labels(namespace: &str, job: &str) -> JobLabels {
    JobLabels {
        namespace: namespace.into(),
        job: job.into(),
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until the process ends. Returns the
/// address bound (port 0 picks a free port, which is logged).
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tracing::info!(addr = %bound, "serving /metrics, /healthz and /readyz");
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let metrics = metrics.clone();
                    async move { Ok::<_, std::convert::Infallible>(respond(&req, &metrics)) }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await
                {
                    tracing::debug!(error = %e, "metrics connection ended");
                }
            });
        }
    });
    Ok(bound)
}

fn respond<B>(req: &Request<B>, metrics: &Metrics) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match req.uri().path() {
        "/metrics" => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" if metrics.is_ready() => (StatusCode::OK, "text/plain", "ready\n".into()),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready: CoordinatedJobs not listed yet\n".into(),
        ),
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = hyper::header::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.unwrap();
        let status = reply
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap();
        let body = reply.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
        (status, body.unwrap_or_default())
    }

    #[tokio::test]
    async fn serves_health_readiness_and_the_store_counters() {
        let store = cojob::Store::open("memory://").await.unwrap();
        store
            .put("k", "v".into(), cojob::PutMode::IfAbsent)
            .await
            .unwrap();
        let metrics = Arc::new(Metrics::new(store));
        let addr = serve("127.0.0.1:0".parse().unwrap(), metrics.clone())
            .await
            .unwrap();
        assert_eq!(get(addr, "/healthz").await.0, 200);
        assert_eq!(get(addr, "/readyz").await.0, 503);
        metrics.set_ready(true);
        assert_eq!(get(addr, "/readyz").await.0, 200);
        assert_eq!(get(addr, "/nope").await.0, 404);
        metrics.decided(DecisionKind::Skipped);
        metrics.reconciled(Duration::from_millis(3), Some(ErrorKind::Store));
        metrics.job_active("ns", "j", 2);
        let (status, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        for series in [
            "cojob_store_requests_total{op=\"put_if_absent\",outcome=\"ok\"} 1",
            "cojob_store_request_duration_seconds_count{op=\"put_if_absent\"} 1",
            "cojob_store_request_duration_seconds_bucket{le=\"+Inf\",op=\"put_if_absent\"} 1",
            "cojob_decisions_total{kind=\"skipped\"} 1",
            "cojob_reconcile_errors_total{error=\"store\"} 1",
            "cojob_reconcile_duration_seconds_count 1",
            "cojob_job_active_runs{namespace=\"ns\",job=\"j\"} 2",
        ] {
            assert!(body.contains(series), "{series} in\n{body}");
        }
        metrics.job_gone("ns", "j");
        assert!(!metrics.encode().contains("namespace=\"ns\""));
    }
}
