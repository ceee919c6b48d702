//! The ConfigMaps that hold the model manifest.
//!
//! Two kinds, with the same data: the *pointer* (`<name>-model-manifest`,
//! the earlier operator's name and bytes), which people inspect, and the
//! immutable *snapshot* of one manifest (`<pointer>-<short hash>`), which a
//! pod template references. A container resolves `configMapKeyRef` when it
//! starts, so only an object that never changes can promise that a pod
//! recreated at any time loads the model of its own template.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::ResourceId;
use crate::api::OpenMedModelSpec;
use crate::api::names::{
    FAMILY_LABEL, FIELD_MANAGER, MANAGED_BY_LABEL, MANIFEST_KEY, MANIFEST_SNAPSHOT_LABEL,
    MODEL_RESOURCE_ANNOTATION, PRELOAD_ENV,
};

/// The owned ConfigMap for a normalized spec. It carries an owner reference
/// when the resource's UID is known, so the garbage collector removes it
/// with the resource even if the operator is not running.
pub fn config_map(
    resource: &ResourceId,
    normalized: &OpenMedModelSpec,
    manifest_json: &str,
) -> ConfigMap {
    let name = pointer_name(normalized);
    let owner_references = resource.owner_references();
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(resource.namespace.clone()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_owned(), FIELD_MANAGER.to_owned()),
                (FAMILY_LABEL.to_owned(), normalized.family.clone()),
            ])),
            annotations: Some(BTreeMap::from([(
                MODEL_RESOURCE_ANNOTATION.to_owned(),
                resource.key(),
            )])),
            owner_references,
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            (MANIFEST_KEY.to_owned(), manifest_json.to_owned()),
            (PRELOAD_ENV.to_owned(), normalized.version.clone()),
        ])),
        ..ConfigMap::default()
    }
}

/// The immutable snapshot of one manifest: the pointer's data under a name
/// made from the manifest hash, labelled with that short hash.
pub fn snapshot(
    resource: &ResourceId,
    normalized: &OpenMedModelSpec,
    manifest_json: &str,
    manifest_hash: &str,
) -> ConfigMap {
    let mut cm = config_map(resource, normalized, manifest_json);
    let short = snapshot_suffix(manifest_hash);
    cm.metadata.name = Some(snapshot_name(&pointer_name(normalized), manifest_hash));
    cm.metadata
        .labels
        .get_or_insert_default()
        .insert(MANIFEST_SNAPSHOT_LABEL.to_owned(), short.to_owned());
    // When a GitOps tool applies rendered manifests, the next version's
    // render no longer lists this snapshot, and the tool would prune it
    // while old pods and the rollback still need it. The operator collects
    // it instead, once nothing reads it.
    let annotations = cm.metadata.annotations.get_or_insert_default();
    for (key, value) in KEEP_FROM_PRUNING {
        annotations.insert(key.to_owned(), value.to_owned());
    }
    cm.immutable = Some(true);
    cm
}

/// The annotations with which Argo CD and Flux leave an object in place
/// when it disappears from the manifests they apply.
const KEEP_FROM_PRUNING: [(&str, &str); 2] = [
    ("argocd.argoproj.io/sync-options", "Prune=false"),
    ("kustomize.toolkit.fluxcd.io/prune", "disabled"),
];

/// The first ten hex digits of a `sha256:` manifest hash: short enough for
/// a name suffix and a label value, long enough never to collide among the
/// versions of one model (kustomize's `configMapGenerator` uses ten too).
pub fn snapshot_suffix(manifest_hash: &str) -> &str {
    let hex = manifest_hash
        .strip_prefix("sha256:")
        .unwrap_or(manifest_hash);
    &hex[..hex.len().min(10)]
}

/// `<pointer>-<short hash>`, the pointer cut so the whole stays within the
/// 253 characters of a DNS subdomain (and ends in a letter or digit).
pub fn snapshot_name(pointer: &str, manifest_hash: &str) -> String {
    let suffix = snapshot_suffix(manifest_hash);
    let keep = 253 - 1 - suffix.len();
    let prefix: String = pointer.chars().take(keep).collect();
    format!("{}-{suffix}", prefix.trim_end_matches(['-', '.']))
}

fn pointer_name(normalized: &OpenMedModelSpec) -> String {
    normalized
        .manifest_config_map_name
        .clone()
        .expect("a normalized spec names its ConfigMap")
}

/// Adds the target Deployment as a second owner of a manifest ConfigMap.
///
/// The garbage collector deletes a dependent only when none of its owners
/// remain. With the Deployment as an owner, a foreground deletion of the
/// OpenMedModel (what Argo CD's prune does) cannot delete a ConfigMap that
/// the Deployment's pods still read before the operator has released it.
/// Not `blockOwnerDeletion`: the Deployment's own deletion never waits.
pub fn owned_by_target(config_map: &mut ConfigMap, deployment: &str, uid: &str) {
    let refs = config_map.metadata.owner_references.get_or_insert_default();
    refs.retain(|r| r.kind != "Deployment");
    refs.push(OwnerReference {
        api_version: "apps/v1".to_owned(),
        kind: "Deployment".to_owned(),
        name: deployment.to_owned(),
        uid: uid.to_owned(),
        controller: None,
        block_owner_deletion: None,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names_stay_valid_for_the_longest_pointer() {
        let hash = "sha256:0123456789abcdef";
        assert_eq!(
            snapshot_name("svc-model-manifest", hash),
            "svc-model-manifest-0123456789"
        );
        let long = format!("{}.{}", "a".repeat(200), "b".repeat(52));
        let name = snapshot_name(&long, hash);
        assert_eq!(name.len(), 253);
        assert!(name.ends_with("b-0123456789"));
        let dotted = format!("{}.b", "a".repeat(241));
        assert_eq!(
            snapshot_name(&dotted, hash),
            format!("{}-0123456789", "a".repeat(241))
        );
    }
}
