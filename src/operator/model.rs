//! The OpenMedModel as the operator watches it: a spec that always parses.
//!
//! Watching the typed `OpenMedModel` would make one malformed object (stored
//! before the CRD tightened, or edited with validation off) fail to
//! deserialize and stall the watch for everyone. This type keeps `spec` and
//! `status` as raw JSON, so every object arrives, and `decide` reports what
//! is wrong with it as a condition.

use kube::Resource;
use kube::core::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::json_text::JsonText;
use serde_json::Value;

use crate::api::OpenMedModel;
use crate::rollout::ResourceView;

/// An `OpenMedModel` with raw spec and status, kept as JSON text (see
/// [`JsonText`]); the spec's target name, which every lookup of a
/// namespace's models reads, is taken out once when the object arrives.
#[derive(Resource, Serialize, Deserialize, Clone, Debug)]
#[resource(inherit = OpenMedModel)]
#[serde(from = "Stored")]
pub struct RawModel {
    /// `apiVersion` and `kind`.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub types: Option<kube::api::TypeMeta>,
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// The spec, unparsed.
    spec: JsonText,
    /// The status, unparsed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<JsonText>,
    /// `rollout::target_name_of` the spec.
    #[serde(skip)]
    target: Box<str>,
}

/// The object as stored, before the spec becomes text.
#[derive(Deserialize)]
struct Stored {
    #[serde(flatten, default)]
    types: Option<kube::api::TypeMeta>,
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Value,
    #[serde(default)]
    status: Option<JsonText>,
}

impl From<Stored> for RawModel {
    fn from(stored: Stored) -> Self {
        let name = stored.metadata.name.as_deref().unwrap_or_default();
        let target = crate::rollout::target_name_of(name, &stored.spec).into();
        RawModel {
            types: stored.types,
            spec: JsonText::of(&stored.spec),
            metadata: stored.metadata,
            status: stored.status,
            target,
        }
    }
}

impl RawModel {
    /// The Deployment this resource names (see `rollout::target_name`).
    pub fn target_name(&self) -> &str {
        &self.target
    }

    /// Where it stands, for the state gauges: read from its status as
    /// stored, without parsing the rest.
    pub fn state(&self) -> super::metrics::ModelState {
        let status = self.status.as_ref().map(JsonText::value);
        let text = |pointer: &str| {
            status
                .as_ref()
                .and_then(|s| s.pointer(pointer))
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        };
        super::metrics::ModelState {
            namespace: self.metadata.namespace.clone().unwrap_or_default(),
            name: self.metadata.name.clone().unwrap_or_default(),
            phase: text("/phase"),
            canary: text("/canary/state"),
        }
    }

    /// The lenient view `decide` reads.
    pub fn view(&self) -> ResourceView {
        let status = self.status.as_ref().map(JsonText::value);
        ResourceView::new(&self.metadata, self.spec.value(), status.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn any_stored_shape_deserializes_and_is_judged_not_dropped() {
        // Shapes a typed watch would fail on: written before the CRD
        // tightened, or with validation off.
        for spec in [
            json!("text"),
            json!({"replicas": "two", "tier": 5}),
            json!(null),
        ] {
            let object = json!({
                "apiVersion": "openmed.ai/v1alpha1", "kind": "OpenMedModel",
                "metadata": {"name": "odd", "namespace": "ns", "uid": "u", "generation": 3},
                "spec": spec,
                "status": {"phase": "NotAPhase", "rollbackCount": 2},
            });
            let model: RawModel = serde_json::from_value(object).expect("always deserializes");
            let view = model.view();
            assert_eq!(
                view.status.rollback_count,
                Some(2),
                "readable status fields are kept"
            );
            let d = crate::rollout::decide(&crate::rollout::Observed {
                resource: &view,
                target: None,
                canary_target: None,
                route: None,
                measurements: &[],
                probes: &[],
                autoscalers: &[],
                scaled_object: None,
                rivals: &[],
                claimed: &[],
                config_maps: &[],
                snapshot_uses: &[],
                pods: &[],
                settings: Default::default(),
                now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::from_second(0).unwrap(),
                ),
            });
            assert!(d.writes.is_empty());
            let ready = d
                .status
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .unwrap();
            assert_eq!(ready.reason, "InvalidSpec", "{spec:?}");
        }
    }

    #[test]
    fn the_target_is_read_from_the_spec_once() {
        let model: RawModel = serde_json::from_value(json!({
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {"targetRef": {"name": "svc"}},
        }))
        .unwrap();
        assert_eq!(model.target_name(), "svc");
        let odd: RawModel = serde_json::from_value(json!({
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {"targetRef": {"name": 5}},
        }))
        .unwrap();
        assert_eq!(
            odd.target_name(),
            "m",
            "as rollout::target_name_of reads it"
        );
    }

    #[test]
    fn a_status_kept_as_text_is_written_back_as_it_was_read() {
        let status = json!({"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}],
            "lastSuccessfulSpec": {"version": "v1", "family": "pii"}});
        let object = json!({
            "apiVersion": "openmed.ai/v1alpha1", "kind": "OpenMedModel",
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {"version": "v1"},
            "status": status,
        });
        let model: RawModel = serde_json::from_value(object.clone()).unwrap();
        assert_eq!(model.status.as_ref().unwrap().value(), status);
        assert_eq!(model.view().spec, object["spec"]);
        assert_eq!(
            model.target_name(),
            "m",
            "no targetRef: the resource's own name"
        );
        assert_eq!(serde_json::to_value(&model).unwrap(), object);
        // Key order survives, so a write sends the status as it came.
        let text = serde_json::to_string(&model).unwrap();
        assert!(
            text.contains(r#""status":{"phase":"Ready","conditions""#),
            "{text}"
        );
    }
}
