//! YAML the way Kubernetes reads it, both directions: [`read`] turns a
//! stream into the JSON the API server would store, [`write`] turns JSON
//! into YAML every Kubernetes reader takes back unchanged, and [`scalar`]
//! is the table of what a scalar means (YAML 1.1, as go-yaml v2 reads it)
//! that both follow.

pub mod read;
pub mod scalar;
pub mod write;
