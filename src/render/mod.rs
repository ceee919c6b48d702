//! `openmed-op render`: offline, exactly what `run` would write.
//!
//! The render shell reads documents, lets [`crate::manifests`] validate and
//! plan them, and lays out the result as a stream a GitOps tool can apply or
//! diff: every input document in order (non-OpenMedModels untouched), the
//! target Deployment with the operator's fields set, and for each resource
//! its pointer ConfigMap, the immutable snapshot its pod template reads and,
//! when its Deployment is not in the input, a strategic-merge patch for
//! kustomize `patches:`. Rendering its own output
//! again gives the same output.

pub mod canary;
pub mod krm;

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::findings::Finding;
use crate::manifests::{self, Model};
use crate::source::Document;

/// What one render produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The output stream, in order.
    pub documents: Vec<Value>,
    /// One row per OpenMedModel, for `--summary`.
    pub rows: Vec<SummaryRow>,
    /// Warnings that did not stop the render.
    pub notes: Vec<Finding>,
    /// What a version change does for each resource with a canary, for
    /// `--canary`.
    pub canaries: Vec<canary::CanaryReport>,
}

/// One line of `render --summary`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SummaryRow {
    /// `<namespace>/<name>` of the OpenMedModel.
    pub resource: String,
    /// `<deployment>/<container>`.
    pub target: String,
    /// The version pointer.
    pub version: String,
    /// The owned ConfigMap.
    #[serde(rename = "configMap")]
    pub config_map: String,
    /// The pod-template annotation `openmed.ai/model-manifest-hash`.
    #[serde(rename = "podTemplateHash")]
    pub pod_template_hash: String,
    /// Whether the Deployment was in the input (`full`) or a patch was emitted (`patch`).
    pub output: &'static str,
}

/// What to do for a resource whose target Deployment is not in the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingTarget {
    /// Emit a strategic-merge patch for kustomize `patches:` (a stream).
    Patch,
    /// Emit nothing but a warning (a KRM function's items are whole
    /// resources, so a patch would be applied as one).
    Warn,
}

/// Renders a set of documents; any error means nothing is rendered.
pub fn render(
    docs: &[Document],
    default_namespace: &str,
    missing: MissingTarget,
) -> Result<Rendered, Vec<Finding>> {
    let resolved = manifests::resolve(docs, default_namespace);
    if !resolved.findings.is_empty() {
        return Err(resolved.findings);
    }
    // Which model each document belongs to, by role: looked up once per
    // document, so rendering stays linear in the size of the input.
    let index = |pick: fn(&Model) -> Option<usize>| -> HashMap<usize, &Model> {
        resolved
            .models
            .iter()
            .filter_map(|m| Some((pick(m)?, m)))
            .collect()
    };
    let (as_target, as_config_map, as_snapshot, as_model, as_canary) = (
        index(|m| m.target_doc),
        index(|m| m.config_map_doc),
        index(|m| m.snapshot_doc),
        index(|m| Some(m.doc)),
        index(|m| m.canary.as_ref()?.target_doc),
    );
    let mut documents = Vec::with_capacity(docs.len() + 2 * resolved.models.len());
    let mut notes = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        if let Some(model) = as_target.get(&i) {
            let mut deployment = doc.value.clone();
            model
                .plan
                .deployment
                .apply_to(&mut deployment)
                .expect("resolve checked the container");
            documents.push(deployment);
        } else if let Some(model) = as_canary.get(&i) {
            let mut deployment = doc.value.clone();
            let canary = model.canary.as_ref().expect("indexed by its canary");
            canary
                .plan
                .deployment
                .apply_to(&mut deployment)
                .expect("resolve checked the canary's container");
            documents.push(deployment);
        } else if let Some(model) = as_config_map.get(&i) {
            documents.push(config_map_document(&model.plan.config_map));
        } else if let Some(model) = as_snapshot.get(&i) {
            documents.push(config_map_document(&model.plan.snapshot));
        } else {
            documents.push(doc.value.clone());
        }
        if let Some(model) = as_model.get(&i) {
            if model.config_map_doc.is_none() {
                documents.push(config_map_document(&model.plan.config_map));
            }
            if model.snapshot_doc.is_none() {
                documents.push(config_map_document(&model.plan.snapshot));
            }
            let mut absent = |at: &str,
                              deployment: &crate::plan::DeploymentFields,
                              what: String| {
                match missing {
                    MissingTarget::Patch => documents.push(deployment.strategic_patch()),
                    MissingTarget::Warn => notes.push(
                        Finding::warning(&doc.at(at), "TargetNotInInput", what)
                            .resource(model.id.key())
                            .field(format!("{at}.name")),
                    ),
                }
            };
            if model.target_doc.is_none() {
                absent(
                    "spec.targetRef",
                    &model.plan.deployment,
                    format!(
                        "Deployment {} is not among the resources; only its ConfigMap was added, and the operator will set the Deployment's fields in the cluster",
                        model.plan.deployment.name
                    ),
                );
            }
            if let Some(canary) = &model.canary
                && canary.target_doc.is_none()
            {
                absent(
                    "spec.canary.targetRef",
                    &canary.plan.deployment,
                    format!(
                        "canary Deployment {} is not among the resources; the operator will set its fields in the cluster",
                        canary.plan.deployment.name
                    ),
                );
            }
        }
    }
    let rows = resolved
        .models
        .iter()
        .map(|m| SummaryRow {
            resource: m.id.key(),
            target: format!("{}/{}", m.plan.deployment.name, m.plan.deployment.container),
            version: m.plan.normalized.version.clone(),
            config_map: m.plan.config_map.metadata.name.clone().unwrap_or_default(),
            pod_template_hash: m.plan.manifest_hash.clone(),
            output: if m.target_doc.is_some() {
                "full"
            } else {
                "patch"
            },
        })
        .collect();
    let canaries = resolved
        .models
        .iter()
        .filter_map(|m| canary::report(m, docs))
        .collect();
    Ok(Rendered {
        documents,
        rows,
        notes,
        canaries,
    })
}

/// A ConfigMap as a document, keys in the order people read manifests.
fn config_map_document(config_map: &k8s_openapi::api::core::v1::ConfigMap) -> Value {
    let mut value = serde_json::to_value(config_map).expect("a ConfigMap serializes");
    if let Some(meta) = value.get_mut("metadata") {
        order_keys(
            meta,
            &[
                "name",
                "namespace",
                "labels",
                "annotations",
                "ownerReferences",
            ],
        );
    }
    order_keys(
        &mut value,
        &["apiVersion", "kind", "metadata", "immutable", "data"],
    );
    value
}

/// Moves `first` keys to the front, in that order; the rest keep theirs.
fn order_keys(value: &mut Value, first: &[&str]) {
    let Value::Object(map) = value else { return };
    let mut ordered = Map::new();
    for key in first {
        if let Some(v) = map.remove(*key) {
            ordered.insert((*key).to_owned(), v);
        }
    }
    ordered.append(map);
    *map = ordered;
}

/// Writes `documents` as a YAML stream, separated by `---`, each as it
/// comes.
pub fn write_yaml(
    out: &mut impl io::Write,
    documents: impl IntoIterator<Item = Value>,
) -> io::Result<()> {
    for (i, doc) in documents.into_iter().enumerate() {
        if i > 0 {
            out.write_all(b"---\n")?;
        }
        out.write_all(crate::source::yaml::write::document(&doc).as_bytes())?;
    }
    Ok(())
}

/// Writes `documents` as a `v1` `List`, as `kubectl get -o json` prints
/// several objects, each item as it comes: the same bytes as the list
/// built whole and printed by `serde_json::to_string_pretty`, then a
/// newline.
pub fn write_json(
    out: &mut impl io::Write,
    documents: impl IntoIterator<Item = Value>,
) -> io::Result<()> {
    /// The items, serialized as a sequence straight from the iterator.
    struct Items<I>(RefCell<Option<I>>);
    impl<I: Iterator<Item = Value>> Serialize for Items<I> {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let items = self
                .0
                .borrow_mut()
                .take()
                .expect("the list is written once");
            serializer.collect_seq(items)
        }
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase", bound = "I: Iterator<Item = Value>")]
    struct List<I> {
        api_version: &'static str,
        kind: &'static str,
        items: Items<I>,
    }
    let list = List {
        api_version: "v1",
        kind: "List",
        items: Items(RefCell::new(Some(documents.into_iter()))),
    };
    serde_json::to_writer_pretty(&mut *out, &list)?;
    out.write_all(b"\n")
}

/// The `--summary` table.
pub fn summary_table(rows: &[SummaryRow]) -> String {
    let header = [
        "RESOURCE",
        "TARGET",
        "VERSION",
        "CONFIGMAP",
        "POD-TEMPLATE HASH",
        "DEPLOYMENT",
    ];
    let cells: Vec<[&str; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.resource.as_str(),
                r.target.as_str(),
                r.version.as_str(),
                r.config_map.as_str(),
                r.pod_template_hash.as_str(),
                r.output,
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&cells) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}   ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The YAML stream as it was printed before it streamed: built whole.
    fn whole_yaml(documents: &[Value]) -> String {
        let mut out = String::new();
        for (i, doc) in documents.iter().enumerate() {
            if i > 0 {
                out.push_str("---\n");
            }
            out.push_str(&crate::source::yaml::write::document(doc));
        }
        out
    }

    /// The JSON list as it was printed before it streamed: built whole.
    fn whole_json(documents: &[Value]) -> String {
        let list = json!({ "apiVersion": "v1", "kind": "List", "items": documents });
        serde_json::to_string_pretty(&list).unwrap() + "\n"
    }

    #[test]
    fn a_streamed_list_or_stream_has_the_bytes_of_the_whole_one() {
        let samples = [
            vec![],
            vec![json!({})],
            vec![json!({"kind": "A", "items": []})],
            vec![
                json!({"z": 1, "a": {"b": [1, {"c": "x\ny", "d": []}], "e": {}}, "f": null}),
                json!({"text": "\"quoted\" \u{e9} \u{1F600}", "n": -1.5, "t": true}),
                json!({"last": [[], [{}], "s"]}),
            ],
        ];
        for documents in samples {
            let mut yaml = Vec::new();
            write_yaml(&mut yaml, documents.clone()).unwrap();
            assert_eq!(String::from_utf8(yaml).unwrap(), whole_yaml(&documents));
            let mut list = Vec::new();
            write_json(&mut list, documents.clone()).unwrap();
            assert_eq!(String::from_utf8(list).unwrap(), whole_json(&documents));
        }
    }
}
