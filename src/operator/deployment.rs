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
        let text = |part: Option<serde_json::Value>| part.as_ref().map(JsonText::of);
        CachedDeployment {
            metadata: deployment.metadata.clone(),
            spec: text(deployment.spec.as_ref().map(to_value)),
            status: text(deployment.status.as_ref().map(to_value)),
        }
    }

    /// The whole Deployment. A part the typed Deployment cannot read (a
    /// field of a newer API the types do not know is dropped, not refused)
    /// reads as absent, as `decide` would treat an object without it.
    pub fn deployment(&self) -> Deployment {
        Deployment {
            metadata: self.metadata.clone(),
            spec: self
                .spec
                .as_ref()
                .and_then(|s| serde_json::from_value(s.value()).ok()),
            status: self
                .status
                .as_ref()
                .and_then(|s| serde_json::from_value(s.value()).ok()),
        }
    }
}

fn to_value<T: Serialize>(part: &T) -> serde_json::Value {
    serde_json::to_value(part).expect("a typed Deployment serializes")
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
