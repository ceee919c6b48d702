//! The field reference of `OpenMedModel`, in Markdown, drawn from the
//! generated CRD's schema: what `openmed-op crd --reference` prints and
//! `docs/reference.md` holds. Pure: the same schema gives the same bytes.

use std::fmt::Write as _;

use serde_json::Value;

/// The reference of the whole resource: `spec`, then `status`.
pub fn markdown() -> String {
    from_schema(super::openapi_schema())
}

/// The reference drawn from an OpenAPI v3 schema of the resource.
pub fn from_schema(schema: &Value) -> String {
    let mut out = String::new();
    out.push_str(
        "# OpenMedModel reference\n\n\
         <!-- Generated from the CRD by `openmed-op crd --reference`; do not edit by hand. -->\n\n\
         `apiVersion: openmed.ai/v1alpha1`, `kind: OpenMedModel` (short name `omm`), \
         namespaced. Every field below, with its type, bounds and default as the API server \
         enforces them; the descriptions are the ones `kubectl explain openmedmodel.spec` \
         prints. A field marked *required* must be set when its parent is.\n",
    );
    if let Some(description) = schema.get("description").and_then(Value::as_str) {
        let _ = write!(out, "\n{}\n", description.trim());
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    for top in ["spec", "status"] {
        if let Some(node) = properties.and_then(|p| p.get(top)) {
            let _ = write!(out, "\n## `{top}`\n");
            if let Some(description) = node.get("description").and_then(Value::as_str) {
                let _ = write!(out, "\n{}\n", description.trim());
            }
            fields(&mut out, top, node);
        }
    }
    out
}

/// Every property of `node` (an object schema), in the schema's order,
/// each followed by its own properties.
fn fields(out: &mut String, path: &str, node: &Value) {
    let Some(properties) = node.get("properties").and_then(Value::as_object) else {
        return;
    };
    let required: Vec<&str> = node
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (name, child) in properties {
        let child_path = format!("{path}.{name}");
        field(out, &child_path, child, required.contains(&name.as_str()));
        let (inner, inner_path) = match child.get("items") {
            Some(items) if kind(child) == "array" => (items, format!("{child_path}[]")),
            _ => (child, child_path),
        };
        fields(out, &inner_path, inner);
    }
}

/// One field: its heading, a line of facts, its description and rules.
fn field(out: &mut String, path: &str, node: &Value, required: bool) {
    let _ = write!(out, "\n### `{path}`\n\n");
    let mut facts = vec![type_name(node)];
    if required {
        facts.push("*required*".to_owned());
    }
    facts.extend(bounds(node));
    if let Some(default) = node.get("default") {
        facts.push(format!("default `{}`", compact(default)));
    }
    if node.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        facts.push("any fields kept as written".to_owned());
    }
    let _ = writeln!(out, "{}", facts.join(" · "));
    if let Some(description) = node.get("description").and_then(Value::as_str) {
        let _ = write!(out, "\n{}\n", description.trim());
    }
    let rules = node
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if !rules.is_empty() {
        out.push_str("\nRules the API server checks:\n\n");
        for rule in rules {
            let message = rule.get("message").and_then(Value::as_str);
            let cel = rule.get("rule").and_then(Value::as_str).unwrap_or_default();
            match message {
                Some(message) => {
                    let _ = writeln!(out, "- {} (`{}`)", message.trim(), one_line(cel));
                }
                None => {
                    let _ = writeln!(out, "- `{}`", one_line(cel));
                }
            }
        }
    }
}

fn kind(node: &Value) -> &str {
    node.get("type").and_then(Value::as_str).unwrap_or_default()
}

/// The type as a reader says it: `integer (int32)`, `array of object`,
/// `map of string to string`, `integer or string`.
fn type_name(node: &Value) -> String {
    if node.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return "integer or string".to_owned();
    }
    let base = match kind(node) {
        "" => "any".to_owned(),
        "array" => match node.get("items") {
            Some(items) => format!("array of {}", type_name(items)),
            None => "array".to_owned(),
        },
        "object" => match node.get("additionalProperties") {
            Some(values @ Value::Object(_)) => format!("map of string to {}", type_name(values)),
            _ => "object".to_owned(),
        },
        other => other.to_owned(),
    };
    match node.get("format").and_then(Value::as_str) {
        Some(format) => format!("{base} ({format})"),
        None => base,
    }
}

/// Bounds and shapes the schema puts on a value.
fn bounds(node: &Value) -> Vec<String> {
    let number = |key: &str| node.get(key).and_then(Value::as_f64).map(trim_float);
    let mut out = Vec::new();
    match (number("minimum"), number("maximum")) {
        (Some(min), Some(max)) => out.push(format!("{min} to {max}")),
        (Some(min), None) => out.push(format!("at least {min}")),
        (None, Some(max)) => out.push(format!("at most {max}")),
        (None, None) => {}
    }
    for (min_key, max_key, what) in [
        ("minLength", "maxLength", "characters"),
        ("minItems", "maxItems", "items"),
        ("minProperties", "maxProperties", "entries"),
    ] {
        match (number(min_key), number(max_key)) {
            (Some(min), Some(max)) => out.push(format!("{min} to {max} {what}")),
            (Some(min), None) => out.push(format!("at least {min} {what}")),
            (None, Some(max)) => out.push(format!("at most {max} {what}")),
            (None, None) => {}
        }
    }
    if let Some(values) = node.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values.iter().map(|v| format!("`{}`", compact(v))).collect();
        out.push(format!("one of {}", values.join(", ")));
    }
    if let Some(pattern) = node.get("pattern").and_then(Value::as_str) {
        out.push(format!("matches `{pattern}`"));
    }
    out
}

fn trim_float(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{}", f as i64)
    } else {
        format!("{f}")
    }
}

/// A value as it would be written in YAML flow style, for a default or an
/// enum member: strings bare, everything else as JSON.
fn compact(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_field_says_its_type_bounds_default_and_whether_it_is_required() {
        let schema = json!({
            "properties": {"spec": {"properties": {
                "replicas": {"type": "integer", "format": "int32", "minimum": 1.0,
                             "maximum": 1000.0, "default": 2, "description": "How many."},
                "tier": {"type": "string", "enum": ["Tiny", "Small"]},
            }, "required": ["tier"], "type": "object"}}
        });
        let md = from_schema(&schema);
        assert!(
            md.contains(
                "### `spec.replicas`\n\ninteger (int32) · 1 to 1000 · default `2`\n\nHow many.\n"
            ),
            "{md}"
        );
        assert!(
            md.contains("### `spec.tier`\n\nstring · *required* · one of `Tiny`, `Small`\n"),
            "{md}"
        );
    }

    #[test]
    fn items_of_an_array_are_listed_under_it() {
        let schema = json!({"properties": {"spec": {"type": "object", "properties": {
            "steps": {"type": "array", "items": {"type": "object", "properties": {
                "weight": {"type": "integer"}}}}}}}});
        let md = from_schema(&schema);
        assert!(md.contains("### `spec.steps`\n\narray of object\n"), "{md}");
        assert!(
            md.contains("### `spec.steps[].weight`\n\ninteger\n"),
            "{md}"
        );
    }

    #[test]
    fn the_resources_reference_names_every_spec_field() {
        let md = markdown();
        for field in [
            "spec.family",
            "spec.tier",
            "spec.version",
            "spec.canary.steps[].weight",
        ] {
            assert!(md.contains(&format!("### `{field}`")), "{field} missing");
        }
    }

    #[test]
    fn a_map_and_a_rule_are_said_as_such() {
        let schema = json!({"properties": {"spec": {"type": "object", "properties": {
            "minRecall": {"type": "object", "additionalProperties": {"type": "number"},
                "x-kubernetes-validations": [{"rule": "self.all(k,\n  self[k] <= 1.0)",
                                              "message": "at most 1"}]}}}}});
        let md = from_schema(&schema);
        assert!(md.contains("map of string to number"), "{md}");
        assert!(
            md.contains("- at most 1 (`self.all(k, self[k] <= 1.0)`)"),
            "{md}"
        );
    }
}
