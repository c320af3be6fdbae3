//! The cost of one run in bucket requests, counted on the real node and set against the
//! formula of docs/benchmarks.md ("The cost of one run, as a formula").
//!
//! For each workload duration `d` of `--cost-seconds`, `k` one-shot CoordinatedJobs with lease
//! ttl `t` (`--cost-ttl`) run `sleep d` side by side in a fresh namespace, on an otherwise idle
//! controller. Two counters are read:
//!
//! - **the controller's**: its `cojob_store_requests_total` (by operation) before the jobs are
//!   created and once every run is recorded finished, divided by `k`;
//! - **each sidecar's**: the line `bucket requests of this sidecar` it logs as it ends, read
//!   from the pod's log under `/var/log/pods`.
//!
//! The formula needs what each pod's own timestamps say ([`Timeline`]): `p`, its creation to
//! its sidecar's start (pending), `e`, its creation to its end (the cue that records the
//! outcome), and how long its sidecar ran (its renewals). Its timer passes `P` are given as a
//! range ([`passes`]): where each pass falls depends on the phase of the sidecar's renewals
//! against the controller's clock, and the timestamps are whole seconds.

use std::time::Duration;

use anyhow::{Context, ensure};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde_json::Value;

/// The controller's settings the formula depends on: the chart's defaults, which
/// `e2e/bench/run` installs.
const SWEEP_INTERVAL_S: f64 = 10.0;
const SKEW_ALLOWANCE_S: f64 = 5.0;
/// The CRD's default `startTimeoutSeconds`, which the bench's jobs keep.
const START_TIMEOUT_S: f64 = 600.0;

/// Bucket requests, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Requests {
    /// Reads.
    pub gets: f64,
    /// Writes of every mode (conditional or not).
    pub puts: f64,
    /// Deletes and lists.
    pub other: f64,
}

impl Requests {
    /// What was counted since `before`.
    pub fn minus(self, before: Requests) -> Requests {
        Requests {
            gets: self.gets - before.gets,
            puts: self.puts - before.puts,
            other: self.other - before.other,
        }
    }

    fn per(self, k: f64) -> Requests {
        Requests {
            gets: self.gets / k,
            puts: self.puts / k,
            other: self.other / k,
        }
    }

    fn plus(self, o: Requests) -> Requests {
        Requests {
            gets: self.gets + o.gets,
            puts: self.puts + o.puts,
            other: self.other + o.other,
        }
    }

    /// Every request.
    pub fn total(self) -> f64 {
        self.gets + self.puts + self.other
    }
}

/// The formula's requests for one run: at least `low`, at most `high`.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Range {
    /// The fewest the formula allows.
    pub low: Requests,
    /// The most the formula allows.
    pub high: Requests,
}

/// The cost of the runs at one workload duration.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Cost {
    /// The workload's `sleep`, in seconds.
    pub sleep_seconds: u64,
    /// The lease ttl, in seconds.
    pub ttl_seconds: u64,
    /// Runs measured.
    pub runs: usize,
    /// The runs that needed a second attempt (none is expected on an idle node).
    pub respawned: usize,
    /// The controller's clock checks during the window (3 requests each), left out of its
    /// figures: they are the controller's, every 5 minutes, not the runs'.
    #[serde(default)]
    pub clock_checks: f64,
    /// Median pending time (pod created to sidecar started), seconds.
    pub pending_seconds: f64,
    /// Median time from the pod's creation to its end, seconds.
    pub ended_seconds: f64,
    /// The controller's requests per run.
    pub controller: Requests,
    /// The sidecars' requests per run (mean of their own counts).
    pub sidecar: Requests,
    /// The formula's range for the controller per run (the mean of each run's).
    pub controller_formula: Range,
    /// The formula's range for a sidecar per run (the mean of each run's).
    pub sidecar_formula: Range,
    /// The controller's reads per run had a timer pass come every sweep interval (the code
    /// before quiet runs, commit 0528007).
    pub controller_gets_without_quiet_runs: f64,
}

impl Cost {
    /// Whole-run requests: the controller's and the sidecar's.
    pub fn counted(&self) -> Requests {
        self.controller.plus(self.sidecar)
    }

    /// True when both parts are within one request of the formula's range (the range itself
    /// allows for the pods' whole-second timestamps), and nothing else was requested.
    pub fn within_formula(&self) -> bool {
        let within = |c: Requests, r: Range| {
            c.gets >= r.low.gets - 1.0
                && c.gets <= r.high.gets + 1.0
                && c.puts >= r.low.puts - 1.0
                && c.puts <= r.high.puts + 1.0
                && c.other == 0.0
        };
        within(self.controller, self.controller_formula)
            && within(self.sidecar, self.sidecar_formula)
    }
}

/// One run pod's timeline, from its own timestamps (whole seconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeline {
    /// Its creation (the dispatch) to its sidecar's start.
    pub pending: f64,
    /// Its creation to its end (the sidecar's, the last container to stop), when the cue that
    /// records its outcome comes.
    pub ended: f64,
    /// Its sidecar's start to its stop: the time it renewed.
    pub sidecar: f64,
}

/// The controller's passes over a run between its dispatch and its end, for a run whose pod,
/// created at the dispatch, started its sidecar at `p` and ended at `e` seconds, at lease ttl
/// `t`: `(fewest, most)`.
///
/// The dispatching pass leaves the attempt quiet, as does every later pass that finds it
/// pending: for a ttl (its sidecar may attach meanwhile), or a third of the pending ttl
/// `max(t, start timeout)` when that is shorter. So the full sweeps leave it out, and it is
/// passed over every such period after the dispatch until it starts. The workload's start is a cue:
/// its pass finds the attempt running, and from then on it is quiet until its lease's deadline
/// plus the skew allowance `s`, which the sidecar's renewals (every `t/3`) keep `2t/3 + s` to
/// `t + s` ahead of the pass that read it. The pod's end is a cue, so the pass that records the
/// outcome is not one of these. The kubelet may report a workload of a second or two started
/// and ended at once (one pass for both), so the fewest leaves the start's pass out for such
/// a run. The timestamps are whole seconds, and a cue reaches its pass after the watch and the
/// debounce (0.5 s), so the fewest takes `p` and `e` a second earlier, the most `p` a second
/// later and `e` two.
///
/// ```text
/// passes(2.0, 4.0, 30.0)    == (0, 1)          // the start's pass, unless the kubelet reports both at once
/// passes(1.0, 302.0, 30.0)  == (1 + 8, 1 + 12)  // the start's pass, then one every 25 to 35 s
/// passes(25.0, 40.0, 30.0)  == (1, 1)           // the start's (the dispatch left it quiet for 30 s)
/// passes(35.0, 50.0, 30.0)  == (2, 2)           // pending at 30 s, then the start's
/// ```
pub fn passes(p: f64, e: f64, t: f64) -> (u64, u64) {
    let pending_every = t.min(t.max(START_TIMEOUT_S) / 3.0);
    let count = |p: f64, end: f64, quiet: f64, start_pass: bool| {
        let mut n = 0;
        // Passes over the pending attempt, at its quiet times from the dispatch.
        let mut at = pending_every;
        while at < p.min(end) {
            n += 1;
            at += pending_every;
        }
        if p >= end {
            return n;
        }
        // The pass its workload's start cues, then the running attempt's quiet times.
        n += u64::from(start_pass);
        let mut at = p + quiet;
        while at < end {
            n += 1;
            at += quiet;
        }
        n
    };
    let (early_p, early_e) = ((p - 1.0).max(0.0), (e - 1.0).max(0.0));
    (
        count(early_p, early_e, t + SKEW_ALLOWANCE_S, e - p > 3.0),
        count(p + 1.0, e + 2.0, 2.0 * t / 3.0 + SKEW_ALLOWANCE_S, true),
    )
}

/// The formula's range for the controller and for a sidecar (docs/benchmarks.md), for one
/// run pod's timeline at lease ttl `t`.
pub fn formula(run: &Timeline, t: f64) -> (Range, Range) {
    let (few, many) = passes(run.pending, run.ended, t);
    // Dispatch: read index and lease, claim, write the index, acquire. Completion: read
    // index and lease, release, write the index. 2 reads per timer pass.
    let controller = |n: u64| Requests {
        gets: 4.0 + 2.0 * n as f64,
        puts: 5.0,
        other: 0.0,
    };
    // Attach: one read and one compare-and-swap; a renewal every t/3 while it runs; the last
    // renewal as it stops, which marks the epoch stopping.
    let sidecar = |lived: f64| Requests {
        gets: 1.0,
        puts: 2.0 + (3.0 * lived.max(0.0) / t).floor(),
        other: 0.0,
    };
    (
        Range {
            low: controller(few),
            high: controller(many),
        },
        Range {
            low: sidecar(run.sidecar - 1.0),
            high: sidecar(run.sidecar + 1.0),
        },
    )
}

impl Range {
    fn plus(self, o: Range) -> Range {
        Range {
            low: self.low.plus(o.low),
            high: self.high.plus(o.high),
        }
    }

    fn per(self, k: f64) -> Range {
        Range {
            low: self.low.per(k),
            high: self.high.per(k),
        }
    }
}

/// The controller's bucket requests so far, from its `/metrics`, and how many of its clock
/// checks they hold.
async fn controller_requests(metrics: &str) -> anyhow::Result<(Requests, f64)> {
    Ok(parse_store_requests(&crate::scrape::scrape(metrics).await?))
}

/// Sums `cojob_store_requests_total` by operation, and counts the controller's clock checks
/// (`Store::clock_offset`, every 5 minutes: a write, a read and a delete of a scratch object;
/// nothing else the controller does deletes).
pub fn parse_store_requests(text: &str) -> (Requests, f64) {
    let (mut r, mut deletes) = (Requests::default(), 0.0);
    for line in text.lines() {
        let Some(labels) = line.strip_prefix("cojob_store_requests_total{") else {
            continue;
        };
        let Some((labels, value)) = labels.rsplit_once("} ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        if labels.contains("op=\"get\"") {
            r.gets += value;
        } else if labels.contains("op=\"put_") {
            r.puts += value;
        } else {
            r.other += value;
            if labels.contains("op=\"delete\"") {
                deletes += value;
            }
        }
    }
    (r, deletes)
}

/// The requests a sidecar logged as it ended (its JSON log line).
fn sidecar_requests(log: &str) -> Option<Requests> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["message"] == "bucket requests of this sidecar")
        .map(|v| Requests {
            gets: v["gets"].as_f64().unwrap_or(f64::NAN),
            puts: v["puts"].as_f64().unwrap_or(f64::NAN),
            other: v["other"].as_f64().unwrap_or(f64::NAN),
        })
}

/// The timeline of an ended run pod, from its timestamps.
fn timeline(pod: &Pod) -> Option<Timeline> {
    let sidecar = crate::figures::container_state(pod, "cojob-sidecar", true)?
        .terminated
        .as_ref()?;
    let main = crate::figures::container_state(pod, "main", false)?
        .terminated
        .as_ref()?;
    let created = crate::figures::created(pod)?;
    let (sidecar_started, sidecar_stopped) = (
        crate::figures::second(sidecar.started_at.as_ref()?)?,
        crate::figures::second(sidecar.finished_at.as_ref()?)?,
    );
    let finished = crate::figures::second(main.finished_at.as_ref()?)?;
    let secs = |a: DateTime<Utc>, b: DateTime<Utc>| (b - a).num_seconds().max(0) as f64;
    Some(Timeline {
        pending: secs(created, sidecar_started),
        ended: secs(created, sidecar_stopped.max(finished)),
        sidecar: secs(sidecar_started, sidecar_stopped),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// True once job `obj` recorded its run finished.
fn finished(obj: &kube::core::DynamicObject) -> Option<i64> {
    let c = &obj.data["status"]["counters"];
    let ended = ["succeeded", "failed", "cancelled"]
        .iter()
        .map(|k| c[k].as_i64().unwrap_or(0))
        .sum::<i64>();
    (ended >= 1 && c["active"].as_i64().unwrap_or(1) == 0)
        .then(|| c["succeeded"].as_i64().unwrap_or(0))
}

/// Measures `k` runs of `sleep seconds` at lease ttl `ttl` in a fresh namespace.
pub async fn measure(
    client: &Client,
    metrics: &str,
    seconds: u64,
    ttl: u64,
    k: usize,
) -> anyhow::Result<Cost> {
    let ns = cojob_e2e::TestNamespace::create(client, &format!("bench-cost-{seconds}")).await;
    cojob_e2e::provide_store_credentials(client, &ns.name).await;
    let result = measure_in(client, metrics, &ns.name, seconds, ttl, k).await;
    let removed =
        crate::cluster::remove_namespace(client, ns, &format!("cost of a {seconds} s run")).await;
    let cost = result?;
    removed?;
    Ok(cost)
}

async fn measure_in(
    client: &Client,
    metrics: &str,
    ns: &str,
    seconds: u64,
    ttl: u64,
    k: usize,
) -> anyhow::Result<Cost> {
    let jobs = cojob_e2e::coordinated_jobs(client, ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    println!("bench: cost of a run of sleep {seconds} at ttl {ttl} s: {k} one-shot jobs in {ns}");
    let (before, checks_before) = controller_requests(metrics).await?;
    for i in 0..k {
        crate::cluster::create_one_shot(&jobs, &format!("cost-{i}"), ttl, seconds).await?;
    }
    let limit = Duration::from_secs(seconds + 300);
    let t0 = tokio::time::Instant::now();
    loop {
        let list = jobs.list(&ListParams::default()).await?;
        let done: Vec<i64> = list.items.iter().filter_map(finished).collect();
        if done.len() == k {
            ensure!(
                done.iter().all(|s| *s == 1),
                "a run of sleep {seconds} did not succeed: {:?}",
                list.items
                    .iter()
                    .map(|j| &j.data["status"]["counters"])
                    .collect::<Vec<_>>()
            );
            break;
        }
        ensure!(
            t0.elapsed() < limit,
            "the runs of sleep {seconds} did not finish within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (after, checks_after) = controller_requests(metrics).await?;
    // The clock checks that fell in the window are the controller's, not the runs'.
    let clock_checks = checks_after - checks_before;
    let check = Requests {
        gets: clock_checks,
        puts: clock_checks,
        other: clock_checks,
    };
    let controller = after.minus(before).minus(check).per(k as f64);
    let mut sidecar = Requests::default();
    let (mut controller_formula, mut sidecar_formula) = (Range::default(), Range::default());
    let (mut pending, mut ended, mut without_quiet) = (Vec::new(), Vec::new(), 0.0);
    let mut respawned = 0;
    let m = SWEEP_INTERVAL_S.min(ttl as f64 / 3.0);
    for i in 0..k {
        let name = format!("cost-{i}");
        let list = pods
            .list(&ListParams::default().labels(&format!("cojob.dev/job={name}")))
            .await?;
        if list.items.len() != 1 {
            respawned += 1;
        }
        let pod = list
            .items
            .iter()
            .max_by_key(|p| p.labels().get("cojob.dev/epoch").cloned())
            .with_context(|| format!("{name}: no run pod"))?;
        let run = timeline(pod)
            .with_context(|| format!("{}: no timeline in its status", pod.name_any()))?;
        let (c, s) = formula(&run, ttl as f64);
        controller_formula = controller_formula.plus(c);
        sidecar_formula = sidecar_formula.plus(s);
        // A timer pass every m until the pod's end, as before quiet runs.
        without_quiet += 4.0 + 2.0 * ((run.ended + 1.0) / m).floor();
        pending.push(run.pending);
        ended.push(run.ended);
        let log = cojob_e2e::pod_log_tail(ns, &pod.name_any(), Some("cojob-sidecar"), 1000);
        let own = sidecar_requests(&log).with_context(|| {
            format!(
                "{}: its sidecar logged no bucket requests:\n{log}",
                pod.name_any()
            )
        })?;
        sidecar = sidecar.plus(own);
    }
    let per = k as f64;
    let cost = Cost {
        sleep_seconds: seconds,
        ttl_seconds: ttl,
        runs: k,
        respawned,
        clock_checks,
        pending_seconds: median(pending),
        ended_seconds: median(ended),
        controller,
        sidecar: sidecar.per(per),
        controller_formula: controller_formula.per(per),
        sidecar_formula: sidecar_formula.per(per),
        controller_gets_without_quiet_runs: without_quiet / per,
    };
    println!("bench: {cost:?}");
    Ok(cost)
}

fn fmt(r: Requests) -> String {
    format!("{:.1} + {:.1}", r.gets, r.puts)
}

fn fmt_range(r: Range) -> String {
    // Means over the runs: whole numbers as such, others to a tenth.
    let num = |x: f64| {
        let s = format!("{x:.1}");
        s.strip_suffix(".0").map_or(s.clone(), str::to_owned)
    };
    let one = |low: f64, high: f64| {
        if num(low) == num(high) {
            num(low)
        } else {
            format!("{}–{}", num(low), num(high))
        }
    };
    format!(
        "{} + {}",
        one(r.low.gets, r.high.gets),
        one(r.low.puts, r.high.puts)
    )
}

/// The costs as a Markdown table.
pub fn table(all: &[Cost]) -> String {
    let mut t = String::from(
        "| workload (s) | lease ttl (s) | runs | pod pending p / ended e (s after its creation, median) | controller GET + PUT per run: counted | formula | sidecar GET + PUT per run: counted | formula | whole run, counted | controller GET with a pass every sweep interval (before quiet runs) | within the formula |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for c in all {
        t.push_str(&format!(
            "| {} | {} | {}{} | {:.0} / {:.0} | {} | {} | {} | {} | {:.1} | {:.0} | {} |\n",
            c.sleep_seconds,
            c.ttl_seconds,
            c.runs,
            if c.respawned > 0 {
                format!(" ({} respawned)", c.respawned)
            } else {
                String::new()
            },
            c.pending_seconds,
            c.ended_seconds,
            fmt(c.controller),
            fmt_range(c.controller_formula),
            fmt(c.sidecar),
            fmt_range(c.sidecar_formula),
            c.counted().total(),
            c.controller_gets_without_quiet_runs,
            if c.within_formula() { "yes" } else { "no" },
        ));
    }
    let checks: f64 = all.iter().map(|c| c.clock_checks).sum();
    if checks > 0.0 {
        t.push_str(&format!(
            "\nLeft out of the controller's figures: the clock checks that fell in the windows \
             ({checks:.0}; a write, a read and a delete each, every 5 minutes, whatever the runs).\n"
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_pays_the_pass_its_start_cues_and_its_quiet_passes() {
        // Started at 2 s, ended at 4 s: the pass the workload's start cues, unless the kubelet
        // reported the start with the end.
        assert_eq!(passes(2.0, 4.0, 30.0), (0, 1));
        // The start's pass finds it running; then one every 25 to 35 s until it ends.
        assert_eq!(passes(1.0, 302.0, 30.0), (1 + 8, 1 + 12));
        assert_eq!(passes(0.0, 3.0, 12.0), (0, 1));
        // Pending 25 s at ttl 12: the dispatch left it quiet for a ttl; the passes at 12 s
        // and 24 s find it pending (the second only if it started after 24 s), then the start's.
        assert_eq!(passes(25.0, 27.0, 12.0), (1, 3));
        assert_eq!(passes(25.0, 40.0, 30.0), (1, 1));
        assert_eq!(passes(35.0, 50.0, 30.0), (2, 2));
        // Pending 10 minutes at ttl 60: a pass every minute, not every 10 s (60 passes).
        assert_eq!(passes(600.0, 700.0, 60.0).1, 10 + 1 + 2);
    }

    #[test]
    fn the_formula_adds_the_sidecars_renewals_and_its_stop() {
        let run = Timeline {
            pending: 1.0,
            ended: 302.0,
            sidecar: 301.0,
        };
        let (controller, sidecar) = formula(&run, 30.0);
        assert_eq!(controller.low.gets, 4.0 + 2.0 * 9.0);
        assert_eq!(controller.high.gets, 4.0 + 2.0 * 13.0);
        assert_eq!(controller.high.puts, 5.0);
        assert_eq!(
            (sidecar.low.puts, sidecar.high.puts),
            (2.0 + 30.0, 2.0 + 30.0)
        );
        assert_eq!(sidecar.low.gets, 1.0);
    }

    #[test]
    fn a_range_shows_its_ends_to_a_tenth() {
        let r = |gets: f64, puts: f64| Requests {
            gets,
            puts,
            other: 0.0,
        };
        let range = Range {
            low: r(4.0, 2.0),
            high: r(6.0, 2.5),
        };
        assert_eq!(fmt_range(range), "4–6 + 2–2.5");
        let exact = Range {
            low: r(4.0, 5.0),
            high: r(4.0, 5.0),
        };
        assert_eq!(fmt_range(exact), "4 + 5");
    }

    #[test]
    fn store_requests_are_summed_by_operation() {
        let text = "# TYPE cojob_store_requests counter\n\
            cojob_store_requests_total{op=\"get\",outcome=\"ok\"} 7\n\
            cojob_store_requests_total{op=\"get\",outcome=\"not_found\"} 2\n\
            cojob_store_requests_total{op=\"put_if_match\",outcome=\"ok\"} 3\n\
            cojob_store_requests_total{op=\"put_if_absent\",outcome=\"conflict\"} 1\n\
            cojob_store_requests_total{op=\"list\",outcome=\"ok\"} 0\n\
            cojob_store_request_duration_seconds_count{op=\"get\"} 9\n";
        let (r, checks) = parse_store_requests(text);
        assert_eq!((r.gets, r.puts, r.other), (9.0, 4.0, 0.0));
        assert_eq!(checks, 0.0);
        let clock = "cojob_store_requests_total{op=\"put_overwrite\",outcome=\"ok\"} 1\n\
            cojob_store_requests_total{op=\"delete\",outcome=\"ok\"} 1\n";
        let (r, checks) = parse_store_requests(clock);
        assert_eq!((r.puts, r.other, checks), (1.0, 1.0, 1.0));
    }

    #[test]
    fn the_sidecars_last_line_is_read_from_its_log() {
        let log = "--- /var/log/pods/x/cojob-sidecar/0.log (last 3 lines)\n\
            {\"level\":\"INFO\",\"message\":\"sidecar attached\"}\n\
            {\"level\":\"INFO\",\"gets\":1,\"puts\":32,\"other\":0,\"outcome\":\"Some(Stopped)\",\"message\":\"bucket requests of this sidecar\"}\n";
        assert_eq!(
            sidecar_requests(log),
            Some(Requests {
                gets: 1.0,
                puts: 32.0,
                other: 0.0
            })
        );
        assert_eq!(sidecar_requests("no such line"), None);
    }
}
