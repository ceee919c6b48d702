//! The rollout state machine, as one pure function:
//! [`decide`]`(observed) -> `[`Decision`] (writes, new status, events).
//!
//! Every rule about rollouts, rollbacks, drift, target problems and deletion
//! lives here and is tested here with a fixed clock; the operator shell only
//! gathers the [`Observed`] world, carries out the [`Decision`] and asks
//! again. All state lives in the resource's status and in annotations, so
//! deciding again after a crash at any point converges to the same result.
//!
//! The shell's loop, which makes every step restart-safe:
//!
//! 1. `decide`; write the new status if it differs (it records the intent,
//!    e.g. "rolling back, rollbackCount + 1", *before* anything is changed);
//! 2. emit the events; carry out the writes in order;
//! 3. decide again with what the writes returned, until no write is left.
//!    A status whose `targetDeploymentGeneration` is unset then records the
//!    generation the Deployment write produced.

pub mod analysis;
pub mod autoscaling;
mod canary;
pub mod conditions;
pub mod crash_loop;
mod decision;
pub mod drain;
mod evidence;
pub mod finalizers;
pub mod pods;
pub mod progress;
pub mod quality;
mod release;
mod resource;
pub mod route;
mod serving;
pub mod soak;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

pub use canary::{analysis_checks, canary_target_name, route_name, route_to_read};
pub use decision::{Decision, Event, EventType, Write, action, reason};
pub use resource::{ResourceView, config_map_names, is_rival, target_name, target_name_of};

use crate::api::names::{
    MANAGED_OPT_IN_LABEL, MANIFEST_HASH_ANNOTATION, MANIFEST_SNAPSHOT_LABEL,
    MODEL_RESOURCE_ANNOTATION, PRELOAD_ENV, ROLLBACK_TO_ANNOTATION,
};
use crate::api::{OpenMedModelSpec, OpenMedModelStatus, Phase, StrategyType, TargetFacts};
use crate::plan::{self, Plan, TargetOptions};
use conditions::{DEGRADED, PROGRESSING, READY, RECONCILING, ROLLED_BACK, SOAKED, STALLED, Status};
use progress::Progress;

/// Switches that change policy, set on the operator's command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// Act only on Deployments labelled `openmed.ai/managed=true`.
    pub require_target_label: bool,
    /// The analysis endpoints the operator may call (`--analysis-allow`);
    /// empty: none.
    pub analysis_allow: crate::api::endpoints::AllowList,
    /// The operator watches KEDA ScaledObjects (`--keda`), so
    /// `spec.autoscaling.keda` can be carried out.
    pub keda: bool,
}

/// Another OpenMedModel that names the same target Deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rival {
    /// `<namespace>/<name>`.
    pub key: String,
    /// Its creation time: the oldest claim wins when nobody holds the target.
    pub created: Option<Time>,
}

/// Everything `decide` looks at.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    /// The OpenMedModel.
    pub resource: &'a ResourceView,
    /// The Deployment named by the spec ([`target_name`]), if it exists.
    pub target: Option<&'a Deployment>,
    /// The HorizontalPodAutoscalers in the resource's namespace that
    /// concern it ([`autoscaling::concerns`]): whether one scales the
    /// target, and the resource's own.
    pub autoscalers: &'a [&'a HorizontalPodAutoscaler],
    /// The KEDA ScaledObject of the resource's name, as JSON, when the
    /// operator watches them ([`Settings::keda`]) and it exists.
    pub scaled_object: Option<&'a Value>,
    /// Other OpenMedModels naming the same Deployment.
    pub rivals: &'a [Rival],
    /// Deployments in the namespace whose `openmed.ai/model-resource`
    /// annotation names this resource (the target among them, once claimed).
    pub claimed: &'a [&'a Deployment],
    /// The ConfigMaps named by [`config_map_names`] that exist, and every
    /// ConfigMap this resource owns.
    pub config_maps: &'a [&'a ConfigMap],
    /// The snapshots that ReplicaSets in the namespace reference (by their
    /// `openmed.ai/model-manifest` label), revision history included: a
    /// snapshot one of them references is kept, whatever `kubectl rollout
    /// undo` or a recreated pod may still need.
    pub snapshot_uses: &'a [SnapshotUse],
    /// The canary Deployment `spec.canary.targetRef` names, if it exists.
    pub canary_target: Option<&'a Deployment>,
    /// The HTTPRoute of the canary ([`route_name`]), as JSON, if it exists.
    pub route: Option<&'a Value>,
    /// The readings of the checks [`analysis_checks`] asked for, taken
    /// just before this decision; empty when none were due.
    pub measurements: &'a [analysis::Measurement],
    /// The probe rounds [`quality::probe_plan`] asked for, carried out
    /// just before this decision; empty when none were due, and once a
    /// decision made on them has been carried out.
    pub probes: &'a [quality::ProbeRound],
    /// Pods with the snapshot label in the resource's namespace (the
    /// operator watches no others): how the new template's pods fare.
    pub pods: &'a [pods::PodView],
    /// Policy switches.
    pub settings: Settings,
    /// The time to stamp on conditions and events.
    pub now: Time,
}

/// One ReplicaSet's use of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SnapshotUse {
    /// The snapshot's short hash (the ReplicaSet's label value).
    pub short: String,
    /// The ConfigMap its pod template's preload variable reads, when
    /// known. Two resources serving the same model share the short hash
    /// but never the snapshot's name, so this is what says whose it is.
    pub config_map: Option<String>,
    /// The ReplicaSet's name, to say what a deletion waits for.
    pub replica_set: String,
    /// The ReplicaSet has or wants pods: one of them may start, and read
    /// the snapshot, at any moment.
    pub has_pods: bool,
    /// The UID of the Deployment that controls it.
    pub deployment: Option<String>,
    /// Its `deployment.kubernetes.io/revision`: which of that Deployment's
    /// rollouts made it.
    pub revision: Option<String>,
}

impl SnapshotUse {
    /// Whether pods of this ReplicaSet read `config_map`: by its name when
    /// the template is known, else by the snapshot label alone.
    pub fn reads(&self, config_map: &ConfigMap) -> bool {
        match &self.config_map {
            Some(name) => config_map.metadata.name.as_deref() == Some(name.as_str()),
            None => config_map
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(MANIFEST_SNAPSHOT_LABEL))
                .is_some_and(|short| *short == self.short),
        }
    }
}

/// How the spec to apply was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `spec` itself.
    Forward,
    /// The retained spec an automatic rollback restored, kept until the spec changes.
    Automatic,
    /// The retained spec named by `openmed.ai/rollback-to`.
    Manual,
}

/// Decides what to do about one OpenMedModel.
pub fn decide(obs: &Observed) -> Decision {
    // The canary's probes, carried out by the shell, are one more reading
    // of the step's analysis.
    let mut measurements = obs.measurements.to_vec();
    measurements.extend(quality::canary_reading(obs.probes));
    let obs = &Observed {
        measurements: &measurements,
        ..obs.clone()
    };
    let mut step = Step::new(obs);
    if obs.resource.deleting {
        step.release_everything();
    } else {
        step.reconcile();
        step.judge_quality();
        step.soak_abort_ignored();
    }
    step.finish()
}

/// The decision being built.
struct Step<'a> {
    obs: &'a Observed<'a>,
    old: &'a OpenMedModelStatus,
    status: OpenMedModelStatus,
    writes: Vec<Write>,
    events: Vec<Event>,
    requeue_after: Option<Duration>,
    finished: bool,
    /// When the rollout's Deployment write landed, on the API server's
    /// clock, once the Deployment shows it.
    landed: Option<Time>,
    /// See [`Decision::needs_live_reads`].
    gave_up: bool,
    /// `rolloutStrategy.soakSeconds` of the valid spec (0 until read).
    soak_seconds: i64,
    /// `spec.autoscaling` of the valid spec (unset until read): while it
    /// is set, no plan writes `replicas`.
    autoscaling: Option<crate::api::Autoscaling>,
}

/// Which owned things differ from the plan.
#[derive(Debug, Default)]
struct Changes {
    /// Fields of the target Deployment.
    deployment: Vec<&'static str>,
    /// The snapshot the template references.
    snapshot: Vec<&'static str>,
    /// The pointer, counted only while a template reads it.
    pointer: Vec<&'static str>,
}

impl Changes {
    fn any(&self) -> bool {
        !(self.deployment.is_empty() && self.snapshot.is_empty() && self.pointer.is_empty())
    }
}

impl<'a> Step<'a> {
    fn new(obs: &'a Observed<'a>) -> Self {
        let old = &obs.resource.status;
        let mut status = old.clone();
        status.observed_generation = Some(obs.resource.generation);
        // The shell reports a failed reconcile in a condition; a decision
        // being made means the error is behind us.
        status
            .conditions
            .retain(|c| c.reason != reason::RETRYING_AFTER_ERROR);
        Step {
            obs,
            old,
            status,
            writes: Vec::new(),
            events: Vec::new(),
            requeue_after: None,
            finished: false,
            landed: None,
            gave_up: false,
            soak_seconds: 0,
            autoscaling: None,
        }
    }

    fn finish(mut self) -> Decision {
        self.soaked_only_for_the_desired_spec();
        conditions::keep_transitions(&mut self.status.conditions, &self.old.conditions);
        let reported = conditions::get(&self.old.conditions, RECONCILING)
            .is_some_and(|c| c.reason == reason::RETRYING_AFTER_ERROR);
        if reported && conditions::get(&self.status.conditions, RECONCILING).is_none() {
            // The path taken sets no Reconciling of its own (a terminal
            // phase): say the error is over rather than drop the condition.
            self.condition(
                RECONCILING,
                false,
                reason::ERROR_RESOLVED,
                "the last reconcile succeeded",
            );
        }
        if let Some(landed) = self.landed.take()
            && self.status != *self.old
        {
            // The landed time rides with a status written anyway.
            self.status.last_rollout_time = Some(landed);
        }
        Decision {
            status: self.status,
            writes: self.writes,
            events: self.events,
            requeue_after: self.requeue_after,
            finished: self.finished,
            needs_live_reads: self.gave_up,
        }
    }

    fn generation(&self) -> i64 {
        self.obs.resource.generation
    }

    fn condition(
        &mut self,
        type_: &str,
        status: impl Into<Status>,
        reason: &str,
        message: impl Into<String>,
    ) {
        let generation = self.generation();
        conditions::set(
            &mut self.status.conditions,
            type_,
            status,
            reason,
            message,
            generation,
            &self.obs.now,
        );
    }

    fn event(&mut self, type_: EventType, reason: &'static str, message: impl Into<String>) {
        self.events.push(Event {
            type_,
            reason,
            message: message.into(),
        });
    }

    /// True when the Ready condition did not already carry `reason`: the
    /// moment to tell people about it, once, not on every pass.
    fn entering(&self, reason: &str) -> bool {
        conditions::get(&self.old.conditions, READY).is_none_or(|c| c.reason != reason)
    }

    fn plan(&self, spec: &OpenMedModelSpec) -> Plan {
        plan::plan(
            &self.obs.resource.id(),
            spec,
            TargetOptions {
                autoscaled: self.autoscaled(),
            },
        )
    }

    /// An autoscaler scales the target, or the spec asks for one: the
    /// count is not the operator's to write.
    fn autoscaled(&self) -> bool {
        let target = target_name(self.obs.resource);
        self.autoscaling.is_some()
            || self
                .obs
                .autoscalers
                .iter()
                .any(|h| autoscaling::scales(h, &target))
    }

    /// A retained spec, placed on the target and pointer `desired` names
    /// ([`plan::placed_as`]): what a rollback or a canary's stable side
    /// applies.
    fn retained_plan(&self, retained: &OpenMedModelSpec, desired: &Plan) -> Plan {
        self.plan(&plan::placed_as(retained, &desired.normalized))
    }

    // ---- the normal path ----

    fn reconcile(&mut self) {
        let obs = self.obs;
        let facts = obs.target.map(|t| TargetFacts {
            min_ready_seconds: progress::min_ready_seconds(t),
        });
        let spec = match crate::api::validate_spec(&obs.resource.spec, facts.as_ref()) {
            Ok(spec) => spec,
            Err(errors) => {
                self.end_canary_blocked("the spec is invalid");
                return self.invalid(&errors);
            }
        };
        // What only the probe set can tell: a bound on a label it does
        // not have, which would bound nothing.
        let unmatched = quality::unmatched_bounds(obs.probes);
        if !unmatched.is_empty() {
            self.end_canary_blocked("the spec is invalid");
            return self.invalid(&unmatched);
        }
        self.soak_seconds = i64::from(spec.rollout_strategy.soak_seconds.unwrap_or(0));
        self.autoscaling = spec.autoscaling.clone();
        let desired = self.plan(&spec);
        self.status.desired_version = Some(desired.normalized.version.clone());
        self.status.desired_spec_hash = Some(desired.spec_hash.clone());

        let (mode, mut wanted) = match self.wanted(&desired) {
            Ok(chosen) => chosen,
            Err(rejection) => {
                self.end_canary_blocked(
                    "a rollback to a version that is not retained was asked for",
                );
                return self.reject_rollback(&rejection);
            }
        };
        let canary = spec.canary.as_ref();
        // A pointer every new pod would refuse is never rolled out.
        if let Some(message) = crate::api::rules::version_refusal(&wanted.normalized.version) {
            let canaries = self.canary_deployments(canary);
            self.release_stale(&wanted, &canaries);
            self.end_canary_blocked(&message);
            return self.blocked(reason::VERSION_NOT_A_MODEL_ID, message);
        }
        // A target that is missing or cannot be written holds everything,
        // before a canary may start: one started now would only be ended by
        // this same decision, and again by the next.
        let problem = match obs.target {
            None => Some((
                reason::TARGET_NOT_FOUND,
                format!(
                    "Deployment {} not found in namespace {}",
                    wanted.deployment.name, obs.resource.namespace
                ),
            )),
            Some(target) => self.target_problem(target, &wanted),
        };
        if let Some((why, message)) = problem {
            let canaries = self.canary_deployments(canary);
            self.release_stale(&wanted, &canaries);
            self.end_canary_blocked(&message);
            return self.blocked(why, message);
        }
        let target = obs.target.expect("checked above");
        self.autoscale(&wanted.deployment.name);
        // Pods that would refuse the version's name are refused before a
        // canary starts or a pod is replaced.
        if let Err((why, message)) = self.serve(&mut wanted, target) {
            let canaries = self.canary_deployments(canary);
            self.release_stale(&wanted, &canaries);
            self.end_canary_blocked(&message);
            return self.blocked(why, message);
        }
        let part = self.canary_part(canary, &desired, mode);
        if let canary::Part::Hold(stable) = &part {
            wanted = (**stable).clone();
            if let Err((why, message)) = self.serve(&mut wanted, target) {
                return self.blocked(why, message);
            }
        }
        let canaries = self.canary_deployments(canary);
        self.release_stale(&wanted, &canaries);
        self.fit_to_target(&mut wanted, target);
        let changes = self.changes(&wanted, target);

        if self.status.applied_spec_hash.as_deref() != Some(&wanted.spec_hash) {
            self.start(mode, &desired, &wanted);
            self.write_fields(&wanted, target, &changes);
            return;
        }
        if changes.any() {
            // With no generation recorded, the last decision's own writes
            // have not all landed (a crash or an error cut them short):
            // finishing them is not a correction of someone else's change.
            let unfinished = self.writes_unlanded(target);
            let noticed: Vec<&str> = changes
                .snapshot
                .iter()
                .chain(&changes.pointer)
                .chain(&changes.deployment)
                .copied()
                .filter(|c| !ADOPTION.contains(c))
                .collect();
            if !noticed.is_empty() && !unfinished {
                self.event(
                    EventType::Warning,
                    reason::DRIFT_CORRECTED,
                    format!("restored {} changed by another writer", noticed.join(", ")),
                );
            }
            self.write_fields(&wanted, target, &changes);
            return;
        }
        if self.status.target_deployment_generation.is_none() {
            self.status.target_deployment_generation = target.metadata.generation;
            if let Some(landed) = progress::applied_at(target) {
                self.status.last_rollout_time = Some(landed);
            }
        }
        // Judge the deadline on the server's clock: the time our write
        // landed, as the API server recorded it, is what the Deployment
        // controller's condition times are compared with. It is read from
        // the Deployment, and the status takes it with its next write.
        if self.status.target_deployment_generation == target.metadata.generation {
            self.landed = progress::applied_at(target);
        }
        match &part {
            canary::Part::Hold(_) => {
                // Without spec.canary, a hold is that of a failed canary:
                // nothing runs, the stable target keeps its model.
                if let Some(canary) = canary {
                    self.run_canary(canary, &desired, target);
                }
            }
            canary::Part::Promote | canary::Part::None => {
                self.evaluate(mode, &desired, &wanted, target);
                self.after_promotion();
            }
        }
        self.canary_at_rest(canary, target);
        if self.writes.is_empty() {
            let keep = self.canary_keeps(&desired, canary);
            self.tidy_config_maps(&desired, &wanted, target, &keep);
        }
    }

    /// Adapts the plan to what the target already is: its served set
    /// ([`Step::serve`]); a template written
    /// before snapshots that reads the pointer holding this very manifest
    /// keeps that reference (an upgrade restarts no pod; the next version
    /// moves it to a snapshot), and the manifest ConfigMaps get the
    /// Deployment as a second owner.
    fn fit_to_target(&self, wanted: &mut Plan, target: &Deployment) {
        // A refusal was said before anything was decided (`reconcile`).
        let _ = self.serve(wanted, target);
        let pointer = wanted.config_map.metadata.name.clone().unwrap_or_default();
        let template = serde_json::to_value(target).expect("a Deployment serializes");
        let hash = template
            .pointer("/spec/template/metadata/annotations")
            .and_then(|a| a.get(MANIFEST_HASH_ANNOTATION))
            .and_then(Value::as_str);
        let reads = template_config_map(&template, &wanted.deployment.container);
        if reads.as_deref() == Some(pointer.as_str()) && hash == Some(&wanted.manifest_hash) {
            wanted.deployment = wanted.deployment.referencing_pointer(&pointer);
        }
        if let (Some(name), Some(uid)) = (&target.metadata.name, &target.metadata.uid) {
            plan::owned_by_target(&mut wanted.config_map, name, uid);
            plan::owned_by_target(&mut wanted.snapshot, name, uid);
        }
    }

    /// What differs between the owned objects and the plan.
    fn changes(&self, wanted: &Plan, target: &Deployment) -> Changes {
        let before = serde_json::to_value(target).expect("a Deployment serializes");
        let mut after = before.clone();
        wanted
            .deployment
            .apply_to(&mut after)
            .expect("target_problem checked the container");
        let drift = |planned: &ConfigMap| match self.find_config_map(name_of(planned)) {
            Some(cm) => config_map_drift(cm, planned),
            None => vec!["ConfigMap missing"],
        };
        let pointer = if self.template_reads_pointer(wanted) {
            drift(&wanted.config_map)
        } else {
            Vec::new()
        };
        let snapshot = if self.template_reads_pointer(wanted) {
            Vec::new()
        } else {
            drift(&wanted.snapshot)
        };
        Changes {
            deployment: changed_fields(&before, &after),
            snapshot,
            pointer,
        }
    }

    fn template_reads_pointer(&self, wanted: &Plan) -> bool {
        wanted.deployment.config_map_name() == wanted.config_map.metadata.name.as_deref()
    }

    /// Once no pod of an older template remains, brings the pointer up to
    /// date and deletes the ConfigMaps nothing can read any more.
    ///
    /// The pointer waits for that moment because a pod of a template
    /// written before snapshots reads it: updating it mid-rollout would
    /// make such a pod, recreated, load the version under test.
    fn tidy_config_maps(
        &mut self,
        desired: &Plan,
        wanted: &Plan,
        target: &Deployment,
        also_keep: &[String],
    ) {
        if !progress::settled(target) {
            return;
        }
        if !self.template_reads_pointer(wanted) {
            let stale = match self.find_config_map(name_of(&wanted.config_map)) {
                Some(cm) => !config_map_drift(cm, &wanted.config_map).is_empty(),
                None => true,
            };
            if stale {
                self.writes
                    .push(Write::ApplyConfigMap(Box::new(wanted.config_map.clone())));
            }
        }
        let observed = serde_json::to_value(target).expect("a Deployment serializes");
        let mut keep: Vec<String> = vec![
            name_of(&wanted.config_map).to_owned(),
            name_of(&desired.config_map).to_owned(),
            name_of(&wanted.snapshot).to_owned(),
        ];
        keep.extend(template_config_map(&observed, &wanted.deployment.container));
        keep.extend(also_keep.iter().cloned());
        for spec in self.status.known_specs() {
            keep.push(name_of(&self.plan(spec).snapshot).to_owned());
            keep.push(name_of(&self.retained_plan(spec, desired).snapshot).to_owned());
        }
        let in_use = |cm: &ConfigMap| self.obs.snapshot_uses.iter().any(|u| u.reads(cm));
        for cm in self.obs.config_maps {
            let name = name_of(cm);
            if self.owns(cm) && !keep.iter().any(|k| k == name) && !in_use(cm) {
                self.writes.push(Write::DeleteConfigMap {
                    name: name.to_owned(),
                    uid: cm.metadata.uid.clone(),
                });
            }
        }
    }

    /// The spec to apply: `spec`, a retained spec named by a manual
    /// rollback, or the spec an automatic rollback restored.
    fn wanted(&self, desired: &Plan) -> Result<(Mode, Plan), Rejection> {
        let status = self.old;
        let retained = [
            &status.last_successful_spec,
            &status.previous_successful_spec,
        ];
        if let Some(version) = self.obs.resource.annotations.get(ROLLBACK_TO_ANNOTATION) {
            let found = retained
                .iter()
                .filter_map(|s| s.as_ref())
                .find(|s| &s.version == version);
            return match found {
                Some(spec) => {
                    let plan = self.retained_plan(spec, desired);
                    let mode = if plan.spec_hash == desired.spec_hash {
                        Mode::Forward
                    } else {
                        Mode::Manual
                    };
                    Ok((mode, plan))
                }
                None => Err(Rejection {
                    version: version.clone(),
                    retained: retained_versions(status),
                }),
            };
        }
        // An automatic rollback holds while the spec hashes to the one that
        // failed; a change to a field the operator hashes asks for another
        // try. An edit of anything else (spec.canary, a default spelled
        // out) is none: the admission policy lets it through without a
        // retry reason, so it must not roll the failed version out again.
        let holding = status
            .rollback_request
            .as_deref()
            .is_some_and(|r| r.starts_with("automatic:"))
            && status.failed_spec_hash.as_deref() == Some(&desired.spec_hash);
        if holding && let Some(restored) = &status.rollback_spec {
            return Ok((Mode::Automatic, self.retained_plan(restored, desired)));
        }
        Ok((Mode::Forward, desired.clone()))
    }

    /// Why the target cannot be written, if it cannot.
    fn target_problem(&self, target: &Deployment, wanted: &Plan) -> Option<(&'static str, String)> {
        let obs = self.obs;
        let name = &wanted.deployment.name;
        let labels = target.metadata.labels.as_ref();
        if obs.settings.require_target_label
            && labels
                .and_then(|l| l.get(MANAGED_OPT_IN_LABEL))
                .map(String::as_str)
                != Some("true")
        {
            return Some((
                reason::TARGET_NOT_OPTED_IN,
                format!(
                    "Deployment {name} is not labelled {MANAGED_OPT_IN_LABEL}=true, which this operator requires"
                ),
            ));
        }
        if let Some(holder) = self.rival_holding(target) {
            return Some((
                reason::TARGET_CONFLICT,
                format!("Deployment {name} is managed by OpenMedModel {holder}"),
            ));
        }
        let mut copy = serde_json::to_value(target).expect("a Deployment serializes");
        if let Err(missing) = wanted.deployment.apply_to(&mut copy) {
            return Some((reason::CONTAINER_NOT_FOUND, missing.to_string()));
        }
        // A gated pod the gate cannot ask is never Ready: say so before
        // any pod waits for it.
        let container = &wanted.deployment.container;
        if wanted.deployment.quality_gate && quality::service_port(target, container).is_none() {
            return Some((
                reason::QUALITY_GATE_PORT_UNKNOWN,
                quality::port_unknown(target, container),
            ));
        }
        let cm_name = wanted
            .config_map
            .metadata
            .name
            .as_deref()
            .unwrap_or_default();
        for name in [cm_name, name_of(&wanted.snapshot)] {
            if let Some(cm) = self.find_config_map(name)
                && !self.owns(cm)
            {
                return Some((
                    reason::TARGET_CONFLICT,
                    format!(
                        "ConfigMap {name} exists and is not owned by this OpenMedModel; set spec.manifestConfigMapName to another name"
                    ),
                ));
            }
        }
        None
    }

    /// The rival that holds the target: the one its annotation names or,
    /// when none does, the oldest claim (then the first name).
    fn rival_holding(&self, target: &Deployment) -> Option<String> {
        let me = self.obs.resource.key();
        let holder = target
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MODEL_RESOURCE_ANNOTATION));
        if holder == Some(&me) {
            return None;
        }
        if let Some(holder) = holder
            && self.obs.rivals.iter().any(|r| &r.key == holder)
        {
            return Some(holder.clone());
        }
        let mine = (self.obs.resource.created.as_ref().map(|t| t.0), me.clone());
        self.obs
            .rivals
            .iter()
            .map(|r| (r.created.as_ref().map(|t| t.0), r.key.clone()))
            .filter(|theirs| claim_order(theirs, &mine).is_lt())
            .min_by(claim_order)
            .map(|(_, key)| key)
    }

    fn find_config_map(&self, name: &str) -> Option<&'a ConfigMap> {
        self.obs
            .config_maps
            .iter()
            .copied()
            .find(|cm| cm.metadata.name.as_deref() == Some(name))
    }

    /// Owned: an owner reference to this resource, or (written by `render`
    /// before the operator saw it) the ownership annotation.
    fn owns(&self, cm: &ConfigMap) -> bool {
        let r = self.obs.resource;
        let by_reference = cm
            .metadata
            .owner_references
            .as_ref()
            .is_some_and(|refs| refs.iter().any(|o| o.uid == r.uid));
        let by_annotation = cm
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MODEL_RESOURCE_ANNOTATION))
            .is_some_and(|v| *v == r.key());
        let foreign_controller = cm.metadata.owner_references.as_ref().is_some_and(|refs| {
            refs.iter()
                .any(|o| o.controller == Some(true) && o.uid != r.uid)
        });
        by_reference || (by_annotation && !foreign_controller)
    }

    /// Writes what differs on the target, and keeps the generation to
    /// judge its progress by.
    fn write_fields(&mut self, wanted: &Plan, target: &Deployment, changes: &Changes) {
        // The generation to judge progress by is the one our write
        // produces. The shell writes a Deployment only at the
        // resourceVersion it was decided on, so one write that changes the
        // spec produces exactly the observed generation plus one, and the
        // status written before it can say so: no second status write once
        // it lands. Until the Deployment reaches that generation, the
        // writes are ours and unfinished. A strategy reset is a second
        // spec write (whether the apply after it still changes the spec
        // depends on the server's defaults), so it leaves the generation
        // unset for the next pass to record. A metadata-only write leaves
        // the generation, and the rollout's clock, as they are.
        let before = self.writes.len();
        let spec_written = self.push_writes(wanted, target, changes);
        let resets = self.writes[before..]
            .iter()
            .any(|w| matches!(w, Write::MergePatchDeployment { .. }));
        if spec_written && !resets {
            self.status.target_deployment_generation =
                Some(target.metadata.generation.unwrap_or(0) + 1);
        } else if spec_written {
            self.status.target_deployment_generation = None;
        } else if self.status.target_deployment_generation.is_none() {
            self.status.target_deployment_generation = target.metadata.generation;
        }
    }

    /// Whether the last decision's Deployment write has not landed (a crash
    /// or an error cut it short): its generation is unset, or ahead of the
    /// Deployment's.
    fn writes_unlanded(&self, target: &Deployment) -> bool {
        match self.status.target_deployment_generation {
            None => true,
            Some(recorded) => recorded > target.metadata.generation.unwrap_or(0),
        }
    }

    /// Writes what differs: the snapshot (or, for a template that reads
    /// it, the pointer) before the Deployment, so no pod ever starts
    /// with a reference to a ConfigMap that does not exist yet. True when
    /// a write changes the Deployment's spec (a new generation).
    fn push_writes(&mut self, wanted: &Plan, target: &Deployment, changes: &Changes) -> bool {
        if !changes.snapshot.is_empty() {
            self.writes
                .push(Write::ApplyConfigMap(Box::new(wanted.snapshot.clone())));
        }
        if !changes.pointer.is_empty() {
            self.writes
                .push(Write::ApplyConfigMap(Box::new(wanted.config_map.clone())));
        }
        let deployment_changes = &changes.deployment;
        if !deployment_changes.is_empty() {
            let observed = serde_json::to_value(target).expect("a Deployment serializes");
            if let Some(patch) = wanted.deployment.strategy_reset(&observed) {
                self.writes.push(Write::MergePatchDeployment {
                    name: wanted.deployment.name.clone(),
                    patch,
                });
            }
            if wanted.deployment.replicas.is_none()
                && let Some(replicas) = progress::replicas_owned_by_operator(target)
            {
                self.writes.push(Write::HandOverReplicas {
                    name: wanted.deployment.name.clone(),
                    replicas,
                });
            }
            self.writes.push(Write::ApplyDeployment {
                name: wanted.deployment.name.clone(),
                body: wanted.deployment.apply_body(),
                release: false,
            });
        }
        deployment_changes
            .iter()
            .any(|c| *c != ADOPTION_LABEL && *c != "ownership annotation")
    }

    // ---- starting rollouts and rollbacks ----

    fn start(&mut self, mode: Mode, desired: &Plan, wanted: &Plan) {
        let version = wanted.normalized.version.clone();
        let now = self.obs.now.clone();
        self.status.applied_spec_hash = Some(wanted.spec_hash.clone());
        self.status.manifest_hash = Some(wanted.manifest_hash.clone());
        self.status.last_rollout_time = Some(now);
        match mode {
            Mode::Forward => {
                let was = self.status.active_version.clone();
                self.status.phase = Some(Phase::RollingOut);
                self.status.rollback_request = None;
                self.status.rollback_spec = None;
                if wanted.normalized.rollout_strategy.type_ == StrategyType::Recreate {
                    // Recreate stops every old pod first: nothing is served
                    // until the new ones are ready.
                    self.status.active_version = None;
                }
                let message = match was {
                    Some(active) if active != version => {
                        format!("rolling out {version} (serving {active})")
                    }
                    _ => format!("rolling out {version}"),
                };
                self.rolling_conditions(reason::ROLLING_OUT, &message);
                if conditions::get(&self.status.conditions, ROLLED_BACK).is_some() {
                    self.condition(
                        ROLLED_BACK,
                        false,
                        reason::AS_EXPECTED,
                        "no rollback in effect",
                    );
                }
                self.event(EventType::Normal, reason::ROLLOUT_STARTED, message);
            }
            Mode::Manual => {
                self.status.phase = Some(Phase::RolledBack);
                self.status.rollback_request = Some(format!("manual:{version}"));
                self.status.rollback_spec = Some(wanted.normalized.clone());
                self.status.rollback_count = Some(self.status.rollback_count.unwrap_or(0) + 1);
                let message = format!(
                    "rolling back to {version} as {ROLLBACK_TO_ANNOTATION} asks (spec.version is {})",
                    desired.normalized.version
                );
                self.rolling_conditions(reason::ROLLING_BACK, &message);
                self.condition(
                    ROLLED_BACK,
                    Status::Unknown,
                    reason::ROLLBACK_IN_PROGRESS,
                    message.clone(),
                );
                self.event(EventType::Normal, reason::ROLLBACK_STARTED, message);
            }
            Mode::Automatic => {
                // The rollback was decided (and counted) when the failure was
                // seen; this re-applies it, e.g. after the target was re-created.
                self.status.phase = Some(Phase::RolledBack);
                self.rolling_conditions(reason::ROLLING_BACK, &format!("restoring {version}"));
            }
        }
    }

    fn rolling_conditions(&mut self, why: &str, message: &str) {
        self.condition(READY, false, why, message);
        self.condition(PROGRESSING, true, why, message);
        self.condition(DEGRADED, false, why, message);
        self.condition(RECONCILING, true, why, message);
        self.condition(STALLED, false, why, message);
        self.condition(SOAKED, false, why, message);
    }

    // ---- judging progress ----

    fn evaluate(&mut self, mode: Mode, desired: &Plan, wanted: &Plan, target: &Deployment) {
        let generation = self.status.target_deployment_generation.unwrap_or(0);
        let since = self
            .landed
            .clone()
            .or_else(|| self.status.last_rollout_time.clone());
        let progress = progress::judge(target, generation, since.as_ref(), &self.obs.now);
        if let (Some(since), Progress::InProgress | Progress::NotObserved) = (&since, &progress) {
            let deadline = wanted.normalized.rollout_strategy.progress_deadline_seconds;
            // Look again when a deadline condition from before our write
            // starts to count, and when a rollout the controller never
            // reported on is judged by the operator's clock.
            let end = since.0.as_second() + i64::from(deadline);
            let now = self.obs.now.0.as_second();
            let due = [end + 1, end + progress::UNREPORTED_GRACE_SECONDS + 1]
                .into_iter()
                .map(|t| t - now)
                .find(|d| *d > 0);
            if let Some(due) = due {
                self.requeue_after = Some(Duration::from_secs(due as u64));
            }
        }
        let phase = self.old.phase;
        match (mode, progress) {
            (_, Progress::Paused) => self.paused(&wanted.deployment.name),
            (Mode::Forward, Progress::Complete) if phase == Some(Phase::Ready) => {
                self.ready(desired, wanted, target, true)
            }
            (Mode::Forward, Progress::Complete) => self.succeeded(Mode::Forward, wanted, target),
            (Mode::Forward, Progress::Failed { reason, message }) => match phase {
                Some(Phase::Ready) => self.ready(desired, wanted, target, false),
                Some(Phase::Failed) => {}
                _ => {
                    // The controller's words, and the service's own.
                    let detail = match self.last_words(wanted, target) {
                        Some(words) => format!("{message}; {words}"),
                        None => message,
                    };
                    self.failed(desired, wanted, target, reason, &detail)
                }
            },
            (Mode::Forward, Progress::InProgress)
                if !matches!(phase, Some(Phase::Ready | Phase::Failed))
                    && self.failed_early(wanted, target, since.as_ref()).is_some() =>
            {
                let (why, message) = self
                    .failed_early(wanted, target, since.as_ref())
                    .expect("checked above");
                self.failed(desired, wanted, target, why, &message)
            }
            (Mode::Forward, Progress::InProgress | Progress::NotObserved) => match phase {
                Some(Phase::Ready) => self.ready(desired, wanted, target, false),
                Some(Phase::Failed) => {}
                _ => {
                    self.status.phase = Some(Phase::RollingOut);
                    let message = format!("rolling out {}", wanted.normalized.version);
                    self.rolling_conditions(reason::ROLLING_OUT, &message);
                }
            },
            (_, Progress::Complete) => {
                let done = conditions::is_true(&self.old.conditions, ROLLED_BACK)
                    && phase == Some(Phase::RolledBack);
                if !done {
                    self.succeeded(mode, wanted, target);
                }
            }
            (_, Progress::Failed { message, .. }) => {
                if phase != Some(Phase::Failed) {
                    self.rollback_failed(wanted, &message);
                }
            }
            (_, Progress::InProgress | Progress::NotObserved) => {
                if phase != Some(Phase::Failed) {
                    self.status.phase = Some(Phase::RolledBack);
                    let message = format!("rolling back to {}", wanted.normalized.version);
                    let failure = conditions::get(&self.old.conditions, DEGRADED)
                        .filter(|c| c.reason == reason::ROLLOUT_FAILED)
                        .map(|c| c.message.clone());
                    self.rolling_conditions(reason::ROLLING_BACK, &message);
                    if mode == Mode::Automatic {
                        // The spec still asks for the version that failed.
                        let failure = failure
                            .unwrap_or_else(|| format!("{} failed", desired.normalized.version));
                        self.condition(DEGRADED, true, reason::ROLLOUT_FAILED, failure);
                    }
                    self.condition(
                        ROLLED_BACK,
                        Status::Unknown,
                        reason::ROLLBACK_IN_PROGRESS,
                        message,
                    );
                }
            }
        }
    }

    /// A Ready resource: report how well it is served, never fail it.
    fn steady(&mut self, target: &Deployment, wanted: &Plan) {
        let version = &wanted.normalized.version;
        let mut message = format!("serving {version}");
        if self.autoscaled() && wanted.normalized.replicas.is_some() {
            message.push_str("; spec.replicas is not applied because a HorizontalPodAutoscaler scales the Deployment");
        }
        self.status.phase = Some(Phase::Ready);
        self.condition(READY, true, reason::ROLLOUT_SUCCEEDED, message.clone());
        self.condition(
            PROGRESSING,
            false,
            reason::ROLLOUT_COMPLETE,
            message.clone(),
        );
        match progress::degradation(target) {
            Some((why, detail)) => self.condition(DEGRADED, true, why, detail),
            None => self.condition(DEGRADED, false, reason::AS_EXPECTED, message.clone()),
        }
        self.condition(
            RECONCILING,
            false,
            reason::ROLLOUT_COMPLETE,
            message.clone(),
        );
        self.condition(STALLED, false, reason::ROLLOUT_COMPLETE, message);
    }

    fn succeeded(&mut self, mode: Mode, wanted: &Plan, target: &Deployment) {
        let version = wanted.normalized.version.clone();
        self.status.active_version = Some(version.clone());
        if mode == Mode::Forward {
            // A forward rollout joins the history once it has soaked
            // (at once without a soak); a rollback restores history.
            self.begin_soak(wanted);
        } else {
            self.record_success(&wanted.normalized);
        }
        match mode {
            Mode::Forward => {
                let recovered = self.old.phase == Some(Phase::Failed);
                self.status.rollback_request = None;
                self.status.rollback_spec = None;
                if conditions::get(&self.status.conditions, ROLLED_BACK).is_some() {
                    self.condition(
                        ROLLED_BACK,
                        false,
                        reason::AS_EXPECTED,
                        "no rollback in effect",
                    );
                }
                self.steady(target, wanted);
                let message = if recovered {
                    format!("{version} became available after all")
                } else {
                    format!("{version} is ready on every pod")
                };
                self.event(EventType::Normal, reason::ROLLOUT_SUCCEEDED, message);
            }
            Mode::Automatic | Mode::Manual => {
                self.status.phase = Some(Phase::RolledBack);
                let asked = self.status.desired_version.clone().unwrap_or_default();
                let message = format!("restored {version}; spec.version asks for {asked}");
                self.condition(
                    ROLLED_BACK,
                    true,
                    reason::ROLLBACK_SUCCEEDED,
                    message.clone(),
                );
                self.condition(
                    PROGRESSING,
                    false,
                    reason::ROLLBACK_COMPLETE,
                    message.clone(),
                );
                self.condition(
                    RECONCILING,
                    false,
                    reason::ROLLBACK_COMPLETE,
                    message.clone(),
                );
                let why = if mode == Mode::Automatic {
                    reason::ROLLED_BACK
                } else {
                    reason::MANUAL_ROLLBACK
                };
                self.condition(SOAKED, false, why, message.clone());
                if mode == Mode::Automatic {
                    // The spec still asks for a version that failed: not
                    // ready, and stalled until someone changes the spec.
                    self.condition(READY, false, reason::ROLLED_BACK, message.clone());
                    self.condition(STALLED, true, reason::ROLLED_BACK, message.clone());
                } else {
                    self.condition(READY, true, reason::MANUAL_ROLLBACK, message.clone());
                    self.condition(DEGRADED, false, reason::MANUAL_ROLLBACK, message.clone());
                    self.condition(STALLED, false, reason::MANUAL_ROLLBACK, message.clone());
                }
                self.event(EventType::Normal, reason::ROLLBACK_SUCCEEDED, message);
            }
        }
    }

    /// `spec` succeeded: it becomes `lastSuccessfulSpec`, and the one
    /// before it `previousSuccessfulSpec`.
    fn record_success(&mut self, spec: &crate::api::OpenMedModelSpec) {
        let last = self.status.last_successful_spec.as_ref();
        if last.is_some_and(|l| l.version == spec.version) {
            // Same version, other settings (replicas, strategy): the
            // retained rollback targets are versions, so the previous one
            // stays until another version succeeds.
            self.status.last_successful_spec = Some(spec.clone());
        } else if last != Some(spec) {
            self.status.previous_successful_spec = self.status.last_successful_spec.take();
            self.status.last_successful_spec = Some(spec.clone());
        }
    }

    /// A forward rollout failed: roll back to the last successful spec when
    /// there is one to go back to, else stop in `Failed`.
    fn failed(
        &mut self,
        desired: &Plan,
        wanted: &Plan,
        target: &Deployment,
        why: &'static str,
        detail: &str,
    ) {
        let version = wanted.normalized.version.clone();
        let last = self.old.last_successful_spec.clone();
        let last_plan = last.as_ref().map(|spec| self.retained_plan(spec, desired));
        if last_plan
            .as_ref()
            .is_some_and(|p| p.spec_hash == wanted.spec_hash)
        {
            // The spec being rolled out is the last good one: a good version
            // is never marked failed nor rolled back to itself.
            let message = format!("{version} is not fully available: {detail}");
            self.condition(READY, false, why, message.clone());
            self.condition(PROGRESSING, false, why, message.clone());
            self.condition(DEGRADED, true, why, message.clone());
            self.condition(RECONCILING, false, why, message.clone());
            self.condition(STALLED, true, why, message);
            return;
        }
        self.gave_up = true;
        self.status.failed_spec_hash = Some(desired.spec_hash.clone());
        let failure = if soak::is_soak_failure(why) {
            format!("{version} failed its soak: {detail}")
        } else {
            format!("{version} did not become ready: {detail}")
        };
        let rollback = desired.normalized.rollout_strategy.rollback_on_failure;
        match last_plan {
            Some(restore) if rollback => {
                let restored = restore.normalized.version.clone();
                self.status.phase = Some(Phase::RolledBack);
                self.status.rollback_spec = Some(restore.normalized.clone());
                self.status.rollback_request = Some(format!("automatic:{restored}"));
                self.status.rollback_count = Some(self.status.rollback_count.unwrap_or(0) + 1);
                self.status.applied_spec_hash = Some(restore.spec_hash.clone());
                self.status.manifest_hash = Some(restore.manifest_hash.clone());
                self.status.last_rollout_time = Some(self.obs.now.clone());
                let message = format!("{failure}; rolling back to {restored}");
                self.event(EventType::Warning, reason::ROLLOUT_FAILED, failure.clone());
                self.rolling_conditions(reason::ROLLING_BACK, &message);
                self.condition(DEGRADED, true, reason::ROLLOUT_FAILED, failure);
                self.condition(
                    ROLLED_BACK,
                    Status::Unknown,
                    reason::ROLLBACK_IN_PROGRESS,
                    message,
                );
                self.event(
                    EventType::Warning,
                    reason::ROLLBACK_STARTED,
                    format!("rolling back to {restored}"),
                );
                let mut restore = restore;
                self.fit_to_target(&mut restore, target);
                let mut copy = serde_json::to_value(target).expect("a Deployment serializes");
                if restore.deployment.apply_to(&mut copy).is_ok() {
                    let changes = self.changes(&restore, target);
                    self.write_fields(&restore, target, &changes);
                }
            }
            _ => {
                let why_not = if rollback {
                    "there is no earlier successful version to roll back to"
                } else {
                    "rollbackOnFailure is false"
                };
                let message = format!("{failure}; {why_not}");
                self.event(EventType::Warning, reason::ROLLOUT_FAILED, message.clone());
                self.status.phase = Some(Phase::Failed);
                self.condition(READY, false, why, message.clone());
                self.condition(PROGRESSING, false, why, message.clone());
                self.condition(DEGRADED, true, why, message.clone());
                self.condition(RECONCILING, false, why, message.clone());
                self.condition(STALLED, true, why, message);
            }
        }
    }

    fn rollback_failed(&mut self, wanted: &Plan, detail: &str) {
        let message = format!(
            "rollback to {} did not become ready either: {detail}",
            wanted.normalized.version
        );
        self.gave_up = true;
        self.status.phase = Some(Phase::Failed);
        let why = reason::ROLLBACK_FAILED;
        self.condition(READY, false, why, message.clone());
        self.condition(PROGRESSING, false, why, message.clone());
        self.condition(DEGRADED, true, why, message.clone());
        self.condition(ROLLED_BACK, false, why, message.clone());
        self.condition(RECONCILING, false, why, message.clone());
        self.condition(STALLED, true, why, message.clone());
        self.event(EventType::Warning, reason::ROLLBACK_FAILED, message);
    }

    fn paused(&mut self, name: &str) {
        let message =
            format!("Deployment {name} is paused; the rollout continues when it is resumed");
        let why = reason::DEPLOYMENT_PAUSED;
        if self.entering(why) {
            self.event(EventType::Normal, why, message.clone());
        }
        self.condition(READY, false, why, message.clone());
        self.condition(PROGRESSING, false, why, message.clone());
        self.condition(RECONCILING, false, why, message.clone());
        self.condition(STALLED, false, why, message);
    }

    // ---- resources that cannot be acted on ----

    fn invalid(&mut self, errors: &[crate::api::FieldError]) {
        let message = errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        let why = reason::INVALID_SPEC;
        if self.entering(why) || self.old.observed_generation != Some(self.generation()) {
            self.event(EventType::Warning, why, message.clone());
        }
        self.status.phase.get_or_insert(Phase::Pending);
        self.condition(READY, false, why, message.clone());
        self.condition(RECONCILING, false, why, message.clone());
        self.condition(STALLED, true, why, message);
    }

    fn reject_rollback(&mut self, rejection: &Rejection) {
        let message = not_retained(&rejection.version, &rejection.retained);
        let why = reason::ROLLBACK_TARGET_UNAVAILABLE;
        if self.entering(why) {
            self.event(
                EventType::Warning,
                reason::ROLLBACK_REJECTED,
                format!("{why}: {message}"),
            );
        }
        self.condition(READY, false, why, message.clone());
        self.condition(RECONCILING, false, why, message.clone());
        self.condition(STALLED, true, why, message);
    }

    /// The target cannot be acted on until something outside changes;
    /// these heal by themselves.
    /// The autoscaler `spec.autoscaling` asks for, on the target this
    /// resource holds ([`autoscaling::decide`]).
    fn autoscale(&mut self, target: &str) {
        let floor = self.stable_floor();
        let asked = self
            .autoscaling
            .as_ref()
            .map(|a| autoscaling::with_floor(a, floor));
        let out = autoscaling::decide(
            &self.obs.resource.id(),
            target,
            asked.as_ref(),
            autoscaling::Seen {
                autoscalers: self.obs.autoscalers,
                scaled_object: self.obs.scaled_object,
                keda: self.obs.settings.keda,
            },
        );
        self.writes.extend(out.writes);
        self.status.autoscaling = out.status;
        match out.condition {
            Some((ok, why, message)) => {
                let entering = conditions::get(&self.old.conditions, autoscaling::AUTOSCALED)
                    .is_none_or(|c| c.reason != why);
                if entering && why == autoscaling::reason::AUTOSCALER_CONFLICT {
                    self.event(EventType::Warning, why, message.clone());
                }
                self.condition(autoscaling::AUTOSCALED, ok, why, message);
            }
            None => self
                .status
                .conditions
                .retain(|c| c.type_ != autoscaling::AUTOSCALED),
        }
    }

    fn blocked(&mut self, why: &'static str, message: String) {
        if self.entering(why) {
            self.event(EventType::Warning, why, message.clone());
        }
        if self.status.active_version.is_none() {
            self.status.phase = Some(Phase::Pending);
        }
        self.condition(READY, false, why, message.clone());
        self.condition(PROGRESSING, false, why, message.clone());
        self.condition(
            DEGRADED,
            why == reason::TARGET_CONFLICT,
            why,
            message.clone(),
        );
        self.condition(RECONCILING, true, why, message.clone());
        self.condition(STALLED, false, why, message);
    }
}

struct Rejection {
    version: String,
    retained: Vec<String>,
}

/// The versions a manual rollback may name, most recent first: those of
/// `lastSuccessfulSpec` and `previousSuccessfulSpec`.
pub fn retained_versions(status: &OpenMedModelStatus) -> Vec<String> {
    [
        &status.last_successful_spec,
        &status.previous_successful_spec,
    ]
    .into_iter()
    .flatten()
    .map(|s| s.version.clone())
    .collect()
}

/// Why a rollback to `version` is refused, in the words every place that
/// refuses it uses (the operator's condition, `rollback`, and the
/// admission policy in deploy/admission).
pub fn not_retained(version: &str, retained: &[String]) -> String {
    let listed = if retained.is_empty() {
        "none yet".to_owned()
    } else {
        retained.join(", ")
    };
    format!(
        "{ROLLBACK_TO_ANNOTATION}={version} is not a retained version (retained: {listed}); nothing was changed"
    )
}

/// `(created, key)` ordering: older first, unknown creation last, then by name.
fn claim_order(
    a: &(Option<k8s_openapi::jiff::Timestamp>, String),
    b: &(Option<k8s_openapi::jiff::Timestamp>, String),
) -> std::cmp::Ordering {
    let rank = |t: &Option<k8s_openapi::jiff::Timestamp>| t.map_or((1, None), |t| (0, Some(t)));
    rank(&a.0).cmp(&rank(&b.0)).then_with(|| a.1.cmp(&b.1))
}

/// The operator's watch label, added when adopting a Deployment written by
/// the earlier operator: not drift, and no pod is touched.
const ADOPTION_LABEL: &str = "watch label";

/// The target as a second owner of a ConfigMap written before this
/// operator version added it: not drift either.
const TARGET_OWNER: &str = "ConfigMap owner reference to the Deployment";

/// Changes that are the operator's own bookkeeping catching up, never
/// another writer's.
const ADOPTION: [&str; 2] = [ADOPTION_LABEL, TARGET_OWNER];

/// Which owned fields differ between a Deployment and the same Deployment
/// with the owned fields applied.
fn changed_fields(before: &Value, after: &Value) -> Vec<&'static str> {
    let differs = |pointer: &str| before.pointer(pointer) != after.pointer(pointer);
    let mut changes = Vec::new();
    let containers = "/spec/template/spec/containers";
    if differs(containers) {
        changes.push("the OPENMED_SERVICE_PRELOAD_MODELS entry");
    }
    if differs("/spec/template/spec/readinessGates") {
        changes.push("the quality gate's readiness gate");
    }
    if differs("/spec/template/metadata/annotations") {
        changes.push("pod-template annotations");
    }
    if differs("/spec/template/metadata/labels") {
        changes.push("pod-template labels");
    }
    if differs("/spec/replicas") {
        changes.push("replicas");
    }
    if differs("/spec/strategy") {
        changes.push("strategy");
    }
    if differs("/spec/progressDeadlineSeconds") {
        changes.push("progressDeadlineSeconds");
    }
    if differs("/metadata/annotations") {
        changes.push("ownership annotation");
    }
    if differs("/metadata/labels") {
        changes.push(ADOPTION_LABEL);
    }
    changes
}

/// Which parts of an observed ConfigMap differ from the planned one.
fn config_map_drift(observed: &ConfigMap, planned: &ConfigMap) -> Vec<&'static str> {
    let mut changes = Vec::new();
    if observed.data != planned.data {
        changes.push("ConfigMap data");
    }
    let subset = |want: &Option<std::collections::BTreeMap<String, String>>,
                  have: &Option<std::collections::BTreeMap<String, String>>| {
        want.iter()
            .flatten()
            .all(|(k, v)| have.as_ref().and_then(|h| h.get(k)) == Some(v))
    };
    if !subset(&planned.metadata.labels, &observed.metadata.labels)
        || !subset(
            &planned.metadata.annotations,
            &observed.metadata.annotations,
        )
    {
        changes.push("ConfigMap labels or annotations");
    }
    let refs = observed
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    let wanted_refs = planned
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    let missing: Vec<_> = wanted_refs.iter().filter(|w| !refs.contains(w)).collect();
    if missing.iter().any(|w| w.kind != "Deployment") {
        changes.push("ConfigMap owner reference");
    } else if !missing.is_empty() {
        changes.push(TARGET_OWNER);
    }
    changes
}

fn name_of(config_map: &ConfigMap) -> &str {
    config_map.metadata.name.as_deref().unwrap_or_default()
}

/// The ConfigMap that `container`'s preload variable reads in a
/// Deployment's pod template, if it reads one.
fn template_config_map(deployment: &Value, container: &str) -> Option<String> {
    deployment
        .pointer("/spec/template/spec/containers")?
        .as_array()?
        .iter()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(container))?
        .get("env")?
        .as_array()?
        .iter()
        .find(|e| e.get("name").and_then(Value::as_str) == Some(PRELOAD_ENV))?
        .pointer("/valueFrom/configMapKeyRef/name")?
        .as_str()
        .map(str::to_owned)
}

#[cfg(test)]
mod tests;
