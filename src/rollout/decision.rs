//! What `decide` returns: the writes to carry out, the status, the
//! events, and when to look again; and the reasons conditions and events
//! carry. The shells read these and nothing else of the core's reasoning.

use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::Value;

use crate::api::OpenMedModelStatus;

/// What to do.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The status the resource should have; write it if it differs.
    pub status: OpenMedModelStatus,
    /// Writes to carry out, in order.
    pub writes: Vec<Write>,
    /// Events to record on the resource.
    pub events: Vec<Event>,
    /// Look again after this long even if nothing changes (a deadline).
    pub requeue_after: Option<Duration>,
    /// Deletion only: every Deployment is released and every owned
    /// ConfigMap deleted, so the finalizer may be removed.
    pub finished: bool,
    /// The decision gives up on a rollout or a rollback (it rolls back, or
    /// ends in `Failed`) on what the target Deployment showed. Both are
    /// final for a version, and the caches can hold a Deployment many
    /// seconds old (a cut watch re-listing), so the shell carries such a
    /// decision out only once it was made on a live read of the target.
    pub needs_live_reads: bool,
}

/// One write to the cluster.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Server-side apply of the owned ConfigMap.
    ApplyConfigMap(Box<ConfigMap>),
    /// Delete an owned ConfigMap (with a UID precondition when known). Only
    /// decided once nothing can still read it: no pod of a template that
    /// references it remains, and no ReplicaSet or retained spec needs it.
    DeleteConfigMap {
        /// Its name.
        name: String,
        /// Its UID, so a ConfigMap recreated since is not deleted.
        uid: Option<String>,
    },
    /// Server-side apply of the resource's own HorizontalPodAutoscaler
    /// (`spec.autoscaling`).
    ApplyAutoscaler(Box<HorizontalPodAutoscaler>),
    /// Delete the resource's own HorizontalPodAutoscaler, `spec.autoscaling`
    /// removed (with a UID precondition when known, so one re-created
    /// since by somebody else stays).
    DeleteAutoscaler {
        /// Its name.
        name: String,
        /// Its UID.
        uid: Option<String>,
    },
    /// Server-side apply of the resource's own KEDA ScaledObject
    /// (`spec.autoscaling.keda`), as JSON.
    ApplyScaledObject(Box<Value>),
    /// Delete the resource's own ScaledObject (with a UID precondition
    /// when known); KEDA then deletes the autoscaler it made from it.
    DeleteScaledObject {
        /// Its name.
        name: String,
        /// Its UID.
        uid: Option<String>,
    },
    /// A JSON merge patch of a Deployment, for the one change server-side
    /// apply cannot make (see `DeploymentFields::strategy_reset`).
    MergePatchDeployment {
        /// The Deployment's name.
        name: String,
        /// The merge patch.
        patch: Value,
    },
    /// A strategic-merge patch of a Deployment, sent before a release's
    /// apply: removes the marks another field manager holds (see
    /// `DeploymentFields::release_reset`).
    StrategicPatchDeployment {
        /// The Deployment's name.
        name: String,
        /// The strategic-merge patch.
        patch: Value,
    },
    /// A JSON Patch of an HTTPRoute's two backend weights; its `test`
    /// operations make it fail whole on a route that changed meanwhile.
    PatchRoute {
        /// The HTTPRoute's name.
        name: String,
        /// The JSON Patch (an array of operations).
        patch: Value,
    },
    /// Before an [`Write::ApplyDeployment`] that stops sending
    /// `spec.replicas` (an autoscaler scales the target, or the spec to
    /// apply has none) while the operator's apply owns it: a server-side
    /// apply of only `replicas`, at the value the Deployment has, by
    /// [`REPLICAS_HANDOVER_FIELD_MANAGER`] and without force. The field
    /// keeps an owner, so its value never changes: server-side apply
    /// removes a field its only manager stops sending, and the API server
    /// then defaults `replicas` to 1. A conflict means another manager
    /// changed it meanwhile and holds it: nothing is left to hand over.
    ///
    /// [`REPLICAS_HANDOVER_FIELD_MANAGER`]: crate::api::names::REPLICAS_HANDOVER_FIELD_MANAGER
    HandOverReplicas {
        /// The Deployment's name.
        name: String,
        /// Its `spec.replicas` as observed.
        replicas: i32,
    },
    /// The quality gate's condition on a pod it judged
    /// ([`QUALITY_CONDITION`]), set with a strategic merge on the pod's
    /// `status.conditions` (keyed by type), its time the decision's.
    ///
    /// [`QUALITY_CONDITION`]: crate::api::quality::QUALITY_CONDITION
    MarkPod {
        /// The pod's name.
        name: String,
        /// `True`: the pod passed; `False`: it failed.
        passed: bool,
        /// `QualityGatePassed` or `QualityGateFailed`.
        reason: &'static str,
        /// The figures, and what missed.
        message: String,
    },
    /// Server-side apply of the owned fields of a Deployment.
    ApplyDeployment {
        /// The Deployment's name.
        name: String,
        /// The apply body.
        body: Value,
        /// A release: a Deployment that no longer exists needs none, so
        /// "not found" is success. Any other error fails the reconcile,
        /// and nothing that depends on the release (deleting the
        /// ConfigMaps it read, dropping the finalizer) happens before it.
        release: bool,
    },
}

impl Decision {
    /// The writes split around the status that records this decision's
    /// intent: those that may go out alongside it (the leading writes that
    /// nothing reads until a later one names them), and those that wait
    /// until it is stored.
    pub fn writes_around_intent(&self) -> (&[Write], &[Write]) {
        let alongside = self
            .writes
            .iter()
            .take_while(|w| w.unread_until_named())
            .count();
        self.writes.split_at(alongside)
    }
}

impl Write {
    /// Whether nothing reads what this write makes until a later write
    /// names it: a new immutable snapshot, which pods see only once the
    /// Deployment's template references it. Such a write may go out
    /// alongside the status that records the decision's intent instead of
    /// after it: if that status is refused or the operator stops between
    /// the two, all that is left is a snapshot nobody references, which
    /// the next decision writes again (the same name and content) or
    /// tidies with the others.
    pub fn unread_until_named(&self) -> bool {
        matches!(self, Write::ApplyConfigMap(cm) if cm.immutable == Some(true))
    }
}

/// Kubernetes event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Normal
    Normal,
    /// Warning
    Warning,
}

/// An event about the resource. Messages carry lifecycle state only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Normal or Warning.
    pub type_: EventType,
    /// CamelCase reason, e.g. `RolloutStarted`.
    pub reason: &'static str,
    /// What happened.
    pub message: String,
}

/// Event and condition reasons.
pub mod reason {
    /// A rollout began.
    pub const ROLLOUT_STARTED: &str = "RolloutStarted";
    /// A rollout finished.
    pub const ROLLOUT_SUCCEEDED: &str = "RolloutSucceeded";
    /// A rollout failed.
    pub const ROLLOUT_FAILED: &str = "RolloutFailed";
    /// A rollback began.
    pub const ROLLBACK_STARTED: &str = "RollbackStarted";
    /// A rollback finished.
    pub const ROLLBACK_SUCCEEDED: &str = "RollbackSucceeded";
    /// A rollback failed.
    pub const ROLLBACK_FAILED: &str = "RollbackFailed";
    /// A manual rollback named a version that is not retained.
    pub const ROLLBACK_REJECTED: &str = "RollbackRejected";
    /// Condition reason for a rejected manual rollback.
    pub const ROLLBACK_TARGET_UNAVAILABLE: &str = "RollbackTargetUnavailable";
    /// Another writer changed owned fields; they were restored.
    pub const DRIFT_CORRECTED: &str = "DriftCorrected";
    /// The target Deployment does not exist.
    pub const TARGET_NOT_FOUND: &str = "TargetNotFound";
    /// The target lacks the opt-in label that `--require-target-label` asks for.
    pub const TARGET_NOT_OPTED_IN: &str = "TargetNotOptedIn";
    /// The target has no container of the configured name.
    pub const CONTAINER_NOT_FOUND: &str = "ContainerNotFound";
    /// Another OpenMedModel owns the target or the ConfigMap name.
    pub const TARGET_CONFLICT: &str = "TargetConflict";
    /// The spec fails validation.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The target is paused.
    pub const DEPLOYMENT_PAUSED: &str = "DeploymentPaused";
    /// A Deployment the resource no longer targets was released.
    pub const TARGET_RELEASED: &str = "TargetReleased";
    /// A rollout is under way.
    pub const ROLLING_OUT: &str = "RollingOut";
    /// A rollback is under way.
    pub const ROLLING_BACK: &str = "RollingBack";
    /// Automatic rollback done; the spec still asks for the failed version.
    pub const ROLLED_BACK: &str = "RolledBack";
    /// A manual rollback is in effect.
    pub const MANUAL_ROLLBACK: &str = "ManualRollback";
    /// The rollout completed.
    pub const ROLLOUT_COMPLETE: &str = "RolloutComplete";
    /// The rollback completed.
    pub const ROLLBACK_COMPLETE: &str = "RollbackComplete";
    /// No rollback in progress.
    pub const ROLLBACK_IN_PROGRESS: &str = "RollbackInProgress";
    /// Serving as asked.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// Condition reason the shell sets while it retries after an error
    /// (an API error, a timeout): cleared by the next decision.
    pub const RETRYING_AFTER_ERROR: &str = "RetryingAfterError";
    /// A Ready version is judged for `rolloutStrategy.soakSeconds`.
    pub const SOAKING: &str = "Soaking";
    /// A version soaked (an Event, and the reason of `Soaked=True`).
    pub const SOAKED: &str = "Soaked";
    /// A soak failed: a pod lost readiness, a container restarted, the
    /// quality gate failed a pod, or an analysis metric failed.
    pub const SOAK_FAILED: &str = "SoakFailed";
    /// `openmed.ai/soak-abort` failed the soak.
    pub const SOAK_ABORTED: &str = "SoakAborted";
    /// A new value of `openmed.ai/soak-abort` found no soak running: it
    /// acts on nothing, then or later.
    pub const SOAK_ABORT_IGNORED: &str = "SoakAbortIgnored";
    /// `Soaked=False` while the version `spec.version` asks for is not
    /// the one served yet (a rollout, a canary, a rollback, a block).
    pub const NOT_SERVED_YET: &str = "NotServedYet";
    /// A canary began.
    pub const CANARY_STARTED: &str = "CanaryStarted";
    /// The canary pods warm the new model; no traffic yet.
    pub const CANARY_WARMING: &str = "CanaryWarming";
    /// A canary step holds, measures or moves on.
    pub const CANARY_PROGRESSING: &str = "CanaryProgressing";
    /// With an autoscaler, the canary Deployment scales to the next
    /// step's share of the stable pods before the weights move.
    pub const CANARY_SCALING: &str = "CanaryScaling";
    /// The canary's weights moved to a step.
    pub const CANARY_WEIGHT_CHANGED: &str = "CanaryWeightChanged";
    /// The canary waits for a person (a step without a pause, or
    /// `openmed.ai/canary-pause`).
    pub const CANARY_PAUSED: &str = "CanaryPaused";
    /// `openmed.ai/canary-promote` ended a step.
    pub const CANARY_PROMOTED_BY_HAND: &str = "CanaryPromotedByHand";
    /// Every step passed; the stable target rolls.
    pub const CANARY_PROMOTING: &str = "CanaryPromoting";
    /// The stable target serves the canary's version.
    pub const CANARY_PROMOTED: &str = "CanaryPromoted";
    /// The canary stopped and its weights went back.
    pub const CANARY_ABORTED: &str = "CanaryAborted";
    /// The canary Deployment is missing, is the stable one, has no
    /// replicas or no container of the configured name.
    pub const CANARY_TARGET_INVALID: &str = "CanaryTargetInvalid";
    /// The HTTPRoute, its rule or a backend is missing or ambiguous.
    pub const ROUTE_INVALID: &str = "RouteInvalid";
    /// Another writer changed the canary's weights.
    pub const ROUTE_DRIFT: &str = "RouteDrift";
    /// A measurement failed its threshold.
    pub const ANALYSIS_FAILED: &str = "AnalysisFailed";
    /// The latest round of measurements had no usable data.
    pub const ANALYSIS_INCONCLUSIVE: &str = "AnalysisInconclusive";
    /// A deletion waits until no pod can read the model ConfigMaps.
    pub const DELETION_WAITING: &str = "DeletionWaiting";
    /// The canary Deployment of a canary that ended gets no more requests:
    /// it may serve the stable version again.
    pub const CANARY_DRAINED: &str = "CanaryDrained";
    /// The wait for the data plane to stop sending the canary Deployment
    /// requests ran out (`spec.canary.drain.timeout`); it moves back anyway.
    pub const CANARY_DRAIN_TIMED_OUT: &str = "CanaryDrainTimedOut";
    /// An analysis endpoint is not one `--analysis-allow` allows: nothing
    /// is asked, and the step holds.
    pub const ANALYSIS_ENDPOINT_NOT_ALLOWED: &str = "AnalysisEndpointNotAllowed";
    /// A reconcile succeeded after [`RETRYING_AFTER_ERROR`], on a path
    /// that sets no other `Reconciling` reason.
    pub const ERROR_RESOLVED: &str = "ErrorResolved";
    /// A pod of the new template restarted `rolloutStrategy.failFast`
    /// times: the rollout failed before its progress deadline.
    pub const CRASH_LOOP: &str = "CrashLoop";
    /// A pod of the new template failed the quality gate
    /// (`spec.qualityGate`): the rollout failed before its progress
    /// deadline. Also the reason of the gate's Event on each judged pod.
    pub const QUALITY_GATE_FAILED: &str = "QualityGateFailed";
    /// A pod passed the quality gate.
    pub const QUALITY_GATE_PASSED: &str = "QualityGatePassed";
    /// The quality gate could not judge a pod (no answer, no probe set):
    /// it stays unready and is probed again.
    pub const QUALITY_GATE_INCONCLUSIVE: &str = "QualityGateInconclusive";
    /// The quality gate has no port to ask the service at: the container
    /// declares none and no httpGet probe names one. Nothing is written
    /// until it does, since no gated pod could ever become Ready.
    pub const QUALITY_GATE_PORT_UNKNOWN: &str = "QualityGatePortUnknown";
    /// The target's served set (`OPENMED_SERVICE_SERVED_MODELS`) cannot
    /// answer the version: read from a ConfigMap or Secret, or applied by
    /// another tool without it. Nothing is written until it can.
    pub const SERVED_SET_REFUSED: &str = "ServedSetRefused";
    /// `spec.version` has a character the earlier operator accepted and
    /// the service refuses (`api::rules::version_refusal`).
    pub const VERSION_NOT_A_MODEL_ID: &str = "VersionNotAModelId";
}

/// The `action` of an `events.k8s.io/v1` Event: what the operator was doing
/// about the resource when the event happened, one word per kind of work.
pub fn action(event_reason: &str) -> &'static str {
    use reason::*;
    match event_reason {
        ROLLOUT_STARTED | ROLLOUT_SUCCEEDED | ROLLOUT_FAILED => "Rollout",
        ROLLBACK_STARTED | ROLLBACK_SUCCEEDED | ROLLBACK_FAILED | ROLLBACK_REJECTED => "Rollback",
        CANARY_STARTED
        | CANARY_WARMING
        | CANARY_PROGRESSING
        | CANARY_SCALING
        | CANARY_WEIGHT_CHANGED
        | CANARY_PAUSED
        | CANARY_PROMOTED_BY_HAND
        | CANARY_PROMOTING
        | CANARY_PROMOTED
        | CANARY_ABORTED
        | CANARY_DRAINED
        | CANARY_DRAIN_TIMED_OUT
        | CANARY_TARGET_INVALID
        | ROUTE_INVALID
        | ROUTE_DRIFT
        | ANALYSIS_FAILED
        | ANALYSIS_INCONCLUSIVE
        | ANALYSIS_ENDPOINT_NOT_ALLOWED => "Canary",
        QUALITY_GATE_FAILED
        | QUALITY_GATE_PASSED
        | QUALITY_GATE_INCONCLUSIVE
        | QUALITY_GATE_PORT_UNKNOWN => "QualityGate",
        DRIFT_CORRECTED => "RestoreOwnedFields",
        TARGET_RELEASED => "Release",
        _ => "Reconcile",
    }
}
