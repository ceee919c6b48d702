//! From a valid spec, the exact objects to write. Pure and deterministic:
//! same input, same bytes, always.
//!
//! `render` prints a [`Plan`] and the operator applies it, so what a GitOps
//! diff shows is what the operator writes. The values match the earlier
//! Python operator byte for byte (see the wire-compatibility vectors).

pub mod autoscaler;
pub mod canonical;
mod config_map;
mod deployment;
pub mod served;

use serde::Serialize;
use serde_json::json;

pub use config_map::{config_map, owned_by_target, snapshot, snapshot_name, snapshot_suffix};
// The rollout tests' API server keeps a field another field list holds.
#[cfg(test)]
pub(crate) use deployment::held_by_another;
pub use deployment::{ContainerNotFound, DeploymentFields, Preload};

use crate::api::{API_VERSION, Canary, OpenMedModelSpec, TargetRef};
use canonical::{hex, sha256_tag, to_canonical_json};

/// The resource a plan is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceId {
    /// Namespace of the OpenMedModel (and of its target and ConfigMap).
    pub namespace: String,
    /// Name of the OpenMedModel.
    pub name: String,
    /// UID, when the resource exists in a cluster: the ConfigMap's owner reference needs it.
    pub uid: Option<String>,
}

impl ResourceId {
    /// `<namespace>/<name>`, the value of the ownership annotation.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The resource as the controlling owner of an object it makes, when
    /// its UID is known: the garbage collector then removes the object
    /// with the resource, even if the operator is not running.
    pub fn owner_references(
        &self,
    ) -> Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>> {
        let uid = self.uid.as_ref()?;
        Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: API_VERSION.to_owned(),
                kind: crate::api::KIND.to_owned(),
                name: self.name.clone(),
                uid: uid.clone(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
        ])
    }
}

/// Facts about the target that change what is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetOptions {
    /// A HorizontalPodAutoscaler scales the target: `replicas` is left to it.
    pub autoscaled: bool,
}

/// Everything the operator writes for one resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The resource.
    pub resource: ResourceId,
    /// The spec with every default filled in, as kept in status.
    pub normalized: OpenMedModelSpec,
    /// `sha256:` hash of the normalized spec (`status.desiredSpecHash`).
    pub spec_hash: String,
    /// Exact value of the ConfigMap key `manifest.json`.
    pub manifest_json: String,
    /// Pod-template annotation value (`status.manifestHash`).
    pub manifest_hash: String,
    /// The pointer ConfigMap (`<name>-model-manifest`), for people.
    pub config_map: k8s_openapi::api::core::v1::ConfigMap,
    /// The immutable snapshot of this manifest, which the pod template
    /// references.
    pub snapshot: k8s_openapi::api::core::v1::ConfigMap,
    /// The Deployment fields the operator owns.
    pub deployment: DeploymentFields,
}

/// Plans the objects for `spec` (already validated).
pub fn plan(resource: &ResourceId, spec: &OpenMedModelSpec, target: TargetOptions) -> Plan {
    let normalized = normalize(&resource.name, spec);
    let manifest = manifest(&normalized);
    let manifest_hash = manifest_hash_of(&manifest);
    let manifest_json = format!("{}\n", to_canonical_json(&manifest));
    let config_map = config_map(resource, &normalized, &manifest_json);
    let snapshot = snapshot(resource, &normalized, &manifest_json, &manifest_hash);
    let deployment = DeploymentFields::managed(resource, &normalized, &manifest_hash, target);
    Plan {
        resource: resource.clone(),
        spec_hash: spec_hash(&normalized),
        manifest_json,
        manifest_hash,
        config_map,
        snapshot,
        deployment,
        normalized,
    }
}

/// Plans `spec` (normalized) for the canary Deployment `canary` names:
/// the same manifest and snapshot as for the stable target, the canary's
/// name and container, and never its replicas (the canary is scaled by
/// its owner).
pub fn canary_plan(resource: &ResourceId, spec: &OpenMedModelSpec, canary: &Canary) -> Plan {
    let mut spec = spec.clone();
    spec.target_ref = TargetRef {
        name: Some(canary.target_ref.name.clone()),
        container_name: canary.target_ref.container_name.clone(),
    };
    spec.replicas = None;
    plan(resource, &spec, TargetOptions::default())
}

/// `retained`, a spec that once succeeded, placed where `current` puts its
/// model: the same target Deployment, container and pointer ConfigMap. A
/// rollback restores the last good model on the Deployment the spec names
/// now; the retained spec's own `targetRef` may name a Deployment the
/// resource has since let go of, or one that no longer exists.
pub fn placed_as(retained: &OpenMedModelSpec, current: &OpenMedModelSpec) -> OpenMedModelSpec {
    let mut placed = retained.clone();
    placed.target_ref = current.target_ref.clone();
    placed.manifest_config_map_name = current.manifest_config_map_name.clone();
    placed
}

/// The spec with every default filled in: the target defaults to the
/// resource's name, the ConfigMap name is resolved. Idempotent.
///
/// `canary`, `rolloutStrategy.soakSeconds` and `autoscaling` are left
/// out: they say how a version is tried or how many pods serve it, not
/// what the target serves, so editing them is no rollout, and the specs kept in the
/// status (the rollback targets) and their hashes stay as they were.
pub fn normalize(name: &str, spec: &OpenMedModelSpec) -> OpenMedModelSpec {
    let mut normalized = spec.clone();
    let target_name = spec
        .target_ref
        .name
        .clone()
        .unwrap_or_else(|| name.to_owned());
    normalized.target_ref = TargetRef {
        name: Some(target_name),
        container_name: spec.target_ref.container_name.clone(),
    };
    normalized.manifest_config_map_name = Some(config_map_name(name, spec));
    normalized.canary = None;
    // Like the canary, the soak says how long a version is judged, not
    // what the target serves.
    normalized.rollout_strategy.soak_seconds = None;
    normalized.autoscaling = None;
    normalized
}

/// `sha256:` hash of the canonical JSON of a normalized spec.
pub fn spec_hash(normalized: &OpenMedModelSpec) -> String {
    sha256_tag(to_canonical_json(&to_json(normalized)).as_bytes())
}

/// Name of the owned ConfigMap: `spec.manifestConfigMapName`, else
/// `<name>-model-manifest` when that is a valid name, else a shortened name
/// with a hash suffix (the earlier operator's rule, kept exactly).
pub fn config_map_name(name: &str, spec: &OpenMedModelSpec) -> String {
    if let Some(explicit) = &spec.manifest_config_map_name {
        return explicit.clone();
    }
    let plain = format!("{name}-model-manifest");
    if crate::api::rules::is_dns_subdomain_with_short_labels(&plain) {
        return plain;
    }
    let digest = hex(&sha2::Sha256::digest(plain.as_bytes()));
    let keep = 63 - "model-manifest".len() - 10 - 2;
    let prefix: String = name.replace('.', "-").chars().take(keep).collect();
    format!(
        "{}-model-manifest-{}",
        prefix.trim_end_matches('-'),
        &digest[..10]
    )
}

use sha2::Digest as _;

/// The model manifest the service reads.
fn manifest(normalized: &OpenMedModelSpec) -> serde_json::Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": "OpenMedModelManifest",
        "models": [{
            "family": normalized.family,
            "tier": normalized.tier.as_str(),
            "version": normalized.version,
        }],
    })
}

fn manifest_hash_of(manifest: &serde_json::Value) -> String {
    sha256_tag(to_canonical_json(manifest).as_bytes())
}

/// Hash of a manifest that preloads nothing: the pod-template annotation of
/// a released target, so its pods restart without a preloaded model.
pub fn released_manifest_hash() -> String {
    manifest_hash_of(&json!({
        "apiVersion": API_VERSION,
        "kind": "OpenMedModelManifest",
        "models": [],
    }))
}

fn to_json<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).expect("API types serialize to JSON")
}
