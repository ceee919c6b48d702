//! `spec.autoscaling`: the target scaled on the OpenMed service's own load
//! signals, by a HorizontalPodAutoscaler the operator owns.
//!
//! The service exports two gauges meant for an autoscaler,
//! `openmed_service_admission_queue_depth` and
//! `openmed_service_inflight_requests`, and recommends about 4 queued and 8
//! in-flight requests per pod, between 2 and 10 pods
//! (`openmed/service/scaling_metrics.py`). Those are the defaults here.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::rules;

/// The service's admission queue depth, per pod (a gauge).
pub const QUEUE_DEPTH_METRIC: &str = "openmed_service_admission_queue_depth";
/// The service's requests in flight, per pod (a gauge).
pub const INFLIGHT_METRIC: &str = "openmed_service_inflight_requests";

/// How the target Deployment is scaled on its load.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": rules::AUTOSCALING_BOUNDS_RULE,
    "message": rules::AUTOSCALING_BOUNDS_MESSAGE,
    "fieldPath": ".minReplicas",
    "reason": "FieldValueInvalid",
}]))]
pub struct Autoscaling {
    /// The fewest pods, even with no load (1 to 1000). Default 2, so one
    /// pod's restart never leaves the model unserved.
    #[serde(default = "default_min_replicas")]
    #[schemars(range(min = rules::REPLICAS_MIN, max = rules::REPLICAS_MAX))]
    pub min_replicas: i32,

    /// The most pods, at any load (1 to 1000, at least `minReplicas`).
    /// Default 10.
    #[serde(default = "default_max_replicas")]
    #[schemars(range(min = rules::REPLICAS_MIN, max = rules::REPLICAS_MAX))]
    pub max_replicas: i32,

    /// Requests waiting in the service's admission queue per pod
    /// (`openmed_service_admission_queue_depth`, averaged over the pods)
    /// above which a pod is added. Default 4.
    #[serde(default = "default_queue_depth_per_pod")]
    #[schemars(range(min = 1, max = rules::AUTOSCALING_TARGET_MAX))]
    pub queue_depth_per_pod: i32,

    /// Requests in flight per pod (`openmed_service_inflight_requests`,
    /// averaged over the pods) above which a pod is added. Default 8.
    #[serde(default = "default_inflight_requests_per_pod")]
    #[schemars(range(min = 1, max = rules::AUTOSCALING_TARGET_MAX))]
    pub inflight_requests_per_pod: i32,

    /// Also scale on CPU: the average use of the pods' CPU request, in
    /// percent (1 to 1000). Unset: the two load signals only. Needs CPU
    /// requests on the target container and a resource metrics API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub cpu_utilization_percent: Option<i32>,

    /// Seconds of lower recommendations before pods are removed (the
    /// HorizontalPodAutoscaler's scale-down stabilization window, 0 to
    /// 3600). Unset: the autoscaler's default, 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub scale_down_stabilization_seconds: Option<i32>,

    /// Scale through KEDA instead of a plain HorizontalPodAutoscaler, for
    /// clusters with KEDA and no adapter that serves the gauges as pod
    /// metrics: the operator owns a ScaledObject (named as this resource)
    /// whose Prometheus triggers ask for the same per-pod targets, and
    /// KEDA owns the HorizontalPodAutoscaler it makes from it
    /// (`keda-hpa-<name>`). Needs the operator started with `--keda`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keda: Option<Keda>,
}

/// Where KEDA reads the service's gauges.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Keda {
    /// The Prometheus that scrapes the target's pods, as KEDA reaches it,
    /// for example `http://prometheus.monitoring:9090`.
    #[schemars(regex(pattern = rules::HTTP_URL_PATTERN))]
    pub prometheus_address: String,

    /// PromQL label matchers that pick the target's pods' series. Default:
    /// `namespace="<namespace>",pod=~"<deployment>-[a-z0-9]+-[a-z0-9]+"`,
    /// the pods of the target's ReplicaSets under the usual `namespace`
    /// and `pod` labels of a Kubernetes scrape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub series_selector: Option<String>,
}

impl Default for Autoscaling {
    fn default() -> Self {
        Self {
            min_replicas: default_min_replicas(),
            max_replicas: default_max_replicas(),
            queue_depth_per_pod: default_queue_depth_per_pod(),
            inflight_requests_per_pod: default_inflight_requests_per_pod(),
            cpu_utilization_percent: None,
            scale_down_stabilization_seconds: None,
            keda: None,
        }
    }
}

fn default_min_replicas() -> i32 {
    2
}

fn default_max_replicas() -> i32 {
    10
}

fn default_queue_depth_per_pod() -> i32 {
    4
}

fn default_inflight_requests_per_pod() -> i32 {
    8
}

/// The HorizontalPodAutoscaler the operator owns, as last observed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingStatus {
    /// The HorizontalPodAutoscaler's name.
    pub name: String,

    /// The pods the target has, as the autoscaler last counted them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_replicas: Option<i32>,

    /// The pods the autoscaler last asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,

    /// When the autoscaler last changed the count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,

    /// Why it cannot scale on its metrics now (its `ScalingActive`
    /// condition is False), in its own words; unset while it can.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_scaling: Option<String>,
}
