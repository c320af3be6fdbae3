//! Times of the Kubernetes API (`metav1.Time`, a `jiff` timestamp in k8s-openapi) as chrono's,
//! which the controller's clocks and the store use, and back.
//!
//! ```
//! use cojob_controller::api_time::{from_api, to_api};
//! let t: chrono::DateTime<chrono::Utc> = "2026-12-05T10:20:00.250Z".parse().unwrap();
//! let api = to_api(t).unwrap();
//! assert_eq!(from_api(&api), Some(t));
//! ```

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// An API time as chrono's, to the microsecond; `None` outside chrono's range.
pub fn from_api(t: &Time) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_micros(t.0.as_microsecond())
}

/// A chrono time as the API's, to the microsecond; `None` outside the API's range.
pub fn to_api(t: DateTime<Utc>) -> Option<Time> {
    k8s_openapi::jiff::Timestamp::from_microsecond(t.timestamp_micros())
        .ok()
        .map(Time)
}
