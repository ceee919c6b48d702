//! The committed CRD is the generated one, and it keeps the shapes a real
//! API server requires of a structural schema.

use openmed_op::api;
use serde_json::Value;

#[test]
fn committed_crd_equals_the_generated_one() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/openmedmodel.yaml");
    let committed = std::fs::read_to_string(path).expect("crds/openmedmodel.yaml exists");
    let generated = api::crd_yaml();
    if committed != generated {
        if std::env::var_os("UPDATE_CRD").is_some() {
            std::fs::write(path, &generated).unwrap();
            return;
        }
        panic!(
            "crds/openmedmodel.yaml differs from `openmed-op crd`; regenerate it with\n  cargo run -- crd > crds/openmedmodel.yaml\n(or UPDATE_CRD=1 cargo test --test crd)"
        );
    }
}

fn walk<'a>(node: &'a Value, path: String, out: &mut Vec<(String, &'a Value)>) {
    out.push((path.clone(), node));
    match node {
        Value::Object(map) => {
            for (k, v) in map {
                walk(v, format!("{path}.{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                walk(v, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn nodes() -> Vec<(String, Value)> {
    let schema = api::openapi_schema();
    let mut out = Vec::new();
    walk(schema, String::new(), &mut out);
    out.into_iter().map(|(p, v)| (p, v.clone())).collect()
}

#[test]
fn no_additional_properties_false_beside_properties() {
    for (path, node) in nodes() {
        if node.get("properties").is_some() {
            assert!(
                node.get("additionalProperties").is_none(),
                "{path}: additionalProperties beside properties is not structural"
            );
        }
    }
}

#[test]
fn int_or_string_fields_have_the_exact_accepted_form() {
    let mut seen = 0;
    for (path, node) in nodes() {
        if node.get("x-kubernetes-int-or-string") != Some(&Value::Bool(true)) {
            continue;
        }
        seen += 1;
        assert!(
            node.get("type").is_none(),
            "{path}: int-or-string has no type"
        );
        assert!(
            node.get("nullable").is_none(),
            "{path}: must not be nullable"
        );
        assert!(
            node.get("anyOf").is_none(),
            "{path}: the alternatives sit inside allOf"
        );
        let all_of = node["allOf"].as_array().expect("allOf");
        assert_eq!(
            all_of[0],
            serde_json::json!({"anyOf": [{"type": "integer"}, {"type": "string"}]}),
            "{path}"
        );
        for part in &all_of[1..] {
            assert!(
                part.get("anyOf").is_none() && part.get("type").is_none(),
                "{path}: {part}"
            );
        }
    }
    // maxSurge and maxUnavailable in spec and in the three specs kept in status.
    assert_eq!(seen, 8);
}

#[test]
fn every_spec_field_is_documented_for_kubectl_explain() {
    for (path, node) in nodes() {
        if path.contains(".properties.")
            && !path.contains("conditions")
            && node.get("type").is_some()
        {
            let last = path.rsplit('.').nth(1).unwrap_or("");
            if last == "properties" {
                assert!(
                    node.get("description").is_some(),
                    "{path} has no description"
                );
            }
        }
    }
}

#[test]
fn resource_names_columns_and_subresources() {
    let crd = api::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("openmedmodels.openmed.ai")
    );
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.short_names, Some(vec!["omm".to_owned()]));
    assert_eq!(crd.spec.names.categories, Some(vec!["all".to_owned()]));
    let version = &crd.spec.versions[0];
    assert!(version.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<&str> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        [
            "Family", "Tier", "Desired", "Active", "Phase", "Ready", "Age"
        ]
    );
    let conditions = &api::openapi_schema()["properties"]["status"]["properties"]["conditions"];
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(
        conditions["x-kubernetes-list-map-keys"],
        serde_json::json!(["type"])
    );
}
