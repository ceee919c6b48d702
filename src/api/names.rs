//! Names on the wire: annotations, labels, keys and the field manager.
//!
//! Every one of these is part of the compatibility contract with the earlier
//! Python operator or with users' manifests; changing one breaks clusters.

/// Field manager of every server-side apply the operator makes, and the
/// `reportingController` of its Events.
pub const FIELD_MANAGER: &str = "openmed-operator";

/// Field manager that holds `spec.replicas` for a moment while the
/// operator stops applying it (an autoscaler takes over, or the spec to
/// apply has no `replicas`): server-side apply removes a field its only
/// manager stops sending, and the API server would then default it to 1.
/// An autoscaler's first write takes the field from it, and the API
/// server drops a manager that owns nothing.
pub const REPLICAS_HANDOVER_FIELD_MANAGER: &str = "openmed-operator-handover";

/// Annotation on each Event: the OpenMedModel's `metadata.generation` it is
/// about, i.e. which change of the spec it belongs to.
pub const EVENT_GENERATION_ANNOTATION: &str = "openmed.ai/generation";

/// Annotation naming the owning resource, `<namespace>/<name>`, on the
/// ConfigMap, the Deployment and its pod template.
pub const MODEL_RESOURCE_ANNOTATION: &str = "openmed.ai/model-resource";

/// Pod-template annotation holding the manifest hash; changing it rolls pods.
pub const MANIFEST_HASH_ANNOTATION: &str = "openmed.ai/model-manifest-hash";

/// Annotation a user sets on an OpenMedModel to roll back to a retained version.
pub const ROLLBACK_TO_ANNOTATION: &str = "openmed.ai/rollback-to";

/// Annotation that explains why a known-failed version is tried again.
pub const RETRY_REASON_ANNOTATION: &str = "openmed.ai/retry-reason";

/// Label the operator puts on Deployments it manages, so it can watch only those.
pub const OPERATED_BY_LABEL: &str = "openmed.ai/operated-by";

/// Opt-in label a Deployment carries when `--require-target-label` is on.
pub const MANAGED_OPT_IN_LABEL: &str = "openmed.ai/managed";

/// Standard label on objects the operator creates.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

/// Label on a manifest snapshot ConfigMap and on the pod template that
/// references it, holding the snapshot's short hash. The Deployment
/// controller copies template labels to every ReplicaSet, so the operator
/// learns from ReplicaSet metadata alone which snapshots a revision needs.
pub const MANIFEST_SNAPSHOT_LABEL: &str = "openmed.ai/model-manifest";

/// Label on the ConfigMap naming the model family.
pub const FAMILY_LABEL: &str = "openmed.ai/model-family";

/// The container variable (and ConfigMap key) that tells the service which
/// model to preload before `/readyz` passes.
pub const PRELOAD_ENV: &str = "OPENMED_SERVICE_PRELOAD_MODELS";

/// The container variable that lists the model names the service answers
/// (its served set); a request naming any other model gets 422
/// `model_not_served`. The operator writes the model's own entries here
/// beside the preload variable (`plan::served`).
pub const SERVED_ENV: &str = "OPENMED_SERVICE_SERVED_MODELS";

/// Annotation `render` sets on a Deployment whose served set it writes:
/// the entries of that set that are the model's own versions, first the
/// one the template preloads. Git has no status to say which entries are
/// the model's, so the rendered Deployment carries it, and the next render
/// drops a version that has left the retained pair instead of keeping it
/// as someone else's name.
pub const SERVED_VERSIONS_ANNOTATION: &str = "openmed.ai/served-versions";

/// ConfigMap key holding the manifest.
pub const MANIFEST_KEY: &str = "manifest.json";

/// Finalizer that lets the operator release the target on deletion.
pub const FINALIZER: &str = "openmed.ai/release-target";

/// The finalizer the earlier (Kopf) operator puts on every resource it
/// handles. After a move to openmed-op nothing would remove it, and a
/// deletion would wait for ever: once openmed-op has released the target,
/// it removes this one with its own, or alone on a resource deleted before
/// openmed-op put its own on (`rollout::finalizers`).
pub const EARLIER_OPERATOR_FINALIZER: &str = "kopf.zalando.org/KopfFinalizerMarker";

/// Annotation that ends the current canary step now (any new value); a
/// value starting with `full` promotes past every remaining step. Acted on
/// once per value.
pub const CANARY_PROMOTE_ANNOTATION: &str = "openmed.ai/canary-promote";

/// Annotation that aborts the canary in progress (any new value). Acted on
/// once per value.
pub const CANARY_ABORT_ANNOTATION: &str = "openmed.ai/canary-abort";

/// Annotation that holds the canary at its step while it is present.
pub const CANARY_PAUSE_ANNOTATION: &str = "openmed.ai/canary-pause";

/// Annotation that fails the soak in progress (any new value): the
/// version rolls back as after any failed soak, and the fleet's next wave
/// never starts. Acted on once per value.
pub const SOAK_ABORT_ANNOTATION: &str = "openmed.ai/soak-abort";
