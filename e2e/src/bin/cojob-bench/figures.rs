//! A size's figures, from the pods read back: each kind's dispatch and start lag, duplicates,
//! misses and respawned runs, per tick and over the window.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{ContainerState, Pod};

/// One pod's figures.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Which object it belongs to.
    pub owner: String,
    pub tick: DateTime<Utc>,
    pub created: DateTime<Utc>,
    pub started: Option<DateTime<Utc>>,
    /// The Job (CronJob) or run (cojob) it serves.
    pub unit: String,
}

/// The figures of one kind at one size.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Figures {
    pub pods: usize,
    pub dispatch: Stats,
    pub start: Stats,
    pub duplicates: usize,
    pub misses: usize,
    /// Ticks decided to run (a Job, or a cojob run, exists) whose pod did not exist yet when
    /// the pods were read back: lag beyond the window, not a miss.
    pub unspawned: usize,
    /// Runs that took more than one attempt's lease (cojob: epoch above 1; CronJob: 0).
    pub respawned: usize,
    /// Of those, the runs on a new attempt (attempt above 1: a start timeout, or a failure
    /// retried); the others were taken over within their attempt (a lease that expired).
    /// `None` in reports from before it was counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_attempts: Option<usize>,
    /// The dispatch lag of each tick of the window, in order (empty in reports from before
    /// it was kept): whether a tail comes from one tick (the first, say) or from all.
    #[serde(default)]
    pub by_tick: Vec<TickLag>,
}

/// One tick's dispatch lag: its objects' first pods created minus the tick.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TickLag {
    pub tick: DateTime<Utc>,
    pub dispatch: Stats,
    /// Objects whose first pod for this tick was created after it (lag above 0 s).
    pub late: usize,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Stats {
    #[serde(deserialize_with = "nan_if_null")]
    pub p50: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub p99: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub max: f64,
}

/// JSON has no NaN or infinity (serde_json writes `null`): read `null` back as NaN.
pub fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(<Option<f64> as serde::Deserialize>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn stats(mut v: Vec<f64>) -> Stats {
    if v.is_empty() {
        return Stats {
            p50: f64::NAN,
            p99: f64::NAN,
            max: f64::NAN,
        };
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    Stats {
        p50: at(0.5),
        p99: at(0.99),
        max: v[v.len() - 1],
    }
}

/// How many misses [`figures`] names one by one.
const MISSES_NAMED: usize = 20;

/// `served`: ticks known to have run although no pod of theirs is left (a cojob run whose lease
/// was taken over keeps the outcome of the pod that succeeded, and that pod goes once the
/// outcome is recorded). `decided`: ticks with a Job (CronJob) or a run (cojob), pod or not.
/// `respawned`: runs that took more than one lease epoch.
pub fn figures(
    samples: &[Sample],
    owners: &[String],
    ticks: &[DateTime<Utc>],
    served: &BTreeSet<(String, DateTime<Utc>)>,
    decided: &BTreeSet<(String, DateTime<Utc>)>,
    respawned: usize,
) -> Figures {
    let secs = |a: DateTime<Utc>, b: DateTime<Utc>| (a - b).num_milliseconds() as f64 / 1000.0;
    let mut units: BTreeMap<(String, DateTime<Utc>), BTreeSet<String>> = BTreeMap::new();
    for s in samples {
        units
            .entry((s.owner.clone(), s.tick))
            .or_default()
            .insert(s.unit.clone());
    }
    let duplicates = units.values().filter(|u| u.len() > 1).count();
    let (unspawned, missed): (Vec<_>, Vec<_>) = owners
        .iter()
        .flat_map(|o| ticks.iter().map(move |t| (o.clone(), *t)))
        .filter(|k| !units.contains_key(k) && !served.contains(k))
        .partition(|k| decided.contains(k));
    // The first few by name; at N = 10 000 a tick undecided by the end is thousands of lines.
    for (owner, tick) in missed.iter().take(MISSES_NAMED) {
        println!("bench: no pod for {owner} at {tick}");
    }
    if missed.len() > MISSES_NAMED {
        println!(
            "bench: no pod for {} more (object, tick) pairs",
            missed.len() - MISSES_NAMED
        );
    }
    let misses = missed.len();
    let in_window: Vec<&Sample> = samples.iter().filter(|s| ticks.contains(&s.tick)).collect();
    // Lags are the tick's: its first pod created, its first workload started. A later pod
    // (a cojob attempt after a takeover) is counted in `respawned`, not as a late dispatch.
    /// A tick's first pod created, and its first workload started.
    type Firsts = (DateTime<Utc>, Option<DateTime<Utc>>);
    let mut first: BTreeMap<(&str, DateTime<Utc>), Firsts> = BTreeMap::new();
    for s in &in_window {
        let e = first
            .entry((s.owner.as_str(), s.tick))
            .or_insert((s.created, s.started));
        e.0 = e.0.min(s.created);
        e.1 = match (e.1, s.started) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    let lags: Vec<(DateTime<Utc>, f64)> = first
        .iter()
        .map(|((_, tick), (created, _))| (*tick, secs(*created, *tick)))
        .collect();
    let by_tick = ticks
        .iter()
        .map(|&tick| {
            let of: Vec<f64> = lags
                .iter()
                .filter(|(t, _)| *t == tick)
                .map(|&(_, lag)| lag)
                .collect();
            TickLag {
                tick,
                late: of.iter().filter(|&&lag| lag > 0.0).count(),
                dispatch: stats(of),
            }
        })
        .collect();
    Figures {
        pods: in_window.len(),
        dispatch: stats(lags.iter().map(|&(_, lag)| lag).collect()),
        start: stats(
            first
                .iter()
                .filter_map(|((_, tick), (_, started))| started.map(|st| secs(st, *tick)))
                .collect(),
        ),
        duplicates,
        misses,
        unspawned: unspawned.len(),
        respawned,
        new_attempts: None,
        by_tick,
    }
}

/// An API timestamp, to the whole second the API gives.
pub fn second(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.0.as_second(), 0)
}

/// The state of the pod's container (or init container) `name`.
pub fn container_state<'a>(pod: &'a Pod, name: &str, init: bool) -> Option<&'a ContainerState> {
    let status = pod.status.as_ref()?;
    let statuses = if init {
        status.init_container_statuses.as_ref()
    } else {
        status.container_statuses.as_ref()
    };
    statuses?.iter().find(|c| c.name == name)?.state.as_ref()
}

pub fn main_started(pod: &Pod) -> Option<DateTime<Utc>> {
    let state = container_state(pod, "main", false)?;
    let at = state
        .running
        .as_ref()
        .and_then(|r| r.started_at.as_ref())
        .or_else(|| {
            state
                .terminated
                .as_ref()
                .and_then(|t| t.started_at.as_ref())
        })?;
    second(at)
}

pub fn created(pod: &Pod) -> Option<DateTime<Utc>> {
    second(pod.metadata.creation_timestamp.as_ref()?)
}

/// NaN, for figures missing from older reports.
pub fn nan() -> f64 {
    f64::NAN
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::respawned_cell;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn sample(owner: &str, tick: &str, unit: &str, created: &str) -> Sample {
        Sample {
            owner: owner.into(),
            tick: t(tick),
            created: t(created),
            started: None,
            unit: unit.into(),
        }
    }

    #[test]
    fn figures_tell_duplicates_misses_and_late_pods_apart() {
        let ticks = [t("2026-12-03T18:01:00Z"), t("2026-12-03T18:02:00Z")];
        let owners = ["a".to_string(), "b".to_string(), "c".to_string()];
        let samples = [
            sample("a", "2026-12-03T18:01:00Z", "a-1", "2026-12-03T18:01:02Z"),
            sample("a", "2026-12-03T18:02:00Z", "a-2", "2026-12-03T18:02:01Z"),
            // Two units for one tick: a duplicate.
            sample("b", "2026-12-03T18:01:00Z", "b-1", "2026-12-03T18:01:00Z"),
            sample("b", "2026-12-03T18:01:00Z", "b-1x", "2026-12-03T18:01:03Z"),
        ];
        // b's second tick ran (recorded) without a pod left; c's first was decided, no pod
        // yet; c's second was never decided: the one miss.
        let served = BTreeSet::from([("b".to_string(), ticks[1])]);
        let decided = BTreeSet::from([("c".to_string(), ticks[0])]);
        let f = figures(&samples, &owners, &ticks, &served, &decided, 1);
        assert_eq!(f.pods, 4);
        assert_eq!(f.duplicates, 1);
        assert_eq!(f.misses, 1);
        assert_eq!(f.unspawned, 1);
        assert_eq!(f.respawned, 1);
        assert_eq!(
            respawned_cell(&f),
            "1",
            "not split: new attempts not counted"
        );
        let split = Figures {
            respawned: 3224,
            new_attempts: Some(453),
            ..f.clone()
        };
        assert_eq!(
            respawned_cell(&split),
            "3224 (453 new attempts, 2771 takeovers)"
        );
        let none = Figures {
            respawned: 0,
            new_attempts: Some(0),
            ..f.clone()
        };
        assert_eq!(respawned_cell(&none), "0");
        // b's duplicate (created 3 s after the tick) is not its tick's lag: its first pod's is.
        assert_eq!(f.dispatch.max, 2.0);
        assert!(f.start.p50.is_nan(), "no pod started");
        // By tick: the first tick's lags are a's 2 s and b's 0 s (c has no pod); the second's
        // a's 1 s alone.
        let by: Vec<(DateTime<Utc>, f64, usize)> = f
            .by_tick
            .iter()
            .map(|l| (l.tick, l.dispatch.max, l.late))
            .collect();
        assert_eq!(by, [(ticks[0], 2.0, 1), (ticks[1], 1.0, 1)]);
    }
}
