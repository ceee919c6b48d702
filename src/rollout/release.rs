//! Letting go of Deployments: the ones a resource no longer targets, and,
//! on deletion, every one it claims, in the only safe order.
//!
//! A release empties the preload variable and the ownership marks, so the
//! Deployment's pods restart without a model. Deletion puts a canary's
//! weights back first and keeps the canary Deployment's model until no
//! request reaches it; the model ConfigMaps go only once no pod can read
//! them, and the finalizer after that.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::Value;

use super::conditions::{self, RECONCILING};
use super::{EventType, Plan, Step, Write, name_of, progress, reason, template_config_map};
use crate::api::names::{MANIFEST_HASH_ANNOTATION, PRELOAD_ENV};
use crate::plan::{self, DeploymentFields};

impl Step<'_> {
    /// Releases Deployments this resource no longer targets, before
    /// anything new is claimed. ConfigMaps they read are deleted later,
    /// by [`Step::tidy_config_maps`], once nothing reads them.
    pub(super) fn release_stale(&mut self, wanted: &Plan, canaries: &[String]) {
        for deployment in self.obs.claimed {
            let name = deployment.metadata.name.as_deref().unwrap_or_default();
            if name != wanted.deployment.name && !canaries.iter().any(|c| c == name) {
                self.release(deployment);
            }
        }
    }

    /// Empties the preload variable, resets the template hash to that of an
    /// empty manifest and drops the ownership marks of one Deployment.
    fn release(&mut self, deployment: &Deployment) {
        let r = self.obs.resource;
        let name = deployment.metadata.name.clone().unwrap_or_default();
        let observed = serde_json::to_value(deployment).expect("a Deployment serializes");
        let container = preload_container(&observed);
        let container_name = container.as_deref().unwrap_or_default();
        let served = self.served_after_release(&observed, container_name);
        let fields =
            DeploymentFields::released(&r.namespace, &name, container_name, &observed, served);
        let mut body = fields.apply_body();
        if container.is_none() {
            // No container carries our variable any more: release only the
            // annotations, or the apply would add a container with no image.
            if let Some(template) = body
                .pointer_mut("/spec/template")
                .and_then(Value::as_object_mut)
            {
                template.remove("spec");
            }
        }
        self.writes.push(Write::ApplyDeployment {
            name: name.clone(),
            body,
            release: true,
        });
        // The marks another field manager holds (the earlier operator's,
        // under our manager's name) go last: the ownership mark is what
        // makes the Deployment ours, so while a release is only half
        // written (its apply refused on a stale read, the Deployment
        // controller having written the status between the two) the
        // Deployment stays claimed and is released again. Taken back
        // first, a refused apply left a Deployment nobody claimed, still
        // preloading the model, and a deletion waiting on its pods forever.
        if let Some(patch) = fields.release_reset(&observed) {
            self.writes.push(Write::StrategicPatchDeployment {
                name: name.clone(),
                patch,
            });
        }
        self.event(
            EventType::Normal,
            reason::TARGET_RELEASED,
            format!("released Deployment {name}: its pods restart without a preloaded model"),
        );
    }

    /// Deletion, in the only safe order: release every claimed Deployment;
    /// once that has landed and the target's pods have all restarted
    /// without a model, delete the ConfigMaps; then the finalizer may go.
    pub(super) fn release_everything(&mut self) {
        // A canary's weights go back first: the route outlives the resource.
        // Its canary Deployment keeps its model until no request reaches it,
        // and the finalizer stays until then.
        let draining = self.end_canary_for_deletion();
        for deployment in self.obs.claimed {
            if deployment.metadata.name.is_some() && deployment.metadata.name == draining {
                continue;
            }
            self.release(deployment);
        }
        if let Some(canary) = draining {
            self.look_again(Duration::from_secs(2));
            let stuck = conditions::get(&self.status.conditions, RECONCILING)
                .is_some_and(|c| c.reason == reason::ROUTE_INVALID);
            if !stuck {
                self.condition(
                    RECONCILING,
                    true,
                    reason::DELETION_WAITING,
                    format!(
                        "deleting: Deployment {canary} keeps the canary's model until its weights are back on the route and no request reaches it"
                    ),
                );
            }
            return;
        }
        if !self.obs.claimed.is_empty() {
            return;
        }
        // Any ReplicaSet with pods, of this target or of one released
        // earlier, may start a pod that reads a snapshot.
        let mut waiting: Vec<String> = Vec::new();
        for cm in self.obs.config_maps.iter().filter(|cm| self.owns(cm)) {
            for u in self
                .obs
                .snapshot_uses
                .iter()
                .filter(|u| u.has_pods && u.reads(cm))
            {
                waiting.push(format!(
                    "ReplicaSet {} reads ConfigMap {}",
                    u.replica_set,
                    name_of(cm)
                ));
            }
        }
        if let Some(target) = self.obs.target.filter(|t| self.still_reading(t)) {
            let name = target.metadata.name.as_deref().unwrap_or_default();
            waiting.insert(
                0,
                format!("the pods of Deployment {name} restart without a model"),
            );
        }
        if !waiting.is_empty() {
            self.requeue_after = Some(Duration::from_secs(5));
            let shown = waiting.len().min(3);
            let more = match waiting.len() - shown {
                0 => String::new(),
                n => format!(" (and {n} more)"),
            };
            let message = format!(
                "deleting: the model ConfigMaps are deleted once nothing can read them; waiting until {}{more}",
                waiting[..shown].join(", ")
            );
            self.condition(RECONCILING, true, reason::DELETION_WAITING, message);
            return;
        }
        let owned: Vec<&ConfigMap> = self
            .obs
            .config_maps
            .iter()
            .copied()
            .filter(|cm| self.owns(cm))
            .collect();
        for cm in &owned {
            self.writes.push(Write::DeleteConfigMap {
                name: name_of(cm).to_owned(),
                uid: cm.metadata.uid.clone(),
            });
        }
        self.finished = owned.is_empty();
    }

    /// Whether pods of `target` may still read a ConfigMap of this
    /// resource: its template references one, or it was released and
    /// pods of the earlier template remain.
    fn still_reading(&self, target: &Deployment) -> bool {
        let observed = serde_json::to_value(target).expect("a Deployment serializes");
        let references = observed
            .pointer("/spec/template/spec/containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("name").and_then(Value::as_str))
            .filter_map(|c| template_config_map(&observed, c))
            .any(|name| {
                self.obs
                    .config_maps
                    .iter()
                    .any(|cm| self.owns(cm) && name_of(cm) == name)
            });
        let released = observed
            .pointer("/spec/template/metadata/annotations")
            .and_then(|a| a.get(MANIFEST_HASH_ANNOTATION))
            .and_then(Value::as_str)
            == Some(plan::released_manifest_hash().as_str());
        references || (released && !progress::settled(target))
    }
}

/// The container whose environment carries the preload variable from a ConfigMap.
fn preload_container(deployment: &Value) -> Option<String> {
    let containers = deployment
        .pointer("/spec/template/spec/containers")?
        .as_array()?;
    containers
        .iter()
        .find(|c| {
            c.get("env").and_then(Value::as_array).is_some_and(|env| {
                env.iter().any(|e| {
                    e.get("name").and_then(Value::as_str) == Some(PRELOAD_ENV)
                        && e.pointer("/valueFrom/configMapKeyRef").is_some()
                })
            })
        })
        .and_then(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
}
