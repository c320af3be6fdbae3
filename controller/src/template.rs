//! A CoordinatedJob's pod template, kept encoded.
//!
//! The controller's job cache holds every CoordinatedJob it serves, and at 10 000 jobs their
//! templates are most of it: a decoded `PodTemplateSpec` keeps room for every field the API
//! defines (a pod spec, each container's, their security contexts), several kilobytes for a
//! template whose JSON is a few hundred bytes (`cargo bench -p cojob-controller --bench
//! memory`). A [`PodTemplate`] is checked as a `PodTemplateSpec` when the object is read, so a
//! template that is not one fails there, and is kept as its JSON; the controller decodes it
//! where it reads it, which is to check it and to build a run's pod.
//!
//! ```
//! use cojob_controller::template::PodTemplate;
//! let t: PodTemplate = serde_json::from_value(serde_json::json!(
//!     {"spec": {"containers": [{"name": "main", "image": "busybox"}]}})).unwrap();
//! let spec = t.decode().unwrap();
//! assert_eq!(spec.spec.unwrap().containers[0].name, "main");
//! // It writes back what it read.
//! assert_eq!(serde_json::to_value(&t).unwrap()["spec"]["containers"][0]["image"], "busybox");
//! // What is not a pod template is refused when the object is read.
//! assert!(serde_json::from_value::<PodTemplate>(serde_json::json!({"spec": 3})).is_err());
//! ```

use std::borrow::Cow;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A `PodTemplateSpec`, kept as its JSON (see the module's documentation).
#[derive(Clone, PartialEq, Eq)]
pub struct PodTemplate {
    encoded: Box<[u8]>,
}

impl PodTemplate {
    /// Encodes `spec`.
    ///
    /// # Errors
    ///
    /// If `spec` cannot be encoded as JSON (no template the API server sends fails to).
    pub fn new(spec: &PodTemplateSpec) -> Result<PodTemplate, serde_json::Error> {
        Ok(PodTemplate {
            encoded: serde_json::to_vec(spec)?.into_boxed_slice(),
        })
    }

    /// The template, decoded.
    ///
    /// # Errors
    ///
    /// If its JSON cannot be read back as a `PodTemplateSpec` (it was checked as one when it
    /// was read, so only a change of the type between the two would).
    pub fn decode(&self) -> Result<PodTemplateSpec, serde_json::Error> {
        serde_json::from_slice(&self.encoded)
    }

    /// The bytes it takes.
    pub fn encoded_len(&self) -> usize {
        self.encoded.len()
    }
}

impl<'de> Deserialize<'de> for PodTemplate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spec = PodTemplateSpec::deserialize(deserializer)?;
        PodTemplate::new(&spec).map_err(serde::de::Error::custom)
    }
}

impl Serialize for PodTemplate {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.decode()
            .map_err(serde::ser::Error::custom)?
            .serialize(serializer)
    }
}

impl std::fmt::Debug for PodTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.decode() {
            Ok(spec) => spec.fmt(f),
            Err(e) => write!(
                f,
                "PodTemplate(unreadable, {} bytes: {e})",
                self.encoded.len()
            ),
        }
    }
}

impl schemars::JsonSchema for PodTemplate {
    fn schema_name() -> Cow<'static, str> {
        PodTemplateSpec::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        PodTemplateSpec::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        PodTemplateSpec::json_schema(generator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> PodTemplateSpec {
        serde_json::from_value(serde_json::json!({
            "metadata": {"labels": {"app": "x"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox",
                "command": ["sh", "-c", "true"], "resources": {"limits": {"cpu": "100m"}}}]}
        }))
        .unwrap()
    }

    #[test]
    fn it_decodes_to_what_was_read_and_takes_less_than_the_decoded_spec() {
        let t = PodTemplate::new(&spec()).unwrap();
        assert_eq!(t.decode().unwrap(), spec());
        let through_json: PodTemplate =
            serde_json::from_value(serde_json::to_value(&t).unwrap()).unwrap();
        assert_eq!(through_json, t);
        // The whole template's JSON takes less than a decoded pod spec's fixed part alone.
        assert!(
            t.encoded_len() < std::mem::size_of::<k8s_openapi::api::core::v1::PodSpec>(),
            "{} bytes",
            t.encoded_len()
        );
        assert!(format!("{t:?}").contains("busybox"));
    }
}
