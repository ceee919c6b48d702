//! `spec.canary`: a new model version tried on a second, user-owned
//! Deployment with a share of the traffic, before the stable one rolls.
//!
//! The operator creates no workload and no Service. It writes the new model
//! into the canary Deployment the same way as into the stable one, moves
//! the two backend weights of one HTTPRoute rule step by step, runs the
//! analysis between steps, and then either promotes (the stable Deployment
//! rolls to the new version, the weights go back) or aborts (the weights go
//! back at once). At rest the route is exactly what Git says.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::rules;

/// How a new version is tried before the stable Deployment gets it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Canary {
    /// The canary Deployment: a second Deployment of the same service,
    /// created and scaled by you, behind the canary Service. It gets the
    /// new version when a canary starts and the stable one back when it is
    /// aborted.
    pub target_ref: CanaryTargetRef,

    /// The HTTPRoute rule whose two backend weights move the traffic.
    pub traffic_ref: TrafficRef,

    /// The canary's share of the traffic, step by step, in percent
    /// (strictly increasing, 1 to 99). After the last step the stable
    /// Deployment rolls to the new version.
    #[schemars(length(min = 1, max = 20))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": rules::STEPS_INCREASING_RULE,
        "message": rules::STEPS_INCREASING_MESSAGE,
    }]))]
    pub steps: Vec<CanaryStep>,

    /// Measurements that must pass before each step ends. Without it a
    /// step ends when its pause is over (or on a promote).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<Analysis>,

    /// How the operator knows the data plane has stopped sending the
    /// canary Deployment requests once a canary ended, before it moves
    /// that Deployment back to the stable version. Without it: once the
    /// route shows the weights back and every Gateway reports having
    /// accepted that generation of the route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<Drain>,
}

/// The wait, after a canary ends, until no request reaches the canary
/// Deployment any more.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Drain {
    /// The data plane's request rate to the canary backend, in requests
    /// per second; the canary Deployment moves back once it reads 0. No
    /// data is not 0 (write `... or vector(0)` when a backend that gets
    /// nothing has no series). The address must be one `run
    /// --analysis-allow` allows.
    pub prometheus: PrometheusQuery,

    /// How long to wait for 0 after the weights are back, as `2m`; then
    /// the canary Deployment moves back anyway, with a Warning. Default
    /// `2m`.
    #[serde(default = "default_drain_timeout")]
    #[schemars(regex(pattern = rules::DURATION_PATTERN), length(max = 32))]
    pub timeout: String,
}

/// The canary Deployment and its container.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryTargetRef {
    /// Name of the canary Deployment in this namespace; not the stable one.
    #[schemars(
        regex(pattern = rules::DNS_SUBDOMAIN_PATTERN),
        length(max = rules::DNS_SUBDOMAIN_MAX)
    )]
    pub name: String,

    /// Name of the container that runs the OpenMed service. Default
    /// `openmed-service`.
    #[serde(default = "super::types::default_container_name")]
    #[schemars(
        regex(pattern = rules::DNS_LABEL_PATTERN),
        length(max = rules::DNS_LABEL_MAX)
    )]
    pub container_name: String,
}

/// One rule of a `gateway.networking.k8s.io/v1` HTTPRoute in this
/// namespace, with its two backends.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.stableBackend != self.canaryBackend",
    "message": "stableBackend and canaryBackend must be two different Services",
}]))]
pub struct TrafficRef {
    /// Name of the HTTPRoute.
    #[schemars(
        regex(pattern = rules::DNS_SUBDOMAIN_PATTERN),
        length(max = rules::DNS_SUBDOMAIN_MAX)
    )]
    pub http_route: String,

    /// The rule's `name`. Optional when exactly one rule holds both
    /// backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = rules::DNS_LABEL_PATTERN),
        length(max = rules::DNS_LABEL_MAX)
    )]
    pub rule_name: Option<String>,

    /// The Service of the stable Deployment, as named in the rule's
    /// `backendRefs`.
    #[schemars(
        regex(pattern = rules::DNS_LABEL_PATTERN),
        length(max = rules::DNS_LABEL_MAX)
    )]
    pub stable_backend: String,

    /// The Service of the canary Deployment, as named in the rule's
    /// `backendRefs`. Its weight must be 0 in Git.
    #[schemars(
        regex(pattern = rules::DNS_LABEL_PATTERN),
        length(max = rules::DNS_LABEL_MAX)
    )]
    pub canary_backend: String,
}

/// One step: a traffic share, or a mirrored copy of the traffic, held for
/// a while or until a promote.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.weight) != has(self.mirror)",
    "message": "a step sets either weight or mirror",
}]))]
pub struct CanaryStep {
    /// The canary's share of the traffic in percent (1 to 99); the stable
    /// backend gets the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 99))]
    pub weight: Option<i32>,

    /// A shadow step: a copy of this percent of the rule's requests (1 to
    /// 100) also goes to the canary backend, whose answers the data plane
    /// discards; every client is still answered by the stable backend. A
    /// Gateway API `RequestMirror` filter with `percent`, added to the rule
    /// for the step and removed at every ending of the canary. Mirror
    /// steps come before the weight steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub mirror: Option<i32>,

    /// How long to hold the step, as `30s`, `5m`, `1h30m`. Without it the
    /// step waits for a promote (`openmed.ai/canary-promote`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = rules::DURATION_PATTERN))]
    pub pause: Option<String>,
}

/// What a step does to the traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// The canary serves this percent of the requests.
    Weight(i32),
    /// The canary gets a copy of this percent of the requests; it serves
    /// none.
    Mirror(i32),
}

impl CanaryStep {
    /// What the step does (a step with neither field, which validation
    /// refuses, moves nothing: weight 0).
    pub fn kind(&self) -> StepKind {
        match (self.mirror, self.weight) {
            (Some(percent), _) => StepKind::Mirror(percent),
            (None, weight) => StepKind::Weight(weight.unwrap_or(0)),
        }
    }

    /// The canary's share of the requests it serves: 0 in a mirror step.
    pub fn weight(&self) -> i32 {
        match self.kind() {
            StepKind::Weight(w) => w,
            StepKind::Mirror(_) => 0,
        }
    }
}

/// The measurements that judge a canary.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "(has(self.metrics) ? self.metrics.size() : 0) + (has(self.webhooks) ? self.webhooks.size() : 0) + (has(self.probes) ? 1 : 0) > 0",
    "message": "analysis needs at least one metric, webhook or probe set",
}]))]
pub struct Analysis {
    /// How often to measure, as `30s`, `1m`. Default `1m`.
    #[serde(default = "default_interval")]
    #[schemars(regex(pattern = rules::DURATION_PATTERN))]
    pub interval: String,

    /// How many failed measurements are tolerated over the whole canary;
    /// one more aborts it. Default 0. No data never counts as a pass nor
    /// as a failure: it holds the step.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub failure_limit: i32,

    /// Prometheus queries and the range their result must fall in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub metrics: Vec<Metric>,

    /// Endpoints told the canary's state with a POST; a 2xx answer passes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub webhooks: Vec<Webhook>,

    /// Labelled probes sent to each ready canary pod every round (and to a
    /// stable pod with `notWorseThanStable`), judged on recall per label
    /// as the quality gate judges them (docs/quality.md). Recorded as the
    /// measurement `probes`, figures only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<super::QualityGate>,
}

/// One Prometheus measurement.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Metric {
    /// A name for reports, e.g. `error-rate`.
    #[schemars(
        regex(pattern = rules::DNS_LABEL_PATTERN),
        length(max = rules::DNS_LABEL_MAX)
    )]
    pub name: String,

    /// Where and what to ask.
    pub prometheus: PrometheusQuery,

    /// The range a passing result falls in (bounds included).
    pub threshold_range: ThresholdRange,
}

/// A PromQL instant query.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusQuery {
    /// Base URL of the Prometheus HTTP API, e.g.
    /// `http://prometheus.monitoring:9090`.
    #[schemars(regex(pattern = rules::HTTP_URL_PATTERN), length(max = 2048))]
    pub address: String,

    /// The query; it must return one sample. `{{canary}}` and `{{stable}}`
    /// become the backend Service names, `{{namespace}}` this namespace,
    /// `{{version}}` the version under test.
    #[schemars(length(min = 1, max = 4096))]
    pub query: String,
}

/// Bounds of a passing result.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.min) || has(self.max)",
        "message": "set min, max or both",
    },
    {
        "rule": "!has(self.min) || !has(self.max) || self.min <= self.max",
        "message": "min must not exceed max",
    },
]))]
pub struct ThresholdRange {
    /// The smallest passing value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    /// The largest passing value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
}

/// A webhook check.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": rules::WEBHOOK_TIMEOUT_RULE,
    "message": rules::WEBHOOK_TIMEOUT_MESSAGE,
    "fieldPath": ".timeout",
}]))]
pub struct Webhook {
    /// A name for reports.
    #[schemars(
        regex(pattern = rules::DNS_LABEL_PATTERN),
        length(max = rules::DNS_LABEL_MAX)
    )]
    pub name: String,

    /// The URL to POST the canary's state to (JSON).
    #[schemars(regex(pattern = rules::HTTP_URL_PATTERN), length(max = 2048))]
    pub url: String,

    /// How long to wait for the answer, as `10s`: at most `30s`. Default
    /// `10s`; no answer in time counts as no data.
    #[serde(default = "default_webhook_timeout")]
    #[schemars(regex(pattern = rules::DURATION_PATTERN), length(max = 32))]
    pub timeout: String,
}

fn default_interval() -> String {
    "1m".to_owned()
}

fn default_webhook_timeout() -> String {
    "10s".to_owned()
}

fn default_drain_timeout() -> String {
    "2m".to_owned()
}

/// Where a canary stands, written only by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStatus {
    /// The version under test.
    pub version: String,

    /// Hash of the normalized spec under test (`status.desiredSpecHash`
    /// when the canary started).
    pub spec_hash: String,

    /// Warming, Progressing, Paused, Promoting, Promoted or Aborted.
    pub state: CanaryState,

    /// The route and backends the canary moves traffic on, so its weights
    /// go back even if `spec.canary` is removed meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_ref: Option<TrafficRef>,

    /// The canary Deployment the canary runs on, so a renamed
    /// `spec.canary.targetRef` ends the canary before that Deployment is
    /// released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<CanaryTargetRef>,

    /// The step in effect, from 1; 0 while the canary pods warm up.
    pub step: i32,

    /// The canary's share of the traffic in percent: the current step's
    /// from the moment its weights are written (the route shows them once
    /// `stepStartTime` is set), back to the restore weight's once they are
    /// back.
    pub weight: i32,

    /// The percent of the requests mirrored to the canary backend: the
    /// current mirror step's from the moment its filter is written, absent
    /// once the filter is removed again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<i32>,

    /// The two backend weights before the canary, restored at its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_weights: Option<BackendWeights>,

    /// When the canary started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the route was first seen showing the current step's weights;
    /// its pause and its first round of analysis count from then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_start_time: Option<Time>,

    /// The canary Deployment's `metadata.generation` produced by the
    /// operator's write; its progress is judged against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_generation: Option<i64>,

    /// Since when the canary Deployment has been missing or without an
    /// available pod, after it warmed: past the progress deadline the
    /// canary aborts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_since: Option<Time>,

    /// Failed measurements so far.
    #[serde(default)]
    pub failures: i32,

    /// Rounds of analysis in a row in which a check got no answer (an
    /// error, a timeout): at four the canary aborts.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unanswered_rounds: i32,

    /// The latest measurements, newest last (20 kept, and always the whole
    /// latest round).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub analysis: Vec<AnalysisResult>,

    /// The `openmed.ai/canary-promote` value last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promote_handled: Option<String>,

    /// The `openmed.ai/canary-abort` value last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_handled: Option<String>,

    /// The resource's generation when the canary was aborted: the same
    /// spec is not tried again until it changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aborted_generation: Option<i64>,

    /// When the route was first seen with the weights back, after the
    /// canary ended; the wait for the data plane to stop sending the
    /// canary Deployment requests counts from then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights_back_time: Option<Time>,

    /// When the data plane was seen sending the canary Deployment no more
    /// requests (or the wait for it ran out): from then on it may serve
    /// the stable version again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained_time: Option<Time>,

    /// With `spec.autoscaling`: the stable Deployment's count when the
    /// canary started. Until the canary has drained, the model's
    /// autoscaler keeps at least this many stable pods, so the traffic
    /// coming back after a promotion meets no cold start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_replicas: Option<i32>,

    /// With `spec.autoscaling`: the canary Deployment's own count before
    /// the canary sized it to its share, given back once it drained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rest_replicas: Option<i32>,

    /// Why the canary is where it is, for a person.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The stable and canary backend weights of the rule.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackendWeights {
    /// The stable backend's weight.
    pub stable: i32,
    /// The canary backend's weight.
    pub canary: i32,
}

/// Stage of a canary.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CanaryState {
    /// The canary Deployment rolls to the new version; no traffic yet.
    #[default]
    Warming,
    /// Holding a step: its pause, its analysis.
    Progressing,
    /// Waiting for a person: a step without a pause, an inconclusive
    /// analysis, a route changed by another writer, or
    /// `openmed.ai/canary-pause`.
    Paused,
    /// Every step passed; the stable Deployment rolls to the new version.
    Promoting,
    /// The stable Deployment serves the new version; the weights are back.
    Promoted,
    /// Stopped; the weights are back and the stable version is unchanged.
    Aborted,
}

impl CanaryState {
    /// The name as written in the status.
    pub fn as_str(self) -> &'static str {
        match self {
            CanaryState::Warming => "Warming",
            CanaryState::Progressing => "Progressing",
            CanaryState::Paused => "Paused",
            CanaryState::Promoting => "Promoting",
            CanaryState::Promoted => "Promoted",
            CanaryState::Aborted => "Aborted",
        }
    }

    /// Whether the canary is over (the route is at rest).
    pub fn is_over(self) -> bool {
        matches!(self, CanaryState::Promoted | CanaryState::Aborted)
    }
}

/// One measurement.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisResult {
    /// When it was taken.
    pub time: Time,
    /// The metric's or webhook's name.
    pub name: String,
    /// The step it was taken at.
    pub step: i32,
    /// Pass, Fail or Inconclusive.
    pub outcome: Outcome,
    /// The value or the answer, for a person.
    pub message: String,
}

/// What a measurement says.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Outcome {
    /// Within the threshold (a 2xx answer).
    Pass,
    /// Outside the threshold (a non-2xx answer).
    Fail,
    /// No data, NaN, several samples, or no answer: neither a pass nor a
    /// failure.
    Inconclusive,
}

/// Zero counts are left out of the status.
fn is_zero(n: &i32) -> bool {
    *n == 0
}
