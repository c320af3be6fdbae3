//! Canonical JSON and fixed-width timestamps.
//!
//! Every document cojob writes is canonical JSON: object keys sorted by their UTF-8 bytes, no
//! insignificant whitespace, UTF-8. The same value therefore always has the same bytes, whatever
//! order a map was built in and whatever `serde_json` features other crates enable.
//!
//! ```
//! let v = serde_json::json!({"b": 1, "a": {"d": [true, null], "c": "x"}});
//! assert_eq!(cojob::json::to_canonical(&v), br#"{"a":{"c":"x","d":[true,null]},"b":1}"#);
//! ```

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde::ser::{SerializeMap, SerializeSeq};
use serde_json::Value;

/// Serializes `value` as canonical JSON bytes.
pub fn to_canonical(value: &Value) -> Vec<u8> {
    // Serializing a `Value` into memory cannot fail: its keys are strings and its numbers finite.
    serde_json::to_vec(&Canonical(value)).unwrap_or_default()
}

struct Canonical<'a>(&'a Value);

impl Serialize for Canonical<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&Canonical(item))?;
                }
                seq.end()
            }
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                let mut out = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    out.serialize_entry(k, &Canonical(v))?;
                }
                out.end()
            }
            scalar => scalar.serialize(s),
        }
    }
}

/// Formats a timestamp as fixed-width RFC 3339 UTC with microseconds,
/// `2026-08-09T02:00:00.000000Z`.
///
/// ```
/// use chrono::{TimeZone, Utc};
/// let t = Utc.with_ymd_and_hms(2026, 8, 9, 2, 0, 0).unwrap();
/// assert_eq!(cojob::json::format_time(t), "2026-08-09T02:00:00.000000Z");
/// ```
pub fn format_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Parses a timestamp written by [`format_time`] (any RFC 3339 offset is accepted).
pub fn parse_time(s: &str) -> Result<DateTime<Utc>, chrono::ParseError> {
    DateTime::parse_from_rfc3339(s).map(|t| t.with_timezone(&Utc))
}

/// Truncates a timestamp to whole microseconds, the precision documents keep.
pub fn truncate_micros(t: DateTime<Utc>) -> DateTime<Utc> {
    let micros = t.timestamp_micros();
    DateTime::from_timestamp_micros(micros).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sorts_nested_keys_and_strips_whitespace() {
        let v = json!({"z": {"b": 2, "a": [ {"y": 1, "x": 0} ]}, "a": "é"});
        assert_eq!(
            String::from_utf8(to_canonical(&v)).unwrap(),
            r#"{"a":"é","z":{"a":[{"x":0,"y":1}],"b":2}}"#
        );
    }

    #[test]
    fn sorts_by_bytes_not_by_insertion() {
        let mut m = serde_json::Map::new();
        m.insert("b".into(), json!(1));
        m.insert("B".into(), json!(2));
        m.insert("a".into(), json!(3));
        assert_eq!(to_canonical(&Value::Object(m)), br#"{"B":2,"a":3,"b":1}"#);
    }

    #[test]
    fn timestamps_are_fixed_width_and_round_trip() {
        let t = DateTime::from_timestamp_micros(1_786_240_800_000_001).unwrap();
        let s = format_time(t);
        assert_eq!(s, "2026-08-09T02:00:00.000001Z");
        assert_eq!(s.len(), 27);
        assert_eq!(parse_time(&s).unwrap(), t);
        let whole = DateTime::from_timestamp(1_786_240_800, 0).unwrap();
        assert_eq!(format_time(whole).len(), 27);
    }

    #[test]
    fn truncation_drops_nanoseconds() {
        let t = DateTime::from_timestamp(10, 1_234_567).unwrap();
        assert_eq!(truncate_micros(t).timestamp_subsec_nanos(), 1_234_000);
    }
}
