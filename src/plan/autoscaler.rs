//! The HorizontalPodAutoscaler `spec.autoscaling` asks for.
//!
//! One per resource, named as the resource, scaling its target Deployment
//! on the service's two load gauges as pod metrics (an average per pod,
//! as the service's scaling guidance computes it), and on CPU when asked.
//! It carries the resource's owner reference, so the garbage collector
//! removes it with the resource even when the operator is not running.
//!
//! With `spec.autoscaling.keda` the operator owns a KEDA ScaledObject
//! instead, asking for the same targets through KEDA's Prometheus scaler;
//! KEDA makes the HorizontalPodAutoscaler (`keda-hpa-<name>`) and owns it.

use std::collections::BTreeMap;

use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HPAScalingRules, HorizontalPodAutoscaler,
    HorizontalPodAutoscalerBehavior, HorizontalPodAutoscalerSpec, MetricIdentifier, MetricSpec,
    MetricTarget, PodsMetricSource, ResourceMetricSource,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::ResourceId;
use crate::api::autoscaling::{INFLIGHT_METRIC, QUEUE_DEPTH_METRIC};
use crate::api::names::{FIELD_MANAGER, MANAGED_BY_LABEL, MODEL_RESOURCE_ANNOTATION};
use crate::api::{Autoscaling, Keda};
use serde_json::{Value, json};

/// The API version of KEDA's ScaledObject.
pub const SCALED_OBJECT_API_VERSION: &str = "keda.sh/v1alpha1";

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
        metadata: owned_metadata(resource),
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

/// The object `spec.autoscaling` asks the operator to own, as a document:
/// the HorizontalPodAutoscaler, or with `keda` the ScaledObject.
pub fn document(resource: &ResourceId, target: &str, autoscaling: &Autoscaling) -> Value {
    match &autoscaling.keda {
        Some(keda) => scaled_object(resource, target, autoscaling, keda),
        None => serde_json::to_value(autoscaler(resource, target, autoscaling))
            .expect("an autoscaler serializes"),
    }
}

/// `spec.autoscaling` in a few words, as `render --base` shows a change
/// of it: the object, its bounds and its per-pod targets.
pub fn words(resource: &ResourceId, autoscaling: &Autoscaling) -> String {
    let mut words = format!(
        "{} {}: {} to {} pods, per pod {} queued and {} in flight",
        match autoscaling.keda {
            Some(_) => "ScaledObject",
            None => "HorizontalPodAutoscaler",
        },
        autoscaler_name(resource),
        autoscaling.min_replicas,
        autoscaling.max_replicas,
        autoscaling.queue_depth_per_pod,
        autoscaling.inflight_requests_per_pod,
    );
    if let Some(percent) = autoscaling.cpu_utilization_percent {
        words.push_str(&format!(", CPU {percent}%"));
    }
    if let Some(seconds) = autoscaling.scale_down_stabilization_seconds {
        words.push_str(&format!(", scale-down window {seconds} s"));
    }
    if let Some(keda) = &autoscaling.keda {
        words.push_str(&format!(", read from {}", keda.prometheus_address));
        if let Some(selector) = &keda.series_selector {
            words.push_str(&format!(" {{{selector}}}"));
        }
    }
    words
}

/// The metadata of the object `spec.autoscaling` asks for (either kind):
/// the resource's name and namespace, the operator's label, the ownership
/// annotation and the resource as its owner.
fn owned_metadata(resource: &ResourceId) -> ObjectMeta {
    ObjectMeta {
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
        owner_references: resource.owner_references(),
        ..ObjectMeta::default()
    }
}

/// The name KEDA gives the HorizontalPodAutoscaler it makes for the
/// resource's ScaledObject (its default, `keda-hpa-<ScaledObject>`).
pub fn keda_autoscaler_name(resource: &ResourceId) -> String {
    format!("keda-hpa-{}", resource.name)
}

/// What each pod's gauge is averaged over before the pods are summed.
/// The gauges are instantaneous and jump by tens within seconds under a
/// steady load, and an overloaded pod can miss a scrape just when its
/// gauges matter: averaged over a window, the load is the load of the
/// window (a missed scrape leaves the samples around it), and a series
/// with no sample in the window is absent, which with `ignoreNullValues`
/// off is an error, so an outage of every scrape never reads as no load.
/// Half a minute: two HPA syncs, and well within any scale-down window.
pub const GAUGE_WINDOW: &str = "30s";

/// The KEDA ScaledObject for `autoscaling` with `keda` set, scaling the
/// Deployment `target`: one Prometheus trigger per gauge, each the sum
/// over the target's pods of the gauge averaged over [`GAUGE_WINDOW`],
/// against the per-pod target as an average (what a pod metric's average
/// is), so both modes scale alike.
pub fn scaled_object(
    resource: &ResourceId,
    target: &str,
    autoscaling: &Autoscaling,
    keda: &Keda,
) -> Value {
    let selector = keda.series_selector.clone().unwrap_or_else(|| {
        format!(
            "namespace=\"{}\",pod=~\"{}-[a-z0-9]+-[a-z0-9]+\"",
            resource.namespace,
            regex_escape(target)
        )
    });
    let prometheus = |name: &str, metric: &str, per_pod: i32| {
        json!({
            "type": "prometheus",
            "name": name,
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": keda.prometheus_address,
                "query": format!("sum(avg_over_time({metric}{{{selector}}}[{GAUGE_WINDOW}]))"),
                "threshold": per_pod.to_string(),
                // A Prometheus that answers nothing is an error, not 0:
                // an outage must not read as no load.
                "ignoreNullValues": "false",
            },
        })
    };
    let mut triggers = vec![
        prometheus(
            "queue-depth",
            QUEUE_DEPTH_METRIC,
            autoscaling.queue_depth_per_pod,
        ),
        prometheus(
            "inflight-requests",
            INFLIGHT_METRIC,
            autoscaling.inflight_requests_per_pod,
        ),
    ];
    if let Some(percent) = autoscaling.cpu_utilization_percent {
        triggers.push(json!({
            "type": "cpu",
            "metricType": "Utilization",
            "metadata": {"value": percent.to_string()},
        }));
    }
    let mut spec = json!({
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
        "minReplicaCount": autoscaling.min_replicas,
        "maxReplicaCount": autoscaling.max_replicas,
        "triggers": triggers,
    });
    if let Some(seconds) = autoscaling.scale_down_stabilization_seconds {
        spec["advanced"] = json!({"horizontalPodAutoscalerConfig": {
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": seconds}},
        }});
    }
    json!({
        "apiVersion": SCALED_OBJECT_API_VERSION,
        "kind": "ScaledObject",
        "metadata": owned_metadata(resource),
        "spec": spec,
    })
}

/// `name` as a literal in a PromQL regular expression (RE2): a Deployment
/// name holds `.` and `-`, and only `.` means more.
fn regex_escape(name: &str) -> String {
    name.replace('.', "\\\\.")
}

/// True when a ScaledObject (as JSON) is the one this resource owns.
pub fn is_owned_scaled_object(object: &Value, resource: &ResourceId) -> bool {
    object.pointer("/metadata/name").and_then(Value::as_str) == Some(resource.name.as_str())
        && object
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(MODEL_RESOURCE_ANNOTATION))
            .and_then(Value::as_str)
            == Some(resource.key().as_str())
}

/// True when an observed ScaledObject differs from the planned one in
/// what the plan sets: its spec as KEDA leaves it (below), and the
/// labels, annotations and owner reference.
pub fn scaled_object_drift(observed: &Value, planned: &Value) -> bool {
    let subset = |key: &str| {
        planned["metadata"][key]
            .as_object()
            .into_iter()
            .flatten()
            .all(|(k, v)| observed["metadata"][key].get(k) == Some(v))
    };
    let owners_kept = planned["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|want| {
            observed["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|have| have["uid"] == want["uid"])
        });
    !(as_planned(&observed["spec"]) == planned["spec"]
        && subset("labels")
        && subset("annotations")
        && owners_kept)
}

/// A ScaledObject's spec without what KEDA adds to it: when its operator
/// puts its finalizer on the object it writes the spec back with an empty
/// `advanced.scalingModifiers` (and so owns that field). Compared whole
/// otherwise, so a field the plan stopped setting is drift too.
fn as_planned(spec: &Value) -> Value {
    let mut spec = spec.clone();
    if let Some(advanced) = spec.get_mut("advanced").and_then(Value::as_object_mut) {
        if advanced
            .get("scalingModifiers")
            .is_some_and(|m| m.as_object().is_some_and(|m| m.is_empty()))
        {
            advanced.remove("scalingModifiers");
        }
        if advanced.is_empty() {
            spec.as_object_mut()
                .expect("a spec with advanced is an object")
                .remove("advanced");
        }
    }
    spec
}

/// True when `hpa` is the one KEDA made for this resource's ScaledObject:
/// KEDA's name for it, and owned by a ScaledObject of the resource's name.
pub fn is_kedas_for(hpa: &HorizontalPodAutoscaler, resource: &ResourceId) -> bool {
    hpa.metadata.name.as_deref() == Some(keda_autoscaler_name(resource).as_str())
        && hpa.metadata.owner_references.iter().flatten().any(|o| {
            o.kind == "ScaledObject"
                && o.name == resource.name
                && o.api_version.starts_with("keda.sh/")
        })
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
    fn a_scaled_object_as_keda_leaves_it_has_not_drifted_and_a_dropped_field_has() {
        let keda = Keda {
            prometheus_address: "http://prometheus:9090".into(),
            series_selector: None,
        };
        let windowed = Autoscaling {
            scale_down_stabilization_seconds: Some(30),
            keda: Some(keda.clone()),
            ..Autoscaling::default()
        };
        let plain = Autoscaling {
            keda: Some(keda),
            ..Autoscaling::default()
        };
        for asked in [&windowed, &plain] {
            let planned =
                scaled_object(&resource(), "openmed", asked, asked.keda.as_ref().unwrap());
            // What KEDA's operator writes back with its finalizer.
            let mut stored = planned.clone();
            stored["spec"]["advanced"]["scalingModifiers"] = json!({});
            stored["metadata"]["finalizers"] = json!(["finalizer.keda.sh"]);
            stored["metadata"]["labels"]["scaledobject.keda.sh/name"] = json!("deid");
            assert!(
                !scaled_object_drift(&stored, &planned),
                "{}",
                stored["spec"]
            );
        }
        // The window removed from the spec: the stored one still has it.
        let before = scaled_object(
            &resource(),
            "openmed",
            &windowed,
            windowed.keda.as_ref().unwrap(),
        );
        let after = scaled_object(&resource(), "openmed", &plain, plain.keda.as_ref().unwrap());
        assert!(scaled_object_drift(&before, &after));
        // A hand edit of a threshold.
        let mut edited = after.clone();
        edited["spec"]["triggers"][0]["metadata"]["threshold"] = json!("40");
        assert!(scaled_object_drift(&edited, &after));
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
