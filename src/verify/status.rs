//! Reading `--status`: the cluster's OpenMedModels, with their status.
//!
//! The input is what `kubectl get omm -A -o yaml` (or `-o json`) prints: a
//! `v1` `List` of OpenMedModels, or the objects themselves, in one file or
//! in a directory of files. Only each object's identity and `status` are
//! read; a status that does not have the operator's shape is refused, since
//! the rules would otherwise judge against a cluster that does not exist.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::rules::{ClusterStatus, ResourceKey};
use crate::api::OpenMedModelStatus;
use crate::source::{self, Document};

/// A status input that cannot be used (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The input holds no document at all.
    #[error(
        "--status: {0}: holds no objects; give the output of `kubectl get omm -A -o yaml` (a List, empty when the cluster has no OpenMedModels)"
    )]
    Empty(String),
    /// A document that is neither an OpenMedModel nor a `List` of objects.
    #[error(
        "--status: {origin}:{line}: document {document}: {message}; give the output of `kubectl get omm -A -o yaml`"
    )]
    NotStatus {
        /// The file.
        origin: String,
        /// 1-based document index.
        document: usize,
        /// 1-based line.
        line: usize,
        /// What it is instead.
        message: String,
    },
    /// A file or directory could not be read, or is not YAML/JSON.
    #[error("--status: {0}")]
    Read(#[from] source::ReadError),
    /// An OpenMedModel's `status` does not have the operator's shape.
    #[error(
        "--status: {origin}:{line}: document {document}: {what}: status cannot be read: {message}"
    )]
    Shape {
        /// The file.
        origin: String,
        /// 1-based document index.
        document: usize,
        /// 1-based line of the object.
        line: usize,
        /// `<namespace>/<name>` of the object.
        what: String,
        /// What serde said.
        message: String,
    },
}

/// Reads a file, or every `*.yaml`, `*.yml` and `*.json` file below a directory.
pub fn read(path: &Path, default_namespace: &str) -> Result<ClusterStatus, StatusError> {
    let mut status = ClusterStatus::new();
    let mut documents = 0;
    for file in files(path)? {
        let bytes = source::read_file(&file)?;
        let docs = source::parse_bytes(&file.display().to_string(), &bytes)?;
        documents += docs.len();
        collect(&docs, default_namespace, &mut status)?;
    }
    if documents == 0 {
        return Err(StatusError::Empty(path.display().to_string()));
    }
    Ok(status)
}

fn files(path: &Path) -> Result<Vec<PathBuf>, source::ReadError> {
    source::files_below(path, |p| {
        source::is_yaml_name(p) || p.extension().is_some_and(|e| e == "json")
    })
}

/// Adds the OpenMedModels of `docs` (objects or `List`s of them) to `status`.
pub fn collect(
    docs: &[Document],
    default_namespace: &str,
    status: &mut ClusterStatus,
) -> Result<(), StatusError> {
    for doc in docs {
        let not_status = |message: String| StatusError::NotStatus {
            origin: doc.origin.to_string(),
            document: doc.index + 1,
            line: doc.line_of("kind"),
            message,
        };
        let items: Vec<&Value> = match doc.kind() {
            Some(kind) if kind.ends_with("List") => match doc.value.get("items") {
                Some(Value::Array(items)) => items.iter().collect(),
                None | Some(Value::Null) => Vec::new(),
                Some(_) => return Err(not_status(format!("{kind}.items is not a list"))),
            },
            Some(crate::api::KIND) => vec![&doc.value],
            Some(kind) => {
                return Err(not_status(format!(
                    "a {} is neither an OpenMedModel nor a List of them",
                    crate::text::quote(kind)
                )));
            }
            None => return Err(not_status("an object without a kind".into())),
        };
        for item in items {
            if item.get("kind").and_then(Value::as_str) != Some(crate::api::KIND) {
                continue;
            }
            let meta = item.get("metadata");
            let field = |name: &str| meta.and_then(|m| m.get(name)).and_then(Value::as_str);
            let Some(name) = field("name") else { continue };
            let key = ResourceKey {
                namespace: field("namespace").unwrap_or(default_namespace).to_owned(),
                name: name.to_owned(),
            };
            let parsed = match item.get("status") {
                None | Some(Value::Null) => OpenMedModelStatus::default(),
                Some(value) => {
                    serde_json::from_value(value.clone()).map_err(|e| StatusError::Shape {
                        origin: doc.origin.to_string(),
                        document: doc.index + 1,
                        line: doc.line_of("status"),
                        what: key.to_string(),
                        message: e.to_string(),
                    })?
                }
            };
            status.insert(key, parsed);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_list_and_plain_objects() {
        let text = "\
apiVersion: v1
kind: List
items:
- apiVersion: openmed.ai/v1alpha1
  kind: OpenMedModel
  metadata: {name: a, namespace: team}
  status:
    phase: RolledBack
    desiredVersion: v3
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: other}
---
apiVersion: openmed.ai/v1alpha1
kind: OpenMedModel
metadata: {name: b}
";
        let docs = source::parse_stream("s.yaml", text).unwrap();
        let mut status = ClusterStatus::new();
        collect(&docs, "default", &mut status).unwrap();
        assert_eq!(status.len(), 2);
        let a = &status[&ResourceKey {
            namespace: "team".into(),
            name: "a".into(),
        }];
        assert_eq!(a.desired_version.as_deref(), Some("v3"));
        assert!(status.contains_key(&ResourceKey {
            namespace: "default".into(),
            name: "b".into(),
        }));
    }

    #[test]
    fn a_status_of_another_shape_is_refused_with_its_place() {
        let text = "kind: OpenMedModel\nmetadata: {name: a}\nstatus:\n  phase: Exploded\n";
        let docs = source::parse_stream("s.yaml", text).unwrap();
        let err = collect(&docs, "default", &mut ClusterStatus::new()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("s.yaml:3: document 1: default/a"), "{text}");
    }
}
