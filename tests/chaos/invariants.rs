//! The promises the operator keeps, checked continuously while a fault is
//! active: a watcher (direct to the API server, not through the proxy) sees
//! every change to pods, OpenMedModels and Events in a scenario's namespace
//! and checks each one as it happens; the checks that only make sense once
//! things have settled run at the end.
//!
//! A check that reads the cache and finds something missing asks the API
//! server again before it reports, so a watch that lags is never taken for
//! a broken promise.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use openmed_op::api::names::{
    EVENT_GENERATION_ANNOTATION, MANIFEST_KEY, MANIFEST_SNAPSHOT_LABEL, MODEL_RESOURCE_ANNOTATION,
    PRELOAD_ENV,
};
use openmed_op::api::{OpenMedModel, Phase};
use openmed_op::plan::canonical::{sha256_tag, to_canonical_json};
use openmed_op::plan::snapshot_suffix;

/// How long a settled check waits for the status to catch up with a change
/// that has converged (the template moves first, the status follows).
const SETTLE: std::time::Duration = std::time::Duration::from_secs(60);

/// Lifecycle events that a decision emits once: a second copy is a
/// duplicate (two writers, or a retried pass that emitted again).
const ONCE: &[&str] = &[
    "RolloutStarted",
    "RolloutSucceeded",
    "RolloutFailed",
    "RollbackStarted",
    "RollbackSucceeded",
    "RollbackFailed",
];

/// What the scenario tells the watcher.
#[derive(Debug, Default)]
pub struct Expect {
    /// Versions that never get ready: never retained.
    pub unready: Mutex<BTreeSet<String>>,
    /// Set while someone other than the operator writes owned fields (a
    /// DriftCorrected event is then legitimate).
    pub foreign_writer: AtomicBool,
    /// Set when a scenario runs two writers on purpose (without leader
    /// election), to show what breaks: violations are then counted, not
    /// failed on.
    pub tolerate: AtomicBool,
}

/// The running watcher.
pub struct Invariants {
    pub expect: Arc<Expect>,
    violations: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    client: Client,
    namespace: String,
}

impl Invariants {
    /// Starts watching `namespace`.
    pub fn start(client: &Client, namespace: &str) -> Self {
        let expect = Arc::new(Expect::default());
        let violations = Arc::new(Mutex::new(Vec::new()));
        let shared = Checks {
            client: client.clone(),
            namespace: namespace.to_owned(),
            expect: expect.clone(),
            violations: violations.clone(),
            rollback_counts: Arc::new(Mutex::new(BTreeMap::new())),
            lifecycle: Arc::new(Mutex::new(BTreeMap::new())),
        };
        let tasks = vec![
            each_change(Api::<Pod>::namespaced(client.clone(), namespace), {
                let checks = shared.clone();
                move |pod| {
                    let checks = checks.clone();
                    async move { checks.pod(&pod).await }
                }
            }),
            each_change(
                Api::<OpenMedModel>::namespaced(client.clone(), namespace),
                {
                    let checks = shared.clone();
                    move |model| {
                        checks.model(&model);
                        std::future::ready(())
                    }
                },
            ),
            each_change(Api::<Event>::namespaced(client.clone(), namespace), {
                let checks = shared;
                move |event| {
                    checks.event(&event);
                    std::future::ready(())
                }
            }),
        ];
        Invariants {
            expect,
            violations,
            tasks,
            client: client.clone(),
            namespace: namespace.to_owned(),
        }
    }

    /// Every violation seen so far.
    pub fn violations(&self) -> Vec<String> {
        self.violations.lock().unwrap().clone()
    }

    /// The checks of a settled state: each Deployment's template, the
    /// model's `status.manifestHash` and the ConfigMap the template reads
    /// agree; `rollbackCount` is the number of rollbacks (automatic and
    /// manual) the scenario caused.
    pub async fn settled(&self, model: &str, rollbacks: i64) {
        let models: Api<OpenMedModel> = Api::namespaced(self.client.clone(), &self.namespace);
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), &self.namespace);
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        // Settled: the status is of the current generation, Ready or
        // RolledBack, and the rollout it reports has finished (a rename,
        // for one, moves the template before the status follows).
        let started = std::time::Instant::now();
        let resource = loop {
            let Ok(resource) = models.get(model).await else {
                self.report(format!("{model} is gone"));
                return;
            };
            let status = resource.status.clone().unwrap_or_default();
            let current = status.observed_generation == resource.metadata.generation;
            let at_rest = matches!(status.phase, Some(Phase::Ready | Phase::RolledBack));
            let template = deployments
                .get(&target_of(&resource, model))
                .await
                .ok()
                .and_then(|d| {
                    d.spec?
                        .template
                        .metadata?
                        .labels?
                        .get(MANIFEST_SNAPSHOT_LABEL)
                        .cloned()
                });
            let agrees =
                template.as_deref() == status.manifest_hash.as_deref().map(snapshot_suffix);
            if (current && at_rest && agrees) || started.elapsed() > SETTLE {
                break resource;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        };
        let status = resource.status.clone().unwrap_or_default();
        let target = target_of(&resource, model);
        if status.rollback_count.unwrap_or(0) != rollbacks {
            self.report(format!(
                "rollbackCount is {:?}, but {rollbacks} rollbacks were performed",
                status.rollback_count
            ));
        }
        let Ok(deployment) = deployments.get(&target).await else {
            self.report(format!("Deployment {target} is gone"));
            return;
        };
        let template = deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.labels.as_ref())
            .and_then(|l| l.get(MANIFEST_SNAPSHOT_LABEL).cloned());
        let status_hash = status.manifest_hash.clone().unwrap_or_default();
        if template.as_deref() != Some(snapshot_suffix(&status_hash)) {
            self.report(format!(
                "the template's manifest {template:?} is not status.manifestHash {status_hash}"
            ));
        }
        match reference(
            deployment
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref()),
        ) {
            Some(name) => match cms.get_opt(&name).await.ok().flatten() {
                Some(cm)
                    if manifest_suffix(&cm).as_deref() == Some(snapshot_suffix(&status_hash)) => {}
                Some(cm) => self.report(format!(
                    "the template reads {name}, whose manifest {:?} is not {status_hash}",
                    manifest_suffix(&cm)
                )),
                None => self.report(format!("the template reads {name}, which is missing")),
            },
            None => self.report("the template reads no ConfigMap".to_owned()),
        }
    }

    /// After every model is deleted: no Deployment still reads a missing
    /// ConfigMap or names a missing model as its owner.
    pub async fn released(&self) {
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), &self.namespace);
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let models: Api<OpenMedModel> = Api::namespaced(self.client.clone(), &self.namespace);
        for deployment in deployments.list(&Default::default()).await.unwrap() {
            let name = deployment.name_any();
            if let Some(cm) = reference(
                deployment
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.spec.as_ref()),
            ) && cms.get_opt(&cm).await.ok().flatten().is_none()
            {
                self.report(format!("Deployment {name} reads missing ConfigMap {cm}"));
            }
            if let Some(owner) = deployment.annotations().get(MODEL_RESOURCE_ANNOTATION) {
                let model = owner.split_once('/').map_or(owner.as_str(), |(_, n)| n);
                if models.get_opt(model).await.ok().flatten().is_none() {
                    self.report(format!("Deployment {name} names missing owner {owner}"));
                }
            }
        }
    }

    pub fn report(&self, violation: String) {
        report(
            &self.violations,
            &self.expect,
            format!("{}: {violation}", self.namespace),
        );
    }
}

impl Drop for Invariants {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Runs `check` on every object `api` lists or sees change, for as long as
/// the task lives.
fn each_change<K, F, Fut>(api: Api<K>, mut check: F) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
    F: FnMut(K) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) = event {
                check(object).await;
            }
        }
    })
}

fn report(violations: &Mutex<Vec<String>>, expect: &Expect, violation: String) {
    let tolerated = expect.tolerate.load(Ordering::SeqCst);
    eprintln!(
        "invariant {}: {violation}",
        if tolerated {
            "broken (expected here)"
        } else {
            "VIOLATED"
        }
    );
    violations.lock().unwrap().push(violation);
}

#[derive(Clone)]
struct Checks {
    client: Client,
    namespace: String,
    expect: Arc<Expect>,
    violations: Arc<Mutex<Vec<String>>>,
    rollback_counts: Arc<Mutex<BTreeMap<String, i64>>>,
    lifecycle: Arc<Mutex<BTreeMap<Occurrence, String>>>,
}

/// A lifecycle step of one spec change: (resource uid, reason, generation),
/// mapped to the one Event that may record it.
type Occurrence = (String, String, String);

impl Checks {
    fn report(&self, violation: String) {
        report(
            &self.violations,
            &self.expect,
            format!("{}: {violation}", self.namespace),
        );
    }

    /// No pod fails on its configuration, and every pod reads the manifest
    /// of its own template.
    async fn pod(&self, pod: &Pod) {
        if pod.metadata.deletion_timestamp.is_some() {
            return;
        }
        let name = pod.name_any();
        let config_error = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
            .find(|w| w.reason.as_deref() == Some("CreateContainerConfigError"));
        if let Some(waiting) = config_error {
            self.report(format!(
                "pod {name} is in CreateContainerConfigError: {}",
                waiting.message.clone().unwrap_or_default()
            ));
        }
        let Some(own) = pod.labels().get(MANIFEST_SNAPSHOT_LABEL).cloned() else {
            return;
        };
        let Some(cm_name) = reference(pod.spec.as_ref()) else {
            return;
        };
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        match cms.get_opt(&cm_name).await {
            Ok(Some(cm)) => {
                let reads = manifest_suffix(&cm);
                if reads.as_deref() != Some(own.as_str()) {
                    self.report(format!(
                        "pod {name} of template {own} reads {cm_name}, manifest {reads:?}"
                    ));
                }
            }
            Ok(None) => {
                // Gone now: a problem only if the pod is still there.
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
                if let Ok(Some(live)) = pods.get_opt(&name).await
                    && live.metadata.deletion_timestamp.is_none()
                {
                    self.report(format!("pod {name} reads missing ConfigMap {cm_name}"));
                }
            }
            Err(_) => {}
        }
    }

    /// `rollbackCount` steps by one; retained specs hold only versions that
    /// can get ready; no RollbackFailed.
    fn model(&self, model: &OpenMedModel) {
        let name = model.name_any();
        let Some(status) = model.status.as_ref() else {
            return;
        };
        let count = status.rollback_count.unwrap_or(0);
        let mut counts = self.rollback_counts.lock().unwrap();
        let key = format!("{name}/{}", model.uid().unwrap_or_default());
        if let Some(&before) = counts.get(&key)
            && !(count == before || count == before + 1)
        {
            self.report(format!(
                "{name}: rollbackCount went from {before} to {count}"
            ));
        }
        counts.insert(key, count);
        drop(counts);
        let unready = self.expect.unready.lock().unwrap().clone();
        for (field, spec) in [
            ("lastSuccessfulSpec", &status.last_successful_spec),
            ("previousSuccessfulSpec", &status.previous_successful_spec),
        ] {
            if let Some(spec) = spec
                && unready.contains(&spec.version)
            {
                self.report(format!(
                    "{name}: {field} retains {}, which never got ready",
                    spec.version
                ));
            }
        }
        if status
            .conditions
            .iter()
            .any(|c| c.reason == "RollbackFailed")
        {
            self.report(format!(
                "{name}: RollbackFailed, though the restored version gets ready"
            ));
        }
    }

    /// No DriftCorrected without a foreign writer; each lifecycle event once.
    fn event(&self, event: &Event) {
        let reason = event.reason.clone().unwrap_or_default();
        let object = event
            .regarding
            .as_ref()
            .and_then(|r| r.name.clone())
            .unwrap_or_default();
        let note = event.note.clone().unwrap_or_default();
        let count = event.series.as_ref().map_or(1, |s| s.count);
        if reason == "DriftCorrected" && !self.expect.foreign_writer.load(Ordering::SeqCst) {
            self.report(format!(
                "{object}: DriftCorrected with no other writer: {note}"
            ));
        }
        if ONCE.contains(&reason.as_str()) && count > 1 {
            self.report(format!("{object}: {reason} recorded {count} times: {note}"));
        }
        // The same lifecycle step with another note is another Event (the
        // note is part of an Event's name): still a duplicate.
        if ONCE.contains(&reason.as_str()) {
            let uid = event
                .regarding
                .as_ref()
                .and_then(|r| r.uid.clone())
                .unwrap_or_default();
            let generation = event
                .annotations()
                .get(EVENT_GENERATION_ANNOTATION)
                .cloned()
                .unwrap_or_default();
            let name = event.name_any();
            let mut seen = self.lifecycle.lock().unwrap();
            let first = seen
                .entry((uid, reason.clone(), generation.clone()))
                .or_insert_with(|| name.clone());
            if *first != name {
                self.report(format!(
                    "{object}: {reason} recorded twice for generation {generation}: {note}"
                ));
            }
        }
    }
}

/// The Deployment a model names (its own name when `targetRef` has none).
fn target_of(model: &OpenMedModel, name: &str) -> String {
    model
        .spec
        .target_ref
        .name
        .clone()
        .unwrap_or_else(|| name.to_owned())
}

/// The ConfigMap a pod spec's preload variable reads.
fn reference(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> Option<String> {
    spec?.containers.iter().find_map(|c| {
        c.env.as_ref()?.iter().find_map(|e| {
            (e.name == PRELOAD_ENV)
                .then(|| e.value_from.as_ref()?.config_map_key_ref.as_ref())
                .flatten()
                .map(|r| r.name.clone())
        })
    })
}

/// The short hash of the manifest a ConfigMap holds.
fn manifest_suffix(cm: &ConfigMap) -> Option<String> {
    let manifest: serde_json::Value =
        serde_json::from_str(cm.data.as_ref()?.get(MANIFEST_KEY)?).ok()?;
    let hash = sha256_tag(to_canonical_json(&manifest).as_bytes());
    Some(snapshot_suffix(&hash).to_owned())
}
