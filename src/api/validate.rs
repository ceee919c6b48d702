//! The one `validate`: what the API server would refuse, refused earlier.
//!
//! The operator, `render` and `verify` all call this, so a resource is judged
//! the same way everywhere. It checks the raw object, not the typed spec, so
//! it can see what serde would silently drop (unknown fields) or coerce.
//!
//! It reads its rules from the generated CRD schema instead of restating
//! them: the structural part (known fields, types, required fields, enums,
//! patterns, ranges) by walking `openAPIV3Schema`, and the cross-field rules
//! by evaluating the schema's own `x-kubernetes-validations` CEL rules with
//! kube's CEL engine. The CRD and `validate` therefore cannot drift apart; a
//! test on a real API server checks that both refuse the same inputs. Rules
//! that only hold against a target Deployment (its `minReadySeconds`) are
//! checked here too, because the API server would only refuse them later,
//! when the operator writes the Deployment.

use std::fmt;
use std::sync::{Mutex, OnceLock};

use serde_json::{Map, Value};

use super::{OpenMedModelSpec, endpoints, openapi_schema, rules};
use crate::text::quote;

/// One problem with a resource: the field and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the field, `spec.rolloutStrategy.maxSurge`.
    pub path: String,
    /// What is wrong and what is allowed, for a person.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// What is known about the target Deployment, when it is known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetFacts {
    /// The Deployment's `spec.minReadySeconds` (0 when unset).
    pub min_ready_seconds: i32,
}

/// Validates a whole OpenMedModel object (`metadata.name` and `spec`) and
/// returns its typed spec with defaults filled in.
pub fn validate(
    object: &Value,
    target: Option<&TargetFacts>,
) -> Result<OpenMedModelSpec, Vec<FieldError>> {
    let mut errors = Vec::new();
    match object.pointer("/metadata/name") {
        Some(Value::String(name)) if rules::is_dns_subdomain(name) => {}
        Some(Value::String(name)) => errors.push(FieldError {
            path: "metadata.name".into(),
            message: format!("{} is not a valid name: {}", quote(name), hint("name")),
        }),
        _ => errors.push(FieldError {
            path: "metadata.name".into(),
            message: "required field is missing".into(),
        }),
    }
    match object.pointer("/metadata/namespace") {
        None | Some(Value::Null) => {}
        Some(Value::String(ns)) if rules::is_dns_label(ns) => {}
        Some(Value::String(ns)) => errors.push(FieldError {
            path: "metadata.namespace".into(),
            message: format!(
                "{} is not a valid namespace name: {}",
                quote(ns),
                hint("namespace")
            ),
        }),
        Some(other) => errors.push(FieldError {
            path: "metadata.namespace".into(),
            message: format!("must be a string, not {}", describe(other)),
        }),
    }
    if let Some(map) = object.as_object() {
        // The API server's strict field validation refuses unknown fields at
        // the top as well as in the spec.
        for key in map.keys() {
            if !TOP_LEVEL.contains(&key.as_str()) {
                let suggestion = closest(key, TOP_LEVEL)
                    .map(|k| format!("did you mean {k:?}? "))
                    .unwrap_or_default();
                errors.push(FieldError {
                    path: key.clone(),
                    message: format!(
                        "unknown field; {suggestion}known fields: {}",
                        TOP_LEVEL.join(", ")
                    ),
                });
            }
        }
    }
    match object.get("spec") {
        Some(spec) => match validate_spec(spec, target) {
            Ok(spec) if errors.is_empty() => return Ok(spec),
            Ok(_) => {}
            Err(spec_errors) => errors.extend(spec_errors),
        },
        None => errors.push(FieldError {
            path: "spec".into(),
            message: "required field is missing".into(),
        }),
    }
    Err(errors)
}

/// The fields an OpenMedModel object has at the top.
const TOP_LEVEL: &[&str] = &["apiVersion", "kind", "metadata", "spec", "status"];

/// Validates a raw `spec` and returns it typed, with defaults filled in.
pub fn validate_spec(
    spec: &Value,
    target: Option<&TargetFacts>,
) -> Result<OpenMedModelSpec, Vec<FieldError>> {
    let schema = spec_schema();
    let mut errors = Vec::new();
    check_node(spec, schema, "spec", &mut errors);
    if !errors.is_empty() {
        return Err(errors);
    }
    let typed: OpenMedModelSpec = serde_json::from_value(spec.clone()).map_err(|e| {
        // The schema walk accepts only what the types can hold; reaching
        // this means the two disagree, which is a bug worth reporting plainly.
        vec![FieldError {
            path: "spec".into(),
            message: format!("cannot be read: {e}"),
        }]
    })?;
    let defaulted = serde_json::to_value(&typed).expect("a spec serializes to JSON");
    check_cel(&defaulted, &mut errors);
    if let Some(target) = target {
        let deadline = typed.rollout_strategy.progress_deadline_seconds;
        if deadline <= target.min_ready_seconds {
            errors.push(FieldError {
                path: "spec.rolloutStrategy.progressDeadlineSeconds".into(),
                message: format!(
                    "{deadline} must be greater than the target Deployment's minReadySeconds ({}), or the Deployment is rejected",
                    target.min_ready_seconds
                ),
            });
        }
    }
    if errors.is_empty() {
        Ok(typed)
    } else {
        Err(errors)
    }
}

/// The `spec` part of the CRD schema.
fn spec_schema() -> &'static Value {
    openapi_schema()
        .pointer("/properties/spec")
        .expect("the CRD schema has a spec")
}

/// Walks `value` against a structural schema node, collecting every problem.
fn check_node(value: &Value, schema: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let before = errors.len();
    if value.is_null() {
        if schema.get("nullable") != Some(&Value::Bool(true)) {
            errors.push(error(path, "must not be null".into()));
        }
        return;
    }
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        if !(value.is_i64() || value.is_u64() || value.is_string()) {
            errors.push(error(
                path,
                format!(
                    "must be a whole number or a percentage, not {}",
                    describe(value)
                ),
            ));
            return;
        }
    } else if schema.get("type") == Some(&Value::String("integer".into()))
        && value.as_f64().is_some_and(|x| x.fract() == 0.0)
        && !(value.is_i64() || value.is_u64())
    {
        // A whole number too large for JSON's integers (1e23): the API
        // server reads it as a float out of any integer's range.
        check_number(value.as_f64().unwrap_or_default(), schema, path, errors);
        if errors.len() == before {
            errors.push(error(path, format!("{} is out of range", describe(value))));
        }
        return;
    } else if let Some(Value::String(ty)) = schema.get("type")
        && !has_type(value, ty)
    {
        errors.push(error(
            path,
            format!("must be {}, not {}", article(ty), describe(value)),
        ));
        return;
    }
    if let Some(Value::Array(allowed)) = schema.get("enum")
        && !allowed.contains(value)
    {
        let names: Vec<String> = allowed.iter().map(plain).collect();
        errors.push(error(
            path,
            format!("{} is not one of: {}", describe(value), names.join(", ")),
        ));
    }
    if let Value::String(s) = value {
        check_string(s, schema, path, errors);
    }
    if let Some(n) = value.as_f64() {
        check_number(n, schema, path, errors);
    }
    for part in ["allOf", "anyOf"] {
        if let Some(Value::Array(parts)) = schema.get(part) {
            for sub in parts {
                let mut sub_errors = Vec::new();
                check_node(value, sub, path, &mut sub_errors);
                // `anyOf` here only lists the int-or-string alternatives, which
                // the check above has already enforced.
                if part == "allOf" {
                    errors.extend(sub_errors);
                }
            }
        }
    }
    if errors.len() > before {
        return;
    }
    match value {
        Value::Object(map) => check_object(map, schema, path, errors),
        Value::Array(items) => {
            let n = items.len() as u64;
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                && n > max
            {
                errors.push(error(
                    path,
                    format!("has {n} items, at most {max} are allowed"),
                ));
            }
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                && n < min
            {
                errors.push(error(path, format!("needs at least {min} item(s)")));
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check_node(item, item_schema, &format!("{path}[{i}]"), errors);
                }
            }
        }
        _ => {}
    }
}

fn check_object(
    map: &Map<String, Value>,
    schema: &Value,
    path: &str,
    errors: &mut Vec<FieldError>,
) {
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let open = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        || schema.get("additionalProperties").is_some();
    if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
        && map.len() as u64 > max
    {
        errors.push(error(
            path,
            format!("has {} entries, at most {max} are allowed", map.len()),
        ));
    }
    let values = schema.get("additionalProperties").filter(|v| v.is_object());
    for (key, child) in map {
        let child_path = format!("{path}.{key}");
        match properties.get(key) {
            Some(child_schema) => check_node(child, child_schema, &child_path, errors),
            // A map: every value has the same schema.
            None if values.is_some() => {
                check_node(child, values.expect("checked"), &child_path, errors)
            }
            None if open => {}
            None => {
                let known: Vec<&str> = properties.keys().map(String::as_str).collect();
                let suggestion = closest(key, &known)
                    .map(|k| format!("did you mean {k:?}? "))
                    .unwrap_or_default();
                errors.push(error(
                    &child_path,
                    format!(
                        "unknown field; {suggestion}known fields: {}",
                        known.join(", ")
                    ),
                ));
            }
        }
    }
    if let Some(Value::Array(required)) = schema.get("required") {
        for name in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(name) {
                errors.push(error(
                    &format!("{path}.{name}"),
                    format!("required field is missing ({})", hint(name)),
                ));
            }
        }
    }
}

fn check_string(s: &str, schema: &Value, path: &str, errors: &mut Vec<FieldError>) {
    // Kubernetes counts string lengths in characters, not bytes.
    let len = s.chars().count() as u64;
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
        && len > max
    {
        errors.push(error(
            path,
            format!("is {len} characters long, at most {max} are allowed"),
        ));
        return;
    }
    if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
        && len < min
    {
        errors.push(error(
            path,
            format!("must be at least {min} characters long"),
        ));
        return;
    }
    if let Some(Value::String(pattern)) = schema.get("pattern")
        && !rules::regex(pattern).is_match(s)
    {
        let field = path.rsplit('.').next().unwrap_or(path);
        // An endpoint may carry credentials or a token: the message goes
        // into status and Events.
        let shown = match field {
            "address" | "url" => quote(&endpoints::redact(s)),
            _ => quote(s),
        };
        errors.push(error(
            path,
            format!("{shown} is not valid: {}", hint(field)),
        ));
    }
}

fn check_number(n: f64, schema: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let min = schema.get("minimum").and_then(Value::as_f64);
    let max = schema.get("maximum").and_then(Value::as_f64);
    let out_of_range = min.is_some_and(|m| n < m) || max.is_some_and(|m| n > m);
    if out_of_range {
        let range = match (min, max) {
            (Some(lo), Some(hi)) => format!("from {lo} to {hi}"),
            (Some(lo), None) => format!("at least {lo}"),
            (None, Some(hi)) => format!("at most {hi}"),
            (None, None) => unreachable!(),
        };
        errors.push(error(path, format!("{n} is out of range: must be {range}")));
    }
}

/// Evaluates the CRD's CEL rules on the defaulted spec.
fn check_cel(spec: &Value, errors: &mut Vec<FieldError>) {
    use kube::core::cel::{CompiledSchema, Validator, compile_schema};
    static ENGINE: OnceLock<Mutex<(Validator, CompiledSchema)>> = OnceLock::new();
    let engine =
        ENGINE.get_or_init(|| Mutex::new((Validator::new(), compile_schema(spec_schema()))));
    let engine = engine.lock().expect("CEL engine");
    let (validator, compiled) = &*engine;
    if let Err(failures) = validator.validate_compiled(compiled, spec, None) {
        for failure in failures.into_vec() {
            // A rule's own fieldPath is relative (".qualityGate").
            let field = failure.field_path.trim_start_matches('.');
            let path = if field.is_empty() {
                "spec".to_owned()
            } else {
                format!("spec.{field}")
            };
            errors.push(error(&path, failure.message));
        }
    }
}

fn error(path: &str, message: String) -> FieldError {
    FieldError {
        path: path.to_owned(),
        message,
    }
}

fn has_type(value: &Value, ty: &str) -> bool {
    match ty {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        _ => true,
    }
}

fn article(ty: &str) -> &'static str {
    match ty {
        "object" => "a mapping",
        "array" => "a list",
        "string" => "a string",
        "boolean" => "true or false",
        "integer" => "a whole number",
        "number" => "a number",
        _ => "of another type",
    }
}

fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("{b}"),
        Value::Number(n) => format!("{n}"),
        Value::String(s) => quote(s),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "a mapping".into(),
    }
}

fn plain(value: &Value) -> String {
    value
        .as_str()
        .map_or_else(|| value.to_string(), str::to_owned)
}

/// What a valid value of a field looks like, in words.
fn hint(field: &str) -> &'static str {
    match field {
        "family" => {
            "a letter, then letters, digits, '.', '_' or '-', at most 63 characters, not ending in a symbol (e.g. pii)"
        }
        "version" => {
            "a letter or digit, then letters, digits or . _ : @ / + ~ -, no spaces, at most 253 characters (e.g. OpenMed/pii-v2)"
        }
        "tier" => "one of Tiny, Small, Medium, Base, Large, XLarge, Accurate-XLarge",
        "namespace" => {
            "lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters"
        }
        "name" | "manifestConfigMapName" => {
            "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters"
        }
        "containerName" => {
            "lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters"
        }
        "maxSurge" | "maxUnavailable" => {
            "a whole number of pods (0 or more) or a percentage from 0% to 100%"
        }
        "pause" | "interval" | "timeout" => {
            "a duration of whole numbers with ms, s, m or h (e.g. 30s, 5m, 1h30m)"
        }
        "address" | "url" => "an http:// or https:// URL with a host",
        "httpRoute" => {
            "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters"
        }
        "ruleName" | "stableBackend" | "canaryBackend" => {
            "lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters"
        }
        _ => "see `kubectl explain openmedmodel.spec`",
    }
}

/// The known field a mistyped key most likely meant, if one is close.
fn closest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    let key = key.to_ascii_lowercase();
    known
        .iter()
        .map(|k| (strsim::levenshtein(&key, &k.to_ascii_lowercase()), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        .min()
        .map(|(_, k)| k)
}
