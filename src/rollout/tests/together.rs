//! Where features meet in one pass: a canary and a soak, the served set
//! and a soak, an autoscaler and a canary. Each test here is a defect that
//! every feature's own tests missed, kept so it cannot come back.

use super::canary::canary_spec;
use super::*;
use crate::api::CanaryState;
use crate::api::names::SERVED_ENV;
use conditions::SOAKED;

/// The model's own entries of the served set of a Deployment's template.
fn served_of(d: &Value) -> Vec<String> {
    let value = d["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == SERVED_ENV)
        .map(|e| e["value"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default();
    value
        .split(',')
        .filter(|v| !crate::plan::served::SERVICE_DEFAULTS.contains(v))
        .map(str::to_owned)
        .collect()
}

impl World {
    /// v1 soaked, v2 soaking (300 s each) until a pod of it crashes a
    /// minute in: rolled back to v1.
    fn soak_failed() -> World {
        let mut w = World::soaked_at("v1", 300);
        w.bump_to_soaking("v2");
        w.now += 60;
        w.crashing_pod("svc-new-1", 1, "Killed");
        w.reconcile();
        assert_eq!(w.status().rollback_request.as_deref(), Some("automatic:v1"));
        w
    }

    /// A canary of steps 20 % and 60 % with a soak of `soak` seconds, v1
    /// Ready and soaked.
    fn canary_soaking(soak: i64) -> World {
        let steps = json!([{"weight": 20, "pause": "30s"}, {"weight": 60, "pause": "30s"}]);
        let mut w = World::canary_ready(steps.clone(), None);
        let mut spec = canary_spec("v1", steps, None);
        spec["rolloutStrategy"]["soakSeconds"] = json!(soak);
        w.set_spec(spec);
        w.now += 10;
        w.reconcile();
        assert_eq!(
            w.condition(SOAKED).0,
            "True",
            "v1 served before the soak was asked for"
        );
        w
    }

    /// Bumps to `version`, runs every step of its canary and promotes it:
    /// the stable Deployment serves it, Ready, its soak begun.
    fn promoted(&mut self, version: &str) {
        self.set_version(version);
        self.now += 5;
        self.reconcile();
        assert_eq!(self.canary_status().state, CanaryState::Warming);
        self.canary_pods_ready();
        for _ in 0..10 {
            self.now += 31;
            self.reconcile();
            if self.status().phase == Some(Phase::RollingOut) {
                break;
            }
        }
        assert_eq!(self.status().phase, Some(Phase::RollingOut), "promoted");
        self.pods_ready();
        self.now += 10;
        self.reconcile();
        assert_eq!(self.status().phase, Some(Phase::Ready));
        assert_eq!(self.status().active_version.as_deref(), Some(version));
    }
}

#[test]
fn a_bump_while_the_version_soaks_is_tried_on_the_canary_against_the_soaking_version() {
    let mut w = World::canary_soaking(300);
    w.promoted("v2");
    assert_eq!(w.condition(SOAKED), ("False".into(), "Soaking".into()));
    assert_eq!(
        w.status().last_successful_spec.as_ref().unwrap().version,
        "v1",
        "v2 has not soaked yet"
    );
    let stable = w.dep()["spec"]["template"].clone();
    w.events.clear();

    w.set_version("v3");
    w.now += 5;
    w.reconcile();
    assert!(
        !w.reasons().contains(&reason::ROLLOUT_STARTED),
        "no rollout of v3 on the stable Deployment: {:?}",
        w.reasons()
    );
    assert!(
        w.reasons().contains(&reason::CANARY_STARTED),
        "{:?}",
        w.reasons()
    );
    assert_eq!(
        w.dep()["spec"]["template"],
        stable,
        "the stable Deployment keeps serving v2"
    );
    assert_eq!(w.canary_version().as_deref(), Some("v3"));
    let started = w
        .events
        .iter()
        .find(|e| e.reason == reason::CANARY_STARTED)
        .unwrap();
    assert!(
        started.message.contains("the stable Deployment serves v2"),
        "{}",
        started.message
    );
    assert_eq!(w.weights(), (100, 0));

    // v3 gets its share only through the steps.
    w.canary_pods_ready();
    w.now += 5;
    w.reconcile();
    assert_eq!(w.weights(), (80, 20));
    assert_eq!(w.dep()["spec"]["template"], stable);
}

#[test]
fn a_canary_aborted_during_a_soak_leaves_the_soaking_version_on_the_stable_deployment() {
    let mut w = World::canary_soaking(300);
    w.promoted("v2");
    let stable = w.dep()["spec"]["template"].clone();
    w.set_version("v3");
    w.now += 5;
    w.reconcile();
    w.resource.annotations.insert(
        crate::api::names::CANARY_ABORT_ANNOTATION.into(),
        "t-1".into(),
    );
    w.now += 5;
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
    w.now += 5;
    w.reconcile();
    assert_eq!(
        w.dep()["spec"]["template"],
        stable,
        "the stable Deployment is not moved to v1, which nobody asked for"
    );
}

#[test]
fn a_bump_while_the_version_soaks_serves_the_soaking_version_beside_the_new_one() {
    let mut w = World::soaked_at("v1", 300);
    w.bump_to_soaking("v2");
    assert_eq!(served_of(w.dep()), ["v2", "v1"]);
    w.set_version("v3");
    w.now += 10;
    w.reconcile();
    assert_eq!(
        served_of(w.dep()),
        ["v3", "v2"],
        "every pod serves v2 now: its clients are answered by v3's pods"
    );
}

#[test]
fn a_soak_failure_rolls_back_to_a_template_that_serves_the_failed_version_too() {
    let mut w = World::soak_failed();
    assert_eq!(w.cm_version(), "v1");
    assert_eq!(
        served_of(w.dep()),
        ["v1", "v2"],
        "v2 served every client for a minute: they are answered while they move back"
    );
}

#[test]
fn a_bump_in_the_middle_of_a_rollout_serves_every_version_a_ready_pod_preloads() {
    let mut w = World::soaked_at("v1", 0);
    w.set_version("v2");
    w.now += 10;
    w.reconcile();
    // One pod of v2's template is warm and ready; v1's pods still serve.
    let replica_set = w.controller_rolls();
    w.crashing_pod_of("svc-v2-1", &replica_set, w.now, 0, "");
    w.pods.last_mut().unwrap().containers_ready = true;
    w.set_version("v3");
    w.now += 10;
    w.reconcile();
    assert_eq!(served_of(w.dep()), ["v3", "v1", "v2"]);
}

impl World {
    /// An autoscaled canary (2 to 20 pods, the stable side at 10) of v2 at
    /// its first step, 20 %.
    fn autoscaled_canary_at_first_step() -> World {
        let steps = json!([{"weight": 20, "pause": "30s"}, {"weight": 50, "pause": "30s"}]);
        let mut spec = canary_spec("v1", steps.clone(), None);
        spec["autoscaling"] = json!({"minReplicas": 2, "maxReplicas": 20});
        let mut w = World::canary_ready(steps, None);
        w.set_spec(spec);
        w.reconcile();
        w.dep()["spec"]["replicas"] = json!(10);
        w.pods_ready();
        w.now += 10;
        w.reconcile();
        w.set_version("v2");
        w.reconcile();
        w.canary_pods_ready();
        w.now += 5;
        w.reconcile();
        w.reconcile();
        w.canary_pods_ready();
        w.reconcile();
        assert_eq!(w.weights(), (80, 20));
        assert_eq!(
            w.autoscaler_min(),
            Some(10),
            "the stable side keeps its pods"
        );
        w
    }
}

#[test]
fn removing_spec_canary_mid_canary_lifts_the_stable_floor_once_the_weights_are_back() {
    let mut w = World::autoscaled_canary_at_first_step();
    let mut spec = w.resource.spec.clone();
    spec.as_object_mut().unwrap().remove("canary");
    w.set_spec(spec);
    for _ in 0..3 {
        w.now += 5;
        w.reconcile();
    }
    assert_eq!(w.weights(), (100, 0));
    assert_eq!(w.canary_status().stable_replicas, None);
    assert_eq!(
        w.autoscaler_min(),
        Some(2),
        "the spec's minimum once no canary runs"
    );
}

#[test]
fn a_canary_deployment_deleted_mid_canary_lifts_the_stable_floor_after_the_abort() {
    let mut w = World::autoscaled_canary_at_first_step();
    w.canary = None;
    for _ in 0..4 {
        w.now += 61;
        w.reconcile();
    }
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
    assert_eq!(w.weights(), (100, 0));
    assert_eq!(
        w.autoscaler_min(),
        Some(2),
        "the floor went with the canary"
    );
}

#[test]
fn a_soak_abort_set_after_the_soak_is_ignored_and_never_aborts_the_next_soak() {
    let mut w = World::soaked_at("v1", 300);
    w.resource.annotations.insert(
        crate::api::names::SOAK_ABORT_ANNOTATION.into(),
        "incident-9".into(),
    );
    w.now += 5;
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::SOAK_ABORT_IGNORED]);
    assert!(
        events[0]
            .message
            .contains("no soak is running (v1 soaked at"),
        "{}",
        events[0].message
    );
    w.now += 60;
    assert!(w.reconcile().is_empty(), "said once");

    // Days later, the next version soaks in full.
    w.now += 3 * 86_400;
    w.bump_to_soaking("v2");
    w.now += 300;
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::SOAKED]);
    assert_eq!(
        w.status().last_successful_spec.as_ref().unwrap().version,
        "v2"
    );
}

impl World {
    /// A pod of the current template, created at `created`; its service
    /// container running since `running` (None: not scheduled, no
    /// container status yet), ready or not.
    fn template_pod(&mut self, name: &str, created: i64, running: Option<i64>, ready: bool) {
        let replica_set = self
            .replica_sets
            .last()
            .map(|u| u.replica_set.clone())
            .unwrap_or_else(|| self.controller_rolls());
        let snapshot = self.template_snapshot();
        self.pods.push(crate::rollout::pods::PodView {
            owner: Some("ns/svc".into()),
            namespace: "ns".into(),
            name: name.into(),
            snapshot,
            replica_set: Some(replica_set),
            created: Some(at(created).0.as_second()),
            containers_ready: ready,
            containers: running
                .map(|r| crate::rollout::pods::ContainerView {
                    name: "openmed-service".into(),
                    running_since: Some(at(r).0.as_second()),
                    ..Default::default()
                })
                .into_iter()
                .collect(),
            ..Default::default()
        });
    }

    /// v1 soaked and v2 soaking (300 s each), 2 to 4 pods by the
    /// model's autoscaler.
    fn autoscaled_soak() -> World {
        let mut spec = super::soak::soaking_spec("v1", 300);
        spec["autoscaling"] = json!({"minReplicas": 2, "maxReplicas": 4});
        let mut w = World::new(spec);
        w.reconcile();
        w.pods_ready();
        w.now += 10;
        w.reconcile();
        w.now += 300;
        w.reconcile();
        assert_eq!(w.condition(SOAKED).0, "True");
        w.bump_to_soaking("v2");
        w
    }

    /// The autoscaler asks for more pods than the cluster can run: the
    /// Deployment controller reports the scale-up failed.
    fn scale_up_refused(&mut self, condition: Value) {
        let d = self.dep();
        d["spec"]["replicas"] = json!(4);
        d["status"] = json!({
            "observedGeneration": d["metadata"]["generation"], "replicas": 2, "updatedReplicas": 2,
            "readyReplicas": 2, "availableReplicas": 2, "unavailableReplicas": 2,
            "conditions": [condition],
        });
    }
}

#[test]
fn a_scale_up_a_quota_refuses_during_the_soak_is_not_the_versions_failure() {
    let mut w = World::autoscaled_soak();
    let soak_start = w.now;
    w.template_pod("svc-v2-a", soak_start - 20, Some(soak_start - 15), true);
    w.template_pod("svc-v2-b", soak_start - 20, Some(soak_start - 15), true);
    w.now += 700;
    let stamp = json!(at(w.now));
    w.scale_up_refused(
        json!({"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
        "message": "pods \"svc-v2-x\" is forbidden: exceeded quota: compute",
        "lastUpdateTime": stamp, "lastTransitionTime": stamp}),
    );
    let events = w.reconcile();
    assert!(
        !reasons(&events).contains(&reason::ROLLOUT_FAILED),
        "{events:?}"
    );
    assert_eq!(w.status().active_version.as_deref(), Some("v2"));
    let soaked = conditions::get(&w.status().conditions, SOAKED).unwrap();
    assert_eq!(
        (soaked.status.as_str(), soaked.reason.as_str()),
        ("True", "Soaked"),
        "{}",
        soaked.message
    );
    assert_eq!(
        w.condition(DEGRADED).0,
        "True",
        "the capacity shows in Degraded"
    );
}

#[test]
fn pods_pending_at_the_autoscalers_maximum_do_not_hold_the_soak_and_a_warming_one_does() {
    let mut w = World::autoscaled_soak();
    let soak_start = w.now;
    w.template_pod("svc-v2-a", soak_start - 20, Some(soak_start - 15), true);
    w.template_pod("svc-v2-b", soak_start - 20, Some(soak_start - 15), true);
    // Two more the scheduler cannot place, and one warming.
    w.template_pod("svc-v2-c", soak_start + 10, None, false);
    w.template_pod("svc-v2-d", soak_start + 10, None, false);
    w.template_pod("svc-v2-e", soak_start + 250, Some(soak_start + 260), false);
    w.scale_up_refused(
        json!({"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}),
    );
    w.now = soak_start + 300;
    w.reconcile();
    let soaked = conditions::get(&w.status().conditions, SOAKED)
        .unwrap()
        .clone();
    assert_eq!(soaked.status, "False");
    assert!(
        soaked
            .message
            .contains("waiting for pod svc-v2-e to be ready"),
        "the status says what the soak waits for: {}",
        soaked.message
    );
    // The warming pod becomes ready: the soak is over, the Pending pods
    // notwithstanding.
    w.pods
        .iter_mut()
        .find(|p| p.name == "svc-v2-e")
        .unwrap()
        .containers_ready = true;
    w.now += 5;
    w.reconcile();
    assert_eq!(w.condition(SOAKED), ("True".into(), "Soaked".into()));
}

#[test]
fn a_scale_up_pod_that_never_warms_fails_the_soak() {
    let mut w = World::soaked_at("v1", 300);
    w.bump_to_soaking("v2");
    let soak_start = w.now;
    w.template_pod("svc-v2-a", soak_start - 20, Some(soak_start - 15), true);
    w.template_pod("svc-v2-e", soak_start + 10, Some(soak_start + 12), false);
    w.now = soak_start + 12 + 601;
    let events = w.reconcile();
    assert_eq!(
        reasons(&events),
        [reason::ROLLOUT_FAILED, reason::ROLLBACK_STARTED]
    );
    assert!(
        events[0]
            .message
            .contains("pod svc-v2-e has warmed for 601 s"),
        "{}",
        events[0].message
    );
}

#[test]
fn git_put_back_on_the_version_a_soak_failure_restored_is_soaked_at_once() {
    let mut w = World::soak_failed();
    w.pods.clear();
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    w.set_version("v1");
    w.now += 10;
    w.reconcile();
    assert_eq!(
        w.condition(SOAKED),
        ("True".into(), "Soaked".into()),
        "v1 soaked before: no second soak of 300 s (docs/fleet.md)"
    );
    assert_eq!(w.status().phase, Some(Phase::Ready));
}

#[test]
fn pods_the_quality_gate_failed_served_nobody_and_a_rollback_does_not_serve_their_version() {
    let mut w = World::ready_at("v1");
    w.upgrade("v2");
    w.set_version("v3");
    w.now += 10;
    w.reconcile();
    w.judged_pod(
        "svc-v3-a",
        false,
        "DATE recall 0.00 is below 1.00 (minRecall)",
    );
    w.annotate_rollback(Some("v2"));
    w.now += 10;
    w.reconcile();
    assert_eq!(w.status().rollback_request.as_deref(), Some("manual:v2"));
    assert_eq!(
        served_of(w.dep()),
        ["v2", "v1"],
        "v2's own template: v3's pods were never Ready, and v1's clients keep their answers"
    );
}
