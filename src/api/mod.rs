//! The `OpenMedModel` API: the types, the CRD generated from them, and the one
//! `validate` that the operator, `render` and `verify` all call.

pub mod autoscaling;
mod canary;
mod crd;
pub mod endpoints;
pub mod names;
pub mod quality;
pub mod reference;
pub mod rules;
mod types;
mod validate;

pub use autoscaling::{Autoscaling, AutoscalingStatus, Keda};
pub use canary::{
    Analysis, AnalysisResult, BackendWeights, Canary, CanaryState, CanaryStatus, CanaryStep,
    CanaryTargetRef, Drain, Metric, Outcome, PrometheusQuery, StepKind, ThresholdRange, TrafficRef,
    Webhook,
};
pub use crd::{crd, crd_yaml, openapi_schema};
pub use quality::QualityGate;
pub use types::{
    OpenMedModel, OpenMedModelSpec, OpenMedModelStatus, Phase, RolloutStrategy, SoakStatus,
    StrategyType, TargetRef, Tier,
};
pub use validate::{FieldError, TargetFacts, validate, validate_spec};

/// API group of the resource.
pub const GROUP: &str = "openmed.ai";
/// API version of the resource, as written in `apiVersion`.
pub const API_VERSION: &str = "openmed.ai/v1alpha1";
/// Kind of the resource.
pub const KIND: &str = "OpenMedModel";
