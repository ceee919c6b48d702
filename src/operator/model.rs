//! The OpenMedModel as the operator watches it: a spec that always parses.
//!
//! Watching the typed `OpenMedModel` would make one malformed object (stored
//! before the CRD tightened, or edited with validation off) fail to
//! deserialize and stall the watch for everyone. This type keeps `spec` and
//! `status` as raw JSON, so every object arrives, and `decide` reports what
//! is wrong with it as a condition.

use kube::Resource;
use kube::core::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::OpenMedModel;
use crate::rollout::ResourceView;

/// An `OpenMedModel` with raw spec and status.
#[derive(Resource, Serialize, Deserialize, Clone, Debug)]
#[resource(inherit = OpenMedModel)]
pub struct RawModel {
    /// `apiVersion` and `kind`.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub types: Option<kube::api::TypeMeta>,
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// The spec, unparsed.
    #[serde(default)]
    pub spec: Value,
    /// The status, unparsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
}

impl RawModel {
    /// The lenient view `decide` reads.
    pub fn view(&self) -> ResourceView {
        ResourceView::new(&self.metadata, self.spec.clone(), self.status.as_ref())
    }
}
