//! Punctuality and cost, side by side with CronJob, on the real cluster (`e2e/bench/run`).
//!
//! ```text
//! cojob-bench [--n 10,100] [--ticks 3] [--every 1] [--kwok 1000,10000] [--kwok-every 10,60]
//!             [--kwok-ticks 5] [--no-kwok-sidecars] [--recovery K] [--recovery-ttl 12,30]
//!             [--cost K] [--cost-seconds 1,300] [--cost-ttl 30] [--idle K] [--idle-minutes 11]
//!             [--history K] [--history-runs 4]
//!             [--metrics 127.0.0.1:18080] [--json OUT] [--merge EARLIER.json] [--check]
//!             [--docs FILE --command LINE]
//! ```
//!
//! For each size N: a fresh namespace with N CronJobs and N CoordinatedJobs on the same
//! schedule (`*/every * * * *`, or `0 * * * *` hourly), with the same pod (busybox `true`,
//! host network). `--every`, `--ticks`, `--kwok-every` and `--kwok-ticks` take one value for
//! all their sizes or one per size. Sizes of `--n` run on the real node; sizes of `--kwok` on
//! the simulated nodes of `e2e/bench/kwok` (nothing runs there: a pod is Running when bound
//! and Succeeded 2 to 5 s later; the bench plays each run pod's sidecar against the bucket,
//! module `sidecars`, unless `--no-kwok-sidecars`). A watch of the namespace's pods records
//! each pod of both kinds as it is created and runs (module `ledger`); after the ticks, the
//! window's pods are read from it:
//!
//! - **dispatch lag**: the pod's creation minus the tick it serves (for CronJob, the tick its
//!   Job is named after, `<cronjob>-<minutes since the epoch>`; for cojob, `COJOB_FIRE_TIME`);
//! - **start lag**: the workload container's start minus the tick (real node only);
//! - **duplicates**: more than one Job (CronJob) or run (cojob) for one tick of one object;
//! - **misses**: ticks of the window without a Job (CronJob) or a run (cojob), read once every
//!   object of both kinds has decided the last tick (`status.lastScheduleTime`, waited for up
//!   to 2 minutes), so a late decision counts as lag, not as a miss; each miss is printed.
//!   A decided tick whose pod does not exist yet at the end is counted apart.
//!
//! Timestamps are the API server's, whole seconds. CPU time and resident memory come from
//! `/proc` (the cluster runs on this machine): the cojob controller's, kube-controller-manager's
//! (CronJob's and every other built-in controller), and what both share (API server, etcd,
//! scheduler, kwok). The controller's bucket requests and its tick pickup latency (the
//! reconcile queue's) come from its `/metrics` (`--metrics`), the API server requests of each
//! controller from the API server's own `/metrics` (dispatched requests by flow schema).
//! `--recovery K` then times K recoveries after a pod is deleted and K after a sidecar froze, at each ttl of
//! `--recovery-ttl` (module `recovery`), and `--cost K` counts the bucket requests of K one-shot
//! runs at each workload duration of `--cost-seconds`, the controller's and the sidecars', against
//! the formula (module `cost`), `--idle K` counts what K jobs with nothing due cost (module
//! `idle`), and `--history K` measures the controller's memory with K jobs' history of
//! `--history-runs` runs each cached (module `history`). `--json` writes the figures, `--docs` the tables and
//! the plots (module `plots`); `--merge` adds the sizes of an earlier `--json` report that
//! this run did not measure (each size's table row says when it was measured); `--check`
//! fails on any duplicate or miss, a run that does not recover, a run whose bucket
//! requests fall outside the formula, an idle job that reads the bucket between its resyncs,
//! or a history not whole or over the chart's memory limit (CI's small run).
//!
//! Layout: `size` measures one size over its window (`ticks` picks the window, `figures` reads
//! the pods back, `scrape` the `/metrics` texts, `machine` the processes' CPU and memory),
//! `cluster` holds what every measurement creates and removes, `sidecars` plays the sidecars
//! of the pods on simulated nodes, `report` the tables, the
//! document and the merge; `recovery`, `cost`, `idle` and `history` are the other
//! measurements, `plots` draws the figures against N.

use anyhow::{Context, ensure};

mod cluster;
mod cost;
mod figures;
mod history;
mod idle;
mod ledger;
mod machine;
mod plots;
mod recovery;
mod report;
mod scrape;
mod sidecars;
mod size;
mod ticks;

use report::{Report, all_tables, merge, plot_point, write_docs};
use size::{Size, run_size};

/// Punctuality and cost side by side with CronJob, on the local cluster (see the module
/// documentation; `e2e/bench/run` calls it).
#[derive(clap::Parser, Debug)]
#[command(name = "cojob-bench")]
struct Options {
    /// Sizes on the real node, comma-separated (`''` for none).
    #[arg(long = "n", value_name = "N,N", default_value = "10", value_parser = sizes)]
    sizes: Sizes,
    /// Sizes on the simulated nodes of `e2e/bench/kwok`, comma-separated.
    #[arg(long = "kwok", value_name = "N,N", default_value = "", value_parser = sizes)]
    kwok_sizes: Sizes,
    /// Ticks measured on the real node (both kinds keep 10 finished runs, so at most 10): one
    /// count for every size of `--n`, or one per size, comma-separated.
    #[arg(
        long,
        value_name = "K,K",
        value_delimiter = ',',
        default_value = "3",
        value_parser = clap::value_parser!(u32).range(1..=10)
    )]
    ticks: Vec<u32>,
    /// Minutes between ticks (`*/every * * * *`; 60: on the hour) on the real node: one period
    /// for every size of `--n`, or one per size, comma-separated.
    #[arg(
        long,
        value_name = "MINUTES,MINUTES",
        value_delimiter = ',',
        default_value = "1",
        value_parser = divides_hour
    )]
    every: Vec<u32>,
    /// Minutes between ticks on the simulated nodes: one period for every size of `--kwok`, or
    /// one per size, comma-separated (`--kwok 1000,10000 --kwok-every 10,60`). They end about
    /// 7.5 pods a second on 2 cores, so a tick of N jobs of both kinds takes N / 3.75 s to play
    /// out: at N = 10 000 only hourly ticks (60) leave none of a tick's runs active at the next.
    #[arg(
        long,
        value_name = "MINUTES,MINUTES",
        value_delimiter = ',',
        default_value = "5",
        value_parser = divides_hour
    )]
    kwok_every: Vec<u32>,
    /// The CoordinatedJobs' `prestartSeconds`: each tick's run is decided and its pod created
    /// this long before the tick, and its workload still starts at the tick (0: at the tick).
    #[arg(long, value_name = "SECONDS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=600))]
    prestart: u64,
    /// The CoordinatedJobs' `startTimeoutSeconds` (default: the CRD's, 600). A Job's pod has
    /// no start timeout, so a size whose nodes start pods later than that (kwok's backlog at
    /// thousands of pods a tick) compares like with like only with a longer one.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    start_timeout: Option<u64>,
    /// Leaves the run pods on the simulated nodes without simulated sidecars (module
    /// `sidecars`), as the bench did before them: nothing renews their leases, so the
    /// controller passes each Running pod once per ttl and takes it over once its pending
    /// lease expires.
    #[arg(long)]
    no_kwok_sidecars: bool,
    /// Ticks measured on the simulated nodes (at most 10): one count for every size of
    /// `--kwok`, or one per size, comma-separated.
    #[arg(
        long,
        value_name = "K,K",
        value_delimiter = ',',
        default_value = "5",
        value_parser = clap::value_parser!(u32).range(1..=10)
    )]
    kwok_ticks: Vec<u32>,
    /// Recoveries to measure for each fault at each lease ttl of `--recovery-ttl`.
    #[arg(long = "recovery", value_name = "K", default_value_t = 0)]
    recoveries: usize,
    /// Lease ttls (seconds) of the recovery measurement, comma-separated.
    #[arg(
        long = "recovery-ttl",
        value_name = "SECONDS,SECONDS",
        value_delimiter = ',',
        default_value = "12,30",
        value_parser = clap::value_parser!(i64).range(6..=300)
    )]
    recovery_ttls: Vec<i64>,
    /// One-shot runs to count the bucket requests of, at each workload duration of
    /// `--cost-seconds` (module `cost`).
    #[arg(long = "cost", value_name = "K", default_value_t = 0)]
    costs: usize,
    /// Workload durations (seconds of `sleep`) whose cost in bucket requests is counted,
    /// comma-separated.
    #[arg(
        long = "cost-seconds",
        value_name = "SECONDS,SECONDS",
        value_delimiter = ',',
        default_value = "1,300",
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    cost_seconds: Vec<u64>,
    /// The lease ttl (seconds) of the runs whose cost is counted.
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(6..=300))]
    cost_ttl: u64,
    /// CoordinatedJobs with nothing due whose passes and bucket requests are counted over
    /// `--idle-minutes` (module `idle`); measured first, on an otherwise idle controller.
    #[arg(long = "idle", value_name = "K", default_value_t = 0)]
    idle_jobs: usize,
    /// The window of the idle jobs' count, in minutes (at least 5: a job with nothing due
    /// passes every 5 minutes).
    #[arg(long, value_name = "MINUTES", default_value_t = 11.0, value_parser = at_least_five)]
    idle_minutes: f64,
    /// CoordinatedJobs on the simulated nodes given `--history-runs` runs each, to measure the
    /// controller's memory with that history cached (module `history`).
    #[arg(long = "history", value_name = "K", default_value_t = 0)]
    history_jobs: usize,
    /// Runs given to, and kept by, each job of `--history` (the chart's default history is 4
    /// runs: 3 succeeded and 1 failed).
    #[arg(long, value_name = "R", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=20))]
    history_runs: u64,
    /// The cojob controller's metrics endpoint.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:18080")]
    metrics: String,
    /// Writes the figures as JSON.
    #[arg(long, value_name = "OUT")]
    json: Option<String>,
    /// An earlier `--json` report whose other sizes join this run's tables.
    #[arg(long, value_name = "EARLIER.json")]
    merge: Option<String>,
    /// Fails on any duplicate, miss or run that does not recover (CI's small run).
    #[arg(long)]
    check: bool,
    /// Writes the tables into this Markdown file (between its cojob-bench markers) and the
    /// plots into `bench/` beside it.
    #[arg(long, value_name = "FILE")]
    docs: Option<String>,
    /// The command line the docs name as the one that measured the figures.
    #[arg(long, value_name = "LINE", default_value = "cojob-bench")]
    command: String,
}

/// A comma-separated list of sizes.
#[derive(Debug, Clone, Default)]
struct Sizes(Vec<usize>);

impl std::ops::Deref for Sizes {
    type Target = Vec<usize>;
    fn deref(&self) -> &Vec<usize> {
        &self.0
    }
}

/// Parses `10,100` (or `''`, no size); each size within 1..=10 000.
fn sizes(v: &str) -> Result<Sizes, String> {
    v.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| match n.parse::<usize>() {
            Ok(n) if (1..=10_000).contains(&n) => Ok(n),
            _ => Err(format!("{n:?} is not a size within 1..=10000")),
        })
        .collect::<Result<_, _>>()
        .map(Sizes)
}

/// Parses a tick period in minutes that divides an hour, so `*/every` ticks evenly (60: on
/// the hour).
fn divides_hour(v: &str) -> Result<u32, String> {
    match v.parse::<u32>() {
        Ok(m) if (1..=60).contains(&m) && 60 % m == 0 => Ok(m),
        _ => Err(format!(
            "{v:?} does not divide an hour (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30 or 60 minutes)"
        )),
    }
}

impl Options {
    /// Every size to measure, the real node's first, each with its tick period and count.
    fn sizes_to_measure(&self) -> anyhow::Result<Vec<Size>> {
        let mut all = sizes_to_measure(
            &self.sizes,
            Nodes::Real,
            ("--every", &self.every),
            ("--ticks", &self.ticks),
        )?;
        all.extend(sizes_to_measure(
            &self.kwok_sizes,
            Nodes::Kwok,
            ("--kwok-every", &self.kwok_every),
            ("--kwok-ticks", &self.kwok_ticks),
        )?);
        Ok(all)
    }
}

/// The sizes of one kind of node, each with its tick period and count: `every` and `ticks`
/// (each named by its option, for the error) hold one value for every size or one per size.
fn sizes_to_measure(
    sizes: &[usize],
    nodes: Nodes,
    (every_option, every): (&str, &[u32]),
    (ticks_option, ticks): (&str, &[u32]),
) -> anyhow::Result<Vec<Size>> {
    let every = per_size(every_option, every, sizes)?;
    let ticks = per_size(ticks_option, ticks, sizes)?;
    Ok(sizes
        .iter()
        .zip(every.zip(ticks))
        .map(|(&n, (every, ticks))| Size {
            n,
            nodes,
            every,
            ticks,
        })
        .collect())
}

/// One value of `option` for each of `sizes`: its only value repeated, or its values in the
/// sizes' order; any other count is an error that names the option.
fn per_size<'a>(
    option: &str,
    values: &'a [u32],
    sizes: &[usize],
) -> anyhow::Result<impl Iterator<Item = u32> + 'a> {
    ensure!(
        values.len() == 1 || values.len() == sizes.len(),
        "{option} gives {} values ({}) for {} sizes ({}): give one for all, or one per size",
        values.len(),
        join(values),
        sizes.len(),
        join(sizes)
    );
    // One value cycles over every size; one per size is taken once, in order.
    Ok(values.iter().copied().cycle().take(sizes.len()))
}

fn join<T: ToString>(values: &[T]) -> String {
    values
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn at_least_five(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(m) if (5.0..=120.0).contains(&m) => Ok(m),
        _ => Err(format!(
            "{v:?}: the idle window is 5 to 120 minutes (a job with nothing due passes every 5)"
        )),
    }
}

/// Where the benchmark's pods run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum Nodes {
    /// The cluster's one real kubelet: start lag is real.
    Real,
    /// The simulated nodes of `e2e/bench/kwok` (label `type=kwok`): nothing runs, a pod is
    /// Running as soon as it is bound and Succeeded 2 to 5 s later, so dispatch lag and the
    /// controllers' cost are real, start lag is the scheduler's and kwok's.
    Kwok,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = <Options as clap::Parser>::parse();
    let client = cojob_e2e::client().await;
    let mut report = Report::default();
    let sizes = o.sizes_to_measure()?;
    // Idle jobs first, while they are the controller's only ones.
    if o.idle_jobs > 0 {
        let idle = idle::measure(&client, &o.metrics, o.idle_jobs, o.idle_minutes).await?;
        report.idle.push(idle);
    }
    // Recoveries first, on a quiet cluster: after a large size, its namespace's removal may
    // still load the node and the API server.
    if o.recoveries > 0 {
        for fault in [recovery::Fault::Deleted, recovery::Fault::Silent] {
            for &ttl in &o.recovery_ttls {
                let measured = recovery::measure(&client, fault, ttl, o.recoveries).await?;
                report.recovery.push(measured);
            }
        }
    }
    // The cost of one run, on an idle controller: its counters then hold only these runs.
    if o.costs > 0 {
        for &seconds in &o.cost_seconds {
            let cost = cost::measure(&client, &o.metrics, seconds, o.cost_ttl, o.costs).await?;
            report.cost.push(cost);
        }
    }
    if o.history_jobs > 0 {
        let runs = usize::try_from(o.history_runs)?;
        report
            .history
            .push(history::measure(&client, o.history_jobs, runs).await?);
    }
    for size in sizes {
        report.sizes.push(run_size(&client, &o, size).await?);
    }
    if let Some(path) = &o.merge {
        merge(path, &mut report)?;
    }
    let mut tables = all_tables(&report);
    println!("\n{tables}");
    if let Some(path) = &o.docs {
        // The plots go next to the document, in bench/, and the document links them.
        let dir = std::path::Path::new(path)
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .join("bench");
        let points: Vec<plots::Point> = report.sizes.iter().map(plot_point).collect();
        let files = plots::write(&points, &dir)?;
        tables.push('\n');
        for file in files {
            let title = file.trim_end_matches(".svg");
            tables.push_str(&format!("![{title}](bench/{file})\n"));
        }
        write_docs(path, &o.command, &tables)?;
        println!(
            "bench: wrote the figures into {path} and the plots into {}",
            dir.display()
        );
    }
    if let Some(path) = &o.json {
        // The shape of `Report`, which `--merge` reads back.
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {path}"))?;
    }
    if o.check {
        for r in &report.sizes {
            for (kind, f) in [("CronJob", &r.cronjob), ("cojob", &r.cojob)] {
                ensure!(
                    f.duplicates == 0 && f.misses == 0,
                    "N = {}: {kind} had {} duplicates and {} misses",
                    r.n,
                    f.duplicates,
                    f.misses
                );
            }
            ensure!(r.cojob.pods > 0, "N = {}: no cojob pod was measured", r.n);
            if let Some(s) = &r.simulated_sidecars {
                ensure!(
                    s.attached > 0 && s.errors == 0,
                    "N = {}: the simulated sidecars attached to no lease, or failed: {s:?}",
                    r.n
                );
            }
        }
        for c in &report.cost {
            ensure!(
                c.within_formula(),
                "a run of sleep {} at ttl {} s cost more or less than the formula says: {c:?}",
                c.sleep_seconds,
                c.ttl_seconds
            );
        }
        for i in &report.idle {
            ensure!(
                i.as_expected(),
                "{} idle jobs over {} minutes: a job missed its passes, or they read or wrote the bucket more than once per --index-resync: {i:?}",
                i.jobs,
                i.minutes
            );
        }
        for h in &report.history {
            ensure!(
                h.as_expected(),
                "{} jobs with {} runs each: a run did not succeed, the cluster removed history pods, or the controller reached the chart's memory limit: {h:?}",
                h.jobs,
                h.runs_per_job
            );
        }
        println!(
            "bench: check passed: no duplicate, no miss, every run's bucket requests within the formula, idle jobs read nothing between their resyncs, every history whole and under the memory limit"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_period_serves_every_size_and_a_list_one_each() {
        let one = sizes_to_measure(
            &[1000, 10_000],
            Nodes::Kwok,
            ("--kwok-every", &[5]),
            ("--kwok-ticks", &[3]),
        )
        .unwrap();
        let periods: Vec<_> = one.iter().map(|s| (s.n, s.every, s.ticks)).collect();
        assert_eq!(periods, [(1000, 5, 3), (10_000, 5, 3)]);

        let each = sizes_to_measure(
            &[1000, 6120, 10_000],
            Nodes::Kwok,
            ("--kwok-every", &[10, 30, 60]),
            ("--kwok-ticks", &[5, 4, 2]),
        )
        .unwrap();
        let periods: Vec<_> = each.iter().map(|s| (s.n, s.every, s.ticks)).collect();
        assert_eq!(periods, [(1000, 10, 5), (6120, 30, 4), (10_000, 60, 2)]);
        assert!(each.iter().all(|s| s.nodes == Nodes::Kwok));
    }

    #[test]
    fn a_list_of_another_length_names_its_option() {
        let e = sizes_to_measure(
            &[1000, 6120, 10_000],
            Nodes::Kwok,
            ("--kwok-every", &[10, 60]),
            ("--kwok-ticks", &[5]),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "--kwok-every gives 2 values (10,60) for 3 sizes (1000,6120,10000): give one for all, or one per size"
        );
        let e = sizes_to_measure(&[10], Nodes::Real, ("--every", &[1]), ("--ticks", &[2, 3]))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--ticks gives 2 values"), "{e}");
    }

    /// The argument lists `e2e/bench/run` passes (its default and `--ci`), so that a change of
    /// the options cannot leave the command (and CI's small run) behind.
    #[test]
    fn the_bench_commands_arguments_parse_and_fit_their_sizes() {
        let script =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/bench/run")).unwrap();
        let mut lists = Vec::new();
        let mut rest = script.as_str();
        // Its literal lists (not `args=("$@")`, the caller's own).
        while let Some(start) = rest.find("args=(--") {
            let after = &rest[start + "args=(".len()..];
            let end = after.find(')').unwrap();
            lists.push(after[..end].split_whitespace().collect::<Vec<_>>());
            rest = &after[end..];
        }
        assert_eq!(lists.len(), 2, "the default and --ci");
        for args in lists {
            let o = <Options as clap::Parser>::try_parse_from(
                std::iter::once("cojob-bench").chain(args.iter().copied()),
            )
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
            let (kwok, real): (Vec<Size>, Vec<Size>) = o
                .sizes_to_measure()
                .unwrap()
                .into_iter()
                .partition(|s| s.nodes == Nodes::Kwok);
            assert!(!kwok.is_empty() && !real.is_empty(), "{args:?}");
            // Each simulated size's period leaves kwok the time to play a tick out: it ends
            // about 7.5 pods a second here (docs/benchmarks.md, "Simulated nodes"), and a tick
            // has 2 N pods.
            for s in kwok {
                let play_out = 2.0 * s.n as f64 / 7.5;
                assert!(
                    f64::from(s.every * 60) > play_out,
                    "{s:?}: a tick takes {play_out} s to play out"
                );
            }
        }
    }

    #[test]
    fn the_options_parse_lists_and_check_each_value() {
        let o = <Options as clap::Parser>::try_parse_from([
            "cojob-bench",
            "--n",
            "",
            "--kwok",
            "1000,10000",
            "--kwok-every",
            "10,60",
            "--kwok-ticks",
            "5,2",
        ])
        .unwrap();
        assert_eq!((o.kwok_every, o.kwok_ticks), (vec![10, 60], vec![5, 2]));
        assert_eq!((o.every, o.ticks), (vec![1], vec![3]));
        let e = <Options as clap::Parser>::try_parse_from(["cojob-bench", "--kwok-every", "10,7"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"7\" does not divide an hour"), "{e}");
        assert!(
            <Options as clap::Parser>::try_parse_from(["cojob-bench", "--kwok-ticks", "5,11"])
                .is_err()
        );
    }
}
