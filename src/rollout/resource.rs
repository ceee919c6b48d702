//! The OpenMedModel as `decide` sees it: read leniently.
//!
//! A stored object may not parse as the current types: written before the
//! CRD tightened, or its status written by the earlier operator. The spec is
//! kept raw (so `validate` can report exactly what is wrong) and the status
//! is read field by field, so one odd field never costs the rollback
//! history held in the others.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::api::OpenMedModelStatus;
use crate::plan::{self, ResourceId};

/// An OpenMedModel, leniently read.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// `metadata.generation`.
    pub generation: i64,
    /// `metadata.creationTimestamp`.
    pub created: Option<Time>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// The raw spec.
    pub spec: Value,
    /// The status, every readable field of it.
    pub status: OpenMedModelStatus,
}

impl ResourceView {
    /// `spec.version` as written, valid or not.
    pub fn spec_version(&self) -> Option<String> {
        self.spec
            .get("version")
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    /// Reads metadata, the raw spec and the status.
    pub fn new(metadata: &ObjectMeta, spec: Value, status: Option<&Value>) -> Self {
        ResourceView {
            namespace: metadata.namespace.clone().unwrap_or_default(),
            name: metadata.name.clone().unwrap_or_default(),
            uid: metadata.uid.clone().unwrap_or_default(),
            generation: metadata.generation.unwrap_or(0),
            created: metadata.creation_timestamp.clone(),
            annotations: metadata.annotations.clone().unwrap_or_default(),
            deleting: metadata.deletion_timestamp.is_some(),
            spec,
            status: status.map(lenient_status).unwrap_or_default(),
        }
    }

    /// `<namespace>/<name>`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The resource as `plan` names it.
    pub fn id(&self) -> ResourceId {
        ResourceId {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: Some(self.uid.clone()).filter(|u| !u.is_empty()),
        }
    }
}

/// The Deployment a resource names, read from the raw spec (valid or not),
/// so the shell can look it up before `decide` validates anything.
pub fn target_name(resource: &ResourceView) -> String {
    target_name_of(&resource.name, &resource.spec).to_owned()
}

/// [`target_name`] from a resource's name and raw spec, without reading the
/// rest of it (the shell asks this of every resource in a namespace).
pub fn target_name_of<'a>(name: &'a str, spec: &'a Value) -> &'a str {
    spec.pointer("/targetRef/name")
        .and_then(Value::as_str)
        .unwrap_or(name)
}

/// Whether another OpenMedModel competes for the Deployment `target`:
/// any other resource of the namespace that names it, *including one being
/// deleted*: until its release has landed it still holds the target, and a
/// claim made meanwhile would be stripped by that release (both write with
/// the same field manager).
pub fn is_rival(me: &ResourceView, namespace: &str, name: &str, its_target: &str) -> bool {
    namespace == me.namespace && name != me.name && its_target == target_name(me)
}

/// Every ConfigMap name `decide` may need: the pointer and the snapshot
/// `spec` asks for, and the pointers and snapshots of the retained specs a
/// rollback would restore, as they were written and as placed on the
/// pointer `spec` names now ([`plan::placed_as`]).
pub fn config_map_names(resource: &ResourceView) -> Vec<String> {
    let status = &resource.status;
    let current =
        serde_json::from_value::<crate::api::OpenMedModelSpec>(resource.spec.clone()).ok();
    let snapshot_of = |spec: &crate::api::OpenMedModelSpec| {
        let pointer = plan::config_map_name(&resource.name, spec);
        let normalized = plan::normalize(&resource.name, spec);
        let manifest_hash =
            plan::plan(&resource.id(), &normalized, Default::default()).manifest_hash;
        (
            pointer.clone(),
            plan::snapshot_name(&pointer, &manifest_hash),
        )
    };
    let mut names = Vec::new();
    if let Some(spec) = &current {
        let (pointer, snapshot) = snapshot_of(spec);
        names.extend([pointer, snapshot]);
    }
    for spec in status.known_specs() {
        let (pointer, snapshot) = snapshot_of(spec);
        names.extend([pointer, snapshot]);
        if let Some(current) = &current {
            let placed = plan::placed_as(spec, &plan::normalize(&resource.name, current));
            names.push(snapshot_of(&placed).1);
        }
    }
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

/// Reads each status field on its own; unreadable ones are left unset.
fn lenient_status(value: &Value) -> OpenMedModelStatus {
    fn field<T: DeserializeOwned>(value: &Value, key: &str) -> Option<T> {
        serde_json::from_value(value.get(key)?.clone()).ok()
    }
    OpenMedModelStatus {
        observed_generation: field(value, "observedGeneration"),
        phase: field(value, "phase"),
        desired_version: field(value, "desiredVersion"),
        active_version: field(value, "activeVersion"),
        desired_spec_hash: field(value, "desiredSpecHash"),
        applied_spec_hash: field(value, "appliedSpecHash"),
        failed_spec_hash: field(value, "failedSpecHash"),
        manifest_hash: field(value, "manifestHash"),
        target_deployment_generation: field(value, "targetDeploymentGeneration"),
        last_rollout_time: field(value, "lastRolloutTime"),
        rollback_count: field(value, "rollbackCount"),
        rollback_request: field(value, "rollbackRequest"),
        last_successful_spec: field(value, "lastSuccessfulSpec"),
        previous_successful_spec: field(value, "previousSuccessfulSpec"),
        rollback_spec: field(value, "rollbackSpec"),
        canary: field(value, "canary"),
        soak: field(value, "soak"),
        autoscaling: field(value, "autoscaling"),
        conditions: value
            .get("conditions")
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(|c| serde_json::from_value(c.clone()).ok())
                    .collect()
            })
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_unreadable_status_field_keeps_the_rest() {
        let status = json!({
            "phase": "SomethingNew",
            "rollbackCount": "three",
            "lastSuccessfulSpec": {"family": "pii", "version": "v1", "tier": "Small"},
            "appliedSpecHash": "sha256:x",
        });
        let read = lenient_status(&status);
        assert_eq!(read.phase, None);
        assert_eq!(read.rollback_count, None);
        assert_eq!(read.last_successful_spec.unwrap().version, "v1");
        assert_eq!(read.applied_spec_hash.as_deref(), Some("sha256:x"));
    }
}
