//! The soak: a version that turned Ready is judged for
//! `rolloutStrategy.soakSeconds` more before `Soaked` turns True for it,
//! the signal a fleet's next wave waits for (docs/fleet.md).
//!
//! Pure: [`judge`] reads what one pass observed of the rolled-out
//! template's pods and the soak's own record, and says whether the soak
//! runs on, is over, or failed. Nothing here polls: a running soak asks to
//! be looked at again when it ends, and every change to the pods or the
//! Deployment is a watch event that brings a pass anyway.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::analysis::{self, Check, Subject};
use super::conditions::{self, SOAKED};
use super::decision::{EventType, reason};
use super::pods::PodView;
use super::{ResourceView, Settings, Step, crash_loop, quality};
use crate::api::names::SOAK_ABORT_ANNOTATION;
use crate::api::{Analysis, OpenMedModelSpec, SoakStatus};
use crate::plan::Plan;

/// What one pass saw of a running soak.
#[derive(Debug, Clone)]
pub struct Watch<'a> {
    /// The rolled-out template's pods (`pods::of_rollout`).
    pub pods: Vec<&'a PodView>,
    /// The container that runs the service.
    pub container: &'a str,
    /// When the soak began, in seconds (the operator's clock).
    pub started: i64,
    /// When it ends, in seconds.
    pub ends: i64,
    /// Now, in seconds.
    pub now: i64,
    /// The Deployment has every pod of its template ready and available,
    /// and no other left.
    pub complete: bool,
    /// `rolloutStrategy.progressDeadlineSeconds`: how long a pod of the
    /// template may warm.
    pub deadline: i64,
    /// The quality gate failed a pod of the template (its words).
    pub quality_failure: Option<String>,
    /// A new value of `openmed.ai/soak-abort`.
    pub abort: Option<&'a str>,
}

/// How a soak stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It runs on; look again in this many seconds (0: its time is up,
    /// and it waits for the Deployment to have every pod ready again,
    /// which a watch reports).
    Soaking {
        /// Seconds until it ends.
        remaining: i64,
        /// Why it is not over although its time is up.
        waiting: Option<String>,
    },
    /// It is over, and the version soaked.
    Soaked,
    /// It failed.
    Failed {
        /// `SoakFailed` or `SoakAborted`.
        reason: &'static str,
        /// What failed, in the words a condition and an Event carry.
        message: String,
    },
}

/// Judges a running soak: the first failure, by kind (an abort, a restart,
/// a lost readiness, the gate) and then by pod name; else whether its
/// time is up with the Deployment whole.
pub fn judge(watch: &Watch) -> Verdict {
    if let Some(value) = watch.abort {
        return Verdict::Failed {
            reason: reason::SOAK_ABORTED,
            message: format!("{SOAK_ABORT_ANNOTATION} asked to abort the soak ({value})"),
        };
    }
    let mut pods = watch.pods.clone();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    let failed = |message: String| Verdict::Failed {
        reason: reason::SOAK_FAILED,
        message,
    };
    for pod in &pods {
        let Some(c) = pod.containers.iter().find(|c| c.name == watch.container) else {
            continue;
        };
        // A restart counts when its exit happened during the soak, or when
        // the pod itself is younger than the soak (all its restarts are).
        let exited_during = c.last_exit_at.is_some_and(|at| at >= watch.started);
        let young = pod.created.is_some_and(|at| at >= watch.started);
        if c.restarts > 0 && (exited_during || young) {
            let said = crash_loop::said(c).unwrap_or_else(|| "with no exit recorded".into());
            return failed(format!(
                "pod {} restarted during the soak: container {} restarted {} times, {said}",
                pod.name, watch.container, c.restarts
            ));
        }
    }
    for pod in &pods {
        // A pod that served when the soak began and stopped passing its
        // readiness probe: the model stopped answering. A pod created
        // since (a replacement, a scale-up) is still warming; its crash
        // or the gate's verdict would speak above.
        let older = pod.created.is_some_and(|at| at < watch.started);
        if older && !pod.containers_ready {
            return failed(format!(
                "pod {} stopped being ready during the soak",
                pod.name
            ));
        }
    }
    // Pods on a node whose model is not ready yet. A pod with no status
    // of its container was never placed (unscheduled at the autoscaler's
    // maximum, say): that is capacity, not the version.
    let warming: Vec<&&PodView> = pods
        .iter()
        .filter(|p| !p.containers_ready)
        .filter(|p| p.containers.iter().any(|c| c.name == watch.container))
        .collect();
    for pod in &warming {
        // A pod that began warming during the soak (a replacement, a
        // scale-up) and is not ready a whole progress deadline later: the
        // version cannot warm. The Deployment's own verdict would not
        // tell this from a lack of capacity, which is not the version's.
        let Some(since) = running_since(pod, watch.container) else {
            continue;
        };
        if since >= watch.started && watch.now - since > watch.deadline {
            return failed(format!(
                "pod {} has warmed for {} s without becoming ready, longer than the progress deadline ({} s)",
                pod.name,
                watch.now - since,
                watch.deadline
            ));
        }
    }
    if let Some(message) = &watch.quality_failure {
        return failed(message.clone());
    }
    let remaining = (watch.ends - watch.now).max(0);
    if remaining > 0 {
        return Verdict::Soaking {
            remaining,
            waiting: None,
        };
    }
    if let Some(pod) = warming.first() {
        return Verdict::Soaking {
            remaining: 0,
            waiting: Some(format!(
                "its time is up; waiting for pod {} to be ready",
                pod.name
            )),
        };
    }
    if !watch.complete && pods.is_empty() {
        return Verdict::Soaking {
            remaining: 0,
            waiting: Some("its time is up; waiting for every pod to be ready".into()),
        };
    }
    // Pods that never ran (unscheduled, refused by a quota) are the
    // cluster's capacity, not the version's: the Deployment's Degraded
    // condition says so, and the soak does not wait for them.
    Verdict::Soaked
}

/// Since when `container` of `pod` runs, if it does.
fn running_since(pod: &PodView, container: &str) -> Option<i64> {
    pod.containers
        .iter()
        .find(|c| c.name == container)
        .and_then(|c| c.running_since)
}

/// `Soaked=True`'s message, from the record alone, so every pass that
/// finds the same record writes the same words.
fn soaked_message(soak: &SoakStatus) -> String {
    let seconds = soak.end_time.0.as_second() - soak.start_time.0.as_second();
    match &soak.soaked_time {
        Some(at) if seconds > 0 => format!("{} soaked for {seconds} s, at {}", soak.version, at.0),
        _ => format!(
            "{} is ready; no soak was asked for, or it soaked before",
            soak.version
        ),
    }
}

/// Whether a failure's reason is a soak's: its rollback says "failed its
/// soak" rather than "did not become ready".
pub fn is_soak_failure(why: &str) -> bool {
    why == reason::SOAK_FAILED || why == reason::SOAK_ABORTED
}

fn at(second: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(second).unwrap_or_default())
}

impl Step<'_> {
    /// A forward rollout turned Ready: its soak begins, and without one it
    /// is over at once.
    pub(super) fn begin_soak(&mut self, wanted: &Plan) {
        let soaked = self
            .status
            .soak
            .as_ref()
            .is_some_and(|s| s.spec_hash == wanted.spec_hash && s.soaked_time.is_some());
        // A retained version succeeded, and soaked where a soak was asked,
        // before: Git put back on it after a rollback (or moved to it after
        // a manual one) serves what already proved itself.
        let retained = [
            &self.status.last_successful_spec,
            &self.status.previous_successful_spec,
        ]
        .into_iter()
        .flatten()
        .any(|spec| self.retained_plan(spec, wanted).spec_hash == wanted.spec_hash);
        if soaked || retained {
            // This very spec soaked before: it is not judged again.
            self.record_success(&wanted.normalized);
            self.soaked_before(wanted);
            return;
        }
        let now = self.obs.now.clone();
        let handled = self.status.soak.take().and_then(|s| s.abort_handled);
        self.status.soak = Some(SoakStatus {
            version: wanted.normalized.version.clone(),
            spec_hash: wanted.spec_hash.clone(),
            spec: Some(wanted.normalized.clone()),
            start_time: now.clone(),
            end_time: at(now.0.as_second() + self.soak_seconds),
            soaked_time: None,
            abort_handled: handled,
            analysis_time: None,
            failed_measurements: 0,
        });
        if self.soak_seconds == 0 {
            self.soak_over(wanted);
        } else {
            self.soaking(self.soak_seconds, None);
        }
    }

    /// A Ready resource: while its version soaks, the soak is judged (and
    /// a failure rolls back as a failed rollout does); else how well it
    /// is served. `complete`: the Deployment has every pod of the
    /// template available (its own verdict on a scale is not the version's).
    pub(super) fn ready(
        &mut self,
        desired: &Plan,
        wanted: &Plan,
        target: &Deployment,
        complete: bool,
    ) {
        let running = self
            .status
            .soak
            .as_ref()
            .filter(|s| s.spec_hash == wanted.spec_hash && s.soaked_time.is_none())
            .cloned();
        let Some(mut soak) = running else {
            self.steady(target, wanted);
            self.soaked_before(wanted);
            return;
        };
        // The spec's soak now, so an edit of soakSeconds moves the end.
        let started = soak.start_time.0.as_second();
        soak.end_time = at(started + self.soak_seconds);
        let abort = self
            .obs
            .resource
            .annotations
            .get(SOAK_ABORT_ANNOTATION)
            .filter(|v| soak.abort_handled.as_ref() != Some(*v));
        let quality_failure = if wanted.deployment.quality_gate {
            quality::failure(self.rollout_pods(target))
        } else {
            None
        };
        // The Deployment's own verdict (a progress deadline, a replica
        // failure) is not the version's once it turned Ready: after the
        // rollout only a scale moves the Deployment, and a scale the
        // cluster cannot carry out is capacity. The version's pods are
        // judged one by one instead.
        let verdict = match self.judge_soak_analysis(&mut soak) {
            Some(message) => Verdict::Failed {
                reason: reason::SOAK_FAILED,
                message,
            },
            None => judge(&Watch {
                pods: self.rollout_pods(target),
                container: &wanted.deployment.container,
                started,
                ends: soak.end_time.0.as_second(),
                now: self.obs.now.0.as_second(),
                complete,
                deadline: i64::from(wanted.normalized.rollout_strategy.progress_deadline_seconds),
                quality_failure,
                abort: abort.map(String::as_str),
            }),
        };
        if let Some(value) = abort {
            soak.abort_handled = Some(value.clone());
        }
        self.status.soak = Some(soak);
        match verdict {
            Verdict::Soaking { remaining, waiting } => {
                self.steady(target, wanted);
                self.soaking(remaining, waiting);
                if let Some(due) = self.soak_analysis_due_in() {
                    let due = Duration::from_secs(due.max(1) as u64);
                    self.requeue_after = Some(self.requeue_after.map_or(due, |d| d.min(due)));
                }
            }
            Verdict::Soaked => {
                self.steady(target, wanted);
                self.soak_over(wanted);
            }
            Verdict::Failed { reason, message } => {
                self.failed(desired, wanted, target, reason, &message);
                let version = &wanted.normalized.version;
                self.condition(
                    SOAKED,
                    false,
                    reason,
                    format!("{version} failed its soak: {message}"),
                );
            }
        }
    }

    /// The canary analysis's readings taken for this pass, judged and
    /// counted in `soak`; the failure, once more measurements failed than
    /// the analysis tolerates. No data counts neither way, as in a canary.
    fn judge_soak_analysis(&self, soak: &mut SoakStatus) -> Option<String> {
        let analysis = soak_analysis(self.obs.resource)?;
        // Only the analysis's own readings: a drain after the promotion is
        // measured beside them.
        let ours: Vec<&analysis::Measurement> = self
            .obs
            .measurements
            .iter()
            .filter(|m| {
                analysis.metrics.iter().any(|x| x.name == m.name)
                    || analysis.webhooks.iter().any(|x| x.name == m.name)
            })
            .collect();
        if ours.is_empty() {
            return None;
        }
        soak.analysis_time = Some(self.obs.now.clone());
        let mut failures = Vec::new();
        for m in ours {
            let (outcome, message) = analysis::judge(&analysis, m);
            if outcome == crate::api::Outcome::Fail {
                soak.failed_measurements += 1;
                failures.push(format!("{}: {message}", m.name));
            }
        }
        (soak.failed_measurements > analysis.failure_limit).then(|| {
            format!(
                "the canary analysis failed on the stable backend ({} failed, {} tolerated): {}",
                soak.failed_measurements,
                analysis.failure_limit,
                failures.join("; ")
            )
        })
    }

    /// Seconds until the soak's next analysis, when it has one.
    fn soak_analysis_due_in(&self) -> Option<i64> {
        let analysis = soak_analysis(self.obs.resource)?;
        let soak = self.status.soak.as_ref()?;
        Some(analysis_due_at(&analysis, soak) - self.obs.now.0.as_second())
    }

    /// `Soaked=False` while the soak runs, and a look again when it ends.
    /// The message names the end, not the time left, so a pass that finds
    /// nothing new writes nothing.
    fn soaking(&mut self, remaining: i64, waiting: Option<String>) {
        let Some(soak) = &self.status.soak else {
            return;
        };
        let message = match waiting {
            Some(why) => format!("{} soaked {} s: {why}", soak.version, self.soak_seconds),
            None => format!(
                "soaking {} for {} s, until {}",
                soak.version, self.soak_seconds, soak.end_time.0
            ),
        };
        self.condition(SOAKED, false, reason::SOAKING, message);
        if remaining > 0 {
            let due = Duration::from_secs(remaining as u64);
            self.requeue_after = Some(self.requeue_after.map_or(due, |d| d.min(due)));
        }
    }

    /// The soak is over: the version joins the history and `Soaked` turns
    /// True for it.
    fn soak_over(&mut self, wanted: &Plan) {
        self.record_success(&wanted.normalized);
        let now = self.obs.now.clone();
        let Some(soak) = self.status.soak.as_mut() else {
            return;
        };
        soak.soaked_time = Some(now);
        // It is `lastSuccessfulSpec` now.
        soak.spec = None;
        let message = soaked_message(soak);
        self.condition(SOAKED, true, reason::SOAKED, message.clone());
        if self.soak_seconds > 0 {
            self.event(EventType::Normal, reason::SOAKED, message);
        }
    }

    /// A Ready resource whose version has no soak on record: it was
    /// serving before this operator judged soaks (an upgrade, a move from
    /// the earlier operator), so it counts as soaked from now.
    fn soaked_before(&mut self, wanted: &Plan) {
        let recorded = self
            .status
            .soak
            .as_ref()
            .filter(|s| s.spec_hash == wanted.spec_hash && s.soaked_time.is_some())
            .map(soaked_message);
        if let Some(message) = recorded {
            // Soaked once, and asked for again (Git put back after a
            // rollback): no new soak, and no rollout either.
            self.condition(SOAKED, true, reason::SOAKED, message);
            return;
        }
        let now = self.obs.now.clone();
        let handled = self.status.soak.take().and_then(|s| s.abort_handled);
        let soak = SoakStatus {
            version: wanted.normalized.version.clone(),
            spec_hash: wanted.spec_hash.clone(),
            spec: None,
            start_time: now.clone(),
            end_time: now.clone(),
            soaked_time: Some(now),
            abort_handled: handled,
            analysis_time: None,
            failed_measurements: 0,
        };
        self.condition(SOAKED, true, reason::SOAKED, soaked_message(&soak));
        self.status.soak = Some(soak);
    }

    /// A value of `openmed.ai/soak-abort` that no running soak took in this
    /// pass acts on nothing: it is recorded as handled, and said once, so
    /// it never aborts the soak of a version it was not set for (a value
    /// left on the object, or set just after `Soaked` turned True).
    pub(super) fn soak_abort_ignored(&mut self) {
        let Some(value) = self.obs.resource.annotations.get(SOAK_ABORT_ANNOTATION) else {
            return;
        };
        let Some(soak) = self.status.soak.as_mut() else {
            // Nothing soaked yet to record it on: the first soak takes it.
            return;
        };
        if soak.abort_handled.as_ref() == Some(value) {
            return;
        }
        soak.abort_handled = Some(value.clone());
        let why = match &soak.soaked_time {
            Some(at) => format!("{} soaked at {}", soak.version, at.0),
            None => format!("{} is not soaking", soak.version),
        };
        let message =
            format!("{SOAK_ABORT_ANNOTATION}={value} is ignored: no soak is running ({why})");
        self.event(EventType::Warning, reason::SOAK_ABORT_IGNORED, message);
    }

    /// `Soaked` is True only for the spec the resource asks for, once it
    /// soaked: a new version in Git, a canary that runs, a rollback all
    /// turn it False in the same status write, whatever path the decision
    /// took.
    pub(super) fn soaked_only_for_the_desired_spec(&mut self) {
        if !conditions::is_true(&self.status.conditions, SOAKED) {
            return;
        }
        let desired = self.status.desired_spec_hash.as_deref();
        let soaked = self
            .status
            .soak
            .as_ref()
            .is_some_and(|s| Some(s.spec_hash.as_str()) == desired && s.soaked_time.is_some());
        if !soaked {
            let version = self.status.desired_version.clone().unwrap_or_default();
            self.condition(
                SOAKED,
                false,
                reason::NOT_SERVED_YET,
                format!("{version} has not soaked yet"),
            );
        }
    }
}

/// The canary analysis a soak keeps measuring: the metrics and webhooks
/// of `spec.canary.analysis` (the quality gate judges the pods), when the
/// resource has them.
fn soak_analysis(resource: &ResourceView) -> Option<Analysis> {
    let spec: OpenMedModelSpec = serde_json::from_value(resource.spec.clone()).ok()?;
    let mut analysis = spec.canary?.analysis?;
    analysis.probes = None;
    (!analysis.metrics.is_empty() || !analysis.webhooks.is_empty()).then_some(analysis)
}

/// When a running soak's next analysis is due: an interval after the
/// last, the first an interval after the soak began, so that each reading
/// covers the version's own traffic.
fn analysis_due_at(analysis: &Analysis, soak: &SoakStatus) -> i64 {
    let interval = (analysis::interval(analysis).as_secs() as i64).max(1);
    let last = soak.analysis_time.as_ref().unwrap_or(&soak.start_time);
    last.0.as_second() + interval
}

/// The checks a running soak asks for now, if any: those of the canary's
/// analysis, about the stable backend, which serves the version since the
/// promotion (`{{canary}}` names it too), at endpoints `settings` allows.
pub fn analysis_checks(resource: &ResourceView, settings: &Settings, now: &Time) -> Vec<Check> {
    soak_checks(resource, settings, now).unwrap_or_default()
}

fn soak_checks(resource: &ResourceView, settings: &Settings, now: &Time) -> Option<Vec<Check>> {
    let soak = resource.status.soak.as_ref()?;
    let running = soak.soaked_time.is_none()
        && resource.status.applied_spec_hash.as_deref() == Some(soak.spec_hash.as_str())
        && resource.status.phase == Some(crate::api::Phase::Ready)
        && conditions::get(&resource.status.conditions, SOAKED)
            .is_some_and(|c| c.reason == reason::SOAKING);
    if !running {
        return None;
    }
    let spec: OpenMedModelSpec = serde_json::from_value(resource.spec.clone()).ok()?;
    let canary = spec.canary?;
    let analysis = soak_analysis(resource)?;
    if analysis_due_at(&analysis, soak) > now.0.as_second() {
        return Some(Vec::new());
    }
    let mut traffic = canary.traffic_ref.clone();
    traffic.canary_backend = traffic.stable_backend.clone();
    let key = resource.key();
    let subject = Subject {
        resource: &key,
        namespace: &resource.namespace,
        traffic: &traffic,
        version: &soak.version,
        stable_version: &soak.version,
        step: 0,
        weight: 100,
        mirror: None,
    };
    Some(analysis::checks(
        &analysis,
        &subject,
        &settings.analysis_allow,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::pods::ContainerView;

    fn pod(name: &str, created: i64, ready: bool) -> PodView {
        PodView {
            name: name.into(),
            created: Some(created),
            containers_ready: ready,
            containers: vec![ContainerView {
                name: "openmed-service".into(),
                ..ContainerView::default()
            }],
            ..PodView::default()
        }
    }

    fn watch<'a>(pods: &'a [PodView], now: i64) -> Watch<'a> {
        Watch {
            pods: pods.iter().collect(),
            container: "openmed-service",
            started: 1000,
            ends: 1300,
            now,
            complete: true,
            deadline: 600,
            quality_failure: None,
            abort: None,
        }
    }

    #[test]
    fn a_soak_runs_its_time_then_soaks_once_every_pod_is_ready() {
        let pods = [pod("a", 900, true), pod("b", 950, true)];
        assert_eq!(
            judge(&watch(&pods, 1100)),
            Verdict::Soaking {
                remaining: 200,
                waiting: None
            }
        );
        assert_eq!(judge(&watch(&pods, 1300)), Verdict::Soaked);
        let mut partial = watch(&[], 1400);
        partial.complete = false;
        assert!(
            matches!(
                judge(&partial),
                Verdict::Soaking {
                    remaining: 0,
                    waiting: Some(_)
                }
            ),
            "time up with the Deployment incomplete and no pod seen waits"
        );
        let warming = [pod("a", 900, true), pod("new", 1350, false)];
        assert_eq!(
            judge(&watch(&warming, 1400)),
            Verdict::Soaking {
                remaining: 0,
                waiting: Some("its time is up; waiting for pod new to be ready".into())
            },
            "time up with a pod of the version warming waits for it"
        );
        let mut unplaced = pod("pending", 1350, false);
        unplaced.containers.clear();
        let pending = [pod("a", 900, true), unplaced];
        let mut incomplete = watch(&pending, 1400);
        incomplete.complete = false;
        assert_eq!(
            judge(&incomplete),
            Verdict::Soaked,
            "a pod never placed on a node is capacity, not the version"
        );
    }

    #[test]
    fn a_restart_during_the_soak_fails_it_and_one_from_before_does_not() {
        let mut earlier = pod("a", 900, true);
        earlier.containers[0].restarts = 1;
        earlier.containers[0].last_exit = Some((137, "OOMKilled".into(), String::new()));
        earlier.containers[0].last_exit_at = Some(950);
        let pods = [earlier.clone()];
        assert_eq!(
            judge(&watch(&pods, 1100)),
            Verdict::Soaking {
                remaining: 200,
                waiting: None
            },
            "a restart before the soak began is the rollout's business, not the soak's"
        );
        let mut during = earlier;
        during.containers[0].last_exit_at = Some(1050);
        let pods = [during];
        let Verdict::Failed { reason, message } = judge(&watch(&pods, 1100)) else {
            panic!("a restart during the soak fails it");
        };
        assert_eq!(reason, "SoakFailed");
        assert_eq!(
            message,
            "pod a restarted during the soak: container openmed-service restarted 1 times, exit code 137 (OOMKilled)"
        );
    }

    #[test]
    fn a_pod_that_stops_being_ready_fails_the_soak_and_a_warming_one_does_not() {
        let pods = [pod("a", 900, true), pod("new", 1100, false)];
        assert!(
            matches!(judge(&watch(&pods, 1200)), Verdict::Soaking { .. }),
            "a pod created during the soak is warming"
        );
        let pods = [pod("a", 900, false)];
        assert_eq!(
            judge(&watch(&pods, 1200)),
            Verdict::Failed {
                reason: "SoakFailed",
                message: "pod a stopped being ready during the soak".into()
            }
        );
    }

    #[test]
    fn the_gates_verdict_and_an_abort_fail_the_soak() {
        let pods = [pod("a", 900, true)];
        let mut gated = watch(&pods, 1200);
        gated.quality_failure = Some("pod a failed the quality gate: DATE recall 0.00".into());
        assert!(matches!(
            judge(&gated),
            Verdict::Failed {
                reason: "SoakFailed",
                ..
            }
        ));
        let mut aborted = watch(&pods, 1200);
        aborted.abort = Some("ops-ticket-42");
        let Verdict::Failed { reason, message } = judge(&aborted) else {
            panic!("an abort fails the soak");
        };
        assert_eq!(reason, "SoakAborted");
        assert!(message.contains("ops-ticket-42"), "{message}");
    }
}
