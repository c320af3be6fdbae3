//! The report: the tables printed and written into `docs/benchmarks.md`, the plots' points,
//! and the merge of an earlier `--json` report.

use std::collections::BTreeSet;

use anyhow::Context;
use chrono::Utc;

use crate::figures::Figures;
use crate::size::SizeResult;
use crate::{Nodes, cost, history, idle, plots, recovery};

/// What the plots show of one size.
pub fn plot_point(r: &SizeResult) -> plots::Point {
    plots::Point {
        n: r.n,
        cronjob_dispatch_p99: r.cronjob.dispatch.p99,
        cojob_dispatch_p99: r.cojob.dispatch.p99,
        // On simulated nodes nothing starts: their start lag is kwok's, not a kubelet's.
        cronjob_start_p99: if r.nodes == Nodes::Real {
            r.cronjob.start.p99
        } else {
            f64::NAN
        },
        cojob_start_p99: if r.nodes == Nodes::Real {
            r.cojob.start.p99
        } else {
            f64::NAN
        },
        controller_rss_mib: r.controller_rss_bytes as f64 / (1024.0 * 1024.0),
        controller_api_requests_per_tick: r.controller_api_requests_per_tick,
        kube_controller_manager_api_requests_per_tick: r
            .kube_controller_manager_api_requests_per_tick,
        bucket_requests_per_run: r.bucket_requests_per_run,
        controller_cpu_seconds_per_tick: r.controller_cpu_seconds_per_tick,
        kube_controller_manager_cpu_seconds_per_tick: r
            .kube_controller_manager_cpu_seconds_per_tick,
    }
}

/// cojob's figure over CronJob's; a negative cojob figure (pods created ahead of the tick, with
/// `--prestart`) has no ratio, and says so, nor has a figure that was not measured (NaN: no pod
/// of that kind started in the window, for example).
fn ratio(a: f64, b: f64) -> String {
    if a.is_nan() || b.is_nan() {
        format!("none ({a} vs {b})")
    } else if a < 0.0 {
        format!("ahead ({a} s vs {b} s)")
    } else if b > 0.0 {
        format!("{:.2}", a / b)
    } else if a == 0.0 {
        "= (both 0)".into()
    } else {
        format!("∞ ({a} vs 0)")
    }
}

/// The figures as two Markdown tables.
pub fn tables(results: &[SizeResult]) -> String {
    let mut t = String::new();
    let times: BTreeSet<&str> = results.iter().map(|r| r.measured.as_str()).collect();
    if times.len() > 1 {
        // Merged from more than one run: say which size is from when.
        let when: Vec<String> = results
            .iter()
            .map(|r| format!("N = {} ({:?}): {}", r.n, r.nodes, r.measured))
            .collect();
        t.push_str(&format!("Measured at: {}.\n\n", when.join("; ")));
    }
    t.push_str(
        "| N | nodes | ticks (every) | kind | pods | dispatch lag p50 / p99 / max (s) | start lag p50 / p99 / max (s) | duplicates | misses | pod not created by the end | respawned runs |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let nodes = nodes_label(r.nodes);
        let cojob = cojob_label(r);
        for (kind, f) in [("CronJob", &r.cronjob), (cojob.as_str(), &r.cojob)] {
            t.push_str(&format!(
                "| {} | {nodes} | {} ({} min) | {kind} | {} | {} / {} / {} | {} / {} / {} | {} | {} | {} | {} |\n",
                r.n,
                r.ticks,
                r.every_minutes,
                f.pods,
                f.dispatch.p50,
                f.dispatch.p99,
                f.dispatch.max,
                f.start.p50,
                f.start.p99,
                f.start.max,
                f.duplicates,
                f.misses,
                f.unspawned,
                respawned_cell(f)
            ));
        }
    }
    t.push_str(
        "\n| N | dispatch lag p99, cojob / CronJob | start lag p99, cojob / CronJob | cojob controller CPU s per tick | kube-controller-manager CPU s per tick | API requests per tick, cojob controller / kube-controller-manager | cojob controller RSS (MiB) | bucket requests per run | tick pickup mean / p99 ≤ (s) | API server + etcd + scheduler + kwok CPU s per tick | machine CPU busy |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        t.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.0} / {:.0} | {:.1} | {:.1} | {:.2} / {} | {:.1} | {:.0} % |\n",
            r.n,
            ratio(r.cojob.dispatch.p99, r.cronjob.dispatch.p99),
            ratio(r.cojob.start.p99, r.cronjob.start.p99),
            r.controller_cpu_seconds_per_tick,
            r.kube_controller_manager_cpu_seconds_per_tick,
            r.controller_api_requests_per_tick,
            r.kube_controller_manager_api_requests_per_tick,
            r.controller_rss_bytes as f64 / (1024.0 * 1024.0),
            r.bucket_requests_per_run,
            r.tick_pickup.mean,
            r.tick_pickup.p99_at_most,
            r.shared_cpu_seconds_per_tick,
            r.machine_busy * 100.0
        ));
    }
    t.push_str(&passes_table(results));
    t.push_str(&api_requests_table(results));
    t.push_str(&takeovers_line(results));
    t.push_str(&by_tick_table(results));
    for r in results {
        if let Some(s) = &r.simulated_sidecars {
            t.push_str(&format!(
                "\nN = {} ({:?} nodes), simulated sidecars: {} attached ({} stopped with their workload or pod, {} lost their lease), {} not attached (the pod ended first or its lease was taken), {} failed, {} store errors tried again; {} bucket requests.\n",
                r.n, r.nodes, s.attached, s.stopped, s.lost, s.not_attached, s.errors, s.restarts, s.bucket_requests
            ));
        }
    }
    for r in results.iter().filter(|r| r.controller_restarted) {
        t.push_str(&format!(
            "\nN = {} ({:?} nodes): the cojob controller restarted during the window, so its CPU, bucket requests and tick pickup are not known (NaN); its memory is the restarted process's.\n",
            r.n, r.nodes
        ));
    }
    t
}

/// The controller's passes and how long the API server queued each kind's requests, for the
/// sizes that measured them (empty if none did).
fn passes_table(results: &[SizeResult]) -> String {
    let measured: Vec<&SizeResult> = results
        .iter()
        .filter(|r| r.pass_duration.count > 0.0)
        .collect();
    if measured.is_empty() {
        return String::new();
    }
    let mut t = String::from(
        "\nThe controller's passes (`cojob_reconcile_duration_seconds`) and the API server's queue wait per request (priority and fairness):\n\n\
         | N | kind | passes per tick | pass duration mean / p99 ≤ (s) | API queue wait per request, mean (ms), cojob controller / kube-controller-manager |\n\
         |---|---|---|---|---|\n",
    );
    for r in measured {
        t.push_str(&format!(
            "| {} | {} | {:.0} | {:.3} / {} | {:.1} / {:.1} |\n",
            r.n,
            cojob_label(r),
            r.pass_duration.count / f64::from(r.ticks.max(1)),
            r.pass_duration.mean,
            r.pass_duration.p99_at_most,
            r.controller_api_wait_ms,
            r.kube_controller_manager_api_wait_ms,
        ));
    }
    t
}

/// The controller's API requests per run by verb and resource, one column per size that
/// counted them (empty if none did).
fn api_requests_table(results: &[SizeResult]) -> String {
    let measured: Vec<&SizeResult> = results
        .iter()
        .filter(|r| !r.controller_api_requests_per_run.is_empty())
        .collect();
    if measured.is_empty() {
        return String::new();
    }
    let keys: BTreeSet<&String> = measured
        .iter()
        .flat_map(|r| r.controller_api_requests_per_run.keys())
        .collect();
    let mut t = String::from(
        "\nThe cojob controller's API requests per run (pod created in the window), by verb and resource (`cojob_kube_requests_total`; a status other than 2xx after the resource):\n\n| request |",
    );
    for r in &measured {
        t.push_str(&format!(" N = {} ({}) |", r.n, nodes_label(r.nodes)));
    }
    t.push_str("\n|---|");
    t.push_str(&"---|".repeat(measured.len()));
    t.push('\n');
    let row = |t: &mut String, name: &str, value: &dyn Fn(&SizeResult) -> f64| {
        t.push_str(&format!("| {name} |"));
        for r in &measured {
            t.push_str(&format!(" {:.2} |", value(r)));
        }
        t.push('\n');
    };
    for key in keys {
        row(&mut t, key, &|r: &SizeResult| {
            r.controller_api_requests_per_run
                .get(key)
                .copied()
                .unwrap_or(0.0)
        });
    }
    row(&mut t, "**all**", &|r: &SizeResult| {
        r.controller_api_requests_per_run.values().sum()
    });
    t
}

/// The controller's own count of its takeovers, by where the lost attempt stood, for each
/// size that counted them (empty if none did): what tells a controller behind on its
/// renewals (pending) from sidecars gone silent (running).
fn takeovers_line(results: &[SizeResult]) -> String {
    let sizes: Vec<String> = results
        .iter()
        .filter(|r| !r.controller_takeovers.is_empty())
        .map(|r| {
            let of = |status: &str| r.controller_takeovers.get(status).copied().unwrap_or(0.0);
            format!(
                "N = {} ({}): {} pending, {} running",
                r.n,
                nodes_label(r.nodes),
                of("pending"),
                of("running")
            )
        })
        .collect();
    if sizes.is_empty() {
        return String::new();
    }
    format!(
        "\nThe cojob controller's takeovers in the window, by the lost attempt's status (`cojob_takeovers_total`; pending: the lease was the controller's to renew, or the pod ran and its sidecar never attached; running: its sidecar went silent): {}.\n",
        sizes.join("; ")
    )
}

/// The respawned runs, split into new attempts and takeovers where the report counted them.
pub fn respawned_cell(f: &Figures) -> String {
    match f.new_attempts {
        Some(new) if f.respawned > 0 => format!(
            "{} ({new} new attempts, {} takeovers)",
            f.respawned,
            f.respawned.saturating_sub(new)
        ),
        _ => f.respawned.to_string(),
    }
}

/// How the tables name the nodes of a size.
fn nodes_label(nodes: Nodes) -> &'static str {
    match nodes {
        Nodes::Real => "real",
        Nodes::Kwok => "kwok (simulated)",
    }
}

/// How the tables name cojob's rows: with the prestart and the start timeout, if not the
/// defaults.
fn cojob_label(r: &SizeResult) -> String {
    let mut label = "cojob".to_string();
    if r.prestart_seconds > 0 {
        label += &format!(", prestart {} s", r.prestart_seconds);
    }
    if let Some(s) = r.start_timeout_seconds {
        label += &format!(", start timeout {s} s");
    }
    label
}

/// Each tick's dispatch lag, one row per size and kind (empty if no result kept them).
fn by_tick_table(results: &[SizeResult]) -> String {
    let kept: Vec<&SizeResult> = results
        .iter()
        .filter(|r| !r.cojob.by_tick.is_empty())
        .collect();
    let columns = kept.iter().map(|r| r.ticks as usize).max().unwrap_or(0);
    if columns == 0 {
        return String::new();
    }
    let mut t = String::from(
        "\nDispatch lag by tick, p50 / p99 / max (s), and how many objects' pods came after \
         their tick:\n\n| N | nodes | kind |",
    );
    for k in 1..=columns {
        t.push_str(&format!(" tick {k} |"));
    }
    t.push_str(&format!("\n|---|---|---|{}\n", "---|".repeat(columns)));
    for r in kept {
        let cojob = cojob_label(r);
        for (kind, f) in [("CronJob", &r.cronjob), (cojob.as_str(), &r.cojob)] {
            t.push_str(&format!("| {} | {} | {kind} |", r.n, nodes_label(r.nodes)));
            for k in 0..columns {
                match f.by_tick.get(k) {
                    Some(l) => t.push_str(&format!(
                        " {} / {} / {} ({} late) |",
                        l.dispatch.p50, l.dispatch.p99, l.dispatch.max, l.late
                    )),
                    None => t.push_str(" |"),
                }
            }
            t.push('\n');
        }
    }
    t
}

const BEGIN: &str = "<!-- cojob-bench:begin (written by e2e/bench/run) -->";
const END: &str = "<!-- cojob-bench:end -->";

/// Replaces the figures between the markers in `path` (appending a section the first time).
pub fn write_docs(path: &str, command: &str, tables: &str) -> anyhow::Result<()> {
    let doc = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    let body = format!(
        "{BEGIN}\nMeasured {} on this machine ({cores} cores; load average at the end {load}) with \
         `{command}`.\n\n{tables}{END}",
        Utc::now().format("%Y-%m-%d %H:%M UTC")
    );
    let new = match (doc.find(BEGIN), doc.find(END)) {
        (Some(b), Some(e)) if b < e => format!("{}{body}{}", &doc[..b], &doc[e + END.len()..]),
        _ => format!(
            "{}\n## Side by side with CronJob (`e2e/bench/run`)\n\n{body}\n",
            doc.trim_end()
        ),
    };
    std::fs::write(path, new).with_context(|| format!("writing {path}"))
}

/// Every figure of a run: what `--json` writes, and `--merge` reads back.
#[derive(Default, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// The sizes, real nodes first, then by N.
    pub sizes: Vec<SizeResult>,
    /// The recoveries (`--recovery`).
    #[serde(default)]
    pub recovery: Vec<recovery::Recovery>,
    /// The costs of one run (`--cost`).
    #[serde(default)]
    pub cost: Vec<cost::Cost>,
    /// The idle jobs' windows (`--idle`).
    #[serde(default)]
    pub idle: Vec<idle::Idle>,
    /// The memory with a full history (`--history`).
    #[serde(default)]
    pub history: Vec<history::History>,
}

/// Adds to `report` the sizes of an earlier report that this run did not measure (the same N
/// on the same kind of node with the same `--prestart` and start timeout), and each other
/// measurement of it that this run did not make; real nodes first, then by N.
pub fn merge(path: &str, report: &mut Report) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let earlier: Report = serde_json::from_str(&text)
        .with_context(|| format!("{path} is not a cojob-bench report"))?;
    let results = &mut report.sizes;
    for old in earlier.sizes {
        if !results.iter().any(|r| {
            r.n == old.n
                && r.nodes == old.nodes
                && r.prestart_seconds == old.prestart_seconds
                && r.start_timeout_seconds == old.start_timeout_seconds
        }) {
            println!(
                "bench: keeping N = {} ({:?} nodes, measured {}) from {path}",
                old.n, old.nodes, old.measured
            );
            results.push(old);
        }
    }
    results.sort_by_key(|r| (r.nodes == Nodes::Kwok, r.n, r.prestart_seconds));
    fn keep<T>(now: &mut Vec<T>, earlier: Vec<T>) {
        if now.is_empty() {
            *now = earlier;
        }
    }
    keep(&mut report.recovery, earlier.recovery);
    keep(&mut report.cost, earlier.cost);
    keep(&mut report.idle, earlier.idle);
    keep(&mut report.history, earlier.history);
    Ok(())
}

/// Every table of `report`: the sizes', then the other measurements'.
pub fn all_tables(report: &Report) -> String {
    // A run of other measurements only (`--n ''`) has no size to show.
    let mut out = if report.sizes.is_empty() {
        String::new()
    } else {
        tables(&report.sizes)
    };
    let others = [
        (!report.recovery.is_empty()).then(|| recovery::table(&report.recovery)),
        (!report.cost.is_empty()).then(|| cost::table(&report.cost)),
        (!report.idle.is_empty()).then(|| idle::table(&report.idle)),
        (!report.history.is_empty()).then(|| history::table(&report.history)),
    ];
    for table in others.into_iter().flatten() {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&table);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_ratio_says_ahead_when_pods_come_before_the_tick() {
        assert_eq!(ratio(-9.0, 0.0), "ahead (-9 s vs 0 s)");
        assert_eq!(ratio(-2.0, 3.0), "ahead (-2 s vs 3 s)");
        assert_eq!(ratio(2.0, 4.0), "0.50");
        assert_eq!(ratio(0.0, 0.0), "= (both 0)");
        assert_eq!(ratio(1470.0, f64::NAN), "none (1470 vs NaN)");
        assert_eq!(ratio(f64::NAN, 3.0), "none (NaN vs 3)");
    }

    #[test]
    fn a_report_merges_back_with_its_nan_figures() {
        let stats = json!({"p50": 1.0, "p99": null, "max": null});
        let figures = json!({"pods": 0, "dispatch": stats, "start": stats, "duplicates": 0,
            "misses": 0, "unspawned": 0, "respawned": 0});
        let size = |n: usize, nodes: &str| {
            json!({"measured": "2026-12-03 18:35 UTC", "n": n, "ticks": 3, "every_minutes": 5,
                "nodes": nodes, "cronjob": figures, "cojob": figures,
                "controller_cpu_seconds_per_tick": 1.0, "controller_rss_bytes": 1,
                "kube_controller_manager_cpu_seconds_per_tick": 1.0, "bucket_requests_per_run": 9.0,
                "controller_api_requests_per_tick": 1.0,
                "kube_controller_manager_api_requests_per_tick": 1.0,
                "shared_cpu_seconds_per_tick": 1.0, "machine_busy": null,
                "tick_pickup": {"count": 0.0, "mean": null, "p99_at_most": null}})
        };
        let report = json!({"sizes": [size(1000, "kwok"), size(10, "real")], "recovery": []});
        let path =
            std::env::temp_dir().join(format!("cojob-bench-merge-{}.json", std::process::id()));
        std::fs::write(&path, report.to_string()).unwrap();
        // This run measured N = 10 on the real node again: the report's N = 1 000 joins it.
        let mut now = Report {
            sizes: vec![serde_json::from_value(size(10, "real")).unwrap()],
            ..Report::default()
        };
        now.sizes[0].measured = "now".into();
        merge(path.to_str().unwrap(), &mut now).unwrap();
        assert!(now.cost.is_empty(), "a report without costs merges as none");
        assert!(
            now.idle.is_empty() && now.history.is_empty(),
            "a report without idle jobs or histories merges as none"
        );
        assert!(
            !all_tables(&now).contains("history pods"),
            "no history, no table"
        );
        let mut results = now.sizes;
        std::fs::remove_file(&path).unwrap();
        let kept: Vec<(usize, Nodes, &str)> = results
            .iter()
            .map(|r| (r.n, r.nodes, r.measured.as_str()))
            .collect();
        assert_eq!(
            kept,
            [
                (10, Nodes::Real, "now"),
                (1000, Nodes::Kwok, "2026-12-03 18:35 UTC")
            ]
        );
        assert!(results[1].cojob.dispatch.p99.is_nan() && results[1].machine_busy.is_nan());
        assert!(tables(&results).starts_with("Measured at: N = 10 (Real): now; N = 1000 (Kwok)"));
        assert!(
            !tables(&results).contains("by tick"),
            "reports from before the lags by tick have no such table"
        );
        assert!(
            !tables(&results).contains("by verb and resource"),
            "reports from before the API requests by verb have no such table"
        );
        results[0].controller_api_requests_per_run = [
            ("create pods".to_string(), 1.0),
            ("patch coordinatedjobs/status".into(), 2.5),
        ]
        .into();
        let table = tables(&results);
        assert!(
            table.contains("| request | N = 10 (real) |\n|---|---|\n| create pods | 1.00 |\n| patch coordinatedjobs/status | 2.50 |\n| **all** | 3.50 |\n"),
            "{table}"
        );
        results[0].controller_api_requests_per_run.clear();
        // A size that kept them has a row per kind, a column per tick.
        let lag = |p99: f64, late: usize| {
            json!({"tick": "2026-12-05T09:25:00Z", "dispatch": {"p50": -78.0, "p99": p99,
                "max": p99}, "late": late})
        };
        let mut with = size(1000, "kwok");
        with["prestart_seconds"] = json!(120);
        with["cojob"]["by_tick"] = json!([lag(8.0, 12), lag(0.0, 0), lag(-1.0, 0)]);
        with["cronjob"]["by_tick"] = json!([lag(38.0, 990), lag(30.0, 980), lag(31.0, 985)]);
        let with: SizeResult = serde_json::from_value(with).unwrap();
        let table = by_tick_table(&[with]);
        assert!(
            table.contains(
                "| 1000 | kwok (simulated) | cojob, prestart 120 s | -78 / 8 / 8 (12 late) | -78 / 0 / 0 (0 late) | -78 / -1 / -1 (0 late) |"
            ),
            "{table}"
        );
        assert!(table.contains("| tick 1 | tick 2 | tick 3 |"), "{table}");
        // A start timeout other than the CRD's default is named too; without one, none is.
        let mut longer = size(6120, "kwok");
        longer["prestart_seconds"] = json!(600);
        longer["start_timeout_seconds"] = json!(1800);
        let longer: SizeResult = serde_json::from_value(longer).unwrap();
        assert_eq!(
            cojob_label(&longer),
            "cojob, prestart 600 s, start timeout 1800 s"
        );
        let default: SizeResult = serde_json::from_value(size(6120, "kwok")).unwrap();
        assert_eq!(cojob_label(&default), "cojob");
        assert!(
            !serde_json::to_string(&default)
                .unwrap()
                .contains("start_timeout"),
            "a report keeps the field only where it was set"
        );
    }
}
