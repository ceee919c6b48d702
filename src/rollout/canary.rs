//! Canaries: a new version on the canary Deployment, traffic moved step by
//! step on one HTTPRoute rule, analysis between steps, then promotion (the
//! stable Deployment rolls) or abort (the weights go back at once).
//!
//! Like the rest of `decide`, every step is recorded in the status before
//! anything is written, and is judged from what is observed:
//!
//! - A step's weight counts as moved only once the route shows it; its
//!   pause runs from then. A route showing the weights before the step is
//!   our unfinished write (written again); any other weights are another
//!   writer's, and the canary pauses with `RouteDrift` rather than fight.
//! - The weight stays 0 until the canary Deployment is available on its
//!   new template; its progress deadline, or the same time counted by the
//!   operator from the canary's start, aborts. After that, a canary
//!   Deployment gone or without an available pod for as long aborts too.
//! - No data is never a pass: a step ends only on a round of analysis in
//!   which every check passed (or on a promote). A step's first round is
//!   taken one interval after its weights were seen.
//! - Weights go back on what the route shows, on the route the status
//!   names: a step's weight is recorded before it is written, a canary
//!   whose route or canary Deployment the spec renames ends (and starts
//!   again) once its weights are back, and that Deployment is not released
//!   before.
//! - A canary Deployment moves back to the stable version only once no
//!   request reaches it any more ([`super::drain`]): the weights back on
//!   the route, every Gateway on that generation of it, and the drain
//!   query (when set) at 0.
//! - A promote or abort value acted on once does nothing more, in any
//!   later canary either.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

use super::ResourceView;
use super::analysis::{self, Check, Subject};
use super::autoscaling;
use super::conditions::{DEGRADED, PROGRESSING, READY, RECONCILING, ROLLED_BACK, STALLED};
use super::drain;
use super::progress::{self, Progress};
use super::route::{self, Slots};
use super::{EventType, Mode, Plan, Settings, Step, Write, name_of, reason, template_config_map};
use crate::api::names::{
    CANARY_ABORT_ANNOTATION, CANARY_PAUSE_ANNOTATION, CANARY_PROMOTE_ANNOTATION,
};
use crate::api::{
    AnalysisResult, BackendWeights, Canary, CanaryState, CanaryStatus, OpenMedModelSpec, Outcome,
    Phase, StepKind,
};
use crate::plan;

/// How many measurements the status keeps, at least: the latest round is
/// always kept whole, however many checks it has, since the step's verdict
/// is taken on it.
const KEPT_RESULTS: usize = 20;

/// Rounds in a row in which a check got no answer (an error, a timeout)
/// after which a canary aborts: a model nobody can judge must not keep its
/// share of the traffic. Argo Rollouts' default consecutive error limit.
const ERROR_LIMIT: i32 = 4;

/// How often a canary in progress is looked at, at least.
const ROUTE_LOOK: Duration = Duration::from_secs(10);

/// The canary's part in this decision.
#[derive(Debug)]
pub(super) enum Part {
    /// No canary: the stable target gets the spec, as without one.
    None,
    /// The stable target keeps this plan while the canary runs, or after
    /// the canary of this very spec was aborted.
    Hold(Box<Plan>),
    /// Every step passed: the stable target rolls to the spec.
    Promote,
}

impl Step<'_> {
    /// Decides what the canary asks of the stable target, ending a canary
    /// the spec no longer asks for and starting one it does.
    pub(super) fn canary_part(
        &mut self,
        canary: Option<&Canary>,
        desired: &Plan,
        mode: Mode,
    ) -> Part {
        if let Some(c) = &self.status.canary
            && !c.state.is_over()
        {
            let why = if mode != Mode::Forward {
                Some("a rollback was asked for".to_owned())
            } else if canary.is_none() {
                Some("spec.canary was removed".to_owned())
            } else if c.spec_hash != desired.spec_hash {
                Some(format!(
                    "the spec changed to {}",
                    desired.normalized.version
                ))
            } else {
                canary.and_then(|new| moved_elsewhere(c, new))
            };
            if let Some(why) = why {
                let message = format!("canary of {} ended: {why}", c.version);
                self.end_canary(CanaryState::Aborted, &message);
                self.event(EventType::Normal, reason::CANARY_ABORTED, message);
            }
        }
        if mode == Mode::Forward
            && let Some(stable) = self.failed_canary_hold(desired)
        {
            return Part::Hold(Box::new(stable));
        }
        let (Some(_), Mode::Forward) = (canary, mode) else {
            return Part::None;
        };
        // The stable side is what the stable Deployment serves: the
        // version soaking there, while it soaks, is no less the stable
        // one than a version that soaked.
        let Some(stable_spec) = self.old.stable_spec().cloned() else {
            // The first version has nothing to compare with.
            return Part::None;
        };
        let stable = self.retained_plan(&stable_spec, desired);
        if stable.manifest_hash == desired.manifest_hash {
            // The same model (replicas, strategy): nothing to try.
            return Part::None;
        }
        let current = self
            .status
            .canary
            .as_ref()
            .filter(|c| c.spec_hash == desired.spec_hash);
        match current.map(|c| (c.state, c.aborted_generation)) {
            Some((CanaryState::Promoting | CanaryState::Promoted, _)) => Part::Promote,
            Some((CanaryState::Aborted, _)) | None => {
                // A change made while the stable Deployment is itself
                // rolling does not skip its canary either: the stable
                // side goes back to the version that proved itself there
                // (the hold writes it), and the canary compares with it.
                if !self.restore_route() {
                    // The last canary's weights go back first: a canary
                    // started on them would take them for Git's.
                    self.look_again(Duration::from_secs(1));
                    return Part::Hold(Box::new(stable));
                }
                if !self.drained(canary) {
                    // Its canary Deployment gets the new version only once
                    // the data plane sends it none of the last one's
                    // requests.
                    return Part::Hold(Box::new(stable));
                }
                self.start_canary(canary.expect("checked above"), desired, &stable);
                Part::Hold(Box::new(stable))
            }
            Some(_) => Part::Hold(Box::new(stable)),
        }
    }

    /// The stable plan to hold when the latest canary was of this very spec
    /// and failed (aborted by analysis, its deadline, or a person): held
    /// until a field the operator hashes changes, whatever happens to
    /// `spec.canary`. The failed-version admission policy and `verify
    /// --status` let an edit or a removal of `spec.canary` through without
    /// a retry reason, so neither may be another try.
    fn failed_canary_hold(&self, desired: &Plan) -> Option<Plan> {
        let failed = self.status.canary.as_ref().is_some_and(|c| {
            c.state == CanaryState::Aborted
                && c.aborted_generation.is_some()
                && c.spec_hash == desired.spec_hash
        }) && self.status.failed_spec_hash.as_deref()
            == Some(desired.spec_hash.as_str());
        if !failed {
            return None;
        }
        let stable = self.old.stable_spec()?;
        Some(self.retained_plan(stable, desired))
    }

    fn start_canary(&mut self, canary: &Canary, desired: &Plan, stable: &Plan) {
        let version = desired.normalized.version.clone();
        let message = format!(
            "trying {version} on Deployment {} (the stable Deployment serves {})",
            canary.target_ref.name, stable.normalized.version
        );
        // A gate value acted on once does nothing more, in this canary or
        // a later one: the annotation usually stays on the object.
        let (promote_handled, abort_handled) = self
            .status
            .canary
            .as_ref()
            .map(|c| (c.promote_handled.clone(), c.abort_handled.clone()))
            .unwrap_or_default();
        // With an autoscaler, the canary is sized to its share of the
        // stable pods, and the stable side keeps the pods it has.
        let counts = |d: Option<&Deployment>| {
            self.autoscaling
                .as_ref()
                .and(d)
                .map(progress::wanted_replicas)
        };
        self.status.canary = Some(CanaryStatus {
            version: version.clone(),
            spec_hash: desired.spec_hash.clone(),
            state: CanaryState::Warming,
            stable_replicas: counts(self.obs.target),
            rest_replicas: counts(self.obs.canary_target),
            traffic_ref: Some(canary.traffic_ref.clone()),
            target_ref: Some(canary.target_ref.clone()),
            start_time: Some(self.obs.now.clone()),
            promote_handled,
            abort_handled,
            message: message.clone(),
            ..CanaryStatus::default()
        });
        self.event(EventType::Normal, reason::CANARY_STARTED, message);
    }

    pub(super) fn canary_plan(&self, spec: &OpenMedModelSpec, canary: &Canary) -> Plan {
        plan::canary_plan(&self.obs.resource.id(), spec, canary)
    }

    /// One pass of a canary in progress (the stable target is as it should
    /// be): the canary Deployment, then the step.
    pub(super) fn run_canary(&mut self, canary: &Canary, desired: &Plan, stable: &Deployment) {
        let Some(mut c) = self.status.canary.clone() else {
            return;
        };
        if c.state == CanaryState::Aborted {
            return;
        }
        // The route is not watched: look again at least this often, so
        // another writer's weights are seen within seconds.
        self.look_again(ROUTE_LOOK);
        if let Some(token) = self.gate(CANARY_ABORT_ANNOTATION, c.abort_handled.as_deref()) {
            c.abort_handled = Some(token);
            self.status.canary = Some(c);
            let who = format!("{CANARY_ABORT_ANNOTATION} asks to abort");
            return self.abort_canary(&who);
        }
        let name = canary.target_ref.name.clone();
        if Some(name.as_str()) == stable.metadata.name.as_deref() {
            return self.canary_waits(
                &mut c,
                reason::CANARY_TARGET_INVALID,
                format!("spec.canary.targetRef names the stable Deployment {name}; name a second Deployment"),
            );
        }
        let Some(target) = self.obs.canary_target else {
            let message = format!("canary Deployment {name} not found");
            if c.state == CanaryState::Warming {
                return self.warming(&mut c, desired, None, &message);
            }
            return self.unavailable(&mut c, desired, message);
        };
        let mut candidate = self.canary_plan(&desired.normalized, canary);
        self.share_snapshot(&mut candidate, stable);
        if self.autoscaling.is_some() {
            candidate.deployment.replicas = Some(autoscaling::canary_replicas(
                sized_share(&c, canary),
                progress::wanted_replicas(stable),
            ));
        }
        if let Err((_, message)) = self.serve(&mut candidate, target) {
            return self.canary_waits(&mut c, reason::CANARY_TARGET_INVALID, message);
        }
        let mut copy = serde_json::to_value(target).expect("a Deployment serializes");
        if let Err(missing) = candidate.deployment.apply_to(&mut copy) {
            return self.canary_waits(&mut c, reason::CANARY_TARGET_INVALID, missing.to_string());
        }
        let changes = self.changes(&candidate, target);
        if changes.any() {
            if self.push_writes(&candidate, target, &changes) {
                c.target_generation = None;
            }
            self.status.canary = Some(c);
            return;
        }
        if c.target_generation.is_none() {
            c.target_generation = target.metadata.generation;
            if let Some(landed) = progress::applied_at(target) {
                c.start_time = Some(landed);
            }
        }
        if c.state == CanaryState::Warming {
            self.warming(&mut c, desired, Some(target), "");
        }
        if c.state != CanaryState::Warming && c.state != CanaryState::Aborted {
            if let Some(problem) = unavailability(target) {
                return self.unavailable(&mut c, desired, problem);
            }
            if c.unavailable_since.take().is_some() {
                self.status.canary = Some(c.clone());
            }
            self.stepping(&mut c, canary);
        }
    }

    /// A warm canary whose Deployment is gone or serves from no pod: its
    /// share of the traffic fails meanwhile (and its queries may have no
    /// data to say so), so it aborts once that lasts longer than the
    /// progress deadline, counted from when it was first seen.
    fn unavailable(&mut self, c: &mut CanaryStatus, desired: &Plan, problem: String) {
        let deadline = desired
            .normalized
            .rollout_strategy
            .progress_deadline_seconds;
        let now = self.obs.now.0.as_second();
        let since = c
            .unavailable_since
            .get_or_insert_with(|| self.obs.now.clone())
            .0
            .as_second();
        if now - since > i64::from(deadline) {
            self.status.canary = Some(c.clone());
            return self.abort_canary(&format!(
                "{problem} for longer than the progress deadline ({deadline} s)"
            ));
        }
        self.look_again(Duration::from_secs(
            (since + i64::from(deadline) + 1 - now) as u64,
        ));
        self.canary_waits(
            c,
            reason::CANARY_TARGET_INVALID,
            format!(
                "{problem}; the canary is aborted unless it is available again within {deadline} s"
            ),
        );
    }

    /// With an autoscaler, why the canary Deployment cannot take `step`'s
    /// share yet: it has fewer available pods on its template than that
    /// share of the stable pods.
    fn share_pods_missing(&self, step: &crate::api::CanaryStep) -> Option<String> {
        self.autoscaling.as_ref()?;
        let (stable, canary) = (self.obs.target?, self.obs.canary_target?);
        let needed =
            autoscaling::canary_replicas(step_share(step), progress::wanted_replicas(stable));
        let status = canary.status.as_ref();
        let current = status.and_then(|s| s.observed_generation) == canary.metadata.generation;
        let available = status.filter(|_| current).map_or(0, |s| {
            s.updated_replicas
                .unwrap_or(0)
                .min(s.available_replicas.unwrap_or(0))
        });
        (available < needed).then(|| {
            format!(
                "scaling Deployment {} to {needed} pods before its share of the traffic moves ({available} available)",
                canary.metadata.name.clone().unwrap_or_default()
            )
        })
    }

    /// The step waits for its pods: not a pause (nothing a person must
    /// do), and the canary Deployment's watch brings the next pass.
    fn scaling_first(&mut self, c: &mut CanaryStatus, message: String) {
        if c.message != message {
            self.event(EventType::Normal, reason::CANARY_SCALING, message.clone());
        }
        c.message = message.clone();
        self.status.canary = Some(c.clone());
        self.canary_conditions(reason::CANARY_SCALING, false, &message);
        self.look_again(ROUTE_LOOK);
    }

    /// The canary's snapshot is the stable plan's, with the same owners,
    /// so the two applies of one ConfigMap never disagree.
    fn share_snapshot(&self, candidate: &mut Plan, stable: &Deployment) {
        if let (Some(name), Some(uid)) = (&stable.metadata.name, &stable.metadata.uid) {
            plan::owned_by_target(&mut candidate.snapshot, name, uid);
        }
    }

    /// Warming: no traffic until the canary is available on its template.
    fn warming(
        &mut self,
        c: &mut CanaryStatus,
        desired: &Plan,
        target: Option<&Deployment>,
        problem: &str,
    ) {
        let deadline = desired
            .normalized
            .rollout_strategy
            .progress_deadline_seconds;
        let started = c.start_time.clone().unwrap_or_else(|| self.obs.now.clone());
        let elapsed = self.obs.now.0.as_second() - started.0.as_second();
        let progress = target.map(|t| {
            progress::judge(
                t,
                c.target_generation.unwrap_or(0),
                Some(&started),
                &self.obs.now,
            )
        });
        if target.is_some_and(|t| progress::wanted_replicas(t) == 0) {
            let name = target
                .and_then(|t| t.metadata.name.clone())
                .unwrap_or_default();
            return self.canary_waits(
                c,
                reason::CANARY_TARGET_INVALID,
                format!("canary Deployment {name} has 0 replicas; scale it up"),
            );
        }
        match progress {
            Some(Progress::Complete) => {
                // The first step starts in this same decision.
                c.step = 1;
                c.state = CanaryState::Progressing;
                c.message = format!("{} is available on the canary", c.version);
                self.status.canary = Some(c.clone());
            }
            Some(Progress::Failed { message, .. }) => {
                self.status.canary = Some(c.clone());
                self.abort_canary(&format!(
                    "{} did not become available: {message}",
                    c.version
                ));
            }
            _ if elapsed > i64::from(deadline) => {
                self.status.canary = Some(c.clone());
                let why = if problem.is_empty() {
                    format!("not available after {deadline} s")
                } else {
                    problem.to_owned()
                };
                self.abort_canary(&format!(
                    "{} did not become available within the progress deadline: {why}",
                    c.version
                ));
            }
            _ => {
                let message = if problem.is_empty() {
                    format!("warming {} on the canary; no traffic yet", c.version)
                } else {
                    format!("{problem}; the canary is aborted {deadline} s after it started")
                };
                c.message = message.clone();
                self.status.canary = Some(c.clone());
                self.canary_conditions(reason::CANARY_WARMING, false, &message);
                let left = i64::from(deadline) + 1 - elapsed;
                self.look_again(Duration::from_secs(left.max(1) as u64));
            }
        }
    }

    /// A step: move the weights, hold, measure, then the next step.
    fn stepping(&mut self, c: &mut CanaryStatus, canary: &Canary) {
        let traffic = &canary.traffic_ref;
        let namespace = self.obs.resource.namespace.clone();
        if route_name(self.obs.resource).as_deref() != Some(traffic.http_route.as_str()) {
            // This decision started the canary on a route other than the
            // one the shell read for it (the last canary's): the next one
            // reads this one.
            c.message = format!("step {} of {}: moving traffic", c.step, canary.steps.len());
            let message = c.message.clone();
            self.status.canary = Some(c.clone());
            self.canary_conditions(reason::CANARY_PROGRESSING, false, &message);
            return self.look_again(Duration::from_secs(1));
        }
        let slots = match self.obs.route {
            Some(r) => route::locate(r, traffic, &namespace),
            None => Err(format!("HTTPRoute {} not found", traffic.http_route)),
        };
        let slots = match slots {
            Ok(slots) => slots,
            Err(problem) => return self.canary_waits(c, reason::ROUTE_INVALID, problem),
        };
        if let Some(analysis) = &canary.analysis {
            let refused = analysis::refused(analysis, &self.obs.settings.analysis_allow);
            if !refused.is_empty() {
                return self.held_at_zero(c, &slots, traffic, &refused);
            }
        }
        let index = (c.step.max(1) - 1) as usize;
        let Some(step) = canary.steps.get(index).cloned() else {
            return self.promote(c);
        };
        if c.restore_weights.is_none() && slots.mirror.is_some() {
            // Nothing of this canary was written yet: the filter is Git's,
            // and the canary could neither tell its own from it nor remove
            // it at the end.
            return self.canary_waits(
                c,
                reason::ROUTE_INVALID,
                format!(
                    "rule {} of HTTPRoute {} already mirrors requests to {}; remove that filter, the canary adds its own in a mirror step",
                    slots.rule_name.clone().unwrap_or_else(|| slots.rule.to_string()),
                    traffic.http_route,
                    traffic.canary_backend
                ),
            );
        }
        let restore = *c.restore_weights.get_or_insert(slots.weights);
        let target = route::step_shape(&step, restore);
        let seen = slots.shape();
        if c.step_start_time.is_none() {
            let before = match index {
                0 => route::at_rest(restore),
                _ => route::step_shape(&canary.steps[index - 1], restore),
            };
            if seen == target {
                record_step(c, &step);
                c.step_start_time = Some(self.obs.now.clone());
                self.holding(c, canary);
                self.look_again(Duration::from_secs(1));
            } else if seen == before
                && let Some(waiting) = self.share_pods_missing(&step)
            {
                // The pods first, then their share of the traffic: an
                // overloaded canary fails its analysis for want of pods.
                self.scaling_first(c, waiting);
            } else if seen == before {
                // Recorded before the write: should the canary end before
                // a decision sees the route move (a crash, an abort, an
                // edit), the weights and the mirror still go back.
                record_step(c, &step);
                self.writes.push(Write::PatchRoute {
                    name: traffic.http_route.clone(),
                    patch: route::shape_patch(&slots, traffic, target),
                });
                let what = match step.kind() {
                    StepKind::Mirror(p) => format!(
                        "a copy of {p}% of the requests to {} ({}); {} answers every client",
                        traffic.canary_backend, c.version, traffic.stable_backend
                    ),
                    StepKind::Weight(w) => format!(
                        "{} at {w}% ({} {}, {} {})",
                        c.version,
                        traffic.stable_backend,
                        target.weights.stable,
                        traffic.canary_backend,
                        target.weights.canary
                    ),
                };
                self.event(
                    EventType::Normal,
                    reason::CANARY_WEIGHT_CHANGED,
                    format!("step {} of {}: {what}", c.step, canary.steps.len()),
                );
                self.status.canary = Some(c.clone());
            } else {
                self.route_drift(c, &slots, traffic, before);
            }
            return;
        }
        if seen != target {
            return self.route_drift(c, &slots, traffic, target);
        }
        if self
            .obs
            .resource
            .annotations
            .contains_key(CANARY_PAUSE_ANNOTATION)
        {
            return self.canary_waits(
                c,
                reason::CANARY_PAUSED,
                format!("paused by {CANARY_PAUSE_ANNOTATION}; remove it to go on"),
            );
        }
        if let Some(token) = self.gate(CANARY_PROMOTE_ANNOTATION, c.promote_handled.as_deref()) {
            let full = token.starts_with("full");
            c.promote_handled = Some(token);
            let message = if full {
                format!(
                    "{CANARY_PROMOTE_ANNOTATION} promotes {} past every step",
                    c.version
                )
            } else {
                format!("{CANARY_PROMOTE_ANNOTATION} ends step {}", c.step)
            };
            self.event(EventType::Normal, reason::CANARY_PROMOTED_BY_HAND, message);
            return if full {
                self.promote(c)
            } else {
                self.next_step(c, canary)
            };
        }
        let now = self.obs.now.0.as_second();
        let started = c.step_start_time.as_ref().map_or(now, |t| t.0.as_second());
        let pause = step
            .pause
            .as_deref()
            .and_then(crate::api::rules::parse_duration);
        let pause_over = pause.map(|p| now >= started + p.as_secs() as i64);
        let verdict = match &canary.analysis {
            None => Verdict::Passed,
            Some(analysis) => {
                if analysis::due(analysis, c, &self.obs.now) && !self.obs.measurements.is_empty() {
                    self.record_round(c, canary);
                    if c.state == CanaryState::Aborted {
                        return;
                    }
                }
                if let Some(at) = analysis::next_due(analysis, c) {
                    self.look_again(Duration::from_secs((at - now).max(1) as u64));
                }
                latest_round(c)
            }
        };
        if let Some(p) = pause {
            let left = started + p.as_secs() as i64 - now;
            if left > 0 {
                self.look_again(Duration::from_secs(left as u64));
            }
        }
        match (pause_over, verdict) {
            (_, Verdict::Pending) => self.holding(c, canary),
            (Some(true), Verdict::Passed) => self.next_step(c, canary),
            (_, Verdict::Inconclusive(why)) => self.canary_waits(
                c,
                reason::ANALYSIS_INCONCLUSIVE,
                format!(
                    "analysis inconclusive at step {}: {why}; measuring again",
                    c.step
                ),
            ),
            (None, Verdict::Passed) => self.canary_waits(
                c,
                reason::CANARY_PAUSED,
                format!(
                    "step {} has no pause: waiting for {CANARY_PROMOTE_ANNOTATION}",
                    c.step
                ),
            ),
            _ => self.holding(c, canary),
        }
    }

    /// The analysis cannot run (an endpoint the operator may not call): a
    /// model nothing judges gets no traffic. The canary holds at the
    /// weights before it, taking back what a step had moved, and starts
    /// its steps over once every endpoint is allowed.
    fn held_at_zero(
        &mut self,
        c: &mut CanaryStatus,
        slots: &Slots,
        traffic: &crate::api::TrafficRef,
        refused: &[String],
    ) {
        let message = not_allowed_message(refused);
        if let Some(restore) = c.restore_weights {
            let seen = slots.shape();
            let rest = route::at_rest(restore);
            if seen != rest {
                if seen != recorded_shape(c, restore) && c.step_start_time.is_some() {
                    return self.route_drift(c, slots, traffic, recorded_shape(c, restore));
                }
                // Recorded before it is written, as every step is.
                self.writes.push(Write::PatchRoute {
                    name: traffic.http_route.clone(),
                    patch: route::shape_patch(slots, traffic, rest),
                });
            }
            c.weight = restore.canary;
            c.mirror = None;
        }
        c.step = 1;
        c.step_start_time = None;
        self.canary_waits(c, reason::ANALYSIS_ENDPOINT_NOT_ALLOWED, message);
    }

    /// A step holds its weight: its pause runs, or its analysis measures.
    fn holding(&mut self, c: &mut CanaryStatus, canary: &Canary) {
        c.state = CanaryState::Progressing;
        c.message = match c.mirror {
            Some(p) => format!(
                "step {} of {}: {} gets a copy of {p}% of the requests and serves none",
                c.step,
                canary.steps.len(),
                c.version
            ),
            None => format!(
                "step {} of {}: {} at {}%",
                c.step,
                canary.steps.len(),
                c.version,
                c.weight
            ),
        };
        let message = c.message.clone();
        self.status.canary = Some(c.clone());
        self.canary_conditions(reason::CANARY_PROGRESSING, false, &message);
    }

    /// Judges the shell's readings and records them; too many failures
    /// abort.
    fn record_round(&mut self, c: &mut CanaryStatus, canary: &Canary) {
        let Some(analysis) = &canary.analysis else {
            return;
        };
        let mut failed = Vec::new();
        for m in self.obs.measurements {
            let (outcome, message) = analysis::judge(analysis, m);
            if outcome == Outcome::Fail {
                c.failures += 1;
                failed.push(format!("{}: {message}", m.name));
            }
            c.analysis.push(AnalysisResult {
                time: self.obs.now.clone(),
                name: m.name.clone(),
                step: c.step,
                outcome,
                message,
            });
        }
        keep_latest(&mut c.analysis);
        // A round in which a check got no answer at all (an error, a
        // timeout; not "no data") counts towards ERROR_LIMIT; a round with
        // every answer starts the count again.
        let unanswered: Vec<String> = self
            .obs
            .measurements
            .iter()
            .filter_map(|m| match &m.reading {
                analysis::Reading::Failed(why) => Some(format!("{}: {why}", m.name)),
                _ => None,
            })
            .collect();
        c.unanswered_rounds = if unanswered.is_empty() {
            0
        } else {
            c.unanswered_rounds + 1
        };
        self.status.canary = Some(c.clone());
        if c.unanswered_rounds >= ERROR_LIMIT {
            self.abort_canary(&format!(
                "the analysis got no answer {} rounds in a row ({}); a model nobody can judge keeps no traffic",
                c.unanswered_rounds,
                unanswered.join("; ")
            ));
            *c = self.status.canary.clone().unwrap_or_default();
            return;
        }
        if failed.is_empty() {
            return;
        }
        let failed = failed.join("; ");
        self.event(
            EventType::Warning,
            reason::ANALYSIS_FAILED,
            format!(
                "step {}: {failed} (failure {} of at most {} tolerated)",
                c.step, c.failures, analysis.failure_limit
            ),
        );
        if c.failures > analysis.failure_limit {
            self.abort_canary(&format!(
                "analysis failed {} times, more than failureLimit {}: {failed}",
                c.failures, analysis.failure_limit
            ));
            *c = self.status.canary.clone().unwrap_or_default();
        }
    }

    fn next_step(&mut self, c: &mut CanaryStatus, canary: &Canary) {
        if c.step as usize >= canary.steps.len() {
            return self.promote(c);
        }
        c.step += 1;
        c.step_start_time = None;
        c.state = CanaryState::Progressing;
        c.message = format!("step {} of {}: moving traffic", c.step, canary.steps.len());
        let message = c.message.clone();
        self.status.canary = Some(c.clone());
        self.canary_conditions(reason::CANARY_PROGRESSING, false, &message);
        // The weights move in this same decision.
        self.stepping(c, canary);
    }

    fn promote(&mut self, c: &mut CanaryStatus) {
        c.state = CanaryState::Promoting;
        c.message = format!(
            "every step passed; the stable Deployment rolls to {}",
            c.version
        );
        let message = c.message.clone();
        self.status.canary = Some(c.clone());
        self.event(EventType::Normal, reason::CANARY_PROMOTING, message);
        self.look_again(Duration::from_secs(1));
    }

    /// After the stable target's rollout of a promoted canary: done when
    /// it is Ready, aborted when it failed.
    pub(super) fn after_promotion(&mut self) {
        let Some(c) = self.status.canary.clone() else {
            return;
        };
        if c.state != CanaryState::Promoting {
            return;
        }
        match self.status.phase {
            Some(Phase::Ready) => {
                let message = format!("{} is stable; the weights go back", c.version);
                self.end_canary(CanaryState::Promoted, &message);
                self.event(EventType::Normal, reason::CANARY_PROMOTED, message);
            }
            Some(Phase::RolledBack | Phase::Failed) => {
                let message = format!(
                    "the stable rollout of {} failed; the weights go back",
                    c.version
                );
                self.end_canary(CanaryState::Aborted, &message);
                self.event(EventType::Warning, reason::CANARY_ABORTED, message);
            }
            _ => {}
        }
    }

    /// Stops the canary for good: the weights go back (in
    /// [`Step::canary_at_rest`]), the stable version stays, and this spec
    /// is not tried again until it changes.
    fn abort_canary(&mut self, why: &str) {
        let Some(c) = self.status.canary.clone() else {
            return;
        };
        let stable = self.status.active_version.clone().unwrap_or_default();
        let message = format!(
            "canary of {} aborted: {why}; {stable} still serves all traffic",
            c.version
        );
        self.end_canary(CanaryState::Aborted, &message);
        if let Some(c) = self.status.canary.as_mut() {
            c.aborted_generation = Some(self.obs.resource.generation);
        }
        self.status.failed_spec_hash = Some(c.spec_hash.clone());
        self.status.phase = Some(Phase::RolledBack);
        let why = reason::CANARY_ABORTED;
        self.condition(READY, false, why, message.clone());
        self.condition(PROGRESSING, false, why, message.clone());
        self.condition(DEGRADED, true, why, message.clone());
        self.condition(ROLLED_BACK, true, why, message.clone());
        self.condition(RECONCILING, false, why, message.clone());
        self.condition(STALLED, true, why, message.clone());
        self.event(EventType::Warning, why, message);
    }

    /// Marks the canary over; the weights are restored by
    /// [`Step::canary_at_rest`].
    fn end_canary(&mut self, state: CanaryState, message: &str) {
        if let Some(c) = self.status.canary.as_mut() {
            c.state = state;
            c.message = message.to_owned();
        }
    }

    /// The canary cannot go on until a person acts (or the world changes).
    fn canary_waits(&mut self, c: &mut CanaryStatus, why: &'static str, message: String) {
        let entering = c.state != CanaryState::Paused || c.message != message;
        c.state = if c.state == CanaryState::Warming {
            CanaryState::Warming
        } else {
            CanaryState::Paused
        };
        c.message = message.clone();
        self.status.canary = Some(c.clone());
        if entering {
            self.event(EventType::Normal, why, message.clone());
        }
        self.canary_conditions(why, true, &message);
    }

    /// Another writer changed the weights or the mirror: say so, write
    /// nothing.
    fn route_drift(
        &mut self,
        c: &mut CanaryStatus,
        slots: &Slots,
        traffic: &crate::api::TrafficRef,
        expected: route::Shape,
    ) {
        let seen = slots.shape();
        let (weights, want) = (seen.weights, expected.weights);
        let message = if seen.mirror != expected.mirror {
            let mirror = |m: Option<i32>| {
                m.map_or("no mirror filter".to_owned(), |p| {
                    format!("a RequestMirror filter of {p}%")
                })
            };
            format!(
                "HTTPRoute {} rule {} was changed by another writer: it shows {} to {} where the canary expects {}; the canary waits until it is as expected again or it is aborted. A GitOps tool must ignore /spec/rules/{}/filters while a canary mirrors (docs/canary.md)",
                traffic.http_route,
                slots.rule,
                mirror(seen.mirror),
                traffic.canary_backend,
                mirror(expected.mirror),
                slots.rule
            )
        } else {
            format!(
                "HTTPRoute {} weights were changed by another writer ({} {}, {} {}; expected {} and {}); the canary waits until they are {} and {} again or it is aborted. A GitOps tool must ignore /spec/rules/{}/backendRefs/*/weight (docs/canary.md)",
                traffic.http_route,
                traffic.stable_backend,
                weights.stable,
                traffic.canary_backend,
                weights.canary,
                want.stable,
                want.canary,
                want.stable,
                want.canary,
                slots.rule
            )
        };
        self.canary_waits(c, reason::ROUTE_DRIFT, message);
    }

    /// The value of a gate annotation not yet acted on.
    fn gate(&self, annotation: &str, handled: Option<&str>) -> Option<String> {
        let value = self.obs.resource.annotations.get(annotation)?;
        (Some(value.as_str()) != handled).then(|| value.clone())
    }

    fn canary_conditions(&mut self, why: &str, stalled: bool, message: &str) {
        self.status.phase = Some(Phase::Canary);
        self.condition(READY, false, why, message);
        self.condition(PROGRESSING, !stalled, why, message);
        self.condition(DEGRADED, false, why, message);
        self.condition(RECONCILING, true, why, message);
        self.condition(STALLED, stalled, why, message);
    }

    pub(super) fn look_again(&mut self, after: Duration) {
        self.requeue_after = Some(self.requeue_after.map_or(after, |d| d.min(after)));
    }

    /// Outside a canary: the weights of the last one go back, and the
    /// canary Deployment serves what the stable one does.
    pub(super) fn canary_at_rest(&mut self, canary: Option<&Canary>, stable: &Deployment) {
        if !self.restore_route() {
            // A canary in progress, or weights still on their way back:
            // the canary Deployment serves them until they are.
            return;
        }
        if !self.drained(canary) {
            // The data plane may still send it requests.
            return;
        }
        // The canary is over and its Deployment gets no more requests:
        // the stable side's floor goes, whether or not spec.canary or the
        // canary Deployment is still there.
        if let Some(c) = self.status.canary.as_mut() {
            c.stable_replicas = None;
        }
        let Some(canary) = canary else {
            return;
        };
        let (Some(target), Some(last)) =
            (self.obs.canary_target, self.status.stable_spec().cloned())
        else {
            return;
        };
        if target.metadata.name == stable.metadata.name {
            return;
        }
        let mut follow = self.canary_plan(&last, canary);
        self.share_snapshot(&mut follow, stable);
        if self.serve(&mut follow, target).is_err() {
            return;
        }
        self.canary_count_back(&mut follow, target);
        let mut copy = serde_json::to_value(target).expect("a Deployment serializes");
        if follow.deployment.apply_to(&mut copy).is_err() {
            return;
        }
        let changes = self.changes(&follow, target);
        if changes.any() {
            self.push_writes(&follow, target, &changes);
        }
    }

    /// The stable side's floor, the one home of its rule: the stable pods
    /// an autoscaled canary started with (recorded by `start_canary`),
    /// which the autoscaler's minimum keeps until the canary is over and
    /// its Deployment drained (`canary_at_rest` drops the record then,
    /// whatever else is missing).
    pub(super) fn stable_floor(&self) -> Option<i32> {
        self.status.canary.as_ref().and_then(|c| c.stable_replicas)
    }

    /// After a canary an autoscaler sized, the canary Deployment gets its
    /// own count back; once it has it, the record goes too, and the next
    /// apply hands `replicas` back to whoever scaled it before.
    fn canary_count_back(&mut self, follow: &mut Plan, target: &Deployment) {
        let Some(c) = self.status.canary.as_mut() else {
            return;
        };
        match c.rest_replicas {
            Some(rest) if progress::wanted_replicas(target) != rest => {
                follow.deployment.replicas = Some(rest);
            }
            Some(_) => c.rest_replicas = None,
            None => {}
        }
    }

    /// Whether the canary Deployment of the canary that ended gets no
    /// more requests ([`drain::judge`]), recorded once known: only then
    /// may it serve another version.
    fn drained(&mut self, canary: Option<&Canary>) -> bool {
        let Some(mut c) = self.status.canary.clone() else {
            return true;
        };
        let Some(since) = c
            .weights_back_time
            .clone()
            .filter(|_| c.drained_time.is_none())
        else {
            // Drained already, or a canary from before the operator
            // recorded when its weights came back.
            return true;
        };
        let spec_drain = canary.and_then(|c| c.drain.as_ref());
        let reading = self
            .obs
            .measurements
            .iter()
            .find(|m| m.name == drain::CHECK_NAME)
            .map(|m| &m.reading);
        let now = self.obs.now.clone();
        let waited = now.0.as_second() - since.0.as_second();
        let deployment = c
            .target_ref
            .as_ref()
            .map_or("the canary Deployment".to_owned(), |t| {
                format!("Deployment {}", t.name)
            });
        match drain::judge(self.obs.route, spec_drain, reading, &since, &now) {
            drain::Verdict::Waiting(_) => {
                self.look_again(drain::RECHECK);
                return false;
            }
            drain::Verdict::Drained(how) => self.event(
                EventType::Normal,
                reason::CANARY_DRAINED,
                format!(
                    "{deployment} gets no more requests {waited}s after the weights went back: {how}"
                ),
            ),
            drain::Verdict::TimedOut(why) => self.event(
                EventType::Warning,
                reason::CANARY_DRAIN_TIMED_OUT,
                format!("{deployment} moves back although {why}"),
            ),
        }
        c.drained_time = Some(now);
        self.status.canary = Some(c);
        true
    }

    /// The decision cannot go on to the canary (the spec is invalid, the
    /// stable target is missing or held by another resource, a rollback
    /// was refused): a canary in progress ends, and its weights go back
    /// rather than stay where they are with nothing left to judge them.
    pub(super) fn end_canary_blocked(&mut self, why: &str) {
        if let Some(c) = self.status.canary.as_ref().filter(|c| !c.state.is_over()) {
            let message = format!("canary of {} ended: {why}", c.version);
            self.end_canary(CanaryState::Aborted, &message);
            self.event(EventType::Warning, reason::CANARY_ABORTED, message);
        }
        self.restore_route();
    }

    /// Deletion: a canary in progress ends, and its weights go back. The
    /// canary Deployment a deletion must not release yet, if any: while the
    /// route may still send it requests (its weights are not back, or the
    /// data plane has not drained), it keeps its model.
    pub(super) fn end_canary_for_deletion(&mut self) -> Option<String> {
        if self
            .status
            .canary
            .as_ref()
            .is_some_and(|c| !c.state.is_over())
        {
            self.end_canary(CanaryState::Aborted, "the resource is being deleted");
        }
        let spec = serde_json::from_value::<OpenMedModelSpec>(self.obs.resource.spec.clone()).ok();
        let canary = spec.as_ref().and_then(|s| s.canary.as_ref());
        if self.restore_route() && self.drained(canary) {
            return None;
        }
        self.status
            .canary
            .as_ref()
            .and_then(|c| c.target_ref.as_ref())
            .map(|t| t.name.clone())
    }

    /// The canary's weights cannot be put back because the route is not
    /// as the canary left it: a condition (and an Event when it is news)
    /// says what is wrong, until a person mends the route.
    fn route_stuck(&mut self, traffic: &crate::api::TrafficRef, problem: &str) {
        let message = format!(
            "the canary's traffic cannot be put back on HTTPRoute {}: {problem}; it may still send requests to {}. Mend the route (or remove the canary backend from it)",
            traffic.http_route, traffic.canary_backend
        );
        let known = super::conditions::get(&self.old.conditions, RECONCILING)
            .is_some_and(|c| c.reason == reason::ROUTE_INVALID && c.message == message);
        if !known {
            self.event(EventType::Warning, reason::ROUTE_INVALID, message.clone());
        }
        self.condition(RECONCILING, true, reason::ROUTE_INVALID, message);
    }

    /// Puts back the weights a canary that is over moved, judged on what
    /// the route shows. True when no canary is in progress and none of
    /// its weights are left on the route.
    fn restore_route(&mut self) -> bool {
        let Some(mut c) = self.status.canary.clone() else {
            return true;
        };
        if !c.state.is_over() {
            return false;
        }
        let (Some(restore), Some(traffic)) = (c.restore_weights, c.traffic_ref.clone()) else {
            return true;
        };
        if c.weight == restore.canary && c.mirror.is_none() {
            // Back already: a later change of the route is Git's.
            return true;
        }
        let pending = self
            .writes
            .iter()
            .any(|w| matches!(w, Write::PatchRoute { name, .. } if *name == traffic.http_route));
        if pending {
            return false;
        }
        if route_name(self.obs.resource).as_deref() != Some(traffic.http_route.as_str()) {
            // The shell read another route for this decision.
            self.look_again(Duration::from_secs(1));
            return false;
        }
        let namespace = self.obs.resource.namespace.clone();
        let Some(found) = self.obs.route else {
            // The route is gone (the shell read it and was told so): it
            // sends nothing anywhere.
            back(&mut c, restore, &self.obs.now);
            self.status.canary = Some(c);
            return true;
        };
        let slots = match route::locate(found, &traffic, &namespace) {
            Ok(slots) => slots,
            Err(_) if !route::sends_to(found, &traffic.canary_backend, &namespace) => {
                // Not this shape any more, and no rule sends the canary
                // backend anything: nothing of ours is left.
                back(&mut c, restore, &self.obs.now);
                self.status.canary = Some(c);
                return true;
            }
            Err(problem) => {
                // The canary's weight may still be on the route, where the
                // operator cannot find it to put it back. Never taken for
                // restored: say why, and look again.
                self.route_stuck(&traffic, &problem);
                self.look_again(ROUTE_LOOK);
                return false;
            }
        };
        let ours = recorded_shape(&c, restore);
        let seen = slots.shape();
        if seen == route::at_rest(restore) {
            back(&mut c, restore, &self.obs.now);
            self.status.canary = Some(c);
            true
        } else if seen == ours || c.step_start_time.is_none() {
            // With no step start recorded, a write of the step may or may
            // not have landed; the weights shown are ours either way.
            self.writes.push(Write::PatchRoute {
                name: traffic.http_route.clone(),
                patch: route::shape_patch(&slots, &traffic, route::at_rest(restore)),
            });
            false
        } else {
            // Another writer set other weights: theirs stand.
            back(&mut c, restore, &self.obs.now);
            self.status.canary = Some(c);
            true
        }
    }

    /// The canary Deployments a release must leave alone: the one the
    /// spec names, and the one of a canary whose weights are not back yet
    /// or whose traffic has not drained (the data plane may still send it
    /// requests).
    pub(super) fn canary_deployments(&self, canary: Option<&Canary>) -> Vec<String> {
        let mut keep: Vec<String> = canary
            .map(|c| c.target_ref.name.clone())
            .into_iter()
            .collect();
        if let Some(c) = &self.status.canary
            && (route_moved(c) || draining(c))
            && let Some(target) = &c.target_ref
        {
            keep.push(target.name.clone());
        }
        keep
    }

    /// Keeps what a canary reads from being tidied away.
    pub(super) fn canary_keeps(&self, desired: &Plan, canary: Option<&Canary>) -> Vec<String> {
        let mut keep = Vec::new();
        if self
            .status
            .canary
            .as_ref()
            .is_some_and(|c| !c.state.is_over())
        {
            keep.push(name_of(&desired.snapshot).to_owned());
        }
        if let (Some(target), Some(canary)) = (self.obs.canary_target, canary) {
            let observed = serde_json::to_value(target).expect("a Deployment serializes");
            keep.extend(template_config_map(
                &observed,
                &canary.target_ref.container_name,
            ));
        }
        // A canary Deployment no longer named but not released yet (its
        // traffic drains) reads its model until it is.
        let kept = self.canary_deployments(canary);
        if let Some(old) = self
            .status
            .canary
            .as_ref()
            .and_then(|c| c.target_ref.as_ref())
        {
            for d in self.obs.claimed.iter().filter(|d| {
                d.metadata.name.as_deref() == Some(old.name.as_str()) && kept.contains(&old.name)
            }) {
                let observed = serde_json::to_value(d).expect("a Deployment serializes");
                keep.extend(template_config_map(&observed, &old.container_name));
            }
        }
        keep
    }
}

/// Drops the oldest results beyond [`KEPT_RESULTS`], but never one of the
/// latest round (the results of its time and step).
fn keep_latest(results: &mut Vec<AnalysisResult>) {
    let Some(last) = results.last() else {
        return;
    };
    let (time, step) = (last.time.clone(), last.step);
    let latest = results
        .iter()
        .rev()
        .take_while(|r| r.time == time && r.step == step)
        .count();
    let excess = results.len().saturating_sub(KEPT_RESULTS.max(latest));
    results.drain(..excess);
}

/// What the latest round of analysis at the current step says.
enum Verdict {
    /// No round at this step yet: the first is taken one interval after
    /// the step's weights were seen, on the step's own traffic.
    Pending,
    /// Every check of the round passed.
    Passed,
    /// A check of the round was inconclusive.
    Inconclusive(String),
    /// A check failed, within the failures tolerated: measure again.
    Failed,
}

fn latest_round(c: &CanaryStatus) -> Verdict {
    let started = c.step_start_time.as_ref().map(|t| t.0.as_second());
    let at_step: Vec<&AnalysisResult> = c
        .analysis
        .iter()
        .filter(|r| r.step == c.step && started.is_some_and(|s| r.time.0.as_second() >= s))
        .collect();
    let Some(last) = at_step.iter().map(|r| r.time.0.as_second()).max() else {
        return Verdict::Pending;
    };
    let round: Vec<&&AnalysisResult> = at_step
        .iter()
        .filter(|r| r.time.0.as_second() == last)
        .collect();
    let with = |outcome: Outcome| -> Vec<String> {
        round
            .iter()
            .filter(|r| r.outcome == outcome)
            .map(|r| format!("{}: {}", r.name, r.message))
            .collect()
    };
    let (inconclusive, failed) = (with(Outcome::Inconclusive), with(Outcome::Fail));
    if !inconclusive.is_empty() {
        Verdict::Inconclusive(inconclusive.join("; "))
    } else if !failed.is_empty() {
        Verdict::Failed
    } else {
        Verdict::Passed
    }
}

/// Why a canary holds at no traffic on endpoints the operator may not call.
fn not_allowed_message(refused: &[String]) -> String {
    format!(
        "the canary holds with no traffic: analysis endpoints the operator does not allow, so nothing is sent: {}. An administrator allows them with `openmed-op run --analysis-allow PREFIX`; or abort the canary",
        refused.join("; ")
    )
}

/// The checks due for `resource` at `now`, empty when none are or when
/// `settings` does not allow every endpoint: the shell runs them and hands
/// the readings to `decide`.
///
/// A soak's checks ([`super::soak::analysis_checks`]) come beside a drain
/// that may still run after the promotion.
pub fn analysis_checks(resource: &ResourceView, settings: &Settings, now: &Time) -> Vec<Check> {
    let mut checks = canary_checks(resource, settings, now);
    checks.extend(super::soak::analysis_checks(resource, settings, now));
    checks
}

fn canary_checks(resource: &ResourceView, settings: &Settings, now: &Time) -> Vec<Check> {
    let Ok(spec) = serde_json::from_value::<OpenMedModelSpec>(resource.spec.clone()) else {
        return Vec::new();
    };
    let (Some(canary), Some(c)) = (&spec.canary, &resource.status.canary) else {
        return Vec::new();
    };
    if draining(c) {
        return drain_check(resource, canary, c, settings);
    }
    let Some(analysis) = &canary.analysis else {
        return Vec::new();
    };
    let measuring = matches!(c.state, CanaryState::Progressing | CanaryState::Paused)
        && c.spec_hash
            == resource
                .status
                .desired_spec_hash
                .clone()
                .unwrap_or_default()
        && !resource.annotations.contains_key(CANARY_PAUSE_ANNOTATION);
    if !measuring || !analysis::due(analysis, c, now) {
        return Vec::new();
    }
    let key = resource.key();
    let stable = resource.status.active_version.clone().unwrap_or_default();
    let subject = Subject {
        resource: &key,
        namespace: &resource.namespace,
        traffic: &canary.traffic_ref,
        version: &c.version,
        stable_version: &stable,
        step: c.step,
        weight: c.weight,
        mirror: c.mirror,
    };
    let mut checks = analysis::checks(analysis, &subject, &settings.analysis_allow);
    if let Some(gate) = &analysis.probes
        && (checks.len() == analysis.metrics.len() + analysis.webhooks.len())
    {
        // The service's own pods: no endpoint to allow. Held, as every
        // check, when an endpoint of the others is refused. Which pods
        // are asked is the probe plan's (`quality::probe_plan`), by
        // ReplicaSet: the canary may share its version with the stable
        // Deployment, never its template.
        checks.push(Check::Probes { gate: gate.clone() });
    }
    checks
}

/// The drain query of a canary that ended, when it has one the operator
/// may send.
fn drain_check(
    resource: &ResourceView,
    canary: &Canary,
    c: &CanaryStatus,
    settings: &Settings,
) -> Vec<Check> {
    let (Some(spec_drain), Some(traffic)) = (&canary.drain, &c.traffic_ref) else {
        return Vec::new();
    };
    let key = resource.key();
    let stable = resource.status.active_version.clone().unwrap_or_default();
    let subject = Subject {
        resource: &key,
        namespace: &resource.namespace,
        traffic,
        version: &c.version,
        stable_version: &stable,
        step: c.step,
        weight: c.weight,
        mirror: c.mirror,
    };
    drain::check(spec_drain, &subject, &settings.analysis_allow)
        .into_iter()
        .collect()
}

/// The canary Deployment `spec.canary` names, if any.
pub fn canary_target_name(resource: &ResourceView) -> Option<String> {
    let name = resource.spec.pointer("/canary/targetRef/name")?.as_str()?;
    Some(name.to_owned())
}

/// The HTTPRoute a canary moves (or last moved) traffic on, if any: the
/// one the status names while a canary runs or its weights are not back,
/// so they go back on the route they were written to whatever the spec
/// names now.
pub fn route_name(resource: &ResourceView) -> Option<String> {
    if let Some(c) = &resource.status.canary
        && route_moved(c)
        && let Some(traffic) = &c.traffic_ref
    {
        return Some(traffic.http_route.clone());
    }
    if let Some(name) = resource
        .spec
        .pointer("/canary/trafficRef/httpRoute")
        .and_then(Value::as_str)
    {
        return Some(name.to_owned());
    }
    let c = resource.status.canary.as_ref()?;
    Some(c.traffic_ref.as_ref()?.http_route.clone())
}

/// The HTTPRoute a decision about `resource` looks at now, if any: while a
/// canary runs or weights it wrote may still be on the route, and on the
/// first decision about a new generation of the spec (a canary may start,
/// and judges the route's weights first). At rest nothing reads it, so a
/// resync of a resource with a canary block sends no request.
pub fn route_to_read(resource: &ResourceView) -> Option<String> {
    let moved = resource
        .status
        .canary
        .as_ref()
        .is_some_and(|c| route_moved(c) || draining(c));
    let undecided = resource.status.observed_generation != Some(resource.generation);
    if moved || undecided {
        route_name(resource)
    } else {
        None
    }
}

/// A canary ended, its weights are back, and its canary Deployment waits
/// for the data plane to stop sending it requests ([`drain`]).
fn draining(c: &CanaryStatus) -> bool {
    c.state.is_over() && c.weights_back_time.is_some() && c.drained_time.is_none()
}

/// A canary runs, or weights or a mirror it wrote may still be on its
/// route.
fn route_moved(c: &CanaryStatus) -> bool {
    !c.state.is_over()
        || c.mirror.is_some()
        || c.restore_weights.is_some_and(|r| c.weight != r.canary)
}

/// The share of the requests a step sends to the canary's pods: its
/// weight, or the copies a mirror step sends them.
fn step_share(step: &crate::api::CanaryStep) -> i32 {
    match step.kind() {
        StepKind::Weight(w) => w,
        StepKind::Mirror(p) => p,
    }
}

/// The share the canary's pods are sized for: the step's, and before a
/// step's weights move, the larger of it and the next one's, so the pods
/// are there before their traffic.
fn sized_share(c: &CanaryStatus, canary: &Canary) -> i32 {
    let moving = matches!(c.state, CanaryState::Progressing | CanaryState::Paused);
    let upcoming = (moving && c.step_start_time.is_none())
        .then(|| canary.steps.get((c.step.max(1) - 1) as usize))
        .flatten()
        .map(step_share);
    let current = c.mirror.unwrap_or(0).max(c.weight);
    upcoming.map_or(current, |next| next.max(current))
}

/// Records the step's weight and mirror before they are written.
fn record_step(c: &mut CanaryStatus, step: &crate::api::CanaryStep) {
    match step.kind() {
        StepKind::Weight(w) => {
            c.weight = w;
            c.mirror = None;
        }
        StepKind::Mirror(p) => {
            c.weight = c.restore_weights.map_or(0, |r| r.canary);
            c.mirror = Some(p);
        }
    }
}

/// The shape the status says the canary last wrote.
fn recorded_shape(c: &CanaryStatus, restore: BackendWeights) -> route::Shape {
    match c.mirror {
        Some(p) => route::Shape {
            weights: restore,
            mirror: Some(p),
        },
        None => route::Shape {
            weights: route::step_weights(c.weight),
            mirror: None,
        },
    }
}

/// The route is as Git has it again, from `now`.
fn back(c: &mut CanaryStatus, restore: BackendWeights, now: &Time) {
    c.weight = restore.canary;
    c.mirror = None;
    c.weights_back_time = Some(now.clone());
}

/// Why a running canary cannot go on where it is: `spec.canary` now names
/// another route, rule, backend or canary Deployment. Its weights go back
/// on the old route first, and it starts again on the new ones.
fn moved_elsewhere(c: &CanaryStatus, canary: &Canary) -> Option<String> {
    if let Some(old) = &c.traffic_ref
        && *old != canary.traffic_ref
    {
        return Some(format!(
            "spec.canary.trafficRef changed; it starts again once the weights on HTTPRoute {} are back",
            old.http_route
        ));
    }
    if let Some(old) = &c.target_ref
        && *old != canary.target_ref
    {
        return Some(format!(
            "spec.canary.targetRef changed from Deployment {} to {}; it starts again there",
            old.name, canary.target_ref.name
        ));
    }
    None
}

/// Why a warm canary Deployment serves nothing, if it does not.
fn unavailability(target: &Deployment) -> Option<String> {
    let name = target.metadata.name.clone().unwrap_or_default();
    if progress::wanted_replicas(target) == 0 {
        return Some(format!("canary Deployment {name} has 0 replicas"));
    }
    let available = target
        .status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0);
    (available == 0).then(|| format!("canary Deployment {name} has no available pod"))
}
