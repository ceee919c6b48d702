//! KEDA's ScaledObject (`keda.sh/v1alpha1`) as the operator caches it:
//! its metadata, and its spec as plain JSON, which the core compares with
//! the one it plans. KEDA's types are not a dependency: the operator reads
//! and writes only what `spec.autoscaling.keda` plans.

use std::borrow::Cow;

use kube::Resource;
use kube::core::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A ScaledObject, its spec unparsed.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ScaledObject {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// The spec, as JSON.
    #[serde(default)]
    pub spec: Value,
}

impl ScaledObject {
    /// The object as JSON, as the core reads it.
    pub fn to_value(&self) -> Value {
        let mut value = serde_json::to_value(self).expect("a ScaledObject serializes");
        value["apiVersion"] = "keda.sh/v1alpha1".into();
        value["kind"] = "ScaledObject".into();
        value
    }
}

impl Resource for ScaledObject {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "ScaledObject".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "keda.sh".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1alpha1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "scaledobjects".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
