//! The service's served set: which model names a pod answers.
//!
//! The stock OpenMed service answers a request only for a name in its
//! served set: `OPENMED_SERVICE_SERVED_MODELS` when the container sets it,
//! else its two default ids plus what it preloaded. Any other name gets 422
//! `model_not_served`. So a pod that preloads only the new version refuses
//! every client still naming the old one, and a Deployment that lists its
//! served set by hand refuses the new version once the bump is done.
//!
//! The operator therefore writes the variable beside the preload pointer,
//! expand then contract: a template serves the version it preloads and
//! every version the pods it replaces serve ([`model_entries`]). A bump's
//! new pods answer both the old and the new name, whether the old one
//! soaked or still soaks; a rollback's pods answer the version they
//! restore and the one they replace, once pods of that one were ready (a
//! version that never warmed served nobody). A version leaves the set with
//! the next template written once no pod serves it, so the set contracts
//! as pods roll anyway, never by a restart of its own.
//!
//! Entries the container already lists that are not versions of this model
//! are someone else's, and stay, after the model's own. A set read from a
//! ConfigMap or Secret cannot be edited in place: that is refused before any
//! pod is replaced ([`Refusal`]).

use serde_json::Value;

use crate::api::names::{MANIFEST_HASH_ANNOTATION, SERVED_ENV, SERVED_VERSIONS_ANNOTATION};

/// How the container declares its served set today.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Declared {
    /// No `OPENMED_SERVICE_SERVED_MODELS`: the service's defaults and what
    /// it preloaded.
    Absent,
    /// A literal value: its entries, in order, blanks dropped.
    Listed(Vec<String>),
    /// `valueFrom` a ConfigMap, Secret or field: not ours to edit.
    Referenced(String),
}

/// The served set cannot be managed on this container.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "container {container:?} takes {SERVED_ENV} from {origin}, which the operator cannot add this model's versions to: pods would refuse every client naming a version outside it. Set the variable as a literal value (the operator keeps its other entries) or remove it"
)]
pub struct Refusal {
    /// The container.
    pub container: String,
    /// Where the value comes from, e.g. `ConfigMap team-config`.
    pub origin: String,
}

/// How `container` of a Deployment (as JSON) declares its served set;
/// `None` when there is no such container.
pub fn declared(deployment: &Value, container: &str) -> Option<Declared> {
    let container = deployment
        .pointer("/spec/template/spec/containers")?
        .as_array()?
        .iter()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(container))?;
    let Some(entry) = container
        .get("env")
        .and_then(Value::as_array)
        .and_then(|env| {
            env.iter()
                .find(|e| e.get("name").and_then(Value::as_str) == Some(SERVED_ENV))
        })
    else {
        return Some(Declared::Absent);
    };
    if let Some(from) = entry.get("valueFrom").filter(|v| !v.is_null()) {
        return Some(Declared::Referenced(reference_name(from)));
    }
    let value = entry.get("value").and_then(Value::as_str).unwrap_or("");
    Some(Declared::Listed(split(value)))
}

/// The field manager other than `ours` that keeps the container's served
/// set by server-side apply (a GitOps tool applying the Deployment from
/// Git), read from `metadata.managedFields`. Such a manager puts its own
/// value back at every apply: writing over it would restart the pods at
/// each of its passes, so its value is the set and the operator only
/// checks it.
pub fn kept_by(deployment: &Value, container: &str, ours: &str) -> Option<String> {
    let container_key = format!("k:{}", serde_json::json!({ "name": container }));
    let env_key = format!("k:{}", serde_json::json!({ "name": SERVED_ENV }));
    deployment
        .pointer("/metadata/managedFields")?
        .as_array()?
        .iter()
        .filter(|m| m.get("operation").and_then(Value::as_str) == Some("Apply"))
        .filter(|m| m.get("manager").and_then(Value::as_str) != Some(ours))
        .find(|m| {
            m.get("fieldsV1")
                .and_then(|f| f.get("f:spec"))
                .and_then(|f| f.get("f:template"))
                .and_then(|f| f.get("f:spec"))
                .and_then(|f| f.get("f:containers"))
                .and_then(|f| f.get(&container_key))
                .and_then(|f| f.get("f:env"))
                .and_then(|f| f.get(&env_key))
                .and_then(|f| f.get("f:value"))
                .is_some()
        })
        .and_then(|m| m.get("manager").and_then(Value::as_str))
        .map(str::to_owned)
}

/// The entries of a served-set value, as the service reads them.
pub fn split(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

fn reference_name(from: &Value) -> String {
    let named = |key: &str, kind: &str| {
        from.get(key).map(|r| {
            let name = r.get("name").and_then(Value::as_str).unwrap_or("?");
            format!("{kind} {name}")
        })
    };
    named("configMapKeyRef", "ConfigMap")
        .or_else(|| named("secretKeyRef", "Secret"))
        .unwrap_or_else(|| "a reference".to_owned())
}

/// The model's own entries for a template preloading `version`: that
/// version, then each version clients may be using when it is written
/// (`in_use`: what the pods it replaces serve), once. Names the service
/// would refuse as served ids are left out: it refuses to start with one
/// listed.
pub fn model_entries(version: &str, in_use: &[&str]) -> Vec<String> {
    let mut entries: Vec<String> = Vec::new();
    for v in std::iter::once(version).chain(in_use.iter().copied()) {
        if is_served_name(v) && !entries.iter().any(|e| e == v) {
            entries.push(v.to_owned());
        }
    }
    entries
}

/// The ids the service serves when the variable is not set, beside what it
/// preloads (its `DEFAULT_SERVED_MODELS`; a request without `model_name`
/// gets the second). A test holds this to the service's constant.
pub const SERVICE_DEFAULTS: [&str; 2] = [
    "disease_detection_superclinical",
    "OpenMed/OpenMed-PII-SuperClinical-Small-44M-v1",
];

/// The model's entries for a template preloading `version`, given the
/// entries recorded on the Deployment ([`recorded`]): the recorded ones
/// when they were written for this version (so the set stays the same
/// while the version's pods roll, whatever the history learns meanwhile),
/// else [`model_entries`] of `in_use`.
pub fn entries_for(version: &str, recorded: &[String], in_use: &[&str]) -> Vec<String> {
    if recorded.first().map(String::as_str) == Some(version) {
        return recorded
            .iter()
            .filter(|v| is_served_name(v))
            .cloned()
            .collect();
    }
    model_entries(version, in_use)
}

/// The value to write: the model's entries, then the declared entries that
/// are not versions of this model (`known`), in their order. `None` when
/// there is nothing to write: nothing declared and no entry of ours (a
/// version that is a path, not an id).
pub fn value(
    model: &[String],
    declared: &Declared,
    known: &[&str],
    container: &str,
) -> Result<Option<String>, Refusal> {
    let others: Vec<String> = match declared {
        Declared::Referenced(source) => {
            return Err(Refusal {
                container: container.to_owned(),
                origin: source.clone(),
            });
        }
        Declared::Absent if model.is_empty() => return Ok(None),
        // What the service served without the variable, less what it
        // preloaded: a client naming a default id (or no model, which is
        // the default id) is answered as before.
        Declared::Absent => SERVICE_DEFAULTS.iter().map(|d| d.to_string()).collect(),
        Declared::Listed(entries) => entries
            .iter()
            .filter(|e| !known.contains(&e.as_str()) && !model.contains(e))
            .cloned()
            .collect(),
    };
    let mut out: Vec<&str> = Vec::new();
    for entry in model.iter().chain(&others) {
        if !out.contains(&entry.as_str()) {
            out.push(entry);
        }
    }
    Ok(Some(out.join(",")))
}

/// True when the service accepts `name` in its served set (its own
/// `_is_served_identifier`: `model` or `org/model`, each part starting with
/// a letter, digit or `_`, then letters, digits, `_`, `.`, `-`; no `..`).
/// A test holds this to the service's function on the same inputs.
pub fn is_served_name(name: &str) -> bool {
    let part = |p: &str| {
        let mut bytes = p.bytes();
        bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
            && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    };
    let parts_ok = match name.split_once('/') {
        None => part(name),
        Some((org, model)) => part(org) && part(model),
    };
    parts_ok && !name.contains("..")
}

/// What `render` writes for a served set: the value and the model's own
/// entries in it (the annotation [`SERVED_VERSIONS_ANNOTATION`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedSet {
    /// `OPENMED_SERVICE_SERVED_MODELS`.
    pub value: String,
    /// The model's entries of it, comma-separated.
    pub versions: String,
}

/// The served set `render` writes on `container` of a Deployment in its
/// input (as JSON) for a template preloading `version` (manifest hash
/// `manifest_hash`), where `pointer_version` is the version the resource's
/// pointer ConfigMap in the input names (an earlier render's output).
///
/// Without a status, the retained version is what the Deployment served
/// before this change: the first of its recorded versions (an earlier
/// render's annotation), else the pointer's version (as the operator,
/// never a version a literal preload value names). So a bump rendered
/// into Git serves the old and the new name, and rendering the output again
/// changes nothing. `None` leaves the container as it is: no such
/// container, or a template that already preloads this manifest and
/// lists no set (nothing to restart a pod for).
pub fn rendered(
    deployment: &Value,
    container: &str,
    version: &str,
    manifest_hash: &str,
    pointer_version: Option<&str>,
) -> Result<Option<RenderedSet>, Refusal> {
    let Some(declared) = declared(deployment, container) else {
        return Ok(None);
    };
    let template_hash = deployment
        .pointer("/spec/template/metadata/annotations")
        .and_then(|a| a.get(MANIFEST_HASH_ANNOTATION))
        .and_then(Value::as_str);
    if declared == Declared::Absent && template_hash == Some(manifest_hash) {
        return Ok(None);
    }
    let recorded = recorded(deployment);
    let before = recorded.first().map(String::as_str).or(pointer_version);
    let model = entries_for(version, &recorded, before.as_slice());
    let mut known: Vec<&str> = recorded.iter().map(String::as_str).collect();
    known.extend(pointer_version);
    let Some(value) = value(&model, &declared, &known, container)? else {
        return Ok(None);
    };
    Ok(Some(RenderedSet {
        value,
        versions: model.join(","),
    }))
}

/// The model's entries a Deployment's served set was written with, from
/// its annotation [`SERVED_VERSIONS_ANNOTATION`] (the preloaded one first).
pub fn recorded(deployment: &Value) -> Vec<String> {
    deployment
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(SERVED_VERSIONS_ANNOTATION))
        .and_then(Value::as_str)
        .map(split)
        .unwrap_or_default()
}

/// Where a container's served-set entry is in a Deployment, as a field
/// path for messages (`spec.template.spec.containers[0].env[2]`).
pub fn entry_path(deployment: &Value, container: &str) -> Option<String> {
    let containers = deployment
        .pointer("/spec/template/spec/containers")?
        .as_array()?;
    let (c, found) = containers
        .iter()
        .enumerate()
        .find(|(_, c)| c.get("name").and_then(Value::as_str) == Some(container))?;
    let path = format!("spec.template.spec.containers[{c}]");
    let env = found.get("env").and_then(Value::as_array);
    Some(
        match env.and_then(|env| {
            env.iter()
                .position(|e| e.get("name").and_then(Value::as_str) == Some(SERVED_ENV))
        }) {
            Some(e) => format!("{path}.env[{e}]"),
            None => path,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(env: Value) -> Value {
        json!({"spec": {"template": {"spec": {"containers": [
            {"name": "sidecar", "env": [{"name": SERVED_ENV, "value": "elsewhere"}]},
            {"name": "openmed-service", "env": env},
        ]}}}})
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_container_says_how_it_declares_its_set() {
        let d = deployment(json!([{"name": "OTHER", "value": "x"}]));
        assert_eq!(declared(&d, "openmed-service"), Some(Declared::Absent));
        let d = deployment(json!([{"name": SERVED_ENV, "value": " a/b, ,c "}]));
        assert_eq!(
            declared(&d, "openmed-service"),
            Some(Declared::Listed(strings(&["a/b", "c"])))
        );
        // The API server drops an empty value: an empty list.
        let d = deployment(json!([{"name": SERVED_ENV}]));
        assert_eq!(
            declared(&d, "openmed-service"),
            Some(Declared::Listed(vec![]))
        );
        let d = deployment(json!([{"name": SERVED_ENV,
            "valueFrom": {"configMapKeyRef": {"name": "team", "key": "served"}}}]));
        assert_eq!(
            declared(&d, "openmed-service"),
            Some(Declared::Referenced("ConfigMap team".into()))
        );
        let d = deployment(json!([{"name": SERVED_ENV,
            "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]));
        assert_eq!(
            declared(&d, "openmed-service"),
            Some(Declared::Referenced("Secret s".into()))
        );
        assert_eq!(declared(&d, "missing"), None);
    }

    #[test]
    fn a_template_serves_its_version_and_the_ones_its_pods_replace() {
        // First rollout: nothing served before.
        assert_eq!(model_entries("O/v1", &[]), strings(&["O/v1"]));
        // A bump from v1: v1's clients are answered by the new pods.
        assert_eq!(model_entries("O/v2", &["O/v1"]), strings(&["O/v2", "O/v1"]));
        // A bump in the middle of a rollout: both versions that have
        // ready pods, once each, the version itself first.
        assert_eq!(
            model_entries("O/v3", &["O/v1", "O/v2", "O/v3", "O/v1"]),
            strings(&["O/v3", "O/v1", "O/v2"])
        );
        // A rollback to v1 from v2: both.
        assert_eq!(model_entries("O/v1", &["O/v2"]), strings(&["O/v1", "O/v2"]));
        // A version that is a path in the image is no served name.
        assert_eq!(model_entries("/models/pii", &["O/v1"]), strings(&["O/v1"]));
    }

    #[test]
    fn other_entries_stay_after_the_models_own_and_old_versions_leave() {
        let model = strings(&["O/v2", "O/v1"]);
        let known = ["O/v2", "O/v1", "O/v0"];
        assert_eq!(
            value(&model, &Declared::Absent, &known, "c").unwrap(),
            Some(format!("O/v2,O/v1,{}", SERVICE_DEFAULTS.join(",")))
        );
        let listed = Declared::Listed(strings(&["team/ner", "O/v1", "O/v0", "team/ner"]));
        assert_eq!(
            value(&model, &listed, &known, "c").unwrap(),
            Some("O/v2,O/v1,team/ner".into())
        );
        // Writing the value again gives the same value.
        let again = Declared::Listed(strings(&["O/v2", "O/v1", "team/ner"]));
        assert_eq!(
            value(&model, &again, &known, "c").unwrap(),
            Some("O/v2,O/v1,team/ner".into())
        );
        assert_eq!(value(&[], &Declared::Absent, &known, "c").unwrap(), None);
        assert_eq!(
            value(&[], &Declared::Listed(vec![]), &known, "c").unwrap(),
            Some(String::new())
        );
    }

    #[test]
    fn a_set_read_from_elsewhere_is_refused_with_its_source() {
        let refused = value(
            &strings(&["O/v2"]),
            &Declared::Referenced("ConfigMap team".into()),
            &[],
            "openmed-service",
        )
        .unwrap_err();
        let text = refused.to_string();
        assert!(text.contains("ConfigMap team"), "{text}");
        assert!(text.contains(SERVED_ENV), "{text}");
    }

    #[test]
    fn a_set_another_applier_keeps_is_found_in_the_managed_fields() {
        let fields = |manager: &str, operation: &str| {
            json!({"manager": manager, "operation": operation, "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"openmed-service\"}": {"f:env": {
                    "k:{\"name\":\"OPENMED_SERVICE_SERVED_MODELS\"}": {".": {}, "f:name": {}, "f:value": {}}}}}}}}}})
        };
        let with = |managers: Vec<Value>| json!({"metadata": {"managedFields": managers}});
        let d = with(vec![
            fields("openmed-operator", "Apply"),
            fields("kubectl-edit", "Update"),
        ]);
        assert_eq!(kept_by(&d, "openmed-service", "openmed-operator"), None);
        let d = with(vec![fields("kustomize-controller", "Apply")]);
        assert_eq!(
            kept_by(&d, "openmed-service", "openmed-operator").as_deref(),
            Some("kustomize-controller")
        );
        assert_eq!(kept_by(&d, "sidecar", "openmed-operator"), None);
        assert_eq!(kept_by(&json!({}), "openmed-service", "x"), None);
    }

    #[test]
    fn served_names_follow_the_services_rule() {
        for ok in ["pii", "OpenMed/pii-v2", "_x/y.z", "a-b/c.d_e"] {
            assert!(is_served_name(ok), "{ok}");
        }
        for bad in [
            "", "/x", "x/", "a/b/c", ".x", "-x", "o/.x", "a..b", "o/p:v2", "o/p@sha", "a b",
        ] {
            assert!(!is_served_name(bad), "{bad}");
        }
    }

    /// `deployment(env)` as an earlier render left it: its template hash
    /// and recorded versions.
    fn rendered_before(env: Value, hash: &str, recorded: Option<&str>) -> Value {
        let mut d = deployment(env);
        d["spec"]["template"]["metadata"] =
            json!({"annotations": {MANIFEST_HASH_ANNOTATION: hash}});
        if let Some(r) = recorded {
            d["metadata"] = json!({"annotations": {SERVED_VERSIONS_ANNOTATION: r}});
        }
        d
    }

    fn apply(d: &mut Value, set: &RenderedSet, hash: &str) {
        let env = d
            .pointer_mut("/spec/template/spec/containers/1/env")
            .unwrap();
        let env = env.as_array_mut().unwrap();
        env.retain(|e| e["name"] != SERVED_ENV);
        env.push(json!({"name": SERVED_ENV, "value": set.value}));
        d["spec"]["template"]["metadata"] =
            json!({"annotations": {MANIFEST_HASH_ANNOTATION: hash}});
        d["metadata"] = json!({"annotations": {SERVED_VERSIONS_ANNOTATION: set.versions}});
    }

    #[test]
    fn a_rendered_bump_serves_both_names_and_rendering_again_changes_nothing() {
        // Git before: the Deployment preloads v1 (its pointer says so),
        // lists no set.
        let mut d = rendered_before(json!([]), "h1", None);
        let set = rendered(&d, "openmed-service", "m/v2", "h2", Some("m/v1"))
            .unwrap()
            .unwrap();
        assert_eq!(
            set.value,
            format!("m/v2,m/v1,{}", SERVICE_DEFAULTS.join(",")),
            "what the service answered without a set stays answered"
        );
        assert_eq!(set.versions, "m/v2,m/v1");
        apply(&mut d, &set, "h2");
        // The output rendered again (its pointer now names v2).
        let again = rendered(&d, "openmed-service", "m/v2", "h2", Some("m/v2"))
            .unwrap()
            .unwrap();
        assert_eq!(again, set);
        // The next bump: v1 leaves, v2 stays beside v3.
        let next = rendered(&d, "openmed-service", "m/v3", "h3", Some("m/v2"))
            .unwrap()
            .unwrap();
        assert_eq!(
            next.value,
            format!("m/v3,m/v2,{}", SERVICE_DEFAULTS.join(","))
        );
        assert_eq!(next.versions, "m/v3,m/v2");
    }

    #[test]
    fn a_rendered_set_keeps_the_users_names_after_the_models() {
        let d = rendered_before(
            json!([{"name": SERVED_ENV, "value": "team/ner,m/v1"}]),
            "h1",
            None,
        );
        let set = rendered(&d, "openmed-service", "m/v2", "h2", Some("m/v1"))
            .unwrap()
            .unwrap();
        assert_eq!(set.value, "m/v2,m/v1,team/ner");
        assert_eq!(set.versions, "m/v2,m/v1");
    }

    #[test]
    fn render_leaves_an_adopted_template_alone_and_refuses_a_reference() {
        let d = rendered_before(json!([]), "h1", None);
        assert_eq!(
            rendered(&d, "openmed-service", "m/v1", "h1", Some("m/v1")),
            Ok(None)
        );
        assert_eq!(rendered(&d, "no-such", "m/v2", "h2", None), Ok(None));
        let d = rendered_before(
            json!([{"name": SERVED_ENV, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]),
            "h1",
            None,
        );
        let refusal = rendered(&d, "openmed-service", "m/v2", "h2", None).unwrap_err();
        assert_eq!(refusal.origin, "Secret s");
        assert_eq!(
            entry_path(&d, "openmed-service").as_deref(),
            Some("spec.template.spec.containers[1].env[0]")
        );
    }
}
