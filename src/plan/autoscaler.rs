//! The HorizontalPodAutoscaler `spec.autoscaling` asks for.
//!
//! One per resource, named as the resource, scaling its target Deployment
//! on the service's two load gauges as pod metrics (an average per pod,
//! as the service's scaling guidance computes it), and on CPU when asked.
//! It carries the resource's owner reference, so the garbage collector
//! removes it with the resource even when the operator is not running.

use std::collections::BTreeMap;

use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HPAScalingRules, HorizontalPodAutoscaler,
    HorizontalPodAutoscalerBehavior, HorizontalPodAutoscalerSpec, MetricIdentifier, MetricSpec,
    MetricTarget, PodsMetricSource, ResourceMetricSource,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::ResourceId;
use crate::api::autoscaling::{INFLIGHT_METRIC, QUEUE_DEPTH_METRIC};
use crate::api::names::{FIELD_MANAGER, MANAGED_BY_LABEL, MODEL_RESOURCE_ANNOTATION};
use crate::api::{API_VERSION, Autoscaling, KIND};

/// The autoscaler's name for a resource: the resource's own name (an
/// OpenMedModel's name is a valid HorizontalPodAutoscaler name).
pub fn autoscaler_name(resource: &ResourceId) -> String {
    resource.name.clone()
}

/// The HorizontalPodAutoscaler for `autoscaling`, scaling the Deployment
/// `target` in the resource's namespace.
pub fn autoscaler(
    resource: &ResourceId,
    target: &str,
    autoscaling: &Autoscaling,
) -> HorizontalPodAutoscaler {
    let per_pod = |metric: &str, value: i32| MetricSpec {
        type_: "Pods".to_owned(),
        pods: Some(PodsMetricSource {
            metric: MetricIdentifier {
                name: metric.to_owned(),
                selector: None,
            },
            target: MetricTarget {
                type_: "AverageValue".to_owned(),
                average_value: Some(Quantity(value.to_string())),
                ..MetricTarget::default()
            },
        }),
        ..MetricSpec::default()
    };
    let mut metrics = vec![
        per_pod(QUEUE_DEPTH_METRIC, autoscaling.queue_depth_per_pod),
        per_pod(INFLIGHT_METRIC, autoscaling.inflight_requests_per_pod),
    ];
    if let Some(percent) = autoscaling.cpu_utilization_percent {
        metrics.push(MetricSpec {
            type_: "Resource".to_owned(),
            resource: Some(ResourceMetricSource {
                name: "cpu".to_owned(),
                target: MetricTarget {
                    type_: "Utilization".to_owned(),
                    average_utilization: Some(percent),
                    ..MetricTarget::default()
                },
            }),
            ..MetricSpec::default()
        });
    }
    let behavior = autoscaling.scale_down_stabilization_seconds.map(|seconds| {
        HorizontalPodAutoscalerBehavior {
            scale_down: Some(HPAScalingRules {
                stabilization_window_seconds: Some(seconds),
                ..HPAScalingRules::default()
            }),
            scale_up: None,
        }
    });
    HorizontalPodAutoscaler {
        metadata: ObjectMeta {
            name: Some(autoscaler_name(resource)),
            namespace: Some(resource.namespace.clone()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY_LABEL.to_owned(),
                FIELD_MANAGER.to_owned(),
            )])),
            annotations: Some(BTreeMap::from([(
                MODEL_RESOURCE_ANNOTATION.to_owned(),
                resource.key(),
            )])),
            owner_references: resource.uid.as_ref().map(|uid| {
                vec![OwnerReference {
                    api_version: API_VERSION.to_owned(),
                    kind: KIND.to_owned(),
                    name: resource.name.clone(),
                    uid: uid.clone(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]
            }),
            ..ObjectMeta::default()
        },
        spec: Some(HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some("apps/v1".to_owned()),
                kind: "Deployment".to_owned(),
                name: target.to_owned(),
            },
            min_replicas: Some(autoscaling.min_replicas),
            max_replicas: autoscaling.max_replicas,
            metrics: Some(metrics),
            behavior,
        }),
        status: None,
    }
}

/// True when `hpa` is the one this resource owns: its name, and the
/// ownership annotation naming the resource. An autoscaler of that name
/// without the annotation is somebody else's, and is never written.
pub fn is_owned(hpa: &HorizontalPodAutoscaler, resource: &ResourceId) -> bool {
    hpa.metadata.name.as_deref() == Some(resource.name.as_str())
        && hpa
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MODEL_RESOURCE_ANNOTATION))
            .is_some_and(|owner| *owner == resource.key())
}

/// Which parts of an observed autoscaler differ from the planned one: the
/// spec, or the labels, annotations and owner reference the plan sets.
pub fn drift(observed: &HorizontalPodAutoscaler, planned: &HorizontalPodAutoscaler) -> bool {
    let subset = |want: &Option<BTreeMap<String, String>>,
                  have: &Option<BTreeMap<String, String>>| {
        want.iter()
            .flatten()
            .all(|(k, v)| have.as_ref().and_then(|h| h.get(k)) == Some(v))
    };
    let owners_kept = planned
        .metadata
        .owner_references
        .iter()
        .flatten()
        .all(|want| {
            observed
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|have| have.uid == want.uid)
        });
    !(spec_equal(observed, planned)
        && subset(&planned.metadata.labels, &observed.metadata.labels)
        && subset(
            &planned.metadata.annotations,
            &observed.metadata.annotations,
        )
        && owners_kept)
}

/// The planned spec, compared as the API server stores it: it fills in the
/// default scaling policies of a `behavior` it is given, so a behavior is
/// compared on the stabilization window the plan sets, and nothing else.
fn spec_equal(observed: &HorizontalPodAutoscaler, planned: &HorizontalPodAutoscaler) -> bool {
    let (Some(have), Some(want)) = (&observed.spec, &planned.spec) else {
        return observed.spec == planned.spec;
    };
    let window = |spec: &HorizontalPodAutoscalerSpec| {
        spec.behavior
            .as_ref()
            .and_then(|b| b.scale_down.as_ref())
            .and_then(|d| d.stabilization_window_seconds)
    };
    have.scale_target_ref == want.scale_target_ref
        && have.min_replicas == want.min_replicas
        && have.max_replicas == want.max_replicas
        && have.metrics == want.metrics
        && window(have) == window(want)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn resource() -> ResourceId {
        ResourceId {
            namespace: "clinic".into(),
            name: "deid".into(),
            uid: Some("u-1".into()),
        }
    }

    #[test]
    fn the_defaults_are_the_services_own_guidance() {
        let hpa = autoscaler(&resource(), "openmed", &Autoscaling::default());
        let body = serde_json::to_value(&hpa).unwrap();
        assert_eq!(
            body["spec"],
            json!({
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "openmed"},
                "minReplicas": 2,
                "maxReplicas": 10,
                "metrics": [
                    {"type": "Pods", "pods": {
                        "metric": {"name": "openmed_service_admission_queue_depth"},
                        "target": {"type": "AverageValue", "averageValue": "4"}}},
                    {"type": "Pods", "pods": {
                        "metric": {"name": "openmed_service_inflight_requests"},
                        "target": {"type": "AverageValue", "averageValue": "8"}}},
                ],
            })
        );
        assert_eq!(body["metadata"]["name"], "deid");
        assert_eq!(
            body["metadata"]["annotations"]["openmed.ai/model-resource"],
            "clinic/deid"
        );
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(body["metadata"]["ownerReferences"][0]["controller"], true);
    }

    #[test]
    fn cpu_and_the_scale_down_window_are_added_only_when_asked_for() {
        let asked = Autoscaling {
            cpu_utilization_percent: Some(70),
            scale_down_stabilization_seconds: Some(30),
            ..Autoscaling::default()
        };
        let body = serde_json::to_value(autoscaler(&resource(), "openmed", &asked)).unwrap();
        assert_eq!(
            body["spec"]["metrics"][2],
            json!({"type": "Resource", "resource": {"name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 70}}})
        );
        assert_eq!(
            body["spec"]["behavior"],
            json!({"scaleDown": {"stabilizationWindowSeconds": 30}})
        );
    }

    #[test]
    fn an_autoscaler_as_the_api_server_stores_it_has_not_drifted() {
        let asked = Autoscaling {
            scale_down_stabilization_seconds: Some(30),
            ..Autoscaling::default()
        };
        let planned = autoscaler(&resource(), "openmed", &asked);
        let mut stored = planned.clone();
        // Defaults and other writers' marks the server adds.
        let behavior = stored.spec.as_mut().unwrap().behavior.as_mut().unwrap();
        behavior.scale_down.as_mut().unwrap().select_policy = Some("Max".into());
        behavior.scale_up = Some(HPAScalingRules {
            stabilization_window_seconds: Some(0),
            ..HPAScalingRules::default()
        });
        stored
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "records".into());
        assert!(!drift(&stored, &planned));

        let mut edited = stored.clone();
        edited.spec.as_mut().unwrap().max_replicas = 3;
        assert!(drift(&edited, &planned), "a hand edit of the bounds");
        let mut unowned = stored.clone();
        unowned.metadata.owner_references = None;
        assert!(drift(&unowned, &planned), "the owner reference removed");
    }

    #[test]
    fn only_the_autoscaler_annotated_with_this_resource_is_its_own() {
        let ours = autoscaler(&resource(), "openmed", &Autoscaling::default());
        assert!(is_owned(&ours, &resource()));
        let mut stranger = ours.clone();
        stranger.metadata.annotations = None;
        assert!(!is_owned(&stranger, &resource()));
        let mut other_model = ours;
        other_model
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(MODEL_RESOURCE_ANNOTATION.into(), "clinic/other".into());
        assert!(!is_owned(&other_model, &resource()));
    }
}
