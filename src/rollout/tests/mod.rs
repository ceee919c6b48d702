//! Every branch of `decide`, driven through a small simulated world with a
//! fixed clock: the operator shell's loop, a server-side apply of the owned
//! fields, and a Deployment controller moved by hand.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::{Value, json};

use super::*;
use crate::api::names::{
    FIELD_MANAGER, MANIFEST_HASH_ANNOTATION, MANIFEST_SNAPSHOT_LABEL, OPERATED_BY_LABEL,
    REPLICAS_HANDOVER_FIELD_MANAGER,
};

mod autoscaling;
mod canary;
mod model;
mod served;
mod soak;
mod together;

const UID: &str = "uid-1";

fn at(second: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + second).unwrap())
}

/// A namespace with one OpenMedModel, its Deployment and ConfigMaps.
struct World {
    resource: ResourceView,
    deployment: Option<Value>,
    other_deployments: Vec<Value>,
    /// The canary Deployment, when the test has one.
    canary: Option<Value>,
    /// The HTTPRoute, when the test has one.
    route: Option<Value>,
    /// More HTTPRoutes in the namespace.
    other_routes: Vec<Value>,
    /// What the shell measured before the next decision.
    measurements: Vec<analysis::Measurement>,
    /// The probe rounds the shell carried out before the next decision;
    /// the shell drops them once a decision made on them is carried out.
    probes: Vec<quality::ProbeRound>,
    config_maps: Vec<ConfigMap>,
    /// Snapshots that ReplicaSets reference.
    replica_sets: Vec<SnapshotUse>,
    /// Pods with the snapshot label, as the kubelet reports them.
    pods: Vec<crate::rollout::pods::PodView>,
    rivals: Vec<Rival>,
    /// The autoscalers in the namespace, the operator's own among them.
    autoscalers: Vec<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler>,
    /// The ScaledObject of the resource's name, when there is one.
    scaled_object: Option<Value>,
    settings: Settings,
    now: i64,
    /// How far the API server's and controller's clock runs ahead of the
    /// operator's, in seconds.
    server_ahead: i64,
    events: Vec<Event>,
    writes: Vec<Write>,
    /// Every write carried out with the world as it was just before it,
    /// when a test keeps one (the model-based test judges each write).
    journal: Option<Vec<Journaled>>,
}

/// A write and the world it was carried out in.
#[derive(Debug, Clone)]
struct Journaled {
    write: Write,
    /// The resource's spec and status (the decision's, which the shell
    /// writes before the writes) at the time.
    spec: Value,
    status: OpenMedModelStatus,
    /// The stable and canary Deployments and the route just before the
    /// write.
    stable: Option<Value>,
    canary: Option<Value>,
    route: Option<Value>,
}

fn spec(version: &str) -> Value {
    json!({"family": "pii", "tier": "Small", "version": version, "replicas": 2})
}

fn deployment(name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "generation": 1, "labels": {"app": name}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "openmed-service", "image": "openmed",
                                         "env": [{"name": "OPENMED_SERVICE_PRELOAD_MODELS", "value": "boot"}]}]},
            },
        },
        "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2},
    })
}

impl World {
    fn new(spec: Value) -> Self {
        World {
            resource: ResourceView {
                namespace: "ns".into(),
                name: "svc".into(),
                uid: UID.into(),
                generation: 1,
                created: Some(at(0)),
                annotations: BTreeMap::new(),
                deleting: false,
                spec,
                status: Default::default(),
            },
            deployment: Some(deployment("svc")),
            other_deployments: Vec::new(),
            canary: None,
            route: None,
            other_routes: Vec::new(),
            measurements: Vec::new(),
            probes: Vec::new(),
            config_maps: Vec::new(),
            replica_sets: Vec::new(),
            pods: Vec::new(),
            rivals: Vec::new(),
            autoscalers: Vec::new(),
            scaled_object: None,
            settings: Settings::default(),
            now: 100,
            server_ahead: 0,
            events: Vec::new(),
            writes: Vec::new(),
            journal: None,
        }
    }

    fn typed(value: &Value) -> Deployment {
        serde_json::from_value(value.clone()).unwrap()
    }

    fn decide(&self) -> Decision {
        self.observing(decide)
    }

    /// What `core` makes of the world as the shell would observe it.
    fn observing<T>(&self, core: impl FnOnce(&Observed) -> T) -> T {
        let all: Vec<Deployment> = self
            .deployment
            .iter()
            .chain(&self.other_deployments)
            .chain(&self.canary)
            .map(Self::typed)
            .collect();
        let key = self.resource.key();
        let claimed: Vec<&Deployment> = all
            .iter()
            .filter(|d| {
                d.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(MODEL_RESOURCE_ANNOTATION))
                    == Some(&key)
            })
            .collect();
        let name = target_name(&self.resource);
        let target = all
            .iter()
            .find(|t| t.metadata.name.as_deref() == Some(&name));
        let cms: Vec<&ConfigMap> = self.config_maps.iter().collect();
        // As the shell reads them: by the names the resource gives.
        let canary_name = canary_target_name(&self.resource);
        let canary_target = all
            .iter()
            .find(|d| d.metadata.name.is_some() && d.metadata.name == canary_name);
        // What the shell reads: nothing at rest.
        let route_name = route_to_read(&self.resource);
        let route = self
            .route
            .iter()
            .chain(&self.other_routes)
            .find(|r| r["metadata"]["name"].as_str() == route_name.as_deref());
        // As the shell reads them.
        let autoscalers: Vec<_> = self
            .autoscalers
            .iter()
            .filter(|h| crate::rollout::autoscaling::concerns(h, &self.resource.id(), &name))
            .collect();
        core(&Observed {
            resource: &self.resource,
            target,
            canary_target,
            route,
            measurements: &self.measurements,
            probes: &self.probes,
            autoscalers: &autoscalers,
            scaled_object: self.scaled_object.as_ref(),
            rivals: &self.rivals,
            claimed: &claimed,
            config_maps: &cms,
            snapshot_uses: &self.replica_sets,
            pods: &self.pods,
            settings: self.settings.clone(),
            now: at(self.now),
        })
    }

    /// The operator shell's loop: status first, then events and writes,
    /// then decide again until nothing is left to write.
    fn reconcile(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        self.writes.clear();
        for _ in 0..5 {
            let d = self.decide();
            // The shell reads live every name `config_map_names` gives
            // before it lets a decision write; a ConfigMap written under
            // another name would be judged on a cache that may lag.
            let read_live = config_map_names(&self.resource);
            for w in &d.writes {
                if let Write::ApplyConfigMap(cm) = w {
                    let name = cm.metadata.name.clone().unwrap();
                    assert!(
                        read_live.contains(&name),
                        "{name} is written but not read live: {read_live:?}"
                    );
                }
            }
            if d.writes.is_empty() {
                self.assert_at_rest_means_timeless(&d);
            }
            self.resource.status = d.status;
            events.extend(d.events);
            if d.writes.is_empty() {
                self.events.extend(events.clone());
                return events;
            }
            for w in d.writes {
                self.execute(&w);
                self.writes.push(w);
            }
            self.probes.clear();
        }
        panic!("decide kept asking for writes");
    }

    /// The operator skips the resyncs of a resource at rest
    /// (`operator::settled`): a decision that writes nothing, changes no
    /// status, says nothing and asks for no timer is taken to stay the
    /// same until its inputs change. So time alone must not change it: a
    /// rule that reads the clock asks to be looked at again instead.
    fn assert_at_rest_means_timeless(&mut self, d: &Decision) {
        let at_rest = d.writes.is_empty()
            && d.status == self.resource.status
            && d.events.is_empty()
            && d.requeue_after.is_none()
            && self.measurements.is_empty()
            && self.probes.is_empty();
        if !at_rest {
            return;
        }
        let now = self.now;
        for later in [1, 61, 601, 86_400] {
            self.now = now + later;
            let again = self.decide();
            assert!(
                again.writes.is_empty()
                    && again.status == self.resource.status
                    && again.events.is_empty(),
                "a decision at rest changed {later} s later with no timer set: \
                 writes {:?}, events {:?}, status {:#?} then {:#?}",
                again.writes,
                again.events,
                self.resource.status,
                again.status
            );
        }
        self.now = now;
    }

    fn execute(&mut self, write: &Write) {
        if let Some(journal) = self.journal.as_mut() {
            journal.push(Journaled {
                write: write.clone(),
                spec: self.resource.spec.clone(),
                status: self.resource.status.clone(),
                stable: self.deployment.clone(),
                canary: self.canary.clone(),
                route: self.route.clone(),
            });
        }
        match write {
            Write::ApplyConfigMap(cm) => {
                if let Some(old) = self
                    .config_maps
                    .iter()
                    .find(|c| c.metadata.name == cm.metadata.name)
                {
                    assert!(
                        old.immutable != Some(true) || old.data == cm.data,
                        "the API server refuses to change an immutable ConfigMap's data"
                    );
                }
                self.config_maps
                    .retain(|c| c.metadata.name != cm.metadata.name);
                let mut cm = (**cm).clone();
                cm.metadata.uid = Some(format!("cm-{}", cm.metadata.name.as_deref().unwrap()));
                self.config_maps.push(cm);
            }
            Write::DeleteConfigMap { name, .. } => {
                self.config_maps
                    .retain(|c| c.metadata.name.as_deref() != Some(name));
            }
            Write::ApplyAutoscaler(hpa) => {
                self.autoscalers
                    .retain(|h| h.metadata.name != hpa.metadata.name);
                let mut hpa = (**hpa).clone();
                hpa.metadata.uid = Some(format!("hpa-{}", hpa.metadata.name.as_deref().unwrap()));
                self.autoscalers.push(hpa);
            }
            Write::DeleteAutoscaler { name, .. } => {
                self.autoscalers
                    .retain(|h| h.metadata.name.as_deref() != Some(name));
            }
            Write::ApplyScaledObject(object) => {
                let mut object = (**object).clone();
                object["metadata"]["uid"] = json!("so-1");
                self.scaled_object = Some(object);
            }
            Write::DeleteScaledObject { .. } => {
                self.scaled_object = None;
            }
            Write::MergePatchDeployment { name, patch } => {
                let target = self
                    .deployment
                    .as_mut()
                    .filter(|d| d["metadata"]["name"] == json!(name))
                    .unwrap();
                target["spec"]["strategy"] = patch["spec"]["strategy"].clone();
                target["spec"]["strategy"]
                    .as_object_mut()
                    .unwrap()
                    .remove("rollingUpdate");
            }
            Write::StrategicPatchDeployment { name, patch } => {
                let target = self
                    .deployment
                    .iter_mut()
                    .chain(self.canary.iter_mut())
                    .chain(self.other_deployments.iter_mut())
                    .find(|d| d["metadata"]["name"] == json!(name))
                    .expect("a patch of an existing Deployment");
                // The marks the patch takes back, as the API server's
                // strategic merge would.
                if patch.pointer("/metadata/annotations").is_some()
                    && let Some(a) = target["metadata"]["annotations"].as_object_mut()
                {
                    a.remove(MODEL_RESOURCE_ANNOTATION);
                }
                if patch.pointer("/spec/template/metadata").is_some()
                    && let Some(a) =
                        target["spec"]["template"]["metadata"]["annotations"].as_object_mut()
                {
                    a.remove(MODEL_RESOURCE_ANNOTATION);
                }
                if let Some(c) = patch.pointer("/spec/template/spec/containers/0/name") {
                    for container in target["spec"]["template"]["spec"]["containers"]
                        .as_array_mut()
                        .unwrap()
                        .iter_mut()
                        .filter(|x| &x["name"] == c)
                    {
                        for e in container["env"].as_array_mut().unwrap() {
                            if e["name"] == json!(PRELOAD_ENV)
                                && let Some(e) = e.as_object_mut()
                            {
                                e.remove("valueFrom");
                            }
                        }
                    }
                }
            }
            Write::PatchRoute { name, patch } => {
                let route = self
                    .route
                    .iter_mut()
                    .chain(self.other_routes.iter_mut())
                    .find(|r| r["metadata"]["name"] == json!(name))
                    .expect("a patch of an existing HTTPRoute");
                let patch: json_patch::Patch = serde_json::from_value(patch.clone()).unwrap();
                json_patch::patch(route, &patch).expect("the API server accepts the patch");
                let generation = route["metadata"]["generation"].as_i64().unwrap_or(1);
                route["metadata"]["generation"] = json!(generation + 1);
            }
            Write::HandOverReplicas { name, replicas } => {
                let target = std::iter::once(&mut self.deployment)
                    .flatten()
                    .chain(self.canary.iter_mut())
                    .chain(self.other_deployments.iter_mut())
                    .find(|d| d["metadata"]["name"] == json!(name))
                    .expect("a hand-over on an existing Deployment");
                hand_over_replicas(target, *replicas);
            }
            Write::MarkPod {
                name,
                passed,
                message,
                ..
            } => {
                let pod = self
                    .pods
                    .iter_mut()
                    .find(|p| &p.name == name)
                    .expect("a mark on an existing pod");
                pod.quality = Some(crate::rollout::pods::QualityMark {
                    passed: *passed,
                    message: message.clone(),
                });
            }
            Write::ApplyDeployment { name, body, .. } => {
                let landed = json!(at(self.now + self.server_ahead));
                let target = std::iter::once(&mut self.deployment)
                    .flatten()
                    .chain(self.canary.iter_mut())
                    .chain(self.other_deployments.iter_mut())
                    .find(|d| d["metadata"]["name"] == json!(name))
                    .expect("apply on an existing Deployment");
                server_side_apply(target, body, landed);
            }
        }
    }

    fn status(&self) -> &OpenMedModelStatus {
        &self.resource.status
    }

    fn condition(&self, type_: &str) -> (String, String) {
        let c = conditions::get(&self.status().conditions, type_)
            .unwrap_or_else(|| panic!("no {type_} condition"));
        (c.status.clone(), c.reason.clone())
    }

    fn dep(&mut self) -> &mut Value {
        self.deployment.as_mut().unwrap()
    }

    fn preload(&self) -> Value {
        self.deployment.as_ref().unwrap()["spec"]["template"]["spec"]["containers"][0]["env"][0]
            .clone()
    }

    fn template_hash(&self) -> Value {
        self.deployment.as_ref().unwrap()["spec"]["template"]["metadata"]["annotations"]
            [MANIFEST_HASH_ANNOTATION]
            .clone()
    }

    /// The version a pod of the current template loads: what the
    /// ConfigMap its variable references holds.
    fn cm_version(&self) -> String {
        let name = self.preload()["valueFrom"]["configMapKeyRef"]["name"].clone();
        self.version_in(name.as_str().expect("the template reads a ConfigMap"))
            .expect("the ConfigMap the template reads exists")
    }

    /// What a ConfigMap of this name holds, if it exists.
    fn version_in(&self, name: &str) -> Option<String> {
        let cm = self
            .config_maps
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))?;
        Some(cm.data.as_ref().unwrap()["OPENMED_SERVICE_PRELOAD_MODELS"].clone())
    }

    /// The pointer ConfigMap's version.
    fn pointer_version(&self) -> Option<String> {
        self.version_in("svc-model-manifest")
    }

    fn config_map_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .config_maps
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect();
        names.sort();
        names
    }

    /// The Deployment controller rolls every pod to the current template.
    fn pods_ready(&mut self) {
        let d = self.dep();
        let want = d["spec"]["replicas"].clone();
        d["status"] = json!({
            "observedGeneration": d["metadata"]["generation"], "replicas": want, "updatedReplicas": want,
            "readyReplicas": want, "availableReplicas": want,
            "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
                           {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}],
        });
    }

    /// The new pods never get ready; the deadline passes at `now` (the
    /// controller's clock).
    fn deadline_exceeded(&mut self) {
        let now = json!(at(self.now + self.server_ahead));
        let d = self.dep();
        d["status"] = json!({
            "observedGeneration": d["metadata"]["generation"], "replicas": 3, "updatedReplicas": 1,
            "readyReplicas": 2, "availableReplicas": 2, "unavailableReplicas": 1,
            "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                            "message": "ReplicaSet \"svc-abc\" has timed out progressing.",
                            "lastUpdateTime": now, "lastTransitionTime": now}],
        });
    }

    /// Makes the template read the pointer, as templates written before
    /// snapshots (by the earlier operator, or an earlier openmed-op) do.
    fn template_reads_the_pointer(&mut self) {
        let pointer = json!({"name": "OPENMED_SERVICE_PRELOAD_MODELS",
            "valueFrom": {"configMapKeyRef": {"name": "svc-model-manifest", "key": "OPENMED_SERVICE_PRELOAD_MODELS"}}});
        self.dep()["spec"]["template"]["spec"]["containers"][0]["env"] = json!([pointer]);
        self.dep()["spec"]["template"]["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove(MANIFEST_SNAPSHOT_LABEL);
    }

    /// Another writer's HorizontalPodAutoscaler now scales the target.
    fn another_autoscaler(&mut self) {
        let mut theirs = crate::plan::autoscaler::autoscaler(
            &self.resource.id(),
            &target_name(&self.resource),
            &crate::api::Autoscaling::default(),
        );
        theirs.metadata.name = Some("theirs".into());
        theirs.metadata.annotations = None;
        theirs.metadata.owner_references = None;
        self.autoscalers.push(theirs);
    }

    fn set_version(&mut self, version: &str) {
        self.resource.spec["version"] = json!(version);
        self.resource.generation += 1;
    }

    fn set_spec(&mut self, spec: Value) {
        self.resource.spec = spec;
        self.resource.generation += 1;
    }

    fn annotate_rollback(&mut self, version: Option<&str>) {
        match version {
            Some(v) => self
                .resource
                .annotations
                .insert(ROLLBACK_TO_ANNOTATION.into(), v.into()),
            None => self.resource.annotations.remove(ROLLBACK_TO_ANNOTATION),
        };
    }

    /// Rolls out `version` and lets it succeed.
    fn ready_at(version: &str) -> Self {
        let mut w = World::new(spec(version));
        w.reconcile();
        w.pods_ready();
        w.now += 10;
        w.reconcile();
        assert_eq!(w.status().phase, Some(Phase::Ready));
        w
    }

    fn upgrade(&mut self, version: &str) {
        self.set_version(version);
        self.now += 10;
        self.reconcile();
        self.pods_ready();
        self.now += 10;
        self.reconcile();
        assert_eq!(self.status().phase, Some(Phase::Ready));
    }

    /// The current template's snapshot label.
    fn template_snapshot(&mut self) -> Option<String> {
        self.dep()["spec"]["template"]["metadata"]["labels"][MANIFEST_SNAPSHOT_LABEL]
            .as_str()
            .map(str::to_owned)
    }

    /// The Deployment controller sees the current generation and starts
    /// rolling its template: the ReplicaSet it made for that template (a
    /// template it had before keeps its ReplicaSet and gets the next
    /// revision, as the controller does), one new pod on it. Its name.
    fn controller_rolls(&mut self) -> String {
        let snapshot = self.template_snapshot();
        let template = self.dep()["spec"]["template"].clone();
        let template_key = template.to_string();
        let next = self
            .replica_sets
            .iter()
            .filter_map(|u| u.revision.as_deref()?.parse::<i64>().ok())
            .max()
            .unwrap_or(0)
            + 1;
        let d = self.dep();
        let current = d["metadata"]["annotations"][pods::REVISION_ANNOTATION].clone();
        let uid = d["metadata"]["uid"].as_str().unwrap().to_owned();
        let name = format!("svc-{:x}", {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            template_key.hash(&mut h);
            h.finish() & 0xfffff
        });
        let existing = self.replica_sets.iter().position(|u| u.replica_set == name);
        // The template of the current revision keeps it; any other
        // template, new or seen before, gets the next one.
        let revision = match existing.and_then(|i| self.replica_sets[i].revision.clone()) {
            Some(r) if current.as_str() == Some(r.as_str()) => r,
            _ => next.to_string(),
        };
        let config_map = template["spec"]["containers"][0]["env"][0]
            .pointer("/valueFrom/configMapKeyRef/name")
            .and_then(Value::as_str)
            .map(str::to_owned);
        self.replica_sets.retain(|u| u.replica_set != name);
        if let Some(short) = snapshot {
            self.replica_sets.push(SnapshotUse {
                short,
                config_map,
                replica_set: name.clone(),
                has_pods: true,
                deployment: Some(uid),
                revision: Some(revision.clone()),
            });
        }
        let d = self.dep();
        if !d["metadata"]["annotations"].is_object() {
            d["metadata"]["annotations"] = json!({});
        }
        d["metadata"]["annotations"][pods::REVISION_ANNOTATION] = json!(revision);
        d["status"] = json!({
            "observedGeneration": d["metadata"]["generation"], "replicas": 3, "updatedReplicas": 1,
            "readyReplicas": 2, "availableReplicas": 2, "unavailableReplicas": 1,
            "conditions": [{"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}],
        });
        name
    }

    /// A pod of the ReplicaSet the Deployment controller made for the
    /// current template, created now, whose container `openmed-service`
    /// restarted `restarts` times, last exiting 3 with `message`.
    fn crashing_pod(&mut self, name: &str, restarts: i32, message: &str) {
        let replica_set = self.controller_rolls();
        let created = self.now + self.server_ahead;
        self.crashing_pod_of(name, &replica_set, created, restarts, message);
    }

    /// A pod of `replica_set` created at `created` (the server's clock),
    /// whose container `openmed-service` restarted `restarts` times, last
    /// exiting 3 with `message`.
    fn crashing_pod_of(
        &mut self,
        name: &str,
        replica_set: &str,
        created: i64,
        restarts: i32,
        message: &str,
    ) {
        let snapshot = self.template_snapshot();
        let namespace = self.resource.namespace.clone();
        self.pods.retain(|p| p.name != name);
        self.pods.push(crate::rollout::pods::PodView {
            owner: Some(format!("{namespace}/svc")),
            namespace,
            name: name.into(),
            snapshot,
            replica_set: Some(replica_set.into()),
            created: Some(at(created).0.as_second()),
            containers: vec![crate::rollout::pods::ContainerView {
                name: "openmed-service".into(),
                restarts,
                last_exit: Some((3, "Error".into(), message.into())),
                ..Default::default()
            }],
            ..Default::default()
        });
    }

    /// A gated pod of the ReplicaSet the Deployment controller made for the
    /// current template, created now, its model warm.
    fn gated_pod(&mut self, name: &str) -> &mut crate::rollout::pods::PodView {
        let replica_set = self.controller_rolls();
        let snapshot = self.template_snapshot();
        let namespace = self.resource.namespace.clone();
        self.pods.retain(|p| p.name != name);
        let ip = Some(format!("10.0.0.{}", self.pods.len() + 1));
        self.pods.push(crate::rollout::pods::PodView {
            owner: Some(format!("{namespace}/svc")),
            namespace,
            name: name.into(),
            snapshot,
            replica_set: Some(replica_set),
            created: Some(at(self.now + self.server_ahead).0.as_second()),
            ip,
            containers_ready: true,
            gated: true,
            ..Default::default()
        });
        self.pods.last_mut().expect("just pushed")
    }

    /// A pod of the current template that the quality gate judged.
    fn judged_pod(&mut self, name: &str, passed: bool, message: &str) {
        let pod = self.gated_pod(name);
        pod.ip = None;
        pod.quality = Some(crate::rollout::pods::QualityMark {
            passed,
            message: message.into(),
        });
    }

    /// A gated pod of the current template whose model is warm: the
    /// quality gate is to judge it.
    fn warm_pod(&mut self, name: &str) {
        self.gated_pod(name);
    }

    /// The probe rounds the core plans now, as the shell would get them.
    fn probe_plan(&self) -> Vec<quality::RoundPlan> {
        self.observing(quality::probe_plan)
    }

    /// Rolls out `version`, which never gets ready.
    fn fail_rollout(&mut self, version: &str) -> Vec<Event> {
        self.set_version(version);
        self.now += 10;
        self.reconcile();
        self.now += 600;
        self.deadline_exceeded();
        self.reconcile()
    }
}

/// Just enough server-side apply for the bodies `plan` builds: fields in the
/// body are set, list items merge by name, an empty `value` is stored as
/// absent, and owned marks missing from the body are removed.
fn server_side_apply(target: &mut Value, body: &Value, landed: Value) {
    let before = target.clone();
    let meta = &mut target["metadata"];
    for key in ["annotations", "labels"] {
        let owned = if key == "annotations" {
            MODEL_RESOURCE_ANNOTATION
        } else {
            OPERATED_BY_LABEL
        };
        match body["metadata"].get(key) {
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    meta[key][k] = v.clone();
                }
            }
            // A field the apply leaves out goes only when no other field
            // list holds it as well.
            _ if !crate::plan::held_by_another(
                &before,
                &["f:metadata", &format!("f:{key}"), &format!("f:{owned}")],
            ) =>
            {
                if let Some(m) = meta.get_mut(key).and_then(Value::as_object_mut) {
                    m.remove(owned);
                }
            }
            _ => {}
        }
    }
    let spec = &body["spec"];
    for key in ["replicas", "progressDeadlineSeconds", "strategy"] {
        if let Some(v) = spec.get(key) {
            target["spec"][key] = v.clone();
        }
    }
    // A field its only manager stops applying is removed, and the API
    // server defaults `replicas` to 1.
    let owns_replicas = |entry: &Value| entry.pointer("/fieldsV1/f:spec/f:replicas").is_some();
    let entries = before["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ours = |entry: &Value| entry["manager"] == json!(FIELD_MANAGER);
    let owned_by_us = entries.iter().any(|e| ours(e) && owns_replicas(e));
    let owned_by_others = entries.iter().any(|e| !ours(e) && owns_replicas(e));
    if spec.get("replicas").is_none() && owned_by_us && !owned_by_others {
        target["spec"]["replicas"] = json!(1);
    }
    let annotations = &spec["template"]["metadata"]["annotations"];
    let live = &mut target["spec"]["template"]["metadata"]["annotations"];
    if !live.is_object() {
        *live = json!({});
    }
    for (k, v) in annotations.as_object().unwrap() {
        live[k] = v.clone();
    }
    if annotations.get(MODEL_RESOURCE_ANNOTATION).is_none() {
        live.as_object_mut()
            .unwrap()
            .remove(MODEL_RESOURCE_ANNOTATION);
    }
    let labels = &mut target["spec"]["template"]["metadata"]["labels"];
    match spec.pointer(&format!(
        "/template/metadata/labels/{}",
        MANIFEST_SNAPSHOT_LABEL.replace('/', "~1")
    )) {
        Some(short) => labels[MANIFEST_SNAPSHOT_LABEL] = short.clone(),
        None => {
            labels
                .as_object_mut()
                .unwrap()
                .remove(MANIFEST_SNAPSHOT_LABEL);
        }
    }
    // readinessGates is an atomic list: the applier's whole list, or none.
    match spec.pointer("/template/spec/readinessGates") {
        Some(gates) => target["spec"]["template"]["spec"]["readinessGates"] = gates.clone(),
        None => {
            if let Some(pod) = target["spec"]["template"]["spec"].as_object_mut() {
                pod.remove("readinessGates");
            }
        }
    }
    for container in spec
        .pointer("/template/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let containers = target["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap();
        let live = containers
            .iter_mut()
            .find(|c| c["name"] == container["name"])
            .expect("container exists");
        for entry in container["env"].as_array().unwrap() {
            let mut stored = entry.clone();
            if stored["value"] == json!("") {
                stored.as_object_mut().unwrap().remove("value");
            }
            let env = live["env"].as_array_mut().unwrap();
            match env.iter_mut().find(|e| e["name"] == entry["name"]) {
                Some(e) => *e = stored,
                None => env.push(stored),
            }
        }
    }
    if target["spec"] != before["spec"] {
        let generation = target["metadata"]["generation"].as_i64().unwrap();
        target["metadata"]["generation"] = json!(generation + 1);
    }
    // The API server stamps the manager's entry when its fields change,
    // and keeps every other manager's.
    let time = if *target != before {
        landed
    } else {
        entries
            .iter()
            .find(|e| ours(e))
            .map_or(landed, |e| e["time"].clone())
    };
    let fields = if spec.get("replicas").is_some() {
        json!({"f:spec": {"f:replicas": {}}})
    } else {
        json!({"f:spec": {}})
    };
    let mut managed: Vec<Value> = entries.into_iter().filter(|e| !ours(e)).collect();
    managed.push(json!({
        "manager": FIELD_MANAGER, "operation": "Apply", "apiVersion": "apps/v1", "time": time,
        "fieldsV1": fields,
    }));
    target["metadata"]["managedFields"] = json!(managed);
}

/// A server-side apply of only `replicas` by another manager, without
/// force: a shared owner when the value is the same, a conflict otherwise.
fn hand_over_replicas(target: &mut Value, replicas: i32) -> bool {
    if target["spec"]["replicas"] != json!(replicas) {
        return false;
    }
    let entries = target["metadata"]["managedFields"]
        .as_array_mut()
        .expect("an applied Deployment has managed fields");
    entries.retain(|e| e["manager"] != json!(REPLICAS_HANDOVER_FIELD_MANAGER));
    entries.push(json!({
        "manager": REPLICAS_HANDOVER_FIELD_MANAGER, "operation": "Apply", "apiVersion": "apps/v1",
        "fieldsV1": {"f:spec": {"f:replicas": {}}},
    }));
    true
}

fn reasons(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.reason).collect()
}

// ---- rollout ----

#[test]
fn a_new_resource_rolls_out_its_version() {
    let mut w = World::new(spec("v1"));
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::ROLLOUT_STARTED]);
    assert!(
        matches!(&w.writes[0], Write::ApplyConfigMap(cm) if cm.immutable == Some(true)),
        "the snapshot first: no pod ever references a ConfigMap that does not exist"
    );
    assert!(matches!(
        w.writes[1],
        Write::ApplyDeployment { release: false, .. }
    ));
    // Only the snapshot may go out alongside the intent; the Deployment
    // that names it waits for the intent to be stored.
    let alongside: Vec<bool> = w.writes.iter().map(Write::unread_until_named).collect();
    assert_eq!(alongside, [true, false]);
    let s = w.status();
    assert_eq!(s.phase, Some(Phase::RollingOut));
    assert_eq!(s.desired_version.as_deref(), Some("v1"));
    assert_eq!(s.applied_spec_hash, s.desired_spec_hash);
    assert!(s.manifest_hash.is_some());
    assert_eq!(
        s.target_deployment_generation,
        Some(2),
        "the generation our write produced"
    );
    assert_eq!(s.last_rollout_time, Some(at(100)));
    assert_eq!(s.observed_generation, Some(1));
    assert_eq!(w.condition(READY), ("False".into(), "RollingOut".into()));
    assert_eq!(
        w.condition(PROGRESSING),
        ("True".into(), "RollingOut".into())
    );
    assert_eq!(w.condition(RECONCILING).0, "True");
    let short = s.manifest_hash.as_deref().unwrap()[7..17].to_owned();
    assert_eq!(
        w.preload()["valueFrom"]["configMapKeyRef"]["name"],
        format!("svc-model-manifest-{short}")
    );
    assert_eq!(
        w.dep()["spec"]["template"]["metadata"]["labels"][MANIFEST_SNAPSHOT_LABEL],
        json!(short),
        "ReplicaSets of this template carry the snapshot they read"
    );
    assert!(w.preload().get("value").is_none());
    assert_eq!(w.cm_version(), "v1");
    assert_eq!(
        w.pointer_version(),
        None,
        "the pointer follows once the pods have rolled"
    );
    w.pods_ready();
    w.reconcile();
    assert_eq!(w.pointer_version().as_deref(), Some("v1"));
}

#[test]
fn success_needs_every_pod_updated_ready_and_available() {
    let mut w = World::new(spec("v1"));
    w.reconcile();
    // The controller has seen our generation but old pods remain.
    let generation = w.dep()["metadata"]["generation"].clone();
    w.dep()["status"] = json!({"observedGeneration": generation, "replicas": 3, "updatedReplicas": 2,
                               "readyReplicas": 3, "availableReplicas": 3});
    assert!(w.reconcile().is_empty());
    assert_eq!(w.status().phase, Some(Phase::RollingOut));
    w.pods_ready();
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::ROLLOUT_SUCCEEDED]);
    let s = w.status();
    assert_eq!(s.phase, Some(Phase::Ready));
    assert_eq!(s.active_version.as_deref(), Some("v1"));
    assert_eq!(s.last_successful_spec.as_ref().unwrap().version, "v1");
    assert_eq!(s.previous_successful_spec, None);
    assert_eq!(
        w.condition(READY),
        ("True".into(), "RolloutSucceeded".into())
    );
    assert_eq!(w.condition(PROGRESSING).0, "False");
    assert_eq!(w.condition(DEGRADED).0, "False");
    assert_eq!(w.condition(RECONCILING).0, "False");
    assert_eq!(w.condition(STALLED).0, "False");
}

#[test]
fn an_unobserved_generation_is_never_judged() {
    let mut w = World::new(spec("v1"));
    w.reconcile();
    // Counts look complete, but for the previous generation.
    w.dep()["status"]["observedGeneration"] = json!(1);
    assert!(w.reconcile().is_empty());
    assert_eq!(w.status().phase, Some(Phase::RollingOut));
}

#[test]
fn a_steady_state_writes_nothing_and_keeps_status_identical() {
    let mut w = World::ready_at("v1");
    let before = w.status().clone();
    w.now += 3600;
    let d = w.decide();
    assert!(d.writes.is_empty());
    assert!(d.events.is_empty());
    assert_eq!(d.status, before, "no fresh timestamps on a no-op pass");
}

#[test]
fn an_upgrade_keeps_the_previous_successful_spec() {
    let mut w = World::ready_at("v1");
    let events = {
        w.set_version("v2");
        w.reconcile()
    };
    assert_eq!(events[0].message, "rolling out v2 (serving v1)");
    w.pods_ready();
    w.reconcile();
    let s = w.status();
    assert_eq!(s.last_successful_spec.as_ref().unwrap().version, "v2");
    assert_eq!(s.previous_successful_spec.as_ref().unwrap().version, "v1");
    assert_eq!(s.active_version.as_deref(), Some("v2"));
}

#[test]
fn recreate_serves_nothing_while_it_rolls() {
    let mut w = World::ready_at("v1");
    w.resource.spec["rolloutStrategy"] = json!({"type": "Recreate"});
    w.set_version("v2");
    w.reconcile();
    assert!(
        matches!(&w.writes[1], Write::MergePatchDeployment { patch, .. } if patch["spec"]["strategy"]["rollingUpdate"].is_null()),
        "rollingUpdate is removed before the apply: {:?}",
        w.writes
    );
    assert_eq!(w.status().active_version, None);
    assert_eq!(w.dep()["spec"]["strategy"], json!({"type": "Recreate"}));
}

// ---- failure and automatic rollback ----

#[test]
fn a_version_that_never_gets_ready_is_rolled_back_with_every_field_recorded() {
    let mut w = World::ready_at("v1");
    let v1_hash = w.status().applied_spec_hash.clone();
    let v1_template = w.template_hash();
    let events = w.fail_rollout("v2");
    assert_eq!(
        reasons(&events),
        [reason::ROLLOUT_FAILED, reason::ROLLBACK_STARTED]
    );
    assert!(
        events[0].message.contains("v2 did not become ready"),
        "{}",
        events[0].message
    );
    let s = w.status();
    assert_eq!(s.phase, Some(Phase::RolledBack));
    assert_eq!(
        s.desired_version.as_deref(),
        Some("v2"),
        "desiredVersion stays the failed version"
    );
    assert_eq!(s.failed_spec_hash, s.desired_spec_hash);
    assert_eq!(s.rollback_spec.as_ref().unwrap().version, "v1");
    assert_eq!(s.rollback_request.as_deref(), Some("automatic:v1"));
    assert_eq!(s.rollback_count, Some(1));
    assert_eq!(s.applied_spec_hash, v1_hash);
    assert_eq!(s.active_version.as_deref(), Some("v1"));
    assert_eq!(
        w.condition(DEGRADED),
        ("True".into(), "RolloutFailed".into())
    );
    assert_eq!(
        w.condition(ROLLED_BACK),
        ("Unknown".into(), "RollbackInProgress".into())
    );
    assert_eq!(w.template_hash(), v1_template, "the v1 template is back");
    assert_eq!(w.cm_version(), "v1");

    w.pods_ready();
    w.now += 10;
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::ROLLBACK_SUCCEEDED]);
    let s = w.status();
    assert_eq!(s.phase, Some(Phase::RolledBack));
    assert_eq!(s.active_version.as_deref(), Some("v1"));
    assert_eq!(
        w.condition(ROLLED_BACK),
        ("True".into(), "RollbackSucceeded".into())
    );
    assert_eq!(w.condition(READY), ("False".into(), "RolledBack".into()));
    assert_eq!(w.condition(STALLED).0, "True");
    assert_eq!(w.condition(DEGRADED).0, "True");

    // Later passes never retry v2 and count the rollback once.
    for _ in 0..3 {
        w.now += 60;
        assert!(w.reconcile().is_empty());
        assert!(w.writes.is_empty());
    }
    assert_eq!(w.status().rollback_count, Some(1));
    assert_eq!(w.cm_version(), "v1");
}

#[test]
fn a_deadline_condition_from_before_the_write_is_not_held_against_it() {
    let mut w = World::ready_at("v1");
    // A stale deadline condition, stamped before the next rollout.
    w.deadline_exceeded();
    w.set_version("v2");
    w.now += 10;
    w.reconcile();
    let generation = w.dep()["metadata"]["generation"].clone();
    w.dep()["status"]["observedGeneration"] = generation;
    let d = w.decide();
    assert!(d.writes.is_empty() && d.events.is_empty(), "{d:?}");
    assert_eq!(d.status.phase, Some(Phase::RollingOut));
    assert_eq!(
        d.requeue_after,
        Some(Duration::from_secs(601)),
        "look again when the deadline passes"
    );
    // If it persists for a whole deadline after the write, it counts.
    w.now += 601;
    assert_eq!(
        reasons(&w.reconcile()),
        [reason::ROLLOUT_FAILED, reason::ROLLBACK_STARTED]
    );
}

#[test]
fn a_replica_failure_during_a_rollout_fails_it() {
    let mut w = World::ready_at("v1");
    w.set_version("v2");
    w.reconcile();
    w.now += 5;
    let now = json!(at(w.now));
    let d = w.dep();
    d["status"] = json!({"observedGeneration": d["metadata"]["generation"], "replicas": 2, "updatedReplicas": 0,
                         "readyReplicas": 2, "availableReplicas": 2,
                         "conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                                         "message": "exceeded quota", "lastUpdateTime": now}]});
    let events = w.reconcile();
    assert_eq!(
        reasons(&events),
        [reason::ROLLOUT_FAILED, reason::ROLLBACK_STARTED]
    );
    assert!(events[0].message.contains("exceeded quota"));
}

#[test]
fn without_a_retained_version_a_failure_is_terminal_until_the_pods_recover() {
    let mut w = World::new(spec("v1"));
    w.reconcile();
    w.now += 600;
    w.deadline_exceeded();
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::ROLLOUT_FAILED]);
    assert!(events[0].message.contains("no earlier successful version"));
    assert!(w.writes.is_empty());
    assert_eq!(w.status().phase, Some(Phase::Failed));
    assert_eq!(w.condition(DEGRADED).0, "True");
    assert_eq!(
        w.condition(STALLED),
        ("True".into(), "ProgressDeadlineExceeded".into())
    );
    assert!(w.reconcile().is_empty(), "reported once");
    w.pods_ready();
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::ROLLOUT_SUCCEEDED]);
    assert!(events[0].message.contains("after all"));
    assert_eq!(w.status().phase, Some(Phase::Ready));
}

#[test]
fn rollback_on_failure_false_stops_in_failed() {
    let mut w = World::ready_at("v1");
    w.resource.spec["rolloutStrategy"] = json!({"rollbackOnFailure": false});
    let events = w.fail_rollout("v2");
    assert_eq!(reasons(&events), [reason::ROLLOUT_FAILED]);
    assert!(events[0].message.contains("rollbackOnFailure is false"));
    assert_eq!(w.status().phase, Some(Phase::Failed));
    assert_eq!(w.cm_version(), "v2", "nothing restored");
}

#[test]
fn giving_up_on_a_rollout_or_a_rollback_is_decided_on_live_reads() {
    // Both verdicts are final for a version, and a cache can hold a
    // Deployment seconds old: the shell carries them out only once made on
    // a live read. Nothing else asks for one.
    let mut w = World::ready_at("v1");
    assert!(!w.decide().needs_live_reads, "at rest");
    w.set_version("v2");
    assert!(!w.decide().needs_live_reads, "starting a rollout");
    w.reconcile();
    w.now += 700;
    w.deadline_exceeded();
    assert!(w.decide().needs_live_reads, "rolling back");
    w.reconcile();
    assert!(!w.decide().needs_live_reads, "rolling back, carried out");
    w.now += 700;
    w.deadline_exceeded();
    assert!(w.decide().needs_live_reads, "the rollback failed");
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::Failed));
    assert!(!w.decide().needs_live_reads, "failed, reported once");
}

#[test]
fn a_rollback_that_fails_ends_in_failed_without_a_loop() {
    let mut w = World::ready_at("v1");
    w.fail_rollout("v2");
    w.now += 700;
    w.deadline_exceeded();
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::ROLLBACK_FAILED]);
    assert_eq!(w.status().phase, Some(Phase::Failed));
    assert_eq!(
        w.condition(READY),
        ("False".into(), "RollbackFailed".into())
    );
    assert_eq!(w.condition(ROLLED_BACK).0, "False");
    for _ in 0..3 {
        w.now += 700;
        assert!(w.reconcile().is_empty());
        assert!(w.writes.is_empty());
    }
    assert_eq!(w.status().rollback_count, Some(1));
}

#[test]
fn editing_the_spec_after_an_automatic_rollback_tries_again() {
    let mut w = World::ready_at("v1");
    w.fail_rollout("v2");
    w.pods_ready();
    w.reconcile();
    // Same version, a field the operator hashes edited: a deliberate retry
    // (the admission policy asks for a new openmed.ai/retry-reason).
    w.resource.spec["replicas"] = json!(3);
    w.resource.generation += 1;
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::ROLLOUT_STARTED]);
    assert_eq!(w.cm_version(), "v2");
    assert_eq!(w.status().rollback_request, None);
}

#[test]
fn an_edit_the_operator_does_not_hash_keeps_an_automatic_rollback() {
    // The admission policy lets an edit of only spec.canary (or spelling
    // out a default) through without a retry reason, so such an edit must
    // not roll the failed version out again.
    let mut w = World::ready_at("v1");
    w.fail_rollout("v2");
    w.pods_ready();
    w.reconcile();
    assert_eq!(w.cm_version(), "v1");
    let before = w.status().rollback_count;
    w.resource.spec["targetRef"] = json!({"name": "svc"});
    w.resource.generation += 1;
    w.now += 10;
    let events = w.reconcile();
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(w.cm_version(), "v1", "still rolled back");
    assert_eq!(w.status().phase, Some(Phase::RolledBack));
    assert_eq!(w.status().rollback_count, before);
    // A canary added and then removed again: still held.
    w.resource.spec["canary"] = json!({
        "targetRef": {"name": "svc-canary"},
        "trafficRef": {"httpRoute": "svc", "stableBackend": "svc", "canaryBackend": "svc-canary"},
        "steps": [{"weight": 10}],
    });
    w.resource.generation += 1;
    w.reconcile();
    w.resource.spec.as_object_mut().unwrap().remove("canary");
    w.resource.generation += 1;
    w.reconcile();
    assert_eq!(
        w.cm_version(),
        "v1",
        "removing spec.canary is no retry either"
    );
    assert_eq!(w.status().phase, Some(Phase::RolledBack));
}

#[test]
fn a_replica_failure_on_a_ready_model_is_degraded_not_failed() {
    let mut w = World::ready_at("v1");
    w.dep()["status"]["conditions"] = json!([
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "quota",
         "lastUpdateTime": at(w.now + 1)}]);
    w.now += 5;
    let events = w.reconcile();
    assert!(events.is_empty(), "{events:?}");
    assert!(w.writes.is_empty());
    let s = w.status();
    assert_eq!(s.phase, Some(Phase::Ready));
    assert_eq!(s.failed_spec_hash, None);
    assert_eq!(
        w.condition(DEGRADED),
        ("True".into(), "ReplicaFailure".into())
    );
    assert_eq!(w.condition(READY).0, "True");
}

#[test]
fn rolling_out_the_last_good_spec_again_is_never_a_failure() {
    let mut w = World::ready_at("v1");
    w.set_version("v2");
    w.reconcile();
    // Back to v1 before v2 finished, and v1 cannot progress either.
    w.set_version("v1");
    w.reconcile();
    w.now += 600;
    w.deadline_exceeded();
    let events = w.reconcile();
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(w.status().failed_spec_hash, None);
    assert_eq!(w.status().rollback_count, None);
    assert_eq!(
        w.condition(DEGRADED),
        ("True".into(), "ProgressDeadlineExceeded".into())
    );
}

// ---- manual rollback ----

#[test]
fn a_manual_rollback_to_the_previous_version_is_accepted() {
    let mut w = World::ready_at("v1");
    w.upgrade("v2");
    w.annotate_rollback(Some("v1"));
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::ROLLBACK_STARTED]);
    let s = w.status();
    assert_eq!(s.rollback_request.as_deref(), Some("manual:v1"));
    assert_eq!(s.phase, Some(Phase::RolledBack));
    assert_eq!(
        s.active_version.as_deref(),
        Some("v2"),
        "until v1's pods are available"
    );
    assert_eq!(w.cm_version(), "v1");
    w.pods_ready();
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::ROLLBACK_SUCCEEDED]);
    let s = w.status();
    assert_eq!(s.active_version.as_deref(), Some("v1"));
    assert_eq!(s.last_successful_spec.as_ref().unwrap().version, "v1");
    assert_eq!(s.previous_successful_spec.as_ref().unwrap().version, "v2");
    assert_eq!(w.condition(READY), ("True".into(), "ManualRollback".into()));
    assert_eq!(w.condition(ROLLED_BACK).0, "True");
}

#[test]
fn a_manual_rollback_to_an_unknown_version_is_rejected_and_changes_nothing() {
    let mut w = World::ready_at("v1");
    w.upgrade("v2");
    let template = w.template_hash();
    w.annotate_rollback(Some("v0"));
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::ROLLBACK_REJECTED]);
    assert!(events[0].message.contains("RollbackTargetUnavailable"));
    assert!(events[0].message.contains("retained: v2, v1"));
    assert!(w.writes.is_empty());
    assert_eq!(w.template_hash(), template);
    assert_eq!(
        w.condition(READY),
        ("False".into(), "RollbackTargetUnavailable".into())
    );
    assert!(w.reconcile().is_empty(), "rejected once, not on every pass");
    w.annotate_rollback(None);
    assert!(w.reconcile().is_empty());
    assert!(w.writes.is_empty());
    assert_eq!(
        w.condition(READY),
        ("True".into(), "RolloutSucceeded".into())
    );
    assert_eq!(w.condition(STALLED).0, "False");
}

#[test]
fn pointing_the_spec_at_the_restored_version_ends_a_manual_rollback_without_a_pod_roll() {
    let mut w = World::ready_at("v1");
    w.upgrade("v2");
    w.annotate_rollback(Some("v1"));
    w.reconcile();
    w.pods_ready();
    w.reconcile();
    let generation = w.dep()["metadata"]["generation"].clone();
    w.set_version("v1");
    w.annotate_rollback(None);
    let events = w.reconcile();
    assert!(w.writes.is_empty(), "{:?}", w.writes);
    assert_eq!(w.dep()["metadata"]["generation"], generation);
    assert_eq!(reasons(&events), [reason::ROLLOUT_SUCCEEDED]);
    assert_eq!(w.status().phase, Some(Phase::Ready));
    assert_eq!(w.status().rollback_request, None);
    assert_eq!(w.condition(ROLLED_BACK).0, "False");
}

#[test]
fn removing_the_annotation_rolls_forward_to_the_spec() {
    let mut w = World::ready_at("v1");
    w.upgrade("v2");
    w.annotate_rollback(Some("v1"));
    w.reconcile();
    w.pods_ready();
    w.reconcile();
    w.annotate_rollback(None);
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::ROLLOUT_STARTED]);
    assert_eq!(w.cm_version(), "v2");
}

#[test]
fn a_rollback_annotation_naming_the_current_version_is_not_a_rollback() {
    let mut w = World::ready_at("v1");
    w.annotate_rollback(Some("v1"));
    assert!(w.reconcile().is_empty());
    assert_eq!(w.status().phase, Some(Phase::Ready));
    assert_eq!(w.status().rollback_count, None);
}

// ---- drift ----

#[test]
fn drift_by_another_writer_is_restored_every_time() {
    let mut w = World::ready_at("v1");
    // The env entry removed.
    w.dep()["spec"]["template"]["spec"]["containers"][0]["env"] = json!([]);
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::DRIFT_CORRECTED]);
    assert!(
        events[0].message.contains("OPENMED_SERVICE_PRELOAD_MODELS"),
        "{}",
        events[0].message
    );
    assert_eq!(
        w.preload()["valueFrom"]["configMapKeyRef"]["key"],
        "OPENMED_SERVICE_PRELOAD_MODELS"
    );
    // Replicas changed.
    w.dep()["spec"]["replicas"] = json!(7);
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::DRIFT_CORRECTED]);
    assert!(events[0].message.contains("replicas"));
    assert_eq!(w.dep()["spec"]["replicas"], 2);
    // The pointer edited: no pod reads it, so it is put back quietly once
    // the Deployment has settled.
    w.pods_ready();
    let pointer = w
        .config_maps
        .iter_mut()
        .find(|c| c.metadata.name.as_deref() == Some("svc-model-manifest"))
        .unwrap();
    pointer
        .data
        .as_mut()
        .unwrap()
        .insert("OPENMED_SERVICE_PRELOAD_MODELS".into(), "evil".into());
    assert!(w.reconcile().is_empty());
    assert_eq!(w.pointer_version().as_deref(), Some("v1"));
    // The snapshot deleted (immutable: deleting is the only way to change it).
    let snapshot = w.preload()["valueFrom"]["configMapKeyRef"]["name"].clone();
    w.config_maps
        .retain(|c| c.metadata.name.as_deref() != snapshot.as_str());
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::DRIFT_CORRECTED]);
    assert!(events[0].message.contains("ConfigMap missing"));
    assert_eq!(w.cm_version(), "v1");
    assert_eq!(w.status().phase, Some(Phase::Ready));
}

// ---- target problems ----

#[test]
fn a_missing_target_blocks_without_writes_and_heals_when_created() {
    let mut w = World::new(spec("v1"));
    w.deployment = None;
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::TARGET_NOT_FOUND]);
    assert!(w.writes.is_empty());
    assert_eq!(w.status().phase, Some(Phase::Pending));
    assert_eq!(
        w.condition(READY),
        ("False".into(), "TargetNotFound".into())
    );
    assert_eq!(w.condition(STALLED).0, "False", "it heals by itself");
    assert!(w.reconcile().is_empty(), "reported once");
    w.deployment = Some(deployment("svc"));
    assert_eq!(reasons(&w.reconcile()), [reason::ROLLOUT_STARTED]);
}

#[test]
fn a_version_the_earlier_operator_accepted_but_the_service_refuses_is_never_rolled_out() {
    let mut w = World::ready_at("v1");
    let template = w.dep()["spec"]["template"].clone();
    w.set_version("OpenMed/pii@sha256:0123abcd");
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::VERSION_NOT_A_MODEL_ID]);
    assert!(
        events[0].message.contains("has '@', ':'"),
        "{}",
        events[0].message
    );
    assert!(w.writes.is_empty(), "{:?}", w.writes);
    assert_eq!(w.dep()["spec"]["template"], template, "v1 keeps serving");
    assert_eq!(
        w.condition(READY),
        ("False".into(), "VersionNotAModelId".into())
    );
    assert_eq!(w.status().active_version.as_deref(), Some("v1"));
    // A version the service loads is rolled out as usual.
    w.set_version("v2");
    assert_eq!(reasons(&w.reconcile()), [reason::ROLLOUT_STARTED]);
}

#[test]
fn a_missing_container_blocks_and_heals_when_added() {
    let mut w = World::new(spec("v1"));
    w.dep()["spec"]["template"]["spec"]["containers"][0]["name"] = json!("api");
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::CONTAINER_NOT_FOUND]);
    assert!(events[0].message.contains("it has: api"));
    assert!(w.writes.is_empty());
    w.dep()["spec"]["template"]["spec"]["containers"][0]["name"] = json!("openmed-service");
    assert_eq!(reasons(&w.reconcile()), [reason::ROLLOUT_STARTED]);
}

#[test]
fn a_target_held_by_another_resource_is_a_conflict_until_it_lets_go() {
    let mut w = World::new(spec("v1"));
    w.dep()["metadata"]["annotations"] = json!({MODEL_RESOURCE_ANNOTATION: "ns/other"});
    w.rivals = vec![Rival {
        key: "ns/other".into(),
        created: Some(at(50)),
    }];
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::TARGET_CONFLICT]);
    assert!(
        events[0]
            .message
            .contains("managed by OpenMedModel ns/other")
    );
    assert!(w.writes.is_empty());
    assert_eq!(w.condition(DEGRADED).0, "True");
    // The other resource is deleted: its stale annotation no longer counts.
    w.rivals.clear();
    assert_eq!(reasons(&w.reconcile()), [reason::ROLLOUT_STARTED]);
}

#[test]
fn without_a_holder_the_oldest_claim_wins() {
    let mut w = World::new(spec("v1"));
    w.rivals = vec![Rival {
        key: "ns/older".into(),
        created: Some(at(-5)),
    }];
    assert_eq!(reasons(&w.reconcile()), [reason::TARGET_CONFLICT]);
    w.rivals = vec![Rival {
        key: "ns/newer".into(),
        created: Some(at(5)),
    }];
    assert_eq!(reasons(&w.reconcile()), [reason::ROLLOUT_STARTED]);
}

#[test]
fn a_foreign_config_map_of_the_same_name_is_a_conflict() {
    let mut w = World::new(spec("v1"));
    w.config_maps.push(ConfigMap {
        metadata: ObjectMeta {
            name: Some("svc-model-manifest".into()),
            ..Default::default()
        },
        ..Default::default()
    });
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::TARGET_CONFLICT]);
    assert!(
        events[0]
            .message
            .contains("ConfigMap svc-model-manifest exists and is not owned")
    );
    assert!(w.writes.is_empty());
}

#[test]
fn the_target_label_is_required_when_asked() {
    let mut w = World::new(spec("v1"));
    w.settings.require_target_label = true;
    assert_eq!(reasons(&w.reconcile()), [reason::TARGET_NOT_OPTED_IN]);
    assert!(w.writes.is_empty());
    w.dep()["metadata"]["labels"]["openmed.ai/managed"] = json!("true");
    assert_eq!(reasons(&w.reconcile()), [reason::ROLLOUT_STARTED]);
}

#[test]
fn a_paused_deployment_is_reported_as_such() {
    let mut w = World::new(spec("v1"));
    w.dep()["spec"]["paused"] = json!(true);
    w.reconcile();
    assert_eq!(
        w.condition(READY),
        ("False".into(), "DeploymentPaused".into())
    );
    assert_eq!(
        w.condition(PROGRESSING),
        ("False".into(), "DeploymentPaused".into())
    );
    assert!(
        w.events
            .iter()
            .any(|e| e.reason == reason::DEPLOYMENT_PAUSED)
    );
    w.now += 10_000;
    w.reconcile();
    assert_eq!(
        w.status().failed_spec_hash,
        None,
        "a pause is never a failure"
    );
}

#[test]
fn an_autoscaled_target_keeps_its_replicas() {
    let mut w = World::new(spec("v1"));
    w.another_autoscaler();
    w.dep()["spec"]["replicas"] = json!(5);
    w.reconcile();
    let Write::ApplyDeployment { body, .. } = &w.writes[1] else {
        panic!()
    };
    assert!(body["spec"].get("replicas").is_none());
    w.pods_ready();
    w.reconcile();
    let ready = conditions::get(&w.status().conditions, READY).unwrap();
    assert!(
        ready.message.contains("HorizontalPodAutoscaler"),
        "{}",
        ready.message
    );
    assert_eq!(w.dep()["spec"]["replicas"], 5);
}

#[test]
fn an_autoscaler_created_after_the_rollout_never_sees_its_replicas_defaulted() {
    // spec.replicas: 3, Ready; an HPA appears and has not scaled yet; the
    // next version's apply no longer sends replicas. The count stays 3.
    let mut w =
        World::new(json!({"family": "pii", "tier": "Small", "version": "v1", "replicas": 3}));
    w.reconcile();
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    assert_eq!(w.dep()["spec"]["replicas"], 3);
    w.another_autoscaler();
    w.set_version("v2");
    w.now += 10;
    w.reconcile();
    let kinds: Vec<&str> = w
        .writes
        .iter()
        .filter_map(|w| match w {
            Write::HandOverReplicas { .. } => Some("hand over"),
            Write::ApplyDeployment { .. } => Some("apply"),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["hand over", "apply"], "{:?}", w.writes);
    assert_eq!(w.dep()["spec"]["replicas"], 3, "not defaulted to 1");
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::Ready));
    assert_eq!(w.dep()["spec"]["replicas"], 3);
    // Handed over once: the next apply has nothing of ours to drop.
    w.set_version("v3");
    w.now += 10;
    w.reconcile();
    assert!(
        !w.writes
            .iter()
            .any(|w| matches!(w, Write::HandOverReplicas { .. })),
        "{:?}",
        w.writes
    );
    assert_eq!(w.dep()["spec"]["replicas"], 3);
}

#[test]
fn a_rollback_to_a_spec_without_replicas_keeps_the_count() {
    // v1 leaves replicas to the Deployment (3); v2 asks for 3 and fails;
    // the rollback to v1 stops sending replicas.
    let mut w = World::new(json!({"family": "pii", "tier": "Small", "version": "v1"}));
    w.dep()["spec"]["replicas"] = json!(3);
    w.reconcile();
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    w.resource.spec["replicas"] = json!(3);
    let events = w.fail_rollout("v2");
    assert!(reasons(&events).contains(&reason::ROLLBACK_STARTED));
    assert_eq!(w.dep()["spec"]["replicas"], 3, "not defaulted to 1");
    assert_eq!(w.cm_version(), "v1");
}

// ---- changing the target or the ConfigMap name ----

#[test]
fn renaming_the_target_releases_the_old_one_first() {
    let mut w = World::ready_at("v1");
    let old = w.deployment.take().unwrap();
    w.other_deployments.push(old);
    w.deployment = Some(deployment("svc-v2"));
    w.resource.spec["targetRef"] = json!({"name": "svc-v2"});
    w.resource.generation += 1;
    let events = w.reconcile();
    assert_eq!(
        reasons(&events),
        [reason::TARGET_RELEASED, reason::ROLLOUT_STARTED]
    );
    let Write::ApplyDeployment { name, release, .. } = &w.writes[0] else {
        panic!("release first")
    };
    assert_eq!((name.as_str(), *release), ("svc", true));
    let old = &w.other_deployments[0];
    let env = &old["spec"]["template"]["spec"]["containers"][0]["env"][0];
    assert_eq!(
        env,
        &json!({"name": "OPENMED_SERVICE_PRELOAD_MODELS"}),
        "emptied, no valueFrom"
    );
    assert!(
        old["metadata"]["annotations"]
            .get(MODEL_RESOURCE_ANNOTATION)
            .is_none()
    );
    assert_eq!(old["spec"]["replicas"], 2, "scaling fields are kept");
    assert_eq!(
        old["spec"]["template"]["metadata"]["annotations"][MANIFEST_HASH_ANNOTATION],
        json!(crate::plan::released_manifest_hash())
    );
    assert_eq!(w.cm_version(), "v1");
}

#[test]
fn a_rollback_after_a_target_change_restores_the_model_on_the_new_target() {
    // v1 is Ready on svc; the spec moves to svc-v2 with v2, which never
    // gets ready. The rollback restores v1 on svc-v2, the Deployment the
    // spec names now; svc stays released.
    let mut w = World::ready_at("v1");
    let old = w.deployment.take().unwrap();
    w.other_deployments.push(old);
    w.deployment = Some(deployment("svc-v2"));
    w.resource.spec["targetRef"] = json!({"name": "svc-v2"});
    let events = w.fail_rollout("v2");
    assert!(
        reasons(&events).contains(&reason::ROLLBACK_STARTED),
        "{events:?}"
    );
    for write in &w.writes {
        if let Write::ApplyDeployment { name, .. } = write {
            assert_eq!(name, "svc-v2", "only the new target is written: {write:?}");
        }
    }
    assert_eq!(w.cm_version(), "v1", "the new target serves v1 again");
    let old = &w.other_deployments[0];
    assert!(
        old["metadata"]["annotations"]
            .get(MODEL_RESOURCE_ANNOTATION)
            .is_none(),
        "the old target is not claimed again"
    );
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::RolledBack));
    assert!(conditions::is_true(&w.status().conditions, ROLLED_BACK));
    assert_eq!(
        w.status()
            .last_successful_spec
            .as_ref()
            .unwrap()
            .target_ref
            .name
            .as_deref(),
        Some("svc-v2")
    );
    w.now += 10;
    w.reconcile();
    assert!(w.writes.is_empty(), "it settles: {:?}", w.writes);
    // A manual rollback is placed the same way.
    w.set_version("v3");
    w.now += 10;
    w.reconcile();
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    w.annotate_rollback(Some("v1"));
    w.now += 10;
    w.reconcile();
    for write in &w.writes {
        if let Write::ApplyDeployment { name, .. } = write {
            assert_eq!(name, "svc-v2", "{write:?}");
        }
    }
    assert_eq!(w.cm_version(), "v1");
}

#[test]
fn a_rollback_after_a_target_change_happens_when_the_old_target_is_gone() {
    let mut w = World::ready_at("v1");
    w.deployment = Some(deployment("svc-v2"));
    w.resource.spec["targetRef"] = json!({"name": "svc-v2"});
    let events = w.fail_rollout("v2");
    assert!(
        reasons(&events).contains(&reason::ROLLBACK_STARTED),
        "{events:?}"
    );
    assert_eq!(w.cm_version(), "v1");
}

#[test]
fn renaming_the_config_map_deletes_the_old_ones_only_once_no_pod_reads_them() {
    let mut w = World::ready_at("v1");
    let old = w.preload()["valueFrom"]["configMapKeyRef"]["name"].clone();
    w.resource.spec["manifestConfigMapName"] = json!("models");
    w.resource.generation += 1;
    w.reconcile();
    assert!(
        !w.writes
            .iter()
            .any(|w| matches!(w, Write::DeleteConfigMap { .. })),
        "old pods still read the old ConfigMap: {:?}",
        w.writes
    );
    assert_eq!(
        w.version_in(old.as_str().unwrap()).as_deref(),
        Some("v1"),
        "a recreated old pod still finds its ConfigMap"
    );
    let new = w.preload()["valueFrom"]["configMapKeyRef"]["name"].clone();
    assert!(new.as_str().unwrap().starts_with("models-"), "{new}");
    w.pods_ready();
    w.reconcile();
    assert_eq!(
        w.config_map_names(),
        ["models".to_owned(), new.as_str().unwrap().to_owned()]
    );
}

// ---- deletion ----

#[test]
fn deletion_releases_the_target_then_deletes_the_config_maps_once_no_pod_reads_them() {
    let mut w = World::ready_at("v1");
    w.resource.deleting = true;
    let d = w.decide();
    assert!(
        !d.writes
            .iter()
            .any(|w| matches!(w, Write::DeleteConfigMap { .. })),
        "never in the same decision as the release, which may fail: {:?}",
        d.writes
    );
    assert!(!d.finished);
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::TARGET_RELEASED]);
    assert_eq!(
        w.preload(),
        json!({"name": "OPENMED_SERVICE_PRELOAD_MODELS"})
    );
    assert_eq!(
        w.config_maps.len(),
        2,
        "pods of the model's template remain until the released one has rolled"
    );
    assert!(!w.decide().finished);
    w.pods_ready();
    w.reconcile();
    assert!(w.config_maps.is_empty());
    assert!(w.decide().finished, "now the finalizer may go");
    assert!(
        w.deployment.is_some(),
        "the Deployment itself is never deleted"
    );
}

#[test]
fn deletion_with_an_invalid_spec_still_releases() {
    let mut w = World::ready_at("v1");
    w.resource.spec = json!({"family": "1nvalid"});
    w.resource.deleting = true;
    w.reconcile();
    w.pods_ready();
    w.reconcile();
    assert!(w.config_maps.is_empty());
    assert!(w.preload().get("valueFrom").is_none());
    assert!(w.decide().finished);
}

#[test]
fn deletion_of_a_resource_whose_target_is_gone_deletes_its_config_maps() {
    let mut w = World::ready_at("v1");
    w.deployment = None;
    w.resource.deleting = true;
    w.reconcile();
    assert!(w.config_maps.is_empty());
    assert!(w.decide().finished);
}

#[test]
fn the_manifest_config_maps_are_also_owned_by_the_target() {
    // A foreground deletion of the resource (Argo CD's prune) makes the
    // garbage collector delete its dependents first; one that still has
    // the Deployment as an owner is kept until the operator releases it.
    let w = World::ready_at("v1");
    for cm in &w.config_maps {
        let refs = cm.metadata.owner_references.as_ref().unwrap();
        let kinds: Vec<(&str, &str)> = refs
            .iter()
            .map(|r| (r.kind.as_str(), r.uid.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [("OpenMedModel", UID), ("Deployment", "uid-svc")],
            "{:?}",
            cm.metadata.name
        );
        let by_target = &refs[1];
        assert_eq!(by_target.block_owner_deletion, None);
        assert_eq!(by_target.controller, None);
    }
}

#[test]
fn deletion_leaves_a_foreign_or_missing_target_untouched() {
    let mut w = World::new(spec("v1"));
    w.dep()["metadata"]["annotations"] = json!({MODEL_RESOURCE_ANNOTATION: "ns/other"});
    w.resource.deleting = true;
    assert!(w.reconcile().is_empty());
    assert!(w.writes.is_empty());
    w.deployment = None;
    assert!(w.reconcile().is_empty());
}

#[test]
fn a_release_refused_half_way_leaves_the_target_claimed_and_is_made_again() {
    let mut w = World::ready_at("v1");
    // The earlier operator wrote the ownership mark under our manager's
    // name as an Update, which our apply cannot take back on its own.
    w.dep()["metadata"]["managedFields"] = json!([{
        "manager": FIELD_MANAGER, "operation": "Update",
        "fieldsV1": {"f:metadata": {"f:annotations": {format!("f:{MODEL_RESOURCE_ANNOTATION}"): {}}}},
    }]);
    w.resource.deleting = true;
    let d = w.decide();
    assert!(d.writes.len() >= 2, "{:?}", d.writes);
    // Only the first write lands; the next is refused (a precondition
    // the Deployment controller's status write made stale).
    w.execute(&d.writes[0]);
    w.resource.status = d.status;
    let key = json!(w.resource.key());
    assert_eq!(
        w.dep()["metadata"]["annotations"][MODEL_RESOURCE_ANNOTATION],
        key,
        "the ownership mark outlives a half-written release"
    );
    w.reconcile();
    assert!(
        w.dep()["metadata"]["annotations"]
            .get(MODEL_RESOURCE_ANNOTATION)
            .is_none(),
        "{:#?}",
        w.dep()["metadata"]
    );
    assert_eq!(w.preload().get("valueFrom"), None, "{:#?}", w.preload());
}

#[test]
fn releasing_a_target_whose_container_is_gone_touches_only_annotations() {
    let mut w = World::ready_at("v1");
    w.dep()["spec"]["template"]["spec"]["containers"][0]["env"] = json!([]);
    w.resource.deleting = true;
    let d = w.decide();
    let Write::ApplyDeployment { body, .. } = &d.writes[0] else {
        panic!()
    };
    assert!(body["spec"]["template"].get("spec").is_none());
}

// ---- invalid specs ----

#[test]
fn an_invalid_spec_is_reported_once_per_generation_with_no_writes() {
    let mut w = World::ready_at("v1");
    w.resource.spec["tier"] = json!("Huge");
    w.resource.generation += 1;
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::INVALID_SPEC]);
    assert!(
        events[0].message.contains("spec.tier"),
        "{}",
        events[0].message
    );
    assert!(w.writes.is_empty());
    assert_eq!(w.condition(READY), ("False".into(), "InvalidSpec".into()));
    assert_eq!(w.condition(STALLED).0, "True");
    assert_eq!(w.status().observed_generation, Some(w.resource.generation));
    assert!(w.reconcile().is_empty());
    w.resource.spec["tier"] = json!("Small");
    w.resource.generation += 1;
    w.reconcile();
    assert_eq!(w.condition(READY).0, "True");
}

#[test]
fn the_progress_deadline_must_exceed_min_ready_seconds() {
    let mut w = World::new(json!({"family": "pii", "tier": "Small", "version": "v1",
                                  "rolloutStrategy": {"progressDeadlineSeconds": 10}}));
    w.dep()["spec"]["minReadySeconds"] = json!(30);
    assert_eq!(reasons(&w.reconcile()), [reason::INVALID_SPEC]);
}

#[test]
fn a_stored_quality_gate_on_a_family_it_cannot_judge_is_refused_with_nothing_written() {
    // Stored before the CRD carried the rule: the operator says the same
    // as the API server now does, and no pod is replaced.
    let mut w = World::ready_at("v1");
    w.resource.spec["family"] = json!("disease-detection");
    w.resource.spec["qualityGate"] = json!({"configMapRef": {"name": "probes"}});
    w.resource.generation += 1;
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::INVALID_SPEC]);
    assert!(
        events[0].message.contains("spec.qualityGate") && events[0].message.contains("family pii"),
        "{}",
        events[0].message
    );
    assert!(w.writes.is_empty(), "{:?}", w.writes);
    assert_eq!(w.condition(READY), ("False".into(), "InvalidSpec".into()));
}

// ---- restart safety and migration ----

#[test]
fn a_crash_between_the_intent_and_the_write_converges_and_counts_once() {
    let mut w = World::ready_at("v1");
    w.set_version("v2");
    w.now += 10;
    w.reconcile();
    w.now += 600;
    w.deadline_exceeded();
    // The operator records the rollback intent, then dies before writing.
    let d = w.decide();
    w.resource.status = d.status;
    assert_eq!(w.status().rollback_count, Some(1));
    assert_eq!(w.cm_version(), "v2");
    // Restarted, it carries the rollback out without counting it again.
    w.now += 30;
    w.reconcile();
    assert_eq!(w.cm_version(), "v1");
    assert_eq!(w.status().rollback_count, Some(1));
    assert_eq!(w.status().phase, Some(Phase::RolledBack));
}

#[test]
fn the_intent_names_the_generation_its_write_produces_so_landing_needs_no_status_write() {
    let mut w = World::new(spec("v1"));
    let d = w.decide();
    assert_eq!(
        d.status.target_deployment_generation,
        Some(2),
        "the observed generation plus one, said before the write"
    );
    w.resource.status = d.status;
    for write in &d.writes {
        w.execute(write);
    }
    let intent = w.status().clone();
    let after = w.decide();
    assert!(after.writes.is_empty());
    assert_eq!(
        after.status, intent,
        "the write landing changes nothing in the status"
    );
}

#[test]
fn a_crash_before_the_deployment_write_lands_finishes_it_as_ours() {
    let mut w = World::new(spec("v1"));
    let d = w.decide();
    w.resource.status = d.status;
    // The status was written, then the operator stopped: no write landed.
    let events = w.reconcile();
    assert_eq!(
        reasons(&events),
        Vec::<&str>::new(),
        "finishing our own write is not drift"
    );
    assert_eq!(w.status().target_deployment_generation, Some(2));
    assert_eq!(w.template_hash(), json!(w.status().manifest_hash));
}

impl World {
    /// The Deployment, pointer ConfigMap and status as the earlier
    /// operator left them (the vectors' resource), never seen by this one.
    fn handled_by_the_earlier_operator() -> World {
        let vector: Value =
            serde_json::from_str(include_str!("../../../tests/vectors/basic-v1.json")).unwrap();
        let mut w = World::new(vector["resource"]["spec"].clone());
        w.resource.name = "openmed-service".into();
        w.resource.namespace = "openmed".into();
        w.resource.uid = vector["resource"]["metadata"]["uid"]
            .as_str()
            .unwrap()
            .into();
        let mut d = deployment("openmed-service");
        d["metadata"]["namespace"] = json!("openmed");
        d["metadata"]["generation"] = json!(7);
        d["metadata"]["annotations"] =
            json!({MODEL_RESOURCE_ANNOTATION: "openmed/openmed-service"});
        d["spec"]["progressDeadlineSeconds"] = json!(600);
        d["spec"]["strategy"] =
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}});
        d["spec"]["template"]["metadata"]["annotations"] = json!({
            MANIFEST_HASH_ANNOTATION: vector["manifestHash"], MODEL_RESOURCE_ANNOTATION: "openmed/openmed-service"});
        d["spec"]["template"]["spec"]["containers"][0]["env"] = json!([{"name": "OPENMED_SERVICE_PRELOAD_MODELS",
            "valueFrom": {"configMapKeyRef": {"name": "openmed-service-model-manifest", "key": "OPENMED_SERVICE_PRELOAD_MODELS"}}}]);
        d["status"]["observedGeneration"] = json!(7);
        w.deployment = Some(d);
        let id = w.resource.id();
        let typed: crate::api::OpenMedModelSpec =
            serde_json::from_value(vector["normalizedSpec"].clone()).unwrap();
        w.config_maps
            .push(crate::plan::plan(&id, &typed, TargetOptions::default()).config_map);
        w.resource.status = ResourceView::new(
            &ObjectMeta::default(),
            json!({}),
            Some(&json!({
                "observedGeneration": 1, "phase": "Ready", "desiredVersion": "OpenMed/synthetic-pii-v1",
                "activeVersion": "OpenMed/synthetic-pii-v1", "desiredSpecHash": vector["specHash"],
                "appliedSpecHash": vector["specHash"], "manifestHash": vector["manifestHash"],
                "targetDeploymentGeneration": 7, "rollbackCount": 0,
                "lastSuccessfulSpec": vector["normalizedSpec"], "previousSuccessfulSpec": vector["normalizedSpec"],
            })),
        )
        .status;
        w
    }
}

#[test]
fn a_status_written_by_the_earlier_operator_is_adopted_without_a_pod_restart() {
    let mut w = World::handled_by_the_earlier_operator();
    let events = w.reconcile();
    assert!(events.is_empty(), "adoption is silent: {events:?}");
    assert_eq!(
        w.dep()["metadata"]["generation"],
        7,
        "no pod-template change, no restart"
    );
    assert_eq!(
        w.dep()["metadata"]["labels"][OPERATED_BY_LABEL],
        "openmed-operator"
    );
    let s = w.status();
    assert_eq!(s.phase, Some(Phase::Ready));
    assert_eq!(
        s.last_successful_spec.as_ref().unwrap().version,
        "OpenMed/synthetic-pii-v1"
    );
    assert_eq!(s.target_deployment_generation, Some(7));
}

#[test]
fn a_deletion_first_seen_on_a_resource_the_earlier_operator_handled_releases_and_finishes() {
    // Deleted after the earlier operator stopped and before this one
    // first looked at it: the first decision is the deletion's, and it
    // releases what the earlier operator claimed.
    let mut w = World::handled_by_the_earlier_operator();
    w.resource.deleting = true;
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::TARGET_RELEASED]);
    assert_eq!(
        w.preload(),
        json!({"name": "OPENMED_SERVICE_PRELOAD_MODELS"})
    );
    assert!(
        w.dep()["metadata"]["annotations"]
            .get(MODEL_RESOURCE_ANNOTATION)
            .is_none(),
        "{:#?}",
        w.dep()["metadata"]
    );
    assert!(!w.decide().finished, "its pods still read the pointer");
    w.pods_ready();
    w.reconcile();
    assert!(w.config_maps.is_empty());
    assert!(w.decide().finished, "now the finalizers may go");
}

#[test]
fn lookups_the_shell_needs_come_from_the_raw_spec() {
    let mut w = World::new(spec("v1"));
    w.resource.spec["targetRef"] = json!({"name": "elsewhere"});
    assert_eq!(target_name(&w.resource), "elsewhere");
    w.resource.spec = json!({"targetRef": 5});
    assert_eq!(target_name(&w.resource), "svc");
    let mut w = World::ready_at("v1");
    w.resource.spec["manifestConfigMapName"] = json!("models");
    w.resource.spec["version"] = json!("v2");
    let names = config_map_names(&w.resource);
    assert_eq!(names.len(), 5, "{names:?}");
    assert_eq!(names[0], "models");
    assert!(names[1].starts_with("models-"), "the snapshot: {names:?}");
    assert_eq!(
        names[2], "svc-model-manifest",
        "the retained spec's pointer"
    );
    assert!(
        names[3].starts_with("svc-model-manifest-"),
        "its snapshot: {names:?}"
    );
    assert!(
        names[4].starts_with("models-") && names[4] != names[1],
        "its snapshot placed on the pointer the spec names now: {names:?}"
    );
}

// ---- a pod always loads the model of its own template ----

#[test]
fn a_recreated_pod_of_the_old_replica_set_loads_the_old_model_during_a_rollout() {
    let mut w = World::ready_at("v1");
    let old = w.preload()["valueFrom"]["configMapKeyRef"]["name"].clone();
    w.set_version("broken");
    w.now += 10;
    w.reconcile();
    assert_eq!(
        w.cm_version(),
        "broken",
        "the new template reads the new version"
    );
    assert_eq!(
        w.version_in(old.as_str().unwrap()).as_deref(),
        Some("v1"),
        "what the old template reads did not change underneath it"
    );
    // The rollout fails and is rolled back: the restored template reads v1
    // again, and the failed one's pods read what they always read.
    let failed = w.preload()["valueFrom"]["configMapKeyRef"]["name"].clone();
    w.now += 600;
    w.deadline_exceeded();
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::RolledBack));
    assert_eq!(w.cm_version(), "v1");
    assert_eq!(w.preload()["valueFrom"]["configMapKeyRef"]["name"], old);
    assert_eq!(
        w.version_in(failed.as_str().unwrap()).as_deref(),
        Some("broken")
    );
}

#[test]
fn a_template_that_reads_the_pointer_is_kept_and_the_pointer_waits_for_its_pods() {
    // A template written before snapshots (by the earlier operator, or an
    // earlier openmed-op) reads the pointer.
    let mut w = World::ready_at("v1");
    w.template_reads_the_pointer();
    let generation = w.dep()["metadata"]["generation"].clone();
    // Upgrading the operator restarts no pod: the template stays as it is.
    assert!(w.reconcile().is_empty());
    assert!(w.writes.is_empty(), "{:?}", w.writes);
    assert_eq!(w.dep()["metadata"]["generation"], generation);
    // The next version moves the template to a snapshot; the pointer keeps
    // what the old pods read until none of them is left.
    w.set_version("v2");
    w.now += 10;
    w.reconcile();
    assert_eq!(w.cm_version(), "v2");
    assert_eq!(w.pointer_version().as_deref(), Some("v1"));
    w.now += 10;
    w.reconcile();
    assert_eq!(w.pointer_version().as_deref(), Some("v1"));
    w.pods_ready();
    w.reconcile();
    assert_eq!(w.pointer_version().as_deref(), Some("v2"));
}

#[test]
fn a_pointer_read_by_the_template_is_restored_at_once() {
    let mut w = World::ready_at("v1");
    w.template_reads_the_pointer();
    w.reconcile();
    let cm = w
        .config_maps
        .iter_mut()
        .find(|c| c.metadata.name.as_deref() == Some("svc-model-manifest"))
        .unwrap();
    cm.data
        .as_mut()
        .unwrap()
        .insert("OPENMED_SERVICE_PRELOAD_MODELS".into(), "evil".into());
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::DRIFT_CORRECTED]);
    assert_eq!(w.cm_version(), "v1");
}

#[test]
fn snapshots_are_kept_while_retained_or_referenced_by_a_replica_set() {
    let mut w = World::ready_at("v1");
    let v1 = w.preload()["valueFrom"]["configMapKeyRef"]["name"].clone();
    let v1_short = w.dep()["spec"]["template"]["metadata"]["labels"][MANIFEST_SNAPSHOT_LABEL]
        .as_str()
        .unwrap()
        .to_owned();
    // A ReplicaSet of the revision history references v1 all along.
    w.replica_sets = vec![SnapshotUse {
        short: v1_short,
        config_map: v1.as_str().map(str::to_owned),
        replica_set: "svc-1".into(),
        has_pods: false,
        deployment: None,
        revision: None,
    }];
    w.upgrade("v2");
    w.upgrade("v3");
    // v1 is no longer a retained rollback target, yet it is kept.
    w.now += 10;
    w.reconcile();
    assert_eq!(w.version_in(v1.as_str().unwrap()).as_deref(), Some("v1"));
    w.replica_sets.clear();
    w.reconcile();
    assert_eq!(w.version_in(v1.as_str().unwrap()), None, "collected");
    let retained: Vec<String> = w
        .config_map_names()
        .into_iter()
        .filter(|n| n != "svc-model-manifest")
        .map(|n| w.version_in(&n).unwrap())
        .collect();
    assert_eq!(retained.len(), 2);
    assert!(retained.contains(&"v2".to_owned()) && retained.contains(&"v3".to_owned()));
}

// ---- fault paths ----

#[test]
fn finishing_its_own_interrupted_write_is_not_drift() {
    let mut w = World::ready_at("v1");
    w.set_version("v2");
    w.now += 10;
    // The intent is recorded and the snapshot written; the operator dies
    // before the Deployment write.
    let d = w.decide();
    w.resource.status = d.status;
    w.execute(&d.writes[0]);
    assert!(matches!(d.writes[1], Write::ApplyDeployment { .. }));
    let events = w.reconcile();
    assert!(
        !reasons(&events).contains(&reason::DRIFT_CORRECTED),
        "its own unfinished write is not another writer's: {events:?}"
    );
    assert_eq!(w.cm_version(), "v2");
}

#[test]
fn the_deadline_is_judged_on_the_servers_clock() {
    // The operator's clock runs a second behind the control plane's.
    let mut w = World::ready_at("v1");
    w.server_ahead = 1;
    w.set_version("broken");
    w.now += 10;
    w.reconcile();
    w.now += 600;
    w.deadline_exceeded();
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::RolledBack));
    // The controller has seen the rollback's generation but, the restored
    // ReplicaSet not having moved yet, still shows the deadline condition
    // that caused the rollback.
    let generation = w.dep()["metadata"]["generation"].clone();
    w.dep()["status"]["observedGeneration"] = generation;
    w.now += 1;
    let events = w.reconcile();
    assert!(
        !reasons(&events).contains(&reason::ROLLBACK_FAILED),
        "the old condition counted again: {events:?}"
    );
    assert_ne!(w.status().phase, Some(Phase::Failed));
    w.pods_ready();
    assert_eq!(reasons(&w.reconcile()), [reason::ROLLBACK_SUCCEEDED]);
    let landed = crate::rollout::progress::applied_at(&World::typed(w.dep()));
    assert!(landed.is_some());
    assert_eq!(
        w.status().last_rollout_time,
        landed,
        "the status says when the write landed, on the server's clock"
    );
}

#[test]
fn a_replicas_only_change_keeps_the_previous_version_retained() {
    let mut w = World::ready_at("v1");
    w.upgrade("v2");
    w.resource.spec["replicas"] = json!(3);
    w.resource.generation += 1;
    w.now += 10;
    w.reconcile();
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    let s = w.status();
    assert_eq!(s.phase, Some(Phase::Ready));
    assert_eq!(s.last_successful_spec.as_ref().unwrap().replicas, Some(3));
    assert_eq!(
        s.previous_successful_spec.as_ref().unwrap().version,
        "v1",
        "a rollback target is a version; none succeeded since v2"
    );
}

#[test]
fn a_resource_being_deleted_is_still_a_rival_until_it_is_gone() {
    let me = World::new(spec("v1")).resource;
    assert!(is_rival(&me, "ns", "leaving", "svc"));
    assert!(!is_rival(&me, "ns", "svc", "svc"), "not itself");
    assert!(!is_rival(&me, "other", "leaving", "svc"));
    assert!(!is_rival(&me, "ns", "leaving", "elsewhere"));
    // Held by a resource being deleted, the target is not claimed.
    let mut w = World::new(spec("v1"));
    w.dep()["metadata"]["annotations"] = json!({MODEL_RESOURCE_ANNOTATION: "ns/leaving"});
    w.rivals = vec![Rival {
        key: "ns/leaving".into(),
        created: Some(at(-10)),
    }];
    assert_eq!(reasons(&w.reconcile()), [reason::TARGET_CONFLICT]);
    assert!(w.writes.is_empty());
}

#[test]
fn a_decision_clears_the_shells_error_report() {
    let mut w = World::ready_at("v1");
    let before = w.status().clone();
    let mut errored = before.clone();
    conditions::set(
        &mut errored.conditions,
        RECONCILING,
        true,
        reason::RETRYING_AFTER_ERROR,
        "reconcile failed: server",
        1,
        &at(0),
    );
    w.resource.status = errored;
    let d = w.decide();
    assert!(
        d.status
            .conditions
            .iter()
            .all(|c| c.reason != reason::RETRYING_AFTER_ERROR)
    );
    // A terminal phase sets no Reconciling of its own: the condition says
    // the error is over instead of vanishing.
    let mut failed = World::new(json!({"family": "pii", "tier": "Small", "version": "v1",
                                        "rolloutStrategy": {"rollbackOnFailure": false}}));
    failed.reconcile();
    failed.now += 600;
    failed.deadline_exceeded();
    failed.reconcile();
    assert_eq!(failed.status().phase, Some(Phase::Failed));
    let mut errored = failed.status().clone();
    conditions::set(
        &mut errored.conditions,
        RECONCILING,
        true,
        reason::RETRYING_AFTER_ERROR,
        "reconcile failed: server",
        1,
        &at(0),
    );
    failed.resource.status = errored;
    failed.now += 10;
    let d = failed.decide();
    let c = conditions::get(&d.status.conditions, RECONCILING).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", reason::ERROR_RESOLVED)
    );
}

#[test]
fn deletion_waits_for_every_replica_set_with_pods_that_reads_a_snapshot() {
    // The resource moved to another target, which does not exist; the
    // released one still rolls, its old pods reading a snapshot.
    let mut w = World::ready_at("v1");
    let short = w.dep()["spec"]["template"]["metadata"]["labels"][MANIFEST_SNAPSHOT_LABEL]
        .as_str()
        .unwrap()
        .to_owned();
    w.resource.spec["targetRef"] = json!({"name": "elsewhere"});
    w.resource.generation += 1;
    let old = w.deployment.take().unwrap();
    w.other_deployments.push(old);
    w.reconcile();
    w.replica_sets = vec![SnapshotUse {
        short: short.clone(),
        config_map: None,
        replica_set: "svc-1".into(),
        has_pods: true,
        deployment: None,
        revision: None,
    }];
    w.resource.deleting = true;
    w.reconcile();
    assert!(
        !w.config_maps.is_empty(),
        "a pod of the released Deployment may still start and read it"
    );
    assert!(!w.decide().finished);
    // Scaled down to history only: nothing can start a pod that reads it.
    w.replica_sets = vec![SnapshotUse {
        short,
        config_map: None,
        replica_set: "svc-1".into(),
        has_pods: false,
        deployment: None,
        revision: None,
    }];
    w.reconcile();
    assert!(w.config_maps.is_empty());
    assert!(w.decide().finished);
}

#[test]
fn deletion_waits_only_for_its_own_pods_when_another_resource_serves_the_same_model() {
    // Two resources at the same family, tier and version share the
    // snapshot's short hash; only the ReplicaSets reading this resource's
    // own snapshot hold its deletion.
    let mut w = World::ready_at("v1");
    let ours = w.preload()["valueFrom"]["configMapKeyRef"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let short = w.dep()["spec"]["template"]["metadata"]["labels"][MANIFEST_SNAPSHOT_LABEL]
        .as_str()
        .unwrap()
        .to_owned();
    let theirs = SnapshotUse {
        short: short.clone(),
        config_map: Some(format!("other-model-manifest-{short}")),
        replica_set: "other-7d4b9c".into(),
        has_pods: true,
        deployment: None,
        revision: None,
    };
    let mine = SnapshotUse {
        short,
        config_map: Some(ours.clone()),
        replica_set: "svc-5f6d7".into(),
        has_pods: true,
        deployment: None,
        revision: None,
    };
    w.replica_sets = vec![theirs.clone(), mine];
    w.resource.deleting = true;
    w.reconcile();
    // The release restarted the pods; the old ReplicaSet still has some.
    w.pods_ready();
    w.reconcile();
    assert!(!w.decide().finished);
    let reconciling = conditions::get(&w.status().conditions, RECONCILING).unwrap();
    assert_eq!(reconciling.reason, reason::DELETION_WAITING);
    assert!(
        reconciling
            .message
            .contains("ReplicaSet svc-5f6d7 reads ConfigMap")
            && reconciling.message.contains(&ours)
            && !reconciling.message.contains("other-7d4b9c"),
        "status says what deletion waits for: {}",
        reconciling.message
    );
    // Our old ReplicaSet is scaled down; the other resource's pods remain.
    w.replica_sets = vec![theirs];
    w.reconcile();
    assert!(w.config_maps.is_empty(), "{:?}", w.config_map_names());
    assert!(
        w.decide().finished,
        "never waits for another resource's pods"
    );
}

/// A log's tail that quotes a request before the service's own failure.
const STARTUP_FAILED: &str = "Processing note: Patient John Smith, DOB 1961-03-14\n\
    huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot \
    folder for the specified revision on the local disk and outgoing traffic has been disabled. \
    To enable repo look-ups and downloads online, set 'HF_HUB_OFFLINE=0' as environment variable.\n\
    ERROR:    Application startup failed. Exiting.";

/// What a condition or an Event may say of [`STARTUP_FAILED`].
const STARTUP_FAILED_QUOTED: &str = "exit code 3: huggingface_hub.errors.LocalEntryNotFoundError: \
    Cannot find an appropriate cached snapshot folder for the specified revision on the local \
    disk and outgoing traffic has been disabled. To enable repo look-ups and downloads online, \
    set 'HF_HUB_OFFLINE=0' as environment variable.";

/// Neither the events nor the status hold a word of the request.
fn assert_no_request_text(w: &World, events: &[Event]) {
    let status = serde_json::to_string(&w.status()).unwrap();
    for text in events
        .iter()
        .map(|e| e.message.as_str())
        .chain([status.as_str()])
    {
        for private in ["John", "Smith", "1961", "Patient"] {
            assert!(!text.contains(private), "{private} in {text}");
        }
    }
}

#[test]
fn a_pod_of_the_new_template_that_keeps_crashing_fails_the_rollout_at_once() {
    let mut w = World::ready_at("v1");
    w.crashing_pod("svc-v1-old", 5, "an old pod's trouble");
    w.set_version("v2");
    w.now += 10;
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::RollingOut));
    // One restart is not yet a crash loop, and the old template's pods
    // never count.
    w.crashing_pod("svc-v2-a", 1, STARTUP_FAILED);
    w.now += 10;
    assert!(w.reconcile().is_empty());
    assert_eq!(w.status().phase, Some(Phase::RollingOut));

    w.crashing_pod("svc-v2-a", 2, STARTUP_FAILED);
    w.now += 10;
    let events = w.reconcile();
    assert_eq!(
        reasons(&events),
        [reason::ROLLOUT_FAILED, reason::ROLLBACK_STARTED],
        "long before the 600 s deadline"
    );
    assert_eq!(
        events[0].message,
        format!(
            "v2 did not become ready: pod svc-v2-a keeps crashing: container openmed-service \
             restarted 2 times, {STARTUP_FAILED_QUOTED}"
        )
    );
    assert_no_request_text(&w, &events);
    let s = w.status();
    assert_eq!(s.phase, Some(Phase::RolledBack));
    assert_eq!(s.rollback_request.as_deref(), Some("automatic:v1"));
    assert_eq!(
        w.cm_version(),
        "v1",
        "the same rollback as after a deadline"
    );
}

#[test]
fn fail_fast_can_be_turned_off_and_a_deadline_failure_quotes_the_pod() {
    let mut w = World::ready_at("v1");
    let mut off = spec("v2");
    off["rolloutStrategy"] = json!({"failFast": {"enabled": false}});
    w.set_spec(off);
    w.now += 10;
    w.reconcile();
    w.crashing_pod("svc-v2-a", 7, STARTUP_FAILED);
    w.now += 10;
    assert!(w.reconcile().is_empty(), "no fail-fast when turned off");
    w.now += 600;
    w.deadline_exceeded();
    let events = w.reconcile();
    assert_eq!(
        reasons(&events),
        [reason::ROLLOUT_FAILED, reason::ROLLBACK_STARTED]
    );
    assert!(
        events[0].message.ends_with(&format!(
            "has timed out progressing.; pod svc-v2-a: {STARTUP_FAILED_QUOTED}"
        )),
        "{}",
        events[0].message
    );
    assert_no_request_text(&w, &events);
}

#[test]
fn a_pod_of_the_new_template_that_fails_the_quality_gate_fails_the_rollout_at_once() {
    let gate = json!({"configMapRef": {"name": "probes"}, "minRecall": {"DATE": 0.95}});
    let mut w = World::ready_at("v1");
    w.dep()["spec"]["template"]["spec"]["containers"][0]["ports"] =
        json!([{"name": "http", "containerPort": 8080}]);
    let mut gated = spec("v1");
    gated["qualityGate"] = gate.clone();
    w.set_spec(gated);
    w.now += 10;
    w.reconcile();
    let conditions = w.status().conditions.clone();
    assert_eq!(
        w.dep()["spec"]["template"]["spec"]["readinessGates"],
        json!([{"conditionType": "openmed.ai/model-quality"}]),
        "adding the gate is a rollout of the same version: {conditions:?}"
    );
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::Ready));

    let mut next = spec("v2");
    next["qualityGate"] = gate;
    w.set_spec(next);
    w.now += 10;
    w.reconcile();
    w.judged_pod("svc-v2-b", true, "passed: DATE recall 1.00 (3/3)");
    w.now += 10;
    assert!(w.reconcile().is_empty(), "a pod that passed is no failure");
    const MISSED: &str = "DATE recall 0.00 is below 0.95 (minRecall): DATE recall 0.00 (0/3), NAME recall 1.00 (4/4)";
    w.judged_pod("svc-v2-a", false, MISSED);
    w.now += 10;
    let events = w.reconcile();
    assert_eq!(
        reasons(&events),
        [reason::ROLLOUT_FAILED, reason::ROLLBACK_STARTED]
    );
    assert_eq!(
        events[0].message,
        format!("v2 did not become ready: pod svc-v2-a failed the quality gate: {MISSED}")
    );
    assert_eq!(w.status().phase, Some(Phase::RolledBack));
    assert_eq!(w.cm_version(), "v1");
}

/// A probe set of one text with one DATE, and the scores of a model
/// that finds it (`true`) or not.
fn probe_scores(finds_the_date: bool) -> (crate::api::quality::ProbeSet, quality::Scores) {
    let set = crate::api::quality::parse_probe_set(&json!({
        "apiVersion": "openmed.ai/v1alpha1", "kind": "PIIProbeSet",
        "probes": [{"text": "Seen on 2024-03-15.", "entities": [{"label": "DATE", "start": 8, "end": 18}]}],
    }))
    .unwrap();
    let found = if finds_the_date {
        vec![crate::api::quality::Span {
            label: "DATE".into(),
            start: 8,
            end: 18,
        }]
    } else {
        Vec::new()
    };
    let scores = quality::score(&set, &[quality::Answer::Found(found)]).unwrap();
    (set, scores)
}

#[test]
fn the_gates_marks_are_writes_of_the_decision_and_a_failed_one_fails_the_rollout() {
    let gate = json!({"configMapRef": {"name": "probes"}, "minRecall": {"DATE": 0.95}});
    let mut w = World::ready_at("v1");
    w.dep()["spec"]["template"]["spec"]["containers"][0]["ports"] =
        json!([{"containerPort": 8080}]);
    let mut next = spec("v2");
    next["qualityGate"] = gate;
    w.set_spec(next);
    w.now += 10;
    w.reconcile();
    w.warm_pod("svc-v2-a");
    w.warm_pod("svc-v2-b");
    // Nothing measured yet: the pods wait, and the gate looks again soon.
    let waiting = w.decide();
    assert!(waiting.writes.is_empty() && waiting.events.is_empty());
    assert_eq!(
        waiting.requeue_after,
        Some(std::time::Duration::from_secs(quality::RETRY_SECONDS))
    );

    let plans = w.probe_plan();
    let [plan] = plans.as_slice() else {
        panic!("one round, the gate's: {plans:?}")
    };
    assert_eq!(plan.purpose, quality::Purpose::Gate);
    assert_eq!(plan.gate.config_map_ref.name, "probes");
    let asked: Vec<(&str, &str, &str)> = plan
        .requests
        .iter()
        .map(|r| (r.pod.as_str(), r.url.as_str(), r.version.as_str()))
        .collect();
    assert_eq!(
        asked,
        [
            ("svc-v2-a", "http://10.0.0.1:8080/pii/extract", "v2"),
            ("svc-v2-b", "http://10.0.0.2:8080/pii/extract", "v2"),
        ]
    );
    let (set, good) = probe_scores(true);
    let (_, bad) = probe_scores(false);
    w.probes = vec![quality::ProbeRound {
        plan: plan.clone(),
        set: Ok(set),
        answers: vec![
            quality::PodAnswer {
                pod: "svc-v2-a".into(),
                scores: Ok(good),
            },
            quality::PodAnswer {
                pod: "svc-v2-b".into(),
                scores: Ok(bad),
            },
        ],
    }];
    w.now += 1;
    let events = w.reconcile();
    assert_eq!(
        w.writes[..2],
        [
            Write::MarkPod {
                name: "svc-v2-a".into(),
                passed: true,
                reason: reason::QUALITY_GATE_PASSED,
                message: "passed: DATE recall 1.00 (1/1) precision 1.00".into(),
            },
            Write::MarkPod {
                name: "svc-v2-b".into(),
                passed: false,
                reason: reason::QUALITY_GATE_FAILED,
                message: "DATE recall 0.00 is below 0.95 (minRecall): DATE recall 0.00 (0/1)"
                    .into(),
            },
        ]
    );
    assert_eq!(
        reasons(&events),
        [
            reason::QUALITY_GATE_PASSED,
            reason::QUALITY_GATE_FAILED,
            reason::ROLLOUT_FAILED,
            reason::ROLLBACK_STARTED
        ]
    );
    assert!(
        events[2]
            .message
            .ends_with("pod svc-v2-b failed the quality gate: DATE recall 0.00 is below 0.95 (minRecall): DATE recall 0.00 (0/1)"),
        "{}",
        events[2].message
    );
    assert_eq!(w.status().phase, Some(Phase::RolledBack));
}

#[test]
fn a_bound_on_a_label_the_probe_set_lacks_refuses_the_spec_once_the_set_is_read() {
    let mut w = World::ready_at("v1");
    w.dep()["spec"]["template"]["spec"]["containers"][0]["ports"] =
        json!([{"containerPort": 8080}]);
    let mut next = spec("v2");
    next["qualityGate"] = json!({"configMapRef": {"name": "probes"}, "minRecall": {"DATES": 1.0}});
    w.set_spec(next);
    w.now += 10;
    w.reconcile();
    w.warm_pod("svc-v2-a");
    let [plan] = w.probe_plan().try_into().expect("the gate's round");
    let (set, misses_the_date) = probe_scores(false);
    w.probes = vec![quality::ProbeRound {
        plan,
        set: Ok(set),
        answers: vec![quality::PodAnswer {
            pod: "svc-v2-a".into(),
            scores: Ok(misses_the_date),
        }],
    }];
    w.now += 1;
    let events = w.reconcile();
    assert!(
        !w.writes.iter().any(|w| matches!(w, Write::MarkPod { .. })),
        "no pod is judged against a bound that bounds nothing: {:?}",
        w.writes
    );
    assert_eq!(reasons(&events), [reason::INVALID_SPEC]);
    assert!(
        events[0]
            .message
            .starts_with("spec.qualityGate.minRecall.DATES: matches no label of the probe set"),
        "{}",
        events[0].message
    );
    assert_eq!(
        w.condition(conditions::STALLED),
        ("True".into(), reason::INVALID_SPEC.into())
    );
}

#[test]
fn a_gate_on_a_container_that_declares_no_port_says_so_at_once_and_writes_nothing() {
    let mut w = World::ready_at("v1");
    let mut gated = spec("v2");
    gated["qualityGate"] = json!({"configMapRef": {"name": "probes"}});
    w.set_spec(gated);
    w.now += 10;
    let events = w.reconcile();
    assert!(w.writes.is_empty(), "{:?}", w.writes);
    assert_eq!(reasons(&events), [reason::QUALITY_GATE_PORT_UNKNOWN]);
    assert_eq!(
        events[0].message,
        "the quality gate cannot reach the service: container openmed-service of Deployment svc declares no port, and no httpGet probe names one; declare its HTTP port (named http) or give it an httpGet readiness probe"
    );
    assert_eq!(
        w.condition(conditions::READY),
        ("False".into(), reason::QUALITY_GATE_PORT_UNKNOWN.into())
    );
    // Said once; a probe's port is enough.
    w.now += 10;
    assert!(w.reconcile().is_empty());
    w.dep()["spec"]["template"]["spec"]["containers"][0]["readinessProbe"] =
        json!({"httpGet": {"path": "/readyz", "port": 8080}});
    w.now += 10;
    assert_eq!(reasons(&w.reconcile()), [reason::ROLLOUT_STARTED]);
}

#[test]
fn a_higher_fail_fast_threshold_waits_for_more_restarts() {
    let mut w = World::ready_at("v1");
    let mut patient = spec("v2");
    patient["rolloutStrategy"] = json!({"failFast": {"restarts": 4}});
    w.set_spec(patient);
    w.now += 10;
    w.reconcile();
    w.crashing_pod("svc-v2-a", 3, STARTUP_FAILED);
    w.now += 10;
    assert!(w.reconcile().is_empty());
    w.crashing_pod("svc-v2-a", 4, STARTUP_FAILED);
    w.now += 10;
    assert_eq!(
        reasons(&w.reconcile()),
        [reason::ROLLOUT_FAILED, reason::ROLLBACK_STARTED]
    );
}

// ---- which pods a rollout is judged by ----

#[test]
fn restarts_from_before_a_rollout_do_not_fail_an_edit_that_keeps_the_model() {
    let mut w = World::ready_at("v1");
    let replica_set = w.controller_rolls();
    w.pods_ready();
    // Two restarts last week: an OOM kill, a node hiccup.
    let week_ago = w.now - 7 * 86_400;
    w.crashing_pod_of("svc-v1-a", &replica_set, week_ago, 2, "Killed");
    w.pods[0].containers[0].last_exit_at = Some(at(week_ago + 3600).0.as_second());
    let mut more = spec("v1");
    more["replicas"] = json!(3);
    w.set_spec(more);
    w.now += 10;
    w.reconcile();
    assert_eq!(
        w.controller_rolls(),
        replica_set,
        "the template is the same: so is its ReplicaSet"
    );
    w.now += 10;
    let events = w.reconcile();
    assert!(
        !reasons(&events).contains(&reason::ROLLOUT_FAILED),
        "an old restart count is no crash loop: {events:?}"
    );
    assert_eq!(w.status().phase, Some(Phase::RollingOut));
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::Ready));

    // The same pod held back after a failed exit during a rollout is one.
    let mut four = spec("v1");
    four["replicas"] = json!(4);
    w.set_spec(four);
    w.now += 10;
    w.reconcile();
    w.controller_rolls();
    w.now += 10;
    let c = &mut w.pods[0].containers[0];
    c.restarts = 3;
    c.waiting = Some(pods::CRASH_LOOP_BACK_OFF.into());
    c.last_exit_at = Some(at(w.now - 1).0.as_second());
    let events = w.reconcile();
    assert_eq!(reasons(&events)[0], reason::ROLLOUT_FAILED, "{events:?}");
    assert!(
        events[0].message.contains("pod svc-v1-a keeps crashing"),
        "{}",
        events[0].message
    );
}

#[test]
fn pods_of_other_deployments_serving_the_same_model_never_fail_a_rollout() {
    let mut w = World::ready_at("v1");
    w.set_version("v2");
    w.now += 10;
    w.reconcile();
    w.controller_rolls();
    let created = w.now - 5;
    // A canary's pod runs this resource's model on another Deployment's
    // ReplicaSet; another resource serving v2 in the namespace has its own.
    w.crashing_pod_of("canary-a", "svc-canary-5d8f", created, 9, STARTUP_FAILED);
    w.crashing_pod_of("other-a", "other-7c4b", created, 9, STARTUP_FAILED);
    w.pods[1].owner = Some("ns/other".into());
    w.now += 10;
    let events = w.reconcile();
    assert!(
        events.is_empty(),
        "neither is this rollout's pod: {events:?}"
    );
    assert_eq!(w.status().phase, Some(Phase::RollingOut));
}

#[test]
fn no_pod_fails_a_rollout_before_the_controller_has_seen_its_generation() {
    let mut w = World::ready_at("v1");
    let earlier = w.controller_rolls();
    w.pods_ready();
    w.set_version("v2");
    w.now += 10;
    w.reconcile();
    // The Deployment's write landed; the controller has not seen it. A pod
    // with restarts runs on the ReplicaSet of the previous revision.
    let created = w.now;
    w.crashing_pod_of("svc-v1-a", &earlier, created, 5, STARTUP_FAILED);
    w.pods[0].snapshot = w.template_snapshot();
    w.now += 10;
    let events = w.reconcile();
    assert!(events.is_empty(), "not yet observed: {events:?}");
    assert_eq!(w.status().phase, Some(Phase::RollingOut));
    // Once it has, the new ReplicaSet's crashing pod fails it at once.
    w.crashing_pod("svc-v2-a", 2, STARTUP_FAILED);
    w.now += 10;
    assert_eq!(
        reasons(&w.reconcile()),
        [reason::ROLLOUT_FAILED, reason::ROLLBACK_STARTED]
    );
}
