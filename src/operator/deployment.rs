//! The Deployment as the operator caches it: metadata parsed, spec and
//! status as JSON text ([`super::json_text`]).
//!
//! Every lookup of a namespace's Deployments reads only their annotations
//! (which resource claims them); a decision then reads the few it is about
//! (its target, its canary target, the ones it claims) whole. A typed
//! Deployment of 2 KB of JSON is 10 KB in memory, this about a third.

use k8s_openapi::api::apps::v1::Deployment;
use kube::Resource;
use kube::core::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::json_text::JsonText;

/// A Deployment with its spec and status unparsed.
#[derive(Resource, Serialize, Deserialize, Clone, Debug)]
#[resource(inherit = Deployment)]
pub struct CachedDeployment {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spec: Option<JsonText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<JsonText>,
}

impl CachedDeployment {
    /// What the cache would hold of `deployment` (a write's answer).
    pub fn of(deployment: &Deployment) -> Self {
        CachedDeployment {
            metadata: deployment.metadata.clone(),
            spec: JsonText::of_part(deployment.spec.as_ref()),
            status: JsonText::of_part(deployment.status.as_ref()),
        }
    }

    /// The whole Deployment (see [`JsonText::part`] for text it cannot
    /// read).
    pub fn deployment(&self) -> Deployment {
        Deployment {
            metadata: self.metadata.clone(),
            spec: self.spec.as_ref().and_then(JsonText::part),
            status: self.status.as_ref().and_then(JsonText::part),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_cached_deployment_reads_back_as_the_typed_one() {
        let object = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "svc", "namespace": "ns", "resourceVersion": "7",
                "annotations": {"openmed.ai/model-resource": "ns/svc"}},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "svc"}},
                "template": {"metadata": {"labels": {"app": "svc"}},
                    "spec": {"containers": [{"name": "c", "image": "i",
                        "env": [{"name": "A", "value": "1"}]}]}}},
            "status": {"observedGeneration": 3, "replicas": 2,
                "conditions": [{"type": "Available", "status": "True"}]},
        });
        let typed: Deployment = serde_json::from_value(object.clone()).unwrap();
        let cached: CachedDeployment = serde_json::from_value(object).unwrap();
        assert_eq!(cached.deployment(), typed);
        assert_eq!(CachedDeployment::of(&typed).deployment(), typed);
    }
}
