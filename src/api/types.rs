//! The `OpenMedModel` resource (`openmed.ai/v1alpha1`): spec and status types.
//!
//! These types are the API. The CRD is generated from them (`crd.rs`), and
//! their doc comments become the descriptions that `kubectl explain
//! openmedmodel.spec` prints, so they are written for the people who edit
//! these resources. Field names, defaults and status fields are wire
//! compatible with the earlier Python operator: a cluster can switch between
//! the two without a pod restart or lost rollback history.
//!
//! No type here uses `#[serde(deny_unknown_fields)]`: schemars would turn it
//! into `additionalProperties: false`, which the API server rejects in a
//! structural schema. Unknown fields are rejected by `validate` instead (and
//! by the API server's strict field validation).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::autoscaling::{Autoscaling, AutoscalingStatus};
use super::canary::{Canary, CanaryStatus};
use super::quality::QualityGate;
use super::rules;

/// The model an existing OpenMed REST Deployment serves, declared in Git.
///
/// The operator writes the model pointer into a ConfigMap it owns, points the
/// target container's `OPENMED_SERVICE_PRELOAD_MODELS` variable at it and
/// hashes the manifest into the pod template, so a version change rolls the
/// pods, which warm the model before `/readyz` passes. A version that never
/// becomes ready is rolled back to the last successful one.
// clippy reads the repeated `printcolumn(type_ = ...)` arguments as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "openmed.ai",
    version = "v1alpha1",
    kind = "OpenMedModel",
    namespaced,
    shortname = "omm",
    category = "all",
    status = "OpenMedModelStatus",
    derive = "PartialEq",
    doc = "OpenMedModel declares which model an existing OpenMed REST Deployment serves. The operator writes the model pointer into an owned ConfigMap, wires the target container's OPENMED_SERVICE_PRELOAD_MODELS variable to it, rolls the pods so they warm the model before /readyz passes, and rolls back to the last successful version when a rollout fails.",
    printcolumn(name = "Family", type_ = "string", json_path = ".spec.family"),
    printcolumn(name = "Tier", type_ = "string", json_path = ".spec.tier"),
    printcolumn(name = "Desired", type_ = "string", json_path = ".spec.version"),
    printcolumn(name = "Active", type_ = "string", json_path = ".status.activeVersion"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": rules::QUALITY_GATE_FAMILY_RULE,
        "message": rules::QUALITY_GATE_FAMILY_MESSAGE,
        "fieldPath": ".qualityGate",
        "reason": "FieldValueForbidden",
    },
    {
        "rule": rules::CANARY_PROBES_FAMILY_RULE,
        "message": rules::CANARY_PROBES_FAMILY_MESSAGE,
        "fieldPath": ".canary.analysis.probes",
        "reason": "FieldValueForbidden",
    },
]))]
pub struct OpenMedModelSpec {
    /// Model family to serve, for example `pii` or `disease-detection`: a
    /// letter followed by letters, digits, `.`, `_` or `-`, at most 63
    /// characters. `qualityGate` and canary `probes` judge `pii` models
    /// only (they score what `POST /pii/extract` finds).
    #[schemars(regex(pattern = rules::FAMILY_PATTERN))]
    pub family: String,

    /// Version pointer of the model to preload, for example
    /// `OpenMed/synthetic-pii-v2`: a model id the OpenMed service loads
    /// (`model` or `org/model`: letters, digits, `.`, `_`, `-`) or a path
    /// inside its pod. Changing it is a rollout. Pin a version by giving
    /// each one an id of its own, never a moving name such as `latest`;
    /// revisions and digests (`@`, `:`, `+`, `~`) are stored for
    /// compatibility with the earlier operator, but the service refuses
    /// them and openmed-op does not roll them out.
    #[schemars(regex(pattern = rules::VERSION_PATTERN))]
    pub version: String,

    /// Size tier of the model: one of Tiny, Small, Medium, Base, Large,
    /// XLarge, Accurate-XLarge.
    pub tier: Tier,

    /// Number of pods of the target Deployment (1 to 1000). Omit it to leave
    /// the Deployment's own replica count alone. Never written while a
    /// HorizontalPodAutoscaler scales the target (with `autoscaling` set,
    /// the autoscaler owns the count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub replicas: Option<i32>,

    /// How the target's pods are replaced when the model changes, and what
    /// happens when the new model fails to become ready.
    #[serde(default)]
    pub rollout_strategy: RolloutStrategy,

    /// The Deployment that serves the model. Defaults to a Deployment with the
    /// same name as this resource, container `openmed-service`.
    #[serde(default)]
    pub target_ref: TargetRef,

    /// Name of the ConfigMap that holds the model manifest. Defaults to
    /// `<name>-model-manifest`, shortened with a hash suffix when that is not a
    /// valid name. The operator creates and owns this ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = rules::DNS_SUBDOMAIN_PATTERN),
        length(max = rules::DNS_SUBDOMAIN_MAX)
    )]
    pub manifest_config_map_name: Option<String>,

    /// Try a new version on a canary Deployment with a share of the
    /// traffic before the stable Deployment gets it. The first version,
    /// and any change while this is unset, roll out directly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<Canary>,

    /// Judge each new pod on labelled probes before it serves: the pod
    /// template gets the readiness gate `openmed.ai/model-quality`, the
    /// operator sends the probe set to the pod's own `POST /pii/extract`
    /// once it is ready, and marks the gate passed only when the recall per
    /// label reaches `minRecall`. A pod that misses fails the rollout,
    /// which then rolls back as any failed rollout does. Needs the
    /// operator to reach pod addresses (docs/quality.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality_gate: Option<QualityGate>,

    /// Scale the target on the service's own load signals: the operator
    /// owns a HorizontalPodAutoscaler (named as this resource) that keeps
    /// about `queueDepthPerPod` queued and `inflightRequestsPerPod`
    /// in-flight requests per pod, between `minReplicas` and
    /// `maxReplicas`, and stops writing `replicas`. Removing it deletes the
    /// autoscaler and leaves the count where it was until `replicas` says
    /// otherwise. Needs a metrics adapter that serves the two gauges as
    /// pod metrics (docs/autoscaling.md). Editing it starts no rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,
}

/// Size tier of a model.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum Tier {
    /// The smallest models.
    Tiny,
    /// Small models.
    Small,
    /// Medium models.
    Medium,
    /// Base models.
    Base,
    /// Large models.
    Large,
    /// Extra large models.
    XLarge,
    /// The most accurate extra large models.
    #[serde(rename = "Accurate-XLarge")]
    AccurateXLarge,
}

impl Tier {
    /// The name as written in the resource.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Tiny => "Tiny",
            Tier::Small => "Small",
            Tier::Medium => "Medium",
            Tier::Base => "Base",
            Tier::Large => "Large",
            Tier::XLarge => "XLarge",
            Tier::AccurateXLarge => "Accurate-XLarge",
        }
    }
}

/// How the target's pods are replaced, and what happens on failure.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": rules::ZERO_ZERO_RULE,
    "message": rules::ZERO_ZERO_MESSAGE,
}]))]
pub struct RolloutStrategy {
    /// `RollingUpdate` (default) replaces pods gradually and keeps serving the
    /// old model until new pods are ready; `Recreate` stops all old pods
    /// first, for nodes that cannot hold two copies of a large model.
    #[serde(rename = "type", default)]
    pub type_: StrategyType,

    /// RollingUpdate only: how many pods may be unavailable during the
    /// rollout, as a number or a percentage (`0%` to `100%`). Default 0, so
    /// capacity never drops while the new model warms.
    #[serde(default = "default_max_unavailable")]
    #[schemars(schema_with = "int_or_percent_schema")]
    pub max_unavailable: IntOrString,

    /// RollingUpdate only: how many extra pods may be created during the
    /// rollout, as a number or a percentage (`0%` to `100%`). Default 1.
    #[serde(default = "default_max_surge")]
    #[schemars(schema_with = "int_or_percent_schema")]
    pub max_surge: IntOrString,

    /// Seconds the new model may take to become ready before the rollout is
    /// declared failed (the Deployment's `progressDeadlineSeconds`). Must exceed
    /// the target's `minReadySeconds`. Default 600.
    #[serde(default = "default_progress_deadline")]
    #[schemars(range(min = 1))]
    pub progress_deadline_seconds: i32,

    /// Roll back to the last successful version when a rollout fails.
    /// Default true.
    #[serde(default = "default_true")]
    pub rollback_on_failure: bool,

    /// Fail the rollout at once, without waiting out
    /// progressDeadlineSeconds, when a pod of the new template keeps
    /// crashing (a model that cannot load ends the service before it is
    /// ready, and the kubelet restarts it with a growing back-off). Default:
    /// on, after 2 restarts. Either way the failure quotes the service's own
    /// start-up error from the container's termination message, and no
    /// other line of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_fast: Option<FailFast>,

    /// Seconds to keep judging a new version after it is Ready before
    /// the condition `Soaked` turns True for it: its pods stay ready, the
    /// rolled-out template's containers do not restart, the quality
    /// gate's verdicts stand, and a canary's metrics keep passing on the
    /// stable backend. A failure during the soak rolls back as a failed
    /// rollout does. Fleet waves wait for `Soaked` (docs/fleet.md).
    /// Default 0: `Soaked` turns True with `Ready`. Editing it starts no
    /// rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = rules::SOAK_SECONDS_MAX))]
    pub soak_seconds: Option<i32>,
}

/// When a crash-looping pod of the new template fails a rollout.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailFast {
    /// Fail fast at all. Default true; false waits for
    /// progressDeadlineSeconds, as a plain Deployment does.
    #[serde(default = "default_true")]
    pub enabled: bool,

    /// Restarts of the target container in one pod of the new template
    /// that fail the rollout. Default 2.
    #[serde(default = "default_fail_fast_restarts")]
    #[schemars(range(min = 1))]
    pub restarts: i32,
}

impl RolloutStrategy {
    /// The restarts that fail a rollout at once, or `None` when fail-fast
    /// is off.
    pub fn fail_fast_restarts(&self) -> Option<i32> {
        match &self.fail_fast {
            None => Some(DEFAULT_FAIL_FAST_RESTARTS),
            Some(f) if f.enabled => Some(f.restarts),
            Some(_) => None,
        }
    }
}

/// Restarts of one container after which a rollout fails fast, unless
/// `rolloutStrategy.failFast` says otherwise.
pub const DEFAULT_FAIL_FAST_RESTARTS: i32 = 2;

fn default_fail_fast_restarts() -> i32 {
    DEFAULT_FAIL_FAST_RESTARTS
}

impl Default for RolloutStrategy {
    fn default() -> Self {
        Self {
            type_: StrategyType::default(),
            max_unavailable: default_max_unavailable(),
            max_surge: default_max_surge(),
            progress_deadline_seconds: default_progress_deadline(),
            rollback_on_failure: true,
            fail_fast: None,
            soak_seconds: None,
        }
    }
}

/// Deployment strategy used to replace the target's pods.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum StrategyType {
    /// Replace pods gradually.
    #[default]
    RollingUpdate,
    /// Stop all old pods before starting new ones.
    Recreate,
}

impl StrategyType {
    /// The name as written in the resource.
    pub fn as_str(self) -> &'static str {
        match self {
            StrategyType::RollingUpdate => "RollingUpdate",
            StrategyType::Recreate => "Recreate",
        }
    }
}

/// The Deployment and container that serve the model.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// Name of the Deployment in this namespace. Defaults to the name of this
    /// OpenMedModel. The operator never creates or deletes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = rules::DNS_SUBDOMAIN_PATTERN),
        length(max = rules::DNS_SUBDOMAIN_MAX)
    )]
    pub name: Option<String>,

    /// Name of the container that runs the OpenMed service. Default
    /// `openmed-service`.
    #[serde(default = "default_container_name")]
    #[schemars(
        regex(pattern = rules::DNS_LABEL_PATTERN),
        length(max = rules::DNS_LABEL_MAX)
    )]
    pub container_name: String,
}

impl Default for TargetRef {
    fn default() -> Self {
        Self {
            name: None,
            container_name: default_container_name(),
        }
    }
}

/// What the operator observed and did, written only by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OpenMedModelStatus {
    /// The `metadata.generation` this status describes. Equal to the current
    /// generation once the operator has seen the latest change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Lifecycle phase: Pending, RollingOut, Canary, Ready, Failed or
    /// RolledBack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// The version `spec.version` asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_version: Option<String>,

    /// The version the target's available pods serve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_version: Option<String>,

    /// Hash of the normalized spec that `spec` asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_spec_hash: Option<String>,

    /// Hash of the normalized spec last written to the target (differs from
    /// `desiredSpecHash` after a rollback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_spec_hash: Option<String>,

    /// Hash of the normalized spec whose rollout failed; it is not retried
    /// until the spec changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_spec_hash: Option<String>,

    /// Hash of the manifest written to the ConfigMap, as found in the pod
    /// template annotation `openmed.ai/model-manifest-hash`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,

    /// The Deployment `metadata.generation` produced by the operator's last
    /// write; progress is judged against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_deployment_generation: Option<i64>,

    /// When the operator last changed the target's pods (a rollout or a
    /// rollback). Deployment conditions from before it describe an older
    /// rollout and are not held against this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rollout_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,

    /// Number of rollbacks performed for this resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_count: Option<i64>,

    /// The rollback in effect: `automatic:<version>` or `manual:<version>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_request: Option<String>,

    /// The normalized spec of the last successful rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_spec: Option<OpenMedModelSpec>,

    /// The normalized spec of the successful rollout before the last one.
    /// With `lastSuccessfulSpec`, the only versions a manual rollback accepts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_successful_spec: Option<OpenMedModelSpec>,

    /// The normalized spec a rollback restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_spec: Option<OpenMedModelSpec>,

    /// Standard conditions: Ready, Progressing, Degraded, RolledBack,
    /// Reconciling and Stalled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The canary in progress, or the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryStatus>,

    /// The soak of the version last rolled out: running, or over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak: Option<SoakStatus>,

    /// The HorizontalPodAutoscaler `spec.autoscaling` asks for, as last
    /// observed: the pods it counts and the pods it asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingStatus>,
}

impl OpenMedModelStatus {
    /// The spec the stable Deployment serves once its rollout is done: the
    /// version soaking on the applied template while it soaks, else the
    /// last successful one. What a canary's stable side is, soaking or not.
    pub fn stable_spec(&self) -> Option<&OpenMedModelSpec> {
        self.soak
            .as_ref()
            .filter(|s| {
                s.soaked_time.is_none()
                    && self.applied_spec_hash.as_deref() == Some(s.spec_hash.as_str())
            })
            .and_then(|s| s.spec.as_ref())
            .or(self.last_successful_spec.as_ref())
    }

    /// Every spec the status holds, whose objects (snapshots, served
    /// names) the operator keeps: the retained pair, the spec a rollback
    /// restored, and the version soaking.
    pub fn known_specs(&self) -> impl Iterator<Item = &OpenMedModelSpec> {
        [
            self.last_successful_spec.as_ref(),
            self.previous_successful_spec.as_ref(),
            self.rollback_spec.as_ref(),
            self.soak.as_ref().and_then(|s| s.spec.as_ref()),
        ]
        .into_iter()
        .flatten()
    }
}

/// A version judged for `rolloutStrategy.soakSeconds` after it turned
/// Ready. Until it has soaked it is not yet `lastSuccessfulSpec`: a
/// failure during the soak rolls back to the version before it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SoakStatus {
    /// The version soaking.
    pub version: String,

    /// Hash of the normalized spec soaking (`appliedSpecHash` when the
    /// soak began).
    pub spec_hash: String,

    /// The normalized spec soaking: what the stable Deployment serves
    /// while it soaks, though it is not yet `lastSuccessfulSpec`. A canary
    /// started meanwhile compares with it, and the canary Deployment at
    /// rest serves it. Kept as the operator wrote it (the schema of a
    /// spec is `spec`'s, and is not repeated here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "written_spec_schema")]
    pub spec: Option<OpenMedModelSpec>,

    /// When the version turned Ready and the soak began.
    pub start_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,

    /// When the soak ends, if nothing fails before.
    pub end_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,

    /// When it soaked; unset while it runs or after it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soaked_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,

    /// The value of `openmed.ai/soak-abort` last acted on: a value is
    /// acted on once, so a later soak is not aborted by an old request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_handled: Option<String>,

    /// When the canary's analysis (`spec.canary.analysis`: its metrics and
    /// webhooks, asked about the stable backend, which now serves the
    /// version) was last measured during this soak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,

    /// The analysis's failed measurements during this soak; one more than
    /// its `failureLimit` fails the soak.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed_measurements: i32,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// Lifecycle phase of an OpenMedModel.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// Not yet acted on, or waiting for its target.
    Pending,
    /// A new model is being rolled out.
    RollingOut,
    /// A new model is tried on the canary Deployment.
    Canary,
    /// The desired model is served by all pods.
    Ready,
    /// A rollout failed and nothing could be restored.
    Failed,
    /// A rollout failed and the last successful model was restored.
    RolledBack,
}

impl Phase {
    /// The name as written in the status.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::RollingOut => "RollingOut",
            Phase::Canary => "Canary",
            Phase::Ready => "Ready",
            Phase::Failed => "Failed",
            Phase::RolledBack => "RolledBack",
        }
    }
}

fn default_max_unavailable() -> IntOrString {
    IntOrString::Int(0)
}

fn default_max_surge() -> IntOrString {
    IntOrString::Int(1)
}

fn default_progress_deadline() -> i32 {
    600
}

fn default_true() -> bool {
    true
}

pub(super) fn default_container_name() -> String {
    "openmed-service".to_owned()
}

/// Schema of `maxSurge` / `maxUnavailable`: an integer ≥ 0 or a percentage.
///
/// The API server accepts an int-or-string field only as
/// `x-kubernetes-int-or-string` with `anyOf: [integer, string]`, optionally
/// inside `allOf`. Value checks may not go inside that `anyOf`, so the
/// percent pattern and the minimum sit beside it in the `allOf`: `pattern`
/// applies only to strings and `minimum` only to numbers.
/// A normalized spec the operator keeps in the status for itself: an
/// object the API server stores as written.
fn written_spec_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

fn int_or_percent_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
        "allOf": [
            { "anyOf": [{ "type": "integer" }, { "type": "string" }] },
            { "pattern": rules::PERCENT_PATTERN },
            { "minimum": 0 }
        ]
    })
}
