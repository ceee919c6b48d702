//! `spec.qualityGate`: a model is judged on what it finds before it
//! serves a request.
//!
//! For a de-identification service the failure that matters most is not
//! an error: it is a new model that warms, answers 200, and quietly stops
//! tagging dates or names. The gate sends a set of labelled synthetic
//! texts (a probe set, in a ConfigMap) to the service's own
//! `POST /pii/extract` on each new pod, and the pod becomes Ready only when
//! the recall per label reaches its bound.
//!
//! This module holds the resource's fields and the probe set's format (the
//! versioned document in the ConfigMap), with the one parser that the
//! operator and `verify` both call. Judging the answers is the rollout
//! core's (`rollout::quality`).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{FieldError, rules};
use crate::text::quote;

/// The pod condition a gated pod waits for, and the readiness gate the
/// pod template carries.
pub const QUALITY_CONDITION: &str = "openmed.ai/model-quality";

/// The ConfigMap key that holds the probe set.
pub const PROBE_SET_KEY: &str = "probes.yaml";

/// `apiVersion` of a probe set document.
pub const PROBE_SET_API_VERSION: &str = "openmed.ai/v1alpha1";

/// `kind` of a probe set document.
pub const PROBE_SET_KIND: &str = "PIIProbeSet";

/// The most probes in one set: each is sent once to each new pod.
pub const MAX_PROBES: usize = 100;

/// The longest probe text, in characters.
pub const MAX_PROBE_TEXT: usize = 4096;

/// The label of `minRecall` that stands for every label not named.
pub const ANY_LABEL: &str = "*";

/// Labelled probes, and the recall a model must reach on them.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QualityGate {
    /// The ConfigMap in this namespace whose key `probes.yaml` holds the
    /// probe set: synthetic texts with the entities they must yield. Never
    /// put patient data in it: it is sent to every new pod.
    pub config_map_ref: ConfigMapRef,

    /// The least recall (0 to 1) per entity label, e.g. `{NAME: 1.0, DATE:
    /// 0.95}`; the key `*` stands for every label of the probe set not
    /// named. A label without a bound is measured and reported, never
    /// judged; a key that names no label of the probe set bounds nothing
    /// and is refused. Default `{"*": 1.0}`: every labelled entity must be
    /// found.
    #[serde(default = "default_min_recall")]
    #[schemars(schema_with = "min_recall_schema")]
    pub min_recall: BTreeMap<String, f64>,

    /// Also require, per label, at least the recall of the version being
    /// replaced, measured on one of its pods in the same round. Default
    /// false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_worse_than_stable: bool,
}

/// A ConfigMap in the resource's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapRef {
    /// The ConfigMap's name.
    #[schemars(
        regex(pattern = rules::DNS_SUBDOMAIN_PATTERN),
        length(max = rules::DNS_SUBDOMAIN_MAX)
    )]
    pub name: String,
}

fn default_min_recall() -> BTreeMap<String, f64> {
    BTreeMap::from([(ANY_LABEL.to_owned(), 1.0)])
}

fn min_recall_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {"type": "number", "minimum": 0.0, "maximum": 1.0},
        "maxProperties": 64,
        "x-kubernetes-validations": [{
            "rule": "self.all(k, k == '*' || k.matches('^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$'))",
            "message": "labels are letters, digits, _ . - (at most 63), or * for every other label",
        }],
    })
}

impl QualityGate {
    /// The bound for `label`, if any.
    pub fn bound(&self, label: &str) -> Option<f64> {
        self.min_recall
            .get(label)
            .or_else(|| self.min_recall.get(ANY_LABEL))
            .copied()
    }
}

/// A probe set: the document in the ConfigMap's `probes.yaml`.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeSet {
    /// Extra fields sent with every request, e.g. `use_smart_merging:
    /// false` to judge the model without the service's pattern rules.
    pub request: serde_json::Map<String, Value>,
    /// The probes.
    pub probes: Vec<Probe>,
}

/// One synthetic text and the entities it must yield.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    /// The text sent.
    pub text: String,
    /// What a good model finds in it.
    pub entities: Vec<Span>,
}

/// A labelled span of a text, in characters (Unicode code points, as the
/// service counts them), `end` exclusive.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Span {
    /// The entity label, as the service reports it (`NAME`, `DATE`).
    pub label: String,
    /// First character.
    pub start: usize,
    /// One past the last character.
    pub end: usize,
}

impl ProbeSet {
    /// Every label the set expects, sorted.
    pub fn labels(&self) -> Vec<String> {
        let mut labels: Vec<String> = self
            .probes
            .iter()
            .flat_map(|p| p.entities.iter().map(|e| e.label.clone()))
            .collect();
        labels.sort();
        labels.dedup();
        labels
    }
}

/// The fields a request may not set: the gate sends the text and names
/// the model itself.
const RESERVED_REQUEST_FIELDS: &[&str] = &["text", "model_name"];

/// Reads a probe set from its JSON value (the YAML document, read as the
/// API server reads YAML). Errors name the field path inside the
/// document, `probes[2].entities[0].end`.
pub fn parse_probe_set(doc: &Value) -> Result<ProbeSet, Vec<FieldError>> {
    let mut errors = Vec::new();
    let err = |errors: &mut Vec<FieldError>, path: &str, message: String| {
        errors.push(FieldError {
            path: path.to_owned(),
            message,
        })
    };
    let Some(map) = doc.as_object() else {
        err(
            &mut errors,
            "",
            format!(
                "a probe set is a mapping with apiVersion {PROBE_SET_API_VERSION}, kind {PROBE_SET_KIND} and probes"
            ),
        );
        return Err(errors);
    };
    for key in map.keys() {
        if !["apiVersion", "kind", "request", "probes"].contains(&key.as_str()) {
            err(
                &mut errors,
                key,
                "unknown field; known fields: apiVersion, kind, request, probes".into(),
            );
        }
    }
    match map.get("apiVersion").and_then(Value::as_str) {
        Some(PROBE_SET_API_VERSION) => {}
        other => err(
            &mut errors,
            "apiVersion",
            format!(
                "must be {PROBE_SET_API_VERSION}, not {}",
                other.map_or("missing".into(), quote)
            ),
        ),
    }
    match map.get("kind").and_then(Value::as_str) {
        Some(PROBE_SET_KIND) => {}
        other => err(
            &mut errors,
            "kind",
            format!(
                "must be {PROBE_SET_KIND}, not {}",
                other.map_or("missing".into(), quote)
            ),
        ),
    }
    let request = match map.get("request") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(fields)) => {
            for reserved in RESERVED_REQUEST_FIELDS {
                if fields.contains_key(*reserved) {
                    err(
                        &mut errors,
                        &format!("request.{reserved}"),
                        "is set by the gate itself; remove it".into(),
                    );
                }
            }
            fields.clone()
        }
        Some(_) => {
            err(
                &mut errors,
                "request",
                "must be a mapping of extra request fields".into(),
            );
            serde_json::Map::new()
        }
    };
    let mut probes = Vec::new();
    match map.get("probes") {
        Some(Value::Array(items)) if !items.is_empty() && items.len() <= MAX_PROBES => {
            for (i, item) in items.iter().enumerate() {
                if let Some(probe) = parse_probe(item, &format!("probes[{i}]"), &mut errors) {
                    probes.push(probe);
                }
            }
        }
        Some(Value::Array(items)) if items.is_empty() => {
            err(&mut errors, "probes", "needs at least one probe".into())
        }
        Some(Value::Array(items)) => err(
            &mut errors,
            "probes",
            format!(
                "{} probes; at most {MAX_PROBES} (each is sent to every new pod)",
                items.len()
            ),
        ),
        _ => err(
            &mut errors,
            "probes",
            "required: a list of {text, entities}".into(),
        ),
    }
    if errors.is_empty() && probes.iter().all(|p| p.entities.is_empty()) {
        err(
            &mut errors,
            "probes",
            "no probe names an entity: there is nothing to measure recall on".into(),
        );
    }
    if errors.is_empty() {
        Ok(ProbeSet { request, probes })
    } else {
        Err(errors)
    }
}

fn parse_probe(item: &Value, path: &str, errors: &mut Vec<FieldError>) -> Option<Probe> {
    let mut push = |p: String, message: String| errors.push(FieldError { path: p, message });
    let Some(map) = item.as_object() else {
        push(path.into(), "must be a mapping {text, entities}".into());
        return None;
    };
    for key in map.keys() {
        if key != "text" && key != "entities" {
            push(
                format!("{path}.{key}"),
                "unknown field; known fields: text, entities".into(),
            );
        }
    }
    let Some(text) = map.get("text").and_then(Value::as_str) else {
        push(format!("{path}.text"), "required: a string".into());
        return None;
    };
    let chars = text.chars().count();
    if chars == 0 || chars > MAX_PROBE_TEXT {
        push(
            format!("{path}.text"),
            format!("{chars} characters; 1 to {MAX_PROBE_TEXT}"),
        );
        return None;
    }
    let mut entities = Vec::new();
    match map.get("entities") {
        None => {}
        Some(Value::Array(items)) => {
            for (j, e) in items.iter().enumerate() {
                let at = format!("{path}.entities[{j}]");
                let label = e.get("label").and_then(Value::as_str);
                let start = e.get("start").and_then(Value::as_u64);
                let end = e.get("end").and_then(Value::as_u64);
                if let Some(extra) = e.as_object().and_then(|m| {
                    m.keys()
                        .find(|k| !["label", "start", "end"].contains(&k.as_str()))
                }) {
                    push(
                        format!("{at}.{extra}"),
                        "unknown field; known fields: label, start, end".into(),
                    );
                    continue;
                }
                match (label, start, end) {
                    (Some(label), Some(start), Some(end)) => {
                        let (start, end) = (start as usize, end as usize);
                        if !rules::is_probe_label(label) {
                            push(
                                format!("{at}.label"),
                                format!(
                                    "{} is not a label: letters, digits, _ . -, at most 63",
                                    quote(label)
                                ),
                            );
                        } else if start >= end || end > chars {
                            push(
                                at,
                                format!(
                                    "span {start}..{end} is not inside the text's {chars} characters (start < end <= length)"
                                ),
                            );
                        } else {
                            entities.push(Span {
                                label: label.to_owned(),
                                start,
                                end,
                            });
                        }
                    }
                    _ => push(
                        at,
                        "needs label (a string), start and end (whole numbers, characters)".into(),
                    ),
                }
            }
        }
        Some(_) => push(
            format!("{path}.entities"),
            "must be a list of {label, start, end}".into(),
        ),
    }
    Some(Probe {
        text: text.to_owned(),
        entities,
    })
}
