//! The ConfigMap that holds the model pointer.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::ResourceId;
use crate::api::names::{
    FAMILY_LABEL, FIELD_MANAGER, MANAGED_BY_LABEL, MANIFEST_KEY, MODEL_RESOURCE_ANNOTATION,
    PRELOAD_ENV,
};
use crate::api::{API_VERSION, KIND, OpenMedModelSpec};

/// The owned ConfigMap for a normalized spec. It carries an owner reference
/// when the resource's UID is known, so the garbage collector removes it
/// with the resource even if the operator is not running.
pub fn config_map(
    resource: &ResourceId,
    normalized: &OpenMedModelSpec,
    manifest_json: &str,
) -> ConfigMap {
    let name = normalized
        .manifest_config_map_name
        .clone()
        .expect("a normalized spec names its ConfigMap");
    let owner_references = resource.uid.as_ref().map(|uid| {
        vec![OwnerReference {
            api_version: API_VERSION.to_owned(),
            kind: KIND.to_owned(),
            name: resource.name.clone(),
            uid: uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]
    });
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
