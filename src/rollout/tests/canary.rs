//! Canaries, through the same simulated world: a canary Deployment moved
//! by hand like the stable one, and an HTTPRoute that takes JSON Patches.

use super::*;
use crate::api::endpoints::AllowList;
use crate::api::names::{
    CANARY_ABORT_ANNOTATION, CANARY_PAUSE_ANNOTATION, CANARY_PROMOTE_ANNOTATION,
};
use crate::api::{CanaryState, CanaryStatus};
use analysis::{Check, Measurement, Reading};

pub(super) fn canary_spec(version: &str, steps: Value, analysis: Option<Value>) -> Value {
    let mut canary = json!({
        "targetRef": {"name": "svc-canary"},
        "trafficRef": {"httpRoute": "svc", "ruleName": "main",
                       "stableBackend": "svc", "canaryBackend": "svc-canary"},
        "steps": steps,
    });
    if let Some(a) = analysis {
        canary["analysis"] = a;
    }
    let mut s = spec(version);
    s["canary"] = canary;
    s["rolloutStrategy"] = json!({"progressDeadlineSeconds": 60});
    s
}

pub(super) fn route() -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "svc", "namespace": "ns", "generation": 1},
        "spec": {"rules": [
            {"name": "docs", "backendRefs": [{"name": "docs", "port": 80, "weight": 1}]},
            {"name": "main", "backendRefs": [
                {"name": "svc", "port": 8080, "weight": 100},
                {"name": "svc-canary", "port": 8080, "weight": 0}]},
        ]},
    })
}

fn error_rate() -> Value {
    json!({"interval": "10s", "failureLimit": 1, "metrics": [{
        "name": "error-rate", "thresholdRange": {"max": 0.01},
        "prometheus": {"address": "http://prometheus:9090",
                       "query": "errors{service=\"{{canary}}\"}"}}]})
}

/// The allow list of these `--analysis-allow` prefixes.
fn allow(prefixes: &[&str]) -> AllowList {
    AllowList::new(prefixes.iter().map(|p| p.parse().unwrap()).collect())
}

impl World {
    /// v1 Ready on the stable Deployment, with a canary Deployment and a
    /// route at rest, and the canary block in the spec; the operator
    /// allows the tests' analysis endpoints.
    pub(super) fn canary_ready(steps: Value, analysis: Option<Value>) -> World {
        let mut w = World::new(canary_spec("v1", steps, analysis));
        w.settings.analysis_allow = allow(&["http://prometheus:9090", "http://smoke"]);
        let mut canary = deployment("svc-canary");
        canary["spec"]["replicas"] = json!(1);
        w.canary = Some(canary);
        w.route = Some(route());
        w.reconcile();
        w.pods_ready();
        w.now += 10;
        w.reconcile();
        assert_eq!(w.status().phase, Some(Phase::Ready));
        // At rest the canary Deployment serves the stable version.
        w.canary_pods_ready();
        w.reconcile();
        assert_eq!(w.canary_version().as_deref(), Some("v1"));
        w
    }

    pub(super) fn canary_dep(&mut self) -> &mut Value {
        self.canary.as_mut().unwrap()
    }

    pub(super) fn canary_pods_ready(&mut self) {
        let d = self.canary_dep();
        let want = d["spec"]["replicas"].clone();
        d["status"] = json!({
            "observedGeneration": d["metadata"]["generation"], "replicas": want, "updatedReplicas": want,
            "readyReplicas": want, "availableReplicas": want,
            "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}],
        });
    }

    /// The version the canary's template reads, if it reads one of ours.
    pub(super) fn canary_version(&self) -> Option<String> {
        let env = &self.canary.as_ref()?["spec"]["template"]["spec"]["containers"][0]["env"][0];
        let name = env["valueFrom"]["configMapKeyRef"]["name"].as_str()?;
        self.version_in(name)
    }

    pub(super) fn weights(&self) -> (i64, i64) {
        let refs = &self.route.as_ref().unwrap()["spec"]["rules"][1]["backendRefs"];
        (
            refs[0]["weight"].as_i64().unwrap(),
            refs[1]["weight"].as_i64().unwrap(),
        )
    }

    pub(super) fn canary_status(&self) -> &CanaryStatus {
        self.status().canary.as_ref().expect("a canary status")
    }

    fn route_writes(&self) -> usize {
        self.writes
            .iter()
            .filter(|w| matches!(w, Write::PatchRoute { .. }))
            .count()
    }

    pub(super) fn reasons(&self) -> Vec<&'static str> {
        self.events.iter().map(|e| e.reason).collect()
    }

    fn measured(&mut self, reading: Reading) {
        self.measurements = vec![Measurement {
            name: "error-rate".into(),
            reading,
        }];
    }
}

#[test]
fn a_canary_warms_then_steps_then_promotes_and_the_route_ends_as_it_began() {
    let mut w = World::canary_ready(
        json!([{"weight": 10, "pause": "30s"}, {"weight": 50, "pause": "30s"}]),
        None,
    );
    let stable_hash = w.template_hash();
    w.set_version("v2");
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::Canary));
    assert_eq!(w.canary_status().state, CanaryState::Warming);
    assert_eq!(w.canary_version().as_deref(), Some("v2"));
    assert_eq!(
        w.template_hash(),
        stable_hash,
        "the stable Deployment is left alone"
    );
    assert_eq!(
        w.weights(),
        (100, 0),
        "no traffic before the canary is warm"
    );
    assert_eq!(w.condition(RECONCILING).0, "True");

    w.canary_pods_ready();
    w.now += 5;
    w.reconcile();
    assert_eq!(w.weights(), (90, 10));
    assert_eq!((w.canary_status().step, w.canary_status().weight), (1, 10));
    assert_eq!(w.route_writes(), 1);

    w.now += 20;
    w.reconcile();
    assert_eq!(w.weights(), (90, 10), "the pause holds");
    w.now += 11;
    w.reconcile();
    assert_eq!(w.weights(), (50, 50));
    assert_eq!(w.canary_status().step, 2);

    w.now += 31;
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Promoting);
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::RollingOut));
    assert_ne!(
        w.template_hash(),
        stable_hash,
        "promotion rolls the stable one"
    );
    assert_eq!(
        w.weights(),
        (50, 50),
        "the weights hold while the stable one rolls"
    );

    w.pods_ready();
    w.now += 10;
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::Ready));
    assert_eq!(w.status().active_version.as_deref(), Some("v2"));
    assert_eq!(w.canary_status().state, CanaryState::Promoted);
    assert_eq!(w.weights(), (100, 0), "at rest the route is what Git says");
    assert_eq!(
        w.reasons()
            .iter()
            .filter(|r| r.starts_with("Canary"))
            .copied()
            .collect::<Vec<_>>(),
        [
            reason::CANARY_STARTED,
            reason::CANARY_WEIGHT_CHANGED,
            reason::CANARY_WEIGHT_CHANGED,
            reason::CANARY_PROMOTING,
            reason::CANARY_PROMOTED,
            reason::CANARY_DRAINED,
        ]
    );
    // Nothing more to do.
    w.reconcile();
    assert!(w.writes.is_empty(), "{:?}", w.writes);
}

#[test]
fn a_canary_that_never_warms_aborts_with_the_weights_never_moved() {
    let mut w = World::canary_ready(json!([{"weight": 10, "pause": "30s"}]), None);
    let stable_hash = w.template_hash();
    w.set_version("broken");
    w.reconcile();
    // The canary's own progress deadline.
    let now = json!(at(w.now + 61));
    let d = w.canary_dep();
    d["status"] = json!({"observedGeneration": d["metadata"]["generation"], "replicas": 1,
        "updatedReplicas": 1, "readyReplicas": 0, "availableReplicas": 0,
        "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                        "message": "timed out", "lastUpdateTime": now, "lastTransitionTime": now}]});
    w.now += 61;
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::RolledBack));
    assert_eq!(
        w.condition(ROLLED_BACK),
        ("True".into(), reason::CANARY_ABORTED.into())
    );
    assert_eq!(w.condition(STALLED).0, "True");
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
    assert_eq!(w.status().desired_version.as_deref(), Some("broken"));
    assert_eq!(w.status().active_version.as_deref(), Some("v1"));
    assert_eq!(
        w.status().rollback_count,
        None,
        "no rollback of the stable one"
    );
    assert_eq!(w.weights(), (100, 0));
    assert!(
        w.events
            .iter()
            .all(|e| e.reason != reason::CANARY_WEIGHT_CHANGED)
    );
    assert_eq!(w.template_hash(), stable_hash);
    assert_eq!(
        w.canary_version().as_deref(),
        Some("v1"),
        "the canary goes back"
    );

    // The same spec is not tried again...
    w.now += 100;
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
    assert_eq!(w.canary_version().as_deref(), Some("v1"));
    // ...until a field the operator hashes changes.
    w.resource.spec["replicas"] = json!(3);
    w.resource.generation += 1;
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Warming);
    assert_eq!(w.canary_version().as_deref(), Some("broken"));
}

#[test]
fn the_operator_counts_the_deadline_itself_when_the_canary_never_reports() {
    let mut w = World::canary_ready(json!([{"weight": 10, "pause": "30s"}]), None);
    w.set_version("v2");
    w.reconcile();
    w.now += 30;
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Warming);
    w.now += 31;
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
    assert!(
        w.canary_status().message.contains("progress deadline"),
        "{}",
        w.canary_status().message
    );
    assert_eq!(w.weights(), (100, 0));
}

/// v2 warmed and at its first step with analysis every 10 s.
fn at_first_step(analysis: Value) -> World {
    let mut w = World::canary_ready(
        json!([{"weight": 10, "pause": "20s"}, {"weight": 50, "pause": "20s"}]),
        Some(analysis),
    );
    w.set_version("v2");
    w.reconcile();
    w.canary_pods_ready();
    w.reconcile();
    assert_eq!(w.weights(), (90, 10));
    w
}

#[test]
fn failed_measurements_abort_past_the_failure_limit() {
    let mut w = at_first_step(error_rate());
    w.measured(Reading::Sample(0.2));
    w.now += 10;
    w.reconcile();
    assert_eq!(w.canary_status().failures, 1);
    assert_eq!(w.canary_status().state, CanaryState::Progressing);
    assert_eq!(w.weights(), (90, 10), "one failure is tolerated");
    assert_eq!(w.events.last().unwrap().reason, reason::ANALYSIS_FAILED);
    // Not due again before the interval.
    w.now += 5;
    w.reconcile();
    assert_eq!(w.canary_status().failures, 1);
    w.now += 5;
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
    assert_eq!(w.weights(), (100, 0), "the weights go back at once");
    assert_eq!(w.status().phase, Some(Phase::RolledBack));
    let results = &w.canary_status().analysis;
    assert_eq!(results.len(), 2);
    assert!(
        results
            .iter()
            .all(|r| r.outcome == crate::api::Outcome::Fail)
    );
}

#[test]
fn no_data_holds_the_step_and_never_counts_as_a_pass() {
    let mut w = at_first_step(error_rate());
    for reading in [Reading::NoData, Reading::Sample(f64::NAN)] {
        w.measured(reading);
        w.now += 11;
        w.reconcile();
        assert_eq!(w.canary_status().state, CanaryState::Paused);
        assert_eq!(
            w.condition(STALLED),
            ("True".into(), reason::ANALYSIS_INCONCLUSIVE.into())
        );
        assert_eq!(w.weights(), (90, 10), "past the pause, still held");
        assert_eq!(w.canary_status().failures, 0);
    }
    w.measured(Reading::Sample(0.001));
    w.now += 11;
    w.reconcile();
    assert_eq!(w.weights(), (50, 50), "a passing round ends the step");
}

#[test]
fn a_route_rewritten_by_another_writer_pauses_the_canary_and_is_not_clobbered() {
    let mut w = at_first_step(
        json!({"interval": "10s", "webhooks": [{"name": "smoke", "url": "http://smoke"}]}),
    );
    // A GitOps sync puts Git's weights back.
    w.route.as_mut().unwrap()["spec"]["rules"][1]["backendRefs"][1]["weight"] = json!(0);
    w.route.as_mut().unwrap()["spec"]["rules"][1]["backendRefs"][0]["weight"] = json!(100);
    w.now += 30;
    w.reconcile();
    assert_eq!(w.route_writes(), 0);
    assert_eq!(w.weights(), (100, 0));
    assert_eq!(w.canary_status().state, CanaryState::Paused);
    assert_eq!(
        w.condition(STALLED),
        ("True".into(), reason::ROUTE_DRIFT.into())
    );
    assert!(
        w.canary_status()
            .message
            .contains("/spec/rules/1/backendRefs/*/weight")
    );
    assert_eq!(w.events.last().unwrap().reason, reason::ROUTE_DRIFT);
    // Once the weights are ours again (the GitOps tool ignores them), it
    // goes on.
    w.route.as_mut().unwrap()["spec"]["rules"][1]["backendRefs"][1]["weight"] = json!(10);
    w.route.as_mut().unwrap()["spec"]["rules"][1]["backendRefs"][0]["weight"] = json!(90);
    w.measurements = vec![Measurement {
        name: "smoke".into(),
        reading: Reading::Answer(200),
    }];
    w.now += 1;
    w.reconcile();
    assert_eq!(w.weights(), (50, 50));
}

#[test]
fn gates_act_once_per_value() {
    let mut w = World::canary_ready(json!([{"weight": 10}, {"weight": 50}]), None);
    w.set_version("v2");
    w.reconcile();
    w.canary_pods_ready();
    w.reconcile();
    assert_eq!(w.weights(), (90, 10));
    w.now += 600;
    w.reconcile();
    assert_eq!(
        w.canary_status().state,
        CanaryState::Paused,
        "no pause: wait for a person"
    );
    assert_eq!(
        w.condition(STALLED),
        ("True".into(), reason::CANARY_PAUSED.into())
    );

    w.resource
        .annotations
        .insert(CANARY_PROMOTE_ANNOTATION.into(), "1".into());
    w.reconcile();
    assert_eq!(w.weights(), (50, 50));
    assert_eq!(w.canary_status().promote_handled.as_deref(), Some("1"));
    w.reconcile();
    assert_eq!(
        w.weights(),
        (50, 50),
        "the same value is not acted on twice"
    );

    w.resource
        .annotations
        .insert(CANARY_PAUSE_ANNOTATION.into(), String::new());
    w.resource
        .annotations
        .insert(CANARY_PROMOTE_ANNOTATION.into(), "2".into());
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Paused);
    assert_eq!(w.weights(), (50, 50), "a paused canary does not move");
    w.resource.annotations.remove(CANARY_PAUSE_ANNOTATION);

    w.resource
        .annotations
        .insert(CANARY_ABORT_ANNOTATION.into(), "now".into());
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
    assert_eq!(w.canary_status().abort_handled.as_deref(), Some("now"));
    assert_eq!(w.weights(), (100, 0));
}

#[test]
fn a_full_promote_skips_every_remaining_step() {
    let mut w = World::canary_ready(json!([{"weight": 10}, {"weight": 50}]), None);
    w.set_version("v2");
    w.reconcile();
    w.canary_pods_ready();
    w.reconcile();
    w.resource
        .annotations
        .insert(CANARY_PROMOTE_ANNOTATION.into(), "full-1".into());
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Promoting);
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::RollingOut));
    assert_eq!(w.weights(), (90, 10));
}

#[test]
fn removing_the_canary_block_mid_canary_puts_the_weights_back() {
    let mut w = at_first_step(error_rate());
    w.resource.spec.as_object_mut().unwrap().remove("canary");
    w.resource.generation += 1;
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
    assert_eq!(w.weights(), (100, 0));
    assert_eq!(
        w.status().phase,
        Some(Phase::RollingOut),
        "v2 rolls directly"
    );
}

#[test]
fn editing_only_the_canary_block_is_no_rollout() {
    let mut w = World::canary_ready(json!([{"weight": 10}]), None);
    let before = w.status().desired_spec_hash.clone();
    w.resource.spec["canary"]["steps"] = json!([{"weight": 20, "pause": "1m"}]);
    w.resource.generation += 1;
    w.reconcile();
    assert_eq!(w.status().desired_spec_hash, before);
    assert_eq!(w.status().phase, Some(Phase::Ready));
    assert!(w.writes.is_empty(), "{:?}", w.writes);
}

#[test]
fn the_first_version_and_a_replicas_change_roll_directly() {
    let mut w = World::canary_ready(json!([{"weight": 10}]), None);
    assert!(
        w.status().canary.is_none(),
        "the first version had no canary"
    );
    w.resource.spec["replicas"] = json!(3);
    w.resource.generation += 1;
    w.reconcile();
    assert!(w.status().canary.is_none());
    assert_eq!(w.dep()["spec"]["replicas"], json!(3));
}

#[test]
fn a_missing_route_waits_for_a_person_without_moving_anything() {
    let mut w = World::canary_ready(json!([{"weight": 10}]), None);
    w.route = None;
    w.set_version("v2");
    w.reconcile();
    w.canary_pods_ready();
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Paused);
    assert_eq!(
        w.condition(STALLED),
        ("True".into(), reason::ROUTE_INVALID.into())
    );
    assert!(
        w.canary_status()
            .message
            .contains("HTTPRoute svc not found")
    );
}

#[test]
fn the_shell_measures_only_when_a_check_is_due() {
    let mut w = at_first_step(error_rate());
    assert!(analysis_checks(&w.resource, &w.settings, &at(w.now)).is_empty());
    w.now += 10;
    let checks = analysis_checks(&w.resource, &w.settings, &at(w.now));
    assert_eq!(checks.len(), 1);
    let analysis::Check::Prometheus { query, .. } = &checks[0] else {
        panic!("a Prometheus check")
    };
    assert_eq!(query, "errors{service=\"svc-canary\"}");
    w.measured(Reading::Sample(0.0));
    w.reconcile();
    assert!(analysis_checks(&w.resource, &w.settings, &at(w.now)).is_empty());
    assert_eq!(
        analysis_checks(&w.resource, &w.settings, &at(w.now + 10)).len(),
        1
    );
}

#[test]
fn deleting_the_resource_mid_canary_puts_the_weights_back() {
    let mut w = at_first_step(error_rate());
    w.resource.deleting = true;
    w.reconcile();
    assert_eq!(w.weights(), (100, 0), "the route outlives the resource");
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
}

impl World {
    /// One pass of the shell's loop and then a crash: the status and the
    /// writes of one decision land, and nothing decides on what the writes
    /// returned.
    fn pass_then_crash(&mut self) {
        self.writes.clear();
        let d = self.decide();
        self.resource.status = d.status;
        self.events.extend(d.events);
        for w in d.writes {
            self.execute(&w);
            self.writes.push(w);
        }
    }

    fn route_named(&self, name: &str) -> &Value {
        self.route
            .iter()
            .chain(&self.other_routes)
            .find(|r| r["metadata"]["name"] == json!(name))
            .expect("a route of that name")
    }

    fn weights_of(&self, name: &str) -> (i64, i64) {
        let refs = &self.route_named(name)["spec"]["rules"][1]["backendRefs"];
        (
            refs[0]["weight"].as_i64().unwrap(),
            refs[1]["weight"].as_i64().unwrap(),
        )
    }
}

/// v2 warm; the operator moved the route to the first step and crashed
/// before a decision saw the route move.
fn crashed_after_the_first_patch() -> World {
    let mut w = World::canary_ready(
        json!([{"weight": 10, "pause": "30s"}, {"weight": 50, "pause": "30s"}]),
        None,
    );
    w.set_version("v2");
    w.reconcile();
    w.canary_pods_ready();
    w.pass_then_crash();
    assert_eq!(w.weights(), (90, 10));
    assert_eq!(w.canary_status().step, 1);
    assert!(w.canary_status().step_start_time.is_none());
    w
}

#[test]
fn a_canary_ended_right_after_its_first_patch_puts_the_weights_back() {
    for ending in ["abort", "spec edit", "deletion"] {
        let mut w = crashed_after_the_first_patch();
        match ending {
            "abort" => {
                w.resource
                    .annotations
                    .insert(CANARY_ABORT_ANNOTATION.into(), "1".into());
            }
            "spec edit" => w.set_version("v3"),
            _ => w.resource.deleting = true,
        }
        w.reconcile();
        assert_eq!(w.weights(), (100, 0), "{ending}");
        if ending == "deletion" {
            continue;
        }
        if ending == "abort" {
            assert_eq!(w.canary_status().state, CanaryState::Aborted);
            w.set_version("v3");
            w.reconcile();
        }
        assert_eq!(
            (w.canary_status().version.as_str(), w.canary_status().state),
            ("v3", CanaryState::Warming),
            "{ending}"
        );
        w.canary_pods_ready();
        w.reconcile();
        assert_eq!(w.weights(), (90, 10), "{ending}");
        assert_eq!(
            w.canary_status().restore_weights,
            Some(crate::api::BackendWeights {
                stable: 100,
                canary: 0
            }),
            "{ending}: the next canary restores what Git says"
        );
    }
}

#[test]
fn a_canary_deployment_deleted_mid_canary_aborts_after_the_progress_deadline() {
    let mut w = World::canary_ready(json!([{"weight": 10, "pause": "10m"}]), None);
    w.set_version("v2");
    w.reconcile();
    w.canary_pods_ready();
    w.reconcile();
    assert_eq!(w.weights(), (90, 10));
    w.canary = None;
    w.now += 5;
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Paused);
    assert_eq!(
        w.condition(STALLED),
        ("True".into(), reason::CANARY_TARGET_INVALID.into())
    );
    w.now += 60;
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Paused, "not yet");
    w.now += 1;
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
    assert!(
        w.canary_status().message.contains("not found"),
        "{}",
        w.canary_status().message
    );
    assert_eq!(w.weights(), (100, 0));
    assert_eq!(w.status().phase, Some(Phase::RolledBack));
}

#[test]
fn a_crashing_canary_aborts_after_the_progress_deadline_though_its_queries_say_nothing() {
    let mut w = at_first_step(error_rate());
    let crash = |w: &mut World| {
        let d = w.canary_dep();
        d["status"]["readyReplicas"] = json!(0);
        d["status"]["availableReplicas"] = json!(0);
        d["status"]["unavailableReplicas"] = json!(1);
    };
    // Down for 50 s, then back: that outage is forgiven...
    crash(&mut w);
    for _ in 0..5 {
        w.measured(Reading::NoData);
        w.now += 10;
        w.reconcile();
        assert_eq!(w.canary_status().state, CanaryState::Paused);
        assert_eq!(w.weights(), (90, 10));
    }
    w.canary_pods_ready();
    w.measured(Reading::NoData);
    w.now += 10;
    w.reconcile();
    assert_eq!(w.canary_status().unavailable_since, None);
    // ...one that lasts longer than the progress deadline is not.
    crash(&mut w);
    for _ in 0..7 {
        w.measured(Reading::NoData);
        w.now += 10;
        w.reconcile();
        assert_eq!(w.weights(), (90, 10));
    }
    w.measured(Reading::NoData);
    w.now += 1;
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
    assert!(
        w.canary_status().message.contains("no available pod"),
        "{}",
        w.canary_status().message
    );
    assert_eq!(w.weights(), (100, 0));
}

#[test]
fn renaming_the_route_mid_canary_puts_the_old_routes_weights_back_first() {
    let mut w = at_first_step(error_rate());
    let mut second = route();
    second["metadata"]["name"] = json!("svc-2");
    w.other_routes.push(second);
    w.resource.spec["canary"]["trafficRef"]["httpRoute"] = json!("svc-2");
    w.resource.generation += 1;
    w.reconcile();
    assert_eq!(w.weights_of("svc"), (100, 0), "the old route is restored");
    assert_eq!(w.weights_of("svc-2"), (100, 0));
    assert!(
        w.events.iter().any(|e| e.reason == reason::CANARY_ABORTED
            && e.message.contains("spec.canary.trafficRef changed")),
        "{:?}",
        w.events
    );
    // The canary starts again on the route the spec names now.
    w.reconcile();
    assert_eq!(w.weights_of("svc-2"), (90, 10));
    assert_eq!(w.weights_of("svc"), (100, 0));
    let c = w.canary_status();
    assert_eq!(c.traffic_ref.as_ref().unwrap().http_route, "svc-2");
    assert_eq!((c.step, c.state), (1, CanaryState::Progressing));
}

#[test]
fn renaming_the_canary_target_mid_canary_keeps_it_until_the_weights_are_back() {
    let mut w = at_first_step(error_rate());
    let mut second = deployment("svc-canary-2");
    second["spec"]["replicas"] = json!(1);
    w.other_deployments.push(second);
    w.resource.spec["canary"]["targetRef"]["name"] = json!("svc-canary-2");
    w.resource.generation += 1;
    w.reconcile();
    assert_eq!(w.weights(), (100, 0));
    let restored = w
        .writes
        .iter()
        .position(|x| matches!(x, Write::PatchRoute { .. }))
        .expect("the weights go back");
    let released = w
        .writes
        .iter()
        .position(|x| matches!(x, Write::ApplyDeployment { name, release: true, .. } if name == "svc-canary"))
        .expect("the old canary Deployment is released");
    assert!(
        restored < released,
        "the old canary serves until the route no longer sends it traffic: {:?}",
        w.writes
    );
    let c = w.canary_status();
    assert_eq!((c.version.as_str(), c.state), ("v2", CanaryState::Warming));
    let on_second = w
        .other_deployments
        .iter()
        .find(|d| d["metadata"]["name"] == json!("svc-canary-2"))
        .unwrap();
    let env = &on_second["spec"]["template"]["spec"]["containers"][0]["env"][0];
    let read = env["valueFrom"]["configMapKeyRef"]["name"]
        .as_str()
        .unwrap();
    assert_eq!(w.version_in(read).as_deref(), Some("v2"));
}

#[test]
fn a_steps_first_round_is_taken_one_interval_after_its_weights_are_seen() {
    let mut w = World::canary_ready(
        json!([{"weight": 10, "pause": "5s"}, {"weight": 50, "pause": "5s"}]),
        Some(error_rate()),
    );
    w.set_version("v2");
    w.reconcile();
    w.canary_pods_ready();
    w.reconcile();
    assert_eq!(w.weights(), (90, 10));
    let seen = w.now;
    assert!(analysis_checks(&w.resource, &w.settings, &at(seen)).is_empty());
    assert!(analysis_checks(&w.resource, &w.settings, &at(seen + 9)).is_empty());
    assert_eq!(
        analysis_checks(&w.resource, &w.settings, &at(seen + 10)).len(),
        1
    );
    // The pause is over, but no round has measured this step's traffic.
    w.measured(Reading::Sample(0.0));
    w.now += 6;
    w.reconcile();
    assert_eq!(w.weights(), (90, 10));
    assert!(w.canary_status().analysis.is_empty());
    assert_eq!(w.canary_status().state, CanaryState::Progressing);
    assert_eq!(w.condition(STALLED).0, "False");
    w.now += 4;
    w.reconcile();
    assert_eq!(w.weights(), (50, 50), "a round at 10 % passed");
    assert_eq!(w.canary_status().analysis.len(), 1);
}

#[test]
fn gates_left_in_place_do_nothing_to_later_canaries() {
    let mut w = World::canary_ready(json!([{"weight": 10}, {"weight": 50}]), None);
    w.set_version("v2");
    w.reconcile();
    w.canary_pods_ready();
    w.reconcile();
    w.resource
        .annotations
        .insert(CANARY_ABORT_ANNOTATION.into(), "a-1".into());
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Aborted);

    // The abort stays on the object, as a GitOps tool leaves it.
    w.set_version("v3");
    w.reconcile();
    w.canary_pods_ready();
    w.reconcile();
    w.now += 1;
    w.reconcile();
    assert_eq!(
        (w.canary_status().version.as_str(), w.canary_status().state),
        ("v3", CanaryState::Paused),
        "waits for a promote"
    );
    assert_eq!(w.weights(), (90, 10));
    w.resource
        .annotations
        .insert(CANARY_PROMOTE_ANNOTATION.into(), "full-1".into());
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Promoting);
    w.reconcile();
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Promoted);
    assert_eq!(w.status().active_version.as_deref(), Some("v3"));

    // Both stay; the next canary still runs step by step.
    w.set_version("v4");
    w.reconcile();
    w.canary_pods_ready();
    w.reconcile();
    w.now += 1;
    w.reconcile();
    let c = w.canary_status();
    assert_eq!((c.version.as_str(), c.state), ("v4", CanaryState::Paused));
    assert_eq!(w.weights(), (90, 10));
    // A new value is acted on.
    w.resource
        .annotations
        .insert(CANARY_ABORT_ANNOTATION.into(), "a-2".into());
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
}

#[test]
fn after_a_failed_canary_only_a_change_the_operator_hashes_tries_again() {
    // The failed-version admission policy lets an edit of spec.canary, or
    // its removal, through without a retry reason: neither may roll the
    // version whose canary failed out to the stable Deployment.
    let mut w = at_first_step(error_rate());
    w.measured(Reading::Sample(0.2));
    w.now += 10;
    w.reconcile();
    w.now += 10;
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
    w.measurements.clear();
    assert_eq!(w.cm_version(), "v1");

    w.resource.spec["canary"]["steps"] = json!([{"weight": 5, "pause": "1m"}]);
    w.resource.generation += 1;
    w.now += 10;
    w.reconcile();
    assert_eq!(
        w.canary_status().state,
        CanaryState::Aborted,
        "no new canary"
    );
    assert_eq!(w.weights(), (100, 0));

    w.resource.spec.as_object_mut().unwrap().remove("canary");
    w.resource.generation += 1;
    w.now += 10;
    let events = w.reconcile();
    assert_eq!(w.cm_version(), "v1", "the stable Deployment keeps v1");
    assert_eq!(w.status().phase, Some(Phase::RolledBack));
    assert_eq!(
        super::reasons(&events),
        [reason::TARGET_RELEASED],
        "only the canary Deployment is let go"
    );

    // A change the operator hashes is a retry: with no canary block, v2
    // goes to the stable Deployment directly.
    w.resource.spec["replicas"] = json!(3);
    w.resource.generation += 1;
    w.now += 10;
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::RollingOut));
    assert_eq!(w.cm_version(), "v2");
}

#[test]
fn a_canary_the_decision_cannot_reach_ends_and_its_weights_go_back() {
    // Each of these returns before the canary's own steps: an invalid
    // spec, a refused rollback, a missing stable target, a conflict.
    type BreakIt = fn(&mut World);
    let cases: Vec<(&str, BreakIt)> = vec![
        ("an invalid spec", |w| {
            w.resource.spec["tier"] = json!("Enormous");
            w.resource.generation += 1;
        }),
        ("a refused rollback", |w| w.annotate_rollback(Some("v0"))),
        ("a missing stable target", |w| w.deployment = None),
        ("a conflict", |w| {
            w.rivals.push(Rival {
                key: "ns/older".into(),
                created: Some(at(-100)),
            });
            w.dep()["metadata"]["annotations"] = json!({MODEL_RESOURCE_ANNOTATION: "ns/older"});
        }),
    ];
    for (what, break_it) in cases {
        let mut w = at_first_step(error_rate());
        break_it(&mut w);
        w.now += 10;
        w.reconcile();
        assert_eq!(w.weights(), (100, 0), "{what}: the weights go back");
        assert_eq!(
            w.canary_status().state,
            CanaryState::Aborted,
            "{what}: the canary ends"
        );
        assert!(w.reasons().contains(&reason::CANARY_ABORTED), "{what}");
        w.now += 10;
        w.reconcile();
        assert_eq!(w.route_writes(), 0, "{what}: and stays at rest");
    }
}

#[test]
fn analysis_endpoints_not_allowed_are_never_asked_and_hold_the_step() {
    let mut w = at_first_step(error_rate());
    // The operator runs without --analysis-allow.
    w.settings = Settings::default();
    for _ in 0..3 {
        assert!(
            analysis_checks(&w.resource, &w.settings, &at(w.now)).is_empty(),
            "no request is sent"
        );
        w.now += 11;
        w.reconcile();
        assert_eq!(w.canary_status().state, CanaryState::Paused);
        assert_eq!(
            w.condition(STALLED),
            ("True".into(), reason::ANALYSIS_ENDPOINT_NOT_ALLOWED.into())
        );
        assert_eq!(
            w.weights(),
            (100, 0),
            "held, with its traffic taken back: nothing judges it"
        );
        assert_eq!(w.canary_status().failures, 0);
        assert!(w.canary_status().analysis.is_empty(), "nothing measured");
    }
    let message = &w.canary_status().message;
    assert!(
        message.contains("metric error-rate: http://prometheus:9090/")
            && message.contains("--analysis-allow"),
        "{message}"
    );
    assert_eq!(
        w.reasons()
            .iter()
            .filter(|r| **r == reason::ANALYSIS_ENDPOINT_NOT_ALLOWED)
            .count(),
        1,
        "one event when the step starts to hold: {:?}",
        w.reasons()
    );
    // A prefix that only looks like the address allows nothing.
    w.settings.analysis_allow = allow(&["http://prometheus:909", "http://prometheus:9090/x"]);
    assert!(analysis_checks(&w.resource, &w.settings, &at(w.now)).is_empty());
    // Allowed (the operator restarted with the flag): asked, and on.
    w.settings.analysis_allow = allow(&["http://prometheus:9090"]);
    w.now += 1;
    w.reconcile();
    assert_eq!(w.weights(), (90, 10), "the steps start over");
    w.now += 10;
    let checks = analysis_checks(&w.resource, &w.settings, &at(w.now));
    let [analysis::Check::Prometheus { url, .. }] = checks.as_slice() else {
        panic!("one Prometheus check: {checks:?}")
    };
    assert_eq!(url.as_str(), "http://prometheus:9090/api/v1/query");
    w.measured(Reading::Sample(0.001));
    w.now += 11;
    w.reconcile();
    assert_eq!(w.weights(), (50, 50), "a passing round ends the step");
}

#[test]
fn one_refused_endpoint_holds_the_whole_round_and_no_credential_is_shown() {
    let mut w = World::canary_ready(
        json!([{"weight": 10, "pause": "20s"}]),
        Some(json!({"interval": "10s",
            "metrics": [{"name": "error-rate", "thresholdRange": {"max": 0.01},
                         "prometheus": {"address": "http://prometheus:9090", "query": "up"}}],
            "webhooks": [{"name": "smoke",
                          "url": "http://alice:hunter2@smoke/hook?key=s3cr3t"}]})),
    );
    w.set_version("v2");
    w.reconcile();
    w.canary_pods_ready();
    w.reconcile();
    assert_eq!(
        w.weights(),
        (100, 0),
        "no traffic while nothing can judge it"
    );
    assert!(
        analysis_checks(&w.resource, &w.settings, &at(w.now)).is_empty(),
        "the allowed metric is not asked either"
    );
    w.now += 21;
    w.reconcile();
    assert_eq!(
        w.condition(STALLED),
        ("True".into(), reason::ANALYSIS_ENDPOINT_NOT_ALLOWED.into())
    );
    let message = &w.canary_status().message;
    assert!(
        message.contains("webhook smoke: http://***@smoke/hook?*** (credentials"),
        "{message}"
    );
    assert!(!message.contains("metric error-rate"), "{message}");
    let mut everything = serde_json::to_string(w.status()).unwrap();
    everything.extend(w.events.iter().map(|e| e.message.clone()));
    for secret in ["alice", "hunter2", "key", "s3cr3t"] {
        assert!(!everything.contains(secret), "{secret} in {everything}");
    }
}

#[test]
fn the_route_is_read_only_while_a_decision_can_need_it() {
    let mut w = World::canary_ready(json!([{"weight": 10, "pause": "10s"}]), None);
    assert_eq!(
        route_to_read(&w.resource),
        None,
        "at rest, before any canary"
    );
    w.set_version("v2");
    assert_eq!(
        route_to_read(&w.resource).as_deref(),
        Some("svc"),
        "a new spec may start a canary"
    );
    w.reconcile();
    w.canary_pods_ready();
    w.now += 5;
    w.reconcile();
    assert_eq!(w.weights(), (90, 10));
    assert_eq!(
        route_to_read(&w.resource).as_deref(),
        Some("svc"),
        "mid canary"
    );
    for _ in 0..5 {
        w.now += 15;
        w.reconcile();
        w.pods_ready();
    }
    assert_eq!(w.canary_status().state, CanaryState::Promoted);
    assert_eq!(w.weights(), (100, 0));
    assert_eq!(
        route_to_read(&w.resource),
        None,
        "promoted, weights back: a resync reads nothing"
    );
}

#[test]
fn a_webhook_timeout_is_never_longer_than_the_cap() {
    let w = at_first_step(json!({"interval": "10s",
        "webhooks": [{"name": "smoke", "url": "http://smoke/x", "timeout": "30s"}]}));
    let mut spec = w.resource.spec.clone();
    spec["canary"]["analysis"]["webhooks"][0]["timeout"] = json!("1h");
    let canary: crate::api::Canary = serde_json::from_value(spec["canary"].clone()).unwrap();
    let traffic = canary.traffic_ref.clone();
    let subject = analysis::Subject {
        resource: "ns/svc",
        namespace: "ns",
        traffic: &traffic,
        version: "v2",
        stable_version: "v1",
        step: 1,
        weight: 10,
        mirror: None,
    };
    let checks = analysis::checks(
        canary.analysis.as_ref().unwrap(),
        &subject,
        &w.settings.analysis_allow,
    );
    let [analysis::Check::Webhook { timeout, .. }] = checks.as_slice() else {
        panic!("one webhook: {checks:?}")
    };
    assert_eq!(*timeout, crate::api::rules::WEBHOOK_TIMEOUT_MAX);
}

#[test]
fn the_probes_are_checked_every_round_and_a_failed_verdict_aborts() {
    let probes = json!({"interval": "10s", "probes": {"configMapRef": {"name": "pii-probes"}, "notWorseThanStable": true}});
    let mut w = at_first_step(probes);
    w.now += 10;
    let checks = crate::rollout::analysis_checks(&w.resource, &w.settings, &at(w.now));
    let [analysis::Check::Probes { gate }] = checks.as_slice() else {
        panic!("one probe check, no endpoint to allow: {checks:?}");
    };
    assert!(gate.not_worse_than_stable);
    w.measurements = vec![Measurement {
        name: "probes".into(),
        reading: Reading::Judged(
            crate::api::Outcome::Fail,
            "pod c-1: DATE recall 0.00 is below 1.00 (minRecall): DATE recall 0.00 (0/3)".into(),
        ),
    }];
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
    assert_eq!(w.weights(), (100, 0));
    let last = w.canary_status().analysis.last().unwrap();
    assert_eq!(last.name, "probes");
    assert!(
        last.message.contains("DATE recall 0.00"),
        "{}",
        last.message
    );
}

#[test]
fn the_canarys_probes_compare_with_the_stable_deployments_pods_on_a_tier_only_change() {
    let probes = json!({"interval": "10s", "probes": {"configMapRef": {"name": "pii-probes"}, "notWorseThanStable": true}});
    let mut w = World::canary_ready(
        json!([{"weight": 10, "pause": "20s"}, {"weight": 50, "pause": "20s"}]),
        Some(probes),
    );
    let http = json!([{"name": "http", "containerPort": 8080}]);
    w.dep()["spec"]["template"]["spec"]["containers"][0]["ports"] = http.clone();
    w.canary_dep()["spec"]["template"]["spec"]["containers"][0]["ports"] = http;
    // The same version on another tier: the canary shares its version
    // with the stable Deployment, not its template.
    let mut medium = w.resource.spec.clone();
    medium["tier"] = json!("Medium");
    w.set_spec(medium);
    w.reconcile();
    w.canary_pods_ready();
    w.reconcile();
    assert_eq!(w.weights(), (90, 10));
    w.now += 10;
    // The controller's ReplicaSets, and a ready pod of each Deployment.
    let stable_snapshot = w.template_snapshot().unwrap();
    let canary_snapshot = w.canary_dep()["spec"]["template"]["metadata"]["labels"]
        [MANIFEST_SNAPSHOT_LABEL]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(stable_snapshot, canary_snapshot, "two models, one version");
    for (deployment, replica_set, snapshot, pod) in [
        ("svc", "svc-5b7c", &stable_snapshot, "svc-5b7c-a"),
        (
            "svc-canary",
            "svc-canary-9d2f",
            &canary_snapshot,
            "svc-canary-9d2f-a",
        ),
    ] {
        let d = if deployment == "svc" {
            w.dep()
        } else {
            w.canary_dep()
        };
        d["metadata"]["annotations"][pods::REVISION_ANNOTATION] = json!("4");
        d["status"]["observedGeneration"] = d["metadata"]["generation"].clone();
        w.replica_sets.push(SnapshotUse {
            short: snapshot.clone(),
            config_map: None,
            replica_set: replica_set.into(),
            has_pods: true,
            deployment: Some(format!("uid-{deployment}")),
            revision: Some("4".into()),
        });
        w.pods.push(pods::PodView {
            namespace: "ns".into(),
            name: pod.into(),
            owner: Some("ns/svc".into()),
            snapshot: Some(snapshot.clone()),
            replica_set: Some(replica_set.into()),
            ip: Some(format!("10.0.0.{}", w.pods.len() + 1)),
            containers_ready: true,
            ..Default::default()
        });
    }
    // A canary pod still warming is not asked.
    let mut cold = w.pods.last().unwrap().clone();
    cold.name = "svc-canary-9d2f-b".into();
    cold.containers_ready = false;
    w.pods.push(cold);
    let plans = w.probe_plan();
    let [plan] = plans.as_slice() else {
        panic!("one round, the canary's: {plans:?}")
    };
    assert_eq!(plan.purpose, quality::Purpose::Canary);
    assert_eq!(plan.stable, quality::Stable::Asked);
    let asked: Vec<(&str, bool)> = plan
        .requests
        .iter()
        .map(|r| (r.pod.as_str(), r.stable))
        .collect();
    assert_eq!(
        asked,
        [("svc-canary-9d2f-a", false), ("svc-5b7c-a", true)],
        "the canary's pod, compared with the stable Deployment's"
    );
}

#[test]
fn a_gated_pod_of_the_stable_deployment_compares_with_its_own_old_template_not_the_canarys() {
    let mut w = World::canary_ready(json!([{"weight": 10, "pause": "20s"}]), None);
    let http = json!([{"name": "http", "containerPort": 8080}]);
    w.dep()["spec"]["template"]["spec"]["containers"][0]["ports"] = http.clone();
    w.canary_dep()["spec"]["template"]["spec"]["containers"][0]["ports"] = http;
    w.resource.spec["qualityGate"] =
        json!({"configMapRef": {"name": "probes"}, "notWorseThanStable": true});
    let snapshot = w.template_snapshot().unwrap();
    // As a promotion leaves them: the canary's pod passed the gate on the
    // new version, and the stable Deployment rolls its new template.
    let pods = [
        ("svc", "svc-d1", "svc-d1-old", None, false),
        ("svc", "svc-2", "svc-2-new", None, true),
        (
            "svc-canary",
            "svc-canary-3",
            "svc-canary-3-a",
            Some(true),
            true,
        ),
    ];
    for (deployment, replica_set, pod, passed, gated) in pods {
        w.replica_sets.push(SnapshotUse {
            short: snapshot.clone(),
            config_map: None,
            replica_set: replica_set.into(),
            has_pods: true,
            deployment: Some(format!("uid-{deployment}")),
            revision: None,
        });
        w.pods.push(pods::PodView {
            namespace: "ns".into(),
            name: pod.into(),
            owner: Some("ns/svc".into()),
            snapshot: Some(snapshot.clone()),
            replica_set: Some(replica_set.into()),
            ip: Some(format!("10.0.0.{}", w.pods.len() + 1)),
            containers_ready: true,
            gated,
            quality: passed.map(|passed| pods::QualityMark {
                passed,
                message: "m".into(),
            }),
            ..Default::default()
        });
    }
    let plans = w.probe_plan();
    let [plan] = plans.as_slice() else {
        panic!("one round, the stable Deployment's: {plans:?}")
    };
    let asked: Vec<(&str, bool)> = plan
        .requests
        .iter()
        .map(|r| (r.pod.as_str(), r.stable))
        .collect();
    assert_eq!(asked, [("svc-2-new", false), ("svc-d1-old", true)]);
}

impl World {
    /// A Gateway that reports on the route, on `generation` of it.
    fn gateway_accepted(&mut self, generation: i64) {
        self.route.as_mut().unwrap()["status"] = json!({"parents": [{
            "parentRef": {"name": "openmed"},
            "conditions": [{"type": "Accepted", "status": "True", "observedGeneration": generation}],
        }]});
    }

    fn route_generation(&self) -> i64 {
        self.route.as_ref().unwrap()["metadata"]["generation"]
            .as_i64()
            .unwrap()
    }

    fn drain_reading(&mut self, reading: Reading) {
        self.measurements = vec![Measurement {
            name: drain::CHECK_NAME.into(),
            reading,
        }];
    }
}

/// v2 at its first step, with a drain query, aborted: the weights are
/// back and the Gateway has caught up with them.
fn aborted_with_a_drain_query() -> World {
    let mut w = at_first_step(json!({"interval": "10s", "failureLimit": 0, "metrics": [{
        "name": "error-rate", "thresholdRange": {"max": 0.01},
        "prometheus": {"address": "http://prometheus:9090", "query": "errors"}}]}));
    w.resource.spec["canary"]["drain"] = json!({"timeout": "1m", "prometheus": {
        "address": "http://prometheus:9090", "query": "rate{backend=\"{{canary}}\"} or vector(0)"}});
    let generation = w.route_generation();
    w.gateway_accepted(generation);
    w.resource
        .annotations
        .insert(CANARY_ABORT_ANNOTATION.into(), "1".into());
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
    assert_eq!(w.weights(), (100, 0));
    let back = w.route_generation();
    w.gateway_accepted(back);
    w
}

#[test]
fn an_aborted_canary_deployment_moves_back_only_once_the_gateway_has_the_weights() {
    let mut w = at_first_step(error_rate());
    let generation = w.route_generation();
    w.gateway_accepted(generation);
    w.resource
        .annotations
        .insert(CANARY_ABORT_ANNOTATION.into(), "1".into());
    w.reconcile();
    assert_eq!(w.weights(), (100, 0), "the weights go back at once");
    assert_eq!(
        w.canary_version().as_deref(),
        Some("v2"),
        "the Gateway still reports the canary's weights: the canary Deployment keeps serving"
    );
    assert!(w.canary_status().weights_back_time.is_some());
    assert!(w.canary_status().drained_time.is_none());
    assert_eq!(
        route_to_read(&w.resource).as_deref(),
        Some("svc"),
        "the route is read until the drain is over"
    );
    w.now += 2;
    w.reconcile();
    assert_eq!(w.canary_version().as_deref(), Some("v2"));
    let back = w.route_generation();
    w.gateway_accepted(back);
    w.now += 1;
    w.reconcile();
    assert_eq!(
        w.canary_version().as_deref(),
        Some("v1"),
        "drained: it moves back"
    );
    assert!(w.canary_status().drained_time.is_some());
    let drained = w
        .events
        .iter()
        .find(|e| e.reason == reason::CANARY_DRAINED)
        .expect("a CanaryDrained event");
    assert_eq!(
        drained.message,
        "Deployment svc-canary gets no more requests 3s after the weights went back: every Gateway accepted the route with the weights back"
    );
    assert_eq!(route_to_read(&w.resource), None, "at rest again");
}

#[test]
fn with_a_drain_query_only_a_zero_rate_moves_the_canary_deployment_back() {
    let mut w = aborted_with_a_drain_query();
    assert_eq!(w.canary_version().as_deref(), Some("v2"));
    let due = analysis_checks(&w.resource, &w.settings, &at(w.now));
    assert!(
        matches!(&due[..], [Check::Prometheus { name, query, .. }]
            if name == "drain" && query == "rate{backend=\"svc-canary\"} or vector(0)"),
        "{due:?}"
    );
    for reading in [
        Reading::Sample(3.5),
        Reading::NoData,
        Reading::Sample(f64::NAN),
        Reading::Failed("connection refused".into()),
    ] {
        w.drain_reading(reading.clone());
        w.now += 2;
        w.reconcile();
        assert_eq!(
            w.canary_version().as_deref(),
            Some("v2"),
            "{reading:?} is not a drain"
        );
    }
    w.drain_reading(Reading::Sample(0.0));
    w.now += 2;
    w.reconcile();
    assert_eq!(w.canary_version().as_deref(), Some("v1"));
    assert!(
        analysis_checks(&w.resource, &w.settings, &at(w.now)).is_empty(),
        "drained: nothing more to ask"
    );
    assert!(w.events.iter().any(|e| {
        e.reason == reason::CANARY_DRAINED
            && e.message
                .ends_with("the data plane sends it no requests (drain query 0)")
    }));
}

#[test]
fn a_drain_that_never_reads_zero_ends_at_its_timeout_with_a_warning() {
    let mut w = aborted_with_a_drain_query();
    w.drain_reading(Reading::Sample(1.0));
    w.now += 59;
    w.reconcile();
    assert_eq!(w.canary_version().as_deref(), Some("v2"));
    w.now += 1;
    w.reconcile();
    assert_eq!(w.canary_version().as_deref(), Some("v1"));
    let timed_out = w
        .events
        .iter()
        .find(|e| e.reason == reason::CANARY_DRAIN_TIMED_OUT)
        .expect("a CanaryDrainTimedOut event");
    assert_eq!(timed_out.type_, EventType::Warning);
    assert_eq!(
        timed_out.message,
        "Deployment svc-canary moves back although the data plane still sends it 1.00 requests/s after 60s"
    );
}

impl World {
    /// Asks for v2 and makes the canary's pods ready on it, five seconds
    /// on: the next decision takes the first step.
    fn v2_warm(&mut self) {
        self.set_version("v2");
        self.reconcile();
        self.canary_pods_ready();
        self.now += 5;
    }

    /// The main rule's filters, as the route shows them.
    fn filters(&self) -> Value {
        self.route.as_ref().unwrap()["spec"]["rules"][1]
            .get("filters")
            .cloned()
            .unwrap_or(Value::Null)
    }
}

/// The filter a mirror step of `percent` adds to the main rule.
fn mirror_filter(percent: i32) -> Value {
    json!([{"type": "RequestMirror", "requestMirror": {
        "backendRef": {"name": "svc-canary", "port": 8080}, "percent": percent}}])
}

#[test]
fn a_mirror_step_copies_requests_before_any_is_served_and_its_filter_goes_with_the_next_step() {
    let mut w = World::canary_ready(
        json!([{"mirror": 50, "pause": "30s"}, {"weight": 10, "pause": "30s"}]),
        None,
    );
    let git = w.route.clone().unwrap();
    w.set_version("v2");
    w.reconcile();
    assert_eq!(
        w.filters(),
        Value::Null,
        "nothing is mirrored while it warms"
    );
    w.canary_pods_ready();
    w.now += 5;
    w.reconcile();
    assert_eq!(w.filters(), mirror_filter(50));
    assert_eq!(
        w.weights(),
        (100, 0),
        "the stable backend answers every client"
    );
    let c = w.canary_status();
    assert_eq!((c.step, c.weight, c.mirror), (1, 0, Some(50)));
    assert_eq!(c.state, CanaryState::Progressing);
    assert!(
        c.message
            .contains("copy of 50% of the requests and serves none"),
        "{}",
        c.message
    );
    let changed = w
        .events
        .iter()
        .find(|e| e.reason == reason::CANARY_WEIGHT_CHANGED)
        .unwrap();
    assert!(
        changed
            .message
            .contains("a copy of 50% of the requests to svc-canary"),
        "{}",
        changed.message
    );

    w.now += 20;
    w.reconcile();
    assert_eq!(w.filters(), mirror_filter(50), "the pause holds");
    w.now += 11;
    w.reconcile();
    assert_eq!(w.weights(), (90, 10));
    assert_eq!(
        w.filters(),
        Value::Null,
        "the filter goes in the same write"
    );
    assert_eq!(w.route_writes(), 1);
    assert_eq!(w.canary_status().mirror, None);

    w.now += 31;
    w.reconcile();
    w.reconcile();
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Promoted);
    assert_eq!(
        w.route.clone().unwrap()["spec"],
        git["spec"],
        "the route is Git's again"
    );
}

#[test]
fn an_abort_in_a_mirror_step_removes_the_filter_before_the_canary_deployment_moves_back() {
    let mut w = World::canary_ready(json!([{"mirror": 100, "pause": "1m"}]), None);
    let git = w.route.clone().unwrap();
    w.v2_warm();
    w.reconcile();
    assert_eq!(w.filters(), mirror_filter(100));
    w.resource
        .annotations
        .insert(CANARY_ABORT_ANNOTATION.into(), "now".into());
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
    assert_eq!(w.route.clone().unwrap()["spec"], git["spec"]);
    let c = w.canary_status();
    assert_eq!(c.mirror, None);
    assert!(
        c.weights_back_time.is_some(),
        "the drain counts from the filter's removal"
    );
    assert_eq!(w.canary_version().as_deref(), Some("v1"));
}

#[test]
fn a_crash_between_recording_a_mirror_and_writing_it_still_removes_it() {
    let mut w = World::canary_ready(json!([{"mirror": 30, "pause": "1m"}]), None);
    let git = w.route.clone().unwrap();
    w.v2_warm();
    // The decision records the step and asks for the patch; the patch is
    // lost, and the canary is aborted before the next decision.
    let d = w.decide();
    assert!(
        d.writes
            .iter()
            .any(|x| matches!(x, Write::PatchRoute { .. }))
    );
    w.resource.status = d.status.clone();
    assert_eq!(w.canary_status().mirror, Some(30));
    // The filter landed after all (the write raced the crash).
    let traffic = serde_json::from_value(json!({"httpRoute": "svc", "ruleName": "main",
        "stableBackend": "svc", "canaryBackend": "svc-canary"}))
    .unwrap();
    let slots = route::locate(w.route.as_ref().unwrap(), &traffic, "ns").unwrap();
    let patch = route::shape_patch(
        &slots,
        &traffic,
        route::Shape {
            weights: route::step_weights(0),
            mirror: Some(30),
        },
    );
    let patch: json_patch::Patch = serde_json::from_value(patch).unwrap();
    json_patch::patch(w.route.as_mut().unwrap(), &patch).unwrap();
    w.resource
        .annotations
        .insert(CANARY_ABORT_ANNOTATION.into(), "now".into());
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
    assert_eq!(w.route.clone().unwrap()["spec"], git["spec"]);
}

#[test]
fn a_mirror_already_in_git_holds_the_canary_and_nothing_is_written() {
    let mut w = World::canary_ready(json!([{"mirror": 50, "pause": "30s"}]), None);
    w.route.as_mut().unwrap()["spec"]["rules"][1]["filters"] = mirror_filter(10);
    w.v2_warm();
    w.reconcile();
    assert_eq!(w.route_writes(), 0);
    let c = w.canary_status();
    assert_eq!(c.state, CanaryState::Paused);
    assert!(
        c.message.contains("already mirrors requests to svc-canary"),
        "{}",
        c.message
    );
    assert_eq!(w.condition(STALLED).0, "True");
}

#[test]
fn a_mirror_removed_by_another_writer_is_drift_not_rewritten() {
    let mut w = World::canary_ready(json!([{"mirror": 50, "pause": "1m"}]), None);
    w.v2_warm();
    w.reconcile();
    assert_eq!(w.filters(), mirror_filter(50));
    // A GitOps tool puts Git's rule back.
    w.route.as_mut().unwrap()["spec"]["rules"][1]
        .as_object_mut()
        .unwrap()
        .remove("filters");
    w.now += 10;
    w.reconcile();
    assert_eq!(w.route_writes(), 0, "not fought over");
    let c = w.canary_status();
    assert_eq!(c.state, CanaryState::Paused);
    assert!(
        c.message.contains("shows no mirror filter to svc-canary where the canary expects a RequestMirror filter of 50%"),
        "{}",
        c.message
    );
    // Aborted there, nothing of the canary is left to remove.
    w.resource
        .annotations
        .insert(CANARY_ABORT_ANNOTATION.into(), "now".into());
    w.reconcile();
    assert_eq!(w.canary_status().mirror, None);
    assert_eq!(w.filters(), Value::Null);
}

// ---- every ending that takes weight off a backend waits for its drain ----

/// v2 at its first step, a Gateway reporting on the route and caught up
/// with it: the weights' way back can be watched.
fn at_first_step_behind_a_gateway() -> World {
    let mut w = at_first_step(error_rate());
    let generation = w.route_generation();
    w.gateway_accepted(generation);
    w
}

impl World {
    /// The canary Deployment still serves the canary's model from the
    /// preload variable (it was neither moved back nor released).
    fn canary_still_serves(&self, version: &str) -> bool {
        self.canary_version().as_deref() == Some(version)
    }

    /// Reconciles once the drain can be seen: the canary Deployment is
    /// released then, or with the next decision (recording the drain is a
    /// status write, which the operator watches).
    fn released_once_drained(&mut self) -> bool {
        self.reconcile();
        self.canary_released() || {
            self.reconcile();
            self.canary_released()
        }
    }

    fn canary_released(&self) -> bool {
        self.writes.iter().any(|x| {
            matches!(x, Write::ApplyDeployment { name, release: true, .. } if name == "svc-canary")
        })
    }
}

#[test]
fn a_new_canary_starts_only_once_the_last_ones_traffic_has_drained() {
    let mut w = at_first_step_behind_a_gateway();
    w.resource
        .annotations
        .insert(CANARY_ABORT_ANNOTATION.into(), "1".into());
    w.reconcile();
    assert_eq!(w.weights(), (100, 0));
    // A new version before the Gateway has the weights back.
    w.set_version("v3");
    w.now += 1;
    w.reconcile();
    assert_eq!(
        w.canary_status().version,
        "v2",
        "no canary of v3 while v2's traffic may still arrive"
    );
    assert!(w.canary_still_serves("v2"));
    let back = w.route_generation();
    w.gateway_accepted(back);
    w.now += 1;
    w.reconcile();
    assert_eq!(
        w.canary_status().version,
        "v3",
        "drained: the next one starts"
    );
    assert!(w.canary_still_serves("v3"));
}

#[test]
fn removing_the_canary_block_keeps_the_old_canary_deployment_until_it_drained() {
    let mut w = at_first_step_behind_a_gateway();
    w.resource.spec.as_object_mut().unwrap().remove("canary");
    w.resource.generation += 1;
    w.reconcile();
    assert_eq!(w.weights(), (100, 0));
    assert!(
        !w.canary_released() && w.canary_still_serves("v2"),
        "released before the Gateway had the weights back: {:?}",
        w.writes
    );
    w.now += 2;
    w.reconcile();
    assert!(w.canary_still_serves("v2"));
    let back = w.route_generation();
    w.gateway_accepted(back);
    w.now += 1;
    assert!(w.released_once_drained(), "drained: released");
}

#[test]
fn renaming_the_canary_target_releases_the_old_one_only_once_it_drained() {
    let mut w = at_first_step_behind_a_gateway();
    let mut second = deployment("svc-canary-2");
    second["spec"]["replicas"] = json!(1);
    w.other_deployments.push(second);
    w.resource.spec["canary"]["targetRef"]["name"] = json!("svc-canary-2");
    w.resource.generation += 1;
    w.reconcile();
    assert_eq!(w.weights(), (100, 0));
    assert!(!w.canary_released(), "{:?}", w.writes);
    assert!(
        w.canary_still_serves("v2"),
        "{:#?} {:?}",
        w.canary.as_ref().unwrap()["spec"]["template"],
        w.config_map_names()
    );
    let back = w.route_generation();
    w.gateway_accepted(back);
    w.now += 1;
    assert!(w.released_once_drained(), "drained: released");
}

#[test]
fn deletion_mid_canary_waits_for_the_drain_and_keeps_the_finalizer_until_the_route_is_back() {
    let mut w = at_first_step_behind_a_gateway();
    w.resource.deleting = true;
    w.reconcile();
    assert_eq!(w.weights(), (100, 0), "the weights go back first");
    assert!(
        !w.canary_released() && w.canary_still_serves("v2"),
        "the canary Deployment loses its model only once no request reaches it: {:?}",
        w.writes
    );
    assert!(!w.decide().finished);
    let back = w.route_generation();
    w.gateway_accepted(back);
    w.now += 1;
    w.reconcile();
    assert!(w.canary_released(), "drained: released");
    // The released Deployments' pods restart without a model.
    w.pods_ready();
    w.reconcile();
    assert!(w.decide().finished, "{:?}", w.status().conditions);
}

#[test]
fn deletion_keeps_the_finalizer_while_the_route_cannot_be_put_back() {
    let mut w = at_first_step(error_rate());
    // Another writer renamed the rule the canary moved.
    w.route.as_mut().unwrap()["spec"]["rules"][1]["name"] = json!("renamed");
    w.resource.deleting = true;
    for _ in 0..3 {
        w.now += 5;
        w.reconcile();
    }
    assert_eq!(
        w.weights(),
        (90, 10),
        "nothing the operator can find to restore"
    );
    assert!(
        !w.decide().finished,
        "the finalizer stays while the canary's weight is still on the route"
    );
    let (status, why) = w.condition(RECONCILING);
    assert_eq!(status, "True");
    assert_eq!(why, reason::ROUTE_INVALID, "{:?}", w.status().conditions);
    // Renamed back, the weights go back and the deletion goes on.
    w.route.as_mut().unwrap()["spec"]["rules"][1]["name"] = json!("main");
    for _ in 0..3 {
        w.now += 5;
        w.reconcile();
    }
    assert_eq!(w.weights(), (100, 0));
    w.pods_ready();
    w.reconcile();
    assert!(w.decide().finished, "{:?}", w.status().conditions);
}

// ---- a route the operator cannot locate is never taken for restored ----

#[test]
fn an_abort_on_a_route_that_cannot_be_located_waits_instead_of_calling_it_restored() {
    let mut w = at_first_step(error_rate());
    w.route.as_mut().unwrap()["spec"]["rules"][1]["name"] = json!("renamed");
    w.resource
        .annotations
        .insert(CANARY_ABORT_ANNOTATION.into(), "1".into());
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
    assert!(
        w.canary_status().weights_back_time.is_none(),
        "the canary's weight is still on the route"
    );
    assert!(
        w.canary_still_serves("v2"),
        "the canary Deployment keeps serving what the route still sends it"
    );
    assert!(w.decide().requeue_after.is_some(), "looked at again");
    // A route that no longer names the canary backend holds nothing of it.
    let rule = &mut w.route.as_mut().unwrap()["spec"]["rules"][1];
    rule["backendRefs"] = json!([{"name": "svc", "port": 8080, "weight": 100}]);
    w.now += 1;
    w.reconcile();
    assert!(w.canary_status().weights_back_time.is_some());
}

// ---- a missing target starts no canary ----

#[test]
fn a_missing_stable_target_starts_no_canary_and_writes_nothing() {
    let mut w = World::canary_ready(json!([{"weight": 10, "pause": "20s"}]), None);
    w.deployment = None;
    w.set_version("v2");
    for _ in 0..3 {
        w.now += 10;
        w.reconcile();
        assert!(w.writes.is_empty(), "{:?}", w.writes);
    }
    assert_eq!(
        w.condition(READY),
        ("False".into(), reason::TARGET_NOT_FOUND.into())
    );
    let canary_events: Vec<_> = w
        .reasons()
        .into_iter()
        .filter(|r| r.starts_with("Canary"))
        .collect();
    assert!(
        canary_events.is_empty(),
        "no canary started and aborted at every decision: {canary_events:?}"
    );
}

// ---- a round is judged whole ----

#[test]
fn a_round_with_more_checks_than_the_status_keeps_is_judged_whole() {
    let metrics: Vec<Value> = (0..10)
        .map(|i| {
            json!({"name": format!("m{i}"), "thresholdRange": {"max": 1.0},
                   "prometheus": {"address": "http://prometheus:9090", "query": "x"}})
        })
        .collect();
    let webhooks: Vec<Value> = (0..10)
        .map(|i| json!({"name": format!("w{i}"), "url": format!("http://smoke/{i}")}))
        .collect();
    let mut w = at_first_step(
        json!({"interval": "10s", "metrics": metrics, "webhooks": webhooks,
        "probes": {"configMapRef": {"name": "probes"}, "minRecall": {"*": 1.0}}}),
    );
    // 21 checks in one round: the first had no data, the others pass.
    let mut round: Vec<Measurement> = (0..10)
        .map(|i| Measurement {
            name: format!("m{i}"),
            reading: if i == 0 {
                Reading::NoData
            } else {
                Reading::Sample(0.0)
            },
        })
        .collect();
    round.extend((0..10).map(|i| Measurement {
        name: format!("w{i}"),
        reading: Reading::Answer(200),
    }));
    round.push(Measurement {
        name: analysis::PROBES.into(),
        reading: Reading::Judged(crate::api::Outcome::Pass, "recall 1.00".into()),
    });
    w.measurements = round;
    w.now += 21;
    w.reconcile();
    assert_eq!(
        w.weights(),
        (90, 10),
        "a round with a check that had no data is no pass"
    );
    assert_eq!(w.condition(STALLED).1, reason::ANALYSIS_INCONCLUSIVE);
    assert_eq!(w.canary_status().analysis.len(), 21, "kept whole");
}

// ---- an unjudged model keeps no traffic ----

#[test]
fn a_refused_analysis_endpoint_holds_the_canary_at_zero() {
    let mut w = World::canary_ready(
        json!([{"weight": 10, "pause": "20s"}, {"weight": 50, "pause": "20s"}]),
        Some(error_rate()),
    );
    w.settings = Settings::default();
    w.set_version("v2");
    w.reconcile();
    w.canary_pods_ready();
    for _ in 0..3 {
        w.now += 11;
        w.reconcile();
        assert_eq!(
            w.weights(),
            (100, 0),
            "no traffic to a model nothing judges"
        );
        assert_eq!(
            w.condition(STALLED),
            ("True".into(), reason::ANALYSIS_ENDPOINT_NOT_ALLOWED.into())
        );
    }
    // Allowed, the steps begin.
    w.settings.analysis_allow = allow(&["http://prometheus:9090"]);
    w.now += 1;
    w.reconcile();
    assert_eq!(w.weights(), (90, 10));
}

#[test]
fn an_endpoint_refused_mid_canary_takes_the_traffic_back_to_zero() {
    let mut w = at_first_step(error_rate());
    w.settings = Settings::default();
    w.now += 11;
    w.reconcile();
    assert_eq!(w.weights(), (100, 0));
    assert_eq!(
        w.condition(STALLED),
        ("True".into(), reason::ANALYSIS_ENDPOINT_NOT_ALLOWED.into())
    );
    w.settings.analysis_allow = allow(&["http://prometheus:9090"]);
    w.now += 1;
    w.reconcile();
    assert_eq!(w.weights(), (90, 10), "the steps start over");
    assert_eq!(w.canary_status().step, 1);
}

#[test]
fn an_analysis_endpoint_that_never_answers_aborts_after_four_rounds() {
    let mut w = at_first_step(error_rate());
    for round in 1..=4 {
        w.measured(Reading::Failed("timed out after 10s".into()));
        w.now += 11;
        w.reconcile();
        if round < 4 {
            assert_eq!(w.weights(), (90, 10), "round {round}: held");
            assert_eq!(w.canary_status().state, CanaryState::Paused);
        }
    }
    assert_eq!(w.canary_status().state, CanaryState::Aborted);
    assert_eq!(w.weights(), (100, 0));
    let aborted = w
        .events
        .iter()
        .rev()
        .find(|e| e.reason == reason::CANARY_ABORTED)
        .expect("an abort");
    assert!(
        aborted.message.contains("4 rounds in a row"),
        "{}",
        aborted.message
    );
    // No data is not an error: it holds, and a round with an answer
    // starts the count again.
}

#[test]
fn an_answer_between_errors_starts_the_count_again() {
    let mut w = at_first_step(error_rate());
    for reading in [
        Reading::Failed("timed out".into()),
        Reading::Failed("timed out".into()),
        Reading::Failed("timed out".into()),
        Reading::NoData,
        Reading::Failed("timed out".into()),
        Reading::Failed("timed out".into()),
    ] {
        w.measured(reading);
        w.now += 11;
        w.reconcile();
    }
    assert_ne!(w.canary_status().state, CanaryState::Aborted);
    assert_eq!(w.weights(), (90, 10));
}

#[test]
fn a_promoted_version_soaks_on_the_canary_analysis_asked_of_the_stable_backend() {
    let mut w = World::canary_ready(json!([{"weight": 50, "pause": "10s"}]), Some(error_rate()));
    let mut spec = w.resource.spec.clone();
    spec["rolloutStrategy"]["soakSeconds"] = json!(120);
    spec["version"] = json!("v2");
    w.set_spec(spec);
    w.reconcile();
    w.canary_pods_ready();
    w.now += 5;
    w.reconcile();
    assert_eq!(w.weights(), (50, 50));
    w.now += 10;
    w.measured(Reading::Sample(0.0));
    w.reconcile();
    w.measurements.clear();
    w.now += 1;
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Promoting);
    w.reconcile();
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::Ready));
    assert_eq!(w.canary_status().state, CanaryState::Promoted);
    assert_eq!(
        w.condition(conditions::SOAKED),
        ("False".into(), "Soaking".into())
    );

    // The canary's analysis goes on, one interval after the soak began,
    // about the stable backend, which serves v2 now.
    assert!(analysis_checks(&w.resource, &w.settings, &at(w.now)).is_empty());
    assert_eq!(w.decide().requeue_after, Some(Duration::from_secs(10)));
    w.now += 10;
    let checks = analysis_checks(&w.resource, &w.settings, &at(w.now));
    let [Check::Prometheus { query, .. }] = checks.as_slice() else {
        panic!("one query is due: {checks:?}");
    };
    assert_eq!(query, "errors{service=\"svc\"}");

    // failureLimit 1: the first failed reading is tolerated, the second
    // fails the soak, and v2 rolls back to v1.
    w.measured(Reading::Sample(0.5));
    assert!(w.reconcile().is_empty());
    assert_eq!(w.status().soak.as_ref().unwrap().failed_measurements, 1);
    w.measurements.clear();
    assert!(analysis_checks(&w.resource, &w.settings, &at(w.now + 9)).is_empty());
    w.now += 10;
    w.measured(Reading::Sample(0.5));
    let events = w.reconcile();
    assert_eq!(
        reasons(&events),
        [reason::ROLLOUT_FAILED, reason::ROLLBACK_STARTED]
    );
    assert!(
        events[0]
            .message
            .contains("v2 failed its soak: the canary analysis failed on the stable backend (2 failed, 1 tolerated): error-rate: 0.5 is outside at most 0.01"),
        "{}",
        events[0].message
    );
    assert_eq!(w.cm_version(), "v1");
}

impl World {
    pub(super) fn canary_replicas(&mut self) -> i64 {
        self.canary_dep()["spec"]["replicas"].as_i64().unwrap()
    }

    pub(super) fn autoscaler_min(&self) -> Option<i32> {
        self.autoscalers
            .iter()
            .find(|h| h.metadata.name.as_deref() == Some("svc"))
            .and_then(|h| h.spec.as_ref()?.min_replicas)
    }
}

#[test]
fn an_autoscaled_canary_runs_its_share_of_the_stable_pods_and_the_stable_side_keeps_its_count() {
    let mut spec = canary_spec(
        "v1",
        json!([{"weight": 20, "pause": "30s"}, {"weight": 50, "pause": "30s"}]),
        None,
    );
    spec["autoscaling"] = json!({"minReplicas": 2, "maxReplicas": 20});
    let mut w = World::canary_ready(json!([{"weight": 20}]), None);
    w.resource.spec = spec;
    w.resource.generation += 1;
    w.reconcile();
    assert_eq!(w.autoscaler_min(), Some(2));
    // The autoscaler has scaled the stable Deployment to 10.
    w.dep()["spec"]["replicas"] = json!(10);
    w.pods_ready();
    w.now += 10;
    w.reconcile();

    w.set_version("v2");
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Warming);
    assert_eq!(w.canary_replicas(), 1, "a warming canary runs one pod");
    assert_eq!(w.canary_status().stable_replicas, Some(10));
    assert_eq!(w.canary_status().rest_replicas, Some(1));
    w.reconcile();
    assert_eq!(
        w.autoscaler_min(),
        Some(10),
        "the stable side keeps its pods"
    );

    w.canary_pods_ready();
    w.now += 5;
    w.reconcile();
    w.reconcile();
    assert_eq!(
        w.weights(),
        (100, 0),
        "no share of the traffic before the share's pods"
    );
    assert_eq!(w.canary_replicas(), 2, "20 % of 10 pods, first");
    assert_eq!(
        w.canary_status().message,
        "scaling Deployment svc-canary to 2 pods before its share of the traffic moves (0 available)"
    );
    w.canary_pods_ready();
    w.reconcile();
    assert_eq!(w.weights(), (80, 20));
    // The autoscaler scales the stable side up: the canary follows.
    w.dep()["spec"]["replicas"] = json!(16);
    w.pods_ready();
    w.canary_pods_ready();
    w.now += 5;
    w.reconcile();
    assert_eq!(w.canary_replicas(), 4, "20 % of 16 pods, rounded up");
    w.canary_pods_ready();
    w.now += 31;
    w.reconcile();
    w.reconcile();
    assert_eq!(w.weights(), (80, 20), "the next step's pods first");
    assert_eq!(w.canary_replicas(), 8, "50 % of 16 pods");
    w.canary_pods_ready();
    w.reconcile();
    assert_eq!(w.weights(), (50, 50));

    // Promotion: the stable side rolls at the count it has, never below
    // the floor, and the canary gets its own count back once drained.
    w.now += 31;
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Promoting);
    w.reconcile();
    assert_eq!(
        w.dep()["spec"]["replicas"],
        16,
        "the operator wrote no count"
    );
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    w.reconcile();
    assert_eq!(w.canary_status().state, CanaryState::Promoted);
    assert_eq!(w.weights(), (100, 0));
    assert_eq!(w.canary_replicas(), 1, "the canary's own count, back");
    w.canary_pods_ready();
    w.now += 5;
    w.reconcile();
    assert_eq!(w.canary_status().stable_replicas, None);
    assert_eq!(w.canary_status().rest_replicas, None);
    assert_eq!(w.autoscaler_min(), Some(2), "the floor is gone");
    w.now += 5;
    w.reconcile();
    assert!(w.writes.is_empty(), "{:?}", w.writes);
}
