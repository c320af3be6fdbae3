//! Figures read from `/metrics` texts: the controller's (its tick pickup and pass duration
//! histograms, its API requests by verb and resource) and the API server's (dispatched
//! requests and queue waits by flow schema).

use std::collections::BTreeMap;

use anyhow::{Context, ensure};

use crate::figures::nan_if_null;

/// The controller's `/metrics` text.
pub async fn scrape(metrics: &str) -> anyhow::Result<String> {
    cojob_e2e::run_tool(
        "curl",
        &["-sS", "--fail", &format!("http://{metrics}/metrics")],
    )
    .await
    .with_context(|| format!("scraping the controller's /metrics at {metrics}"))
}

/// A histogram of the controller's, as scraped: cumulative bucket counts by upper bound.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct Histo {
    /// Observations.
    pub count: f64,
    /// Their mean, in seconds.
    #[serde(deserialize_with = "nan_if_null")]
    pub mean: f64,
    /// The upper bound of the bucket holding the 99th percentile, in seconds (infinite: beyond
    /// the last bucket, read back from JSON as NaN).
    #[serde(deserialize_with = "nan_if_null")]
    pub p99_at_most: f64,
    #[serde(skip)]
    pub sum: f64,
    #[serde(skip)]
    pub buckets: Vec<(f64, f64)>,
}

impl Histo {
    /// The observations made between `before` and `self`.
    pub fn since(&self, before: &Histo) -> Histo {
        let buckets: Vec<(f64, f64)> = self
            .buckets
            .iter()
            .map(|(le, c)| {
                let old = before
                    .buckets
                    .iter()
                    .find(|(l, _)| l == le)
                    .map_or(0.0, |(_, c)| *c);
                (*le, c - old)
            })
            .collect();
        let count = self.count - before.count;
        let sum = self.sum - before.sum;
        let p99_at_most = buckets
            .iter()
            .find(|(_, c)| count > 0.0 && *c >= 0.99 * count)
            .map_or(f64::NAN, |(le, _)| *le);
        Histo {
            count,
            mean: if count > 0.0 { sum / count } else { f64::NAN },
            p99_at_most,
            sum,
            buckets,
        }
    }
}

/// What the controller's `/metrics` says so far.
pub struct ControllerMetrics {
    /// The sum of its bucket request counters.
    pub bucket_requests: f64,
    /// `cojob_tick_pickup_seconds`.
    pub pickup: Histo,
    /// `cojob_reconcile_duration_seconds` (how long its passes took).
    pub passes: Histo,
    /// `cojob_kube_requests_total` by [`kube_requests`]' keys (empty from a build before it).
    pub kube_requests: BTreeMap<String, f64>,
    /// `cojob_takeovers_total` by status (empty from a build before the label).
    pub takeovers: BTreeMap<String, f64>,
}

pub async fn controller_metrics(metrics: &str) -> anyhow::Result<ControllerMetrics> {
    let text = scrape(metrics).await?;
    let read = |name: &str| {
        let h = histogram(&text, name);
        ensure!(
            !h.buckets.is_empty(),
            "the controller at {metrics} has no {name} (an older build?)"
        );
        Ok(h)
    };
    Ok(ControllerMetrics {
        bucket_requests: crate::cost::parse_store_requests(&text).0.total(),
        pickup: read("cojob_tick_pickup_seconds")?,
        passes: read("cojob_reconcile_duration_seconds")?,
        kube_requests: kube_requests(&text),
        takeovers: takeovers(&text),
    })
}

/// The controller's API requests (`cojob_kube_requests_total`) keyed `verb resource`, with the
/// status appended where it is not a success (`create pods 409`): a conflict or a refusal is
/// a cost of its own.
fn kube_requests(text: &str) -> BTreeMap<String, f64> {
    counter_by(text, "cojob_kube_requests_total", |label| {
        let (code, key) = (
            label("code"),
            format!("{} {}", label("verb"), label("resource")),
        );
        if code.starts_with('2') {
            key
        } else {
            format!("{key} {code}")
        }
    })
}

/// The controller's takeovers (`cojob_takeovers_total`) by the lost attempt's status
/// (pending, running); empty from a build before the label.
fn takeovers(text: &str) -> BTreeMap<String, f64> {
    counter_by(text, "cojob_takeovers_total", |label| label("status"))
}

/// The series of the labelled counter `name`, summed by the key `key` makes of their labels
/// (it reads a label's value by name; `?` if absent).
fn counter_by(
    text: &str,
    name: &str,
    key: impl Fn(&dyn Fn(&str) -> String) -> String,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix('{'))
        else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let label = |wanted: &str| {
            labels
                .split(',')
                .find_map(|kv| {
                    kv.strip_prefix(wanted)?
                        .strip_prefix("=\"")?
                        .strip_suffix('"')
                })
                .unwrap_or("?")
                .to_string()
        };
        *out.entry(key(&label)).or_insert(0.0) += value;
    }
    out
}

/// The histogram `name` (unlabelled) of a Prometheus text exposition, as it stands.
fn histogram(text: &str, name: &str) -> Histo {
    let mut h = Histo::default();
    for line in text.lines() {
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let Some(rest) = key.strip_prefix(name) else {
            continue;
        };
        if rest == "_sum" {
            h.sum = value;
        } else if rest == "_count" {
            h.count = value;
        } else if let Some(le) = rest
            .strip_prefix("_bucket{le=\"")
            .and_then(|r| r.strip_suffix("\"}"))
        {
            h.buckets.push((le.parse().unwrap_or(f64::INFINITY), value));
        }
    }
    h
}

/// The API server's counters for one client: requests dispatched, and the seconds they
/// waited in its priority-and-fairness queues (with how many waits were measured).
#[derive(Debug, Default, Clone, Copy)]
pub struct ApiCounters {
    pub dispatched: f64,
    pub wait_seconds: f64,
    pub waits: f64,
}

impl ApiCounters {
    /// The mean queue wait per request between `before` and `self`, in milliseconds.
    pub fn mean_wait_ms_since(&self, before: &ApiCounters) -> f64 {
        let waits = self.waits - before.waits;
        if waits > 0.0 {
            1000.0 * (self.wait_seconds - before.wait_seconds) / waits
        } else {
            f64::NAN
        }
    }
}

/// API server requests dispatched so far, and their queue waits, by who sent them: the cojob
/// controller (its service account outside kube-system: flow schema `service-accounts`, which
/// nothing else uses during the bench) and the kube-controller-manager (its controllers run
/// under kube-system service accounts, plus its own identity; all of them, not only CronJob's
/// and Job's).
pub async fn api_requests() -> anyhow::Result<(ApiCounters, ApiCounters)> {
    let text = cojob_e2e::run_tool("kubectl", &["get", "--raw", "/metrics"])
        .await
        .context("scraping the API server's /metrics")?;
    Ok(api_counters(&text))
}

/// [`api_requests`] from the API server's metrics text.
fn api_counters(text: &str) -> (ApiCounters, ApiCounters) {
    let (mut cojob, mut kcm) = (ApiCounters::default(), ApiCounters::default());
    for line in text.lines() {
        let Some((key, value)) = line
            .rsplit_once(' ')
            .and_then(|(k, v)| Some((k, v.parse::<f64>().ok()?)))
        else {
            continue;
        };
        let who = if key.contains("flow_schema=\"service-accounts\"") {
            &mut cojob
        } else if key.contains("flow_schema=\"kube-system-service-accounts\"")
            || key.contains("flow_schema=\"kube-controller-manager\"")
        {
            &mut kcm
        } else {
            continue;
        };
        if key.starts_with("apiserver_flowcontrol_dispatched_requests_total{") {
            who.dispatched += value;
        } else if key.starts_with("apiserver_flowcontrol_request_wait_duration_seconds_sum{") {
            who.wait_seconds += value;
        } else if key.starts_with("apiserver_flowcontrol_request_wait_duration_seconds_count{") {
            who.waits += value;
        }
    }
    (cojob, kcm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pickup_histogram_is_the_difference_over_the_window() {
        let before = Histo {
            count: 10.0,
            sum: 1.0,
            buckets: vec![(0.1, 10.0), (1.0, 10.0), (f64::INFINITY, 10.0)],
            ..Histo::default()
        };
        let after = Histo {
            count: 110.0,
            sum: 21.0,
            buckets: vec![(0.1, 60.0), (1.0, 108.0), (f64::INFINITY, 110.0)],
            ..Histo::default()
        };
        let window = after.since(&before);
        assert_eq!(window.count, 100.0);
        assert!((window.mean - 0.2).abs() < 1e-9);
        // 98 of 100 within 1 s: the 99th percentile is in the +Inf bucket.
        assert_eq!(window.p99_at_most, f64::INFINITY);
        let nothing = after.since(&after);
        assert!(nothing.mean.is_nan() && nothing.p99_at_most.is_nan());
    }

    #[test]
    fn histograms_and_queue_waits_are_read_from_the_metrics_text() {
        let controller = "\
# TYPE cojob_reconcile_duration_seconds histogram
cojob_reconcile_duration_seconds_sum 3.5
cojob_reconcile_duration_seconds_count 7
cojob_reconcile_duration_seconds_bucket{le=\"0.5\"} 6
cojob_reconcile_duration_seconds_bucket{le=\"+Inf\"} 7
cojob_tick_pickup_seconds_sum 9.0
cojob_tick_pickup_seconds_count 1
cojob_tick_pickup_seconds_bucket{le=\"+Inf\"} 1
";
        let passes = histogram(controller, "cojob_reconcile_duration_seconds");
        assert_eq!((passes.count, passes.sum), (7.0, 3.5));
        assert_eq!(passes.buckets, vec![(0.5, 6.0), (f64::INFINITY, 7.0)]);
        let window = passes.since(&Histo::default());
        assert!((window.mean - 0.5).abs() < 1e-9);
        assert_eq!(window.p99_at_most, f64::INFINITY);
        let pickup = histogram(controller, "cojob_tick_pickup_seconds");
        assert_eq!((pickup.count, pickup.sum), (1.0, 9.0));

        let server = |cojob_waited: f64, cojob_waits: f64| {
            format!(
                "\
apiserver_flowcontrol_dispatched_requests_total{{flow_schema=\"service-accounts\",priority_level=\"workload-low\"}} {cojob_waits}
apiserver_flowcontrol_request_wait_duration_seconds_sum{{execute=\"true\",flow_schema=\"service-accounts\",priority_level=\"workload-low\"}} {cojob_waited}
apiserver_flowcontrol_request_wait_duration_seconds_count{{execute=\"true\",flow_schema=\"service-accounts\",priority_level=\"workload-low\"}} {cojob_waits}
apiserver_flowcontrol_request_wait_duration_seconds_bucket{{execute=\"true\",flow_schema=\"service-accounts\",priority_level=\"workload-low\",le=\"+Inf\"}} {cojob_waits}
apiserver_flowcontrol_dispatched_requests_total{{flow_schema=\"kube-controller-manager\",priority_level=\"workload-high\"}} 40
apiserver_flowcontrol_dispatched_requests_total{{flow_schema=\"kube-system-service-accounts\",priority_level=\"workload-high\"}} 60
apiserver_flowcontrol_request_wait_duration_seconds_sum{{execute=\"true\",flow_schema=\"kube-system-service-accounts\",priority_level=\"workload-high\"}} 0.1
apiserver_flowcontrol_request_wait_duration_seconds_count{{execute=\"true\",flow_schema=\"kube-system-service-accounts\",priority_level=\"workload-high\"}} 100
apiserver_flowcontrol_dispatched_requests_total{{flow_schema=\"exempt\",priority_level=\"exempt\"}} 999
"
            )
        };
        let (co_before, kcm) = api_counters(&server(1.0, 100.0));
        let (co_after, _) = api_counters(&server(3.0, 300.0));
        assert_eq!(co_after.dispatched - co_before.dispatched, 200.0);
        assert!((co_after.mean_wait_ms_since(&co_before) - 10.0).abs() < 1e-9);
        assert_eq!(kcm.dispatched, 100.0);
        assert!((kcm.mean_wait_ms_since(&ApiCounters::default()) - 1.0).abs() < 1e-9);
        assert!(kcm.mean_wait_ms_since(&kcm).is_nan());
    }

    #[test]
    fn the_controllers_api_requests_and_takeovers_are_read_by_their_labels() {
        let text = "\
# HELP cojob_kube_requests Requests this process sent
# TYPE cojob_kube_requests counter
cojob_kube_requests_total{verb=\"create\",resource=\"pods\",code=\"201\"} 4
cojob_kube_requests_total{verb=\"create\",resource=\"pods\",code=\"409\"} 1
cojob_kube_requests_total{verb=\"patch\",resource=\"coordinatedjobs/status\",code=\"200\"} 8
cojob_kube_requests_total{verb=\"get\",resource=\"pods\",code=\"error\"} 2
cojob_store_requests_total{op=\"get\",outcome=\"ok\"} 99
cojob_takeovers_total{status=\"pending\"} 3
cojob_takeovers_total{status=\"running\"} 5
";
        assert_eq!(
            takeovers(text).into_iter().collect::<Vec<_>>(),
            vec![("pending".to_string(), 3.0), ("running".into(), 5.0)]
        );
        let read = kube_requests(text);
        assert_eq!(
            read.into_iter().collect::<Vec<_>>(),
            vec![
                ("create pods".to_string(), 4.0),
                ("create pods 409".into(), 1.0),
                ("get pods error".into(), 2.0),
                ("patch coordinatedjobs/status".into(), 8.0),
            ]
        );
    }
}
