//! The test environment the end-to-end and chaos suites share: a
//! namespace, an operator for it, and the helpers that read and change an
//! OpenMedModel there.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use openmed_op::api::{OpenMedModel, OpenMedModelStatus, Phase};
use serde_json::{Value, json};

use crate::support::*;

pub const ROLLOUT: Duration = Duration::from_secs(60);

/// How long a wait on a model's status gives a rollout: [`ROLLOUT`] for
/// the fake kubelet's pods, which are ready at once; the real-stack tiers
/// set more ([`set_status_deadline`]), since their pods are OpenMed
/// processes warming a model on two cores shared with the other
/// scenarios (a scale-up to six pods beside a first rollout took longer
/// than 60 s there).
static STATUS_DEADLINE: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

#[allow(dead_code)] // the e2e tier keeps ROLLOUT
pub fn set_status_deadline(deadline: Duration) {
    let _ = STATUS_DEADLINE.set(deadline);
}

/// One test's world: a namespace and an admin client, with the helpers
/// that read and change an OpenMedModel there, whoever runs the operator.
pub struct World {
    pub client: Client,
    pub ns: TestNamespace,
    /// Where the operator's log is, for a wait's timeout message.
    operator_log: String,
}

/// A [`World`] with an operator of the test's own, a process.
pub struct Env {
    world: World,
    pub operator: Operator,
}

impl std::ops::Deref for Env {
    type Target = World;

    fn deref(&self) -> &World {
        &self.world
    }
}

impl Env {
    pub async fn new(prefix: &str) -> Self {
        Self::with_operator_args(prefix, &[]).await
    }

    pub async fn with_operator_args(prefix: &str, args: &[&str]) -> Self {
        let client = admin().await;
        install_crd(&client).await;
        let ns = TestNamespace::create(&client, prefix).await;
        let operator = Operator::start(&ns.name, args);
        Env::of(client, ns, operator)
    }

    /// The world of namespace `ns`, where `operator` runs.
    pub fn of(client: Client, ns: TestNamespace, operator: Operator) -> Self {
        let operator_log = operator.log.display().to_string();
        Env {
            world: World {
                client,
                ns,
                operator_log,
            },
            operator,
        }
    }

    /// The namespace and the operator, for a test that replaces one.
    pub fn into_parts(self) -> (Client, TestNamespace, Operator) {
        let Env { world, operator } = self;
        (world.client, world.ns, operator)
    }

    pub async fn finish(self) {
        let (_, ns, mut operator) = self.into_parts();
        operator.kill();
        ns.delete().await;
    }
}

impl World {
    /// The world of namespace `ns`, whose operator runs elsewhere (in
    /// pods: `operator_log` says where their logs are).
    pub fn of(client: Client, ns: TestNamespace, operator_log: String) -> Self {
        World {
            client,
            ns,
            operator_log,
        }
    }

    pub async fn finish(self) {
        self.ns.delete().await;
    }

    pub fn models(&self) -> Api<OpenMedModel> {
        Api::namespaced(self.client.clone(), &self.ns.name)
    }

    pub fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), &self.ns.name)
    }

    pub fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.ns.name)
    }

    pub async fn apply(&self, yaml: &str) {
        apply_yaml(&self.client, Some(&self.ns.name), yaml, "e2e-user").await;
    }

    /// Unique version names per test, so the shared unready list does not leak.
    pub fn version(&self, name: &str) -> String {
        format!("OpenMed/{name}-{}", self.ns.name)
    }

    pub async fn status(&self, name: &str) -> OpenMedModelStatus {
        self.models()
            .get(name)
            .await
            .ok()
            .and_then(|m| m.status)
            .unwrap_or_default()
    }

    pub async fn wait_status(
        &self,
        name: &str,
        what: &str,
        ok: impl FnMut(&OpenMedModelStatus) -> bool,
    ) -> OpenMedModelStatus {
        wait_until(
            &format!(
                "{what} ({}/{name}; operator log {})",
                self.ns.name, self.operator_log
            ),
            *STATUS_DEADLINE.get().unwrap_or(&ROLLOUT),
            || self.status(name),
            ok,
        )
        .await
    }

    /// Waits until a rollback of `name` has succeeded (`RolledBack=True`).
    pub async fn wait_rolled_back(&self, name: &str) -> OpenMedModelStatus {
        self.wait_status(name, "the rollback to succeed", |s| {
            s.phase == Some(Phase::RolledBack)
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == "RolledBack" && c.status == "True")
        })
        .await
    }

    /// The stored annotation `key` of model `name`, if set.
    pub async fn annotation(&self, name: &str, key: &str) -> Option<String> {
        self.models()
            .get(name)
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default()
            .remove(key)
    }

    /// The Deployment `svc` and its model, rolled out to v1 and then to v2
    /// (so both are retained); returns the two versions.
    pub async fn v1_then_v2(&self) -> (String, String) {
        let (v1, v2) = (self.version("v1"), self.version("v2"));
        self.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        self.apply(&model_yaml("svc", &v1, "")).await;
        self.wait_ready("svc", &v1).await;
        self.set_spec("svc", json!({"version": v2})).await;
        self.wait_ready("svc", &v2).await;
        (v1, v2)
    }

    /// Waits until a manual rollback of `name` to `version` has taken
    /// effect (`Ready` with reason `ManualRollback`).
    pub async fn wait_manual_rollback(&self, name: &str, version: &str) -> OpenMedModelStatus {
        self.wait_status(name, &format!("the manual rollback to {version}"), |s| {
            s.active_version.as_deref() == Some(version)
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.reason == "ManualRollback")
        })
        .await
    }

    pub async fn wait_ready(&self, name: &str, version: &str) -> OpenMedModelStatus {
        self.wait_status(name, &format!("phase Ready serving {version}"), |s| {
            s.phase == Some(Phase::Ready) && s.active_version.as_deref() == Some(version)
        })
        .await
    }

    pub async fn deployment(&self, name: &str) -> Value {
        serde_json::to_value(self.deployments().get(name).await.unwrap()).unwrap()
    }

    /// The events about `object`: (reason, note, occurrences), sorted.
    pub async fn events(&self, object: &str) -> Vec<(String, String, i32)> {
        let api: Api<KubeEvent> = Api::namespaced(self.client.clone(), &self.ns.name);
        let mut events: Vec<(String, String, i32)> = api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().is_some_and(|r| {
                    r.name.as_deref() == Some(object) && r.kind.as_deref() == Some("OpenMedModel")
                })
            })
            .map(|e| {
                (
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                    e.series.map_or(1, |s| s.count),
                )
            })
            .collect();
        events.sort();
        events
    }

    /// The events about `object`: (reason, occurrences), sorted.
    pub async fn event_reasons(&self, object: &str) -> Vec<(String, i32)> {
        self.events(object)
            .await
            .into_iter()
            .map(|(reason, _, count)| (reason, count))
            .collect()
    }

    pub async fn wait_event(&self, object: &str, reason: &str) {
        wait_until(
            &format!("event {reason} on {object}"),
            ROLLOUT,
            || self.event_reasons(object),
            |events| events.iter().any(|(r, _)| r == reason),
        )
        .await;
    }

    pub async fn set_spec(&self, name: &str, patch: Value) {
        self.models()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": patch })),
            )
            .await
            .unwrap();
    }

    /// Labels Deployment `name` `openmed.ai/managed=true`, the opt-in
    /// `--require-target-label` asks for.
    pub async fn opt_in(&self, name: &str) {
        self.deployments()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"openmed.ai/managed": "true"}}})),
            )
            .await
            .unwrap();
    }

    pub async fn annotate(&self, name: &str, key: &str, value: Option<&str>) {
        self.models()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
            )
            .await
            .unwrap();
    }

    /// Waits until the OpenMedModel `name` is gone (its finalizer done).
    pub async fn wait_model_gone(&self, name: &str, deadline: Duration) {
        wait_for(
            &format!("OpenMedModel {name} to be gone"),
            deadline,
            || async {
                self.models()
                    .get_opt(name)
                    .await
                    .unwrap()
                    .is_none()
                    .then_some(())
            },
        )
        .await;
    }
}

pub fn deployment_yaml(name: &str, container: &str, boot_version: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  labels: {{app: {name}}}
spec:
  replicas: 1
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      containers:
      - name: {container}
        image: openmed/openmed-service:1.0.0
        env:
        - name: OPENMED_SERVICE_PRELOAD_MODELS
          value: {boot_version}
"
    )
}

pub fn model_yaml(name: &str, version: &str, extra: &str) -> String {
    format!(
        "apiVersion: openmed.ai/v1alpha1
kind: OpenMedModel
metadata:
  name: {name}
spec:
  family: pii
  tier: Small
  version: {version}
  replicas: 2
{extra}"
    )
}
