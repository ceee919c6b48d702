//! The ReplicaSet as the operator watches it: which snapshot its pods read,
//! and whether it may have pods. Nothing else is deserialized.
//!
//! A typed `ReplicaSet` is 2.3 KB before any of its contents (its pod
//! template's `PodSpec` is held inline), and each container another 2.1 KB.
//! The operator reads four fields of it, and at 10,000 models it caches
//! at least one per model, so it watches this type instead.

use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::Resource;
use kube::core::ObjectMeta;
use serde::Deserialize;

use crate::api::names::PRELOAD_ENV;
use crate::rollout::pods::REVISION_ANNOTATION;

/// A ReplicaSet reduced to what the operator reads.
#[derive(Resource, Deserialize, Clone, Debug)]
#[resource(inherit = ReplicaSet)]
pub struct CachedReplicaSet {
    /// Standard object metadata (the cache keeps its name, namespace and
    /// labels).
    pub metadata: ObjectMeta,
    /// The parts of the spec read.
    #[serde(default)]
    spec: Spec,
    /// The parts of the status read.
    #[serde(default)]
    status: Status,
}

#[derive(Deserialize, Clone, Debug, Default)]
struct Spec {
    #[serde(default)]
    replicas: Option<i32>,
    #[serde(default)]
    template: Template,
}

#[derive(Deserialize, Clone, Debug, Default)]
struct Template {
    #[serde(default)]
    spec: TemplateSpec,
}

#[derive(Deserialize, Clone, Debug, Default)]
struct TemplateSpec {
    #[serde(default)]
    containers: Vec<Container>,
}

#[derive(Deserialize, Clone, Debug, Default)]
struct Container {
    #[serde(default)]
    env: Vec<EnvVar>,
}

#[derive(Deserialize, Clone, Debug, Default)]
struct EnvVar {
    name: String,
    #[serde(default, rename = "valueFrom")]
    value_from: Option<ValueFrom>,
}

#[derive(Deserialize, Clone, Debug, Default)]
struct ValueFrom {
    #[serde(default, rename = "configMapKeyRef")]
    config_map_key_ref: Option<KeyRef>,
}

#[derive(Deserialize, Clone, Debug, Default)]
struct KeyRef {
    #[serde(default)]
    name: String,
}

#[derive(Deserialize, Clone, Debug, Default)]
struct Status {
    #[serde(default)]
    replicas: i32,
}

impl CachedReplicaSet {
    /// The ConfigMap its pods read the preload variable from.
    pub fn preload_config_map(&self) -> Option<&str> {
        self.spec
            .template
            .spec
            .containers
            .iter()
            .flat_map(|c| &c.env)
            .find(|e| e.name == PRELOAD_ENV)?
            .value_from
            .as_ref()?
            .config_map_key_ref
            .as_ref()
            .map(|r| r.name.as_str())
    }

    /// The UID of the Deployment that controls it.
    pub fn deployment_uid(&self) -> Option<&str> {
        self.metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true) && o.kind == "Deployment")
            .map(|o| o.uid.as_str())
    }

    /// Which of its Deployment's rollouts made it
    /// (`deployment.kubernetes.io/revision`).
    pub fn revision(&self) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(REVISION_ANNOTATION)
            .map(String::as_str)
    }

    /// Whether a pod of it may exist: it wants some, or some still run.
    pub fn has_pods(&self) -> bool {
        self.spec.replicas.unwrap_or(0) > 0 || self.status.replicas > 0
    }

    /// Drops what the operator never reads before it is cached: every
    /// variable but the preload one, and of the metadata all but name,
    /// namespace, labels, the revision and the controlling Deployment
    /// (which pods a rollout is judged by).
    pub fn trim(&mut self) {
        for container in &mut self.spec.template.spec.containers {
            container.env.retain(|e| e.name == PRELOAD_ENV);
        }
        self.spec
            .template
            .spec
            .containers
            .retain(|c| !c.env.is_empty());
        let meta = &mut self.metadata;
        meta.managed_fields = None;
        super::keep_only(meta, REVISION_ANNOTATION, "Deployment");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn replica_set(replicas: i32, running: i32) -> CachedReplicaSet {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {
                "name": "svc-7b9", "namespace": "ns",
                "labels": {"app": "svc"},
                "annotations": {"deployment.kubernetes.io/revision": "3"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                    "name": "svc", "uid": "u", "controller": true}],
            },
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "svc"}},
                "template": {
                    "metadata": {"labels": {"app": "svc"}},
                    "spec": {"containers": [
                        {"name": "sidecar", "image": "proxy", "env": [{"name": "A", "value": "1"}]},
                        {"name": "openmed-service", "image": "openmed", "ports": [{"containerPort": 8080}],
                         "env": [
                            {"name": "LOG", "value": "info"},
                            {"name": PRELOAD_ENV, "valueFrom": {"configMapKeyRef":
                                {"name": "svc-model-manifest-abc", "key": PRELOAD_ENV}}},
                         ]},
                    ]},
                },
            },
            "status": {"replicas": running},
        }))
        .expect("a ReplicaSet deserializes")
    }

    #[test]
    fn it_reads_the_snapshot_its_pods_preload_and_whether_it_has_pods() {
        let mut rs = replica_set(2, 0);
        assert_eq!(rs.preload_config_map(), Some("svc-model-manifest-abc"));
        assert!(rs.has_pods());
        rs.trim();
        assert_eq!(rs.preload_config_map(), Some("svc-model-manifest-abc"));
        assert_eq!(rs.spec.template.spec.containers.len(), 1);
        assert_eq!(rs.spec.template.spec.containers[0].env.len(), 1);
        assert_eq!(rs.revision(), Some("3"), "kept: which rollout made it");
        assert_eq!(rs.deployment_uid(), Some("u"), "kept: whose it is");
        assert_eq!(rs.metadata.annotations.as_ref().map(|a| a.len()), Some(1));
        assert_eq!(rs.metadata.labels.as_ref().map(|l| l.len()), Some(1));

        assert!(
            replica_set(0, 1).has_pods(),
            "scaled down, pods still running"
        );
        assert!(!replica_set(0, 0).has_pods());
    }

    #[test]
    fn a_replica_set_without_a_template_or_status_deserializes() {
        let rs: CachedReplicaSet = serde_json::from_value(json!({
            "metadata": {"name": "x", "namespace": "ns"},
        }))
        .expect("a bare ReplicaSet deserializes");
        assert_eq!(rs.preload_config_map(), None);
        assert!(!rs.has_pods());
    }
}
