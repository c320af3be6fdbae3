//! What a job costs between its runs, counted on the cluster.
//!
//! `k` CoordinatedJobs whose schedule fires once a year (`0 0 1 1 *`) are created in a fresh
//! namespace. Once each shows its first status (the pass that read its index and recorded the
//! schedule), the controller's counters are read, and again `minutes` later:
//!
//! - its passes (`cojob_reconcile_duration_seconds_count`), which come every 5 minutes for a
//!   job with nothing due, and of them those that left the bucket unread
//!   (`cojob_idle_passes_total`);
//! - its bucket requests, the clock checks of the window set apart (a write, a read and a
//!   delete every 5 minutes, whatever the jobs). Until commit 5ba674c every pass read its job's
//!   index, so the passes are also the reads the same window cost before;
//! - its CPU seconds.
//!
//! The jobs are the controller's only ones when this runs first, as `main` orders it.

use std::time::Duration;

use anyhow::ensure;
use kube::Client;
use kube::api::{ListParams, PostParams};
use serde_json::json;

use crate::cost::{Requests, parse_store_requests};

/// S3 Standard's price of a GET (us-east-1, per request).
const GET_PRICE: f64 = 0.0004 / 1000.0;
/// Hours in an average month.
const MONTH_HOURS: f64 = 730.0;
/// `--index-resync` as the chart sets it by default.
const INDEX_RESYNC_MINUTES: f64 = 60.0;
/// The longest pause between two passes of a job with nothing due.
const IDLE_RESYNC_MINUTES: f64 = 5.0;

/// The figures of one window.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Idle {
    /// Jobs measured.
    pub jobs: usize,
    /// The window, in minutes.
    pub minutes: f64,
    /// Passes of the controller in the window.
    pub passes: f64,
    /// Of them, passes that left the bucket unread.
    pub idle_passes: f64,
    /// The controller's bucket requests in the window, the clock checks left out.
    pub requests: Requests,
    /// The clock checks that fell in the window.
    pub clock_checks: f64,
    /// The controller's CPU seconds in the window.
    pub cpu_seconds: f64,
}

impl Idle {
    fn per_job_hour(&self, x: f64) -> f64 {
        x / self.jobs.max(1) as f64 / (self.minutes / 60.0)
    }

    /// True when every job had its timer passes and they read no more than the resync allows
    /// (one read per job per `--index-resync`), and wrote nothing.
    pub fn as_expected(&self) -> bool {
        let jobs = self.jobs as f64;
        let timer_passes = jobs * (self.minutes / IDLE_RESYNC_MINUTES).floor();
        let resync_reads = jobs * (self.minutes / INDEX_RESYNC_MINUTES).ceil();
        self.idle_passes >= timer_passes
            && self.requests.gets <= resync_reads
            && self.requests.puts == 0.0
    }
}

/// Measures `k` idle jobs for `minutes` in a fresh namespace.
pub async fn measure(
    client: &Client,
    metrics: &str,
    k: usize,
    minutes: f64,
) -> anyhow::Result<Idle> {
    let ns = cojob_e2e::TestNamespace::create(client, "bench-idle").await;
    let result = measure_in(client, metrics, &ns.name, k, minutes).await;
    let removed = crate::cluster::remove_namespace(client, ns, "idle jobs").await;
    let idle = result?;
    removed?;
    Ok(idle)
}

async fn measure_in(
    client: &Client,
    metrics: &str,
    ns: &str,
    k: usize,
    minutes: f64,
) -> anyhow::Result<Idle> {
    let jobs = cojob_e2e::coordinated_jobs(client, ns);
    println!("bench: {k} idle jobs in {ns} for {minutes} minutes");
    for i in 0..k {
        let job = cojob_e2e::coordinated_job(
            &format!("idle-{i}"),
            json!({
                "schedule": "0 0 1 1 *",
                "template": {"spec": crate::cluster::pod_spec(crate::Nodes::Real, &["true"])}
            }),
        );
        jobs.create(&PostParams::default(), &job).await?;
    }
    let t0 = tokio::time::Instant::now();
    loop {
        let list = jobs.list(&ListParams::default()).await?;
        let seen = list
            .items
            .iter()
            .filter(|j| {
                j.data["status"]["observedGeneration"].as_i64() == j.metadata.generation
                    && j.data["status"]["nextScheduleTime"].is_string()
            })
            .count();
        if seen == k {
            break;
        }
        ensure!(
            t0.elapsed() < Duration::from_secs(300),
            "{seen} of {k} idle jobs had their first pass within 300 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let before = Counters::read(metrics).await?;
    tokio::time::sleep(Duration::from_secs_f64(minutes * 60.0)).await;
    let after = Counters::read(metrics).await?;
    let clock_checks = after.clock_checks - before.clock_checks;
    let check = Requests {
        gets: clock_checks,
        puts: clock_checks,
        other: clock_checks,
    };
    let idle = Idle {
        jobs: k,
        minutes,
        passes: after.passes - before.passes,
        idle_passes: after.idle_passes - before.idle_passes,
        requests: after.requests.minus(before.requests).minus(check),
        clock_checks,
        cpu_seconds: after.cpu - before.cpu,
    };
    println!("bench: {idle:?}");
    Ok(idle)
}

/// The controller's counters at one moment.
struct Counters {
    passes: f64,
    idle_passes: f64,
    requests: Requests,
    clock_checks: f64,
    cpu: f64,
}

impl Counters {
    async fn read(metrics: &str) -> anyhow::Result<Counters> {
        let text = crate::scrape::scrape(metrics).await?;
        let (requests, clock_checks) = parse_store_requests(&text);
        Ok(Counters {
            passes: counter(&text, "cojob_reconcile_duration_seconds_count"),
            idle_passes: counter(&text, "cojob_idle_passes_total"),
            requests,
            clock_checks,
            cpu: crate::machine::process_cost(crate::machine::is_cojob_controller).0,
        })
    }
}

/// The value of the metric line `name` (no labels), or 0.
fn counter(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .find_map(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The windows as a Markdown table.
pub fn table(all: &[Idle]) -> String {
    let mut t = String::from(
        "| idle jobs | window (min) | passes per job-hour | of them leaving the bucket unread | bucket reads per job-hour (every pass read the index before 5ba674c) | writes | controller CPU ms per job-hour | reads' price per job-month | as expected |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for i in all {
        let reads = i.per_job_hour(i.requests.gets);
        t.push_str(&format!(
            "| {} | {:.0} | {:.1} | {:.0} % | {:.2} (before: {:.1}) | {:.0} | {:.1} | ${:.5} (before: ${:.5}) | {} |\n",
            i.jobs,
            i.minutes,
            i.per_job_hour(i.passes),
            100.0 * i.idle_passes / i.passes.max(1.0),
            reads,
            i.per_job_hour(i.passes),
            i.requests.puts,
            1000.0 * i.per_job_hour(i.cpu_seconds),
            reads * MONTH_HOURS * GET_PRICE,
            i.per_job_hour(i.passes) * MONTH_HOURS * GET_PRICE,
            if i.as_expected() { "yes" } else { "no" },
        ));
    }
    if all.iter().any(|i| i.minutes < INDEX_RESYNC_MINUTES) {
        t.push_str(&format!(
            "\nA window shorter than `--index-resync` ({INDEX_RESYNC_MINUTES:.0} minutes, the chart's \
             default) holds no resync: with it, a job with nothing due reads its index once an \
             hour and at each tick, about 750 reads and ${:.4} a month.\n",
            750.0 * GET_PRICE
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(idle_passes: f64, gets: f64, puts: f64) -> Idle {
        Idle {
            jobs: 10,
            minutes: 11.0,
            passes: idle_passes,
            idle_passes,
            requests: Requests {
                gets,
                puts,
                other: 0.0,
            },
            clock_checks: 2.0,
            cpu_seconds: 0.5,
        }
    }

    #[test]
    fn idle_jobs_pass_every_five_minutes_and_read_at_most_once_an_hour() {
        assert!(window(20.0, 0.0, 0.0).as_expected());
        assert!(window(22.0, 10.0, 0.0).as_expected(), "one resync each");
        assert!(!window(19.0, 0.0, 0.0).as_expected(), "a job missed a pass");
        assert!(!window(20.0, 11.0, 0.0).as_expected(), "a read too many");
        assert!(!window(20.0, 0.0, 1.0).as_expected(), "a write");
        let table = table(&[window(20.0, 0.0, 0.0)]);
        assert!(
            table.contains("| 10 | 11 | 10.9 | 100 % | 0.00 (before: 10.9) |"),
            "{table}"
        );
    }

    #[test]
    fn a_counter_is_read_by_its_whole_name() {
        let text = "cojob_idle_passes_total 7\ncojob_idle_passes_totally 9\n";
        assert_eq!(counter(text, "cojob_idle_passes_total"), 7.0);
        assert_eq!(counter(text, "cojob_missing"), 0.0);
    }
}
