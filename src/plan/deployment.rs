//! The Deployment fields the operator owns, and the three ways to write them.
//!
//! One [`DeploymentFields`] value says what the target must look like; each
//! writer uses the idiom of its merge mechanism for "this entry is exactly
//! that":
//!
//! - [`DeploymentFields::apply_body`]: a server-side apply body holding only
//!   these fields (what the operator sends);
//! - [`DeploymentFields::apply_to`]: the fields set on a full Deployment
//!   (what `render` prints, and how the operator detects drift: if applying
//!   changes nothing, nothing drifted);
//! - [`DeploymentFields::strategic_patch`]: a strategic-merge patch for
//!   kustomize `patches:` when the Deployment is not in the rendered input.

use serde_json::{Map, Value, json};

use super::{ResourceId, TargetOptions};
use crate::api::names::{
    FIELD_MANAGER, MANIFEST_HASH_ANNOTATION, MANIFEST_SNAPSHOT_LABEL, MODEL_RESOURCE_ANNOTATION,
    OPERATED_BY_LABEL, PRELOAD_ENV, SERVED_ENV, SERVED_VERSIONS_ANNOTATION,
};
use crate::api::quality::QUALITY_CONDITION;
use crate::api::{OpenMedModelSpec, StrategyType};

/// Where the container's `OPENMED_SERVICE_PRELOAD_MODELS` comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Preload {
    /// From the owned ConfigMap of this name (a managed target): the
    /// manifest's immutable snapshot, or the pointer in a template written
    /// before snapshots existed.
    FromConfigMap(String),
    /// Empty: a released target preloads nothing.
    Released,
}

/// The fields of one Deployment that the operator owns.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentFields {
    /// Namespace of the Deployment.
    pub namespace: String,
    /// Name of the Deployment.
    pub name: String,
    /// Container whose environment carries the model pointer.
    pub container: String,
    /// The model pointer variable.
    pub preload: Preload,
    /// Pod-template annotation `openmed.ai/model-manifest-hash`.
    pub manifest_hash: String,
    /// Pod-template label `openmed.ai/model-manifest`: the short hash of
    /// the snapshot the template references, which every ReplicaSet of
    /// the template carries; `None` when the template references none.
    pub snapshot_label: Option<String>,
    /// `openmed.ai/model-resource` on the Deployment and its pod template,
    /// and the watch label; `None` once released.
    pub owner: Option<String>,
    /// `spec.replicas`; `None` leaves it alone.
    pub replicas: Option<i32>,
    /// `spec.strategy`, as the Deployment API spells it; `None` leaves it alone.
    pub strategy: Option<Value>,
    /// `spec.progressDeadlineSeconds`; `None` leaves it alone.
    pub progress_deadline_seconds: Option<i32>,
    /// The container's served set `OPENMED_SERVICE_SERVED_MODELS`, as a
    /// literal value ([`super::served`]); `None` leaves it alone.
    pub served: Option<String>,
    /// `openmed.ai/served-versions` on the Deployment: which entries of
    /// `served` are the model's own, so that whoever writes the set next
    /// (`render` from Git, the operator after an adoption) can tell them
    /// from someone else's. `None` leaves it alone; a released target
    /// loses it with the other ownership marks.
    pub served_versions: Option<String>,
    /// The pod template's readiness gate `openmed.ai/model-quality`
    /// (`spec.qualityGate`): a pod is Ready only once the operator has
    /// judged its model.
    pub quality_gate: bool,
}

/// The target has no container of the configured name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("container {wanted:?} not found in Deployment {deployment}; it has: {}", if .available.is_empty() { "no containers".to_owned() } else { .available.join(", ") })]
pub struct ContainerNotFound {
    /// `<namespace>/<name>` of the Deployment.
    pub deployment: String,
    /// The configured container name.
    pub wanted: String,
    /// The containers that do exist.
    pub available: Vec<String>,
}

impl DeploymentFields {
    /// The fields of a managed target for a normalized spec.
    pub fn managed(
        resource: &ResourceId,
        normalized: &OpenMedModelSpec,
        manifest_hash: &str,
        target: TargetOptions,
    ) -> Self {
        let rollout = &normalized.rollout_strategy;
        let strategy = match rollout.type_ {
            StrategyType::RollingUpdate => json!({
                "type": "RollingUpdate",
                "rollingUpdate": {
                    "maxSurge": rollout.max_surge,
                    "maxUnavailable": rollout.max_unavailable,
                },
            }),
            StrategyType::Recreate => json!({ "type": "Recreate" }),
        };
        DeploymentFields {
            namespace: resource.namespace.clone(),
            name: normalized
                .target_ref
                .name
                .clone()
                .expect("a normalized spec names its target"),
            container: normalized.target_ref.container_name.clone(),
            preload: Preload::FromConfigMap(super::snapshot_name(
                normalized
                    .manifest_config_map_name
                    .as_deref()
                    .expect("a normalized spec names its ConfigMap"),
                manifest_hash,
            )),
            manifest_hash: manifest_hash.to_owned(),
            snapshot_label: Some(super::snapshot_suffix(manifest_hash).to_owned()),
            owner: Some(resource.key()),
            replicas: if target.autoscaled {
                None
            } else {
                normalized.replicas
            },
            strategy: Some(strategy),
            progress_deadline_seconds: Some(rollout.progress_deadline_seconds),
            quality_gate: normalized.quality_gate.is_some(),
            // What a template serves beside its version depends on the
            // target and the resource's history: the operator and `render`
            // fill it in from what they see (`super::served`).
            served: None,
            served_versions: None,
        }
    }

    /// The released form written on deletion or when the target changes:
    /// the variable is emptied and the template hash is that of an empty
    /// manifest, so pods restart without a preloaded model, and the
    /// ownership marks are gone.
    ///
    /// `replicas`, `strategy` and `progressDeadlineSeconds` keep the values
    /// `observed` on the Deployment: with server-side apply, a field that
    /// its only manager stops applying is removed and re-defaulted, which
    /// would scale the Deployment to one pod.
    ///
    /// `served` is what the served set keeps once the model's versions
    /// leave it (the entries others listed), or `None` to let it go.
    pub fn released(
        namespace: &str,
        name: &str,
        container: &str,
        observed: &Value,
        served: Option<String>,
    ) -> Self {
        let spec = observed.get("spec");
        let field = |key: &str| spec.and_then(|s| s.get(key)).cloned();
        DeploymentFields {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            container: container.to_owned(),
            preload: Preload::Released,
            manifest_hash: super::released_manifest_hash(),
            snapshot_label: None,
            owner: None,
            replicas: field("replicas").and_then(|v| v.as_i64()).map(|r| r as i32),
            strategy: field("strategy"),
            progress_deadline_seconds: field("progressDeadlineSeconds")
                .and_then(|v| v.as_i64())
                .map(|d| d as i32),
            quality_gate: false,
            served,
            served_versions: None,
        }
    }

    /// For a release: a strategic-merge patch that removes the ownership
    /// marks and the preload reference another field manager holds, to
    /// send before the release's apply body; `None` when no other manager
    /// holds any of them.
    ///
    /// Server-side apply removes only what its own manager stops sending.
    /// A Deployment written by the earlier operator (a strategic-merge
    /// patch, an Update of its own manager) keeps that operator's
    /// `openmed.ai/model-resource` annotations and `valueFrom` under the
    /// release's apply, the release never lands, and the deletion waits
    /// on it for ever. The earlier operator releases the same way.
    pub fn release_reset(&self, observed: &Value) -> Option<Value> {
        let foreign = |path: &[&str]| held_by_another(observed, path);
        let annotation = format!("f:{MODEL_RESOURCE_ANNOTATION}");
        let container_key = format!("k:{}", json!({ "name": self.container }));
        let env_key = format!("k:{}", json!({ "name": PRELOAD_ENV }));
        let meta = foreign(&["f:metadata", "f:annotations", &annotation]);
        let template = foreign(&[
            "f:spec",
            "f:template",
            "f:metadata",
            "f:annotations",
            &annotation,
        ]);
        let value_from = foreign(&[
            "f:spec",
            "f:template",
            "f:spec",
            "f:containers",
            &container_key,
            "f:env",
            &env_key,
            "f:valueFrom",
        ]);
        if !(meta || template || value_from) {
            return None;
        }
        let mut patch = json!({});
        if meta {
            patch["metadata"] = json!({ "annotations": { MODEL_RESOURCE_ANNOTATION: null } });
        }
        if template {
            patch["spec"]["template"]["metadata"] =
                json!({ "annotations": { MODEL_RESOURCE_ANNOTATION: null } });
        }
        if value_from {
            patch["spec"]["template"]["spec"] = json!({ "containers": [{
                "name": self.container,
                "env": [{ "name": PRELOAD_ENV, "valueFrom": null }],
            }] });
        }
        Some(patch)
    }

    /// The same fields, referencing the pointer ConfigMap `pointer` the
    /// way templates did before snapshots: how a template written by the
    /// earlier operator (or an earlier openmed-op) is kept, so that an
    /// upgrade restarts no pod.
    pub fn referencing_pointer(&self, pointer: &str) -> Self {
        DeploymentFields {
            preload: Preload::FromConfigMap(pointer.to_owned()),
            snapshot_label: None,
            ..self.clone()
        }
    }

    /// The ConfigMap the template's variable reads, if any.
    pub fn config_map_name(&self) -> Option<&str> {
        match &self.preload {
            Preload::FromConfigMap(name) => Some(name),
            Preload::Released => None,
        }
    }

    /// The env entry as stored by the API server.
    fn env_entry(&self) -> Value {
        match &self.preload {
            Preload::FromConfigMap(config_map) => json!({
                "name": PRELOAD_ENV,
                "valueFrom": { "configMapKeyRef": { "name": config_map, "key": PRELOAD_ENV } },
            }),
            // The API server drops an empty `value`, so this is how an
            // empty variable is stored.
            Preload::Released => json!({ "name": PRELOAD_ENV }),
        }
    }

    fn template_annotations(&self) -> Map<String, Value> {
        let mut annotations = Map::new();
        annotations.insert(MANIFEST_HASH_ANNOTATION.into(), json!(self.manifest_hash));
        if let Some(owner) = &self.owner {
            annotations.insert(MODEL_RESOURCE_ANNOTATION.into(), json!(owner));
        }
        annotations
    }

    fn spec_fields(&self) -> Map<String, Value> {
        let mut spec = Map::new();
        if let Some(replicas) = self.replicas {
            spec.insert("replicas".into(), json!(replicas));
        }
        if let Some(deadline) = self.progress_deadline_seconds {
            spec.insert("progressDeadlineSeconds".into(), json!(deadline));
        }
        if let Some(strategy) = &self.strategy {
            spec.insert("strategy".into(), strategy.clone());
        }
        spec
    }

    /// Server-side apply body with exactly the fields the operator owns.
    ///
    /// The env entry also sets `value: ""`: when another manager wrote a
    /// literal value for the variable, applying `""` with force takes that
    /// field over and empties it, where leaving it out would keep both
    /// `value` and `valueFrom` and the API server would refuse the
    /// Deployment. The server stores an empty value as absent.
    pub fn apply_body(&self) -> Value {
        self.partial_deployment(json!(""))
    }

    /// A strategic-merge patch for kustomize `patches:`. `value: null`
    /// deletes a literal value the base may set, and `rollingUpdate: null`
    /// clears rolling-update settings under `Recreate`.
    pub fn strategic_patch(&self) -> Value {
        let mut patch = self.partial_deployment(Value::Null);
        if let Some(strategy) = patch.pointer_mut("/spec/strategy")
            && strategy.get("rollingUpdate").is_none()
        {
            strategy["rollingUpdate"] = Value::Null;
        }
        patch
    }

    /// A Deployment holding only the owned fields; `value` is what the env
    /// entry says about a literal value, in the idiom of the merge used.
    fn partial_deployment(&self, value: Value) -> Value {
        let mut env = self.env_entry();
        env["value"] = value;
        let mut metadata = json!({ "name": self.name, "namespace": self.namespace });
        if let Some(owner) = &self.owner {
            metadata["annotations"] = json!({ MODEL_RESOURCE_ANNOTATION: owner });
            if let Some(versions) = &self.served_versions {
                metadata["annotations"][SERVED_VERSIONS_ANNOTATION] = json!(versions);
            }
            metadata["labels"] = json!({ OPERATED_BY_LABEL: FIELD_MANAGER });
        }
        let mut spec = self.spec_fields();
        let mut template_metadata = json!({ "annotations": self.template_annotations() });
        if let Some(short) = &self.snapshot_label {
            template_metadata["labels"] = json!({ MANIFEST_SNAPSHOT_LABEL: short });
        }
        let mut env = vec![env];
        if let Some(served) = &self.served {
            env.push(json!({ "name": SERVED_ENV, "value": served }));
        }
        let mut pod_spec = json!({ "containers": [{ "name": self.container, "env": env }] });
        if self.quality_gate {
            pod_spec["readinessGates"] = json!([{ "conditionType": QUALITY_CONDITION }]);
        }
        spec.insert(
            "template".into(),
            json!({ "metadata": template_metadata, "spec": pod_spec }),
        );
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": metadata,
            "spec": spec,
        })
    }

    /// A JSON merge patch to send before the apply body when switching the
    /// target to `Recreate` while it still has `rollingUpdate` settings.
    ///
    /// Server-side apply cannot remove a field nobody owns, and the API
    /// server's own defaults (`rollingUpdate: 25%/25%`) are owned by nobody,
    /// so an apply of `type: Recreate` alone is refused ("may not be
    /// specified when strategy type is 'Recreate'"). A merge patch may
    /// delete it, in the same request that changes the type.
    pub fn strategy_reset(&self, observed: &Value) -> Option<Value> {
        let recreate = self.strategy.as_ref()?.get("type")? == "Recreate";
        let has_rolling = observed
            .pointer("/spec/strategy/rollingUpdate")
            .is_some_and(|r| !r.is_null());
        (recreate && has_rolling).then(
            || json!({ "spec": { "strategy": { "type": "Recreate", "rollingUpdate": null } } }),
        )
    }

    /// Sets these fields on a full Deployment object, leaving everything else
    /// as it is. The env entry keeps its position; a released target loses
    /// the ownership annotations and label.
    pub fn apply_to(&self, deployment: &mut Value) -> Result<(), ContainerNotFound> {
        let missing = ContainerNotFound {
            deployment: format!("{}/{}", self.namespace, self.name),
            wanted: self.container.clone(),
            available: container_names(deployment),
        };
        let container = find_container(deployment, &self.container).ok_or(missing)?;
        let env = &mut container["env"];
        if !env.is_array() {
            *env = json!([]);
        }
        let entries = env.as_array_mut().expect("env is a list");
        let entry = self.env_entry();
        match entries
            .iter_mut()
            .find(|e| e.get("name").and_then(Value::as_str) == Some(PRELOAD_ENV))
        {
            Some(existing) => *existing = keeping_deletions(existing, entry),
            None => entries.push(entry),
        }
        if let Some(served) = &self.served {
            let entry = json!({ "name": SERVED_ENV, "value": served });
            match entries
                .iter_mut()
                .find(|e| e.get("name").and_then(Value::as_str) == Some(SERVED_ENV))
            {
                Some(existing) => *existing = entry,
                None => entries.push(entry),
            }
        }

        let template_meta = object_at(deployment, &["spec", "template", "metadata"]);
        let annotations = object_in(template_meta, "annotations");
        annotations.insert(MANIFEST_HASH_ANNOTATION.into(), json!(self.manifest_hash));
        set_or_remove(
            annotations,
            MODEL_RESOURCE_ANNOTATION,
            self.owner.as_deref(),
        );
        drop_if_empty(template_meta, "annotations");
        set_or_remove(
            object_in(template_meta, "labels"),
            MANIFEST_SNAPSHOT_LABEL,
            self.snapshot_label.as_deref(),
        );
        drop_if_empty(template_meta, "labels");

        let meta = object_at(deployment, &["metadata"]);
        set_or_remove(
            object_in(meta, "annotations"),
            MODEL_RESOURCE_ANNOTATION,
            self.owner.as_deref(),
        );
        match (&self.owner, &self.served_versions) {
            (None, _) => {
                object_in(meta, "annotations").remove(SERVED_VERSIONS_ANNOTATION);
            }
            (Some(_), Some(versions)) => {
                object_in(meta, "annotations")
                    .insert(SERVED_VERSIONS_ANNOTATION.into(), json!(versions));
            }
            (Some(_), None) => {}
        }
        drop_if_empty(meta, "annotations");
        let operated_by = self.owner.as_ref().map(|_| FIELD_MANAGER);
        set_or_remove(object_in(meta, "labels"), OPERATED_BY_LABEL, operated_by);
        drop_if_empty(meta, "labels");

        let pod_spec = object_at(deployment, &["spec", "template", "spec"]);
        let gates = pod_spec
            .entry("readinessGates")
            .or_insert_with(|| json!([]));
        if !gates.is_array() {
            *gates = json!([]);
        }
        let list = gates.as_array_mut().expect("just made a list");
        let ours =
            |g: &Value| g.get("conditionType").and_then(Value::as_str) == Some(QUALITY_CONDITION);
        match (self.quality_gate, list.iter().any(ours)) {
            (true, false) => list.push(json!({ "conditionType": QUALITY_CONDITION })),
            (false, true) => list.retain(|g| !ours(g)),
            _ => {}
        }
        if list.is_empty() {
            pod_spec.remove("readinessGates");
        }

        let spec = object_at(deployment, &["spec"]);
        for (key, value) in self.spec_fields() {
            let value = match spec.get(&key) {
                Some(old) => keeping_deletions(old, value),
                None => value,
            };
            spec.insert(key, value);
        }
        Ok(())
    }
}

/// Whether a field list other than the operator's server-side apply holds
/// the field at `path` (keys of `fieldsV1`) of a Deployment (as JSON).
/// The earlier operator patches under the same manager name,
/// `openmed-operator`, as an Update: that entry is another's too.
pub(crate) fn held_by_another(observed: &Value, path: &[&str]) -> bool {
    observed
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|m| {
            m.get("manager").and_then(Value::as_str) != Some(FIELD_MANAGER)
                || m.get("operation").and_then(Value::as_str) != Some("Apply")
        })
        .any(|m| {
            path.iter()
                .try_fold(m.get("fieldsV1"), |at, key| Some(at?.get(*key)))
                .flatten()
                .is_some()
        })
}

/// `new`, plus the explicit `null`s of `old` for keys `new` does not set.
///
/// In a strategic-merge patch (what `render` emits when the Deployment is
/// not in its input) `key: null` deletes the key from the base. Keeping those
/// makes rendering a rendered patch again give the same patch.
fn keeping_deletions(old: &Value, mut new: Value) -> Value {
    if let (Value::Object(old), Value::Object(new)) = (old, &mut new) {
        for (key, value) in old {
            if value.is_null() && !new.contains_key(key) {
                new.insert(key.clone(), Value::Null);
            }
        }
    }
    new
}

/// The container of that name in a Deployment's pod template.
fn find_container<'a>(deployment: &'a mut Value, name: &str) -> Option<&'a mut Value> {
    deployment
        .pointer_mut("/spec/template/spec/containers")?
        .as_array_mut()?
        .iter_mut()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(name))
}

/// Names of the containers in a Deployment's pod template.
pub fn container_names(deployment: &Value) -> Vec<String> {
    deployment
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The object at `path`, created (replacing a non-object) when missing.
fn object_at<'a>(root: &'a mut Value, path: &[&str]) -> &'a mut Map<String, Value> {
    let mut node = root;
    for key in path {
        if !node.is_object() {
            *node = json!({});
        }
        let map = node.as_object_mut().expect("just made an object");
        node = map.entry(key.to_string()).or_insert_with(|| json!({}));
    }
    if !node.is_object() {
        *node = json!({});
    }
    node.as_object_mut().expect("just made an object")
}

fn object_in<'a>(map: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let node = map.entry(key.to_owned()).or_insert_with(|| json!({}));
    if !node.is_object() {
        *node = json!({});
    }
    node.as_object_mut().expect("just made an object")
}

fn set_or_remove(map: &mut Map<String, Value>, key: &str, value: Option<&str>) {
    match value {
        Some(v) => {
            map.insert(key.to_owned(), json!(v));
        }
        None => {
            map.remove(key);
        }
    }
}

fn drop_if_empty(map: &mut Map<String, Value>, key: &str) {
    if map
        .get(key)
        .and_then(Value::as_object)
        .is_some_and(Map::is_empty)
    {
        map.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::OpenMedModelSpec;
    use crate::plan::{ResourceId, TargetOptions, plan};

    fn spec(extra: Value) -> OpenMedModelSpec {
        let mut spec =
            json!({"family": "pii", "version": "OpenMed/pii-v1", "tier": "Small", "replicas": 2});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        serde_json::from_value(spec).unwrap()
    }

    fn id() -> ResourceId {
        ResourceId {
            namespace: "ns".into(),
            name: "svc".into(),
            uid: Some("u-1".into()),
        }
    }

    fn fields(extra: Value, target: TargetOptions) -> DeploymentFields {
        plan(&id(), &spec(extra), target).deployment
    }

    #[test]
    fn a_quality_gate_puts_the_readiness_gate_in_the_template_beside_others() {
        let gated = fields(
            json!({"qualityGate": {"configMapRef": {"name": "probes"}}}),
            TargetOptions::default(),
        );
        assert_eq!(
            gated.apply_body()["spec"]["template"]["spec"]["readinessGates"],
            json!([{"conditionType": "openmed.ai/model-quality"}])
        );
        let plain = fields(json!({}), TargetOptions::default());
        assert!(plain.apply_body()["spec"]["template"]["spec"]["readinessGates"].is_null());

        let mut target = deployment();
        target["spec"]["template"]["spec"]["readinessGates"] =
            json!([{"conditionType": "example.com/theirs"}]);
        gated.apply_to(&mut target).unwrap();
        let twice = target.clone();
        gated.apply_to(&mut target).unwrap();
        assert_eq!(target, twice, "applying again changes nothing");
        assert_eq!(
            target["spec"]["template"]["spec"]["readinessGates"],
            json!([{"conditionType": "example.com/theirs"}, {"conditionType": "openmed.ai/model-quality"}])
        );
        plain.apply_to(&mut target).unwrap();
        assert_eq!(
            target["spec"]["template"]["spec"]["readinessGates"],
            json!([{"conditionType": "example.com/theirs"}]),
            "without the gate only ours goes"
        );
    }

    fn deployment() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "svc", "namespace": "ns", "labels": {"app": "svc"}},
            "spec": {
                "replicas": 5, "progressDeadlineSeconds": 900,
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
                "selector": {"matchLabels": {"app": "svc"}},
                "template": {"metadata": {"labels": {"app": "svc"}},
                             "spec": {"containers": [{"name": "openmed-service", "image": "x",
                                                      "env": [{"name": PRELOAD_ENV, "value": "old"}]}]}},
            },
        })
    }

    #[test]
    fn the_apply_body_holds_only_owned_fields() {
        let body = fields(json!({}), TargetOptions::default()).apply_body();
        let hash = plan(&id(), &spec(json!({})), TargetOptions::default()).manifest_hash;
        assert_eq!(
            body,
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "svc", "namespace": "ns",
                             "annotations": {MODEL_RESOURCE_ANNOTATION: "ns/svc"},
                             "labels": {OPERATED_BY_LABEL: FIELD_MANAGER}},
                "spec": {
                    "replicas": 2, "progressDeadlineSeconds": 600,
                    "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                    "template": {
                        "metadata": {"annotations": {
                            MANIFEST_HASH_ANNOTATION: hash,
                            MODEL_RESOURCE_ANNOTATION: "ns/svc"},
                            "labels": {MANIFEST_SNAPSHOT_LABEL: &hash[7..17]}},
                        "spec": {"containers": [{"name": "openmed-service", "env": [{
                            "name": PRELOAD_ENV,
                            "valueFrom": {"configMapKeyRef": {"name": format!("svc-model-manifest-{}", &hash[7..17]), "key": PRELOAD_ENV}},
                            "value": "",
                        }]}]},
                    },
                },
            })
        );
    }

    #[test]
    fn an_autoscaled_target_gets_no_replicas() {
        let f = fields(json!({}), TargetOptions { autoscaled: true });
        assert_eq!(f.replicas, None);
        assert!(f.apply_body()["spec"].get("replicas").is_none());
    }

    #[test]
    fn recreate_has_no_rolling_update_settings() {
        let f = fields(
            json!({"rolloutStrategy": {"type": "Recreate"}}),
            TargetOptions::default(),
        );
        assert_eq!(f.strategy, Some(json!({"type": "Recreate"})));
        assert_eq!(
            f.strategic_patch()["spec"]["strategy"],
            json!({"type": "Recreate", "rollingUpdate": null})
        );
        let mut d = deployment();
        f.apply_to(&mut d).unwrap();
        assert_eq!(d["spec"]["strategy"], json!({"type": "Recreate"}));
    }

    #[test]
    fn applying_to_a_deployment_sets_the_fields_and_is_idempotent() {
        let f = fields(json!({}), TargetOptions::default());
        let mut d = deployment();
        f.apply_to(&mut d).unwrap();
        let env = &d["spec"]["template"]["spec"]["containers"][0]["env"][0];
        assert!(env.get("value").is_none());
        let name = env["valueFrom"]["configMapKeyRef"]["name"]
            .as_str()
            .unwrap();
        assert_eq!(
            name,
            format!("svc-model-manifest-{}", f.snapshot_label.as_ref().unwrap())
        );
        assert_eq!(
            d["spec"]["template"]["metadata"]["labels"][MANIFEST_SNAPSHOT_LABEL],
            json!(f.snapshot_label)
        );
        assert_eq!(d["spec"]["replicas"], 2);
        assert_eq!(
            d["metadata"]["labels"],
            json!({"app": "svc", OPERATED_BY_LABEL: FIELD_MANAGER})
        );
        let once = d.clone();
        f.apply_to(&mut d).unwrap();
        assert_eq!(d, once, "no drift after applying");
    }

    #[test]
    fn a_missing_container_names_those_present() {
        let f = fields(
            json!({"targetRef": {"containerName": "api"}}),
            TargetOptions::default(),
        );
        let err = f.apply_to(&mut deployment()).unwrap_err();
        assert_eq!(err.available, ["openmed-service"]);
        assert!(
            err.to_string()
                .contains("\"api\" not found in Deployment ns/svc; it has: openmed-service")
        );
    }

    #[test]
    fn the_released_form_empties_the_variable_and_keeps_scaling_fields() {
        let mut d = deployment();
        fields(json!({}), TargetOptions::default())
            .apply_to(&mut d)
            .unwrap();
        let released = DeploymentFields::released("ns", "svc", "openmed-service", &d, None);
        // Hash of a manifest with an empty model list, as the earlier operator computed it.
        assert_eq!(
            released.manifest_hash,
            "sha256:c3475ac5012b68efa39d75c49cd65d2bb9a50a3b179f356add3474d474d43e10"
        );
        assert_eq!(released.replicas, Some(2));
        let body = released.apply_body();
        assert!(body["metadata"].get("annotations").is_none());
        assert!(body["metadata"].get("labels").is_none());
        assert_eq!(body["spec"]["replicas"], 2);
        assert_eq!(
            body["spec"]["template"]["metadata"]["annotations"],
            json!({MANIFEST_HASH_ANNOTATION: released.manifest_hash})
        );
        assert_eq!(
            body["spec"]["template"]["spec"]["containers"][0]["env"],
            json!([{"name": PRELOAD_ENV, "value": ""}])
        );
        released.apply_to(&mut d).unwrap();
        assert_eq!(d["metadata"]["labels"], json!({"app": "svc"}));
        assert!(d["metadata"].get("annotations").is_none());
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["env"],
            json!([{"name": PRELOAD_ENV}])
        );
    }

    #[test]
    fn a_release_takes_back_only_the_marks_another_manager_holds() {
        let fields = DeploymentFields::released("ns", "svc", "openmed-service", &json!({}), None);
        let env_path = json!({"k:{\"name\":\"openmed-service\"}": {"f:env": {
            "k:{\"name\":\"OPENMED_SERVICE_PRELOAD_MODELS\"}": {"f:valueFrom": {}}}}});
        let held_as = |manager: &str, operation: &str| {
            json!({"metadata": {"managedFields": [{
                "manager": manager, "operation": operation,
                "fieldsV1": {
                    "f:metadata": {"f:annotations": {"f:openmed.ai/model-resource": {}}},
                    "f:spec": {"f:template": {
                        "f:metadata": {"f:annotations": {"f:openmed.ai/model-resource": {}}},
                        "f:spec": {"f:containers": env_path},
                    }},
                },
            }]}})
        };
        let held = |manager: &str| held_as(manager, "Update");
        assert!(
            fields.release_reset(&held(FIELD_MANAGER)).is_some(),
            "the earlier operator patches as openmed-operator too, an Update"
        );
        assert_eq!(fields.release_reset(&json!({})), None);
        assert_eq!(fields.release_reset(&held_as(FIELD_MANAGER, "Apply")), None);
        let patch = fields.release_reset(&held("kopf")).expect("a patch");
        assert_eq!(
            patch,
            json!({
                "metadata": {"annotations": {"openmed.ai/model-resource": null}},
                "spec": {"template": {
                    "metadata": {"annotations": {"openmed.ai/model-resource": null}},
                    "spec": {"containers": [{"name": "openmed-service",
                        "env": [{"name": "OPENMED_SERVICE_PRELOAD_MODELS", "valueFrom": null}]}]},
                }},
            })
        );
    }
}
