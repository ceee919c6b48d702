//! A set of manifests: the OpenMedModels in it, validated and planned
//! against the Deployments beside them.
//!
//! `render` (files) and `verify` (Git trees) both start from a set of YAML
//! documents and must judge it the same way: the shared `validate`, the
//! checks that need the target (its container, its `minReadySeconds`), and
//! the rule that one Deployment and one ConfigMap have one owner. That
//! judgement lives here, pure, once.

use std::collections::HashMap;

use serde_json::Value;

use crate::api::{self, TargetFacts};
use crate::findings::Finding;
use crate::plan::{self, Plan, ResourceId, TargetOptions};
use crate::source::Document;

/// Rule ids shared by every report.
pub mod rule {
    /// The resource fails `validate`.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// An `openmed.ai` kind at an API version this build does not know.
    pub const UNSUPPORTED_VERSION: &str = "UnsupportedVersion";
    /// The target Deployment has no container of the configured name.
    pub const CONTAINER_NOT_FOUND: &str = "ContainerNotFound";
    /// Two resources claim one Deployment or one ConfigMap.
    pub const TARGET_CONFLICT: &str = "TargetConflict";
    /// The canary Deployment is the stable one, or lacks the container.
    pub const CANARY_TARGET_INVALID: &str = "CanaryTargetInvalid";
    /// The HTTPRoute in the set lacks the rule or a backend, or is
    /// ambiguous.
    pub const ROUTE_INVALID: &str = "RouteInvalid";
    /// The canary backend's weight in the set is not 0: at rest the route
    /// must send the canary nothing.
    pub const CANARY_WEIGHT_NOT_ZERO: &str = "CanaryWeightNotZero";
    /// A Service of the route selects the other Deployment's pods too.
    pub const SERVICE_SELECTS_BOTH: &str = "ServiceSelectsBoth";
    /// The target container takes its served set from a ConfigMap or
    /// Secret: the model's versions cannot be added to it, so its pods
    /// would refuse every client naming a new version.
    pub const SERVED_SET_REFERENCED: &str = "ServedSetReferenced";
    /// `spec.autoscaling` on a Deployment another HorizontalPodAutoscaler
    /// of the set scales, or with the name of one that is not the
    /// resource's: two autoscalers of one Deployment fight.
    pub const AUTOSCALER_CONFLICT: &str = "AutoscalerConflict";
}

/// One OpenMedModel of the set, valid and planned.
#[derive(Debug, Clone)]
pub struct Model {
    /// Index of its document in the set.
    pub doc: usize,
    /// The resource, with its namespace resolved.
    pub id: ResourceId,
    /// What the operator would write for it.
    pub plan: Plan,
    /// Index of the target Deployment's document, when the set contains it.
    pub target_doc: Option<usize>,
    /// Index of a ConfigMap document this resource already owns (an earlier
    /// render's output), which the plan replaces.
    pub config_map_doc: Option<usize>,
    /// Index of the manifest snapshot's document, likewise.
    pub snapshot_doc: Option<usize>,
    /// The canary, when the spec has one.
    pub canary: Option<CanaryModel>,
    /// `spec.autoscaling`.
    pub autoscaling: Option<api::Autoscaling>,
    /// The object `spec.autoscaling` asks the operator to own, as a
    /// document: a HorizontalPodAutoscaler, or a KEDA ScaledObject.
    pub autoscaler: Option<Value>,
    /// Index of that autoscaler's document, when the set has it (an
    /// earlier render's output), which the plan replaces.
    pub autoscaler_doc: Option<usize>,
}

/// A model's canary, planned against the set.
#[derive(Debug, Clone)]
pub struct CanaryModel {
    /// `spec.canary`.
    pub spec: api::Canary,
    /// What the operator writes into the canary Deployment (the spec's
    /// version; at rest, after a promotion, it serves the same).
    pub plan: Plan,
    /// Index of the canary Deployment's document, when the set has it.
    pub target_doc: Option<usize>,
    /// Index of the HTTPRoute's document, when the set has it.
    pub route_doc: Option<usize>,
}

/// The judged set.
#[derive(Debug, Default)]
pub struct Resolved {
    /// Every valid OpenMedModel, in document order.
    pub models: Vec<Model>,
    /// Every problem, in document order.
    pub findings: Vec<Finding>,
}

/// True for an OpenMedModel document (any API version of the group).
pub fn is_model(doc: &Document) -> bool {
    doc.kind() == Some(api::KIND)
        && doc
            .api_version()
            .is_some_and(|v| v.split('/').next() == Some(api::GROUP))
}

/// Namespace of a document, or `default_namespace` when it has none.
pub fn namespace_of<'a>(doc: &'a Document, default_namespace: &'a str) -> &'a str {
    doc.namespace().unwrap_or(default_namespace)
}

/// Validates and plans every OpenMedModel in `docs`. Documents without a
/// namespace are taken to be in `default_namespace`, as kubectl would.
pub fn resolve(docs: &[Document], default_namespace: &str) -> Resolved {
    let mut models = Vec::new();
    let findings = resolve_each(docs, default_namespace, |model| models.push(model));
    Resolved { models, findings }
}

/// [`resolve`], handing each valid model to `keep` as soon as it is judged
/// (in document order) instead of holding them all, and returning the
/// findings. A caller that needs only part of each [`Model`] keeps only
/// that: a plan holds several objects, and a set may hold many thousands.
/// The judgement is the same. Every valid model is handed over even when
/// other documents have findings; what such a set is worth is the caller's
/// to say (for `render`, nothing).
pub fn resolve_each(
    docs: &[Document],
    default_namespace: &str,
    keep: impl FnMut(Model),
) -> Vec<Finding> {
    resolve_each_running(docs, default_namespace, &HashMap::new(), keep)
}

/// [`resolve_each`] for a cluster known to run `running`'s versions
/// (`namespace/name` to the version its pods serve, as at the base of a
/// change): each served set then keeps the running version beside the
/// new one, as the operator writes it for a bump.
pub fn resolve_each_running(
    docs: &[Document],
    default_namespace: &str,
    running: &HashMap<String, String>,
    mut keep: impl FnMut(Model),
) -> Vec<Finding> {
    let index = Index::build(docs, default_namespace);
    let mut findings = Vec::new();
    let mut deployment_owner: HashMap<(String, String), usize> = HashMap::new();
    let mut config_map_owner: HashMap<(String, String), usize> = HashMap::new();

    for (i, doc) in docs.iter().enumerate() {
        if !is_model(doc) {
            continue;
        }
        let namespace = namespace_of(doc, default_namespace).to_owned();
        let display = format!("{namespace}/{}", doc.name().unwrap_or("<unnamed>"));
        if doc.api_version() != Some(api::API_VERSION) {
            findings.push(
                Finding::error(
                    &doc.at("apiVersion"),
                    rule::UNSUPPORTED_VERSION,
                    format!(
                        "{} is not supported; this version of openmed-op reads {}",
                        doc.api_version().unwrap_or("?"),
                        api::API_VERSION
                    ),
                )
                .resource(&display)
                .field("apiVersion"),
            );
            continue;
        }

        // The target is needed before validation: its minReadySeconds bounds
        // the progress deadline.
        let target_name = doc
            .value
            .pointer("/spec/targetRef/name")
            .and_then(Value::as_str)
            .or(doc.name())
            .unwrap_or_default()
            .to_owned();
        let target_doc = index.deployment(&namespace, &target_name);
        let facts = target_doc.map(|t| TargetFacts {
            min_ready_seconds: docs[t]
                .value
                .pointer("/spec/minReadySeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0) as i32,
        });
        let spec = match api::validate(&doc.value, facts.as_ref()) {
            Ok(spec) => spec,
            Err(errors) => {
                for e in errors {
                    findings.push(
                        Finding::error(&doc.at(&e.path), rule::INVALID_SPEC, e.message)
                            .resource(&display)
                            .field(e.path),
                    );
                }
                continue;
            }
        };
        let id = ResourceId {
            namespace: namespace.clone(),
            name: doc.name().unwrap_or_default().to_owned(),
            uid: doc
                .value
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .map(str::to_owned),
        };
        let options = TargetOptions {
            autoscaled: index.autoscaled(&namespace, &target_name) || spec.autoscaling.is_some(),
        };
        let plan = plan::plan(&id, &spec, options);

        let mut ok = true;
        if let Some(t) = target_doc
            && let Err(missing) = plan.deployment.apply_to(&mut docs[t].value.clone())
        {
            findings.push(
                Finding::error(
                    &doc.at("spec.targetRef"),
                    rule::CONTAINER_NOT_FOUND,
                    missing.to_string(),
                )
                .resource(&display)
                .field("spec.targetRef.containerName"),
            );
            ok = false;
        }
        let deployment_key = (namespace.clone(), plan.deployment.name.clone());
        if let Some(&first) = deployment_owner.get(&deployment_key) {
            findings.push(conflict(
                doc,
                &display,
                &docs[first],
                "Deployment",
                &deployment_key.1,
            ));
            ok = false;
        }
        let config_map_name = plan.config_map.metadata.name.clone().unwrap_or_default();
        let config_map_key = (namespace.clone(), config_map_name.clone());
        if let Some(&first) = config_map_owner.get(&config_map_key) {
            findings.push(conflict(
                doc,
                &display,
                &docs[first],
                "ConfigMap",
                &config_map_name,
            ));
            ok = false;
        }
        let config_map_doc = index.config_map(&namespace, &config_map_name);
        let snapshot_name = plan.snapshot.metadata.name.clone().unwrap_or_default();
        let snapshot_doc = index.config_map(&namespace, &snapshot_name);
        for (name, found) in [
            (&config_map_name, config_map_doc),
            (&snapshot_name, snapshot_doc),
        ] {
            let Some(c) = found else { continue };
            let owner = docs[c]
                .value
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(api::names::MODEL_RESOURCE_ANNOTATION))
                .and_then(Value::as_str);
            if owner != Some(id.key().as_str()) {
                findings.push(
                    Finding::error(
                        &doc.at("spec"),
                        rule::TARGET_CONFLICT,
                        format!(
                            "ConfigMap {name} is already defined at {} and is not owned by this resource; set spec.manifestConfigMapName to another name",
                            docs[c].at("metadata.name")
                        ),
                    )
                    .resource(&display)
                    .field("spec.manifestConfigMapName"),
                );
                ok = false;
            }
        }
        // What the pods preload now: the pointer ConfigMap rendered into
        // the input, else the version the cluster is known to run.
        let pointer_version = config_map_doc
            .and_then(|c| {
                docs[c]
                    .value
                    .pointer("/data")
                    .and_then(|d| d.get(api::names::PRELOAD_ENV))
                    .and_then(Value::as_str)
            })
            .or_else(|| running.get(&display).map(String::as_str));
        let mut plan = plan;
        if let Some(t) = target_doc
            && let Some(finding) = serve(&docs[t], &mut plan, pointer_version, &display)
        {
            findings.push(finding);
            ok = false;
        }
        let mut canary = spec.canary.as_ref().map(|c| CanaryModel {
            spec: c.clone(),
            plan: plan::canary_plan(&id, &plan.normalized, c),
            target_doc: index.deployment(&namespace, &c.target_ref.name),
            route_doc: index.route(&namespace, &c.traffic_ref.http_route),
        });
        if let Some(c) = &mut canary
            && let Some(t) = c.target_doc
            && let Some(finding) = serve(&docs[t], &mut c.plan, pointer_version, &display)
        {
            findings.push(finding.field("spec.canary.targetRef.containerName"));
            ok = false;
        }
        if let Some(c) = &canary {
            let found = check_canary(docs, &index, doc, &display, &namespace, &plan, c);
            ok &= found.is_empty();
            findings.extend(found);
            let key = (namespace.clone(), c.plan.deployment.name.clone());
            if let Some(&first) = deployment_owner.get(&key) {
                findings.push(
                    conflict(doc, &display, &docs[first], "Deployment", &key.1)
                        .field("spec.canary.targetRef.name"),
                );
                ok = false;
            }
            deployment_owner.entry(key).or_insert(i);
        }
        let autoscaler = spec
            .autoscaling
            .as_ref()
            .map(|a| plan::autoscaler::document(&id, &plan.deployment.name, a));
        let mut autoscaler_doc = None;
        if let Some(asked) = &spec.autoscaling {
            let kind = match asked.keda {
                Some(_) => "ScaledObject",
                None => "HorizontalPodAutoscaler",
            };
            match autoscaler_conflict(
                docs,
                &index,
                doc,
                &display,
                &id,
                &plan.deployment.name,
                kind,
            ) {
                Ok(found) => autoscaler_doc = found,
                Err(finding) => {
                    findings.push(*finding);
                    ok = false;
                }
            }
        }
        deployment_owner.entry(deployment_key).or_insert(i);
        config_map_owner.entry(config_map_key).or_insert(i);
        if ok {
            keep(Model {
                doc: i,
                id,
                plan,
                target_doc,
                config_map_doc,
                snapshot_doc,
                canary,
                autoscaling: spec.autoscaling.clone(),
                autoscaler,
                autoscaler_doc,
            });
        }
    }
    findings
}

/// The document of the resource's own autoscaler in the set, if any; or
/// why `spec.autoscaling` cannot have one: another autoscaler of the set
/// scales the target, or holds the name without being the resource's.
fn autoscaler_conflict(
    docs: &[Document],
    index: &Index,
    doc: &Document,
    display: &str,
    id: &ResourceId,
    target: &str,
    kind: &str,
) -> Result<Option<usize>, Box<Finding>> {
    let is_ours = |d: &Document| {
        d.value
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(api::names::MODEL_RESOURCE_ANNOTATION))
            .and_then(Value::as_str)
            == Some(id.key().as_str())
    };
    let refuse = |message: String| {
        Box::new(
            Finding::error(
                &doc.at("spec.autoscaling"),
                rule::AUTOSCALER_CONFLICT,
                message,
            )
            .resource(display)
            .field("spec.autoscaling"),
        )
    };
    let named = match kind {
        "ScaledObject" => index.scaled_object(&id.namespace, &id.name),
        _ => index.autoscaler(&id.namespace, &id.name),
    };
    if let Some(n) = named
        && !is_ours(&docs[n])
    {
        return Err(refuse(format!(
            "{kind} {} is already defined at {} and is not this resource's; rename or remove it, or remove spec.autoscaling",
            id.name,
            docs[n].at("metadata.name")
        )));
    }
    let rivals: Vec<String> = index
        .scaling(&id.namespace, target)
        .iter()
        .copied()
        .filter(|&h| Some(h) != named)
        .map(|h| docs[h].at("metadata.name").to_string())
        .collect();
    if !rivals.is_empty() {
        return Err(refuse(format!(
            "Deployment {target} is already scaled by the HorizontalPodAutoscaler at {}; two autoscalers of one Deployment fight, so remove that one or spec.autoscaling",
            rivals.join(", ")
        )));
    }
    Ok(named)
}

/// Sets the served set `plan` writes on `target` (a Deployment of the
/// set), or returns why it cannot be managed there.
fn serve(
    target: &Document,
    plan: &mut Plan,
    pointer_version: Option<&str>,
    display: &str,
) -> Option<Finding> {
    let container = plan.deployment.container.clone();
    match plan::served::rendered(
        &target.value,
        &container,
        &plan.normalized.version,
        &plan.manifest_hash,
        pointer_version,
    ) {
        Ok(set) => {
            plan.deployment.served = set.as_ref().map(|s| s.value.clone());
            plan.deployment.served_versions = set.map(|s| s.versions);
            None
        }
        Err(refusal) => {
            let path = plan::served::entry_path(&target.value, &container).unwrap_or_default();
            Some(
                Finding::error(
                    &target.at(&path),
                    rule::SERVED_SET_REFERENCED,
                    format!(
                        "Deployment {}: {refusal}",
                        target.name().unwrap_or("<unnamed>")
                    ),
                )
                .resource(display)
                .field("spec.targetRef.containerName"),
            )
        }
    }
}

/// What the set says against a canary: the canary Deployment, the route
/// at rest, and the Services behind the two backends.
fn check_canary(
    docs: &[Document],
    index: &Index,
    doc: &Document,
    display: &str,
    namespace: &str,
    plan: &Plan,
    canary: &CanaryModel,
) -> Vec<Finding> {
    let mut found = Vec::new();
    let finding = |rule: &'static str, field: &str, message: String| {
        Finding::error(&doc.at(field), rule, message)
            .resource(display)
            .field(field.to_owned())
    };
    let spec = &canary.spec;
    if spec.target_ref.name == plan.deployment.name {
        found.push(finding(
            rule::CANARY_TARGET_INVALID,
            "spec.canary.targetRef.name",
            format!(
                "the canary Deployment must be a second Deployment, not the stable one ({})",
                plan.deployment.name
            ),
        ));
    }
    if let Some(t) = canary.target_doc
        && let Err(missing) = canary.plan.deployment.apply_to(&mut docs[t].value.clone())
    {
        found.push(finding(
            rule::CANARY_TARGET_INVALID,
            "spec.canary.targetRef.containerName",
            missing.to_string(),
        ));
    }
    let traffic = &spec.traffic_ref;
    if let Some(r) = canary.route_doc {
        match crate::rollout::route::locate(&docs[r].value, traffic, namespace) {
            Err(problem) => found.push(finding(
                rule::ROUTE_INVALID,
                "spec.canary.trafficRef",
                format!("{problem} (at {})", docs[r].at("spec.rules")),
            )),
            Ok(slots) if slots.weights.canary != 0 => found.push(finding(
                rule::CANARY_WEIGHT_NOT_ZERO,
                "spec.canary.trafficRef.canaryBackend",
                format!(
                    "backend {} has weight {} in HTTPRoute {} (at {}); at rest the canary must get 0",
                    traffic.canary_backend,
                    slots.weights.canary,
                    traffic.http_route,
                    docs[r].at(&format!(
                        "spec.rules[{}].backendRefs[{}].weight",
                        slots.rule, slots.canary
                    ))
                ),
            )),
            Ok(_) => {}
        }
    }
    // Each backend's Service must select its own Deployment's pods only.
    let pods = |d: Option<usize>| {
        d.and_then(|d| docs[d].value.pointer("/spec/template/metadata/labels"))
            .cloned()
    };
    let stable_pods = pods(index.deployment(namespace, &plan.deployment.name));
    let canary_pods = pods(canary.target_doc);
    for (service, other, other_name) in [
        (&traffic.stable_backend, &canary_pods, &spec.target_ref.name),
        (&traffic.canary_backend, &stable_pods, &plan.deployment.name),
    ] {
        let (Some(s), Some(other)) = (index.service(namespace, service), other) else {
            continue;
        };
        let selector = docs[s].value.pointer("/spec/selector");
        let selects = selector
            .and_then(Value::as_object)
            .is_some_and(|sel| !sel.is_empty() && sel.iter().all(|(k, v)| other.get(k) == Some(v)));
        if selects {
            found.push(finding(
                rule::SERVICE_SELECTS_BOTH,
                "spec.canary.trafficRef",
                format!(
                    "Service {service} (at {}) also selects the pods of Deployment {other_name}, so the weights would not split the traffic; give each Deployment a label only its Service selects",
                    docs[s].at("spec.selector")
                ),
            ));
        }
    }
    found
}

fn conflict(doc: &Document, display: &str, first: &Document, kind: &str, name: &str) -> Finding {
    Finding::error(
        &doc.at("spec.targetRef"),
        rule::TARGET_CONFLICT,
        format!(
            "{kind} {name} is already claimed by OpenMedModel {} at {}; one {kind} can have only one OpenMedModel",
            first.name().unwrap_or("?"),
            first.at("metadata.name"),
        ),
    )
    .resource(display)
    .field(if kind == "ConfigMap" {
        "spec.manifestConfigMapName"
    } else {
        "spec.targetRef.name"
    })
}

/// Where the Deployments, ConfigMaps and autoscalers of the set are.
struct Index {
    deployments: HashMap<(String, String), usize>,
    config_maps: HashMap<(String, String), usize>,
    routes: HashMap<(String, String), usize>,
    services: HashMap<(String, String), usize>,
    /// HorizontalPodAutoscalers by namespace and name, and by the
    /// Deployment each scales; KEDA ScaledObjects by namespace and name.
    autoscalers: HashMap<(String, String), usize>,
    scaled_objects: HashMap<(String, String), usize>,
    scaled_by: HashMap<(String, String), Vec<usize>>,
}

impl Index {
    fn build(docs: &[Document], default_namespace: &str) -> Self {
        let mut index = Index {
            deployments: HashMap::new(),
            config_maps: HashMap::new(),
            routes: HashMap::new(),
            services: HashMap::new(),
            autoscalers: HashMap::new(),
            scaled_objects: HashMap::new(),
            scaled_by: HashMap::new(),
        };
        for (i, doc) in docs.iter().enumerate() {
            let namespace = namespace_of(doc, default_namespace).to_owned();
            let name = doc.name().unwrap_or_default().to_owned();
            match (doc.api_version(), doc.kind()) {
                (Some("apps/v1"), Some("Deployment")) => {
                    index.deployments.entry((namespace, name)).or_insert(i);
                }
                (Some("v1"), Some("ConfigMap")) => {
                    index.config_maps.entry((namespace, name)).or_insert(i);
                }
                (Some("v1"), Some("Service")) => {
                    index.services.entry((namespace, name)).or_insert(i);
                }
                (Some(v), Some("HTTPRoute")) if v.starts_with("gateway.networking.k8s.io/") => {
                    index.routes.entry((namespace, name)).or_insert(i);
                }
                (Some(v), Some("ScaledObject")) if v.starts_with("keda.sh/") => {
                    index.scaled_objects.entry((namespace, name)).or_insert(i);
                }
                (Some(v), Some("HorizontalPodAutoscaler")) if v.starts_with("autoscaling/") => {
                    index
                        .autoscalers
                        .entry((namespace.clone(), name))
                        .or_insert(i);
                    let target = doc.value.pointer("/spec/scaleTargetRef");
                    let kind = target.and_then(|t| t.get("kind")).and_then(Value::as_str);
                    let name = target.and_then(|t| t.get("name")).and_then(Value::as_str);
                    if let (Some("Deployment"), Some(name)) = (kind, name) {
                        index
                            .scaled_by
                            .entry((namespace, name.to_owned()))
                            .or_default()
                            .push(i);
                    }
                }
                _ => {}
            }
        }
        index
    }

    fn deployment(&self, namespace: &str, name: &str) -> Option<usize> {
        self.deployments
            .get(&(namespace.to_owned(), name.to_owned()))
            .copied()
    }

    fn config_map(&self, namespace: &str, name: &str) -> Option<usize> {
        self.config_maps
            .get(&(namespace.to_owned(), name.to_owned()))
            .copied()
    }

    fn route(&self, namespace: &str, name: &str) -> Option<usize> {
        self.routes
            .get(&(namespace.to_owned(), name.to_owned()))
            .copied()
    }

    fn service(&self, namespace: &str, name: &str) -> Option<usize> {
        self.services
            .get(&(namespace.to_owned(), name.to_owned()))
            .copied()
    }

    fn scaled_object(&self, namespace: &str, name: &str) -> Option<usize> {
        self.scaled_objects
            .get(&(namespace.to_owned(), name.to_owned()))
            .copied()
    }

    fn autoscaler(&self, namespace: &str, name: &str) -> Option<usize> {
        self.autoscalers
            .get(&(namespace.to_owned(), name.to_owned()))
            .copied()
    }

    /// The autoscalers of the set that scale the Deployment `name`.
    fn scaling(&self, namespace: &str, name: &str) -> &[usize] {
        self.scaled_by
            .get(&(namespace.to_owned(), name.to_owned()))
            .map_or(&[], Vec::as_slice)
    }

    fn autoscaled(&self, namespace: &str, name: &str) -> bool {
        !self.scaling(namespace, name).is_empty()
    }
}
