//! The objects the harness creates: namespaces, target Deployments (one
//! replica each) and OpenMedModels, the hashes an operator should write,
//! and their creation with bounded concurrency.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Client, ResourceExt};
use openmed_op::api::{OpenMedModel, OpenMedModelSpec};
use openmed_op::plan::{self, ResourceId, TargetOptions};
use serde_json::{Value, json};

use crate::observe::Observer;
use crate::report::Setup;
use crate::{log, round};

/// The pod-template annotation an operator writes (wire compatible).
pub const HASH_ANNOTATION: &str = openmed_op::api::names::MANIFEST_HASH_ANNOTATION;

/// The label on every Deployment and OpenMedModel the harness creates.
pub const SELECTOR: &str = "app.kubernetes.io/part-of=openmed-bench";

/// The label on the harness's namespaces; all of them are deleted between runs.
const NAMESPACE_SELECTOR: &str = "openmed-bench/workload=true";

/// The version every model starts with.
pub const INITIAL_VERSION: &str = "OpenMed/bench-v1";

/// One target Deployment and the OpenMedModel for it (same name).
#[derive(Debug, Clone)]
pub struct Item {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl Item {
    /// `<namespace>/<name>`, the observer's key.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// N models spread round-robin over some namespaces.
#[derive(Debug, Clone)]
pub struct Workload {
    /// N.
    pub models: usize,
    /// The namespaces.
    pub namespaces: Vec<String>,
    /// The resources.
    pub items: Vec<Item>,
    /// `spec.replicas` of every target Deployment. 0 measures the operator
    /// and the API server without pods, so N = 10,000 fits one machine.
    pub target_replicas: i32,
}

impl Workload {
    /// `models` resources over `namespaces` namespaces, each target with
    /// `target_replicas` pods.
    pub fn new(models: usize, namespaces: usize, target_replicas: i32) -> Self {
        let namespaces: Vec<String> = (0..namespaces.max(1))
            .map(|i| format!("bench-{i:02}"))
            .collect();
        let items = (0..models)
            .map(|i| Item {
                namespace: namespaces[i % namespaces.len()].clone(),
                name: format!("svc-{i:04}"),
            })
            .collect();
        Workload {
            models,
            namespaces,
            items,
            target_replicas,
        }
    }

    /// `count` resources evenly spread over all of them, starting at
    /// `offset` of a step (0.0 or 0.5), so two samples do not overlap.
    pub fn sample(&self, count: usize, offset: f64) -> Vec<Item> {
        let count = count.min(self.items.len());
        if count == 0 {
            return Vec::new();
        }
        let step = self.items.len() as f64 / count as f64;
        (0..count)
            .map(|i| {
                let at = ((i as f64 + offset) * step) as usize;
                self.items[at.min(self.items.len() - 1)].clone()
            })
            .collect()
    }
}

/// The spec of the harness's models.
pub fn spec(version: &str) -> Value {
    json!({"family": "pii", "tier": "Small", "version": version})
}

/// The pod-template hash an operator must write for `item` at `version`:
/// computed by this repository's `plan`, which the compatibility vectors
/// keep equal to the earlier operator's.
pub fn expected_hash(item: &Item, version: &str) -> String {
    let spec: OpenMedModelSpec = serde_json::from_value(spec(version)).expect("a valid spec");
    let id = ResourceId {
        namespace: item.namespace.clone(),
        name: item.name.clone(),
        uid: None,
    };
    plan::plan(&id, &spec, TargetOptions::default()).manifest_hash
}

fn target(item: &Item, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": item.name,
            "namespace": item.namespace,
            "labels": {
                "app": item.name,
                "app.kubernetes.io/part-of": "openmed-bench",
                // For operators that act only on opted-in targets.
                "openmed.ai/managed": "true",
            },
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": item.name}},
            "template": {
                "metadata": {"labels": {"app": item.name}},
                "spec": {"containers": [{
                    "name": "openmed-service",
                    "image": "openmed/openmed-service:1.0.0",
                    "env": [{"name": "OPENMED_SERVICE_PRELOAD_MODELS", "value": "boot"}],
                }]},
            },
        },
    }))
    .expect("a Deployment")
}

fn model(item: &Item) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "openmed.ai/v1alpha1",
        "kind": "OpenMedModel",
        "metadata": {
            "name": item.name,
            "namespace": item.namespace,
            "labels": {"app.kubernetes.io/part-of": "openmed-bench"},
        },
        "spec": spec(INITIAL_VERSION),
    }))
    .expect("an OpenMedModel")
}

/// The OpenMedModels of a namespace, untyped: the harness reads the status
/// any operator writes without assuming more than the wire format.
pub fn models_api(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::erase::<OpenMedModel>(&()),
    )
}

/// Creates the namespaces and waits for their default ServiceAccount (pods
/// are refused until it exists).
pub async fn create_namespaces(client: &Client, plan: &Workload) -> Result<(), String> {
    let api: Api<Namespace> = Api::all(client.clone());
    for name in &plan.namespaces {
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"openmed-bench/workload": "true"}},
        }))
        .expect("a Namespace");
        api.create(&PostParams::default(), &ns)
            .await
            .map_err(|e| format!("namespace {name}: {e}"))?;
    }
    for name in &plan.namespaces {
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
        let deadline = Instant::now() + Duration::from_secs(60);
        while accounts.get_opt("default").await.ok().flatten().is_none() {
            if Instant::now() > deadline {
                return Err(format!("no default ServiceAccount in {name} after 60 s"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// Deletes every OpenMedModel of the workload, as users uninstall (while
/// the operator runs, so it releases each target and removes its
/// finalizer), and waits until they are gone; returns how long that took.
pub async fn delete_models(
    client: &Client,
    plan: &Workload,
    timeout: Duration,
) -> Result<Duration, String> {
    let started = Instant::now();
    for namespace in &plan.namespaces {
        models_api(client, namespace)
            .delete_collection(
                &DeleteParams::background(),
                &ListParams::default().labels(SELECTOR),
            )
            .await
            .map_err(|e| format!("deleting the OpenMedModels of {namespace}: {e}"))?;
    }
    let all: Api<DynamicObject> =
        Api::all_with(client.clone(), &ApiResource::erase::<OpenMedModel>(&()));
    loop {
        let left = all
            .list_metadata(&ListParams::default().labels(SELECTOR))
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        if left == 0 {
            return Ok(started.elapsed());
        }
        if started.elapsed() > timeout {
            return Err(format!(
                "{left} OpenMedModels were still there {timeout:?} after their deletion"
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Deletes every namespace of the harness and waits until they are gone.
/// No operator runs then, so OpenMedModels still holding a finalizer (an
/// operator that did not release them, or a run that was interrupted) lose
/// it first; otherwise their namespace would never go.
pub async fn delete_namespaces(client: &Client, timeout: Duration) -> Result<(), String> {
    let api: Api<Namespace> = Api::all(client.clone());
    let list = ListParams::default().labels(NAMESPACE_SELECTOR);
    let started = Instant::now();
    let mut stripped = 0;
    for ns in api.list(&list).await.map_err(|e| e.to_string())?.items {
        let models = models_api(client, &ns.name_any());
        let held = models
            .list_metadata(&ListParams::default())
            .await
            .map_or(Vec::new(), |l| l.items);
        for m in held.iter().filter(|m| !m.finalizers().is_empty()) {
            let patch = json!({"metadata": {"finalizers": null}});
            if models
                .patch(
                    &m.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .is_ok()
            {
                stripped += 1;
            }
        }
    }
    if stripped > 0 {
        log(format!(
            "removed the finalizers of {stripped} OpenMedModels nobody released"
        ));
    }
    loop {
        let remaining = api.list(&list).await.map_err(|e| e.to_string())?.items;
        if remaining.is_empty() {
            return Ok(());
        }
        for ns in &remaining {
            if ns.metadata.deletion_timestamp.is_none() {
                let _ = api
                    .delete(&ns.name_any(), &DeleteParams::background())
                    .await;
            }
        }
        if started.elapsed() > timeout {
            let names: Vec<String> = remaining.iter().map(|n| n.name_any()).collect();
            return Err(format!(
                "namespaces still there after {timeout:?}: {}",
                names.join(", ")
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Runs `create` for every item with at most `concurrency` in flight,
/// retrying transient failures; returns when each request was sent.
async fn create_all<F, Fut>(
    items: &[Item],
    concurrency: usize,
    create: F,
) -> Result<HashMap<String, Instant>, String>
where
    F: Fn(Item) -> Fut,
    Fut: Future<Output = Result<(), kube::Error>>,
{
    let results: Vec<Result<(String, Instant), String>> =
        futures::stream::iter(items.iter().cloned())
            .map(|item| {
                let create = &create;
                async move {
                    let key = item.key();
                    let mut attempt = 0;
                    loop {
                        let sent = Instant::now();
                        match create(item.clone()).await {
                            Ok(()) => return Ok((key, sent)),
                            // Created by the attempt whose response was lost.
                            Err(kube::Error::Api(s)) if s.code == 409 && attempt > 0 => {
                                return Ok((key, sent));
                            }
                            Err(e) if attempt < 5 && transient(&e) => {
                                attempt += 1;
                                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                            }
                            Err(e) => return Err(format!("creating {key}: {e}")),
                        }
                    }
                }
            })
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
    results.into_iter().collect()
}

fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        _ => true,
    }
}

/// Creates the target Deployments and waits until every one is available
/// (its Ready pods of the boot version, if it has any), before any
/// OpenMedModel exists.
pub async fn create_targets(
    client: &Client,
    plan: &Workload,
    observer: &Observer,
    concurrency: usize,
    guard: &dyn Fn() -> Result<(), String>,
) -> Result<Setup, String> {
    let started = Instant::now();
    create_all(&plan.items, concurrency, |item| async move {
        let api: Api<Deployment> = Api::namespaced(client.clone(), &item.namespace);
        api.create(&PostParams::default(), &target(&item, plan.target_replicas))
            .await
            .map(|_| ())
    })
    .await?;
    let created = started.elapsed();
    log(format!(
        "{} Deployments created in {:.2} s; waiting until they are available",
        plan.models,
        created.as_secs_f64()
    ));
    let keys: Vec<String> = plan.items.iter().map(Item::key).collect();
    observer
        .wait(
            "every target Deployment to be available",
            Duration::from_secs(300 + plan.models as u64),
            guard,
            |state| {
                keys.iter()
                    .all(|k| state.deployments.get(k).is_some_and(|d| d.available))
                    .then_some(())
            },
        )
        .await?;
    let available = started.elapsed();
    log(format!(
        "targets available after {:.2} s",
        available.as_secs_f64()
    ));
    Ok(Setup {
        deployments_created_s: round(created.as_secs_f64()),
        deployments_available_s: round(available.as_secs_f64()),
    })
}

/// Creates the OpenMedModels; returns when each create request was sent.
pub async fn create_models(
    client: &Client,
    plan: &Workload,
    concurrency: usize,
) -> Result<HashMap<String, Instant>, String> {
    create_all(&plan.items, concurrency, |item| async move {
        models_api(client, &item.namespace)
            .create(&PostParams::default(), &model(&item))
            .await
            .map(|_| ())
    })
    .await
}

/// A merge patch of an OpenMedModel's spec; returns the request's round trip.
pub async fn patch_spec(client: &Client, item: &Item, spec: Value) -> Result<Duration, String> {
    let started = Instant::now();
    models_api(client, &item.namespace)
        .patch(
            &item.name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .map_err(|e| format!("patching {}: {e}", item.key()))?;
    Ok(started.elapsed())
}
