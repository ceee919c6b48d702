//! The served set of each template the operator writes ([`plan::served`]):
//! filled in from the Deployment it goes to and the versions its pods serve
//! when it is written, or refused before any pod is replaced.

use k8s_openapi::api::apps::v1::Deployment;
use serde_json::Value;

use super::{MANIFEST_HASH_ANNOTATION, Step, reason, target_name};
use crate::api::names::{FIELD_MANAGER, MANIFEST_SNAPSHOT_LABEL, PRELOAD_ENV};
use crate::plan::{Plan, served};

impl Step<'_> {
    /// Sets `plan`'s served set for `target`, or says why it cannot be
    /// managed there (reason, message).
    ///
    /// A template that already preloads this manifest and lists no set
    /// keeps none: adopting a Deployment, or upgrading from an operator
    /// that did not write it, restarts no pod; the next version brings it.
    pub(super) fn serve(
        &self,
        plan: &mut Plan,
        target: &Deployment,
    ) -> Result<(), (&'static str, String)> {
        let observed = serde_json::to_value(target).expect("a Deployment serializes");
        let container = plan.deployment.container.clone();
        let Some(declared) = served::declared(&observed, &container) else {
            // No such container: the target check says so.
            return Ok(());
        };
        let version = plan.normalized.version.clone();
        let template_hash = observed
            .pointer("/spec/template/metadata/annotations")
            .and_then(|a| a.get(MANIFEST_HASH_ANNOTATION))
            .and_then(Value::as_str);
        if declared == served::Declared::Absent && template_hash == Some(&plan.manifest_hash) {
            return Ok(());
        }
        let name = target.metadata.name.clone().unwrap_or_default();
        if let Some(keeper) = served::kept_by(&observed, &container, FIELD_MANAGER) {
            // Another applier's value is the set; it must answer the
            // version this template preloads.
            let listed = match &declared {
                served::Declared::Listed(entries) => entries.clone(),
                _ => Vec::new(),
            };
            if served::is_served_name(&version) && !listed.contains(&version) {
                return Err((
                    reason::SERVED_SET_REFUSED,
                    format!(
                        "Deployment {name}: {} of container {container:?} is applied by {keeper} and does not list {version}: its pods would refuse every request naming it. Add {version} to it (and the version clients use now), or leave the variable out of what {keeper} applies: the operator then writes this model's versions and keeps the other entries",
                        crate::api::names::SERVED_ENV
                    ),
                ));
            }
            return Ok(());
        }
        // Only the retained versions, never a version the Deployment named
        // by hand before it was adopted: a rollback must write exactly the
        // template the version it restores had, so the Deployment
        // controller takes its own ReplicaSet back, and the status keeps
        // no such name.
        let recorded = served::recorded(&observed);
        let in_use = self.in_use(target, &version);
        let in_use: Vec<&str> = in_use.iter().map(String::as_str).collect();
        let model = served::entries_for(&version, &recorded, &in_use);
        // The entries an earlier write recorded as the model's are the
        // model's, even when the status no longer names them.
        let mut known = self.known_versions(&version);
        known.extend(recorded);
        let known: Vec<&str> = known.iter().map(String::as_str).collect();
        plan.deployment.served =
            served::value(&model, &declared, &known, &container).map_err(|refusal| {
                (
                    reason::SERVED_SET_REFUSED,
                    format!("Deployment {name}: {refusal}"),
                )
            })?;
        plan.deployment.served_versions = plan
            .deployment
            .served
            .as_ref()
            .filter(|_| !model.is_empty())
            .map(|_| model.join(","));
        Ok(())
    }

    /// What a released Deployment's served set keeps: the entries that are
    /// not this model's versions, when the operator holds the variable.
    pub(super) fn served_after_release(&self, observed: &Value, container: &str) -> Option<String> {
        if served::kept_by(observed, container, FIELD_MANAGER).is_some() {
            return None;
        }
        let served::Declared::Listed(entries) = served::declared(observed, container)? else {
            return None;
        };
        let known = self.known_versions("");
        let others: Vec<&str> = entries
            .iter()
            .map(String::as_str)
            .filter(|e| !known.iter().any(|k| k == e))
            .collect();
        (!others.is_empty()).then(|| others.join(","))
    }

    /// The versions clients may be using on `target` when a template is
    /// written for it: what its current template preloads once all its
    /// pods are available, what its ready pods preload and, on the stable
    /// Deployment, what every pod served when its last rollout completed
    /// (`activeVersion`, which a soaking version already is). When none is
    /// another version than `version` (a first rollout, the rollback of a
    /// version that never warmed), the first retained one that is: the
    /// template that version had.
    fn in_use(&self, target: &Deployment, version: &str) -> Vec<String> {
        let mut versions = Vec::new();
        if target.metadata.name.as_deref() == Some(target_name(self.obs.resource).as_str()) {
            versions.extend(self.old.active_version.clone());
        }
        versions.extend(self.template_version_served(target));
        versions.extend(self.ready_pod_versions(target));
        if versions.iter().all(|v| v == version) {
            let retained = self.retained_versions().into_iter().flatten();
            versions.extend(
                retained
                    .filter(|v| *v != version)
                    .take(1)
                    .map(str::to_owned),
            );
        }
        versions
    }

    /// The version `target`'s current template preloads, once the
    /// Deployment controller reports every pod of it available: served,
    /// whether or not a decision has judged that rollout yet. (In the
    /// middle of a rollout the Deployment's counts cannot say whether a
    /// new pod is available; its pods can.)
    fn template_version_served(&self, target: &Deployment) -> Option<String> {
        let status = target.status.as_ref()?;
        let current = status.observed_generation.is_some()
            && status.observed_generation == target.metadata.generation;
        let updated = status.updated_replicas.unwrap_or(0);
        let complete = updated > 0
            && Some(updated) == status.replicas
            && status.available_replicas.unwrap_or(0) >= updated;
        if !current || !complete {
            return None;
        }
        let short = target
            .spec
            .as_ref()?
            .template
            .metadata
            .as_ref()?
            .labels
            .as_ref()?
            .get(MANIFEST_SNAPSHOT_LABEL)?;
        self.snapshot_version(short)
    }

    /// The versions the ready pods of `target`'s ReplicaSets preload, by
    /// the snapshot each one's template reads (sorted, once each).
    fn ready_pod_versions(&self, target: &Deployment) -> Vec<String> {
        let Some(uid) = target.metadata.uid.as_deref() else {
            return Vec::new();
        };
        let replica_sets: Vec<&str> = self
            .obs
            .snapshot_uses
            .iter()
            .filter(|u| u.deployment.as_deref() == Some(uid))
            .map(|u| u.replica_set.as_str())
            .collect();
        let key = self.obs.resource.key();
        let mut versions: Vec<String> = self
            .obs
            .pods
            .iter()
            .filter(|p| p.serves() && !p.terminating && p.owner.as_deref() == Some(&key))
            .filter(|p| {
                p.replica_set
                    .as_deref()
                    .is_some_and(|rs| replica_sets.contains(&rs))
            })
            .filter_map(|p| self.snapshot_version(p.snapshot.as_deref()?))
            .collect();
        versions.sort();
        versions.dedup();
        versions
    }

    /// The version an owned snapshot of short hash `short` holds.
    fn snapshot_version(&self, short: &str) -> Option<String> {
        self.obs
            .config_maps
            .iter()
            .find(|cm| {
                self.owns(cm)
                    && cm
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(MANIFEST_SNAPSHOT_LABEL))
                        .is_some_and(|s| s == short)
            })
            .and_then(|cm| cm.data.as_ref()?.get(PRELOAD_ENV).cloned())
    }

    /// The retained versions, the last successful one first.
    fn retained_versions(&self) -> [Option<&str>; 2] {
        [
            self.status.last_successful_spec.as_ref(),
            self.status.previous_successful_spec.as_ref(),
        ]
        .map(|s| s.map(|s| s.version.as_str()))
    }

    /// Every version of this model the status knows, and `version`: the
    /// entries of a served set that are the model's own.
    fn known_versions(&self, version: &str) -> Vec<String> {
        let s = &self.status;
        let mut known: Vec<String> = s
            .known_specs()
            .map(|spec| spec.version.clone())
            .chain(s.desired_version.clone())
            .chain(s.active_version.clone())
            .chain(self.obs.resource.spec_version())
            .collect();
        if !version.is_empty() {
            known.push(version.to_owned());
        }
        known
    }
}
