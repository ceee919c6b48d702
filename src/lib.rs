//! openmed-op: makes the model served by an OpenMed REST Deployment declarative.
//!
//! A functional core shared by three thin shells:
//!
//! - [`api`]: the `OpenMedModel` types, the CRD and the one `validate`;
//! - [`plan`]: from a valid spec, the exact objects to write (pure);
//! - [`rollout`]: the rollout state machine as a pure function (pure);
//! - [`fleet`]: a repository's waves, from `openmed-fleet.yaml` (pure);
//! - [`source`] and [`text`]: reading YAML as the API server does, and
//!   showing input in messages (the lowest layer);
//! - shells: [`render`] (files), the operator (`run`, kube API) and [`verify`]
//!   (Git objects), which only read inputs and carry out decisions.

pub mod api;
pub mod cli;
pub mod findings;
pub mod fleet;
pub mod manifests;
pub mod operator;
pub mod plan;
pub mod render;
pub mod rollout;
pub mod source;
pub mod text;
pub mod verify;
