//! The ConfigMap as the operator caches it: metadata parsed, data as JSON
//! text ([`super::json_text`]).
//!
//! A namespace lookup reads only whom a ConfigMap belongs to (its owner
//! references and annotations); a decision then reads its own few whole.
//! A manifest's data is a map of one or two entries, and a map of one
//! entry costs a whole B-tree node (about 550 bytes) before its strings:
//! as text it is about a third.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use kube::core::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::json_text::JsonText;

/// A ConfigMap with its data unparsed.
#[derive(Resource, Serialize, Deserialize, Clone, Debug)]
#[resource(inherit = ConfigMap)]
pub struct CachedConfigMap {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    data: Option<JsonText>,
    #[serde(
        default,
        rename = "binaryData",
        skip_serializing_if = "Option::is_none"
    )]
    binary_data: Option<JsonText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    immutable: Option<bool>,
}

impl CachedConfigMap {
    /// What the cache would hold of `config_map` (a write's answer).
    pub fn of(config_map: &ConfigMap) -> Self {
        CachedConfigMap {
            metadata: config_map.metadata.clone(),
            data: JsonText::of_part(config_map.data.as_ref()),
            binary_data: JsonText::of_part(config_map.binary_data.as_ref()),
            immutable: config_map.immutable,
        }
    }

    /// The whole ConfigMap.
    pub fn config_map(&self) -> ConfigMap {
        ConfigMap {
            metadata: self.metadata.clone(),
            data: self.data.as_ref().and_then(JsonText::part),
            binary_data: self.binary_data.as_ref().and_then(JsonText::part),
            immutable: self.immutable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_cached_config_map_reads_back_as_the_typed_one() {
        let object = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "svc-model-manifest-e2f", "namespace": "ns",
                "ownerReferences": [{"apiVersion": "openmed.ai/v1alpha1", "kind": "OpenMedModel",
                    "name": "svc", "uid": "u"}]},
            "data": {"manifest.json": "{\"family\":\"pii\"}", "OPENMED_SERVICE_PRELOAD_MODELS": "/m"},
            "binaryData": {"b": "AAEC"},
            "immutable": true,
        });
        let typed: ConfigMap = serde_json::from_value(object.clone()).unwrap();
        let cached: CachedConfigMap = serde_json::from_value(object).unwrap();
        assert_eq!(cached.config_map(), typed);
        assert_eq!(CachedConfigMap::of(&typed).config_map(), typed);
    }
}
