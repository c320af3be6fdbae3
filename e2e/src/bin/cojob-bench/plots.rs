//! SVG plots of the benchmark's figures against N (`lag.svg`, `memory.svg`, `requests.svg`,
//! `cpu.svg`).
//!
//! N is always on a log10 axis. Values that cannot be drawn (not finite) are left out; on a log
//! axis, values are clamped at [`LOG_FLOOR`]. Ranges are padded, so one point (CI runs N = 10
//! only) still gives a proper chart. The output depends on the input only.

use std::ops::Range;
use std::path::Path;

use anyhow::Context;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::element::DashedPathElement;
use plotters::prelude::*;

/// One size's figures, as the plots need them.
pub struct Point {
    /// Objects of each kind (CronJobs, and as many CoordinatedJobs).
    pub n: usize,
    /// CronJob dispatch lag, 99th percentile, in seconds.
    pub cronjob_dispatch_p99: f64,
    /// cojob dispatch lag, 99th percentile, in seconds.
    pub cojob_dispatch_p99: f64,
    /// CronJob start lag, 99th percentile, in seconds.
    pub cronjob_start_p99: f64,
    /// cojob start lag, 99th percentile, in seconds.
    pub cojob_start_p99: f64,
    /// The cojob controller's resident memory, in MiB.
    pub controller_rss_mib: f64,
    /// API server requests of the cojob controller, per minute tick.
    pub controller_api_requests_per_tick: f64,
    /// API server requests of kube-controller-manager, per minute tick.
    pub kube_controller_manager_api_requests_per_tick: f64,
    /// Bucket (object store) requests of the cojob controller, per run.
    pub bucket_requests_per_run: f64,
    /// CPU time of the cojob controller, in seconds per minute tick.
    pub controller_cpu_seconds_per_tick: f64,
    /// CPU time of kube-controller-manager, in seconds per minute tick.
    pub kube_controller_manager_cpu_seconds_per_tick: f64,
}

/// Smallest value drawn on a log axis; smaller ones (zero included) are drawn there.
const LOG_FLOOR: f64 = 0.1;
/// The cojob controller's memory target, in MiB.
const MEMORY_TARGET_MIB: f64 = 256.0;
/// Size of every figure, in pixels.
const SIZE: (u32, u32) = (900, 560);
/// Size of `requests.svg`, which holds two charts.
const TALL_SIZE: (u32, u32) = (900, 1000);
/// The x axis' description, the same on every chart.
const X_DESC: &str = "N (objects of each kind, log scale)";
const FONT: &str = "sans-serif";

const CRONJOB: RGBColor = RGBColor(31, 119, 180);
const COJOB: RGBColor = RGBColor(214, 39, 40);
const BUCKET: RGBColor = RGBColor(44, 160, 44);
const TARGET: RGBColor = RGBColor(110, 110, 110);

/// Writes lag.svg, memory.svg, requests.svg and cpu.svg into `dir` (created if missing); returns
/// the file names written.
pub fn write(points: &[Point], dir: &Path) -> anyhow::Result<Vec<String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut points: Vec<&Point> = points.iter().collect();
    points.sort_by_key(|p| p.n);
    let xs = x_range(&points);
    let series = |label: &'static str, color, dashed, value: fn(&Point) -> f64| Series {
        label,
        color,
        dashed,
        points: true,
        values: points
            .iter()
            .map(|p| (p.n.max(1) as f64, value(p)))
            .collect(),
    };

    let lag = Chart {
        title: "Lag p99 against N",
        y_desc: "lag p99 (seconds)",
        scale: Scale::Linear,
        series: vec![
            series("CronJob dispatch p99", CRONJOB, false, |p| {
                p.cronjob_dispatch_p99
            }),
            series("cojob dispatch p99", COJOB, false, |p| p.cojob_dispatch_p99),
            series("CronJob start p99", CRONJOB, true, |p| p.cronjob_start_p99),
            series("cojob start p99", COJOB, true, |p| p.cojob_start_p99),
        ],
    };
    let memory = Chart {
        title: "cojob controller memory against N",
        y_desc: "resident memory (MiB)",
        scale: Scale::Linear,
        series: vec![
            series("cojob controller RSS", COJOB, false, |p| {
                p.controller_rss_mib
            }),
            Series {
                label: "target 256 MiB",
                color: TARGET,
                dashed: true,
                points: false,
                values: vec![(xs.start, MEMORY_TARGET_MIB), (xs.end, MEMORY_TARGET_MIB)],
            },
        ],
    };
    let api = Chart {
        title: "API server requests per tick against N",
        y_desc: "API requests per tick (log scale)",
        scale: Scale::Log,
        series: vec![
            series("cojob controller", COJOB, false, |p| {
                p.controller_api_requests_per_tick
            }),
            series("kube-controller-manager (CronJob)", CRONJOB, false, |p| {
                p.kube_controller_manager_api_requests_per_tick
            }),
        ],
    };
    let bucket = Chart {
        title: "Bucket requests per run against N",
        y_desc: "bucket requests per run",
        scale: Scale::Linear,
        series: vec![series("cojob controller bucket", BUCKET, false, |p| {
            p.bucket_requests_per_run
        })],
    };
    let cpu = Chart {
        title: "CPU time per tick against N",
        y_desc: "CPU seconds per tick",
        scale: Scale::Linear,
        series: vec![
            series("cojob controller", COJOB, false, |p| {
                p.controller_cpu_seconds_per_tick
            }),
            series("kube-controller-manager (CronJob)", CRONJOB, false, |p| {
                p.kube_controller_manager_cpu_seconds_per_tick
            }),
        ],
    };

    let files = [
        ("lag.svg", SIZE, vec![lag]),
        ("memory.svg", SIZE, vec![memory]),
        ("requests.svg", TALL_SIZE, vec![api, bucket]),
        ("cpu.svg", SIZE, vec![cpu]),
    ];
    let mut written = Vec::with_capacity(files.len());
    for (name, size, charts) in files {
        let svg = svg(size, &charts, &xs).with_context(|| format!("drawing {name}"))?;
        let path = dir.join(name);
        std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
        written.push(name.to_string());
    }
    Ok(written)
}

/// One line of a chart.
struct Series {
    label: &'static str,
    color: RGBColor,
    dashed: bool,
    /// Whether each value gets a marker (so that a single point shows).
    points: bool,
    /// (N, value) pairs, by N.
    values: Vec<(f64, f64)>,
}

/// How a chart's y axis is scaled.
#[derive(Clone, Copy)]
enum Scale {
    Linear,
    Log,
}

/// One chart: a title, a y axis and its lines (x is always N).
struct Chart {
    title: &'static str,
    y_desc: &'static str,
    scale: Scale,
    series: Vec<Series>,
}

/// Plotters' errors are not always `Send + Sync`; keep their message.
fn plot_err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// The N axis: a factor of 2 either side of the sizes, so one size gives a proper range.
fn x_range(points: &[&Point]) -> Range<f64> {
    let lo = points.iter().map(|p| p.n.max(1)).min().unwrap_or(10) as f64;
    let hi = points.iter().map(|p| p.n.max(1)).max().unwrap_or(10) as f64;
    lo / 2.0..hi * 2.0
}

/// The y axis from `lo` to `hi` (the extremes of the values, if any), padded.
fn y_range(scale: Scale, extremes: Option<(f64, f64)>) -> Range<f64> {
    match scale {
        Scale::Linear => {
            let (lo, hi) = extremes.unwrap_or((0.0, 1.0));
            let (lo, hi) = (lo.min(0.0), hi.max(0.0));
            let span = if hi - lo > f64::EPSILON { hi - lo } else { 1.0 };
            // Headroom at the top for the legend.
            let bottom = if lo < 0.0 { lo - span * 0.1 } else { 0.0 };
            bottom..hi + span * 0.35
        }
        Scale::Log => {
            // Whole decades, with some room either side, so that labelled ticks frame the values.
            let (lo, hi) = extremes.unwrap_or((1.0, 1.0));
            let (lo, hi) = (lo.max(LOG_FLOOR), hi.max(LOG_FLOOR));
            10f64.powf((lo / 1.5).log10().floor())..10f64.powf((hi * 1.5).log10().ceil())
        }
    }
}

/// Renders `charts`, stacked vertically, into an SVG document of `size` pixels.
fn svg(size: (u32, u32), charts: &[Chart], xs: &Range<f64>) -> anyhow::Result<String> {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, size).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let areas = root.split_evenly((charts.len().max(1), 1));
        for (chart, area) in charts.iter().zip(&areas) {
            draw(area, chart, xs)?;
        }
        root.present().map_err(plot_err)?;
    }
    Ok(buf)
}

/// A tick label without needless zeros: `20`, `0.5`, `0.01`.
fn tick(v: f64) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

/// Draws one chart on `area`: drops values that are not finite, clamps them on a log axis and
/// sizes the y axis to them.
fn draw(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    chart: &Chart,
    xs: &Range<f64>,
) -> anyhow::Result<()> {
    let series: Vec<Series> = chart
        .series
        .iter()
        .map(|s| Series {
            values: s
                .values
                .iter()
                .filter(|(_, y)| y.is_finite())
                .map(|&(x, y)| match chart.scale {
                    Scale::Linear => (x, y),
                    Scale::Log => (x, y.max(LOG_FLOOR)),
                })
                .collect(),
            ..*s
        })
        .collect();
    let extremes = series
        .iter()
        .flat_map(|s| s.values.iter().map(|&(_, y)| y))
        .fold(None, |acc: Option<(f64, f64)>, y| match acc {
            None => Some((y, y)),
            Some((lo, hi)) => Some((lo.min(y), hi.max(y))),
        });
    let ys = y_range(chart.scale, extremes);
    match chart.scale {
        Scale::Linear => draw_on(area, chart, &series, xs, ys),
        Scale::Log => draw_on(area, chart, &series, xs, ys.log_scale()),
    }
}

/// Draws `series` of `chart` on `area`, with the y axis `ys`.
fn draw_on<Y>(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    chart: &Chart,
    series: &[Series],
    xs: &Range<f64>,
    ys: Y,
) -> anyhow::Result<()>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut ctx = ChartBuilder::on(area)
        .caption(chart.title, (FONT, 24))
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(xs.clone().log_scale(), ys)
        .map_err(plot_err)?;
    ctx.configure_mesh()
        .x_desc(X_DESC)
        .y_desc(chart.y_desc)
        .x_label_formatter(&|n| format!("{n:.0}"))
        .y_label_formatter(&|v| tick(*v))
        .axis_desc_style((FONT, 16))
        .label_style((FONT, 13))
        .draw()
        .map_err(plot_err)?;
    for s in series {
        let color = s.color;
        let style = color.stroke_width(2);
        if s.dashed {
            ctx.draw_series(DashedLineSeries::new(s.values.clone(), 8, 5, style))
                .map_err(plot_err)?
                .label(s.label)
                .legend(move |(x, y)| {
                    DashedPathElement::new(vec![(x, y), (x + 24, y)], 6, 4, style)
                });
        } else {
            ctx.draw_series(LineSeries::new(s.values.clone(), style))
                .map_err(plot_err)?
                .label(s.label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
        }
        if s.points {
            ctx.draw_series(PointSeries::of_element(
                s.values.clone(),
                4,
                color.filled(),
                &|c, size, style| Circle::new(c, size, style),
            ))
            .map_err(plot_err)?;
        }
    }
    ctx.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 14))
        .draw()
        .map_err(plot_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(n: usize) -> Point {
        let f = n as f64;
        Point {
            n,
            cronjob_dispatch_p99: 1.0 + f / 100.0,
            cojob_dispatch_p99: 0.5 + f / 1000.0,
            cronjob_start_p99: 2.0 + f / 100.0,
            cojob_start_p99: 1.5 + f / 1000.0,
            controller_rss_mib: 20.0 + f / 50.0,
            controller_api_requests_per_tick: 3.0 + f / 10.0,
            kube_controller_manager_api_requests_per_tick: 5.0 * f,
            bucket_requests_per_run: 4.0,
            controller_cpu_seconds_per_tick: 0.01 * f,
            kube_controller_manager_cpu_seconds_per_tick: 0.02 * f,
        }
    }

    /// A fresh directory under the system's temporary one.
    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "cojob-bench-plots-{}-{name}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// Writes the plots of `points` and checks every file and its labels.
    fn check(points: &[Point], name: &str) -> std::path::PathBuf {
        let dir = scratch(name);
        let written = write(points, &dir).unwrap();
        assert_eq!(
            written,
            ["lag.svg", "memory.svg", "requests.svg", "cpu.svg"]
        );
        let expected: [(&str, &[&str]); 4] = [
            (
                "lag.svg",
                &[
                    "Lag p99 against N",
                    "CronJob dispatch p99",
                    "cojob dispatch p99",
                    "CronJob start p99",
                    "cojob start p99",
                    "seconds",
                ],
            ),
            (
                "memory.svg",
                &["cojob controller RSS", "target 256 MiB", "MiB"],
            ),
            (
                "requests.svg",
                &[
                    "cojob controller",
                    "kube-controller-manager (CronJob)",
                    "API requests per tick",
                    "bucket requests per run",
                ],
            ),
            (
                "cpu.svg",
                &[
                    "cojob controller",
                    "kube-controller-manager (CronJob)",
                    "CPU seconds per tick",
                ],
            ),
        ];
        for (file, labels) in expected {
            let svg = std::fs::read_to_string(dir.join(file)).unwrap();
            assert!(svg.starts_with("<svg"), "{file} does not start with <svg");
            assert!(svg.contains(X_DESC), "{file} has no x axis description");
            assert!(svg.contains("<circle"), "{file} has no point markers");
            for label in labels {
                assert!(svg.contains(label), "{file} lacks {label:?}");
            }
        }
        dir
    }

    #[test]
    fn plots_one_point() {
        let dir = check(&[point(10)], "one");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn plots_four_points() {
        let points: Vec<Point> = [1000, 10, 100, 10000].into_iter().map(point).collect();
        let dir = check(&points, "four");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn plots_are_deterministic() {
        let points: Vec<Point> = [10, 100].into_iter().map(point).collect();
        let (a, b) = (check(&points, "a"), check(&points, "b"));
        for file in ["lag.svg", "memory.svg", "requests.svg", "cpu.svg"] {
            let (x, y) = (
                std::fs::read(a.join(file)).unwrap(),
                std::fs::read(b.join(file)).unwrap(),
            );
            assert!(x == y, "{file} differs between two runs");
        }
        std::fs::remove_dir_all(a).unwrap();
        std::fs::remove_dir_all(b).unwrap();
    }

    #[test]
    fn plots_zeros_and_nan_without_panicking() {
        let mut p = point(0);
        p.cojob_dispatch_p99 = f64::NAN;
        p.controller_api_requests_per_tick = 0.0;
        p.bucket_requests_per_run = f64::INFINITY;
        let dir = scratch("degenerate");
        write(&[p], &dir).unwrap();
        write(&[], &dir).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }
}
