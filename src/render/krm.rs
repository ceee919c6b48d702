//! `openmed-op render --krm`: `render` as a KRM function.
//!
//! kpt (`kpt fn eval --exec`) and kustomize (exec transformers) hand a
//! function a `ResourceList` (config.kubernetes.io/v1) on stdin and read one
//! back (<https://github.com/kubernetes-sigs/kustomize/blob/master/cmd/config/docs/api-conventions/functions-spec.md>).
//! The items are transformed exactly as `render` transforms a stream, other
//! items and their `internal.config.kubernetes.io/*` annotations are left
//! as they are, and every finding becomes a result with severity, resource,
//! field and file. On an error the items are returned unchanged with the
//! results, and the exit code is non-zero.

use serde_json::{Value, json};

use super::{MissingTarget, render};
use crate::findings::{Finding, Severity};
use crate::source::{self, Document};

/// What a function run produced.
pub struct KrmOutput {
    /// The output `ResourceList`, as YAML.
    pub text: String,
    /// An error result was reported.
    pub failed: bool,
}

const PATH_ANNOTATIONS: [&str; 2] = [
    "internal.config.kubernetes.io/path",
    "config.kubernetes.io/path",
];
const INDEX_ANNOTATIONS: [&str; 2] = [
    "internal.config.kubernetes.io/index",
    "config.kubernetes.io/index",
];

/// Runs the function on a `ResourceList`. An input that is not one is an
/// error for the caller to report (exit 2).
pub fn run(input: &str) -> Result<KrmOutput, String> {
    let docs = source::parse_stream("<stdin>", input).map_err(|e| e.to_string())?;
    let list = match docs.as_slice() {
        [doc] if doc.kind() == Some("ResourceList") => &doc.value,
        _ => return Err("stdin must hold one config.kubernetes.io/v1 ResourceList".into()),
    };
    let items: Vec<Value> = match list.get("items") {
        Some(Value::Array(items)) => items.clone(),
        None | Some(Value::Null) => Vec::new(),
        Some(_) => return Err("ResourceList.items must be a list".into()),
    };
    let config = list.get("functionConfig");
    let namespace = config
        .and_then(|c| {
            c.pointer("/data/namespace")
                .or_else(|| c.pointer("/spec/namespace"))
        })
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_owned();

    let documents: Vec<Document> = items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let annotation = |keys: [&str; 2]| {
                keys.iter()
                    .find_map(|k| item.pointer("/metadata/annotations")?.get(*k)?.as_str())
            };
            let origin = annotation(PATH_ANNOTATIONS).unwrap_or("<resource list>");
            let index = annotation(INDEX_ANNOTATIONS)
                .and_then(|s| s.parse().ok())
                .unwrap_or(i);
            Document::from_value(origin, index, item.clone())
        })
        .collect();

    let (items, findings, failed) = match render(&documents, &namespace, MissingTarget::Warn) {
        Ok(rendered) => (rendered.documents().collect(), rendered.notes, false),
        Err(findings) => (items, findings, true),
    };
    let mut output = json!({
        "apiVersion": "config.kubernetes.io/v1",
        "kind": "ResourceList",
        "items": items,
    });
    if !findings.is_empty() {
        output["results"] = Value::Array(findings.iter().map(result).collect());
    }
    Ok(KrmOutput {
        text: crate::source::yaml::write::document(&output),
        failed,
    })
}

/// A finding as a KRM `Result`.
fn result(finding: &Finding) -> Value {
    let mut result = json!({
        "message": format!("[{}] {}", finding.rule, finding.message),
        "severity": match finding.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        },
    });
    if let Some((namespace, name)) = finding.resource.as_deref().and_then(|r| r.split_once('/')) {
        result["resourceRef"] = json!({
            "apiVersion": crate::api::API_VERSION,
            "kind": crate::api::KIND,
            "name": name,
            "namespace": namespace,
        });
    }
    if let Some(field) = &finding.field {
        result["field"] = json!({ "path": field });
    }
    if finding.location.file != "<resource list>" {
        result["file"] = json!({
            "path": finding.location.file,
            "index": finding.location.document.saturating_sub(1),
        });
    }
    result
}
