//! `openmed-op render`: offline, exactly what `run` would write.
//!
//! The render shell reads documents, lets [`crate::manifests`] validate and
//! plan them, and lays out the result as a stream a GitOps tool can apply or
//! diff: every input document in order (non-OpenMedModels untouched), the
//! target Deployment with the operator's fields set, and for each resource
//! its pointer ConfigMap, the immutable snapshot its pod template reads, its
//! HorizontalPodAutoscaler when `spec.autoscaling` asks for one, and,
//! when its Deployment is not in the input, a strategic-merge patch for
//! kustomize `patches:`. Rendering its own output
//! again gives the same output.
//!
//! It works in two passes so that a large input never has its whole output
//! in memory, and a bad one never has any of it written: [`render`] judges
//! and plans every resource and keeps only what the stream needs of each,
//! then [`Rendered::documents`] lays the stream out one document at a time
//! for the caller to write as it goes.

pub mod canary;
pub mod changes;
pub mod krm;

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::findings::Finding;
use crate::manifests::{self, Model};
use crate::plan::DeploymentFields;
use crate::source::Document;

/// A render that passed: every resource judged and planned, its output
/// stream still to be laid out ([`Rendered::documents`]).
#[derive(Debug, Clone)]
pub struct Rendered<'a> {
    /// The input, in order.
    docs: &'a [Document],
    missing: MissingTarget,
    /// What the stream needs of each valid resource, in document order.
    planned: Vec<Planned>,
    /// Which resource each input document belongs to, by role (an index
    /// into `planned`): looked up once per document, so laying out the
    /// stream stays linear in the size of the input.
    as_target: HashMap<usize, usize>,
    as_canary: HashMap<usize, usize>,
    as_config_map: HashMap<usize, usize>,
    as_snapshot: HashMap<usize, usize>,
    as_autoscaler: HashMap<usize, usize>,
    as_model: HashMap<usize, usize>,
    /// One row per OpenMedModel, for `--summary`.
    pub rows: Vec<SummaryRow>,
    /// Warnings that did not stop the render.
    pub notes: Vec<Finding>,
    /// What a version change does for each resource with a canary, for
    /// `--canary`.
    pub canaries: Vec<canary::CanaryReport>,
}

/// What the output stream needs of one resource, kept from its [`Model`]
/// between the passes. A whole plan is several objects (two ConfigMaps, the
/// normalized spec, a canary's plan) and most of it has done its work once
/// the resource is judged; this is a small part of it.
#[derive(Debug, Clone)]
struct Planned {
    target_doc: Option<usize>,
    config_map_doc: Option<usize>,
    snapshot_doc: Option<usize>,
    /// The target's fields: set on its document, or sent as a patch.
    deployment: DeploymentFields,
    /// The pointer ConfigMap and the snapshot as the JSON text of their
    /// documents: a fraction of the memory of the objects, and parsed back
    /// to the same value (strings and booleans only) at their turn.
    config_map: Box<str>,
    snapshot: Box<str>,
    autoscaler_doc: Option<usize>,
    /// The autoscaler `spec.autoscaling` asks for, as JSON text.
    autoscaler: Option<Box<str>>,
    canary: Option<Box<PlannedCanary>>,
}

/// The canary Deployment's part of [`Planned`].
#[derive(Debug, Clone)]
struct PlannedCanary {
    target_doc: Option<usize>,
    deployment: DeploymentFields,
}

impl Planned {
    fn new(model: Model) -> Self {
        let json = |config_map| {
            serde_json::to_string(&config_map_document(config_map))
                .expect("a ConfigMap serializes")
                .into_boxed_str()
        };
        Planned {
            target_doc: model.target_doc,
            config_map_doc: model.config_map_doc,
            snapshot_doc: model.snapshot_doc,
            config_map: json(&model.plan.config_map),
            snapshot: json(&model.plan.snapshot),
            autoscaler_doc: model.autoscaler_doc,
            autoscaler: model.autoscaler.as_ref().map(|object| {
                serde_json::to_string(&autoscaler_document(object.clone()))
                    .expect("an autoscaler serializes")
                    .into_boxed_str()
            }),
            deployment: model.plan.deployment,
            canary: model.canary.map(|c| {
                Box::new(PlannedCanary {
                    target_doc: c.target_doc,
                    deployment: c.plan.deployment,
                })
            }),
        }
    }

    fn config_map(&self) -> Value {
        serde_json::from_str(&self.config_map).expect("JSON this render wrote")
    }

    fn snapshot(&self) -> Value {
        serde_json::from_str(&self.snapshot).expect("JSON this render wrote")
    }

    fn autoscaler(&self) -> Option<Value> {
        let text = self.autoscaler.as_deref()?;
        Some(serde_json::from_str(text).expect("JSON this render wrote"))
    }
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
    /// The immutable snapshot ConfigMap the pod template reads.
    #[serde(skip)]
    pub snapshot: Option<String>,
    /// `OPENMED_SERVICE_PRELOAD_MODELS` as the pods read it (from the
    /// snapshot).
    #[serde(skip)]
    pub preload: Option<String>,
    /// `OPENMED_SERVICE_SERVED_MODELS` as written on the container, when
    /// the operator writes it.
    #[serde(skip)]
    pub served: Option<String>,
    /// The HorizontalPodAutoscaler `spec.autoscaling` asks for, in a few
    /// words (its name, bounds and per-pod targets).
    #[serde(skip)]
    pub autoscaler: Option<String>,
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

/// Judges and plans a set of documents; any error means nothing is
/// rendered. Nothing of the output stream is built yet: the caller lays it
/// out with [`Rendered::documents`], so it can write each document as it
/// comes, knowing that the whole input is valid.
pub fn render<'a>(
    docs: &'a [Document],
    default_namespace: &str,
    missing: MissingTarget,
) -> Result<Rendered<'a>, Vec<Finding>> {
    render_running(docs, default_namespace, missing, &HashMap::new())
}

/// [`render`] for a cluster known to run `running`'s versions
/// (`namespace/name` to version): what `render --base` shows for the
/// change, whose served sets keep the version the base runs.
pub fn render_running<'a>(
    docs: &'a [Document],
    default_namespace: &str,
    missing: MissingTarget,
    running: &HashMap<String, String>,
) -> Result<Rendered<'a>, Vec<Finding>> {
    // One entry per OpenMedModel at most: sized once, never regrown.
    let models = docs.iter().filter(|d| manifests::is_model(d)).count();
    let mut planned = Vec::with_capacity(models);
    let mut as_model = HashMap::with_capacity(models);
    let mut rows = Vec::with_capacity(models);
    let mut notes = Vec::new();
    let mut canaries = Vec::new();
    let findings = manifests::resolve_each_running(docs, default_namespace, running, |model| {
        rows.push(SummaryRow {
            resource: model.id.key(),
            target: format!(
                "{}/{}",
                model.plan.deployment.name, model.plan.deployment.container
            ),
            version: model.plan.normalized.version.clone(),
            config_map: model
                .plan
                .config_map
                .metadata
                .name
                .clone()
                .unwrap_or_default(),
            pod_template_hash: model.plan.manifest_hash.clone(),
            output: if model.target_doc.is_some() {
                "full"
            } else {
                "patch"
            },
            snapshot: model.plan.snapshot.metadata.name.clone(),
            preload: model
                .plan
                .snapshot
                .data
                .as_ref()
                .and_then(|d| d.get(crate::api::names::PRELOAD_ENV))
                .cloned(),
            served: model.plan.deployment.served.clone(),
            autoscaler: model
                .autoscaling
                .as_ref()
                .map(|a| crate::plan::autoscaler::words(&model.id, a)),
        });
        canaries.extend(canary::report(&model, docs));
        if missing == MissingTarget::Warn {
            notes.extend(missing_targets(&model, &docs[model.doc]));
        }
        as_model.insert(model.doc, planned.len());
        planned.push(Planned::new(model));
    });
    if !findings.is_empty() {
        return Err(findings);
    }
    let index = |pick: fn(&Planned) -> Option<usize>| -> HashMap<usize, usize> {
        planned
            .iter()
            .enumerate()
            .filter_map(|(m, p)| Some((pick(p)?, m)))
            .collect()
    };
    Ok(Rendered {
        docs,
        missing,
        as_target: index(|p| p.target_doc),
        as_canary: index(|p| p.canary.as_ref()?.target_doc),
        as_config_map: index(|p| p.config_map_doc),
        as_snapshot: index(|p| p.snapshot_doc),
        as_autoscaler: index(|p| p.autoscaler_doc),
        as_model,
        planned,
        rows,
        notes,
        canaries,
    })
}

/// The warnings for a resource whose Deployments are not in the input,
/// when no patch is emitted for them.
fn missing_targets(model: &Model, doc: &Document) -> Vec<Finding> {
    let note = |at: &str, what: String| {
        Finding::warning(&doc.at(at), "TargetNotInInput", what)
            .resource(model.id.key())
            .field(format!("{at}.name"))
    };
    let mut notes = Vec::new();
    if model.target_doc.is_none() {
        notes.push(note(
            "spec.targetRef",
            format!(
                "Deployment {} is not among the resources; only its ConfigMap was added, and the operator will set the Deployment's fields in the cluster",
                model.plan.deployment.name
            ),
        ));
    }
    if let Some(canary) = &model.canary
        && canary.target_doc.is_none()
    {
        notes.push(note(
            "spec.canary.targetRef",
            format!(
                "canary Deployment {} is not among the resources; the operator will set its fields in the cluster",
                canary.plan.deployment.name
            ),
        ));
    }
    notes
}

impl Rendered<'_> {
    /// The output stream, in order, built one input document at a time:
    /// only the documents being written are in memory.
    pub fn documents(&self) -> impl Iterator<Item = Value> + '_ {
        self.docs
            .iter()
            .enumerate()
            .flat_map(|(i, doc)| self.outputs_of(i, doc))
    }

    /// What input document `i` becomes, followed by what its resource adds
    /// when it is an OpenMedModel.
    fn outputs_of(&self, i: usize, doc: &Document) -> Vec<Value> {
        let mut documents = Vec::new();
        if let Some(&m) = self.as_target.get(&i) {
            let mut deployment = doc.value.clone();
            self.planned[m]
                .deployment
                .apply_to(&mut deployment)
                .expect("resolve checked the container");
            documents.push(deployment);
        } else if let Some(&m) = self.as_canary.get(&i) {
            let mut deployment = doc.value.clone();
            let canary = self.planned[m]
                .canary
                .as_ref()
                .expect("indexed by its canary");
            canary
                .deployment
                .apply_to(&mut deployment)
                .expect("resolve checked the canary's container");
            documents.push(deployment);
        } else if let Some(&m) = self.as_config_map.get(&i) {
            documents.push(self.planned[m].config_map());
        } else if let Some(&m) = self.as_snapshot.get(&i) {
            documents.push(self.planned[m].snapshot());
        } else if let Some(hpa) = self
            .as_autoscaler
            .get(&i)
            .and_then(|&m| self.planned[m].autoscaler())
        {
            documents.push(hpa);
        } else {
            documents.push(doc.value.clone());
        }
        if let Some(&m) = self.as_model.get(&i) {
            let planned = &self.planned[m];
            if planned.config_map_doc.is_none() {
                documents.push(planned.config_map());
            }
            if planned.snapshot_doc.is_none() {
                documents.push(planned.snapshot());
            }
            if planned.autoscaler_doc.is_none()
                && let Some(hpa) = planned.autoscaler()
            {
                documents.push(hpa);
            }
            if self.missing == MissingTarget::Patch {
                if planned.target_doc.is_none() {
                    documents.push(planned.deployment.strategic_patch());
                }
                if let Some(canary) = &planned.canary
                    && canary.target_doc.is_none()
                {
                    documents.push(canary.deployment.strategic_patch());
                }
            }
        }
        documents
    }
}

/// An autoscaler (a HorizontalPodAutoscaler or a ScaledObject) as a
/// document, keys in the order people read manifests.
fn autoscaler_document(mut value: Value) -> Value {
    if let Some(meta) = value.get_mut("metadata") {
        order_keys(meta, &["name", "namespace", "labels", "annotations"]);
    }
    order_keys(&mut value, &["apiVersion", "kind", "metadata", "spec"]);
    value
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
